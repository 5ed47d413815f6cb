//! The recorder over synthetic ticks (scheduler telemetry built by hand, as a real scheduler
//! would report it) and the store on a real directory.

use std::time::Duration;

use ringside_shared::{
    AlertTransition, Decision, HistoryPoint, IncidentBundle, MlProcessInfo, MlTaskInfo, Phase, PhaseSpan,
    SchedulerTelemetry, Severity, TransitionKind,
};

use super::store::BundleStore;
use super::*;
use crate::pipeline::ThreadEvent;
use crate::test_support::{alert, ScratchDir};

const NODE_START: u64 = 1_000_000;

fn node() -> NodeIdentity {
    NodeIdentity {
        hostname: "node-a".into(),
        kernel: String::new(),
        os: String::new(),
        architecture: String::new(),
        cpus: 2,
        numa_nodes: 1,
        gpus: Vec::new(),
        daemon_version: String::new(),
        daemon_started_at_ms: NODE_START,
    }
}

fn task(pid: u32, tid: u32, phase: Phase) -> MlTaskInfo {
    MlTaskInfo {
        pid,
        tid,
        comm: format!("t{tid}"),
        phase,
        phase_ms: Default::default(),
        on_cpu_pct: 0.0,
        runq_p50_ns: None,
        runq_p99_ns: None,
        features: Default::default(),
        last_decision: None,
        calls: Default::default(),
    }
}

fn decision(at_ms: u64, tid: u32, action: &str) -> Decision {
    Decision {
        at_ms,
        pid: 10,
        tid,
        comm: format!("t{tid}"),
        phase: Phase::DataLoading,
        action: action.into(),
        reason: "test".into(),
        applied: false,
        error: None,
        nice: 0,
        weight: 1024,
        slice_us: 0,
        cpus: String::new(),
    }
}

/// A tick at second `s`: threads 11 (loading data until 8 s, then in a collective) and 12
/// (computing), a process timeline of whole seconds, and every decision made so far
/// (one each second) listed newest first as the scheduler lists its latest.
fn sample(s: u64) -> (Sample, HistoryPoint) {
    let t = NODE_START + s * 1000;
    let phase11 = if s < 8 { Phase::DataLoading } else { Phase::NcclCollective };
    let timeline: Vec<PhaseSpan> = (s.saturating_sub(3)..=s)
        .map(|k| PhaseSpan {
            phase: if k < 8 { Phase::DataLoading } else { Phase::NcclCollective },
            start_ms: NODE_START + k * 1000,
            end_ms: NODE_START + (k * 1000 + 1000).min(s * 1000),
            waiting_for_cpu: false,
        })
        .collect();
    let scheduler = SchedulerTelemetry {
        ml_tasks: 2,
        decisions_made: s,
        tasks: vec![task(10, 11, phase11), task(10, 12, Phase::GpuCompute)],
        processes: vec![MlProcessInfo {
            pid: 10,
            job: 10,
            comm: "train".into(),
            cmdline: "python train.py".into(),
            timeline,
            ..MlProcessInfo::default()
        }],
        decisions: (1..=s).rev().take(3).map(|k| decision(NODE_START + k * 1000, 11, "nice -5")).collect(),
        ..SchedulerTelemetry::default()
    };
    let point = HistoryPoint {
        t_ms: t,
        cpu_pct: s as f64,
        iowait_pct: 0.0,
        mem_used_pct: 50.0,
        load1: 0.0,
        kernels: Vec::new(),
        gpus: Vec::new(),
    };
    (
        Sample {
            taken_at_ms: t,
            readings: ringside_shared::Readings { scheduler: Some(scheduler), ..Default::default() },
            ..Sample::default()
        },
        point,
    )
}

fn raised(id: u64, severity: Severity, at_ms: u64) -> AlertChange {
    let mut a = alert(id, severity, "collective hang");
    a.raised_at_ms = at_ms;
    a.transitions.push(AlertTransition {
        at_ms,
        kind: TransitionKind::Raised,
        severity,
        value: 1.0,
        by: None,
        note: None,
    });
    AlertChange::Raised(a)
}

fn config(before_s: u64, after_s: u64) -> IncidentsConfig {
    IncidentsConfig { before_s, after_s, ..IncidentsConfig::default() }
}

