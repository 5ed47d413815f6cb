//! Tracked processes, lifecycle events and attach modes, in the real kernel (CI runs as root).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

use ringside_bpf::{AttachMode, AttachState, Attachment, EventKind, MlThreadStats, SchedProbe};

mod common;
use common::*;

#[test]
fn every_attach_mode_counts_on_cpu_time_like_the_kernel() {
    let _one = exclusive();
    for mode in AttachMode::ALL {
        let probe = load_with(&[mode]);
        let steal_before = steal_ns();
        assert_eq!(probe.mode(), mode);
        let switch = probe.programs().into_iter().find(|p| p.name == "sched_switch").expect("sched_switch listed");
        assert_eq!((switch.attach, switch.state), (Attachment::Mode(mode), AttachState::Attached));
        let (tx, rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            spin_for(Duration::from_millis(200));
            tx.send((tid(), own_cpu_ns())).unwrap();
            let _ = done_rx.recv();
        });
        let (worker_tid, truth) = rx.recv().unwrap();
        // The worker may still be on its CPU (between reporting and blocking): count the
        // stretch in progress too.
        let stats = probe.thread(worker_tid).unwrap_or_else(|| panic!("{mode:?}: thread not seen"));
        let seen = stats.at(ringside_bpf::monotonic_ns()).on_cpu_ns;
        let what = format!("{} (skipped runs {:?})", mode.as_str(), probe.skipped_runs());
        assert_on_cpu_matches(&what, seen, truth, steal_ns() - steal_before);
        done_tx.send(()).unwrap();
        worker.join().unwrap();
    }
}

/// A thread blocked ~150 ms in read() on a pipe until 3000 bytes arrive, and one waiting
/// ~150 ms on a condition variable (a futex wait): their call counters, read while they live.
fn block_in_read_and_futex(probe: &SchedProbe) -> (MlThreadStats, MlThreadStats) {
    let (mut reader, mut writer) = std::io::pipe().unwrap();
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
    let read_stats = probe.ml_thread(reader_tid).expect("the reading thread has call counters");
    release.send(()).unwrap();
    reading.join().unwrap();

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
    let wait_stats = probe.ml_thread(waiter_tid).expect("the waiting thread has call counters");
    release.send(()).unwrap();
    waiting.join().unwrap();
    (read_stats, wait_stats)
}

#[test]
fn waits_of_tracked_threads_are_classified_at_the_context_switch() {
    let _one = exclusive();
    let mut probe = load_with(&AttachMode::ALL);
    let status = probe.programs().into_iter().find(|p| p.attach == Attachment::SchedSwitch).expect("listed");
    assert_eq!(status.state, AttachState::Attached, "{status:?}");
    probe.track(std::process::id(), std::process::id()).unwrap();
    let (read, wait) = block_in_read_and_futex(&probe);
    assert!(read.read_ns >= 120_000_000, "blocked ~150 ms in read, counted {} ns", read.read_ns);
    assert!(read.reads >= 1 && read.futex_wait_ns < 20_000_000, "{read:?}");
    assert!(wait.futex_wait_ns >= 120_000_000, "waited ~150 ms, counted {} ns", wait.futex_wait_ns);
    assert!(wait.read_ns < 20_000_000, "{wait:?}");
    // A process that is not tracked gets no entry.
    probe.untrack(std::process::id());
    assert!(probe.ml_thread_ids().iter().all(|t| probe.ml_thread(*t).is_some_and(|s| s.tgid == std::process::id())));
}

#[test]
fn syscall_tracepoints_count_every_call_bytes_and_nvidia_ioctls() {
    let _one = exclusive();
    let mut probe = SchedProbe::load_with_options(&AttachMode::ALL, true).expect("root");
    let failed: Vec<_> = probe.programs().into_iter().filter(|p| p.state == AttachState::Failed).collect();
    assert!(failed.is_empty(), "syscall tracepoints attach: {failed:?}");
    probe.track(std::process::id(), std::process::id()).unwrap();
    let (read, wait) = block_in_read_and_futex(&probe);
    assert!(read.read_ns >= 120_000_000, "{read:?}");
    assert_eq!(read.read_bytes, 3000);
    assert!(wait.futex_wait_ns >= 120_000_000, "{wait:?}");

    // An ioctl on a character device named like NVIDIA's (here the null device's numbers: the
    // driver answers ENOTTY, which is fine: the call is what is counted).
    let dir = std::env::temp_dir().join(format!("ringside-nv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (node, other) = (dir.join("nvidia0"), dir.join("other0"));
    for path in [&node, &other] {
        let _ = std::fs::remove_file(path);
        let made = std::process::Command::new("mknod").arg(path).args(["c", "1", "3"]).status().unwrap();
        assert!(made.success(), "mknod (root needed)");
    }
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
}

#[test]
fn children_of_a_tracked_process_are_tracked_from_birth_and_their_lifecycle_is_reported() {
    let _one = exclusive();
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
    // `sleep 0.01` exits with 0; the plain tracepoint cannot read the status.
    let exited = EventKind::Exit { status: (probe.mode() != AttachMode::Tracepoint).then_some(0) };
    assert_eq!(kinds, [EventKind::Fork { parent_tgid: me, inherited: true }, EventKind::Exec, exited], "{of_child:?}");
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
    let _one = exclusive();
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

#[test]
fn ten_thousand_short_lived_children_of_a_tracked_process_leave_nothing_behind() {
    let _one = exclusive();
    let mut probe = load_with(&AttachMode::ALL);
    let me = std::process::id();
    probe.track(me, me).unwrap();
    let _ = probe.drain_events();
    let mut children = std::collections::HashSet::new();
    let (mut forks, mut exits) = (0, 0);
    for i in 0..10_000 {
        // SAFETY: the child calls only _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed at {i}");
        if pid == 0 {
            // SAFETY: _exit is async-signal-safe; the child ends here.
            unsafe { libc::_exit(0) };
        }
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        children.insert(pid as u32);
        if i % 500 == 499 {
            for e in probe.drain_events().iter().filter(|e| children.contains(&e.tgid)) {
                match e.kind {
                    EventKind::Fork { parent_tgid, inherited } => {
                        assert!(parent_tgid == me && inherited, "{e:?}");
                        forks += 1;
                    }
                    EventKind::Exit { .. } => exits += 1,
                    _ => {}
                }
            }
        }
    }
    assert_eq!((forks, exits), (10_000, 10_000), "every fork and exit reported");
    assert_eq!(probe.lost().events, 0);
    let leftovers: Vec<_> = probe.threads().into_iter().filter(|t| children.contains(&t.tid)).collect();
    assert!(leftovers.is_empty(), "no entries for exited children: {leftovers:?}");
    assert!(probe.tracked().iter().all(|(pid, _)| !children.contains(pid)), "exited children untracked");
    assert!(probe.ml_thread_ids().iter().all(|t| !children.contains(t)));
}
