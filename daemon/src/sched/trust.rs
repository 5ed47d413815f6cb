//! What the scheduler believes of a process, and whom it may change.
//!
//! The daemon runs as root beside other people's jobs, so what a process shows of itself is
//! evidence, not proof: a library counts as ML evidence only when neither another user nor
//! anyone at all could have put it where it is ([`library_trust`]), and enforcement changes
//! only processes the operator admitted by user, group or cgroup ([`Admission`]), never giving a
//! thread a nice value its process could not set itself unless the config says so.

use std::collections::HashSet;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use serde::Deserialize;

use super::library::Mapping;
use crate::invalid::Invalid;

/// `CAP_SYS_NICE`: a process holding it may set any nice value itself.
const CAP_SYS_NICE: u32 = 23;

/// Reads at most `limit` bytes of a `/proc` file.
pub(crate) fn read_bounded(path: &Path, limit: u64) -> Option<String> {
    let mut text = String::new();
    File::open(path).and_then(|f| f.take(limit).read_to_string(&mut text)).ok()?;
    Some(text)
}

/// Whether process `pid` lives in the daemon's own user namespace, where its capabilities are
/// capabilities on the node (`/proc/<pid>/ns/user` names the same namespace as the daemon's).
/// Unknown (unreadable) is taken as no.
pub fn in_own_user_namespace(proc_root: &Path, pid: u32) -> bool {
    let theirs = std::fs::read_link(proc_root.join(pid.to_string()).join("ns/user"));
    let ours = std::fs::read_link("/proc/self/ns/user");
    matches!((theirs, ours), (Ok(a), Ok(b)) if a == b)
}

/// A process's credentials, from `/proc/<pid>/status`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Credentials {
    /// Real and effective user.
    pub uid: u32,
    pub euid: u32,
    /// Real and effective group, and the supplementary groups.
    pub gids: Vec<u32>,
    pub cap_effective: u64,
}

impl Credentials {
    pub fn parse(status: &str) -> Option<Credentials> {
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::split_whitespace);
        let mut uids = field("Uid:")?.map(|v| v.parse::<u32>());
        let (uid, euid) = (uids.next()?.ok()?, uids.next()?.ok()?);
        let mut gids: Vec<u32> = field("Gid:")?.take(2).filter_map(|v| v.parse().ok()).collect();
        gids.extend(field("Groups:").into_iter().flatten().filter_map(|v| v.parse::<u32>().ok()));
        let cap_effective = field("CapEff:").and_then(|mut v| v.next()).and_then(|v| u64::from_str_radix(v, 16).ok());
        Some(Credentials { uid, euid, gids, cap_effective: cap_effective.unwrap_or(0) })
    }

    pub fn of(proc_root: &Path, pid: u32) -> Option<Credentials> {
        Credentials::parse(&read_bounded(&proc_root.join(pid.to_string()).join("status"), 64 * 1024)?)
    }

    pub fn may_set_any_nice(&self) -> bool {
        self.cap_effective & (1 << CAP_SYS_NICE) != 0
    }
}

/// Whether a library a process maps is evidence of ML work: the mapped file itself (through
/// `map_files`, so not whatever is at its path now) must be a regular file owned by root or
/// by the process's own user and not writable by everyone; every directory above it, looked
/// up without following links, must be owned by root or that user, and writable by everyone
/// only if sticky (`/tmp`), except the one holding the file, which may not be world-writable
/// at all. A file anyone could have planted, or a path since replaced, proves nothing.
pub fn library_trust(proc_root: &Path, pid: u32, uid: u32, mapping: &Mapping) -> Result<(), String> {
    let owner_ok = |owner: u32| owner == 0 || owner == uid;
    let file = std::fs::metadata(mapping.map_file(proc_root, pid)).map_err(|e| format!("cannot stat it: {e}"))?;
    if !file.file_type().is_file() {
        return Err("not a regular file".into());
    }
    if !owner_ok(file.uid()) {
        return Err(format!("owned by uid {}, neither root nor the process's user ({uid})", file.uid()));
    }
    if file.permissions().mode() & 0o002 != 0 {
        return Err("writable by everyone".into());
    }
    let root = proc_root.join(pid.to_string()).join("root");
    let parent = mapping.path.parent();
    for dir in mapping.path.ancestors().skip(1) {
        let meta = std::fs::symlink_metadata(root.join(dir.strip_prefix("/").unwrap_or(dir)))
            .map_err(|e| format!("cannot stat {}: {e}", dir.display()))?;
        if !meta.file_type().is_dir() {
            return Err(format!("{} is no longer a directory (the path was replaced)", dir.display()));
        }
        if !owner_ok(meta.uid()) {
            return Err(format!(
                "{} is owned by uid {}, neither root nor the process's user",
                dir.display(),
                meta.uid()
            ));
        }
        let mode = meta.permissions().mode();
        let world_writable = mode & 0o002 != 0;
        if world_writable && (Some(dir) == parent || mode & 0o1000 == 0) {
            return Err(format!("{} is writable by everyone", dir.display()));
        }
    }
    Ok(())
}

