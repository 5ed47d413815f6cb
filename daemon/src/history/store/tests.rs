use super::*;

const DAY_MS: u64 = 24 * 3600 * 1000;
/// A time at the start of a coarse block (2026-12-01 00:00 UTC is one: 6 h blocks from 0).
const T0: u64 = 1_796_083_200_000;

fn series_values(store: &Store, key: &str, from_ms: u64, to_ms: u64) -> Vec<(u64, f64)> {
    let points = ((to_ms - from_ms) / 1000) as usize;
    let s = store.query(key, from_ms, to_ms, points);
    s.buckets(from_ms, 1000).map(|(t, _, _, mean)| (t, mean)).collect()
}

#[test]
fn the_codec_gives_back_what_it_was_given_rounded() {
    let mut e = Encoder::<2>::new();
    let mut expected = Vec::new();
    let mut t = 1000u64;
    for i in 0..5000u64 {
        // Regular ticks, a late one, gaps of every size the buckets have.
        t += match i % 97 {
            0 => 5,
            1 => 70,
            2 => 300,
            3 => 4000,
            4 => 3_000_000,
            _ => 1,
        };
        let a = (i as f64 * 0.37).sin() * 100.0;
        let b = if i % 11 == 0 { 1e12 + i as f64 } else { 42.0 };
        e.push(t, [a, b]);
        expected.push((t, [codec::round_value(a), codec::round_value(b)]));
    }
    let mut got = Vec::new();
    assert!(codec::decode::<2>(e.bytes(), e.count, |t, v| got.push((t, v))));
    assert_eq!(got, expected);
    // Rounded to within 0.05% of the value.
    for (x, r) in [(45.37, codec::round_value(45.37)), (1.234e9, codec::round_value(1.234e9))] {
        assert!(((r - x) / x).abs() <= 1.0 / 2048.0, "{x} -> {r}");
    }
    assert_eq!(codec::round_value(87.0), 87.0, "small integers stay exact");
    // A chunk cut short or garbage decodes to an error, not a panic.
    assert!(!codec::decode::<2>(&e.bytes()[..e.bytes().len() / 2], e.count, |_, _| {}));
    assert!(!codec::decode::<1>(&[0xff; 40], 100, |_, _| {}));
}

#[test]
fn a_steady_series_costs_a_few_bits_a_point() {
    let mut e = Encoder::<1>::new();
    for i in 0..600u64 {
        e.push(i, [if i % 60 < 30 { 50.0 } else { 75.0 }]);
    }
    let bits = e.bytes().len() as f64 * 8.0 / 600.0;
    assert!(bits < 3.0, "{bits} bits a point");
}

#[test]
fn every_second_is_kept_and_downsampling_keeps_the_spike() {
    let mut store = Store::new(Limits::default());
    for i in 0..3600u64 {
        let v = if i == 1234 { 99.0 } else { 10.0 + (i % 7) as f64 };
        store.record(T0 + i * 1000, [("host.cpu_utilization_pct@host", v)]);
    }
    let got = series_values(&store, "host.cpu_utilization_pct@host", T0, T0 + 3_600_000);
    assert_eq!(got.len(), 3600, "the last second is pending, and answered too");
    assert_eq!(got[1234], (T0 + 1_234_000, 99.0));
    assert_eq!(got[5], (T0 + 5000, 15.0));
    // An hour in 6 buckets of 10 minutes: the spike is the max of its bucket, not averaged away.
    let s = store.query("host.cpu_utilization_pct@host", T0, T0 + 3_600_000, 6);
    assert_eq!(s.max[2], Some(99.0));
    assert_eq!(s.min[2], Some(10.0));
    let mean = s.mean[2].unwrap();
    assert!((13.0..13.2).contains(&mean), "{mean}");
    assert_eq!(s.resolution_ms, 60_000, "buckets of a minute or more come from the minutes");
    assert!(s.known);
    let unknown = store.query("gpu.utilization_pct@gpu:7", T0, T0 + 3_600_000, 6);
    assert!(!unknown.known && unknown.mean.iter().all(Option::is_none));
}

#[test]
fn ticks_faster_than_a_second_share_their_second() {
    let mut store = Store::new(Limits::default());
    for i in 0..40u64 {
        store.record(T0 + i * 250, [("x@host", (i % 4) as f64)]);
    }
    let s = store.query("x@host", T0, T0 + 10_000, 10);
    // The fine tier keeps each second's mean; its extremes survive in the minute only.
    assert_eq!((s.min[3], s.mean[3], s.max[3]), (Some(1.5), Some(1.5), Some(1.5)));
    store.settle_all();
    let minute = store.query("x@host", T0, T0 + 60_000, 1);
    assert_eq!((minute.min[0], minute.max[0]), (Some(1.5), Some(1.5)));
}

