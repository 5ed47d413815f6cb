//! Alerts: the built-in checks ([`conditions`], reading the metric registry) and the config's
//! rules ([`rules`]) turn a tick into conditions; the [`store`] turns conditions into alerts
//! with a lifecycle, persisted in the [`db`] by its one [`writer`] thread; [`alertmanager`]
//! forwards them to a fleet's Alertmanager. [`config`] holds the subsystem's own settings.

pub mod alertmanager;
pub mod config;
pub mod db;
pub mod incidents;
pub mod rules;
pub mod silences;
pub mod store;
pub mod writer;

use std::collections::{BTreeMap, HashMap};

use ringside_shared::{AlertType, KernelState, Phase, Severity, ThrottleReason};

use crate::metrics::{RuleMetric, View};
use crate::pipeline::Sample;
use config::Thresholds;

/// The metrics the built-in conditions read, by their names in the registry
/// ([`crate::metrics`]): the same values `/metrics` exports and rules see.
const READ: [&str; 6] = [
    "kernel.drop_rate",
    "kernel.avg_latency_ms",
    "host.memory_used_pct",
    "host.pressure.memory_some_avg10",
    "gpu.memory_used_pct",
    "gpu.temperature_c",
];

/// A registry metric's values in this tick, by source.
fn readings(name: &str, view: &View) -> HashMap<String, f64> {
    debug_assert!(READ.contains(&name), "{name} is not listed in READ");
    RuleMetric::find(name).map(|m| m.values(view).into_iter().collect()).unwrap_or_default()
}

/// A condition that holds in this tick.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub alert_type: AlertType,
    /// The config rule, for `AlertType::Rule`.
    pub rule: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub source: String,
    pub severity: Severity,
    pub value: f64,
    pub threshold: f64,
    pub message: String,
}

/// The highest of `levels` (ascending thresholds) that `value` exceeds.
fn level(value: f64, levels: [(f64, Severity); 3]) -> Option<(Severity, f64)> {
    levels.iter().rev().find(|(threshold, _)| value > *threshold).map(|(t, s)| (*s, *t))
}

/// An XID keeps its GPU's `xid` alert raised this long; quiet that long, the alert resolves.
const XID_WINDOW_MS: u64 = 5 * 60 * 1000;

