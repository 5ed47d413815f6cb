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
//! In parts: [`stats`] (per-thread counters and the intervals in progress), [`events`]
//! (lifecycle events and run-queue samples), [`calls`] (the CUDA/NCCL entry points the uprobes
//! count), [`attach`] (attach modes, tracepoints, program states), `elf` (bounded reads of a
//! library's symbols), [`scx`] (the sched_ext scheduler); the C side's enums and structs
//! (`intf.h`) reach Rust through the skeleton libbpf-cargo generates from BTF at build time.
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
mod placement;
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

use skel::types::gpu_text as RawGpuText;
use skel::types::ml_thread_stats as RawMlThreadStats;
/// Per-thread counters, as the BPF side keeps them (`struct thread_stats` in `intf.h`).
pub use skel::types::thread_stats as RawThreadStats;

pub mod attach;
pub mod calls;
pub mod events;
pub mod stats;

pub use attach::{AttachMode, AttachState, Attachment, ProgramStatus};
pub use calls::{
    calls_of_library, is_probed_library, library_entry_points, library_exports, CallKind, EntryPoint, GpuLibrary,
    Operation, Probes, CUDA_DRIVER_OPERATIONS, NCCL_CALLS, NCCL_NOT_PROBED, NCCL_NOT_PROBED_PREFIXES,
};
pub use elf::{ElfError, MAX_SECTION_HEADER_BYTES, MAX_SYMBOL_BYTES};
pub use events::{Event, EventKind};
pub use stats::{monotonic_ns, MlThreadStats, ThreadStats};

use attach::{ensure_tracefs, SCHED_POINTS, SYSCALL_POINTS};
use events::{decode_event, EventQueue, MAX_QUEUED_EVENTS};

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("no permission to load BPF programs ({0}): run as root, or grant CAP_BPF and CAP_PERFMON")]
    PermissionDenied(String),
    #[error("BPF programs could not be {stage}: {detail}")]
    Failed { stage: &'static str, detail: String },
}

/// Whether an attach failed for want of kernel support (no `uprobe_multi` before 6.6), rather
/// than for this file or for want of descriptors.
fn unsupported(e: &libbpf_rs::Error) -> bool {
    matches!(e.kind(), libbpf_rs::ErrorKind::Unsupported | libbpf_rs::ErrorKind::InvalidInput)
        || matches!(e.kind(), libbpf_rs::ErrorKind::Other) && format!("{e:#}").contains("not supported")
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

/// Losses: what could not be recorded (cumulative).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lost {
    pub events: u64,
    pub runq_samples: u64,
    pub threads: u64,
    pub ml_threads: u64,
}

/// The GPU driver and runtime code ranges one process may have, at most (`MAX_TEXT_RANGES`).
pub const MAX_TEXT_RANGES: usize = 8;

/// A library file, by device and inode: what a uprobe is attached to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    pub fn of(file: &std::fs::File) -> std::io::Result<FileId> {
        use std::os::unix::fs::MetadataExt;
        let meta = file.metadata()?;
        Ok(FileId { dev: meta.dev(), ino: meta.ino() })
    }
}

/// The probes on one library file, attached once for every process that maps it
/// (`uprobe_multi`): two links (entries, returns) however many processes use it.
struct FileProbes {
    /// The name a process first mapped it by.
    path: PathBuf,
    links: Vec<Link>,
    entry_points: usize,
    /// The tracked processes it was attached for; detached when the last one is gone.
    users: std::collections::HashSet<u32>,
}

/// How a library's probes were attached for a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attached {
    /// Once for the library file, for every process mapping it (`uprobe_multi`); `new` when
    /// this call attached them (else another process had already).
    File { entry_points: usize, new: bool },
    /// For this process only, a link per probe (kernels without `uprobe_multi`).
    Process { entry_points: usize },
}

impl Attached {
    pub fn entry_points(self) -> usize {
        match self {
            Attached::File { entry_points, .. } | Attached::Process { entry_points } => entry_points,
        }
    }
}

