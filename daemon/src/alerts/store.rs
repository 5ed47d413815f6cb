//! The alert lifecycle: firing -> acknowledged -> resolved, kept in memory and written through
//! to the [`AlertDb`] before anything is confirmed to a client.
//!
//! A standing condition is one alert, keyed by (type, rule, source). It is raised once; a
//! severity change updates the same alert (an escalation clears the acknowledgement, since what
//! was acknowledged got worse); it resolves once the condition has been clear for
//! `clear_for_ms`. A condition that returns within `flap_window_ms` of resolving reopens the same
//! alert as its next occurrence instead of raising a new one; after `flap_threshold`
//! occurrences the alert is marked flapping, keeps its acknowledgement across reopenings, and
//! needs four times `clear_for_ms` of quiet to resolve. Every step is a recorded transition.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use ringside_shared::{
    Acknowledgement, Alert, AlertTransition, AlertType, NewSilence, Notification, NotifiedAlert, Severity, Silence,
    TransitionKind,
};

use super::db::AlertDb;
use super::silences::{SilenceError, Silences, Window};
use super::writer::{Confirmation, Writer};
use super::Condition;

/// Transitions kept per alert in memory (the database keeps all of them).
pub const TRANSITIONS_KEPT: usize = 50;
/// Notification log entries kept in memory (and loaded at start).
pub const NOTIFICATIONS_KEPT: usize = 1000;
/// A flapping alert needs this many times `clear_for_ms` of quiet to resolve.
const FLAPPING_CLEAR_FACTOR: u64 = 4;

#[derive(Debug, Clone, PartialEq)]
pub struct Lifecycle {
    pub clear_for_ms: u64,
    pub flap_window_ms: u64,
    pub flap_threshold: u32,
    pub resolved_kept: usize,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle { clear_for_ms: 3000, flap_window_ms: 300_000, flap_threshold: 3, resolved_kept: 200 }
    }
}

/// What a tick or an acknowledgement changed, to be broadcast.
#[derive(Debug, Clone, PartialEq)]
pub enum AlertChange {
    Raised(Alert),
    Updated(Alert),
    Resolved(Alert),
}

impl AlertChange {
    pub fn alert(&self) -> &Alert {
        match self {
            AlertChange::Raised(a) | AlertChange::Updated(a) | AlertChange::Resolved(a) => a,
        }
    }