/// `gpu_health` conditions: one per GPU and kind (the source is `gpu:<index>/<kind>`, so each
/// has its own alert), labelled with the GPU's index and UUID.
fn gpu_conditions(t: &Thresholds, view: &View, now_ms: u64, found: &mut Vec<Condition>) {
    let memory_used = readings("gpu.memory_used_pct", view);
    let temperature = readings("gpu.temperature_c", view);
    for gpu in view.gpus().map(|g| g.devices.as_slice()).unwrap_or_default() {
        let source = format!("gpu:{}", gpu.index);
        let mut add = |kind: &str, severity: Severity, value: f64, threshold: f64, what: String| {
            found.push(Condition {
                alert_type: AlertType::GpuHealth,
                rule: None,
                labels: BTreeMap::from([
                    ("gpu".to_string(), gpu.index.to_string()),
                    ("uuid".to_string(), gpu.uuid.clone()),
                    ("kind".to_string(), kind.to_string()),
                ]),
                source: format!("gpu:{}/{kind}", gpu.index),
                severity,
                value,
                threshold,
                message: format!("GPU {} ({}): {what}", gpu.index, gpu.name),
            });
        };
        if let Some(why) = gpu.unsupported.get("gpu") {
            add("lost", Severity::Critical, 1.0, 0.0, why.clone());
            continue;
        }
        let recent: Vec<&ringside_shared::GpuXid> =
            gpu.xids.iter().filter(|x| now_ms.saturating_sub(x.at_ms) < XID_WINDOW_MS).collect();
        if let Some(latest) = recent.last() {
            let critical = recent.iter().any(|x| crate::gpu::CRITICAL_XIDS.contains(&x.code));
            let meaning = latest.description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
            let what = format!("XID {}{meaning}; {} XIDs in the last 5 min", latest.code, recent.len());
            let severity = if critical { Severity::Critical } else { Severity::Warning };
            add("xid", severity, recent.len() as f64, 0.0, what);
        }
        if let Some(n) = gpu.ecc_uncorrected_volatile.filter(|n| *n > 0) {
            add(
                "ecc",
                Severity::Critical,
                n as f64,
                0.0,
                format!("{n} uncorrectable ECC errors since the driver loaded"),
            );
        }
        if gpu.remapped_rows_failed == Some(true) {
            add("remap", Severity::Critical, 1.0, 0.0, "a row remap failed: the GPU needs service".into());
        } else if gpu.remapped_rows_pending == Some(true) {
            add("remap", Severity::Warning, 1.0, 0.0, "a row remap is pending: reset the GPU when it is idle".into());
        }
        let held: Vec<ThrottleReason> =
            gpu.throttle_reasons.iter().flatten().copied().filter(|r| r.is_hardware()).collect();
        let held_s = gpu.hw_throttled_since_ms.map(|since| now_ms.saturating_sub(since) as f64 / 1000.0);
        if !held.is_empty() && held_s.is_some_and(|s| s >= t.gpu_throttle_sustained_s) {
            let severity =
                if held.contains(&ThrottleReason::HwPowerBrake) || held.contains(&ThrottleReason::HwThermalSlowdown) {
                    Severity::Error
                } else {
                    Severity::Warning
                };
            let (s, threshold) = (held_s.unwrap_or(0.0), t.gpu_throttle_sustained_s);
            add(
                "throttle",
                severity,
                s,
                threshold,
                format!(
                    "clocks held down by {} for {s:.0} s",
                    held.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(", ")
                ),
            );
        }
        if let Some(&pct) = memory_used.get(&source) {
            if pct > t.gpu_memory_used_pct_warning {
                let threshold = t.gpu_memory_used_pct_warning;
                add(
                    "memory",
                    Severity::Warning,
                    pct,
                    threshold,
                    format!("{pct:.1}% of GPU memory in use (threshold {threshold}%)"),
                );
            }
        }
        let (threshold, against) = match gpu.temperature_slowdown_c {
            Some(slowdown) => {
                let threshold = f64::from(slowdown) - t.gpu_temperature_margin_c;
                (threshold, format!("over {threshold} °C; it slows itself down at {slowdown} °C"))
            }
            None => (t.gpu_temperature_c_warning, format!("threshold {} °C", t.gpu_temperature_c_warning)),
        };
        if let Some(&c) = temperature.get(&source).filter(|c| **c > threshold) {
            add("temperature", Severity::Warning, c, threshold, format!("{c:.0} °C ({against})"));
        }
    }
}

/// Steps a job must have made in its recent window, and in the hour before, before its step
/// time is compared with itself.
const MIN_RECENT_STEPS: u64 = 5;
const MIN_BASELINE_STEPS: u64 = 20;
/// Share of its recent window a job must have been observed before it is called input-bound.
const MIN_OBSERVED_SHARE: f64 = 0.8;

