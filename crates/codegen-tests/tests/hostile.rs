//! Hostile blocks: a block may come from another process, so reading one
//! through the generated views must never panic or read out of bounds,
//! whatever its bytes. A small property test (xorshift, no dependencies):
//! valid blocks with bytes flipped, words overwritten with interesting
//! values (offsets at and past the end, the wire / device flag bits),
//! truncated blocks, and random bytes behind a valid header, each read
//! through every getter of the typed views, recursively.

mod common;

use std::error::Error;

use protoplane_codegen_tests::codegen::{p2, p3};
use protoplane_codegen_tests::socialnetwork as sn;
use protoplane_wire::{Block, HEADER_LEN, REF_DEVICE, REF_WIRE};

use common::Rng;

type Res = Result<(), Box<dyn Error>>;

/// Calls every getter, recursing into sub-messages with a depth and a work
/// budget (a forged block can make references share objects or form cycles).
struct Touch {
    acc: u64,
    work: usize,
}

impl Touch {
    fn add(&mut self, v: u64) {
        self.acc = self.acc.wrapping_mul(31).wrapping_add(v);
        self.work += 1;
    }

    fn str(&mut self, s: &str) {
        self.add(s.len() as u64 + s.bytes().map(u64::from).sum::<u64>());
    }

    fn bytes(&mut self, b: &[u8]) {
        self.add(b.len() as u64 + b.iter().map(|&x| u64::from(x)).sum::<u64>());
    }

    fn more(&self, depth: u32) -> bool {
        depth < 8 && self.work < 20_000
    }

    fn scalars(&mut self, v: p3::ScalarsView<'_>) {
        self.add(v.f_double().to_bits() ^ v.f_float().to_bits() as u64);
        self.add(v.f_int64() as u64 ^ v.f_uint64() ^ v.f_int32() as u64 ^ v.f_fixed64());
        self.add(v.f_fixed32() as u64 ^ v.f_bool() as u64 ^ v.f_uint32() as u64);
        self.add(v.f_color() as u64 ^ v.f_sfixed32() as u64 ^ v.f_sfixed64() as u64);
        self.add(v.f_sint32() as u64 ^ v.f_sint64() as u64);
        self.str(v.f_string());
        self.bytes(v.f_string_bytes());
        self.bytes(v.f_bytes());
        self.add(v.has_o_int32() as u64 ^ v.o_int32() as u64);
        self.str(v.o_string());
        self.add(v.has_o_bool() as u64 ^ v.o_bool() as u64 ^ v.o_color() as u64);
        self.add(v.o_double().to_bits() ^ v.has_o_bytes() as u64);
        self.bytes(v.o_bytes());
        let _ = format!("{v:?}");
    }

    fn repeats(&mut self, v: p3::RepeatsView<'_>, depth: u32) {
        for x in v.r_double() {
            self.add(x.to_bits());
        }
        for x in v.r_float().iter().rev() {
            self.add(x.to_bits() as u64);
        }
        self.add(v.r_int64().iter().map(|x| x as u64).fold(0, u64::wrapping_add));
        self.add(v.r_uint64().iter().fold(0, u64::wrapping_add));
        self.add(v.r_int32().iter().map(|x| x as u64).fold(0, u64::wrapping_add));
        self.add(v.r_fixed64().len() as u64 + v.r_fixed32().len() as u64);
        self.add(v.r_bool().iter().filter(|&b| b).count() as u64);
        self.add(
            v.r_uint32().last().unwrap_or(0) as u64 ^ v.r_sfixed32().first().unwrap_or(0) as u64,
        );
        self.add(
            v.r_sfixed64().get(1).unwrap_or(0) as u64
                ^ v.r_sint32().get(usize::MAX).unwrap_or(0) as u64,
        );
        self.add(v.r_sint64().to_vec().len() as u64);
        self.add(v.unpacked_int32().len() as u64 ^ v.unpacked_sint64().len() as u64);
        self.add(v.unpacked_bool().len() as u64 ^ v.unpacked_double().len() as u64);
        for s in v.r_string() {
            self.str(s);
        }
        for b in v.r_string_bytes().iter().chain(v.r_bytes()) {
            self.bytes(b);
        }
        self.add(v.r_color().iter().map(|x| x as u64).fold(0, u64::wrapping_add));
        for m in v.r_msg() {
            if !self.more(depth) {
                break;
            }
            self.scalars(m);
        }
        let _ = format!("{:?}", v.r_int32());
    }

