//! How the observer's decisions are carried out, one implementation per backend:
//! [`ObserveOnly`] changes nothing; [`Setattr`] sets each thread's nice value, policy and CPUs
//! (saving its own first, in the journal); [`SchedExt`] writes the decision into the sched_ext
//! scheduler's per-thread map and falls back to [`Setattr`] when the kernel stops it.
//!
//! Whether a process may be changed at all (admission) is the observer's business: these are
//! only asked about threads of admitted processes.

use ringside_bpf::scx::{self, ScxClass, ScxDecision, ScxScheduler};
use ringside_shared::{Decision, Phase, SchedulerBackend, ScxCounters, ScxExitInfo, ScxExitKind, ScxState, ScxStatus};

use super::policy::{self, EnforceError, Enforcer, PhasePolicy, SchedPolicy, ThreadId};

/// A thread to carry a decision out on, with what its process allows.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub thread: ThreadId,
    pub phase: Phase,
    /// The lowest nice value it may be given.
    pub nice_floor: i32,
    /// CPUs of its GPU's NUMA node, where the policy asks for them (else empty: any CPU).
    pub cpus: &'a [usize],
    pub numa_node: Option<u32>,
}

pub trait Enforcement: Send {
    /// The backend decisions go through now (`scx` becomes `setattr` once the kernel stops it).
    fn backend(&self) -> SchedulerBackend;
    /// Carries `policy` out on `target`: sets `decision.applied` or `decision.error`, and
    /// `action`, `nice` and `weight` where what was done differs from what was asked.
    fn apply(&mut self, target: &Target, policy: &PhasePolicy, decision: &mut Decision);
    /// Undoes what was done to a thread: `Ok(false)` when nothing was.
    fn restore(&mut self, tid: u32) -> Result<bool, EnforceError>;
    /// A thread that exited: nothing to restore, nothing to keep.
    fn forget(&mut self, tid: u32);
    /// A process became (or stopped being) admitted; `threads` are its threads known now,
    /// whose settings go back when it stops being admitted.
    fn admission_changed(&mut self, pid: u32, admitted: bool, threads: &[u32]);
    /// A process that is gone.
    fn process_gone(&mut self, pid: u32);
    /// Why the kernel stopped the sched_ext scheduler, once, when it has; the decisions in
    /// force must then be carried out again (they go through the fallback).
    fn take_exit(&mut self) -> Option<ScxExitInfo>;
    /// The sched_ext scheduler's state, where it was asked for.
    fn scx_status(&self) -> Option<ScxStatus>;
    /// At stop: undoes every change; returns how many threads got their settings back.
    fn stop(&mut self) -> usize;
}

/// The enforcement for a configured backend. `scx` is the loaded sched_ext scheduler, or why
/// it is not there, when the backend is `scx`: without it decisions go through setattr.
pub fn for_backend(
    backend: SchedulerBackend,
    scx: Option<Result<ScxScheduler, String>>,
    enforcer: Enforcer,
) -> Box<dyn Enforcement> {
    match (backend, scx) {
        (SchedulerBackend::Observe, _) => Box::new(ObserveOnly),
        (SchedulerBackend::Scx, Some(scx)) => Box::new(SchedExt::new(scx, Setattr::new(enforcer))),
        _ => Box::new(Setattr::new(enforcer)),
    }
}

/// `observe`: decisions are recorded, nothing is changed.
pub struct ObserveOnly;

impl Enforcement for ObserveOnly {
    fn backend(&self) -> SchedulerBackend {
        SchedulerBackend::Observe
    }
    fn apply(&mut self, _: &Target, _: &PhasePolicy, _: &mut Decision) {}
    fn restore(&mut self, _: u32) -> Result<bool, EnforceError> {
        Ok(false)
    }
    fn forget(&mut self, _: u32) {}
    fn admission_changed(&mut self, _: u32, _: bool, _: &[u32]) {}
    fn process_gone(&mut self, _: u32) {}
    fn take_exit(&mut self) -> Option<ScxExitInfo> {
        None
    }
    fn scx_status(&self) -> Option<ScxStatus> {
        None
    }
    fn stop(&mut self) -> usize {
        0
    }
}

