//! Telemetry a ring kernel writes itself, on its own thread, as it completes messages:
//! counters, latency extremes, and a log-linear latency histogram. Readers (the daemon) take
//! relaxed loads: each figure is exact, the set is not one atomic snapshot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Sub-buckets per power of two: values are kept to within 1/16 (6.25 %) of themselves, and
/// exactly below 16 ns — sub-microsecond resolution where latencies are small.
pub(crate) const SUB_BITS: u32 = 4;
pub(crate) const SUB: usize = 1 << SUB_BITS;
/// Powers of two covered: up to 2^40 ns (about 18 minutes); larger values land in the last bucket.
const POWERS: usize = 41;
pub const BUCKETS: usize = POWERS * SUB;

/// Bucket of a value: exact below `SUB`, then `SUB` linear sub-buckets per power of two.
pub fn bucket_of(value: u64) -> usize {
    if value < SUB as u64 {
        return value as usize;
    }
    let power = 63 - value.leading_zeros(); // >= SUB_BITS
    let sub = (value >> (power - SUB_BITS)) as usize & (SUB - 1);
    let index = (power - SUB_BITS + 1) as usize * SUB + sub;
    index.min(BUCKETS - 1)
}

/// The smallest value that falls in `bucket`.
pub fn bucket_floor(bucket: usize) -> u64 {
    if bucket < SUB {
        return bucket as u64;
    }
    let power = (bucket / SUB) as u32 + SUB_BITS - 1;
    let sub = (bucket % SUB) as u64;
    (1u64 << power) | (sub << (power - SUB_BITS))
}

/// A concurrent log-linear histogram of nanosecond values.
pub struct LatencyHistogram {
    counts: Box<[AtomicU64]>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram { counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect() }
    }
}

