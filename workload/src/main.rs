//! `ml-workload`: a labelled ML training loop with real system activity, for testing and
//! benchmarking Ringside's scheduler. It loads the CUDA and NCCL *test doubles* (built from
//! `doubles/*.c`; they are not CUDA or NCCL) with `dlopen`, as PyTorch loads libcuda, and runs
//! cycles of four phases on its main thread, logging each phase's wall-clock interval — the
//! ground truth phase detection is scored against:
//!
//! - `data_loading`: blocked reading batches from a pipe fed by a DataLoader-style worker child
//!   process (`pt_data_worker`: ~1 ms of "decoding" per 64 KiB batch, then a pause);
//! - `gpu_compute`: 20 kernel launches (200 µs of simulated device time each), then
//!   `cuStreamSynchronize`, which blocks until the "device" is done;
//! - `nccl_collective`: `ncclAllReduce` of 1 MiB with a second rank (thread `nccl-rank1`);
//! - `optimizer_step`: CPU-bound Adam-style updates (~2 ms each), a small launch every 2 ms.
//!
//! ```text
//! ml-workload [--doubles DIR] [--phase-ms 1500] [--cycles 3] [--log FILE] [--ready FILE] [--stats FILE]
//!             [--data-weight K] [--hang-ms N]
//! ```
//! `--data-weight K`: data loading lasts K phases (an input-bound job). `--hang-ms N`: in the
//! second cycle (the first if there is one), the other rank joins the first collective N ms
//! late, so the main thread blocks in `ncclAllReduce` that long (a stalled rank); the log then
//! has a line `{"hang_start_ms","hang_end_ms"}` for the blocked call.
//! `--log`: one JSON line per phase, `{"phase","start_ms","end_ms","pid","tid"}` (Unix ms);
//! `--ready`: written with the pid once set up; `--stats`: per-phase iteration times (p50/p99)
//! as JSON at the end.
//!
//! `ml-workload --pingpong N` instead measures context switches: a byte bounced N times between
//! two threads through two pipes, printing `{"round_trips":N,"us_per_round_trip":…}`.
//!
//! `ml-workload --eager-steps SECONDS [--ready FILE] [--go FILE]` instead runs steps shaped like
//! an eager PyTorch training step on the doubles — 200 kernel launches, an all-reduce, a
//! synchronize — for SECONDS, printing `{"steps":N,"seconds":S,"steps_per_s":R}`: what a
//! launch-bound job makes of the probes on its path. With `--go`, it writes `--ready` once set up
//! and starts only when FILE exists (after the daemon has found and probed it).

// Each binary uses part of it.
#[allow(dead_code)]
mod doubles;
mod go;

use doubles::Doubles;

use std::ffi::{c_int, c_void, CString};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const PHASES: [&str; 4] = ["data_loading", "gpu_compute", "nccl_collective", "optimizer_step"];
const BATCH: usize = 64 * 1024;
const ALLREDUCE_FLOATS: usize = 256 * 1024;

