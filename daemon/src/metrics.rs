//! Every metric the daemon exposes, declared once: its Prometheus name, kind, unit, help and
//! labels, the names `[[rules]]` know it by, and how its values are read from a tick. The
//! `/metrics` exposition ([`crate::prometheus`]), the rule engine's metric names and values
//! ([`crate::alerts::rules`]), the built-in alert conditions' readings and the metric list in
//! the snapshot's config summary all derive from [`ALL`].
//!
//! Adding a metric is one entry in [`ALL`] (plus the field its source fills): see
//! `docs/architecture.md`, "Adding a metric". Values are in base units (ratios 0-1, seconds,
//! bytes, hertz, watts, joules); a rule name gives its own scale (`gpu.utilization_pct` is the
//! ratio times 100, `kernel.avg_latency_ms` the seconds times 1000).

use std::sync::atomic::{AtomicU64, Ordering};

use ringside_shared::{
    Alert, ComponentHealth, ComponentStatus, GpuDevice, GpuIdleAttribution, GpuTelemetry, HostMetrics, KernelBackend,
    KernelWindow, MetricSummary, MlProcessInfo, Phase, PhaseValues, Rank, Readings, RingKernelMetrics,
    SchedulerTelemetry, Severity, StatsInput, ThrottleReason, WindowAggregates,
};

use crate::pipeline::Sample;

/// Counters about the daemon itself, kept by the server, the collection loop and the
/// Alertmanager forwarder.
#[derive(Debug, Default)]
pub struct DaemonStats {
    pub ws_clients: AtomicU64,
    pub ws_connections_total: AtomicU64,
    pub ws_resyncs_total: AtomicU64,
    pub ws_refused_total: AtomicU64,
    pub ws_error_frames_total: AtomicU64,
    /// Requests refused: no or a wrong token, or a cookie-authenticated change from elsewhere.
    pub auth_failures_total: AtomicU64,
    /// Failed authentications answered 429: their address was over its budget.
    pub auth_throttled_total: AtomicU64,
    /// Connections accepted, and refused because the cap was reached.
    pub http_connections_total: AtomicU64,
    pub http_connections_refused_total: AtomicU64,
    /// Connections that had not authenticated, closed to make room for a new one.
    pub http_connections_evicted_total: AtomicU64,
    pub http_connections_open: AtomicU64,
    pub ticks_total: AtomicU64,
    pub last_collect_ns: AtomicU64,
    pub alertmanager_sent_total: AtomicU64,
    pub alertmanager_errors_total: AtomicU64,
    pub alertmanager_dropped_total: AtomicU64,
    /// TLS handshakes that failed or did not finish in time (plain HTTP to an HTTPS port...).
    pub tls_handshake_failures_total: AtomicU64,
    /// Incident bundles kept on disk, their bytes, and bundles dropped (not written).
    pub incident_bundles: AtomicU64,
    pub incident_bundle_bytes: AtomicU64,
    pub incident_bundles_dropped_total: AtomicU64,
    /// The history: series held, memory of its chunks, bytes of its directory, values not kept.
    pub history_series: AtomicU64,
    pub history_memory_bytes: AtomicU64,
    pub history_disk_bytes: AtomicU64,
    pub history_dropped_total: AtomicU64,
    pub history_write_errors_total: AtomicU64,
    pub history_trimmed_total: AtomicU64,
    /// File descriptors the daemon holds, and its soft open-file limit.
    pub open_fds: AtomicU64,
    pub fd_limit: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
    /// Quantiles (a `quantile` label; no `_sum` or `_count`), as Prometheus types series with
    /// that label: its linter refuses a `quantile` label on any other type.
    Summary,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Summary => "summary",
        }
    }
}

/// The unit of a metric's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// 0-1.
    Ratio,
    /// 0-100 (names kept from the reference scheduler's series).
    Percent,
    Seconds,
    Bytes,
    BytesPerSecond,
    PerSecond,
    Hertz,
    Celsius,
    Watts,
    Joules,
    /// A count, a state (1 up, 0.5 degraded, 0 down) or an info series (always 1).
    Number,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Ratio => "ratio",
            Unit::Percent => "percent",
            Unit::Seconds => "seconds",
            Unit::Bytes => "bytes",
            Unit::BytesPerSecond => "bytes/s",
            Unit::PerSecond => "1/s",
            Unit::Hertz => "hertz",
            Unit::Celsius => "celsius",
            Unit::Watts => "watts",
            Unit::Joules => "joules",
            Unit::Number => "number",
        }
    }
}

/// A name `[[rules]]` know a metric by: the series whose labels match `select`, times `scale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RuleName {
    pub name: &'static str,
    pub select: &'static [(&'static str, &'static str)],
    pub scale: f64,
}

const fn rule(name: &'static str, scale: f64) -> RuleName {
    RuleName { name, select: &[], scale }
}

/// What a metric's value, an alert condition or an alert is about. Its text ([`Display`]) is
/// an alert's `source` on the wire, in the database and in silences.
///
/// [`Display`]: std::fmt::Display
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// `host`
    Host,
    /// `daemon`: the daemon's own figures.
    Daemon,
    /// `scheduler`
    Scheduler,
    /// `scheduler:sched_ext`: the sched_ext scheduler the daemon loaded.
    SchedExt,
    /// `kernel:<id>`: a ring kernel.
    Kernel(String),
    /// `gpu:<index>`
    Gpu(u32),
    /// `gpu:<index>/<check>`: one kind of trouble on one GPU, each its own alert.
    GpuCheck(u32, &'static str),
    /// `job:<pid>`: an ML job, by its main process.
    Job(u32),
    /// `job:<pid>/gpu:<index>`: an ML job on one GPU.
    JobGpu { job: u32, gpu: u32 },
    /// `source:<name>`: one of the daemon's metrics sources.
    Component(String),
}

impl Source {
    /// The ML job this is about, if any.
    pub fn job(&self) -> Option<u32> {
        match self {
            Source::Job(job) | Source::JobGpu { job, .. } => Some(*job),
            _ => None,
        }
    }

    /// Its shape, as the docs write it (`kernel:<id>`).
    pub fn pattern(&self) -> &'static str {
        match self {
            Source::Host => "host",
            Source::Daemon => "daemon",
            Source::Scheduler => "scheduler",
            Source::SchedExt => "scheduler:sched_ext",
            Source::Kernel(_) => "kernel:<id>",
            Source::Gpu(_) => "gpu:<index>",
            Source::GpuCheck(..) => "gpu:<index>/<kind>",
            Source::Job(_) => "job:<pid>",
            Source::JobGpu { .. } => "job:<pid>/gpu:<index>",
            Source::Component(_) => "source:<name>",
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Host | Source::Daemon | Source::Scheduler | Source::SchedExt => f.write_str(self.pattern()),
            Source::Kernel(id) => write!(f, "kernel:{id}"),
            Source::Gpu(index) => write!(f, "gpu:{index}"),
            Source::GpuCheck(index, check) => write!(f, "gpu:{index}/{check}"),
            Source::Job(job) => write!(f, "job:{job}"),
            Source::JobGpu { job, gpu } => write!(f, "job:{job}/gpu:{gpu}"),
            Source::Component(name) => write!(f, "source:{name}"),
        }
    }
}

/// One value of a metric: its label values (in the order of [`Def::labels`]) and, for rules
/// and alerts, what it is about.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub source: Source,
    pub labels: Vec<String>,
    pub value: f64,
}

/// What a tick (or the snapshot a scrape reads) holds, as the metrics read it.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub readings: &'a Readings,
    pub components: &'a [ComponentHealth],
    pub alerts: &'a [Alert],
    pub daemon: Option<&'a DaemonStats>,
    /// When the tick was taken (Unix ms): what "for how long" is measured to.
    pub now_ms: u64,
}

impl<'a> View<'a> {
    /// A tick's readings taken at `now_ms`, with nothing else.
    pub fn of(readings: &'a Readings, now_ms: u64) -> View<'a> {
        View { readings, components: &[], alerts: &[], daemon: None, now_ms }
    }

    /// A tick's sample, its window included (what rules and conditions read).
    pub fn of_sample(sample: &'a Sample) -> View<'a> {
        View::of(&sample.readings, sample.taken_at_ms)
    }

    pub fn host(&self) -> Option<&'a HostMetrics> {
        self.readings.host.as_ref()
    }

    pub fn scheduler(&self) -> Option<&'a SchedulerTelemetry> {
        self.readings.scheduler.as_ref()
    }

    pub fn kernels(&self) -> &'a [RingKernelMetrics] {
        &self.readings.kernels
    }

    pub fn gpus(&self) -> Option<&'a GpuTelemetry> {
        self.readings.gpus.as_ref()
    }

    pub fn window(&self) -> &'a WindowAggregates {
        &self.readings.window
    }

    fn gpu_devices(&self) -> &'a [GpuDevice] {
        self.gpus().map(|g| g.devices.as_slice()).unwrap_or_default()
    }

    fn idle(&self) -> &'a [GpuIdleAttribution] {
        self.gpus().map(|g| g.idle.as_slice()).unwrap_or_default()
    }
}

type Read = fn(&View, &mut Vec<Point>);

/// One metric family.
pub struct Def {
    /// The Prometheus name.
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Unit,
    pub help: &'static str,
    pub labels: &'static [&'static str],
    /// Its names in `[[rules]]`, if rules may use it.
    pub rules: &'static [RuleName],
    read: Read,
}

impl Def {
    /// Its values in `view` (none where the source is absent or did not report the field).
    pub fn points(&self, view: &View) -> Vec<Point> {
        let mut points = Vec::new();
        (self.read)(view, &mut points);
        points
    }
}

/// A metric as a rule names it.
#[derive(Clone, Copy)]
pub struct RuleMetric {
    pub def: &'static Def,
    pub rule: &'static RuleName,
}

