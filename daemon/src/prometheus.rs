//! `/metrics` in the Prometheus text exposition format (version 0.0.4).
//!
//! The scheduler's series keep the reference scheduler's `zernel_scheduler_*` names so existing
//! dashboards work; everything else is `ringside_*`.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use ringside_shared::{ComponentStatus, GpuIdleAttribution, Phase, PhaseValues, Severity, StatsInput};

use crate::alerts::number;
use crate::state::NodeState;

#[derive(Default)]
struct Exposition {
    out: String,
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        self
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
            let _ = write!(self.out, "{{{}}}", pairs.join(","));
        }
        let _ = writeln!(self.out, " {}", number(value));
        self
    }

    fn single(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.family(name, kind, help).sample(name, &[], value);
    }
}

pub fn render(state: &NodeState) -> String {
    let snapshot = state.snapshot();
    let mut e = Exposition::default();

    e.family("ringside_build_info", "gauge", "Version of ringsided; always 1.").sample(
        "ringside_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1.0,
    );
    e.family("ringside_component_up", "gauge", "1 when a component is up, 0.5 when degraded, 0 when down.");
    for c in &snapshot.components {
        let value = match c.status {
            ComponentStatus::Up => 1.0,
            ComponentStatus::Degraded => 0.5,
            ComponentStatus::Down => 0.0,
            // Not on this node (a GPU source without a driver): no series.
            ComponentStatus::Absent => continue,
        };
        e.sample("ringside_component_up", &[("component", &c.name)], value);
    }

    let stats = &state.stats;
    let read = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed) as f64;
    let daemon_series = [
        ("ringside_collection_ticks_total", "counter", "Collection ticks run.", read(&stats.ticks_total)),
        (
            "ringside_collection_duration_seconds",
            "gauge",
            "Time the latest collection tick took.",
            read(&stats.last_collect_ns) / 1e9,
        ),
        ("ringside_ws_clients", "gauge", "Connected WebSocket clients.", read(&stats.ws_clients)),
        (
            "ringside_ws_connections_total",
            "counter",
            "WebSocket connections accepted.",
            read(&stats.ws_connections_total),
        ),
        (
            "ringside_auth_failures_total",
            "counter",
            "Requests refused for a missing or wrong token, or a cookie-authenticated change from another origin.",
            read(&stats.auth_failures_total),
        ),
        (
            "ringside_auth_throttled_total",
            "counter",
            "Failed authentications answered 429: their client address was over its budget.",
            read(&stats.auth_throttled_total),
        ),
        ("ringside_http_connections_open", "gauge", "Open HTTP connections.", read(&stats.http_connections_open)),
        (
            "ringside_http_connections_total",
            "counter",
            "HTTP connections accepted.",
            read(&stats.http_connections_total),
        ),
        (
            "ringside_http_connections_refused_total",
            "counter",
            "HTTP connections closed at once because max_connections were open.",
            read(&stats.http_connections_refused_total),
        ),
        (
            "ringside_ws_refused_total",
            "counter",
            "WebSocket handshakes refused (token or origin).",
            read(&stats.ws_refused_total),
        ),
        (
            "ringside_ws_resyncs_total",
            "counter",
            "Full snapshots sent to clients that fell behind the broadcast.",
            read(&stats.ws_resyncs_total),
        ),
        (
            "ringside_ws_error_frames_total",
            "counter",
            "Error frames sent in answer to bad client commands.",
            read(&stats.ws_error_frames_total),
        ),
        (
            "ringside_alertmanager_sent_total",
            "counter",
            "Alerts delivered to Alertmanager.",
            read(&stats.alertmanager_sent_total),
        ),
        (
            "ringside_alertmanager_errors_total",
            "counter",
            "Failed deliveries to Alertmanager.",
            read(&stats.alertmanager_errors_total),
        ),
        (
            "ringside_alertmanager_dropped_total",
            "counter",
            "Alert changes dropped because the Alertmanager queue was full.",
            read(&stats.alertmanager_dropped_total),
        ),
    ];
    for (name, kind, help, value) in daemon_series {
        e.single(name, kind, help, value);
    }

    e.family("ringside_alerts_active", "gauge", "Active alerts by severity.");
    for severity in [Severity::Info, Severity::Warning, Severity::Error, Severity::Critical] {
        let count = snapshot.alerts.iter().filter(|a| a.is_active() && a.severity == severity).count();
        e.sample("ringside_alerts_active", &[("severity", severity.as_str())], count as f64);
    }

    if let Some(host) = &snapshot.host {
        e.single(
            "ringside_host_cpu_utilization_ratio",
            "gauge",
            "Busy share of all CPUs over the last tick (0-1).",
            host.cpu_utilization_pct / 100.0,
        );
        e.family(
            "ringside_host_cpu_core_utilization_ratio",
            "gauge",
            "Busy share of each CPU over the last tick (0-1).",
        );
        for (cpu, pct) in host.per_cpu_utilization_pct.iter().enumerate() {
            e.sample("ringside_host_cpu_core_utilization_ratio", &[("cpu", &cpu.to_string())], pct / 100.0);
        }
        e.single(
            "ringside_host_cpu_iowait_ratio",
            "gauge",
            "Share of CPU time waiting for I/O over the last tick (0-1).",
            host.iowait_pct / 100.0,
        );
        e.single("ringside_host_load1", "gauge", "1-minute load average.", host.load1);
        e.single("ringside_host_load5", "gauge", "5-minute load average.", host.load5);
        e.single("ringside_host_load15", "gauge", "15-minute load average.", host.load15);
        e.single("ringside_host_memory_total_bytes", "gauge", "Physical memory.", host.memory.total_bytes as f64);
        e.single(
            "ringside_host_memory_available_bytes",
            "gauge",
            "Memory available to new work.",
            host.memory.available_bytes as f64,
        );
        e.single(
            "ringside_host_memory_used_bytes",
            "gauge",
            "Memory in use (total - available).",
            host.memory.used_bytes as f64,
        );
        e.single("ringside_host_swap_used_bytes", "gauge", "Swap in use.", host.memory.swap_used_bytes as f64);
        e.single(
            "ringside_host_context_switches_total",
            "counter",
            "Context switches since boot.",
            host.context_switches_total as f64,
        );
        e.single("ringside_host_procs_running", "gauge", "Runnable tasks.", f64::from(host.procs_running));
        e.single("ringside_host_procs_blocked", "gauge", "Tasks blocked on I/O.", f64::from(host.procs_blocked));
        if let Some(p) = &host.pressure {
            e.family("ringside_host_pressure_avg10_ratio", "gauge", "Pressure stall information, 10 s average (0-1).");
            for (resource, kind, value) in [
                ("cpu", "some", p.cpu_some_avg10),
                ("memory", "some", p.memory_some_avg10),
                ("memory", "full", p.memory_full_avg10),
                ("io", "some", p.io_some_avg10),
            ] {
                e.sample(
                    "ringside_host_pressure_avg10_ratio",
                    &[("resource", resource), ("kind", kind)],
                    value / 100.0,
                );
            }
        }
        e.family("ringside_host_numa_memory_free_bytes", "gauge", "Free memory per NUMA node.");
        for node in &host.numa {
            e.sample(
                "ringside_host_numa_memory_free_bytes",
                &[("node", &node.node.to_string())],
                node.mem_free_bytes as f64,
            );
        }
    }

    if let Some(s) = &snapshot.scheduler {
        e.family("zernel_scheduler_tasks", "gauge", "Tasks tracked by the scheduler.")
            .sample("zernel_scheduler_tasks", &[("type", "total")], s.total_tracked_tasks as f64)
            .sample("zernel_scheduler_tasks", &[("type", "ml")], s.ml_tasks as f64);
        e.single("zernel_scheduler_decisions_total", "counter", "Scheduling decisions made.", s.decisions_made as f64);
        e.single(
            "zernel_scheduler_phase_transitions_total",
            "counter",
            "Phase transitions seen.",
            s.phase_transitions as f64,
        );
        e.family("zernel_scheduler_phase_tasks", "gauge", "ML tasks in each phase now.");
        for phase in Phase::ALL {
            e.sample(
                "zernel_scheduler_phase_tasks",
                &[("phase", phase.as_str())],
                s.phase_distribution.get(phase) as f64,
            );
        }
        e.family("zernel_scheduler_phase_time_pct", "gauge", "Share of ML task time in each phase (0-100).");
        for phase in Phase::ALL {
            e.sample("zernel_scheduler_phase_time_pct", &[("phase", phase.as_str())], s.phase_time_pct.get(phase));
        }
        e.family("ringside_scheduler_lost_total", "counter", "Records the BPF probe could not keep, by kind.");
        for (kind, value) in [
            ("events", s.lost.events),
            ("runq_samples", s.lost.runq_samples),
            ("threads", s.lost.threads),
            ("ml_threads", s.lost.ml_threads),
            ("skipped_runs", s.lost.skipped_runs),
        ] {
            e.sample("ringside_scheduler_lost_total", &[("kind", kind)], value as f64);
        }
        e.family("ringside_scheduler_backend", "gauge", "1 for what carries out decisions (observe, setattr, scx).");
        e.sample("ringside_scheduler_backend", &[("backend", s.backend.as_str())], 1.0);
        if let Some(x) = &s.scx {
            e.family("ringside_scheduler_scx_running", "gauge", "1 while Ringside's sched_ext scheduler runs.");
            e.sample("ringside_scheduler_scx_running", &[], if x.running { 1.0 } else { 0.0 });
            e.family("ringside_scheduler_scx_events_total", "counter", "Events of the sched_ext scheduler, by kind.");
            let c = &x.counters;
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
                e.sample("ringside_scheduler_scx_events_total", &[("kind", kind)], value as f64);
            }
        }
        // One series per ML process (few per node): which phase it is in, and its time per phase.
        type PerPhase = fn(&ringside_shared::MlProcessInfo, Phase) -> f64;
        let families: [(&str, &str, &str, PerPhase); 2] = [
            ("ringside_scheduler_process_phase", "gauge", "1 for the phase an ML process is in now.", |p, phase| {
                if p.phase == phase {
                    1.0
                } else {
                    0.0
                }
            }),
            (
                "ringside_scheduler_process_phase_seconds_total",
                "counter",
                "Time an ML process spent in each phase.",
                |p, phase| p.phase_ms.get(phase) as f64 / 1000.0,
            ),
        ];
        for (name, kind, help, value) in families {
            e.family(name, kind, help);
            for p in &s.processes {
                let (pid, job) = (p.pid.to_string(), p.job.to_string());
                for phase in Phase::ALL {
                    let labels = [
                        ("pid", pid.as_str()),
                        ("job", job.as_str()),
                        ("comm", p.comm.as_str()),
                        ("phase", phase.as_str()),
                    ];
                    e.sample(name, &labels, value(p, phase));
                }
            }
        }
    }

    if !snapshot.kernels.is_empty() {
        type Field = fn(&ringside_shared::RingKernelMetrics) -> f64;
        let families: [(&str, &str, &str, Field); 6] = [
            ("ringside_kernel_messages_processed_total", "counter", "Messages a ring kernel completed.", |k| {
                k.messages_processed as f64
            }),
            ("ringside_kernel_messages_dropped_total", "counter", "Messages a ring kernel dropped.", |k| {
                k.messages_dropped as f64
            }),
            ("ringside_kernel_latency_seconds_total", "counter", "Sum of enqueue-to-completion latencies.", |k| {
                k.total_latency_ns as f64 / 1e9
            }),
            ("ringside_kernel_input_queue_depth", "gauge", "Messages waiting in the input ring.", |k| {
                f64::from(k.input_queue_depth)
            }),
            ("ringside_kernel_output_queue_depth", "gauge", "Messages waiting in the output ring.", |k| {
                f64::from(k.output_queue_depth)
            }),
            ("ringside_kernel_gpu_memory_used_bytes", "gauge", "GPU memory a ring kernel holds.", |k| {
                k.gpu_memory_used as f64
            }),
        ];
        for (name, kind, help, field) in families {
            e.family(name, kind, help);
            for k in &snapshot.kernels {
                e.sample(
                    name,
                    &[
                        ("kernel", &k.id),
                        ("backend", if k.backend == ringside_shared::KernelBackend::Cuda { "cuda" } else { "cpu" }),
                    ],
                    field(k),
                );
            }
        }
        kernel_stats(&mut e, &snapshot.kernels);
    }
    if let Some(gpus) = &snapshot.gpus {
        gpu_families(&mut e, &gpus.devices);
        job_idle(&mut e, &gpus.idle);
    }
    e.out
}

