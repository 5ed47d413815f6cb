//! A frame or an answer as the console reads it (`ringside_shared::decode`), against serde.
//!
//! The console's reader never panics and never follows nesting down the stack, whatever the text;
//! what it reads, serde reads too, to the same value; and the value, written again by serde,
//! reads back the same.
#![no_main]

use std::fmt::Debug;

use libfuzzer_sys::fuzz_target;
use ringside_shared::decode::{self, Decode};
use ringside_shared::{Alert, HistoryResponse, Snapshot, Update};
use serde::de::DeserializeOwned;
use serde::Serialize;

fn check<T: Decode + DeserializeOwned + Serialize + PartialEq + Debug>(text: &str) {
    let Ok(ours) = decode::from_str::<T>(text) else { return };
    let theirs: T = serde_json::from_str(text).unwrap_or_else(|e| panic!("decode read what serde refuses ({e}): {text}"));
    assert_eq!(ours, theirs, "{text}");
    let again = serde_json::to_string(&ours).unwrap();
    assert_eq!(decode::from_str::<T>(&again).as_ref(), Ok(&ours), "{again}");
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    check::<Snapshot>(text);
    check::<Update>(text);
    check::<Alert>(text);
    check::<HistoryResponse>(text);
    check::<Vec<Option<f64>>>(text);
    check::<String>(text);
});
