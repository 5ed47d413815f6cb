//! `cargo xtask vm-test`: the sched_ext backend, proven in a real kernel.
//!
//! The host's kernel has no sched_ext, so the test boots a guest that has: a small 6.12 kernel
//! built from Debian's `linux-source-6.12` (tinyconfig plus `xtask/vm/kernel.config`) under
//! qemu (TCG, 2 CPUs on 2 NUMA nodes). The kernel and its `vmlinux.h` are cached outside the
//! source tree, keyed by the source package's version and the config, so only the first run
//! pays for the build (~5 min on 2 cores).
//!
//! In the guest, `xtask/vm/init.sh` starts a statically linked `ringsided --sched-backend scx`,
//! runs the labelled ML workload beside CPU-bound noise, stops the daemon, then starts it again
//! and ejects the scheduler with sysrq-S. It prints what it saw between markers on the serial
//! console; the checks are made here. A failure prints the guest's console log.
//!
//! With `--bench` the guest also runs the workload under the setattr backend and under the
//! kernel's own scheduler (daemon observing), and the ping-pong microbenchmark under each; TCG
//! emulates the CPUs, so only ratios mean anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{cargo_with_env, install, step};

/// Debian packages the guest test needs.
pub const PACKAGES: &[&str] = &[
    "linux-source-6.12",
    "dwarves",
    "flex",
    "bison",
    "bc",
    "libssl-dev",
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "bpftool",
];
const SOURCE_PACKAGE: &str = "linux-source-6.12";
const SOURCE_TARBALL: &str = "/usr/src/linux-source-6.12.tar.xz";
const KERNEL_CONFIG: &str = include_str!("../vm/kernel.config");
const INIT: &str = include_str!("../vm/init.sh");
const STATIC_TARGET: &str = "x86_64-unknown-linux-gnu";
/// The guest run ends by itself in well under this; past it qemu is killed.
const GUEST_LIMIT: Duration = Duration::from_secs(20 * 60);

/// FNV-1a: a stable hash for the cache key (std's hasher may change between releases).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// Where built and downloaded things are kept between runs: `RINGSIDE_CACHE_DIR`, else
/// `~/.cache/ringside`.
pub(crate) fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RINGSIDE_CACHE_DIR") {
        return dir.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"));
    base.join("ringside")
}

fn run_in(dir: &Path, program: &str, args: &[&str]) -> Result<()> {
    let status =
        Command::new(program).args(args).current_dir(dir).status().with_context(|| format!("cannot run {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed in {} ({status})", args.join(" "), dir.display());
    }
    Ok(())
}

/// The config lines: (option, enabled).
fn config_options() -> Vec<(&'static str, bool)> {
    KERNEL_CONFIG
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.strip_prefix('-') {
            Some(name) => (name, false),
            None => (l, true),
        })
        .collect()
}

pub struct GuestKernel {
    pub bz_image: PathBuf,
    pub vmlinux_h: PathBuf,
}

