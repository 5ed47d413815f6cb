//! Forwarding to a real Prometheus Alertmanager (Debian's `prometheus-alertmanager`), started on
//! loopback by the test.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ringside_tests::{Alertmanager, BasicUser, Daemon, DaemonOptions, Scratch, LOW_MEMORY_THRESHOLDS};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

async fn start_alertmanager() -> Result<Alertmanager> {
    Alertmanager::start("route:\n  receiver: nowhere\nreceivers:\n  - name: nowhere\n").await
}

#[tokio::test]
async fn alerts_reach_a_real_alertmanager() -> Result<()> {
    let manager = start_alertmanager().await?;
    let config = format!(
        "{LOW_MEMORY_THRESHOLDS}\n[alertmanager]\nurl = \"{}\"\nresend_interval_ms = 1000\n\n[[rules]]\nname = \"memory_in_use\"\nmetric = \"host.memory_used_pct\"\nop = \">\"\nthreshold = 0.001\nseverity = \"warning\"\nlabels = {{ team = \"ml-infra\" }}\n",
        manager.url
    );
    let daemon = Daemon::start(DaemonOptions { config, ..DaemonOptions::default() })?;
    let hostname = daemon.get_json("/api/snapshot").await?["node"]["hostname"].as_str().unwrap_or_default().to_string();

    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let received = loop {
        let alerts: serde_json::Value = http.get(format!("{}/api/v2/alerts", manager.url)).send().await?.json().await?;
        let names: Vec<String> = alerts
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["labels"]["alertname"].as_str().map(String::from))
            .collect();
        if names.contains(&"memory_pressure".to_string()) && names.contains(&"memory_in_use".to_string()) {
            break alerts;
        }
        ensure!(Instant::now() < deadline, "Alertmanager did not receive both alerts within 30 s: {alerts}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let rule = received
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["labels"]["alertname"] == "memory_in_use")
        .context("rule alert")?;
    assert_eq!(rule["labels"]["team"], "ml-infra");
    assert_eq!(rule["labels"]["severity"], "warning");
    assert_eq!(rule["labels"]["instance"], hostname.as_str());
    assert_eq!(rule["status"]["state"], "active");
    assert!(rule["annotations"]["summary"].as_str().unwrap_or_default().contains("host.memory_used_pct"));

    let health = daemon.health().await?;
    let component = health["components"].as_array().unwrap().iter().find(|c| c["name"] == "alertmanager").cloned();
    assert_eq!(component.context("alertmanager component")?["status"], "up");
    let metrics = daemon.get("/metrics").await?.text().await?;
    assert!(!metrics.contains("ringside_alertmanager_sent_total 0\n"), "deliveries are counted");
    Ok(())
}

#[tokio::test]
async fn an_unreachable_alertmanager_is_a_degraded_component_not_a_failure() -> Result<()> {
    let port = free_port();
    let config = format!(
        "{LOW_MEMORY_THRESHOLDS}\n[alertmanager]\nurl = \"http://127.0.0.1:{port}\"\nresend_interval_ms = 1000\n"
    );
    let daemon = Daemon::start(DaemonOptions { config, ..DaemonOptions::default() })?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let health = daemon.health().await?;
        let component = health["components"].as_array().unwrap().iter().find(|c| c["name"] == "alertmanager").cloned();
        if let Some(c) = component.filter(|c| c["status"] == "degraded") {
            assert!(c["detail"].as_str().unwrap_or_default().contains("cannot connect"), "{c}");
            assert_eq!(health["status"], "degraded");
            break;
        }
        ensure!(Instant::now() < deadline, "no degraded alertmanager component within 15 s: {health}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Everything else keeps working.
    assert!(!daemon.get_json("/api/alerts").await?.as_array().unwrap().is_empty());
    Ok(())
}

type Kept = std::sync::Arc<std::sync::Mutex<Vec<(String, serde_json::Value)>>>;

/// How the stand-in answers a request it does not take.
#[derive(Clone, Copy, Debug)]
enum Misbehaviour {
    /// 500 Internal Server Error.
    Refuse,
    /// Bytes that are not HTTP.
    Garbage,
    /// A chunked reply closed in the middle of a chunk.
    CloseMidChunk,
    /// Reads the request and never answers (the connection stays open).
    Hang,
}

/// A stand-in for Alertmanager's `POST /api/v2/alerts` (not Alertmanager): it answers the first
/// requests as `misbehave` says, one each, then takes every one and keeps its head (lower case)
/// and body.
async fn fake_alertmanager(misbehave: Vec<Misbehaviour>) -> Result<(String, Kept)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let taken: Kept = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = taken.clone();
    tokio::spawn(async move {
        let mut served = 0;
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut request = Vec::new();
            let mut buf = [0u8; 65536];
            let mut head = String::new();
            let body = loop {
                let Ok(n) = stream.read(&mut buf).await else { break None };
                if n == 0 {
                    break None;
                }
                request.extend_from_slice(&buf[..n]);
                let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
                head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if request.len() >= end + 4 + length {
                    break Some(request[end + 4..end + 4 + length].to_vec());
                }
            };
            served += 1;
            let reply: &[u8] = match misbehave.get(served - 1) {
                Some(Misbehaviour::Refuse) => b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n",
                Some(Misbehaviour::Garbage) => b"\x00\x17SSH-2.0 not http at all\r\n\r\n",
                Some(Misbehaviour::CloseMidChunk) => {
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n400\r\n{\"partial\":"
                }
                Some(Misbehaviour::Hang) => {
                    // Held open until the daemon gives up on it.
                    tokio::spawn(async move {
                        let mut rest = [0u8; 1];
                        let _ = stream.read(&mut rest).await;
                    });
                    continue;
                }
                None => {
                    if let Some(value) = body.and_then(|b| serde_json::from_slice(&b).ok()) {
                        keep.lock().unwrap().push((head, value));
                    }
                    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                }
            };
            let _ = stream.write_all(reply).await;
        }
    });
    Ok((url, taken))
}

