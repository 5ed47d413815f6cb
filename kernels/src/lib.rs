//! Ring kernels: persistent actors fed through lock-free single-producer/single-consumer rings
//! ([`ring`]), with a lifecycle and control block ([`runtime`]), telemetry they write
//! themselves ([`telemetry`]), and the built-in kernels ([`builtin`]).
//!
//! Two backends run them behind one handle ([`backend::Kernel`]): the CPU backend
//! ([`runtime::RingKernel`]) runs each kernel on its own thread; the CUDA backend
//! ([`cuda::CudaKernel`]) runs each as one persistent GPU launch, compiled by NVRTC at start-up
//! from `kernels/cuda/*.cu`, polling rings in pinned host memory mapped into the device and
//! writing its telemetry into a control block there. Where CUDA cannot run, launching on it is
//! [`KernelError::CudaUnavailable`] with the reason; the caller picks the CPU instead.
//!
//! Architecture invariant: depends on `ringside-shared` (for the telemetry vocabulary) and
//! `cudarc` (loaded at run time, so a build needs no CUDA); no tokio, no daemon types.

pub mod backend;
pub mod builtin;
pub mod cuda;
pub mod ring;
pub mod runtime;
pub mod telemetry;

pub use backend::{Backend, Kernel};
pub use cuda::CudaKernel;
pub use runtime::{Backpressure, KernelError, KernelHandler, LaunchOptions, RingKernel, Terminate};
