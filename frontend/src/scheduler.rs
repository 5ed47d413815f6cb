//! The scheduler panel: mode and probe state, a phase timeline per ML process, the per-thread
//! table (phase, time per phase, run-queue latency, last decision), recent decisions, and which
//! BPF programs attached. Without the probe it says why, from the component's health.

use leptos::prelude::*;
use ringside_shared::{
    CallCounts, ComponentStatus, JobIdentity, LibraryState, MlProcessInfo, Phase, PhaseValues, ProgramState,
    SchedulerTelemetry,
};

use crate::chart::px;
use crate::format::{age, fixed, micros};
use crate::store::Store;
use crate::CollectAny;

/// How much of each process's timeline is drawn.
const TIMELINE_SPAN_MS: u64 = 120_000;

pub(crate) fn phase_class(phase: Phase) -> String {
    format!("phase phase-{}", phase.as_str())
}

/// `gpu 4.2 s · load 1.1 s` — the phases with time, longest first.
fn phase_times(values: &PhaseValues<u64>) -> String {
    let mut parts: Vec<(Phase, u64)> =
        Phase::ALL.iter().map(|p| (*p, values.get(*p))).filter(|(_, ms)| *ms > 0).collect();
    parts.sort_by_key(|(_, ms)| std::cmp::Reverse(*ms));
    parts
        .iter()
        .map(|(p, ms)| format!("{} {} s", short(*p), fixed(*ms as f64 / 1000.0, 1)))
        .collect::<Vec<_>>()
        .join(" · ")
}

pub(crate) fn short(phase: Phase) -> &'static str {
    match phase {
        Phase::DataLoading => "load",
        Phase::GpuCompute => "gpu",
        Phase::NcclCollective => "nccl",
        Phase::OptimizerStep => "optim",
        Phase::Unknown => "unknown",
    }
}

fn timeline(process: &MlProcessInfo, now_ms: u64) -> impl IntoView {
    // The last two minutes, or the process's whole life while it is younger (at least 10 s).
    let first = process.timeline.first().map(|s| s.start_ms).unwrap_or(now_ms);
    let from = now_ms.saturating_sub(TIMELINE_SPAN_MS).max(first.min(now_ms.saturating_sub(10_000)));
    let span = now_ms.saturating_sub(from).max(1);
    let x = move |t: u64| (t.saturating_sub(from)) as f64 * 1000.0 / span as f64;
    let rects = process
        .timeline
        .iter()
        .filter(|s| s.end_ms > from)
        .map(|s| {
            let (x0, x1) = (x(s.start_ms.max(from)), x(s.end_ms.min(now_ms)));
            view! {
                <rect class=phase_class(s.phase) x=px(x0) y="0" width=px((x1 - x0).max(0.5)) height="18">
                    <title>{format!("{} for {}", s.phase.as_str(), age(s.end_ms - s.start_ms))}</title>
                </rect>
            }
        })
        .collect_any();
    view! {
        <svg class="timeline" viewBox="0 0 1000 18" preserveAspectRatio="none" role="img"
            aria-label=format!("phase timeline of process {}", process.pid)>
            {rects}
        </svg>
    }
}

/// Who the process is beyond this node (`job 4242.0 · rank 3 of 16 · local 1 · pod trainer-0`),
/// where its cgroup path or environment say.
fn identity_line(id: &JobIdentity) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(job) = id.job_id() {
        parts.push(format!("job {job}"));
    }
    match (id.rank, id.world_size) {
        (Some(rank), Some(size)) => parts.push(format!("rank {rank} of {size}")),
        (Some(rank), None) => parts.push(format!("rank {rank}")),
        _ => {}
    }
    if let Some(local) = id.local_rank {
        parts.push(format!("local {local}"));
    }
    let named = [("pod", &id.pod), ("unit", &id.unit), ("Slurm name", &id.slurm_job_name)];
    parts.extend(named.into_iter().filter_map(|(what, v)| v.as_ref().map(|v| format!("{what} {v}"))));
    if let Some(c) = &id.container {
        parts.push(format!("container {}", c.chars().take(12).collect::<String>()));
    }
    (!parts.is_empty()).then(|| parts.join(" · "))
}

