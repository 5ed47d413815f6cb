//! NVIDIA's own user-space libraries for the tests, on machines without a GPU: the driver
//! (`libcuda.so.1`) and NVML (`libnvidia-ml.so.1`) from Debian's `non-free` component, and NCCL
//! (`libnccl.so.2`) from PyPI's `nvidia-nccl-cu12` wheel.
//!
//! Nothing is installed: the packages are downloaded with a private apt state (the system's
//! sources and lists are not touched) and unpacked with `dpkg-deb -x`, the wheel unzipped, into
//! `<cache>/nvidia` (`~/.cache/ringside/nvidia`, or under `RINGSIDE_CACHE_DIR`):
//!
//! - `lib/`: `libcuda.so.1` and `libnvidia-ml.so.1` (with their versioned files);
//! - `nccl/libnccl.so.2`.
//!
//! Idempotent: what is there is not fetched again. The tests find the files through
//! `RINGSIDE_NVIDIA_DIR` (set by `cargo xtask test`), else at the default place.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::step;

/// Where Debian keeps NVIDIA's driver libraries (`non-free`, bookworm: 535.x).
const DEBIAN_SOURCE: &str = "deb http://deb.debian.org/debian bookworm main non-free";
const DRIVER_PACKAGES: &[&str] = &["libcuda1", "libnvidia-ml1"];
/// NCCL as PyTorch's CUDA 12 wheels bring it; pinned, so that a new NCCL's new calls are
/// looked at by choice (bump it here, and the export test says what is new).
const NCCL_WHEEL: &str = "nvidia-nccl-cu12==2.32.3";

/// `<cache>/nvidia`.
pub fn dir() -> PathBuf {
    crate::vm::cache_dir().join("nvidia")
}

/// Fetches what is missing; returns `<cache>/nvidia`.
pub fn fetch() -> Result<PathBuf> {
    let dir = dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let lib = dir.join("lib");
    if !lib.join("libcuda.so.1").exists() || !lib.join("libnvidia-ml.so.1").exists() {
        driver(&dir).context("fetching NVIDIA's driver libraries from Debian non-free")?;
    }
    let nccl = dir.join("nccl").join("libnccl.so.2");
    if !nccl.exists() {
        nccl_library(&dir).context("fetching NCCL from PyPI")?;
    }
    Ok(dir)
}

fn run(command: &mut Command) -> Result<()> {
    let shown = format!("{command:?}");
    let status = command.status().with_context(|| format!("cannot run {shown}"))?;
    if !status.success() {
        bail!("{shown} failed ({status})");
    }
    Ok(())
}

/// `libcuda1` and `libnvidia-ml1`, downloaded with a private apt state and unpacked.
fn driver(dir: &Path) -> Result<()> {
    if !Path::new("/usr/bin/apt-get").exists() || !Path::new("/usr/bin/dpkg-deb").exists() {
        bail!("apt-get and dpkg-deb are needed (Debian or Ubuntu)");
    }
    step(&format!("downloading {} from Debian non-free into {}", DRIVER_PACKAGES.join(", "), dir.display()));
    let apt = dir.join("apt");
    let debs = dir.join("debs");
    let root = dir.join("root");
    for d in [apt.join("lists/partial"), apt.join("cache/archives/partial"), debs.clone()] {
        std::fs::create_dir_all(&d)?;
    }
    let sources = apt.join("sources.list");
    std::fs::write(&sources, format!("{DEBIAN_SOURCE}\n"))?;
    let options = [
        format!("-oDir::State::Lists={}", apt.join("lists").display()),
        format!("-oDir::Etc::SourceList={}", sources.display()),
        "-oDir::Etc::SourceParts=/dev/null".to_string(),
        format!("-oDir::Cache={}", apt.join("cache").display()),
        // Downloads land in a root-owned directory apt's sandbox user cannot write.
        "-oAPT::Sandbox::User=root".to_string(),
    ];
    run(Command::new("apt-get").args(&options).args(["-q", "update"]))?;
    run(Command::new("apt-get").args(&options).args(["-q", "download"]).args(DRIVER_PACKAGES).current_dir(&debs))?;
    let _ = std::fs::remove_dir_all(&root);
    for deb in std::fs::read_dir(&debs)?.flatten().map(|e| e.path()) {
        if deb.extension().is_some_and(|e| e == "deb") {
            run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        }
    }
    let found = find_dir_with(&root, "libcuda.so.1", 8)
        .with_context(|| format!("no libcuda.so.1 in the unpacked packages under {}", root.display()))?;
    // One stable name for the tests, whatever the packages' layout.
    let lib = dir.join("lib");
    let _ = std::fs::remove_file(&lib);
    std::os::unix::fs::symlink(&found, &lib)?;
    std::fs::remove_dir_all(&debs)?;
    std::fs::remove_dir_all(&apt)?;
    Ok(())
}

/// `libnccl.so.2` out of the pinned wheel (the wheel itself is not kept: 350 MB).
fn nccl_library(dir: &Path) -> Result<()> {
    step(&format!("downloading {NCCL_WHEEL} from PyPI into {}", dir.display()));
    let wheel_dir = dir.join("wheel");
    let _ = std::fs::remove_dir_all(&wheel_dir);
    std::fs::create_dir_all(&wheel_dir)?;
    run(Command::new("python3")
        .args(["-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d"])
        .arg(&wheel_dir)
        .arg(NCCL_WHEEL))
    .context("python3 with pip is needed")?;
    let wheel = std::fs::read_dir(&wheel_dir)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .context("pip downloaded no wheel")?;
    let unpacked = wheel_dir.join("unpacked");
    run(Command::new("python3").args(["-m", "zipfile", "-e"]).arg(&wheel).arg(&unpacked))?;
    let found = find_dir_with(&unpacked, "libnccl.so.2", 6).context("no libnccl.so.2 in the wheel")?;
    let target = dir.join("nccl");
    std::fs::create_dir_all(&target)?;
    std::fs::rename(found.join("libnccl.so.2"), target.join("libnccl.so.2"))?;
    std::fs::remove_dir_all(&wheel_dir)?;
    Ok(())
}

/// The first directory under `root` (at most `depth` levels down) holding a file `name`.
fn find_dir_with(root: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    if root.join(name).exists() {
        return Some(root.to_path_buf());
    }
    if depth == 0 {
        return None;
    }
    let mut dirs: Vec<PathBuf> =
        std::fs::read_dir(root).ok()?.flatten().map(|e| e.path()).filter(|p| p.is_dir() && !p.is_symlink()).collect();
    dirs.sort();
    dirs.into_iter().find_map(|d| find_dir_with(&d, name, depth - 1))
}
