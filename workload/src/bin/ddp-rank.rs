//! `ddp-rank`: one rank of a synchronous data-parallel training job, on the CUDA and NCCL *test
//! doubles* (not CUDA or NCCL), for the fleet tests and the straggler benchmark. Run one process
//! per rank, each with the same `--barrier` file: their all-reduce is the NCCL double's barrier
//! in that shared file, so the slowest rank sets everyone's pace, as NCCL's collectives do.
//!
//! Each step, on the main thread:
//! - `data_loading`: it asks its DataLoader worker child (`pt_data_worker`) for a batch and
//!   blocks reading it; the worker takes `--load-ms` to make one;
//! - `gpu_compute`: 20 kernel launches of `--compute-ms` of device time in all, then
//!   `cuStreamSynchronize`;
//! - `nccl_collective`: `ncclAllReduce` across the ranks, then `--transfer-ms` of transfer;
//! - `optimizer_step`: `--optimizer-ms` of arithmetic, measured on an idle CPU at start (so a
//!   CPU shared with another task makes it last longer, as it would a real optimizer step).
//!
//! ```text
//! ddp-rank --rank R --world N --barrier FILE [--steps S] [--load-ms 300] [--compute-ms 300]
//!          [--optimizer-ms 100] [--transfer-ms 100] [--stuck-after S] [--cpu K] [--doubles DIR]
//!          [--ready FILE] [--log FILE]
//! ddp-rank --hog PERCENT [--cpu K]
//! ```
//! `--steps 0` (the default) runs until killed. `--stuck-after S`: after S steps the rank waits
//! for a batch that never comes (stuck in data loading), so the others wait in the all-reduce.
//! `--cpu K`: runs on CPU K only. `--log`: one JSON line per step, `{"rank","step","start_ms",
//! "end_ms","load_ms","compute_ms","collective_ms","optimizer_ms"}` (the ground truth: each
//! part's wall-clock time). `--hog PERCENT` instead keeps a CPU busy PERCENT of every 10 ms
//! (another tenant's task), to make a rank pinned to the same CPU wait for it.

// Each binary uses part of it.
#[allow(dead_code)]
#[path = "../doubles.rs"]
mod doubles;

use std::ffi::c_int;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use doubles::Doubles;

const BATCH: usize = 64 * 1024;
const LAUNCHES: u64 = 20;

