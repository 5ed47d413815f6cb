//! `[[rules]]` tables of a config file: parsed, then checked and compiled against the metric
//! registry, with errors naming their line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringside_daemon::alerts::rules::{compile, RuleConfig};

#[derive(serde::Deserialize)]
struct File {
    #[serde(default)]
    rules: Vec<RuleConfig>,
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(file) = toml::from_str::<File>(text) {
        let _ = compile(file.rules, text);
    }
});
