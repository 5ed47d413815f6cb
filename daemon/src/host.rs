//! Host metrics and node identity, read from `/proc` and `/sys`.
//!
//! Parsing is done by pure functions over the files' text so each format is tested on fixed
//! input; [`HostSource`] reads the real files every tick.

use std::path::{Path, PathBuf};

use ringside_shared::{GpuInfo, HostMetrics, MemoryMetrics, NodeIdentity, NumaNodeMetrics, PressureMetrics};

use crate::pipeline::{MetricsSource, Sample, SourceError, SourceStatus};

/// Jiffy counters of one `cpu` line of `/proc/stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTimes {
    pub busy: u64,
    pub iowait: u64,
    pub total: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcStat {
    pub all: CpuTimes,
    /// Indexed by CPU number; a CPU that is offline has no line and stays default.
    pub per_cpu: Vec<CpuTimes>,
    pub context_switches: u64,
    pub procs_running: u32,
    pub procs_blocked: u32,
}

pub fn parse_proc_stat(text: &str) -> ProcStat {
    let mut stat = ProcStat::default();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(key) = fields.next() else { continue };
        if let Some(cpu) = key.strip_prefix("cpu") {
            let values: Vec<u64> = fields.map(|f| f.parse().unwrap_or(0)).collect();
            // user nice system idle iowait irq softirq steal (guest time is already in user).
            let get = |i: usize| values.get(i).copied().unwrap_or(0);
            let idle = get(3);
            let iowait = get(4);
            let total: u64 = (0..8).map(get).sum();
            let times = CpuTimes { busy: total.saturating_sub(idle + iowait), iowait, total };
            if cpu.is_empty() {
                stat.all = times;
            } else if let Ok(index) = cpu.parse::<usize>() {
                if index < 4096 {
                    if stat.per_cpu.len() <= index {
                        stat.per_cpu.resize(index + 1, CpuTimes::default());
                    }
                    stat.per_cpu[index] = times;
                }
            }
            continue;
        }
        let value = fields.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match key {
            "ctxt" => stat.context_switches = value,
            "procs_running" => stat.procs_running = value as u32,
            "procs_blocked" => stat.procs_blocked = value as u32,
            _ => {}
        }
    }
    stat
}

/// Busy and iowait shares (percent) between two readings of the same CPU.
pub fn utilization(before: CpuTimes, after: CpuTimes) -> (f64, f64) {
    let total = after.total.saturating_sub(before.total);
    if total == 0 {
        return (0.0, 0.0);
    }
    let busy = after.busy.saturating_sub(before.busy) as f64 * 100.0 / total as f64;
    let iowait = after.iowait.saturating_sub(before.iowait) as f64 * 100.0 / total as f64;
    (busy.clamp(0.0, 100.0), iowait.clamp(0.0, 100.0))
}

/// `/proc/meminfo` (values in kB) to bytes.
pub fn parse_meminfo(text: &str) -> Result<MemoryMetrics, String> {
    let mut total = None;
    let mut available = None;
    let (mut free, mut cached, mut buffers, mut swap_total, mut swap_free) = (0, 0, 0, 0, 0);
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(key), Some(value)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Ok(kib) = value.parse::<u64>() else {
            continue;
        };
        let bytes = kib.saturating_mul(1024);
        match key {
            "MemTotal:" => total = Some(bytes),
            "MemAvailable:" => available = Some(bytes),
            "MemFree:" => free = bytes,
            "Cached:" => cached = bytes,
            "Buffers:" => buffers = bytes,
            "SwapTotal:" => swap_total = bytes,
            "SwapFree:" => swap_free = bytes,
            _ => {}
        }
    }
    let total = total.filter(|t| *t > 0).ok_or("no MemTotal line")?;
    // Kernels before 3.14 have no MemAvailable; free + page cache is the usual estimate.
    let available = available.unwrap_or(free + cached + buffers).min(total);
    let used = total - available;
    Ok(MemoryMetrics {
        total_bytes: total,
        available_bytes: available,
        used_bytes: used,
        used_pct: used as f64 * 100.0 / total as f64,
        cached_bytes: cached,
        swap_total_bytes: swap_total,
        swap_used_bytes: swap_total.saturating_sub(swap_free),
    })
}

