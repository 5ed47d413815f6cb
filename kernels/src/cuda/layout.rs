//! The memory a CUDA ring kernel shares with the host, defined once: the Rust types and
//! constants here, and the CUDA declarations generated from them ([`cuda_prelude`]), which
//! the host prepends to the kernel sources before NVRTC compiles them. Every shared field is
//! a `u64`, so the two declarations have the same layout by construction; the generated
//! source also checks the sizes with `static_assert`.
//!
//! # The mapped allocation (pinned host memory the device reaches)
//!
//! ```text
//! ControlBlock          config | host line | device line | telemetry | latency histogram
//! RingIndices (input)   head (host writes) | tail (device writes), a 128-byte line each
//! input slots           capacity x slot_size, slots as in ring.rs: 8-byte header + payload
//! RingIndices (output)  head (device writes) | tail (host writes)
//! output slots
//! ```
//!
//! Each group of fields one side writes is on its own 128-byte lines.
//!
//! # The device state (device memory, the kernel's alone)
//!
//! In `u64` words: telemetry shadows, the kernel's own scalars, the ring cursors, the latency
//! histogram's shadow, the kernel's histogram (stats), then two staging buffers (the message
//! being processed, and its result).

use std::fmt::Write as _;
use std::sync::atomic::AtomicU64;

use ringside_shared::KernelState;

use crate::runtime::state_index;
use crate::telemetry::{BUCKETS, SUB, SUB_BITS};

/// Threads per block of a ring kernel (one block per kernel).
pub(crate) const THREADS: u32 = 128;
/// Polls of an empty ring the kernel spins through before it sleeps 1 µs between polls.
const SPIN_POLLS: u32 = 4096;

/// The control word (host writes, device reads): the lifecycle state's index in the low byte,
/// the stop request above it, then the clock-calibration request and a generation that every
/// lifecycle change bumps (so the host can tell the device has seen a given change).
pub(crate) const CONTROL_STOP_SHIFT: u32 = 8;
pub(crate) const CONTROL_CALIBRATION_SHIFT: u32 = 16;
pub(crate) const CONTROL_GENERATION_SHIFT: u32 = 32;
pub(crate) const STOP_DRAIN: u64 = 1;
pub(crate) const STOP_ABORT: u64 = 2;

/// Error codes in `ControlBlock::last_error` (code << 56 | argument).
pub(crate) const ERROR_NOT_WHOLE_F32: u64 = 1;
pub(crate) const ERROR_STATS_SAMPLE: u64 = 2;
pub(crate) const ERROR_SAXPY_NO_A: u64 = 3;
pub(crate) const ERROR_SAXPY_UNPAIRED: u64 = 4;
pub(crate) const ERROR_RESULT_TOO_LARGE: u64 = 5;

/// Device-state offsets, in `u64` words.
const DS_TELEMETRY: usize = 0;
const DS_KERNEL: usize = 8;
const DS_CURSORS: usize = 16;
const DS_TELEMETRY_HISTOGRAM: usize = 24;
const DS_KERNEL_HISTOGRAM: usize = DS_TELEMETRY_HISTOGRAM + BUCKETS;
const DS_STAGING: usize = DS_KERNEL_HISTOGRAM + BUCKETS;
/// Each staging buffer holds at least 32 bytes: a stats summary (28) fits even in a kernel
/// with smaller slots, so the too-large check happens where the CPU twin makes it.
const MIN_STAGING_WORDS: usize = 4;

/// Bytes of device memory a kernel with `message_size`-byte messages uses.
pub(crate) fn device_state_bytes(message_size: usize) -> usize {
    let staging = message_size.div_ceil(8).max(MIN_STAGING_WORDS);
    (DS_STAGING + 2 * staging) * 8
}

