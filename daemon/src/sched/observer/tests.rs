//! The observer on recorded windows, without BPF or root: a `/proc` tree laid out in a scratch
//! directory, a [`Probe`] whose counters each test advances by hand (a recording, not the
//! kernel), and an [`Enforcement`] that records what it is asked to do.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringside_bpf::{
    AttachMode, Attached, EntryPoint, Event, EventKind, Lost, MlThreadStats, ProbeError, Probes, ProgramStatus,
    ThreadStats,
};
use ringside_shared::{
    Decision, Phase, ProcessRole, SchedulerBackend, SchedulerMode, SchedulerTelemetry, ScxExitInfo, ScxStatus,
};

use super::super::enforcement::{Enforcement, ObserveOnly, Target};
use super::super::library::Limits;
use super::super::policy::{PhasePolicy, PolicyTable};
use super::super::probe::Probe;
use super::super::trust::{Admission, AdmissionConfig};
use super::{Observer, ObserverConfig, Published};
use crate::pipeline::{Feed, ThreadEvent};
use crate::test_support::ScratchDir;

const W: u64 = 100_000_000;
const MS: u64 = 1_000_000;

/// What the recorded probe holds: cumulative counters per thread, pending events.
#[derive(Default)]
struct Recording {
    threads: HashMap<u32, ThreadStats>,
    calls: HashMap<u32, MlThreadStats>,
    events: Vec<Event>,
    tracked: HashMap<u32, u32>,
    detached: Vec<u32>,
    gpu_text: HashMap<u32, Vec<(u64, u64)>>,
}

struct RecordedProbe(Arc<Mutex<Recording>>);

impl Probe for RecordedProbe {
    fn drain_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.0.lock().unwrap().events)
    }
    fn thread(&self, tid: u32) -> Option<ThreadStats> {
        self.0.lock().unwrap().threads.get(&tid).copied()
    }
    fn ml_thread(&self, tid: u32) -> Option<MlThreadStats> {
        self.0.lock().unwrap().calls.get(&tid).copied()
    }
    fn thread_count(&self) -> usize {
        self.0.lock().unwrap().threads.len()
    }
    fn threads_capacity(&self) -> usize {
        65_536
    }
    fn track(&mut self, tgid: u32, job: u32) -> Result<(), ProbeError> {
        self.0.lock().unwrap().tracked.insert(tgid, job);
        Ok(())
    }
    fn untrack(&mut self, tgid: u32) {
        self.0.lock().unwrap().tracked.remove(&tgid);
    }
    fn attach_library(&mut self, _: u32, _: &Path, _: &std::fs::File, _: &[EntryPoint]) -> Result<Attached, String> {
        Err("a recorded probe attaches nothing".into())
    }
    fn links_needed(&self, _: u32, _: &Path, _: &std::fs::File, _: &[EntryPoint]) -> usize {
        0
    }
    fn set_gpu_text(&mut self, tgid: u32, ranges: &[(u64, u64)]) -> Result<(), ProbeError> {
        self.0.lock().unwrap().gpu_text.insert(tgid, ranges.to_vec());
        Ok(())
    }
    fn probed_libraries(&self, _: u32) -> Vec<PathBuf> {
        Vec::new()
    }
    fn probed_processes(&self) -> Vec<u32> {
        Vec::new()
    }
    fn detach_process(&mut self, pid: u32) {
        self.0.lock().unwrap().detached.push(pid);
    }
    fn mode(&self) -> AttachMode {
        AttachMode::TpBtf
    }
    fn programs(&self) -> Vec<ProgramStatus> {
        Vec::new()
    }
    fn lost(&self) -> Lost {
        Lost::default()
    }
    fn skipped_runs(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
}

/// What the enforcement was asked to do.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    Apply { tid: u32, phase: Phase, nice_floor: i32 },
    Restore(u32),
    Forget(u32),
    Admission { pid: u32, admitted: bool, threads: Vec<u32> },
    Gone(u32),
}

#[derive(Default)]
struct Asked {
    calls: Vec<Call>,
    /// Handed out once by `take_exit`, which then falls back to setattr (as `SchedExt` does).
    exit: Option<ScxExitInfo>,
}

