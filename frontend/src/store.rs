//! What the console knows about the node, updated from the server's messages in
//! [`Store::apply`]: the latest tick's readings in one signal (panels derive what they show from
//! it), and one signal for each list the user acts on (alerts, silences, incidents).

use leptos::prelude::*;
use ringside_shared::{Alert, ComponentHealth, HistoryPoint, NodeIdentity, Readings, Role, ServerMessage};
// Named apart from leptos' `Update` trait, which the prelude brings in.
use ringside_shared::Update as Tick;

/// Points kept for the charts when the server sends fewer.
const MIN_HISTORY: usize = 600;

#[derive(Debug, Clone, PartialEq)]
pub enum Connection {
    Connecting {
        attempt: u32,
    },
    Live,
    /// Lost; the next attempt starts in `retry_in_s` seconds.
    Waiting {
        attempt: u32,
        retry_in_s: u32,
        why: String,
    },
}

#[derive(Clone, Copy)]
pub struct Store {
    pub connection: RwSignal<Connection>,
    /// The token's name and role, from `hello`.
    pub identity: RwSignal<Option<(String, Role)>>,
    /// `[server] fleet_job_url`, from the hello.
    pub fleet_job_url: RwSignal<Option<String>>,
    pub node: RwSignal<Option<NodeIdentity>>,
    pub interval_ms: RwSignal<u64>,
    pub seq: RwSignal<u64>,
    /// The server's clock at the latest update: ages are measured against it, not the browser's.
    pub server_time_ms: RwSignal<u64>,
    pub components: RwSignal<Vec<ComponentHealth>>,
    /// The latest tick's readings; panels derive what they show from it.
    pub readings: RwSignal<Readings>,
    pub history: RwSignal<Vec<HistoryPoint>>,
    history_cap: RwSignal<usize>,
    pub alerts: RwSignal<Vec<Alert>>,
    /// Silences in force or to come, then recently ended ones.
    pub silences: RwSignal<Vec<ringside_shared::Silence>>,
    /// The latest batches sent to Alertmanager, newest first (at most [`NOTIFICATIONS_KEPT`]).
    pub notifications: RwSignal<Vec<ringside_shared::Notification>>,
    /// Incident bundles recording and kept, newest first.
    pub incidents: RwSignal<Vec<ringside_shared::IncidentSummary>>,
    /// The latest `error` frame, shown until dismissed.
    pub server_error: RwSignal<Option<String>>,
}

/// Notification log entries the console keeps.
const NOTIFICATIONS_KEPT: usize = 200;

impl Store {
    pub fn new() -> Self {
        Store {
            connection: RwSignal::new(Connection::Connecting { attempt: 1 }),
            identity: RwSignal::new(None),
            fleet_job_url: RwSignal::new(None),
            node: RwSignal::new(None),
            interval_ms: RwSignal::new(1000),
            seq: RwSignal::new(0),
            server_time_ms: RwSignal::new(0),
            components: RwSignal::new(Vec::new()),
            readings: RwSignal::new(Readings::default()),
            history: RwSignal::new(Vec::new()),
            history_cap: RwSignal::new(MIN_HISTORY),
            alerts: RwSignal::new(Vec::new()),
            silences: RwSignal::new(Vec::new()),
            notifications: RwSignal::new(Vec::new()),
            incidents: RwSignal::new(Vec::new()),
            server_error: RwSignal::new(None),
        }
    }

    pub fn can_acknowledge(&self) -> bool {
        self.identity.with(|i| i.as_ref().is_some_and(|(_, role)| *role == Role::Operator))
    }

