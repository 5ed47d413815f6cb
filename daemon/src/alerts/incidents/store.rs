//! Incident bundles on disk: `<data_dir>/incidents/<id>.json`, one file per bundle, listed in
//! `index.json`. One thread writes them (a bundle is assembled and serialised there, off the
//! collection tick); after each write the oldest bundles are removed until at most
//! `max_count` files and `max_bytes` bytes are left. A bundle on its own larger than
//! `max_bytes` is not written. Files are written to a temporary name, synced, then renamed:
//! a crash leaves either the whole bundle or none, and a bundle written but missing from the
//! index (a crash between the two) is found again at the next start.
//!
//! A bundle still recording is checkpointed to `<id>.partial` (within `max_bytes` with what is
//! kept, else not at all), removed once the bundle is written. At the next start, a checkpoint
//! whose bundle never came (the daemon was killed) becomes that bundle, cut short.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use ringside_shared::incident::IncidentSummary;
use ringside_shared::IncidentBundle;
use serde::{Deserialize, Serialize};

use super::Parts;

/// Bundles waiting for the writer at most; beyond, a finished bundle is dropped and counted.
pub const QUEUE: usize = 64;
/// The index is read only up to this size.
const MAX_INDEX_BYTES: u64 = 8 * 1024 * 1024;
const INDEX: &str = "index.json";

#[derive(Serialize, Deserialize, Default)]
struct Index {
    next_id: u64,
    bundles: Vec<IncidentSummary>,
}

#[derive(Default)]
struct Shared {
    /// Kept bundles, newest first.
    listed: Mutex<Vec<IncidentSummary>>,
    /// Queued for the writer: listed as still recording.
    queued: Mutex<std::collections::BTreeMap<u64, IncidentSummary>>,
    changed: AtomicBool,
    dropped: AtomicU64,
    error: Mutex<Option<String>>,
    /// Bundles and checkpoints handed to the writer and not yet done.
    in_flight: AtomicUsize,
}

impl Shared {
    fn dequeue(&self, id: u64) {
        self.queued.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    fn publish(&self, entries: &[IncidentSummary]) {
        *self.listed.lock().unwrap_or_else(|e| e.into_inner()) = entries.iter().rev().cloned().collect();
        self.changed.store(true, Ordering::Relaxed);
    }

    fn fail(&self, why: String) {
        tracing::error!("incident bundles: {why}");
        *self.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        self.changed.store(true, Ordering::Relaxed);
    }

    fn drop_one(&self, why: String) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        self.fail(why);
    }
}

/// Why a bundle cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("no incident bundle {0}")]
    NotFound(u64),
    #[error("incident bundle {0} cannot be read: {1}")]
    Io(u64, String),
}

/// The bundles kept on disk, and the thread that writes them.
pub struct BundleStore {
    dir: PathBuf,
    max_bytes: u64,
    next_id: u64,
    shared: Arc<Shared>,
    tx: Option<mpsc::SyncSender<Box<Parts>>>,
    done: Option<mpsc::Receiver<()>>,
}

impl BundleStore {
    /// Opens (or creates) `dir` and starts the writer. Never fails: what goes wrong is kept
    /// as the store's error (its health), and bundles that cannot be written are dropped.
    pub fn open(dir: &Path, max_count: usize, max_bytes: u64) -> BundleStore {
        let shared = Arc::new(Shared::default());
        let mut disk = Disk {
            dir: dir.to_path_buf(),
            max_count,
            max_bytes,
            entries: Vec::new(),
            checkpoints: std::collections::BTreeMap::new(),
            next_id: 1,
        };
        if let Err(why) = disk.load() {
            shared.fail(why);
        }
        shared.publish(&disk.entries);
        shared.changed.store(false, Ordering::Relaxed);
        let next_id = disk.next_id;
        let (tx, rx) = mpsc::sync_channel::<Box<Parts>>(QUEUE);
        let (done_tx, done) = mpsc::channel();
        let writer = shared.clone();
        let spawned = std::thread::Builder::new().name("incidents".into()).spawn(move || {
            for parts in rx {
                let id = parts.id();
                if parts.checkpoint {
                    disk.write_checkpoint(*parts);
                } else {
                    disk.write(*parts, &writer);
                    writer.dequeue(id);
                }
                writer.in_flight.fetch_sub(1, Ordering::Relaxed);
            }
            let _ = done_tx.send(());
        });
        let (tx, done) = match spawned {
            Ok(_) => (Some(tx), Some(done)),
            Err(e) => {
                shared.fail(format!("cannot start the writer thread: {e}"));
                (None, None)
            }
        };
        BundleStore { dir: dir.to_path_buf(), max_bytes, next_id, shared, tx, done }
    }

