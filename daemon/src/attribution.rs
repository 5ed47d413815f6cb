//! GPU idle attribution: for each ML job and each GPU it uses, the share of the last minute the
//! GPU was idle, split by what the job was doing at the time.
//!
//! Each tick joins two sources of the same sample: the GPU source (the compute processes on each
//! GPU, and its utilisation) and the scheduler (each ML process's phase timeline, from its 100 ms
//! windows). Two ways, the first wherever the GPU allows it:
//!
//! - **Aligned**: NVML keeps its own utilisation samples, each the busy share of a short period
//!   (1/6 s on most data-centre GPUs) with the time the period ended. Each sample the job's
//!   timeline already covers is laid over it: the period's idle share goes to the phase the
//!   job's main process was in during each part of the period.
//!
//!   `idle_ms[phase] += (1 - busy / 100) * overlap(period, span of that phase)`
//!
//!   Spans in which a thread of the job waited for a CPU for a quarter of the time or more go
//!   to their own bucket, "waiting for a CPU", whatever their phase: the job was starved.
//!
//! - **Proportional** (a GPU or driver without samples): the tick's idle share `1 - util / 100`
//!   is spread over the phases in proportion to the time the main process spent in each since
//!   the previous tick. The grain is the tick, so short alternations blur.
//!
//! Summed over the last [`WINDOW_MS`], divided by the job's time observed in it, that gives
//! `idle_by_phase_pct` (which adds up to `idle_pct`).

use std::collections::{BTreeMap, VecDeque};

use ringside_shared::{GpuDevice, GpuIdleAttribution, GpuStepIdle, MlProcessInfo, Phase, PhaseSpan, PhaseValues};

use crate::pipeline::Sample;

/// The span the attribution covers.
pub const WINDOW_MS: u64 = 60_000;
/// Jobs × GPUs reported at most (a node has 8 GPUs; bounds the snapshot against many jobs).
pub const MAX_ENTRIES: usize = 64;

/// The period a sample covers when the sample before it is not known (NVML's shortest).
const FIRST_PERIOD_US: u64 = 166_667;
/// A sample period longer than this (a gap in NVML's samples) counts as this long.
const MAX_PERIOD_US: u64 = 1_000_000;

/// One tick's contribution of a job on a GPU.
struct Slice {
    at_ms: u64,
    observed_ms: f64,
    idle_ms: PhaseValues<f64>,
    /// Idle time while a thread of the job waited for a CPU (not in `idle_ms`).
    cpu_wait_idle_ms: f64,
    aligned: bool,
}

#[derive(Default)]
struct Series {
    comm: String,
    gpu: u32,
    slices: VecDeque<Slice>,
    /// The end of the time the latest slice covers (Unix ms).
    until_ms: u64,
    /// The newest NVML sample already laid over the timeline (Unix µs).
    cursor_us: u64,
    last_step: Option<GpuStepIdle>,
}

/// Keeps the last minute of slices per (job, GPU UUID) and each job's phase times at the
/// previous tick.
#[derive(Default)]
pub struct IdleAttribution {
    series: BTreeMap<(u32, String), Series>,
    last_phase_ms: BTreeMap<u32, PhaseValues<u64>>,
}

