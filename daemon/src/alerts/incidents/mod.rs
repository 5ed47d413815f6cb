//! Incident bundles: when an alert of `[incidents] min_severity` or above fires, the evidence
//! around it is kept. The [`Recorder`] keeps the last `before_s + after_s` of every tick in
//! memory (the node's history point, the scheduler's counts, each ML thread's phase timeline
//! from the scheduler's thread events, each ML process's measured timeline, the decisions,
//! the alert events); `after_s` after the alert fired it hands the span to the [`store`],
//! whose own thread assembles the bundle and writes it to the data dir, bounded in count and
//! bytes (the oldest removed first).
//!
//! Every input is bounded: at most [`MAX_THREADS`] threads and [`MAX_PROCESSES`] processes
//! per bundle, [`MAX_PROCESS_SPANS`] spans per process, [`MAX_DECISIONS`] decisions and
//! [`MAX_EVENTS`] alert events kept; what is left out is said in the bundle's `notes`.

pub mod store;
mod threads;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use ringside_shared::incident::{
    AlertEvent, IncidentBundle, IncidentSummary, ProcessTimeline, SchedulerPoint, INCIDENT_SCHEMA_VERSION,
};
use ringside_shared::{Alert, Decision, HistoryPoint, NodeIdentity, PhaseSpan, Severity, TransitionKind};
use serde::Deserialize;

use super::store::AlertChange;
use crate::pipeline::Sample;
use threads::{MAX_THREAD_SPANS, MAX_TRACKED_THREADS};

/// Distinct threads, and processes, one bundle holds at most.
pub const MAX_THREADS: usize = 256;
pub const MAX_PROCESSES: usize = 64;
/// Measured phase spans kept per process.
pub const MAX_PROCESS_SPANS: usize = 5000;
/// Decisions and alert events kept in memory (and so in a bundle) at most.
pub const MAX_DECISIONS: usize = 5000;
pub const MAX_EVENTS: usize = 2000;
/// Ticks the recorder keeps at most: `(before_s + after_s) / interval` must fit.
pub const MAX_FRAMES: u64 = 20_000;
/// A bundle still recording is written as a checkpoint when its alert fires and then this
/// often, so that a daemon killed before the span ends (`kill -9`, the OOM killer) still
/// leaves the evidence from before the alert.
pub const CHECKPOINT_MS: u64 = 30_000;

/// The `[incidents]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IncidentsConfig {
    pub enabled: bool,
    /// Alerts of this severity or above get a bundle when they fire (raised, reopened, or
    /// escalated to it).
    pub min_severity: Severity,
    /// Seconds of evidence kept from before the alert fired, and recorded after it.
    pub before_s: u64,
    pub after_s: u64,
    /// Bundles kept on disk at most, by count and by total size; the oldest go first.
    pub max_count: usize,
    pub max_bytes: u64,
}

impl Default for IncidentsConfig {
    fn default() -> Self {
        IncidentsConfig {
            enabled: true,
            min_severity: Severity::Critical,
            before_s: 300,
            after_s: 120,
            max_count: 50,
            max_bytes: 256 * 1024 * 1024,
        }
    }
}

impl IncidentsConfig {
    /// Why the table cannot be used, at the given collection interval.
    pub fn check(&self, interval_ms: u64) -> Result<(), crate::invalid::Invalid> {
        use crate::invalid::Invalid;
        Invalid::range("incidents.before_s", self.before_s, 0, 3600)?;
        Invalid::range("incidents.after_s", self.after_s, 0, 3600)?;
        Invalid::range("incidents.max_count", self.max_count, 1, 10_000)?;
        Invalid::range("incidents.max_bytes", self.max_bytes, 1024 * 1024, u64::MAX)?;
        let frames = (self.before_s + self.after_s) * 1000 / interval_ms.max(1);
        if frames > MAX_FRAMES {
            let why = format!(
                "{frames} collection ticks at interval_ms {interval_ms}: at most {MAX_FRAMES} are kept in memory; \
                 shorten the span or lengthen the interval"
            );
            return Err(Invalid::new("incidents.before_s + after_s", self.before_s + self.after_s, why));
        }
        Ok(())
    }
}