/// The job-aware conditions: a hung collective, an input-bound job, a step-time regression.
/// Each is the job's own alert (source `job:<pid>`), labelled with its pid, name and command.
fn job_conditions(t: &Thresholds, view: &View, job_window_ms: u64, found: &mut Vec<Condition>) {
    for job in crate::metrics::jobs(view) {
        let main = job.main;
        // A job of a user not admitted for alerting is shown, and raises nothing.
        if main.untrusted {
            continue;
        }
        let labels: BTreeMap<String, String> =
            ["job", "comm", "command"].into_iter().map(String::from).zip(job.labels()).collect();
        let mut add = |alert_type: AlertType, severity: Severity, value: f64, threshold: f64, message: String| {
            found.push(Condition {
                alert_type,
                rule: None,
                labels: labels.clone(),
                source: job.source(),
                severity,
                value,
                threshold,
                message: format!("job {} ({}): {message}", main.job, main.comm),
            });
        };
        let stalled = job.collective_stalled_s(view.now_ms);
        if stalled >= t.collective_hang_s {
            let waiting = job.members.iter().filter(|p| p.collective_waiting_since_ms.is_some()).count();
            add(
                AlertType::CollectiveHang,
                Severity::Critical,
                stalled,
                t.collective_hang_s,
                format!(
                    "waiting in an NCCL collective for {stalled:.0} s with none returning (threshold {} s); \
                     {waiting} of its {} processes wait in one",
                    t.collective_hang_s,
                    job.members.len()
                ),
            );
        }
        let loading = main.recent_phase_pct.get(Phase::DataLoading);
        let observed = main.recent_observed_ms as f64 >= job_window_ms as f64 * MIN_OBSERVED_SHARE;
        if observed && job_window_ms > 0 && loading > t.input_bound_pct {
            add(
                AlertType::InputBound,
                Severity::Warning,
                loading,
                t.input_bound_pct,
                format!(
                    "loading data {loading:.0}% of the last {} s (threshold {}%): the GPU waits for input",
                    job_window_ms / 1000,
                    t.input_bound_pct
                ),
            );
        }
        if let Some(s) = &main.steps {
            let baseline = s.hour_p99_ms as f64;
            let enough = s.recent_count >= MIN_RECENT_STEPS && s.hour_count >= MIN_BASELINE_STEPS && baseline > 0.0;
            let factor = s.recent_p99_ms as f64 / baseline.max(1.0);
            if enough && factor >= t.step_p99_regression_factor {
                add(
                    AlertType::StepTimeRegression,
                    Severity::Warning,
                    factor,
                    t.step_p99_regression_factor,
                    format!(
                        "step time p99 {:.2} s over the last {} s, {factor:.1}x its {:.2} s over the hour before",
                        s.recent_p99_ms as f64 / 1000.0,
                        job_window_ms / 1000,
                        baseline / 1000.0
                    ),
                );
            }
        }
    }
}