/// The idle attribution: per job and GPU, the last minute's and the last step's idle shares
/// by phase (and waiting for a CPU), and the step's length.
fn job_idle(e: &mut Exposition, idle: &[GpuIdleAttribution]) {
    let split = |by_phase: &PhaseValues<f64>, cpu: f64| {
        Phase::ALL.iter().map(|p| (p.as_str(), by_phase.get(*p))).chain([("waiting_for_cpu", cpu)]).collect::<Vec<_>>()
    };
    type Split<'a> = fn(&'a GpuIdleAttribution) -> Option<(&'a PhaseValues<f64>, f64)>;
    let families: [(&str, &str, Split); 2] = [
        (
            "ringside_job_gpu_idle_ratio",
            "Share of the last minute a GPU an ML job uses was idle, by the job's phase meanwhile.",
            |a| Some((&a.idle_by_phase_pct, a.idle_waiting_for_cpu_pct)),
        ),
        (
            "ringside_job_gpu_step_idle_ratio",
            "Share of an ML job's last complete step a GPU it uses was idle, by the job's phase meanwhile.",
            |a| a.last_step.as_ref().map(|s| (&s.idle_by_phase_pct, s.idle_waiting_for_cpu_pct)),
        ),
    ];
    for (family, help, of) in families {
        let rows: Vec<_> = idle.iter().filter_map(|a| of(a).map(|(by_phase, cpu)| (a, split(by_phase, cpu)))).collect();
        if rows.is_empty() {
            continue;
        }
        e.family(family, "gauge", help);
        for (a, shares) in rows {
            let (job, gpu) = (a.job.to_string(), a.gpu.to_string());
            for (phase, pct) in shares {
                let labels = [
                    ("job", job.as_str()),
                    ("comm", a.comm.as_str()),
                    ("gpu", gpu.as_str()),
                    ("uuid", a.uuid.as_str()),
                    ("phase", phase),
                ];
                e.sample(family, &labels, pct / 100.0);
            }
        }
    }
    let steps: Vec<_> = idle.iter().filter_map(|a| a.last_step.as_ref().map(|s| (a, s))).collect();
    if !steps.is_empty() {
        e.family(
            "ringside_job_step_seconds",
            "gauge",
            "Length of an ML job's last complete step, as seen from a GPU it uses.",
        );
        for (a, step) in steps {
            let (job, gpu) = (a.job.to_string(), a.gpu.to_string());
            let labels =
                [("job", job.as_str()), ("comm", a.comm.as_str()), ("gpu", gpu.as_str()), ("uuid", a.uuid.as_str())];
            e.sample("ringside_job_step_seconds", &labels, step.end_ms.saturating_sub(step.start_ms) as f64 / 1000.0);
        }
    }
}

