//! The scheduler as a metrics source. At start it loads the BPF probe and hands it to the
//! [`Observer`] thread, which detects phases every window and decides; each collection tick
//! reads what the observer published. Without BPF privileges the source is degraded with the
//! reason, and the daemon serves the rest. When the source is dropped (daemon stop) the
//! observer restores every thread it changed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringside_bpf::{AttachMode, Probes, SchedProbe};
use ringside_shared::{SchedulerBackend, SchedulerMode, SchedulerTelemetry};

use super::enforcement;
use super::journal::Journal;
use super::library::Limits;
use super::observer::{Observer, ObserverConfig, Published, RUNQ_PENDING};
use super::policy::{restore_leftovers, Enforcer, PolicyTable};
use super::trust::{Admission, AdmissionConfig, AlertingConfig, Paging, Watch, WatchConfig};
use crate::invalid::Invalid;
use crate::pipeline::{Feed, MetricsSource, Sample, SourceError, SourceStatus};
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
    pub mode: SchedulerMode,
    /// What carries out decisions. Unset: `observe`, or `auto` with `mode = "enforce"`.
    /// `--sched-backend` overrides it.
    pub backend: Option<BackendChoice>,
    /// The phase detector's window.
    pub window_ms: u64,
    /// How often to look for new ML processes and libraries.
    pub scan_interval_ms: u64,
    /// Count every futex/read/ioctl call of ML processes with the syscall tracepoints, rather
    /// than the waits they block in. Exact, but it slows every syscall of every task on the node.
    pub syscall_tracepoints: bool,
    /// Count every kernel launch with a uprobe on each launch entry point of the driver. Off by
    /// default: every launch then traps into the kernel (about 15 µs on a VM), which slows a
    /// launch-bound job; without it a thread feeding the GPU is told by where its CPU time
    /// goes (the driver's code, sampled at timer ticks).
    pub launch_probes: bool,
    pub policy: PolicyTable,
    /// ML processes tracked at most (the first found, main processes and the busiest first);
    /// the rest are counted and reported, not tracked.
    pub max_processes: usize,
    /// Larger CUDA/NCCL library files are not read (nor probed).
    pub max_library_bytes: u64,
    /// `[scheduler.enforce]`: whose processes `enforce` may change.
    pub enforce: AdmissionConfig,
    /// `[scheduler.alerting]`: whose jobs may page (without it: the scope of `enforce`).
    pub alerting: Option<AlertingConfig>,
    /// `[scheduler.watch]`: which processes are looked at (empty: all).
    pub watch: WatchConfig,
    /// The recent window of each ML job's phase shares and step times (the input-bound and
    /// step-time alerts read them), in seconds.
    pub job_window_s: u64,
}

/// One library file's inspection may take this long before it is abandoned.
const LIBRARY_TIMEOUT: Duration = super::offthread::FILE_TIMEOUT;
/// How long a stopping daemon waits for the observer before restoring from the journal itself.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(3);
/// The journal of enforced threads' own settings, in the data dir.
pub const JOURNAL_FILE: &str = "enforce.journal";

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            enabled: true,
            ml_patterns: Vec::new(),
            mode: SchedulerMode::Observe,
            backend: None,
            window_ms: 100,
            scan_interval_ms: 1000,
            syscall_tracepoints: false,
            launch_probes: false,
            policy: PolicyTable::default(),
            max_processes: 256,
            max_library_bytes: 2 << 30,
            enforce: AdmissionConfig::default(),
            alerting: None,
            watch: WatchConfig::default(),
            job_window_s: 300,
        }
    }
}

/// `[scheduler] backend` and `--sched-backend`: what is asked to carry out decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum BackendChoice {
    /// scx where the kernel has sched_ext, else setattr.
    Auto,
    /// Ringside's sched_ext scheduler.
    Scx,
    /// Nice value, policy and affinity of each thread.
    Setattr,
    /// Nothing: decisions are recorded only.
    Observe,
}

impl SchedulerConfig {
    /// The backend asked for: `backend`, else what `mode` implies.
    pub fn backend(&self) -> BackendChoice {
        match (self.backend, self.mode) {
            (Some(b), _) => b,
            (None, SchedulerMode::Enforce) => BackendChoice::Auto,
            (None, SchedulerMode::Observe) => BackendChoice::Observe,
        }
    }