/// The guest kernel and its vmlinux.h, from the cache or built now.
pub fn guest_kernel() -> Result<GuestKernel> {
    let version =
        Command::new("dpkg-query").args(["-W", "-f=${Version}", SOURCE_PACKAGE]).output().context("dpkg-query")?;
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    if version.is_empty() {
        bail!("{SOURCE_PACKAGE} is not installed");
    }
    let key = format!("{version}-{:016x}", fnv1a(KERNEL_CONFIG.as_bytes()));
    let dir = cache_dir().join("guest-kernel").join(&key);
    let kernel = GuestKernel { bz_image: dir.join("bzImage"), vmlinux_h: dir.join("vmlinux.h") };
    if kernel.bz_image.exists() && kernel.vmlinux_h.exists() {
        step(&format!("guest kernel {key} (cached in {})", dir.display()));
        return Ok(kernel);
    }
    let started = Instant::now();
    let build = cache_dir().join("guest-kernel").join(format!("build-{key}"));
    if build.exists() {
        std::fs::remove_dir_all(&build).with_context(|| format!("cannot clear {}", build.display()))?;
    }
    std::fs::create_dir_all(&build)?;
    step(&format!("unpacking {SOURCE_TARBALL}"));
    run_in(&build, "tar", &["xf", SOURCE_TARBALL, "--strip-components=1"])?;
    step("configuring the guest kernel (tinyconfig + xtask/vm/kernel.config)");
    run_in(&build, "make", &["-s", "tinyconfig"])?;
    for (name, enabled) in config_options() {
        run_in(&build, "scripts/config", &[if enabled { "-e" } else { "-d" }, name])?;
    }
    run_in(&build, "make", &["-s", "olddefconfig"])?;
    let config = std::fs::read_to_string(build.join(".config"))?;
    let dropped: Vec<&str> = config_options()
        .into_iter()
        .filter(|(name, enabled)| *enabled && !config.lines().any(|l| l == format!("CONFIG_{name}=y")))
        .map(|(name, _)| name)
        .collect();
    if !dropped.is_empty() {
        bail!("Kconfig dropped options of xtask/vm/kernel.config: {}", dropped.join(", "));
    }
    let jobs = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).to_string();
    step(&format!("building the guest kernel (make -j{jobs} bzImage; about 5 min on 2 cores)"));
    let status = Command::new("make")
        .args([format!("-j{jobs}").as_str(), "bzImage"])
        .current_dir(&build)
        .stdout(Stdio::null())
        .status()
        .context("cannot run make")?;
    if !status.success() {
        bail!("building the guest kernel failed ({status}); its source tree is {}", build.display());
    }
    let header = Command::new("bpftool")
        .args(["btf", "dump", "file"])
        .arg(build.join("vmlinux"))
        .args(["format", "c"])
        .output()
        .context("cannot run bpftool")?;
    if !header.status.success() {
        bail!("bpftool btf dump failed: {}", String::from_utf8_lossy(&header.stderr));
    }
    let staging = dir.with_extension("partial");
    std::fs::create_dir_all(&staging)?;
    std::fs::copy(build.join("arch/x86/boot/bzImage"), staging.join("bzImage"))?;
    std::fs::write(staging.join("vmlinux.h"), &header.stdout)?;
    std::fs::write(staging.join("config"), &config)?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::rename(&staging, &dir)?;
    std::fs::remove_dir_all(&build).with_context(|| format!("cannot remove {}", build.display()))?;
    eprintln!("guest kernel built in {:.0} s, cached in {}", started.elapsed().as_secs_f64(), dir.display());
    Ok(kernel)
}

/// Shared libraries a dynamically linked file needs, as `ldd` resolves them here.
fn shared_libraries(file: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(file).output().context("cannot run ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| {
            let path = l.split("=>").nth(1).unwrap_or(l).split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// Copies `from` to `root/<to>` (an absolute path in the guest).
fn put(root: &Path, from: &Path, to: &Path) -> Result<()> {
    let target = root.join(to.strip_prefix("/").unwrap_or(to));
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::copy(from, &target).with_context(|| format!("cannot copy {} into the guest", from.display()))?;
    Ok(())
}

fn newest_doubles(root: &Path) -> Result<PathBuf> {
    let build = root.join("target/release/build");
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&build)
        .with_context(|| format!("cannot list {}", build.display()))?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("ringside-workload-"))
        .map(|e| e.path().join("out/doubles"))
        .filter(|p| p.join("libcuda.so.1").exists())
        .filter_map(|p| Some((p.join("libcuda.so.1").metadata().ok()?.modified().ok()?, p)))
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p).context("the workload's test doubles were not built")
}

pub struct Options {
    pub bench: bool,
    pub phase_ms: u64,
    pub cycles: u32,
}

