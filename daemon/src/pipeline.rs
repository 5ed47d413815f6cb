//! The telemetry pipeline's vocabulary: metrics sources and the [`Sample`] they fill, one tick's
//! collection ([`collect_all`]), the bounded history and the window aggregates computed from it.
//! The loop that runs it every interval is `collector`, above the node state; this module
//! depends on neither.
//!
//! Sources are synchronous (file reads, map lookups, ring sends); one that fails is reported as
//! a down component and an alert, and the others carry on.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use ringside_shared::{
    ComponentHealth, ComponentStatus, GpuPoint, HistoryPoint, KernelPoint, KernelStateChange, KernelWindow, Phase,
    Readings, SchedulerWindow, WindowAggregates,
};

/// What one collection tick gathered.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub taken_at_ms: u64,
    /// What the sources measured; the pipeline adds the window ([`window_aggregates`]).
    pub readings: Readings,
    pub kernel_events: Vec<KernelStateChange>,
    /// Every phase change of a tracked ML thread since the tick before, in the order the
    /// scheduler made them, at its window's resolution; and how many were given up (more than
    /// the observer keeps between two ticks).
    pub thread_events: Vec<ThreadEvent>,
    pub thread_events_lost: u64,
}

/// What the scheduler's observer tells of one tracked ML thread, at the start of the window in
/// which it happened (wall ms).
#[derive(Debug, Clone, PartialEq)]
pub enum ThreadEvent {
    /// From `at_ms` on the thread is in `phase`; `comm` is given when it is first tracked.
    Phase { at_ms: u64, pid: u32, tid: u32, phase: Phase, comm: Option<String> },
    /// The thread is no longer observed (it exited, or its process is no longer tracked).
    Gone { at_ms: u64, tid: u32 },
    /// An observer started: no thread of an earlier one is observed any more.
    AllGone { at_ms: u64 },
}

impl ThreadEvent {
    pub fn at_ms(&self) -> u64 {
        match self {
            ThreadEvent::Phase { at_ms, .. } | ThreadEvent::Gone { at_ms, .. } | ThreadEvent::AllGone { at_ms } => {
                *at_ms
            }
        }
    }
}

/// Values one part of the daemon produces for another, handed over explicitly rather than
/// through a [`Sample`] in source order: e.g. the scheduler's run-queue latencies, which a
/// `stats` ring kernel is fed. The newest `capacity` values are kept until taken.
pub struct Feed<T> {
    inner: Arc<Mutex<FeedState<T>>>,
}

struct FeedState<T> {
    values: Vec<T>,
    capacity: usize,
    /// The producer has published at least once.
    live: bool,
}

impl<T> Clone for Feed<T> {
    fn clone(&self) -> Self {
        Feed { inner: self.inner.clone() }
    }
}

impl<T> Feed<T> {
    pub fn new(capacity: usize) -> Feed<T> {
        Feed { inner: Arc::new(Mutex::new(FeedState { values: Vec::new(), capacity, live: false })) }
    }

    /// Appends `values` (emptying it), keeping the newest `capacity`.
    pub fn publish(&self, values: &mut Vec<T>) {
        let Ok(mut state) = self.inner.lock() else {
            // Nobody can take them: do not keep them.
            values.clear();
            return;
        };
        state.live = true;
        state.values.append(values);
        let excess = state.values.len().saturating_sub(state.capacity);
        state.values.drain(..excess);
    }

    /// Everything published since the last take; `None` until the producer first published.
    pub fn take(&self) -> Option<Vec<T>> {
        let mut state = self.inner.lock().ok()?;
        state.live.then(|| std::mem::take(&mut state.values))
    }
}

