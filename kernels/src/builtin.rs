//! The built-in kernels' CPU implementations. Messages are little-endian.
//!
//! - `echo`: returns its input; the canary that proves the kernel is alive and measures the
//!   round trip.
//! - `stats`: input `f32` samples; keeps a streaming histogram of every sample seen and answers
//!   with `[count: u64][mean, p50, p90, p99, max: f32]`.
//! - `saxpy`: input `[a: f32][x0, y0, x1, y1, ...: f32]`; answers `a * x + y` for each pair, a
//!   throughput kernel.
//!
//! The CUDA backend runs twins of these (`kernels/cuda/*.cu`) that answer byte for byte the same.

use ringside_shared::KernelKind;

use crate::runtime::KernelHandler;
use crate::telemetry::LatencyHistogram;

/// The kernels `build` knows: every one.
pub const KERNELS: [KernelKind; 3] = KernelKind::ALL;

/// A fresh handler for a built-in kernel.
pub fn build(kind: KernelKind) -> Box<dyn KernelHandler> {
    match kind {
        KernelKind::Echo => Box::new(Echo),
        KernelKind::Stats => Box::new(Stats::default()),
        KernelKind::Saxpy => Box::new(Saxpy),
    }
}

impl KernelHandler for Box<dyn KernelHandler> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn process(&mut self, input: &[u8], output: &mut Vec<u8>) -> Result<(), String> {
        (**self).process(input, output)
    }
}

pub struct Echo;

impl KernelHandler for Echo {
    fn name(&self) -> &'static str {
        KernelKind::Echo.as_str()
    }

    fn process(&mut self, input: &[u8], output: &mut Vec<u8>) -> Result<(), String> {
        output.extend_from_slice(input);
        Ok(())
    }
}

/// Why a built-in kernel refused a message; both backends say it in these words.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum MessageError {
    #[error("{0} bytes is not a whole number of f32 values")]
    NotWholeF32(usize),
    #[error("stats takes finite, non-negative samples; got {0}")]
    StatsSample(f32),
    #[error("saxpy needs a, then x, y pairs")]
    SaxpyNoA,
    #[error("saxpy needs x, y pairs after a")]
    SaxpyUnpaired,
}

fn f32s(bytes: &[u8]) -> Result<impl Iterator<Item = f32> + '_, String> {
    if !bytes.len().is_multiple_of(4) {
        return Err(MessageError::NotWholeF32(bytes.len()).to_string());
    }
    Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
}

/// Streaming statistics over non-negative `f32` samples (e.g. latencies in µs), kept in a
/// log-linear histogram of the values scaled by 1000 so fractions survive.
#[derive(Default)]
pub struct Stats {
    histogram: LatencyHistogram,
    count: u64,
    sum: f64,
    max: f32,
}

/// Fixed-point scale of the histogram: 3 decimal places.
pub(crate) const STATS_SCALE: f32 = 1000.0;

impl Stats {
    pub fn summary(&self) -> StatsSummary {
        let q = self.histogram.quantiles(&[0.5, 0.9, 0.99]);
        // A quantile is its bucket's midpoint, which can lie above the largest sample: kept
        // within it (as the CUDA twin does with fminf).
        let at = |i: usize| q[i].map(|v| (v as f32 / STATS_SCALE).min(self.max)).unwrap_or(0.0);
        StatsSummary {
            count: self.count,
            mean: if self.count == 0 { 0.0 } else { (self.sum / self.count as f64) as f32 },
            p50: at(0),
            p90: at(1),
            p99: at(2),
            max: self.max,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatsSummary {
    pub count: u64,
    pub mean: f32,
    pub p50: f32,
    pub p90: f32,
    pub p99: f32,
    pub max: f32,
}

impl StatsSummary {
    pub const BYTES: usize = 8 + 5 * 4;

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.count.to_le_bytes());
        for v in [self.mean, self.p50, self.p90, self.p99, self.max] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    pub fn decode(bytes: &[u8]) -> Option<StatsSummary> {
        if bytes.len() < Self::BYTES {
            return None;
        }
        let f = |i: usize| f32::from_le_bytes(bytes[8 + 4 * i..12 + 4 * i].try_into().unwrap_or([0; 4]));
        Some(StatsSummary {
            count: u64::from_le_bytes(bytes[..8].try_into().ok()?),
            mean: f(0),
            p50: f(1),
            p90: f(2),
            p99: f(3),
            max: f(4),
        })
    }
}

impl KernelHandler for Stats {
    fn name(&self) -> &'static str {
        KernelKind::Stats.as_str()
    }

    fn process(&mut self, input: &[u8], output: &mut Vec<u8>) -> Result<(), String> {
        for sample in f32s(input)? {
            if !sample.is_finite() || sample < 0.0 {
                return Err(MessageError::StatsSample(sample).to_string());
            }
            self.histogram.record((sample * STATS_SCALE) as u64);
            self.count += 1;
            self.sum += f64::from(sample);
            self.max = self.max.max(sample);
        }
        self.summary().encode(output);
        Ok(())
    }
}

pub struct Saxpy;

impl KernelHandler for Saxpy {
    fn name(&self) -> &'static str {
        KernelKind::Saxpy.as_str()
    }

