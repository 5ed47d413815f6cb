//! Alerts people can trust: persistence across restarts and `kill -9`, roles, config rules, and
//! the snapshot CLI — against the real daemon and its real SQLite store.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ringside_shared::{ErrorCode, Role, ServerMessage};
use ringside_tests::{daemon_binary, memory_rules, Daemon, DaemonOptions, Scratch, LOW_MEMORY_THRESHOLDS};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(15);

async fn wait_for_alerts(daemon: &Daemon, count: usize) -> Result<Vec<serde_json::Value>> {
    let deadline = Instant::now() + WAIT;
    loop {
        let alerts = daemon.get_json("/api/alerts").await?;
        let active: Vec<serde_json::Value> = alerts
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a["resolved_at_ms"].is_null())
            .collect();
        if active.len() >= count {
            return Ok(active);
        }
        ensure!(Instant::now() < deadline, "only {} of {count} alerts raised within {WAIT:?}", active.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn an_acknowledgement_survives_a_restart() -> Result<()> {
    let data = Scratch::new("restart-data");
    let options = || DaemonOptions {
        config: LOW_MEMORY_THRESHOLDS.into(),
        data_dir: Some(data.0.clone()),
        ..DaemonOptions::default()
    };
    let mut daemon = Daemon::start(options())?;
    let id = wait_for_alerts(&daemon, 1).await?[0]["id"].as_u64().context("alert id")?;
    let response = daemon.ack_as(&daemon.token, id, json!({"note": "disk swap planned", "by": "ana"})).await?;
    assert_eq!(response.status(), 200);
    assert!(daemon.terminate()?.success());

    let daemon = Daemon::start(options())?;
    let alerts = daemon.get_json("/api/alerts").await?;
    let alerts = alerts.as_array().context("array")?;
    assert_eq!(
        alerts.len(),
        1,
        "the standing condition continues the stored alert, it is not raised again: {alerts:#?}"
    );
    let alert = &alerts[0];
    assert_eq!(alert["id"], id);
    assert_eq!(alert["acknowledgement"]["by"], "ana");
    assert_eq!(alert["acknowledgement"]["note"], "disk swap planned");
    let kinds: Vec<&str> = alert["transitions"].as_array().unwrap().iter().filter_map(|t| t["kind"].as_str()).collect();
    assert_eq!(kinds, ["raised", "acknowledged"]);
    // A few ticks later it is still the same, acknowledged alert.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let later = daemon.get_json("/api/alerts").await?;
    assert_eq!(later[0]["id"], id);
    assert_eq!(later[0]["acknowledgement"]["by"], "ana");
    Ok(())
}

#[tokio::test]
async fn kill_9_during_an_acknowledgement_burst_loses_nothing_confirmed() -> Result<()> {
    let data = Scratch::new("kill9-data");
    const ALERTS: usize = 40;
    let options = || DaemonOptions {
        config: memory_rules(ALERTS, ""),
        data_dir: Some(data.0.clone()),
        ..DaemonOptions::default()
    };
    let mut daemon = Daemon::start(options())?;
    let ids: Vec<u64> = wait_for_alerts(&daemon, ALERTS).await?.iter().filter_map(|a| a["id"].as_u64()).collect();
    let mut first = daemon.ws(None).await?;
    let mut second = daemon.ws(None).await?;
    for client in [&mut first, &mut second] {
        client.next(WAIT).await?;
        client.next(WAIT).await?;
    }
    // Both clients fire acknowledgements for all alerts, interleaved, without waiting.
    for (i, id) in ids.iter().enumerate() {
        let client = if i % 2 == 0 { &mut first } else { &mut second };
        client.send_json(json!({"type": "ack_alert", "id": id, "by": format!("client-{}", i % 2)})).await?;
    }
    // Take confirmations (the broadcast that follows each commit) until a third are in, then
    // kill the daemon while the rest are still in flight.
    let mut confirmed = BTreeSet::new();
    while confirmed.len() < ALERTS / 3 {
        if let ServerMessage::AlertUpdated { alert } = first.next(WAIT).await? {
            if alert.acknowledgement.is_some() {
                confirmed.insert(alert.id);
            }
        }
    }
    daemon.kill_hard()?;
    // Anything the other client had already been told counts as confirmed too.
    while let Ok(message) = second.next(Duration::from_millis(200)).await {
        if let ServerMessage::AlertUpdated { alert } = message {
            if alert.acknowledgement.is_some() {
                confirmed.insert(alert.id);
            }
        }
    }

    let daemon = Daemon::start(options())?;
    let alerts = daemon.get_json("/api/alerts").await?;
    let acknowledged: BTreeSet<u64> = alerts
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| !a["acknowledgement"].is_null())
        .filter_map(|a| a["id"].as_u64())
        .collect();
    let lost: Vec<&u64> = confirmed.difference(&acknowledged).collect();
    assert!(lost.is_empty(), "confirmed acknowledgements lost by kill -9: {lost:?}");
    assert!(confirmed.len() >= ALERTS / 3);
    Ok(())
}

#[tokio::test]
async fn a_viewer_token_cannot_acknowledge() -> Result<()> {
    let (ana, wall) = ("ana-secret-0123456789", "wall-secret-0123456789");
    let daemon = Daemon::start(DaemonOptions {
        config: LOW_MEMORY_THRESHOLDS.into(),
        token: Some(ana.into()),
        token_file: Some(format!("# on-call\nana:{ana}:operator\nwall:{wall}:viewer\n")),
        ..DaemonOptions::default()
    })?;
    let id = wait_for_alerts(&daemon, 1).await?[0]["id"].as_u64().unwrap();

    let refused = daemon.ack_as(wall, id, json!({})).await?;
    assert_eq!(refused.status(), 403);
    let text = refused.text().await?;
    assert!(text.contains("wall") && text.contains("viewer"), "{text}");

    let mut viewer = daemon.ws_with(Some(wall), None).await?;
    let ServerMessage::Hello(hello) = viewer.next(WAIT).await? else { panic!("hello first") };
    assert_eq!((hello.identity.as_str(), hello.role), ("wall", Role::Viewer));
    viewer.send_json(json!({"type": "ack_alert", "id": id})).await?;
    let code = viewer
        .wait_for(WAIT, |m| match m {
            ServerMessage::Error { code, .. } => Some(*code),
            _ => None,
        })
        .await?;
    assert_eq!(code, ErrorCode::Forbidden);
    // The viewer still watches, and sees the operator's acknowledgement, attributed to ana.
    let ok = daemon.ack_as(ana, id, json!({"note": "mine"})).await?;
    assert_eq!(ok.status(), 200);
    let ack = viewer
        .wait_for(WAIT, |m| match m {
            ServerMessage::AlertUpdated { alert } if alert.id == id => alert.acknowledgement.clone(),
            _ => None,
        })
        .await?;
    assert_eq!((ack.by.as_str(), ack.token.as_str()), ("ana", "ana"));
    Ok(())
}

#[tokio::test]
async fn config_rules_raise_labelled_alerts_after_their_duration() -> Result<()> {
    let config = "[[rules]]\nname = \"memory_in_use\"\nmetric = \"host.memory_used_pct\"\nop = \">\"\nthreshold = 0.001\nfor = \"1s\"\nseverity = \"critical\"\nlabels = { team = \"ml-infra\" }\n";
    let started = Instant::now();
    let daemon = Daemon::start(DaemonOptions { config: config.into(), ..DaemonOptions::default() })?;
    let alert = wait_for_alerts(&daemon, 1).await?.remove(0);
    assert!(started.elapsed() >= Duration::from_secs(1), "fired only after holding for 1 s");
    assert_eq!(alert["alert_type"], "rule");
    assert_eq!(alert["rule"], "memory_in_use");
    assert_eq!(alert["severity"], "critical");
    assert_eq!(alert["labels"]["team"], "ml-infra");
    assert_eq!(alert["source"], "host");
    let snapshot = daemon.get_json("/api/snapshot").await?;
    assert_eq!(snapshot["config"]["rules"][0]["name"], "memory_in_use");
    assert_eq!(snapshot["config"]["rules"][0]["for_ms"], 1000);
    assert!(!snapshot.to_string().contains(&daemon.token), "the snapshot never holds a secret");
    Ok(())
}

#[test]
fn a_bad_rule_stops_the_daemon_naming_the_line() {
    let scratch = Scratch::new("bad-rule");
    let config = scratch.0.join("ringside.toml");
    std::fs::write(&config, "interval_ms = 500\n\n[[rules]]\nname = \"x\"\nmetric = \"host.gpu_temperature\"\nop = \">\"\nthreshold = 80\nseverity = \"warning\"\n").unwrap();
    let output = std::process::Command::new(daemon_binary())
        .arg("--config")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(scratch.0.join("data"))
        .env("RINGSIDE_TOKEN", "a-token-for-the-bad-rule-test")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("line 5") && stderr.contains("host.gpu_temperature"), "{stderr}");
}

