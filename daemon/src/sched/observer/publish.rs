//! What the observer knows, as the scheduler telemetry the metrics source reads at each tick:
//! bounded (the busiest tasks and processes, spans shared out among them), with why some part
//! does not work.

use std::collections::HashMap;
use std::time::Instant;

use ringside_bpf::{AttachMode, AttachState, Attached, Attachment};
use ringside_shared::{
    clip, CallCounts, LibraryState, LibraryStatus, MlProcessInfo, MlTaskInfo, Phase, PhaseValues, ProbeAttach,
    ProbeLosses, ProbeProgram, ProgramState, RefusedEvidence, SchedulerBackend, SchedulerMode, SchedulerTelemetry,
};

use super::{share, Inspection, Observer, Process, Task, MAX_SPANS, MAX_THREAD_EVENTS};

fn probe_attach(mode: AttachMode) -> ProbeAttach {
    match mode {
        AttachMode::TpBtf => ProbeAttach::TpBtf,
        AttachMode::RawTp => ProbeAttach::RawTp,
        AttachMode::Tracepoint => ProbeAttach::Tracepoint,
    }
}

impl Observer {
    pub(super) fn publish(&mut self, now_ms: u64) {
        let backend = self.enforcement.backend();
        let (phase_distribution, phase_time_pct) = self.phase_totals();
        let tasks = self.task_infos();
        let processes = self.process_infos(now_ms);
        let processes_not_shown = (self.processes.len() - processes.len()) as u64;
        let programs = self.programs();
        let failed: Vec<String> =
            programs.iter().filter(|p| p.state == ProgramState::Failed).map(|p| p.name.clone()).collect();
        let lost = self.probe.lost();
        // Ended ranks are kept 10 minutes, whether or not another ends meanwhile.
        self.exited_ranks.retain(|e| e.at_ms + SchedulerTelemetry::EXITED_RANK_MS > now_ms);
        let telemetry = SchedulerTelemetry {
            total_tracked_tasks: self.thread_count as u64,
            threads_capacity: self.probe.threads_capacity() as u64,
            ml_tasks: self.tasks.len() as u64,
            decisions_made: self.decisions_made,
            phase_transitions: self.transitions,
            phase_distribution,
            phase_time_pct,
            numa_nodes: 0,
            total_cpus: 0,
            mode: if backend == SchedulerBackend::Observe { SchedulerMode::Observe } else { SchedulerMode::Enforce },
            window_ms: self.config.window.as_millis() as u64,
            job_window_ms: self.config.job_window.as_millis() as u64,
            attach_mode: Some(probe_attach(self.probe.mode())),
            programs,
            processes,
            processes_not_shown,
            processes_not_tracked: self.not_tracked,
            refused_evidence: self
                .detector
                .refused()
                .map(|r| RefusedEvidence { path: clip(&r.path, TEXT), why: clip(&r.why, TEXT), ..r.clone() })
                .collect(),
            exited_ranks: self.exited_ranks.iter().cloned().collect(),
            enforcement_inactive: (backend != SchedulerBackend::Observe && self.config.admission.is_empty()).then(
                || {
                    "enforce mode admits no process: list users, groups or cgroups under [scheduler.enforce]"
                        .to_string()
                },
            ),
            tasks,
            decisions: self.decisions.iter().cloned().collect(),
            lost: ProbeLosses {
                events: lost.events,
                runq_samples: lost.runq_samples,
                threads: lost.threads,
                ml_threads: lost.ml_threads,
                skipped_runs: self.skipped_runs,
            },
            backend,
            scx: self.enforcement.scx_status(),
        };
        let degraded = self.problems(&telemetry, &failed);
        self.hand_over(telemetry, degraded);
        self.runq.publish(&mut self.window_runq);
    }

    /// How many threads are in each phase now, and each phase's share of all the time observed.
    fn phase_totals(&self) -> (PhaseValues<u64>, PhaseValues<f64>) {
        let mut distribution = PhaseValues::<u64>::default();
        for task in self.tasks.values() {
            *distribution.get_mut(task.phase.phase) += 1;
        }
        let total: u64 = Phase::ALL.iter().map(|p| self.total_phase_ms.get(*p)).sum();
        let mut phase_time_pct = PhaseValues::<f64>::default();
        for phase in Phase::ALL {
            if total > 0 {
                *phase_time_pct.get_mut(phase) = self.total_phase_ms.get(phase) as f64 * 100.0 / total as f64;
            }
        }
        (distribution, phase_time_pct)
    }

