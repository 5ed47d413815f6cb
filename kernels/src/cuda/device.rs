//! The process's CUDA device: found and checked once (driver library, device, compute
//! capability, NVRTC), with every ring kernel compiled by NVRTC into one module at that time.
//! A machine that cannot run them gets a reason, never a panic: cudarc panics when a library
//! it loads at run time is missing, so the libraries are looked for first, and the whole
//! set-up runs under `catch_unwind` for what cannot be checked beforehand (a missing symbol in
//! an old library).

use std::fmt;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaModule, DriverError};
use cudarc::nvrtc::{self, CompileError, CompileOptions, Ptx};
use ringside_shared::KernelKind;

use super::layout;

const RING: &str = include_str!("../../cuda/ring.cuh");
const KERNEL_SOURCES: [(KernelKind, &str); 3] = [
    (KernelKind::Echo, include_str!("../../cuda/echo.cu")),
    (KernelKind::Stats, include_str!("../../cuda/stats.cu")),
    (KernelKind::Saxpy, include_str!("../../cuda/saxpy.cu")),
];

/// Oldest compute capability the kernels run on: system-scope acquire/release and `nanosleep`
/// came with 7.0 (Volta).
const MIN_ARCH: i32 = 70;

/// What the CUDA backend found on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub compute_capability: (i32, i32),
    /// The virtual architecture the kernels were compiled for (`compute_90`).
    pub arch: String,
    /// The driver's CUDA version, e.g. 13000 for 13.0.
    pub driver_version: i32,
    pub nvrtc_version: (i32, i32),
    pub total_memory: usize,
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor) = self.compute_capability;
        write!(
            f,
            "{} (compute {major}.{minor}, {} GiB), driver CUDA {}.{}, NVRTC {}.{}, kernels built for {}",
            self.name,
            self.total_memory >> 30,
            self.driver_version / 1000,
            self.driver_version % 1000 / 10,
            self.nvrtc_version.0,
            self.nvrtc_version.1,
            self.arch
        )
    }
}

/// The ring kernels' two entry points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// The loop that runs until told to stop.
    Persistent,
    /// One launch that processes what is queued, then returns (the benchmark's baseline).
    Once,
}

pub(crate) struct Device {
    pub ctx: Arc<CudaContext>,
    pub info: DeviceInfo,
    _module: Arc<CudaModule>,
    functions: Vec<(KernelKind, Entry, CudaFunction)>,
}

impl Device {
    pub(crate) fn function(&self, kernel: KernelKind, entry: Entry) -> Option<&CudaFunction> {
        self.functions.iter().find(|(k, e, _)| *k == kernel && *e == entry).map(|(_, _, f)| f)
    }
}

/// The device, set up on first use; `Err` says why this machine cannot run CUDA kernels.
pub(crate) fn device() -> Result<Arc<Device>, String> {
    static DEVICE: OnceLock<Result<Arc<Device>, String>> = OnceLock::new();
    DEVICE
        .get_or_init(|| match std::panic::catch_unwind(set_up) {
            Ok(result) => result.map(Arc::new),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("a panic without a message");
                Err(format!("the CUDA libraries failed while being set up: {what}"))
            }
        })
        .clone()
}

/// What a driver error is called and what it means, e.g.
/// `CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)`.
pub(crate) fn describe(error: DriverError) -> String {
    let name =
        error.error_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", error.0));
    match error.error_string() {
        Ok(text) => format!("{name} ({})", text.to_string_lossy()),
        Err(_) => name,
    }
}

/// The whole program NVRTC compiles: the generated layout, the shared loop, every kernel.
pub(crate) fn program_source() -> String {
    let mut source = layout::cuda_prelude();
    source.push_str(RING);
    for (_, kernel) in KERNEL_SOURCES {
        source.push_str(kernel);
    }
    source
}

/// The newest architecture NVRTC can compile for that the device runs: its own when NVRTC
/// knows it, else the closest older one (PTX runs on newer devices).
fn choose_arch(device: i32, supported: &[i32]) -> i32 {
    supported.iter().copied().filter(|a| *a <= device).max().unwrap_or(device)
}

fn nvrtc_supported_archs() -> Vec<i32> {
    let mut count = 0;
    // SAFETY: plain queries that fill the buffers they are given (`count` entries).
    unsafe {
        if nvrtc::sys::nvrtcGetNumSupportedArchs(&mut count).result().is_err() || count <= 0 {
            return Vec::new();
        }
        let mut archs = vec![0; count as usize];
        if nvrtc::sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()).result().is_err() {
            return Vec::new();
        }
        archs
    }
}

/// The kernels as NVRTC compiled them.
pub(crate) struct Compiled {
    pub ptx: Ptx,
    /// `compute_XY`.
    pub arch: String,
    pub nvrtc_version: (i32, i32),
}

