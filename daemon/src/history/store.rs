//! The in-memory store: per series, a fine tier (one value a second, 24 h) and a coarse tier
//! (each minute's min, max, mean and count, 7 days), each a list of compressed chunks.
//!
//! Chunks are aligned to blocks of their tier (10 minutes fine, 6 hours coarse) shared by every
//! series: when a tick starts a new block, every series' open chunk of the old one is closed and
//! the block goes to disk as one file. What is still open is written as the head file every
//! flush interval, so a `kill -9` loses at most that interval.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use ringside_shared::HistorySeries;

use super::codec::{self, Encoder};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    Fine,
    Coarse,
}

impl Tier {
    pub const ALL: [Tier; 2] = [Tier::Fine, Tier::Coarse];

    /// Milliseconds in one unit of its timestamps.
    pub fn unit_ms(self) -> u64 {
        match self {
            Tier::Fine => 1000,
            Tier::Coarse => 60_000,
        }
    }

    /// Units in one block.
    pub fn block_units(self) -> u64 {
        match self {
            Tier::Fine => 600,
            Tier::Coarse => 360,
        }
    }

    pub fn block_ms(self) -> u64 {
        self.unit_ms() * self.block_units()
    }

    /// How long it is kept.
    pub fn keep_ms(self) -> u64 {
        match self {
            Tier::Fine => 24 * 3600 * 1000,
            Tier::Coarse => 7 * 24 * 3600 * 1000,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Tier::Fine => "fine",
            Tier::Coarse => "coarse",
        }
    }

    pub fn code(self) -> u8 {
        match self {
            Tier::Fine => 0,
            Tier::Coarse => 1,
        }
    }

    pub fn from_code(code: u8) -> Option<Tier> {
        match code {
            0 => Some(Tier::Fine),
            1 => Some(Tier::Coarse),
            _ => None,
        }
    }

    pub fn columns(self) -> usize {
        match self {
            Tier::Fine => 1,
            Tier::Coarse => 4,
        }
    }
}

/// A closed chunk: `count` points from unit `first` to unit `last` of its tier.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub first: u64,
    pub last: u64,
    pub count: u32,
    pub bytes: Arc<[u8]>,
}

impl Chunk {
    fn of<const N: usize>(e: &Encoder<N>) -> Chunk {
        Chunk { first: e.first, last: e.last, count: e.count, bytes: e.bytes().into() }
    }

    fn memory(&self) -> usize {
        self.bytes.len() + std::mem::size_of::<Chunk>() + 16
    }
}

/// Every series' chunk of one block of one tier, closed.
#[derive(Debug, Clone)]
pub struct Block {
    pub tier: Tier,
    /// The block's index (its first unit / `block_units`).
    pub index: u64,
    pub chunks: Vec<(Arc<str>, Chunk)>,
}

impl Block {
    pub fn start_ms(&self) -> u64 {
        self.index * self.tier.block_ms()
    }
}

/// Values of one fine slot (a second) seen so far: ticks faster than a second share one.
#[derive(Debug, Clone, Copy)]
struct Slot {
    unit: u64,
    min: f64,
    max: f64,
    sum: f64,
    n: u32,
}

impl Slot {
    fn new(unit: u64, v: f64) -> Slot {
        Slot { unit, min: v, max: v, sum: v, n: 1 }
    }

    fn add(&mut self, v: f64, n: u32) {
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.sum += v * n as f64;
        self.n += n;
    }

    fn mean(&self) -> f64 {
        self.sum / self.n as f64
    }
}

#[derive(Debug, Default)]
struct Series {
    key: Arc<str>,
    fine: VecDeque<Chunk>,
    fine_open: Option<Encoder<1>>,
    coarse: VecDeque<Chunk>,
    coarse_open: Option<Encoder<4>>,
    /// The current second, not yet in `fine_open`.
    pending: Option<Slot>,
    /// The current minute's fine values (`n` counts them), not yet in `coarse_open`.
    minute: Option<Slot>,
}

impl Series {
    fn new(key: Arc<str>) -> Self {
        Series { key, ..Series::default() }
    }

    fn last_fine(&self) -> Option<u64> {
        self.pending.map(|p| p.unit).or(self.fine_open.as_ref().map(|e| e.last)).or(self.fine.back().map(|c| c.last))
    }