struct RecordingEnforcement {
    backend: SchedulerBackend,
    asked: Arc<Mutex<Asked>>,
}

impl Enforcement for RecordingEnforcement {
    fn backend(&self) -> SchedulerBackend {
        self.backend
    }
    fn apply(&mut self, target: &Target, _: &PhasePolicy, decision: &mut Decision) {
        let call = Call::Apply { tid: target.thread.tid, phase: target.phase, nice_floor: target.nice_floor };
        self.asked.lock().unwrap().calls.push(call);
        decision.applied = true;
    }
    fn restore(&mut self, tid: u32) -> Result<bool, super::super::policy::EnforceError> {
        self.asked.lock().unwrap().calls.push(Call::Restore(tid));
        Ok(true)
    }
    fn forget(&mut self, tid: u32) {
        self.asked.lock().unwrap().calls.push(Call::Forget(tid));
    }
    fn admission_changed(&mut self, pid: u32, admitted: bool, threads: &[u32]) {
        let mut threads = threads.to_vec();
        threads.sort_unstable();
        self.asked.lock().unwrap().calls.push(Call::Admission { pid, admitted, threads });
    }
    fn process_gone(&mut self, pid: u32) {
        self.asked.lock().unwrap().calls.push(Call::Gone(pid));
    }
    fn take_exit(&mut self) -> Option<ScxExitInfo> {
        let exit = self.asked.lock().unwrap().exit.take()?;
        self.backend = SchedulerBackend::Setattr;
        Some(exit)
    }
    fn scx_status(&self) -> Option<ScxStatus> {
        None
    }
    fn stop(&mut self) -> usize {
        0
    }
}

/// A `/proc` tree with the files the observer reads.
struct FakeProc {
    _dir: ScratchDir,
    root: PathBuf,
}

fn stat_line(pid: u32, comm: &str, ppid: u32, start: u64) -> String {
    format!("{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 1 0 0 0 3 1 0 0 20 0 4 0 {start} 0 0\n")
}

impl FakeProc {
    fn new(name: &str) -> FakeProc {
        let dir = ScratchDir::new(name);
        let root = dir.path().join("proc");
        std::fs::create_dir_all(&root).unwrap();
        FakeProc { _dir: dir, root }
    }

    /// A process with its command line, its user and threads `tids` (its own pid first).
    fn process(&self, pid: u32, ppid: u32, cmdline: &str, uid: u32, tids: &[u32]) {
        let dir = self.root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("stat"), stat_line(pid, "python3", ppid, 1000 + u64::from(pid))).unwrap();
        std::fs::write(dir.join("cmdline"), cmdline.replace(' ', "\0")).unwrap();
        self.user(pid, uid);
        for &tid in tids {
            self.thread(pid, tid);
        }
    }

    fn user(&self, pid: u32, uid: u32) {
        let status = format!(
            "Name:\tpython3\nTgid:\t{pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
        );
        std::fs::write(self.root.join(pid.to_string()).join("status"), status).unwrap();
    }

    fn thread(&self, pid: u32, tid: u32) {
        let dir = self.root.join(pid.to_string()).join("task").join(tid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("stat"), stat_line(tid, "pt_main", pid, 2000 + u64::from(tid))).unwrap();
        std::fs::write(dir.join("comm"), format!("thread-{tid}\n")).unwrap();
    }

    fn end_thread(&self, pid: u32, tid: u32) {
        std::fs::remove_dir_all(self.root.join(pid.to_string()).join("task").join(tid.to_string())).unwrap();
    }

    fn end_process(&self, pid: u32) {
        std::fs::remove_dir_all(self.root.join(pid.to_string())).unwrap();
    }
}

/// The observer over a fake `/proc`, a recorded probe and (unless `observe`) a recording
/// enforcement that admits user 1000.
struct Harness {
    proc: FakeProc,
    probe: Arc<Mutex<Recording>>,
    asked: Arc<Mutex<Asked>>,
    published: Arc<Mutex<Published>>,
    observer: Observer,
    now_ms: u64,
}