/// One tick as the recorder keeps it.
#[derive(Debug)]
pub struct Frame {
    t_ms: u64,
    point: Option<HistoryPoint>,
    scheduler: Option<SchedulerPoint>,
    /// The ML threads the scheduler listed (its busiest), in its order.
    listed: Vec<u32>,
    /// Decisions made this tick that the scheduler's list no longer held, thread events the
    /// observer gave up, and threads not followed (beyond [`MAX_TRACKED_THREADS`]).
    decisions_missed: u64,
    thread_events_lost: u64,
    threads_refused: u64,
}

/// A process's measured timeline, merged tick after tick.
#[derive(Debug, Default)]
struct ProcessTrack {
    job: u32,
    comm: String,
    cmdline: String,
    untrusted: bool,
    last_seen_ms: u64,
    spans: VecDeque<PhaseSpan>,
    spans_dropped: u64,
}

impl ProcessTrack {
    /// Folds in the scheduler's latest timeline (the last two minutes, oldest first; its last
    /// span grows until the phase changes).
    fn merge(&mut self, timeline: &[PhaseSpan]) {
        let known_start = self.spans.back().map(|s| s.start_ms);
        for span in timeline {
            match known_start {
                Some(start) if span.start_ms < start => continue,
                Some(start) if span.start_ms == start => {
                    if let Some(last) = self.spans.back_mut() {
                        *last = span.clone();
                    }
                }
                _ => self.spans.push_back(span.clone()),
            }
        }
        while self.spans.len() > MAX_PROCESS_SPANS {
            self.spans.pop_front();
            self.spans_dropped += 1;
        }
    }
}

/// A bundle being recorded.
#[derive(Debug, Clone)]
struct Pending {
    id: u64,
    alert: Alert,
    fired_at_ms: u64,
    start_ms: u64,
    end_ms: u64,
    /// When its next checkpoint is due.
    checkpoint_ms: u64,
}

/// What the store's thread needs to assemble one bundle.
#[derive(Debug)]
pub struct Parts {
    /// Everything but what is assembled from the frames (`history`, `scheduler`).
    bundle: IncidentBundle,
    frames: Vec<Arc<Frame>>,
    /// A checkpoint of a bundle still recording, replaced by the bundle once written.
    checkpoint: bool,
}

impl Parts {
    pub fn id(&self) -> u64 {
        self.bundle.id
    }

    /// Listed as recording until written.
    pub fn summary(&self) -> IncidentSummary {
        let b = &self.bundle;
        recording(b.id, &b.alert, b.fired_at_ms, b.start_ms, b.end_ms)
    }
}

/// The main pid of the job an alert is about (its `job` label), if any.
fn alert_job(alert: &Alert) -> Option<u32> {
    alert.labels.get("job").and_then(|j| j.parse().ok())
}

/// A bundle not yet written, as listed.
fn recording(id: u64, alert: &Alert, fired_at_ms: u64, start_ms: u64, end_ms: u64) -> IncidentSummary {
    IncidentSummary {
        id,
        alert_id: alert.id,
        alert_type: alert.alert_type,
        rule: alert.rule.clone(),
        severity: alert.severity,
        source: alert.source.clone(),
        message: alert.message.clone(),
        fired_at_ms,
        start_ms,
        end_ms,
        recording: true,
        complete: false,
        bytes: 0,
        threads: 0,
    }
}

/// Keeps the recent evidence and the bundles being recorded.
pub struct Recorder {
    config: IncidentsConfig,
    node: NodeIdentity,
    interval_ms: u64,
    frames: VecDeque<Arc<Frame>>,
    threads: threads::ThreadTracks,
    processes: HashMap<u32, ProcessTrack>,
    decisions: VecDeque<Decision>,
    decisions_made: Option<u64>,
    events: VecDeque<AlertEvent>,
    pending: VecDeque<Pending>,
    /// Finished bundles the writer has no room for yet, oldest first (at most `max_count`).
    finished: VecDeque<Box<Parts>>,
    next_id: u64,
    store: store::BundleStore,
    /// The list changed since it was last taken.
    changed: bool,
}

