//! The GPU source: the node's NVIDIA GPUs through NVML (`nvml-wrapper`, which loads
//! `libnvidia-ml.so.1` at run time, so a build needs no driver).
//!
//! NVML is read on a thread of its own, once per collection interval; the source only takes
//! the latest reading. A driver that hangs in a call (a GPU falling off the bus can hold NVML
//! for seconds) therefore never holds up a tick: the reading goes stale, and the source says so.
//!
//! Every field is read on its own: what a GPU or driver does not report is `None` with the
//! reason under the field's name, never 0. A node without the NVIDIA driver has nothing to
//! watch: with `[gpu] mode = "auto"` (the default) the component is `absent`, not a fault.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{
    Clock, ComputeMode, EccCounter, MemoryError, PcieUtilCounter, PerformanceState, RetirementCause, Sampling,
    TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_NVLINK_LINK_COUNT};
use nvml_wrapper::{Device, Nvml};
use ringside_shared::{GpuComputeMode, GpuDevice, GpuTelemetry, GpuUtilizationSample, ThrottleReason};
use serde::Deserialize;

use crate::pipeline::{MetricsSource, Sample, SourceError, SourceStatus};

/// `[gpu]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    #[serde(default)]
    pub mode: GpuMode,
}

/// Whether the GPU source runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuMode {
    /// Runs; a node without the NVIDIA driver shows the component as absent.
    #[default]
    Auto,
    /// Runs; a node without the driver is a degraded component (a GPU node that lost it).
    On,
    /// Not started.
    Off,
}

/// At most this many GPUs are read (a node has 8 or 16; bounds one reading's work).
pub const MAX_GPUS: u32 = 64;

/// What the sampler thread last published.
struct Published {
    telemetry: GpuTelemetry,
    /// When it was published (for staleness).
    at: Instant,
    /// NVML cannot be loaded at all: there is no NVIDIA driver here.
    no_driver: bool,
}

pub struct GpuSource {
    mode: GpuMode,
    interval: Duration,
    published: Arc<Mutex<Option<Published>>>,
    stop: Arc<AtomicBool>,
    started: Instant,
}

impl GpuSource {
    /// Starts the sampler thread, reading every `interval`.
    pub fn start(config: &GpuConfig, interval: Duration) -> GpuSource {
        let published = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let (out, quit) = (published.clone(), stop.clone());
        // A panic in the sampler (a driver answering what nobody expected) is reported as the
        // GPUs' state and the sampler started again after a backoff.
        let spawned = std::thread::Builder::new().name("ringside-gpu".into()).spawn(move || {
            let report = |why: &str, wait: Duration| {
                tracing::error!("the GPU sampler panicked: {why}; starting it again in {wait:?}");
                let reason = format!("the GPU sampler panicked: {why}; starting it again in {} s", wait.as_secs());
                let telemetry = GpuTelemetry { available: false, reason: Some(reason), ..GpuTelemetry::default() };
                *out.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(Published { telemetry, at: Instant::now(), no_driver: false });
            };
            crate::pipeline::supervised(
                crate::pipeline::Backoff::DEFAULT,
                &quit,
                || sample(interval, out.clone(), quit.clone()),
                report,
            );
        });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the GPU sampler thread: {e}");
        }
        GpuSource { mode: config.mode, interval, published, stop, started: Instant::now() }
    }
}

impl Drop for GpuSource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl MetricsSource for GpuSource {
    fn name(&self) -> &str {
        crate::pipeline::Component::Gpu.as_str()
    }

    fn collect(&mut self, sample: &mut Sample) -> Result<SourceStatus, SourceError> {
        let published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        let Some(latest) = published.as_ref() else {
            // NVML's first start can take seconds (no persistence daemon): not a fault yet.
            return Ok(if self.started.elapsed() < STARTUP_GRACE {
                SourceStatus::Degraded("starting: NVML has not answered yet".into())
            } else {
                SourceStatus::Degraded(format!("NVML has not answered for {} s", self.started.elapsed().as_secs()))
            });
        };
        let mut telemetry = latest.telemetry.clone();
        let stale = latest.at.elapsed();
        let status = if latest.no_driver && self.mode == GpuMode::Auto {
            SourceStatus::Absent(telemetry.reason.clone().unwrap_or_default())
        } else if stale > self.interval * STALE_INTERVALS + STARTUP_GRACE {
            let why = format!("NVML has not answered for {} s: the readings shown are old", stale.as_secs());
            telemetry.available = false;
            telemetry.reason = Some(why.clone());
            SourceStatus::Degraded(why)
        } else if let Some(why) = problems(&telemetry) {
            SourceStatus::Degraded(why)
        } else {
            SourceStatus::Up
        };
        sample.readings.gpus = Some(telemetry);
        Ok(status)
    }
}

/// How long NVML may take to start before the source says it is stuck.
const STARTUP_GRACE: Duration = Duration::from_secs(10);
/// Readings older than this many intervals (plus the grace) are stale.
const STALE_INTERVALS: u32 = 5;

