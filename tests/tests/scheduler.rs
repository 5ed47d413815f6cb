//! The scheduler component of the real daemon: as root it observes threads through BPF; without
//! privileges it says why it is unavailable and everything else keeps working.

use ringside_tests::{Daemon, DaemonOptions};

fn scheduler_component(health: &serde_json::Value) -> serde_json::Value {
    health["components"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "scheduler")
        .cloned()
        .unwrap_or_default()
}

/// The first snapshot of at least `ticks` ticks for which `ready` holds, within 15 s.
async fn wait_for_ticks(
    daemon: &Daemon,
    ticks: u64,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> anyhow::Result<serde_json::Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let snapshot = daemon.get_json("/api/snapshot").await?;
        if snapshot["seq"].as_u64().unwrap_or(0) >= ticks && ready(&snapshot) {
            return Ok(snapshot);
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "no {ticks} ticks ready in 15 s: {snapshot}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn as_root_the_scheduler_observes_threads() -> anyhow::Result<()> {
    let daemon = Daemon::start(DaemonOptions::default())?;
    // The observer publishes after its first window and scan, which a loaded machine can
    // delay past the first ticks.
    let snapshot = wait_for_ticks(&daemon, 2, |s| !s["scheduler"].is_null()).await?;
    let scheduler = &snapshot["scheduler"];
    assert!(scheduler["total_tracked_tasks"].as_u64().unwrap_or(0) > 0, "threads are tracked: {scheduler}");
    assert_eq!(scheduler["total_cpus"], snapshot["node"]["cpus"]);
    let component = scheduler_component(&daemon.health().await?);
    assert_eq!(component["status"], "up", "{component}");
    assert_eq!(scheduler["mode"], "observe");
    assert_eq!(scheduler["attach_mode"], "tp_btf", "the best attach mode this kernel offers");
    let programs = scheduler["programs"].as_array().expect("programs listed");
    let waits = programs.iter().find(|p| p["attach"] == "sched_switch").expect("syscall waits listed");
    assert_eq!(waits["state"], "attached", "{waits}");
    for name in ["sched_switch", "sched_wakeup", "sched_process_fork", "sched_process_exit"] {
        let program = programs.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("{name} listed"));
        assert_eq!(program["state"], "attached", "{program}");
    }
    let metrics = daemon.get("/metrics").await?.text().await?;
    assert!(metrics.contains("zernel_scheduler_tasks{type=\"total\"}"), "{metrics}");
    Ok(())
}

#[tokio::test]
async fn without_privileges_the_scheduler_says_why_and_the_rest_works() -> anyhow::Result<()> {
    let wrapper =
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--"];
    let daemon = Daemon::start(DaemonOptions {
        wrapper: wrapper.iter().map(|s| s.to_string()).collect(),
        ..DaemonOptions::default()
    })?;
    let snapshot = wait_for_ticks(&daemon, 2, |_| true).await?;
    assert!(snapshot["scheduler"].is_null(), "no scheduler telemetry without the probe");
    assert!(snapshot["host"]["memory"]["total_bytes"].as_u64().unwrap_or(0) > 0, "host metrics still flow");
    let component = scheduler_component(&daemon.health().await?);
    assert_eq!(component["status"], "degraded", "{component}");
    let detail = component["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("scheduler unavailable") && detail.contains("permission"), "{detail}");
    // Unavailable is a state of the node, not an alert raised every start.
    assert!(daemon.get_json("/api/alerts").await?.as_array().unwrap().is_empty());
    Ok(())
}
