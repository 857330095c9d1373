//! Unit tests of the software data plane: configuration, the control
//! plane, and what each packet kind does to registers and what it emits.
//!
//! Every packet goes through [`send`], which also checks that the pass
//! touched no register array twice (`Stats::double_touch`).

use super::*;

/// The switch's own node.
const SWITCH: u16 = 900;
/// Application A: flows 0..4, memory 0..16, server 100, members 1, 2, 3.
const A: u16 = 1;
/// Application B: flows 4..8, memory 16..32, server 200, members 11, 12.
const B: u16 = 2;
/// An application id nobody installed.
const NOBODY: u16 = 9;
const A_SERVER: u16 = 100;
const B_SERVER: u16 = 200;
const A_MEMBERS: [u16; 3] = [1, 2, 3];
const WINDOW: u32 = 8;
const KEY_A: Key = Key([0xa; 16]);
const KEY_B: Key = Key([0xb; 16]);
const GROUPS: u8 = 4;

fn config() -> SwitchConfig {
    SwitchConfig {
        node: SWITCH,
        chain_index: 0,
        next_hop: None,
        stages: 12,
        groups: GROUPS,
        groups_per_stage: 4,
        registers: 64,
        flows: 64,
        window: WINDOW,
        ecn_threshold: 4,
    }
}

fn app_a() -> AppEntry {
    AppEntry {
        app: A,
        server: A_SERVER,
        members: A_MEMBERS.to_vec(),
        forward: Destinations::Members,
        flow_base: 0,
        flows: 4,
        mem_base: 0,
        mem_len: 16,
        threshold: 3,
        count: CountMode::TestAndSet,
        modify: None,
        key: KEY_A,
    }
}

fn app_b() -> AppEntry {
    AppEntry {
        app: B,
        server: B_SERVER,
        members: vec![11, 12],
        forward: Destinations::Both,
        flow_base: 4,
        flows: 4,
        mem_base: 16,
        mem_len: 16,
        threshold: 2,
        count: CountMode::TestAndSet,
        modify: None,
        key: KEY_B,
    }
}

/// The key an application's packets are sealed with (a made-up one for
/// applications nobody installed).
fn key_of(app: u16) -> Key {
    match app {
        A => KEY_A,
        B => KEY_B,
        _ => Key([0x9; 16]),
    }
}

/// `p` sealed with its application's key.
fn sealed(p: &Packet) -> Vec<u8> {
    p.seal(&key_of(p.header.app))
}

/// A switch holding `apps`.
fn switch_with(apps: &[AppEntry]) -> Switch {
    let mut sw = Switch::new(config()).expect("test config is valid");
    for a in apps {
        assert_eq!(sw.control(Control::Install(a.clone())), ControlReply::Done, "install {a:?}");
    }
    sw
}

/// A switch holding A and B.
fn switch() -> Switch {
    switch_with(&[app_a(), app_b()])
}

/// Processes one datagram and checks the once-per-pass rule.
fn send_bytes(sw: &mut Switch, now: u64, depth: u32, bytes: &[u8]) -> Vec<Emit> {
    let mut out = Vec::new();
    sw.process(now, depth, bytes, &mut out);
    assert_eq!(sw.stats().double_touch, 0, "a pass touched a register array twice");
    out
}

fn send(sw: &mut Switch, p: &Packet) -> Vec<Emit> {
    send_bytes(sw, 1, 0, &sealed(p))
}

/// What the switch emitted, checked to be well formed and sealed with its
/// application's key.
fn decode(e: &Emit) -> Packet {
    let (h, _) = Header::decode(&e.bytes).expect("the switch emits well-formed packets");
    Packet::open(&e.bytes, &key_of(h.app)).expect("the switch seals what it emits")
}

/// The only datagram `out` holds, decoded, with its destination.
fn only(out: &[Emit]) -> (u16, Packet) {
    assert_eq!(out.len(), 1, "expected exactly one datagram, got {out:?}");
    (out[0].dst, decode(&out[0]))
}

/// The node of the member that owns `flow`: A's flows 0..4 belong to its
/// members 1, 2, 3, 1 and B's flows 4..8 to 11, 12, 11, 12.
fn node_of(flow: u16) -> u16 {
    if flow < 4 {
        A_MEMBERS[usize::from(flow) % 3]
    } else {
        [11, 12][usize::from(flow - 4) % 2]
    }
}

/// A packet of application `app` on `flow` with sequence number `seq` (and
/// its flip bit), from the flow's member to the server.
fn packet(kind: Kind, app: u16, flow: u16, seq: u32, pairs: Vec<Pair>) -> Packet {
    let server = if app == B { B_SERVER } else { A_SERVER };
    let mut h = Header::new(kind, app, node_of(flow), server);
    h.flow = flow;
    h.ext = Header::SEQUENCED;
    h.seq = seq;
    if (seq / WINDOW) & 1 == 1 {
        h.flags = Flags(Flags::FLIP);
    }
    Packet::pairs(h, pairs)
}

fn add(app: u16, flow: u16, seq: u32, pairs: Vec<Pair>) -> Packet {
    packet(Kind::Add, app, flow, seq, pairs)
}

/// An aggregation contribution of `flow` for `chunk` at slot `index`:
/// value `i` in group `i`.
fn agg(app: u16, flow: u16, chunk: u32, index: u16, values: &[i32]) -> Packet {
    let pairs = values
        .iter()
        .enumerate()
        .map(|(i, v)| Pair { key: i as u32, addr: Addr::new(0, i as u8, index), value: *v })
        .collect();
    let mut p = packet(Kind::Agg, app, flow, 0, pairs);
    p.header.aux = chunk;
    p
}

fn vote(app: u16, flow: u16, seq: u32, instance: u32, index: u16) -> Packet {
    let mut p = packet(
        Kind::Vote,
        app,
        flow,
        seq,
        vec![Pair { key: instance, addr: a(0, index), value: 1 }],
    );
    p.header.aux = instance;
    p
}

fn a(group: u8, index: u16) -> Addr {
    Addr::new(0, group, index)
}

fn pair(key: u32, addr: Addr, value: i32) -> Pair {
    Pair { key, addr, value }
}

fn swap(sw: &mut Switch, app: u16, addr: Addr, tag: u32, value: i32) {
    let r = sw.control(Control::Swap { app, addr, tag, value });
    assert!(matches!(r, ControlReply::Swapped { .. }), "swap {addr:?}: {r:?}");
}

fn read(sw: &mut Switch, app: u16, addrs: &[Addr]) -> Vec<(u32, i32)> {
    match sw.control(Control::Read { app, addrs: addrs.to_vec() }) {
        ControlReply::Cells(c) => c,
        r => panic!("read {addrs:?}: {r:?}"),
    }
}

fn read_meta(sw: &mut Switch, app: u16, indices: &[u32]) -> Vec<(u32, u32, u32, u64)> {
    match sw.control(Control::ReadMeta { app, indices: indices.to_vec() }) {
        ControlReply::Meta(m) => m,
        r => panic!("read meta {indices:?}: {r:?}"),
    }
}

fn reset_meta(sw: &mut Switch, app: u16, slots: &[(u32, u32)]) {
    let r = sw.control(Control::ResetMeta { app, slots: slots.to_vec() });
    assert_eq!(r, ControlReply::Done);
}

/// Cells (tag, value) and slots (tag, count, bits, overflow) as read back.
type Memory = (Vec<(u32, i32)>, Vec<(u32, u32, u32, u64)>);

