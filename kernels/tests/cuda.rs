//! The CUDA backend on a real GPU: each kernel answers byte for byte as its CPU twin, round
//! trips stay in order, terminating is bounded, and the telemetry the device writes adds up.
//!
//! These compile everywhere. Where the CUDA backend cannot run (no driver, no device, no
//! NVRTC), each test prints `skipped: cuda unavailable: <why>` and passes; `scripts/gpu-check.sh`
//! runs them on a GPU node. Every test bounds its own time, so a device that stops answering
//! fails the test instead of hanging the run.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use ringside_kernels::builtin::StatsSummary;
use ringside_kernels::{cuda, Backend, Backpressure, Kernel, KernelError, LaunchOptions, Terminate};
use ringside_shared::{KernelBackend, KernelKind, KernelState};

/// Runs `test` if this machine can run CUDA kernels, within `limit`; otherwise says why not.
fn on_gpu(limit: Duration, test: impl FnOnce() + Send + 'static) {
    match cuda::probe() {
        // On a node that is meant to have a usable GPU (scripts/gpu-check.sh sets this), a
        // probe that fails is the failure, not a reason to skip.
        Err(why) if std::env::var_os("RINGSIDE_REQUIRE_CUDA").is_some() => {
            panic!("RINGSIDE_REQUIRE_CUDA is set and {why}")
        }
        Err(why) => println!("skipped: {why}"),
        Ok(device) => {
            println!("device: {device}");
            let (done, finished) = mpsc::channel();
            let runner = std::thread::spawn(move || {
                test();
                let _ = done.send(());
            });
            match finished.recv_timeout(limit) {
                Ok(()) => runner.join().expect("test thread"),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // The test panicked: report its panic.
                    if let Err(panic) = runner.join() {
                        std::panic::resume_unwind(panic);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => panic!("the test did not finish within {limit:?}"),
            }
        }
    }
}

fn options(capacity: usize, message_size: usize) -> LaunchOptions {
    LaunchOptions {
        queue_capacity: capacity,
        message_size,
        backpressure: Backpressure::WaitWithTimeout(Duration::from_secs(2)),
    }
}

fn launch(id: &str, kind: KernelKind, backend: Backend, options: LaunchOptions) -> Kernel {
    let kernel = Kernel::launch(id, kind, backend, options).unwrap_or_else(|e| panic!("{id} on {backend:?}: {e}"));
    kernel.activate().unwrap();
    kernel
}

/// Sends each message and takes its answer (`None` where the kernel refused it), one at a
/// time, so a refused message cannot be confused with the next answer.
fn answers(kernel: &mut Kernel, messages: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    let mut out = vec![0u8; 65_536];
    messages
        .iter()
        .map(|message| {
            kernel.send(message).unwrap();
            let len = kernel.recv_timeout(&mut out, Duration::from_millis(500))?;
            Some(out[..len].to_vec())
        })
        .collect()
}

fn bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A deterministic stream of pseudo-random numbers (xorshift), so the twins get the same input.
struct Numbers(u64);

impl Numbers {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn float(&mut self, scale: f32) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * scale
    }
}

/// The same messages through the CPU and the CUDA twin: the same answers, the same refusals.
fn twins_agree(kind: KernelKind, message_size: usize, messages: Vec<Vec<u8>>) {
    let name = kind.as_str();
    let mut cpu = launch(&format!("{name}-cpu"), kind, Backend::Cpu, options(64, message_size));
    let mut gpu = launch(&format!("{name}-gpu"), kind, Backend::Cuda, options(64, message_size));
    let expected = answers(&mut cpu, &messages);
    let got = answers(&mut gpu, &messages);
    for (i, (want, got)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(got, want, "{name}: message {i} ({} bytes)", messages[i].len());
    }
    let (cpu_metrics, gpu_metrics) = (cpu.metrics(), gpu.metrics());
    assert_eq!(gpu_metrics.backend, KernelBackend::Cuda);
    assert_eq!(gpu_metrics.messages_processed, cpu_metrics.messages_processed);
    assert_eq!(gpu_metrics.last_error, cpu_metrics.last_error, "the same refusal, in the same words");
    for kernel in [&mut cpu, &mut gpu] {
        kernel.terminate(Terminate::Drain).unwrap();
        assert_eq!(kernel.state(), KernelState::Terminated);
    }
}

#[test]
fn echo_answers_as_its_cpu_twin() {
    on_gpu(Duration::from_secs(60), || {
        let mut numbers = Numbers(0x9E37_79B9_7F4A_7C15);
        let messages: Vec<Vec<u8>> = [0usize, 1, 7, 8, 9, 63, 64, 255, 256, 1000, 4096]
            .iter()
            .map(|len| (0..*len).map(|_| numbers.next() as u8).collect())
            .collect();
        twins_agree(KernelKind::Echo, 4096, messages);
    });
}

