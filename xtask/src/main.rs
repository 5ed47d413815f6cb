//! `cargo xtask <command>`: Ringside's build automation, in Rust.
//!
//! - `setup [--test]`: installs what is missing (the wasm32 target; on Debian as root the apt
//!   packages; `--test` adds Chromium, ChromeDriver, promtool and Alertmanager, a pinned
//!   nightly toolchain with Miri, and NVIDIA's user-space driver and NCCL libraries, unpacked
//!   into the cache, not installed: see [`nvidia`]). Idempotent.
//! - `console`: builds the console (wasm32, `wasm-release` profile; with the dated nightly, its
//!   standard library rebuilt at the same size-first settings, installed if missing, else the
//!   stable one's, and says so) and runs wasm-bindgen (as a library pinned to the exact
//!   `wasm-bindgen` version in Cargo.lock) into `frontend/dist/`.
//! - `run [-- ARGS]`: setup, console, release build of `ringsided`, then runs it with ARGS.
//! - `test`: setup --test, console, `cargo fmt --check` and `cargo clippy -D warnings`, every
//!   test of the workspace (unit, end-to-end, browser), the ring's tests under Miri (`miri`),
//!   the fuzz targets (`fuzz`), then `vm-test`.
//! - `miri`: the ring's unit tests under Miri, which checks every access for undefined
//!   behaviour and data races and emulates weak memory, over several scheduling seeds.
//! - `fuzz [SECONDS]`: every fuzz target (`fuzz/`) for SECONDS (60) each (see [`fuzz`]).
//! - `package`: `target/debian/ringside_<version>_amd64.deb` (see [`package`]).
//! - `vm-test`: the sched_ext scheduler in a guest kernel under qemu (see [`vm`]).
//! - `vm-header`: refreshes `bpf/src/bpf/vmlinux_scx.h` from the guest kernel build.
//! - `bench [ring|decode|gpu|daemon|fanout|history|identity|console|stragglers|sched|launch|incidents|guest]`: the ring queue against rtrb
//!   and crossbeam-channel, the console's JSON reader against serde_json, the persistent CUDA kernel against launches per message (skipped
//!   without a GPU), what the idle daemon costs, WebSocket fan-out to 100 clients, the history's memory, disk and query times, the console's first paint and live data over
//!   loopback and a slow link, what reading a process's job
//!   identity costs it, how well the fleet rules name stragglers (two daemons, a real Prometheus), the
//!   scheduler's probe overhead and effect, what the probes add to a job's kernel launches
//!   ([`launch_bench`]), the incident recorder's cost beside ML workloads, and the sched_ext
//!   scheduler against setattr and the kernel's default in the guest (see `docs/performance.md`).

mod bench;
mod fuzz;
mod launch_bench;
mod nvidia;
mod package;
mod sched_bench;
mod vm;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

/// Debian packages, by command: a build needs the first list (clang and libelf for the BPF
/// programs), the tests the second too.
const BUILD_PACKAGES: &[&str] = &["clang-19", "libelf-dev", "zlib1g-dev", "pkg-config"];
const TEST_PACKAGES: &[&str] = &["chromium", "chromium-driver", "prometheus", "prometheus-alertmanager", "openssl"];
/// axe-core, which the browser tests run on every panel of the console (from npm, pinned).
const AXE_CORE: &str = "axe-core@4.14.1";
/// Miri, the fuzz targets and the console's standard library built for size need a nightly
/// toolchain; a dated one keeps each reproducible.
const NIGHTLY: &str = "nightly-2026-05-20";

