//! `RingQueue`: a bounded single-producer/single-consumer ring of fixed-size byte slots.
//!
//! # Memory model
//!
//! `head` (next slot to write) is written only by the producer, `tail` (next slot to read)
//! only by the consumer; each lives on its own cache line so the two sides do not false-share.
//! The producer writes a slot's bytes, then publishes it with `head.store(Release)`; the
//! consumer's `head.load(Acquire)` makes those bytes visible before it reads them. Symmetrically
//! the consumer frees slots with `tail.store(Release)` after reading, and the producer's
//! `tail.load(Acquire)` orders its next write of a slot after that read. Each side keeps a
//! private copy of the other side's index and reloads it only when the ring looks full (or
//! empty), so the shared cache lines move between cores once per batch, not once per message.
//! Indices are free-running `u64`s (they do not wrap in practice); a slot is `index & mask`.
//!
//! Every slot holds an 8-byte header followed by up to `message_size` payload bytes; no
//! message allocates. The header packs the payload length (16 bits) with the enqueue time
//! (48 bits of nanoseconds, wrapping every 3.2 days; [`elapsed_ns`] subtracts modulo 2^48).
//! Keeping it to one word matters: a cross-core queue is bound by the cache lines it moves,
//! so the header is paid for in throughput on every message.
//!
//! # Slot flags (rings between threads)
//!
//! Polling `head` costs the consumer a cache-line transfer per message whenever it keeps up
//! with the producer: each store to `head` takes the line away, each load brings it back. On a
//! [`HeapRing`] ([`RingMemory::SLOT_FLAGS`]) the header itself says whether a slot is
//! published: bit 0 of the enqueue time carries the parity of the slot's lap around the ring
//! (`1` on laps 0, 2, 4…, `0` on laps 1, 3…; fresh slots are zero, so unpublished). The
//! producer writes the payload, then the header with `Release`; the consumer loads the header
//! with `Acquire` and takes the slot when its flag matches the lap it expects. It never reads
//! `head`, so the only lines that move towards it are the slots it reads anyway, several
//! messages to a line. Freeing slots is unchanged (`tail`, read by the producer only when its
//! cached copy says full), and the producer still stores `head` after each publication, for
//! [`Consumer::len`] and for wake-up protocols that pair it with a fence. The price is one bit
//! of the clock: enqueue times on these rings are even nanoseconds.
//! Rings in device memory keep the index protocol (their device side polls `head`).
//!
//! # Batched release (rings between threads)
//!
//! When the producer is the faster side the ring stays full, and every slot the consumer
//! frees is taken at once: the producer polls `tail` while the consumer stores it, so the
//! `tail` line moves twice per message, and the producer writes into the lines the consumer
//! is reading. On a flagged ring both sides therefore work in batches of `refill` slots
//! (64, or an eighth of a smaller ring): the consumer stores `tail` when it has read a whole
//! batch (and whenever it finds the ring empty, so a drained ring is all free), and a
//! producer that found the ring full writes again only once a batch is free. The `tail` line
//! then moves once per batch, and the producer writes only lines the consumer has left. The
//! price: slots read but not yet released look taken to the producer (at most a batch less
//! than the ring's capacity, while the consumer is mid-batch). `cargo xtask bench ring`, 2-core
//! Xeon VM: 138 → 211 M messages/s.
//!
//! Where the indices and slots live is [`RingMemory`]'s business: the heap for two threads
//! ([`ring`]), or pinned memory mapped into a GPU, whose kernel is the other end (the CUDA
//! backend). The ends are generic over it, so the heap ring compiles to the same code as if
//! it were the only kind.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes before each slot's payload: length and enqueue time, packed.
pub const SLOT_HEADER: usize = 8;
/// Largest message a ring carries (its length must fit the header's 16 bits).
pub const MAX_MESSAGE: usize = 65_535;
pub(crate) const TIME_BITS: u32 = 48;
pub(crate) const TIME_MASK: u64 = (1 << TIME_BITS) - 1;

/// Nanoseconds from a header's enqueue time (48 bits) to `now_ns`.
#[inline]
pub fn elapsed_ns(enqueued: u64, now_ns: u64) -> u64 {
    now_ns.wrapping_sub(enqueued) & TIME_MASK
}