/// What makes the GPU component degraded: NVML unavailable, or a GPU lost (named, whatever
/// else is said).
fn problems(telemetry: &GpuTelemetry) -> Option<String> {
    let mut problems: Vec<String> = telemetry
        .devices
        .iter()
        .filter(|d| d.unsupported.contains_key("gpu"))
        .map(|d| format!("GPU {} ({}): {}", d.index, d.uuid, d.unsupported["gpu"]))
        .collect();
    if !telemetry.available {
        let why = telemetry.reason.as_deref().unwrap_or("NVML did not answer");
        problems.insert(0, format!("gpu unavailable: {why}"));
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// The sampler thread: NVML is started (and again after a failure or a lost GPU, at most every
/// 30 s) and read every `interval` until `stop`; between readings it waits on NVML's events.
fn sample(interval: Duration, out: Arc<Mutex<Option<Published>>>, stop: Arc<AtomicBool>) {
    let publish = |telemetry: GpuTelemetry, no_driver: bool| {
        *out.lock().unwrap_or_else(|e| e.into_inner()) = Some(Published { telemetry, at: Instant::now(), no_driver });
    };
    let mut xids = XidLog::default();
    let mut continuity = Continuity::default();
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let (failed, retry) = match Nvml::init() {
            Ok(nvml) => match session(&nvml, interval, &publish, &stop, &mut xids, &mut continuity) {
                None => return,
                // The last reading stays on show, each lost GPU saying so.
                Some(last) => {
                    let reason = Some("a GPU was lost: NVML is started again within 30 s".to_string());
                    ((GpuTelemetry { available: false, reason, ..last }, false), Duration::from_secs(30))
                }
            },
            Err(e) => {
                let library_missing = matches!(e, NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound);
                let on_bus = nvidia_gpus_on_bus();
                // The library without the kernel driver and without an NVIDIA GPU is a node
                // that has NVIDIA's user-space libraries (a CUDA image) and nothing to watch.
                let no_driver = library_missing || (matches!(e, NvmlError::DriverNotLoaded) && on_bus == 0);
                // Without the library there is nothing to retry for until the driver is
                // installed; a failed start (driver not loaded yet) is retried sooner.
                ((unavailable(&e, on_bus), no_driver), Duration::from_secs(if library_missing { 300 } else { 30 }))
            }
        };
        // Why NVML is not running, republished every interval until it runs (so the reading is
        // current, not stale).
        while started.elapsed() < retry && !stop.load(Ordering::Relaxed) {
            publish(failed.0.clone(), failed.1);
            pause(interval, &stop);
        }
    }
}

/// Sleeps `interval` in short steps, so a stop is seen quickly.
fn pause(interval: Duration, stop: &AtomicBool) {
    let mut left = interval.max(Duration::from_millis(10));
    while left > Duration::ZERO && !stop.load(Ordering::Relaxed) {
        let step = left.min(Duration::from_millis(100));
        std::thread::sleep(step);
        left -= step;
    }
}

/// One NVML session: a reading every `interval`, and the XID and ECC events in between. Ends
/// `None` on `stop`, or with the last reading when a GPU was lost (NVML is started afresh
/// then: a GPU that comes back after a reset has a new handle).
fn session(
    nvml: &Nvml,
    interval: Duration,
    publish: &impl Fn(GpuTelemetry, bool),
    stop: &AtomicBool,
    xids: &mut XidLog,
    continuity: &mut Continuity,
) -> Option<GpuTelemetry> {
    let events = register_events(nvml);
    loop {
        let tick = Instant::now();
        let mut telemetry = read_all(nvml, continuity);
        xids.attach(&mut telemetry);
        telemetry.xid_events = events.is_some();
        // A GPU whose handle answers "lost" ends the session (NVML is started afresh); one
        // that left the driver's list does not (a new start would not bring it back).
        let lost = telemetry.devices.iter().any(|d| d.unsupported.contains_key("gpu"));
        continuity.missing(&mut telemetry);
        publish(telemetry.clone(), false);
        if lost {
            return Some(telemetry);
        }
        let deadline = tick + interval.max(Duration::from_millis(10));
        while !stop.load(Ordering::Relaxed) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let step = left.min(Duration::from_millis(100));
            match &events {
                Some(set) => match set.wait(step.as_millis() as u32) {
                    Ok(event) => xids.record(&event),
                    Err(NvmlError::Timeout) => {}
                    // An event set that fails (a GPU lost) is not waited on again this session:
                    // the next reading says what happened.
                    Err(_) => std::thread::sleep(step),
                },
                None => std::thread::sleep(step),
            }
        }
        if stop.load(Ordering::Relaxed) {
            return None;
        }
    }
}

/// An event set for critical XID errors and double-bit ECC errors on every GPU that supports
/// them; `None` where none does (the readings go on without events).
fn register_events(nvml: &Nvml) -> Option<nvml_wrapper::EventSet<'_>> {
    use nvml_wrapper::bitmasks::event::EventTypes;
    let mut set = nvml.create_event_set().ok()?;
    let mut registered = 0;
    for index in 0..nvml.device_count().unwrap_or(0).min(MAX_GPUS) {
        let Ok(device) = nvml.device_by_index(index) else { continue };
        let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
        let types = device.supported_event_types().map(|s| s & wanted).unwrap_or(EventTypes::empty());
        if types.is_empty() {
            continue;
        }
        // A failed registration frees the set: start another for the remaining GPUs.
        match device.register_events(types, set) {
            Ok(same) => {
                set = same;
                registered += 1;
            }
            Err(e) => {
                tracing::warn!("GPU {index}: cannot watch its XID events: {}", e.error);
                set = nvml.create_event_set().ok()?;
            }
        }
    }
    (registered > 0).then_some(set)
}

/// XID errors kept per GPU (by UUID: indices can change across a reset): the latest
/// [`MAX_XIDS_PER_GPU`], each with its time and what the code means.
#[derive(Default)]
struct XidLog {
    by_gpu: BTreeMap<String, std::collections::VecDeque<ringside_shared::GpuXid>>,
    /// XIDs seen per GPU since the daemon started.
    totals: BTreeMap<String, u64>,
}

/// XIDs kept per GPU.
pub const MAX_XIDS_PER_GPU: usize = 32;

impl XidLog {
    fn record(&mut self, event: &nvml_wrapper::struct_wrappers::event::EventData) {
        use nvml_wrapper::bitmasks::event::EventTypes;
        use nvml_wrapper::enums::event::XidError;
        let Ok(uuid) = event.device.uuid() else { return };
        let code = if event.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
            match event.event_data {
                Some(XidError::Value(code)) => code,
                _ => 999,
            }
        } else if event.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
            48
        } else {
            return;
        };
        self.push(uuid, code, crate::clock::now_ms());
    }

    fn push(&mut self, uuid: String, code: u64, at_ms: u64) {
        *self.totals.entry(uuid.clone()).or_default() += 1;
        let log = self.by_gpu.entry(uuid).or_default();
        if log.len() == MAX_XIDS_PER_GPU {
            log.pop_front();
        }
        log.push_back(ringside_shared::GpuXid { code, at_ms, description: xid_description(code).map(str::to_string) });
    }

    fn attach(&self, telemetry: &mut GpuTelemetry) {
        for gpu in &mut telemetry.devices {
            if let Some(log) = self.by_gpu.get(&gpu.uuid) {
                gpu.xids = log.iter().cloned().collect();
            }
            gpu.xid_count = self.totals.get(&gpu.uuid).copied().unwrap_or(0);
        }
    }
}

