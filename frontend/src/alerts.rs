//! The alerts the operator sees: the panel with its filters, one row per alert with its
//! history and the Acknowledge and Silence actions, the silences in force, and the header
//! badge for unacknowledged, unsilenced critical alerts.

use leptos::prelude::*;
use ringside_shared::protocol::{MAX_BY_CHARS, MAX_NOTE_CHARS};
use ringside_shared::{Alert, ClientCommand, Matcher, NewSilence, Severity, TransitionKind};

use crate::chart::clock;
use crate::connection::LinkHandle;
use crate::format::{age, bytes};
use crate::store::storage;
use crate::store::Store;
use crate::CollectAny;

/// Local-storage key of the name sent with acknowledgements.
const OPERATOR_KEY: &str = "ringside-operator";

#[derive(Debug, Clone, Copy, PartialEq)]
enum StateFilter {
    Active,
    Unacknowledged,
    Acknowledged,
    Resolved,
    All,
}

impl StateFilter {
    const ALL: [(StateFilter, &'static str, &'static str); 5] = [
        (StateFilter::Active, "active", "Active"),
        (StateFilter::Unacknowledged, "unacknowledged", "Unacknowledged"),
        (StateFilter::Acknowledged, "acknowledged", "Acknowledged"),
        (StateFilter::Resolved, "resolved", "Resolved"),
        (StateFilter::All, "all", "All"),
    ];

    fn from_value(value: &str) -> StateFilter {
        Self::ALL.iter().find(|(_, v, _)| *v == value).map(|(f, _, _)| *f).unwrap_or(StateFilter::Active)
    }

    fn keeps(self, alert: &Alert) -> bool {
        let acked = alert.acknowledgement.is_some();
        match self {
            StateFilter::Active => alert.is_active(),
            StateFilter::Unacknowledged => alert.is_active() && !acked,
            StateFilter::Acknowledged => acked,
            StateFilter::Resolved => !alert.is_active(),
            StateFilter::All => true,
        }
    }
}

fn severity_class(severity: Severity) -> &'static str {
    match severity {
        Severity::Info => "sev sev-info",
        Severity::Warning => "sev sev-warning",
        Severity::Error => "sev sev-error",
        Severity::Critical => "sev sev-critical",
    }
}

/// "3 critical unacknowledged" in the header, hidden when there are none.
#[component]
pub fn CriticalBadge() -> impl IntoView {
    let store = expect_context::<Store>();
    let count = Memo::new(move |_| {
        store.alerts.with(|alerts| {
            alerts
                .iter()
                .filter(|a| {
                    a.is_active()
                        && a.severity == Severity::Critical
                        && a.acknowledgement.is_none()
                        && a.silenced.is_none()
                })
                .count()
        })
    });
    move || {
        (count.get() > 0).then(|| {
            view! {
                <a id="critical-badge" class="badge-critical" href="#alerts-panel" title="Active critical alerts nobody has acknowledged or silenced">
                    {format!("{} critical unacknowledged", count.get())}
                </a>
            }
        })
    }
}

#[component]
fn AlertHistory(alert: Alert) -> impl IntoView {
    let count = alert.transitions.len();
    let rows = alert
        .transitions
        .into_iter()
        .rev()
        .map(|t| {
            let who = match (t.kind, &t.by, &t.note) {
                (TransitionKind::Acknowledged, Some(by), Some(note)) => format!(" by {by}: “{note}”"),
                (TransitionKind::Acknowledged, Some(by), None) => format!(" by {by}"),
                _ => String::new(),
            };
            view! {
                <li>
                    <time>{clock(t.at_ms)}</time>" "
                    <b>{t.kind.as_str()}</b>
                    {format!(" · {} · value {}{who}", t.severity.as_str(), crate::chart::format_value(t.value, ""))}
                </li>
            }
        })
        .collect_any();
    view! {
        <details class="history">
            <summary>{format!("History ({count})")}</summary>
            <ol class="transitions">{rows}</ol>
        </details>
    }
}

/// The operator's name for acknowledgements and silences (*Acknowledge as*), if set.
fn operator_name() -> Option<String> {
    storage().and_then(|s| s.get_item(OPERATOR_KEY).ok().flatten()).filter(|n| !n.is_empty())
}

