//! Memory a CUDA ring kernel uses: pinned host memory mapped into the device (control block
//! and rings), and device memory (the kernel's state).
//!
//! Freeing is deferred while any persistent kernel of this process runs: `cuMemFreeHost` and
//! `cuMemFree` may wait for the whole device to go idle, which with a persistent kernel
//! running never happens. A kernel's memory is handed to [`retire`] and freed when the last
//! running kernel has stopped (at once when none runs). Device memory is allocated and cleared
//! in the kernel's own stream (`cuMemAllocAsync`, `cuMemsetD8Async`), which does not wait for
//! other streams.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys, CudaStream};

use super::device::{describe, Device};
use super::layout::{ControlBlock, MappedLayout, RingIndices};
use crate::ring::RingMemory;

enum Allocation {
    Pinned(NonNull<c_void>),
    Device(sys::CUdeviceptr),
}

// SAFETY: the pointers are handles to allocations no one else uses once retired.
unsafe impl Send for Allocation {}

struct Retired {
    running: usize,
    pending: Vec<(Arc<Device>, Allocation)>,
}

static RETIRED: Mutex<Retired> = Mutex::new(Retired { running: 0, pending: Vec::new() });

fn free(device: &Device, allocation: Allocation) {
    let _ = device.ctx.bind_to_thread();
    // SAFETY: each allocation is retired once, by its owner's Drop, and no kernel uses it.
    let _ = unsafe {
        match allocation {
            Allocation::Pinned(host) => result::free_host(host.as_ptr()),
            Allocation::Device(ptr) => result::free_sync(ptr),
        }
    };
}

fn retire(device: &Arc<Device>, allocation: Allocation) {
    let mut retired = RETIRED.lock().unwrap_or_else(|e| e.into_inner());
    if retired.running == 0 {
        drop(retired);
        free(device, allocation);
    } else {
        retired.pending.push((device.clone(), allocation));
    }
}

/// How many persistent kernels are running (launched, not yet seen to return).
pub(crate) fn running_kernels() -> usize {
    RETIRED.lock().unwrap_or_else(|e| e.into_inner()).running
}

/// A persistent kernel was launched: freeing waits until it has stopped.
pub(crate) fn kernel_started() {
    RETIRED.lock().unwrap_or_else(|e| e.into_inner()).running += 1;
}

/// A persistent kernel has returned; when it was the last, what waited is freed.
pub(crate) fn kernel_stopped() {
    let pending = {
        let mut retired = RETIRED.lock().unwrap_or_else(|e| e.into_inner());
        retired.running = retired.running.saturating_sub(1);
        if retired.running > 0 {
            return;
        }
        std::mem::take(&mut retired.pending)
    };
    for (device, allocation) in pending {
        free(&device, allocation);
    }
}

/// Pinned host memory, mapped into the device, zeroed.
pub(crate) struct PinnedMemory {
    device: Arc<Device>,
    host: NonNull<u8>,
    device_ptr: u64,
    layout: MappedLayout,
}

// SAFETY: the memory is shared with the device by design; every access goes through atomics
// (the control block and ring indices) or the ring protocol (slots), see ring.rs.
unsafe impl Send for PinnedMemory {}
// SAFETY: as for Send: shared access is by atomics or the ring protocol only.
unsafe impl Sync for PinnedMemory {}

impl PinnedMemory {
    pub(crate) fn new(device: &Arc<Device>, layout: MappedLayout) -> Result<PinnedMemory, String> {
        device.ctx.bind_to_thread().map_err(describe)?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: allocates `total` bytes; zeroed below before any use.
        let host = unsafe { result::malloc_host(layout.total, flags) }
            .map_err(|e| format!("cannot allocate {} bytes of mapped pinned memory: {}", layout.total, describe(e)))?;
        let host = NonNull::new(host.cast::<u8>()).ok_or("cuMemHostAlloc returned null")?;
        let mut memory = PinnedMemory { device: device.clone(), host, device_ptr: 0, layout };
        // SAFETY: the allocation is `total` bytes and ours alone so far.
        unsafe { std::ptr::write_bytes(host.as_ptr(), 0, layout.total) };
        // SAFETY: `host` was allocated with DEVICEMAP in the current context.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut memory.device_ptr, host.as_ptr().cast(), 0) }
            .result()
            .map_err(|e| format!("cannot map the pinned memory into the device: {}", describe(e)))?;
        Ok(memory)
    }

