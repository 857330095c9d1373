//! The client agent: turns INC calls into packets and makes them reliable.
//!
//! A call (`add`, `get`, `aggregate`, `vote`) becomes packets queued on the
//! member's flows; [`ClientAgent::poll_transmit`] releases them as the
//! windows allow, [`ClientAgent::handle`] takes what comes back, and
//! [`ClientAgent::poll_event`] reports finished calls. Like quinn-proto,
//! the agent owns no socket and no clock: every entry point takes `now`
//! (microseconds) and [`ClientAgent::poll_timeout`] says when to call
//! [`ClientAgent::handle_timeout`].
//!
//! # Reliability
//!
//! Each flow numbers its packets; the packet carries the flip bit
//! `(seq / window) & 1` so the data plane applies a retransmission at most
//! once (its per-flow bit array), and the agent never has a sequence
//! number `window / 2` ahead of its oldest unacknowledged one, so a bit
//! can only be confused with a copy old enough to have been acknowledged.
//! Acknowledgements come back out of order, from the data plane (it
//! applied everything) or from the server agent (it finished the rest).
//! A packet unacknowledged after the retransmission timeout goes again,
//! unchanged.
//!
//! # Congestion
//!
//! Each flow has a congestion window in packets: +1/cwnd per clean
//! acknowledgement, halved at most once per window when an acknowledgement
//! carries ECN or a packet times out (AIMD, as in NetRPC).
//!
//! # Keys and the data plane
//!
//! A key goes through the data plane only once the server agent has given
//! it a cell (a mapping piggybacked on an acknowledgement); before that,
//! and whenever its value does not fit 32 bits, it goes to the server
//! agent as a wide item. Pairs are packed so that no two pairs of a packet
//! use the same register group of a switch.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use crate::membership::{Finished, Notice};
use crate::packet::{Addr, Flags, Header, Kind, Packet, Pair, Wide, WideOp, MAX_KEY};
use crate::plan::{AppPlan, ClearPolicy, MemberLoss};
use crate::Error;

/// Pairs of a packet being packed, and the (switch, group)s they use.
type OpenPacket = (Vec<(Vec<u8>, Pair)>, HashSet<(u8, u8)>);

/// Identifies a call of one agent.
pub type CallId = u64;

/// Tuning of a client agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientTuning {
    /// Smallest retransmission timeout, in microseconds.
    pub rto_min_us: u64,
    /// Initial congestion window, in packets.
    pub init_cwnd: u32,
    /// Largest congestion window, in packets.
    pub max_cwnd: u32,
    /// Aggregation chunks in flight when the application has no data-plane
    /// memory (the server agent aggregates).
    pub host_agg_window: u32,
}

impl Default for ClientTuning {
    fn default() -> Self {
        ClientTuning { rto_min_us: 2_000, init_cwnd: 16, max_cwnd: 64, host_agg_window: 32 }
    }
}

/// A datagram for the I/O layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Node to send it to.
    pub dst: u16,
    /// The datagram.
    pub bytes: Vec<u8>,
}

/// What a finished call produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every `Map.addTo` item is applied.
    Added,
    /// `Map.get`: the value of each key asked for, in order.
    Values(Vec<(Vec<u8>, i64)>),
    /// Synchronous aggregation: the element-wise sums, over the members
    /// `members` names (a bit each: every member, unless the application's
    /// `MemberLoss` is `continue` and some were lost, [`crate::membership`]).
    Aggregated {
        /// The sums.
        sums: Vec<i64>,
        /// The members whose contributions they sum.
        members: u64,
    },
    /// The vote is counted.
    Voted,
    /// [`ClientAgent::leave`]: the server agent has this member's account.
    Left,
    /// The call cannot complete exactly: the data plane died holding
    /// values of the application (see [`ClientAgent::failed`]).
    Failed(String),
}

/// Something the application should hear about.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A call finished.
    Done {
        /// The call.
        call: CallId,
        /// What it produced.
        outcome: Outcome,
    },
    /// The server agent asks members to vote on `instance` for `value`.
    Proposal {
        /// Instance.
        instance: u32,
        /// Proposed value.
        value: i64,
        /// The data-plane slot counting the votes.
        addr: Addr,
    },
    /// An instance reached its quorum with `value`.
    Committed {
        /// Instance.
        instance: u32,
        /// The committed value.
        value: i32,
    },
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Datagrams sent, retransmissions included.
    pub packets: u64,
    /// Bytes sent.
    pub bytes: u64,
    /// Retransmissions.
    pub retransmits: u64,
    /// Acknowledgements that carried ECN.
    pub ecn: u64,
    /// Pairs sent through the data plane.
    pub pairs: u64,
    /// Items sent to the server agent as wide items.
    pub wide: u64,
    /// Datagrams received that did not parse or were not for this agent.
    pub ignored: u64,
    /// Steps in progress at a regroup that went on with the lost members
    /// in (they had finished their part).
    pub steps_kept: u64,
    /// Steps in progress at a regroup that started over without them.
    pub steps_restarted: u64,
}

#[derive(Debug)]
struct Flow {
    id: u16,
    next_seq: u32,
    inflight: BTreeMap<u32, Inflight>,
    cwnd: f64,
    /// No halving again until this sequence number is acknowledged.
    recover_until: u32,
}

#[derive(Debug)]
struct Inflight {
    bytes: Vec<u8>,
    call: CallId,
    sent_at: u64,
    retx: u32,
    sent: Sent,
}

/// What a packet in flight carried, to apply its acknowledgement.
#[derive(Debug)]
enum Sent {
    /// Keys of the pairs, in order, and (logical key, value) of each: the
    /// acknowledgement's mask says which the data plane applied.
    Add(Vec<Vec<u8>>, Vec<(u32, i32)>),
    /// Wide items.
    Wide(Vec<Wide>),
    Vote,
}

/// This member's account of what the data plane applied for it, while it
/// is being given (see [`crate::server`]'s `accounts`).
#[derive(Debug)]
struct Account {
    batches: Vec<Vec<Wide>>,
    acked: Vec<bool>,
    sent_at: u64,
}

impl Account {
    fn complete(&self) -> bool {
        self.acked.iter().all(|a| *a)
    }
}

#[derive(Debug)]
enum Unit {
    Add(Vec<(Vec<u8>, Pair)>),
    Wide(Vec<Wide>),
    Vote(Pair),
}

#[derive(Debug)]
struct Call {
    /// Packets (or chunks) not yet finished.
    remaining: usize,
    kind: CallKind,
}

#[derive(Debug)]
enum CallKind {
    Add,
    Get {
        keys: Vec<Vec<u8>>,
        values: HashMap<Vec<u8>, i64>,
    },
    Agg {
        sums: Vec<i64>,
        /// The members the sums are over.
        members: u64,
        /// The first chunk.
        first: u32,
        /// The contribution, kept under `MemberLoss: continue` (a regroup
        /// may start the step over).
        input: Option<Vec<i32>>,
    },
    Vote,
    Leave,
}

