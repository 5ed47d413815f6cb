//! The daemon's trust boundary, end to end: the real `ringsided` as root beside processes of
//! other users doing what any local user can do (`hostile-process`, a test double): mapping
//! huge sparse files named like CUDA, swapping a mapped library for a FIFO or a link to
//! `/dev/zero`, posing as ML work to get a boost, holding a GPU device open in 5000 processes,
//! and a daemon killed with threads changed. CI runs as root: these run for real.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ringside_tests::{
    component, hostile_binary, ml_process, nice_of, rss_kib, Daemon, DaemonOptions, Reaped, Scratch, Workload,
};
use serde_json::Value;

/// One daemon at a time: each sees every process on the node.
static ONE_DAEMON: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const SCHEDULER: &str = "[scheduler]\nwindow_ms = 100\nscan_interval_ms = 200\n";

/// `hostile-process map FILE ARGS…`, started under `wrapper` (e.g. `setpriv` to another user).
fn map(scratch: &Path, file: &Path, args: &[&str], wrapper: &[String]) -> Result<Reaped> {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    // Writable for the other users the process may run as.
    let dir = scratch.join("ready");
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
    let ready = dir.join(N.fetch_add(1, Ordering::Relaxed).to_string());
    let mut command = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(hostile_binary());
            c
        }
        None => Command::new(hostile_binary()),
    };
    command.arg("map").arg(file).args(args).arg("--ready").arg(&ready);
    Reaped::start(&mut command, &ready)
}

/// A sparse file of `bytes` (nothing but its size is stored).
fn sparse(path: &Path, bytes: u64) -> Result<()> {
    std::fs::create_dir_all(path.parent().context("parent")?)?;
    std::fs::File::create(path)?.set_len(bytes)?;
    Ok(())
}

/// A small shared library named like CUDA's driver that defines two of the probed entry points.
fn cuda_like_library(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path.parent().context("parent")?)?;
    let source = path.with_extension("c");
    std::fs::write(&source, "int cuLaunchKernel(void) { return 0; }\nint cuStreamSynchronize(void) { return 0; }\n")?;
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let status = Command::new(cc).args(["-shared", "-fPIC", "-o"]).arg(path).arg(&source).status()?;
    anyhow::ensure!(status.success(), "building the CUDA-named library failed");
    Ok(())
}

async fn idle_rss_kib(daemon: &Daemon) -> Result<u64> {
    daemon.wait_for("the first published window", 15, |s| !s["scheduler"].is_null()).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    rss_kib(daemon.pid()).context("the daemon's RSS")
}