/// What an XID code means, for the codes NVIDIA's XID catalogue names most often on compute
/// nodes; `None` for the others (the code is still shown).
pub fn xid_description(code: u64) -> Option<&'static str> {
    Some(match code {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup after earlier errors",
        48 => "double-bit ECC error",
        61 => "internal micro-controller breakpoint or warning",
        62 => "internal micro-controller halt",
        63 => "ECC page retirement or row remapping recorded",
        64 => "ECC page retirement or row remapping failed",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        _ => return None,
    })
}

/// XIDs that mean the GPU or its memory is failing: a critical alert, not a warning.
pub const CRITICAL_XIDS: [u64; 10] = [48, 63, 64, 74, 79, 92, 94, 95, 119, 120];

/// NVIDIA display and 3D controllers on the PCI bus, whether or not a driver has them.
fn nvidia_gpus_on_bus() -> usize {
    crate::host::gpus(&crate::host::HostPaths::default()).iter().filter(|g| g.vendor == "nvidia").count()
}

/// The file NVML is loaded from (`libnvidia-ml.so.<driver version>`), as the dynamic loader
/// finds `libnvidia-ml.so.1`: it names the user-space driver that is installed.
fn nvml_library_file() -> Option<String> {
    let name = std::ffi::CString::new("libnvidia-ml.so.1").ok()?;
    let init = std::ffi::CString::new("nvmlInit_v2").ok()?;
    // SAFETY: dlopen of a library name; the handle is closed below. NVML's constructors do not
    // start the driver (nvmlInit does), so loading it again has no effect of its own.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return None;
    }
    // SAFETY: a handle from dlopen, a valid symbol name.
    let symbol = unsafe { libc::dlsym(handle, init.as_ptr()) };
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr reads the address and fills the struct it is given.
    let found = !symbol.is_null() && unsafe { libc::dladdr(symbol, &mut info) } != 0 && !info.dli_fname.is_null();
    // SAFETY: dli_fname, when set, is the loaded object's NUL-terminated path.
    let path = found.then(|| unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned());
    // SAFETY: the handle from dlopen above, closed once.
    unsafe { libc::dlclose(handle) };
    let path = std::path::PathBuf::from(path?);
    let real = std::fs::canonicalize(&path).unwrap_or(path);
    Some(real.file_name()?.to_string_lossy().into_owned())
}

/// Why NVML is not running, in words an operator can act on; `on_bus`: NVIDIA GPUs on the
/// PCI bus.
fn unavailable(error: &NvmlError, on_bus: usize) -> GpuTelemetry {
    let reason = match error {
        NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound => {
            "no NVIDIA driver on this node (libnvidia-ml.so.1 could not be loaded)".to_string()
        }
        NvmlError::DriverNotLoaded => {
            let library = nvml_library_file().unwrap_or_else(|| "libnvidia-ml.so.1".into());
            if on_bus == 0 {
                format!(
                    "NVIDIA's driver library is installed ({library}) but the NVIDIA kernel driver is not loaded, \
                     and no NVIDIA GPU is on the PCI bus"
                )
            } else {
                format!(
                    "NVIDIA's driver library is installed ({library}) but the NVIDIA kernel driver is not loaded: \
                     the {on_bus} NVIDIA GPU(s) on the PCI bus are not watched. Load it (`modprobe nvidia`), or \
                     install the kernel module built for this kernel"
                )
            }
        }
        NvmlError::NoPermission => "NVML refused to start: no permission to the NVIDIA devices".to_string(),
        other => format!("NVML could not start: {other}"),
    };
    GpuTelemetry { available: false, reason: Some(reason), ..GpuTelemetry::default() }
}

/// Why a field is absent, in words an operator can act on.
fn why(error: &NvmlError) -> String {
    match error {
        NvmlError::NotSupported => "not supported by this GPU or driver".into(),
        NvmlError::NoPermission => "NVML refused: needs more privileges".into(),
        NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound => "this driver's NVML lacks the call".into(),
        NvmlError::GpuLost => "the GPU is lost (fell off the bus or stopped answering)".into(),
        NvmlError::NoData => "no data yet".into(),
        other => other.to_string(),
    }
}

fn read_all(nvml: &Nvml, continuity: &mut Continuity) -> GpuTelemetry {
    let mut telemetry = GpuTelemetry {
        available: true,
        driver_version: nvml.sys_driver_version().ok(),
        cuda_driver_version: nvml.sys_cuda_driver_version().ok().map(|v| {
            format!("{}.{}", nvml_wrapper::cuda_driver_version_major(v), nvml_wrapper::cuda_driver_version_minor(v))
        }),
        nvml_version: nvml.sys_nvml_version().ok(),
        sampled_at_ms: Some(crate::clock::now_ms()),
        ..GpuTelemetry::default()
    };
    let count = match nvml.device_count() {
        Ok(count) => count,
        Err(e) => {
            telemetry.available = false;
            telemetry.reason = Some(format!("NVML cannot count the GPUs: {}", why(&e)));
            return telemetry;
        }
    };
    if count > MAX_GPUS {
        tracing::warn!("NVML lists {count} GPUs: reading the first {MAX_GPUS}");
    }
    for index in 0..count.min(MAX_GPUS) {
        telemetry.devices.push(match nvml.device_by_index(index) {
            Ok(device) => {
                let mut gpu = read_device(nvml, &device, index);
                continuity.follow(&device, &mut gpu);
                gpu
            }
            Err(e) => GpuDevice {
                index,
                unsupported: [("gpu".to_string(), format!("cannot open the GPU: {}", why(&e)))].into(),
                ..GpuDevice::default()
            },
        });
    }
    telemetry
}

