//! WebSocket fan-out: how late updates reach their clients, and what each client costs the
//! daemon. `cargo xtask bench fanout` runs it against the release `ringsided`
//! (`RINGSIDED_BIN`), at a 100 ms interval, in two phases side by side:
//!
//! 1. one client;
//! 2. `RINGSIDE_FANOUT_CLIENTS` (100) reading clients and one that never reads.
//!
//! For every update each reading client receives: the delay from the update's `taken_at_ms`
//! to its arrival (p50, p99, max), frames per client, and the daemon's CPU (from
//! `/proc/<pid>/stat`) per client per second. The client that never reads must be dropped or
//! resynchronised without slowing the others: `ringside_ws_resyncs_total` counts it.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ringside_shared::ServerMessage;
use ringside_tests::{Daemon, DaemonOptions};

/// The daemon's CPU time so far (user + system), in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat.rsplit_once(')').context("stat")?.1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    Ok(ticks as f64 / 100.0)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

struct Phase {
    delays_ms: Vec<u64>,
    frames_per_client: f64,
    cpu_pct: f64,
}

/// `clients` reading clients (and, with `stalled`, one that never reads) for `seconds`.
async fn phase(daemon: &Daemon, clients: usize, stalled: bool, seconds: u64) -> Result<Phase> {
    let mut connected = Vec::new();
    for _ in 0..clients {
        connected.push(daemon.ws(None).await?);
    }
    let _stalled = if stalled { Some(daemon.ws(None).await?) } else { None };
    let until = Instant::now() + Duration::from_secs(seconds);
    let cpu_before = cpu_seconds(daemon.pid())?;
    let started = Instant::now();
    let tasks: Vec<_> = connected
        .into_iter()
        .map(|mut client| {
            tokio::spawn(async move {
                let mut delays = Vec::new();
                while Instant::now() < until {
                    let left = until.saturating_duration_since(Instant::now());
                    match client.next(left.max(Duration::from_millis(1))).await {
                        Ok(ServerMessage::Update(update)) => delays.push(now_ms().saturating_sub(update.taken_at_ms)),
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
                delays
            })
        })
        .collect();
    let mut delays_ms = Vec::new();
    for task in tasks {
        delays_ms.extend(task.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_pct = (cpu_seconds(daemon.pid())? - cpu_before) / elapsed * 100.0;
    delays_ms.sort_unstable();
    Ok(Phase { frames_per_client: delays_ms.len() as f64 / clients.max(1) as f64, delays_ms, cpu_pct })
}

fn pick(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let clients: usize = std::env::var("RINGSIDE_FANOUT_CLIENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let seconds: u64 = std::env::var("RINGSIDE_BENCH_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let daemon = Daemon::start(DaemonOptions {
        interval_ms: 100,
        config: format!(
            "[scheduler]\nenabled = false\n[gpu]\nmode = \"off\"\n[server]\nmax_ws_sessions = {}\n",
            clients + 8
        ),
        ..DaemonOptions::default()
    })?;
    eprintln!("fan-out: 100 ms interval, {seconds} s per phase, {clients} clients in the second");
    let one = phase(&daemon, 1, false, seconds).await?;
    let many = phase(&daemon, clients, true, seconds).await?;
    let metrics = daemon.get("/metrics").await?.text().await?;
    let counter =
        |name: &str| metrics.lines().find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok()).unwrap_or(0.0);
    println!("| clients | delay p50 | p99 | max | frames per client | daemon CPU (% of a core) |");
    println!("|---|---|---|---|---|---|");
    for (label, p) in [("1".to_string(), &one), (format!("{clients} + 1 not reading"), &many)] {
        println!(
            "| {label} | {} ms | {} ms | {} ms | {:.0} | {:.1} |",
            pick(&p.delays_ms, 0.5),
            pick(&p.delays_ms, 0.99),
            p.delays_ms.last().copied().unwrap_or(0),
            p.frames_per_client,
            p.cpu_pct
        );
    }
    let per_client = (many.cpu_pct - one.cpu_pct) / (clients as f64 - 1.0).max(1.0);
    println!("daemon CPU per added client: {per_client:.3} % of a core ({:.2} ms per second)", per_client * 10.0);
    println!(
        "resynchronisations (ringside_ws_resyncs_total, the client that never read among them): {}",
        counter("ringside_ws_resyncs_total ")
    );
    Ok(())
}
