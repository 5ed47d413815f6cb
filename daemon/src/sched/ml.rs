//! Which processes are ML work: a process is ML when it maps a CUDA, NCCL, PyTorch, TensorFlow
//! or XLA library, holds an NVIDIA device file open, or its command line matches a configured
//! pattern; its descendants (DataLoader workers are child processes) belong to the same job.
//!
//! A process's own verdict is cached by (pid, start time), so a reused pid is looked at afresh;
//! one found not to be ML is looked at again every `recheck_every` scans, since frameworks load
//! CUDA lazily (on first use, long after start).
//!
//! A library is evidence only where [`library_trust`] finds that nobody else could have put it
//! there (checked on a worker thread with a time limit: the directories above a library are
//! paths a user controls, possibly on a hung mount); a library refused as evidence is reported (the newest [`MAX_REFUSED`]) so that an
//! operator can see why a process is not taken for ML work.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ringside_shared::RefusedEvidence;

use super::library::{self, Mapping};
use super::offthread::{OffThread, Outcome};
use super::trust::{library_trust, Credentials, Watch};

/// Open files looked at per process: device files are opened early, and a process holding a
/// million open files must not stall a scan.
pub const MAX_FDS: usize = 4096;
/// Processes looked at closely (maps, open files, command line) per scan at most.
pub const VERDICTS_PER_SCAN: usize = 512;
/// Open-file links read, and `maps` bytes read, per scan in all: however many processes there
/// are and however large each is, one scan's reads are bounded. A process is looked at only
/// while its worst case still fits; the rest wait for the next scan.
pub const FD_LINKS_PER_SCAN: usize = 32_768;
pub const MAPS_BYTES_PER_SCAN: u64 = 32 * 1024 * 1024;
/// Refused library evidence kept for the console.
pub const MAX_REFUSED: usize = ringside_shared::SchedulerTelemetry::MAX_REFUSED;

/// Library file names (prefixes) that mark a process as ML.
pub const DEFAULT_LIBRARIES: [&str; 9] = [
    "libcuda.so",
    "libcudart.so",
    "libnccl.so",
    "libcublas.so",
    "libtorch",
    "libc10_cuda",
    "libtensorflow",
    "libxla",
    "libjax",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MlReason {
    /// Maps this library.
    Library(String),
    /// Holds this device file open.
    Device(String),
    /// The command line contains this configured pattern.
    Cmdline(String),
    /// A descendant of this ML process.
    Parent(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlProcess {
    pub pid: u32,
    /// Tells this process from a later one given the same pid.
    pub start_time: u64,
    pub comm: String,
    pub reason: MlReason,
}

struct Seen {
    start_time: u64,
    ppid: u32,
    comm: String,
    verdict: Option<MlReason>,
    scans_since_check: u32,
}

/// What one scan may still read.
#[derive(Debug, Clone, Copy)]
pub struct ScanBudget {
    pub verdicts: usize,
    pub fd_links: usize,
    pub maps_bytes: u64,
}

impl ScanBudget {
    pub fn per_scan() -> ScanBudget {
        ScanBudget { verdicts: VERDICTS_PER_SCAN, fd_links: FD_LINKS_PER_SCAN, maps_bytes: MAPS_BYTES_PER_SCAN }
    }

    /// Whether one more process may be looked at, in the worst case of its size.
    fn fits_one(&self) -> bool {
        self.verdicts > 0 && self.fits_tracked()
    }

    /// Whether one more tracked process's open files and `maps` may be read, in the worst case.
    pub fn fits_tracked(&self) -> bool {
        self.fd_links >= MAX_FDS && self.maps_bytes >= library::MAX_MAPS_BYTES
    }
}

pub struct MlDetector {
    proc_root: PathBuf,
    libraries: Vec<String>,
    cmdline_patterns: Vec<String>,
    recheck_every: u32,
    seen: HashMap<u32, Seen>,
    refused: VecDeque<RefusedEvidence>,
    /// Library evidence checks, off the observer's thread.
    trust: OffThread<TrustCheck, Result<(), String>>,
    /// (pid, library) checks sent and not answered yet.
    checking: HashSet<(u32, PathBuf)>,
    /// Where the previous scan's look at known processes stopped: the next goes on from there.
    cursor: u32,
    /// What the latest scan read, and how many processes it left for a later one.
    pub last_scan: ScanReport,
    /// `[scheduler.watch]`: a process out of it has no verdict of its own.
    watch: Watch,
}

/// What a scan read, for the observer's telemetry and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanReport {
    pub looked_at: usize,
    pub deferred: usize,
    pub fd_links: usize,
    pub maps_bytes: u64,
}

/// (ppid, start time, comm) from `/proc/<pid>/stat`; the comm may hold spaces and parentheses.
pub fn parse_stat(text: &str) -> Option<(u32, u64, String)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let fields: Vec<&str> = text.get(close + 2..)?.split_whitespace().collect();
    // After the comm: state(0) ppid(1) ... starttime is field 22 of the line, index 19 here.
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?, comm))
}

