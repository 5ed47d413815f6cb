//! Compiles `src/bpf/*.bpf.c` with clang and generates the libbpf-rs skeletons into OUT_DIR.
//! The compiler is `$RINGSIDE_CLANG`, else `clang-19` (Debian 12), else `clang`.

use std::path::PathBuf;

fn clang() -> PathBuf {
    if let Some(path) = std::env::var_os("RINGSIDE_CLANG") {
        return path.into();
    }
    for candidate in ["/usr/bin/clang-19", "/usr/bin/clang"] {
        if std::path::Path::new(candidate).exists() {
            return candidate.into();
        }
    }
    "clang".into()
}

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bpf_dir = manifest.join("src/bpf");
    println!("cargo:rerun-if-env-changed=RINGSIDE_CLANG");
    for file in ["sched.bpf.c", "intf.h", "vmlinux.h", "scx.bpf.c", "scx_intf.h", "vmlinux_scx.h"] {
        println!("cargo:rerun-if-changed={}", bpf_dir.join(file).display());
    }
    // sched.bpf.c: the observation programs; scx.bpf.c: the sched_ext scheduler (its own
    // vmlinux header: the host's kernel has no sched_ext types).
    for name in ["sched", "scx"] {
        libbpf_cargo::SkeletonBuilder::new()
            .source(bpf_dir.join(format!("{name}.bpf.c")))
            .clang(clang())
            .clang_args([format!("-I{}", bpf_dir.display())])
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .unwrap_or_else(|e| {
                panic!("building the BPF programs ({name}.bpf.c) failed: {e:#}\n(needs clang-19 or $RINGSIDE_CLANG, libelf-dev and zlib1g-dev: `cargo xtask setup`)")
            });
    }
}
