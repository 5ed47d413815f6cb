//! The console's JSON reader (`ringside_shared::decode`) against serde_json, reading the pinned
//! frames as the console receives them: the same text, the same types, interleaved rounds.
//! Native code: a browser's WebAssembly is slower in both, the ratio is what this shows.

use std::hint::black_box;
use std::time::Instant;

use ringside_shared::{decode, Snapshot, Update};

const ROUNDS: usize = 5;

fn per_read<T>(text: &str, reads: usize, read: impl Fn(&str) -> T) -> f64 {
    let started = Instant::now();
    for _ in 0..reads {
        black_box(read(black_box(text)));
    }
    started.elapsed().as_secs_f64() / reads as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn compare<T: decode::Decode + serde::de::DeserializeOwned>(name: &str, text: &str) {
    let reads = (50_000_000 / text.len()).max(10);
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        ours.push(per_read(text, reads, |t| decode::from_str::<T>(t).expect("decode reads the frame")));
        theirs.push(per_read(text, reads, |t| serde_json::from_str::<T>(t).expect("serde reads the frame")));
    }
    let (ours, theirs) = (median(ours), median(theirs));
    let mib_s = |s: f64| text.len() as f64 / s / (1 << 20) as f64;
    println!(
        "| {name} ({} KiB) | {:.1} µs ({:.0} MiB/s) | {:.1} µs ({:.0} MiB/s) | {:.2}x |",
        text.len() / 1024,
        ours * 1e6,
        mib_s(ours),
        theirs * 1e6,
        mib_s(theirs),
        theirs / ours
    );
}

fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).expect("the pinned frames are in shared/schemas");
    println!("median of {ROUNDS} interleaved rounds, time per read:\n");
    println!("| frame | ringside_shared::decode | serde_json | serde / decode |");
    println!("|---|---|---|---|");
    compare::<Snapshot>("snapshot", &read("example-snapshot-frame.json"));
    compare::<Update>("update", &read("example-update-frame.json"));
    // The snapshot as sent over the wire: compact, not pretty.
    let compact = serde_json::to_string(
        &serde_json::from_str::<serde_json::Value>(&read("example-snapshot-frame.json")).unwrap(),
    )
    .unwrap();
    compare::<Snapshot>("snapshot, compact", &compact);
}