/// A library whose place is to be checked ([`library_trust`]) off the observer's thread.
#[derive(Debug, Clone)]
struct TrustCheck {
    proc_root: PathBuf,
    pid: u32,
    start_time: u64,
    uid: u32,
    comm: String,
    mapping: Mapping,
}

/// One library's place may take this long to check (a hung network or FUSE mount).
const TRUST_TIMEOUT: Duration = super::offthread::FILE_TIMEOUT;

impl MlDetector {
    pub fn new(libraries: Vec<String>, cmdline_patterns: Vec<String>) -> MlDetector {
        MlDetector {
            proc_root: "/proc".into(),
            libraries,
            cmdline_patterns,
            recheck_every: 10,
            seen: HashMap::new(),
            refused: VecDeque::new(),
            trust: OffThread::new("sched-trust", "library evidence checks", 64, TRUST_TIMEOUT, |c: &TrustCheck| {
                library_trust(&c.proc_root, c.pid, c.uid, &c.mapping)
            }),
            checking: HashSet::new(),
            cursor: 0,
            last_scan: ScanReport::default(),
            watch: Watch::default(),
        }
    }

    /// Why library evidence is no longer checked, if it is not.
    pub fn stopped(&self) -> Option<&str> {
        self.trust.stopped()
    }

    fn refuse(&mut self, pid: u32, comm: &str, path: &Path, why: String) {
        let path = path.to_string_lossy().into_owned();
        if self.refused.iter().any(|r| r.pid == pid && r.path == path) {
            return;
        }
        tracing::debug!(pid, library = %path, "not ML evidence: {why}");
        if self.refused.len() == MAX_REFUSED {
            self.refused.pop_back();
        }
        self.refused.push_front(RefusedEvidence { pid, comm: comm.to_string(), path, why });
    }

    /// Takes the answers of the evidence checks: a library found where nobody else could have
    /// put it makes its process ML (if it is still the same process).
    fn take_trust_answers(&mut self) {
        let (outcomes, abandoned) = self.trust.poll();
        if abandoned {
            // Lost with the abandoned worker: asked again at a later look.
            self.checking.clear();
        }
        for outcome in outcomes {
            let (check, answer) = match outcome {
                Outcome::Done(check, answer) => (check, answer),
                Outcome::TimedOut(check) => {
                    let why = format!("checking its place took over {TRUST_TIMEOUT:?}: abandoned");
                    (check, Err(why))
                }
            };
            self.checking.remove(&(check.pid, check.mapping.path.clone()));
            match answer {
                Ok(()) => {
                    if let Some(seen) = self.seen.get_mut(&check.pid).filter(|s| s.start_time == check.start_time) {
                        seen.verdict.get_or_insert_with(|| MlReason::Library(check.mapping.file_name().to_string()));
                    }
                }
                Err(why) => self.refuse(check.pid, &check.comm, &check.mapping.path, why),
            }
        }
    }

    /// Looks at processes under another `/proc` (tests).
    pub fn with_proc_root(mut self, proc_root: &Path) -> MlDetector {
        self.proc_root = proc_root.to_path_buf();
        self
    }

    /// Looks only at the processes `watch` admits (and their descendants).
    pub fn watching(mut self, watch: Watch) -> MlDetector {
        self.watch = watch;
        self
    }

