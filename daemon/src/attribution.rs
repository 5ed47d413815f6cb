//! GPU idle attribution: for each ML job and each GPU it uses, the share of the last minute the
//! GPU was idle, split by what the job was doing at the time.
//!
//! Each tick joins two sources of the same sample: the GPU source (NVML's utilisation of each
//! GPU over its last sample period, and the pids of the compute processes on it) and the
//! scheduler (each ML process's cumulative time per phase, from its 100 ms windows). For a job
//! on a GPU, the tick's idle share `1 - utilisation` is spread over the phases in proportion to
//! the time the job's main process spent in each since the previous tick:
//!
//! `idle_ms[phase] += (1 - util / 100) * (phase_ms[phase] now - phase_ms[phase] at the last tick)`
//!
//! Summed over the ticks of the last [`WINDOW_MS`], divided by the job's time observed in them,
//! that gives `idle_by_phase_pct` (which adds up to `idle_pct`). It is a sampled estimate: NVML
//! averages utilisation over its own period (1/6 s to 1 s by GPU), the phases come from 100 ms
//! windows, and one tick (1 s by default) is the finest grain at which the two are joined.

use std::collections::{BTreeMap, VecDeque};

use ringside_shared::{GpuIdleAttribution, Phase, PhaseValues};

use crate::pipeline::Sample;

/// The span the attribution covers.
pub const WINDOW_MS: u64 = 60_000;
/// Jobs × GPUs reported at most (a node has 8 GPUs; bounds the snapshot against many jobs).
pub const MAX_ENTRIES: usize = 64;

/// One tick's contribution of a job on a GPU.
struct Slice {
    at_ms: u64,
    observed_ms: f64,
    idle_ms: PhaseValues<f64>,
}

#[derive(Default)]
struct Series {
    comm: String,
    gpu: u32,
    slices: VecDeque<Slice>,
}

/// Keeps the last minute of slices per (job, GPU UUID) and each job's phase times at the
/// previous tick.
#[derive(Default)]
pub struct IdleAttribution {
    series: BTreeMap<(u32, String), Series>,
    last_phase_ms: BTreeMap<u32, PhaseValues<u64>>,
}

