//! Each ML thread's phase timeline as the recorder keeps it: built from the scheduler's
//! thread events (every phase change, at the start of the window it was settled in), with the
//! threads the scheduler lists at each tick as a second source for a thread whose events were
//! given up. A thread the scheduler still observes has its last span open: it lasts until the
//! next event, and each tick carries it forward.

use std::collections::{HashMap, HashSet, VecDeque};

use ringside_shared::incident::{ThreadSpan, ThreadTimeline};
use ringside_shared::{MlTaskInfo, Phase};

use crate::pipeline::ThreadEvent;

/// Threads followed at most (those beyond are counted, not followed); spans kept per thread
/// (a thread changing phase at every 100 ms window makes 4,200 in the default 420 s) and
/// over all threads (24 bytes each: 3 MiB). Past either, the oldest go first, from the
/// longest timelines.
pub const MAX_TRACKED_THREADS: usize = 1024;
pub const MAX_THREAD_SPANS: usize = 5000;
pub const MAX_SPANS_TOTAL: usize = 131_072;

#[derive(Debug)]
struct Track {
    pid: u32,
    comm: String,
    spans: VecDeque<ThreadSpan>,
    /// The scheduler observes it now: its last span lasts until an event says otherwise.
    alive: bool,
    spans_dropped: u64,
}

impl Track {
    fn new(pid: u32, comm: String) -> Track {
        Track { pid, comm, spans: VecDeque::new(), alive: false, spans_dropped: 0 }
    }

    fn push(&mut self, span: ThreadSpan) {
        if self.spans.len() == MAX_THREAD_SPANS {
            self.spans.pop_front();
            self.spans_dropped += 1;
        }
        self.spans.push_back(span);
    }

    /// In `phase` from `at_ms` on. An open span carried past `at_ms` by a tick is cut back
    /// to it: the event is the more precise.
    fn enter(&mut self, phase: Phase, at_ms: u64) {
        if let Some(last) = self.spans.back_mut() {
            if last.phase == phase && (self.alive || last.end_ms >= at_ms) {
                last.end_ms = last.end_ms.max(at_ms);
                self.alive = true;
                return;
            }
            if self.alive || last.end_ms > at_ms {
                last.end_ms = at_ms.max(last.start_ms);
            }
        }
        let start_ms = self.spans.back().map_or(at_ms, |l| at_ms.max(l.end_ms));
        self.push(ThreadSpan { phase, start_ms, end_ms: start_ms });
        self.alive = true;
    }

    /// Not observed from `at_ms` on.
    fn gone(&mut self, at_ms: u64) {
        if self.alive {
            if let Some(last) = self.spans.back_mut() {
                last.end_ms = at_ms.max(last.start_ms);
            }
        }
        self.alive = false;
    }

    /// Listed at the tick `t_ms` in `phase`: it stands for the time since `since_ms` (the
    /// tick before), unless the events already tell.
    fn listed(&mut self, phase: Phase, t_ms: u64, since_ms: u64) {
        let follows = self.spans.back().is_some_and(|l| l.end_ms >= since_ms);
        match self.spans.back_mut() {
            Some(last) if last.phase == phase && (self.alive || follows) => last.end_ms = last.end_ms.max(t_ms),
            // Alive in another phase: a change whose event was given up.
            _ if self.alive => self.enter(phase, since_ms),
            _ => {
                let start_ms = self.spans.back().map_or(since_ms, |l| since_ms.max(l.end_ms)).min(t_ms);
                self.push(ThreadSpan { phase, start_ms, end_ms: t_ms });
            }
        }
    }
}

/// Every followed thread's timeline over the recorder's horizon.
#[derive(Debug, Default)]
pub struct ThreadTracks {
    tracks: HashMap<u32, Track>,
    /// Threads not followed (beyond [`MAX_TRACKED_THREADS`]) since the recorder started.
    pub refused: u64,
}

impl ThreadTracks {
    /// The track of `tid` in process `pid`: a new one where the tid is new or now names a
    /// thread of another process; `None` when no more threads can be followed.
    fn track(&mut self, pid: u32, tid: u32, comm: Option<&str>) -> Option<&mut Track> {
        if self.tracks.get(&tid).is_some_and(|t| t.pid != pid) {
            self.tracks.remove(&tid);
        }
        if !self.tracks.contains_key(&tid) {
            if self.tracks.len() >= MAX_TRACKED_THREADS {
                self.refused += 1;
                return None;
            }
            self.tracks.insert(tid, Track::new(pid, comm.unwrap_or_default().to_string()));
        }
        let track = self.tracks.get_mut(&tid)?;
        if let Some(comm) = comm.filter(|c| *c != track.comm) {
            track.comm = comm.to_string();
        }
        Some(track)
    }

