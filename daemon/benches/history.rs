//! What the history costs: `cargo xtask bench history`.
//!
//! A node with 8 GPUs, 4 ring kernels and 16 jobs, every one of its series changing every
//! second (the worst case for the compression: a real node's idle GPUs and steady jobs cost
//! far less). Its series are every rule metric of every source, named as the daemon names them
//! (from `metrics::ALL`), and the kernels' latency quantiles. Seven days of one value a second
//! go through the real `History` (store, blocks, writer thread, files); then it reports the
//! memory the chunks hold, the directory's bytes, what one tick costs the collection loop, the
//! time queries take, and the time reading it all back at start takes.

use std::collections::BTreeMap;
use std::time::Instant;

use ringside_daemon::history::{History, HistoryConfig, Query};
use ringside_daemon::metrics::RuleMetric;

const GPUS: u32 = 8;
const KERNELS: u32 = 4;
const JOBS: u32 = 16;
const T0: u64 = 1_796_083_200_000;
const DAY_S: u64 = 86_400;

/// Every series such a node has, with the kind of signal it carries.
fn series() -> Vec<(String, Signal)> {
    let mut out = Vec::new();
    for name in RuleMetric::names() {
        let sources: Vec<String> = match name.split('.').next() {
            Some("gpu") => (0..GPUS).map(|g| format!("gpu:{g}")).collect(),
            Some("kernel") => (0..KERNELS).map(|k| format!("kernel:k{k}")).collect(),
            Some("job") if name.starts_with("job.gpu_idle") => {
                (0..JOBS).map(|j| format!("job:{}/gpu:{}", 1000 + j, j % GPUS)).collect()
            }
            Some("job") => (0..JOBS).map(|j| format!("job:{}", 1000 + j)).collect(),
            Some("host") => vec!["host".into()],
            _ => vec!["scheduler".into()],
        };
        for source in sources {
            out.push((format!("{name}@{source}"), Signal::of(name)));
        }
    }
    for k in 0..KERNELS {
        for q in ["kernel.latency_p50_ns", "kernel.latency_p99_ns"] {
            out.push((format!("{q}@kernel:k{k}"), Signal::Scale(2.0e4)));
        }
    }
    out
}

#[derive(Clone, Copy)]
enum Signal {
    /// A percentage wandering with noise.
    Percent,
    /// A quantity around this scale, with noise of a percent.
    Scale(f64),
    /// Whole numbers that move now and then (temperatures, task counts).
    Steps(f64),
}

impl Signal {
    fn of(name: &str) -> Signal {
        if name.ends_with("_pct") {
            Signal::Percent
        } else if name.contains("temperature") || name.ends_with("ml_tasks") || name.contains("procs") {
            Signal::Steps(60.0)
        } else if name.contains("power") {
            Signal::Scale(450.0)
        } else if name.contains("throughput") {
            Signal::Scale(1.5e6)
        } else {
            Signal::Scale(1.0)
        }
    }

    fn value(self, t: u64, i: usize, rng: &mut u64) -> f64 {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        let noise = (*rng % 10_000) as f64 / 10_000.0 - 0.5;
        let wave = ((t as f64 / 600.0) + i as f64).sin();
        match self {
            Signal::Percent => (50.0 + 30.0 * wave + 4.0 * noise).clamp(0.0, 100.0),
            Signal::Scale(s) => s * (1.0 + 0.2 * wave + 0.02 * noise),
            Signal::Steps(s) => (s + 10.0 * wave).round(),
        }
    }
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir).map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()).unwrap_or(0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ringside-bench-history-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = HistoryConfig { max_disk_bytes: 4 << 30, max_memory_bytes: 1 << 30, ..HistoryConfig::default() };
    let (history, _) = History::open(&config, &dir, T0).expect("history directory");
    let series = series();
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for (key, _) in &series {
        *kinds.entry(key.split('@').nth(1).unwrap().split(':').next().unwrap()).or_default() += 1;
    }
    println!("series: {} ({kinds:?}), {GPUS} GPUs, {KERNELS} kernels, {JOBS} jobs", series.len());

    let days = 7;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut tick_ns = Vec::new();
    let started = Instant::now();
    for s in 0..days * DAY_S {
        let t = T0 + s * 1000;
        let values: Vec<(&str, f64)> =
            series.iter().enumerate().map(|(i, (k, sig))| (k.as_str(), sig.value(s, i, &mut rng))).collect();
        let at = Instant::now();
        history.record_values(t, values);
        if s % 61 == 0 {
            tick_ns.push(at.elapsed().as_nanos() as f64);
        }
        if s % DAY_S == DAY_S - 1 {
            let (_, memory, _) = history.stats();
            println!(
                "  day {}: {:.1} MiB in memory ({:.0} s so far)",
                s / DAY_S + 1,
                memory as f64 / 1048576.0,
                started.elapsed().as_secs_f64()
            );
        }
    }
    let now = T0 + days * DAY_S * 1000;
    let (count, memory, dropped) = history.stats();
    println!(
        "after {days} days: {count} series, {:.1} MiB in memory (bound 64 MiB), dropped {dropped:?}",
        memory as f64 / 1048576.0
    );
    let per_point = memory as f64 * 8.0 / (series.len() as f64 * (DAY_S as f64 + 7.0 * 1440.0));
    println!("  {per_point:.1} bits a value (a day of seconds and a week of minutes, min/max/mean/count each)");
    println!("one tick ({} values) into the history: median {:.1} µs", series.len(), median(tick_ns.clone()) / 1000.0);

    // Queries: 20 series, as a console with every chart open would ask.
    let keys: Vec<String> = series.iter().step_by(series.len() / 20).take(20).map(|(k, _)| k.clone()).collect();
    for (label, range_ms, points) in [
        ("24 h, 600 points", DAY_S * 1000, 600),
        ("24 h, 4000 points (1 s data)", DAY_S * 1000, 4000),
        ("1 h, 3600 points", 3600 * 1000, 3600),
        ("7 days, 600 points", 7 * DAY_S * 1000, 600),
    ] {
        let q = Query { series: keys.clone(), from_ms: now - range_ms, to_ms: now, points };
        let mut times = Vec::new();
        for _ in 0..5 {
            let at = Instant::now();
            let answer = history.query(&q);
            times.push(at.elapsed().as_secs_f64() * 1000.0);
            assert!(answer.series.iter().all(|s| s.mean.iter().filter(|m| m.is_some()).count() * 10 > points * 9));
        }
        println!("query {label} for 20 series: median {:.1} ms (of 5)", median(times));
    }
    history.close();
    drop(history);
    println!("on disk: {:.1} MiB in {}", dir_bytes(&dir) as f64 / 1048576.0, dir.display());
    let at = Instant::now();
    let (again, notes) = History::open(&config, &dir, now).expect("reopen");
    println!(
        "read back at start: {:.0} ms, {} series, {} files set aside",
        at.elapsed().as_secs_f64() * 1000.0,
        again.stats().0,
        notes.len()
    );
    drop(again);
    let _ = std::fs::remove_dir_all(&dir);
}
