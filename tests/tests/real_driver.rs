//! The scheduler on NVIDIA's real user-space driver: `libcuda.so.1` 535 from Debian non-free
//! (unpacked by `cargo xtask setup --test`), loaded without a GPU. `cuInit` answers 100 (no
//! device) and every call fails fast, but `cuGetProcAddress_v2` hands out the entry points the
//! CUDA runtime would call — the legacy ones, or with the per-thread default stream the
//! `_ptsz`/`_ptds` ones — and their entry is what the probes see. `cuda-calls` drives them.
//! CI runs as root: these run for real.

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ringside_tests::{
    component, cuda_calls_binary, ml_process, nvidia_dir, wait_for_file, Daemon, DaemonOptions, Reaped, Scratch,
};
use serde_json::Value;

/// One daemon at a time: each watches every ML process on the node.
static ONE_DAEMON: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn daemon(extra: &str) -> Result<Daemon> {
    Daemon::start(DaemonOptions {
        config: format!("[scheduler]\nscan_interval_ms = 200\nwindow_ms = 100\n{extra}"),
        ..DaemonOptions::default()
    })
}

fn driver() -> String {
    nvidia_dir().join("lib/libcuda.so.1").to_string_lossy().into_owned()
}

/// Waits until the daemon has probed the real driver in process `pid`; returns that library's
/// status.
async fn driver_probed(daemon: &Daemon, pid: u32) -> Result<Value> {
    let probed = |s: &Value| -> Option<Value> {
        ml_process(s, pid)?["libraries"]
            .as_array()?
            .iter()
            .find(|l| l["path"].as_str().is_some_and(|p| p.contains("libcuda.so")) && l["state"] == "probed")
            .cloned()
    };
    let snapshot = daemon.wait_for("the real driver probed", 20, |s| probed(s).is_some()).await?;
    Ok(probed(&snapshot).unwrap_or_default())
}

fn task(snapshot: &Value, tid: u64) -> Option<&Value> {
    snapshot["scheduler"]["tasks"].as_array()?.iter().find(|t| t["tid"] == tid)
}

/// Two threads call the driver's entry points as the runtime would get them: one with the
/// default flag (`cuStreamSynchronize`, `cuMemcpyDtoH_v2`, ...), one with the per-thread
/// default stream (`cuStreamSynchronize_ptsz`, `cuMemcpyDtoH_v2_ptds`, `cuLaunchKernel_ptsz`,
/// ...). Each call is counted, per kind, on the thread that made it.
#[tokio::test(flavor = "multi_thread")]
async fn every_call_through_the_real_drivers_entry_points_is_counted_per_kind_and_thread() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let daemon = daemon("launch_probes = true\n")?;
    let dir = Scratch::new("real-driver-calls");
    let (done, go) = (dir.0.join("done"), dir.0.join("go"));
    let calls = Reaped(
        Command::new(cuda_calls_binary())
            .args(["drive", "--driver", &driver(), "--hold-ms", "30000"])
            .args(["--thread", "0:cuStreamSynchronize=7,cuEventSynchronize=5,cuCtxSynchronize=3,cuMemcpyDtoH=11,cuMemcpy=2,cuMemcpy2D=4,cuMemcpy3D=1,cuMemcpyAtoH=1,cuMemcpyPeer=1,cuLaunchKernel=13,cuLaunchKernelEx=17,cuGraphLaunch=19,cuLaunchCooperativeKernel=2"])
            .args(["--thread", "2:cuStreamSynchronize=23,cuMemcpyDtoH=29,cuMemcpyDtoHAsync=31,cuMemcpy3D=37,cuLaunchKernel=41,cuLaunchKernelEx=43,cuGraphLaunch=3"])
            .arg("--ready")
            .arg(&done)
            .arg("--go")
            .arg(&go)
            .stdout(Stdio::null())
            .spawn()
            .context("start cuda-calls")?,
    );
    let library = driver_probed(&daemon, calls.pid()).await?;
    let detail = library["detail"].as_str().unwrap_or_default();
    ensure!(detail.ends_with("entry points probed, once for the library file"), "{library}");
    std::fs::write(&go, b"")?;
    wait_for_file(&done, Duration::from_secs(20))?;
    let threads: Vec<Value> =
        std::fs::read_to_string(&done)?.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let tid = |flag: u64| threads.iter().find(|t| t["flag"] == flag).and_then(|t| t["tid"].as_u64()).unwrap();
    let (legacy, per_thread) = (tid(0), tid(2));
    // (launches, syncs, copies) each thread made.
    let expected = [(legacy, (51, 15, 20)), (per_thread, (87, 23, 97))];
    let counted = |s: &Value, tid: u64| {
        task(s, tid).map(|t| {
            let c = &t["calls"];
            (c["launches"].as_u64(), c["syncs"].as_u64(), c["copies"].as_u64(), c["nccl"].as_u64())
        })
    };
    let snapshot = daemon
        .wait_for("every call counted on its thread", 10, |s| {
            expected
                .iter()
                .all(|(tid, (l, sy, co))| counted(s, *tid) == Some((Some(*l), Some(*sy), Some(*co), Some(0))))
        })
        .await
        .with_context(|| format!("threads {threads:?}"))?;
    for (tid, _) in expected {
        println!("thread {tid}: {}", task(&snapshot, tid).unwrap()["calls"]);
    }
    let probes = snapshot["scheduler"]["programs"].as_array().cloned().unwrap_or_default();
    ensure!(
        probes.iter().any(|p| p["name"] == "on_call_multi" && p["state"] == "attached"),
        "the driver is probed once for its file: {probes:?}"
    );
    drop(calls);
    Ok(())
}

