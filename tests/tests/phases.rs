//! Phase detection, ML job tracking and enforcement, end to end: the real daemon with its BPF
//! probe, and `ml-workload` — a labelled training loop calling the CUDA and NCCL test doubles
//! — which logs its own ground truth. CI runs as root: these run for real.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ringside_tests::{ml_process, nice_of, Daemon, DaemonOptions, Scratch, Workload};
use serde_json::Value;

const PHASES: [&str; 4] = ["data_loading", "gpu_compute", "nccl_collective", "optimizer_step"];
const WINDOW_MS: u64 = 100;

/// One daemon at a time: each finds every ML process on the node, so an `enforce` daemon would
/// act on the other test's workload too.
static ONE_DAEMON: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn scheduler_config(mode: &str) -> String {
    format!("[scheduler]\nmode = \"{mode}\"\nwindow_ms = {WINDOW_MS}\nscan_interval_ms = 200\n")
}

/// One line of the workload's ground truth.
struct Truth {
    phase: String,
    start_ms: u64,
    end_ms: u64,
}

fn read_truth(path: &Path) -> Result<Vec<Truth>> {
    let text = std::fs::read_to_string(path).context("ground truth log")?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: Value = serde_json::from_str(line)?;
            Ok(Truth {
                phase: v["phase"].as_str().context("phase")?.to_string(),
                start_ms: v["start_ms"].as_u64().context("start_ms")?,
                end_ms: v["end_ms"].as_u64().context("end_ms")?,
            })
        })
        .collect()
}

/// Time (ms) in `[from, to)` during which the timeline says `phase`, and time it covers at all.
fn agreement(timeline: &[Value], phase: &str, from: u64, to: u64) -> (u64, u64) {
    let (mut agree, mut covered) = (0, 0);
    for span in timeline {
        let (start, end) = (span["start_ms"].as_u64().unwrap_or(0), span["end_ms"].as_u64().unwrap_or(0));
        let overlap = end.min(to).saturating_sub(start.max(from));
        covered += overlap;
        if span["phase"] == phase {
            agree += overlap;
        }
    }
    (agree, covered)
}