#[derive(Debug)]
struct Chunk {
    call: CallId,
    /// Offset of the chunk's first element in the call's vector.
    offset: usize,
    values: Vec<i32>,
    sent_at: Option<u64>,
    retx: u32,
    got_result: bool,
    /// Positions waiting for an exact sum from the server agent.
    fixes: BTreeSet<u32>,
    fix_deadline: u64,
    /// Counted by the server agent, sent to it directly (after a regroup).
    direct: bool,
}

/// The client agent of one member.
#[derive(Debug)]
pub struct ClientAgent {
    plan: AppPlan,
    member: u16,
    node: u16,
    first_hop: u16,
    tuning: ClientTuning,
    flows: Vec<Flow>,
    rr: usize,
    srtt: Option<(u64, u64)>,
    mappings: HashMap<Vec<u8>, Addr>,
    calls: HashMap<CallId, Call>,
    next_call: CallId,
    queue: VecDeque<(CallId, Unit, bool)>,
    next_chunk: u32,
    chunks: BTreeMap<u32, Chunk>,
    released: BTreeSet<u32>,
    release_asked: u64,
    proposals: BTreeSet<u32>,
    commits: BTreeSet<u32>,
    /// The data plane is gone and everything goes to the server agent.
    fallen_back: bool,
    /// Why every call fails, once the server agent said so.
    failed: Option<String>,
    /// The newest completed aggregation chunks (id, values): after a
    /// fall-back the server agent needs every member's contribution to
    /// the chunks some member had not finished.
    recent: VecDeque<(u32, Vec<i32>)>,
    /// When this member last asked the server agent directly whether the
    /// data plane is gone.
    asked_at: u64,
    /// Heartbeats to the server agent: the next one, and until when to
    /// send them (while aggregating, and a while after).
    next_alive: u64,
    alive_until: u64,
    /// Why synchronous aggregation fails, once a member was lost.
    member_lost: Option<String>,
    /// Members out of synchronous aggregation (regroups applied).
    excluded: u64,
    /// Added to every new chunk id (the regroups' shifts).
    shift: u32,
    /// Regroups applied.
    regroups: u16,
    /// The blocks of the next regroup's notice received so far.
    regroup_blocks: Option<(Notice, Finished, u16)>,
    /// Per logical key, the sum of this member's pairs the data plane
    /// applied (each acknowledgement's mask says which).
    applied: HashMap<u32, i64>,
    /// The plan had a data plane when this member joined.
    had_data_plane: bool,
    /// Each flow's next sequence number when the data plane was lost: the
    /// account is final once everything before is acknowledged.
    fallback_marks: Vec<u32>,
    /// The server agent asked for the account (the data plane is gone).
    account_asked: bool,
    /// The call of [`ClientAgent::leave`], if leaving.
    leaving: Option<CallId>,
    account: Option<Account>,
    /// Commits heard of and not yet acknowledged to the server agent, and
    /// when to send the acknowledgements at the latest.
    commit_acks: Vec<u32>,
    commit_ack_at: Option<u64>,
    out: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: ClientStats,
}

impl ClientAgent {
    /// The agent of member `member` at node `node`.
    pub fn new(plan: AppPlan, member: u16, node: u16, tuning: ClientTuning) -> ClientAgent {
        let first_hop = plan.switch.unwrap_or(plan.server);
        let plan_has_switch = plan.switch.is_some();
        let flows = plan
            .member_flows(member)
            .into_iter()
            .map(|id| Flow {
                id,
                next_seq: 0,
                inflight: BTreeMap::new(),
                cwnd: f64::from(tuning.init_cwnd.max(1)),
                recover_until: 0,
            })
            .collect();
        ClientAgent {
            plan,
            member,
            node,
            first_hop,
            tuning,
            flows,
            rr: 0,
            srtt: None,
            mappings: HashMap::new(),
            calls: HashMap::new(),
            next_call: 1,
            queue: VecDeque::new(),
            next_chunk: 0,
            chunks: BTreeMap::new(),
            released: BTreeSet::new(),
            release_asked: 0,
            proposals: BTreeSet::new(),
            commits: BTreeSet::new(),
            commit_acks: Vec::new(),
            commit_ack_at: None,
            fallen_back: false,
            failed: None,
            recent: VecDeque::new(),
            asked_at: 0,
            next_alive: 0,
            alive_until: 0,
            member_lost: None,
            excluded: 0,
            shift: 0,
            regroups: 0,
            regroup_blocks: None,
            applied: HashMap::new(),
            had_data_plane: plan_has_switch,
            fallback_marks: Vec::new(),
            account_asked: false,
            leaving: None,
            account: None,
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: ClientStats::default(),
        }
    }

    /// The plan this agent follows.
    pub fn plan(&self) -> &AppPlan {
        &self.plan
    }

    /// Counters so far.
    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    /// Keys that currently have a data-plane cell.
    pub fn mapped_keys(&self) -> usize {
        self.mappings.len()
    }

    /// Whether nothing is queued, in flight or unfinished.
    pub fn is_idle(&self) -> bool {
        self.calls.is_empty() && self.queue.is_empty() && self.out.is_empty()
    }

    fn new_call(&mut self, kind: CallKind) -> CallId {
        let id = self.next_call;
        self.next_call += 1;
        match &self.failed {
            // The call ends at once; nothing of it is sent.
            Some(why) => {
                let outcome = Outcome::Failed(why.clone());
                self.events.push_back(Event::Done { call: id, outcome });
            }
            None => {
                self.calls.insert(id, Call { remaining: 0, kind });
            }
        }
        id
    }

    fn enqueue(&mut self, call: CallId, unit: Unit, pinned: bool) {
        let Some(c) = self.calls.get_mut(&call) else { return };
        c.remaining += 1;
        self.queue.push_back((call, unit, pinned));
    }

    /// Why every call of this agent fails, if the server agent said so.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Whether the data plane is gone and this member sends everything to
    /// the server agent.
    pub fn fallen_back(&self) -> bool {
        self.fallen_back
    }

    /// The data plane is gone: everything to the server agent, directly,
    /// from now on. What is in flight goes again, to it, with no data-plane
    /// addresses; so do this member's contributions to the newest chunks
    /// (some member may not have finished them), and it votes again on
    /// what the server agent proposes again (votes the data plane counted
    /// are lost with it).
    fn fall_back(&mut self, now: u64) {
        if self.fallen_back {
            return;
        }
        self.fallen_back = true;
        self.fallback_marks = self.flows.iter().map(|f| f.next_seq).collect();
        self.first_hop = self.plan.server;
        self.plan.switch = None;
        self.plan.switches = 0;
        self.plan.memory = None;
        self.mappings.clear();
        self.proposals.clear();
        for f in &mut self.flows {
            for i in f.inflight.values_mut() {
                i.sent_at = 0;
                i.retx = 0;
            }
        }
        let open: Vec<u32> = self
            .chunks
            .iter()
            .filter(|(_, c)| c.sent_at.is_some() && !c.got_result)
            .map(|(id, _)| *id)
            .collect();
        for c in open {
            if let Some(ch) = self.chunks.get_mut(&c) {
                ch.retx = 0;
                ch.sent_at = Some(now);
            }
            self.send_chunk(c);
        }
        let recent: Vec<(u32, Vec<i32>)> = self.recent.iter().cloned().collect();
        for (c, values) in recent {
            self.send_values(c, &values, false);
        }
    }

