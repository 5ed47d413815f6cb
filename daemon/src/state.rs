//! The node state every route reads: latest metrics, history, alerts, and the broadcast that
//! carries each change to the WebSocket clients as a pre-serialised frame.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use ringside_shared::{
    Alert, ComponentHealth, ComponentStatus, HistoryPoint, HostMetrics, NodeIdentity,
    RingKernelMetrics, SchedulerTelemetry, ServerMessage, Snapshot, Update, WindowAggregates,
    PROTOCOL_VERSION,
};
use tokio::sync::broadcast;

use crate::alerts::{self, AckError, AlertChange, AlertStore};
use crate::config::Thresholds;
use crate::pipeline::{self, CounterRecord, HistoryRing, Sample};

/// A serialised server message, shared by every client it is sent to.
pub type Frame = Arc<str>;

/// Frames a client may fall behind by before it is resynchronised with a full snapshot.
pub const BROADCAST_CAPACITY: usize = 64;

/// Counters about the daemon itself, for `/metrics`.
#[derive(Debug, Default)]
pub struct DaemonStats {
    pub ws_clients: AtomicU64,
    pub ws_connections_total: AtomicU64,
    pub ws_resyncs_total: AtomicU64,
    pub ws_refused_total: AtomicU64,
    pub ws_error_frames_total: AtomicU64,
    pub ticks_total: AtomicU64,
    pub last_collect_ns: AtomicU64,
}

struct Latest {
    seq: u64,
    taken_at_ms: u64,
    components: Vec<ComponentHealth>,
    host: Option<HostMetrics>,
    scheduler: Option<SchedulerTelemetry>,
    kernels: Vec<RingKernelMetrics>,
    window: WindowAggregates,
    history: HistoryRing<HistoryPoint>,
    counters: HistoryRing<CounterRecord>,
}

pub struct NodeState {
    node: NodeIdentity,
    interval_ms: u64,
    window_ms: u64,
    thresholds: Thresholds,
    /// Components that do not change per tick (e.g. whether the console is built).
    fixed_components: Vec<ComponentHealth>,
    latest: RwLock<Latest>,
    alerts: Mutex<AlertStore>,
    events: broadcast::Sender<Frame>,
    pub stats: DaemonStats,
}

/// Serialises a message; our own types always serialise, so a failure is a bug worth a log line
/// and a frame saying so rather than a panic.
pub fn encode(message: &ServerMessage) -> Frame {
    match serde_json::to_string(message) {
        Ok(text) => text.into(),
        Err(e) => {
            tracing::error!("cannot serialise a server message: {e}");
            Arc::from(
                r#"{"type":"error","code":"invalid_command","message":"server could not encode a message"}"#,
            )
        }
    }
}

impl NodeState {
    pub fn new(
        node: NodeIdentity,
        interval_ms: u64,
        window_ms: u64,
        history_len: usize,
        thresholds: Thresholds,
        fixed_components: Vec<ComponentHealth>,
    ) -> Self {
        let (events, _) = broadcast::channel(BROADCAST_CAPACITY);
        let counters_len = (window_ms / interval_ms.max(1)) as usize + 2;
        NodeState {
            node,
            interval_ms,
            window_ms,
            alerts: Mutex::new(AlertStore::new(thresholds.clear_after_ticks)),
            thresholds,
            fixed_components,
            latest: RwLock::new(Latest {
                seq: 0,
                taken_at_ms: crate::now_ms(),
                components: Vec::new(),
                host: None,
                scheduler: None,
                kernels: Vec::new(),
                window: WindowAggregates {
                    window_ms,
                    ..WindowAggregates::default()
                },
                history: HistoryRing::new(history_len),
                counters: HistoryRing::new(counters_len),
            }),
            events,
            stats: DaemonStats::default(),
        }
    }

    pub fn node(&self) -> &NodeIdentity {
        &self.node
    }

