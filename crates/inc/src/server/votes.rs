//! `CntFwd` votes on the host: instances opened on the data plane or not,
//! votes the data plane did not count, commits exactly once.

use super::*;
use crate::Error;

/// Commit notices a server agent keeps sending until every member
/// acknowledged them (the oldest are given up beyond).
const NOTICES_KEPT: usize = 65_536;

/// How often a commit notice is sent again before it is given up.
const NOTICE_TRIES: u32 = 10;

/// A commit notice not every member acknowledged.
#[derive(Debug)]
pub(super) struct Notice {
    value: i32,
    /// Members that acknowledged it.
    acked: u64,
    next_at: u64,
    tries: u32,
}

impl ServerAgent {
    /// A vote the data plane did not count.
    pub(super) fn on_vote(&mut self, now: u64, p: &Packet) {
        let h = p.header;
        let Some(member) = self.plan.member_of(h.flow) else { return };
        if let Some(pair) = p.pair_items().first() {
            let instance = pair.key;
            let bit = 1u64 << (member % 64);
            // Only instances this agent proposed are counted: a vote for
            // any other number must not make the agent keep state.
            if let Some(inst) = self.instances.get_mut(&instance) {
                if inst.voters & bit == 0 && !inst.committed {
                    inst.voters |= bit;
                    inst.count += 1;
                    self.stats.host_items += 1;
                    if inst.count >= self.plan.threshold {
                        self.commit(now, instance, false);
                    }
                }
            }
        }
        self.ack(&h, Vec::new());
    }

    /// Commits a proposed instance once, with the proposed value (a quorum
    /// for a number this agent never proposed is ignored).
    pub(super) fn commit(&mut self, now: u64, instance: u32, in_network: bool) {
        let Some(inst) = self.instances.get_mut(&instance) else { return };
        if inst.committed {
            return;
        }
        inst.committed = true;
        let addr = inst.addr;
        let value = inst.value as i32;
        self.events.push_back(ServerEvent::Committed { instance, value, in_network });
        self.notices.insert(
            instance,
            Notice { value, acked: 0, next_at: now + self.tuning.vote_timeout_us * 2, tries: 0 },
        );
        while self.notices.len() > NOTICES_KEPT {
            self.notices.pop_first();
        }
        // Additive increase: one more instance open per commit.
        self.vote_window =
            (self.vote_window + 1.0).min(f64::from(self.tuning.max_vote_window.max(1)));
        self.since_halving = self.since_halving.saturating_add(1);
        if !in_network {
            let mut hd = self.header(Kind::Result, 0);
            hd.aux = instance;
            hd.flags = Flags(Flags::QUORUM);
            let p = Packet::pairs(hd, vec![Pair { key: instance, addr: Addr::NONE, value }]);
            self.multicast(&p);
        }
        if !addr.is_none() {
            let index = u32::from(addr.index());
            let control = Control::ResetMeta { app: self.plan.app, slots: vec![(index, 0)] };
            self.control(addr.switch(), control, Pending::Ignore);
            self.free_vote_slots.push(index);
        }
        // Keep a bounded history of committed instances.
        while self.instances.len() > 4096 {
            let Some((&first, _)) = self.instances.iter().find(|(_, i)| i.committed) else { break };
            self.instances.remove(&first);
        }
        self.open_queued(now);
    }

    /// The re-proposal timeout after `tries` re-proposals.
    pub(super) fn vote_timeout(&self, tries: u32) -> u64 {
        self.tuning.vote_timeout_us << tries.min(6)
    }

    /// Congestion (a marked commit, a lost round): the vote window halves,
    /// at most once per window of commits.
    pub(super) fn congested(&mut self) {
        if f64::from(self.since_halving) >= self.vote_window / 2.0 {
            self.vote_window = (self.vote_window / 2.0).max(1.0);
            self.since_halving = 0;
        }
    }

    fn open_instances(&self) -> usize {
        self.instances.values().filter(|i| !i.committed).count()
    }

    /// Opens queued proposals while the window has room.
    fn open_queued(&mut self, now: u64) {
        let mut open = self.open_instances();
        while (open as f64) < self.vote_window.floor() {
            let Some((instance, value)) = self.queued.pop_front() else { break };
            self.queued_ids.remove(&instance);
            self.open(now, instance, value);
            open += 1;
        }
    }

