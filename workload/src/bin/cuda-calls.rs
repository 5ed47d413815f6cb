//! `cuda-calls`: drives a CUDA driver library the way the CUDA runtime does — through the entry
//! points `cuGetProcAddress_v2` hands out — for the tests and the launch benchmark. It works
//! with NVIDIA's real `libcuda.so.1` on a machine without a GPU (`cuInit` answers 100, no
//! device; every call then fails fast, but its entry is what a uprobe sees) and with a test
//! double (which need not have `cuGetProcAddress_v2`: `dlsym` then).
//!
//! ```text
//! cuda-calls entry-points --driver LIB OP...
//!     one JSON line per (operation, flag, CUDA version) asked of cuGetProcAddress_v2:
//!     {"op","flag","version","result","symbol","exact"}; `exact`: the pointer is the
//!     exported symbol's own address (else `symbol` is only the nearest export below it)
//! cuda-calls drive --driver LIB --thread FLAG:OP=N[,OP=N...] [--thread ...] [--ready FILE]
//!     [--hold-ms MS]
//!     one thread per --thread, each asking with FLAG (0 default, 1 legacy stream, 2 per-thread
//!     default stream) and calling each OP N times with zero arguments, then sleeping MS (its
//!     counters end with it); writes {"tid","flag","calls":{OP:N}} per thread to FILE (the
//!     sign the calls are done)
//! cuda-calls launch-loop --driver LIB [--flag F] --seconds S [--ready FILE] [--go FILE]
//!     calls the launch entry point in a loop for S seconds: {"calls","seconds","calls_per_s"};
//!     with --go, it writes --ready once set up and starts only when FILE exists
//! cuda-calls hold --driver LIB [--also LIB...] [--ready FILE] --hold-ms MS
//!     loads the driver (and each --also library, e.g. NCCL), writes FILE and sleeps MS: a
//!     process of a large job, for the descriptor tests
//! ```
//! Every argument passed is zero: the real driver, not initialised, checks that first.

#[path = "../go.rs"]
mod go;

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Every driver entry point takes at most eleven integer or pointer arguments; on x86-64 and
/// arm64 passing more than a function takes is harmless (the caller owns the stack), so one
/// type calls them all, with zeros.
type Entry = unsafe extern "C" fn(usize, usize, usize, usize, usize, usize, usize, usize, usize, usize, usize) -> c_int;
type CuInit = unsafe extern "C" fn(u32) -> c_int;
type GetProcAddress = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;

/// CUDA versions asked for: the oldest runtime with `cuGetProcAddress` to the newest.
const VERSIONS: [c_int; 6] = [11030, 11080, 12000, 12020, 12080, 13000];

struct Driver {
    handle: *mut c_void,
    get_proc_address: Option<GetProcAddress>,
}

fn dl_error() -> String {
    // SAFETY: dlerror returns a static string or null.
    let why = unsafe { libc::dlerror() };
    if why.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: not null, so a NUL-terminated string owned by the C library.
        unsafe { CStr::from_ptr(why) }.to_string_lossy().into_owned()
    }
}

impl Driver {
    fn open(path: &str) -> Result<Driver, String> {
        let c = CString::new(path).map_err(|e| e.to_string())?;
        // SAFETY: a valid NUL-terminated path; the handle is kept for the process's life.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!("dlopen {path}: {}", dl_error()));
        }
        let driver = Driver { handle, get_proc_address: None };
        if let Some(init) = driver.symbol("cuInit") {
            // SAFETY: cuInit(unsigned int flags) -> CUresult, in the real driver and the doubles.
            // Its answer does not matter: 100 (no device) leaves every entry point callable.
            unsafe { std::mem::transmute::<*mut c_void, CuInit>(init)(0) };
        }
        let get_proc_address = driver
            .symbol("cuGetProcAddress_v2")
            // SAFETY: the driver's cuGetProcAddress_v2 has exactly this signature.
            .map(|p| unsafe { std::mem::transmute::<*mut c_void, GetProcAddress>(p) });
        Ok(Driver { get_proc_address, ..driver })
    }

    fn symbol(&self, name: &str) -> Option<*mut c_void> {
        let c = CString::new(name).ok()?;
        // SAFETY: a handle from dlopen and a valid symbol name.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    /// What the driver hands out for `op` with `flag` at `version` (the runtime's way), or
    /// what `dlsym` finds by the name where the library has no `cuGetProcAddress_v2`.
    fn resolve(&self, op: &str, flag: u64, version: c_int) -> (c_int, Option<*mut c_void>) {
        let Some(get) = self.get_proc_address else { return (0, self.symbol(op)) };
        let Ok(name) = CString::new(op) else { return (1, None) };
        let mut pointer: *mut c_void = std::ptr::null_mut();
        let mut status: c_int = 0;
        // SAFETY: a valid name, and out-parameters that live across the call.
        let result = unsafe { get(name.as_ptr(), &mut pointer, version, flag, &mut status) };
        (result, (!pointer.is_null()).then_some(pointer))
    }
}

