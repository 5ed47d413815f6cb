//! The CUDA backend: each built-in kernel as one persistent launch (`CudaKernel`), fed
//! through rings in pinned host memory that the device reads and writes directly.
//!
//! - `device`: finds the device once per process and compiles every kernel with NVRTC
//!   (`kernels/cuda/*.cu`); a machine that cannot run them gets a reason, never a panic;
//! - `layout`: the memory the host and the device share, defined once in Rust, with the
//!   CUDA declarations generated from it;
//! - `memory`: mapped pinned memory and device memory, freed only when no kernel runs;
//! - `kernel`: the persistent kernel's handle, the CPU backend's interface;
//! - `baseline`: the same device code launched once per message, for the benchmark.
//!
//! Architecture invariant: no CUDA call on the message path. Sending and receiving are loads
//! and stores to mapped memory, as with the CPU backend's rings; the driver is called to
//! launch, to check a kernel's health, and to stop it.

mod baseline;
mod device;
mod kernel;
mod layout;
mod memory;

pub use baseline::{LaunchMode, OneShotKernel};
pub use device::DeviceInfo;
pub use kernel::CudaKernel;

use crate::runtime::KernelError;

/// This machine's CUDA device, set up (kernels compiled) on first use; or why the CUDA backend
/// cannot run here, as [`KernelError::CudaUnavailable`] ("cuda unavailable: …").
pub fn probe() -> Result<DeviceInfo, KernelError> {
    device::device().map(|d| d.info.clone()).map_err(KernelError::CudaUnavailable)
}

/// The CUDA source NVRTC compiles (the generated layout, the shared loop, every kernel), for
/// inspection or for checking with another CUDA compiler.
pub fn program_source() -> String {
    device::program_source()
}
