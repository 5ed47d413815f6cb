//! A library file a process maps (any bytes: its owner wrote them): the CUDA and NCCL entry
//! points are looked up in it with bounded reads, and where each probe goes is decided from
//! the bytes at each one, as the daemon does before attaching uprobes.
#![no_main]

use std::io::Write;
use std::os::fd::FromRawFd;
use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor is owned by the File.
    let fd = unsafe { libc::memfd_create(c"fuzz-elf".as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create failed");
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.write_all(data).expect("write to memfd");
    let size = data.len() as u64;
    for library in ["libcuda.so.1", "libcudart.so.12", "libnccl.so.2"] {
        for launches in [false, true] {
            let probes = ringside_bpf::Probes { launches };
            if let Ok(entries) = ringside_bpf::library_entry_points(&file, size, Path::new(library), probes) {
                for e in entries {
                    assert!(e.offset < size && e.probe_at >= e.offset && e.probe_at < e.offset + 32, "{e:?}");
                }
            }
        }
    }
    let _ = ringside_bpf::library_exports(&file, size);
});
