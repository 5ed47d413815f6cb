//! History on disk: one file per closed block (`fine-<start ms>.rsh`, `coarse-<start ms>.rsh`)
//! and `head.rsh`, the open chunks, rewritten every flush interval. Each file is written whole
//! to a temporary name and renamed, and ends with a CRC-32 of everything before it: a torn,
//! corrupt or foreign file is set aside (`<name>.corrupt-<UTC>`) and the daemon starts without
//! it. Files past their tier's age are removed, and the oldest go first when the directory is
//! over its size bound.
//!
//! Layout (little-endian): `RSHIST01`, kind (0 block, 1 head), tier of a block, its index,
//! the number of chunks, then per chunk: tier, key length (u16), key, first and last unit
//! (u64), point count (u32), byte length (u32), bytes; and the CRC-32.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;

use super::store::{Block, Chunk, Tier};

const MAGIC: &[u8; 8] = b"RSHIST01";
pub const HEAD: &str = "head.rsh";
/// Longest series name a file may hold.
pub const MAX_KEY: usize = 512;
/// Largest chunk a file may hold (a fine chunk of 600 points is a few KiB).
const MAX_CHUNK: usize = 1 << 20;
/// Largest file read back (a block of every series at most).
const MAX_FILE: u64 = 256 << 20;

/// What a file holds.
#[derive(Debug)]
pub enum Contents {
    Block(Block),
    /// The open chunks, written while fine block `block` was open.
    Head {
        block: u64,
        chunks: Vec<(Arc<str>, Tier, Chunk)>,
    },
}

fn put_chunk(out: &mut Vec<u8>, key: &str, tier: Tier, c: &Chunk) {
    let key = &key.as_bytes()[..key.len().min(MAX_KEY)];
    out.push(tier.code());
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&c.first.to_le_bytes());
    out.extend_from_slice(&c.last.to_le_bytes());
    out.extend_from_slice(&c.count.to_le_bytes());
    out.extend_from_slice(&(c.bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(&c.bytes);
}

fn finish(mut out: Vec<u8>) -> Vec<u8> {
    let mut crc = flate2::Crc::new();
    crc.update(&out);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out
}

pub fn encode_block(block: &Block) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(64 + block.chunks.iter().map(|(k, c)| k.len() + c.bytes.len() + 32).sum::<usize>());
    out.extend_from_slice(MAGIC);
    out.push(0);
    out.push(block.tier.code());
    out.extend_from_slice(&block.index.to_le_bytes());
    out.extend_from_slice(&(block.chunks.len() as u32).to_le_bytes());
    for (key, chunk) in &block.chunks {
        put_chunk(&mut out, key, block.tier, chunk);
    }
    finish(out)
}

pub fn encode_head(block: u64, chunks: &[(Arc<str>, Tier, Chunk)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + chunks.iter().map(|(k, _, c)| k.len() + c.bytes.len() + 32).sum::<usize>());
    out.extend_from_slice(MAGIC);
    out.push(1);
    out.push(Tier::Fine.code());
    out.extend_from_slice(&block.to_le_bytes());
    out.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
    for (key, tier, chunk) in chunks {
        put_chunk(&mut out, key, *tier, chunk);
    }
    finish(out)
}

/// Reads what [`encode_block`] or [`encode_head`] wrote; why not, where the bytes are not that.
pub fn decode(bytes: &[u8]) -> Result<Contents, String> {
    if bytes.len() < MAGIC.len() + 4 || &bytes[..MAGIC.len()] != MAGIC {
        return Err("not a Ringside history file".into());
    }
    let (body, sum) = bytes.split_at(bytes.len() - 4);
    let mut crc = flate2::Crc::new();
    crc.update(body);
    if crc.sum().to_le_bytes() != sum {
        return Err("checksum mismatch (torn or corrupt)".into());
    }
    parse(&body[MAGIC.len()..])
}

