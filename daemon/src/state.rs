//! The node state every route reads: latest metrics, history, alerts, and the broadcast that
//! carries each change to the WebSocket clients as a pre-serialised frame.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use ringside_shared::{
    Alert, ComponentHealth, ComponentStatus, ConfigSummary, HistoryPoint, NewSilence, NodeIdentity, Readings, Role,
    ServerMessage, Silence, Snapshot, Update, WindowAggregates, PROTOCOL_VERSION,
};
use tokio::sync::{broadcast, mpsc};

use crate::alerts::config::Thresholds;
use crate::alerts::incidents::store::ReadError;
use crate::alerts::incidents::Recorder;
use crate::alerts::rules::RuleEngine;
use crate::alerts::silences::SilenceError;
use crate::alerts::store::{AckError, AlertChange, AlertStore};
use crate::alerts::{self};
use crate::identity::Identity;
use crate::metrics::DaemonStats;
use crate::pipeline::{self, Component, CounterRecord, HistoryRing, Sample};

/// A serialised server message, shared by every client it is sent to.
pub type Frame = Arc<str>;

/// One broadcast message, serialised for operators and, where they would see something else
/// (details of processes not admitted for alerting, unless `[server] viewers_see_untrusted`),
/// once more for viewers.
#[derive(Clone)]
pub struct Frames {
    all: Frame,
    viewers: Option<Frame>,
}

impl Frames {
    pub fn for_role(&self, role: Role) -> Frame {
        match (role, &self.viewers) {
            (Role::Viewer, Some(frame)) => frame.clone(),
            _ => self.all.clone(),
        }
    }
}

/// Chart points in the snapshot a WebSocket client gets, where the daemon keeps its history.
pub const LIVE_SNAPSHOT_POINTS: usize = 30;

/// Frames a client may fall behind by before it is resynchronised with a full snapshot.
pub const BROADCAST_CAPACITY: usize = 64;

/// How long an acknowledgement waits for the alert store to write it.
pub const ACK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The alert store and the rule engine, changed together under one lock every tick.
pub struct Alerting {
    pub store: AlertStore,
    pub rules: RuleEngine,
}

/// How the node state is sized and what it tells clients about the configuration.
pub struct Settings {
    pub interval_ms: u64,
    pub window_ms: u64,
    pub history_len: usize,
    pub thresholds: Thresholds,
    pub summary: ConfigSummary,
    /// Viewers see the command lines and paths of processes not admitted for alerting.
    pub viewers_see_untrusted: bool,
}

struct Latest {
    seq: u64,
    taken_at_ms: u64,
    components: Vec<ComponentHealth>,
    readings: Readings,
    history: HistoryRing<HistoryPoint>,
    counters: HistoryRing<CounterRecord>,
}

pub struct NodeState {
    node: NodeIdentity,
    interval_ms: u64,
    window_ms: u64,
    thresholds: Thresholds,
    summary: ConfigSummary,
    /// Components whose health is set outside the tick (console, alert store, Alertmanager).
    health: Mutex<BTreeMap<String, ComponentHealth>>,
    /// What happened to the alert store at start (a database moved aside), said with its
    /// health until the daemon restarts.
    store_note: Mutex<Option<String>>,
    latest: RwLock<Latest>,
    alerting: Mutex<Alerting>,
    events: broadcast::Sender<Frames>,
    viewers_see_untrusted: bool,
    /// Where alert changes are forwarded (Alertmanager), when configured.
    forward: Mutex<Option<mpsc::Sender<Alert>>>,
    /// Incident bundles, when `[incidents]` is enabled.
    incidents: Mutex<Option<Recorder>>,
    /// The node's history, when `[history]` is enabled and its directory could be used.
    history: std::sync::OnceLock<crate::history::History>,
    /// Whether the history's last write failed, as the `history` component last said.
    history_failing: std::sync::atomic::AtomicBool,
    pub stats: DaemonStats,
}