    /// Library evidence refused lately, newest first.
    pub fn refused(&self) -> impl Iterator<Item = &RefusedEvidence> {
        self.refused.iter()
    }

    /// A process's own evidence: an open NVIDIA device file or a configured command line now;
    /// a library it maps is sent to be checked off-thread (its place is a path a user
    /// controls) and counts when the answer comes ([`MlDetector::take_trust_answers`]).
    fn own_verdict(&mut self, pid: u32, start_time: u64, comm: &str, budget: &mut ScanBudget) -> Option<MlReason> {
        if self.watch.watches(&self.proc_root, pid).is_err() {
            // Not watched: nothing of it is read (it is looked at again with the known ones,
            // as it may move into a watched cgroup).
            return None;
        }
        let dir = self.proc_root.join(pid.to_string());
        let mut candidates: Vec<Mapping> = Vec::new();
        let (mappings, read) = library::mappings_counted(&self.proc_root, pid);
        budget.maps_bytes = budget.maps_bytes.saturating_sub(read);
        for mapping in mappings {
            let file = mapping.file_name();
            // A library maps as several ranges: one check per file, a few files per process.
            if self.libraries.iter().any(|l| file.starts_with(l.as_str()))
                && candidates.len() < 4
                && !candidates.iter().any(|c| c.path == mapping.path)
            {
                candidates.push(mapping);
            }
        }
        if let Ok(fds) = std::fs::read_dir(dir.join("fd")) {
            for fd in fds.flatten().take(MAX_FDS) {
                budget.fd_links = budget.fd_links.saturating_sub(1);
                if let Ok(target) = std::fs::read_link(fd.path()) {
                    let target = target.to_string_lossy();
                    if target.starts_with("/dev/nvidia") {
                        return Some(MlReason::Device(target.into_owned()));
                    }
                }
            }
        }
        if !self.cmdline_patterns.is_empty() {
            // Command lines can be megabytes long: patterns are matched in the first 64 KiB.
            let mut raw = Vec::new();
            let read = std::fs::File::open(dir.join("cmdline")).and_then(|f| f.take(64 * 1024).read_to_end(&mut raw));
            if read.is_ok() {
                let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
                if let Some(p) = self.cmdline_patterns.iter().find(|p| cmdline.contains(p.as_str())) {
                    return Some(MlReason::Cmdline(p.clone()));
                }
            }
        }
        if !candidates.is_empty() {
            match Credentials::of(&self.proc_root, pid) {
                Some(creds) => {
                    for mapping in candidates {
                        let key = (pid, mapping.path.clone());
                        if self.checking.contains(&key) {
                            continue;
                        }
                        let check = TrustCheck {
                            proc_root: self.proc_root.clone(),
                            pid,
                            start_time,
                            uid: creds.uid,
                            comm: comm.to_string(),
                            mapping,
                        };
                        if self.trust.send(check) {
                            self.checking.insert(key);
                        }
                    }
                }
                None => {
                    for mapping in candidates {
                        self.refuse(pid, comm, &mapping.path, "its credentials are unreadable".into());
                    }
                }
            }
        }
        None
    }

    /// Drops what is known of `pid`, so the next scan looks at it afresh: an `exec` keeps the
    /// pid and start time but may make a process ML.
    pub fn forget(&mut self, pid: u32) {
        self.seen.remove(&pid);
    }