#[tokio::test(flavor = "multi_thread")]
async fn huge_sparse_libraries_are_refused_without_being_read() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let daemon = Daemon::start(DaemonOptions { config: SCHEDULER.into(), ..DaemonOptions::default() })?;
    let idle = idle_rss_kib(&daemon).await?;
    let scratch = Scratch::new("sparse");
    let mut mappers = Vec::new();
    for (dir, gib) in [("eight", 8u64), ("forty", 40)] {
        let file = scratch.0.join(dir).join("libcuda.so.1");
        sparse(&file, gib << 30)?;
        mappers.push(map(&scratch.0, &file, &[], &[])?);
    }
    let started = Instant::now();
    let snapshot = daemon
        .wait_for("both mappers seen with their library refused", 15, |s| {
            mappers.iter().all(|m| {
                ml_process(s, m.pid()).is_some_and(|p| {
                    p["libraries"].as_array().is_some_and(|l| l.iter().any(|l| l["state"] == "refused"))
                })
            })
        })
        .await?;
    let refused_after = started.elapsed();
    for mapper in &mappers {
        let library = &ml_process(&snapshot, mapper.pid()).unwrap()["libraries"][0];
        let detail = library["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("GiB, over the 2.0 GiB read at most"), "{library}");
        assert!(library["path"].as_str().unwrap_or_default().ends_with("libcuda.so.1"), "{library}");
    }
    // Scans go on; nothing is read again, nothing grows.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = rss_kib(daemon.pid()).context("RSS")?;
    println!("daemon RSS: idle {idle} KiB, with 8 and 40 GiB sparse libcuda.so.1 mapped {after} KiB; refused in {refused_after:?}");
    assert!(after <= idle + 64 * 1024, "RSS grew from {idle} KiB to {after} KiB");
    let health = daemon.health().await?;
    assert_eq!(component(&health, "scheduler")["status"], "up", "{health}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_library_replaced_by_a_fifo_or_a_link_to_dev_zero_wedges_nothing() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let mut daemon = Daemon::start(DaemonOptions { config: SCHEDULER.into(), ..DaemonOptions::default() })?;
    let scratch = Scratch::new("replaced");
    let mut mappers = Vec::new();
    for replace in ["fifo", "symlink-to-zero"] {
        let file = scratch.0.join(replace).join("libcuda.so.1");
        cuda_like_library(&file)?;
        mappers.push(map(&scratch.0, &file, &["--replace", replace], &[])?);
        let kind = std::fs::symlink_metadata(&file)?.file_type();
        assert!(!kind.is_file(), "{replace}: the path no longer holds the library");
    }
    // The mapped file itself (deleted, still mapped) is read and probed; the path is not followed.
    let snapshot = daemon
        .wait_for("both libraries probed through their mappings", 15, |s| {
            mappers.iter().all(|m| {
                ml_process(s, m.pid()).is_some_and(|p| {
                    p["libraries"].as_array().is_some_and(|l| l.iter().any(|l| l["state"] == "probed"))
                })
            })
        })
        .await?;
    let end_of = |s: &Value, pid: u32| {
        ml_process(s, pid).and_then(|p| p["timeline"].as_array()?.last()?["end_ms"].as_u64()).unwrap_or(0)
    };
    let before = end_of(&snapshot, mappers[0].pid());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = daemon.get_json("/api/snapshot").await?;
    assert!(end_of(&later, mappers[0].pid()) >= before + 1000, "windows keep being published");
    let health = daemon.health().await?;
    assert_eq!(component(&health, "scheduler")["status"], "up", "{health}");
    let stop = Instant::now();
    let status = daemon.terminate()?;
    println!("SIGTERM to exit: {:?}", stop.elapsed());
    assert!(status.success() && stop.elapsed() < Duration::from_secs(5), "{status:?} in {:?}", stop.elapsed());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn enforce_without_admission_changes_nothing_and_says_why() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let config = format!("{SCHEDULER}mode = \"enforce\"\nbackend = \"setattr\"\n");
    let daemon = Daemon::start(DaemonOptions { config, ..DaemonOptions::default() })?;
    let dir = Scratch::new("unadmitted-workload");
    let workload = Workload::start(&dir.0, 400, 6)?;
    let pid = workload.pid();
    let snapshot = daemon
        .wait_for("a decision for the workload", 15, |s| {
            s["scheduler"]["decisions"].as_array().is_some_and(|d| d.iter().any(|d| d["pid"] == pid))
        })
        .await?;
    let scheduler = &snapshot["scheduler"];
    assert!(
        scheduler["enforcement_inactive"].as_str().unwrap_or_default().contains("admits no process"),
        "{scheduler}"
    );
    let decision = scheduler["decisions"].as_array().unwrap().iter().find(|d| d["pid"] == pid).unwrap().clone();
    assert_eq!(decision["applied"], false, "{decision}");
    assert!(decision["error"].as_str().unwrap_or_default().contains("not admitted"), "{decision}");
    assert_eq!(nice_of(pid, pid), Some(0));
    let health = component(&daemon.health().await?, "scheduler");
    assert_eq!(health["status"], "degraded", "{health}");
    assert!(health["detail"].as_str().unwrap_or_default().contains("[scheduler.enforce]"), "{health}");
    Ok(())
}

/// `setpriv` to `uid` (its own group, no others), optionally keeping CAP_SYS_NICE (with which
/// a process may set any nice value itself). Raising RLIMIT_NICE instead would take
/// CAP_SYS_RESOURCE, which the test machines do not grant even to root.
fn as_user(uid: u32, sys_nice: bool) -> Vec<String> {
    let mut wrapper: Vec<String> =
        vec!["setpriv".into(), format!("--reuid={uid}"), format!("--regid={uid}"), "--clear-groups".into()];
    if sys_nice {
        wrapper.extend(["--inh-caps=+sys_nice".into(), "--ambient-caps=+sys_nice".into()]);
    }
    wrapper
}

#[tokio::test(flavor = "multi_thread")]
async fn only_admitted_users_are_reniced_and_never_beyond_their_own_rlimit() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    // Uid 1 (`daemon` on Debian) is admitted by number; nobody (65534) is not.
    let config =
        format!("{SCHEDULER}mode = \"enforce\"\nbackend = \"setattr\"\n\n[scheduler.enforce]\nusers = [\"1\"]\n");
    let daemon = Daemon::start(DaemonOptions { config, ..DaemonOptions::default() })?;
    let scratch = Scratch::new("admission");
    // A copy of a harmless program named like PyTorch, in a directory only root may write.
    let library = scratch.0.join("lib").join("libtorch_x.so");
    std::fs::create_dir_all(library.parent().unwrap())?;
    std::fs::copy("/bin/true", &library)?;
    // The same, straight in /tmp, where anyone could have put it: no evidence at all.
    let planted = PathBuf::from(format!("/tmp/libtorch_x-{}.so", std::process::id()));
    std::fs::copy("/bin/true", &planted)?;
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _planted = Remove(planted.clone());
    let unadmitted = map(&scratch.0, &library, &["--spin"], &as_user(65534, true))?;
    let admitted = map(&scratch.0, &library, &["--spin"], &as_user(1, true))?;
    let capped = map(&scratch.0, &library, &["--spin"], &as_user(1, false))?;
    let planter = map(&scratch.0, &planted, &["--spin"], &as_user(65534, false))?;

    // The admitted hog holding CAP_SYS_NICE may go to -5 (it could itself); the unadmitted
    // one could too, and is still left alone.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut unadmitted_nice = Vec::new();
    while nice_of(admitted.pid(), admitted.pid()) != Some(-5) {
        unadmitted_nice.extend(nice_of(unadmitted.pid(), unadmitted.pid()));
        anyhow::ensure!(Instant::now() < deadline, "the admitted hog was never reniced to -5");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let a few more windows pass with both running.
    for _ in 0..20 {
        unadmitted_nice.extend(nice_of(unadmitted.pid(), unadmitted.pid()));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(unadmitted_nice.iter().all(|n| *n == 0), "the unadmitted hog kept its nice: {unadmitted_nice:?}");
    assert_eq!(nice_of(capped.pid(), capped.pid()), Some(0), "with RLIMIT_NICE 0 it may not go below 0");

    let snapshot = daemon.get_json("/api/snapshot").await?;
    let seen = ml_process(&snapshot, unadmitted.pid()).context("the unadmitted hog is observed")?;
    assert_eq!((seen["admitted"].as_bool(), seen["uid"].as_u64()), (Some(false), Some(65534)), "{seen}");
    assert!(seen["admission"].as_str().unwrap_or_default().starts_with("not admitted"), "{seen}");
    assert!(seen["reason"].as_str().unwrap_or_default().contains("libtorch_x.so"), "{seen}");
    let boosted = ml_process(&snapshot, admitted.pid()).context("the admitted hog")?;
    assert_eq!(boosted["admission"], "admitted: user 1", "{boosted}");
    let decisions = snapshot["scheduler"]["decisions"].as_array().cloned().unwrap_or_default();
    assert!(
        decisions.iter().any(|d| d["pid"] == unadmitted.pid()
            && d["applied"] == false
            && d["error"].as_str().is_some_and(|e| e.starts_with("not admitted"))),
        "{decisions:?}"
    );
    let capped_decision = decisions.iter().find(|d| d["pid"] == capped.pid() && d["applied"] == true);
    assert!(capped_decision.is_some_and(|d| d["nice"] == 0), "{decisions:?}");
    // The planted library is no evidence: reported, the process not taken for ML work.
    assert!(ml_process(&snapshot, planter.pid()).is_none());
    let refused = snapshot["scheduler"]["refused_evidence"].as_array().cloned().unwrap_or_default();
    let report = refused.iter().find(|r| r["pid"] == planter.pid()).with_context(|| format!("{refused:?}"))?;
    assert!(report["why"].as_str().unwrap_or_default().contains("/tmp is writable by everyone"), "{report}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn five_thousand_processes_holding_a_gpu_device_stay_within_the_bounds() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let daemon = Daemon::start(DaemonOptions { config: SCHEDULER.into(), ..DaemonOptions::default() })?;
    let idle = idle_rss_kib(&daemon).await?;
    // A device node named like NVIDIA's (the null device's numbers).
    let device = PathBuf::from(format!("/dev/nvidia-ringside-test-{}", std::process::id()));
    let _ = std::fs::remove_file(&device);
    let made = Command::new("mknod").arg(&device).args(["c", "1", "3"]).status()?;
    anyhow::ensure!(made.success(), "mknod (root needed)");
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _device = Remove(device.clone());
    let scratch = Scratch::new("many");
    let ready = scratch.0.join("ready");
    let started = Instant::now();
    let holder = Reaped::start(
        Command::new(hostile_binary()).arg("hold").arg(&device).args(["--children", "5000", "--ready"]).arg(&ready),
        &ready,
    )?;
    println!("5000 children forked in {:?}", started.elapsed());
    let snapshot = daemon
        .wait_for("every holder found, 256 tracked", 60, |s| {
            let scheduler = &s["scheduler"];
            scheduler["processes_not_tracked"].as_u64().unwrap_or(0) >= 4700
        })
        .await?;
    println!("found in {:?}", started.elapsed());
    let scheduler = &snapshot["scheduler"];
    let shown = scheduler["processes"].as_array().map(Vec::len).unwrap_or(0);
    assert_eq!(shown, 32, "at most 32 processes listed");
    assert_eq!(scheduler["processes_not_shown"], 256 - 32, "{}", scheduler["processes_not_tracked"]);
    let spans: usize =
        scheduler["processes"].as_array().unwrap().iter().map(|p| p["timeline"].as_array().map_or(0, Vec::len)).sum();
    assert!(spans <= ringside_shared::SchedulerTelemetry::MAX_SPANS);
    let health = component(&daemon.health().await?, "scheduler");
    assert_eq!(health["status"], "degraded", "{health}");
    assert!(health["detail"].as_str().unwrap_or_default().contains("max_processes = 256"), "{health}");

    // Update frames stay within the documented budget; /metrics has series for 32 pids at most.
    let mut client = daemon.ws(None).await?;
    let mut largest = 0;
    let mut updates = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while updates < 5 && Instant::now() < deadline {
        use futures_util::StreamExt;
        let frame = tokio::time::timeout(Duration::from_secs(5), client.socket.next()).await?.context("closed")??;
        if let tokio_tungstenite::tungstenite::Message::Text(text) = frame {
            largest = largest.max(text.len());
            updates += usize::from(text.as_str().starts_with("{\"type\":\"update\""));
        }
    }
    let metrics = daemon.get("/metrics").await?.text().await?;
    let pids: std::collections::HashSet<&str> =
        metrics.match_indices("pid=\"").map(|(i, _)| metrics[i + 5..].split('"').next().unwrap_or("")).collect();
    let rss = rss_kib(daemon.pid()).context("RSS")?;
    println!(
        "5001 ML processes: largest frame {largest} bytes over {updates} updates, /metrics {} bytes with {} pids, RSS {idle} -> {rss} KiB",
        metrics.len(),
        pids.len()
    );
    assert!(updates >= 3, "updates keep flowing");
    assert!(largest <= 512 * 1024, "a frame of {largest} bytes is over the 512 KiB budget");
    assert!(pids.len() <= 32, "{} pids in /metrics", pids.len());
    ringside_tests::promtool_check(&metrics)?;
    // Still observing after all that: the observer neither stalled nor died.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let health = component(&daemon.health().await?, "scheduler");
    assert_eq!(health["status"], "degraded", "the observer is alive and says why it is degraded: {health}");
    drop(holder);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn after_kill_9_a_restart_restores_every_changed_thread_and_nothing_else() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let scratch = Scratch::new("journal");
    let data_dir = scratch.0.join("data");
    let config =
        format!("{SCHEDULER}mode = \"enforce\"\nbackend = \"setattr\"\n\n[scheduler.enforce]\nusers = [\"root\"]\n");
    let options = |config: &str| DaemonOptions {
        config: config.into(),
        data_dir: Some(data_dir.clone()),
        ..DaemonOptions::default()
    };
    let mut daemon = Daemon::start(options(&config))?;
    let workload = Workload::start(&scratch.0, 800, 40)?;
    let pid = workload.pid();
    let deadline = Instant::now() + Duration::from_secs(15);
    while nice_of(pid, pid) != Some(-5) {
        anyhow::ensure!(Instant::now() < deadline, "the main thread was never reniced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    daemon.kill_hard()?;
    drop(daemon);
    let tids = |pid: u32| -> Vec<u32> {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
            .unwrap_or_default()
    };
    let changed: Vec<u32> = tids(pid).into_iter().filter(|t| nice_of(pid, *t) != Some(0)).collect();
    assert!(changed.contains(&pid), "killed with threads changed: {changed:?}");

    // An unrelated process whose id the journal names with another start time (a reused id).
    let bystander = Reaped(Command::new("sleep").arg("60").spawn()?);
    let journal = data_dir.join("enforce.journal");
    let line = format!(
        "{{\"event\":\"saved\",\"pid\":{0},\"tid\":{0},\"start_time\":1,\"nice\":10,\"policy\":3,\"cpus\":[0]}}\n",
        bystander.pid()
    );
    use std::io::Write;
    std::fs::OpenOptions::new().append(true).open(&journal)?.write_all(line.as_bytes())?;

    // Restarted in observe mode: what the journal holds is put back before the first scan.
    let restarted = Daemon::start(options(SCHEDULER))?;
    let restored_in = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(2);
    while tids(pid).iter().any(|t| nice_of(pid, *t).is_some_and(|n| n != 0)) {
        anyhow::ensure!(Instant::now() < deadline, "threads still changed after the restart: {:?}", tids(pid));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("changed threads restored {:?} after the restart printed its address", restored_in.elapsed());
    assert_eq!(nice_of(bystander.pid(), bystander.pid()), Some(0), "a reused id is never touched");
    let kept = std::fs::read_to_string(&journal)?;
    assert!(kept.trim().is_empty(), "the journal is emptied once restored: {kept}");
    drop(restarted);
    drop(workload);
    Ok(())
}

/// A client that keeps a connection open and asks `/healthz` (no token needed) every half
/// second, reconnecting when the daemon closes it; until `stop`.
fn healthz_poller(addr: String, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<u32> {
    use std::io::{Read, Write};
    std::thread::spawn(move || {
        let mut stream: Option<std::net::TcpStream> = None;
        let mut answered = 0;
        let mut buf = [0u8; 4096];
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            if stream.is_none() {
                stream = std::net::TcpStream::connect(&addr).ok();
                if let Some(s) = &stream {
                    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
                }
            }
            if let Some(s) = stream.as_mut() {
                let sent = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").is_ok();
                match s.read(&mut buf) {
                    Ok(n) if n > 0 && sent => answered += 1,
                    _ => stream = None,
                }
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        answered
    })
}

/// 256 clients without a token holding keep-alive connections to `/healthz` (every slot, the
/// moment before this was fixed) and 100 idle connections that send nothing: an operator with
/// the token is served at once, every time. Unauthenticated answers close their connection and a
/// new connection evicts the oldest that has not authenticated.
#[tokio::test(flavor = "multi_thread")]
async fn clients_without_a_token_cannot_lock_an_operator_out() -> Result<()> {
    let daemon =
        Daemon::start(DaemonOptions { config: "[scheduler]\nenabled = false\n".into(), ..DaemonOptions::default() })?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pollers: Vec<_> = (0..256).map(|_| healthz_poller(daemon.addr.clone(), stop.clone())).collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let idle: Vec<std::net::TcpStream> =
        (0..100).filter_map(|_| std::net::TcpStream::connect(&daemon.addr).ok()).collect();
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let started = Instant::now();
        let response = tokio::time::timeout(Duration::from_secs(3), daemon.get("/api/alerts"))
            .await
            .context("the operator's request took over 3 s")?
            .context("the operator's request was refused")?;
        anyhow::ensure!(response.status() == 200, "{}", response.status());
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answered: u32 = pollers.into_iter().map(|p| p.join().unwrap_or(0)).sum();
    drop(idle);
    let metrics = daemon.get("/metrics").await?.text().await?;
    let counter = |name: &str| {
        metrics.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok()).unwrap_or(-1.0)
    };
    let (evicted, refused) =
        (counter("ringside_http_connections_evicted_total"), counter("ringside_http_connections_refused_total"));
    println!(
        "256 keep-alive /healthz clients ({answered} answers) and 100 idle connections: the operator served 10 of 10, \
         slowest {} ms; {evicted} connections evicted, {refused} refused",
        slowest.as_millis()
    );
    anyhow::ensure!(answered > 0, "the health checks were answered too");
    anyhow::ensure!(refused == 0.0, "nobody is refused while untrusted connections can be evicted");
    Ok(())
}

/// Token guessing gets no free answers on `/healthz`: a wrong bearer token counts against the
/// address as on every other route (30 per 10 s by default, then 429), where a right one would
/// show itself by the reply's `components`. A health check with no token is not counted, and the
/// right token is never held back.
#[tokio::test(flavor = "multi_thread")]
async fn wrong_tokens_on_healthz_are_throttled_like_anywhere_else() -> Result<()> {
    let daemon =
        Daemon::start(DaemonOptions { config: "[scheduler]\nenabled = false\n".into(), ..DaemonOptions::default() })?;
    let http = daemon.http();
    let mut statuses = Vec::new();
    for i in 0..60 {
        let response =
            http.get(format!("{}/healthz", daemon.base)).bearer_auth(format!("guess-{i:04}-0123456789")).send().await?;
        statuses.push(response.status().as_u16());
    }
    let first_429 = statuses.iter().position(|s| *s == 429);
    println!(
        "60 wrong tokens on /healthz: {:?} answers, the first 429 at guess {:?}",
        statuses.len(),
        first_429.map(|i| i + 1)
    );
    anyhow::ensure!(first_429 == Some(30), "the 31st wrong token is throttled: {statuses:?}");
    anyhow::ensure!(statuses[30..].iter().all(|s| *s == 429), "{statuses:?}");
    // Never a 429 without a token; a 503 can come while the just-started daemon has made no
    // tick yet on a loaded machine, so it is asked again until it is up.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let plain = loop {
        let plain = reqwest::Client::new().get(format!("{}/healthz", daemon.base)).send().await?;
        let status = plain.status();
        anyhow::ensure!(status != 429, "a health check without a token is not throttled");
        if status == 200 || std::time::Instant::now() > deadline {
            break plain;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    anyhow::ensure!(plain.status() == 200, "a health check without a token is answered: {}", plain.status());
    let body: Value = plain.json().await?;
    anyhow::ensure!(body.get("components").is_none(), "{body}");
    let health = daemon.health().await?;
    anyhow::ensure!(health["components"].is_array(), "the right token is answered in full: {health}");
    Ok(())
}

/// A process whose command line carries `marker`, which the test's `ml_patterns` take for ML
/// work: found as soon as it is looked at (no library check to wait for). It spins on a CPU,
/// so that it is among the processes an update lists (the busiest 32).
fn marked_job(marker: &str, wrapper: &[String]) -> Result<Reaped> {
    let script = format!("while :; do :; done; : {marker}");
    let mut command = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg("sh");
            c
        }
        None => Command::new("sh"),
    };
    let child = command.args(["-c", &script]).spawn().context("start sh")?;
    Ok(Reaped(child))
}

/// 6,000 idle processes (not ML work) at lower pids, then a job: the job is looked at in the
/// first scan after it starts — new processes come first, and rechecks of the crowd go on from
/// where the last scan stopped — not after the crowd's rechecks, which outnumber a scan's 512
/// looks for good.
#[tokio::test(flavor = "multi_thread")]
async fn a_crowd_of_idle_processes_does_not_starve_a_later_job() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let daemon = Daemon::start(DaemonOptions {
        config: format!("{SCHEDULER}ml_patterns = [\"ringside-late-job\"]\n"),
        ..DaemonOptions::default()
    })?;
    let scratch = Scratch::new("crowd");
    let ready = scratch.0.join("ready");
    let crowd = Reaped::start(
        Command::new(hostile_binary()).args(["hold", "/dev/null", "--children", "6000", "--ready"]).arg(&ready),
        &ready,
    )?;
    // Long enough for every idle process to have been looked at and to be due again, over
    // and over: more are due each scan than a scan looks at.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let job = marked_job("ringside-late-job", &[])?;
    let started = Instant::now();
    daemon.wait_for("the job tracked", 20, |s| ml_process(s, job.pid()).is_some()).await?;
    let took = started.elapsed();
    println!("a job started after 6,000 idle processes was tracked in {} ms (scans every 200 ms)", took.as_millis());
    anyhow::ensure!(took < Duration::from_millis(1500), "tracked only after {took:?}");
    drop(crowd);
    Ok(())
}

/// 256 processes of one user hold every tracking slot (`max_processes`); another user's job
/// starts: the slot of the first user's newest process goes to it, and the first user keeps the
/// others.
#[tokio::test(flavor = "multi_thread")]
async fn one_users_processes_cannot_take_every_tracking_slot() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let daemon = Daemon::start(DaemonOptions {
        config: format!("{SCHEDULER}ml_patterns = [\"ringside-second-user\"]\n"),
        ..DaemonOptions::default()
    })?;
    let device = PathBuf::from(format!("/dev/nvidia-ringside-share-{}", std::process::id()));
    let _ = std::fs::remove_file(&device);
    anyhow::ensure!(Command::new("mknod").arg(&device).args(["c", "1", "3"]).status()?.success(), "mknod");
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _device = Remove(device.clone());
    let scratch = Scratch::new("share");
    let dir = scratch.0.join("ready");
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    let ready = dir.join("holder");
    let mut command = Command::new("setpriv");
    command.args(as_user(1000, false)[1..].iter()).arg(hostile_binary());
    command.arg("hold").arg(&device).args(["--children", "255", "--ready"]).arg(&ready);
    let holder = Reaped::start(&mut command, &ready)?;
    let tracked = |s: &Value| {
        let shown = s["scheduler"]["processes"].as_array().map_or(0, Vec::len) as u64;
        shown + s["scheduler"]["processes_not_shown"].as_u64().unwrap_or(0)
    };
    daemon.wait_for("the first user's 256 processes tracked", 30, |s| tracked(s) == 256).await?;
    let job = marked_job("ringside-second-user", &[])?;
    let started = Instant::now();
    let snapshot = daemon.wait_for("the second user's job tracked", 10, |s| ml_process(s, job.pid()).is_some()).await?;
    println!(
        "256 processes of uid 1000 tracked; root's job tracked {} ms later; {} of uid 1000 not tracked",
        started.elapsed().as_millis(),
        snapshot["scheduler"]["processes_not_tracked"]
    );
    // At the next scan the process that gave up its slot is counted as not tracked.
    let later = daemon
        .json_when("/api/snapshot", "one process of uid 1000 not tracked, the job still tracked", 5, |s| {
            s["scheduler"]["processes_not_tracked"] == 1 && tracked(s) == 256 && ml_process(s, job.pid()).is_some()
        })
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().chars().take(300).collect::<String>()))?;
    anyhow::ensure!(later["scheduler"]["processes_not_tracked"] == 1);
    drop(holder);
    Ok(())
}

/// A process of an admitted user inside a user namespace of its own (`unshare -Ur`) holds every
/// capability there, CAP_SYS_NICE among them, and none on the node's threads: enforcement keeps
/// it at the floor its process has outside (RLIMIT_NICE 0: not below its own nice 0). Before,
/// its `CapEff` lifted the floor and it was given -5.
#[tokio::test(flavor = "multi_thread")]
async fn a_capability_inside_a_user_namespace_lifts_no_floor() -> Result<()> {
    let _one = ONE_DAEMON.lock().await;
    let config =
        format!("{SCHEDULER}mode = \"enforce\"\nbackend = \"setattr\"\n\n[scheduler.enforce]\nusers = [\"1\"]\n");
    let daemon = Daemon::start(DaemonOptions { config, ..DaemonOptions::default() })?;
    let scratch = Scratch::new("userns");
    let library = scratch.0.join("lib").join("libtorch_x.so");
    std::fs::create_dir_all(library.parent().unwrap())?;
    std::fs::copy("/bin/true", &library)?;
    let mut wrapper = as_user(1, false);
    wrapper.extend(["unshare".into(), "-Ur".into()]);
    let inside = map(&scratch.0, &library, &["--spin"], &wrapper)?;
    let status = std::fs::read_to_string(format!("/proc/{}/status", inside.pid()))?;
    let caps = status.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap_or_default().trim().to_string();
    anyhow::ensure!(caps != "0000000000000000", "the process holds capabilities in its namespace: {caps}");
    let decided = |s: &Value| {
        s["scheduler"]["decisions"]
            .as_array()
            .and_then(|d| d.iter().find(|d| d["pid"] == inside.pid() && d["applied"] == true).cloned())
    };
    let snapshot = daemon
        .json_when("/api/snapshot", "a decision applied to the process", 15, |s| decided(s).is_some())
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().chars().take(300).collect::<String>()))?;
    let decision = decided(&snapshot).unwrap_or_default();
    println!("CapEff {caps} inside its own user namespace: {}", decision["action"]);
    anyhow::ensure!(decision["nice"] == 0, "{decision}");
    anyhow::ensure!(nice_of(inside.pid(), inside.pid()) == Some(0), "{:?}", nice_of(inside.pid(), inside.pid()));
    Ok(())
}