/// The loaded, attached probe; everything is detached when it is dropped.
pub struct SchedProbe {
    skel: skel::SchedSkel<'static>,
    mode: AttachMode,
    probes: Probes,
    links: Vec<Link>,
    programs: Vec<ProgramStatus>,
    rings: RingBuffer<'static>,
    queue: Arc<Mutex<EventQueue>>,
    /// Uprobe links by library file, for every process mapping it.
    files: HashMap<FileId, FileProbes>,
    /// The library files probed for each process, by the name the process maps them by.
    file_users: HashMap<u32, Vec<(PathBuf, FileId)>>,
    /// Why attaching once per file does not work here, once it has failed for want of kernel
    /// support: every library is then probed per process.
    no_multi: Option<String>,
    /// Uprobe links per process (the fallback), with the libraries they are on.
    uprobes: HashMap<u32, Vec<(PathBuf, Vec<Link>)>>,
    /// Where detached uprobe links go to be dropped (see [`SchedProbe::detach_process`]).
    reaper: Option<std::sync::mpsc::Sender<Vec<Link>>>,
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
        Self::load_with_probes(modes, syscall_tracepoints, Probes::default())
    }

    /// As [`SchedProbe::load_with_options`], with the library calls to probe.
    pub fn load_with_probes(
        modes: &[AttachMode],
        syscall_tracepoints: bool,
        probes: Probes,
    ) -> Result<SchedProbe, ProbeError> {
        ensure_tracefs();
        let mut refused: Vec<(AttachMode, String)> = Vec::new();
        let mut last = None;
        for &mode in modes {
            match Self::try_mode(mode, &refused, syscall_tracepoints, probes) {
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
        probes: Probes,
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
        // Where tracked threads spend their CPU time (the GPU driver's code or their own),
        // sampled at timer ticks: worth having, not worth failing for.
        let ticks = match mode {
            AttachMode::TpBtf => match find("btf_tick").map(|p| p.attach()) {
                Some(Ok(link)) => {
                    links.push(link);
                    (AttachState::Attached, None)
                }
                Some(Err(e)) => (AttachState::Failed, Some(format!("{e:#}"))),
                None => (AttachState::Failed, Some("program btf_tick missing".into())),
            },
            _ => (AttachState::Failed, Some(format!("needs tp_btf (task registers); attached as {}", mode.as_str()))),
        };
        programs.push(ProgramStatus {
            name: "hrtimer_expire_entry (driver time)".into(),
            attach: Attachment::Mode(AttachMode::TpBtf),
            state: ticks.0,
            detail: ticks.1,
        });
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
        Ok(SchedProbe {
            skel,
            mode,
            probes,
            links,
            programs,
            rings,
            queue,
            files: HashMap::new(),
            file_users: HashMap::new(),
            no_multi: None,
            uprobes: HashMap::new(),
            reaper: None,
        })
    }

    /// Which library calls are probed.
    pub fn probes(&self) -> Probes {
        self.probes
    }

    /// The mode the scheduling programs are attached in.
    pub fn mode(&self) -> AttachMode {
        self.mode
    }

    /// Every program and attach point with its state, the CUDA/NCCL uprobes summed up in one line
    /// (each process's libraries are listed with the process).
    pub fn programs(&self) -> Vec<ProgramStatus> {
        let mut all = self.programs.clone();
        // One line for the CUDA/NCCL uprobes of each way they are attached, however many
        // processes are probed.
        if !self.files.is_empty() {
            let entry_points: usize = self.files.values().map(|f| f.entry_points).sum();
            let users: std::collections::HashSet<u32> =
                self.files.values().flat_map(|f| f.users.iter().copied()).collect();
            all.push(ProgramStatus {
                name: "on_call_multi".into(),
                attach: Attachment::Uprobe,
                state: AttachState::Attached,
                detail: Some(format!(
                    "{entry_points} entry points on {} CUDA/NCCL library files, once for every process mapping them \
                     ({} tracked), {} links",
                    self.files.len(),
                    users.len(),
                    self.files.values().map(|f| f.links.len()).sum::<usize>()
                )),
            });
        }
        if !self.uprobes.is_empty() {
            let libraries: usize = self.uprobes.values().map(Vec::len).sum();
            let probes: usize = self.uprobes.values().flatten().map(|(_, links)| links.len()).sum();
            let why = self.no_multi.as_deref().map(|w| format!(" (per process: {w})")).unwrap_or_default();
            all.push(ProgramStatus {
                name: "on_call".into(),
                attach: Attachment::Uprobe,
                state: if self.no_multi.is_some() { AttachState::Fallback } else { AttachState::Attached },
                detail: Some(format!(
                    "{probes} probes on {libraries} CUDA/NCCL libraries in {} processes{why}",
                    self.uprobes.len()
                )),
            });
        }
        all
    }

    /// How many links are attached (sched, syscall and uprobes): a descriptor each.
    pub fn link_count(&self) -> usize {
        self.links.len()
            + self.files.values().map(|f| f.links.len()).sum::<usize>()
            + self.uprobes.values().flatten().map(|(_, l)| l.len()).sum::<usize>()
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

    /// How many threads the probe can hold counters for (its `threads` map's size).
    pub fn threads_capacity(&self) -> usize {
        self.skel.maps.threads.max_entries() as usize
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
            copies: raw.copies,
            nccl_ns: raw.nccl_ns,
            nccl_calls: raw.nccl_calls,
            samples: raw.samples,
            driver_samples: raw.driver_samples,
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
        let _ = self.skel.maps.gpu_text.delete(&tgid.to_ne_bytes());
        if self.skel.maps.tracked.delete(&tgid.to_ne_bytes()).is_ok() {
            self.tracked_changed();
        }
    }

    /// Where the GPU driver's and runtime's code is mapped in a tracked process (start, end),
    /// at most [`MAX_TEXT_RANGES`] ranges (the rest are left out): a timer tick that finds one
    /// of its threads running there counts a driver sample. An empty list removes them.
    pub fn set_gpu_text(&mut self, tgid: u32, ranges: &[(u64, u64)]) -> Result<(), ProbeError> {
        let key = tgid.to_ne_bytes();
        if ranges.is_empty() {
            let _ = self.skel.maps.gpu_text.delete(&key);
            return Ok(());
        }
        let mut text = RawGpuText::default();
        for (i, (start, end)) in ranges.iter().take(MAX_TEXT_RANGES).enumerate() {
            text.start[i] = *start;
            text.end[i] = *end;
        }
        // SAFETY: `gpu_text` is plain old data (two arrays of u64) generated from the BTF of
        // the map's value type, so its bytes are the value the map expects.
        let bytes = unsafe {
            std::slice::from_raw_parts((&text as *const RawGpuText).cast::<u8>(), std::mem::size_of::<RawGpuText>())
        };
        self.skel.maps.gpu_text.update(&key, bytes, MapFlags::ANY).map_err(failed("updated"))
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

    /// Attaches the CUDA/NCCL call probes to a library that process `pid` maps: `library` is
    /// its path as `/proc/<pid>/maps` shows it (a name, never opened here), `file` the mapped
    /// file itself, already opened and checked by the caller, and `entries` what
    /// [`library_entry_points`] found in it. The probes are attached through
    /// `/proc/self/fd/N`, so the path is not looked up again (it may have been replaced).
    ///
    /// Where the kernel has `uprobe_multi` (6.6+), the file is probed once for every process
    /// that maps it, two links in all (entries and returns), and a second process mapping it
    /// costs nothing more; the BPF side ignores threads of processes that are not tracked.
    /// Elsewhere each process gets a link per probe. A library already probed for the process
    /// is left as it is.
    pub fn attach_library(
        &mut self,
        pid: u32,
        library: &Path,
        file: &std::fs::File,
        entries: &[EntryPoint],
    ) -> Result<Attached, String> {
        if entries.is_empty() {
            return Err(format!("{} defines none of the probed functions", library.display()));
        }
        let id = FileId::of(file).map_err(|e| format!("cannot stat {}: {e}", library.display()))?;
        let users = self.file_users.entry(pid).or_default();
        if users.iter().any(|(l, _)| l == library) {
            return Ok(Attached::File { entry_points: entries.len(), new: false });
        }
        if let Some(probed) = self.files.get_mut(&id) {
            probed.users.insert(pid);
            users.push((library.to_path_buf(), id));
            return Ok(Attached::File { entry_points: probed.entry_points, new: false });
        }
        if self.uprobes.get(&pid).is_some_and(|libs| libs.iter().any(|(l, _)| l == library)) {
            return Ok(Attached::Process { entry_points: 0 });
        }
        if self.no_multi.is_none() {
            match self.attach_file(file, entries) {
                Ok(links) => {
                    let mut users = std::collections::HashSet::new();
                    users.insert(pid);
                    self.files.insert(
                        id,
                        FileProbes { path: library.to_path_buf(), links, entry_points: entries.len(), users },
                    );
                    self.file_users.entry(pid).or_default().push((library.to_path_buf(), id));
                    return Ok(Attached::File { entry_points: entries.len(), new: true });
                }
                Err(e) if unsupported(&e) => self.no_multi = Some(format!("uprobe_multi: {e}")),
                Err(e) => return Err(format!("cannot probe {}: {e}", library.display())),
            }
        }
        self.attach_process(pid, library, file, entries).map(|entry_points| Attached::Process { entry_points })
    }

    /// How many links (descriptors) attaching `entries` of `library` for `pid` would add: none
    /// when the file is probed already, two for a new file with `uprobe_multi`, else one per
    /// entry point and one per return probe.
    pub fn links_needed(&self, pid: u32, library: &Path, file: &std::fs::File, entries: &[EntryPoint]) -> usize {
        let known = FileId::of(file).is_ok_and(|id| self.files.contains_key(&id));
        let own = self.uprobes.get(&pid).is_some_and(|libs| libs.iter().any(|(l, _)| l == library));
        if known || own {
            0
        } else if self.no_multi.is_none() {
            2
        } else {
            entries.len() + entries.iter().filter(|e| e.kind.timed()).count()
        }
    }

    /// Two `uprobe_multi` links on the file, for every process: the entries of every probe,
    /// and the returns of the timed ones; the attach cookie of each says its kind of call.
    fn attach_file(&self, file: &std::fs::File, entries: &[EntryPoint]) -> Result<Vec<Link>, libbpf_rs::Error> {
        use std::os::fd::AsRawFd;
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let program = |name: &str| {
            self.skel
                .object()
                .progs_mut()
                .find(|p| p.name().to_str() == Some(name))
                .ok_or_else(|| libbpf_rs::Error::from(std::io::Error::other(format!("program {name} missing"))))
        };
        let (entry, exit) = (program("on_call_multi")?, program("on_call_return_multi")?);
        let offsets = |timed_only: bool| -> (Vec<usize>, Vec<u64>) {
            entries
                .iter()
                .filter(|e| !timed_only || e.kind.timed())
                .filter_map(|e| Some((usize::try_from(e.probe_at).ok()?, e.kind as u64)))
                .unzip()
        };
        let (offsets_in, cookies_in) = offsets(false);
        let mut links = vec![entry.attach_uprobe_multi_with_opts(
            -1,
            &path,
            "",
            libbpf_rs::UprobeMultiOpts { offsets: offsets_in, cookies: cookies_in, ..Default::default() },
        )?];
        let (offsets_out, cookies_out) = offsets(true);
        if !offsets_out.is_empty() {
            links.push(exit.attach_uprobe_multi_with_opts(
                -1,
                &path,
                "",
                libbpf_rs::UprobeMultiOpts {
                    offsets: offsets_out,
                    cookies: cookies_out,
                    retprobe: true,
                    ..Default::default()
                },
            )?);
        }
        Ok(links)
    }

    /// A link per probe, for process `pid` only.
    fn attach_process(
        &mut self,
        pid: u32,
        library: &Path,
        file: &std::fs::File,
        entries: &[EntryPoint],
    ) -> Result<usize, String> {
        use std::os::fd::AsRawFd;
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let entry = self.skel.object().progs_mut().find(|p| p.name().to_str() == Some("on_call"));
        let exit = self.skel.object().progs_mut().find(|p| p.name().to_str() == Some("on_call_return"));
        let (Some(entry), Some(exit)) = (entry, exit) else { return Err("uprobe programs missing".into()) };
        let mut links = Vec::new();
        let mut errors = Vec::new();
        let mut found = 0;
        for point in entries {
            let opts = |retprobe| UprobeOpts { cookie: point.kind as u64, retprobe, ..UprobeOpts::default() };
            let offset = usize::try_from(point.probe_at).map_err(|_| "entry point offset out of range".to_string())?;
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
            if point.kind.timed() {
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

    /// Libraries probed in a process (once per file, or for it alone).
    pub fn probed_libraries(&self, pid: u32) -> Vec<PathBuf> {
        let shared = self.file_users.get(&pid).into_iter().flatten().map(|(l, _)| l.clone());
        let own = self.uprobes.get(&pid).into_iter().flatten().map(|(l, _)| l.clone());
        shared.chain(own).collect()
    }

    /// Library files probed once for every process mapping them: (name, tracked processes).
    pub fn probed_files(&self) -> Vec<(PathBuf, usize)> {
        self.files.values().map(|f| (f.path.clone(), f.users.len())).collect()
    }

    /// Forgets a process's probes (when it has exited): its own links are dropped, and a
    /// library file's when no tracked process is left using it. The kernel takes its time
    /// unregistering a uprobe (an RCU grace period each: over a second for a probed CUDA
    /// library), so the links are dropped on a thread of their own, never on the caller's.
    pub fn detach_process(&mut self, pid: u32) {
        let mut links: Vec<Link> = Vec::new();
        for (_, id) in self.file_users.remove(&pid).unwrap_or_default() {
            let unused = self.files.get_mut(&id).is_some_and(|f| {
                f.users.remove(&pid);
                f.users.is_empty()
            });
            if unused {
                links.extend(self.files.remove(&id).map(|f| f.links).unwrap_or_default());
            }
        }
        if let Some(libraries) = self.uprobes.remove(&pid) {
            links.extend(libraries.into_iter().flat_map(|(_, links)| links));
        }
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

    /// Processes with uprobes attached for them.
    pub fn probed_processes(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.file_users.keys().chain(self.uprobes.keys()).copied().collect();
        pids.sort_unstable();
        pids.dedup();
        pids
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
