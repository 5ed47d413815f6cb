//! The scheduler's own thread: every window it reads the BPF counters of the threads of ML
//! processes, detects their phases, decides and (in `enforce` mode) applies; every scan
//! interval it looks for new ML processes, tracks them in BPF and probes their CUDA/NCCL
//! libraries. What it knows is published for the metrics source to read at each tick.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringside_bpf::scx::{self, ScxClass, ScxDecision, ScxScheduler};
use ringside_bpf::{calls_of_library, AttachState, EventKind, SchedProbe};
use ringside_shared::{
    clip, Decision, LibraryState, LibraryStatus, MlProcessInfo, MlTaskInfo, Phase, PhaseSpan, PhaseValues, ProbeLosses,
    ProbeProgram, ProcessRole, ProgramState, RefusedEvidence, SchedulerBackend, SchedulerMode, SchedulerTelemetry,
    ScxCounters, ScxExitInfo, ScxStatus,
};

use crate::pipeline::Feed;

use super::journal::thread_start_time;
use super::library::{self, LibraryInspector, Limits, Request};
use super::ml::{MlDetector, MlReason, DEFAULT_LIBRARIES};
use super::phase::{Counters, Evidence, Hysteresis};
use super::policy::{self, CpuChoice, Enforcer, PolicyTable, SchedPolicy, ThreadId};
use super::trust::{Admission, Credentials};

/// Run-queue samples kept per thread for its percentiles.
const RUNQ_SAMPLES: usize = 512;
/// Timeline kept per process: what the console draws. It travels in every update, so it is
/// bounded in time and in spans (a process flapping every window makes one span per window).
const TIMELINE_MS: u64 = 2 * 60 * 1000;
const MAX_SPANS: usize = 600;
/// A window in which one of a process's threads was runnable but not running for this share
/// of it or more marks the process as waiting for a CPU (the idle attribution's own bucket).
const CPU_WAIT_SHARE: f64 = 0.25;
/// CUDA/NCCL libraries looked at per process (the driver, the runtime and NCCL: a process
/// mapping more is up to something).
const MAX_LIBRARIES: usize = SchedulerTelemetry::MAX_LIBRARIES;
/// Threads observed per process, and over all processes, in one window: a process with a
/// hundred thousand threads must not stall the window.
const MAX_THREADS_PER_PROCESS: usize = 1024;
const MAX_THREADS_OBSERVED: usize = 8192;
/// A tracked process's `maps` is read for new libraries every this many scans.
const MAPS_EVERY: u32 = 5;

#[derive(Debug, Clone)]
pub struct ObserverConfig {
    pub backend: SchedulerBackend,
    pub window: Duration,
    pub scan_interval: Duration,
    pub policy: PolicyTable,
    pub ml_patterns: Vec<String>,
    /// Syscalls counted by the syscall tracepoints (else: blocking waits at context switches).
    pub syscall_tracepoints: bool,
    pub proc_root: PathBuf,
    pub sys_root: PathBuf,
    /// ML processes tracked at most; the rest are counted, not tracked.
    pub max_processes: usize,
    pub libraries: Limits,
    /// Whose processes decisions may change.
    pub admission: Admission,
}

/// What the observer publishes.
#[derive(Default)]
pub struct Published {
    pub telemetry: Option<SchedulerTelemetry>,
    /// Why some part does not work (e.g. syscall tracepoints failed to attach).
    pub degraded: Option<String>,
    /// When the latest window was published.
    pub published_at: Option<Instant>,
    /// What the observer is doing now, for a report when it stops publishing.
    pub stage: &'static str,
}

/// Run-queue samples kept in the feed until a `stats` kernel takes them.
pub const RUNQ_PENDING: usize = 16_384;

/// A CUDA/NCCL library a process maps, as far as it has been looked at.
struct Library {
    path: PathBuf,
    state: Inspection,
}

/// How far a library has been looked at (the wire's `LibraryState`, with what it found).
enum Inspection {
    Pending,
    Probed(usize),
    Refused(String),
}

struct Process {
    /// Tells this process from a later one given the same pid.
    start_time: u64,
    job: u32,
    comm: String,
    reason: String,
    role: ProcessRole,
    uid: Option<u32>,
    /// Why enforcement may (`Ok`) or may not (`Err`) change it.
    admission: Result<String, String>,
    /// The lowest nice value its threads may be given.
    nice_floor: i32,
    libraries: Vec<Library>,
    /// Scans since its `maps` was last read for libraries.
    scans_since_maps: u32,
    phase: Hysteresis,
    phase_since_ms: u64,
    phase_ms: PhaseValues<u64>,
    timeline: VecDeque<PhaseSpan>,
    gpus: Vec<u32>,
    numa_node: Option<u32>,
    node_cpus: Vec<usize>,
    threads: u32,
}

struct Task {
    pid: u32,
    start_time: u64,
    comm: String,
    before: Option<Counters>,
    last: Counters,
    evidence: Evidence,
    phase: Hysteresis,
    phase_ms: PhaseValues<u64>,
    runq: VecDeque<u64>,
    last_decision: Option<String>,
    window_ns: u64,
}