    pub fn apply(&self, message: ServerMessage) {
        match message {
            ServerMessage::Hello(hello) => {
                self.identity.set(Some((hello.identity, hello.role)));
                self.node.set(Some(hello.node));
                self.interval_ms.set(hello.interval_ms);
                self.server_time_ms.set(hello.server_time_ms);
                self.fleet_job_url.set(hello.fleet_job_url);
            }
            ServerMessage::Snapshot(snapshot) => {
                let snapshot = *snapshot;
                self.node.set(Some(snapshot.node));
                self.interval_ms.set(snapshot.interval_ms);
                self.set_tick(Tick {
                    seq: snapshot.seq,
                    taken_at_ms: snapshot.taken_at_ms,
                    components: snapshot.components,
                    readings: snapshot.readings,
                    point: None,
                });
                self.history_cap.set(snapshot.history.len().max(MIN_HISTORY));
                // The snapshot holds the latest points only (the charts ask the daemon's history
                // for the rest): what this console already holds from before them stays.
                let first = snapshot.history.first().map(|p| p.t_ms);
                self.history.update(|history| {
                    match first {
                        Some(first) => history.retain(|p| p.t_ms < first),
                        None => history.clear(),
                    }
                    history.extend(snapshot.history);
                    let cap = self.history_cap.get_untracked();
                    if history.len() > cap {
                        let excess = history.len() - cap;
                        history.drain(..excess);
                    }
                });
                self.alerts.set(snapshot.alerts);
                self.silences.set(snapshot.silences);
                self.notifications.set(snapshot.notifications);
                self.incidents.set(snapshot.incidents);
            }
            ServerMessage::Update(update) => {
                let mut update = *update;
                let point = update.point.take();
                self.set_tick(update);
                if let Some(point) = point {
                    let cap = self.history_cap.get_untracked();
                    self.history.update(|history| {
                        if history.last().is_some_and(|last| last.t_ms >= point.t_ms) {
                            return;
                        }
                        history.push(point);
                        if history.len() > cap {
                            let excess = history.len() - cap;
                            history.drain(..excess);
                        }
                    });
                }
            }
            ServerMessage::AlertRaised { alert }
            | ServerMessage::AlertUpdated { alert }
            | ServerMessage::AlertResolved { alert } => self.upsert_alert(alert),
            ServerMessage::SilencesChanged { silences } => self.silences.set(silences),
            ServerMessage::Notified { notification } => self.notifications.update(|list| {
                list.insert(0, notification);
                list.truncate(NOTIFICATIONS_KEPT);
            }),
            ServerMessage::IncidentsChanged { incidents } => self.incidents.set(incidents),
            ServerMessage::KernelStateChanged(change) => {
                self.readings.update(|r| {
                    if let Some(k) = r.kernels.iter_mut().find(|k| k.id == change.kernel_id) {
                        k.state = change.to;
                    }
                });
            }
            ServerMessage::Pong { server_time_ms, .. } => self.server_time_ms.set(server_time_ms),
            ServerMessage::Error { code, message } => {
                self.server_error.set(Some(format!(
                    "{}: {message}",
                    serde_json::to_string(&code).unwrap_or_default().trim_matches('"')
                )));
            }
        }
    }

    /// The per-tick values, which a snapshot and an update both carry.
    fn set_tick(&self, tick: Tick) {
        self.seq.set(tick.seq);
        self.server_time_ms.set(tick.taken_at_ms);
        self.components.set(tick.components);
        self.readings.set(tick.readings);
    }

    /// Replaces the alert with the same id, or adds it; keeps active alerts first.
    fn upsert_alert(&self, alert: Alert) {
        self.alerts.update(|alerts| {
            match alerts.iter_mut().find(|a| a.id == alert.id) {
                Some(existing) => *existing = alert,
                None => alerts.push(alert),
            }
            alerts.sort_by(|a, b| {
                b.is_active()
                    .cmp(&a.is_active())
                    .then(if a.is_active() { b.severity.cmp(&a.severity) } else { std::cmp::Ordering::Equal })
                    .then(b.updated_at_ms.cmp(&a.updated_at_ms))
                    .then(b.id.cmp(&a.id))
            });
        });
    }
}

/// The browser's local storage (the acknowledging name, the theme), where there is one.
pub fn storage() -> Option<web_sys::Storage> {
    leptos::prelude::window().local_storage().ok().flatten()
}
