//! Which processes are ML work and which of their libraries to probe: the probe's lifecycle
//! events, the periodic scan, whom enforcement may change (admission), and the CUDA/NCCL
//! libraries sent to the inspector and attached once it has read them.

use std::collections::{HashSet, VecDeque};

use ringside_bpf::{is_probed_library, EventKind, GpuLibrary, MAX_TEXT_RANGES};
use ringside_shared::{ExitedRank, PhaseValues, ProcessRole, SchedulerBackend, SchedulerTelemetry};

use super::super::jobs::{RecentPhases, Steps};
use super::super::journal::thread_start_time;
use super::super::library::{self, Request};
use super::super::ml::{MlReason, ScanBudget};
use super::super::phase::Hysteresis;
use super::super::policy;
use super::super::trust::Credentials;
use super::{Inspection, Library, Observer, Process, MAPS_EVERY, MAX_LIBRARIES, RUNQ_SAMPLES};
use crate::pipeline::ThreadEvent;

/// Waiting ML processes looked at per scan for a fair share of the tracking slots, and slots
/// that change hands per scan at most.
const FAIR_LOOKS: usize = 256;
const FAIR_SWAPS: usize = 32;

/// A process's command line, arguments separated by spaces, read within a bound and clipped to
/// [`SchedulerTelemetry::MAX_CMDLINE`] (it travels in every update and labels its job's alerts
/// and series).
fn read_cmdline(proc_root: &std::path::Path, pid: u32) -> String {
    use std::io::Read;
    let mut raw = Vec::new();
    let path = proc_root.join(pid.to_string()).join("cmdline");
    let _ = std::fs::File::open(path).and_then(|f| f.take(4096).read_to_end(&mut raw));
    let text = String::from_utf8_lossy(&raw).replace('\0', " ");
    let text = text.trim();
    let max = SchedulerTelemetry::MAX_CMDLINE;
    if text.chars().count() <= max {
        return text.to_string();
    }
    let head: String = text.chars().take(max - 1).collect();
    format!("{head}…")
}

impl Observer {
    pub(super) fn handle_events(&mut self) {
        for event in self.probe.drain_events() {
            match event.kind {
                EventKind::RunqWait { ns } => {
                    // Bounded by what one drain of the probe's ring buffer holds; trimmed to
                    // the newest at publication.
                    self.window_runq.push(ns);
                    if let Some(task) = self.tasks.get_mut(&event.tid) {
                        if task.runq.len() == RUNQ_SAMPLES {
                            task.runq.pop_front();
                        }
                        task.runq.push_back(ns);
                    }
                }
                EventKind::Fork { parent_tgid, inherited } => {
                    let tgid = if event.tgid != 0 { event.tgid } else { self.tgid_of(event.tid) };
                    if tgid != event.tid {
                        continue;
                    }
                    let parent_job = self.processes.get(&parent_tgid).map(|p| p.job);
                    // A fork bomb under an ML job is tracked up to the cap; the next scan counts the rest.
                    let full = self.processes.len() >= self.config.max_processes;
                    let start_time = thread_start_time(&self.config.proc_root, tgid, tgid);
                    if let (Some(job), false, Some(start_time)) = (parent_job, full, start_time) {
                        if !inherited {
                            let _ = self.probe.track(tgid, job);
                        }
                        self.add_process(
                            tgid,
                            start_time,
                            job,
                            event.comm.clone(),
                            format!("child of {parent_tgid}"),
                            ProcessRole::Worker,
                        );
                        self.refresh_admission(tgid);
                    }
                }
                EventKind::Exec => {
                    if let Some(p) = self.processes.get_mut(&event.tgid) {
                        p.comm = event.comm.clone();
                    }
                    // A new program may be ML: the next scan looks at it afresh. (Not a scan
                    // now: every exec on the node would trigger one.)
                    self.detector.forget(event.tgid);
                }
                EventKind::Exit { status } => {
                    self.note_exit(event.tgid, status);
                    self.remove_process(event.tgid)
                }
            }
        }
    }