/// With the defaults no launch is probed: a thread calling the real `cuLaunchKernel` in a loop
/// has no launch counted, and is seen feeding the GPU by where its CPU time goes (the driver's
/// code, sampled at timer ticks).
#[tokio::test(flavor = "multi_thread")]
async fn without_launch_probes_a_launching_thread_is_seen_in_the_driver_not_trapped() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let daemon = daemon("")?;
    let dir = Scratch::new("real-driver-launches");
    let (ready, go) = (dir.0.join("ready"), dir.0.join("go"));
    let looping = Reaped(
        Command::new(cuda_calls_binary())
            .args(["launch-loop", "--driver", &driver(), "--flag", "2", "--seconds", "8"])
            .arg("--ready")
            .arg(&ready)
            .arg("--go")
            .arg(&go)
            .stdout(Stdio::null())
            .spawn()
            .context("start cuda-calls")?,
    );
    let pid = looping.pid();
    driver_probed(&daemon, pid).await?;
    std::fs::write(&go, b"")?;
    let feeding = |s: &Value| {
        task(s, u64::from(pid))
            .is_some_and(|t| t["phase"] == "gpu_compute" && t["features"]["driver"].as_f64().is_some_and(|d| d >= 0.3))
    };
    let snapshot = daemon.wait_for("the launching thread in the driver, feeding the GPU", 6, feeding).await?;
    let thread = task(&snapshot, u64::from(pid)).unwrap();
    println!("launch loop: {}", thread);
    ensure!(thread["calls"]["launches"] == 0, "no launch is probed by default: {thread}");
    ensure!(thread["features"]["driver"].as_f64() > Some(0.3), "{thread}");
    drop(looping);
    Ok(())
}

/// NVIDIA display controllers on this machine's PCI bus (none on the machines CI runs on).
fn nvidia_gpus_on_bus() -> usize {
    std::fs::read_dir("/sys/bus/pci/devices")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    let read = |f: &str| std::fs::read_to_string(e.path().join(f)).unwrap_or_default();
                    read("vendor").trim() == "0x10de" && read("class").trim().starts_with("0x03")
                })
                .count()
        })
        .unwrap_or(0)
}

/// NVIDIA's real NVML (`libnvidia-ml.so.1` 535) with no kernel driver: `nvmlInit` answers
/// "driver not loaded". The `gpu` component names the library it found and says the kernel
/// driver is missing; without an NVIDIA GPU on the bus there is nothing to watch (absent, not a
/// fault), and no other component degrades.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_nvml_without_its_kernel_driver_says_so_and_nothing_else_degrades() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let lib = nvidia_dir().join("lib");
    let daemon = Daemon::start(DaemonOptions {
        env: vec![("LD_LIBRARY_PATH".into(), lib.to_string_lossy().into_owned())],
        ..DaemonOptions::default()
    })?;
    let expected = if nvidia_gpus_on_bus() == 0 { "absent" } else { "degraded" };
    let snapshot = daemon.component_when("gpu", expected, 15).await?;
    let gpu = component(&snapshot, "gpu");
    let detail = gpu["detail"].as_str().unwrap_or_default();
    ensure!(
        detail.starts_with("NVIDIA's driver library is installed (libnvidia-ml.so.535.")
            && detail.contains("but the NVIDIA kernel driver is not loaded"),
        "{gpu}"
    );
    ensure!(snapshot["gpus"]["available"] == false, "{}", snapshot["gpus"]);
    // Every other component is up, and /healthz is ok where there is no GPU to miss.
    let health = daemon.health().await?;
    for c in health["components"].as_array().context("components")? {
        if c["name"] != "gpu" {
            ensure!(c["status"] == "up", "{c}");
        }
    }
    if expected == "absent" {
        ensure!(health["status"] == "ok", "{health}");
    }
    println!("gpu component with NVIDIA's NVML and no kernel driver: {gpu}");
    Ok(())
}

