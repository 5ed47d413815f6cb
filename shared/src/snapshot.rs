//! The node state: what `/api/snapshot` returns and what a WebSocket client is sent first.
//!
//! Field names of the scheduler and ring-kernel telemetry are the ones users know from the
//! reference systems (see `docs/architecture.md`); do not rename them.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::decode::Decode;

use crate::alert::Alert;
use crate::UnixMillis;

/// Everything the daemon knows about the node at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct Snapshot {
    /// Version of this schema; equal to the protocol version.
    pub schema_version: u32,
    /// Number of the collection tick this snapshot was taken after (0 before the first).
    pub seq: u64,
    pub taken_at_ms: UnixMillis,
    /// The collection interval the daemon runs at.
    pub interval_ms: u64,
    pub node: NodeIdentity,
    /// The daemon's configuration, without secrets.
    pub config: ConfigSummary,
    /// Health of each part of the daemon (metrics sources, server).
    pub components: Vec<ComponentHealth>,
    /// The latest tick's readings (at the top level of the snapshot).
    #[serde(flatten)]
    pub readings: crate::Readings,
    /// Active alerts first, then recently resolved ones, newest first within each group.
    pub alerts: Vec<Alert>,
    /// Silences in force or to come, then recently ended ones.
    #[serde(default)]
    pub silences: Vec<crate::Silence>,
    /// The latest batches sent to Alertmanager (or that failed), newest first; at most 100.
    #[serde(default)]
    pub notifications: Vec<crate::Notification>,
    /// Incident bundles kept (and being recorded), newest first.
    #[serde(default)]
    pub incidents: Vec<crate::IncidentSummary>,
    /// Recent history for charts, oldest first.
    pub history: Vec<HistoryPoint>,
}

/// The configuration in force, as a snapshot reader needs it to interpret the rest; tokens are
/// listed by name and role only.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct ConfigSummary {
    pub listen: String,
    pub interval_ms: u64,
    pub window_ms: u64,
    pub history_len: u64,
    /// Every alert threshold by its config key.
    pub thresholds: BTreeMap<String, f64>,
    pub clear_for_ms: u64,
    pub flap_window_ms: u64,
    pub rules: Vec<RuleSummary>,
    /// `name (role)` of each token.
    pub tokens: Vec<String>,
    /// Where alerts are forwarded, if anywhere.
    pub alertmanager_url: Option<String>,
    /// The metrics `[[rules]]` may name.
    #[serde(default)]
    pub metrics: Vec<MetricSummary>,
}

/// A metric rules may name: the `/metrics` series it reads (those whose labels match
/// `select`), times `scale` (a `_pct` name is the ratio times 100).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct MetricSummary {
    pub name: String,
    pub prometheus: String,
    pub select: BTreeMap<String, String>,
    /// The unit of the `/metrics` series (`ratio`, `seconds`, `bytes`, ...).
    pub unit: String,
    pub scale: f64,
    pub help: String,
}

/// How a rule compares its metric with its threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Decode, JsonSchema)]
pub enum RuleOp {
    #[serde(rename = ">")]
    Gt,
    #[serde(rename = ">=")]
    Ge,
    #[serde(rename = "<")]
    Lt,
    #[serde(rename = "<=")]
    Le,
    #[serde(rename = "==")]
    Eq,
    #[serde(rename = "!=")]
    Ne,
}

impl RuleOp {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleOp::Gt => ">",
            RuleOp::Ge => ">=",
            RuleOp::Lt => "<",
            RuleOp::Le => "<=",
            RuleOp::Eq => "==",
            RuleOp::Ne => "!=",
        }
    }

    /// Whether `value op threshold` holds.
    pub fn holds(self, value: f64, threshold: f64) -> bool {
        match self {
            RuleOp::Gt => value > threshold,
            RuleOp::Ge => value >= threshold,
            RuleOp::Lt => value < threshold,
            RuleOp::Le => value <= threshold,
            RuleOp::Eq => value == threshold,
            RuleOp::Ne => value != threshold,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct RuleSummary {
    pub name: String,
    pub metric: String,
    pub op: RuleOp,
    pub threshold: f64,
    pub for_ms: u64,
    pub severity: crate::alert::Severity,
    pub labels: BTreeMap<String, String>,
}

/// Who this node is. Collected once at start-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct NodeIdentity {
    pub hostname: String,
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// Operating system, from `/etc/os-release`.
    pub os: String,
    pub architecture: String,
    pub cpus: u32,
    pub numa_nodes: u32,
    pub gpus: Vec<GpuInfo>,
    pub daemon_version: String,
    pub daemon_started_at_ms: UnixMillis,
}

/// A GPU found on the PCI bus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct GpuInfo {
    pub index: u32,
    /// PCI address, e.g. `0000:17:00.0`.
    pub pci_address: String,
    pub vendor: String,
    /// Model name where the driver reports one.
    pub name: Option<String>,
    /// NUMA node the device is attached to; absent on single-node machines.
    pub numa_node: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Decode, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ComponentStatus {
    Up,
    Degraded,
    Down,
    /// Not present on this node (the GPU source where there is no NVIDIA driver): nothing to
    /// watch, so not a fault; `detail` says what is missing.
    Absent,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct ComponentHealth {
    pub name: String,
    pub status: ComponentStatus,
    /// Why the component is not up, in words an operator can act on.
    pub detail: Option<String>,
}

/// `GET /api/host`: the host's figures of the latest tick, and nothing else — a few hundred
/// bytes and a figure per CPU, where the snapshot is tens of kilobytes or more. The console's
/// page shows them before its WebAssembly has arrived, which over a slow link takes seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct HostNow {
    pub seq: u64,
    pub taken_at_ms: UnixMillis,
    pub interval_ms: u64,
    /// Absent until the first successful collection.
    pub host: Option<HostMetrics>,
}

/// The JSON Schema of [`HostNow`] (`GET /api/schema/host`).
pub fn host_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(HostNow)).unwrap_or_default()
}

/// Host metrics from `/proc` and `/sys`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct HostMetrics {
    /// Busy share of all CPUs since the previous tick, 0-100.
    pub cpu_utilization_pct: f64,
    /// Busy share of each CPU since the previous tick, 0-100, indexed by CPU number.
    pub per_cpu_utilization_pct: Vec<f64>,
    /// Share of CPU time spent waiting for I/O since the previous tick, 0-100.
    pub iowait_pct: f64,
    pub load1: f64,
    pub load5: f64,
    pub load15: f64,
    pub memory: MemoryMetrics,
    /// Pressure stall information, where the kernel provides it.
    pub pressure: Option<PressureMetrics>,
    pub numa: Vec<NumaNodeMetrics>,
    pub uptime_s: f64,
    pub procs_running: u32,
    pub procs_blocked: u32,
    /// Context switches since boot (cumulative counter).
    pub context_switches_total: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct MemoryMetrics {
    pub total_bytes: u64,
    pub available_bytes: u64,
    /// `total - available`.
    pub used_bytes: u64,
    pub used_pct: f64,
    pub cached_bytes: u64,
    pub swap_total_bytes: u64,
    pub swap_used_bytes: u64,
}