/// Collects each field's value, or why it has none.
struct Fields {
    unsupported: BTreeMap<String, String>,
}

impl Fields {
    fn get<T>(&mut self, name: &str, result: Result<T, NvmlError>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(e) => {
                if matches!(e, NvmlError::GpuLost) {
                    self.unsupported.insert("gpu".into(), why(&e));
                }
                self.unsupported.insert(name.into(), why(&e));
                None
            }
        }
    }

    /// One call answering several fields: each of them gets the reason.
    fn get_many<T>(&mut self, names: &[&str], result: Result<T, NvmlError>) -> Option<T> {
        let reason = result.as_ref().err().map(why);
        let value = self.get(names[0], result);
        if let Some(reason) = reason {
            for name in &names[1..] {
                self.unsupported.insert((*name).into(), reason.clone());
            }
        }
        value
    }
}

fn read_device(nvml: &Nvml, device: &Device, index: u32) -> GpuDevice {
    let mut f = Fields { unsupported: BTreeMap::new() };
    let pci = f.get("pci_bus_id", device.pci_info());
    let utilization = f.get_many(&["utilization_gpu_pct", "utilization_memory_pct"], device.utilization_rates());
    let memory = f.get_many(&["memory_used_bytes", "memory_free_bytes", "memory_total_bytes"], device.memory_info());
    let ecc_enabled = device.is_ecc_enabled().map(|state| state.currently_enabled);
    let ecc = |kind: MemoryError| match ecc_enabled {
        Ok(true) => device.total_ecc_errors(kind, EccCounter::Volatile),
        Ok(false) => Err(NvmlError::NotSupported),
        Err(ref e) => Err(clone_error(e)),
    };
    let retired = device.retired_pages(RetirementCause::MultipleSingleBitEccErrors).and_then(|single| {
        device.retired_pages(RetirementCause::DoubleBitEccError).map(|double| (single.len() + double.len()) as u64)
    });
    let remapped = remapped_rows(nvml, device);
    let (nvlink_links, nvlink_traffic) = nvlink(device);
    let mut gpu = GpuDevice {
        index,
        name: f.get("name", device.name()).unwrap_or_default(),
        uuid: f.get("uuid", device.uuid()).unwrap_or_default(),
        pci_bus_id: pci.map(|p| p.bus_id).unwrap_or_default(),
        numa_node: f.get("numa_node", device.numa_node_id()),
        compute_capability: f
            .get("compute_capability", device.cuda_compute_capability())
            .map(|c| format!("{}.{}", c.major, c.minor)),
        utilization_gpu_pct: utilization.as_ref().map(|u| f64::from(u.gpu)),
        utilization_memory_pct: utilization.as_ref().map(|u| f64::from(u.memory)),
        utilization_samples: Vec::new(),
        sm_clock_mhz: f.get("sm_clock_mhz", device.clock_info(Clock::SM)),
        sm_clock_max_mhz: f.get("sm_clock_max_mhz", device.max_clock_info(Clock::SM)),
        memory_clock_mhz: f.get("memory_clock_mhz", device.clock_info(Clock::Memory)),
        memory_clock_max_mhz: f.get("memory_clock_max_mhz", device.max_clock_info(Clock::Memory)),
        memory_used_bytes: memory.as_ref().map(|m| m.used),
        memory_free_bytes: memory.as_ref().map(|m| m.free),
        memory_total_bytes: memory.as_ref().map(|m| m.total),
        temperature_gpu_c: f.get("temperature_gpu_c", device.temperature(TemperatureSensor::Gpu)),
        temperature_memory_c: f.get("temperature_memory_c", memory_temperature(device)),
        temperature_slowdown_c: f
            .get("temperature_slowdown_c", device.temperature_threshold(TemperatureThreshold::Slowdown)),
        power_draw_w: f.get("power_draw_w", device.power_usage()).map(|mw| f64::from(mw) / 1000.0),
        power_limit_w: f.get("power_limit_w", device.enforced_power_limit()).map(|mw| f64::from(mw) / 1000.0),
        energy_j: f.get("energy_j", device.total_energy_consumption()).map(|mj| mj as f64 / 1000.0),
        // NVML answers in KB/s.
        pcie_tx_bytes_per_s: f.get("pcie_tx_bytes_per_s", device.pcie_throughput(PcieUtilCounter::Send)).map(kb),
        pcie_rx_bytes_per_s: f.get("pcie_rx_bytes_per_s", device.pcie_throughput(PcieUtilCounter::Receive)).map(kb),
        pcie_replay_count: f.get("pcie_replay_count", device.pcie_replay_counter()).map(u64::from),
        nvlink_links: f.get("nvlink_links", nvlink_links),
        nvlink_tx_bytes: None,
        nvlink_rx_bytes: None,
        throttle_reasons: f.get("throttle_reasons", device.current_throttle_reasons()).map(throttle_names),
        hw_throttled_since_ms: None,
        ecc_corrected_volatile: f.get("ecc_corrected_volatile", ecc(MemoryError::Corrected)),
        ecc_uncorrected_volatile: f.get("ecc_uncorrected_volatile", ecc(MemoryError::Uncorrected)),
        retired_pages: f.get("retired_pages", retired),
        retired_pages_pending: f.get("retired_pages_pending", device.are_pages_pending_retired()),
        remapped_rows_correctable: None,
        remapped_rows_uncorrectable: None,
        remapped_rows_pending: None,
        remapped_rows_failed: None,
        persistence_mode: f.get("persistence_mode", device.is_in_persistent_mode()),
        compute_mode: f.get("compute_mode", device.compute_mode()).map(compute_mode),
        performance_state: f.get("performance_state", device.performance_state()).map(performance_state_name),
        xids: Vec::new(),
        xid_count: 0,
        processes: Vec::new(),
        unsupported: BTreeMap::new(),
    };
    if let Some((tx, rx)) = f.get_many(&["nvlink_tx_bytes", "nvlink_rx_bytes"], nvlink_traffic) {
        (gpu.nvlink_tx_bytes, gpu.nvlink_rx_bytes) = (Some(tx), Some(rx));
    }
    if let Some(rows) = f.get_many(
        &["remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending", "remapped_rows_failed"],
        remapped,
    ) {
        gpu.remapped_rows_correctable = Some(rows.correctable);
        gpu.remapped_rows_uncorrectable = Some(rows.uncorrectable);
        gpu.remapped_rows_pending = Some(rows.pending);
        gpu.remapped_rows_failed = Some(rows.failed);
    }
    gpu.processes = f.get("processes", processes(device)).unwrap_or_default();
    gpu.unsupported = f.unsupported;
    gpu
}

