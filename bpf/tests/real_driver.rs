//! The entry point tables (`calls.rs`) held to NVIDIA's real libraries: the driver
//! `libcuda.so.1` (Debian non-free's `libcuda1`) and `libnccl.so.2` (PyPI's `nvidia-nccl-cu12`),
//! which `cargo xtask setup --test` unpacks into the cache. The driver loads without a GPU:
//! `cuInit` answers 100 (no device) and `cuGetProcAddress_v2` still hands out entry points,
//! which is how the CUDA runtime reaches the driver.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::time::Instant;

use ringside_bpf::{
    library_entry_points, library_exports, CallKind, Probes, CUDA_DRIVER_OPERATIONS, NCCL_CALLS, NCCL_NOT_PROBED,
    NCCL_NOT_PROBED_PREFIXES,
};

type CuInit = unsafe extern "C" fn(u32) -> c_int;
type GetProcAddress = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;

/// `CU_GET_PROC_ADDRESS_DEFAULT`, `_LEGACY_STREAM`, `_PER_THREAD_DEFAULT_STREAM`.
const FLAGS: [(u64, &str); 3] = [(0, "default"), (1, "legacy stream"), (2, "per-thread default stream")];
/// The oldest runtime that asks `cuGetProcAddress` to the newest.
const VERSIONS: [c_int; 6] = [11030, 11080, 12000, 12020, 12080, 13000];

/// Where `cargo xtask setup --test` unpacked NVIDIA's libraries.
fn nvidia_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RINGSIDE_NVIDIA_DIR") {
        return dir.into();
    }
    let cache = std::env::var_os("RINGSIDE_CACHE_DIR").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(|| PathBuf::from("/var/cache"))
            .join("ringside")
    });
    cache.join("nvidia")
}

fn real(file: &str) -> PathBuf {
    let path = nvidia_dir().join(file);
    assert!(path.exists(), "{} is missing: `cargo xtask setup --test` fetches NVIDIA's libraries", path.display());
    path
}

fn open(path: &Path) -> (std::fs::File, u64) {
    let file = std::fs::File::open(path).unwrap();
    let size = file.metadata().unwrap().len();
    (file, size)
}

