//! The CUDA and NCCL calls the uprobes count: which functions of which library, and where
//! their code starts in a library file.
//!
//! Since CUDA 11.3 the runtime (and NCCL, PyTorch and Triton through it) does not call the
//! driver's exports by name: it asks `cuGetProcAddress` for each *operation* and calls what the
//! driver hands back, which depends on the requested CUDA version and on the stream semantics
//! (`CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` gives the `_ptsz`/`_ptds` variants that
//! programs built with `--default-stream per-thread` use). So the driver's table is kept by
//! operation ([`CUDA_DRIVER_OPERATIONS`]), with every entry point a driver may return for it;
//! a test asks NVIDIA's real `libcuda.so.1` for each operation with each flag and fails on a
//! function missing here. The runtime (`libcudart`) is not probed: everything it does reaches
//! the driver through those entry points, and probing both would trap twice per call.
//!
//! Launches are not probed by default (see [`Probes`]): a uprobe costs every call a trap into
//! the kernel (about 15 µs on the VMs measured), which a launch-bound job cannot afford. The
//! observer tells a thread feeding the GPU from where its CPU time is spent instead (the BPF
//! side samples it at the scheduler tick).

use std::path::Path;

use crate::elf::{self, ElfError};
use crate::placement;
use crate::skel::types::call_kind as RawCallKind;

/// Which kind of library call a uprobe counts: the BPF side's `enum call_kind` (intf.h), its
/// values taken from the skeleton the build generates from BTF.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum CallKind {
    /// A kernel (or graph) launch: only counted with [`Probes::launches`].
    Launch = RawCallKind::CALL_LAUNCH.0,
    /// Waiting for the GPU: a stream, event or context synchronize.
    Sync = RawCallKind::CALL_SYNC.0,
    /// A copy that returns only once the GPU has produced the data (device to host).
    Copy = RawCallKind::CALL_COPY.0,
    /// An NCCL collective, point-to-point or group call, or communicator set-up and teardown.
    Nccl = RawCallKind::CALL_NCCL.0,
}

impl CallKind {
    pub const ALL: [CallKind; 4] = [CallKind::Launch, CallKind::Sync, CallKind::Copy, CallKind::Nccl];

    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Launch => "launch",
            CallKind::Sync => "sync",
            CallKind::Copy => "copy",
            CallKind::Nccl => "nccl",
        }
    }

    /// Whether the call's duration is measured (a return probe), not only its count.
    pub fn timed(self) -> bool {
        self != CallKind::Launch
    }
}

/// One operation of the driver API, as `cuGetProcAddress` is asked for it (`name`), with
/// every entry point a driver hands out for it: the legacy name, the versioned ones (`_v2`),
/// and the per-thread default stream variants (`_ptsz`, `_ptds`). The real driver is checked
/// against this table by a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operation {
    pub name: &'static str,
    pub kind: CallKind,
    pub entry_points: &'static [&'static str],
}