/// `avg10` figures of `/proc/pressure/*`: share of the last 10 s some (or all) tasks stalled.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct PressureMetrics {
    pub cpu_some_avg10: f64,
    pub memory_some_avg10: f64,
    pub memory_full_avg10: f64,
    pub io_some_avg10: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct NumaNodeMetrics {
    pub node: u32,
    pub cpus: Vec<u32>,
    pub mem_total_bytes: u64,
    pub mem_free_bytes: u64,
}

/// One point of the chart history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct HistoryPoint {
    pub t_ms: UnixMillis,
    pub cpu_pct: f64,
    pub iowait_pct: f64,
    pub mem_used_pct: f64,
    pub load1: f64,
    /// Each ring kernel's latency and throughput at this tick.
    #[serde(default)]
    pub kernels: Vec<KernelPoint>,
    /// Each GPU's utilisation, memory and power at this tick.
    #[serde(default)]
    pub gpus: Vec<GpuPoint>,
}

/// One GPU at one tick, for the console's charts; a figure the GPU does not report is absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct GpuPoint {
    pub index: u32,
    pub utilization_pct: Option<f64>,
    pub memory_used_pct: Option<f64>,
    pub power_w: Option<f64>,
    pub temperature_c: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct KernelPoint {
    pub id: String,
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    /// Messages per second over the window.
    pub throughput_per_s: f64,
}

/// Defines a wire enum written in snake_case, with `as_str` (and `Display`) giving that same name.
macro_rules! wire_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Decode, JsonSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

wire_enum! {
    /// Whether the scheduler only records its decisions or also carries them out.
    #[derive(Default)]
    SchedulerMode {
        /// Decide and record.
        #[default]
        Observe => "observe",
        /// Decide and apply (to admitted processes).
        Enforce => "enforce",
    }
}

wire_enum! {
    /// What carries out the scheduler's decisions.
    #[derive(Default)]
    SchedulerBackend {
        /// Nothing: decisions are recorded only.
        #[default]
        Observe => "observe",
        /// Nice value, scheduling policy and CPU affinity of each thread.
        Setattr => "setattr",
        /// Ringside's sched_ext scheduler.
        Scx => "scx",
    }
}

wire_enum! {
    /// An ML process's part in its job.
    #[derive(Default)]
    ProcessRole {
        /// Uses the GPU itself (its own job's main process).
        #[default]
        Main => "main",
        /// A descendant that does not, e.g. a DataLoader worker.
        Worker => "worker",
    }
}

wire_enum! {
    /// How far a CUDA/NCCL library a process maps has been looked at.
    LibraryState {
        /// Waiting for the inspector.
        Pending => "pending",
        /// Its entry points are probed.
        Probed => "probed",
        /// Not probed; `detail` says why.
        Refused => "refused",
    }
}

wire_enum! {
    /// What a `stats` ring kernel is fed.
    StatsInput {
        /// Run-queue latencies of the ML threads the scheduler's probe tracks, in µs.
        RunqLatency => "runq_latency",
        /// Per-CPU utilisation each tick, in percent.
        CpuUtilization => "cpu_utilization",
    }
}

wire_enum! {
    /// The unit of a `stats` kernel's figures.
    StatsUnit {
        Us => "us",
        Pct => "pct",
    }
}

impl StatsInput {
    pub fn unit(self) -> StatsUnit {
        match self {
            StatsInput::RunqLatency => StatsUnit::Us,
            StatsInput::CpuUtilization => StatsUnit::Pct,
        }
    }
}

wire_enum! {
    /// A BPF program's attach point.
    #[derive(Default)]
    ProgramState {
        #[default]
        Attached => "attached",
        /// A better attach mode was refused; `detail` says why.
        Fallback => "fallback",
        Failed => "failed",
    }
}

wire_enum! {
    /// Why NVML says a GPU's clocks are held down (the groups `nvidia-smi -q` lists them under).
    ThrottleReason {
        GpuIdle => "gpu_idle",
        ApplicationsClocks => "applications_clocks",
        SwPowerCap => "sw_power_cap",
        HwSlowdown => "hw_slowdown",
        SyncBoost => "sync_boost",
        SwThermalSlowdown => "sw_thermal_slowdown",
        HwThermalSlowdown => "hw_thermal_slowdown",
        HwPowerBrake => "hw_power_brake",
        DisplayClocks => "display_clocks",
    }
}

impl ThrottleReason {
    pub const ALL: [ThrottleReason; 9] = [
        ThrottleReason::GpuIdle,
        ThrottleReason::ApplicationsClocks,
        ThrottleReason::SwPowerCap,
        ThrottleReason::HwSlowdown,
        ThrottleReason::SyncBoost,
        ThrottleReason::SwThermalSlowdown,
        ThrottleReason::HwThermalSlowdown,
        ThrottleReason::HwPowerBrake,
        ThrottleReason::DisplayClocks,
    ];

    /// The hardware protecting itself (heat, power), not a setting or idling.
    pub fn is_hardware(self) -> bool {
        matches!(
            self,
            ThrottleReason::HwSlowdown
                | ThrottleReason::HwThermalSlowdown
                | ThrottleReason::HwPowerBrake
                | ThrottleReason::SwThermalSlowdown
        )
    }
}

wire_enum! {
    /// Who may open a context on a GPU (`nvidia-smi -c`).
    GpuComputeMode {
        Default => "default",
        ExclusiveThread => "exclusive_thread",
        Prohibited => "prohibited",
        ExclusiveProcess => "exclusive_process",
    }
}

wire_enum! {
    /// A built-in ring kernel (`[[kernels]] kernel`), the same on the CPU and CUDA backends.
    #[derive(Default)]
    KernelKind {
        /// The canary: answers each probe.
        #[default]
        Echo => "echo",
        /// Summarises what it is fed.
        Stats => "stats",
        /// A steady throughput load.
        Saxpy => "saxpy",
    }
}

impl KernelKind {
    pub const ALL: [KernelKind; 3] = [KernelKind::Echo, KernelKind::Stats, KernelKind::Saxpy];
}