impl IdleAttribution {
    /// Adds this tick and writes the attribution into `sample.gpus.idle`.
    pub fn update(&mut self, sample: &mut Sample) {
        let (Some(gpus), Some(scheduler)) = (sample.gpus.as_mut(), sample.scheduler.as_ref()) else {
            return;
        };
        let now = sample.taken_at_ms;
        // The phase time each job's main process added since the previous tick.
        let mut added: BTreeMap<u32, (String, PhaseValues<u64>)> = BTreeMap::new();
        let mut seen = BTreeMap::new();
        for p in scheduler.processes.iter().filter(|p| p.pid == p.job) {
            let before = self.last_phase_ms.get(&p.pid);
            let mut delta = PhaseValues::<u64>::default();
            for phase in Phase::ALL {
                let was = before.map_or(p.phase_ms.get(phase), |b| b.get(phase));
                *delta.get_mut(phase) = p.phase_ms.get(phase).saturating_sub(was);
            }
            seen.insert(p.pid, p.phase_ms.clone());
            added.insert(p.pid, (p.comm.clone(), delta));
        }
        self.last_phase_ms = seen;
        let job_of: BTreeMap<u32, u32> = scheduler.processes.iter().map(|p| (p.pid, p.job)).collect();
        for gpu in &gpus.devices {
            let Some(util) = gpu.utilization_gpu_pct else { continue };
            let idle = (1.0 - util / 100.0).clamp(0.0, 1.0);
            // The jobs with a process on this GPU, each once.
            let mut jobs: Vec<u32> = gpu.processes.iter().filter_map(|p| job_of.get(&p.pid).copied()).collect();
            jobs.sort_unstable();
            jobs.dedup();
            for job in jobs {
                let Some((comm, delta)) = added.get(&job) else { continue };
                let observed: u64 = Phase::ALL.iter().map(|ph| delta.get(*ph)).sum();
                if observed == 0 {
                    continue;
                }
                let mut idle_ms = PhaseValues::<f64>::default();
                for phase in Phase::ALL {
                    *idle_ms.get_mut(phase) = idle * delta.get(phase) as f64;
                }
                let series = self.series.entry((job, gpu.uuid.clone())).or_default();
                series.comm = comm.clone();
                series.gpu = gpu.index;
                series.slices.push_back(Slice { at_ms: now, observed_ms: observed as f64, idle_ms });
            }
        }
        // Forget what fell out of the window, and jobs and GPUs gone quiet.
        for series in self.series.values_mut() {
            while series.slices.front().is_some_and(|s| now.saturating_sub(s.at_ms) > WINDOW_MS) {
                series.slices.pop_front();
            }
        }
        self.series.retain(|_, s| !s.slices.is_empty());
        gpus.idle = self
            .series
            .iter()
            .take(MAX_ENTRIES)
            .map(|((job, uuid), s)| {
                let observed: f64 = s.slices.iter().map(|x| x.observed_ms).sum();
                let mut by_phase = PhaseValues::<f64>::default();
                for phase in Phase::ALL {
                    let idle: f64 = s.slices.iter().map(|x| x.idle_ms.get(phase)).sum();
                    *by_phase.get_mut(phase) = if observed > 0.0 { idle * 100.0 / observed } else { 0.0 };
                }
                GpuIdleAttribution {
                    job: *job,
                    comm: s.comm.clone(),
                    gpu: s.gpu,
                    uuid: uuid.clone(),
                    window_ms: observed as u64,
                    idle_pct: Phase::ALL.iter().map(|ph| by_phase.get(*ph)).sum(),
                    idle_by_phase_pct: by_phase,
                }
            })
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use ringside_shared::{GpuDevice, GpuProcess, GpuTelemetry, MlProcessInfo, ProcessRole, SchedulerTelemetry};

    use super::*;

    fn sample(at_ms: u64, util: f64, phase_ms: PhaseValues<u64>) -> Sample {
        let mut sample = Sample::new(at_ms);
        sample.gpus = Some(GpuTelemetry {
            available: true,
            devices: vec![GpuDevice {
                index: 0,
                uuid: "GPU-0".into(),
                utilization_gpu_pct: Some(util),
                processes: vec![GpuProcess { pid: 10, ..GpuProcess::default() }],
                ..GpuDevice::default()
            }],
            ..GpuTelemetry::default()
        });
        let process = |pid: u32, comm: &str, phase_ms: PhaseValues<u64>| MlProcessInfo {
            pid,
            job: 10,
            comm: comm.into(),
            role: if pid == 10 { ProcessRole::Main } else { ProcessRole::Worker },
            reason: String::new(),
            phase: Phase::Unknown,
            phase_since_ms: 0,
            threads: 1,
            gpus: Vec::new(),
            numa_node: None,
            probed_libraries: Vec::new(),
            libraries: Vec::new(),
            uid: None,
            admitted: false,
            admission: String::new(),
            phase_ms,
            timeline: Vec::new(),
        };
        let main = process(10, "train", phase_ms);
        let worker = process(11, "worker", PhaseValues::default());
        sample.scheduler = Some(SchedulerTelemetry { processes: vec![main, worker], ..SchedulerTelemetry::default() });
        sample
    }

    fn phases(data: u64, compute: u64, optimizer: u64) -> PhaseValues<u64> {
        PhaseValues { data_loading: data, gpu_compute: compute, optimizer_step: optimizer, ..PhaseValues::default() }
    }

    #[test]
    fn idle_time_is_split_by_what_the_job_did_meanwhile() {
        let mut a = IdleAttribution::default();
        a.update(&mut sample(0, 50.0, phases(1000, 1000, 0)));
        // Second 1: half idle, the job 600 ms loading data and 400 ms computing.
        let mut s = sample(1000, 50.0, phases(1600, 1400, 0));
        a.update(&mut s);
        // Second 2: GPU 80% busy; the job 1000 ms in its optimizer step.
        let mut s2 = sample(2000, 80.0, phases(1600, 1400, 1000));
        a.update(&mut s2);
        let idle = &s2.gpus.as_ref().unwrap().idle;
        assert_eq!(idle.len(), 1, "one job on one GPU; the worker belongs to the job");
        let x = &idle[0];
        assert_eq!((x.job, x.gpu, x.window_ms, x.comm.as_str()), (10, 0, 2000, "train"));
        // Idle: 300 ms loading + 200 ms computing in second 1, 200 ms optimizer in second 2.
        assert!((x.idle_by_phase_pct.data_loading - 15.0).abs() < 1e-9, "{x:?}");
        assert!((x.idle_by_phase_pct.gpu_compute - 10.0).abs() < 1e-9, "{x:?}");
        assert!((x.idle_by_phase_pct.optimizer_step - 10.0).abs() < 1e-9, "{x:?}");
        assert!((x.idle_pct - 35.0).abs() < 1e-9);
        assert_eq!(
            x.describe(),
            "GPU 0 idle 35% of the last minute: 15% waiting for data, 10% while computing, 10% in the optimizer step"
        );
    }

    #[test]
    fn the_window_forgets_the_old_and_the_first_tick_counts_nothing() {
        let mut a = IdleAttribution::default();
        let mut first = sample(0, 0.0, phases(5000, 0, 0));
        a.update(&mut first);
        assert!(first.gpus.unwrap().idle.is_empty(), "no previous tick: nothing measured yet");
        a.update(&mut sample(1000, 0.0, phases(6000, 0, 0)));
        let mut late = sample(70_000, 100.0, phases(6000, 1000, 0));
        a.update(&mut late);
        let x = &late.gpus.unwrap().idle[0];
        assert_eq!(x.window_ms, 1000, "the slice from second 1 fell out of the minute");
        assert_eq!(x.idle_pct, 0.0);
    }
}