/// The GPUs under the names and labels dcgm-exporter uses by default (`gpu`, `UUID`,
/// `device`, `modelName`, `Hostname`, `pci_bus_id`; its units: MiB, MHz, W, mJ, %), so
/// dashboards and alert rules written for it work on a Ringside node. Served apart from
/// `/metrics` (at `/metrics/dcgm`): those names break Prometheus' naming lint (camelCase
/// labels, counters without `_total`), exactly as dcgm-exporter's own output does. A field a GPU
/// does not report has no sample.
pub fn render_dcgm(gpus: &[ringside_shared::GpuDevice], hostname: &str) -> String {
    use ringside_shared::GpuDevice;
    type Field = fn(&GpuDevice) -> Option<f64>;
    const MIB: f64 = 1024.0 * 1024.0;
    let families: [(&str, &str, &str, Field); 18] = [
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", |g| g.utilization_gpu_pct),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", |g| {
            Some(g.xids.last().map_or(0.0, |x| x.code as f64))
        }),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", |g| g.utilization_memory_pct),
        ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", |g| {
            g.memory_used_bytes.map(|b| (b as f64 / MIB).floor())
        }),
        ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", |g| {
            g.memory_free_bytes.map(|b| (b as f64 / MIB).floor())
        }),
        ("DCGM_FI_DEV_FB_TOTAL", "gauge", "Framebuffer memory total (in MiB).", |g| {
            g.memory_total_bytes.map(|b| (b as f64 / MIB).floor())
        }),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", |g| g.power_draw_w),
        ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit (in W).", |g| g.power_limit_w),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).", |g| {
            g.energy_j.map(|j| (j * 1000.0).round())
        }),
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", |g| g.temperature_gpu_c.map(f64::from)),
        ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", |g| g.temperature_memory_c.map(f64::from)),
        ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", |g| g.sm_clock_mhz.map(f64::from)),
        ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", |g| g.memory_clock_mhz.map(f64::from)),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", |g| {
            g.pcie_replay_count.map(|n| n as f64)
        }),
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.", |g| {
            g.ecc_corrected_volatile.map(|n| n as f64)
        }),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.", |g| {
            g.ecc_uncorrected_volatile.map(|n| n as f64)
        }),
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors.", |g| {
            g.remapped_rows_correctable.map(|n| n as f64)
        }),
        (
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "counter",
            "Number of remapped rows for uncorrectable errors.",
            |g| g.remapped_rows_uncorrectable.map(|n| n as f64),
        ),
    ];
    let mut e = Exposition::default();
    let labels: Vec<[(&str, String); 6]> = gpus
        .iter()
        .map(|g| {
            [
                ("gpu", g.index.to_string()),
                ("UUID", g.uuid.clone()),
                ("device", format!("nvidia{}", g.index)),
                ("modelName", g.name.clone()),
                ("Hostname", hostname.to_string()),
                ("pci_bus_id", g.pci_bus_id.clone()),
            ]
        })
        .collect();
    for (name, kind, help, field) in families {
        let values: Vec<(usize, f64)> = gpus.iter().enumerate().filter_map(|(n, g)| field(g).map(|v| (n, v))).collect();
        if values.is_empty() {
            continue;
        }
        e.family(name, kind, help);
        for (n, value) in values {
            let pairs: Vec<(&str, &str)> = labels[n].iter().map(|(k, v)| (*k, v.as_str())).collect();
            e.sample(name, &pairs, value);
        }
    }
    e.out
}