fn read(store: &BundleStore, id: u64) -> IncidentBundle {
    serde_json::from_slice(&store.read(id).expect("the bundle's file")).expect("a bundle")
}

#[test]
fn a_bundle_covers_before_to_after_with_thread_spans_decisions_and_events() {
    let dir = ScratchDir::new("incidents-span");
    let store = BundleStore::open(dir.path(), 10, 64 << 20);
    let mut recorder = Recorder::new(config(5, 3), node(), 1000, store);
    for s in 0..=14 {
        let (sample, point) = sample(s);
        let changes = match s {
            10 => vec![raised(7, Severity::Critical, sample.taken_at_ms)],
            // A warning does not start a bundle at the default `critical`.
            11 => vec![raised(8, Severity::Warning, sample.taken_at_ms)],
            _ => Vec::new(),
        };
        recorder.record(&sample, Some(&point), &changes);
        let list = recorder.list();
        if (10..13).contains(&s) {
            assert!(list.len() == 1 && list[0].recording && list[0].alert_id == 7, "recording at {s}: {list:?}");
        }
    }
    assert!(recorder.finish(Duration::from_secs(5)));
    let list = recorder.list();
    assert_eq!(list.len(), 1, "{list:?}");
    let summary = &list[0];
    assert!(!summary.recording && summary.complete && summary.bytes > 0, "{summary:?}");
    let bundle = read(recorder.store(), summary.id);
    assert_eq!(summary.bytes, recorder.store().read(summary.id).unwrap().len() as u64);
    assert_eq!(
        (bundle.fired_at_ms, bundle.start_ms, bundle.end_ms),
        (NODE_START + 10_000, NODE_START + 5000, NODE_START + 13_000)
    );
    let times: Vec<u64> = bundle.history.iter().map(|p| (p.t_ms - NODE_START) / 1000).collect();
    assert_eq!(times, (5..=13).collect::<Vec<_>>());
    assert_eq!(bundle.scheduler.len(), 9);

    // Thread 11: loading data up to 7 s, then in a collective; a span starts at the tick before.
    let t11 = bundle.threads.iter().find(|t| t.tid == 11).expect("thread 11");
    let spans: Vec<(Phase, u64, u64)> =
        t11.spans.iter().map(|s| (s.phase, (s.start_ms - NODE_START) / 1000, (s.end_ms - NODE_START) / 1000)).collect();
    assert_eq!(spans, vec![(Phase::DataLoading, 5, 7), (Phase::NcclCollective, 7, 13)]);
    assert_eq!(t11.comm, "t11");
    assert_eq!(bundle.threads.len(), 2);

    // The process timeline merged from overlapping reports, clipped to the span.
    let p = &bundle.processes[0];
    assert_eq!((p.pid, p.comm.as_str(), p.cmdline.as_str()), (10, "train", "python train.py"));
    assert_eq!(p.spans.first().map(|s| s.start_ms), Some(NODE_START + 5000));
    assert!(p.spans.windows(2).all(|w| w[0].start_ms < w[1].start_ms), "no span twice: {:?}", p.spans);
    assert_eq!(p.spans.len(), 8, "{:?}", p.spans);

    // Each decision once, though every tick listed the last three.
    let at: Vec<u64> = bundle.decisions.iter().map(|d| (d.at_ms - NODE_START) / 1000).collect();
    assert_eq!(at, (5..=13).collect::<Vec<_>>());
    assert!(bundle.notes.is_empty(), "{:?}", bundle.notes);
    let events: Vec<(u64, Severity)> = bundle.alert_events.iter().map(|e| (e.alert_id, e.severity)).collect();
    assert_eq!(events, vec![(7, Severity::Critical), (8, Severity::Warning)]);
}