/// Serialises a message; our own types always serialise, so a failure is a bug worth a log line
/// and a frame saying so rather than a panic.
pub fn encode(message: &ServerMessage) -> Frame {
    match serde_json::to_string(message) {
        Ok(text) => text.into(),
        Err(e) => {
            tracing::error!("cannot serialise a server message: {e}");
            Arc::from(r#"{"type":"error","code":"invalid_command","message":"server could not encode a message"}"#)
        }
    }
}

impl NodeState {
    pub fn new(node: NodeIdentity, settings: Settings, alerting: Alerting) -> Self {
        let Settings { interval_ms, window_ms, history_len, thresholds, summary, viewers_see_untrusted } = settings;
        let (events, _) = broadcast::channel(BROADCAST_CAPACITY);
        let counters_len = (window_ms / interval_ms.max(1)) as usize + 2;
        NodeState {
            node,
            interval_ms,
            window_ms,
            thresholds,
            summary,
            health: Mutex::new(BTreeMap::new()),
            store_note: Mutex::new(None),
            alerting: Mutex::new(alerting),
            forward: Mutex::new(None),
            incidents: Mutex::new(None),
            history: std::sync::OnceLock::new(),
            history_failing: std::sync::atomic::AtomicBool::new(false),
            latest: RwLock::new(Latest {
                seq: 0,
                taken_at_ms: crate::clock::now_ms(),
                components: Vec::new(),
                readings: Readings {
                    window: WindowAggregates { window_ms, ..WindowAggregates::default() },
                    ..Readings::default()
                },
                history: HistoryRing::new(history_len),
                counters: HistoryRing::new(counters_len),
            }),
            events,
            viewers_see_untrusted,
            stats: DaemonStats::default(),
        }
    }

    pub fn node(&self) -> &NodeIdentity {
        &self.node
    }

    pub fn interval_ms(&self) -> u64 {
        self.interval_ms
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Frames> {
        self.events.subscribe()
    }

    /// Sets the health of a component that is not a metrics source.
    pub fn set_health(&self, component: Component, status: ComponentStatus, detail: Option<String>) {
        let name = component.as_str();
        let health = ComponentHealth { name: name.to_string(), status, detail };
        self.health.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string(), health);
    }

    /// Sends every later alert change to `forward` (dropped and counted when it is full).
    pub fn set_forwarder(&self, forward: mpsc::Sender<Alert>) {
        *self.forward.lock().unwrap_or_else(|e| e.into_inner()) = Some(forward);
    }

    /// Keeps incident bundles with `recorder` from the next tick on.
    pub fn set_incidents(&self, recorder: Recorder) {
        *self.incidents.lock().unwrap_or_else(|e| e.into_inner()) = Some(recorder);
        self.note_incidents();
    }

    /// Keeps the node's history from now on; `notes` say what was set aside as it opened.
    pub fn set_history(&self, history: crate::history::History, notes: Vec<String>) {
        for note in &notes {
            tracing::warn!("{note}");
        }
        let detail = (!notes.is_empty()).then(|| notes.join("; "));
        self.set_health(Component::History, ComponentStatus::Up, detail);
        let _ = self.history.set(history);
    }

    /// Says in the `history` component whether its files can be written (on a change only).
    fn note_history_disk(&self, history: &crate::history::History) {
        let (errors, trimmed) = history.disk_counts();
        self.stats.history_write_errors_total.store(errors, Ordering::Relaxed);
        self.stats.history_trimmed_total.store(trimmed, Ordering::Relaxed);
        let failure = history.disk_failure();
        if self.history_failing.swap(failure.is_some(), Ordering::Relaxed) == failure.is_some() {
            return;
        }
        match failure {
            Some(why) => self.set_health(
                Component::History,
                ComponentStatus::Degraded,
                Some(format!(
                    "cannot write the history's files ({why}): what is held in memory can still be asked for, \
                     but a restart loses what was not written"
                )),
            ),
            None => self.set_health(
                Component::History,
                ComponentStatus::Up,
                Some(format!("writing again, after {errors} failed writes")),
            ),
        }
    }

    pub fn history(&self) -> Option<&crate::history::History> {
        self.history.get()
    }

    /// Writes the history's open chunks and stops its writer (at a clean stop).
    pub fn close_history(&self) {
        if let Some(history) = self.history.get() {
            history.close();
        }
    }

    /// Incident bundles recording and kept, newest first.
    pub fn incidents(&self) -> Vec<ringside_shared::IncidentSummary> {
        self.incidents.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(Recorder::list).unwrap_or_default()
    }

    /// Bundle `id` as JSON: the file kept, or what a bundle still recording holds so far.
    pub fn incident(&self, id: u64) -> Result<Vec<u8>, ReadError> {
        let recording = {
            let incidents = self.incidents.lock().unwrap_or_else(|e| e.into_inner());
            let Some(recorder) = incidents.as_ref() else { return Err(ReadError::NotFound(id)) };
            match recorder.recording(id) {
                Some(parts) => parts,
                None => return recorder.store().read(id),
            }
        };
        let bundle = crate::alerts::incidents::assemble(recording);
        serde_json::to_vec(&bundle).map_err(|e| ReadError::Io(id, e.to_string()))
    }

    /// At stop: bundles still recording are written with what they hold (at most `limit`).
    pub fn finish_incidents(&self, limit: Duration) -> bool {
        let mut incidents = self.incidents.lock().unwrap_or_else(|e| e.into_inner());
        incidents.as_mut().is_none_or(|r| r.finish(limit))
    }

    /// The daemon's descriptors into its metrics, and into health when they run short.
    fn note_descriptors(&self) {
        let now = crate::descriptors::Descriptors::read();
        self.stats.open_fds.store(now.open, Ordering::Relaxed);
        self.stats.fd_limit.store(now.soft_limit, Ordering::Relaxed);
        match now.shortage() {
            None => self.set_health(Component::Descriptors, ComponentStatus::Up, None),
            Some(why) => self.set_health(Component::Descriptors, ComponentStatus::Degraded, Some(why)),
        }
    }

    /// The store's figures into the daemon's metrics, its failure into health.
    fn note_incidents(&self) {
        let incidents = self.incidents.lock().unwrap_or_else(|e| e.into_inner());
        let Some(recorder) = incidents.as_ref() else { return };
        let (count, bytes, dropped) = recorder.store().totals();
        self.stats.incident_bundles.store(count, Ordering::Relaxed);
        self.stats.incident_bundle_bytes.store(bytes, Ordering::Relaxed);
        self.stats.incident_bundles_dropped_total.store(dropped, Ordering::Relaxed);
        match recorder.store().error() {
            None => self.set_health(Component::Incidents, ComponentStatus::Up, None),
            Some(why) => self.set_health(Component::Incidents, ComponentStatus::Degraded, Some(why)),
        }
    }

    fn forward(&self, alert: &Alert) {
        if let Some(tx) = self.forward.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            if tx.try_send(alert.clone()).is_err() {
                self.stats.alertmanager_dropped_total.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn broadcast(&self, message: &ServerMessage) {
        if self.events.receiver_count() > 0 {
            // An error only means every receiver left meanwhile.
            let _ = self.events.send(Frames { all: encode(message), viewers: None });
        }
    }

    /// An update, serialised a second time for viewers when it holds what they may not see.
    fn broadcast_update(&self, update: Update) {
        if self.events.receiver_count() == 0 {
            return;
        }
        let hides = !self.viewers_see_untrusted && update.readings.has_untrusted_details();
        let viewers = hides.then(|| {
            let mut seen = update.clone();
            seen.readings.hide_untrusted_details();
            encode(&ServerMessage::Update(Box::new(seen)))
        });
        let _ = self.events.send(Frames { all: encode(&ServerMessage::Update(Box::new(update))), viewers });
    }

    /// Whether `role` is given processes not admitted for alerting without their details.
    pub fn hides_untrusted_from(&self, role: Role) -> bool {
        role == Role::Viewer && !self.viewers_see_untrusted
    }

    /// [`snapshot`](Self::snapshot) as `role` may see it.
    pub fn snapshot_for(&self, role: Role) -> Snapshot {
        self.snapshot_with(role, usize::MAX)
    }

    /// The snapshot as `role` may see it, with the last `points` chart points at most.
    fn snapshot_with(&self, role: Role, points: usize) -> Snapshot {
        let mut snapshot = self.snapshot_points(points);
        if self.hides_untrusted_from(role) {
            snapshot.readings.hide_untrusted_details();
        }
        snapshot
    }

    /// [`snapshot_for`](Self::snapshot_for) as a WebSocket client first gets it: where the
    /// daemon keeps its history, with only the last [`LIVE_SNAPSHOT_POINTS`] chart points (the
    /// console asks `/api/history` for the rest of what its charts show). Eight GPUs' 600 points
    /// are a megabyte of JSON: seconds over a slow link before the first figure shows.
    pub fn live_snapshot_for(&self, role: Role) -> Snapshot {
        let points = if self.history.get().is_some() { LIVE_SNAPSHOT_POINTS } else { usize::MAX };
        self.snapshot_with(role, points)
    }

    /// Folds one collection tick in: history, window, alerts; then tells every client.
    pub fn apply_tick(
        &self,
        mut sample: Sample,
        components: Vec<ComponentHealth>,
        failures: &[(String, String)],
        took: Duration,
    ) {
        let update = {
            let mut latest = self.latest.write().unwrap_or_else(|e| e.into_inner());
            latest.counters.push(CounterRecord::from_sample(&sample));
            sample.readings.window = pipeline::window_aggregates(&latest.counters, self.window_ms);
            let point = pipeline::history_point(&sample);
            if let Some(point) = &point {
                latest.history.push(point.clone());
            }
            latest.seq += 1;
            latest.taken_at_ms = sample.taken_at_ms;
            latest.components = components;
            latest.readings = sample.readings.clone();
            Update {
                seq: latest.seq,
                taken_at_ms: latest.taken_at_ms,
                components: self.with_fixed(&latest.components),
                readings: sample.readings.clone(),
                point,
            }
        };
        // Under the history's own lock, not the latest values' (which every reader takes).
        if let Some(history) = self.history.get() {
            let (series, memory, dropped) = history.record(&sample);
            let dropped = dropped.series + dropped.late + dropped.invalid + dropped.evicted_chunks;
            self.stats.history_series.store(series as u64, Ordering::Relaxed);
            self.stats.history_memory_bytes.store(memory as u64, Ordering::Relaxed);
            self.stats.history_disk_bytes.store(history.disk_bytes(), Ordering::Relaxed);
            self.stats.history_dropped_total.store(dropped, Ordering::Relaxed);
            self.note_history_disk(history);
        }
        let changes = {
            let mut alerting = self.alerting.lock().unwrap_or_else(|e| e.into_inner());
            let mut found = alerts::conditions(&self.thresholds, &sample, failures);
            found.extend(alerting.rules.conditions(&sample));
            let changes = alerting.store.apply(found, sample.taken_at_ms);
            self.note_store_health(&alerting.store);
            (changes, alerting.store.take_silences_changed())
        };
        let (changes, silences_changed) = changes;
        self.stats.ticks_total.fetch_add(1, Ordering::Relaxed);
        self.stats.last_collect_ns.store(took.as_nanos() as u64, Ordering::Relaxed);
        let incidents_changed = {
            let mut incidents = self.incidents.lock().unwrap_or_else(|e| e.into_inner());
            incidents.as_mut().is_some_and(|r| {
                r.record(&sample, update.point.as_ref(), &changes);
                r.take_changed()
            })
        };

        self.broadcast_update(update);
        for change in changes {
            self.forward(change.alert());
            let message = match change {
                AlertChange::Raised(alert) => {
                    tracing::warn!(
                        id = alert.id,
                        severity = alert.severity.as_str(),
                        "alert raised: {}",
                        alert.message
                    );
                    ServerMessage::AlertRaised { alert }
                }
                AlertChange::Updated(alert) => ServerMessage::AlertUpdated { alert },
                AlertChange::Resolved(alert) => {
                    tracing::info!(id = alert.id, "alert resolved: {}", alert.message);
                    ServerMessage::AlertResolved { alert }
                }
            };
            self.broadcast(&message);
        }
        if silences_changed {
            self.broadcast(&ServerMessage::SilencesChanged { silences: self.silences() });
        }
        self.note_descriptors();
        if incidents_changed {
            self.note_incidents();
            self.broadcast(&ServerMessage::IncidentsChanged { incidents: self.incidents() });
        }
        for event in sample.kernel_events {
            self.broadcast(&ServerMessage::KernelStateChanged(event));
        }
    }

    fn note_store_health(&self, store: &AlertStore) {
        let (status, detail) = match (store.is_persistent(), store.db_error()) {
            (true, None) => (ComponentStatus::Up, None),
            (true, Some(e)) => {
                (ComponentStatus::Degraded, Some(format!("alert changes may not be kept across a restart: {e}")))
            }
            (false, _) => (ComponentStatus::Degraded, Some("alerts are kept in memory only".to_string())),
        };
        let note = self.store_note.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (status, detail) = match (note, detail) {
            (None, detail) => (status, detail),
            (Some(note), None) => (ComponentStatus::Degraded, Some(note)),
            (Some(note), Some(detail)) => (ComponentStatus::Degraded, Some(format!("{note}; {detail}"))),
        };
        self.set_health(Component::AlertStore, status, detail);
    }

    /// Waits (at stop) until the alert store has written every change, at most `limit`.
    pub fn flush_alert_store(&self, limit: std::time::Duration) -> bool {
        self.alerting.lock().unwrap_or_else(|e| e.into_inner()).store.flush(limit)
    }

    /// Says, with the alert store's health, what happened to it at start.
    pub fn set_store_note(&self, note: String) {
        *self.store_note.lock().unwrap_or_else(|e| e.into_inner()) = Some(note);
        let alerting = self.alerting.lock().unwrap_or_else(|e| e.into_inner());
        self.note_store_health(&alerting.store);
    }

    fn with_fixed(&self, components: &[ComponentHealth]) -> Vec<ComponentHealth> {
        let health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        components.iter().chain(health.values()).cloned().collect()
    }

    /// Components and their health; before the first tick only the fixed ones are known.
    pub fn components(&self) -> Vec<ComponentHealth> {
        let latest = self.latest.read().unwrap_or_else(|e| e.into_inner());
        self.with_fixed(&latest.components)
    }

    /// The scheduler's backend and its sched_ext scheduler, as of the latest tick (for
    /// `/healthz`: the backend, sched_ext's state, the ops name and the counters).
    pub fn scheduler_backend(&self) -> Option<(ringside_shared::SchedulerBackend, Option<ringside_shared::ScxStatus>)> {
        let latest = self.latest.read().unwrap_or_else(|e| e.into_inner());
        latest.readings.scheduler.as_ref().map(|s| (s.backend, s.scx.clone()))
    }

    /// How long ago the latest collection tick was taken (since the start, before the first).
    pub fn tick_age_ms(&self) -> u64 {
        let latest = self.latest.read().unwrap_or_else(|e| e.into_inner());
        crate::clock::now_ms().saturating_sub(latest.taken_at_ms)
    }

    pub fn is_healthy(components: &[ComponentHealth]) -> bool {
        components.iter().all(|c| matches!(c.status, ComponentStatus::Up | ComponentStatus::Absent))
    }

    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_points(usize::MAX)
    }

    /// The host's figures of the latest tick (`GET /api/host`).
    pub fn host_now(&self) -> ringside_shared::HostNow {
        let latest = self.latest.read().unwrap_or_else(|e| e.into_inner());
        ringside_shared::HostNow {
            seq: latest.seq,
            taken_at_ms: latest.taken_at_ms,
            interval_ms: self.interval_ms,
            host: latest.readings.host.clone(),
        }
    }

    /// The snapshot with only the last `points` chart points (cloned, the rest not).
    fn snapshot_points(&self, points: usize) -> Snapshot {
        let alerts = self.alerts();
        let latest = self.latest.read().unwrap_or_else(|e| e.into_inner());
        Snapshot {
            schema_version: PROTOCOL_VERSION,
            seq: latest.seq,
            taken_at_ms: latest.taken_at_ms,
            interval_ms: self.interval_ms,
            node: self.node.clone(),
            config: self.summary.clone(),
            components: self.with_fixed(&latest.components),
            readings: latest.readings.clone(),
            alerts,
            silences: self.silences(),
            notifications: self.notifications(None, 100),
            incidents: self.incidents(),
            history: latest.history.iter().skip(latest.history.len().saturating_sub(points)).cloned().collect(),
        }
    }

    pub fn alerts(&self) -> Vec<Alert> {
        self.alerting.lock().unwrap_or_else(|e| e.into_inner()).store.list()
    }

    pub fn active_alerts(&self) -> Vec<Alert> {
        self.alerting.lock().unwrap_or_else(|e| e.into_inner()).store.active().cloned().collect()
    }

    /// Silences in force or to come, then ended ones.
    pub fn silences(&self) -> Vec<Silence> {
        self.alerting.lock().unwrap_or_else(|e| e.into_inner()).store.silences(crate::clock::now_ms())
    }

    /// The newest `limit` batches sent to Alertmanager (of `alert_id` only, when given).
    pub fn notifications(&self, alert_id: Option<u64>, limit: usize) -> Vec<ringside_shared::Notification> {
        self.alerting.lock().unwrap_or_else(|e| e.into_inner()).store.notifications(alert_id, limit)
    }

    /// [`NodeState::silences`], each with how many active alerts it matches now.
    pub fn silences_listed(&self) -> Vec<(Silence, usize)> {
        self.alerting.lock().unwrap_or_else(|e| e.into_inner()).store.silences_listed(crate::clock::now_ms())
    }

    /// Waits (without a lock) at most [`ACK_WAIT`] for a write: why it failed, if it did.
    async fn unconfirmed(&self, confirmation: crate::alerts::writer::Confirmation) -> Option<String> {
        match tokio::time::timeout(ACK_WAIT, confirmation).await {
            Ok(Ok(Ok(()))) => None,
            Ok(Ok(Err(why))) => Some(why),
            Ok(Err(_)) => Some("the alert store's writer stopped".to_string()),
            Err(_) => Some(format!(
                "not written within {} s ({})",
                ACK_WAIT.as_secs(),
                self.alerting
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .store
                    .db_error()
                    .unwrap_or_else(|| "the disk is slow".into())
            )),
        }
    }

    /// An alert changed outside a tick: an incident bundle recording for it closes with it.
    fn note_alert(&self, alert: &Alert) {
        if let Some(recorder) = self.incidents.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            recorder.note_alert(alert);
        }
    }

    /// Tells clients (and Alertmanager) what a silence changed.
    fn announce(&self, changes: Vec<AlertChange>) {
        for change in changes {
            self.note_alert(change.alert());
            self.forward(change.alert());
            self.broadcast(&ServerMessage::AlertUpdated { alert: change.alert().clone() });
        }
        self.broadcast(&ServerMessage::SilencesChanged { silences: self.silences() });
    }

    /// Makes a silence as `identity` (operators only) once it is stored, then applies it.
    pub async fn silence(&self, identity: &Identity, new: NewSilence) -> Result<Silence, SilenceError> {
        if identity.role != Role::Operator {
            return Err(SilenceError::Forbidden { token: identity.name.clone(), role: identity.role.as_str() });
        }
        let by = new.by.as_deref().map(str::trim).filter(|b| !b.is_empty()).unwrap_or(&identity.name).to_string();
        if by.len() > ringside_shared::silence::MAX_TEXT {
            return Err(SilenceError::Invalid("the name is too long".into()));
        }
        let now = crate::clock::now_ms();
        let (silence, changes, confirmation) = {
            let mut alerting = self.alerting.lock().unwrap_or_else(|e| e.into_inner());
            let outcome = alerting.store.silence(new, by, now);
            self.note_store_health(&alerting.store);
            outcome?
        };
        if let Some(confirmation) = confirmation {
            if let Some(why) = self.unconfirmed(confirmation).await {
                let changes = {
                    let mut alerting = self.alerting.lock().unwrap_or_else(|e| e.into_inner());
                    alerting.store.unsilence(silence.id, crate::clock::now_ms())
                };
                self.announce(changes);
                return Err(SilenceError::Store(format!("{why}; not silenced, try again")));
            }
        }
        tracing::info!(id = silence.id, token = identity.name, by = silence.created_by, "silence created");
        self.announce(changes);
        Ok(silence)
    }

    /// Ends a silence early, as `identity` (operators only).
    pub async fn expire_silence(
        &self,
        identity: &Identity,
        id: u64,
        by: Option<String>,
    ) -> Result<Silence, SilenceError> {
        if identity.role != Role::Operator {
            return Err(SilenceError::Forbidden { token: identity.name.clone(), role: identity.role.as_str() });
        }
        let by = by.map(|b| b.trim().to_string()).filter(|b| !b.is_empty()).unwrap_or_else(|| identity.name.clone());
        let (silence, changes, confirmation) = {
            let mut alerting = self.alerting.lock().unwrap_or_else(|e| e.into_inner());
            alerting.store.expire_silence(id, &by, crate::clock::now_ms())?
        };
        // Expired in memory either way (forwarding resumes); a failed write is the store's
        // health and is tried again.
        if let Some(confirmation) = confirmation {
            if let Some(why) = self.unconfirmed(confirmation).await {
                tracing::warn!(id, "the silence's expiry is not written yet: {why}");
            }
        }
        tracing::info!(id, token = identity.name, "silence expired");
        self.announce(changes);
        Ok(silence)
    }

    /// Acknowledges an alert as `identity` (shown under the name the person gave, if any) once
    /// it is stored, then tells every client. The write is waited for (without a lock) at most
    /// [`ACK_WAIT`]; one that fails or takes longer is taken back and the caller told why.
    pub async fn acknowledge(
        &self,
        id: u64,
        identity: &Identity,
        by: Option<String>,
        note: Option<String>,
    ) -> Result<Alert, AckError> {
        if identity.role != Role::Operator {
            return Err(AckError::Forbidden { token: identity.name.clone(), role: identity.role.as_str() });
        }
        let by = by.map(|b| b.trim().to_string()).filter(|b| !b.is_empty()).unwrap_or_else(|| identity.name.clone());
        let (alert, changed, confirmation) = {
            let mut alerting = self.alerting.lock().unwrap_or_else(|e| e.into_inner());
            let outcome = alerting.store.acknowledge(id, by, identity.name.clone(), note, crate::clock::now_ms());
            self.note_store_health(&alerting.store);
            outcome?
        };
        if let Some(confirmation) = confirmation {
            if let Some(why) = self.unconfirmed(confirmation).await {
                let at_ms = alert.acknowledgement.as_ref().map_or(0, |a| a.at_ms);
                let mut alerting = self.alerting.lock().unwrap_or_else(|e| e.into_inner());
                alerting.store.withdraw(id, at_ms);
                self.note_store_health(&alerting.store);
                return Err(AckError::Store(format!("{why}; not acknowledged, try again")));
            }
        }
        if changed {
            tracing::info!(id, token = identity.name, "alert acknowledged");
            self.note_alert(&alert);
            self.forward(&alert);
            self.broadcast(&ServerMessage::AlertUpdated { alert: alert.clone() });
        }
        Ok(alert)
    }
}

impl crate::alerts::alertmanager::Node for NodeState {
    fn instance(&self) -> String {
        self.node().hostname.clone()
    }

    fn active_alerts(&self) -> Vec<Alert> {
        NodeState::active_alerts(self)
    }

    fn notified(&self, alerts: &[Alert], ok: bool, outcome: String) {
        let notification = {
            let mut alerting = self.alerting.lock().unwrap_or_else(|e| e.into_inner());
            alerting.store.notify(alerts, ok, outcome, crate::clock::now_ms())
        };
        self.broadcast(&ServerMessage::Notified { notification });
    }

    fn forwarded(&self, outcome: Result<usize, (ComponentStatus, String)>) {
        match outcome {
            Ok(sent) => {
                self.stats.alertmanager_sent_total.fetch_add(sent as u64, Ordering::Relaxed);
                self.set_health(Component::Alertmanager, ComponentStatus::Up, None);
            }
            Err((status, why)) => {
                self.stats.alertmanager_errors_total.fetch_add(1, Ordering::Relaxed);
                self.set_health(Component::Alertmanager, status, Some(why));
            }
        }
    }
}