    fn node(&mut self, v: p3::NodeView<'_>, depth: u32) {
        self.str(v.name());
        if !self.more(depth) {
            return;
        }
        self.add(v.has_left() as u64 ^ v.has_right() as u64);
        if let Some(l) = v.left() {
            self.node(l, depth + 1);
        }
        if let Some(r) = v.right() {
            self.node(r, depth + 1);
        }
        for c in v.children().iter().take(8) {
            self.node(c, depth + 1);
        }
        for (k, n) in v.named().iter().take(8) {
            self.str(k);
            self.node(n, depth + 1);
        }
        self.add(v.named().get("x").is_some() as u64);
    }

    fn maps(&mut self, v: p3::MapsView<'_>, depth: u32) {
        for (k, x) in v.str_str() {
            self.str(k);
            self.str(x);
        }
        for (k, x) in v.int_int().iter().rev() {
            self.add(k as u64 ^ x as u64);
        }
        for (k, m) in v.str_msg().iter().take(8) {
            self.str(k);
            self.scalars(m);
        }
        self.add(v.str_msg().get("full").is_some() as u64);
        for (k, b) in v.u64_bytes() {
            self.add(k);
            self.bytes(b);
        }
        self.add(v.bool_enum().get(&true).unwrap_or(0) as u64 ^ v.bool_enum().len() as u64);
        for (k, n) in v.sint_node().iter().take(4) {
            self.add(k as u64);
            self.node(n, depth + 1);
        }
        for (k, x) in v.fixed_double() {
            self.add(k ^ x.to_bits());
        }
        let _ = format!("{:?}", v.str_str());
    }

    fn choice(&mut self, v: p3::ChoiceView<'_>, depth: u32) {
        use p3::choice::{KindOneof, OnlyScalarsOneof, OtherOneof};
        self.str(v.id());
        match v.kind() {
            Some(KindOneof::Number(n) | KindOneof::Color(n)) => self.add(n as u64),
            Some(KindOneof::Text(t)) => self.str(t),
            Some(KindOneof::Blob(b)) => self.bytes(b),
            Some(KindOneof::Scalars(s)) => self.scalars(s),
            Some(KindOneof::Flag(f)) => self.add(f as u64),
            Some(KindOneof::Real(r)) => self.add(r.to_bits()),
            None => {}
        }
        self.add(v.number() as u64 ^ v.color() as u64 ^ v.flag() as u64 ^ v.real().to_bits());
        self.str(v.text());
        self.bytes(v.blob());
        if let Some(s) = v.scalars() {
            self.scalars(s);
        }
        match v.other() {
            Some(OtherOneof::Big(b)) => self.add(b),
            Some(OtherOneof::Node(n)) => self.node(n, depth + 1),
            None => {}
        }
        self.add(v.big() ^ v.has_node() as u64);
        match v.only_scalars() {
            Some(OnlyScalarsOneof::A(a)) => self.add(a as u64),
            Some(OnlyScalarsOneof::B(b)) => self.add(b as u64),
            None => {}
        }
        self.add(v.a() as u64 ^ v.b() as u64);
    }

    fn defaults(&mut self, v: p2::DefaultsView<'_>) {
        self.add(v.i32() as u64 ^ v.i64() as u64 ^ v.u32() as u64 ^ v.u64());
        self.add(v.s32() as u64 ^ v.s64() as u64 ^ v.fx32() as u64 ^ v.fx64());
        self.add(v.sfx32() as u64 ^ v.sfx64() as u64 ^ v.flt().to_bits() as u64);
        self.add(v.dbl().to_bits() ^ v.yes() as u64 ^ v.no() as u64 ^ v.zero() as u64);
        self.str(v.str());
        self.bytes(v.byt());
        self.add(
            v.level() as u64 ^ v.level2() as u64 ^ v.inf().to_bits() ^ v.nan().to_bits() as u64,
        );
        self.add(v.has_str() as u64 ^ v.has_level() as u64);
    }

