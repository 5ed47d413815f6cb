//! Jobs across nodes, on the node page: each job with ranks here (Slurm job, torchrun run or
//! pod), the ranks on this node out of its world size, each rank's phase now and phase shares,
//! its own work and its wait per step, whether it sits in a collective now, what its GPU idled
//! on, a chart of each rank's phase shares over time (live, and any range of the daemon's
//! history), and a link to the fleet dashboard of the job (`[server] fleet_job_url`).

use std::collections::{BTreeMap, VecDeque};

use leptos::prelude::*;
use ringside_shared::{fleet_job_link, ExitedRank, GpuTelemetry, Phase, Rank, SchedulerTelemetry, UnixMillis};

use crate::chart::{Keyed, LivePoints, Series, TimeSeriesChart};
use crate::format::{age, fixed};
use crate::scheduler::{phase_class, short};
use crate::CollectAny;

/// Per step figures are taken over this much of the recent past.
const WINDOW_MS: u64 = 30_000;

/// One look at a rank: (when, time observed, time in collectives, collective calls).
type Sample = (UnixMillis, u64, u64, u64);

/// The phases a rank's chart draws, with their series' colours.
const CHARTED: [(Phase, &str); 4] = [
    (Phase::DataLoading, "s1"),
    (Phase::GpuCompute, "s2"),
    (Phase::NcclCollective, "s3"),
    (Phase::OptimizerStep, "s4"),
];

/// What each rank's process showed: over the last [`WINDOW_MS`], for its figures per step, and
/// its phase shares (as [`CHARTED`]) for its chart.
#[derive(Default)]
pub struct RankWindows {
    samples: Keyed<u32, VecDeque<Sample>>,
    shares: LivePoints<u32, 4>,
}

impl RankWindows {
    /// Takes the ranks' latest figures; processes gone are forgotten.
    pub fn observe(&mut self, now_ms: UnixMillis, ranks: &[Rank]) {
        self.samples.retain(|pid| ranks.iter().any(|r| r.process.pid == *pid));
        self.shares.retain(|pid| ranks.iter().any(|r| r.process.pid == *pid));
        for r in ranks {
            let samples = self.samples.entry(r.process.pid);
            if samples.back().is_some_and(|s| s.0 >= now_ms) {
                continue;
            }
            samples.push_back((now_ms, r.observed_ms(), r.process.collective_ms, r.process.collective_calls));
            while samples.len() > 2 && samples.get(1).is_some_and(|s| s.0 + WINDOW_MS <= now_ms) {
                samples.pop_front();
            }
            if r.process.recent_observed_ms > 0 {
                let shares = CHARTED.map(|(phase, _)| r.process.recent_phase_pct.get(phase));
                self.shares.push(r.process.pid, now_ms, shares);
            }
        }
    }

    /// A rank's phase shares over time, as the series of its chart (each kept in the daemon's
    /// history as `job.<phase>_pct@job:<pid>`).
    fn share_series(&self, pid: u32) -> Vec<Series> {
        CHARTED
            .iter()
            .enumerate()
            .map(|(i, (phase, class))| {
                Series::new(short(*phase), class, self.shares.line(&pid, i))
                    .kept_as(format!("job.{}_pct@job:{pid}", phase.as_str()), 1.0)
            })
            .collect()
    }

    /// Own work and wait per step (s): over the window where calls were made in it, else over
    /// the process's life.
    fn per_step(&self, r: &Rank) -> Option<(f64, f64, bool)> {
        let life = (r.observed_ms(), r.process.collective_ms, r.process.collective_calls);
        let windowed = self.samples.get(&r.process.pid).and_then(|s| {
            let (first, last) = (s.front()?, s.back()?);
            let calls = last.3.saturating_sub(first.3);
            (calls > 0).then(|| (last.1.saturating_sub(first.1), last.2.saturating_sub(first.2), calls))
        });
        let ((observed, collective, calls), recent) = match windowed {
            Some(w) => (w, true),
            None => (life, false),
        };
        (calls > 0).then(|| {
            let per = |ms: u64| ms as f64 / 1000.0 / calls as f64;
            (per(observed.saturating_sub(collective)), per(collective), recent)
        })
    }
}

