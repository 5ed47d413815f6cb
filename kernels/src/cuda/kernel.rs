//! `CudaKernel`: a built-in kernel as one persistent CUDA launch, driven like the CPU backend's
//! `RingKernel` (same lifecycle, same send/receive calls, same metrics).
//!
//! The kernel polls its input ring and its control word in mapped pinned memory, processes
//! each message with its whole block, writes the result to the output ring, and keeps its own
//! telemetry in the control block; the host only reads it. Lifecycle changes are written to
//! the control word; the device acknowledges the word it acts on (`seen`), and says when its
//! loop has returned (`exited`). Terminating waits for that with a bound: a kernel that does not
//! exit is reported Failed and its memory is left allocated (it may still write there).
//!
//! # Clocks
//!
//! Latency is measured on the device, in its `%globaltimer` nanoseconds, from enqueue to the
//! moment the result is about to be published. The host stamps each message's enqueue time in
//! that clock: its own `now_ns()` plus an offset calibrated by handshakes through the control
//! block (the host asks, the device writes its clock, the host takes the midpoint of its
//! round trip; the shortest of 8 rounds wins). The offset is calibrated at launch and at
//! activation, and again at most every 10 s when metrics are read; its error is at most half
//! that round trip (about a microsecond over PCIe), plus whatever the two clocks drift apart
//! between calibrations. A latency that comes out negative is counted as 0. `%globaltimer`'s
//! resolution depends on the GPU (down to 32 ns on recent parts, 1 µs on some).

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, CudaFunction, CudaStream, DriverError};
use ringside_shared::{KernelBackend, KernelKind, KernelState, RingKernelMetrics};

use super::device::{self, describe, Device, Entry};
use super::layout::{
    self, ControlBlock, MappedLayout, CONTROL_CALIBRATION_SHIFT, CONTROL_GENERATION_SHIFT, CONTROL_STOP_SHIFT,
    STOP_ABORT, STOP_DRAIN,
};
use super::memory::{self, DeviceMemory, MappedRing, PinnedMemory, Side};
use crate::builtin::MessageError;
use crate::ring::{self, Consumer, Producer};
use crate::runtime::{
    can_transition, now_ns, result_too_large, state_at, state_index, Backpressure, KernelError, LaunchOptions,
    Terminate,
};
use crate::telemetry::{drop_rate, latency_quantiles, BUCKETS};

/// How long a launched kernel may take to start polling.
const START_LIMIT: Duration = Duration::from_secs(10);
/// How long [`CudaKernel::deactivate`] waits for the device to see the change.
const QUIESCE_LIMIT: Duration = Duration::from_secs(1);
/// How long terminating waits for the loop to return (plus the backpressure wait, which the
/// device may be in).
const TERMINATE_LIMIT: Duration = Duration::from_secs(2);
const CALIBRATION_ROUNDS: usize = 8;
const CALIBRATION_ANSWER_LIMIT_NS: u64 = 2_000_000;
const RECALIBRATE_EVERY: Duration = Duration::from_secs(10);

/// A control word: see `layout::CONTROL_STOP_SHIFT` and its neighbours.
fn control_word(state: KernelState, stop: u64, calibration: u64, generation: u64) -> u64 {
    generation << CONTROL_GENERATION_SHIFT
        | (calibration & 0xffff) << CONTROL_CALIBRATION_SHIFT
        | (stop & 0xff) << CONTROL_STOP_SHIFT
        | state_index(state)
}

fn generation_of(word: u64) -> u64 {
    word >> CONTROL_GENERATION_SHIFT
}

