//! The console's load, cold, in headless Chromium: `cargo xtask bench console`.
//!
//! For each link, five cold loads of the signed-in console (cache disabled through DevTools):
//! the time to first contentful paint, to live data (the first host figures on screen, the
//! page's first `ringside-live` performance mark: the shell's, where boot.js showed them before
//! the WebAssembly ran), to the console running with them (its `ringside-console` mark) and to
//! the panels below the first screen drawn (scheduler, GPUs, ring kernels: a module of their
//! own, fetched once the first has arrived; the `ringside-panels` mark), from the start of
//! navigation. Links: loopback,
//! and a slow link to a remote node as DevTools throttles it (40 ms latency, 1.5 Mbit/s down,
//! 750 kbit/s up). Two daemons: one just started (a few points of history), and one with eight
//! GPUs (the NVML test double) that has filled the console's 600 points of live history (at
//! 100 ms ticks, in a minute), as a node that has run for ten minutes sends them.

use std::time::Duration;

use anyhow::{Context, Result};
use ringside_tests::browser::{browser, eventually, Cdp, Driver};
use ringside_tests::{Daemon, DaemonOptions, Scratch};

const LOADS: usize = 5;

/// (name, DevTools network conditions or none).
fn links() -> [(&'static str, Option<serde_json::Value>); 2] {
    [
        ("loopback", None),
        (
            "slow link (40 ms, 1.5 Mbit/s)",
            Some(serde_json::json!({
                "offline": false, "latency": 40, "downloadThroughput": 1_500_000 / 8, "uploadThroughput": 750_000 / 8,
            })),
        ),
    ]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The start time of the page's first performance entry named `name`, if there is one yet.
async fn mark(client: &fantoccini::Client, name: &str) -> Result<Option<f64>> {
    let script = "const m = performance.getEntriesByName(arguments[0]); return m.length ? m[0].startTime : null;";
    Ok(client.execute(script, vec![name.into()]).await?.as_f64())
}

/// One cold load: (first contentful paint, live data, console, panels), ms from the start of
/// navigation.
async fn load(
    driver: &Driver,
    daemon: &Daemon,
    conditions: &Option<serde_json::Value>,
) -> Result<(f64, f64, f64, f64)> {
    let (profile, downloads) = (Scratch::new("bench-console-profile"), Scratch::new("bench-console-downloads"));
    let client = browser(driver, &profile.0, &downloads.0).await?;
    let measured = async {
        // Signed in (the cookie), then every file fetched again from the daemon.
        client.goto(&daemon.console_url).await?;
        client.issue_cmd(Cdp { cmd: "Network.enable", params: serde_json::json!({}) }).await?;
        client
            .issue_cmd(Cdp { cmd: "Network.setCacheDisabled", params: serde_json::json!({"cacheDisabled": true}) })
            .await?;
        if let Some(conditions) = conditions {
            client.issue_cmd(Cdp { cmd: "Network.emulateNetworkConditions", params: conditions.clone() }).await?;
        }
        client.goto(&format!("{}/", daemon.base)).await?;
        let console =
            eventually("the console's mark", Duration::from_secs(30), || mark(&client, "ringside-console")).await?;
        let panels =
            eventually("the panels' mark", Duration::from_secs(30), || mark(&client, "ringside-panels")).await?;
        let live = mark(&client, "ringside-live").await?.context("no ringside-live mark")?;
        let paint = mark(&client, "first-contentful-paint").await?.context("no first-contentful-paint entry")?;
        Ok::<_, anyhow::Error>((paint, live, console, panels))
    }
    .await;
    let _ = client.close().await;
    measured
}

#[tokio::main]
async fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let nvml = Scratch::new("bench-console-nvml");
    let control = nvml.0.join("nvml-double.conf");
    std::fs::write(&control, "gpus 8\ngpu 0 util 97 60\n")?;
    let fresh = Daemon::start(DaemonOptions { token: None, interval_ms: 1000, ..DaemonOptions::default() })?;
    let full = Daemon::start(DaemonOptions {
        token: None,
        interval_ms: 100,
        env: ringside_tests::nvml_double(&control),
        ..DaemonOptions::default()
    })?;
    tokio::time::sleep(Duration::from_secs(65)).await;
    let daemon = &fresh;
    for module in ["/pkg/ringside_frontend_bg.wasm".to_string(), daemon.second_module().await?] {
        let wasm = daemon.http().get(format!("{}{module}", daemon.base)).bearer_auth(&daemon.token);
        for coding in ["identity", "gzip", "br"] {
            let bytes =
                wasm.try_clone().context("request")?.header("accept-encoding", coding).send().await?.bytes().await?;
            println!("{module} as served ({coding}): {} bytes", bytes.len());
        }
    }
    let driver = Driver::start()?;
    for (what, daemon) in [("just started", &fresh), ("8 GPUs, 600 points of history", &full)] {
        let snapshot =
            daemon.http().get(format!("{}/api/snapshot", daemon.base)).bearer_auth(&daemon.token).send().await?;
        let snapshot = snapshot.bytes().await?;
        println!("{what}: /api/snapshot is {} KiB of JSON (the WebSocket's first brings 30 of its chart points); {LOADS} cold loads per link, medians (ms from the start of navigation):", snapshot.len() / 1024);
        for (name, conditions) in links() {
            let (mut paints, mut lives, mut consoles, mut below) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..LOADS {
                let (paint, live, console, panels) = load(&driver, daemon, &conditions).await?;
                paints.push(paint);
                lives.push(live);
                consoles.push(console);
                below.push(panels);
            }
            let each = |v: &[f64]| v.iter().map(|x| x.round() as u64).collect::<Vec<_>>();
            println!(
                "  {name}: first paint {:.0} ms, live data {:.0} ms, console running {:.0} ms, panels below {:.0} ms (each: paint {:?}, live {:?}, console {:?}, panels {:?})",
                median(paints.clone()),
                median(lives.clone()),
                median(consoles.clone()),
                median(below.clone()),
                each(&paints),
                each(&lives),
                each(&consoles),
                each(&below)
            );
        }
    }
    Ok(())
}