/// A file's contents between its magic and its checksum (public for the fuzz target, which
/// cannot forge checksums).
pub fn parse(body: &[u8]) -> Result<Contents, String> {
    let mut r = Reader { bytes: body };
    let kind = r.u8()?;
    let tier = Tier::from_code(r.u8()?).ok_or("unknown tier")?;
    let index = r.u64()?;
    let n = r.u32()? as usize;
    let mut chunks = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        let tier = Tier::from_code(r.u8()?).ok_or("unknown tier")?;
        let key_len = r.u16()? as usize;
        if key_len > MAX_KEY {
            return Err("series name too long".into());
        }
        let key = std::str::from_utf8(r.take(key_len)?).map_err(|_| "series name not UTF-8")?;
        let (first, last, count) = (r.u64()?, r.u64()?, r.u32()?);
        let len = r.u32()? as usize;
        if len > MAX_CHUNK || last < first || count == 0 {
            return Err(format!("chunk of {key} out of bounds"));
        }
        let bytes: Arc<[u8]> = r.take(len)?.into();
        chunks.push((Arc::<str>::from(key), tier, Chunk { first, last, count, bytes }));
    }
    if !r.bytes.is_empty() {
        return Err("trailing bytes".into());
    }
    match kind {
        0 => {
            if chunks.iter().any(|(_, t, c)| {
                *t != tier || c.first / tier.block_units() != index || c.last / tier.block_units() != index
            }) {
                return Err("a chunk outside its block".into());
            }
            Ok(Contents::Block(Block { tier, index, chunks: chunks.into_iter().map(|(k, _, c)| (k, c)).collect() }))
        }
        1 => Ok(Contents::Head { block: index, chunks }),
        _ => Err("unknown file kind".into()),
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err("file ends early".into());
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap_or_default()))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap_or_default()))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap_or_default()))
    }
}

/// The file name of a closed block.
pub fn block_name(tier: Tier, index: u64) -> String {
    format!("{}-{}.rsh", tier.name(), index * tier.block_ms())
}

/// `(tier, start ms)` of a block file's name.
fn parse_block_name(name: &str) -> Option<(Tier, u64)> {
    let stem = name.strip_suffix(".rsh")?;
    let (tier, start) = stem.split_once('-')?;
    let tier = Tier::ALL.into_iter().find(|t| t.name() == tier)?;
    Some((tier, start.parse().ok()?))
}

/// Writes `bytes` as `dir/name`, whole or not at all.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_data()?;
    drop(file);
    std::fs::rename(&tmp, dir.join(name))
}

/// What was read back at start, and what was set aside.
#[derive(Debug, Default)]
pub struct Loaded {
    pub files: Vec<Contents>,
    /// One line per file set aside.
    pub set_aside: Vec<String>,
}

/// Reads every history file in `dir` (created if missing). A file that is not what its name
/// says is renamed `<name>.corrupt-<UTC>`, never a reason not to start.
pub fn load(dir: &Path, now_ms: u64) -> std::io::Result<Loaded> {
    std::fs::create_dir_all(dir)?;
    let mut loaded = Loaded::default();
    let mut names: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else { continue };
        // Only regular files: a link or a directory planted here is not followed.
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        if name == HEAD || parse_block_name(&name).is_some() {
            names.push(name);
        } else if name.starts_with('.') && name.ends_with(".tmp") {
            // A write cut short.
            let _ = std::fs::remove_file(entry.path());
        }
    }
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let read =
            read_bounded(&path).and_then(|bytes| decode(&bytes)).and_then(|c| match (&c, parse_block_name(&name)) {
                (Contents::Block(b), Some((tier, start))) if b.tier == tier && b.start_ms() == start => Ok(c),
                (Contents::Head { .. }, None) => Ok(c),
                _ => Err("its contents are not what its name says".into()),
            });
        match read {
            Ok(c) => loaded.files.push(c),
            Err(why) => {
                let aside = format!("{name}.corrupt-{}", crate::clock::utc_compact(now_ms));
                let _ = std::fs::rename(&path, dir.join(&aside));
                loaded.set_aside.push(format!("history file {name} set aside as {aside}: {why}"));
            }
        }
    }
    Ok(loaded)
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if meta.len() > MAX_FILE {
        return Err(format!("{} bytes, more than a history file can be", meta.len()));
    }
    std::fs::read(path).map_err(|e| e.to_string())
}

/// A request to the writer thread.
pub enum Write {
    Block(Block),
    Head {
        block: u64,
        chunks: Vec<(Arc<str>, Tier, Chunk)>,
    },
    /// Remove files past their age, then the oldest while over the size bound.
    Trim {
        now_ms: u64,
    },
}

