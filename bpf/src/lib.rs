//! Ringside's BPF programs and a safe API over them.
//!
//! `sched.bpf.c` keeps per-thread scheduling counters for every thread (on-CPU time, run-queue
//! wait, voluntary and involuntary switches, block-I/O wait), reports process fork/exec/exit on a
//! ring buffer, and for the processes user space marks as tracked also accounts futex waits,
//! reads, NVIDIA ioctls (syscall tracepoints), CUDA launches/synchronizes and NCCL collectives
//! (uprobes) and samples their run-queue latencies. [`SchedProbe`] loads and attaches it and
//! reads the results.
//!
//! The scheduling programs are attached as `tp_btf` where the kernel allows, else `raw_tp`, else
//! classic `tracepoint`; [`SchedProbe::programs`] says which attached and why others did not.
//!
//! Architecture invariant: BPF owns the fast path (counting), user space owns policy; this crate
//! depends on nothing of ours.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, RingBuffer, RingBufferBuilder, TracepointCategory, UprobeOpts};

mod cpus;
mod elf;
pub mod scx;

pub use cpus::parse_cpu_list;

mod skel {
    #![allow(
        clippy::all,
        clippy::undocumented_unsafe_blocks,
        non_camel_case_types,
        non_snake_case,
        dead_code,
        unused_imports
    )]
    include!(concat!(env!("OUT_DIR"), "/sched.skel.rs"));
}

/// Per-thread counters, as the BPF side keeps them (`struct thread_stats` in `intf.h`).
pub use skel::types::thread_stats as RawThreadStats;
use skel::types::{
    call_kind as RawCallKind, event as RawEvent, event_kind as RawEventKind, ml_thread_stats as RawMlThreadStats,
    sys_kind as RawSysKind,
};

/// Scheduling counters of one thread (cumulative since the probe first saw it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ThreadStats {
    pub tid: u32,
    pub tgid: u32,
    pub on_cpu_ns: u64,
    pub runq_wait_ns: u64,
    pub voluntary: u64,
    pub involuntary: u64,
    /// Time blocked in block-I/O wait.
    pub iowait_ns: u64,
    /// In progress (CLOCK_MONOTONIC ns, 0 if not): the counters above are brought up to date
    /// only at the next switch or wake-up, so a reader adds these to see the present
    /// ([`ThreadStats::at`]).
    pub on_cpu_since_ns: u64,
    pub runnable_since_ns: u64,
    pub io_since_ns: u64,
    /// A tracked thread blocked in a classified syscall: (SYS_KIND, since); its time is added
    /// to the call counters when it wakes up.
    pub blocked: (u32, u64),
}

/// CLOCK_MONOTONIC now, the clock of the BPF side's timestamps.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn in_progress(since: u64, now: u64) -> u64 {
    if since == 0 {
        0
    } else {
        now.saturating_sub(since)
    }
}

impl ThreadStats {
    /// The counters as of `now_ns` (monotonic), the interval in progress included.
    pub fn at(&self, now_ns: u64) -> ThreadStats {
        ThreadStats {
            on_cpu_ns: self.on_cpu_ns + in_progress(self.on_cpu_since_ns, now_ns),
            runq_wait_ns: self.runq_wait_ns + in_progress(self.runnable_since_ns, now_ns),
            iowait_ns: self.iowait_ns + in_progress(self.io_since_ns, now_ns),
            ..*self
        }
    }
}

/// What one thread of a tracked process did in system and library calls (cumulative).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MlThreadStats {
    pub tid: u32,
    pub tgid: u32,
    pub futex_wait_ns: u64,
    pub futex_waits: u64,
    pub read_ns: u64,
    pub reads: u64,
    pub read_bytes: u64,
    pub nv_ioctl_ns: u64,
    pub nv_ioctls: u64,
    pub launches: u64,
    pub sync_ns: u64,
    pub syncs: u64,
    /// Time in NCCL collectives, and in synchronizing on a collective.
    pub nccl_ns: u64,
    pub nccl_calls: u64,
    /// The syscall and library call in progress: (kind, since), as the BPF side keeps them.
    pub sys_in_progress: (u32, u64),
    pub call_in_progress: (u32, u64),
    /// What the GPU queue got last (`CallKind` number).
    pub last_enqueue: u32,
}

