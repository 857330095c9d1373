//! Synchronous aggregation that goes on when a member is lost
//! (`MemberLoss: continue` in the NetFilter, [`MemberLoss::Continue`]).
//!
//! A step of synchronous aggregation (one `aggregate` call) is cut into
//! chunks, numbered the same way by every member because every member
//! makes the same sequence of calls. A chunk completes where it is
//! counted — a data-plane slot, or the server agent — once every member
//! has contributed; a member returns a step once each of its chunks is
//! complete. When a member's heartbeats stop for a lease, some chunks
//! in flight hold its contribution and others never will. Finishing each
//! chunk with whoever is left would mix members within one step, a sum
//! that is exact over nothing an application can name. So a step is
//! never mixed: its result is the exact sum over *all* the members it
//! started with, or over the members that remain, and the outcome says
//! which ([`crate::client::Outcome::Aggregated`]).
//!
//! # The regroup
//!
//! The server agent is the one place that decides. When the members
//! `L` are lost (a bit each):
//!
//! 1. **Fence.** Each switch of the chain is told to admit no packet of
//!    the lost members' primary flows (`Control::Flows` with an
//!    incarnation none of them uses), and the server agent ignores them
//!    from now on. Nothing the lost members sent can count after this.
//! 2. **Read.** Each switch then reads the metadata of every aggregation
//!    slot of the application (`Control::ReadMeta`), after the fence on
//!    the same switch, so what it reports of the lost members is final.
//! 3. **Decide.** A chunk is *finished by `L`* when every lost member's
//!    contribution is counted for it everywhere it must be: its slot holds
//!    it with their bits on every switch (or the server agent kept its
//!    result, the `copy` policy's backup), and every position that
//!    overflowed has their exact parts here; on the server path, the
//!    chunk here has their bits. Such a chunk completes with the
//!    remaining members' contributions alone (theirs are in) and its
//!    result includes `L`. Every other chunk never completes where it is.
//! 4. **Tell.** The notice ([`Notice`], a [`WideOp::Regroup`] item per
//!    block of 64 chunks) names `L`, the chunks finished by `L`, and a
//!    *shift*. It answers every heartbeat of a member that has not
//!    applied it (a heartbeat carries how many regroups its sender has
//!    applied), so a lost notice goes again.
//!
//! A member applies the notice to every step it has not returned: a step
//! whose chunks are each finished by `L` or already complete at this
//! member keeps going as before and includes `L`; any other step starts
//! over, on the server path, under chunk ids moved up by the shift, and
//! so does every step started later; those sum the remaining members only.
//! Each step in progress is decided by itself: with several steps in flight
//! at once, a later one the lost members had finished may include them
//! while an earlier one does not. One step at a time (the usual training
//! loop), the steps over every member are a prefix.
//!
//! Every member decides the same for each step. A chunk one member has
//! completed was counted with every member, so its slot still holds it
//! (no member moves a slot on before every member has its result) or the
//! server agent holds its backup: it is finished by `L` in the notice
//! too. A member that has not yet made the call of a step that started
//! over makes it later under the shifted ids, as the others did; and a
//! step that started over was returned by no one, since one of its chunks
//! can no longer complete anywhere.
//!
//! The shift is four windows. No member has sent a chunk more than a
//! window past the newest chunk counted anywhere, and none is more than
//! two windows behind it, so shifted ids never meet the ids in flight
//! before, and the server agent tells the two apart by the regroup's
//! *boundary* (newest + window + 1).
//!
//! # What it does not do
//!
//! - A lost member stays out for the application's life: a member that
//!   was only slow, or restarts, learns from the notice that it is out,
//!   and its aggregation calls fail with that reason.
//! - After a regroup, synchronous aggregation runs on the server path
//!   (the data-plane slots count to the application's first member count).
//! - If the data plane dies after members were lost (or during the
//!   regroup), or a switch refuses the fence or the read, synchronous
//!   aggregation fails as under `MemberLoss: fail`: the chunks the lost
//!   members had finished at the data plane cannot be rebuilt without them.
//!
//! [`MemberLoss::Continue`]: crate::plan::MemberLoss::Continue

use std::collections::BTreeMap;

use crate::packet::{Wide, WideOp};

/// Chunks per notice block.
pub const BLOCK: u32 = 64;

/// One item of a regroup notice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The regroup's index (0 for the first).
    pub index: u16,
    /// The members lost (a bit each).
    pub lost: u64,
    /// Added to the chunk ids of every step that starts over and every
    /// later one.
    pub shift: u32,
    /// Blocks of the notice (0: no chunk was finished by the lost members).
    pub blocks: u16,
    /// This block's first chunk.
    pub first: u32,
    /// Chunks of the block the lost members had finished.
    pub bits: u64,
}

