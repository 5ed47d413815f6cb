//! The node's history: every series the console charts and every rule metric, kept 24 h at
//! one value a second and 7 days at each minute's min/max/mean, compressed in memory
//! ([`store`], [`codec`]) and on disk under `<data_dir>/history` ([`disk`]), and answered
//! downsampled for `GET /api/history`.
//!
//! Why our own chunks and not a crate: the store appends one value per series per tick and
//! must answer from the open chunk at once, round values to what a chart shows before
//! compressing them, and keep its files bounded and crash-safe in the daemon's own terms. The
//! Gorilla scheme it follows is short (codec.rs), and the Rust crates that implement it are
//! unmaintained; the column codecs that are maintained (pcodec) compress whole batches, not a
//! stream.

pub mod codec;
pub mod disk;
pub mod store;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use ringside_shared::history::{HISTORY_EXPORT_POINTS, HISTORY_MAX_POINTS, HISTORY_MAX_RANGE_MS, HISTORY_MAX_SERIES};
use ringside_shared::{HistoryCatalog, HistoryResponse, HistorySeriesInfo};
use serde::Deserialize;

use crate::metrics::{RuleMetric, View, ALL};
use crate::pipeline::Sample;
use disk::{Contents, DiskStats, Write, Writer};
use store::{Block, Limits, Store};

/// The `[history]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HistoryConfig {
    pub enabled: bool,
    /// Bytes the history directory may take; the oldest files go first.
    pub max_disk_bytes: u64,
    /// Bytes of memory the chunks may take; past it the oldest fine chunks go first.
    pub max_memory_bytes: u64,
    /// Seconds between writes of the open chunks: what a `kill -9` can lose.
    pub flush_interval_s: u64,
    /// Series kept at most.
    pub max_series: usize,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig {
            enabled: true,
            max_disk_bytes: 256 << 20,
            max_memory_bytes: 64 << 20,
            flush_interval_s: 60,
            max_series: 4096,
        }
    }
}

impl HistoryConfig {
    pub fn check(&self) -> Result<(), crate::invalid::Invalid> {
        use crate::invalid::Invalid;
        Invalid::range("history.max_disk_bytes", self.max_disk_bytes, 1 << 20, u64::MAX)?;
        Invalid::range("history.max_memory_bytes", self.max_memory_bytes, 1 << 20, 1 << 40)?;
        Invalid::range("history.flush_interval_s", self.flush_interval_s, 1, 60)?;
        Invalid::range("history.max_series", self.max_series, 1, 100_000)?;
        Ok(())
    }
}

/// Series only the console charts (no rule knows them): each kernel's latency quantiles.
const KERNEL_P50: &str = "kernel.latency_p50_ns";
const KERNEL_P99: &str = "kernel.latency_p99_ns";

/// `(series name, value)` of everything a tick holds that history keeps: every rule metric of
/// every source (jobs not admitted for alerting included: the console charts them too), and
/// the kernels' latency quantiles.
pub fn tick_values(sample: &Sample) -> Vec<(String, f64)> {
    let view = View::of_sample(sample);
    let mut out = Vec::with_capacity(256);
    for def in ALL {
        if def.rules.is_empty() {
            continue;
        }
        // Once per family; each of its names then picks its series (as the rules do, but with
        // jobs not admitted for alerting kept).
        let points = def.points(&view);
        for rule in def.rules {
            let metric = RuleMetric { def, rule };
            for p in points.iter().filter(|p| metric.selects(p)) {
                out.push((
                    ringside_shared::history::history_key(rule.name, &p.source.to_string()),
                    p.value * rule.scale,
                ));
            }
        }
    }
    for k in &sample.readings.kernels {
        let source = crate::metrics::Source::Kernel(k.id.clone()).to_string();
        for (name, v) in [(KERNEL_P50, k.latency_p50_ns), (KERNEL_P99, k.latency_p99_ns)] {
            if let Some(v) = v {
                out.push((ringside_shared::history::history_key(name, &source), v as f64));
            }
        }
    }
    out
}

/// Why a history request cannot be answered.
#[derive(Debug, PartialEq)]
pub struct BadQuery(pub String);

/// A history request, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub series: Vec<String>,
    pub from_ms: u64,
    pub to_ms: u64,
    pub points: usize,
}