/// What the device's last error word says, in the CPU twin's words.
fn decode_error(word: u64, message_size: usize) -> Option<String> {
    let arg = word & ((1 << 56) - 1);
    Some(match word >> 56 {
        0 => return None,
        layout::ERROR_NOT_WHOLE_F32 => MessageError::NotWholeF32(arg as usize).to_string(),
        layout::ERROR_STATS_SAMPLE => MessageError::StatsSample(f32::from_bits(arg as u32)).to_string(),
        layout::ERROR_SAXPY_NO_A => MessageError::SaxpyNoA.to_string(),
        layout::ERROR_SAXPY_UNPAIRED => MessageError::SaxpyUnpaired.to_string(),
        layout::ERROR_RESULT_TOO_LARGE => result_too_large(arg as usize, message_size),
        code => format!("the device reported error code {code} ({arg})"),
    })
}

/// A kernel's memory and stream, set up for a launch: the mapped control block and rings (the
/// host's ends of them), the device state, and the launch arguments pointing at all of it.
pub(crate) struct KernelMemory {
    pub device: Arc<Device>,
    pub input: Producer<MappedRing>,
    pub output: Consumer<MappedRing>,
    pub mapped: Arc<PinnedMemory>,
    pub state: DeviceMemory,
    pub stream: Arc<CudaStream>,
    args: [u64; 6],
}

impl KernelMemory {
    pub(crate) fn new(device: &Arc<Device>, options: &LaunchOptions) -> Result<KernelMemory, KernelError> {
        ring::check_sizes(options.queue_capacity, options.message_size)?;
        let layout = MappedLayout::new(options.queue_capacity, options.message_size);
        let mapped = Arc::new(PinnedMemory::new(device, layout).map_err(KernelError::Cuda)?);
        let stream = device
            .ctx
            .new_stream()
            .map_err(|e| KernelError::Cuda(format!("cannot create a stream: {}", describe(e))))?;
        let state = DeviceMemory::zeroed(device, &stream, layout::device_state_bytes(options.message_size))
            .map_err(KernelError::Cuda)?;
        let cb = mapped.control_block();
        cb.capacity_mask.store(options.queue_capacity as u64 - 1, Ordering::Relaxed);
        cb.slot_size.store(layout.slot_size as u64, Ordering::Relaxed);
        cb.message_size.store(options.message_size as u64, Ordering::Relaxed);
        let wait = match options.backpressure {
            Backpressure::DropAndCount => 0,
            Backpressure::WaitWithTimeout(limit) => limit.as_nanos().clamp(1, u64::MAX as u128) as u64,
        };
        cb.wait_ns.store(wait, Ordering::Relaxed);
        cb.min_latency_ns.store(u64::MAX, Ordering::Relaxed);
        let args = [
            mapped.device_address(0),
            mapped.device_address(layout.input_indices),
            mapped.device_address(layout.input_slots),
            mapped.device_address(layout.output_indices),
            mapped.device_address(layout.output_slots),
            state.address(),
        ];
        Ok(KernelMemory {
            device: device.clone(),
            input: Producer::new(MappedRing::new(mapped.clone(), Side::Input), options.message_size),
            output: Consumer::new(MappedRing::new(mapped.clone(), Side::Output), options.message_size),
            mapped,
            state,
            stream,
            args,
        })
    }

    pub(crate) fn control_block(&self) -> &ControlBlock {
        self.mapped.control_block()
    }

    /// Queues one launch of `function` (one block) on the kernel's stream.
    pub(crate) fn launch(&mut self, function: &CudaFunction) -> Result<(), DriverError> {
        self.device.ctx.bind_to_thread()?;
        let mut params: Vec<*mut c_void> = self.args.iter_mut().map(|a| (a as *mut u64).cast()).collect();
        // SAFETY: every ring kernel takes these six pointers (ring.cuh, RS_KERNEL_ENTRIES), all
        // to memory that outlives the launch (freed only once no kernel runs, memory.rs).
        unsafe {
            result::launch_kernel(
                function.cu_function(),
                (1, 1, 1),
                (layout::THREADS, 1, 1),
                0,
                self.stream.cu_stream(),
                &mut params,
            )
        }
    }