/// Every alert condition that holds for this tick.
pub fn conditions(t: &Thresholds, sample: &Sample, failures: &[(String, String)]) -> Vec<Condition> {
    let mut found = Vec::new();
    let window_s = sample.readings.window.covered_ms as f64 / 1000.0;
    let view = View::of_sample(sample);
    let drop_rate = readings("kernel.drop_rate", &view);
    let latency_ms = readings("kernel.avg_latency_ms", &view);

    for kernel in &sample.readings.kernels {
        let source = format!("kernel:{}", kernel.id);
        if let Some(&rate) = drop_rate.get(&source) {
            let levels = [
                (t.drop_rate_warning, Severity::Warning),
                (t.drop_rate_error, Severity::Error),
                (t.drop_rate_critical, Severity::Critical),
            ];
            if let Some((severity, threshold)) = level(rate, levels) {
                found.push(Condition {
                    alert_type: AlertType::HighDropRate,
                    rule: None,
                    labels: BTreeMap::new(),
                    source: source.clone(),
                    severity,
                    value: rate,
                    threshold,
                    message: format!(
                        "{} drops {:.1}% of its messages (over {window_s:.0} s; threshold {:.1}%)",
                        kernel.id,
                        rate * 100.0,
                        threshold * 100.0
                    ),
                });
            }
        }
        if let Some(&ms) = latency_ms.get(&source) {
            let warn = t.latency_warning_ms;
            let levels = [
                (warn, Severity::Warning),
                (warn * t.latency_error_factor, Severity::Error),
                (warn * t.latency_critical_factor, Severity::Critical),
            ];
            if let Some((severity, threshold)) = level(ms, levels) {
                found.push(Condition {
                    alert_type: AlertType::HighLatency,
                    rule: None,
                    labels: BTreeMap::new(),
                    source: source.clone(),
                    severity,
                    value: ms,
                    threshold,
                    message: format!(
                        "{} mean latency {ms:.2} ms over {window_s:.0} s (threshold {threshold} ms)",
                        kernel.id
                    ),
                });
            }
        }
        let queues = [
            ("input", kernel.input_queue_depth, kernel.input_queue_capacity),
            ("output", kernel.output_queue_depth, kernel.output_queue_capacity),
        ];
        if let Some((name, depth, capacity)) = queues
            .into_iter()
            .filter(|(_, depth, capacity)| {
                *capacity > 0 && f64::from(*depth) >= t.queue_full_ratio * f64::from(*capacity)
            })
            .max_by(|a, b| (a.1 as f64 / a.2 as f64).total_cmp(&(b.1 as f64 / b.2 as f64)))
        {
            found.push(Condition {
                alert_type: AlertType::QueueNearFull,
                rule: None,
                labels: BTreeMap::new(),
                source: source.clone(),
                severity: if depth >= capacity { Severity::Error } else { Severity::Warning },
                value: f64::from(depth) / f64::from(capacity),
                threshold: t.queue_full_ratio,
                message: format!("{} {name} queue holds {depth} of {capacity} messages", kernel.id),
            });
        }
        if kernel.state == KernelState::Failed || kernel.last_error.is_some() {
            let failed = kernel.state == KernelState::Failed;
            found.push(Condition {
                alert_type: AlertType::KernelError,
                rule: None,
                labels: BTreeMap::new(),
                source,
                severity: if failed { Severity::Critical } else { Severity::Error },
                value: 1.0,
                threshold: 0.0,
                message: format!(
                    "{} {}: {}",
                    kernel.id,
                    if failed { "failed" } else { "reported an error" },
                    kernel.last_error.as_deref().unwrap_or("no detail given")
                ),
            });
        }
    }

    if let Some(&used) = readings("host.memory_used_pct", &view).get("host") {
        let levels = [
            (t.memory_used_pct_warning, Severity::Warning),
            (t.memory_used_pct_error, Severity::Error),
            (t.memory_used_pct_critical, Severity::Critical),
        ];
        let by_use = level(used, levels);
        let stall = readings("host.pressure.memory_some_avg10", &view).get("host").copied().unwrap_or(0.0);
        let by_stall = (stall > t.memory_stall_pct_warning).then_some((Severity::Warning, t.memory_stall_pct_warning));
        let worst = match (by_use, by_stall) {
            (Some(a), Some(b)) => Some(if b.0 > a.0 { (b, true) } else { (a, false) }),
            (Some(a), None) => Some((a, false)),
            (None, Some(b)) => Some((b, true)),
            (None, None) => None,
        };
        if let Some(((severity, threshold), stalled)) = worst {
            let (value, message) = if stalled {
                (stall, format!("tasks stalled on memory {stall:.1}% of the last 10 s (threshold {threshold}%); {used:.1}% of memory in use"))
            } else {
                (used, format!("{used:.1}% of memory in use (threshold {threshold}%)"))
            };
            found.push(Condition {
                alert_type: AlertType::MemoryPressure,
                rule: None,
                labels: BTreeMap::new(),
                source: "host".into(),
                severity,
                value,
                threshold,
                message,
            });
        }
    }

    gpu_conditions(t, &view, sample.taken_at_ms, &mut found);
    if let Some(scheduler) = &sample.readings.scheduler {
        job_conditions(t, &view, scheduler.job_window_ms, &mut found);
    }

    // Ejected sched_ext scheduler: a standing condition while the daemon runs on the fallback.
    if let Some(exit) = sample.readings.scheduler.as_ref().and_then(|s| s.scx.as_ref()).and_then(|x| x.exit.as_ref()) {
        if exit.ejected {
            found.push(Condition {
                alert_type: AlertType::SchedulerEjected,
                rule: None,
                labels: BTreeMap::from([("kind".to_string(), exit.kind.as_str().to_string())]),
                source: "scheduler:sched_ext".into(),
                severity: Severity::Critical,
                value: 1.0,
                threshold: 0.0,
                message: format!(
                    "the kernel stopped the sched_ext scheduler ({}: {}{}); decisions are carried out with setattr",
                    exit.kind.as_str(),
                    exit.reason,
                    if exit.message.is_empty() { String::new() } else { format!(", {}", exit.message) }
                ),
            });
        }
    }

    for (name, why) in failures {
        found.push(Condition {
            alert_type: AlertType::SourceFailure,
            rule: None,
            labels: BTreeMap::new(),
            source: format!("source:{name}"),
            severity: Severity::Error,
            value: 1.0,
            threshold: 0.0,
            message: format!("metrics source {name} failed: {why}"),
        });
    }
    found
}