    pub(super) fn tgid_of(&self, tid: u32) -> u32 {
        let status = std::fs::read_to_string(self.config.proc_root.join(tid.to_string()).join("status"));
        status
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Tgid:")).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0)
    }

    pub(super) fn add_process(
        &mut self,
        pid: u32,
        start_time: u64,
        job: u32,
        comm: String,
        reason: String,
        role: ProcessRole,
    ) {
        if self.processes.contains_key(&pid) {
            return;
        }
        tracing::info!(pid, job, comm, reason, "tracking ML process");
        // Admission is read by `refresh_admission`, which the caller runs next.
        self.processes.insert(
            pid,
            Process {
                start_time,
                job,
                comm,
                reason,
                role,
                uid: None,
                admission: Err("not admitted: not looked at yet".into()),
                pages: Err("does not page: not looked at yet".into()),
                nice_floor: 0,
                libraries: Vec::new(),
                gpu_text: Vec::new(),
                tracked_seq: {
                    self.tracked_seq += 1;
                    self.tracked_seq
                },
                scans_since_maps: 0,
                phase: Hysteresis::default(),
                phase_since_ms: crate::clock::now_ms(),
                phase_ms: PhaseValues::default(),
                timeline: VecDeque::new(),
                gpus: Vec::new(),
                numa_node: None,
                node_cpus: Vec::new(),
                threads: 0,
                cmdline: read_cmdline(&self.config.proc_root, pid),
                identity: crate::sched::identity::of_process(&self.config.proc_root, pid),
                collective_waiting_since_ms: None,
                collective_returned_ms: None,
                collective_calls: 0,
                collective_ns: 0,
                cpu_wait_ns: 0,
                recent: RecentPhases::new(self.config.job_window.as_secs()),
                steps: Steps::default(),
                step_times: None,
            },
        );
    }

    /// Whether enforcement may change `pid`, and the lowest nice value it may give it.
    pub(super) fn admission_of(&self, pid: u32, creds: Option<&Credentials>) -> (Result<String, String>, i32) {
        if self.enforcement.backend() == SchedulerBackend::Observe {
            return (Err("observe mode: nothing is changed".into()), 0);
        }
        let Some(creds) = creds else { return (Err("not admitted: its credentials are unreadable".into()), 0) };
        let admission = self.config.admission.admits(&self.config.proc_root, pid, creds);
        let floor =
            if admission.is_ok() { self.config.admission.nice_floor(&self.config.proc_root, pid, creds) } else { 0 };
        (admission, floor)
    }

    /// A rank's process ended: kept for 10 minutes, so that a hung job can name it. A
    /// DataLoader worker carries its rank's environment too, and is not a rank: only a process
    /// that made collective calls, or a main process, counts.
    fn note_exit(&mut self, pid: u32, status: Option<i32>) {
        let Some(p) = self.processes.get(&pid) else { return };
        let (Some(job_id), Some(rank)) = (p.identity.job_id(), p.identity.rank) else { return };
        // Nor does the rank of a user who may not page: the fleet's rules page from these.
        if (p.collective_calls == 0 && p.role != ProcessRole::Main) || p.pages.is_err() {
            return;
        }
        let now = crate::clock::now_ms();
        self.exited_ranks.retain(|e| !(e.job_id == job_id && e.rank == rank));
        if self.exited_ranks.len() == SchedulerTelemetry::MAX_EXITED_RANKS {
            self.exited_ranks.pop_front();
        }
        self.exited_ranks.push_back(ExitedRank { job_id, rank, pid, at_ms: now, status });
    }

    pub(super) fn remove_process(&mut self, pid: u32) {
        if self.processes.remove(&pid).is_none() {
            return;
        }
        self.probe.untrack(pid);
        self.probe.detach_process(pid);
        self.enforcement.process_gone(pid);
        let gone: Vec<u32> = self.tasks.iter().filter(|(_, t)| t.pid == pid).map(|(tid, _)| *tid).collect();
        let at_ms = self.window_start_ms;
        for tid in gone {
            self.tasks.remove(&tid);
            self.forget_task(tid);
            self.thread_events.push(ThreadEvent::Gone { at_ms, tid });
        }
    }