    pub fn interval_ms(&self) -> u64 {
        self.interval_ms
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Frame> {
        self.events.subscribe()
    }

    fn broadcast(&self, message: &ServerMessage) {
        if self.events.receiver_count() > 0 {
            // An error only means every receiver left meanwhile.
            let _ = self.events.send(encode(message));
        }
    }

    /// Folds one collection tick in: history, window, alerts; then tells every client.
    pub fn apply_tick(
        &self,
        sample: Sample,
        components: Vec<ComponentHealth>,
        failures: &[(String, String)],
        took: Duration,
    ) {
        let point = pipeline::history_point(&sample);
        let update = {
            let mut latest = self.latest.write().unwrap_or_else(|e| e.into_inner());
            latest.counters.push(CounterRecord::from_sample(&sample));
            latest.window = pipeline::window_aggregates(&latest.counters, self.window_ms);
            if let Some(point) = &point {
                latest.history.push(point.clone());
            }
            latest.seq += 1;
            latest.taken_at_ms = sample.taken_at_ms;
            latest.components = components;
            latest.host = sample.host.clone();
            latest.scheduler = sample.scheduler.clone();
            latest.kernels = sample.kernels.clone();
            Update {
                seq: latest.seq,
                taken_at_ms: latest.taken_at_ms,
                components: self.with_fixed(&latest.components),
                host: latest.host.clone(),
                scheduler: latest.scheduler.clone(),
                kernels: latest.kernels.clone(),
                window: latest.window.clone(),
                point,
            }
        };
        let found = alerts::conditions(&self.thresholds, &sample, &update.window, failures);
        let changes = self
            .alerts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .apply(found, sample.taken_at_ms);
        self.stats.ticks_total.fetch_add(1, Ordering::Relaxed);
        self.stats
            .last_collect_ns
            .store(took.as_nanos() as u64, Ordering::Relaxed);

        self.broadcast(&ServerMessage::Update(Box::new(update)));
        for change in changes {
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
        for event in sample.kernel_events {
            self.broadcast(&ServerMessage::KernelStateChanged(event));
        }
    }

    fn with_fixed(&self, components: &[ComponentHealth]) -> Vec<ComponentHealth> {
        components
            .iter()
            .chain(self.fixed_components.iter())
            .cloned()
            .collect()
    }

    /// Components and their health; before the first tick only the fixed ones are known.
    pub fn components(&self) -> Vec<ComponentHealth> {
        let latest = self.latest.read().unwrap_or_else(|e| e.into_inner());
        self.with_fixed(&latest.components)
    }

    pub fn is_healthy(components: &[ComponentHealth]) -> bool {
        components.iter().all(|c| c.status == ComponentStatus::Up)
    }

    pub fn snapshot(&self) -> Snapshot {
        let alerts = self.alerts();
        let latest = self.latest.read().unwrap_or_else(|e| e.into_inner());
        Snapshot {
            schema_version: PROTOCOL_VERSION,
            seq: latest.seq,
            taken_at_ms: latest.taken_at_ms,
            interval_ms: self.interval_ms,
            node: self.node.clone(),
            components: self.with_fixed(&latest.components),
            host: latest.host.clone(),
            scheduler: latest.scheduler.clone(),
            kernels: latest.kernels.clone(),
            window: latest.window.clone(),
            alerts,
            history: latest.history.iter().cloned().collect(),
        }
    }

    pub fn alerts(&self) -> Vec<Alert> {
        self.alerts.lock().unwrap_or_else(|e| e.into_inner()).list()
    }

    pub fn active_alerts(&self) -> Vec<Alert> {
        self.alerts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .active()
            .cloned()
            .collect()
    }

    /// Acknowledges an alert and tells every client.
    pub fn acknowledge(
        &self,
        id: u64,
        by: String,
        note: Option<String>,
    ) -> Result<Alert, AckError> {
        let (alert, changed) = self
            .alerts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .acknowledge(id, by, note, crate::now_ms())?;
        if changed {
            tracing::info!(
                id,
                by = alert.acknowledgement.as_ref().map(|a| a.by.as_str()),
                "alert acknowledged"
            );
            self.broadcast(&ServerMessage::AlertUpdated {
                alert: alert.clone(),
            });
        }
        Ok(alert)
    }
}
