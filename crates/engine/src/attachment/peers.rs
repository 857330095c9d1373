//! The client connections an application's calls come from, numbered so
//! the address travels once per connection, not once per call.
//!
//! Each attachment numbers the client connections whose calls reach it
//! with slots 1 to 255. A call carries its connection's slot in its OPEN
//! descriptor's `code` field (OPEN uses it for nothing else), and the
//! calls that take a slot before the engine knows the application has
//! heard of it carry the note "slot N is ADDRESS" in their side sections
//! (`protoplane_seam::OpenRepr::peer`). The application keeps one
//! address per slot.
//!
//! A slot goes to another connection only when no call that used it is
//! still open: a descriptor naming a slot is always posted after the note
//! that gave the slot its current address, so the application never pins
//! a call on the wrong client. With all 255 slots held by calls in flight
//! (255 busy client connections at once to one application), a call of a
//! 256th connection carries its address itself (slot 0: that call only).
//!
//! A slot keeps a `Weak` of its connection's `Peer`, which keeps the
//! allocation and so its address: while the slot holds it, no other
//! connection's `Peer` can have the same address, and comparing pointers
//! is enough to recognize a connection.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use protoplane_grpc::Peer;

/// Slots 1..=255 (index 0 unused).
const SLOTS: usize = 256;

#[derive(Debug, Default)]
struct Slot {
    peer: Weak<Peer>,
    /// Calls open with this slot.
    in_flight: u32,
    /// A note for the current connection was posted.
    noted: bool,
}

/// One attachment's slots.
#[derive(Debug)]
pub(crate) struct PeerSlots {
    slots: Vec<Slot>,
    /// `Arc::as_ptr` of a slot's `Peer` → the slot.
    by_peer: HashMap<usize, u8>,
    /// Where the search for a free slot starts.
    next: usize,
}

impl Default for PeerSlots {
    fn default() -> PeerSlots {
        PeerSlots {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            by_peer: HashMap::new(),
            next: 0,
        }
    }
}

/// What a call says about its client: its connection's slot, and the
/// address to note with it (`None`: the application already has it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerUse {
    pub(crate) slot: u8,
    pub(crate) note: Option<SocketAddr>,
}

impl PeerUse {
    pub(crate) const NONE: PeerUse = PeerUse { slot: 0, note: None };
}

impl PeerSlots {
    /// The slot for a call from `peer` (held until [`PeerSlots::done`]).
    pub(crate) fn take(&mut self, peer: Option<&Arc<Peer>>) -> PeerUse {
        let Some((peer, addr)) = peer.and_then(|p| Some((p, p.addr?))) else {
            return PeerUse::NONE;
        };
        let key = Arc::as_ptr(peer) as usize;
        if let Some(&i) = self.by_peer.get(&key) {
            let s = &mut self.slots[i as usize];
            s.in_flight += 1;
            return PeerUse { slot: i, note: (!s.noted).then_some(addr) };
        }
        for _ in 1..SLOTS {
            self.next = self.next % (SLOTS - 1) + 1;
            let i = self.next;
            if self.slots[i].in_flight > 0 {
                continue;
            }
            let old = std::mem::replace(
                &mut self.slots[i],
                Slot { peer: Arc::downgrade(peer), in_flight: 1, noted: false },
            );
            // The old connection's key goes with its slot, whether or not
            // the connection is still alive: once `old` is dropped its
            // allocation (and so its address) may be reused.
            let old_key = old.peer.as_ptr() as usize;
            if self.by_peer.get(&old_key) == Some(&(i as u8)) {
                self.by_peer.remove(&old_key);
            }
            self.by_peer.insert(key, i as u8);
            return PeerUse { slot: i as u8, note: Some(addr) };
        }
        PeerUse { slot: 0, note: Some(addr) }
    }

    /// The note for `slot` was posted: later calls carry the slot alone.
    pub(crate) fn noted(&mut self, slot: u8) {
        if slot != 0 {
            self.slots[slot as usize].noted = true;
        }
    }

    /// A call that took `slot` ended.
    pub(crate) fn done(&mut self, slot: u8) {
        if slot != 0 {
            let s = &mut self.slots[slot as usize];
            s.in_flight = s.in_flight.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(port: u16) -> Arc<Peer> {
        Arc::new(Peer { addr: Some(([127, 0, 0, 1], port).into()), certificates: Vec::new() })
    }

    #[test]
    fn a_connection_is_noted_until_posted_then_named_by_its_slot() {
        let mut s = PeerSlots::default();
        let a = peer(1);
        let first = s.take(Some(&a));
        assert_eq!(first.note, a.addr);
        // A second call before the first one's note was posted notes too.
        assert_eq!(s.take(Some(&a)), first);
        s.noted(first.slot);
        assert_eq!(s.take(Some(&a)), PeerUse { slot: first.slot, note: None });
        let b = peer(2);
        let other = s.take(Some(&b));
        assert_ne!(other.slot, first.slot);
        assert_eq!(other.note, b.addr);
        assert_eq!(s.take(None), PeerUse::NONE);
        let unaddressed = Arc::new(Peer { addr: None, certificates: Vec::new() });
        assert_eq!(s.take(Some(&unaddressed)), PeerUse::NONE);
    }

    #[test]
    fn a_slot_moves_on_only_when_no_call_holds_it() {
        let mut s = PeerSlots::default();
        let peers: Vec<_> = (0..255).map(peer).collect();
        let uses: Vec<_> = peers.iter().map(|p| s.take(Some(p))).collect();
        let mut slots: Vec<u8> = uses.iter().map(|u| u.slot).collect();
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), 255, "every connection its own slot");
        assert!(!slots.contains(&0));
        // Every slot is held: a 256th connection's call carries its address.
        let late = peer(999);
        assert_eq!(s.take(Some(&late)), PeerUse { slot: 0, note: late.addr });
        // One connection's calls end: its slot goes to the newcomer, noted
        // afresh, and the old connection, back, gets another slot.
        let freed = uses[10].slot;
        s.noted(freed);
        s.done(freed);
        let got = s.take(Some(&late));
        assert_eq!(got, PeerUse { slot: freed, note: late.addr });
        let back = s.take(Some(&peers[10]));
        assert_eq!(back, PeerUse { slot: 0, note: peers[10].addr });
    }

    #[test]
    fn a_slot_taken_over_forgets_its_old_connection() {
        let mut s = PeerSlots::default();
        // 255 connections come and go: each slot is taken once, then freed,
        // and the connections are dropped.
        for port in 0..255 {
            let p = peer(port);
            let u = s.take(Some(&p));
            s.noted(u.slot);
            s.done(u.slot);
        }
        assert_eq!(s.by_peer.len(), 255);
        // New connections take the slots over: the dropped connections'
        // keys go (their addresses may be reused by new allocations, which
        // must never find an old slot "already noted").
        let fresh: Vec<_> = (1000..1255).map(peer).collect();
        for p in &fresh {
            let u = s.take(Some(p));
            assert_eq!(u.note, p.addr, "a new connection is noted");
        }
        assert_eq!(s.by_peer.len(), 255, "one key per slot, no stale ones");
        for p in &fresh {
            let key = Arc::as_ptr(p) as usize;
            let slot = s.by_peer[&key];
            assert_eq!(s.slots[slot as usize].peer.as_ptr(), Arc::as_ptr(p));
        }
    }
}
