//! Ring kernels in the daemon: each `[[kernels]]` entry is launched at start and becomes a
//! metrics source that also feeds it work every tick:
//!
//! - `echo` is the canary: one probe per tick; a probe unanswered for `answer_timeout_ms` marks
//!   the kernel as not answering (a `kernel_error` alert) until it answers again, and its round
//!   trip feeds the `high_latency` alert;
//! - `stats` is fed the run-queue latencies (µs) of the threads the scheduler's probe tracks
//!   (`input = "runq_latency"`, the default) or the host's per-CPU utilisation each tick
//!   (`input = "cpu_utilization"`); its latest summary is reported with its metrics;
//! - `saxpy` gets `batches` synthetic vectors per tick, a steady throughput load.

use std::time::{Duration, Instant};

use ringside_kernels::builtin;
use ringside_kernels::{Backend, Backpressure, Kernel, KernelError, LaunchOptions};
use ringside_shared::{KernelBackend, KernelKind, KernelState, KernelStateChange, KernelStatsOutput, StatsInput};
use serde::Deserialize;

use crate::invalid::Invalid;
use crate::pipeline::{Feed, MetricsSource, Sample, SourceError, SourceStatus};

/// A `[[kernels]]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelConfig {
    pub id: String,
    pub kernel: KernelKind,
    #[serde(default)]
    pub backend: KernelBackend,
    #[serde(default = "default_capacity")]
    pub queue_capacity: usize,
    #[serde(default = "default_message_size")]
    pub message_size: usize,
    #[serde(default)]
    pub backpressure: BackpressureChoice,
    #[serde(default = "default_wait_ms")]
    pub wait_timeout_ms: u64,
    /// Canary: how long a probe may go unanswered.
    #[serde(default = "default_answer_ms")]
    pub answer_timeout_ms: u64,
    /// `saxpy`: vectors sent per tick.
    #[serde(default = "default_batches")]
    pub batches: u32,
    /// `stats`: what it is fed.
    #[serde(default = "default_input")]
    pub input: StatsInput,
}

/// What a kernel's input ring does when it is full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackpressureChoice {
    /// Drop the message and count it.
    #[default]
    Drop,
    /// Wait up to `wait_timeout_ms`, then drop and count.
    Wait,
}
fn default_capacity() -> usize {
    1024
}
fn default_message_size() -> usize {
    256
}
fn default_wait_ms() -> u64 {
    10
}
fn default_answer_ms() -> u64 {
    2000
}
fn default_batches() -> u32 {
    100
}
fn default_input() -> StatsInput {
    StatsInput::RunqLatency
}

impl KernelConfig {
    /// The kernel every node runs unless the config says otherwise: an `echo` canary.
    pub fn canary() -> KernelConfig {
        KernelConfig {
            id: "canary".into(),
            kernel: KernelKind::Echo,
            backend: KernelBackend::Cpu,
            queue_capacity: 64,
            message_size: 64,
            backpressure: BackpressureChoice::Drop,
            wait_timeout_ms: default_wait_ms(),
            answer_timeout_ms: default_answer_ms(),
            batches: default_batches(),
            input: default_input(),
        }
    }

    /// Checks one entry; the message names the kernel and the key.
    pub fn check(&self) -> Result<LaunchOptions, Invalid> {
        let id_ok = !self.id.is_empty()
            && self.id.len() <= 64
            && self.id.chars().all(|c| c.is_ascii_alphanumeric() || "-_".contains(c));
        if !id_ok {
            return Err(Invalid::new("kernels.id", format!("{:?}", self.id), "1-64 letters, digits, '-' or '_'"));
        }
        let key = |name: &str| format!("kernels.{name} (kernel {})", self.id);
        if !self.queue_capacity.is_power_of_two() || !(2..=1 << 20).contains(&self.queue_capacity) {
            let why = "must be a power of two from 2 to 1048576";
            return Err(Invalid::new(key("queue_capacity"), self.queue_capacity, why));
        }
        let min_size =
            if self.kernel == KernelKind::Stats { ringside_kernels::builtin::StatsSummary::BYTES } else { 16 };
        Invalid::range(&key("message_size"), self.message_size, min_size, ringside_kernels::ring::MAX_MESSAGE)?;
        let backpressure = match self.backpressure {
            BackpressureChoice::Drop => Backpressure::DropAndCount,
            BackpressureChoice::Wait => {
                Invalid::range(&key("wait_timeout_ms"), self.wait_timeout_ms, 1, 10_000)?;
                Backpressure::WaitWithTimeout(Duration::from_millis(self.wait_timeout_ms))
            }
        };
        Invalid::range(&key("answer_timeout_ms"), self.answer_timeout_ms, 100, 600_000)?;
        Invalid::range(&key("batches"), self.batches, 0, 100_000)?;
        Ok(LaunchOptions { queue_capacity: self.queue_capacity, message_size: self.message_size, backpressure })
    }
}