#[tokio::test]
async fn snapshot_cli_prints_a_valid_snapshot_with_alert_history() -> Result<()> {
    let daemon = Daemon::start(DaemonOptions { config: LOW_MEMORY_THRESHOLDS.into(), ..DaemonOptions::default() })?;
    let id = wait_for_alerts(&daemon, 1).await?[0]["id"].as_u64().unwrap();
    assert_eq!(daemon.ack_as(&daemon.token, id, json!({"note": "seen"})).await?.status(), 200);
    let scratch = Scratch::new("cli");
    let token_file = scratch.0.join("token");
    ringside_tests::write_secret(&token_file, &format!("{}\n", daemon.token))?;
    let binary = daemon_binary();
    let base = daemon.base.clone();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(binary)
            .args(["snapshot", "--url", &base, "--token-file"])
            .arg(&token_file)
            .env_remove("RINGSIDE_TOKEN")
            .output()
    })
    .await??;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let snapshot: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let schema = daemon.get_json("/api/schema/snapshot").await?;
    let validator = jsonschema::validator_for(&schema)?;
    let errors: Vec<String> = validator.iter_errors(&snapshot).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let alert = snapshot["alerts"].as_array().unwrap().iter().find(|a| a["id"] == id).context("alert in snapshot")?;
    let kinds: Vec<&str> = alert["transitions"].as_array().unwrap().iter().filter_map(|t| t["kind"].as_str()).collect();
    assert_eq!(kinds, ["raised", "acknowledged"]);
    assert_eq!(alert["transitions"][1]["note"], "seen");

    // A wrong token is a clear failure, not a partial file.
    let binary = daemon_binary();
    let base = daemon.base.clone();
    let refused = tokio::task::spawn_blocking(move || {
        std::process::Command::new(binary)
            .args(["snapshot", "--url", &base])
            .env("RINGSIDE_TOKEN", "not-the-right-token-123")
            .output()
    })
    .await??;
    assert!(!refused.status.success());
    assert!(refused.stdout.is_empty());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("401"));
    Ok(())
}

