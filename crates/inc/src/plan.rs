//! What the controller hands an application instance when it registers:
//! its id, flows, data-plane memory and policies. The client and server
//! agents are both configured from it, so they agree on every address.

use crate::mac::Key;

/// How an aggregation slot is made ready for its next chunk (`Map.clear`).
///
/// With `S` slots reserved, chunk `c` uses slot `c mod S` and a member
/// may have `window` chunks in flight:
///
/// | policy | cells | window | who answers a late retransmission |
/// |---|---|---|---|
/// | `Copy` | S | S | the server agent's backup (a slot is reused only after the server agent has copied its result and said so) |
/// | `Shadow` | 2 S | S | the other copy of the slot (SwitchML's shadow copies) |
/// | `Lazy` | S | S / 2 | the slot itself: it is cleared by the first packet of its next chunk, which no member sends before every member has the result |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClearPolicy {
    /// Back the result up on the server agent, then reuse the slot.
    Copy,
    /// Two copies of every slot; alternate.
    Shadow,
    /// Clear on next use.
    Lazy,
}

impl ClearPolicy {
    /// The NetFilter spelling.
    pub fn name(self) -> &'static str {
        match self {
            ClearPolicy::Copy => "copy",
            ClearPolicy::Shadow => "shadow",
            ClearPolicy::Lazy => "lazy",
        }
    }

    /// Parses the NetFilter spelling.
    pub fn parse(s: &str) -> Option<ClearPolicy> {
        Some(match s {
            "copy" => ClearPolicy::Copy,
            "shadow" => ClearPolicy::Shadow,
            "lazy" => ClearPolicy::Lazy,
            _ => return None,
        })
    }
}

/// What synchronous aggregation does when a member is lost (its
/// heartbeats stopped for a lease): the NetFilter's `MemberLoss`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MemberLoss {
    /// Every aggregation in progress and every later one fails at once,
    /// naming the member (a sum needs every member).
    #[default]
    Fail,
    /// The aggregation goes on with the members that remain: each step's
    /// result is the exact sum of the members its outcome names (all of
    /// them for steps the lost member finished, the others from then on).
    Continue,
}

impl MemberLoss {
    /// The NetFilter spelling.
    pub fn name(self) -> &'static str {
        match self {
            MemberLoss::Fail => "fail",
            MemberLoss::Continue => "continue",
        }
    }

    /// Parses the NetFilter spelling.
    pub fn parse(s: &str) -> Option<MemberLoss> {
        Some(match s {
            "fail" => MemberLoss::Fail,
            "continue" => MemberLoss::Continue,
            _ => return None,
        })
    }
}

/// Which keys of a `Map` get data-plane cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CachePolicy {
    /// Every period the server agent counts how often each key reached it
    /// and how much each resident key changed on the data plane; keys hotter
    /// than the coldest residents replace them (NetRPC's periodic counting,
    /// an LRU approximation).
    PeriodicCounting,
    /// First come, first served: keys get cells in the order they appear
    /// until memory is full, and keep them.
    Fcfs,
    /// Each key has one possible cell, chosen by its logical address; the
    /// first key to claim a cell keeps it.
    Hashing,
}

impl CachePolicy {
    /// The spelling on command lines and in reports.
    pub fn name(self) -> &'static str {
        match self {
            CachePolicy::PeriodicCounting => "periodic-counting",
            CachePolicy::Fcfs => "fcfs",
            CachePolicy::Hashing => "hashing",
        }
    }

    /// Parses [`CachePolicy::name`].
    pub fn parse(s: &str) -> Option<CachePolicy> {
        [CachePolicy::PeriodicCounting, CachePolicy::Fcfs, CachePolicy::Hashing]
            .into_iter()
            .find(|c| c.name() == s)
    }
}

/// An application instance's place in the data plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppPlan {
    /// Application id.
    pub app: u16,
    /// The server agent's node.
    pub server: u16,
    /// The first switch's node (`None`: no data plane at all).
    pub switch: Option<u16>,
    /// Number of members (client agents).
    pub members: u16,
    /// Flows per member (more than one: a large call is spread over them).
    pub flows_per_member: u16,
    /// First flow id.
    pub flow_base: u16,
    /// Switches in the chain.
    pub switches: u8,
    /// Register groups (pairs per packet) per switch.
    pub groups: u8,
    /// The data plane's flow window (sequence numbers per flow bit array).
    pub window: u32,
    /// Reserved register indices, the same on every switch of the chain;
    /// `None` when the data plane had no room (everything runs on the
    /// server agent).
    pub memory: Option<(u32, u32)>,
    /// How aggregation slots are cleared.
    pub clear: ClearPolicy,
    /// Which keys get cells.
    pub cache: CachePolicy,
    /// `CntFwd` threshold (members for synchronous aggregation, the
    /// quorum for agreement).
    pub threshold: u32,
    /// Bits of a logical address (32; fewer only to force collisions).
    pub key_bits: u32,
    /// The application's MAC key ([`crate::mac`]): every packet of the
    /// application is sealed with it.
    pub key: Key,
    /// In a member's plan (a join's answer), the member's incarnation: it
    /// goes into every packet the member sends. 0 in the server agent's.
    pub incarnation: u8,
    /// What synchronous aggregation does when a member is lost.
    pub member_loss: MemberLoss,
}