/// Checks a whole `[[kernels]]` list (ids unique).
pub fn check_all(configs: &[KernelConfig]) -> Result<(), Invalid> {
    for (i, config) in configs.iter().enumerate() {
        config.check()?;
        if configs[..i].iter().any(|c| c.id == config.id) {
            return Err(Invalid::new("kernels.id", format!("{:?}", config.id), "used twice"));
        }
    }
    Ok(())
}

/// A launched kernel as a metrics source.
pub struct KernelSource {
    name: String,
    config: KernelConfig,
    kernel: Kernel,
    last_state: KernelState,
    /// Why the kernel does not run as configured (e.g. CUDA asked for, CPU used).
    note: Option<String>,
    probe_seq: u64,
    /// The canary's unanswered probe: (sequence number, when it was sent).
    outstanding: Option<(u64, Instant)>,
    /// A `stats` kernel's latest result.
    stats: Option<builtin::StatsSummary>,
    /// Where a `runq_latency` stats kernel's input comes from: the scheduler, if it runs.
    runq: Option<Feed<u64>>,
    scratch: Vec<u8>,
}

impl KernelSource {
    /// `runq` is the scheduler's feed of run-queue latencies, for a `stats` kernel fed them.
    pub fn launch(config: KernelConfig, runq: Option<Feed<u64>>) -> Result<KernelSource, String> {
        let options = config.check().map_err(|e| e.to_string())?;
        let backend = match config.backend {
            KernelBackend::Cuda => Backend::Cuda,
            KernelBackend::Cpu => Backend::Cpu,
        };
        // A kernel asked for on CUDA that cannot run there still runs, on the CPU, and says why.
        let (kernel, note) = match Kernel::launch(config.id.clone(), config.kernel, backend, options) {
            Ok(kernel) => (kernel, None),
            Err(e @ (KernelError::CudaUnavailable(_) | KernelError::Cuda(_))) => {
                let kernel = Kernel::launch(config.id.clone(), config.kernel, Backend::Cpu, options)
                    .map_err(|e| e.to_string())?;
                (kernel, Some(format!("{e}; running on the CPU backend")))
            }
            Err(e) => return Err(e.to_string()),
        };
        kernel.activate().map_err(|e| e.to_string())?;
        if let Some(note) = &note {
            tracing::warn!(kernel = config.id, "{note}");
        }
        Ok(KernelSource {
            name: format!("kernel:{}", config.id),
            scratch: vec![0; config.message_size],
            config,
            kernel,
            last_state: KernelState::Created,
            note,
            probe_seq: 0,
            outstanding: None,
            stats: None,
            runq,
        })
    }

    /// Reads the canary's answers and sends the next probe; `Some(why)` while it does not answer.
    fn probe(&mut self) -> Option<String> {
        while let Some(len) = self.kernel.try_recv(&mut self.scratch) {
            if len >= 8 {
                let seq = u64::from_le_bytes(self.scratch[..8].try_into().unwrap_or_default());
                if self.outstanding.is_some_and(|(waiting, _)| waiting == seq) {
                    self.outstanding = None;
                }
            }
        }
        match self.outstanding {
            Some((_, sent)) if sent.elapsed() > Duration::from_millis(self.config.answer_timeout_ms) => {
                Some(format!("no answer to the canary probe for {} ms", sent.elapsed().as_millis()))
            }
            Some(_) => None,
            None => {
                self.probe_seq += 1;
                if self.kernel.send(&self.probe_seq.to_le_bytes()).is_ok() {
                    self.outstanding = Some((self.probe_seq, Instant::now()));
                }
                None
            }
        }
    }

