//! Ringside's wire protocol and snapshot schema.
//!
//! Architecture invariant: this crate is used by the daemon (native) and by the console (wasm32),
//! so it holds types and pure functions only: no tokio, no I/O, nothing of ours as a dependency but its own derive (`shared/derive`).

/// Milliseconds since the Unix epoch (UTC).
pub type UnixMillis = u64;

// The derived `Decode` impls name `::ringside_shared`, here as in the console.
extern crate self as ringside_shared;

pub mod alert;
pub mod decode;
pub mod fixed;
pub mod history;
pub mod incident;
pub mod protocol;
pub mod readings;
pub mod silence;
pub mod snapshot;

pub use alert::{Acknowledgement, Alert, AlertTransition, AlertType, Role, Severity, TransitionKind};
pub use fixed::{fixed, Fixed};
pub use history::{HistoryCatalog, HistoryExport, HistoryResponse, HistorySeries, HistorySeriesInfo};
pub use incident::{IncidentBundle, IncidentSummary};
pub use protocol::{
    fleet_job_link, percent_encode, ClientCommand, CommandError, ErrorCode, Hello, KernelStateChange, ServerMessage,
    Update, PROTOCOL_VERSION,
};
pub use readings::Readings;
pub use silence::{Matcher, NewSilence, Notification, NotifiedAlert, Silence, Silenced};
pub use snapshot::*;

/// The JSON Schema of [`Snapshot`], as served at `/api/schema/snapshot`.
pub fn snapshot_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(Snapshot)).unwrap_or_default()
}

#[cfg(test)]
mod tests;
