//! The scheduler as a metrics source: the BPF probe's per-thread counters joined with the ML
//! process detector.
//!
//! What exists so far is observation: tracked threads and ML threads. Phase detection and
//! decisions do not exist yet, so every ML thread is counted in the `unknown` phase and the
//! component says so as its degraded reason — rather than show phases it cannot tell apart.
//! Without BPF privileges the source is down with the reason, and the daemon serves the rest.

use std::collections::HashSet;

use ringside_bpf::SchedProbe;
use ringside_shared::{PhaseValues, SchedulerTelemetry};

use super::ml::{MlDetector, DEFAULT_LIBRARIES};
use crate::pipeline::{MetricsSource, Sample, SourceError, SourceStatus};

/// `[scheduler]` in the config.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    /// Load the BPF probe and report scheduler telemetry.
    pub enabled: bool,
    /// Command-line substrings that mark a process as ML work (besides the libraries it maps).
    pub ml_patterns: Vec<String>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig { enabled: true, ml_patterns: Vec::new() }
    }
}

pub const NOT_YET: &str =
    "observing threads and ML processes; phase detection and decisions are not implemented yet, so ML threads count as `unknown`";

pub struct SchedulerSource {
    probe: Result<SchedProbe, String>,
    detector: MlDetector,
    numa_nodes: u32,
    total_cpus: u32,
}

impl SchedulerSource {
    /// Loads the probe; a failure is kept and reported on every tick, not fatal.
    pub fn start(cmdline_patterns: Vec<String>, numa_nodes: u32, total_cpus: u32) -> SchedulerSource {
        let probe = SchedProbe::load().map_err(|e| e.to_string());
        if let Err(why) = &probe {
            tracing::warn!("scheduler unavailable: {why}");
        }
        let libraries = DEFAULT_LIBRARIES.iter().map(|s| s.to_string()).collect();
        SchedulerSource { probe, detector: MlDetector::new(libraries, cmdline_patterns), numa_nodes, total_cpus }
    }
}

impl MetricsSource for SchedulerSource {
    fn name(&self) -> &str {
        "scheduler"
    }

    fn collect(&mut self, sample: &mut Sample) -> Result<SourceStatus, SourceError> {
        // Unavailable is a standing state of this node, not a failing collection: say why in
        // the component's health rather than raise an alert every start.
        let probe = match &self.probe {
            Ok(probe) => probe,
            Err(why) => return Ok(SourceStatus::Degraded(format!("scheduler unavailable: {why}"))),
        };
        let threads = probe.threads();
        let ml: HashSet<u32> = self.detector.scan().into_iter().map(|p| p.pid).collect();
        let ml_tasks = threads.iter().filter(|t| ml.contains(&t.tgid)).count() as u64;
        sample.scheduler = Some(SchedulerTelemetry {
            total_tracked_tasks: threads.len() as u64,
            ml_tasks,
            decisions_made: 0,
            phase_transitions: 0,
            phase_distribution: PhaseValues { unknown: ml_tasks, ..PhaseValues::default() },
            phase_time_pct: PhaseValues { unknown: if ml_tasks > 0 { 100.0 } else { 0.0 }, ..PhaseValues::default() },
            numa_nodes: self.numa_nodes,
            total_cpus: self.total_cpus,
        });
        Ok(SourceStatus::Degraded(NOT_YET.into()))
    }
}
