//! `cargo xtask bench sched`: what the scheduler's probe costs the node, and what `enforce`
//! does for an ML job competing with CPU-bound noise. Needs root (the BPF probe).
//!
//! - Overhead: a pipe ping-pong between two threads (the pattern of `perf bench sched pipe`:
//!   every round trip is two wake-ups and two context switches; `perf bench sched pipe` itself
//!   is run too when `perf` is installed) and a read/write syscall loop (`dd`), with the daemon
//!   running vs not, interleaved over several rounds; the ratio of medians is reported.
//! - Effect: `ml-workload` beside 2 x CPUs busy-loop processes, the daemon in `observe` vs
//!   `enforce` mode, alternating; p50/p99 of the workload's own iteration times per phase
//!   (a data-loading batch, a GPU iteration, a collective, an optimizer step).
//!
//! Rounds: `RINGSIDE_BENCH_ROUNDS` (default 5).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        // SIGTERM first: an `enforce` daemon restores what it changed when it stops.
        let _ = Command::new("kill").arg(self.0.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_daemon(root: &Path, mode: &str, scratch: &Path) -> Result<Stopped> {
    let port = crate::bench::free_port()?;
    let config = scratch.join(format!("ringside-{mode}.toml"));
    // The workload runs as root, as the benchmark does: admitted by user.
    std::fs::write(&config, format!("[scheduler]\nmode = \"{mode}\"\n\n[scheduler.enforce]\nusers = [\"root\"]\n"))?;
    let child = Command::new(root.join("target/release/ringsided"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(scratch.join("data"))
        .env("RINGSIDE_TOKEN", "bench-token-0123456789")
        .env("RINGSIDE_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .context("cannot start target/release/ringsided")?;
    // Probe loaded and first windows done.
    std::thread::sleep(Duration::from_secs(3));
    Ok(Stopped(child))
}

/// Mean round trip (µs) of a byte bounced between two threads through two pipes
/// (`ml-workload --pingpong`).
fn pipe_pingpong(workload: &Path, round_trips: u32) -> Result<f64> {
    let out = Command::new(workload).arg("--pingpong").arg(round_trips.to_string()).output().context("ml-workload")?;
    if !out.status.success() {
        bail!("ml-workload --pingpong failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).context("ml-workload --pingpong output")?;
    value["us_per_round_trip"].as_f64().context("no us_per_round_trip in ml-workload's output")
}

/// `perf bench sched pipe`'s µs per operation, if perf is installed.
fn perf_pipe() -> Option<f64> {
    let out = Command::new("perf").args(["bench", "sched", "pipe", "-l", "20000"]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().find(|l| l.contains("usecs/op"))?.split_whitespace().next()?.parse().ok()
}

/// Seconds `dd` takes for 400k 512-byte reads and writes.
fn syscall_loop() -> Result<f64> {
    let start = Instant::now();
    let status = Command::new("dd")
        .args(["if=/dev/zero", "of=/dev/null", "bs=512", "count=400000"])
        .stderr(Stdio::null())
        .status()
        .context("dd")?;
    if !status.success() {
        bail!("dd failed");
    }
    Ok(start.elapsed().as_secs_f64())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

#[derive(Default)]
struct Overhead {
    pipe: Vec<f64>,
    perf: Vec<f64>,
    syscalls: Vec<f64>,
}

impl Overhead {
    fn measure(&mut self, workload: &Path) -> Result<()> {
        self.pipe.push(pipe_pingpong(workload, 50_000)?);
        if let Some(v) = perf_pipe() {
            self.perf.push(v);
        }
        self.syscalls.push(syscall_loop()?);
        Ok(())
    }
}

fn overhead(root: &Path, scratch: &Path, workload: &Path, rounds: u32) -> Result<()> {
    let (mut off, mut on) = (Overhead::default(), Overhead::default());
    for round in 0..rounds {
        eprintln!("overhead round {}/{rounds}", round + 1);
        // Alternate which goes first, so drift of the machine does not favour one.
        if round % 2 == 0 {
            off.measure(workload)?;
        }
        {
            let _daemon = start_daemon(root, "observe", scratch)?;
            on.measure(workload)?;
        }
        if round % 2 == 1 {
            off.measure(workload)?;
        }
    }
    println!("\n### Probe overhead ({rounds} interleaved rounds, medians)\n");
    println!("| measure | without daemon | with daemon | ratio |");
    println!("|---|---|---|---|");
    let row = |name: &str, unit: &str, a: &mut Vec<f64>, b: &mut Vec<f64>| {
        if a.is_empty() || b.is_empty() {
            return;
        }
        let (a, b) = (median(a), median(b));
        println!("| {name} | {a:.2} {unit} | {b:.2} {unit} | {:.3}x |", b / a);
    };
    row("pipe ping-pong round trip", "µs", &mut off.pipe, &mut on.pipe);
    row("perf bench sched pipe", "µs/op", &mut off.perf, &mut on.perf);
    row("dd 400k x 512 B read+write", "s", &mut off.syscalls, &mut on.syscalls);
    Ok(())
}

/// CPU-bound noise: 2 x CPUs busy loops at the default nice value.
fn noise() -> Result<Vec<Stopped>> {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    (0..cpus * 2)
        .map(|_| {
            Command::new("sh").args(["-c", "while :; do :; done"]).spawn().map(Stopped).context("start a busy loop")
        })
        .collect()
}

const PHASES: [&str; 4] = ["data_loading", "gpu_compute", "nccl_collective", "optimizer_step"];

fn effect(root: &Path, scratch: &Path, workload: &Path, rounds: u32) -> Result<()> {
    // Per mode, per phase: (p50s, p99s) over rounds.
    let mut results: Vec<Vec<(Vec<f64>, Vec<f64>)>> = vec![vec![(Vec::new(), Vec::new()); 4]; 2];
    let modes = ["observe", "enforce"];
    for round in 0..rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for m in order {
            eprintln!("effect round {}/{rounds}: {}", round + 1, modes[m]);
            let _daemon = start_daemon(root, modes[m], scratch)?;
            let _noise = noise()?;
            let stats = scratch.join("stats.json");
            let status = Command::new(workload)
                .args(["--phase-ms", "1000", "--cycles", "2"])
                .arg("--stats")
                .arg(&stats)
                .arg("--log")
                .arg(scratch.join("truth.jsonl"))
                .status()
                .context("ml-workload")?;
            if !status.success() {
                bail!("ml-workload failed: {status}");
            }
            let value: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats)?)?;
            for (p, phase) in PHASES.iter().enumerate() {
                results[m][p].0.push(value[phase]["p50_ms"].as_f64().unwrap_or(f64::NAN));
                results[m][p].1.push(value[phase]["p99_ms"].as_f64().unwrap_or(f64::NAN));
            }
        }
    }
    println!("\n### Effect: ml-workload beside 2 x CPUs busy loops ({rounds} rounds per mode, medians)\n");
    println!("| iteration | observe p50 | enforce p50 | ratio | observe p99 | enforce p99 | ratio |");
    println!("|---|---|---|---|---|---|---|");
    let label = ["data-loading batch", "GPU iteration", "collective", "optimizer step"];
    for p in 0..4 {
        let (o50, o99) = (median(&mut results[0][p].0), median(&mut results[0][p].1));
        let (e50, e99) = (median(&mut results[1][p].0), median(&mut results[1][p].1));
        println!(
            "| {} | {o50:.2} ms | {e50:.2} ms | {:.2}x | {o99:.2} ms | {e99:.2} ms | {:.2}x |",
            label[p],
            e50 / o50,
            e99 / o99
        );
    }
    Ok(())
}

pub fn run(root: &Path, workload: PathBuf) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the scheduler benchmark loads BPF programs: run it as root");
    }
    let rounds: u32 = std::env::var("RINGSIDE_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    if rounds == 0 {
        bail!("RINGSIDE_BENCH_ROUNDS must be at least 1");
    }
    let scratch = std::env::temp_dir().join(format!("ringside-sched-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let result = overhead(root, &scratch, &workload, rounds).and_then(|()| effect(root, &scratch, &workload, rounds));
    let _ = std::fs::remove_dir_all(&scratch);
    result
}