impl IdleAttribution {
    /// Adds this tick and writes the attribution into `sample.readings.gpus.idle`.
    pub fn update(&mut self, sample: &mut Sample) {
        let (Some(gpus), Some(scheduler)) = (sample.readings.gpus.as_mut(), sample.readings.scheduler.as_ref()) else {
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
        let mains: BTreeMap<u32, &MlProcessInfo> =
            scheduler.processes.iter().filter(|p| p.pid == p.job).map(|p| (p.pid, p)).collect();
        for gpu in &gpus.devices {
            // The jobs with a process on this GPU, each once.
            let mut jobs: Vec<u32> = gpu.processes.iter().filter_map(|p| job_of.get(&p.pid).copied()).collect();
            jobs.sort_unstable();
            jobs.dedup();
            for job in jobs {
                let (Some((comm, delta)), Some(main)) = (added.get(&job), mains.get(&job)) else { continue };
                let series = self.series.entry((job, gpu.uuid.clone())).or_default();
                series.comm = comm.clone();
                series.gpu = gpu.index;
                let slice = if gpu.utilization_samples.is_empty() || main.timeline.is_empty() {
                    gpu.utilization_gpu_pct.and_then(|util| proportional(util, delta))
                } else {
                    if let Some(step) = last_step(gpu, &main.timeline) {
                        series.last_step = Some(step);
                    }
                    aligned(gpu, &main.timeline, &mut series.cursor_us)
                };
                if let Some(slice) = slice {
                    series.until_ms = if slice.aligned { series.cursor_us / 1000 } else { now };
                    series.slices.push_back(Slice { at_ms: now, ..slice });
                }
            }
        }
        // Forget what fell out of the window, and jobs and GPUs gone quiet.
        for series in self.series.values_mut() {
            while series.slices.front().is_some_and(|s| now.saturating_sub(s.at_ms) > WINDOW_MS) {
                series.slices.pop_front();
            }
        }
        // A series keeps its cursor while its samples may still be read again (NVML's are kept
        // for seconds), so that none is counted twice.
        self.series.retain(|_, s| !s.slices.is_empty() || s.cursor_us / 1000 + WINDOW_MS > now);
        gpus.idle = self
            .series
            .iter()
            .filter(|(_, s)| !s.slices.is_empty())
            .take(MAX_ENTRIES)
            .map(|((job, uuid), s)| {
                let mut total = empty_slice(false);
                for x in &s.slices {
                    total.observed_ms += x.observed_ms;
                    total.cpu_wait_idle_ms += x.cpu_wait_idle_ms;
                    for phase in Phase::ALL {
                        *total.idle_ms.get_mut(phase) += x.idle_ms.get(phase);
                    }
                }
                let (idle_pct, idle_by_phase_pct, idle_waiting_for_cpu_pct) = shares(&total);
                GpuIdleAttribution {
                    job: *job,
                    comm: s.comm.clone(),
                    gpu: s.gpu,
                    uuid: uuid.clone(),
                    window_ms: total.observed_ms as u64,
                    until_ms: s.until_ms,
                    idle_pct,
                    idle_waiting_for_cpu_pct,
                    idle_by_phase_pct,
                    aligned: s.slices.back().is_some_and(|x| x.aligned),
                    last_step: s.last_step.clone().filter(|step| step.end_ms + WINDOW_MS > now),
                }
            })
            .collect();
    }
}

/// The tick's slice from its utilisation and the phase time the job added since the last tick.
fn proportional(util: f64, delta: &PhaseValues<u64>) -> Option<Slice> {
    let idle = (1.0 - util / 100.0).clamp(0.0, 1.0);
    let observed: u64 = Phase::ALL.iter().map(|ph| delta.get(*ph)).sum();
    if observed == 0 {
        return None;
    }
    let mut idle_ms = PhaseValues::<f64>::default();
    for phase in Phase::ALL {
        *idle_ms.get_mut(phase) = idle * delta.get(phase) as f64;
    }
    Some(Slice { at_ms: 0, observed_ms: observed as f64, idle_ms, cpu_wait_idle_ms: 0.0, aligned: false })
}

/// Each of the GPU's samples as (period start, period end, idle share), times in Unix µs.
fn periods(gpu: &GpuDevice) -> impl Iterator<Item = (u64, u64, f64)> + '_ {
    let mut previous: Option<u64> = None;
    gpu.utilization_samples.iter().map(move |sample| {
        let end = sample.at_us;
        let start = previous.map_or(end.saturating_sub(FIRST_PERIOD_US), |p| p.max(end.saturating_sub(MAX_PERIOD_US)));
        previous = Some(end);
        (start, end, (1.0 - sample.busy_pct / 100.0).clamp(0.0, 1.0))
    })
}