/// At most this many processes are listed per GPU (bounds a reading on a node where a user
/// starts thousands).
pub const MAX_PROCESSES_PER_GPU: usize = 64;

/// The compute processes on `device`, with their memory and their latest utilisation sample
/// of the last 5 s.
fn processes(device: &Device) -> Result<Vec<ringside_shared::GpuProcess>, NvmlError> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    let mut running = device.running_compute_processes()?;
    running.truncate(MAX_PROCESSES_PER_GPU);
    let since_us = (crate::clock::now_ms().saturating_sub(5_000)) * 1000;
    // No sample in the window is NotFound: then every share is unknown, not 0.
    let samples = device.process_utilization_stats(since_us).unwrap_or_default();
    Ok(running
        .into_iter()
        .map(|p| {
            let latest = samples.iter().filter(|s| s.pid == p.pid).max_by_key(|s| s.timestamp);
            ringside_shared::GpuProcess {
                pid: p.pid,
                namespace_pid: namespace_pid(Path::new("/proc"), p.pid),
                gpu_memory_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes),
                    UsedGpuMemory::Unavailable => None,
                },
                sm_utilization_pct: latest.map(|s| f64::from(s.sm_util)),
                memory_utilization_pct: latest.map(|s| f64::from(s.mem_util)),
            }
        })
        .collect())
}

/// The pid of `pid` inside its own PID namespace (the last `NSpid` entry of its
/// `/proc/<pid>/status`), where that is not this one's. `None` for a process in this
/// namespace, and for a pid this `/proc` does not show (the daemon in a container of its own).
fn namespace_pid(proc_root: &Path, pid: u32) -> Option<u32> {
    let status = crate::sched::trust::read_bounded(&proc_root.join(pid.to_string()).join("status"), 8192)?;
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Vec<u32> = line.split_whitespace().take(64).filter_map(|p| p.parse().ok()).collect();
    (pids.len() > 1).then(|| pids.last().copied()).flatten()
}

/// NVML's utilisation samples are kept this long (the idle attribution consumes them within a
/// few ticks of their arrival), and at most this many per GPU.
const SAMPLES_KEPT_US: u64 = 30_000_000;
const MAX_SAMPLES_KEPT: usize = 256;

/// What the sampler carries from one reading to the next, across NVML restarts: each GPU's
/// recent utilisation samples, since when its clocks have been held down, and the GPUs it has
/// seen (one that leaves the driver's list is reported lost, not forgotten). Every map is
/// keyed by UUID and bounded by [`MAX_GPUS`].
#[derive(Default)]
struct Continuity {
    samples: BTreeMap<String, VecDeque<GpuUtilizationSample>>,
    throttled_since: BTreeMap<String, u64>,
    /// UUID → (index, name) of every GPU seen.
    roster: BTreeMap<String, (u32, String)>,
}

impl Continuity {
    /// Adds what the previous readings know to `gpu`, read just now from `device`.
    fn follow(&mut self, device: &Device, gpu: &mut GpuDevice) {
        if gpu.uuid.is_empty() || gpu.unsupported.contains_key("gpu") {
            return;
        }
        let fits = |map_len: usize, has: bool| has || map_len < MAX_GPUS as usize;
        if fits(self.roster.len(), self.roster.contains_key(&gpu.uuid)) {
            self.roster.insert(gpu.uuid.clone(), (gpu.index, gpu.name.clone()));
        }
        let now_us = crate::clock::now_ms() * 1000;
        if fits(self.samples.len(), self.samples.contains_key(&gpu.uuid)) {
            let kept = self.samples.entry(gpu.uuid.clone()).or_default();
            let last = kept.back().map(|s| s.at_us);
            match device.samples(Sampling::GpuUtilization, last) {
                Ok(new) => add_samples(kept, new.into_iter().map(|s| (s.timestamp, sample_value(&s.value)))),
                // Nothing newer than `last`.
                Err(NvmlError::NotFound) => {}
                Err(e) => {
                    gpu.unsupported.insert("utilization_samples".into(), why(&e));
                }
            }
            while kept.front().is_some_and(|s| s.at_us + SAMPLES_KEPT_US < now_us) || kept.len() > MAX_SAMPLES_KEPT {
                kept.pop_front();
            }
            gpu.utilization_samples = kept.iter().copied().collect();
        }
        let held = gpu.throttle_reasons.iter().flatten().any(|r| r.is_hardware());
        if !held {
            self.throttled_since.remove(&gpu.uuid);
        } else if fits(self.throttled_since.len(), self.throttled_since.contains_key(&gpu.uuid)) {
            gpu.hw_throttled_since_ms = Some(*self.throttled_since.entry(gpu.uuid.clone()).or_insert(now_us / 1000));
        }
    }

