//! The node's history on the real daemon: `/api/history` answers what the ticks held, a clean
//! stop keeps every second, a `kill -9` loses at most the flush interval, a corrupt file is set
//! aside without keeping the daemon from starting, a directory that cannot be written degrades
//! the `history` component until it can, and bad requests get a clear 400.

use std::time::Duration;

use anyhow::{ensure, Result};
use ringside_shared::{HistoryCatalog, HistoryResponse};
use ringside_tests::{now_ms, Daemon, DaemonOptions, Scratch};

const CPU: &str = "host.cpu_utilization_pct@host";
const LOAD: &str = "host.load1@host";
const KERNEL: &str = "kernel.throughput_per_s@kernel:canary";
const P99: &str = "kernel.latency_p99_ns@kernel:canary";

fn options(data: &Scratch) -> DaemonOptions {
    DaemonOptions {
        interval_ms: 250,
        config: "[scheduler]\nenabled = false\n\n[history]\nflush_interval_s = 2\n".into(),
        data_dir: Some(data.0.clone()),
        ..DaemonOptions::default()
    }
}

async fn history(daemon: &Daemon, series: &[&str], from_ms: u64, to_ms: u64, points: usize) -> Result<HistoryResponse> {
    let path = format!("/api/history?series={}&from={from_ms}&to={to_ms}&points={points}", series.join(","));
    Ok(serde_json::from_value(daemon.get_json(&path).await?)?)
}

/// The whole seconds in `[from_ms, to_ms)` for which `key` has a value.
async fn seconds(daemon: &Daemon, key: &str, from_ms: u64, to_ms: u64) -> Result<Vec<u64>> {
    let from_ms = from_ms / 1000 * 1000;
    let to_ms = to_ms.div_ceil(1000) * 1000;
    let answer = history(daemon, &[key], from_ms, to_ms, ((to_ms - from_ms) / 1000) as usize).await?;
    ensure!(answer.step_ms == 1000, "one bucket a second: {}", answer.step_ms);
    let series = &answer.series[0];
    ensure!(
        series.known && series.resolution_ms == 1000,
        "{key}: known {}, resolution {}",
        series.known,
        series.resolution_ms
    );
    Ok(series.buckets(answer.from_ms, answer.step_ms).map(|(t, ..)| t / 1000).collect())
}

