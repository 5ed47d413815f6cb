//! The Debian package, installed for real (`cargo xtask test` builds it first): files, owners,
//! modes and the generated token; the installed binary started the way its systemd unit starts
//! it, with only the unit's capabilities (`setpriv`), its components up; without the BPF
//! capabilities the scheduler says why; `dpkg --purge` leaves nothing behind. Needs root, as
//! the suite does.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ringside_tests::{component, ml_process, workspace_root, Scratch, Workload};

fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program).args(args).output().with_context(|| format!("cannot run {program}"))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "{program} {}: {}\n{text}", args.join(" "), out.status);
    Ok(text)
}

fn mode(path: &str) -> Result<(u32, u32)> {
    let meta = std::fs::metadata(path).with_context(|| format!("{path} is missing"))?;
    Ok((meta.permissions().mode() & 0o7777, meta.uid()))
}

/// The unit's value for `key`.
fn unit_value(unit: &str, key: &str) -> Result<String> {
    unit.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
        .with_context(|| format!("{key} in the unit"))
}

/// Capabilities this process may hand on (its own bounding set), by setpriv's names: a
/// container may lack some (e.g. CAP_SYS_RESOURCE), and those cannot be granted here.
fn grantable() -> Result<Vec<String>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapBnd:")).context("CapBnd")?.trim();
    let decoded = run("capsh", &[&format!("--decode={hex}")])?;
    let list = decoded.split_once('=').map(|(_, l)| l.trim()).unwrap_or_default();
    Ok(list.split(',').map(|c| c.trim_start_matches("cap_").to_string()).collect())
}