/// Console sessions you can end, that a viewer cannot push out and a link cannot replace:
/// - a viewer signing in 300 times pushes out only its own oldest sessions (64 per token are
///   kept), never an operator's;
/// - a browser signed in as the operator that opens a link with the viewer's token stays the
///   operator (login CSRF), and is told to sign out first;
/// - signing out (`DELETE /api/sessions`) ends that session and clears the cookie;
/// - an operator ends every session of a token; a viewer may not.
#[tokio::test(flavor = "multi_thread")]
async fn sessions_can_be_ended_and_a_viewer_cannot_push_operators_out() -> Result<()> {
    let operator = ringside_tests::random_token();
    let viewer = ringside_tests::random_token();
    let daemon = Daemon::start(DaemonOptions {
        token_file: Some(format!("ops:{operator}:operator\nwatch:{viewer}:viewer\n")),
        config: "[scheduler]\nenabled = false\n".into(),
        ..DaemonOptions::default()
    })?;
    let http = daemon.http();
    let sign_in = |token: String| {
        let http = http.clone();
        let base = daemon.base.clone();
        async move {
            let landing = http.get(format!("{base}/?token={token}")).send().await?;
            let set = landing.headers().get("set-cookie").context("no cookie set")?.to_str()?.to_string();
            anyhow::Ok(set.split(';').next().unwrap_or_default().to_string())
        }
    };
    let authorised = |cookie: String| {
        let http = http.clone();
        let base = daemon.base.clone();
        async move { anyhow::Ok(http.get(format!("{base}/api/alerts")).header("cookie", cookie).send().await?.status()) }
    };
    let ops_cookie = sign_in(operator.clone()).await?;
    let first_viewer = sign_in(viewer.clone()).await?;
    for _ in 0..300 {
        sign_in(viewer.clone()).await?;
    }
    anyhow::ensure!(
        authorised(ops_cookie.clone()).await? == 200,
        "the operator's session survives 300 viewer sign-ins"
    );
    anyhow::ensure!(authorised(first_viewer).await? == 401, "the viewer's own oldest went");

    // A link with the viewer's token does not replace the operator's session.
    let link = http.get(format!("{}/?token={viewer}", daemon.base)).header("cookie", &ops_cookie).send().await?;
    anyhow::ensure!(link.status() == 409 && link.headers().get("set-cookie").is_none(), "{}", link.status());
    anyhow::ensure!(link.text().await?.contains("signed in to this node as <code>ops</code>"));

    // A viewer may not end the operator's sessions; the operator ends every viewer session.
    let viewer_cookie = sign_in(viewer.clone()).await?;
    let origin = daemon.base.clone();
    let end = |cookie: String, query: &'static str| {
        let http = http.clone();
        let (base, origin) = (daemon.base.clone(), origin.clone());
        async move {
            let response = http
                .delete(format!("{base}/api/sessions{query}"))
                .header("cookie", cookie)
                .header("origin", origin)
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await?;
            let status = response.status().as_u16();
            let cleared = response.headers().get("set-cookie").and_then(|v| v.to_str().ok()).map(str::to_string);
            let body: Value = response.json().await.unwrap_or_default();
            anyhow::Ok((status, body, cleared))
        }
    };
    let (status, _, _) = end(viewer_cookie.clone(), "?token=ops").await?;
    anyhow::ensure!(status == 403, "a viewer ends no token's sessions: {status}");
    let (status, body, _) = end(ops_cookie.clone(), "?token=watch").await?;
    anyhow::ensure!(status == 200 && body["ended"] == 64, "{status} {body}");
    anyhow::ensure!(authorised(viewer_cookie).await? == 401, "the viewer's sessions are over");
    // Signing out ends this session and clears the cookie.
    let (status, body, cleared) = end(ops_cookie.clone(), "").await?;
    anyhow::ensure!(status == 200 && body["ended"] == 1, "{status} {body}");
    anyhow::ensure!(cleared.is_some_and(|c| c.contains("Max-Age=0")), "the cookie is cleared");
    anyhow::ensure!(authorised(ops_cookie).await? == 401, "signed out");
    Ok(())
}
