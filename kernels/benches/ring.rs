//! Ring throughput and round-trip latency against `rtrb` and `crossbeam-channel` (bounded),
//! measured side by side in one run, several interleaved rounds; run by `cargo xtask bench`.
//! Each contender moves 8-byte messages between two threads that spin (no blocking calls), so
//! the figures compare the queues, not the schedulers' wake-ups.

use std::hint::spin_loop;
use std::time::Instant;

const CAPACITY: usize = 1024;
const ROUNDS: usize = 5;

fn messages() -> u64 {
    std::env::var("RINGSIDE_BENCH_MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(5_000_000)
}

fn round_trips() -> usize {
    std::env::var("RINGSIDE_BENCH_ROUND_TRIPS").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000)
}

/// One queue under test: a way to make a (sender, receiver) pair of 8-byte messages.
trait Queue {
    const NAME: &'static str;
    type Tx: Send + 'static;
    type Rx: Send + 'static;
    fn make() -> (Self::Tx, Self::Rx);
    fn send(tx: &mut Self::Tx, value: u64) -> bool;
    fn recv(rx: &mut Self::Rx) -> Option<u64>;
}

struct Ringside;
impl Queue for Ringside {
    const NAME: &'static str = "ringside RingQueue";
    type Tx = ringside_kernels::ring::Producer;
    type Rx = ringside_kernels::ring::Consumer;
    fn make() -> (Self::Tx, Self::Rx) {
        ringside_kernels::ring::ring(CAPACITY, 8).expect("ring")
    }
    fn send(tx: &mut Self::Tx, value: u64) -> bool {
        tx.push(&value.to_le_bytes(), 0)
    }
    fn recv(rx: &mut Self::Rx) -> Option<u64> {
        let mut out = [0u8; 8];
        rx.pop(&mut out).map(|_| u64::from_le_bytes(out))
    }
}

struct Rtrb;
impl Queue for Rtrb {
    const NAME: &'static str = "rtrb";
    type Tx = rtrb::Producer<u64>;
    type Rx = rtrb::Consumer<u64>;
    fn make() -> (Self::Tx, Self::Rx) {
        rtrb::RingBuffer::new(CAPACITY)
    }
    fn send(tx: &mut Self::Tx, value: u64) -> bool {
        tx.push(value).is_ok()
    }
    fn recv(rx: &mut Self::Rx) -> Option<u64> {
        rx.pop().ok()
    }
}

/// `rtrb` carrying what a Ringside slot holds (the 8-byte value and an 8-byte header: length
/// and enqueue time): the same bytes per message moved between the cores. A reference row, not
/// a contender.
struct Rtrb16;
impl Queue for Rtrb16 {
    const NAME: &'static str = "rtrb, 16-byte values (reference: a Ringside slot's size)";
    type Tx = rtrb::Producer<[u64; 2]>;
    type Rx = rtrb::Consumer<[u64; 2]>;
    fn make() -> (Self::Tx, Self::Rx) {
        rtrb::RingBuffer::new(CAPACITY)
    }
    fn send(tx: &mut Self::Tx, value: u64) -> bool {
        tx.push([8 << 48, value]).is_ok()
    }
    fn recv(rx: &mut Self::Rx) -> Option<u64> {
        rx.pop().ok().map(|[_, value]| value)
    }
}

struct Crossbeam;
impl Queue for Crossbeam {
    const NAME: &'static str = "crossbeam-channel (bounded)";
    type Tx = crossbeam_channel::Sender<u64>;
    type Rx = crossbeam_channel::Receiver<u64>;
    fn make() -> (Self::Tx, Self::Rx) {
        crossbeam_channel::bounded(CAPACITY)
    }
    fn send(tx: &mut Self::Tx, value: u64) -> bool {
        tx.try_send(value).is_ok()
    }
    fn recv(rx: &mut Self::Rx) -> Option<u64> {
        rx.try_recv().ok()
    }
}

