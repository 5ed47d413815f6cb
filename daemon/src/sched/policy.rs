//! Decisions and their enforcement.
//!
//! `[scheduler.policy.<phase>]` says what a thread entering that phase gets: a nice value, a
//! scheduling policy (`normal` or `batch`), its CPUs (`any`, or `gpu_node`: the CPUs of the NUMA
//! node of the GPU its process holds open) and a time slice. In `observe` mode the decision is
//! only recorded; in `enforce` mode it is applied with setpriority(2), sched_setscheduler(2) and
//! sched_setaffinity(2), after the thread's own settings were saved. They are restored when the
//! thread's phase becomes `unknown` and when the daemon stops; a thread that exits is forgotten.
//!
//! Each decision also carries the weight and slice a sched_ext backend would apply from a BPF
//! map keyed by thread id, so the same records can drive it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::journal::{thread_start_time, Journal, Saved};
use crate::invalid::Invalid;

use ringside_bpf::parse_cpu_list;
use ringside_shared::Phase;
use serde::Deserialize;

/// CFS/EEVDF weights by nice value (-20..=19), as the kernel's `sched_prio_to_weight`.
const NICE_TO_WEIGHT: [u32; 40] = [
    88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916, 9548, 7620, 6100, 4904, 3906, 3121, 2501,
    1991, 1586, 1277, 1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29, 23, 18, 15,
];

pub fn weight_of_nice(nice: i32) -> u32 {
    NICE_TO_WEIGHT[(nice.clamp(-20, 19) + 20) as usize]
}

/// `[scheduler.policy.<phase>]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhasePolicy {
    /// -20 (most favoured) to 19.
    pub nice: i32,
    #[serde(default)]
    pub sched_policy: SchedPolicy,
    #[serde(default)]
    pub cpus: CpuChoice,
    /// Slice for a sched_ext backend (µs).
    #[serde(default = "default_slice")]
    pub slice_us: u32,
}

/// The scheduling policy a phase gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SchedPolicy {
    /// SCHED_OTHER.
    #[default]
    Normal,
    /// SCHED_BATCH: no wake-up preemption.
    Batch,
}

impl SchedPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            SchedPolicy::Normal => "normal",
            SchedPolicy::Batch => "batch",
        }
    }
}

/// The CPUs a phase runs on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CpuChoice {
    /// Wherever the kernel puts it.
    Any,
    /// The CPUs of the NUMA node of the GPU the process holds open.
    #[default]
    GpuNode,
}
fn default_slice() -> u32 {
    3000
}

impl PhasePolicy {
    fn new(nice: i32, slice_us: u32) -> PhasePolicy {
        PhasePolicy { nice, sched_policy: SchedPolicy::default(), cpus: CpuChoice::default(), slice_us }
    }

    pub fn check(&self, phase: &str) -> Result<(), Invalid> {
        Invalid::range(&format!("scheduler.policy.{phase}.nice"), self.nice, -20, 19)?;
        Invalid::range(&format!("scheduler.policy.{phase}.slice_us"), self.slice_us, 100, 1_000_000)
    }
}

/// The policy table. Defaults: every ML phase is favoured over other work on the node (nice
/// -5); data loading and the optimizer step, short CPU bursts on the critical path, get short
/// slices; threads waiting on or feeding the GPU get long ones.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyTable {
    pub data_loading: PhasePolicy,
    pub gpu_compute: PhasePolicy,
    pub nccl_collective: PhasePolicy,
    pub optimizer_step: PhasePolicy,
}

impl Default for PolicyTable {
    fn default() -> Self {
        PolicyTable {
            data_loading: PhasePolicy::new(-5, 1000),
            gpu_compute: PhasePolicy::new(-5, 5000),
            nccl_collective: PhasePolicy::new(-5, 5000),
            optimizer_step: PhasePolicy::new(-5, 1000),
        }
    }
}