/// Every cell and every slot of an application's memory.
fn dump(sw: &mut Switch, e: &AppEntry) -> Memory {
    let indices: Vec<u32> = (e.mem_base..e.mem_base + e.mem_len).collect();
    let addrs: Vec<Addr> =
        (0..GROUPS).flat_map(|g| indices.iter().map(move |i| a(g, *i as u16))).collect();
    (read(sw, e.app, &addrs), read_meta(sw, e.app, &indices))
}

fn refused(r: ControlReply) -> String {
    match r {
        ControlReply::Refused(why) => why,
        r => panic!("expected a refusal, got {r:?}"),
    }
}

/// Gives application B state everywhere: cells added through packets, a
/// completed aggregation slot, a vote slot with a vote.
fn give_b_state(sw: &mut Switch) {
    swap(sw, B, a(0, 16), 0xb0, 1);
    swap(sw, B, a(3, 31), 0xb1, -1);
    let out = send(sw, &add(B, 4, 0, vec![pair(0xb0, a(0, 16), 10), pair(0xb1, a(3, 31), -10)]));
    assert_eq!(only(&out).1.header.kind, Kind::Ack);
    send(sw, &agg(B, 4, 3, 20, &[1, 2]));
    assert_eq!(send(sw, &agg(B, 5, 3, 20, &[3, 4])).len(), 3, "B's result goes to 11, 12, 200");
    reset_meta(sw, B, &[(25, 0x77)]);
    send(sw, &vote(B, 6, 0, 0x77, 25));
}

// Configuration.

#[test]
fn validate_rejects_impossible_pipelines_with_the_reason() {
    let cases: Vec<(&str, SwitchConfig, &str)> = vec![
        (
            "too few stages for the groups",
            SwitchConfig { stages: 10, groups: 32, groups_per_stage: 4, ..config() },
            "32 groups at 4 per stage need 11 stages, the pipeline has 10",
        ),
        (
            "too few stages for one stage of groups",
            SwitchConfig { stages: 3, groups: 4, groups_per_stage: 4, ..config() },
            "4 groups at 4 per stage need 4 stages, the pipeline has 3",
        ),
        (
            "window not a power of two",
            SwitchConfig { window: 100, ..config() },
            "flow window 100 (a power of two, 2 to 65536)",
        ),
        (
            "window of one",
            SwitchConfig { window: 1, ..config() },
            "flow window 1 (a power of two, 2 to 65536)",
        ),
        (
            "window too large",
            SwitchConfig { window: 1 << 17, ..config() },
            "flow window 131072 (a power of two, 2 to 65536)",
        ),
        ("no groups", SwitchConfig { groups: 0, ..config() }, "0 register groups (1 to 64)"),
        (
            "more than 64 groups",
            SwitchConfig { groups: 65, stages: 255, ..config() },
            "65 register groups (1 to 64)",
        ),
        (
            "no groups per stage",
            SwitchConfig { groups_per_stage: 0, ..config() },
            "0 register groups per stage",
        ),
        (
            "more registers than 16-bit indices",
            SwitchConfig { registers: 65_537, ..config() },
            "65537 registers per array (1 to 65536)",
        ),
        (
            "no registers",
            SwitchConfig { registers: 0, ..config() },
            "0 registers per array (1 to 65536)",
        ),
        ("no flows", SwitchConfig { flows: 0, ..config() }, "0 flows"),
    ];
    for (what, c, message) in cases {
        assert_eq!(c.validate(), Err(ConfigError(message.into())), "{what}");
        let err = Switch::new(c).expect_err(what);
        assert_eq!(err.to_string(), message, "{what}");
    }
}

#[test]
fn validate_accepts_the_default_and_the_limits() {
    let cases = [
        SwitchConfig::default(),
        config(),
        SwitchConfig { groups: 64, groups_per_stage: 8, stages: 11, ..config() },
        SwitchConfig { groups: 1, groups_per_stage: 1, stages: 4, ..config() },
        SwitchConfig { registers: 65_536, ..config() },
        SwitchConfig { registers: 1, window: 2, flows: 1, ..config() },
        SwitchConfig { window: 65_536, ..config() },
    ];
    for c in cases {
        assert_eq!(c.validate(), Ok(()), "{c:?}");
    }
    assert_eq!(SwitchConfig::default().stages_needed(), 11);
}

// Installing and removing applications.

#[test]
fn install_refuses_overlaps_and_out_of_range_entries_with_a_precise_reason() {
    let cases: Vec<(&str, AppEntry, &str)> = vec![
        (
            "same id",
            AppEntry { mem_base: 40, flow_base: 20, ..app_a() },
            "application 1 is already installed",
        ),
        (
            "memory overlapping A",
            AppEntry { app: 3, mem_base: 15, mem_len: 1, flow_base: 20, ..app_a() },
            "application 3 overlaps application 1 (memory)",
        ),
        (
            "memory overlapping B",
            AppEntry { app: 3, mem_base: 31, mem_len: 8, flow_base: 20, ..app_a() },
            "application 3 overlaps application 2 (memory)",
        ),
        (
            "memory inside A",
            AppEntry { app: 3, mem_base: 4, mem_len: 1, flow_base: 20, ..app_a() },
            "application 3 overlaps application 1 (memory)",
        ),
        (
            "flows overlapping B",
            AppEntry { app: 3, mem_base: 40, flow_base: 7, flows: 2, ..app_a() },
            "application 3 overlaps application 2 (flows)",
        ),
        (
            "flows overlapping A",
            AppEntry { app: 3, mem_base: 40, flow_base: 0, flows: 1, ..app_a() },
            "application 3 overlaps application 1 (flows)",
        ),
        (
            "memory beyond the registers",
            AppEntry { app: 3, mem_base: 60, mem_len: 10, flow_base: 20, ..app_a() },
            "memory 60..70 beyond the 64 registers of a group",
        ),
        (
            "memory beyond u32",
            AppEntry { app: 3, mem_base: u32::MAX, mem_len: u32::MAX, flow_base: 20, ..app_a() },
            "memory 4294967295..8589934590 beyond the 64 registers of a group",
        ),
        (
            "flows beyond the flow arrays",
            AppEntry { app: 3, mem_base: 40, flow_base: 60, flows: 5, ..app_a() },
            "flows 60..65 beyond the data plane's 64 flows",
        ),
        (
            "test-and-set over more than 32 flows",
            AppEntry { app: 3, mem_base: 40, flow_base: 20, flows: 33, ..app_a() },
            "33 flows: test-and-set counting holds 32",
        ),
    ];
    let mut sw = switch();
    give_b_state(&mut sw);
    let before = dump(&mut sw, &app_b());
    for (what, entry, message) in cases {
        assert_eq!(refused(sw.control(Control::Install(entry))), message, "{what}");
    }
    assert_eq!(sw.apps().count(), 2);
    assert_eq!(dump(&mut sw, &app_b()), before, "a refused install zeroes nothing");
    // Adjacent ranges, and an empty memory anywhere, are fine.
    let adjacent =
        AppEntry { app: 3, mem_base: 32, mem_len: 32, flow_base: 8, flows: 40, ..app_a() };
    let adjacent = AppEntry { count: CountMode::Accumulate, ..adjacent };
    assert_eq!(sw.control(Control::Install(adjacent)), ControlReply::Done);
    let no_memory =
        AppEntry { app: 4, mem_base: 5, mem_len: 0, flow_base: 48, flows: 1, ..app_a() };
    assert_eq!(sw.control(Control::Install(no_memory)), ControlReply::Done);
    assert_eq!(sw.apps().count(), 4);
}

