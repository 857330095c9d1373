//! Host agents against hostile or broken peers: reproducers of what the
//! `inc` fuzz target (fuzz/src/inc.rs) found, and state a peer must not be
//! able to make an agent keep.

use protoplane_inc::mac::Key;
use protoplane_inc::packet::{Addr, Flags, Header, Kind, Packet, Pair, Wide, WideOp};
use protoplane_inc::plan::{AppPlan, CachePolicy, ClearPolicy, MemberLoss};
use protoplane_inc::server::{ServerAgent, ServerTuning};

fn plan() -> AppPlan {
    AppPlan {
        app: 1,
        server: 100,
        switch: Some(900),
        members: 2,
        flows_per_member: 1,
        flow_base: 0,
        switches: 1,
        groups: 8,
        window: 64,
        memory: Some((0, 64)),
        clear: ClearPolicy::Lazy,
        cache: CachePolicy::PeriodicCounting,
        threshold: 2,
        key_bits: 32,
        key: KEY,
        incarnation: 0,
        member_loss: MemberLoss::Fail,
    }
}

const KEY: Key = Key([5; 16]);

/// `Map.addTo` of wide values whose sum leaves the i64 range (found by the
/// `inc` fuzz target): the host map once added with `+=`, which panicked
/// with overflow checks on. It saturates at the int64 range now.
#[test]
fn wide_adds_whose_sum_leaves_i64_do_not_panic_the_server_agent() {
    let mut server = ServerAgent::new(plan(), 100, None, ServerTuning::default());
    for (seq, value) in [(0, i64::MAX), (1, 1)] {
        let mut h = Header::new(Kind::Wide, 1, 1, 100);
        h.flow = 0;
        h.seq = seq;
        h.ext = Header::SEQUENCED;
        let add = Wide { op: WideOp::Add, key: b"k".to_vec(), value };
        server.handle(0, &Packet::wide(h, vec![add]).seal(&KEY));
    }
    assert_eq!(server.stats().host_items, 2);
}

/// Votes and quorum results for instances the agent never proposed, and
/// overflow parts for positions no chunk has, leave no state and no event.
#[test]
fn votes_quorums_and_parts_for_what_was_never_asked_are_ignored() {
    let mut server = ServerAgent::new(plan(), 100, None, ServerTuning::default());
    server.set_member_nodes(&[1, 2]);
    for instance in 1..=1000u32 {
        for member in 0..2u16 {
            let mut h = Header::new(Kind::Vote, 1, 1 + member, 100);
            h.flow = member;
            h.seq = instance;
            h.aux = instance;
            let vote = Pair { key: instance, addr: Addr::NONE, value: 7 };
            server.handle(0, &Packet::pairs(h, vec![vote]).seal(&KEY));
        }
        let mut r = Header::new(Kind::Result, 1, 900, 100);
        r.flags = Flags(Flags::QUORUM);
        let q = Pair { key: instance, addr: Addr::NONE, value: 7 };
        server.handle(0, &Packet::pairs(r, vec![q]).seal(&KEY));
    }
    assert_eq!(server.poll_event(), None, "nothing was proposed, nothing commits");
    assert_eq!(server.stats().host_items, 0);
    // A part for position 4,000,000 of chunk 0.
    let mut key = 0u32.to_be_bytes().to_vec();
    key.extend_from_slice(&4_000_000u32.to_be_bytes());
    let mut h = Header::new(Kind::Wide, 1, 1, 100);
    h.flow = 0;
    server
        .handle(0, &Packet::wide(h, vec![Wide { op: WideOp::AggPart, key, value: 1 }]).seal(&KEY));
    assert_eq!(server.stats().host_items, 0);
    // A proposed instance still commits once, with the proposed value.
    server.propose(0, 5, 42).expect("proposes");
    while server.poll_control().is_some() {}
    for member in 0..2u16 {
        let mut h = Header::new(Kind::Vote, 1, 1 + member, 100);
        h.flow = member;
        h.aux = 5;
        let vote = Pair { key: 5, addr: Addr::NONE, value: 999 };
        server.handle(0, &Packet::pairs(h, vec![vote]).seal(&KEY));
    }
    let e = server.poll_event();
    assert!(
        matches!(
            e,
            Some(protoplane_inc::server::ServerEvent::Committed { instance: 5, value: 42, .. })
        ),
        "{e:?}"
    );
}

/// The header of a wide packet of member 0 (node 1) with sequence number
/// `seq`, from incarnation `incarnation`.
fn wide_add(seq: u32, incarnation: u8) -> Header {
    let mut h = Header::new(Kind::Wide, 1, 1, 100);
    h.flow = 0;
    h.seq = seq;
    h.ext = Header::SEQUENCED;
    h.set_incarnation(incarnation);
    h
}

