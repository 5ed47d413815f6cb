//! Ring throughput and round-trip latency against `rtrb` and `crossbeam-channel` (bounded),
//! measured side by side in one run, several interleaved rounds; run by `cargo xtask bench`.
//! Each contender moves 8-byte values between two threads that spin (no blocking calls), so
//! the figures compare the queues, not the schedulers' wake-ups.
//!
//! Two-thread throughput depends on which side runs ahead: a queue whose consumer keeps up
//! with its producer trades a cache line per message, one whose ring stays partly full moves
//! lines in bulk. Which regime a run falls into can change with nothing but the code's layout
//! in the binary, so each row shows the spread of its rounds beside the median. The one-thread
//! column (push then pop 512 messages, repeated, on one thread) is each queue's own cost per
//! message without any cache line moving: on machines whose hardware counters are not exposed
//! (virtual machines), the stand-in for instructions per message.
//!
//! A Ringside slot carries, besides the value, the message's enqueue time (with its length, in
//! one 8-byte header): the kernel's latency telemetry needs it. So each other queue runs twice:
//! carrying the value and an enqueue time (16 bytes, the same information; the contenders), and
//! carrying the bare value (8 bytes, half the bytes per message; shown for reference).

use std::hint::spin_loop;
use std::time::Instant;

const CAPACITY: usize = 1024;
const ROUNDS: usize = 5;