impl MlThreadStats {
    /// The counters as of `now_ns` (monotonic), the calls and waits in progress included (the
    /// thread's `blocked` state from [`ThreadStats`]): a read or a synchronize that blocks for
    /// longer than a window still shows in that window.
    pub fn at(&self, now_ns: u64, blocked: (u32, u64)) -> MlThreadStats {
        let mut s = *self;
        for (kind, since) in [self.sys_in_progress, blocked] {
            let spent = in_progress(since, now_ns);
            match RawSysKind(kind) {
                RawSysKind::SYS_KIND_FUTEX => s.futex_wait_ns += spent,
                RawSysKind::SYS_KIND_READ => s.read_ns += spent,
                RawSysKind::SYS_KIND_NV_IOCTL => s.nv_ioctl_ns += spent,
                _ => {}
            }
        }
        let (kind, since) = self.call_in_progress;
        let spent = in_progress(since, now_ns);
        match kind {
            k if k == CallKind::Nccl as u32 => s.nccl_ns += spent,
            k if k == CallKind::Sync as u32 && self.last_enqueue == CallKind::Nccl as u32 => s.nccl_ns += spent,
            k if k == CallKind::Sync as u32 => s.sync_ns += spent,
            _ => {}
        }
        s
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A new process. `inherited`: it was tracked from birth, as a child of a tracked process.
    Fork {
        parent_tgid: u32,
        inherited: bool,
    },
    Exec,
    /// A process's leader exited.
    Exit,
    /// A tracked thread went on a CPU after waiting this long in the run queue.
    RunqWait {
        ns: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub tid: u32,
    /// 0 where the attach mode cannot tell (a fork seen by the classic tracepoint).
    pub tgid: u32,
    /// CLOCK_MONOTONIC.
    pub at_ns: u64,
    pub comm: String,
}

/// How the scheduling programs are attached, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    TpBtf,
    RawTp,
    Tracepoint,
}

impl AttachMode {
    pub const ALL: [AttachMode; 3] = [AttachMode::TpBtf, AttachMode::RawTp, AttachMode::Tracepoint];

    pub fn as_str(self) -> &'static str {
        match self {
            AttachMode::TpBtf => "tp_btf",
            AttachMode::RawTp => "raw_tp",
            AttachMode::Tracepoint => "tracepoint",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            AttachMode::TpBtf => "btf_",
            AttachMode::RawTp => "raw_",
            AttachMode::Tracepoint => "tp_",
        }
    }
}

/// The state of one program (or one attach point of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramStatus {
    /// What it observes, e.g. `sched_switch`, `sys_enter_read`.
    pub name: String,
    /// How it is (or was to be) attached.
    pub attach: Attachment,
    pub state: AttachState,
    pub detail: Option<String>,
}

/// How a program is (or was to be) attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attachment {
    /// A scheduling or syscall program, in one of the attach modes.
    Mode(AttachMode),
    /// Syscall waits classified from the task's registers at the context switch.
    SchedSwitch,
    /// CUDA/NCCL entry points.
    Uprobe,
}

/// Whether a program (or one attach point of it) is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachState {
    Attached,
    /// A better attach mode was refused; `detail` says why.
    Fallback,
    Failed,
}

/// Which kind of library call a uprobe counts: the BPF side's `enum call_kind` (intf.h), its
/// values taken from the skeleton the build generates from BTF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum CallKind {
    Launch = RawCallKind::CALL_LAUNCH.0,
    Sync = RawCallKind::CALL_SYNC.0,
    Nccl = RawCallKind::CALL_NCCL.0,
}

/// The library entry points probed, by the library file they live in.
pub const CUDA_DRIVER_CALLS: [(&str, CallKind); 5] = [
    ("cuLaunchKernel", CallKind::Launch),
    ("cuLaunchKernel_ptsz", CallKind::Launch),
    ("cuStreamSynchronize", CallKind::Sync),
    ("cuCtxSynchronize", CallKind::Sync),
    ("cuEventSynchronize", CallKind::Sync),
];
pub const CUDA_RUNTIME_CALLS: [(&str, CallKind); 3] = [
    ("cudaDeviceSynchronize", CallKind::Sync),
    ("cudaStreamSynchronize", CallKind::Sync),
    ("cudaEventSynchronize", CallKind::Sync),
];
pub const NCCL_CALLS: [(&str, CallKind); 5] = [
    ("ncclAllReduce", CallKind::Nccl),
    ("ncclAllGather", CallKind::Nccl),
    ("ncclReduceScatter", CallKind::Nccl),
    ("ncclBroadcast", CallKind::Nccl),
    ("ncclGroupEnd", CallKind::Nccl),
];

