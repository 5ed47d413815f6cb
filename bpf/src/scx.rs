//! The sched_ext scheduler (`scx.bpf.c`): loads and registers it, writes the daemon's decisions
//! into its map, reads its counters and, when the kernel ejects it, why.
//!
//! sched_ext exists only in kernels built with `CONFIG_SCHED_CLASS_EXT` (6.12+); where it does
//! not, [`available`] says why and [`ScxScheduler::load`] fails with that reason. Only one
//! sched_ext scheduler runs at a time: loading fails if another one is registered.

use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject};

mod skel {
    #![allow(
        clippy::all,
        clippy::undocumented_unsafe_blocks,
        non_camel_case_types,
        non_snake_case,
        dead_code,
        unused_imports
    )]
    include!(concat!(env!("OUT_DIR"), "/scx.skel.rs"));
}

use skel::types::{scx_counters as RawCounters, scx_decision as RawDecision};

/// Where the kernel says what sched_ext is doing.
pub const SYSFS: &str = "/sys/kernel/sched_ext";
/// The name the scheduler registers under (`/sys/kernel/sched_ext/root/ops`).
pub const OPS_NAME: &str = "ringside";
const MAX_CPUS: usize = 1024;
const MAX_NODES: u32 = 64;

/// How a thread is treated beyond its weight (`enum scx_class` in `scx_intf.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScxClass {
    /// Weighted fair share with the decision's slice.
    Default = 0,
    /// Short slice, preempts the running task on wake-up (data loading, optimizer step).
    Latency = 1,
    /// Long slice (threads feeding the GPU).
    Feeder = 2,
}

/// A decision for one thread, as the scheduler carries it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScxDecision {
    /// sched_ext weight: 100 at nice 0. See [`scx_weight`].
    pub weight: u32,
    /// Time slice in microseconds; 0 for the default (20 ms).
    pub slice_us: u32,
    /// Preferred NUMA node; `None` for the node the thread last ran on.
    pub node: Option<u32>,
    pub class: ScxClass,
    /// The phase it was decided for, as a number the daemon chooses (shown only).
    pub phase: u32,
}

/// The kernel's CFS/EEVDF weight (1024 at nice 0) in sched_ext's scale (100 at nice 0), within
/// sched_ext's bounds 1..=10000.
pub fn scx_weight(cfs_weight: u32) -> u32 {
    ((u64::from(cfs_weight) * 100).div_ceil(1024)).clamp(1, 10_000) as u32
}

/// Counters summed over CPUs (`struct scx_counters` in `scx_intf.h`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScxCounters {
    pub enqueued: u64,
    pub decided: u64,
    pub direct: u64,
    pub dispatched: u64,
    pub stolen: u64,
    pub preempted: u64,
    pub continued: u64,
    pub latency_runs: u64,
    pub feeder_runs: u64,
    pub fallbacks: u64,
}

/// Why the scheduler stopped, as its `exit` callback recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScxExit {
    /// `enum scx_exit_kind`: 1 done, 64 unregistered by user space, 66 by the kernel, 67 sysrq,
    /// 1024 error, 1025 error raised by the program, 1026 watchdog (a runnable task stalled).
    pub kind: i32,
    pub exit_code: i64,
    pub reason: String,
    pub message: String,
}

