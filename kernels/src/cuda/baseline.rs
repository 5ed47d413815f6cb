//! A built-in kernel run one launch per message, by `cuLaunchKernel` or as a CUDA graph of that
//! launch, with the same rings and the same device code as the persistent kernel: the baseline
//! `benches/gpu.rs` measures the persistent kernel against.

use cudarc::driver::{sys, CudaFunction, CudaGraph};
use ringside_shared::KernelKind;

use super::device::{self, describe, Entry};
use super::kernel::KernelMemory;
use crate::runtime::{KernelError, LaunchOptions};

/// How each message's launch is issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchMode {
    /// `cuLaunchKernel`, then `cuStreamSynchronize`.
    Launch,
    /// One launch captured into a CUDA graph once; `cuGraphLaunch`, then `cuStreamSynchronize`.
    Graph,
}

/// A built-in kernel that runs only when asked, one launch per message.
pub struct OneShotKernel {
    graph: Option<CudaGraph>,
    function: CudaFunction,
    memory: KernelMemory,
}

fn cuda(what: &str) -> impl Fn(cudarc::driver::DriverError) -> KernelError + '_ {
    move |e| KernelError::Cuda(format!("{what}: {}", describe(e)))
}

impl OneShotKernel {
    pub fn new(kernel: KernelKind, options: LaunchOptions, mode: LaunchMode) -> Result<OneShotKernel, KernelError> {
        let device = device::device().map_err(KernelError::CudaUnavailable)?;
        let function = device
            .function(kernel, Entry::Once)
            .ok_or_else(|| KernelError::Cuda(format!("no one-shot CUDA function for {}", kernel.as_str())))?
            .clone();
        let mut memory = KernelMemory::new(&device, &options)?;
        let graph = match mode {
            LaunchMode::Launch => None,
            LaunchMode::Graph => {
                let stream = memory.stream.clone();
                stream
                    .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                    .map_err(cuda("cannot capture a graph"))?;
                let launched = memory.launch(&function);
                let captured = stream.end_capture(sys::CUgraphInstantiate_flags(0));
                launched.map_err(cuda("cannot capture the launch"))?;
                let graph = captured
                    .map_err(cuda("cannot instantiate the graph"))?
                    .ok_or_else(|| KernelError::Cuda("the captured graph is empty".into()))?;
                graph.upload().map_err(cuda("cannot upload the graph"))?;
                Some(graph)
            }
        };
        memory.stream.synchronize().map_err(cuda("cannot prepare the kernel's memory"))?;
        Ok(OneShotKernel { graph, function, memory })
    }

    /// Sends `payload`, runs one launch and waits for it, then takes the result into `out`;
    /// returns its length.
    pub fn round_trip(&mut self, payload: &[u8], out: &mut [u8]) -> Result<usize, KernelError> {
        if payload.len() > self.memory.input.message_size() {
            return Err(KernelError::TooLarge { len: payload.len(), max: self.memory.input.message_size() });
        }
        if !self.memory.input.push(payload, 0) {
            return Err(KernelError::Full);
        }
        match &self.graph {
            Some(graph) => graph.launch().map_err(cuda("graph launch failed"))?,
            None => self.memory.launch(&self.function).map_err(cuda("launch failed"))?,
        }
        self.memory.stream.synchronize().map_err(cuda("the kernel failed"))?;
        self.memory
            .output
            .pop(out)
            .map(|r| r.len)
            .ok_or_else(|| KernelError::Cuda("the launch left no result (the kernel refused the message)".into()))
    }
}
