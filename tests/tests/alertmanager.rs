//! Forwarding to a real Prometheus Alertmanager (Debian's `prometheus-alertmanager`), started on
//! loopback by the test.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ringside_tests::{Daemon, DaemonOptions, Scratch, LOW_MEMORY_THRESHOLDS};

const ALERTMANAGER: &str = "/usr/bin/prometheus-alertmanager";

struct Alertmanager {
    child: Child,
    url: String,
    _scratch: Scratch,
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

async fn start_alertmanager() -> Result<Alertmanager> {
    ensure!(
        std::path::Path::new(ALERTMANAGER).exists(),
        "{ALERTMANAGER} is missing: `cargo xtask setup --test` installs prometheus-alertmanager"
    );
    let scratch = Scratch::new("alertmanager");
    let config = scratch.0.join("alertmanager.yml");
    std::fs::write(&config, "route:\n  receiver: nowhere\nreceivers:\n  - name: nowhere\n")?;
    let port = free_port();
    let child = Command::new(ALERTMANAGER)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.path={}", scratch.0.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--cluster.listen-address=")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start prometheus-alertmanager")?;
    let manager = Alertmanager { child, url: format!("http://127.0.0.1:{port}"), _scratch: scratch };
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(response) = http.get(format!("{}/-/ready", manager.url)).send().await {
            if response.status().is_success() {
                return Ok(manager);
            }
        }
        if Instant::now() > deadline {
            bail!("Alertmanager did not become ready within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