const fn op(name: &'static str, kind: CallKind, entry_points: &'static [&'static str]) -> Operation {
    Operation { name, kind, entry_points }
}

/// What a CUDA program does with the driver that Ringside observes.
pub const CUDA_DRIVER_OPERATIONS: &[Operation] = &[
    // Launches (probed only with `Probes::launches`).
    op("cuLaunchKernel", CallKind::Launch, &["cuLaunchKernel", "cuLaunchKernel_ptsz"]),
    op("cuLaunchKernelEx", CallKind::Launch, &["cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"]),
    op("cuLaunchCooperativeKernel", CallKind::Launch, &["cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz"]),
    op("cuLaunchCooperativeKernelMultiDevice", CallKind::Launch, &["cuLaunchCooperativeKernelMultiDevice"]),
    op("cuGraphLaunch", CallKind::Launch, &["cuGraphLaunch", "cuGraphLaunch_ptsz"]),
    op("cuLaunch", CallKind::Launch, &["cuLaunch"]),
    op("cuLaunchGrid", CallKind::Launch, &["cuLaunchGrid"]),
    op("cuLaunchGridAsync", CallKind::Launch, &["cuLaunchGridAsync"]),
    // Waiting for the GPU.
    op("cuStreamSynchronize", CallKind::Sync, &["cuStreamSynchronize", "cuStreamSynchronize_ptsz"]),
    op("cuEventSynchronize", CallKind::Sync, &["cuEventSynchronize"]),
    op("cuCtxSynchronize", CallKind::Sync, &["cuCtxSynchronize", "cuCtxSynchronize_v2"]),
    // Copies the host waits for: device (or array, or another device) to host memory. The
    // unified ones (`cuMemcpy`, 2D, 3D, peer) may go either way; D2H to pageable memory blocks
    // even when named Async (`.item()`, `.cpu()` in PyTorch).
    op("cuMemcpyDtoH", CallKind::Copy, &["cuMemcpyDtoH", "cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds"]),
    op(
        "cuMemcpyDtoHAsync",
        CallKind::Copy,
        &["cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz"],
    ),
    op("cuMemcpyAtoH", CallKind::Copy, &["cuMemcpyAtoH", "cuMemcpyAtoH_v2", "cuMemcpyAtoH_v2_ptds"]),
    op("cuMemcpy", CallKind::Copy, &["cuMemcpy", "cuMemcpy_ptds"]),
    op("cuMemcpy2D", CallKind::Copy, &["cuMemcpy2D", "cuMemcpy2D_v2", "cuMemcpy2D_v2_ptds"]),
    op(
        "cuMemcpy2DUnaligned",
        CallKind::Copy,
        &["cuMemcpy2DUnaligned", "cuMemcpy2DUnaligned_v2", "cuMemcpy2DUnaligned_v2_ptds"],
    ),
    op("cuMemcpy3D", CallKind::Copy, &["cuMemcpy3D", "cuMemcpy3D_v2", "cuMemcpy3D_v2_ptds"]),
    op("cuMemcpyPeer", CallKind::Copy, &["cuMemcpyPeer", "cuMemcpyPeer_ptds"]),
    op("cuMemcpy3DPeer", CallKind::Copy, &["cuMemcpy3DPeer", "cuMemcpy3DPeer_ptds"]),
];

/// Every NCCL call a rank can be stuck in, waiting for the others: the collectives (and their
/// `Config` forms), point-to-point and one-sided transfers (pipeline parallelism), the end of
/// a group (where grouped calls really start), and communicator set-up and teardown (a rank
/// that never joins hangs every other rank in `ncclCommInitRank`). With real NCCL most of them
/// only enqueue work; the wait is then in the synchronize that follows, which the BPF side
/// counts as the collective's.
pub const NCCL_CALLS: &[&str] = &[
    "ncclAllReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclBroadcast",
    "ncclBcast",
    "ncclReduce",
    "ncclAlltoAll",
    "ncclGather",
    "ncclScatter",
    "ncclAllReduceConfig",
    "ncclAllGatherConfig",
    "ncclReduceScatterConfig",
    "ncclBroadcastConfig",
    "ncclReduceConfig",
    "ncclAlltoAllConfig",
    "ncclGatherConfig",
    "ncclScatterConfig",
    "ncclSend",
    "ncclRecv",
    "ncclPutSignal",
    "ncclSignal",
    "ncclWaitSignal",
    "ncclGroupEnd",
    "ncclCommInitRank",
    "ncclCommInitRankConfig",
    "ncclCommInitRankScalable",
    "ncclCommInitAll",
    "ncclCommSplit",
    "ncclCommShrink",
    "ncclCommGrow",
    "ncclCommFinalize",
    "ncclCommDestroy",
];

/// NCCL's exports that are deliberately not probed: none of them waits for another rank
/// (queries, memory registration, reduction operators, parameters, debugging, the opening of
/// a group, device-side communicator set-up). A test holds every function the real library
/// exports to either list, so a new NCCL's new call is looked at, not missed.
pub const NCCL_NOT_PROBED: &[&str] = &[
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommGetUniqueId",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclCommGetAsyncError",
    "ncclCommCount",
    "ncclCommCuDevice",
    "ncclCommUserRank",
    "ncclCommQueryProperties",
    "ncclCommMemStats",
    "ncclCommAbort",
    "ncclCommRevoke",
    "ncclCommSuspend",
    "ncclCommResume",
    "ncclCommRegister",
    "ncclCommDeregister",
    "ncclCommWindowRegister",
    "ncclCommWindowDeregister",
    "ncclWinGetUserPtr",
    "ncclMemAlloc",
    "ncclMemFree",
    "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy",
    "ncclGroupStart",
    "ncclGroupSimulateEnd",
    "ncclSetEncryption",
    "ncclResetDebugInit",
    "ncclResetDebugInitInternal",
];

/// Families of NCCL exports not probed, by prefix: parameters, and the device-side API
/// (teams, symmetric memory, GPU-initiated networking), which set up what kernels use and
/// never wait for another rank on the host.
pub const NCCL_NOT_PROBED_PREFIXES: &[&str] = &[
    "ncclParam",
    "ncclTeam",
    "ncclDevComm",
    "ncclGin",
    "ncclLLA2A",
    "ncclLsa",
    "ncclGetLsa",
    "ncclGetMultimem",
    "ncclGetPeer",
    "ncclGetCft",
];

/// Which calls to probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Probes {
    /// Count every kernel launch with a uprobe on it. Off by default: exact counts, at the
    /// price of a trap per launch (see `docs/scheduler.md`).
    pub launches: bool,
}