wire_enum! {
    /// How a probe program is attached: the scheduling programs' attach mode (`tp_btf`, else
    /// `raw_tp`, else `tracepoint`), the syscall waits classified at `sched_switch`, and the
    /// CUDA/NCCL `uprobe`s.
    #[derive(Default)]
    ProbeAttach {
        #[default]
        TpBtf => "tp_btf",
        RawTp => "raw_tp",
        Tracepoint => "tracepoint",
        SchedSwitch => "sched_switch",
        Uprobe => "uprobe",
    }
}

wire_enum! {
    /// `/sys/kernel/sched_ext/state`, or `unavailable` where the kernel has no sched_ext.
    #[derive(Default)]
    ScxState {
        Enabled => "enabled",
        Disabled => "disabled",
        Enabling => "enabling",
        Disabling => "disabling",
        #[default]
        Unavailable => "unavailable",
    }
}

impl ScxState {
    /// The state as sysfs writes it; anything else is `unavailable`.
    pub fn parse(text: &str) -> ScxState {
        [ScxState::Enabled, ScxState::Disabled, ScxState::Enabling, ScxState::Disabling]
            .into_iter()
            .find(|s| s.as_str() == text.trim())
            .unwrap_or(ScxState::Unavailable)
    }
}

wire_enum! {
    /// Why the sched_ext scheduler stopped: the kernel's `enum scx_exit_kind`.
    #[derive(Default)]
    ScxExitKind {
        Done => "done",
        /// Unregistered by its owner (the daemon stopping).
        Unregistered => "unregistered",
        UnregisteredBpf => "unregistered_bpf",
        /// Unregistered by the kernel.
        UnregisteredKernel => "unregistered_kernel",
        /// An operator's sysrq-S.
        Sysrq => "sysrq",
        Error => "error",
        /// An error the BPF program raised.
        ErrorBpf => "error_bpf",
        /// A runnable task was not run in time.
        WatchdogStall => "watchdog_stall",
        /// A kind this daemon does not know.
        #[default]
        Unknown => "unknown",
    }
}

impl ScxExitKind {
    /// From the kernel's number.
    pub fn of(kind: i32) -> ScxExitKind {
        match kind {
            1 => ScxExitKind::Done,
            64 => ScxExitKind::Unregistered,
            65 => ScxExitKind::UnregisteredBpf,
            66 => ScxExitKind::UnregisteredKernel,
            67 => ScxExitKind::Sysrq,
            1024 => ScxExitKind::Error,
            1025 => ScxExitKind::ErrorBpf,
            1026 => ScxExitKind::WatchdogStall,
            _ => ScxExitKind::Unknown,
        }
    }
}

/// A phase of ML work a thread can be in.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Decode, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    DataLoading,
    GpuCompute,
    NcclCollective,
    OptimizerStep,
    #[default]
    Unknown,
}

impl Phase {
    pub const ALL: [Phase; 5] =
        [Phase::DataLoading, Phase::GpuCompute, Phase::NcclCollective, Phase::OptimizerStep, Phase::Unknown];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::DataLoading => "data_loading",
            Phase::GpuCompute => "gpu_compute",
            Phase::NcclCollective => "nccl_collective",
            Phase::OptimizerStep => "optimizer_step",
            Phase::Unknown => "unknown",
        }
    }
}

/// One value per phase, serialised as an object keyed by phase name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct PhaseValues<T> {
    pub data_loading: T,
    pub gpu_compute: T,
    pub nccl_collective: T,
    pub optimizer_step: T,
    pub unknown: T,
}

impl<T: Copy> PhaseValues<T> {
    pub fn get(&self, phase: Phase) -> T {
        match phase {
            Phase::DataLoading => self.data_loading,
            Phase::GpuCompute => self.gpu_compute,
            Phase::NcclCollective => self.nccl_collective,
            Phase::OptimizerStep => self.optimizer_step,
            Phase::Unknown => self.unknown,
        }
    }

    pub fn get_mut(&mut self, phase: Phase) -> &mut T {
        match phase {
            Phase::DataLoading => &mut self.data_loading,
            Phase::GpuCompute => &mut self.gpu_compute,
            Phase::NcclCollective => &mut self.nccl_collective,
            Phase::OptimizerStep => &mut self.optimizer_step,
            Phase::Unknown => &mut self.unknown,
        }
    }
}

/// The scheduler's telemetry, with the reference scheduler's field names.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct SchedulerTelemetry {
    pub total_tracked_tasks: u64,
    /// Threads the BPF probe can keep counters for (its `threads` map); past it a new thread
    /// is not counted (`lost.threads`).
    #[serde(default)]
    pub threads_capacity: u64,
    pub ml_tasks: u64,
    /// Cumulative.
    pub decisions_made: u64,
    /// Cumulative.
    pub phase_transitions: u64,
    /// Number of ML tasks in each phase now.
    pub phase_distribution: PhaseValues<u64>,
    /// Share of ML task time spent in each phase, 0-100.
    pub phase_time_pct: PhaseValues<f64>,
    pub numa_nodes: u32,
    pub total_cpus: u32,
    #[serde(default)]
    pub mode: SchedulerMode,
    /// Length of the phase detector's window.
    #[serde(default)]
    pub window_ms: u64,
    /// The recent window of each process's `recent_phase_pct` and step times.
    #[serde(default)]
    pub job_window_ms: u64,
    /// How the scheduling programs are attached: `tp_btf`, `raw_tp` or `tracepoint`.
    #[serde(default)]
    pub attach_mode: Option<ProbeAttach>,
    /// Every BPF program and attach point, with its state.
    #[serde(default)]
    pub programs: Vec<ProbeProgram>,
    /// ML processes: the jobs' main processes and their workers, busiest first (at most
    /// [`SchedulerTelemetry::MAX_PROCESSES`], with a timeline of at most
    /// [`SchedulerTelemetry::MAX_SPANS`] spans shared out among them).
    #[serde(default)]
    pub processes: Vec<MlProcessInfo>,
    /// ML processes tracked but left out of `processes` (beyond the first
    /// [`SchedulerTelemetry::MAX_PROCESSES`]).
    #[serde(default)]
    pub processes_not_shown: u64,
    /// ML processes found but not tracked at all: beyond `[scheduler] max_processes`.
    #[serde(default)]
    pub processes_not_tracked: u64,
    /// Libraries not taken as evidence of ML work, and why (newest first, at most 16).
    #[serde(default)]
    pub refused_evidence: Vec<RefusedEvidence>,
    /// Ranks of jobs across nodes whose process ended here in the last 10 minutes (at most
    /// [`SchedulerTelemetry::MAX_EXITED_RANKS`], oldest first): a hung job's other ranks may be
    /// waiting for one of them.
    #[serde(default)]
    pub exited_ranks: Vec<ExitedRank>,
    /// Why `enforce` changes nothing, where it does not (no process admitted).
    #[serde(default)]
    pub enforcement_inactive: Option<String>,
    /// Threads of ML processes, busiest first (at most [`SchedulerTelemetry::MAX_TASKS`]).
    #[serde(default)]
    pub tasks: Vec<MlTaskInfo>,
    /// Recent decisions, newest first (at most [`SchedulerTelemetry::MAX_DECISIONS`]).
    #[serde(default)]
    pub decisions: Vec<Decision>,
    /// What the probe could not record (cumulative).
    #[serde(default)]
    pub lost: ProbeLosses,
    #[serde(default)]
    pub backend: SchedulerBackend,
    /// The sched_ext scheduler, where the `scx` backend was asked for (also after it stopped).
    #[serde(default)]
    pub scx: Option<ScxStatus>,
}