    fn process(&mut self, input: &[u8], output: &mut Vec<u8>) -> Result<(), String> {
        let mut values = f32s(input)?;
        let a = values.next().ok_or_else(|| MessageError::SaxpyNoA.to_string())?;
        if !(input.len() / 4 - 1).is_multiple_of(2) {
            return Err(MessageError::SaxpyUnpaired.to_string());
        }
        while let (Some(x), Some(y)) = (values.next(), values.next()) {
            output.extend_from_slice(&(a * x + y).to_le_bytes());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn echo_returns_its_input() {
        let mut out = Vec::new();
        Echo.process(b"ping 42", &mut out).unwrap();
        assert_eq!(out, b"ping 42");
    }

    #[test]
    fn saxpy_known_answers() {
        let mut out = Vec::new();
        Saxpy.process(&bytes(&[2.0, 1.0, 10.0, -3.0, 0.5, 0.25, 4.0]), &mut out).unwrap();
        assert_eq!(floats(&out), vec![12.0, -5.5, 4.5]);
        assert!(Saxpy.process(&bytes(&[2.0, 1.0]), &mut Vec::new()).is_err(), "an unpaired x");
        assert!(Saxpy.process(&[1, 2, 3], &mut Vec::new()).is_err(), "not whole f32s");
        assert!(Saxpy.process(&[], &mut Vec::new()).is_err(), "no a");
    }

    #[test]
    fn stats_known_answers() {
        let mut stats = Stats::default();
        let mut out = Vec::new();
        // 1.0 .. 100.0 in two messages: mean 50.5, p50 ~ 50, p90 ~ 90, p99 ~ 99, max 100.
        let first: Vec<f32> = (1..=50).map(|v| v as f32).collect();
        let second: Vec<f32> = (51..=100).map(|v| v as f32).collect();
        stats.process(&bytes(&first), &mut out).unwrap();
        out.clear();
        stats.process(&bytes(&second), &mut out).unwrap();
        let s = StatsSummary::decode(&out).unwrap();
        assert_eq!(s.count, 100);
        assert!((s.mean - 50.5).abs() < 1e-4);
        assert_eq!(s.max, 100.0);
        for (got, want) in [(s.p50, 50.0), (s.p90, 90.0), (s.p99, 99.0)] {
            assert!((got - want).abs() / want < 1.0 / 16.0, "{got} vs {want}");
        }
        assert!(stats.process(&bytes(&[f32::NAN]), &mut Vec::new()).is_err());
        assert!(stats.process(&bytes(&[-1.0]), &mut Vec::new()).is_err());
    }

    #[test]
    fn stats_quantiles_never_exceed_the_largest_sample() {
        // 100.0 scaled lies in the lower half of its bucket, whose midpoint is 100.352.
        let mut out = Vec::new();
        Stats::default().process(&bytes(&[100.0; 10]), &mut out).unwrap();
        let s = StatsSummary::decode(&out).unwrap();
        assert_eq!((s.p50, s.p90, s.p99, s.max), (100.0, 100.0, 100.0, 100.0));
    }

    #[test]
    fn every_name_builds() {
        for kind in KERNELS {
            assert_eq!(build(kind).name(), kind.as_str());
        }
    }
}
