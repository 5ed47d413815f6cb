//! One handle for a ring kernel on either backend: launched by built-in name and backend,
//! driven the same way. Dispatch is a match per call; the CPU backend's hot path (its worker
//! thread and rings) does not go through it.

use std::time::Duration;

use ringside_shared::{KernelKind, KernelState, RingKernelMetrics};

use crate::builtin;
use crate::cuda::CudaKernel;
use crate::runtime::{KernelError, LaunchOptions, RingKernel, Terminate};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A thread per kernel.
    Cpu,
    /// A persistent CUDA launch per kernel.
    Cuda,
}

/// A launched built-in kernel.
pub enum Kernel {
    Cpu(RingKernel),
    Cuda(CudaKernel),
}

macro_rules! each {
    ($self:expr, $k:ident => $body:expr) => {
        match $self {
            Kernel::Cpu($k) => $body,
            Kernel::Cuda($k) => $body,
        }
    };
}

impl Kernel {
    /// Launches the built-in kernel `kind` on `backend` (state Launched). There is no fallback
    /// here: a CUDA launch on a machine without CUDA is [`KernelError::CudaUnavailable`], and
    /// the caller decides what to do instead.
    pub fn launch(
        id: impl Into<String>,
        kind: KernelKind,
        backend: Backend,
        options: LaunchOptions,
    ) -> Result<Kernel, KernelError> {
        match backend {
            Backend::Cpu => RingKernel::launch(id, builtin::build(kind), options).map(Kernel::Cpu),
            Backend::Cuda => CudaKernel::launch(id, kind, options).map(Kernel::Cuda),
        }
    }

    pub fn backend(&self) -> Backend {
        match self {
            Kernel::Cpu(_) => Backend::Cpu,
            Kernel::Cuda(_) => Backend::Cuda,
        }
    }

    pub fn id(&self) -> &str {
        each!(self, k => k.id())
    }

    pub fn state(&self) -> KernelState {
        each!(self, k => k.state())
    }

    pub fn activate(&self) -> Result<(), KernelError> {
        each!(self, k => k.activate())
    }

    pub fn deactivate(&self) -> Result<(), KernelError> {
        each!(self, k => k.deactivate())
    }

    pub fn terminate(&mut self, how: Terminate) -> Result<(), KernelError> {
        each!(self, k => k.terminate(how))
    }

    #[inline]
    pub fn send(&mut self, payload: &[u8]) -> Result<(), KernelError> {
        each!(self, k => k.send(payload))
    }

    #[inline]
    pub fn try_recv(&mut self, out: &mut [u8]) -> Option<usize> {
        each!(self, k => k.try_recv(out))
    }

    pub fn recv_timeout(&mut self, out: &mut [u8], limit: Duration) -> Option<usize> {
        each!(self, k => k.recv_timeout(out, limit))
    }

    pub fn discard_output(&mut self) -> usize {
        each!(self, k => k.discard_output())
    }

    pub fn metrics(&self) -> RingKernelMetrics {
        each!(self, k => k.metrics())
    }
}
