//! Each window, each thread of each tracked process: its counters since the last window,
//! the evidence they make, the phase the hysteresis settles on, and the process's timeline.

use std::collections::{HashSet, VecDeque};
use std::path::Path;

use ringside_bpf::{CallKind, MlThreadStats};
use ringside_shared::{PhaseSpan, PhaseValues};

use super::super::journal::thread_start_time;
use super::super::phase::{self, Counters, Evidence, Hysteresis};
use super::{
    read_chars, read_trimmed, Observer, Task, CPU_WAIT_SHARE, MAX_SPANS, MAX_THREADS_OBSERVED, MAX_THREADS_PER_PROCESS,
    TIMELINE_MS,
};
use crate::pipeline::ThreadEvent;

/// Since when (monotonic ns) a thread has been inside an NCCL collective, or synchronizing on
/// one it enqueued; `None` when it is not.
fn collective_since(calls: &MlThreadStats) -> Option<u64> {
    let (kind, since) = calls.call_in_progress;
    let nccl = CallKind::Nccl as u32;
    let waits = kind == CallKind::Sync as u32 || kind == CallKind::Copy as u32;
    (since != 0 && (kind == nccl || (waits && calls.last_enqueue == nccl))).then_some(since)
}

/// The window being accounted: its length and its wall-clock span.
#[derive(Clone, Copy)]
struct Window {
    ns: u64,
    ms: u64,
    start_ms: u64,
    end_ms: u64,
}

/// What one process's threads added up to in a window.
#[derive(Default)]
struct ProcessWindow {
    evidence: Evidence,
    /// The longest any of its threads waited for a CPU.
    most_runq_ns: u64,
    /// The oldest of its threads inside a collective now (since when, monotonic).
    oldest_collective_ns: Option<u64>,
    /// Whether one of its collective calls returned.
    collective_returned: bool,
    /// NCCL calls its threads started, and the longest any of them spent inside one.
    nccl_calls: u64,
    most_nccl_ns: u64,
}