impl Notice {
    const KEY_LEN: usize = 22;

    /// The item.
    pub fn to_wide(&self) -> Wide {
        let mut key = Vec::with_capacity(Self::KEY_LEN);
        key.extend_from_slice(&self.index.to_be_bytes());
        key.extend_from_slice(&self.lost.to_be_bytes());
        key.extend_from_slice(&self.shift.to_be_bytes());
        key.extend_from_slice(&self.blocks.to_be_bytes());
        key.extend_from_slice(&self.first.to_be_bytes());
        key.extend_from_slice(&[0, 0]);
        Wide { op: WideOp::Regroup, key, value: self.bits as i64 }
    }

    /// Reads an item; `None` if it is not a well-formed notice.
    pub fn from_wide(w: &Wide) -> Option<Notice> {
        if w.op != WideOp::Regroup || w.key.len() != Self::KEY_LEN {
            return None;
        }
        let k = &w.key;
        let u16_at = |i: usize| u16::from_be_bytes([k[i], k[i + 1]]);
        let u32_at = |i: usize| u32::from_be_bytes([k[i], k[i + 1], k[i + 2], k[i + 3]]);
        let mut lost = [0u8; 8];
        lost.copy_from_slice(&k[2..10]);
        let n = Notice {
            index: u16_at(0),
            lost: u64::from_be_bytes(lost),
            shift: u32_at(10),
            blocks: u16_at(14),
            first: u32_at(16),
            bits: w.value as u64,
        };
        (n.lost != 0 && n.first % BLOCK == 0).then_some(n)
    }
}

/// The chunks finished by the lost members, by block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Finished {
    blocks: BTreeMap<u32, u64>,
}

impl Finished {
    /// Adds chunk `c`.
    pub fn insert(&mut self, c: u32) {
        *self.blocks.entry(c - c % BLOCK).or_insert(0) |= 1u64 << (c % BLOCK);
    }

    /// Adds a block as a notice carries it.
    pub fn insert_block(&mut self, first: u32, bits: u64) {
        *self.blocks.entry(first).or_insert(0) |= bits;
    }

    /// Whether the block from `first` is in.
    pub fn contains_block(&self, first: u32) -> bool {
        self.blocks.contains_key(&first)
    }

    /// Whether chunk `c` is in.
    pub fn contains(&self, c: u32) -> bool {
        self.blocks.get(&(c - c % BLOCK)).is_some_and(|b| b & (1u64 << (c % BLOCK)) != 0)
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether no chunk is in.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The notice items of regroup `index` for `lost` with `shift`.
    pub fn notice(&self, index: u16, lost: u64, shift: u32) -> Vec<Wide> {
        let blocks = self.blocks.len() as u16;
        if self.blocks.is_empty() {
            return vec![Notice { index, lost, shift, blocks: 0, first: 0, bits: 0 }.to_wide()];
        }
        self.blocks
            .iter()
            .map(|(first, bits)| {
                Notice { index, lost, shift, blocks, first: *first, bits: *bits }.to_wide()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_reads_back_as_written_and_a_malformed_one_is_refused() {
        let n = Notice { index: 3, lost: 0b1010, shift: 1024, blocks: 2, first: 128, bits: !0 };
        assert_eq!(Notice::from_wide(&n.to_wide()), Some(n));
        let mut w = n.to_wide();
        w.key.pop();
        assert_eq!(Notice::from_wide(&w), None);
        let odd = Notice { first: 130, ..n };
        assert_eq!(Notice::from_wide(&odd.to_wide()), None);
        let nobody = Notice { lost: 0, ..n };
        assert_eq!(Notice::from_wide(&nobody.to_wide()), None);
    }

    #[test]
    fn finished_chunks_group_into_blocks_of_64() {
        let mut f = Finished::default();
        for c in [0, 63, 64, 200, u32::MAX] {
            f.insert(c);
        }
        assert_eq!(f.len(), 4);
        assert!(f.contains(63) && f.contains(64) && f.contains(u32::MAX));
        assert!(!f.contains(1) && !f.contains(65));
        let items = f.notice(0, 1, 256);
        assert_eq!(items.len(), 4);
        let mut back = Finished::default();
        for i in &items {
            let n = Notice::from_wide(i).expect("a notice item");
            assert_eq!(n.blocks, 4);
            back.insert_block(n.first, n.bits);
        }
        assert_eq!(back, f);
        assert_eq!(Finished::default().notice(1, 2, 3).len(), 1);
    }
}