#[test]
fn the_trace_has_one_track_per_thread_with_phase_slices_and_instant_events() {
    let dir = ScratchDir::new("incidents-trace");
    let mut recorder = Recorder::new(config(5, 2), node(), 1000, BundleStore::open(dir.path(), 10, 64 << 20));
    for s in 0..=12 {
        let (sample, point) = sample(s);
        let changes = if s == 10 { vec![raised(1, Severity::Critical, sample.taken_at_ms)] } else { Vec::new() };
        recorder.record(&sample, Some(&point), &changes);
    }
    assert!(recorder.finish(Duration::from_secs(5)));
    let bundle = read(recorder.store(), recorder.list()[0].id);
    let trace = bundle.chrome_trace();
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let named: Vec<(u64, u64)> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
        .collect();
    assert_eq!(named, vec![(10, 11), (10, 12)]);
    let sliced: std::collections::BTreeSet<(u64, u64)> = events
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
        .collect();
    assert_eq!(sliced.into_iter().collect::<Vec<_>>(), named);
    let slice = events.iter().find(|e| e["ph"] == "X" && e["name"] == "nccl_collective").expect("a collective slice");
    assert_eq!(slice["ts"].as_u64(), Some((NODE_START + 7000) * 1000), "microseconds: {slice}");
    assert_eq!(slice["dur"].as_u64(), Some(5_000_000), "{slice}");
    assert!(events.iter().any(|e| e["ph"] == "i" && e["cat"] == "decision" && e["tid"] == 11));
    assert!(events.iter().any(|e| e["ph"] == "i" && e["s"] == "g" && e["cat"] == "alert"));
    assert!(events.iter().any(|e| e["ph"] == "C" && e["name"] == "host"));
    // Async process slices pair up.
    let begins = events.iter().filter(|e| e["ph"] == "b").count();
    assert!(begins > 0 && begins == events.iter().filter(|e| e["ph"] == "e").count());
}

#[test]
fn an_escalation_to_the_level_starts_a_bundle_and_one_alert_records_one_at_a_time() {
    let dir = ScratchDir::new("incidents-escalate");
    let mut recorder = Recorder::new(config(1, 5), node(), 1000, BundleStore::open(dir.path(), 10, 64 << 20));
    let (sample0, _) = sample(0);
    recorder.record(&sample0, None, &[raised(3, Severity::Warning, sample0.taken_at_ms)]);
    assert!(recorder.list().is_empty());
    let (sample1, _) = sample(1);
    let AlertChange::Raised(mut a) = raised(3, Severity::Warning, sample0.taken_at_ms) else { unreachable!() };
    a.severity = Severity::Critical;
    a.transitions.push(AlertTransition {
        at_ms: sample1.taken_at_ms,
        kind: TransitionKind::Escalated,
        severity: Severity::Critical,
        value: 2.0,
        by: None,
        note: None,
    });
    recorder.record(&sample1, None, &[AlertChange::Updated(a.clone())]);
    assert_eq!(recorder.list().len(), 1, "escalated to critical");
    // Acknowledged between ticks: the bundle closes with the acknowledgement, an event.
    a.acknowledgement = Some(ringside_shared::Acknowledgement {
        by: "ana".into(),
        token: "operator".into(),
        at_ms: sample1.taken_at_ms + 10,
        note: None,
    });
    a.transitions.push(AlertTransition {
        at_ms: sample1.taken_at_ms + 10,
        kind: TransitionKind::Acknowledged,
        severity: Severity::Critical,
        value: 2.0,
        by: Some("ana".into()),
        note: None,
    });
    recorder.note_alert(&a);
    // Reopened while its bundle records: no second bundle.
    let (sample2, _) = sample(2);
    a.transitions.push(AlertTransition {
        at_ms: sample2.taken_at_ms,
        kind: TransitionKind::Reopened,
        severity: Severity::Critical,
        value: 2.0,
        by: None,
        note: None,
    });
    recorder.record(&sample2, None, &[AlertChange::Raised(a)]);
    assert_eq!(recorder.list().len(), 1);
    // Stopped before its end: written with what it has, marked incomplete.
    assert!(recorder.finish(Duration::from_secs(5)));
    let list = recorder.list();
    assert!(!list[0].recording && !list[0].complete, "{list:?}");
    let bundle = read(recorder.store(), list[0].id);
    assert_eq!(bundle.end_ms, sample2.taken_at_ms);
    assert_eq!(bundle.alert.acknowledgement.as_ref().map(|a| a.by.as_str()), Some("ana"));
    let kinds: Vec<TransitionKind> = bundle.alert_events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        vec![TransitionKind::Raised, TransitionKind::Escalated, TransitionKind::Acknowledged, TransitionKind::Reopened]
    );
}

