//! The scheduler as a metrics source. At start it loads the BPF probe and hands it to the
//! [`Observer`] thread, which detects phases every window and decides; each collection tick
//! reads what the observer published. Without BPF privileges the source is degraded with the
//! reason, and the daemon serves the rest. When the source is dropped (daemon stop) the
//! observer restores every thread it changed.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringside_bpf::{AttachMode, SchedProbe};
use ringside_shared::SchedulerTelemetry;

use super::observer::{Backend, Observer, ObserverConfig, Published};
use super::policy::PolicyTable;
use crate::pipeline::{MetricsSource, Sample, SourceError, SourceStatus};
use ringside_bpf::scx::{self, ScxScheduler};

/// `[scheduler]` in the config.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    /// Load the BPF probe and report scheduler telemetry.
    pub enabled: bool,
    /// Command-line substrings that mark a process as ML work (besides the libraries it maps).
    pub ml_patterns: Vec<String>,
    /// `observe` (decide and record) or `enforce` (also apply, with the `auto` backend). Kept
    /// for older configs: `backend` says more.
    pub mode: String,
    /// What carries out decisions: `observe` (nothing), `setattr` (nice, policy and affinity of
    /// each thread), `scx` (Ringside's sched_ext scheduler) or `auto` (scx where the kernel has
    /// sched_ext, else setattr). Unset: `observe`, or `auto` with `mode = "enforce"`.
    /// `--sched-backend` overrides it.
    pub backend: Option<String>,
    /// The phase detector's window.
    pub window_ms: u64,
    /// How often to look for new ML processes and libraries.
    pub scan_interval_ms: u64,
    /// Count every futex/read/ioctl call of ML processes with the syscall tracepoints, rather
    /// than the waits they block in. Exact, but it slows every syscall of every task on the node.
    pub syscall_tracepoints: bool,
    pub policy: PolicyTable,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            enabled: true,
            ml_patterns: Vec::new(),
            mode: "observe".into(),
            backend: None,
            window_ms: 100,
            scan_interval_ms: 1000,
            syscall_tracepoints: false,
            policy: PolicyTable::default(),
        }
    }
}

pub const BACKENDS: [&str; 4] = ["auto", "scx", "setattr", "observe"];

impl SchedulerConfig {
    /// The backend asked for: `backend`, else what `mode` implies.
    pub fn backend(&self) -> &str {
        match &self.backend {
            Some(b) => b,
            None if self.mode == "enforce" => "auto",
            None => "observe",
        }
    }

    /// The backend to use on this kernel, and whether the sched_ext scheduler is to be loaded.
    fn resolve(&self) -> (Backend, bool) {
        match self.backend() {
            "scx" => (Backend::Scx, true),
            "setattr" => (Backend::Setattr, false),
            "auto" if scx::available().is_ok() => (Backend::Scx, true),
            "auto" => (Backend::Setattr, false),
            _ => (Backend::Observe, false),
        }
    }

    pub fn check(&self) -> Result<(), String> {
        if !["observe", "enforce"].contains(&self.mode.as_str()) {
            return Err(format!("[scheduler] mode = {:?} must be \"observe\" or \"enforce\"", self.mode));
        }
        if let Some(backend) = &self.backend {
            if !BACKENDS.contains(&backend.as_str()) {
                return Err(format!("[scheduler] backend = {backend:?} must be one of auto, scx, setattr, observe"));
            }
        }
        if !(20..=10_000).contains(&self.window_ms) {
            return Err(format!("[scheduler] window_ms = {} must be from 20 to 10000", self.window_ms));
        }
        if !(100..=600_000).contains(&self.scan_interval_ms) {
            return Err(format!("[scheduler] scan_interval_ms = {} must be from 100 to 600000", self.scan_interval_ms));
        }
        self.policy.check()
    }
}

pub struct SchedulerSource {
    running: Result<Running, String>,
    numa_nodes: u32,
    total_cpus: u32,
}