#[test]
fn removing_an_app_zeroes_only_its_memory_and_flow_bits() {
    let mut sw = switch();
    // A's state: a cell, an aggregation slot, a vote slot, a flow bit.
    swap(&mut sw, A, a(1, 2), 0xa0, 0);
    let first = add(A, 0, 0, vec![pair(0xa0, a(1, 2), 5)]);
    assert_eq!(only(&send(&mut sw, &first)).1.header.kind, Kind::Ack);
    send(&mut sw, &agg(A, 0, 1, 3, &[1, 2, 3, 4]));
    reset_meta(&mut sw, A, &[(4, 0x55)]);
    send(&mut sw, &vote(A, 1, 0, 0x55, 4));
    give_b_state(&mut sw);
    let b_before = dump(&mut sw, &app_b());
    let b_stats_before = sw.stats();

    assert_eq!(sw.control(Control::Remove { app: A }), ControlReply::Done);
    assert_eq!(dump(&mut sw, &app_b()), b_before, "B's registers are untouched");
    assert_eq!(
        refused(sw.control(Control::Read { app: A, addrs: vec![a(1, 2)] })),
        "application 1 is not installed"
    );
    assert_eq!(refused(sw.control(Control::Remove { app: A })), "application 1 is not installed");
    assert_eq!(sw.control(Control::LastSeen), ControlReply::LastSeen(vec![(B, 1)]));

    // Installed again, A's memory reads zero and its flows start over: the
    // very first packet is new again, not a retransmission.
    assert_eq!(sw.control(Control::Install(app_a())), ControlReply::Done);
    let (cells, metas) = dump(&mut sw, &app_a());
    assert!(cells.iter().all(|c| *c == (0, 0)), "{cells:?}");
    assert!(metas.iter().all(|m| *m == (0, 0, 0, 0)), "{metas:?}");
    swap(&mut sw, A, a(1, 2), 0xa0, 0);
    let (_, ack) = only(&send(&mut sw, &first));
    assert_eq!(ack.header.kind, Kind::Ack);
    assert!(!ack.header.flags.has(Flags::DUP));
    assert_eq!(read(&mut sw, A, &[a(1, 2)]), vec![(0xa0, 5)]);
    assert_eq!(sw.stats().duplicates, b_stats_before.duplicates);

    // B's flows were not reset: its first packet is still a retransmission.
    let b_again = add(B, 4, 0, vec![pair(0xb0, a(0, 16), 10), pair(0xb1, a(3, 31), -10)]);
    let (_, ack) = only(&send(&mut sw, &b_again));
    assert_eq!(ack.header.mask, 0b11);
    assert_eq!(sw.stats().duplicates, b_stats_before.duplicates + 1);
    assert_eq!(dump(&mut sw, &app_b()), b_before);
}

#[test]
fn last_seen_reports_the_now_of_the_last_admitted_packet_per_app() {
    let mut sw = switch();
    assert_eq!(sw.control(Control::LastSeen), ControlReply::LastSeen(vec![(A, 0), (B, 0)]));
    let pa = sealed(&add(A, 0, 0, vec![]));
    let pb = sealed(&add(B, 4, 0, vec![]));
    send_bytes(&mut sw, 10, 0, &pa);
    send_bytes(&mut sw, 20, 0, &pb);
    send_bytes(&mut sw, 30, 0, &pa);
    assert_eq!(sw.control(Control::LastSeen), ControlReply::LastSeen(vec![(A, 30), (B, 20)]));
    // Not admitted (a flow outside A's range), malformed, or not a kind
    // the data plane computes on: not seen.
    send_bytes(&mut sw, 40, 0, &sealed(&add(A, 10, 0, vec![])));
    send_bytes(&mut sw, 50, 0, &pa[..10]);
    let mut ack = add(A, 0, 0, vec![]);
    ack.header.kind = Kind::Ack;
    send_bytes(&mut sw, 60, 0, &sealed(&ack));
    assert_eq!(sw.control(Control::LastSeen), ControlReply::LastSeen(vec![(A, 30), (B, 20)]));
}

#[test]
fn control_requests_outside_the_apps_memory_are_refused() {
    let mut sw = switch();
    let cases: Vec<(Control, &str)> = vec![
        (
            Control::Swap { app: A, addr: a(0, 16), tag: 1, value: 1 },
            "Addr(0/0/16) is outside application 1's memory",
        ),
        (
            Control::Swap { app: A, addr: a(4, 0), tag: 1, value: 1 },
            "Addr(0/4/0) is not a register group of switch 0",
        ),
        (
            Control::Swap { app: A, addr: Addr::new(1, 0, 0), tag: 1, value: 1 },
            "Addr(1/0/0) is not a register group of switch 0",
        ),
        (
            Control::Swap { app: NOBODY, addr: a(0, 0), tag: 1, value: 1 },
            "application 9 is not installed",
        ),
        (
            Control::Read { app: A, addrs: vec![a(0, 0), a(0, 20)] },
            "Addr(0/0/20) is outside application 1's memory",
        ),
        (
            Control::ReadMeta { app: B, indices: vec![16, 15] },
            "index 15 is outside application 2's memory",
        ),
        (
            Control::ResetMeta { app: A, slots: vec![(3, 1), (16, 1)] },
            "index 16 is outside application 1's memory",
        ),
        (Control::Members { app: NOBODY, members: vec![] }, "application 9 is not installed"),
    ];
    give_b_state(&mut sw);
    let before = dump(&mut sw, &app_b());
    for (c, message) in cases {
        assert_eq!(refused(sw.control(c.clone())), message, "{c:?}");
    }
    assert_eq!(dump(&mut sw, &app_b()), before);
    assert_eq!(read_meta(&mut sw, A, &[3]), vec![(0, 0, 0, 0)], "a refused reset resets nothing");
}

// Map.addTo.

#[test]
fn an_add_whose_tags_match_is_applied_and_acked_by_the_switch() {
    let mut sw = switch();
    swap(&mut sw, A, a(0, 3), 0xaaa, 1);
    swap(&mut sw, A, a(1, 5), 0xbbb, 0);
    let mut p = add(A, 2, 0, vec![pair(0xaaa, a(0, 3), 5), pair(0xbbb, a(1, 5), -7)]);
    p.header.aux = 42;
    let (dst, ack) = only(&send(&mut sw, &p));
    assert_eq!(dst, node_of(2));
    let mut want = Header::new(Kind::Ack, A, A_SERVER, node_of(2));
    want.flow = 2;
    want.seq = 0;
    want.aux = 42;
    want.mask = 0b11;
    want.ext = Header::BY_SWITCH;
    assert_eq!(ack, Packet::pairs(want, vec![]));
    assert_eq!(read(&mut sw, A, &[a(0, 3), a(1, 5)]), vec![(0xaaa, 6), (0xbbb, -7)]);
    let s = sw.stats();
    assert_eq!((s.applied, s.acks, s.forwarded, s.missed), (2, 1, 0, 0));
}

