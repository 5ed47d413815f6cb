//! How well the fleet rules name a straggler: `cargo xtask bench stragglers` runs the release
//! `ringsided` (`RINGSIDED_BIN`) twice, as node-a and node-b (each watching its own cgroup), a
//! real Prometheus with the shipped rules, and, run after run, a four-rank job (`ddp-rank`,
//! ranks 0-1 on node-a, 2-3 on node-b) with one rank slowed:
//!
//! - a random rank, a random slowdown of its step (10-30%) and a random cause: slower data
//!   loading, a slower share of the "GPU" (longer kernels), or CPU contention (the rank pinned
//!   to a CPU beside a busy task of another tenant, of a higher priority chosen for the
//!   slowdown, so its optimizer step waits for the CPU; the slowdown that makes is measured);
//! - then balanced jobs, which must raise nothing in 40 s.
//!
//! For each run: whether `RingsideStraggler` named the right node and rank, with the right
//! cause (`data_loading`, `gpu_compute`, `waiting_for_cpu`), and how long after the ranks
//! started; the slowdown each rank's own log shows. `RINGSIDE_STRAGGLER_RUNS` (30) and
//! `RINGSIDE_BALANCED_RUNS` (10) set the counts, `RINGSIDE_BENCH_SEED` the random choices, and
//! `RINGSIDE_BENCH_CAUSE` (`data_loading`, `gpu_compute`, `waiting_for_cpu`) one cause for all.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ringside_tests::fleet::{Prometheus, Rank, TwoNodes};
use ringside_tests::{workspace_root, Reaped, Scratch};

/// Time to name, at most: the target is 30 s, runs get 60.
const LIMIT: Duration = Duration::from_secs(60);
const BALANCED_S: u64 = 40;

struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Cause {
    DataLoading,
    Gpu,
    Cpu,
}

impl Cause {
    fn expected(self) -> &'static str {
        match self {
            Cause::DataLoading => "data_loading",
            Cause::Gpu => "gpu_compute",
            Cause::Cpu => "waiting_for_cpu",
        }
    }
}

/// A step's parts, in ms: loading, "GPU", optimizer, all-reduce transfer.
#[derive(Clone, Copy)]
struct Step {
    load: u64,
    compute: u64,
    optimizer: u64,
    transfer: u64,
}

impl Step {
    fn args(self) -> Vec<String> {
        [
            ("--load-ms", self.load),
            ("--compute-ms", self.compute),
            ("--optimizer-ms", self.optimizer),
            ("--transfer-ms", self.transfer),
        ]
        .iter()
        .flat_map(|(k, v)| [k.to_string(), v.to_string()])
        .collect()
    }

    fn total(self) -> u64 {
        self.load + self.compute + self.optimizer + self.transfer
    }
}

/// Every rank's step: 200 ms loading, 200 on the "GPU", 40 of optimizer, 300 in the all-reduce.
/// The ranks' CPU work is small: four ranks share two CPUs here, and their optimizer steps run
/// at once (after each all-reduce).
const STEP: Step = Step { load: 200, compute: 200, optimizer: 40, transfer: 300 };

/// The nice value of a busy task beside a rank on its CPU that makes `optimizer_ms` of its CPU
/// work take about `extra_ms` longer. Shared fairly, the rank would get 1024 / (1024 + w) of
/// the CPU against a task of weight w (the kernel's table) and wait `optimizer_ms * w / 1024`;
/// it waits about two thirds of that, as it wakes with credit from its sleep (measured here).
fn hog_nice(optimizer_ms: u64, extra_ms: u64) -> i32 {
    const WEIGHTS: [(i32, f64); 16] = [
        (0, 1024.0),
        (-1, 1277.0),
        (-2, 1586.0),
        (-3, 1991.0),
        (-4, 2501.0),
        (-5, 3121.0),
        (-6, 3906.0),
        (-7, 4904.0),
        (-8, 6100.0),
        (-9, 7620.0),
        (-10, 9548.0),
        (-11, 11916.0),
        (-12, 14949.0),
        (-13, 18705.0),
        (-14, 23254.0),
        (-15, 29154.0),
    ];
    let wait = |w: f64| optimizer_ms as f64 * w * 2.0 / 1024.0 / 3.0;
    WEIGHTS
        .iter()
        .min_by(|a, b| (wait(a.1) - extra_ms as f64).abs().total_cmp(&(wait(b.1) - extra_ms as f64).abs()))
        .map_or(0, |(nice, _)| *nice)
}

struct Outcome {
    rank_right: bool,
    cause_right: bool,
    named_s: Option<f64>,
    /// The slowed rank's own work per step over the others' (from their logs).
    own_ratio: f64,
}

