//! Cross-check against prost: random messages of the test schema are built
//! twice, with the generated typed builders (then encoded by protoplane's
//! encoder) and as prost structs (declared by hand below from the same
//! `.proto` files); the encodings must be byte-identical. Then prost's
//! bytes are decoded by protoplane, owned and in view mode, and every field
//! read through the typed views is compared with the prost struct.
//!
//! Two differences of prost from protobuf C++ (which protoplane follows) are
//! kept out of the random messages: map keys and values are never the
//! default (prost leaves them out of an entry, C++ writes them), and a proto3
//! implicit-presence float is never -0.0 (prost skips it as zero, C++
//! writes it).

mod common;

use std::collections::BTreeMap;
use std::error::Error;

use protoplane_codegen_tests::codegen::{p2, p3};

use common::{decode_both, encode, Rng};

type Res = Result<(), Box<dyn Error>>;

// ---- prost declarations of the test schema (protos/codegen/*.proto) ----

#[derive(Clone, PartialEq, prost::Message)]
struct Scalars {
    #[prost(double, tag = "1")]
    f_double: f64,
    #[prost(float, tag = "2")]
    f_float: f32,
    #[prost(int64, tag = "3")]
    f_int64: i64,
    #[prost(uint64, tag = "4")]
    f_uint64: u64,
    #[prost(int32, tag = "5")]
    f_int32: i32,
    #[prost(fixed64, tag = "6")]
    f_fixed64: u64,
    #[prost(fixed32, tag = "7")]
    f_fixed32: u32,
    #[prost(bool, tag = "8")]
    f_bool: bool,
    #[prost(string, tag = "9")]
    f_string: String,
    #[prost(bytes = "vec", tag = "10")]
    f_bytes: Vec<u8>,
    #[prost(uint32, tag = "13")]
    f_uint32: u32,
    #[prost(int32, tag = "14")]
    f_color: i32,
    #[prost(sfixed32, tag = "15")]
    f_sfixed32: i32,
    #[prost(sfixed64, tag = "16")]
    f_sfixed64: i64,
    #[prost(sint32, tag = "17")]
    f_sint32: i32,
    #[prost(sint64, tag = "18")]
    f_sint64: i64,
    #[prost(int32, optional, tag = "21")]
    o_int32: Option<i32>,
    #[prost(string, optional, tag = "22")]
    o_string: Option<String>,
    #[prost(bool, optional, tag = "23")]
    o_bool: Option<bool>,
    #[prost(int32, optional, tag = "24")]
    o_color: Option<i32>,
    #[prost(double, optional, tag = "25")]
    o_double: Option<f64>,
    #[prost(bytes = "vec", optional, tag = "26")]
    o_bytes: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Repeats {
    #[prost(double, repeated, tag = "1")]
    r_double: Vec<f64>,
    #[prost(float, repeated, tag = "2")]
    r_float: Vec<f32>,
    #[prost(int64, repeated, tag = "3")]
    r_int64: Vec<i64>,
    #[prost(uint64, repeated, tag = "4")]
    r_uint64: Vec<u64>,
    #[prost(int32, repeated, tag = "5")]
    r_int32: Vec<i32>,
    #[prost(fixed64, repeated, tag = "6")]
    r_fixed64: Vec<u64>,
    #[prost(fixed32, repeated, tag = "7")]
    r_fixed32: Vec<u32>,
    #[prost(bool, repeated, tag = "8")]
    r_bool: Vec<bool>,
    #[prost(uint32, repeated, tag = "13")]
    r_uint32: Vec<u32>,
    #[prost(sfixed32, repeated, tag = "15")]
    r_sfixed32: Vec<i32>,
    #[prost(sfixed64, repeated, tag = "16")]
    r_sfixed64: Vec<i64>,
    #[prost(sint32, repeated, tag = "17")]
    r_sint32: Vec<i32>,
    #[prost(sint64, repeated, tag = "18")]
    r_sint64: Vec<i64>,
    #[prost(int32, repeated, packed = "false", tag = "20")]
    unpacked_int32: Vec<i32>,
    #[prost(sint64, repeated, packed = "false", tag = "21")]
    unpacked_sint64: Vec<i64>,
    #[prost(bool, repeated, packed = "false", tag = "22")]
    unpacked_bool: Vec<bool>,
    #[prost(double, repeated, packed = "false", tag = "23")]
    unpacked_double: Vec<f64>,
    #[prost(string, repeated, tag = "30")]
    r_string: Vec<String>,
    #[prost(bytes = "vec", repeated, tag = "31")]
    r_bytes: Vec<Vec<u8>>,
    #[prost(int32, repeated, tag = "32")]
    r_color: Vec<i32>,
    #[prost(message, repeated, tag = "33")]
    r_msg: Vec<Scalars>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Maps {
    #[prost(btree_map = "string, string", tag = "1")]
    str_str: BTreeMap<String, String>,
    #[prost(btree_map = "int32, int64", tag = "2")]
    int_int: BTreeMap<i32, i64>,
    #[prost(btree_map = "string, message", tag = "3")]
    str_msg: BTreeMap<String, Scalars>,
    #[prost(btree_map = "uint64, bytes", tag = "4")]
    u64_bytes: BTreeMap<u64, Vec<u8>>,
    #[prost(btree_map = "bool, int32", tag = "5")]
    bool_enum: BTreeMap<bool, i32>,
    #[prost(btree_map = "sint32, message", tag = "6")]
    sint_node: BTreeMap<i32, Node>,
    #[prost(btree_map = "fixed64, double", tag = "7")]
    fixed_double: BTreeMap<u64, f64>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Node {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, boxed, tag = "2")]
    left: Option<Box<Node>>,
    #[prost(message, optional, boxed, tag = "3")]
    right: Option<Box<Node>>,
    #[prost(message, repeated, tag = "4")]
    children: Vec<Node>,
    #[prost(btree_map = "string, message", tag = "5")]
    named: BTreeMap<String, Node>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Choice {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(oneof = "Kind", tags = "2, 3, 4, 5, 6, 7, 8")]
    kind: Option<Kind>,
    #[prost(oneof = "Other", tags = "10, 11")]
    other: Option<Other>,
    #[prost(oneof = "OnlyScalars", tags = "12, 13")]
    only_scalars: Option<OnlyScalars>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Kind {
    #[prost(int32, tag = "2")]
    Number(i32),
    #[prost(string, tag = "3")]
    Text(String),
    #[prost(bytes = "vec", tag = "4")]
    Blob(Vec<u8>),
    #[prost(message, tag = "5")]
    Scalars(Scalars),
    #[prost(int32, tag = "6")]
    Color(i32),
    #[prost(bool, tag = "7")]
    Flag(bool),
    #[prost(double, tag = "8")]
    Real(f64),
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Other {
    #[prost(uint64, tag = "10")]
    Big(u64),
    #[prost(message, tag = "11")]
    Node(Node),
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum OnlyScalars {
    #[prost(int64, tag = "12")]
    A(i64),
    #[prost(fixed32, tag = "13")]
    B(u32),
}

#[derive(Clone, PartialEq, prost::Message)]
struct Defaults {
    #[prost(int32, optional, tag = "1")]
    i32: Option<i32>,
    #[prost(int64, optional, tag = "2")]
    i64: Option<i64>,
    #[prost(uint32, optional, tag = "3")]
    u32: Option<u32>,
    #[prost(uint64, optional, tag = "4")]
    u64: Option<u64>,
    #[prost(sint32, optional, tag = "5")]
    s32: Option<i32>,
    #[prost(sint64, optional, tag = "6")]
    s64: Option<i64>,
    #[prost(fixed32, optional, tag = "7")]
    fx32: Option<u32>,
    #[prost(fixed64, optional, tag = "8")]
    fx64: Option<u64>,
    #[prost(sfixed32, optional, tag = "9")]
    sfx32: Option<i32>,
    #[prost(sfixed64, optional, tag = "10")]
    sfx64: Option<i64>,
    #[prost(float, optional, tag = "11")]
    flt: Option<f32>,
    #[prost(double, optional, tag = "12")]
    dbl: Option<f64>,
    #[prost(bool, optional, tag = "13")]
    yes: Option<bool>,
    #[prost(string, optional, tag = "14")]
    str: Option<String>,
    #[prost(bytes = "vec", optional, tag = "15")]
    byt: Option<Vec<u8>>,
    #[prost(int32, optional, tag = "16")]
    level: Option<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Legacy {
    #[prost(int32, required, tag = "1")]
    id: i32,
    #[prost(string, required, tag = "2")]
    name: String,
    #[prost(message, optional, tag = "3")]
    scalars: Option<Scalars>,
    #[prost(message, repeated, tag = "4")]
    many: Vec<Scalars>,
    #[prost(btree_map = "string, message", tag = "5")]
    nodes: BTreeMap<String, Node>,
    #[prost(int32, repeated, packed = "false", tag = "6")]
    unpacked: Vec<i32>,
    #[prost(int32, repeated, tag = "7")]
    packed: Vec<i32>,
    #[prost(int32, repeated, packed = "false", tag = "8")]
    levels: Vec<i32>,
    #[prost(group, optional, tag = "9")]
    grp: Option<Grp>,
    #[prost(group, repeated, tag = "12")]
    items: Vec<Items>,
    #[prost(int32, optional, tag = "14")]
    color: Option<i32>,
    #[prost(oneof = "LegacyChoice", tags = "20, 21, 22")]
    choice: Option<LegacyChoice>,
    #[prost(message, optional, tag = "23")]
    defaults: Option<Defaults>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Grp {
    #[prost(int32, optional, tag = "10")]
    g: Option<i32>,
    #[prost(string, optional, tag = "11")]
    h: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Items {
    #[prost(int32, required, tag = "13")]
    n: i32,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum LegacyChoice {
    #[prost(string, tag = "20")]
    S(String),
    #[prost(message, boxed, tag = "21")]
    Child(Box<Legacy>),
    #[prost(int32, tag = "22")]
    Lvl(i32),
}

// ---- random messages ----

fn opt<T>(r: &mut Rng, f: impl FnOnce(&mut Rng) -> T) -> Option<T> {
    if r.chance(2) {
        Some(f(r))
    } else {
        None
    }
}

fn list<T>(r: &mut Rng, max: u64, mut f: impl FnMut(&mut Rng) -> T) -> Vec<T> {
    (0..r.below(max + 1)).map(|_| f(r)).collect()
}

/// A value that is often zero or an extreme, else random bits.
fn num(r: &mut Rng) -> u64 {
    match r.below(6) {
        0 => 0,
        1 => u64::MAX,
        2 => 1 << r.below(64),
        3 => r.below(300),
        _ => r.next(),
    }
}

/// Float bits for a proto3 implicit-presence field: never -0.0, which
/// protobuf C++ (and protoplane) encode and prost skips as "zero".
fn implicit_f64(r: &mut Rng) -> f64 {
    match num(r) {
        0x8000_0000_0000_0000 => 0.0,
        bits => f64::from_bits(bits),
    }
}

fn implicit_f32(r: &mut Rng) -> f32 {
    match num(r) as u32 {
        0x8000_0000 => 0.0,
        bits => f32::from_bits(bits),
    }
}

fn color(r: &mut Rng) -> i32 {
    [0, 1, 2, -3, 17][r.below(5) as usize]
}

fn level(r: &mut Rng) -> i32 {
    [1, 5, 10][r.below(3) as usize]
}

fn scalars(r: &mut Rng) -> Scalars {
    Scalars {
        f_double: implicit_f64(r),
        f_float: implicit_f32(r),
        f_int64: num(r) as i64,
        f_uint64: num(r),
        f_int32: num(r) as i32,
        f_fixed64: num(r),
        f_fixed32: num(r) as u32,
        f_bool: r.chance(2),
        f_string: r.word(12),
        f_bytes: r.bytes(12),
        f_uint32: num(r) as u32,
        f_color: color(r),
        f_sfixed32: num(r) as i32,
        f_sfixed64: num(r) as i64,
        f_sint32: num(r) as i32,
        f_sint64: num(r) as i64,
        o_int32: opt(r, |r| num(r) as i32),
        o_string: opt(r, |r| r.word(5)),
        o_bool: opt(r, |r| r.chance(2)),
        o_color: opt(r, color),
        o_double: opt(r, |r| f64::from_bits(num(r))),
        o_bytes: opt(r, |r| r.bytes(5)),
    }
}

/// A message that is not the default (prost would leave it out of a map entry).
fn non_default_scalars(r: &mut Rng) -> Scalars {
    Scalars { f_int32: 1 + r.below(1000) as i32, ..scalars(r) }
}

fn repeats(r: &mut Rng) -> Repeats {
    Repeats {
        r_double: list(r, 4, |r| f64::from_bits(num(r))),
        r_float: list(r, 4, |r| f32::from_bits(num(r) as u32)),
        r_int64: list(r, 4, |r| num(r) as i64),
        r_uint64: list(r, 4, num),
        r_int32: list(r, 4, |r| num(r) as i32),
        r_fixed64: list(r, 4, num),
        r_fixed32: list(r, 4, |r| num(r) as u32),
        r_bool: list(r, 4, |r| r.chance(2)),
        r_uint32: list(r, 4, |r| num(r) as u32),
        r_sfixed32: list(r, 4, |r| num(r) as i32),
        r_sfixed64: list(r, 4, |r| num(r) as i64),
        r_sint32: list(r, 4, |r| num(r) as i32),
        r_sint64: list(r, 4, |r| num(r) as i64),
        unpacked_int32: list(r, 4, |r| num(r) as i32),
        unpacked_sint64: list(r, 4, |r| num(r) as i64),
        unpacked_bool: list(r, 4, |r| r.chance(2)),
        unpacked_double: list(r, 4, |r| f64::from_bits(num(r))),
        r_string: list(r, 4, |r| r.word(6)),
        r_bytes: list(r, 4, |r| r.bytes(6)),
        r_color: list(r, 4, color),
        r_msg: list(r, 3, scalars),
    }
}

fn node(r: &mut Rng, depth: u32) -> Node {
    let mut n = Node { name: format!("n{}", r.below(1000)), ..Node::default() };
    if depth > 0 {
        n.left = opt(r, |r| Box::new(node(r, depth - 1)));
        n.right = opt(r, |r| Box::new(node(r, depth - 1)));
        n.children = list(r, 2, |r| node(r, depth - 1));
        n.named =
            list(r, 2, |r| (format!("k{}", r.below(5)), node(r, depth - 1))).into_iter().collect();
    }
    n
}

fn maps(r: &mut Rng) -> Maps {
    let nz = |r: &mut Rng| num(r).max(1);
    Maps {
        str_str: list(r, 4, |r| (format!("k{}", r.word(4)), format!("v{}", r.word(4))))
            .into_iter()
            .collect(),
        int_int: list(r, 4, |r| (nz(r) as i32, nz(r) as i64))
            .into_iter()
            .filter(|(k, v)| *k != 0 && *v != 0)
            .collect(),
        str_msg: list(r, 3, |r| (format!("m{}", r.word(3)), non_default_scalars(r)))
            .into_iter()
            .collect(),
        u64_bytes: list(r, 3, |r| (nz(r), vec![1, r.next() as u8])).into_iter().collect(),
        // `false` is the default key: prost would leave it out.
        bool_enum: [(true, -3)].into_iter().filter(|_| r.chance(2)).collect(),
        sint_node: list(r, 3, |r| (nz(r) as i32, node(r, 2)))
            .into_iter()
            .filter(|(k, _)| *k != 0)
            .collect(),
        fixed_double: list(r, 3, |r| (nz(r), 0.5 + r.below(100) as f64)).into_iter().collect(),
    }
}

fn choice(r: &mut Rng) -> Choice {
    let kind = match r.below(8) {
        0 => Some(Kind::Number(num(r) as i32)),
        1 => Some(Kind::Text(r.word(5))),
        2 => Some(Kind::Blob(r.bytes(5))),
        3 => Some(Kind::Scalars(scalars(r))),
        4 => Some(Kind::Color(color(r))),
        5 => Some(Kind::Flag(r.chance(2))),
        6 => Some(Kind::Real(f64::from_bits(num(r)))),
        _ => None,
    };
    let other = match r.below(3) {
        0 => Some(Other::Big(num(r))),
        1 => Some(Other::Node(node(r, 1))),
        _ => None,
    };
    let only_scalars = match r.below(3) {
        0 => Some(OnlyScalars::A(num(r) as i64)),
        1 => Some(OnlyScalars::B(num(r) as u32)),
        _ => None,
    };
    Choice { id: r.word(4), kind, other, only_scalars }
}

fn defaults(r: &mut Rng) -> Defaults {
    Defaults {
        i32: opt(r, |r| num(r) as i32),
        i64: opt(r, |r| num(r) as i64),
        u32: opt(r, |r| num(r) as u32),
        u64: opt(r, num),
        s32: opt(r, |r| num(r) as i32),
        s64: opt(r, |r| num(r) as i64),
        fx32: opt(r, |r| num(r) as u32),
        fx64: opt(r, num),
        sfx32: opt(r, |r| num(r) as i32),
        sfx64: opt(r, |r| num(r) as i64),
        flt: opt(r, |r| f32::from_bits(num(r) as u32)),
        dbl: opt(r, |r| f64::from_bits(num(r))),
        yes: opt(r, |r| r.chance(2)),
        str: opt(r, |r| r.word(5)),
        byt: opt(r, |r| r.bytes(5)),
        level: opt(r, level),
    }
}

fn legacy(r: &mut Rng, depth: u32) -> Legacy {
    Legacy {
        id: num(r) as i32,
        name: r.word(6),
        scalars: opt(r, scalars),
        many: list(r, 2, scalars),
        nodes: list(r, 2, |r| (format!("n{}", r.below(9)), node(r, 1))).into_iter().collect(),
        unpacked: list(r, 3, |r| num(r) as i32),
        packed: list(r, 3, |r| num(r) as i32),
        levels: list(r, 3, level),
        grp: opt(r, |r| Grp { g: opt(r, |r| num(r) as i32), h: opt(r, |r| r.word(3)) }),
        items: list(r, 3, |r| Items { n: num(r) as i32 }),
        color: opt(r, color),
        choice: match r.below(4) {
            0 => Some(LegacyChoice::S(r.word(4))),
            1 if depth > 0 => Some(LegacyChoice::Child(Box::new(legacy(r, depth - 1)))),
            2 => Some(LegacyChoice::Lvl(level(r))),
            _ => None,
        },
        defaults: opt(r, defaults),
    }
}

// ---- the same messages through the typed builders ----

fn build_scalars(b: &mut p3::ScalarsBuilder<'_, '_>, s: &Scalars) -> Res {
    b.set_f_double(s.f_double)
        .set_f_float(s.f_float)
        .set_f_int64(s.f_int64)
        .set_f_uint64(s.f_uint64)
        .set_f_int32(s.f_int32)
        .set_f_fixed64(s.f_fixed64)
        .set_f_fixed32(s.f_fixed32)
        .set_f_bool(s.f_bool)
        .set_f_uint32(s.f_uint32)
        .set_f_color(s.f_color)
        .set_f_sfixed32(s.f_sfixed32)
        .set_f_sfixed64(s.f_sfixed64)
        .set_f_sint32(s.f_sint32)
        .set_f_sint64(s.f_sint64);
    b.set_f_string(&s.f_string)?.set_f_bytes(&s.f_bytes)?;
    if let Some(v) = s.o_int32 {
        b.set_o_int32(v);
    }
    if let Some(v) = &s.o_string {
        b.set_o_string(v)?;
    }
    if let Some(v) = s.o_bool {
        b.set_o_bool(v);
    }
    if let Some(v) = s.o_color {
        b.set_o_color(v);
    }
    if let Some(v) = s.o_double {
        b.set_o_double(v);
    }
    if let Some(v) = &s.o_bytes {
        b.set_o_bytes(v)?;
    }
    Ok(())
}

fn build_repeats(b: &mut p3::RepeatsBuilder<'_, '_>, s: &Repeats) -> Res {
    b.extend_r_double(s.r_double.iter().copied())?
        .extend_r_float(s.r_float.iter().copied())?
        .extend_r_int64(s.r_int64.iter().copied())?
        .extend_r_uint64(s.r_uint64.iter().copied())?
        .extend_r_int32(s.r_int32.iter().copied())?
        .extend_r_fixed64(s.r_fixed64.iter().copied())?
        .extend_r_fixed32(s.r_fixed32.iter().copied())?
        .extend_r_bool(s.r_bool.iter().copied())?
        .extend_r_uint32(s.r_uint32.iter().copied())?
        .extend_r_sfixed32(s.r_sfixed32.iter().copied())?
        .extend_r_sfixed64(s.r_sfixed64.iter().copied())?
        .extend_r_sint32(s.r_sint32.iter().copied())?
        .extend_r_sint64(s.r_sint64.iter().copied())?
        .extend_unpacked_int32(s.unpacked_int32.iter().copied())?
        .extend_unpacked_sint64(s.unpacked_sint64.iter().copied())?
        .extend_unpacked_bool(s.unpacked_bool.iter().copied())?
        .extend_unpacked_double(s.unpacked_double.iter().copied())?
        .extend_r_string(s.r_string.iter().map(String::as_str))?
        .extend_r_bytes(s.r_bytes.iter().map(Vec::as_slice))?
        .extend_r_color(s.r_color.iter().copied())?;
    for m in &s.r_msg {
        build_scalars(&mut b.add_r_msg()?, m)?;
    }
    Ok(())
}

fn build_node(b: &mut p3::NodeBuilder<'_, '_>, n: &Node) -> Res {
    b.set_name(&n.name)?;
    if let Some(l) = &n.left {
        build_node(&mut b.left()?, l)?;
    }
    if let Some(r) = &n.right {
        build_node(&mut b.right()?, r)?;
    }
    for c in &n.children {
        build_node(&mut b.add_children()?, c)?;
    }
    for (k, v) in &n.named {
        build_node(&mut b.insert_named(k)?, v)?;
    }
    Ok(())
}

fn build_maps(b: &mut p3::MapsBuilder<'_, '_>, m: &Maps) -> Res {
    for (k, v) in &m.str_str {
        b.insert_str_str(k, v)?;
    }
    for (k, v) in &m.int_int {
        b.insert_int_int(*k, *v)?;
    }
    for (k, v) in &m.str_msg {
        build_scalars(&mut b.insert_str_msg(k)?, v)?;
    }
    for (k, v) in &m.u64_bytes {
        b.insert_u64_bytes(*k, v)?;
    }
    for (k, v) in &m.bool_enum {
        b.insert_bool_enum(*k, *v)?;
    }
    for (k, v) in &m.sint_node {
        build_node(&mut b.insert_sint_node(*k)?, v)?;
    }
    for (k, v) in &m.fixed_double {
        b.insert_fixed_double(*k, *v)?;
    }
    Ok(())
}

fn build_choice(b: &mut p3::ChoiceBuilder<'_, '_>, c: &Choice) -> Res {
    b.set_id(&c.id)?;
    match &c.kind {
        Some(Kind::Number(v)) => drop(b.set_number(*v)),
        Some(Kind::Text(v)) => drop(b.set_text(v)?),
        Some(Kind::Blob(v)) => drop(b.set_blob(v)?),
        Some(Kind::Scalars(v)) => build_scalars(&mut b.scalars()?, v)?,
        Some(Kind::Color(v)) => drop(b.set_color(*v)),
        Some(Kind::Flag(v)) => drop(b.set_flag(*v)),
        Some(Kind::Real(v)) => drop(b.set_real(*v)),
        None => {}
    }
    match &c.other {
        Some(Other::Big(v)) => drop(b.set_big(*v)),
        Some(Other::Node(n)) => build_node(&mut b.node()?, n)?,
        None => {}
    }
    match &c.only_scalars {
        Some(OnlyScalars::A(v)) => drop(b.set_a(*v)),
        Some(OnlyScalars::B(v)) => drop(b.set_b(*v)),
        None => {}
    }
    Ok(())
}

fn build_defaults(b: &mut p2::DefaultsBuilder<'_, '_>, d: &Defaults) -> Res {
    if let Some(v) = d.i32 {
        b.set_i32(v);
    }
    if let Some(v) = d.i64 {
        b.set_i64(v);
    }
    if let Some(v) = d.u32 {
        b.set_u32(v);
    }
    if let Some(v) = d.u64 {
        b.set_u64(v);
    }
    if let Some(v) = d.s32 {
        b.set_s32(v);
    }
    if let Some(v) = d.s64 {
        b.set_s64(v);
    }
    if let Some(v) = d.fx32 {
        b.set_fx32(v);
    }
    if let Some(v) = d.fx64 {
        b.set_fx64(v);
    }
    if let Some(v) = d.sfx32 {
        b.set_sfx32(v);
    }
    if let Some(v) = d.sfx64 {
        b.set_sfx64(v);
    }
    if let Some(v) = d.flt {
        b.set_flt(v);
    }
    if let Some(v) = d.dbl {
        b.set_dbl(v);
    }
    if let Some(v) = d.yes {
        b.set_yes(v);
    }
    if let Some(v) = &d.str {
        b.set_str(v)?;
    }
    if let Some(v) = &d.byt {
        b.set_byt(v)?;
    }
    if let Some(v) = d.level {
        b.set_level(v);
    }
    Ok(())
}

fn build_legacy(b: &mut p2::LegacyBuilder<'_, '_>, l: &Legacy) -> Res {
    b.set_id(l.id).set_name(&l.name)?;
    if let Some(s) = &l.scalars {
        build_scalars(&mut b.scalars()?, s)?;
    }
    for s in &l.many {
        build_scalars(&mut b.add_many()?, s)?;
    }
    for (k, v) in &l.nodes {
        build_node(&mut b.insert_nodes(k)?, v)?;
    }
    b.extend_unpacked(l.unpacked.iter().copied())?
        .extend_packed(l.packed.iter().copied())?
        .extend_levels(l.levels.iter().copied())?;
    if let Some(g) = &l.grp {
        let mut grp = b.grp()?;
        if let Some(v) = g.g {
            grp.set_g(v);
        }
        if let Some(v) = &g.h {
            grp.set_h(v)?;
        }
    }
    for i in &l.items {
        b.add_items()?.set_n(i.n);
    }
    if let Some(v) = l.color {
        b.set_color(v);
    }
    match &l.choice {
        Some(LegacyChoice::S(v)) => drop(b.set_s(v)?),
        Some(LegacyChoice::Child(c)) => build_legacy(&mut b.child()?, c)?,
        Some(LegacyChoice::Lvl(v)) => drop(b.set_lvl(*v)),
        None => {}
    }
    if let Some(d) = &l.defaults {
        build_defaults(&mut b.defaults()?, d)?;
    }
    Ok(())
}

// ---- typed views compared with prost structs ----

fn eq_f64(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits()
}

fn check_scalars(v: p3::ScalarsView<'_>, s: &Scalars) {
    assert!(eq_f64(v.f_double(), s.f_double));
    assert_eq!(v.f_float().to_bits(), s.f_float.to_bits());
    assert_eq!((v.f_int64(), v.f_uint64(), v.f_int32()), (s.f_int64, s.f_uint64, s.f_int32));
    assert_eq!((v.f_fixed64(), v.f_fixed32(), v.f_bool()), (s.f_fixed64, s.f_fixed32, s.f_bool));
    assert_eq!((v.f_string(), v.f_bytes()), (s.f_string.as_str(), s.f_bytes.as_slice()));
    assert_eq!((v.f_uint32(), v.f_color()), (s.f_uint32, s.f_color));
    assert_eq!((v.f_sfixed32(), v.f_sfixed64()), (s.f_sfixed32, s.f_sfixed64));
    assert_eq!((v.f_sint32(), v.f_sint64()), (s.f_sint32, s.f_sint64));
    assert_eq!(v.has_o_int32().then(|| v.o_int32()), s.o_int32);
    assert_eq!(v.has_o_string().then(|| v.o_string()), s.o_string.as_deref());
    assert_eq!(v.has_o_bool().then(|| v.o_bool()), s.o_bool);
    assert_eq!(v.has_o_color().then(|| v.o_color()), s.o_color);
    assert_eq!(v.has_o_double().then(|| v.o_double().to_bits()), s.o_double.map(f64::to_bits));
    assert_eq!(v.has_o_bytes().then(|| v.o_bytes()), s.o_bytes.as_deref());
}

fn check_repeats(v: p3::RepeatsView<'_>, s: &Repeats) {
    let bits = |x: Vec<f64>| x.into_iter().map(f64::to_bits).collect::<Vec<_>>();
    assert_eq!(bits(v.r_double().to_vec()), bits(s.r_double.clone()));
    let fbits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(fbits(&v.r_float().to_vec()), fbits(&s.r_float));
    assert_eq!(v.r_int64().to_vec(), s.r_int64);
    assert_eq!(v.r_uint64().to_vec(), s.r_uint64);
    assert_eq!(v.r_int32().to_vec(), s.r_int32);
    assert_eq!(v.r_fixed64().to_vec(), s.r_fixed64);
    assert_eq!(v.r_fixed32().to_vec(), s.r_fixed32);
    assert_eq!(v.r_bool().to_vec(), s.r_bool);
    assert_eq!(v.r_uint32().to_vec(), s.r_uint32);
    assert_eq!(v.r_sfixed32().to_vec(), s.r_sfixed32);
    assert_eq!(v.r_sfixed64().to_vec(), s.r_sfixed64);
    assert_eq!(v.r_sint32().to_vec(), s.r_sint32);
    assert_eq!(v.r_sint64().to_vec(), s.r_sint64);
    assert_eq!(v.unpacked_int32().to_vec(), s.unpacked_int32);
    assert_eq!(v.unpacked_sint64().to_vec(), s.unpacked_sint64);
    assert_eq!(v.unpacked_bool().to_vec(), s.unpacked_bool);
    assert_eq!(bits(v.unpacked_double().to_vec()), bits(s.unpacked_double.clone()));
    assert_eq!(v.r_string().to_vec(), s.r_string);
    assert_eq!(v.r_bytes().to_vec(), s.r_bytes);
    assert_eq!(v.r_color().to_vec(), s.r_color);
    assert_eq!(v.r_msg().len(), s.r_msg.len());
    for (m, e) in v.r_msg().iter().zip(&s.r_msg) {
        check_scalars(m, e);
    }
}

fn check_node(v: p3::NodeView<'_>, n: &Node) {
    assert_eq!(v.name(), n.name);
    assert_eq!(v.has_left(), n.left.is_some());
    if let (Some(l), Some(e)) = (v.left(), &n.left) {
        check_node(l, e);
    }
    assert_eq!(v.has_right(), n.right.is_some());
    if let (Some(r), Some(e)) = (v.right(), &n.right) {
        check_node(r, e);
    }
    assert_eq!(v.children().len(), n.children.len());
    for (c, e) in v.children().iter().zip(&n.children) {
        check_node(c, e);
    }
    assert_eq!(v.named().len(), n.named.len());
    for (k, e) in &n.named {
        check_node(v.named().get(k.as_str()).expect("key"), e);
    }
}

fn check_maps(v: p3::MapsView<'_>, m: &Maps) {
    let str_str: BTreeMap<String, String> =
        v.str_str().iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
    assert_eq!(str_str, m.str_str);
    assert_eq!(v.int_int().iter().collect::<BTreeMap<_, _>>(), m.int_int);
    assert_eq!(v.str_msg().len(), m.str_msg.len());
    for (k, e) in &m.str_msg {
        check_scalars(v.str_msg().get(k.as_str()).expect("key"), e);
    }
    let u64_bytes: BTreeMap<u64, Vec<u8>> =
        v.u64_bytes().iter().map(|(k, v)| (k, v.to_vec())).collect();
    assert_eq!(u64_bytes, m.u64_bytes);
    assert_eq!(v.bool_enum().iter().collect::<BTreeMap<_, _>>(), m.bool_enum);
    for (k, e) in &m.sint_node {
        check_node(v.sint_node().get(k).expect("key"), e);
    }
    assert_eq!(v.fixed_double().iter().collect::<BTreeMap<_, _>>(), m.fixed_double);
}

fn check_choice(v: p3::ChoiceView<'_>, c: &Choice) {
    use p3::choice::{KindOneof as K, OnlyScalarsOneof as S, OtherOneof as O};
    assert_eq!(v.id(), c.id);
    match (v.kind(), &c.kind) {
        (Some(K::Number(a)), Some(Kind::Number(b))) => assert_eq!(a, *b),
        (Some(K::Text(a)), Some(Kind::Text(b))) => assert_eq!(a, b),
        (Some(K::Blob(a)), Some(Kind::Blob(b))) => assert_eq!(a, b.as_slice()),
        (Some(K::Scalars(a)), Some(Kind::Scalars(b))) => check_scalars(a, b),
        (Some(K::Color(a)), Some(Kind::Color(b))) => assert_eq!(a, *b),
        (Some(K::Flag(a)), Some(Kind::Flag(b))) => assert_eq!(a, *b),
        (Some(K::Real(a)), Some(Kind::Real(b))) => assert!(eq_f64(a, *b)),
        (None, None) => {}
        (a, b) => panic!("kind: {a:?} vs {b:?}"),
    }
    match (v.other(), &c.other) {
        (Some(O::Big(a)), Some(Other::Big(b))) => assert_eq!(a, *b),
        (Some(O::Node(a)), Some(Other::Node(b))) => check_node(a, b),
        (None, None) => {}
        (a, b) => panic!("other: {a:?} vs {b:?}"),
    }
    match (v.only_scalars(), &c.only_scalars) {
        (Some(S::A(a)), Some(OnlyScalars::A(b))) => assert_eq!(a, *b),
        (Some(S::B(a)), Some(OnlyScalars::B(b))) => assert_eq!(a, *b),
        (None, None) => {}
        (a, b) => panic!("only_scalars: {a:?} vs {b:?}"),
    }
}

fn check_defaults(v: p2::DefaultsView<'_>, d: &Defaults) {
    // Absent fields read as the .proto's defaults.
    assert_eq!(v.i32(), d.i32.unwrap_or(-7));
    assert_eq!(v.i64(), d.i64.unwrap_or(-9_000_000_000));
    assert_eq!(v.u32(), d.u32.unwrap_or(4_000_000_000));
    assert_eq!(v.u64(), d.u64.unwrap_or(18_000_000_000_000_000_000));
    assert_eq!(v.s32(), d.s32.unwrap_or(-3));
    assert_eq!(v.s64(), d.s64.unwrap_or(-4));
    assert_eq!(v.fx32(), d.fx32.unwrap_or(77));
    assert_eq!(v.fx64(), d.fx64.unwrap_or(88));
    assert_eq!(v.sfx32(), d.sfx32.unwrap_or(-99));
    assert_eq!(v.sfx64(), d.sfx64.unwrap_or(-100));
    assert_eq!(v.flt().to_bits(), d.flt.unwrap_or(1.5).to_bits());
    assert!(eq_f64(v.dbl(), d.dbl.unwrap_or(-2.25)));
    assert_eq!(v.yes(), d.yes.unwrap_or(true));
    assert_eq!(v.str(), d.str.as_deref().unwrap_or("hello \"world\"\n"));
    assert_eq!(v.byt(), d.byt.as_deref().unwrap_or(b"\x01\x02\xffabc"));
    assert_eq!(v.level(), d.level.unwrap_or(1));
    assert_eq!(
        (v.has_i32(), v.has_str(), v.has_level()),
        (d.i32.is_some(), d.str.is_some(), d.level.is_some())
    );
}

fn check_legacy(v: p2::LegacyView<'_>, l: &Legacy) {
    assert_eq!((v.id(), v.name()), (l.id, l.name.as_str()));
    assert_eq!(v.has_scalars(), l.scalars.is_some());
    if let (Some(a), Some(b)) = (v.scalars(), &l.scalars) {
        check_scalars(a, b);
    }
    assert_eq!(v.many().len(), l.many.len());
    for (a, b) in v.many().iter().zip(&l.many) {
        check_scalars(a, b);
    }
    for (k, e) in &l.nodes {
        check_node(v.nodes().get(k.as_str()).expect("key"), e);
    }
    assert_eq!(v.unpacked().to_vec(), l.unpacked);
    assert_eq!(v.packed().to_vec(), l.packed);
    assert_eq!(v.levels().to_vec(), l.levels);
    assert_eq!(v.has_grp(), l.grp.is_some());
    if let (Some(a), Some(b)) = (v.grp(), &l.grp) {
        assert_eq!(a.has_g().then(|| a.g()), b.g);
        assert_eq!(a.has_h().then(|| a.h()), b.h.as_deref());
    }
    assert_eq!(
        v.items().iter().map(|i| i.n()).collect::<Vec<_>>(),
        l.items.iter().map(|i| i.n).collect::<Vec<_>>()
    );
    assert_eq!(v.has_color().then(|| v.color()), l.color);
    use p2::legacy::ChoiceOneof as C;
    match (v.choice(), &l.choice) {
        (Some(C::S(a)), Some(LegacyChoice::S(b))) => assert_eq!(a, b),
        (Some(C::Child(a)), Some(LegacyChoice::Child(b))) => check_legacy(a, b),
        (Some(C::Lvl(a)), Some(LegacyChoice::Lvl(b))) => assert_eq!(a, *b),
        (None, None) => {}
        (a, b) => panic!("choice: {a:?} vs {b:?}"),
    }
    assert_eq!(v.has_defaults(), l.defaults.is_some());
    if let (Some(a), Some(b)) = (v.defaults(), &l.defaults) {
        check_defaults(a, b);
    }
}

// ---- the property: same bytes as prost, same values back ----

/// Builds `expected` with the typed builder, checks protoplane's encoding is
/// prost's, then decodes prost's bytes both ways and checks the views.
fn same_as_prost<M: prost::Message + std::fmt::Debug>(
    ts: &protoplane_schema::TableSet,
    ty: u32,
    expected: &M,
    block: protoplane_wire::Block,
    check: &dyn Fn(&[u8], &[u8]),
) {
    let ours = encode(ts, ty, &block);
    let theirs = expected.encode_to_vec();
    assert_eq!(ours, theirs, "encodings differ for {expected:?}");
    check(block.as_bytes(), &[]);
    let (owned, view) = decode_both(ts, ty, &theirs);
    check(owned.as_bytes(), &[]);
    check(view.as_bytes(), &theirs);
}

const ROUNDS: u64 = 300;

#[test]
fn scalars_match_prost() -> Res {
    let mut r = Rng(0x5ca1_ab1e);
    for _ in 0..ROUNDS {
        let s = scalars(&mut r);
        let mut b = p3::Scalars::builder();
        build_scalars(&mut p3::ScalarsBuilder::root(&mut b), &s)?;
        same_as_prost(p3::tables(), p3::Scalars::TYPE_INDEX, &s, b.finish(), &|block, wire| {
            check_scalars(p3::ScalarsView::from_block(block, wire).expect("view"), &s)
        });
    }
    Ok(())
}

#[test]
fn repeats_match_prost() -> Res {
    let mut r = Rng(0x04e9_ea75);
    for _ in 0..ROUNDS {
        let s = repeats(&mut r);
        let mut b = p3::Repeats::builder();
        build_repeats(&mut p3::RepeatsBuilder::root(&mut b), &s)?;
        same_as_prost(p3::tables(), p3::Repeats::TYPE_INDEX, &s, b.finish(), &|block, wire| {
            check_repeats(p3::RepeatsView::from_block(block, wire).expect("view"), &s)
        });
    }
    Ok(())
}

#[test]
fn maps_match_prost() -> Res {
    let mut r = Rng(0x3a95);
    for _ in 0..ROUNDS {
        let m = maps(&mut r);
        let mut b = p3::Maps::builder();
        build_maps(&mut p3::MapsBuilder::root(&mut b), &m)?;
        same_as_prost(p3::tables(), p3::Maps::TYPE_INDEX, &m, b.finish(), &|block, wire| {
            check_maps(p3::MapsView::from_block(block, wire).expect("view"), &m)
        });
    }
    Ok(())
}

#[test]
fn recursive_nodes_match_prost() -> Res {
    let mut r = Rng(0x40de);
    for _ in 0..ROUNDS / 3 {
        let n = node(&mut r, 3);
        let mut b = p3::Node::builder();
        build_node(&mut p3::NodeBuilder::root(&mut b), &n)?;
        same_as_prost(p3::tables(), p3::Node::TYPE_INDEX, &n, b.finish(), &|block, wire| {
            check_node(p3::NodeView::from_block(block, wire).expect("view"), &n)
        });
    }
    Ok(())
}

#[test]
fn oneofs_match_prost() -> Res {
    let mut r = Rng(0x0e0f);
    for _ in 0..ROUNDS {
        let c = choice(&mut r);
        let mut b = p3::Choice::builder();
        build_choice(&mut p3::ChoiceBuilder::root(&mut b), &c)?;
        same_as_prost(p3::tables(), p3::Choice::TYPE_INDEX, &c, b.finish(), &|block, wire| {
            check_choice(p3::ChoiceView::from_block(block, wire).expect("view"), &c)
        });
    }
    Ok(())
}

#[test]
fn proto2_matches_prost() -> Res {
    let mut r = Rng(0x001e_9ac7);
    for _ in 0..ROUNDS {
        let l = legacy(&mut r, 2);
        let mut b = p2::Legacy::builder();
        build_legacy(&mut p2::LegacyBuilder::root(&mut b), &l)?;
        same_as_prost(p2::tables(), p2::Legacy::TYPE_INDEX, &l, b.finish(), &|block, wire| {
            check_legacy(p2::LegacyView::from_block(block, wire).expect("view"), &l)
        });
    }
    Ok(())
}