#[test]
fn pairs_the_switch_cannot_apply_go_to_the_server_with_the_applied_mask() {
    // Pair 0 always applies (cell 0/3 tagged 0xaaa); pair 1 is the case.
    let cases: Vec<(&str, Pair)> = vec![
        ("wrong tag", pair(0xccc, a(1, 5), 7)),
        ("index in B's memory", pair(0xb0, a(1, 16), 7)),
        ("index beyond every memory", pair(0xddd, a(1, 63), 7)),
        ("second pair on the same group", pair(0xeee, a(0, 4), 7)),
        ("group beyond the switch's", pair(0xfff, a(GROUPS, 5), 7)),
        ("another switch of the chain", pair(0xddd, Addr::new(1, 1, 5), 7)),
        ("no address", pair(0xddd, Addr::NONE, 7)),
    ];
    for (what, second) in cases {
        let mut sw = switch();
        swap(&mut sw, A, a(0, 3), 0xaaa, 0);
        swap(&mut sw, A, a(1, 5), 0xbbb, 0);
        swap(&mut sw, A, a(0, 4), 0xeee, 0);
        swap(&mut sw, B, a(1, 16), 0xb0, 100);
        let b_before = dump(&mut sw, &app_b());
        let p = add(A, 1, 3, vec![pair(0xaaa, a(0, 3), 5), second]);
        let (dst, fwd) = only(&send(&mut sw, &p));
        assert_eq!(dst, A_SERVER, "{what}");
        let mut want = p.clone();
        want.header.flags = Flags(Flags::FORWARDED);
        want.header.mask = 0b01;
        want.header.hop();
        assert_eq!(fwd, want, "{what}: forwarded as is, with the mask");
        assert_eq!(
            read(&mut sw, A, &[a(0, 3), a(1, 5), a(0, 4)]),
            vec![(0xaaa, 5), (0xbbb, 0), (0xeee, 0)],
            "{what}"
        );
        assert_eq!(dump(&mut sw, &app_b()), b_before, "{what}");
        let s = sw.stats();
        assert_eq!((s.applied, s.forwarded, s.acks), (1, 1, 0), "{what}");
    }
}

#[test]
fn a_retransmitted_add_applies_nothing_and_carries_the_first_mask() {
    let mut sw = switch();
    swap(&mut sw, A, a(0, 3), 0xaaa, 0);
    let p = add(A, 1, 5, vec![pair(0xaaa, a(0, 3), 5), pair(0xbbb, a(1, 5), 7)]);
    let (_, first) = only(&send(&mut sw, &p));
    assert_eq!(first.header.mask, 0b01);
    // Meanwhile the server agent gives 0xbbb a cell: the retransmission
    // still must not apply it (the server agent applies it).
    swap(&mut sw, A, a(1, 5), 0xbbb, 0);
    let (dst, again) = only(&send(&mut sw, &p));
    assert_eq!(dst, A_SERVER);
    assert_eq!(again.header.flags, Flags(Flags::FORWARDED | Flags::DUP));
    assert_eq!(again.header.mask, 0b01);
    assert_eq!(read(&mut sw, A, &[a(0, 3), a(1, 5)]), vec![(0xaaa, 5), (0xbbb, 0)]);

    // A fully applied packet is acked again, and still applied once.
    let q = add(A, 1, 6, vec![pair(0xaaa, a(0, 3), 1), pair(0xbbb, a(1, 5), 1)]);
    for _ in 0..2 {
        let (dst, ack) = only(&send(&mut sw, &q));
        assert_eq!(
            (dst, ack.header.kind, ack.header.seq, ack.header.mask),
            (node_of(1), Kind::Ack, 6, 0b11)
        );
    }
    assert_eq!(read(&mut sw, A, &[a(0, 3), a(1, 5)]), vec![(0xaaa, 6), (0xbbb, 1)]);
    assert_eq!(sw.stats().duplicates, 2);
    assert_eq!(sw.stats().applied, 3);
}

#[test]
fn the_next_round_of_a_flow_slot_is_new_again() {
    let mut sw = switch();
    swap(&mut sw, A, a(2, 7), 0x77, 0);
    let cell = |sw: &mut Switch| read(sw, A, &[a(2, 7)])[0].1;
    // seq, window apart: 0 (flip 0), 8 (flip 1), 16 (flip 0).
    for (round, seq) in [0u32, WINDOW, 2 * WINDOW].into_iter().enumerate() {
        let p = add(A, 3, seq, vec![pair(0x77, a(2, 7), 1)]);
        assert_eq!(p.header.flags.has(Flags::FLIP), round % 2 == 1);
        let (_, ack) = only(&send(&mut sw, &p));
        assert!(!ack.header.flags.has(Flags::DUP));
        assert_eq!(cell(&mut sw), round as i32 + 1, "round {round} is applied");
        let (_, ack) = only(&send(&mut sw, &p));
        assert_eq!(ack.header.kind, Kind::Ack);
        assert_eq!(cell(&mut sw), round as i32 + 1, "round {round}'s copy is not");
    }
    assert_eq!(sw.stats().duplicates, 3);
}

#[test]
fn an_add_that_would_overflow_is_not_applied() {
    let cases = [(i32::MAX - 1, 5), (i32::MIN + 1, -2), (i32::MAX, 1), (i32::MIN, i32::MIN)];
    for (start, v) in cases {
        let mut sw = switch();
        swap(&mut sw, A, a(0, 1), 0x11, start);
        let p = add(A, 0, 0, vec![pair(0x11, a(0, 1), v)]);
        let (dst, fwd) = only(&send(&mut sw, &p));
        assert_eq!(dst, A_SERVER);
        assert_eq!((fwd.header.kind, fwd.header.mask), (Kind::Add, 0));
        assert!(fwd.header.flags.has(Flags::FORWARDED));
        assert_eq!(read(&mut sw, A, &[a(0, 1)]), vec![(0x11, start)], "{start} + {v}");
        assert_eq!(sw.stats().overflowed, 1);
        assert_eq!(sw.stats().applied, 0);
    }
}

// Synchronous aggregation.

#[test]
fn agg_contributions_complete_the_slot_and_go_to_the_destinations_with_exact_sums() {
    let cases = [
        (Destinations::Members, vec![1, 2, 3]),
        (Destinations::Both, vec![1, 2, 3, A_SERVER]),
        (Destinations::Server, vec![A_SERVER]),
    ];
    let vectors: [[i32; 4]; 3] = [[1, 2, 3, 4], [10, 20, 30, -40], [100, 200, 300, 400]];
    for (forward, dsts) in cases {
        let mut sw = switch_with(&[AppEntry { forward, ..app_a() }, app_b()]);
        for (flow, v) in vectors.iter().enumerate().take(2) {
            assert!(send(&mut sw, &agg(A, flow as u16, 7, 5, v)).is_empty(), "counted: consumed");
        }
        assert_eq!(read_meta(&mut sw, A, &[5]), vec![(7, 2, 0b011, 0)]);
        let out = send(&mut sw, &agg(A, 2, 7, 5, &vectors[2]));
        assert_eq!(out.iter().map(|e| e.dst).collect::<Vec<_>>(), dsts, "{forward:?}");
        for e in &out {
            let r = decode(e);
            assert_eq!(r.header.kind, Kind::Result);
            assert_eq!((r.header.src, r.header.dst, r.header.aux), (SWITCH, e.dst, 7));
            assert_eq!((r.header.flags, r.header.mask), (Flags(0), 0));
            let sums: Vec<i32> = r.pair_items().iter().map(|p| p.value).collect();
            assert_eq!(sums, vec![111, 222, 333, 364]);
            let addrs: Vec<Addr> = r.pair_items().iter().map(|p| p.addr).collect();
            assert_eq!(addrs, (0..4).map(|g| a(g, 5)).collect::<Vec<_>>());
        }
        assert_eq!(read_meta(&mut sw, A, &[5]), vec![(7, 3, 0b111, 0)]);
        assert_eq!(sw.stats().results, 1);
    }
}