/// Adds the idle share `idle` of `[start, end)` (µs) to the phases `timeline` (in time order)
/// gives that time; only the spans that can overlap it are looked at.
fn lay(slice: &mut Slice, timeline: &[PhaseSpan], start: u64, end: u64, idle: f64) {
    let first = timeline.partition_point(|s| s.end_ms.saturating_mul(1000) <= start);
    for span in timeline[first..].iter().take_while(|s| s.start_ms.saturating_mul(1000) < end) {
        let (from, to) = (span.start_ms.saturating_mul(1000).max(start), span.end_ms.saturating_mul(1000).min(end));
        if to > from {
            let ms = (to - from) as f64 / 1000.0;
            slice.observed_ms += ms;
            if span.waiting_for_cpu {
                slice.cpu_wait_idle_ms += idle * ms;
            } else {
                *slice.idle_ms.get_mut(span.phase) += idle * ms;
            }
        }
    }
}

/// A slice's idle time as shares (0-100) of its observed time: in all, by phase, and waiting
/// for a CPU (the last two add up to the first).
fn shares(slice: &Slice) -> (f64, PhaseValues<f64>, f64) {
    let pct = |ms: f64| if slice.observed_ms > 0.0 { ms * 100.0 / slice.observed_ms } else { 0.0 };
    let mut by_phase = PhaseValues::<f64>::default();
    for phase in Phase::ALL {
        *by_phase.get_mut(phase) = pct(slice.idle_ms.get(phase));
    }
    let cpu = pct(slice.cpu_wait_idle_ms);
    (Phase::ALL.iter().map(|p| by_phase.get(*p)).sum::<f64>() + cpu, by_phase, cpu)
}

fn empty_slice(aligned: bool) -> Slice {
    Slice { at_ms: 0, observed_ms: 0.0, idle_ms: PhaseValues::default(), cpu_wait_idle_ms: 0.0, aligned }
}

/// Lays each of the GPU's samples newer than `cursor_us` that `timeline` already covers over
/// it, and moves the cursor past them.
fn aligned(gpu: &GpuDevice, timeline: &[PhaseSpan], cursor_us: &mut u64) -> Option<Slice> {
    let covered_us = timeline.last()?.end_ms.saturating_mul(1000);
    let mut slice = empty_slice(true);
    for (start, end, idle) in periods(gpu) {
        if end <= *cursor_us {
            continue;
        }
        if end > covered_us {
            break;
        }
        *cursor_us = end;
        lay(&mut slice, timeline, start, end, idle);
    }
    (slice.observed_ms > 0.0).then_some(slice)
}

/// A run of one phase shorter than this does not start a step (a misread window or two).
const MIN_ANCHOR_MS: u64 = 200;
/// Spans of one phase this close together are one run.
const RUN_GAP_MS: u64 = 250;

/// Where the job's steps start: the starts of its runs of data loading (of GPU compute where
/// data loading is not seen twice), each at least [`MIN_ANCHOR_MS`] long.
fn step_starts(timeline: &[PhaseSpan]) -> Option<(Phase, Vec<u64>)> {
    // Runs of one phase, whatever the CPU-wait marks split.
    let mut runs: Vec<(Phase, u64, u64)> = Vec::new();
    for span in timeline {
        match runs.last_mut() {
            Some(run) if run.0 == span.phase && span.start_ms <= run.2 + RUN_GAP_MS => run.2 = run.2.max(span.end_ms),
            _ => runs.push((span.phase, span.start_ms, span.end_ms)),
        }
    }
    [Phase::DataLoading, Phase::GpuCompute].into_iter().find_map(|anchor| {
        let starts: Vec<u64> = runs
            .iter()
            .filter(|(phase, from, to)| *phase == anchor && to.saturating_sub(*from) >= MIN_ANCHOR_MS)
            .map(|(_, from, _)| *from)
            .collect();
        (starts.len() >= 2).then_some((anchor, starts))
    })
}

