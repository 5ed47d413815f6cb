//! GPU round trips: the persistent kernel (host writes the input ring, the running kernel
//! answers through the output ring) against the same device code launched once per message,
//! by `cuLaunchKernel` + `cuStreamSynchronize`, and as a CUDA graph of that launch. Measured
//! side by side, several interleaved rounds, for `echo` (8 bytes) and `saxpy` (32 pairs); run
//! by `cargo xtask bench gpu`. Without a usable GPU it prints why and exits 0.

use std::time::{Duration, Instant};

use ringside_kernels::cuda::{self, CudaKernel, LaunchMode, OneShotKernel};
use ringside_kernels::{Backpressure, LaunchOptions, Terminate};
use ringside_shared::KernelKind;

const ROUNDS: usize = 5;
const ANSWER_LIMIT: Duration = Duration::from_secs(5);

fn round_trips() -> usize {
    std::env::var("RINGSIDE_BENCH_GPU_ROUND_TRIPS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000)
}

fn options() -> LaunchOptions {
    LaunchOptions {
        queue_capacity: 256,
        message_size: 512,
        backpressure: Backpressure::WaitWithTimeout(Duration::from_secs(1)),
    }
}

/// (p50, p99) of the samples, in ns.
fn percentiles(mut samples: Vec<u64>) -> (u64, u64) {
    samples.sort_unstable();
    (samples[samples.len() / 2], samples[samples.len() * 99 / 100])
}

/// Round trips through a running persistent kernel; also what the device measured itself.
fn persistent(kernel: KernelKind, payload: &[u8]) -> ((u64, u64), (u64, u64)) {
    let mut k = CudaKernel::launch("bench", kernel, options()).expect("launch");
    k.activate().expect("activate");
    let mut out = [0u8; 512];
    let n = round_trips();
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + 100 {
        let started = Instant::now();
        k.send(payload).expect("send");
        while k.try_recv(&mut out).is_none() {
            // A kernel that stopped answering ends the benchmark with its state, not a hang.
            if started.elapsed() > ANSWER_LIMIT {
                panic!("{}: no answer within {ANSWER_LIMIT:?} (state {:?})", kernel.as_str(), k.state());
            }
            std::hint::spin_loop();
        }
        if i >= 100 {
            samples.push(started.elapsed().as_nanos() as u64);
        }
    }
    let m = k.metrics();
    k.terminate(Terminate::Drain).expect("terminate");
    (percentiles(samples), (m.latency_p50_ns.unwrap_or(0), m.latency_p99_ns.unwrap_or(0)))
}

fn one_shot(kernel: KernelKind, payload: &[u8], mode: LaunchMode) -> (u64, u64) {
    let mut k = OneShotKernel::new(kernel, options(), mode).expect("one-shot kernel");
    let mut out = [0u8; 512];
    let n = round_trips();
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + 100 {
        let started = Instant::now();
        k.round_trip(payload, &mut out).expect("round trip");
        if i >= 100 {
            samples.push(started.elapsed().as_nanos() as u64);
        }
    }
    percentiles(samples)
}

fn median(mut values: Vec<u64>) -> u64 {
    values.sort_unstable();
    values[values.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; anything else (e.g. `cargo test --benches`) is a dry run.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let device = match cuda::probe() {
        Ok(device) => device,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let saxpy: Vec<u8> =
        std::iter::once(2.0f32).chain((0..64).map(|i| i as f32 * 0.5)).flat_map(|v| v.to_le_bytes()).collect();
    let workloads: [(KernelKind, &str, Vec<u8>); 2] =
        [(KernelKind::Echo, "echo, 8 B", 42u64.to_le_bytes().to_vec()), (KernelKind::Saxpy, "saxpy, 32 pairs", saxpy)];
    println!("GPU round trips on {device}");
    println!("{} round trips per contender, median of {ROUNDS} interleaved rounds", round_trips());
    println!("| work | contender | round trip p50 (ns) | p99 (ns) | p50 vs persistent |");
    println!("|---|---|---|---|---|");
    for (kernel, label, payload) in &workloads {
        // Per contender: p50s and p99s of each round; the device's own view of the persistent one.
        let mut rounds: [(Vec<u64>, Vec<u64>); 3] = Default::default();
        let mut device_view = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            eprintln!("{label}: round {}/{ROUNDS}", round + 1);
            let ((p50, p99), (d50, d99)) = persistent(*kernel, payload);
            rounds[0].0.push(p50);
            rounds[0].1.push(p99);
            device_view.0.push(d50);
            device_view.1.push(d99);
            for (slot, mode) in [(1, LaunchMode::Launch), (2, LaunchMode::Graph)] {
                let (p50, p99) = one_shot(*kernel, payload, mode);
                rounds[slot].0.push(p50);
                rounds[slot].1.push(p99);
            }
        }
        let names = ["persistent kernel", "cuLaunchKernel + sync", "CUDA graph launch + sync"];
        let rows: Vec<(u64, u64)> = rounds.into_iter().map(|(p50, p99)| (median(p50), median(p99))).collect();
        for (name, (p50, p99)) in names.iter().zip(&rows) {
            println!("| {label} | {name} | {p50} | {p99} | {:.2}x |", *p50 as f64 / rows[0].0 as f64);
        }
        println!(
            "| {label} | persistent, enqueue to completion as the device measured it | {} | {} | |",
            median(device_view.0),
            median(device_view.1)
        );
        println!(
            "{label}: launch / persistent {:.2}x, graph / persistent {:.2}x (p50)",
            rows[1].0 as f64 / rows[0].0 as f64,
            rows[2].0 as f64 / rows[0].0 as f64
        );
    }
}