/// `[scheduler.enforce]`: whose processes `enforce` may change. Empty: nobody's.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// User names or numeric ids; a process is admitted by its real user.
    pub users: Vec<String>,
    /// Group names or numeric ids; a process is admitted by its real, effective or a
    /// supplementary group.
    pub groups: Vec<String>,
    /// cgroup path prefixes (`/slurm`, `/kubepods`), matched at a `/` boundary.
    pub cgroups: Vec<String>,
    /// Lower nice values below what the process's own `RLIMIT_NICE` allows it (off: a thread
    /// never gets a nice value its process could not set itself).
    pub beyond_rlimit_nice: bool,
}

/// [`AdmissionConfig`] with names resolved to ids.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Admission {
    uids: HashSet<u32>,
    gids: HashSet<u32>,
    cgroups: Vec<String>,
    beyond_rlimit_nice: bool,
    /// The config section it comes from, for its messages (`[scheduler.enforce]` if empty).
    section: &'static str,
}

/// `[scheduler.alerting]`: whose ML jobs may raise the job alerts (a hung collective, an
/// input-bound job, a step-time regression) and so page on-call and keep incident bundles.
/// Root's processes always may. Without the section, the scope of `[scheduler.enforce]`.
/// Everyone else's jobs are shown, marked as not paging, and raise nothing: a user cannot page
/// on-call, nor push real incident bundles out, with a process that sits in an NCCL call of its
/// own making.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertingConfig {
    pub users: Vec<String>,
    pub groups: Vec<String>,
    pub cgroups: Vec<String>,
    /// Every process's jobs may page (a node whose users are all trusted).
    pub everyone: bool,
}

/// `[scheduler.watch]`: which processes the scheduler looks at, by the user, group or cgroup
/// path prefix of the process whose own evidence (a library, a device, a command line) makes it
/// ML; its descendants go with it. Empty: every process on the node. On a node shared with
/// other tenants it keeps the scheduler to the cluster's jobs, and it lets two daemons on one
/// machine each stand for a node of their own.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WatchConfig {
    pub users: Vec<String>,
    pub groups: Vec<String>,
    pub cgroups: Vec<String>,
}

/// [`WatchConfig`], resolved: `None` watches everyone.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Watch(Option<Admission>);

impl Watch {
    pub fn resolve(config: &WatchConfig) -> Result<Watch, Invalid> {
        let scope = AdmissionConfig {
            users: config.users.clone(),
            groups: config.groups.clone(),
            cgroups: config.cgroups.clone(),
            beyond_rlimit_nice: false,
        };
        let admission = Admission::resolve_in(&scope, "[scheduler.watch]")?;
        Ok(Watch((!admission.is_empty()).then_some(admission)))
    }

    /// Whether the scheduler may look at `pid` (`Err`: why not).
    pub fn watches(&self, proc_root: &Path, pid: u32) -> Result<(), String> {
        let Some(scope) = &self.0 else { return Ok(()) };
        let creds = Credentials::of(proc_root, pid).ok_or("its credentials are unreadable")?;
        scope.admits(proc_root, pid, &creds).map(|_| ())
    }
}

/// Whose jobs may raise job alerts ([`AlertingConfig`], resolved).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Paging {
    everyone: bool,
    admitted: Admission,
}

impl Paging {
    /// `alerting`, or without it the scope of `enforce`.
    pub fn resolve(alerting: Option<&AlertingConfig>, enforce: &AdmissionConfig) -> Result<Paging, Invalid> {
        let (config, everyone, section) = match alerting {
            Some(a) => (
                AdmissionConfig {
                    users: a.users.clone(),
                    groups: a.groups.clone(),
                    cgroups: a.cgroups.clone(),
                    beyond_rlimit_nice: false,
                },
                a.everyone,
                "[scheduler.alerting]",
            ),
            None => (enforce.clone(), false, "[scheduler.alerting] (as [scheduler.enforce])"),
        };
        let admitted = Admission { section, ..Admission::resolve_in(&config, section)? };
        Ok(Paging { everyone, admitted })
    }

