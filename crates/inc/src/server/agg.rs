//! Synchronous aggregation on the host: every chunk the data plane did
//! not aggregate (no memory, a malformed packet), the exact sums of
//! overflowed positions (`AggPart` / `AggFix`), and the `copy` policy's
//! backups and releases, with the recovery of a backup from the data plane.

use super::*;

impl ServerAgent {
    /// Synchronous aggregation the data plane did not do: every
    /// contribution of an application without memory, and late ones.
    pub(super) fn on_agg(&mut self, p: &Packet) {
        let h = p.header;
        let Some(member) = self.plan.member_of(h.flow) else { return };
        let chunk = h.aux;
        if h.flags.has(Flags::STALE) {
            // The slot moved on, so every member had the result; only the
            // copy policy keeps a backup to answer a late retransmission.
            if self.backups.contains_key(&chunk) {
                self.send_backup(chunk, h.src);
            }
            return;
        }
        if self.too_old(chunk) {
            return;
        }
        let keep = self.chunks_kept();
        let bit = 1u64 << (member % 64);
        let n = p.pair_items().len();
        self.chunks.entry(chunk).or_insert_with(|| HostChunk {
            sums: vec![0; n],
            members: 0,
            count: 0,
        });
        let threshold = self.agg_threshold(chunk);
        let Some(c) = self.chunks.get_mut(&chunk) else { return };
        if c.members & bit == 0 && c.sums.len() == n {
            c.members |= bit;
            c.count += 1;
            for (s, pair) in c.sums.iter_mut().zip(p.pair_items()) {
                let v = match self.modify {
                    Some((op, param)) => op.apply_wide(i64::from(pair.value), param),
                    None => i64::from(pair.value),
                };
                add_to(s, v);
            }
            self.stats.host_items += n as u64;
            if c.count == threshold {
                self.send_host_result(chunk, None);
            }
        } else if c.count >= threshold {
            self.send_host_result(chunk, Some(h.src));
        }
        let low = self.newest_chunk.wrapping_sub(keep);
        self.chunks.retain(|id, _| id.wrapping_sub(low) as i32 >= 0);
        self.parts.retain(|(id, _), _| id.wrapping_sub(low) as i32 >= 0);
        self.backups.retain(|id, _| id.wrapping_sub(low) as i32 >= 0);
    }

    /// Chunks this agent keeps state for, behind the newest it has seen:
    /// a member is never further behind than its window.
    pub(super) fn chunks_kept(&self) -> u32 {
        (4 * self.agg_chunk_window()).saturating_add(self.regroup_margin())
    }

    /// Notes `chunk` as seen; `true` if it is older than anything kept.
    pub(super) fn too_old(&mut self, chunk: u32) -> bool {
        if chunk.wrapping_sub(self.newest_chunk) as i32 > 0 {
            self.newest_chunk = chunk;
        }
        self.newest_chunk.wrapping_sub(chunk) > self.chunks_kept()
    }