impl ScxExit {
    /// Whether the kernel (or an operator's sysrq) stopped it, not its owner.
    pub fn is_ejection(&self) -> bool {
        self.kind != 64 && self.kind != 1
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScxError {
    #[error("sched_ext unavailable: {0}")]
    Unavailable(String),
    #[error("sched_ext scheduler could not be {stage}: {detail}")]
    Failed { stage: &'static str, detail: String },
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// sched_ext's state (`enabled`, `disabled`, `enabling`, `disabling`), or why there is none.
pub fn state() -> Result<String, String> {
    read_trimmed(&Path::new(SYSFS).join("state")).ok_or_else(|| {
        format!("this kernel has no {SYSFS} (it is not built with CONFIG_SCHED_CLASS_EXT, which needs 6.12 or later)")
    })
}

/// Name of the registered sched_ext scheduler, if one is.
pub fn ops_name() -> Option<String> {
    read_trimmed(&Path::new(SYSFS).join("root/ops")).filter(|s| !s.is_empty())
}

/// Whether this kernel can run a sched_ext scheduler, and if not, why.
pub fn available() -> Result<(), String> {
    state().map(|_| ())
}

/// CPU -> NUMA node from `/sys/devices/system/node/node*/cpulist`; (node count, map).
pub fn numa_layout(sys_root: &Path) -> (u32, Vec<u8>) {
    let mut map = vec![0u8; MAX_CPUS];
    let mut nodes = 0u32;
    let Ok(entries) = std::fs::read_dir(sys_root.join("devices/system/node")) else {
        return (1, map);
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(node) = name.to_str().and_then(|n| n.strip_prefix("node")).and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if node >= MAX_NODES {
            continue;
        }
        nodes = nodes.max(node + 1);
        let list = std::fs::read_to_string(entry.path().join("cpulist")).unwrap_or_default();
        for cpu in crate::parse_cpu_list(&list) {
            if cpu < MAX_CPUS {
                map[cpu] = node as u8;
            }
        }
    }
    (nodes.max(1), map)
}

/// How many CPUs the kernel could ever run (the highest possible CPU + 1, from
/// `devices/system/cpu/possible`): a task free to run anywhere has that many in its mask. Not
/// the CPUs this process may use (its affinity or cgroup may be narrower): the scheduler moves
/// a task between nodes only when it may run on all of them.
pub fn possible_cpus(sys_root: &Path) -> u32 {
    let listed = std::fs::read_to_string(sys_root.join("devices/system/cpu/possible"))
        .ok()
        .and_then(|list| crate::parse_cpu_list(&list).into_iter().max())
        .map(|max| max as u32 + 1);
    listed
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1))
        .min(MAX_CPUS as u32)
}

/// A loaded and registered sched_ext scheduler. Dropping it unregisters it.
pub struct ScxScheduler {
    skel: skel::ScxSkel<'static>,
    link: Option<Link>,
    nodes: u32,
}

impl ScxScheduler {
    /// Loads the scheduler and registers it with the kernel (every normal task then runs on it).
    pub fn load(sys_root: &Path) -> Result<ScxScheduler, ScxError> {
        state().map_err(ScxError::Unavailable)?;
        if let Some(other) = ops_name() {
            return Err(ScxError::Failed {
                stage: "registered",
                detail: format!("another sched_ext scheduler ({other:?}) is running"),
            });
        }
        let (nodes, cpu_node) = numa_layout(sys_root);
        let failed = |stage: &'static str| move |e: libbpf_rs::Error| ScxError::Failed { stage, detail: e.to_string() };
        // The skeleton borrows its object storage for as long as it lives; leaked on purpose
        // (a scheduler lives for the daemon's run; a few bytes per load).
        let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = skel::ScxSkelBuilder::default().open(storage).map_err(failed("opened"))?;
        if let Some(rodata) = open.maps.rodata_data.as_deref_mut() {
            rodata.nr_nodes = nodes;
            rodata.nr_cpus = possible_cpus(sys_root);
            rodata.cpu_node.copy_from_slice(&cpu_node);
        }
        let mut skel = open.load().map_err(failed("loaded"))?;
        let link = skel.maps.ringside_ops.attach_struct_ops().map_err(failed("registered"))?;
        Ok(ScxScheduler { skel, link: Some(link), nodes })
    }

    /// NUMA nodes it has a dispatch queue for.
    pub fn nodes(&self) -> u32 {
        self.nodes
    }

    /// Sets the decision for a thread (replacing any earlier one).
    pub fn set(&self, tid: u32, decision: &ScxDecision) -> Result<(), ScxError> {
        let raw = RawDecision {
            weight: decision.weight.clamp(1, 10_000),
            slice_us: decision.slice_us,
            node: decision.node.map(|n| n as i32).unwrap_or(-1),
            class: decision.class as u32,
            phase: decision.phase,
            pad: 0,
        };
        // SAFETY: `scx_decision` is plain old data (integers only) generated from the BPF side's
        // BTF; its bytes are what the map stores.
        let bytes = unsafe {
            std::slice::from_raw_parts((&raw as *const RawDecision).cast::<u8>(), std::mem::size_of::<RawDecision>())
        };
        self.skel
            .maps
            .decisions
            .update(&tid.to_ne_bytes(), bytes, MapFlags::ANY)
            .map_err(|e| ScxError::Failed { stage: "told a decision", detail: e.to_string() })
    }

    /// The decision in force for a thread.
    pub fn get(&self, tid: u32) -> Option<ScxDecision> {
        let bytes = self.skel.maps.decisions.lookup(&tid.to_ne_bytes(), MapFlags::ANY).ok()??;
        if bytes.len() < std::mem::size_of::<RawDecision>() {
            return None;
        }
        // SAFETY: the map's values are `struct scx_decision`; read unaligned from the copy.
        let raw: RawDecision = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        Some(ScxDecision {
            weight: raw.weight,
            slice_us: raw.slice_us,
            node: (raw.node >= 0).then_some(raw.node as u32),
            class: match raw.class {
                1 => ScxClass::Latency,
                2 => ScxClass::Feeder,
                _ => ScxClass::Default,
            },
            phase: raw.phase,
        })
    }

    /// Removes a thread's decision: it is scheduled by its own weight again. True if it had one.
    pub fn clear(&self, tid: u32) -> bool {
        self.skel.maps.decisions.delete(&tid.to_ne_bytes()).is_ok()
    }

    /// Marks a process as part of an ML job: its threads without a decision of their own are
    /// scheduled by their own weight, but as threads of the job (see `scx.bpf.c`, `is_ml`).
    pub fn add_job(&self, pid: u32) -> Result<(), ScxError> {
        self.skel
            .maps
            .jobs
            .update(&pid.to_ne_bytes(), &1u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(|e| ScxError::Failed { stage: "told an ML process", detail: e.to_string() })
    }

    /// The process is no longer part of an ML job (it exited). True if it was.
    pub fn remove_job(&self, pid: u32) -> bool {
        self.skel.maps.jobs.delete(&pid.to_ne_bytes()).is_ok()
    }

    /// Threads with a decision.
    pub fn decided(&self) -> usize {
        self.skel.maps.decisions.keys().count()
    }

    /// Counters summed over CPUs.
    pub fn counters(&self) -> ScxCounters {
        let mut total = ScxCounters::default();
        let Ok(Some(per_cpu)) = self.skel.maps.counters.lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY) else {
            return total;
        };
        for bytes in per_cpu {
            if bytes.len() < std::mem::size_of::<RawCounters>() {
                continue;
            }
            // SAFETY: per-CPU values of `struct scx_counters` (u64 fields only).
            let c: RawCounters = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
            total.enqueued += c.enqueued;
            total.decided += c.decided;
            total.direct += c.direct;
            total.dispatched += c.dispatched;
            total.stolen += c.stolen;
            total.preempted += c.preempted;
            total.continued += c.continued;
            total.latency_runs += c.latency_runs;
            total.feeder_runs += c.feeder_runs;
            total.fallbacks += c.fallbacks;
        }
        total
    }

    /// Why it stopped, once the kernel has stopped it (`None` while it runs).
    pub fn exit(&self) -> Option<ScxExit> {
        let bss = self.skel.maps.bss_data.as_deref()?;
        // SAFETY: the field lives in the object's mmapped .bss for the skeleton's life; the BPF
        // side stores it atomically (release) after the rest of the record.
        let kind = unsafe { &*(&bss.exit_record.kind as *const i32 as *const AtomicI32) }.load(Ordering::Acquire);
        if kind == 0 {
            return None;
        }
        let text = |bytes: &[std::ffi::c_char]| {
            let bytes: Vec<u8> = bytes.iter().map(|b| *b as u8).take_while(|b| *b != 0).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        Some(ScxExit {
            kind,
            exit_code: bss.exit_record.exit_code,
            reason: text(&bss.exit_record.reason),
            message: text(&bss.exit_record.msg),
        })
    }

    /// Whether the kernel is running this scheduler now.
    pub fn is_running(&self) -> bool {
        self.exit().is_none() && state().is_ok_and(|s| s == "enabled") && ops_name().as_deref() == Some(OPS_NAME)
    }

    /// Unregisters the scheduler (every task goes back to the kernel's default scheduler) and
    /// returns why it stopped.
    pub fn unregister(&mut self) -> Option<ScxExit> {
        if let Some(link) = self.link.take() {
            drop(link);
        }
        self.exit()
    }
}

impl Drop for ScxScheduler {
    fn drop(&mut self) {
        self.unregister();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_convert_to_the_sched_ext_scale() {
        assert_eq!(scx_weight(1024), 100);
        assert_eq!(scx_weight(3121), 305);
        assert_eq!(scx_weight(15), 2);
        assert_eq!(scx_weight(88761), 8669);
        assert_eq!(scx_weight(0), 1);
    }

    #[test]
    fn numa_layout_from_sysfs() {
        let dir = std::env::temp_dir().join(format!("ringside-scx-{}", std::process::id()));
        for (node, list) in [(0, "0-1,4"), (1, "2-3,5")] {
            let d = dir.join(format!("devices/system/node/node{node}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpulist"), format!("{list}\n")).unwrap();
        }
        std::fs::create_dir_all(dir.join("devices/system/node/power")).unwrap();
        let (nodes, map) = numa_layout(&dir);
        assert_eq!(nodes, 2);
        assert_eq!(&map[..6], &[0, 0, 1, 1, 0, 1]);
        let (nodes, _) = numa_layout(&dir.join("missing"));
        assert_eq!(nodes, 1);
        std::fs::create_dir_all(dir.join("devices/system/cpu")).unwrap();
        std::fs::write(dir.join("devices/system/cpu/possible"), "0-7\n").unwrap();
        assert_eq!(possible_cpus(&dir), 8, "every possible CPU, whatever this process may use");
        std::fs::write(dir.join("devices/system/cpu/possible"), "0,2-3\n").unwrap();
        assert_eq!(possible_cpus(&dir), 4);
        assert!(possible_cpus(&dir.join("missing")) >= 1, "falls back to the CPUs this process has");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn loading_where_the_kernel_has_no_sched_ext_says_why() {
        if available().is_ok() {
            eprintln!("this kernel has sched_ext: the guest test (cargo xtask vm-test) covers loading");
            return;
        }
        match ScxScheduler::load(Path::new("/sys")) {
            Err(ScxError::Unavailable(why)) => assert!(why.contains("CONFIG_SCHED_CLASS_EXT"), "{why}"),
            Err(other) => panic!("expected unavailable, got {other}"),
            Ok(_) => panic!("loaded a sched_ext scheduler on a kernel without sched_ext"),
        }
    }
}
