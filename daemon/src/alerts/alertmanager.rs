//! Forwards alerts to a Prometheus Alertmanager through its v2 API (`POST /api/v2/alerts`), so
//! a fleet routes, groups and silences Ringside's alerts with the engine it already runs.
//!
//! Every change is sent as it happens; active alerts are sent again every
//! `resend_interval_ms`, each with an `endsAt` four resend intervals ahead (as Prometheus does),
//! so that Alertmanager neither resolves a standing alert after its own `resolve_timeout` nor
//! keeps one forever if this node goes away; a resolved alert is sent with its `endsAt`. A batch
//! that Alertmanager does not take is kept (the newest version of each alert) and sent again
//! with backoff until it is, so resolutions are not lost to an outage.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ringside_shared::{Alert, ComponentStatus};
use tokio::sync::{mpsc, watch};

use super::config::AlertmanagerConfig;
use crate::http_client::{self, Request, Url};

/// Changes queued for sending; beyond it they are dropped (the next resend carries the state).
pub const QUEUE: usize = 1024;

/// Unsent alerts kept at most for the next try; beyond it the oldest are dropped (active ones
/// are sent again with every resend anyway).
const UNSENT_KEPT: usize = QUEUE;
/// The first wait before sending a failed batch again; it doubles up to the last.
const FIRST_RETRY: Duration = Duration::from_millis(500);
const LAST_RETRY: Duration = Duration::from_secs(60);

/// What the forwarder needs of the node it runs on: its name, the alerts standing now, and
/// where to report how forwarding goes (the daemon's `NodeState`: health and counters).
pub trait Node: Send + Sync {
    /// The `instance` label of every alert sent.
    fn instance(&self) -> String;
    fn active_alerts(&self) -> Vec<Alert>;
    /// `Ok(n)`: Alertmanager took a batch of `n`; `Err`: it did not, the component's state and why.
    fn forwarded(&self, outcome: Result<usize, (ComponentStatus, String)>);
    /// The batch `alerts` was sent (`ok`) or failed, with the outcome: for the notification log.
    fn notified(&self, alerts: &[Alert], ok: bool, outcome: String);
}

/// One alert in Alertmanager's v2 format; an active one ends at `ends_ms` unless sent again.
pub fn payload(alert: &Alert, instance: &str, generator_url: &str, ends_ms: u64) -> serde_json::Value {
    let mut labels = serde_json::Map::new();
    for (k, v) in &alert.labels {
        labels.insert(k.clone(), v.clone().into());
    }
    labels.insert("alertname".into(), alert.name().into());
    labels.insert("severity".into(), alert.severity.as_str().into());
    labels.insert("source".into(), alert.source.clone().into());
    labels.insert("instance".into(), instance.into());
    labels.insert("ringside_alert_id".into(), alert.id.to_string().into());
    let mut annotations = serde_json::json!({
        "summary": alert.message,
        "value": super::number(alert.value),
        "threshold": super::number(alert.threshold),
    });
    if let Some(ack) = &alert.acknowledgement {
        annotations["acknowledged_by"] = ack.by.clone().into();
    }
    let mut value = serde_json::json!({
        "labels": labels,
        "annotations": annotations,
        "startsAt": crate::clock::utc_rfc3339(alert.raised_at_ms),
        "generatorURL": generator_url,
    });
    value["endsAt"] = crate::clock::utc_rfc3339(alert.resolved_at_ms.unwrap_or(ends_ms)).into();
    value
}

pub struct Forwarder {
    url: Url,
    config: AlertmanagerConfig,
    node: Arc<dyn Node>,
    generator_url: String,
    client: http_client::Client,
}

impl Forwarder {
    pub fn new(config: AlertmanagerConfig, node: Arc<dyn Node>, generator_url: String) -> Result<Forwarder, String> {
        let url = Url::parse(&config.url).map_err(|e| e.to_string())?;
        let client = http_client::Client::new(config.ca_file.as_deref()).map_err(|e| format!("ca_file {e}"))?;
        Ok(Forwarder { url, config, node, generator_url, client })
    }