/// Builds the initramfs: busybox, the static daemon, the workload with its libraries and test
/// doubles, the init script and its settings.
fn initramfs(root: &Path, scratch: &Path, daemon: &Path, options: &Options) -> Result<PathBuf> {
    let tree = scratch.join("initramfs");
    if tree.exists() {
        std::fs::remove_dir_all(&tree)?;
    }
    for dir in ["bin", "sbin", "etc", "proc", "sys", "dev", "tmp", "lib/doubles", "root"] {
        std::fs::create_dir_all(tree.join(dir))?;
    }
    put(&tree, Path::new("/bin/busybox"), Path::new("/bin/busybox"))?;
    let applets = Command::new("/bin/busybox").arg("--list").output().context("cannot run busybox --list")?;
    for applet in String::from_utf8_lossy(&applets.stdout).lines().filter(|a| !a.is_empty() && *a != "busybox") {
        let _ = std::os::unix::fs::symlink("busybox", tree.join("bin").join(applet));
    }
    put(&tree, daemon, Path::new("/bin/ringsided"))?;
    let workload = root.join("target/release/ml-workload");
    put(&tree, &workload, Path::new("/bin/ml-workload"))?;
    let doubles = newest_doubles(root)?;
    let mut libraries = shared_libraries(&workload)?;
    for entry in std::fs::read_dir(&doubles)?.flatten() {
        put(&tree, &entry.path(), &Path::new("/lib/doubles").join(entry.file_name()))?;
        libraries.extend(shared_libraries(&entry.path())?);
    }
    libraries.sort();
    libraries.dedup();
    for library in libraries {
        put(&tree, &library, &library)?;
    }
    let init = tree.join("init");
    std::fs::write(&init, INIT)?;
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    // The daemon refuses a token file others may read; cpio keeps the mode.
    let token = tree.join("etc/token");
    std::fs::write(&token, "vm-test:ringside-guest-token-0123456789\n")?;
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    // The guest's workload runs as root (uid 0, by number: a static binary has no NSS).
    std::fs::write(
        tree.join("etc/ringside.toml"),
        "interval_ms = 500\n\n[scheduler]\nwindow_ms = 100\nscan_interval_ms = 500\n\n[scheduler.enforce]\nusers = [\"0\"]\n\n[[kernels]]\nid = \"canary\"\nkernel = \"echo\"\n",
    )?;
    std::fs::write(
        tree.join("etc/vm-test.env"),
        format!(
            "PHASE_MS={}\nCYCLES={}\nNOISE_LOOPS=4\nPINGPONG=20000\nBENCH={}\n",
            options.phase_ms,
            options.cycles,
            u8::from(options.bench)
        ),
    )?;
    let image = scratch.join("initramfs.cpio.gz");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("find . | cpio -o -H newc --quiet | gzip -1 > '{}'", image.display()))
        .current_dir(&tree)
        .status()
        .context("cannot run cpio")?;
    if !status.success() {
        bail!("building the initramfs failed");
    }
    Ok(image)
}