/// `setattr`: nice value, `SCHED_BATCH` or `SCHED_OTHER`, CPU affinity, per thread.
pub struct Setattr {
    enforcer: Enforcer,
}

impl Setattr {
    pub fn new(enforcer: Enforcer) -> Setattr {
        Setattr { enforcer }
    }
}

impl Enforcement for Setattr {
    fn backend(&self) -> SchedulerBackend {
        SchedulerBackend::Setattr
    }

    fn apply(&mut self, target: &Target, p: &PhasePolicy, decision: &mut Decision) {
        let batch = p.sched_policy == SchedPolicy::Batch;
        match self.enforcer.apply(target.thread, p.nice, target.nice_floor, batch, target.cpus) {
            Ok(nice) => {
                decision.applied = true;
                if nice != p.nice {
                    decision.action += &format!(" (nice {nice}: the process may not go below it itself)");
                    decision.nice = nice;
                    decision.weight = policy::weight_of_nice(nice);
                }
            }
            Err(e) => decision.error = Some(e.to_string()),
        }
    }

    fn restore(&mut self, tid: u32) -> Result<bool, EnforceError> {
        self.enforcer.restore(tid)
    }

    fn forget(&mut self, tid: u32) {
        self.enforcer.forget(tid);
    }

    fn admission_changed(&mut self, _pid: u32, admitted: bool, threads: &[u32]) {
        if !admitted {
            for &tid in threads {
                let _ = self.enforcer.restore(tid);
            }
        }
    }

    fn process_gone(&mut self, _: u32) {}

    fn take_exit(&mut self) -> Option<ScxExitInfo> {
        None
    }

    fn scx_status(&self) -> Option<ScxStatus> {
        None
    }

    fn stop(&mut self) -> usize {
        self.enforcer.restore_all()
    }
}

/// `scx`: the sched_ext scheduler carries decisions out (weight, slice, class, node) while it
/// runs; [`Setattr`] after the kernel stopped it, or when it could not be loaded.
pub struct SchedExt {
    scheduler: Option<ScxScheduler>,
    /// What the console and `/healthz` show of it (kept after it stopped).
    status: ScxStatus,
    fallback: Setattr,
}

/// The class a phase's threads get: short slices and wake-up preemption for the phases that
/// hold the GPU up when they wait (data loading, optimizer step), long slices for feeding it.
pub fn scx_class(phase: Phase) -> ScxClass {
    match phase {
        Phase::DataLoading | Phase::OptimizerStep => ScxClass::Latency,
        Phase::GpuCompute => ScxClass::Feeder,
        _ => ScxClass::Default,
    }
}

impl SchedExt {
    pub fn new(scheduler: Result<ScxScheduler, String>, fallback: Setattr) -> SchedExt {
        match scheduler {
            Ok(scheduler) => {
                let status = ScxStatus { nodes: scheduler.nodes(), running: true, ..ScxStatus::default() };
                SchedExt { scheduler: Some(scheduler), status, fallback }
            }
            // Asked for sched_ext and did not get it: decisions go out the other way.
            Err(why) => {
                SchedExt { scheduler: None, status: ScxStatus { error: Some(why), ..ScxStatus::default() }, fallback }
            }
        }
    }

    fn counters(&self) -> ScxCounters {
        let Some(scheduler) = &self.scheduler else { return self.status.counters.clone() };
        let c = scheduler.counters();
        ScxCounters {
            enqueued: c.enqueued,
            decided: c.decided,
            direct: c.direct,
            dispatched: c.dispatched,
            stolen: c.stolen,
            preempted: c.preempted,
            continued: c.continued,
            latency_runs: c.latency_runs,
            feeder_runs: c.feeder_runs,
            fallbacks: c.fallbacks,
        }
    }
}

impl Enforcement for SchedExt {
    fn backend(&self) -> SchedulerBackend {
        if self.scheduler.is_some() {
            SchedulerBackend::Scx
        } else {
            SchedulerBackend::Setattr
        }
    }

