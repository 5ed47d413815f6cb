//! Phase detection: from one window of a thread's counters to the phase it is in.
//!
//! Each window (`[scheduler] window_ms`, 100 ms by default) turns the deltas of a thread's BPF
//! counters into *evidence*: how much of the window the thread spent doing what each phase
//! does. The rules (also in `docs/scheduler.md`):
//!
//! | phase             | evidence (time in the window)                                                  |
//! |-------------------|--------------------------------------------------------------------------------|
//! | `nccl_collective` | in NCCL collectives, and synchronizing on a collective it enqueued              |
//! | `gpu_compute`     | in CUDA synchronize calls, copies the host waits for and NVIDIA ioctls; plus its free CPU time while it feeds the GPU (below) |
//! | `data_loading`    | blocked in reads and block I/O; for a worker process (a descendant that does not use the GPU, e.g. a DataLoader worker) also its free CPU time |
//! | `optimizer_step`  | free CPU time (on a CPU or waiting for one, outside the calls above) of a process that uses the GPU, while it does not feed it |
//!
//! A thread *feeds the GPU* while at least 5% of its timer-tick samples outside the probed
//! calls (at least two, over this window and the one before) find it running the CUDA driver's
//! or runtime's code: launching kernels, enqueueing copies, spinning in a wait. Launches
//! themselves are not probed by default (a uprobe traps on every one); with
//! `[scheduler] launch_probes` a rate of 2000 launches/s or more counts as feeding too.
//!
//! Futex waits are measured and shown, but are not evidence: every idle thread of a pool waits
//! on a futex, so they say "waiting", not for what. Waits inside NCCL are counted as NCCL.
//!
//! The phase with the most evidence is the window's candidate when its evidence is at least
//! `enter` (30%) of the window. [`Hysteresis`] then decides: a candidate with strong evidence
//! (>= 60%) is taken at once; a weaker one must win two windows in a row; the current phase is
//! left for `unknown` only after two windows below `exit` (15%). A process's evidence is the
//! sum of its threads'.

use ringside_bpf::{MlThreadStats, ThreadStats};
use ringside_shared::{Phase, ProcessRole};

/// Launch rate above which a thread's CPU time is spent feeding the GPU (counted only with
/// the launch probes attached).
pub const FEEDING_LAUNCHES_PER_S: f64 = 2000.0;
/// Share of a thread's tick samples in the GPU driver's code at which it feeds the GPU, and
/// the fewest such samples that count (one alone is noise).
pub const FEEDING_DRIVER_SHARE: f64 = 0.05;
pub const FEEDING_MIN_SAMPLES: u64 = 2;
pub const ENTER: f64 = 0.30;
pub const STRONG: f64 = 0.60;
pub const EXIT: f64 = 0.15;
/// Windows a weak candidate must win in a row, and windows below `EXIT` before `unknown`.
pub const CONFIRM_WINDOWS: u32 = 2;

/// A thread's cumulative counters at one instant (scheduling and, if tracked, calls).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub on_cpu_ns: u64,
    pub runq_ns: u64,
    pub iowait_ns: u64,
    pub futex_ns: u64,
    pub read_ns: u64,
    pub read_bytes: u64,
    pub nv_ioctl_ns: u64,
    pub launches: u64,
    pub sync_ns: u64,
    pub syncs: u64,
    pub copies: u64,
    pub nccl_ns: u64,
    pub nccl_calls: u64,
    /// Timer-tick samples outside the probed calls, and those in the GPU driver's code.
    pub samples: u64,
    pub driver_samples: u64,
}

impl Counters {
    pub fn from_probe(sched: Option<&ThreadStats>, calls: Option<&MlThreadStats>) -> Counters {
        let mut c = Counters::default();
        if let Some(s) = sched {
            c.on_cpu_ns = s.on_cpu_ns;
            c.runq_ns = s.runq_wait_ns;
            c.iowait_ns = s.iowait_ns;
        }
        if let Some(m) = calls {
            c.futex_ns = m.futex_wait_ns;
            c.read_ns = m.read_ns;
            c.read_bytes = m.read_bytes;
            c.nv_ioctl_ns = m.nv_ioctl_ns;
            c.launches = m.launches;
            c.sync_ns = m.sync_ns;
            c.syncs = m.syncs;
            c.copies = m.copies;
            c.nccl_ns = m.nccl_ns;
            c.nccl_calls = m.nccl_calls;
            c.samples = m.samples;
            c.driver_samples = m.driver_samples;
        }
        c
    }