/// Compiles every kernel with NVRTC for the newest architecture it knows up to `device_arch`
/// (e.g. 90). NVRTC needs no device, so this also runs where only the library is installed.
pub(crate) fn compile(device_arch: i32) -> Result<Compiled, String> {
    // SAFETY: only tries to load the library by its usual names.
    if !unsafe { nvrtc::sys::is_culib_present() } {
        return Err("no NVRTC library (libnvrtc.so.13 or .12) could be loaded; install the CUDA runtime compiler \
             (e.g. the cuda-nvrtc package) or add its directory to LD_LIBRARY_PATH"
            .into());
    }
    let mut nvrtc_version = (0, 0);
    // SAFETY: writes two ints.
    let _ = unsafe { nvrtc::sys::nvrtcVersion(&mut nvrtc_version.0, &mut nvrtc_version.1) }.result();
    let arch = choose_arch(device_arch, &nvrtc_supported_archs());
    if arch < MIN_ARCH {
        return Err(format!("NVRTC {}.{} cannot compile for compute 7.0 or newer", nvrtc_version.0, nvrtc_version.1));
    }
    let arch = format!("compute_{arch}");
    let options = CompileOptions {
        // No fused multiply-add: saxpy rounds a * x, then + y, as its CPU twin does.
        options: vec![format!("--gpu-architecture={arch}"), "--fmad=false".into()],
        name: Some("ring_kernels.cu".into()),
        ..Default::default()
    };
    let ptx = nvrtc::compile_ptx_with_opts(program_source(), options).map_err(|e| {
        let why = match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        };
        format!("NVRTC {}.{} could not compile the ring kernels for {arch}: {why}", nvrtc_version.0, nvrtc_version.1)
    })?;
    Ok(Compiled { ptx, arch, nvrtc_version })
}

/// PTX from NVRTC of a newer major version than the driver's CUDA cannot be loaded by that
/// driver (NVRTC 13 writes PTX 9.0, which needs a CUDA 13 driver): said plainly, before the
/// driver answers with an unsupported-PTX error.
fn version_mismatch(driver_version: i32, nvrtc_version: (i32, i32)) -> Option<String> {
    let driver_major = driver_version / 1000;
    (nvrtc_version.0 > driver_major).then(|| {
        format!(
            "NVRTC {}.{} writes code that the driver (CUDA {}.{}) cannot load; install NVRTC {driver_major} \
             (libnvrtc.so.{driver_major}) or a driver for CUDA {}",
            nvrtc_version.0,
            nvrtc_version.1,
            driver_major,
            driver_version % 1000 / 10,
            nvrtc_version.0
        )
    })
}

