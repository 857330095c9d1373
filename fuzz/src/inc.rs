//! The `inc` target's interpreter: the in-network-computation data plane
//! (`protoplane_inc::switch`) and the host agents of one application
//! against hostile datagrams, shared with `examples/seed.rs` so that seeds
//! are written in the format the target reads.
//!
//! # Setup
//!
//! A [`Switch`] (node [`SWITCH`]: 1,024 registers, 8 groups, 64 flows,
//! window 64) holds two applications with disjoint memory and flows:
//! * A (id [`A`]): flows 0..4, memory 0..64, server agent at [`SERVER`],
//!   two members, member 0's client agent at [`CLIENT`] (member 1, node 2,
//!   is not simulated: its datagrams are the fuzzer's);
//! * B (id [`B`]): flows 8..12, memory 64..128, no agents. It is given
//!   state by real packets first (two cells added to, a completed
//!   aggregation slot, a vote slot with one vote), and the switch's answers
//!   to retransmissions of those packets are recorded.
//!
//! # Input
//!
//! One config byte, then records `op, length (u16, big-endian), body`
//! (the body is cut to the bytes left). Config bits 0..=1: the clear
//! policy (copy, shadow, lazy, and lazy with `MemberLoss: continue`, so
//! a member lost to its lease starts a regroup); 2..=3: the cache policy (periodic
//! counting, FCFS, hashing, periodic counting); 4: 4-bit logical
//! addresses (collisions) instead of 32; 5..=6: `Stream.modify` (none,
//! `+1`, `<<1`, `max 0`); 7: results to members and server instead of
//! members only.
//!
//! `op & 7` ([`Op`]):
//! * 0, 7 — the body is a datagram for the switch. Its app id is forced
//!   to A (or, with `op & 8`, to an id nobody installed), its incarnation
//!   to A's flows' (0), and it is sealed with A's key: the fuzzer plays a
//!   hostile *member* of A, which holds A's key (anyone else's packets are
//!   dropped at the MAC check, which the replays below exercise). `op >>
//!   4` times 8 is the queue depth (ECN above 64).
//! * 1 — a datagram for the server agent; 2 — for the client agent (both
//!   sealed with A's key).
//! * 3 — an API call of the client agent (add, get, clear, aggregate,
//!   leave, vote; [`client_call`]); 4 — a proposal of the server agent,
//!   or with the one-byte body `0xff` the server agent losing the data
//!   plane.
//! * 5 — time passes (body: microseconds, u16 × 16) and both agents'
//!   `handle_timeout` run whether due or not.
//! * 6 — replays one of the last datagrams delivered (body byte 0 picks
//!   it, bytes 1 and 2 an offset to XOR with byte 3), to its receiver, not
//!   sealed again (a changed byte is a forgery); if that is the switch,
//!   the app id is forced as for op 0.
//!
//! After every record, time advances by 100 µs, agents whose timeout is
//! due run it, and everything the switch and the agents send is delivered
//! (switch emits to the agents, agent transmits to the switch, control
//! requests to the switch and their replies back, in order) until nothing
//! moves or a bound on deliveries per record is reached.
//!
//! # Properties
//!
//! Beyond "never panics":
//! * B's registers read back exactly as before: every cell of every group
//!   in B's memory, and every slot's metadata and overflow flags;
//! * retransmissions of B's setup packets get exactly the answers they got
//!   right after setup (B's flow bits and applied masks are unchanged);
//! * no pass touches a register array twice (`Stats::double_touch`);
//! * every datagram an agent sends that parses carries A's app id.

use std::collections::VecDeque;

use protoplane_inc::client::{ClientAgent, ClientTuning};
use protoplane_inc::keys::int_key;
use protoplane_inc::mac::Key;
use protoplane_inc::packet::{Addr, Header, Kind, Packet, Pair};
use protoplane_inc::plan::{AppPlan, CachePolicy, ClearPolicy, MemberLoss};
use protoplane_inc::server::{ServerAgent, ServerTuning};
use protoplane_inc::switch::{
    AppEntry, Control, ControlReply, CountMode, Destinations, Emit, ModifyOp, Switch, SwitchConfig,
};