#[test]
fn every_entry_point_the_real_driver_hands_out_is_probed() {
    let path = real("lib/libcuda.so.1");
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid path; the handle stays open for the test process's life.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen {}", path.display());
    let symbol = |name: &str| {
        let c = CString::new(name).unwrap();
        // SAFETY: a handle from dlopen and a valid name.
        let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
        assert!(!p.is_null(), "the driver exports {name}");
        p
    };
    // SAFETY: the driver's own signatures.
    let (init, get) = unsafe {
        (
            std::mem::transmute::<*mut c_void, CuInit>(symbol("cuInit")),
            std::mem::transmute::<*mut c_void, GetProcAddress>(symbol("cuGetProcAddress_v2")),
        )
    };
    // SAFETY: cuInit takes flags, 0 here.
    let initialised = unsafe { init(0) };
    assert!(initialised == 0 || initialised == 100, "cuInit: {initialised} (0, or 100: no device)");

    // Every entry point handed out, by flag and operation; and what is missing from the table.
    let mut handed: BTreeMap<(u64, &str), std::collections::BTreeSet<String>> = BTreeMap::new();
    let mut missing = Vec::new();
    for op in CUDA_DRIVER_OPERATIONS {
        let name = CString::new(op.name).unwrap();
        for (flag, _) in FLAGS {
            for version in VERSIONS {
                let mut pointer: *mut c_void = std::ptr::null_mut();
                let mut status: c_int = 0;
                // SAFETY: a valid name and out-parameters living across the call.
                let result = unsafe { get(name.as_ptr(), &mut pointer, version, flag, &mut status) };
                if result != 0 || pointer.is_null() {
                    continue;
                }
                let mut info: libc::Dl_info = libc::Dl_info {
                    dli_fname: std::ptr::null(),
                    dli_fbase: std::ptr::null_mut(),
                    dli_sname: std::ptr::null(),
                    dli_saddr: std::ptr::null_mut(),
                };
                // SAFETY: dladdr reads the address and fills the struct.
                let found = unsafe { libc::dladdr(pointer, &mut info) } != 0 && !info.dli_sname.is_null();
                // SAFETY: dli_sname, when set, is a NUL-terminated name of the driver's table.
                let export = found.then(|| unsafe { CStr::from_ptr(info.dli_sname) }.to_string_lossy().into_owned());
                match export {
                    Some(export) if info.dli_saddr == pointer && op.entry_points.contains(&export.as_str()) => {
                        handed.entry((flag, op.name)).or_default().insert(export);
                    }
                    Some(export) if info.dli_saddr == pointer => missing.push(format!(
                        "{} (flag {flag}, CUDA {version}) is handed out as {export}, which is not probed",
                        op.name
                    )),
                    other => missing.push(format!(
                        "{} (flag {flag}, CUDA {version}) is handed out as an unexported function near {other:?}",
                        op.name
                    )),
                }
            }
        }
    }
    for (flag, what) in FLAGS {
        let listed: Vec<String> = handed
            .iter()
            .filter(|((f, _), _)| *f == flag)
            .map(|((_, op), names)| format!("{op} -> {}", names.iter().cloned().collect::<Vec<_>>().join("|")))
            .collect();
        println!("{what} (flag {flag}): {}", listed.join(", "));
    }
    assert!(
        missing.is_empty(),
        "entry points the driver hands out that Ringside does not probe:\n{}",
        missing.join("\n")
    );
    for op in CUDA_DRIVER_OPERATIONS {
        assert!(handed.contains_key(&(0, op.name)), "the driver hands out {} (CUDA 11.3 to 13.0)", op.name);
    }

    // The same file read as the daemon reads it (29 MB; bounded positioned reads): every entry
    // point handed out is found, so the probe goes on it.
    let (file, size) = open(&path);
    let started = Instant::now();
    let entries = library_entry_points(&file, size, &path, Probes { launches: true }).expect("the real driver reads");
    println!(
        "read the real driver's entry points ({} MB) in {:.2} ms: {} found",
        size / 1_000_000,
        started.elapsed().as_secs_f64() * 1e3,
        entries.len()
    );
    let by_name: BTreeMap<&str, CallKind> = entries.iter().map(|e| (e.function, e.kind)).collect();
    for ((_, op), names) in &handed {
        let kind = CUDA_DRIVER_OPERATIONS.iter().find(|o| o.name == *op).unwrap().kind;
        for name in names {
            assert_eq!(by_name.get(name.as_str()), Some(&kind), "{name} is found in the file as a {kind:?}");
        }
    }
    // Every entry of the driver begins with a RIP-relative compare, which the kernel would have
    // to single-step: the probe goes on the conditional jump after it, ten bytes on.
    let moved: Vec<u64> = entries.iter().map(|e| e.probe_at - e.offset).collect();
    assert!(moved.iter().all(|m| *m == 10), "probe offsets past each entry: {moved:?}");
    let default = library_entry_points(&file, size, &path, Probes::default()).unwrap();
    assert!(default.iter().all(|e| e.kind != CallKind::Launch), "launches are probed only when asked");
    assert!(default.iter().any(|e| e.function == "cuStreamSynchronize_ptsz"));
    assert!(default.iter().any(|e| e.function == "cuMemcpyDtoH_v2_ptds"));
}

#[test]
fn every_nccl_export_is_probed_or_known_not_to_wait() {
    let path = real("nccl/libnccl.so.2");
    let (file, size) = open(&path);
    let started = Instant::now();
    let exports = library_exports(&file, size).expect("the real NCCL reads");
    let took = started.elapsed();
    let nccl: Vec<&str> = exports.iter().map(|(n, _)| n.as_str()).filter(|n| n.starts_with("nccl")).collect();
    println!(
        "read the real NCCL's exports ({} MB) in {:.2} ms: {} functions, {} nccl*",
        size / 1_000_000,
        took.as_secs_f64() * 1e3,
        exports.len(),
        nccl.len()
    );
    let unknown: Vec<&&str> = nccl
        .iter()
        .filter(|n| {
            !NCCL_CALLS.contains(n)
                && !NCCL_NOT_PROBED.contains(n)
                && !NCCL_NOT_PROBED_PREFIXES.iter().any(|p| n.starts_with(p))
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "NCCL exports these, neither probed nor known not to wait for other ranks (calls.rs): {unknown:?}"
    );
    let absent: Vec<&&str> = NCCL_CALLS.iter().filter(|c| !nccl.contains(c)).collect();
    println!("probed names this NCCL does not have: {absent:?}");
    for call in [
        "ncclAllReduce",
        "ncclReduce",
        "ncclAlltoAll",
        "ncclSend",
        "ncclRecv",
        "ncclGroupEnd",
        "ncclCommInitRank",
        "ncclCommSplit",
    ] {
        assert!(nccl.contains(&call), "the real NCCL has {call}");
    }
    let entries = library_entry_points(&file, size, &path, Probes::default()).unwrap();
    assert_eq!(entries.len(), NCCL_CALLS.len() - absent.len(), "each probed call it has is an entry point");
    // NCCL's functions begin with a push, which the kernel emulates: probed at the entry.
    let moved: Vec<(&str, u64)> =
        entries.iter().filter(|e| e.probe_at != e.offset).map(|e| (e.function, e.probe_at - e.offset)).collect();
    assert!(moved.is_empty(), "{moved:?}");
}
