//! The GPUs panel: one card per GPU as NVML reports it (utilisation, memory, temperatures,
//! power against its limit, clocks against their maximum, why the clocks are held down, ECC
//! and remapped rows, PCIe traffic, the compute processes on it). A figure the GPU does not
//! report shows "–" with the reason on hover, never 0.

use leptos::prelude::*;
use ringside_shared::{GpuDevice, GpuIdleAttribution, GpuTelemetry, Phase, ThrottleReason};

use crate::chart::{LivePoints, Series, TimeSeriesChart};
use crate::format::{bytes, fixed};
use crate::store::Store;
use crate::CollectAny;

/// Utilisation and memory use of GPU `index` over the history the console holds.
fn history_chart(index: u32) -> impl IntoView {
    let store = expect_context::<Store>();
    let interval = Signal::derive(move || store.interval_ms.get());
    let series = Signal::derive(move || {
        let pick = |which: fn(&ringside_shared::GpuPoint) -> Option<f64>| -> Vec<(u64, f64)> {
            store.history.with(|h| {
                h.iter()
                    .filter_map(|p| p.gpus.iter().find(|g| g.index == index).and_then(which).map(|v| (p.t_ms, v)))
                    .collect()
            })
        };
        vec![
            Series::new("utilisation", "s1", pick(|g| g.utilization_pct))
                .kept_as(format!("gpu.utilization_pct@gpu:{index}"), 1.0),
            Series::new("memory", "s2", pick(|g| g.memory_used_pct))
                .kept_as(format!("gpu.memory_used_pct@gpu:{index}"), 1.0),
        ]
    });
    let source = format!("gpu:{index}");
    view! { <TimeSeriesChart title="Utilisation · memory in use" unit=" %" y_max=100.0 series interval_ms=interval source /> }
}

/// What a job's GPU idled on, charted: the idle share and its causes, each with its series in the
/// daemon's history (`job.gpu_idle_*@job:<pid>/gpu:<index>`) and its colour.
const IDLE_CHARTED: [(&str, &str, &str); 5] = [
    ("idle", "gpu_idle_pct", "s5"),
    ("data loading", "gpu_idle_data_loading_pct", "s1"),
    ("NCCL", "gpu_idle_nccl_collective_pct", "s3"),
    ("optimizer", "gpu_idle_optimizer_step_pct", "s4"),
    ("waiting for CPU", "gpu_idle_waiting_for_cpu_pct", "s2"),
];

/// Each (job, GPU)'s recent idle attributions, as [`IDLE_CHARTED`], for its live chart.
#[derive(Default)]
pub struct IdleWindows {
    points: LivePoints<(u32, u32), 5>,
}

impl IdleWindows {
    /// Takes the latest attributions (each at the end of its window); pairs gone are forgotten.
    pub fn observe(&mut self, idle: &[GpuIdleAttribution]) {
        self.points.retain(|(job, gpu)| idle.iter().any(|a| a.job == *job && a.gpu == *gpu));
        for a in idle {
            let by = &a.idle_by_phase_pct;
            let values = [
                a.idle_pct,
                by.get(Phase::DataLoading),
                by.get(Phase::NcclCollective),
                by.get(Phase::OptimizerStep),
                a.idle_waiting_for_cpu_pct,
            ];
            self.points.push((a.job, a.gpu), a.until_ms, values);
        }
    }

    /// The chart's series of `job` on `gpu`.
    fn series(&self, job: u32, gpu: u32) -> Vec<Series> {
        IDLE_CHARTED
            .iter()
            .enumerate()
            .map(|(i, (name, metric, class))| {
                Series::new(name, class, self.points.line(&(job, gpu), i))
                    .kept_as(format!("job.{metric}@job:{job}/gpu:{gpu}"), 1.0)
            })
            .collect()
    }
}

/// A figure, or "–" with why it is missing (from the device's `unsupported` map).
fn figure<T>(gpu: &GpuDevice, field: &str, value: Option<T>, show: impl Fn(T) -> String) -> AnyView {
    match value.map(show) {
        Some(text) => view! { <b>{text}</b> }.into_any(),
        None => {
            let why = gpu.unsupported.get(field).cloned().unwrap_or_else(|| "not reported".into());
            view! { <b class="muted" title=why>"–"</b> }.into_any()
        }
    }
}