    fn legacy(&mut self, v: p2::LegacyView<'_>, depth: u32) {
        self.add(v.id() as u64 ^ v.has_id() as u64 ^ v.color() as u64);
        self.str(v.name());
        if !self.more(depth) {
            return;
        }
        if let Some(s) = v.scalars() {
            self.scalars(s);
        }
        for s in v.many().iter().take(8) {
            self.scalars(s);
        }
        for (k, n) in v.nodes().iter().take(4) {
            self.str(k);
            self.node(n, depth + 1);
        }
        self.add(v.unpacked().len() as u64 ^ v.packed().len() as u64 ^ v.levels().len() as u64);
        if let Some(g) = v.grp() {
            self.add(g.g() as u64);
            self.str(g.h());
        }
        for i in v.items() {
            self.add(i.n() as u64);
        }
        match v.choice() {
            Some(p2::legacy::ChoiceOneof::S(s)) => self.str(s),
            Some(p2::legacy::ChoiceOneof::Child(c)) => self.legacy(c, depth + 1),
            Some(p2::legacy::ChoiceOneof::Lvl(l)) => self.add(l as u64),
            None => {}
        }
        if let Some(d) = v.defaults() {
            self.defaults(d);
        }
    }

    fn store_post(&mut self, v: sn::StorePostRequestView<'_>) {
        self.add(v.req_id() as u64);
        if let Some(p) = v.post() {
            self.add(p.post_id() as u64 ^ p.req_id() as u64 ^ p.timestamp() as u64);
            self.add(p.post_type() as u64);
            self.str(p.text());
            if let Some(c) = p.creator() {
                self.add(c.user_id() as u64);
                self.str(c.username());
            }
            for m in p.user_mentions() {
                self.str(m.username());
            }
            for m in p.media() {
                self.str(m.media_type());
            }
            for u in p.urls() {
                self.str(u.shortened_url());
                self.str(u.expanded_url());
            }
        }
        for (k, x) in v.carrier() {
            self.str(k);
            self.str(x);
        }
    }
}

