//! Failed authentications: counted per client address over a short window, so that one
//! address cannot try tokens (or fill the log) without limit, and logged at a bounded rate.
//! Requests that bring a valid token are never held back: several users of a node share the
//! loopback address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The window failures are counted over.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Addresses followed at most; beyond it, those whose window has passed are forgotten first,
/// then the one whose window started longest ago (never all at once: a flood of new addresses
/// must not wipe the count of the one guessing now).
const MAX_ADDRESSES: usize = 4096;
/// At most one log line per this long; the rest are counted into the next one.
const LOG_EVERY: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Inner {
    by_address: HashMap<IpAddr, (Instant, u32)>,
    logged_at: Option<Instant>,
    unlogged: u64,
}

pub struct AuthFailures {
    budget: u32,
    inner: Mutex<Inner>,
}

/// What to answer a failed authentication.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// 401, as usual.
    Refuse,
    /// 429: the address spent its budget; it may try again after this long.
    Throttle(Duration),
}

impl AuthFailures {
    /// `budget` failures per address per [`WINDOW`].
    pub fn new(budget: u32) -> AuthFailures {
        AuthFailures { budget, inner: Mutex::new(Inner::default()) }
    }

    /// Records a failed authentication from `address` (on `path`) and says how to answer it.
    pub fn failed(&self, address: Option<IpAddr>, path: &str, now: Instant) -> Verdict {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.unlogged += 1;
        if inner.logged_at.is_none_or(|at| now.duration_since(at) >= LOG_EVERY) {
            let who = address.map_or_else(|| "an unknown address".to_string(), |a| a.to_string());
            tracing::warn!(
                "{} failed authentication(s) since the last report; the latest from {who} for {path}",
                inner.unlogged
            );
            inner.logged_at = Some(now);
            inner.unlogged = 0;
        }
        let Some(address) = address else { return Verdict::Refuse };
        if inner.by_address.len() >= MAX_ADDRESSES && !inner.by_address.contains_key(&address) {
            inner.by_address.retain(|_, (since, _)| now.duration_since(*since) < WINDOW);
            if inner.by_address.len() >= MAX_ADDRESSES {
                let oldest = inner.by_address.iter().min_by_key(|(_, (since, _))| *since).map(|(a, _)| *a);
                if let Some(oldest) = oldest {
                    inner.by_address.remove(&oldest);
                }
            }
        }
        let entry = inner.by_address.entry(address).or_insert((now, 0));
        if now.duration_since(entry.0) >= WINDOW {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
        if entry.1 > self.budget {
            Verdict::Throttle(WINDOW.saturating_sub(now.duration_since(entry.0)).max(Duration::from_secs(1)))
        } else {
            Verdict::Refuse
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_over_its_budget_waits_out_the_window_and_others_do_not() {
        let failures = AuthFailures::new(3);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(failures.failed(Some(a), "/api/alerts", t0), Verdict::Refuse);
        }
        assert_eq!(
            failures.failed(Some(a), "/api/alerts", t0 + Duration::from_secs(4)),
            Verdict::Throttle(Duration::from_secs(6))
        );
        assert_eq!(failures.failed(Some(b), "/ws", t0 + Duration::from_secs(4)), Verdict::Refuse, "its own budget");
        assert_eq!(failures.failed(Some(a), "/", t0 + WINDOW), Verdict::Refuse, "a new window");
        assert_eq!(failures.failed(None, "/", t0), Verdict::Refuse);
    }

    #[test]
    fn the_addresses_followed_are_bounded_and_a_flood_does_not_wipe_the_guesser() {
        let failures = AuthFailures::new(3);
        let t0 = Instant::now();
        let guesser: IpAddr = "192.0.2.1".parse().unwrap();
        for _ in 0..3 {
            failures.failed(Some(guesser), "/healthz", t0 + Duration::from_millis(500));
        }
        // A flood of one failure each from many other addresses, all within the window.
        for i in 0..(MAX_ADDRESSES as u32 + 10) {
            failures.failed(Some(IpAddr::from(i.to_be_bytes())), "/", t0);
        }
        assert!(failures.inner.lock().unwrap().by_address.len() <= MAX_ADDRESSES);
        assert!(
            matches!(failures.failed(Some(guesser), "/healthz", t0 + Duration::from_secs(1)), Verdict::Throttle(_)),
            "the guesser's count survives: only the oldest windows were forgotten"
        );
    }
}
