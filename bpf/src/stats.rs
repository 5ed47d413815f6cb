//! The probe's per-thread counters as user space reads them, with the intervals in progress
//! the BPF side has not folded in yet.

use crate::calls::CallKind;
use crate::skel::types::sys_kind as RawSysKind;

/// Scheduling counters of one thread (cumulative since the probe first saw it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ThreadStats {
    pub tid: u32,
    pub tgid: u32,
    pub on_cpu_ns: u64,
    pub runq_wait_ns: u64,
    pub voluntary: u64,
    pub involuntary: u64,
    /// Time blocked in block-I/O wait.
    pub iowait_ns: u64,
    /// In progress (CLOCK_MONOTONIC ns, 0 if not): the counters above are brought up to date
    /// only at the next switch or wake-up, so a reader adds these to see the present
    /// ([`ThreadStats::at`]).
    pub on_cpu_since_ns: u64,
    pub runnable_since_ns: u64,
    pub io_since_ns: u64,
    /// A tracked thread blocked in a classified syscall: (SYS_KIND, since); its time is added
    /// to the call counters when it wakes up.
    pub blocked: (u32, u64),
}

/// CLOCK_MONOTONIC now, the clock of the BPF side's timestamps.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn in_progress(since: u64, now: u64) -> u64 {
    if since == 0 {
        0
    } else {
        now.saturating_sub(since)
    }
}

impl ThreadStats {
    /// The counters as of `now_ns` (monotonic), the interval in progress included.
    pub fn at(&self, now_ns: u64) -> ThreadStats {
        ThreadStats {
            on_cpu_ns: self.on_cpu_ns + in_progress(self.on_cpu_since_ns, now_ns),
            runq_wait_ns: self.runq_wait_ns + in_progress(self.runnable_since_ns, now_ns),
            iowait_ns: self.iowait_ns + in_progress(self.io_since_ns, now_ns),
            ..*self
        }
    }
}

/// What one thread of a tracked process did in system and library calls (cumulative).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MlThreadStats {
    pub tid: u32,
    pub tgid: u32,
    pub futex_wait_ns: u64,
    pub futex_waits: u64,
    pub read_ns: u64,
    pub reads: u64,
    pub read_bytes: u64,
    pub nv_ioctl_ns: u64,
    pub nv_ioctls: u64,
    /// Kernel launches: counted only while the launch probes are attached (`Probes`).
    pub launches: u64,
    /// Time in synchronize calls and in copies the host waits for (outside collectives), and
    /// how many synchronize calls and copies returned.
    pub sync_ns: u64,
    pub syncs: u64,
    pub copies: u64,
    /// Time in NCCL calls, and in synchronizing on a collective.
    pub nccl_ns: u64,
    pub nccl_calls: u64,
    /// Timer-tick samples of the thread on a CPU outside the probed calls, and of those the
    /// ones that found it running the GPU driver's or runtime's code.
    pub samples: u64,
    pub driver_samples: u64,
    /// The syscall and library call in progress: (kind, since), as the BPF side keeps them.
    pub sys_in_progress: (u32, u64),
    pub call_in_progress: (u32, u64),
    /// What the GPU queue got last (`CallKind` number).
    pub last_enqueue: u32,
}

impl MlThreadStats {
    /// The counters as of `now_ns` (monotonic), the calls and waits in progress included (the
    /// thread's `blocked` state from [`ThreadStats`]): a read or a synchronize that blocks for
    /// longer than a window still shows in that window.
    pub fn at(&self, now_ns: u64, blocked: (u32, u64)) -> MlThreadStats {
        let mut s = *self;
        for (kind, since) in [self.sys_in_progress, blocked] {
            let spent = in_progress(since, now_ns);
            match RawSysKind(kind) {
                RawSysKind::SYS_KIND_FUTEX => s.futex_wait_ns += spent,
                RawSysKind::SYS_KIND_READ => s.read_ns += spent,
                RawSysKind::SYS_KIND_NV_IOCTL => s.nv_ioctl_ns += spent,
                _ => {}
            }
        }
        let (kind, since) = self.call_in_progress;
        let spent = in_progress(since, now_ns);
        let waits = kind == CallKind::Sync as u32 || kind == CallKind::Copy as u32;
        match kind {
            k if k == CallKind::Nccl as u32 => s.nccl_ns += spent,
            _ if waits && self.last_enqueue == CallKind::Nccl as u32 => s.nccl_ns += spent,
            _ if waits => s.sync_ns += spent,
            _ => {}
        }
        s
    }
}