/// `gpu_use`: what NVML says the process holds on each GPU (memory, SM share), if anything.
fn process_row(p: &MlProcessInfo, gpu_use: Option<String>, now_ms: u64) -> impl IntoView {
    let gpu = if p.gpus.is_empty() {
        "no GPU open".to_string()
    } else {
        let gpus = p.gpus.iter().map(|g| format!("nvidia{g}")).collect::<Vec<_>>().join(", ");
        match p.numa_node {
            Some(node) => format!("{gpus} (node {node})"),
            None => gpus,
        }
    };
    let probed = if p.probed_libraries.is_empty() { "none".to_string() } else { p.probed_libraries.join(", ") };
    let user = p.uid.map(|u| format!("uid {u} · ")).unwrap_or_default();
    // Libraries that were not probed, and why (too large, not ELF, replaced, timed out).
    let refused = p
        .libraries
        .iter()
        .filter(|l| l.state == LibraryState::Refused)
        .map(|l| view! { <div class="library-refused small">{format!("not probed: {} — {}", l.path, l.detail)}</div> })
        .collect_any();
    view! {
        <div class="ml-process" data-pid=p.pid.to_string()>
            <div class="ml-process-head">
                <b>{format!("{} ", p.comm)}</b>
                <span class="muted">{format!("pid {} · {} of job {} · {} threads · {}", p.pid, p.role.as_str(), p.job, p.threads, p.reason)}</span>
                <span class=phase_class(p.phase)>{p.phase.as_str()}</span>
                <span class="muted">{format!(" for {}", age(now_ms.saturating_sub(p.phase_since_ms)))}</span>
                {p.untrusted.then(|| view! { <span class="badge-untrusted" title=p.paging.clone()>"untrusted: does not page"</span> })}
            </div>
            {identity_line(&p.identity).map(|line| view! { <div class="small job-identity">{line}</div> })}
            {timeline(p, now_ms)}
            <div class="muted small">{format!("{} · probes: {probed} · {}", gpu, phase_times(&p.phase_ms))}</div>
            {gpu_use.map(|u| view! { <div class="small gpu-use">{u}</div> })}
            <div class=if p.admitted { "admission admitted small" } else { "admission small muted" }>{format!("{user}{}", p.admission)}</div>
            {refused}
        </div>
    }
}

/// What the lists leave out, and library evidence that was not believed.
fn bounds_note(s: &SchedulerTelemetry) -> impl IntoView {
    let mut parts = Vec::new();
    if s.processes_not_shown > 0 {
        parts.push(format!("{} more ML processes tracked, not listed", s.processes_not_shown));
    }
    if s.processes_not_tracked > 0 {
        parts.push(format!("{} found beyond the tracking limit, not tracked", s.processes_not_tracked));
    }
    let note = (!parts.is_empty()).then(|| view! { <p class="muted" id="processes-not-shown">{parts.join(" · ")}</p> });
    let refused = (!s.refused_evidence.is_empty()).then(|| {
        let rows = s
            .refused_evidence
            .iter()
            .map(|r| view! { <tr><td>{r.pid.to_string()}</td><td>{r.comm.clone()}</td><td>{r.path.clone()}</td><td class="muted">{r.why.clone()}</td></tr> })
            .collect_any();
        view! {
            <details class="refused-evidence">
                <summary>{format!("{} libraries not taken as evidence of ML work", s.refused_evidence.len())}</summary>
                <table><tbody>{rows}</tbody></table>
            </details>
        }
    });
    view! { {note} {refused} }
}

fn summary(s: &SchedulerTelemetry) -> impl IntoView {
    let lost = s.lost.events + s.lost.runq_samples + s.lost.threads + s.lost.ml_threads + s.lost.skipped_runs;
    let pct = |p: Phase| s.phase_time_pct.get(p);
    let bar = Phase::ALL
        .iter()
        .filter(|p| pct(**p) > 0.0)
        .map(|p| {
            view! {
                <span class=phase_class(*p) style=format!("width: {}%", fixed(pct(*p), 2))
                    title=format!("{} {} %", p.as_str(), fixed(pct(*p), 1))></span>
            }
        })
        .collect_any();
    view! {
        <div class="sched-summary">
            <div><span class="stat-label">"Mode"</span><b id="sched-mode">{s.mode.as_str()}</b></div>
            <div><span class="stat-label">"Backend"</span><b id="sched-backend">{s.backend.as_str()}</b></div>
            <div><span class="stat-label">"Probe"</span><b>{s.attach_mode.map(|m| m.as_str()).unwrap_or("–")}</b></div>
            <div><span class="stat-label">"Window"</span><b>{format!("{} ms", s.window_ms)}</b></div>
            <div><span class="stat-label">"ML threads · all"</span><b>{format!("{} · {}", s.ml_tasks, s.total_tracked_tasks)}</b></div>
            <div><span class="stat-label">"Decisions · transitions"</span><b>{format!("{} · {}", s.decisions_made, s.phase_transitions)}</b></div>
            <div><span class="stat-label">"Lost records"</span><b>{lost.to_string()}</b></div>
        </div>
        <div class="phase-bar" role="img" aria-label="share of ML thread time per phase">{bar}</div>
        <div class="phase-legend">
            {Phase::ALL.iter().map(|p| view! { <span><span class=phase_class(*p)></span>{format!("{} {} %", p.as_str(), fixed(pct(*p), 0))}</span> }).collect_any()}
        </div>
    }
}

