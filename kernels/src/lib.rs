//! Ring kernels: persistent actors fed through lock-free single-producer/single-consumer rings
//! ([`ring`]), with a lifecycle and control block ([`runtime`]), telemetry they write
//! themselves ([`telemetry`]), and the built-in kernels ([`builtin`]).
//!
//! The CPU backend runs each kernel on its own thread. A CUDA backend (persistent kernels
//! compiled by NVRTC, rings in pinned device-mapped memory) is not part of this crate yet; a
//! kernel configured for CUDA runs on the CPU backend and says so.
//!
//! Architecture invariant: depends on `ringside-shared` only (for the telemetry vocabulary);
//! no tokio, no daemon types.

pub mod builtin;
pub mod ring;
pub mod runtime;
pub mod telemetry;

pub use runtime::{Backpressure, KernelError, KernelHandler, LaunchOptions, RingKernel, Terminate};