    /// The id the next bundle gets: above every id on disk.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Queues a finished bundle for writing: given back when the writer is [`QUEUE`] bundles
    /// behind (to be tried again), dropped and counted when the writer has stopped.
    pub fn write(&self, parts: Box<Parts>) -> Result<(), Box<Parts>> {
        let id = parts.id();
        let Some(tx) = self.tx.as_ref() else {
            self.shared.drop_one(format!("bundle {id} dropped: the writer has stopped"));
            return Ok(());
        };
        let summary = parts.summary();
        self.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        match tx.try_send(parts) {
            Ok(()) => {
                self.shared.queued.lock().unwrap_or_else(|e| e.into_inner()).insert(id, summary);
                Ok(())
            }
            Err(mpsc::TrySendError::Full(parts)) => {
                self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
                Err(parts)
            }
            Err(mpsc::TrySendError::Disconnected(_)) => {
                self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
                self.shared.drop_one(format!("bundle {id} dropped: the writer has stopped"));
                Ok(())
            }
        }
    }

    /// Whether the writer has nothing to do.
    pub fn idle(&self) -> bool {
        self.tx.is_some() && self.shared.in_flight.load(Ordering::Relaxed) == 0
    }

    /// Queues a checkpoint of a bundle still recording; none is taken when the writer is busy.
    pub fn checkpoint(&self, parts: Box<Parts>) {
        let Some(tx) = self.tx.as_ref() else { return };
        self.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        if tx.try_send(parts).is_err() {
            self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Queues a bundle, waiting for room (at stop).
    fn write_waiting(&self, parts: Box<Parts>) {
        let id = parts.id();
        self.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        if self.tx.as_ref().is_none_or(|tx| tx.send(parts).is_err()) {
            self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            self.shared.drop_one(format!("bundle {id} dropped: the writer has stopped"));
        }
    }

    pub fn count_dropped(&self, n: u64) {
        self.shared.dropped.fetch_add(n, Ordering::Relaxed);
    }

    /// Bundles queued for the writer, then those kept, newest first.
    pub fn list(&self) -> Vec<IncidentSummary> {
        let queued = self.shared.queued.lock().unwrap_or_else(|e| e.into_inner());
        let listed = self.shared.listed.lock().unwrap_or_else(|e| e.into_inner());
        // Just written: listed already, not yet taken off the queue.
        let waiting = queued.values().rev().filter(|q| !listed.iter().any(|l| l.id == q.id));
        waiting.chain(listed.iter()).cloned().collect()
    }

    pub fn take_changed(&self) -> bool {
        self.shared.changed.swap(false, Ordering::Relaxed)
    }

    /// Bundles kept, their bytes, and bundles dropped since the start.
    pub fn totals(&self) -> (u64, u64, u64) {
        let listed = self.shared.listed.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = listed.iter().map(|s| s.bytes).sum();
        (listed.len() as u64, bytes, self.shared.dropped.load(Ordering::Relaxed))
    }

    /// The latest failure, until a bundle is written again.
    pub fn error(&self) -> Option<String> {
        self.shared.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The JSON file of bundle `id`.
    pub fn read(&self, id: u64) -> Result<Vec<u8>, ReadError> {
        let kept = self.shared.listed.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|s| s.id == id);
        if !kept {
            return Err(ReadError::NotFound(id));
        }
        let path = self.dir.join(format!("{id}.json"));
        let io = |e: std::io::Error| ReadError::Io(id, e.to_string());
        let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path);
        let file = match file {
            Ok(file) => file,
            // Removed for the bounds since it was listed.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ReadError::NotFound(id)),
            Err(e) => return Err(io(e)),
        };
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(file, self.max_bytes + 1), &mut bytes).map_err(io)?;
        if bytes.len() as u64 > self.max_bytes {
            return Err(ReadError::Io(id, "larger than max_bytes".into()));
        }
        Ok(bytes)
    }