#[test]
fn a_duplicate_contribution_is_dropped_before_completion_and_answered_after() {
    let mut sw = switch();
    let p0 = agg(A, 0, 2, 9, &[5, 6]);
    assert!(send(&mut sw, &p0).is_empty());
    assert!(send(&mut sw, &p0).is_empty(), "a duplicate of an incomplete chunk is dropped");
    assert_eq!(sw.stats().duplicates, 1);
    assert!(send(&mut sw, &agg(A, 1, 2, 9, &[1, 1])).is_empty());
    let out = send(&mut sw, &agg(A, 2, 2, 9, &[1, 1]));
    assert_eq!(out.len(), 3);
    assert_eq!(decode(&out[0]).pair_items()[0].value, 7, "the duplicate was not added");

    // After completion, the same contributor's copy gets the result alone.
    let (dst, r) = only(&send(&mut sw, &p0));
    assert_eq!(dst, node_of(0));
    assert_eq!(r.header.kind, Kind::Result);
    assert_eq!(r.header.dst, node_of(0));
    assert_eq!(r.header.flags, Flags(Flags::DUP));
    assert_eq!(r.pair_items().iter().map(|p| p.value).collect::<Vec<_>>(), vec![7, 8]);
    assert_eq!(read_meta(&mut sw, A, &[9]), vec![(2, 3, 0b111, 0)]);
    assert_eq!(sw.stats().results, 2);
}

#[test]
fn a_contribution_for_an_older_chunk_goes_to_the_server_as_stale() {
    let mut sw = switch();
    assert!(send(&mut sw, &agg(A, 0, 5, 1, &[1])).is_empty());
    let old = agg(A, 1, 4, 1, &[9]);
    let (dst, fwd) = only(&send(&mut sw, &old));
    assert_eq!(dst, A_SERVER);
    let mut want = old;
    want.header.flags = Flags(Flags::STALE | Flags::FORWARDED);
    want.header.hop();
    assert_eq!(fwd, want);
    assert_eq!(read_meta(&mut sw, A, &[1]), vec![(5, 1, 0b001, 0)]);
    assert_eq!(read(&mut sw, A, &[a(0, 1)]), vec![(0, 1)]);
    // Also across the wrap-around of chunk ids.
    let mut sw = switch();
    assert!(send(&mut sw, &agg(A, 0, 1, 1, &[1])).is_empty());
    let (_, fwd) = only(&send(&mut sw, &agg(A, 1, u32::MAX, 1, &[1])));
    assert!(fwd.header.flags.has(Flags::STALE));
}

#[test]
fn a_newer_chunk_resets_the_slot() {
    let mut sw = switch();
    for flow in 0..3 {
        send(&mut sw, &agg(A, flow, 0, 2, &[1000, i32::MAX - 10]));
    }
    assert_eq!(read_meta(&mut sw, A, &[2]).first().map(|m| m.1), Some(3));
    // Chunk 16 reuses the slot: the first packet starts it over.
    assert!(send(&mut sw, &agg(A, 1, 16, 2, &[7, 8])).is_empty());
    assert_eq!(read_meta(&mut sw, A, &[2]), vec![(16, 1, 0b010, 0)]);
    assert_eq!(read(&mut sw, A, &[a(0, 2), a(1, 2)]), vec![(0, 7), (0, 8)]);
    assert!(send(&mut sw, &agg(A, 0, 16, 2, &[1, 1])).is_empty());
    let out = send(&mut sw, &agg(A, 2, 16, 2, &[2, 2]));
    let r = decode(&out[0]);
    assert_eq!(r.header.flags, Flags(0), "the old chunk's overflow is gone");
    assert_eq!(r.pair_items().iter().map(|p| p.value).collect::<Vec<_>>(), vec![10, 11]);
}

#[test]
fn an_overflowing_contribution_sets_the_overflow_flag_and_mask_bit() {
    let mut sw = switch();
    assert!(send(&mut sw, &agg(A, 0, 0, 3, &[1, i32::MAX, 3])).is_empty());
    assert!(send(&mut sw, &agg(A, 1, 0, 3, &[1, 1, 3])).is_empty());
    assert_eq!(read_meta(&mut sw, A, &[3]), vec![(0, 2, 0b011, 0b010)]);
    let out = send(&mut sw, &agg(A, 2, 0, 3, &[1, 1, i32::MIN]));
    assert_eq!(out.len(), 3);
    let r = decode(&out[0]);
    assert_eq!(r.header.flags, Flags(Flags::OVERFLOW));
    assert_eq!(r.header.mask, 0b010);
    let values: Vec<i32> = r.pair_items().iter().map(|p| p.value).collect();
    assert_eq!(values[0], 3);
    assert_eq!(values[2], i32::MIN + 6);
    assert_eq!(read_meta(&mut sw, A, &[3]), vec![(0, 3, 0b111, 0b010)]);
    // Members 1 and 2 both found position 1 full (i32::MAX + 1).
    assert_eq!(sw.stats().overflowed, 2);
}

#[test]
fn an_agg_with_misplaced_pairs_goes_to_the_server() {
    let cases: Vec<(&str, Vec<Pair>)> = vec![
        ("group not its position", vec![pair(0, a(1, 2), 1)]),
        ("two slot indices", vec![pair(0, a(0, 2), 1), pair(1, a(1, 3), 1)]),
        ("slot in B's memory", vec![pair(0, a(0, 20), 1)]),
        (
            "position beyond this switch's groups",
            (0..5).map(|i| pair(i, a(i as u8 % GROUPS, 2), 1)).collect(),
        ),
        ("no pair for this switch", vec![pair(0, Addr::NONE, 1)]),
    ];
    for (what, pairs) in cases {
        let mut sw = switch();
        give_b_state(&mut sw);
        let b_before = dump(&mut sw, &app_b());
        let mut p = packet(Kind::Agg, A, 0, 0, pairs);
        p.header.aux = 1;
        let (dst, fwd) = only(&send(&mut sw, &p));
        assert_eq!(dst, A_SERVER, "{what}");
        assert_eq!(fwd.header.flags, Flags(Flags::FORWARDED), "{what}");
        assert_eq!(read_meta(&mut sw, A, &[2, 3]), vec![(0, 0, 0, 0); 2], "{what}");
        assert_eq!(dump(&mut sw, &app_b()), b_before, "{what}");
    }
}

// Votes (CntFwd).

#[test]
fn votes_reach_the_quorum_exactly_once_and_each_is_acked() {
    // Flow 4 is a fifth flow of A here, its member at node 11.
    let five = AppEntry { flows: 5, members: vec![1, 2, 3, 11], ..app_a() };
    let mut sw = switch_with(&[five, AppEntry { flow_base: 8, members: vec![], ..app_b() }]);
    reset_meta(&mut sw, A, &[(6, 77)]);
    let mut results = 0;
    for (flow, seq) in [(0u16, 0u32), (1, 0), (2, 0), (3, 0), (0, 1), (4, 0)] {
        let out = send(&mut sw, &vote(A, flow, seq, 77, 6));
        let (ack_dst, ack) = (out[out.len() - 1].dst, decode(&out[out.len() - 1]));
        assert_eq!(ack_dst, node_of(flow));
        assert_eq!((ack.header.kind, ack.header.seq, ack.header.mask), (Kind::Ack, seq, 1));
        for e in &out[..out.len() - 1] {
            let r = decode(e);
            assert_eq!(r.header.kind, Kind::Result);
            assert_eq!(r.header.flags, Flags(Flags::QUORUM));
            assert_eq!((r.header.src, r.header.aux), (SWITCH, 77));
            assert_eq!(r.pair_items(), &[pair(77, a(0, 6), 1)]);
            results += 1;
        }
        if flow == 2 {
            let dsts = out.iter().map(|e| e.dst).collect::<Vec<_>>();
            assert_eq!(dsts, vec![1, 2, 3, 11, node_of(2)]);
        } else {
            assert_eq!(out.len(), 1, "vote of flow {flow} seq {seq}: only the ack");
        }
    }
    assert_eq!(results, 4, "one result, to each of the four members");
    assert_eq!(read_meta(&mut sw, A, &[6]), vec![(77, 5, 0b11111, 0)]);
    assert_eq!(sw.stats().results, 1);
}