/// A small tmpfs, unmounted on drop (needs root, as the suite runs).
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: std::path::PathBuf, size: &str) -> Result<SmallDisk> {
        std::fs::create_dir_all(&dir)?;
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(&dir)
            .status()?;
        ensure!(status.success(), "mount -t tmpfs {} (needs root): {status}", dir.display());
        Ok(SmallDisk(dir))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Acknowledges `id` as "ana"; the HTTP status.
async fn ack(daemon: &Daemon, id: u64) -> Result<u16> {
    Ok(daemon.ack_as(&daemon.token, id, json!({"by": "ana"})).await?.status().as_u16())
}

/// Fills the file system holding `dir` until it refuses more.
fn fill(dir: &std::path::Path) -> Result<std::path::PathBuf> {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path)?;
    let block = vec![0u8; 64 * 1024];
    while file.write_all(&block).is_ok() {}
    let _ = file.write_all(&block[..4096]);
    while file.write_all(&block[..512]).is_ok() {}
    Ok(path)
}

#[tokio::test]
async fn a_full_disk_loses_no_confirmed_acknowledgement_and_the_store_recovers() -> Result<()> {
    const ALERTS: usize = 6;
    let scratch = Scratch::new("full-disk");
    let disk = SmallDisk::mount(scratch.0.join("data"), "8m")?;
    let options = || DaemonOptions {
        config: memory_rules(ALERTS, ""),
        data_dir: Some(disk.0.clone()),
        ..DaemonOptions::default()
    };
    let mut daemon = Daemon::start(options())?;
    let ids: Vec<u64> = wait_for_alerts(&daemon, ALERTS).await?.iter().filter_map(|a| a["id"].as_u64()).collect();
    let mut confirmed = BTreeSet::new();
    ensure!(ack(&daemon, ids[0]).await? == 200, "an ack with room on the disk");
    confirmed.insert(ids[0]);

    // The disk fills up: acknowledgements are refused with the reason, none is half-kept.
    let filler = fill(&disk.0)?;
    let mut refused = 0;
    for &id in &ids[1..4] {
        match ack(&daemon, id).await? {
            200 => {
                confirmed.insert(id);
            }
            503 => refused += 1,
            other => anyhow::bail!("ack {id} on a full disk answered {other}"),
        }
    }
    let health: serde_json::Value = daemon.get("/healthz").await?.json().await?;
    println!("on a full disk: {refused} of 3 acknowledgements refused; health {}", health["components"]);
    ensure!(refused > 0, "a full disk refuses acknowledgements: {health}");
    let store = ringside_tests::component(&health, "alert-store");
    ensure!(store["status"] == "degraded", "{store}");
    let listed = daemon.get_json("/api/alerts").await?;
    for alert in listed.as_array().into_iter().flatten() {
        let id = alert["id"].as_u64().unwrap_or(0);
        ensure!(
            alert["acknowledgement"].is_null() != confirmed.contains(&id),
            "only confirmed acks are shown: {alert}"
        );
    }

    // Room again: the store recovers, acknowledgements are taken, and after kill -9 every
    // confirmed one is there.
    std::fs::remove_file(&filler)?;
    for &id in &ids[1..] {
        if !confirmed.contains(&id) && ack(&daemon, id).await? == 200 {
            confirmed.insert(id);
        }
    }
    ensure!(confirmed.len() == ALERTS, "every alert acknowledged once there is room: {confirmed:?}");
    daemon.component_when("alert-store", "up", 10).await?;
    daemon.kill_hard()?;
    let daemon = Daemon::start(options())?;
    let stored = daemon.get_json("/api/alerts").await?;
    let acked: BTreeSet<u64> = stored
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| !a["acknowledgement"].is_null())
        .filter_map(|a| a["id"].as_u64())
        .collect();
    ensure!(acked == confirmed, "after kill -9: {acked:?}, confirmed {confirmed:?}");
    drop(daemon);
    Ok(())
}