    fn apply(&mut self, target: &Target, p: &PhasePolicy, decision: &mut Decision) {
        let Some(scheduler) = &self.scheduler else { return self.fallback.apply(target, p, decision) };
        // The weight of a nice value the process could not set itself is not given either (as
        // setattr does): the floor against the thread's own nice value now.
        let own = match policy::read_settings(target.thread.tid) {
            Ok(settings) => settings.nice,
            Err(e) => {
                decision.error = Some(e.to_string());
                return;
            }
        };
        let nice = policy::floored_nice(p.nice, target.nice_floor, own);
        let limited = (nice != p.nice).then(|| format!(" (nice {nice}: the process may not go below it itself)"));
        if limited.is_some() {
            decision.nice = nice;
            decision.weight = policy::weight_of_nice(nice);
        }
        let class = scx_class(target.phase);
        let node = target.numa_node.filter(|_| !target.cpus.is_empty());
        let scx_decision = ScxDecision {
            weight: scx::scx_weight(decision.weight),
            slice_us: p.slice_us,
            node,
            class,
            phase: Phase::ALL.iter().position(|x| *x == target.phase).unwrap_or(0) as u32,
        };
        decision.action = format!(
            "sched_ext weight {}, slice {} us, {} class, {}",
            scx_decision.weight,
            p.slice_us,
            match class {
                ScxClass::Latency => "latency",
                ScxClass::Feeder => "feeder",
                ScxClass::Default => "fair",
            },
            node.map(|n| format!("node {n}")).unwrap_or_else(|| "any node".into())
        );
        decision.action += limited.as_deref().unwrap_or_default();
        match scheduler.set(target.thread.tid, &scx_decision) {
            Ok(()) => decision.applied = true,
            Err(e) => decision.error = Some(e.to_string()),
        }
    }

    fn restore(&mut self, tid: u32) -> Result<bool, EnforceError> {
        match &self.scheduler {
            Some(scheduler) => Ok(scheduler.clear(tid)),
            None => self.fallback.restore(tid),
        }
    }

    fn forget(&mut self, tid: u32) {
        self.fallback.forget(tid);
        if let Some(scheduler) = &self.scheduler {
            scheduler.clear(tid);
        }
    }

    fn admission_changed(&mut self, pid: u32, admitted: bool, threads: &[u32]) {
        if let Some(scheduler) = &self.scheduler {
            if admitted {
                if let Err(e) = scheduler.add_job(pid) {
                    tracing::warn!(pid, "sched_ext: {e}");
                }
            } else {
                scheduler.remove_job(pid);
                for &tid in threads {
                    scheduler.clear(tid);
                }
            }
        }
        self.fallback.admission_changed(pid, admitted, threads);
    }

    fn process_gone(&mut self, pid: u32) {
        if let Some(scheduler) = &self.scheduler {
            scheduler.remove_job(pid);
        }
    }

    /// Notices when the kernel has stopped the scheduler (watchdog, error, sysrq): records
    /// why and falls back to setattr.
    fn take_exit(&mut self) -> Option<ScxExitInfo> {
        let exit = self.scheduler.as_ref()?.exit()?;
        let info = ScxExitInfo {
            at_ms: crate::clock::now_ms(),
            kind: ScxExitKind::of(exit.kind),
            reason: exit.reason.clone(),
            message: exit.message.clone(),
            ejected: exit.is_ejection(),
        };
        let counters = self.counters();
        if let Some(mut scheduler) = self.scheduler.take() {
            scheduler.unregister();
        }
        self.status.running = false;
        self.status.counters = counters;
        self.status.error = Some(format!("stopped by the kernel ({}): {}", info.kind.as_str(), info.reason));
        self.status.exit = Some(info.clone());
        Some(info)
    }

    fn scx_status(&self) -> Option<ScxStatus> {
        let mut status = self.status.clone();
        status.state = scx::state().map(|s| ScxState::parse(&s)).unwrap_or(ScxState::Unavailable);
        status.ops = scx::ops_name();
        if let Some(scheduler) = &self.scheduler {
            status.running = status.ops.as_deref() == Some(scx::OPS_NAME) && status.state == ScxState::Enabled;
            status.decided_threads = scheduler.decided() as u64;
            status.counters = self.counters();
        }
        Some(status)
    }

    fn stop(&mut self) -> usize {
        if let Some(mut scheduler) = self.scheduler.take() {
            let exit = scheduler.unregister();
            tracing::info!(?exit, "sched_ext scheduler unregistered");
        }
        self.fallback.stop()
    }
}