/// The GPUs' figures in base units, labelled by NVML index and UUID (as dcgm-exporter does,
/// so dashboards can join on either). A field a GPU does not report has no sample, not a 0.
fn gpu_families(e: &mut Exposition, gpus: &[ringside_shared::GpuDevice]) {
    use ringside_shared::GpuDevice;
    if gpus.is_empty() {
        return;
    }
    let index: Vec<String> = gpus.iter().map(|g| g.index.to_string()).collect();
    e.family("ringside_gpu_info", "gauge", "One series per GPU with its name and PCI bus id; always 1.");
    for (g, i) in gpus.iter().zip(&index) {
        let labels = [("gpu", i.as_str()), ("uuid", &g.uuid), ("name", &g.name), ("pci_bus_id", &g.pci_bus_id)];
        e.sample("ringside_gpu_info", &labels, 1.0);
    }
    type Field = fn(&GpuDevice) -> Option<f64>;
    let families: [(&str, &str, &str, Field); 21] = [
        ("ringside_gpu_xid_errors_total", "counter", "XID errors the driver reported since ringsided started.", |g| {
            Some(g.xid_count as f64)
        }),
        ("ringside_gpu_utilization_ratio", "gauge", "Share of the last sample period the GPU was busy.", |g| {
            g.utilization_gpu_pct.map(|p| p / 100.0)
        }),
        (
            "ringside_gpu_memory_utilization_ratio",
            "gauge",
            "Share of the last sample period memory was read or written.",
            |g| g.utilization_memory_pct.map(|p| p / 100.0),
        ),
        ("ringside_gpu_sm_clock_hertz", "gauge", "SM clock.", |g| g.sm_clock_mhz.map(|v| f64::from(v) * 1e6)),
        ("ringside_gpu_sm_clock_max_hertz", "gauge", "Highest SM clock.", |g| {
            g.sm_clock_max_mhz.map(|v| f64::from(v) * 1e6)
        }),
        ("ringside_gpu_memory_clock_hertz", "gauge", "Memory clock.", |g| {
            g.memory_clock_mhz.map(|v| f64::from(v) * 1e6)
        }),
        ("ringside_gpu_memory_used_bytes", "gauge", "Framebuffer memory allocated.", |g| {
            g.memory_used_bytes.map(|v| v as f64)
        }),
        ("ringside_gpu_memory_total_bytes", "gauge", "Framebuffer memory installed.", |g| {
            g.memory_total_bytes.map(|v| v as f64)
        }),
        ("ringside_gpu_temperature_celsius", "gauge", "GPU die temperature.", |g| g.temperature_gpu_c.map(f64::from)),
        ("ringside_gpu_memory_temperature_celsius", "gauge", "HBM temperature.", |g| {
            g.temperature_memory_c.map(f64::from)
        }),
        ("ringside_gpu_power_watts", "gauge", "Power draw.", |g| g.power_draw_w),
        ("ringside_gpu_power_limit_watts", "gauge", "Power limit the driver enforces.", |g| g.power_limit_w),
        ("ringside_gpu_energy_joules_total", "counter", "Energy used since the driver was loaded.", |g| g.energy_j),
        ("ringside_gpu_pcie_tx_bytes_per_second", "gauge", "PCIe transmit throughput.", |g| {
            g.pcie_tx_bytes_per_s.map(|v| v as f64)
        }),
        ("ringside_gpu_pcie_rx_bytes_per_second", "gauge", "PCIe receive throughput.", |g| {
            g.pcie_rx_bytes_per_s.map(|v| v as f64)
        }),
        ("ringside_gpu_pcie_replays_total", "counter", "PCIe replays.", |g| g.pcie_replay_count.map(|v| v as f64)),
        ("ringside_gpu_nvlink_tx_bytes_total", "counter", "Data sent over NVLink, all links.", |g| {
            g.nvlink_tx_bytes.map(|v| v as f64)
        }),
        ("ringside_gpu_nvlink_rx_bytes_total", "counter", "Data received over NVLink, all links.", |g| {
            g.nvlink_rx_bytes.map(|v| v as f64)
        }),
        (
            "ringside_gpu_ecc_corrected_errors_total",
            "counter",
            "Corrected ECC errors since the driver was loaded.",
            |g| g.ecc_corrected_volatile.map(|v| v as f64),
        ),
        (
            "ringside_gpu_ecc_uncorrected_errors_total",
            "counter",
            "Uncorrected ECC errors since the driver was loaded.",
            |g| g.ecc_uncorrected_volatile.map(|v| v as f64),
        ),
        ("ringside_gpu_remapped_rows", "gauge", "Memory rows remapped (correctable and uncorrectable).", |g| {
            Some((g.remapped_rows_correctable? + g.remapped_rows_uncorrectable?) as f64)
        }),
    ];
    for (name, kind, help, field) in families {
        let values: Vec<(usize, f64)> = gpus.iter().enumerate().filter_map(|(n, g)| field(g).map(|v| (n, v))).collect();
        if values.is_empty() {
            continue;
        }
        e.family(name, kind, help);
        for (n, value) in values {
            e.sample(name, &[("gpu", &index[n]), ("uuid", &gpus[n].uuid)], value);
        }
    }
    if gpus.iter().any(|g| g.throttle_reasons.is_some()) {
        e.family("ringside_gpu_clocks_throttled", "gauge", "1 while the reason holds the GPU's clocks down.");
        for (g, i) in gpus.iter().zip(&index) {
            let Some(held) = &g.throttle_reasons else { continue };
            for reason in crate::gpu::THROTTLE_REASONS.map(|(_, name)| name) {
                let value = if held.iter().any(|r| r == reason) { 1.0 } else { 0.0 };
                e.sample("ringside_gpu_clocks_throttled", &[("gpu", i), ("uuid", &g.uuid), ("reason", reason)], value);
            }
        }
    }
}

