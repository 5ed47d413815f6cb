//! `hostile-process`: what an unprivileged local user can do to a node daemon that watches
//! every process — a test double for Ringside's trust-boundary tests, not a workload.
//!
//! ```text
//! hostile-process map FILE [--replace fifo|symlink-to-zero] [--spin] [--ready PATH]
//!     maps the first 4 KiB of FILE (read-only), then optionally deletes FILE and puts a FIFO
//!     or a symbolic link to /dev/zero at its path; spins on a CPU with --spin, else sleeps.
//! hostile-process hold DEVICE --children N [--ready PATH]
//!     opens DEVICE and forks N children that keep it open (each dies with its parent).
//! ```
//! `--ready PATH` is created once everything is in place. It runs until killed.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

fn fail(what: &str) -> ! {
    eprintln!("hostile-process: {what}");
    std::process::exit(2)
}

fn option(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn ready(args: &[String]) {
    if let Some(path) = option(args, "--ready") {
        std::fs::write(path, b"ready\n").unwrap_or_else(|e| fail(&format!("cannot write --ready: {e}")));
    }
}

fn idle(spin: bool) -> ! {
    let mut x: u64 = 1;
    loop {
        if spin {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        } else {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

fn map(args: &[String]) -> ! {
    let path = PathBuf::from(args.get(2).unwrap_or_else(|| fail("map needs a FILE")));
    let file = std::fs::File::open(&path).unwrap_or_else(|e| fail(&format!("cannot open {}: {e}", path.display())));
    // SAFETY: a read-only private mapping of 4 KiB of an open file; never written through.
    let at = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
    if at == libc::MAP_FAILED {
        fail(&format!("mmap: {}", std::io::Error::last_os_error()));
    }
    drop(file);
    match option(args, "--replace").as_deref() {
        None => {}
        Some("fifo") => {
            std::fs::remove_file(&path).unwrap_or_else(|e| fail(&format!("unlink: {e}")));
            let name = CString::new(path.as_os_str().as_encoded_bytes()).unwrap_or_else(|_| fail("path"));
            // SAFETY: mkfifo with a valid NUL-terminated path.
            if unsafe { libc::mkfifo(name.as_ptr(), 0o666) } != 0 {
                fail(&format!("mkfifo: {}", std::io::Error::last_os_error()));
            }
        }
        Some("symlink-to-zero") => {
            std::fs::remove_file(&path).unwrap_or_else(|e| fail(&format!("unlink: {e}")));
            std::os::unix::fs::symlink(Path::new("/dev/zero"), &path)
                .unwrap_or_else(|e| fail(&format!("symlink: {e}")));
        }
        Some(other) => fail(&format!("--replace {other}: fifo or symlink-to-zero")),
    }
    ready(args);
    idle(args.iter().any(|a| a == "--spin"))
}

fn hold(args: &[String]) -> ! {
    let device = args.get(2).unwrap_or_else(|| fail("hold needs a DEVICE"));
    let children: u32 = option(args, "--children").and_then(|n| n.parse().ok()).unwrap_or(0);
    let _held = std::fs::File::open(device).unwrap_or_else(|e| fail(&format!("cannot open {device}: {e}")));
    let me = std::process::id() as libc::pid_t;
    for _ in 0..children {
        // SAFETY: fork in a single-threaded process; the child goes on below.
        match unsafe { libc::fork() } {
            // SAFETY: the child only calls async-signal-safe functions (prctl, getppid, pause,
            // _exit).
            0 => unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // The parent may have died before the line above took effect.
                if libc::getppid() != me {
                    libc::_exit(0);
                }
                loop {
                    libc::pause();
                }
            },
            -1 => fail(&format!("fork: {}", std::io::Error::last_os_error())),
            _ => {}
        }
    }
    ready(args);
    idle(false)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("map") => map(&args),
        Some("hold") => hold(&args),
        _ => fail("usage: hostile-process map FILE [--replace fifo|symlink-to-zero] [--spin] [--ready PATH] | hold DEVICE --children N [--ready PATH]"),
    }
}
