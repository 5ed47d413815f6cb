//! What a WebSocket client sends: any text frame is decoded into a command or an error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = ringside_shared::ClientCommand::parse(text);
    }
});
