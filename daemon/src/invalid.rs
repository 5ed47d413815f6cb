//! A configuration value its section refuses: the key (`scheduler.window_ms`), the value as
//! given, and why. Each section checks itself and returns this; the config stops the daemon
//! with it at start-up, naming the key. A leaf every section may use.

use std::fmt::Display;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid `{key}` = {value}: {why}")]
pub struct Invalid {
    pub key: String,
    pub value: String,
    pub why: String,
}

impl Invalid {
    pub fn new(key: impl Into<String>, value: impl Display, why: impl Into<String>) -> Invalid {
        Invalid { key: key.into(), value: value.to_string(), why: why.into() }
    }

    /// `value` from `min` to `max`, both included, or why not.
    pub fn range<T: PartialOrd + Display>(key: &str, value: T, min: T, max: T) -> Result<(), Invalid> {
        if value >= min && value <= max {
            Ok(())
        } else {
            Err(Invalid::new(key, &value, format!("must be from {min} to {max}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_the_key_the_value_and_the_range() {
        assert!(Invalid::range("a.b", 5, 1, 5).is_ok());
        let e = Invalid::range("scheduler.window_ms", 10_001, 20, 10_000).unwrap_err();
        assert_eq!(e.to_string(), "invalid `scheduler.window_ms` = 10001: must be from 20 to 10000");
    }
}