/// The calls to probe in a library, from its file name; empty for other libraries.
pub fn calls_of_library(path: &Path) -> &'static [(&'static str, CallKind)] {
    let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
    if file.starts_with("libcuda.so") {
        &CUDA_DRIVER_CALLS
    } else if file.starts_with("libcudart.so") {
        &CUDA_RUNTIME_CALLS
    } else if file.starts_with("libnccl.so") {
        &NCCL_CALLS
    } else {
        &[]
    }
}

/// A probed function found in a library: where its code starts in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryPoint {
    pub function: &'static str,
    pub kind: CallKind,
    pub offset: u64,
}

pub use elf::{ElfError, MAX_SECTION_HEADER_BYTES, MAX_SYMBOL_BYTES};

/// The probed functions (by [`calls_of_library`] of its name) that a library file of `size`
/// bytes defines, read with bounded positioned reads (the `elf` module).
pub fn library_entry_points(file: &std::fs::File, size: u64, library: &Path) -> Result<Vec<EntryPoint>, ElfError> {
    let calls = calls_of_library(library);
    let names: Vec<&str> = calls.iter().map(|(f, _)| *f).collect();
    let found = elf::function_offsets(file, size, &names)?;
    Ok(found.into_iter().map(|(i, offset)| EntryPoint { function: calls[i].0, kind: calls[i].1, offset }).collect())
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("no permission to load BPF programs ({0}): run as root, or grant CAP_BPF and CAP_PERFMON")]
    PermissionDenied(String),
    #[error("BPF programs could not be {stage}: {detail}")]
    Failed { stage: &'static str, detail: String },
}

fn failed(stage: &'static str) -> impl Fn(libbpf_rs::Error) -> ProbeError {
    move |e| {
        if e.kind() == libbpf_rs::ErrorKind::PermissionDenied {
            ProbeError::PermissionDenied(format!("{stage}: {e}"))
        } else {
            ProbeError::Failed { stage, detail: format!("{e:#}") }
        }
    }
}

/// The scheduling and lifecycle programs of one attach mode: (tracepoint, program suffix).
const SCHED_POINTS: [(&str, &str); 6] = [
    ("sched_wakeup", "wakeup"),
    ("sched_wakeup_new", "wakeup_new"),
    ("sched_switch", "switch"),
    ("sched_process_fork", "fork"),
    ("sched_process_exec", "exec"),
    ("sched_process_exit", "exit"),
];

/// Syscall tracepoints of tracked processes: (tracepoint, program).
const SYSCALL_POINTS: [(&str, &str); 16] = [
    ("sys_enter_futex", "sys_enter_futex"),
    ("sys_enter_read", "sys_enter_read"),
    ("sys_enter_pread64", "sys_enter_read"),
    ("sys_enter_readv", "sys_enter_read"),
    ("sys_enter_preadv", "sys_enter_read"),
    ("sys_enter_recvfrom", "sys_enter_read"),
    ("sys_enter_recvmsg", "sys_enter_read"),
    ("sys_enter_ioctl", "sys_enter_ioctl"),
    ("sys_exit_futex", "sys_exit_any"),
    ("sys_exit_read", "sys_exit_any"),
    ("sys_exit_pread64", "sys_exit_any"),
    ("sys_exit_readv", "sys_exit_any"),
    ("sys_exit_preadv", "sys_exit_any"),
    ("sys_exit_recvfrom", "sys_exit_any"),
    ("sys_exit_recvmsg", "sys_exit_any"),
    ("sys_exit_ioctl", "sys_exit_any"),
];

/// Events kept between two [`SchedProbe::drain_events`] calls; beyond it they are counted lost.
const MAX_QUEUED_EVENTS: usize = 1 << 18;

#[derive(Default)]
struct EventQueue {
    events: Vec<Event>,
    overflow: u64,
}

