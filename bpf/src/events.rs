//! Lifecycle events (fork, exec, exit) and run-queue samples from the probe's ring buffers.

use crate::skel::types::{event as RawEvent, event_kind as RawEventKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A new process. `inherited`: it was tracked from birth, as a child of a tracked process.
    Fork {
        parent_tgid: u32,
        inherited: bool,
    },
    Exec,
    /// A process's leader exited, with its exit status as `wait` reports it (a signal number
    /// in the low 7 bits, else the exit code in bits 8-15), where the attach mode can read it.
    Exit {
        status: Option<i32>,
    },
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

/// Events kept between two [`SchedProbe::drain_events`] calls; beyond it they are counted lost.
pub(crate) const MAX_QUEUED_EVENTS: usize = 1 << 18;

#[derive(Default)]
pub(crate) struct EventQueue {
    pub(crate) events: Vec<Event>,
    pub(crate) overflow: u64,
}

pub(crate) fn decode_event(bytes: &[u8]) -> Option<Event> {
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
        RawEventKind::EVENT_EXIT => {
            EventKind::Exit { status: (raw.value >> 32 != 0).then_some(raw.value as u32 as i32) }
        }
        RawEventKind::EVENT_RUNQ => EventKind::RunqWait { ns: raw.value },
        _ => return None,
    };
    let comm: Vec<u8> = raw.comm.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    Some(Event { kind, tid: raw.tid, tgid: raw.tgid, at_ns: raw.at_ns, comm: String::from_utf8_lossy(&comm).into() })
}