impl PolicyTable {
    pub fn for_phase(&self, phase: Phase) -> Option<&PhasePolicy> {
        match phase {
            Phase::DataLoading => Some(&self.data_loading),
            Phase::GpuCompute => Some(&self.gpu_compute),
            Phase::NcclCollective => Some(&self.nccl_collective),
            Phase::OptimizerStep => Some(&self.optimizer_step),
            Phase::Unknown => None,
        }
    }

    pub fn check(&self) -> Result<(), Invalid> {
        self.data_loading.check("data_loading")?;
        self.gpu_compute.check("gpu_compute")?;
        self.nccl_collective.check("nccl_collective")?;
        self.optimizer_step.check("optimizer_step")
    }
}

/// Formats CPUs as a kernel CPU list.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        while i + 1 < sorted.len() && sorted[i + 1] == sorted[i] + 1 {
            i += 1;
        }
        parts.push(if sorted[i] == start { start.to_string() } else { format!("{start}-{}", sorted[i]) });
        i += 1;
    }
    parts.join(",")
}

/// GPU minor numbers a process holds open (`/dev/nvidiaN`), among its first
/// [`super::ml::MAX_FDS`] open files.
pub fn gpus_of(proc_root: &Path, pid: u32) -> Vec<u32> {
    gpus_of_counted(proc_root, pid).0
}

/// [`gpus_of`], and how many open-file links were read (for a scan's budget).
pub fn gpus_of_counted(proc_root: &Path, pid: u32) -> (Vec<u32>, usize) {
    let mut gpus = Vec::new();
    let mut links = 0;
    if let Ok(fds) = std::fs::read_dir(proc_root.join(pid.to_string()).join("fd")) {
        for fd in fds.flatten().take(super::ml::MAX_FDS) {
            links += 1;
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if let Some(n) =
                    target.to_str().and_then(|t| t.strip_prefix("/dev/nvidia")).and_then(|n| n.parse().ok())
                {
                    if !gpus.contains(&n) {
                        gpus.push(n);
                    }
                }
            }
        }
    }
    gpus.sort_unstable();
    (gpus, links)
}

/// The NUMA node of GPU `minor`: its PCI address from the driver's
/// `/proc/driver/nvidia/gpus/<pci>/information` ("Device Minor: N"), then
/// `/sys/bus/pci/devices/<pci>/numa_node` (-1 means none).
pub fn gpu_numa_node(proc_root: &Path, sys_root: &Path, minor: u32) -> Option<u32> {
    let gpus = std::fs::read_dir(proc_root.join("driver/nvidia/gpus")).ok()?;
    for gpu in gpus.flatten() {
        let info = std::fs::read_to_string(gpu.path().join("information")).unwrap_or_default();
        let this_minor =
            info.lines().find_map(|l| l.strip_prefix("Device Minor:")).and_then(|v| v.trim().parse::<u32>().ok());
        if this_minor == Some(minor) {
            let pci = gpu.file_name().to_string_lossy().to_lowercase();
            let node = std::fs::read_to_string(sys_root.join("bus/pci/devices").join(&pci).join("numa_node")).ok()?;
            return node.trim().parse::<i64>().ok().and_then(|n| u32::try_from(n).ok());
        }
    }
    None
}

/// CPUs of a NUMA node.
pub fn node_cpus(sys_root: &Path, node: u32) -> Vec<usize> {
    std::fs::read_to_string(sys_root.join(format!("devices/system/node/node{node}/cpulist")))
        .map(|t| parse_cpu_list(&t))
        .unwrap_or_default()
}

/// A thread's scheduling settings as the kernel reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub nice: i32,
    /// SCHED_* number.
    pub policy: i32,
    pub cpus: Vec<usize>,
}

