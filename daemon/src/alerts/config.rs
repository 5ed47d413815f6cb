//! The alerting subsystem's own configuration: `[thresholds]` (when the built-in conditions
//! raise alerts; declared with their kinds in [`super::kinds`]), `[alerts]` (the lifecycle) and
//! `[alertmanager]` (forwarding). The daemon's
//! config reads them from its file; alerting depends on nothing of the config's.

use serde::Deserialize;

use super::store::Lifecycle;

pub use super::kinds::Thresholds;

/// The `[alerts]` table: the alert lifecycle.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertsConfig {
    /// How long a condition must stay clear before its alert resolves.
    pub clear_for_ms: u64,
    /// A condition returning this soon after its alert resolved reopens the same alert.
    pub flap_window_ms: u64,
    /// Occurrences within the flap window after which an alert counts as flapping.
    pub flap_threshold: u32,
    /// Resolved alerts listed in the console and the API.
    pub resolved_kept: usize,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        let l = Lifecycle::default();
        AlertsConfig {
            clear_for_ms: l.clear_for_ms,
            flap_window_ms: l.flap_window_ms,
            flap_threshold: l.flap_threshold,
            resolved_kept: l.resolved_kept,
        }
    }
}

impl AlertsConfig {
    pub fn lifecycle(&self) -> Lifecycle {
        Lifecycle {
            clear_for_ms: self.clear_for_ms,
            flap_window_ms: self.flap_window_ms,
            flap_threshold: self.flap_threshold,
            resolved_kept: self.resolved_kept,
        }
    }
}

/// The `[alertmanager]` table: forward alerts to a Prometheus Alertmanager (v2 API).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertmanagerConfig {
    /// Base URL, e.g. `http://127.0.0.1:9093` or `https://am.example:9093`.
    pub url: String,
    /// Active alerts are sent again this often, so Alertmanager keeps them firing.
    #[serde(default = "default_resend_ms")]
    pub resend_interval_ms: u64,
    /// A file holding the token sent as `Authorization: Bearer` (an Alertmanager behind an
    /// authenticating proxy); never in the URL.
    #[serde(default)]
    pub bearer_token_file: Option<std::path::PathBuf>,
    /// Basic authentication (an Alertmanager with `basic_auth_users` in its web config, or a
    /// proxy): the user name; the password is read from `basic_auth_password_file`.
    #[serde(default)]
    pub basic_auth_user: Option<String>,
    #[serde(default)]
    pub basic_auth_password_file: Option<std::path::PathBuf>,
    /// The credentials read from those files at start.
    #[serde(skip)]
    pub auth: Option<crate::http_client::Auth>,
    /// For an `https://` URL: PEM certificates to check Alertmanager's against (default: the
    /// system's bundle).
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
}

fn default_resend_ms() -> u64 {
    60_000
}