struct Running {
    published: Arc<Mutex<Published>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SchedulerSource {
    /// Loads the probe and starts the observer; a failure is kept and reported on every tick,
    /// not fatal.
    pub fn start(config: &SchedulerConfig, numa_nodes: u32, total_cpus: u32) -> SchedulerSource {
        let probe = SchedProbe::load_with_options(&AttachMode::ALL, config.syscall_tracepoints);
        let (backend, load_scx) = config.resolve();
        let running = probe.map_err(|e| e.to_string()).and_then(|probe| {
            let scx = load_scx.then(|| {
                let loaded = ScxScheduler::load(std::path::Path::new("/sys")).map_err(|e| e.to_string());
                match &loaded {
                    Ok(s) => tracing::info!(nodes = s.nodes(), "sched_ext scheduler {} registered", scx::OPS_NAME),
                    Err(why) => tracing::warn!("{why}; carrying out decisions with setattr"),
                }
                loaded
            });
            let observer_config = ObserverConfig {
                backend,
                window: Duration::from_millis(config.window_ms),
                scan_interval: Duration::from_millis(config.scan_interval_ms),
                policy: config.policy.clone(),
                ml_patterns: config.ml_patterns.clone(),
                syscall_tracepoints: config.syscall_tracepoints,
                proc_root: PathBuf::from("/proc"),
                sys_root: PathBuf::from("/sys"),
            };
            let published = Arc::new(Mutex::new(Published::default()));
            let stop = Arc::new(AtomicBool::new(false));
            let observer = Observer::new(probe, observer_config, scx, published.clone());
            let thread_stop = stop.clone();
            let thread = std::thread::Builder::new()
                .name("sched-observer".into())
                .spawn(move || observer.run(thread_stop))
                .map_err(|e| format!("cannot start the observer thread: {e}"))?;
            Ok(Running { published, stop, thread: Some(thread) })
        });
        if let Err(why) = &running {
            tracing::warn!("scheduler unavailable: {why}");
        }
        SchedulerSource { running, numa_nodes, total_cpus }
    }
}

impl Drop for SchedulerSource {
    fn drop(&mut self) {
        if let Ok(running) = &mut self.running {
            running.stop.store(true, Ordering::Relaxed);
            if let Some(thread) = running.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

impl MetricsSource for SchedulerSource {
    fn name(&self) -> &str {
        "scheduler"
    }

    fn collect(&mut self, sample: &mut Sample) -> Result<SourceStatus, SourceError> {
        // Unavailable is a standing state of this node, not a failing collection: say why in
        // the component's health rather than raise an alert every start.
        let running = match &self.running {
            Ok(running) => running,
            Err(why) => return Ok(SourceStatus::Degraded(format!("scheduler unavailable: {why}"))),
        };
        if running.thread.as_ref().is_some_and(|t| t.is_finished()) {
            return Err(SourceError("the scheduler's observer thread stopped".into()));
        }
        let mut published = running.published.lock().map_err(|_| SourceError("observer state poisoned".into()))?;
        // Samples stay with the observer until its first window is published with them.
        if published.telemetry.is_some() {
            sample.runq_latency_ns = std::mem::take(&mut published.runq_latency_ns);
        }
        let Some(telemetry) = &published.telemetry else {
            return Ok(SourceStatus::Degraded("starting: no window observed yet".into()));
        };
        sample.scheduler =
            Some(SchedulerTelemetry { numa_nodes: self.numa_nodes, total_cpus: self.total_cpus, ..telemetry.clone() });
        let scx_error = telemetry.scx.as_ref().and_then(|s| s.error.as_deref());
        Ok(match (&published.degraded, scx_error) {
            (Some(why), _) => SourceStatus::Degraded(why.clone()),
            (None, Some(why)) => SourceStatus::Degraded(format!("{why}; decisions carried out with setattr")),
            (None, None) => SourceStatus::Up,
        })
    }
}