/// Where a ring's two indices and its slots live: [`HeapRing`] for rings between threads, or
/// memory a device reaches too (the CUDA backend's mapped pinned memory). Producer and consumer
/// are generic over it, so each kind is compiled on its own and the heap ring pays nothing for
/// the other.
///
/// # Safety
/// `slots()` must point to `(mask() + 1) * slot_size()` bytes, 8-byte aligned, that stay valid
/// (and are touched by nothing but this ring's two ends) while `self` lives; `slot_size()` must
/// be a multiple of 8 of at least [`SLOT_HEADER`] + the ends' message size; `mask() + 1` must be
/// a power of two. `head` and `tail` start at 0. With `SLOT_FLAGS`, `slots()` must also be
/// aligned for `AtomicU64` and zeroed at the start.
pub unsafe trait RingMemory: Send + Sync {
    /// Whether slots carry their lap's flag in the header's bit 0 and the consumer detects
    /// published slots from it (see the module's "Slot flags") instead of loading `head`.
    const SLOT_FLAGS: bool = false;
    /// Next slot to write; written only by the producer.
    fn head(&self) -> &AtomicU64;
    /// Next slot to read; written only by the consumer.
    fn tail(&self) -> &AtomicU64;
    fn slots(&self) -> *mut u8;
    fn mask(&self) -> u64;
    fn slot_size(&self) -> usize;
}

#[repr(align(128))]
struct CacheLine(AtomicU64);

/// 128 bytes of slot memory, aligned as [`CacheLine`].
#[repr(C, align(128))]
struct SlotLines([UnsafeCell<u64>; 16]);

// Slot headers of a HeapRing are viewed as AtomicU64 in place: its words must be aligned for it.
const _: () = assert!(std::mem::align_of::<u64>() == std::mem::align_of::<AtomicU64>());

/// A ring's memory on the heap, shared by two threads.
pub struct HeapRing {
    head: CacheLine,
    tail: CacheLine,
    /// Slot memory in whole cache lines (pairs of them, as `CacheLine`), so slot headers (at
    /// multiples of 8 bytes) are aligned for `AtomicU64` and slots start on a line.
    slots: Box<[SlotLines]>,
    mask: u64,
    slot_size: usize,
}

// SAFETY: slot bytes are written only by the one producer while the slot is free and read only
// by the one consumer after it is published; the Release/Acquire pairs above order the two.
unsafe impl Sync for HeapRing {}
// SAFETY: the ring owns its allocation and shares it only as described for Sync.
unsafe impl Send for HeapRing {}

// SAFETY: `slots` holds at least capacity * slot_size bytes, zeroed, in u64 words from a
// 128-byte boundary (built by `ring`, which checks the sizes and rounds slot_size to a multiple
// of 8), so every header is aligned.
unsafe impl RingMemory for HeapRing {
    const SLOT_FLAGS: bool = true;
    #[inline(always)]
    fn head(&self) -> &AtomicU64 {
        &self.head.0
    }
    #[inline(always)]
    fn tail(&self) -> &AtomicU64 {
        &self.tail.0
    }
    #[inline(always)]
    fn slots(&self) -> *mut u8 {
        // SlotLines is an array of UnsafeCell<u64>, which has the layout of u64.
        UnsafeCell::raw_get(self.slots.as_ptr().cast::<UnsafeCell<u64>>()).cast()
    }
    #[inline(always)]
    fn mask(&self) -> u64 {
        self.mask
    }
    #[inline(always)]
    fn slot_size(&self) -> usize {
        self.slot_size
    }
}

/// Where the slots are, copied into each end at construction so the message path reads them
/// from its own struct, not through the shared memory's pointer.
#[derive(Clone, Copy)]
struct Geometry {
    slots: *mut u8,
    mask: u64,
    slot_size: usize,
    /// A flagged ring's consumer publishes freed slots when its next index is a multiple of
    /// `batch_mask + 1`, the producer's [`refill`] (a power of two: 64 slots, or an eighth of
    /// a smaller ring); a power of two of at least 8 slots of 8-byte multiples spans whole
    /// 64-byte lines, as slot memory starts on one.
    batch_mask: u64,
}

impl Geometry {
    fn of<M: RingMemory>(memory: &M) -> Geometry {
        Geometry {
            slots: memory.slots(),
            mask: memory.mask(),
            slot_size: memory.slot_size(),
            batch_mask: refill(memory.mask() + 1).max(1) - 1,
        }
    }

    #[inline(always)]
    fn capacity(&self) -> u64 {
        self.mask + 1
    }

    /// Pointer to slot `index`'s first byte.
    #[inline(always)]
    fn slot(&self, index: u64) -> *mut u8 {
        // SAFETY: `index & mask` < capacity and the memory holds capacity * slot_size bytes.
        unsafe { self.slots.add((index & self.mask) as usize * self.slot_size) }
    }

    /// The flag a slot's header carries once message `index` is in it: 1 on even laps, 0 on
    /// odd ones (fresh, zeroed slots hold 0: unpublished for lap 0).
    #[inline(always)]
    fn lap_flag(&self, index: u64) -> u64 {
        u64::from(index & self.capacity() == 0)
    }

