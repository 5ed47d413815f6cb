//! The built-in alert kinds, each declared once in [`KINDS`]: its type, what it is about, the
//! severities it raises, its thresholds (config key, default, range, meaning) and its condition
//! over a tick's typed readings. The `[thresholds]` section ([`Thresholds`]), its checks, the
//! tables in `docs/alerts.md` and [`super::conditions`] all derive from the table.
//!
//! Adding a kind: a variant of `AlertType` (`shared/src/alert.rs`), its thresholds and row
//! here with its condition, and the tables this module's test prints into `docs/alerts.md`.

use std::collections::BTreeMap;

use ringside_shared::{AlertType, GpuDevice, KernelState, Phase, RingKernelMetrics, Severity, ThrottleReason};
use serde::Deserialize;

use super::Condition;
use crate::invalid::Invalid;
use crate::metrics::{jobs, Job, RuleMetric, Source, View};

/// One end of a threshold's allowed range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    /// The value itself is allowed.
    Incl(f64),
    /// Only values beyond it are.
    Excl(f64),
}

/// A threshold of a built-in kind: `[thresholds] <key> = <value>`.
#[derive(Debug)]
pub struct Threshold {
    pub key: &'static str,
    pub default: f64,
    pub min: Bound,
    pub max: Bound,
    /// What the value counts, for the docs (`%`, `s`, `ms`, `°C`, `x`, or empty: a share 0-1).
    pub unit: &'static str,
    pub help: &'static str,
}

impl Threshold {
    pub fn admits(&self, value: f64) -> bool {
        let above = match self.min {
            Bound::Incl(min) => value >= min,
            Bound::Excl(min) => value > min,
        };
        let below = match self.max {
            Bound::Incl(max) => value <= max,
            Bound::Excl(max) => value < max,
        };
        value.is_finite() && above && below
    }

    /// The allowed range as the docs write it: `(0, 1]`, `[1, ∞)`.
    pub fn range(&self) -> String {
        let number = |v: f64| if v.is_infinite() { "∞".to_string() } else { v.to_string() };
        let (open, min) = match self.min {
            Bound::Incl(v) => ('[', v),
            Bound::Excl(v) => ('(', v),
        };
        let (close, max) = match self.max {
            Bound::Incl(v) => (']', v),
            Bound::Excl(v) => (')', v),
        };
        format!("{open}{}, {}{close}", number(min), number(max))
    }
}

/// What a condition reads: the tick's readings (and window), and the sources that failed.
pub struct Tick<'a> {
    pub view: View<'a>,
    pub failures: &'a [(String, String)],
}

type Check = fn(&Thresholds, &Tick, &mut Vec<Condition>);

/// A built-in alert kind.
pub struct Kind {
    pub alert_type: AlertType,
    /// What its alerts are about ([`Source::pattern`]).
    pub source: &'static str,
    pub severities: &'static [Severity],
    pub thresholds: &'static [&'static Threshold],
    /// Thresholds that must not decrease in this order (warning ≤ error ≤ critical).
    pub ascending: &'static [&'static Threshold],
    /// When it fires, for the docs.
    pub when: &'static str,
    pub condition: Check,
}

use Severity::{Critical, Error, Warning};

const ALL_THREE: &[Severity] = &[Warning, Error, Critical];
const NONE: &[&Threshold] = &[];

macro_rules! threshold {
    ($name:ident, $key:literal, $default:expr, $min:expr, $max:expr, $unit:literal, $help:literal) => {
        pub const $name: Threshold =
            Threshold { key: $key, default: $default, min: $min, max: $max, unit: $unit, help: $help };
    };
}

use Bound::{Excl, Incl};
const INF: f64 = f64::INFINITY;