    /// One tick: the scheduler's events since the tick before, then the threads it lists now
    /// (`since_ms` the tick before), then every thread still observed carried to `now_ms`.
    pub fn tick(&mut self, events: &[ThreadEvent], listed: &[MlTaskInfo], since_ms: u64, now_ms: u64) {
        for event in events {
            match event {
                ThreadEvent::Phase { at_ms, pid, tid, phase, comm } => {
                    if let Some(track) = self.track(*pid, *tid, comm.as_deref()) {
                        track.enter(*phase, *at_ms);
                    }
                }
                ThreadEvent::Gone { at_ms, tid } => {
                    if let Some(track) = self.tracks.get_mut(tid) {
                        track.gone(*at_ms);
                    }
                }
                ThreadEvent::AllGone { at_ms } => self.tracks.values_mut().for_each(|t| t.gone(*at_ms)),
            }
        }
        for task in listed {
            if let Some(track) = self.track(task.pid, task.tid, Some(&task.comm)) {
                track.listed(task.phase, now_ms, since_ms);
            }
        }
        for track in self.tracks.values_mut().filter(|t| t.alive) {
            if let Some(last) = track.spans.back_mut() {
                last.end_ms = last.end_ms.max(now_ms);
            }
        }
        self.keep_within_total();
    }

    /// Over [`MAX_SPANS_TOTAL`], the longest timelines are cut (oldest spans first) to one
    /// length, so that three quarters of the budget remain: a few threads flapping phase at
    /// every window cannot crowd out the others' history.
    fn keep_within_total(&mut self) {
        let total: usize = self.tracks.values().map(|t| t.spans.len()).sum();
        if total <= MAX_SPANS_TOTAL {
            return;
        }
        let target = MAX_SPANS_TOTAL * 3 / 4;
        let kept_at = |cap: usize| self.tracks.values().map(|t| t.spans.len().min(cap)).sum::<usize>();
        // The longest length every timeline may keep with the total at most `target`.
        let (mut low, mut high) = (0, MAX_THREAD_SPANS);
        while low < high {
            let mid = (low + high).div_ceil(2);
            if kept_at(mid) <= target {
                low = mid;
            } else {
                high = mid - 1;
            }
        }
        for track in self.tracks.values_mut() {
            let excess = track.spans.len().saturating_sub(low);
            if excess > 0 {
                track.spans.drain(..excess);
                track.spans.shrink_to(low.max(16));
                track.spans_dropped += excess as u64;
            }
        }
    }

    /// Forgets what ended before `horizon_ms`.
    pub fn prune(&mut self, horizon_ms: u64) {
        self.tracks.retain(|_, t| {
            while t.spans.front().is_some_and(|s| s.end_ms < horizon_ms) {
                t.spans.pop_front();
            }
            t.alive || !t.spans.is_empty()
        });
    }