/// A rank's mean own work per step (the step less its time in the all-reduce), and its mean
/// loading, "GPU" and optimizer times, from its log (its first steps skipped).
fn truth(log: &Path) -> [f64; 4] {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let steps: Vec<serde_json::Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).skip(3).collect();
    let mean = |f: &dyn Fn(&serde_json::Value) -> f64| steps.iter().map(f).sum::<f64>() / steps.len().max(1) as f64;
    let ms = |l: &serde_json::Value, k: &str| l[k].as_f64().unwrap_or(0.0);
    [
        mean(&|l| ms(l, "end_ms") - ms(l, "start_ms") - ms(l, "collective_ms")),
        mean(&|l| ms(l, "load_ms")),
        mean(&|l| ms(l, "compute_ms")),
        mean(&|l| ms(l, "optimizer_ms")),
    ]
}

struct Fleet {
    nodes: TwoNodes,
    prometheus: Prometheus,
    scratch: Scratch,
}

impl Fleet {
    fn start() -> Result<Fleet> {
        let nodes = TwoNodes::start("ringside-stragglers", 1000)?;
        let rules = std::fs::read_to_string(workspace_root().join("deploy/prometheus/ringside.rules.yml"))?;
        let prometheus = Prometheus::start(&rules, &[&nodes.a.addr, &nodes.b.addr], &nodes.token, None)?;
        Ok(Fleet { nodes, prometheus, scratch: Scratch::new("stragglers") })
    }

    /// Starts a four-rank job `run`, rank `slow` with its own step, the others with `step`;
    /// with `hog_nice`, the slow rank is pinned to CPU 1 beside a busy task of that nice value.
    fn job(&self, run: &str, step: Step, slow: Option<(u32, Step)>, hog_nice: Option<i32>) -> Result<Vec<Reaped>> {
        let barrier = self.scratch.0.join(format!("{run}.barrier"));
        let mut started = Vec::new();
        if let Some(nice) = hog_nice {
            let mut hog = std::process::Command::new("nice");
            hog.args(["-n", &nice.to_string()])
                .arg(ringside_tests::ddp_rank_binary())
                .args(["--hog", "100", "--cpu", "1"]);
            started.push(Reaped(hog.spawn().context("start a hog")?));
        }
        for rank in 0..4 {
            let cgroup = if rank < 2 { &self.nodes.cgroup_a } else { &self.nodes.cgroup_b };
            let spec = Rank { cgroup, run_id: run, rank, world: 4, barrier: &barrier, dir: &self.scratch.0 };
            let log = self.scratch.0.join(format!("{run}-{rank}.jsonl"));
            let mut args = match slow {
                Some((r, s)) if r == rank => s.args(),
                _ => step.args(),
            };
            args.extend(["--log".into(), log.display().to_string()]);
            if hog_nice.is_some() && slow.is_some_and(|(r, _)| r == rank) {
                args.extend(["--cpu".into(), "1".into()]);
            }
            started.push(spec.start(&args)?);
        }
        Ok(started)
    }

