//! What reading a process's job identity costs that process: `cargo xtask bench identity`.
//!
//! The daemon reads each ML process's `cgroup` and `environ` once, when it starts tracking it
//! (`sched::identity::of_process`). Reading `environ` takes the target's memory-map lock for a
//! moment, which its page faults also take. Here a target process (this program, run again with
//! `--target`) faults in fresh pages as fast as it can, with a 64 KiB environment (a launcher's
//! worth, `RANK` and the rest among 600 variables), and reports how many pages it faulted in:
//! alone, and while the identity is read over and over, without pause, by another thread (the
//! worst case: thousands of reads a second, where the daemon makes one per process). Rounds
//! alternate which comes first; medians are reported.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringside_daemon::sched::identity::of_process;

const ROUNDS: usize = 5;
const SECONDS: f64 = 2.0;
const PAGE: usize = 4096;
const CHUNK: usize = 256 * PAGE;

/// Faults in pages for `seconds`: maps 1 MiB, touches each page, unmaps it; prints the pages.
fn target(seconds: f64) {
    let start = Instant::now();
    let mut pages = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        // SAFETY: an anonymous private mapping of CHUNK bytes, written within its bounds and
        // unmapped before the next.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                CHUNK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                break;
            }
            for offset in (0..CHUNK).step_by(PAGE) {
                std::ptr::write_volatile(p.cast::<u8>().add(offset), 1);
            }
            libc::munmap(p, CHUNK);
        }
        pages += (CHUNK / PAGE) as u64;
    }
    println!("{}", pages as f64 / start.elapsed().as_secs_f64());
}

/// One run of the target: its pages per second, and the identity reads per second made meanwhile.
fn run(read: bool) -> (f64, f64) {
    let mut command = Command::new(std::env::current_exe().expect("this program"));
    command.args(["--target", &SECONDS.to_string()]).stdout(Stdio::piped()).env_clear();
    for i in 0..600 {
        command.env(format!("LAUNCHER_VARIABLE_{i:04}"), "x".repeat(80));
    }
    command.envs([("RANK", "3"), ("WORLD_SIZE", "16"), ("TORCHELASTIC_RUN_ID", "bench-run"), ("LOCAL_RANK", "3")]);
    let child = command.spawn().expect("start the target");
    let pid = child.id();
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let reader = read.then(|| {
        let (stop, reads) = (stop.clone(), reads.clone());
        std::thread::spawn(move || {
            let proc_root = Path::new("/proc");
            let mut rank = None;
            while !stop.load(Ordering::Relaxed) {
                rank = of_process(proc_root, pid).rank.or(rank);
                reads.fetch_add(1, Ordering::Relaxed);
            }
            rank
        })
    });
    let started = Instant::now();
    let output = child.wait_with_output().expect("the target's output");
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    if let Some(reader) = reader {
        assert_eq!(reader.join().expect("the reader"), Some(3), "the identity is read");
    }
    let pages: f64 = String::from_utf8_lossy(&output.stdout).trim().parse().expect("the target's pages per second");
    (pages, reads.load(Ordering::Relaxed) as f64 / elapsed)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--target") {
        target(args.get(i + 1).and_then(|s| s.parse().ok()).unwrap_or(SECONDS));
        return;
    }
    let (mut alone, mut read, mut reads) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        for reading in if round % 2 == 0 { [false, true] } else { [true, false] } {
            let (pages, per_s) = run(reading);
            if reading {
                read.push(pages);
                reads.push(per_s);
            } else {
                alone.push(pages);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let (alone, read, reads) = (median(alone), median(read), median(reads));
    println!("identity read (cgroup + 64 KiB environ), {ROUNDS} rounds of {SECONDS} s, medians:");
    println!("  target alone:              {alone:>10.0} pages faulted in per second");
    println!("  target while read nonstop: {read:>10.0} pages/s ({:.3}x)", read / alone);
    println!("  reads: {reads:.0} per second, {:.1} µs each", 1e6 / reads.max(1.0));
    println!("  the daemon reads each process once, when it starts tracking it");
}
