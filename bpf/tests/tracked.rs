//! Tracked processes, lifecycle events and attach modes, in the real kernel (CI runs as root).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

use ringside_bpf::{AttachMode, EventKind};

mod common;
use common::*;

#[test]
fn every_attach_mode_counts_on_cpu_time_like_the_kernel() {
    for mode in AttachMode::ALL {
        let probe = load_with(&[mode]);
        let steal_before = steal_ns();
        assert_eq!(probe.mode(), mode);
        let switch = probe.programs().into_iter().find(|p| p.name == "sched_switch").expect("sched_switch listed");
        assert_eq!((switch.attach.as_str(), switch.state.as_str()), (mode.as_str(), "attached"));
        let (tx, rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            spin_for(Duration::from_millis(200));
            tx.send((tid(), own_cpu_ns())).unwrap();
            let _ = done_rx.recv();
        });
        let (worker_tid, truth) = rx.recv().unwrap();
        let seen = probe.thread(worker_tid).unwrap_or_else(|| panic!("{mode:?}: thread not seen")).on_cpu_ns;
        assert_on_cpu_matches(mode.as_str(), seen, truth, steal_ns() - steal_before);
        done_tx.send(()).unwrap();
        worker.join().unwrap();
    }
}

#[test]
fn tracked_threads_account_reads_futex_waits_and_nvidia_ioctls() {
    let probe = load_with(&AttachMode::ALL);
    let failed: Vec<_> = probe.programs().into_iter().filter(|p| p.state == "failed").collect();
    assert!(failed.is_empty(), "syscall tracepoints attach: {failed:?}");
    probe.track(std::process::id(), std::process::id()).unwrap();

    // Blocked in read() on a pipe for ~150 ms, then 3000 bytes arrive.
    let (mut reader, mut writer) = std::io::pipe().unwrap();
    // Threads stay alive until their counters are read: an exited thread's entry is deleted.
    let (tx, rx) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let reading = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let n = reader.read(&mut buf).unwrap();
        tx.send((tid(), n)).unwrap();
        let _ = released.recv();
    });
    std::thread::sleep(Duration::from_millis(150));
    writer.write_all(&[7u8; 3000]).unwrap();
    let (reader_tid, n) = rx.recv().unwrap();
    assert_eq!(n, 3000);
    let stats = probe.ml_thread(reader_tid).expect("the reading thread has call counters");
    release.send(()).unwrap();
    reading.join().unwrap();
    assert!(stats.read_ns >= 120_000_000, "blocked ~150 ms in read, counted {} ns", stats.read_ns);
    assert_eq!(stats.read_bytes, 3000);
    assert!(stats.reads >= 1);

    // Waiting ~150 ms on a condition variable is a futex wait.
    let pair = Arc::new((Mutex::new(false), Condvar::new()));
    let waiter_pair = pair.clone();
    let (tx, rx) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let waiting = std::thread::spawn(move || {
        let (lock, ready) = &*waiter_pair;
        let mut go = lock.lock().unwrap();
        while !*go {
            go = ready.wait(go).unwrap();
        }
        drop(go);
        tx.send(tid()).unwrap();
        let _ = released.recv();
    });
    std::thread::sleep(Duration::from_millis(150));
    *pair.0.lock().unwrap() = true;
    pair.1.notify_all();
    let waiter_tid = rx.recv().unwrap();
    let stats = probe.ml_thread(waiter_tid).expect("the waiting thread has call counters");
    release.send(()).unwrap();
    waiting.join().unwrap();
    assert!(stats.futex_wait_ns >= 120_000_000, "waited ~150 ms, counted {} ns", stats.futex_wait_ns);

    // An ioctl on a character device named like NVIDIA's (here the null device's numbers: the
    // driver answers ENOTTY, which is fine: the call is what is counted).
    let dir = std::env::temp_dir().join(format!("ringside-nv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let node = dir.join("nvidia0");
    let _ = std::fs::remove_file(&node);
    let status = std::process::Command::new("mknod").arg(&node).args(["c", "1", "3"]).status().unwrap();
    assert!(status.success(), "mknod (root needed)");
    let other = dir.join("other0");
    let _ = std::fs::remove_file(&other);
    assert!(std::process::Command::new("mknod").arg(&other).args(["c", "1", "3"]).status().unwrap().success());
    let nvidia = std::fs::File::open(&node).unwrap();
    let plain = std::fs::File::open(&other).unwrap();
    let me = tid();
    for _ in 0..5 {
        // SAFETY: FIONREAD with a valid pointer to an int; the fds are open.
        unsafe {
            let mut n: libc::c_int = 0;
            libc::ioctl(nvidia.as_raw_fd(), libc::FIONREAD, &mut n);
            libc::ioctl(plain.as_raw_fd(), libc::FIONREAD, &mut n);
        }
    }
    let stats = probe.ml_thread(me).expect("this thread has call counters");
    assert_eq!(stats.nv_ioctls, 5, "only the ioctls on the nvidia-named device count");
    let _ = std::fs::remove_dir_all(&dir);

    // A process that is not tracked gets no entry.
    let child = std::process::Command::new("cat").arg("/proc/self/stat").output().unwrap();
    assert!(child.status.success());
    probe.untrack(std::process::id());
    assert!(probe.ml_thread_ids().iter().all(|t| probe.ml_thread(*t).is_some_and(|s| s.tgid == std::process::id())));
}

#[test]
fn children_of_a_tracked_process_are_tracked_from_birth_and_their_lifecycle_is_reported() {
    let mut probe = load_with(&AttachMode::ALL);
    let me = std::process::id();
    probe.track(me, me).unwrap();
    let _ = probe.drain_events();
    let mut child = std::process::Command::new("sleep").arg("0.3").spawn().unwrap();
    let child_pid = child.id();
    std::thread::sleep(Duration::from_millis(100));
    assert!(probe.tracked().contains(&(child_pid, me)), "tracked: {:?}", probe.tracked());
    assert!(child.wait().unwrap().success());
    std::thread::sleep(Duration::from_millis(20));
    let events = probe.drain_events();
    let of_child: Vec<_> = events.iter().filter(|e| e.tgid == child_pid).collect();
    let kinds: Vec<_> =
        of_child.iter().filter(|e| !matches!(e.kind, EventKind::RunqWait { .. })).map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [EventKind::Fork { parent_tgid: me, inherited: true }, EventKind::Exec, EventKind::Exit],
        "{of_child:?}"
    );
    assert!(of_child.iter().any(|e| e.kind == EventKind::Exec && e.comm == "sleep"), "{of_child:?}");
    assert!(!probe.tracked().iter().any(|(pid, _)| *pid == child_pid), "an exited process is untracked");

    // Untracked parents' children are reported, not tracked.
    probe.untrack(me);
    let mut other = std::process::Command::new("true").spawn().unwrap();
    let other_pid = other.id();
    other.wait().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let events = probe.drain_events();
    assert!(events
        .iter()
        .any(|e| e.tgid == other_pid && e.kind == EventKind::Fork { parent_tgid: me, inherited: false }));
    assert!(probe.lost().events == 0);
}

#[test]
fn run_queue_waits_of_tracked_threads_are_sampled() {
    let mut probe = load_with(&AttachMode::ALL);
    let me = std::process::id();
    probe.track(me, me).unwrap();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let (tx, rx) = mpsc::channel();
    let crowd: Vec<_> = (0..cpus * 3)
        .map(|_| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                tx.send(tid()).unwrap();
                spin_for(Duration::from_millis(200));
            })
        })
        .collect();
    let tids: Vec<u32> = (0..crowd.len()).map(|_| rx.recv().unwrap()).collect();
    for t in crowd {
        t.join().unwrap();
    }
    let events = probe.drain_events();
    let waits: Vec<u64> = events
        .iter()
        .filter(|e| tids.contains(&e.tid))
        .filter_map(|e| match e.kind {
            EventKind::RunqWait { ns } => Some(ns),
            _ => None,
        })
        .collect();
    assert!(waits.len() >= tids.len(), "{} samples for {} crowded threads", waits.len(), tids.len());
    assert!(waits.iter().any(|w| *w > 1_000_000), "some waited over 1 ms on a crowded CPU: {waits:?}");
    assert!(events.iter().filter(|e| matches!(e.kind, EventKind::RunqWait { .. })).all(|e| e.tgid == me));
}
