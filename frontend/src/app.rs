//! The console's root: the app, its header, theme toggle and connection banner, and the host
//! and daemon panels; the other panels live in their own modules.

use leptos::prelude::*;
use ringside_shared::ComponentStatus;

use crate::chart::{format_value, Series, TimeSeriesChart};
use crate::connection::{Link, LinkHandle};
use crate::format::{bytes, fixed};
use crate::store::{storage, Connection, Store};
use crate::CollectAny;

#[component]
pub fn App() -> impl IntoView {
    let store = Store::new();
    provide_context(store);
    // The socket lives on the browser's one thread: stored locally, shared through a handle.
    let link: LinkHandle = StoredValue::new_local(Link::start(store));
    provide_context(link);
    provide_context(crate::timeline::Timeline::start());
    view! {
        <Header />
        <ConnectionBanner />
        <ServerErrorBanner />
        <crate::timeline::RangeBar />
        <main>
            <HostPanel />
            <crate::alerts::AlertsPanel />
            <BelowTheFirstScreen />
            <ComponentsPanel />
        </main>
        <footer>"Ringside · "<a href="/metrics">"Prometheus metrics"</a>" · "<a href="/api/snapshot">"Snapshot JSON"</a></footer>
    }
}

/// The panels below the first screen, in a WebAssembly module of their own, so the header, host
/// and alerts do not wait for the bytes of the scheduler, GPU and ring kernel panels. The browser
/// fetches it once the first update has arrived (or after `BELOW_AT_THE_LATEST`, where none
/// comes): over a slow link, fetched at once, it took its share of the link from that first
/// update. A module that did not arrive is said so in their place, with a button to fetch it again.
#[component]
fn BelowTheFirstScreen() -> impl IntoView {
    const BELOW_AT_THE_LATEST: std::time::Duration = std::time::Duration::from_secs(3);
    let store = expect_context::<Store>();
    let waited = RwSignal::new(false);
    set_timeout(move || waited.set(true), BELOW_AT_THE_LATEST);
    // Once asked for, for good: a reconnection that starts the updates over changes nothing.
    let fetch = Memo::new(move |was: Option<&bool>| was == Some(&true) || waited.get() || store.seq.get() > 0);
    let attempt = RwSignal::new(0u32);
    move || {
        attempt.track();
        fetch.get().then(|| {
            Suspend::new(async move {
                below_the_first_screen().await.unwrap_or_else(|_| {
                    view! {
                        <div class="banner banner-error" id="below-failed" role="alert">
                            <span>"The scheduler, GPU and ring kernel panels did not load."</span>
                            <button class="ghost" on:click=move |_| attempt.update(|n| *n += 1)>"Try again"</button>
                        </div>
                    }
                    .into_any()
                })
            })
        })
    }
}

#[leptos::wasm_split::wasm_split(below, wasm_split_path = ::leptos::wasm_split, fallible)]
fn below_the_first_screen() -> Result<AnyView, leptos::wasm_split::SplitLoaderError> {
    // Once they are drawn: the moment for `cargo xtask bench console`, and a view whose address
    // names one of these panels (or a GPU, or a job) is scrolled to it now that it exists.
    Effect::new(|_| {
        crate::mark("ringside-panels");
        expect_context::<crate::timeline::Timeline>().drawn();
    });
    Ok(view! {
        <crate::scheduler::SchedulerPanel />
        <crate::gpus::GpusPanel />
        <crate::kernels::KernelsPanel />
    }
    .into_any())
}

/// Auto follows the system; the choice is remembered in local storage.
#[component]
fn ThemeToggle() -> impl IntoView {
    let theme = expect_context::<crate::timeline::Timeline>().theme;
    Effect::new(move |_| {
        let value = theme.get();
        if let Some(root) = document().document_element() {
            let _ = root.set_attribute("data-theme", &value);
        }
        if let Some(s) = storage() {
            let _ = s.set_item("ringside-theme", &value);
        }
    });
    let next = move |_| {
        theme.update(|t| {
            *t = match t.as_str() {
                "auto" => "dark",
                "dark" => "light",
                _ => "auto",
            }
            .to_string()
        })
    };
    view! {
        <button class="ghost" id="theme-toggle" title="Switch theme: auto, dark, light" on:click=next>
            {move || format!("Theme: {}", theme.get())}
        </button>
    }
}

/// Ends this browser's session (`DELETE /api/sessions`), then shows the sign-in page.
#[component]
fn SignOut() -> impl IntoView {
    let store = expect_context::<Store>();
    let sign_out = move |_| {
        if let Err(why) = end_session() {
            store.server_error.set(Some(format!("signing out failed: {why}")));
        }
    };
    view! {
        <button class="ghost" id="sign-out" title="End this browser's session on this node" on:click=sign_out>
            "Sign out"
        </button>
    }
}