    /// Whether slot `index` starts a consumer's release batch (see `batch_mask`).
    #[inline(always)]
    fn starts_batch(&self, index: u64) -> bool {
        index & self.batch_mask == 0
    }

    /// Slot `index`'s header as an atomic word.
    ///
    /// # Safety
    /// Only for memories with `SLOT_FLAGS`, whose slots are aligned for `AtomicU64`.
    #[inline(always)]
    unsafe fn header(&self, index: u64) -> &AtomicU64 {
        // SAFETY: in bounds (see `slot`), aligned per the contract, and headers of flagged rings
        // are only accessed through this atomic view.
        unsafe { AtomicU64::from_ptr(self.slot(index).cast()) }
    }
}

/// Packs a slot header: payload length and the enqueue time's low 48 bits.
#[inline(always)]
pub(crate) fn pack_header(len: usize, enqueued_ns: u64) -> u64 {
    (len as u64) << TIME_BITS | (enqueued_ns & TIME_MASK)
}

/// Free slots a full ring needs before its producer writes again, and the slots a flagged
/// ring's consumer frees at once: an eighth of the ring, at most 64; a power of two (0 for
/// rings under 8 slots, which refill from one). `cargo xtask bench ring` on 1024 slots: 16
/// measured slower than 64; 128 and 256 no faster.
#[inline(always)]
pub(crate) fn refill(capacity: u64) -> u64 {
    (capacity / 8).min(64)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    #[error("capacity {0} is not a power of two between 2 and 2^24")]
    Capacity(usize),
    #[error("message size {0} is not between 1 and 65535 bytes")]
    MessageSize(usize),
}

/// Bytes per slot: the header and the payload, rounded to 8 so headers are naturally aligned.
pub(crate) fn slot_size(message_size: usize) -> usize {
    (SLOT_HEADER + message_size).div_ceil(8) * 8
}

/// Checks a ring's capacity (a power of two from 2 to 2^24) and message size (1 to 65535).
pub fn check_sizes(capacity: usize, message_size: usize) -> Result<(), RingError> {
    if !capacity.is_power_of_two() || !(2..=1 << 24).contains(&capacity) {
        return Err(RingError::Capacity(capacity));
    }
    if !(1..=MAX_MESSAGE).contains(&message_size) {
        return Err(RingError::MessageSize(message_size));
    }
    Ok(())
}

/// Creates a ring of `capacity` slots of `message_size` payload bytes.
pub fn ring(capacity: usize, message_size: usize) -> Result<(Producer, Consumer), RingError> {
    let shared = Arc::new(HeapRing::new(capacity, message_size)?);
    Ok((Producer::new(shared.clone(), message_size), Consumer::new(shared, message_size)))
}

impl HeapRing {
    fn new(capacity: usize, message_size: usize) -> Result<HeapRing, RingError> {
        check_sizes(capacity, message_size)?;
        let slot_size = slot_size(message_size);
        Ok(HeapRing {
            head: CacheLine(AtomicU64::new(0)),
            tail: CacheLine(AtomicU64::new(0)),
            slots: (0..(capacity * slot_size).div_ceil(128))
                .map(|_| SlotLines(std::array::from_fn(|_| UnsafeCell::new(0))))
                .collect(),
            mask: capacity as u64 - 1,
            slot_size,
        })
    }
}

/// The writing end. Its methods take `&mut self`: one thread produces, and the compiler may
/// keep the end's own indices in registers across a loop of pushes.
pub struct Producer<M: RingMemory = HeapRing> {
    shared: Arc<M>,
    geometry: Geometry,
    head: u64,
    tail_cache: u64,
    message_size: usize,
}

// SAFETY: `geometry.slots` points into the memory the `Arc` keeps alive; each end is one
// thread's at a time (its methods take `&mut self`), as without the copied pointer.
unsafe impl<M: RingMemory> Send for Producer<M> {}
// SAFETY: as for the producer: the consumer end is one thread's at a time.
unsafe impl<M: RingMemory> Send for Consumer<M> {}

/// The reading end; `&mut self` like the producer: one thread consumes.
pub struct Consumer<M: RingMemory = HeapRing> {
    shared: Arc<M>,
    geometry: Geometry,
    tail: u64,
    /// The `tail` last stored to the shared memory (see [`Consumer::take`]).
    tail_published: u64,
    /// Messages below this index are known to be published: the last `head` loaded (index
    /// protocol), or one past the last slot of a batch seen published (slot flags: see
    /// [`Consumer::look_ahead`]).
    head_cache: u64,
    message_size: usize,
}

/// A message as read from the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub len: usize,
    /// When the producer enqueued it: the low 48 bits of its clock (ns); see [`elapsed_ns`].
    pub enqueued_ns: u64,
}

