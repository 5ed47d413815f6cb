//! The compressed chunk: a Gorilla-style stream (Pelkonen et al., VLDB 2015) of timestamps as
//! delta-of-deltas and values as the XOR with the previous one, with `N` values per timestamp
//! (1 for the fine tier, 4 for the coarse tier's min/max/mean/count).
//!
//! Timestamps are whole units of the tier (seconds, minutes), so a series sampled every tick
//! costs one bit per timestamp. Values are rounded to [`MANTISSA_BITS`] bits of mantissa
//! (three significant digits: within 0.05% of the value) before they are XORed: the noise below
//! what any chart can show would otherwise cost 30-40 bits a value.

/// Mantissa bits kept of each value (of f64's 52).
pub const MANTISSA_BITS: u32 = 10;

/// A value rounded to [`MANTISSA_BITS`] of mantissa (to nearest; a carry moves the exponent,
/// as it should).
pub fn round_value(v: f64) -> f64 {
    let drop = 52 - MANTISSA_BITS;
    let bits = v.to_bits();
    let rounded = bits.wrapping_add(1 << (drop - 1)) & !((1u64 << drop) - 1);
    let r = f64::from_bits(rounded);
    if r.is_finite() {
        r
    } else {
        v
    }
}

/// Bits appended to a byte vector, most significant first.
#[derive(Debug, Clone, Default)]
pub struct BitWriter {
    bytes: Vec<u8>,
    /// Bits used in the last byte (0 = the last byte is full, or there is none).
    used: u32,
}

impl BitWriter {
    /// The low `n` bits of `value` (n <= 64).
    pub fn write(&mut self, value: u64, n: u32) {
        let mut left = n;
        while left > 0 {
            if self.used == 0 {
                self.bytes.push(0);
                self.used = 0;
            }
            let free = 8 - self.used;
            let take = free.min(left);
            let chunk = ((value >> (left - take)) & ((1u64 << take) - 1)) as u8;
            let last = self.bytes.len() - 1;
            self.bytes[last] |= chunk << (free - take);
            self.used = (self.used + take) % 8;
            left -= take;
        }
    }

    pub fn bit(&mut self, b: bool) {
        self.write(b as u64, 1);
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn capacity(&self) -> usize {
        self.bytes.capacity()
    }
}

/// Reads what a [`BitWriter`] wrote; `None` past the end.
pub struct BitReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> BitReader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        BitReader { bytes, pos: 0 }
    }

    pub fn read(&mut self, n: u32) -> Option<u64> {
        if n == 0 {
            return Some(0);
        }
        if self.pos + n as usize > self.bytes.len() * 8 {
            return None;
        }
        let mut value = 0u64;
        let mut left = n;
        while left > 0 {
            let byte = self.bytes[self.pos / 8];
            let offset = (self.pos % 8) as u32;
            let avail = 8 - offset;
            let take = avail.min(left);
            let chunk = (byte >> (avail - take)) & ((1u16 << take) - 1) as u8;
            value = (value << take) | chunk as u64;
            self.pos += take as usize;
            left -= take;
        }
        Some(value)
    }

    pub fn bit(&mut self) -> Option<bool> {
        self.read(1).map(|b| b == 1)
    }
}

/// The XOR state of one value column.
#[derive(Debug, Clone, Copy, Default)]
struct Column {
    prev: u64,
    leading: u32,
    trailing: u32,
}

impl Column {
    fn encode(&mut self, w: &mut BitWriter, value: f64, first: bool) {
        let bits = value.to_bits();
        if first {
            w.write(bits, 64);
            self.prev = bits;
            self.leading = u32::MAX;
            return;
        }
        let xor = bits ^ self.prev;
        self.prev = bits;
        if xor == 0 {
            w.bit(false);
            return;
        }
        w.bit(true);
        let leading = xor.leading_zeros().min(63);
        let trailing = xor.trailing_zeros();
        if self.leading != u32::MAX && leading >= self.leading && trailing >= self.trailing {
            w.bit(false);
            let len = 64 - self.leading - self.trailing;
            w.write(xor >> self.trailing, len);
        } else {
            w.bit(true);
            let len = 64 - leading - trailing;
            w.write(leading as u64, 6);
            // 1..=64, written as len - 1 in 6 bits.
            w.write((len - 1) as u64, 6);
            w.write(xor >> trailing, len);
            self.leading = leading;
            self.trailing = trailing;
        }
    }