/// A large job: 200 processes (8 ranks with DataLoader workers look like this) each mapping
/// NVIDIA's driver and NCCL, beside a daemon held to 1024 open files (systemd's default soft
/// limit). Every process is tracked and probed, the API answers, and the daemon holds fewer
/// than half its descriptors: the libraries are probed once per file, not per process.
#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_processes_mapping_the_libraries_fit_in_1024_descriptors() -> Result<()> {
    const PROCESSES: usize = 200;
    let _one = ONE_DAEMON.lock().await;
    let daemon = Daemon::start(DaemonOptions {
        config: "[scheduler]\nscan_interval_ms = 200\n".into(),
        wrapper: vec!["prlimit".into(), "--nofile=1024:1024".into(), "--".into()],
        ..DaemonOptions::default()
    })?;
    let dir = Scratch::new("real-driver-200");
    let nccl = nvidia_dir().join("nccl/libnccl.so.2").to_string_lossy().into_owned();
    let mut job = Vec::new();
    for i in 0..PROCESSES {
        let ready = dir.0.join(format!("ready-{i}"));
        let child = Command::new(cuda_calls_binary())
            .args(["hold", "--driver", &driver(), "--also", &nccl, "--hold-ms", "120000"])
            .arg("--ready")
            .arg(&ready)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start cuda-calls")?;
        job.push((Reaped(child), ready));
    }
    for (_, ready) in &job {
        wait_for_file(ready, Duration::from_secs(60))?;
    }
    let pids: std::collections::HashSet<u64> = job.iter().map(|(p, _)| u64::from(p.pid())).collect();
    let tracked = |s: &Value| {
        let shown = s["scheduler"]["processes"]
            .as_array()
            .map_or(0, |p| p.iter().filter(|p| p["pid"].as_u64().is_some_and(|pid| pids.contains(&pid))).count());
        shown as u64 + s["scheduler"]["processes_not_shown"].as_u64().unwrap_or(0)
    };
    let probed_for = |s: &Value| {
        s["scheduler"]["programs"].as_array().and_then(|p| {
            p.iter().find(|p| p["name"] == "on_call_multi").and_then(|p| p["detail"].as_str().map(str::to_string))
        })
    };
    let all = format!("({PROCESSES} tracked)");
    let snapshot = daemon
        .wait_for("every process tracked and probed", 60, |s| {
            tracked(s) >= PROCESSES as u64
                && s["scheduler"]["processes_not_tracked"] == 0
                && probed_for(s).is_some_and(|d| d.contains(&all))
        })
        .await?;
    println!("probes: {}", probed_for(&snapshot).unwrap_or_default());
    let metrics = daemon.get("/metrics").await?.text().await?;
    let value = |name: &str| {
        metrics.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok()).unwrap_or(f64::NAN)
    };
    let (open, limit) = (value("ringside_open_fds"), value("ringside_fd_limit"));
    println!("descriptors with {PROCESSES} probed processes: {open} of {limit}");
    ensure!(limit == 1024.0, "the daemon runs under ulimit -n 1024: {limit}");
    ensure!(open < limit / 2.0, "{open} descriptors of {limit}");
    let health = daemon.health().await?;
    ensure!(component(&health, "descriptors")["status"] == "up", "{health}");
    drop(job);
    Ok(())
}

/// A daemon short of descriptors (`ulimit -n 80`: the probe's maps and programs, the listener
/// and the database already hold more than half) refuses new uprobes with the reason, and keeps
/// serving: the listener, the alert database and the scheduler's other parts are untouched.
#[tokio::test(flavor = "multi_thread")]
async fn past_half_its_descriptors_the_daemon_refuses_probes_and_serves_on() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let daemon = Daemon::start(DaemonOptions {
        config: "[scheduler]\nscan_interval_ms = 200\n".into(),
        wrapper: vec!["prlimit".into(), "--nofile=80:80".into(), "--".into()],
        ..DaemonOptions::default()
    })?;
    let dir = Scratch::new("real-driver-fd-budget");
    let ready = dir.0.join("ready");
    let process = Reaped::start(
        Command::new(cuda_calls_binary())
            .args(["hold", "--driver", &driver(), "--hold-ms", "60000"])
            .arg("--ready")
            .arg(&ready),
        &ready,
    )?;
    let refused = |s: &Value| -> Option<String> {
        ml_process(s, process.pid())?["libraries"]
            .as_array()?
            .iter()
            .find_map(|l| (l["state"] == "refused").then(|| l["detail"].as_str().unwrap_or_default().to_string()))
    };
    let snapshot = daemon.wait_for("the driver refused for want of descriptors", 20, |s| refused(s).is_some()).await?;
    let why = refused(&snapshot).unwrap_or_default();
    ensure!(why.starts_with("not probed: ") && why.contains("of its open-file limit 80"), "{why}");
    println!("refused: {why}");
    // Everything else works: the API, the alert store, the scheduler's tracking.
    ensure!(daemon.get("/api/alerts").await?.status() == 200);
    let health = daemon.health().await?;
    for name in ["alert-store", "scheduler"] {
        ensure!(component(&health, name)["status"] == "up", "{name}: {health}");
    }
    Ok(())
}