impl LatencyHistogram {
    pub fn record(&self, value_ns: u64) {
        self.counts[bucket_of(value_ns)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn counts(&self) -> Vec<u64> {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }

    /// Quantiles (0-1) of what has been recorded; each is the midpoint of its bucket, so within
    /// 1/32 of the true value. `None` when nothing was recorded.
    pub fn quantiles(&self, qs: &[f64]) -> Vec<Option<u64>> {
        quantiles_of(&self.counts(), qs)
    }
}

/// Quantiles of bucket counts (see [`LatencyHistogram::quantiles`]).
pub fn quantiles_of(counts: &[u64], qs: &[f64]) -> Vec<Option<u64>> {
    let total: u64 = counts.iter().sum();
    qs.iter()
        .map(|q| {
            if total == 0 {
                return None;
            }
            let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
            let mut seen = 0;
            for (bucket, count) in counts.iter().enumerate() {
                seen += count;
                if seen >= rank {
                    let low = bucket_floor(bucket);
                    let high = if bucket + 1 < BUCKETS { bucket_floor(bucket + 1) } else { low };
                    return Some(low + (high.saturating_sub(low)) / 2);
                }
            }
            None
        })
        .collect()
}

/// p50, p90, p99 and p99.9 from bucket counts, each kept within the exact extremes (a quantile
/// is its bucket's midpoint, which can lie beyond them).
pub fn latency_quantiles(counts: &[u64], min: Option<u64>, max: u64) -> [Option<u64>; 4] {
    let low = min.unwrap_or(0);
    let q = quantiles_of(counts, &[0.5, 0.9, 0.99, 0.999]);
    [0, 1, 2, 3].map(|i| q[i].map(|v| v.clamp(low, max.max(low))))
}

/// `dropped / (processed + dropped)`, 0 before any message.
pub fn drop_rate(processed: u64, dropped: u64) -> f64 {
    if processed + dropped == 0 {
        0.0
    } else {
        dropped as f64 / (processed + dropped) as f64
    }
}

/// Counters of one kernel.
pub struct KernelTelemetry {
    pub processed: AtomicU64,
    pub dropped: AtomicU64,
    pub failed: AtomicU64,
    pub total_latency_ns: AtomicU64,
    /// `u64::MAX` until the first message; reported as `None`, never as the sentinel.
    min_latency_ns: AtomicU64,
    pub max_latency_ns: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub histogram: LatencyHistogram,
    last_error: Mutex<Option<String>>,
}

impl Default for KernelTelemetry {
    fn default() -> Self {
        KernelTelemetry {
            processed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            total_latency_ns: AtomicU64::new(0),
            min_latency_ns: AtomicU64::new(u64::MAX),
            max_latency_ns: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            histogram: LatencyHistogram::default(),
            last_error: Mutex::new(None),
        }
    }
}

impl KernelTelemetry {
    /// One message completed `latency_ns` after it was enqueued.
    pub fn completed(&self, latency_ns: u64, bytes_in: usize, bytes_out: usize) {
        self.processed.fetch_add(1, Ordering::Relaxed);
        self.total_latency_ns.fetch_add(latency_ns, Ordering::Relaxed);
        self.min_latency_ns.fetch_min(latency_ns, Ordering::Relaxed);
        self.max_latency_ns.fetch_max(latency_ns, Ordering::Relaxed);
        self.bytes_in.fetch_add(bytes_in as u64, Ordering::Relaxed);
        self.bytes_out.fetch_add(bytes_out as u64, Ordering::Relaxed);
        self.histogram.record(latency_ns);
    }

    pub fn min_latency_ns(&self) -> Option<u64> {
        Some(self.min_latency_ns.load(Ordering::Relaxed)).filter(|v| *v != u64::MAX)
    }

    pub fn set_error(&self, error: impl Into<String>) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error.into());
    }

    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `dropped / (processed + dropped)`, 0 before any message.
    pub fn drop_rate(&self) -> f64 {
        drop_rate(self.processed.load(Ordering::Relaxed), self.dropped.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut previous = 0;
        for value in (0..100_000u64).chain((1..40).map(|p| 1u64 << p)).chain([u64::MAX / 2]) {
            let bucket = bucket_of(value);
            assert!(bucket >= previous || value < 100_000, "bucket order at {value}");
            if value < 100_000 {
                previous = bucket;
            }
            let floor = bucket_floor(bucket);
            assert!(floor <= value, "floor {floor} above {value}");
            if bucket + 1 < BUCKETS {
                assert!(bucket_floor(bucket + 1) > value, "value {value} beyond its bucket");
                let width = bucket_floor(bucket + 1) - floor;
                assert!(width as f64 <= (floor.max(1) as f64) / 16.0 + 1.0, "bucket at {floor} is {width} wide");
            }
        }
        for exact in 0..16 {
            assert_eq!(bucket_floor(bucket_of(exact)), exact);
        }
    }

    #[test]
    fn quantiles_from_a_known_distribution() {
        let h = LatencyHistogram::default();
        assert_eq!(h.quantiles(&[0.5]), vec![None]);
        // 1..=10_000 ns uniformly: p50 ~ 5000, p99 ~ 9900, p99.9 ~ 9990.
        for v in 1..=10_000u64 {
            h.record(v);
        }
        let q = h.quantiles(&[0.5, 0.9, 0.99, 0.999]);
        for (got, want) in q.iter().zip([5000.0, 9000.0, 9900.0, 9990.0]) {
            let got = got.unwrap() as f64;
            assert!((got - want).abs() / want < 1.0 / 16.0, "{got} vs {want}");
        }
    }

    #[test]
    fn min_is_never_a_sentinel() {
        let t = KernelTelemetry::default();
        assert_eq!(t.min_latency_ns(), None);
        assert_eq!(t.drop_rate(), 0.0);
        t.completed(500, 8, 8);
        t.completed(300, 8, 8);
        t.dropped.fetch_add(2, Ordering::Relaxed);
        assert_eq!(t.min_latency_ns(), Some(300));
        assert_eq!(t.max_latency_ns.load(Ordering::Relaxed), 500);
        assert_eq!(t.drop_rate(), 0.5);
    }
}
