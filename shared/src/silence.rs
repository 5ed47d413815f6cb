//! Silences: alerts matching them are still raised and recorded, but not forwarded to
//! Alertmanager, not counted in the console's badge, and shown as silenced.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::decode::Decode;

use crate::{Alert, UnixMillis};

/// Most matchers one silence holds.
pub const MAX_MATCHERS: usize = 16;
/// Longest matcher name, matcher value or comment, in bytes.
pub const MAX_TEXT: usize = 1024;

/// `name = value`: what an alert must have to be silenced. `name` is one of `alertname` (the
/// rule's name, else the alert type), `alert_type`, `severity`, `source`, `alert_id`, or a label
/// of the alert (`job`, `pid`, `gpu`, a rule's own labels).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct Matcher {
    pub name: String,
    pub value: String,
}

impl Matcher {
    pub fn new(name: &str, value: &str) -> Matcher {
        Matcher { name: name.into(), value: value.into() }
    }

    pub fn matches(&self, alert: &Alert) -> bool {
        let id;
        let found = match self.name.as_str() {
            "alertname" => Some(alert.name()),
            "alert_type" => Some(alert.alert_type.as_str()),
            "severity" => Some(alert.severity.as_str()),
            "source" => Some(alert.source.as_str()),
            "alert_id" => {
                id = alert.id.to_string();
                Some(id.as_str())
            }
            label => alert.labels.get(label).map(String::as_str),
        };
        found == Some(self.value.as_str())
    }
}

/// A silence: by matchers (all must hold), from a start to an end, or until nothing it matches
/// is active any more (`ends_at_ms` absent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct Silence {
    pub id: u64,
    pub matchers: Vec<Matcher>,
    pub starts_at_ms: UnixMillis,
    /// Absent: until every alert it matches has resolved.
    pub ends_at_ms: Option<UnixMillis>,
    pub comment: String,
    /// Who created it: the name they gave, else their token's; `config` for a maintenance
    /// window.
    pub created_by: String,
    pub created_at_ms: UnixMillis,
    /// Set when it was expired early (`DELETE /api/silences/{id}`) or its alerts resolved.
    pub expired_at_ms: Option<UnixMillis>,
    pub expired_by: Option<String>,
    /// The maintenance window of the config it stands for (such silences are not stored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<String>,
}

impl Silence {
    /// In force at `now_ms`.
    pub fn is_active(&self, now_ms: UnixMillis) -> bool {
        self.expired_at_ms.is_none_or(|at| at > now_ms)
            && self.starts_at_ms <= now_ms
            && self.ends_at_ms.is_none_or(|end| end > now_ms)
    }

    /// Over: expired, or past its end.
    pub fn is_over(&self, now_ms: UnixMillis) -> bool {
        self.expired_at_ms.is_some_and(|at| at <= now_ms) || self.ends_at_ms.is_some_and(|end| end <= now_ms)
    }

    /// Every matcher holds for `alert` (a silence without matchers matches nothing).
    pub fn matches(&self, alert: &Alert) -> bool {
        !self.matchers.is_empty() && self.matchers.iter().all(|m| m.matches(alert))
    }

    /// Why these matchers, times and comment cannot make a silence.
    pub fn check(&self) -> Result<(), String> {
        if self.matchers.is_empty() || self.matchers.len() > MAX_MATCHERS {
            return Err(format!("a silence needs 1 to {MAX_MATCHERS} matchers"));
        }
        for m in &self.matchers {
            if m.name.is_empty() || m.name.len() > MAX_TEXT || m.value.len() > MAX_TEXT {
                return Err(format!("matcher names are 1 to {MAX_TEXT} bytes, values at most {MAX_TEXT}"));
            }
        }
        if self.comment.len() > MAX_TEXT {
            return Err(format!("the comment is longer than {MAX_TEXT} bytes"));
        }
        if self.ends_at_ms.is_some_and(|end| end <= self.starts_at_ms) {
            return Err("a silence must end after it starts".into());
        }
        Ok(())
    }
}

/// What silences an alert, as the alert carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct Silenced {
    pub silence_id: u64,
    pub by: String,
    /// Absent: until the alert resolves.
    pub until_ms: Option<UnixMillis>,
    pub comment: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<String>,
}

impl From<&Silence> for Silenced {
    fn from(s: &Silence) -> Silenced {
        Silenced {
            silence_id: s.id,
            by: s.created_by.clone(),
            until_ms: s.ends_at_ms,
            comment: s.comment.clone(),
            maintenance: s.maintenance.clone(),
        }
    }
}

/// `POST /api/silences`: what to silence, and for how long.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSilence {
    pub matchers: Vec<Matcher>,
    /// Default: now.
    #[serde(default)]
    pub starts_at_ms: Option<UnixMillis>,
    /// One of `ends_at_ms`, `duration_ms`, or `until_resolved: true`.
    #[serde(default)]
    pub ends_at_ms: Option<UnixMillis>,
    #[serde(default)]
    pub duration_ms: Option<u64>,
    #[serde(default)]
    pub until_resolved: bool,
    #[serde(default)]
    pub comment: String,
    /// The name of the person, shown as who created it (default: the token's name).
    #[serde(default)]
    pub by: Option<String>,
}

/// One batch sent to Alertmanager (or that failed to be): the notification log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct Notification {
    /// Order of sending, from 1.
    pub seq: u64,
    pub at_ms: UnixMillis,
    /// The alerts in the batch.
    pub alerts: Vec<NotifiedAlert>,
    /// Alertmanager took the batch.
    pub ok: bool,
    /// `HTTP 200`, or why not (clipped to 300 characters).
    pub outcome: String,
}

/// An alert as it was sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct NotifiedAlert {
    pub id: u64,
    pub name: String,
    /// Sent as resolved (`endsAt` its resolution).
    pub resolved: bool,
}