/// The sched_ext backend: the kernel's view and the scheduler's own counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct ScxStatus {
    pub state: ScxState,
    /// The registered scheduler's name (`/sys/kernel/sched_ext/root/ops`), if any.
    pub ops: Option<String>,
    /// Whether ours is the one running.
    pub running: bool,
    /// NUMA nodes it keeps a dispatch queue for.
    pub nodes: u32,
    /// Threads with a decision in its map.
    pub decided_threads: u64,
    /// Cumulative counters of the scheduler (summed over CPUs).
    pub counters: ScxCounters,
    /// Why it is not running: unavailable, failed to load, or stopped by the kernel.
    pub error: Option<String>,
    /// How it stopped, once the kernel stopped it.
    pub exit: Option<ScxExitInfo>,
}

/// Counters the sched_ext scheduler keeps per CPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct ScxCounters {
    /// Tasks queued on a node's dispatch queue.
    pub enqueued: u64,
    /// ... of which had a decision of the daemon.
    pub decided: u64,
    /// Put straight on an idle CPU at wake-up.
    pub direct: u64,
    /// Taken from the CPU's own node queue.
    pub dispatched: u64,
    /// Taken from another node's queue (work stealing).
    pub stolen: u64,
    /// Wake-ups that preempted the running task: a latency-class thread (data loading,
    /// optimizer), or a thread of an ML job that fairness owed the CPU.
    pub preempted: u64,
    /// Threads of ML jobs that kept their CPU when their slice ran out, fairness still owing it.
    #[serde(default)]
    pub continued: u64,
    /// Times a latency-class thread went on a CPU.
    pub latency_runs: u64,
    /// Times a GPU-feeding thread went on a CPU.
    pub feeder_runs: u64,
    /// Decisions that could not be followed as written (their node does not exist, their
    /// preemption target was not allowed).
    pub fallbacks: u64,
}

/// How the sched_ext scheduler stopped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct ScxExitInfo {
    pub at_ms: UnixMillis,
    pub kind: ScxExitKind,
    pub reason: String,
    pub message: String,
    /// Stopped by the kernel (or an operator's sysrq), not by the daemon.
    pub ejected: bool,
}

impl SchedulerTelemetry {
    pub const MAX_TASKS: usize = 96;
    /// Processes listed, and timeline spans over all of them: they travel in every update.
    pub const MAX_PROCESSES: usize = 32;
    pub const MAX_SPANS: usize = 2048;
    pub const MAX_DECISIONS: usize = 50;
    /// Libraries listed per process, and refused evidence kept.
    pub const MAX_LIBRARIES: usize = 4;
    pub const MAX_REFUSED: usize = 16;
    /// Text a local user chooses (paths, and reasons that quote them) is clipped to this many
    /// characters, keeping the end (a path's file name).
    pub const MAX_TEXT: usize = 160;
    /// Shorter texts of the daemon's own making, with a user's detail in them (a thread's last
    /// decision, a process's paging reason), clipped the same way.
    pub const MAX_SHORT_TEXT: usize = 96;
    /// Exited ranks kept, and for how long.
    pub const MAX_EXITED_RANKS: usize = 64;
    pub const EXITED_RANK_MS: u64 = 600_000;
    /// A process's command line is clipped to this many characters (keeping its start).
    pub const MAX_CMDLINE: usize = 256;
    /// What the scheduler's part of an update may take, serialized, with every list at its
    /// bound and every clipped text at its length (checked by a test).
    pub const FRAME_BUDGET: usize = 448 * 1024;
}

/// What a viewer sees in place of the command line of a process not admitted for alerting,
/// unless `[server] viewers_see_untrusted` (operators always see it).
pub const HIDDEN_FROM_VIEWERS: &str = "(hidden from viewers)";

/// A rank of a job across nodes whose process ended on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct ExitedRank {
    pub job_id: String,
    pub rank: u32,
    pub pid: u32,
    pub at_ms: UnixMillis,
    /// As `wait` reports it (a signal number in the low 7 bits, else the exit code in bits
    /// 8-15); absent where the probe's attach mode cannot read it.
    pub status: Option<i32>,
}

impl ExitedRank {
    /// `exit code 1`, `killed by signal 9 (SIGKILL)`, `exit status unknown`.
    pub fn how(&self) -> String {
        let Some(status) = self.status else { return "exit status unknown".into() };
        let signal = status & 0x7f;
        if signal == 0 {
            return format!("exit code {}", (status >> 8) & 0xff);
        }
        let name = match signal {
            1 => "SIGHUP",
            2 => "SIGINT",
            3 => "SIGQUIT",
            4 => "SIGILL",
            6 => "SIGABRT",
            7 => "SIGBUS",
            8 => "SIGFPE",
            9 => "SIGKILL",
            11 => "SIGSEGV",
            13 => "SIGPIPE",
            14 => "SIGALRM",
            15 => "SIGTERM",
            _ => "",
        };
        let core = if status & 0x80 != 0 { ", core dumped" } else { "" };
        if name.is_empty() {
            format!("killed by signal {signal}{core}")
        } else {
            format!("killed by signal {signal} ({name}){core}")
        }
    }
}

/// One rank of a job across nodes, on this node ([`SchedulerTelemetry::ranks`]).
#[derive(Debug, Clone)]
pub struct Rank<'a> {
    pub job_id: String,
    pub rank: u32,
    pub process: &'a MlProcessInfo,
}

impl Rank<'_> {
    /// How long it has been inside a collective at `now_ms` (ms), 0 when it is not in one.
    pub fn in_collective_ms(&self, now_ms: UnixMillis) -> u64 {
        self.process.collective_waiting_since_ms.map_or(0, |since| now_ms.saturating_sub(since))
    }

    /// Its time observed (the sum of its phase times), ms.
    pub fn observed_ms(&self) -> u64 {
        Phase::ALL.iter().map(|p| self.process.phase_ms.get(*p)).sum()
    }
}

