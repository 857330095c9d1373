//! The server agent: the software implementation of every primitive, and
//! the owner of the application's data-plane memory.
//!
//! Whatever the data plane does not finish reaches the server agent:
//! pairs it did not apply (no cell, a stale mapping, an overflow, a group
//! conflict), every packet of an application without data-plane memory,
//! and the host-only traffic (wide items). The agent completes them
//! exactly, in 64-bit arithmetic, and acknowledges the sender. A key's
//! value is its host part plus, if it has a cell, the cell's value.
//!
//! It also decides which keys live on the data plane ([`CachePolicy`]),
//! tells clients (address mappings piggybacked on acknowledgements), and
//! moves values between host and cells through the control plane
//! ([`Control`] requests the I/O layer delivers to the switch, in order,
//! with [`ServerAgent::handle_control`] taking the replies in the same
//! order).
//!
//! Sans-IO like the client agent: `now` is an argument, datagrams and
//! control requests are polled.
//!
//! This file has the state, the packet paths of `Map.addTo`, `Map.get`
//! and `Map.clear`, and the control-plane plumbing; `cache` decides
//! which keys get cells, `agg` does synchronous aggregation on the host
//! and keeps the `copy` backups, `votes` counts `CntFwd` votes,
//! `accounts` rebuilds the map from the members' accounts when the data
//! plane dies holding values.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::client::{chunk_position, Transmit};
use crate::keys::logical;
use crate::packet::{Addr, Flags, Header, Kind, Packet, Pair, Wide, WideOp};
use crate::plan::{AppPlan, CachePolicy, ClearPolicy, MemberLoss};
use crate::switch::{Control, ControlReply, ModifyOp};

mod accounts;
mod agg;

pub use accounts::ACCOUNT_WAIT_US;
mod cache;
mod regroup;
mod votes;

/// Tuning of a server agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerTuning {
    /// Cache period of [`CachePolicy::PeriodicCounting`], microseconds.
    pub period_us: u64,
    /// Most cells moved per period.
    pub moves_per_period: usize,
    /// How long an open vote instance waits before the agent re-proposes
    /// and reads its slot, microseconds; doubled at each re-proposal of the
    /// instance (up to 64 times).
    pub vote_timeout_us: u64,
    /// Vote instances open at first; more are queued. The window grows by
    /// one per commit and halves, at most once per window of commits, when
    /// a commit arrives marked with congestion (ECN) or an instance has to
    /// be proposed again (AIMD, the signal the clients' flows use).
    pub vote_window: u32,
    /// The largest vote window.
    pub max_vote_window: u32,
    /// A member that aggregates sends heartbeats; one silent this long
    /// while another still sends them is lost, and the members' synchronous
    /// aggregations fail, µs.
    pub lease_us: u64,
}

impl Default for ServerTuning {
    fn default() -> Self {
        ServerTuning {
            period_us: 20_000,
            moves_per_period: 256,
            vote_timeout_us: 20_000,
            vote_window: 32,
            max_vote_window: 1024,
            lease_us: 1_500_000,
        }
    }
}

/// A control request for switch `chain_index` of the chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlRequest {
    /// Matches the reply.
    pub token: u64,
    /// Which switch.
    pub chain_index: u8,
    /// The request.
    pub control: Control,
}

/// What the server agent tells its application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerEvent {
    /// A vote instance reached its quorum.
    Committed {
        /// Instance.
        instance: u32,
        /// The value voted for.
        value: i32,
        /// Counted by the data plane (`true`) or by this agent.
        in_network: bool,
    },
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Datagrams received.
    pub packets: u64,
    /// Bytes received.
    pub bytes: u64,
    /// Pairs and wide items this agent applied in software.
    pub host_items: u64,
    /// Datagrams sent.
    pub sent: u64,
    /// Datagrams that did not parse or were not for this application.
    pub ignored: u64,
    /// Pairs naming a logical address nobody registered (dropped).
    pub unknown_keys: u64,
    /// Keys kept on the host because another key has their logical address.
    pub collisions: u64,
    /// Keys given a cell.
    pub installs: u64,
    /// Keys moved off the data plane.
    pub evictions: u64,
    /// Control requests issued.
    pub control: u64,
}

#[derive(Debug)]
struct KeyState {
    key: Vec<u8>,
    cell: Option<Addr>,
    installing: bool,
}

/// Which sequence numbers of a flow were processed, each with the mask
/// of pairs the data plane had applied when it first arrived: the
/// acknowledgement of a retransmission (which may come straight from the
/// member, carrying no mask) repeats it, so the member's account counts
/// exactly what the data plane applied ([`accounts`]).
#[derive(Debug, Default)]
struct Seen {
    floor: u32,
    done: BTreeMap<u32, u64>,
}

impl Seen {
    /// `Ok` if `seq` is new (and records it with `mask`), else the mask
    /// recorded the first time. `floor`: every sequence number below it was
    /// acknowledged to the sender.
    fn first_time(&mut self, seq: u32, floor: u32, cap: usize, mask: u64) -> Result<(), u64> {
        if floor > self.floor {
            self.floor = floor;
            self.done = self.done.split_off(&floor);
        }
        if seq < self.floor {
            return Err(0);
        }
        if let Some(m) = self.done.get(&seq) {
            return Err(*m);
        }
        self.done.insert(seq, mask);
        while self.done.len() > cap {
            self.done.pop_first();
        }
        Ok(())
    }
}

#[derive(Debug)]
struct HostChunk {
    sums: Vec<i64>,
    members: u64,
    count: u32,
}

#[derive(Debug)]
struct Part {
    members: u64,
    count: u32,
    sum: i64,
}

#[derive(Debug)]
struct Instance {
    value: i64,
    addr: Addr,
    voters: u64,
    count: u32,
    committed: bool,
    proposed_at: u64,
    ready: bool,
    /// Times proposed again (the timeout doubles with each).
    tries: u32,
}