fn seconds(s: f64) -> String {
    if s >= 10.0 {
        format!("{} s", fixed(s, 1))
    } else {
        format!("{} ms", fixed(s * 1000.0, 0))
    }
}

/// What the GPUs of a rank's process sat idle on over the last minute.
fn gpu_idle(r: &Rank, gpus: Option<&GpuTelemetry>) -> String {
    let Some(gpus) = gpus else { return "–".into() };
    let parts: Vec<String> = gpus
        .idle
        .iter()
        .filter(|a| a.job == r.process.job)
        .map(|a| {
            let most = Phase::ALL
                .iter()
                .map(|p| (p.as_str(), a.idle_by_phase_pct.get(*p)))
                .chain([("waiting_for_cpu", a.idle_waiting_for_cpu_pct)])
                .max_by(|x, y| x.1.total_cmp(&y.1))
                .filter(|(_, pct)| *pct >= 1.0)
                .map(|(what, pct)| format!(", {} % in {what}", fixed(pct, 0)))
                .unwrap_or_default();
            format!("GPU {} idle {} %{most}", a.gpu, fixed(a.idle_pct, 0))
        })
        .collect();
    if parts.is_empty() {
        "–".into()
    } else {
        parts.join("; ")
    }
}

/// Phase shares over the recent window (`load 30 · gpu 40 · nccl 25 %`).
fn shares(r: &Rank) -> String {
    if r.process.recent_observed_ms == 0 {
        return "–".into();
    }
    let parts: Vec<String> = Phase::ALL
        .iter()
        .map(|p| (*p, r.process.recent_phase_pct.get(*p)))
        .filter(|(_, pct)| *pct >= 1.0)
        .map(|(p, pct)| format!("{} {}", short(p), fixed(pct, 0)))
        .collect();
    format!("{} %", parts.join(" · "))
}