    /// The backend to use on this kernel, and whether the sched_ext scheduler is to be loaded.
    fn resolve(&self) -> (SchedulerBackend, bool) {
        match self.backend() {
            BackendChoice::Scx => (SchedulerBackend::Scx, true),
            BackendChoice::Setattr => (SchedulerBackend::Setattr, false),
            BackendChoice::Auto if scx::available().is_ok() => (SchedulerBackend::Scx, true),
            BackendChoice::Auto => (SchedulerBackend::Setattr, false),
            BackendChoice::Observe => (SchedulerBackend::Observe, false),
        }
    }

    pub fn check(&self) -> Result<(), Invalid> {
        Invalid::range("scheduler.window_ms", self.window_ms, 20, 10_000)?;
        Invalid::range("scheduler.scan_interval_ms", self.scan_interval_ms, 100, 600_000)?;
        Invalid::range("scheduler.max_processes", self.max_processes, 1, 65_536)?;
        Invalid::range("scheduler.max_library_bytes", self.max_library_bytes, 1 << 20, 64 << 30)?;
        Invalid::range("scheduler.job_window_s", self.job_window_s, 5, super::jobs::MAX_WINDOW_S)?;
        Admission::resolve(&self.enforce)?;
        Paging::resolve(self.alerting.as_ref(), &self.enforce)?;
        Watch::resolve(&self.watch)?;
        self.policy.check()
    }
}

pub struct SchedulerSource {
    running: Result<Running, String>,
    numa_nodes: u32,
    total_cpus: u32,
    /// Why enforcement is off although the config asks for it.
    enforcement_off: Option<String>,
    /// Starts the observer again after it panicked (the probe loaded afresh, the journal's
    /// leftovers restored first), feeding the same run-queue feed.
    relaunch: Option<Relaunch>,
    restart: Restart,
}

/// What starting the observer gives: it running, or why not; and why enforcement is off.
type Launched = (Result<Running, String>, Option<String>);
type Relaunch = Box<dyn FnMut(Feed<u64>) -> Launched + Send>;

/// The first wait before an observer that panicked is started again; it doubles up to the
/// last, and starts over once an observer has run for [`HEALTHY_FOR`].
const FIRST_RESTART: Duration = Duration::from_secs(1);
const LAST_RESTART: Duration = Duration::from_secs(60);
const HEALTHY_FOR: Duration = Duration::from_secs(300);

/// The observer's supervision: when it is to be started again, and why it stopped.
struct Restart {
    at: Option<Instant>,
    why: String,
    backoff: Duration,
    restarts: u32,
}

impl Default for Restart {
    fn default() -> Self {
        Restart { at: None, why: String::new(), backoff: FIRST_RESTART, restarts: 0 }
    }
}

struct Running {
    published: Arc<Mutex<Published>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    started: Instant,
    /// No window published for this long: the observer is stuck.
    stall_after: Duration,
    journal: PathBuf,
    /// The run-queue latencies the observer samples, for a `stats` kernel.
    runq: Feed<u64>,
}

/// Puts back what an earlier run left changed (it was killed before it could) and empties the
/// journal; `Err` if the journal cannot be used, and then nothing may be enforced.
pub fn recover(path: &Path) -> Result<Journal, String> {
    let (mut journal, leftovers) =
        Journal::open(path).map_err(|e| format!("cannot open the enforcement journal {}: {e}", path.display()))?;
    if !leftovers.is_empty() {
        let (restored, skipped) = restore_leftovers(Path::new("/proc"), &leftovers);
        tracing::warn!(
            restored,
            skipped,
            "an earlier run was stopped with threads changed: restored their own settings (threads that are gone or whose id was reused are left alone)"
        );
    }
    journal.clear().map_err(|e| format!("cannot write the enforcement journal {}: {e}", path.display()))?;
    Ok(journal)
}

impl SchedulerSource {
    /// Loads the probe and starts the observer; a failure is kept and reported on every tick,
    /// not fatal.
    /// `data_dir` holds the enforcement journal: what it holds from an earlier run is put back
    /// first, whatever this run's mode.
    pub fn start(config: &SchedulerConfig, numa_nodes: u32, total_cpus: u32, data_dir: &Path) -> SchedulerSource {
        let (config, data_dir) = (config.clone(), data_dir.to_path_buf());
        let mut relaunch: Relaunch = Box::new(move |runq| Self::launch(&config, &data_dir, runq));
        let (running, enforcement_off) = relaunch(Feed::new(RUNQ_PENDING));
        SchedulerSource {
            running,
            numa_nodes,
            total_cpus,
            enforcement_off,
            relaunch: Some(relaunch),
            restart: Restart::default(),
        }
    }