/// The agent's side of a fall-back to the server path.
#[derive(Debug)]
struct Fallback {
    /// The data plane held values of the application that cannot be
    /// rebuilt ([`accounts`]): every call fails.
    failed: bool,
    /// Members heard from directly since (they know).
    heard: u64,
    /// When to tell the others again.
    next_at: u64,
    /// When to ask members again for contributions missing here.
    pull_at: u64,
}

/// How often a server agent tells members that have not sent to it
/// directly that the data plane is gone, µs.
const FALLBACK_NOTICE_US: u64 = 100_000;

/// The slot reads of one chunk's recovery.
#[derive(Debug)]
struct Recovery {
    /// Switches still to answer.
    left: usize,
    /// Every answer so far held the completed chunk.
    ok: bool,
    /// Overflow flags of every answer.
    overflow: u64,
    /// Values by switch.
    parts: BTreeMap<u8, Vec<i32>>,
}

/// A `Map.get` waiting for cell reads.
#[derive(Debug)]
struct GetState {
    reply: Header,
    keys: Vec<Vec<u8>>,
    /// The cell read for each key.
    at: HashMap<Vec<u8>, Addr>,
    /// What each cell read returned (tag, value).
    cells: HashMap<Addr, (u32, i32)>,
    waiting: usize,
}

/// A `Map.clear` waiting for its cells to be copied out and zeroed.
#[derive(Debug)]
struct ClearState {
    reply: Header,
    copied: HashMap<Vec<u8>, i64>,
    waiting: usize,
}

/// Adds in the host's 64 bits. A sum beyond the `int64` range of the
/// IEDTs saturates there (it cannot be represented in a reply).
fn add_to(total: &mut i64, v: i64) {
    *total = total.saturating_add(v);
}

/// What a control reply completes.
#[derive(Debug)]
enum Pending {
    Install { l: u32, addr: Addr },
    Evict { addr: Addr, l: u32, reused: bool },
    GetRead { get: u64, addrs: Vec<Addr> },
    ClearCells { clear: u64, addrs: Vec<Addr> },
    PeriodRead { addrs: Vec<Addr> },
    OpenVote { instance: u32 },
    VoteCheck { instance: u32 },
    RecoverSlot { chunk: u32, switch: u8 },
    Regroup(regroup::RegroupStep),
    Ignore,
}

/// The server agent of one application instance.
#[derive(Debug)]
pub struct ServerAgent {
    plan: AppPlan,
    node: u16,
    tuning: ServerTuning,
    modify: Option<(ModifyOp, i32)>,
    keys: HashMap<u32, KeyState>,
    host: HashMap<Vec<u8>, i64>,
    free_cells: Vec<Addr>,
    resident: HashMap<Addr, u32>,
    heat: HashMap<u32, u64>,
    last_cell_values: HashMap<Addr, i32>,
    /// Cache periods so far, and the period each key was last installed in.
    period: u64,
    installed_in: HashMap<u32, u64>,
    next_period: u64,
    flows: HashMap<u16, Seen>,
    /// Each member's newest incarnation seen.
    incarnations: Vec<u8>,
    /// Members that sent this agent anything.
    seen_members: Vec<bool>,
    /// Per key, what evictions moved from cells into `host`.
    folded: HashMap<Vec<u8>, i64>,
    /// The members' accounts of what the data plane applied ([`accounts`]).
    accounts: accounts::Accounts,
    /// Why the application failed when the data plane was lost.
    fallback_failure: Option<String>,
    chunks: BTreeMap<u32, HostChunk>,
    parts: BTreeMap<(u32, u32), Part>,
    backups: BTreeMap<u32, (Vec<i32>, u64)>,
    recovering: BTreeSet<u32>,
    recover_reads: HashMap<u32, Recovery>,
    newest_chunk: u32,
    instances: BTreeMap<u32, Instance>,
    /// Proposals waiting for room in the vote window.
    queued: VecDeque<(u32, i64)>,
    queued_ids: std::collections::HashSet<u32>,
    /// Vote instances allowed open at once (AIMD).
    vote_window: f64,
    /// Commits since the window last halved.
    since_halving: u32,
    /// Commit notices some member has not acknowledged.
    notices: BTreeMap<u32, votes::Notice>,
    /// Set once the data plane is gone ([`ServerAgent::data_plane_lost`]).
    fallback: Option<Fallback>,
    /// When each member's heartbeat last arrived (0: never).
    alive: Vec<u64>,
    /// Members whose lease ran out.
    lost: u64,
    /// Who synchronous aggregation still counts on ([`regroup`]).
    membership: regroup::Membership,
    /// The first heartbeat of any member: a member never heard from is
    /// lost two leases after it.
    active_since: Option<u64>,
    member_nodes: Vec<Option<u16>>,
    free_vote_slots: Vec<u32>,
    snapshot: HashMap<Vec<u8>, i64>,
    gets: HashMap<u64, GetState>,
    evicting: HashMap<u32, Addr>,
    clears: HashMap<u64, ClearState>,
    control_out: VecDeque<ControlRequest>,
    /// What each request's reply completes (several for a merged request).
    pending: HashMap<u64, Vec<Pending>>,
    next_token: u64,
    /// Ids of gets and clears in progress.
    next_op: u64,
    out: VecDeque<Transmit>,
    events: VecDeque<ServerEvent>,
    stats: ServerStats,
}