/// Who acknowledged the alert, or the form to acknowledge it (operators only).
#[component]
fn AckAction(alert: Alert, pending: RwSignal<bool>) -> impl IntoView {
    let store = expect_context::<Store>();
    let link = expect_context::<LinkHandle>();
    let id = alert.id;
    let note = RwSignal::new(String::new());
    let acknowledge = move |_| {
        let text = note.get_untracked();
        let note = Some(text.trim().to_string()).filter(|n| !n.is_empty());
        let command = ClientCommand::AckAlert { id, note, by: operator_name() };
        if link.with_value(|link| link.send(&command)) {
            pending.set(true);
        } else {
            store.server_error.set(Some("not connected: the acknowledgement was not sent; try again once live".into()));
        }
    };
    match alert.acknowledgement {
        Some(ack) => {
            let now = store.server_time_ms;
            let note = ack.note.clone().map(|n| format!(" — “{n}”")).unwrap_or_default();
            let via = if ack.by == ack.token { String::new() } else { format!(" (token {})", ack.token) };
            view! {
                <div class="acked" data-acked="true">
                    {move || format!("Acknowledged by {}{via} {} ago{note}", ack.by, age(now.get().saturating_sub(ack.at_ms)))}
                </div>
            }
            .into_any()
        }
        None if store.can_acknowledge() => view! {
            <div class="ack-form">
                <input class="ack-note" type="text" placeholder="note (optional)" maxlength=MAX_NOTE_CHARS.to_string()
                    prop:value=move || note.get() on:input=move |ev| note.set(event_target_value(&ev)) />
                <button class="ack" data-alert-id=id.to_string() disabled=move || pending.get() on:click=acknowledge>
                    {move || if pending.get() { "Acknowledging…" } else { "Acknowledge" }}
                </button>
            </div>
        }
        .into_any(),
        None => view! { <div class="muted read-only">"Not acknowledged · this token is read-only"</div> }.into_any(),
    }
}

/// What silences the alert, or the buttons to silence it (operators, active alerts only).
#[component]
fn SilenceAction(alert: Alert, pending: RwSignal<bool>) -> impl IntoView {
    let store = expect_context::<Store>();
    let link = expect_context::<LinkHandle>();
    let id = alert.id;
    let silence = move |label: &'static str, duration_ms: Option<u64>| {
        let command = ClientCommand::CreateSilence(NewSilence {
            matchers: vec![Matcher::new("alert_id", &id.to_string())],
            starts_at_ms: None,
            ends_at_ms: None,
            duration_ms,
            until_resolved: duration_ms.is_none(),
            comment: format!("silenced from the console {label}"),
            by: operator_name(),
        });
        if link.with_value(|link| link.send(&command)) {
            pending.set(true);
        } else {
            store.server_error.set(Some("not connected: the silence was not sent; try again once live".into()));
        }
    };
    match alert.silenced.clone() {
        Some(silenced) => {
            let until = match silenced.until_ms {
                Some(until) => format!("until {}", clock(until)),
                None => "until it resolves".to_string(),
            };
            let what = match &silenced.maintenance {
                Some(window) => format!("Silenced by maintenance window {window} {until}"),
                None => format!("Silenced by {} {until} (silence #{})", silenced.by, silenced.silence_id),
            };
            let comment =
                if silenced.comment.is_empty() { String::new() } else { format!(" — “{}”", silenced.comment) };
            view! { <div class="silenced" data-silenced="true">{what}{comment}</div> }.into_any()
        }
        None if alert.is_active() && store.can_acknowledge() => view! {
            <div class="silence-actions">
                "Silence: "
                <button class="silence" data-silence="1h" disabled=move || pending.get()
                    on:click=move |_| silence("for 1 h", Some(3_600_000))>"1 h"</button>
                <button class="silence" data-silence="4h" disabled=move || pending.get()
                    on:click=move |_| silence("for 4 h", Some(4 * 3_600_000))>"4 h"</button>
                <button class="silence" data-silence="resolved" disabled=move || pending.get()
                    on:click=move |_| silence("until resolved", None)>"until resolved"</button>
            </div>
        }
        .into_any(),
        None => ().into_any(),
    }
}

/// What the notification log says of alert `id` (the console's latest entries).
fn notified(log: &[ringside_shared::Notification], id: u64) -> Option<String> {
    let mine: Vec<_> = log.iter().filter(|n| n.alerts.iter().any(|a| a.id == id)).collect();
    let last = mine.first()?;
    let failed = mine.iter().filter(|n| !n.ok).count();
    let what = if last.ok { "taken" } else { "failed" };
    Some(format!(
        "Alertmanager: {} batch(es), {failed} failed; last {} {what} ({})",
        mine.len(),
        clock(last.at_ms),
        last.outcome
    ))
}

