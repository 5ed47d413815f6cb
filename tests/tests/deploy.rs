//! The fleet files in `deploy/`: Prometheus rules that load, pass their unit tests
//! (`promtool test rules`), and only name metrics `ringsided` exports.

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
    let exporter = std::fs::read_to_string(workspace_root().join("daemon/src/prometheus.rs"))?;
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
