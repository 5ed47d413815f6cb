//! Incident bundles: the evidence the daemon keeps when an alert of a configured severity fires —
//! the alert, the node's history around it, each ML thread's phases and the scheduler's
//! decisions — as JSON (`/api/incidents/{id}`, schema at `/api/schema/incident`) and as a Chrome
//! trace event file (`/api/incidents/{id}/trace`) that Perfetto and `chrome://tracing` open.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::decode::Decode;
use serde_json::{json, Value};

use crate::alert::{Alert, AlertType, Severity, TransitionKind};
use crate::snapshot::{Decision, HistoryPoint, NodeIdentity, Phase, PhaseSpan, PhaseValues};
use crate::UnixMillis;

/// Version of the bundle's layout; bumped on any change a reader of version 1 could not read.
pub const INCIDENT_SCHEMA_VERSION: u32 = 1;

/// Everything kept of one incident.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct IncidentBundle {
    pub schema_version: u32,
    pub id: u64,
    pub node: NodeIdentity,
    /// The alert as it stood when the bundle was closed, with its transitions.
    pub alert: Alert,
    /// When the alert fired (raised or reopened).
    pub fired_at_ms: UnixMillis,
    /// The span the evidence covers: from `[incidents] before_s` before the alert fired (or the
    /// daemon's start, if later) to `after_s` after it (or the daemon's stop, if earlier).
    pub start_ms: UnixMillis,
    pub end_ms: UnixMillis,
    /// False when the span was cut short (the daemon stopped) or is still being recorded.
    pub complete: bool,
    /// The collection interval: the resolution of `history`, `scheduler` and `threads`.
    pub interval_ms: u64,
    /// The node at each tick of the span: host, ring kernels, GPUs.
    pub history: Vec<HistoryPoint>,
    /// The scheduler at each tick of the span.
    pub scheduler: Vec<SchedulerPoint>,
    /// Each ML process's phase timeline over the span, as the phase detector measured it.
    pub processes: Vec<ProcessTimeline>,
    /// Each ML thread's phase over the span, sampled at every tick.
    pub threads: Vec<ThreadTimeline>,
    /// The scheduler's decisions over the span, oldest first.
    pub decisions: Vec<Decision>,
    /// What happened to any alert over the span (this one included), oldest first.
    pub alert_events: Vec<AlertEvent>,
    /// What the bundle leaves out, and why (bounds reached, records lost).
    #[serde(default)]
    pub notes: Vec<String>,
}

/// The scheduler at one tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct SchedulerPoint {
    pub t_ms: UnixMillis,
    pub ml_tasks: u64,
    /// ML threads in each phase.
    pub phase_distribution: PhaseValues<u64>,
    /// Cumulative.
    pub decisions_made: u64,
    /// Cumulative.
    pub phase_transitions: u64,
}

/// One ML process over the span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct ProcessTimeline {
    pub pid: u32,
    /// The job's main process.
    pub job: u32,
    pub comm: String,
    pub cmdline: String,
    /// Its user was not admitted for alerting (see `MlProcessInfo::untrusted`): a viewer is
    /// given the bundle without its command line unless `[server] viewers_see_untrusted`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub untrusted: bool,
    pub spans: Vec<PhaseSpan>,
}

/// One ML thread over the span: its phase at each tick, runs of one phase merged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct ThreadTimeline {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub spans: Vec<ThreadSpan>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct ThreadSpan {
    pub phase: Phase,
    pub start_ms: UnixMillis,
    pub end_ms: UnixMillis,
}

/// A step in some alert's life during the span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct AlertEvent {
    pub at_ms: UnixMillis,
    pub alert_id: u64,
    pub kind: TransitionKind,
    pub severity: Severity,
    /// The rule's name, else the alert type.
    pub name: String,
    pub source: String,
    pub message: String,
}

/// A bundle as listed: on the alert in the console and at `/api/incidents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct IncidentSummary {
    pub id: u64,
    pub alert_id: u64,
    pub alert_type: AlertType,
    pub rule: Option<String>,
    pub severity: Severity,
    pub source: String,
    pub message: String,
    pub fired_at_ms: UnixMillis,
    pub start_ms: UnixMillis,
    /// Where recording ends (or ended).
    pub end_ms: UnixMillis,
    /// Still recording: the file is written at `end_ms`.
    pub recording: bool,
    /// See [`IncidentBundle::complete`].
    pub complete: bool,
    /// Size of the JSON file (0 while recording).
    pub bytes: u64,
    pub threads: u32,
}

/// The JSON Schema of [`IncidentBundle`], as served at `/api/schema/incident`.
pub fn incident_schema() -> Value {
    serde_json::to_value(schemars::schema_for!(IncidentBundle)).unwrap_or_default()
}

/// Chrome trace timestamps are microseconds.
fn us(ms: UnixMillis) -> u64 {
    ms.saturating_mul(1000)
}

/// The process id the node's own tracks (counters, alerts) go under in the trace: no real
/// process has it.
pub const TRACE_NODE_PID: u32 = 0;

impl IncidentBundle {
    /// What a viewer is given unless `[server] viewers_see_untrusted`: processes not admitted
    /// for alerting without their command lines. How many were changed.
    pub fn hide_untrusted_details(&mut self) -> usize {
        let mut hidden = 0;
        for p in self.processes.iter_mut().filter(|p| p.untrusted) {
            p.cmdline = crate::snapshot::HIDDEN_FROM_VIEWERS.to_string();
            hidden += 1;
        }
        hidden
    }