#[component]
fn AlertRow(alert: Alert) -> impl IntoView {
    let store = expect_context::<Store>();
    let id = alert.id;
    let pending = RwSignal::new(false);
    let raised_at = alert.raised_at_ms;
    let resolved_at = alert.resolved_at_ms;
    let ago = move || {
        let now = store.server_time_ms.get();
        match resolved_at {
            Some(r) => format!(
                "raised {} ago · resolved {} ago",
                age(now.saturating_sub(raised_at)),
                age(now.saturating_sub(r))
            ),
            None => format!("raised {} ago", age(now.saturating_sub(raised_at))),
        }
    };
    let flags = match (alert.occurrence, alert.flapping) {
        (n, true) => format!(" · flapping, fired {n} times"),
        (n, false) if n > 1 => format!(" · occurrence {n}"),
        _ => String::new(),
    };
    let notified = move || store.notifications.with(|log| notified(log, id));
    // The alert's incident bundles: recording (until when), or kept with their downloads.
    let incidents = move || {
        store
            .incidents
            .with(|all| all.iter().filter(|i| i.alert_id == id).map(|i| incident_line(i, false)).collect_any())
    };
    let class = match (alert.is_active(), alert.silenced.is_some()) {
        (true, false) => "alert",
        (true, true) => "alert silenced-alert",
        (false, _) => "alert resolved",
    };
    view! {
        <li class=class data-alert-id=id.to_string()>
            <span class=severity_class(alert.severity)>{alert.severity.as_str()}</span>
            <div class="alert-body">
                <div class="alert-message">{alert.message.clone()}</div>
                <div class="alert-meta">{format!("{} · {} · #{id}{flags} · ", alert.name(), alert.source)}{ago}</div>
                <SilenceAction alert=alert.clone() pending=pending />
                <AckAction alert=alert.clone() pending=pending />
                {move || notified().map(|text| view! { <div class="notified muted">{text}</div> })}
                {incidents}
                <AlertHistory alert=alert.clone() />
            </div>
        </li>
    }
}

#[component]
pub fn AlertsPanel() -> impl IntoView {
    let store = expect_context::<Store>();
    let state_filter = RwSignal::new(StateFilter::Active);
    let min_severity = RwSignal::new(Severity::Info);
    let shown = Memo::new(move |_| {
        let (keep, floor) = (state_filter.get(), min_severity.get());
        store
            .alerts
            .with(|alerts| alerts.iter().filter(|a| keep.keeps(a) && a.severity >= floor).cloned().collect::<Vec<_>>())
    });
    let active_count = Memo::new(move |_| store.alerts.with(|a| a.iter().filter(|a| a.is_active()).count()));
    // Keyed by what a row shows, so a row is rebuilt exactly when its alert changed.
    let key = |a: &Alert| {
        (
            a.id,
            a.updated_at_ms,
            a.acknowledgement.is_some(),
            a.transitions.len(),
            a.resolved_at_ms,
            a.silenced.clone().map(|s| s.silence_id),
        )
    };

    let operator = RwSignal::new(storage().and_then(|s| s.get_item(OPERATOR_KEY).ok().flatten()).unwrap_or_default());
    let rename = move |event: web_sys::Event| {
        let name = event_target_value(&event);
        if let Some(s) = storage() {
            let _ = s.set_item(OPERATOR_KEY, name.trim());
        }
        operator.set(name);
    };
    let empty_text = move || {
        match (state_filter.get(), min_severity.get()) {
        (StateFilter::Active, Severity::Info) => {
            "No active alerts. Alerts appear here when a threshold or a rule is crossed: memory pressure, kernel drop rate, latency, full queues, errors.".to_string()
        }
        _ => "No alert matches these filters.".to_string(),
    }
    };
    let state_options = StateFilter::ALL
        .iter()
        .map(|(filter, value, label)| view! { <option value=*value selected=*filter == StateFilter::Active>{*label}</option> })
        .collect_any();
    let severity_options = Severity::ALL
        .iter()
        .map(|s| {
            let label =
                if *s == Severity::Info { "Any severity".to_string() } else { format!("{} and above", s.as_str()) };
            view! { <option value=s.as_str()>{label}</option> }
        })
        .collect_any();
    view! {
        <section class="panel" id="alerts-panel">
            <div class="panel-head">
                <h2>"Alerts " <span class="count">{move || active_count.get()}</span></h2>
                <Show when=move || store.can_acknowledge()>
                    <label class="operator">"Acknowledge as "
                        <input id="operator" type="text" placeholder="your name" maxlength=MAX_BY_CHARS.to_string()
                            prop:value=move || operator.get() on:change=rename />
                    </label>
                </Show>
            </div>
            <div class="filters">
                <select id="alert-state-filter" aria-label="Alert state"
                    on:change=move |ev| state_filter.set(StateFilter::from_value(&event_target_value(&ev)))>
                    {state_options}
                </select>
                <select id="alert-severity-filter" aria-label="Minimum severity"
                    on:change=move |ev| min_severity.set(Severity::parse(&event_target_value(&ev)).unwrap_or(Severity::Info))>
                    {severity_options}
                </select>
            </div>
            <Show when=move || !shown.get().is_empty() fallback=move || view! { <p class="empty" id="no-alerts">{empty_text}</p> }>
                <ul class="alerts" id="alert-list">
                    <For each=move || shown.get() key=key children=|alert| view! { <AlertRow alert /> } />
                </ul>
            </Show>
            <SilencesList />
            <IncidentsList />
        </section>
    }
}