macro_rules! shared_struct {
    (
        $(#[$doc:meta])*
        struct $name:ident { $( $(#[$field_doc:meta])* $field:ident $([$len:expr])? ),* $(,)? }
    ) => {
        $(#[$doc])*
        #[repr(C, align(128))]
        #[allow(dead_code)] // padding, and fields only the device reads
        pub(crate) struct $name {
            $( $(#[$field_doc])* pub $field: shared_struct!(@type $($len)?), )*
        }

        impl $name {
            /// The CUDA declaration of this struct.
            fn cuda() -> String {
                let mut out = format!("struct {} {{\n", stringify!($name));
                $(
                    match shared_struct!(@len $($len)?) {
                        Some(len) => writeln!(out, "    unsigned long long {}[{len}];", stringify!($field)),
                        None => writeln!(out, "    unsigned long long {};", stringify!($field)),
                    }
                    .expect("writing to a String");
                )*
                out.push_str("};\n");
                writeln!(
                    out,
                    "static_assert(sizeof({0}) == {1}, \"{0} differs from kernels/src/cuda/layout.rs\");",
                    stringify!($name),
                    std::mem::size_of::<$name>()
                )
                .expect("writing to a String");
                out
            }
        }
    };
    (@type) => { AtomicU64 };
    (@type $len:expr) => { [AtomicU64; $len] };
    (@len) => { None::<usize> };
    (@len $len:expr) => { Some($len) };
}

shared_struct! {
    /// The kernel's control block: configuration, lifecycle, clock calibration, and the
    /// telemetry the device writes.
    struct ControlBlock {
        // Written by the host before the launch.
        capacity_mask,
        slot_size,
        message_size,
        /// Output ring full: how long the device waits for room (0: drop at once).
        wait_ns,
        _config_pad[12],
        // Written by the host while the kernel runs.
        /// See [`CONTROL_STOP_SHIFT`] and its neighbours.
        control,
        _host_pad[15],
        // Written by the device.
        /// The last control word the device acted on.
        seen,
        /// The calibration request last answered, and the device clock when it was seen.
        calibration_reply,
        calibration_gpu_ns,
        /// 1 once the persistent loop has returned.
        exited,
        _device_pad[12],
        // Telemetry, written by the device only (one writer: each figure is exact).
        processed,
        dropped,
        failed,
        total_latency_ns,
        /// `u64::MAX` until the first message (the host writes it before the launch).
        min_latency_ns,
        max_latency_ns,
        bytes_in,
        bytes_out,
        /// The last error, code << 56 | argument; 0 for none.
        last_error,
        _telemetry_pad[7],
        /// Enqueue-to-completion latencies, the buckets of telemetry.rs.
        histogram[BUCKETS],
    }
}

shared_struct! {
    /// A ring's two indices, each on its own line (they are written by different sides).
    struct RingIndices {
        head,
        _head_pad[15],
        tail,
        _tail_pad[15],
    }
}

const _: () = assert!(std::mem::size_of::<ControlBlock>() == (64 + BUCKETS) * 8);
const _: () = assert!(std::mem::size_of::<ControlBlock>().is_multiple_of(128));
const _: () = assert!(std::mem::size_of::<RingIndices>() == 256);

/// Where each part of a kernel's mapped allocation is, in bytes from its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MappedLayout {
    pub input_indices: usize,
    pub input_slots: usize,
    pub output_indices: usize,
    pub output_slots: usize,
    pub total: usize,
    pub slot_size: usize,
}

impl MappedLayout {
    pub(crate) fn new(capacity: usize, message_size: usize) -> MappedLayout {
        let slot_size = crate::ring::slot_size(message_size);
        let slots = (capacity * slot_size).next_multiple_of(128);
        let input_indices = std::mem::size_of::<ControlBlock>();
        let input_slots = input_indices + std::mem::size_of::<RingIndices>();
        let output_indices = input_slots + slots;
        let output_slots = output_indices + std::mem::size_of::<RingIndices>();
        MappedLayout {
            input_indices,
            input_slots,
            output_indices,
            output_slots,
            total: output_slots + slots,
            slot_size,
        }
    }
}

/// The CUDA source every kernel program starts with: the constants and shared structs above.
pub(crate) fn cuda_prelude() -> String {
    let state = |s: KernelState| state_index(s);
    let mut out = String::from("// Generated from kernels/src/cuda/layout.rs; do not edit.\n");
    let defines: [(&str, String); 29] = [
        ("RS_THREADS", THREADS.to_string()),
        ("RS_SPIN_POLLS", SPIN_POLLS.to_string()),
        ("RS_SUB_BITS", SUB_BITS.to_string()),
        ("RS_SUB", SUB.to_string()),
        ("RS_BUCKETS", BUCKETS.to_string()),
        ("RS_TIME_BITS", crate::ring::TIME_BITS.to_string()),
        ("RS_TIME_MASK", format!("{:#x}ull", crate::ring::TIME_MASK)),
        ("RS_SLOT_HEADER", crate::ring::SLOT_HEADER.to_string()),
        ("RS_CONTROL_STOP_SHIFT", CONTROL_STOP_SHIFT.to_string()),
        ("RS_CONTROL_CALIBRATION_SHIFT", CONTROL_CALIBRATION_SHIFT.to_string()),
        ("RS_STOP_DRAIN", STOP_DRAIN.to_string()),
        ("RS_STOP_ABORT", STOP_ABORT.to_string()),
        ("RS_STATE_LAUNCHED", state(KernelState::Launched).to_string()),
        ("RS_STATE_ACTIVE", state(KernelState::Active).to_string()),
        ("RS_STATE_DEACTIVATED", state(KernelState::Deactivated).to_string()),
        ("RS_STATE_TERMINATING", state(KernelState::Terminating).to_string()),
        ("RS_ERROR_NOT_WHOLE_F32", ERROR_NOT_WHOLE_F32.to_string()),
        ("RS_ERROR_STATS_SAMPLE", ERROR_STATS_SAMPLE.to_string()),
        ("RS_ERROR_SAXPY_NO_A", ERROR_SAXPY_NO_A.to_string()),
        ("RS_ERROR_SAXPY_UNPAIRED", ERROR_SAXPY_UNPAIRED.to_string()),
        ("RS_ERROR_RESULT_TOO_LARGE", ERROR_RESULT_TOO_LARGE.to_string()),
        ("RS_DS_TELEMETRY", DS_TELEMETRY.to_string()),
        ("RS_DS_KERNEL", DS_KERNEL.to_string()),
        ("RS_DS_CURSORS", DS_CURSORS.to_string()),
        ("RS_DS_TELEMETRY_HISTOGRAM", DS_TELEMETRY_HISTOGRAM.to_string()),
        ("RS_DS_KERNEL_HISTOGRAM", DS_KERNEL_HISTOGRAM.to_string()),
        ("RS_DS_STAGING", DS_STAGING.to_string()),
        ("RS_MIN_STAGING_WORDS", MIN_STAGING_WORDS.to_string()),
        // `{:?}` keeps the decimal point, so this is a float literal.
        ("RS_STATS_SCALE", format!("{:?}f", crate::builtin::STATS_SCALE)),
    ];
    for (name, value) in defines {
        writeln!(out, "#define {name} {value}").expect("writing to a String");
    }
    out.push_str(&ControlBlock::cuda());
    out.push_str(&RingIndices::cuda());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cuda_declarations_follow_the_rust_ones() {
        let prelude = cuda_prelude();
        assert!(prelude.contains("struct ControlBlock {\n    unsigned long long capacity_mask;\n"));
        assert!(prelude.contains(&format!("    unsigned long long histogram[{BUCKETS}];\n}};")));
        assert!(prelude.contains("static_assert(sizeof(ControlBlock) == 5760,"));
        assert!(prelude.contains("static_assert(sizeof(RingIndices) == 256,"));
        assert!(prelude.contains("#define RS_STATS_SCALE 1000.0f\n"));
        assert!(prelude.contains("#define RS_TIME_MASK 0xffffffffffffull\n"));
        // Offsets the CUDA side computes by counting u64 fields, checked against Rust's.
        assert_eq!(std::mem::offset_of!(ControlBlock, control), 16 * 8);
        assert_eq!(std::mem::offset_of!(ControlBlock, seen), 32 * 8);
        assert_eq!(std::mem::offset_of!(ControlBlock, processed), 48 * 8);
        assert_eq!(std::mem::offset_of!(ControlBlock, histogram), 64 * 8);
        assert_eq!(std::mem::offset_of!(RingIndices, tail), 128);
    }

    #[test]
    fn the_mapped_layout_keeps_lines_apart() {
        let layout = MappedLayout::new(4, 10);
        assert_eq!(layout.slot_size, 24);
        assert_eq!(layout.input_indices, 5760);
        assert_eq!(layout.input_slots, 5760 + 256);
        assert_eq!(layout.output_indices, 5760 + 256 + 128, "4 slots of 24 bytes, rounded to a line");
        assert_eq!(layout.total, layout.output_slots + 128);
        for offset in [layout.input_indices, layout.input_slots, layout.output_indices, layout.output_slots] {
            assert_eq!(offset % 128, 0);
        }
        assert_eq!(device_state_bytes(8), (24 + 2 * BUCKETS + 8) * 8);
        assert_eq!(device_state_bytes(256), (24 + 2 * BUCKETS + 64) * 8);
    }
}
