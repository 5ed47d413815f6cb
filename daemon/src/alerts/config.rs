//! The alerting subsystem's own configuration: `[thresholds]` (when the built-in conditions
//! raise alerts), `[alerts]` (the lifecycle) and `[alertmanager]` (forwarding). The daemon's
//! config reads them from its file; alerting depends on nothing of the config's.

use serde::Deserialize;

use super::store::Lifecycle;

/// The `[thresholds]` table: when alerts are raised.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Thresholds {
    /// Drop rate (0-1) over the window for warning, error and critical.
    pub drop_rate_warning: f64,
    pub drop_rate_error: f64,
    pub drop_rate_critical: f64,
    /// Mean latency over the window for a warning; error and critical are multiples of it.
    pub latency_warning_ms: f64,
    pub latency_error_factor: f64,
    pub latency_critical_factor: f64,
    /// Queue depth as a share of capacity (0-1) that raises `queue_near_full`.
    pub queue_full_ratio: f64,
    /// Memory in use (total - available), in percent, for warning, error and critical.
    pub memory_used_pct_warning: f64,
    pub memory_used_pct_error: f64,
    pub memory_used_pct_critical: f64,
    /// `/proc/pressure/memory` "some avg10" (percent) that raises a memory-pressure warning.
    pub memory_stall_pct_warning: f64,
    /// A GPU's framebuffer in use, in percent, that raises a `gpu_health` warning.
    pub gpu_memory_used_pct_warning: f64,
    /// A GPU's temperature (°C) that raises a `gpu_health` warning, for a GPU that does not
    /// say at what temperature it slows itself down.
    pub gpu_temperature_c_warning: f64,
    /// For a GPU that does say: the warning comes this many °C below its slowdown threshold.
    pub gpu_temperature_margin_c: f64,
    /// How long (s) the hardware must hold a GPU's clocks down without a break before a
    /// `throttle` alert: brief power-brake or thermal blips are normal under load.
    pub gpu_throttle_sustained_s: f64,
    /// An ML job waiting in an NCCL collective with none of its collectives returning for this
    /// long (s) raises a critical `collective_hang`.
    pub collective_hang_s: f64,
    /// An ML job loading data more than this share (percent) of its recent window
    /// (`[scheduler] job_window_s`) raises an `input_bound` warning.
    pub input_bound_pct: f64,
    /// An ML job whose recent step time p99 is this many times its p99 over the last hour raises
    /// a `step_time_regression` warning.
    pub step_p99_regression_factor: f64,
}

impl Thresholds {
    /// Every threshold by its config key, for the snapshot's config summary.
    pub fn by_key(&self) -> std::collections::BTreeMap<String, f64> {
        [
            ("drop_rate_warning", self.drop_rate_warning),
            ("drop_rate_error", self.drop_rate_error),
            ("drop_rate_critical", self.drop_rate_critical),
            ("latency_warning_ms", self.latency_warning_ms),
            ("latency_error_factor", self.latency_error_factor),
            ("latency_critical_factor", self.latency_critical_factor),
            ("queue_full_ratio", self.queue_full_ratio),
            ("memory_used_pct_warning", self.memory_used_pct_warning),
            ("memory_used_pct_error", self.memory_used_pct_error),
            ("memory_used_pct_critical", self.memory_used_pct_critical),
            ("memory_stall_pct_warning", self.memory_stall_pct_warning),
            ("gpu_memory_used_pct_warning", self.gpu_memory_used_pct_warning),
            ("gpu_temperature_c_warning", self.gpu_temperature_c_warning),
            ("gpu_temperature_margin_c", self.gpu_temperature_margin_c),
            ("gpu_throttle_sustained_s", self.gpu_throttle_sustained_s),
            ("collective_hang_s", self.collective_hang_s),
            ("input_bound_pct", self.input_bound_pct),
            ("step_p99_regression_factor", self.step_p99_regression_factor),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            drop_rate_warning: 0.01,
            drop_rate_error: 0.05,
            drop_rate_critical: 0.10,
            latency_warning_ms: 10.0,
            latency_error_factor: 5.0,
            latency_critical_factor: 10.0,
            queue_full_ratio: 0.9,
            memory_used_pct_warning: 90.0,
            memory_used_pct_error: 95.0,
            memory_used_pct_critical: 98.0,
            memory_stall_pct_warning: 10.0,
            gpu_memory_used_pct_warning: 95.0,
            gpu_temperature_c_warning: 85.0,
            gpu_temperature_margin_c: 5.0,
            gpu_throttle_sustained_s: 10.0,
            collective_hang_s: 60.0,
            input_bound_pct: 50.0,
            step_p99_regression_factor: 2.0,
        }
    }
}

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