    /// Whether the kernel's stream still has work, has none, or failed.
    pub(crate) fn stream_status(&self) -> StreamStatus {
        if let Err(e) = self.device.ctx.bind_to_thread() {
            return StreamStatus::Failed(describe(e));
        }
        // SAFETY: a query of a stream we own.
        match unsafe { sys::cuStreamQuery(self.stream.cu_stream()) } {
            sys::CUresult::CUDA_SUCCESS => StreamStatus::Idle,
            sys::CUresult::CUDA_ERROR_NOT_READY => StreamStatus::Busy,
            error => StreamStatus::Failed(describe(DriverError(error))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StreamStatus {
    Busy,
    Idle,
    Failed(String),
}

struct Calibration {
    sequence: u64,
    at: Option<Instant>,
}

/// A launched CUDA kernel. Owned by one caller: it is the input's single producer and the
/// output's single consumer.
pub struct CudaKernel {
    id: String,
    kernel: KernelKind,
    options: LaunchOptions,
    memory: ManuallyDrop<KernelMemory>,
    /// Messages the host refused (input ring full); the device counts its own drops.
    host_dropped: AtomicU64,
    /// What the host found wrong (the kernel crashed, did not exit); wins over the device's.
    host_error: Mutex<Option<String>>,
    /// Device clock minus host clock (`now_ns`), wrapping.
    clock_offset: AtomicU64,
    /// Half the round trip of the calibration that set the offset: its error bound.
    clock_uncertainty_ns: AtomicU64,
    calibration: Mutex<Calibration>,
    /// Launched and not yet seen to have returned (counted by `memory::kernel_started`).
    running: AtomicBool,
    /// The kernel may still run: its memory is never freed.
    leaked: bool,
    started: Instant,
}

/// Work queued behind a persistent kernel on the same hardware queue never runs, and streams
/// share `CUDA_DEVICE_MAX_CONNECTIONS` queues (8 unless set before the driver starts): so at
/// most that many less one persistent kernels at a time.
fn max_persistent_kernels() -> usize {
    connections_limit(std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").ok().as_deref())
}

fn connections_limit(setting: Option<&str>) -> usize {
    let connections =
        setting.and_then(|v| v.trim().parse::<usize>().ok()).filter(|n| (1..=32).contains(n)).unwrap_or(8);
    connections.saturating_sub(1).max(1)
}

impl CudaKernel {
    /// Compiles (once per process) and launches the built-in kernel `kernel` (state Launched):
    /// it polls its rings but processes nothing until [`CudaKernel::activate`].
    pub fn launch(
        id: impl Into<String>,
        kernel: KernelKind,
        options: LaunchOptions,
    ) -> Result<CudaKernel, KernelError> {
        let id = id.into();
        ring::check_sizes(options.queue_capacity, options.message_size)?;
        let device = device::device().map_err(KernelError::CudaUnavailable)?;
        let function = device
            .function(kernel, Entry::Persistent)
            .ok_or_else(|| KernelError::Cuda(format!("no CUDA function for {}", kernel.as_str())))?
            .clone();
        let limit = max_persistent_kernels();
        if memory::running_kernels() >= limit {
            return Err(KernelError::Cuda(format!(
                "{limit} persistent kernels already run on this device: each holds one of its \
                 CUDA_DEVICE_MAX_CONNECTIONS hardware queues and one is kept for other work"
            )));
        }
        let mut memory = KernelMemory::new(&device, &options)?;
        memory.control_block().control.store(control_word(KernelState::Launched, 0, 0, 1), Ordering::Release);
        memory
            .launch(&function)
            .map_err(|e| KernelError::Cuda(format!("cannot launch {}: {}", kernel.as_str(), describe(e))))?;
        memory::kernel_started();
        let mut launched = CudaKernel {
            id,
            kernel,
            options,
            memory: ManuallyDrop::new(memory),
            host_dropped: AtomicU64::new(0),
            host_error: Mutex::new(None),
            clock_offset: AtomicU64::new(0),
            clock_uncertainty_ns: AtomicU64::new(u64::MAX),
            calibration: Mutex::new(Calibration { sequence: 0, at: None }),
            running: AtomicBool::new(true),
            leaked: false,
            started: Instant::now(),
        };
        let cb = launched.memory.control_block();
        let started = wait_until(START_LIMIT, || {
            cb.seen.load(Ordering::Acquire) != 0 || launched.memory.stream_status() != StreamStatus::Busy
        });
        if cb.seen.load(Ordering::Acquire) == 0 {
            let why = match launched.memory.stream_status() {
                StreamStatus::Failed(e) => format!("{kernel} failed as it started: {e}"),
                StreamStatus::Idle => format!("{kernel} returned as soon as it started"),
                StreamStatus::Busy if !started => {
                    // It may start later: tell it to return at once, and never free what it uses.
                    launched.abort_now();
                    launched.leaked = true;
                    format!("{kernel} did not start within {START_LIMIT:?}; is the GPU busy with other work?")
                }
                StreamStatus::Busy => format!("{kernel} did not answer"),
            };
            if !launched.leaked {
                launched.stopped();
            }
            return Err(KernelError::Cuda(why));
        }
        launched.calibrate();
        Ok(launched)
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The built-in kernel it runs.
    pub fn kernel(&self) -> KernelKind {
        self.kernel
    }

    pub fn state(&self) -> KernelState {
        state_at(self.cb().control.load(Ordering::Acquire) & 0xff)
    }

    fn cb(&self) -> &ControlBlock {
        self.memory.control_block()
    }

    /// Moves the lifecycle to `to` (setting the stop request when given); returns the new
    /// control word's generation.
    fn transition(&self, to: KernelState, stop: Option<u64>) -> Result<u64, KernelError> {
        let previous = self.cb().control.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            if !can_transition(state_at(w & 0xff), to) {
                return None;
            }
            let stop = stop.unwrap_or((w >> CONTROL_STOP_SHIFT) & 0xff);
            Some(control_word(to, stop, w >> CONTROL_CALIBRATION_SHIFT, generation_of(w) + 1))
        });
        match previous {
            Ok(w) => Ok(generation_of(w) + 1),
            Err(w) => Err(KernelError::InvalidTransition { id: self.id.clone(), from: state_at(w & 0xff), to }),
        }
    }

    /// Sets a final state whatever the state was.
    fn force(&self, to: KernelState) {
        let _ = self.cb().control.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            Some(control_word(to, w >> CONTROL_STOP_SHIFT, w >> CONTROL_CALIBRATION_SHIFT, generation_of(w) + 1))
        });
    }

    /// Asks the device to return at once, dropping what is queued, whatever the state is.
    fn abort_now(&self) {
        let _ = self.cb().control.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            Some(w & !(0xff << CONTROL_STOP_SHIFT) | STOP_ABORT << CONTROL_STOP_SHIFT)
        });
    }