    /// What happened between `before` and `self`. A counter read while the BPF side was
    /// updating it can look as if it went back a little: that window counts nothing and the
    /// next one catches up.
    pub fn since(&self, before: &Counters) -> Counters {
        let d = |now: u64, then: u64| now.saturating_sub(then);
        Counters {
            on_cpu_ns: d(self.on_cpu_ns, before.on_cpu_ns),
            runq_ns: d(self.runq_ns, before.runq_ns),
            iowait_ns: d(self.iowait_ns, before.iowait_ns),
            futex_ns: d(self.futex_ns, before.futex_ns),
            read_ns: d(self.read_ns, before.read_ns),
            read_bytes: d(self.read_bytes, before.read_bytes),
            nv_ioctl_ns: d(self.nv_ioctl_ns, before.nv_ioctl_ns),
            launches: d(self.launches, before.launches),
            sync_ns: d(self.sync_ns, before.sync_ns),
            syncs: d(self.syncs, before.syncs),
            copies: d(self.copies, before.copies),
            nccl_ns: d(self.nccl_ns, before.nccl_ns),
            nccl_calls: d(self.nccl_calls, before.nccl_calls),
            samples: d(self.samples, before.samples),
            driver_samples: d(self.driver_samples, before.driver_samples),
        }
    }

    /// Share of the tick samples that found the thread in the GPU driver's code (0 without
    /// samples).
    pub fn driver_share(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            self.driver_samples as f64 / self.samples as f64
        }
    }
}

/// Whether a thread feeds the GPU: `recent` is its counters over this window and the one
/// before (tick samples are few: 25 in a 100 ms window at HZ 250), `window` this window's.
pub fn feeding(recent: &Counters, window: &Counters, window_ns: u64) -> bool {
    let launches_per_s = window.launches as f64 * 1e9 / window_ns.max(1) as f64;
    launches_per_s >= FEEDING_LAUNCHES_PER_S
        || (recent.driver_samples >= FEEDING_MIN_SAMPLES && recent.driver_share() >= FEEDING_DRIVER_SHARE)
}

/// The evidence of one window, in ns, for the four detectable phases.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Evidence {
    pub data_loading: f64,
    pub gpu_compute: f64,
    pub nccl_collective: f64,
    pub optimizer_step: f64,
}

impl Evidence {
    /// One thread's window (`delta`); `feeding`: whether it feeds the GPU ([`feeding`]).
    pub fn of(delta: &Counters, role: ProcessRole, feeding: bool) -> Evidence {
        let nccl = delta.nccl_ns as f64;
        let gpu_wait = (delta.sync_ns + delta.nv_ioctl_ns) as f64;
        let loading = (delta.read_ns + delta.iowait_ns) as f64;
        // CPU time outside the calls above; those calls may spin, so their time is not counted
        // twice (blocking time is not on a CPU anyway).
        let free_cpu = ((delta.on_cpu_ns + delta.runq_ns) as f64 - nccl - gpu_wait - loading).max(0.0);
        let mut e =
            Evidence { data_loading: loading, gpu_compute: gpu_wait, nccl_collective: nccl, optimizer_step: 0.0 };
        match role {
            ProcessRole::Worker => e.data_loading += free_cpu,
            ProcessRole::Main if feeding => e.gpu_compute += free_cpu,
            ProcessRole::Main => e.optimizer_step = free_cpu,
        }
        e
    }

    pub fn add(&mut self, other: &Evidence) {
        self.data_loading += other.data_loading;
        self.gpu_compute += other.gpu_compute;
        self.nccl_collective += other.nccl_collective;
        self.optimizer_step += other.optimizer_step;
    }