pub struct Observer {
    probe: SchedProbe,
    detector: MlDetector,
    config: ObserverConfig,
    processes: HashMap<u32, Process>,
    tasks: HashMap<u32, Task>,
    enforcer: Enforcer,
    backend: SchedulerBackend,
    /// The sched_ext scheduler while it runs.
    scx: Option<ScxScheduler>,
    /// What the console and `/healthz` show of it (kept after it stopped).
    scx_status: Option<ScxStatus>,
    decisions: VecDeque<Decision>,
    decisions_made: u64,
    transitions: u64,
    /// Phase time of every ML thread seen, exited ones included.
    total_phase_ms: PhaseValues<u64>,
    last_scan: Option<Instant>,
    thread_count: usize,
    skipped_runs: u64,
    /// Run-queue samples of this window, published with it into `runq`.
    window_runq: Vec<u64>,
    runq: Feed<u64>,
    published: Arc<Mutex<Published>>,
    libraries: LibraryInspector,
    /// ML processes found at the latest scan beyond `max_processes`.
    not_tracked: u64,
    /// Windows observed.
    windows: u64,
}

fn read_trimmed(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// `rchar` of a `/proc/.../io` file: bytes the task read with read-family syscalls.
fn read_chars(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("rchar:")).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

fn share(ns: u64, window_ns: u64) -> f64 {
    (ns as f64 / window_ns.max(1) as f64).min(1.0)
}

/// The kernel's `enum scx_exit_kind`, by name.
fn exit_kind_name(kind: i32) -> &'static str {
    match kind {
        1 => "done",
        64 => "unregistered",
        65 => "unregistered_bpf",
        66 => "unregistered_kernel",
        67 => "sysrq",
        1024 => "error",
        1025 => "error_bpf",
        1026 => "watchdog_stall",
        _ => "unknown",
    }
}

impl Observer {
    /// `scx` is the loaded sched_ext scheduler (backend `scx`), or why it is not there.
    pub fn new(
        probe: SchedProbe,
        config: ObserverConfig,
        scx: Option<Result<ScxScheduler, String>>,
        enforcer: Enforcer,
        published: Arc<Mutex<Published>>,
        runq: Feed<u64>,
    ) -> Observer {
        let libraries = DEFAULT_LIBRARIES.iter().map(|s| s.to_string()).collect();
        let mut backend = config.backend;
        let (scx, scx_status) = match scx {
            None => (None, None),
            Some(Ok(scheduler)) => {
                let status = ScxStatus { nodes: scheduler.nodes(), running: true, ..ScxStatus::default() };
                (Some(scheduler), Some(status))
            }
            Some(Err(why)) => {
                // Asked for sched_ext and did not get it: carry decisions out the other way.
                backend = SchedulerBackend::Setattr;
                (None, Some(ScxStatus { error: Some(why), ..ScxStatus::default() }))
            }
        };
        if config.backend == SchedulerBackend::Scx && scx.is_none() {
            backend = SchedulerBackend::Setattr;
        }
        Observer {
            probe,
            detector: MlDetector::new(libraries, config.ml_patterns.clone()).with_proc_root(&config.proc_root),
            libraries: LibraryInspector::new(config.proc_root.clone(), config.libraries),
            not_tracked: 0,
            windows: 0,
            config,
            processes: HashMap::new(),
            tasks: HashMap::new(),
            enforcer,
            backend,
            scx,
            scx_status,
            decisions: VecDeque::new(),
            decisions_made: 0,
            transitions: 0,
            total_phase_ms: PhaseValues::default(),
            last_scan: None,
            thread_count: 0,
            skipped_runs: 0,
            window_runq: Vec::new(),
            runq,
            published,
        }
    }

