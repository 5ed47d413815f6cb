//! What the observer keeps of each ML process over time, for job-aware alerts: its phase time
//! in one-second buckets over the recent window ([`RecentPhases`]), and its steps
//! ([`Steps`]): a step starts with each run of data loading (of GPU compute where data loading
//! is never seen to repeat), as the idle attribution counts them. Both are bounded in memory
//! whatever the process does.

use std::collections::VecDeque;

use ringside_shared::{Phase, PhaseValues, StepTimes};

/// The longest recent window kept (`[scheduler] job_window_s` at most).
pub const MAX_WINDOW_S: u64 = 3600;
/// Step times are compared against the hour before the recent window.
const HOUR_MS: u64 = 3_600_000;
/// Steps kept (over the last hour at most): a job stepping every 100 ms for an hour keeps the
/// newest 4096.
const MAX_STEPS: usize = 4096;
/// A run of the anchor phase shorter than this does not start a step (a misread window).
const MIN_ANCHOR_MS: u64 = 200;
/// Windows of one phase this close together are one run.
const RUN_GAP_MS: u64 = 250;

/// Phase time per second over the recent window.
#[derive(Debug)]
pub struct RecentPhases {
    window_s: u64,
    /// (second, ms in each phase during it), oldest first.
    buckets: VecDeque<(u64, PhaseValues<u32>)>,
}

impl RecentPhases {
    pub fn new(window_s: u64) -> RecentPhases {
        RecentPhases { window_s: window_s.clamp(1, MAX_WINDOW_S), buckets: VecDeque::new() }
    }

    /// `ms` of `phase` in the window that ended at `end_ms`.
    pub fn add(&mut self, end_ms: u64, phase: Phase, ms: u64) {
        let second = end_ms / 1000;
        match self.buckets.back_mut() {
            Some((s, values)) if *s == second => *values.get_mut(phase) += ms.min(u64::from(u32::MAX)) as u32,
            _ => {
                let mut values = PhaseValues::<u32>::default();
                *values.get_mut(phase) = ms.min(u64::from(u32::MAX)) as u32;
                self.buckets.push_back((second, values));
            }
        }
        while self.buckets.front().is_some_and(|(s, _)| *s + self.window_s <= second) {
            self.buckets.pop_front();
        }
    }

    /// Each phase's share of the time observed in the window before `now_ms` (0-100), and the
    /// time observed.
    pub fn shares(&self, now_ms: u64) -> (PhaseValues<f64>, u64) {
        let since = (now_ms / 1000).saturating_sub(self.window_s);
        let mut total = PhaseValues::<u64>::default();
        for (_, values) in self.buckets.iter().filter(|(s, _)| *s >= since) {
            for phase in Phase::ALL {
                *total.get_mut(phase) += u64::from(values.get(phase));
            }
        }
        let observed: u64 = Phase::ALL.iter().map(|p| total.get(*p)).sum();
        let mut shares = PhaseValues::<f64>::default();
        if observed > 0 {
            for phase in Phase::ALL {
                *shares.get_mut(phase) = total.get(phase) as f64 * 100.0 / observed as f64;
            }
        }
        (shares, observed)
    }
}

/// The steps seen with one anchor phase.
#[derive(Debug, Default)]
struct Anchored {
    /// The current (or latest) run of the anchor: (start, end, counted as a step start).
    run: Option<(u64, u64, bool)>,
    /// Where the latest counted run started.
    last_start: Option<u64>,
    /// (end, length) of each step, oldest first.
    steps: VecDeque<(u64, u64)>,
}

impl Anchored {
    fn window(&mut self, start_ms: u64, end_ms: u64) {
        let run = match self.run {
            Some((from, to, counted)) if start_ms <= to + RUN_GAP_MS => (from, end_ms.max(to), counted),
            _ => (start_ms, end_ms, false),
        };
        let (from, to, counted) = run;
        self.run = Some(run);
        if counted || to.saturating_sub(from) < MIN_ANCHOR_MS {
            return;
        }
        self.run = Some((from, to, true));
        if let Some(previous) = self.last_start.replace(from) {
            self.steps.push_back((from, from.saturating_sub(previous)));
        }
        // Kept for the recent window (an hour at most) and the hour before it.
        while self.steps.len() > MAX_STEPS || self.steps.front().is_some_and(|(end, _)| end + 2 * HOUR_MS < from) {
            self.steps.pop_front();
        }
    }
}

/// A process's steps, by data-loading runs and by GPU-compute runs.
#[derive(Debug, Default)]
pub struct Steps {
    data_loading: Anchored,
    gpu_compute: Anchored,
}

fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

impl Steps {
    /// A window the process spent in `phase`.
    pub fn window(&mut self, phase: Phase, start_ms: u64, end_ms: u64) {
        match phase {
            Phase::DataLoading => self.data_loading.window(start_ms, end_ms),
            Phase::GpuCompute => self.gpu_compute.window(start_ms, end_ms),
            _ => {}
        }
    }