#[tokio::test]
async fn a_resolution_sent_while_alertmanager_misbehaves_arrives_once_it_is_back() -> Result<()> {
    use Misbehaviour::*;
    // Each way of failing once (the hang costs the 10 s request timeout), then a good service.
    let (url, taken) = fake_alertmanager(vec![Refuse, Garbage, CloseMidChunk, Hang, Refuse]).await?;
    let scratch = Scratch::new("am-retry");
    let control = scratch.0.join("nvml.conf");
    std::fs::write(&control, "gpu 0 temperature 95 70\n")?;
    // Alertmanager sits behind an authenticating proxy: the token comes from a file.
    let token = scratch.0.join("am-token");
    ringside_tests::write_secret(&token, "am-s3cr3t\n")?;
    let config = format!(
        "[scheduler]\nenabled = false\n[alerts]\nclear_for_ms = 500\n[alertmanager]\nurl = \"{url}\"\nresend_interval_ms = 60000\nbearer_token_file = \"{}\"\n",
        token.display()
    );
    let daemon = Daemon::start(DaemonOptions {
        config,
        env: ringside_tests::nvml_double(&control),
        ..DaemonOptions::default()
    })?;
    // GPU 0 runs hot, then cools down: its alert is raised and resolved while Alertmanager
    // misbehaves.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !daemon.get_json("/api/alerts").await?.to_string().contains("gpu:0/temperature") {
        ensure!(Instant::now() < deadline, "no heat alert within 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::fs::write(&control, "gpu 0 temperature 40 40\n")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let resolved_ms = loop {
        let alerts = daemon.get_json("/api/alerts").await?;
        let heat = alerts.as_array().and_then(|a| a.iter().find(|a| a["source"] == "gpu:0/temperature").cloned());
        if let Some(at) = heat.and_then(|h| h["resolved_at_ms"].as_u64()) {
            break at;
        }
        ensure!(Instant::now() < deadline, "the heat alert did not resolve within 10 s: {alerts}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Its resolution reaches Alertmanager once it takes requests again, ending when it resolved
    // (the time of day is enough to tell it from the active version's end, minutes ahead).
    let ends = format!(
        "T{:02}:{:02}:{:02}.{:03}Z",
        resolved_ms / 3_600_000 % 24,
        resolved_ms / 60_000 % 60,
        resolved_ms / 1000 % 60,
        resolved_ms % 1000
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let resolution = loop {
        let found =
            taken.lock().unwrap().iter().flat_map(|(_, b)| b.as_array().cloned().unwrap_or_default()).find(|a| {
                a["labels"]["source"] == "gpu:0/temperature" && a["endsAt"].as_str().is_some_and(|e| e.ends_with(&ends))
            });
        if let Some(found) = found {
            break found;
        }
        ensure!(Instant::now() < deadline, "the resolution did not arrive within 60 s: {:?}", taken.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(resolution["labels"]["alertname"], "gpu_health", "{resolution}");
    // The notification log tells each try for this alert: the failures with their reasons,
    // then the batch that carried the resolution.
    let id = resolution["labels"]["ringside_alert_id"].as_str().context("alert id label")?.to_string();
    let log = daemon.get_json(&format!("/api/notifications?alert_id={id}&limit=1000")).await?;
    let entries = log.as_array().context("a list")?;
    let failed: Vec<&str> = entries.iter().filter(|n| n["ok"] == false).filter_map(|n| n["outcome"].as_str()).collect();
    assert!(failed.len() >= 4, "{log}");
    assert!(failed.iter().any(|o| o.contains("500")), "{failed:?}");
    assert!(failed.iter().any(|o| o.contains("within")), "the hang timed out: {failed:?}");
    assert!(
        entries.iter().any(|n| n["ok"] == true
            && n["alerts"]
                .as_array()
                .is_some_and(|a| a.iter().any(|a| a["id"].as_u64() == id.parse().ok() && a["resolved"] == true))),
        "the resolution's batch is logged as taken: {log}"
    );
    let heads: Vec<String> = taken.lock().unwrap().iter().map(|(head, _)| head.clone()).collect();
    assert!(heads.iter().all(|h| h.contains("authorization: bearer am-s3cr3t")), "the token from the file: {heads:?}");
    let health = daemon.health().await?;
    assert_eq!(ringside_tests::component(&health, "alertmanager")["status"], "up", "{health}");
    Ok(())
}

#[tokio::test]
async fn alerts_reach_an_alertmanager_served_over_https_with_basic_auth_and_an_untrusted_one_is_degraded() -> Result<()>
{
    let dir = Scratch::new("am-tls");
    let (cert, key) = ringside_tests::certificate(&dir.0)?;
    let config = "route:\n  receiver: nowhere\nreceivers:\n  - name: nowhere\n";
    // bcrypt (cost 10) of the password, as Alertmanager's web config takes it.
    let user = BasicUser {
        user: "ringside",
        password: "am-test-password",
        bcrypt: "$2b$10$cC/NfPZjo/esKkpOahVzmeNWWBMpN6tw9vXDv31R9D4zKChknQnry",
    };
    let manager = Alertmanager::start_with(config, Some((&cert, &key)), Some(user)).await?;
    ensure!(manager.url.starts_with("https://"), "{}", manager.url);
    let password = dir.0.join("am-password");
    std::fs::write(&password, "am-test-password\n")?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&password, std::fs::Permissions::from_mode(0o600))?;

    // A wrong password: Alertmanager refuses, the component says so.
    let wrong = dir.0.join("am-wrong-password");
    std::fs::write(&wrong, "not-the-password\n")?;
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600))?;
    let refused = format!(
        "{LOW_MEMORY_THRESHOLDS}\n[alertmanager]\nurl = \"{}\"\nresend_interval_ms = 1000\nca_file = {:?}\n\
         basic_auth_user = \"ringside\"\nbasic_auth_password_file = {:?}\n",
        manager.url, cert, wrong
    );
    let daemon = Daemon::start(DaemonOptions { config: refused, ..DaemonOptions::default() })?;
    let degraded = daemon.component_when("alertmanager", "degraded", 15).await?;
    let detail = ringside_tests::component(&degraded, "alertmanager")["detail"].to_string();
    ensure!(detail.contains("401"), "{detail}");
    drop(daemon);

    let trusting = format!(
        "{LOW_MEMORY_THRESHOLDS}\n[alertmanager]\nurl = \"{}\"\nresend_interval_ms = 1000\nca_file = {:?}\n\
         basic_auth_user = \"ringside\"\nbasic_auth_password_file = {:?}\n",
        manager.url, cert, password
    );
    let daemon = Daemon::start(DaemonOptions { config: trusting, ..DaemonOptions::default() })?;
    let connector = ringside_tests::tls_connector(Some(&cert))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = manager.get_with(Some(&connector), "/api/v2/alerts").await?;
        if status == 200 && body.contains("\"alertname\":\"memory_pressure\"") {
            break;
        }
        ensure!(Instant::now() < deadline, "Alertmanager over HTTPS did not receive the alert within 30 s: {body}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    daemon.component_when("alertmanager", "up", 10).await?;
    drop(daemon);

    // Without the CA file the system's bundle does not know this certificate: nothing is
    // sent, and the component says why.
    let untrusting =
        format!("{LOW_MEMORY_THRESHOLDS}\n[alertmanager]\nurl = \"{}\"\nresend_interval_ms = 1000\n", manager.url);
    let daemon = Daemon::start(DaemonOptions { config: untrusting, ..DaemonOptions::default() })?;
    let degraded = daemon.component_when("alertmanager", "degraded", 15).await?;
    let component = ringside_tests::component(&degraded, "alertmanager");
    let detail = component["detail"].as_str().unwrap_or_default();
    ensure!(detail.contains("TLS") && detail.contains("certificate"), "{component}");
    Ok(())
}