impl Harness {
    fn new(name: &str, backend: SchedulerBackend) -> Harness {
        let proc = FakeProc::new(name);
        let probe = Arc::new(Mutex::new(Recording::default()));
        let asked = Arc::new(Mutex::new(Asked::default()));
        let published = Arc::new(Mutex::new(Published::default()));
        let admission = AdmissionConfig { users: vec!["1000".into()], beyond_rlimit_nice: true, ..Default::default() };
        let config = ObserverConfig {
            window: Duration::from_nanos(W),
            // Every window scans: what a test lays out is found at its next window.
            scan_interval: Duration::ZERO,
            policy: PolicyTable::default(),
            ml_patterns: vec!["train.py".into()],
            // No `io` files to read: reads come from the probe's counters.
            syscall_tracepoints: true,
            proc_root: proc.root.clone(),
            sys_root: proc.root.join("sys"),
            max_processes: 16,
            libraries: Limits { max_bytes: 1 << 20, timeout: Duration::from_secs(1) },
            admission: Admission::resolve(&admission).unwrap(),
            paging: super::super::trust::Paging::resolve(None, &admission).unwrap(),
            watch: Default::default(),
            job_window: Duration::from_secs(10),
            probes: Probes::default(),
        };
        let enforcement: Box<dyn Enforcement> = match backend {
            SchedulerBackend::Observe => Box::new(ObserveOnly),
            backend => Box::new(RecordingEnforcement { backend, asked: asked.clone() }),
        };
        let observer = Observer::new(
            Box::new(RecordedProbe(probe.clone())),
            config,
            enforcement,
            published.clone(),
            Feed::new(16),
        );
        Harness { proc, probe, asked, published, observer, now_ms: 1_700_000_000_000 }
    }

    /// Adds to a thread's counters what it did in the coming window.
    fn spend(&self, tid: u32, f: impl FnOnce(&mut ThreadStats, &mut MlThreadStats)) {
        let mut recording = self.probe.lock().unwrap();
        let mut sched = recording.threads.get(&tid).copied().unwrap_or(ThreadStats { tid, ..Default::default() });
        let mut calls = recording.calls.get(&tid).copied().unwrap_or(MlThreadStats { tid, ..Default::default() });
        f(&mut sched, &mut calls);
        recording.threads.insert(tid, sched);
        recording.calls.insert(tid, calls);
    }

    /// `ms` of the window in NCCL collectives (spinning: on a CPU too).
    fn nccl(&self, tid: u32, ms: u64) {
        self.spend(tid, |s, c| {
            s.on_cpu_ns += ms * MS;
            c.nccl_ns += ms * MS;
        });
    }

    /// `ms` of the window blocked in reads.
    fn read(&self, tid: u32, ms: u64) {
        self.spend(tid, |_, c| c.read_ns += ms * MS);
    }

    fn cpu(&self, tid: u32, ms: u64) {
        self.spend(tid, |s, _| s.on_cpu_ns += ms * MS);
    }

    /// `ms` of the window on a CPU, with `samples` timer-tick samples of which `in_driver`
    /// found it in the GPU driver's code.
    fn cpu_sampled(&self, tid: u32, ms: u64, samples: u64, in_driver: u64) {
        self.spend(tid, |s, c| {
            s.on_cpu_ns += ms * MS;
            c.samples += samples;
            c.driver_samples += in_driver;
        });
    }

    fn window(&mut self) {
        self.observer.window(W, self.now_ms, self.now_ms + W / MS);
        self.now_ms += W / MS;
    }

    fn telemetry(&self) -> SchedulerTelemetry {
        self.published.lock().unwrap().telemetry.clone().expect("published")
    }

    fn phase_of(&self, tid: u32) -> Phase {
        self.telemetry().tasks.iter().find(|t| t.tid == tid).map(|t| t.phase).expect("task listed")
    }

    /// What the enforcement was asked since the last call.
    fn calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.asked.lock().unwrap().calls)
    }

    fn applied(&self) -> Vec<(u32, Phase)> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Apply { tid, phase, .. } => Some((tid, phase)),
                _ => None,
            })
            .collect()
    }
}

/// A training process (user 1000) with two threads, seen once: its counters so far are the
/// baseline of its first window.
fn training(name: &str, backend: SchedulerBackend) -> Harness {
    let mut h = Harness::new(name, backend);
    h.proc.process(4001, 1, "python3 train.py --epochs 3", 1000, &[4001, 4002]);
    h.cpu(4001, 5);
    h.cpu(4002, 5);
    h.window();
    h.window();
    assert_eq!(h.probe.lock().unwrap().tracked.get(&4001), Some(&4001), "the process is tracked as its own job");
    h
}