    /// Lists each GPU seen before that the driver no longer lists (its count dropped: a GPU
    /// that fell off the bus), as lost.
    fn missing(&mut self, telemetry: &mut GpuTelemetry) {
        if !telemetry.available {
            return;
        }
        let listed = telemetry.devices.len();
        let absent: Vec<(String, u32, String)> = self
            .roster
            .iter()
            // A listed GPU that could not be read has no UUID: it may be this one, at its index.
            .filter(|(uuid, (index, _))| {
                !telemetry.devices.iter().any(|d| &d.uuid == *uuid || (d.uuid.is_empty() && d.index == *index))
            })
            .map(|(uuid, (index, name))| (uuid.clone(), *index, name.clone()))
            .collect();
        for (uuid, index, name) in absent {
            let why = format!(
                "the driver no longer lists this GPU ({listed} listed, {} seen before): it fell off the bus or was \
                 removed",
                self.roster.len()
            );
            self.samples.remove(&uuid);
            self.throttled_since.remove(&uuid);
            telemetry.devices.push(GpuDevice {
                index,
                name,
                uuid,
                unsupported: [("gpu".to_string(), why)].into(),
                ..GpuDevice::default()
            });
        }
        telemetry.devices.sort_by_key(|d| d.index);
    }
}

/// Appends NVML samples newer than the newest kept, in time order.
fn add_samples(kept: &mut VecDeque<GpuUtilizationSample>, new: impl Iterator<Item = (u64, Option<f64>)>) {
    let mut new: Vec<GpuUtilizationSample> = new
        .filter_map(|(at_us, busy)| busy.map(|b| GpuUtilizationSample { at_us, busy_pct: b.clamp(0.0, 100.0) }))
        .take(MAX_SAMPLES_KEPT)
        .collect();
    new.sort_by_key(|s| s.at_us);
    for sample in new {
        if kept.back().is_none_or(|last| sample.at_us > last.at_us) {
            kept.push_back(sample);
        }
    }
}

fn sample_value(value: &SampleValue) -> Option<f64> {
    match *value {
        SampleValue::U32(v) => Some(f64::from(v)),
        SampleValue::U64(v) => Some(v as f64),
        SampleValue::I64(v) => Some(v as f64),
        SampleValue::F64(v) => v.is_finite().then_some(v),
    }
}

fn kb(per_s: u32) -> u64 {
    u64::from(per_s) * 1024
}

/// `NvmlError` is not `Clone`; the variants a query gives back are plain.
fn clone_error(error: &NvmlError) -> NvmlError {
    match error {
        NvmlError::NotSupported => NvmlError::NotSupported,
        NvmlError::NoPermission => NvmlError::NoPermission,
        NvmlError::GpuLost => NvmlError::GpuLost,
        NvmlError::FunctionNotFound => NvmlError::FunctionNotFound,
        other => NvmlError::FailedToLoadSymbol(other.to_string()),
    }
}

/// The HBM temperature (a field value: NVML has no plain call for it).
fn memory_temperature(device: &Device) -> Result<u32, NvmlError> {
    let mut values = device.field_values_for(&[FieldId(NVML_FI_DEV_MEMORY_TEMP)])?;
    let sample = values.pop().ok_or(NvmlError::NoData)??;
    match sample.value? {
        nvml_wrapper::enums::device::SampleValue::U32(c) => Ok(c),
        nvml_wrapper::enums::device::SampleValue::U64(c) => Ok(c.min(u64::from(u32::MAX)) as u32),
        nvml_wrapper::enums::device::SampleValue::I64(c) => Ok(c.clamp(0, i64::from(u32::MAX)) as u32),
        nvml_wrapper::enums::device::SampleValue::F64(c) => Ok(c.max(0.0) as u32),
    }
}

struct RemappedRows {
    correctable: u64,
    uncorrectable: u64,
    pending: bool,
    failed: bool,
}

/// `nvmlDeviceGetRemappedRows` (Ampere and newer), which the wrapper does not cover.
fn remapped_rows(nvml: &Nvml, device: &Device) -> Result<RemappedRows, NvmlError> {
    let call =
        nvml.lib().nvmlDeviceGetRemappedRows.as_ref().map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let (mut correctable, mut uncorrectable, mut pending, mut failed) = (0, 0, 0, 0);
    // SAFETY: the handle is the live device's; the call writes four unsigned ints.
    let code = unsafe { call(device.handle(), &mut correctable, &mut uncorrectable, &mut pending, &mut failed) };
    nvml_wrapper::error::nvml_try(code)?;
    Ok(RemappedRows {
        correctable: u64::from(correctable),
        uncorrectable: u64::from(uncorrectable),
        pending: pending != 0,
        failed: failed != 0,
    })
}

/// NVML's scope id for "every link" in NVLink field values.
const ALL_LINKS: u32 = u32::MAX;

/// NVLink's link count, and the data it carried over all links (bytes sent, received),
/// cumulative. The wrapper reads field values for scope 0 (link 0) only, so the traffic is
/// asked for directly, for all links.
fn nvlink(device: &Device) -> (Result<u32, NvmlError>, Result<(u64, u64), NvmlError>) {
    let links = device.field_values_for(&[FieldId(NVML_FI_DEV_NVLINK_LINK_COUNT)]).and_then(|mut values| {
        let sample = values.pop().ok_or(NvmlError::NoData)??;
        match sample.value? {
            nvml_wrapper::enums::device::SampleValue::U32(n) => Ok(n),
            nvml_wrapper::enums::device::SampleValue::U64(n) => Ok(n.min(u64::from(u32::MAX)) as u32),
            _ => Err(NvmlError::NoData),
        }
    });
    let traffic = match &links {
        Ok(0) => Err(NvmlError::NotSupported),
        Ok(_) => nvlink_traffic(device),
        Err(e) => Err(clone_error(e)),
    };
    (links, traffic)
}