    /// Finds ML processes, tracks new ones (up to `max_processes`), checks whom enforcement
    /// may change and asks for the CUDA/NCCL libraries they map to be inspected.
    pub(super) fn scan(&mut self) {
        let found = self.detector.scan();
        let alive: HashSet<u32> = found.iter().map(|p| p.pid).collect();
        // A pid that names another process now: the one tracked is gone.
        let replaced: Vec<u32> = found
            .iter()
            .filter(|ml| self.processes.get(&ml.pid).is_some_and(|p| p.start_time != ml.start_time))
            .map(|ml| ml.pid)
            .collect();
        // Processes that ended without an exit event (e.g. events lost).
        let gone: Vec<u32> = self
            .processes
            .keys()
            .copied()
            .filter(|pid| !alive.contains(pid) && !self.config.proc_root.join(pid.to_string()).exists())
            .collect();
        for pid in replaced.into_iter().chain(gone) {
            self.remove_process(pid);
        }
        // New ones, main processes first, then the busiest, while there is room.
        let mut new: Vec<_> = found.iter().filter(|ml| !self.processes.contains_key(&ml.pid)).collect();
        // Keys read once each: the probe's counters move while the sort runs, and a key that
        // changes between comparisons breaks the sort's total order (and panics).
        new.sort_by_cached_key(|ml| {
            let worker = matches!(ml.reason, MlReason::Parent(_));
            (worker, std::cmp::Reverse(self.probe.thread(ml.pid).map(|t| t.on_cpu_ns).unwrap_or(0)), ml.pid)
        });
        let room = self.config.max_processes.saturating_sub(self.processes.len());
        let mut admitted: HashSet<u32> = new.iter().take(room).map(|ml| ml.pid).collect();
        if new.len() > room {
            let waiting: Vec<u32> = new[room..].iter().map(|ml| ml.pid).collect();
            self.share_slots(&waiting, &mut admitted);
        }
        self.not_tracked = new.len().saturating_sub(admitted.len()) as u64;
        for ml in &found {
            let (job, role, reason) = match &ml.reason {
                MlReason::Parent(ancestor) => (*ancestor, ProcessRole::Worker, format!("child of {ancestor}")),
                MlReason::Library(lib) => (ml.pid, ProcessRole::Main, format!("maps {lib}")),
                MlReason::Device(dev) => (ml.pid, ProcessRole::Main, format!("opens {dev}")),
                MlReason::Cmdline(p) => (ml.pid, ProcessRole::Main, format!("command line matches {p:?}")),
            };
            match self.processes.get_mut(&ml.pid) {
                Some(p) => {
                    // A worker that starts using the GPU itself becomes a main process.
                    if role == ProcessRole::Main && p.role == ProcessRole::Worker {
                        p.role = ProcessRole::Main;
                        p.reason = reason;
                    }
                }
                None if admitted.contains(&ml.pid) => {
                    self.add_process(ml.pid, ml.start_time, job, ml.comm.clone(), reason, role)
                }
                None => continue,
            }
            if let Err(e) = self.probe.track(ml.pid, job) {
                tracing::warn!(pid = ml.pid, "cannot track: {e}");
            }
        }
        // The tracked processes' files are read within one budget per scan, starting from a
        // different process each time, so that none waits for good behind large ones.
        let mut pids: Vec<u32> = self.processes.keys().copied().collect();
        pids.sort_unstable();
        let turn = (self.scans % pids.len().max(1) as u64) as usize;
        pids.rotate_left(turn);
        self.scans += 1;
        let mut budget = ScanBudget::per_scan();
        for pid in pids {
            self.refresh_admission(pid);
            self.look_again(pid, &mut budget);
        }
        let probed: Vec<u32> = self.probe.probed_processes();
        for pid in probed {
            if !self.processes.contains_key(&pid) {
                self.probe.detach_process(pid);
            }
        }
    }

