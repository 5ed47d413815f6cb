//! The console in a real headless Chromium (through ChromeDriver), against the real daemon:
//! live data, Acknowledge, Download snapshot, and screenshots saved under `artifacts/`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use fantoccini::{Client, Locator};
use ringside_tests::browser::{
    artifacts, browser, close, draws_a_line, draws_history_bands, eventually, text_of, Cdp, Driver,
};
use ringside_tests::{hostile_binary, Daemon, DaemonOptions, Reaped, Scratch, Workload, LOW_MEMORY_THRESHOLDS};

/// A rule that raises a critical alert from the host's real memory use.
const CRITICAL_RULE: &str = "[[rules]]\nname = \"memory_critical\"\nmetric = \"host.memory_used_pct\"\nop = \">\"\nthreshold = 0.001\nseverity = \"critical\"\n";
/// The default canary and a `stats` kernel fed the host's per-CPU utilisation every tick.
const KERNELS: &str = "[[kernels]]\nid = \"canary\"\nkernel = \"echo\"\n\n[[kernels]]\nid = \"cpu-stats\"\nkernel = \"stats\"\ninput = \"cpu_utilization\"\n";

/// Opens GPU `index`'s card from its row (and waits for it).
async fn open_gpu(client: &Client, index: u64) -> Result<()> {
    let button = format!("#gpus-panel tr.gpu-row[data-gpu-index='{index}'] button.gpu-details-toggle");
    eventually("the GPU's row", Duration::from_secs(30), || async {
        Ok(client.find(Locator::Css(&button)).await.ok())
    })
    .await?
    .click()
    .await?;
    let card = format!("#gpus-panel .gpu-card[data-gpu-index='{index}']");
    eventually("the GPU's card", Duration::from_secs(30), || async { Ok(client.find(Locator::Css(&card)).await.ok()) })
        .await?;
    Ok(())
}