impl Recorder {
    pub fn new(config: IncidentsConfig, node: NodeIdentity, interval_ms: u64, store: store::BundleStore) -> Recorder {
        let next_id = store.next_id();
        Recorder {
            config,
            node,
            interval_ms: interval_ms.max(1),
            frames: VecDeque::new(),
            threads: threads::ThreadTracks::default(),
            processes: HashMap::new(),
            decisions: VecDeque::new(),
            decisions_made: None,
            events: VecDeque::new(),
            pending: VecDeque::new(),
            finished: VecDeque::new(),
            next_id,
            store,
            changed: false,
        }
    }

    pub fn store(&self) -> &store::BundleStore {
        &self.store
    }

    /// How long frames are kept: the span of a bundle closed now started this long ago.
    fn keep_ms(&self) -> u64 {
        (self.config.before_s + self.config.after_s) * 1000 + 2 * self.interval_ms
    }

    /// Folds one tick in: keeps its evidence, starts a bundle for each alert that fired at or
    /// above `min_severity`, and hands every bundle whose span has ended to the store.
    pub fn record(&mut self, sample: &Sample, point: Option<&HistoryPoint>, changes: &[AlertChange]) {
        if !self.config.enabled {
            return;
        }
        let now = sample.taken_at_ms;
        self.keep_frame(sample, point);
        for change in changes {
            self.note_change(change, now);
        }
        let horizon = now.saturating_sub(self.keep_ms());
        while self.frames.front().is_some_and(|f| f.t_ms < horizon) {
            self.frames.pop_front();
        }
        self.threads.prune(horizon);
        self.processes.retain(|_, p| p.last_seen_ms >= horizon);
        for p in self.processes.values_mut() {
            while p.spans.front().is_some_and(|s| s.end_ms < horizon) {
                p.spans.pop_front();
            }
        }
        while self.decisions.front().is_some_and(|d| d.at_ms < horizon) {
            self.decisions.pop_front();
        }
        while self.events.front().is_some_and(|e| e.at_ms < horizon) {
            self.events.pop_front();
        }
        self.checkpoint(now);
        while self.pending.front().is_some_and(|p| p.end_ms <= now) {
            if let Some(done) = self.pending.pop_front() {
                let parts = self.parts(&done, true);
                self.finished.push_back(Box::new(parts));
                self.changed = true;
            }
        }
        // A writer far behind (a storm of alerts) gets the newest: the oldest waiting go first.
        while self.finished.len() > self.config.max_count {
            self.finished.pop_front();
            self.store.count_dropped(1);
        }
        while let Some(parts) = self.finished.pop_front() {
            if let Err(back) = self.store.write(parts) {
                self.finished.push_front(back);
                break;
            }
        }
    }

    /// Writes a checkpoint of the bundle recording longest without one, when due and while
    /// the writer has nothing else to do: a storm of alerts is not slowed by checkpoints.
    fn checkpoint(&mut self, now: u64) {
        if !self.store.idle() {
            return;
        }
        let due =
            self.pending.iter().filter(|p| p.checkpoint_ms <= now && p.end_ms > now).min_by_key(|p| p.checkpoint_ms);
        let Some(p) = due.cloned() else { return };
        let mut parts = self.parts(&p, false);
        parts.checkpoint = true;
        parts.bundle.notes.push(
            "a checkpoint written while the bundle was recording: the daemon stopped before the span's end".into(),
        );
        self.store.checkpoint(Box::new(parts));
        if let Some(p) = self.pending.iter_mut().find(|q| q.id == p.id) {
            p.checkpoint_ms = now + CHECKPOINT_MS;
        }
    }