    /// The phase with the most evidence and its share of the window (capped at 1).
    pub fn best(&self, window_ns: u64) -> (Phase, f64) {
        let window = window_ns.max(1) as f64;
        let mut best = (Phase::Unknown, 0.0);
        for (phase, ns) in [
            (Phase::NcclCollective, self.nccl_collective),
            (Phase::GpuCompute, self.gpu_compute),
            (Phase::DataLoading, self.data_loading),
            (Phase::OptimizerStep, self.optimizer_step),
        ] {
            if ns / window > best.1 {
                best = (phase, ns / window);
            }
        }
        (best.0, best.1.min(1.0))
    }

    pub fn share(&self, phase: Phase, window_ns: u64) -> f64 {
        let ns = match phase {
            Phase::DataLoading => self.data_loading,
            Phase::GpuCompute => self.gpu_compute,
            Phase::NcclCollective => self.nccl_collective,
            Phase::OptimizerStep => self.optimizer_step,
            Phase::Unknown => 0.0,
        };
        (ns / window_ns.max(1) as f64).min(1.0)
    }
}

/// The current phase, changed only on enough evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Hysteresis {
    pub phase: Phase,
    candidate: Option<(Phase, u32)>,
    quiet: u32,
}

impl Default for Hysteresis {
    fn default() -> Self {
        Hysteresis { phase: Phase::Unknown, candidate: None, quiet: 0 }
    }
}