/// A share bar, 0-100.
fn bar(pct: Option<f64>) -> impl IntoView {
    let pct = pct.unwrap_or(0.0).clamp(0.0, 100.0);
    view! { <span class="bar"><span class="fill" style=format!("width: {}%", fixed(pct, 1))></span></span> }
}

fn ratio(used: Option<f64>, limit: Option<f64>) -> Option<f64> {
    match (used, limit) {
        (Some(u), Some(l)) if l > 0.0 => Some(u * 100.0 / l),
        _ => None,
    }
}

/// The throttle reasons in words; `gpu_idle` alone is not a problem.
pub fn throttle_text(reasons: &[ThrottleReason]) -> String {
    if reasons.is_empty() {
        return "none: running free".into();
    }
    reasons.iter().map(|r| r.as_str().replace('_', " ")).collect::<Vec<_>>().join(", ")
}

/// What a process holds on the node's GPUs, joined by pid with NVML's process lists (the
/// daemon sees host pids, as NVML reports them): "GPU 0: 552 MiB, SM 72 %; GPU 1: 1.0 GiB".
pub fn gpu_use_of(pid: u32, gpus: &GpuTelemetry) -> Option<String> {
    let parts: Vec<String> = gpus
        .devices
        .iter()
        .filter_map(|g| {
            let p = g.processes.iter().find(|p| p.pid == pid)?;
            let memory = p.gpu_memory_bytes.map(bytes).unwrap_or_else(|| "memory unknown".into());
            let sm = p.sm_utilization_pct.map(|s| format!(", SM {} %", fixed(s, 0))).unwrap_or_default();
            Some(format!("GPU {}: {memory}{sm}", g.index))
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}

fn gpu_card(gpu: GpuDevice, idle: Vec<GpuIdleAttribution>, windows: &IdleWindows) -> impl IntoView {
    let store = expect_context::<Store>();
    let interval = Signal::derive(move || store.interval_ms.get());
    let idle_charts = idle
        .iter()
        .map(|a| {
            let series = windows.series(a.job, a.gpu);
            let source = format!("job:{}/gpu:{}", a.job, a.gpu);
            view! {
                <div class="gpu-idle-chart" data-job=a.job.to_string()>
                    <TimeSeriesChart title="Idle, by what the job was doing" unit=" %" y_max=100.0
                        series=Signal::derive(move || series.clone()) interval_ms=interval source />
                </div>
            }
        })
        .collect_any();
    let memory_pct = ratio(gpu.memory_used_bytes.map(|b| b as f64), gpu.memory_total_bytes.map(|b| b as f64));
    let power_pct = ratio(gpu.power_draw_w, gpu.power_limit_w);
    let throttled = gpu.throttle_reasons.as_ref().is_some_and(|r| r.iter().any(|r| *r != ThrottleReason::GpuIdle));
    let lost = gpu.unsupported.get("gpu").cloned();
    let processes = gpu.processes.clone();
    view! {
        <article class="gpu-card" data-gpu-index=gpu.index.to_string() data-gpu-uuid=gpu.uuid.clone()>
            <div class="kernel-head">
                <b class="kernel-id">{format!("GPU {} · {}", gpu.index, gpu.name)}</b>
                <span class="muted" title=gpu.uuid.clone()>{format!("{} · {}", gpu.pci_bus_id, gpu.performance_state.clone().unwrap_or_default())}</span>
            </div>
            {lost.map(|why| view! { <div class="kernel-error" role="alert">{format!("Lost: {why}")}</div> })}
            {gpu.xids.last().cloned().map(|x| {
                let meaning = x.description.clone().unwrap_or_else(|| "see NVIDIA's XID catalogue".into());
                view! {
                    <div class="kernel-error gpu-xid" role="alert" title=meaning.clone()>
                        {format!("XID {} ({meaning}); {} since ringsided started", x.code, gpu.xid_count)}
                    </div>
                }
            })}
            <div class="kernel-stats">
                <div>
                    <span class="stat-label">"Utilisation · memory"</span>
                    {figure(&gpu, "utilization_gpu_pct", gpu.utilization_gpu_pct, |v| format!("{} %", fixed(v, 0)))}
                    {bar(gpu.utilization_gpu_pct)}
                    {figure(&gpu, "utilization_memory_pct", gpu.utilization_memory_pct, |v| format!("memory {} %", fixed(v, 0)))}
                </div>
                <div>
                    <span class="stat-label">"Memory"</span>
                    {figure(&gpu, "memory_used_bytes", gpu.memory_used_bytes, |used| {
                        format!("{} of {}", bytes(used), gpu.memory_total_bytes.map(bytes).unwrap_or_else(|| "–".into()))
                    })}
                    {bar(memory_pct)}
                </div>
                <div>
                    <span class="stat-label">"Power · limit"</span>
                    {figure(&gpu, "power_draw_w", gpu.power_draw_w, |w| {
                        format!("{} W of {}", fixed(w, 0), gpu.power_limit_w.map(|l| format!("{} W", fixed(l, 0))).unwrap_or_else(|| "–".into()))
                    })}
                    {bar(power_pct)}
                </div>
                <div>
                    <span class="stat-label">"Temperature · HBM"</span>
                    {figure(&gpu, "temperature_gpu_c", gpu.temperature_gpu_c, |c| match gpu.temperature_slowdown_c {
                        Some(slowdown) => format!("{c} °C, slows at {slowdown}"),
                        None => format!("{c} °C"),
                    })}
                    {figure(&gpu, "temperature_memory_c", gpu.temperature_memory_c, |c| format!("HBM {c} °C"))}
                </div>
                <div>
                    <span class="stat-label">"SM clock · max"</span>
                    {figure(&gpu, "sm_clock_mhz", gpu.sm_clock_mhz, |mhz| {
                        format!("{mhz} / {} MHz", gpu.sm_clock_max_mhz.map(|m| m.to_string()).unwrap_or_else(|| "–".into()))
                    })}
                </div>
                <div class=if throttled { "gpu-throttled" } else { "" }>
                    <span class="stat-label">"Clocks held down by"</span>
                    {figure(&gpu, "throttle_reasons", gpu.throttle_reasons.clone(), |r| throttle_text(&r))}
                </div>
                <div>
                    <span class="stat-label">"ECC corrected · uncorrected"</span>
                    {figure(&gpu, "ecc_corrected_volatile", gpu.ecc_corrected_volatile, |n| n.to_string())}
                    {figure(&gpu, "ecc_uncorrected_volatile", gpu.ecc_uncorrected_volatile, |n| format!(" · {n}"))}
                </div>
                <div>
                    <span class="stat-label">"Remapped rows"</span>
                    {figure(&gpu, "remapped_rows_correctable", gpu.remapped_rows_correctable, |n| {
                        let pending = if gpu.remapped_rows_pending == Some(true) { ", reset pending" } else { "" };
                        format!("{n} + {}{pending}", gpu.remapped_rows_uncorrectable.unwrap_or(0))
                    })}
                </div>
                <div>
                    <span class="stat-label">"PCIe tx · rx"</span>
                    {figure(&gpu, "pcie_tx_bytes_per_s", gpu.pcie_tx_bytes_per_s, |b| format!("{}/s", bytes(b)))}
                    {figure(&gpu, "pcie_rx_bytes_per_s", gpu.pcie_rx_bytes_per_s, |b| format!(" · {}/s", bytes(b)))}
                </div>
            </div>
            {idle.into_iter().map(idle_view).collect_any()}
            {history_chart(gpu.index)}
            {idle_charts}
            <table class="gpu-processes">
                <thead><tr><th>"pid"</th><th>"GPU memory"</th><th>"SM"</th></tr></thead>
                <tbody>
                    {if processes.is_empty() {
                        view! { <tr><td colspan="3" class="muted">"No compute processes."</td></tr> }.into_any()
                    } else {
                        processes
                            .into_iter()
                            .map(|p| {
                                view! {
                                    <tr data-pid=p.pid.to_string()>
                                        <td>{process_pid(&p)}</td>
                                        <td>{p.gpu_memory_bytes.map(bytes).unwrap_or_else(|| "–".into())}</td>
                                        <td>{p.sm_utilization_pct.map(|s| format!("{} %", fixed(s, 0))).unwrap_or_else(|| "–".into())}</td>
                                    </tr>
                                }
                            })
                            .collect_any()
                            .into_any()
                    }}
                </tbody>
            </table>
        </article>
    }
}

/// The utilisation of GPU `index` over the live history, as a sparkline path in 100 x 20.
fn sparkline(index: u32) -> impl IntoView {
    let store = expect_context::<Store>();
    let d = move || {
        store.history.with(|h| {
            let values: Vec<f64> = h
                .iter()
                .rev()
                .take(120)
                .filter_map(|p| p.gpus.iter().find(|g| g.index == index).and_then(|g| g.utilization_pct))
                .collect();
            let n = values.len().max(2) - 1;
            values
                .iter()
                .rev()
                .enumerate()
                .map(|(i, v)| {
                    let (x, y) = (i as f64 * 100.0 / n as f64, 20.0 - v.clamp(0.0, 100.0) / 5.0);
                    format!("{}{},{}", if i == 0 { 'M' } else { 'L' }, fixed(x, 1), fixed(y, 1))
                })
                .collect::<String>()
        })
    };
    view! {
        <svg class="sparkline" viewBox="0 0 100 20" preserveAspectRatio="none" aria-hidden="true">
            <path class="line s1" d=d />
        </svg>
    }
}

/// One GPU in a row: what nvitop shows of it, and its details (the card) on demand.
fn gpu_row(gpu: &GpuDevice, idle: &[GpuIdleAttribution], expanded: bool) -> impl IntoView {
    let timeline = expect_context::<crate::timeline::Timeline>();
    let index = gpu.index;
    let util = gpu.utilization_gpu_pct;
    let memory_pct = ratio(gpu.memory_used_bytes.map(|b| b as f64), gpu.memory_total_bytes.map(|b| b as f64));
    let gib = |b: u64| format!("{}", fixed(b as f64 / (1u64 << 30) as f64, 1));
    let memory = match (gpu.memory_used_bytes, gpu.memory_total_bytes) {
        (Some(used), Some(total)) => format!("{}/{} GiB", gib(used), gib(total)),
        _ => "–".into(),
    };
    let power = match (gpu.power_draw_w, gpu.power_limit_w) {
        (Some(w), Some(l)) => format!("{}/{} W", fixed(w, 0), fixed(l, 0)),
        (Some(w), None) => format!("{} W", fixed(w, 0)),
        _ => "–".into(),
    };
    let hot = matches!((gpu.temperature_gpu_c, gpu.temperature_slowdown_c), (Some(c), Some(s)) if c + 5 >= s);
    let temperature = match (gpu.temperature_gpu_c, gpu.temperature_slowdown_c) {
        (Some(c), Some(s)) => format!("{c} °C / {s}"),
        (Some(c), None) => format!("{c} °C"),
        _ => "–".into(),
    };
    let held: Vec<ThrottleReason> = gpu
        .throttle_reasons
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| *r != ThrottleReason::GpuIdle)
        .collect();
    let clocks = if held.is_empty() { "free".to_string() } else { throttle_text(&held) };
    let jobs: Vec<String> =
        idle.iter().map(|a| format!("{} ({}) idle {}%", a.comm, a.job, fixed(a.idle_pct, 0))).collect();
    let jobs = if jobs.is_empty() {
        let pids: Vec<String> = gpu.processes.iter().map(|p| p.pid.to_string()).collect();
        if pids.is_empty() {
            "–".to_string()
        } else {
            format!("pid {}", pids.join(", "))
        }
    } else {
        jobs.join("; ")
    };
    let xid = gpu.xids.last().map(|x| {
        view! { <span class="gpu-xid badge-critical" title=x.description.clone().unwrap_or_default()>{format!("XID {}", x.code)}</span> }
    });
    let lost = gpu.unsupported.contains_key("gpu");
    let toggle = move |_| {
        if expanded {
            timeline.gpu.set(None);
        } else {
            timeline.panel.set(Some("gpus".into()));
            timeline.gpu.set(Some(index));
        }
    };
    view! {
        <tr class=if lost { "gpu-row gpu-lost" } else { "gpu-row" } data-gpu-index=index.to_string()>
            <th scope="row">
                <b>{format!("GPU {index}")}</b>" "<span class="muted small">{gpu.name.clone()}</span>" "{xid}
            </th>
            <td class="num">{util.map(|u| format!("{} %", fixed(u, 0))).unwrap_or_else(|| "–".into())}{bar(util)}</td>
            <td class="num">{memory}{bar(memory_pct)}</td>
            <td class="num">{power}</td>
            <td class=if hot { "num gpu-hot" } else { "num" }>{temperature}</td>
            <td class=if held.is_empty() { "" } else { "gpu-throttled" }>{clocks}</td>
            <td class="small">{jobs}</td>
            <td>{sparkline(index)}</td>
            <td>
                <button class="ghost gpu-details-toggle" aria-expanded=expanded.to_string()
                    aria-label=format!("{} of GPU {index}", if expanded { "Hide details" } else { "Details" }) on:click=toggle>
                    {if expanded { "Hide details" } else { "Details" }}
                </button>
            </td>
        </tr>
    }
}

#[component]
pub fn GpusPanel() -> impl IntoView {
    let store = expect_context::<Store>();
    let timeline = expect_context::<crate::timeline::Timeline>();
    // Each job's GPU idle attribution over time, for the charts of the cards opened.
    let windows = StoredValue::new_local(IdleWindows::default());
    let body = move || {
        let selected = timeline.gpu.get();
        store.readings.with(|r| match &r.gpus {
            None => view! { <p class="empty">"The GPU source is off ([gpu] mode = \"off\")."</p> }.into_any(),
            Some(GpuTelemetry { available: false, reason, .. }) => view! {
                <p class="empty" id="gpus-unavailable">{format!("No GPU telemetry: {}", reason.as_deref().unwrap_or("NVML did not answer"))}</p>
            }
            .into_any(),
            Some(t) => {
                let versions = format!(
                    "driver {} · CUDA {}",
                    t.driver_version.as_deref().unwrap_or("–"),
                    t.cuda_driver_version.as_deref().unwrap_or("–")
                );
                windows.update_value(|w| w.observe(&t.idle));
                let rows = t
                    .devices
                    .iter()
                    .map(|gpu| {
                        // Why this GPU sat idle, per job on it, from the daemon's attribution.
                        let idle: Vec<GpuIdleAttribution> = t.idle.iter().filter(|a| a.uuid == gpu.uuid).cloned().collect();
                        let expanded = selected == Some(gpu.index);
                        let row = gpu_row(gpu, &idle, expanded);
                        let details = expanded.then(|| view! {
                            <tr class="gpu-details"><td colspan="9">{windows.with_value(|w| gpu_card(gpu.clone(), idle, w))}</td></tr>
                        });
                        view! { {row}{details} }
                    })
                    .collect_any();
                view! {
                    <p class="muted">{versions}</p>
                    <table class="gpu-rows">
                        <thead><tr>
                            <th scope="col">"GPU"</th><th scope="col">"Util"</th><th scope="col">"Memory"</th>
                            <th scope="col">"Power"</th><th scope="col">"Temp / slowdown"</th><th scope="col">"Clocks held by"</th>
                            <th scope="col">"Job · GPU idle"</th><th scope="col">"Last 2 min"</th><th scope="col"><span class="sr-only">"Details"</span></th>
                        </tr></thead>
                        <tbody>{rows}</tbody>
                    </table>
                }
                .into_any()
            }
        })
    };
    view! {
        <section class="panel" id="gpus-panel">
            <h2>"GPUs"</h2>
            {body}
        </section>
    }
}

/// Why the GPU sat idle for one job: the words, and a bar of the window (idle time by what the
/// job was doing, coloured as the scheduler's phases; the rest, busy, left blank).
fn idle_view(a: GpuIdleAttribution) -> impl IntoView {
    let mut parts: Vec<(String, &str, f64)> = Phase::ALL
        .iter()
        .map(|p| (format!("phase phase-{}", p.as_str()), p.as_str(), a.idle_by_phase_pct.get(*p)))
        .collect();
    parts.push(("phase phase-cpu_wait".into(), "waiting_for_cpu", a.idle_waiting_for_cpu_pct));
    let method = if a.aligned { "NVML samples laid over the phase timeline" } else { "per-tick estimate" };
    let words = format!("{} (pid {}): {}", a.comm, a.job, a.describe());
    let step = a.last_step.as_ref().map(|s| view! { <div class="gpu-step-idle small muted">{s.describe()}</div> });
    view! {
        <div class="gpu-idle small" title=method>{words}</div>
        {step}
        <div class="phase-bar idle-bar" role="img" aria-label="idle time by what the job was doing">
            {parts
                .into_iter()
                .filter(|(_, _, pct)| *pct > 0.0)
                .map(|(class, name, pct)| view! {
                    <span class=class data-phase=name style=format!("width: {}%", fixed(pct, 2)) title=format!("idle, {name}: {} %", fixed(pct, 1))></span>
                })
                .collect_any()}
        </div>
    }
}

/// "4242", or "4242 (7 in its container)" for a process in a PID namespace of its own.
pub fn process_pid(p: &ringside_shared::GpuProcess) -> String {
    match p.namespace_pid {
        Some(inner) => format!("{} ({inner} in its container)", p.pid),
        None => p.pid.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_joined_to_its_gpus_by_pid() {
        use ringside_shared::GpuProcess;
        let process = |pid, memory, sm| GpuProcess {
            pid,
            gpu_memory_bytes: memory,
            sm_utilization_pct: sm,
            memory_utilization_pct: None,
            namespace_pid: None,
        };
        let gpus = GpuTelemetry {
            devices: vec![
                GpuDevice {
                    index: 0,
                    processes: vec![process(7, Some(552 << 20), Some(72.0))],
                    ..GpuDevice::default()
                },
                GpuDevice {
                    index: 1,
                    processes: vec![process(9, None, None), process(7, Some(1 << 30), None)],
                    ..GpuDevice::default()
                },
            ],
            ..GpuTelemetry::default()
        };
        assert_eq!(gpu_use_of(7, &gpus).as_deref(), Some("GPU 0: 552 MiB, SM 72 %; GPU 1: 1.0 GiB"));
        assert_eq!(gpu_use_of(9, &gpus).as_deref(), Some("GPU 1: memory unknown"));
        assert_eq!(gpu_use_of(8, &gpus), None);
        assert_eq!(process_pid(&process(7, None, None)), "7");
        assert_eq!(
            process_pid(&GpuProcess { namespace_pid: Some(1), ..process(7, None, None) }),
            "7 (1 in its container)"
        );
    }

    #[test]
    fn each_jobs_idle_on_each_gpu_is_kept_for_its_chart() {
        use crate::chart::LIVE_POINTS;
        let at = |job, gpu, until_ms, idle_pct| GpuIdleAttribution {
            job,
            gpu,
            until_ms,
            idle_pct,
            idle_waiting_for_cpu_pct: 5.0,
            ..GpuIdleAttribution::default()
        };
        let mut windows = IdleWindows::default();
        windows.observe(&[at(7, 1, 1_000, 60.0), at(9, 0, 1_000, 10.0)]);
        // The same window again adds nothing; a later one does.
        windows.observe(&[at(7, 1, 1_000, 60.0), at(9, 0, 1_000, 10.0)]);
        windows.observe(&[at(7, 1, 2_000, 50.0)]);
        let series = windows.series(7, 1);
        assert_eq!(series[0].points, vec![(1_000, 60.0), (2_000, 50.0)]);
        assert_eq!(series[4].points, vec![(1_000, 5.0), (2_000, 5.0)]);
        let keys: Vec<_> = series.iter().map(|s| s.history.clone().unwrap().0).collect();
        assert_eq!(keys[0], "job.gpu_idle_pct@job:7/gpu:1");
        assert_eq!(keys[4], "job.gpu_idle_waiting_for_cpu_pct@job:7/gpu:1");
        // Job 9 left GPU 0: forgotten.
        assert!(windows.series(9, 0).iter().all(|s| s.points.is_empty()));
        for _ in 0..LIVE_POINTS + 5 {
            let last = windows.series(7, 1)[0].points.last().unwrap().0;
            windows.observe(&[at(7, 1, last + 1_000, 1.0)]);
        }
        assert_eq!(windows.series(7, 1)[0].points.len(), LIVE_POINTS);
    }

    #[test]
    fn throttle_reasons_read_as_words() {
        assert_eq!(throttle_text(&[]), "none: running free");
        assert_eq!(
            throttle_text(&[ThrottleReason::SwPowerCap, ThrottleReason::HwSlowdown]),
            "sw power cap, hw slowdown"
        );
    }
}