    /// Keeps the latest summary the kernel answered with, then feeds it this tick's samples,
    /// as many messages as they fill. The first message the input ring refuses is counted as
    /// dropped and ends this tick's feeding (with `wait` backpressure each refusal would block
    /// the tick). `Some(why)` when its input is missing.
    fn feed_stats(&mut self, sample: &Sample) -> Option<String> {
        while let Some(len) = self.kernel.try_recv(&mut self.scratch) {
            if let Some(summary) = builtin::StatsSummary::decode(&self.scratch[..len.min(self.scratch.len())]) {
                self.stats = Some(summary);
            }
        }
        let (values, missing): (Vec<f32>, Option<&str>) = match self.config.input {
            StatsInput::CpuUtilization => match &sample.readings.host {
                Some(host) => (host.per_cpu_utilization_pct.iter().map(|v| *v as f32).collect(), None),
                None => (Vec::new(), Some("no host metrics this tick")),
            },
            // Microseconds: f32 keeps them exact to well below a microsecond up to seconds.
            StatsInput::RunqLatency => match self.runq.as_ref().map(Feed::take) {
                Some(Some(ns)) => (ns.iter().map(|ns| *ns as f32 / 1000.0).collect(), None),
                Some(None) => (Vec::new(), Some("no run-queue samples yet: the scheduler is starting")),
                None => (Vec::new(), Some("no run-queue samples: the scheduler is not running")),
            },
        };
        for chunk in values.chunks((self.config.message_size / 4).max(1)) {
            let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
            if self.kernel.send(&bytes).is_err() {
                break;
            }
        }
        missing.map(str::to_string)
    }

    /// The summary in the snapshot's vocabulary.
    fn output_stats(&self) -> Option<KernelStatsOutput> {
        let summary = self.stats?;
        Some(KernelStatsOutput {
            input: self.config.input,
            unit: self.config.input.unit(),
            count: summary.count,
            mean: summary.mean.into(),
            p50: summary.p50.into(),
            p90: summary.p90.into(),
            p99: summary.p99.into(),
            max: summary.max.into(),
        })
    }

    fn feed_saxpy(&mut self, tick: u64) {
        let pairs = ((self.config.message_size / 4).saturating_sub(1) / 2).min(32);
        let mut vector = Vec::with_capacity(4 + pairs * 8);
        vector.extend_from_slice(&2.0f32.to_le_bytes());
        for i in 0..pairs {
            vector.extend_from_slice(&(i as f32).to_le_bytes());
            vector.extend_from_slice(&((tick % 1000) as f32).to_le_bytes());
        }
        for _ in 0..self.config.batches {
            if self.kernel.send(&vector).is_err() {
                break;
            }
        }
        self.kernel.discard_output();
    }
}

