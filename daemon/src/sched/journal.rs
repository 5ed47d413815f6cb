//! The enforcement journal: a thread's own scheduling settings, on disk before its first
//! change, so that they can be put back even if the daemon is killed (`kill -9`, a panic, the
//! machine's OOM killer) before it could restore them.
//!
//! One JSON line per event in `<data dir>/enforce.journal`: `saved` (fsync'd before the change
//! is made) and `restored` (written after the thread is back, not fsync'd: at worst a thread is
//! set to its own settings once more). Threads are named by (tid, start time): at start-up
//! `policy::restore_leftovers` puts back each thread whose start time still matches and never
//! touches a thread that merely reuses an id. The file is rewritten with only what is still
//! changed when it grows past [`COMPACT_AFTER`] lines.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Lines written before the journal is compacted.
pub const COMPACT_AFTER: usize = 4096;
/// A journal larger than this is not ours to trust: it is set aside, not read.
const MAX_JOURNAL_BYTES: u64 = 64 * 1024 * 1024;

/// A thread's own settings, saved before its first change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saved {
    pub pid: u32,
    pub tid: u32,
    /// Field 22 of `/proc/<pid>/task/<tid>/stat` (clock ticks since boot).
    pub start_time: u64,
    pub nice: i32,
    pub policy: i32,
    pub cpus: Vec<usize>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum Line {
    Saved(Saved),
    Restored { tid: u32, start_time: u64 },
}

pub struct Journal {
    path: PathBuf,
    file: File,
    lines: usize,
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)
}

/// The start time of a thread, or `None` if it no longer exists.
pub fn thread_start_time(proc_root: &Path, pid: u32, tid: u32) -> Option<u64> {
    let path = proc_root.join(pid.to_string()).join("task").join(tid.to_string()).join("stat");
    let mut text = String::new();
    File::open(path).and_then(|f| f.take(4096).read_to_string(&mut text)).ok()?;
    super::ml::parse_stat(&text).map(|(_, start, _)| start)
}

impl Journal {
    /// Opens the journal at `path` and returns what an earlier run left changed (threads saved
    /// and not restored), to be put back with `policy::restore_leftovers` and then
    /// [`Journal::clear`]ed.
    pub fn open(path: &Path) -> std::io::Result<(Journal, Vec<Saved>)> {
        let mut left: HashMap<(u32, u64), Saved> = HashMap::new();
        let mut order = Vec::new();
        match File::open(path) {
            Ok(file) => {
                let size = file.metadata()?.len();
                if size > MAX_JOURNAL_BYTES {
                    tracing::error!(
                        "{} is {size} bytes, larger than any journal this daemon writes: ignored",
                        path.display()
                    );
                } else {
                    for line in BufReader::new(file).lines() {
                        match serde_json::from_str::<Line>(&line?) {
                            Ok(Line::Saved(saved)) => {
                                let key = (saved.tid, saved.start_time);
                                if left.insert(key, saved).is_none() {
                                    order.push(key);
                                }
                            }
                            Ok(Line::Restored { tid, start_time }) => {
                                left.remove(&(tid, start_time));
                            }
                            // A line cut short by a crash mid-write: the ones before it stand.
                            Err(e) => tracing::warn!("{}: a line is unreadable ({e}); skipped", path.display()),
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let leftovers = order.into_iter().filter_map(|k| left.remove(&k)).collect();
        let file = open_append(path)?;
        Ok((Journal { path: path.to_path_buf(), file, lines: 0 }, leftovers))
    }

    fn append(&mut self, line: &Line, sync: bool) -> std::io::Result<()> {
        let mut text = serde_json::to_string(line).map_err(std::io::Error::other)?;
        text.push('\n');
        self.file.write_all(text.as_bytes())?;
        if sync {
            self.file.sync_data()?;
        }
        self.lines += 1;
        Ok(())
    }

    /// Records a thread's own settings, durably, before it is changed.
    pub fn saved(&mut self, saved: &Saved) -> std::io::Result<()> {
        self.append(&Line::Saved(saved.clone()), true)
    }

    /// Records that a thread is back to its own settings (or gone). `live` is every thread
    /// still changed, written afresh when the journal has grown long.
    pub fn restored<'a>(
        &mut self,
        tid: u32,
        start_time: u64,
        live: impl Iterator<Item = &'a Saved>,
    ) -> std::io::Result<()> {
        self.append(&Line::Restored { tid, start_time }, false)?;
        if self.lines >= COMPACT_AFTER {
            self.rewrite(live)?;
        }
        Ok(())
    }

    /// Replaces the journal with `live` only (written to a temporary file, synced, renamed).
    pub fn rewrite<'a>(&mut self, live: impl Iterator<Item = &'a Saved>) -> std::io::Result<()> {
        let tmp = self.path.with_extension("journal.tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut file = OpenOptions::new().create_new(true).write(true).mode(0o600).open(&tmp)?;
        let mut lines = 0;
        for saved in live {
            let mut text = serde_json::to_string(&Line::Saved(saved.clone())).map_err(std::io::Error::other)?;
            text.push('\n');
            file.write_all(text.as_bytes())?;
            lines += 1;
        }
        file.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            File::open(dir)?.sync_all()?;
        }
        self.file = open_append(&self.path)?;
        self.lines = lines;
        Ok(())
    }

    /// Empties the journal (nothing is changed any more).
    pub fn clear(&mut self) -> std::io::Result<()> {
        self.rewrite(std::iter::empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(tid: u32, start_time: u64) -> Saved {
        Saved { pid: tid, tid, start_time, nice: 0, policy: 0, cpus: vec![0, 1] }
    }

    #[test]
    fn what_was_saved_and_not_restored_is_left_over_and_a_cut_line_is_skipped() {
        let dir = crate::test_support::ScratchDir::new("journal");
        let path = dir.path().join("enforce.journal");
        let (mut journal, left) = Journal::open(&path).unwrap();
        assert!(left.is_empty());
        journal.saved(&saved(10, 1)).unwrap();
        journal.saved(&saved(11, 1)).unwrap();
        journal.saved(&saved(12, 1)).unwrap();
        journal.restored(11, 1, std::iter::empty()).unwrap();
        // The same tid with another start time is another thread.
        journal.restored(12, 2, std::iter::empty()).unwrap();
        drop(journal);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"event\":\"saved\",\"pid\":1")
            .unwrap();
        let (mut journal, left) = Journal::open(&path).unwrap();
        assert_eq!(left, vec![saved(10, 1), saved(12, 1)]);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        journal.clear().unwrap();
        assert!(Journal::open(&path).unwrap().1.is_empty());
    }

    #[test]
    fn a_long_journal_is_compacted_to_what_is_still_changed() {
        let dir = crate::test_support::ScratchDir::new("journal-compact");
        let path = dir.path().join("enforce.journal");
        let (mut journal, _) = Journal::open(&path).unwrap();
        let live = [saved(1, 5)];
        journal.saved(&live[0]).unwrap();
        for tid in 2..(COMPACT_AFTER as u32 / 2 + 2) {
            journal.saved(&saved(tid, 5)).unwrap();
            journal.restored(tid, 5, live.iter()).unwrap();
        }
        let lines = std::fs::read_to_string(&path).unwrap().lines().count();
        assert!(lines < 10, "compacted: {lines} lines");
        assert_eq!(Journal::open(&path).unwrap().1, vec![saved(1, 5)]);
    }
}