impl Sample {
    pub fn new(taken_at_ms: u64) -> Self {
        Sample { taken_at_ms, ..Sample::default() }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum SourceStatus {
    Up,
    /// Collected, but with a part missing; the text says which and what it costs.
    Degraded(String),
    /// What it watches is not on this node (no NVIDIA driver for the GPU source); the text
    /// says what is missing. Not a fault.
    Absent(String),
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SourceError(pub String);

/// The daemon's parts that have a health of their own, by the name `/healthz`, the console and
/// `ringside_component_up` give them. Each ring kernel is one too, as `kernel:<id>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    Host,
    Scheduler,
    Gpu,
    Collector,
    Console,
    AlertStore,
    Alertmanager,
    Descriptors,
    Incidents,
    History,
    Tls,
}

impl Component {
    pub const fn as_str(self) -> &'static str {
        match self {
            Component::Host => "host",
            Component::Scheduler => "scheduler",
            Component::Gpu => "gpu",
            Component::Collector => "collector",
            Component::Console => "console",
            Component::AlertStore => "alert-store",
            Component::Alertmanager => "alertmanager",
            Component::Descriptors => "descriptors",
            Component::Incidents => "incidents",
            Component::History => "history",
            Component::Tls => "tls",
        }
    }
}

/// A pluggable producer of metrics: the host, the scheduler, each ring kernel.
pub trait MetricsSource: Send {
    /// Component name shown in `/healthz` and the console.
    fn name(&self) -> &str;
    /// Fills this source's part of `sample`. Must not block for long: it runs on every tick.
    fn collect(&mut self, sample: &mut Sample) -> Result<SourceStatus, SourceError>;
}

/// Runs every source once and reports each one's health.
pub fn collect_all(
    sources: &mut [Box<dyn MetricsSource>],
    taken_at_ms: u64,
) -> (Sample, Vec<ComponentHealth>, Vec<(String, String)>) {
    let mut sample = Sample::new(taken_at_ms);
    let mut components = Vec::with_capacity(sources.len());
    let mut failures = Vec::new();
    for source in sources.iter_mut() {
        let name = source.name().to_string();
        // A source that panics is that source's failure, not the end of collection: it is
        // reported down with the panic's message and asked again next tick.
        let collected = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| source.collect(&mut sample)))
            .unwrap_or_else(|panic| Err(SourceError(format!("panicked: {}", panic_message(panic.as_ref())))));
        let (status, detail) = match collected {
            Ok(SourceStatus::Up) => (ComponentStatus::Up, None),
            Ok(SourceStatus::Degraded(why)) => (ComponentStatus::Degraded, Some(why)),
            Ok(SourceStatus::Absent(why)) => (ComponentStatus::Absent, Some(why)),
            Err(SourceError(why)) => {
                failures.push((name.clone(), why.clone()));
                (ComponentStatus::Down, Some(why))
            }
        };
        components.push(ComponentHealth { name, status, detail });
    }
    (sample, components, failures)
}

/// A fixed-capacity ring: pushing onto a full ring overwrites the oldest entry.
#[derive(Debug, Clone)]
pub struct HistoryRing<T> {
    items: VecDeque<T>,
    capacity: usize,
}

impl<T> HistoryRing<T> {
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        HistoryRing { items: VecDeque::with_capacity(capacity), capacity }
    }

    pub fn push(&mut self, item: T) {
        if self.items.len() == self.capacity {
            self.items.pop_front();
        }
        self.items.push_back(item);
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + ExactSizeIterator {
        self.items.iter()
    }

    pub fn last(&self) -> Option<&T> {
        self.items.back()
    }
}

