//! Ringside's BPF programs and a safe API over them.
//!
//! `sched.bpf.c` keeps per-thread scheduling counters (on-CPU time, run-queue wait, voluntary
//! and involuntary switches) in a hash map keyed by thread id, from the `sched_switch`,
//! `sched_wakeup(_new)` and `sched_process_exit` tracepoints (tp_btf). [`SchedProbe`] loads and
//! attaches them and reads the map.
//!
//! Architecture invariant: BPF owns the fast path (counting), userspace owns policy; this crate
//! depends on nothing of ours.

use std::mem::MaybeUninit;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, OpenObject};

mod skel {
    #![allow(clippy::all, non_camel_case_types, non_snake_case, dead_code, unused_imports)]
    include!(concat!(env!("OUT_DIR"), "/sched.skel.rs"));
}

/// Per-thread counters, as the BPF side keeps them (`struct thread_stats` in `intf.h`).
pub use skel::types::thread_stats as RawThreadStats;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ThreadStats {
    pub tid: u32,
    pub tgid: u32,
    pub on_cpu_ns: u64,
    pub runq_wait_ns: u64,
    pub voluntary: u64,
    pub involuntary: u64,
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

/// The loaded, attached scheduling probe; detached when dropped.
pub struct SchedProbe {
    skel: skel::SchedSkel<'static>,
}

impl SchedProbe {
    pub fn load() -> Result<SchedProbe, ProbeError> {
        // The skeleton borrows its object storage for as long as it lives; the probe lives
        // for the daemon's run, so the few bytes are leaked deliberately.
        let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
        let open = skel::SchedSkelBuilder::default().open(storage).map_err(failed("opened"))?;
        let mut skel = open.load().map_err(failed("loaded"))?;
        skel.attach().map_err(failed("attached"))?;
        Ok(SchedProbe { skel })
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
}
