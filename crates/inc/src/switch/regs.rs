//! Register arrays and the once-per-pass rule.
//!
//! Every packet-path access goes through a method that takes the [`Pass`]
//! and marks its array touched; a second touch of the same array in one
//! pass is counted (it would not compile to a switch) and a test asserts
//! the count stays zero. Control-plane accesses take no pass: on a real
//! switch they are register reads and writes from the CPU port.

use super::{AppEntry, Contribution, CountMode, GroupAdd, MetaOutcome, SwitchConfig};

/// Which arrays one pass has touched.
#[derive(Debug, Default)]
pub(super) struct Pass {
    touched: u128,
    pub(super) double_touch: u32,
}

/// An array's bit in [`Pass::touched`].
#[derive(Clone, Copy, Debug)]
pub(super) enum Array {
    Flow,
    Seen,
    Meta,
    Group(usize),
    Applied,
    Overflow,
}

impl Pass {
    fn touch(&mut self, a: Array) {
        let bit = match a {
            Array::Seen => 0,
            Array::Meta => 1,
            Array::Applied => 2,
            Array::Overflow => 3,
            Array::Flow => 4,
            Array::Group(g) => 5 + g,
        };
        if self.touched & (1 << bit) != 0 {
            self.double_touch += 1;
        }
        self.touched |= 1 << bit;
    }
}

/// The switch's memory.
#[derive(Debug)]
pub(super) struct Registers {
    window: usize,
    /// Per flow: the incarnation of the member that owns it (set by the
    /// controller at each join) and the newest sequence number seen.
    flows: Vec<FlowState>,
    /// Stage 0: one flip bit per (flow, seq mod window); 1 = "round -1
    /// done", so round 0 (flip 0) is new.
    seen: Vec<u64>,
    /// Stage 1: slot metadata (tag, count, contributor bits).
    meta: Vec<(u32, u32, u32)>,
    /// Register groups: tag and value per cell.
    groups: Vec<Vec<(u32, i32)>>,
    /// Last stage: what the first pass of (flow, seq mod window) applied
    /// (a pair of 32-bit registers: one bit per pair of a 64-pair chain).
    applied: Vec<u64>,
    /// Last stage: overflowed positions per aggregation slot.
    overflow: Vec<u64>,
}

/// A flow's stage-0 state.
#[derive(Clone, Copy, Debug, Default)]
struct FlowState {
    incarnation: u8,
    high: Option<u32>,
}

/// Why stage 0 refused a member's packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FlowRefusal {
    /// Not the flow's current incarnation (a member that restarted, or
    /// a flow that does not exist).
    Incarnation,
    /// Older than the flow can still retransmit: a replay.
    Replay,
}

impl Registers {
    pub(super) fn new(c: &SwitchConfig) -> Registers {
        let cells = c.registers as usize;
        let flow_slots = usize::from(c.flows) * c.window as usize;
        Registers {
            window: c.window as usize,
            flows: vec![FlowState::default(); usize::from(c.flows)],
            seen: vec![u64::MAX; flow_slots.div_ceil(64)],
            meta: vec![(0, 0, 0); cells],
            groups: vec![vec![(0, 0); cells]; usize::from(c.groups)],
            applied: vec![0; flow_slots],
            overflow: vec![0; cells],
        }
    }

    /// Zeroes an application's memory and resets its flows' bits.
    pub(super) fn zero_app(&mut self, e: &AppEntry, _c: &SwitchConfig) {
        let mem = e.mem_base as usize..(e.mem_base + e.mem_len) as usize;
        for i in mem.clone() {
            self.meta[i] = (0, 0, 0);
            self.overflow[i] = 0;
        }
        for g in &mut self.groups {
            g[mem.clone()].fill((0, 0));
        }
        let flows = e.flow_base..e.flow_base + e.flows;
        self.reset_flows(flows, 0);
    }