    /// The busiest threads (on CPU, reading, synchronising, in NCCL in the latest window).
    fn task_infos(&self) -> Vec<MlTaskInfo> {
        let mut tasks: Vec<(&u32, &Task)> = self.tasks.iter().collect();
        tasks.sort_by_key(|(tid, t)| {
            (std::cmp::Reverse(t.last.on_cpu_ns + t.last.read_ns + t.last.sync_ns + t.last.nccl_ns), **tid)
        });
        tasks.into_iter().take(SchedulerTelemetry::MAX_TASKS).map(|(tid, t)| task_info(*tid, t)).collect()
    }

    /// The busiest processes (on-CPU time of their threads in the latest window), with the
    /// timeline spans shared out among them: both travel in every update.
    fn process_infos(&mut self, now_ms: u64) -> Vec<MlProcessInfo> {
        let mut activity: HashMap<u32, u64> = HashMap::new();
        for task in self.tasks.values() {
            *activity.entry(task.pid).or_default() += task.last.on_cpu_ns;
        }
        let mut ranked: Vec<u32> = self.processes.keys().copied().collect();
        ranked.sort_by_key(|pid| (std::cmp::Reverse(activity.get(pid).copied().unwrap_or(0)), *pid));
        ranked.truncate(SchedulerTelemetry::MAX_PROCESSES);
        let spans_each = (SchedulerTelemetry::MAX_SPANS / ranked.len().max(1)).min(MAX_SPANS);
        let recent_ms = self.config.job_window.as_millis() as u64;
        // Step times sort up to an hour of steps: recomputed once a second, for listed ones.
        for pid in &ranked {
            if let Some(p) = self.processes.get_mut(pid) {
                if p.step_times.as_ref().is_none_or(|(at_s, _)| *at_s != now_ms / 1000) {
                    p.step_times = Some((now_ms / 1000, p.steps.times(now_ms, recent_ms)));
                }
            }
        }
        let mut processes: Vec<MlProcessInfo> = ranked
            .iter()
            .filter_map(|pid| self.processes.get_key_value(pid))
            .map(|(pid, p)| self.process_info(*pid, p, spans_each, now_ms))
            .collect();
        processes.sort_by_key(|p| (p.job, p.pid));
        processes
    }

    fn process_info(&self, pid: u32, p: &Process, spans_each: usize, now_ms: u64) -> MlProcessInfo {
        let recent = p.recent.shares(now_ms);
        MlProcessInfo {
            pid,
            job: p.job,
            comm: p.comm.clone(),
            role: p.role,
            reason: clip(&p.reason, TEXT),
            phase: p.phase.phase,
            phase_since_ms: p.phase_since_ms,
            threads: p.threads,
            gpus: p.gpus.clone(),
            numa_node: p.numa_node,
            probed_libraries: self
                .probe
                .probed_libraries(pid)
                .iter()
                .map(|l| clip(&l.file_name().unwrap_or_default().to_string_lossy(), TEXT))
                .collect(),
            libraries: p.libraries.iter().map(library_status).collect(),
            uid: p.uid,
            admitted: p.admission.is_ok(),
            admission: match &p.admission {
                Ok(why) | Err(why) => clip(why, TEXT),
            },
            untrusted: p.pages.is_err(),
            paging: match &p.pages {
                Ok(why) | Err(why) => clip(why, SchedulerTelemetry::MAX_SHORT_TEXT),
            },
            phase_ms: p.phase_ms.clone(),
            timeline: p.timeline.iter().skip(p.timeline.len().saturating_sub(spans_each)).cloned().collect(),
            cmdline: p.cmdline.clone(),
            collective_waiting_since_ms: p.collective_waiting_since_ms,
            collective_returned_ms: p.collective_returned_ms,
            collective_calls: p.collective_calls,
            collective_ms: p.collective_ns / 1_000_000,
            cpu_wait_ms: p.cpu_wait_ns / 1_000_000,
            recent_phase_pct: recent.0,
            recent_observed_ms: recent.1,
            steps: p.step_times.as_ref().and_then(|(_, t)| t.clone()),
            identity: p.identity.clone(),
        }
    }

    /// The BPF programs, how each attached.
    fn programs(&self) -> Vec<ProbeProgram> {
        self.probe
            .programs()
            .into_iter()
            .map(|p| ProbeProgram {
                name: p.name,
                attach: match p.attach {
                    Attachment::Mode(mode) => probe_attach(mode),
                    Attachment::SchedSwitch => ProbeAttach::SchedSwitch,
                    Attachment::Uprobe => ProbeAttach::Uprobe,
                },
                state: match p.state {
                    AttachState::Attached => ProgramState::Attached,
                    AttachState::Fallback => ProgramState::Fallback,
                    AttachState::Failed => ProgramState::Failed,
                },
                detail: p.detail,
            })
            .collect()
    }

