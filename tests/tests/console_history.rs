//! The console's time in a real headless Chromium against the real daemon: the range picker
//! and a drag on a chart ask the daemon's history for another range, every chart draws the
//! crosshair at the same moment, the address holds the view (a fresh browser opened on it shows
//! the same range, panel and theme; back and forward move between views), Live comes back in
//! one click, and the range exports as JSON and as a Chrome trace. Over a slow link the page's
//! shell shows the host's live figures before the WebAssembly runs.

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use fantoccini::actions::{InputSource, MouseActions, PointerAction, MOUSE_BUTTON_LEFT};
use fantoccini::{Client, Locator};
use ringside_tests::browser::{artifacts, browser, close, eventually, text_of, Cdp, Driver};
use ringside_tests::{Daemon, DaemonOptions, Scratch};

const WAIT: Duration = Duration::from_secs(30);
/// A chart of the host panel, where the host's history is drawn.
const CPU_CHART: &str = "#host-panel figure[data-chart='CPU utilisation'] svg.chart";

/// `(from, to)` of the address, if it holds a range.
async fn address_range(client: &Client) -> Result<Option<(u64, u64)>> {
    let url = client.current_url().await?;
    let get = |name: &str| url.query_pairs().find(|(k, _)| k == name).and_then(|(_, v)| v.parse::<u64>().ok());
    Ok(get("from").zip(get("to")))
}

async fn attribute(client: &Client, css: &str, name: &str) -> Result<Option<String>> {
    Ok(client.find(Locator::Css(css)).await?.attr(name).await?)
}