#[tokio::test(flavor = "multi_thread")]
async fn phases_of_a_labelled_training_loop_are_detected() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    // A `stats` ring kernel fed the run-queue latencies the probe samples.
    let config = scheduler_config("observe") + "\n[[kernels]]\nid = \"runq\"\nkernel = \"stats\"\n";
    // A GPU from the NVML test double (no GPU here), busy exactly while the workload is in
    // `gpu_compute` (its samples follow the workload's own log): the idle attribution is
    // scored against that ground truth below.
    let nvml = Scratch::new("phases-nvml");
    let control = nvml.0.join("nvml-double.conf");
    let daemon = Daemon::start(DaemonOptions {
        config,
        env: ringside_tests::nvml_double(&control),
        ..DaemonOptions::default()
    })?;
    let dir = Scratch::new("phases");
    let workload = Workload::start(&dir.0, 1500, 3)?;
    let pid = workload.pid();
    let truth_path = dir.0.join("truth.jsonl");
    std::fs::write(&control, format!("gpu 0 process {pid} 1073741824 50\ngpu 0 busy_log {}\n", truth_path.display()))?;

    // Detected, tracked, its libraries probed, its DataLoader worker part of the job.
    let snapshot = daemon
        .wait_for("the workload tracked with both libraries probed", 10, |s| {
            ml_process(s, pid).is_some_and(|p| p["probed_libraries"].as_array().is_some_and(|l| l.len() >= 2))
        })
        .await?;
    let main = ml_process(&snapshot, pid).unwrap();
    assert_eq!(main["role"], "main", "{main}");
    assert!(main["reason"].as_str().unwrap_or_default().contains("libcuda.so"), "{main}");
    let processes = snapshot["scheduler"]["processes"].as_array().unwrap();
    let worker = processes
        .iter()
        .find(|p| p["job"] == pid && p["pid"] != pid)
        .with_context(|| format!("the DataLoader worker belongs to the job: {processes:?}"))?;
    assert_eq!((worker["role"].as_str(), worker["comm"].as_str()), (Some("worker"), Some("pt_data_worker")));

    // Prometheus sees the job too, and the exposition stays valid with per-process series.
    let metrics = daemon.get("/metrics").await?.text().await?;
    let series = format!("ringside_scheduler_process_phase_seconds_total{{pid=\"{pid}\",job=\"{pid}\"");
    assert!(metrics.contains(&series), "{metrics}");
    ringside_tests::promtool_check(&metrics)?;

    // Keep the latest timeline until the workload ends (an exited process leaves the snapshot).
    let mut timeline = Vec::new();
    let mut idle = Value::Null;
    let mut step = Value::Null;
    let mut main_nice = Vec::new();
    let mut workload = workload;
    let deadline = Instant::now() + Duration::from_secs(60);
    while workload.0.try_wait()?.is_none() {
        anyhow::ensure!(Instant::now() < deadline, "the workload did not finish in 60 s");
        let snapshot = daemon.get_json("/api/snapshot").await?;
        if let Some(p) = ml_process(&snapshot, pid) {
            timeline = p["timeline"].as_array().cloned().unwrap_or_default();
        }
        let attribution = snapshot["gpus"]["idle"].as_array().and_then(|a| a.iter().find(|x| x["job"] == pid).cloned());
        if attribution.as_ref().is_some_and(|a| a["last_step"].is_object()) {
            step = attribution.as_ref().map(|a| a["last_step"].clone()).unwrap_or_default();
        }
        idle = attribution.unwrap_or(idle);
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            main_nice.extend(stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(16)).map(String::from));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(workload.0.wait()?.success(), "the workload ran to the end");
    assert!(main_nice.iter().all(|n| n == "0"), "observe mode changes nothing: nice {main_nice:?}");

    // Score every ground-truth phase the daemon watched, leaving out its first window (the
    // window that straddles the change).
    let truth = read_truth(&dir.0.join("truth.jsonl"))?;
    assert_eq!(truth.len(), 12, "3 cycles of 4 phases");
    let mut per_phase: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for t in &truth {
        let (agree, covered) = agreement(&timeline, &t.phase, t.start_ms + WINDOW_MS, t.end_ms);
        let entry = per_phase.entry(PHASES.iter().find(|p| **p == t.phase).copied().unwrap_or("other")).or_default();
        entry.0 += agree;
        entry.1 += covered;
    }
    let mut report = String::new();
    for (phase, (agree, covered)) in &per_phase {
        report += &format!("{phase}: {:.1}% of {covered} ms\n", *agree as f64 * 100.0 / (*covered).max(1) as f64);
    }
    println!("phase detection accuracy against the workload's ground truth:\n{report}");
    for phase in PHASES {
        let (agree, covered) = per_phase.get(phase).copied().unwrap_or_default();
        assert!(covered >= 2000, "{phase}: only {covered} ms observed\n{report}");
        assert!(agree as f64 >= covered as f64 * 0.9, "{phase} below 90%\n{report}timeline: {timeline:?}");
    }

    // Why the GPU sat idle, against the truth: it was idle exactly while the workload was out
    // of `gpu_compute`, three phases of four of equal length. NVML's samples laid over the
    // phase timeline put that idle time in those phases; a per-tick estimate could not (the
    // double's tick utilisation is a flat 50 %: it would say 50 % idle, an eighth while
    // computing).
    let pct = |phase: &str| idle["idle_by_phase_pct"][phase].as_f64().unwrap_or(f64::NAN);
    println!("idle attribution: {idle}");
    assert_eq!(idle["aligned"], true, "{idle}");
    let (window, until) = (idle["window_ms"].as_u64().unwrap_or(0), idle["until_ms"].as_u64().unwrap_or(0));
    assert!(window >= 10_000, "{idle}");
    // The truth over the span the figures cover: each phase's share of it.
    let share = |phase: &str| {
        let from = until.saturating_sub(window);
        let ms: u64 = truth
            .iter()
            .filter(|t| t.phase == phase)
            .map(|t| t.end_ms.min(until).saturating_sub(t.start_ms.max(from)))
            .sum();
        ms as f64 * 100.0 / window as f64
    };
    let truly_idle = 100.0 - share("gpu_compute");
    println!(
        "truth over the same span: idle {truly_idle:.1}%, data_loading {:.1}%, nccl_collective {:.1}%, optimizer_step {:.1}%",
        share("data_loading"),
        share("nccl_collective"),
        share("optimizer_step")
    );
    assert!((idle["idle_pct"].as_f64().unwrap_or(0.0) - truly_idle).abs() <= 5.0, "truly {truly_idle:.1}%: {idle}");
    for phase in ["data_loading", "nccl_collective", "optimizer_step"] {
        let truth = share(phase);
        assert!((pct(phase) - truth).abs() <= 5.0, "{phase}: idle through the whole phase, {truth:.1}%: {idle}");
    }
    assert!(pct("gpu_compute") <= 5.0, "busy while computing: {idle}");
    let starved = idle["idle_waiting_for_cpu_pct"].as_f64().unwrap_or(f64::NAN);
    assert!(starved <= 5.0, "nothing else runs here: not starved of CPU: {idle}");
    // The last complete step (one cycle of four 1.5 s phases, from one data loading to the
    // next), against the truth over the same span.
    println!("last step: {step}");
    let (from, to) = (step["start_ms"].as_u64().unwrap_or(0), step["end_ms"].as_u64().unwrap_or(0));
    assert_eq!(step["anchor"], "data_loading", "{step}");
    assert!(to.saturating_sub(from).abs_diff(6000) <= 400, "a 6 s step: {step}");
    let step_share = |phase: &str| {
        let ms: u64 = truth
            .iter()
            .filter(|t| t.phase == phase)
            .map(|t| t.end_ms.min(to).saturating_sub(t.start_ms.max(from)))
            .sum();
        ms as f64 * 100.0 / to.saturating_sub(from).max(1) as f64
    };
    let step_pct = |phase: &str| step["idle_by_phase_pct"][phase].as_f64().unwrap_or(f64::NAN);
    for phase in ["data_loading", "nccl_collective", "optimizer_step"] {
        let truth = step_share(phase);
        assert!((step_pct(phase) - truth).abs() <= 8.0, "{phase} in the step: truly {truth:.1}%: {step}");
    }
    assert!((step["idle_pct"].as_f64().unwrap_or(0.0) - (100.0 - step_share("gpu_compute"))).abs() <= 8.0, "{step}");

    let snapshot = daemon.get_json("/api/snapshot").await?;
    let scheduler = &snapshot["scheduler"];
    assert!(scheduler["phase_transitions"].as_u64().unwrap_or(0) >= 8, "{scheduler}");
    // The workload's threads waited in run queues; the stats kernel summarised those waits.
    let kernel = snapshot["kernels"].as_array().and_then(|k| k.iter().find(|k| k["id"] == "runq")).cloned();
    let stats = kernel.as_ref().map(|k| k["output_stats"].clone()).unwrap_or_default();
    assert_eq!((&stats["input"], &stats["unit"]), (&Value::from("runq_latency"), &Value::from("us")), "{kernel:?}");
    assert!(stats["count"].as_u64().unwrap_or(0) > 0, "run-queue samples summarised: {stats}");
    let (p50, p99, max) = (stats["p50"].as_f64(), stats["p99"].as_f64(), stats["max"].as_f64());
    assert!(matches!((p50, p99, max), (Some(a), Some(b), Some(c)) if a <= b && b <= c), "{stats}");
    let decisions = scheduler["decisions"].as_array().unwrap();
    assert!(decisions.iter().any(|d| d["pid"] == pid && d["applied"] == false), "observe records decisions");
    daemon.wait_for("the exited workload leaving the table", 5, |s| ml_process(s, pid).is_none()).await?;
    let metrics = daemon.get("/metrics").await?.text().await?;
    assert!(metrics.contains("zernel_scheduler_phase_time_pct{phase=\"gpu_compute\"}"), "{metrics}");
    let step_series = format!("ringside_job_step_seconds{{job=\"{pid}\",comm=\"ml-workload\",gpu=\"0\"");
    assert!(metrics.contains(&step_series), "{step_series} in {metrics}");
    assert!(metrics.contains("ringside_job_gpu_step_idle_ratio{"), "{metrics}");
    assert!(metrics.contains("ringside_kernel_stats_runq_latency_seconds{kernel=\"runq\",stat=\"p99\"}"), "{metrics}");
    ringside_tests::promtool_check(&metrics)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn enforce_changes_real_scheduling_attributes_and_restores_them_at_stop() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    // The workload runs as root, like this test: admitted by user.
    let config = scheduler_config("enforce") + "\n[scheduler.enforce]\nusers = [\"root\"]\n";
    let mut daemon = Daemon::start(DaemonOptions { config, ..DaemonOptions::default() })?;
    let dir = Scratch::new("enforce");
    let workload = Workload::start(&dir.0, 800, 40)?;
    let pid = workload.pid();
    // The main thread enters a phase; the decision is applied and reads back from /proc.
    let snapshot = daemon
        .wait_for("an applied decision for the workload's main thread", 15, |s| {
            s["scheduler"]["decisions"]
                .as_array()
                .is_some_and(|d| d.iter().any(|d| d["tid"] == pid && d["applied"] == true && d["nice"] == -5))
        })
        .await?;
    assert_eq!(snapshot["scheduler"]["mode"], "enforce");
    let deadline = Instant::now() + Duration::from_secs(10);
    while nice_of(pid, pid) != Some(-5) {
        anyhow::ensure!(Instant::now() < deadline, "the main thread's nice value never read back as -5");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Stopping the daemon puts every thread back as it was, while the workload goes on.
    let status = daemon.terminate()?;
    assert!(status.success(), "daemon exit: {status:?}");
    let tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    for tid in tids {
        assert_eq!(nice_of(pid, tid), Some(0), "thread {tid} restored to nice 0");
    }
    drop(workload);
    Ok(())
}