/// A thread's CUDA/NCCL calls, with its launches where the launch probes count them.
fn calls(c: &CallCounts) -> String {
    let waits = format!("{} · {} · {}", c.syncs, c.copies, c.nccl);
    if c.launches > 0 {
        format!("{waits} ({} launches)", c.launches)
    } else {
        waits
    }
}

fn tasks_table(s: &SchedulerTelemetry) -> impl IntoView {
    let rows = s
        .tasks
        .iter()
        .map(|t| {
            view! {
                <tr data-tid=t.tid.to_string()>
                    <td>{format!("{}/{}", t.pid, t.tid)}</td>
                    <td>{t.comm.clone()}</td>
                    <td><span class=phase_class(t.phase)>{t.phase.as_str()}</span></td>
                    <td>{phase_times(&t.phase_ms)}</td>
                    <td class="num">{format!("{} %", fixed(t.on_cpu_pct, 0))}</td>
                    <td class="num">{format!("{} · {}", micros(t.runq_p50_ns), micros(t.runq_p99_ns))}</td>
                    <td class="num" title="share of its timer-tick samples in the CUDA driver's code">
                        {t.features.get("driver").map(|d| format!("{} %", fixed(d * 100.0, 0))).unwrap_or_else(|| "–".into())}
                    </td>
                    <td class="num">{calls(&t.calls)}</td>
                    <td>{t.last_decision.clone().unwrap_or_else(|| "–".into())}</td>
                </tr>
            }
        })
        .collect_any();
    view! {
        <table class="tasks">
            <thead><tr>
                <th>"pid/tid"</th><th>"Thread"</th><th>"Phase"</th><th>"Time per phase"</th>
                <th>"On CPU"</th><th>"Run queue p50 · p99"</th><th>"In driver"</th>
                <th>"Calls: sync · copy · NCCL"</th><th>"Last decision"</th>
            </tr></thead>
            <tbody>{rows}</tbody>
        </table>
    }
}

fn decisions_list(s: &SchedulerTelemetry, now_ms: u64) -> impl IntoView {
    let items = s
        .decisions
        .iter()
        .take(12)
        .map(|d| {
            view! {
                <li>
                    <span class="muted">{format!("{} ago ", age(now_ms.saturating_sub(d.at_ms)))}</span>
                    <b>{format!("{}/{} {}", d.pid, d.tid, d.comm)}</b>" → "{d.action.clone()}
                    <span class=if d.applied { "tag tag-applied" } else { "tag" }>{if d.applied { "applied" } else { "observed" }}</span>
                    {d.error.clone().map(|e| view! { <span class="kernel-error">{format!(" {e}")}</span> })}
                    <div class="muted small">{d.reason.clone()}</div>
                </li>
            }
        })
        .collect_any();
    view! { <ul class="decisions">{items}</ul> }
}