    /// Starts `flows` over for a new incarnation of their member: every
    /// flip bit back to its initial state, no applied masks, no newest
    /// sequence number. (Control plane: a loop a switch CPU may run.)
    pub(super) fn reset_flows(&mut self, flows: impl IntoIterator<Item = u16>, incarnation: u8) {
        for f in flows {
            let f = usize::from(f);
            if f >= self.flows.len() {
                continue;
            }
            self.flows[f] = FlowState { incarnation, high: None };
            for s in f * self.window..(f + 1) * self.window {
                self.seen[s / 64] |= 1 << (s % 64);
                self.applied[s] = 0;
            }
        }
    }

    /// The incarnation each of `flows` admits (control plane).
    pub(super) fn incarnations(&self, flows: std::ops::Range<u16>) -> Vec<u8> {
        flows.map(|f| self.flows.get(usize::from(f)).map_or(0, |s| s.incarnation)).collect()
    }

    /// Stage 0: a member's packet must come from the flow's current
    /// incarnation, and a sequenced one (`seq`) must not be older than half
    /// a window behind the newest the flow has sent (a sender never has
    /// more than half a window in flight, so only a replay can be). Records
    /// the newest sequence number.
    pub(super) fn flow_check(
        &mut self,
        pass: &mut Pass,
        flow: u16,
        incarnation: u8,
        seq: Option<u32>,
    ) -> Result<(), FlowRefusal> {
        pass.touch(Array::Flow);
        let half = (self.window / 2) as u32;
        let Some(st) = self.flows.get_mut(usize::from(flow)) else {
            return Err(FlowRefusal::Incarnation);
        };
        if st.incarnation != incarnation {
            return Err(FlowRefusal::Incarnation);
        }
        if let Some(seq) = seq {
            match st.high {
                Some(high) if (seq.wrapping_sub(high) as i32) <= 0 => {
                    if high.wrapping_sub(seq) >= half {
                        return Err(FlowRefusal::Replay);
                    }
                }
                _ => st.high = Some(seq),
            }
        }
        Ok(())
    }

    /// Stage 0: `true` if the stored bit equals `flip` (a retransmission);
    /// otherwise stores `flip`.
    pub(super) fn seen_test_and_store(&mut self, pass: &mut Pass, slot: usize, flip: bool) -> bool {
        pass.touch(Array::Seen);
        let (w, b) = (slot / 64, slot % 64);
        let stored = self.seen[w] >> b & 1 == 1;
        if stored == flip {
            return true;
        }
        self.seen[w] ^= 1 << b;
        false
    }

    /// Last stage: stores `mask` for a first pass, returns the stored mask
    /// for a retransmission.
    pub(super) fn applied_mask(
        &mut self,
        pass: &mut Pass,
        slot: usize,
        dup: bool,
        mask: u64,
    ) -> u64 {
        pass.touch(Array::Applied);
        if dup {
            self.applied[slot]
        } else {
            self.applied[slot] = mask;
            mask
        }
    }

    /// Register group `g`, cell `i`: add `v` if the tag is `key`.
    pub(super) fn group_add(
        &mut self,
        pass: &mut Pass,
        g: usize,
        i: usize,
        key: u32,
        v: i32,
    ) -> GroupAdd {
        pass.touch(Array::Group(g));
        let cell = &mut self.groups[g][i];
        if cell.0 != key {
            return GroupAdd::Miss;
        }
        match cell.1.checked_add(v) {
            Some(sum) => {
                cell.1 = sum;
                GroupAdd::Added(sum)
            }
            None => GroupAdd::Overflow,
        }
    }

    /// An aggregation slot's value in group `g`: start over with `v`
    /// (`reset`) or add `v`. `None` (nothing written) on overflow.
    pub(super) fn slot_add(
        &mut self,
        pass: &mut Pass,
        g: usize,
        slot: usize,
        reset: bool,
        v: i32,
    ) -> Option<i32> {
        pass.touch(Array::Group(g));
        let cell = &mut self.groups[g][slot];
        if reset {
            cell.1 = v;
            return Some(v);
        }
        let sum = cell.1.checked_add(v)?;
        cell.1 = sum;
        Some(sum)
    }