impl SchedulerTelemetry {
    /// The ranks of jobs across nodes listed here: one per (job id, rank), the listed process
    /// with that identity making the most NCCL calls (a DataLoader worker inherits its rank's
    /// environment and makes none), else the job's main process, else the lowest pid. So at
    /// most [`SchedulerTelemetry::MAX_PROCESSES`], sorted by job id and rank.
    pub fn ranks(&self) -> Vec<Rank<'_>> {
        let mut ranks: std::collections::BTreeMap<(String, u32), &MlProcessInfo> = std::collections::BTreeMap::new();
        for p in &self.processes {
            let (Some(job_id), Some(rank)) = (p.identity.job_id(), p.identity.rank) else { continue };
            let key = |p: &MlProcessInfo| (p.collective_calls, p.role == ProcessRole::Main, std::cmp::Reverse(p.pid));
            let slot = ranks.entry((job_id, rank)).or_insert(p);
            if key(p) > key(slot) {
                *slot = p;
            }
        }
        ranks.into_iter().map(|((job_id, rank), process)| Rank { job_id, rank, process }).collect()
    }
}

impl SchedulerTelemetry {
    /// What a viewer is given unless `[server] viewers_see_untrusted`: each process not admitted
    /// for alerting keeps its place, phases, numbers and program name, without its command line
    /// and with every path cut to its file name (libraries, reasons); refused evidence (a file
    /// some user mapped) likewise. How many entries were changed.
    pub fn hide_untrusted_details(&mut self) -> usize {
        let mut hidden = 0;
        for p in self.processes.iter_mut().filter(|p| p.untrusted) {
            p.cmdline = HIDDEN_FROM_VIEWERS.to_string();
            // What its owner named things stays with the operators; where it runs does not.
            p.identity.slurm_job_name = None;
            p.identity.run_id = None;
            p.identity.pod = None;
            p.identity.unit = None;
            p.reason = file_names_only(&p.reason);
            for path in &mut p.probed_libraries {
                *path = file_names_only(path);
            }
            for l in &mut p.libraries {
                l.path = file_names_only(&l.path);
                l.detail = file_names_only(&l.detail);
            }
            hidden += 1;
        }
        for r in &mut self.refused_evidence {
            r.path = file_names_only(&r.path);
            r.why = file_names_only(&r.why);
            hidden += 1;
        }
        hidden
    }

    /// Whether [`hide_untrusted_details`](Self::hide_untrusted_details) would change anything.
    pub fn has_untrusted_details(&self) -> bool {
        !self.refused_evidence.is_empty() || self.processes.iter().any(|p| p.untrusted)
    }
}

/// `text` with every word that holds a path cut to `…/` and its last component:
/// `directory /home/ana/x is writable` becomes `directory …/x is writable`.
pub fn file_names_only(text: &str) -> String {
    text.split(' ')
        .map(|word| match word.rsplit_once('/') {
            Some((_, name)) => format!("…/{name}"),
            None => word.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text`, or its last `max - 1` characters after an ellipsis when it is longer.
pub fn clip(text: &str, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text.to_string();
    }
    let tail: String = text.chars().skip(count - (max.saturating_sub(1))).collect();
    format!("…{tail}")
}

/// One BPF program or attach point.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct ProbeProgram {
    /// What it observes, e.g. `sched_switch`, `sys_enter_read`, `libcuda.so.1 (pid 42)`.
    pub name: String,
    pub attach: ProbeAttach,
    pub state: ProgramState,
    pub detail: Option<String>,
}

/// Counts of what the BPF side could not record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct ProbeLosses {
    pub events: u64,
    pub runq_samples: u64,
    pub threads: u64,
    pub ml_threads: u64,
    /// Program runs the kernel skipped (a program would have run nested in another on the
    /// same CPU); a skipped return probe is recovered at the thread's next call.
    #[serde(default)]
    pub skipped_runs: u64,
}

/// A stretch of time one process spent in one phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct PhaseSpan {
    pub phase: Phase,
    pub start_ms: UnixMillis,
    pub end_ms: UnixMillis,
    /// Whether one of its threads waited for a CPU (runnable, not running) for a quarter of
    /// the time or more: the process was starved of CPU whatever its phase. Absent: false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub waiting_for_cpu: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// An ML process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct MlProcessInfo {
    pub pid: u32,
    /// The job's main process (its own pid for a main process).
    pub job: u32,
    pub comm: String,
    pub role: ProcessRole,
    /// Why it counts as ML: `maps libcuda.so.1`, `opens /dev/nvidia0`, `command line matches
    /// "train"`, `child of 1234`.
    pub reason: String,
    pub phase: Phase,
    pub phase_since_ms: UnixMillis,
    pub threads: u32,
    /// GPU minor numbers it holds open (`/dev/nvidiaN`).
    pub gpus: Vec<u32>,
    /// The NUMA node of its GPU, where known.
    pub numa_node: Option<u32>,
    /// Libraries whose CUDA/NCCL entry points are probed in it.
    pub probed_libraries: Vec<String>,
    /// Every CUDA/NCCL library it maps, probed or not, and why not.
    #[serde(default)]
    pub libraries: Vec<LibraryStatus>,
    /// Its real user id.
    #[serde(default)]
    pub uid: Option<u32>,
    /// Whether `enforce` may change it.
    #[serde(default)]
    pub admitted: bool,
    /// Why (`admitted: user 1000`, `not admitted: ...`).
    #[serde(default)]
    pub admission: String,
    /// Time per phase since it was first seen, up to the end of the latest window.
    pub phase_ms: PhaseValues<u64>,
    /// Recent phase history (the last two minutes, at most 600 spans, fewer when many processes
    /// are listed: see [`SchedulerTelemetry::MAX_SPANS`]), oldest first.
    pub timeline: Vec<PhaseSpan>,
    /// Its command line, clipped (the job's `command` in alerts and `/metrics`).
    #[serde(default)]
    pub cmdline: String,
    /// Its user is not admitted for alerting (`[scheduler.alerting]`): its job is shown and
    /// raises no job alert (a hung collective, input-bound, a step-time regression), so it
    /// neither pages on-call nor keeps incident bundles. `paging` says why, either way.
    #[serde(default)]
    pub untrusted: bool,
    #[serde(default)]
    pub paging: String,
    /// Since when the longest-waiting of its threads has been inside an NCCL collective (or a
    /// synchronize on one); absent when none is.
    #[serde(default)]
    pub collective_waiting_since_ms: Option<UnixMillis>,
    /// When one of its collective calls last returned, as far as the probe has seen.
    #[serde(default)]
    pub collective_returned_ms: Option<UnixMillis>,
    /// NCCL calls its threads have made since it was first seen (each step of a data-parallel
    /// job makes the same calls on every rank).
    #[serde(default)]
    pub collective_calls: u64,
    /// Time one of its threads was inside an NCCL call since it was first seen (exact, from the
    /// probe's call times; the longest of its threads in each window).
    #[serde(default)]
    pub collective_ms: u64,
    /// Time its longest-waiting thread spent runnable but waiting for a CPU, summed over the
    /// windows since it was first seen.
    #[serde(default)]
    pub cpu_wait_ms: u64,
    /// Share of the recent window (`[scheduler] job_window_s`) it spent in each phase, 0-100,
    /// and how much of that window it was observed.
    #[serde(default)]
    pub recent_phase_pct: PhaseValues<f64>,
    #[serde(default)]
    pub recent_observed_ms: u64,
    /// Its step times, where steps are visible (runs of data loading, or of GPU compute, each
    /// starting one).
    #[serde(default)]
    pub steps: Option<StepTimes>,
    /// Who it is beyond this node: its Slurm job, torchrun run or pod, and its rank, as its
    /// cgroup path and environment say (labels only; written by the job's owner).
    #[serde(default, skip_serializing_if = "JobIdentity::is_empty")]
    pub identity: JobIdentity,
}

/// What is known of a process's job across nodes. Every field is optional: each source (the
/// cgroup v2 path, an allow-list of the environment) says what it can. Each text is at most
/// [`JobIdentity::MAX_VALUE`] printable characters without spaces or quotes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct JobIdentity {
    /// Slurm: `SLURM_JOB_ID`, or `job_<id>` in the cgroup path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job: Option<String>,
    /// Slurm step: `SLURM_STEP_ID`, or `step_<id>`, `step_batch`, `step_extern` in the path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_step: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_node: Option<u32>,
    /// torchrun's rendezvous id (`TORCHELASTIC_RUN_ID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Its rank in the job: `RANK`, else `SLURM_PROCID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// `LOCAL_RANK`, else `SLURM_LOCALID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_world_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_rank: Option<u32>,
    /// Kubernetes: the pod's UID (from the cgroup path) and name (`HOSTNAME` inside a pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The container (Kubernetes, Docker, containerd): its 64-hex id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The systemd unit it runs in, outside a pod or a container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
}

impl JobIdentity {
    /// Longest text kept; a longer one is dropped, not cut (a cut id would name another job).
    pub const MAX_VALUE: usize = 64;

    pub fn is_empty(&self) -> bool {
        *self == JobIdentity::default()
    }

    /// The job across nodes: the Slurm job (with its step, when it has one), else the torchrun
    /// run, else the pod. `None`: known to this node only.
    pub fn job_id(&self) -> Option<String> {
        match (&self.slurm_job, &self.slurm_step) {
            (Some(job), Some(step)) => Some(format!("{job}.{step}")),
            (Some(job), None) => Some(job.clone()),
            _ => self.run_id.clone().or_else(|| self.pod_uid.clone()),
        }
    }

    /// Fills what `other` knows and this does not.
    pub fn or(mut self, other: JobIdentity) -> JobIdentity {
        macro_rules! fill {
            ($($field:ident),*) => { $( if self.$field.is_none() { self.$field = other.$field; } )* };
        }
        fill!(
            slurm_job,
            slurm_step,
            slurm_job_name,
            slurm_node,
            run_id,
            rank,
            local_rank,
            world_size,
            local_world_size,
            group_rank,
            pod_uid,
            pod,
            container,
            unit
        );
        self
    }
}

/// A job's step times: over the recent window, and over the hour before it (the baseline).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct StepTimes {
    /// The phase whose runs start a step.
    pub anchor: Phase,
    pub last_ms: u64,
    pub recent_count: u64,
    pub recent_p50_ms: u64,
    pub recent_p99_ms: u64,
    pub hour_count: u64,
    pub hour_p50_ms: u64,
    pub hour_p99_ms: u64,
}