impl Observer {
    pub(super) fn observe(&mut self, window_ns: u64, start_ms: u64, end_ms: u64) {
        let window = Window { ns: window_ns, ms: window_ns / 1_000_000, start_ms, end_ms };
        let mut pids: Vec<u32> = self.processes.keys().copied().collect();
        // Past the window's thread budget the remaining processes wait for a later window; the
        // starting point turns so that none waits for good.
        pids.sort_unstable();
        self.windows += 1;
        let turn = (self.windows % pids.len().max(1) as u64) as usize;
        pids.rotate_left(turn);
        let mut budget = MAX_THREADS_OBSERVED;
        let mut seen_tids = HashSet::new();
        for pid in pids {
            if budget == 0 {
                // Not looked at this window: its threads are kept as they are.
                seen_tids.extend(self.tasks.iter().filter(|(_, t)| t.pid == pid).map(|(tid, _)| *tid));
                continue;
            }
            let task_dir = self.config.proc_root.join(pid.to_string()).join("task");
            let tids: Vec<u32> = std::fs::read_dir(&task_dir)
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                        .take(MAX_THREADS_PER_PROCESS.min(budget))
                        .collect()
                })
                .unwrap_or_default();
            budget -= tids.len();
            let mut sums = ProcessWindow::default();
            let now_ns = ringside_bpf::monotonic_ns();
            for &tid in &tids {
                seen_tids.insert(tid);
                self.observe_thread(pid, tid, &task_dir, window, now_ns, &mut sums);
            }
            self.close_process_window(pid, tids.len(), window, now_ns, sums);
        }
        let exited: Vec<u32> = self.tasks.keys().copied().filter(|tid| !seen_tids.contains(tid)).collect();
        for tid in exited {
            self.tasks.remove(&tid);
            self.forget_task(tid);
            self.thread_events.push(ThreadEvent::Gone { at_ms: start_ms, tid });
        }
    }

    /// One thread's counters since the last window, its evidence and its phase.
    fn observe_thread(
        &mut self,
        pid: u32,
        tid: u32,
        task_dir: &Path,
        window: Window,
        now_ns: u64,
        sums: &mut ProcessWindow,
    ) {
        let role = self.processes[&pid].role;
        let sched = self.probe.thread(tid);
        let blocked = sched.map(|s| s.blocked).unwrap_or_default();
        let calls = self.probe.ml_thread(tid);
        let in_collective = calls.as_ref().and_then(collective_since);
        if let Some(since) = in_collective {
            sums.oldest_collective_ns = Some(sums.oldest_collective_ns.map_or(since, |o: u64| o.min(since)));
        }
        let mut counters =
            Counters::from_probe(sched.map(|s| s.at(now_ns)).as_ref(), calls.map(|s| s.at(now_ns, blocked)).as_ref());
        // Bytes read, from the kernel's own per-thread I/O accounting.
        if !self.config.syscall_tracepoints {
            counters.read_bytes = read_chars(&task_dir.join(tid.to_string()).join("io"));
        }
        if !self.tasks.contains_key(&tid) {
            let task = self.new_task(pid, tid, task_dir, window);
            self.tasks.insert(tid, task);
        }
        let Some(task) = self.tasks.get_mut(&tid) else { return };
        let was_in_collective = std::mem::replace(&mut task.collective_since_ns, in_collective);
        // A thread seen for the first time has no window yet: its counters so far cover its
        // whole life.
        let Some(before) = task.before.replace(counters) else { return };
        let previous = std::mem::replace(&mut task.last, counters.since(&before));
        // Tick samples are few per window: whether it feeds the GPU is judged over this window
        // and the one before.
        let recent = Counters {
            samples: task.last.samples + previous.samples,
            driver_samples: task.last.driver_samples + previous.driver_samples,
            ..Counters::default()
        };
        task.feeding = phase::feeding(&recent, &task.last, window.ns);
        // A collective returned: the one it was in has ended, or it entered one and is out
        // again, or it entered two (the probe counts calls as they start).
        sums.collective_returned |= (was_in_collective.is_some() && was_in_collective != in_collective)
            || (task.last.nccl_calls > 0 && in_collective.is_none())
            || task.last.nccl_calls >= 2;
        sums.most_runq_ns = sums.most_runq_ns.max(task.last.runq_ns);
        sums.nccl_calls += task.last.nccl_calls;
        sums.most_nccl_ns = sums.most_nccl_ns.max(task.last.nccl_ns);
        task.window_ns = window.ns;
        task.evidence = Evidence::of(&task.last, role, task.feeding);
        sums.evidence.add(&task.evidence);
        let changed = task.phase.step(&task.evidence, window.ns);
        *task.phase_ms.get_mut(task.phase.phase) += window.ms;
        *self.total_phase_ms.get_mut(task.phase.phase) += window.ms;
        if let Some(phase) = changed {
            self.transitions += 1;
            self.thread_events.push(ThreadEvent::Phase { at_ms: window.start_ms, pid, tid, phase, comm: None });
            self.decide(tid, phase, window.end_ms);
        }
    }

    /// A thread seen for the first time, said to the incident recorder with its name.
    fn new_task(&mut self, pid: u32, tid: u32, task_dir: &Path, window: Window) -> Task {
        let comm = read_trimmed(task_dir.join(tid.to_string()).join("comm")).unwrap_or_default();
        let phase = Hysteresis::default();
        self.thread_events.push(ThreadEvent::Phase {
            at_ms: window.start_ms,
            pid,
            tid,
            phase: phase.phase,
            comm: Some(comm.clone()),
        });
        Task {
            pid,
            start_time: thread_start_time(&self.config.proc_root, pid, tid).unwrap_or(0),
            comm,
            before: None,
            last: Counters::default(),
            evidence: Evidence::default(),
            phase,
            phase_ms: PhaseValues::default(),
            runq: VecDeque::new(),
            last_decision: None,
            window_ns: window.ns,
            collective_since_ns: None,
            feeding: false,
        }
    }

    /// The process's phase from its threads' evidence, its collective state, its step
    /// boundaries and its timeline.
    fn close_process_window(&mut self, pid: u32, threads: usize, window: Window, now_ns: u64, sums: ProcessWindow) {
        let Window { ns: window_ns, ms: window_ms, start_ms, end_ms } = window;
        let Some(process) = self.processes.get_mut(&pid) else { return };
        process.threads = threads as u32;
        process.collective_waiting_since_ms =
            sums.oldest_collective_ns.map(|since| end_ms.saturating_sub(now_ns.saturating_sub(since) / 1_000_000));
        if sums.collective_returned {
            process.collective_returned_ms = Some(end_ms);
        }
        process.collective_calls += sums.nccl_calls;
        process.collective_ns += sums.most_nccl_ns.min(window_ns);
        process.cpu_wait_ns += sums.most_runq_ns.min(window_ns);
        tracing::debug!(pid, evidence = ?sums.evidence, phase = ?process.phase.phase, "window");
        if process.phase.step(&sums.evidence, window_ns).is_some() {
            process.phase_since_ms = start_ms;
        }
        let phase = process.phase.phase;
        *process.phase_ms.get_mut(phase) += window_ms;
        process.recent.add(end_ms, phase, window_ms);
        process.steps.window(phase, start_ms, end_ms);
        let waiting_for_cpu = sums.most_runq_ns as f64 >= window_ns as f64 * CPU_WAIT_SHARE;
        match process.timeline.back_mut() {
            Some(span)
                if span.phase == phase
                    && span.waiting_for_cpu == waiting_for_cpu
                    && span.end_ms >= start_ms.saturating_sub(1) =>
            {
                span.end_ms = end_ms
            }
            _ => process.timeline.push_back(PhaseSpan { phase, start_ms, end_ms, waiting_for_cpu }),
        }
        while process.timeline.len() > MAX_SPANS
            || process.timeline.front().is_some_and(|s| s.end_ms + TIMELINE_MS < end_ms)
        {
            process.timeline.pop_front();
        }
    }
}