/// The GPU's idle time over the job's last complete step, where the steps are visible and the
/// GPU's kept samples cover the whole step.
fn last_step(gpu: &GpuDevice, timeline: &[PhaseSpan]) -> Option<GpuStepIdle> {
    let (anchor, starts) = step_starts(timeline)?;
    let (from, to) = (starts[starts.len() - 2], starts[starts.len() - 1]);
    let (from_us, to_us) = (from * 1000, to * 1000);
    let mut periods = periods(gpu).peekable();
    if periods.peek().is_none_or(|(start, _, _)| *start > from_us)
        || gpu.utilization_samples.last().is_none_or(|s| s.at_us < to_us)
    {
        return None;
    }
    let mut slice = empty_slice(true);
    for (start, end, idle) in periods.filter(|(start, end, _)| *end > from_us && *start < to_us) {
        lay(&mut slice, timeline, start.max(from_us), end.min(to_us), idle);
    }
    // A step the timeline does not cover (the process was not looked at) says nothing.
    let length_ms = (to - from) as f64;
    if slice.observed_ms < length_ms * 0.9 {
        return None;
    }
    let (idle_pct, idle_by_phase_pct, idle_waiting_for_cpu_pct) = shares(&slice);
    Some(GpuStepIdle { start_ms: from, end_ms: to, anchor, idle_pct, idle_by_phase_pct, idle_waiting_for_cpu_pct })
}

#[cfg(test)]
mod tests {
    use ringside_shared::{GpuDevice, GpuProcess, GpuTelemetry, MlProcessInfo, ProcessRole, SchedulerTelemetry};

    use super::*;

    pub(super) fn sample(at_ms: u64, util: f64, phase_ms: PhaseValues<u64>) -> Sample {
        let mut sample = Sample::new(at_ms);
        sample.readings.gpus = Some(GpuTelemetry {
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
            ..MlProcessInfo::default()
        };
        let main = process(10, "train", phase_ms);
        let worker = process(11, "worker", PhaseValues::default());
        sample.readings.scheduler =
            Some(SchedulerTelemetry { processes: vec![main, worker], ..SchedulerTelemetry::default() });
        sample
    }

    pub(super) fn phases(data: u64, compute: u64, optimizer: u64) -> PhaseValues<u64> {
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
        let idle = &s2.readings.gpus.as_ref().unwrap().idle;
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
        assert!(first.readings.gpus.unwrap().idle.is_empty(), "no previous tick: nothing measured yet");
        a.update(&mut sample(1000, 0.0, phases(6000, 0, 0)));
        let mut late = sample(70_000, 100.0, phases(6000, 1000, 0));
        a.update(&mut late);
        let x = &late.readings.gpus.unwrap().idle[0];
        assert_eq!(x.window_ms, 1000, "the slice from second 1 fell out of the minute");
        assert_eq!(x.idle_pct, 0.0);
    }
}

#[cfg(test)]
mod aligned_tests {
    use ringside_shared::{GpuUtilizationSample, PhaseSpan};

    use super::tests::{phases, sample};
    use super::*;

    const T0: u64 = 1_700_000_000_000;

    fn with(mut s: Sample, samples: &[(u64, f64)], timeline: &[(Phase, u64, u64)]) -> Sample {
        let gpu = &mut s.readings.gpus.as_mut().unwrap().devices[0];
        gpu.utilization_samples = samples
            .iter()
            .map(|&(ms, busy)| GpuUtilizationSample { at_us: (T0 + ms) * 1000, busy_pct: busy })
            .collect();
        s.readings.scheduler.as_mut().unwrap().processes[0].timeline = timeline
            .iter()
            .map(|&(phase, from, to)| PhaseSpan { phase, start_ms: T0 + from, end_ms: T0 + to, waiting_for_cpu: false })
            .collect();
        s
    }