    /// Every call fails from now on, with `why`.
    fn fail(&mut self, why: String) {
        if self.failed.is_some() {
            return;
        }
        self.failed = Some(why.clone());
        let calls: Vec<CallId> = self.calls.keys().copied().collect();
        for call in calls {
            self.calls.remove(&call);
            self.events.push_back(Event::Done { call, outcome: Outcome::Failed(why.clone()) });
        }
        self.queue.clear();
        self.chunks.clear();
        self.account = None;
        self.leaving = None;
        for f in &mut self.flows {
            f.inflight.clear();
        }
    }

    fn finish_if_done(&mut self, call: CallId) {
        let done = self.calls.get(&call).is_some_and(|c| c.remaining == 0);
        if !done {
            return;
        }
        let Some(c) = self.calls.remove(&call) else { return };
        let outcome = match c.kind {
            CallKind::Add => Outcome::Added,
            CallKind::Vote => Outcome::Voted,
            CallKind::Leave => Outcome::Left,
            CallKind::Agg { sums, members, .. } => Outcome::Aggregated { sums, members },
            CallKind::Get { keys, values } => Outcome::Values(
                keys.into_iter()
                    .map(|k| {
                        let v = values.get(&k).copied().unwrap_or(0);
                        (k, v)
                    })
                    .collect(),
            ),
        };
        self.events.push_back(Event::Done { call, outcome });
    }

    /// `Map.addTo`: adds each value to its key. Keys are at most
    /// [`MAX_KEY`] bytes (longer ones are an error of the caller).
    pub fn add(&mut self, items: &[(Vec<u8>, i64)]) -> Result<CallId, Error> {
        if let Some((k, _)) = items.iter().find(|(k, _)| k.len() > MAX_KEY) {
            return Err(Error::KeyTooLong { len: k.len() });
        }
        let call = self.new_call(CallKind::Add);
        let per_packet = self.plan.pairs_per_packet();
        // Open packets of pairs, each with the groups it already uses.
        let mut open: Vec<OpenPacket> = Vec::new();
        let mut wide: Vec<Wide> = Vec::new();
        for (key, value) in items {
            let mapped = self.mappings.get(key).copied();
            match (mapped, i32::try_from(*value)) {
                (Some(addr), Ok(v)) => {
                    let pair =
                        Pair { key: crate::keys::logical(key, self.plan.key_bits), addr, value: v };
                    let group = (addr.switch(), addr.group());
                    let slot = open
                        .iter_mut()
                        .find(|(p, used)| p.len() < per_packet && !used.contains(&group));
                    match slot {
                        Some((p, used)) => {
                            used.insert(group);
                            p.push((key.clone(), pair));
                        }
                        None => open.push((vec![(key.clone(), pair)], HashSet::from([group]))),
                    }
                    if open.last().is_some_and(|(p, _)| p.len() == per_packet) {
                        // Full packets go out first (they carry the most).
                        let (p, _) = open.pop().unwrap_or_default();
                        self.enqueue(call, Unit::Add(p), false);
                    }
                }
                _ => {
                    wide.push(Wide { op: WideOp::Add, key: key.clone(), value: *value });
                    if wide.len() == WIDE_ITEMS {
                        self.enqueue(call, Unit::Wide(std::mem::take(&mut wide)), false);
                    }
                }
            }
        }
        for (p, _) in open {
            self.enqueue(call, Unit::Add(p), false);
        }
        if !wide.is_empty() {
            self.enqueue(call, Unit::Wide(wide), false);
        }
        self.finish_if_done(call);
        Ok(call)
    }

    /// `Map.get`: reads the current value of each key (everything added and
    /// acknowledged before this call is included).
    pub fn get(&mut self, keys: &[Vec<u8>]) -> Result<CallId, Error> {
        if let Some(k) = keys.iter().find(|k| k.len() > MAX_KEY) {
            return Err(Error::KeyTooLong { len: k.len() });
        }
        let call = self.new_call(CallKind::Get { keys: keys.to_vec(), values: HashMap::new() });
        for batch in keys.chunks(WIDE_ITEMS) {
            let items =
                batch.iter().map(|k| Wide { op: WideOp::Get, key: k.clone(), value: 0 }).collect();
            self.enqueue(call, Unit::Wide(items), false);
        }
        self.finish_if_done(call);
        Ok(call)
    }

    /// `Map.clear` of the whole map (the server agent copies the data-plane
    /// cells out and zeroes them).
    pub fn clear(&mut self) -> CallId {
        let call = self.new_call(CallKind::Add);
        self.enqueue(
            call,
            Unit::Wide(vec![Wide { op: WideOp::Clear, key: Vec::new(), value: 0 }]),
            false,
        );
        call
    }

    /// Synchronous aggregation: contributes `values` and, once every member
    /// has contributed its vector of the same length, yields the sums.
    /// Members must make the same sequence of `aggregate` calls.
    pub fn aggregate(&mut self, values: &[i32]) -> CallId {
        let everyone = crate::plan::member_mask(self.plan.members);
        let first = self.next_chunk.wrapping_add(self.shift);
        let input = (self.plan.member_loss == MemberLoss::Continue).then(|| values.to_vec());
        let call = self.new_call(CallKind::Agg {
            sums: vec![0; values.len()],
            members: everyone & !self.excluded,
            first,
            input,
        });
        if let Some(why) = self.member_lost.clone() {
            // Every member's contribution is needed, and one is gone.
            if self.calls.remove(&call).is_some() {
                self.events.push_back(Event::Done { call, outcome: Outcome::Failed(why) });
            }
            return call;
        }
        let n = self.add_chunks(call, first, values, self.excluded != 0);
        self.next_chunk = self.next_chunk.wrapping_add(n);
        self.finish_if_done(call);
        call
    }

    /// Cuts `values` into the chunks of `call` from `first` on; returns
    /// how many.
    fn add_chunks(&mut self, call: CallId, first: u32, values: &[i32], direct: bool) -> u32 {
        let per = self.plan.pairs_per_packet();
        let mut n = 0u32;
        for (i, part) in values.chunks(per).enumerate() {
            self.chunks.insert(
                first.wrapping_add(n),
                Chunk {
                    call,
                    offset: i * per,
                    values: part.to_vec(),
                    sent_at: None,
                    retx: 0,
                    got_result: false,
                    fixes: BTreeSet::new(),
                    fix_deadline: 0,
                    direct,
                },
            );
            n += 1;
            if let Some(c) = self.calls.get_mut(&call) {
                c.remaining += 1;
            }
        }
        n
    }

