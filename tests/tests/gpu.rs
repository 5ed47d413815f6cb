//! Ring kernels asked for on CUDA, end to end: `ringsided` runs an echo canary, a stats kernel,
//! a saxpy load and a saxpy whose rings are too small for its load, and the telemetry its
//! snapshot reports adds up: every message counted with its exact size, drops and their rate,
//! latencies without sentinels and in order.
//!
//! On a GPU node (`scripts/gpu-check.sh` sets RINGSIDE_REQUIRE_CUDA) the kernels must run on
//! the device. Elsewhere the daemon must say why they run on the CPU instead, and the same
//! checks run on the CPU backend, so the test means something on every machine.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ringside_tests::{Daemon, DaemonOptions};
use serde_json::Value;

/// A stats kernel answers `[count: u64][mean, p50, p90, p99, max: f32]` to every message.
const STATS_ANSWER: u64 = 8 + 5 * 4;

/// One kernel of the config, and the sizes of what the daemon sends it and gets back.
struct Expected {
    id: &'static str,
    kernel: &'static str,
    /// Extra keys of its `[[kernels]]` table.
    table: &'static str,
    queue_capacity: u64,
    /// Bytes of each message the daemon sends, where they are all alike; else the size they
    /// are all a multiple of.
    message_in: u64,
    in_alike: bool,
    /// Bytes of each answer.
    message_out: u64,
    /// A load its rings cannot keep up with: it must drop.
    drops: bool,
}

/// What the daemon's saxpy feed sends a kernel with `message_size`-byte slots: `a`, then as
/// many (x, y) pairs as fit, 32 at most; the answer is one f32 a pair.
const fn saxpy_sizes(message_size: u64) -> (u64, u64) {
    let pairs = (message_size / 4).saturating_sub(1) / 2;
    let pairs = if pairs > 32 { 32 } else { pairs };
    (4 + 8 * pairs, 4 * pairs)
}

const SAXPY: (u64, u64) = saxpy_sizes(256);
const DROPPING: (u64, u64) = saxpy_sizes(64);

const KERNELS: [Expected; 4] = [
    // The canary's probe is its sequence number, a u64, echoed back.
    Expected {
        id: "gpu-echo",
        kernel: "echo",
        table: "",
        queue_capacity: 1024,
        message_in: 8,
        in_alike: true,
        message_out: 8,
        drops: false,
    },
    // Fed the per-CPU utilisation as f32s, as many as the machine has CPUs.
    Expected {
        id: "gpu-stats",
        kernel: "stats",
        table: "input = \"cpu_utilization\"\n",
        queue_capacity: 1024,
        message_in: 4,
        in_alike: false,
        message_out: STATS_ANSWER,
        drops: false,
    },
    Expected {
        id: "gpu-saxpy",
        kernel: "saxpy",
        table: "batches = 8\n",
        queue_capacity: 1024,
        message_in: SAXPY.0,
        in_alike: true,
        message_out: SAXPY.1,
        drops: false,
    },
    // Two slots each way against a thousand vectors a tick: the input ring refuses some every
    // tick, and answers not yet taken fill the output ring.
    Expected {
        id: "gpu-drops",
        kernel: "saxpy",
        table: "queue_capacity = 2\nmessage_size = 64\nbatches = 1000\n",
        queue_capacity: 2,
        message_in: DROPPING.0,
        in_alike: true,
        message_out: DROPPING.1,
        drops: true,
    },
];

/// Snapshots compared once every kernel has shown its work.
const SNAPSHOTS: usize = 15;

/// The kernels, and no scheduler: nothing here needs it, and its probes need privileges a GPU
/// node's container may lack.
fn config() -> String {
    let kernels: String = KERNELS
        .iter()
        .map(|k| {
            format!("[[kernels]]\nid = \"{}\"\nkernel = \"{}\"\nbackend = \"cuda\"\n{}\n", k.id, k.kernel, k.table)
        })
        .collect();
    format!("[scheduler]\nenabled = false\n\n{kernels}")
}

fn kernel<'a>(snapshot: &'a Value, id: &str) -> Option<&'a Value> {
    snapshot["kernels"].as_array()?.iter().find(|k| k["id"] == id)
}

fn component<'a>(snapshot: &'a Value, id: &str) -> Option<&'a Value> {
    let name = format!("kernel:{id}");
    snapshot["components"].as_array()?.iter().find(|c| c["name"] == name.as_str())
}

fn number(k: &Value, field: &str) -> Result<u64> {
    k[field].as_u64().with_context(|| format!("{} has no {field} (got {})", k["id"], k[field]))
}

/// Every kernel has shown what it is there to show: processed messages, the dropping one's
/// drops, the stats kernel's first summary.
fn all_at_work(snapshot: &Value) -> bool {
    KERNELS.iter().all(|e| {
        kernel(snapshot, e.id).is_some_and(|k| {
            k["messages_processed"].as_u64().unwrap_or(0) > 0
                && (!e.drops || k["messages_dropped"].as_u64().unwrap_or(0) > 0)
                && (e.kernel != "stats" || k["output_stats"]["count"].as_u64().unwrap_or(0) > 0)
        })
    })
}