    /// What does not work, said in the scheduler component's health (`None`: all of it does).
    fn problems(&self, telemetry: &SchedulerTelemetry, failed: &[String]) -> Option<String> {
        let mut problems: Vec<String> = Vec::new();
        if !failed.is_empty() {
            problems.push(format!(
                "some probes did not attach ({}): their signals are missing from phase detection",
                failed.join(", ")
            ));
        }
        problems.extend(telemetry.enforcement_inactive.clone());
        problems.extend(self.libraries.stopped().map(|why| format!("{why}: CUDA/NCCL calls are no longer probed")));
        problems.extend(
            self.detector.stopped().map(|why| format!("{why}: mapped libraries no longer count as ML evidence")),
        );
        if self.not_tracked > 0 {
            problems.push(format!(
                "{} ML processes beyond [scheduler] max_processes = {} are not tracked",
                self.not_tracked, self.config.max_processes
            ));
        }
        (!problems.is_empty()).then(|| problems.join("; "))
    }

    /// Hands the telemetry and the thread events since the last tick to the metrics source.
    fn hand_over(&mut self, telemetry: SchedulerTelemetry, degraded: Option<String>) {
        if let Ok(mut published) = self.published.lock() {
            published.telemetry = Some(telemetry);
            published.degraded = degraded;
            published.published_at = Some(Instant::now());
            published.thread_events.append(&mut self.thread_events);
            let excess = published.thread_events.len().saturating_sub(MAX_THREAD_EVENTS);
            if excess > 0 {
                published.thread_events.drain(..excess);
                published.thread_events_lost += excess as u64;
            }
        } else {
            self.thread_events.clear();
        }
    }
}

const TEXT: usize = SchedulerTelemetry::MAX_TEXT;

fn task_info(tid: u32, t: &Task) -> MlTaskInfo {
    let mut samples: Vec<u64> = t.runq.iter().copied().collect();
    samples.sort_unstable();
    let pick = |q: f64| (!samples.is_empty()).then(|| samples[((samples.len() - 1) as f64 * q).round() as usize]);
    let w = t.window_ns;
    let d = &t.last;
    let features = [
        ("cpu", share(d.on_cpu_ns + d.runq_ns, w)),
        ("read", share(d.read_ns, w)),
        ("iowait", share(d.iowait_ns, w)),
        ("futex", share(d.futex_ns, w)),
        ("sync", share(d.sync_ns, w)),
        ("nccl", share(d.nccl_ns, w)),
        ("ioctl", share(d.nv_ioctl_ns, w)),
        ("driver", d.driver_share()),
        ("launches_per_s", d.launches as f64 * 1e9 / w.max(1) as f64),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), (v * 1000.0).round() / 1000.0))
    .collect();
    MlTaskInfo {
        pid: t.pid,
        tid,
        comm: t.comm.clone(),
        phase: t.phase.phase,
        phase_ms: t.phase_ms.clone(),
        on_cpu_pct: (share(d.on_cpu_ns, w) * 1000.0).round() / 10.0,
        runq_p50_ns: pick(0.5),
        runq_p99_ns: pick(0.99),
        features,
        last_decision: t.last_decision.as_deref().map(|d| clip(d, SchedulerTelemetry::MAX_SHORT_TEXT)),
        calls: t
            .before
            .map(|c| CallCounts { launches: c.launches, syncs: c.syncs, copies: c.copies, nccl: c.nccl_calls })
            .unwrap_or_default(),
    }
}

fn library_status(l: &super::Library) -> LibraryStatus {
    let (state, detail) = match &l.state {
        Inspection::Pending => (LibraryState::Pending, String::new()),
        Inspection::Probed(Attached::File { entry_points, .. }) => {
            (LibraryState::Probed, format!("{entry_points} entry points probed, once for the library file"))
        }
        Inspection::Probed(Attached::Process { entry_points }) => {
            (LibraryState::Probed, format!("{entry_points} entry points probed, for this process"))
        }
        Inspection::Refused(why) => (LibraryState::Refused, why.clone()),
    };
    LibraryStatus { path: clip(&l.path.to_string_lossy(), TEXT), state, detail: clip(&detail, TEXT) }
}
