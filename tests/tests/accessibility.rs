//! The console for people who do not use a mouse or a screen: axe-core (npm, installed by
//! `cargo xtask setup --test`) runs on every panel in both themes with eight GPUs (one opened),
//! an alert and two ring kernels, and finds no serious or critical violation; and the Tab key
//! reaches every kind of action (ranges, export, theme, GPU details, acknowledge), which Enter
//! then carries out.

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use fantoccini::{Client, Locator};
use ringside_tests::browser::{browser, close, eventually, text_of, Driver};
use ringside_tests::{workspace_root, Daemon, DaemonOptions, Scratch, LOW_MEMORY_THRESHOLDS};

const WAIT: Duration = Duration::from_secs(30);
const PANELS: [&str; 8] = [
    "header",
    "#rangebar",
    "#host-panel",
    "#alerts-panel",
    "#scheduler-panel",
    "#gpus-panel",
    "#kernels-panel",
    "#components-panel",
];
const TAB: &str = "\u{E004}";
const ENTER: &str = "\u{E007}";

/// axe-core's violations on `panel`, as `(rule, impact, nodes, help, first targets)`.
async fn violations(client: &Client, panel: &str) -> Result<Vec<serde_json::Value>> {
    let script = r#"
        const [selector, done] = arguments;
        axe.run(document.querySelector(selector), { resultTypes: ["violations"] })
            .then(r => done(r.violations.map(v => ({ id: v.id, impact: v.impact, nodes: v.nodes.length,
                help: v.help, targets: v.nodes.slice(0, 3).map(n => n.target.join(" ")) }))))
            .catch(e => done({ error: String(e) }));
    "#;
    let answer = client.execute_async(script, vec![serde_json::json!(panel)]).await?;
    if let Some(error) = answer.get("error") {
        bail!("axe on {panel}: {error}");
    }
    Ok(answer.as_array().cloned().unwrap_or_default())
}

async fn audit(client: &Client, daemon: &Daemon, axe: &str) -> Result<()> {
    let mut serious = Vec::new();
    for theme in ["light", "dark"] {
        // The view as a link gives it: GPU 0 open, the theme set.
        client.goto(&format!("{}/?panel=gpus&gpu=0&theme={theme}", daemon.base)).await?;
        eventually("the console is live", WAIT, || async {
            Ok(text_of(client, "#connection").await?.filter(|t| t.contains("Live")))
        })
        .await?;
        eventually("GPU 0's card and the alert", WAIT, || async {
            let card = client.find(Locator::Css("#gpus-panel .gpu-card[data-gpu-index='0']")).await.is_ok();
            let alert = client.find(Locator::Css("#alerts-panel li[data-alert-id]")).await.is_ok();
            Ok((card && alert).then_some(()))
        })
        .await?;
        client.execute(&format!("{axe}\nreturn true;"), vec![]).await.context("inject axe-core")?;
        for panel in PANELS {
            let found = violations(client, panel).await?;
            let summary: Vec<String> =
                found.iter().map(|v| format!("{} ({}, {} nodes)", v["id"], v["impact"], v["nodes"])).collect();
            println!("{theme} {panel}: {}", if summary.is_empty() { "none".into() } else { summary.join(", ") });
            serious.extend(
                found
                    .into_iter()
                    .filter(|v| matches!(v["impact"].as_str(), Some("serious" | "critical")))
                    .map(|v| format!("{theme} {panel}: {v}")),
            );
        }
    }
    ensure!(serious.is_empty(), "serious or critical violations:\n{}", serious.join("\n"));
    Ok(())
}

/// Presses Tab up to `limit` times from the top of the page; what got the focus, in order, as
/// `id` or `class` and text.
async fn tab_through(client: &Client, limit: usize) -> Result<Vec<String>> {
    client
        .execute("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0); return true;", vec![])
        .await?;
    let mut seen = Vec::new();
    for _ in 0..limit {
        client.active_element().await?.send_keys(TAB).await?;
        seen.push(focused(client).await?);
    }
    Ok(seen)
}

