//! The soak: the release `ringsided` (`RINGSIDED_BIN`) for an hour (`RINGSIDE_SOAK_MINUTES`) at
//! a 100 ms interval, as a busy node would keep it, with its memory and descriptors sampled each
//! minute. `cargo xtask soak` builds what it needs and runs it.
//!
//! - 8 ML processes (`ml-workload` over the CUDA/NCCL test doubles), each run for about 15 s and
//!   started again as a new process: jobs come and go all hour. Four hold a collective for 4 s in
//!   every run (a critical `collective_hang` raised, then resolved, with an incident bundle
//!   written each time); two are input-bound; two are plain.
//! - 20 WebSocket clients reading every frame; one of them acknowledges every alert it sees
//!   raised.
//! - A silence made every minute, ending 30 s later.
//!
//! Each minute: the daemon's resident memory (`VmRSS`) and peak (`VmHWM`), open descriptors,
//! threads, alerts listed, bundles kept and the alert database's size on disk. At the end a
//! Markdown table of the samples and a verdict: memory must level off (the second half's peak
//! within 10% of the first half's) under `RINGSIDE_SOAK_MAX_RSS_MB` (64), descriptors must not
//! grow (the last sample within 16 of the one at minute 2). The samples also go to
//! `target/soak.json`.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ringside_shared::ServerMessage;
use ringside_tests::{Daemon, DaemonOptions, Scratch, Workload};
use serde_json::json;

const SLOTS: usize = 8;
const CLIENTS: usize = 20;

#[derive(Default)]
struct Counts {
    runs: AtomicU64,
    frames: AtomicU64,
    acks: AtomicU64,
    raised: AtomicU64,
    silences: AtomicU64,
    failures: AtomicU64,
}

struct Sample {
    minute: u64,
    rss_kb: u64,
    hwm_kb: u64,
    fds: u64,
    threads: u64,
    alerts: u64,
    bundles: u64,
    /// The newest bundle's id: how many were written so far.
    newest_bundle: u64,
    db_kb: u64,
    runs: u64,
}

fn status_field(pid: u32, name: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix(name)?.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0)
}

fn file_kb(dir: &Path, names: &[&str]) -> u64 {
    names.iter().filter_map(|n| std::fs::metadata(dir.join(n)).ok()).map(|m| m.len()).sum::<u64>() / 1024
}

