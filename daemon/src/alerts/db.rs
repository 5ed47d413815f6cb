//! The alert database: SQLite in WAL mode under `--data-dir`, schema versioned with
//! `PRAGMA user_version` and migrated forward at open.
//!
//! Writes use `synchronous = FULL`: an acknowledgement is confirmed to a client only after its
//! transaction is on disk, so neither a restart nor `kill -9` (nor a power cut) loses it.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use ringside_shared::{
    Acknowledgement, Alert, AlertTransition, AlertType, Notification, Severity, Silence, TransitionKind,
};
use rusqlite::{params, Connection, OptionalExtension};

/// One entry per schema version; entry N migrates version N to N+1. Never edit a released one.
const MIGRATIONS: &[&str] = &[
    // 0 -> 1: alerts, their transitions and acknowledgements.
    "CREATE TABLE alerts (
        id INTEGER PRIMARY KEY,
        alert_type TEXT NOT NULL,
        rule TEXT,
        source TEXT NOT NULL,
        labels TEXT NOT NULL DEFAULT '{}',
        severity TEXT NOT NULL,
        message TEXT NOT NULL,
        value REAL NOT NULL,
        threshold REAL NOT NULL,
        raised_at_ms INTEGER NOT NULL,
        updated_at_ms INTEGER NOT NULL,
        resolved_at_ms INTEGER,
        occurrence INTEGER NOT NULL DEFAULT 1,
        flapping INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX alerts_resolved ON alerts (resolved_at_ms);
    CREATE TABLE transitions (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        alert_id INTEGER NOT NULL REFERENCES alerts (id) ON DELETE CASCADE,
        at_ms INTEGER NOT NULL,
        kind TEXT NOT NULL,
        severity TEXT NOT NULL,
        value REAL NOT NULL,
        by TEXT,
        note TEXT,
        UNIQUE (alert_id, at_ms, kind)
    );
    CREATE TABLE acknowledgements (
        alert_id INTEGER PRIMARY KEY REFERENCES alerts (id) ON DELETE CASCADE,
        by TEXT NOT NULL,
        token TEXT NOT NULL,
        at_ms INTEGER NOT NULL,
        note TEXT
    );",
    // 1 -> 2: silences made over the API (maintenance windows live in the config).
    "CREATE TABLE silences (
        id INTEGER PRIMARY KEY,
        matchers TEXT NOT NULL,
        starts_at_ms INTEGER NOT NULL,
        ends_at_ms INTEGER,
        comment TEXT NOT NULL,
        created_by TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL,
        expired_at_ms INTEGER,
        expired_by TEXT
    );",
    // 2 -> 3: the notification log (batches sent to Alertmanager), bounded.
    "CREATE TABLE notifications (
        seq INTEGER PRIMARY KEY,
        at_ms INTEGER NOT NULL,
        alerts TEXT NOT NULL,
        ok INTEGER NOT NULL,
        outcome TEXT NOT NULL
    );",
];

/// Notification log entries kept in the database (older ones are deleted as new ones come).
pub const NOTIFICATIONS_RETAINED: i64 = 5000;

/// Resolved alerts kept in the database; older ones are deleted at open.
const RESOLVED_RETAINED: i64 = 5000;
/// Silences that ended (expired, or past their end) kept in the database.
pub const SILENCES_ENDED_RETAINED: i64 = 1000;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("alert database {path}: {source}")]
    Open { path: String, source: rusqlite::Error },
    #[error("alert database was written by a newer ringsided (schema {found}, this one knows {known}); upgrade ringsided or use another --data-dir")]
    TooNew { found: i64, known: i64 },
    #[error("alert database: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("alert database holds an unreadable row: {0}")]
    Corrupt(String),
}

pub struct AlertDb {
    conn: Connection,
}

pub struct Loaded {
    pub alerts: Vec<Alert>,
    pub next_id: u64,
}