fn set_up() -> Result<Device, String> {
    // SAFETY: only tries to load the library by its usual names; no CUDA call is made.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so.1) could be loaded (is the NVIDIA driver installed?)".into());
    }
    result::init().map_err(|e| format!("the CUDA driver did not initialise: {}", describe(e)))?;
    let count = result::device::get_count().map_err(|e| format!("cannot count CUDA devices: {}", describe(e)))?;
    if count < 1 {
        return Err("the CUDA driver sees no device".into());
    }
    let mut driver_version = 0;
    // SAFETY: writes one int.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .map_err(|e| format!("cannot read the driver version: {}", describe(e)))?;
    let ctx = CudaContext::new(0).map_err(|e| format!("cannot open device 0: {}", describe(e)))?;
    // SAFETY: no CudaSlice is used; every kernel's memory is ordered by hand (memory.rs), and
    // event tracking would make the first new stream synchronize the whole context, which
    // never returns while a persistent kernel runs.
    unsafe { ctx.disable_event_tracking() };
    let name = ctx.name().unwrap_or_else(|_| "CUDA device 0".into());
    let (major, minor) = ctx.compute_capability().map_err(|e| format!("{name}: {}", describe(e)))?;
    let device_arch = major * 10 + minor;
    if device_arch < MIN_ARCH {
        return Err(format!("{name} has compute capability {major}.{minor}; the ring kernels need 7.0 or newer"));
    }
    let can_map = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY).unwrap_or(0);
    if can_map == 0 {
        return Err(format!("{name} cannot map host memory, which the rings live in"));
    }
    let total_memory = ctx.total_mem().unwrap_or(0);

    let Compiled { ptx, arch, nvrtc_version } = compile(device_arch)?;
    if let Some(why) = version_mismatch(driver_version, nvrtc_version) {
        return Err(why);
    }
    let module = ctx.load_module(ptx).map_err(|e| {
        format!(
            "the driver (CUDA {}.{}) could not load the kernels NVRTC {}.{} compiled: {}",
            driver_version / 1000,
            driver_version % 1000 / 10,
            nvrtc_version.0,
            nvrtc_version.1,
            describe(e)
        )
    })?;
    let mut functions = Vec::new();
    for (kernel, _) in KERNEL_SOURCES {
        for (entry, symbol) in [
            (Entry::Persistent, format!("ringside_{}", kernel.as_str())),
            (Entry::Once, format!("ringside_{}_once", kernel.as_str())),
        ] {
            let function =
                module.load_function(&symbol).map_err(|e| format!("kernel {symbol} is missing: {}", describe(e)))?;
            functions.push((kernel, entry, function));
        }
    }
    Ok(Device {
        ctx,
        info: DeviceInfo {
            name,
            compute_capability: (major, minor),
            arch,
            driver_version,
            nvrtc_version,
            total_memory,
        },
        _module: module,
        functions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvrtc_newer_than_the_driver_is_refused_with_what_to_install() {
        let why = version_mismatch(12_040, (13, 0)).expect("13 on a 12.4 driver");
        assert!(why.contains("NVRTC 13.0") && why.contains("CUDA 12.4") && why.contains("libnvrtc.so.12"), "{why}");
        assert_eq!(version_mismatch(13_000, (13, 0)), None);
        assert_eq!(version_mismatch(13_010, (12, 8)), None, "an older NVRTC's PTX loads on a newer driver");
    }

    #[test]
    fn the_arch_follows_the_device_within_what_nvrtc_knows() {
        assert_eq!(choose_arch(90, &[75, 80, 86, 89, 90, 100, 120]), 90);
        assert_eq!(choose_arch(103, &[75, 80, 90, 100, 120]), 100, "an NVRTC older than the device: its newest");
        assert_eq!(choose_arch(90, &[]), 90, "the list unknown: the device's own");
    }

    /// Nodes run CUDA 12 or 13 drivers and toolkits: the libraries are looked for under both
    /// majors' names (cudarc's `cuda-13000` feature searches `.so.13`, then `.so.12` and older).
    #[test]
    fn cuda_12_and_13_library_names_are_both_searched() {
        for (lib, names) in
            [("nvrtc", ["libnvrtc.so.13", "libnvrtc.so.12"]), ("cuda", ["libcuda.so.13", "libcuda.so.1"])]
        {
            let candidates = cudarc::get_lib_name_candidates(lib);
            for name in names {
                assert!(candidates.iter().any(|c| c == name), "{name} not among {candidates:?}");
            }
        }
    }

    #[test]
    fn the_program_has_every_entry_point() {
        let source = program_source();
        for kernel in crate::builtin::KERNELS.map(KernelKind::as_str) {
            assert!(source.contains(&format!("RS_KERNEL_ENTRIES({kernel}, ")), "{kernel}");
        }
        assert!(!source.contains("#include"), "NVRTC compiles it without headers");
    }

    /// NVRTC needs no GPU: where only the library is installed (e.g. `pip install
    /// nvidia-cuda-nvrtc==13.0.88` and its lib/ on LD_LIBRARY_PATH), the sources are compiled
    /// for real. The PTX is written to `RINGSIDE_PTX_OUT` if set, for `ptxas` to check.
    #[test]
    fn the_kernels_compile_where_nvrtc_is_present() {
        // SAFETY: only looks for the library.
        if !unsafe { nvrtc::sys::is_culib_present() } {
            println!("skipped: no NVRTC library here");
            return;
        }
        let compiled = match std::panic::catch_unwind(|| compile(90)) {
            Ok(result) => result.unwrap_or_else(|e| panic!("{e}")),
            Err(_) => panic!("NVRTC panicked"),
        };
        assert_eq!(compiled.arch, "compute_90");
        let ptx = compiled.ptx.to_src();
        for kernel in crate::builtin::KERNELS.map(KernelKind::as_str) {
            assert!(ptx.contains(&format!(".entry ringside_{kernel}(")), "{kernel}");
            assert!(ptx.contains(&format!(".entry ringside_{kernel}_once(")), "{kernel}");
        }
        assert!(!ptx.contains("fma.rn.f32"), "saxpy must not fuse a * x + y");
        if let Some(path) = std::env::var_os("RINGSIDE_PTX_OUT") {
            std::fs::write(path, ptx).expect("writing the PTX");
        }
    }

    #[test]
    fn a_machine_without_cuda_gets_a_reason_not_a_panic() {
        // On a GPU node this sets the device up for real; either way it must return.
        match device() {
            Ok(device) => assert!(device.function(KernelKind::Echo, Entry::Persistent).is_some()),
            Err(why) => assert!(!why.is_empty()),
        }
        // SAFETY: only looks for the library.
        if !unsafe { sys::is_culib_present() } {
            assert!(device().err().is_some_and(|why| why.contains("libcuda")));
        }
    }
}