/// Which library a file is, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuLibrary {
    /// `libcuda.so*`: the driver.
    Driver,
    /// `libcudart.so*`: the runtime (not probed; its code counts as driver time).
    Runtime,
    /// `libnccl.so*`.
    Nccl,
}

impl GpuLibrary {
    pub fn of(path: &Path) -> Option<GpuLibrary> {
        let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
        if file.starts_with("libcuda.so") {
            Some(GpuLibrary::Driver)
        } else if file.starts_with("libcudart.so") {
            Some(GpuLibrary::Runtime)
        } else if file.starts_with("libnccl.so") {
            Some(GpuLibrary::Nccl)
        } else {
            None
        }
    }

    /// Whether time a thread spends running this library's code is time spent driving the GPU
    /// (the tick sampler's ranges).
    pub fn drives_gpu(self) -> bool {
        matches!(self, GpuLibrary::Driver | GpuLibrary::Runtime)
    }
}

/// The calls to probe in a library, from its file name; empty for other libraries (and for
/// the runtime).
pub fn calls_of_library(path: &Path, probes: Probes) -> Vec<(&'static str, CallKind)> {
    match GpuLibrary::of(path) {
        Some(GpuLibrary::Driver) => CUDA_DRIVER_OPERATIONS
            .iter()
            .filter(|o| probes.launches || o.kind != CallKind::Launch)
            .flat_map(|o| o.entry_points.iter().map(move |f| (*f, o.kind)))
            .collect(),
        Some(GpuLibrary::Nccl) => NCCL_CALLS.iter().map(|f| (*f, CallKind::Nccl)).collect(),
        Some(GpuLibrary::Runtime) | None => Vec::new(),
    }
}

/// Whether a library is one whose calls may be probed (whatever [`Probes`] says).
pub fn is_probed_library(path: &Path) -> bool {
    matches!(GpuLibrary::of(path), Some(GpuLibrary::Driver | GpuLibrary::Nccl))
}

