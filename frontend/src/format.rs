//! How the console writes times, durations and sizes: one way each, used by every panel.

/// "12 s", "4 min", "3 h", "2 d".
pub fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min", s / 60),
        3600..=86_399 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

/// A short duration given in nanoseconds: "0.4 µs" (tenths below 10 µs, where ring-kernel
/// latencies live), "84 µs", "34.1 ms"; "–" when there is none.
pub fn micros(ns: Option<u64>) -> String {
    match ns {
        None => "–".into(),
        Some(v) if v >= 1_000_000 => format!("{} ms", fixed(v as f64 / 1e6, 1)),
        Some(v) if v >= 10_000 => format!("{} µs", fixed(v as f64 / 1e3, 0)),
        Some(v) => format!("{} µs", fixed(v as f64 / 1e3, 1)),
    }
}

/// "1.2 GiB", "640 MiB", "85 KiB".
pub fn bytes(b: u64) -> String {
    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
    let gib = b as f64 / GIB;
    if gib >= 1.0 {
        format!("{} GiB", fixed(gib, 1))
    } else if b < 1024 * 1024 {
        format!("{} KiB", fixed(b as f64 / 1024.0, 0))
    } else {
        format!("{} MiB", fixed(b as f64 / 1024.0 / 1024.0, 0))
    }
}

/// Floats with a fixed number of decimals, without core's float formatting (shared with the
/// daemon's texts the console shows).
pub use ringside_shared::fixed;

/// What a failed browser call threw, as text: a thrown string as it is, an `Error` as
/// `TypeError: message`. (The console is built with `-Zfmt-debug=none`, where `{:?}` writes
/// nothing.)
pub fn js_error(e: &wasm_bindgen::JsValue) -> String {
    use wasm_bindgen::JsCast;
    if let Some(text) = e.as_string() {
        return text;
    }
    match e.dyn_ref::<js_sys::Error>() {
        Some(error) => String::from(error.to_string()),
        None => "the browser gave no reason".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_keep_their_precision_where_it_matters() {
        assert_eq!(micros(None), "–");
        assert_eq!(micros(Some(420)), "0.4 µs");
        assert_eq!(micros(Some(9_940)), "9.9 µs");
        assert_eq!(micros(Some(84_200)), "84 µs");
        assert_eq!(micros(Some(34_120_000)), "34.1 ms");
        assert_eq!(age(59_999), "59 s");
        assert_eq!(age(7_200_000), "2 h");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
        assert_eq!(bytes(640 << 20), "640 MiB");
        assert_eq!(bytes(85 << 10), "85 KiB");
    }

    /// The console's sources keep out what costs its wasm for nothing: `{:?}`, which writes
    /// nothing where `cargo xtask console` builds with `-Zfmt-debug=none` (the protocol crate's
    /// sources too, test code aside), and Leptos' `collect_view`, a copy of the list code per
    /// item type where `collect_any` shares one.
    #[test]
    fn the_console_keeps_out_debug_formatting_and_typed_lists() {
        let root = env!("CARGO_MANIFEST_DIR");
        let mut checked = 0;
        for (dir, banned) in [
            (format!("{root}/src"), &[":?}", ":#?}", "dbg!(", ".collect_view()"][..]),
            (format!("{root}/../shared/src"), &[":?}", ":#?}", "dbg!("][..]),
        ] {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.file_name().is_some_and(|n| n == "tests.rs") {
                    continue;
                }
                let source = std::fs::read_to_string(&path).unwrap();
                let code = source.split("#[cfg(test)]").next().unwrap_or_default();
                for (n, line) in code.lines().enumerate() {
                    let comment = line.trim_start().starts_with("//");
                    let found = banned.iter().find(|b| line.contains(*b));
                    assert!(comment || found.is_none(), "{}:{}: {found:?} in {line}", path.display(), n + 1);
                }
                checked += 1;
            }
        }
        assert!(checked >= 20, "read {checked} files");
    }
}
