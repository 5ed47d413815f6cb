//! A history file under the data directory, and the chunks in it, as a disk or another
//! program may have left them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringside_daemon::history::codec;
use ringside_daemon::history::disk::{self, Contents};
use ringside_daemon::history::store::Tier;

fn chunk(tier: Tier, bytes: &[u8], count: u32) {
    match tier {
        Tier::Fine => codec::decode::<1>(bytes, count, |_, _| {}),
        Tier::Coarse => codec::decode::<4>(bytes, count, |_, _| {}),
    };
}

fuzz_target!(|data: &[u8]| {
    let _ = disk::decode(data);
    match disk::parse(data) {
        Ok(Contents::Block(block)) => {
            for (_, c) in &block.chunks {
                chunk(block.tier, &c.bytes, c.count);
            }
        }
        Ok(Contents::Head { chunks, .. }) => {
            for (_, tier, c) in &chunks {
                chunk(*tier, &c.bytes, c.count);
            }
        }
        Err(_) => {}
    }
    chunk(Tier::Coarse, data, 4096);
});