/// The exported symbol at or below `pointer`, and whether it starts exactly there.
fn symbol_at(pointer: *mut c_void) -> (Option<String>, bool) {
    let mut info: libc::Dl_info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the address and fills the struct it is given.
    if unsafe { libc::dladdr(pointer, &mut info) } == 0 || info.dli_sname.is_null() {
        return (None, false);
    }
    // SAFETY: dli_sname is a NUL-terminated string of the loaded object's string table.
    let name = unsafe { CStr::from_ptr(info.dli_sname) }.to_string_lossy().into_owned();
    (Some(name), info.dli_saddr == pointer)
}

fn call(entry: *mut c_void) -> c_int {
    // SAFETY: an entry point of the driver; see `Entry` for why zeros in eleven integer
    // registers and stack slots are a valid call of any of them.
    unsafe { std::mem::transmute::<*mut c_void, Entry>(entry)(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0) }
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

struct Args {
    driver: String,
    rest: Vec<String>,
    threads: Vec<(u64, Vec<(String, u64)>)>,
    ready: Option<PathBuf>,
    hold: Duration,
    flag: u64,
    seconds: f64,
    go: Option<PathBuf>,
    also: Vec<String>,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args {
        driver: String::new(),
        rest: Vec::new(),
        threads: Vec::new(),
        ready: None,
        hold: Duration::ZERO,
        flag: 0,
        seconds: 1.0,
        go: None,
        also: Vec::new(),
    };
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--driver" => args.driver = value()?,
            "--ready" => args.ready = Some(value()?.into()),
            "--go" => args.go = Some(value()?.into()),
            "--also" => args.also.push(value()?),
            "--hold-ms" => args.hold = Duration::from_millis(value()?.parse().map_err(|e| format!("--hold-ms: {e}"))?),
            "--flag" => args.flag = value()?.parse().map_err(|e| format!("--flag: {e}"))?,
            "--seconds" => args.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--thread" => {
                let spec = value()?;
                let (flag, ops) = spec.split_once(':').ok_or("--thread FLAG:OP=N,...")?;
                let ops = ops
                    .split(',')
                    .map(|o| {
                        let (op, n) = o.split_once('=').ok_or("--thread FLAG:OP=N,...")?;
                        Ok((op.to_string(), n.parse::<u64>().map_err(|e| format!("{o}: {e}"))?))
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                args.threads.push((flag.parse().map_err(|e| format!("{spec}: {e}"))?, ops));
            }
            _ => args.rest.push(arg),
        }
    }
    if args.driver.is_empty() {
        return Err("--driver LIB is needed".into());
    }
    Ok(args)
}

fn entry_points(driver: &Driver, ops: &[String]) {
    let mut out = std::io::stdout().lock();
    for op in ops {
        for flag in [0u64, 1, 2] {
            for version in VERSIONS {
                let (result, pointer) = driver.resolve(op, flag, version);
                let (symbol, exact) = pointer.map(symbol_at).unwrap_or((None, false));
                let line = serde_json::json!({
                    "op": op, "flag": flag, "version": version, "result": result,
                    "symbol": symbol, "exact": exact,
                });
                let _ = writeln!(out, "{line}");
            }
        }
    }
}