/// Sends the sign-out request; the page reloads (to the sign-in page) once it is answered.
fn end_session() -> Result<(), String> {
    use wasm_bindgen::closure::Closure;
    let window = web_sys::window().ok_or("no window")?;
    let headers = web_sys::Headers::new().map_err(|e| crate::format::js_error(&e))?;
    // The daemon takes a cookie-authenticated change only as JSON from its own origin.
    headers.set("Content-Type", "application/json").map_err(|e| crate::format::js_error(&e))?;
    let init = web_sys::RequestInit::new();
    init.set_method("DELETE");
    init.set_headers(&headers);
    init.set_body(&wasm_bindgen::JsValue::from_str("{}"));
    let reload = Closure::<dyn FnMut(wasm_bindgen::JsValue)>::new(move |_| {
        if let Some(w) = web_sys::window() {
            let _ = w.location().reload();
        }
    });
    let _ = window.fetch_with_str_and_init("/api/sessions", &init).then2(&reload, &reload);
    // Called once, when the answer comes; the page then reloads, so it is never freed.
    reload.forget();
    Ok(())
}

#[component]
fn Header() -> impl IntoView {
    let store = expect_context::<Store>();
    let identity = move || {
        store.node.get().map(|n| {
            let gpus = if n.gpus.is_empty() { "no GPU".to_string() } else { format!("{} GPU", n.gpus.len()) };
            view! {
                <span class="hostname" id="hostname">{n.hostname.clone()}</span>
                <span class="facts">
                    {format!("{} · kernel {} · {} CPUs · {} NUMA node{} · {gpus} · ringsided {}",
                        n.os, n.kernel, n.cpus, n.numa_nodes, if n.numa_nodes == 1 { "" } else { "s" }, n.daemon_version)}
                </span>
            }
        })
    };
    let status = move || match store.connection.get() {
        Connection::Live => ("live", "Live".to_string()),
        Connection::Connecting { attempt } if attempt <= 1 => ("connecting", "Connecting…".to_string()),
        Connection::Connecting { attempt } => ("connecting", format!("Reconnecting (attempt {attempt})…")),
        Connection::Waiting { retry_in_s, .. } => ("down", format!("Offline · retry in {retry_in_s} s")),
    };
    view! {
        <header>
            <div class="brand">"Ringside"</div>
            <div class="identity">{identity}</div>
            <div class="header-actions">
                <crate::alerts::CriticalBadge />
                <span id="connection" class=move || format!("conn conn-{}", status().0)>{move || status().1}</span>
                <a id="download-snapshot" class="button" href="/api/snapshot?download=1" download="">"Download snapshot"</a>
                <ThemeToggle />
                <SignOut />
            </div>
        </header>
    }
}

#[component]
fn ConnectionBanner() -> impl IntoView {
    let store = expect_context::<Store>();
    move || match store.connection.get() {
        Connection::Waiting { attempt, retry_in_s, why } => Some(view! {
            <div class="banner banner-warn" role="status">
                {format!("Connection to the daemon lost: {why}. Retrying in {retry_in_s} s (attempt {attempt}); the data below is from before.")}
            </div>
        }),
        _ => None,
    }
}

#[component]
fn ServerErrorBanner() -> impl IntoView {
    let store = expect_context::<Store>();
    move || {
        store.server_error.get().map(|message| {
            view! {
                <div class="banner banner-error" role="alert">
                    <span>{format!("The daemon refused a request — {message}")}</span>
                    <button class="ghost" on:click=move |_| store.server_error.set(None)>"Dismiss"</button>
                </div>
            }
        })
    }
}

#[component]
fn Stat(label: &'static str, value: Signal<String>, #[prop(optional)] hint: Option<Signal<String>>) -> impl IntoView {
    view! {
        <div class="stat">
            <div class="stat-label">{label}</div>
            <div class="stat-value">{move || value.get()}</div>
            {hint.map(|h| view! { <div class="stat-hint">{move || h.get()}</div> })}
        </div>
    }
}