#[test]
fn a_retransmitted_vote_is_acked_without_counting_again() {
    let mut sw = switch();
    reset_meta(&mut sw, A, &[(6, 77)]);
    let v = vote(A, 0, 0, 77, 6);
    for _ in 0..3 {
        let (dst, ack) = only(&send(&mut sw, &v));
        assert_eq!((dst, ack.header.kind, ack.header.mask), (node_of(0), Kind::Ack, 1));
    }
    assert_eq!(read_meta(&mut sw, A, &[6]), vec![(77, 1, 0b1, 0)]);
    assert_eq!(sw.stats().duplicates, 2);
}

#[test]
fn a_vote_the_switch_cannot_count_goes_to_the_server() {
    let cases: Vec<(&str, Pair)> = vec![
        ("slot tag is another instance", pair(78, a(0, 6), 1)),
        ("slot never opened", pair(79, a(0, 7), 1)),
        ("slot in B's memory", pair(0x77, a(0, 25), 1)),
        ("no address", pair(77, Addr::NONE, 1)),
    ];
    for (what, vp) in cases {
        let mut sw = switch();
        reset_meta(&mut sw, A, &[(6, 77)]);
        give_b_state(&mut sw);
        let b_before = dump(&mut sw, &app_b());
        let mut v = packet(Kind::Vote, A, 1, 0, vec![vp]);
        v.header.aux = vp.key;
        let (dst, fwd) = only(&send(&mut sw, &v));
        assert_eq!(dst, A_SERVER, "{what}");
        let mut want = v.clone();
        want.header.flags = Flags(Flags::FORWARDED);
        want.header.hop();
        assert_eq!(fwd, want, "{what}");
        assert_eq!(read_meta(&mut sw, A, &[6, 7]), vec![(77, 0, 0, 0), (0, 0, 0, 0)], "{what}");
        assert_eq!(dump(&mut sw, &app_b()), b_before, "{what}");
        // Its retransmission is forwarded again (the stored mask is 0).
        let (_, again) = only(&send(&mut sw, &v));
        assert_eq!(again.header.flags, Flags(Flags::FORWARDED | Flags::DUP), "{what}");
    }
}

#[test]
fn accumulated_votes_reach_the_threshold_by_weight_once() {
    let entry = AppEntry { count: CountMode::Accumulate, threshold: 10, ..app_a() };
    let mut sw = switch_with(&[entry, app_b()]);
    reset_meta(&mut sw, A, &[(6, 77)]);
    let mut quorums = 0;
    for (seq, weight) in [(0u32, 4), (1, 5), (2, 3), (3, 7)] {
        let mut v = vote(A, 0, seq, 77, 6);
        if let Items::Pairs(p) = &mut v.items {
            p[0].value = weight;
        }
        let out = send(&mut sw, &v);
        quorums += out.iter().filter(|e| decode(e).header.kind == Kind::Result).count();
        if seq == 2 {
            assert_eq!(out.len(), 4, "the vote that reaches 12 >= 10 is forwarded");
        }
    }
    assert_eq!(quorums, 3);
    assert_eq!(read_meta(&mut sw, A, &[6]), vec![(77, 19, 0, 0)]);
}

// Stream.modify.

#[test]
fn modify_ops_compute_and_report_overflow() {
    use ModifyOp::*;
    let cases: Vec<(ModifyOp, i32, i32, Option<i32>)> = vec![
        (Add, 1, 2, Some(3)),
        (Add, -5, 2, Some(-3)),
        (Add, i32::MAX, 1, None),
        (Add, i32::MIN, -1, None),
        (Max, 3, 5, Some(5)),
        (Max, -3, -5, Some(-3)),
        (Min, 3, 5, Some(3)),
        (And, 0b1100, 0b1010, Some(0b1000)),
        (Or, 0b1100, 0b1010, Some(0b1110)),
        (Shl, 3, 2, Some(12)),
        (Shl, -3, 2, Some(-12)),
        (Shl, -1, 31, Some(i32::MIN)),
        (Shl, 1, 31, None),
        (Shl, 0x4000_0000, 1, None),
        (Shl, 1, 32, None),
        (Shl, 1, -1, None),
        (Shl, 0, 31, Some(0)),
        (Shr, -8, 1, Some(-4)),
        (Shr, 8, 3, Some(1)),
        (Shr, 1, 32, None),
        (Shr, 1, -1, None),
    ];
    for (op, v, p, want) in cases {
        assert_eq!(op.apply(v, p), want, "{op:?}({v}, {p})");
        if let Some(w) = want {
            assert_eq!(op.apply_wide(i64::from(v), p), i64::from(w), "{op:?} wide ({v}, {p})");
        }
    }
    assert_eq!(Add.apply_wide(i64::from(i32::MAX), 1), 1 << 31);
    assert_eq!(Shl.apply_wide(1, 31), 1 << 31);
}

#[test]
fn the_switch_applies_modify_to_add_and_agg_values() {
    let entry = AppEntry { modify: Some((ModifyOp::Shl, 2)), ..app_a() };
    let mut sw = switch_with(&[entry, app_b()]);
    swap(&mut sw, A, a(0, 1), 0x11, 1);
    let (_, ack) = only(&send(&mut sw, &add(A, 0, 0, vec![pair(0x11, a(0, 1), 3)])));
    assert_eq!(ack.header.kind, Kind::Ack);
    assert_eq!(read(&mut sw, A, &[a(0, 1)]), vec![(0x11, 13)]);
    // 2^30 << 2 does not fit: not applied, left for the server agent.
    let (dst, fwd) = only(&send(&mut sw, &add(A, 0, 1, vec![pair(0x11, a(0, 1), 1 << 30)])));
    assert_eq!((dst, fwd.header.mask), (A_SERVER, 0));
    assert_eq!(read(&mut sw, A, &[a(0, 1)]), vec![(0x11, 13)]);
    assert_eq!(sw.stats().overflowed, 1);

    let entry = AppEntry { modify: Some((ModifyOp::Max, 0)), ..app_a() };
    let mut sw = switch_with(&[entry, app_b()]);
    send(&mut sw, &agg(A, 0, 0, 1, &[-5, 5]));
    send(&mut sw, &agg(A, 1, 0, 1, &[-5, 5]));
    let out = send(&mut sw, &agg(A, 2, 0, 1, &[-5, 5]));
    let sums: Vec<i32> = decode(&out[0]).pair_items().iter().map(|p| p.value).collect();
    assert_eq!(sums, vec![0, 15]);

    // A modify that overflows an aggregation value marks the position.
    let entry = AppEntry { modify: Some((ModifyOp::Add, i32::MAX)), ..app_a() };
    let mut sw = switch_with(&[entry, app_b()]);
    send(&mut sw, &agg(A, 0, 0, 1, &[0, 1]));
    send(&mut sw, &agg(A, 1, 0, 1, &[0, -1]));
    let out = send(&mut sw, &agg(A, 2, 0, 1, &[0, -1]));
    let r = decode(&out[0]);
    assert!(r.header.flags.has(Flags::OVERFLOW));
    assert_eq!(r.header.mask & 0b11, 0b11, "{:?}", r.header);
}

// ECN.

