use super::store::Tier;
use super::*;

const T0: u64 = 1_796_083_200_000;

fn config() -> HistoryConfig {
    HistoryConfig { flush_interval_s: 5, ..HistoryConfig::default() }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ringside-history-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn feed(history: &History, from_s: u64, to_s: u64) {
    for i in from_s..to_s {
        let mut inner = history.inner();
        let closed = inner.store.record(T0 + i * 1000, [("a@host", i as f64)]);
        // Written in order, as a writer keeping up at one head a minute would.
        for block in closed {
            inner.writer.send_waiting(Write::Block(block));
        }
        if i % 5 == 0 {
            let chunks = inner.store.open_chunks();
            let block = inner.store.fine_block().unwrap();
            inner.writer.send_waiting(Write::Head { block, chunks });
        }
    }
}

fn seconds(history: &History, from_s: u64, to_s: u64) -> usize {
    let q = Query {
        series: vec!["a@host".into()],
        from_ms: T0 + from_s * 1000,
        to_ms: T0 + to_s * 1000,
        points: (to_s - from_s) as usize,
    };
    history.query(&q).series[0].mean.iter().filter(|m| m.is_some()).count()
}

#[test]
fn a_clean_stop_keeps_everything_and_a_kill_loses_at_most_the_flush_interval() {
    let dir = temp_dir("restart");
    let (history, notes) = History::open(&config(), &dir, T0).unwrap();
    assert!(notes.is_empty());
    feed(&history, 0, 1500);
    history.close();
    let (again, _) = History::open(&config(), &dir, T0 + 1_500_000).unwrap();
    assert_eq!(seconds(&again, 0, 1500), 1500, "a clean stop keeps every second");

    // A kill: the writer's queue is drained (as the OS would have it written) but nothing
    // is settled or flushed at the end.
    feed(&again, 1500, 1803);
    {
        let mut inner = again.inner();
        inner.writer.stop();
    }
    std::mem::forget(again);
    let (third, _) = History::open(&config(), &dir, T0 + 1_803_000).unwrap();
    let kept = seconds(&third, 0, 1803);
    assert!((1803 - 5 - 1..1803).contains(&kept), "{kept} of 1803 seconds kept");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_corrupt_or_foreign_file_is_set_aside_and_the_rest_is_read() {
    let dir = temp_dir("corrupt");
    let (history, _) = History::open(&config(), &dir, T0).unwrap();
    feed(&history, 0, 1900);
    history.close();
    let mut blocks: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("fine-"))
        .collect();
    blocks.sort();
    assert_eq!(blocks.len(), 3);
    // One block flipped, one foreign file under a block's name, a link where a block could be.
    let victim = dir.join(&blocks[1]);
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[40] ^= 0x55;
    std::fs::write(&victim, bytes).unwrap();
    let later = T0 / Tier::Fine.block_ms() + 5;
    std::fs::write(dir.join(disk::block_name(Tier::Fine, later)), b"not ours").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", dir.join(disk::block_name(Tier::Fine, later + 1))).unwrap();

    let (again, notes) = History::open(&config(), &dir, T0 + 1_900_000).unwrap();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes.iter().any(|n| n.contains(&blocks[1]) && n.contains("checksum")), "{notes:?}");
    assert_eq!(seconds(&again, 0, 1900), 1900 - 600, "one block of ten minutes lost, nothing else");
    let aside = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains(".corrupt-"));
    assert_eq!(aside.count(), 2);
    assert_eq!(std::fs::read_to_string("/etc/passwd").map(|s| s.is_empty()).ok(), Some(false));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_directory_is_trimmed_to_its_bound_oldest_first() {
    let dir = temp_dir("trim");
    std::fs::create_dir_all(&dir).unwrap();
    let (history, _) = History::open(&config(), &dir, T0).unwrap();
    feed(&history, 0, 6 * 600 + 10);
    history.close();
    let stats = DiskStats::default();
    let sizes: u64 = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
    let block = std::fs::metadata(dir.join(disk::block_name(Tier::Fine, T0 / 600_000))).unwrap().len();
    disk::trim(&dir, T0 + 3_600_000, sizes - block, &stats);
    assert!(!dir.join(disk::block_name(Tier::Fine, T0 / 600_000)).exists(), "the oldest went");
    assert!(dir.join(disk::block_name(Tier::Fine, T0 / 600_000 + 1)).exists());
    assert!(dir.join(disk::HEAD).exists());
    // A day and more later, every fine block is past its age.
    disk::trim(&dir, T0 + 2 * 86_400_000, u64::MAX, &stats);
    let left: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(left.iter().all(|n| !n.starts_with("fine-")), "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn queries_are_bounded() {
    let parse = |series: &str, from, to, points| Query::parse(Some(series), from, to, points, T0);
    assert!(parse("", None, None, None).is_err());
    let many = (0..33).map(|i| format!("s{i}@host")).collect::<Vec<_>>().join(",");
    assert!(parse(&many, None, None, None).unwrap_err().0.contains("at most 32"));
    assert!(parse("a@host", Some(T0), Some(T0), None).is_err());
    assert!(parse("a@host", Some(T0 - 9 * 86_400_000), None, None).is_err());
    assert!(parse("a@host", None, None, Some(0)).is_err());
    assert!(parse("a@host", None, None, Some(4001)).is_err());
    let q = parse("a@host, b@gpu:0", None, None, None).unwrap();
    assert_eq!(q.series, vec!["a@host", "b@gpu:0"]);
    assert_eq!((q.from_ms, q.to_ms, q.points), (T0 - 900_000, T0, 600));
}

/// The fuzz target's seeds are real files (a block and a head), checked to still be read:
/// `RINGSIDE_BLESS=1` writes them again where the format changed on purpose.
#[test]
fn the_fuzz_seeds_are_files_as_written() {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/history_file");
    let mut store = Store::new(Limits::default());
    let mut blocks = Vec::new();
    for i in 0..700u64 {
        let t = T0 + i * 1000;
        blocks.extend(store.record(t, [("a@host", (i % 13) as f64), ("gpu.power_w@gpu:0", 300.0 + (i % 7) as f64)]));
    }
    let head = disk::encode_head(store.fine_block().unwrap(), &store.open_chunks());
    let files = [("block.rsh", disk::encode_block(&blocks[0])), ("head.rsh", head)];
    for (name, bytes) in files {
        let path = seeds.join(name);
        if std::env::var_os("RINGSIDE_BLESS").is_some() {
            std::fs::create_dir_all(&seeds).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        let committed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(disk::decode(&committed).is_ok(), "{name} is no longer read");
        assert_eq!(committed, bytes, "{name}: the format changed (RINGSIDE_BLESS=1 rewrites the seeds)");
    }
}

#[test]
fn a_directory_that_cannot_be_written_is_said_and_so_is_its_recovery() {
    let dir = temp_dir("unwritable");
    let (history, _) = History::open(&config(), &dir, T0).unwrap();
    // Running as root, permissions would not stop the writer: a file where the directory was does.
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::write(&dir, b"not a directory").unwrap();
    feed(&history, 0, 6);
    let settled = |want: bool| {
        for _ in 0..200 {
            if history.disk_failure().is_some() == want {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        false
    };
    assert!(settled(true), "the failure is reported");
    let why = history.disk_failure().unwrap();
    assert!(why.contains(&dir.display().to_string()), "{why}");
    let (errors, _) = history.disk_counts();
    assert!(errors >= 1);
    assert_eq!(seconds(&history, 0, 6), 6, "what is in memory is still answered");
    // The directory back: the next write succeeds and the failure is over.
    std::fs::remove_file(&dir).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    feed(&history, 6, 11);
    assert!(settled(false), "writing again");
    assert_eq!(history.disk_counts().0, errors, "no new failure");
    history.close();
    let _ = std::fs::remove_dir_all(&dir);
}