    /// Queues `waiting` (oldest first), then stops the writer once it has written what is
    /// queued, waiting at most `limit`.
    pub fn close(&mut self, waiting: impl IntoIterator<Item = Box<Parts>>, limit: Duration) -> bool {
        for parts in waiting {
            self.write_waiting(parts);
        }
        self.tx = None;
        match self.done.take() {
            Some(done) => done.recv_timeout(limit).is_ok(),
            None => true,
        }
    }
}

/// The writer thread's view: the directory and what is in it, oldest first.
struct Disk {
    dir: PathBuf,
    max_count: usize,
    max_bytes: u64,
    entries: Vec<IncidentSummary>,
    /// Checkpoints on disk of bundles still recording: id and bytes.
    checkpoints: std::collections::BTreeMap<u64, u64>,
    next_id: u64,
}

/// `<id><suffix>`: the id.
fn file_id(name: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_suffix(suffix)?;
    (!digits.is_empty() && digits.len() <= 19 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// `<id>.json`: the id.
fn bundle_id(name: &str) -> Option<u64> {
    file_id(name, ".json")
}

const CHECKPOINT: &str = ".partial";

impl Disk {
    fn path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn checkpoint_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id}{CHECKPOINT}"))
    }

    /// Writes a checkpoint of a bundle still recording, when it fits within `max_bytes` with
    /// the bundles kept and the other checkpoints; else none (the bundle itself is not held up).
    fn write_checkpoint(&mut self, parts: Parts) {
        let bundle = super::assemble(parts);
        let id = bundle.id;
        let Ok(json) = serde_json::to_vec(&bundle) else { return };
        let kept: u64 = self.entries.iter().map(|s| s.bytes).sum();
        let others: u64 = self.checkpoints.iter().filter(|(k, _)| **k != id).map(|(_, b)| b).sum();
        if kept + others + json.len() as u64 > self.max_bytes {
            tracing::debug!(id, bytes = json.len(), "no room for the incident bundle's checkpoint");
            return;
        }
        match self.write_file(&format!("{id}{CHECKPOINT}"), &json) {
            Ok(()) => {
                self.checkpoints.insert(id, json.len() as u64);
            }
            Err(e) => tracing::warn!("cannot write a checkpoint of incident bundle {id}: {e}"),
        }
    }

    /// The bundle is written (or given up): its checkpoint goes.
    fn drop_checkpoint(&mut self, id: u64) {
        if self.checkpoints.remove(&id).is_some() {
            let _ = std::fs::remove_file(self.checkpoint_path(id));
        }
    }

    /// Reads the index and the directory; a bundle file the index misses is read to list it,
    /// leftovers of an interrupted write are removed.
    fn load(&mut self) -> Result<(), String> {
        match std::fs::symlink_metadata(&self.dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(format!("{} is not a directory", self.dir.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(&self.dir).map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
            }
            Err(e) => return Err(format!("{}: {e}", self.dir.display())),
        }
        let _ = std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700));
        let mut problem = None;
        let index = self.dir.join(INDEX);
        let indexed: Index = match std::fs::symlink_metadata(&index) {
            Ok(m) if m.is_file() && m.len() <= MAX_INDEX_BYTES => std::fs::read(&index)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
                .unwrap_or_else(|why| {
                    problem = Some(format!("{} unreadable ({why}): rebuilt from the bundles", index.display()));
                    Index::default()
                }),
            Ok(_) => {
                problem = Some(format!("{} is not a plain file of at most 8 MiB: rebuilt", index.display()));
                Index::default()
            }
            Err(_) => Index::default(),
        };
        let listing = std::fs::read_dir(&self.dir).map_err(|e| format!("cannot list {}: {e}", self.dir.display()))?;
        let mut files = std::collections::BTreeMap::new();
        let mut checkpoints = Vec::new();
        for entry in listing.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Ok(meta) = entry.metadata() else { continue };
            if name.ends_with(".tmp") && meta.is_file() {
                let _ = std::fs::remove_file(entry.path());
            } else if let Some(id) = bundle_id(name).filter(|_| meta.is_file()) {
                files.insert(id, meta.len());
            } else if let Some(id) = file_id(name, CHECKPOINT).filter(|_| meta.is_file()) {
                checkpoints.push((id, meta.len()));
            }
        }
        // A checkpoint whose bundle was never written: the daemon died while it recorded. It
        // is that bundle now, cut short (read and checked below like any unindexed file).
        for (id, bytes) in checkpoints {
            if files.contains_key(&id) || std::fs::rename(self.checkpoint_path(id), self.path(id)).is_err() {
                let _ = std::fs::remove_file(self.checkpoint_path(id));
            } else {
                tracing::warn!("incident bundle {id} was recording when the daemon stopped: its checkpoint is kept");
                files.insert(id, bytes);
            }
        }
        self.next_id = indexed.next_id.max(1);
        for mut summary in indexed.bundles {
            if let Some(bytes) = files.remove(&summary.id) {
                summary.bytes = bytes;
                self.entries.push(summary);
            }
        }
        for (id, bytes) in files {
            let read = if bytes <= self.max_bytes {
                std::fs::read(self.path(id))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<IncidentBundle>(&b).ok())
                    .filter(|b| b.id == id)
            } else {
                None
            };
            match read {
                Some(bundle) => self.entries.push(bundle.summary(bytes)),
                None => {
                    tracing::warn!("incident bundle file {id}.json is not a bundle of this daemon's: removed");
                    let _ = std::fs::remove_file(self.path(id));
                }
            }
        }
        self.entries.sort_by_key(|s| s.id);
        self.next_id = self.next_id.max(self.entries.last().map_or(1, |s| s.id + 1));
        self.bound();
        self.save_index()?;
        problem.map_or(Ok(()), Err)
    }

    /// Writes a finished bundle; its checkpoint goes once it is written (or given up).
    fn write(&mut self, parts: Parts, shared: &Shared) {
        let id = parts.id();
        self.write_bundle(parts, shared);
        self.drop_checkpoint(id);
    }

    fn write_bundle(&mut self, parts: Parts, shared: &Shared) {
        let bundle = super::assemble(parts);
        let id = bundle.id;
        let json = match serde_json::to_vec(&bundle) {
            Ok(json) => json,
            Err(e) => return shared.drop_one(format!("bundle {id} cannot be encoded: {e}")),
        };
        if json.len() as u64 > self.max_bytes {
            return shared.drop_one(format!(
                "bundle {id} is {} bytes, more than max_bytes ({}): not kept",
                json.len(),
                self.max_bytes
            ));
        }
        if let Err(e) = self.write_file(&format!("{id}.json"), &json) {
            return shared.drop_one(format!("cannot write bundle {id}: {e}"));
        }
        self.entries.push(bundle.summary(json.len() as u64));
        self.entries.sort_by_key(|s| s.id);
        self.next_id = self.next_id.max(id + 1);
        self.bound();
        // Written: what went wrong before is over.
        *shared.error.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Err(why) = self.save_index() {
            shared.fail(why);
        }
        shared.publish(&self.entries);
    }

    /// Writes `bytes` to `name` in the directory: a temporary file, synced, then renamed.
    fn write_file(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        let tmp = self.dir.join(format!("{name}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(name))?;
        if let Ok(dir) = std::fs::File::open(&self.dir) {
            let _ = dir.sync_all();
        }
        Ok(())
    }

    /// Removes the oldest bundles until the bounds hold.
    fn bound(&mut self) {
        let mut total: u64 = self.entries.iter().map(|s| s.bytes).sum();
        while !self.entries.is_empty() && (self.entries.len() > self.max_count || total > self.max_bytes) {
            let oldest = self.entries.remove(0);
            total -= oldest.bytes;
            if let Err(e) = std::fs::remove_file(self.path(oldest.id)) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!("cannot remove incident bundle {}: {e}", oldest.id);
                }
            }
        }
    }

    fn save_index(&self) -> Result<(), String> {
        let index = Index { next_id: self.next_id, bundles: self.entries.clone() };
        let json = serde_json::to_vec(&index).map_err(|e| e.to_string())?;
        let written = self.write_file(INDEX, &json);
        written.map_err(|e| format!("cannot write {}: {e}", self.dir.join(INDEX).display()))
    }
}