    /// One item of a regroup notice; the regroup applies once every
    /// block of it is in, in order.
    fn on_regroup(&mut self, n: Notice) {
        if n.index != self.regroups
            || self.failed.is_some()
            || self.member_lost.is_some()
            || self.plan.member_loss != MemberLoss::Continue
        {
            return;
        }
        let (head, finished, got) =
            self.regroup_blocks.get_or_insert_with(|| (n, Finished::default(), 0));
        if n.blocks > 0 && !finished.contains_block(n.first) {
            finished.insert_block(n.first, n.bits);
            *got += 1;
        }
        if *got < head.blocks {
            return;
        }
        let Some((head, finished, _)) = self.regroup_blocks.take() else { return };
        self.apply_regroup(head.lost, head.shift, &finished);
    }

    /// Synchronous aggregation goes on without the members `lost`
    /// ([`crate::membership`]): a step whose chunks are each finished by
    /// them (or complete here) goes on and includes them; every other one
    /// starts over on the server path under ids moved up by `shift`, and so
    /// does every later one.
    fn apply_regroup(&mut self, lost: u64, shift: u32, finished: &Finished) {
        self.regroups += 1;
        if lost & (1u64 << (self.member % 64)) != 0 {
            self.lose_aggregation(format!(
                "this member ({}) was lost to the application (its heartbeats stopped for a \
                 lease) and the others aggregate without it",
                self.member
            ));
            return;
        }
        self.excluded |= lost;
        self.shift = self.shift.wrapping_add(shift);
        let mut open: Vec<(u32, CallId)> = self
            .calls
            .iter()
            .filter_map(|(id, c)| match &c.kind {
                CallKind::Agg { first, .. } => Some((*first, *id)),
                _ => None,
            })
            .collect();
        // Newest first: a step's shifted ids may be a later step's current
        // ones, and that step (never sent, so never finished) moves first.
        open.sort_unstable_by(|a, b| b.cmp(a));
        for (_, call) in open {
            let mine: Vec<u32> =
                self.chunks.iter().filter(|(_, c)| c.call == call).map(|(id, _)| *id).collect();
            if mine.iter().all(|c| finished.contains(*c)) {
                self.stats.steps_kept += 1;
                continue;
            }
            self.stats.steps_restarted += 1;
            for c in &mine {
                self.chunks.remove(c);
            }
            let Some(c) = self.calls.get_mut(&call) else { continue };
            c.remaining = 0;
            let CallKind::Agg { sums, members, first, input } = &mut c.kind else { continue };
            sums.iter_mut().for_each(|s| *s = 0);
            *members &= !lost;
            *first = first.wrapping_add(shift);
            let (first, values) = (*first, input.clone().unwrap_or_default());
            self.add_chunks(call, first, &values, true);
            self.finish_if_done(call);
        }
    }

    /// A `CntFwd` vote for `instance` with `value`, counted at `addr` (from
    /// the proposal; [`Addr::NONE`] sends it to the server agent).
    pub fn vote(&mut self, instance: u32, value: i32, addr: Addr) -> CallId {
        let call = self.new_call(CallKind::Vote);
        self.enqueue(call, Unit::Vote(Pair { key: instance, addr, value }), true);
        call
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn rto(&self) -> u64 {
        let base = match self.srtt {
            Some((srtt, var)) => srtt + 4 * var,
            None => self.tuning.rto_min_us * 2,
        };
        base.max(self.tuning.rto_min_us)
    }

    fn backoff(&self, retx: u32) -> u64 {
        self.rto() << retx.min(4)
    }

    /// When [`ClientAgent::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<u64> {
        let mut t: Option<u64> = None;
        let mut at = |x: u64| t = Some(t.map_or(x, |t| t.min(x)));
        for f in &self.flows {
            for i in f.inflight.values() {
                at(i.sent_at + self.backoff(i.retx));
            }
        }
        for c in self.chunks.values() {
            if let Some(s) = c.sent_at.filter(|_| !c.got_result) {
                at(s + self.backoff(c.retx));
            }
            if !c.fixes.is_empty() {
                at(c.fix_deadline);
            }
        }
        if self.waiting_for_release() {
            at(self.release_asked + self.rto() * 2);
        }
        if let Some(a) = self.commit_ack_at {
            at(a);
        }
        if let Some(a) = self.account.as_ref().filter(|a| !a.complete()) {
            at(a.sent_at + self.rto() * 4);
        }
        if !self.chunks.is_empty() || self.next_alive < self.alive_until {
            at(self.next_alive);
        }
        t
    }

    /// While it aggregates (and for [`ALIVE_LINGER_US`] after), a member
    /// tells the server agent it is alive every [`ALIVE_US`]: a member
    /// whose heartbeats stop while the others wait is lost.
    fn heartbeat(&mut self, now: u64) {
        if !self.chunks.is_empty() {
            self.alive_until = now + ALIVE_LINGER_US;
        }
        if now < self.next_alive || now >= self.alive_until {
            return;
        }
        self.next_alive = now + ALIVE_US;
        let mut h = self.header(Kind::Wide, self.plan.server);
        h.flow = self.flows[0].id;
        let alive = Wide { op: WideOp::Alive, key: Vec::new(), value: i64::from(self.regroups) };
        self.transmit(Packet::wide(h, vec![alive]));
    }

    /// A member's lease ran out: every synchronous aggregation in progress
    /// fails now, and every later one at once.
    fn lose_member(&mut self, member: u16) {
        self.lose_aggregation(format!(
            "member {member} of the application stopped (no heartbeat within its lease): \
             a synchronous aggregation needs every member"
        ));
    }

    /// Every synchronous aggregation in progress fails now with `why`, and
    /// every later one at once.
    fn lose_aggregation(&mut self, why: String) {
        if self.member_lost.is_some() {
            return;
        }
        self.member_lost = Some(why.clone());
        let aggs: Vec<CallId> = self
            .calls
            .iter()
            .filter(|(_, c)| matches!(c.kind, CallKind::Agg { .. }))
            .map(|(id, _)| *id)
            .collect();
        for call in aggs {
            self.calls.remove(&call);
            self.events.push_back(Event::Done { call, outcome: Outcome::Failed(why.clone()) });
        }
        self.chunks.clear();
    }