threshold!(
    DROP_RATE_WARNING,
    "drop_rate_warning",
    0.01,
    Excl(0.0),
    Incl(1.0),
    "",
    "share of messages dropped over the window for a warning"
);
threshold!(DROP_RATE_ERROR, "drop_rate_error", 0.05, Excl(0.0), Incl(1.0), "", "... for an error");
threshold!(DROP_RATE_CRITICAL, "drop_rate_critical", 0.10, Excl(0.0), Incl(1.0), "", "... for a critical alert");
threshold!(
    LATENCY_WARNING_MS,
    "latency_warning_ms",
    10.0,
    Excl(0.0),
    Excl(INF),
    "ms",
    "mean latency over the window for a warning"
);
threshold!(
    LATENCY_ERROR_FACTOR,
    "latency_error_factor",
    5.0,
    Incl(1.0),
    Excl(INF),
    "x",
    "times the warning for an error"
);
threshold!(
    LATENCY_CRITICAL_FACTOR,
    "latency_critical_factor",
    10.0,
    Incl(1.0),
    Excl(INF),
    "x",
    "times the warning for a critical alert"
);
threshold!(QUEUE_FULL_RATIO, "queue_full_ratio", 0.9, Excl(0.0), Incl(1.0), "", "share of a ring's capacity in use");
threshold!(
    MEMORY_USED_PCT_WARNING,
    "memory_used_pct_warning",
    90.0,
    Excl(0.0),
    Incl(100.0),
    "%",
    "memory in use (total - available) for a warning"
);
threshold!(MEMORY_USED_PCT_ERROR, "memory_used_pct_error", 95.0, Excl(0.0), Incl(100.0), "%", "... for an error");
threshold!(
    MEMORY_USED_PCT_CRITICAL,
    "memory_used_pct_critical",
    98.0,
    Excl(0.0),
    Incl(100.0),
    "%",
    "... for a critical alert"
);
threshold!(
    MEMORY_STALL_PCT_WARNING,
    "memory_stall_pct_warning",
    10.0,
    Excl(0.0),
    Incl(100.0),
    "%",
    "tasks stalled on memory (`/proc/pressure/memory` some avg10) for a warning"
);
threshold!(
    GPU_MEMORY_USED_PCT_WARNING,
    "gpu_memory_used_pct_warning",
    95.0,
    Excl(0.0),
    Incl(100.0),
    "%",
    "a GPU's memory in use"
);
threshold!(
    GPU_TEMPERATURE_C_WARNING,
    "gpu_temperature_c_warning",
    85.0,
    Excl(0.0),
    Excl(150.0),
    "°C",
    "a GPU's temperature, where it does not say when it slows itself down"
);
threshold!(
    GPU_TEMPERATURE_MARGIN_C,
    "gpu_temperature_margin_c",
    5.0,
    Incl(0.0),
    Excl(100.0),
    "°C",
    "where it does: this far below that"
);
threshold!(
    GPU_THROTTLE_SUSTAINED_S,
    "gpu_throttle_sustained_s",
    10.0,
    Incl(0.0),
    Incl(86_400.0),
    "s",
    "how long the hardware holds its clocks down without a break"
);
threshold!(
    COLLECTIVE_HANG_S,
    "collective_hang_s",
    60.0,
    Incl(1.0),
    Incl(86_400.0),
    "s",
    "how long a job waits in an NCCL collective with none returning"
);
threshold!(
    INPUT_BOUND_PCT,
    "input_bound_pct",
    50.0,
    Excl(0.0),
    Incl(100.0),
    "%",
    "share of a job's recent window (`[scheduler] job_window_s`) spent loading data"
);
threshold!(
    STEP_P99_REGRESSION_FACTOR,
    "step_p99_regression_factor",
    2.0,
    Excl(1.0),
    Incl(100.0),
    "x",
    "a job's recent step time p99 over its p99 in the hour before"
);