/// The console's wasm32 flags: the linker keeps its relocations, which wasm-split reads to find
/// what each function uses.
const CONSOLE_STABLE_RUSTFLAGS: &str = r#"target.wasm32-unknown-unknown.rustflags=["-Clink-arg=--emit-relocs"]"#;
/// With the nightly's standard library rebuilt for size, the console's wasm32 flags gain panics
/// that abort where they happen (no formatting code, no file and line strings), and `{:?}` that
/// writes nothing (no `Debug` code; the console writes every text with `Display`, which a unit
/// test of the frontend checks). LLVM copies, moves and fills of more than 8 bytes become one
/// `memory.copy` or `memory.fill` (bulk memory, on in every browser the console supports)
/// instead of up to four pairs of 8-byte loads and stores written out: the views move their
/// values by copy at every step of building them, and this is 4% of the wasm. Cargo appends
/// these flags to `.cargo/config.toml`'s (Leptos' erased component views). The linker keeps its
/// relocations, as with the stable flags.
const CONSOLE_NIGHTLY_RUSTFLAGS: &str = r#"target.wasm32-unknown-unknown.rustflags=["-Zlocation-detail=none", "-Zunstable-options", "-Cpanic=immediate-abort", "-Zfmt-debug=none", "-Cllvm-args=-max-store-memcpy=1", "-Cllvm-args=-max-store-memmove=1", "-Cllvm-args=-max-store-memset=1", "-Clink-arg=--emit-relocs"]"#;