impl Query {
    /// The request's parameters (`series` comma-separated; `from`, `to` in Unix ms, default the
    /// last 15 minutes to now; `points`, default 600), checked against the bounds.
    pub fn parse(
        series: Option<&str>,
        from: Option<u64>,
        to: Option<u64>,
        points: Option<usize>,
        now_ms: u64,
    ) -> Result<Query, BadQuery> {
        let series: Vec<String> =
            series.unwrap_or_default().split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        if series.is_empty() {
            return Err(BadQuery("name at least one series: series=<metric>@<source>[,...]".into()));
        }
        if series.len() > HISTORY_MAX_SERIES {
            return Err(BadQuery(format!(
                "{} series asked for, at most {HISTORY_MAX_SERIES} per request",
                series.len()
            )));
        }
        if let Some(long) = series.iter().find(|s| s.len() > disk::MAX_KEY) {
            return Err(BadQuery(format!("series name of {} bytes, at most {}", long.len(), disk::MAX_KEY)));
        }
        let (from_ms, to_ms) = Query::range(from, to, now_ms)?;
        let points = points.unwrap_or(ringside_shared::history::HISTORY_DEFAULT_POINTS);
        if points == 0 || points > HISTORY_MAX_POINTS {
            return Err(BadQuery(format!("points must be 1-{HISTORY_MAX_POINTS}, got {points}")));
        }
        Ok(Query { series, from_ms, to_ms, points })
    }

    /// `from`, `to` (default: the last 15 minutes to now), checked.
    fn range(from: Option<u64>, to: Option<u64>, now_ms: u64) -> Result<(u64, u64), BadQuery> {
        let to_ms = to.unwrap_or(now_ms);
        let from_ms = from.unwrap_or(to_ms.saturating_sub(15 * 60 * 1000));
        if from_ms >= to_ms {
            return Err(BadQuery(format!("from ({from_ms}) must be before to ({to_ms})")));
        }
        if to_ms - from_ms > HISTORY_MAX_RANGE_MS {
            return Err(BadQuery(format!("a range of at most {} days", HISTORY_MAX_RANGE_MS / 86_400_000)));
        }
        Ok((from_ms, to_ms))
    }

    /// An export of `[from, to)`: the series named (every one held where none is), one bucket
    /// a second up to [`HISTORY_EXPORT_POINTS`].
    pub fn export(
        series: Option<&str>,
        from: Option<u64>,
        to: Option<u64>,
        now_ms: u64,
        held: Vec<String>,
    ) -> Result<Query, BadQuery> {
        let (from_ms, to_ms) = Query::range(from, to, now_ms)?;
        let named: Vec<String> =
            series.unwrap_or_default().split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        let series = if named.is_empty() { held } else { named };
        if series.len() > 100_000 || series.iter().any(|s| s.len() > disk::MAX_KEY) {
            return Err(BadQuery("too many series, or a name too long".into()));
        }
        let points = ((to_ms - from_ms).div_ceil(1000) as usize).clamp(1, HISTORY_EXPORT_POINTS);
        Ok(Query { series, from_ms, to_ms, points })
    }
}

/// The history of one node: the store, its files and the writer thread.
pub struct History {
    store: Mutex<Inner>,
    dir: PathBuf,
    flush_every_ms: u64,
    pub disk: Arc<DiskStats>,
}

struct Inner {
    store: Store,
    writer: Writer,
    last_flush_ms: u64,
    /// Blocks the writer's queue could not take, tried again at the next flush.
    unsent: Vec<Block>,
}