    /// Retransmits whatever timed out by `now`.
    pub fn handle_timeout(&mut self, now: u64) {
        let rto = self.rto();
        for fi in 0..self.flows.len() {
            let mut timed_out = false;
            let retx_at: Vec<u32> = self.flows[fi]
                .inflight
                .iter()
                .filter(|(_, i)| now >= i.sent_at + (rto << i.retx.min(4)))
                .map(|(s, _)| *s)
                .collect();
            for seq in retx_at {
                let f = &mut self.flows[fi];
                if let Some(i) = f.inflight.get_mut(&seq) {
                    i.retx += 1;
                    i.sent_at = now;
                    self.stats.retransmits += 1;
                    self.stats.packets += 1;
                    self.stats.bytes += i.bytes.len() as u64;
                    self.out.push_back(Transmit { dst: self.first_hop, bytes: i.bytes.clone() });
                    timed_out = true;
                }
            }
            if timed_out {
                let f = &mut self.flows[fi];
                if f.recover_until <= f.inflight.keys().next().copied().unwrap_or(f.next_seq) {
                    f.cwnd = (f.cwnd / 2.0).max(1.0);
                    f.recover_until = f.next_seq;
                }
            }
        }
        // Nothing through the switch for a while: ask the server agent
        // directly whether the data plane is gone.
        let stuck =
            self.flows.iter().flat_map(|f| f.inflight.values()).any(|i| i.retx >= FALLBACK_RETX)
                || self.chunks.values().any(|c| c.retx >= FALLBACK_RETX);
        if stuck && !self.fallen_back && now >= self.asked_at + rto * 8 {
            self.asked_at = now;
            let mut h = self.header(Kind::Wide, self.plan.server);
            h.flow = self.flows[0].id;
            let ask =
                Packet::wide(h, vec![Wide { op: WideOp::Fallback, key: Vec::new(), value: 0 }]);
            let bytes = ask.seal(&self.plan.key);
            self.stats.packets += 1;
            self.out.push_back(Transmit { dst: self.plan.server, bytes });
        }
        let chunk_ids: Vec<u32> = self.chunks.keys().copied().collect();
        for c in chunk_ids {
            let (resend, refix) = {
                let ch = &self.chunks[&c];
                let resend = ch
                    .sent_at
                    .is_some_and(|s| !ch.got_result && now >= s + (rto << ch.retx.min(4)));
                (resend, !ch.fixes.is_empty() && now >= ch.fix_deadline)
            };
            if resend {
                if let Some(ch) = self.chunks.get_mut(&c) {
                    ch.retx += 1;
                    ch.sent_at = Some(now);
                }
                self.stats.retransmits += 1;
                self.send_chunk(c);
            }
            if refix {
                self.send_parts(c, now);
            }
        }
        if self.commit_ack_at.is_some_and(|a| now >= a) {
            self.send_commit_acks();
        }
        self.heartbeat(now);
        let rto = self.rto();
        if self.account.as_ref().is_some_and(|a| !a.complete() && now >= a.sent_at + rto * 4) {
            self.resend_account(now);
        }
        self.maybe_give_account(now);
        if self.waiting_for_release() && now >= self.release_asked + rto * 2 {
            self.release_asked = now;
            if let Some(c) = self.blocking_release() {
                let item = Wide { op: WideOp::Release, key: c.to_be_bytes().to_vec(), value: 0 };
                let mut h = self.header(Kind::Wide, self.plan.server);
                h.flow = self.flows[0].id;
                self.transmit(Packet::wide(h, vec![item]));
            }
        }
    }

    /// Tells the server agent which commits this member heard of.
    fn send_commit_acks(&mut self) {
        self.commit_ack_at = None;
        let acks = std::mem::take(&mut self.commit_acks);
        for batch in acks.chunks(WIDE_ITEMS) {
            let items = batch
                .iter()
                .map(|i| Wide { op: WideOp::CommitAck, key: i.to_be_bytes().to_vec(), value: 0 })
                .collect();
            let mut h = self.header(Kind::Wide, self.plan.server);
            h.flow = self.flows[0].id;
            self.transmit(Packet::wide(h, items));
        }
    }

    /// Queues an unsequenced packet (it goes through the first hop like
    /// everything else; the data plane routes on the header).
    fn transmit(&mut self, p: Packet) {
        let bytes = p.seal(&self.plan.key);
        self.stats.packets += 1;
        self.stats.bytes += bytes.len() as u64;
        self.out.push_back(Transmit { dst: self.first_hop, bytes });
    }

    /// The next datagram to send, if any.
    pub fn poll_transmit(&mut self, now: u64) -> Option<Transmit> {
        if self.out.is_empty() {
            self.fill(now);
        }
        self.out.pop_front()
    }

    fn agg_window(&self) -> u32 {
        self.plan.agg_slots().map_or(self.tuning.host_agg_window, |(_, w)| w)
    }

    /// The oldest chunk whose result has not arrived.
    fn oldest_open_chunk(&self) -> Option<u32> {
        self.chunks.iter().find(|(_, c)| !c.got_result).map(|(id, _)| *id)
    }

    /// Under `copy`, chunk `c` may use its slot only after the server
    /// agent released chunk `c - S`.
    fn slot_free(&self, c: u32) -> bool {
        match (self.plan.clear, self.plan.agg_slots()) {
            (ClearPolicy::Copy, Some((slots, _))) => {
                c < slots || self.released.contains(&(c - slots))
            }
            _ => true,
        }
    }

    fn blocking_release(&self) -> Option<u32> {
        let (slots, _) = self.plan.agg_slots()?;
        self.chunks
            .iter()
            .find(|(id, c)| c.sent_at.is_none() && !c.direct && !self.slot_free(**id))
            .map(|(id, _)| id - slots)
    }

    fn waiting_for_release(&self) -> bool {
        self.plan.clear == ClearPolicy::Copy
            && self.plan.memory.is_some()
            && self.blocking_release().is_some()
    }

    fn fill(&mut self, now: u64) {
        // Aggregation chunks, oldest first, within the chunk window.
        let window = self.agg_window();
        let oldest = self.oldest_open_chunk();
        let ready: Vec<u32> = self
            .chunks
            .iter()
            .filter(|(_, c)| c.sent_at.is_none())
            .map(|(id, _)| *id)
            .take_while(|id| oldest.is_none_or(|o| id.wrapping_sub(o) < window))
            .collect();
        for c in ready {
            let direct = self.chunks.get(&c).is_some_and(|ch| ch.direct);
            if !direct && !self.slot_free(c) {
                if self.release_asked == 0 {
                    self.release_asked = now;
                }
                break;
            }
            if let Some(ch) = self.chunks.get_mut(&c) {
                ch.sent_at = Some(now);
            }
            if let Some(slots) = self.plan.agg_slots().map(|s| s.0).filter(|_| !direct) {
                if c >= slots {
                    self.released.remove(&(c - slots));
                }
            }
            self.send_chunk(c);
        }
        // Notices no waiting chunk can use any more.
        if let (Some(first), Some((slots, _))) = (self.chunks.keys().next(), self.plan.agg_slots())
        {
            let floor = first.saturating_sub(slots);
            self.released.retain(|c| *c >= floor);
        }
        // Everything else, while a flow has room.
        while let Some((call, unit, pinned)) = self.queue.pop_front() {
            let Some(fi) = self.flow_with_room(pinned) else {
                self.queue.push_front((call, unit, pinned));
                break;
            };
            self.send_unit(fi, call, unit, now);
        }
    }