    pub(crate) fn layout(&self) -> MappedLayout {
        self.layout
    }

    /// The device's address of the byte at `offset`.
    pub(crate) fn device_address(&self, offset: usize) -> u64 {
        self.device_ptr + offset as u64
    }

    pub(crate) fn control_block(&self) -> &ControlBlock {
        // SAFETY: the control block is at offset 0 (page-aligned), made of AtomicU64s, which
        // any bit pattern (zeroed, then written by both sides) is valid for.
        unsafe { &*self.host.as_ptr().cast::<ControlBlock>() }
    }

    fn indices(&self, offset: usize) -> &RingIndices {
        // SAFETY: as above; `offset` is one of the layout's 128-aligned index offsets.
        unsafe { &*self.host.as_ptr().add(offset).cast::<RingIndices>() }
    }
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        retire(&self.device, Allocation::Pinned(self.host.cast()));
    }
}

/// Which of the two rings in a kernel's mapped memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Input,
    Output,
}

/// One ring of a kernel's mapped memory, as the host's end sees it.
pub(crate) struct MappedRing {
    memory: Arc<PinnedMemory>,
    side: Side,
}

impl MappedRing {
    pub(crate) fn new(memory: Arc<PinnedMemory>, side: Side) -> Arc<MappedRing> {
        Arc::new(MappedRing { memory, side })
    }

    fn offsets(&self) -> (usize, usize) {
        let layout = self.memory.layout;
        match self.side {
            Side::Input => (layout.input_indices, layout.input_slots),
            Side::Output => (layout.output_indices, layout.output_slots),
        }
    }
}

// SAFETY: the slots are `capacity * slot_size` bytes at a 128-aligned offset of the pinned
// allocation (MappedLayout), which lives as long as the Arc; the indices start zeroed; the
// device is the ring's other end and follows the same protocol (kernels/cuda/ring.cuh).
unsafe impl RingMemory for MappedRing {
    #[inline]
    fn head(&self) -> &AtomicU64 {
        &self.memory.indices(self.offsets().0).head
    }
    #[inline]
    fn tail(&self) -> &AtomicU64 {
        &self.memory.indices(self.offsets().0).tail
    }
    #[inline]
    fn slots(&self) -> *mut u8 {
        // SAFETY: the offset is inside the allocation.
        unsafe { self.memory.host.as_ptr().add(self.offsets().1) }
    }
    #[inline]
    fn mask(&self) -> u64 {
        self.memory.control_block().capacity_mask.load(std::sync::atomic::Ordering::Relaxed)
    }
    #[inline]
    fn slot_size(&self) -> usize {
        self.memory.layout.slot_size
    }
}

/// Device memory holding a kernel's state, zeroed in the kernel's stream before its launch.
pub(crate) struct DeviceMemory {
    device: Arc<Device>,
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceMemory {
    pub(crate) fn zeroed(device: &Arc<Device>, stream: &CudaStream, bytes: usize) -> Result<DeviceMemory, String> {
        device.ctx.bind_to_thread().map_err(describe)?;
        let cu_stream = stream.cu_stream();
        // SAFETY: allocations in the kernel's stream, used only by work queued after them there.
        let ptr = unsafe {
            if device.ctx.has_async_alloc() {
                result::malloc_async(cu_stream, bytes)
            } else {
                result::malloc_sync(bytes)
            }
        }
        .map_err(|e| format!("cannot allocate {bytes} bytes of device memory: {}", describe(e)))?;
        let memory = DeviceMemory { device: device.clone(), ptr, bytes };
        // SAFETY: `ptr` holds `bytes` bytes.
        unsafe { result::memset_d8_async(ptr, 0, bytes, cu_stream) }
            .map_err(|e| format!("cannot clear the device memory: {}", describe(e)))?;
        Ok(memory)
    }

    pub(crate) fn address(&self) -> u64 {
        self.ptr
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        retire(&self.device, Allocation::Device(self.ptr));
    }
}
