//! The CPU backend on real threads: exactly-once in-order processing, exact drop counts,
//! lifecycle rules, drain and abort.

use std::time::{Duration, Instant};

use ringside_kernels::builtin::{Echo, StatsSummary};
use ringside_kernels::{Backpressure, KernelError, KernelHandler, LaunchOptions, RingKernel, Terminate};
use ringside_shared::KernelState;

fn options(capacity: usize, backpressure: Backpressure) -> LaunchOptions {
    LaunchOptions { queue_capacity: capacity, message_size: 64, backpressure }
}

#[test]
fn every_message_is_processed_exactly_once_and_in_order() {
    let mut kernel =
        RingKernel::launch("echo0", Echo, options(256, Backpressure::WaitWithTimeout(Duration::from_secs(5)))).unwrap();
    kernel.activate().unwrap();
    const N: u64 = 200_000;
    let mut out = [0u8; 64];
    let mut next_expected = 0u64;
    let mut sent = 0u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while next_expected < N {
        // Keep the input ring busy, and read results as they come.
        while sent < N && kernel.send(&sent.to_le_bytes()).is_ok() {
            sent += 1;
            if sent.is_multiple_of(64) {
                break;
            }
        }
        while let Some(len) = kernel.try_recv(&mut out) {
            assert_eq!(len, 8);
            assert_eq!(u64::from_le_bytes(out[..8].try_into().unwrap()), next_expected, "in order, once");
            next_expected += 1;
        }
        assert!(Instant::now() < deadline, "stalled at {next_expected}");
    }
    let metrics = kernel.metrics();
    assert_eq!(metrics.messages_processed, N);
    assert_eq!(metrics.messages_dropped, 0);
    assert_eq!(metrics.bytes_in, 8 * N);
    let (min, p50, max) = (metrics.min_latency_ns.unwrap(), metrics.latency_p50_ns.unwrap(), metrics.max_latency_ns);
    let p999 = metrics.latency_p999_ns.unwrap();
    assert!(min <= p50 && p50 <= p999 && p999 <= max, "{min} <= {p50} <= {p999} <= {max}");
    assert_eq!(kernel.try_recv(&mut out), None, "nothing extra");
    kernel.terminate(Terminate::Drain).unwrap();
    assert_eq!(kernel.state(), KernelState::Terminated);
}