    /// Loads the probe and starts the observer thread, publishing run-queue samples into
    /// `runq`.
    fn launch(config: &SchedulerConfig, data_dir: &Path, runq: Feed<u64>) -> Launched {
        let journal_path = data_dir.join(JOURNAL_FILE);
        let journal = recover(&journal_path);
        let probes = Probes { launches: config.launch_probes };
        let probe = SchedProbe::load_with_probes(&AttachMode::ALL, config.syscall_tracepoints, probes);
        let (mut backend, mut load_scx) = config.resolve();
        let mut enforcement_off = None;
        let journal = match journal {
            Ok(journal) => Some(journal),
            Err(why) if backend != SchedulerBackend::Observe => {
                tracing::error!("{why}: enforcement is off");
                enforcement_off = Some(format!("{why}: enforcement is off"));
                (backend, load_scx) = (SchedulerBackend::Observe, false);
                None
            }
            Err(why) => {
                tracing::warn!("{why}");
                None
            }
        };
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
                window: Duration::from_millis(config.window_ms),
                scan_interval: Duration::from_millis(config.scan_interval_ms),
                policy: config.policy.clone(),
                ml_patterns: config.ml_patterns.clone(),
                syscall_tracepoints: config.syscall_tracepoints,
                proc_root: PathBuf::from("/proc"),
                sys_root: PathBuf::from("/sys"),
                max_processes: config.max_processes,
                libraries: Limits { max_bytes: config.max_library_bytes, timeout: LIBRARY_TIMEOUT },
                admission: Admission::resolve(&config.enforce).map_err(|e| e.to_string())?,
                paging: Paging::resolve(config.alerting.as_ref(), &config.enforce).map_err(|e| e.to_string())?,
                watch: Watch::resolve(&config.watch).map_err(|e| e.to_string())?,
                job_window: Duration::from_secs(config.job_window_s),
                probes,
            };
            let published = Arc::new(Mutex::new(Published::default()));
            let stop = Arc::new(AtomicBool::new(false));
            let enforcer = Enforcer::new(PathBuf::from("/proc"), journal);
            let enforcement = enforcement::for_backend(backend, scx, enforcer);
            let observer =
                Observer::new(Box::new(probe), observer_config, enforcement, published.clone(), runq.clone());
            let thread_stop = stop.clone();
            let thread = std::thread::Builder::new()
                .name("sched-observer".into())
                .spawn(move || observer.run(thread_stop))
                .map_err(|e| format!("cannot start the observer thread: {e}"))?;
            // A window overdue by three (and at least a second: one collection tick) means the
            // observer is stuck.
            let stall_after = (Duration::from_millis(config.window_ms) * 3).max(Duration::from_secs(1));
            Ok(Running {
                published,
                stop,
                thread: Some(thread),
                started: Instant::now(),
                stall_after,
                journal: journal_path,
                runq,
            })
        });
        if let Err(why) = &running {
            tracing::warn!("scheduler unavailable: {why}");
        }
        (running, enforcement_off)
    }
}

impl SchedulerSource {
    /// The run-queue latencies (ns) of tracked threads, as the observer samples them; `None`
    /// when the scheduler does not run.
    pub fn runq_feed(&self) -> Option<Feed<u64>> {
        self.running.as_ref().ok().map(|r| r.runq.clone())
    }

    /// An observer thread that ended (a panic: it is only asked to stop at the daemon's stop)
    /// is reported down with why, and started again after a backoff (1 s, doubling to 60 s;
    /// back to 1 s once one has run for 5 minutes). Its threads' own settings were put back as
    /// it unwound, and the new one starts from the journal like a daemon start.
    fn supervise(&mut self) -> Result<(), SourceError> {
        if let Ok(running) = &mut self.running {
            if running.thread.as_ref().is_some_and(|t| t.is_finished()) {
                let outcome = running.thread.take().map(|t| t.join());
                let why = match outcome {
                    Some(Err(panic)) => format!("panicked: {}", crate::pipeline::panic_message(panic.as_ref())),
                    _ => "stopped".to_string(),
                };
                if running.started.elapsed() >= HEALTHY_FOR {
                    self.restart.backoff = FIRST_RESTART;
                }
                tracing::error!("the scheduler's observer {why}; starting it again in {:?}", self.restart.backoff);
                self.restart.at = Some(Instant::now() + self.restart.backoff);
                self.restart.why = why;
                self.restart.backoff = (self.restart.backoff * 2).min(LAST_RESTART);
            }
        }
        let Some(at) = self.restart.at else { return Ok(()) };
        let left = at.saturating_duration_since(Instant::now());
        if !left.is_zero() || self.relaunch.is_none() {
            return Err(SourceError(format!(
                "the scheduler's observer {}; starting it again in {} s (restarts so far: {})",
                self.restart.why,
                left.as_secs_f64().ceil(),
                self.restart.restarts
            )));
        }
        let runq = self.running.as_ref().map(|r| r.runq.clone()).unwrap_or_else(|_| Feed::new(RUNQ_PENDING));
        if let Some(relaunch) = self.relaunch.as_mut() {
            (self.running, self.enforcement_off) = relaunch(runq);
        }
        self.restart.at = None;
        self.restart.restarts += 1;
        tracing::warn!(restarts = self.restart.restarts, "the scheduler's observer was started again");
        Ok(())
    }
}

