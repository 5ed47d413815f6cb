//! The alert database's only writer: a thread of its own, so that neither the collector tick
//! nor an HTTP or WebSocket handler ever waits on the disk, and no lock is held across I/O.
//!
//! Changes are queued by alert id, the newest version of each alert superseding older ones not
//! yet written, and written in one transaction per batch. A batch that fails stays queued and
//! is tried again (after 100 ms, doubling to 5 s) until it succeeds; meanwhile [`Writer::error`]
//! says why, which keeps the `alert-store` component degraded. A caller that must know its
//! change is on disk (an acknowledgement) gets a confirmation, answered when a batch holding
//! that version, or a newer one, commits, or fails.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ringside_shared::{Alert, Notification, Silence};
use tokio::sync::oneshot;

use super::db::AlertDb;

/// What a confirmation says: written, or why not.
pub type Confirmation = oneshot::Receiver<Result<(), String>>;
type Reply = oneshot::Sender<Result<(), String>>;

const FIRST_RETRY: Duration = Duration::from_millis(100);
const LAST_RETRY: Duration = Duration::from_secs(5);

/// What is written: an alert or a silence, by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Row {
    Alert(u64),
    Silence(u64),
    Notification(u64),
}

#[derive(Clone)]
enum Record {
    Alert(Alert),
    Silence(Silence),
    Notification(Notification),
}

#[derive(Default)]
struct Queue {
    /// Row → (version, record): what is still to be written.
    alerts: BTreeMap<Row, (u64, Record)>,
    version: u64,
    /// (row, version, whom to tell).
    waiters: Vec<(Row, u64, Reply)>,
    /// Set while a batch is being written (for [`Writer::flush`]).
    writing: bool,
    stop: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    error: Mutex<Option<String>>,
}

pub struct Writer {
    shared: Arc<Shared>,
}

