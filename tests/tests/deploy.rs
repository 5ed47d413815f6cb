//! The fleet files in `deploy/`: Prometheus rules that load, pass their unit tests
//! (`promtool test rules`), and only name metrics `ringsided` exports; and a real Prometheus
//! scraping two daemons with the scrape config's token and evaluating those rules.

use std::process::Command;

use anyhow::{ensure, Context, Result};
use ringside_tests::workspace_root;

fn promtool() -> Result<&'static str> {
    ["/usr/bin/promtool", "/usr/local/bin/promtool"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .context("promtool is missing: `cargo xtask setup --test` installs it (Debian package prometheus)")
}

#[test]
fn prometheus_rules_load_and_pass_their_unit_tests() -> Result<()> {
    let dir = workspace_root().join("deploy/prometheus");
    for args in [["check", "rules", "ringside.rules.yml"], ["test", "rules", "ringside.rules.test.yml"]] {
        let out = Command::new(promtool()?).args(args).current_dir(&dir).output()?;
        ensure!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

#[test]
fn the_rules_name_only_metrics_the_daemon_exports() -> Result<()> {
    let rules = std::fs::read_to_string(workspace_root().join("deploy/prometheus/ringside.rules.yml"))?;
    let exporter = std::fs::read_to_string(workspace_root().join("daemon/src/metrics.rs"))?;
    let mut named = std::collections::BTreeSet::new();
    for (i, _) in rules.match_indices("ringside_") {
        // A metric name, not a recording rule's `ringside:` or a word in a comment's prose.
        let name: String = rules[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        named.insert(name);
    }
    ensure!(named.len() >= 4, "{named:?}");
    for name in &named {
        ensure!(exporter.contains(&format!("\"{name}\"")), "{name} is named in the rules but not exported");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn two_nodes_scraped_by_a_real_prometheus_with_the_fleet_rules() -> Result<()> {
    use ringside_tests::fleet::Prometheus;
    use ringside_tests::{Daemon, DaemonOptions};
    let token = ringside_tests::random_token();
    let node = || {
        Daemon::start(DaemonOptions {
            token: Some(token.clone()),
            config: "[scheduler]\nenabled = false\n".into(),
            ..DaemonOptions::default()
        })
    };
    let (a, mut b) = (node()?, node()?);
    // The fleet rules as shipped, but for RingsideDown's 2 minutes: 3 s, so that it fires here.
    let shipped = std::fs::read_to_string(workspace_root().join("deploy/prometheus/ringside.rules.yml"))?;
    let down = "expr: up{job=\"ringside\"} == 0\n        for: 2m";
    ensure!(shipped.contains(down), "RingsideDown's expression and duration as the test expects");
    let rules = shipped.replacen(down, "expr: up{job=\"ringside\"} == 0\n        for: 3s", 1);
    // And the example Alertmanager routing, receiving what the rules fire.
    let routing = std::fs::read_to_string(workspace_root().join("deploy/alertmanager/alertmanager.yml"))?;
    let manager = ringside_tests::Alertmanager::start(&routing).await?;
    let manager_addr = manager.url.trim_start_matches("http://").to_string();
    let prometheus = Prometheus::start(&rules, &[&a.addr, &b.addr], &token, Some(&manager_addr))?;
    let http = reqwest::Client::new();
    let wait = |what: &'static str| (what, std::time::Instant::now() + std::time::Duration::from_secs(40));

    // Both nodes' series, through the scrape config's bearer token.
    let (what, deadline) = wait("both nodes scraped");
    loop {
        let hosts = prometheus.query("ringside_component_up{component=\"host\"}").await.unwrap_or_default();
        if hosts.len() == 2 {
            break;
        }
        ensure!(std::time::Instant::now() < deadline, "{what} within 40 s: {hosts:?}");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    // The rules load and evaluate without error.
    let (what, deadline) = wait("every rule evaluated");
    loop {
        let rules = prometheus.rules().await?;
        if rules.len() == 21 && rules.iter().all(|r| r["health"] == "ok") {
            break;
        }
        ensure!(std::time::Instant::now() < deadline, "{what} within 40 s: {rules:?}");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    // The Grafana dashboard: every panel's PromQL runs (the node variable set to all); those
    // about what these two nodes have (no scheduler, no GPU here) return series for both.
    let (dashboard, metric) = ringside_tests::fleet::dashboard("ringside-fleet.json", "instance")?;
    ensure!(prometheus.query(&metric).await?.len() == 2, "the node variable lists both nodes ({metric})");
    let (what, deadline) = wait("every panel's query answered");
    loop {
        let mut empty = Vec::new();
        for panel in dashboard["panels"].as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().context("expr")?.replace("$instance", ".*");
                if prometheus.query(&expr).await?.len() < 2 {
                    empty.push(expr);
                }
            }
        }
        let expected_empty = |e: &String| ["scheduler", "runq", "gpu", "process_phase"].iter().any(|k| e.contains(k));
        if empty.iter().all(expected_empty) {
            break;
        }
        ensure!(std::time::Instant::now() < deadline, "{what} within 40 s; without series: {empty:?}");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }

    // A node goes away: its RingsideDown alert goes pending, then fires, and the Alertmanager
    // routing groups it under the node and severity.
    let gone = b.addr.clone();
    b.kill_hard()?;
    let (what, deadline) = wait("RingsideDown firing for the stopped node");
    loop {
        let alerts = prometheus.query("ALERTS{alertname=\"RingsideDown\"}").await.unwrap_or_default();
        ensure!(alerts.iter().all(|p| p["metric"]["instance"] == gone.as_str()), "only the stopped node: {alerts:?}");
        if alerts.iter().any(|p| p["metric"]["alertstate"] == "firing") {
            break;
        }
        ensure!(std::time::Instant::now() < deadline, "{what} within 40 s: {alerts:?}");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let (what, deadline) = wait("the alert grouped by node and severity in Alertmanager");
    loop {
        let groups: serde_json::Value =
            http.get(format!("{}/api/v2/alerts/groups", manager.url)).send().await?.json().await?;
        let grouped = groups.as_array().into_iter().flatten().find(|g| {
            g["labels"]["instance"] == gone.as_str()
                && g["labels"]["severity"] == "critical"
                && g["alerts"].as_array().is_some_and(|a| a.iter().any(|a| a["labels"]["alertname"] == "RingsideDown"))
        });
        if let Some(group) = grouped {
            ensure!(group["receiver"]["name"] == "pager", "a critical alert is paged: {group}");
            break;
        }
        ensure!(std::time::Instant::now() < deadline, "{what} within 40 s: {groups}");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    drop(a);
    Ok(())
}

#[tokio::test]
async fn the_alertmanager_example_groups_by_node_and_holds_warnings_under_a_critical() -> Result<()> {
    let config = std::fs::read_to_string(workspace_root().join("deploy/alertmanager/alertmanager.yml"))?;
    let manager = ringside_tests::Alertmanager::start(&config).await?;
    let http = reqwest::Client::new();
    let alert = |name: &str, instance: &str, severity: &str| serde_json::json!({"labels": {"alertname": name, "instance": instance, "severity": severity}});
    let sent = serde_json::json!([
        alert("GpuLost", "node-a:9650", "critical"),
        alert("GpuHot", "node-a:9650", "warning"),
        alert("GpuHot", "node-b:9650", "warning"),
    ]);
    let posted = http.post(format!("{}/api/v2/alerts", manager.url)).json(&sent).send().await?;
    ensure!(posted.status().is_success(), "{}", posted.text().await?);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let alerts: serde_json::Value = http.get(format!("{}/api/v2/alerts", manager.url)).send().await?.json().await?;
        let state = |name: &str, instance: &str| {
            alerts
                .as_array()
                .into_iter()
                .flatten()
                .find(|a| a["labels"]["alertname"] == name && a["labels"]["instance"] == instance)
                .map(|a| a["status"]["state"].as_str().unwrap_or_default().to_string())
        };
        let states = (state("GpuLost", "node-a:9650"), state("GpuHot", "node-a:9650"), state("GpuHot", "node-b:9650"));
        if states == (Some("active".into()), Some("suppressed".into()), Some("active".into())) {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "node-a's warning held back, node-b's not, within 20 s: {states:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // One group per node and severity.
    let groups: serde_json::Value =
        http.get(format!("{}/api/v2/alerts/groups", manager.url)).send().await?.json().await?;
    let mut keys: Vec<String> = groups
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| {
            let label = |k: &str| g["labels"][k].as_str().unwrap_or_default().to_string();
            format!("{}/{}", label("instance"), label("severity"))
        })
        .collect();
    keys.sort();
    ensure!(keys == ["node-a:9650/critical", "node-a:9650/warning", "node-b:9650/warning"], "{keys:?}");
    Ok(())
}