pub const KINDS: &[Kind] = &[
    Kind {
        alert_type: AlertType::HighDropRate,
        source: "kernel:<id>",
        severities: ALL_THREE,
        thresholds: &[&DROP_RATE_WARNING, &DROP_RATE_ERROR, &DROP_RATE_CRITICAL],
        ascending: &[&DROP_RATE_WARNING, &DROP_RATE_ERROR, &DROP_RATE_CRITICAL],
        when: "a ring kernel drops more than `drop_rate_*` of its messages over the window",
        condition: high_drop_rate,
    },
    Kind {
        alert_type: AlertType::HighLatency,
        source: "kernel:<id>",
        severities: ALL_THREE,
        thresholds: &[&LATENCY_WARNING_MS, &LATENCY_ERROR_FACTOR, &LATENCY_CRITICAL_FACTOR],
        ascending: &[&LATENCY_ERROR_FACTOR, &LATENCY_CRITICAL_FACTOR],
        when: "its mean latency over the window exceeds `latency_warning_ms` (x `latency_*_factor`)",
        condition: high_latency,
    },
    Kind {
        alert_type: AlertType::QueueNearFull,
        source: "kernel:<id>",
        severities: &[Warning, Error],
        thresholds: &[&QUEUE_FULL_RATIO],
        ascending: NONE,
        when: "a ring holds `queue_full_ratio` of its capacity (error: full)",
        condition: queue_near_full,
    },
    Kind {
        alert_type: AlertType::KernelError,
        source: "kernel:<id>",
        severities: &[Error, Critical],
        thresholds: NONE,
        ascending: NONE,
        when: "a ring kernel reports an error (critical: it failed)",
        condition: kernel_error,
    },
    Kind {
        alert_type: AlertType::MemoryPressure,
        source: "host",
        severities: ALL_THREE,
        thresholds: &[&MEMORY_USED_PCT_WARNING, &MEMORY_USED_PCT_ERROR, &MEMORY_USED_PCT_CRITICAL, &MEMORY_STALL_PCT_WARNING],
        ascending: &[&MEMORY_USED_PCT_WARNING, &MEMORY_USED_PCT_ERROR, &MEMORY_USED_PCT_CRITICAL],
        when: "memory in use over `memory_used_pct_*`, or tasks stalled on memory over `memory_stall_pct_warning`",
        condition: memory_pressure,
    },
    Kind {
        alert_type: AlertType::SourceFailure,
        source: "source:<name>",
        severities: &[Error],
        thresholds: NONE,
        ascending: NONE,
        when: "a metrics source failed to collect",
        condition: source_failure,
    },
    Kind {
        alert_type: AlertType::SchedulerEjected,
        source: "scheduler:sched_ext",
        severities: &[Critical],
        thresholds: NONE,
        ascending: NONE,
        when: "the kernel stopped the sched_ext scheduler",
        condition: scheduler_ejected,
    },
    Kind {
        alert_type: AlertType::GpuHealth,
        source: "gpu:<index>/<kind>",
        severities: ALL_THREE,
        thresholds: &[
            &GPU_MEMORY_USED_PCT_WARNING,
            &GPU_TEMPERATURE_C_WARNING,
            &GPU_TEMPERATURE_MARGIN_C,
            &GPU_THROTTLE_SUSTAINED_S,
        ],
        ascending: NONE,
        when: "a GPU lost, XIDs, uncorrectable ECC, row remaps, hardware throttling, memory nearly full, running hot (see [`gpu.md`](gpu.md))",
        condition: gpu_health,
    },
    Kind {
        alert_type: AlertType::CollectiveHang,
        source: "job:<pid>",
        severities: &[Critical],
        thresholds: &[&COLLECTIVE_HANG_S],
        ascending: NONE,
        when: "an ML job waits in an NCCL collective and none of its collectives has returned for `collective_hang_s`",
        condition: collective_hang,
    },
    Kind {
        alert_type: AlertType::InputBound,
        source: "job:<pid>",
        severities: &[Warning],
        thresholds: &[&INPUT_BOUND_PCT],
        ascending: NONE,
        when: "an ML job spent more than `input_bound_pct` of its recent window loading data",
        condition: input_bound,
    },
    Kind {
        alert_type: AlertType::StepTimeRegression,
        source: "job:<pid>",
        severities: &[Warning],
        thresholds: &[&STEP_P99_REGRESSION_FACTOR],
        ascending: NONE,
        when: "an ML job's step time p99 over its recent window is `step_p99_regression_factor` times its p99 over the hour before",
        condition: step_time_regression,
    },
];

/// Every threshold of every kind, in the table's order.
pub fn thresholds() -> impl Iterator<Item = &'static Threshold> {
    KINDS.iter().flat_map(|k| k.thresholds.iter().copied())
}

/// The `[thresholds]` section: a value for every threshold of [`KINDS`], the default where the
/// file gives none.
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds {
    values: BTreeMap<&'static str, f64>,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { values: thresholds().map(|t| (t.key, t.default)).collect() }
    }
}

impl Thresholds {
    pub fn get(&self, t: &Threshold) -> f64 {
        self.values.get(t.key).copied().unwrap_or(t.default)
    }

    /// These thresholds with `t` at `value` (unchecked: [`check`](Self::check) says).
    pub fn with(mut self, t: &'static Threshold, value: f64) -> Self {
        self.values.insert(t.key, value);
        self
    }

