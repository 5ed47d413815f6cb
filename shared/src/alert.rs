//! Alerts as the operator sees them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::snapshot::UnixMillis;

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Error,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
            Severity::Critical => "critical",
        }
    }
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum AlertType {
    HighDropRate,
    HighLatency,
    QueueNearFull,
    KernelError,
    MemoryPressure,
    /// A metrics source failed to collect.
    SourceFailure,
}

impl AlertType {
    pub fn as_str(self) -> &'static str {
        match self {
            AlertType::HighDropRate => "high_drop_rate",
            AlertType::HighLatency => "high_latency",
            AlertType::QueueNearFull => "queue_near_full",
            AlertType::KernelError => "kernel_error",
            AlertType::MemoryPressure => "memory_pressure",
            AlertType::SourceFailure => "source_failure",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Alert {
    pub id: u64,
    pub alert_type: AlertType,
    pub severity: Severity,
    /// What the alert is about: `host`, `kernel:<id>`, `source:<name>`.
    pub source: String,
    pub message: String,
    /// The measured value that crossed the threshold (latest while the alert stands).
    pub value: f64,
    /// The threshold of the current severity.
    pub threshold: f64,
    pub raised_at_ms: UnixMillis,
    pub updated_at_ms: UnixMillis,
    pub resolved_at_ms: Option<UnixMillis>,
    pub acknowledgement: Option<Acknowledgement>,
}

impl Alert {
    pub fn is_active(&self) -> bool {
        self.resolved_at_ms.is_none()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Acknowledgement {
    /// Who acknowledged: the name the client gave, else how and from where it came.
    pub by: String,
    pub at_ms: UnixMillis,
    pub note: Option<String>,
}