    #[test]
    fn samples_laid_over_the_timeline_put_idle_time_where_it_happened() {
        // Half a second loading data with the GPU idle, half a second computing with it busy:
        // the tick's mean utilisation is 50 %, and only the alignment can tell when.
        let samples = [(0, 30.0), (250, 0.0), (500, 0.0), (750, 100.0), (1000, 100.0)];
        let timeline = [(Phase::DataLoading, 0, 500), (Phase::GpuCompute, 500, 1000)];
        let mut a = IdleAttribution::default();
        let mut s = with(sample(T0 + 1000, 50.0, phases(500, 500, 0)), &samples, &timeline);
        a.update(&mut s);
        let x = &s.readings.gpus.as_ref().unwrap().idle[0];
        assert!(x.aligned);
        assert_eq!(x.window_ms, 1000, "the sample ending at 0 covers time before the timeline");
        assert!((x.idle_by_phase_pct.data_loading - 50.0).abs() < 1e-9, "{x:?}");
        assert_eq!(x.idle_by_phase_pct.gpu_compute, 0.0, "{x:?}");

        // The proportional estimate of the same second blurs it over both phases.
        let mut b = IdleAttribution::default();
        b.update(&mut sample(T0, 50.0, phases(0, 0, 0)));
        let mut p = sample(T0 + 1000, 50.0, phases(500, 500, 0));
        b.update(&mut p);
        let y = &p.readings.gpus.as_ref().unwrap().idle[0];
        assert!(!y.aligned);
        assert_eq!((y.idle_by_phase_pct.data_loading, y.idle_by_phase_pct.gpu_compute), (25.0, 25.0));
    }

    #[test]
    fn each_sample_counts_once_and_only_once_the_timeline_covers_it() {
        let mut a = IdleAttribution::default();
        // Samples up to 1.5 s, the timeline only to 1 s: the last two wait.
        let samples = [(0, 0.0), (500, 0.0), (1000, 0.0), (1250, 0.0), (1500, 0.0)];
        let mut s = with(sample(T0 + 1500, 0.0, phases(1000, 0, 0)), &samples, &[(Phase::DataLoading, 0, 1000)]);
        a.update(&mut s);
        assert_eq!(s.readings.gpus.as_ref().unwrap().idle[0].window_ms, 1000);
        // Next tick: NVML still returns the old samples (it keeps seconds of them) and a new
        // one; the timeline now reaches 2 s, the last second in the optimizer step.
        let samples = [(500, 0.0), (1000, 0.0), (1250, 0.0), (1500, 0.0), (2000, 100.0)];
        let timeline = [(Phase::DataLoading, 0, 1000), (Phase::OptimizerStep, 1000, 2000)];
        let mut s = with(sample(T0 + 2500, 0.0, phases(1000, 0, 1000)), &samples, &timeline);
        a.update(&mut s);
        let x = &s.readings.gpus.as_ref().unwrap().idle[0];
        assert_eq!(x.window_ms, 2000, "every millisecond once: {x:?}");
        assert!((x.idle_by_phase_pct.data_loading - 50.0).abs() < 1e-9, "{x:?}");
        assert!((x.idle_by_phase_pct.optimizer_step - 25.0).abs() < 1e-9, "idle 1.0-1.5 s, busy 1.5-2 s: {x:?}");
    }