/// CPU-bound loops pinned to one CPU, killed on drop.
struct Hogs(Vec<std::process::Child>);

impl Drop for Hogs {
    fn drop(&mut self) {
        for hog in &mut self.0 {
            let _ = hog.kill();
            let _ = hog.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn gpu_idle_while_the_job_is_starved_of_cpu_is_told_apart() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let nvml = Scratch::new("starved-nvml");
    let control = nvml.0.join("nvml-double.conf");
    let daemon = Daemon::start(DaemonOptions {
        config: scheduler_config("observe"),
        env: ringside_tests::nvml_double(&control),
        ..DaemonOptions::default()
    })?;
    let dir = Scratch::new("starved");
    let workload = Workload::start(&dir.0, 1000, 4)?;
    let pid = workload.pid();
    // The job and three CPU hogs share CPU 0: its threads wait in the run queue.
    let pin = |pid: u32| std::process::Command::new("taskset").args(["-a", "-p", "-c", "0", &pid.to_string()]).output();
    pin(pid)?;
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
        pin(child)?;
    }
    let _hogs = Hogs(
        (0..3)
            .map(|_| std::process::Command::new("taskset").args(["-c", "0", "sh", "-c", "while :; do :; done"]).spawn())
            .collect::<std::io::Result<_>>()?,
    );
    let truth = dir.0.join("truth.jsonl");
    std::fs::write(&control, format!("gpu 0 process {pid} 1073741824 50\ngpu 0 busy_log {}\n", truth.display()))?;
    let snapshot = daemon
        .wait_for("10 s of idle attribution", 40, |s| {
            s["gpus"]["idle"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x["job"] == pid && x["window_ms"].as_u64() >= Some(8000)))
        })
        .await?;
    let idle = snapshot["gpus"]["idle"].as_array().and_then(|a| a.iter().find(|x| x["job"] == pid).cloned()).unwrap();
    println!("idle attribution, starved: {idle}");
    let starved = idle["idle_waiting_for_cpu_pct"].as_f64().unwrap_or(0.0);
    assert!(starved >= 15.0, "a job sharing one CPU with three hogs waits for it: {idle}");
    let spans = ml_process(&snapshot, pid).and_then(|p| p["timeline"].as_array().cloned()).unwrap_or_default();
    assert!(spans.iter().any(|s| s["waiting_for_cpu"] == true), "the timeline says when: {spans:?}");
    drop(workload);
    Ok(())
}