impl<M: RingMemory> Producer<M> {
    /// The producing end of `memory`, whose head is 0. Only one may exist per ring.
    pub(crate) fn new(memory: Arc<M>, message_size: usize) -> Self {
        Producer { geometry: Geometry::of(&*memory), shared: memory, head: 0, tail_cache: 0, message_size }
    }

    #[inline]
    pub fn capacity(&self) -> usize {
        self.geometry.capacity() as usize
    }

    pub fn message_size(&self) -> usize {
        self.message_size
    }

    /// Free slots, reloading the consumer's index only when the cached one says full. A ring
    /// found full stays full until [`refill`] slots are free (see the module's "Batched
    /// release").
    #[inline]
    fn free(&mut self) -> u64 {
        let capacity = self.geometry.capacity();
        let mut free = capacity - (self.head - self.tail_cache);
        if free == 0 {
            self.tail_cache = self.shared.tail().load(Ordering::Acquire);
            free = capacity - (self.head - self.tail_cache);
            if free < refill(capacity) {
                // Cached as full again, so the next call loads `tail` anew.
                self.tail_cache = self.head - capacity;
                return 0;
            }
        }
        free
    }

    /// Messages waiting (as the producer sees it: on a flagged ring, with those the consumer has
    /// read but not released yet, at most a `refill` batch; see the module's "Batched release").
    #[inline]
    pub fn len(&self) -> usize {
        self.head.saturating_sub(self.shared.tail().load(Ordering::Acquire)) as usize
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes message `index` into its slot; with slot flags this also publishes it.
    #[inline]
    fn write(&self, index: u64, payload: &[u8], enqueued_ns: u64) {
        let slot = self.geometry.slot(index);
        // SAFETY: the slot at `index` is free (index < tail + capacity, checked by the caller)
        // so the consumer does not read its payload; it spans `slot_size` bytes inside `slots`,
        // and `payload.len() <= message_size` (checked by the callers).
        unsafe {
            copy_words(payload.as_ptr(), slot.add(SLOT_HEADER), payload.len());
            if M::SLOT_FLAGS {
                let header = pack_header(payload.len(), enqueued_ns & !1) | self.geometry.lap_flag(index);
                self.geometry.header(index).store(header, Ordering::Release);
            } else {
                slot.cast::<u64>().write_unaligned(pack_header(payload.len(), enqueued_ns));
            }
        }
    }

    /// Enqueues one message; `false` when the ring is full. Panics if `payload` is longer than
    /// the ring's message size (a caller bug, not a runtime condition).
    #[inline]
    pub fn push(&mut self, payload: &[u8], enqueued_ns: u64) -> bool {
        assert!(payload.len() <= self.message_size, "payload of {} bytes exceeds the slot", payload.len());
        if self.free() == 0 {
            return false;
        }
        self.write(self.head, payload, enqueued_ns);
        self.head += 1;
        self.shared.head().store(self.head, Ordering::Release);
        true
    }

    /// Enqueues as many of `payloads` as fit, publishing them with one store; returns how many.
    pub fn push_batch<'a>(&mut self, payloads: impl IntoIterator<Item = &'a [u8]>, enqueued_ns: u64) -> usize {
        let free = self.free();
        let head = self.head;
        let mut written = 0u64;
        for payload in payloads.into_iter().take(free as usize) {
            assert!(payload.len() <= self.message_size, "payload of {} bytes exceeds the slot", payload.len());
            self.write(head + written, payload, enqueued_ns);
            written += 1;
        }
        if written > 0 {
            self.head = head + written;
            self.shared.head().store(self.head, Ordering::Release);
        }
        written as usize
    }
}

impl<M: RingMemory> Consumer<M> {
    /// The consuming end of `memory`, whose tail is 0. Only one may exist per ring.
    pub(crate) fn new(memory: Arc<M>, message_size: usize) -> Self {
        Consumer {
            geometry: Geometry::of(&*memory),
            shared: memory,
            tail: 0,
            tail_published: 0,
            head_cache: 0,
            message_size,
        }
    }

    #[inline]
    pub fn capacity(&self) -> usize {
        self.geometry.capacity() as usize
    }

    pub fn message_size(&self) -> usize {
        self.message_size
    }

    /// Whether message `index` is below the producer's `head` (index protocol only): the
    /// cached copy answers until `index` reaches it, then `head` is loaded again.
    #[inline]
    fn below_head(&mut self, index: u64) -> bool {
        if index >= self.head_cache {
            self.head_cache = self.shared.head().load(Ordering::Acquire);
        }
        index < self.head_cache
    }