#[test]
fn a_busy_thread_feeds_the_gpu_when_its_ticks_find_it_in_the_driver_and_steps_otherwise() {
    let mut h = training("observer-feeding", SchedulerBackend::Observe);
    // 90 ms on a CPU, 6 of its 22 tick samples in the driver (launching): GPU compute.
    for _ in 0..2 {
        h.cpu_sampled(4001, 90, 22, 6);
        h.window();
    }
    assert_eq!(h.phase_of(4001), Phase::GpuCompute);
    let task = h.telemetry().tasks.into_iter().find(|t| t.tid == 4001).unwrap();
    assert_eq!(task.features["driver"], 0.273, "{:?}", task.features);
    // The same CPU time in its own code (one stray sample in the driver): the optimizer step,
    // once the window before has gone out of the judgement too.
    for _ in 0..3 {
        h.cpu_sampled(4001, 90, 22, 1);
        h.window();
    }
    assert_eq!(h.phase_of(4001), Phase::OptimizerStep);
    // Too few samples in one window alone, enough over two.
    for _ in 0..2 {
        h.cpu_sampled(4001, 90, 2, 1);
        h.window();
    }
    assert_eq!(h.phase_of(4001), Phase::GpuCompute);
}

#[test]
fn the_gpu_drivers_code_in_a_process_goes_to_the_tick_sampler() {
    let mut h = training("observer-text", SchedulerBackend::Observe);
    let maps = "\
7f0000000000-7f0000100000 r--p 00000000 fd:01 11 /usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03
7f0000100000-7f0000600000 r-xp 00100000 fd:01 11 /usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03
7f0000600000-7f0000700000 rw-p 00600000 fd:01 11 /usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03
7f1000000000-7f1000080000 r-xp 00010000 fd:01 12 /opt/venv/nvidia/cuda_runtime/lib/libcudart.so.12
7f2000000000-7f2000300000 r-xp 00090000 fd:01 13 /opt/venv/nvidia/nccl/lib/libnccl.so.2
7f3000000000-7f3000100000 r-xp 00000000 fd:01 14 /usr/lib/x86_64-linux-gnu/libc.so.6
";
    std::fs::write(h.proc.root.join("4001/maps"), maps).unwrap();
    // The maps of a tracked process are read again every few scans.
    for _ in 0..6 {
        h.window();
    }
    let text = h.probe.lock().unwrap().gpu_text.get(&4001).cloned();
    assert_eq!(
        text,
        Some(vec![(0x7f0000100000, 0x7f0000600000), (0x7f1000000000, 0x7f1000080000)]),
        "the driver's and the runtime's code, not their data, not NCCL's nor libc's"
    );
}

#[test]
fn strong_evidence_decides_at_once_weak_evidence_after_two_windows_and_a_held_phase_not_again() {
    let mut h = training("observer-enter", SchedulerBackend::Setattr);
    assert!(h.applied().is_empty(), "nothing decided without evidence: {:?}", h.calls());
    h.nccl(4001, 80);
    h.read(4002, 40);
    h.window();
    assert_eq!(h.applied(), vec![(4001, Phase::NcclCollective)], "80% is strong: taken in one window");
    assert_eq!(h.phase_of(4002), Phase::Unknown, "40% is weak: one window is not enough");
    h.nccl(4001, 80);
    h.read(4002, 40);
    h.window();
    assert_eq!(h.applied(), vec![(4002, Phase::DataLoading)], "a weak candidate that wins twice is taken");
    for _ in 0..3 {
        h.nccl(4001, 70);
        h.read(4002, 50);
        h.window();
    }
    assert!(h.applied().is_empty(), "a phase held is not decided again");
    let t = h.telemetry();
    assert_eq!(t.mode, SchedulerMode::Enforce);
    assert_eq!(t.decisions_made, 2);
    assert_eq!(t.phase_transitions, 2);
    let nccl = &t.decisions.iter().find(|d| d.tid == 4001).unwrap();
    assert!(nccl.applied && nccl.error.is_none(), "{nccl:?}");
    assert!(nccl.reason.starts_with("entered nccl_collective: over 100 ms"), "{}", nccl.reason);
    assert!(nccl.reason.contains("nccl 80%"), "{}", nccl.reason);
    assert_eq!(nccl.nice, -5, "the default policy's nice value");
}