/// Checks one kernel in one snapshot: `Err` for what no snapshot may show, else what only a
/// settled snapshot must agree on (none where it did). The counters are read one after another
/// while the kernel keeps working, so a message completing between two reads can show in one
/// and not yet in the other: at most a ring's worth, since the daemon sends nothing while it
/// reads them, and only now and then, so some snapshots of a series must agree exactly.
fn check(k: &Value, e: &Expected) -> Result<Vec<String>> {
    let id = e.id;
    ensure!(k["state"] == "active", "{id}: state {}", k["state"]);
    ensure!(k["last_error"].is_null(), "{id}: last_error {}", k["last_error"]);
    ensure!(number(k, "host_memory_bytes")? > 0, "{id}: no host memory for its rings");

    let processed = number(k, "messages_processed")?;
    let dropped = number(k, "messages_dropped")?;
    let (bytes_in, bytes_out) = (number(k, "bytes_in")?, number(k, "bytes_out")?);
    ensure!(processed > 0, "{id}: nothing processed");
    ensure!(
        bytes_in % e.message_in == 0 && bytes_out % e.message_out == 0,
        "{id}: {bytes_in} bytes in, {bytes_out} out is not whole messages of {} and {} bytes",
        e.message_in,
        e.message_out
    );
    let slack = e.queue_capacity;
    let near = |bytes: u64, size: u64| (bytes / size).abs_diff(processed) <= slack;
    ensure!(
        (!e.in_alike || near(bytes_in, e.message_in)) && near(bytes_out, e.message_out),
        "{id}: {processed} processed but {bytes_in} bytes in ({} B each), {bytes_out} out ({} B each)",
        e.message_in,
        e.message_out
    );
    let mut unsettled = Vec::new();
    if (e.in_alike && bytes_in != processed * e.message_in) || bytes_out != processed * e.message_out {
        unsettled.push(format!("{processed} processed, {bytes_in} bytes in, {bytes_out} out"));
    }

    let rate = k["drop_rate"].as_f64().with_context(|| format!("{id}: no drop_rate"))?;
    let want = if processed + dropped == 0 { 0.0 } else { dropped as f64 / (processed + dropped) as f64 };
    ensure!((rate - want).abs() <= 1e-9, "{id}: drop_rate {rate}, but {dropped} dropped of {}", processed + dropped);
    if !e.drops {
        ensure!(dropped == 0, "{id}: {dropped} dropped from a ring the load fits in");
    }

    let optional = |field: &str| -> Result<u64> {
        k[field].as_u64().with_context(|| format!("{id}: {field} is {} after {processed} messages", k[field]))
    };
    let min = optional("min_latency_ns")?;
    let p50 = optional("latency_p50_ns")?;
    let p90 = optional("latency_p90_ns")?;
    let p99 = optional("latency_p99_ns")?;
    let p999 = optional("latency_p999_ns")?;
    let max = number(k, "max_latency_ns")?;
    let total = number(k, "total_latency_ns")?;
    let latencies = format!("min {min}, p50 {p50}, p90 {p90}, p99 {p99}, p99.9 {p999}, max {max} ns");
    ensure!(min > 0, "{id}: a minimum latency of 0 ns is no measurement ({latencies})");
    ensure!(min <= p50 && p50 <= p90 && p90 <= p99 && p99 <= p999, "{id}: out of order: {latencies}");
    // The percentiles come from a histogram that is within 1/32.
    ensure!(p999 <= max + max / 32 + 1, "{id}: p99.9 above the maximum: {latencies}");
    ensure!(max < 10_000_000_000, "{id}: a latency over 10 s means the clocks disagree: {latencies}");
    let average = total / processed;
    if average < min || average > max {
        unsettled.push(format!("average {average} ns outside {latencies}"));
    }

    if e.kernel == "stats" {
        let stats = &k["output_stats"];
        let count = stats["count"].as_u64().with_context(|| format!("{id}: no output_stats: {stats}"))?;
        let p50 = stats["p50"].as_f64().with_context(|| format!("{id}: no output_stats.p50: {stats}"))?;
        ensure!(count > 0, "{id}: a summary of nothing: {stats}");
        ensure!(stats["input"] == "cpu_utilization" && stats["unit"] == "pct", "{id}: {stats}");
        ensure!((0.0..=100.0).contains(&p50), "{id}: median CPU utilisation {p50} % is not a percentage");
    }
    Ok(unsettled)
}

/// The `kernel:<id>` component's status and detail.
fn health(snapshot: &Value, id: &str) -> (String, String) {
    let c = component(snapshot, id);
    let field = |f: &str| c.and_then(|c| c[f].as_str()).unwrap_or("none").to_string();
    (field("status"), field("detail"))
}