    fn keep_frame(&mut self, sample: &Sample, point: Option<&HistoryPoint>) {
        let now = sample.taken_at_ms;
        let mut frame = Frame {
            t_ms: now,
            point: point.cloned(),
            scheduler: None,
            listed: Vec::new(),
            decisions_missed: 0,
            thread_events_lost: sample.thread_events_lost,
            threads_refused: 0,
        };
        let since = self.frames.back().map_or(now.saturating_sub(self.interval_ms), |f| f.t_ms);
        let refused = self.threads.refused;
        let listed = sample.readings.scheduler.as_ref().map_or(&[][..], |s| &s.tasks[..]);
        self.threads.tick(&sample.thread_events, listed, since, now);
        frame.threads_refused = self.threads.refused - refused;
        frame.listed = listed.iter().map(|t| t.tid).collect();
        if let Some(s) = &sample.readings.scheduler {
            frame.scheduler = Some(SchedulerPoint {
                t_ms: now,
                ml_tasks: s.ml_tasks,
                phase_distribution: s.phase_distribution.clone(),
                decisions_made: s.decisions_made,
                phase_transitions: s.phase_transitions,
            });
            for p in &s.processes {
                if !self.processes.contains_key(&p.pid) && self.processes.len() >= 4 * MAX_PROCESSES {
                    continue;
                }
                let track = self.processes.entry(p.pid).or_default();
                track.job = p.job;
                if track.comm != p.comm {
                    track.comm = p.comm.clone();
                }
                if track.cmdline != p.cmdline {
                    track.cmdline = p.cmdline.clone();
                }
                track.untrusted = p.untrusted;
                track.last_seen_ms = now;
                track.merge(&p.timeline);
            }
            // The scheduler lists its latest decisions, newest first: the new ones are those
            // after the newest already kept (those of the same millisecond compared whole).
            let newest = self.decisions.back().map(|d| d.at_ms);
            let mut fresh: Vec<&Decision> = s
                .decisions
                .iter()
                .filter(|d| match newest {
                    None => true,
                    Some(t) if d.at_ms > t => true,
                    Some(t) if d.at_ms == t => {
                        !self.decisions.iter().rev().take_while(|k| k.at_ms == t).any(|k| k == *d)
                    }
                    Some(_) => false,
                })
                .collect();
            fresh.reverse();
            let made = s.decisions_made.saturating_sub(self.decisions_made.unwrap_or(s.decisions_made));
            frame.decisions_missed = made.saturating_sub(fresh.len() as u64);
            self.decisions_made = Some(s.decisions_made);
            for d in fresh {
                if self.decisions.len() == MAX_DECISIONS {
                    self.decisions.pop_front();
                }
                self.decisions.push_back(d.clone());
            }
        }
        self.frames.push_back(Arc::new(frame));
    }

    /// An alert changed outside a tick (acknowledged, silenced): bundles recording for it
    /// close with it as it is now, and an acknowledgement is an event of the span.
    pub fn note_alert(&mut self, alert: &Alert) {
        if !self.config.enabled {
            return;
        }
        for p in self.pending.iter_mut().filter(|p| p.alert.id == alert.id) {
            p.alert = alert.clone();
        }
        if let Some(t) = alert.transitions.last().filter(|t| t.kind == TransitionKind::Acknowledged) {
            self.push_event(alert, t.kind, t.at_ms);
        }
    }

    fn push_event(&mut self, alert: &Alert, kind: TransitionKind, at_ms: u64) {
        if self.events.len() == MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(AlertEvent {
            at_ms,
            alert_id: alert.id,
            kind,
            severity: alert.severity,
            name: alert.name().to_string(),
            source: alert.source.clone(),
            message: alert.message.clone(),
        });
    }