    fn flow_with_room(&mut self, pinned: bool) -> Option<usize> {
        let limit = (self.plan.window / 2).saturating_sub(1).max(1);
        let room = |f: &Flow| {
            let oldest = f.inflight.keys().next().copied().unwrap_or(f.next_seq);
            (f.inflight.len() as f64) < f.cwnd.floor().max(1.0)
                && f.next_seq.wrapping_sub(oldest) < limit
        };
        if pinned {
            return room(&self.flows[0]).then_some(0);
        }
        let n = self.flows.len();
        for k in 0..n {
            let fi = (self.rr + k) % n;
            if room(&self.flows[fi]) {
                self.rr = (fi + 1) % n;
                return Some(fi);
            }
        }
        None
    }

    fn send_unit(&mut self, fi: usize, call: CallId, unit: Unit, now: u64) {
        let (kind, dst) = match &unit {
            Unit::Add(_) => (Kind::Add, self.plan.server),
            Unit::Wide(_) => (Kind::Wide, self.plan.server),
            Unit::Vote(_) => (Kind::Vote, self.plan.server),
        };
        let mut h = self.header(kind, dst);
        let f = &mut self.flows[fi];
        let seq = f.next_seq;
        f.next_seq = f.next_seq.wrapping_add(1);
        h.flow = f.id;
        h.seq = seq;
        h.ext |= Header::SEQUENCED;
        h.aux = f.inflight.keys().next().copied().unwrap_or(seq);
        if (seq / self.plan.window) & 1 == 1 {
            h.flags = Flags(Flags::FLIP);
        }
        let (packet, sent) = match unit {
            Unit::Add(pairs) => {
                self.stats.pairs += pairs.len() as u64;
                let (keys, pairs): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
                let values = pairs.iter().map(|p| (p.key, p.value)).collect();
                (Packet::pairs(h, pairs), Sent::Add(keys, values))
            }
            Unit::Wide(items) => {
                self.stats.wide += items.len() as u64;
                (Packet::wide(h, items.clone()), Sent::Wide(items))
            }
            Unit::Vote(pair) => {
                h.aux = pair.key;
                (Packet::pairs(h, vec![pair]), Sent::Vote)
            }
        };
        let bytes = packet.seal(&self.plan.key);
        self.stats.packets += 1;
        self.stats.bytes += bytes.len() as u64;
        self.out.push_back(Transmit { dst: self.first_hop, bytes: bytes.clone() });
        self.flows[fi].inflight.insert(seq, Inflight { bytes, call, sent_at: now, retx: 0, sent });
    }

    fn send_chunk(&mut self, c: u32) {
        let Some(ch) = self.chunks.get(&c) else { return };
        let (values, direct) = (ch.values.clone(), ch.direct);
        self.send_values(c, &values, direct);
    }

    /// Sends this member's contribution `values` to chunk `c`: through the
    /// data plane, or `direct` to the server agent.
    fn send_values(&mut self, c: u32, values: &[i32], direct: bool) {
        let index = if direct { None } else { self.plan.agg_index(c) };
        let groups = usize::from(self.plan.groups.max(1));
        let per = self.plan.pairs_per_packet() as u32;
        // Over a chain every switch must see the packet's positions (it
        // counts the contribution), so a short last chunk is padded with
        // zeros to a whole chunk.
        let padded =
            if self.plan.switches > 1 && index.is_some() { per as usize } else { values.len() };
        let pairs: Vec<Pair> = values
            .iter()
            .copied()
            .chain(std::iter::repeat(0))
            .take(padded.max(values.len()))
            .enumerate()
            .map(|(i, v)| Pair {
                key: c.wrapping_mul(per).wrapping_add(i as u32),
                addr: match index {
                    Some(ix) => Addr::new((i / groups) as u8, (i % groups) as u8, ix as u16),
                    None => Addr::NONE,
                },
                value: v,
            })
            .collect();
        let mut h = self.header(Kind::Agg, self.plan.server);
        h.flow = self.flows[0].id;
        h.seq = c;
        h.aux = c;
        self.stats.pairs += pairs.len() as u64;
        let p = Packet::pairs(h, pairs);
        if direct {
            let bytes = p.seal(&self.plan.key);
            self.stats.packets += 1;
            self.stats.bytes += bytes.len() as u64;
            self.out.push_back(Transmit { dst: self.plan.server, bytes });
        } else {
            self.transmit(p);
        }
    }

    /// Sends this member's values of the positions of chunk `c` that
    /// overflowed on the data plane, for the server agent to add exactly.
    fn send_parts(&mut self, c: u32, now: u64) {
        let rto = self.rto();
        let Some(ch) = self.chunks.get_mut(&c) else { return };
        ch.fix_deadline = now + rto * 2;
        let items: Vec<Wide> = ch
            .fixes
            .iter()
            .map(|pos| {
                let mut key = c.to_be_bytes().to_vec();
                key.extend_from_slice(&pos.to_be_bytes());
                let v = ch.values.get(*pos as usize).copied().unwrap_or(0);
                Wide { op: WideOp::AggPart, key, value: i64::from(v) }
            })
            .collect();
        for batch in items.chunks(WIDE_ITEMS) {
            let mut h = self.header(Kind::Wide, self.plan.server);
            h.flow = self.flows[0].id;
            h.aux = c;
            self.stats.wide += batch.len() as u64;
            self.transmit(Packet::wide(h, batch.to_vec()));
        }
    }

    /// Takes one received datagram.
    pub fn handle(&mut self, now: u64, datagram: &[u8]) {
        let Ok(p) = Packet::open(datagram, &self.plan.key) else {
            self.stats.ignored += 1;
            return;
        };
        if p.header.app != self.plan.app
            || p.header.dst != self.node
            || (p.header.kind == Kind::Ack && p.header.incarnation() != self.plan.incarnation)
        {
            self.stats.ignored += 1;
            return;
        }

        match p.header.kind {
            Kind::Ack => self.on_ack(now, &p),
            Kind::Result => self.on_result(now, &p),
            Kind::Wide => self.on_wide(now, &p),
            _ => self.stats.ignored += 1,
        }
    }

    /// Removes `(flow, seq)` from flight; returns what it carried.
    fn acked(&mut self, now: u64, flow: u16, seq: u32, ecn: bool) -> Option<(CallId, Sent)> {
        let fi = self.flows.iter().position(|f| f.id == flow)?;
        let f = &mut self.flows[fi];
        let i = f.inflight.remove(&seq)?;
        if ecn {
            self.stats.ecn += 1;
            if seq >= f.recover_until {
                f.cwnd = (f.cwnd / 2.0).max(1.0);
                f.recover_until = f.next_seq;
            }
        } else {
            f.cwnd = (f.cwnd + 1.0 / f.cwnd).min(f64::from(self.tuning.max_cwnd));
        }
        if i.retx == 0 {
            let sample = now.saturating_sub(i.sent_at);
            self.srtt = Some(match self.srtt {
                None => (sample, sample / 2),
                Some((s, v)) => ((7 * s + sample) / 8, (3 * v + s.abs_diff(sample)) / 4),
            });
        }
        Some((i.call, i.sent))
    }