    /// Moves the pending second into the fine chunk and the minute.
    fn settle(&mut self, coarse_block: u64) {
        let Some(slot) = self.pending.take() else { return };
        let v = slot.mean();
        self.fine_open.get_or_insert_with(Encoder::new).push(slot.unit, [v]);
        let minute = slot.unit / 60;
        if self.minute.is_some_and(|m| m.unit != minute) {
            self.settle_minute(coarse_block);
        }
        match &mut self.minute {
            Some(m) => m.add(v, 1),
            None => self.minute = Some(Slot::new(minute, v)),
        }
    }

    /// Moves the minute into the coarse chunk, unless it belongs to a block already closed.
    fn settle_minute(&mut self, coarse_block: u64) {
        let Some(m) = self.minute.take() else { return };
        if m.unit / Tier::Coarse.block_units() < coarse_block {
            return;
        }
        let open = self.coarse_open.get_or_insert_with(Encoder::new);
        if open.count > 0 && m.unit <= open.last {
            return;
        }
        open.push(m.unit, [m.min, m.max, m.mean(), m.n as f64]);
    }

    fn is_empty(&self) -> bool {
        self.fine.is_empty()
            && self.coarse.is_empty()
            && self.fine_open.is_none()
            && self.coarse_open.is_none()
            && self.pending.is_none()
            && self.minute.is_none()
    }

    fn memory(&self) -> usize {
        let chunks: usize = self.fine.iter().chain(&self.coarse).map(Chunk::memory).sum();
        let open =
            self.fine_open.as_ref().map_or(0, Encoder::memory) + self.coarse_open.as_ref().map_or(0, Encoder::memory);
        chunks + open + std::mem::size_of::<Series>() + self.key.len() + 64
    }

    /// Fine points within `[from, to)` (units), then coarse points before `split_ms`... as
    /// `(t_ms, min, max, mean, weight)`.
    fn fine_points(&self, from: u64, to: u64, mut each: impl FnMut(u64, f64, f64, f64, f64)) {
        let mut one = |t: u64, v: [f64; 1]| {
            if t >= from && t < to {
                each(t * 1000, v[0], v[0], v[0], 1.0)
            }
        };
        for c in self.fine.iter().filter(|c| c.last >= from && c.first < to) {
            codec::decode(&c.bytes, c.count, &mut one);
        }
        if let Some(e) = self.fine_open.as_ref().filter(|e| e.count > 0 && e.last >= from && e.first < to) {
            codec::decode(e.bytes(), e.count, &mut one);
        }
        if let Some(p) = self.pending {
            let v = p.mean();
            one(p.unit, [v]);
        }
    }

    fn coarse_points(&self, from: u64, to: u64, mut each: impl FnMut(u64, f64, f64, f64, f64)) {
        let mut four = |t: u64, v: [f64; 4]| {
            if t >= from && t < to {
                each(t * 60_000, v[0], v[1], v[2], v[3].max(1.0))
            }
        };
        for c in self.coarse.iter().filter(|c| c.last >= from && c.first < to) {
            codec::decode(&c.bytes, c.count, &mut four);
        }
        if let Some(e) = self.coarse_open.as_ref().filter(|e| e.count > 0 && e.last >= from && e.first < to) {
            codec::decode(e.bytes(), e.count, &mut four);
        }
    }

    /// The first time the fine tier holds (ms).
    fn fine_from_ms(&self) -> Option<u64> {
        let first =
            self.fine.front().map(|c| c.first).or(self.fine_open.as_ref().filter(|e| e.count > 0).map(|e| e.first));
        first.or(self.pending.map(|p| p.unit)).map(|u| u * 1000)
    }

    /// Where the coarse tier ends (ms): the end of its last minute.
    fn coarse_to_ms(&self) -> Option<u64> {
        let last =
            self.coarse_open.as_ref().filter(|e| e.count > 0).map(|e| e.last).or(self.coarse.back().map(|c| c.last));
        last.map(|u| (u + 1) * 60_000)
    }

    fn coarse_from_ms(&self) -> Option<u64> {
        let first =
            self.coarse.front().map(|c| c.first).or(self.coarse_open.as_ref().filter(|e| e.count > 0).map(|e| e.first));
        first.map(|u| u * 60_000)
    }
}

/// Limits of the store.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Series kept at most; values of further ones are not kept (and counted).
    pub max_series: usize,
    /// Memory the chunks may take; past it the oldest fine chunks go first.
    pub max_memory_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_series: 4096, max_memory_bytes: 64 << 20 }
    }
}

/// Counters of what the store did not keep.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Dropped {
    /// Values of series past `max_series`.
    pub series: u64,
    /// Values older than what the series already holds (the clock went back).
    pub late: u64,
    /// Values not finite.
    pub invalid: u64,
    /// Fine chunks dropped before their 24 h to stay within memory.
    pub evicted_chunks: u64,
}