async fn history_flow(
    client: &Client,
    daemon: &Daemon,
    downloads: &Path,
    profile2: &Path,
    driver: &Driver,
) -> Result<()> {
    client.goto(&daemon.console_url).await?;
    eventually("the console is live", WAIT, || async {
        Ok(text_of(client, "#connection").await?.filter(|t| t.contains("Live")))
    })
    .await?;
    ensure!(address_range(client).await?.is_none(), "live has no range in the address");

    // Over a slow link (cache off, DevTools throttling as `cargo xtask bench console`): the page
    // paints its shell, and boot.js shows the host's figures there from `/api/host` while the
    // module is still on its way; then the console replaces the shell.
    let cdp = |cmd, params| client.issue_cmd(Cdp { cmd, params });
    cdp("Network.enable", serde_json::json!({})).await?;
    cdp("Network.setCacheDisabled", serde_json::json!({"cacheDisabled": true})).await?;
    let slow = serde_json::json!({"offline": false, "latency": 40, "downloadThroughput": 1_500_000 / 8, "uploadThroughput": 750_000 / 8});
    cdp("Network.emulateNetworkConditions", slow).await?;
    client.goto(&format!("{}/", daemon.base)).await?;
    let early = eventually("the shell shows the host's CPU before the console runs", WAIT, || async {
        Ok(text_of(client, "#shell-cpu").await?.filter(|t| t.ends_with('%')))
    })
    .await?;
    eventually("the console is live", WAIT, || async {
        Ok(text_of(client, "#connection").await?.filter(|t| t.contains("Live")))
    })
    .await?;
    ensure!(client.find_all(Locator::Css("#shell")).await?.is_empty(), "the console replaced the shell");
    let marks = eventually("the console's own mark", WAIT, || async {
        let marks = client
            .execute(
                "const at = (n) => performance.getEntriesByName(n).map((m) => m.startTime); \
                 return [at('ringside-live'), at('ringside-console')];",
                vec![],
            )
            .await?;
        Ok(Some(marks).filter(|m| m[1].as_array().is_some_and(|a| !a.is_empty())))
    })
    .await?;
    let marks: Vec<Vec<f64>> = serde_json::from_value(marks)?;
    ensure!(
        marks[0].len() == 2 && marks[1].len() == 1 && marks[0][0] < marks[1][0],
        "the shell's live mark, then the console's: {marks:?}"
    );
    let cpu = text_of(client, "#host-panel .stat-value").await?.unwrap_or_default();
    ensure!(cpu.ends_with('%'), "the console shows the host's CPU: {cpu:?}");
    println!("slow link: the shell showed {early} at {:.0} ms, the console at {:.0} ms", marks[0][0], marks[1][0]);
    cdp(
        "Network.emulateNetworkConditions",
        serde_json::json!({"offline": false, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}),
    )
    .await?;

    // A preset: the charts are drawn from the daemon's history, as bands of min..max.
    client.find(Locator::XPath("//nav[@id='rangebar']//button[text()='15 min']")).await?.click().await?;
    let (from, to) = eventually("the address holds the range", WAIT, || address_range(client)).await?;
    ensure!(to - from == 900_000, "15 minutes: {from}..{to}");
    eventually("the CPU chart draws its history", WAIT, || async {
        let bands = client.find_all(Locator::Css(&format!("{CPU_CHART} path.band"))).await?;
        let mut drawn = false;
        for b in bands {
            drawn |= b.attr("d").await?.is_some_and(|d| d.matches('L').count() >= 4);
        }
        Ok(drawn.then_some(()))
    })
    .await?;
    let fifteen = text_of(client, "#range-text").await?.unwrap_or_default();
    std::fs::write(artifacts().join("console-history.png"), client.screenshot().await?)?;

    // The crosshair: the pointer over one chart puts it on every chart of the range.
    let cpu = client.find(Locator::Css(CPU_CHART)).await?;
    let hover = MouseActions::new("mouse".into()).then(PointerAction::MoveToElement {
        element: cpu.clone(),
        duration: None,
        x: 100.0,
        y: 0.0,
    });
    client.perform_actions(hover).await?;
    let charts = client.find_all(Locator::Css("svg.chart")).await?.len();
    ensure!(charts >= 4, "the host's three charts and the canary's: {charts}");
    let crosshairs = eventually("a crosshair on every chart", WAIT, || async {
        let n = client.find_all(Locator::Css("svg.chart line.crosshair")).await?.len();
        Ok((n == charts).then_some(n))
    })
    .await;
    crosshairs.with_context(|| format!("{charts} charts"))?;

    // Drag on a chart: zoomed in to what was dragged over, and that is a new range asked of
    // the daemon.
    let drag = MouseActions::new("mouse".into())
        .then(PointerAction::MoveToElement { element: cpu.clone(), duration: None, x: -100.0, y: 0.0 })
        .then(PointerAction::Down { button: MOUSE_BUTTON_LEFT })
        .then(PointerAction::MoveToElement {
            element: cpu.clone(),
            duration: Some(Duration::from_millis(200)),
            x: 50.0,
            y: 0.0,
        })
        .then(PointerAction::Up { button: MOUSE_BUTTON_LEFT });
    client.perform_actions(drag).await?;
    let (zoom_from, zoom_to) = eventually("the drag zoomed in", WAIT, || async {
        Ok(address_range(client).await?.filter(|(f, t)| t - f < 900_000))
    })
    .await?;
    ensure!(zoom_from >= from && zoom_to <= to + 1000, "the zoom is inside the range: {zoom_from}..{zoom_to}");
    // The picker and the zoom each asked the daemon's history for their range.
    let asked = |from: u64, to: u64| async move {
        let script =
            "return performance.getEntriesByType('resource').map(e => e.name).filter(n => n.includes('/api/history?'))";
        let names: Vec<String> = serde_json::from_value(client.execute(script, vec![]).await?)?;
        let wanted = format!("from={from}&to={to}");
        Ok::<_, anyhow::Error>(
            names.iter().any(|n| n.contains("host.cpu_utilization_pct%40host") && n.contains(&wanted)),
        )
    };
    ensure!(asked(from, to).await?, "the 15 minutes were asked of /api/history");
    eventually("the zoom was asked of /api/history", WAIT, || async {
        Ok(asked(zoom_from, zoom_to).await?.then_some(()))
    })
    .await?;
    let zoomed_text = text_of(client, "#range-text").await?.unwrap_or_default();
    ensure!(zoomed_text != fifteen, "{zoomed_text}");

    // A panel and a theme are in the address too.
    client.find(Locator::Css(".panel-links a[href='#gpus-panel']")).await?.click().await?;
    client.find(Locator::Css("#theme-toggle")).await?.click().await?;
    let permalink = eventually("the address holds the panel and theme", WAIT, || async {
        let url = client.current_url().await?;
        Ok((url.as_str().contains("panel=gpus") && url.as_str().contains("theme=dark")).then_some(url))
    })
    .await?;

    // The permalink in a fresh browser: the same range, panel and theme.
    let fresh = browser(driver, profile2, downloads).await?;
    let reopened = async {
        fresh.goto(&daemon.console_url).await?;
        eventually("the fresh browser is signed in", WAIT, || async {
            Ok(text_of(&fresh, "#connection").await?.filter(|t| t.contains("Live")))
        })
        .await?;
        // Over a link slow enough that the second module comes after the page's first scroll.
        fresh.issue_cmd(Cdp { cmd: "Network.enable", params: serde_json::json!({}) }).await?;
        let slow =
            serde_json::json!({"offline": false, "latency": 400, "downloadThroughput": -1, "uploadThroughput": -1});
        fresh.issue_cmd(Cdp { cmd: "Network.emulateNetworkConditions", params: slow }).await?;
        fresh.goto(permalink.as_str()).await?;
        eventually("the permalink shows the same range", WAIT, || async {
            Ok(text_of(&fresh, "#range-text").await?.filter(|t| *t == zoomed_text))
        })
        .await?;
        let theme = attribute(&fresh, "html", "data-theme").await?;
        ensure!(theme.as_deref() == Some("dark"), "{theme:?}");
        ensure!(address_range(&fresh).await? == Some((zoom_from, zoom_to)));
        let pressed = attribute(&fresh, "#range-live", "aria-pressed").await?;
        ensure!(pressed.as_deref() == Some("false"), "{pressed:?}");
        // The GPUs panel comes with the console's second module, after the page has loaded:
        // the view is scrolled to it once it is there.
        eventually("the permalink scrolls to the GPUs panel", WAIT, || async {
            let script = "const p = document.getElementById('gpus-panel'); if (!p) return false; \
                          const r = p.getBoundingClientRect(); \
                          return window.scrollY > 0 && r.top < window.innerHeight / 2 && r.bottom > 0;";
            Ok(fresh.execute(script, vec![]).await?.as_bool().filter(|shown| *shown))
        })
        .await?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    close(fresh, reopened.is_err(), "console-permalink-failure").await;
    reopened?;

    // Back goes to the view before (the 15 minutes, before the zoom), forward comes back.
    client.back().await?; // the theme
    client.back().await?; // the panel
    client.back().await?; // the zoom
    eventually("back shows the 15 minutes again", WAIT, || async {
        Ok((address_range(client).await? == Some((from, to))).then_some(()))
    })
    .await?;

    // Export of the range shown (the 15 minutes, which hold the daemon's first seconds): JSON
    // and a trace, downloaded by the browser.
    for (link, prefix) in [("#export-json", "ringside-history-"), ("#export-trace", "ringside-history-trace-")] {
        client.find(Locator::Css(link)).await?.click().await?;
        let file = eventually("the export is downloaded", WAIT, || async {
            let found = std::fs::read_dir(downloads)?.flatten().map(|e| e.path()).find(|p| {
                let name = p.file_name().unwrap_or_default().to_string_lossy();
                let other = prefix == "ringside-history-" && name.starts_with("ringside-history-trace-");
                name.starts_with(prefix) && name.ends_with(".json") && !other
            });
            Ok(found)
        })
        .await?;
        let text = std::fs::read_to_string(&file)?;
        if prefix == "ringside-history-" {
            let export: ringside_shared::HistoryExport = serde_json::from_str(&text).context("export JSON")?;
            ensure!(export.history.from_ms == from && export.history.to_ms == to);
            let cpu = export.history.series.iter().find(|s| s.key == "host.cpu_utilization_pct@host");
            ensure!(cpu.is_some_and(|s| s.mean.iter().flatten().count() >= 3), "the CPU's seconds are exported");
        } else {
            let trace: serde_json::Value = serde_json::from_str(&text).context("trace JSON")?;
            let events = trace["traceEvents"].as_array().context("traceEvents")?;
            let cpu = events.iter().filter(|e| e["ph"] == "C" && e["name"] == "host.cpu_utilization_pct@host");
            ensure!(cpu.count() >= 3, "the CPU's counter events in the trace");
        }
    }
    client.forward().await?;
    eventually("forward shows the zoom again", WAIT, || async {
        Ok((address_range(client).await? == Some((zoom_from, zoom_to))).then_some(()))
    })
    .await?;

    // Live in one click: no range in the address, and the charts follow the ticks again.
    client.find(Locator::Css("#range-live")).await?.click().await?;
    eventually("back to live", WAIT, || async { Ok(address_range(client).await?.is_none().then_some(())) }).await?;
    let live = text_of(client, "#range-text").await?.unwrap_or_default();
    ensure!(live.starts_with("Live"), "{live}");

    // A console opened now gets the last 30 points (7.5 s at 250 ms) with its snapshot, and its
    // live charts reach back further, to the daemon's start (over 13 s before), from the history.
    tokio::time::sleep(Duration::from_secs(3)).await;
    client.goto(&format!("{}/", daemon.base)).await?;
    let opened = ringside_tests::now_ms();
    let reach = eventually("the live CPU chart reaches back past the snapshot's points", WAIT, || async {
        let from = attribute(client, CPU_CHART, "data-from").await?.and_then(|f| f.parse::<u64>().ok());
        Ok(from.filter(|f| *f + 10_000 < opened))
    })
    .await?;
    println!("the live chart starts {} s before the console opened", (opened - reach) / 1000);
    Ok(())
}

#[tokio::test]
async fn the_console_picks_zooms_links_and_exports_ranges_of_the_history() -> Result<()> {
    let data = Scratch::new("console-history");
    let daemon = Daemon::start(DaemonOptions {
        token: None,
        interval_ms: 250,
        config: "[scheduler]\nenabled = false\n\n[history]\nflush_interval_s = 2\n".into(),
        data_dir: Some(data.0.clone()),
        ..DaemonOptions::default()
    })?;
    // Some history to look at.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let driver = Driver::start()?;
    let (profile, profile2, downloads) =
        (Scratch::new("chromium-history"), Scratch::new("chromium-history-2"), Scratch::new("downloads-history"));
    let client = browser(&driver, &profile.0, &downloads.0).await?;
    let outcome = history_flow(&client, &daemon, &downloads.0, &profile2.0, &driver).await;
    close(client, outcome.is_err(), "console-history-failure").await;
    outcome
}