/// The switch's node.
pub const SWITCH: u16 = 900;
/// Application A's id.
pub const A: u16 = 1;
/// Application B's id.
pub const B: u16 = 2;
/// An application id nobody installed.
pub const NOBODY: u16 = 7;
/// A's server agent.
pub const SERVER: u16 = 100;
/// A's member 0 (the client agent).
pub const CLIENT: u16 = 1;
/// A's member 1 (not simulated).
pub const OTHER_MEMBER: u16 = 2;
/// B's server and members (not simulated).
pub const B_SERVER: u16 = 200;
/// B's members.
pub const B_MEMBERS: [u16; 2] = [21, 22];

/// A's key.
pub const KEY_A: Key = Key([0xa; 16]);
/// B's key (the fuzzer never has it).
const KEY_B: Key = Key([0xb; 16]);
const GROUPS: u8 = 8;
const WINDOW: u32 = 64;
const A_MEMORY: (u32, u32) = (0, 64);
const B_MEMORY: (u32, u32) = (64, 64);
const A_FLOWS: (u16, u16) = (0, 4);
const B_FLOWS: (u16, u16) = (8, 4);
/// Datagrams delivered per record at most (agents and switch may keep
/// talking: retransmissions, proposals).
const MAX_DELIVERIES: usize = 2048;
/// Datagrams kept for replay.
const HISTORY: usize = 64;
/// Microseconds per record.
const TICK: u64 = 100;

/// What a record does (`op & 7`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// A datagram for the switch (also 7).
    Switch = 0,
    /// A datagram for the server agent.
    Server = 1,
    /// A datagram for the client agent.
    Client = 2,
    /// An API call of the client agent.
    Call = 3,
    /// A proposal of the server agent.
    Propose = 4,
    /// Time passes.
    Wait = 5,
    /// A replayed datagram.
    Replay = 6,
}

impl Op {
    fn of(op: u8) -> Op {
        match op & 7 {
            1 => Op::Server,
            2 => Op::Client,
            3 => Op::Call,
            4 => Op::Propose,
            5 => Op::Wait,
            6 => Op::Replay,
            _ => Op::Switch,
        }
    }
}

/// Encodes one record (for seeds).
pub fn record(op: u8, body: &[u8]) -> Vec<u8> {
    let len = u16::try_from(body.len()).expect("a record body fits 64 KiB");
    let mut out = vec![op];
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// Reads numbers off the front of a body; missing bytes read as zero.
struct Body<'a>(&'a [u8]);

impl Body<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn i64(&mut self) -> i64 {
        (u64::from(self.u32()) << 32 | u64::from(self.u32())) as i64
    }
}

/// The plan of A, from the config byte.
pub fn plan_a(config: u8) -> AppPlan {
    AppPlan {
        app: A,
        server: SERVER,
        switch: Some(SWITCH),
        members: 2,
        flows_per_member: 2,
        flow_base: A_FLOWS.0,
        switches: 1,
        groups: GROUPS,
        window: WINDOW,
        memory: Some(A_MEMORY),
        clear: match config & 3 {
            0 => ClearPolicy::Copy,
            1 => ClearPolicy::Shadow,
            _ => ClearPolicy::Lazy,
        },
        cache: match (config >> 2) & 3 {
            1 => CachePolicy::Fcfs,
            2 => CachePolicy::Hashing,
            _ => CachePolicy::PeriodicCounting,
        },
        threshold: 2,
        key_bits: if config & 16 != 0 { 4 } else { 32 },
        key: KEY_A,
        incarnation: 0,
        member_loss: if config & 3 == 3 { MemberLoss::Continue } else { MemberLoss::Fail },
    }
}

fn modify_of(config: u8) -> Option<(ModifyOp, i32)> {
    match (config >> 5) & 3 {
        1 => Some((ModifyOp::Add, 1)),
        2 => Some((ModifyOp::Shl, 1)),
        3 => Some((ModifyOp::Max, 0)),
        _ => None,
    }
}

fn entry_a(config: u8) -> AppEntry {
    AppEntry {
        app: A,
        server: SERVER,
        members: vec![CLIENT, OTHER_MEMBER],
        forward: if config & 128 != 0 { Destinations::Both } else { Destinations::Members },
        flow_base: A_FLOWS.0,
        flows: A_FLOWS.1,
        mem_base: A_MEMORY.0,
        mem_len: A_MEMORY.1,
        threshold: 2,
        count: CountMode::TestAndSet,
        modify: modify_of(config),
        key: KEY_A,
    }
}