#[test]
fn saxpy_answers_as_its_cpu_twin_bit_for_bit() {
    on_gpu(Duration::from_secs(60), || {
        let mut numbers = Numbers(42);
        let mut messages: Vec<Vec<u8>> = [1usize, 2, 17, 300, 1000]
            .iter()
            .map(|pairs| {
                // Values whose product and sum round differently fused and unfused.
                let values: Vec<f32> = (0..1 + 2 * pairs).map(|_| numbers.float(1000.0) - 500.0).collect();
                bytes(&values)
            })
            .collect();
        messages.push(bytes(&[1.0 / 3.0, 0.1, 0.7]));
        messages.push(bytes(&[2.0, 1.0])); // an unpaired x
        messages.push(vec![1, 2, 3]); // not whole f32s
        messages.push(Vec::new()); // no a
        messages.push(bytes(&[3.0, 4.0, 5.0])); // and it still works after refusals
        twins_agree(KernelKind::Saxpy, 8192, messages);
    });
}

#[test]
fn stats_answers_as_its_cpu_twin_bit_for_bit() {
    on_gpu(Duration::from_secs(60), || {
        let mut numbers = Numbers(7);
        let mut messages: Vec<Vec<u8>> = Vec::new();
        messages.push(Vec::new()); // nothing yet: all zeros
        for len in [1usize, 5, 100, 1000, 2000] {
            let values: Vec<f32> = (0..len).map(|_| numbers.float(250.0)).collect();
            messages.push(bytes(&values));
        }
        messages.push(bytes(&[0.0, -0.0, 1e-3, 1e-4, 3.4e30])); // zeros, below the scale, huge
        messages.push(bytes(&[1.0, 2.0, f32::NAN, 3.0])); // the first two count, then refused
        messages.push(bytes(&[5.0, -1.0])); // 5.0 counts, then refused
        messages.push(vec![0, 0, 128]); // not whole f32s
        messages.push(bytes(&[42.0]));
        twins_agree(KernelKind::Stats, 8192, messages.clone());
        // The summary is what the CPU's decoder reads.
        let mut gpu = launch("stats-decode", KernelKind::Stats, Backend::Cuda, options(8, 256));
        let answer = answers(&mut gpu, &[bytes(&[1.0, 2.0, 3.0, 4.0])]).remove(0).expect("an answer");
        let summary = StatsSummary::decode(&answer).expect("a summary");
        assert_eq!((summary.count, summary.mean, summary.max), (4, 2.5, 4.0));
        gpu.terminate(Terminate::Drain).unwrap();
    });
}

#[test]
fn round_trips_stay_in_order() {
    on_gpu(Duration::from_secs(120), || {
        let mut kernel = launch("echo-rt", KernelKind::Echo, Backend::Cuda, options(256, 64));
        const N: u64 = 100_000;
        let mut out = [0u8; 64];
        let (mut sent, mut received) = (0u64, 0u64);
        let mut round_trips = Vec::new();
        let started = Instant::now();
        // First one at a time (latency), then the ring kept full (throughput).
        while received < 10_000 {
            let at = Instant::now();
            kernel.send(&sent.to_le_bytes()).unwrap();
            sent += 1;
            let len = kernel.recv_timeout(&mut out, Duration::from_secs(1)).expect("an answer");
            round_trips.push(at.elapsed().as_nanos() as u64);
            assert_eq!((len, u64::from_le_bytes(out[..8].try_into().unwrap())), (8, received));
            received += 1;
        }
        let streamed = Instant::now();
        while received < N {
            while sent < N && kernel.send(&sent.to_le_bytes()).is_ok() {
                sent += 1;
                if sent.is_multiple_of(64) {
                    break;
                }
            }
            while let Some(len) = kernel.try_recv(&mut out) {
                assert_eq!((len, u64::from_le_bytes(out[..8].try_into().unwrap())), (8, received), "in order, once");
                received += 1;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "stalled at {received}");
        }
        let rate = (N - 10_000) as f64 / streamed.elapsed().as_secs_f64();
        round_trips.sort_unstable();
        println!(
            "echo round trip p50 {} ns, p99 {} ns; streamed {:.2} M msg/s",
            round_trips[round_trips.len() / 2],
            round_trips[round_trips.len() * 99 / 100],
            rate / 1e6
        );
        assert_eq!(kernel.metrics().messages_processed, N);
        kernel.terminate(Terminate::Drain).unwrap();
        assert_eq!(kernel.state(), KernelState::Terminated);
    });
}

