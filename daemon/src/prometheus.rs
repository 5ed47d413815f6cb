//! `/metrics` in the Prometheus text exposition format (version 0.0.4): every family of the
//! metric registry ([`crate::metrics::ALL`]) that has values; and `/metrics/dcgm`, the GPUs
//! under dcgm-exporter's names.
//!
//! The scheduler's series keep the reference scheduler's `zernel_scheduler_*` names so existing
//! dashboards work; everything else is `ringside_*`.

use std::fmt::Write;

use crate::alerts::number;
use crate::metrics::{self, View};
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
}

pub fn render(state: &NodeState, role: ringside_shared::Role) -> String {
    let snapshot = state.snapshot_for(role);
    let view = View {
        readings: &snapshot.readings,
        components: &snapshot.components,
        alerts: &snapshot.alerts,
        daemon: Some(&state.stats),
        now_ms: snapshot.taken_at_ms,
    };
    render_view(&view)
}

/// Every family of the registry that has values in `view`; a family without values (a source
/// absent, a field no GPU reports) is left out.
pub fn render_view(view: &View) -> String {
    let mut e = Exposition::default();
    for def in metrics::ALL {
        let points = def.points(view);
        if points.is_empty() {
            continue;
        }
        e.family(def.name, def.kind.as_str(), def.help);
        for p in points {
            let labels: Vec<(&str, &str)> =
                def.labels.iter().copied().zip(p.labels.iter().map(String::as_str)).collect();
            e.sample(def.name, &labels, p.value);
        }
    }
    e.out
}

/// The GPUs under the names and labels dcgm-exporter uses by default (`gpu`, `UUID`,
/// `device`, `modelName`, `Hostname`, `pci_bus_id`; its units: MiB, MHz, W, mJ, %), so
/// dashboards and alert rules written for it work on a Ringside node. Served apart from
/// `/metrics` (at `/metrics/dcgm`): those names break Prometheus' naming lint (camelCase
/// labels, counters without `_total`), exactly as dcgm-exporter's own output does. A field a GPU
/// does not report has no sample.
///
/// A GPU that processes of a known job (`identity`: a Slurm job, a torchrun run, a pod) hold open
/// also carries `hpc_job`, as dcgm-exporter's job mapping writes it, here without a prolog.
pub fn render_dcgm(
    gpus: &[ringside_shared::GpuDevice],
    hostname: &str,
    processes: &[ringside_shared::MlProcessInfo],
) -> String {
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
    let labels: Vec<Vec<(&str, String)>> = gpus
        .iter()
        .map(|g| {
            let mut labels = vec![
                ("gpu", g.index.to_string()),
                ("UUID", g.uuid.clone()),
                ("device", format!("nvidia{}", g.index)),
                ("modelName", g.name.clone()),
                ("Hostname", hostname.to_string()),
                ("pci_bus_id", g.pci_bus_id.clone()),
            ];
            let mut jobs: Vec<String> = g
                .processes
                .iter()
                .filter_map(|gp| processes.iter().find(|p| p.pid == gp.pid))
                .filter_map(|p| p.identity.job_id())
                .collect();
            jobs.sort();
            jobs.dedup();
            if !jobs.is_empty() {
                labels.push(("hpc_job", jobs.join(",")));
            }
            labels
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

#[cfg(test)]
mod tests {
    use super::*;
    use ringside_shared::{Readings, StatsInput};

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
        let text = render_dcgm(std::slice::from_ref(&gpu), "node-7", &[]);
        let labels = "gpu=\"3\",UUID=\"GPU-3\",device=\"nvidia3\",modelName=\"NVIDIA H200\",Hostname=\"node-7\",pci_bus_id=\"00000000:1B:00.0\"";
        assert!(text.contains(&format!("DCGM_FI_DEV_GPU_UTIL{{{labels}}} 97\n")), "{text}");
        assert!(text.contains(&format!("DCGM_FI_DEV_FB_USED{{{labels}}} 81920\n")), "MiB: {text}");
        assert!(text.contains(&format!("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} 5440124\n")), "mJ: {text}");
        assert!(!text.contains("DCGM_FI_DEV_GPU_TEMP"), "not reported, not exported: {text}");
        assert_eq!(render_dcgm(&[], "node-7", &[]), "");
        // The job of the processes on a GPU, where their identity says it.
        let on_gpu = ringside_shared::GpuDevice {
            processes: vec![ringside_shared::GpuProcess { pid: 4001, ..Default::default() }],
            ..gpu
        };
        let rank = ringside_shared::MlProcessInfo {
            pid: 4001,
            identity: ringside_shared::JobIdentity {
                slurm_job: Some("4242".into()),
                slurm_step: Some("0".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let text = render_dcgm(&[on_gpu], "node-7", &[rank]);
        assert!(text.contains(&format!("DCGM_FI_DEV_GPU_UTIL{{{labels},hpc_job=\"4242.0\"}} 97\n")), "{text}");
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
            throttle_reasons: Some(vec![ringside_shared::ThrottleReason::SwPowerCap]),
            ..ringside_shared::GpuDevice::default()
        };
        let gpus =
            ringside_shared::GpuTelemetry { devices: vec![gpu(0, Some(97.0)), gpu(1, None)], ..Default::default() };
        let readings = Readings { gpus: Some(gpus), ..Readings::default() };
        let text = render_view(&View::of(&readings, 0));
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
        let kernels = [kernel("runq", StatsInput::RunqLatency, 250.0), kernel("cpu", StatsInput::CpuUtilization, 50.0)];
        let readings = Readings { kernels: kernels.to_vec(), ..Readings::default() };
        let text = render_view(&View::of(&readings, 0));
        assert!(text.contains("ringside_kernel_stats_samples_total{kernel=\"runq\",input=\"runq_latency\"} 7\n"));
        assert!(text.contains("ringside_kernel_stats_runq_latency_seconds{kernel=\"runq\",stat=\"p99\"} 0.00025\n"));
        assert!(text.contains("ringside_kernel_stats_cpu_utilization_ratio{kernel=\"cpu\",stat=\"p99\"} 0.5\n"));
        let stats = text.lines().filter(|l| l.starts_with("# TYPE ringside_kernel_stats")).count();
        assert_eq!(stats, 3, "one family each:\n{text}");
        assert!(!render_view(&View::of(&Readings::default(), 0)).contains("ringside_kernel_stats"));
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