impl AlertDb {
    pub fn open(path: &Path) -> Result<AlertDb, DbError> {
        let open_error = |source| DbError::Open { path: path.display().to_string(), source };
        let conn = Connection::open(path).map_err(open_error)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(open_error)?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(open_error)?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(open_error)?;
        // Short: the writer thread tries again on its own schedule (a locked database is retried).
        conn.busy_timeout(std::time::Duration::from_secs(1)).map_err(open_error)?;
        let mut db = AlertDb { conn };
        db.migrate()?;
        db.prune()?;
        Ok(db)
    }

    /// Keeps what grows within its bound: the newest [`RESOLVED_RETAINED`] resolved alerts
    /// (their transitions and acknowledgements go with them), [`SILENCES_ENDED_RETAINED`]
    /// silences that ended, [`NOTIFICATIONS_RETAINED`] notifications. Run at open and by the
    /// writer every [`super::writer::PRUNE_EVERY`], so that a daemon that runs for months with
    /// alerts firing does not grow its database; returns how many rows went.
    pub fn prune(&mut self) -> Result<usize, DbError> {
        let now_ms = crate::clock::now_ms() as i64;
        let tx = self.conn.transaction()?;
        let mut removed = tx.execute(
            "DELETE FROM alerts WHERE resolved_at_ms IS NOT NULL AND id NOT IN
               (SELECT id FROM alerts WHERE resolved_at_ms IS NOT NULL ORDER BY resolved_at_ms DESC LIMIT ?1)",
            params![RESOLVED_RETAINED],
        )?;
        removed += tx.execute(
            "DELETE FROM silences WHERE (expired_at_ms IS NOT NULL OR ends_at_ms <= ?2) AND id NOT IN
               (SELECT id FROM silences WHERE expired_at_ms IS NOT NULL OR ends_at_ms <= ?2
                ORDER BY COALESCE(expired_at_ms, ends_at_ms) DESC LIMIT ?1)",
            params![SILENCES_ENDED_RETAINED, now_ms],
        )?;
        removed += tx.execute(
            "DELETE FROM notifications WHERE seq <= (SELECT MAX(seq) FROM notifications) - ?1",
            params![NOTIFICATIONS_RETAINED],
        )?;
        tx.commit()?;
        Ok(removed)
    }

    pub fn schema_version(&self) -> Result<i64, DbError> {
        Ok(self.conn.pragma_query_value(None, "user_version", |row| row.get(0))?)
    }

    fn migrate(&mut self) -> Result<(), DbError> {
        let known = MIGRATIONS.len() as i64;
        let found = self.schema_version()?;
        if found > known {
            return Err(DbError::TooNew { found, known });
        }
        for (version, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
            let tx = self.conn.transaction()?;
            tx.execute_batch(sql)?;
            tx.pragma_update(None, "user_version", version as i64 + 1)?;
            tx.commit()?;
            tracing::info!("alert database migrated to schema {}", version + 1);
        }
        Ok(())
    }

