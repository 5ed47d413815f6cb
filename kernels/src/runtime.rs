//! A ring kernel: a persistent actor fed through an input ring, answering through an output
//! ring, with a control block for its lifecycle and telemetry it writes itself.
//!
//! Lifecycle: Created -> Launched -> Active <-> Deactivated -> Terminating -> Terminated, and
//! Failed from any state that is not final; every other transition is refused with
//! [`KernelError::InvalidTransition`].
//!
//! The CPU backend runs one thread per kernel. The thread spins on the input ring for a short
//! while after the last message, then parks; a sender that finds it parked unparks it. A
//! deactivated kernel keeps its messages queued; terminating drains what is queued, or drops
//! it on abort (and counts it as dropped).

use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringside_shared::{KernelBackend, KernelState, RingKernelMetrics};

use crate::ring::{self, Consumer, Producer, RingError};
use crate::telemetry::{drop_rate, latency_quantiles, KernelTelemetry};

/// Nanoseconds since the first call in this process: the clock both ends of a ring share.
pub fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Iterations the worker spins on an empty ring before it parks.
const SPIN_ITERATIONS: u32 = 20_000;
/// First park after spinning; each further idle park doubles it up to [`MAX_PARK`]. Senders
/// unpark the worker (the fences make a missed wake-up impossible; the timeout is a safety
/// net), so an idle kernel wakes at most 4 times a second.
const FIRST_PARK: Duration = Duration::from_millis(1);
const MAX_PARK: Duration = Duration::from_millis(250);
/// Messages taken from the input ring per batch.
const BATCH: usize = 64;

/// What the kernel runs on every message.
pub trait KernelHandler: Send + 'static {
    /// Its name in telemetry: a built-in kernel's [`ringside_shared::KernelKind`] name
    /// (`echo`, `stats`, `saxpy`), or a handler's own.
    fn name(&self) -> &'static str;
    /// Turns one input message into one output message (written to `output`, which is empty).
    fn process(&mut self, input: &[u8], output: &mut Vec<u8>) -> Result<(), String>;
}

/// What a full ring does to a new message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Backpressure {
    /// Refuse it at once and count it as dropped.
    DropAndCount,
    /// Wait for room up to the timeout, then drop and count it.
    WaitWithTimeout(Duration),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LaunchOptions {
    /// Slots in each ring; a power of two.
    pub queue_capacity: usize,
    /// Largest message, in bytes.
    pub message_size: usize,
    pub backpressure: Backpressure,
}

impl Default for LaunchOptions {
    fn default() -> Self {
        LaunchOptions { queue_capacity: 1024, message_size: 256, backpressure: Backpressure::DropAndCount }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    #[error("{0}")]
    Ring(#[from] RingError),
    #[error("kernel {id}: cannot go from {from:?} to {to:?}")]
    InvalidTransition { id: String, from: KernelState, to: KernelState },
    #[error("kernel {id} is {state:?}, not active")]
    NotActive { id: String, state: KernelState },
    #[error("input ring full: message dropped")]
    Full,
    #[error("input ring stayed full for {0:?}: message dropped")]
    Timeout(Duration),
    #[error("message of {len} bytes exceeds the kernel's {max}-byte slots")]
    TooLarge { len: usize, max: usize },
    #[error("cannot start the kernel thread: {0}")]
    Spawn(String),
    /// This machine cannot run CUDA kernels (no driver, no device, no NVRTC, an old GPU...).
    #[error("cuda unavailable: {0}")]
    CudaUnavailable(String),
    /// CUDA works here, but this kernel could not be started or run.
    #[error("cuda kernel failed: {0}")]
    Cuda(String),
}

/// A result that does not fit the output ring's slots (it is dropped, and counted so).
pub(crate) fn result_too_large(len: usize, message_size: usize) -> String {
    format!("result of {len} bytes exceeds the {message_size}-byte slot")
}

/// Whether `from -> to` is a lifecycle step.
pub fn can_transition(from: KernelState, to: KernelState) -> bool {
    use KernelState::*;
    matches!(
        (from, to),
        (Created, Launched)
            | (Launched, Active)
            | (Active, Deactivated)
            | (Deactivated, Active)
            | (Launched | Active | Deactivated, Terminating)
            | (Terminating, Terminated)
            | (Created | Launched | Active | Deactivated | Terminating, Failed)
    )
}

const STATES: [KernelState; 7] = [
    KernelState::Created,
    KernelState::Launched,
    KernelState::Active,
    KernelState::Deactivated,
    KernelState::Terminating,
    KernelState::Terminated,
    KernelState::Failed,
];

/// A state's index, as the control words encode it.
pub(crate) fn state_index(state: KernelState) -> u64 {
    STATES.iter().position(|s| *s == state).unwrap_or(0) as u64
}

/// The state at `index` (the low byte of a control word).
pub(crate) fn state_at(index: u64) -> KernelState {
    STATES.get(index as usize).copied().unwrap_or(KernelState::Failed)
}

/// How to end: finish what is queued, or drop it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Terminate {
    Drain,
    Abort,
}

/// Shared between the handle and the worker.
struct Control {
    /// The state's index in [`STATES`] in the low byte, a generation (bumped by every change)
    /// above it, so the handle can tell whether the worker has seen a given change.
    state: AtomicU64,
    /// The last `state` word the worker read before deciding whether to process.
    seen: AtomicU64,
    /// 0: run; 1: drain then stop; 2: stop now.
    stop: AtomicU8,
    sleeping: AtomicBool,
}

/// How long [`RingKernel::deactivate`] waits for the worker to finish the batch it is in.
const QUIESCE_LIMIT: Duration = Duration::from_secs(1);

impl Control {
    fn state(&self) -> KernelState {
        Self::decode(self.state.load(Ordering::Acquire))
    }