    fn fail(&self, why: String) {
        *self.host_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        self.force(KernelState::Failed);
    }

    /// The loop has returned: its memory may be freed once no other kernel runs.
    fn stopped(&self) {
        if self.running.swap(false, Ordering::AcqRel) {
            memory::kernel_stopped();
        }
    }

    pub fn activate(&self) -> Result<(), KernelError> {
        self.transition(KernelState::Active, None)?;
        // The device polls without pausing now: the best moment for a tight calibration.
        self.calibrate();
        Ok(())
    }

    /// Stops processing: when this returns, the device has finished the message it was in and
    /// takes no further one until [`CudaKernel::activate`] (messages sent meanwhile stay
    /// queued). A device that does not answer within a second is not waited for.
    pub fn deactivate(&self) -> Result<(), KernelError> {
        let generation = self.transition(KernelState::Deactivated, None)?;
        let cb = self.cb();
        wait_until(QUIESCE_LIMIT, || {
            generation_of(cb.seen.load(Ordering::Acquire)).wrapping_sub(generation) as u32 as i32 >= 0
                || !self.running.load(Ordering::Acquire)
        });
        Ok(())
    }

    /// Stops the kernel and waits for its loop to return (draining first with
    /// [`Terminate::Drain`]); a kernel that does not return in time is Failed.
    pub fn terminate(&mut self, how: Terminate) -> Result<(), KernelError> {
        let stop = if how == Terminate::Drain { STOP_DRAIN } else { STOP_ABORT };
        self.transition(KernelState::Terminating, Some(stop))?;
        let limit = TERMINATE_LIMIT
            + match self.options.backpressure {
                Backpressure::WaitWithTimeout(wait) => wait,
                Backpressure::DropAndCount => Duration::ZERO,
            };
        let cb = self.cb();
        wait_until(limit, || {
            cb.exited.load(Ordering::Acquire) == 1 || self.memory.stream_status() != StreamStatus::Busy
        });
        // The loop returns right after saying so.
        wait_until(Duration::from_secs(1), || self.memory.stream_status() != StreamStatus::Busy);
        match self.memory.stream_status() {
            StreamStatus::Idle => {
                self.stopped();
                self.force(KernelState::Terminated);
            }
            StreamStatus::Failed(e) => {
                self.stopped();
                self.fail(format!("the kernel failed: {e}"));
            }
            StreamStatus::Busy => {
                // A drain that does not finish becomes an abort: the device drops what is
                // queued and returns as soon as it polls again.
                if how == Terminate::Drain {
                    self.abort_now();
                    wait_until(Duration::from_secs(1), || self.memory.stream_status() != StreamStatus::Busy);
                    if self.memory.stream_status() != StreamStatus::Busy {
                        self.stopped();
                        self.fail(format!(
                            "the kernel did not drain within {limit:?} of terminate; the rest was dropped"
                        ));
                        return Ok(());
                    }
                }
                self.leaked = true;
                self.fail(format!("the kernel did not exit within {limit:?} of terminate; its memory stays allocated"));
            }
        }
        Ok(())
    }