impl History {
    /// Opens the history under `dir`: reads back every file (setting aside those it cannot),
    /// and starts the writer. The lines say what was set aside; an error only where the
    /// directory itself cannot be used.
    pub fn open(config: &HistoryConfig, dir: &Path, now_ms: u64) -> std::io::Result<(History, Vec<String>)> {
        let loaded = disk::load(dir, now_ms)?;
        let limits = Limits { max_series: config.max_series, max_memory_bytes: config.max_memory_bytes as usize };
        let mut store = Store::new(limits);
        let mut head = None;
        for file in loaded.files {
            match file {
                Contents::Block(block) => {
                    for (key, chunk) in block.chunks {
                        store.restore_closed(&key, block.tier, chunk);
                    }
                }
                Contents::Head { block, chunks } => head = Some((block, chunks)),
            }
        }
        let closed = match head {
            Some((block, chunks)) => store.restore_head(block, chunks, now_ms),
            None => Vec::new(),
        };
        store.expire(now_ms);
        store.measure();
        let disk = Arc::new(DiskStats::default());
        let writer = Writer::start(dir.to_path_buf(), config.max_disk_bytes, disk.clone())?;
        let mut inner = Inner { store, writer, last_flush_ms: now_ms, unsent: closed };
        inner.send_blocks();
        let _ = inner.writer.send(Write::Trim { now_ms });
        let history = History {
            store: Mutex::new(inner),
            dir: dir.to_path_buf(),
            flush_every_ms: config.flush_interval_s * 1000,
            disk,
        };
        Ok((history, loaded.set_aside))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps one tick's values; writes closed blocks, and the head every flush interval.
    /// Returns [`History::stats`] after it.
    pub fn record(&self, sample: &Sample) -> (usize, usize, store::Dropped) {
        let values = tick_values(sample);
        self.record_values(sample.taken_at_ms, values.iter().map(|(k, v)| (k.as_str(), *v)))
    }

    /// [`History::record`] of values already named.
    pub fn record_values<'a>(
        &self,
        t: u64,
        values: impl IntoIterator<Item = (&'a str, f64)>,
    ) -> (usize, usize, store::Dropped) {
        let mut inner = self.inner();
        let closed = inner.store.record(t, values);
        let changed_block = !closed.is_empty();
        inner.unsent.extend(closed);
        if changed_block {
            inner.send_blocks();
            let _ = inner.writer.send(Write::Trim { now_ms: t });
        }
        if changed_block || t.saturating_sub(inner.last_flush_ms) >= self.flush_every_ms {
            inner.last_flush_ms = t;
            inner.flush_head();
        }
        inner.stats()
    }

    /// Writes everything held (at a clean stop) and waits for the writer.
    pub fn close(&self) {
        let mut inner = self.inner();
        inner.store.settle_all();
        for block in std::mem::take(&mut inner.unsent) {
            inner.writer.send_waiting(Write::Block(block));
        }
        if let Some(block) = inner.store.fine_block() {
            let chunks = inner.store.open_chunks();
            inner.writer.send_waiting(Write::Head { block, chunks });
        }
        inner.writer.stop();
    }

    pub fn query(&self, q: &Query) -> HistoryResponse {
        let inner = self.inner();
        let series: Vec<_> = q.series.iter().map(|key| inner.store.query(key, q.from_ms, q.to_ms, q.points)).collect();
        let step_ms = (q.to_ms - q.from_ms).div_ceil(q.points as u64).max(1);
        HistoryResponse { from_ms: q.from_ms, to_ms: q.to_ms, step_ms, points: q.points, series }
    }

    pub fn catalog(&self) -> HistoryCatalog {
        let inner = self.inner();
        let (fine_from_ms, coarse_from_ms) = inner.store.tiers_from_ms();
        let series = inner
            .store
            .catalog()
            .into_iter()
            .map(|(key, first_ms, last_ms)| HistorySeriesInfo { key, first_ms, last_ms })
            .collect();
        HistoryCatalog { series, fine_from_ms, coarse_from_ms }
    }

    /// `(series, memory bytes, dropped)` as of now.
    pub fn stats(&self) -> (usize, usize, store::Dropped) {
        self.inner().stats()
    }

    pub fn disk_bytes(&self) -> u64 {
        self.disk.bytes.load(Ordering::Relaxed)
    }

    /// The writer's `(failed writes, files trimmed to the size bound)` so far.
    pub fn disk_counts(&self) -> (u64, u64) {
        (self.disk.write_errors.load(Ordering::Relaxed), self.disk.trimmed.load(Ordering::Relaxed))
    }

    /// Why the last write failed, while writes fail.
    pub fn disk_failure(&self) -> Option<String> {
        self.disk.failing.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Inner {
    fn stats(&self) -> (usize, usize, store::Dropped) {
        (self.store.series_count(), self.store.memory(), self.store.dropped)
    }

    fn send_blocks(&mut self) {
        let mut left = Vec::new();
        for block in std::mem::take(&mut self.unsent) {
            if let Err(Write::Block(block)) = self.writer.send(Write::Block(block)) {
                left.push(block);
            }
        }
        if !left.is_empty() {
            tracing::warn!("history writer is behind: {} closed blocks wait in memory", left.len());
        }
        self.unsent = left;
    }

    fn flush_head(&mut self) {
        let Some(block) = self.store.fine_block() else { return };
        self.store.measure();
        let chunks = self.store.open_chunks();
        // A full queue: the next flush writes a newer head anyway.
        let _ = self.writer.send(Write::Head { block, chunks });
    }
}

#[cfg(test)]
mod tests;