    /// Message `index`'s header if it is published (slot-flag protocol only).
    #[inline(always)]
    fn published(&self, index: u64) -> Option<u64> {
        // SAFETY: called only when M::SLOT_FLAGS.
        let header = unsafe { self.geometry.header(index) }.load(Ordering::Acquire);
        (header & 1 == self.geometry.lap_flag(index)).then_some(header)
    }

    /// At the first slot of a batch (see [`refill`]), whether the batch's last slot is
    /// published (slot flags only). The producer publishes slots in order, each header with
    /// `Release`, so loading the last one with `Acquire` makes every slot before it visible:
    /// the batch is then read without checking each flag, and its lines are prefetched all at
    /// once, so the transfers from the producer's core overlap instead of coming one line at
    /// a time (`cargo xtask bench ring`: 211 → about 290 M messages/s). Only at a batch's first
    /// slot, and only published lines: a consumer that keeps up with the producer probes one
    /// line ahead per batch, never the lines the producer is writing.
    #[inline(always)]
    fn look_ahead(&mut self, index: u64) -> bool {
        let geometry = self.geometry;
        let last = index + geometry.batch_mask;
        if last == index || index & geometry.batch_mask != 0 || self.published(last).is_none() {
            return false;
        }
        self.head_cache = last + 1;
        #[cfg(target_arch = "x86_64")]
        {
            // One slot per 64-byte line (slots of 64 bytes or more: each).
            let step = (64 / geometry.slot_size).max(1);
            for k in (0..=geometry.batch_mask as usize).step_by(step) {
                // SAFETY: a prefetch only hints the cache; the address is a slot's.
                unsafe {
                    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                    _mm_prefetch::<_MM_HINT_T0>(geometry.slot(index + k as u64).cast_const().cast());
                }
            }
        }
        true
    }

