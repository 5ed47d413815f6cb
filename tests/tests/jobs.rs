//! Job-aware alerts end to end: the real daemon with its BPF probe and `ml-workload` (the
//! labelled training loop over the CUDA and NCCL test doubles). A stalled rank makes the main
//! thread block in `ncclAllReduce`; a data-heavy loop is input-bound; a plain one raises
//! neither. CI runs as root: these run for real.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ringside_tests::{ml_process, Daemon, DaemonOptions, Scratch, Workload};
use serde_json::Value;

/// One daemon at a time: each watches every ML process on the node.
static ONE_DAEMON: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const INTERVAL_MS: u64 = 200;
const WINDOW_MS: u64 = 100;
const HANG_S: u64 = 3;

fn daemon() -> Result<Daemon> {
    Daemon::start(DaemonOptions {
        interval_ms: INTERVAL_MS,
        config: format!(
            "[scheduler]\nwindow_ms = {WINDOW_MS}\nscan_interval_ms = 200\njob_window_s = 8\n\n\
             [thresholds]\ncollective_hang_s = {HANG_S}\ninput_bound_pct = 50\n\n[alerts]\nclear_for_ms = 1000\n"
        ),
        ..DaemonOptions::default()
    })
}

/// The job's alert of `alert_type` in `/api/alerts` (active or resolved), if any.
fn job_alert(alerts: &Value, pid: u32, alert_type: &str) -> Option<Value> {
    let source = format!("job:{pid}");
    alerts.as_array()?.iter().find(|a| a["source"] == source.as_str() && a["alert_type"] == alert_type).cloned()
}

/// `{"hang_start_ms","hang_end_ms"}` from the workload's log, once the blocked call returned.
fn hang_of(log: &std::path::Path) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|v| Some((v["hang_start_ms"].as_u64()?, v["hang_end_ms"].as_u64()?)))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_rank_raises_a_collective_hang_that_names_the_job_and_resolves() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let daemon = daemon()?;
    let dir = Scratch::new("jobs-hang");
    // The second cycle's collective waits 8 s for the other rank.
    let workload = Workload::start_with(&dir.0, 1500, 3, &["--hang-ms", "8000"])?;
    let pid = workload.pid();
    daemon
        .wait_for("the workload tracked with its NCCL library probed", 10, |s| {
            ml_process(s, pid).is_some_and(|p| {
                p["probed_libraries"].as_array().is_some_and(|l| l.iter().any(|l| l.as_str() == Some("libnccl.so.2")))
            })
        })
        .await?;
    let log = dir.0.join("truth.jsonl");
    ensure!(hang_of(&log).is_none(), "the libraries must be probed before the hang starts");

    let alerts = daemon
        .alerts_when("a collective_hang alert for the job", 25, |a| job_alert(a, pid, "collective_hang").is_some())
        .await?;
    let hang = job_alert(&alerts, pid, "collective_hang").unwrap();
    // While it lasts, /metrics says how long the job has been stalled.
    let metrics = daemon.get("/metrics").await?.text().await?;
    let stalled = metrics
        .lines()
        .find(|l| l.starts_with("ringside_job_collective_stalled_seconds{") && l.contains(&format!("job=\"{pid}\"")))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .with_context(|| format!("no stalled series for the job:\n{metrics}"))?;
    ensure!(stalled >= HANG_S as f64, "stalled {stalled} s");

    assert_eq!(hang["severity"], "critical", "{hang}");
    assert_eq!(hang["labels"]["job"], pid.to_string(), "{hang}");
    assert_eq!(hang["labels"]["comm"], "ml-workload", "{hang}");
    let command = hang["labels"]["command"].as_str().unwrap_or_default();
    assert!(command.contains("ml-workload") && command.contains("--hang-ms 8000"), "{hang}");
    assert!(hang["message"].as_str().unwrap_or_default().contains("NCCL collective"), "{hang}");

    // Resolved once the call returns; then the latency, against the call's own start.
    let alerts = daemon
        .alerts_when("the hang alert resolved", 20, |a| {
            job_alert(a, pid, "collective_hang").is_some_and(|h| h["resolved_at_ms"].is_u64())
        })
        .await?;
    let hang = job_alert(&alerts, pid, "collective_hang").unwrap();
    let (start_ms, end_ms) = hang_of(&log).context("the blocked call's times")?;
    let raised_ms = hang["raised_at_ms"].as_u64().context("raised_at_ms")?;
    let resolved_ms = hang["resolved_at_ms"].as_u64().context("resolved_at_ms")?;
    let latency = raised_ms.saturating_sub(start_ms);
    eprintln!(
        "hang of {} ms: alert after {latency} ms (threshold {} ms), resolved {} ms after the call returned",
        end_ms - start_ms,
        HANG_S * 1000,
        resolved_ms.saturating_sub(end_ms)
    );
    // Within the threshold plus two collection intervals and one detection window.
    assert!(
        (HANG_S * 1000..=HANG_S * 1000 + 2 * INTERVAL_MS + WINDOW_MS).contains(&latency),
        "raised {latency} ms after the call blocked"
    );
    assert!(resolved_ms >= end_ms, "resolved after the call returned");
    ensure!(job_alert(&alerts, pid, "input_bound").is_none(), "a hang is not input-bound: {alerts}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_data_heavy_loop_is_input_bound_and_a_plain_one_raises_nothing() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let daemon = daemon()?;
    let dir = Scratch::new("jobs-input");
    // Data loading 2.5 s of every 4 s: 62% of the job's time.
    let heavy = Workload::start_with(&dir.0, 500, 7, &["--data-weight", "5"])?;
    let pid = heavy.pid();
    let alerts = daemon
        .alerts_when("an input_bound alert for the job", 25, |a| job_alert(a, pid, "input_bound").is_some())
        .await?;
    let alert = job_alert(&alerts, pid, "input_bound").unwrap();
    assert_eq!(alert["severity"], "warning", "{alert}");
    let share = alert["value"].as_f64().unwrap_or(0.0);
    assert!((50.0..80.0).contains(&share), "data loading {share}% of the window: {alert}");
    assert!(job_alert(&alerts, pid, "collective_hang").is_none(), "{alerts}");
    drop(heavy);

    // A plain loop (a quarter of its time loading data), observed over more than the job
    // window: no job alert at all.
    let plain_dir = Scratch::new("jobs-plain");
    let plain = Workload::start(&plain_dir.0, 500, 7)?;
    let pid = plain.pid();
    daemon.wait_for("the plain workload tracked", 10, |s| ml_process(s, pid).is_some()).await?;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let snapshot = daemon.get_json("/api/snapshot").await?;
    let process = ml_process(&snapshot, pid).context("still tracked")?;
    let loading = process["recent_phase_pct"]["data_loading"].as_f64().unwrap_or(0.0);
    assert!(loading > 10.0 && loading < 45.0, "about a quarter: {process}");
    let alerts = daemon.get_json("/api/alerts").await?;
    for alert_type in ["collective_hang", "input_bound", "step_time_regression"] {
        ensure!(job_alert(&alerts, pid, alert_type).is_none(), "{alert_type} on a healthy loop: {alerts}");
    }
    Ok(())
}