/// An incident bundle: recording until when, or its size, span and downloads (JSON and Chrome
/// trace). `with_alert` says which alert it is of (in the list of every bundle).
fn incident_line(i: &ringside_shared::IncidentSummary, with_alert: bool) -> impl IntoView {
    let json = format!("/api/incidents/{}?download=1", i.id);
    let trace = format!("/api/incidents/{}/trace?download=1", i.id);
    let what = if i.recording {
        format!("Incident bundle #{} recording until {}", i.id, clock(i.end_ms))
    } else {
        let cut = if i.complete { "" } else { ", cut short" };
        format!(
            "Incident bundle #{} ({}, {} to {}{cut}, {} threads)",
            i.id,
            bytes(i.bytes),
            clock(i.start_ms),
            clock(i.end_ms),
            i.threads
        )
    };
    let alert = with_alert.then(|| format!(" of alert #{} ({}): {}", i.alert_id, i.severity.as_str(), i.message));
    view! {
        <div class="incident" data-incident-id=i.id.to_string() data-recording=i.recording.to_string()>
            {what}{alert}" · "
            <a class="incident-json" href=json download="">"JSON"</a>
            " · "
            <a class="incident-trace" href=trace download="" title="Chrome trace event file: open it in ui.perfetto.dev">"trace"</a>
        </div>
    }
}

/// Every incident bundle kept or recording, newest first: also those of alerts no longer listed.
#[component]
fn IncidentsList() -> impl IntoView {
    let store = expect_context::<Store>();
    let rows = move || {
        store.incidents.with(|all| {
            all.iter().map(|i| view! { <li class="incident-row">{incident_line(i, true)}</li> }).collect_any()
        })
    };
    view! {
        <Show when=move || store.incidents.with(|i| !i.is_empty())>
            <h3>"Incident bundles"</h3>
            <ul class="incidents" id="incident-list">{rows}</ul>
        </Show>
    }
}

/// The silences in force or to come (maintenance windows in force included), with how many
/// active alerts each matches now and, for operators, Expire; then the last ended ones.
#[component]
fn SilencesList() -> impl IntoView {
    let store = expect_context::<Store>();
    let link = expect_context::<LinkHandle>();
    let rows = move || {
        let now = store.server_time_ms.get();
        let alerts = store.alerts.get();
        store
            .silences
            .get()
            .into_iter()
            .filter(|s| !s.is_over(now))
            .map(|s| {
                let matching = alerts
                    .iter()
                    .filter(|a| {
                        a.is_active()
                            && a.silenced
                                .as_ref()
                                .is_some_and(|x| x.silence_id == s.id && x.maintenance == s.maintenance)
                    })
                    .count();
                let matchers =
                    s.matchers.iter().map(|m| format!("{}={}", m.name, m.value)).collect::<Vec<_>>().join(", ");
                let matchers = if matchers.is_empty() { "every alert".to_string() } else { matchers };
                let until = match s.ends_at_ms {
                    Some(end) => format!("until {}", clock(end)),
                    None => "until resolved".to_string(),
                };
                let id = s.id;
                let expire = (s.maintenance.is_none() && store.can_acknowledge()).then(|| {
                    view! {
                        <button class="expire-silence" data-silence-id=id.to_string()
                            on:click=move |_| {
                                let command = ClientCommand::ExpireSilence { id, by: operator_name() };
                                if !link.with_value(|link| link.send(&command)) {
                                    store.server_error.set(Some("not connected: try again once live".into()));
                                }
                            }>"Expire"</button>
                    }
                });
                let who = match &s.maintenance {
                    Some(window) => format!("maintenance window {window}"),
                    None => format!("#{id} by {}", s.created_by),
                };
                view! {
                    <li class="silence-row" data-silence-id=id.to_string()>
                        {format!("{who} · {matchers} · {until} · silences {matching} active alert(s)")}
                        {(!s.comment.is_empty()).then(|| format!(" — “{}”", s.comment))}
                        " " {expire}
                    </li>
                }
            })
            .collect_any()
    };
    let any = move || {
        let now = store.server_time_ms.get();
        store.silences.with(|s| s.iter().any(|s| !s.is_over(now)))
    };
    view! {
        <Show when=any>
            <h3>"Silences"</h3>
            <ul class="silences" id="silence-list">{rows}</ul>
        </Show>
    }
}
