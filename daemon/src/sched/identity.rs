//! Who an ML process is, read from what the system and the job say of it rather than guessed
//! from its pid: its cgroup v2 path (a Slurm job and step, a Kubernetes pod and container, a
//! systemd unit, a Docker or containerd container) and an allow-list of its environment (Slurm's
//! and torchrun's variables).
//!
//! Everything here is written by the job's owner. Each value is bounded (the files read, the
//! variables looked at, the length and characters of what is kept), and it is used for labels
//! only: never for enforcement's admission, never as a path.

use std::fs::File;
use std::io::Read;
use std::path::Path;

pub use ringside_shared::JobIdentity;

/// Bytes of `/proc/<pid>/environ` read at most: past them the rest is not looked at.
pub const MAX_ENVIRON_BYTES: u64 = 256 * 1024;
/// Bytes of `/proc/<pid>/cgroup` read at most.
pub const MAX_CGROUP_BYTES: u64 = 16 * 1024;
/// Longest value kept; a longer one is refused, not cut (a cut id would name another job).
pub const MAX_VALUE: usize = JobIdentity::MAX_VALUE;

/// A value kept as a label: printable ASCII without spaces or quotes, at most [`MAX_VALUE`]
/// bytes; anything else is dropped.
fn label(value: &str) -> Option<String> {
    let ok = !value.is_empty()
        && value.len() <= MAX_VALUE
        && value.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\'' | b'\\' | b'`'));
    ok.then(|| value.to_string())
}

/// A number kept as a rank or a size: decimal, at most 1,000,000.
fn number(value: &str) -> Option<u32> {
    (value.len() <= 7 && value.bytes().all(|b| b.is_ascii_digit()))
        .then(|| value.parse().ok())
        .flatten()
        .filter(|n| *n <= 1_000_000)
}

/// A container id: 64 lowercase hex digits.
fn container_id(text: &str) -> Option<String> {
    (text.len() == 64 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        .then(|| text.to_string())
}

/// A pod UID as the cgroup path writes it: `pod` + 36 characters, with `_` for `-` in the
/// systemd layout.
fn pod_uid(component: &str) -> Option<String> {
    let uid = component.strip_prefix("kubepods-").unwrap_or(component);
    let uid = match uid.rsplit_once("-pod") {
        Some((_, uid)) => uid,
        None => uid.strip_prefix("pod")?,
    };
    let uid = uid.strip_suffix(".slice").unwrap_or(uid).replace('_', "-");
    let ok = uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    ok.then_some(uid.to_ascii_lowercase())
}

/// What a cgroup v2 path says of the job: Slurm (`/system.slice/slurmstepd.scope/job_12/step_0/
/// user/task_0`, or `/slurm/uid_1000/job_12/step_batch`), Kubernetes (cgroupfs: `/kubepods/
/// burstable/pod<uid>/<container id>`; systemd: `/kubepods.slice/kubepods-burstable.slice/
/// kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`), Docker
/// (`/docker/<id>`, `/system.slice/docker-<id>.scope`), a systemd unit (`/system.slice/
/// train.service`).
pub fn from_cgroup_path(path: &str) -> JobIdentity {
    let mut id = JobIdentity::default();
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).take(64).collect();
    let in_pods = components.iter().any(|c| c.starts_with("kubepods"));
    for (i, c) in components.iter().enumerate() {
        if let Some(job) = c.strip_prefix("job_") {
            id.slurm_job = id.slurm_job.or(number(job).map(|n| n.to_string()));
        } else if let Some(step) = c.strip_prefix("step_") {
            let known = matches!(step, "batch" | "extern" | "interactive") || number(step).is_some();
            if known && id.slurm_job.is_some() {
                id.slurm_step = Some(step.to_string());
            }
        } else if in_pods && c.contains("pod") {
            id.pod_uid = id.pod_uid.or(pod_uid(c));
        } else if let Some(unit) = c.strip_suffix(".service") {
            // A unit's name, unless it is a container runtime's own scope or slice.
            if i + 1 == components.len() || !in_pods {
                id.unit = label(&format!("{unit}.service"));
            }
        }
        // A container id: the component itself (cgroupfs), or inside `<runtime>-<id>.scope`.
        let inner = c.strip_suffix(".scope").map_or(*c, |s| s.rsplit_once('-').map_or(s, |(_, id)| id));
        if let Some(container) = container_id(inner) {
            id.container = Some(container);
        }
    }
    if id.pod_uid.is_some() || id.container.is_some() {
        id.unit = None;
    }
    id
}