/// The sched_ext scheduler: the kernel's state, the ops name, why it stopped, its counters.
fn scx_panel(s: &SchedulerTelemetry) -> impl IntoView {
    s.scx.clone().map(|x| {
        let c = &x.counters;
        let counters = [
            ("enqueued", c.enqueued, "queued on a node's dispatch queue"),
            ("decided", c.decided, "of which carried a decision of the daemon"),
            ("direct", c.direct, "put straight on an idle CPU at wake-up"),
            ("dispatched", c.dispatched, "taken from the CPU's own node queue"),
            ("stolen", c.stolen, "taken from another node's queue"),
            ("preempted", c.preempted, "wake-ups that preempted a running task"),
            ("continued", c.continued, "ML threads that kept their CPU at the end of a slice, still owed it"),
            ("latency runs", c.latency_runs, "times a data-loading or optimizer thread ran"),
            ("feeder runs", c.feeder_runs, "times a GPU-feeding thread ran"),
            ("fallbacks", c.fallbacks, "decisions that could not be followed as written"),
        ]
        .into_iter()
        .map(|(name, value, help)| view! { <div title=help><span class="stat-label">{name}</span><b>{value.to_string()}</b></div> })
        .collect_any();
        let state = if x.running { "running".to_string() } else { format!("not running (sched_ext {})", x.state.as_str()) };
        view! {
            <div class="scx" id="scx-status">
                <h3>"sched_ext"</h3>
                <p>
                    <b class=if x.running { "scx-running" } else { "scx-stopped" }>{state}</b>
                    {x.ops.clone().map(|ops| format!(" · ops {ops}")).unwrap_or_default()}
                    {format!(" · {} node queues · {} threads with a decision", x.nodes, x.decided_threads)}
                </p>
                {x.error.clone().map(|e| view! { <p class="sched-status" role="status">{e}</p> })}
                <div class="sched-summary">{counters}</div>
            </div>
        }
    })
}

fn programs_table(s: &SchedulerTelemetry) -> impl IntoView {
    let failed = s.programs.iter().filter(|p| p.state != ProgramState::Attached).count();
    let rows = s
        .programs
        .iter()
        .map(|p| {
            view! {
                <tr class=format!("prog-{}", p.state.as_str())>
                    <td>{p.name.clone()}</td><td>{p.attach.as_str()}</td><td>{p.state.as_str()}</td>
                    <td class="muted">{p.detail.clone().unwrap_or_default()}</td>
                </tr>
            }
        })
        .collect_any();
    view! {
        <details class="programs">
            <summary>{format!("BPF programs: {} attach points, {} not attached as preferred", s.programs.len(), failed)}</summary>
            <table><tbody>{rows}</tbody></table>
        </details>
    }
}

#[component]
pub fn SchedulerPanel() -> impl IntoView {
    let store = expect_context::<Store>();
    let unavailable = move || {
        store.components.with(|cs| {
            cs.iter()
                .find(|c| c.name == "scheduler")
                .map(|c| match (&c.status, &c.detail) {
                    (ComponentStatus::Up, _) => String::new(),
                    (_, Some(detail)) => detail.clone(),
                    (_, None) => "the scheduler is not running".into(),
                })
                .unwrap_or_else(|| "the scheduler is disabled in this daemon's config".into())
        })
    };
    // Each rank's recent figures, for its own work and wait per step.
    let windows = StoredValue::new_local(crate::jobs::RankWindows::default());
    let body = move || {
        let now_ms = store.server_time_ms.get();
        let fleet_url = store.fleet_job_url.get();
        store.readings.with(|r| {
            let (s, gpus) = (r.scheduler.as_ref()?, r.gpus.as_ref());
            windows.update_value(|w| w.observe(now_ms, &s.ranks()));
            let jobs = windows.with_value(|w| crate::jobs::jobs_view(s, gpus, w, fleet_url.as_deref(), now_ms));
            let processes = s
                .processes
                .iter()
                .map(|p| {
                    let use_of = gpus.and_then(|g| crate::gpus::gpu_use_of(p.pid, g));
                    process_row(p, use_of, now_ms)
                })
                .collect_any();
            Some(view! {
                {summary(s)}
                {scx_panel(s)}
                <h3>"ML processes"</h3>
                {if s.processes.is_empty() {
                    view! { <p class="empty">"No ML process on this node now."</p> }.into_any()
                } else {
                    view! { <div class="ml-processes">{processes}</div> }.into_any()
                }}
                {bounds_note(s)}
                {jobs}
                <h3>"Threads"</h3>
                {if s.tasks.is_empty() { ().into_any() } else { tasks_table(s).into_any() }}
                <h3>"Recent decisions"</h3>
                {if s.decisions.is_empty() {
                    view! { <p class="empty">"No decisions yet."</p> }.into_any()
                } else {
                    decisions_list(s, now_ms).into_any()
                }}
                {programs_table(s)}
            })
        })
    };
    view! {
        <section class="panel" id="scheduler-panel">
            <h2>"Scheduler"</h2>
            {move || {
                let why = unavailable();
                (!why.is_empty()).then(|| view! { <p class="sched-status" role="status">{why}</p> })
            }}
            {body}
        </section>
    }
}