fn main() {
    if let Err(e) = run() {
        eprintln!("xtask: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    std::env::set_current_dir(&root).with_context(|| format!("cannot enter {}", root.display()))?;
    match args.first().map(String::as_str) {
        Some("setup") => setup(args.iter().any(|a| a == "--test")),
        Some("console") => console(&root).map(|_| ()),
        Some("run") => {
            setup(false)?;
            console(&root)?;
            cargo(&["build", "--release", "-p", "ringside-daemon"])?;
            let daemon_args: Vec<&str> = args[1..].iter().skip_while(|a| *a == "--").map(String::as_str).collect();
            step("starting ringsided (Ctrl-C stops it)");
            let status = Command::new(root.join("target/release/ringsided"))
                .args(daemon_args)
                .status()
                .context("cannot start target/release/ringsided")?;
            if !status.success() {
                bail!("ringsided exited with {status}");
            }
            Ok(())
        }
        Some("test") => test(&root),
        Some("package") => package::build(&root).map(|_| ()),
        Some("vm-test") => vm::run(&root, &guest_options(&args, false)),
        Some("miri") => miri_toolchain().and_then(|()| miri()),
        Some("fuzz") => {
            let seconds = match args.get(1) {
                Some(text) => text.parse().with_context(|| format!("{text:?}: seconds per target"))?,
                None => 60,
            };
            miri_toolchain().and_then(|()| fuzz::run(&root, seconds))
        }
        Some("vm-header") => vm::update_header(&root),
        Some("soak") => {
            // An hour (or MINUTES) of a busy node: tests/benches/soak.rs.
            let minutes = match args.get(1) {
                Some(text) => text.parse::<u64>().with_context(|| format!("{text:?}: minutes"))?,
                None => 60,
            };
            setup(false)?;
            cargo(&["build", "-p", "ringside-workload"])?;
            daemon_bench(&root, "soak", &[("RINGSIDE_SOAK_MINUTES", &minutes.to_string())])
        }
        Some("bench") => {
            let which = args.get(1).map(String::as_str).unwrap_or("all");
            if matches!(which, "all" | "ring") {
                // The ring against rtrb and crossbeam-channel, side by side (kernels/benches/ring.rs).
                cargo(&["bench", "-p", "ringside-kernels", "--bench", "ring"])?;
            }
            if matches!(which, "all" | "decode") {
                // The console's JSON reader against serde_json (shared/benches/decode.rs).
                cargo(&["bench", "-p", "ringside-shared", "--bench", "decode"])?;
            }
            if matches!(which, "all" | "gpu") {
                // The persistent CUDA kernel against a launch per message and a CUDA graph
                // (kernels/benches/gpu.rs); without a GPU it says why and succeeds.
                cargo(&["bench", "-p", "ringside-kernels", "--bench", "gpu"])?;
            }
            if matches!(which, "all" | "daemon") {
                cargo(&["build", "--release", "-p", "ringside-daemon"])?;
                bench::run(&root)?;
            }
            if matches!(which, "all" | "fanout") {
                // 100 WebSocket clients and one that never reads (tests/benches/fanout.rs).
                daemon_bench(&root, "fanout", &[])?;
            }
            if matches!(which, "all" | "history") {
                // The history's memory, disk, tick cost and query times (daemon/benches/history.rs).
                cargo(&["bench", "-p", "ringside-daemon", "--bench", "history"])?;
            }
            if matches!(which, "all" | "identity") {
                // What reading a process's job identity costs it (daemon/benches/identity.rs).
                cargo(&["bench", "-p", "ringside-daemon", "--bench", "identity"])?;
            }
            if matches!(which, "all" | "stragglers") {
                // Straggler naming across two daemons and a real Prometheus, 30 runs and 10
                // balanced ones (tests/benches/stragglers.rs).
                setup(true)?;
                cargo(&["build", "-p", "ringside-workload"])?;
                daemon_bench(&root, "stragglers", &[])?;
            }
            if matches!(which, "all" | "console") {
                // The console's first paint and live data, cold, on loopback and over a slow
                // link, in headless Chromium (tests/benches/console.rs).
                setup(true)?;
                console(&root)?;
                daemon_bench(&root, "console", &[])?;
            }
            if matches!(which, "all" | "sched") {
                setup(false)?;
                cargo(&["build", "--release", "-p", "ringside-daemon", "-p", "ringside-workload"])?;
                sched_bench::run(&root, root.join("target/release/ml-workload"))?;
            }
            if matches!(which, "all" | "launch") {
                setup(false)?;
                cargo(&["build", "--release", "-p", "ringside-daemon", "-p", "ringside-workload"])?;
                launch_bench::run(&root)?;
            }
            if matches!(which, "all" | "incidents") {
                setup(false)?;
                cargo(&["build", "--release", "-p", "ringside-daemon", "-p", "ringside-workload"])?;
                let seconds = std::env::var("RINGSIDE_BENCH_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
                let rounds = std::env::var("RINGSIDE_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
                bench::incidents(&root, &root.join("target/release/ml-workload"), seconds, rounds)?;
            }
            if which == "guest" {
                vm::run(&root, &guest_options(&args, true))?;
            }
            Ok(())
        }
        _ => {
            eprintln!(
                "usage: cargo xtask <setup [--test] | console | run [-- ARGS] | test | package | miri | fuzz [SECONDS] | vm-test | vm-header | bench [ring|decode|gpu|daemon|fanout|history|identity|console|stragglers|sched|launch|incidents|guest] | soak [MINUTES]>"
            );
            std::process::exit(2);
        }
    }
}

/// Guest run settings: `RINGSIDE_VM_PHASE_MS` and `RINGSIDE_VM_CYCLES` size the workload (the
/// benchmark runs more cycles by default: its p99 needs the samples).
fn guest_options(args: &[String], bench: bool) -> vm::Options {
    let env = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let bench = bench || args.iter().any(|a| a == "--bench");
    vm::Options {
        bench,
        phase_ms: env("RINGSIDE_VM_PHASE_MS", 1500),
        cycles: env("RINGSIDE_VM_CYCLES", if bench { 6 } else { 2 }) as u32,
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

fn step(what: &str) {
    eprintln!("\x1b[1m==> {what}\x1b[0m");
}

fn cargo(args: &[&str]) -> Result<()> {
    cargo_with_env(args, &[])
}

fn cargo_with_env(args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    step(&format!("cargo {}", args.join(" ")));
    let status = Command::new(&cargo)
        .args(args)
        .envs(env.iter().copied())
        .status()
        .with_context(|| format!("cannot run {cargo}"))?;
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program).args(args).output().map(|o| o.status.success()).unwrap_or(false)
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

/// Installs what is missing; does nothing when everything is there.
fn setup(for_tests: bool) -> Result<()> {
    let installed = Command::new("rustup").args(["target", "list", "--installed"]).output();
    match installed {
        Ok(out) if String::from_utf8_lossy(&out.stdout).lines().any(|l| l.trim() == "wasm32-unknown-unknown") => {}
        Ok(_) => {
            step("rustup target add wasm32-unknown-unknown");
            if !succeeds("rustup", &["target", "add", "wasm32-unknown-unknown"]) {
                bail!("`rustup target add wasm32-unknown-unknown` failed; run it by hand and retry");
            }
        }
        Err(_) => bail!(
            "rustup not found: the console needs the wasm32-unknown-unknown target; install it with your toolchain manager"
        ),
    }

    let mut wanted: Vec<&str> = BUILD_PACKAGES.to_vec();
    if for_tests {
        wanted.extend_from_slice(TEST_PACKAGES);
        miri_toolchain()?;
        lint_components()?;
        fuzz::install()?;
    }
    install(&wanted)?;
    if for_tests {
        nvidia::fetch()?;
        axe_core()?;
    }
    Ok(())
}

/// Installs axe-core under `target/tools/axe` (where the browser tests read it) if missing.
fn axe_core() -> Result<()> {
    let root = workspace_root();
    let prefix = root.join("target/tools/axe");
    if prefix.join("node_modules/axe-core/axe.min.js").is_file() {
        return Ok(());
    }
    // Debian's npm where there is none (a machine with Node.js from elsewhere has its own npm,
    // which Debian's package would conflict with).
    if !succeeds("npm", &["--version"]) {
        install(&["npm"])?;
    }
    let args = ["install", "--prefix", &prefix.to_string_lossy(), "--no-audit", "--no-fund", AXE_CORE];
    step(&format!("npm {}", args.join(" ")));
    if !succeeds("npm", &args) {
        bail!("`npm {}` failed; run it by hand and retry", args.join(" "));
    }
    Ok(())
}

/// rustfmt and clippy for the test command's style checks, if the toolchain lacks them.
fn lint_components() -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    for (component, check) in [("rustfmt", "fmt"), ("clippy", "clippy")] {
        if !succeeds(&cargo, &[check, "--version"]) {
            step(&format!("rustup component add {component}"));
            if !succeeds("rustup", &["component", "add", component]) {
                bail!("`rustup component add {component}` failed; run it by hand and retry");
            }
        }
    }
    Ok(())
}

/// The dated nightly with `components` (rustup's names, without the host's suffix), each
/// installed if missing.
fn nightly(components: &[&str]) -> Result<()> {
    // `None` where the toolchain itself is missing.
    let installed = Command::new("rustup")
        .args(["component", "list", "--installed", "--toolchain", NIGHTLY])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let has = |c: &str| {
        installed.as_deref().is_some_and(|list| list.lines().any(|l| l == c || l.starts_with(&format!("{c}-"))))
    };
    let missing: Vec<&str> = components.iter().copied().filter(|c| !has(c)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let list = missing.join(",");
    let args = match installed {
        Some(_) => {
            vec!["component", "add", "--toolchain", NIGHTLY].into_iter().chain(missing.iter().copied()).collect()
        }
        None => vec!["toolchain", "install", NIGHTLY, "--profile", "minimal", "--component", &list],
    };
    step(&format!("rustup {}", args.join(" ")));
    if !succeeds("rustup", &args) {
        bail!("`rustup {}` failed; run it by hand and retry", args.join(" "));
    }
    Ok(())
}

/// The dated nightly with Miri (and rustfmt, for the fuzz build: the fuzz targets build the BPF
/// skeletons, which libbpf-cargo formats with rustfmt).
fn miri_toolchain() -> Result<()> {
    nightly(&["miri", "rust-src", "rustfmt"])
}

/// Under Miri: the ring's unit tests, every slot access, index and flag checked for data races
/// and undefined behaviour, with weak-memory emulation, over four scheduling seeds (the tests
/// shrink their message counts under `cfg(miri)`); and the console's reader writing structs in
/// place, every field written, dropped or defaulted once on each way a read ends.
fn miri() -> Result<()> {
    let runs: [(&[&str], &str, &str); 2] = [
        (&["miri", "test", "-p", "ringside-kernels", "--lib", "ring::"], "-Zmiri-many-seeds=0..4", "the ring's"),
        (&["miri", "test", "-p", "ringside-shared", "--lib", "decode::tests"], "", "the reader's"),
    ];
    for (args, flags, whose) in runs {
        step(&format!("cargo +{NIGHTLY} {}", args.join(" ")));
        let status = Command::new("rustup")
            .args(["run", NIGHTLY, "cargo"])
            .args(args)
            // The outer (stable) cargo's path would otherwise be used by cargo-miri.
            .env_remove("CARGO")
            .env("MIRIFLAGS", flags)
            .status()
            .context("cannot run rustup")?;
        if !status.success() {
            bail!("{whose} tests failed under Miri ({status})");
        }
    }
    Ok(())
}

/// Installs the Debian packages of `wanted` that are missing (as root; else says how).
fn install(wanted: &[&str]) -> Result<()> {
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|p| {
            let out = Command::new("dpkg-query").args(["-W", "-f=${Status}", p]).output();
            !matches!(out, Ok(o) if String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let command = format!("apt-get install -y --no-install-recommends {}", missing.join(" "));
    if !is_root() || !Path::new("/usr/bin/apt-get").exists() {
        bail!("missing packages: {}. Install them with:\n  sudo apt-get update && sudo {command}", missing.join(" "));
    }
    step(&format!("apt-get update && {command}"));
    let update = Command::new("apt-get").args(["update", "-q"]).status().context("cannot run apt-get")?;
    if !update.success() {
        bail!("`apt-get update` failed");
    }
    let status = Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("cannot run apt-get")?;
    if !status.success() {
        bail!("`{command}` failed");
    }
    Ok(())
}

/// Runs `tests/benches/<name>.rs` against the release daemon (built first), with `env`.
fn daemon_bench(root: &Path, name: &str, env: &[(&str, &str)]) -> Result<()> {
    cargo(&["build", "--release", "-p", "ringside-daemon"])?;
    let status = Command::new(env!("CARGO"))
        .current_dir(root)
        .args(["bench", "-p", "ringside-tests", "--bench", name])
        .env("RINGSIDED_BIN", root.join("target/release/ringsided"))
        .envs(env.iter().copied())
        .status()?;
    if !status.success() {
        bail!("the {name} bench failed ({status})");
    }
    Ok(())
}

/// Builds the console into `frontend/dist/` and returns the wasm file's path.
fn console(root: &Path) -> Result<PathBuf> {
    let started = Instant::now();
    let args = ["build", "-p", "ringside-frontend", "--target", "wasm32-unknown-unknown", "--profile", "wasm-release"];
    match nightly(&["rust-src"]) {
        Ok(()) => {
            // The standard library as shipped is built for speed, with panic messages; rebuilt
            // here at `opt-level = "z"` it is 9% less of the console's code, and with its
            // `optimize_for_size` feature (its small sorts and formatting) 2% less again.
            let std = ["-Zbuild-std=std,panic_abort", "-Zbuild-std-features=optimize_for_size"];
            step(&format!("cargo +{NIGHTLY} {} {}", args.join(" "), std.join(" ")));
            let status = Command::new("rustup")
                .args(["run", NIGHTLY, "cargo"])
                .args(args)
                .args(std)
                .args(["--config", CONSOLE_NIGHTLY_RUSTFLAGS])
                .env_remove("CARGO")
                .env_remove("RUSTC")
                .status()
                .context("cannot run rustup")?;
            if !status.success() {
                bail!("building the console failed ({status})");
            }
        }
        Err(why) => {
            eprintln!("warning: {why}; the console is built with the stable standard library (a larger wasm)");
            cargo(&[&args[..], &["--config", CONSOLE_STABLE_RUSTFLAGS]].concat())?;
        }
    }
    let wasm = root.join("target/wasm32-unknown-unknown/wasm-release/ringside-frontend.wasm");
    let dist = root.join("frontend/dist");
    let staging = root.join("target/console-dist");
    if staging.exists() {
        std::fs::remove_dir_all(&staging).with_context(|| format!("cannot clear {}", staging.display()))?;
    }
    step("wasm-split: the panels below the first screen into a module of their own");
    let linked = std::fs::read(&wasm).with_context(|| format!("cannot read {}", wasm.display()))?;
    let pkg = staging.join("pkg");
    let main_wasm = staging.join("main.wasm");
    let mut options = wasm_split_cli_support::Options::new(&linked);
    options.output_dir = &pkg;
    options.main_out_path = &main_wasm;
    options.link_name = "./__wasm_split.js";
    options.main_module = "./ringside_frontend.js";
    wasm_split_cli_support::transform(options)
        .map_err(|e| anyhow::anyhow!("wasm-split failed on {}: {e}", wasm.display()))?;
    step("wasm-bindgen (library, version pinned in Cargo.lock)");
    wasm_bindgen_cli_support::Bindgen::new()
        .input_path(&main_wasm)
        // The split module imports the function table, which wasm-bindgen would otherwise unexport.
        .keep_lld_exports(true)
        .out_name("ringside_frontend")
        .typescript(false)
        .web(true)
        .and_then(|b| b.generate(&pkg))
        .map_err(|e| anyhow::anyhow!("wasm-bindgen failed on {}: {e}", wasm.display()))?;
    std::fs::remove_file(&main_wasm)?;
    // Names and producer records help debugging only; browsers never read them.
    for entry in std::fs::read_dir(&pkg)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "wasm") {
            let module = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
            std::fs::write(&path, strip_custom_sections(&module)?)?;
        }
    }
    let split = name_split_modules_by_content(&pkg)?;
    let below = split.first().context("wasm-split made no module of the panels below the first screen")?;
    for entry in std::fs::read_dir(root.join("frontend/static")).context("frontend/static is missing")? {
        let entry = entry?;
        std::fs::copy(entry.path(), staging.join(entry.file_name()))
            .with_context(|| format!("cannot copy {}", entry.path().display()))?;
    }
    precompress(&staging)?;
    // Replace dist only when something changed, so the daemon's build does not rerun for nothing.
    if !same_tree(&staging, &dist) {
        if dist.exists() {
            std::fs::remove_dir_all(&dist).with_context(|| format!("cannot clear {}", dist.display()))?;
        }
        std::fs::rename(&staging, &dist).with_context(|| format!("cannot move the console to {}", dist.display()))?;
    }
    let bundle = dist.join("pkg/ringside_frontend_bg.wasm");
    let size = |file: &str, ext: &str| {
        std::fs::metadata(dist.join(format!("pkg/{file}{ext}"))).map_or(0.0, |m| m.len() as f64 / 1024.0)
    };
    let sizes = |file: &str| {
        format!("{:.1} KiB raw, {:.1} KiB gzip, {:.1} KiB brotli", size(file, ""), size(file, ".gz"), size(file, ".br"))
    };
    eprintln!(
        "console built in {:.0} s: wasm {} (the first module); the panels below the first screen {}",
        started.elapsed().as_secs_f64(),
        sizes("ringside_frontend_bg.wasm"),
        sizes(below)
    );
    Ok(bundle)
}

/// Names each split module by its content (`split_below.wasm` becomes `split_below.<hash>.wasm`)
/// where `__wasm_split.js` asks for it. A split module calls the first module's functions
/// through their places in its function table, which another build orders differently: a page
/// still running the first module of an older build then asks for its own second module, which
/// a newer daemon answers with a 404 (said in the console), not with a module of another build.
/// Returns the modules' new file names.
fn name_split_modules_by_content(pkg: &Path) -> Result<Vec<String>> {
    let loader = pkg.join("__wasm_split.js");
    let mut script = std::fs::read_to_string(&loader).with_context(|| format!("cannot read {}", loader.display()))?;
    // Listed before any is renamed: a listing that runs on could meet a renamed one again.
    let modules: Vec<PathBuf> = std::fs::read_dir(pkg)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
    let mut names = Vec::new();
    for path in modules {
        let Some(stem) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".wasm")) else {
            continue;
        };
        if !stem.starts_with("split_") {
            continue;
        }
        let body = std::fs::read(&path)?;
        let hash =
            body.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
        let named = format!("{stem}.{hash:016x}.wasm");
        let asked = format!("\"./{stem}.wasm\"");
        if !script.contains(&asked) {
            bail!("{} does not ask for {stem}.wasm", loader.display());
        }
        script = script.replace(&asked, &format!("\"./{named}\""));
        std::fs::rename(&path, pkg.join(&named))?;
        names.push(named);
    }
    std::fs::write(&loader, script)?;
    Ok(names)
}

/// Writes `<file>.gz` (gzip by zopfli: any gzip reader takes it, about 5% smaller than zlib's
/// best) and `<file>.br` (brotli, quality 11) beside each text and wasm file under `dir`, where
/// smaller: the daemon serves them as they are, by the browser's Accept-Encoding.
fn precompress(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir)?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            precompress(&path)?;
            continue;
        }
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or_default();
        if !matches!(ext, "html" | "js" | "css" | "wasm" | "svg" | "json") {
            continue;
        }
        let body = std::fs::read(&path)?;
        let mut gz = Vec::new();
        zopfli::compress(zopfli::Options::default(), zopfli::Format::Gzip, body.as_slice(), &mut gz)?;
        let mut br = Vec::new();
        let params = brotli::enc::BrotliEncoderParams { quality: 11, lgwin: 22, ..Default::default() };
        brotli::BrotliCompress(&mut body.as_slice(), &mut br, &params)?;
        for (encoded, suffix) in [(gz, "gz"), (br, "br")] {
            if encoded.len() < body.len() {
                std::fs::write(format!("{}.{suffix}", path.display()), encoded)?;
            }
        }
    }
    Ok(())
}

fn read_leb128(bytes: &[u8], at: &mut usize) -> Result<usize> {
    let mut value = 0usize;
    for shift in (0..35).step_by(7) {
        let byte = *bytes.get(*at).context("truncated wasm module")?;
        *at += 1;
        value |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    bail!("malformed LEB128 in wasm module")
}

/// Copies a wasm module without its custom sections (id 0: names, producers, debug info).
fn strip_custom_sections(module: &[u8]) -> Result<Vec<u8>> {
    if module.len() < 8 || &module[..4] != b"\0asm" {
        bail!("not a wasm module");
    }
    let mut out = module[..8].to_vec();
    let mut at = 8;
    while at < module.len() {
        let start = at;
        let id = module[at];
        at += 1;
        let size = read_leb128(module, &mut at)?;
        let end = at.checked_add(size).filter(|e| *e <= module.len()).context("wasm section runs past the end")?;
        if id != 0 {
            out.extend_from_slice(&module[start..end]);
        }
        at = end;
    }
    Ok(out)
}

fn same_tree(a: &Path, b: &Path) -> bool {
    fn files(dir: &Path, base: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                files(&path, base, out);
            } else if let (Ok(rel), Ok(data)) = (path.strip_prefix(base), std::fs::read(&path)) {
                out.push((rel.to_path_buf(), data));
            }
        }
    }
    let (mut x, mut y) = (Vec::new(), Vec::new());
    files(a, a, &mut x);
    files(b, b, &mut y);
    x.sort();
    y.sort();
    !x.is_empty() && x == y
}

