//! The daemon's own file descriptors: the open-file limit raised at start, how many are in
//! use, and how many uprobe links may take.
//!
//! Every attached uprobe link is a descriptor, and systemd's default soft limit is 1024. So
//! the soft limit is raised to the hard one at start, and probes may only take descriptors
//! while the daemon holds fewer than [`PROBE_SHARE`] of the limit: past that, a new library is
//! refused with the reason and the listener, the database and incident files keep the rest.
//! Health turns degraded at [`WARN_SHARE`].
//!
//! Architecture invariant: a leaf; it reads only the daemon's own `/proc/self/fd`.

/// Probes are refused once the daemon would hold this share of its open-file limit.
pub const PROBE_SHARE: f64 = 0.5;
/// The `descriptors` component is degraded from this share on.
pub const WARN_SHARE: f64 = 0.8;

/// Descriptors in use and the open-file limits, as read now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptors {
    pub open: u64,
    pub soft_limit: u64,
    pub hard_limit: u64,
}

impl Descriptors {
    pub fn read() -> Descriptors {
        let (soft_limit, hard_limit) = limits();
        Descriptors { open: open_count(), soft_limit, hard_limit }
    }

    /// Why the daemon is short of descriptors, when it holds [`WARN_SHARE`] of its limit.
    pub fn shortage(&self) -> Option<String> {
        (self.open as f64 >= self.soft_limit as f64 * WARN_SHARE).then(|| {
            format!(
                "{} of {} file descriptors in use (soft limit; hard {}): new uprobes are refused past {:.0}%; \
                 raise LimitNOFILE",
                self.open,
                self.soft_limit,
                self.hard_limit,
                PROBE_SHARE * 100.0
            )
        })
    }

    /// Whether `needed` more descriptors may go to uprobe links (none needed: always).
    pub fn room_for_probes(&self, needed: usize) -> Result<(), String> {
        if needed == 0 {
            return Ok(());
        }
        let budget = (self.soft_limit as f64 * PROBE_SHARE) as u64;
        if self.open + needed as u64 > budget {
            return Err(format!(
                "not probed: {} more descriptors would take the daemon past {budget} ({:.0}% of its open-file \
                 limit {}; {} in use), which is kept for connections and files",
                needed,
                PROBE_SHARE * 100.0,
                self.soft_limit,
                self.open
            ));
        }
        Ok(())
    }
}

/// Descriptors the daemon has open now (0 if `/proc/self/fd` cannot be read).
pub fn open_count() -> u64 {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count() as u64).unwrap_or(0)
}

/// The soft and hard open-file limits.
pub fn limits() -> (u64, u64) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given, which lives on this stack.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return (1024, 1024);
    }
    (limit.rlim_cur, limit.rlim_max)
}

/// Raises the soft open-file limit to the hard one (a process may, without privileges).
/// Returns the soft limit before and after.
pub fn raise_soft_limit() -> std::io::Result<(u64, u64)> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: as in `limits`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads the struct it is given; raising the soft limit up to the hard
        // one is always allowed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok((before, limit.rlim_cur))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_stop_at_half_the_limit_and_health_warns_at_four_fifths() {
        let d = Descriptors { open: 500, soft_limit: 1024, hard_limit: 4096 };
        assert!(d.room_for_probes(12).is_ok());
        assert!(Descriptors { open: 1000, ..d }.room_for_probes(0).is_ok(), "a file probed already needs none");
        let why = d.room_for_probes(13).unwrap_err();
        assert!(why.contains("past 512 (50% of its open-file limit 1024; 500 in use)"), "{why}");
        assert_eq!(d.shortage(), None);
        let short = Descriptors { open: 820, ..d }.shortage().unwrap();
        assert!(short.starts_with("820 of 1024 file descriptors in use"), "{short}");
    }

    #[test]
    fn the_soft_limit_goes_up_to_the_hard_one() {
        let (soft, hard) = limits();
        let (before, after) = raise_soft_limit().unwrap();
        assert_eq!(before, soft);
        assert_eq!(after, hard);
        assert_eq!(limits(), (hard, hard));
        let now = Descriptors::read();
        assert!(now.open >= 3, "stdin, stdout and stderr at least: {now:?}");
    }
}