/// The bounds under a storm: 1,000 critical alerts firing, 10 per tick.
fn storm(label: &str, max_count: usize, max_bytes: u64) -> (usize, u64) {
    let dir = ScratchDir::new(label);
    let cfg = IncidentsConfig { before_s: 30, after_s: 1, max_count, max_bytes, ..IncidentsConfig::default() };
    let mut recorder = Recorder::new(cfg, node(), 1000, BundleStore::open(dir.path(), max_count, max_bytes));
    let on_disk = || -> (usize, u64) {
        let files: Vec<std::fs::Metadata> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| bundle_file(&e.file_name().to_string_lossy()))
            .filter_map(|e| e.metadata().ok())
            .collect();
        (files.len(), files.iter().map(|m| m.len()).sum())
    };
    let mut worst = (0, 0);
    for s in 0..110u64 {
        let (sample, point) = sample(s);
        let changes: Vec<AlertChange> = if s < 100 {
            (0..10).map(|k| raised(1 + s * 10 + k, Severity::Critical, sample.taken_at_ms)).collect()
        } else {
            Vec::new()
        };
        recorder.record(&sample, Some(&point), &changes);
        // Recording, waiting for the writer, queued to it: each bounded.
        let unwritten = recorder.list().iter().filter(|l| l.recording).count();
        assert!(unwritten <= 2 * max_count + store::QUEUE, "{unwritten} not written");
        let (n, bytes) = on_disk();
        worst = (worst.0.max(n), worst.1.max(bytes));
    }
    assert!(recorder.finish(Duration::from_secs(60)));
    let (n, bytes) = on_disk();
    assert!(n <= max_count && bytes <= max_bytes, "{n} files, {bytes} bytes on disk");
    let list = recorder.list();
    assert_eq!(list.len(), n);
    let (kept, kept_bytes, dropped) = recorder.store().totals();
    assert_eq!((kept as usize, kept_bytes), (n, bytes));
    // The newest were kept; the rest were given up or removed, oldest first.
    assert!(list.iter().all(|l| l.alert_id > 900), "{:?}", list.iter().map(|l| l.alert_id).collect::<Vec<_>>());
    assert!(list.iter().all(|l| !l.recording));
    assert!(list.windows(2).all(|w| w[0].id > w[1].id));
    eprintln!(
        "1000 alerts, max_count {max_count}, max_bytes {max_bytes}: {n} bundles ({bytes} bytes) kept, {dropped} \
         dropped; at most {} files and {} bytes at once",
        worst.0, worst.1
    );
    (worst.0, worst.1)
}

#[test]
fn a_thousand_firing_alerts_leave_at_most_max_count_bundles() {
    let (most, _) = storm("incidents-storm-count", 20, 64 << 20);
    // While a bundle is written the oldest is still there: one over, never more.
    assert!(most <= 21, "{most} files at once");
}

#[test]
fn a_thousand_firing_alerts_leave_at_most_max_bytes() {
    let max_bytes = 1 << 20;
    let (_, most) = storm("incidents-storm-bytes", 1000, max_bytes);
    let one = 30 * 1024 * 1024 / 1000; // far above one bundle of this test
    assert!(most <= max_bytes + one, "{most} bytes at once");
}

fn bundle_file(name: &str) -> bool {
    name.ends_with(".json") && name != "index.json"
}

#[test]
fn the_store_reopens_its_bundles_and_recovers_one_the_index_missed() {
    let dir = ScratchDir::new("incidents-reopen");
    let mut recorder = Recorder::new(config(2, 0), node(), 1000, BundleStore::open(dir.path(), 10, 64 << 20));
    for s in 0..4 {
        let (sample, point) = sample(s);
        let changes = if s >= 2 { vec![raised(s, Severity::Critical, sample.taken_at_ms)] } else { Vec::new() };
        recorder.record(&sample, Some(&point), &changes);
    }
    assert!(recorder.finish(Duration::from_secs(5)));
    let before = recorder.list();
    assert_eq!(before.len(), 2);
    // A crash between the file and the index: the index forgets the newest bundle; a half
    // written file and a stranger are left behind.
    let newest = before[0].id;
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("index.json")).unwrap()).unwrap();
    let mut forgetful = index.clone();
    forgetful["bundles"] = serde_json::json!(index["bundles"].as_array().unwrap()[..1]);
    std::fs::write(dir.path().join("index.json"), forgetful.to_string()).unwrap();
    std::fs::write(dir.path().join("99.json.tmp"), "{").unwrap();
    std::fs::write(dir.path().join("98.json"), "not a bundle").unwrap();

    let store = BundleStore::open(dir.path(), 10, 64 << 20);
    assert_eq!(store.list(), before, "the same bundles, the forgotten one found again");
    assert!(store.next_id() > newest);
    assert!(!dir.path().join("99.json.tmp").exists() && !dir.path().join("98.json").exists());
    assert!(store.error().is_none(), "{:?}", store.error());
    // An index that is not JSON is rebuilt from the files, and said.
    std::fs::write(dir.path().join("index.json"), "garbage").unwrap();
    let store = BundleStore::open(dir.path(), 10, 64 << 20);
    assert_eq!(store.list(), before);
    assert!(store.error().is_some_and(|e| e.contains("rebuilt")));
    // Reopened with a lower count, the oldest go.
    let store = BundleStore::open(dir.path(), 1, 64 << 20);
    assert_eq!(store.list(), before[..1]);
    assert!(matches!(store.read(before[1].id), Err(store::ReadError::NotFound(_))));
}