/// What `stats` kernels computed, per input, in base units (their figures divided by
/// `per_unit`): run-queue latencies in seconds, utilisation as a ratio.
fn kernel_stats(e: &mut Exposition, kernels: &[ringside_shared::RingKernelMetrics]) {
    let with_stats: Vec<(&str, &ringside_shared::KernelStatsOutput)> =
        kernels.iter().filter_map(|k| Some((k.id.as_str(), k.output_stats.as_ref()?))).collect();
    if with_stats.is_empty() {
        return;
    }
    e.family("ringside_kernel_stats_samples_total", "counter", "Samples a stats ring kernel has summarised.");
    for (id, s) in &with_stats {
        e.sample("ringside_kernel_stats_samples_total", &[("kernel", id), ("input", s.input.as_str())], s.count as f64);
    }
    let inputs = [
        (
            StatsInput::RunqLatency,
            "ringside_kernel_stats_runq_latency_seconds",
            "Run-queue latency of tracked ML threads, as a stats ring kernel summarises it.",
            1e6,
        ),
        (
            StatsInput::CpuUtilization,
            "ringside_kernel_stats_cpu_utilization_ratio",
            "Per-CPU utilisation, as a stats ring kernel summarises it.",
            100.0,
        ),
    ];
    for (input, name, help, per_unit) in inputs {
        let of_input: Vec<_> = with_stats.iter().filter(|(_, s)| s.input == input).collect();
        if of_input.is_empty() {
            continue;
        }
        e.family(name, "gauge", help);
        for (id, s) in of_input {
            for (stat, value) in [("mean", s.mean), ("p50", s.p50), ("p90", s.p90), ("p99", s.p99), ("max", s.max)] {
                e.sample(name, &[("kernel", id), ("stat", stat)], value / per_unit);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_are_exported_under_dcgm_exporter_names_and_units() {
        let gpu = ringside_shared::GpuDevice {
            index: 3,
            name: "NVIDIA H200".into(),
            uuid: "GPU-3".into(),
            pci_bus_id: "00000000:1B:00.0".into(),
            utilization_gpu_pct: Some(97.0),
            memory_used_bytes: Some(81_920 * 1024 * 1024 + 5),
            energy_j: Some(5440.124),
            ..ringside_shared::GpuDevice::default()
        };
        let text = render_dcgm(&[gpu], "node-7");
        let labels = "gpu=\"3\",UUID=\"GPU-3\",device=\"nvidia3\",modelName=\"NVIDIA H200\",Hostname=\"node-7\",pci_bus_id=\"00000000:1B:00.0\"";
        assert!(text.contains(&format!("DCGM_FI_DEV_GPU_UTIL{{{labels}}} 97\n")), "{text}");
        assert!(text.contains(&format!("DCGM_FI_DEV_FB_USED{{{labels}}} 81920\n")), "MiB: {text}");
        assert!(text.contains(&format!("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} 5440124\n")), "mJ: {text}");
        assert!(!text.contains("DCGM_FI_DEV_GPU_TEMP"), "not reported, not exported: {text}");
        assert_eq!(render_dcgm(&[], "node-7"), "");
    }

    #[test]
    fn gpus_are_exported_in_base_units_and_unreported_fields_have_no_sample() {
        let gpu = |index: u32, util: Option<f64>| ringside_shared::GpuDevice {
            index,
            name: "NVIDIA H200".into(),
            uuid: format!("GPU-{index}"),
            pci_bus_id: format!("00000000:{index:02x}:00.0"),
            utilization_gpu_pct: util,
            sm_clock_mhz: Some(1980),
            power_draw_w: Some(412.5),
            throttle_reasons: Some(vec!["sw_power_cap".into()]),
            ..ringside_shared::GpuDevice::default()
        };
        let mut e = Exposition::default();
        gpu_families(&mut e, &[gpu(0, Some(97.0)), gpu(1, None)]);
        let text = e.out;
        assert!(text.contains("ringside_gpu_utilization_ratio{gpu=\"0\",uuid=\"GPU-0\"} 0.97"), "{text}");
        assert!(!text.contains("ringside_gpu_utilization_ratio{gpu=\"1\""), "no value, no sample:\n{text}");
        assert!(text.contains("ringside_gpu_sm_clock_hertz{gpu=\"1\",uuid=\"GPU-1\"} 1980000000"), "{text}");
        assert!(text.contains("ringside_gpu_power_watts{gpu=\"0\",uuid=\"GPU-0\"} 412.5"), "{text}");
        assert!(
            text.contains("ringside_gpu_clocks_throttled{gpu=\"0\",uuid=\"GPU-0\",reason=\"sw_power_cap\"} 1"),
            "{text}"
        );
        assert!(text.contains("ringside_gpu_clocks_throttled{gpu=\"0\",uuid=\"GPU-0\",reason=\"hw_slowdown\"} 0"));
        assert!(!text.contains("ringside_gpu_temperature_celsius"), "a family nobody reports is left out");
        assert!(text.contains(
            "ringside_gpu_info{gpu=\"1\",uuid=\"GPU-1\",name=\"NVIDIA H200\",pci_bus_id=\"00000000:01:00.0\"} 1"
        ));
    }

    #[test]
    fn stats_kernels_are_exported_in_base_units() {
        let kernel = |id: &str, input: StatsInput, p99: f64| ringside_shared::RingKernelMetrics {
            id: id.into(),
            kernel: "stats".into(),
            output_stats: Some(ringside_shared::KernelStatsOutput {
                input,
                unit: input.unit(),
                count: 7,
                mean: 1.0,
                p50: 1.0,
                p90: 2.0,
                p99,
                max: 500.0,
            }),
            ..Default::default()
        };
        let mut e = Exposition::default();
        kernel_stats(
            &mut e,
            &[kernel("runq", StatsInput::RunqLatency, 250.0), kernel("cpu", StatsInput::CpuUtilization, 50.0)],
        );
        assert!(e.out.contains("ringside_kernel_stats_samples_total{kernel=\"runq\",input=\"runq_latency\"} 7\n"));
        assert!(e.out.contains("ringside_kernel_stats_runq_latency_seconds{kernel=\"runq\",stat=\"p99\"} 0.00025\n"));
        assert!(e.out.contains("ringside_kernel_stats_cpu_utilization_ratio{kernel=\"cpu\",stat=\"p99\"} 0.5\n"));
        assert_eq!(e.out.matches("# TYPE").count(), 3, "one family each:\n{}", e.out);
        let mut none = Exposition::default();
        kernel_stats(&mut none, &[]);
        assert!(none.out.is_empty());
    }

    #[test]
    fn formats() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(number(1.0), "1");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
        let mut e = Exposition::default();
        e.family("x_total", "counter", "Help.").sample("x_total", &[("a", "1"), ("b", "q\"")], 3.0);
        assert_eq!(e.out, "# HELP x_total Help.\n# TYPE x_total counter\nx_total{a=\"1\",b=\"q\\\"\"} 3\n");
    }
}
