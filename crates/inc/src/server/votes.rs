//! `CntFwd` votes on the host: instances opened on the data plane or not,
//! votes the data plane did not count, commits exactly once.

use super::*;
use crate::Error;

impl ServerAgent {
    /// A vote the data plane did not count.
    pub(super) fn on_vote(&mut self, p: &Packet) {
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
                        self.commit(instance, false);
                    }
                }
            }
        }
        self.ack(&h, Vec::new());
    }

    /// Commits a proposed instance once, with the proposed value (a quorum
    /// for a number this agent never proposed is ignored).
    pub(super) fn commit(&mut self, instance: u32, in_network: bool) {
        let Some(inst) = self.instances.get_mut(&instance) else { return };
        if inst.committed {
            return;
        }
        inst.committed = true;
        let addr = inst.addr;
        let value = inst.value as i32;
        self.events.push_back(ServerEvent::Committed { instance, value, in_network });
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
    }

    /// Opens vote `instance` (at least 1) for `value`: gives it a
    /// data-plane slot if there is one, then asks every member to vote.
    pub fn propose(&mut self, now: u64, instance: u32, value: i64) -> Result<(), Error> {
        if instance == 0 {
            return Err(Error::ReservedInstance);
        }
        if self.instances.contains_key(&instance) {
            return Err(Error::AlreadyProposed { instance });
        }
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
        Ok(())
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
