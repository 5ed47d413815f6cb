//! Alerts: the built-in checks ([`conditions`], reading the metric registry) and the config's
//! rules ([`rules`]) turn a tick into conditions; the [`store`] turns conditions into alerts
//! with a lifecycle, persisted in the [`db`] by its one [`writer`] thread; [`alertmanager`]
//! forwards them to a fleet's Alertmanager. [`config`] holds the subsystem's own settings.

pub mod alertmanager;
pub mod config;
pub mod db;
pub mod incidents;
pub mod kinds;
pub mod rules;
pub mod silences;
pub mod store;
pub mod writer;

use std::collections::BTreeMap;

use ringside_shared::{AlertType, Severity};

use crate::metrics::{Source, View};
use crate::pipeline::Sample;
pub use kinds::Thresholds;

/// A condition that holds in this tick.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub alert_type: AlertType,
    /// The config rule, for `AlertType::Rule`.
    pub rule: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub source: Source,
    pub severity: Severity,
    pub value: f64,
    pub threshold: f64,
    pub message: String,
}

/// Every condition of the built-in kinds ([`kinds::KINDS`]) that holds for this tick; the
/// sources that failed to collect are `failures` (name, why).
pub fn conditions(t: &Thresholds, sample: &Sample, failures: &[(String, String)]) -> Vec<Condition> {
    kinds::conditions(t, &kinds::Tick { view: View::of_sample(sample), failures })
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

    use ringside_shared::{KernelBackend, KernelState, KernelWindow, MemoryMetrics, RingKernelMetrics, ThrottleReason};

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
        let gpu: Vec<(String, Severity)> = found
            .iter()
            .filter(|c| c.alert_type == AlertType::GpuHealth)
            .map(|c| (c.source.to_string(), c.severity))
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
            ]
            .map(|(s, severity)| (s.to_string(), severity)),
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
            .filter(|c| matches!(c.source, Source::GpuCheck(_, "xid")))
            .map(|c| (c.source.to_string(), c.severity, c.value))
            .collect();
        assert_eq!(
            xids,
            [("gpu:0/xid".to_string(), Severity::Warning, 1.0), ("gpu:1/xid".to_string(), Severity::Warning, 1.0)],
            "XID 79 is over 5 min old: only the 13s count"
        );
        let ecc = found.iter().find(|c| c.source == Source::GpuCheck(1, "ecc")).unwrap();
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
                .map(|c| (c.source.to_string(), c.value, c.threshold))
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
        assert_eq!(cs[0].source, Source::Component("bpf".into()));
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
        let t = Thresholds::default().with(&kinds::COLLECTIVE_HANG_S, 60.0);
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
        assert_eq!((hang.source.to_string().as_str(), hang.severity, hang.value), ("job:10", Severity::Critical, 61.0));
        assert_eq!(hang.labels["command"], "python3 train.py");
        assert_eq!(hang.labels["job"], "10");
        assert!(hang.message.contains("1 of its 1 processes wait"), "{}", hang.message);
        assert!(!hang.labels.contains_key("job_id"), "no identity, no label");
        // Where its cgroup path and environment say who the job is, the alert says it too.
        let identity =
            ringside_shared::JobIdentity { run_id: Some("llm-7b".into()), rank: Some(5), ..Default::default() };
        let found = job(now, vec![MlProcessInfo { identity, ..waiting.clone() }]);
        let hang = found.iter().find(|c| c.alert_type == AlertType::CollectiveHang).expect("a hang");
        assert_eq!((hang.labels["job_id"].as_str(), hang.labels["rank"].as_str()), ("llm-7b", "5"));
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