    /// Runs until `stop`, then restores every thread it changed.
    pub fn run(mut self, stop: Arc<AtomicBool>) {
        let mut next = Instant::now() + self.config.window;
        let mut last = Instant::now();
        let mut last_ms = crate::clock::now_ms();
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if next > now {
                // Between windows too: an ejected scheduler is noticed within 50 ms.
                self.check_scx();
                std::thread::sleep((next - now).min(Duration::from_millis(50)));
                continue;
            }
            next += self.config.window;
            if next < now {
                next = now + self.config.window;
            }
            self.check_scx();
            let elapsed = now.duration_since(last).as_nanos() as u64;
            let now_ms = crate::clock::now_ms();
            self.window(elapsed, last_ms, now_ms);
            last = now;
            last_ms = now_ms;
        }
        tracing::debug!("skipped BPF runs: {:?}", self.probe.skipped_runs());
        if let Some(mut scheduler) = self.scx.take() {
            let exit = scheduler.unregister();
            tracing::info!(?exit, "sched_ext scheduler unregistered");
        }
        let restored = self.enforcer.restore_all();
        if restored > 0 {
            tracing::info!("restored the scheduling settings of {restored} threads");
        }
        // Uprobes are slow to unregister: hand them to the probe's detaching thread rather
        // than hold up the daemon's stop.
        for pid in self.probe.probed_processes() {
            self.probe.detach_process(pid);
        }
    }

    fn stage(&self, stage: &'static str) {
        if let Ok(mut published) = self.published.lock() {
            published.stage = stage;
        }
    }

    /// One window of `window_ns`, from `start_ms` to `end_ms` (wall clock).
    pub fn window(&mut self, window_ns: u64, start_ms: u64, end_ms: u64) {
        self.stage("reading probe events");
        self.handle_events();
        self.attach_inspected();
        let scan_due = self.last_scan.is_none_or(|t| t.elapsed() >= self.config.scan_interval);
        if scan_due {
            self.stage("scanning processes");
            self.scan();
            self.last_scan = Some(Instant::now());
            self.thread_count = self.probe.thread_count();
            self.skipped_runs = self.probe.skipped_runs().iter().map(|(_, n)| n).sum();
        }
        self.stage("observing threads");
        self.observe(window_ns, start_ms, end_ms);
        self.stage("publishing");
        self.publish();
    }

    fn handle_events(&mut self) {
        for event in self.probe.drain_events() {
            match event.kind {
                EventKind::RunqWait { ns } => {
                    // Bounded by what one drain of the probe's ring buffer holds; trimmed to
                    // the newest at publication.
                    self.window_runq.push(ns);
                    if let Some(task) = self.tasks.get_mut(&event.tid) {
                        if task.runq.len() == RUNQ_SAMPLES {
                            task.runq.pop_front();
                        }
                        task.runq.push_back(ns);
                    }
                }
                EventKind::Fork { parent_tgid, inherited } => {
                    let tgid = if event.tgid != 0 { event.tgid } else { self.tgid_of(event.tid) };
                    if tgid != event.tid {
                        continue;
                    }
                    let parent_job = self.processes.get(&parent_tgid).map(|p| p.job);
                    // A fork bomb under an ML job is tracked up to the cap; the next scan counts the rest.
                    let full = self.processes.len() >= self.config.max_processes;
                    let start_time = thread_start_time(&self.config.proc_root, tgid, tgid);
                    if let (Some(job), false, Some(start_time)) = (parent_job, full, start_time) {
                        if !inherited {
                            let _ = self.probe.track(tgid, job);
                        }
                        self.add_process(
                            tgid,
                            start_time,
                            job,
                            event.comm.clone(),
                            format!("child of {parent_tgid}"),
                            ProcessRole::Worker,
                        );
                        self.refresh_admission(tgid);
                    }
                }
                EventKind::Exec => {
                    if let Some(p) = self.processes.get_mut(&event.tgid) {
                        p.comm = event.comm.clone();
                    }
                    // A new program may be ML: the next scan looks at it afresh. (Not a scan
                    // now: every exec on the node would trigger one.)
                    self.detector.forget(event.tgid);
                }
                EventKind::Exit => self.remove_process(event.tgid),
            }
        }
    }

    fn tgid_of(&self, tid: u32) -> u32 {
        let status = std::fs::read_to_string(self.config.proc_root.join(tid.to_string()).join("status"));
        status
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Tgid:")).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0)
    }

    fn add_process(&mut self, pid: u32, start_time: u64, job: u32, comm: String, reason: String, role: ProcessRole) {
        if self.processes.contains_key(&pid) {
            return;
        }
        tracing::info!(pid, job, comm, reason, "tracking ML process");
        // Admission is read by `refresh_admission`, which the caller runs next.
        self.processes.insert(
            pid,
            Process {
                start_time,
                job,
                comm,
                reason,
                role,
                uid: None,
                admission: Err("not admitted: not looked at yet".into()),
                nice_floor: 0,
                libraries: Vec::new(),
                scans_since_maps: 0,
                phase: Hysteresis::default(),
                phase_since_ms: crate::clock::now_ms(),
                phase_ms: PhaseValues::default(),
                timeline: VecDeque::new(),
                gpus: Vec::new(),
                numa_node: None,
                node_cpus: Vec::new(),
                threads: 0,
            },
        );
    }

    /// Whether enforcement may change `pid`, and the lowest nice value it may give it.
    fn admission_of(&self, pid: u32, creds: Option<&Credentials>) -> (Result<String, String>, i32) {
        if self.backend == SchedulerBackend::Observe {
            return (Err("observe mode: nothing is changed".into()), 0);
        }
        let Some(creds) = creds else { return (Err("not admitted: its credentials are unreadable".into()), 0) };
        let admission = self.config.admission.admits(&self.config.proc_root, pid, creds);
        let floor = if admission.is_ok() { self.config.admission.nice_floor(pid, creds) } else { 0 };
        (admission, floor)
    }

    fn remove_process(&mut self, pid: u32) {
        if self.processes.remove(&pid).is_none() {
            return;
        }
        self.probe.untrack(pid);
        self.probe.detach_process(pid);
        if let Some(scheduler) = &self.scx {
            scheduler.remove_job(pid);
        }
        let gone: Vec<u32> = self.tasks.iter().filter(|(_, t)| t.pid == pid).map(|(tid, _)| *tid).collect();
        for tid in gone {
            self.tasks.remove(&tid);
            self.forget_task(tid);
        }
    }

    /// Finds ML processes, tracks new ones (up to `max_processes`), checks whom enforcement
    /// may change and asks for the CUDA/NCCL libraries they map to be inspected.
    fn scan(&mut self) {
        let found = self.detector.scan();
        let alive: HashSet<u32> = found.iter().map(|p| p.pid).collect();
        // A pid that names another process now: the one tracked is gone.
        let replaced: Vec<u32> = found
            .iter()
            .filter(|ml| self.processes.get(&ml.pid).is_some_and(|p| p.start_time != ml.start_time))
            .map(|ml| ml.pid)
            .collect();
        // Processes that ended without an exit event (e.g. events lost).
        let gone: Vec<u32> = self
            .processes
            .keys()
            .copied()
            .filter(|pid| !alive.contains(pid) && !self.config.proc_root.join(pid.to_string()).exists())
            .collect();
        for pid in replaced.into_iter().chain(gone) {
            self.remove_process(pid);
        }
        // New ones, main processes first, then the busiest, while there is room.
        let mut new: Vec<_> = found.iter().filter(|ml| !self.processes.contains_key(&ml.pid)).collect();
        // Keys read once each: the probe's counters move while the sort runs, and a key that
        // changes between comparisons breaks the sort's total order (and panics).
        new.sort_by_cached_key(|ml| {
            let worker = matches!(ml.reason, MlReason::Parent(_));
            (worker, std::cmp::Reverse(self.probe.thread(ml.pid).map(|t| t.on_cpu_ns).unwrap_or(0)), ml.pid)
        });
        let room = self.config.max_processes.saturating_sub(self.processes.len());
        self.not_tracked = new.len().saturating_sub(room) as u64;
        let admitted: HashSet<u32> = new.iter().take(room).map(|ml| ml.pid).collect();
        for ml in &found {
            let (job, role, reason) = match &ml.reason {
                MlReason::Parent(ancestor) => (*ancestor, ProcessRole::Worker, format!("child of {ancestor}")),
                MlReason::Library(lib) => (ml.pid, ProcessRole::Main, format!("maps {lib}")),
                MlReason::Device(dev) => (ml.pid, ProcessRole::Main, format!("opens {dev}")),
                MlReason::Cmdline(p) => (ml.pid, ProcessRole::Main, format!("command line matches {p:?}")),
            };
            match self.processes.get_mut(&ml.pid) {
                Some(p) => {
                    // A worker that starts using the GPU itself becomes a main process.
                    if role == ProcessRole::Main && p.role == ProcessRole::Worker {
                        p.role = ProcessRole::Main;
                        p.reason = reason;
                    }
                }
                None if admitted.contains(&ml.pid) => {
                    self.add_process(ml.pid, ml.start_time, job, ml.comm.clone(), reason, role)
                }
                None => continue,
            }
            if let Err(e) = self.probe.track(ml.pid, job) {
                tracing::warn!(pid = ml.pid, "cannot track: {e}");
            }
        }
        let pids: Vec<u32> = self.processes.keys().copied().collect();
        for pid in pids {
            self.refresh_admission(pid);
            self.request_libraries(pid);
            let gpus = policy::gpus_of(&self.config.proc_root, pid);
            let node =
                gpus.first().and_then(|gpu| policy::gpu_numa_node(&self.config.proc_root, &self.config.sys_root, *gpu));
            let cpus = node.map(|n| policy::node_cpus(&self.config.sys_root, n)).unwrap_or_default();
            if let Some(p) = self.processes.get_mut(&pid) {
                p.gpus = gpus;
                p.numa_node = node;
                p.node_cpus = cpus;
            }
        }
        let probed: Vec<u32> = self.probe.probed_processes();
        for pid in probed {
            if !self.processes.contains_key(&pid) {
                self.probe.detach_process(pid);
            }
        }
    }

    /// Reads a process's credentials afresh (an exec can change them): a process no longer
    /// admitted gets its threads' own settings back.
    fn refresh_admission(&mut self, pid: u32) {
        let creds = Credentials::of(&self.config.proc_root, pid);
        let (admission, nice_floor) = self.admission_of(pid, creds.as_ref());
        let Some(process) = self.processes.get_mut(&pid) else { return };
        let was = process.admission.is_ok();
        process.uid = creds.map(|c| c.uid);
        process.admission = admission;
        process.nice_floor = nice_floor;
        let now = process.admission.is_ok();
        if was == now {
            return;
        }
        if let Some(scheduler) = &self.scx {
            if now {
                if let Err(e) = scheduler.add_job(pid) {
                    tracing::warn!(pid, "sched_ext: {e}");
                }
            } else {
                scheduler.remove_job(pid);
            }
        }
        if !now {
            let tids: Vec<u32> = self.tasks.iter().filter(|(_, t)| t.pid == pid).map(|(tid, _)| *tid).collect();
            for tid in tids {
                let _ = self.enforcer.restore(tid);
                if let Some(scheduler) = &self.scx {
                    scheduler.clear(tid);
                }
            }
        }
    }

    /// Queues the CUDA/NCCL libraries a process maps that have not been looked at (nor are
    /// waiting to be) for the inspector.
    fn request_libraries(&mut self, pid: u32) {
        let Some(process) = self.processes.get_mut(&pid) else { return };
        if process.libraries.iter().filter(|l| !matches!(l.state, Inspection::Pending)).count() >= MAX_LIBRARIES {
            return;
        }
        // `maps` of a large process is megabytes: read when new, every MAPS_EVERY scans after
        // (frameworks load CUDA lazily), and while a request waits to be sent again.
        let lost = process
            .libraries
            .iter()
            .any(|l| matches!(l.state, Inspection::Pending) && !self.libraries.is_queued(pid, &l.path));
        let due = process.scans_since_maps == 0 || process.scans_since_maps >= MAPS_EVERY || lost;
        process.scans_since_maps = if due { 1 } else { process.scans_since_maps + 1 };
        if !due {
            return;
        }
        for mapping in library::mappings(&self.config.proc_root, pid) {
            if calls_of_library(&mapping.path).is_empty() {
                continue;
            }
            // Pending entries stay until answered; one whose worker was abandoned is asked again.
            let known = process.libraries.iter().position(|l| l.path == mapping.path);
            if let Some(i) = known {
                match process.libraries[i].state {
                    Inspection::Pending if self.libraries.is_queued(pid, &mapping.path) => continue,
                    Inspection::Pending => {}
                    _ => continue,
                }
            } else if process.libraries.len() >= MAX_LIBRARIES {
                break;
            }
            let path = mapping.path.clone();
            if !self.libraries.request(Request { pid, mapping }) {
                break;
            }
            if known.is_none() {
                process.libraries.push(Library { path, state: Inspection::Pending });
            }
        }
    }

    /// Attaches the call probes to the libraries the inspector has read and accepted.
    fn attach_inspected(&mut self) {
        for done in self.libraries.poll() {
            let Some(process) = self.processes.get_mut(&done.pid) else { continue };
            let Some(library) = process.libraries.iter_mut().find(|l| l.path == done.path) else { continue };
            library.state = match done.result {
                Ok((file, entries)) => match self.probe.attach_library(done.pid, &done.path, &file, &entries) {
                    Ok(found) => {
                        tracing::info!(pid = done.pid, library = %done.path.display(), found, "probing CUDA/NCCL calls");
                        Inspection::Probed(found)
                    }
                    Err(e) => {
                        tracing::warn!(pid = done.pid, "cannot probe {}: {e}", done.path.display());
                        Inspection::Refused(e)
                    }
                },
                Err(why) => {
                    tracing::warn!(pid = done.pid, "not probing {}: {why}", done.path.display());
                    Inspection::Refused(why)
                }
            };
        }
    }

    fn observe(&mut self, window_ns: u64, start_ms: u64, end_ms: u64) {
        let window_ms = window_ns / 1_000_000;
        let mut pids: Vec<u32> = self.processes.keys().copied().collect();
        // Past the window's thread budget the remaining processes wait for a later window; the
        // starting point turns so that none waits for good.
        pids.sort_unstable();
        self.windows += 1;
        let turn = (self.windows % pids.len().max(1) as u64) as usize;
        pids.rotate_left(turn);
        let mut budget = MAX_THREADS_OBSERVED;
        let mut seen_tids = HashSet::new();
        for pid in pids {
            if budget == 0 {
                // Not looked at this window: its threads are kept as they are.
                seen_tids.extend(self.tasks.iter().filter(|(_, t)| t.pid == pid).map(|(tid, _)| *tid));
                continue;
            }
            let role = self.processes[&pid].role;
            let task_dir = self.config.proc_root.join(pid.to_string()).join("task");
            let tids: Vec<u32> = std::fs::read_dir(&task_dir)
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                        .take(MAX_THREADS_PER_PROCESS.min(budget))
                        .collect()
                })
                .unwrap_or_default();
            budget -= tids.len();
            let mut evidence = Evidence::default();
            // The longest any of its threads waited for a CPU this window.
            let mut most_runq_ns = 0;
            for &tid in &tids {
                seen_tids.insert(tid);
                let now_ns = ringside_bpf::monotonic_ns();
                let sched = self.probe.thread(tid);
                let blocked = sched.map(|s| s.blocked).unwrap_or_default();
                let mut counters = Counters::from_probe(
                    sched.map(|s| s.at(now_ns)).as_ref(),
                    self.probe.ml_thread(tid).map(|s| s.at(now_ns, blocked)).as_ref(),
                );
                // Bytes read, from the kernel's own per-thread I/O accounting.
                if !self.config.syscall_tracepoints {
                    counters.read_bytes = read_chars(&task_dir.join(tid.to_string()).join("io"));
                }
                let proc_root = &self.config.proc_root;
                let task = self.tasks.entry(tid).or_insert_with(|| Task {
                    pid,
                    start_time: thread_start_time(proc_root, pid, tid).unwrap_or(0),
                    comm: read_trimmed(task_dir.join(tid.to_string()).join("comm")).unwrap_or_default(),
                    before: None,
                    last: Counters::default(),
                    evidence: Evidence::default(),
                    phase: Hysteresis::default(),
                    phase_ms: PhaseValues::default(),
                    runq: VecDeque::new(),
                    last_decision: None,
                    window_ns,
                });
                // A thread seen for the first time has no window yet: its counters so far
                // cover its whole life.
                let Some(before) = task.before.replace(counters) else { continue };
                task.last = counters.since(&before);
                most_runq_ns = most_runq_ns.max(task.last.runq_ns);
                task.window_ns = window_ns;
                task.evidence = Evidence::of(&task.last, window_ns, role);
                evidence.add(&task.evidence);
                let changed = task.phase.step(&task.evidence, window_ns);
                *task.phase_ms.get_mut(task.phase.phase) += window_ms;
                *self.total_phase_ms.get_mut(task.phase.phase) += window_ms;
                if let Some(phase) = changed {
                    self.transitions += 1;
                    self.decide(tid, phase, end_ms);
                }
            }
            let process = self.processes.get_mut(&pid).expect("listed above");
            process.threads = tids.len() as u32;
            tracing::debug!(pid, ?evidence, phase = ?process.phase.phase, "window");
            if process.phase.step(&evidence, window_ns).is_some() {
                process.phase_since_ms = start_ms;
            }
            let phase = process.phase.phase;
            *process.phase_ms.get_mut(phase) += window_ms;
            let waiting_for_cpu = most_runq_ns as f64 >= window_ns as f64 * CPU_WAIT_SHARE;
            match process.timeline.back_mut() {
                Some(span)
                    if span.phase == phase
                        && span.waiting_for_cpu == waiting_for_cpu
                        && span.end_ms >= start_ms.saturating_sub(1) =>
                {
                    span.end_ms = end_ms
                }
                _ => process.timeline.push_back(PhaseSpan { phase, start_ms, end_ms, waiting_for_cpu }),
            }
            while process.timeline.len() > MAX_SPANS
                || process.timeline.front().is_some_and(|s| s.end_ms + TIMELINE_MS < end_ms)
            {
                process.timeline.pop_front();
            }
        }
        let exited: Vec<u32> = self.tasks.keys().copied().filter(|tid| !seen_tids.contains(tid)).collect();
        for tid in exited {
            self.tasks.remove(&tid);
            self.forget_task(tid);
        }
    }

    fn reason(task: &Task) -> String {
        let d = &task.last;
        let w = task.window_ns;
        format!(
            "over {} ms: cpu {:.0}%, read {:.0}%, sync {:.0}%, nccl {:.0}%, {:.0} launches/s",
            w / 1_000_000,
            share(d.on_cpu_ns + d.runq_ns, w) * 100.0,
            share(d.read_ns + d.iowait_ns, w) * 100.0,
            share(d.sync_ns + d.nv_ioctl_ns, w) * 100.0,
            share(d.nccl_ns, w) * 100.0,
            d.launches as f64 * 1e9 / w.max(1) as f64
        )
    }

    fn decide(&mut self, tid: u32, phase: Phase, at_ms: u64) {
        let Some(task) = self.tasks.get(&tid) else { return };
        let Some(process) = self.processes.get(&task.pid) else { return };
        let reason = format!("entered {}: {}", phase.as_str(), Self::reason(task));
        let mut decision = Decision {
            at_ms,
            pid: task.pid,
            tid,
            comm: task.comm.clone(),
            phase,
            action: String::new(),
            reason,
            applied: false,
            error: None,
            nice: 0,
            weight: policy::weight_of_nice(0),
            slice_us: 0,
            cpus: String::new(),
        };
        match self.config.policy.for_phase(phase) {
            Some(p) => {
                let cpus: Vec<usize> =
                    if p.cpus == CpuChoice::GpuNode { process.node_cpus.clone() } else { Vec::new() };
                decision.nice = p.nice;
                decision.weight = policy::weight_of_nice(p.nice);
                decision.slice_us = p.slice_us;
                decision.cpus = policy::format_cpu_list(&cpus);
                decision.action = format!("nice {}, {}", p.nice, p.sched_policy.as_str());
                match (&decision.cpus, process.numa_node) {
                    (c, Some(node)) if !c.is_empty() => decision.action += &format!(", cpus {c} (node {node})"),
                    _ => decision.action += ", any cpu",
                }
                // Observe mode is matched first: its processes are never admitted.
                match (self.backend, &self.scx, process.admission.as_ref().err()) {
                    (SchedulerBackend::Observe, ..) => {}
                    (_, _, Some(why)) => decision.error = Some(why.clone()),
                    (SchedulerBackend::Scx, Some(scheduler), None) => {
                        let class = match phase {
                            Phase::DataLoading | Phase::OptimizerStep => ScxClass::Latency,
                            Phase::GpuCompute => ScxClass::Feeder,
                            _ => ScxClass::Default,
                        };
                        let node = process.numa_node.filter(|_| !cpus.is_empty());
                        let scx_decision = ScxDecision {
                            weight: scx::scx_weight(decision.weight),
                            slice_us: p.slice_us,
                            node,
                            class,
                            phase: Phase::ALL.iter().position(|x| *x == phase).unwrap_or(0) as u32,
                        };
                        decision.action = format!(
                            "sched_ext weight {}, slice {} us, {} class, {}",
                            scx_decision.weight,
                            p.slice_us,
                            match class {
                                ScxClass::Latency => "latency",
                                ScxClass::Feeder => "feeder",
                                ScxClass::Default => "fair",
                            },
                            node.map(|n| format!("node {n}")).unwrap_or_else(|| "any node".into())
                        );
                        match scheduler.set(tid, &scx_decision) {
                            Ok(()) => decision.applied = true,
                            Err(e) => decision.error = Some(e.to_string()),
                        }
                    }
                    (SchedulerBackend::Setattr, _, None) => {
                        let thread = ThreadId { pid: task.pid, tid, start_time: task.start_time };
                        match self.enforcer.apply(
                            thread,
                            p.nice,
                            process.nice_floor,
                            p.sched_policy == SchedPolicy::Batch,
                            &cpus,
                        ) {
                            Ok(nice) => {
                                decision.applied = true;
                                if nice != p.nice {
                                    decision.action +=
                                        &format!(" (nice {nice}: the process may not go below it itself)");
                                    decision.nice = nice;
                                    decision.weight = policy::weight_of_nice(nice);
                                }
                            }
                            Err(e) => decision.error = Some(e),
                        }
                    }
                    _ => {}
                }
            }
            None => {
                // Back to unknown: undo what an earlier decision did, if anything.
                if task.last_decision.is_none() {
                    return;
                }
                decision.action = "restore own settings".into();
                match (self.backend, &self.scx) {
                    (SchedulerBackend::Scx, Some(scheduler)) => decision.applied = scheduler.clear(tid),
                    (SchedulerBackend::Setattr, _) => match self.enforcer.restore(tid) {
                        Ok(restored) => decision.applied = restored,
                        Err(e) => decision.error = Some(e),
                    },
                    _ => {}
                }
            }
        }
        self.decisions_made += 1;
        let summary = format!("{} ({})", decision.action, if decision.applied { "applied" } else { "observed" });
        if let Some(task) = self.tasks.get_mut(&tid) {
            task.last_decision = Some(summary);
        }
        if self.decisions.len() == SchedulerTelemetry::MAX_DECISIONS {
            self.decisions.pop_back();
        }
        self.decisions.push_front(decision);
    }

    fn forget_task(&mut self, tid: u32) {
        self.enforcer.forget(tid);
        if let Some(scheduler) = &self.scx {
            scheduler.clear(tid);
        }
    }

    /// Notices when the kernel has stopped the sched_ext scheduler (watchdog, error, sysrq):
    /// records why, falls back to setattr and carries out the phases in force that way.
    fn check_scx(&mut self) {
        let Some(scheduler) = &self.scx else { return };
        let Some(exit) = scheduler.exit() else { return };
        let at_ms = crate::clock::now_ms();
        let info = ScxExitInfo {
            at_ms,
            kind: exit_kind_name(exit.kind).into(),
            reason: exit.reason.clone(),
            message: exit.message.clone(),
            ejected: exit.is_ejection(),
        };
        tracing::error!(kind = %info.kind, reason = %info.reason, message = %info.message,
            "the kernel stopped the sched_ext scheduler; falling back to setattr");
        let counters = self.scx_counters();
        if let Some(mut scheduler) = self.scx.take() {
            scheduler.unregister();
        }
        let status = self.scx_status.get_or_insert_with(ScxStatus::default);
        status.running = false;
        status.counters = counters;
        status.error = Some(format!("stopped by the kernel ({}): {}", info.kind, info.reason));
        status.exit = Some(info);
        self.backend = SchedulerBackend::Setattr;
        let in_force: Vec<(u32, Phase)> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.phase.phase != Phase::Unknown)
            .map(|(tid, t)| (*tid, t.phase.phase))
            .collect();
        for (tid, phase) in in_force {
            self.decide(tid, phase, at_ms);
        }
    }

    fn scx_counters(&self) -> ScxCounters {
        let Some(scheduler) = &self.scx else {
            return self.scx_status.as_ref().map(|s| s.counters.clone()).unwrap_or_default();
        };
        let c = scheduler.counters();
        ScxCounters {
            enqueued: c.enqueued,
            decided: c.decided,
            direct: c.direct,
            dispatched: c.dispatched,
            stolen: c.stolen,
            preempted: c.preempted,
            continued: c.continued,
            latency_runs: c.latency_runs,
            feeder_runs: c.feeder_runs,
            fallbacks: c.fallbacks,
        }
    }

    fn scx_status(&self) -> Option<ScxStatus> {
        let mut status = self.scx_status.clone()?;
        status.state = scx::state().unwrap_or_else(|_| "unavailable".into());
        status.ops = scx::ops_name();
        if let Some(scheduler) = &self.scx {
            status.running = status.ops.as_deref() == Some(scx::OPS_NAME) && status.state == "enabled";
            status.decided_threads = scheduler.decided() as u64;
            status.counters = self.scx_counters();
        }
        Some(status)
    }

    fn publish(&mut self) {
        let mut distribution = PhaseValues::<u64>::default();
        for task in self.tasks.values() {
            *distribution.get_mut(task.phase.phase) += 1;
        }
        let total: u64 = Phase::ALL.iter().map(|p| self.total_phase_ms.get(*p)).sum();
        let mut phase_time_pct = PhaseValues::<f64>::default();
        for phase in Phase::ALL {
            if total > 0 {
                *phase_time_pct.get_mut(phase) = self.total_phase_ms.get(phase) as f64 * 100.0 / total as f64;
            }
        }
        let mut tasks: Vec<(&u32, &Task)> = self.tasks.iter().collect();
        tasks.sort_by_key(|(tid, t)| {
            (std::cmp::Reverse(t.last.on_cpu_ns + t.last.read_ns + t.last.sync_ns + t.last.nccl_ns), **tid)
        });
        let tasks: Vec<MlTaskInfo> = tasks
            .into_iter()
            .take(SchedulerTelemetry::MAX_TASKS)
            .map(|(tid, t)| {
                let mut samples: Vec<u64> = t.runq.iter().copied().collect();
                samples.sort_unstable();
                let pick =
                    |q: f64| (!samples.is_empty()).then(|| samples[((samples.len() - 1) as f64 * q).round() as usize]);
                let w = t.window_ns;
                let d = &t.last;
                let features = [
                    ("cpu", share(d.on_cpu_ns + d.runq_ns, w)),
                    ("read", share(d.read_ns, w)),
                    ("iowait", share(d.iowait_ns, w)),
                    ("futex", share(d.futex_ns, w)),
                    ("sync", share(d.sync_ns, w)),
                    ("nccl", share(d.nccl_ns, w)),
                    ("ioctl", share(d.nv_ioctl_ns, w)),
                    ("launches_per_s", d.launches as f64 * 1e9 / w.max(1) as f64),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), (v * 1000.0).round() / 1000.0))
                .collect();
                MlTaskInfo {
                    pid: t.pid,
                    tid: *tid,
                    comm: t.comm.clone(),
                    phase: t.phase.phase,
                    phase_ms: t.phase_ms.clone(),
                    on_cpu_pct: (share(d.on_cpu_ns, w) * 1000.0).round() / 10.0,
                    runq_p50_ns: pick(0.5),
                    runq_p99_ns: pick(0.99),
                    features,
                    last_decision: t.last_decision.clone(),
                }
            })
            .collect();
        const TEXT: usize = SchedulerTelemetry::MAX_TEXT;
        // The busiest processes (on-CPU time of their threads in the latest window) are listed,
        // and the timeline spans are shared out among them: both travel in every update.
        let mut activity: HashMap<u32, u64> = HashMap::new();
        for task in self.tasks.values() {
            *activity.entry(task.pid).or_default() += task.last.on_cpu_ns;
        }
        let mut ranked: Vec<(&u32, &Process)> = self.processes.iter().collect();
        ranked.sort_by_key(|(pid, _)| (std::cmp::Reverse(activity.get(pid).copied().unwrap_or(0)), **pid));
        ranked.truncate(SchedulerTelemetry::MAX_PROCESSES);
        let spans_each = (SchedulerTelemetry::MAX_SPANS / ranked.len().max(1)).min(MAX_SPANS);
        let mut processes: Vec<MlProcessInfo> = ranked
            .into_iter()
            .map(|(pid, p)| MlProcessInfo {
                pid: *pid,
                job: p.job,
                comm: p.comm.clone(),
                role: p.role,
                reason: clip(&p.reason, TEXT),
                phase: p.phase.phase,
                phase_since_ms: p.phase_since_ms,
                threads: p.threads,
                gpus: p.gpus.clone(),
                numa_node: p.numa_node,
                probed_libraries: self
                    .probe
                    .probed_libraries(*pid)
                    .iter()
                    .map(|l| clip(&l.file_name().unwrap_or_default().to_string_lossy(), TEXT))
                    .collect(),
                libraries: p
                    .libraries
                    .iter()
                    .map(|l| {
                        let (state, detail) = match &l.state {
                            Inspection::Pending => (LibraryState::Pending, String::new()),
                            Inspection::Probed(n) => (LibraryState::Probed, format!("{n} entry points probed")),
                            Inspection::Refused(why) => (LibraryState::Refused, why.clone()),
                        };
                        LibraryStatus {
                            path: clip(&l.path.to_string_lossy(), TEXT),
                            state,
                            detail: clip(&detail, TEXT),
                        }
                    })
                    .collect(),
                uid: p.uid,
                admitted: p.admission.is_ok(),
                admission: match &p.admission {
                    Ok(why) | Err(why) => clip(why, TEXT),
                },
                phase_ms: p.phase_ms.clone(),
                timeline: p.timeline.iter().skip(p.timeline.len().saturating_sub(spans_each)).cloned().collect(),
            })
            .collect();
        processes.sort_by_key(|p| (p.job, p.pid));
        let processes_not_shown = (self.processes.len() - processes.len()) as u64;
        let programs: Vec<ProbeProgram> = self
            .probe
            .programs()
            .into_iter()
            .map(|p| ProbeProgram {
                name: p.name,
                attach: p.attach,
                state: match p.state {
                    AttachState::Attached => ProgramState::Attached,
                    AttachState::Fallback => ProgramState::Fallback,
                    AttachState::Failed => ProgramState::Failed,
                },
                detail: p.detail,
            })
            .collect();
        let failed: Vec<String> =
            programs.iter().filter(|p| p.state == ProgramState::Failed).map(|p| p.name.clone()).collect();
        let lost = self.probe.lost();
        let telemetry = SchedulerTelemetry {
            total_tracked_tasks: self.thread_count as u64,
            ml_tasks: self.tasks.len() as u64,
            decisions_made: self.decisions_made,
            phase_transitions: self.transitions,
            phase_distribution: distribution,
            phase_time_pct,
            numa_nodes: 0,
            total_cpus: 0,
            mode: if self.backend == SchedulerBackend::Observe {
                SchedulerMode::Observe
            } else {
                SchedulerMode::Enforce
            },
            window_ms: self.config.window.as_millis() as u64,
            attach_mode: Some(self.probe.mode().as_str().into()),
            programs,
            processes,
            processes_not_shown,
            processes_not_tracked: self.not_tracked,
            refused_evidence: self
                .detector
                .refused()
                .map(|r| RefusedEvidence { path: clip(&r.path, TEXT), why: clip(&r.why, TEXT), ..r.clone() })
                .collect(),
            enforcement_inactive: (self.backend != SchedulerBackend::Observe && self.config.admission.is_empty()).then(
                || {
                    "enforce mode admits no process: list users, groups or cgroups under [scheduler.enforce]"
                        .to_string()
                },
            ),
            tasks,
            decisions: self.decisions.iter().cloned().collect(),
            lost: ProbeLosses {
                events: lost.events,
                runq_samples: lost.runq_samples,
                threads: lost.threads,
                ml_threads: lost.ml_threads,
                skipped_runs: self.skipped_runs,
            },
            backend: self.backend,
            scx: self.scx_status(),
        };
        let mut problems: Vec<String> = Vec::new();
        if !failed.is_empty() {
            problems.push(format!(
                "some probes did not attach ({}): their signals are missing from phase detection",
                failed.join(", ")
            ));
        }
        problems.extend(telemetry.enforcement_inactive.clone());
        problems.extend(self.libraries.stopped().map(|why| format!("{why}: CUDA/NCCL calls are no longer probed")));
        problems.extend(
            self.detector.stopped().map(|why| format!("{why}: mapped libraries no longer count as ML evidence")),
        );
        if self.not_tracked > 0 {
            problems.push(format!(
                "{} ML processes beyond [scheduler] max_processes = {} are not tracked",
                self.not_tracked, self.config.max_processes
            ));
        }
        let degraded = (!problems.is_empty()).then(|| problems.join("; "));
        if let Ok(mut published) = self.published.lock() {
            published.telemetry = Some(telemetry);
            published.degraded = degraded;
            published.published_at = Some(Instant::now());
        }
        self.runq.publish(&mut self.window_runq);
    }
}
