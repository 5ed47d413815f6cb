//! `cargo xtask package`: `target/debian/ringside_<version>_amd64.deb`, built with `dpkg-deb`
//! from the release `ringsided` (the console inside) and the files in `deploy/debian/`.
//!
//! What it installs: `/usr/bin/ringsided`, `/lib/systemd/system/ringsided.service` (the hardened
//! unit), `/etc/ringside/ringsided.toml` (a conffile), the README and the fleet files (Prometheus,
//! Grafana, Alertmanager) under
//! `/usr/share/doc/ringside/`. Its postinst creates `/var/lib/ringside` (0700) and, when there
//! is none, `/etc/ringside/tokens` (0600) with a random operator token; purge removes both.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Builds the package; its path.
pub fn build(root: &Path) -> Result<PathBuf> {
    crate::console(root)?;
    crate::cargo(&["build", "--release", "-p", "ringside-daemon"])?;
    crate::step("assembling the Debian package");
    let version = env!("CARGO_PKG_VERSION");
    let out = root.join("target/debian");
    let tree = out.join(format!("ringside_{version}_amd64"));
    if tree.exists() {
        std::fs::remove_dir_all(&tree).with_context(|| format!("cannot clear {}", tree.display()))?;
    }
    let deploy = root.join("deploy");
    let doc = tree.join("usr/share/doc/ringside");
    let files: [(PathBuf, PathBuf, u32); 12] = [
        (root.join("target/release/ringsided"), tree.join("usr/bin/ringsided"), 0o755),
        (deploy.join("debian/ringsided.service"), tree.join("lib/systemd/system/ringsided.service"), 0o644),
        (deploy.join("debian/ringsided.toml"), tree.join("etc/ringside/ringsided.toml"), 0o644),
        (root.join("README.md"), doc.join("README.md"), 0o644),
        (deploy.join("prometheus/prometheus.yml"), doc.join("prometheus/prometheus.yml"), 0o644),
        (deploy.join("prometheus/ringside.rules.yml"), doc.join("prometheus/ringside.rules.yml"), 0o644),
        (deploy.join("grafana/ringside-fleet.json"), doc.join("grafana/ringside-fleet.json"), 0o644),
        (deploy.join("grafana/ringside-job.json"), doc.join("grafana/ringside-job.json"), 0o644),
        (deploy.join("alertmanager/alertmanager.yml"), doc.join("alertmanager/alertmanager.yml"), 0o644),
        (deploy.join("debian/postinst"), tree.join("DEBIAN/postinst"), 0o755),
        (deploy.join("debian/prerm"), tree.join("DEBIAN/prerm"), 0o755),
        (deploy.join("debian/postrm"), tree.join("DEBIAN/postrm"), 0o755),
    ];
    for (from, to, mode) in &files {
        copy(from, to, *mode)?;
    }
    // Symbols stay in target/release; the package carries the stripped binary.
    let stripped = Command::new("strip").arg("--strip-unneeded").arg(tree.join("usr/bin/ringsided")).status();
    if !stripped.is_ok_and(|s| s.success()) {
        eprintln!("note: `strip` failed or is missing; the package carries symbols");
    }
    write(&doc.join("copyright"), &format!("Ringside {version}\nLicense: Apache-2.0\n"), 0o644)?;
    write(&tree.join("DEBIAN/conffiles"), "/etc/ringside/ringsided.toml\n", 0o644)?;
    let size_kib = dir_size(&tree)? / 1024;
    let control = format!(
        "Package: ringside\nVersion: {version}\nArchitecture: amd64\nMaintainer: Ringside developers <ringside@localhost>\n\
         Installed-Size: {size_kib}\nDepends: libc6 (>= 2.36), libelf1, zlib1g, libgcc-s1, passwd\nSection: admin\nPriority: optional\n\
         Description: node console for machines that run ML work\n \
         ringsided watches every thread of a GPU/ML node with BPF, works out which phase each ML job\n \
         is in, reads the GPUs through NVML, raises alerts and serves a live console and /metrics.\n"
    );
    write(&tree.join("DEBIAN/control"), &control, 0o644)?;
    let deb = out.join(format!("ringside_{version}_amd64.deb"));
    let status = Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&tree)
        .arg(&deb)
        .status()
        .context("dpkg-deb (Debian's dpkg) is needed")?;
    if !status.success() {
        bail!("dpkg-deb failed ({status})");
    }
    let bytes = std::fs::metadata(&deb)?.len();
    println!("{} ({:.1} MiB)", deb.display(), bytes as f64 / (1 << 20) as f64);
    Ok(deb)
}

fn copy(from: &Path, to: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to.parent().context("a parent")?)?;
    std::fs::copy(from, to).with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn write(to: &Path, text: &str, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to.parent().context("a parent")?)?;
    std::fs::write(to, text)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() { dir_size(&entry.path())? } else { meta.len() };
    }
    Ok(total)
}