    /// Members acknowledge the commit notices they heard; a notice every
    /// member acknowledged is done.
    pub(super) fn on_commit_acks(&mut self, h: &Header, items: &[Wide]) {
        let Some(member) = self.plan.member_of(h.flow) else { return };
        let everyone = crate::plan::member_mask(self.plan.members);
        for i in items.iter().filter(|i| i.op == WideOp::CommitAck) {
            let Ok(b) = <[u8; 4]>::try_from(i.key.as_slice()) else { continue };
            let instance = u32::from_be_bytes(b);
            if let Some(n) = self.notices.get_mut(&instance) {
                n.acked |= 1u64 << (member % 64);
                if n.acked & everyone == everyone {
                    self.notices.remove(&instance);
                }
            }
        }
    }

    /// Sends the commit notices that are due again to the members that did
    /// not acknowledge them (one packet of up to 32 per member), each
    /// notice with its own doubling timeout; gives a notice up after
    /// [`NOTICE_TRIES`].
    pub(super) fn resend_notices(&mut self, now: u64) {
        let base = self.tuning.vote_timeout_us * 2;
        let members = usize::from(self.plan.members);
        let mut per_member: Vec<Vec<Pair>> = vec![Vec::new(); members];
        self.notices.retain(|instance, n| {
            if now < n.next_at {
                return true;
            }
            if n.tries >= NOTICE_TRIES {
                return false;
            }
            n.tries += 1;
            n.next_at = now + (base << n.tries.min(5));
            for (m, list) in per_member.iter_mut().enumerate() {
                if n.acked & (1u64 << (m % 64)) == 0 {
                    list.push(Pair { key: *instance, addr: Addr::NONE, value: n.value });
                }
            }
            true
        });
        for (m, pairs) in per_member.into_iter().enumerate() {
            let Some(node) = self.member_nodes.get(m).copied().flatten() else { continue };
            for batch in pairs.chunks(32) {
                let mut hd = self.header(Kind::Result, node);
                hd.aux = batch[0].key;
                hd.flags = Flags(Flags::QUORUM);
                self.send(Packet::pairs(hd, batch.to_vec()));
            }
        }
    }

    pub(super) fn next_notice(&self) -> Option<u64> {
        self.notices.values().map(|n| n.next_at).min()
    }

    /// Proposes vote `instance` (at least 1) for `value`: it opens at once
    /// if the vote window has room (a data-plane slot if there is one, then
    /// every member is asked to vote), else when earlier instances commit.
    pub fn propose(&mut self, now: u64, instance: u32, value: i64) -> Result<(), Error> {
        if instance == 0 {
            return Err(Error::ReservedInstance);
        }
        if self.instances.contains_key(&instance) || !self.queued_ids.insert(instance) {
            return Err(Error::AlreadyProposed { instance });
        }
        self.queued.push_back((instance, value));
        self.open_queued(now);
        Ok(())
    }

    fn open(&mut self, now: u64, instance: u32, value: i64) {
        let slot = if self.plan.switch.is_some() { self.free_vote_slots.pop() } else { None };
        let addr = slot.map_or(Addr::NONE, |i| Addr::new(0, 0, i as u16));
        self.instances.insert(
            instance,
            Instance {
                value,
                addr,
                voters: 0,
                count: 0,
                committed: false,
                proposed_at: now,
                ready: slot.is_none(),
                tries: 0,
            },
        );
        match slot {
            Some(index) => {
                let control =
                    Control::ResetMeta { app: self.plan.app, slots: vec![(index, instance)] };
                self.control(0, control, Pending::OpenVote { instance });
            }
            None => self.send_proposal(instance),
        }
    }

    pub(super) fn send_proposal(&mut self, instance: u32) {
        let Some(inst) = self.instances.get(&instance) else { return };
        let mut key = instance.to_be_bytes().to_vec();
        key.extend_from_slice(&inst.addr.0.to_be_bytes());
        let mut hd = self.header(Kind::Wide, 0);
        hd.aux = instance;
        let p = Packet::wide(hd, vec![Wide { op: WideOp::Propose, key, value: inst.value }]);
        self.multicast(&p);
    }
}