/// Why a thread's settings could not be read, saved or changed.
#[derive(Debug, thiserror::Error)]
pub enum EnforceError {
    /// A scheduling syscall failed (`call` names it).
    #[error("{call}: {source}")]
    Syscall { call: &'static str, source: std::io::Error },
    #[error("left alone: it runs under real-time or idle policy {0}")]
    RealTime(i32),
    #[error("the thread is gone (its id names another thread now)")]
    Gone,
    #[error("cannot record its own settings first, so it is not changed: {0}")]
    Journal(std::io::Error),
}

/// The error of the scheduling syscall `call` that just failed.
fn failed(call: &'static str) -> EnforceError {
    EnforceError::Syscall { call, source: std::io::Error::last_os_error() }
}

/// Reads a thread's settings.
/// The nice value a thread is given when `asked` for: never below what its process could set
/// itself — `floor` (from RLIMIT_NICE or CAP_SYS_NICE), or its `own` value when that is lower
/// (a process may always keep what it has). Both backends go through this.
pub fn floored_nice(asked: i32, floor: i32, own: i32) -> i32 {
    asked.max(floor.min(own))
}

pub fn read_settings(tid: u32) -> Result<Settings, EnforceError> {
    // SAFETY: plain syscalls on a thread id; errno is cleared first because -1 is a valid
    // priority; the cpu_set_t is zeroed and its size passed.
    let (nice, policy, affinity) = unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, tid);
        if nice == -1 && *libc::__errno_location() != 0 {
            return Err(failed("getpriority"));
        }
        let policy = libc::sched_getscheduler(tid as i32);
        if policy < 0 {
            return Err(failed("sched_getscheduler"));
        }
        let mut affinity: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(tid as i32, std::mem::size_of::<libc::cpu_set_t>(), &mut affinity) != 0 {
            return Err(failed("sched_getaffinity"));
        }
        (nice, policy, affinity)
    };
    let cpus = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `affinity` is an initialised cpu_set_t and the index is below CPU_SETSIZE.
        .filter(|cpu| unsafe { libc::CPU_ISSET(*cpu, &affinity) })
        .collect();
    Ok(Settings { nice, policy, cpus })
}

/// Sets a thread's policy, nice value and (when `cpus` is not empty) CPUs.
pub fn write_settings(tid: u32, nice: i32, policy: i32, cpus: &[usize]) -> Result<(), EnforceError> {
    let affinity = (!cpus.is_empty()).then(|| {
        // SAFETY: a zeroed cpu_set_t is valid; CPU_SET is given indices below CPU_SETSIZE.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &cpu in cpus.iter().filter(|c| **c < libc::CPU_SETSIZE as usize) {
                libc::CPU_SET(cpu, &mut set);
            }
            set
        }
    });
    // SAFETY: plain syscalls on a thread id with valid, initialised arguments.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_getscheduler(tid as i32) != policy && libc::sched_setscheduler(tid as i32, policy, &param) != 0 {
            return Err(failed("sched_setscheduler"));
        }
        if libc::setpriority(libc::PRIO_PROCESS, tid, nice) != 0 {
            return Err(failed("setpriority"));
        }
        if let Some(set) = &affinity {
            if libc::sched_setaffinity(tid as i32, std::mem::size_of::<libc::cpu_set_t>(), set) != 0 {
                return Err(failed("sched_setaffinity"));
            }
        }
    }
    Ok(())
}

/// A thread to change: its ids and its start time (which tells it from a later thread given
/// the same id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadId {
    pub pid: u32,
    pub tid: u32,
    pub start_time: u64,
}

/// Applies decisions and remembers what to restore, in memory and in the [`Journal`], which
/// holds a thread's own settings before its first change. Dropping it (daemon stop, or the
/// observer thread unwinding from a panic) restores every thread still changed.
pub struct Enforcer {
    proc_root: PathBuf,
    originals: HashMap<u32, Saved>,
    journal: Option<Journal>,
}

impl Enforcer {
    pub fn new(proc_root: PathBuf, journal: Option<Journal>) -> Enforcer {
        Enforcer { proc_root, originals: HashMap::new(), journal }
    }