/// Presses Tab from the top of the page until the focused element's description holds `what`.
async fn tab_to(client: &Client, what: &str, limit: usize) -> Result<()> {
    client
        .execute("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0); return true;", vec![])
        .await?;
    for _ in 0..limit {
        client.active_element().await?.send_keys(TAB).await?;
        if focused(client).await?.contains(what) {
            return Ok(());
        }
    }
    bail!("Tab never reached {what}")
}

async fn focused(client: &Client) -> Result<String> {
    let script = "const e = document.activeElement; return e ? `${e.tagName.toLowerCase()}#${e.id}.${e.className}|${(e.textContent || '').trim().slice(0, 30)}` : ''";
    Ok(client.execute(script, vec![]).await?.as_str().unwrap_or_default().to_string())
}

async fn keyboard(client: &Client, daemon: &Daemon) -> Result<()> {
    client.goto(&format!("{}/?theme=light", daemon.base)).await?;
    eventually("the console is live", WAIT, || async {
        Ok(text_of(client, "#connection").await?.filter(|t| t.contains("Live")))
    })
    .await?;
    eventually("the GPU rows", WAIT, || async {
        Ok((client.find_all(Locator::Css("tr.gpu-row")).await?.len() == 8).then_some(()))
    })
    .await?;
    let seen = tab_through(client, 160).await?;
    // (Earlier and Later are disabled while live: not a stop.)
    for wanted in [
        "#range-live",
        "range-preset",
        "#range-zoom-out",
        "#range-apply",
        "#export-json",
        "#theme-toggle",
        "gpu-details-toggle",
        "Acknowledge",
    ] {
        ensure!(seen.iter().any(|s| s.contains(wanted)), "Tab never reached {wanted}: {seen:?}");
    }
    // Enter on a GPU's Details opens its card; on a preset, shows that range.
    tab_to(client, "gpu-details-toggle", 200).await?;
    client.active_element().await?.send_keys(ENTER).await?;
    eventually("Enter opened a GPU's card", WAIT, || async {
        Ok(client.find(Locator::Css("#gpus-panel .gpu-card")).await.ok())
    })
    .await?;
    tab_to(client, "range-preset|1 h", 200).await?;
    client.active_element().await?.send_keys(ENTER).await?;
    eventually("Enter showed the last hour", WAIT, || async {
        Ok(client.current_url().await?.as_str().contains("from=").then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn every_panel_passes_axe_in_both_themes_and_every_action_is_reachable_by_keyboard() -> Result<()> {
    let axe_file = workspace_root().join("target/tools/axe/node_modules/axe-core/axe.min.js");
    let axe = std::fs::read_to_string(&axe_file)
        .with_context(|| format!("{}: `cargo xtask setup --test` installs axe-core", axe_file.display()))?;
    let nvml = Scratch::new("nvml-a11y");
    let control = nvml.0.join("nvml-double.conf");
    std::fs::write(&control, "gpus 8\ngpu 0 util 97 60\ngpu 2 throttle 0x40\ngpu 2 temperature 86 90\ngpu 3 xid 79\n")?;
    let daemon = Daemon::start(DaemonOptions {
        token: None,
        interval_ms: 500,
        config: format!(
            "{LOW_MEMORY_THRESHOLDS}\n[[kernels]]\nid = \"canary\"\nkernel = \"echo\"\n\n[[kernels]]\nid = \"cpu-stats\"\nkernel = \"stats\"\ninput = \"cpu_utilization\"\n"
        ),
        env: ringside_tests::nvml_double(&control),
        ..DaemonOptions::default()
    })?;
    let driver = Driver::start()?;
    let (profile, downloads) = (Scratch::new("chromium-a11y"), Scratch::new("downloads-a11y"));
    let client = browser(&driver, &profile.0, &downloads.0).await?;
    let outcome = async {
        client.goto(&daemon.console_url).await?;
        audit(&client, &daemon, &axe).await?;
        keyboard(&client, &daemon).await
    }
    .await;
    close(client, outcome.is_err(), "accessibility-failure").await;
    outcome
}
