//! The server agent's side of a regroup: synchronous aggregation going on
//! without the members whose lease ran out (`MemberLoss: continue`; the
//! protocol and why it never mixes members within a step are in
//! [`crate::membership`]).

use super::*;
use crate::membership::Finished;
use crate::plan::MemberLoss;

/// Slot indices per metadata read.
const READ_BATCH: u32 = 256;

/// Who synchronous aggregation still counts on.
#[derive(Debug, Default)]
pub(super) struct Membership {
    /// Regroups done, in order.
    epochs: Vec<Epoch>,
    /// The regroup in progress.
    regroup: Option<Regroup>,
    /// Members lost while a regroup was in progress: the next one.
    waiting: u64,
    /// Members out: every regroup's, and the one in progress.
    out: u64,
    /// Why synchronous aggregation cannot go on; members then hear of the
    /// loss as under `MemberLoss: fail`.
    failed: Option<String>,
}

#[derive(Debug)]
struct Epoch {
    lost: u64,
    /// Chunks from here on are counted without `lost`.
    boundary: u32,
    shift: u32,
    finished: Finished,
}

#[derive(Debug)]
struct Regroup {
    lost: u64,
    /// Control requests not yet answered.
    left: usize,
    /// Per chunk a slot holds: switches where every lost member's bit is
    /// set, and the positions that overflowed on any switch.
    slots: HashMap<u32, (u8, u64)>,
    /// The newest chunk a slot holds.
    high: Option<u32>,
}

/// What a regroup's control reply completes.
#[derive(Debug)]
pub(super) enum RegroupStep {
    Fence,
    Read,
}

/// `a` is after `b` in wrapping chunk order.
fn after(a: u32, b: u32) -> bool {
    a.wrapping_sub(b) as i32 > 0
}

impl ServerAgent {
    /// Members out of synchronous aggregation (a bit each).
    pub fn members_out(&self) -> u64 {
        self.membership.out
    }

    /// Regroups done.
    pub fn regroups(&self) -> usize {
        self.membership.epochs.len()
    }

    /// Why synchronous aggregation stopped after a member was lost, under
    /// `MemberLoss: continue` (`None` while it goes on).
    pub fn regroup_failure(&self) -> Option<&str> {
        self.membership.failed.as_deref()
    }

    /// Contributions that complete `chunk`: the application's members,
    /// less those lost in every regroup whose boundary it is past.
    pub(super) fn agg_threshold(&self, chunk: u32) -> u32 {
        let gone: u32 = self
            .membership
            .epochs
            .iter()
            .filter(|e| !after(e.boundary, chunk))
            .map(|e| e.lost.count_ones())
            .sum();
        self.plan.threshold.saturating_sub(gone)
    }

    /// Chunks kept behind the newest: a member is at most two windows
    /// behind the newest chunk, and each regroup moves ids up by four.
    pub(super) fn regroup_margin(&self) -> u32 {
        let w = self.agg_chunk_window();
        let n = self.membership.epochs.len().min(64) as u32;
        w.saturating_mul(8).saturating_mul(n)
    }

    /// The members' chunk window as the server agent bounds it.
    pub(super) fn agg_chunk_window(&self) -> u32 {
        self.plan.agg_slots().map_or(64, |s| s.1.max(64))
    }

    /// Members `newly` lost their lease. Under `MemberLoss: continue`
    /// synchronous aggregation regroups without them; otherwise (or when it
    /// cannot) the members hear of the loss and their aggregations fail.
    pub(super) fn on_members_lost(&mut self, newly: u64) {
        if self.plan.member_loss != MemberLoss::Continue || self.membership.failed.is_some() {
            return;
        }
        if self.fallback.is_some() {
            self.fail_regroup(
                "a member was lost after the data plane: the chunks it had finished there \
                 cannot be counted again without it"
                    .into(),
            );
            return;
        }
        if self.membership.regroup.is_some() {
            self.membership.waiting |= newly;
            return;
        }
        self.start_regroup(newly);
    }

    fn start_regroup(&mut self, lost: u64) {
        self.membership.out |= lost;
        let mut r = Regroup { lost, left: 0, slots: HashMap::new(), high: None };
        let on_switch = self.plan.switch.is_some() && self.plan.switches > 0;
        if let (Some((base, len)), true) = (self.plan.memory, on_switch) {
            let flows: Vec<u16> = (0..self.plan.members)
                .filter(|m| lost & (1u64 << (m % 64)) != 0)
                .map(|m| self.plan.flow_base + m)
                .collect();
            for s in 0..self.plan.switches {
                for f in &flows {
                    let m = usize::from(f - self.plan.flow_base);
                    // No lost member has this incarnation: the data plane
                    // admits none of their packets from now on.
                    let incarnation = self.incarnations[m].wrapping_add(128);
                    let control =
                        Control::Flows { app: self.plan.app, flows: vec![*f], incarnation };
                    self.control(s, control, Pending::Regroup(RegroupStep::Fence));
                    r.left += 1;
                }
                let mut at = 0;
                while at < len {
                    let n = (len - at).min(READ_BATCH);
                    let indices = (base + at..base + at + n).collect();
                    self.control(
                        s,
                        Control::ReadMeta { app: self.plan.app, indices },
                        Pending::Regroup(RegroupStep::Read),
                    );
                    r.left += 1;
                    at += n;
                }
            }
        }
        self.membership.regroup = Some(r);
        if self.membership.regroup.as_ref().is_some_and(|r| r.left == 0) {
            self.finish_regroup();
        }
    }