    /// Whether `thread` is the thread its id names now.
    fn alive(&self, thread: ThreadId) -> bool {
        thread_start_time(&self.proc_root, thread.pid, thread.tid) == Some(thread.start_time)
    }

    /// Applies a nice value (never below `nice_floor`, unless the thread's own value already
    /// is), policy and (if given) CPUs to a thread, saving its own settings first. Threads
    /// under a real-time policy are left alone. Returns the nice value applied.
    pub fn apply(
        &mut self,
        thread: ThreadId,
        nice: i32,
        nice_floor: i32,
        batch: bool,
        cpus: &[usize],
    ) -> Result<i32, EnforceError> {
        if self.originals.get(&thread.tid).is_some_and(|o| o.start_time != thread.start_time) {
            // The id now names another thread: the one saved is gone.
            self.forget(thread.tid);
        }
        if !self.originals.contains_key(&thread.tid) {
            let own = read_settings(thread.tid)?;
            if own.policy != libc::SCHED_OTHER && own.policy != libc::SCHED_BATCH {
                return Err(EnforceError::RealTime(own.policy));
            }
            // Checked after reading: the settings read are this thread's.
            if !self.alive(thread) {
                return Err(EnforceError::Gone);
            }
            let saved = Saved {
                pid: thread.pid,
                tid: thread.tid,
                start_time: thread.start_time,
                nice: own.nice,
                policy: own.policy,
                cpus: own.cpus,
            };
            if let Some(journal) = &mut self.journal {
                journal.saved(&saved).map_err(EnforceError::Journal)?;
            }
            self.originals.insert(thread.tid, saved);
        }
        let nice = floored_nice(nice, nice_floor, self.originals[&thread.tid].nice);
        write_settings(thread.tid, nice, if batch { libc::SCHED_BATCH } else { libc::SCHED_OTHER }, cpus)?;
        Ok(nice)
    }

    /// Puts a thread's own settings back; false if nothing was changed (or the thread is gone).
    pub fn restore(&mut self, tid: u32) -> Result<bool, EnforceError> {
        let Some(saved) = self.originals.remove(&tid) else { return Ok(false) };
        let thread = ThreadId { pid: saved.pid, tid, start_time: saved.start_time };
        let result = if self.alive(thread) {
            write_settings(tid, saved.nice, saved.policy, &saved.cpus).map(|()| true)
        } else {
            Ok(false)
        };
        self.journal_restored(&saved);
        result
    }

    fn journal_restored(&mut self, saved: &Saved) {
        if let Some(journal) = &mut self.journal {
            if let Err(e) = journal.restored(saved.tid, saved.start_time, self.originals.values()) {
                tracing::warn!("enforcement journal: {e}");
            }
        }
    }

    /// A thread that exited: nothing to restore.
    pub fn forget(&mut self, tid: u32) {
        if let Some(saved) = self.originals.remove(&tid) {
            self.journal_restored(&saved);
        }
    }

    pub fn changed(&self) -> usize {
        self.originals.len()
    }

    pub fn is_changed(&self, tid: u32) -> bool {
        self.originals.contains_key(&tid)
    }

    /// Restores every thread still changed (at stop). Returns how many were restored.
    pub fn restore_all(&mut self) -> usize {
        let tids: Vec<u32> = self.originals.keys().copied().collect();
        let restored = tids.into_iter().filter(|tid| matches!(self.restore(*tid), Ok(true))).count();
        if let Some(journal) = &mut self.journal {
            if let Err(e) = journal.clear() {
                tracing::warn!("enforcement journal: {e}");
            }
        }
        restored
    }
}