fn entry_b() -> AppEntry {
    AppEntry {
        app: B,
        server: B_SERVER,
        members: B_MEMBERS.to_vec(),
        forward: Destinations::Both,
        flow_base: B_FLOWS.0,
        flows: B_FLOWS.1,
        mem_base: B_MEMORY.0,
        mem_len: B_MEMORY.1,
        threshold: 2,
        count: CountMode::TestAndSet,
        modify: None,
        key: KEY_B,
    }
}

/// B's packets of the setup (each is also retransmitted at the end).
fn b_packets() -> Vec<Vec<u8>> {
    let b = B_MEMORY.0 as u16;
    let header = |kind: Kind, flow: u16, seq: u32, aux: u32| {
        let mut h = Header::new(kind, B, B_MEMBERS[usize::from(flow - B_FLOWS.0) % 2], B_SERVER);
        h.flow = flow;
        h.ext = Header::SEQUENCED;
        h.seq = seq;
        h.aux = aux;
        h
    };
    let add = Packet::pairs(
        header(Kind::Add, B_FLOWS.0, 0, 0),
        vec![
            Pair { key: 0xb0, addr: Addr::new(0, 0, b), value: 10 },
            Pair { key: 0xb1, addr: Addr::new(0, GROUPS - 1, b + 63), value: -10 },
            Pair { key: 0xb2, addr: Addr::new(0, 1, b + 1), value: 5 },
        ],
    );
    let agg = |flow: u16, values: [i32; 3]| {
        let pairs = values
            .iter()
            .enumerate()
            .map(|(i, v)| Pair { key: i as u32, addr: Addr::new(0, i as u8, b + 6), value: *v })
            .collect();
        Packet::pairs(header(Kind::Agg, flow, 0, 3), pairs)
    };
    let vote = Packet::pairs(
        header(Kind::Vote, B_FLOWS.0 + 2, 0, 0x77),
        vec![Pair { key: 0x77, addr: Addr::new(0, 0, b + 11), value: 1 }],
    );
    vec![
        add.seal(&KEY_B),
        agg(B_FLOWS.0, [1, i32::MAX, -3]).seal(&KEY_B),
        agg(B_FLOWS.0 + 1, [2, 1, -4]).seal(&KEY_B),
        vote.seal(&KEY_B),
    ]
}

/// B's registers: every cell of every group, every slot's metadata.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    cells: ControlReply,
    meta: ControlReply,
}

fn snapshot(sw: &mut Switch) -> Snapshot {
    let (base, len) = B_MEMORY;
    let addrs: Vec<Addr> = (0..GROUPS)
        .flat_map(|g| (base..base + len).map(move |i| Addr::new(0, g, i as u16)))
        .collect();
    let cells = sw.control(Control::Read { app: B, addrs });
    let meta = sw.control(Control::ReadMeta { app: B, indices: (base..base + len).collect() });
    assert!(matches!(cells, ControlReply::Cells(_)), "reading B's cells: {cells:?}");
    assert!(matches!(meta, ControlReply::Meta(_)), "reading B's slots: {meta:?}");
    Snapshot { cells, meta }
}

/// Retransmits B's setup packets; what the switch answers.
fn b_retransmissions(sw: &mut Switch) -> Vec<Vec<Emit>> {
    b_packets()
        .iter()
        .map(|p| {
            let mut out = Vec::new();
            sw.process(0, 0, p, &mut out);
            out
        })
        .collect()
}

/// The switch with A and B, and B's state.
fn setup_switch(config: u8) -> Switch {
    let c = SwitchConfig {
        node: SWITCH,
        chain_index: 0,
        next_hop: None,
        stages: 12,
        groups: GROUPS,
        groups_per_stage: 4,
        registers: 1024,
        flows: 64,
        window: WINDOW,
        ecn_threshold: 64,
    };
    let mut sw = Switch::new(c).expect("the fuzz switch config is valid");
    for e in [entry_a(config), entry_b()] {
        assert_eq!(sw.control(Control::Install(e)), ControlReply::Done);
    }
    let b = B_MEMORY.0 as u16;
    for (addr, tag, value) in [
        (Addr::new(0, 0, b), 0xb0, 1),
        (Addr::new(0, GROUPS - 1, b + 63), 0xb1, -1),
        (Addr::new(0, 1, b + 1), 0xb2, i32::MAX),
    ] {
        let r = sw.control(Control::Swap { app: B, addr, tag, value });
        assert!(matches!(r, ControlReply::Swapped { .. }), "{r:?}");
    }
    assert_eq!(
        sw.control(Control::ResetMeta { app: B, slots: vec![(B_MEMORY.0 + 11, 0x77)] }),
        ControlReply::Done
    );
    let mut out = Vec::new();
    for p in b_packets() {
        sw.process(0, 0, &p, &mut out);
    }
    // add (forwarded: one pair overflows), result ×3 (11, 12, 200), vote ack
    assert_eq!(out.len(), 5, "B's setup: {out:?}");
    sw
}