    /// Every threshold by its config key, for the snapshot's config summary.
    pub fn by_key(&self) -> BTreeMap<String, f64> {
        self.values.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// Each value in its range, and each kind's ascending thresholds in order.
    pub fn check(&self) -> Result<(), Invalid> {
        for t in thresholds() {
            let value = self.get(t);
            if !t.admits(value) {
                let unit = if t.unit.is_empty() { String::new() } else { format!(" {}", t.unit) };
                let why = format!("must be in {}{unit}", t.range());
                return Err(Invalid::new(format!("thresholds.{}", t.key), value, why));
            }
        }
        for kind in KINDS {
            for pair in kind.ascending.windows(2) {
                if self.get(pair[0]) > self.get(pair[1]) {
                    let keys: Vec<&str> = kind.ascending.iter().map(|t| t.key).collect();
                    let values: Vec<String> = kind.ascending.iter().map(|t| self.get(t).to_string()).collect();
                    let why = format!("need {} in this order, got {}", keys.join(" <= "), values.join(", "));
                    return Err(Invalid::new(format!("thresholds.{}", pair[1].key), self.get(pair[1]), why));
                }
            }
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for Thresholds {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let given = BTreeMap::<String, f64>::deserialize(deserializer)?;
        let mut out = Thresholds::default();
        for (key, value) in given {
            let Some(t) = thresholds().find(|t| t.key == key) else {
                let known: Vec<&str> = thresholds().map(|t| t.key).collect();
                return Err(serde::de::Error::custom(format!(
                    "unknown threshold `{key}`, expected one of: {}",
                    known.join(", ")
                )));
            };
            out.values.insert(t.key, value);
        }
        Ok(out)
    }
}

/// Every condition of every built-in kind that holds in this tick.
pub fn conditions(t: &Thresholds, tick: &Tick) -> Vec<Condition> {
    let mut found = Vec::new();
    for kind in KINDS {
        let from = found.len();
        (kind.condition)(t, tick, &mut found);
        for c in &found[from..] {
            debug_assert_eq!(c.alert_type, kind.alert_type, "{c:?}");
            debug_assert!(kind.severities.contains(&c.severity), "{c:?} is not among {:?}", kind.severities);
            debug_assert_eq!(c.source.pattern(), kind.source, "{c:?}");
        }
    }
    found
}

impl Condition {
    /// A built-in kind's condition, without labels.
    fn new(
        alert_type: AlertType,
        source: Source,
        severity: Severity,
        value: f64,
        threshold: f64,
        message: String,
    ) -> Self {
        Condition { alert_type, rule: None, labels: BTreeMap::new(), source, severity, value, threshold, message }
    }
}

/// The highest of `levels` (ascending thresholds) that `value` exceeds.
fn level(value: f64, levels: [(f64, Severity); 3]) -> Option<(Severity, f64)> {
    levels.iter().rev().find(|(threshold, _)| value > *threshold).map(|(t, s)| (*s, *t))
}

/// A registry metric's value for `source` in this tick: the same value `/metrics` exports and
/// rules see.
fn reading(metric: &RuleMetric, view: &View, source: &Source) -> Option<f64> {
    metric.values(view).into_iter().find_map(|(s, v)| (s == *source).then_some(v))
}

/// A registry metric by its rule name; the names used here are checked by a test.
fn metric(name: &'static str) -> Option<RuleMetric> {
    RuleMetric::find(name)
}

/// Every ring kernel with a registry value of `name`.
fn per_kernel<'a>(tick: &Tick<'a>, name: &'static str) -> Vec<(&'a RingKernelMetrics, f64)> {
    let Some(m) = metric(name) else { return Vec::new() };
    let values = m.values(&tick.view);
    tick.view
        .kernels()
        .iter()
        .filter_map(|k| {
            let source = Source::Kernel(k.id.clone());
            values.iter().find(|(s, _)| *s == source).map(|(_, v)| (k, *v))
        })
        .collect()
}

fn window_s(tick: &Tick) -> f64 {
    tick.view.window().covered_ms as f64 / 1000.0
}

fn high_drop_rate(t: &Thresholds, tick: &Tick, found: &mut Vec<Condition>) {
    let levels = [
        (t.get(&DROP_RATE_WARNING), Warning),
        (t.get(&DROP_RATE_ERROR), Error),
        (t.get(&DROP_RATE_CRITICAL), Critical),
    ];
    for (kernel, rate) in per_kernel(tick, "kernel.drop_rate") {
        if let Some((severity, threshold)) = level(rate, levels) {
            let message = format!(
                "{} drops {:.1}% of its messages (over {:.0} s; threshold {:.1}%)",
                kernel.id,
                rate * 100.0,
                window_s(tick),
                threshold * 100.0
            );
            let source = Source::Kernel(kernel.id.clone());
            found.push(Condition::new(AlertType::HighDropRate, source, severity, rate, threshold, message));
        }
    }
}

fn high_latency(t: &Thresholds, tick: &Tick, found: &mut Vec<Condition>) {
    let warn = t.get(&LATENCY_WARNING_MS);
    let levels = [
        (warn, Warning),
        (warn * t.get(&LATENCY_ERROR_FACTOR), Error),
        (warn * t.get(&LATENCY_CRITICAL_FACTOR), Critical),
    ];
    for (kernel, ms) in per_kernel(tick, "kernel.avg_latency_ms") {
        if let Some((severity, threshold)) = level(ms, levels) {
            let message = format!(
                "{} mean latency {ms:.2} ms over {:.0} s (threshold {threshold} ms)",
                kernel.id,
                window_s(tick)
            );
            let source = Source::Kernel(kernel.id.clone());
            found.push(Condition::new(AlertType::HighLatency, source, severity, ms, threshold, message));
        }
    }
}

fn queue_near_full(t: &Thresholds, tick: &Tick, found: &mut Vec<Condition>) {
    let ratio = t.get(&QUEUE_FULL_RATIO);
    for kernel in tick.view.kernels() {
        let queues = [
            ("input", kernel.input_queue_depth, kernel.input_queue_capacity),
            ("output", kernel.output_queue_depth, kernel.output_queue_capacity),
        ];
        let fullest = queues
            .into_iter()
            .filter(|(_, depth, capacity)| *capacity > 0 && f64::from(*depth) >= ratio * f64::from(*capacity))
            .max_by(|a, b| (a.1 as f64 / a.2 as f64).total_cmp(&(b.1 as f64 / b.2 as f64)));
        if let Some((name, depth, capacity)) = fullest {
            let severity = if depth >= capacity { Error } else { Warning };
            let message = format!("{} {name} queue holds {depth} of {capacity} messages", kernel.id);
            let value = f64::from(depth) / f64::from(capacity);
            let source = Source::Kernel(kernel.id.clone());
            found.push(Condition::new(AlertType::QueueNearFull, source, severity, value, ratio, message));
        }
    }
}

fn kernel_error(_: &Thresholds, tick: &Tick, found: &mut Vec<Condition>) {
    for kernel in tick.view.kernels() {
        let failed = kernel.state == KernelState::Failed;
        if failed || kernel.last_error.is_some() {
            let message = format!(
                "{} {}: {}",
                kernel.id,
                if failed { "failed" } else { "reported an error" },
                kernel.last_error.as_deref().unwrap_or("no detail given")
            );
            let severity = if failed { Critical } else { Error };
            let source = Source::Kernel(kernel.id.clone());
            found.push(Condition::new(AlertType::KernelError, source, severity, 1.0, 0.0, message));
        }
    }
}

fn memory_pressure(t: &Thresholds, tick: &Tick, found: &mut Vec<Condition>) {
    let value = |name| metric(name).and_then(|m| reading(&m, &tick.view, &Source::Host));
    let Some(used) = value("host.memory_used_pct") else { return };
    let levels = [
        (t.get(&MEMORY_USED_PCT_WARNING), Warning),
        (t.get(&MEMORY_USED_PCT_ERROR), Error),
        (t.get(&MEMORY_USED_PCT_CRITICAL), Critical),
    ];
    let by_use = level(used, levels);
    let stall = value("host.pressure.memory_some_avg10").unwrap_or(0.0);
    let stall_warning = t.get(&MEMORY_STALL_PCT_WARNING);
    let by_stall = (stall > stall_warning).then_some((Warning, stall_warning));
    let worst = match (by_use, by_stall) {
        (Some(a), Some(b)) => Some(if b.0 > a.0 { (b, true) } else { (a, false) }),
        (Some(a), None) => Some((a, false)),
        (None, Some(b)) => Some((b, true)),
        (None, None) => None,
    };
    let Some(((severity, threshold), stalled)) = worst else { return };
    let (value, message) = if stalled {
        let message = format!(
            "tasks stalled on memory {stall:.1}% of the last 10 s (threshold {threshold}%); {used:.1}% of memory in use"
        );
        (stall, message)
    } else {
        (used, format!("{used:.1}% of memory in use (threshold {threshold}%)"))
    };
    found.push(Condition::new(AlertType::MemoryPressure, Source::Host, severity, value, threshold, message));
}

fn source_failure(_: &Thresholds, tick: &Tick, found: &mut Vec<Condition>) {
    for (name, why) in tick.failures {
        let message = format!("metrics source {name} failed: {why}");
        let source = Source::Component(name.clone());
        found.push(Condition::new(AlertType::SourceFailure, source, Error, 1.0, 0.0, message));
    }
}

/// A standing condition while the daemon runs on the fallback.
fn scheduler_ejected(_: &Thresholds, tick: &Tick, found: &mut Vec<Condition>) {
    let exit = tick.view.scheduler().and_then(|s| s.scx.as_ref()).and_then(|x| x.exit.as_ref());
    let Some(exit) = exit.filter(|e| e.ejected) else { return };
    let message = format!(
        "the kernel stopped the sched_ext scheduler ({}: {}{}); decisions are carried out with setattr",
        exit.kind.as_str(),
        exit.reason,
        if exit.message.is_empty() { String::new() } else { format!(", {}", exit.message) }
    );
    let mut c = Condition::new(AlertType::SchedulerEjected, Source::SchedExt, Critical, 1.0, 0.0, message);
    c.labels.insert("kind".into(), exit.kind.as_str().into());
    found.push(c);
}

/// An XID keeps its GPU's `xid` alert raised this long; quiet that long, the alert resolves.
const XID_WINDOW_MS: u64 = 5 * 60 * 1000;

/// One per GPU and check (the source is `gpu:<index>/<check>`, so each has its own alert),
/// labelled with the GPU's index and UUID.
fn gpu_health(t: &Thresholds, tick: &Tick, found: &mut Vec<Condition>) {
    let memory_used = metric("gpu.memory_used_pct").map(|m| m.values(&tick.view)).unwrap_or_default();
    let temperature = metric("gpu.temperature_c").map(|m| m.values(&tick.view)).unwrap_or_default();
    let of = |values: &[(Source, f64)], gpu: &GpuDevice| {
        values.iter().find(|(s, _)| *s == Source::Gpu(gpu.index)).map(|(_, v)| *v)
    };
    for gpu in tick.view.gpus().map(|g| g.devices.as_slice()).unwrap_or_default() {
        let mut add = |check: &'static str, severity: Severity, value: f64, threshold: f64, what: String| {
            let message = format!("GPU {} ({}): {what}", gpu.index, gpu.name);
            let source = Source::GpuCheck(gpu.index, check);
            let mut c = Condition::new(AlertType::GpuHealth, source, severity, value, threshold, message);
            c.labels = BTreeMap::from([
                ("gpu".to_string(), gpu.index.to_string()),
                ("uuid".to_string(), gpu.uuid.clone()),
                ("kind".to_string(), check.to_string()),
            ]);
            found.push(c);
        };
        if let Some(why) = gpu.unsupported.get("gpu") {
            add("lost", Critical, 1.0, 0.0, why.clone());
            continue;
        }
        gpu_faults(gpu, tick.view.now_ms, &mut add);
        let sustained = t.get(&GPU_THROTTLE_SUSTAINED_S);
        let held: Vec<ThrottleReason> =
            gpu.throttle_reasons.iter().flatten().copied().filter(|r| r.is_hardware()).collect();
        let held_s = gpu.hw_throttled_since_ms.map(|since| tick.view.now_ms.saturating_sub(since) as f64 / 1000.0);
        if let Some(s) = held_s.filter(|s| !held.is_empty() && *s >= sustained) {
            let braked =
                held.contains(&ThrottleReason::HwPowerBrake) || held.contains(&ThrottleReason::HwThermalSlowdown);
            let reasons = held.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(", ");
            let what = format!("clocks held down by {reasons} for {s:.0} s");
            add("throttle", if braked { Error } else { Warning }, s, sustained, what);
        }
        let memory_warning = t.get(&GPU_MEMORY_USED_PCT_WARNING);
        if let Some(pct) = of(&memory_used, gpu).filter(|pct| *pct > memory_warning) {
            let what = format!("{pct:.1}% of GPU memory in use (threshold {memory_warning}%)");
            add("memory", Warning, pct, memory_warning, what);
        }
        let (threshold, against) = match gpu.temperature_slowdown_c {
            Some(slowdown) => {
                let threshold = f64::from(slowdown) - t.get(&GPU_TEMPERATURE_MARGIN_C);
                (threshold, format!("over {threshold} °C; it slows itself down at {slowdown} °C"))
            }
            None => {
                let threshold = t.get(&GPU_TEMPERATURE_C_WARNING);
                (threshold, format!("threshold {threshold} °C"))
            }
        };
        if let Some(c) = of(&temperature, gpu).filter(|c| *c > threshold) {
            add("temperature", Warning, c, threshold, format!("{c:.0} °C ({against})"));
        }
    }
}

/// The faults a GPU reports of itself: XIDs, uncorrectable ECC errors, row remaps.
fn gpu_faults(gpu: &GpuDevice, now_ms: u64, add: &mut impl FnMut(&'static str, Severity, f64, f64, String)) {
    let recent: Vec<&ringside_shared::GpuXid> =
        gpu.xids.iter().filter(|x| now_ms.saturating_sub(x.at_ms) < XID_WINDOW_MS).collect();
    if let Some(latest) = recent.last() {
        let critical = recent.iter().any(|x| crate::gpu::CRITICAL_XIDS.contains(&x.code));
        let meaning = latest.description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
        let what = format!("XID {}{meaning}; {} XIDs in the last 5 min", latest.code, recent.len());
        add("xid", if critical { Critical } else { Warning }, recent.len() as f64, 0.0, what);
    }
    if let Some(n) = gpu.ecc_uncorrected_volatile.filter(|n| *n > 0) {
        add("ecc", Critical, n as f64, 0.0, format!("{n} uncorrectable ECC errors since the driver loaded"));
    }
    if gpu.remapped_rows_failed == Some(true) {
        add("remap", Critical, 1.0, 0.0, "a row remap failed: the GPU needs service".into());
    } else if gpu.remapped_rows_pending == Some(true) {
        add("remap", Warning, 1.0, 0.0, "a row remap is pending: reset the GPU when it is idle".into());
    }
}

/// Steps a job must have made in its recent window, and in the hour before, before its step
/// time is compared with itself.
const MIN_RECENT_STEPS: u64 = 5;
const MIN_BASELINE_STEPS: u64 = 20;
/// Share of its recent window a job must have been observed before it is called input-bound.
const MIN_OBSERVED_SHARE: f64 = 0.8;

/// The jobs that may raise alerts (a job of a user not admitted for alerting is shown and
/// raises nothing), and the condition for each: the job's own alert (source `job:<pid>`),
/// labelled with its pid, name and command.
fn per_job<'a>(tick: &Tick<'a>, found: &mut Vec<Condition>, check: impl Fn(&Job<'a>) -> Option<JobFinding>) {
    for job in jobs(&tick.view).iter().filter(|j| !j.main.untrusted) {
        let Some(f) = check(job) else { continue };
        let message = format!("job {} ({}): {}", job.main.job, job.main.comm, f.message);
        let mut c = Condition::new(f.alert_type, job.source(), f.severity, f.value, f.threshold, message);
        c.labels = ["job", "comm", "command"].into_iter().map(String::from).zip(job.labels()).collect();
        // Where the cgroup path or the environment say who the job is across nodes.
        let identity = &job.main.identity;
        let known = [
            ("job_id", identity.job_id()),
            ("rank", identity.rank.map(|r| r.to_string())),
            ("pod", identity.pod.clone()),
        ];
        c.labels.extend(known.into_iter().filter_map(|(k, v)| Some((k.to_string(), v?))));
        found.push(c);
    }
}

struct JobFinding {
    alert_type: AlertType,
    severity: Severity,
    value: f64,
    threshold: f64,
    message: String,
}

fn collective_hang(t: &Thresholds, tick: &Tick, found: &mut Vec<Condition>) {
    let threshold = t.get(&COLLECTIVE_HANG_S);
    per_job(tick, found, |job| {
        let stalled = job.collective_stalled_s(tick.view.now_ms);
        let waiting = job.members.iter().filter(|p| p.collective_waiting_since_ms.is_some()).count();
        (stalled >= threshold).then(|| JobFinding {
            alert_type: AlertType::CollectiveHang,
            severity: Critical,
            value: stalled,
            threshold,
            message: format!(
                "waiting in an NCCL collective for {stalled:.0} s with none returning (threshold {threshold} s); \
                 {waiting} of its {} processes wait in one",
                job.members.len()
            ),
        })
    });
}

fn input_bound(t: &Thresholds, tick: &Tick, found: &mut Vec<Condition>) {
    let threshold = t.get(&INPUT_BOUND_PCT);
    let window_ms = tick.view.scheduler().map_or(0, |s| s.job_window_ms);
    per_job(tick, found, |job| {
        let loading = job.main.recent_phase_pct.get(Phase::DataLoading);
        let observed = job.main.recent_observed_ms as f64 >= window_ms as f64 * MIN_OBSERVED_SHARE;
        (observed && window_ms > 0 && loading > threshold).then(|| JobFinding {
            alert_type: AlertType::InputBound,
            severity: Warning,
            value: loading,
            threshold,
            message: format!(
                "loading data {loading:.0}% of the last {} s (threshold {threshold}%): the GPU waits for input",
                window_ms / 1000
            ),
        })
    });
}

fn step_time_regression(t: &Thresholds, tick: &Tick, found: &mut Vec<Condition>) {
    let threshold = t.get(&STEP_P99_REGRESSION_FACTOR);
    let window_ms = tick.view.scheduler().map_or(0, |s| s.job_window_ms);
    per_job(tick, found, |job| {
        let s = job.main.steps.as_ref()?;
        let baseline = s.hour_p99_ms as f64;
        let enough = s.recent_count >= MIN_RECENT_STEPS && s.hour_count >= MIN_BASELINE_STEPS && baseline > 0.0;
        let factor = s.recent_p99_ms as f64 / baseline.max(1.0);
        (enough && factor >= threshold).then(|| JobFinding {
            alert_type: AlertType::StepTimeRegression,
            severity: Warning,
            value: factor,
            threshold,
            message: format!(
                "step time p99 {:.2} s over the last {} s, {factor:.1}x its {:.2} s over the hour before",
                s.recent_p99_ms as f64 / 1000.0,
                window_ms / 1000,
                baseline / 1000.0
            ),
        })
    });
}

/// The two tables of `docs/alerts.md` ("Built-in alerts" and "Thresholds"), as Markdown.
pub fn docs_tables() -> (String, String) {
    let mut kinds = String::from("| type | source | severity | when |\n|---|---|---|---|\n");
    for k in KINDS {
        let severities: Vec<&str> = k.severities.iter().map(|s| s.as_str()).collect();
        kinds +=
            &format!("| `{}` | `{}` | {} | {} |\n", k.alert_type.as_str(), k.source, severities.join(", "), k.when);
    }
    let mut table = String::from("| key | default | range | alert | meaning |\n|---|---|---|---|---|\n");
    for k in KINDS {
        for t in k.thresholds {
            let unit = if t.unit.is_empty() { String::new() } else { format!(" {}", t.unit) };
            table += &format!(
                "| `{}` | {}{unit} | {} | `{}` | {} |\n",
                t.key,
                t.default,
                t.range(),
                k.alert_type.as_str(),
                t.help
            );
        }
    }
    (kinds, table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_declared_once_and_every_threshold_admits_its_default() {
        let mut types: Vec<AlertType> = KINDS.iter().map(|k| k.alert_type).collect();
        types.sort();
        types.dedup();
        assert_eq!(types.len(), KINDS.len(), "a kind declared twice");
        // Every built-in type has a row; `rule` is the rules engine's.
        for ty in AlertType::ALL.into_iter().filter(|t| *t != AlertType::Rule) {
            assert!(types.contains(&ty), "{ty:?} has no row in KINDS");
        }
        let mut keys: Vec<&str> = thresholds().map(|t| t.key).collect();
        keys.sort();
        let n = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), n, "a threshold key used twice");
        for t in thresholds() {
            assert!(t.admits(t.default), "{} = {} is outside {}", t.key, t.default, t.range());
        }
        Thresholds::default().check().expect("the defaults pass their own checks");
    }

    #[test]
    fn the_metrics_the_kinds_read_are_in_the_registry() {
        for name in ["kernel.drop_rate", "kernel.avg_latency_ms", "host.memory_used_pct"] {
            assert!(metric(name).is_some(), "{name}");
        }
        for name in ["host.pressure.memory_some_avg10", "gpu.memory_used_pct", "gpu.temperature_c"] {
            assert!(metric(name).is_some(), "{name}");
        }
    }

    #[test]
    fn thresholds_are_checked_against_their_range_and_order() {
        let bad = Thresholds::default().with(&QUEUE_FULL_RATIO, 1.5);
        let e = bad.check().unwrap_err();
        assert_eq!(e.to_string(), "invalid `thresholds.queue_full_ratio` = 1.5: must be in (0, 1]");
        let disordered = Thresholds::default().with(&DROP_RATE_WARNING, 0.5).with(&DROP_RATE_ERROR, 0.1);
        let e = disordered.check().unwrap_err().to_string();
        assert!(e.contains("drop_rate_warning <= drop_rate_error <= drop_rate_critical"), "{e}");
        let nan = Thresholds::default().with(&COLLECTIVE_HANG_S, f64::NAN);
        assert!(nan.check().is_err());
        let parsed: Thresholds = toml::from_str("collective_hang_s = 3\ninput_bound_pct = 40.5\n").unwrap();
        assert_eq!((parsed.get(&COLLECTIVE_HANG_S), parsed.get(&INPUT_BOUND_PCT)), (3.0, 40.5));
        assert_eq!(parsed.get(&DROP_RATE_ERROR), 0.05, "the default where none is given");
        let unknown = toml::from_str::<Thresholds>("colective_hang_s = 3\n").unwrap_err().to_string();
        assert!(unknown.contains("colective_hang_s") && unknown.contains("collective_hang_s"), "{unknown}");
    }

    /// The tables in `docs/alerts.md` are this table's: a kind or threshold added here and not
    /// there fails, and prints what to paste.
    #[test]
    fn the_documented_kinds_and_thresholds_are_the_table_s() {
        let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/alerts.md")).unwrap();
        let (kinds, thresholds) = docs_tables();
        assert!(
            docs.contains(&kinds) && docs.contains(&thresholds),
            "docs/alerts.md should read, under 'Built-in alerts':\n\n{kinds}\nand under 'Thresholds':\n\n{thresholds}"
        );
    }
}
