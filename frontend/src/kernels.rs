//! The ring kernels panel: one card per kernel with its state, backend, throughput, drop rate,
//! queue depths, a `stats` kernel's result, last error, and its latency percentiles over time.

use leptos::prelude::*;
use ringside_shared::{KernelBackend, KernelState, KernelStatsOutput, RingKernelMetrics, StatsInput, StatsUnit};

use crate::chart::{Series, TimeSeriesChart};
use crate::format::{age, fixed, micros};
use crate::store::Store;

fn state_class(state: KernelState) -> &'static str {
    match state {
        KernelState::Active => "kstate kstate-active",
        KernelState::Created | KernelState::Launched | KernelState::Deactivated => "kstate kstate-idle",
        KernelState::Terminating | KernelState::Terminated => "kstate kstate-stopped",
        KernelState::Failed => "kstate kstate-failed",
    }
}

/// A `stats` kernel's result: what it summarises and the summary.
fn output_stats(stats: KernelStatsOutput) -> impl IntoView {
    let what = match stats.input {
        StatsInput::RunqLatency => "Run-queue latency of ML threads",
        StatsInput::CpuUtilization => "Per-CPU utilisation",
    };
    let unit = match stats.unit {
        StatsUnit::Us => " µs",
        StatsUnit::Pct => " %",
    };
    let value = |v: f64| format!("{}{unit}", fixed(v, 1));
    view! {
        <div class="kernel-output" data-output="stats">
            <span class="stat-label">{format!("{what} (computed by the kernel)")}</span>
            <b>{format!("p50 {} · p90 {} · p99 {} · max {}", value(stats.p50), value(stats.p90), value(stats.p99), value(stats.max))}</b>
            <span class="muted">{format!("{} samples, mean {}", stats.count, value(stats.mean))}</span>
        </div>
    }
}

#[component]
fn KernelCard(id: String) -> impl IntoView {
    let store = expect_context::<Store>();
    let interval = Signal::derive(move || store.interval_ms.get());
    let kernel_id = id.clone();
    let metrics = Memo::new(move |_| store.readings.with(|r| r.kernel(&kernel_id).cloned()));
    let window_id = id.clone();
    let window =
        Memo::new(move |_| store.readings.with(|r| r.window.kernels.iter().find(|k| k.id == window_id).cloned()));
    let chart_id = id.clone();
    let latency = Signal::derive(move || {
        let pick = |which: fn(&ringside_shared::KernelPoint) -> Option<u64>| -> Vec<(u64, f64)> {
            store.history.with(|h| {
                h.iter()
                    .filter_map(|p| {
                        let k = p.kernels.iter().find(|k| k.id == chart_id)?;
                        which(k).map(|ns| (p.t_ms, ns as f64 / 1000.0))
                    })
                    .collect()
            })
        };
        vec![
            Series::new("p50", "s1", pick(|k| k.p50_ns))
                .kept_as(format!("kernel.latency_p50_ns@kernel:{chart_id}"), 1e-3),
            Series::new("p99", "s2", pick(|k| k.p99_ns))
                .kept_as(format!("kernel.latency_p99_ns@kernel:{chart_id}"), 1e-3),
        ]
    });
    let body = move || {
        metrics.get().map(|k: RingKernelMetrics| {
            let w = window.get();
            let throughput = w.as_ref().map(|w| format!("{} msg/s", fixed(w.throughput_per_s, 0))).unwrap_or_else(|| "–".into());
            let window_drops = w
                .as_ref()
                .and_then(|w| w.drop_rate)
                .map(|r| format!("{} % now", fixed(r * 100.0, 2)))
                .unwrap_or_else(|| "no traffic now".into());
            let backend = match k.backend {
                KernelBackend::Cpu => "CPU",
                KernelBackend::Cuda => "CUDA",
            };
            let queue = |depth: u32, capacity: u32| {
                let pct = if capacity == 0 { 0.0 } else { f64::from(depth) * 100.0 / f64::from(capacity) };
                view! {
                    <span class="bar"><span class="fill" style=format!("width: {}%", fixed(pct, 1))></span></span>
                    <span class="cpu-value">{format!("{depth}/{capacity}")}</span>
                }
            };
            view! {
                <div class="kernel-head">
                    <b class="kernel-id">{k.id.clone()}</b>
                    <span class="muted">{format!("{} · {backend} · up {}", k.kernel, age(k.uptime_ms))}</span>
                    <span class=state_class(k.state)>{k.state.as_str()}</span>
                </div>
                <div class="kernel-stats">
                    <div><span class="stat-label">"Throughput"</span><b>{throughput}</b></div>
                    <div><span class="stat-label">"Processed"</span><b>{k.messages_processed.to_string()}</b></div>
                    <div><span class="stat-label">"Dropped"</span><b>{format!("{} ({} %)", k.messages_dropped, fixed(k.drop_rate * 100.0, 2))}</b><span class="muted">{window_drops}</span></div>
                    <div><span class="stat-label">"Latency p50 · p99 · max"</span><b>{format!("{} · {} · {}", micros(k.latency_p50_ns), micros(k.latency_p99_ns), micros(Some(k.max_latency_ns).filter(|_| k.messages_processed > 0)))}</b></div>
                </div>
                <div class="queues">
                    <span class="cpu-label">"in"</span>{queue(k.input_queue_depth, k.input_queue_capacity)}
                    <span class="cpu-label">"out"</span>{queue(k.output_queue_depth, k.output_queue_capacity)}
                </div>
                {k.output_stats.clone().map(output_stats)}
                {k.last_error.clone().map(|e| view! { <div class="kernel-error" role="alert">{format!("Last error: {e}")}</div> })}
            }
        })
    };
    view! {
        <article class="kernel-card" data-kernel-id=id.clone()>
            {body}
            <TimeSeriesChart title="Latency, enqueue to completion" unit=" µs" series=latency interval_ms=interval source=format!("kernel:{id}") />
        </article>
    }
}

#[component]
pub fn KernelsPanel() -> impl IntoView {
    let store = expect_context::<Store>();
    let ids = Memo::new(move |_| store.readings.with(|r| r.kernels.iter().map(|k| k.id.clone()).collect::<Vec<_>>()));
    view! {
        <section class="panel" id="kernels-panel">
            <h2>"Ring kernels"</h2>
            <Show
                when=move || !ids.get().is_empty()
                fallback=|| view! { <p class="empty">"No ring kernels run on this node. Add [[kernels]] to the config to run some."</p> }
            >
                <div class="kernel-cards">
                    <For each=move || ids.get() key=|id| id.clone() children=|id| view! { <KernelCard id /> } />
                </div>
            </Show>
        </section>
    }
}