impl ServerAgent {
    /// The agent at `node` for `plan`. `modify` is the filter's
    /// `Stream.modify` (the data plane applies the same).
    pub fn new(
        plan: AppPlan,
        node: u16,
        modify: Option<(ModifyOp, i32)>,
        tuning: ServerTuning,
    ) -> ServerAgent {
        let mut free_cells = Vec::new();
        let mut free_vote_slots = Vec::new();
        if let Some((base, len)) = plan.memory {
            if plan.cache != CachePolicy::Hashing {
                for i in (base..base + len).rev() {
                    for s in (0..plan.switches).rev() {
                        for g in (0..plan.groups).rev() {
                            free_cells.push(Addr::new(s, g, i as u16));
                        }
                    }
                }
            }
            free_vote_slots = (base..base + len).rev().collect();
        }
        let member_nodes = vec![None; usize::from(plan.members)];
        let members = usize::from(plan.members);
        ServerAgent {
            plan,
            node,
            tuning,
            modify,
            keys: HashMap::new(),
            host: HashMap::new(),
            free_cells,
            resident: HashMap::new(),
            heat: HashMap::new(),
            last_cell_values: HashMap::new(),
            period: 0,
            installed_in: HashMap::new(),
            next_period: 0,
            flows: HashMap::new(),
            incarnations: vec![0; members],
            seen_members: vec![false; members],
            folded: HashMap::new(),
            accounts: Default::default(),
            fallback_failure: None,
            chunks: BTreeMap::new(),
            parts: BTreeMap::new(),
            backups: BTreeMap::new(),
            recovering: BTreeSet::new(),
            recover_reads: HashMap::new(),
            newest_chunk: 0,
            instances: BTreeMap::new(),
            queued: VecDeque::new(),
            queued_ids: std::collections::HashSet::new(),
            vote_window: f64::from(tuning.vote_window.max(1)),
            since_halving: 0,
            notices: BTreeMap::new(),
            fallback: None,
            alive: vec![0; members],
            lost: 0,
            membership: regroup::Membership::default(),
            active_since: None,
            member_nodes,
            free_vote_slots,
            snapshot: HashMap::new(),
            gets: HashMap::new(),
            evicting: HashMap::new(),
            clears: HashMap::new(),
            control_out: VecDeque::new(),
            pending: HashMap::new(),
            next_token: 1,
            next_op: 1,
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: ServerStats::default(),
        }
    }

    /// The plan this agent follows.
    pub fn plan(&self) -> &AppPlan {
        &self.plan
    }

    /// Counters so far.
    pub fn stats(&self) -> ServerStats {
        self.stats
    }

    /// Keys with a data-plane cell.
    pub fn resident_keys(&self) -> usize {
        self.resident.len()
    }

    /// The values the last `Map.clear` copied out (the `copy` backup).
    pub fn snapshot(&self) -> &HashMap<Vec<u8>, i64> {
        &self.snapshot
    }

