//! The ML-aware scheduler's userspace side: which processes are ML work ([`ml`]). Phase
//! detection, decisions and enforcement build on it, fed by the `ringside-bpf` probe.

pub mod ml;
pub mod source;
