//! The scheduler's own thread: every window it reads the BPF counters of the threads of ML
//! processes, detects their phases, decides and (in `enforce` mode) applies; every scan
//! interval it looks for new ML processes, tracks them in BPF and probes their CUDA/NCCL
//! libraries. What it knows is published for the metrics source to read at each tick.
//!
//! In parts: [`discovery`] (which processes are ML work, whom enforcement may change, which
//! libraries to probe), [`accounting`] (each thread's window: counters to evidence to phase),
//! [`decisions`] (a phase change to a decision, carried out by the [`Enforcement`]) and
//! [`publish`] (the telemetry the metrics source reads). The probe is a [`Probe`]: the
//! observer's unit tests feed it recorded windows, without BPF or root.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringside_shared::{Decision, PhaseSpan, PhaseValues, ProcessRole, SchedulerTelemetry, StepTimes};

use crate::pipeline::{Feed, ThreadEvent};

use super::enforcement::Enforcement;
use super::jobs::{RecentPhases, Steps};
use super::library::{LibraryInspector, Limits};
use super::ml::{MlDetector, DEFAULT_LIBRARIES};
use super::phase::{Counters, Evidence, Hysteresis};
use super::policy::PolicyTable;
use super::probe::Probe;
use super::trust::Admission;

mod accounting;
mod decisions;
mod discovery;
mod publish;
#[cfg(test)]
mod tests;

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
/// Thread events kept until the metrics source takes them (at every tick): beyond, the oldest
/// are given up and counted.
pub const MAX_THREAD_EVENTS: usize = 65_536;

#[derive(Debug, Clone)]
pub struct ObserverConfig {
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
    /// Whose jobs may raise job alerts.
    pub paging: super::trust::Paging,
    /// Which processes are looked at.
    pub watch: super::trust::Watch,
    /// The recent window of each job's phase shares and step times.
    pub job_window: Duration,
    /// Which library calls are probed.
    pub probes: ringside_bpf::Probes,
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
    /// Tracked threads' phase changes not yet taken (at most [`MAX_THREAD_EVENTS`]), and how
    /// many were given up.
    pub thread_events: Vec<ThreadEvent>,
    pub thread_events_lost: u64,
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
    Probed(ringside_bpf::Attached),
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
    /// Whether its job alerts may page (`Ok`) or not (`Err`), and why.
    pages: Result<String, String>,
    /// The lowest nice value its threads may be given.
    nice_floor: i32,
    libraries: Vec<Library>,
    /// Where the GPU driver's and runtime's code is mapped in it, as last given to the probe.
    gpu_text: Vec<(u64, u64)>,
    /// The order it was tracked in (the newest gives up its slot first when slots are shared).
    tracked_seq: u64,
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
    /// Its command line, clipped.
    cmdline: String,
    /// Its job across nodes and its rank, read once when it is first tracked.
    identity: crate::sched::identity::JobIdentity,
    /// Since when (wall ms) its longest-waiting thread has been in a collective, and when one
    /// of its collectives last returned.
    collective_waiting_since_ms: Option<u64>,
    collective_returned_ms: Option<u64>,
    /// NCCL calls its threads made; the time one of its threads was inside one (the longest
    /// in each window, from the probe's exact call times); and the run-queue wait of its
    /// longest-waiting thread: each summed over windows (per-rank metrics).
    collective_calls: u64,
    collective_ns: u64,
    cpu_wait_ns: u64,
    /// Its phase time over the recent window, and its steps.
    recent: RecentPhases,
    steps: Steps,
    /// Its step times as last computed, and the second they were (recomputed once a second).
    step_times: Option<(u64, Option<StepTimes>)>,
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
    /// Since when (monotonic ns) it has been inside a collective, as of the latest window.
    collective_since_ns: Option<u64>,
    /// Whether it fed the GPU in the latest window (`phase::feeding`).
    feeding: bool,
}

pub struct Observer {
    probe: Box<dyn Probe>,
    detector: MlDetector,
    /// Ranks whose process ended lately ([`SchedulerTelemetry::exited_ranks`]).
    exited_ranks: VecDeque<ringside_shared::ExitedRank>,
    config: ObserverConfig,
    processes: HashMap<u32, Process>,
    tasks: HashMap<u32, Task>,
    /// Carries decisions out (or, in `observe`, does not).
    enforcement: Box<dyn Enforcement>,
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
    /// Windows observed, and scans made.
    windows: u64,
    scans: u64,
    /// Processes tracked so far (each one's `tracked_seq`), and slots given up for a fair share.
    tracked_seq: u64,
    slots_shared: u64,
    /// Where the current window started (wall ms).
    window_start_ms: u64,
    /// Tracked threads' phase changes made this window, published with it.
    thread_events: Vec<ThreadEvent>,
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

impl Observer {
    pub fn new(
        probe: Box<dyn Probe>,
        config: ObserverConfig,
        enforcement: Box<dyn Enforcement>,
        published: Arc<Mutex<Published>>,
        runq: Feed<u64>,
    ) -> Observer {
        let libraries = DEFAULT_LIBRARIES.iter().map(|s| s.to_string()).collect();
        Observer {
            probe,
            exited_ranks: VecDeque::new(),
            detector: MlDetector::new(libraries, config.ml_patterns.clone())
                .with_proc_root(&config.proc_root)
                .watching(config.watch.clone()),
            libraries: LibraryInspector::new(config.proc_root.clone(), config.libraries, config.probes),
            not_tracked: 0,
            windows: 0,
            scans: 0,
            tracked_seq: 0,
            slots_shared: 0,
            window_start_ms: 0,
            thread_events: Vec::new(),
            config,
            processes: HashMap::new(),
            tasks: HashMap::new(),
            enforcement,
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
        let restored = self.enforcement.stop();
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
        if self.windows == 0 {
            // A new observer (the daemon's start, or after one panicked): threads an earlier
            // one reported are not observed any more until seen again.
            self.thread_events.push(ThreadEvent::AllGone { at_ms: start_ms });
        }
        self.window_start_ms = start_ms;
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
        self.publish(end_ms);
    }
}