/// A CUDA/NCCL library an ML process maps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct LibraryStatus {
    /// As the process's `maps` names it.
    pub path: String,
    pub state: LibraryState,
    /// Entry points probed, or why it was refused.
    pub detail: String,
}

/// A library a process maps that was not taken as evidence of ML work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct RefusedEvidence {
    pub pid: u32,
    pub comm: String,
    pub path: String,
    pub why: String,
}

/// A thread of an ML process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct MlTaskInfo {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub phase: Phase,
    pub phase_ms: PhaseValues<u64>,
    /// Share of the latest window on a CPU, 0-100.
    pub on_cpu_pct: f64,
    /// Run-queue latency percentiles over the thread's recent wake-ups.
    pub runq_p50_ns: Option<u64>,
    pub runq_p99_ns: Option<u64>,
    /// The features of the latest window, as shares of it (0-1): `cpu`, `read`, `iowait`,
    /// `futex`, `sync`, `nccl`, `ioctl`; `driver`, the share of its timer-tick samples that
    /// found it running the GPU driver's code; and `launches_per_s` (only with the launch
    /// probes attached).
    pub features: BTreeMap<String, f64>,
    pub last_decision: Option<String>,
    /// Its CUDA and NCCL calls so far, as the probes counted them.
    #[serde(default)]
    pub calls: CallCounts,
}

/// A thread's CUDA and NCCL calls, cumulative, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct CallCounts {
    /// Kernel and graph launches: counted only with `[scheduler] launch_probes` (0 otherwise).
    pub launches: u64,
    /// Stream, event and context synchronize calls.
    pub syncs: u64,
    /// Copies the host waits for (device to host).
    pub copies: u64,
    /// NCCL calls: collectives, point-to-point, group ends, communicator set-up and teardown.
    pub nccl: u64,
}

/// What the scheduler decided for a thread, and whether it was applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct Decision {
    pub at_ms: UnixMillis,
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub phase: Phase,
    /// What was (or would be) done, e.g. `nice -5, cpus 0-15 (node 0)`, or `restore`.
    pub action: String,
    pub reason: String,
    /// Applied to the thread (`enforce`), or only recorded (`observe`).
    pub applied: bool,
    pub error: Option<String>,
    /// The decision as a sched_ext backend would carry it out.
    pub nice: i32,
    /// CFS/EEVDF weight of that nice value (1024 at nice 0).
    pub weight: u32,
    pub slice_us: u32,
    /// Preferred CPUs, e.g. `0-15`; empty for any.
    pub cpus: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, Decode, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KernelBackend {
    #[default]
    Cpu,
    Cuda,
}

wire_enum! {
    /// Lifecycle state of a ring kernel.
    #[derive(Default)]
    KernelState {
        #[default]
        Created => "created",
        Launched => "launched",
        Active => "active",
        Deactivated => "deactivated",
        Terminating => "terminating",
        Terminated => "terminated",
        Failed => "failed",
    }
}