    /// The timelines over `[start_ms, end_ms]`, clipped to it: at most `max` threads, those of
    /// `first_pids` first, then those in `listed` order (the scheduler's busiest), then the
    /// rest; with how many were left out and how many older spans were dropped.
    pub fn timelines(
        &self,
        (start_ms, end_ms): (u64, u64),
        first_pids: &HashSet<u32>,
        listed: &[u32],
        max: usize,
    ) -> (Vec<ThreadTimeline>, usize, u64) {
        let rank: HashMap<u32, usize> = listed.iter().enumerate().rev().map(|(i, tid)| (*tid, i)).collect();
        let mut candidates: Vec<(bool, usize, u32)> = self
            .tracks
            .iter()
            .filter(|(_, t)| t.spans.iter().any(|s| s.end_ms >= start_ms && s.start_ms <= end_ms))
            .map(|(tid, t)| (!first_pids.contains(&t.pid), rank.get(tid).copied().unwrap_or(usize::MAX), *tid))
            .collect();
        candidates.sort_unstable();
        let left_out = candidates.len().saturating_sub(max);
        let mut dropped = 0;
        let mut timelines: Vec<ThreadTimeline> = candidates
            .iter()
            .take(max)
            .filter_map(|(_, _, tid)| {
                let t = self.tracks.get(tid)?;
                dropped += t.spans_dropped;
                let spans = t
                    .spans
                    .iter()
                    .filter(|s| s.end_ms >= start_ms && s.start_ms <= end_ms)
                    .map(|s| ThreadSpan {
                        phase: s.phase,
                        start_ms: s.start_ms.max(start_ms),
                        end_ms: s.end_ms.min(end_ms),
                    })
                    .collect();
                Some(ThreadTimeline { pid: t.pid, tid: *tid, comm: t.comm.clone(), spans })
            })
            .collect();
        timelines.sort_by_key(|t| t.tid);
        (timelines, left_out, dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enter(at_ms: u64, pid: u32, tid: u32, phase: Phase) -> ThreadEvent {
        ThreadEvent::Phase { at_ms, pid, tid, phase, comm: None }
    }

    fn spans(tracks: &ThreadTracks, tid: u32) -> Vec<(Phase, u64, u64)> {
        let (all, _, _) = tracks.timelines((0, u64::MAX), &HashSet::new(), &[], usize::MAX);
        let t = all.into_iter().find(|t| t.tid == tid).unwrap_or_else(|| panic!("thread {tid}"));
        t.spans.iter().map(|s| (s.phase, s.start_ms, s.end_ms)).collect()
    }

    #[test]
    fn a_span_carried_past_a_change_by_a_tick_is_cut_back_to_it() {
        let mut tracks = ThreadTracks::default();
        tracks.tick(&[enter(0, 1, 2, Phase::GpuCompute)], &[], 0, 1000);
        // The change happened at 900 ms, before the tick that carried the span to 1000 ms; the
        // observer published it after that tick read.
        tracks.tick(&[enter(900, 1, 2, Phase::DataLoading)], &[], 1000, 2000);
        assert_eq!(spans(&tracks, 2), vec![(Phase::GpuCompute, 0, 900), (Phase::DataLoading, 900, 2000)]);
    }

    #[test]
    fn a_new_observer_ends_every_thread_and_a_reused_tid_starts_afresh() {
        let mut tracks = ThreadTracks::default();
        tracks.tick(&[enter(0, 1, 2, Phase::GpuCompute), enter(0, 1, 3, Phase::DataLoading)], &[], 0, 1000);
        tracks.tick(&[ThreadEvent::AllGone { at_ms: 1500 }], &[], 1000, 2000);
        tracks.tick(&[], &[], 2000, 3000);
        assert_eq!(spans(&tracks, 2), vec![(Phase::GpuCompute, 0, 1500)], "not carried on once gone");
        assert_eq!(spans(&tracks, 3), vec![(Phase::DataLoading, 0, 1500)]);
        // Thread id 3 now names a thread of process 9: its history is not that thread's.
        tracks.tick(&[enter(3200, 9, 3, Phase::NcclCollective)], &[], 3000, 4000);
        assert_eq!(spans(&tracks, 3), vec![(Phase::NcclCollective, 3200, 4000)]);
        tracks.prune(1600);
        let (left, _, _) = tracks.timelines((0, u64::MAX), &HashSet::new(), &[], usize::MAX);
        assert_eq!(left.iter().map(|t| t.tid).collect::<Vec<_>>(), vec![3], "what ended before the horizon goes");
    }

    #[test]
    fn threads_and_spans_are_bounded() {
        let mut tracks = ThreadTracks::default();
        let many: Vec<ThreadEvent> =
            (0..MAX_TRACKED_THREADS as u32 + 10).map(|tid| enter(0, 1, 100 + tid, Phase::Unknown)).collect();
        tracks.tick(&many, &[], 0, 1000);
        assert_eq!(tracks.refused, 10);
        // One thread flapping every 100 ms for far longer than it may keep.
        let flap = |k: u64, tid: u32| {
            enter(1000 + k * 100, 1, tid, if k.is_multiple_of(2) { Phase::DataLoading } else { Phase::GpuCompute })
        };
        let flaps: Vec<ThreadEvent> = (0..MAX_THREAD_SPANS as u64 + 50).map(|k| flap(k, 100)).collect();
        tracks.tick(&flaps, &[], 1000, 1_000_000);
        let (all, left_out, dropped) = tracks.timelines((0, u64::MAX), &HashSet::new(), &[], 10);
        assert_eq!((all.len(), left_out), (10, MAX_TRACKED_THREADS - 10));
        assert_eq!(dropped, 51, "the first span and 50 flaps dropped");
        assert_eq!(all[0].spans.len(), MAX_THREAD_SPANS);
        let last = all[0].spans.last().expect("a span");
        assert_eq!((last.phase, last.end_ms), (Phase::GpuCompute, 1_000_000), "the newest kept");

        // Forty threads flapping as fast: the total stays within its budget, and every
        // thread keeps as much as the others (the quiet ones all they had).
        let storm: Vec<ThreadEvent> = (0..4000).flat_map(|k| (0..40).map(move |t| flap(10_000 + k, 200 + t))).collect();
        tracks.tick(&storm, &[], 1_000_000, 2_000_000);
        let (all, _, _) = tracks.timelines((0, u64::MAX), &HashSet::new(), &[], usize::MAX);
        let total: usize = all.iter().map(|t| t.spans.len()).sum();
        assert!(total <= MAX_SPANS_TOTAL, "{total} spans");
        let longest = all.iter().map(|t| t.spans.len()).max().unwrap();
        let flapping: Vec<usize> = all.iter().filter(|t| t.spans.len() > 1).map(|t| t.spans.len()).collect();
        assert_eq!(flapping.len(), 41, "{flapping:?}");
        assert!(flapping.iter().all(|n| *n == longest), "cut to one length: {flapping:?}");
        assert!(all.iter().all(|t| !t.spans.is_empty()), "no thread loses all its history");
    }
}
