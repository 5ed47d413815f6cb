//! A whole config file, loaded as the daemon loads `--config`: TOML, then every key checked
//! (rules compiled, kernels and scheduler tables checked, Alertmanager URL and files looked at).
#![no_main]

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};

use clap::Parser;
use libfuzzer_sys::fuzz_target;
use ringside_daemon::config::{Cli, Config};

fuzz_target!(|data: &[u8]| {
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor is owned by the File.
    let fd = unsafe { libc::memfd_create(c"fuzz-config".as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create failed");
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.write_all(data).expect("write to memfd");
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let Ok(cli) = Cli::try_parse_from(["ringsided", "--config", path.as_str()]) else { return };
    let _ = Config::load(&cli, Some("fuzz-token-0123456789abcdef0123".into()));
});
