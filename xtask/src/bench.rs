//! `cargo xtask bench`: what the daemon costs the node it watches.
//!
//! Starts the release `ringsided` on a free loopback port and reads its CPU time and resident
//! memory from `/proc/<pid>` while it idles, first with no client and then at a 100 ms interval
//! (ten times the default work), so the two figures are measured side by side in one run. The
//! length of each phase is `RINGSIDE_BENCH_SECONDS` (default 60).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// (CPU time of all the daemon's threads in ns, VmRSS in KiB). `schedstat` counts in
/// nanoseconds, where `stat`'s utime/stime count in 10 ms ticks, too coarse for an idle daemon.
fn usage(pid: u32) -> Result<(u64, u64)> {
    let mut cpu_ns = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).context("daemon exited")?.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) {
            cpu_ns += text.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).context("daemon exited")?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    Ok((cpu_ns, rss))
}

pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn measure(root: &Path, interval_ms: u64, seconds: u64) -> Result<(f64, u64)> {
    let port = free_port()?;
    let data = std::env::temp_dir().join(format!("ringside-bench-{port}"));
    let child = Command::new(root.join("target/release/ringsided"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--interval-ms", &interval_ms.to_string()])
        .arg("--data-dir")
        .arg(&data)
        .env("RINGSIDE_TOKEN", "bench-token-0123456789")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start target/release/ringsided")?;
    let daemon = Daemon(child);
    let pid = daemon.0.id();
    // Let start-up settle before the measured span.
    std::thread::sleep(Duration::from_secs(2));
    let (t0, _) = usage(pid)?;
    let started = Instant::now();
    let mut peak_rss = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(500));
        peak_rss = peak_rss.max(usage(pid)?.1);
    }
    let (t1, _) = usage(pid)?;
    let cpu_pct = t1.saturating_sub(t0) as f64 / 1e9 / started.elapsed().as_secs_f64() * 100.0;
    drop(daemon);
    let _ = std::fs::remove_dir_all(&data);
    Ok((cpu_pct, peak_rss))
}

pub fn run(root: &Path) -> Result<()> {
    let seconds: u64 = std::env::var("RINGSIDE_BENCH_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    if seconds == 0 {
        bail!("RINGSIDE_BENCH_SECONDS must be at least 1");
    }
    eprintln!("idle daemon, {seconds} s per phase");
    let (cpu_default, rss_default) = measure(root, 1000, seconds)?;
    let (cpu_fast, rss_fast) = measure(root, 100, seconds)?;
    println!("| interval | CPU (% of one core) | peak RSS |");
    println!("|---|---|---|");
    println!("| 1000 ms (default) | {cpu_default:.3} | {} KiB |", rss_default);
    println!("| 100 ms | {cpu_fast:.3} | {} KiB |", rss_fast);
    if cpu_default > 0.0 {
        println!("CPU ratio 100 ms / 1000 ms: {:.1}x", cpu_fast / cpu_default);
    }
    Ok(())
}