/// What the allow-listed variables of an environment (`NAME=value` entries separated by NUL)
/// say, wherever they are among the others (a launcher's order is its own): the bound is the
/// bytes read ([`MAX_ENVIRON_BYTES`]). A malformed entry or value is skipped.
pub fn from_environ(bytes: &[u8], in_pod: bool) -> JobIdentity {
    let mut id = JobIdentity::default();
    let (mut procid, mut localid) = (None, None);
    for entry in bytes.split(|b| *b == 0) {
        let Ok(entry) = std::str::from_utf8(entry) else { continue };
        let Some((name, value)) = entry.split_once('=') else { continue };
        match name {
            "SLURM_JOB_ID" => id.slurm_job = number(value).map(|n| n.to_string()),
            "SLURM_STEP_ID" => id.slurm_step = number(value).map(|n| n.to_string()),
            "SLURM_JOB_NAME" => id.slurm_job_name = label(value),
            "SLURM_NODEID" => id.slurm_node = number(value),
            "SLURM_PROCID" => procid = number(value),
            "SLURM_LOCALID" => localid = number(value),
            "TORCHELASTIC_RUN_ID" => id.run_id = label(value),
            "RANK" => id.rank = number(value),
            "LOCAL_RANK" => id.local_rank = number(value),
            "WORLD_SIZE" => id.world_size = number(value),
            "LOCAL_WORLD_SIZE" => id.local_world_size = number(value),
            "GROUP_RANK" => id.group_rank = number(value),
            "HOSTNAME" if in_pod => id.pod = label(value),
            _ => {}
        }
    }
    id.rank = id.rank.or(procid);
    id.local_rank = id.local_rank.or(localid);
    id
}

/// Reads at most `limit` bytes of a file.
fn read_at_most(path: &Path, limit: u64) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    File::open(path).and_then(|f| f.take(limit).read_to_end(&mut bytes)).ok()?;
    Some(bytes)
}