fn drive(driver: &Driver, args: &Args) -> Result<(), String> {
    // Resolved up front, on the main thread: the pointers are plain addresses.
    let mut plans = Vec::new();
    for (flag, ops) in &args.threads {
        let mut plan = Vec::new();
        for (op, n) in ops {
            let (result, pointer) = driver.resolve(op, *flag, 12020);
            let pointer = pointer.ok_or_else(|| format!("{op} (flag {flag}): not handed out ({result})"))?;
            plan.push((op.clone(), *n, pointer as usize));
        }
        plans.push((*flag, plan));
    }
    go::wait_for(args.go.as_deref())?;
    // Each thread stays (sleeps) after its calls: a thread's counters end with it.
    let (tx, rx) = std::sync::mpsc::channel();
    for (flag, plan) in plans {
        let (tx, hold) = (tx.clone(), args.hold);
        std::thread::spawn(move || {
            let mut calls = serde_json::Map::new();
            for (op, n, pointer) in plan {
                for _ in 0..n {
                    call(pointer as *mut c_void);
                }
                calls.insert(op, n.into());
            }
            let _ = tx.send(serde_json::json!({ "tid": gettid(), "flag": flag, "calls": calls }));
            std::thread::sleep(hold);
        });
    }
    drop(tx);
    let done: Vec<serde_json::Value> = rx.iter().take(args.threads.len()).collect();
    let text: String = done.iter().map(|d| format!("{d}\n")).collect();
    print!("{text}");
    if let Some(ready) = &args.ready {
        let partial = ready.with_extension("partial");
        std::fs::write(&partial, text).and_then(|()| std::fs::rename(&partial, ready)).map_err(|e| e.to_string())?;
    }
    std::thread::sleep(args.hold);
    Ok(())
}

fn launch_loop(driver: &Driver, args: &Args) -> Result<(), String> {
    let (result, pointer) = driver.resolve("cuLaunchKernel", args.flag, 12020);
    let pointer = pointer.ok_or_else(|| format!("cuLaunchKernel: not handed out ({result})"))?;
    if let Some(ready) = &args.ready {
        std::fs::write(ready, std::process::id().to_string()).map_err(|e| e.to_string())?;
    }
    go::wait_for(args.go.as_deref())?;
    let limit = Duration::from_secs_f64(args.seconds);
    let started = Instant::now();
    let mut calls: u64 = 0;
    loop {
        for _ in 0..4096 {
            call(pointer);
        }
        calls += 4096;
        if started.elapsed() >= limit {
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!("{}", serde_json::json!({ "calls": calls, "seconds": seconds, "calls_per_s": calls as f64 / seconds }));
    Ok(())
}

fn hold(args: &Args) -> Result<(), String> {
    for library in &args.also {
        let c = CString::new(library.as_str()).map_err(|e| e.to_string())?;
        // SAFETY: a valid NUL-terminated path; the handle is kept for the process's life.
        if unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) }.is_null() {
            return Err(format!("dlopen {library}: {}", dl_error()));
        }
    }
    if let Some(ready) = &args.ready {
        std::fs::write(ready, std::process::id().to_string()).map_err(|e| e.to_string())?;
    }
    std::thread::sleep(args.hold);
    Ok(())
}

fn main() {
    let mut argv = std::env::args().skip(1);
    let command = argv.next().unwrap_or_default();
    let result = parse(argv).and_then(|args| {
        let driver = Driver::open(&args.driver)?;
        match command.as_str() {
            "entry-points" => {
                entry_points(&driver, &args.rest);
                Ok(())
            }
            "drive" => drive(&driver, &args),
            "launch-loop" => launch_loop(&driver, &args),
            "hold" => hold(&args),
            other => Err(format!("unknown command {other:?}: entry-points, drive, launch-loop or hold")),
        }
    });
    if let Err(e) = result {
        eprintln!("cuda-calls: {e}");
        std::process::exit(2);
    }
}