#[test]
fn a_weak_challenger_that_never_wins_twice_in_a_row_does_not_take_over() {
    let mut h = training("observer-flap", SchedulerBackend::Setattr);
    for i in 0..6 {
        if i % 2 == 0 {
            h.read(4001, 40);
        } else {
            h.nccl(4001, 40);
        }
        h.window();
    }
    assert_eq!(h.phase_of(4001), Phase::Unknown);
    assert!(h.applied().is_empty());
    h.nccl(4001, 80);
    h.window();
    assert_eq!(h.applied(), vec![(4001, Phase::NcclCollective)]);
    // A strong challenger against a phase still holding strongly, without a clear margin
    // (65% against 60%), must win twice like a weak one.
    h.nccl(4001, 60);
    h.read(4001, 65);
    h.window();
    assert_eq!(h.phase_of(4001), Phase::NcclCollective);
    h.nccl(4001, 60);
    h.read(4001, 65);
    h.window();
    assert_eq!(h.applied(), vec![(4001, Phase::DataLoading)]);
}

#[test]
fn leaving_a_phase_takes_two_quiet_windows_in_a_row_and_restores_the_thread() {
    let mut h = training("observer-exit", SchedulerBackend::Setattr);
    h.nccl(4001, 90);
    h.window();
    assert_eq!(h.applied(), vec![(4001, Phase::NcclCollective)]);
    // Quiet, then busy again, then quiet: never two quiet windows in a row.
    for ms in [10, 90, 10, 90, 10] {
        h.nccl(4001, ms);
        h.window();
    }
    assert_eq!(h.phase_of(4001), Phase::NcclCollective);
    assert!(h.calls().is_empty());
    h.nccl(4001, 10);
    h.window();
    assert_eq!(h.phase_of(4001), Phase::Unknown);
    assert_eq!(h.calls(), vec![Call::Restore(4001)]);
    let restore = h.telemetry().decisions[0].clone();
    assert_eq!((restore.tid, restore.phase, restore.action.as_str()), (4001, Phase::Unknown, "restore own settings"));
    assert!(restore.applied);
    // The other thread: in at once, out after two quiet windows.
    h.read(4002, 90);
    h.window();
    h.window();
    h.window();
    assert_eq!(
        h.calls(),
        vec![Call::Apply { tid: 4002, phase: Phase::DataLoading, nice_floor: -20 }, Call::Restore(4002)]
    );
}

#[test]
fn observe_mode_records_decisions_and_changes_nothing() {
    let mut h = training("observer-observe", SchedulerBackend::Observe);
    h.nccl(4001, 90);
    h.window();
    let t = h.telemetry();
    assert_eq!(t.mode, SchedulerMode::Observe);
    assert_eq!(t.backend, SchedulerBackend::Observe);
    let d = &t.decisions[0];
    assert_eq!((d.tid, d.phase), (4001, Phase::NcclCollective));
    assert!(!d.applied && d.error.is_none(), "observe records, and not admitting is no error there: {d:?}");
    assert_eq!(t.processes[0].admission, "observe mode: nothing is changed");
    assert!(t.enforcement_inactive.is_none());
}

#[test]
fn a_process_not_admitted_is_decided_for_with_the_reason_and_never_changed() {
    let mut h = Harness::new("observer-admission", SchedulerBackend::Setattr);
    h.proc.process(5001, 1, "python3 train.py", 2000, &[5001]);
    h.cpu(5001, 1);
    h.window();
    h.window();
    h.nccl(5001, 90);
    h.window();
    assert!(h.applied().is_empty());
    let t = h.telemetry();
    let d = &t.decisions[0];
    assert!(!d.applied);
    assert_eq!(d.error.as_deref(), Some("not admitted: user 2000 is in no admitted user, group or cgroup"));
    assert!(!t.processes[0].admitted);
}