/// Puts back the settings of every thread an earlier run left changed whose start time still
/// matches; a thread that is gone, or whose id now names another thread, is left alone.
/// Returns (restored, skipped).
pub fn restore_leftovers(proc_root: &Path, leftovers: &[Saved]) -> (usize, usize) {
    let (mut restored, mut skipped) = (0, 0);
    for saved in leftovers {
        if thread_start_time(proc_root, saved.pid, saved.tid) != Some(saved.start_time) {
            skipped += 1;
            continue;
        }
        match write_settings(saved.tid, saved.nice, saved.policy, &saved.cpus) {
            Ok(()) => restored += 1,
            Err(e) => {
                tracing::warn!(tid = saved.tid, "cannot restore the settings an earlier run changed: {e}");
                skipped += 1;
            }
        }
    }
    (restored, skipped)
}

impl Drop for Enforcer {
    fn drop(&mut self) {
        let restored = self.restore_all();
        if restored > 0 {
            tracing::info!("restored the scheduling settings of {restored} threads");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(format_cpu_list(&[11, 0, 1, 2, 3, 8, 10]), "0-3,8,10-11");
        assert_eq!(parse_cpu_list(""), Vec::<usize>::new());
    }

    #[test]
    fn a_nice_value_is_never_below_what_the_process_could_set_itself() {
        // RLIMIT_NICE 0 (floor 20): not below its own value.
        assert_eq!(floored_nice(-5, 20, 0), 0);
        assert_eq!(floored_nice(-5, 20, 3), 3);
        // RLIMIT_NICE 25 (floor -5), or CAP_SYS_NICE (floor -20): what it asked.
        assert_eq!(floored_nice(-5, -5, 0), -5);
        assert_eq!(floored_nice(-10, -5, 0), -5);
        assert_eq!(floored_nice(-5, -20, 0), -5);
        // A process already below the floor keeps what it has, no lower.
        assert_eq!(floored_nice(-15, -5, -10), -10);
        // Never raised above what was asked for.
        assert_eq!(floored_nice(5, 20, 0), 5);
    }

    #[test]
    fn weights_follow_the_kernel_table() {
        assert_eq!(weight_of_nice(0), 1024);
        assert_eq!(weight_of_nice(-5), 3121);
        assert_eq!(weight_of_nice(-20), 88761);
        assert_eq!(weight_of_nice(50), 15);
    }

    #[test]
    fn policies_are_checked_naming_the_table() {
        let mut table = PolicyTable::default();
        assert!(table.check().is_ok());
        table.optimizer_step.nice = -30;
        assert!(table.check().unwrap_err().key == "scheduler.policy.optimizer_step.nice");
        // Values outside the vocabulary are refused when the table is read, naming the key.
        let wrong = toml::from_str::<PolicyTable>("[gpu_compute]\nnice = -5\ncpus = \"node7\"\n").unwrap_err();
        let wrong = wrong.to_string();
        assert!(wrong.contains("cpus") && wrong.contains("node7") && wrong.contains("gpu_node"), "{wrong}");
        let batch = toml::from_str::<PolicyTable>("[data_loading]\nnice = 0\nsched_policy = \"batch\"\n").unwrap();
        assert_eq!(
            (batch.data_loading.sched_policy, batch.data_loading.cpus),
            (SchedPolicy::Batch, CpuChoice::GpuNode)
        );
    }

    /// A GPU's NUMA node from a sysfs/procfs tree laid out as the NVIDIA driver and the PCI
    /// core lay it out (a fixture: no GPU here).
    #[test]
    fn gpu_to_numa_node_from_driver_and_pci_files() {
        let dir = crate::test_support::ScratchDir::new("gpu-numa");
        let proc_root = dir.path().join("proc");
        let sys_root = dir.path().join("sys");
        for (pci, minor, node) in [("0000:17:00.0", 0, "0"), ("0000:CA:00.0", 1, "1")] {
            let gpu = proc_root.join("driver/nvidia/gpus").join(pci);
            std::fs::create_dir_all(&gpu).unwrap();
            std::fs::write(gpu.join("information"), format!("Model: \t NVIDIA H200\nDevice Minor: \t {minor}\n"))
                .unwrap();
            let dev = sys_root.join("bus/pci/devices").join(pci.to_lowercase());
            std::fs::create_dir_all(&dev).unwrap();
            std::fs::write(dev.join("numa_node"), format!("{node}\n")).unwrap();
        }
        let node1 = sys_root.join("devices/system/node/node1");
        std::fs::create_dir_all(&node1).unwrap();
        std::fs::write(node1.join("cpulist"), "48-95,144-191\n").unwrap();
        assert_eq!(gpu_numa_node(&proc_root, &sys_root, 0), Some(0));
        assert_eq!(gpu_numa_node(&proc_root, &sys_root, 1), Some(1));
        assert_eq!(gpu_numa_node(&proc_root, &sys_root, 2), None);
        assert_eq!(node_cpus(&sys_root, 1).len(), 96);
    }

    #[test]
    fn enforcing_changes_a_thread_and_restoring_puts_it_back() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let before = read_settings(tid).unwrap();
        let dir = crate::test_support::ScratchDir::new("enforcer");
        let (journal, _) = Journal::open(&dir.path().join("enforce.journal")).unwrap();
        let mut enforcer = Enforcer::new("/proc".into(), Some(journal));
        let me = std::process::id();
        let start_time = thread_start_time(Path::new("/proc"), me, tid).unwrap();
        let id = ThreadId { pid: me, tid, start_time };
        // Raising nice (less favoured) and a subset of CPUs needs no privilege.
        let one_cpu = vec![before.cpus[0]];
        assert_eq!(enforcer.apply(id, 7, -20, true, &one_cpu).unwrap(), 7);
        // Saved on disk before the change: a daemon killed now would find it.
        let (_, left) = Journal::open(&dir.path().join("enforce.journal")).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!((left[0].tid, left[0].nice, left[0].cpus.clone()), (tid, before.nice, before.cpus.clone()));
        let during = read_settings(tid).unwrap();
        assert_eq!((during.nice, during.policy, during.cpus.clone()), (7, libc::SCHED_BATCH, one_cpu));
        assert!(enforcer.restore(tid).unwrap());
        assert_eq!(read_settings(tid).unwrap(), before);
        assert!(!enforcer.restore(tid).unwrap(), "nothing left to restore");
        assert!(Journal::open(&dir.path().join("enforce.journal")).unwrap().1.is_empty());
        // A floor above the asked value wins (RLIMIT_NICE), unless the thread's own is lower.
        assert_eq!(enforcer.apply(id, -5, 3, false, &[]).unwrap(), before.nice.clamp(-5, 3));
        // An id that names another thread now is refused and never changed.
        let reused = ThreadId { start_time: start_time + 1, ..id };
        drop(enforcer);
        let mut enforcer = Enforcer::new("/proc".into(), None);
        assert!(matches!(enforcer.apply(reused, 9, -20, false, &[]).unwrap_err(), EnforceError::Gone));
        assert_eq!(read_settings(tid).unwrap(), before, "dropping the enforcer restored the thread");
        done_tx.send(()).unwrap();
        thread.join().unwrap();
    }

    #[test]
    fn leftovers_of_a_thread_whose_id_was_reused_are_not_applied() {
        let me = std::process::id();
        let start = thread_start_time(Path::new("/proc"), me, me).expect("own start time");
        let other = Saved { pid: me, tid: me, start_time: start + 1, nice: 19, policy: 3, cpus: vec![0] };
        assert_eq!(restore_leftovers(Path::new("/proc"), &[other]), (0, 1));
        let gone = Saved { pid: u32::MAX - 1, tid: u32::MAX - 1, start_time: 1, nice: 0, policy: 0, cpus: vec![] };
        assert_eq!(restore_leftovers(Path::new("/proc"), &[gone]), (0, 1));
    }
}