/// Losses: what could not be recorded (cumulative).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lost {
    pub events: u64,
    pub runq_samples: u64,
    pub threads: u64,
    pub ml_threads: u64,
}

/// The loaded, attached probe; everything is detached when it is dropped.
pub struct SchedProbe {
    skel: skel::SchedSkel<'static>,
    mode: AttachMode,
    links: Vec<Link>,
    programs: Vec<ProgramStatus>,
    rings: RingBuffer<'static>,
    queue: Arc<Mutex<EventQueue>>,
    /// Uprobe links per process, with the libraries they are on.
    uprobes: HashMap<u32, Vec<(PathBuf, Vec<Link>)>>,
    /// Where detached uprobe links go to be dropped (see [`SchedProbe::detach_process`]).
    reaper: Option<std::sync::mpsc::Sender<Vec<Link>>>,
}

fn decode_event(bytes: &[u8]) -> Option<Event> {
    if bytes.len() < std::mem::size_of::<RawEvent>() {
        return None;
    }
    // SAFETY: records on both ring buffers are `struct event`, whose Rust twin the skeleton
    // generated from the same BTF; the length was checked and the read is unaligned-safe.
    let raw: RawEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    // The kinds are `enum event_kind` of intf.h, as the skeleton generated them from BTF.
    let kind = match raw.kind {
        RawEventKind::EVENT_FORK => EventKind::Fork { parent_tgid: raw.parent_tgid, inherited: raw.value != 0 },
        RawEventKind::EVENT_EXEC => EventKind::Exec,
        RawEventKind::EVENT_EXIT => EventKind::Exit,
        RawEventKind::EVENT_RUNQ => EventKind::RunqWait { ns: raw.value },
        _ => return None,
    };
    let comm: Vec<u8> = raw.comm.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    Some(Event { kind, tid: raw.tid, tgid: raw.tgid, at_ns: raw.at_ns, comm: String::from_utf8_lossy(&comm).into() })
}

/// Where libbpf finds tracepoint ids; mounted if missing (root only), since the classic and
/// syscall tracepoints need it.
fn ensure_tracefs() {
    let mounted = |p: &str| Path::new(p).join("events").is_dir();
    if mounted("/sys/kernel/tracing") || mounted("/sys/kernel/debug/tracing") {
        return;
    }
    let _ = std::process::Command::new("mount")
        .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
        .stderr(std::process::Stdio::null())
        .status();
}

impl SchedProbe {
    /// Loads and attaches in the best mode the kernel accepts.
    pub fn load() -> Result<SchedProbe, ProbeError> {
        Self::load_with(&AttachMode::ALL)
    }

    /// Loads and attaches, trying the given modes in order (tests force a fallback mode).
    pub fn load_with(modes: &[AttachMode]) -> Result<SchedProbe, ProbeError> {
        Self::load_with_options(modes, false)
    }

