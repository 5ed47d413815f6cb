//! `cargo xtask bench launch`: what the scheduler's probes cost a job on its kernel-launch path,
//! side by side in one run. Needs root (the BPF probe) and NVIDIA's libraries
//! (`cargo xtask setup --test`).
//!
//! Loops, each for `RINGSIDE_BENCH_SECONDS` (default 3), over `RINGSIDE_BENCH_ROUNDS` rounds
//! (default 3; the order of the daemons turns each round):
//! - a do-nothing `cuLaunchKernel` (a test double): the probe's own cost with nothing in the way;
//! - the real driver's `cuLaunchKernel` and `cuLaunchKernel_ptsz`, as `cuGetProcAddress_v2`
//!   hands them out (`libcuda.so.1` 535 without a GPU: the call fails fast, its entry is real);
//! - steps shaped like an eager training step on the doubles: 200 launches, an all-reduce, a
//!   synchronize (`ml-workload --eager-steps`).
//!
//! Each runs without a daemon, beside `ringsided` with its defaults, and beside `ringsided` with
//! `[scheduler] launch_probes = true`; with `RINGSIDE_BENCH_BASELINE=/path/to/ringsided`, beside
//! that binary too (an older build, for before/after figures). A loop starts only once the
//! daemon reports its driver library probed. Reported: the median rate, the cost added per
//! call (1/rate − 1/rate without a daemon) and the ratio.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

const TOKEN: &str = "bench-token-0123456789";

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A daemon to measure beside: its binary and config.
struct Setup {
    name: String,
    daemon: Option<(PathBuf, &'static str)>,
}

/// A loop to measure: its command, and the libraries the daemon must have probed first.
struct Workload {
    name: &'static str,
    unit: &'static str,
    command: Vec<String>,
    libraries: &'static [&'static str],
}

fn start_daemon(binary: &Path, config: &str, scratch: &Path) -> Result<(Running, u16)> {
    let port = crate::bench::free_port()?;
    let dir = scratch.join(format!("daemon-{port}"));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("ringside.toml"), config)?;
    let child = Command::new(binary)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--config")
        .arg(dir.join("ringside.toml"))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .env("RINGSIDE_TOKEN", TOKEN)
        .env("RINGSIDE_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    let running = Running(child);
    // Probe loaded and first windows done.
    std::thread::sleep(Duration::from_secs(2));
    Ok((running, port))
}

/// The daemon's snapshot (a plain HTTP/1.1 GET on loopback).
fn snapshot(port: u16) -> Result<serde_json::Value> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET /api/snapshot HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    )?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply)?;
    let split = reply.windows(4).position(|w| w == b"\r\n\r\n").context("no end of headers")?;
    let head = String::from_utf8_lossy(&reply[..split]).to_ascii_lowercase();
    let mut body = reply[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        let mut plain = Vec::new();
        let mut rest = &body[..];
        while let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") {
            let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..line_end]).trim(), 16)?;
            if size == 0 {
                break;
            }
            let start = line_end + 2;
            plain.extend_from_slice(rest.get(start..start + size).context("cut-short chunk")?);
            rest = rest.get(start + size + 2..).unwrap_or_default();
        }
        body = plain;
    }
    Ok(serde_json::from_slice(&body)?)
}