/// A value as Prometheus and Alertmanager write numbers (`NaN`, `+Inf`, `-Inf` by name).
pub fn number(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value.is_infinite() {
        if value > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else {
        format!("{value}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_conditions_read_are_in_the_registry() {
        for name in READ {
            assert!(RuleMetric::find(name).is_some(), "{name}");
        }
    }
    use ringside_shared::{KernelBackend, KernelWindow, MemoryMetrics, RingKernelMetrics};

    fn kernel(id: &str, depth: u32, state: KernelState, error: Option<&str>) -> RingKernelMetrics {
        RingKernelMetrics {
            id: id.into(),
            kernel: "echo".into(),
            backend: KernelBackend::Cpu,
            state,
            messages_processed: 0,
            messages_dropped: 0,
            total_latency_ns: 0,
            min_latency_ns: None,
            max_latency_ns: 0,
            latency_p50_ns: None,
            latency_p90_ns: None,
            latency_p99_ns: None,
            latency_p999_ns: None,
            input_queue_depth: depth,
            input_queue_capacity: 100,
            output_queue_depth: 0,
            output_queue_capacity: 100,
            last_error: error.map(str::to_string),
            gpu_memory_used: 0,
            host_memory_bytes: 0,
            bytes_in: 0,
            bytes_out: 0,
            uptime_ms: 0,
            drop_rate: 0.0,
            output_stats: None,
        }
    }

    fn window(id: &str, drop_rate: Option<f64>, latency_ms: Option<f64>) -> ringside_shared::WindowAggregates {
        ringside_shared::WindowAggregates {
            window_ms: 10_000,
            covered_ms: 10_000,
            kernels: vec![KernelWindow {
                id: id.into(),
                processed: 100,
                dropped: 0,
                drop_rate,
                throughput_per_s: 10.0,
                avg_latency_ns: latency_ms.map(|ms| ms * 1e6),
            }],
            ..Default::default()
        }
    }

    fn kernel_sample(k: RingKernelMetrics) -> Sample {
        let mut sample = Sample::new(0);
        sample.readings.kernels.push(k);
        sample
    }

    fn severities(cs: &[Condition], ty: AlertType) -> Vec<Severity> {
        cs.iter().filter(|c| c.alert_type == ty).map(|c| c.severity).collect()
    }

    #[test]
    fn gpus_in_trouble_raise_one_alert_each_by_kind() {
        use ringside_shared::{GpuDevice, GpuTelemetry};
        let t = Thresholds::default();
        let healthy = GpuDevice {
            index: 0,
            uuid: "GPU-0".into(),
            memory_used_bytes: Some(50),
            memory_total_bytes: Some(100),
            temperature_gpu_c: Some(60),
            throttle_reasons: Some(vec![ThrottleReason::GpuIdle, ThrottleReason::SwPowerCap]),
            ecc_uncorrected_volatile: Some(0),
            ..GpuDevice::default()
        };
        let troubled = GpuDevice {
            index: 1,
            uuid: "GPU-1".into(),
            memory_used_bytes: Some(97),
            memory_total_bytes: Some(100),
            temperature_gpu_c: Some(91),
            throttle_reasons: Some(vec![ThrottleReason::HwThermalSlowdown]),
            hw_throttled_since_ms: Some(5_000),
            ecc_uncorrected_volatile: Some(2),
            remapped_rows_pending: Some(true),
            ..GpuDevice::default()
        };
        let lost = GpuDevice {
            index: 2,
            uuid: "GPU-2".into(),
            unsupported: [("gpu".to_string(), "the GPU is lost".to_string())].into(),
            ..GpuDevice::default()
        };
        let mut sample = Sample::new(20_000);
        sample.readings.gpus =
            Some(GpuTelemetry { available: true, devices: vec![healthy, troubled, lost], ..GpuTelemetry::default() });
        let found = conditions(&t, &sample, &[]);
        let gpu: Vec<(&str, Severity)> = found
            .iter()
            .filter(|c| c.alert_type == AlertType::GpuHealth)
            .map(|c| (c.source.as_str(), c.severity))
            .collect();
        assert_eq!(
            gpu,
            [
                ("gpu:1/ecc", Severity::Critical),
                ("gpu:1/remap", Severity::Warning),
                ("gpu:1/throttle", Severity::Error),
                ("gpu:1/memory", Severity::Warning),
                ("gpu:1/temperature", Severity::Warning),
                ("gpu:2/lost", Severity::Critical),
            ],
            "a power cap or idling is no trouble"
        );
        // XIDs: critical codes are critical, others warnings, and only the last 5 min count.
        let xid = |code, at_ms| ringside_shared::GpuXid { code, at_ms, description: None };
        let mut gpus = sample.readings.gpus.clone().unwrap();
        gpus.devices[0].xids = vec![xid(79, 1_000), xid(13, 400_000)];
        gpus.devices[1].xids = vec![xid(13, 400_000)];
        sample.readings.gpus = Some(gpus);
        sample.taken_at_ms = 500_000;
        let xids: Vec<(String, Severity, f64)> = conditions(&t, &sample, &[])
            .into_iter()
            .filter(|c| c.source.ends_with("/xid"))
            .map(|c| (c.source, c.severity, c.value))
            .collect();
        assert_eq!(
            xids,
            [("gpu:0/xid".to_string(), Severity::Warning, 1.0), ("gpu:1/xid".to_string(), Severity::Warning, 1.0)],
            "XID 79 is over 5 min old: only the 13s count"
        );
        let ecc = found.iter().find(|c| c.source == "gpu:1/ecc").unwrap();
        assert_eq!(ecc.labels["uuid"], "GPU-1");
        assert!(ecc.message.contains("2 uncorrectable ECC errors"), "{}", ecc.message);
    }

    #[test]
    fn gpu_heat_is_judged_against_its_own_slowdown_and_throttling_must_last() {
        use ringside_shared::{GpuDevice, GpuTelemetry};
        let t = Thresholds::default();
        let alerts = |gpu: GpuDevice, now_ms: u64| -> Vec<(String, f64, f64)> {
            let mut sample = Sample::new(now_ms);
            sample.readings.gpus =
                Some(GpuTelemetry { available: true, devices: vec![gpu], ..GpuTelemetry::default() });
            conditions(&t, &sample, &[])
                .into_iter()
                .filter(|c| c.alert_type == AlertType::GpuHealth)
                .map(|c| (c.source, c.value, c.threshold))
                .collect()
        };
        let gpu = |temp, slowdown| GpuDevice {
            uuid: "GPU-0".into(),
            temperature_gpu_c: Some(temp),
            temperature_slowdown_c: slowdown,
            ..GpuDevice::default()
        };
        // Slowdown at 80 °C: the warning starts above 75 (default margin 5), below the fixed 85.
        assert_eq!(alerts(gpu(75, Some(80)), 1), []);
        assert_eq!(alerts(gpu(77, Some(80)), 1), [("gpu:0/temperature".to_string(), 77.0, 75.0)]);
        // A GPU that slows down only at 95 °C is fine at 86 °C; without a threshold, 85 applies.
        assert_eq!(alerts(gpu(86, Some(95)), 1), []);
        assert_eq!(alerts(gpu(86, None), 1), [("gpu:0/temperature".to_string(), 86.0, 85.0)]);

        let throttled = |since| GpuDevice {
            uuid: "GPU-0".into(),
            throttle_reasons: Some(vec![ThrottleReason::HwPowerBrake]),
            hw_throttled_since_ms: since,
            ..GpuDevice::default()
        };
        assert_eq!(alerts(throttled(Some(100_000)), 109_000), [], "9 s of power brake is a blip");
        assert_eq!(alerts(throttled(Some(100_000)), 110_000), [("gpu:0/throttle".to_string(), 10.0, 10.0)]);
        assert_eq!(alerts(throttled(None), 110_000), [], "no start seen: not yet sustained");
    }

    #[test]
    fn drop_rate_thresholds_are_the_defaults() {
        let t = Thresholds::default();
        let sample = kernel_sample(kernel("k", 0, KernelState::Active, None));
        for (rate, expected) in [
            (0.005, vec![]),
            (0.01, vec![]),
            (0.02, vec![Severity::Warning]),
            (0.06, vec![Severity::Error]),
            (0.11, vec![Severity::Critical]),
        ] {
            let mut sample = sample.clone();
            sample.readings.window = window("k", Some(rate), None);
            let cs = conditions(&t, &sample, &[]);
            assert_eq!(severities(&cs, AlertType::HighDropRate), expected, "rate {rate}");
        }
    }

    #[test]
    fn latency_thresholds_scale_from_the_warning() {
        let t = Thresholds::default();
        let sample = kernel_sample(kernel("k", 0, KernelState::Active, None));
        for (ms, expected) in [
            (5.0, vec![]),
            (11.0, vec![Severity::Warning]),
            (51.0, vec![Severity::Error]),
            (101.0, vec![Severity::Critical]),
        ] {
            let mut sample = sample.clone();
            sample.readings.window = window("k", None, Some(ms));
            let cs = conditions(&t, &sample, &[]);
            assert_eq!(severities(&cs, AlertType::HighLatency), expected, "{ms} ms");
        }
    }

    #[test]
    fn queue_error_and_memory_conditions() {
        let t = Thresholds::default();
        let cs = conditions(&t, &kernel_sample(kernel("k", 90, KernelState::Active, None)), &[]);
        assert_eq!(severities(&cs, AlertType::QueueNearFull), vec![Severity::Warning]);
        let cs = conditions(&t, &kernel_sample(kernel("k", 89, KernelState::Failed, Some("device lost"))), &[]);
        assert!(severities(&cs, AlertType::QueueNearFull).is_empty());
        assert_eq!(severities(&cs, AlertType::KernelError), vec![Severity::Critical]);
        assert!(cs.iter().any(|c| c.message.contains("device lost")));

        let mut sample = Sample::new(0);
        let memory = |used_pct: f64| MemoryMetrics {
            total_bytes: 100,
            available_bytes: 0,
            used_bytes: 0,
            used_pct,
            cached_bytes: 0,
            swap_total_bytes: 0,
            swap_used_bytes: 0,
        };
        let mut host = crate::host::HostSource::new(Default::default());
        crate::pipeline::MetricsSource::collect(&mut host, &mut sample).unwrap();
        let mut h = sample.readings.host.take().unwrap();
        h.pressure = None;
        for (used, expected) in [
            (50.0, vec![]),
            (91.0, vec![Severity::Warning]),
            (96.0, vec![Severity::Error]),
            (99.0, vec![Severity::Critical]),
        ] {
            h.memory = memory(used);
            let s = Sample {
                readings: ringside_shared::Readings { host: Some(h.clone()), ..Default::default() },
                ..Sample::new(0)
            };
            assert_eq!(severities(&conditions(&t, &s, &[]), AlertType::MemoryPressure), expected);
        }
        let mut ejected = Sample::new(0);
        ejected.readings.scheduler = Some(ringside_shared::SchedulerTelemetry {
            scx: Some(ringside_shared::ScxStatus {
                exit: Some(ringside_shared::ScxExitInfo {
                    kind: ringside_shared::ScxExitKind::WatchdogStall,
                    reason: "runnable task stall".into(),
                    ejected: true,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        let cs = conditions(&t, &ejected, &[]);
        assert_eq!(severities(&cs, AlertType::SchedulerEjected), vec![Severity::Critical]);
        assert!(cs[0].message.contains("watchdog_stall: runnable task stall"), "{}", cs[0].message);
        let failures = vec![("bpf".to_string(), "permission denied".to_string())];
        let cs = conditions(&t, &Sample::new(0), &failures);
        assert_eq!(cs[0].source, "source:bpf");
    }
}

#[cfg(test)]
mod job_tests {
    use super::*;
    use ringside_shared::{MlProcessInfo, PhaseValues, ProcessRole, SchedulerTelemetry, StepTimes};

    fn job(now_ms: u64, processes: Vec<MlProcessInfo>) -> Vec<Condition> {
        let mut sample = Sample::new(now_ms);
        sample.readings.scheduler =
            Some(SchedulerTelemetry { processes, job_window_ms: 300_000, ..SchedulerTelemetry::default() });
        let t = Thresholds { collective_hang_s: 60.0, ..Thresholds::default() };
        conditions(&t, &sample, &[])
    }

    fn main(pid: u32) -> MlProcessInfo {
        MlProcessInfo {
            pid,
            job: pid,
            comm: "python3".into(),
            cmdline: "python3 train.py".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_job_waiting_in_a_collective_with_none_returning_hangs_once_past_the_threshold() {
        let now = 1_000_000;
        // The main process has waited 61 s; its worker returned from one 30 s ago: the
        // job's stall counts from the later of the two.
        let waiting = MlProcessInfo { collective_waiting_since_ms: Some(now - 61_000), ..main(10) };
        let worker = MlProcessInfo {
            pid: 11,
            job: 10,
            role: ProcessRole::Worker,
            collective_returned_ms: Some(now - 30_000),
            ..Default::default()
        };
        assert!(job(now, vec![waiting.clone(), worker]).is_empty(), "30 s without progress is under 60 s");
        let found = job(now, vec![waiting.clone()]);
        let hang = found.iter().find(|c| c.alert_type == AlertType::CollectiveHang).expect("a hang");
        assert_eq!((hang.source.as_str(), hang.severity, hang.value), ("job:10", Severity::Critical, 61.0));
        assert_eq!(hang.labels["command"], "python3 train.py");
        assert_eq!(hang.labels["job"], "10");
        assert!(hang.message.contains("1 of its 1 processes wait"), "{}", hang.message);
        // Nobody waiting: no hang, however long ago the last return.
        let idle = MlProcessInfo { collective_returned_ms: Some(now - 600_000), ..main(10) };
        assert!(job(now, vec![idle]).is_empty());
    }

    #[test]
    fn input_bound_needs_the_share_over_a_window_mostly_observed() {
        let now = 1_000_000;
        let share = |pct: f64, observed_ms: u64| MlProcessInfo {
            recent_phase_pct: PhaseValues { data_loading: pct, gpu_compute: 100.0 - pct, ..Default::default() },
            recent_observed_ms: observed_ms,
            ..main(10)
        };
        let types = |p: MlProcessInfo| job(now, vec![p]).into_iter().map(|c| c.alert_type).collect::<Vec<_>>();
        assert_eq!(types(share(62.0, 290_000)), [AlertType::InputBound]);
        assert!(types(share(62.0, 100_000)).is_empty(), "a job just started is not judged yet");
        assert!(types(share(40.0, 300_000)).is_empty());
    }

    #[test]
    fn a_step_time_p99_doubled_against_the_hour_before_is_a_regression() {
        let now = 1_000_000;
        let steps = |recent_p99_ms: u64, recent_count: u64, hour_count: u64| MlProcessInfo {
            steps: Some(StepTimes { recent_count, recent_p99_ms, hour_count, hour_p99_ms: 1000, ..Default::default() }),
            ..main(10)
        };
        let found = job(now, vec![steps(2500, 10, 100)]);
        let regression = found.iter().find(|c| c.alert_type == AlertType::StepTimeRegression).expect("regressed");
        assert_eq!((regression.value, regression.threshold), (2.5, 2.0));
        assert!(job(now, vec![steps(1900, 10, 100)]).is_empty(), "under twice");
        assert!(job(now, vec![steps(2500, 3, 100)]).is_empty(), "too few recent steps");
        assert!(job(now, vec![steps(2500, 10, 5)]).is_empty(), "too few before");
    }
}
