//! The libraries ML processes map, read as hostile input.
//!
//! Any local user chooses the names, contents and kinds of the files their processes map, and
//! can replace a file at its path after mapping it. So a library is never opened by its path:
//! it is opened through the mapping itself (`/proc/<pid>/map_files/<range>`, which resolves to
//! the file the process really maps, deleted or not), checked to be the mapping's device and
//! inode, a regular file, and at most `max_bytes` long, and read with a few bounded positioned
//! reads (`ringside_bpf::library_entry_points`). All of that runs on one worker thread, fed
//! through a bounded queue, so the observer's window loop never waits on a file; a worker that
//! takes longer than the time limit on one file is abandoned (the file refused) and a fresh one
//! started, at most `offthread::MAX_ABANDONED` times. Verdicts, refusals included, are cached by
//! (device, inode, size, mtime): a file is read once, not at every scan.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringside_bpf::{EntryPoint, Probes};

use super::offthread::{OffThread, Outcome};

/// `/proc/<pid>/maps` is read up to this many bytes (65530 mappings of ~100 bytes, the kernel's
/// default `vm.max_map_count`, fit).
pub const MAX_MAPS_BYTES: u64 = 8 * 1024 * 1024;
/// Requests waiting for the worker.
const QUEUE: usize = 64;
/// Verdicts kept; past that the cache starts afresh.
const CACHE: usize = 4096;

/// One file-backed line of `/proc/<pid>/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// `(major, minor)` of the file's device.
    pub dev: (u32, u32),
    pub inode: u64,
    /// Mapped executable (`x` in its permissions): code.
    pub exec: bool,
    /// As the kernel printed it when read, without a trailing ` (deleted)` (the file behind
    /// the mapping is opened through `map_files`, deleted or not).
    pub path: PathBuf,
}

impl Mapping {
    /// The mapping's entry in `/proc/<pid>/map_files` (named with unpadded hex, unlike `maps`).
    pub fn map_file(&self, proc_root: &Path, pid: u32) -> PathBuf {
        proc_root.join(pid.to_string()).join("map_files").join(format!("{:x}-{:x}", self.start, self.end))
    }

    /// The file name, for matching library names.
    pub fn file_name(&self) -> &str {
        self.path.file_name().and_then(|f| f.to_str()).unwrap_or("")
    }
}

/// Parses a `maps` line; `None` for anonymous and pseudo mappings (`[heap]`, `[vdso]`).
pub fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let (range, perms, _offset, dev, inode) =
        (fields.next()?, fields.next()?, fields.next()?, fields.next()?, fields.next()?);
    let path = fields.next()?.trim_start_matches(' ');
    if !path.starts_with('/') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    let inode: u64 = inode.parse().ok()?;
    if inode == 0 {
        return None;
    }
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        dev: (u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?),
        inode,
        exec: perms.as_bytes().get(2) == Some(&b'x'),
        path: PathBuf::from(path),
    })
}

/// The file-backed mappings of a process (at most [`MAX_MAPS_BYTES`] of `maps` read).
pub fn mappings(proc_root: &Path, pid: u32) -> Vec<Mapping> {
    mappings_counted(proc_root, pid).0
}

/// [`mappings`], and how many bytes of `maps` were read (for a scan's budget).
pub fn mappings_counted(proc_root: &Path, pid: u32) -> (Vec<Mapping>, u64) {
    let mut text = String::new();
    let read = File::open(proc_root.join(pid.to_string()).join("maps"))
        .and_then(|f| f.take(MAX_MAPS_BYTES).read_to_string(&mut text));
    if read.is_err() {
        return (Vec::new(), text.len() as u64);
    }
    (text.lines().filter_map(parse_maps_line).collect(), text.len() as u64)
}