fn nvlink_traffic(device: &Device) -> Result<(u64, u64), NvmlError> {
    use nvml_wrapper::sys_exports::field_id::{
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    };
    let call = device
        .nvml()
        .lib()
        .nvmlDeviceGetFieldValues
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut values: [nvml_wrapper_sys::bindings::nvmlFieldValue_t; 2] = unsafe { std::mem::zeroed() };
    values[0].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX;
    values[1].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;
    for value in &mut values {
        value.scopeId = ALL_LINKS;
    }
    // SAFETY: the handle is the live device's; the call fills the two entries it is given.
    let code = unsafe { call(device.handle(), values.len() as i32, values.as_mut_ptr()) };
    nvml_wrapper::error::nvml_try(code)?;
    let mut kib = [0u64; 2];
    for (out, value) in kib.iter_mut().zip(&values) {
        nvml_wrapper::error::nvml_try(value.nvmlReturn)?;
        // SAFETY: these two fields are unsigned 64-bit counters (`ullVal`), per nvml.h.
        *out = unsafe { value.value.ullVal };
    }
    Ok((kib[0].saturating_mul(1024), kib[1].saturating_mul(1024)))
}

/// NVML's bit for each reason it gives for holding the clocks down.
const THROTTLE_BITS: [(ThrottleReasons, ThrottleReason); 9] = [
    (ThrottleReasons::GPU_IDLE, ThrottleReason::GpuIdle),
    (ThrottleReasons::APPLICATIONS_CLOCKS_SETTING, ThrottleReason::ApplicationsClocks),
    (ThrottleReasons::SW_POWER_CAP, ThrottleReason::SwPowerCap),
    (ThrottleReasons::HW_SLOWDOWN, ThrottleReason::HwSlowdown),
    (ThrottleReasons::SYNC_BOOST, ThrottleReason::SyncBoost),
    (ThrottleReasons::SW_THERMAL_SLOWDOWN, ThrottleReason::SwThermalSlowdown),
    (ThrottleReasons::HW_THERMAL_SLOWDOWN, ThrottleReason::HwThermalSlowdown),
    (ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN, ThrottleReason::HwPowerBrake),
    (ThrottleReasons::DISPLAY_CLOCK_SETTING, ThrottleReason::DisplayClocks),
];

/// The reasons that hold now.
pub fn throttle_names(reasons: ThrottleReasons) -> Vec<ThrottleReason> {
    THROTTLE_BITS.iter().filter(|(bit, _)| reasons.contains(*bit)).map(|(_, reason)| *reason).collect()
}

fn compute_mode(mode: ComputeMode) -> GpuComputeMode {
    match mode {
        ComputeMode::Default => GpuComputeMode::Default,
        ComputeMode::ExclusiveThread => GpuComputeMode::ExclusiveThread,
        ComputeMode::Prohibited => GpuComputeMode::Prohibited,
        ComputeMode::ExclusiveProcess => GpuComputeMode::ExclusiveProcess,
    }
}