#[test]
fn drops_are_counted_exactly_under_backpressure() {
    let mut kernel = RingKernel::launch("echo1", Echo, options(16, Backpressure::DropAndCount)).unwrap();
    // Launched but not active: nothing is consumed, so the 17th message on is refused.
    let mut refused = 0;
    for i in 0..100u64 {
        match kernel.send(&i.to_le_bytes()) {
            Ok(()) => {}
            Err(KernelError::Full) => refused += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(refused, 84);
    let metrics = kernel.metrics();
    assert_eq!((metrics.messages_dropped, metrics.input_queue_depth), (84, 16));
    assert!((metrics.drop_rate - 1.0).abs() < 1e-9, "nothing processed yet");

    // Waiting with a timeout: refused only after the timeout, and counted too.
    let mut waiting =
        RingKernel::launch("echo2", Echo, options(2, Backpressure::WaitWithTimeout(Duration::from_millis(20))))
            .unwrap();
    waiting.send(b"a").unwrap();
    waiting.send(b"b").unwrap();
    let started = Instant::now();
    assert!(matches!(waiting.send(b"c"), Err(KernelError::Timeout(_))));
    assert!(started.elapsed() >= Duration::from_millis(20));
    assert_eq!(waiting.metrics().messages_dropped, 1);
}

#[test]
fn invalid_lifecycle_transitions_are_rejected() {
    let mut kernel = RingKernel::launch("echo3", Echo, LaunchOptions::default()).unwrap();
    assert_eq!(kernel.state(), KernelState::Launched);
    assert!(matches!(kernel.deactivate(), Err(KernelError::InvalidTransition { from: KernelState::Launched, .. })));
    kernel.activate().unwrap();
    assert!(matches!(kernel.activate(), Err(KernelError::InvalidTransition { .. })), "already active");
    kernel.deactivate().unwrap();
    assert_eq!(kernel.state(), KernelState::Deactivated);
    kernel.activate().unwrap();
    kernel.terminate(Terminate::Drain).unwrap();
    assert_eq!(kernel.state(), KernelState::Terminated);
    assert!(matches!(kernel.activate(), Err(KernelError::InvalidTransition { from: KernelState::Terminated, .. })));
    assert!(matches!(kernel.send(b"x"), Err(KernelError::NotActive { .. })));
    assert!(matches!(kernel.terminate(Terminate::Drain), Err(KernelError::InvalidTransition { .. })));
    let error =
        RingKernel::launch("bad", Echo, LaunchOptions { queue_capacity: 1000, ..LaunchOptions::default() }).err();
    assert!(error.is_some_and(|e| e.to_string().contains("power of two")));
}

#[test]
fn a_deactivated_kernel_holds_messages_and_terminate_drains_them() {
    let mut kernel = RingKernel::launch("echo4", Echo, options(64, Backpressure::DropAndCount)).unwrap();
    kernel.activate().unwrap();
    kernel.deactivate().unwrap();
    for i in 0..40u64 {
        kernel.send(&i.to_le_bytes()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(kernel.metrics().messages_processed, 0, "deactivated: queued, not processed");
    kernel.terminate(Terminate::Drain).unwrap();
    let metrics = kernel.metrics();
    assert_eq!((metrics.messages_processed, metrics.messages_dropped), (40, 0), "drained before stopping");
    let mut out = [0u8; 64];
    let mut results = 0;
    while kernel.try_recv(&mut out).is_some() {
        results += 1;
    }
    assert_eq!(results, 40);
}

#[test]
fn nothing_sent_after_deactivate_returns_is_processed() {
    // The worker may be in the middle of a batch when `deactivate` is called; once it returns,
    // no further message is taken. Repeated so that a race shows up.
    let mut kernel = RingKernel::launch("echo-quiesce", Echo, options(64, Backpressure::DropAndCount)).unwrap();
    let mut out = [0u8; 64];
    for round in 0..1000u64 {
        kernel.activate().unwrap();
        kernel.send(&round.to_le_bytes()).unwrap();
        if round % 3 == 0 {
            std::thread::yield_now();
        }
        kernel.deactivate().unwrap();
        let before = kernel.metrics().messages_processed;
        kernel.send(&u64::MAX.to_le_bytes()).unwrap();
        std::thread::sleep(Duration::from_micros(200));
        assert_eq!(kernel.metrics().messages_processed, before, "round {round}: processed while deactivated");
        kernel.activate().unwrap();
        while kernel.metrics().messages_processed < before + 1 {
            std::thread::yield_now();
        }
        while kernel.try_recv(&mut out).is_some() {}
        kernel.deactivate().unwrap();
    }
    kernel.terminate(Terminate::Drain).unwrap();
}

#[test]
fn abort_drops_and_counts_what_is_queued() {
    let mut kernel = RingKernel::launch("echo5", Echo, options(64, Backpressure::DropAndCount)).unwrap();
    for i in 0..30u64 {
        kernel.send(&i.to_le_bytes()).unwrap();
    }
    kernel.terminate(Terminate::Abort).unwrap();
    let metrics = kernel.metrics();
    assert_eq!((metrics.messages_processed, metrics.messages_dropped), (0, 30));
    assert_eq!(metrics.state, KernelState::Terminated);
}

/// A handler that fails on odd messages: errors are counted and reported, the kernel goes on.
struct PickyKernel;

impl KernelHandler for PickyKernel {
    fn name(&self) -> &'static str {
        "picky"
    }

    fn process(&mut self, input: &[u8], output: &mut Vec<u8>) -> Result<(), String> {
        if input[0] % 2 == 1 {
            return Err(format!("odd input {}", input[0]));
        }
        output.extend_from_slice(input);
        Ok(())
    }
}

#[test]
fn handler_errors_are_reported_and_the_kernel_goes_on() {
    let mut kernel = RingKernel::launch("picky", PickyKernel, options(16, Backpressure::DropAndCount)).unwrap();
    kernel.activate().unwrap();
    for i in 0..4u8 {
        kernel.send(&[i]).unwrap();
    }
    kernel.terminate(Terminate::Drain).unwrap();
    let metrics = kernel.metrics();
    assert_eq!(metrics.messages_processed, 2);
    assert_eq!(metrics.last_error.as_deref(), Some("odd input 3"));
    assert_eq!(kernel.telemetry().failed.load(std::sync::atomic::Ordering::Relaxed), 2);
}

#[test]
fn the_stats_kernel_answers_through_the_rings() {
    let mut kernel = RingKernel::launch(
        "stats0",
        ringside_kernels::builtin::Stats::default(),
        options(16, Backpressure::DropAndCount),
    )
    .unwrap();
    kernel.activate().unwrap();
    let samples: Vec<u8> = (1..=10).flat_map(|v| (v as f32).to_le_bytes()).collect();
    kernel.send(&samples).unwrap();
    let mut out = [0u8; 64];
    let len = kernel.recv_timeout(&mut out, Duration::from_secs(5)).expect("an answer");
    let summary = StatsSummary::decode(&out[..len]).unwrap();
    assert_eq!((summary.count, summary.max), (10, 10.0));
    assert!((summary.mean - 5.5).abs() < 1e-6);
}