/// The `history-writer` thread: files are written off the collection loop.
pub struct Writer {
    tx: Option<SyncSender<Write>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the writer reports.
#[derive(Debug, Default)]
pub struct DiskStats {
    pub bytes: AtomicU64,
    pub write_errors: AtomicU64,
    /// Files removed to stay within the size bound (not by age).
    pub trimmed: AtomicU64,
    /// The last write's error while writes fail; cleared by the next write that succeeds.
    pub failing: std::sync::Mutex<Option<String>>,
}

impl Writer {
    pub fn start(dir: PathBuf, max_bytes: u64, stats: Arc<DiskStats>) -> std::io::Result<Writer> {
        let (tx, rx) = std::sync::mpsc::sync_channel(32);
        let thread =
            std::thread::Builder::new().name("history-writer".into()).spawn(move || run(dir, max_bytes, &stats, rx))?;
        Ok(Writer { tx: Some(tx), thread: Some(thread) })
    }

    /// Queues a write; gives it back where the queue is full (the disk is stuck).
    pub fn send(&self, w: Write) -> Result<(), Write> {
        match self.tx.as_ref().map(|tx| tx.try_send(w)) {
            Some(Ok(())) => Ok(()),
            Some(Err(TrySendError::Full(w) | TrySendError::Disconnected(w))) => Err(w),
            None => Ok(()),
        }
    }

    /// Queues a write, waiting while the queue is full (at a clean stop).
    pub fn send_waiting(&self, w: Write) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(w);
        }
    }

    /// Writes what is queued and stops the thread.
    pub fn stop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(dir: PathBuf, max_bytes: u64, stats: &DiskStats, rx: Receiver<Write>) {
    for w in rx {
        let written = match w {
            Write::Block(block) => {
                Some(write_atomic(&dir, &block_name(block.tier, block.index), &encode_block(&block)))
            }
            Write::Head { block, chunks } => Some(write_atomic(&dir, HEAD, &encode_head(block, &chunks))),
            // Not a write: whether writes fail stays as the last one said.
            Write::Trim { now_ms } => {
                trim(&dir, now_ms, max_bytes, stats);
                None
            }
        };
        if let Some(result) = written {
            let failing = result.err().map(|e| {
                stats.write_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("cannot write history under {}: {e}", dir.display());
                format!("{}: {e}", dir.display())
            });
            *stats.failing.lock().unwrap_or_else(|e| e.into_inner()) = failing;
        }
        stats.bytes.store(usage(&dir).iter().map(|f| f.bytes).sum(), Ordering::Relaxed);
    }
}

struct FileUse {
    path: PathBuf,
    bytes: u64,
    /// Age order: set-aside files first, then fine blocks, then coarse blocks, oldest first.
    rank: (u8, u64),
    expires_ms: Option<u64>,
}

fn usage(dir: &Path) -> Vec<FileUse> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files = Vec::new();
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let (rank, expires_ms) = if name == HEAD {
            ((3, 0), None)
        } else if let Some((tier, start)) = parse_block_name(&name) {
            ((1 + tier.code(), start), Some(start + tier.block_ms() + tier.keep_ms()))
        } else if name.contains(".corrupt-") {
            ((0, 0), None)
        } else {
            continue;
        };
        files.push(FileUse { path: entry.path(), bytes: meta.len(), rank, expires_ms });
    }
    files.sort_by_key(|f| f.rank);
    files
}

/// Removes block files past their tier's age, then the oldest files (set-aside ones first)
/// while the directory is over `max_bytes`; the head is never removed.
pub fn trim(dir: &Path, now_ms: u64, max_bytes: u64, stats: &DiskStats) {
    let mut files = usage(dir);
    files.retain(|f| {
        let expired = f.expires_ms.is_some_and(|e| e <= now_ms);
        if expired {
            let _ = std::fs::remove_file(&f.path);
        }
        !expired
    });
    let mut total: u64 = files.iter().map(|f| f.bytes).sum();
    for f in &files {
        if total <= max_bytes || f.rank.0 == 3 {
            break;
        }
        if std::fs::remove_file(&f.path).is_ok() {
            total -= f.bytes;
            stats.trimmed.fetch_add(1, Ordering::Relaxed);
        }
    }
}