fn performance_state_name(state: PerformanceState) -> String {
    match state {
        PerformanceState::Unknown => "unknown".into(),
        known => format!("P{}", known.as_c()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_pid_comes_from_nspid_and_hostile_status_files_give_nothing() {
        let root = std::env::temp_dir().join(format!("ringside-nspid-{}", std::process::id()));
        let status = |pid: u32, text: &str| {
            std::fs::create_dir_all(root.join(pid.to_string())).unwrap();
            std::fs::write(root.join(pid.to_string()).join("status"), text).unwrap();
        };
        status(100, "Name:\tpython\nNSpid:\t100\t7\nUid:\t0\n");
        status(101, "Name:\tpython\nNSpid:\t101\n");
        status(102, "NSpid:\tx y\n");
        status(103, &format!("{}\nNSpid:\t103\t9\n", "x".repeat(10_000)));
        assert_eq!(namespace_pid(&root, 100), Some(7), "a process in a container");
        assert_eq!(namespace_pid(&root, 101), None, "one in the daemon's namespace");
        assert_eq!(namespace_pid(&root, 102), None);
        assert_eq!(namespace_pid(&root, 103), None, "the line lies beyond what is read");
        assert_eq!(namespace_pid(&root, 104), None, "gone");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn samples_are_kept_in_order_once_each() {
        let mut kept = VecDeque::new();
        add_samples(&mut kept, [(200, Some(50.0)), (100, Some(150.0)), (300, None)].into_iter());
        add_samples(&mut kept, [(200, Some(10.0)), (400, Some(-3.0))].into_iter());
        let got: Vec<(u64, f64)> = kept.iter().map(|s| (s.at_us, s.busy_pct)).collect();
        assert_eq!(got, [(100, 100.0), (200, 50.0), (400, 0.0)], "clamped, sorted, no repeats");
        assert_eq!(sample_value(&SampleValue::F64(f64::NAN)), None);
    }

    #[test]
    fn a_gpu_that_leaves_the_list_is_reported_lost_not_forgotten() {
        let gpu = |index: u32, uuid: &str| GpuDevice {
            index,
            uuid: uuid.into(),
            name: "H200".into(),
            ..GpuDevice::default()
        };
        let mut c = Continuity::default();
        for g in [gpu(0, "GPU-a"), gpu(1, "GPU-b"), gpu(2, "GPU-c")] {
            c.roster.insert(g.uuid.clone(), (g.index, g.name.clone()));
        }
        c.throttled_since.insert("GPU-b".into(), 5);
        let mut t =
            GpuTelemetry { available: true, devices: vec![gpu(0, "GPU-a"), gpu(1, "GPU-c")], ..Default::default() };
        c.missing(&mut t);
        // GPU-c moved down to index 1 when GPU-b went: GPU-b is the one missing.
        let lost: Vec<(u32, &str)> = t
            .devices
            .iter()
            .filter(|d| d.unsupported.contains_key("gpu"))
            .map(|d| (d.index, d.uuid.as_str()))
            .collect();
        assert_eq!(lost, [(1, "GPU-b")], "{:?}", t.devices);
        assert!(t.devices.iter().any(|d| d.unsupported.get("gpu").is_some_and(|w| w.contains("2 listed, 3 seen"))));
        assert!(c.throttled_since.is_empty());
        let mut none = GpuTelemetry { available: false, ..Default::default() };
        c.missing(&mut none);
        assert!(none.devices.is_empty(), "no driver: nothing to compare with");
    }

    #[test]
    fn throttle_reasons_are_decoded_by_name() {
        let reasons = ThrottleReasons::SW_POWER_CAP | ThrottleReasons::HW_THERMAL_SLOWDOWN;
        assert_eq!(throttle_names(reasons), [ThrottleReason::SwPowerCap, ThrottleReason::HwThermalSlowdown]);
        assert!(throttle_names(ThrottleReasons::empty()).is_empty(), "running free");
        assert_eq!(throttle_names(ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN), [ThrottleReason::HwPowerBrake]);
        assert_eq!(THROTTLE_BITS.map(|(_, r)| r), ThrottleReason::ALL, "every reason has its bit");
    }

    #[test]
    fn a_field_without_a_value_says_why_and_a_lost_gpu_is_flagged() {
        let mut f = Fields { unsupported: BTreeMap::new() };
        assert_eq!(f.get("power_draw_w", Ok(350_000u32)), Some(350_000));
        assert_eq!(f.get::<u32>("temperature_memory_c", Err(NvmlError::NotSupported)), None);
        assert_eq!(f.unsupported["temperature_memory_c"], "not supported by this GPU or driver");
        assert!(!f.unsupported.contains_key("gpu"));
        assert_eq!(f.get_many::<u32>(&["a", "b"], Err(NvmlError::GpuLost)), None);
        assert_eq!(f.unsupported["b"], f.unsupported["a"], "every field of a failed call says why");
        assert!(f.unsupported["gpu"].contains("lost"));
        let telemetry = GpuTelemetry {
            available: true,
            devices: vec![GpuDevice {
                index: 1,
                uuid: "GPU-1".into(),
                unsupported: f.unsupported,
                ..GpuDevice::default()
            }],
            ..GpuTelemetry::default()
        };
        assert!(problems(&telemetry).is_some_and(|why| why.starts_with("GPU 1 (GPU-1): the GPU is lost")));
    }

    #[test]
    fn xids_are_kept_per_gpu_bounded_with_their_meaning() {
        let mut log = XidLog::default();
        for n in 0..40 {
            log.push("GPU-a".into(), if n == 39 { 79 } else { 13 }, n);
        }
        log.push("GPU-b".into(), 4242, 7);
        let mut telemetry = GpuTelemetry {
            devices: vec![
                GpuDevice { uuid: "GPU-a".into(), ..GpuDevice::default() },
                GpuDevice { uuid: "GPU-b".into(), ..GpuDevice::default() },
                GpuDevice { uuid: "GPU-c".into(), ..GpuDevice::default() },
            ],
            ..GpuTelemetry::default()
        };
        log.attach(&mut telemetry);
        let a = &telemetry.devices[0];
        assert_eq!((a.xids.len(), a.xid_count), (MAX_XIDS_PER_GPU, 40), "the latest 32 kept, all counted");
        assert_eq!(a.xids.first().map(|x| x.at_ms), Some(8), "oldest dropped first");
        assert_eq!(a.xids.last().and_then(|x| x.description.as_deref()), Some("GPU has fallen off the bus"));
        assert_eq!(telemetry.devices[1].xids[0].description, None, "an unknown code keeps its number only");
        assert!(telemetry.devices[2].xids.is_empty() && telemetry.devices[2].xid_count == 0);
    }

    #[test]
    fn names_of_modes_and_states() {
        assert_eq!(compute_mode(ComputeMode::ExclusiveProcess), GpuComputeMode::ExclusiveProcess);
        assert_eq!(performance_state_name(PerformanceState::Zero), "P0");
        assert_eq!(performance_state_name(PerformanceState::Twelve), "P12");
    }

    /// On this machine, whatever it has: without the driver the source is absent with the
    /// reason (a GPU node is not required); with one, every GPU has a name and a UUID and
    /// every absent field says why.
    #[test]
    fn the_source_reports_what_this_machine_has() {
        let mut source = GpuSource::start(&GpuConfig::default(), Duration::from_millis(50));
        let deadline = Instant::now() + Duration::from_secs(20);
        let (status, sample) = loop {
            let mut sample = Sample::new(1);
            let status = source.collect(&mut sample).unwrap();
            if sample.readings.gpus.is_some() || Instant::now() > deadline {
                break (status, sample);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let telemetry = sample.readings.gpus.expect("a reading within 20 s");
        // On a GPU node (scripts/gpu-check.sh sets this) NVML must answer.
        if std::env::var_os("RINGSIDE_REQUIRE_CUDA").is_some() {
            assert!(telemetry.available, "RINGSIDE_REQUIRE_CUDA is set and NVML says: {:?}", telemetry.reason);
        }
        println!("gpu source: {status:?}, {telemetry:?}");
        if telemetry.available {
            assert!(!telemetry.devices.is_empty(), "{telemetry:?}");
            if std::env::var_os("RINGSIDE_REQUIRE_CUDA").is_some() {
                assert!(telemetry.xid_events, "a GPU node's driver takes XID event registrations");
            }
            for gpu in &telemetry.devices {
                assert!(gpu.uuid.starts_with("GPU-") && !gpu.name.is_empty(), "{gpu:?}");
                assert!(gpu.memory_total_bytes.is_some_and(|t| t > 0), "{gpu:?}");
                let json = serde_json::to_value(gpu).unwrap();
                for (field, value) in json.as_object().unwrap() {
                    if value.is_null() {
                        assert!(gpu.unsupported.contains_key(field), "{field} is null without a reason: {gpu:?}");
                    }
                }
            }
            assert_ne!(status, SourceStatus::Absent(String::new()));
        } else {
            let reason = telemetry.reason.clone().unwrap_or_default();
            match status {
                SourceStatus::Absent(why) => assert!(why.contains("libnvidia-ml.so.1"), "{why}"),
                SourceStatus::Degraded(why) => assert!(why.contains(&reason), "{why}"),
                SourceStatus::Up => panic!("up without NVML: {telemetry:?}"),
            }
        }
    }
}
