//! Floats written with a fixed number of decimals, for the texts people read (the console's
//! figures, the daemon's descriptions of what a GPU idled on).

/// `value` with `digits` decimals, as `format!("{value:.digits$}")` writes it, without core's
/// float formatting (its exact-decimal and big-number code and its tables, about 10 KB of the
/// console's wasm). Rounded half away from zero after scaling, where core rounds the exact
/// binary value half to even: the two differ only on a value within a rounding error of a half
/// in the last digit shown. Beyond 2^53 in the last digit (figures of no meaning on a console)
/// the whole part alone is written. At most 9 decimals; the formatter's width and fill are not
/// applied.
pub fn fixed(value: f64, digits: usize) -> Fixed {
    Fixed { value, digits: digits.min(9) }
}

pub struct Fixed {
    value: f64,
    digits: usize,
}

impl std::fmt::Display for Fixed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Fixed { value, digits } = *self;
        if value.is_nan() {
            return f.write_str("NaN");
        }
        if value.is_infinite() {
            return f.write_str(if value > 0.0 { "inf" } else { "-inf" });
        }
        let unit = 10u64.pow(digits as u32);
        let scaled = (value.abs() * unit as f64).round();
        let sign = if value < 0.0 && scaled > 0.0 { "-" } else { "" };
        if scaled >= 9_007_199_254_740_992.0 {
            return write!(f, "{sign}{}", value.abs().trunc() as u128);
        }
        let scaled = scaled as u64;
        write!(f, "{sign}{}", scaled / unit)?;
        if digits > 0 {
            write!(f, ".{:0digits$}", scaled % unit)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::fixed;

    #[test]
    fn fixed_writes_what_core_writes() {
        for value in
            [0.0, -0.0, 0.04, -0.04, 1.5, 2.5, 99.95, 99.96, 100.0, 1234.5678, -7.25, 3e-7, 4e12, 123456789.987]
        {
            for digits in 0..=3 {
                let ours = fixed(value, digits).to_string();
                let core = format!("{value:.digits$}");
                // Core rounds the exact binary value half to even and keeps the sign of a
                // negative value that rounds to zero; this rounds half away from zero after
                // scaling, and writes zero unsigned.
                let alike = ours == core
                    || ours == core.trim_start_matches('-')
                    || (value * 10f64.powi(digits as i32)).fract().abs() == 0.5;
                assert!(alike, "{value} to {digits}: {ours} against {core}");
            }
        }
        assert_eq!(fixed(0.125, 2).to_string(), "0.13");
        assert_eq!(fixed(-0.04, 1).to_string(), "0.0");
        assert_eq!(fixed(f64::NAN, 1).to_string(), "NaN");
        assert_eq!(fixed(f64::NEG_INFINITY, 0).to_string(), "-inf");
        assert_eq!(fixed(1e300, 1).to_string(), u128::MAX.to_string());
        assert_eq!(fixed(2.0, 12).to_string(), "2.000000000");
    }
}