    /// Writes each alert's row, its acknowledgement (or its absence) and its transitions, and
    /// each silence, in one transaction.
    pub fn save(
        &mut self,
        alerts: &[&Alert],
        silences: &[&Silence],
        notifications: &[&Notification],
    ) -> Result<(), DbError> {
        let tx = self.conn.transaction()?;
        for n in notifications {
            let listed = serde_json::to_string(&n.alerts).map_err(|e| DbError::Corrupt(e.to_string()))?;
            tx.execute(
                "INSERT OR IGNORE INTO notifications (seq, at_ms, alerts, ok, outcome) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![n.seq as i64, n.at_ms as i64, listed, n.ok, n.outcome],
            )?;
        }
        if !notifications.is_empty() {
            tx.execute(
                "DELETE FROM notifications WHERE seq <= (SELECT MAX(seq) FROM notifications) - ?1",
                params![NOTIFICATIONS_RETAINED],
            )?;
        }
        for s in silences {
            let matchers = serde_json::to_string(&s.matchers).map_err(|e| DbError::Corrupt(e.to_string()))?;
            tx.execute(
                "INSERT INTO silences (id, matchers, starts_at_ms, ends_at_ms, comment, created_by, created_at_ms,
                                       expired_at_ms, expired_by)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                 ON CONFLICT (id) DO UPDATE SET expired_at_ms = excluded.expired_at_ms,
                     expired_by = excluded.expired_by, ends_at_ms = excluded.ends_at_ms",
                params![
                    s.id as i64,
                    matchers,
                    s.starts_at_ms as i64,
                    s.ends_at_ms.map(|v| v as i64),
                    s.comment,
                    s.created_by,
                    s.created_at_ms as i64,
                    s.expired_at_ms.map(|v| v as i64),
                    s.expired_by,
                ],
            )?;
        }
        for alert in alerts {
            let labels = serde_json::to_string(&alert.labels).map_err(|e| DbError::Corrupt(e.to_string()))?;
            tx.execute(
                "INSERT INTO alerts (id, alert_type, rule, source, labels, severity, message, value, threshold,
                                     raised_at_ms, updated_at_ms, resolved_at_ms, occurrence, flapping)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
                 ON CONFLICT (id) DO UPDATE SET severity = excluded.severity, message = excluded.message,
                     value = excluded.value, threshold = excluded.threshold, labels = excluded.labels,
                     updated_at_ms = excluded.updated_at_ms, resolved_at_ms = excluded.resolved_at_ms,
                     occurrence = excluded.occurrence, flapping = excluded.flapping",
                params![
                    alert.id as i64,
                    alert.alert_type.as_str(),
                    alert.rule,
                    alert.source,
                    labels,
                    alert.severity.as_str(),
                    alert.message,
                    alert.value,
                    alert.threshold,
                    alert.raised_at_ms as i64,
                    alert.updated_at_ms as i64,
                    alert.resolved_at_ms.map(|v| v as i64),
                    alert.occurrence,
                    alert.flapping,
                ],
            )?;
            match &alert.acknowledgement {
                Some(ack) => tx.execute(
                    "INSERT INTO acknowledgements (alert_id, by, token, at_ms, note) VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (alert_id) DO UPDATE SET by = excluded.by, token = excluded.token,
                         at_ms = excluded.at_ms, note = excluded.note",
                    params![alert.id as i64, ack.by, ack.token, ack.at_ms as i64, ack.note],
                )?,
                None => tx.execute("DELETE FROM acknowledgements WHERE alert_id = ?1", params![alert.id as i64])?,
            };
            for t in &alert.transitions {
                tx.execute(
                    "INSERT OR IGNORE INTO transitions (alert_id, at_ms, kind, severity, value, by, note)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![
                        alert.id as i64,
                        t.at_ms as i64,
                        t.kind.as_str(),
                        t.severity.as_str(),
                        t.value,
                        t.by,
                        t.note
                    ],
                )?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// The newest `limit` notification log entries, oldest first.
    pub fn load_notifications(&self, limit: usize) -> Result<Vec<Notification>, DbError> {
        let mut statement = self.conn.prepare(
            "SELECT seq, at_ms, alerts, ok, outcome FROM
               (SELECT * FROM notifications ORDER BY seq DESC LIMIT ?1) ORDER BY seq",
        )?;
        let rows = statement.query_map(params![limit as i64], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, bool>(3)?,
                row.get::<_, String>(4)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, at_ms, alerts, ok, outcome) = row?;
            let alerts = serde_json::from_str(&alerts)
                .map_err(|e| DbError::Corrupt(format!("notification {seq}: alerts: {e}")))?;
            out.push(Notification { seq: seq as u64, at_ms: at_ms as u64, alerts, ok, outcome });
        }
        Ok(out)
    }

    /// Every silence not yet over at `now_ms`, and the `ended` that ended last.
    pub fn load_silences(&self, now_ms: u64, ended: usize) -> Result<Vec<Silence>, DbError> {
        let mut statement = self.conn.prepare(
            "SELECT id, matchers, starts_at_ms, ends_at_ms, comment, created_by, created_at_ms, expired_at_ms, expired_by
             FROM silences
             WHERE (expired_at_ms IS NULL AND (ends_at_ms IS NULL OR ends_at_ms > ?1))
                OR id IN (SELECT id FROM silences WHERE expired_at_ms IS NOT NULL OR ends_at_ms <= ?1
                          ORDER BY COALESCE(expired_at_ms, ends_at_ms) DESC LIMIT ?2)",
        )?;
        let rows = statement.query_map(params![now_ms as i64, ended as i64], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, String>(1)?,
                (row.get::<_, i64>(2)?, row.get::<_, Option<i64>>(3)?),
                (row.get::<_, String>(4)?, row.get::<_, String>(5)?, row.get::<_, i64>(6)?),
                (row.get::<_, Option<i64>>(7)?, row.get::<_, Option<String>>(8)?),
            ))
        })?;
        let mut silences = Vec::new();
        for row in rows {
            let (id, matchers, (starts, ends), (comment, created_by, created_at), (expired_at, expired_by)) = row?;
            let matchers = serde_json::from_str(&matchers)
                .map_err(|e| DbError::Corrupt(format!("silence {id}: matchers: {e}")))?;
            silences.push(Silence {
                id: id as u64,
                matchers,
                starts_at_ms: starts as u64,
                ends_at_ms: ends.map(|v| v as u64),
                comment,
                created_by,
                created_at_ms: created_at as u64,
                expired_at_ms: expired_at.map(|v| v as u64),
                expired_by,
                maintenance: None,
            });
        }
        Ok(silences)
    }

    /// Every active alert and the newest `resolved` resolved ones, each with its last
    /// `transitions` transitions.
    pub fn load(&self, resolved: usize, transitions: usize) -> Result<Loaded, DbError> {
        let next_id: u64 = self
            .conn
            .query_row("SELECT MAX(id) FROM alerts", [], |row| row.get::<_, Option<i64>>(0))
            .optional()?
            .flatten()
            .map(|max| max as u64 + 1)
            .unwrap_or(1);
        let mut statement = self.conn.prepare(
            "SELECT a.id, a.alert_type, a.rule, a.source, a.labels, a.severity, a.message, a.value, a.threshold,
                    a.raised_at_ms, a.updated_at_ms, a.resolved_at_ms, a.occurrence, a.flapping,
                    k.by, k.token, k.at_ms, k.note
             FROM alerts a LEFT JOIN acknowledgements k ON k.alert_id = a.id
             WHERE a.resolved_at_ms IS NULL
                OR a.id IN (SELECT id FROM alerts WHERE resolved_at_ms IS NOT NULL ORDER BY resolved_at_ms DESC, id DESC LIMIT ?1)
             ORDER BY a.resolved_at_ms IS NOT NULL, a.resolved_at_ms DESC, a.id DESC",
        )?;
        let rows = statement.query_map(params![resolved as i64], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, Option<String>>(2)?,
                row.get::<_, String>(3)?,
                row.get::<_, String>(4)?,
                row.get::<_, String>(5)?,
                row.get::<_, String>(6)?,
                row.get::<_, f64>(7)?,
                row.get::<_, f64>(8)?,
                (row.get::<_, i64>(9)?, row.get::<_, i64>(10)?, row.get::<_, Option<i64>>(11)?),
                (row.get::<_, u32>(12)?, row.get::<_, bool>(13)?),
                (
                    row.get::<_, Option<String>>(14)?,
                    row.get::<_, Option<String>>(15)?,
                    row.get::<_, Option<i64>>(16)?,
                    row.get::<_, Option<String>>(17)?,
                ),
            ))
        })?;
        let mut alerts = Vec::new();
        for row in rows {
            let (
                id,
                kind,
                rule,
                source,
                labels,
                severity,
                message,
                value,
                threshold,
                times,
                (occurrence, flapping),
                ack,
            ) = row?;
            let alert_type =
                AlertType::parse(&kind).ok_or_else(|| DbError::Corrupt(format!("alert {id}: type {kind:?}")))?;
            let severity = Severity::parse(&severity)
                .ok_or_else(|| DbError::Corrupt(format!("alert {id}: severity {severity:?}")))?;
            let labels: BTreeMap<String, String> =
                serde_json::from_str(&labels).map_err(|e| DbError::Corrupt(format!("alert {id}: labels: {e}")))?;
            let acknowledgement = match ack {
                (Some(by), Some(token), Some(at_ms), note) => {
                    Some(Acknowledgement { by, token, at_ms: at_ms as u64, note })
                }
                _ => None,
            };
            alerts.push(Alert {
                id: id as u64,
                alert_type,
                rule,
                severity,
                source,
                labels,
                message,
                value,
                threshold,
                raised_at_ms: times.0 as u64,
                updated_at_ms: times.1 as u64,
                resolved_at_ms: times.2.map(|v| v as u64),
                acknowledgement,
                occurrence,
                flapping,
                transitions: Vec::new(),
                silenced: None,
            });
        }
        let mut history = self.transitions(transitions)?;
        for alert in &mut alerts {
            alert.transitions = history.remove(&alert.id).unwrap_or_default();
        }
        Ok(Loaded { alerts, next_id })
    }

    fn transitions(&self, per_alert: usize) -> Result<HashMap<u64, Vec<AlertTransition>>, DbError> {
        let mut statement = self.conn.prepare(
            "SELECT alert_id, at_ms, kind, severity, value, by, note FROM (
                SELECT *, ROW_NUMBER() OVER (PARTITION BY alert_id ORDER BY seq DESC) AS newest FROM transitions)
             WHERE newest <= ?1 ORDER BY alert_id, seq",
        )?;
        let mut out: HashMap<u64, Vec<AlertTransition>> = HashMap::new();
        let rows = statement.query_map(params![per_alert as i64], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, String>(3)?,
                row.get::<_, f64>(4)?,
                row.get::<_, Option<String>>(5)?,
                row.get::<_, Option<String>>(6)?,
            ))
        })?;
        for row in rows {
            let (alert_id, at_ms, kind, severity, value, by, note) = row?;
            let kind =
                TransitionKind::parse(&kind).ok_or_else(|| DbError::Corrupt(format!("transition kind {kind:?}")))?;
            let severity = Severity::parse(&severity)
                .ok_or_else(|| DbError::Corrupt(format!("transition severity {severity:?}")))?;
            out.entry(alert_id as u64).or_default().push(AlertTransition {
                at_ms: at_ms as u64,
                kind,
                severity,
                value,
                by,
                note,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alerts::store::{AlertStore, Lifecycle};
    use crate::alerts::Condition;

    fn cond(source: &str) -> Condition {
        use crate::metrics::Source;
        let source = match source.strip_prefix("kernel:") {
            Some(id) => Source::Kernel(id.into()),
            None => Source::Host,
        };
        Condition {
            alert_type: AlertType::Rule,
            rule: Some("hot".into()),
            labels: [("team".to_string(), "ml".to_string())].into(),
            source,
            severity: Severity::Warning,
            value: 95.0,
            threshold: 90.0,
            message: "hot".into(),
        }
    }

    #[test]
    fn pruning_keeps_the_newest_of_what_grows_while_the_daemon_runs() {
        let dir = crate::test_support::ScratchDir::new("db-prune");
        let mut db = AlertDb::open(&dir.path().join("alerts.db")).unwrap();
        let extra = 25;
        let resolved: Vec<Alert> = (1..=RESOLVED_RETAINED as u64 + extra)
            .map(|id| Alert {
                resolved_at_ms: Some(1_000 + id),
                ..crate::test_support::alert(id, Severity::Warning, "resolved")
            })
            .collect();
        let active = crate::test_support::alert(1_000_000, Severity::Warning, "still firing");
        let mut alerts: Vec<&Alert> = resolved.iter().collect();
        alerts.push(&active);
        let ended: Vec<Silence> = (1..=SILENCES_ENDED_RETAINED as u64 + extra)
            .map(|id| Silence {
                id,
                matchers: Vec::new(),
                starts_at_ms: 0,
                ends_at_ms: Some(10 + id),
                comment: String::new(),
                created_by: "ops".into(),
                created_at_ms: 0,
                expired_at_ms: None,
                expired_by: None,
                maintenance: None,
            })
            .collect();
        let silences: Vec<&Silence> = ended.iter().collect();
        db.save(&alerts, &silences, &[]).unwrap();
        assert_eq!(db.prune().unwrap(), 2 * extra as usize);
        let loaded = db.load(usize::MAX, 10).unwrap();
        assert_eq!(loaded.alerts.len(), RESOLVED_RETAINED as usize + 1, "the active alert is never pruned");
        assert!(loaded.alerts.iter().all(|a| a.id > extra || a.id == 1_000_000), "the oldest resolved went");
        let kept = db.load_silences(crate::clock::now_ms(), usize::MAX).unwrap();
        assert_eq!(kept.len(), SILENCES_ENDED_RETAINED as usize);
        assert!(kept.iter().all(|s| s.id > extra), "the silences that ended first went");
        assert_eq!(db.prune().unwrap(), 0, "within its bounds: nothing more");
    }

    #[test]
    fn migrates_and_refuses_a_newer_schema() {
        let dir = crate::test_support::ScratchDir::new("db-test");
        let path = dir.path().join("alerts.db");
        let db = AlertDb::open(&path).unwrap();
        assert_eq!(db.schema_version().unwrap(), MIGRATIONS.len() as i64);
        drop(db);
        // Opening again is a no-op migration.
        assert_eq!(AlertDb::open(&path).unwrap().schema_version().unwrap(), MIGRATIONS.len() as i64);
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
        drop(conn);
        let error = AlertDb::open(&path).err().expect("newer schema refused").to_string();
        assert!(error.contains("newer ringsided"), "{error}");
    }

    #[test]
    fn alerts_acknowledgements_and_history_survive_reopening() {
        let dir = crate::test_support::ScratchDir::new("db-test");
        let path = dir.path().join("alerts.db");
        let lifecycle = Lifecycle { clear_for_ms: 1000, ..Lifecycle::default() };
        {
            let mut store = AlertStore::open(lifecycle.clone(), Some(AlertDb::open(&path).unwrap())).unwrap();
            store.apply(vec![cond("host"), cond("kernel:a")], 1000);
            let (_, _, confirmation) =
                store.acknowledge(1, "ana".into(), "ops".into(), Some("on it".into()), 2000).unwrap();
            assert_eq!(confirmation.expect("a database confirms").blocking_recv().unwrap(), Ok(()));
            // kernel:a clears and resolves; host stays.
            store.apply(vec![cond("host")], 3000);
            store.apply(vec![cond("host")], 4500);
            assert!(store.flush(std::time::Duration::from_secs(10)), "written before it is closed");
        }
        let mut store = AlertStore::open(lifecycle, Some(AlertDb::open(&path).unwrap())).unwrap();
        let alerts = store.list();
        assert_eq!(alerts.len(), 2);
        let host = alerts.iter().find(|a| a.source == "host").unwrap();
        assert!(host.is_active());
        let ack = host.acknowledgement.as_ref().expect("acknowledgement kept");
        assert_eq!(
            (ack.by.as_str(), ack.token.as_str(), ack.note.as_deref(), ack.at_ms),
            ("ana", "ops", Some("on it"), 2000)
        );
        assert_eq!(host.labels.get("team").map(String::as_str), Some("ml"));
        let kinds: Vec<_> = host.transitions.iter().map(|t| t.kind).collect();
        assert_eq!(kinds, vec![TransitionKind::Raised, TransitionKind::Acknowledged]);
        let kernel = alerts.iter().find(|a| a.source == "kernel:a").unwrap();
        assert_eq!(kernel.resolved_at_ms, Some(4500));
        // The standing alert continues after the restart: no new alert for the same condition,
        // and new ids do not collide with stored ones.
        assert!(store.apply(vec![cond("host")], 5000).is_empty());
        let mut other = cond("kernel:b");
        other.rule = Some("other".into());
        let raised = store.apply(vec![cond("host"), other], 6000);
        assert_eq!(raised[0].alert().id, 3);
    }
}