/// One well-formed block per message type, built with the typed builders.
fn seeds() -> Result<Vec<(u32, Block)>, Box<dyn Error>> {
    let mut out = Vec::new();

    let mut b = p3::Scalars::builder();
    let mut s = p3::ScalarsBuilder::root(&mut b);
    s.set_f_double(1.5).set_f_int64(-3).set_f_bool(true).set_o_int32(7).set_f_color(2);
    s.set_f_string("string")?.set_f_bytes(b"bytes")?.set_o_string("opt")?;
    out.push((p3::Scalars::TYPE_INDEX, b.finish()));

    let mut b = p3::Repeats::builder();
    let mut r = p3::RepeatsBuilder::root(&mut b);
    r.extend_r_double([1.0, 2.0])?.extend_r_int32([1, 2, 3])?.extend_r_bool([true])?;
    r.extend_r_string(["a", "bb"])?.extend_r_bytes([&b"x"[..]])?.extend_unpacked_int32([5])?;
    r.add_r_msg()?.set_f_string("inner")?;
    r.add_r_msg()?.set_f_int32(2);
    out.push((p3::Repeats::TYPE_INDEX, b.finish()));

    let mut b = p3::Maps::builder();
    let mut m = p3::MapsBuilder::root(&mut b);
    m.insert_str_str("k", "v")?.insert_int_int(1, 2)?.insert_u64_bytes(3, b"b")?;
    m.insert_str_msg("full")?.set_f_int32(1);
    m.insert_sint_node(-1)?.set_name("n")?.left()?.set_name("l")?;
    m.insert_bool_enum(true, 1)?.insert_fixed_double(4, 0.5)?;
    out.push((p3::Maps::TYPE_INDEX, b.finish()));

    let mut b = p3::Node::builder();
    let mut n = p3::NodeBuilder::root(&mut b);
    n.set_name("root")?;
    n.left()?.set_name("left")?.right()?.set_name("lr")?;
    n.add_children()?.set_name("c")?;
    n.insert_named("x")?.set_name("named")?;
    out.push((p3::Node::TYPE_INDEX, b.finish()));

    for which in 0..3 {
        let mut b = p3::Choice::builder();
        let mut c = p3::ChoiceBuilder::root(&mut b);
        c.set_id("id")?;
        match which {
            0 => drop(c.scalars()?.set_f_string("in oneof")?),
            1 => drop(c.set_text("text")?),
            _ => drop(c.set_real(1.0)),
        }
        c.node()?.set_name("other")?;
        c.set_b(3);
        out.push((p3::Choice::TYPE_INDEX, b.finish()));
    }

    let mut b = p2::Legacy::builder();
    let mut l = p2::LegacyBuilder::root(&mut b);
    l.set_id(1).set_name("legacy")?;
    l.scalars()?.set_f_int32(3);
    l.add_many()?.set_f_string("m")?;
    l.insert_nodes("n")?.set_name("node")?;
    l.extend_unpacked([1])?.extend_packed([2, 3])?.extend_levels([5])?;
    l.grp()?.set_g(1).set_h("h")?;
    l.add_items()?.set_n(4);
    l.child()?.set_id(2).set_name("child")?.defaults()?.set_str("s")?;
    l.defaults()?.set_i32(9).set_byt(b"b")?;
    out.push((p2::Legacy::TYPE_INDEX, b.finish()));

    let mut b = sn::StorePostRequest::builder();
    let mut s = sn::StorePostRequestBuilder::root(&mut b);
    s.set_req_id(1).insert_carrier("trace", "id")?;
    let mut p = s.post()?;
    p.set_post_id(2).set_text("text")?;
    p.creator()?.set_user_id(3).set_username("u")?;
    p.add_urls()?.set_shortened_url("s")?.set_expanded_url("e")?;
    p.add_media()?.set_media_type("image/png")?;
    out.push((sn::StorePostRequest::TYPE_INDEX, b.finish()));
    Ok(out)
}

/// Reads `block` (with the wire bytes `wire`) as type `ty` through the typed
/// view; returns how many getters ran.
fn read(ty: u32, block: &[u8], wire: &[u8], t: &mut Touch) -> usize {
    t.work = 0;
    // Each package's indices are its own: p2 and p3 share one table set, the
    // social network schema has another.
    if ty == p3::Scalars::TYPE_INDEX {
        if let Ok(v) = p3::ScalarsView::from_block(block, wire) {
            t.scalars(v);
        }
    }
    if ty == p3::Repeats::TYPE_INDEX {
        if let Ok(v) = p3::RepeatsView::from_block(block, wire) {
            t.repeats(v, 0);
        }
    }
    if ty == p3::Maps::TYPE_INDEX {
        if let Ok(v) = p3::MapsView::from_block(block, wire) {
            t.maps(v, 0);
        }
    }
    if ty == p3::Node::TYPE_INDEX {
        if let Ok(v) = p3::NodeView::from_block(block, wire) {
            t.node(v, 0);
        }
    }
    if ty == p3::Choice::TYPE_INDEX {
        if let Ok(v) = p3::ChoiceView::from_block(block, wire) {
            t.choice(v, 0);
        }
    }
    if ty == p2::Legacy::TYPE_INDEX {
        if let Ok(v) = p2::LegacyView::from_block(block, wire) {
            t.legacy(v, 0);
        }
    }
    if ty == sn::StorePostRequest::TYPE_INDEX {
        if let Ok(v) = sn::StorePostRequestView::from_block(block, wire) {
            t.store_post(v);
        }
    }
    t.work
}