/// A client agent call from a record body.
fn client_call(client: &mut ClientAgent, body: &[u8]) {
    let mut r = Body(body);
    let key = |r: &mut Body<'_>| -> Vec<u8> {
        let k = r.u8();
        if k >= 240 {
            // An arbitrary key (too long ones are refused by the agent).
            let len = usize::from(r.u8() % 80);
            (0..len).map(|_| r.u8()).collect()
        } else {
            int_key(i64::from(k % 24))
        }
    };
    let value = |r: &mut Body<'_>| -> i64 {
        match r.u8() % 4 {
            0 => i64::from(r.u8() as i8),
            1 => i64::from(r.u32() as i32),
            2 => i64::from(r.u32()) << 16,
            _ => r.i64(),
        }
    };
    match r.u8() % 6 {
        0 => {
            let n = r.u8() % 12;
            let items: Vec<(Vec<u8>, i64)> = (0..n).map(|_| (key(&mut r), value(&mut r))).collect();
            let _ = client.add(&items);
        }
        1 => {
            let n = r.u8() % 6;
            let keys: Vec<Vec<u8>> = (0..n).map(|_| key(&mut r)).collect();
            let _ = client.get(&keys);
        }
        2 => {
            client.clear();
        }
        3 => {
            let n = usize::from(r.u8() % 40);
            let values: Vec<i32> = (0..n)
                .map(|_| match r.u8() % 3 {
                    0 => i32::from(r.u8() as i8),
                    1 => r.u32() as i32,
                    _ => i32::MAX - i32::from(r.u8()),
                })
                .collect();
            client.aggregate(&values);
        }
        5 => {
            client.leave();
        }
        _ => {
            let instance = r.u32() % 8;
            let value = r.u32() as i32;
            let addr = match r.u8() % 3 {
                0 => Addr::NONE,
                1 => Addr::new(0, r.u8() % GROUPS, (r.u8() % 64).into()),
                _ => Addr(r.u32()),
            };
            client.vote(instance, value, addr);
        }
    }
}

/// Sets a switch datagram's app id to A or to [`NOBODY`] and its
/// incarnation to 0.
fn force_app(bytes: &mut [u8], nobody: bool) {
    if let Some(id) = bytes.get_mut(6..8) {
        id.copy_from_slice(&(if nobody { NOBODY } else { A }).to_be_bytes());
    }
    if let Some(inc) = bytes.get_mut(14) {
        *inc = 0;
    }
}

/// Seals a datagram as a member of A would.
fn sealed(mut bytes: Vec<u8>) -> Vec<u8> {
    protoplane_inc::packet::seal(&mut bytes, &KEY_A);
    bytes
}

/// The deployment the records drive.
struct World {
    now: u64,
    sw: Switch,
    server: ServerAgent,
    client: ClientAgent,
    /// Datagrams waiting for delivery: (destination, bytes, from an agent).
    wire: VecDeque<(u16, Vec<u8>, bool)>,
    history: VecDeque<(u16, Vec<u8>)>,
}

impl World {
    fn new(config: u8) -> World {
        let plan = plan_a(config);
        let mut server =
            ServerAgent::new(plan.clone(), SERVER, modify_of(config), ServerTuning::default());
        server.set_member_nodes(&[CLIENT, OTHER_MEMBER]);
        let client = ClientAgent::new(plan, 0, CLIENT, ClientTuning::default());
        World {
            now: 1_000,
            sw: setup_switch(config),
            server,
            client,
            wire: VecDeque::new(),
            history: VecDeque::new(),
        }
    }

    /// Hands one datagram to its receiver.
    fn deliver(&mut self, dst: u16, bytes: Vec<u8>, depth: u32) {
        match dst {
            SWITCH => {
                let mut out = Vec::new();
                self.sw.process(self.now, depth, &bytes, &mut out);
                for e in out {
                    self.wire.push_back((e.dst, e.bytes, false));
                }
            }
            SERVER => self.server.handle(self.now, &bytes),
            CLIENT => self.client.handle(self.now, &bytes),
            _ => return,
        }
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back((dst, bytes));
    }