    fn note_change(&mut self, change: &AlertChange, now: u64) {
        let alert = change.alert();
        for p in self.pending.iter_mut().filter(|p| p.alert.id == alert.id) {
            p.alert = alert.clone();
        }
        let last = alert.transitions.last().filter(|t| t.at_ms == now);
        let kind = match (change, last) {
            (AlertChange::Raised(_), Some(t)) => t.kind,
            (AlertChange::Raised(_), None) => TransitionKind::Raised,
            (AlertChange::Resolved(_), _) => TransitionKind::Resolved,
            (AlertChange::Updated(_), Some(t)) => t.kind,
            (AlertChange::Updated(_), None) => return,
        };
        self.push_event(alert, kind, now);
        let min = self.config.min_severity;
        let fired = match kind {
            TransitionKind::Raised | TransitionKind::Reopened => alert.severity >= min,
            TransitionKind::Escalated => {
                let before = alert.transitions.iter().rev().nth(1).map(|t| t.severity);
                alert.severity >= min && before.is_some_and(|s| s < min)
            }
            _ => false,
        };
        if fired && !self.pending.iter().any(|p| p.alert.id == alert.id) {
            self.start(alert.clone(), now);
        }
    }

    fn start(&mut self, alert: Alert, now: u64) {
        // More bundles recording than can be kept: the oldest would be removed as soon as
        // written, so it is given up now.
        if self.pending.len() >= self.config.max_count {
            self.pending.pop_front();
            self.store.count_dropped(1);
        }
        let earliest = self.frames.front().map_or(now, |f| f.t_ms);
        let start_ms = now.saturating_sub(self.config.before_s * 1000).max(earliest);
        let id = self.next_id;
        self.next_id += 1;
        tracing::info!(
            id,
            alert = alert.id,
            "recording an incident bundle until {} s after the alert",
            self.config.after_s
        );
        self.pending.push_back(Pending {
            id,
            alert,
            fired_at_ms: now,
            start_ms,
            end_ms: now + self.config.after_s * 1000,
            checkpoint_ms: now,
        });
        self.changed = true;
    }

    /// What is kept of `p`'s span so far.
    fn parts(&self, p: &Pending, complete: bool) -> Parts {
        let (start, end) = (p.start_ms, p.end_ms);
        let frames: Vec<Arc<Frame>> =
            self.frames.iter().filter(|f| f.t_ms >= start && f.t_ms <= end).cloned().collect();
        let mut notes = Vec::new();
        let mut processes: Vec<ProcessTimeline> = self
            .processes
            .iter()
            .filter(|(_, t)| t.last_seen_ms >= start)
            .map(|(pid, t)| ProcessTimeline {
                pid: *pid,
                job: t.job,
                comm: t.comm.clone(),
                cmdline: t.cmdline.clone(),
                untrusted: t.untrusted,
                spans: t
                    .spans
                    .iter()
                    .filter(|s| s.end_ms > start && s.start_ms < end)
                    .map(|s| PhaseSpan { start_ms: s.start_ms.max(start), end_ms: s.end_ms.min(end), ..s.clone() })
                    .collect(),
            })
            .collect();
        // Beyond the bound, the alert's own job goes first, then the processes with the most
        // spans in the span.
        let job = alert_job(&p.alert);
        processes.sort_by_key(|t| (Some(t.job) != job, std::cmp::Reverse(t.spans.len()), t.pid));
        let dropped: u64 = self.processes.values().map(|t| t.spans_dropped).sum();
        if dropped > 0 {
            notes.push(format!("{dropped} older phase spans dropped (at most {MAX_PROCESS_SPANS} per process)"));
        }
        if processes.len() > MAX_PROCESSES {
            notes.push(format!("{} processes left out (at most {MAX_PROCESSES})", processes.len() - MAX_PROCESSES));
            processes.truncate(MAX_PROCESSES);
        }
        processes.sort_by_key(|t| t.pid);
        let job_pids: HashSet<u32> =
            self.processes.iter().filter(|(_, t)| Some(t.job) == job).map(|(pid, _)| *pid).collect();
        let decisions: Vec<Decision> =
            self.decisions.iter().filter(|d| d.at_ms >= start && d.at_ms <= end).cloned().collect();
        if decisions.len() == MAX_DECISIONS {
            notes.push(format!("only the latest {MAX_DECISIONS} decisions are kept"));
        }
        let missed: u64 = frames.iter().map(|f| f.decisions_missed).sum();
        if missed > 0 {
            notes.push(format!("{missed} decisions made faster than the scheduler lists them are not recorded"));
        }
        let lost: u64 = frames.iter().map(|f| f.thread_events_lost).sum();
        if lost > 0 {
            notes.push(format!(
                "{lost} thread phase changes given up (more than the scheduler keeps between two ticks): \
                 those threads' timelines fall back on the tick's listing"
            ));
        }
        // A thread not followed is refused again at every event and listing: the most in one
        // tick is the honest count.
        let refused = frames.iter().map(|f| f.threads_refused).max().unwrap_or(0);
        if refused > 0 {
            notes.push(format!("at least {refused} threads not followed (at most {MAX_TRACKED_THREADS} at once)"));
        }
        // Beyond the bound, the alert's job's threads go first, then the scheduler's busiest.
        let mut listed = Vec::new();
        let mut seen = HashSet::new();
        for tid in frames.iter().flat_map(|f| f.listed.iter()) {
            if seen.insert(*tid) {
                listed.push(*tid);
            }
        }
        let (threads, left_out, spans_dropped) = self.threads.timelines((start, end), &job_pids, &listed, MAX_THREADS);
        if left_out > 0 {
            notes.push(format!("{left_out} threads left out (at most {MAX_THREADS}; the alert's job's first)"));
        }
        if spans_dropped > 0 {
            notes.push(format!("{spans_dropped} older thread spans dropped (at most {MAX_THREAD_SPANS} per thread)"));
        }
        let events = self.events.iter().filter(|e| e.at_ms >= start && e.at_ms <= end).cloned().collect();
        let bundle = IncidentBundle {
            schema_version: INCIDENT_SCHEMA_VERSION,
            id: p.id,
            node: self.node.clone(),
            alert: p.alert.clone(),
            fired_at_ms: p.fired_at_ms,
            start_ms: start,
            end_ms: if complete { end } else { frames.last().map_or(start, |f| f.t_ms) },
            complete,
            interval_ms: self.interval_ms,
            history: Vec::new(),
            scheduler: Vec::new(),
            processes,
            threads,
            decisions,
            alert_events: events,
            notes,
        };
        Parts { bundle, frames, checkpoint: false }
    }