impl std::fmt::Debug for RuleMetric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.rule.name)
    }
}

impl PartialEq for RuleMetric {
    fn eq(&self, other: &Self) -> bool {
        self.rule.name == other.rule.name
    }
}

impl RuleMetric {
    /// The metric `[[rules]]` call `name`.
    pub fn find(name: &str) -> Option<RuleMetric> {
        ALL.iter().find_map(|def| def.rules.iter().find(|r| r.name == name).map(|rule| RuleMetric { def, rule }))
    }

    /// Every name rules may use.
    pub fn names() -> impl Iterator<Item = &'static str> {
        ALL.iter().flat_map(|def| def.rules.iter().map(|r| r.name))
    }

    pub fn name(&self) -> &'static str {
        self.rule.name
    }

    /// Whether `p`, a point of this metric's family, is a series the name selects.
    pub fn selects(&self, p: &Point) -> bool {
        self.rule.select.iter().all(|(label, value)| {
            let at = self.def.labels.iter().position(|l| l == label);
            at.and_then(|i| p.labels.get(i)).is_some_and(|v| v == value)
        })
    }

    /// (source, value in the rule's scale) for every series the name selects. A job of a user
    /// not admitted for alerting (`[scheduler.alerting]`) has none: a rule on `job.*` raises
    /// nothing for it, as the built-in job alerts do not.
    pub fn values(&self, view: &View) -> Vec<(Source, f64)> {
        let selected = |p: &Point| self.selects(p);
        let untrusted: Vec<u32> = jobs(view).iter().filter(|j| j.main.untrusted).map(|j| j.main.job).collect();
        let trusted = |p: &Point| p.source.job().is_none_or(|job| !untrusted.contains(&job));
        self.def
            .points(view)
            .into_iter()
            .filter(|p| selected(p) && trusted(p))
            .map(|p| (p.source, p.value * self.rule.scale))
            .collect()
    }
}

/// Every metric usable in rules, for the snapshot's config summary.
pub fn summaries() -> Vec<MetricSummary> {
    ALL.iter()
        .flat_map(|def| {
            def.rules.iter().map(|r| MetricSummary {
                name: r.name.to_string(),
                prometheus: def.name.to_string(),
                select: r.select.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                unit: def.unit.as_str().to_string(),
                scale: r.scale,
                help: def.help.to_string(),
            })
        })
        .collect()
}

fn point(out: &mut Vec<Point>, source: Source, labels: Vec<String>, value: f64) {
    out.push(Point { source, labels, value });
}

fn daemon(v: &View, out: &mut Vec<Point>, counter: fn(&DaemonStats) -> &AtomicU64, scale: f64) {
    if let Some(stats) = v.daemon {
        point(out, Source::Daemon, vec![], counter(stats).load(Ordering::Relaxed) as f64 * scale);
    }
}

fn host(v: &View, out: &mut Vec<Point>, value: fn(&HostMetrics) -> Option<f64>) {
    if let Some(value) = v.host().and_then(value) {
        point(out, Source::Host, vec![], value);
    }
}

fn scheduler(v: &View, out: &mut Vec<Point>, value: fn(&SchedulerTelemetry) -> f64) {
    if let Some(s) = v.scheduler() {
        point(out, Source::Scheduler, vec![], value(s));
    }
}

/// Per ML process and phase.
fn per_process_phase(v: &View, out: &mut Vec<Point>, value: fn(&MlProcessInfo, Phase) -> f64) {
    for p in v.scheduler().map(|s| s.processes.as_slice()).unwrap_or_default() {
        for phase in Phase::ALL {
            let labels = vec![p.pid.to_string(), p.job.to_string(), p.comm.clone(), phase.as_str().to_string()];
            point(out, Source::Scheduler, labels, value(p, phase));
        }
    }
}

fn backend(k: &RingKernelMetrics) -> &'static str {
    match k.backend {
        KernelBackend::Cuda => "cuda",
        KernelBackend::Cpu => "cpu",
    }
}

/// Per ring kernel, labelled `kernel` and `backend`.
fn kernel(v: &View, out: &mut Vec<Point>, value: fn(&RingKernelMetrics) -> Option<f64>) {
    for k in v.kernels() {
        if let Some(value) = value(k) {
            point(out, Source::Kernel(k.id.clone()), vec![k.id.clone(), backend(k).into()], value);
        }
    }
}

/// Per ring kernel over the window, labelled `kernel`.
fn kernel_window(v: &View, out: &mut Vec<Point>, value: fn(&KernelWindow) -> Option<f64>) {
    for k in v.kernels() {
        let Some(w) = v.window().kernels.iter().find(|w| w.id == k.id) else { continue };
        if let Some(value) = value(w) {
            point(out, Source::Kernel(k.id.clone()), vec![k.id.clone()], value);
        }
    }
}

/// What `stats` kernels summarised from one input, per statistic.
fn kernel_stats(v: &View, out: &mut Vec<Point>, input: StatsInput, per_unit: f64) {
    for k in v.kernels() {
        let Some(s) = k.output_stats.as_ref().filter(|s| s.input == input) else { continue };
        for (stat, value) in [("mean", s.mean), ("p50", s.p50), ("p90", s.p90), ("p99", s.p99), ("max", s.max)] {
            point(out, Source::Kernel(k.id.clone()), vec![k.id.clone(), stat.into()], value / per_unit);
        }
    }
}

/// Per GPU, labelled `gpu` (NVML index) and `uuid`; a field the GPU does not report has no point.
fn gpu(v: &View, out: &mut Vec<Point>, value: fn(&GpuDevice) -> Option<f64>) {
    for g in v.gpu_devices() {
        if let Some(value) = value(g) {
            point(out, Source::Gpu(g.index), vec![g.index.to_string(), g.uuid.clone()], value);
        }
    }
}

/// Per ML job and GPU, labelled `job`, `comm`, `gpu`, `uuid` (and `phase`, when `by_phase`
/// gives the shares: the five phases and `waiting_for_cpu`, in percent).
/// A job's idle shares by phase (percent), and its share waiting for a CPU.
type IdleSplit = fn(&GpuIdleAttribution) -> Option<(&PhaseValues<f64>, f64)>;

fn job_gpu(v: &View, out: &mut Vec<Point>, by_phase: IdleSplit) {
    for a in v.idle() {
        let Some((shares, waiting)) = by_phase(a) else { continue };
        let phases = Phase::ALL.iter().map(|p| (p.as_str(), shares.get(*p))).chain([("waiting_for_cpu", waiting)]);
        for (phase, pct) in phases {
            let labels = vec![a.job.to_string(), a.comm.clone(), a.gpu.to_string(), a.uuid.clone(), phase.into()];
            point(out, Source::JobGpu { job: a.job, gpu: a.gpu }, labels, pct / 100.0);
        }
    }
}

fn job_gpu_value(v: &View, out: &mut Vec<Point>, value: fn(&GpuIdleAttribution) -> Option<f64>) {
    for a in v.idle() {
        if let Some(value) = value(a) {
            let labels = vec![a.job.to_string(), a.comm.clone(), a.gpu.to_string(), a.uuid.clone()];
            point(out, Source::JobGpu { job: a.job, gpu: a.gpu }, labels, value);
        }
    }
}

/// An ML job as the scheduler sees it: its main process (the job's pid) and every process of
/// it (workers included).
pub struct Job<'a> {
    pub main: &'a MlProcessInfo,
    pub members: Vec<&'a MlProcessInfo>,
}

impl Job<'_> {
    /// `job`, `comm` and `command` label values.
    pub fn labels(&self) -> Vec<String> {
        vec![self.main.job.to_string(), self.main.comm.clone(), self.main.cmdline.clone()]
    }

    pub fn source(&self) -> Source {
        Source::Job(self.main.job)
    }

    /// How long (s) the job has waited in a collective with none of its collectives returning:
    /// from the later of when its longest wait began and when a collective last returned; 0
    /// while none of its threads is in one.
    pub fn collective_stalled_s(&self, now_ms: u64) -> f64 {
        let waiting = self.members.iter().filter_map(|p| p.collective_waiting_since_ms).min();
        let returned = self.members.iter().filter_map(|p| p.collective_returned_ms).max().unwrap_or(0);
        waiting.map_or(0.0, |since| now_ms.saturating_sub(since.max(returned)) as f64 / 1000.0)
    }
}

/// The ML jobs the scheduler lists, by job: a job whose main process is not listed is led by
/// its lowest pid.
pub fn jobs<'a>(v: &View<'a>) -> Vec<Job<'a>> {
    let mut jobs: std::collections::BTreeMap<u32, Vec<&'a MlProcessInfo>> = std::collections::BTreeMap::new();
    for p in v.scheduler().map(|s| s.processes.as_slice()).unwrap_or_default() {
        jobs.entry(p.job).or_default().push(p);
    }
    jobs.into_iter()
        .filter_map(|(job, mut members)| {
            members.sort_by_key(|p| (p.pid != job, p.pid));
            Some(Job { main: *members.first()?, members })
        })
        .collect()
}

/// The ranks of jobs across nodes on this node ([`SchedulerTelemetry::ranks`]) whose users may
/// page: the fleet's rules page on-call from these series, and a user not admitted for
/// alerting (`[scheduler.alerting]`) must not page it with a process that claims a rank and sits
/// in an NCCL call of its own making.
fn ranks<'a>(v: &View<'a>) -> Vec<Rank<'a>> {
    let mut ranks = v.scheduler().map(|s| s.ranks()).unwrap_or_default();
    ranks.retain(|r| !r.process.untrusted);
    ranks
}

fn rank_point(out: &mut Vec<Point>, rank: &Rank, extra: &[&str], value: f64) {
    let mut labels = vec![rank.job_id.clone(), rank.rank.to_string()];
    labels.extend(extra.iter().map(|l| l.to_string()));
    point(out, Source::Job(rank.process.job), labels, value);
}