    pub(super) fn slot_read(&mut self, pass: &mut Pass, g: usize, slot: usize) -> i32 {
        pass.touch(Array::Group(g));
        self.groups[g][slot].1
    }

    /// Stage 1 for `Agg`: count contributor `member` for `chunk`.
    pub(super) fn meta_contribute(
        &mut self,
        pass: &mut Pass,
        slot: usize,
        chunk: u32,
        member: u32,
        reach: u32,
    ) -> MetaOutcome {
        pass.touch(Array::Meta);
        let m = &mut self.meta[slot];
        let bit = 1u32 << (member % 32);
        if m.0 == chunk && m.1 > 0 {
            if m.2 & bit != 0 {
                return MetaOutcome { outcome: Contribution::Duplicate, count: m.1 };
            }
            m.2 |= bit;
            m.1 += 1;
            return MetaOutcome { outcome: Contribution::New { reset: false }, count: m.1 };
        }
        // Chunk ids grow; compare with wrap-around. A slot moves on only
        // to a chunk within `reach` of the one it holds (a member is never
        // further ahead than its window): a packet claiming a chunk far
        // ahead would make every real chunk of the slot look stale.
        let ahead = chunk.wrapping_sub(m.0);
        if (ahead as i32) > 0 && ahead > reach {
            return MetaOutcome { outcome: Contribution::TooFar, count: m.1 };
        }
        let newer = m.1 == 0 || (ahead as i32) > 0;
        if newer {
            *m = (chunk, 1, bit);
            return MetaOutcome { outcome: Contribution::New { reset: true }, count: 1 };
        }
        MetaOutcome { outcome: Contribution::Stale, count: m.1 }
    }

    /// Stage 1 for `Vote`: count `member` (test-and-set) or add `weight`
    /// if the slot is `key`'s. Returns whether it counted and the count.
    pub(super) fn meta_vote(
        &mut self,
        pass: &mut Pass,
        slot: usize,
        key: u32,
        member: u32,
        weight: u32,
        mode: CountMode,
    ) -> Option<(bool, u32)> {
        pass.touch(Array::Meta);
        let m = &mut self.meta[slot];
        if m.0 != key {
            return None;
        }
        match mode {
            CountMode::TestAndSet => {
                let bit = 1u32 << (member % 32);
                if m.2 & bit != 0 {
                    return Some((false, m.1));
                }
                m.2 |= bit;
                m.1 += 1;
            }
            CountMode::Accumulate => m.1 = m.1.saturating_add(weight),
        }
        Some((true, m.1))
    }

    /// Last stage for `Agg`: the slot's overflowed positions.
    pub(super) fn overflow_flags(
        &mut self,
        pass: &mut Pass,
        slot: usize,
        reset: bool,
        ovf: u64,
    ) -> u64 {
        pass.touch(Array::Overflow);
        let f = &mut self.overflow[slot];
        if reset {
            *f = ovf;
        } else {
            *f |= ovf;
        }
        *f
    }

    // Control plane.

    pub(super) fn group_swap(&mut self, g: usize, i: usize, tag: u32, value: i32) -> (u32, i32) {
        std::mem::replace(&mut self.groups[g][i], (tag, value))
    }

    pub(super) fn group_read(&self, g: usize, i: usize) -> (u32, i32) {
        self.groups[g][i]
    }

    pub(super) fn meta_read(&self, i: usize) -> (u32, u32, u32, u64) {
        let (tag, count, bits) = self.meta[i];
        (tag, count, bits, self.overflow[i])
    }

    pub(super) fn slot_values(&self, i: usize) -> Vec<i32> {
        self.groups.iter().map(|g| g[i].1).collect()
    }

    pub(super) fn meta_reset(&mut self, i: usize, tag: u32) {
        self.meta[i] = (tag, 0, 0);
        self.overflow[i] = 0;
    }
}