#[test]
fn a_process_that_loses_admission_gets_its_threads_back() {
    let mut h = training("observer-readmission", SchedulerBackend::Setattr);
    assert_eq!(h.calls(), vec![Call::Admission { pid: 4001, admitted: true, threads: vec![] }]);
    h.nccl(4001, 90);
    h.window();
    assert_eq!(h.applied(), vec![(4001, Phase::NcclCollective)]);
    // An exec to a setuid program, say: another user now.
    h.proc.user(4001, 2000);
    h.nccl(4001, 90);
    h.window();
    assert_eq!(h.calls(), vec![Call::Admission { pid: 4001, admitted: false, threads: vec![4001, 4002] }]);
    assert!(!h.telemetry().processes[0].admitted);
}

#[test]
fn threads_and_processes_that_end_are_forgotten_and_untracked() {
    let mut h = training("observer-end", SchedulerBackend::Setattr);
    h.calls();
    h.proc.end_thread(4001, 4002);
    h.window();
    assert_eq!(h.calls(), vec![Call::Forget(4002)]);
    assert_eq!(h.telemetry().tasks.len(), 1);
    h.proc.end_process(4001);
    h.window();
    assert_eq!(h.calls(), vec![Call::Gone(4001), Call::Forget(4001)]);
    let recording = h.probe.lock().unwrap();
    assert!(recording.tracked.is_empty());
    assert_eq!(recording.detached, vec![4001]);
    drop(recording);
    let t = h.telemetry();
    assert!(t.processes.is_empty() && t.tasks.is_empty());
}

impl Harness {
    /// The thread events published since the last call, as the metrics source takes them.
    fn thread_events(&self) -> Vec<ThreadEvent> {
        std::mem::take(&mut self.published.lock().unwrap().thread_events)
    }
}