fn job_point(out: &mut Vec<Point>, job: &Job, extra: &[&str], value: f64) {
    let mut labels = job.labels();
    labels.extend(extra.iter().map(|l| l.to_string()));
    point(out, job.source(), labels, value);
}

fn ratio(pct: f64) -> f64 {
    pct / 100.0
}

const KERNEL: &[&str] = &["kernel", "backend"];
const GPU: &[&str] = &["gpu", "uuid"];
const JOB_GPU: &[&str] = &["job", "comm", "gpu", "uuid"];
const JOB_GPU_PHASE: &[&str] = &["job", "comm", "gpu", "uuid", "phase"];
const PROCESS_PHASE: &[&str] = &["pid", "job", "comm", "phase"];
const JOB: &[&str] = &["job", "comm", "command"];
const RANK: &[&str] = &["job_id", "rank"];
const RANK_PHASE: &[&str] = &["job_id", "rank", "phase"];
const JOB_PHASE: &[&str] = &["job", "comm", "command", "phase"];

macro_rules! daemon_counter {
    ($name:literal, $kind:expr, $help:literal, $field:ident) => {
        Def {
            name: $name,
            kind: $kind,
            unit: Unit::Number,
            help: $help,
            labels: &[],
            rules: &[],
            read: |v, out| daemon(v, out, |s| &s.$field, 1.0),
        }
    };
}