#[component]
fn HostPanel() -> impl IntoView {
    let store = expect_context::<Store>();
    let interval = Signal::derive(move || store.interval_ms.get());
    let series = move |pick: fn(&ringside_shared::HistoryPoint) -> f64, name: &'static str, class: &'static str| {
        Series::new(name, class, store.history.with(|h| h.iter().map(|p| (p.t_ms, pick(p))).collect()))
    };
    let cpu = Signal::derive(move || {
        vec![
            series(|p| p.cpu_pct, "busy", "s1").kept_as("host.cpu_utilization_pct@host", 1.0),
            series(|p| p.iowait_pct, "iowait", "s2").kept_as("host.iowait_pct@host", 1.0),
        ]
    });
    let memory =
        Signal::derive(
            move || vec![series(|p| p.mem_used_pct, "used", "s3").kept_as("host.memory_used_pct@host", 1.0)],
        );
    let load = Signal::derive(move || vec![series(|p| p.load1, "1 min", "s4").kept_as("host.load1@host", 1.0)]);

    let host = Memo::new(move |_| store.readings.with(|r| r.host.clone()));
    // The moment the console's first host figures are on screen (`cargo xtask bench console`
    // reads both marks: `ringside-live` is the page's first, the shell's where boot.js showed
    // the figures before the module ran).
    Effect::new(move |shown: Option<bool>| {
        if shown == Some(true) {
            return true;
        }
        let now = host.with(Option::is_some);
        if now {
            crate::mark("ringside-live");
            crate::mark("ringside-console");
        }
        now
    });
    let cpu_now = Signal::derive(move || {
        host.get().map(|h| format_value(h.cpu_utilization_pct, " %")).unwrap_or_else(|| "–".into())
    });
    let cpu_hint = Signal::derive(move || {
        let w = store.readings.with(|r| r.window.clone());
        match (w.cpu_avg_pct, w.cpu_max_pct) {
            (Some(avg), Some(max)) => {
                format!("avg {} % · max {} % over {} s", fixed(avg, 1), fixed(max, 1), w.covered_ms / 1000)
            }
            _ => "collecting…".into(),
        }
    });
    let mem_now = Signal::derive(move || {
        host.get()
            .map(|h| format!("{} of {}", bytes(h.memory.used_bytes), bytes(h.memory.total_bytes)))
            .unwrap_or_else(|| "–".into())
    });
    let mem_hint = Signal::derive(move || {
        host.get()
            .map(|h| format!("{} % used · swap {}", fixed(h.memory.used_pct, 1), bytes(h.memory.swap_used_bytes)))
            .unwrap_or_default()
    });
    let load_now = Signal::derive(move || {
        host.get()
            .map(|h| format!("{} · {} · {}", fixed(h.load1, 2), fixed(h.load5, 2), fixed(h.load15, 2)))
            .unwrap_or_else(|| "–".into())
    });
    let load_hint = Signal::derive(move || {
        host.get().map(|h| format!("{} running · {} blocked", h.procs_running, h.procs_blocked)).unwrap_or_default()
    });
    let pressure = Signal::derive(move || {
        host.get()
            .and_then(|h| h.pressure)
            .map(|p| {
                format!(
                    "cpu {} % · mem {} % · io {} %",
                    fixed(p.cpu_some_avg10, 1),
                    fixed(p.memory_some_avg10, 1),
                    fixed(p.io_some_avg10, 1)
                )
            })
            .unwrap_or_else(|| "not available".into())
    });
    let per_cpu = move || {
        host.get().map(|h| {
            h.per_cpu_utilization_pct
                .iter()
                .enumerate()
                .map(|(i, pct)| {
                    let width = format!("width: {}%", fixed(pct.clamp(0.0, 100.0), 1));
                    view! {
                        <div class="cpu-bar" title=format!("CPU {i}: {} %", fixed(*pct, 1))>
                            <span class="cpu-label">{format!("cpu{i}")}</span>
                            <span class="bar"><span class="fill" style=width></span></span>
                            <span class="cpu-value">{format!("{} %", fixed(*pct, 0))}</span>
                        </div>
                    }
                })
                .collect_any()
        })
    };
    view! {
        <section class="panel" id="host-panel">
            <h2>"Host"</h2>
            <div class="stats">
                <Stat label="CPU busy" value=cpu_now hint=cpu_hint />
                <Stat label="Memory" value=mem_now hint=mem_hint />
                <Stat label="Load (1 · 5 · 15 min)" value=load_now hint=load_hint />
                <Stat label="Pressure stalls (10 s)" value=pressure />
            </div>
            <div class="charts">
                <TimeSeriesChart title="CPU utilisation" unit=" %" y_max=100.0 series=cpu interval_ms=interval source="host" />
                <TimeSeriesChart title="Memory in use" unit=" %" y_max=100.0 series=memory interval_ms=interval source="host" />
                <TimeSeriesChart title="Load average" unit="" series=load interval_ms=interval source="host" />
            </div>
            <div class="per-cpu">{per_cpu}</div>
        </section>
    }
}

#[component]
fn ComponentsPanel() -> impl IntoView {
    let store = expect_context::<Store>();
    let rows = move || {
        store
            .components
            .get()
            .into_iter()
            .map(|c| {
                let (class, label) = match c.status {
                    ComponentStatus::Up => ("dot dot-up", "up"),
                    ComponentStatus::Degraded => ("dot dot-degraded", "degraded"),
                    ComponentStatus::Down => ("dot dot-down", "down"),
                    ComponentStatus::Absent => ("dot dot-absent", "absent"),
                };
                view! {
                    <li>
                        <span class=class></span>
                        <b>{c.name.clone()}</b>" "{label}
                        {c.detail.clone().map(|d| view! { <span class="detail">{format!(" — {d}")}</span> })}
                    </li>
                }
            })
            .collect_any()
    };
    view! {
        <section class="panel" id="components-panel">
            <h2>"Daemon"</h2>
            <ul class="components">{rows}</ul>
            <p class="muted">{move || format!("update #{} · every {} ms", store.seq.get(), store.interval_ms.get())}</p>
        </section>
    }
}