#[test]
fn every_phase_change_of_a_thread_is_an_event_at_its_window_s_start() {
    let mut h = Harness::new("observer-thread-events", SchedulerBackend::Observe);
    let t0 = h.now_ms;
    h.proc.process(4001, 1, "python3 train.py", 1000, &[4001, 4002]);
    h.window();
    h.window();
    let events = h.thread_events();
    // A new observer says first that no thread of an earlier one is observed; then each
    // thread from the window it was first seen in, named, in the phase it starts in.
    assert_eq!(events.first(), Some(&ThreadEvent::AllGone { at_ms: t0 }), "{events:?}");
    let started: Vec<(u32, Phase, Option<String>)> = events
        .iter()
        .filter_map(|e| match e {
            ThreadEvent::Phase { tid, phase, comm, pid: 4001, .. } => Some((*tid, *phase, comm.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(started.len(), 2, "{events:?}");
    assert!(started.iter().all(|(_, phase, comm)| *phase == Phase::Unknown && comm.is_some()), "{started:?}");

    // Into a collective, out again after two quiet windows: each change at the start of the
    // window the phase was settled in, and nothing while the phase holds.
    let collective_from = h.now_ms;
    h.nccl(4001, 90);
    h.window();
    h.nccl(4001, 90);
    h.window();
    h.nccl(4001, 5);
    h.window();
    let unknown_from = h.now_ms;
    h.nccl(4001, 5);
    h.window();
    let changes: Vec<(u64, u32, Phase)> = h
        .thread_events()
        .into_iter()
        .filter_map(|e| match e {
            ThreadEvent::Phase { at_ms, tid, phase, comm: None, .. } => Some((at_ms, tid, phase)),
            _ => None,
        })
        .collect();
    assert_eq!(changes, vec![(collective_from, 4001, Phase::NcclCollective), (unknown_from, 4001, Phase::Unknown)]);

    // A thread that exits, then the whole process: each thread said gone.
    let ended = h.now_ms;
    h.proc.end_thread(4001, 4002);
    h.window();
    assert_eq!(h.thread_events(), vec![ThreadEvent::Gone { at_ms: ended, tid: 4002 }]);
    h.proc.end_process(4001);
    h.window();
    let gone: Vec<u32> = h
        .thread_events()
        .iter()
        .filter_map(|e| if let ThreadEvent::Gone { tid, .. } = e { Some(*tid) } else { None })
        .collect();
    assert_eq!(gone, vec![4001]);
}

#[test]
fn thread_events_not_taken_are_bounded_and_counted() {
    let mut h = training("observer-thread-events-bound", SchedulerBackend::Observe);
    h.thread_events();
    // Far more phase changes than the source is given between two ticks: a thread in and out
    // of a data wait every window, for long enough.
    {
        let mut published = h.published.lock().unwrap();
        published.thread_events = vec![ThreadEvent::Gone { at_ms: 0, tid: 1 }; super::MAX_THREAD_EVENTS - 1];
    }
    h.nccl(4001, 90);
    h.read(4002, 90);
    h.window();
    let published = h.published.lock().unwrap();
    assert_eq!(published.thread_events.len(), super::MAX_THREAD_EVENTS);
    assert_eq!(published.thread_events_lost, 1, "the oldest given up and counted");
    let mut newest: Vec<(u32, Phase)> = published.thread_events[super::MAX_THREAD_EVENTS - 2..]
        .iter()
        .filter_map(|e| if let ThreadEvent::Phase { tid, phase, .. } = e { Some((*tid, *phase)) } else { None })
        .collect();
    newest.sort_unstable();
    assert_eq!(newest, vec![(4001, Phase::NcclCollective), (4002, Phase::DataLoading)], "the newest kept");
}

#[test]
fn an_exit_event_ends_a_process_at_once() {
    let mut h = training("observer-exit-event", SchedulerBackend::Setattr);
    h.calls();
    h.probe.lock().unwrap().events.push(Event {
        kind: EventKind::Exit { status: Some(9) },
        tid: 4001,
        tgid: 4001,
        at_ns: 0,
        comm: "python3".into(),
    });
    // Still in /proc (a zombie, say): the event is what ends it.
    h.observer.handle_events();
    let mut calls = h.calls();
    calls.sort_by_key(|c| format!("{c:?}"));
    assert_eq!(calls, vec![Call::Forget(4001), Call::Forget(4002), Call::Gone(4001)]);
}

#[test]
fn a_worker_forked_by_a_job_joins_it_and_its_cpu_time_is_data_loading() {
    let mut h = training("observer-worker", SchedulerBackend::Setattr);
    h.proc.process(4100, 4001, "python3 -c worker", 1000, &[4100]);
    h.probe.lock().unwrap().events.push(Event {
        kind: EventKind::Fork { parent_tgid: 4001, inherited: true },
        tid: 4100,
        tgid: 4100,
        at_ns: 0,
        comm: "pt_data_worker".into(),
    });
    h.cpu(4100, 1);
    h.window();
    let t = h.telemetry();
    let worker = t.processes.iter().find(|p| p.pid == 4100).expect("the worker is listed");
    assert_eq!((worker.job, worker.role), (4001, ProcessRole::Worker));
    assert_eq!(worker.reason, "child of 4001");
    h.calls();
    h.cpu(4100, 90);
    h.window();
    assert_eq!(h.applied(), vec![(4100, Phase::DataLoading)], "a worker's busy CPU is loading data");
    // The same CPU time in the main process is the optimizer step.
    h.cpu(4001, 90);
    h.window();
    assert_eq!(h.applied(), vec![(4001, Phase::OptimizerStep)]);
}

#[test]
fn when_the_kernel_stops_sched_ext_the_phases_in_force_are_carried_out_again() {
    let mut h = training("observer-scx-exit", SchedulerBackend::Scx);
    h.nccl(4001, 90);
    h.read(4002, 90);
    h.window();
    h.calls();
    assert_eq!(h.telemetry().backend, SchedulerBackend::Scx);
    h.asked.lock().unwrap().exit = Some(ScxExitInfo {
        at_ms: h.now_ms,
        kind: ringside_shared::ScxExitKind::WatchdogStall,
        reason: "runnable task stall".into(),
        message: String::new(),
        ejected: true,
    });
    h.observer.check_scx();
    assert_eq!(h.applied(), vec![(4001, Phase::NcclCollective), (4002, Phase::DataLoading)]);
    h.observer.check_scx();
    assert!(h.calls().is_empty(), "an exit is acted on once");
    h.window();
    assert_eq!(h.telemetry().backend, SchedulerBackend::Setattr);
}

#[test]
fn what_is_published_is_bounded_and_the_timeline_merges_windows() {
    let mut h = training("observer-publish", SchedulerBackend::Setattr);
    for _ in 0..3 {
        h.nccl(4001, 90);
        h.nccl(4002, 90);
        h.window();
    }
    // Flapping strongly every window: a decision per thread per window.
    for i in 0..40 {
        for tid in [4001, 4002] {
            if i % 2 == 0 {
                h.read(tid, 90);
            } else {
                h.nccl(tid, 90);
            }
        }
        h.window();
    }
    let t = h.telemetry();
    assert_eq!(t.decisions.len(), SchedulerTelemetry::MAX_DECISIONS);
    assert_eq!(t.decisions_made, 82);
    assert!(t.decisions.windows(2).all(|d| d[0].at_ms >= d[1].at_ms), "newest first");
    let process = &t.processes[0];
    assert_eq!(process.threads, 2);
    // Two quiet windows, three of NCCL, then a span per window of flapping.
    let spans = &process.timeline;
    assert_eq!(spans[0].phase, Phase::Unknown);
    assert_eq!(spans[1].phase, Phase::NcclCollective);
    assert_eq!(spans[1].end_ms - spans[1].start_ms, 300, "three windows of one phase are one span");
    assert!(spans.windows(2).all(|s| s[0].end_ms <= s[1].start_ms && s[0].phase != s[1].phase));
    let pct: f64 = Phase::ALL.iter().map(|p| t.phase_time_pct.get(*p)).sum();
    assert!((pct - 100.0).abs() < 1e-6, "{pct}");
    assert_eq!(t.phase_distribution.get(Phase::NcclCollective), 2);
}

/// Who a process is comes from its cgroup path and environment, read once when it is first
/// tracked; the path wins where both speak.
#[test]
fn a_tracked_process_carries_its_job_identity() {
    let mut h = Harness::new("observer-identity", SchedulerBackend::Observe);
    h.proc.process(4001, 1, "python3 train.py", 1000, &[4001]);
    let dir = h.proc.root.join("4001");
    std::fs::write(dir.join("cgroup"), "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_3\n").unwrap();
    std::fs::write(dir.join("environ"), b"SLURM_JOB_ID=1\0SLURM_PROCID=3\0LOCAL_RANK=1\0WORLD_SIZE=16\0").unwrap();
    h.cpu(4001, 5);
    h.window();
    h.window();
    let identity = h.telemetry().processes[0].identity.clone();
    assert_eq!(identity.job_id().as_deref(), Some("4242.0"));
    assert_eq!((identity.rank, identity.local_rank, identity.world_size), (Some(3), Some(1), Some(16)));
}

#[test]
fn a_thread_blocked_in_a_collective_says_since_when_and_a_return_is_progress() {
    let mut h = training("observer-collective", SchedulerBackend::Observe);
    let began = ringside_bpf::monotonic_ns() - 5_000 * MS;
    h.spend(4001, |_, c| {
        c.call_in_progress = (ringside_bpf::CallKind::Nccl as u32, began);
        c.nccl_calls += 1;
    });
    h.window();
    let process = h.telemetry().processes[0].clone();
    let since = process.collective_waiting_since_ms.expect("waiting in a collective");
    let waited = h.now_ms.saturating_sub(since);
    assert!((4_900..5_300).contains(&waited), "began 5 s ago: {waited} ms");
    assert_eq!(process.collective_returned_ms, None, "entered, not returned");
    // A synchronize on the collective it enqueued is waiting in it too.
    h.spend(4001, |_, c| {
        c.call_in_progress = (ringside_bpf::CallKind::Sync as u32, began);
        c.last_enqueue = ringside_bpf::CallKind::Nccl as u32;
    });
    h.window();
    assert!(h.telemetry().processes[0].collective_waiting_since_ms.is_some());
    // It returns: progress, and nobody waits.
    h.spend(4001, |_, c| c.call_in_progress = (0, 0));
    h.window();
    let process = h.telemetry().processes[0].clone();
    assert_eq!(process.collective_waiting_since_ms, None);
    assert_eq!(process.collective_returned_ms, Some(h.now_ms));
    assert_eq!(process.cmdline, "python3 train.py --epochs 3");
    assert!(process.recent_observed_ms > 0);
}