/// Process `pid`'s identity from its cgroup (v2: the `0::` line) and its environment, each read
/// within its bound. The path says more than the environment where both speak: a job can set
/// its own variables, not move itself out of the cgroup its scheduler gave it.
pub fn of_process(proc_root: &Path, pid: u32) -> JobIdentity {
    let dir = proc_root.join(pid.to_string());
    let cgroup = read_at_most(&dir.join("cgroup"), MAX_CGROUP_BYTES).unwrap_or_default();
    let path = String::from_utf8_lossy(&cgroup)
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        .unwrap_or_default();
    let from_path = from_cgroup_path(&path);
    let in_pod = from_path.pod_uid.is_some();
    let environ = read_at_most(&dir.join("environ"), MAX_ENVIRON_BYTES).unwrap_or_default();
    from_path.or(from_environ(&environ, in_pod))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTAINER: &str = "3f2a9c6e5b1d4c7a8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d";

    #[test]
    fn slurm_paths_name_the_job_and_step() {
        let id = from_cgroup_path("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0");
        assert_eq!((id.slurm_job.as_deref(), id.slurm_step.as_deref()), (Some("4242"), Some("0")));
        assert_eq!(id.job_id().as_deref(), Some("4242.0"));
        let batch = from_cgroup_path("/slurm/uid_1000/job_77/step_batch");
        assert_eq!(batch.job_id().as_deref(), Some("77.batch"));
        let ext = from_cgroup_path("/slurm/uid_1000/job_77/step_extern");
        assert_eq!(ext.slurm_step.as_deref(), Some("extern"));
        // A step without its job, or a job id that is not a number, is not a job.
        assert_eq!(from_cgroup_path("/user.slice/step_3"), JobIdentity::default());
        assert_eq!(from_cgroup_path("/slurm/job_x1/step_0").slurm_job, None);
    }

    #[test]
    fn kubernetes_pods_in_both_layouts() {
        let uid = "1b4e28ba-2fa1-11d2-883f-0016d3cca427";
        let cgroupfs = from_cgroup_path(&format!("/kubepods/burstable/pod{uid}/{CONTAINER}"));
        assert_eq!((cgroupfs.pod_uid.as_deref(), cgroupfs.container.as_deref()), (Some(uid), Some(CONTAINER)));
        let systemd = from_cgroup_path(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CONTAINER}.scope",
            uid.replace('-', "_")
        ));
        assert_eq!((systemd.pod_uid.as_deref(), systemd.container.as_deref()), (Some(uid), Some(CONTAINER)));
        let guaranteed = from_cgroup_path(&format!("/kubepods.slice/kubepods-pod{}.slice", uid.replace('-', "_")));
        assert_eq!(guaranteed.pod_uid.as_deref(), Some(uid));
        assert_eq!(systemd.job_id().as_deref(), Some(uid), "a pod is the job where nothing else names one");
    }

    #[test]
    fn containers_and_units() {
        assert_eq!(from_cgroup_path(&format!("/docker/{CONTAINER}")).container.as_deref(), Some(CONTAINER));
        let scope = from_cgroup_path(&format!("/system.slice/docker-{CONTAINER}.scope"));
        assert_eq!((scope.container.as_deref(), scope.unit), (Some(CONTAINER), None));
        let unit = from_cgroup_path("/system.slice/train-llm.service");
        assert_eq!(unit.unit.as_deref(), Some("train-llm.service"));
        assert_eq!(unit.job_id(), None, "a unit is this node's only");
        assert_eq!(from_cgroup_path("/docker/not-an-id").container, None);
    }

    #[test]
    fn the_environment_is_read_from_an_allow_list() {
        let env = b"PATH=/usr/bin\0SLURM_JOB_ID=4242\0SLURM_PROCID=9\0SLURM_LOCALID=1\0WORLD_SIZE=16\0\
                    TORCHELASTIC_RUN_ID=run-7\0HOSTNAME=trainer-0\0SECRET_TOKEN=hunter2\0";
        let id = from_environ(env, false);
        assert_eq!(id.slurm_job.as_deref(), Some("4242"));
        assert_eq!((id.rank, id.local_rank, id.world_size), (Some(9), Some(1), Some(16)));
        assert_eq!(id.run_id.as_deref(), Some("run-7"));
        assert_eq!(id.pod, None, "HOSTNAME names a pod only inside one");
        assert_eq!(from_environ(env, true).pod.as_deref(), Some("trainer-0"));
        // RANK wins over SLURM_PROCID, whatever the order.
        assert_eq!(from_environ(b"RANK=3\0SLURM_PROCID=9\0", false).rank, Some(3));
    }

    #[test]
    fn hostile_values_are_dropped_and_the_read_is_bounded() {
        // Quotes, spaces, control characters, non-UTF-8, over-long values and huge numbers.
        let mut env = b"TORCHELASTIC_RUN_ID=a\"b\0SLURM_JOB_NAME=two words\0RANK=99999999\0\
                        WORLD_SIZE=-1\0LOCAL_RANK=\xff\xfe\0SLURM_JOB_ID=12\n34\0"
            .to_vec();
        env.extend(format!("TORCHELASTIC_RUN_ID={}\0", "x".repeat(64 * 1024)).bytes());
        let id = from_environ(&env, true);
        assert_eq!(id, JobIdentity::default(), "{id:?}");
        // 10,000 variables before it: still found, within the bytes read.
        let mut many: Vec<u8> = (0..10_000).flat_map(|i| format!("V{i}=x\0").into_bytes()).collect();
        many.extend(b"RANK=1\0");
        assert_eq!(from_environ(&many, false).rank, Some(1));
        // A path with 10,000 components is looked at for its first 64.
        let deep = format!("{}/job_5", "/a".repeat(10_000));
        assert_eq!(from_cgroup_path(&deep).slurm_job, None);
    }

    #[test]
    fn the_cgroup_path_wins_over_the_environment() {
        let dir = std::env::temp_dir().join(format!("ringside-identity-{}", std::process::id()));
        let proc_dir = dir.join("77");
        std::fs::create_dir_all(&proc_dir).unwrap();
        std::fs::write(proc_dir.join("cgroup"), "0::/slurm/uid_0/job_12/step_3\n").unwrap();
        std::fs::write(proc_dir.join("environ"), b"SLURM_JOB_ID=99\0SLURM_PROCID=5\0").unwrap();
        let id = of_process(&dir, 77);
        assert_eq!((id.slurm_job.as_deref(), id.slurm_step.as_deref(), id.rank), (Some("12"), Some("3"), Some(5)));
        // What lies past the bytes read is not looked at.
        let mut past = vec![b'F'; MAX_ENVIRON_BYTES as usize];
        past.extend(b"\0RANK=7\0");
        std::fs::write(proc_dir.join("environ"), past).unwrap();
        assert_eq!(of_process(&dir, 77).rank, None);
        // A process gone (or unreadable) has no identity, and no error.
        assert_eq!(of_process(&dir, 78), JobIdentity::default());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
