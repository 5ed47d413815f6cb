//! The history API (`GET /api/history`, `GET /api/history/series`): what the daemon keeps of
//! every charted series and rule metric, downsampled to what a chart can show.
//!
//! A series is named `<metric>@<source>`: the metric as `[[rules]]` know it (or a chart's own
//! name, such as `kernel.latency_p99_ns`) and what it is about, as an alert's `source` writes
//! it, e.g. `gpu.utilization_pct@gpu:0`, `job.data_loading_pct@job:4242`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::decode::Decode;

use crate::UnixMillis;

/// At most this many series in one request.
pub const HISTORY_MAX_SERIES: usize = 32;
/// At most this many buckets per series in one answer.
pub const HISTORY_MAX_POINTS: usize = 4000;
/// Buckets per series when the request names none.
pub const HISTORY_DEFAULT_POINTS: usize = 600;
/// The longest range one request may cover: the coarse tier's 7 days, and a day of slack.
pub const HISTORY_MAX_RANGE_MS: u64 = 8 * 24 * 3600 * 1000;

/// The name of a series: `<metric>@<source>`.
pub fn history_key(metric: &str, source: &str) -> String {
    format!("{metric}@{source}")
}

/// `(metric, source)` of a series name.
pub fn split_history_key(key: &str) -> Option<(&str, &str)> {
    key.split_once('@')
}

/// The answer to `GET /api/history`: each series asked for, in the order asked, over
/// `points` buckets of `step_ms` from `from_ms`. Bucket `i` covers
/// `[from_ms + i * step_ms, from_ms + (i + 1) * step_ms)`; a bucket without data is `null` in
/// all three arrays (the daemon was down, the GPU was not there).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct HistoryResponse {
    pub from_ms: UnixMillis,
    pub to_ms: UnixMillis,
    pub step_ms: u64,
    pub points: usize,
    pub series: Vec<HistorySeries>,
}

/// One series, downsampled: each bucket's lowest and highest value and its mean, so that a
/// one-second spike still shows in a bucket of an hour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct HistorySeries {
    pub key: String,
    /// The finest data the buckets were made from: 1000 (one value a second, kept 24 h) or
    /// 60000 (a minute's min/max/mean, kept 7 days); the coarser where the range used both.
    pub resolution_ms: u64,
    /// Whether the daemon holds this series at all (a wrong name, or one long gone, is not).
    pub known: bool,
    pub min: Vec<Option<f64>>,
    pub max: Vec<Option<f64>>,
    pub mean: Vec<Option<f64>>,
}

impl HistorySeries {
    /// `(bucket start, min, max, mean)` of every bucket with data.
    pub fn buckets<'a>(&'a self, from_ms: UnixMillis, step_ms: u64) -> impl Iterator<Item = (u64, f64, f64, f64)> + 'a {
        (0..self.mean.len()).filter_map(move |i| {
            let (min, max, mean) = (self.min[i]?, self.max[i]?, self.mean[i]?);
            Some((from_ms + i as u64 * step_ms, min, max, mean))
        })
    }
}

/// The answer to `GET /api/history/series`: every series held, with the time it covers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct HistoryCatalog {
    pub series: Vec<HistorySeriesInfo>,
    /// Since when the fine (1 s) tier holds data, and the coarse (1 min) one.
    pub fine_from_ms: Option<UnixMillis>,
    pub coarse_from_ms: Option<UnixMillis>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct HistorySeriesInfo {
    pub key: String,
    pub first_ms: UnixMillis,
    pub last_ms: UnixMillis,
}

/// The JSON Schema of [`HistoryResponse`], as served at `/api/schema/history`.
pub fn history_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(HistoryResponse)).unwrap_or_default()
}

/// Buckets per series in an export: one a second up to this many.
pub const HISTORY_EXPORT_POINTS: usize = 1000;

/// `GET /api/history/export`: a range of the node's history, every series asked for (all held,
/// by default), with the alerts that were active in it. `?format=trace` gives it as a Chrome
/// trace instead ([`HistoryExport::chrome_trace`]), as incident bundles are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct HistoryExport {
    pub hostname: String,
    pub exported_at_ms: UnixMillis,
    pub history: HistoryResponse,
    /// Alerts the daemon still holds that were active at some time in the range.
    pub alerts: Vec<crate::Alert>,
}

impl HistoryExport {
    /// The export as Chrome trace events: one counter track per series (its min, mean and max
    /// per bucket) and one span per alert, from raised to resolved (or the range's end).
    pub fn chrome_trace(&self) -> serde_json::Value {
        use serde_json::json;
        let us = |ms: u64| ms.saturating_mul(1000);
        let h = &self.history;
        let mut events = vec![json!({"ph": "M", "name": "process_name", "pid": crate::incident::TRACE_NODE_PID,
            "tid": 0, "args": {"name": format!("node {}", self.hostname)}})];
        for s in &h.series {
            for (t, min, max, mean) in s.buckets(h.from_ms, h.step_ms) {
                events.push(json!({"ph": "C", "name": s.key, "pid": crate::incident::TRACE_NODE_PID, "tid": 0,
                    "ts": us(t), "args": {"min": min, "mean": mean, "max": max}}));
            }
        }
        for a in &self.alerts {
            let start = a.raised_at_ms.max(h.from_ms);
            let end = a.resolved_at_ms.unwrap_or(h.to_ms).min(h.to_ms);
            events.push(json!({"ph": "X", "cat": "alert", "name": format!("{} ({})", a.name(), a.severity.as_str()),
                "pid": crate::incident::TRACE_NODE_PID, "tid": 1, "ts": us(start), "dur": us(end.saturating_sub(start)),
                "args": {"alert_id": a.id, "source": a.source, "message": a.message}}));
        }
        json!({"traceEvents": events, "displayTimeUnit": "ms"})
    }
}