#[tokio::test]
async fn kernels_asked_for_on_cuda_report_telemetry_that_adds_up() -> Result<()> {
    let daemon = Daemon::start(DaemonOptions { config: config(), ..DaemonOptions::default() })?;

    // Device set-up (NVRTC compiling the kernels) happens before the daemon listens; from then
    // on a few ticks show every kernel at work.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut snapshot = daemon.get_json("/api/snapshot").await?;
    while !all_at_work(&snapshot) {
        if Instant::now() > deadline {
            bail!("the kernels did not all show their work within 30 s: {:#}", snapshot["kernels"]);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        snapshot = daemon.get_json("/api/snapshot").await?;
    }
    let mut snapshots = vec![snapshot];
    let deadline = Instant::now() + Duration::from_secs(30);
    while snapshots.len() < SNAPSHOTS {
        ensure!(Instant::now() < deadline, "the daemon made no {SNAPSHOTS} ticks in 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let next = daemon.get_json("/api/snapshot").await?;
        if next["seq"] != snapshots[snapshots.len() - 1]["seq"] {
            snapshots.push(next);
        }
    }
    let last = &snapshots[snapshots.len() - 1];

    // Where the kernels run decides what is asked of them: all on the device, or all on the
    // CPU with the reason said.
    let backends: Vec<String> = KERNELS
        .iter()
        .map(|e| kernel(last, e.id).map_or("none", |k| k["backend"].as_str().unwrap_or("?")).to_string())
        .collect();
    let reasons = || {
        KERNELS
            .iter()
            .map(|e| {
                let (status, detail) = health(last, e.id);
                let error = kernel(last, e.id).map_or(Value::Null, |k| k["last_error"].clone());
                format!("\n  {}: component {status}: {detail}; last_error {error}", e.id)
            })
            .collect::<String>()
    };
    let on_cuda = match backends.iter().filter(|b| *b == "cuda").count() {
        4 => true,
        0 if std::env::var_os("RINGSIDE_REQUIRE_CUDA").is_some() => {
            bail!("RINGSIDE_REQUIRE_CUDA is set, but the kernels run on {backends:?}:{}", reasons())
        }
        0 => false,
        _ => bail!("some kernels run on CUDA and some do not: {backends:?}:{}", reasons()),
    };

    for e in &KERNELS {
        let (mut settled, mut last_disagreement) = (0, Vec::new());
        for (i, snapshot) in snapshots.iter().enumerate() {
            let k = kernel(snapshot, e.id).with_context(|| format!("{} missing from snapshot {i}", e.id))?;
            match check(k, e).with_context(|| format!("snapshot {} of {SNAPSHOTS}", i + 1))? {
                disagreement if disagreement.is_empty() => settled += 1,
                disagreement => last_disagreement = disagreement,
            }
        }
        // A race shows now and then; counters that never agree are miscounted.
        ensure!(
            settled > 0,
            "{}: the counters disagreed in all {SNAPSHOTS} snapshots, the last time: {}",
            e.id,
            last_disagreement.join("; ")
        );

        let k = kernel(last, e.id).context("in the last snapshot")?;
        let (status, detail) = health(last, e.id);
        let gpu_memory = number(k, "gpu_memory_used")?;
        if on_cuda {
            ensure!(gpu_memory > 0, "{}: on CUDA without device memory", e.id);
            ensure!(!detail.contains("CPU backend"), "{}: on CUDA, but its component says {detail}", e.id);
        } else {
            ensure!(k["backend"] == "cpu" && gpu_memory == 0, "{}: on the CPU backend but {k}", e.id);
            ensure!(
                status == "degraded" && detail.starts_with("cuda unavailable"),
                "{}: runs on the CPU instead of CUDA without saying why: component {status}: {detail}",
                e.id
            );
        }
        println!(
            "{} ({}) on {}: {} processed, {} dropped (rate {:.4}), {} B in, {} B out, agreeing exactly in {settled} of \
             {SNAPSHOTS} snapshots; latency min {} p50 {} p99 {} max {} ns; {} B device memory, {} B host",
            e.id,
            e.kernel,
            k["backend"].as_str().unwrap_or("?"),
            k["messages_processed"],
            k["messages_dropped"],
            k["drop_rate"].as_f64().unwrap_or(0.0),
            k["bytes_in"],
            k["bytes_out"],
            k["min_latency_ns"],
            k["latency_p50_ns"],
            k["latency_p99_ns"],
            k["max_latency_ns"],
            gpu_memory,
            k["host_memory_bytes"]
        );
    }
    if !on_cuda {
        let (_, why) = health(last, KERNELS[0].id);
        println!("the CUDA path was not exercised (no usable GPU here): checked on the CPU backend instead; {why}");
    }
    Ok(())
}