fn test(root: &Path) -> Result<()> {
    let started = std::time::Instant::now();
    setup(true)?;
    console(root)?;
    let prepared = started.elapsed();
    // Each part with how long it took: the suite must stay well within CI's time.
    let timed = |what: &'static str, part: &dyn Fn() -> Result<()>| {
        let at = std::time::Instant::now();
        (what, part(), at.elapsed())
    };
    // Cargo builds `ringsided` (embedding the console just built) before any test runs, since
    // its package has integration tests; the end-to-end tests start that binary. Building it
    // here separately would resolve features differently and compile the dependencies twice.
    let results = [
        // Style first: formatting as rustfmt.toml says, and no clippy warning (the workspace's
        // lints included: every unsafe block says why it is sound).
        timed("formatting", &|| cargo(&["fmt", "--all", "--check"])),
        timed("clippy", &|| cargo(&["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])),
        // The Debian package, which tests/tests/package.rs installs and runs.
        timed("the package", &|| package::build(root).map(|_| ())),
        // The real-driver tests find NVIDIA's libraries where `setup --test` unpacked them.
        timed("the workspace's tests", &|| {
            cargo_with_env(
                &["test", "--workspace", "--no-fail-fast"],
                &[("RINGSIDE_NVIDIA_DIR", &nvidia::dir().to_string_lossy())],
            )
        }),
        timed("Miri", &miri),
        // Every parser of what a client, a config or a user's file says, 60 s each.
        timed("fuzzing", &|| fuzz::run(root, 60)),
        // The sched_ext scheduler runs only in a kernel that has sched_ext: a guest's.
        timed("the guest test", &|| vm::run(root, &guest_options(&[], false))),
    ];
    let parts: Vec<String> =
        results.iter().map(|(what, _, took)| format!("{what} {:.0} s", took.as_secs_f64())).collect();
    eprintln!(
        "xtask test took {:.0} s: prerequisites and console {:.0} s, {}",
        started.elapsed().as_secs_f64(),
        prepared.as_secs_f64(),
        parts.join(", ")
    );
    let failed: Vec<String> =
        results.iter().filter_map(|(what, r, _)| r.as_ref().err().map(|e| format!("{what}: {e:#}"))).collect();
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}
