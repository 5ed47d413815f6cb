//! Builds the CUDA and NCCL test doubles (`doubles/*.c`) as shared libraries named like the real
//! ones (`libcuda.so.1`, `libnccl.so.2`: the scheduler recognises ML processes by the names of
//! the libraries they map) into `$OUT_DIR/doubles`, exported as `RINGSIDE_TEST_DOUBLES`; and the
//! do-nothing launch double, also as `libcuda.so.1`, into `$OUT_DIR/launch-double`, exported as
//! `RINGSIDE_LAUNCH_DOUBLE`.

use std::path::PathBuf;
use std::process::Command;

/// The C compiler: `$CC`, else `cc` (the linker Rust itself needs, so always there).
fn cc() -> PathBuf {
    std::env::var_os("CC").map_or_else(|| "cc".into(), PathBuf::from)
}

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("doubles");
    std::fs::create_dir_all(&out).expect("create OUT_DIR/doubles");
    println!("cargo:rerun-if-env-changed=CC");
    let launch = out.with_file_name("launch-double");
    std::fs::create_dir_all(&launch).expect("create OUT_DIR/launch-double");
    for (source, library) in [
        ("cuda_test_double.c", out.join("libcuda.so.1")),
        ("nccl_test_double.c", out.join("libnccl.so.2")),
        ("launch_test_double.c", launch.join("libcuda.so.1")),
    ] {
        println!("cargo:rerun-if-changed=doubles/{source}");
        let status = Command::new(cc())
            .args(["-shared", "-fPIC", "-O2", "-pthread", "-Wall", "-o"])
            .arg(&library)
            .arg(format!("doubles/{source}"))
            .status();
        match status {
            Ok(s) if s.success() => {}
            other => {
                panic!("building the {} test double failed ({other:?}): run `cargo xtask setup`", library.display())
            }
        }
    }
    println!("cargo:rustc-env=RINGSIDE_TEST_DOUBLES={}", out.display());
    println!("cargo:rustc-env=RINGSIDE_LAUNCH_DOUBLE={}", launch.join("libcuda.so.1").display());
}