async fn console_flow(client: &Client, daemon: &Daemon, downloads: &Path) -> Result<()> {
    const WAIT: Duration = Duration::from_secs(30);
    client.goto(&daemon.console_url).await?;

    // Live data: connected, the node named, and charts with lines of several points.
    eventually("connection badge shows Live", WAIT, || async {
        Ok(text_of(client, "#connection").await?.filter(|t| t.contains("Live")))
    })
    .await?;
    let snapshot = daemon.get_json("/api/snapshot").await?;
    let hostname = snapshot["node"]["hostname"].as_str().unwrap_or_default().to_string();
    let shown = text_of(client, "#hostname").await?.unwrap_or_default();
    assert_eq!(shown, hostname, "header names the node");
    eventually("CPU chart draws a line", WAIT, || draws_a_line(client, "#host-panel svg.chart path.line")).await?;
    // The default echo canary: a card, active, with its latency drawn over time.
    let state = eventually("canary card", WAIT, || async {
        text_of(client, "#kernels-panel [data-kernel-id='canary'] .kstate").await
    })
    .await?;
    assert_eq!(state.to_lowercase(), "active");
    eventually("canary latency chart draws a line", WAIT, || {
        draws_a_line(client, "[data-kernel-id='canary'] svg.chart path.line")
    })
    .await?;
    // The stats kernel's own result: what it summarises, percentiles, how many samples.
    let output = eventually("the stats kernel's summary", WAIT, || async {
        Ok(text_of(client, "[data-kernel-id='cpu-stats'] [data-output='stats']")
            .await?
            .filter(|t| t.contains("samples")))
    })
    .await?;
    assert!(
        output.to_lowercase().contains("per-cpu utilisation") && output.contains("p99") && output.contains(" %"),
        "{output}"
    );
    // The GPUs panel says what the GPU source found: here, on a machine without the NVIDIA
    // driver, that there is none, in the snapshot's words; on a GPU node, a card per GPU.
    let gpus = eventually("a GPU reading in the snapshot", WAIT, || async {
        let gpus = daemon.get_json("/api/snapshot").await?["gpus"].clone();
        // With GPUs, wait for the XID the test double delivers after the first reading.
        let settled = gpus["available"] == false
            || gpus["devices"].as_array().is_some_and(|d| d.iter().any(|g| g["xid_count"].as_u64() > Some(0)));
        Ok((!gpus.is_null() && settled).then_some(gpus))
    })
    .await?;
    if gpus["available"] == true {
        // A compact row per GPU (8 on one screen), with the XID badge where the driver reported
        // one; a GPU's card (its chart and every figure) opens from its row.
        let count = gpus["devices"].as_array().map_or(0, Vec::len);
        eventually("a row per GPU", WAIT, || async {
            Ok((client.find_all(Locator::Css("#gpus-panel tr.gpu-row")).await?.len() == count).then_some(()))
        })
        .await?;
        let rows = client.find(Locator::Css("#gpus-panel table.gpu-rows")).await?;
        let (_, _, _, rows_height) = rows.rectangle().await?;
        assert!(rows_height < 600.0, "{count} GPUs take {rows_height} px");
        for gpu in gpus["devices"].as_array().into_iter().flatten().filter(|g| g["xid_count"].as_u64() > Some(0)) {
            let badge = format!("#gpus-panel tr.gpu-row[data-gpu-index='{}'] .gpu-xid", gpu["index"]);
            let shown = eventually("the XID badge", WAIT, || async { text_of(client, &badge).await }).await?;
            let code = gpu["xids"].as_array().and_then(|x| x.last()).map(|x| x["code"].to_string()).unwrap_or_default();
            assert_eq!(shown, format!("XID {code}"));
        }
        open_gpu(client, 0).await?;
        eventually("GPU 0's utilisation chart draws a line", WAIT, || {
            draws_a_line(client, "#gpus-panel .gpu-card[data-gpu-index='0'] svg.chart path.line")
        })
        .await?;
        for gpu in gpus["devices"].as_array().into_iter().flatten().filter(|g| g["xid_count"].as_u64() > Some(0)) {
            open_gpu(client, gpu["index"].as_u64().unwrap_or_default()).await?;
            let badge = format!("#gpus-panel .gpu-card[data-gpu-index='{}'] .gpu-xid", gpu["index"]);
            let shown =
                eventually("the XID line in the card", WAIT, || async { text_of(client, &badge).await }).await?;
            let code = gpu["xids"].as_array().and_then(|x| x.last()).map(|x| x["code"].to_string()).unwrap_or_default();
            assert!(shown.starts_with(&format!("XID {code} (")), "{shown}");
        }
        // The whole panel in one picture (an element's screenshot is cut at the window).
        let (width, height) = client.get_window_size().await?;
        client.set_window_size(width as u32, 4000).await?;
        let panel = client.find(Locator::Css("#gpus-panel")).await?;
        std::fs::write(artifacts().join("gpus.png"), panel.screenshot().await?)?;
        client.set_window_size(width as u32, height as u32).await?;
    } else {
        let reason = gpus["reason"].as_str().unwrap_or("NVML did not answer").to_string();
        let shown =
            eventually("the GPUs panel's reason", WAIT, || async { text_of(client, "#gpus-unavailable").await })
                .await?;
        assert_eq!(shown, format!("No GPU telemetry: {reason}"));
    }
    let first = text_of(client, "#components-panel .muted").await?.unwrap_or_default();
    eventually("update counter moves", WAIT, || async {
        Ok(text_of(client, "#components-panel .muted").await?.filter(|t| *t != first))
    })
    .await?;

    // Acknowledge the memory-pressure alert raised from the host's real memory use.
    let button =
        eventually("an Acknowledge button", WAIT, || async { Ok(client.find(Locator::Css("button.ack")).await.ok()) })
            .await?;
    let id: u64 = button.attr("data-alert-id").await?.context("button names its alert")?.parse()?;
    // The operator's name goes with the acknowledgement (and is remembered by the browser).
    client.find(Locator::Css("#operator")).await?.send_keys("ana-in-the-browser").await?;
    client.find(Locator::Css("#alerts-panel h2")).await?.click().await?;
    button.click().await?;
    let acked = eventually("alert shown as acknowledged", WAIT, || async {
        text_of(client, &format!("li[data-alert-id='{id}'] [data-acked='true']")).await
    })
    .await?;
    assert!(acked.contains("Acknowledged by ana-in-the-browser"), "{acked}");
    let alerts = daemon.get_json("/api/alerts").await?;
    let stored = alerts.as_array().unwrap().iter().find(|a| a["id"] == id).context("alert in the server's list")?;
    assert_eq!(stored["acknowledgement"]["by"], "ana-in-the-browser", "the server recorded who acknowledged: {stored}");

    std::fs::write(artifacts().join("console.png"), client.screenshot().await?)?;

    // Download snapshot saves the server's JSON under its attachment name.
    client.find(Locator::Css("#download-snapshot")).await?.click().await?;
    let file = eventually("the snapshot file is downloaded", WAIT, || async {
        let found = std::fs::read_dir(downloads)?.flatten().map(|e| e.path()).find(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("ringside-snapshot-") && name.ends_with(".json")
        });
        Ok(found)
    })
    .await?;
    let downloaded: serde_json::Value = serde_json::from_slice(&std::fs::read(&file)?)?;
    assert_eq!(downloaded["node"]["hostname"], hostname.as_str());
    let saved =
        downloaded["alerts"].as_array().and_then(|a| a.iter().find(|a| a["id"] == id)).context("alert in the file")?;
    assert!(!saved["acknowledgement"].is_null());
    let kinds: Vec<&str> =
        saved["transitions"].as_array().into_iter().flatten().filter_map(|t| t["kind"].as_str()).collect();
    assert_eq!(kinds, ["raised", "acknowledged"], "the file holds the alert's history");

    // Dark theme, for the record.
    client.find(Locator::Css("#theme-toggle")).await?.click().await?;
    eventually("dark theme applied", WAIT, || async {
        let theme = client.execute("return document.documentElement.getAttribute('data-theme')", vec![]).await?;
        Ok((theme == "dark").then_some(()))
    })
    .await?;
    std::fs::write(artifacts().join("console-dark.png"), client.screenshot().await?)?;

    // Signing out ends the session: the page comes back as the sign-in page.
    client.find(Locator::Css("#sign-out")).await?.click().await?;
    eventually("the sign-in page after signing out", WAIT, || async {
        let heading = text_of(client, "h1").await?;
        Ok(heading.filter(|h| h.contains("Sign-in needed")).map(|_| ()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn console_shows_live_data_acknowledges_and_downloads() -> Result<()> {
    // Eight GPUs from the NVML test double (no GPU here): one throttled by heat, one with an
    // XID, one busy with a nearly full memory.
    let nvml = Scratch::new("nvml-console");
    let control = nvml.0.join("nvml-double.conf");
    std::fs::write(
        &control,
        format!(
            "gpus 8\ngpu 0 util 97 60\ngpu 0 memory {} {}\ngpu 2 throttle 0x40\ngpu 2 temperature 86 90\ngpu 3 xid 79\n",
            141u64 << 30,
            120u64 << 30
        ),
    )?;
    let daemon = Daemon::start(DaemonOptions {
        token: None,
        interval_ms: 500,
        config: format!("{LOW_MEMORY_THRESHOLDS}\n{KERNELS}"),
        env: ringside_tests::nvml_double(&control),
        ..DaemonOptions::default()
    })?;
    let driver = Driver::start()?;
    let profile = Scratch::new("chromium-profile");
    let downloads = Scratch::new("downloads");
    let client = browser(&driver, &profile.0, &downloads.0).await?;
    let outcome = console_flow(&client, &daemon, &downloads.0).await;
    close(client, outcome.is_err(), "console-failure").await;
    outcome
}

#[tokio::test]
async fn console_reconnects_after_a_restart_and_the_acknowledgement_is_still_there() -> Result<()> {
    // The page keeps running while its daemon goes away; it must say so, come back by itself,
    // and show what was acknowledged before the restart (kept in the alert store).
    let token = ringside_tests::random_token();
    let data = Scratch::new("browser-restart-data");
    let options = |listen: &str| DaemonOptions {
        token: Some(token.clone()),
        listen: listen.to_string(),
        config: format!("{LOW_MEMORY_THRESHOLDS}\n{CRITICAL_RULE}"),
        data_dir: Some(data.0.clone()),
        ..DaemonOptions::default()
    };
    let mut daemon = Daemon::start(options("127.0.0.1:0"))?;
    let driver = Driver::start()?;
    let profile = Scratch::new("chromium-profile");
    let downloads = Scratch::new("downloads");
    let client = browser(&driver, &profile.0, &downloads.0).await?;
    let outcome = async {
        const WAIT: Duration = Duration::from_secs(30);
        client.goto(&format!("{}/?token={token}", daemon.base)).await?;
        eventually("Live", WAIT, || async {
            Ok(text_of(&client, "#connection").await?.filter(|t| t.contains("Live")))
        })
        .await?;
        // The critical alert is listed first and counted in the header badge until acknowledged.
        let badge = eventually("critical badge", WAIT, || async { text_of(&client, "#critical-badge").await }).await?;
        assert_eq!(badge, "1 critical unacknowledged");
        let button = eventually("an Acknowledge button", WAIT, || async {
            Ok(client.find(Locator::Css("button.ack")).await.ok())
        })
        .await?;
        let id = button.attr("data-alert-id").await?.context("alert id")?;
        let first_row = text_of(&client, &format!("li[data-alert-id='{id}'] .sev")).await?.unwrap_or_default();
        assert_eq!(first_row.to_lowercase(), "critical");
        client
            .find(Locator::Css(&format!("li[data-alert-id='{id}'] .ack-note")))
            .await?
            .send_keys("before restart")
            .await?;
        button.click().await?;
        let acked = format!("li[data-alert-id='{id}'] [data-acked='true']");
        eventually("acknowledged", WAIT, || async { text_of(&client, &acked).await }).await?;
        eventually("badge gone", WAIT, || async {
            Ok(client.find(Locator::Css("#critical-badge")).await.is_err().then_some(()))
        })
        .await?;

        let addr = daemon.addr.clone();
        daemon.terminate()?;
        let offline = eventually("offline banner", WAIT, || async { text_of(&client, ".banner-warn").await }).await?;
        assert!(offline.contains("Retrying in"), "{offline}");
        // Same address, token and data again: the console reconnects without a reload.
        let _again = Daemon::start(options(&addr))?;
        eventually("Live again", Duration::from_secs(60), || async {
            Ok(text_of(&client, "#connection").await?.filter(|t| t.contains("Live")))
        })
        .await?;
        let banner_gone = client.find(Locator::Css(".banner-warn")).await.is_err();
        assert!(banner_gone, "the offline banner goes once live");
        let after =
            eventually("still acknowledged after the restart", WAIT, || async { text_of(&client, &acked).await })
                .await?;
        assert!(after.contains("before restart"), "{after}");
        anyhow::Ok(())
    }
    .await;
    let _ = client.close().await;
    outcome
}

#[tokio::test]
async fn two_browsers_see_each_others_acknowledgements_live() -> Result<()> {
    let daemon = Daemon::start(DaemonOptions {
        token: None,
        config: ringside_tests::memory_rules(2, "team = \"ml\""),
        ..DaemonOptions::default()
    })?;
    let driver = Driver::start()?;
    let (profile_a, profile_b, downloads) =
        (Scratch::new("chromium-a"), Scratch::new("chromium-b"), Scratch::new("downloads"));
    let a = browser(&driver, &profile_a.0, &downloads.0).await?;
    let b = browser(&driver, &profile_b.0, &downloads.0).await?;
    let outcome = async {
        const WAIT: Duration = Duration::from_secs(30);
        for client in [&a, &b] {
            client.goto(&daemon.console_url).await?;
            eventually("two alerts listed", WAIT, || async {
                Ok((client.find_all(Locator::Css("button.ack")).await?.len() == 2).then_some(()))
            })
            .await?;
        }
        let ids: Vec<String> = {
            let mut ids = Vec::new();
            for button in a.find_all(Locator::Css("button.ack")).await? {
                ids.push(button.attr("data-alert-id").await?.context("id")?);
            }
            ids
        };
        // A acknowledges the first, B sees it; B acknowledges the second, A sees it.
        for (actor, watcher, id, name) in [(&a, &b, &ids[0], "alice"), (&b, &a, &ids[1], "bob")] {
            actor.find(Locator::Css("#operator")).await?.send_keys(name).await?;
            actor.find(Locator::Css("#alerts-panel h2")).await?.click().await?;
            actor.find(Locator::Css(&format!("button.ack[data-alert-id='{id}']"))).await?.click().await?;
            let selector = format!("li[data-alert-id='{id}'] [data-acked='true']");
            let seen = eventually("the other browser sees the acknowledgement", WAIT, || async {
                text_of(watcher, &selector).await
            })
            .await?;
            assert!(seen.contains(&format!("Acknowledged by {name}")), "{seen}");
        }
        // The filters: nothing is left unacknowledged, both show under Acknowledged; both are
        // warnings, so "error and above" hides them and "warning and above" brings them back.
        for (filter, value, shown) in [
            ("#alert-state-filter", "unacknowledged", 0),
            ("#alert-state-filter", "acknowledged", 2),
            ("#alert-severity-filter", "error", 0),
            ("#alert-severity-filter", "warning", 2),
        ] {
            a.find(Locator::Css(filter)).await?.select_by_value(value).await?;
            eventually(&format!("{shown} alerts listed with {filter} = {value}"), WAIT, || async {
                if shown == 0 {
                    return Ok(text_of(&a, "#no-alerts").await?.map(|_| ()));
                }
                Ok((a.find_all(Locator::Css("#alert-list li.alert")).await?.len() == shown).then_some(()))
            })
            .await?;
        }
        // Each alert's history lists its acknowledgement.
        a.find(Locator::Css(&format!("li[data-alert-id='{}'] details.history summary", ids[0]))).await?.click().await?;
        let history = text_of(&a, &format!("li[data-alert-id='{}'] .transitions", ids[0])).await?.unwrap_or_default();
        assert!(
            history.contains("acknowledged") && history.contains("alice") && history.contains("raised"),
            "{history}"
        );
        std::fs::write(artifacts().join("console-two-browsers.png"), a.screenshot().await?)?;
        anyhow::Ok(())
    }
    .await;
    let _ = a.close().await;
    let _ = b.close().await;
    outcome
}

#[tokio::test]
async fn the_scheduler_panel_shows_an_ml_job_live() -> Result<()> {
    const WAIT: Duration = Duration::from_secs(30);
    // GPUs from the NVML test double, which lists the workload as a compute process on GPU 0
    // once the control file says so (no GPU here).
    let nvml = Scratch::new("nvml-control");
    let control = nvml.0.join("nvml-double.conf");
    let daemon = Daemon::start(DaemonOptions {
        token: None,
        interval_ms: 500,
        config: "[scheduler]\nwindow_ms = 100\nscan_interval_ms = 200".into(),
        env: ringside_tests::nvml_double(&control),
        ..DaemonOptions::default()
    })?;
    let workload_dir = Scratch::new("workload");
    let workload = Workload::start(&workload_dir.0, 700, 6)?;
    let pid = workload.pid();
    std::fs::write(&control, format!("gpus 2\ngpu 1 util 40 10\ngpu 1 process {pid} {} 64\n", 1u64 << 30))?;
    // Beside it, a process mapping a 3 GiB sparse file named like the CUDA driver: refused.
    let huge = workload_dir.0.join("huge").join("libcuda.so.1");
    std::fs::create_dir_all(huge.parent().unwrap())?;
    std::fs::File::create(&huge)?.set_len(3 << 30)?;
    let ready = workload_dir.0.join("huge-ready");
    let mapper = Reaped::start(
        std::process::Command::new(hostile_binary()).arg("map").arg(&huge).arg("--ready").arg(&ready),
        &ready,
    )?;
    let driver = Driver::start()?;
    let profile = Scratch::new("chromium-profile");
    let downloads = Scratch::new("downloads");
    let client = browser(&driver, &profile.0, &downloads.0).await?;
    let outcome = async {
        client.goto(&daemon.console_url).await?;
        eventually("the scheduler's mode", WAIT, || async {
            Ok(text_of(&client, "#sched-mode").await?.filter(|t| t == "observe"))
        })
        .await?;
        // The job's timeline fills with several phases as the workload goes through them.
        let timeline = format!(".ml-process[data-pid='{pid}'] svg.timeline rect");
        eventually("a timeline with three phases or more", WAIT, || async {
            let mut classes = std::collections::BTreeSet::new();
            for rect in client.find_all(Locator::Css(&timeline)).await? {
                classes.extend(rect.attr("class").await?.filter(|c| !c.contains("unknown")));
            }
            Ok((classes.len() >= 3).then_some(()))
        })
        .await?;
        // Its GPU use, joined by pid with NVML's process list of GPU 1.
        let gpu_use = eventually("the job's GPU use", WAIT, || async {
            text_of(&client, &format!(".ml-process[data-pid='{pid}'] .gpu-use")).await
        })
        .await?;
        assert_eq!(gpu_use, "GPU 1: 1.0 GiB, SM 64 %");
        // Why GPU 1 sits idle (60 % of the time: it is 40 % busy), split by the job's phases:
        // within a few cycles the workload has loaded data, and that share shows.
        open_gpu(&client, 1).await?;
        let idle_line = "#gpus-panel .gpu-card[data-gpu-index='1'] .gpu-idle";
        let idle = eventually("GPU 1's idle attribution with data loading in it", WAIT, || async {
            Ok(text_of(&client, idle_line).await?.filter(|t| t.contains("waiting for data")))
        })
        .await?;
        assert!(idle.starts_with(&format!("ml-workload (pid {pid}): GPU 1 idle 60% of the last minute: ")), "{idle}");
        // The bar beside the words: idle time by phase, as wide as its share of the window.
        let segment = client
            .find(Locator::Css("#gpus-panel .gpu-card[data-gpu-index='1'] .idle-bar span[data-phase='data_loading']"))
            .await?;
        let width = segment.attr("style").await?.unwrap_or_default();
        let pct: f64 = width.trim_start_matches("width: ").trim_end_matches('%').parse().unwrap_or(0.0);
        assert!(pct > 0.0 && pct <= 60.0, "the data-loading segment: {width}");
        // Its steps are visible (a cycle of four 0.7 s phases): the last one on its own line.
        let step_line = "#gpus-panel .gpu-card[data-gpu-index='1'] .gpu-step-idle";
        let step =
            eventually("the last step's idle line", WAIT, || async { text_of(&client, step_line).await }).await?;
        // 2.8 s as the workload sleeps it; on a loaded machine the phase edges the probe sees
        // move by a few hundred ms either way.
        let seconds: f64 =
            step.trim_start_matches("last step ").split(' ').next().and_then(|s| s.parse().ok()).unwrap_or(0.0);
        assert!((2.0..=3.6).contains(&seconds) && step.contains("GPU idle 60%"), "{step}");
        // The job's idle on the GPU over time: live, and from the daemon's job.gpu_idle_* series.
        let idle_chart = format!(
            "#gpus-panel .gpu-card[data-gpu-index='1'] .gpu-idle-chart[data-job='{pid}'] \
             figure[data-chart='Idle, by what the job was doing'] svg.chart"
        );
        let lines = format!("{idle_chart} path.line");
        eventually("the job's GPU idle drawn over time", WAIT, || draws_a_line(&client, &lines)).await?;
        draws_history_bands(&client, "the job's GPU idle from the history", &format!("{idle_chart} path.band")).await?;
        let (w, h) = client.get_window_size().await?;
        client.set_window_size(w as u32, 4000).await?;
        let card = client.find(Locator::Css("#gpus-panel .gpu-card[data-gpu-index='1']")).await?;
        std::fs::write(artifacts().join("gpu-idle.png"), card.screenshot().await?)?;
        client.set_window_size(w as u32, h as u32).await?;
        let metrics = daemon.get("/metrics").await?.text().await?;
        ringside_tests::promtool_check(&metrics)?;
        let series = format!("ringside_job_gpu_idle_ratio{{job=\"{pid}\",comm=\"ml-workload\",gpu=\"1\"");
        assert!(metrics.contains(&series), "{series} in /metrics");
        let row = text_of(&client, &format!("#scheduler-panel tr[data-tid='{pid}']")).await?;
        assert!(row.is_some_and(|r| r.contains("ml-workload")), "the main thread has a row in the table");
        let worker = text_of(&client, "#scheduler-panel .ml-processes").await?.unwrap_or_default();
        assert!(worker.contains("pt_data_worker") && worker.contains("worker of job"), "{worker}");
        // Observe mode changes nobody, and each process says so next to its user.
        let admission =
            text_of(&client, &format!(".ml-process[data-pid='{pid}'] .admission")).await?.unwrap_or_default();
        assert!(admission.contains("uid 0") && admission.contains("observe mode"), "{admission}");
        let refused = format!(".ml-process[data-pid='{}'] .library-refused", mapper.pid());
        let refused = eventually("the huge library shown as refused", WAIT, || async {
            Ok(text_of(&client, &refused).await?.filter(|t| t.contains("over the 2.0 GiB")))
        })
        .await?;
        assert!(
            refused.contains("not probed") && refused.contains("libcuda.so.1") && refused.contains("3.0 GiB"),
            "{refused}"
        );
        let programs = text_of(&client, "#scheduler-panel .programs summary").await?.unwrap_or_default();
        assert!(programs.contains("BPF programs"), "{programs}");
        std::fs::write(artifacts().join("scheduler.png"), client.screenshot().await?)?;
        anyhow::Ok(())
    }
    .await;
    close(client, outcome.is_err(), "scheduler-failure").await;
    drop(workload);
    drop(mapper);
    outcome
}

#[tokio::test]
async fn the_jobs_view_shows_the_ranks_here_with_their_work_and_wait_and_links_to_the_fleet() -> Result<()> {
    const WAIT: Duration = Duration::from_secs(30);
    let template = "https://grafana.example/d/ringside-job?orgId=1&var-job_id={job_id}";
    let daemon = Daemon::start(DaemonOptions {
        token: None,
        interval_ms: 500,
        config: format!(
            "[server]\nfleet_job_url = \"{template}\"\n[scheduler]\nwindow_ms = 100\nscan_interval_ms = 200\n"
        ),
        ..DaemonOptions::default()
    })?;
    // Two ranks of a torchrun job on this node (the world is 2); rank 1 loads data 150 ms
    // longer each step, so rank 0 waits for it in the all-reduce.
    let scratch = Scratch::new("jobs-view");
    let run = format!("console-run-{}", std::process::id());
    let barrier = scratch.0.join("barrier");
    let rank = |r: u32, load: &str| -> Result<Reaped> {
        let ready = scratch.0.join(format!("ready-{r}"));
        let mut command = Command::new(ringside_tests::ddp_rank_binary());
        command
            .args(["--rank", &r.to_string(), "--world", "2", "--barrier"])
            .arg(&barrier)
            .args(["--load-ms", load, "--compute-ms", "200", "--optimizer-ms", "20", "--transfer-ms", "100", "--ready"])
            .arg(&ready)
            .env("TORCHELASTIC_RUN_ID", &run)
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", "2");
        Reaped::start(&mut command, &ready)
    };
    let (rank0, rank1) = (rank(0, "100")?, rank(1, "250")?);
    let driver = Driver::start()?;
    let profile = Scratch::new("chromium-profile");
    let downloads = Scratch::new("downloads");
    let client = browser(&driver, &profile.0, &downloads.0).await?;
    let outcome = async {
        client.goto(&daemon.console_url).await?;
        let card = format!("#scheduler-panel .fleet-job[data-job-id='{run}']");
        let count = eventually("the job with both ranks", WAIT, || async {
            Ok(text_of(&client, &format!("{card} .rank-count")).await?.filter(|t| t.contains("0, 1")))
        })
        .await?;
        assert_eq!(count, "· ranks 0, 1 here, of 2");
        let link = client.find(Locator::Css(&format!("{card} a.fleet-link"))).await?;
        let href = link.attr("href").await?.unwrap_or_default();
        assert_eq!(href, template.replace("{job_id}", &run));
        assert_eq!(link.attr("rel").await?.as_deref(), Some("noopener noreferrer"));
        // Own work and wait per step: rank 1 has the more work, rank 0 the longer wait.
        let ms = |text: Option<String>| -> Option<f64> {
            let text = text?;
            let value: f64 = text.split_whitespace().next()?.parse().ok()?;
            Some(if text.ends_with(" s") { value * 1000.0 } else { value })
        };
        let (own, wait) = eventually("both ranks' work and wait per step", WAIT, || async {
            let mut figures = Vec::new();
            for r in ["0", "1"] {
                let row = format!("{card} tr[data-rank='{r}']");
                figures.push((
                    ms(text_of(&client, &format!("{row} .rank-own")).await?),
                    ms(text_of(&client, &format!("{row} .rank-wait")).await?),
                ));
            }
            Ok(match figures.as_slice() {
                [(Some(o0), Some(w0)), (Some(o1), Some(w1))] if o1 > o0 && w0 > w1 => Some(((*o0, *o1), (*w0, *w1))),
                _ => None,
            })
        })
        .await?;
        println!("own work per step {own:?} ms, wait per step {wait:?} ms");
        // Each rank's phase shares are charted over time (kept in the history as job.*@job:<pid>).
        for r in ["0", "1"] {
            let lines =
                format!("{card} .rank-phases[data-rank='{r}'] figure[data-chart='Phase shares'] svg.chart path.line");
            eventually("a rank's phase shares drawn over time", WAIT, || draws_a_line(&client, &lines)).await?;
        }
        // A range of the history: the same chart from the daemon's job.*@job:<pid> series.
        let bands = format!("{card} .rank-phases[data-rank='0'] svg.chart path.band");
        draws_history_bands(&client, "a rank's phase shares from the history", &bands).await?;
        // The job's name links to it: the address holds the job, which is marked, and opening
        // that address again marks it again.
        client.find(Locator::Css(&format!("{card} a.job-link"))).await?.click().await?;
        let address = eventually("the address holds the job", WAIT, || async {
            let url = client.current_url().await?;
            Ok(url.query_pairs().any(|(k, v)| k == "job" && v == run.as_str()).then_some(url))
        })
        .await?;
        client.goto(address.as_str()).await?;
        eventually("the job is marked", WAIT, || async {
            Ok(client.find(Locator::Css(&format!("{card}.selected"))).await.ok())
        })
        .await?;
        anyhow::Ok(())
    }
    .await;
    close(client, outcome.is_err(), "jobs-failure").await;
    drop((rank0, rank1));
    outcome
}

#[tokio::test]
async fn an_alert_silenced_from_its_row_shows_silenced_leaves_the_badge_and_comes_back_when_expired() -> Result<()> {
    let daemon = Daemon::start(DaemonOptions {
        token: None,
        config: format!("[scheduler]\nenabled = false\n[incidents]\nbefore_s = 5\nafter_s = 2\n{CRITICAL_RULE}"),
        ..DaemonOptions::default()
    })?;
    let driver = Driver::start()?;
    let profile = Scratch::new("chromium-profile");
    let downloads = Scratch::new("downloads");
    let client = browser(&driver, &profile.0, &downloads.0).await?;
    let outcome = async {
        const WAIT: Duration = Duration::from_secs(30);
        client.goto(&daemon.console_url).await?;
        eventually("critical badge", WAIT, || async { text_of(&client, "#critical-badge").await }).await?;
        let button = eventually("a Silence 1 h button", WAIT, || async {
            Ok(client.find(Locator::Css("button.silence[data-silence='1h']")).await.ok())
        })
        .await?;
        let row =
            eventually("the alert's row", WAIT, || async { Ok(client.find(Locator::Css("li.alert")).await.ok()) })
                .await?;
        let id = row.attr("data-alert-id").await?.context("alert id")?;
        button.click().await?;
        let silenced = format!("li[data-alert-id='{id}'] [data-silenced='true']");
        let said = eventually("silenced", WAIT, || async { text_of(&client, &silenced).await }).await?;
        assert!(said.contains("Silenced by") && said.contains("until"), "{said}");
        eventually("badge gone", WAIT, || async {
            Ok(client.find(Locator::Css("#critical-badge")).await.is_err().then_some(()))
        })
        .await?;
        // Listed with what it silences; the API agrees.
        let listed =
            eventually("the silence listed", WAIT, || async { text_of(&client, "#silence-list").await }).await?;
        assert!(listed.contains(&format!("alert_id={id}")) && listed.contains("silences 1 active alert"), "{listed}");
        let api = daemon.get_json("/api/silences").await?;
        assert_eq!(api[0]["matchers"][0]["value"], id.as_str(), "{api}");
        assert!(api[0]["comment"].as_str().is_some_and(|c| c.contains("1 h")), "{api}");
        // Expired from the list: the alert counts again.
        client.find(Locator::Css("button.expire-silence")).await?.click().await?;
        eventually("silenced no more", WAIT, || async {
            Ok(client.find(Locator::Css(&silenced)).await.is_err().then_some(()))
        })
        .await?;
        let badge = eventually("badge back", WAIT, || async { text_of(&client, "#critical-badge").await }).await?;
        assert_eq!(badge, "1 critical unacknowledged");

        // The critical alert's incident bundle, listed on its row once written; its trace
        // downloads as a Chrome trace event file.
        let kept = format!("li[data-alert-id='{id}'] .incident[data-recording='false']");
        let said =
            eventually("the incident bundle on the row", WAIT, || async { text_of(&client, &kept).await }).await?;
        assert!(said.contains("Incident bundle #") && said.contains("threads"), "{said}");
        let listed = text_of(&client, "#incident-list").await?.unwrap_or_default();
        assert!(listed.contains(&format!("of alert #{id} (critical)")), "every bundle listed: {listed}");
        client.find(Locator::Css(&format!("{kept} a.incident-trace"))).await?.click().await?;
        let file = eventually("the trace file is downloaded", WAIT, || async {
            let found = std::fs::read_dir(&downloads.0)?.flatten().map(|e| e.path()).find(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                name.starts_with("ringside-incident-trace-") && name.ends_with(".json")
            });
            Ok(found)
        })
        .await?;
        let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(&file)?)?;
        assert_eq!(trace["otherData"]["alert_id"].to_string(), id, "{}", trace["otherData"]);
        let events = trace["traceEvents"].as_array().context("traceEvents")?;
        assert!(events.iter().any(|e| e["ph"] == "i" && e["cat"] == "alert"), "the alert as an instant event");
        anyhow::Ok(())
    }
    .await;
    close(client, outcome.is_err(), "silence-failure").await;
    outcome
}

#[tokio::test]
async fn the_console_says_so_when_its_second_module_does_not_arrive_and_fetches_it_again() -> Result<()> {
    // The scheduler, GPU and ring kernel panels come in a WebAssembly module of their own
    // (frontend/src/app.rs). Blocked, the console must say so in their place and stay live,
    // neither waiting for ever nor aborting; its "Try again" then fetches the module anew.
    let daemon = Daemon::start(DaemonOptions { token: None, ..DaemonOptions::default() })?;
    let driver = Driver::start()?;
    let (profile, downloads) = (Scratch::new("chromium-blocked-module"), Scratch::new("downloads-blocked-module"));
    let client = browser(&driver, &profile.0, &downloads.0).await?;
    let outcome = async {
        const WAIT: Duration = Duration::from_secs(30);
        // Signed in (the cookie), then every file fetched from the daemon, the second module refused.
        client.goto(&daemon.console_url).await?;
        client.issue_cmd(Cdp { cmd: "Network.enable", params: serde_json::json!({}) }).await?;
        client
            .issue_cmd(Cdp { cmd: "Network.setCacheDisabled", params: serde_json::json!({"cacheDisabled": true}) })
            .await?;
        let block =
            |urls: Vec<&str>| Cdp { cmd: "Network.setBlockedURLs", params: serde_json::json!({ "urls": urls }) };
        client.issue_cmd(block(vec!["*/pkg/split_below.*"])).await?;
        client.goto(&format!("{}/", daemon.base)).await?;
        let said =
            eventually("the panels' failure said", WAIT, || async { text_of(&client, "#below-failed").await }).await?;
        assert!(said.contains("did not load"), "{said}");
        eventually("Live", WAIT, || async {
            Ok(text_of(&client, "#connection").await?.filter(|t| t.contains("Live")))
        })
        .await?;
        eventually("the CPU chart draws a line", WAIT, || draws_a_line(&client, "#host-panel svg.chart path.line"))
            .await?;
        assert!(client.find(Locator::Css("#gpus-panel")).await.is_err(), "no GPUs panel without its module");

        client.issue_cmd(block(vec![])).await?;
        client.find(Locator::Css("#below-failed button")).await?.click().await?;
        for panel in ["#scheduler-panel", "#gpus-panel", "#kernels-panel"] {
            eventually(panel, WAIT, || async { Ok(client.find(Locator::Css(panel)).await.ok().map(|_| ())) }).await?;
        }
        assert!(client.find(Locator::Css("#below-failed")).await.is_err(), "the failure is no longer said");
        Ok::<_, anyhow::Error>(())
    }
    .await;
    close(client, outcome.is_err(), "blocked-module-failure").await;
    outcome
}