/// The cumulative counters of one tick, kept to compute window aggregates from deltas.
#[derive(Debug, Clone, Default)]
pub struct CounterRecord {
    pub t_ms: u64,
    pub cpu_pct: Option<f64>,
    pub context_switches: Option<u64>,
    pub kernels: Vec<KernelCounters>,
    pub scheduler: Option<(u64, u64)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct KernelCounters {
    pub id: String,
    pub processed: u64,
    pub dropped: u64,
    pub total_latency_ns: u64,
}

impl CounterRecord {
    pub fn from_sample(sample: &Sample) -> Self {
        CounterRecord {
            t_ms: sample.taken_at_ms,
            cpu_pct: sample.readings.host.as_ref().map(|h| h.cpu_utilization_pct),
            context_switches: sample.readings.host.as_ref().map(|h| h.context_switches_total),
            kernels: sample
                .readings
                .kernels
                .iter()
                .map(|k| KernelCounters {
                    id: k.id.clone(),
                    processed: k.messages_processed,
                    dropped: k.messages_dropped,
                    total_latency_ns: k.total_latency_ns,
                })
                .collect(),
            scheduler: sample.readings.scheduler.as_ref().map(|s| (s.decisions_made, s.phase_transitions)),
        }
    }
}

/// Increase of a cumulative counter. A counter that went back was reset (its producer
/// restarted), so everything it counts now happened since the reset.
fn counter_delta(earlier: u64, later: u64) -> u64 {
    if later >= earlier {
        later - earlier
    } else {
        later
    }
}

/// The chart point of a tick (host figures, and each kernel's latency and throughput).
pub fn history_point(sample: &Sample) -> Option<HistoryPoint> {
    let window = &sample.readings.window;
    let kernels = sample
        .readings
        .kernels
        .iter()
        .map(|k| KernelPoint {
            id: k.id.clone(),
            p50_ns: k.latency_p50_ns,
            p99_ns: k.latency_p99_ns,
            throughput_per_s: window.kernels.iter().find(|w| w.id == k.id).map(|w| w.throughput_per_s).unwrap_or(0.0),
        })
        .collect();
    let gpus = sample
        .readings
        .gpus
        .iter()
        .flat_map(|g| &g.devices)
        .map(|g| GpuPoint {
            index: g.index,
            utilization_pct: g.utilization_gpu_pct,
            memory_used_pct: match (g.memory_used_bytes, g.memory_total_bytes) {
                (Some(used), Some(total)) if total > 0 => Some(used as f64 * 100.0 / total as f64),
                _ => None,
            },
            power_w: g.power_draw_w,
            temperature_c: g.temperature_gpu_c,
        })
        .collect();
    sample.readings.host.as_ref().map(|h| HistoryPoint {
        t_ms: sample.taken_at_ms,
        cpu_pct: h.cpu_utilization_pct,
        iowait_pct: h.iowait_pct,
        mem_used_pct: h.memory.used_pct,
        load1: h.load1,
        kernels,
        gpus,
    })
}

/// Aggregates over the records no older than `window_ms` before the newest one. Rates come from
/// the first and last record of the window; the first record is the baseline, so a window of
/// one record has no rates yet.
pub fn window_aggregates(records: &HistoryRing<CounterRecord>, window_ms: u64) -> WindowAggregates {
    let Some(last) = records.last() else {
        return WindowAggregates { window_ms, ..WindowAggregates::default() };
    };
    let start = last.t_ms.saturating_sub(window_ms);
    let in_window: Vec<&CounterRecord> = records.iter().filter(|r| r.t_ms >= start).collect();
    let first = in_window[0];
    let covered_ms = last.t_ms.saturating_sub(first.t_ms);
    let seconds = covered_ms as f64 / 1000.0;

    // Per-tick CPU figures are already deltas; the baseline's covers time before the window.
    let cpu: Vec<f64> = in_window.iter().skip(1).filter_map(|r| r.cpu_pct).collect();
    let cpu_avg_pct = (!cpu.is_empty()).then(|| cpu.iter().sum::<f64>() / cpu.len() as f64);
    let cpu_max_pct = cpu.iter().copied().reduce(f64::max);

    let context_switches_per_s = match (first.context_switches, last.context_switches) {
        (Some(a), Some(b)) if seconds > 0.0 => Some(counter_delta(a, b) as f64 / seconds),
        _ => None,
    };

    let kernels = last
        .kernels
        .iter()
        .map(|now| {
            // Baseline: the oldest record in the window that has this kernel (it may be newer).
            let base = in_window.iter().find_map(|r| r.kernels.iter().find(|k| k.id == now.id).map(|k| (r.t_ms, k)));
            let (base_t, processed, dropped, latency) = match base {
                Some((t, k)) => (
                    t,
                    counter_delta(k.processed, now.processed),
                    counter_delta(k.dropped, now.dropped),
                    counter_delta(k.total_latency_ns, now.total_latency_ns),
                ),
                None => (last.t_ms, 0, 0, 0),
            };
            let span_s = last.t_ms.saturating_sub(base_t) as f64 / 1000.0;
            let offered = processed + dropped;
            KernelWindow {
                id: now.id.clone(),
                processed,
                dropped,
                drop_rate: (offered > 0).then(|| dropped as f64 / offered as f64),
                throughput_per_s: if span_s > 0.0 { processed as f64 / span_s } else { 0.0 },
                avg_latency_ns: (processed > 0).then(|| latency as f64 / processed as f64),
            }
        })
        .collect();

    let scheduler = match (first.scheduler, last.scheduler) {
        (Some((d0, p0)), Some((d1, p1))) => {
            let decisions = counter_delta(d0, d1);
            Some(SchedulerWindow {
                decisions,
                phase_transitions: counter_delta(p0, p1),
                decisions_per_s: if seconds > 0.0 { decisions as f64 / seconds } else { 0.0 },
            })
        }
        _ => None,
    };

    WindowAggregates { window_ms, covered_ms, cpu_avg_pct, cpu_max_pct, context_switches_per_s, kernels, scheduler }
}

/// Waits between restarts of a supervised task: `first`, doubling up to `last`, and `first`
/// again once a run lasted `healthy_for`.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub first: std::time::Duration,
    pub last: std::time::Duration,
    pub healthy_for: std::time::Duration,
}

