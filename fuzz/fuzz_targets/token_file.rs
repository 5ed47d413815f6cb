//! A token file (`name:secret[:role]` lines, or a bare secret) as an operator may write it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = ringside_daemon::config::parse_tokens(text);
    }
});
