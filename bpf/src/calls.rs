//! The CUDA and NCCL calls the uprobes count: which functions of which library, and where
//! their code starts in a library file.

use std::path::Path;

use crate::elf::{self, ElfError};
use crate::skel::types::call_kind as RawCallKind;

/// Which kind of library call a uprobe counts: the BPF side's `enum call_kind` (intf.h), its
/// values taken from the skeleton the build generates from BTF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum CallKind {
    Launch = RawCallKind::CALL_LAUNCH.0,
    Sync = RawCallKind::CALL_SYNC.0,
    Nccl = RawCallKind::CALL_NCCL.0,
}

/// The library entry points probed, by the library file they live in.
pub const CUDA_DRIVER_CALLS: [(&str, CallKind); 5] = [
    ("cuLaunchKernel", CallKind::Launch),
    ("cuLaunchKernel_ptsz", CallKind::Launch),
    ("cuStreamSynchronize", CallKind::Sync),
    ("cuCtxSynchronize", CallKind::Sync),
    ("cuEventSynchronize", CallKind::Sync),
];
pub const CUDA_RUNTIME_CALLS: [(&str, CallKind); 3] = [
    ("cudaDeviceSynchronize", CallKind::Sync),
    ("cudaStreamSynchronize", CallKind::Sync),
    ("cudaEventSynchronize", CallKind::Sync),
];
pub const NCCL_CALLS: [(&str, CallKind); 5] = [
    ("ncclAllReduce", CallKind::Nccl),
    ("ncclAllGather", CallKind::Nccl),
    ("ncclReduceScatter", CallKind::Nccl),
    ("ncclBroadcast", CallKind::Nccl),
    ("ncclGroupEnd", CallKind::Nccl),
];

/// The calls to probe in a library, from its file name; empty for other libraries.
pub fn calls_of_library(path: &Path) -> &'static [(&'static str, CallKind)] {
    let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
    if file.starts_with("libcuda.so") {
        &CUDA_DRIVER_CALLS
    } else if file.starts_with("libcudart.so") {
        &CUDA_RUNTIME_CALLS
    } else if file.starts_with("libnccl.so") {
        &NCCL_CALLS
    } else {
        &[]
    }
}

/// A probed function found in a library: where its code starts in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryPoint {
    pub function: &'static str,
    pub kind: CallKind,
    pub offset: u64,
}

/// The probed functions (by [`calls_of_library`] of its name) that a library file of `size`
/// bytes defines, read with bounded positioned reads (the `elf` module).
pub fn library_entry_points(file: &std::fs::File, size: u64, library: &Path) -> Result<Vec<EntryPoint>, ElfError> {
    let calls = calls_of_library(library);
    let names: Vec<&str> = calls.iter().map(|(f, _)| *f).collect();
    let found = elf::function_offsets(file, size, &names)?;
    Ok(found.into_iter().map(|(i, offset)| EntryPoint { function: calls[i].0, kind: calls[i].1, offset }).collect())
}