    /// The result of a chunk this agent aggregated: to every member, or to
    /// one that asked again. Sums that do not fit 32 bits are marked
    /// overflowed; the members then ask for them as `AggPart`s and get
    /// the exact sums as `AggFix`.
    pub(super) fn send_host_result(&mut self, chunk: u32, to: Option<u16>) {
        let Some(c) = self.chunks.get(&chunk) else { return };
        let mut mask = 0u64;
        let pairs: Vec<Pair> = c
            .sums
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let value = i32::try_from(*s).unwrap_or_else(|_| {
                    mask |= 1u64 << (i % 64);
                    0
                });
                Pair { key: i as u32, addr: Addr::NONE, value }
            })
            .collect();
        self.send_result(chunk, pairs, mask, to);
    }

    pub(super) fn send_result(&mut self, chunk: u32, pairs: Vec<Pair>, mask: u64, to: Option<u16>) {
        let mut h = self.header(Kind::Result, 0);
        h.aux = chunk;
        h.seq = chunk;
        h.mask = mask;
        if mask != 0 {
            h.flags = Flags(Flags::OVERFLOW);
        }
        let p = Packet::pairs(h, pairs);
        match to {
            Some(dst) => {
                let mut p = p;
                p.header.dst = dst;
                self.send(p);
            }
            None => self.multicast(&p),
        }
    }

    pub(super) fn send_backup(&mut self, chunk: u32, dst: u16) {
        let Some((values, mask)) = self.backups.get(&chunk).cloned() else { return };
        let pairs = values
            .iter()
            .enumerate()
            .map(|(i, v)| Pair { key: i as u32, addr: Addr::NONE, value: *v })
            .collect();
        self.send_result(chunk, pairs, mask, Some(dst));
    }

    /// A member's value of an overflowed aggregation position.
    pub(super) fn on_part(&mut self, h: &Header, item: &Wide) {
        let Some((chunk, pos)) = chunk_position(&item.key) else { return };
        let Some(member) = self.plan.member_of(h.flow) else { return };
        if pos as usize >= self.plan.pairs_per_packet().max(32) || self.too_old(chunk) {
            return;
        }
        // A chunk this agent aggregated itself has the exact sum already.
        let threshold = self.agg_threshold(chunk);
        let host_sum = self
            .chunks
            .get(&chunk)
            .filter(|c| c.count >= threshold)
            .and_then(|c| c.sums.get(pos as usize).copied());
        let sum = match host_sum {
            Some(s) => Some(s),
            None => {
                let bit = 1u64 << (member % 64);
                let v = self.modified(item.value);
                let part =
                    self.parts.entry((chunk, pos)).or_insert(Part { members: 0, count: 0, sum: 0 });
                if part.members & bit == 0 {
                    part.members |= bit;
                    part.count += 1;
                    add_to(&mut part.sum, v);
                    self.stats.host_items += 1;
                    if part.count == threshold {
                        let fix =
                            Wide { op: WideOp::AggFix, key: item.key.clone(), value: part.sum };
                        let mut hd = self.header(Kind::Wide, 0);
                        hd.aux = chunk;
                        self.multicast(&Packet::wide(hd, vec![fix]));
                        if let Some(b) = self.backups.get_mut(&chunk) {
                            b.1 &= !(1u64 << (pos % 64));
                        }
                        return;
                    }
                }
                (part.count >= threshold).then_some(part.sum)
            }
        };
        if let Some(sum) = sum {
            let fix = Wide { op: WideOp::AggFix, key: item.key.clone(), value: sum };
            let mut hd = self.header(Kind::Wide, h.src);
            hd.aux = chunk;
            self.send(Packet::wide(hd, vec![fix]));
        }
    }

    pub(super) fn release_packet(&self, chunk: u32, dst: u16) -> Packet {
        let mut hd = self.header(Kind::Wide, dst);
        hd.aux = chunk;
        Packet::wide(
            hd,
            vec![Wide { op: WideOp::Release, key: chunk.to_be_bytes().to_vec(), value: 0 }],
        )
    }

    /// A member waits for the release of `chunk` (the `copy` policy).
    pub(super) fn on_release_request(&mut self, h: &Header, item: &Wide) {
        let Ok(b) = <[u8; 4]>::try_from(item.key.as_slice()) else { return };
        let chunk = u32::from_be_bytes(b);
        if self.backups.contains_key(&chunk) {
            let p = self.release_packet(chunk, h.src);
            self.send(p);
            return;
        }
        // The data plane's copy of the result has not arrived: read the
        // slot back. Each switch reads it atomically and must still hold
        // the completed chunk (the result may arrive meanwhile, release the
        // slot and let a later chunk take it: then this read is discarded).
        let Some(index) = self.plan.agg_index(chunk) else { return };
        if self.plan.clear == ClearPolicy::Copy && self.recovering.insert(chunk) {
            let switches = self.plan.switches.max(1);
            let r = Recovery {
                left: usize::from(switches),
                ok: true,
                overflow: 0,
                parts: BTreeMap::new(),
            };
            self.recover_reads.insert(chunk, r);
            for s in 0..switches {
                let control = Control::ReadSlot { app: self.plan.app, index };
                self.control(s, control, Pending::RecoverSlot { chunk, switch: s });
            }
        }
    }

    /// Keeps the first backup of a chunk (the data plane's result or a
    /// verified read) and releases the chunk's slot.
    pub(super) fn store_backup(&mut self, chunk: u32, values: Vec<i32>, mask: u64) {
        if self.too_old(chunk) || self.backups.contains_key(&chunk) {
            return;
        }
        self.backups.insert(chunk, (values, mask));
        self.recovering.remove(&chunk);
        let p = self.release_packet(chunk, 0);
        self.multicast(&p);
        let keep = self.chunks_kept();
        let low = self.newest_chunk.wrapping_sub(keep);
        self.backups.retain(|id, _| id.wrapping_sub(low) as i32 >= 0);
    }
}