pub struct Store {
    limits: Limits,
    series: Vec<Series>,
    index: HashMap<Arc<str>, usize>,
    /// The fine block the open chunks belong to, once a value came.
    fine_block: Option<u64>,
    pub dropped: Dropped,
    memory: usize,
}

/// Per-bucket aggregates of a query.
struct Buckets {
    from_ms: u64,
    step_ms: u64,
    min: Vec<f64>,
    max: Vec<f64>,
    sum: Vec<f64>,
    weight: Vec<f64>,
}

impl Buckets {
    fn new(from_ms: u64, step_ms: u64, points: usize) -> Self {
        Buckets {
            from_ms,
            step_ms,
            min: vec![f64::INFINITY; points],
            max: vec![f64::NEG_INFINITY; points],
            sum: vec![0.0; points],
            weight: vec![0.0; points],
        }
    }

    fn add(&mut self, t_ms: u64, min: f64, max: f64, mean: f64, weight: f64) {
        let Some(i) = t_ms.checked_sub(self.from_ms).map(|d| (d / self.step_ms) as usize) else { return };
        if i >= self.weight.len() {
            return;
        }
        self.min[i] = self.min[i].min(min);
        self.max[i] = self.max[i].max(max);
        self.sum[i] += mean * weight;
        self.weight[i] += weight;
    }

    fn into_series(self, key: String, resolution_ms: u64, known: bool) -> HistorySeries {
        let n = self.weight.len();
        let (mut min, mut max, mut mean) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n {
            let has = self.weight[i] > 0.0;
            min.push(has.then_some(self.min[i]));
            max.push(has.then_some(self.max[i]));
            mean.push(has.then(|| self.sum[i] / self.weight[i]));
        }
        HistorySeries { key, resolution_ms, known, min, max, mean }
    }
}

impl Store {
    pub fn new(limits: Limits) -> Self {
        Store {
            limits,
            series: Vec::new(),
            index: HashMap::new(),
            fine_block: None,
            dropped: Dropped::default(),
            memory: 0,
        }
    }

    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// Memory the store holds (as of the last block change or [`Store::measure`]).
    pub fn memory(&self) -> usize {
        self.memory
    }

    pub fn measure(&mut self) -> usize {
        self.memory = self.series.iter().map(Series::memory).sum::<usize>()
            + self.index.capacity() * (std::mem::size_of::<(Arc<str>, usize)>() + 8)
            + self.series.capacity() * std::mem::size_of::<Series>();
        self.memory
    }

    fn series_mut(&mut self, key: &str) -> Option<&mut Series> {
        let at = match self.index.get(key) {
            Some(&at) => at,
            None => {
                if self.series.len() >= self.limits.max_series {
                    return None;
                }
                let key: Arc<str> = key.into();
                self.index.insert(key.clone(), self.series.len());
                self.series.push(Series::new(key));
                self.series.len() - 1
            }
        };
        Some(&mut self.series[at])
    }