    #[test]
    fn idle_time_while_starved_of_cpu_has_its_own_bucket() {
        let mut a = IdleAttribution::default();
        let samples = [(0, 0.0), (500, 0.0), (1000, 0.0)];
        let timeline = [(Phase::DataLoading, 0, 250), (Phase::DataLoading, 250, 1000)];
        let mut s = with(sample(T0 + 1000, 0.0, phases(1000, 0, 0)), &samples, &timeline);
        s.readings.scheduler.as_mut().unwrap().processes[0].timeline[1].waiting_for_cpu = true;
        a.update(&mut s);
        let x = &s.readings.gpus.as_ref().unwrap().idle[0];
        assert_eq!(x.window_ms, 1000);
        assert!((x.idle_by_phase_pct.data_loading - 25.0).abs() < 1e-9, "{x:?}");
        assert!((x.idle_waiting_for_cpu_pct - 75.0).abs() < 1e-9, "{x:?}");
        assert!((x.idle_pct - 100.0).abs() < 1e-9, "{x:?}");
        assert_eq!(x.describe(), "GPU 0 idle 100% of the last minute: 75% waiting for a CPU, 25% waiting for data");
    }

    #[test]
    fn the_last_complete_step_is_split_on_its_own() {
        // Two cycles: data 1 s (GPU idle), compute 1 s (busy), optimizer 1 s (idle); a 100 ms
        // misread of data loading inside the compute is no new step.
        let timeline = [
            (Phase::DataLoading, 0, 1000),
            (Phase::GpuCompute, 1000, 1500),
            (Phase::DataLoading, 1500, 1600),
            (Phase::GpuCompute, 1600, 2000),
            (Phase::OptimizerStep, 2000, 3000),
            (Phase::DataLoading, 3000, 4000),
            (Phase::GpuCompute, 4000, 4500),
        ];
        // A sample covers the half second before its time.
        let busy = |ms: u64| if (1500..=2000).contains(&ms) || ms >= 4500 { 100.0 } else { 0.0 };
        let samples: Vec<(u64, f64)> = (0..=9).map(|i| (i * 500, busy(i * 500))).collect();
        let mut a = IdleAttribution::default();
        let mut s = with(sample(T0 + 4500, 0.0, phases(2000, 1500, 1000)), &samples, &timeline);
        a.update(&mut s);
        let step = s.readings.gpus.as_ref().unwrap().idle[0].last_step.clone().expect("a step is visible");
        assert_eq!((step.start_ms - T0, step.end_ms - T0, step.anchor), (0, 3000, Phase::DataLoading));
        let third = 100.0 / 3.0;
        assert!((step.idle_pct - 2.0 * third).abs() < 1e-9, "{step:?}");
        assert!((step.idle_by_phase_pct.data_loading - third).abs() < 1e-9, "{step:?}");
        assert!((step.idle_by_phase_pct.optimizer_step - third).abs() < 1e-9, "{step:?}");
        assert_eq!(step.describe(), "last step 3.0 s, GPU idle 67%: 33% waiting for data, 33% in the optimizer step");

        // Samples that do not reach back to the step's start: no figure rather than a partial one.
        let mut b = IdleAttribution::default();
        let late: Vec<(u64, f64)> = samples.iter().copied().filter(|(ms, _)| *ms >= 1000).collect();
        let mut s = with(sample(T0 + 4500, 0.0, phases(2000, 1500, 1000)), &late, &timeline);
        b.update(&mut s);
        assert_eq!(s.readings.gpus.as_ref().unwrap().idle[0].last_step, None);
        // One cycle only: no step.
        assert_eq!(
            step_starts(&[PhaseSpan { phase: Phase::DataLoading, start_ms: 0, end_ms: 900, waiting_for_cpu: false }]),
            None
        );
    }

    #[test]
    fn a_gap_in_the_samples_counts_as_at_most_a_second() {
        let mut a = IdleAttribution::default();
        let samples = [(0, 0.0), (5000, 0.0)];
        let mut s = with(sample(T0 + 5000, 0.0, phases(5000, 0, 0)), &samples, &[(Phase::DataLoading, 0, 5000)]);
        a.update(&mut s);
        assert_eq!(s.readings.gpus.as_ref().unwrap().idle[0].window_ms, 1000);
    }
}