    /// Shares the tracking slots out between users when they run out: a process of a user
    /// holding fewer than an equal share (`max_processes` over the users with processes
    /// tracked or waiting) takes the slot of the newest process of the user holding the most,
    /// if that user holds more than the share. One user's hundreds of processes thus cannot
    /// keep another user's job from being tracked, and a node with one user still tracks
    /// `max_processes` of theirs. At most [`FAIR_LOOKS`] waiting processes are looked at, and
    /// [`FAIR_SWAPS`] slots change hands, per scan.
    fn share_slots(&mut self, waiting: &[u32], admitted: &mut HashSet<u32>) {
        // Unknown credentials are one user of their own.
        const UNKNOWN: u32 = u32::MAX;
        let uid_of = |pid: u32| Credentials::of(&self.config.proc_root, pid).map_or(UNKNOWN, |c| c.uid);
        let waiting: Vec<(u32, u32)> = waiting.iter().take(FAIR_LOOKS).map(|pid| (*pid, uid_of(*pid))).collect();
        let mut held: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
        for p in self.processes.values() {
            *held.entry(p.uid.unwrap_or(UNKNOWN)).or_default() += 1;
        }
        for pid in admitted.iter() {
            *held.entry(uid_of(*pid)).or_default() += 1;
        }
        let users: HashSet<u32> = held.keys().copied().chain(waiting.iter().map(|(_, uid)| *uid)).collect();
        let share = (self.config.max_processes / users.len().max(1)).max(1);
        let mut swaps = 0;
        for (pid, uid) in waiting {
            if swaps == FAIR_SWAPS {
                break;
            }
            if held.get(&uid).copied().unwrap_or(0) >= share {
                continue;
            }
            let Some((&largest, &count)) = held.iter().max_by_key(|(uid, n)| (**n, std::cmp::Reverse(**uid))) else {
                break;
            };
            if count <= share {
                break;
            }
            // The newest process that user has tracked gives up its slot.
            let victim = self
                .processes
                .iter()
                .filter(|(_, p)| p.uid.unwrap_or(UNKNOWN) == largest)
                .max_by_key(|(pid, p)| (p.tracked_seq, **pid))
                .map(|(pid, _)| *pid);
            let Some(victim) = victim else { break };
            tracing::info!(pid = victim, uid = largest, for_pid = pid, uid_for = uid, "tracking slot shared out");
            self.remove_process(victim);
            *held.entry(largest).or_default() -= 1;
            *held.entry(uid).or_default() += 1;
            admitted.insert(pid);
            self.slots_shared += 1;
            swaps += 1;
        }
    }

    /// Reads a process's credentials afresh (an exec can change them): a process no longer
    /// admitted gets its threads' own settings back.
    pub(super) fn refresh_admission(&mut self, pid: u32) {
        let creds = Credentials::of(&self.config.proc_root, pid);
        let (admission, nice_floor) = self.admission_of(pid, creds.as_ref());
        let pages = match &creds {
            Some(creds) => self.config.paging.pages(&self.config.proc_root, pid, creds),
            None => Err("does not page: its credentials are unreadable".into()),
        };
        let Some(process) = self.processes.get_mut(&pid) else { return };
        process.pages = pages;
        let was = process.admission.is_ok();
        process.uid = creds.map(|c| c.uid);
        process.admission = admission;
        process.nice_floor = nice_floor;
        let now = process.admission.is_ok();
        if was != now {
            let tids: Vec<u32> = self.tasks.iter().filter(|(_, t)| t.pid == pid).map(|(tid, _)| *tid).collect();
            self.enforcement.admission_changed(pid, now, &tids);
        }
    }