impl Writer {
    /// Starts the thread that owns `db`.
    pub fn start(db: AlertDb) -> Writer {
        let shared =
            Arc::new(Shared { queue: Mutex::new(Queue::default()), wake: Condvar::new(), error: Mutex::new(None) });
        let for_thread = shared.clone();
        let started = std::thread::Builder::new().name("alert-db".into()).spawn(move || {
            // A panic ends the writer: said as the store's error (it stays degraded), and every
            // caller waiting for a confirmation is answered.
            if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(db, &for_thread))) {
                let what = crate::pipeline::panic_message(panic.as_ref()).to_string();
                tracing::error!("the alert store's writer panicked: {what}");
                let why =
                    format!("the writer stopped ({what}): alert changes are not written until ringsided restarts");
                *for_thread.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
                let mut queue = for_thread.queue.lock().unwrap_or_else(|e| e.into_inner());
                for (_, _, tx) in queue.waiters.drain(..) {
                    let _ = tx.send(Err(why.clone()));
                }
            }
        });
        if let Err(e) = started {
            *shared.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("no writer thread: {e}"));
        }
        Writer { shared }
    }

    /// Queues `alerts` to be written; returns at once.
    pub fn save(&self, alerts: &[&Alert]) {
        let mut queue = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        for alert in alerts {
            queue.version += 1;
            let version = queue.version;
            queue.alerts.insert(Row::Alert(alert.id), (version, Record::Alert((*alert).clone())));
        }
        self.shared.wake.notify_all();
    }

    /// Queues a notification log entry; returns at once.
    pub fn save_notification(&self, notification: &Notification) {
        let mut queue = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        queue.version += 1;
        let version = queue.version;
        queue.alerts.insert(Row::Notification(notification.seq), (version, Record::Notification(notification.clone())));
        self.shared.wake.notify_all();
    }

    /// Queues `silence` and returns a confirmation, as [`Writer::save_confirmed`] does.
    pub fn save_silence(&self, silence: &Silence) -> Confirmation {
        self.queue_confirmed(Row::Silence(silence.id), Record::Silence(silence.clone()))
    }

    /// Queues `alert` and returns a confirmation that answers once it is written (or failed to
    /// be: it stays queued and is tried again, but the caller is told).
    pub fn save_confirmed(&self, alert: &Alert) -> Confirmation {
        self.queue_confirmed(Row::Alert(alert.id), Record::Alert(alert.clone()))
    }

    fn queue_confirmed(&self, row: Row, record: Record) -> Confirmation {
        let (tx, rx) = oneshot::channel();
        let mut queue = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        queue.version += 1;
        let version = queue.version;
        queue.alerts.insert(row, (version, record));
        queue.waiters.push((row, version, tx));
        self.shared.wake.notify_all();
        rx
    }

    /// Why the last write failed, while changes wait to be written again.
    pub fn error(&self) -> Option<String> {
        self.shared.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until everything queued is written, at most `limit`; whether it was.
    pub fn flush(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut queue = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        while !queue.alerts.is_empty() || queue.writing {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            queue = self
                .shared
                .wake
                .wait_timeout(queue, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

impl Drop for Writer {
    /// The thread writes what is queued (trying for a few seconds at most), then ends.
    fn drop(&mut self) {
        self.shared.queue.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        self.shared.wake.notify_all();
    }
}

/// How often the writer prunes the database to its bounds ([`AlertDb::prune`]).
pub const PRUNE_EVERY: Duration = Duration::from_secs(10 * 60);

fn run(mut db: AlertDb, shared: &Shared) {
    let mut retry = FIRST_RETRY;
    let mut failures_at_stop = 0;
    let mut pruned_at = Instant::now();
    loop {
        if pruned_at.elapsed() >= PRUNE_EVERY {
            pruned_at = Instant::now();
            match db.prune() {
                Ok(0) => {}
                Ok(n) => tracing::info!("alert database pruned to its bounds: {n} rows removed"),
                // A locked database: the next round tries again.
                Err(e) => tracing::warn!("pruning the alert database failed: {e}"),
            }
        }
        let batch: Vec<(Row, u64, Record)> = {
            let mut queue = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            while queue.alerts.is_empty() && !queue.stop {
                let left = PRUNE_EVERY.saturating_sub(pruned_at.elapsed()).max(Duration::from_millis(10));
                let (next, timeout) = shared.wake.wait_timeout(queue, left).unwrap_or_else(|e| e.into_inner());
                queue = next;
                if timeout.timed_out() && queue.alerts.is_empty() {
                    break;
                }
            }
            if queue.alerts.is_empty() && queue.stop {
                return;
            }
            if queue.alerts.is_empty() {
                // Woken to prune.
                continue;
            }
            queue.writing = true;
            queue.alerts.iter().map(|(id, (version, alert))| (*id, *version, alert.clone())).collect()
        };
        let alerts: Vec<&Alert> =
            batch.iter().filter_map(|(_, _, r)| if let Record::Alert(a) = r { Some(a) } else { None }).collect();
        let silences: Vec<&Silence> =
            batch.iter().filter_map(|(_, _, r)| if let Record::Silence(s) = r { Some(s) } else { None }).collect();
        let notifications: Vec<&Notification> =
            batch.iter().filter_map(|(_, _, r)| if let Record::Notification(n) = r { Some(n) } else { None }).collect();
        let result = db.save(&alerts, &silences, &notifications).map_err(|e| e.to_string());
        let mut queue = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        queue.writing = false;
        // Tell each waiter whose version (or a newer one) was in this batch.
        let covered = |row: Row, version: u64| batch.iter().any(|(r, v, _)| *r == row && *v >= version);
        let (answered, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut queue.waiters).into_iter().partition(|(row, version, _)| covered(*row, *version));
        queue.waiters = waiting;
        // The store's health first: whoever hears of this batch sees it said.
        let first_failure = {
            let mut error = shared.error.lock().unwrap_or_else(|e| e.into_inner());
            match &result {
                Ok(()) => {
                    *error = None;
                    false
                }
                Err(why) => error.replace(why.clone()).is_none(),
            }
        };
        for (_, _, tx) in answered {
            let _ = tx.send(result.clone());
        }
        match &result {
            Ok(()) => {
                for (row, version, _) in &batch {
                    if queue.alerts.get(row).is_some_and(|(v, _)| v == version) {
                        queue.alerts.remove(row);
                    }
                }
                retry = FIRST_RETRY;
                shared.wake.notify_all();
            }
            Err(why) => {
                if first_failure {
                    tracing::error!("alert store write failed: {why}; kept and tried again");
                }
                shared.wake.notify_all();
                if queue.stop {
                    failures_at_stop += 1;
                    if failures_at_stop >= 3 {
                        tracing::error!(
                            "{} alert changes could not be written before stopping: {why}",
                            queue.alerts.len()
                        );
                        return;
                    }
                }
                // Wait before trying again; new changes join the next batch meanwhile.
                let _unused = shared.wake.wait_timeout(queue, retry).unwrap_or_else(|e| e.into_inner());
                retry = (retry * 2).min(LAST_RETRY);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringside_shared::Severity;

    fn alert(id: u64, message: &str) -> Alert {
        crate::test_support::alert(id, Severity::Warning, message)
    }

    #[test]
    fn a_locked_database_fails_the_confirmation_then_the_change_is_written_when_it_frees() {
        let dir = crate::test_support::ScratchDir::new("writer-test");
        let path = dir.path().join("alerts.db");
        let writer = Writer::start(AlertDb::open(&path).unwrap());
        // Another process holds the database.
        let other = rusqlite::Connection::open(&path).unwrap();
        other.execute_batch("BEGIN EXCLUSIVE").unwrap();
        let started = Instant::now();
        let confirmation = writer.save_confirmed(&alert(1, "first"));
        let answer = confirmation.blocking_recv().unwrap();
        assert!(answer.as_ref().is_err_and(|e| e.contains("locked")), "{answer:?}");
        assert!(started.elapsed() < Duration::from_secs(3), "answered after the busy timeout: {:?}", started.elapsed());
        assert!(writer.error().is_some_and(|e| e.contains("locked")));
        // A newer version queued meanwhile supersedes the first.
        writer.save(&[&alert(1, "second")]);
        assert!(!writer.flush(Duration::from_millis(300)), "still locked");
        other.execute_batch("COMMIT").unwrap();
        assert!(writer.flush(Duration::from_secs(10)), "written once the lock is gone");
        assert_eq!(writer.error(), None, "healthy again");
        drop(writer);
        let loaded = AlertDb::open(&path).unwrap().load(10, 10).unwrap();
        assert_eq!(loaded.alerts.iter().map(|a| a.message.as_str()).collect::<Vec<_>>(), ["second"]);
    }
}