/// Telemetry of one ring kernel, with the reference framework's field names.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct RingKernelMetrics {
    pub id: String,
    /// Which built-in kernel this is (`echo`, `stats`, ...).
    pub kernel: String,
    pub backend: KernelBackend,
    pub state: KernelState,
    /// Cumulative.
    pub messages_processed: u64,
    /// Cumulative.
    pub messages_dropped: u64,
    /// Sum of enqueue-to-completion latencies, cumulative.
    pub total_latency_ns: u64,
    /// Absent until the first message completed.
    pub min_latency_ns: Option<u64>,
    pub max_latency_ns: u64,
    /// Latency percentiles from the kernel's own histogram (within 1/32); absent before the
    /// first message.
    pub latency_p50_ns: Option<u64>,
    pub latency_p90_ns: Option<u64>,
    pub latency_p99_ns: Option<u64>,
    pub latency_p999_ns: Option<u64>,
    pub input_queue_depth: u32,
    pub input_queue_capacity: u32,
    pub output_queue_depth: u32,
    pub output_queue_capacity: u32,
    pub last_error: Option<String>,
    pub gpu_memory_used: u64,
    /// Host memory the kernel's rings hold.
    pub host_memory_bytes: u64,
    /// Payload bytes taken in and given out, cumulative.
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub uptime_ms: u64,
    /// `dropped / (processed + dropped)` over the kernel's lifetime, 0-1.
    pub drop_rate: f64,
    /// What a `stats` kernel last computed over everything it was fed; absent for other
    /// kernels and before its first result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_stats: Option<KernelStatsOutput>,
}

/// A `stats` kernel's streaming summary of the samples it was fed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct KernelStatsOutput {
    pub input: StatsInput,
    /// Unit of the figures below.
    pub unit: StatsUnit,
    /// Samples summarised since the kernel started.
    pub count: u64,
    pub mean: f64,
    /// Percentiles from the kernel's histogram (log-linear, within 1/16 of the value).
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// Aggregates over the last `window_ms`, from deltas of cumulative counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct WindowAggregates {
    pub window_ms: u64,
    /// Time actually covered by the samples in the window (shorter just after start-up).
    pub covered_ms: u64,
    pub cpu_avg_pct: Option<f64>,
    pub cpu_max_pct: Option<f64>,
    pub context_switches_per_s: Option<f64>,
    pub kernels: Vec<KernelWindow>,
    pub scheduler: Option<SchedulerWindow>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct KernelWindow {
    pub id: String,
    pub processed: u64,
    pub dropped: u64,
    /// `dropped / (processed + dropped)` within the window; absent when no message arrived.
    pub drop_rate: Option<f64>,
    pub throughput_per_s: f64,
    /// Mean latency of the messages completed within the window.
    pub avg_latency_ns: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct SchedulerWindow {
    pub decisions: u64,
    pub phase_transitions: u64,
    pub decisions_per_s: f64,
}

/// The node's NVIDIA GPUs as NVML reports them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct GpuTelemetry {
    /// NVML answered at the latest tick. `false` with `reason` on a node without the NVIDIA
    /// driver (no `libnvidia-ml.so.1`), where NVML failed to start, or stopped answering.
    pub available: bool,
    pub reason: Option<String>,
    /// The kernel driver's version, e.g. `580.159.04`.
    pub driver_version: Option<String>,
    /// The newest CUDA version the driver supports, e.g. `13.0`.
    pub cuda_driver_version: Option<String>,
    pub nvml_version: Option<String>,
    /// When NVML was last read (it is sampled on its own thread, so a slow driver never holds
    /// up a tick).
    pub sampled_at_ms: Option<UnixMillis>,
    /// XID and double-bit ECC events are watched (NVML's event set is registered on at least
    /// one GPU); without it XIDs are not seen.
    #[serde(default)]
    pub xid_events: bool,
    pub devices: Vec<GpuDevice>,
    /// Why each GPU an ML job uses sat idle over the last minute, by what the job was doing
    /// (see `docs/gpu.md`, "Idle attribution"); at most 64 entries.
    #[serde(default)]
    pub idle: Vec<GpuIdleAttribution>,
}

/// One GPU at one instant. A field the GPU or driver does not report is `null`, and
/// `unsupported` says why under the field's name (`"not supported by this GPU or driver"`,
/// `"needs root"`, ...): absent, never 0.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct GpuDevice {
    /// NVML's index (the order `nvidia-smi` lists them in).
    pub index: u32,
    pub name: String,
    /// `GPU-xxxxxxxx-...`, stable across reboots.
    pub uuid: String,
    /// PCI bus id, `00000000:18:00.0`.
    pub pci_bus_id: String,
    pub numa_node: Option<u32>,
    /// `9.0` on Hopper.
    pub compute_capability: Option<String>,
    /// Busy share of the last sample period, 0-100.
    pub utilization_gpu_pct: Option<f64>,
    /// NVML's own utilisation samples of the last seconds (oldest first), each the busy share
    /// of the period that ended at its time. The idle attribution aligns them with the
    /// scheduler's phase timeline; they stay in the daemon (not sent to clients).
    #[serde(skip)]
    pub utilization_samples: Vec<GpuUtilizationSample>,
    /// Share of the last sample period the memory was read or written, 0-100.
    pub utilization_memory_pct: Option<f64>,
    pub sm_clock_mhz: Option<u32>,
    pub sm_clock_max_mhz: Option<u32>,
    pub memory_clock_mhz: Option<u32>,
    pub memory_clock_max_mhz: Option<u32>,
    pub memory_used_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub temperature_gpu_c: Option<u32>,
    pub temperature_memory_c: Option<u32>,
    /// The temperature at which the GPU starts to slow itself down (NVML's slowdown
    /// threshold); the `temperature` alert fires a margin below it.
    #[serde(default)]
    pub temperature_slowdown_c: Option<u32>,
    pub power_draw_w: Option<f64>,
    /// The limit the driver enforces now.
    pub power_limit_w: Option<f64>,
    /// Energy used since the driver was loaded, cumulative.
    pub energy_j: Option<f64>,
    /// PCIe throughput over NVML's last 20 ms sample.
    pub pcie_tx_bytes_per_s: Option<u64>,
    pub pcie_rx_bytes_per_s: Option<u64>,
    /// PCIe replays, cumulative: a rising count means a bad link or riser.
    pub pcie_replay_count: Option<u64>,
    /// NVLink links reported, and the data they carried (all links), cumulative.
    pub nvlink_links: Option<u32>,
    pub nvlink_tx_bytes: Option<u64>,
    pub nvlink_rx_bytes: Option<u64>,
    /// Why the clocks are held down now. Empty: running free.
    pub throttle_reasons: Option<Vec<ThrottleReason>>,
    /// Since when the hardware has held the clocks down without a break (thermal or HW
    /// slowdown, power brake), as seen by the daemon's readings; absent while running free.
    #[serde(default)]
    pub hw_throttled_since_ms: Option<UnixMillis>,
    /// ECC errors since the driver was loaded.
    pub ecc_corrected_volatile: Option<u64>,
    pub ecc_uncorrected_volatile: Option<u64>,
    /// Pages retired for single- and double-bit errors (older GPUs), and whether a retirement
    /// waits for the next reboot.
    pub retired_pages: Option<u64>,
    pub retired_pages_pending: Option<bool>,
    /// Rows remapped (Ampere and newer), and whether a remap waits for a GPU reset.
    pub remapped_rows_correctable: Option<u64>,
    pub remapped_rows_uncorrectable: Option<u64>,
    pub remapped_rows_pending: Option<bool>,
    pub remapped_rows_failed: Option<bool>,
    pub persistence_mode: Option<bool>,
    pub compute_mode: Option<GpuComputeMode>,
    /// `P0` (fastest) to `P15`.
    pub performance_state: Option<String>,
    /// The latest XID errors the driver reported for this GPU (at most 32, oldest first), and
    /// how many since the daemon started.
    #[serde(default)]
    pub xids: Vec<GpuXid>,
    #[serde(default)]
    pub xid_count: u64,
    /// Compute processes on this GPU (the first 64 NVML lists), by host pid where known.
    #[serde(default)]
    pub processes: Vec<GpuProcess>,
    /// Why each `null` field above is absent, by field name.
    #[serde(default)]
    pub unsupported: BTreeMap<String, String>,
}

