//! Wall-clock time as the daemon writes it: milliseconds since the Unix epoch, and the two UTC
//! forms it prints (file names, Alertmanager timestamps). A leaf every module may use.

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// (year, month, day, hour, minute, second) of a Unix time in milliseconds, UTC.
fn civil(ms: u64) -> (i64, i64, i64, u64, u64, u64) {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day, rem / 3600, rem % 3600 / 60, rem % 60)
}

/// `YYYYMMDDTHHMMSSZ` for a Unix time in milliseconds (UTC), as used in download file names.
pub fn utc_compact(ms: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(ms);
    format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}Z")
}

/// RFC 3339 with milliseconds, UTC (`2026-12-02T11:25:05.000Z`).
pub fn utc_rfc3339(ms: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(ms);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{:03}Z", ms % 1000)
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_file_time() {
        assert_eq!(super::utc_compact(0), "19700101T000000Z");
        assert_eq!(super::utc_compact(1_796_210_705_000), "20261202T112505Z");
        assert_eq!(super::utc_compact(951_782_400_000), "20000229T000000Z");
        assert_eq!(super::utc_rfc3339(1_796_210_705_123), "2026-12-02T11:25:05.123Z");
    }
}
