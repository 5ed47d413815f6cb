//! Builds the NVML test double (`doubles/nvml_test_double.c`) as `libnvidia-ml.so.1` in a
//! directory of its own (`$OUT_DIR/nvml`, exported as `RINGSIDE_NVML_DOUBLE_DIR`): a daemon
//! started with that directory on `LD_LIBRARY_PATH` reads its GPUs from the double.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("nvml");
    std::fs::create_dir_all(&out).expect("create OUT_DIR/nvml");
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo:rerun-if-changed=doubles/nvml_test_double.c");
    let cc = std::env::var_os("CC").map_or_else(|| "cc".into(), PathBuf::from);
    let status = Command::new(cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-o"])
        .arg(out.join("libnvidia-ml.so.1"))
        .arg("doubles/nvml_test_double.c")
        .status();
    match status {
        Ok(s) if s.success() => {}
        other => panic!("building the NVML test double failed ({other:?}): run `cargo xtask setup`"),
    }
    println!("cargo:rustc-env=RINGSIDE_NVML_DOUBLE_DIR={}", out.display());
}