/// A 32-bit value likely to hit an edge: an offset at, near or past the end,
/// a length with the flag bits, zero, all ones.
fn interesting(r: &mut Rng, len: usize) -> u32 {
    let len = len as u32;
    match r.below(10) {
        0 => 0,
        1 => u32::MAX,
        2 => len,
        3 => len.wrapping_sub(1 + r.below(16) as u32),
        4 => HEADER_LEN as u32,
        5 => r.below(len as u64 + 1) as u32 & !7,
        6 => REF_WIRE | r.below(64) as u32,
        7 => REF_DEVICE | r.below(64) as u32,
        8 => 1 << r.below(32),
        _ => r.next() as u32,
    }
}

fn mutate(r: &mut Rng, block: &[u8]) -> Vec<u8> {
    let mut b = block.to_vec();
    for _ in 0..1 + r.below(6) {
        if b.len() <= HEADER_LEN {
            break;
        }
        // Keep the header mostly intact so the view gets past the type check.
        let at = HEADER_LEN + r.below((b.len() - HEADER_LEN) as u64) as usize;
        match r.below(4) {
            0 => b[at] ^= 1 << r.below(8),
            1 => b[at] = r.next() as u8,
            _ => {
                let at = at & !3;
                if at + 4 <= b.len() {
                    let v = interesting(r, block.len());
                    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
    if r.chance(5) {
        b.truncate(r.below(b.len() as u64 + 1) as usize);
    }
    if r.chance(20) && b.len() >= 4 {
        // Point the root somewhere else.
        let v = interesting(r, b.len());
        b[0..4].copy_from_slice(&v.to_le_bytes());
    }
    b
}

#[test]
fn corrupted_blocks_never_panic() -> Res {
    let seeds = seeds()?;
    let mut r = Rng(0xbad_b10c);
    let mut t = Touch { acc: 0, work: 0 };
    for (ty, block) in &seeds {
        // The seeds themselves read fine.
        assert!(read(*ty, block.as_bytes(), &[], &mut t) > 0);
    }
    let (mut readable, mut getters) = (0, 0);
    for i in 0..100_000 {
        let (ty, block) = &seeds[i % seeds.len()];
        let bad = mutate(&mut r, block.as_bytes());
        // Sometimes wire bytes for references with the wire flag set.
        let wire = if r.chance(3) { r.bytes(64) } else { Vec::new() };
        let n = read(*ty, &bad, &wire, &mut t);
        readable += usize::from(n > 0);
        getters += n;
    }
    // Most corrupted blocks still get past the header check and are read.
    assert!(readable > 60_000, "only {readable} of 100000 corrupted blocks were readable");
    assert!(getters > 1_000_000, "{getters} getter calls");
    assert_ne!(t.acc, 0);
    Ok(())
}

#[test]
fn random_bytes_behind_a_header_never_panic() {
    let mut r = Rng(0x0dd_5eed);
    let mut t = Touch { acc: 0, work: 0 };
    let mut readable = 0;
    let types = [
        p3::Scalars::TYPE_INDEX,
        p3::Repeats::TYPE_INDEX,
        p3::Maps::TYPE_INDEX,
        p3::Node::TYPE_INDEX,
        p3::Choice::TYPE_INDEX,
        p2::Legacy::TYPE_INDEX,
        sn::StorePostRequest::TYPE_INDEX,
    ];
    for i in 0..50_000 {
        let ty = types[i % types.len()];
        let len = HEADER_LEN + r.below(600) as usize;
        let mut block: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
        // Sparse, mostly small words make references that often resolve.
        for w in block.chunks_mut(4).skip(4) {
            if r.chance(2) {
                let v = interesting(&mut r, len);
                w.copy_from_slice(&v.to_le_bytes()[..w.len()]);
            }
        }
        block[0..4].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        block[4..8].copy_from_slice(&ty.to_le_bytes());
        let wire = r.bytes(32);
        readable += usize::from(read(ty, &block, &wire, &mut t) > 0);
    }
    assert!(readable > 25_000, "only {readable} of 50000 random blocks were readable");
    // Blocks shorter than a header or an object are refused, not read.
    for len in 0..HEADER_LEN + 8 {
        let block = vec![0u8; len];
        assert!(p3::ScalarsView::from_block(&block, &[]).is_err());
    }
}