/// The idle time of one GPU one ML job uses, split by the job's phase at the time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct GpuIdleAttribution {
    /// The job's main process.
    pub job: u32,
    pub comm: String,
    pub gpu: u32,
    pub uuid: String,
    /// How much of the window the figures cover (the job's observed time).
    pub window_ms: u64,
    /// The end of the time they cover: the newest NVML sample laid over the timeline (aligned),
    /// or the latest tick.
    #[serde(default)]
    pub until_ms: UnixMillis,
    /// Share of that time the GPU was idle, 0-100.
    pub idle_pct: f64,
    /// Share of that time the GPU was idle while the job was in each phase, 0-100; they add
    /// up to `idle_pct`.
    pub idle_by_phase_pct: PhaseValues<f64>,
    /// Share of that time the GPU was idle while a thread of the job waited for a CPU (see
    /// [`PhaseSpan::waiting_for_cpu`]), 0-100; counted here, not under its phase.
    #[serde(default)]
    pub idle_waiting_for_cpu_pct: f64,
    /// The job's last complete training step where steps are visible (aligned only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_step: Option<GpuStepIdle>,
    /// Whether NVML's own utilisation samples were laid over the job's phase timeline (true),
    /// or each tick's utilisation spread over the tick's phase times (false: the GPU or
    /// driver keeps no samples).
    #[serde(default)]
    pub aligned: bool,
}

impl GpuIdleAttribution {
    /// "GPU 0 idle 38% of the last minute: 30% waiting for data, 8% in the optimizer step".
    pub fn describe(&self) -> String {
        format!(
            "GPU {} idle {}% of the last minute{}",
            self.gpu,
            crate::fixed(self.idle_pct, 0),
            split_words(&self.idle_by_phase_pct, self.idle_waiting_for_cpu_pct)
        )
    }
}

/// A GPU's idle time over one training step of a job: from one start of the phase that begins
/// each of its cycles (data loading, or GPU compute for a job whose data loading is hidden) to
/// the next.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct GpuStepIdle {
    pub start_ms: UnixMillis,
    pub end_ms: UnixMillis,
    /// The phase whose starts delimit the steps.
    pub anchor: Phase,
    /// Share of the step the GPU was idle, 0-100, and split as in [`GpuIdleAttribution`].
    pub idle_pct: f64,
    pub idle_by_phase_pct: PhaseValues<f64>,
    pub idle_waiting_for_cpu_pct: f64,
}

impl GpuStepIdle {
    /// "last step 6.0 s, GPU idle 75%: 26% waiting for data, ...".
    pub fn describe(&self) -> String {
        format!(
            "last step {} s, GPU idle {}%{}",
            crate::fixed(self.end_ms.saturating_sub(self.start_ms) as f64 / 1000.0, 1),
            crate::fixed(self.idle_pct, 0),
            split_words(&self.idle_by_phase_pct, self.idle_waiting_for_cpu_pct)
        )
    }
}

/// ": 30% waiting for data, 8% in the optimizer step" (shares of 0.5 % or more, largest first).
fn split_words(by_phase: &PhaseValues<f64>, waiting_for_cpu: f64) -> String {
    let words = |phase: Phase| match phase {
        Phase::DataLoading => "waiting for data",
        Phase::GpuCompute => "while computing",
        Phase::NcclCollective => "in a collective",
        Phase::OptimizerStep => "in the optimizer step",
        Phase::Unknown => "unknown",
    };
    let mut parts: Vec<(f64, &str)> = Phase::ALL.iter().map(|p| (by_phase.get(*p), words(*p))).collect();
    parts.push((waiting_for_cpu, "waiting for a CPU"));
    parts.sort_by(|x, y| y.0.total_cmp(&x.0));
    let parts: Vec<String> = parts
        .into_iter()
        .filter(|(pct, _)| *pct >= 0.5)
        .map(|(pct, w)| format!("{}% {w}", crate::fixed(pct, 0)))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join(", "))
    }
}

/// One of NVML's utilisation samples: the GPU's busy share of the period that ended at `at_us`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpuUtilizationSample {
    /// The end of the sample's period, Unix µs (NVML's CPU timestamp).
    pub at_us: u64,
    /// 0-100.
    pub busy_pct: f64,
}

/// An XID error: the driver's code for what went wrong with a GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct GpuXid {
    pub code: u64,
    pub at_ms: UnixMillis,
    /// What the code means, where it is one of the well-known ones.
    pub description: Option<String>,
}

/// A process using a GPU, as NVML sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct GpuProcess {
    /// The pid NVML gives (the host's, for processes in containers too).
    pub pid: u32,
    /// Its pid inside its own PID namespace (a container's), from `/proc/<pid>/status`
    /// `NSpid`, where that differs from `pid`.
    #[serde(default)]
    pub namespace_pid: Option<u32>,
    /// GPU memory the process holds; absent where the driver does not say (MIG, WDDM).
    pub gpu_memory_bytes: Option<u64>,
    /// Its share of the GPU's SMs and of memory bandwidth over the last seconds, 0-100;
    /// absent without a recent sample.
    pub sm_utilization_pct: Option<f64>,
    pub memory_utilization_pct: Option<f64>,
}