impl Hysteresis {
    /// Feeds one window; returns the new phase when it changed.
    pub fn step(&mut self, evidence: &Evidence, window_ns: u64) -> Option<Phase> {
        let (best, share) = evidence.best(window_ns);
        let current_share = evidence.share(self.phase, window_ns);
        let next = if share >= ENTER && best != self.phase {
            self.quiet = 0;
            let wins = match self.candidate {
                Some((c, n)) if c == best => n + 1,
                _ => 1,
            };
            self.candidate = Some((best, wins));
            // Taking over from a phase that still holds strongly needs the stronger margin.
            let clear = share >= STRONG && share > current_share + 0.1;
            (clear || wins >= CONFIRM_WINDOWS).then_some(best)
        } else if self.phase != Phase::Unknown && current_share < EXIT {
            self.candidate = None;
            self.quiet += 1;
            (self.quiet >= CONFIRM_WINDOWS).then_some(Phase::Unknown)
        } else {
            self.candidate = None;
            self.quiet = 0;
            None
        };
        match next {
            Some(phase) if phase != self.phase => {
                self.phase = phase;
                self.candidate = None;
                self.quiet = 0;
                Some(phase)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 100_000_000;

    fn window(f: impl FnOnce(&mut Counters)) -> Counters {
        let mut c = Counters::default();
        f(&mut c);
        c
    }

    /// The evidence of one window of a thread, with its feeding judged from that window alone.
    fn evidence(c: &Counters, role: ProcessRole) -> Evidence {
        Evidence::of(c, role, feeding(c, c, W))
    }

    #[test]
    fn each_phase_has_its_signature() {
        let reading = window(|c| {
            c.read_ns = 80_000_000;
            c.on_cpu_ns = 5_000_000;
        });
        assert_eq!(evidence(&reading, ProcessRole::Main).best(W).0, Phase::DataLoading);
        let syncing = window(|c| {
            c.sync_ns = 85_000_000;
            c.on_cpu_ns = 8_000_000;
        });
        assert_eq!(evidence(&syncing, ProcessRole::Main).best(W).0, Phase::GpuCompute);
        // Busy on a CPU, a fifth of it in the driver: launching, i.e. feeding the GPU.
        let feeding = window(|c| {
            c.on_cpu_ns = 90_000_000;
            c.samples = 22;
            c.driver_samples = 5;
        });
        assert_eq!(evidence(&feeding, ProcessRole::Main).best(W).0, Phase::GpuCompute, "driver time");
        let launching = window(|c| {
            c.launches = 300;
            c.on_cpu_ns = 90_000_000;
        });
        assert_eq!(evidence(&launching, ProcessRole::Main).best(W).0, Phase::GpuCompute, "3000 launches/s");
        let collective = window(|c| {
            c.nccl_ns = 70_000_000;
            c.futex_ns = 60_000_000;
            c.on_cpu_ns = 10_000_000;
        });
        assert_eq!(evidence(&collective, ProcessRole::Main).best(W).0, Phase::NcclCollective);
        // Busy on a CPU in its own code: one sample of 23 in the driver is a launch now and
        // then, not feeding.
        let stepping = window(|c| {
            c.on_cpu_ns = 70_000_000;
            c.runq_ns = 20_000_000;
            c.launches = 40;
            c.samples = 23;
            c.driver_samples = 1;
        });
        let (phase, share) = evidence(&stepping, ProcessRole::Main).best(W);
        assert_eq!((phase, share), (Phase::OptimizerStep, 0.9));
        assert_eq!(
            evidence(&stepping, ProcessRole::Worker).best(W).0,
            Phase::DataLoading,
            "a worker's CPU is data work"
        );
        let idle = window(|c| c.futex_ns = W);
        assert_eq!(evidence(&idle, ProcessRole::Main).best(W), (Phase::Unknown, 0.0), "futex waits are not evidence");
    }

    #[test]
    fn feeding_needs_enough_driver_samples_and_a_large_enough_share() {
        let with = |samples, driver_samples| Counters { samples, driver_samples, ..Counters::default() };
        let none = Counters::default();
        assert!(!feeding(&with(0, 0), &none, W), "no samples: no evidence");
        assert!(!feeding(&with(3, 1), &none, W), "a single sample is noise, whatever its share");
        assert!(feeding(&with(3, 2), &none, W));
        assert!(feeding(&with(40, 2), &none, W), "5%");
        assert!(!feeding(&with(41, 2), &none, W), "under 5%");
        // Launch probes count launches exactly: 2000/s feeds, whatever the samples say.
        assert!(feeding(&none, &Counters { launches: 200, ..Counters::default() }, W));
        assert!(!feeding(&none, &Counters { launches: 199, ..Counters::default() }, W));
    }

    #[test]
    fn hysteresis_takes_strong_evidence_at_once_and_weak_evidence_twice() {
        let mut h = Hysteresis::default();
        let strong = Evidence { data_loading: 0.8 * W as f64, ..Evidence::default() };
        assert_eq!(h.step(&strong, W), Some(Phase::DataLoading));
        let weak_gpu = Evidence { gpu_compute: 0.4 * W as f64, data_loading: 0.1 * W as f64, ..Evidence::default() };
        assert_eq!(h.step(&weak_gpu, W), None, "one weak window is not enough");
        assert_eq!(h.step(&weak_gpu, W), Some(Phase::GpuCompute));
        // A blip of another phase between two windows of this one changes nothing.
        let blip = Evidence { optimizer_step: 0.35 * W as f64, gpu_compute: 0.3 * W as f64, ..Evidence::default() };
        assert_eq!(h.step(&blip, W), None);
        assert_eq!(h.step(&weak_gpu, W), None);
        assert_eq!(h.phase, Phase::GpuCompute);
        // Quiet: unknown after two windows below the exit threshold, not one.
        let quiet = Evidence::default();
        assert_eq!(h.step(&quiet, W), None);
        assert_eq!(h.step(&quiet, W), Some(Phase::Unknown));
    }

    #[test]
    fn counters_going_backwards_count_nothing() {
        let before = Counters { on_cpu_ns: 500, ..Counters::default() };
        let now = Counters { on_cpu_ns: 400, ..Counters::default() };
        assert_eq!(now.since(&before).on_cpu_ns, 0);
    }

    #[test]
    fn intervals_in_progress_count_in_the_window_they_are_in() {
        // A thread on a CPU since 50 ms ago, never switched out: the stored counter says 0.
        let now = 1_000_000_000;
        let sched = ThreadStats { on_cpu_ns: 0, on_cpu_since_ns: now - 50_000_000, ..ThreadStats::default() };
        let calls = MlThreadStats {
            sync_ns: 10,
            call_in_progress: (2, now - 30_000_000),
            sys_in_progress: (2, now - 20_000_000),
            ..MlThreadStats::default()
        };
        let c = Counters::from_probe(Some(&sched.at(now)), Some(&calls.at(now, (0, 0))));
        assert_eq!((c.on_cpu_ns, c.sync_ns, c.read_ns), (50_000_000, 30_000_010, 20_000_000));
    }
}
