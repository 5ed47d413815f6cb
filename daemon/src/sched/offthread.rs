//! Work the observer must never wait for — anything that touches a file a local user controls
//! (a library's bytes, the directories above it): one worker thread behind a bounded queue,
//! polled for answers. A job that takes longer than the time limit is answered `TimedOut` and
//! its worker abandoned (with what it had queued) for a fresh one; after [`MAX_ABANDONED`]
//! the work stops and says why. An abandoned thread stays blocked in the kernel until its read
//! returns, if ever: the bound keeps their number small.

use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long one job on a file a user controls (reading a library, checking the directories
/// above it) may take before its worker is abandoned: local files take milliseconds.
pub const FILE_TIMEOUT: Duration = Duration::from_secs(5);
/// Workers abandoned before the work stops altogether.
pub const MAX_ABANDONED: u32 = 4;

/// What became of a job.
pub enum Outcome<Q, R> {
    Done(Q, R),
    /// It took longer than the limit; its worker was abandoned.
    TimedOut(Q),
}

struct Worker<Q, R> {
    requests: SyncSender<Q>,
    results: Receiver<(Q, R)>,
    /// The job in hand and since when.
    busy: Arc<Mutex<Option<(Q, Instant)>>>,
}

pub struct OffThread<Q, R> {
    name: &'static str,
    what: &'static str,
    queue: usize,
    timeout: Duration,
    job: Arc<dyn Fn(&Q) -> R + Send + Sync>,
    worker: Option<Worker<Q, R>>,
    abandoned: u32,
    stopped: Option<String>,
}

impl<Q: Clone + Send + 'static, R: Send + 'static> OffThread<Q, R> {
    /// `name` is the thread's, `what` says in messages what it does ("library inspection").
    pub fn new(
        name: &'static str,
        what: &'static str,
        queue: usize,
        timeout: Duration,
        job: impl Fn(&Q) -> R + Send + Sync + 'static,
    ) -> OffThread<Q, R> {
        let mut work =
            OffThread { name, what, queue, timeout, job: Arc::new(job), worker: None, abandoned: 0, stopped: None };
        work.start_worker();
        work
    }

    fn start_worker(&mut self) {
        let (requests, inbox) = std::sync::mpsc::sync_channel::<Q>(self.queue);
        let (outbox, results) = std::sync::mpsc::channel();
        let busy: Arc<Mutex<Option<(Q, Instant)>>> = Arc::default();
        let (job, worker_busy) = (self.job.clone(), busy.clone());
        let spawned = std::thread::Builder::new().name(self.name.into()).spawn(move || {
            for request in inbox {
                if let Ok(mut slot) = worker_busy.lock() {
                    *slot = Some((request.clone(), Instant::now()));
                }
                let result = job(&request);
                if let Ok(mut slot) = worker_busy.lock() {
                    *slot = None;
                }
                if outbox.send((request, result)).is_err() {
                    break;
                }
            }
        });
        match spawned {
            Ok(_) => self.worker = Some(Worker { requests, results, busy }),
            Err(e) => self.stopped = Some(format!("{} stopped: cannot start its thread: {e}", self.what)),
        }
    }

    /// Queues a job; false when the queue is full (ask again later) or the work has stopped.
    pub fn send(&mut self, request: Q) -> bool {
        let Some(worker) = &self.worker else { return false };
        match worker.requests.try_send(request) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => false,
            Err(TrySendError::Disconnected(_)) => {
                self.stopped.get_or_insert_with(|| format!("{} stopped: its thread ended", self.what));
                self.worker = None;
                false
            }
        }
    }

    /// What is done, and the job the worker has been stuck on past the limit, if any (then
    /// everything it had queued is lost: `abandoned` turns true, ask again).
    pub fn poll(&mut self) -> (Vec<Outcome<Q, R>>, bool) {
        let mut done = Vec::new();
        let Some(worker) = &self.worker else { return (done, false) };
        loop {
            match worker.results.try_recv() {
                Ok((q, r)) => done.push(Outcome::Done(q, r)),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.stopped.get_or_insert_with(|| format!("{} stopped: its thread ended", self.what));
                    self.worker = None;
                    return (done, true);
                }
            }
        }
        let stuck = worker
            .busy
            .lock()
            .ok()
            .and_then(|busy| busy.as_ref().filter(|(_, since)| since.elapsed() > self.timeout).cloned());
        let Some((request, _)) = stuck else { return (done, false) };
        done.push(Outcome::TimedOut(request));
        // Dropping the worker's queue ends it once (if ever) its job returns.
        self.worker = None;
        self.abandoned += 1;
        if self.abandoned >= MAX_ABANDONED {
            self.stopped = Some(format!(
                "{} stopped: {} files could not be read within {:?}",
                self.what, self.abandoned, self.timeout
            ));
        } else {
            self.start_worker();
        }
        (done, true)
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Why the work has stopped, if it has.
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(work: &mut OffThread<u64, u64>) -> (Vec<Outcome<u64, u64>>, bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (done, abandoned) = work.poll();
            if !done.is_empty() {
                return (done, abandoned);
            }
            assert!(Instant::now() < deadline, "nothing in 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn jobs_are_answered_and_a_stuck_one_is_abandoned_until_the_work_stops() {
        // Job n sleeps n ms: 0 answers at once, 3_600_000 never does (a hung file system).
        let mut work = OffThread::new("test-work", "test work", 4, Duration::from_millis(100), |ms: &u64| {
            std::thread::sleep(Duration::from_millis(*ms));
            ms + 1
        });
        assert!(work.send(0));
        match wait(&mut work) {
            (done, false) if matches!(done[..], [Outcome::Done(0, 1)]) => {}
            _ => panic!("job 0 answered"),
        }
        for round in 1..=MAX_ABANDONED {
            assert!(work.send(3_600_000));
            assert!(work.send(0), "queued behind the stuck one: lost with it");
            let started = Instant::now();
            let (done, abandoned) = wait(&mut work);
            assert!(abandoned && matches!(done[..], [Outcome::TimedOut(3_600_000)]));
            assert!(started.elapsed() < Duration::from_secs(2));
            assert_eq!(work.stopped().is_some(), round == MAX_ABANDONED);
        }
        assert!(work.stopped().unwrap().contains("4 files could not be read"));
        assert!(!work.send(0));
    }
}