/// `ringsided` as the unit starts it, on `port`: as the unit's user, with exactly `caps`
/// (setpriv's names) as its ambient, inheritable and bounding sets, as systemd's `User=` and
/// `AmbientCapabilities=` give them.
fn start(exec: &str, user: &str, caps: &[String], port: u16) -> Result<Child> {
    let mut words = exec.split_whitespace();
    let program = words.next().context("ExecStart")?;
    let set = format!("-all,{}", caps.iter().map(|c| format!("+{c}")).collect::<Vec<_>>().join(","));
    let set = set.trim_end_matches(',').to_string();
    Ok(Command::new("setpriv")
        .args([&format!("--reuid={user}"), &format!("--regid={user}"), "--clear-groups"])
        .args(["--inh-caps", &set, "--ambient-caps", &set, "--bounding-set", &set, "--"])
        .arg(program)
        .args(words)
        .env("RINGSIDE_LISTEN", format!("127.0.0.1:{port}"))
        .env("RINGSIDE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?)
}

/// `/healthz` with the token once `ready` accepts its components (within 20 s).
async fn health_when(port: u16, token: &str, ready: impl Fn(&serde_json::Value) -> bool) -> Result<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let client = reqwest::Client::new();
    loop {
        let answer = client.get(format!("http://127.0.0.1:{port}/healthz")).bearer_auth(token).send().await;
        if let Ok(response) = answer {
            let body: serde_json::Value = response.json().await?;
            if ready(&body) {
                return Ok(body);
            }
            ensure!(Instant::now() < deadline, "health within 20 s: {body}");
        } else {
            ensure!(Instant::now() < deadline, "no answer on port {port} within 20 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn stop(mut child: Child) -> Result<()> {
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill()?;
    bail!("ringsided did not stop on SIGTERM within 10 s")
}

/// Runs the installed daemon (the config in /etc enforcing) with `caps` beside `ml-workload`
/// until its CUDA/NCCL libraries are probed and a decision for it is `wanted`; that decision.
async fn enforcing(
    exec: &str,
    user: &str,
    caps: &[String],
    token: &str,
    wanted: impl Fn(&serde_json::Value) -> bool,
) -> Result<serde_json::Value> {
    let port = free_port();
    let daemon = start(exec, user, caps, port)?;
    let job = Scratch::new("package-job");
    let workload = Workload::start(&job.0, 1000, 4);
    let found = async {
        let pid = workload.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))?.pid();
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let answer = client.get(format!("http://127.0.0.1:{port}/api/snapshot")).bearer_auth(token).send().await;
            let snapshot: serde_json::Value = match answer {
                Ok(response) => response.json().await?,
                Err(_) => serde_json::Value::Null,
            };
            let probed =
                ml_process(&snapshot, pid).and_then(|p| p["probed_libraries"].as_array()).is_some_and(|l| l.len() >= 2);
            let decision = snapshot["scheduler"]["decisions"]
                .as_array()
                .and_then(|d| d.iter().find(|d| d["pid"] == pid && wanted(d)).cloned());
            if let (true, Some(decision)) = (probed, &decision) {
                return Ok::<_, anyhow::Error>(decision.clone());
            }
            ensure!(
                Instant::now() < deadline,
                "within 20 s: libraries probed {probed}, the decision wanted {}: {}",
                decision.is_some(),
                snapshot["scheduler"]
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    .await;
    drop(workload);
    stop(daemon)?;
    found
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_package_installs_runs_with_the_units_capabilities_and_purges_clean() -> Result<()> {
    let deb = workspace_root().join(format!("target/debian/ringside_{}_amd64.deb", env!("CARGO_PKG_VERSION")));
    ensure!(deb.exists(), "{} is missing: `cargo xtask package` (or `cargo xtask test`) builds it", deb.display());
    // A run that failed half-way may have left it installed.
    let _ = Command::new("dpkg").args(["--purge", "ringside"]).output();
    let installed = run("dpkg", &["-i", deb.to_str().context("path")?])?;
    let outcome = async {
        ensure!(installed.contains("operator token was written to /etc/ringside/tokens"), "{installed}");
        let uid: u32 = run("id", &["-u", "ringside"])?.trim().parse().context("the ringside user")?;
        ensure!(uid != 0, "a system user of its own");
        assert_eq!(mode("/usr/bin/ringsided")?, (0o755, 0));
        assert_eq!(mode("/var/lib/ringside")?, (0o700, uid));
        assert_eq!(mode("/etc/ringside/tokens")?, (0o600, uid));
        assert_eq!(mode("/etc/ringside/ringsided.toml")?.0, 0o644);
        let tokens = std::fs::read_to_string("/etc/ringside/tokens")?;
        let token = tokens.trim().split(':').nth(1).context("operator:TOKEN:operator")?.to_string();
        ensure!(tokens.starts_with("operator:") && token.len() == 64, "{tokens}");
        let unit = std::fs::read_to_string("/lib/systemd/system/ringsided.service")?;
        run("systemd-analyze", &["verify", "/lib/systemd/system/ringsided.service"])?;
        let security =
            run("systemd-analyze", &["security", "--offline=true", "/lib/systemd/system/ringsided.service"])?;
        let exposure = security.lines().find(|l| l.contains("Overall exposure level")).unwrap_or_default().to_string();
        println!("systemd-analyze security: {exposure}");

        // The unit's way: its flags, its user, its capabilities and no others (those this
        // machine can grant: a container's bounding set may lack some).
        let exec = unit_value(&unit, "ExecStart")?;
        let user = unit_value(&unit, "User")?;
        let unit_caps = |key: &str| -> Result<Vec<String>> {
            Ok(unit_value(&unit, key)?
                .split_whitespace()
                .map(|c| c.trim_start_matches("CAP_").to_ascii_lowercase())
                .collect())
        };
        ensure!(unit_caps("AmbientCapabilities")? == unit_caps("CapabilityBoundingSet")?, "granted = bounded");
        let grantable = grantable()?;
        let (caps, missing): (Vec<String>, Vec<String>) =
            unit_caps("AmbientCapabilities")?.into_iter().partition(|c| grantable.contains(c));
        if !missing.is_empty() {
            println!("not grantable on this machine, so not granted here: {missing:?}");
        }
        let port = free_port();
        let daemon = start(&exec, &user, &caps, port)?;
        let up = |h: &serde_json::Value, name: &str| component(h, name)["status"] == "up";
        let health = health_when(port, &token, |h| up(h, "scheduler") && up(h, "alert-store")).await;
        // Serving by now: setpriv has become the daemon, as the unit's user.
        let daemon_uid = std::fs::read_to_string(format!("/proc/{}/status", daemon.id())).ok().and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|v| v.split_whitespace().next()).map(String::from)
        });
        let console = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()?
            .get(format!("http://127.0.0.1:{port}/?token={token}"))
            .send()
            .await;
        stop(daemon)?;
        ensure!(daemon_uid == Some(uid.to_string()), "ran as {user} ({uid}), not {daemon_uid:?}");
        let health = health.context("with the unit's capabilities, the scheduler and the alert store come up")?;
        ensure!(console?.status() == 303, "the console takes the token");
        ensure!(Path::new("/var/lib/ringside/alerts.db").exists(), "the alert store in the data dir");
        println!("with the unit's capabilities: scheduler {}", component(&health, "scheduler"));

        // A training job beside it, and enforcement on: as the unit's user and capabilities the
        // CUDA/NCCL uprobes attach and a decision is applied to the job's thread; without
        // CAP_SYS_NICE the decisions are made and say why they could not be applied.
        let shipped_config = std::fs::read_to_string("/etc/ringside/ringsided.toml")?;
        std::fs::write(
            "/etc/ringside/ringsided.toml",
            "[scheduler]\nbackend = \"setattr\"\nwindow_ms = 100\nscan_interval_ms = 200\n\n[scheduler.enforce]\nusers = [\"root\"]\n",
        )?;
        let applied = enforcing(&exec, &user, &caps, &token, |d| d["applied"] == true).await;
        let no_nice: Vec<String> = caps.iter().filter(|c| c.as_str() != "sys_nice").cloned().collect();
        let refused = enforcing(&exec, &user, &no_nice, &token, |d| {
            d["applied"] == false && d["error"].as_str().is_some_and(|e| e.contains("Operation not permitted"))
        })
        .await;
        std::fs::write("/etc/ringside/ringsided.toml", shipped_config)?;
        let applied = applied.context("uprobes and enforcement as the unit's user")?;
        println!("as {user} with the unit's capabilities: CUDA/NCCL uprobes attached, applied: {applied}");
        let refused = refused.context("enforcement without CAP_SYS_NICE")?;
        println!("without CAP_SYS_NICE: {refused}");

        // Without the BPF capabilities the probe cannot load: said, and the rest serves. (The
        // three go together: the kernel lets CAP_SYS_ADMIN do what CAP_BPF and CAP_PERFMON do.)
        let fewer: Vec<String> =
            caps.iter().filter(|c| !["bpf", "perfmon", "sys_admin"].contains(&c.as_str())).cloned().collect();
        let port = free_port();
        let daemon = start(&exec, &user, &fewer, port)?;
        let health = health_when(port, &token, |h| {
            let s = component(h, "scheduler");
            !s.is_null() && s["status"] != "up" && !s["detail"].as_str().unwrap_or_default().starts_with("starting")
        })
        .await;
        stop(daemon)?;
        let health = health?;
        let scheduler = component(&health, "scheduler");
        println!("without CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN: scheduler {scheduler}");
        ensure!(up(&health, "alert-store") && up(&health, "host"), "the rest serves: {health}");
        let detail = scheduler["detail"].as_str().unwrap_or_default().to_ascii_lowercase();
        ensure!(
            detail.contains("permission") || detail.contains("privilege") || detail.contains("cap_"),
            "{scheduler}"
        );
        Ok(())
    }
    .await;
    let purged = run("dpkg", &["--purge", "ringside"]);
    outcome?;
    purged?;
    for gone in ["/usr/bin/ringsided", "/etc/ringside", "/var/lib/ringside", "/lib/systemd/system/ringsided.service"] {
        ensure!(!Path::new(gone).exists(), "{gone} is left after purge");
    }
    ensure!(!Command::new("id").arg("ringside").output()?.status.success(), "the ringside user is left after purge");
    Ok(())
}