    /// Messages waiting, from the published `head` (a flagged ring's consumer may already
    /// have taken messages whose `head` store it has not seen yet: then 0).
    #[inline]
    pub fn len(&self) -> usize {
        self.shared.head().load(Ordering::Acquire).saturating_sub(self.tail) as usize
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Message `index`'s header when it is published, else `None`.
    #[inline(always)]
    fn header_if_published(&mut self, index: u64) -> Option<u64> {
        if M::SLOT_FLAGS {
            if index < self.head_cache || self.look_ahead(index) {
                // SAFETY: flagged rings' headers are atomic words (see `published`).
                let header = unsafe { self.geometry.header(index) };
                // Relaxed: a later slot's header, loaded with Acquire, made this one visible.
                return Some(header.load(Ordering::Relaxed) & !1);
            }
            self.published(index).map(|header| header & !1)
        } else if self.below_head(index) {
            // SAFETY: published (index < head, loaded with Acquire) and not rewritten before
            // `tail` passes it; the header was written by the producer (host or device).
            Some(unsafe { self.geometry.slot(index).cast::<u64>().read_unaligned() })
        } else {
            None
        }
    }

    /// Takes message `tail` if it is published: `f` gets its payload where it lies in the ring
    /// (clamped to the message size) and its metadata, then the slot is freed.
    ///
    /// On a flagged ring freed slots are published (`tail` stored) a [`refill`] at a time, and
    /// whenever the ring is found empty (see the module's "Batched release").
    #[inline(always)]
    fn take<R>(&mut self, f: impl FnOnce(&[u8], Received) -> R) -> Option<R> {
        // What the message path needs is read before the header's Acquire load: after it the
        // compiler may not reuse what it read of `self`, and would load it again.
        let (tail, geometry, message_size) = (self.tail, self.geometry, self.message_size);
        let Some(header) = self.header_if_published(tail) else {
            if M::SLOT_FLAGS && self.tail_published != tail {
                self.publish_tail(tail);
            }
            return None;
        };
        let result = f(Self::payload(geometry, message_size, tail, header), Self::received(header));
        self.tail = tail + 1;
        if !M::SLOT_FLAGS || geometry.starts_batch(tail + 1) {
            self.publish_tail(tail + 1);
        }
        Some(result)
    }

    /// Message `index`'s payload in its slot, from its header.
    #[inline(always)]
    fn payload<'a>(geometry: Geometry, message_size: usize, index: u64, header: u64) -> &'a [u8] {
        let len = ((header >> TIME_BITS) as usize).min(message_size);
        // SAFETY: the slot is published (its flagged header, or `head`, was loaded with Acquire
        // before its header was read) and is not rewritten before `tail` passes it, which the
        // callers do only after the last use of the slice; `len` <= message_size keeps it
        // inside the slot.
        unsafe { std::slice::from_raw_parts(geometry.slot(index).add(SLOT_HEADER), len) }
    }

    #[inline(always)]
    fn received(header: u64) -> Received {
        Received { len: (header >> TIME_BITS) as usize, enqueued_ns: header & TIME_MASK }
    }

    /// Dequeues one message into `out` (truncated to `out`'s length; `len` tells the full size).
    #[inline]
    pub fn pop(&mut self, out: &mut [u8]) -> Option<Received> {
        self.take(|payload, received| {
            let copied = payload.len().min(out.len());
            // SAFETY: `copied` bytes lie inside both `payload` and `out`, which do not overlap
            // (one is ring memory, the other the caller's exclusive buffer).
            unsafe { copy_words(payload.as_ptr(), out.as_mut_ptr(), copied) };
            received
        })
    }

    /// Dequeues one message without copying it: `f` reads the payload where it lies in the
    /// ring (the slot stays the consumer's until `f` returns).
    #[inline]
    pub fn pop_in_place<R>(&mut self, f: impl FnOnce(&[u8], Received) -> R) -> Option<R> {
        self.take(f)
    }

    /// Frees every slot below `tail` for the producer.
    #[inline(always)]
    fn publish_tail(&mut self, tail: u64) {
        self.tail_published = tail;
        self.shared.tail().store(tail, Ordering::Release);
    }

    /// Hands up to `max` waiting messages to `each` (payload in place, metadata), freeing
    /// their slots with one store; returns how many.
    pub fn pop_batch(&mut self, max: usize, mut each: impl FnMut(&[u8], Received)) -> usize {
        let (tail, geometry, message_size) = (self.tail, self.geometry, self.message_size);
        // Never more than a lap: past it the flags would repeat.
        let max = (max as u64).min(geometry.capacity());
        let mut count = 0;
        while count < max {
            let Some(header) = self.header_if_published(tail + count) else { break };
            each(Self::payload(geometry, message_size, tail + count, header), Self::received(header));
            count += 1;
        }
        if count > 0 || self.tail_published != tail {
            self.tail = tail + count;
            self.publish_tail(tail + count);
        }
        count as usize
    }

    /// Frees every waiting message; returns how many. Bounded: messages published while it
    /// runs may stay (a ring holds at most a lap, taken at once).
    pub fn discard(&mut self) -> usize {
        self.pop_batch(usize::MAX, |_, _| {})
    }
}

/// Copies `len` bytes. Ring messages are mostly a few words: up to 16 bytes this is two
/// (possibly overlapping) loads and stores with no loop and no call, so the message path stays
/// in registers; longer messages go to `copy_nonoverlapping`.
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes, and the two must not overlap.
#[inline(always)]
pub(crate) unsafe fn copy_words(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: each access lies within the first `len` bytes of `src` or `dst`, per the branch's
    // bounds on `len`.
    unsafe {
        if len > 16 {
            std::ptr::copy_nonoverlapping(src, dst, len);
        } else if len >= 8 {
            let (first, last) = (src.cast::<u64>().read_unaligned(), src.add(len - 8).cast::<u64>().read_unaligned());
            dst.cast::<u64>().write_unaligned(first);
            dst.add(len - 8).cast::<u64>().write_unaligned(last);
        } else if len >= 4 {
            let (first, last) = (src.cast::<u32>().read_unaligned(), src.add(len - 4).cast::<u32>().read_unaligned());
            dst.cast::<u32>().write_unaligned(first);
            dst.add(len - 4).cast::<u32>().write_unaligned(last);
        } else if len > 0 {
            let (first, middle, last) = (*src, *src.add(len / 2), *src.add(len - 1));
            *dst = first;
            *dst.add(len / 2) = middle;
            *dst.add(len - 1) = last;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A heap ring run by the index protocol, as rings in device memory are: the consumer
    /// polls `head` instead of the slots' flags.
    struct IndexRing(HeapRing);

    // SAFETY: delegates to a HeapRing, whose memory satisfies the contract.
    unsafe impl RingMemory for IndexRing {
        fn head(&self) -> &AtomicU64 {
            self.0.head()
        }
        fn tail(&self) -> &AtomicU64 {
            self.0.tail()
        }
        fn slots(&self) -> *mut u8 {
            self.0.slots()
        }
        fn mask(&self) -> u64 {
            self.0.mask()
        }
        fn slot_size(&self) -> usize {
            self.0.slot_size()
        }
    }

    fn index_ring(capacity: usize, message_size: usize) -> (Producer<IndexRing>, Consumer<IndexRing>) {
        let memory = Arc::new(IndexRing(HeapRing::new(capacity, message_size).unwrap()));
        (Producer::new(memory.clone(), message_size), Consumer::new(memory, message_size))
    }

    #[test]
    fn copies_every_length() {
        let src: Vec<u8> = (1..=40).collect();
        for len in 0..=40 {
            let mut dst = [0u8; 40];
            // SAFETY: both buffers hold 40 bytes, len <= 40, distinct arrays.
            unsafe { copy_words(src.as_ptr(), dst.as_mut_ptr(), len) };
            assert_eq!(&dst[..len], &src[..len], "length {len}");
            assert!(dst[len..].iter().all(|&b| b == 0), "nothing past length {len}");
        }
    }

    #[test]
    fn sizes_are_checked() {
        assert_eq!(ring(3, 8).err(), Some(RingError::Capacity(3)));
        assert_eq!(ring(1, 8).err(), Some(RingError::Capacity(1)));
        assert_eq!(ring(8, 0).err(), Some(RingError::MessageSize(0)));
        assert_eq!(ring(8, 65_536).err(), Some(RingError::MessageSize(65_536)));
        assert!(ring(8, 65_535).is_ok());
        assert!(ring(8, 8).is_ok());
    }

    fn fifo_full_and_empty<M: RingMemory>((mut tx, mut rx): (Producer<M>, Consumer<M>)) {
        let mut out = [0u8; 8];
        assert_eq!(rx.pop(&mut out), None);
        for lap in 0..5u64 {
            for i in 0..4u8 {
                assert!(tx.push(&[i; 3], 10 * lap + 2 * u64::from(i)));
            }
            assert!(!tx.push(&[9], 9), "full");
            assert_eq!((tx.len(), rx.len()), (4, 4));
            for i in 0..4u8 {
                let got = rx.pop(&mut out).unwrap();
                assert_eq!((got.len, got.enqueued_ns, &out[..3]), (3, 10 * lap + 2 * u64::from(i), &[i; 3][..]));
            }
            assert_eq!(rx.pop(&mut out), None, "a slot of the last lap is not taken again");
            assert_eq!((tx.len(), rx.len()), (0, 0));
        }
    }

    #[test]
    fn fifo_full_and_empty_with_slot_flags() {
        fifo_full_and_empty(ring(4, 8).unwrap());
    }

    #[test]
    fn fifo_full_and_empty_with_indices() {
        fifo_full_and_empty(index_ring(4, 8));
    }

    #[test]
    fn enqueue_times_wrap_at_48_bits() {
        let (mut tx, mut rx) = ring(2, 8).unwrap();
        let late = (1u64 << 48) + 6; // the clock just passed the 48-bit boundary
        assert!(tx.push(&[1], late - 10));
        let got = rx.pop(&mut [0u8; 8]).unwrap();
        assert_eq!(elapsed_ns(got.enqueued_ns, late), 10);
        assert_eq!(elapsed_ns(got.enqueued_ns, late + 1000), 1010);
    }

    #[test]
    fn flagged_rings_keep_even_nanoseconds_and_indexed_rings_all() {
        let (mut tx, mut rx) = ring(2, 8).unwrap();
        assert!(tx.push(&[1], 1001));
        assert_eq!(rx.pop(&mut [0u8; 8]).unwrap().enqueued_ns, 1000, "bit 0 is the lap flag");
        let (mut tx, mut rx) = index_ring(2, 8);
        assert!(tx.push(&[1], 1001));
        assert_eq!(rx.pop(&mut [0u8; 8]).unwrap().enqueued_ns, 1001);
    }

    fn batches<M: RingMemory>((mut tx, mut rx): (Producer<M>, Consumer<M>)) {
        let messages: Vec<[u8; 4]> = (0..10u32).map(|i| i.to_le_bytes()).collect();
        for _ in 0..3 {
            assert_eq!(tx.push_batch(messages.iter().map(|m| &m[..]), 4), 8, "only 8 fit");
            let mut seen = Vec::new();
            let mut take =
                |max| rx.pop_batch(max, |p, r| seen.push((u32::from_le_bytes(p.try_into().unwrap()), r.enqueued_ns)));
            assert_eq!(take(5), 5);
            assert_eq!(take(100), 3);
            assert_eq!(take(100), 0);
            assert_eq!(seen, (0..8).map(|i| (i, 4)).collect::<Vec<_>>());
        }
        assert_eq!(tx.push_batch(messages.iter().map(|m| &m[..]), 4), 8);
        assert_eq!(rx.discard(), 8);
        assert_eq!((rx.discard(), rx.len()), (0, 0));
        assert_eq!(tx.push_batch(messages.iter().map(|m| &m[..]), 4), 8, "discarded slots are free again");
        // One taken, more published after that: discard still frees every one waiting.
        assert!(rx.pop(&mut [0u8; 4]).is_some());
        assert_eq!(tx.push_batch(messages.iter().map(|m| &m[..]), 4), 1);
        assert_eq!(rx.discard(), 8);
        assert_eq!(rx.len(), 0);
    }

    #[test]
    fn a_flagged_ring_releases_slots_a_batch_at_a_time_and_when_empty() {
        // 64 slots: batches of 8.
        let (mut tx, mut rx) = ring(64, 8).unwrap();
        assert_eq!(refill(64), 8);
        let mut pushed = 0u8;
        while tx.push(&[pushed; 8], 0) {
            pushed += 1;
        }
        assert_eq!(pushed, 64);
        let mut out = [0u8; 8];
        for _ in 0..7 {
            rx.pop(&mut out).unwrap();
        }
        assert_eq!((tx.len(), rx.len()), (64, 57), "seven read, none released");
        assert!(!tx.push(&[0; 8], 0));
        rx.pop(&mut out).unwrap();
        assert_eq!(tx.len(), 56, "the batch's last slot read: all eight released");
        for i in 64..72 {
            assert!(tx.push(&[i; 8], 0), "a full ring takes a batch once one is free");
        }
        assert!(!tx.push(&[0; 8], 0));
        for expected in 8..72 {
            assert_eq!(rx.pop(&mut out).map(|_| out[0]), Some(expected), "in order");
        }
        assert_eq!(tx.len(), 0, "whole batches read, all released");
        // One more, read mid-batch: released when the consumer finds the ring empty.
        assert!(tx.push(&[72; 8], 0));
        assert_eq!(rx.pop(&mut out).map(|_| out[0]), Some(72));
        assert_eq!(tx.len(), 1, "read, not released yet");
        assert_eq!(rx.pop(&mut out), None);
        assert_eq!(tx.len(), 0, "released when the ring was found empty");
        assert_eq!(rx.pop_batch(4, |_, _| {}), 0);
    }

    #[test]
    fn small_rings_refill_from_one_slot() {
        assert_eq!((refill(2), refill(4), refill(8), refill(16), refill(1 << 20)), (0, 0, 1, 2, 64));
        let (mut tx, mut rx) = ring(4, 8).unwrap();
        for _ in 0..4 {
            assert!(tx.push(&[1; 8], 0));
        }
        assert!(rx.pop(&mut [0u8; 8]).is_some());
        assert!(tx.push(&[1; 8], 0), "the slot read is free at once");
    }

    #[test]
    fn pop_in_place_reads_the_slot_and_frees_it_after() {
        let (mut tx, mut rx) = ring(4, 16).unwrap();
        assert!(tx.push(b"in place", 42));
        let got = rx.pop_in_place(|payload, received| (payload.to_vec(), received));
        assert_eq!(got, Some((b"in place".to_vec(), Received { len: 8, enqueued_ns: 42 })));
        assert_eq!(rx.pop_in_place(|_, _| ()), None);
        assert_eq!(tx.len(), 0);
    }

    #[test]
    fn batches_with_slot_flags() {
        batches(ring(8, 4).unwrap());
    }

    #[test]
    fn batches_with_indices() {
        batches(index_ring(8, 4));
    }

    /// Moves `n` messages between two threads; each carries a value and its index (as the
    /// enqueue time), and the consumer checks order, loss and a checksum.
    fn two_threads<M: RingMemory + 'static>((mut tx, mut rx): (Producer<M>, Consumer<M>), n: u64) {
        let producer = std::thread::spawn(move || {
            let mut sum = 0u64;
            for i in 0..n {
                let value = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                while !tx.push(&value.to_le_bytes(), 2 * i) {
                    std::hint::spin_loop();
                }
                sum = sum.wrapping_add(value);
            }
            sum
        });
        let mut out = [0u8; 8];
        let mut sum = 0u64;
        let mut expected = 0u64;
        while expected < n {
            if let Some(got) = rx.pop(&mut out) {
                assert_eq!(got.enqueued_ns, 2 * expected, "in order, none lost or repeated");
                sum = sum.wrapping_add(u64::from_le_bytes(out));
                expected += 1;
            } else {
                std::hint::spin_loop();
            }
        }
        assert_eq!(producer.join().unwrap(), sum, "checksum matches");
    }

    #[test]
    fn two_threads_move_a_million_messages_in_order() {
        two_threads(ring(1024, 8).unwrap(), if cfg!(miri) { 2_000 } else { 1_000_000 });
        // A small ring wraps often: flags of consecutive laps alternate quickly.
        two_threads(ring(2, 8).unwrap(), if cfg!(miri) { 500 } else { 200_000 });
    }

    #[test]
    fn two_threads_move_a_million_messages_in_order_with_indices() {
        two_threads(index_ring(1024, 8), if cfg!(miri) { 2_000 } else { 1_000_000 });
    }
}