#[test]
fn the_config_refuses_spans_that_do_not_fit_in_memory() {
    assert!(IncidentsConfig::default().check(1000).is_ok());
    let long = IncidentsConfig { before_s: 3600, after_s: 3600, ..IncidentsConfig::default() };
    assert!(long.check(100).unwrap_err().to_string().contains("ticks"));
    assert!(IncidentsConfig { max_count: 0, ..IncidentsConfig::default() }.check(1000).is_err());
    assert!(IncidentsConfig { max_bytes: 10, ..IncidentsConfig::default() }.check(1000).is_err());
}

#[test]
fn a_bundle_over_max_bytes_is_not_kept_and_said_until_one_is_written_again() {
    let dir = ScratchDir::new("incidents-too-big");
    let max_bytes = 4000;
    let cfg = IncidentsConfig { before_s: 0, after_s: 0, max_bytes, ..IncidentsConfig::default() };
    let mut recorder = Recorder::new(cfg, node(), 1000, BundleStore::open(dir.path(), 10, max_bytes));
    let wait_written = |recorder: &Recorder, n: u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while recorder.store().totals().0 + recorder.store().totals().2 < n && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // A tick with 100 threads: its bundle is larger than max_bytes.
    let (mut big, _) = sample(1);
    if let Some(s) = big.readings.scheduler.as_mut() {
        s.tasks = (0..100).map(|t| task(10, 100 + t, Phase::GpuCompute)).collect();
    }
    recorder.record(&big, None, &[raised(1, Severity::Critical, big.taken_at_ms)]);
    wait_written(&recorder, 1);
    assert_eq!(recorder.store().totals(), (0, 0, 1));
    assert!(recorder.store().error().is_some_and(|e| e.contains("max_bytes")), "{:?}", recorder.store().error());
    // A small one is kept, and the store is healthy again.
    let small = Sample { taken_at_ms: NODE_START + 5000, ..Sample::default() };
    recorder.record(&small, None, &[raised(2, Severity::Critical, small.taken_at_ms)]);
    wait_written(&recorder, 2);
    let (kept, bytes, dropped) = recorder.store().totals();
    assert!(kept == 1 && bytes <= max_bytes && dropped == 1, "{kept} {bytes} {dropped}");
    assert_eq!(recorder.store().error(), None);
    assert!(recorder.finish(Duration::from_secs(5)));
}

#[test]
fn beyond_the_thread_bound_the_alert_s_job_is_kept_first() {
    let dir = ScratchDir::new("incidents-many-threads");
    let mut recorder = Recorder::new(config(0, 0), node(), 1000, BundleStore::open(dir.path(), 10, 64 << 20));
    let (mut tick, _) = sample(1);
    if let Some(s) = tick.readings.scheduler.as_mut() {
        // 290 threads of job 10 listed before the 10 threads of job 20.
        s.tasks = (0..290).map(|t| task(10, 1000 + t, Phase::GpuCompute)).collect();
        s.tasks.extend((0..10).map(|t| task(20, 2000 + t, Phase::NcclCollective)));
        s.processes.push(MlProcessInfo { pid: 20, job: 20, comm: "rank1".into(), ..MlProcessInfo::default() });
    }
    let AlertChange::Raised(mut hang) = raised(5, Severity::Critical, tick.taken_at_ms) else { unreachable!() };
    hang.labels.insert("job".into(), "20".into());
    recorder.record(&tick, None, &[AlertChange::Raised(hang)]);
    assert!(recorder.finish(Duration::from_secs(5)));
    let bundle = read(recorder.store(), recorder.list()[0].id);
    assert_eq!(bundle.threads.len(), MAX_THREADS);
    assert_eq!(bundle.threads.iter().filter(|t| t.pid == 20).count(), 10, "the job's threads all kept");
    assert!(bundle.notes.iter().any(|n| n.contains("44 threads left out")), "{:?}", bundle.notes);
}