    fn unit_done(&mut self, call: CallId) {
        if let Some(c) = self.calls.get_mut(&call) {
            c.remaining = c.remaining.saturating_sub(1);
        }
        self.finish_if_done(call);
    }

    fn on_ack(&mut self, now: u64, p: &Packet) {
        let h = &p.header;
        if self.fallen_back && h.ext & Header::BY_SWITCH != 0 {
            // A late acknowledgement from the dead data plane: the packet
            // went again to the server agent, which may have added all of
            // it, so only its acknowledgement says what counts as applied
            // (the account would otherwise count a pair twice).
            return;
        }
        let Some((call, sent)) = self.acked(now, h.flow, h.seq, h.flags.has(Flags::ECN)) else {
            return;
        };
        // Mappings: (logical address, cell or NONE) for keys of this packet.
        let bits = self.plan.key_bits;
        if let Sent::Add(_, values) = &sent {
            for (i, (l, v)) in values.iter().enumerate().take(64) {
                if h.mask & (1u64 << i) != 0 {
                    let a = self.applied.entry(*l).or_insert(0);
                    *a = a.saturating_add(i64::from(*v));
                }
            }
        }
        let keys: Vec<&Vec<u8>> = match &sent {
            Sent::Add(keys, _) => keys.iter().collect(),
            Sent::Wide(items) => {
                items.iter().filter(|i| i.op == WideOp::Add).map(|i| &i.key).collect()
            }
            Sent::Vote => Vec::new(),
        };
        for m in p.pair_items() {
            let mut matching = keys.iter().filter(|k| crate::keys::logical(k, bits) == m.key);
            let (Some(k), None) = (matching.next(), matching.next()) else { continue };
            if m.addr.is_none() {
                self.mappings.remove(*k);
            } else {
                self.mappings.insert((*k).clone(), m.addr);
            }
        }
        self.unit_done(call);
        self.maybe_give_account(now);
    }

    fn on_result(&mut self, now: u64, p: &Packet) {
        let h = &p.header;
        if h.flags.has(Flags::QUORUM) {
            // One commit from the data plane; several when the server agent
            // sends notices again. Each is acknowledged (again, if the
            // acknowledgement was lost), in batches.
            for pair in p.pair_items() {
                if remember(&mut self.commits, pair.key) {
                    self.events
                        .push_back(Event::Committed { instance: pair.key, value: pair.value });
                }
                if self.commit_acks.len() < REMEMBERED {
                    self.commit_acks.push(pair.key);
                }
            }
            if self.commit_acks.len() >= WIDE_ITEMS {
                self.send_commit_acks();
            } else if self.commit_ack_at.is_none() {
                self.commit_ack_at = Some(now + COMMIT_ACK_DELAY_US);
            }
            return;
        }
        let c = h.aux;
        let Some(ch) = self.chunks.get_mut(&c) else { return };
        // A result read back from the data plane may carry a whole chunk's
        // positions for a shorter last chunk: take the prefix.
        if ch.got_result || p.pair_items().len() < ch.values.len() {
            return;
        }
        ch.got_result = true;
        let call = ch.call;
        let offset = ch.offset;
        let mask = if h.flags.has(Flags::OVERFLOW) { h.mask } else { 0 };
        if let Some(CallKind::Agg { sums, .. }) = self.calls.get_mut(&call).map(|c| &mut c.kind) {
            for (i, pair) in p.pair_items().iter().take(ch.values.len()).enumerate() {
                if let Some(s) = sums.get_mut(offset + i) {
                    *s = i64::from(pair.value);
                }
            }
        }
        for i in 0..ch.values.len().min(64) {
            if mask & (1u64 << i) != 0 {
                ch.fixes.insert(i as u32);
            }
        }
        if ch.fixes.is_empty() {
            self.chunk_done(c);
        } else {
            self.send_parts(c, now);
        }
    }

    fn chunk_done(&mut self, c: u32) {
        if let Some(ch) = self.chunks.remove(&c) {
            self.unit_done(ch.call);
            let keep = self.agg_window().max(64) as usize * 2;
            self.recent.push_back((c, ch.values));
            while self.recent.len() > keep {
                self.recent.pop_front();
            }
        }
    }

    fn on_wide(&mut self, now: u64, p: &Packet) {
        let h = &p.header;
        let items = p.wide_items();
        if items.iter().any(|i| i.op == WideOp::Value) {
            // The answer to a get doubles as its acknowledgement (of this
            // incarnation's packet only).
            if h.incarnation() != self.plan.incarnation {
                self.stats.ignored += 1;
                return;
            }
            let Some((call, _)) = self.acked(now, h.flow, h.seq, h.flags.has(Flags::ECN)) else {
                return;
            };
            if let Some(CallKind::Get { values, .. }) =
                self.calls.get_mut(&call).map(|c| &mut c.kind)
            {
                for i in items.iter().filter(|i| i.op == WideOp::Value) {
                    values.insert(i.key.clone(), i.value);
                }
            }
            self.unit_done(call);
            return;
        }
        for i in items {
            match i.op {
                WideOp::AggFix => {
                    let Some((c, pos)) = chunk_position(&i.key) else { continue };
                    let Some(ch) = self.chunks.get_mut(&c) else { continue };
                    if !ch.fixes.remove(&pos) {
                        continue;
                    }
                    let (call, at) = (ch.call, ch.offset + pos as usize);
                    let left = ch.fixes.is_empty() && ch.got_result;
                    if let Some(CallKind::Agg { sums, .. }) =
                        self.calls.get_mut(&call).map(|c| &mut c.kind)
                    {
                        if let Some(s) = sums.get_mut(at) {
                            *s = i.value;
                        }
                    }
                    if left {
                        self.chunk_done(c);
                    }
                }
                WideOp::Release => {
                    if let Ok(b) = <[u8; 4]>::try_from(i.key.as_slice()) {
                        self.released.insert(u32::from_be_bytes(b));
                        self.release_asked = 0;
                    }
                }
                WideOp::Alive if h.src == self.plan.server => {
                    if let Ok(b) = <[u8; 2]>::try_from(i.key.as_slice()) {
                        self.lose_member(u16::from_be_bytes(b));
                    }
                }
                WideOp::Regroup if h.src == self.plan.server => {
                    if let Some(n) = Notice::from_wide(i) {
                        self.on_regroup(n);
                    }
                }
                WideOp::AggResend if h.src == self.plan.server => {
                    let Ok(b) = <[u8; 4]>::try_from(i.key.as_slice()) else { continue };
                    let c = u32::from_be_bytes(b);
                    if self.chunks.get(&c).is_some_and(|ch| ch.sent_at.is_some()) {
                        self.send_chunk(c);
                    } else if let Some((_, values)) = self.recent.iter().find(|(id, _)| *id == c) {
                        let values = values.clone();
                        self.send_values(c, &values, false);
                    }
                }
                WideOp::Fallback if h.src == self.plan.server => match i.value {
                    1 => self.fail(
                        "the data plane failed holding values of this application that cannot \
                         be recovered, so no result would be exact"
                            .into(),
                    ),
                    code => {
                        self.fall_back(now);
                        if code == 2 {
                            self.account_asked = true;
                            self.resend_account(now);
                            self.maybe_give_account(now);
                        }
                    }
                },
                WideOp::Account if h.src == self.plan.server => {
                    let done = match &mut self.account {
                        Some(a) => {
                            if let Some(b) =
                                usize::try_from(i.value).ok().and_then(|ix| a.acked.get_mut(ix))
                            {
                                *b = true;
                            }
                            a.complete()
                        }
                        None => false,
                    };
                    if done {
                        if let Some(call) = self.leaving.take() {
                            self.unit_done(call);
                        }
                    }
                }
                WideOp::Propose => {
                    let Some((instance, addr)) = proposal_key(&i.key) else { continue };
                    if remember(&mut self.proposals, instance) {
                        self.events.push_back(Event::Proposal { instance, value: i.value, addr });
                    }
                }
                _ => {}
            }
        }
    }

