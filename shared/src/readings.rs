//! One collection tick's readings: what every source measured, and the window computed from
//! them. The daemon's sources fill it, its node state keeps the latest, an [`Update`] carries
//! it, a [`Snapshot`] embeds it, the metrics registry reads it and the console keeps it in one
//! signal. A new source is one field here, its registry entries and its panel.
//!
//! [`Update`] and [`Snapshot`] flatten it, so its fields sit at the top level of their frames
//! as they always have (the v1 wire format; `shared/schemas/` pins it).
//!
//! [`Update`]: crate::Update
//! [`Snapshot`]: crate::Snapshot

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::decode::Decode;

use crate::{GpuTelemetry, HostMetrics, RingKernelMetrics, SchedulerTelemetry, WindowAggregates};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Decode, JsonSchema)]
pub struct Readings {
    /// Host metrics of the tick; absent until the first successful collection.
    pub host: Option<HostMetrics>,
    /// Scheduler telemetry; absent while no scheduler source runs.
    pub scheduler: Option<SchedulerTelemetry>,
    pub kernels: Vec<RingKernelMetrics>,
    /// The node's GPUs; absent where the GPU source is turned off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<GpuTelemetry>,
    /// Aggregates over the recent window, computed from counter deltas.
    pub window: WindowAggregates,
}

impl Readings {
    /// Whether [`hide_untrusted_details`](Self::hide_untrusted_details) would change anything.
    pub fn has_untrusted_details(&self) -> bool {
        self.scheduler.as_ref().is_some_and(SchedulerTelemetry::has_untrusted_details)
    }

    /// What a viewer is given unless `[server] viewers_see_untrusted`: see
    /// [`SchedulerTelemetry::hide_untrusted_details`]. How many entries were changed.
    pub fn hide_untrusted_details(&mut self) -> usize {
        self.scheduler.as_mut().map_or(0, SchedulerTelemetry::hide_untrusted_details)
    }

    /// The ring kernel `id`'s latest metrics.
    pub fn kernel(&self, id: &str) -> Option<&RingKernelMetrics> {
        self.kernels.iter().find(|k| k.id == id)
    }
}