    /// The first firing straggler alert of job `run` within `limit`: (instance, rank, cause,
    /// seconds after `since`).
    async fn named(&self, run: &str, since: Instant, limit: Duration) -> Result<Option<(String, String, String, f64)>> {
        let promql = format!("ALERTS{{alertname=\"RingsideStraggler\", alertstate=\"firing\", job_id=\"{run}\"}}");
        while since.elapsed() < limit {
            let alerts = self.prometheus.query(&promql).await?;
            if let Some(a) = alerts.first() {
                let label = |n: &str| a["metric"][n].as_str().unwrap_or_default().to_string();
                return Ok(Some((label("instance"), label("rank"), label("cause"), since.elapsed().as_secs_f64())));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(None)
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let runs: u32 = std::env::var("RINGSIDE_STRAGGLER_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    let balanced: u32 = std::env::var("RINGSIDE_BALANCED_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let seed = std::env::var("RINGSIDE_BENCH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| ringside_tests::now_ms() | 1);
    let mut random = Random(seed);
    let fleet = Fleet::start()?;
    println!("straggler runs: {runs}, balanced runs: {balanced}, seed {seed}");
    println!("run  rank cause            slowdown own-ratio  named              cause-named      seconds");
    let mut outcomes = Vec::new();
    for i in 0..runs {
        let run = format!("straggle-{seed}-{i}");
        let rank = random.below(4) as u32;
        let mut cause = [Cause::DataLoading, Cause::Gpu, Cause::Cpu][random.below(3) as usize];
        if let Ok(only) = std::env::var("RINGSIDE_BENCH_CAUSE") {
            cause =
                [Cause::DataLoading, Cause::Gpu, Cause::Cpu].into_iter().find(|c| c.expected() == only).with_context(
                    || format!("RINGSIDE_BENCH_CAUSE={only}: data_loading, gpu_compute or waiting_for_cpu"),
                )?;
        }
        let pct = 10 + random.below(21);
        let step = STEP;
        let extra = step.total() * pct / 100;
        let (slow, hog_nice) = match cause {
            Cause::DataLoading => (Step { load: step.load + extra, ..step }, None),
            Cause::Gpu => (Step { compute: step.compute + extra, ..step }, None),
            Cause::Cpu => (step, Some(hog_nice(step.optimizer, extra))),
        };
        let started = Instant::now();
        let ranks = fleet.job(&run, step, Some((rank, slow)), hog_nice)?;
        let named = fleet.named(&run, started, LIMIT).await?;
        drop(ranks);
        let logs: Vec<[f64; 4]> = (0..4).map(|r| truth(&fleet.scratch.0.join(format!("{run}-{r}.jsonl")))).collect();
        // The median of the other three, part by part.
        let peers = |part: usize| {
            let mut v: Vec<f64> = (0..4).filter(|r| *r != rank as usize).map(|r| logs[r][part]).collect();
            v.sort_by(f64::total_cmp);
            v[1]
        };
        let own_ratio = logs[rank as usize][0] / peers(0).max(1.0);
        let more = |part: usize| logs[rank as usize][part] - peers(part);
        let node = if rank < 2 { &fleet.nodes.a.addr } else { &fleet.nodes.b.addr };
        let outcome = Outcome {
            rank_right: named.as_ref().is_some_and(|(i, r, _, _)| i == node && *r == rank.to_string()),
            cause_right: named.as_ref().is_some_and(|(_, _, c, _)| c == cause.expected()),
            named_s: named.as_ref().map(|n| n.3),
            own_ratio,
        };
        let (who, said) = named
            .as_ref()
            .map(|(i, r, c, _)| (format!("{}/{r}", if i == &fleet.nodes.a.addr { "a" } else { "b" }), c.clone()))
            .unwrap_or_else(|| ("nobody".into(), "-".into()));
        println!(
            "{i:>3}  {}/{rank}  {:<16} {pct:>3}%     {own_ratio:>5.2}      {who:<18} {said:<16} {:<7} ({:+.0} load, {:+.0} gpu, {:+.0} optimizer ms)",
            if rank < 2 { "a" } else { "b" },
            cause.expected(),
            outcome.named_s.map(|s| format!("{s:.1}")).unwrap_or_else(|| "-".into()),
            more(1),
            more(2),
            more(3)
        );
        outcomes.push((cause, outcome));
        // The killed ranks' series go stale before the next job starts.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let mut false_alarms = 0;
    for i in 0..balanced {
        let run = format!("balanced-{seed}-{i}");
        let started = Instant::now();
        let ranks = fleet.job(&run, STEP, None, None)?;
        let named = fleet.named(&run, started, Duration::from_secs(BALANCED_S)).await?;
        drop(ranks);
        println!(
            "balanced {i:>2}: {}",
            named.as_ref().map(|n| format!("named rank {} ({})", n.1, n.2)).unwrap_or("nothing".into())
        );
        false_alarms += named.is_some() as u32;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let n = outcomes.len().max(1) as f64;
    let share = |f: &dyn Fn(&Outcome) -> bool| outcomes.iter().filter(|(_, o)| f(o)).count() as f64 * 100.0 / n;
    let mut times: Vec<f64> = outcomes.iter().filter_map(|(_, o)| o.named_s).collect();
    times.sort_by(f64::total_cmp);
    let q = |q: f64| times.get(((times.len().max(1) - 1) as f64 * q).round() as usize).copied().unwrap_or(f64::NAN);
    println!();
    println!("rank named right:  {:.1}% of {} runs", share(&|o| o.rank_right), outcomes.len());
    println!("cause named right: {:.1}%", share(&|o| o.cause_right));
    for cause in [Cause::DataLoading, Cause::Gpu, Cause::Cpu] {
        let of: Vec<&Outcome> = outcomes.iter().filter(|(c, _)| *c == cause).map(|(_, o)| o).collect();
        if of.is_empty() {
            continue;
        }
        let right = |f: fn(&Outcome) -> bool| of.iter().filter(|o| f(o)).count();
        let ratios: Vec<f64> = of.iter().map(|o| o.own_ratio).collect();
        println!(
            "  {:<16} runs {:>2}: rank {}/{}, cause {}/{}, own-work ratio {:.2}-{:.2}",
            cause.expected(),
            of.len(),
            right(|o| o.rank_right),
            of.len(),
            right(|o| o.cause_right),
            of.len(),
            ratios.iter().copied().fold(f64::INFINITY, f64::min),
            ratios.iter().copied().fold(0.0, f64::max)
        );
    }
    println!("named within 30 s: {:.1}%", share(&|o| o.named_s.is_some_and(|s| s <= 30.0)));
    println!("time to name: p50 {:.1} s, p90 {:.1} s, max {:.1} s (from the ranks' start)", q(0.5), q(0.9), q(1.0));
    println!("balanced jobs named: {false_alarms} of {balanced}");
    Ok(())
}