    /// A crashed or vanished kernel is Failed, with the reason.
    fn check_health(&self) {
        if !self.running.load(Ordering::Acquire) || self.state() == KernelState::Terminating {
            return;
        }
        match self.memory.stream_status() {
            StreamStatus::Busy => {}
            StreamStatus::Idle => {
                self.stopped();
                self.fail("the kernel returned without being told to".into());
            }
            StreamStatus::Failed(e) => {
                self.stopped();
                self.fail(format!("the kernel failed: {e}"));
            }
        }
    }

    /// The host's clock in the device's: what enqueue times are stamped with.
    #[inline]
    fn device_now(&self) -> u64 {
        now_ns().wrapping_add(self.clock_offset.load(Ordering::Relaxed))
    }

    /// The error bound of the enqueue stamps' clock offset (half the best calibration round
    /// trip); `None` before a calibration succeeded.
    pub fn clock_uncertainty_ns(&self) -> Option<u64> {
        Some(self.clock_uncertainty_ns.load(Ordering::Relaxed)).filter(|v| *v != u64::MAX)
    }

    /// Measures the device clock's offset from the host's (see the module doc). Skipped when
    /// another calibration is under way; a round the device does not answer in 2 ms ends it.
    fn calibrate(&self) {
        let Ok(mut calibration) = self.calibration.try_lock() else {
            return;
        };
        let cb = self.cb();
        let mut best: Option<(u64, u64)> = None;
        for _ in 0..CALIBRATION_ROUNDS {
            calibration.sequence = (calibration.sequence + 1) & 0xffff;
            let sequence = calibration.sequence;
            let asked = now_ns();
            let _ = cb.control.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some(w & !(0xffff << CONTROL_CALIBRATION_SHIFT) | sequence << CONTROL_CALIBRATION_SHIFT)
            });
            let answered = loop {
                if cb.calibration_reply.load(Ordering::Acquire) == sequence {
                    break true;
                }
                if now_ns() - asked > CALIBRATION_ANSWER_LIMIT_NS {
                    break false;
                }
                std::hint::spin_loop();
            };
            if !answered {
                break;
            }
            let round_trip = now_ns() - asked;
            let device = cb.calibration_gpu_ns.load(Ordering::Relaxed);
            let offset = device.wrapping_sub(asked + round_trip / 2);
            if best.is_none_or(|(shortest, _)| round_trip < shortest) {
                best = Some((round_trip, offset));
            }
        }
        if let Some((round_trip, offset)) = best {
            self.clock_offset.store(offset, Ordering::Relaxed);
            self.clock_uncertainty_ns.store(round_trip / 2, Ordering::Relaxed);
        }
        calibration.at = Some(Instant::now());
    }

    fn calibrate_if_due(&self) {
        let due = self.calibration.try_lock().is_ok_and(|c| c.at.is_none_or(|at| at.elapsed() >= RECALIBRATE_EVERY));
        let live = matches!(self.state(), KernelState::Launched | KernelState::Active | KernelState::Deactivated);
        if due && live && self.running.load(Ordering::Acquire) {
            self.calibrate();
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
        let now = self.device_now();
        if self.memory.input.push(payload, now) {
            return Ok(());
        }
        let outcome = match self.options.backpressure {
            Backpressure::DropAndCount => Err(KernelError::Full),
            Backpressure::WaitWithTimeout(limit) => {
                let deadline = Instant::now() + limit;
                loop {
                    std::thread::yield_now();
                    let now = self.device_now();
                    if self.memory.input.push(payload, now) {
                        break Ok(());
                    }
                    if Instant::now() >= deadline {
                        break Err(KernelError::Timeout(limit));
                    }
                }
            }
        };
        if outcome.is_err() {
            self.host_dropped.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }

    /// Takes one result, if one is ready; returns its length.
    pub fn try_recv(&mut self, out: &mut [u8]) -> Option<usize> {
        self.memory.output.pop(out).map(|r| r.len)
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
        }
    }

    /// Drops every waiting result; returns how many.
    pub fn discard_output(&mut self) -> usize {
        self.memory.output.discard()
    }

    /// The kernel's telemetry (written by the device) in the daemon's vocabulary.
    pub fn metrics(&self) -> RingKernelMetrics {
        self.check_health();
        self.calibrate_if_due();
        let cb = self.cb();
        let load = |v: &AtomicU64| v.load(Ordering::Relaxed);
        // The device keeps counting while these are read: each counter is read once, and all of
        // them back to back before the histogram, so a message completing meanwhile rarely
        // shows in some and not others (the percentiles are kept within min and max anyway).
        let processed = load(&cb.processed);
        let dropped = load(&cb.dropped) + self.host_dropped.load(Ordering::Relaxed);
        let total = load(&cb.total_latency_ns);
        let min = Some(load(&cb.min_latency_ns)).filter(|v| *v != u64::MAX && processed > 0);
        let max = load(&cb.max_latency_ns);
        let (bytes_in, bytes_out) = (load(&cb.bytes_in), load(&cb.bytes_out));
        let counts: Vec<u64> = cb.histogram.iter().map(load).collect();
        debug_assert_eq!(counts.len(), BUCKETS);
        let q = latency_quantiles(&counts, min, max);
        let last_error = self
            .host_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .or_else(|| decode_error(load(&cb.last_error), self.options.message_size));
        RingKernelMetrics {
            id: self.id.clone(),
            kernel: self.kernel.as_str().to_string(),
            backend: KernelBackend::Cuda,
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
            input_queue_depth: self.memory.input.len() as u32,
            input_queue_capacity: self.options.queue_capacity as u32,
            output_queue_depth: self.memory.output.len() as u32,
            output_queue_capacity: self.options.queue_capacity as u32,
            last_error,
            gpu_memory_used: self.memory.state.bytes() as u64,
            host_memory_bytes: self.memory.mapped.layout().total as u64,
            bytes_in,
            bytes_out,
            uptime_ms: self.started.elapsed().as_millis() as u64,
            drop_rate: drop_rate(processed, dropped),
            output_stats: None,
        }
    }
}

