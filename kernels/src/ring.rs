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
//! Where the indices and slots live is [`RingMemory`]'s business: the heap for two threads
//! ([`ring`]), or pinned memory mapped into a GPU, whose kernel is the other end (the CUDA
//! backend). The ends are generic over it, so the heap ring compiles to the same code as if
//! it were the only kind.

use std::cell::{Cell, UnsafeCell};
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
/// a power of two. `head` and `tail` start at 0.
pub unsafe trait RingMemory: Send + Sync {
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

/// A ring's memory on the heap, shared by two threads.
pub struct HeapRing {
    head: CacheLine,
    tail: CacheLine,
    slots: Box<[UnsafeCell<u8>]>,
    mask: u64,
    slot_size: usize,
}

// SAFETY: slot bytes are written only by the one producer while the slot is free and read only
// by the one consumer after it is published; the Release/Acquire pairs above order the two.
unsafe impl Sync for HeapRing {}
unsafe impl Send for HeapRing {}

// SAFETY: `slots` holds capacity * slot_size bytes (built by `ring`, which checks the sizes);
// Box<[u8]>'s data is at least 1-aligned only, so `ring` rounds slot_size to 8 and copies with
// unaligned accesses.
unsafe impl RingMemory for HeapRing {
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
        // UnsafeCell<u8> has the layout of u8.
        UnsafeCell::raw_get(self.slots.as_ptr())
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
}

impl Geometry {
    fn of<M: RingMemory>(memory: &M) -> Geometry {
        Geometry { slots: memory.slots(), mask: memory.mask(), slot_size: memory.slot_size() }
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
}

/// Packs a slot header: payload length and the enqueue time's low 48 bits.
#[inline(always)]
pub(crate) fn pack_header(len: usize, enqueued_ns: u64) -> u64 {
    (len as u64) << TIME_BITS | (enqueued_ns & TIME_MASK)
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
    check_sizes(capacity, message_size)?;
    let slot_size = slot_size(message_size);
    let slots = (0..capacity * slot_size).map(|_| UnsafeCell::new(0)).collect();
    let shared = Arc::new(HeapRing {
        head: CacheLine(AtomicU64::new(0)),
        tail: CacheLine(AtomicU64::new(0)),
        slots,
        mask: capacity as u64 - 1,
        slot_size,
    });
    Ok((Producer::new(shared.clone(), message_size), Consumer::new(shared, message_size)))
}

/// The writing end. `Send`, not `Sync`: one thread produces.
pub struct Producer<M: RingMemory = HeapRing> {
    shared: Arc<M>,
    geometry: Geometry,
    head: Cell<u64>,
    tail_cache: Cell<u64>,
    message_size: usize,
}

// SAFETY: `geometry.slots` points into the memory the `Arc` keeps alive; the ends are used by
// one thread at a time (they are not Sync), as without the copied pointer.
unsafe impl<M: RingMemory> Send for Producer<M> {}
unsafe impl<M: RingMemory> Send for Consumer<M> {}

/// The reading end. `Send`, not `Sync`: one thread consumes.
pub struct Consumer<M: RingMemory = HeapRing> {
    shared: Arc<M>,
    geometry: Geometry,
    tail: Cell<u64>,
    head_cache: Cell<u64>,
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
        Producer {
            geometry: Geometry::of(&*memory),
            shared: memory,
            head: Cell::new(0),
            tail_cache: Cell::new(0),
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

    /// Free slots, reloading the consumer's index only when the cached one says full.
    #[inline]
    fn free(&self) -> u64 {
        let capacity = self.geometry.capacity();
        let head = self.head.get();
        let mut free = capacity - (head - self.tail_cache.get());
        if free == 0 {
            self.tail_cache.set(self.shared.tail().load(Ordering::Acquire));
            free = capacity - (head - self.tail_cache.get());
        }
        free
    }

    /// Messages waiting (as the producer sees it).
    #[inline]
    pub fn len(&self) -> usize {
        (self.head.get() - self.shared.tail().load(Ordering::Acquire)) as usize
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    fn write(&self, index: u64, payload: &[u8], enqueued_ns: u64) {
        let slot = self.geometry.slot(index);
        // SAFETY: the slot at `index` is free (index < tail + capacity, checked by the caller)
        // so the consumer does not read it; it spans `slot_size` bytes inside `slots`, and
        // `payload.len() <= message_size` (checked by the callers).
        unsafe {
            slot.cast::<u64>().write_unaligned(pack_header(payload.len(), enqueued_ns));
            copy_words(payload.as_ptr(), slot.add(SLOT_HEADER), payload.len());
        }
    }

    /// Enqueues one message; `false` when the ring is full. Panics if `payload` is longer than
    /// the ring's message size (a caller bug, not a runtime condition).
    #[inline]
    pub fn push(&self, payload: &[u8], enqueued_ns: u64) -> bool {
        assert!(payload.len() <= self.message_size, "payload of {} bytes exceeds the slot", payload.len());
        if self.free() == 0 {
            return false;
        }
        let head = self.head.get();
        self.write(head, payload, enqueued_ns);
        self.head.set(head + 1);
        self.shared.head().store(head + 1, Ordering::Release);
        true
    }

    /// Enqueues as many of `payloads` as fit, publishing them with one store; returns how many.
    pub fn push_batch<'a>(&self, payloads: impl IntoIterator<Item = &'a [u8]>, enqueued_ns: u64) -> usize {
        let free = self.free();
        let head = self.head.get();
        let mut written = 0u64;
        for payload in payloads.into_iter().take(free as usize) {
            assert!(payload.len() <= self.message_size, "payload of {} bytes exceeds the slot", payload.len());
            self.write(head + written, payload, enqueued_ns);
            written += 1;
        }
        if written > 0 {
            self.head.set(head + written);
            self.shared.head().store(head + written, Ordering::Release);
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
            tail: Cell::new(0),
            head_cache: Cell::new(0),
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

    #[inline]
    fn available(&self) -> u64 {
        let tail = self.tail.get();
        let mut available = self.head_cache.get() - tail;
        if available == 0 {
            self.head_cache.set(self.shared.head().load(Ordering::Acquire));
            available = self.head_cache.get() - tail;
        }
        available
    }

    #[inline]
    pub fn len(&self) -> usize {
        (self.shared.head().load(Ordering::Acquire) - self.tail.get()) as usize
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    fn read(&self, index: u64, out: &mut [u8]) -> Received {
        let slot = self.geometry.slot(index);
        // SAFETY: the slot was published (index < head, loaded with Acquire) and is not
        // rewritten before `tail` passes it; the header was written by `Producer::write`.
        let header = unsafe { slot.cast::<u64>().read_unaligned() };
        let (len, enqueued_ns) = ((header >> TIME_BITS) as usize, header & TIME_MASK);
        let len = len.min(self.message_size);
        let copied = len.min(out.len());
        // SAFETY: as above; `copied` <= message_size keeps the read inside the slot, and
        // `copied` <= out.len() inside `out`.
        unsafe { copy_words(slot.add(SLOT_HEADER), out.as_mut_ptr(), copied) };
        Received { len, enqueued_ns }
    }

    /// Dequeues one message into `out` (truncated to `out`'s length; `len` tells the full size).
    #[inline]
    pub fn pop(&self, out: &mut [u8]) -> Option<Received> {
        if self.available() == 0 {
            return None;
        }
        let tail = self.tail.get();
        let received = self.read(tail, out);
        self.tail.set(tail + 1);
        self.shared.tail().store(tail + 1, Ordering::Release);
        Some(received)
    }

    /// Hands up to `max` waiting messages to `each` (payload, metadata), freeing their slots
    /// with one store; returns how many.
    pub fn pop_batch(&self, max: usize, scratch: &mut [u8], mut each: impl FnMut(&[u8], Received)) -> usize {
        let count = self.available().min(max as u64);
        let tail = self.tail.get();
        for i in 0..count {
            let received = self.read(tail + i, scratch);
            each(&scratch[..received.len.min(scratch.len())], received);
        }
        if count > 0 {
            self.tail.set(tail + count);
            self.shared.tail().store(tail + count, Ordering::Release);
        }
        count as usize
    }
}

/// Copies `len` bytes in 8-byte words, then the remaining bytes: for the small messages rings
/// carry this is a few moves, where `copy_nonoverlapping` with a run-time length is a call.
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes, and the two must not overlap.
#[inline(always)]
pub(crate) unsafe fn copy_words(src: *const u8, dst: *mut u8, len: usize) {
    let words = len / 8;
    for i in 0..words {
        // SAFETY: 8 * i + 8 <= len, within both ranges per the contract.
        unsafe { dst.add(8 * i).cast::<u64>().write_unaligned(src.add(8 * i).cast::<u64>().read_unaligned()) };
    }
    for i in 8 * words..len {
        // SAFETY: i < len, within both ranges per the contract.
        unsafe { *dst.add(i) = *src.add(i) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked() {
        assert_eq!(ring(3, 8).err(), Some(RingError::Capacity(3)));
        assert_eq!(ring(1, 8).err(), Some(RingError::Capacity(1)));
        assert_eq!(ring(8, 0).err(), Some(RingError::MessageSize(0)));
        assert_eq!(ring(8, 65_536).err(), Some(RingError::MessageSize(65_536)));
        assert!(ring(8, 65_535).is_ok());
        assert!(ring(8, 8).is_ok());
    }

    #[test]
    fn fifo_full_and_empty() {
        let (tx, rx) = ring(4, 8).unwrap();
        let mut out = [0u8; 8];
        assert_eq!(rx.pop(&mut out), None);
        for i in 0..4u8 {
            assert!(tx.push(&[i; 3], u64::from(i)));
        }
        assert!(!tx.push(&[9], 9), "full");
        assert_eq!((tx.len(), rx.len()), (4, 4));
        for i in 0..4u8 {
            let got = rx.pop(&mut out).unwrap();
            assert_eq!((got.len, got.enqueued_ns, &out[..3]), (3, u64::from(i), &[i; 3][..]));
        }
        assert_eq!(rx.pop(&mut out), None);
        assert!(tx.push(&[7], 7), "slots are reused after wrap-around");
    }

    #[test]
    fn enqueue_times_wrap_at_48_bits() {
        let (tx, rx) = ring(2, 8).unwrap();
        let late = (1u64 << 48) + 5; // the clock just passed the 48-bit boundary
        assert!(tx.push(&[1], late - 10));
        let got = rx.pop(&mut [0u8; 8]).unwrap();
        assert_eq!(elapsed_ns(got.enqueued_ns, late), 10);
        assert_eq!(elapsed_ns(got.enqueued_ns, late + 1000), 1010);
    }

    #[test]
    fn batches() {
        let (tx, rx) = ring(8, 4).unwrap();
        let messages: Vec<[u8; 4]> = (0..10u32).map(|i| i.to_le_bytes()).collect();
        assert_eq!(tx.push_batch(messages.iter().map(|m| &m[..]), 5), 8, "only 8 fit");
        let mut seen = Vec::new();
        let mut scratch = [0u8; 4];
        assert_eq!(
            rx.pop_batch(5, &mut scratch, |p, r| seen.push((u32::from_le_bytes(p.try_into().unwrap()), r.enqueued_ns))),
            5
        );
        assert_eq!(
            rx.pop_batch(100, &mut scratch, |p, _| seen.push((u32::from_le_bytes(p.try_into().unwrap()), 5))),
            3
        );
        assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn two_threads_move_a_million_messages_in_order() {
        let (tx, rx) = ring(1024, 8).unwrap();
        const N: u64 = 1_000_000;
        let producer = std::thread::spawn(move || {
            let mut sum = 0u64;
            for i in 0..N {
                let value = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                while !tx.push(&value.to_le_bytes(), i) {
                    std::hint::spin_loop();
                }
                sum = sum.wrapping_add(value);
            }
            sum
        });
        let mut out = [0u8; 8];
        let mut sum = 0u64;
        let mut expected = 0u64;
        while expected < N {
            if let Some(got) = rx.pop(&mut out) {
                assert_eq!(got.enqueued_ns, expected, "in order, none lost or repeated");
                sum = sum.wrapping_add(u64::from_le_bytes(out));
                expected += 1;
            } else {
                std::hint::spin_loop();
            }
        }
        assert_eq!(producer.join().unwrap(), sum, "checksum matches");
    }
}