    fn alert_mut(&mut self) -> &mut Alert {
        match self {
            AlertChange::Raised(a) | AlertChange::Updated(a) | AlertChange::Resolved(a) => a,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AckError {
    #[error("no alert with id {0}")]
    NotFound(u64),
    #[error("the acknowledgement could not be stored: {0}")]
    Store(String),
    #[error("token `{token}` is a {role}: acknowledging alerts needs an operator token")]
    Forbidden { token: String, role: &'static str },
}

type Key = (AlertType, Option<String>, String);

fn key_of(alert: &Alert) -> Key {
    (alert.alert_type, alert.rule.clone(), alert.source.clone())
}

#[derive(Debug)]
struct Standing {
    id: u64,
    clear_since_ms: Option<u64>,
}

pub struct AlertStore {
    next_id: u64,
    active: BTreeMap<u64, Alert>,
    standing: HashMap<Key, Standing>,
    resolved: VecDeque<Alert>,
    lifecycle: Lifecycle,
    /// The database's writer thread; `None`: kept in memory only.
    writer: Option<Writer>,
    silences: Silences,
    /// The notification log, oldest first, at most [`NOTIFICATIONS_KEPT`].
    notifications: VecDeque<Notification>,
    /// What is in force changed since [`AlertStore::take_silences_changed`] last said.
    silences_changed: bool,
}

fn push_transition(alert: &mut Alert, kind: TransitionKind, at_ms: u64, by: Option<String>, note: Option<String>) {
    alert.transitions.push(AlertTransition { at_ms, kind, severity: alert.severity, value: alert.value, by, note });
    if alert.transitions.len() > TRANSITIONS_KEPT {
        let excess = alert.transitions.len() - TRANSITIONS_KEPT;
        alert.transitions.drain(..excess);
    }
}

impl AlertStore {
    /// A store that loads what the database holds (active alerts resume standing; the newest
    /// resolved ones are listed again) and writes every change through to it.
    pub fn open(lifecycle: Lifecycle, db: Option<AlertDb>) -> Result<AlertStore, super::db::DbError> {
        let mut store = AlertStore {
            next_id: 1,
            active: BTreeMap::new(),
            standing: HashMap::new(),
            resolved: VecDeque::new(),
            lifecycle,
            writer: None,
            silences: Silences::default(),
            notifications: VecDeque::new(),
            silences_changed: false,
        };
        if let Some(db) = db {
            store.notifications = db.load_notifications(NOTIFICATIONS_KEPT)?.into();
            let silences = db.load_silences(crate::clock::now_ms(), super::silences::ENDED_KEPT)?;
            store.silences = Silences::new(silences, Vec::new());
            let loaded = db.load(store.lifecycle.resolved_kept, TRANSITIONS_KEPT)?;
            store.next_id = loaded.next_id;
            for alert in loaded.alerts {
                if alert.is_active() {
                    store.standing.insert(key_of(&alert), Standing { id: alert.id, clear_since_ms: None });
                    store.active.insert(alert.id, alert);
                } else {
                    store.resolved.push_back(alert);
                }
            }
            store.writer = Some(Writer::start(db));
        }
        Ok(store)
    }

    pub fn in_memory(lifecycle: Lifecycle) -> AlertStore {
        AlertStore {
            next_id: 1,
            active: BTreeMap::new(),
            standing: HashMap::new(),
            resolved: VecDeque::new(),
            lifecycle,
            writer: None,
            silences: Silences::default(),
            notifications: VecDeque::new(),
            silences_changed: false,
        }
    }

    /// Logs a batch sent to Alertmanager (or that failed): kept in memory (the newest
    /// [`NOTIFICATIONS_KEPT`]) and written to the database.
    pub fn notify(&mut self, alerts: &[Alert], ok: bool, outcome: String, now_ms: u64) -> Notification {
        let seq = self.notifications.back().map_or(1, |n| n.seq + 1);
        let notification = Notification {
            seq,
            at_ms: now_ms,
            alerts: alerts
                .iter()
                .map(|a| NotifiedAlert { id: a.id, name: a.name().to_string(), resolved: !a.is_active() })
                .collect(),
            ok,
            outcome,
        };
        if self.notifications.len() >= NOTIFICATIONS_KEPT {
            self.notifications.pop_front();
        }
        self.notifications.push_back(notification.clone());
        if let Some(writer) = &self.writer {
            writer.save_notification(&notification);
        }
        notification
    }

    /// The newest `limit` notification log entries (of `alert_id` only, when given), newest
    /// first.
    pub fn notifications(&self, alert_id: Option<u64>, limit: usize) -> Vec<Notification> {
        self.notifications
            .iter()
            .rev()
            .filter(|n| alert_id.is_none_or(|id| n.alerts.iter().any(|a| a.id == id)))
            .take(limit)
            .cloned()
            .collect()
    }

    /// The config's maintenance windows.
    pub fn set_maintenance(&mut self, windows: Vec<Window>) {
        self.silences.set_windows(windows);
    }

    /// Silences in force or to come, then ended ones.
    pub fn silences(&self, now_ms: u64) -> Vec<Silence> {
        self.silences.list(now_ms)
    }

    /// Whether what is in force changed since the last call (for telling clients).
    pub fn take_silences_changed(&mut self) -> bool {
        std::mem::take(&mut self.silences_changed)
    }

    /// [`AlertStore::silences`], each with how many active alerts it matches now.
    pub fn silences_listed(&self, now_ms: u64) -> Vec<(Silence, usize)> {
        self.silences.listed(&self.active.values().collect::<Vec<_>>(), now_ms)
    }

    /// Sets what silences each active alert at `now_ms`; an alert whose silencing changed is
    /// in `changes` (updated in place where it already is).
    fn resilence(&mut self, now_ms: u64, changes: &mut Vec<AlertChange>) {
        let silencer = self.silences.silencer(now_ms);
        for alert in self.active.values_mut() {
            let silenced = silencer.silencing(alert);
            if silenced == alert.silenced {
                continue;
            }
            alert.silenced = silenced;
            alert.updated_at_ms = now_ms;
            match changes.iter_mut().find(|c| c.alert().id == alert.id) {
                Some(change) => *change.alert_mut() = alert.clone(),
                None => changes.push(AlertChange::Updated(alert.clone())),
            }
        }
    }

    /// Makes a silence (checked) and applies it at once. With a database, the confirmation
    /// answers once it is written; a caller that hears of a failure takes it back with
    /// [`AlertStore::unsilence`].
    pub fn silence(
        &mut self,
        new: NewSilence,
        by: String,
        now_ms: u64,
    ) -> Result<(Silence, Vec<AlertChange>, Option<Confirmation>), SilenceError> {
        let silence = self.silences.make(new, by, now_ms)?;
        Ok(self.keep_silence(silence, now_ms))
    }

    /// Keeps a new or changed silence, queues it to be written, and applies it.
    fn keep_silence(&mut self, silence: Silence, now_ms: u64) -> (Silence, Vec<AlertChange>, Option<Confirmation>) {
        self.silences.put(silence.clone());
        self.silences_changed = true;
        let confirmation = self.writer.as_ref().map(|w| w.save_silence(&silence));
        let mut changes = Vec::new();
        self.resilence(now_ms, &mut changes);
        (silence, changes, confirmation)
    }

    /// Takes back a silence that could not be written.
    pub fn unsilence(&mut self, id: u64, now_ms: u64) -> Vec<AlertChange> {
        self.silences.remove(id);
        self.silences_changed = true;
        let mut changes = Vec::new();
        self.resilence(now_ms, &mut changes);
        changes
    }

    /// Ends a silence early; the confirmation as for [`AlertStore::silence`] (a failure leaves
    /// it expired in memory, written again with the next change).
    pub fn expire_silence(
        &mut self,
        id: u64,
        by: &str,
        now_ms: u64,
    ) -> Result<(Silence, Vec<AlertChange>, Option<Confirmation>), SilenceError> {
        let expired = self.silences.expired(id, by, now_ms)?;
        Ok(self.keep_silence(expired, now_ms))
    }

    /// Why the database could not be written, while changes wait to be written again.
    pub fn db_error(&self) -> Option<String> {
        self.writer.as_ref().and_then(Writer::error)
    }

    pub fn is_persistent(&self) -> bool {
        self.writer.is_some()
    }

    /// Waits until every change is written, at most `limit` (at stop, and in tests).
    pub fn flush(&self, limit: std::time::Duration) -> bool {
        self.writer.as_ref().is_none_or(|w| w.flush(limit))
    }

    fn persist(&mut self, alerts: &[&Alert]) {
        if let Some(writer) = &self.writer {
            writer.save(alerts);
        }
    }

    /// Reconciles the standing alerts with this tick's conditions.
    pub fn apply(&mut self, conditions: Vec<Condition>, now_ms: u64) -> Vec<AlertChange> {
        let mut changes = Vec::new();
        let mut seen = HashSet::new();
        for c in conditions {
            let source = c.source.to_string();
            let key: Key = (c.alert_type, c.rule.clone(), source.clone());
            if !seen.insert(key.clone()) {
                continue;
            }
            if let Some(standing) = self.standing.get_mut(&key) {
                standing.clear_since_ms = None;
                let Some(alert) = self.active.get_mut(&standing.id) else { continue };
                alert.value = c.value;
                alert.message = c.message;
                if c.severity != alert.severity {
                    let escalated = c.severity > alert.severity;
                    alert.severity = c.severity;
                    alert.threshold = c.threshold;
                    alert.updated_at_ms = now_ms;
                    if escalated {
                        alert.acknowledgement = None;
                    }
                    let kind = if escalated { TransitionKind::Escalated } else { TransitionKind::Deescalated };
                    push_transition(alert, kind, now_ms, None, None);
                    changes.push(AlertChange::Updated(alert.clone()));
                }
                continue;
            }
            let window = self.lifecycle.flap_window_ms;
            let recent = self
                .resolved
                .iter()
                .position(|a| key_of(a) == key && a.resolved_at_ms.is_some_and(|r| now_ms.saturating_sub(r) <= window));
            let alert = match recent.and_then(|i| self.resolved.remove(i)) {
                Some(mut alert) => {
                    alert.resolved_at_ms = None;
                    alert.occurrence += 1;
                    alert.flapping |= alert.occurrence >= self.lifecycle.flap_threshold;
                    if !alert.flapping {
                        alert.acknowledgement = None;
                    }
                    alert.severity = c.severity;
                    alert.value = c.value;
                    alert.threshold = c.threshold;
                    alert.message = c.message;
                    alert.labels = c.labels;
                    alert.updated_at_ms = now_ms;
                    push_transition(&mut alert, TransitionKind::Reopened, now_ms, None, None);
                    alert
                }
                None => {
                    let id = self.next_id;
                    self.next_id += 1;
                    let mut alert = Alert {
                        id,
                        alert_type: c.alert_type,
                        rule: c.rule,
                        severity: c.severity,
                        source,
                        labels: c.labels,
                        message: c.message,
                        value: c.value,
                        threshold: c.threshold,
                        raised_at_ms: now_ms,
                        updated_at_ms: now_ms,
                        resolved_at_ms: None,
                        acknowledgement: None,
                        occurrence: 1,
                        flapping: false,
                        transitions: Vec::new(),
                        silenced: None,
                    };
                    push_transition(&mut alert, TransitionKind::Raised, now_ms, None, None);
                    alert
                }
            };
            self.standing.insert(key, Standing { id: alert.id, clear_since_ms: None });
            changes.push(AlertChange::Raised(alert.clone()));
            self.active.insert(alert.id, alert);
        }

        let mut cleared = Vec::new();
        for (key, standing) in self.standing.iter_mut() {
            if seen.contains(key) {
                continue;
            }
            let since = *standing.clear_since_ms.get_or_insert(now_ms);
            let flapping = self.active.get(&standing.id).is_some_and(|a| a.flapping);
            let needed = self.lifecycle.clear_for_ms * if flapping { FLAPPING_CLEAR_FACTOR } else { 1 };
            if now_ms.saturating_sub(since) >= needed {
                cleared.push(key.clone());
            }
        }
        for key in cleared {
            let Some(standing) = self.standing.remove(&key) else { continue };
            if let Some(mut alert) = self.active.remove(&standing.id) {
                alert.resolved_at_ms = Some(now_ms);
                alert.updated_at_ms = now_ms;
                push_transition(&mut alert, TransitionKind::Resolved, now_ms, None, None);
                self.push_resolved(alert.clone());
                changes.push(AlertChange::Resolved(alert));
            }
        }
        let (ended, changed) = self.silences.end_resolved(self.active.values(), now_ms);
        self.silences_changed |= changed || !ended.is_empty();
        if let Some(writer) = &self.writer {
            for silence in &ended {
                // Written like any change; a failure is the store's health, retried.
                drop(writer.save_silence(silence));
            }
        }
        self.resilence(now_ms, &mut changes);
        if !changes.is_empty() {
            let changed: Vec<Alert> = changes.iter().map(|c| c.alert().clone()).collect();
            // A failed write is reported as the store's health; the tick's alerts still stand.
            self.persist(&changed.iter().collect::<Vec<_>>());
        }
        changes
    }

    fn push_resolved(&mut self, alert: Alert) {
        while self.resolved.len() >= self.lifecycle.resolved_kept.max(1) {
            self.resolved.pop_back();
        }
        self.resolved.push_front(alert);
    }

    fn find_mut(&mut self, id: u64) -> Option<&mut Alert> {
        match self.active.get_mut(&id) {
            Some(alert) => Some(alert),
            None => self.resolved.iter_mut().find(|a| a.id == id),
        }
    }

    /// Acknowledges an alert, active or resolved; idempotent (a second acknowledgement keeps the
    /// first). With a database, the confirmation answers once it is written: a caller that
    /// hears of a failure (or waits too long) takes it back with [`AlertStore::withdraw`].
    pub fn acknowledge(
        &mut self,
        id: u64,
        by: String,
        token: String,
        note: Option<String>,
        now_ms: u64,
    ) -> Result<(Alert, bool, Option<Confirmation>), AckError> {
        let current = self.find_mut(id).ok_or(AckError::NotFound(id))?;
        if current.acknowledgement.is_some() {
            return Ok((current.clone(), false, None));
        }
        let note = note.map(|n| n.trim().to_string()).filter(|n| !n.is_empty());
        let mut acked = current.clone();
        acked.acknowledgement = Some(Acknowledgement { by: by.clone(), token, at_ms: now_ms, note: note.clone() });
        acked.updated_at_ms = now_ms;
        push_transition(&mut acked, TransitionKind::Acknowledged, now_ms, Some(by), note);
        if let Some(slot) = self.find_mut(id) {
            *slot = acked.clone();
        }
        let confirmation = self.writer.as_ref().map(|w| w.save_confirmed(&acked));
        Ok((acked, true, confirmation))
    }

    /// Takes back an acknowledgement that could not be written (the one made at `at_ms`), and
    /// queues the alert without it, so that memory and database agree again.
    pub fn withdraw(&mut self, id: u64, at_ms: u64) {
        let Some(alert) = self.find_mut(id) else { return };
        if alert.acknowledgement.as_ref().is_none_or(|a| a.at_ms != at_ms) {
            return;
        }
        alert.acknowledgement = None;
        alert.transitions.retain(|t| !(t.kind == TransitionKind::Acknowledged && t.at_ms == at_ms));
        let alert = alert.clone();
        self.persist(&[&alert]);
    }

    /// Active alerts (most severe, then newest first), then resolved ones (newest first).
    pub fn list(&self) -> Vec<Alert> {
        let mut active: Vec<Alert> = self.active.values().cloned().collect();
        active.sort_by(|a, b| {
            b.severity.cmp(&a.severity).then(b.raised_at_ms.cmp(&a.raised_at_ms)).then(b.id.cmp(&a.id))
        });
        active.extend(self.resolved.iter().cloned());
        active
    }

    pub fn active(&self) -> impl Iterator<Item = &Alert> {
        self.active.values()
    }

    pub fn count_active(&self, severity: Severity) -> usize {
        self.active.values().filter(|a| a.severity == severity).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_notification_log_is_bounded_and_filtered_by_alert() {
        let mut store = AlertStore::in_memory(Lifecycle::default());
        let changes = store.apply(vec![cond(Severity::Warning)], 1000);
        let alert = changes[0].alert().clone();
        for i in 0..(NOTIFICATIONS_KEPT as u64 + 5) {
            let batch = if i % 2 == 0 { vec![alert.clone()] } else { Vec::new() };
            store.notify(&batch, i % 3 != 0, format!("try {i}"), 2000 + i);
        }
        let all = store.notifications(None, usize::MAX);
        assert_eq!(all.len(), NOTIFICATIONS_KEPT);
        assert_eq!(all[0].seq, NOTIFICATIONS_KEPT as u64 + 5, "newest first");
        let mine = store.notifications(Some(alert.id), 10);
        assert_eq!(mine.len(), 10);
        assert!(mine.iter().all(|n| n.alerts.iter().any(|a| a.id == alert.id && !a.resolved)));
        assert!(store.notifications(Some(999), 10).is_empty());
    }

    fn cond(severity: Severity) -> Condition {
        Condition {
            alert_type: AlertType::HighDropRate,
            rule: None,
            labels: BTreeMap::new(),
            source: crate::metrics::Source::Kernel("k".into()),
            severity,
            value: 0.2,
            threshold: 0.1,
            message: "m".into(),
        }
    }

    fn lifecycle() -> Lifecycle {
        Lifecycle { clear_for_ms: 3000, flap_window_ms: 60_000, flap_threshold: 3, resolved_kept: 200 }
    }

    fn kinds(alert: &Alert) -> Vec<TransitionKind> {
        alert.transitions.iter().map(|t| t.kind).collect()
    }

    #[test]
    fn a_standing_condition_is_one_alert_with_a_history() {
        let mut store = AlertStore::in_memory(lifecycle());
        let first = store.apply(vec![cond(Severity::Warning)], 1000);
        assert!(matches!(&first[..], [AlertChange::Raised(a)] if a.id == 1 && a.occurrence == 1));
        for t in 2..10 {
            assert!(store.apply(vec![cond(Severity::Warning)], t * 1000).is_empty(), "tick {t} raised again");
        }
        assert_eq!(store.list().len(), 1);
        let (acked, changed, _) =
            store.acknowledge(1, "ana".into(), "ops".into(), Some(" looking ".into()), 11_000).unwrap();
        assert!(changed);
        let ack = acked.acknowledgement.as_ref().unwrap();
        assert_eq!((ack.by.as_str(), ack.token.as_str(), ack.note.as_deref()), ("ana", "ops", Some("looking")));
        assert!(!store.acknowledge(1, "bo".into(), "ops".into(), None, 12_000).unwrap().1, "idempotent");

        // De-escalation keeps the acknowledgement; escalation clears it.
        let down = store.apply(vec![cond(Severity::Info)], 13_000);
        assert!(
            matches!(&down[..], [AlertChange::Updated(a)] if a.severity == Severity::Info && a.acknowledgement.is_some())
        );
        let up = store.apply(vec![cond(Severity::Critical)], 14_000);
        assert!(matches!(&up[..], [AlertChange::Updated(a)] if a.id == 1 && a.acknowledgement.is_none()));

        // Resolved once clear for 3 s; a blip in between restarts the clock.
        assert!(store.apply(vec![], 15_000).is_empty());
        assert!(store.apply(vec![cond(Severity::Critical)], 17_000).is_empty());
        assert!(store.apply(vec![], 18_000).is_empty());
        assert!(store.apply(vec![], 20_000).is_empty());
        let resolved = store.apply(vec![], 21_000);
        let [AlertChange::Resolved(alert)] = &resolved[..] else { panic!("{resolved:?}") };
        assert_eq!(alert.resolved_at_ms, Some(21_000));
        use TransitionKind::*;
        assert_eq!(kinds(alert), vec![Raised, Acknowledged, Deescalated, Escalated, Resolved]);
        assert_eq!(store.active().count(), 0);
        assert_eq!(store.list()[0].id, 1, "resolved alerts stay listed");
        assert!(matches!(store.acknowledge(99, "x".into(), "ops".into(), None, 22_000), Err(AckError::NotFound(99))));
    }

    #[test]
    fn a_returning_condition_reopens_and_flapping_is_suppressed() {
        let mut store = AlertStore::in_memory(lifecycle());
        let mut t = 0;
        let flap = |store: &mut AlertStore, t: &mut u64| {
            *t += 1000;
            let raised = store.apply(vec![cond(Severity::Warning)], *t);
            *t += 1000;
            assert!(store.apply(vec![], *t).is_empty(), "first clear tick starts the clock");
            *t += 3000;
            let resolved = store.apply(vec![], *t);
            assert_eq!(resolved.len(), 1, "resolves after 3 s clear");
            raised
        };
        let first = flap(&mut store, &mut t);
        assert!(matches!(&first[..], [AlertChange::Raised(a)] if a.id == 1));
        let second = flap(&mut store, &mut t);
        assert!(matches!(&second[..], [AlertChange::Raised(a)] if a.id == 1 && a.occurrence == 2 && !a.flapping));
        // Third occurrence: flapping. It then needs 4 x 3 s of quiet.
        t += 1000;
        let third = store.apply(vec![cond(Severity::Warning)], t);
        assert!(matches!(&third[..], [AlertChange::Raised(a)] if a.id == 1 && a.occurrence == 3 && a.flapping));
        store.acknowledge(1, "ana".into(), "ops".into(), None, t).unwrap();
        t += 1000;
        assert!(store.apply(vec![], t).is_empty());
        t += 3000;
        assert!(store.apply(vec![], t).is_empty(), "a flapping alert stays up through a short quiet");
        t += 9000;
        assert_eq!(store.apply(vec![], t).len(), 1, "and resolves after 4 x 3 s");
        t += 1000;
        let again = store.apply(vec![cond(Severity::Warning)], t);
        assert!(
            matches!(&again[..], [AlertChange::Raised(a)] if a.id == 1 && a.acknowledgement.is_some()),
            "a flapping alert keeps its acknowledgement when it reopens"
        );
        assert_eq!(store.list().len(), 1, "one alert, however often it flapped");

        // Outside the flap window it is a new alert.
        t += 1000;
        store.apply(vec![], t);
        t += 12_000;
        assert_eq!(store.apply(vec![], t).len(), 1);
        t += 61_000;
        let fresh = store.apply(vec![cond(Severity::Warning)], t);
        assert!(matches!(&fresh[..], [AlertChange::Raised(a)] if a.id == 2 && a.occurrence == 1));
    }

    #[test]
    fn resolved_history_is_bounded() {
        let mut store = AlertStore::in_memory(Lifecycle { clear_for_ms: 0, flap_window_ms: 0, ..lifecycle() });
        for i in 0..250u64 {
            let mut c = cond(Severity::Warning);
            c.source = crate::metrics::Source::Kernel(i.to_string());
            store.apply(vec![c], i * 2 + 10);
            store.apply(vec![], i * 2 + 11);
        }
        assert_eq!(store.list().len(), 200);
    }
}