/// Messages per second from one thread to another.
fn throughput<Q: Queue>() -> f64 {
    let n = messages();
    let (mut tx, mut rx) = Q::make();
    let started = Instant::now();
    let producer = std::thread::spawn(move || {
        for i in 0..n {
            while !Q::send(&mut tx, i) {
                spin_loop();
            }
        }
    });
    let mut sum = 0u64;
    let mut received = 0;
    while received < n {
        match Q::recv(&mut rx) {
            Some(v) => {
                sum = sum.wrapping_add(v);
                received += 1;
            }
            None => spin_loop(),
        }
    }
    let elapsed = started.elapsed();
    producer.join().expect("producer");
    assert_eq!(sum, n * (n - 1) / 2, "{}: checksum", Q::NAME);
    n as f64 / elapsed.as_secs_f64()
}

/// Round-trip latencies (ns) through a ping ring and a pong ring, (p50, p99).
fn round_trip<Q: Queue>() -> (u64, u64) {
    let count = round_trips();
    let (mut ping_tx, mut ping_rx) = Q::make();
    let (mut pong_tx, mut pong_rx) = Q::make();
    let echo = std::thread::spawn(move || {
        for _ in 0..count {
            let value = loop {
                if let Some(v) = Q::recv(&mut ping_rx) {
                    break v;
                }
                spin_loop();
            };
            while !Q::send(&mut pong_tx, value) {
                spin_loop();
            }
        }
    });
    let mut samples = Vec::with_capacity(count);
    for i in 0..count as u64 {
        let started = Instant::now();
        while !Q::send(&mut ping_tx, i) {
            spin_loop();
        }
        loop {
            if let Some(v) = Q::recv(&mut pong_rx) {
                assert_eq!(v, i);
                break;
            }
            spin_loop();
        }
        samples.push(started.elapsed().as_nanos() as u64);
    }
    echo.join().expect("echo");
    samples.sort_unstable();
    (samples[count / 2], samples[count * 99 / 100])
}

/// Per contender: name, then throughput, p50 and p99 of each round.
type Rounds = Vec<(&'static str, Vec<f64>, Vec<f64>, Vec<f64>)>;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; anything else (e.g. `cargo test --benches`) is a dry run.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let mut results: Rounds = vec![
        (Ringside::NAME, vec![], vec![], vec![]),
        (Rtrb::NAME, vec![], vec![], vec![]),
        (Crossbeam::NAME, vec![], vec![], vec![]),
        (Rtrb16::NAME, vec![], vec![], vec![]),
    ];
    for round in 0..ROUNDS {
        eprintln!("round {}/{ROUNDS}", round + 1);
        let measured = [
            (throughput::<Ringside>(), round_trip::<Ringside>()),
            (throughput::<Rtrb>(), round_trip::<Rtrb>()),
            (throughput::<Crossbeam>(), round_trip::<Crossbeam>()),
            (throughput::<Rtrb16>(), round_trip::<Rtrb16>()),
        ];
        for (slot, (tp, (p50, p99))) in results.iter_mut().zip(measured) {
            slot.1.push(tp);
            slot.2.push(p50 as f64);
            slot.3.push(p99 as f64);
        }
    }
    let rows: Vec<(&str, f64, f64, f64)> =
        results.into_iter().map(|(n, tp, p50, p99)| (n, median(tp), median(p50), median(p99))).collect();
    // The other queues with the same 8-byte messages (not the reference row).
    let best_other = rows[1..3].iter().map(|r| r.1).fold(0.0, f64::max);
    println!("Ring queues, 8-byte messages, capacity {CAPACITY}, median of {ROUNDS} interleaved rounds");
    println!("| queue | throughput (M msg/s) | vs ringside | round trip p50 (ns) | p99 (ns) |");
    println!("|---|---|---|---|---|");
    for (name, tp, p50, p99) in &rows {
        println!("| {name} | {:.1} | {:.2}x | {p50:.0} | {p99:.0} |", tp / 1e6, tp / rows[0].1);
    }
    println!("ringside throughput / best other: {:.2}x", rows[0].1 / best_other);
}