impl Backoff {
    /// 1 s doubling to 60 s, reset after 5 minutes of running.
    pub const DEFAULT: Backoff = Backoff {
        first: std::time::Duration::from_secs(1),
        last: std::time::Duration::from_secs(60),
        healthy_for: std::time::Duration::from_secs(300),
    };
}

/// Runs `body` on this thread until it returns, starting it again each time it panics: `report`
/// hears the panic's message and the wait before the next run; a `stop` seen during the wait
/// ends supervision.
pub fn supervised(
    backoff: Backoff,
    stop: &std::sync::atomic::AtomicBool,
    mut body: impl FnMut(),
    mut report: impl FnMut(&str, std::time::Duration),
) {
    let mut wait = backoff.first;
    loop {
        let started = std::time::Instant::now();
        let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut body)) else { return };
        if started.elapsed() >= backoff.healthy_for {
            wait = backoff.first;
        }
        report(panic_message(panic.as_ref()), wait);
        let until = std::time::Instant::now() + wait;
        while std::time::Instant::now() < until {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10).min(wait));
        }
        wait = (wait * 2).min(backoff.last);
    }
}

/// What a caught panic says.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic without a message")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_feed_hands_over_the_newest_values_once() {
        let feed = Feed::new(3);
        let reader = feed.clone();
        assert_eq!(reader.take(), None, "nothing published yet: the producer is starting");
        feed.publish(&mut vec![1, 2]);
        feed.publish(&mut vec![3, 4, 5]);
        assert_eq!(reader.take(), Some(vec![3, 4, 5]), "the newest 3");
        assert_eq!(reader.take(), Some(vec![]), "taken once");
    }

    #[test]
    fn ring_keeps_the_newest() {
        let mut ring = HistoryRing::new(3);
        for i in 0..5 {
            ring.push(i);
        }
        assert_eq!(ring.iter().copied().collect::<Vec<_>>(), vec![2, 3, 4]);
        assert_eq!((ring.len(), ring.capacity(), ring.last()), (3, 3, Some(&4)));
    }

    fn record(t_ms: u64, processed: u64, dropped: u64, latency: u64) -> CounterRecord {
        CounterRecord {
            t_ms,
            cpu_pct: Some(t_ms as f64 / 1000.0),
            context_switches: Some(t_ms * 10),
            kernels: vec![KernelCounters { id: "k".into(), processed, dropped, total_latency_ns: latency }],
            scheduler: Some((t_ms / 1000, 0)),
        }
    }

    #[test]
    fn window_uses_counter_deltas_not_sums() {
        let mut ring = HistoryRing::new(100);
        // A long quiet past with a huge cumulative count, then 2 s of traffic in the window.
        ring.push(record(0, 0, 0, 0));
        ring.push(record(10_000, 1_000_000, 0, 1_000_000_000));
        ring.push(record(11_000, 1_000_090, 10, 1_000_090_000));
        ring.push(record(12_000, 1_000_180, 20, 1_000_180_000));
        let window = window_aggregates(&ring, 2000);
        assert_eq!(window.covered_ms, 2000);
        let k = &window.kernels[0];
        assert_eq!((k.processed, k.dropped), (180, 20));
        assert_eq!(k.drop_rate, Some(0.1), "20 of 200 offered in the window, not 20 of 1000200");
        assert_eq!(k.throughput_per_s, 90.0);
        assert_eq!(k.avg_latency_ns, Some(1000.0));
        assert_eq!(window.cpu_avg_pct, Some(11.5));
        assert_eq!(window.cpu_max_pct, Some(12.0));
        assert_eq!(window.context_switches_per_s, Some(10_000.0));
        assert_eq!(window.scheduler.unwrap().decisions, 2);
    }

    #[test]
    fn counter_reset_is_not_negative() {
        let mut ring = HistoryRing::new(10);
        ring.push(record(0, 500, 5, 500));
        ring.push(record(1000, 40, 0, 400));
        let k = &window_aggregates(&ring, 5000).kernels[0];
        assert_eq!((k.processed, k.dropped), (40, 0));
        assert_eq!(k.drop_rate, Some(0.0));
    }

    #[test]
    fn empty_and_single_record_windows() {
        let ring: HistoryRing<CounterRecord> = HistoryRing::new(10);
        assert_eq!(window_aggregates(&ring, 1000).kernels.len(), 0);
        let mut ring = HistoryRing::new(10);
        ring.push(record(5000, 10, 0, 10));
        let window = window_aggregates(&ring, 1000);
        assert_eq!(window.covered_ms, 0);
        assert_eq!(window.cpu_avg_pct, None);
        assert_eq!(window.kernels[0].drop_rate, None, "no traffic seen yet within the window");
    }

    struct Failing;
    impl MetricsSource for Failing {
        fn name(&self) -> &str {
            "broken"
        }
        fn collect(&mut self, _: &mut Sample) -> Result<SourceStatus, SourceError> {
            Err(SourceError("cannot read /nonexistent".into()))
        }
    }

    struct Panicking(u32);
    impl MetricsSource for Panicking {
        fn name(&self) -> &str {
            "panicky"
        }
        fn collect(&mut self, _: &mut Sample) -> Result<SourceStatus, SourceError> {
            self.0 += 1;
            if self.0 == 1 {
                panic!("index out of bounds in a parser");
            }
            Ok(SourceStatus::Up)
        }
    }

    #[test]
    fn a_panicking_source_is_down_with_the_panic_and_asked_again_next_tick() {
        let mut sources: Vec<Box<dyn MetricsSource>> =
            vec![Box::new(Panicking(0)), Box::new(crate::host::HostSource::new(Default::default()))];
        let (sample, components, failures) = collect_all(&mut sources, 1);
        assert!(sample.readings.host.is_some(), "the other sources still ran");
        assert_eq!(components[0].status, ComponentStatus::Down);
        assert_eq!(components[0].detail.as_deref(), Some("panicked: index out of bounds in a parser"));
        assert_eq!(failures.len(), 1);
        let (_, components, _) = collect_all(&mut sources, 2);
        assert_eq!(components[0].status, ComponentStatus::Up, "it runs again the next tick");
    }

    #[test]
    fn a_failing_source_is_reported_and_others_carry_on() {
        let mut sources: Vec<Box<dyn MetricsSource>> =
            vec![Box::new(Failing), Box::new(crate::host::HostSource::new(Default::default()))];
        let (sample, components, failures) = collect_all(&mut sources, 1);
        assert!(sample.readings.host.is_some());
        assert_eq!(components[0].status, ComponentStatus::Down);
        assert_eq!(failures, vec![("broken".to_string(), "cannot read /nonexistent".to_string())]);
        assert_ne!(components[1].status, ComponentStatus::Down);
    }

    #[test]
    fn a_supervised_task_that_panics_runs_again_after_a_doubling_wait() {
        use std::sync::atomic::AtomicBool;
        use std::time::Duration;
        let backoff =
            Backoff { first: Duration::from_millis(10), last: Duration::from_millis(25), healthy_for: Duration::MAX };
        let (mut runs, mut heard) = (0, Vec::new());
        supervised(
            backoff,
            &AtomicBool::new(false),
            || {
                runs += 1;
                if runs <= 3 {
                    panic!("run {runs} failed");
                }
            },
            |why, wait| heard.push((why.to_string(), wait)),
        );
        assert_eq!(runs, 4, "started again until it returned");
        let waits: Vec<u128> = heard.iter().map(|(_, w)| w.as_millis()).collect();
        assert_eq!(waits, [10, 20, 25], "doubling, up to the last");
        assert_eq!(heard[0].0, "run 1 failed");
        // A stop during the wait ends it.
        let stop = AtomicBool::new(true);
        let mut again = 0;
        supervised(
            backoff,
            &stop,
            || {
                again += 1;
                panic!("always");
            },
            |_, _| {},
        );
        assert_eq!(again, 1);
    }
}