/// Boots the guest and returns its serial console output.
fn boot(kernel: &GuestKernel, initramfs: &Path, log: &Path) -> Result<String> {
    step("booting the guest (qemu TCG, 2 CPUs on 2 NUMA nodes)");
    let started = Instant::now();
    let console = std::fs::File::create(log)?;
    let mut qemu = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-cpu", "max", "-m", "2G", "-smp", "2"])
        .args(["-object", "memory-backend-ram,id=m0,size=1G", "-object", "memory-backend-ram,id=m1,size=1G"])
        .args(["-numa", "node,nodeid=0,cpus=0,memdev=m0", "-numa", "node,nodeid=1,cpus=1,memdev=m1"])
        .arg("-kernel")
        .arg(&kernel.bz_image)
        .arg("-initrd")
        .arg(initramfs)
        .args(["-append", "console=ttyS0 panic=-1 loglevel=4", "-nographic", "-no-reboot", "-monitor", "none"])
        .stdin(Stdio::null())
        .stdout(console.try_clone()?)
        .stderr(console)
        .spawn()
        .context("cannot start qemu-system-x86_64")?;
    loop {
        if let Some(status) = qemu.try_wait()? {
            eprintln!("guest ran {:.0} s ({status})", started.elapsed().as_secs_f64());
            break;
        }
        if started.elapsed() > GUEST_LIMIT {
            let _ = qemu.kill();
            let _ = qemu.wait();
            let output = std::fs::read_to_string(log).unwrap_or_default();
            bail!("the guest did not finish within {} s; its console:\n{output}", GUEST_LIMIT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(String::from_utf8_lossy(&std::fs::read(log)?).into_owned())
}

/// What the guest printed: `@@value name=value` lines and `@@begin name` ... `@@end name` sections.
#[derive(Default)]
pub struct GuestReport {
    pub values: BTreeMap<String, String>,
    pub sections: BTreeMap<String, String>,
    pub errors: Vec<String>,
    pub done: bool,
}

pub fn parse_report(console: &str) -> GuestReport {
    let mut report = GuestReport::default();
    let mut open: Option<(String, String)> = None;
    for line in console.lines() {
        let line = line.trim_end_matches('\r');
        // Firmware and terminal escapes may precede the first marker on its line.
        let line = match line.find("@@") {
            Some(at) if open.is_none() => &line[at..],
            _ => line,
        };
        if let Some((name, body)) = &mut open {
            if line == format!("@@end {name}") {
                let (name, body) = open.take().expect("open section");
                report.sections.insert(name, body);
            } else {
                body.push_str(line);
                body.push('\n');
            }
            continue;
        }
        if let Some(name) = line.strip_prefix("@@begin ") {
            open = Some((name.to_string(), String::new()));
        } else if let Some(pair) = line.strip_prefix("@@value ") {
            if let Some((k, v)) = pair.split_once('=') {
                report.values.insert(k.to_string(), v.to_string());
            }
        } else if let Some(error) = line.strip_prefix("@@error ") {
            report.errors.push(error.to_string());
        } else if line == "@@done" {
            report.done = true;
        }
    }
    report
}

/// Checks of one guest run; each failure says what was expected and what was seen.
pub fn check(report: &GuestReport) -> Vec<String> {
    let mut failures: Vec<String> = report.errors.iter().map(|e| format!("guest: {e}")).collect();
    let value = |k: &str| report.values.get(k).map(String::as_str).unwrap_or("(missing)");
    let mut expect = |what: &str, ok: bool, seen: String| {
        if !ok {
            failures.push(format!("{what}: saw {seen}"));
        }
    };
    expect("the guest ran to the end", report.done, "no @@done".into());
    expect(
        "sched_ext enabled with the daemon",
        value("scx_state_running") == "enabled",
        value("scx_state_running").into(),
    );
    expect("ops name ringside", value("scx_ops_running") == "ringside", value("scx_ops_running").into());
    expect("the workload succeeded", value("workload_exit_scx") == "0", value("workload_exit_scx").into());
    expect(
        "still enabled after the workload (no watchdog ejection)",
        value("scx_state_after_workload") == "enabled",
        value("scx_state_after_workload").into(),
    );
    expect(
        "the daemon stopped cleanly",
        report.values.get("daemon_exit").is_some_and(|v| v == "0"),
        value("daemon_exit").into(),
    );
    expect("unregistered at daemon stop", value("scx_state_stopped") == "disabled", value("scx_state_stopped").into());
    expect("no ops left registered", value("scx_ops_stopped").is_empty(), value("scx_ops_stopped").into());

    let json = |name: &str| -> serde_json::Value {
        report.sections.get(name).and_then(|t| serde_json::from_str(t).ok()).unwrap_or(serde_json::Value::Null)
    };
    let snapshot = json("snapshot-scx");
    let scheduler = &snapshot["scheduler"];
    expect("backend scx in the snapshot", scheduler["backend"] == "scx", scheduler["backend"].to_string());
    let scx = &scheduler["scx"];
    expect("scheduler running in the snapshot", scx["running"] == true, scx["running"].to_string());
    expect("no exit recorded while running", scx["exit"].is_null(), scx["exit"].to_string());
    let counter = |name: &str| scx["counters"][name].as_u64().unwrap_or(0);
    for name in ["enqueued", "dispatched", "decided", "latency_runs", "feeder_runs", "preempted"] {
        expect(&format!("scheduler counter {name} > 0"), counter(name) > 0, counter(name).to_string());
    }
    let decisions = scheduler["decisions"].as_array().cloned().unwrap_or_default();
    let carried = decisions
        .iter()
        .filter(|d| d["applied"] == true && d["action"].as_str().is_some_and(|a| a.starts_with("sched_ext")))
        .count();
    expect("decisions carried out by sched_ext", carried > 0, format!("{} decisions: {decisions:?}", decisions.len()));
    for phase in ["data_loading", "gpu_compute", "optimizer_step"] {
        let decided = decisions.iter().any(|d| d["phase"] == phase && d["applied"] == true);
        expect(&format!("a {phase} decision applied"), decided, "none".into());
    }

    let ejected = json("snapshot-eject");
    let scheduler = &ejected["scheduler"];
    expect(
        "sched_ext disabled by sysrq-S",
        value("scx_state_ejected") == "disabled",
        value("scx_state_ejected").into(),
    );
    expect("fell back to setattr", scheduler["backend"] == "setattr", scheduler["backend"].to_string());
    let exit = &scheduler["scx"]["exit"];
    expect("the exit is recorded as sysrq", exit["kind"] == "sysrq" && exit["ejected"] == true, exit.to_string());
    let alerted = ejected["alerts"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x["alert_type"] == "scheduler_ejected" && x["state"] != "resolved"));
    expect("a scheduler_ejected alert", alerted, ejected["alerts"].to_string());
    failures
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The benchmark table: per phase, p50/p99 under each backend, as ratios to the kernel's own
/// scheduler; and the ping-pong round trip.
fn bench_table(report: &GuestReport) {
    let json = |name: &str| -> serde_json::Value {
        report.sections.get(name).and_then(|t| serde_json::from_str(t).ok()).unwrap_or(serde_json::Value::Null)
    };
    println!("\n### In the guest (qemu TCG: emulated CPUs, compare ratios only)\n");
    println!("| iteration | default p50 | scx/default p50 | setattr/default p50 | default p99 | scx/default p99 | setattr/default p99 |");
    println!("|---|---|---|---|---|---|---|");
    let (base, scx, setattr) = (json("stats-observe"), json("stats-scx"), json("stats-setattr"));
    for (phase, label) in [
        ("data_loading", "data-loading batch"),
        ("gpu_compute", "GPU iteration"),
        ("nccl_collective", "collective"),
        ("optimizer_step", "optimizer step"),
    ] {
        let at = |v: &serde_json::Value, q: &str| v[phase][q].as_f64().unwrap_or(f64::NAN);
        println!(
            "| {label} | {:.2} ms | {:.2}x | {:.2}x | {:.2} ms | {:.2}x | {:.2}x |",
            at(&base, "p50_ms"),
            at(&scx, "p50_ms") / at(&base, "p50_ms"),
            at(&setattr, "p50_ms") / at(&base, "p50_ms"),
            at(&base, "p99_ms"),
            at(&scx, "p99_ms") / at(&base, "p99_ms"),
            at(&setattr, "p99_ms") / at(&base, "p99_ms"),
        );
    }
    let pingpong = |name: &str| json(name)["us_per_round_trip"].as_f64().unwrap_or(f64::NAN);
    let mut ratios = [pingpong("pingpong-scx") / pingpong("pingpong-observe")];
    println!(
        "\nPipe ping-pong round trip: {:.1} µs with the sched_ext scheduler, {:.1} µs without ({:.2}x)",
        pingpong("pingpong-scx"),
        pingpong("pingpong-observe"),
        median(&mut ratios)
    );
}

pub fn run(root: &Path, options: &Options) -> Result<()> {
    install(PACKAGES)?;
    let kernel = guest_kernel()?;
    let committed = root.join("bpf/src/bpf/vmlinux_scx.h");
    if std::fs::read(&committed).ok() != std::fs::read(&kernel.vmlinux_h).ok() {
        eprintln!(
            "note: bpf/src/bpf/vmlinux_scx.h differs from the guest kernel's ({}); `cargo xtask vm-header` refreshes it",
            kernel.vmlinux_h.display()
        );
    }
    crate::console(root)?;
    step("static ringsided for the guest");
    cargo_with_env(
        &["build", "--release", "--target", STATIC_TARGET, "-p", "ringside-daemon", "--features", "static"],
        &[("RUSTFLAGS", "-C target-feature=+crt-static"), ("LIBBPF_SYS_LIBRARY_PATH", "/usr/lib/x86_64-linux-gnu")],
    )?;
    cargo_with_env(&["build", "--release", "-p", "ringside-workload"], &[])?;
    let daemon = root.join("target").join(STATIC_TARGET).join("release/ringsided");
    let scratch = root.join("target/vm-test");
    std::fs::create_dir_all(&scratch)?;
    let image = initramfs(root, &scratch, &daemon, options)?;
    let log = scratch.join("console.log");
    let console = boot(&kernel, &image, &log)?;
    let report = parse_report(&console);
    let failures = check(&report);
    if options.bench {
        bench_table(&report);
    }
    if !failures.is_empty() {
        eprintln!("----- guest console ({}) -----\n{console}\n----- end of guest console -----", log.display());
        bail!("vm-test failed:\n  - {}", failures.join("\n  - "));
    }
    let snapshot: serde_json::Value =
        report.sections.get("snapshot-scx").and_then(|t| serde_json::from_str(t).ok()).unwrap_or_default();
    eprintln!(
        "vm-test passed: kernel {}, {} CPUs on {} nodes; sched_ext counters {}",
        report.values.get("kernel").map(String::as_str).unwrap_or("?"),
        report.values.get("cpus").map(String::as_str).unwrap_or("?"),
        report.values.get("nodes").map(String::as_str).unwrap_or("?"),
        snapshot["scheduler"]["scx"]["counters"]
    );
    Ok(())
}

/// Refreshes the committed `bpf/src/bpf/vmlinux_scx.h` from the guest kernel build.
pub fn update_header(root: &Path) -> Result<()> {
    install(PACKAGES)?;
    let kernel = guest_kernel()?;
    let target = root.join("bpf/src/bpf/vmlinux_scx.h");
    std::fs::copy(&kernel.vmlinux_h, &target)?;
    eprintln!("wrote {} from {}", target.display(), kernel.vmlinux_h.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_is_read_from_the_console() {
        let console = "boot noise\x1b[2J@@value kernel=6.12\r\n@@value cpus=2\r\n@@begin stats\r\n{\"a\":1}\r\n@@end stats\r\n@@error x\n@@done\n";
        let report = parse_report(console);
        assert_eq!(report.values["cpus"], "2");
        assert_eq!(report.values["kernel"], "6.12");
        assert_eq!(report.sections["stats"], "{\"a\":1}\n");
        assert_eq!(report.errors, vec!["x"]);
        assert!(report.done);
        let failures = check(&report);
        assert!(failures.iter().any(|f| f.starts_with("guest: x")));
        assert!(failures.iter().any(|f| f.starts_with("sched_ext enabled")), "{failures:?}");
    }

    #[test]
    fn config_lines_enable_and_disable() {
        let options = config_options();
        assert!(options.contains(&("SCHED_CLASS_EXT", true)));
        assert!(options.contains(&("DEBUG_INFO_NONE", false)));
        assert!(options.iter().all(|(name, _)| !name.contains(' ')));
    }
}