    /// `syscall_tracepoints`: count every futex/read/ioctl call of tracked processes with the
    /// syscall tracepoints, rather than the waits they block in (seen at context switches).
    /// Exact, but any enabled syscall tracepoint sends every task on the node through the slow
    /// syscall path (see `docs/performance.md`).
    pub fn load_with_options(modes: &[AttachMode], syscall_tracepoints: bool) -> Result<SchedProbe, ProbeError> {
        ensure_tracefs();
        let mut refused: Vec<(AttachMode, String)> = Vec::new();
        let mut last = None;
        for &mode in modes {
            match Self::try_mode(mode, &refused, syscall_tracepoints) {
                Ok(probe) => return Ok(probe),
                Err(e @ ProbeError::PermissionDenied(_)) => return Err(e),
                Err(e) => {
                    refused.push((mode, e.to_string()));
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or(ProbeError::Failed { stage: "loaded", detail: "no attach mode was tried".into() }))
    }

    fn try_mode(
        mode: AttachMode,
        refused: &[(AttachMode, String)],
        syscall_tracepoints: bool,
    ) -> Result<SchedProbe, ProbeError> {
        // The skeleton borrows its object storage for as long as it lives; a probe lives for
        // the daemon's run, so the few bytes are leaked deliberately (once per attempt).
        let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = skel::SchedSkelBuilder::default().open(storage).map_err(failed("opened"))?;
        let prefixes = ["btf_", "raw_", "tp_"];
        for mut prog in open.open_object_mut().progs_mut() {
            let name = prog.name().to_string_lossy().into_owned();
            let other_mode = prefixes.iter().any(|p| name.starts_with(p)) && !name.starts_with(mode.prefix());
            prog.set_autoload(!other_mode);
        }
        if let Some(bss) = open.maps.bss_data.as_deref_mut() {
            bss.syscall_tracepoints = syscall_tracepoints;
        }
        let skel = open.load().map_err(failed("loaded"))?;

        let mut links = Vec::new();
        let mut programs = Vec::new();
        let find = |name: &str| skel.object().progs_mut().find(|p| p.name().to_str() == Some(name));
        for (point, suffix) in SCHED_POINTS {
            let name = format!("{}{suffix}", mode.prefix());
            let prog = find(&name).ok_or_else(|| ProbeError::Failed { stage: "found", detail: name.clone() })?;
            let link = match mode {
                AttachMode::Tracepoint => prog.attach_tracepoint(TracepointCategory::Sched, point),
                _ => prog.attach(),
            };
            links.push(link.map_err(failed("attached"))?);
            let better: Vec<String> = refused.iter().map(|(m, why)| format!("{}: {why}", m.as_str())).collect();
            programs.push(ProgramStatus {
                name: point.into(),
                attach: Attachment::Mode(mode),
                state: if refused.is_empty() { AttachState::Attached } else { AttachState::Fallback },
                detail: (!better.is_empty()).then(|| better.join("; ")),
            });
        }
        // Syscall accounting is worth having but not worth failing for.
        if syscall_tracepoints {
            for (point, prog_name) in SYSCALL_POINTS {
                let attached = find(prog_name).ok_or_else(|| format!("program {prog_name} missing")).and_then(|p| {
                    p.attach_tracepoint(TracepointCategory::Syscalls, point).map_err(|e| format!("{e:#}"))
                });
                let (state, detail) = match attached {
                    Ok(link) => {
                        links.push(link);
                        (AttachState::Attached, None)
                    }
                    Err(why) => (AttachState::Failed, Some(why)),
                };
                programs.push(ProgramStatus {
                    name: point.into(),
                    attach: Attachment::Mode(AttachMode::Tracepoint),
                    state,
                    detail,
                });
            }
        } else {
            let (state, detail) = match mode {
                AttachMode::TpBtf => (AttachState::Attached, None),
                _ => {
                    (AttachState::Failed, Some(format!("needs tp_btf (task registers); attached as {}", mode.as_str())))
                }
            };
            programs.push(ProgramStatus {
                name: "syscall waits (futex, read, NVIDIA ioctl)".into(),
                attach: Attachment::SchedSwitch,
                state,
                detail,
            });
        }
        let queue = Arc::new(Mutex::new(EventQueue::default()));
        let mut builder = RingBufferBuilder::new();
        for map in [&skel.maps.events, &skel.maps.runq_events] {
            let queue = queue.clone();
            builder
                .add(map, move |bytes: &[u8]| {
                    if let (Some(event), Ok(mut q)) = (decode_event(bytes), queue.lock()) {
                        if q.events.len() < MAX_QUEUED_EVENTS {
                            q.events.push(event);
                        } else {
                            q.overflow += 1;
                        }
                    }
                    0
                })
                .map_err(failed("attached"))?;
        }
        let rings = builder.build().map_err(failed("attached"))?;
        Ok(SchedProbe { skel, mode, links, programs, rings, queue, uprobes: HashMap::new(), reaper: None })
    }

    /// The mode the scheduling programs are attached in.
    pub fn mode(&self) -> AttachMode {
        self.mode
    }

    /// Every program and attach point with its state, the CUDA/NCCL uprobes summed up in one line
    /// (each process's libraries are listed with the process).
    pub fn programs(&self) -> Vec<ProgramStatus> {
        let mut all = self.programs.clone();
        // One line for every CUDA/NCCL uprobe, however many processes are probed.
        if !self.uprobes.is_empty() {
            let libraries: usize = self.uprobes.values().map(Vec::len).sum();
            let probes: usize = self.uprobes.values().flatten().map(|(_, links)| links.len()).sum();
            all.push(ProgramStatus {
                name: "on_call".into(),
                attach: Attachment::Uprobe,
                state: AttachState::Attached,
                detail: Some(format!(
                    "{probes} probes on {libraries} CUDA/NCCL libraries in {} processes",
                    self.uprobes.len()
                )),
            });
        }
        all
    }

    /// How many links are attached (sched, syscall and uprobes).
    pub fn link_count(&self) -> usize {
        self.links.len() + self.uprobes.values().flatten().map(|(_, l)| l.len()).sum::<usize>()
    }

    fn decode(tid: u32, bytes: &[u8]) -> Option<ThreadStats> {
        if bytes.len() < std::mem::size_of::<RawThreadStats>() {
            return None;
        }
        // SAFETY: the map's value type is `struct thread_stats`, whose Rust twin the skeleton
        // generated from the same BTF; the length was checked and the read is unaligned-safe.
        let raw: RawThreadStats = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        Some(ThreadStats {
            tid,
            tgid: raw.tgid,
            on_cpu_ns: raw.on_cpu_ns,
            runq_wait_ns: raw.runq_wait_ns,
            voluntary: raw.voluntary,
            involuntary: raw.involuntary,
            iowait_ns: raw.iowait_ns,
            on_cpu_since_ns: raw.last_in_ns,
            runnable_since_ns: raw.runnable_since_ns,
            io_since_ns: raw.io_since_ns,
            blocked: (raw.blocked_kind.0, raw.blocked_since_ns),
        })
    }

    /// One thread's counters, if the probe has seen it.
    pub fn thread(&self, tid: u32) -> Option<ThreadStats> {
        let bytes = self.skel.maps.threads.lookup(&tid.to_ne_bytes(), MapFlags::ANY).ok()??;
        Self::decode(tid, &bytes)
    }

    /// Every thread the probe holds counters for.
    pub fn threads(&self) -> Vec<ThreadStats> {
        let map = &self.skel.maps.threads;
        map.keys()
            .filter_map(|key| {
                let tid = u32::from_ne_bytes(key.as_slice().try_into().ok()?);
                let bytes = map.lookup(&key, MapFlags::ANY).ok()??;
                Self::decode(tid, &bytes)
            })
            .collect()
    }

    /// How many threads the probe holds counters for (cheaper than [`SchedProbe::threads`]).
    pub fn thread_count(&self) -> usize {
        self.skel.maps.threads.keys().count()
    }

    /// One tracked thread's call and syscall counters, if it made any.
    pub fn ml_thread(&self, tid: u32) -> Option<MlThreadStats> {
        let bytes = self.skel.maps.ml_threads.lookup(&tid.to_ne_bytes(), MapFlags::ANY).ok()??;
        if bytes.len() < std::mem::size_of::<RawMlThreadStats>() {
            return None;
        }
        // SAFETY: as in `decode`, for `struct ml_thread_stats`.
        let raw: RawMlThreadStats = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        Some(MlThreadStats {
            tid,
            tgid: raw.tgid,
            futex_wait_ns: raw.futex_wait_ns,
            futex_waits: raw.futex_waits,
            read_ns: raw.read_ns,
            reads: raw.reads,
            read_bytes: raw.read_bytes,
            nv_ioctl_ns: raw.nv_ioctl_ns,
            nv_ioctls: raw.nv_ioctls,
            launches: raw.launches,
            sync_ns: raw.sync_ns,
            syncs: raw.syncs,
            nccl_ns: raw.nccl_ns,
            nccl_calls: raw.nccl_calls,
            sys_in_progress: (raw.sys_kind.0, raw.sys_since_ns),
            call_in_progress: if raw.call_depth > 0 { (raw.call_kind.0, raw.call_since_ns) } else { (0, 0) },
            last_enqueue: raw.last_enqueue.0,
        })
    }

    /// Thread ids with call/syscall counters.
    pub fn ml_thread_ids(&self) -> Vec<u32> {
        self.skel
            .maps
            .ml_threads
            .keys()
            .filter_map(|k| Some(u32::from_ne_bytes(k.as_slice().try_into().ok()?)))
            .collect()
    }

    /// Marks a process as tracked, as part of the ML job led by `job` (its own pid for a
    /// job's main process). Its future children are tracked from birth by the BPF side.
    pub fn track(&mut self, tgid: u32, job: u32) -> Result<(), ProbeError> {
        let known = self.skel.maps.tracked.lookup(&tgid.to_ne_bytes(), MapFlags::ANY).ok().flatten();
        if known.as_deref() == Some(&job.to_ne_bytes()[..]) {
            return Ok(());
        }
        self.skel
            .maps
            .tracked
            .update(&tgid.to_ne_bytes(), &job.to_ne_bytes(), MapFlags::ANY)
            .map_err(failed("updated"))?;
        self.tracked_changed();
        Ok(())
    }

    pub fn untrack(&mut self, tgid: u32) {
        if self.skel.maps.tracked.delete(&tgid.to_ne_bytes()).is_ok() {
            self.tracked_changed();
        }
    }

    /// Tells the BPF side to re-read the `tracked` flags it caches per thread.
    fn tracked_changed(&mut self) {
        if let Some(data) = self.skel.maps.data_data.as_deref_mut() {
            // SAFETY: the field lives in the object's mmapped .data for the skeleton's life; the
            // BPF side increments it atomically too, so user space must as well.
            let generation = unsafe { &*(&mut data.tracked_generation as *mut u32 as *const AtomicU32) };
            generation.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Tracked processes: (tgid, job).
    pub fn tracked(&self) -> Vec<(u32, u32)> {
        let map = &self.skel.maps.tracked;
        map.keys()
            .filter_map(|key| {
                let value = map.lookup(&key, MapFlags::ANY).ok()??;
                Some((
                    u32::from_ne_bytes(key.as_slice().try_into().ok()?),
                    u32::from_ne_bytes(value.as_slice().try_into().ok()?),
                ))
            })
            .collect()
    }

    /// Everything on the ring buffers since the last call, oldest first per buffer.
    pub fn drain_events(&mut self) -> Vec<Event> {
        let _ = self.rings.consume();
        match self.queue.lock() {
            Ok(mut q) => std::mem::take(&mut q.events),
            Err(_) => Vec::new(),
        }
    }

    /// What could not be recorded so far.
    pub fn lost(&self) -> Lost {
        let mut sums = [0u64; 4];
        for (kind, sum) in sums.iter_mut().enumerate() {
            let key = (kind as u32).to_ne_bytes();
            if let Ok(Some(per_cpu)) = self.skel.maps.lost.lookup_percpu(&key, MapFlags::ANY) {
                *sum = per_cpu.iter().filter_map(|v| Some(u64::from_ne_bytes(v.as_slice().try_into().ok()?))).sum();
            }
        }
        let overflow = self.queue.lock().map(|q| q.overflow).unwrap_or(0);
        Lost { events: sums[0] + overflow, runq_samples: sums[1], threads: sums[2], ml_threads: sums[3] }
    }

    /// Attaches the CUDA/NCCL call probes to a library that process `pid` maps, for that
    /// process only: `library` is its path as `/proc/<pid>/maps` shows it (a name, never opened
    /// here), `file` the mapped file itself, already opened and checked by the caller, and
    /// `entries` what [`library_entry_points`] found in it. The probes are attached through
    /// `/proc/self/fd/N`, so the path is not looked up again (it may have been replaced).
    /// Returns how many entry points were probed; a library already probed for that process is
    /// left as it is.
    pub fn attach_library(
        &mut self,
        pid: u32,
        library: &Path,
        file: &std::fs::File,
        entries: &[EntryPoint],
    ) -> Result<usize, String> {
        use std::os::fd::AsRawFd;
        if entries.is_empty() {
            return Err(format!("{} defines none of the probed functions", library.display()));
        }
        if self.uprobes.get(&pid).is_some_and(|libs| libs.iter().any(|(l, _)| l == library)) {
            return Ok(0);
        }
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let entry = self.skel.object().progs_mut().find(|p| p.name().to_str() == Some("on_call"));
        let exit = self.skel.object().progs_mut().find(|p| p.name().to_str() == Some("on_call_return"));
        let (Some(entry), Some(exit)) = (entry, exit) else { return Err("uprobe programs missing".into()) };
        let mut links = Vec::new();
        let mut errors = Vec::new();
        let mut found = 0;
        for point in entries {
            let opts = |retprobe| UprobeOpts { cookie: point.kind as u64, retprobe, ..UprobeOpts::default() };
            let offset = usize::try_from(point.offset).map_err(|_| "entry point offset out of range".to_string())?;
            match entry.attach_uprobe_with_opts(pid as i32, &path, offset, opts(false)) {
                Ok(link) => {
                    links.push(link);
                    found += 1;
                }
                Err(e) => {
                    errors.push(format!("{}: {e}", point.function));
                    continue;
                }
            }
            if point.kind != CallKind::Launch {
                match exit.attach_uprobe_with_opts(pid as i32, &path, offset, opts(true)) {
                    Ok(link) => links.push(link),
                    Err(e) => errors.push(format!("{} (return): {e}", point.function)),
                }
            }
        }
        if links.is_empty() {
            return Err(format!("no probe attached to {}: {}", library.display(), errors.join("; ")));
        }
        self.uprobes.entry(pid).or_default().push((library.to_path_buf(), links));
        Ok(found)
    }

    /// Libraries probed in a process.
    pub fn probed_libraries(&self, pid: u32) -> Vec<PathBuf> {
        self.uprobes.get(&pid).map(|libs| libs.iter().map(|(l, _)| l.clone()).collect()).unwrap_or_default()
    }

    /// Drops a process's uprobes (when it has exited). The kernel takes its time unregistering
    /// a uprobe (an RCU grace period each: over a second for a probed CUDA library), so the
    /// links are dropped on a thread of their own, never on the caller's.
    pub fn detach_process(&mut self, pid: u32) {
        let Some(libraries) = self.uprobes.remove(&pid) else { return };
        let links: Vec<Link> = libraries.into_iter().flat_map(|(_, links)| links).collect();
        if links.is_empty() {
            return;
        }
        if self.reaper.is_none() {
            let (tx, rx) = std::sync::mpsc::channel::<Vec<Link>>();
            let spawned = std::thread::Builder::new().name("uprobe-detach".into()).spawn(move || {
                for links in rx {
                    drop(links);
                }
            });
            if spawned.is_ok() {
                self.reaper = Some(tx);
            }
        }
        if let Some(Err(std::sync::mpsc::SendError(links))) = self.reaper.as_ref().map(|r| r.send(links)) {
            // No thread to hand them to: dropped here, slowly, rather than kept attached.
            drop(links);
        }
    }

    /// Processes with uprobes attached.
    pub fn probed_processes(&self) -> Vec<u32> {
        self.uprobes.keys().copied().collect()
    }

    /// Invocations the kernel skipped, per program name (it does when a program would run
    /// nested inside another on the same CPU); only programs with skips are listed.
    pub fn skipped_runs(&self) -> Vec<(String, u64)> {
        let ours: HashMap<u32, String> = self
            .skel
            .object()
            .progs()
            .filter_map(|p| {
                use std::os::fd::{AsFd, AsRawFd};
                // The kernel's id of the program behind our fd, from /proc/self/fdinfo.
                let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", p.as_fd().as_raw_fd())).ok()?;
                let id = info.lines().find_map(|l| l.strip_prefix("prog_id:"))?.trim().parse().ok()?;
                Some((id, p.name().to_string_lossy().into_owned()))
            })
            .collect();
        libbpf_rs::query::ProgInfoIter::default()
            .filter(|info| info.recursion_misses > 0)
            .filter_map(|info| Some((ours.get(&info.id)?.clone(), info.recursion_misses)))
            .collect()
    }

    /// Deletes entries of threads that no longer exist (a safety net: the exit program deletes
    /// them, but the classic tracepoint mode cannot tell an exiting thread from a live one).
    /// Returns how many were removed.
    pub fn sweep(&self, alive: impl Fn(u32) -> bool) -> usize {
        let mut removed = 0;
        for map in [&self.skel.maps.threads, &self.skel.maps.ml_threads] {
            let dead: Vec<Vec<u8>> = map
                .keys()
                .filter(|k| k.as_slice().try_into().map(u32::from_ne_bytes).is_ok_and(|tid| !alive(tid)))
                .collect();
            for key in dead {
                if map.delete(&key).is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }
}