#[test]
fn a_queue_above_the_threshold_marks_what_the_switch_emits() {
    // (what, queue depth, expect ECN)
    let depths = [(4u32, false), (5, true), (1000, true)];
    for (depth, ecn) in depths {
        let mut sw = switch();
        swap(&mut sw, A, a(0, 1), 0x11, 0);
        reset_meta(&mut sw, A, &[(6, 77)]);
        let mut emitted = Vec::new();
        let mut go = |p: &Packet| emitted.extend(send_bytes(&mut sw, 1, depth, &sealed(p)));
        go(&add(A, 0, 0, vec![pair(0x11, a(0, 1), 1)])); // acked by the switch
        go(&add(A, 0, 1, vec![pair(0x12, a(0, 1), 1)])); // forwarded to the server
        for flow in 0..3 {
            go(&agg(A, flow, 0, 2, &[1])); // multicast result
        }
        for flow in 0..3 {
            go(&vote(A, flow, 2, 77, 6)); // acks and a result
        }
        go(&add(NOBODY, 0, 0, vec![])); // not admitted: dropped
        go(&add(B, 4, 0, vec![])); // another app's ack
        assert_eq!(emitted.len(), 1 + 1 + 3 + 3 + 3 + 1);
        for e in &emitted {
            let p = decode(e);
            assert_eq!(p.header.flags.has(Flags::ECN), ecn, "depth {depth}: {:?}", p.header);
        }
        assert_eq!(sw.stats().ecn_marked, if ecn { 9 } else { 0 });
    }
}

// Admission and parsing.

#[test]
fn packets_of_applications_or_flows_it_does_not_hold_are_dropped_and_counted() {
    let cases: Vec<(&str, Packet, bool)> = vec![
        ("app not installed: add", add(NOBODY, 0, 0, vec![pair(0xa0, a(0, 1), 1)]), true),
        ("app not installed: agg", agg(NOBODY, 0, 0, 1, &[1, 2]), true),
        ("app not installed: vote", vote(NOBODY, 0, 0, 77, 6), true),
        ("A's id on one of B's flows", add(A, 4, 0, vec![pair(0xb0, a(0, 16), 1)]), false),
        ("A's id on a flow nobody has", agg(A, 40, 0, 1, &[1]), false),
        ("B's id on one of A's flows", vote(B, 0, 0, 0x77, 25), false),
    ];
    for (what, p, unknown_app) in cases {
        let mut sw = switch();
        swap(&mut sw, A, a(0, 1), 0xa0, 0);
        reset_meta(&mut sw, A, &[(6, 77)]);
        give_b_state(&mut sw);
        let (a_before, b_before) = (dump(&mut sw, &app_a()), dump(&mut sw, &app_b()));
        let stats = sw.stats();
        let out = send(&mut sw, &p);
        assert!(out.is_empty(), "{what}: {out:?}");
        let s = sw.stats();
        assert_eq!(s.not_admitted, stats.not_admitted + u64::from(unknown_app), "{what}");
        assert_eq!(s.refused, stats.refused + u64::from(!unknown_app), "{what}");
        assert_eq!(s.applied, stats.applied, "{what}");
        assert_eq!(dump(&mut sw, &app_a()), a_before, "{what}");
        assert_eq!(dump(&mut sw, &app_b()), b_before, "{what}");
        assert_eq!(sw.control(Control::LastSeen), ControlReply::LastSeen(vec![(A, 0), (B, 1)]));
    }
}

#[test]
fn kinds_the_data_plane_does_not_compute_pass_through_uncounted() {
    let mut sw = switch();
    let hopped = |p: &Packet| {
        let mut p = p.clone();
        assert!(p.header.hop());
        p
    };
    for kind in [Kind::Result, Kind::Ack] {
        let mut p = packet(kind, A, 0, 0, vec![pair(1, a(0, 1), 1)]);
        (p.header.src, p.header.dst) = (A_SERVER, 1);
        let (dst, got) = only(&send(&mut sw, &p));
        assert_eq!((dst, got), (1, hopped(&p)), "{kind:?}");
    }
    let mut h = Header::new(Kind::Wide, A, 1, A_SERVER);
    h.flow = 0;
    let w = Packet::wide(
        h,
        vec![crate::packet::Wide { op: crate::packet::WideOp::Add, key: b"k".to_vec(), value: 1 }],
    );
    let (dst, got) = only(&send(&mut sw, &w));
    assert_eq!((dst, got), (A_SERVER, hopped(&w)));
    assert_eq!((sw.stats().not_admitted, sw.stats().refused), (0, 0));
    assert_eq!(sw.stats().packets, 3);
}

#[test]
fn a_forged_packet_is_dropped_before_it_touches_a_register() {
    let mut sw = switch();
    swap(&mut sw, A, a(0, 1), 0x11, 0);
    let p = add(A, 0, 0, vec![pair(0x11, a(0, 1), 5)]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("no MAC", p.to_bytes()),
        ("another application's key", p.seal(&KEY_B)),
        ("a value changed after sealing", {
            let mut b = sealed(&p);
            let at = crate::packet::HEADER_LEN + 11;
            b[at] ^= 1;
            b
        }),
    ];
    for (what, bytes) in &cases {
        assert!(send_bytes(&mut sw, 1, 0, bytes).is_empty(), "{what}");
    }
    assert_eq!(sw.stats().forged, cases.len() as u64);
    assert_eq!(read(&mut sw, A, &[a(0, 1)]), vec![(0x11, 0)], "no forged add applied");
    // The real packet still applies (the forgeries took no flip bit).
    assert_eq!(only(&send(&mut sw, &p)).1.header.kind, Kind::Ack);
    assert_eq!(read(&mut sw, A, &[a(0, 1)]), vec![(0x11, 5)]);
}

#[test]
fn the_switch_relays_only_between_an_applications_nodes_and_never_in_a_loop() {
    let mut sw = switch();
    let from = |src: u16, dst: u16| {
        let mut h = Header::new(Kind::Wide, A, src, dst);
        h.flow = 0;
        Packet::wide(h, vec![])
    };
    let cases = [
        ("to an arbitrary local port", from(1, 22)),
        ("to the switch itself", from(1, SWITCH)),
        ("to another application's server", from(1, B_SERVER)),
        ("from a node that is not a member", from(77, A_SERVER)),
        ("from the server to itself", from(A_SERVER, A_SERVER)),
    ];
    for (what, p) in &cases {
        assert!(send(&mut sw, p).is_empty(), "{what}");
    }
    assert_eq!(sw.stats().refused, cases.len() as u64);
    // A packet that has crossed MAX_HOPS switches is in a loop.
    let mut looping = from(1, A_SERVER);
    while looping.header.hop() {}
    assert!(send(&mut sw, &looping).is_empty());
    assert_eq!(sw.stats().refused, cases.len() as u64 + 1);
    // Between the application's nodes, either way: relayed.
    assert_eq!(only(&send(&mut sw, &from(1, A_SERVER))).0, A_SERVER);
    assert_eq!(only(&send(&mut sw, &from(A_SERVER, 2))).0, 2);
}