/// A daemon whose memory rule fires critical (`rule_extra` added to it) and records a bundle
/// from `before_s` before for 10 minutes, in `data`.
fn recording_options(data: &Scratch, before_s: u64, rule_extra: &str) -> DaemonOptions {
    DaemonOptions {
        interval_ms: 200,
        config: format!(
            "[scheduler]\nenabled = false\n\n[incidents]\nbefore_s = {before_s}\nafter_s = 600\n\n[[rules]]\n\
             name = \"memory_critical\"\nmetric = \"host.memory_used_pct\"\nop = \">\"\nthreshold = 0.001\n\
             severity = \"critical\"\n{rule_extra}"
        ),
        data_dir: Some(data.0.clone()),
        ..DaemonOptions::default()
    }
}

/// The first bundle listed, once there is one.
async fn first_bundle(daemon: &Daemon) -> Result<serde_json::Value> {
    let first = |l: &serde_json::Value| l.as_array().and_then(|l| l.first()).cloned();
    let list = daemon.json_when("/api/incidents", "a bundle recording", 20, |l| first(l).is_some()).await?;
    first(&list).context("the bundle")
}

/// A critical alert's incident bundle: readable while it records; a clean stop writes what it
/// holds (cut short), and the restarted daemon lists it from the data dir.
#[tokio::test]
async fn an_incident_bundle_recording_at_a_stop_is_written_cut_short_and_kept_across_a_restart() -> Result<()> {
    let data = Scratch::new("incident-stop");
    let options = || recording_options(&data, 2, "");
    let mut daemon = Daemon::start(options())?;
    let summary = first_bundle(&daemon).await?;
    assert_eq!(summary["recording"], true, "{summary}");
    let alerts = daemon.get_json("/api/alerts").await?;
    assert_eq!(summary["alert_id"], alerts[0]["id"], "{summary}");
    let id = summary["id"].as_u64().context("id")?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // What it holds so far.
    let partial = daemon.get_json(&format!("/api/incidents/{id}")).await?;
    assert_eq!(partial["complete"], false);
    let points = partial["history"].as_array().map_or(0, Vec::len);
    assert!(points >= 5, "{points} points after 1.5 s at 200 ms");

    let stopped_ms = ringside_tests::now_ms();
    assert!(daemon.terminate()?.success());
    let file = data.0.join("incidents").join(format!("{id}.json"));
    let written: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).context("written at the stop")?)?;
    assert_eq!(written["complete"], false);
    assert!(written["end_ms"].as_u64().unwrap_or(u64::MAX) <= stopped_ms, "{}", written["end_ms"]);
    assert!(written["history"].as_array().map_or(0, Vec::len) >= points);

    // Restarted: the alert continues (no second bundle), the bundle is listed and served.
    let daemon = Daemon::start(options())?;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let list = daemon.get_json("/api/incidents").await?;
    let listed = list.as_array().context("list")?;
    assert_eq!(listed.len(), 1, "{list}");
    assert_eq!((listed[0]["id"].as_u64(), listed[0]["recording"].as_bool()), (Some(id), Some(false)), "{list}");
    assert_eq!(listed[0]["complete"], false);
    assert_eq!(listed[0]["bytes"].as_u64(), Some(std::fs::metadata(&file)?.len()));
    assert_eq!(daemon.get_json(&format!("/api/incidents/{id}")).await?, written);
    let metrics = daemon.get("/metrics").await?.text().await?;
    assert!(metrics.lines().any(|l| l == "ringside_incident_bundles 1"), "{metrics}");
    let missing = daemon.get("/api/incidents/999").await?;
    assert_eq!(missing.status(), 404);
    let bad = daemon.get("/api/incidents/x/trace").await?;
    assert_eq!(bad.status(), 400);
    Ok(())
}

