//! Who holds the daemon's connection slots, and who gives one up when they run out.
//!
//! Before a connection has brought a valid token it is *untrusted*: anyone may open one (a
//! load balancer asking `/healthz` does), and several users of a node share the loopback
//! address, so an address alone says nothing about who is behind it. Untrusted connections
//! therefore never keep slots they do not use: the answer to an unauthenticated request closes
//! its connection (no keep-alive), and when the slots of an address — or all slots — are taken,
//! a new connection evicts the oldest *untrusted* one rather than being refused. A client
//! holding slots idle, half-open or kept alive cannot lock an operator out: the operator's
//! connection takes an untrusted slot, sends its token and becomes trusted; only trusted
//! connections are never evicted, and a connection is refused only when every slot it could
//! take is trusted.
//!
//! Bounds: `max_connections` in all, `max_connections_per_address` per client address. An
//! evicted connection leaves the table at once but holds its socket until its task has run;
//! the new connection's [`Admitted::closing`] says when that is, and the accept loop waits for
//! it before taking another, so that the daemon's descriptors stay within the bound (plus the
//! one being admitted) however fast connections arrive.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;

/// Marks a connection trusted once a request on it authenticated (an extension of each of its
/// requests).
#[derive(Clone, Debug, Default)]
pub struct Trust(Arc<AtomicBool>);

impl Trust {
    pub fn grant(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn granted(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

struct Entry {
    id: u64,
    address: IpAddr,
    opened: Instant,
    trust: Trust,
    evict: Option<oneshot::Sender<()>>,
    /// Resolves once the connection's slot is dropped, after its socket.
    closed: Option<oneshot::Receiver<()>>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    entries: Vec<Entry>,
    per_address: HashMap<IpAddr, usize>,
}

/// The open connections, bounded in all and per address.
pub struct Connections {
    max: usize,
    max_per_address: usize,
    inner: Mutex<Inner>,
}

/// A connection let in: its trust mark, the signal that it was evicted, and the slot itself,
/// given back when this is dropped.
pub struct Admitted {
    pub trust: Trust,
    pub evicted: oneshot::Receiver<()>,
    /// One per untrusted connection evicted to make room for it: resolves (with an error) once
    /// that connection's slot, and so its socket, is gone.
    pub closing: Vec<oneshot::Receiver<()>>,
    slot: Slot,
}

struct Slot {
    id: u64,
    table: Arc<Connections>,
    /// Dropped with the slot: tells whoever evicted this connection that it is closed.
    _closed: oneshot::Sender<()>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.table.release(self.id);
    }
}

impl Admitted {
    pub fn id(&self) -> u64 {
        self.slot.id
    }
}

impl Connections {
    pub fn new(max: usize, max_per_address: usize) -> Arc<Connections> {
        Arc::new(Connections { max: max.max(1), max_per_address: max_per_address.max(1), inner: Mutex::default() })
    }

    /// Lets a connection from `address` in, evicting the oldest untrusted one of the same
    /// address (its share is full) or of any (all slots are), if need be; `None` when every
    /// slot it could take is held by a trusted connection.
    pub fn admit(self: &Arc<Connections>, address: IpAddr, now: Instant) -> Option<Admitted> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut closing = Vec::new();
        if inner.per_address.get(&address).copied().unwrap_or(0) >= self.max_per_address {
            closing.push(inner.evict_oldest_untrusted(Some(address))?);
        }
        if inner.entries.len() >= self.max {
            closing.push(inner.evict_oldest_untrusted(None)?);
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let (evict, evicted) = oneshot::channel();
        let (closed_tx, closed) = oneshot::channel();
        let trust = Trust::default();
        inner.entries.push(Entry {
            id,
            address,
            opened: now,
            trust: trust.clone(),
            evict: Some(evict),
            closed: Some(closed),
        });
        *inner.per_address.entry(address).or_default() += 1;
        Some(Admitted { trust, evicted, closing, slot: Slot { id, table: self.clone(), _closed: closed_tx } })
    }

    fn release(&self, id: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = inner.entries.iter().position(|e| e.id == id) {
            let entry = inner.entries.swap_remove(at);
            inner.forget(entry.address);
        }
    }

    /// Open connections, and of those the trusted.
    pub fn counts(&self) -> (usize, usize) {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (inner.entries.len(), inner.entries.iter().filter(|e| e.trust.granted()).count())
    }
}

impl Inner {
    fn forget(&mut self, address: IpAddr) {
        if let Some(n) = self.per_address.get_mut(&address) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_address.remove(&address);
            }
        }
    }

    /// Evicts the oldest untrusted connection (of `address`, if given): what resolves once it
    /// is closed, or `None` if there is none. It leaves the table now: its task closes it when
    /// it sees the signal.
    fn evict_oldest_untrusted(&mut self, address: Option<IpAddr>) -> Option<oneshot::Receiver<()>> {
        let oldest = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| !e.trust.granted() && address.is_none_or(|a| e.address == a))
            .min_by_key(|(_, e)| (e.opened, e.id))
            .map(|(i, _)| i);
        let mut entry = self.entries.swap_remove(oldest?);
        if let Some(evict) = entry.evict.take() {
            let _ = evict.send(());
        }
        self.forget(entry.address);
        entry.closed.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_address_at_its_share_gives_up_its_oldest_untrusted_connection() {
        let table = Connections::new(10, 2);
        let t0 = Instant::now();
        let mut first = table.admit(ip("127.0.0.1"), t0).unwrap();
        let second = table.admit(ip("127.0.0.1"), t0 + Duration::from_millis(1)).unwrap();
        let third = table.admit(ip("127.0.0.1"), t0 + Duration::from_millis(2)).unwrap();
        let mut closing = third.closing;
        assert_eq!(closing.len(), 1, "one eviction");
        assert!(first.evicted.try_recv().is_ok(), "the oldest is told to close");
        assert!(
            matches!(closing[0].try_recv(), Err(oneshot::error::TryRecvError::Empty)),
            "not closed while its task still holds it"
        );
        assert_eq!(table.counts(), (2, 0));
        // Once trusted, a connection stays; when both are trusted the address is full.
        second.trust.grant();
        third.trust.grant();
        assert!(table.admit(ip("127.0.0.1"), t0 + Duration::from_millis(3)).is_none());
        assert!(table.admit(ip("10.0.0.9"), t0).is_some(), "another address has its own share");
        drop(first);
        assert!(
            matches!(closing[0].try_recv(), Err(oneshot::error::TryRecvError::Closed)),
            "closed once its task dropped it"
        );
        assert_eq!(table.counts(), (2, 2), "an evicted connection's slot was already given back");
        drop(second);
        assert_eq!(table.counts(), (1, 1));
    }

    #[test]
    fn when_every_slot_is_taken_the_oldest_untrusted_of_any_address_goes() {
        let table = Connections::new(3, 3);
        let t0 = Instant::now();
        let a = table.admit(ip("10.0.0.1"), t0).unwrap();
        let mut b = table.admit(ip("10.0.0.2"), t0 + Duration::from_millis(1)).unwrap();
        let c = table.admit(ip("10.0.0.3"), t0 + Duration::from_millis(2)).unwrap();
        a.trust.grant();
        let d = table.admit(ip("10.0.0.4"), t0 + Duration::from_millis(3)).unwrap();
        assert!(b.evicted.try_recv().is_ok(), "the oldest untrusted, not the trusted older one");
        assert_eq!(table.counts(), (3, 1));
        c.trust.grant();
        d.trust.grant();
        assert!(table.admit(ip("10.0.0.5"), t0).is_none(), "every slot trusted: refused");
    }
}