struct Args {
    rank: i32,
    world: i32,
    barrier: Option<PathBuf>,
    steps: u64,
    load_ms: u64,
    compute_ms: u64,
    optimizer_ms: u64,
    transfer_ms: u64,
    stuck_after: Option<u64>,
    cpu: Option<usize>,
    doubles: PathBuf,
    ready: Option<PathBuf>,
    log: Option<PathBuf>,
    hog: Option<u32>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        rank: 0,
        world: 1,
        barrier: None,
        steps: 0,
        load_ms: 300,
        compute_ms: 300,
        optimizer_ms: 100,
        transfer_ms: 100,
        stuck_after: None,
        cpu: None,
        doubles: PathBuf::from(env!("RINGSIDE_TEST_DOUBLES")),
        ready: None,
        log: None,
        hog: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || value.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--rank" => args.rank = number()? as i32,
            "--world" => args.world = number()? as i32,
            "--barrier" => args.barrier = Some(value.into()),
            "--steps" => args.steps = number()?,
            "--load-ms" => args.load_ms = number()?,
            "--compute-ms" => args.compute_ms = number()?,
            "--optimizer-ms" => args.optimizer_ms = number()?,
            "--transfer-ms" => args.transfer_ms = number()?,
            "--stuck-after" => args.stuck_after = Some(number()?),
            "--cpu" => args.cpu = Some(number()? as usize),
            "--doubles" => args.doubles = value.into(),
            "--ready" => args.ready = Some(value.into()),
            "--log" => args.log = Some(value.into()),
            "--hog" => args.hog = Some(number()?.min(100) as u32),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.hog.is_none() && (args.barrier.is_none() || !(1..=8).contains(&args.world) || args.rank >= args.world) {
        return Err("--barrier, --world 1 to 8 and a --rank below it are needed".into());
    }
    Ok(args)
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn pin(cpu: usize) -> Result<(), String> {
    // SAFETY: a zeroed cpu_set_t filled with CPU_SET, passed with its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(format!("--cpu {cpu}: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Busy `percent` of every 10 ms, for ever.
fn hog(percent: u32) -> ! {
    let period = Duration::from_millis(10);
    let busy = period * percent / 100;
    let mut x = 1u64;
    loop {
        let start = Instant::now();
        while start.elapsed() < busy {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        std::thread::sleep(period - busy);
    }
}

/// The DataLoader worker: for each byte asked, `load_ms` of preparation, then a batch.
fn worker(requests: c_int, batches: c_int, load_ms: u64) -> ! {
    // SAFETY: single-threaded child of a fork; plain syscalls on its own descriptors.
    unsafe {
        let name = c"pt_data_worker";
        libc::prctl(libc::PR_SET_NAME, name.as_ptr());
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    let batch = vec![7u8; BATCH];
    let mut byte = 0u8;
    // SAFETY: reading one byte into a live buffer.
    while unsafe { libc::read(requests, (&mut byte as *mut u8).cast(), 1) } == 1 {
        std::thread::sleep(Duration::from_millis(load_ms));
        let mut written = 0;
        while written < BATCH {
            // SAFETY: writing from a live buffer of BATCH bytes.
            let n = unsafe { libc::write(batches, batch[written..].as_ptr().cast(), BATCH - written) };
            if n <= 0 {
                break;
            }
            written += n as usize;
        }
    }
    // SAFETY: leaving the child without running the parent's destructors.
    unsafe { libc::_exit(0) }
}

fn pipe() -> Result<(c_int, c_int), String> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: a two-int array for pipe2.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    Ok((fds[0], fds[1]))
}

/// Reads a whole batch, blocking until it has come.
fn read_batch(fd: c_int, batch: &mut [u8]) -> Result<(), String> {
    let mut got = 0;
    while got < batch.len() {
        // SAFETY: reading into the unfilled rest of a live buffer.
        let r = unsafe { libc::read(fd, batch[got..].as_mut_ptr().cast(), batch.len() - got) };
        if r <= 0 {
            return Err("the DataLoader worker went away".into());
        }
        got += r as usize;
    }
    Ok(())
}

/// Arithmetic that takes `units` of roughly a microsecond each.
fn arithmetic(units: u64, buffer: &mut [u64]) {
    for u in 0..units {
        for (i, v) in buffer.iter_mut().enumerate() {
            *v = v.rotate_left(7) ^ (u.wrapping_add(i as u64)).wrapping_mul(0x9e3779b97f4a7c15);
        }
    }
    std::hint::black_box(buffer);
}

/// Units of [`arithmetic`] per millisecond on this CPU when idle (the fastest of a few runs).
fn calibrate(buffer: &mut [u64]) -> u64 {
    let per_unit = (0..5)
        .map(|_| {
            let t = Instant::now();
            arithmetic(200, buffer);
            t.elapsed().as_secs_f64() / 200.0
        })
        .fold(f64::INFINITY, f64::min);
    ((0.001 / per_unit.max(1e-9)) as u64).max(1)
}

fn run(args: Args) -> Result<(), String> {
    if let Some(cpu) = args.cpu {
        pin(cpu)?;
    }
    if let Some(percent) = args.hog {
        hog(percent);
    }
    // The worker is forked before any thread exists.
    let (request_read, request_write) = pipe()?;
    let (batch_read, batch_write) = pipe()?;
    // SAFETY: no other thread exists yet; the child only uses its own memory and syscalls.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if child == 0 {
        // SAFETY: closing the child's copies of the parent's ends.
        unsafe {
            libc::close(request_write);
            libc::close(batch_read);
        }
        worker(request_read, batch_write, args.load_ms);
    }
    // SAFETY: closing the parent's copies of the child's ends.
    unsafe {
        libc::close(request_read);
        libc::close(batch_write);
    }
    let doubles = Doubles::load(&args.doubles)?;
    // SAFETY: the double's cuInit takes flags only.
    unsafe { (doubles.cu_init)(0) };
    let barrier = args.barrier.as_deref().ok_or("--barrier is needed")?;
    let comm = doubles.shared_comm(args.world, args.rank, barrier)?;
    let mut buffer = vec![1u64; 64];
    let units_per_ms = calibrate(&mut buffer);
    let mut log: Option<std::fs::File> = match &args.log {
        Some(path) => Some(std::fs::File::create(path).map_err(|e| format!("--log {}: {e}", path.display()))?),
        None => None,
    };
    if let Some(ready) = &args.ready {
        std::fs::write(ready, std::process::id().to_string()).map_err(|e| format!("--ready: {e}"))?;
    }
    let mut batch = vec![0u8; BATCH];
    let device_us = (args.compute_ms * 1000 / LAUNCHES).min(u64::from(u32::MAX)) as u32;
    let floats = (args.transfer_ms * 250_000) as usize;
    let mut step = 0u64;
    while args.steps == 0 || step < args.steps {
        let start_ms = now_ms();
        if args.stuck_after.is_some_and(|s| step >= s) {
            // A batch that never comes: the worker is never asked.
            read_batch(batch_read, &mut batch)?;
        }
        // SAFETY: writing one byte from a live buffer.
        if unsafe { libc::write(request_write, [1u8].as_ptr().cast(), 1) } != 1 {
            return Err("the DataLoader worker went away".into());
        }
        read_batch(batch_read, &mut batch)?;
        let load_ms = now_ms() - start_ms;
        let computing = Instant::now();
        for _ in 0..LAUNCHES {
            doubles.launch(device_us);
        }
        doubles.synchronize();
        let compute_ms = computing.elapsed().as_secs_f64() * 1000.0;
        let called = Instant::now();
        doubles.shared_all_reduce(floats, comm);
        let collective_ms = called.elapsed().as_secs_f64() * 1000.0;
        let optimizing = Instant::now();
        arithmetic(args.optimizer_ms * units_per_ms, &mut buffer);
        let optimizer_ms = optimizing.elapsed().as_secs_f64() * 1000.0;
        if let Some(log) = log.as_mut() {
            let line = serde_json::json!({
                "rank": args.rank, "step": step, "start_ms": start_ms, "end_ms": now_ms(),
                "load_ms": load_ms, "compute_ms": compute_ms, "collective_ms": collective_ms,
                "optimizer_ms": optimizer_ms,
            });
            writeln!(log, "{line}").map_err(|e| format!("--log: {e}"))?;
        }
        step += 1;
    }
    // SAFETY: closing the request pipe ends the worker; then reap it.
    unsafe {
        libc::close(request_write);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    Ok(())
}

fn main() {
    if let Err(e) = parse_args().and_then(run) {
        eprintln!("ddp-rank: {e}");
        std::process::exit(2);
    }
}