    /// Moves everything until nothing moves (or the bound is reached).
    fn pump(&mut self) {
        let mut deliveries = 0;
        loop {
            while let Some(t) = self.client.poll_transmit(self.now) {
                self.wire.push_back((t.dst, t.bytes, true));
            }
            while let Some(t) = self.server.poll_transmit() {
                self.wire.push_back((t.dst, t.bytes, true));
            }
            while let Some(req) = self.server.poll_control() {
                let reply = if req.chain_index == 0 {
                    self.sw.control(req.control)
                } else {
                    ControlReply::Refused(format!("no switch {}", req.chain_index))
                };
                self.server.handle_control(self.now, req.token, reply);
            }
            while self.client.poll_event().is_some() {}
            while self.server.poll_event().is_some() {}
            let Some((dst, bytes, from_agent)) = self.wire.pop_front() else { break };
            if from_agent {
                if let Ok(p) = Packet::decode(&bytes) {
                    assert_eq!(p.header.app, A, "an agent of A sent {p:?}");
                }
            }
            deliveries += 1;
            if deliveries > MAX_DELIVERIES {
                self.wire.clear();
                break;
            }
            self.deliver(dst, bytes, 0);
        }
    }

    fn timeouts(&mut self, force: bool) {
        if force || self.client.poll_timeout().is_some_and(|t| t <= self.now) {
            self.client.handle_timeout(self.now);
        }
        if force || self.server.poll_timeout().is_some_and(|t| t <= self.now) {
            self.server.handle_timeout(self.now);
        }
    }

    fn record(&mut self, op: u8, body: &[u8]) {
        match Op::of(op) {
            Op::Switch => {
                let mut bytes = body.to_vec();
                force_app(&mut bytes, op & 8 != 0);
                self.deliver(SWITCH, sealed(bytes), u32::from(op >> 4) * 8);
            }
            Op::Server => self.deliver(SERVER, sealed(body.to_vec()), 0),
            Op::Client => self.deliver(CLIENT, sealed(body.to_vec()), 0),
            Op::Call => client_call(&mut self.client, body),
            // A one-byte body 0xff: the server agent loses the data plane
            // (its members fall back and give their accounts).
            Op::Propose if body == [0xff] => {
                self.server.data_plane_lost(self.now);
            }
            Op::Propose => {
                let mut r = Body(body);
                let instance = r.u32() % 8;
                let _ = self.server.propose(self.now, instance, r.i64());
            }
            Op::Wait => {
                self.now += u64::from(Body(body).u16()) * 16;
                self.timeouts(true);
            }
            Op::Replay => {
                let mut r = Body(body);
                let pick = usize::from(r.u8());
                if self.history.is_empty() {
                    return;
                }
                let (dst, mut bytes) = self.history[pick % self.history.len()].clone();
                let at = usize::from(r.u16());
                let x = r.u8();
                if !bytes.is_empty() {
                    let n = bytes.len();
                    bytes[at % n] ^= x;
                }
                if dst == SWITCH {
                    force_app(&mut bytes, op & 8 != 0);
                }
                self.deliver(dst, bytes, 0);
            }
        }
        self.now += TICK;
        self.timeouts(false);
        self.pump();
    }
}

/// Runs one input; panics if a property does not hold.
pub fn run(data: &[u8]) {
    let Some((&config, mut rest)) = data.split_first() else { return };
    let mut world = World::new(config);
    let before = snapshot(&mut world.sw);
    let answers = b_retransmissions(&mut world.sw);
    assert_eq!(snapshot(&mut world.sw), before, "retransmissions of B's packets changed B");
    world.pump();
    while let Some((&op, tail)) = rest.split_first() {
        let mut r = Body(tail);
        let len = usize::from(r.u16());
        let tail = r.0;
        let (body, next) = tail.split_at(len.min(tail.len()));
        world.record(op, body);
        rest = next;
    }
    assert_eq!(snapshot(&mut world.sw), before, "B's registers changed");
    assert_eq!(b_retransmissions(&mut world.sw), answers, "B's flow bits or masks changed");
    assert_eq!(world.sw.stats().double_touch, 0, "a pass touched a register array twice");
}