    /// One tick's values at `t_ms`. Returns the blocks it closed (for the disk).
    pub fn record<'a>(&mut self, t_ms: u64, values: impl IntoIterator<Item = (&'a str, f64)>) -> Vec<Block> {
        let unit = t_ms / 1000;
        let block = unit / Tier::Fine.block_units();
        let mut closed = Vec::new();
        match self.fine_block {
            Some(current) if block > current => closed = self.close_blocks(block),
            Some(current) if block < current => {
                // The clock went back past a closed block: nothing of it can be placed.
                self.dropped.late += values.into_iter().count() as u64;
                return closed;
            }
            _ => self.fine_block = Some(block),
        }
        let coarse_block = unit / 60 / Tier::Coarse.block_units();
        for (key, v) in values {
            // A name its file could not hold whole (the daemon's own are far shorter).
            if !v.is_finite() || key.len() > super::disk::MAX_KEY {
                self.dropped.invalid += 1;
                continue;
            }
            let Some(series) = self.series_mut(key) else {
                self.dropped.series += 1;
                continue;
            };
            match series.pending {
                Some(ref mut p) if p.unit == unit => p.add(v, 1),
                _ if series.last_fine().is_some_and(|last| unit <= last) => self.dropped.late += 1,
                _ => {
                    series.settle(coarse_block);
                    series.pending = Some(Slot::new(unit, v));
                }
            }
        }
        closed
    }

    /// Closes the fine block the open chunks are in (and the coarse one, where the new block
    /// starts another) as the first value of fine block `next` arrives.
    fn close_blocks(&mut self, next: u64) -> Vec<Block> {
        let Some(current) = self.fine_block.replace(next) else { return Vec::new() };
        let next_coarse = next * Tier::Fine.block_ms() / Tier::Coarse.block_ms();
        let current_coarse = current * Tier::Fine.block_ms() / Tier::Coarse.block_ms();
        let mut fine = Block { tier: Tier::Fine, index: current, chunks: Vec::new() };
        let mut coarse = Block { tier: Tier::Coarse, index: current_coarse, chunks: Vec::new() };
        for s in &mut self.series {
            s.settle(current_coarse);
            if let Some(e) = s.fine_open.take().filter(|e| e.count > 0) {
                let chunk = Chunk::of(&e);
                fine.chunks.push((s.key.clone(), chunk.clone()));
                s.fine.push_back(chunk);
            }
            // Minutes end at every fine block's end.
            s.settle_minute(current_coarse);
            if next_coarse > current_coarse {
                if let Some(e) = s.coarse_open.take().filter(|e| e.count > 0) {
                    let chunk = Chunk::of(&e);
                    coarse.chunks.push((s.key.clone(), chunk.clone()));
                    s.coarse.push_back(chunk);
                }
            }
        }
        let mut blocks = vec![fine];
        if next_coarse > current_coarse {
            blocks.push(coarse);
        }
        self.expire(next * Tier::Fine.block_ms());
        blocks.retain(|b| !b.chunks.is_empty());
        blocks
    }

    /// Drops what is older than each tier keeps, series left with nothing, and the oldest fine
    /// chunks while over the memory limit.
    pub fn expire(&mut self, now_ms: u64) {
        for s in &mut self.series {
            for tier in Tier::ALL {
                let (chunks, unit) = match tier {
                    Tier::Fine => (&mut s.fine, 1000),
                    Tier::Coarse => (&mut s.coarse, 60_000),
                };
                while chunks.front().is_some_and(|c| (c.last + 1) * unit + tier.keep_ms() <= now_ms) {
                    chunks.pop_front();
                }
            }
        }
        if self.series.iter().any(Series::is_empty) {
            self.series.retain(|s| !s.is_empty());
            self.index = self.series.iter().enumerate().map(|(i, s)| (s.key.clone(), i)).collect();
        }
        while self.measure() > self.limits.max_memory_bytes {
            let oldest = self.series.iter().filter_map(|s| s.fine.front().map(|c| c.first)).min();
            let Some(oldest) = oldest else { break };
            let block = oldest / Tier::Fine.block_units();
            for s in &mut self.series {
                while s.fine.front().is_some_and(|c| c.first / Tier::Fine.block_units() == block) {
                    s.fine.pop_front();
                    self.dropped.evicted_chunks += 1;
                }
            }
        }
    }

    /// Every open chunk (fine and coarse), as they stand: what the head file holds. The
    /// pending second and minute are settled first where a later one cannot come into them.
    pub fn open_chunks(&self) -> Vec<(Arc<str>, Tier, Chunk)> {
        let mut out = Vec::new();
        for s in &self.series {
            if let Some(e) = s.fine_open.as_ref().filter(|e| e.count > 0) {
                out.push((s.key.clone(), Tier::Fine, Chunk::of(e)));
            }
            if let Some(e) = s.coarse_open.as_ref().filter(|e| e.count > 0) {
                out.push((s.key.clone(), Tier::Coarse, Chunk::of(e)));
            }
        }
        out
    }

    /// Settles every pending second and minute (at a clean stop), so that the head holds them.
    pub fn settle_all(&mut self) {
        let Some(block) = self.fine_block else { return };
        let coarse_block = block * Tier::Fine.block_ms() / Tier::Coarse.block_ms();
        for s in &mut self.series {
            s.settle(coarse_block);
            s.settle_minute(coarse_block);
        }
    }

    /// Puts back a closed chunk read from disk; false where the series already holds it (or
    /// cannot be kept).
    pub fn restore_closed(&mut self, key: &str, tier: Tier, chunk: Chunk) -> bool {
        let Some(s) = self.series_mut(key) else {
            self.dropped.series += 1;
            return false;
        };
        let list = match tier {
            Tier::Fine => &mut s.fine,
            Tier::Coarse => &mut s.coarse,
        };
        let at = list.partition_point(|c| c.first < chunk.first);
        if list.get(at).is_some_and(|c| c.first == chunk.first) {
            return false;
        }
        list.insert(at, chunk);
        true
    }

    /// Puts back the head's open chunks, written in fine block `block`: re-encoded as the open
    /// chunks where that block is still current, else closed as they are (returned, for the
    /// disk).
    pub fn restore_head(&mut self, block: u64, chunks: Vec<(Arc<str>, Tier, Chunk)>, now_ms: u64) -> Vec<Block> {
        let now_block = now_ms / Tier::Fine.block_ms();
        let coarse_block = block * Tier::Fine.block_ms() / Tier::Coarse.block_ms();
        let coarse_now = now_block * Tier::Fine.block_ms() / Tier::Coarse.block_ms();
        let mut fine = Block { tier: Tier::Fine, index: block, chunks: Vec::new() };
        let mut coarse = Block { tier: Tier::Coarse, index: coarse_block, chunks: Vec::new() };
        for (key, tier, chunk) in chunks {
            let still_open = match tier {
                Tier::Fine => block == now_block,
                Tier::Coarse => coarse_block == coarse_now,
            };
            if !still_open {
                // Not where its block's file already holds it (written as the block closed,
                // before the head was written again).
                if self.restore_closed(&key, tier, chunk.clone()) {
                    let target = if tier == Tier::Fine { &mut fine } else { &mut coarse };
                    target.chunks.push((key, chunk));
                }
                continue;
            }
            let Some(s) = self.series_mut(&key) else {
                self.dropped.series += 1;
                continue;
            };
            match tier {
                Tier::Fine => {
                    let mut e = Encoder::<1>::new();
                    codec::decode::<1>(&chunk.bytes, chunk.count, |t, v| e.push(t, v));
                    s.fine_open = (e.count > 0).then_some(e);
                }
                Tier::Coarse => {
                    let mut e = Encoder::<4>::new();
                    codec::decode::<4>(&chunk.bytes, chunk.count, |t, v| e.push(t, v));
                    s.coarse_open = (e.count > 0).then_some(e);
                }
            }
        }
        if block == now_block {
            self.fine_block = Some(block);
        }
        [fine, coarse].into_iter().filter(|b| !b.chunks.is_empty()).collect()
    }

    /// Series `key` over `[from_ms, to_ms)` in `points` buckets. Buckets of a minute or more
    /// come from the coarse tier where it has data, and from the fine tier after it; finer
    /// buckets come from the fine tier where it has data, and from the coarse tier before it.
    pub fn query(&self, key: &str, from_ms: u64, to_ms: u64, points: usize) -> HistorySeries {
        let points = points.max(1);
        let step_ms = (to_ms.saturating_sub(from_ms)).div_ceil(points as u64).max(1);
        let mut buckets = Buckets::new(from_ms, step_ms, points);
        let Some(s) = self.index.get(key).map(|&i| &self.series[i]) else {
            return buckets.into_series(key.to_string(), 1000, false);
        };
        let split_ms =
            if step_ms >= 60_000 { s.coarse_to_ms().unwrap_or(0) } else { s.fine_from_ms().unwrap_or(u64::MAX) };
        let split_ms = split_ms.clamp(from_ms, to_ms);
        let mut used_coarse = false;
        if split_ms > from_ms {
            s.coarse_points(from_ms / 60_000, split_ms.div_ceil(60_000), |t, min, max, mean, w| {
                if t < split_ms {
                    used_coarse = true;
                    buckets.add(t, min, max, mean, w);
                }
            });
        }
        s.fine_points(split_ms / 1000, to_ms.div_ceil(1000), |t, min, max, mean, w| {
            if t >= split_ms && t < to_ms {
                buckets.add(t, min, max, mean, w)
            }
        });
        buckets.into_series(key.to_string(), if used_coarse { 60_000 } else { 1000 }, true)
    }

    /// Every series with the time it covers: `(key, first_ms, last_ms)`.
    pub fn catalog(&self) -> Vec<(String, u64, u64)> {
        let mut out: Vec<(String, u64, u64)> = self
            .series
            .iter()
            .filter_map(|s| {
                let first = [s.coarse_from_ms(), s.fine_from_ms()].into_iter().flatten().min()?;
                let last = s.last_fine().map(|u| u * 1000).or(s.coarse_to_ms())?;
                Some((s.key.to_string(), first, last))
            })
            .collect();
        out.sort();
        out
    }

    /// Since when each tier holds data, over all series.
    pub fn tiers_from_ms(&self) -> (Option<u64>, Option<u64>) {
        let fine = self.series.iter().filter_map(Series::fine_from_ms).min();
        let coarse = self.series.iter().filter_map(Series::coarse_from_ms).min();
        (fine, coarse)
    }

    /// The fine block now open.
    pub fn fine_block(&self) -> Option<u64> {
        self.fine_block
    }
}

#[cfg(test)]
mod tests;