/// `sample(s)` with the scheduler's thread events since the tick before: thread 11 starts
/// loading data and enters its collective at 7.6 s; thread 13 (never among the busiest
/// listed) is seen at 4.2 s, changes phase three times between the ticks at 6 and 7 s, and
/// exits at 9.4 s.
fn sample_with_events(s: u64) -> (Sample, HistoryPoint) {
    let (mut sample, point) = sample(s);
    let at = |ms: u64| NODE_START + ms;
    let phase = |ms: u64, tid: u32, phase: Phase, comm: Option<&str>| ThreadEvent::Phase {
        at_ms: at(ms),
        pid: 10,
        tid,
        phase,
        comm: comm.map(str::to_string),
    };
    sample.thread_events = match s {
        0 => vec![ThreadEvent::AllGone { at_ms: at(0) }, phase(0, 11, Phase::DataLoading, Some("t11"))],
        5 => vec![phase(4200, 13, Phase::Unknown, Some("loader"))],
        7 => vec![
            phase(6300, 13, Phase::DataLoading, None),
            phase(6700, 13, Phase::NcclCollective, None),
            phase(6900, 13, Phase::DataLoading, None),
        ],
        8 => vec![phase(7600, 11, Phase::NcclCollective, None)],
        10 => vec![ThreadEvent::Gone { at_ms: at(9400), tid: 13 }],
        _ => Vec::new(),
    };
    (sample, point)
}