/// A probed function found in a library: where its code starts in the file, and where its
/// probe goes (the first instruction the kernel emulates when a probe fires, a few bytes on,
/// where that is safe: see the `placement` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryPoint {
    pub function: &'static str,
    pub kind: CallKind,
    pub offset: u64,
    pub probe_at: u64,
}

/// The probed functions (by [`calls_of_library`] of its name) that a library file of `size`
/// bytes defines, read with bounded positioned reads (the `elf` module). Two names at one
/// offset (an alias) are one entry point.
pub fn library_entry_points(
    file: &std::fs::File,
    size: u64,
    library: &Path,
    probes: Probes,
) -> Result<Vec<EntryPoint>, ElfError> {
    let calls = calls_of_library(library, probes);
    let names: Vec<&str> = calls.iter().map(|(f, _)| *f).collect();
    let found = elf::function_offsets(file, size, &names)?;
    let mut entries: Vec<EntryPoint> = Vec::with_capacity(found.len());
    for (i, offset) in found {
        if !entries.iter().any(|e| e.offset == offset) {
            let probe_at = offset + placement::emulated_offset(&prologue(file, size, offset)) as u64;
            entries.push(EntryPoint { function: calls[i].0, kind: calls[i].1, offset, probe_at });
        }
    }
    Ok(entries)
}

/// The first bytes of the function at `offset` (fewer at the end of the file; none if they
/// cannot be read).
fn prologue(file: &std::fs::File, size: u64, offset: u64) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let len = size.saturating_sub(offset).min(placement::PROLOGUE_BYTES as u64) as usize;
    let mut bytes = vec![0; len];
    match file.read_exact_at(&mut bytes, offset) {
        Ok(()) => bytes,
        Err(_) => Vec::new(),
    }
}

/// Every function a library file exports, with its file offset (bounded reads, as above):
/// for the tests that hold a real library to the tables here.
pub fn library_exports(file: &std::fs::File, size: u64) -> Result<Vec<(String, u64)>, ElfError> {
    elf::exported_functions(file, size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_entry_point_is_listed_once_and_named_after_its_operation() {
        let mut seen = std::collections::HashSet::new();
        for op in CUDA_DRIVER_OPERATIONS {
            assert!(op.entry_points.contains(&op.name), "{} lists its own name", op.name);
            for f in op.entry_points {
                assert!(f.starts_with(op.name), "{f} is a form of {}", op.name);
                assert!(seen.insert(*f), "{f} listed twice");
            }
        }
        for f in NCCL_CALLS {
            assert!(seen.insert(*f), "{f} listed twice");
            assert!(!NCCL_NOT_PROBED.contains(f) && !NCCL_NOT_PROBED_PREFIXES.iter().any(|p| f.starts_with(p)));
        }
    }

    #[test]
    fn launches_are_probed_only_when_asked() {
        let driver = Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.1");
        let default = calls_of_library(driver, Probes::default());
        assert!(default.iter().all(|(_, k)| *k != CallKind::Launch));
        assert!(default.contains(&("cuStreamSynchronize_ptsz", CallKind::Sync)));
        assert!(default.contains(&("cuMemcpyDtoH_v2_ptds", CallKind::Copy)));
        let all = calls_of_library(driver, Probes { launches: true });
        assert!(all.contains(&("cuLaunchKernelEx_ptsz", CallKind::Launch)));
        assert_eq!(all.len(), default.len() + 12);
        assert!(calls_of_library(Path::new("/x/libcudart.so.12"), Probes { launches: true }).is_empty());
        assert_eq!(calls_of_library(Path::new("/x/libnccl.so.2"), Probes::default()).len(), NCCL_CALLS.len());
        assert!(calls_of_library(Path::new("/x/libcudnn.so.9"), Probes::default()).is_empty());
        assert_eq!(GpuLibrary::of(Path::new("/x/libcudart.so.12")), Some(GpuLibrary::Runtime));
        assert!(GpuLibrary::Runtime.drives_gpu() && !GpuLibrary::Nccl.drives_gpu());
    }
}