/// One ML slot: a workload started again each time the previous one ends, until `until`.
fn slot(index: usize, until: Instant, counts: Arc<Counts>) {
    let extra: &[&str] = match index {
        0..=3 => &["--hang-ms", "4000"],
        4 | 5 => &["--data-weight", "3"],
        _ => &[],
    };
    while Instant::now() < until {
        let dir = Scratch::new(&format!("soak-{index}"));
        match Workload::start_with(&dir.0, 500, 6, extra) {
            Ok(mut workload) => {
                while Instant::now() < until && matches!(workload.0.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(200));
                }
                drop(workload);
                counts.runs.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                counts.failures.fetch_add(1, Ordering::Relaxed);
                eprintln!("slot {index}: {e:#}");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        let _ = std::fs::remove_dir_all(&dir.0);
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let env = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let minutes = env("RINGSIDE_SOAK_MINUTES", 60).max(2);
    let max_rss_mb = env("RINGSIDE_SOAK_MAX_RSS_MB", 64);
    let daemon = Daemon::start(DaemonOptions {
        interval_ms: 100,
        config: format!(
            "[scheduler]\nwindow_ms = 100\njob_window_s = 8\n\n[thresholds]\ncollective_hang_s = 2\ninput_bound_pct = 50\n\n\
             [alerts]\nclear_for_ms = 1000\n\n[incidents]\nbefore_s = 30\nafter_s = 10\nmax_count = 20\n\n\
             [server]\nmax_ws_sessions = {}\n",
            CLIENTS + 4
        ),
        ..DaemonOptions::default()
    })?;
    let pid = daemon.pid();
    let until = Instant::now() + Duration::from_secs(minutes * 60);
    let counts = Arc::new(Counts::default());
    eprintln!("soak: {minutes} min at 100 ms, {SLOTS} ML slots, {CLIENTS} clients; daemon pid {pid}");

    let slots: Vec<_> = (0..SLOTS)
        .map(|i| {
            let counts = counts.clone();
            std::thread::spawn(move || slot(i, until, counts))
        })
        .collect();
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let mut client = daemon.ws(None).await?;
        let counts = counts.clone();
        clients.push(tokio::spawn(async move {
            while Instant::now() < until {
                let left = until.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
                match client.next(left.min(Duration::from_secs(30))).await {
                    Ok(ServerMessage::AlertRaised { alert }) if i == 0 => {
                        counts.frames.fetch_add(1, Ordering::Relaxed);
                        counts.raised.fetch_add(1, Ordering::Relaxed);
                        if client.send_json(json!({"type": "ack_alert", "id": alert.id, "note": "soak"})).await.is_ok()
                        {
                            counts.acks.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(_) => {
                        counts.frames.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) if Instant::now() < until => {
                        counts.failures.fetch_add(1, Ordering::Relaxed);
                        bail!("client {i}: {e:#}");
                    }
                    Err(_) => break,
                }
            }
            Ok(())
        }));
    }

    let mut samples = Vec::new();
    let started = Instant::now();
    let silences = format!("{}/api/silences", daemon.base);
    for minute in 1..=minutes {
        let at = started + Duration::from_secs(minute * 60);
        tokio::time::sleep_until(at.into()).await;
        let silence = json!({
            "matchers": [{ "name": "job", "value": "0" }],
            "duration_ms": 30_000,
            "comment": format!("soak minute {minute}"),
        });
        let made = daemon.http().post(&silences).bearer_auth(&daemon.token).json(&silence).send().await?;
        if made.status() == 201 {
            counts.silences.fetch_add(1, Ordering::Relaxed);
        }
        let alerts = daemon.get_json("/api/alerts").await?.as_array().map_or(0, Vec::len) as u64;
        let incidents = daemon.get_json("/api/incidents").await?;
        let listed = incidents.as_array().cloned().unwrap_or_default();
        let bundles = listed.len() as u64;
        let newest_bundle = listed.iter().filter_map(|i| i["id"].as_u64()).max().unwrap_or(0);
        let sample = Sample {
            minute,
            rss_kb: status_field(pid, "VmRSS:"),
            hwm_kb: status_field(pid, "VmHWM:"),
            fds: std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count() as u64).unwrap_or(0),
            threads: status_field(pid, "Threads:"),
            alerts,
            bundles,
            newest_bundle,
            db_kb: file_kb(daemon.data_dir(), &["alerts.db", "alerts.db-wal"]),
            runs: counts.runs.load(Ordering::Relaxed),
        };
        eprintln!(
            "minute {minute}: rss {} kB (peak {}), {} fds, {} threads, {} alerts, {} bundles, db {} kB, {} runs",
            sample.rss_kb,
            sample.hwm_kb,
            sample.fds,
            sample.threads,
            sample.alerts,
            sample.bundles,
            sample.db_kb,
            sample.runs
        );
        samples.push(sample);
    }
    for client in clients {
        client.await.context("client task")??;
    }
    for slot in slots {
        let _ = slot.join();
    }

    println!("| minute | RSS (MB) | peak (MB) | descriptors | threads | alerts listed | bundles kept | alert DB (KB) | jobs run |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for s in &samples {
        println!(
            "| {} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {} |",
            s.minute,
            s.rss_kb as f64 / 1024.0,
            s.hwm_kb as f64 / 1024.0,
            s.fds,
            s.threads,
            s.alerts,
            s.bundles,
            s.db_kb,
            s.runs
        );
    }
    let half = samples.len() / 2;
    let peak = |s: &[Sample]| s.iter().map(|s| s.rss_kb).max().unwrap_or(0);
    let (first, second) = (peak(&samples[..half]), peak(&samples[half..]));
    let fds_at_2 = samples.get(1).map_or(0, |s| s.fds);
    let fds_last = samples.last().map_or(0, |s| s.fds);
    println!(
        "\njobs run: {}; frames received: {}; alerts raised: {}; acknowledgements sent: {}; silences made: {}; bundles written: {}; failures: {}",
        counts.runs.load(Ordering::Relaxed),
        counts.frames.load(Ordering::Relaxed),
        counts.raised.load(Ordering::Relaxed),
        counts.acks.load(Ordering::Relaxed),
        counts.silences.load(Ordering::Relaxed),
        samples.last().map_or(0, |s| s.newest_bundle),
        counts.failures.load(Ordering::Relaxed),
    );
    println!(
        "resident memory: peak {:.1} MB in the first half, {:.1} MB in the second; descriptors {fds_at_2} at minute 2, {fds_last} at the end",
        first as f64 / 1024.0,
        second as f64 / 1024.0
    );
    let json: Vec<_> = samples
        .iter()
        .map(|s| {
            json!({"minute": s.minute, "rss_kb": s.rss_kb, "hwm_kb": s.hwm_kb, "fds": s.fds, "threads": s.threads,
                   "alerts": s.alerts, "bundles": s.bundles, "db_kb": s.db_kb, "runs": s.runs})
        })
        .collect();
    let out = ringside_tests::target_dir().join("soak.json");
    std::fs::write(&out, serde_json::to_string_pretty(&json)?)?;
    println!("samples: {}", out.display());

    let mut faults = Vec::new();
    if second > first + first / 10 {
        faults.push(format!("memory still growing: peak {first} kB in the first half, {second} kB in the second"));
    }
    if second > max_rss_mb * 1024 {
        faults.push(format!("memory {second} kB over the {max_rss_mb} MB bound"));
    }
    if fds_last > fds_at_2 + 16 {
        faults.push(format!("descriptors grew from {fds_at_2} to {fds_last}"));
    }
    if counts.failures.load(Ordering::Relaxed) > 0 {
        faults.push(format!("{} workload or client failures", counts.failures.load(Ordering::Relaxed)));
    }
    if !faults.is_empty() {
        bail!("soak failed: {}", faults.join("; "));
    }
    println!("soak passed");
    Ok(())
}