    /// The next datagram to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop_front()
    }

    /// The next control request to deliver.
    pub fn poll_control(&mut self) -> Option<ControlRequest> {
        self.control_out.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.events.pop_front()
    }

    /// When [`ServerAgent::handle_timeout`] should next run.
    pub fn poll_timeout(&self) -> Option<u64> {
        let mut t = None;
        if self.plan.cache == CachePolicy::PeriodicCounting && !self.heat.is_empty() {
            t = Some(self.next_period);
        }
        for i in self.instances.values().filter(|i| !i.committed && i.ready) {
            let at = i.proposed_at + self.vote_timeout(i.tries);
            t = Some(t.map_or(at, |t: u64| t.min(at)));
        }
        if let Some(at) = self.next_notice() {
            t = Some(t.map_or(at, |t: u64| t.min(at)));
        }
        if let Some(fb) = self.fallback.as_ref().filter(|f| {
            let everyone = (1u64 << self.plan.members.min(63)) - 1;
            f.heard & everyone != everyone
        }) {
            t = Some(t.map_or(fb.next_at, |t: u64| t.min(fb.next_at)));
        }
        if let Some(at) = self.accounts.waiting_until {
            t = Some(t.map_or(at, |t: u64| t.min(at)));
        }
        if let Some(fb) = self.fallback.as_ref().filter(|_| self.incomplete_chunks()) {
            t = Some(t.map_or(fb.pull_at, |t: u64| t.min(fb.pull_at)));
        }
        // The earliest lease of a member not yet lost to run out before
        // every member falls silent (no one aggregates then: no one is lost).
        let lease = self.tuning.lease_us;
        let last = self.alive.iter().copied().max().unwrap_or(0);
        let first = (0..self.alive.len())
            .filter(|m| self.lost & (1u64 << (m % 64)) == 0)
            .map(|m| self.lease_end(m))
            .min();
        if let Some(first) = first.filter(|f| *f < last + lease) {
            t = Some(t.map_or(first, |t: u64| t.min(first)));
        }
        t
    }

    /// Queues a control request. Swaps, slot resets and reads that follow
    /// one another to the same switch travel as one request (a control
    /// round trip costs far more than a register access); the order of
    /// everything stays the order of the calls.
    fn control(&mut self, chain_index: u8, control: Control, pending: Pending) {
        let control = match control {
            Control::Swap { app, addr, tag, value } => {
                Control::SwapMany { app, cells: vec![(addr, tag, value)] }
            }
            c => c,
        };
        if let Some(last) = self.control_out.back_mut().filter(|l| l.chain_index == chain_index) {
            let merged = match (&mut last.control, &control) {
                (Control::SwapMany { cells: a, .. }, Control::SwapMany { cells: b, .. }) => {
                    a.extend_from_slice(b);
                    true
                }
                (Control::ResetMeta { slots: a, .. }, Control::ResetMeta { slots: b, .. }) => {
                    a.extend_from_slice(b);
                    true
                }
                (Control::Read { addrs: a, .. }, Control::Read { addrs: b, .. }) => {
                    a.extend_from_slice(b);
                    true
                }
                _ => false,
            };
            if merged {
                self.pending.entry(last.token).or_default().push(pending);
                return;
            }
        }
        let token = self.next_token;
        self.next_token += 1;
        self.stats.control += 1;
        self.pending.insert(token, vec![pending]);
        self.control_out.push_back(ControlRequest { token, chain_index, control });
    }

    fn send(&mut self, p: Packet) {
        self.stats.sent += 1;
        let dst = self.plan.switch.unwrap_or(p.header.dst);
        self.out.push_back(Transmit { dst, bytes: p.seal(&self.plan.key) });
    }

    fn header(&self, kind: Kind, dst: u16) -> Header {
        Header::new(kind, self.plan.app, self.node, dst)
    }

    /// Tells the agent where members are (the controller knows; the agent
    /// also learns it from every packet a member sends).
    pub fn set_member_nodes(&mut self, nodes: &[u16]) {
        for (m, n) in nodes.iter().enumerate() {
            if let Some(slot) = self.member_nodes.get_mut(m) {
                *slot = Some(*n);
            }
        }
    }

    /// Tells the agent where member `m` is.
    pub fn set_member_node(&mut self, m: u16, node: u16) {
        if let Some(slot) = self.member_nodes.get_mut(usize::from(m)) {
            *slot = Some(node);
        }
    }

    /// Members whose node is known.
    pub fn known_members(&self) -> usize {
        self.member_nodes.iter().flatten().count()
    }

    /// Sends `p` to every member whose node is known.
    fn multicast(&mut self, p: &Packet) {
        let nodes: Vec<u16> = self.member_nodes.iter().flatten().copied().collect();
        let mut p = p.clone();
        for n in nodes {
            p.header.dst = n;
            self.send(p.clone());
        }
    }

    fn modified(&self, v: i64) -> i64 {
        match self.modify {
            Some((op, p)) => op.apply_wide(v, p),
            None => v,
        }
    }

    /// Takes one datagram.
    pub fn handle(&mut self, now: u64, datagram: &[u8]) {
        self.stats.packets += 1;
        self.stats.bytes += datagram.len() as u64;
        let Ok(p) = Packet::open(datagram, &self.plan.key) else {
            self.stats.ignored += 1;
            return;
        };
        let h = p.header;
        let member = self.plan.member_of(h.flow);
        if h.app != self.plan.app
            || h.dst != self.node
            || (h.kind != Kind::Result && member.is_none())
        {
            self.stats.ignored += 1;
            return;
        }
        if let (Some(m), Kind::Add | Kind::Agg | Kind::Vote | Kind::Wide) = (member, h.kind) {
            if !self.admit_incarnation(m, h.incarnation()) {
                self.stats.ignored += 1;
                return;
            }
            if !self.admit_member(m, &h, p.wide_items()) {
                self.stats.ignored += 1;
                return;
            }
            if let Some(fb) = &mut self.fallback {
                if h.hops() == 0 {
                    fb.heard |= 1u64 << (m % 64);
                    self.member_nodes[usize::from(m)] = Some(h.src);
                }
                if p.wide_items().iter().any(|i| i.op == WideOp::Fallback) {
                    let code = self.fallback_code((m, h.incarnation()));
                    self.tell_fallback(h.src, code);
                    return;
                }
                if self.fallback.as_ref().is_some_and(|f| f.failed) {
                    // Nothing is answered: the members' calls fail.
                    return;
                }
            }
            if !h.flags.has(Flags::FORWARDED) || h.kind != Kind::Agg {
                self.member_nodes[usize::from(m)] = Some(h.src);
            }
        }
        match h.kind {
            Kind::Add => self.on_add(&p),
            Kind::Agg => self.on_agg(&p),
            Kind::Vote => self.on_vote(now, &p),
            Kind::Wide => self.on_wide(now, &p),
            Kind::Result => self.on_result(now, &p),
            Kind::Ack => self.stats.ignored += 1,
        }
    }

    /// The data plane is gone (its control connection closed: the switch
    /// died). Everything continues on this agent, which can compute every
    /// primitive, and the members are told to send to it directly
    /// (repeatedly, until each has). What the data plane counted and had
    /// not passed on is recovered from the members: they send their
    /// contributions to the newest aggregation chunks again, and vote again
    /// on the instances proposed again here. What the cells *held* is
    /// rebuilt from the members' accounts ([`accounts`]): the map is not
    /// read until every member has given its own, and if that cannot be
    /// (a member died, or restarted without giving the account of its
    /// earlier life, or a `Map.clear` ran while keys had cells) every call
    /// of the application fails from then on with the reason
    /// ([`ServerAgent::fallback_failure`]) instead of returning a value
    /// that could be short. Returns whether the application goes on.
    pub fn data_plane_lost(&mut self, now: u64) -> bool {
        if self.fallback.is_some() {
            return self.fallback.as_ref().is_some_and(|f| !f.failed);
        }
        self.regroup_on_data_plane_lost();
        let held = !self.resident.is_empty() || !self.evicting.is_empty();
        self.plan.switch = None;
        self.plan.switches = 0;
        self.plan.memory = None;
        self.free_cells.clear();
        self.free_vote_slots.clear();
        self.resident.clear();
        for k in self.keys.values_mut() {
            k.cell = None;
            k.installing = false;
        }
        self.fallback = Some(Fallback { failed: false, heard: 0, next_at: now, pull_at: now });
        // Control requests in flight will never be answered.
        self.control_out.clear();
        let pending: Vec<(u64, Vec<Pending>)> = self.pending.drain().collect();
        for (_, list) in pending {
            for p in list {
                self.complete(now, p, ControlReply::Refused("the data plane is gone".into()));
            }
        }
        // Every open vote instance again, counted here.
        let open: Vec<u32> =
            self.instances.iter().filter(|(_, i)| !i.committed).map(|(id, _)| *id).collect();
        for id in open {
            if let Some(inst) = self.instances.get_mut(&id) {
                inst.addr = Addr::NONE;
                inst.ready = true;
                inst.proposed_at = now;
                inst.tries = 0;
            }
        }
        if held {
            self.start_rebuild(now);
        }
        self.notify_fallback(now);
        self.fallback.as_ref().is_some_and(|f| !f.failed)
    }

    /// Why the application failed when the data plane was lost, if it did.
    pub fn fallback_failure(&self) -> Option<&str> {
        self.fallback_failure.as_deref()
    }

    /// What a member is told of the fall-back: 0 send to me directly, 1
    /// every call fails, 2 send to me directly and give me your account.
    fn fallback_code(&self, life: (u16, u8)) -> i64 {
        match &self.fallback {
            Some(f) if f.failed => 1,
            Some(_) if self.accounts.waiting_until.is_some() && !self.accounts.given(life) => 2,
            _ => 0,
        }
    }

    /// A member's heartbeat. While some member is lost, the answer tells
    /// it which (the heartbeats of a member that still aggregates carry the
    /// news until it knows).
    fn on_alive(&mut self, now: u64, h: &Header, applied: i64) {
        let Some(m) = self.plan.member_of(h.flow) else { return };
        if let Some(t) = self.alive.get_mut(usize::from(m)) {
            *t = now;
        }
        self.active_since.get_or_insert(now);
        self.member_nodes[usize::from(m)] = Some(h.src);
        if self.plan.member_loss == MemberLoss::Continue {
            self.answer_heartbeat(h.src, applied);
        } else {
            self.tell_lost(h.src);
        }
    }

    /// Tells `dst` of a lost member, if any: its aggregations fail.
    fn tell_lost(&mut self, dst: u16) {
        if let Some(lost) = (0..self.plan.members).find(|l| self.lost & (1u64 << (l % 64)) != 0) {
            let mut hd = self.header(Kind::Wide, dst);
            hd.aux = u32::from(lost);
            let item = Wide { op: WideOp::Alive, key: lost.to_be_bytes().to_vec(), value: 0 };
            self.send(Packet::wide(hd, vec![item]));
        }
    }

    /// Leases: a member that sent heartbeats and stopped while another
    /// still sends them is lost.
    fn check_leases(&mut self, now: u64) {
        let lease = self.tuning.lease_us;
        let active = self.alive.iter().any(|t| *t != 0 && now.saturating_sub(*t) < lease);
        if !active {
            return;
        }
        let before = self.lost;
        for m in 0..self.alive.len() {
            if now >= self.lease_end(m) {
                self.lost |= 1u64 << (m % 64);
            }
        }
        if self.lost != before {
            self.on_members_lost(self.lost & !before);
        }
    }

    /// When member `m`'s lease runs out (a member never heard from has two
    /// leases from the first heartbeat of any member).
    fn lease_end(&self, m: usize) -> u64 {
        let lease = self.tuning.lease_us;
        match (self.alive[m], self.active_since) {
            (0, Some(first)) => first + 2 * lease,
            (0, None) => u64::MAX,
            (t, _) => t + lease,
        }
    }

    /// Members whose lease ran out (a bit per member).
    pub fn lost_members(&self) -> u64 {
        self.lost
    }

    fn incomplete_chunks(&self) -> bool {
        self.chunks.iter().any(|(id, c)| c.count < self.agg_threshold(*id))
    }

    /// After a fall-back, asks the members whose contributions to an
    /// unfinished chunk are missing here to send them again (what the data
    /// plane had counted is gone with it; a member that finished the chunk
    /// keeps its newest contributions for this).
    fn pull_missing(&mut self, now: u64) {
        let Some(fb) = &mut self.fallback else { return };
        if fb.failed || now < fb.pull_at {
            return;
        }
        fb.pull_at = now + self.tuning.vote_timeout_us;
        let mut asks: Vec<Vec<Wide>> = vec![Vec::new(); usize::from(self.plan.members)];
        for (id, c) in self.chunks.iter().filter(|(id, c)| c.count < self.agg_threshold(**id)) {
            for (m, list) in asks.iter_mut().enumerate() {
                if c.members & (1u64 << (m % 64)) == 0 && list.len() < 32 {
                    list.push(Wide {
                        op: WideOp::AggResend,
                        key: id.to_be_bytes().to_vec(),
                        value: 0,
                    });
                }
            }
        }
        for (m, items) in asks.into_iter().enumerate() {
            let Some(node) = self.member_nodes.get(m).copied().flatten() else { continue };
            if !items.is_empty() {
                let hd = self.header(Kind::Wide, node);
                self.send(Packet::wide(hd, items));
            }
        }
    }

    /// Whether the data plane is gone, and whether the application failed.
    pub fn fallback(&self) -> Option<bool> {
        self.fallback.as_ref().map(|f| f.failed)
    }

    fn tell_fallback(&mut self, dst: u16, code: i64) {
        let mut hd = self.header(Kind::Wide, dst);
        hd.aux = 0;
        let item = Wide { op: WideOp::Fallback, key: Vec::new(), value: code };
        self.send(Packet::wide(hd, vec![item]));
    }

    /// Tells the members not heard from directly (and those whose account
    /// is awaited); proposes the open instances again.
    fn notify_fallback(&mut self, now: u64) {
        let Some(fb) = &mut self.fallback else { return };
        if now < fb.next_at {
            return;
        }
        fb.next_at = now + FALLBACK_NOTICE_US;
        let (failed, heard) = (fb.failed, fb.heard);
        let nodes: Vec<(i64, u16)> = self
            .member_nodes
            .iter()
            .enumerate()
            .filter_map(|(m, n)| n.map(|n| (m, n)))
            .map(|(m, n)| (m, self.fallback_code((m as u16, self.incarnations[m])), n))
            .filter(|(m, code, _)| heard & (1u64 << (m % 64)) == 0 || *code == 2)
            .map(|(_, code, n)| (code, n))
            .collect();
        for (code, n) in nodes {
            self.tell_fallback(n, code);
        }
        if !failed {
            let open: Vec<u32> =
                self.instances.iter().filter(|(_, i)| !i.committed).map(|(id, _)| *id).collect();
            for id in open {
                self.send_proposal(id);
            }
        }
    }

    /// A member's packet must come from its newest incarnation: a newer
    /// one starts the member's flows over (a restarted member numbers from
    /// 0 again), an older one is dropped (a packet of a member that has
    /// restarted since).
    fn admit_incarnation(&mut self, member: u16, incarnation: u8) -> bool {
        let Some(cur) = self.incarnations.get_mut(usize::from(member)) else { return false };
        let ahead = incarnation.wrapping_sub(*cur) as i8;
        if ahead < 0 {
            return false;
        }
        let seen = &mut self.seen_members[usize::from(member)];
        if ahead > 0 {
            let earlier = (member, *cur);
            *cur = incarnation;
            self.accounts.forget_partial(member);
            if *seen && !self.accounts.given(earlier) {
                self.accounts.void(format!(
                    "member {member} restarted without giving the account of its earlier life"
                ));
            }
            for f in self.plan.member_flows(member) {
                self.flows.remove(&f);
            }
        }
        *seen = true;
        true
    }

    fn first_time(&mut self, h: &Header) -> bool {
        self.first_time_masked(h).is_ok()
    }

    /// As `first_time`; a repeat returns the data-plane mask of the first.
    fn first_time_masked(&mut self, h: &Header) -> Result<(), u64> {
        let cap = self.plan.window as usize;
        self.flows.entry(h.flow).or_default().first_time(h.seq, h.aux, cap, h.mask)
    }

    fn ack(&mut self, h: &Header, mappings: Vec<Pair>) {
        self.ack_masked(h, mappings, 0);
    }

    /// An acknowledgement saying which pairs the data plane applied.
    fn ack_masked(&mut self, h: &Header, mappings: Vec<Pair>, mask: u64) {
        let mut a = self.header(Kind::Ack, h.src);
        a.flow = h.flow;
        a.seq = h.seq;
        a.mask = mask;
        a.ext = h.ext & 0xff00;
        a.flags = Flags(h.flags.0 & Flags::ECN);
        self.send(Packet::pairs(a, mappings));
    }

    /// `Map.addTo` pairs the data plane left (or, without one, all).
    fn on_add(&mut self, p: &Packet) {
        let h = p.header;
        let mut stale = Vec::new();
        let first = self.first_time_masked(&h);
        let mask = match first {
            Ok(()) => h.mask,
            Err(m) => m,
        };
        if first.is_ok() {
            for (i, pair) in p.pair_items().iter().enumerate() {
                if i < 64 && h.mask & (1u64 << i) != 0 {
                    continue;
                }
                let Some(k) = self.keys.get(&pair.key) else {
                    self.stats.unknown_keys += 1;
                    continue;
                };
                let key = k.key.clone();
                let cell = k.cell;
                let v = self.modified(i64::from(pair.value));
                add_to(self.host.entry(key).or_insert(0), v);
                let h = self.heat.entry(pair.key).or_insert(0);
                *h = h.saturating_add(v.unsigned_abs());
                self.stats.host_items += 1;
                if !pair.addr.is_none() && cell != Some(pair.addr) {
                    stale.push(Pair { key: pair.key, addr: cell.unwrap_or(Addr::NONE), value: 0 });
                }
            }
        }
        self.ack_masked(&h, stale, mask);
    }

    fn on_wide(&mut self, now: u64, p: &Packet) {
        let h = p.header;
        let items = p.wide_items();
        let sequenced = h.ext & Header::SEQUENCED != 0;
        if !self.map_ready() && items.iter().any(|i| matches!(i.op, WideOp::Get | WideOp::Clear)) {
            // Not until every account is in (the member asks again).
            return;
        }
        if items.iter().any(|i| i.op == WideOp::Get) {
            self.get(h, items);
            return;
        }
        if !sequenced {
            if items.first().is_some_and(|i| i.op == WideOp::Account) {
                if let Some(m) = self.plan.member_of(h.flow) {
                    self.on_account(&h, (m, h.incarnation()), items);
                    self.try_finish_rebuild(now);
                }
                return;
            }
            for i in items {
                match i.op {
                    WideOp::AggPart => self.on_part(&h, i),
                    WideOp::Release => self.on_release_request(&h, i),
                    _ => {}
                }
            }
            self.on_commit_acks(&h, items);
            if let Some(i) = items.iter().find(|i| i.op == WideOp::Alive) {
                self.on_alive(now, &h, i.value);
            }
            return;
        }
        let fresh = self.first_time(&h);
        if items.iter().any(|i| i.op == WideOp::Clear) {
            if fresh {
                self.clear(h);
            } else {
                self.ack(&h, Vec::new());
            }
            return;
        }
        let mut mappings = Vec::new();
        for i in items.iter().filter(|i| i.op == WideOp::Add) {
            let l = logical(&i.key, self.plan.key_bits);
            if fresh {
                let v = self.modified(i.value);
                add_to(self.host.entry(i.key.clone()).or_insert(0), v);
                let h = self.heat.entry(l).or_insert(0);
                *h = h.saturating_add(v.unsigned_abs());
                self.stats.host_items += 1;
            }
            let owner = match self.keys.get(&l) {
                Some(k) => k.key == i.key,
                None => {
                    self.keys
                        .insert(l, KeyState { key: i.key.clone(), cell: None, installing: false });
                    true
                }
            };
            if !owner {
                if fresh {
                    self.stats.collisions += 1;
                }
                continue;
            }
            match self.keys.get(&l).and_then(|k| k.cell) {
                Some(addr) => mappings.push(Pair { key: l, addr, value: 0 }),
                None => self.maybe_install(l),
            }
        }
        if self.plan.cache == CachePolicy::PeriodicCounting && self.next_period == 0 {
            self.next_period = now + self.tuning.period_us;
        }
        self.ack(&h, mappings);
    }

    /// `Map.get`: host part plus, for keys with cells, a control-plane read
    /// (a read and a move of the same cell are ordered on the control
    /// channel, so a value is never counted twice or missed).
    fn get(&mut self, h: Header, items: &[Wide]) {
        let keys: Vec<Vec<u8>> =
            items.iter().filter(|i| i.op == WideOp::Get).map(|i| i.key.clone()).collect();
        let mut by_switch: BTreeMap<u8, Vec<Addr>> = BTreeMap::new();
        let mut at = HashMap::new();
        for k in &keys {
            let l = logical(k, self.plan.key_bits);
            let Some(state) = self.keys.get(&l).filter(|s| &s.key == k) else { continue };
            // A cell being emptied is read too: the read is ordered after the
            // move on the control channel, so it sees the empty cell exactly
            // when the host already has the value.
            if let Some(addr) = state.cell.or_else(|| self.evicting.get(&l).copied()) {
                by_switch.entry(addr.switch()).or_default().push(addr);
                at.insert(k.clone(), addr);
            }
        }
        let id = self.next_op;
        self.next_op += 1;
        self.gets.insert(
            id,
            GetState { reply: h, keys, at, cells: HashMap::new(), waiting: by_switch.len() },
        );
        if by_switch.is_empty() {
            self.finish_get(id);
            return;
        }
        for (s, addrs) in by_switch {
            let control = Control::Read { app: self.plan.app, addrs: addrs.clone() };
            self.control(s, control, Pending::GetRead { get: id, addrs });
        }
    }

    fn finish_get(&mut self, id: u64) {
        let Some(g) = self.gets.remove(&id) else { return };
        if self.fallback.as_ref().is_some_and(|f| f.failed) {
            // Its cells were lost: no value would be exact.
            return;
        }
        let items: Vec<Wide> = g
            .keys
            .iter()
            .map(|k| {
                let l = logical(k, self.plan.key_bits);
                let cell =
                    g.at.get(k)
                        .and_then(|a| g.cells.get(a))
                        .filter(|(tag, _)| *tag == l)
                        .map_or(0, |(_, v)| i64::from(*v));
                let value = self.host.get(k).copied().unwrap_or(0).saturating_add(cell);
                Wide { op: WideOp::Value, key: k.clone(), value }
            })
            .collect();
        let mut r = self.header(Kind::Wide, g.reply.src);
        r.flow = g.reply.flow;
        r.seq = g.reply.seq;
        r.ext = g.reply.ext & 0xff00;
        r.flags = Flags(g.reply.flags.0 & Flags::ECN);
        for batch in items.chunks(32) {
            self.send(Packet::wide(r, batch.to_vec()));
        }
        if items.is_empty() {
            self.send(Packet::wide(r, vec![Wide { op: WideOp::Value, key: Vec::new(), value: 0 }]));
        }
    }

    /// `Map.clear` (copy): every cell is read and zeroed through the control
    /// plane, host parts are dropped, and what was there is kept as the
    /// backup [`ServerAgent::snapshot`].
    fn clear(&mut self, h: Header) {
        if self.stats.installs > 0 {
            self.accounts.void("a Map.clear ran while keys had data-plane cells".into());
        }
        let mut copied: HashMap<Vec<u8>, i64> = std::mem::take(&mut self.host);
        copied.retain(|_, v| *v != 0);
        let id = self.next_op;
        self.next_op += 1;
        let cells: Vec<Addr> = self.resident.keys().copied().collect();
        self.clears.insert(id, ClearState { reply: h, copied, waiting: cells.len() });
        if cells.is_empty() {
            self.finish_clear(id);
        }
        for addr in cells {
            let tag = self.resident[&addr];
            let control = Control::Swap { app: self.plan.app, addr, tag, value: 0 };
            self.control(
                addr.switch(),
                control,
                Pending::ClearCells { clear: id, addrs: vec![addr] },
            );
        }
    }

    fn finish_clear(&mut self, id: u64) {
        let Some(c) = self.clears.remove(&id) else { return };
        self.snapshot = c.copied;
        self.ack(&c.reply, Vec::new());
    }

    /// A completed chunk or a reached quorum from the data plane.
    fn on_result(&mut self, now: u64, p: &Packet) {
        let h = p.header;
        if h.flags.has(Flags::QUORUM) {
            let Some(pair) = p.pair_items().first() else { return };
            if h.flags.has(Flags::ECN) {
                self.congested();
            }
            self.commit(now, pair.key, true);
            return;
        }
        let chunk = h.aux;
        if self.backups.contains_key(&chunk) {
            return;
        }
        let values = p.pair_items().iter().map(|x| x.value).collect();
        let mask = if h.flags.has(Flags::OVERFLOW) { h.mask } else { 0 };
        self.store_backup(chunk, values, mask);
    }

    /// Periodic work: the cache period, and vote instances that waited too long.
    pub fn handle_timeout(&mut self, now: u64) {
        if self.plan.cache == CachePolicy::PeriodicCounting
            && self.next_period != 0
            && now >= self.next_period
        {
            self.next_period = now + self.tuning.period_us;
            let mut by_switch: BTreeMap<u8, Vec<Addr>> = BTreeMap::new();
            for a in self.resident.keys() {
                by_switch.entry(a.switch()).or_default().push(*a);
            }
            if by_switch.is_empty() {
                self.rebalance(&[]);
            }
            for (s, addrs) in by_switch {
                let control = Control::Read { app: self.plan.app, addrs: addrs.clone() };
                self.control(s, control, Pending::PeriodRead { addrs });
            }
        }
        let late: Vec<u32> = self
            .instances
            .iter()
            .filter(|(_, i)| {
                !i.committed && i.ready && now >= i.proposed_at + self.vote_timeout(i.tries)
            })
            .map(|(id, _)| *id)
            .collect();
        if !late.is_empty() {
            self.congested();
        }
        self.resend_notices(now);
        self.try_finish_rebuild(now);
        self.notify_fallback(now);
        self.pull_missing(now);
        self.check_leases(now);
        for id in late {
            let Some(inst) = self.instances.get_mut(&id) else { continue };
            inst.proposed_at = now;
            inst.tries += 1;
            let addr = inst.addr;
            if !addr.is_none() {
                let control = Control::ReadMeta {
                    app: self.plan.app,
                    indices: vec![u32::from(addr.index())],
                };
                self.control(addr.switch(), control, Pending::VoteCheck { instance: id });
            }
            self.send_proposal(id);
        }
    }

    /// Takes the reply to control request `token` (replies come in request
    /// order).
    pub fn handle_control(&mut self, now: u64, token: u64, reply: ControlReply) {
        let Some(list) = self.pending.remove(&token) else { return };
        match reply {
            ControlReply::SwappedMany(old) if old.len() == list.len() => {
                for (p, (tag, value)) in list.into_iter().zip(old) {
                    self.complete(now, p, ControlReply::Swapped { tag, value });
                }
            }
            ControlReply::Cells(cells) => {
                // Each read takes its share, in order.
                let mut rest = cells.into_iter();
                for p in list {
                    let n = match &p {
                        Pending::GetRead { addrs, .. } | Pending::PeriodRead { addrs } => {
                            addrs.len()
                        }
                        _ => 0,
                    };
                    let mine: Vec<(u32, i32)> = rest.by_ref().take(n).collect();
                    let reply = if mine.len() == n {
                        ControlReply::Cells(mine)
                    } else {
                        ControlReply::Refused("short read".into())
                    };
                    self.complete(now, p, reply);
                }
            }
            other => {
                for p in list {
                    self.complete(now, p, other.clone());
                }
            }
        }
    }

    /// Completes one queued operation with its part of a reply.
    fn complete(&mut self, now: u64, pending: Pending, reply: ControlReply) {
        match (pending, reply) {
            (Pending::Install { l, addr }, ControlReply::Swapped { .. }) => {
                if let Some(k) = self.keys.get_mut(&l) {
                    k.installing = false;
                    if self.resident.get(&addr) == Some(&l) {
                        k.cell = Some(addr);
                        self.stats.installs += 1;
                    }
                }
            }
            (Pending::Install { l, addr }, _) => {
                if let Some(k) = self.keys.get_mut(&l) {
                    k.installing = false;
                }
                self.resident.remove(&addr);
            }
            (Pending::Evict { addr, l, reused }, reply) => {
                if let ControlReply::Swapped { tag, value } = reply {
                    if tag == l {
                        if let Some(k) = self.keys.get(&l) {
                            add_to(self.host.entry(k.key.clone()).or_insert(0), i64::from(value));
                            add_to(self.folded.entry(k.key.clone()).or_insert(0), i64::from(value));
                        }
                    }
                }
                if self.evicting.get(&l) == Some(&addr) {
                    self.evicting.remove(&l);
                }
                if !reused && self.plan.cache != CachePolicy::Hashing {
                    self.free_cells.push(addr);
                }
            }
            (Pending::GetRead { get, addrs }, reply) => {
                if let (Some(g), ControlReply::Cells(cells)) = (self.gets.get_mut(&get), &reply) {
                    for (a, c) in addrs.iter().zip(cells) {
                        g.cells.insert(*a, *c);
                    }
                }
                if let Some(g) = self.gets.get_mut(&get) {
                    g.waiting -= 1;
                    if g.waiting == 0 {
                        self.finish_get(get);
                    }
                }
            }
            (Pending::ClearCells { clear, addrs }, reply) => {
                if let ControlReply::Swapped { tag, value } = reply {
                    if let Some(k) =
                        addrs.first().and_then(|a| self.resident.get(a)).filter(|l| **l == tag)
                    {
                        let key = self.keys.get(k).map(|s| s.key.clone()).unwrap_or_default();
                        if let Some(c) = self.clears.get_mut(&clear) {
                            add_to(c.copied.entry(key).or_insert(0), i64::from(value));
                        }
                    }
                }
                if let Some(c) = self.clears.get_mut(&clear) {
                    c.waiting -= 1;
                    if c.waiting == 0 {
                        self.finish_clear(clear);
                    }
                }
            }
            (Pending::PeriodRead { addrs }, ControlReply::Cells(cells)) => {
                let reads: Vec<(Addr, i32)> = addrs
                    .iter()
                    .zip(&cells)
                    .filter(|(a, (tag, _))| self.resident.get(a) == Some(tag))
                    .map(|(a, (_, v))| (*a, *v))
                    .collect();
                self.rebalance(&reads);
            }
            (Pending::OpenVote { instance }, reply) => {
                if let Some(inst) = self.instances.get_mut(&instance) {
                    if !matches!(reply, ControlReply::Done) {
                        inst.addr = Addr::NONE;
                    }
                    inst.ready = true;
                    inst.proposed_at = now;
                }
                self.send_proposal(instance);
            }
            (Pending::VoteCheck { instance }, ControlReply::Meta(m)) => {
                if let Some((tag, count, _, _)) = m.first() {
                    if *tag == instance && *count >= self.plan.threshold {
                        self.commit(now, instance, true);
                    }
                }
            }
            (Pending::Regroup(step), reply) => self.on_regroup_reply(step, reply),
            (Pending::RecoverSlot { chunk, switch }, reply) => {
                let threshold = self.plan.threshold;
                let groups = usize::from(self.plan.groups);
                let Some(r) = self.recover_reads.get_mut(&chunk) else { return };
                r.left -= 1;
                match reply {
                    ControlReply::Slot { tag, count, overflow, values, .. }
                        if tag == chunk && count >= threshold && values.len() >= groups =>
                    {
                        r.overflow |= overflow;
                        r.parts.insert(switch, values[..groups].to_vec());
                    }
                    _ => r.ok = false,
                }
                if r.left == 0 {
                    if let Some(r) = self.recover_reads.remove(&chunk) {
                        self.recovering.remove(&chunk);
                        if r.ok {
                            let values = r.parts.into_values().flatten().collect();
                            self.store_backup(chunk, values, r.overflow);
                        }
                    }
                }
            }
            _ => {}
        }
    }
}