impl Drop for CudaKernel {
    fn drop(&mut self) {
        if self.running.load(Ordering::Acquire) && !self.leaked && self.terminate(Terminate::Abort).is_err() {
            // Not a lifecycle step from here (e.g. Failed while running): stop it anyway.
            self.abort_now();
            wait_until(TERMINATE_LIMIT, || self.memory.stream_status() != StreamStatus::Busy);
            if self.memory.stream_status() == StreamStatus::Busy {
                self.leaked = true;
            } else {
                self.stopped();
            }
        }
        if !self.leaked {
            // SAFETY: dropped once, here; the kernel no longer runs.
            unsafe { ManuallyDrop::drop(&mut self.memory) };
        }
    }
}

/// Polls `done` every 50 µs until it holds or `limit` passes; returns whether it held.
fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persistent_kernels_leave_a_hardware_queue_free() {
        assert_eq!(connections_limit(None), 7);
        assert_eq!(connections_limit(Some("32")), 31);
        assert_eq!(connections_limit(Some("1")), 1, "never zero");
        assert_eq!(connections_limit(Some("many")), 7, "an unreadable setting is the driver's default");
    }

    #[test]
    fn control_words_pack_their_fields() {
        let w = control_word(KernelState::Active, STOP_DRAIN, 0x1_2345, 7);
        assert_eq!(state_at(w & 0xff), KernelState::Active);
        assert_eq!((w >> CONTROL_STOP_SHIFT) & 0xff, STOP_DRAIN);
        assert_eq!((w >> CONTROL_CALIBRATION_SHIFT) & 0xffff, 0x2345, "16 bits of calibration");
        assert_eq!(generation_of(w), 7);
    }

    #[test]
    fn device_errors_read_like_the_cpu_twins() {
        assert_eq!(decode_error(0, 64), None);
        assert_eq!(
            decode_error(layout::ERROR_NOT_WHOLE_F32 << 56 | 7, 64).unwrap(),
            "7 bytes is not a whole number of f32 values"
        );
        let nan = f32::NAN.to_bits() as u64;
        assert_eq!(
            decode_error(layout::ERROR_STATS_SAMPLE << 56 | nan, 64).unwrap(),
            "stats takes finite, non-negative samples; got NaN"
        );
        assert_eq!(
            decode_error(layout::ERROR_STATS_SAMPLE << 56 | (-1.5f32).to_bits() as u64, 64).unwrap(),
            "stats takes finite, non-negative samples; got -1.5"
        );
        assert_eq!(decode_error(layout::ERROR_SAXPY_NO_A << 56, 64).unwrap(), "saxpy needs a, then x, y pairs");
        assert_eq!(decode_error(layout::ERROR_SAXPY_UNPAIRED << 56, 64).unwrap(), "saxpy needs x, y pairs after a");
        assert_eq!(
            decode_error(layout::ERROR_RESULT_TOO_LARGE << 56 | 28, 16).unwrap(),
            "result of 28 bytes exceeds the 16-byte slot"
        );
    }

    #[test]
    fn without_cuda_launching_is_an_error_not_a_panic() {
        match CudaKernel::launch("k", KernelKind::Echo, LaunchOptions::default()) {
            Err(KernelError::CudaUnavailable(why)) => assert!(!why.is_empty()),
            Err(other) => panic!("a machine without CUDA should say so, not {other}"),
            Ok(mut kernel) => {
                // A GPU node: the launch is real; leave it clean.
                kernel.terminate(Terminate::Abort).unwrap();
            }
        }
    }
}
