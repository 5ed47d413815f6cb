//! Helpers shared by the probe tests.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use ringside_bpf::{AttachMode, ProbeError, SchedProbe};

/// One probe test at a time in a test binary. Probes loaded side by side disturb each other's
/// counts (seen with the syscall tracepoints of one and the tracepoint-mode programs of
/// another); the daemon loads one.
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// This thread's kernel thread id, from `/proc/thread-self` (`PID/task/TID`).
pub fn tid() -> u32 {
    let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    link.to_string_lossy().rsplit('/').next().and_then(|t| t.parse().ok()).expect("tid")
}

pub fn load_with(modes: &[AttachMode]) -> SchedProbe {
    match SchedProbe::load_with(modes) {
        Ok(probe) => probe,
        Err(e @ ProbeError::PermissionDenied(_)) => panic!("run the tests as root (as CI does): {e}"),
        Err(e) => panic!("{e}"),
    }
}

/// The kernel's own count of this thread's time on a CPU (ns), from `/proc/thread-self/schedstat`.
pub fn own_cpu_ns() -> u64 {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    text.split_whitespace().next().and_then(|v| v.parse().ok()).expect("on-CPU ns")
}

/// Time the hypervisor ran something else while this machine's CPUs had work (all CPUs, ns;
/// `/proc/stat` counts it in 10 ms ticks). The kernel leaves it out of a thread's on-CPU time,
/// a probe measuring switch-in to switch-out cannot: comparisons allow for it.
pub fn steal_ns() -> u64 {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: u64 =
        text.lines().next().and_then(|l| l.split_whitespace().nth(8)).and_then(|v| v.parse().ok()).unwrap_or(0);
    ticks * 10_000_000
}

/// Checks a probe's on-CPU figure against the kernel's: within 5%, plus steal time seen meanwhile.
pub fn assert_on_cpu_matches(what: &str, seen: u64, truth: u64, steal: u64) {
    let (seen, truth) = (seen as f64, truth as f64);
    assert!(
        seen >= truth * 0.95 && seen <= truth * 1.05 + steal as f64 + 10_000_000.0,
        "{what}: probe saw {seen} ns on CPU, the kernel counts {truth} ns (steal meanwhile {steal} ns)"
    );
}

pub fn spin_for(duration: Duration) {
    let start = Instant::now();
    let mut x = 0u64;
    while start.elapsed() < duration {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}