/// Every metric, in exposition order.
pub static ALL: &[Def] = &[
    Def {
        name: "ringside_build_info",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "Version of ringsided; always 1.",
        labels: &["version"],
        rules: &[],
        read: |_, out| point(out, Source::Daemon, vec![env!("CARGO_PKG_VERSION").into()], 1.0),
    },
    Def {
        name: "ringside_component_up",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "1 when a component is up, 0.5 when degraded, 0 when down.",
        labels: &["component"],
        rules: &[],
        read: |v, out| {
            for c in v.components {
                let value = match c.status {
                    ComponentStatus::Up => 1.0,
                    ComponentStatus::Degraded => 0.5,
                    ComponentStatus::Down => 0.0,
                    // Not on this node (a GPU source without a driver): no series.
                    ComponentStatus::Absent => continue,
                };
                point(out, Source::Component(c.name.clone()), vec![c.name.clone()], value);
            }
        },
    },
    daemon_counter!("ringside_collection_ticks_total", Kind::Counter, "Collection ticks run.", ticks_total),
    Def {
        name: "ringside_collection_duration_seconds",
        kind: Kind::Gauge,
        unit: Unit::Seconds,
        help: "Time the latest collection tick took.",
        labels: &[],
        rules: &[],
        read: |v, out| daemon(v, out, |s| &s.last_collect_ns, 1e-9),
    },
    daemon_counter!("ringside_ws_clients", Kind::Gauge, "Connected WebSocket clients.", ws_clients),
    daemon_counter!(
        "ringside_ws_connections_total",
        Kind::Counter,
        "WebSocket connections accepted.",
        ws_connections_total
    ),
    daemon_counter!(
        "ringside_auth_failures_total",
        Kind::Counter,
        "Requests refused for a missing or wrong token, or a cookie-authenticated change from another origin.",
        auth_failures_total
    ),
    daemon_counter!(
        "ringside_auth_throttled_total",
        Kind::Counter,
        "Failed authentications answered 429: their client address was over its budget.",
        auth_throttled_total
    ),
    daemon_counter!("ringside_http_connections_open", Kind::Gauge, "Open HTTP connections.", http_connections_open),
    daemon_counter!(
        "ringside_http_connections_total",
        Kind::Counter,
        "HTTP connections accepted.",
        http_connections_total
    ),
    daemon_counter!(
        "ringside_http_connections_refused_total",
        Kind::Counter,
        "HTTP connections closed at once: every slot they could take was held by an authenticated client.",
        http_connections_refused_total
    ),
    daemon_counter!(
        "ringside_http_connections_evicted_total",
        Kind::Counter,
        "Connections that had not authenticated, closed to make room for a new one (max_connections or max_connections_per_address reached).",
        http_connections_evicted_total
    ),
    daemon_counter!(
        "ringside_tls_handshake_failures_total",
        Kind::Counter,
        "TLS handshakes that failed or did not finish within the header timeout.",
        tls_handshake_failures_total
    ),
    daemon_counter!(
        "ringside_ws_refused_total",
        Kind::Counter,
        "WebSocket handshakes refused (token or origin).",
        ws_refused_total
    ),
    daemon_counter!(
        "ringside_ws_resyncs_total",
        Kind::Counter,
        "Full snapshots sent to clients that fell behind the broadcast.",
        ws_resyncs_total
    ),
    daemon_counter!(
        "ringside_ws_error_frames_total",
        Kind::Counter,
        "Error frames sent in answer to bad client commands.",
        ws_error_frames_total
    ),
    daemon_counter!(
        "ringside_alertmanager_sent_total",
        Kind::Counter,
        "Alerts delivered to Alertmanager.",
        alertmanager_sent_total
    ),
    daemon_counter!(
        "ringside_alertmanager_errors_total",
        Kind::Counter,
        "Failed deliveries to Alertmanager.",
        alertmanager_errors_total
    ),
    daemon_counter!(
        "ringside_alertmanager_dropped_total",
        Kind::Counter,
        "Alert changes dropped because the Alertmanager queue was full.",
        alertmanager_dropped_total
    ),
    daemon_counter!(
        "ringside_incident_bundles",
        Kind::Gauge,
        "Incident bundles kept in the data dir.",
        incident_bundles
    ),
    daemon_counter!(
        "ringside_incident_bundle_bytes",
        Kind::Gauge,
        "Bytes of the incident bundles kept in the data dir.",
        incident_bundle_bytes
    ),
    daemon_counter!(
        "ringside_history_series",
        Kind::Gauge,
        "Series the history holds (every rule metric of every source, and the kernels' latency quantiles).",
        history_series
    ),
    daemon_counter!(
        "ringside_history_memory_bytes",
        Kind::Gauge,
        "Memory the history's compressed chunks take (bounded by [history] max_memory_bytes).",
        history_memory_bytes
    ),
    daemon_counter!(
        "ringside_history_disk_bytes",
        Kind::Gauge,
        "Bytes of the history directory (bounded by [history] max_disk_bytes).",
        history_disk_bytes
    ),
    daemon_counter!(
        "ringside_history_dropped_total",
        Kind::Counter,
        "Values the history did not keep (series past max_series, the clock gone back, not finite), plus one per fine chunk evicted early to stay within memory.",
        history_dropped_total
    ),
    daemon_counter!(
        "ringside_history_write_errors_total",
        Kind::Counter,
        "History files that could not be written (the `history` component says why while it lasts).",
        history_write_errors_total
    ),
    daemon_counter!(
        "ringside_history_trimmed_total",
        Kind::Counter,
        "History files removed before their age to stay within [history] max_disk_bytes.",
        history_trimmed_total
    ),
    daemon_counter!(
        "ringside_open_fds",
        Kind::Gauge,
        "File descriptors the daemon holds (sockets, files, BPF maps, programs and links).",
        open_fds
    ),
    daemon_counter!(
        "ringside_fd_limit",
        Kind::Gauge,
        "The daemon's soft open-file limit (raised to the hard one at start). Uprobes are refused past half of it.",
        fd_limit
    ),
    daemon_counter!(
        "ringside_incident_bundles_dropped_total",
        Kind::Counter,
        "Incident bundles not written: the writer was behind, a bundle was larger than max_bytes, a write failed, or more were recording than max_count.",
        incident_bundles_dropped_total
    ),
    Def {
        name: "ringside_alerts_active",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "Active alerts by severity.",
        labels: &["severity"],
        rules: &[],
        read: |v, out| {
            if v.daemon.is_none() {
                return;
            }
            for severity in [Severity::Info, Severity::Warning, Severity::Error, Severity::Critical] {
                let count = v.alerts.iter().filter(|a| a.is_active() && a.severity == severity).count();
                point(out, Source::Daemon, vec![severity.as_str().into()], count as f64);
            }
        },
    },
    // The host.
    Def {
        name: "ringside_host_cpu_utilization_ratio",
        kind: Kind::Gauge,
        unit: Unit::Ratio,
        help: "Busy share of all CPUs over the last tick (0-1).",
        labels: &[],
        rules: &[rule("host.cpu_utilization_pct", 100.0)],
        read: |v, out| host(v, out, |h| Some(ratio(h.cpu_utilization_pct))),
    },
    Def {
        name: "ringside_host_cpu_core_utilization_ratio",
        kind: Kind::Gauge,
        unit: Unit::Ratio,
        help: "Busy share of each CPU over the last tick (0-1).",
        labels: &["cpu"],
        rules: &[],
        read: |v, out| {
            for (cpu, pct) in
                v.host().map(|h| h.per_cpu_utilization_pct.as_slice()).unwrap_or_default().iter().enumerate()
            {
                point(out, Source::Host, vec![cpu.to_string()], ratio(*pct));
            }
        },
    },
    Def {
        name: "ringside_host_cpu_iowait_ratio",
        kind: Kind::Gauge,
        unit: Unit::Ratio,
        help: "Share of CPU time waiting for I/O over the last tick (0-1).",
        labels: &[],
        rules: &[rule("host.iowait_pct", 100.0)],
        read: |v, out| host(v, out, |h| Some(ratio(h.iowait_pct))),
    },
    Def {
        name: "ringside_host_load1",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "1-minute load average.",
        labels: &[],
        rules: &[rule("host.load1", 1.0)],
        read: |v, out| host(v, out, |h| Some(h.load1)),
    },
    Def {
        name: "ringside_host_load5",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "5-minute load average.",
        labels: &[],
        rules: &[rule("host.load5", 1.0)],
        read: |v, out| host(v, out, |h| Some(h.load5)),
    },
    Def {
        name: "ringside_host_load15",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "15-minute load average.",
        labels: &[],
        rules: &[rule("host.load15", 1.0)],
        read: |v, out| host(v, out, |h| Some(h.load15)),
    },
    Def {
        name: "ringside_host_memory_total_bytes",
        kind: Kind::Gauge,
        unit: Unit::Bytes,
        help: "Physical memory.",
        labels: &[],
        rules: &[],
        read: |v, out| host(v, out, |h| Some(h.memory.total_bytes as f64)),
    },
    Def {
        name: "ringside_host_memory_available_bytes",
        kind: Kind::Gauge,
        unit: Unit::Bytes,
        help: "Memory available to new work.",
        labels: &[],
        rules: &[],
        read: |v, out| host(v, out, |h| Some(h.memory.available_bytes as f64)),
    },
    Def {
        name: "ringside_host_memory_used_bytes",
        kind: Kind::Gauge,
        unit: Unit::Bytes,
        help: "Memory in use (total - available).",
        labels: &[],
        rules: &[],
        read: |v, out| host(v, out, |h| Some(h.memory.used_bytes as f64)),
    },
    Def {
        name: "ringside_host_memory_used_ratio",
        kind: Kind::Gauge,
        unit: Unit::Ratio,
        help: "Share of physical memory in use (0-1).",
        labels: &[],
        rules: &[rule("host.memory_used_pct", 100.0)],
        read: |v, out| host(v, out, |h| Some(ratio(h.memory.used_pct))),
    },
    Def {
        name: "ringside_host_swap_used_bytes",
        kind: Kind::Gauge,
        unit: Unit::Bytes,
        help: "Swap in use.",
        labels: &[],
        rules: &[rule("host.swap_used_bytes", 1.0)],
        read: |v, out| host(v, out, |h| Some(h.memory.swap_used_bytes as f64)),
    },
    Def {
        name: "ringside_host_context_switches_total",
        kind: Kind::Counter,
        unit: Unit::Number,
        help: "Context switches since boot.",
        labels: &[],
        rules: &[],
        read: |v, out| host(v, out, |h| Some(h.context_switches_total as f64)),
    },
    Def {
        name: "ringside_host_procs_running",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "Runnable tasks.",
        labels: &[],
        rules: &[],
        read: |v, out| host(v, out, |h| Some(f64::from(h.procs_running))),
    },
    Def {
        name: "ringside_host_procs_blocked",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "Tasks blocked on I/O.",
        labels: &[],
        rules: &[rule("host.procs_blocked", 1.0)],
        read: |v, out| host(v, out, |h| Some(f64::from(h.procs_blocked))),
    },
    Def {
        name: "ringside_host_pressure_avg10_ratio",
        kind: Kind::Gauge,
        unit: Unit::Ratio,
        help: "Pressure stall information, 10 s average (0-1).",
        labels: &["resource", "kind"],
        rules: &[
            RuleName {
                name: "host.pressure.cpu_some_avg10",
                select: &[("resource", "cpu"), ("kind", "some")],
                scale: 100.0,
            },
            RuleName {
                name: "host.pressure.memory_some_avg10",
                select: &[("resource", "memory"), ("kind", "some")],
                scale: 100.0,
            },
            RuleName {
                name: "host.pressure.io_some_avg10",
                select: &[("resource", "io"), ("kind", "some")],
                scale: 100.0,
            },
        ],
        read: |v, out| {
            let Some(p) = v.host().and_then(|h| h.pressure.as_ref()) else { return };
            for (resource, kind, pct) in [
                ("cpu", "some", p.cpu_some_avg10),
                ("memory", "some", p.memory_some_avg10),
                ("memory", "full", p.memory_full_avg10),
                ("io", "some", p.io_some_avg10),
            ] {
                point(out, Source::Host, vec![resource.into(), kind.into()], ratio(pct));
            }
        },
    },
    Def {
        name: "ringside_host_numa_memory_free_bytes",
        kind: Kind::Gauge,
        unit: Unit::Bytes,
        help: "Free memory per NUMA node.",
        labels: &["node"],
        rules: &[],
        read: |v, out| {
            for node in v.host().map(|h| h.numa.as_slice()).unwrap_or_default() {
                point(out, Source::Host, vec![node.node.to_string()], node.mem_free_bytes as f64);
            }
        },
    },
    // The scheduler (`zernel_scheduler_*`: the reference scheduler's names, for its dashboards).
    Def {
        name: "zernel_scheduler_tasks",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "Tasks tracked by the scheduler.",
        labels: &["type"],
        rules: &[RuleName { name: "scheduler.ml_tasks", select: &[("type", "ml")], scale: 1.0 }],
        read: |v, out| {
            if let Some(s) = v.scheduler() {
                point(out, Source::Scheduler, vec!["total".into()], s.total_tracked_tasks as f64);
                point(out, Source::Scheduler, vec!["ml".into()], s.ml_tasks as f64);
            }
        },
    },
    Def {
        name: "ringside_scheduler_threads_capacity",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "Threads the BPF probe can keep counters for (its threads map, filled to zernel_scheduler_tasks{type=\"total\"}); past it new threads are not counted (ringside_scheduler_lost_total{kind=\"threads\"}).",
        labels: &[],
        rules: &[],
        read: |v, out| {
            if let Some(s) = v.scheduler().filter(|s| s.threads_capacity > 0) {
                point(out, Source::Scheduler, vec![], s.threads_capacity as f64);
            }
        },
    },
    Def {
        name: "zernel_scheduler_decisions_total",
        kind: Kind::Counter,
        unit: Unit::Number,
        help: "Scheduling decisions made.",
        labels: &[],
        rules: &[],
        read: |v, out| scheduler(v, out, |s| s.decisions_made as f64),
    },
    Def {
        name: "ringside_scheduler_decisions_per_second",
        kind: Kind::Gauge,
        unit: Unit::PerSecond,
        help: "Scheduling decisions per second over the alert window.",
        labels: &[],
        rules: &[rule("scheduler.decisions_per_s", 1.0)],
        read: |v, out| {
            if let Some(w) = &v.window().scheduler {
                point(out, Source::Scheduler, vec![], w.decisions_per_s);
            }
        },
    },
    Def {
        name: "zernel_scheduler_phase_transitions_total",
        kind: Kind::Counter,
        unit: Unit::Number,
        help: "Phase transitions seen.",
        labels: &[],
        rules: &[],
        read: |v, out| scheduler(v, out, |s| s.phase_transitions as f64),
    },
    Def {
        name: "zernel_scheduler_phase_tasks",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "ML tasks in each phase now.",
        labels: &["phase"],
        rules: &[],
        read: |v, out| {
            for phase in Phase::ALL {
                let Some(s) = v.scheduler() else { return };
                point(out, Source::Scheduler, vec![phase.as_str().into()], s.phase_distribution.get(phase) as f64);
            }
        },
    },
    Def {
        name: "zernel_scheduler_phase_time_pct",
        kind: Kind::Gauge,
        unit: Unit::Percent,
        help: "Share of ML task time in each phase (0-100).",
        labels: &["phase"],
        rules: &[],
        read: |v, out| {
            for phase in Phase::ALL {
                let Some(s) = v.scheduler() else { return };
                point(out, Source::Scheduler, vec![phase.as_str().into()], s.phase_time_pct.get(phase));
            }
        },
    },
    Def {
        name: "ringside_scheduler_lost_total",
        kind: Kind::Counter,
        unit: Unit::Number,
        help: "Records the BPF probe could not keep, by kind.",
        labels: &["kind"],
        rules: &[],
        read: |v, out| {
            let Some(s) = v.scheduler() else { return };
            for (kind, value) in [
                ("events", s.lost.events),
                ("runq_samples", s.lost.runq_samples),
                ("threads", s.lost.threads),
                ("ml_threads", s.lost.ml_threads),
                ("skipped_runs", s.lost.skipped_runs),
            ] {
                point(out, Source::Scheduler, vec![kind.into()], value as f64);
            }
        },
    },
    Def {
        name: "ringside_scheduler_backend",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "1 for what carries out decisions (observe, setattr, scx).",
        labels: &["backend"],
        rules: &[],
        read: |v, out| {
            if let Some(s) = v.scheduler() {
                point(out, Source::Scheduler, vec![s.backend.as_str().into()], 1.0);
            }
        },
    },
    Def {
        name: "ringside_scheduler_scx_running",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "1 while Ringside's sched_ext scheduler runs.",
        labels: &[],
        rules: &[],
        read: |v, out| {
            if let Some(x) = v.scheduler().and_then(|s| s.scx.as_ref()) {
                point(out, Source::Scheduler, vec![], if x.running { 1.0 } else { 0.0 });
            }
        },
    },
    Def {
        name: "ringside_scheduler_scx_events_total",
        kind: Kind::Counter,
        unit: Unit::Number,
        help: "Events of the sched_ext scheduler, by kind.",
        labels: &["kind"],
        rules: &[],
        read: |v, out| {
            let Some(c) = v.scheduler().and_then(|s| s.scx.as_ref()).map(|x| &x.counters) else { return };
            for (kind, value) in [
                ("enqueued", c.enqueued),
                ("decided", c.decided),
                ("direct", c.direct),
                ("dispatched", c.dispatched),
                ("stolen", c.stolen),
                ("preempted", c.preempted),
                ("continued", c.continued),
                ("latency_runs", c.latency_runs),
                ("feeder_runs", c.feeder_runs),
                ("fallbacks", c.fallbacks),
            ] {
                point(out, Source::Scheduler, vec![kind.into()], value as f64);
            }
        },
    },
    // One series per ML process (few per node) and phase.
    Def {
        name: "ringside_scheduler_process_phase",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "1 for the phase an ML process is in now.",
        labels: PROCESS_PHASE,
        rules: &[],
        read: |v, out| per_process_phase(v, out, |p, phase| if p.phase == phase { 1.0 } else { 0.0 }),
    },
    Def {
        name: "ringside_scheduler_process_phase_seconds_total",
        kind: Kind::Counter,
        unit: Unit::Seconds,
        help: "Time an ML process spent in each phase.",
        labels: PROCESS_PHASE,
        rules: &[],
        read: |v, out| per_process_phase(v, out, |p, phase| p.phase_ms.get(phase) as f64 / 1000.0),
    },
    // Ring kernels.
    Def {
        name: "ringside_kernel_messages_processed_total",
        kind: Kind::Counter,
        unit: Unit::Number,
        help: "Messages a ring kernel completed.",
        labels: KERNEL,
        rules: &[],
        read: |v, out| kernel(v, out, |k| Some(k.messages_processed as f64)),
    },
    Def {
        name: "ringside_kernel_messages_dropped_total",
        kind: Kind::Counter,
        unit: Unit::Number,
        help: "Messages a ring kernel dropped.",
        labels: KERNEL,
        rules: &[],
        read: |v, out| kernel(v, out, |k| Some(k.messages_dropped as f64)),
    },
    Def {
        name: "ringside_kernel_latency_seconds_total",
        kind: Kind::Counter,
        unit: Unit::Seconds,
        help: "Sum of enqueue-to-completion latencies.",
        labels: KERNEL,
        rules: &[],
        read: |v, out| kernel(v, out, |k| Some(k.total_latency_ns as f64 / 1e9)),
    },
    Def {
        name: "ringside_kernel_input_queue_depth",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "Messages waiting in the input ring.",
        labels: KERNEL,
        rules: &[],
        read: |v, out| kernel(v, out, |k| Some(f64::from(k.input_queue_depth))),
    },
    Def {
        name: "ringside_kernel_input_queue_ratio",
        kind: Kind::Gauge,
        unit: Unit::Ratio,
        help: "How full the input ring is (0-1).",
        labels: KERNEL,
        rules: &[rule("kernel.input_queue_ratio", 1.0)],
        read: |v, out| {
            kernel(v, out, |k| {
                (k.input_queue_capacity > 0).then(|| f64::from(k.input_queue_depth) / f64::from(k.input_queue_capacity))
            })
        },
    },
    Def {
        name: "ringside_kernel_output_queue_depth",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "Messages waiting in the output ring.",
        labels: KERNEL,
        rules: &[],
        read: |v, out| kernel(v, out, |k| Some(f64::from(k.output_queue_depth))),
    },
    Def {
        name: "ringside_kernel_gpu_memory_used_bytes",
        kind: Kind::Gauge,
        unit: Unit::Bytes,
        help: "GPU memory a ring kernel holds.",
        labels: KERNEL,
        rules: &[],
        read: |v, out| kernel(v, out, |k| Some(k.gpu_memory_used as f64)),
    },
    Def {
        name: "ringside_kernel_drop_ratio",
        kind: Kind::Gauge,
        unit: Unit::Ratio,
        help: "Share of a ring kernel's messages dropped over the alert window (none without messages).",
        labels: &["kernel"],
        rules: &[rule("kernel.drop_rate", 1.0)],
        read: |v, out| kernel_window(v, out, |w| w.drop_rate),
    },
    Def {
        name: "ringside_kernel_latency_average_seconds",
        kind: Kind::Gauge,
        unit: Unit::Seconds,
        help: "Mean latency of the messages a ring kernel completed over the alert window.",
        labels: &["kernel"],
        rules: &[rule("kernel.avg_latency_ms", 1000.0)],
        read: |v, out| kernel_window(v, out, |w| w.avg_latency_ns.map(|ns| ns / 1e9)),
    },
    Def {
        name: "ringside_kernel_throughput_per_second",
        kind: Kind::Gauge,
        unit: Unit::PerSecond,
        help: "Messages a ring kernel completed per second over the alert window.",
        labels: &["kernel"],
        rules: &[rule("kernel.throughput_per_s", 1.0)],
        read: |v, out| kernel_window(v, out, |w| Some(w.throughput_per_s)),
    },
    Def {
        name: "ringside_kernel_stats_samples_total",
        kind: Kind::Counter,
        unit: Unit::Number,
        help: "Samples a stats ring kernel has summarised.",
        labels: &["kernel", "input"],
        rules: &[],
        read: |v, out| {
            for k in v.kernels() {
                if let Some(s) = &k.output_stats {
                    point(out, Source::Kernel(k.id.clone()), vec![k.id.clone(), s.input.as_str().into()], s.count as f64);
                }
            }
        },
    },
    Def {
        name: "ringside_kernel_stats_runq_latency_seconds",
        kind: Kind::Gauge,
        unit: Unit::Seconds,
        help: "Run-queue latency of tracked ML threads, as a stats ring kernel summarises it.",
        labels: &["kernel", "stat"],
        rules: &[],
        read: |v, out| kernel_stats(v, out, StatsInput::RunqLatency, 1e6),
    },
    Def {
        name: "ringside_kernel_stats_cpu_utilization_ratio",
        kind: Kind::Gauge,
        unit: Unit::Ratio,
        help: "Per-CPU utilisation, as a stats ring kernel summarises it.",
        labels: &["kernel", "stat"],
        rules: &[],
        read: |v, out| kernel_stats(v, out, StatsInput::CpuUtilization, 100.0),
    },
    // GPUs, in base units, labelled by NVML index and UUID (as dcgm-exporter does, so
    // dashboards can join on either).
    Def {
        name: "ringside_gpu_info",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "One series per GPU with its name and PCI bus id; always 1.",
        labels: &["gpu", "uuid", "name", "pci_bus_id"],
        rules: &[],
        read: |v, out| {
            for g in v.gpu_devices() {
                let labels = vec![g.index.to_string(), g.uuid.clone(), g.name.clone(), g.pci_bus_id.clone()];
                point(out, Source::Gpu(g.index), labels, 1.0);
            }
        },
    },
    Def {
        name: "ringside_gpu_xid_errors_total",
        kind: Kind::Counter,
        unit: Unit::Number,
        help: "XID errors the driver reported since ringsided started.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| Some(g.xid_count as f64)),
    },
    Def {
        name: "ringside_gpu_utilization_ratio",
        kind: Kind::Gauge,
        unit: Unit::Ratio,
        help: "Share of the last sample period the GPU was busy.",
        labels: GPU,
        rules: &[rule("gpu.utilization_pct", 100.0)],
        read: |v, out| gpu(v, out, |g| g.utilization_gpu_pct.map(ratio)),
    },
    Def {
        name: "ringside_gpu_memory_utilization_ratio",
        kind: Kind::Gauge,
        unit: Unit::Ratio,
        help: "Share of the last sample period memory was read or written.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| g.utilization_memory_pct.map(ratio)),
    },
    Def {
        name: "ringside_gpu_sm_clock_hertz",
        kind: Kind::Gauge,
        unit: Unit::Hertz,
        help: "SM clock.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| g.sm_clock_mhz.map(|mhz| f64::from(mhz) * 1e6)),
    },
    Def {
        name: "ringside_gpu_sm_clock_max_hertz",
        kind: Kind::Gauge,
        unit: Unit::Hertz,
        help: "Highest SM clock.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| g.sm_clock_max_mhz.map(|mhz| f64::from(mhz) * 1e6)),
    },
    Def {
        name: "ringside_gpu_memory_clock_hertz",
        kind: Kind::Gauge,
        unit: Unit::Hertz,
        help: "Memory clock.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| g.memory_clock_mhz.map(|mhz| f64::from(mhz) * 1e6)),
    },
    Def {
        name: "ringside_gpu_memory_used_bytes",
        kind: Kind::Gauge,
        unit: Unit::Bytes,
        help: "Framebuffer memory allocated.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| g.memory_used_bytes.map(|b| b as f64)),
    },
    Def {
        name: "ringside_gpu_memory_total_bytes",
        kind: Kind::Gauge,
        unit: Unit::Bytes,
        help: "Framebuffer memory installed.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| g.memory_total_bytes.map(|b| b as f64)),
    },
    Def {
        name: "ringside_gpu_memory_used_ratio",
        kind: Kind::Gauge,
        unit: Unit::Ratio,
        help: "Share of framebuffer memory allocated (0-1).",
        labels: GPU,
        rules: &[rule("gpu.memory_used_pct", 100.0)],
        read: |v, out| {
            gpu(v, out, |g| {
                let total = g.memory_total_bytes.filter(|t| *t > 0)? as f64;
                Some(g.memory_used_bytes? as f64 / total)
            })
        },
    },
    Def {
        name: "ringside_gpu_temperature_celsius",
        kind: Kind::Gauge,
        unit: Unit::Celsius,
        help: "GPU die temperature.",
        labels: GPU,
        rules: &[rule("gpu.temperature_c", 1.0)],
        read: |v, out| gpu(v, out, |g| g.temperature_gpu_c.map(f64::from)),
    },
    Def {
        name: "ringside_gpu_memory_temperature_celsius",
        kind: Kind::Gauge,
        unit: Unit::Celsius,
        help: "HBM temperature.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| g.temperature_memory_c.map(f64::from)),
    },
    Def {
        name: "ringside_gpu_power_watts",
        kind: Kind::Gauge,
        unit: Unit::Watts,
        help: "Power draw.",
        labels: GPU,
        rules: &[rule("gpu.power_w", 1.0)],
        read: |v, out| gpu(v, out, |g| g.power_draw_w),
    },
    Def {
        name: "ringside_gpu_power_limit_watts",
        kind: Kind::Gauge,
        unit: Unit::Watts,
        help: "Power limit the driver enforces.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| g.power_limit_w),
    },
    Def {
        name: "ringside_gpu_energy_joules_total",
        kind: Kind::Counter,
        unit: Unit::Joules,
        help: "Energy used since the driver was loaded.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| g.energy_j),
    },
    Def {
        name: "ringside_gpu_pcie_tx_bytes_per_second",
        kind: Kind::Gauge,
        unit: Unit::BytesPerSecond,
        help: "PCIe transmit throughput.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| g.pcie_tx_bytes_per_s.map(|b| b as f64)),
    },
    Def {
        name: "ringside_gpu_pcie_rx_bytes_per_second",
        kind: Kind::Gauge,
        unit: Unit::BytesPerSecond,
        help: "PCIe receive throughput.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| g.pcie_rx_bytes_per_s.map(|b| b as f64)),
    },
    Def {
        name: "ringside_gpu_pcie_replays_total",
        kind: Kind::Counter,
        unit: Unit::Number,
        help: "PCIe replays.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| g.pcie_replay_count.map(|n| n as f64)),
    },
    Def {
        name: "ringside_gpu_nvlink_tx_bytes_total",
        kind: Kind::Counter,
        unit: Unit::Bytes,
        help: "Data sent over NVLink, all links.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| g.nvlink_tx_bytes.map(|b| b as f64)),
    },
    Def {
        name: "ringside_gpu_nvlink_rx_bytes_total",
        kind: Kind::Counter,
        unit: Unit::Bytes,
        help: "Data received over NVLink, all links.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| g.nvlink_rx_bytes.map(|b| b as f64)),
    },
    Def {
        name: "ringside_gpu_ecc_corrected_errors_total",
        kind: Kind::Counter,
        unit: Unit::Number,
        help: "Corrected ECC errors since the driver was loaded.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| g.ecc_corrected_volatile.map(|n| n as f64)),
    },
    Def {
        name: "ringside_gpu_ecc_uncorrected_errors_total",
        kind: Kind::Counter,
        unit: Unit::Number,
        help: "Uncorrected ECC errors since the driver was loaded.",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| g.ecc_uncorrected_volatile.map(|n| n as f64)),
    },
    Def {
        name: "ringside_gpu_remapped_rows",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "Memory rows remapped (correctable and uncorrectable).",
        labels: GPU,
        rules: &[],
        read: |v, out| gpu(v, out, |g| Some((g.remapped_rows_correctable? + g.remapped_rows_uncorrectable?) as f64)),
    },
    Def {
        name: "ringside_gpu_clocks_throttled",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "1 while the reason holds the GPU's clocks down.",
        labels: &["gpu", "uuid", "reason"],
        rules: &[],
        read: |v, out| {
            for g in v.gpu_devices() {
                let Some(held) = &g.throttle_reasons else { continue };
                for reason in ThrottleReason::ALL {
                    let value = if held.contains(&reason) { 1.0 } else { 0.0 };
                    let labels = vec![g.index.to_string(), g.uuid.clone(), reason.as_str().into()];
                    point(out, Source::Gpu(g.index), labels, value);
                }
            }
        },
    },
    // Each ML job (its main process and workers), for job-aware rules and alerts.
    Def {
        name: "ringside_process_job_info",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "Who an ML process is beyond this node, as its cgroup path and environment say (empty where unknown); always 1.",
        labels: &["pid", "job", "job_id", "rank", "local_rank", "world_size", "pod", "container", "unit"],
        rules: &[],
        read: |v, out| {
            for p in v.scheduler().map(|s| s.processes.as_slice()).unwrap_or_default() {
                let id = &p.identity;
                if id.is_empty() {
                    continue;
                }
                let number = |n: Option<u32>| n.map(|n| n.to_string()).unwrap_or_default();
                let text = |t: &Option<String>| t.clone().unwrap_or_default();
                let labels = vec![
                    p.pid.to_string(),
                    p.job.to_string(),
                    id.job_id().unwrap_or_default(),
                    number(id.rank),
                    number(id.local_rank),
                    number(id.world_size),
                    text(&id.pod),
                    text(&id.container),
                    text(&id.unit),
                ];
                point(out, Source::Job(p.job), labels, 1.0);
            }
        },
    },
    // Each rank of a job across nodes (job id and rank from its identity), for the fleet's
    // straggler and hang rules (deploy/prometheus): series come and go with the ranks.
    Def {
        name: "ringside_rank_phase_seconds_total",
        kind: Kind::Counter,
        unit: Unit::Seconds,
        help: "Time a rank of a job spent in each phase; nccl_collective is its time inside collectives, the rest its own work.",
        labels: RANK_PHASE,
        rules: &[],
        read: |v, out| {
            for rank in ranks(v) {
                for phase in Phase::ALL {
                    rank_point(out, &rank, &[phase.as_str()], rank.process.phase_ms.get(phase) as f64 / 1000.0);
                }
            }
        },
    },
    Def {
        name: "ringside_rank_collective_seconds_total",
        kind: Kind::Counter,
        unit: Unit::Seconds,
        help: "Time a rank spent inside NCCL calls, exactly as the probe timed them; its time observed (the sum of its phase seconds) less this is its own work.",
        labels: RANK,
        rules: &[],
        read: |v, out| {
            for rank in ranks(v) {
                rank_point(out, &rank, &[], rank.process.collective_ms as f64 / 1000.0);
            }
        },
    },
    Def {
        name: "ringside_rank_cpu_wait_seconds_total",
        kind: Kind::Counter,
        unit: Unit::Seconds,
        help: "Time a rank's longest-waiting thread spent runnable but waiting for a CPU.",
        labels: RANK,
        rules: &[],
        read: |v, out| {
            for rank in ranks(v) {
                rank_point(out, &rank, &[], rank.process.cpu_wait_ms as f64 / 1000.0);
            }
        },
    },
    Def {
        name: "ringside_rank_collective_calls_total",
        kind: Kind::Counter,
        unit: Unit::Number,
        help: "NCCL calls a rank made (every rank of a data-parallel job makes the same ones each step).",
        labels: RANK,
        rules: &[],
        read: |v, out| {
            for rank in ranks(v) {
                rank_point(out, &rank, &[], rank.process.collective_calls as f64);
            }
        },
    },
    Def {
        name: "ringside_rank_in_collective_seconds",
        kind: Kind::Gauge,
        unit: Unit::Seconds,
        help: "How long a rank has been inside its current collective (0 when it is not in one).",
        labels: RANK,
        rules: &[],
        read: |v, out| {
            for rank in ranks(v) {
                rank_point(out, &rank, &[], rank.in_collective_ms(v.now_ms) as f64 / 1000.0);
            }
        },
    },
    Def {
        name: "ringside_rank_phase",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "1 for the phase a rank is in now, 0 for the others.",
        labels: RANK_PHASE,
        rules: &[],
        read: |v, out| {
            for rank in ranks(v) {
                for phase in Phase::ALL {
                    rank_point(out, &rank, &[phase.as_str()], if rank.process.phase == phase { 1.0 } else { 0.0 });
                }
            }
        },
    },
    Def {
        name: "ringside_rank_gpu_clocks_held",
        kind: Kind::Gauge,
        unit: Unit::Number,
        help: "1 while heat or power (not idling or a setting) holds down the clocks of a GPU a rank uses, by reason.",
        labels: &["job_id", "rank", "gpu", "reason"],
        rules: &[],
        read: |v, out| {
            for rank in ranks(v) {
                for a in v.idle().iter().filter(|a| a.job == rank.process.job) {
                    let Some(device) = v.gpu_devices().iter().find(|d| d.index == a.gpu) else { continue };
                    let Some(held) = &device.throttle_reasons else { continue };
                    for reason in ThrottleReason::ALL.into_iter().filter(|r| r.is_hardware() || *r == ThrottleReason::SwPowerCap) {
                        let value = if held.contains(&reason) { 1.0 } else { 0.0 };
                        rank_point(out, &rank, &[&a.gpu.to_string(), reason.as_str()], value);
                    }
                }
            }
        },
    },
    Def {
        name: "ringside_rank_exited_timestamp_seconds",
        kind: Kind::Gauge,
        unit: Unit::Seconds,
        help: "When a rank's process ended on this node (kept 10 minutes), and how: its exit code or the signal that killed it.",
        labels: &["job_id", "rank", "how"],
        rules: &[],
        read: |v, out| {
            for e in v.scheduler().map(|s| s.exited_ranks.as_slice()).unwrap_or_default() {
                let labels = vec![e.job_id.clone(), e.rank.to_string(), e.how()];
                point(out, Source::Scheduler, labels, e.at_ms as f64 / 1000.0);
            }
        },
    },
    Def {
        name: "ringside_rank_step_seconds",
        kind: Kind::Gauge,
        unit: Unit::Seconds,
        help: "A rank's median step time over the recent window (job_window_s), where steps are visible.",
        labels: RANK,
        rules: &[],
        read: |v, out| {
            for rank in ranks(v) {
                let Some(steps) = rank.process.steps.as_ref().filter(|s| s.recent_count > 0) else { continue };
                rank_point(out, &rank, &[], steps.recent_p50_ms as f64 / 1000.0);
            }
        },
    },
    Def {
        name: "ringside_job_collective_stalled_seconds",
        kind: Kind::Gauge,
        unit: Unit::Seconds,
        help: "How long an ML job has waited in an NCCL collective with none of its collectives returning (0 when not waiting).",
        labels: JOB,
        rules: &[rule("job.collective_stalled_s", 1.0)],
        read: |v, out| {
            for job in jobs(v) {
                job_point(out, &job, &[], job.collective_stalled_s(v.now_ms));
            }
        },
    },
    Def {
        name: "ringside_job_phase_share_ratio",
        kind: Kind::Gauge,
        unit: Unit::Ratio,
        help: "Share of an ML job's recent window (job_window_s) its main process spent in each phase.",
        labels: JOB_PHASE,
        rules: &[
            RuleName { name: "job.data_loading_pct", select: &[("phase", "data_loading")], scale: 100.0 },
            RuleName { name: "job.gpu_compute_pct", select: &[("phase", "gpu_compute")], scale: 100.0 },
            RuleName { name: "job.nccl_collective_pct", select: &[("phase", "nccl_collective")], scale: 100.0 },
            RuleName { name: "job.optimizer_step_pct", select: &[("phase", "optimizer_step")], scale: 100.0 },
        ],
        read: |v, out| {
            for job in jobs(v).iter().filter(|j| j.main.recent_observed_ms > 0) {
                for phase in Phase::ALL {
                    job_point(out, job, &[phase.as_str()], ratio(job.main.recent_phase_pct.get(phase)));
                }
            }
        },
    },
    Def {
        name: "ringside_job_phase_held_seconds",
        kind: Kind::Gauge,
        unit: Unit::Seconds,
        help: "How long an ML job's main process has been in the phase it is in now.",
        labels: JOB_PHASE,
        rules: &[rule("job.phase_held_s", 1.0)],
        read: |v, out| {
            for job in jobs(v) {
                let held = v.now_ms.saturating_sub(job.main.phase_since_ms) as f64 / 1000.0;
                job_point(out, &job, &[job.main.phase.as_str()], held);
            }
        },
    },
    Def {
        name: "ringside_job_step_time_seconds",
        kind: Kind::Summary,
        unit: Unit::Seconds,
        help: "An ML job's step time quantiles over its recent window and over the last hour, where steps are visible.",
        labels: &["job", "comm", "command", "quantile", "window"],
        rules: &[
            RuleName { name: "job.step_p50_s", select: &[("quantile", "0.5"), ("window", "recent")], scale: 1.0 },
            RuleName { name: "job.step_p99_s", select: &[("quantile", "0.99"), ("window", "recent")], scale: 1.0 },
            RuleName { name: "job.step_p99_hour_s", select: &[("quantile", "0.99"), ("window", "hour")], scale: 1.0 },
        ],
        read: |v, out| {
            for job in jobs(v) {
                let Some(s) = &job.main.steps else { continue };
                for (q, window, ms, count) in [
                    ("0.5", "recent", s.recent_p50_ms, s.recent_count),
                    ("0.99", "recent", s.recent_p99_ms, s.recent_count),
                    ("0.5", "hour", s.hour_p50_ms, s.hour_count),
                    ("0.99", "hour", s.hour_p99_ms, s.hour_count),
                ] {
                    if count > 0 {
                        job_point(out, &job, &[q, window], ms as f64 / 1000.0);
                    }
                }
            }
        },
    },
    // Why each GPU an ML job uses sat idle (see docs/gpu.md, "Idle attribution").
    Def {
        name: "ringside_job_gpu_idle_overall_ratio",
        kind: Kind::Gauge,
        unit: Unit::Ratio,
        help: "Share of the last minute a GPU an ML job uses was idle, whatever the job was doing.",
        labels: JOB_GPU,
        rules: &[rule("job.gpu_idle_pct", 100.0)],
        read: |v, out| job_gpu_value(v, out, |a| Some(ratio(a.idle_pct))),
    },
    Def {
        name: "ringside_job_gpu_idle_ratio",
        kind: Kind::Gauge,
        unit: Unit::Ratio,
        help: "Share of the last minute a GPU an ML job uses was idle, by the job's phase meanwhile.",
        labels: JOB_GPU_PHASE,
        rules: &[
            RuleName { name: "job.gpu_idle_data_loading_pct", select: &[("phase", "data_loading")], scale: 100.0 },
            RuleName {
                name: "job.gpu_idle_nccl_collective_pct",
                select: &[("phase", "nccl_collective")],
                scale: 100.0,
            },
            RuleName { name: "job.gpu_idle_optimizer_step_pct", select: &[("phase", "optimizer_step")], scale: 100.0 },
            RuleName {
                name: "job.gpu_idle_waiting_for_cpu_pct",
                select: &[("phase", "waiting_for_cpu")],
                scale: 100.0,
            },
        ],
        read: |v, out| job_gpu(v, out, |a| Some((&a.idle_by_phase_pct, a.idle_waiting_for_cpu_pct))),
    },
    Def {
        name: "ringside_job_gpu_step_idle_ratio",
        kind: Kind::Gauge,
        unit: Unit::Ratio,
        help: "Share of an ML job's last complete step a GPU it uses was idle, by the job's phase meanwhile.",
        labels: JOB_GPU_PHASE,
        rules: &[],
        read: |v, out| {
            job_gpu(v, out, |a| a.last_step.as_ref().map(|s| (&s.idle_by_phase_pct, s.idle_waiting_for_cpu_pct)))
        },
    },
    Def {
        name: "ringside_job_step_seconds",
        kind: Kind::Gauge,
        unit: Unit::Seconds,
        help: "Length of an ML job's last complete step, as seen from a GPU it uses.",
        labels: JOB_GPU,
        rules: &[],
        read: |v, out| {
            job_gpu_value(v, out, |a| a.last_step.as_ref().map(|s| s.end_ms.saturating_sub(s.start_ms) as f64 / 1000.0))
        },
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use ringside_shared::{GpuStepIdle, KernelStatsOutput, NumaNodeMetrics, PressureMetrics, ProcessRole, ScxStatus};

    /// A view in which every family has values.
    /// A GPU with every field reported, and job 7's idle attribution on it.
    fn every_gpu_field(by_phase: &PhaseValues<f64>) -> GpuTelemetry {
        let device = GpuDevice {
            index: 0,
            uuid: "GPU-0".into(),
            utilization_gpu_pct: Some(80.0),
            utilization_memory_pct: Some(1.0),
            sm_clock_mhz: Some(1),
            sm_clock_max_mhz: Some(1),
            memory_clock_mhz: Some(1),
            memory_used_bytes: Some(1),
            memory_total_bytes: Some(4),
            temperature_gpu_c: Some(60),
            temperature_memory_c: Some(60),
            power_draw_w: Some(300.0),
            power_limit_w: Some(700.0),
            energy_j: Some(1.0),
            pcie_tx_bytes_per_s: Some(1),
            pcie_rx_bytes_per_s: Some(1),
            pcie_replay_count: Some(1),
            nvlink_tx_bytes: Some(1),
            nvlink_rx_bytes: Some(1),
            ecc_corrected_volatile: Some(1),
            ecc_uncorrected_volatile: Some(1),
            remapped_rows_correctable: Some(1),
            remapped_rows_uncorrectable: Some(1),
            throttle_reasons: Some(vec![]),
            ..Default::default()
        };
        let idle = GpuIdleAttribution {
            job: 7,
            gpu: 0,
            idle_pct: 38.0,
            idle_by_phase_pct: by_phase.clone(),
            idle_waiting_for_cpu_pct: 8.0,
            last_step: Some(GpuStepIdle {
                start_ms: 1000,
                end_ms: 7000,
                anchor: Phase::DataLoading,
                idle_pct: 38.0,
                idle_by_phase_pct: by_phase.clone(),
                idle_waiting_for_cpu_pct: 8.0,
            }),
            ..Default::default()
        };
        GpuTelemetry { devices: vec![device], idle: vec![idle], ..Default::default() }
    }

    fn everything() -> (Sample, Vec<ComponentHealth>, DaemonStats) {
        let host = HostMetrics {
            cpu_utilization_pct: 50.0,
            per_cpu_utilization_pct: vec![40.0, 60.0],
            memory: ringside_shared::MemoryMetrics { used_pct: 25.0, ..Default::default() },
            pressure: Some(PressureMetrics { cpu_some_avg10: 12.5, ..Default::default() }),
            numa: vec![NumaNodeMetrics::default()],
            ..Default::default()
        };
        let mut by_phase = PhaseValues::<f64>::default();
        *by_phase.get_mut(Phase::DataLoading) = 30.0;
        let process = MlProcessInfo {
            pid: 7,
            job: 7,
            comm: "python3".into(),
            phase: Phase::DataLoading,
            phase_since_ms: 0,
            threads: 1,
            cmdline: "python3 train.py".into(),
            collective_waiting_since_ms: Some(1000),
            recent_phase_pct: by_phase.clone(),
            recent_observed_ms: 1000,
            steps: Some(ringside_shared::StepTimes {
                anchor: Phase::DataLoading,
                recent_count: 5,
                recent_p50_ms: 900,
                recent_p99_ms: 1800,
                hour_count: 50,
                hour_p50_ms: 800,
                hour_p99_ms: 900,
                ..Default::default()
            }),
            identity: ringside_shared::JobIdentity {
                slurm_job: Some("4242".into()),
                rank: Some(3),
                ..Default::default()
            },
            ..Default::default()
        };
        let scheduler = SchedulerTelemetry {
            ml_tasks: 3,
            threads_capacity: 65_536,
            processes: vec![process],
            exited_ranks: vec![ringside_shared::ExitedRank {
                job_id: "4242".into(),
                rank: 5,
                pid: 99,
                at_ms: 1_800_000_000_000,
                status: Some(9),
            }],
            scx: Some(ScxStatus::default()),
            ..Default::default()
        };
        let stats = KernelStatsOutput {
            input: StatsInput::RunqLatency,
            unit: StatsInput::RunqLatency.unit(),
            count: 10,
            mean: 2.0,
            p50: 1.0,
            p90: 3.0,
            p99: 4.0,
            max: 5.0,
        };
        let kernel = RingKernelMetrics {
            id: "canary".into(),
            input_queue_capacity: 8,
            input_queue_depth: 2,
            output_stats: Some(stats),
            ..Default::default()
        };
        let mut cpu_stats = kernel.clone();
        cpu_stats.id = "cpu".into();
        if let Some(s) = cpu_stats.output_stats.as_mut() {
            s.input = StatsInput::CpuUtilization;
        }
        let gpus = every_gpu_field(&by_phase);
        let window = WindowAggregates {
            kernels: vec![KernelWindow {
                id: "canary".into(),
                processed: 90,
                dropped: 10,
                drop_rate: Some(0.1),
                throughput_per_s: 9.0,
                avg_latency_ns: Some(2e6),
            }],
            scheduler: Some(ringside_shared::SchedulerWindow {
                decisions: 4,
                phase_transitions: 4,
                decisions_per_s: 0.5,
            }),
            ..Default::default()
        };
        let readings = Readings {
            host: Some(host),
            scheduler: Some(scheduler),
            kernels: vec![kernel, cpu_stats],
            gpus: Some(gpus),
            window,
        };
        let sample = Sample { taken_at_ms: 0, readings, ..Sample::default() };
        let components = vec![ComponentHealth { name: "host".into(), status: ComponentStatus::Up, detail: None }];
        (sample, components, DaemonStats::default())
    }

    #[test]
    fn every_family_has_a_unique_name_values_and_as_many_label_values_as_labels() {
        let (sample, components, stats) = everything();
        let view = View { components: &components, daemon: Some(&stats), ..View::of_sample(&sample) };
        let mut names = std::collections::HashSet::new();
        for def in ALL {
            assert!(names.insert(def.name), "{} declared twice", def.name);
            let points = def.points(&view);
            assert!(!points.is_empty(), "{} has no value in a view that has everything", def.name);
            for p in points {
                assert_eq!(p.labels.len(), def.labels.len(), "{}: {p:?}", def.name);
            }
            // Prometheus' own conventions: counters end in _total, nothing else does; a
            // `quantile` label belongs to summaries alone (`promtool check metrics` refuses it
            // elsewhere), and `le` to histograms, which there are none of.
            assert_eq!(def.kind == Kind::Counter, def.name.ends_with("_total"), "{}", def.name);
            assert_eq!(def.kind == Kind::Summary, def.labels.contains(&"quantile"), "{}", def.name);
            assert!(!def.labels.contains(&"le"), "{}", def.name);
            let suffix = match def.unit {
                Unit::Ratio => Some("_ratio"),
                Unit::Seconds => Some("seconds"),
                Unit::Hertz => Some("_hertz"),
                Unit::Celsius => Some("_celsius"),
                Unit::Watts => Some("_watts"),
                _ => None,
            };
            if let Some(suffix) = suffix {
                let base = def.name.trim_end_matches("_total");
                assert!(base.ends_with(suffix), "{} is in {} but not named so", def.name, def.unit.as_str());
            }
        }
    }

    #[test]
    fn a_rank_is_the_process_making_its_collective_calls_and_each_rank_is_one_series() {
        let identity = |rank| ringside_shared::JobIdentity {
            run_id: Some("run-7".into()),
            rank: Some(rank),
            ..Default::default()
        };
        let process = |pid, rank, calls, role| MlProcessInfo {
            pid,
            job: 10,
            role,
            identity: identity(rank),
            collective_calls: calls,
            collective_waiting_since_ms: (calls > 0).then_some(9_000),
            ..Default::default()
        };
        // Rank 0's DataLoader worker (lower pid, same environment, no calls), rank 0, rank 1,
        // and a process with no identity.
        // A user not admitted for alerting claims rank 2 of the same job: not exported (the
        // fleet's rules page from these series).
        let processes = vec![
            process(5, 0, 0, ProcessRole::Worker),
            process(10, 0, 40, ProcessRole::Main),
            process(11, 1, 40, ProcessRole::Main),
            MlProcessInfo { untrusted: true, ..process(13, 2, 40, ProcessRole::Main) },
            MlProcessInfo { pid: 12, job: 12, ..Default::default() },
        ];
        let scheduler = SchedulerTelemetry { processes, ..Default::default() };
        let readings = Readings { scheduler: Some(scheduler), ..Default::default() };
        let sample = Sample { taken_at_ms: 10_000, readings, ..Sample::default() };
        let view = View::of_sample(&sample);
        let chosen: Vec<(String, u32, u32)> =
            ranks(&view).iter().map(|r| (r.job_id.clone(), r.rank, r.process.pid)).collect();
        assert_eq!(chosen, [("run-7".to_string(), 0, 10), ("run-7".to_string(), 1, 11)]);
        let def = ALL.iter().find(|d| d.name == "ringside_rank_in_collective_seconds").unwrap();
        let points: Vec<(Vec<String>, f64)> = def.points(&view).into_iter().map(|p| (p.labels, p.value)).collect();
        assert_eq!(
            points,
            [(vec!["run-7".to_string(), "0".into()], 1.0), (vec!["run-7".to_string(), "1".into()], 1.0)]
        );
    }

    #[test]
    fn rule_names_are_unique_select_existing_labels_and_say_their_scale() {
        let mut names = std::collections::HashSet::new();
        for def in ALL {
            for r in def.rules {
                assert!(names.insert(r.name), "{} named twice", r.name);
                for (label, _) in r.select {
                    assert!(def.labels.contains(label), "{} selects {label}, which {} lacks", r.name, def.name);
                }
                // The suffix of a rule name says its unit.
                if r.name.ends_with("_pct") {
                    assert_eq!((def.unit, r.scale), (Unit::Ratio, 100.0), "{}", r.name);
                }
                if r.name.ends_with("_ms") {
                    assert_eq!((def.unit, r.scale), (Unit::Seconds, 1000.0), "{}", r.name);
                }
            }
        }
        assert_eq!(names.len(), 35);
        for first_release in ["host.cpu_utilization_pct", "kernel.drop_rate", "gpu.power_w", "job.gpu_idle_pct"] {
            assert!(names.contains(first_release), "{first_release} is still there");
        }
    }

    #[test]
    fn rules_read_their_metric_in_their_own_scale_from_the_selected_series() {
        let (sample, _, _) = everything();
        let view = View::of_sample(&sample);
        let value = |name: &str| -> Vec<(String, f64)> {
            let values = RuleMetric::find(name).unwrap_or_else(|| panic!("{name}")).values(&view);
            values.into_iter().map(|(s, v)| (s.to_string(), v)).collect()
        };
        assert_eq!(value("host.cpu_utilization_pct"), vec![("host".to_string(), 50.0)]);
        assert_eq!(value("host.pressure.cpu_some_avg10"), vec![("host".to_string(), 12.5)]);
        assert_eq!(value("scheduler.ml_tasks"), vec![("scheduler".to_string(), 3.0)]);
        assert_eq!(value("kernel.drop_rate"), vec![("kernel:canary".to_string(), 0.1)]);
        assert_eq!(value("kernel.avg_latency_ms"), vec![("kernel:canary".to_string(), 2.0)]);
        assert_eq!(value("kernel.input_queue_ratio")[0], ("kernel:canary".to_string(), 0.25));
        assert_eq!(value("gpu.memory_used_pct"), vec![("gpu:0".to_string(), 25.0)]);
        assert_eq!(value("job.gpu_idle_pct"), vec![("job:7/gpu:0".to_string(), 38.0)]);
        assert_eq!(value("job.gpu_idle_data_loading_pct"), vec![("job:7/gpu:0".to_string(), 30.0)]);
        assert_eq!(value("job.gpu_idle_waiting_for_cpu_pct"), vec![("job:7/gpu:0".to_string(), 8.0)]);
        assert!(RuleMetric::find("gpu.utilisation").is_none());
        // The same job, of a user not admitted for alerting: its series stay on /metrics, and
        // rules see none of them (job 70 only shares the prefix).
        let (mut sample, _, _) = everything();
        let scheduler = sample.readings.scheduler.as_mut().unwrap();
        scheduler.processes[0].untrusted = true;
        let other = MlProcessInfo { pid: 70, job: 70, untrusted: false, ..scheduler.processes[0].clone() };
        scheduler.processes.push(other);
        let view = View::of_sample(&sample);
        let value = |name: &str| RuleMetric::find(name).unwrap().values(&view);
        assert_eq!(
            value("job.collective_stalled_s").iter().map(|(s, _)| s.clone()).collect::<Vec<_>>(),
            [Source::Job(70)]
        );
        assert!(value("job.gpu_idle_pct").iter().all(|(s, _)| s.job() != Some(7)));
        let exposed = ALL.iter().find(|d| d.name == "ringside_job_collective_stalled_seconds").unwrap().points(&view);
        assert_eq!(exposed.len(), 2, "both jobs on /metrics");
    }

    /// The tables in `docs/metrics.md` are the registry's: a metric added here and not there
    /// (or renamed) fails this test, which prints the tables to paste.
    #[test]
    fn the_documented_metrics_are_the_registry_s() {
        let families = ALL
            .iter()
            .map(|d| {
                let labels: Vec<String> = d.labels.iter().map(|l| format!("`{l}`")).collect();
                format!(
                    "| `{}` | {} | {} | {} | {} |",
                    d.name,
                    d.kind.as_str(),
                    d.unit.as_str(),
                    labels.join(", "),
                    d.help
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        let rules = summaries()
            .iter()
            .map(|m| {
                let select: Vec<String> = m.select.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
                let series = if select.is_empty() {
                    m.prometheus.clone()
                } else {
                    format!("{}{{{}}}", m.prometheus, select.join(","))
                };
                format!("| `{}` | `{series}` | × {} |", m.name, crate::alerts::number(m.scale))
            })
            .collect::<Vec<_>>()
            .join("\n");
        let docs =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md")).unwrap_or_default();
        assert!(
            docs.contains(&families) && docs.contains(&rules),
            "docs/metrics.md should hold these tables:\n{families}\n\n{rules}\n"
        );
    }
}
