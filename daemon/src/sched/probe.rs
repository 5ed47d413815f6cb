//! What the observer needs of the BPF probe, as a trait: the loaded [`SchedProbe`] in the
//! daemon, a recorded one in the observer's unit tests (which then run without root or BPF).

use std::path::{Path, PathBuf};

use ringside_bpf::{
    AttachMode, Attached, EntryPoint, Event, Lost, MlThreadStats, ProbeError, ProgramStatus, SchedProbe, ThreadStats,
};

/// The probe's counters, events and attachments, as the observer uses them.
pub trait Probe: Send {
    /// Lifecycle and run-queue events since the last call.
    fn drain_events(&mut self) -> Vec<Event>;
    /// Scheduling counters of a thread (cumulative), if the probe has seen it.
    fn thread(&self, tid: u32) -> Option<ThreadStats>;
    /// Call counters of a thread of a tracked process (cumulative).
    fn ml_thread(&self, tid: u32) -> Option<MlThreadStats>;
    /// Threads the probe keeps counters for, and at most.
    fn thread_count(&self) -> usize;
    fn threads_capacity(&self) -> usize;
    /// Marks a process (and its future children) as part of `job`: its calls are counted.
    fn track(&mut self, tgid: u32, job: u32) -> Result<(), ProbeError>;
    fn untrack(&mut self, tgid: u32);
    /// Attaches the call probes to `entries` of `library`, read through `file` (once for the
    /// file where the kernel allows, else for this process); says how.
    fn attach_library(
        &mut self,
        pid: u32,
        library: &Path,
        file: &std::fs::File,
        entries: &[EntryPoint],
    ) -> Result<Attached, String>;
    /// How many descriptors attaching `entries` of `library` for `pid` would add (0 when the
    /// file is probed already).
    fn links_needed(&self, pid: u32, library: &Path, file: &std::fs::File, entries: &[EntryPoint]) -> usize;
    /// Where the GPU driver's and runtime's code is mapped in a tracked process: the tick
    /// sampler's ranges (empty: none).
    fn set_gpu_text(&mut self, tgid: u32, ranges: &[(u64, u64)]) -> Result<(), ProbeError>;
    fn probed_libraries(&self, pid: u32) -> Vec<PathBuf>;
    fn probed_processes(&self) -> Vec<u32>;
    /// Drops a process's call probes (off the caller's thread where that is slow).
    fn detach_process(&mut self, pid: u32);
    /// How the scheduling programs are attached, and each program's state.
    fn mode(&self) -> AttachMode;
    fn programs(&self) -> Vec<ProgramStatus>;
    /// What could not be recorded (cumulative), and runs the kernel skipped per program.
    fn lost(&self) -> Lost;
    fn skipped_runs(&self) -> Vec<(String, u64)>;
}

impl Probe for SchedProbe {
    fn drain_events(&mut self) -> Vec<Event> {
        SchedProbe::drain_events(self)
    }
    fn thread(&self, tid: u32) -> Option<ThreadStats> {
        SchedProbe::thread(self, tid)
    }
    fn ml_thread(&self, tid: u32) -> Option<MlThreadStats> {
        SchedProbe::ml_thread(self, tid)
    }
    fn thread_count(&self) -> usize {
        SchedProbe::thread_count(self)
    }
    fn threads_capacity(&self) -> usize {
        SchedProbe::threads_capacity(self)
    }
    fn track(&mut self, tgid: u32, job: u32) -> Result<(), ProbeError> {
        SchedProbe::track(self, tgid, job)
    }
    fn untrack(&mut self, tgid: u32) {
        SchedProbe::untrack(self, tgid)
    }
    fn attach_library(
        &mut self,
        pid: u32,
        library: &Path,
        file: &std::fs::File,
        entries: &[EntryPoint],
    ) -> Result<Attached, String> {
        SchedProbe::attach_library(self, pid, library, file, entries)
    }
    fn links_needed(&self, pid: u32, library: &Path, file: &std::fs::File, entries: &[EntryPoint]) -> usize {
        SchedProbe::links_needed(self, pid, library, file, entries)
    }
    fn set_gpu_text(&mut self, tgid: u32, ranges: &[(u64, u64)]) -> Result<(), ProbeError> {
        SchedProbe::set_gpu_text(self, tgid, ranges)
    }
    fn probed_libraries(&self, pid: u32) -> Vec<PathBuf> {
        SchedProbe::probed_libraries(self, pid)
    }
    fn probed_processes(&self) -> Vec<u32> {
        SchedProbe::probed_processes(self)
    }
    fn detach_process(&mut self, pid: u32) {
        SchedProbe::detach_process(self, pid)
    }
    fn mode(&self) -> AttachMode {
        SchedProbe::mode(self)
    }
    fn programs(&self) -> Vec<ProgramStatus> {
        SchedProbe::programs(self)
    }
    fn lost(&self) -> Lost {
        SchedProbe::lost(self)
    }
    fn skipped_runs(&self) -> Vec<(String, u64)> {
        SchedProbe::skipped_runs(self)
    }
}