    /// Step times over `recent_ms` before `now_ms`, and over the hour before that (the
    /// baseline a regression is measured against); none until two steps are seen.
    pub fn times(&self, now_ms: u64, recent_ms: u64) -> Option<StepTimes> {
        let (anchor, steps) = [(Phase::DataLoading, &self.data_loading), (Phase::GpuCompute, &self.gpu_compute)]
            .into_iter()
            .find(|(_, a)| a.steps.len() >= 2)?;
        let between = |from_ms: u64, to_ms: u64| {
            let mut v: Vec<u64> = steps
                .steps
                .iter()
                .filter(|(end, _)| *end >= from_ms && *end < to_ms)
                .map(|(_, length)| *length)
                .collect();
            v.sort_unstable();
            v
        };
        let recent_from = now_ms.saturating_sub(recent_ms);
        let recent = between(recent_from, u64::MAX);
        let hour = between(recent_from.saturating_sub(HOUR_MS), recent_from);
        Some(StepTimes {
            anchor,
            last_ms: steps.steps.back().map(|(_, length)| *length).unwrap_or(0),
            recent_count: recent.len() as u64,
            recent_p50_ms: quantile(&recent, 0.5),
            recent_p99_ms: quantile(&recent, 0.99),
            hour_count: hour.len() as u64,
            hour_p50_ms: quantile(&hour, 0.5),
            hour_p99_ms: quantile(&hour, 0.99),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_shares_cover_the_window_only() {
        let mut r = RecentPhases::new(10);
        // 20 s of data loading, then 5 s of compute, in 100 ms windows.
        for i in 0..250u64 {
            let phase = if i < 200 { Phase::DataLoading } else { Phase::GpuCompute };
            r.add(1_000_000 + (i + 1) * 100, phase, 100);
        }
        let (shares, observed) = r.shares(1_025_000);
        assert!((9000..=10_000).contains(&observed), "about ten seconds kept: {observed}");
        let compute = 5000.0 * 100.0 / observed as f64;
        assert!((shares.get(Phase::GpuCompute) - compute).abs() < 1e-9, "{shares:?}");
        assert!((shares.get(Phase::DataLoading) - (100.0 - compute)).abs() < 1e-9, "{shares:?}");
        assert!(r.buckets.len() <= 11, "bounded by the window: {}", r.buckets.len());
        // Nothing observed lately: nothing to say.
        assert_eq!(r.shares(2_000_000).1, 0);
    }

    #[test]
    fn steps_start_with_each_run_of_the_anchor_and_short_blips_do_not_count() {
        let mut s = Steps::default();
        let mut t = 0;
        let mut window = |s: &mut Steps, phase: Phase, ms: u64| {
            for _ in 0..ms / 100 {
                s.window(phase, t, t + 100);
                t += 100;
            }
        };
        for cycle in 0..6 {
            window(&mut s, Phase::DataLoading, 500);
            window(&mut s, Phase::GpuCompute, 1000);
            // A misread window of data loading inside compute is no new step.
            window(&mut s, Phase::DataLoading, 100);
            window(&mut s, Phase::GpuCompute, if cycle == 5 { 3400 } else { 400 });
        }
        window(&mut s, Phase::DataLoading, 500);
        let times = s.times(t, 60_000).expect("steps are visible");
        assert_eq!(times.anchor, Phase::DataLoading);
        assert_eq!((times.recent_count, times.recent_p50_ms, times.last_ms), (6, 2000, 5000));
        assert_eq!(times.recent_p99_ms, 5000);
        // Over a recent window that holds only the last step; the hour before holds the rest.
        let last = s.times(t, 1000).unwrap();
        assert_eq!((last.recent_count, last.recent_p99_ms), (1, 5000));
        assert_eq!((last.hour_count, last.hour_p50_ms, last.hour_p99_ms), (5, 2000, 2000));
    }

    #[test]
    fn without_data_loading_gpu_compute_runs_are_the_steps_and_none_until_two() {
        let mut s = Steps::default();
        assert!(s.times(0, 1000).is_none());
        let mut t = 0;
        for _ in 0..3 {
            for (phase, ms) in [(Phase::GpuCompute, 600), (Phase::NcclCollective, 400)] {
                for _ in 0..ms / 100 {
                    s.window(phase, t, t + 100);
                    t += 100;
                }
            }
        }
        let times = s.times(t, 60_000).unwrap();
        assert_eq!((times.anchor, times.recent_count, times.recent_p50_ms), (Phase::GpuCompute, 2, 1000));
    }

    #[test]
    fn steps_are_bounded() {
        let mut s = Steps::default();
        let mut t = 0;
        for _ in 0..(MAX_STEPS + 100) {
            for (phase, ms) in [(Phase::DataLoading, 300), (Phase::OptimizerStep, 300)] {
                s.window(phase, t, t + ms);
                t += ms;
            }
        }
        assert_eq!(s.data_loading.steps.len(), MAX_STEPS);
    }
}