    /// The bundle as a Chrome trace event file (JSON object format): each ML thread a track
    /// (named, under its process) with its phases as complete (`X`) slices; each ML process's
    /// measured timeline as async slices on the process; decisions as instant events on their
    /// thread; alert events as global instant events; the node's CPU, memory and GPU figures
    /// as counters of a `node` process (pid 0). Timestamps are Unix time in microseconds.
    pub fn chrome_trace(&self) -> Value {
        let mut events = Vec::new();
        let node_name = format!("node {}", self.node.hostname);
        events.push(json!({"ph": "M", "name": "process_name", "pid": TRACE_NODE_PID, "tid": 0,
            "args": {"name": node_name}}));
        let mut named_processes = std::collections::BTreeSet::new();
        for p in &self.processes {
            named_processes.insert(p.pid);
            events.push(json!({"ph": "M", "name": "process_name", "pid": p.pid, "tid": 0,
                "args": {"name": format!("{} (pid {}, job {})", p.comm, p.pid, p.job)}}));
            for (n, span) in p.spans.iter().enumerate() {
                let id = format!("{}-{n}", p.pid);
                let args = json!({"waiting_for_cpu": span.waiting_for_cpu});
                events.push(json!({"ph": "b", "cat": "process_phase", "name": span.phase.as_str(), "id": id,
                    "pid": p.pid, "tid": p.pid, "ts": us(span.start_ms), "args": args}));
                events.push(json!({"ph": "e", "cat": "process_phase", "name": span.phase.as_str(), "id": id,
                    "pid": p.pid, "tid": p.pid, "ts": us(span.end_ms)}));
            }
        }
        for t in &self.threads {
            if named_processes.insert(t.pid) {
                events.push(json!({"ph": "M", "name": "process_name", "pid": t.pid, "tid": 0,
                    "args": {"name": format!("pid {}", t.pid)}}));
            }
            events.push(json!({"ph": "M", "name": "thread_name", "pid": t.pid, "tid": t.tid,
                "args": {"name": format!("{} ({})", t.comm, t.tid)}}));
            for span in &t.spans {
                events.push(json!({"ph": "X", "cat": "phase", "name": span.phase.as_str(), "pid": t.pid,
                    "tid": t.tid, "ts": us(span.start_ms), "dur": us(span.end_ms.saturating_sub(span.start_ms))}));
            }
        }
        for d in &self.decisions {
            events.push(json!({"ph": "i", "s": "t", "cat": "decision", "name": d.action, "pid": d.pid,
                "tid": d.tid, "ts": us(d.at_ms), "args": {"phase": d.phase.as_str(), "reason": d.reason,
                "applied": d.applied, "error": d.error, "nice": d.nice, "cpus": d.cpus}}));
        }
        for a in &self.alert_events {
            events.push(json!({"ph": "i", "s": "g", "cat": "alert",
                "name": format!("{} {} ({})", a.name, a.kind.as_str(), a.severity.as_str()),
                "pid": TRACE_NODE_PID, "tid": 0, "ts": us(a.at_ms),
                "args": {"alert_id": a.alert_id, "source": a.source, "message": a.message}}));
        }
        for p in &self.history {
            let mut node = serde_json::Map::new();
            node.insert("cpu_pct".into(), json!(p.cpu_pct));
            node.insert("iowait_pct".into(), json!(p.iowait_pct));
            node.insert("mem_used_pct".into(), json!(p.mem_used_pct));
            events.push(json!({"ph": "C", "name": "host", "pid": TRACE_NODE_PID, "tid": 0, "ts": us(p.t_ms),
                "args": node}));
            for g in &p.gpus {
                let mut gpu = serde_json::Map::new();
                for (key, value) in [("utilization_pct", g.utilization_pct), ("memory_used_pct", g.memory_used_pct)] {
                    if let Some(v) = value {
                        gpu.insert(key.into(), json!(v));
                    }
                }
                if !gpu.is_empty() {
                    events.push(json!({"ph": "C", "name": format!("gpu {}", g.index), "pid": TRACE_NODE_PID,
                        "tid": 0, "ts": us(p.t_ms), "args": gpu}));
                }
            }
        }
        for s in &self.scheduler {
            let args: serde_json::Map<String, Value> = Phase::ALL
                .iter()
                .map(|phase| (phase.as_str().to_string(), json!(s.phase_distribution.get(*phase))))
                .collect();
            events.push(json!({"ph": "C", "name": "ml threads by phase", "pid": TRACE_NODE_PID, "tid": 0,
                "ts": us(s.t_ms), "args": args}));
        }
        json!({
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": {
                "ringside_incident": self.id,
                "alert_id": self.alert.id,
                "alert": self.alert.message,
                "node": self.node.hostname,
                "fired_at_ms": self.fired_at_ms,
                "start_ms": self.start_ms,
                "end_ms": self.end_ms,
                "complete": self.complete,
            },
        })
    }

    pub fn summary(&self, bytes: u64) -> IncidentSummary {
        IncidentSummary {
            id: self.id,
            alert_id: self.alert.id,
            alert_type: self.alert.alert_type,
            rule: self.alert.rule.clone(),
            severity: self.alert.severity,
            source: self.alert.source.clone(),
            message: self.alert.message.clone(),
            fired_at_ms: self.fired_at_ms,
            start_ms: self.start_ms,
            end_ms: self.end_ms,
            recording: false,
            complete: self.complete,
            bytes,
            threads: self.threads.len() as u32,
        }
    }
}
