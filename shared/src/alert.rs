//! Alerts as the operator sees them.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::decode::Decode;

use crate::UnixMillis;

/// A unit-only enum declared with its wire names, from which `ALL`, `as_str` and `parse` derive:
/// a variant added to the list is listed, named and parsed everywhere at once.
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Decode, JsonSchema)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            pub const ALL: [$name; [$($text),+].len()] = [$($name::$variant),+];

            pub fn parse(text: &str) -> Option<$name> {
                Self::ALL.into_iter().find(|v| v.as_str() == text)
            }

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }
    };
}

named_enum! {
    pub enum Severity {
        Info = "info",
        Warning = "warning",
        Error = "error",
        Critical = "critical",
    }
}

named_enum! {
    /// A kind of alert: the built-in kinds (declared with their conditions and thresholds in the
    /// daemon's `alerts::kinds`) and `rule`.
    pub enum AlertType {
        HighDropRate = "high_drop_rate",
        HighLatency = "high_latency",
        QueueNearFull = "queue_near_full",
        KernelError = "kernel_error",
        MemoryPressure = "memory_pressure",
        /// A metrics source failed to collect.
        SourceFailure = "source_failure",
        /// A rule from the `[[rules]]` of the config; `Alert::rule` names it.
        Rule = "rule",
        /// The kernel stopped the sched_ext scheduler (watchdog, error, sysrq); the daemon fell back
        /// to setting nice values and affinity.
        SchedulerEjected = "scheduler_ejected",
        /// A GPU in trouble: lost, uncorrectable ECC errors, rows waiting to be remapped or a remap
        /// that failed, clocks held down by the hardware, memory nearly full, running hot.
        GpuHealth = "gpu_health",
        /// An ML job waits in an NCCL collective and none of its collective calls has returned for
        /// `collective_hang_s`: one rank has probably stalled.
        CollectiveHang = "collective_hang",
        /// An ML job spends more than `input_bound_pct` of its recent time loading data.
        InputBound = "input_bound",
        /// An ML job's recent step time p99 is `step_p99_regression_factor` times its own over the
        /// last hour.
        StepTimeRegression = "step_time_regression",
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct Alert {
    pub id: u64,
    pub alert_type: AlertType,
    /// The config rule that raised it, for `alert_type: rule`.
    pub rule: Option<String>,
    pub severity: Severity,
    /// What the alert is about: `host`, `kernel:<id>`, `source:<name>`.
    pub source: String,
    /// Labels from the rule, passed on to Alertmanager.
    pub labels: BTreeMap<String, String>,
    pub message: String,
    /// The measured value that crossed the threshold (latest while the alert stands).
    pub value: f64,
    /// The threshold of the current severity.
    pub threshold: f64,
    pub raised_at_ms: UnixMillis,
    pub updated_at_ms: UnixMillis,
    pub resolved_at_ms: Option<UnixMillis>,
    pub acknowledgement: Option<Acknowledgement>,
    /// How many times this alert fired: it reopens, instead of a new alert being raised, when
    /// its condition returns soon after it resolved.
    pub occurrence: u32,
    /// Fired and cleared repeatedly within the flap window.
    pub flapping: bool,
    /// What happened to the alert, oldest first (the most recent ones only).
    pub transitions: Vec<AlertTransition>,
    /// The silence in force over it: still raised and recorded, not forwarded nor counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silenced: Option<crate::Silenced>,
}

impl Alert {
    pub fn is_active(&self) -> bool {
        self.resolved_at_ms.is_none()
    }

    /// Alertmanager's `alertname`: the rule's name, else the alert type.
    pub fn name(&self) -> &str {
        self.rule.as_deref().unwrap_or(self.alert_type.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct Acknowledgement {
    /// Who acknowledged: the name the person gave, else the name of their token.
    pub by: String,
    /// Name of the token the acknowledgement was made with.
    pub token: String,
    pub at_ms: UnixMillis,
    pub note: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Decode, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TransitionKind {
    Raised,
    Escalated,
    Deescalated,
    Acknowledged,
    Resolved,
    Reopened,
}

impl TransitionKind {
    pub const ALL: [TransitionKind; 6] = [
        TransitionKind::Raised,
        TransitionKind::Escalated,
        TransitionKind::Deescalated,
        TransitionKind::Acknowledged,
        TransitionKind::Resolved,
        TransitionKind::Reopened,
    ];

    pub fn parse(text: &str) -> Option<TransitionKind> {
        Self::ALL.into_iter().find(|v| v.as_str() == text)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TransitionKind::Raised => "raised",
            TransitionKind::Escalated => "escalated",
            TransitionKind::Deescalated => "deescalated",
            TransitionKind::Acknowledged => "acknowledged",
            TransitionKind::Resolved => "resolved",
            TransitionKind::Reopened => "reopened",
        }
    }
}

/// One step in an alert's life, with the severity and value at that moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct AlertTransition {
    pub at_ms: UnixMillis,
    pub kind: TransitionKind,
    pub severity: Severity,
    pub value: f64,
    /// For acknowledgements: who, and their note.
    pub by: Option<String>,
    pub note: Option<String>,
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Decode, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Watch the console and read the API.
    Viewer,
    /// Also acknowledge alerts.
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }
}