    /// Whether process `pid`'s job alerts may page (`Ok`, why) or not (`Err`, why).
    pub fn pages(&self, proc_root: &Path, pid: u32, creds: &Credentials) -> Result<String, String> {
        if self.everyone {
            return Ok("pages: [scheduler.alerting] everyone = true".into());
        }
        if creds.uid == 0 {
            return Ok("pages: a process of root".into());
        }
        self.admitted
            .admits(proc_root, pid, creds)
            .map(|why| format!("pages: {}", why.trim_start_matches("admitted: ")))
            .map_err(|why| format!("does not page: {}", why.trim_start_matches("not admitted: ")))
    }
}

/// Looks a user or group up by name (through NSS, so directory users count) or takes a number.
fn resolve(name: &str, group: bool) -> Option<u32> {
    if let Ok(id) = name.parse() {
        return Some(id);
    }
    let cname = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: getpwnam_r/getgrnam_r write into the zeroed struct and the buffer whose length is
    // passed; `result` is checked before the struct is read.
    unsafe {
        if group {
            let mut entry: libc::group = std::mem::zeroed();
            let mut result = std::ptr::null_mut();
            let rc = libc::getgrnam_r(cname.as_ptr(), &mut entry, buf.as_mut_ptr(), buf.len(), &mut result);
            (rc == 0 && !result.is_null()).then_some(entry.gr_gid)
        } else {
            let mut entry: libc::passwd = std::mem::zeroed();
            let mut result = std::ptr::null_mut();
            let rc = libc::getpwnam_r(cname.as_ptr(), &mut entry, buf.as_mut_ptr(), buf.len(), &mut result);
            (rc == 0 && !result.is_null()).then_some(entry.pw_uid)
        }
    }
}

impl Admission {
    pub fn resolve(config: &AdmissionConfig) -> Result<Admission, Invalid> {
        Admission::resolve_in(config, "[scheduler.enforce]")
    }

    fn resolve_in(config: &AdmissionConfig, section: &'static str) -> Result<Admission, Invalid> {
        // The table the values came from (`[scheduler.alerting]` falls back to `enforce`'s).
        let table = match section {
            "[scheduler.alerting]" => "scheduler.alerting",
            "[scheduler.watch]" => "scheduler.watch",
            _ => "scheduler.enforce",
        };
        let ids = |names: &[String], group: bool, key: &str| {
            names
                .iter()
                .map(|n| {
                    resolve(n, group).ok_or_else(|| {
                        Invalid::new(
                            format!("{table}.{key}"),
                            format!("{n:?}"),
                            format!("no {} named {n:?}", &key[..key.len() - 1]),
                        )
                    })
                })
                .collect::<Result<HashSet<u32>, Invalid>>()
        };
        for prefix in &config.cgroups {
            if !prefix.starts_with('/') || prefix.contains("..") {
                let key = format!("{table}.cgroups");
                return Err(Invalid::new(key, format!("{prefix:?}"), "must be an absolute cgroup path"));
            }
        }
        Ok(Admission {
            uids: ids(&config.users, false, "users")?,
            gids: ids(&config.groups, true, "groups")?,
            cgroups: config.cgroups.iter().map(|c| c.trim_end_matches('/').to_string()).collect(),
            beyond_rlimit_nice: config.beyond_rlimit_nice,
            section,
        })
    }