fn send_add(server: &mut ServerAgent, h: Header, value: i64) {
    let add = Wide { op: WideOp::Add, key: b"k".to_vec(), value };
    server.handle(0, &Packet::wide(h, vec![add]).seal(&KEY));
}

/// The counter "k" as a `Map.get` from member 1 reads it.
fn read_k(server: &mut ServerAgent) -> i64 {
    let mut h = Header::new(Kind::Wide, 1, 2, 100);
    h.flow = 1;
    h.seq = 1000;
    h.ext = Header::SEQUENCED;
    server.handle(
        0,
        &Packet::wide(h, vec![Wide { op: WideOp::Get, key: b"k".to_vec(), value: 0 }]).seal(&KEY),
    );
    let mut value = None;
    while let Some(t) = server.poll_transmit() {
        let p = Packet::open(&t.bytes, &KEY).expect("the agent seals what it sends");
        if let Some(v) = p.wide_items().iter().find(|i| i.op == WideOp::Value) {
            value = Some(v.value);
        }
    }
    value.expect("a value reply")
}

/// A member that restarts numbers its packets from 0 again; with a new
/// incarnation they count, and a late packet of the old one does not.
#[test]
fn a_restarted_member_counts_again_and_its_old_incarnation_does_not() {
    let mut server = ServerAgent::new(plan(), 100, None, ServerTuning::default());
    send_add(&mut server, wide_add(0, 1), 5);
    send_add(&mut server, wide_add(1, 1), 5);
    send_add(&mut server, wide_add(1, 1), 5); // a retransmission
    assert_eq!(read_k(&mut server), 10);
    // Restarted: incarnation 2, sequence numbers from 0.
    send_add(&mut server, wide_add(0, 2), 7);
    send_add(&mut server, wide_add(1, 2), 7);
    assert_eq!(read_k(&mut server), 24, "the new incarnation's packets are not duplicates");
    // A late retransmission of the old incarnation: dropped.
    send_add(&mut server, wide_add(2, 1), 100);
    assert_eq!(read_k(&mut server), 24);
}

/// What does not carry the application's MAC changes nothing.
#[test]
fn a_forged_packet_changes_nothing_on_the_server_agent() {
    let mut server = ServerAgent::new(plan(), 100, None, ServerTuning::default());
    let add = Wide { op: WideOp::Add, key: b"k".to_vec(), value: 9 };
    let p = Packet::wide(wide_add(0, 1), vec![add]);
    server.handle(0, &p.to_bytes());
    server.handle(0, &p.seal(&Key([6; 16])));
    assert_eq!(server.stats().ignored, 2);
    assert_eq!(read_k(&mut server), 0);
}

/// A member's account naming keys the server agent's map never had (a
/// forged or broken account) is acknowledged, counted as unknown keys and
/// kept nowhere: what a member sends cannot grow the agent beyond its map.
#[test]
fn an_account_of_keys_the_map_never_had_is_acknowledged_and_kept_nowhere() {
    let mut server = ServerAgent::new(plan(), 100, None, ServerTuning::default());
    server.set_member_nodes(&[1, 2]);
    let batches = 3u32;
    for index in 0..batches {
        let mut h = Header::new(Kind::Wide, 1, 1, 100);
        h.flow = 0;
        h.aux = (batches << 16) | index;
        let items = (0..32u32)
            .map(|k| Wide {
                op: WideOp::Account,
                key: (index * 32 + k + 1000).to_be_bytes().to_vec(),
                value: 7,
            })
            .collect();
        server.handle(0, &Packet::wide(h, items).seal(&KEY));
    }
    assert_eq!(server.stats().unknown_keys, u64::from(batches) * 32);
    let mut acked = Vec::new();
    while let Some(t) = server.poll_transmit() {
        let p = Packet::open(&t.bytes, &KEY).expect("the agent's own packet");
        for i in p.wide_items().iter().filter(|i| i.op == WideOp::Account) {
            acked.push(i.value);
        }
    }
    assert_eq!(acked, vec![0, 1, 2], "each batch acknowledged");
    // A batch index outside its own count is not one.
    let mut h = Header::new(Kind::Wide, 1, 1, 100);
    h.flow = 0;
    h.aux = (2 << 16) | 5;
    let item = Wide { op: WideOp::Account, key: 1u32.to_be_bytes().to_vec(), value: 1 };
    server.handle(0, &Packet::wide(h, vec![item]).seal(&KEY));
    assert!(server.poll_transmit().is_none(), "no acknowledgement for a batch that is not one");
}