fn messages() -> u64 {
    std::env::var("RINGSIDE_BENCH_MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000_000)
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

/// Ringside read in place (`pop_in_place`, as the CPU backend's batches read).
struct Ringside;
impl Queue for Ringside {
    const NAME: &'static str = "ringside RingQueue, read in place";
    type Tx = ringside_kernels::ring::Producer;
    type Rx = ringside_kernels::ring::Consumer;
    fn make() -> (Self::Tx, Self::Rx) {
        ringside_kernels::ring::ring(CAPACITY, 8).expect("ring")
    }
    fn send(tx: &mut Self::Tx, value: u64) -> bool {
        tx.push(&value.to_le_bytes(), 0)
    }
    fn recv(rx: &mut Self::Rx) -> Option<u64> {
        rx.pop_in_place(|payload, _| payload.first_chunk().map(|bytes| u64::from_le_bytes(*bytes)))?
    }
}

/// Ringside copied out (`pop` into the caller's buffer).
struct RingsideCopy;
impl Queue for RingsideCopy {
    const NAME: &'static str = "ringside RingQueue, copied out";
    type Tx = ringside_kernels::ring::Producer;
    type Rx = ringside_kernels::ring::Consumer;
    fn make() -> (Self::Tx, Self::Rx) {
        Ringside::make()
    }
    fn send(tx: &mut Self::Tx, value: u64) -> bool {
        Ringside::send(tx, value)
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

/// `rtrb` carrying the value and its enqueue time, as a Ringside slot does.
struct RtrbStamped;
impl Queue for RtrbStamped {
    const NAME: &'static str = "rtrb";
    type Tx = rtrb::Producer<(u64, u64)>;
    type Rx = rtrb::Consumer<(u64, u64)>;
    fn make() -> (Self::Tx, Self::Rx) {
        rtrb::RingBuffer::new(CAPACITY)
    }
    fn send(tx: &mut Self::Tx, value: u64) -> bool {
        tx.push((value, 0)).is_ok()
    }
    fn recv(rx: &mut Self::Rx) -> Option<u64> {
        rx.pop().ok().map(|(value, _)| value)
    }
}

/// `crossbeam-channel` carrying the value and its enqueue time, as a Ringside slot does.
struct CrossbeamStamped;
impl Queue for CrossbeamStamped {
    const NAME: &'static str = "crossbeam-channel (bounded)";
    type Tx = crossbeam_channel::Sender<(u64, u64)>;
    type Rx = crossbeam_channel::Receiver<(u64, u64)>;
    fn make() -> (Self::Tx, Self::Rx) {
        crossbeam_channel::bounded(CAPACITY)
    }
    fn send(tx: &mut Self::Tx, value: u64) -> bool {
        tx.try_send((value, 0)).is_ok()
    }
    fn recv(rx: &mut Self::Rx) -> Option<u64> {
        rx.try_recv().ok().map(|(value, _)| value)
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

/// Nanoseconds per message pushed and popped on one thread, 512 at a time: the queue's own
/// work, with no cache line moving between cores.
fn one_thread<Q: Queue>() -> f64 {
    const BATCH: u64 = 512;
    let laps = (messages() / BATCH).max(1);
    let (mut tx, mut rx) = Q::make();
    let mut sum = 0u64;
    let started = Instant::now();
    for lap in 0..laps {
        for i in 0..BATCH {
            assert!(Q::send(&mut tx, lap + i), "{}: room for a batch", Q::NAME);
        }
        for _ in 0..BATCH {
            sum = sum.wrapping_add(Q::recv(&mut rx).expect("a message per push"));
        }
    }
    std::hint::black_box(sum);
    started.elapsed().as_nanos() as f64 / (laps * BATCH) as f64
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

/// One row: the queue's name, what it carries, then throughput, p50 and p99 of each round.
struct Row {
    name: &'static str,
    carries: &'static str,
    throughput: Vec<f64>,
    one_thread: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
}

/// One round of one queue: throughput, one-thread ns per message, round trip (p50, p99).
type Measured = (f64, f64, (u64, u64));

impl Row {
    fn new(name: &'static str, carries: &'static str) -> Row {
        Row { name, carries, throughput: vec![], one_thread: vec![], p50: vec![], p99: vec![] }
    }

    fn record(&mut self, (throughput, one_thread, (p50, p99)): Measured) {
        self.throughput.push(throughput);
        self.one_thread.push(one_thread);
        self.p50.push(p50 as f64);
        self.p99.push(p99 as f64);
    }

    fn medians(&self) -> (f64, f64, f64) {
        (median(&self.throughput), median(&self.p50), median(&self.p99))
    }

    /// Lowest and highest throughput of the rounds.
    fn spread(&self) -> (f64, f64) {
        let low = self.throughput.iter().copied().fold(f64::INFINITY, f64::min);
        (low, self.throughput.iter().copied().fold(0.0, f64::max))
    }
}

fn median(values: &[f64]) -> f64 {
    let mut values = values.to_vec();
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn measure<Q: Queue>() -> Measured {
    (throughput::<Q>(), one_thread::<Q>(), round_trip::<Q>())
}

fn main() {
    // `cargo bench` passes `--bench`; anything else (e.g. `cargo test --benches`) is a dry run.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    const STAMPED: &str = "value + enqueue time";
    const BARE: &str = "bare value (reference)";
    let mut rows = [
        Row::new(Ringside::NAME, STAMPED),
        Row::new(RingsideCopy::NAME, STAMPED),
        Row::new(RtrbStamped::NAME, STAMPED),
        Row::new(CrossbeamStamped::NAME, STAMPED),
        Row::new(Rtrb::NAME, BARE),
        Row::new(Crossbeam::NAME, BARE),
    ];
    for round in 0..ROUNDS {
        eprintln!("round {}/{ROUNDS}", round + 1);
        rows[0].record(measure::<Ringside>());
        rows[1].record(measure::<RingsideCopy>());
        rows[2].record(measure::<RtrbStamped>());
        rows[3].record(measure::<CrossbeamStamped>());
        rows[4].record(measure::<Rtrb>());
        rows[5].record(measure::<Crossbeam>());
    }
    let medians: Vec<(f64, f64, f64)> = rows.iter().map(Row::medians).collect();
    let ours = medians[0];
    println!(
        "Ring queues, 8-byte values, capacity {CAPACITY}, {} M messages a run, median of {ROUNDS} interleaved rounds",
        messages() / 1_000_000
    );
    println!("| queue | carries | throughput (M msg/s) | lowest-highest | vs ringside | one thread (ns/msg) | round trip p50 (ns) | p99 (ns) |");
    println!("|---|---|---|---|---|---|---|---|");
    for (row, (tp, p50, p99)) in rows.iter().zip(&medians) {
        let (low, high) = row.spread();
        println!(
            "| {} | {} | {:.1} | {:.0}-{:.0} | {:.2}x | {:.2} | {p50:.0} | {p99:.0} |",
            row.name,
            row.carries,
            tp / 1e6,
            low / 1e6,
            high / 1e6,
            tp / ours.0,
            median(&row.one_thread)
        );
    }
    // Best of the others: highest throughput, lowest p50.
    let best = |range: std::ops::Range<usize>| {
        let tp = medians[range.clone()].iter().map(|m| m.0).fold(0.0, f64::max);
        let p50 = medians[range].iter().map(|m| m.1).fold(f64::INFINITY, f64::min);
        (tp, p50)
    };
    let (stamped_tp, stamped_p50) = best(2..4);
    let (bare_tp, bare_p50) = best(4..6);
    println!(
        "ringside / best other with the same information: throughput {:.2}x (copied out {:.2}x), round trip p50 {:.2}x (below 1 = faster)",
        ours.0 / stamped_tp,
        medians[1].0 / stamped_tp,
        ours.1 / stamped_p50
    );
    println!(
        "ringside / best other with bare values: throughput {:.2}x, round trip p50 {:.2}x (below 1 = faster)",
        ours.0 / bare_tp,
        ours.1 / bare_p50
    );
}