struct Args {
    doubles: PathBuf,
    phase_ms: u64,
    cycles: u32,
    log: Option<PathBuf>,
    ready: Option<PathBuf>,
    stats: Option<PathBuf>,
    pingpong: Option<u32>,
    data_weight: u32,
    hang_ms: u64,
    eager_steps: Option<f64>,
    go: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        doubles: PathBuf::from(env!("RINGSIDE_TEST_DOUBLES")),
        phase_ms: 1500,
        cycles: 3,
        log: None,
        ready: None,
        stats: None,
        pingpong: None,
        data_weight: 1,
        hang_ms: 0,
        eager_steps: None,
        go: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--doubles" => args.doubles = value()?.into(),
            "--phase-ms" => args.phase_ms = value()?.parse().map_err(|e| format!("--phase-ms: {e}"))?,
            "--cycles" => args.cycles = value()?.parse().map_err(|e| format!("--cycles: {e}"))?,
            "--log" => args.log = Some(value()?.into()),
            "--ready" => args.ready = Some(value()?.into()),
            "--stats" => args.stats = Some(value()?.into()),
            "--data-weight" => {
                args.data_weight = value()?.parse().map_err(|e| format!("--data-weight: {e}"))?;
            }
            "--hang-ms" => args.hang_ms = value()?.parse().map_err(|e| format!("--hang-ms: {e}"))?,
            "--eager-steps" => {
                args.eager_steps = Some(value()?.parse().map_err(|e| format!("--eager-steps: {e}"))?);
            }
            "--go" => args.go = Some(value()?.into()),
            "--pingpong" => {
                args.pingpong = Some(value()?.parse().map_err(|e| format!("--pingpong: {e}"))?);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.phase_ms < 100 || args.cycles == 0 || !(1..=100).contains(&args.data_weight) {
        return Err("--phase-ms must be at least 100, --cycles at least 1 and --data-weight 1 to 100".into());
    }
    Ok(args)
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// The DataLoader worker: decodes (spins ~1 ms) and writes 64 KiB batches into the pipe; it
/// blocks in write while the pipe is full, i.e. outside the data-loading phase.
fn worker(fd: c_int) -> ! {
    // SAFETY: single-threaded child of a fork; plain syscalls.
    unsafe {
        let name = CString::new("pt_data_worker").unwrap_or_default();
        libc::prctl(libc::PR_SET_NAME, name.as_ptr());
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let mut batch = vec![0u8; BATCH];
    let mut seed = 0x9e3779b97f4a7c15u64;
    loop {
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(1) {
            for b in batch.iter_mut().take(4096) {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                *b = (seed >> 56) as u8;
            }
        }
        let mut written = 0;
        while written < BATCH {
            // SAFETY: writing from a live buffer of BATCH bytes.
            let n = unsafe { libc::write(fd, batch[written..].as_ptr().cast(), BATCH - written) };
            if n <= 0 {
                // SAFETY: leaving the child without running the parent's destructors.
                unsafe { libc::_exit(0) };
            }
            written += n as usize;
        }
        std::thread::sleep(Duration::from_millis(4));
    }
}

/// NCCL rank 1: one collective per round the main thread (rank 0) starts.
#[derive(Default)]
struct Rounds {
    requested: u64,
    stop: bool,
    /// The other rank joins the next collective this late (a stalled rank), once.
    late_ms: u64,
}

struct Samples(Vec<(usize, f64)>);

impl Samples {
    fn add(&mut self, phase: usize, started: Instant) {
        self.0.push((phase, started.elapsed().as_secs_f64() * 1000.0));
    }

    fn json(&self) -> serde_json::Value {
        let mut out = serde_json::Map::new();
        for (i, name) in PHASES.iter().enumerate() {
            let mut v: Vec<f64> = self.0.iter().filter(|(p, _)| *p == i).map(|(_, ms)| *ms).collect();
            v.sort_by(f64::total_cmp);
            let q = |q: f64| v.get(((v.len().max(1) - 1) as f64 * q).round() as usize).copied();
            out.insert(name.to_string(), serde_json::json!({ "n": v.len(), "p50_ms": q(0.5), "p99_ms": q(0.99) }));
        }
        serde_json::Value::Object(out)
    }
}

/// One Adam-style update over `params` (the optimizer step's arithmetic).
fn adam(params: &mut [f32], m: &mut [f32], v: &mut [f32], step: i32) {
    let (b1, b2, lr, eps) = (0.9f32, 0.999f32, 1e-3f32, 1e-8f32);
    let (c1, c2) = (1.0 - b1.powi(step), 1.0 - b2.powi(step));
    for i in 0..params.len() {
        let g = params[i] * 1e-3 + 1e-4;
        m[i] = b1 * m[i] + (1.0 - b1) * g;
        v[i] = b2 * v[i] + (1.0 - b2) * g * g;
        params[i] -= lr * (m[i] / c1) / ((v[i] / c2).sqrt() + eps);
    }
}

fn run(args: Args) -> Result<(), String> {
    // The worker is forked before any thread exists.
    let mut fds = [0 as c_int; 2];
    // SAFETY: a two-int array for pipe2.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    let (read_fd, write_fd) = (fds[0], fds[1]);
    // SAFETY: valid fd; a failure only leaves the default pipe size.
    unsafe { libc::fcntl(write_fd, libc::F_SETPIPE_SZ, BATCH as c_int) };
    // SAFETY: no other thread exists yet; the child only uses its own memory and syscalls.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if child == 0 {
        // SAFETY: closing the child's copy of the read end.
        unsafe { libc::close(read_fd) };
        worker(write_fd);
    }
    // SAFETY: closing the parent's copy of the write end.
    unsafe { libc::close(write_fd) };

    let doubles = Arc::new(Doubles::load(&args.doubles)?);
    // SAFETY: the double's cuInit takes flags only.
    unsafe { (doubles.cu_init)(0) };
    let comm0 = doubles.comm(2, 0)?;
    let comm1 = doubles.comm(2, 1)? as usize;
    let rounds = Arc::new((Mutex::new(Rounds::default()), Condvar::new()));
    let rank1 = {
        let (doubles, rounds) = (doubles.clone(), rounds.clone());
        std::thread::Builder::new()
            .name("nccl-rank1".into())
            .spawn(move || {
                let send = vec![1.0f32; ALLREDUCE_FLOATS];
                let mut recv = vec![0.0f32; ALLREDUCE_FLOATS];
                let mut done = 0u64;
                let mut late;
                loop {
                    {
                        let (lock, cv) = &*rounds;
                        let mut r = lock.lock().unwrap_or_else(|e| e.into_inner());
                        while r.requested == done && !r.stop {
                            r = cv.wait(r).unwrap_or_else(|e| e.into_inner());
                        }
                        if r.requested == done && r.stop {
                            return;
                        }
                        late = std::mem::take(&mut r.late_ms);
                    }
                    std::thread::sleep(Duration::from_millis(late));
                    doubles.all_reduce(&send, &mut recv, comm1 as *mut c_void);
                    done += 1;
                }
            })
            .map_err(|e| format!("spawn nccl-rank1: {e}"))?
    };

    // Calibrate the optimizer step to ~2 ms of arithmetic on an idle CPU.
    let mut n = 16 * 1024;
    let (mut params, mut m, mut v) = (vec![0.5f32; n], vec![0f32; n], vec![0f32; n]);
    // The fastest of a few runs: a busy CPU must not make the steps short.
    let per_element = (0..5)
        .map(|_| {
            let t = Instant::now();
            adam(&mut params, &mut m, &mut v, 1);
            t.elapsed().as_secs_f64() / n as f64
        })
        .fold(f64::INFINITY, f64::min);
    n = ((0.002 / per_element.max(1e-10)) as usize).clamp(1024, 1 << 24);
    params.resize(n, 0.5);
    m.resize(n, 0.0);
    v.resize(n, 0.0);

    // A file data loading reads now and then; unlinked at once, so a killed run leaves nothing.
    let scratch_path = std::env::temp_dir().join(format!("ml-workload-{}.bin", std::process::id()));
    let scratch_file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&scratch_path)
        .and_then(|mut f| {
            let _ = std::fs::remove_file(&scratch_path);
            f.write_all(&[3u8; 4096]).map(|()| f)
        })
        .map_err(|e| format!("scratch file {}: {e}", scratch_path.display()))?;
    let mut scratch = vec![0u8; 4096];
    let mut log: Box<dyn Write> = match &args.log {
        Some(path) => Box::new(std::fs::File::create(path).map_err(|e| format!("--log {}: {e}", path.display()))?),
        None => Box::new(std::io::stdout()),
    };
    if let Some(ready) = &args.ready {
        std::fs::write(ready, std::process::id().to_string()).map_err(|e| format!("--ready: {e}"))?;
    }

    let pid = std::process::id();
    let tid = gettid();
    let mut samples = Samples(Vec::new());
    let mut batch = vec![0u8; BATCH];
    let send = vec![1.0f32; ALLREDUCE_FLOATS];
    let mut recv = vec![0.0f32; ALLREDUCE_FLOATS];
    let mut step = 0;
    let mut last_launch = Instant::now();
    let phase_len = Duration::from_millis(args.phase_ms);
    let hang_cycle = if args.hang_ms > 0 { Some(1.min(args.cycles - 1)) } else { None };
    for cycle in 0..args.cycles {
        for (phase, name) in PHASES.iter().enumerate() {
            let start_ms = now_ms();
            let start = Instant::now();
            let mut batches = 0u64;
            let mut hang = (phase == 2 && hang_cycle == Some(cycle)).then_some(args.hang_ms);
            let length = if phase == 0 { phase_len * args.data_weight } else { phase_len };
            while start.elapsed() < length {
                let t = Instant::now();
                match phase {
                    0 => {
                        let mut got = 0;
                        while got < BATCH {
                            // SAFETY: reading into a live buffer of BATCH bytes.
                            let r = unsafe { libc::read(read_fd, batch[got..].as_mut_ptr().cast(), BATCH - got) };
                            if r <= 0 {
                                return Err("the DataLoader worker went away".into());
                            }
                            got += r as usize;
                        }
                        batches += 1;
                        if batches.is_multiple_of(10) {
                            let _ = std::os::unix::fs::FileExt::read_at(&scratch_file, &mut scratch, 0);
                        }
                    }
                    1 => {
                        for _ in 0..20 {
                            doubles.launch(200);
                        }
                        doubles.synchronize();
                    }
                    2 => {
                        let late_ms = hang.take().unwrap_or(0);
                        {
                            let (lock, cv) = &*rounds;
                            let mut r = lock.lock().unwrap_or_else(|e| e.into_inner());
                            r.requested += 1;
                            r.late_ms = late_ms;
                            cv.notify_all();
                        }
                        let called_ms = now_ms();
                        doubles.all_reduce(&send, &mut recv, comm0);
                        if late_ms > 0 {
                            let line = serde_json::json!({ "hang_start_ms": called_ms, "hang_end_ms": now_ms() });
                            writeln!(log, "{line}").and_then(|()| log.flush()).map_err(|e| format!("--log: {e}"))?;
                        }
                    }
                    _ => {
                        step += 1;
                        adam(&mut params, &mut m, &mut v, step);
                        // A small kernel every 2 ms at most, however long a step takes here.
                        if last_launch.elapsed() >= Duration::from_millis(2) {
                            doubles.launch(10);
                            last_launch = Instant::now();
                        }
                    }
                }
                samples.add(phase, t);
            }
            let line = serde_json::json!({
                "phase": name, "start_ms": start_ms, "end_ms": now_ms(), "pid": pid, "tid": tid,
            });
            writeln!(log, "{line}").and_then(|()| log.flush()).map_err(|e| format!("--log: {e}"))?;
        }
    }
    doubles.synchronize();
    {
        let (lock, cv) = &*rounds;
        lock.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        cv.notify_all();
    }
    let _ = rank1.join();
    // SAFETY: closing the read end ends the worker (EPIPE); then reap it.
    unsafe {
        libc::close(read_fd);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    if let Some(path) = &args.stats {
        std::fs::write(path, samples.json().to_string()).map_err(|e| format!("--stats: {e}"))?;
    }
    Ok(())
}

/// Eager-style training steps for `seconds`: 200 launches of kernels that take no device time
/// (each a few µs of the double's own marshalling on the CPU: the step is bound by its
/// launches, as an eager job's often is), an all-reduce (one rank: the double's transfer time
/// only) and a synchronize. Returns (steps, seconds).
fn eager_steps(args: &Args, seconds: f64) -> Result<(u64, f64), String> {
    let doubles = Doubles::load(&args.doubles)?;
    // SAFETY: the double's cuInit takes flags only.
    unsafe { (doubles.cu_init)(0) };
    let comm = doubles.comm(1, 0)?;
    let send = vec![1.0f32; 256];
    let mut recv = vec![0.0f32; 256];
    if let Some(ready) = &args.ready {
        std::fs::write(ready, std::process::id().to_string()).map_err(|e| format!("--ready: {e}"))?;
    }
    go::wait_for(args.go.as_deref())?;
    let limit = Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut steps = 0u64;
    while started.elapsed() < limit {
        for _ in 0..200 {
            doubles.launch(0);
        }
        doubles.all_reduce(&send, &mut recv, comm);
        doubles.synchronize();
        steps += 1;
    }
    Ok((steps, started.elapsed().as_secs_f64()))
}

/// Mean round trip (µs) of a byte bounced between two threads through two pipes: two context
/// switches per round trip when both threads share a CPU, two wake-ups otherwise.
fn pipe_pingpong(round_trips: u32) -> std::io::Result<f64> {
    use std::io::Read;
    // Main -> echo on the first pipe, echo -> main on the second.
    let (mut to_echo_read, mut to_echo) = std::io::pipe()?;
    let (mut from_echo, mut from_echo_write) = std::io::pipe()?;
    let echo = std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        while to_echo_read.read_exact(&mut byte).is_ok() {
            if from_echo_write.write_all(&byte).is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    let mut byte = [7u8; 1];
    for _ in 0..round_trips {
        to_echo.write_all(&byte)?;
        from_echo.read_exact(&mut byte)?;
    }
    let elapsed = start.elapsed();
    drop(to_echo);
    let _ = echo.join();
    Ok(elapsed.as_secs_f64() * 1e6 / f64::from(round_trips))
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("ml-workload: {e}");
            std::process::exit(2);
        }
    };
    if let Some(round_trips) = args.pingpong {
        match pipe_pingpong(round_trips.max(1)) {
            Ok(us) => println!("{{\"round_trips\":{round_trips},\"us_per_round_trip\":{us:.3}}}"),
            Err(e) => {
                eprintln!("ml-workload: ping-pong: {e}");
                std::process::exit(2);
            }
        }
        return;
    }
    if let Some(seconds) = args.eager_steps {
        match eager_steps(&args, seconds) {
            Ok((steps, secs)) => {
                println!(
                    "{}",
                    serde_json::json!({ "steps": steps, "seconds": secs, "steps_per_s": steps as f64 / secs })
                )
            }
            Err(e) => {
                eprintln!("ml-workload: {e}");
                std::process::exit(2);
            }
        }
        return;
    }
    if let Err(e) = run(args) {
        eprintln!("ml-workload: {e}");
        std::process::exit(2);
    }
}