    /// Looks at a tracked process's files again when due (when new, every MAPS_EVERY scans
    /// after — frameworks load CUDA lazily and open GPUs late — and while a library request
    /// waits to be sent again) and the scan's budget allows: the GPUs it holds open (and their
    /// NUMA node), the GPU driver's code ranges, and the CUDA/NCCL libraries it maps that have
    /// not been looked at (nor are waiting to be), queued for the inspector.
    pub(super) fn look_again(&mut self, pid: u32, budget: &mut ScanBudget) {
        let Some(process) = self.processes.get_mut(&pid) else { return };
        let lost = process
            .libraries
            .iter()
            .any(|l| matches!(l.state, Inspection::Pending) && !self.libraries.is_queued(pid, &l.path));
        let due = process.scans_since_maps == 0 || process.scans_since_maps >= MAPS_EVERY || lost;
        if !due {
            process.scans_since_maps += 1;
            return;
        }
        // Its open files and `maps` may be thousands of links and megabytes: only while the
        // scan's budget still holds its worst case; else it stays due for the next scan.
        if !budget.fits_tracked() {
            return;
        }
        process.scans_since_maps = 1;
        let (gpus, links) = policy::gpus_of_counted(&self.config.proc_root, pid);
        budget.fd_links = budget.fd_links.saturating_sub(links);
        let node =
            gpus.first().and_then(|gpu| policy::gpu_numa_node(&self.config.proc_root, &self.config.sys_root, *gpu));
        let cpus = node.map(|n| policy::node_cpus(&self.config.sys_root, n)).unwrap_or_default();
        process.gpus = gpus;
        process.numa_node = node;
        process.node_cpus = cpus;
        let (mappings, read) = library::mappings_counted(&self.config.proc_root, pid);
        budget.maps_bytes = budget.maps_bytes.saturating_sub(read);
        // The GPU driver's and runtime's code in this process, for the tick sampler.
        let text: Vec<(u64, u64)> = mappings
            .iter()
            .filter(|m| m.exec && GpuLibrary::of(&m.path).is_some_and(GpuLibrary::drives_gpu))
            .map(|m| (m.start, m.end))
            .take(MAX_TEXT_RANGES)
            .collect();
        if text != process.gpu_text {
            match self.probe.set_gpu_text(pid, &text) {
                Ok(()) => process.gpu_text = text,
                Err(e) => tracing::warn!(pid, "cannot set the GPU driver's code ranges: {e}"),
            }
        }
        if process.libraries.iter().filter(|l| !matches!(l.state, Inspection::Pending)).count() >= MAX_LIBRARIES {
            return;
        }
        for mapping in mappings {
            if !is_probed_library(&mapping.path) {
                continue;
            }
            // Pending entries stay until answered; one whose worker was abandoned is asked again.
            let known = process.libraries.iter().position(|l| l.path == mapping.path);
            if let Some(i) = known {
                match process.libraries[i].state {
                    Inspection::Pending if self.libraries.is_queued(pid, &mapping.path) => continue,
                    Inspection::Pending => {}
                    _ => continue,
                }
            } else if process.libraries.len() >= MAX_LIBRARIES {
                break;
            }
            let path = mapping.path.clone();
            if !self.libraries.request(Request { pid, mapping }) {
                break;
            }
            if known.is_none() {
                process.libraries.push(Library { path, state: Inspection::Pending });
            }
        }
    }

    /// Attaches the call probes to the libraries the inspector has read and accepted.
    pub(super) fn attach_inspected(&mut self) {
        for done in self.libraries.poll() {
            let Some(process) = self.processes.get_mut(&done.pid) else { continue };
            let Some(library) = process.libraries.iter_mut().find(|l| l.path == done.path) else { continue };
            library.state = match done.result {
                // New links are refused before the daemon runs short of descriptors.
                Ok((file, entries)) => match crate::descriptors::Descriptors::read()
                    .room_for_probes(self.probe.links_needed(done.pid, &done.path, &file, &entries))
                    .and_then(|()| self.probe.attach_library(done.pid, &done.path, &file, &entries))
                {
                    Ok(attached) => {
                        tracing::info!(pid = done.pid, library = %done.path.display(), ?attached, "probing CUDA/NCCL calls");
                        Inspection::Probed(attached)
                    }
                    Err(e) => {
                        tracing::warn!(pid = done.pid, "cannot probe {}: {e}", done.path.display());
                        Inspection::Refused(e)
                    }
                },
                Err(why) => {
                    tracing::warn!(pid = done.pid, "not probing {}: {why}", done.path.display());
                    Inspection::Refused(why)
                }
            };
        }
    }
}