pub fn parse_loadavg(text: &str) -> Result<(f64, f64, f64), String> {
    let mut fields = text.split_whitespace().map(|f| f.parse::<f64>());
    match (fields.next(), fields.next(), fields.next()) {
        (Some(Ok(a)), Some(Ok(b)), Some(Ok(c))) => Ok((a, b, c)),
        _ => Err(format!("unexpected /proc/loadavg: {:?}", text.trim())),
    }
}

/// `avg10` of the `some` and `full` lines of a `/proc/pressure/*` file.
pub fn parse_pressure(text: &str) -> (f64, f64) {
    let avg10 = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split_whitespace().find_map(|f| f.strip_prefix("avg10=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    (avg10("some"), avg10("full"))
}

/// `MemTotal` and `MemFree` of a `/sys/devices/system/node/nodeN/meminfo` file, in bytes.
pub fn parse_node_meminfo(text: &str) -> (u64, u64) {
    let find = |key: &str| {
        text.lines()
            .find_map(|l| {
                let rest = l.split_once(key)?.1;
                rest.split_whitespace().next()?.parse::<u64>().ok()
            })
            .unwrap_or(0)
            .saturating_mul(1024)
    };
    (find("MemTotal:"), find("MemFree:"))
}

/// Where the files are read from; tests point it at a fixture tree.
#[derive(Debug, Clone)]
pub struct HostPaths {
    pub proc: PathBuf,
    pub sys: PathBuf,
    pub etc: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        HostPaths { proc: "/proc".into(), sys: "/sys".into(), etc: "/etc".into() }
    }
}

fn read(path: &Path) -> Result<String, SourceError> {
    std::fs::read_to_string(path).map_err(|e| SourceError(format!("cannot read {}: {e}", path.display())))
}

fn numa_node_dirs(sys: &Path) -> Vec<(u32, PathBuf)> {
    let mut nodes: Vec<(u32, PathBuf)> = std::fs::read_dir(sys.join("devices/system/node"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    let id = name.strip_prefix("node")?.parse().ok()?;
                    Some((id, e.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    nodes.sort();
    nodes
}

/// The node's identity, read once at start-up.
pub fn node_identity(paths: &HostPaths, started_at_ms: u64) -> NodeIdentity {
    let text = |path: PathBuf| std::fs::read_to_string(path).map(|s| s.trim().to_string()).ok();
    let os = text(paths.etc.join("os-release"))
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=").map(|v| v.trim_matches('"').to_string())))
        .unwrap_or_else(|| "Linux".into());
    let stat = text(paths.proc.join("stat")).map(|s| parse_proc_stat(&s)).unwrap_or_default();
    let cpus = if stat.per_cpu.is_empty() {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    } else {
        stat.per_cpu.len()
    };
    NodeIdentity {
        hostname: text(paths.proc.join("sys/kernel/hostname")).unwrap_or_else(|| "unknown".into()),
        kernel: text(paths.proc.join("sys/kernel/osrelease")).unwrap_or_else(|| "unknown".into()),
        os,
        architecture: std::env::consts::ARCH.into(),
        cpus: cpus as u32,
        numa_nodes: numa_node_dirs(&paths.sys).len().max(1) as u32,
        gpus: gpus(paths),
        daemon_version: env!("CARGO_PKG_VERSION").into(),
        daemon_started_at_ms: started_at_ms,
    }
}

/// Display controllers (PCI class 0x03xx) of GPU vendors on the PCI bus.
pub fn gpus(paths: &HostPaths) -> Vec<GpuInfo> {
    let Ok(entries) = std::fs::read_dir(paths.sys.join("bus/pci/devices")) else {
        return Vec::new();
    };
    let mut found: Vec<(String, String, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let dir = e.path();
            let class = std::fs::read_to_string(dir.join("class")).ok()?;
            if !class.trim().starts_with("0x03") {
                return None;
            }
            let vendor = match std::fs::read_to_string(dir.join("vendor")).ok()?.trim() {
                "0x10de" => "nvidia",
                "0x1002" => "amd",
                _ => return None,
            };
            Some((e.file_name().to_string_lossy().into_owned(), vendor.to_string(), dir))
        })
        .collect();
    found.sort();
    found
        .into_iter()
        .enumerate()
        .map(|(index, (address, vendor, dir))| {
            let numa_node = std::fs::read_to_string(dir.join("numa_node"))
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .and_then(|n| u32::try_from(n).ok());
            let name =
                std::fs::read_to_string(paths.proc.join("driver/nvidia/gpus").join(&address).join("information"))
                    .ok()
                    .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Model:").map(|m| m.trim().to_string())));
            GpuInfo { index: index as u32, pci_address: address, vendor, name, numa_node }
        })
        .collect()
}

/// The host metrics source: CPU (from jiffy deltas between ticks), load, memory, pressure, NUMA.
pub struct HostSource {
    paths: HostPaths,
    previous: ProcStat,
}

impl HostSource {
    /// Takes a first `/proc/stat` reading so the first tick already has a delta to work with.
    pub fn new(paths: HostPaths) -> Self {
        let previous =
            std::fs::read_to_string(paths.proc.join("stat")).map(|s| parse_proc_stat(&s)).unwrap_or_default();
        HostSource { paths, previous }
    }

    fn pressure(&self) -> Option<PressureMetrics> {
        let dir = self.paths.proc.join("pressure");
        let cpu = std::fs::read_to_string(dir.join("cpu")).ok()?;
        let memory = std::fs::read_to_string(dir.join("memory")).ok()?;
        let io = std::fs::read_to_string(dir.join("io")).ok()?;
        let (memory_some, memory_full) = parse_pressure(&memory);
        Some(PressureMetrics {
            cpu_some_avg10: parse_pressure(&cpu).0,
            memory_some_avg10: memory_some,
            memory_full_avg10: memory_full,
            io_some_avg10: parse_pressure(&io).0,
        })
    }

    fn numa(&self) -> Vec<NumaNodeMetrics> {
        numa_node_dirs(&self.paths.sys)
            .into_iter()
            .map(|(node, dir)| {
                let cpus = std::fs::read_to_string(dir.join("cpulist"))
                    .map(|s| ringside_bpf::parse_cpu_list(&s).into_iter().map(|c| c as u32).collect())
                    .unwrap_or_default();
                let (total, free) =
                    std::fs::read_to_string(dir.join("meminfo")).map(|s| parse_node_meminfo(&s)).unwrap_or((0, 0));
                NumaNodeMetrics { node, cpus, mem_total_bytes: total, mem_free_bytes: free }
            })
            .collect()
    }
}

impl MetricsSource for HostSource {
    fn name(&self) -> &str {
        crate::pipeline::Component::Host.as_str()
    }

    fn collect(&mut self, sample: &mut Sample) -> Result<SourceStatus, SourceError> {
        let stat = parse_proc_stat(&read(&self.paths.proc.join("stat"))?);
        if stat.all.total == 0 {
            return Err(SourceError("/proc/stat has no aggregate cpu line".into()));
        }
        let (cpu, iowait) = utilization(self.previous.all, stat.all);
        let per_cpu = stat
            .per_cpu
            .iter()
            .enumerate()
            .map(|(i, now)| utilization(self.previous.per_cpu.get(i).copied().unwrap_or_default(), *now).0)
            .collect();
        let memory = parse_meminfo(&read(&self.paths.proc.join("meminfo"))?)
            .map_err(|e| SourceError(format!("/proc/meminfo: {e}")))?;
        let (load1, load5, load15) = parse_loadavg(&read(&self.paths.proc.join("loadavg"))?).map_err(SourceError)?;
        let uptime_s = read(&self.paths.proc.join("uptime"))?
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let pressure = self.pressure();
        let status = if pressure.is_none() {
            SourceStatus::Degraded("no pressure stall information (/proc/pressure): memory-stall alerts are off".into())
        } else {
            SourceStatus::Up
        };
        sample.readings.host = Some(HostMetrics {
            cpu_utilization_pct: cpu,
            per_cpu_utilization_pct: per_cpu,
            iowait_pct: iowait,
            load1,
            load5,
            load15,
            memory,
            pressure,
            numa: self.numa(),
            uptime_s,
            procs_running: stat.procs_running,
            procs_blocked: stat.procs_blocked,
            context_switches_total: stat.context_switches,
        });
        self.previous = stat;
        Ok(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  100 0 50 800 50 0 0 0 0 0\n\
cpu0 60 0 20 400 20 0 0 0 0 0\n\
cpu1 40 0 30 400 30 0 0 0 0 0\n\
intr 12345 0 0\nctxt 98765\nbtime 1700000000\nprocesses 4242\nprocs_running 3\nprocs_blocked 1\n";

    #[test]
    fn proc_stat() {
        let stat = parse_proc_stat(STAT);
        assert_eq!(stat.all, CpuTimes { busy: 150, iowait: 50, total: 1000 });
        assert_eq!(stat.per_cpu.len(), 2);
        assert_eq!(stat.per_cpu[1], CpuTimes { busy: 70, iowait: 30, total: 500 });
        assert_eq!((stat.context_switches, stat.procs_running, stat.procs_blocked), (98765, 3, 1));
    }

    #[test]
    fn utilization_comes_from_deltas() {
        let before = CpuTimes { busy: 100, iowait: 10, total: 1000 };
        let after = CpuTimes { busy: 175, iowait: 20, total: 1100 };
        assert_eq!(utilization(before, after), (75.0, 10.0));
        assert_eq!(utilization(after, after), (0.0, 0.0), "no time passed");
        assert_eq!(utilization(after, before), (0.0, 0.0), "a counter going back does not go negative");
    }

    #[test]
    fn meminfo() {
        let text = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    250 kB\nBuffers: 10 kB\nCached:          300 kB\nSwapTotal: 200 kB\nSwapFree: 50 kB\n";
        let m = parse_meminfo(text).unwrap();
        assert_eq!(m.total_bytes, 1000 * 1024);
        assert_eq!(m.available_bytes, 250 * 1024);
        assert_eq!(m.used_bytes, 750 * 1024);
        assert!((m.used_pct - 75.0).abs() < 1e-9);
        assert_eq!(m.swap_used_bytes, 150 * 1024);
        let old_kernel =
            parse_meminfo("MemTotal: 1000 kB\nMemFree: 100 kB\nCached: 300 kB\nBuffers: 100 kB\n").unwrap();
        assert_eq!(old_kernel.available_bytes, 500 * 1024);
        assert!(parse_meminfo("garbage").is_err());
    }

    #[test]
    fn small_formats() {
        assert_eq!(parse_loadavg("0.52 0.58 0.59 2/345 12345\n").unwrap(), (0.52, 0.58, 0.59));
        assert!(parse_loadavg("x").is_err());
        let psi = "some avg10=1.50 avg60=0.80 avg300=0.20 total=123\nfull avg10=0.25 avg60=0.00 avg300=0.00 total=4\n";
        assert_eq!(parse_pressure(psi), (1.5, 0.25));
        let node = "Node 0 MemTotal:       24000 kB\nNode 0 MemFree:        12000 kB\n";
        assert_eq!(parse_node_meminfo(node), (24000 * 1024, 12000 * 1024));
    }

    #[test]
    fn reads_this_machine() {
        let paths = HostPaths::default();
        let mut source = HostSource::new(paths.clone());
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut sample = Sample::new(0);
        source.collect(&mut sample).expect("the real /proc is readable");
        let host = sample.readings.host.expect("host metrics");
        assert!(host.memory.total_bytes > 0 && host.memory.used_pct > 0.0 && host.memory.used_pct < 100.0);
        assert!((0.0..=100.0).contains(&host.cpu_utilization_pct));
        assert!(!host.per_cpu_utilization_pct.is_empty());
        assert!(host.uptime_s > 0.0 && host.context_switches_total > 0);
        let node = node_identity(&paths, 0);
        assert_eq!(node.cpus as usize, host.per_cpu_utilization_pct.len());
        assert!(!node.hostname.is_empty() && node.kernel.chars().next().unwrap().is_ascii_digit());
    }
}