#[test]
fn older_than_a_day_comes_from_the_minutes() {
    let mut store = Store::new(Limits::default());
    let mut blocks = Vec::new();
    // Two days, one value a second, a spike once.
    for i in 0..2 * 86_400u64 {
        let v = if i == 3_000 { 500.0 } else { (i % 60) as f64 };
        blocks.extend(store.record(T0 + i * 1000, [("a@host", v)]));
    }
    let now = T0 + 2 * DAY_MS;
    // 10-minute blocks for both days, 6-hour blocks as they ended.
    let fine = blocks.iter().filter(|b| b.tier == Tier::Fine).count();
    let coarse = blocks.iter().filter(|b| b.tier == Tier::Coarse).count();
    assert_eq!((fine, coarse), (287, 7));
    let s = store.query("a@host", T0, now, 48);
    assert_eq!(s.resolution_ms, 60_000);
    assert_eq!(s.max[0], Some(500.0), "the spike of the first hour, from the minutes");
    assert_eq!(s.min[0], Some(0.0));
    assert!(s.mean[0].is_some_and(|m| (29.5..29.8).contains(&m)), "{:?}", s.mean[0]);
    assert!(s.mean.iter().all(Option::is_some), "no hole between the tiers");
    // The first day's seconds are gone; its minutes are not.
    let fine_first = store.query("a@host", T0, T0 + 600_000, 600);
    assert_eq!(fine_first.resolution_ms, 60_000);
    assert_eq!(fine_first.mean.iter().filter(|m| m.is_some()).count(), 10);
    let recent = store.query("a@host", now - 600_000, now, 600);
    assert_eq!(recent.resolution_ms, 1000);
    assert_eq!(recent.mean.iter().filter(|m| m.is_some()).count(), 600);
}

#[test]
fn a_week_later_the_minutes_are_gone_and_so_is_the_series() {
    let mut store = Store::new(Limits::default());
    for i in 0..7200u64 {
        store.record(T0 + i * 1000, [("gone@job:7", 1.0)]);
    }
    for day in 1..=8u64 {
        for i in 0..700u64 {
            store.record(T0 + day * DAY_MS + i * 1000, [("other@host", 1.0)]);
        }
    }
    assert!(store.catalog().iter().all(|(k, ..)| k != "gone@job:7"));
    assert_eq!(store.series_count(), 1);
}

#[test]
fn the_clock_going_back_drops_values_never_reorders_them() {
    let mut store = Store::new(Limits::default());
    store.record(T0 + 10_000, [("a@host", 1.0)]);
    store.record(T0 + 11_000, [("a@host", 2.0)]);
    store.record(T0 + 5_000, [("a@host", 9.0)]);
    let long = format!("{}@host", "x".repeat(600));
    store.record(T0 + 12_000, [("a@host", 3.0), ("b@host", f64::NAN), (long.as_str(), 1.0)]);
    let got = series_values(&store, "a@host", T0, T0 + 20_000);
    assert_eq!(got.iter().map(|p| p.1).collect::<Vec<_>>(), vec![1.0, 2.0, 3.0]);
    assert_eq!((store.dropped.late, store.dropped.invalid), (1, 2));
}

#[test]
fn series_and_memory_are_bounded() {
    let mut store = Store::new(Limits { max_series: 3, max_memory_bytes: 60_000 });
    let keys: Vec<String> = (0..10).map(|i| format!("s{i}@host")).collect();
    for i in 0..4 * 3600u64 {
        store.record(T0 + i * 1000, keys.iter().map(|k| (k.as_str(), (i * 7919 % 1000) as f64)));
    }
    assert_eq!(store.series_count(), 3);
    assert_eq!(store.dropped.series, 7 * 4 * 3600);
    // Checked as each block closes: what the open chunks add in between is not evicted.
    store.expire(T0 + 4 * 3_600_000);
    assert!(store.measure() <= 60_000, "{}", store.memory());
    assert!(store.dropped.evicted_chunks > 0);
    // The newest data is what stays.
    let recent = series_values(&store, "s0@host", T0 + 4 * 3_600_000 - 60_000, T0 + 4 * 3_600_000);
    assert_eq!(recent.len(), 60);
}

#[test]
fn the_head_and_closed_blocks_put_back_what_was_there() {
    let mut store = Store::new(Limits::default());
    let mut blocks = Vec::new();
    for i in 0..1500u64 {
        blocks.extend(store.record(T0 + i * 1000, [("a@host", i as f64)]));
    }
    store.settle_all();
    let head = store.open_chunks();
    let block = store.fine_block().unwrap();
    let before = series_values(&store, "a@host", T0, T0 + 1_500_000);
    assert_eq!(before.len(), 1500);

    // Restarted within the same block: the head's chunk is open again and takes new values.
    let mut again = Store::new(Limits::default());
    for b in &blocks {
        for (k, c) in &b.chunks {
            again.restore_closed(k, b.tier, c.clone());
        }
    }
    let closed = again.restore_head(block, head.clone(), T0 + 1_500_000);
    assert!(closed.is_empty());
    assert_eq!(series_values(&again, "a@host", T0, T0 + 1_500_000), before);
    again.record(T0 + 1_510_000, [("a@host", 7.0)]);
    assert_eq!(series_values(&again, "a@host", T0, T0 + 1_520_000).len(), 1501);

    // Restarted a day later: the head's block is closed and handed back for the disk.
    let mut later = Store::new(Limits::default());
    let closed = later.restore_head(block, head, T0 + DAY_MS / 2);
    assert_eq!(closed.iter().map(|b| b.tier).collect::<Vec<_>>(), vec![Tier::Fine, Tier::Coarse]);
    assert_eq!(series_values(&later, "a@host", T0 + 1_200_000, T0 + 1_500_000).len(), 300);
}
