//! `cargo xtask fuzz [SECONDS]`: every libFuzzer target of `fuzz/` (cargo-fuzz, on the pinned
//! nightly) for a bounded time each, 60 s unless said, as many at once as there are cores.
//!
//! Each target starts from its seeds (`fuzz/seeds/<target>/`, inputs crashes were once found
//! with are kept there as regression inputs) and the corpus it grew in earlier runs
//! (`target/fuzz-corpus/<target>/`). Builds are optimised with debug assertions and overflow
//! checks on, without a sanitizer: the parsers are safe Rust, where a panic, an overflow or an
//! input that takes longer than 10 s (`-timeout`) is the failure looked for. A crash fails the
//! command and names the input libFuzzer wrote (`fuzz/artifacts/<target>/`).

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::{step, NIGHTLY};

/// The targets, as `fuzz/Cargo.toml` names them.
pub const TARGETS: [&str; 7] =
    ["ws_command", "config", "token_file", "rules", "elf_symbols", "history_file", "console_decode"];

/// The cargo-fuzz release installed when missing.
const CARGO_FUZZ: &str = "0.13.2";

/// What one target did.
struct Run {
    target: &'static str,
    runs: u64,
    seconds: u64,
    corpus: usize,
}

/// Installs cargo-fuzz if missing (the nightly comes with setup's).
pub fn install() -> Result<()> {
    if !crate::succeeds("cargo", &["fuzz", "--version"]) {
        let args = ["install", "cargo-fuzz", "--locked", "--version", CARGO_FUZZ];
        step(&format!("cargo {}", args.join(" ")));
        let status = Command::new("cargo").args(args).status().context("cannot run cargo install")?;
        if !status.success() {
            bail!("`cargo {}` failed; run it by hand and retry", args.join(" "));
        }
    }
    Ok(())
}

fn nightly_cargo(root: &Path) -> Command {
    let mut command = Command::new("rustup");
    command
        .current_dir(root)
        .args(["run", NIGHTLY, "cargo"])
        // The outer (stable) cargo would otherwise build the targets.
        .env_remove("CARGO")
        .env_remove("RUSTC");
    command
}

pub fn run(root: &Path, seconds: u64) -> Result<()> {
    install()?;
    let common = ["--sanitizer", "none", "--target-dir", "target/fuzz"];
    step("cargo fuzz build (optimised, debug assertions on)");
    let status = nightly_cargo(root).args(["fuzz", "build"]).args(common).status().context("cannot run cargo fuzz")?;
    if !status.success() {
        bail!("building the fuzz targets failed ({status})");
    }
    let logs = root.join("target/fuzz-logs");
    std::fs::create_dir_all(&logs)?;
    let mut done = Vec::new();
    let mut failed = Vec::new();
    // A libFuzzer process fuzzes on one core: as many targets at once as there are cores, each
    // for its full time.
    let at_once = std::thread::available_parallelism().map_or(1, |n| n.get()).min(TARGETS.len());
    for batch in TARGETS.chunks(at_once) {
        let mut running = Vec::new();
        for &target in batch {
            let corpus = root.join("target/fuzz-corpus").join(target);
            std::fs::create_dir_all(&corpus)?;
            step(&format!("fuzzing {target} for {seconds} s"));
            let log = logs.join(format!("{target}.log"));
            let child = nightly_cargo(root)
                .args(["fuzz", "run", target])
                .args(common)
                .arg(&corpus)
                .arg(root.join("fuzz/seeds").join(target))
                .arg("--")
                .args([format!("-max_total_time={seconds}"), "-timeout=10".into(), "-rss_limit_mb=2048".into()])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log)?)
                .spawn();
            match child {
                Ok(child) => running.push((target, corpus, log, child)),
                Err(e) => failed.push(format!("{target} (cannot run cargo fuzz: {e})")),
            }
        }
        for (target, corpus, log, mut child) in running {
            // Every child is waited for, whatever the others did.
            let status = match child.wait() {
                Ok(status) => status,
                Err(e) => {
                    failed.push(format!("{target} (cannot wait for cargo fuzz: {e})"));
                    continue;
                }
            };
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if !status.success() {
                let tail: Vec<&str> = text.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect();
                eprintln!("{}", tail.join("\n"));
                failed.push(format!("{target} ({status}; its log: {})", log.display()));
                continue;
            }
            match done_line(&text) {
                Some((runs, seconds)) => {
                    let corpus = std::fs::read_dir(&corpus).map(|d| d.count()).unwrap_or(0);
                    done.push(Run { target, runs, seconds, corpus });
                }
                None => failed.push(format!("{target} (no \"Done\" line in {})", log.display())),
            }
        }
    }
    println!("\n{:<12} {:>12} {:>8} {:>12} {:>8}", "target", "executions", "seconds", "per second", "corpus");
    for r in &done {
        println!("{:<12} {:>12} {:>8} {:>12} {:>8}", r.target, r.runs, r.seconds, r.runs / r.seconds.max(1), r.corpus);
    }
    if !failed.is_empty() {
        bail!("fuzzing found a failure in {}", failed.join(", "));
    }
    Ok(())
}

/// libFuzzer's last words: `Done 4428361 runs in 11 second(s)`.
fn done_line(log: &str) -> Option<(u64, u64)> {
    let line = log.lines().rev().find(|l| l.starts_with("Done "))?;
    let mut words = line.split_whitespace();
    let runs = words.nth(1)?.parse().ok()?;
    let seconds = words.nth(2)?.parse().ok()?;
    Some((runs, seconds))
}

#[cfg(test)]
mod tests {
    #[test]
    fn done_lines() {
        let log = "#1024 pulse\nDone 4428361 runs in 11 second(s)\nstat::x 1\n";
        assert_eq!(super::done_line(log), Some((4428361, 11)));
        assert_eq!(super::done_line("INFO: nothing\n"), None);
    }
}
