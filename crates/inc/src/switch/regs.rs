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
            Array::Group(g) => 4 + g,
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

impl Registers {
    pub(super) fn new(c: &SwitchConfig) -> Registers {
        let cells = c.registers as usize;
        let flow_slots = usize::from(c.flows) * c.window as usize;
        Registers {
            window: c.window as usize,
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
        let flows = usize::from(e.flow_base) * self.window
            ..(usize::from(e.flow_base) + usize::from(e.flows)) * self.window;
        for s in flows {
            self.seen[s / 64] |= 1 << (s % 64);
            self.applied[s] = 0;
        }
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
        // Chunk ids grow; compare with wrap-around.
        let newer = m.1 == 0 || (chunk.wrapping_sub(m.0) as i32) > 0;
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