#[tokio::test]
async fn history_survives_a_clean_stop_and_a_kill_loses_at_most_the_flush_interval() -> Result<()> {
    let data = Scratch::new("history-restart");
    let mut daemon = Daemon::start(options(&data))?;
    let started = now_ms();
    tokio::time::sleep(Duration::from_secs(5)).await;

    // Every series the console charts and the rules know is there, named as documented.
    let catalog: HistoryCatalog = serde_json::from_value(daemon.get_json("/api/history/series").await?)?;
    let keys: Vec<&str> = catalog.series.iter().map(|s| s.key.as_str()).collect();
    for key in [CPU, LOAD, KERNEL, P99, "host.memory_used_pct@host", "kernel.drop_rate@kernel:canary"] {
        ensure!(keys.contains(&key), "{key} not in {keys:?}");
    }
    ensure!(catalog.fine_from_ms.is_some_and(|t| t + 1000 >= started), "{:?}", catalog.fine_from_ms);

    // Four ticks a second go into one value a second: their mean, within the ticks' extremes.
    let before_stop = now_ms();
    let first = seconds(&daemon, CPU, started, before_stop).await?;
    ensure!(first.len() >= 3, "seconds with a value in the first 5 s: {first:?}");
    let answer = history(&daemon, &[CPU, LOAD, "no.such@series"], started / 1000 * 1000, before_stop, 1).await?;
    ensure!(answer.series.len() == 3 && !answer.series[2].known);
    let cpu = &answer.series[0];
    let (min, max, mean) = (cpu.min[0].unwrap(), cpu.max[0].unwrap(), cpu.mean[0].unwrap());
    ensure!(min <= mean && mean <= max && (0.0..=100.0).contains(&mean), "{min} {mean} {max}");

    // A clean stop: every second before it is still there after the restart.
    let kept_before = seconds(&daemon, CPU, started, now_ms()).await?;
    let stopped = daemon.terminate()?;
    ensure!(stopped.success(), "{stopped:?}");
    let down_from = now_ms();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let down_to = now_ms();
    let mut daemon = Daemon::start(options(&data))?;
    // The time the daemon was down has no values: a gap, not invented points.
    // Whole seconds strictly between the stop and the start.
    let (gap_from, gap_to) = (down_from.div_ceil(1000) * 1000, down_to / 1000 * 1000);
    ensure!(gap_from < gap_to, "down {down_from}..{down_to}");
    let gap = seconds(&daemon, CPU, gap_from, gap_to).await?;
    ensure!(gap.is_empty(), "values while the daemon was down: {gap:?}");
    let after_restart = seconds(&daemon, CPU, started, now_ms()).await?;
    for s in &kept_before[..kept_before.len() - 1] {
        ensure!(after_restart.contains(s), "second {s} lost by a clean stop: {kept_before:?} then {after_restart:?}");
    }

    // A kill: at most the flush interval (2 s) and the second being filled are lost.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let restarted = now_ms();
    let held = seconds(&daemon, CPU, started, restarted).await?;
    daemon.kill_hard()?;
    let daemon = Daemon::start(options(&data))?;
    let after_kill = seconds(&daemon, CPU, started, restarted).await?;
    let lost: Vec<&u64> = held.iter().filter(|s| !after_kill.contains(s)).collect();
    ensure!(lost.len() <= 3, "kill -9 lost {} seconds: {lost:?} (held {held:?}, after {after_kill:?})", lost.len());
    ensure!(lost.iter().all(|s| **s + 4 >= restarted / 1000), "only the last seconds may be lost: {lost:?}");

    // Export of the range: JSON as typed, and a Chrome trace with a counter track per series.
    let range = format!("from={}&to={}", started, now_ms());
    let export: ringside_shared::HistoryExport =
        serde_json::from_value(daemon.get_json(&format!("/api/history/export?{range}")).await?)?;
    let now_held: HistoryCatalog = serde_json::from_value(daemon.get_json("/api/history/series").await?)?;
    ensure!(export.history.series.len() == now_held.series.len(), "every series held is exported");
    let cpu = export.history.series.iter().find(|s| s.key == CPU).expect("cpu exported");
    ensure!(cpu.mean.iter().filter(|m| m.is_some()).count() >= after_kill.len().saturating_sub(2));
    let response = daemon.get(&format!("/api/history/export?{range}&format=trace&download=1")).await?;
    let disposition = response.headers().get("content-disposition").map(|v| v.to_str().unwrap_or_default().to_string());
    ensure!(disposition.as_deref().is_some_and(|d| d.contains("ringside-history-trace-")), "{disposition:?}");
    let trace: serde_json::Value = response.json().await?;
    let counters = trace["traceEvents"].as_array().into_iter().flatten().filter(|e| e["ph"] == "C" && e["name"] == CPU);
    ensure!(counters.count() >= after_kill.len().saturating_sub(2), "a counter event a second for {CPU}");
    println!(
        "history: {} s kept across a clean stop, {} of {} s lost to kill -9 (flush every 2 s)",
        kept_before.len(),
        lost.len(),
        held.len()
    );
    Ok(())
}