impl MetricsSource for KernelSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn collect(&mut self, sample: &mut Sample) -> Result<SourceStatus, SourceError> {
        let (silent, missing_input) = match self.config.kernel {
            KernelKind::Echo => (self.probe(), None),
            KernelKind::Stats => (None, self.feed_stats(sample)),
            KernelKind::Saxpy => {
                self.feed_saxpy(sample.taken_at_ms / 1000);
                (None, None)
            }
        };
        let mut metrics = self.kernel.metrics();
        if let Some(why) = &silent {
            metrics.last_error = Some(why.clone());
        }
        metrics.output_stats = self.output_stats();
        if metrics.state != self.last_state {
            sample.kernel_events.push(KernelStateChange {
                kernel_id: metrics.id.clone(),
                from: self.last_state,
                to: metrics.state,
                at_ms: sample.taken_at_ms,
                reason: None,
            });
            self.last_state = metrics.state;
        }
        sample.readings.kernels.push(metrics);
        Ok(match silent.or_else(|| self.note.clone()).or(missing_input) {
            Some(why) => SourceStatus::Degraded(why),
            None => SourceStatus::Up,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_are_checked() {
        assert!(KernelConfig::canary().check().is_ok());
        let bad = |f: fn(&mut KernelConfig)| {
            let mut c = KernelConfig::canary();
            f(&mut c);
            c.check().unwrap_err().to_string()
        };
        assert!(bad(|c| c.queue_capacity = 1000).contains("power of two"));
        assert!(bad(|c| c.message_size = 65_536).contains("from 16 to 65535"));
        let mut largest = KernelConfig::canary();
        largest.message_size = 65_535;
        assert!(KernelSource::launch(largest, None).is_ok(), "the largest size the check lets through launches");
        assert!(bad(|c| {
            c.backpressure = BackpressureChoice::Wait;
            c.wait_timeout_ms = 0
        })
        .contains("wait_timeout_ms"));
        // Values outside the vocabulary are refused when the table is read, naming the choices.
        let parse = |text: &str| toml::from_str::<KernelConfig>(text).unwrap_err().to_string();
        assert!(parse("id = \"k\"\nkernel = \"fft\"\n").contains("expected one of `echo`, `stats`, `saxpy`"));
        assert!(parse("id = \"k\"\nkernel = \"echo\"\nbackend = \"tpu\"\n").contains("expected `cpu` or `cuda`"));
        let block = parse("id = \"k\"\nkernel = \"echo\"\nbackpressure = \"block\"\n");
        assert!(block.contains("expected `drop` or `wait`"), "{block}");
        assert!(bad(|c| c.id = "a b".into()).contains("letters"));
        let twice = vec![KernelConfig::canary(), KernelConfig::canary()];
        assert!(check_all(&twice).unwrap_err().to_string().contains("twice"));
    }

    #[test]
    fn the_canary_answers_and_reports_latency() {
        let mut source = KernelSource::launch(KernelConfig::canary(), None).unwrap();
        let mut first = Sample::new(1);
        source.collect(&mut first).unwrap();
        assert_eq!(first.kernel_events.len(), 1, "Created -> Active is announced");
        assert_eq!(first.kernel_events[0].to, KernelState::Active);
        std::thread::sleep(Duration::from_millis(50));
        let mut second = Sample::new(2);
        assert_eq!(source.collect(&mut second).unwrap(), SourceStatus::Up);
        let metrics = &second.readings.kernels[0];
        assert!(metrics.messages_processed >= 1);
        assert!(metrics.min_latency_ns.is_some() && metrics.latency_p50_ns.is_some());
        assert_eq!(metrics.last_error, None);
    }

    #[test]
    fn a_canary_that_stops_answering_is_an_error_until_it_answers_again() {
        let mut config = KernelConfig::canary();
        config.answer_timeout_ms = 100;
        let mut source = KernelSource::launch(config, None).unwrap();
        source.collect(&mut Sample::new(1)).unwrap();
        // The device stops: nothing is processed while the kernel is deactivated.
        std::thread::sleep(Duration::from_millis(20));
        source.collect(&mut Sample::new(2)).unwrap();
        source.kernel.deactivate().unwrap();
        source.collect(&mut Sample::new(3)).unwrap();
        std::thread::sleep(Duration::from_millis(150));
        let mut stalled = Sample::new(4);
        let status = source.collect(&mut stalled).unwrap();
        assert!(matches!(status, SourceStatus::Degraded(ref why) if why.contains("no answer")), "{status:?}");
        assert!(stalled.readings.kernels[0].last_error.as_deref().is_some_and(|e| e.contains("no answer")));
        let conditions = crate::alerts::conditions(&Default::default(), &stalled, &[]);
        assert!(conditions.iter().any(|c| c.alert_type == ringside_shared::AlertType::KernelError));
        // It answers again: the error clears.
        source.kernel.activate().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        source.collect(&mut Sample::new(5)).unwrap();
        let mut recovered = Sample::new(6);
        assert_eq!(source.collect(&mut recovered).unwrap(), SourceStatus::Up);
        assert_eq!(recovered.readings.kernels[0].last_error, None);
    }

    /// A stats kernel fed run-queue samples by `feed` (the scheduler's, in the daemon).
    fn stats_kernel(feed: Option<Feed<u64>>) -> KernelSource {
        let config =
            KernelConfig { id: "runq".into(), kernel: KernelKind::Stats, message_size: 64, ..KernelConfig::canary() };
        KernelSource::launch(config, feed).unwrap()
    }

    /// Collects until the kernel's summary has counted `count` samples.
    fn summary_of(source: &mut KernelSource, count: u64) -> KernelStatsOutput {
        for tick in 0..100 {
            let mut sample = Sample::new(100 + tick);
            source.collect(&mut sample).unwrap();
            if let Some(stats) = sample.readings.kernels[0].output_stats.clone().filter(|s| s.count == count) {
                return stats;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no summary of {count} samples");
    }

    #[test]
    fn stats_summarises_the_run_queue_latencies_it_is_fed() {
        let feed = Feed::new(1024);
        let mut source = stats_kernel(Some(feed.clone()));
        let mut sample = Sample::new(0);
        let starting = source.collect(&mut sample).unwrap();
        assert_eq!(starting, SourceStatus::Degraded("no run-queue samples yet: the scheduler is starting".into()));
        // 1..=100 µs, in ns, more than one message's worth (16 values a message).
        feed.publish(&mut (1..=100).map(|us| us * 1000).collect());
        let mut sample = Sample::new(1);
        assert_eq!(source.collect(&mut sample).unwrap(), SourceStatus::Up);
        let stats = summary_of(&mut source, 100);
        assert_eq!((stats.input.as_str(), stats.unit.as_str()), ("runq_latency", "us"));
        assert_eq!(stats.max, 100.0);
        assert!((stats.mean - 50.5).abs() < 1e-3, "{stats:?}");
        assert!((stats.p50 - 50.0).abs() <= 50.0 / 16.0, "{stats:?}");
        assert!((stats.p99 - 99.0).abs() <= 99.0 / 16.0, "{stats:?}");
        let metrics = source.kernel.metrics();
        assert!(metrics.messages_processed >= 7, "100 samples in messages of 16: {metrics:?}");
    }

    #[test]
    fn stats_without_the_scheduler_says_its_input_is_missing() {
        let mut source = stats_kernel(None);
        let mut sample = Sample::new(1);
        let status = source.collect(&mut sample).unwrap();
        assert_eq!(status, SourceStatus::Degraded("no run-queue samples: the scheduler is not running".into()));
        assert_eq!(sample.readings.kernels[0].output_stats, None);
        assert_eq!(source.kernel.metrics().messages_processed, 0, "nothing fed");
    }

    #[test]
    fn stats_inputs_are_checked() {
        let text = "id = \"s\"\nkernel = \"stats\"\ninput = \"gpu_temperature\"\n";
        let wrong = toml::from_str::<KernelConfig>(text).unwrap_err().to_string();
        assert!(wrong.contains("expected `runq_latency` or `cpu_utilization`"), "{wrong}");
        let cpu = toml::from_str::<KernelConfig>("id = \"s\"\nkernel = \"stats\"\ninput = \"cpu_utilization\"\n");
        assert_eq!(cpu.unwrap().input, StatsInput::CpuUtilization);
    }

    #[test]
    fn cuda_asked_for_runs_there_or_says_why_it_runs_on_the_cpu() {
        let mut config = KernelConfig::canary();
        config.backend = KernelBackend::Cuda;
        let mut source = KernelSource::launch(config, None).unwrap();
        let mut sample = Sample::new(1);
        let status = source.collect(&mut sample).unwrap();
        match ringside_kernels::cuda::probe() {
            // A GPU node: the canary runs on the device.
            Ok(_) => {
                assert_eq!(sample.readings.kernels[0].backend, ringside_shared::KernelBackend::Cuda);
                assert_eq!(status, SourceStatus::Up);
            }
            // On a node meant to have a usable GPU (scripts/gpu-check.sh sets this), the
            // fallback is the failure.
            Err(why) if std::env::var_os("RINGSIDE_REQUIRE_CUDA").is_some() => {
                panic!("RINGSIDE_REQUIRE_CUDA is set and the canary runs on the CPU: {why}")
            }
            Err(why) => {
                assert_eq!(sample.readings.kernels[0].backend, ringside_shared::KernelBackend::Cpu);
                let expected = format!("{why}; running on the CPU backend");
                assert!(expected.starts_with("cuda unavailable: "), "{expected}");
                assert_eq!(status, SourceStatus::Degraded(expected));
            }
        }
    }
}