/// Opens the file behind a mapping without following anything the process controls: the
/// `map_files` entry is a kernel link to the mapped file itself (`O_NOFOLLOW` cannot apply to
/// it: it is a link by design), `O_NONBLOCK` keeps a FIFO or device from blocking the open, and
/// the result is checked to be the mapping's own regular file.
pub fn open_mapped(proc_root: &Path, pid: u32, mapping: &Mapping) -> Result<(File, std::fs::Metadata), String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(mapping.map_file(proc_root, pid))
        .map_err(|e| format!("cannot open the mapping: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("cannot stat the mapped file: {e}"))?;
    let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
    if dev != mapping.dev || meta.ino() != mapping.inode {
        return Err("the mapping changed while it was looked at".into());
    }
    if !meta.file_type().is_file() {
        return Err("not a regular file".into());
    }
    Ok((file, meta))
}

/// Human-readable byte counts for refusals.
pub fn bytes(n: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    match n as f64 {
        b if b >= GIB => format!("{:.1} GiB", b / GIB),
        b if b >= MIB => format!("{:.1} MiB", b / MIB),
        b => format!("{b} bytes"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

type Verdict = Result<Vec<EntryPoint>, String>;

/// A library to inspect: `mapping` of process `pid`.
#[derive(Debug, Clone)]
pub struct Request {
    pub pid: u32,
    pub mapping: Mapping,
}

/// What the worker found: on success the opened file (to attach to) and its entry points.
pub struct Inspected {
    pub pid: u32,
    pub path: PathBuf,
    pub result: Result<(File, Vec<EntryPoint>), String>,
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Larger files are refused without reading them.
    pub max_bytes: u64,
    /// One file's inspection may take this long before its worker is abandoned.
    pub timeout: Duration,
}

/// What the worker does with one request (the real [`inspect`], or a test's stand-in).
type InspectFn =
    fn(&Path, &Request, Limits, Probes, &Mutex<HashMap<FileKey, Verdict>>) -> Result<(File, Vec<EntryPoint>), String>;

/// The libraries' reader, off the observer's thread.
pub struct LibraryInspector {
    work: OffThread<Request, Result<(File, Vec<EntryPoint>), String>>,
    /// The worker's verdicts, for the tests to look at.
    #[cfg(test)]
    cache: Arc<Mutex<HashMap<FileKey, Verdict>>>,
    /// Requests sent and not answered yet.
    queued: HashSet<(u32, PathBuf)>,
}

impl LibraryInspector {
    /// `probes`: which calls to look for.
    pub fn new(proc_root: PathBuf, limits: Limits, probes: Probes) -> LibraryInspector {
        LibraryInspector::with(proc_root, limits, probes, inspect)
    }

    fn with(proc_root: PathBuf, limits: Limits, probes: Probes, inspect: InspectFn) -> LibraryInspector {
        let cache: Arc<Mutex<HashMap<FileKey, Verdict>>> = Arc::default();
        let worker_cache = cache.clone();
        let work = OffThread::new("sched-libraries", "library inspection", QUEUE, limits.timeout, move |request| {
            inspect(&proc_root, request, limits, probes, &worker_cache)
        });
        #[cfg(not(test))]
        drop(cache);
        LibraryInspector {
            work,
            #[cfg(test)]
            cache,
            queued: HashSet::new(),
        }
    }

    /// Queues a library; false when the queue is full (ask again at the next scan) or
    /// inspection has stopped.
    pub fn request(&mut self, request: Request) -> bool {
        let key = (request.pid, request.mapping.path.clone());
        let sent = self.work.send(request);
        if sent {
            self.queued.insert(key);
        }
        sent
    }

    /// Whether a request for this library of `pid` waits for an answer (false once a worker
    /// holding it was abandoned: ask again).
    pub fn is_queued(&self, pid: u32, path: &Path) -> bool {
        self.queued.contains(&(pid, path.to_path_buf()))
    }

    /// What the worker has finished, and a refusal for a file it has been stuck on past the
    /// time limit (that worker is abandoned and a fresh one started).
    pub fn poll(&mut self) -> Vec<Inspected> {
        let (outcomes, abandoned) = self.work.poll();
        if abandoned {
            // What the abandoned worker had queued is lost with it: asked again at the next scan.
            self.queued.clear();
        }
        outcomes
            .into_iter()
            .map(|outcome| match outcome {
                Outcome::Done(request, result) => {
                    self.queued.remove(&(request.pid, request.mapping.path.clone()));
                    Inspected { pid: request.pid, path: request.mapping.path, result }
                }
                Outcome::TimedOut(request) => {
                    let why = format!("reading it took over {:?}: abandoned", self.work.timeout());
                    tracing::warn!(pid = request.pid, library = %request.mapping.path.display(), "{why}");
                    Inspected { pid: request.pid, path: request.mapping.path, result: Err(why) }
                }
            })
            .collect()
    }

    /// Why libraries are no longer inspected, if they are not.
    pub fn stopped(&self) -> Option<&str> {
        self.work.stopped()
    }
}

/// Opens, checks and reads one library (on the worker thread).
fn inspect(
    proc_root: &Path,
    request: &Request,
    limits: Limits,
    probes: Probes,
    cache: &Mutex<HashMap<FileKey, Verdict>>,
) -> Result<(File, Vec<EntryPoint>), String> {
    let (file, meta) = open_mapped(proc_root, request.pid, &request.mapping)?;
    let size = meta.len();
    if size > limits.max_bytes {
        return Err(format!(
            "it is {}, over the {} read at most ([scheduler] max_library_bytes)",
            bytes(size),
            bytes(limits.max_bytes)
        ));
    }
    let key = FileKey {
        dev: meta.dev(),
        ino: meta.ino(),
        size,
        mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
    };
    if let Some(verdict) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return verdict.map(|entries| (file, entries));
    }
    let verdict =
        ringside_bpf::library_entry_points(&file, size, &request.mapping.path, probes).map_err(|e| e.to_string());
    if let Ok(mut cache) = cache.lock() {
        if cache.len() >= CACHE {
            cache.clear();
        }
        cache.insert(key, verdict.clone());
    }
    verdict.map(|entries| (file, entries))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::sched::offthread::MAX_ABANDONED;
    use std::time::Instant;

    #[test]
    fn maps_lines() {
        let line = "7f3a2c000000-7f3a2c021000 r-xp 00000000 fd:01 1234567                    /usr/lib/x86_64-linux-gnu/libcuda.so.1";
        let m = parse_maps_line(line).unwrap();
        assert_eq!((m.start, m.end, m.dev, m.inode), (0x7f3a2c000000, 0x7f3a2c021000, (0xfd, 1), 1234567));
        assert!(m.exec);
        assert_eq!(m.file_name(), "libcuda.so.1");
        assert_eq!(m.map_file(Path::new("/proc"), 7), PathBuf::from("/proc/7/map_files/7f3a2c000000-7f3a2c021000"));
        let padded =
            parse_maps_line("00400000-00452000 r-xp 00000000 08:02 173521 /tmp/a dir/libnccl.so.2 (deleted)").unwrap();
        assert_eq!(padded.map_file(Path::new("/proc"), 1), PathBuf::from("/proc/1/map_files/400000-452000"));
        assert_eq!(padded.path.to_str(), Some("/tmp/a dir/libnccl.so.2"));
        let data =
            parse_maps_line("7f3a2c021000-7f3a2c022000 r--p 00021000 fd:01 1234567 /usr/lib/libcuda.so.1").unwrap();
        assert!(!data.exec);
        assert_eq!(parse_maps_line("7ffd1000-7ffd2000 rw-p 00000000 00:00 0                          [stack]"), None);
        assert_eq!(parse_maps_line("garbage"), None);
    }

    /// This test process's own mapping of the C library: a real library mapped by a real
    /// process, owned by root in root's directories.
    pub(crate) fn own_libc() -> Mapping {
        mappings(Path::new("/proc"), std::process::id())
            .into_iter()
            .find(|m| m.file_name().starts_with("libc.so"))
            .expect("libc is mapped")
    }

    #[test]
    fn a_mapped_library_is_opened_through_its_mapping_even_once_replaced() {
        // Its map_files entry opens the very file.
        let me = std::process::id();
        let libc = own_libc();
        let (file, meta) = open_mapped(Path::new("/proc"), me, &libc).expect("root may open map_files");
        assert!(meta.len() > 0);
        // A sound ELF file that defines none of the CUDA entry points.
        let entries =
            ringside_bpf::library_entry_points(&file, meta.len(), Path::new("libcuda.so.1"), Probes::default())
                .unwrap();
        assert!(entries.is_empty());
        // A mapping whose inode does not match is refused.
        let wrong = Mapping { inode: libc.inode + 1, ..libc };
        assert_eq!(
            open_mapped(Path::new("/proc"), me, &wrong).unwrap_err(),
            "the mapping changed while it was looked at"
        );
    }

    fn wait_for(inspector: &mut LibraryInspector) -> Inspected {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(done) = inspector.poll().pop() {
                return done;
            }
            assert!(Instant::now() < deadline, "no verdict in 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn the_worker_refuses_files_over_the_bound_and_reads_the_rest() {
        let me = std::process::id();
        let libc = own_libc();
        let limits = Limits { max_bytes: 4096, timeout: Duration::from_secs(5) };
        let mut small = LibraryInspector::new("/proc".into(), limits, Probes::default());
        assert!(small.request(Request { pid: me, mapping: libc.clone() }));
        let refused = wait_for(&mut small).result.expect_err("refused");
        assert!(refused.contains("over the 4096 bytes read at most"), "{refused}");
        let mut inspector =
            LibraryInspector::new("/proc".into(), Limits { max_bytes: 1 << 31, ..limits }, Probes::default());
        for _ in 0..2 {
            // The second answer comes from the cache, with the file opened afresh.
            assert!(inspector.request(Request { pid: me, mapping: libc.clone() }));
            let done = wait_for(&mut inspector);
            assert_eq!(done.path, libc.path);
            assert!(done.result.is_ok_and(|(_, entries)| entries.is_empty()));
        }
        assert_eq!(inspector.cache.lock().unwrap().len(), 1);
        assert!(inspector.stopped().is_none());
    }

    /// A stand-in for a read that never returns (a file on a hung network or FUSE mount).
    fn stuck(
        _: &Path,
        _: &Request,
        _: Limits,
        _: Probes,
        _: &Mutex<HashMap<FileKey, Verdict>>,
    ) -> Result<(File, Vec<EntryPoint>), String> {
        std::thread::sleep(Duration::from_secs(3600));
        Err("unreachable".into())
    }

    #[test]
    fn a_stuck_read_is_refused_at_the_time_limit_and_inspection_stops_after_four() {
        let me = std::process::id();
        let libc = own_libc();
        let limits = Limits { max_bytes: 1 << 31, timeout: Duration::from_millis(100) };
        let mut inspector = LibraryInspector::with("/proc".into(), limits, Probes::default(), stuck);
        for round in 1..=MAX_ABANDONED {
            // One in hand and one queued behind it: the queued one is lost with the worker.
            assert!(inspector.request(Request { pid: me, mapping: libc.clone() }));
            assert!(inspector.request(Request { pid: me + 1, mapping: libc.clone() }));
            assert!(inspector.is_queued(me + 1, &libc.path));
            let started = Instant::now();
            let done = wait_for(&mut inspector);
            assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
            let why = done.result.expect_err("refused");
            assert!(why.contains("took over 100ms: abandoned"), "{why}");
            assert!(!inspector.is_queued(me + 1, &libc.path), "asked again later");
            if round < MAX_ABANDONED {
                assert!(inspector.stopped().is_none());
            }
        }
        assert!(inspector.stopped().unwrap().contains("4 files could not be read"));
        assert!(!inspector.request(Request { pid: me, mapping: libc }));
    }
}