    fn section(&self) -> &'static str {
        if self.section.is_empty() {
            "[scheduler.enforce]"
        } else {
            self.section
        }
    }

    /// Nobody is admitted: `enforce` changes nothing.
    pub fn is_empty(&self) -> bool {
        self.uids.is_empty() && self.gids.is_empty() && self.cgroups.is_empty()
    }

    /// Why the process is admitted (`Ok`) or not (`Err`).
    pub fn admits(&self, proc_root: &Path, pid: u32, creds: &Credentials) -> Result<String, String> {
        if self.is_empty() {
            return Err(format!("not admitted: {} admits nobody", self.section()));
        }
        if self.uids.contains(&creds.uid) {
            return Ok(format!("admitted: user {}", creds.uid));
        }
        if let Some(gid) = creds.gids.iter().find(|g| self.gids.contains(g)) {
            return Ok(format!("admitted: group {gid}"));
        }
        if !self.cgroups.is_empty() {
            let text = read_bounded(&proc_root.join(pid.to_string()).join("cgroup"), 64 * 1024).unwrap_or_default();
            for path in text.lines().filter_map(|l| l.splitn(3, ':').nth(2)) {
                let hit = self.cgroups.iter().find(|prefix| {
                    prefix.is_empty()
                        || path == prefix.as_str()
                        || path.strip_prefix(prefix.as_str()).is_some_and(|r| r.starts_with('/'))
                });
                if let Some(prefix) = hit {
                    return Ok(format!("admitted: cgroup {path} under {prefix}"));
                }
            }
        }
        Err(format!("not admitted: user {} is in no admitted user, group or cgroup", creds.uid))
    }

    /// The lowest nice value enforcement may give a thread of `pid`: what the process could set
    /// itself (`20 - RLIMIT_NICE`, or anything with CAP_SYS_NICE), unless the config lifts it.
    /// A capability counts only in the daemon's own user namespace: inside one of its own
    /// (`unshare -Ur`) a user holds every capability, and none of them on the node's threads.
    pub fn nice_floor(&self, proc_root: &Path, pid: u32, creds: &Credentials) -> i32 {
        if self.beyond_rlimit_nice || (creds.may_set_any_nice() && in_own_user_namespace(proc_root, pid)) {
            return -20;
        }
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: prlimit with a null new limit only reads the process's limit into `limit`.
        let rc = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NICE, std::ptr::null(), &mut limit) };
        let cur = if rc == 0 { limit.rlim_cur.min(40) as i32 } else { 0 };
        20 - cur
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_from_status() {
        let status = "Name:\tpython3\nUid:\t1000\t1001\t1000\t1000\nGid:\t100\t100\t100\t100\nGroups:\t27 44 \nCapEff:\t0000000000800000\n";
        let creds = Credentials::parse(status).unwrap();
        assert_eq!((creds.uid, creds.euid), (1000, 1001));
        assert_eq!(creds.gids, vec![100, 100, 27, 44]);
        assert!(creds.may_set_any_nice());
        assert_eq!(Credentials::parse("Name:\tx\n"), None);
    }

    #[test]
    fn admission_by_user_group_and_cgroup() {
        let me = std::process::id();
        let proc_root = Path::new("/proc");
        let creds = Credentials { uid: 1234, euid: 1234, gids: vec![50, 60], cap_effective: 0 };
        let none = Admission::resolve(&AdmissionConfig::default()).unwrap();
        assert!(none.is_empty() && none.admits(proc_root, me, &creds).is_err());
        let by_user =
            Admission::resolve(&AdmissionConfig { users: vec!["1234".into()], ..Default::default() }).unwrap();
        assert_eq!(by_user.admits(proc_root, me, &creds).unwrap(), "admitted: user 1234");
        let root_by_name =
            Admission::resolve(&AdmissionConfig { users: vec!["root".into()], ..Default::default() }).unwrap();
        assert!(root_by_name.admits(proc_root, me, &creds).is_err());
        let by_group =
            Admission::resolve(&AdmissionConfig { groups: vec!["60".into()], ..Default::default() }).unwrap();
        assert_eq!(by_group.admits(proc_root, me, &creds).unwrap(), "admitted: group 60");
        // This test's own cgroup, and a prefix that only shares characters with it.
        let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let own = text.lines().filter_map(|l| l.splitn(3, ':').nth(2)).next().unwrap().to_string();
        let by_cgroup =
            Admission::resolve(&AdmissionConfig { cgroups: vec![own.clone()], ..Default::default() }).unwrap();
        assert!(by_cgroup.admits(proc_root, me, &creds).is_ok());
        let near =
            Admission::resolve(&AdmissionConfig { cgroups: vec![format!("{own}x")], ..Default::default() }).unwrap();
        assert!(near.admits(proc_root, me, &creds).is_err());
        let unknown = AdmissionConfig { users: vec!["no-such-user-ringside".into()], ..Default::default() };
        assert!(Admission::resolve(&unknown)
            .unwrap_err()
            .to_string()
            .contains("no user named \"no-such-user-ringside\""));
        let relative = AdmissionConfig { cgroups: vec!["slurm".into()], ..Default::default() };
        assert!(Admission::resolve(&relative).is_err());
    }

    #[test]
    fn who_may_page_defaults_to_the_enforce_scope_and_root_always_may() {
        let me = std::process::id();
        let proc_root = Path::new("/proc");
        let user = Credentials { uid: 1234, euid: 1234, gids: vec![50], cap_effective: 0 };
        let root = Credentials { uid: 0, ..Credentials::default() };
        // Neither section: only root pages.
        let nobody = Paging::resolve(None, &AdmissionConfig::default()).unwrap();
        assert!(nobody.pages(proc_root, me, &root).is_ok());
        let why = nobody.pages(proc_root, me, &user).unwrap_err();
        assert!(why.starts_with("does not page:") && why.contains("admits nobody"), "{why}");
        // Without [scheduler.alerting], [scheduler.enforce]'s users page.
        let enforce = AdmissionConfig { users: vec!["1234".into()], ..Default::default() };
        assert_eq!(Paging::resolve(None, &enforce).unwrap().pages(proc_root, me, &user).unwrap(), "pages: user 1234");
        // [scheduler.alerting] replaces that scope rather than adding to it.
        let by_group = AlertingConfig { groups: vec!["50".into()], ..Default::default() };
        let other = Credentials { gids: vec![51], ..user.clone() };
        let paging = Paging::resolve(Some(&by_group), &enforce).unwrap();
        assert_eq!(paging.pages(proc_root, me, &user).unwrap(), "pages: group 50");
        assert!(paging.pages(proc_root, me, &other).is_err());
        let everyone = AlertingConfig { everyone: true, ..Default::default() };
        assert!(Paging::resolve(Some(&everyone), &AdmissionConfig::default())
            .unwrap()
            .pages(proc_root, me, &other)
            .is_ok());
        // A name that resolves to nobody is a config error naming the section.
        let unknown = AlertingConfig { users: vec!["no-such-user-ringside".into()], ..Default::default() };
        let err = Paging::resolve(Some(&unknown), &enforce).unwrap_err();
        assert_eq!(err.key, "scheduler.alerting.users", "{err}");
    }

    #[test]
    fn the_nice_floor_is_what_the_process_could_set_itself() {
        let me = std::process::id();
        let plain = Credentials::default();
        let admission = Admission::default();
        // SAFETY: getrlimit into a local struct.
        let own = unsafe {
            let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::getrlimit(libc::RLIMIT_NICE, &mut l);
            l.rlim_cur.min(40) as i32
        };
        let proc_root = Path::new("/proc");
        assert_eq!(admission.nice_floor(proc_root, me, &plain), 20 - own);
        let capable = Credentials { cap_effective: 1 << CAP_SYS_NICE, ..plain.clone() };
        assert_eq!(admission.nice_floor(proc_root, me, &capable), -20);
        let lifted = Admission { beyond_rlimit_nice: true, ..Admission::default() };
        assert_eq!(lifted.nice_floor(proc_root, me, &plain), -20);
        // A process whose user namespace cannot be told (here: a /proc without it) gets
        // nothing from its capabilities.
        let elsewhere = std::env::temp_dir();
        assert_eq!(admission.nice_floor(&elsewhere, me, &capable), 20 - own);
    }

    #[test]
    fn library_evidence_needs_a_path_nobody_else_could_have_written() {
        let dir = crate::test_support::ScratchDir::new("trust");
        let me = std::process::id();
        let libc = super::super::library::tests::own_libc();
        // The system's C library, owned by root in root's directories: trusted for anyone.
        assert_eq!(library_trust(Path::new("/proc"), me, 4321, &libc), Ok(()));
        // The same mapping named as if it lay in a world-writable directory.
        let world = dir.path().join("world");
        std::fs::create_dir(&world).unwrap();
        std::fs::set_permissions(&world, std::fs::Permissions::from_mode(0o777)).unwrap();
        let planted = Mapping { path: world.join("libcuda.so.1"), ..libc.clone() };
        let why = library_trust(Path::new("/proc"), me, 0, &planted).unwrap_err();
        assert!(why.contains("writable by everyone"), "{why}");
        // Sticky world-writable above (like /tmp) is fine; a symlink on the way is not.
        std::fs::set_permissions(&world, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let own = world.join("own");
        std::fs::create_dir(&own).unwrap();
        let under_sticky = Mapping { path: own.join("libcuda.so.1"), ..libc.clone() };
        assert_eq!(library_trust(Path::new("/proc"), me, 0, &under_sticky), Ok(()));
        std::os::unix::fs::symlink("/usr/lib", world.join("link")).unwrap();
        let via_link = Mapping { path: world.join("link").join("libcuda.so.1"), ..libc.clone() };
        assert!(library_trust(Path::new("/proc"), me, 0, &via_link).unwrap_err().contains("no longer a directory"));
    }
}
