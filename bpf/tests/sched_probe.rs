//! The scheduling probe loaded into the real kernel (CI runs as root), watching real threads.

use std::sync::mpsc;
use std::time::Duration;

use ringside_bpf::{ProbeError, SchedProbe};

mod common;
use common::{assert_on_cpu_matches, exclusive, own_cpu_ns, spin_for, steal_ns, tid};

fn load() -> SchedProbe {
    match SchedProbe::load() {
        Ok(probe) => probe,
        Err(e @ ProbeError::PermissionDenied(_)) => panic!("run the tests as root (as CI does): {e}"),
        Err(e) => panic!("{e}"),
    }
}

/// Runs `work` on a new thread and hands back its tid once it is done, while it still exists.
fn on_thread(work: impl FnOnce() + Send + 'static) -> (u32, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (tid_tx, tid_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let handle = std::thread::spawn(move || {
        work();
        tid_tx.send(tid()).unwrap();
        let _ = done_rx.recv();
    });
    (tid_rx.recv().unwrap(), done_tx, handle)
}

#[test]
fn counts_on_cpu_time_and_switches_of_real_threads() {
    let _one = exclusive();
    let probe = load();
    let steal_before = steal_ns();
    // Each thread reports the kernel's own on-CPU figure for itself, the ground truth.
    let (truth_tx, truth_rx) = mpsc::channel();
    let busy_truth = truth_tx.clone();
    let (busy, release_busy, busy_thread) = on_thread(move || {
        spin_for(Duration::from_millis(300));
        busy_truth.send(own_cpu_ns()).unwrap();
    });
    let busy_cpu = truth_rx.recv().unwrap();
    let (sleeper, release_sleeper, sleeper_thread) = on_thread(move || {
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(2));
        }
        truth_tx.send(own_cpu_ns()).unwrap();
    });
    let sleeper_cpu = truth_rx.recv().unwrap();
    let busy_stats = probe.thread(busy).expect("the busy thread is tracked");
    assert_on_cpu_matches("busy thread", busy_stats.on_cpu_ns, busy_cpu, steal_ns() - steal_before);
    assert!(busy_cpu > 50_000_000, "the busy thread ran: {busy_cpu} ns");
    assert_eq!(busy_stats.tgid, std::process::id());
    let sleeper_stats = probe.thread(sleeper).expect("the sleeping thread is tracked");
    assert!(sleeper_stats.voluntary >= 20, "20 sleeps, {} voluntary switches", sleeper_stats.voluntary);
    assert!(sleeper_stats.on_cpu_ns <= sleeper_cpu + 1_000_000, "{} vs {sleeper_cpu}", sleeper_stats.on_cpu_ns);
    for (release, thread) in [(release_busy, busy_thread), (release_sleeper, sleeper_thread)] {
        release.send(()).unwrap();
        thread.join().unwrap();
    }
}

#[test]
fn crowded_cpus_show_run_queue_wait_and_preemption() {
    let _one = exclusive();
    let probe = load();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    // Three spinning threads per CPU, all at once: each must wait for a CPU.
    let (done_tx, done_rx) = mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let release_rx = std::sync::Arc::new(std::sync::Mutex::new(release_rx));
    let threads: Vec<_> = (0..cpus * 3)
        .map(|_| {
            let (done_tx, release_rx) = (done_tx.clone(), release_rx.clone());
            std::thread::spawn(move || {
                spin_for(Duration::from_millis(400));
                done_tx.send(tid()).unwrap();
                let _ = release_rx.lock().unwrap().recv();
            })
        })
        .collect();
    let tids: Vec<u32> = (0..threads.len()).map(|_| done_rx.recv().unwrap()).collect();
    let stats: Vec<_> = tids.iter().filter_map(|tid| probe.thread(*tid)).collect();
    assert_eq!(stats.len(), threads.len());
    let waited: u64 = stats.iter().map(|s| s.runq_wait_ns).sum();
    let preempted: u64 = stats.iter().map(|s| s.involuntary).sum();
    assert!(waited > 200_000_000, "{} threads on {cpus} CPUs waited only {waited} ns in total", threads.len());
    assert!(preempted > 0);
    for _ in &threads {
        release_tx.send(()).unwrap();
    }
    for thread in threads {
        thread.join().unwrap();
    }
}

#[test]
fn exited_threads_leave_no_entries() {
    let _one = exclusive();
    let probe = load();
    let mut tids = Vec::new();
    for _ in 0..10_000 {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(tid()).unwrap()).join().unwrap();
        tids.push(rx.recv().unwrap());
    }
    // Entries are deleted at exit; give the last exits a moment to pass.
    std::thread::sleep(Duration::from_millis(100));
    let left: Vec<u32> =
        tids.iter().copied().filter(|t| probe.thread(*t).is_some_and(|s| s.tgid == std::process::id())).collect();
    assert!(
        left.is_empty(),
        "{} of 10000 exited threads still have entries: {:?}",
        left.len(),
        &left[..left.len().min(10)]
    );
    assert!(probe.threads().len() < 60_000, "the map stays far from full");
}