#[tokio::test]
async fn a_corrupt_history_file_is_set_aside_and_bad_requests_are_told_why() -> Result<()> {
    let data = Scratch::new("history-corrupt");
    let dir = data.0.join("history");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("head.rsh"), b"RSHIST01 but not what it says")?;
    std::fs::write(dir.join("fine-600000.rsh"), vec![0u8; 4096])?;
    let daemon = Daemon::start(options(&data))?;
    let health = daemon.component_when("history", "up", 10).await?;
    let detail = health.to_string();
    ensure!(detail.contains("head.rsh") && detail.contains("set aside"), "{detail}");
    let aside = std::fs::read_dir(&dir)?
        .filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().contains(".corrupt-")));
    ensure!(aside.count() == 2);
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(!seconds(&daemon, CPU, now_ms() - 2000, now_ms()).await?.is_empty(), "history kept after setting aside");

    for (query, says) in [
        ("", "at least one series"),
        ("?series=a@host&from=x", "from must be a whole number"),
        ("?series=a@host&from=2000&to=1000", "must be before"),
        ("?series=a@host&points=100000", "points must be"),
        ("?series=a@host&from=0&to=999999999999", "at most 8 days"),
    ] {
        let response = daemon.get(&format!("/api/history{query}")).await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        ensure!(status == 400 && text.contains(says), "{query}: {status} {text}");
    }
    let many: Vec<String> = (0..33).map(|i| format!("s{i}@host")).collect();
    let response = daemon.get(&format!("/api/history?series={}", many.join(","))).await?;
    ensure!(response.status().as_u16() == 400);
    // The token is needed, as for every API route.
    let anonymous = reqwest::get(format!("http://{}/api/history?series={CPU}", daemon.addr)).await?;
    ensure!(anonymous.status().as_u16() == 401, "{}", anonymous.status());
    let schema = daemon.get_json("/api/schema/history").await?;
    ensure!(schema["title"] == "HistoryResponse", "{schema}");

    // With the history kept, a WebSocket client's snapshot brings only the latest chart points
    // (the console asks /api/history for the rest); /api/snapshot still has them all.
    let full = loop {
        let snapshot = daemon.get_json("/api/snapshot").await?;
        let points = snapshot["history"].as_array().map_or(0, Vec::len);
        if points > 40 {
            break points;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut ws = daemon.ws(None).await?;
    let first = loop {
        if let ringside_shared::ServerMessage::Snapshot(s) = ws.next(Duration::from_secs(10)).await? {
            break s.history;
        }
    };
    ensure!(first.len() == 30, "the live snapshot's points: {} (the daemon holds {full})", first.len());
    let newest = first.last().map(|p| p.t_ms).unwrap_or(0);
    ensure!(newest + 2000 >= now_ms(), "they are the latest");
    Ok(())
}

#[tokio::test]
async fn a_history_directory_that_cannot_be_written_degrades_the_component_until_it_can() -> Result<()> {
    let data = Scratch::new("history-unwritable");
    let dir = data.0.join("history");
    let daemon = Daemon::start(options(&data))?;
    daemon.component_when("history", "up", 10).await?;
    // Running as root, permissions would not stop the writer: a file where the directory was does.
    std::fs::remove_dir_all(&dir)?;
    std::fs::write(&dir, b"not a directory")?;
    let health = daemon.component_when("history", "degraded", 10).await?;
    let detail = health.to_string();
    ensure!(detail.contains("cannot write the history's files") && detail.contains("history"), "{detail}");
    let metrics = daemon.get("/metrics").await?.text().await?;
    let errors = metrics.lines().find_map(|l| {
        l.strip_prefix("ringside_history_write_errors_total ").and_then(|v| v.trim().parse::<f64>().ok())
    });
    ensure!(errors.is_some_and(|e| e >= 1.0), "write errors counted: {errors:?}");
    ensure!(!seconds(&daemon, CPU, now_ms() - 2000, now_ms()).await?.is_empty(), "memory still answers");
    std::fs::remove_file(&dir)?;
    std::fs::create_dir_all(&dir)?;
    let health = daemon.component_when("history", "up", 10).await?;
    ensure!(health.to_string().contains("writing again"), "{health}");
    Ok(())
}