    /// Leaves: once every call before is acknowledged, gives the server
    /// agent this member's account of what the data plane applied for it
    /// and completes when the server agent has it ([`Outcome::Left`]).
    /// Call it last, when the member is done: if the data plane dies
    /// later, the server agent rebuilds the map from the accounts, and a
    /// member that went without one makes the rebuild fail. Completes at
    /// once if the application never had a data plane.
    pub fn leave(&mut self) -> CallId {
        let call = self.new_call(CallKind::Leave);
        if self.failed.is_some() {
            return call;
        }
        if !self.had_data_plane || self.account.as_ref().is_some_and(Account::complete) {
            self.finish_if_done(call);
            return call;
        }
        if let Some(c) = self.calls.get_mut(&call) {
            c.remaining = 1;
        }
        self.leaving = Some(call);
        // Sent now if nothing is in flight (the next timeout repeats it).
        self.maybe_give_account(0);
        call
    }

    /// Gives the account if it is asked for (leaving, or the data plane is
    /// gone) and final: nothing sent before may still be applied.
    fn maybe_give_account(&mut self, now: u64) {
        // Checked first: this runs on every acknowledgement.
        if (self.leaving.is_none() && !self.account_asked)
            || self.account.is_some()
            || !self.had_data_plane
            || self.failed.is_some()
        {
            return;
        }
        // Final once no pair it sent can still be applied by the data
        // plane: after the loss, none sent before it is unacknowledged;
        // before, none is queued or unacknowledged. Only `Map.addTo` pairs
        // count: a get in flight must not hold the account up (the server
        // agent answers no get until it has every account).
        let is_add = |i: &Inflight| matches!(i.sent, Sent::Add(..));
        let settled = if self.fallen_back {
            self.flows.iter().zip(&self.fallback_marks).all(|(f, mark)| {
                f.inflight.iter().all(|(s, i)| !is_add(i) || s.wrapping_sub(*mark) as i32 >= 0)
            })
        } else {
            !self.queue.iter().any(|(_, u, _)| matches!(u, Unit::Add(_)))
                && self.flows.iter().all(|f| f.inflight.values().all(|i| !is_add(i)))
        };
        if !settled {
            return;
        }
        let mut items: Vec<Wide> = self
            .applied
            .iter()
            .map(|(l, v)| Wide { op: WideOp::Account, key: l.to_be_bytes().to_vec(), value: *v })
            .collect();
        items.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        let mut batches: Vec<Vec<Wide>> = items.chunks(WIDE_ITEMS).map(<[Wide]>::to_vec).collect();
        if batches.is_empty() {
            // Nothing applied: one batch saying so (an empty key is no key).
            batches.push(vec![Wide { op: WideOp::Account, key: Vec::new(), value: 0 }]);
        }
        let acked = vec![false; batches.len()];
        self.account = Some(Account { batches, acked, sent_at: now });
        self.resend_account(now);
    }

    /// Sends the batches of the account the server agent has not
    /// acknowledged.
    fn resend_account(&mut self, now: u64) {
        let Some(a) = &mut self.account else { return };
        a.sent_at = now;
        let count = a.batches.len().min(usize::from(u16::MAX)) as u32;
        let send: Vec<(u32, Vec<Wide>)> = a
            .batches
            .iter()
            .zip(&a.acked)
            .enumerate()
            .take(usize::from(u16::MAX))
            .filter(|(_, (_, acked))| !**acked)
            .map(|(i, (b, _))| (i as u32, b.clone()))
            .collect();
        for (i, batch) in send {
            let mut h = self.header(Kind::Wide, self.plan.server);
            h.flow = self.flows[0].id;
            h.aux = (count << 16) | i;
            self.stats.wide += batch.len() as u64;
            self.transmit(Packet::wide(h, batch));
        }
    }

    /// Which member this agent is.
    pub fn member(&self) -> u16 {
        self.member
    }

    /// A header from this member (its incarnation stamped) to `dst`.
    fn header(&self, kind: Kind, dst: u16) -> Header {
        let mut h = Header::new(kind, self.plan.app, self.node, dst);
        h.set_incarnation(self.plan.incarnation);
        h
    }
}

/// Instances a member remembers having seen (proposals, commits): the
/// newest; an older one seen again is reported again, harmlessly.
const REMEMBERED: usize = 65_536;

/// Records `instance`; `true` if it is new. Keeps the newest
/// [`REMEMBERED`] so a flood of numbers cannot grow the set.
fn remember(set: &mut BTreeSet<u32>, instance: u32) -> bool {
    let new = set.insert(instance);
    while set.len() > REMEMBERED {
        set.pop_first();
    }
    new
}

/// How often an aggregating member tells the server agent it is alive, µs.
pub const ALIVE_US: u64 = 200_000;

/// How long a member keeps sending heartbeats after its last aggregation
/// (the others may still wait for the last result), µs.
const ALIVE_LINGER_US: u64 = 3_000_000;

/// Retransmissions of one packet after which a member asks the server
/// agent directly whether the data plane is gone.
const FALLBACK_RETX: u32 = 4;

/// How long a member holds commit acknowledgements to batch them, µs.
const COMMIT_ACK_DELAY_US: u64 = 1_000;

/// Wide items per packet (keeps a packet of the longest keys near 2.4 KB).
const WIDE_ITEMS: usize = 32;

/// `(chunk, position)` of an `AggPart` / `AggFix` key.
pub(crate) fn chunk_position(key: &[u8]) -> Option<(u32, u32)> {
    let b: [u8; 8] = key.try_into().ok()?;
    Some((
        u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
    ))
}

/// `(instance, slot address)` of a `Propose` key.
pub(crate) fn proposal_key(key: &[u8]) -> Option<(u32, Addr)> {
    let b: [u8; 8] = key.try_into().ok()?;
    Some((
        u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        Addr(u32::from_be_bytes([b[4], b[5], b[6], b[7]])),
    ))
}