#[test]
fn thread_timelines_follow_the_scheduler_s_events_between_ticks() {
    let dir = ScratchDir::new("incidents-thread-events");
    let mut recorder = Recorder::new(config(5, 3), node(), 1000, BundleStore::open(dir.path(), 10, 64 << 20));
    for s in 0..=13 {
        let (mut sample, point) = sample_with_events(s);
        if s == 12 {
            sample.thread_events_lost = 7;
        }
        let changes = if s == 10 { vec![raised(7, Severity::Critical, sample.taken_at_ms)] } else { Vec::new() };
        recorder.record(&sample, Some(&point), &changes);
    }
    assert!(recorder.finish(Duration::from_secs(5)));
    let bundle = read(recorder.store(), recorder.list()[0].id);
    let spans = |tid: u32| -> Vec<(Phase, u64, u64)> {
        let t = bundle.threads.iter().find(|t| t.tid == tid).unwrap_or_else(|| panic!("thread {tid}"));
        t.spans.iter().map(|s| (s.phase, s.start_ms - NODE_START, s.end_ms - NODE_START)).collect()
    };
    // At the window's resolution, not the tick's: 7.6 s, where the listing alone says 7 s.
    assert_eq!(spans(11), vec![(Phase::DataLoading, 5000, 7600), (Phase::NcclCollective, 7600, 13_000)]);
    // Three changes within one tick, and the exit, all kept; a thread never listed is there.
    assert_eq!(
        spans(13),
        vec![
            (Phase::Unknown, 5000, 6300),
            (Phase::DataLoading, 6300, 6700),
            (Phase::NcclCollective, 6700, 6900),
            (Phase::DataLoading, 6900, 9400),
        ]
    );
    assert_eq!(bundle.threads.iter().find(|t| t.tid == 13).map(|t| t.comm.as_str()), Some("loader"));
    assert_eq!(bundle.threads.len(), 3);
    assert!(
        bundle.notes.iter().any(|n| n.starts_with("7 thread phase changes given up")),
        "what the scheduler gave up is said: {:?}",
        bundle.notes
    );
    // The trace: the three changes as three slices on thread 13's track.
    let trace = bundle.chrome_trace();
    let slices: Vec<(u64, u64)> = trace["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == 13)
        .map(|e| ((e["ts"].as_u64().unwrap() / 1000) - NODE_START, e["dur"].as_u64().unwrap() / 1000))
        .collect();
    assert_eq!(slices, vec![(5000, 1300), (6300, 400), (6700, 200), (6900, 2500)]);
}

fn wait_idle(store: &BundleStore) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !store.idle() {
        assert!(std::time::Instant::now() < deadline, "the writer never finished");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn checkpoint_of(dir: &std::path::Path, id: u64) -> Option<IncidentBundle> {
    let bytes = std::fs::read(dir.join(format!("{id}.partial"))).ok()?;
    Some(serde_json::from_slice(&bytes).expect("a checkpoint is a bundle"))
}

#[test]
fn a_recording_bundle_is_checkpointed_when_it_fires_and_every_30_s_then_replaced() {
    let dir = ScratchDir::new("incidents-checkpoint");
    let mut recorder = Recorder::new(config(5, 65), node(), 1000, BundleStore::open(dir.path(), 10, 64 << 20));
    let mut id = None;
    for s in 0..=75 {
        let (sample, point) = sample(s);
        let changes = if s == 10 { vec![raised(7, Severity::Critical, sample.taken_at_ms)] } else { Vec::new() };
        recorder.record(&sample, Some(&point), &changes);
        wait_idle(recorder.store());
        let current = recorder.list().first().map(|b| b.id);
        id = id.or(current);
        let checkpoint = id.and_then(|id| checkpoint_of(dir.path(), id));
        match s {
            0..=9 => assert!(id.is_none()),
            // At the alert: the evidence from before it, on disk at once.
            10..=39 => {
                let c = checkpoint.expect("a checkpoint from the alert on");
                assert_eq!((c.start_ms, c.end_ms, c.complete), (NODE_START + 5000, NODE_START + 10_000, false));
                assert_eq!(c.history.len(), 6);
                assert!(c.notes.iter().any(|n| n.starts_with("a checkpoint")), "{:?}", c.notes);
            }
            40..=69 => assert_eq!(checkpoint.expect("renewed").end_ms, NODE_START + 40_000),
            70..=74 => assert_eq!(checkpoint.expect("renewed").end_ms, NODE_START + 70_000),
            _ => assert!(checkpoint.is_none(), "the bundle written, its checkpoint is gone"),
        }
    }
    let bundle = read(recorder.store(), id.expect("a bundle"));
    assert!(bundle.complete && bundle.notes.is_empty(), "{:?}", bundle.notes);
    assert!(recorder.finish(Duration::from_secs(5)));
}

#[test]
fn a_checkpoint_left_by_a_killed_daemon_is_the_bundle_cut_short_at_the_next_start() {
    let dir = ScratchDir::new("incidents-killed");
    let mut recorder = Recorder::new(config(5, 60), node(), 1000, BundleStore::open(dir.path(), 10, 64 << 20));
    for s in 0..=12 {
        let (sample, point) = sample(s);
        let changes = if s == 10 { vec![raised(7, Severity::Critical, sample.taken_at_ms)] } else { Vec::new() };
        recorder.record(&sample, Some(&point), &changes);
    }
    wait_idle(recorder.store());
    let id = recorder.list()[0].id;
    // Killed: nothing more is written, no stop runs.
    std::mem::forget(recorder);
    let store = BundleStore::open(dir.path(), 10, 64 << 20);
    let list = store.list();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!((list[0].id, list[0].recording, list[0].complete), (id, false, false));
    let bundle = read(&store, id);
    assert_eq!((bundle.alert.id, bundle.fired_at_ms, bundle.end_ms), (7, NODE_START + 10_000, NODE_START + 10_000));
    assert_eq!(bundle.history.len(), 6, "the evidence from before the alert");
    assert!(checkpoint_of(dir.path(), id).is_none(), "the checkpoint became the bundle");
    assert_eq!(store.next_id(), id + 1, "its id is not given again");
    // A checkpoint next to its written bundle (killed between the two) is only removed.
    std::fs::write(dir.path().join(format!("{id}.partial")), b"{}").unwrap();
    let store = BundleStore::open(dir.path(), 10, 64 << 20);
    assert_eq!(store.list().len(), 1);
    assert!(!dir.path().join(format!("{id}.partial")).exists());
}