/// Waits until the daemon has probed `libraries` of process `pid`.
fn wait_probed(port: u16, pid: u32, libraries: &[&str]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(s) = snapshot(port) {
            let processes = s["scheduler"]["processes"].as_array().cloned().unwrap_or_default();
            let probed =
                |name: &str| {
                    processes.iter().filter(|p| p["pid"].as_u64() == Some(u64::from(pid))).any(|p| {
                        p["libraries"].as_array().into_iter().flatten().any(|l| {
                            l["state"] == "probed" && l["path"].as_str().is_some_and(|path| path.contains(name))
                        })
                    })
                };
            if libraries.iter().all(|l| probed(l)) {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("the daemon did not probe {libraries:?} of process {pid} within 20 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs one loop (beside the daemon on `port`, if any) and returns its rate.
fn measure(workload: &Workload, port: Option<u16>, scratch: &Path) -> Result<f64> {
    let ready = scratch.join("ready");
    let go = scratch.join("go");
    let _ = std::fs::remove_file(&ready);
    let _ = std::fs::remove_file(&go);
    let child = Command::new(&workload.command[0])
        .args(&workload.command[1..])
        .arg("--ready")
        .arg(&ready)
        .arg("--go")
        .arg(&go)
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", workload.command[0]))?;
    let pid = child.id();
    let mut child = Running(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready.exists() {
        if Instant::now() > deadline {
            bail!("{} did not get ready", workload.name);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    match port {
        Some(port) => wait_probed(port, pid, workload.libraries)?,
        // The same pause, so both sides start alike.
        None => std::thread::sleep(Duration::from_millis(1500)),
    }
    std::fs::write(&go, b"")?;
    let mut out = String::new();
    child.0.stdout.take().context("no stdout")?.read_to_string(&mut out)?;
    let status = child.0.wait()?;
    if !status.success() {
        bail!("{} failed ({status})", workload.name);
    }
    let value: serde_json::Value = serde_json::from_str(out.trim()).with_context(|| format!("output {out:?}"))?;
    value[workload.unit].as_f64().with_context(|| format!("no {} in {out:?}", workload.unit))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

pub fn run(root: &Path) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the launch benchmark loads BPF programs: run it as root");
    }
    let env = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (seconds, rounds) = (env("RINGSIDE_BENCH_SECONDS", 3), env("RINGSIDE_BENCH_ROUNDS", 3).max(1));
    let driver = crate::nvidia::fetch()?.join("lib/libcuda.so.1");
    let release = root.join("target/release");
    let double = std::fs::read_dir(release.join("build"))?
        .flatten()
        .map(|e| e.path().join("out/launch-double/libcuda.so.1"))
        .find(|p| p.exists())
        .context("the launch double is not built: cargo build --release -p ringside-workload")?;
    let calls = release.join("cuda-calls").to_string_lossy().into_owned();
    let loop_of = |lib: &Path, flag: &str| {
        let lib = lib.to_string_lossy().into_owned();
        let seconds = seconds.to_string();
        vec![
            calls.clone(),
            "launch-loop".into(),
            "--driver".into(),
            lib,
            "--flag".into(),
            flag.into(),
            "--seconds".into(),
            seconds,
        ]
    };
    let workloads = [
        Workload {
            name: "do-nothing cuLaunchKernel (test double)",
            unit: "calls_per_s",
            command: loop_of(&double, "0"),
            libraries: &["libcuda"],
        },
        Workload {
            name: "real driver: cuLaunchKernel",
            unit: "calls_per_s",
            command: loop_of(&driver, "0"),
            libraries: &["libcuda"],
        },
        Workload {
            name: "real driver: cuLaunchKernel_ptsz (per-thread default stream)",
            unit: "calls_per_s",
            command: loop_of(&driver, "2"),
            libraries: &["libcuda"],
        },
        Workload {
            name: "eager-shaped steps: 200 launches, an all-reduce, a synchronize (doubles)",
            unit: "steps_per_s",
            command: vec![
                release.join("ml-workload").to_string_lossy().into_owned(),
                "--eager-steps".into(),
                seconds.to_string(),
            ],
            libraries: &["libcuda", "libnccl"],
        },
    ];
    let daemon = release.join("ringsided");
    let mut setups = vec![
        Setup { name: "without ringsided".into(), daemon: None },
        Setup { name: "ringsided (defaults)".into(), daemon: Some((daemon.clone(), "")) },
        Setup {
            name: "ringsided, launch_probes = true".into(),
            daemon: Some((daemon, "[scheduler]\nlaunch_probes = true\n")),
        },
    ];
    if let Some(baseline) = std::env::var_os("RINGSIDE_BENCH_BASELINE") {
        setups.push(Setup {
            name: format!("baseline {}", Path::new(&baseline).display()),
            daemon: Some((baseline.into(), "")),
        });
    }
    let scratch = std::env::temp_dir().join(format!("ringside-launch-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    // rates[setup][workload]: one per round.
    let mut rates = vec![vec![Vec::new(); workloads.len()]; setups.len()];
    for round in 0..rounds as usize {
        for turn in 0..setups.len() {
            let s = (turn + round) % setups.len();
            eprintln!("round {}/{rounds}: {}", round + 1, setups[s].name);
            let daemon = match &setups[s].daemon {
                Some((binary, config)) => Some(start_daemon(binary, config, &scratch)?),
                None => None,
            };
            for (w, workload) in workloads.iter().enumerate() {
                rates[s][w].push(measure(workload, daemon.as_ref().map(|(_, port)| *port), &scratch)?);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    println!("\n### The launch path ({rounds} rounds of {seconds} s, medians)\n");
    for (w, workload) in workloads.iter().enumerate() {
        println!("{}\n", workload.name);
        let per = if workload.unit == "steps_per_s" { "step" } else { "call" };
        println!("| | {} | added per {per} | ratio |", workload.unit.replace('_', " "));
        println!("|---|---|---|---|");
        let base = median(&mut rates[0][w]);
        for (s, setup) in setups.iter().enumerate() {
            let rate = median(&mut rates[s][w]);
            let added_ns = (1.0 / rate - 1.0 / base) * 1e9;
            let added = if s == 0 { "–".to_string() } else { format!("{added_ns:.1} ns") };
            println!("| {} | {rate:.0} | {added} | {:.3}x |", setup.name, rate / base);
        }
        println!();
    }
    Ok(())
}
