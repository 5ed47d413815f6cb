//! The GPU source end to end, against the NVML test double (`tests/doubles/nvml_test_double.c`,
//! a stand-in for `libnvidia-ml.so.1`, which no machine here has): eight GPUs reach the
//! snapshot with the values the double was given (and a ninth that answers no call at all), fields a GPU does not report are null with
//! the reason, `/metrics` stays promtool-clean, `/metrics/dcgm` speaks dcgm-exporter's names,
//! a GPU lost mid-run degrades the component, and a driver that fails to start or is missing
//! leaves the rest of the daemon running.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ringside_tests::{alert, Daemon, DaemonOptions, Scratch};
use serde_json::Value;

const GIB: u64 = 1 << 30;

/// A daemon that finds the NVML test double first, reading `control`.
fn with_double(control: &std::path::Path, config: &str) -> Result<Daemon> {
    Daemon::start(DaemonOptions {
        config: format!("[scheduler]\nenabled = false\n{config}"),
        env: ringside_tests::nvml_double(control),
        ..DaemonOptions::default()
    })
}

/// The snapshot once `check` accepts its GPU reading (within 15 s).
async fn gpus_when(daemon: &Daemon, what: &str, check: impl Fn(&Value) -> bool) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let snapshot = daemon.get_json("/api/snapshot").await?;
        if check(&snapshot) {
            return Ok(snapshot);
        }
        ensure!(Instant::now() < deadline, "{what} within 15 s: {}", snapshot["gpus"]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The GPU source's component.
fn component(snapshot: &Value) -> Value {
    ringside_tests::component(snapshot, "gpu")
}

fn control_file(scratch: &Scratch, text: &str) -> Result<PathBuf> {
    let path = scratch.0.join("nvml-double.conf");
    std::fs::write(&path, text)?;
    Ok(path)
}

#[tokio::test]
async fn nine_gpus_reach_the_snapshot_metrics_and_dcgm_names_one_answering_nothing() -> Result<()> {
    let scratch = Scratch::new("nvml-eight");
    let me = std::process::id();
    let control = control_file(
        &scratch,
        &format!(
            "gpus 9\n\
             gpu 8 unsupported all\n\
             gpu 0 util 97 41\n\
             gpu 0 memory {total} {used}\n\
             gpu 0 process {me} {process_memory} 63\n\
             gpu 1 ecc 12 1\n\
             gpu 2 throttle 0x4\n\
             gpu 2 temperature 88 95\n\
             gpu 3 unsupported memory_temp\n\
             gpu 3 unsupported power\n\
             gpu 5 remapped 2 1 1 0\n",
            total = 141 * GIB,
            used = 80 * GIB,
            process_memory = 3 * GIB,
        ),
    )?;
    let daemon = with_double(&control, "")?;
    let snapshot =
        gpus_when(&daemon, "nine GPUs", |s| s["gpus"]["devices"].as_array().is_some_and(|d| d.len() == 9)).await?;
    let gpus = &snapshot["gpus"];
    assert_eq!(gpus["available"], true, "{gpus}");
    assert_eq!(gpus["driver_version"], "580.0-double");
    assert_eq!(gpus["cuda_driver_version"], "13.0");
    assert_eq!(gpus["xid_events"], true, "the event set is registered");
    assert_eq!(component(&snapshot)["status"], "up", "{}", component(&snapshot));
    let gpu = |i: usize| &gpus["devices"][i];

    // Values as the double was given them, in the snapshot's units.
    assert_eq!(gpu(0)["utilization_gpu_pct"], 97.0);
    assert_eq!(gpu(0)["utilization_memory_pct"], 41.0);
    assert_eq!(gpu(0)["memory_total_bytes"], 141 * GIB);
    assert_eq!(gpu(0)["memory_used_bytes"], 80 * GIB);
    assert_eq!(gpu(0)["memory_free_bytes"], 141 * GIB - 80 * GIB - GIB, "1 GiB reserved");
    assert_eq!(gpu(0)["power_draw_w"], 300.0);
    assert_eq!(gpu(0)["power_limit_w"], 700.0);
    assert_eq!(gpu(0)["pcie_tx_bytes_per_s"], 1000 * 1024, "KB/s to bytes/s");
    assert_eq!(gpu(0)["nvlink_links"], 18);
    assert_eq!(gpu(0)["nvlink_tx_bytes"], 1024 * 1024, "all links, KiB to bytes");
    assert_eq!(gpu(7)["uuid"], "GPU-00000000-0000-0000-0000-000000000007");
    assert_eq!(gpu(7)["pci_bus_id"], "00000000:1F:00.0");
    assert_eq!(gpu(7)["numa_node"], 1);
    assert_eq!(gpu(1)["ecc_corrected_volatile"], 12);
    assert_eq!(gpu(1)["ecc_uncorrected_volatile"], 1);
    assert_eq!(gpu(2)["throttle_reasons"], serde_json::json!(["sw_power_cap"]));
    assert_eq!(gpu(0)["throttle_reasons"], serde_json::json!([]), "running free");
    assert_eq!(gpu(2)["temperature_gpu_c"], 88);
    assert_eq!(gpu(2)["temperature_memory_c"], 95);
    assert_eq!(gpu(5)["remapped_rows_correctable"], 2);
    assert_eq!(gpu(5)["remapped_rows_pending"], true);
    // This test's own process, as NVML lists it on GPU 0.
    let process = &gpu(0)["processes"][0];
    assert_eq!(process["pid"], me);
    assert_eq!(process["gpu_memory_bytes"], 3 * GIB);
    assert_eq!(process["sm_utilization_pct"], 63.0);
    assert_eq!(gpu(1)["processes"], serde_json::json!([]));

    // What GPU 3 does not report is null, with the reason; never 0.
    for field in ["temperature_memory_c", "power_draw_w", "power_limit_w"] {
        assert!(gpu(3)[field].is_null(), "{field}: {}", gpu(3));
        assert_eq!(gpu(3)["unsupported"][field], "not supported by this GPU or driver", "{field}");
    }
    assert_eq!(gpu(3)["temperature_gpu_c"], 40, "its other fields are read");
    // GPU 8 answers nothing at all: every field null with the reason (but the daemon's own
    // "held down since", null while running free), and the rest goes on.
    for (field, value) in gpu(8).as_object().context("GPU 8")? {
        if value.is_null() && field != "hw_throttled_since_ms" {
            assert_eq!(gpu(8)["unsupported"][field], "not supported by this GPU or driver", "{field}");
        }
    }
    assert!(gpu(8)["utilization_gpu_pct"].is_null() && gpu(8)["memory_total_bytes"].is_null());
    assert_eq!(gpu(8)["index"], 8);

    // /metrics: promtool-clean, a series per GPU, nothing for what is not reported.
    let metrics = daemon.get("/metrics").await?.text().await?;
    ringside_tests::promtool_check(&metrics)?;
    let utilization = metrics.lines().filter(|l| l.starts_with("ringside_gpu_utilization_ratio{")).count();
    assert_eq!(utilization, 8, "{metrics}");
    assert!(metrics
        .contains("ringside_gpu_utilization_ratio{gpu=\"0\",uuid=\"GPU-00000000-0000-0000-0000-000000000000\"} 0.97"));
    assert!(!metrics.contains("ringside_gpu_power_watts{gpu=\"3\""), "no sample for what GPU 3 lacks");
    assert!(metrics.contains("ringside_gpu_clocks_throttled{gpu=\"2\",uuid=\"GPU-00000000-0000-0000-0000-000000000002\",reason=\"sw_power_cap\"} 1"));

    // /metrics/dcgm: dcgm-exporter's names, labels and units; it parses, and promtool's only
    // complaints are the naming lint dcgm-exporter's own output fails the same way.
    let dcgm = daemon.get("/metrics/dcgm").await?.text().await?;
    let hostname = snapshot["node"]["hostname"].as_str().context("hostname")?;
    let expected = format!(
        "DCGM_FI_DEV_FB_USED{{gpu=\"0\",UUID=\"GPU-00000000-0000-0000-0000-000000000000\",device=\"nvidia0\",\
         modelName=\"NVIDIA H200 (NVML test double)\",Hostname=\"{hostname}\",pci_bus_id=\"00000000:18:00.0\"}} 81920"
    );
    assert!(dcgm.contains(&expected), "{expected}\n{dcgm}");
    assert_eq!(dcgm.lines().filter(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{")).count(), 8);
    if let Err(e) = ringside_tests::promtool_check(&dcgm) {
        let report = e.to_string();
        let complaints: Vec<&str> = report.lines().skip(1).map(str::trim).filter(|l| !l.is_empty()).collect();
        for complaint in &complaints {
            assert!(
                complaint.ends_with("label names should be written in 'snake_case' not 'camelCase'")
                    || complaint.ends_with("counter metrics should have \"_total\" suffix")
                    || complaint.ends_with("metric name should not include type 'counter'"),
                "{complaint}"
            );
        }
    }

    // GPU health alerts: GPU 1's uncorrectable ECC error is critical, GPU 5's pending remap a
    // warning, GPU 2's temperature over the threshold a warning, GPU 0's 80 of 141 GiB none.
    let alerts = daemon
        .alerts_when("GPU alerts", 15, |a| !alert(a, "gpu:1/ecc").is_null() && !alert(a, "gpu:5/remap").is_null())
        .await?;
    let ecc = alert(&alerts, "gpu:1/ecc");
    assert_eq!((ecc["alert_type"].as_str(), ecc["severity"].as_str()), (Some("gpu_health"), Some("critical")), "{ecc}");
    assert_eq!(ecc["labels"]["uuid"], "GPU-00000000-0000-0000-0000-000000000001");
    assert_eq!(alert(&alerts, "gpu:5/remap")["severity"], "warning");
    assert_eq!(alert(&alerts, "gpu:2/temperature")["severity"], "warning");
    assert!(alert(&alerts, "gpu:0/memory").is_null(), "80 of 141 GiB is below the threshold");
    // The error counter cleared (a driver reload): the alert resolves after the quiet window.
    let text = std::fs::read_to_string(&control)?.replace("gpu 1 ecc 12 1", "gpu 1 ecc 12 0");
    std::fs::write(&control, text)?;
    daemon.alerts_when("the ECC alert resolved", 15, |a| alert(a, "gpu:1/ecc")["resolved_at_ms"].is_u64()).await?;

    // An XID on GPU 6, delivered through NVML's event set: logged with its meaning, counted,
    // and a critical alert (79 is among the codes that mean the GPU is failing).
    std::fs::write(&control, std::fs::read_to_string(&control)? + "gpu 6 xid 79\n")?;
    let with_xid = gpus_when(&daemon, "XID 79 on GPU 6", |s| s["gpus"]["devices"][6]["xid_count"] == 1).await?;
    let xid = &with_xid["gpus"]["devices"][6]["xids"][0];
    assert_eq!((xid["code"].as_u64(), xid["description"].as_str()), (Some(79), Some("GPU has fallen off the bus")));
    let alerts =
        daemon.alerts_when("a critical XID alert", 15, |a| alert(a, "gpu:6/xid")["severity"] == "critical").await?;
    let xid_alert = alert(&alerts, "gpu:6/xid");
    assert!(xid_alert["message"].as_str().unwrap_or_default().contains("XID 79"), "{xid_alert}");

    // GPU 4 falls off the bus: the component says which, the others are still shown.
    std::fs::write(&control, std::fs::read_to_string(&control)? + "gpu 4 lost 1\n")?;
    let lost = gpus_when(&daemon, "GPU 4 lost", |s| component(s)["status"] == "degraded").await?;
    let detail = component(&lost)["detail"].as_str().unwrap_or_default().to_string();
    assert!(detail.contains("GPU 4") && detail.contains("lost"), "{detail}");
    let lost_alert = alert(&daemon.get_json("/api/alerts").await?, "gpu:4/lost");
    assert_eq!(lost_alert["severity"], "critical", "{lost_alert}");
    assert_eq!(lost["gpus"]["devices"][0]["utilization_gpu_pct"], 97.0, "the rest of the reading stays");
    assert!(lost["gpus"]["devices"][4]["unsupported"]["gpu"].as_str().is_some_and(|w| w.contains("lost")));
    // Still said a few readings later, once NVML waits to be started again.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let later = daemon.get_json("/api/snapshot").await?;
    let detail = component(&later)["detail"].as_str().unwrap_or_default().to_string();
    assert!(detail.contains("GPU 4") && detail.contains("lost"), "{detail}");
    assert_eq!(daemon.get("/api/alerts").await?.status(), 200, "the daemon serves on");
    Ok(())
}

#[tokio::test]
async fn a_driver_that_does_not_start_or_is_missing_leaves_the_daemon_running() -> Result<()> {
    let scratch = Scratch::new("nvml-fails");
    let control = control_file(&scratch, "fail_init 1\n")?;
    // `mode = "on"`: this is a GPU node, and a driver library without its kernel driver is a
    // fault. (With `auto` it is one only where NVIDIA GPUs are on the PCI bus: see
    // tests/tests/real_driver.rs, with NVIDIA's own library.)
    let daemon = with_double(&control, "[gpu]\nmode = \"on\"\n")?;
    let snapshot = gpus_when(&daemon, "a reason", |s| s["gpus"]["reason"].is_string()).await?;
    assert_eq!(snapshot["gpus"]["available"], false);
    let reason = snapshot["gpus"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with(
            "NVIDIA's driver library is installed (libnvidia-ml.so.1) but the NVIDIA kernel driver is not loaded"
        ),
        "{reason}"
    );
    assert_eq!(component(&snapshot)["status"], "degraded", "a driver library without its driver is a fault");
    let health = daemon.health().await?;
    assert_eq!(health["status"], "degraded", "{health}");
    drop(daemon);

    // No library at all (this machine has none): absent, not a fault; /healthz stays ok on it.
    let daemon = Daemon::start(DaemonOptions {
        config: "[scheduler]\nenabled = false\n".into(),
        env: vec![("LD_LIBRARY_PATH".into(), scratch.0.display().to_string())],
        ..DaemonOptions::default()
    })?;
    let snapshot = gpus_when(&daemon, "a reason", |s| s["gpus"]["reason"].is_string()).await?;
    if snapshot["gpus"]["available"] == false {
        assert_eq!(component(&snapshot)["status"], "absent", "{}", component(&snapshot));
        assert!(snapshot["gpus"]["reason"].as_str().unwrap_or_default().contains("libnvidia-ml.so.1"));
        let health = daemon.health().await?;
        let gpu = health["components"].as_array().and_then(|c| c.iter().find(|c| c["name"] == "gpu")).cloned();
        assert_eq!(gpu.context("gpu in /healthz")?["status"], "absent");
        let metrics = daemon.get("/metrics").await?.text().await?;
        assert!(!metrics.contains("component=\"gpu\""), "no up/down series for what is not here");
    }
    drop(daemon);

    // And [gpu] mode = "off": no source, no GPUs in the snapshot.
    let daemon = with_double(&control, "[gpu]\nmode = \"off\"\n")?;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let snapshot = daemon.get_json("/api/snapshot").await?;
    assert!(snapshot.get("gpus").is_none_or(Value::is_null), "{}", snapshot["gpus"]);
    assert!(component(&snapshot).is_null());
    Ok(())
}

#[tokio::test]
async fn heat_throttling_containers_and_a_gpu_that_leaves_the_bus() -> Result<()> {
    let scratch = Scratch::new("nvml-health");
    // GPU 1 slows itself down at 80 °C and is at 77: over slowdown - 5 °C, under the fixed
    // 85 °C a GPU without a threshold is judged by. GPU 2's power brake holds its clocks.
    let control = control_file(
        &scratch,
        "gpus 3\ngpu 1 slowdown 80\ngpu 1 temperature 77 70\ngpu 2 throttle 0x80\ngpu 0 temperature 81 70\n",
    )?;
    let daemon = with_double(&control, "[thresholds]\ngpu_throttle_sustained_s = 3.0\n")?;
    let first =
        gpus_when(&daemon, "GPU 2 held down", |s| s["gpus"]["devices"][2]["hw_throttled_since_ms"].is_u64()).await?;
    let since = first["gpus"]["devices"][2]["hw_throttled_since_ms"].as_u64().unwrap_or(0);
    assert_eq!(first["gpus"]["devices"][1]["temperature_slowdown_c"], 80);
    assert_eq!(first["gpus"]["devices"][0]["temperature_slowdown_c"], 87, "the double's default");
    let alerts = daemon
        .alerts_when("heat and throttle alerts", 15, |a| {
            !alert(a, "gpu:1/temperature").is_null() && !alert(a, "gpu:2/throttle").is_null()
        })
        .await?;
    assert!(alert(&alerts, "gpu:0/temperature").is_null(), "81 °C is under 87 - 5 °C: {alerts}");
    let (heat, throttle) = (alert(&alerts, "gpu:1/temperature"), alert(&alerts, "gpu:2/throttle"));
    assert_eq!((heat["value"].as_f64(), heat["threshold"].as_f64()), (Some(77.0), Some(75.0)), "{heat}");
    assert!(
        heat["message"].as_str().unwrap_or_default().contains("over 75 °C; it slows itself down at 80 °C"),
        "{heat}"
    );
    let raised = throttle["raised_at_ms"].as_u64().unwrap_or(0);
    assert!(raised >= since + 3000, "raised {raised} ms, held since {since} ms: only once sustained");
    assert_eq!(throttle["severity"], "error", "{throttle}");
    // GPU 1 cools down and GPU 2 runs free: both alerts resolve after the quiet window.
    std::fs::write(&control, "gpus 3\ngpu 1 slowdown 80\ngpu 1 temperature 70 70\ngpu 0 temperature 81 70\n")?;
    let resolved = |a: &Value, source: &str| alert(a, source)["resolved_at_ms"].is_u64();
    daemon
        .alerts_when("heat and throttle alerts resolved", 15, |a| {
            resolved(a, "gpu:1/temperature") && resolved(a, "gpu:2/throttle")
        })
        .await?;

    // A process in a PID namespace of its own (a container's): NVML gives the host pid, the
    // console shows both.
    let mut container = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "sleep", "60"])
        .spawn()
        .context("unshare --pid (needs root)")?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let inner = loop {
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", container.id()))?;
        if let Some(pid) = children.split_whitespace().next() {
            break pid.to_string();
        }
        ensure!(Instant::now() < deadline, "unshare started no child");
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&control)? + &format!("gpu 0 process {inner} 1048576 10\n");
    std::fs::write(&control, text)?;
    let listed = gpus_when(&daemon, "the contained process", |s| {
        s["gpus"]["devices"][0]["processes"][0]["namespace_pid"].is_u64()
    })
    .await;
    let _ = container.kill();
    let _ = std::process::Command::new("pkill").args(["-KILL", "-P", &container.id().to_string()]).status();
    let _ = container.wait();
    let process = &listed?["gpus"]["devices"][0]["processes"][0];
    assert_eq!((process["pid"].to_string(), process["namespace_pid"].as_u64()), (inner, Some(1)), "{process}");

    // The driver's count drops to 2: GPU 2 left the bus. It is reported lost (not silently
    // gone), a critical alert is raised, and the other GPUs keep being read.
    std::fs::write(&control, "gpus 2\ngpu 0 util 33 10\n")?;
    let dropped = gpus_when(&daemon, "GPU 2 lost and GPU 0 read afresh", |s| {
        s["gpus"]["devices"][2]["unsupported"]["gpu"].is_string()
            && s["gpus"]["devices"][0]["utilization_gpu_pct"] == 33.0
    })
    .await?;
    let why = dropped["gpus"]["devices"][2]["unsupported"]["gpu"].as_str().unwrap_or_default();
    assert!(why.contains("no longer lists") && why.contains("2 listed, 3 seen"), "{why}");
    assert_eq!(dropped["gpus"]["devices"][2]["uuid"], "GPU-00000000-0000-0000-0000-000000000002");
    assert_eq!(component(&dropped)["status"], "degraded");
    daemon.alerts_when("a critical lost alert", 15, |a| alert(a, "gpu:2/lost")["severity"] == "critical").await?;
    // Readings go on: the count drop does not stop the sampler.
    std::fs::write(&control, "gpus 2\ngpu 0 util 34 10\n")?;
    gpus_when(&daemon, "GPU 0 still read", |s| s["gpus"]["devices"][0]["utilization_gpu_pct"] == 34.0).await?;
    // The GPU comes back (reseated, or the driver reloaded): read again, the component healthy,
    // the lost alert resolved.
    std::fs::write(&control, "gpus 3\ngpu 2 util 12 10\n")?;
    let back = gpus_when(&daemon, "GPU 2 back", |s| s["gpus"]["devices"][2]["utilization_gpu_pct"] == 12.0).await?;
    assert!(back["gpus"]["devices"][2]["unsupported"]["gpu"].is_null(), "{}", back["gpus"]);
    assert_eq!(back["gpus"]["devices"].as_array().map(Vec::len), Some(3), "listed once");
    assert_eq!(component(&back)["status"], "up", "{}", component(&back));
    daemon.alerts_when("the lost alert resolved", 15, |a| alert(a, "gpu:2/lost")["resolved_at_ms"].is_u64()).await?;
    Ok(())
}