    /// Sends `alerts`; whether Alertmanager took them.
    async fn post(&self, alerts: &[Alert]) -> bool {
        if alerts.is_empty() {
            return true;
        }
        let instance = self.node.instance();
        let ends_ms = crate::clock::now_ms() + 4 * self.config.resend_interval_ms;
        let body: Vec<serde_json::Value> =
            alerts.iter().map(|a| payload(a, &instance, &self.generator_url, ends_ms)).collect();
        let body = serde_json::to_vec(&body).unwrap_or_default();
        let auth = self.config.auth.as_ref();
        let request = Request { method: "POST", path: "/api/v2/alerts", auth, body: Some(("application/json", &body)) };
        let outcome = match http_client::send(&self.client, &self.url, request, Duration::from_secs(10)).await {
            Ok(response) if (200..300).contains(&response.status) => Ok(response.status),
            Ok(response) => Err(format!(
                "{} answered {}: {}",
                self.config.url,
                response.status,
                String::from_utf8_lossy(&response.body).chars().take(200).collect::<String>()
            )),
            Err(e) => Err(e.to_string()),
        };
        match outcome {
            Ok(status) => {
                self.node.notified(alerts, true, format!("HTTP {status}"));
                self.node.forwarded(Ok(alerts.len()));
                true
            }
            Err(e) => {
                self.node.notified(alerts, false, e.chars().take(300).collect());
                tracing::warn!("forwarding alerts to Alertmanager failed: {e}");
                self.node.forwarded(Err((ComponentStatus::Degraded, format!("cannot forward alerts: {e}"))));
                false
            }
        }
    }

    /// Forwards until the daemon stops. A panic in forwarding (a bug) is reported, and
    /// forwarding starts again after a backoff (0.5 s doubling to 60 s) with what was not sent
    /// yet.
    pub async fn run(self, mut changes: mpsc::Receiver<Alert>, mut shutdown: watch::Receiver<bool>) {
        // What Alertmanager has not taken yet, by alert id (the newest version of each).
        let mut unsent: BTreeMap<u64, Alert> = BTreeMap::new();
        let mut wait = FIRST_RETRY;
        loop {
            let pass = std::panic::AssertUnwindSafe(self.forward(&mut changes, &mut shutdown, &mut unsent));
            let Err(panic) = futures_util::FutureExt::catch_unwind(pass).await else { return };
            let what = crate::pipeline::panic_message(panic.as_ref()).to_string();
            tracing::error!("forwarding to Alertmanager panicked: {what}; starting again in {wait:?}");
            let why = format!("forwarding panicked: {what}; starting again in {} ms", wait.as_millis());
            self.node.forwarded(Err((ComponentStatus::Down, why)));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => return,
            }
            wait = (wait * 2).min(LAST_RETRY);
        }
    }

    async fn forward(
        &self,
        changes: &mut mpsc::Receiver<Alert>,
        shutdown: &mut watch::Receiver<bool>,
        unsent: &mut BTreeMap<u64, Alert>,
    ) {
        let mut resend = tokio::time::interval(Duration::from_millis(self.config.resend_interval_ms));
        resend.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut retry = FIRST_RETRY;
        let mut retry_at: Option<tokio::time::Instant> = None;
        loop {
            let retry_due = async {
                match retry_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let batch: Vec<Alert> = tokio::select! {
                Some(first) = changes.recv() => {
                    keep(unsent, first);
                    while let Ok(more) = changes.try_recv() {
                        keep(unsent, more);
                    }
                    unsent.values().cloned().collect()
                }
                _ = resend.tick() => {
                    for alert in self.node.active_alerts() {
                        keep(unsent, alert);
                    }
                    unsent.values().cloned().collect()
                }
                _ = retry_due => unsent.values().cloned().collect(),
                _ = shutdown.changed() => return,
            };
            // A panic while sending (a bug in the client) is this batch's failure, not the end
            // of forwarding: it is reported and the batch tried again.
            let sent = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(self.post(&batch)))
                .await
                .unwrap_or_else(|panic| {
                    let what = crate::pipeline::panic_message(panic.as_ref()).to_string();
                    tracing::error!("forwarding to Alertmanager panicked: {what}");
                    self.node.forwarded(Err((ComponentStatus::Down, format!("forwarding panicked: {what}"))));
                    false
                });
            if sent {
                for alert in &batch {
                    if unsent.get(&alert.id).is_some_and(|kept| kept.updated_at_ms == alert.updated_at_ms) {
                        unsent.remove(&alert.id);
                    }
                }
                retry = FIRST_RETRY;
                retry_at = None;
            } else {
                retry_at = Some(tokio::time::Instant::now() + retry);
                retry = (retry * 2).min(LAST_RETRY);
            }
        }
    }
}