#[test]
fn the_device_writes_its_own_telemetry() {
    on_gpu(Duration::from_secs(60), || {
        let mut kernel = launch("echo-telemetry", KernelKind::Echo, Backend::Cuda, options(64, 64));
        let mut out = [0u8; 64];
        for i in 0..1000u64 {
            kernel.send(&i.to_le_bytes()).unwrap();
            kernel.recv_timeout(&mut out, Duration::from_secs(1)).expect("an answer");
        }
        let m = kernel.metrics();
        assert_eq!(m.backend, KernelBackend::Cuda);
        assert_eq!(m.messages_processed, 1000);
        assert_eq!((m.bytes_in, m.bytes_out), (8000, 8000));
        let (min, max) = (m.min_latency_ns.expect("a minimum"), m.max_latency_ns);
        let average = m.total_latency_ns / m.messages_processed;
        assert!(min <= average && average <= max, "{min} <= {average} <= {max}");
        let (p50, p99) = (m.latency_p50_ns.expect("histogram has counts"), m.latency_p99_ns.expect("p99"));
        assert!(min <= p50 && p50 <= p99 && p99 <= max, "{min} <= {p50} <= {p99} <= {max}");
        assert!(max < 1_000_000_000, "a latency over a second means the clocks disagree: {max} ns");
        assert!(m.gpu_memory_used > 0, "the kernel's device state");
        assert!(m.host_memory_bytes > 0);
        assert_eq!(m.last_error, None);
        if let Kernel::Cuda(k) = &kernel {
            println!(
                "device-measured latency: min {min} ns, p50 {p50} ns, p99 {p99} ns, max {max} ns; clock offset known to ±{} ns",
                k.clock_uncertainty_ns().unwrap_or(0)
            );
        }
        kernel.terminate(Terminate::Drain).unwrap();
    });
}

#[test]
fn deactivated_keeps_messages_queued_and_terminate_is_bounded() {
    on_gpu(Duration::from_secs(60), || {
        let mut kernel = launch("echo-life", KernelKind::Echo, Backend::Cuda, options(64, 64));
        kernel.deactivate().unwrap();
        assert_eq!(kernel.state(), KernelState::Deactivated);
        for i in 0..10u64 {
            kernel.send(&i.to_le_bytes()).unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        let mut out = [0u8; 64];
        assert_eq!(kernel.try_recv(&mut out), None, "nothing processed while deactivated");
        assert_eq!(kernel.metrics().input_queue_depth, 10);
        kernel.activate().unwrap();
        for i in 0..10u64 {
            kernel.recv_timeout(&mut out, Duration::from_secs(1)).expect("processed once active");
            assert_eq!(u64::from_le_bytes(out[..8].try_into().unwrap()), i);
        }
        assert!(matches!(kernel.activate(), Err(KernelError::InvalidTransition { .. })));

        // Drain: what is queued is processed before the loop returns.
        kernel.deactivate().unwrap();
        for i in 0..5u64 {
            kernel.send(&i.to_le_bytes()).unwrap();
        }
        let started = Instant::now();
        kernel.terminate(Terminate::Drain).unwrap();
        assert!(started.elapsed() < Duration::from_secs(5), "bounded");
        assert_eq!(kernel.state(), KernelState::Terminated);
        assert_eq!(kernel.discard_output(), 5, "drained");
        assert!(kernel.send(b"late").is_err());

        // Abort: what is queued is dropped, and counted.
        let mut kernel = launch("echo-abort", KernelKind::Echo, Backend::Cuda, options(64, 64));
        kernel.deactivate().unwrap();
        for i in 0..7u64 {
            kernel.send(&i.to_le_bytes()).unwrap();
        }
        kernel.terminate(Terminate::Abort).unwrap();
        assert_eq!(kernel.state(), KernelState::Terminated);
        let m = kernel.metrics();
        assert_eq!((m.messages_processed, m.messages_dropped), (0, 7));
    });
}

#[test]
fn kernels_run_side_by_side_and_stop_one_at_a_time() {
    on_gpu(Duration::from_secs(60), || {
        let mut first = launch("side-a", KernelKind::Echo, Backend::Cuda, options(64, 64));
        // Launched while the first runs: its memory is allocated then.
        let mut second = launch("side-b", KernelKind::Saxpy, Backend::Cuda, options(64, 64));
        let mut out = [0u8; 64];
        first.send(b"a").unwrap();
        assert_eq!(first.recv_timeout(&mut out, Duration::from_secs(1)), Some(1));
        second.send(&bytes(&[2.0, 1.0, 1.0])).unwrap();
        assert_eq!(second.recv_timeout(&mut out, Duration::from_secs(1)), Some(4));
        assert_eq!(f32::from_le_bytes(out[..4].try_into().unwrap()), 3.0);
        // One stops while the other runs on.
        first.terminate(Terminate::Drain).unwrap();
        assert_eq!(first.state(), KernelState::Terminated);
        second.send(&bytes(&[3.0, 1.0, 1.0])).unwrap();
        assert_eq!(second.recv_timeout(&mut out, Duration::from_secs(1)), Some(4));
        assert_eq!(f32::from_le_bytes(out[..4].try_into().unwrap()), 4.0);
        second.terminate(Terminate::Drain).unwrap();
        assert_eq!(second.state(), KernelState::Terminated);
    });
}

#[test]
fn without_a_gpu_cuda_is_an_error_with_a_reason() {
    match cuda::probe() {
        Ok(device) => println!("skipped: a GPU is here ({device})"),
        Err(why) => {
            assert!(why.to_string().starts_with("cuda unavailable: "), "{why}");
            let launched = Kernel::launch("k", KernelKind::Echo, Backend::Cuda, options(8, 64));
            assert!(matches!(launched, Err(KernelError::CudaUnavailable(_))));
        }
    }
}