    /// Looks at every process and returns the ML ones (with their descendants).
    ///
    /// Every process is listed (its `stat`), but only [`VERDICTS_PER_SCAN`] are looked at
    /// closely, within the scan's read budget ([`ScanBudget`]). New processes come first (an
    /// `exec` makes a process new again: [`MlDetector::forget`]), shared out between their
    /// owners in turns, so that one user's thousands cannot delay another's job; then the known
    /// ones due for a new look, going on from where the previous scan stopped, so that none
    /// waits for good behind thousands at lower pids.
    pub fn scan(&mut self) -> Vec<MlProcess> {
        self.take_trust_answers();
        let mut alive = HashMap::new();
        let Ok(entries) = std::fs::read_dir(&self.proc_root) else { return Vec::new() };
        let mut new: Vec<u32> = Vec::new();
        let mut due: Vec<u32> = Vec::new();
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let Some((ppid, start_time, comm)) =
                std::fs::read_to_string(entry.path().join("stat")).ok().as_deref().and_then(parse_stat)
            else {
                continue;
            };
            let mut seen = match self.seen.remove(&pid) {
                Some(s) if s.start_time == start_time => s,
                _ => Seen { start_time, ppid, comm: comm.clone(), verdict: None, scans_since_check: u32::MAX },
            };
            seen.ppid = ppid;
            seen.comm = comm;
            if seen.verdict.is_none() {
                if seen.scans_since_check == u32::MAX {
                    new.push(pid);
                } else if seen.scans_since_check >= self.recheck_every {
                    due.push(pid);
                } else {
                    seen.scans_since_check += 1;
                }
            }
            alive.insert(pid, seen);
        }
        self.seen = alive;
        let mut order = self.fair_turns(new);
        due.sort_unstable();
        let resume = due.partition_point(|pid| *pid <= self.cursor);
        due.rotate_left(resume);
        let due_from = order.len();
        order.extend(due);
        let mut budget = ScanBudget::per_scan();
        let mut report = ScanReport::default();
        for (i, pid) in order.iter().enumerate() {
            // Past the budget a process waits for a later scan: thousands of new processes must
            // not stall the observer's windows.
            if !budget.fits_one() {
                report.deferred = order.len() - i;
                break;
            }
            budget.verdicts -= 1;
            let Some((start_time, comm)) = self.seen.get(pid).map(|s| (s.start_time, s.comm.clone())) else { continue };
            let verdict = self.own_verdict(*pid, start_time, &comm, &mut budget);
            if let Some(seen) = self.seen.get_mut(pid) {
                seen.verdict = verdict;
                seen.scans_since_check = 0;
            }
            report.looked_at += 1;
            if i >= due_from {
                self.cursor = *pid;
            }
        }
        report.fd_links = FD_LINKS_PER_SCAN - budget.fd_links;
        report.maps_bytes = MAPS_BYTES_PER_SCAN - budget.maps_bytes;
        self.last_scan = report;
        let mut found = Vec::new();
        for (pid, seen) in &self.seen {
            let reason = match &seen.verdict {
                Some(reason) => Some(reason.clone()),
                None => self.ml_ancestor(seen.ppid).map(MlReason::Parent),
            };
            if let Some(reason) = reason {
                found.push(MlProcess { pid: *pid, start_time: seen.start_time, comm: seen.comm.clone(), reason });
            }
        }
        found.sort_by_key(|p| p.pid);
        found
    }

    /// New processes in the order they are looked at: their owners take turns (one process
    /// each, round after round), oldest pid first within an owner. Owners are read only when
    /// there are more new processes than one scan looks at.
    fn fair_turns(&self, mut new: Vec<u32>) -> Vec<u32> {
        new.sort_unstable();
        if new.len() <= VERDICTS_PER_SCAN {
            return new;
        }
        use std::os::unix::fs::MetadataExt;
        let mut by_owner: std::collections::BTreeMap<u32, VecDeque<u32>> = std::collections::BTreeMap::new();
        for pid in new {
            // The owner of /proc/<pid> is the process's effective user.
            let owner = std::fs::metadata(self.proc_root.join(pid.to_string())).map(|m| m.uid()).unwrap_or(u32::MAX);
            by_owner.entry(owner).or_default().push_back(pid);
        }
        let mut order = Vec::new();
        while !by_owner.is_empty() {
            by_owner.retain(|_, pids| {
                if let Some(pid) = pids.pop_front() {
                    order.push(pid);
                }
                !pids.is_empty()
            });
        }
        order
    }

    /// The nearest ancestor of `pid` (itself included) with its own ML verdict.
    fn ml_ancestor(&self, mut pid: u32) -> Option<u32> {
        for _ in 0..64 {
            let seen = self.seen.get(&pid)?;
            if seen.verdict.is_some() {
                return Some(pid);
            }
            if seen.ppid == 0 || seen.ppid == pid {
                return None;
            }
            pid = seen.ppid;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn stat_lines() {
        let line = "4242 (python3 (worker)) S 4100 4242 4100 0 -1 4194560 1 0 0 0 3 1 0 0 20 0 4 0 987654 0 0";
        assert_eq!(parse_stat(line), Some((4100, 987654, "python3 (worker)".to_string())));
        assert_eq!(parse_stat("garbage"), None);
    }

    /// A test double named like the CUDA driver library: a real shared object, loaded with
    /// LD_PRELOAD, that does nothing. Built with the C compiler every Rust toolchain has.
    fn cuda_test_double(dir: &std::path::Path) -> PathBuf {
        let source = dir.join("cuda_test_double.c");
        std::fs::write(&source, "int cuda_test_double_marker(void) { return 42; }\n").unwrap();
        let library = dir.join("libcuda.so.1");
        let status =
            Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&library).arg(&source).status().expect("cc");
        assert!(status.success(), "building the libcuda test double failed");
        library
    }

    struct Reaped(std::process::Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = Command::new("pkill").args(["-P", &self.0.id().to_string()]).status();
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_process_mapping_cuda_and_its_children_are_ml() {
        let dir = crate::test_support::ScratchDir::new("ml-detect");
        let library = cuda_test_double(dir.path());
        // The parent maps the test double; its child is started without it (like a DataLoader
        // worker that never touches the GPU) and is ML as the parent's descendant.
        let parent = Reaped(
            Command::new("sh")
                .args(["-c", "LD_PRELOAD= sleep 30 & wait"])
                .env("LD_PRELOAD", &library)
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let plain = Reaped(Command::new("sleep").arg("30").spawn().unwrap());
        let mut detector = MlDetector::new(DEFAULT_LIBRARIES.iter().map(|s| s.to_string()).collect(), vec![]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let (found, child) = loop {
            let found = detector.scan();
            let child = found.iter().find(|p| p.reason == MlReason::Parent(parent.0.id())).cloned();
            if let Some(child) = child {
                break (found, child);
            }
            assert!(std::time::Instant::now() < deadline, "child not detected: {found:?}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let me = found.iter().find(|p| p.pid == parent.0.id()).expect("the parent is ML");
        assert_eq!(me.reason, MlReason::Library("libcuda.so.1".into()));
        assert_eq!(child.comm, "sleep");
        assert!(!found.iter().any(|p| p.pid == plain.0.id()), "an unrelated process is not ML");

        // A configured pattern marks a process by its command line.
        let mut by_name = MlDetector::new(vec![], vec!["30".into()]);
        let named = by_name.scan();
        assert!(named.iter().any(|p| p.pid == plain.0.id() && p.reason == MlReason::Cmdline("30".into())));
    }

    #[test]
    fn processes_out_of_the_watch_scope_are_not_looked_at() {
        use super::super::trust::WatchConfig;
        let marked = Reaped(Command::new("sleep").arg("31.5").spawn().unwrap());
        let pattern = vec!["31.5".to_string()];
        let found = |watch: WatchConfig| {
            let watch = Watch::resolve(&watch).unwrap();
            let mut detector = MlDetector::new(vec![], pattern.clone()).watching(watch);
            detector.scan().iter().any(|p| p.pid == marked.0.id())
        };
        // SAFETY: getuid has no preconditions.
        let me = unsafe { libc::getuid() }.to_string();
        let own_cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", marked.0.id())).unwrap();
        let own_cgroup = own_cgroup.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/").to_string();
        assert!(found(WatchConfig::default()), "no scope: every process");
        assert!(found(WatchConfig { users: vec![me.clone()], ..Default::default() }), "its user");
        assert!(!found(WatchConfig { users: vec!["4242".into()], ..Default::default() }), "another user");
        assert!(found(WatchConfig { cgroups: vec![own_cgroup.clone()], ..Default::default() }), "its cgroup");
        let elsewhere = WatchConfig { cgroups: vec![format!("{own_cgroup}-other")], ..Default::default() };
        assert!(!found(elsewhere), "a cgroup whose name only starts like its own");
        let relative = WatchConfig { cgroups: vec!["slurm".into()], ..Default::default() };
        let err = Watch::resolve(&relative).unwrap_err().to_string();
        assert!(err.contains("scheduler.watch.cgroups"), "{err}");
    }
}