/// `kill -9` while a bundle records: the checkpoint written when the alert fired holds the
/// evidence from before it, and the restarted daemon keeps it as the bundle, cut short.
#[tokio::test]
async fn an_incident_bundle_recording_at_kill_9_keeps_the_evidence_from_before_the_alert() -> Result<()> {
    let data = Scratch::new("incident-kill");
    // Fired once the daemon has `before_s` of evidence.
    let options = || recording_options(&data, 3, "for = \"4s\"\n");
    let mut daemon = Daemon::start(options())?;
    let summary = first_bundle(&daemon).await?;
    let id = summary["id"].as_u64().context("id")?;
    let fired = summary["fired_at_ms"].as_u64().context("fired_at_ms")?;
    let checkpoint = data.0.join("incidents").join(format!("{id}.partial"));
    for _ in 0..50 {
        if checkpoint.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(checkpoint.exists(), "no checkpoint at {}", checkpoint.display());
    tokio::time::sleep(Duration::from_millis(500)).await;
    daemon.kill_hard()?;
    let file = data.0.join("incidents").join(format!("{id}.json"));
    ensure!(!file.exists(), "killed: the bundle itself was never written");

    let daemon = Daemon::start(options())?;
    let list = daemon.get_json("/api/incidents").await?;
    let listed = list.as_array().context("list")?;
    assert_eq!(listed.len(), 1, "{list}");
    assert_eq!((listed[0]["id"].as_u64(), listed[0]["recording"].as_bool()), (Some(id), Some(false)), "{list}");
    assert_eq!(listed[0]["complete"], false);
    assert!(!checkpoint.exists() && file.exists(), "the checkpoint became the bundle");
    let bundle = daemon.get_json(&format!("/api/incidents/{id}")).await?;
    let schema = daemon.get_json("/api/schema/incident").await?;
    let errors: Vec<String> = jsonschema::validator_for(&schema)?.iter_errors(&bundle).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!((bundle["fired_at_ms"].as_u64(), bundle["end_ms"].as_u64()), (Some(fired), Some(fired)));
    assert_eq!(bundle["start_ms"].as_u64(), Some(fired - 3000), "the span from before the alert");
    let points = bundle["history"].as_array().map_or(0, Vec::len);
    assert!(points >= 13, "{points} points over 3 s at 200 ms");
    assert!(bundle["notes"].to_string().contains("checkpoint"), "{}", bundle["notes"]);
    let trace = daemon.get_json(&format!("/api/incidents/{id}/trace")).await?;
    assert!(trace["traceEvents"].as_array().is_some_and(|e| !e.is_empty()));
    Ok(())
}

/// A storm: 1,000 critical rules firing in the same tick. The daemon keeps at most
/// `max_count` bundles and `max_bytes` on disk, counts what it gave up, and stays responsive.
#[tokio::test]
async fn a_thousand_critical_alerts_keep_the_incident_store_within_its_bounds() -> Result<()> {
    const RULES: usize = 1000;
    const MAX_COUNT: usize = 10;
    const MAX_BYTES: u64 = 1 << 20;
    let rules: String = (0..RULES)
        .map(|i| {
            format!(
                "[[rules]]\nname = \"storm{i:04}\"\nmetric = \"host.memory_used_pct\"\nop = \">\"\nthreshold = 0.001\n\
                 severity = \"critical\"\n\n"
            )
        })
        .collect();
    let daemon = Daemon::start(DaemonOptions {
        interval_ms: 200,
        config: format!(
            "[scheduler]\nenabled = false\n\n[incidents]\nbefore_s = 1\nafter_s = 1\nmax_count = {MAX_COUNT}\n\
             max_bytes = {MAX_BYTES}\n\n{rules}"
        ),
        ..DaemonOptions::default()
    })?;
    let dir = daemon.data_dir().join("incidents");
    let on_disk = || -> Result<(usize, u64)> {
        let mut files = (0, 0);
        for entry in std::fs::read_dir(&dir)?.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.ends_with(".json") && name != "index.json" {
                files = (files.0 + 1, files.1 + entry.metadata()?.len());
            }
        }
        Ok(files)
    };
    let mut most = (0, 0);
    wait_for_alerts(&daemon, RULES).await?;
    // Every bundle of the storm written or given up: none recording any more.
    let deadline = Instant::now() + WAIT;
    let list = loop {
        let (n, bytes) = on_disk()?;
        most = (most.0.max(n), most.1.max(bytes));
        let list = daemon.get_json("/api/incidents").await?;
        let recording = list.as_array().context("list")?.iter().filter(|i| i["recording"] == true).count();
        if recording == 0 && n > 0 {
            break list;
        }
        ensure!(Instant::now() < deadline, "{recording} bundles still recording: {list}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (n, bytes) = on_disk()?;
    // While one is written the oldest is still there: one over, never more.
    assert!(most.0 <= MAX_COUNT + 1, "{} files at once", most.0);
    assert!(n <= MAX_COUNT && bytes <= MAX_BYTES, "{n} files, {bytes} bytes");
    assert_eq!(list.as_array().map(Vec::len), Some(n), "{list}");
    // `/metrics` says so from the next tick on.
    let kept = format!("ringside_incident_bundles {n}");
    let metrics = daemon.poll_text("/metrics", "the bundles counted", 5, |m| m.lines().any(|l| l == kept)).await?;
    let value = |name: &str| {
        metrics.lines().find_map(|l| l.strip_prefix(&format!("{name} ")).and_then(|v| v.parse::<f64>().ok()))
    };
    assert_eq!(value("ringside_incident_bundle_bytes"), Some(bytes as f64));
    let dropped = value("ringside_incident_bundles_dropped_total").unwrap_or(0.0);
    assert!(dropped >= (RULES - 3 * MAX_COUNT - 64) as f64, "{dropped} dropped");
    eprintln!("1000 critical alerts: {n} bundles ({bytes} bytes) kept, {dropped} dropped, at most {} files", most.0);
    Ok(())
}