/// The jobs across nodes with ranks here; nothing where no process has a job id and a rank.
pub fn jobs_view(
    s: &SchedulerTelemetry,
    gpus: Option<&GpuTelemetry>,
    windows: &RankWindows,
    fleet_url: Option<&str>,
    now_ms: UnixMillis,
) -> Option<impl IntoView> {
    let ranks = s.ranks();
    if ranks.is_empty() && s.exited_ranks.is_empty() {
        return None;
    }
    // By job id: its ranks here, and its ranks whose process ended here lately.
    let mut jobs: BTreeMap<String, (Vec<&Rank>, Vec<&ExitedRank>)> = BTreeMap::new();
    for r in &ranks {
        jobs.entry(r.job_id.clone()).or_default().0.push(r);
    }
    for e in &s.exited_ranks {
        jobs.entry(e.job_id.clone()).or_default().1.push(e);
    }
    let cards = jobs
        .into_iter()
        .map(|(job_id, (members, exited))| {
            let here = members.iter().map(|r| r.rank.to_string()).collect::<Vec<_>>().join(", ");
            let world = members.iter().find_map(|r| r.process.identity.world_size);
            let count = match (members.is_empty(), world) {
                (true, _) => "no rank here now".to_string(),
                (false, Some(w)) => format!("ranks {here} here, of {w}"),
                (false, None) => format!("ranks {here} here"),
            };
            let names: Vec<String> = members
                .first()
                .map(|r| {
                    let id = &r.process.identity;
                    [("pod", &id.pod), ("Slurm name", &id.slurm_job_name)]
                        .into_iter()
                        .filter_map(|(what, v)| v.as_ref().map(|v| format!("{what} {v}")))
                        .collect()
                })
                .unwrap_or_default();
            let ended = exited
                .iter()
                .map(|e| {
                    let text = format!("rank {} (pid {}) ended {} ago: {}", e.rank, e.pid, age(now_ms.saturating_sub(e.at_ms)), e.how());
                    view! { <div class="small rank-exited">{text}</div> }
                })
                .collect_any();
            let link = fleet_url.map(|t| {
                view! {
                    <a class="fleet-link" href=fleet_job_link(t, &job_id) target="_blank" rel="noopener noreferrer">
                        "fleet dashboard"
                    </a>
                }
            });
            let rows = members
                .iter()
                .map(|r| {
                    let p = r.process;
                    let (own, wait, over) = match windows.per_step(r) {
                        Some((own, wait, recent)) => {
                            (seconds(own), seconds(wait), if recent { "last 30 s" } else { "since first seen" })
                        }
                        None => ("–".into(), "–".into(), ""),
                    };
                    let waiting = r.in_collective_ms(now_ms);
                    let in_collective = if waiting > 0 { format!("for {}", age(waiting)) } else { "no".into() };
                    view! {
                        <tr data-rank=r.rank.to_string()>
                            <td>{r.rank.to_string()}</td>
                            <td>{p.pid.to_string()}</td>
                            <td><span class=phase_class(p.phase)>{p.phase.as_str()}</span></td>
                            <td class="num rank-own" title=over>{own}</td>
                            <td class="num rank-wait" title=over>{wait}</td>
                            <td>{in_collective}</td>
                            <td>{shares(r)}</td>
                            <td class="small">{gpu_idle(r, gpus)}</td>
                        </tr>
                    }
                })
                .collect_any();
            let store = expect_context::<crate::store::Store>();
            let interval = Signal::derive(move || store.interval_ms.get());
            let charts = members
                .iter()
                .map(|r| {
                    let pid = r.process.pid;
                    let series = windows.share_series(pid);
                    view! {
                        <div class="rank-phases" data-rank=r.rank.to_string()>
                            <span class="small muted">{format!("rank {} (pid {pid})", r.rank)}</span>
                            <TimeSeriesChart title="Phase shares" unit=" %" y_max=100.0
                                series=Signal::derive(move || series.clone()) interval_ms=interval
                                source=format!("job:{pid}") />
                        </div>
                    }
                })
                .collect_any();
            let timeline = expect_context::<crate::timeline::Timeline>();
            let selected = timeline.job.get_untracked().as_deref() == Some(job_id.as_str());
            let pick = job_id.clone();
            view! {
                <div class=if selected { "fleet-job selected" } else { "fleet-job" } data-job-id=job_id.clone()>
                    <div>
                        <a class="job-link" href="#scheduler-panel" title="Link to this job (the address holds it)"
                            on:click=move |ev| {
                                ev.prevent_default();
                                timeline.panel.set(Some("scheduler".into()));
                                timeline.job.set(Some(pick.clone()));
                            }>
                            <b>{format!("job {job_id}")}</b>
                        </a>
                        <span class="muted rank-count">{format!(" · {count}")}</span>
                        {(!names.is_empty()).then(|| view! { <span class="muted">{format!(" · {}", names.join(" · "))}</span> })}
                        " "
                        {link}
                    </div>
                    {ended}
                    <table class="ranks">
                        <thead><tr>
                            <th>"Rank"</th><th>"pid"</th><th>"Phase"</th>
                            <th title="time outside collectives per step (per collective call)">"Own work / step"</th>
                            <th title="time inside collectives per step">"Wait / step"</th>
                            <th>"In a collective"</th><th>"Phase shares"</th><th>"GPU idle"</th>
                        </tr></thead>
                        <tbody>{rows}</tbody>
                    </table>
                    <div class="charts rank-charts">{charts}</div>
                </div>
            }
        })
        .collect_any();
    Some(view! {
        <h3>"Jobs across nodes"</h3>
        <p class="muted small">
            "Each rank's own work per step is what the slowest rank has most of; the fleet's Prometheus compares it across nodes (RingsideStraggler)."
        </p>
        <div class="fleet-jobs">{cards}</div>
    })
}