impl Drop for SchedulerSource {
    /// Stops the observer, which restores every thread it changed; one that does not stop
    /// within `SHUTDOWN_WAIT` (stuck in the kernel) is left behind, and what it changed is
    /// restored from the journal here.
    fn drop(&mut self) {
        let Ok(running) = &mut self.running else { return };
        running.stop.store(true, Ordering::Relaxed);
        let Some(thread) = running.thread.take() else { return };
        let deadline = Instant::now() + SHUTDOWN_WAIT;
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if thread.is_finished() {
            let _ = thread.join();
            return;
        }
        let stage = running.published.lock().map(|p| p.stage).unwrap_or("unknown");
        tracing::error!("the scheduler's observer did not stop within {SHUTDOWN_WAIT:?} (it was {stage}): restoring from the journal");
        if let Err(why) = recover(&running.journal) {
            tracing::error!("{why}");
        }
    }
}

impl MetricsSource for SchedulerSource {
    fn name(&self) -> &str {
        crate::pipeline::Component::Scheduler.as_str()
    }

    fn collect(&mut self, sample: &mut Sample) -> Result<SourceStatus, SourceError> {
        // Unavailable is a standing state of this node, not a failing collection: say why in
        // the component's health rather than raise an alert every start.
        self.supervise()?;
        let running = match &self.running {
            Ok(running) => running,
            Err(why) => return Ok(SourceStatus::Degraded(format!("scheduler unavailable: {why}"))),
        };
        let mut published = running.published.lock().map_err(|_| SourceError("observer state poisoned".into()))?;
        let quiet = published.published_at.unwrap_or(running.started).elapsed();
        if quiet > running.stall_after {
            return Err(SourceError(format!(
                "the scheduler's observer has published no window for {} ms (it is {}): its data is stale",
                quiet.as_millis(),
                published.stage
            )));
        }
        sample.thread_events = std::mem::take(&mut published.thread_events);
        sample.thread_events_lost = std::mem::take(&mut published.thread_events_lost);
        let Some(telemetry) = &published.telemetry else {
            return Ok(SourceStatus::Degraded("starting: no window observed yet".into()));
        };
        sample.readings.scheduler =
            Some(SchedulerTelemetry { numa_nodes: self.numa_nodes, total_cpus: self.total_cpus, ..telemetry.clone() });
        let scx_error = telemetry.scx.as_ref().and_then(|s| s.error.as_deref());
        Ok(match (&published.degraded, scx_error) {
            _ if self.enforcement_off.is_some() => {
                SourceStatus::Degraded(self.enforcement_off.clone().unwrap_or_default())
            }
            (Some(why), _) => SourceStatus::Degraded(why.clone()),
            (None, Some(why)) => SourceStatus::Degraded(format!("{why}; decisions carried out with setattr")),
            (None, None) => SourceStatus::Up,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Sample;

    /// A source around an observer thread that does `work` (a stand-in for one stuck in the
    /// kernel), with its last window published `quiet` ago while it was in `stage`.
    fn source_with(journal: PathBuf, quiet: Duration, stage: &'static str, work: Duration) -> SchedulerSource {
        let published = Published {
            telemetry: Some(SchedulerTelemetry::default()),
            published_at: Some(Instant::now() - quiet),
            stage,
            ..Published::default()
        };
        let thread = std::thread::spawn(move || std::thread::sleep(work));
        SchedulerSource {
            running: Ok(Running {
                published: Arc::new(Mutex::new(published)),
                stop: Arc::new(AtomicBool::new(false)),
                thread: Some(thread),
                started: Instant::now(),
                stall_after: Duration::from_secs(1),
                journal,
                runq: Feed::new(16),
            }),
            numa_nodes: 1,
            total_cpus: 2,
            enforcement_off: None,
            relaunch: None,
            restart: Restart::default(),
        }
    }

    #[test]
    fn an_observer_that_stops_publishing_is_reported_down_with_what_it_was_doing() {
        let dir = crate::test_support::ScratchDir::new("stalled");
        // The observer threads live while they are looked at (one that already ended is
        // reported as stopped, which is another test).
        let alive = Duration::from_millis(500);
        let mut fresh = source_with(dir.path().join(JOURNAL_FILE), Duration::ZERO, "publishing", alive);
        assert_eq!(fresh.collect(&mut Sample::new(0)), Ok(SourceStatus::Up));
        let mut stalled =
            source_with(dir.path().join(JOURNAL_FILE), Duration::from_secs(2), "scanning processes", alive);
        let why = stalled.collect(&mut Sample::new(0)).unwrap_err().0;
        assert!(why.contains("published no window") && why.contains("scanning processes"), "{why}");
    }

    #[test]
    fn a_stuck_observer_does_not_hold_up_the_stop_and_the_journal_is_restored_without_it() {
        let dir = crate::test_support::ScratchDir::new("stuck");
        let path = dir.path().join(JOURNAL_FILE);
        // What a stuck observer left changed: a thread that is gone, so nothing is written,
        // but the journal is read and emptied.
        let (mut journal, _) = Journal::open(&path).unwrap();
        let gone =
            super::super::journal::Saved { pid: 1, tid: u32::MAX - 7, start_time: 1, nice: 0, policy: 0, cpus: vec![] };
        journal.saved(&gone).unwrap();
        let source = source_with(path.clone(), Duration::ZERO, "reading probe events", Duration::from_secs(30));
        let started = Instant::now();
        drop(source);
        let took = started.elapsed();
        assert!(took >= SHUTDOWN_WAIT && took < SHUTDOWN_WAIT + Duration::from_secs(2), "{took:?}");
        assert!(Journal::open(&path).unwrap().1.is_empty(), "restored from the journal");
    }

    #[test]
    fn an_observer_that_panics_is_reported_and_started_again_with_the_same_feed() {
        let dir = crate::test_support::ScratchDir::new("relaunch");
        let mut source = source_with(dir.path().join(JOURNAL_FILE), Duration::ZERO, "publishing", Duration::ZERO);
        // The observer panics; the one started again publishes and lives.
        let panicking = std::thread::spawn(|| panic!("a bug in the observer"));
        if let Ok(running) = &mut source.running {
            running.thread = Some(panicking);
        }
        let original = source.runq_feed().unwrap();
        original.publish(&mut vec![7]);
        let launched = Arc::new(Mutex::new(Vec::new()));
        let seen = launched.clone();
        source.relaunch = Some(Box::new(move |runq: Feed<u64>| {
            seen.lock().unwrap().push(runq.clone());
            let published = Published {
                telemetry: Some(SchedulerTelemetry::default()),
                published_at: Some(Instant::now()),
                ..Published::default()
            };
            let running = Running {
                published: Arc::new(Mutex::new(published)),
                stop: Arc::new(AtomicBool::new(false)),
                thread: Some(std::thread::spawn(|| std::thread::sleep(Duration::from_secs(2)))),
                started: Instant::now(),
                stall_after: Duration::from_secs(1),
                journal: PathBuf::new(),
                runq,
            };
            (Ok(running), None)
        }));
        while !source.running.as_ref().unwrap().thread.as_ref().unwrap().is_finished() {
            std::thread::sleep(Duration::from_millis(5));
        }
        let why = source.collect(&mut Sample::new(0)).unwrap_err().0;
        assert!(why.contains("panicked: a bug in the observer") && why.contains("starting it again in 1 s"), "{why}");
        assert!(launched.lock().unwrap().is_empty(), "not before the backoff");
        std::thread::sleep(FIRST_RESTART + Duration::from_millis(50));
        assert_eq!(source.collect(&mut Sample::new(0)), Ok(SourceStatus::Up));
        assert_eq!(source.restart.restarts, 1);
        assert_eq!(source.restart.backoff, FIRST_RESTART * 2, "the next wait doubles");
        // The stats kernel's feed is the one the new observer publishes into.
        let feeds = launched.lock().unwrap();
        assert_eq!(feeds.len(), 1);
        assert_eq!(original.take(), Some(vec![7]), "the same feed, samples kept");
        feeds[0].publish(&mut vec![9]);
        assert_eq!(original.take(), Some(vec![9]));
    }
}