#[test]
fn a_restarted_member_starts_over_and_its_old_incarnation_is_refused() {
    let mut sw = switch();
    swap(&mut sw, A, a(0, 1), 0x11, 0);
    let old = add(A, 0, 0, vec![pair(0x11, a(0, 1), 1)]);
    assert_eq!(only(&send(&mut sw, &old)).1.header.kind, Kind::Ack);
    // The member restarts: the controller gives it incarnation 1.
    let reset = Control::Flows { app: A, flows: vec![0], incarnation: 1 };
    assert_eq!(sw.control(reset), ControlReply::Done);
    // Its first packet has sequence number 0 again and is new, not a
    // retransmission of the old incarnation's packet 0.
    let mut new = add(A, 0, 0, vec![pair(0x11, a(0, 1), 10)]);
    new.header.set_incarnation(1);
    let (_, ack) = only(&send(&mut sw, &new));
    assert_eq!((ack.header.kind, ack.header.incarnation()), (Kind::Ack, 1));
    assert_eq!(read(&mut sw, A, &[a(0, 1)]), vec![(0x11, 11)]);
    // A late packet of the old incarnation is refused.
    let late = add(A, 0, 1, vec![pair(0x11, a(0, 1), 100)]);
    assert!(send(&mut sw, &late).is_empty());
    assert_eq!(sw.stats().refused, 1);
    assert_eq!(read(&mut sw, A, &[a(0, 1)]), vec![(0x11, 11)]);
    // Flows outside the application are refused by the control plane.
    let why = refused(sw.control(Control::Flows { app: A, flows: vec![4], incarnation: 2 }));
    assert_eq!(why, "flow 4 is not one of application 1's");
    // The controller can read what each flow admits.
    match sw.control(Control::Apps) {
        ControlReply::Apps(apps) => {
            assert_eq!(apps.len(), 2);
            assert_eq!(apps[0], (app_a(), vec![1, 0, 0, 0]));
        }
        r => panic!("{r:?}"),
    }
}

#[test]
fn a_replayed_packet_older_than_half_a_window_is_refused() {
    let mut sw = switch();
    swap(&mut sw, A, a(0, 1), 0x11, 0);
    let first = add(A, 0, 0, vec![pair(0x11, a(0, 1), 1)]);
    send(&mut sw, &first);
    for seq in 1..=WINDOW {
        send(&mut sw, &add(A, 0, seq, vec![pair(0x11, a(0, 1), 1)]));
    }
    assert_eq!(read(&mut sw, A, &[a(0, 1)]), vec![(0x11, 9)]);
    // Packet 0 again: its flip-bit slot now holds packet 8's (the other
    // flip), so without the newest-sequence check it would apply again.
    assert!(send(&mut sw, &first).is_empty());
    assert_eq!(sw.stats().refused, 1);
    assert_eq!(read(&mut sw, A, &[a(0, 1)]), vec![(0x11, 9)]);
    // A retransmission within half a window is a duplicate, as before.
    let (_, ack) = only(&send(&mut sw, &add(A, 0, WINDOW, vec![pair(0x11, a(0, 1), 1)])));
    assert!(ack.header.flags.has(Flags::DUP) || ack.header.mask == 1);
    assert_eq!(read(&mut sw, A, &[a(0, 1)]), vec![(0x11, 9)]);
}

#[test]
fn a_chunk_far_ahead_of_its_slot_cannot_move_it() {
    let mut sw = switch();
    // 2^30 + 5 claims slot 5 of A's 16-register memory far ahead.
    assert!(send(&mut sw, &agg(A, 0, (1 << 30) + 5, 5, &[1])).is_empty());
    assert_eq!(sw.stats().refused, 1);
    // The real chunk 5 still completes in its slot.
    let mut out = Vec::new();
    for flow in 0..3 {
        out = send(&mut sw, &agg(A, flow, 5, 5, &[1]));
    }
    assert_eq!(out.len(), 3, "the result goes to the three members");
    assert_eq!(decode(&out[0]).pair_items()[0].value, 3);
    // Chunk 5 + 16 (the slot's next use) moves it on; + 64 would not.
    assert!(send(&mut sw, &agg(A, 0, 5 + 64, 5, &[1])).is_empty());
    assert_eq!(sw.stats().refused, 2);
    assert!(send(&mut sw, &agg(A, 0, 5 + 16, 5, &[1])).is_empty(), "counted, not complete");
    assert_eq!(read_meta(&mut sw, A, &[5])[0].0, 21);
}

#[test]
fn malformed_datagrams_are_dropped_and_counted() {
    let good = sealed(&add(A, 0, 0, vec![pair(1, a(0, 1), 1)]));
    let mut bad_magic = good.clone();
    bad_magic[0] ^= 0xff;
    let mut bad_version = good.clone();
    bad_version[2] = 1;
    let mut bad_kind = good.clone();
    bad_kind[3] = 99;
    let mut trailing = good.clone();
    trailing.push(0);
    let mut too_many = good.clone();
    too_many[5] = 200;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("one byte", vec![0x4e]),
        ("header cut", good[..20].to_vec()),
        ("item cut", good[..good.len() - 1].to_vec()),
        ("bad magic", bad_magic),
        ("bad version", bad_version),
        ("bad kind", bad_kind),
        ("trailing byte", trailing),
        ("too many items", too_many),
    ];
    let mut sw = switch();
    swap(&mut sw, A, a(0, 1), 1, 0);
    for (what, bytes) in &cases {
        assert!(send_bytes(&mut sw, 5, 0, bytes).is_empty(), "{what}");
    }
    let s = sw.stats();
    // A header that parses names its application: what then breaks the
    // packet (a cut, a byte too many) breaks its MAC first.
    assert_eq!(
        (s.packets, s.malformed + s.forged, s.not_admitted),
        (cases.len() as u64, cases.len() as u64, 0)
    );
    assert_eq!(read(&mut sw, A, &[a(0, 1)]), vec![(1, 0)]);
    assert_eq!(sw.control(Control::LastSeen), ControlReply::LastSeen(vec![(A, 0), (B, 0)]));
    // The well-formed original still works afterwards.
    assert_eq!(only(&send_bytes(&mut sw, 6, 0, &good)).1.header.kind, Kind::Ack);
}

#[test]
fn members_replaces_the_multicast_group() {
    let mut sw = switch();
    let members = vec![3, 2, 1, 8];
    assert_eq!(sw.control(Control::Members { app: A, members }), ControlReply::Done);
    for flow in 0..2 {
        send(&mut sw, &agg(A, flow, 0, 1, &[1]));
    }
    let out = send(&mut sw, &agg(A, 2, 0, 1, &[1]));
    assert_eq!(out.iter().map(|e| e.dst).collect::<Vec<_>>(), vec![3, 2, 1, 8]);
    // A node no longer among the members is no longer relayed to.
    let members = vec![1, 2];
    assert_eq!(sw.control(Control::Members { app: A, members }), ControlReply::Done);
    assert!(send(&mut sw, &add(A, 2, 0, vec![])).is_empty(), "node 3 left");
}

#[test]
fn a_switch_with_a_next_hop_passes_packets_on_with_its_part_done() {
    let c = SwitchConfig { next_hop: Some(901), ..config() };
    let mut sw = Switch::new(c).expect("valid");
    assert_eq!(sw.control(Control::Install(app_a())), ControlReply::Done);
    swap(&mut sw, A, a(0, 1), 0x11, 0);
    // An add: applied here, passed on (not acked), with the mask.
    let p = add(A, 0, 0, vec![pair(0x11, a(0, 1), 2), pair(0x12, Addr::new(1, 0, 1), 3)]);
    let (dst, on) = only(&send(&mut sw, &p));
    assert_eq!(
        (dst, on.header.kind, on.header.mask, on.header.flags),
        (901, Kind::Add, 0b01, Flags(0))
    );
    // A completed aggregation: passed on with SUMS, not multicast.
    for flow in 0..3 {
        let (dst, on) = only(&send(&mut sw, &agg(A, flow, 0, 2, &[1])));
        assert_eq!((dst, on.header.kind), (901, Kind::Agg));
        assert_eq!(on.header.flags.has(Flags::SUMS), flow == 2);
    }
    // Not admitted: dropped here, not passed on.
    assert!(send(&mut sw, &add(NOBODY, 0, 0, vec![])).is_empty());
}