    /// One reply of the regroup in progress.
    pub(super) fn on_regroup_reply(&mut self, step: RegroupStep, reply: ControlReply) {
        let Some(r) = self.membership.regroup.as_mut() else { return };
        r.left = r.left.saturating_sub(1);
        match (step, reply) {
            (RegroupStep::Fence, ControlReply::Done) => {}
            (RegroupStep::Read, ControlReply::Meta(slots)) => {
                let lost = r.lost;
                for (tag, count, bits, overflow) in slots {
                    if count == 0 {
                        continue;
                    }
                    if r.high.is_none_or(|h| after(tag, h)) {
                        r.high = Some(tag);
                    }
                    let e = r.slots.entry(tag).or_insert((0, 0));
                    if u64::from(bits) & lost == lost {
                        e.0 += 1;
                    }
                    e.1 |= overflow;
                }
            }
            (_, other) => {
                let why = match other {
                    ControlReply::Refused(why) => why,
                    other => format!("unexpected answer {other:?}"),
                };
                self.fail_regroup(format!(
                    "the data plane could not be asked what the lost member had finished ({why})"
                ));
                return;
            }
        }
        if r.left == 0 {
            self.finish_regroup();
        }
    }

    /// Every lost member's exact part of each position of `mask` of
    /// `chunk` is here (or the chunk was counted here in full).
    fn parts_in(&self, chunk: u32, mask: u64, lost: u64) -> bool {
        let threshold = self.agg_threshold(chunk);
        if self.chunks.get(&chunk).is_some_and(|c| c.count >= threshold) {
            return true;
        }
        (0..64u32)
            .filter(|p| mask & (1u64 << p) != 0)
            .all(|p| self.parts.get(&(chunk, p)).is_some_and(|part| part.members & lost == lost))
    }

    fn finish_regroup(&mut self) {
        let Some(r) = self.membership.regroup.take() else { return };
        let lost = r.lost;
        let switches = self.plan.switches.max(1);
        let mut finished = Finished::default();
        for (chunk, (with_lost, overflow)) in &r.slots {
            if *with_lost == switches && self.parts_in(*chunk, *overflow, lost) {
                finished.insert(*chunk);
            }
        }
        for (chunk, (_, mask)) in &self.backups {
            if self.parts_in(*chunk, *mask, lost) {
                finished.insert(*chunk);
            }
        }
        for (chunk, c) in &self.chunks {
            if c.members & lost == lost {
                finished.insert(*chunk);
            }
        }
        let mut high = self.newest_chunk;
        if let Some(h) = r.high.filter(|h| after(*h, high)) {
            high = h;
        }
        let w = self.agg_chunk_window();
        let epoch = Epoch {
            lost,
            boundary: high.wrapping_add(w).wrapping_add(1),
            shift: w.saturating_mul(4),
            finished,
        };
        self.membership.epochs.push(epoch);
        let waiting = std::mem::take(&mut self.membership.waiting) & !self.membership.out;
        if waiting != 0 {
            self.start_regroup(waiting);
        }
    }

    fn fail_regroup(&mut self, why: String) {
        self.membership.regroup = None;
        self.membership.failed.get_or_insert(why);
    }

    /// The data plane is gone: after a member was lost, synchronous
    /// aggregation cannot go on (see [`crate::membership`]).
    pub(super) fn regroup_on_data_plane_lost(&mut self) {
        if self.membership.out != 0 {
            self.fail_regroup(
                "the data plane died after a member was lost: the chunks the lost member had \
                 finished there cannot be counted again without it"
                    .into(),
            );
        }
    }

    /// Sends `dst` the notices of every regroup from `from` on.
    pub(super) fn send_regroups(&mut self, dst: u16, from: u16) {
        let mut packets = Vec::new();
        for (i, e) in self.membership.epochs.iter().enumerate().skip(usize::from(from)) {
            let items = e.finished.notice(i as u16, e.lost, e.shift);
            for batch in items.chunks(32) {
                packets.push(batch.to_vec());
            }
        }
        for items in packets {
            let hd = self.header(Kind::Wide, dst);
            self.send(Packet::wide(hd, items));
        }
    }

    /// Whether the member's packets still count for synchronous
    /// aggregation; a member that is out only hears, when it asks or sends
    /// a heartbeat, that it is out.
    pub(super) fn admit_member(&mut self, m: u16, h: &Header, items: &[Wide]) -> bool {
        if self.membership.out & (1u64 << (m % 64)) == 0 {
            return true;
        }
        if items.iter().any(|i| matches!(i.op, WideOp::Alive | WideOp::Fallback)) {
            if self.membership.failed.is_some() {
                self.tell_lost(h.src);
            } else {
                self.send_regroups(h.src, 0);
            }
        }
        false
    }

    /// A heartbeat under `MemberLoss: continue`: the regroups its sender
    /// has not applied (it says how many it has), or, when aggregation
    /// could not go on, the loss.
    pub(super) fn answer_heartbeat(&mut self, dst: u16, applied: i64) {
        if self.membership.failed.is_some() {
            self.tell_lost(dst);
            return;
        }
        let applied = u16::try_from(applied).unwrap_or(0);
        if usize::from(applied) < self.membership.epochs.len() {
            self.send_regroups(dst, applied);
        }
    }
}