/// Keeps `alert` for sending, over an older version of it; bounded by [`UNSENT_KEPT`]. A
/// silenced alert is not sent (nor an older version of it still waiting).
fn keep(unsent: &mut BTreeMap<u64, Alert>, alert: Alert) {
    if unsent.get(&alert.id).is_some_and(|kept| kept.updated_at_ms > alert.updated_at_ms) {
        return;
    }
    if alert.silenced.is_some() {
        unsent.remove(&alert.id);
        return;
    }
    unsent.insert(alert.id, alert);
    while unsent.len() > UNSENT_KEPT {
        unsent.pop_first();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringside_shared::{AlertType, Severity};

    #[test]
    fn payload_has_alertmanagers_shape() {
        let alert = Alert {
            id: 7,
            alert_type: AlertType::Rule,
            rule: Some("cpu_saturated".into()),
            severity: Severity::Warning,
            source: "host".into(),
            labels: [("team".to_string(), "ml".to_string())].into(),
            message: "cpu high".into(),
            value: 97.5,
            threshold: 95.0,
            raised_at_ms: 0,
            updated_at_ms: 0,
            resolved_at_ms: Some(61_000),
            acknowledgement: None,
            occurrence: 1,
            flapping: false,
            transitions: vec![],
            silenced: None,
        };
        let p = payload(&alert, "gpu-07", "http://127.0.0.1:9650/", 500_000);
        assert_eq!(p["labels"]["alertname"], "cpu_saturated");
        assert_eq!(p["labels"]["severity"], "warning");
        assert_eq!(p["labels"]["team"], "ml");
        assert_eq!(p["labels"]["instance"], "gpu-07");
        assert_eq!(p["annotations"]["summary"], "cpu high");
        assert_eq!(p["startsAt"], "1970-01-01T00:00:00.000Z");
        assert_eq!(p["endsAt"], "1970-01-01T00:01:01.000Z");
        let active = Alert { resolved_at_ms: None, ..alert };
        let p = payload(&active, "gpu-07", "http://127.0.0.1:9650/", 500_000);
        assert_eq!(p["endsAt"], "1970-01-01T00:08:20.000Z", "an active alert ends unless sent again");
    }

    #[test]
    fn the_newest_version_of_an_alert_is_kept_for_sending_and_the_kept_are_bounded() {
        let alert = |id: u64, updated_at_ms: u64| Alert {
            id,
            alert_type: AlertType::Rule,
            rule: None,
            severity: Severity::Warning,
            source: "host".into(),
            labels: Default::default(),
            message: String::new(),
            value: 0.0,
            threshold: 0.0,
            raised_at_ms: 0,
            updated_at_ms,
            resolved_at_ms: None,
            acknowledgement: None,
            occurrence: 1,
            flapping: false,
            transitions: vec![],
            silenced: None,
        };
        let mut unsent = BTreeMap::new();
        keep(&mut unsent, alert(1, 20));
        keep(&mut unsent, alert(1, 10));
        assert_eq!(unsent[&1].updated_at_ms, 20, "an older version does not replace a newer one");
        for id in 2..(UNSENT_KEPT as u64 + 10) {
            keep(&mut unsent, alert(id, 1));
        }
        assert_eq!(unsent.len(), UNSENT_KEPT);
        // Silenced: not sent, and the version waiting is dropped; unsilenced later, sent again.
        let silenced = ringside_shared::Silenced {
            silence_id: 1,
            by: "ana".into(),
            until_ms: None,
            comment: String::new(),
            maintenance: None,
        };
        let last = UNSENT_KEPT as u64 + 9;
        keep(&mut unsent, Alert { silenced: Some(silenced), ..alert(last, 5) });
        assert!(!unsent.contains_key(&last));
        keep(&mut unsent, alert(last, 6));
        assert!(unsent.contains_key(&last));
    }
}
