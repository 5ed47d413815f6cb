//! A thread's phase change to a decision: what the phase's policy asks for, whether the
//! process is admitted, and what the [`Enforcement`](super::Enforcement) made of it.

use ringside_shared::{Decision, Phase, SchedulerBackend, SchedulerTelemetry};

use super::super::enforcement::Target;
use super::super::policy::{self, CpuChoice, ThreadId};
use super::{share, Observer, Task};

impl Observer {
    fn reason(task: &Task) -> String {
        let d = &task.last;
        let w = task.window_ns;
        format!(
            "over {} ms: cpu {:.0}%, read {:.0}%, sync {:.0}%, nccl {:.0}%, in the driver {:.0}% of {} samples{}{}",
            w / 1_000_000,
            share(d.on_cpu_ns + d.runq_ns, w) * 100.0,
            share(d.read_ns + d.iowait_ns, w) * 100.0,
            share(d.sync_ns + d.nv_ioctl_ns, w) * 100.0,
            share(d.nccl_ns, w) * 100.0,
            d.driver_share() * 100.0,
            d.samples,
            if task.feeding { " (feeding the GPU)" } else { "" },
            if d.launches > 0 {
                format!(", {:.0} launches/s", d.launches as f64 * 1e9 / w.max(1) as f64)
            } else {
                String::new()
            }
        )
    }

    /// Decides for a thread that entered `phase`, carries the decision out (or, in `observe`,
    /// records it only) and keeps it in the bounded list of recent decisions.
    pub(super) fn decide(&mut self, tid: u32, phase: Phase, at_ms: u64) {
        let Some(task) = self.tasks.get(&tid) else { return };
        let Some(process) = self.processes.get(&task.pid) else { return };
        let observing = self.enforcement.backend() == SchedulerBackend::Observe;
        let mut decision = Decision {
            at_ms,
            pid: task.pid,
            tid,
            comm: task.comm.clone(),
            phase,
            action: String::new(),
            reason: format!("entered {}: {}", phase.as_str(), Self::reason(task)),
            applied: false,
            error: None,
            nice: 0,
            weight: policy::weight_of_nice(0),
            slice_us: 0,
            cpus: String::new(),
        };
        match self.config.policy.for_phase(phase) {
            Some(p) => {
                let cpus: &[usize] = if p.cpus == CpuChoice::GpuNode { &process.node_cpus } else { &[] };
                decision.nice = p.nice;
                decision.weight = policy::weight_of_nice(p.nice);
                decision.slice_us = p.slice_us;
                decision.cpus = policy::format_cpu_list(cpus);
                decision.action = format!("nice {}, {}", p.nice, p.sched_policy.as_str());
                match (&decision.cpus, process.numa_node) {
                    (c, Some(node)) if !c.is_empty() => decision.action += &format!(", cpus {c} (node {node})"),
                    _ => decision.action += ", any cpu",
                }
                // Observe mode first: its processes are never admitted, and that is no error.
                match &process.admission {
                    _ if observing => {}
                    Err(why) => decision.error = Some(why.clone()),
                    Ok(_) => {
                        let target = Target {
                            thread: ThreadId { pid: task.pid, tid, start_time: task.start_time },
                            phase,
                            nice_floor: process.nice_floor,
                            cpus,
                            numa_node: process.numa_node,
                        };
                        self.enforcement.apply(&target, p, &mut decision);
                    }
                }
            }
            None => {
                // Back to a phase without a policy: undo what an earlier decision did, if any.
                if task.last_decision.is_none() {
                    return;
                }
                decision.action = "restore own settings".into();
                if !observing {
                    match self.enforcement.restore(tid) {
                        Ok(restored) => decision.applied = restored,
                        Err(e) => decision.error = Some(e.to_string()),
                    }
                }
            }
        }
        self.decisions_made += 1;
        let summary = format!("{} ({})", decision.action, if decision.applied { "applied" } else { "observed" });
        if let Some(task) = self.tasks.get_mut(&tid) {
            task.last_decision = Some(summary);
        }
        if self.decisions.len() == SchedulerTelemetry::MAX_DECISIONS {
            self.decisions.pop_back();
        }
        self.decisions.push_front(decision);
    }

    /// A thread that exited.
    pub(super) fn forget_task(&mut self, tid: u32) {
        self.enforcement.forget(tid);
    }

    /// Notices when the kernel has stopped the sched_ext scheduler (watchdog, error, sysrq):
    /// the enforcement has fallen back to setattr, and the phases in force are carried out
    /// again that way.
    pub(super) fn check_scx(&mut self) {
        let Some(info) = self.enforcement.take_exit() else { return };
        tracing::error!(kind = info.kind.as_str(), reason = %info.reason, message = %info.message,
            "the kernel stopped the sched_ext scheduler; falling back to setattr");
        let mut in_force: Vec<(u32, Phase)> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.phase.phase != Phase::Unknown)
            .map(|(tid, t)| (*tid, t.phase.phase))
            .collect();
        in_force.sort_unstable_by_key(|(tid, _)| *tid);
        for (tid, phase) in in_force {
            self.decide(tid, phase, info.at_ms);
        }
    }
}