    fn decode(&mut self, r: &mut BitReader, first: bool) -> Option<f64> {
        if first {
            self.prev = r.read(64)?;
            self.leading = u32::MAX;
            return Some(f64::from_bits(self.prev));
        }
        if !r.bit()? {
            return Some(f64::from_bits(self.prev));
        }
        if r.bit()? {
            let leading = r.read(6)? as u32;
            let len = r.read(6)? as u32 + 1;
            if leading + len > 64 {
                return None;
            }
            self.leading = leading;
            self.trailing = 64 - leading - len;
        } else if self.leading == u32::MAX {
            return None;
        }
        let len = 64 - self.leading - self.trailing;
        let xor = r.read(len)? << self.trailing;
        self.prev ^= xor;
        Some(f64::from_bits(self.prev))
    }
}

/// Timestamp state: the previous timestamp and delta.
#[derive(Debug, Clone, Copy, Default)]
struct Clock {
    prev: u64,
    delta: i64,
}

impl Clock {
    fn encode(&mut self, w: &mut BitWriter, t: u64, first: bool) {
        if first {
            w.write(t, 64);
            self.prev = t;
            self.delta = 0;
            return;
        }
        let delta = t as i64 - self.prev as i64;
        let dod = delta - self.delta;
        self.prev = t;
        self.delta = delta;
        // Gorilla's buckets: 0 | 10+7 | 110+9 | 1110+12 | 1111+32 (a gap as long as a block).
        let fits = |bits: u32| dod >= -(1 << (bits - 1)) && dod < (1 << (bits - 1));
        let low = |bits: u32| (dod as u64) & ((1u64 << bits) - 1);
        if dod == 0 {
            w.bit(false);
        } else if fits(7) {
            w.write(0b10, 2);
            w.write(low(7), 7);
        } else if fits(9) {
            w.write(0b110, 3);
            w.write(low(9), 9);
        } else if fits(12) {
            w.write(0b1110, 4);
            w.write(low(12), 12);
        } else {
            w.write(0b1111, 4);
            w.write(low(32), 32);
        }
    }

    fn decode(&mut self, r: &mut BitReader, first: bool) -> Option<u64> {
        if first {
            self.prev = r.read(64)?;
            self.delta = 0;
            return Some(self.prev);
        }
        let dod = if !r.bit()? {
            0
        } else {
            let width = if !r.bit()? {
                7
            } else if !r.bit()? {
                9
            } else if !r.bit()? {
                12
            } else {
                32
            };
            // Two's complement in `width` bits, sign-extended.
            ((r.read(width)? << (64 - width)) as i64) >> (64 - width)
        };
        self.delta = self.delta.checked_add(dod)?;
        // Timestamps only go forward within a chunk.
        if self.delta <= 0 {
            return None;
        }
        self.prev = self.prev.checked_add(self.delta as u64)?;
        Some(self.prev)
    }
}

/// A chunk being written: the points of one series in one block of its tier.
#[derive(Debug, Clone)]
pub struct Encoder<const N: usize> {
    w: BitWriter,
    clock: Clock,
    columns: [Column; N],
    pub first: u64,
    pub last: u64,
    pub count: u32,
}

impl<const N: usize> Encoder<N> {
    pub fn new() -> Self {
        Encoder {
            w: BitWriter::default(),
            clock: Clock::default(),
            columns: [Column::default(); N],
            first: 0,
            last: 0,
            count: 0,
        }
    }

    /// Appends a point; `t` must be after the last one (the caller checks).
    pub fn push(&mut self, t: u64, values: [f64; N]) {
        let first = self.count == 0;
        if first {
            self.first = t;
        }
        self.clock.encode(&mut self.w, t, first);
        for (column, v) in self.columns.iter_mut().zip(values) {
            column.encode(&mut self.w, round_value(v), first);
        }
        self.last = t;
        self.count += 1;
    }

    pub fn bytes(&self) -> &[u8] {
        self.w.bytes()
    }

    /// Bytes of memory it holds.
    pub fn memory(&self) -> usize {
        self.w.capacity() + std::mem::size_of::<Self>()
    }
}

impl<const N: usize> Default for Encoder<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// Decodes `count` points of a chunk, calling `each(t, values)`; false where the bytes end
/// early or make no sense (a corrupt chunk).
pub fn decode<const N: usize>(bytes: &[u8], count: u32, mut each: impl FnMut(u64, [f64; N])) -> bool {
    let mut r = BitReader::new(bytes);
    let mut clock = Clock::default();
    let mut columns = [Column::default(); N];
    for i in 0..count {
        let first = i == 0;
        let Some(t) = clock.decode(&mut r, first) else { return false };
        let mut values = [0.0; N];
        for (column, v) in columns.iter_mut().zip(values.iter_mut()) {
            match column.decode(&mut r, first) {
                Some(x) => *v = x,
                None => return false,
            }
        }
        each(t, values);
    }
    true
}
