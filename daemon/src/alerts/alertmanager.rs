//! Forwards alerts to a Prometheus Alertmanager through its v2 API (`POST /api/v2/alerts`), so
//! a fleet routes, groups and silences Ringside's alerts with the engine it already runs.
//!
//! Every change is sent as it happens; active alerts are sent again every
//! `resend_interval_ms` (Alertmanager resolves an alert it has not heard of for its
//! `resolve_timeout`), and a resolved alert is sent with its `endsAt`.

use std::sync::Arc;
use std::time::Duration;

use ringside_shared::{Alert, ComponentStatus};
use tokio::sync::{mpsc, watch};

use super::config::AlertmanagerConfig;
use crate::http_client::{self, Request, Url};
use crate::state::NodeState;

pub const COMPONENT: &str = "alertmanager";
/// Changes queued for sending; beyond it they are dropped (the next resend carries the state).
pub const QUEUE: usize = 1024;

/// One alert in Alertmanager's v2 format.
pub fn payload(alert: &Alert, instance: &str, generator_url: &str) -> serde_json::Value {
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
        "value": crate::prometheus::number(alert.value),
        "threshold": crate::prometheus::number(alert.threshold),
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
    if let Some(resolved) = alert.resolved_at_ms {
        value["endsAt"] = crate::clock::utc_rfc3339(resolved).into();
    }
    value
}

pub struct Forwarder {
    url: Url,
    config: AlertmanagerConfig,
    state: Arc<NodeState>,
    generator_url: String,
}

impl Forwarder {
    pub fn new(config: AlertmanagerConfig, state: Arc<NodeState>, generator_url: String) -> Result<Forwarder, String> {
        Ok(Forwarder { url: Url::parse(&config.url)?, config, state, generator_url })
    }

    async fn post(&self, alerts: &[Alert]) {
        if alerts.is_empty() {
            return;
        }
        let instance = self.state.node().hostname.clone();
        let body: Vec<serde_json::Value> = alerts.iter().map(|a| payload(a, &instance, &self.generator_url)).collect();
        let body = serde_json::to_vec(&body).unwrap_or_default();
        let request =
            Request { method: "POST", path: "/api/v2/alerts", bearer: None, body: Some(("application/json", &body)) };
        let outcome = match http_client::send(&self.url, request, Duration::from_secs(10)).await {
            Ok(response) if (200..300).contains(&response.status) => Ok(()),
            Ok(response) => Err(format!(
                "{} answered {}: {}",
                self.config.url,
                response.status,
                String::from_utf8_lossy(&response.body).chars().take(200).collect::<String>()
            )),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(()) => {
                self.state
                    .stats
                    .alertmanager_sent_total
                    .fetch_add(alerts.len() as u64, std::sync::atomic::Ordering::Relaxed);
                self.state.set_health(COMPONENT, ComponentStatus::Up, None);
            }
            Err(e) => {
                tracing::warn!("forwarding alerts to Alertmanager failed: {e}");
                self.state.stats.alertmanager_errors_total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.state.set_health(
                    COMPONENT,
                    ComponentStatus::Degraded,
                    Some(format!("cannot forward alerts: {e}")),
                );
            }
        }
    }

    pub async fn run(self, mut changes: mpsc::Receiver<Alert>, mut shutdown: watch::Receiver<bool>) {
        let mut resend = tokio::time::interval(Duration::from_millis(self.config.resend_interval_ms));
        resend.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                Some(first) = changes.recv() => {
                    let mut batch = vec![first];
                    while let Ok(more) = changes.try_recv() {
                        batch.push(more);
                    }
                    self.post(&batch).await;
                }
                _ = resend.tick() => self.post(&self.state.active_alerts()).await,
                _ = shutdown.changed() => return,
            }
        }
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
        };
        let p = payload(&alert, "gpu-07", "http://127.0.0.1:9650/");
        assert_eq!(p["labels"]["alertname"], "cpu_saturated");
        assert_eq!(p["labels"]["severity"], "warning");
        assert_eq!(p["labels"]["team"], "ml");
        assert_eq!(p["labels"]["instance"], "gpu-07");
        assert_eq!(p["annotations"]["summary"], "cpu high");
        assert_eq!(p["startsAt"], "1970-01-01T00:00:00.000Z");
        assert_eq!(p["endsAt"], "1970-01-01T00:01:01.000Z");
    }
}
