//! The ML-aware scheduler's user-space side: which processes are ML work ([`ml`]), which phase
//! each thread is in ([`phase`]), what to do about it ([`policy`]), the thread that does it
//! every window ([`observer`]), how decisions are carried out ([`enforcement`]) and the metrics
//! source over it ([`source`]). Fed by the `ringside-bpf` probe, through the [`probe::Probe`]
//! trait.

pub mod enforcement;
pub mod identity;
pub mod jobs;
pub mod journal;
pub mod library;
pub mod ml;
pub mod observer;
pub mod offthread;
pub mod phase;
pub mod policy;
pub mod probe;
pub mod source;
pub mod trust;