/// A bit for each of `members` members (member *i* is bit *i*).
pub fn member_mask(members: u16) -> u64 {
    if members >= 64 {
        u64::MAX
    } else {
        (1u64 << members) - 1
    }
}

impl AppPlan {
    /// Total flows of the application.
    pub fn flows(&self) -> u16 {
        self.members * self.flows_per_member
    }

    /// Member `m`'s flows. The first is its *primary* flow, `flow_base + m`:
    /// aggregation and votes use it, and the data plane counts a member by
    /// it (so members must number at most 32 for test-and-set counting).
    pub fn member_flows(&self, m: u16) -> Vec<u16> {
        let mut flows = vec![self.flow_base + m];
        let extra = self.flows_per_member.saturating_sub(1);
        for j in 0..extra {
            flows.push(self.flow_base + self.members + m * extra + j);
        }
        flows
    }

    /// The member a flow belongs to.
    pub fn member_of(&self, flow: u16) -> Option<u16> {
        let rel = flow.checked_sub(self.flow_base)?;
        if rel < self.members {
            return Some(rel);
        }
        let extra = self.flows_per_member.saturating_sub(1);
        if extra == 0 {
            return None;
        }
        let m = (rel - self.members) / extra;
        (m < self.members).then_some(m)
    }

    /// Pairs one packet carries through the whole chain.
    pub fn pairs_per_packet(&self) -> usize {
        usize::from(self.groups) * usize::from(self.switches.max(1))
    }

    /// Aggregation slots (`S` of [`ClearPolicy`]) and the member window in
    /// chunks; `None` without memory.
    pub fn agg_slots(&self) -> Option<(u32, u32)> {
        let (_, len) = self.memory?;
        let (slots, window) = match self.clear {
            ClearPolicy::Copy => (len, len),
            ClearPolicy::Shadow => (len / 2, len / 2),
            ClearPolicy::Lazy => (len, len / 2),
        };
        (slots > 0 && window > 0).then_some((slots, window))
    }

    /// The register index of chunk `c`'s slot.
    pub fn agg_index(&self, chunk: u32) -> Option<u32> {
        let (base, _) = self.memory?;
        let (slots, _) = self.agg_slots()?;
        let copy = if self.clear == ClearPolicy::Shadow { (chunk / slots) & 1 } else { 0 };
        Some(base + chunk % slots + copy * slots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(clear: ClearPolicy) -> AppPlan {
        AppPlan {
            app: 1,
            server: 10,
            switch: Some(1),
            members: 3,
            flows_per_member: 2,
            flow_base: 100,
            switches: 1,
            groups: 32,
            window: 256,
            memory: Some((1000, 8)),
            clear,
            cache: CachePolicy::Fcfs,
            threshold: 3,
            key_bits: 32,
            key: Key::default(),
            incarnation: 0,
            member_loss: MemberLoss::Fail,
        }
    }

    #[test]
    fn flows_are_primary_then_extra_and_map_back() {
        let p = plan(ClearPolicy::Lazy);
        assert_eq!(p.member_flows(0), vec![100, 103]);
        assert_eq!(p.member_flows(2), vec![102, 105]);
        for m in 0..3 {
            for f in p.member_flows(m) {
                assert_eq!(p.member_of(f), Some(m));
            }
        }
        assert_eq!(p.member_of(106), None);
        assert_eq!(p.member_of(99), None);
    }

    #[test]
    fn slots_follow_the_clear_policy() {
        assert_eq!(plan(ClearPolicy::Copy).agg_slots(), Some((8, 8)));
        assert_eq!(plan(ClearPolicy::Lazy).agg_slots(), Some((8, 4)));
        let shadow = plan(ClearPolicy::Shadow);
        assert_eq!(shadow.agg_slots(), Some((4, 4)));
        assert_eq!(shadow.agg_index(1), Some(1001));
        assert_eq!(shadow.agg_index(5), Some(1005));
        assert_eq!(shadow.agg_index(9), Some(1001));
    }
}