    fn decode(word: u64) -> KernelState {
        state_at(word & 0xff)
    }

    /// Sets the state; returns the new word.
    fn set(&self, state: KernelState) -> u64 {
        let index = state_index(state);
        let old = self.state.load(Ordering::Relaxed);
        let word = ((old >> 8) + 1) << 8 | index;
        self.state.store(word, Ordering::Release);
        word
    }
}

/// A launched kernel. Owned by one caller: it is the input's single producer and the output's
/// single consumer.
pub struct RingKernel {
    id: String,
    kernel: &'static str,
    options: LaunchOptions,
    control: Arc<Control>,
    telemetry: Arc<KernelTelemetry>,
    input: Producer,
    output: Consumer,
    worker: Option<JoinHandle<()>>,
    started: Instant,
}

impl RingKernel {
    /// Creates the rings and starts the worker thread (state Launched). It processes nothing
    /// until [`RingKernel::activate`].
    pub fn launch(
        id: impl Into<String>,
        handler: impl KernelHandler,
        options: LaunchOptions,
    ) -> Result<RingKernel, KernelError> {
        let id = id.into();
        let (input, worker_input) = ring::ring(options.queue_capacity, options.message_size)?;
        let (worker_output, output) = ring::ring(options.queue_capacity, options.message_size)?;
        let control = Arc::new(Control {
            state: AtomicU64::new(0),
            seen: AtomicU64::new(0),
            stop: AtomicU8::new(0),
            sleeping: AtomicBool::new(false),
        });
        let telemetry = Arc::new(KernelTelemetry::default());
        let kernel = handler.name();
        control.set(KernelState::Launched);
        let worker = Worker {
            handler: Box::new(handler),
            input: worker_input,
            output: worker_output,
            control: control.clone(),
            telemetry: telemetry.clone(),
            backpressure: options.backpressure,
            message_size: options.message_size,
        };
        let thread = std::thread::Builder::new()
            .name(format!("ring-{id}"))
            .spawn(move || worker.run())
            .map_err(|e| KernelError::Spawn(e.to_string()))?;
        Ok(RingKernel {
            id,
            kernel,
            options,
            control,
            telemetry,
            input,
            output,
            worker: Some(thread),
            started: Instant::now(),
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn state(&self) -> KernelState {
        self.control.state()
    }

    pub fn telemetry(&self) -> &KernelTelemetry {
        &self.telemetry
    }

    fn transition(&self, to: KernelState) -> Result<u64, KernelError> {
        let from = self.state();
        if !can_transition(from, to) {
            return Err(KernelError::InvalidTransition { id: self.id.clone(), from, to });
        }
        let word = self.control.set(to);
        self.wake();
        Ok(word)
    }

    pub fn activate(&self) -> Result<(), KernelError> {
        self.transition(KernelState::Active).map(|_| ())
    }

    /// Stops processing: when this returns, the worker has finished the batch it was in and
    /// takes no further message until [`RingKernel::activate`] (messages sent meanwhile stay
    /// queued). A handler stuck in one message for over a second is not waited for.
    pub fn deactivate(&self) -> Result<(), KernelError> {
        let word = self.transition(KernelState::Deactivated)?;
        let deadline = Instant::now() + QUIESCE_LIMIT;
        while self.control.seen.load(Ordering::Acquire) != word
            && self.worker.as_ref().is_some_and(|w| !w.is_finished())
            && Instant::now() < deadline
        {
            self.wake();
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    /// Stops the worker and waits for it (draining first with [`Terminate::Drain`]).
    pub fn terminate(&mut self, how: Terminate) -> Result<(), KernelError> {
        self.transition(KernelState::Terminating)?;
        self.control.stop.store(if how == Terminate::Drain { 1 } else { 2 }, Ordering::Release);
        self.wake();
        if let Some(worker) = self.worker.take() {
            if worker.join().is_err() {
                self.telemetry.set_error("kernel thread panicked");
                self.control.set(KernelState::Failed);
                return Ok(());
            }
        }
        self.control.set(KernelState::Terminated);
        Ok(())
    }

    fn wake(&self) {
        // Pairs with the worker's fence between announcing sleep and checking the ring.
        fence(Ordering::SeqCst);
        if self.control.sleeping.load(Ordering::Relaxed) {
            if let Some(worker) = &self.worker {
                worker.thread().unpark();
            }
        }
    }

    /// Enqueues a message, applying the backpressure policy when the input ring is full.
    pub fn send(&mut self, payload: &[u8]) -> Result<(), KernelError> {
        let state = self.state();
        if !matches!(state, KernelState::Active | KernelState::Deactivated | KernelState::Launched) {
            return Err(KernelError::NotActive { id: self.id.clone(), state });
        }
        if payload.len() > self.options.message_size {
            return Err(KernelError::TooLarge { len: payload.len(), max: self.options.message_size });
        }
        if self.input.push(payload, now_ns()) {
            self.wake();
            return Ok(());
        }
        let outcome = match self.options.backpressure {
            Backpressure::DropAndCount => Err(KernelError::Full),
            Backpressure::WaitWithTimeout(limit) => {
                let deadline = Instant::now() + limit;
                loop {
                    self.wake();
                    std::thread::yield_now();
                    if self.input.push(payload, now_ns()) {
                        self.wake();
                        break Ok(());
                    }
                    if Instant::now() >= deadline {
                        break Err(KernelError::Timeout(limit));
                    }
                }
            }
        };
        if outcome.is_err() {
            self.telemetry.dropped.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }

    /// Takes one result, if one is ready; returns its length.
    pub fn try_recv(&mut self, out: &mut [u8]) -> Option<usize> {
        self.output.pop(out).map(|r| r.len)
    }

    /// Waits up to `limit` for one result.
    pub fn recv_timeout(&mut self, out: &mut [u8], limit: Duration) -> Option<usize> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(len) = self.try_recv(out) {
                return Some(len);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::hint::spin_loop();
            std::thread::yield_now();
        }
    }

    /// Drops every waiting result; returns how many.
    pub fn discard_output(&mut self) -> usize {
        self.output.discard()
    }

    /// The kernel's telemetry in the daemon's vocabulary.
    pub fn metrics(&self) -> RingKernelMetrics {
        let t = &self.telemetry;
        // The worker keeps counting while these are read: each counter is read once, and all
        // of them back to back before the histogram, so a message completing meanwhile rarely
        // shows in some and not others (the percentiles are kept within min and max anyway).
        let load = |v: &AtomicU64| v.load(Ordering::Relaxed);
        let (processed, dropped, total) = (load(&t.processed), load(&t.dropped), load(&t.total_latency_ns));
        let (min, max) = (t.min_latency_ns(), load(&t.max_latency_ns));
        let (bytes_in, bytes_out) = (load(&t.bytes_in), load(&t.bytes_out));
        let q = latency_quantiles(&t.histogram.counts(), min, max);
        let slots = 2 * self.options.queue_capacity * (ring::SLOT_HEADER + self.options.message_size);
        RingKernelMetrics {
            id: self.id.clone(),
            kernel: self.kernel.to_string(),
            backend: KernelBackend::Cpu,
            state: self.state(),
            messages_processed: processed,
            messages_dropped: dropped,
            total_latency_ns: total,
            min_latency_ns: min,
            max_latency_ns: max,
            latency_p50_ns: q[0],
            latency_p90_ns: q[1],
            latency_p99_ns: q[2],
            latency_p999_ns: q[3],
            input_queue_depth: self.input.len() as u32,
            input_queue_capacity: self.options.queue_capacity as u32,
            output_queue_depth: self.output.len() as u32,
            output_queue_capacity: self.options.queue_capacity as u32,
            last_error: t.last_error(),
            gpu_memory_used: 0,
            host_memory_bytes: slots as u64,
            bytes_in,
            bytes_out,
            uptime_ms: self.started.elapsed().as_millis() as u64,
            drop_rate: drop_rate(processed, dropped),
            output_stats: None,
        }
    }
}

impl Drop for RingKernel {
    fn drop(&mut self) {
        if self.worker.is_some() {
            let _ = self.terminate(Terminate::Abort);
            if let Some(worker) = self.worker.take() {
                self.control.stop.store(2, Ordering::Release);
                worker.thread().unpark();
                let _ = worker.join();
            }
        }
    }
}

struct Worker {
    handler: Box<dyn KernelHandler>,
    input: Consumer,
    output: Producer,
    control: Arc<Control>,
    telemetry: Arc<KernelTelemetry>,
    backpressure: Backpressure,
    message_size: usize,
}

impl Worker {
    fn run(mut self) {
        let mut result = Vec::with_capacity(self.message_size);
        let mut idle = 0u32;
        let mut park = FIRST_PARK;
        loop {
            let stop = self.control.stop.load(Ordering::Acquire);
            if stop == 2 {
                // Abort: what is still queued will never be processed.
                let left = self.input.discard();
                self.telemetry.dropped.fetch_add(left as u64, Ordering::Relaxed);
                return;
            }
            let word = self.control.state.load(Ordering::Acquire);
            self.control.seen.store(word, Ordering::Release);
            let state = Control::decode(word);
            let running = state == KernelState::Active || (stop == 1 && state == KernelState::Terminating);
            let done = if running { self.step(&mut result) } else { 0 };
            if stop == 1 && self.input.is_empty() {
                return;
            }
            if done > 0 {
                idle = 0;
                park = FIRST_PARK;
                continue;
            }
            idle = idle.saturating_add(1);
            if idle < SPIN_ITERATIONS && running {
                std::hint::spin_loop();
                continue;
            }
            self.control.sleeping.store(true, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            if (!running || self.input.is_empty()) && self.control.state.load(Ordering::Relaxed) == word {
                std::thread::park_timeout(park);
                park = (park * 2).min(MAX_PARK);
            }
            self.control.sleeping.store(false, Ordering::Relaxed);
            // No `idle = 0` here: after a park with nothing to do, park again (longer) rather
            // than spin; spinning pays off only right after work, when more is likely.
        }
    }

    /// Processes one batch; returns how many messages it took.
    fn step(&mut self, result: &mut Vec<u8>) -> usize {
        let Worker { handler, input, output, telemetry, backpressure, message_size, .. } = self;
        input.pop_batch(BATCH, |payload, received| {
            result.clear();
            if let Err(e) = handler.process(payload, result) {
                telemetry.failed.fetch_add(1, Ordering::Relaxed);
                telemetry.set_error(e);
                return;
            }
            if result.len() > *message_size {
                telemetry.set_error(result_too_large(result.len(), *message_size));
                telemetry.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let mut pushed = output.push(result, received.enqueued_ns);
            if let (false, Backpressure::WaitWithTimeout(limit)) = (pushed, *backpressure) {
                let deadline = Instant::now() + limit;
                while !pushed && Instant::now() < deadline {
                    std::thread::yield_now();
                    pushed = output.push(result, received.enqueued_ns);
                }
            }
            if pushed {
                telemetry.completed(ring::elapsed_ns(received.enqueued_ns, now_ns()), payload.len(), result.len());
            } else {
                telemetry.dropped.fetch_add(1, Ordering::Relaxed);
            }
        })
    }
}
