//! `cargo xtask bench`: what the daemon costs the node it watches.
//!
//! Starts the release `ringsided` on a free loopback port and reads its CPU time and resident
//! memory from `/proc/<pid>` while it idles, first with no client and then at a 100 ms interval
//! (ten times the default work), so the two figures are measured side by side in one run. The
//! length of each phase is `RINGSIDE_BENCH_SECONDS` (default 60). With
//! `RINGSIDE_BENCH_BASELINE=/path/to/ringsided` (another build), the two binaries instead run
//! at the same time, so that they share whatever else the machine does, over
//! `RINGSIDE_BENCH_ROUNDS` rounds (3) at both intervals, and the medians are compared.

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

/// What a measured daemon runs with besides its defaults.
#[derive(Default)]
struct Extra<'a> {
    config: &'a str,
    env: Vec<(&'a str, String)>,
    /// Another `ringsided` than `target/release/ringsided`.
    binary: Option<&'a Path>,
}

/// A started daemon and its scratch directory, removed with it.
struct Started {
    daemon: Daemon,
    data: std::path::PathBuf,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.daemon.0.kill();
        let _ = self.daemon.0.wait();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

fn start(root: &Path, interval_ms: u64, extra: &Extra) -> Result<Started> {
    let port = free_port()?;
    let data = std::env::temp_dir().join(format!("ringside-bench-{port}"));
    std::fs::create_dir_all(&data)?;
    let config = data.join("ringside.toml");
    std::fs::write(&config, extra.config)?;
    let binary = extra.binary.map_or_else(|| root.join("target/release/ringsided"), Path::to_path_buf);
    let child = Command::new(&binary)
        .args(["--listen", &format!("127.0.0.1:{port}"), "--interval-ms", &interval_ms.to_string()])
        .arg("--data-dir")
        .arg(data.join("data"))
        .arg("--config")
        .arg(&config)
        .envs(extra.env.iter().map(|(k, v)| (k, v)))
        .env("RINGSIDE_TOKEN", "bench-token-0123456789")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    Ok(Started { daemon: Daemon(child), data })
}

/// CPU (% of one core) and peak RSS of each daemon over the same `seconds`, after start-up
/// has settled.
fn measure_together(daemons: &[Started], seconds: u64) -> Result<Vec<(f64, u64)>> {
    std::thread::sleep(Duration::from_secs(2));
    let pids: Vec<u32> = daemons.iter().map(|d| d.daemon.0.id()).collect();
    let first: Vec<u64> = pids.iter().map(|p| usage(*p).map(|u| u.0)).collect::<Result<_>>()?;
    let started = Instant::now();
    let mut peak = vec![0; pids.len()];
    while started.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(500));
        for (i, pid) in pids.iter().enumerate() {
            peak[i] = peak[i].max(usage(*pid)?.1);
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut out = Vec::new();
    for (i, pid) in pids.iter().enumerate() {
        let cpu = usage(*pid)?.0.saturating_sub(first[i]) as f64 / 1e9 / elapsed * 100.0;
        out.push((cpu, peak[i]));
    }
    Ok(out)
}

fn measure(root: &Path, interval_ms: u64, seconds: u64, extra: &Extra) -> Result<(f64, u64)> {
    let daemon = start(root, interval_ms, extra)?;
    Ok(measure_together(std::slice::from_ref(&daemon), seconds)?[0])
}

pub fn run(root: &Path) -> Result<()> {
    let seconds: u64 = std::env::var("RINGSIDE_BENCH_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    if seconds == 0 {
        bail!("RINGSIDE_BENCH_SECONDS must be at least 1");
    }
    if let Some(baseline) = std::env::var_os("RINGSIDE_BENCH_BASELINE") {
        return against_baseline(root, Path::new(&baseline), seconds);
    }
    eprintln!("idle daemon, {seconds} s per phase");
    let (cpu_default, rss_default) = measure(root, 1000, seconds, &Extra::default())?;
    let (cpu_fast, rss_fast) = measure(root, 100, seconds, &Extra::default())?;
    println!("| interval | CPU (% of one core) | peak RSS |");
    println!("|---|---|---|");
    println!("| 1000 ms (default) | {cpu_default:.3} | {} KiB |", rss_default);
    println!("| 100 ms | {cpu_fast:.3} | {} KiB |", rss_fast);
    if cpu_default > 0.0 {
        println!("CPU ratio 100 ms / 1000 ms: {:.1}x", cpu_fast / cpu_default);
    }
    gpu_source(root, seconds)
}

/// This build against another, both running at the same time (so that they share whatever
/// else the machine does), at the default interval and at 100 ms, over several rounds.
fn against_baseline(root: &Path, baseline: &Path, seconds: u64) -> Result<()> {
    let rounds: usize = std::env::var("RINGSIDE_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut rows = Vec::new();
    for interval in [1000, 100] {
        let (mut ours, mut theirs, mut ratios, mut rss) = (Vec::new(), Vec::new(), Vec::new(), [0u64; 2]);
        for round in 0..rounds.max(1) {
            eprintln!("{interval} ms, round {}/{rounds}", round + 1);
            // Which starts first alternates: the two are never in the same order twice running.
            let this_build = Extra::default();
            let other = Extra { binary: Some(baseline), ..Extra::default() };
            let first_ours = round % 2 == 0;
            let (a, b) = if first_ours { (&this_build, &other) } else { (&other, &this_build) };
            let daemons = [start(root, interval, a)?, start(root, interval, b)?];
            let mut got = measure_together(&daemons, seconds)?;
            if !first_ours {
                got.swap(0, 1);
            }
            eprintln!("  this build {:.3} %, baseline {:.3} %", got[0].0, got[1].0);
            ours.push(got[0].0);
            theirs.push(got[1].0);
            ratios.push(got[0].0 / got[1].0.max(1e-9));
            rss = [rss[0].max(got[0].1), rss[1].max(got[1].1)];
        }
        let spread = format!(
            "{:.2}-{:.2}x",
            ratios.iter().copied().fold(f64::INFINITY, f64::min),
            ratios.iter().copied().fold(0.0, f64::max)
        );
        rows.push((interval, median(ours), median(theirs), median(ratios), spread, rss));
    }
    println!(
        "| interval | this build: CPU (% of one core) | baseline | ratio (median, range) | peak RSS, this / baseline |"
    );
    println!("|---|---|---|---|---|");
    for (interval, a, b, ratio, spread, rss) in rows {
        println!("| {interval} ms | {a:.3} | {b:.3} | {ratio:.2}x ({spread}) | {} / {} KiB |", rss[0], rss[1]);
    }
    Ok(())
}

/// The GPU source's cost: the daemon with it off, then reading 1 and 8 GPUs of the NVML test
/// double (`tests/doubles/nvml_test_double.c`, built here; there is no GPU on the reference
/// machine), at the default interval, side by side.
fn gpu_source(root: &Path, seconds: u64) -> Result<()> {
    let dir = root.join("target/nvml-double");
    std::fs::create_dir_all(&dir)?;
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let built = Command::new(cc)
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(dir.join("libnvidia-ml.so.1"))
        .arg(root.join("tests/doubles/nvml_test_double.c"))
        .status()?;
    if !built.success() {
        bail!("cannot build the NVML test double");
    }
    let mut rows = Vec::new();
    for gpus in [0u32, 1, 8] {
        let control = dir.join(format!("bench-{gpus}.conf"));
        // Each GPU with a process on it, so its process list is read too.
        let mut text = format!("gpus {gpus}\n");
        for i in 0..gpus {
            text.push_str(&format!("gpu {i} process {} 1073741824 50\n", 100 + i));
        }
        std::fs::write(&control, text)?;
        let extra = if gpus == 0 {
            Extra { config: "[gpu]\nmode = \"off\"\n", ..Extra::default() }
        } else {
            Extra {
                config: "",
                binary: None,
                env: vec![
                    ("LD_LIBRARY_PATH", dir.display().to_string()),
                    ("RINGSIDE_NVML_DOUBLE", control.display().to_string()),
                ],
            }
        };
        let (cpu, rss) = measure(root, 1000, seconds, &extra)?;
        rows.push((gpus, cpu, rss));
    }
    println!();
    println!("| GPU source (1000 ms) | CPU (% of one core) | peak RSS |");
    println!("|---|---|---|");
    for (gpus, cpu, rss) in &rows {
        let what = if *gpus == 0 { "off".to_string() } else { format!("{gpus} GPUs (NVML test double)") };
        println!("| {what} | {cpu:.3} | {rss} KiB |");
    }
    if let [(_, off, _), _, (_, eight, _)] = rows.as_slice() {
        println!("GPU source with 8 GPUs: +{:.3} % of a core over off", eight - off);
    }
    Ok(())
}

/// An `ml-workload` run for the length of a benchmark, its workers stopped with it.
struct Load(std::process::Child);

impl Drop for Load {
    fn drop(&mut self) {
        let _ = Command::new("pkill").args(["-KILL", "-P", &self.0.id().to_string()]).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The incident recorder's cost: the daemon at 100 ms beside two `ml-workload`s (threads,
/// process timelines and decisions to keep every tick), `[incidents]` off and on, alternating
/// over `rounds`; the medians and their ratio. Needs root (the scheduler's probe).
pub fn incidents(root: &Path, workload: &Path, seconds: u64, rounds: u32) -> Result<()> {
    let scratch = std::env::temp_dir().join("ringside-bench-incidents");
    std::fs::create_dir_all(&scratch)?;
    let mut loads = Vec::new();
    for (n, extra) in [["--data-weight", "1"], ["--data-weight", "3"]].iter().enumerate() {
        let child = Command::new(workload)
            .args(["--phase-ms", "300", "--cycles", "1000000"])
            .args(extra)
            .arg("--log")
            .arg(scratch.join(format!("truth-{n}.jsonl")))
            .stdout(Stdio::null())
            .spawn()
            .context("cannot start ml-workload")?;
        loads.push(Load(child));
    }
    let mut cpu: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut rss: [u64; 2] = [0, 0];
    for round in 0..rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for on in order {
            eprintln!("incidents round {}/{rounds}: {}", round + 1, ["off", "on"][on]);
            let config = if on == 1 { "[incidents]\nenabled = true\n" } else { "[incidents]\nenabled = false\n" };
            let (c, r) = measure(root, 100, seconds, &Extra { config, ..Extra::default() })?;
            cpu[on].push(c);
            rss[on] = rss[on].max(r);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (off, on) = (median(&mut cpu[0]), median(&mut cpu[1]));
    drop(loads);
    println!();
    println!("| incident recorder (100 ms, 2 ML workloads) | CPU (% of one core, median) | peak RSS |");
    println!("|---|---|---|");
    println!("| off | {off:.3} | {} KiB |", rss[0]);
    println!("| on | {on:.3} | {} KiB |", rss[1]);
    if off > 0.0 {
        println!("recorder on / off: {:.3}x CPU", on / off);
    }
    Ok(())
}