    /// The bundle still being recorded under `id`, as it stands now.
    pub fn recording(&self, id: u64) -> Option<Parts> {
        self.pending.iter().find(|p| p.id == id).map(|p| self.parts(p, false))
    }

    /// Bundles being recorded, then those kept, newest first.
    pub fn list(&self) -> Vec<IncidentSummary> {
        let recording = self.pending.iter().map(|p| recording(p.id, &p.alert, p.fired_at_ms, p.start_ms, p.end_ms));
        let finished = self.finished.iter().map(|p| p.summary());
        let mut list: Vec<IncidentSummary> = recording.chain(finished).chain(self.store.list()).collect();
        list.sort_by_key(|s| std::cmp::Reverse(s.id));
        list
    }

    /// Whether the list changed since this was last asked.
    pub fn take_changed(&mut self) -> bool {
        let stored = self.store.take_changed();
        std::mem::take(&mut self.changed) || stored
    }

    /// At stop: every bundle still recording is written with what it holds, and the store's
    /// thread given at most `limit` to finish.
    pub fn finish(&mut self, limit: std::time::Duration) -> bool {
        while let Some(p) = self.pending.pop_front() {
            let parts = self.parts(&p, false);
            self.finished.push_back(Box::new(parts));
        }
        let waiting = std::mem::take(&mut self.finished);
        self.store.close(waiting, limit)
    }
}

/// Builds the bundle from its parts (on the store's thread: it copies the span's history).
pub fn assemble(parts: Parts) -> IncidentBundle {
    let Parts { mut bundle, frames, .. } = parts;
    bundle.history = frames.iter().filter_map(|f| f.point.clone()).collect();
    bundle.scheduler = frames.iter().filter_map(|f| f.scheduler.clone()).collect();
    bundle
}

#[cfg(test)]
mod tests;
