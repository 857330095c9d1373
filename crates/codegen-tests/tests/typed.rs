//! The generated views and builders of the test schema, field type by field
//! type: build with the typed builder, encode, decode back (owned and view
//! mode), read with the typed view, and cross-check with the dynamic
//! `MessageView` and the JSON printer (which know nothing of generated code).

mod common;

use std::error::Error;

use protoplane_codegen_tests::codegen::{p2, p3};
use protoplane_codegen_tests::socialnetwork;
use protoplane_schema::TableSet;
use protoplane_wire::{json, Block, BlockError, DecodeOptions, MessageView, Source, Value};

use common::{decode_both, encode};

type Res = Result<(), Box<dyn Error>>;

/// Reads one form of a message: `(block, wire, built by the builder)`.
type Check<'c> = dyn FnMut(&[u8], &[u8], bool) + 'c;

fn json_of(ts: &TableSet, ty: u32, src: Source<'_>) -> String {
    let view = MessageView::new(ts, src, ty).expect("view");
    let mut s = String::new();
    json::to_json(&view, &mut s).expect("json");
    s
}

/// Encodes a built block, decodes it both ways, checks both decodes print the
/// same JSON and re-encode to the same bytes, and hands every form to `check`
/// (`block, wire, built`).
fn round_trip(ts: &TableSet, ty: u32, built: &Block, check: &mut Check<'_>) -> Vec<u8> {
    check(built.as_bytes(), &[], true);
    let wire = encode(ts, ty, built);
    let (owned, view) = decode_both(ts, ty, &wire);
    check(owned.as_bytes(), &[], false);
    check(view.as_bytes(), &wire, false);
    // The two decodes mean the same message (the built block too, but its
    // map entries are in insertion order, which JSON shows).
    let j = json_of(ts, ty, Source::owned(owned.as_bytes()));
    assert_eq!(j, json_of(ts, ty, Source::viewing(view.as_bytes(), &wire)));
    // The owned decode re-encodes to the same bytes.
    assert_eq!(encode(ts, ty, &owned), wire);
    wire
}

fn dynamic<'a>(v: MessageView<'a>, name: &str) -> Value<'a> {
    let f = v.field_named(name).expect("field");
    v.get_or_default(f).expect("readable").expect("scalar, string or bytes")
}

fn build_scalars(s: &mut p3::ScalarsBuilder<'_, '_>) -> Res {
    s.set_f_double(-1.25)
        .set_f_float(3.5)
        .set_f_int64(-5_000_000_000)
        .set_f_uint64(u64::MAX)
        .set_f_int32(-42)
        .set_f_fixed64(1 << 60)
        .set_f_fixed32(0xdead_beef)
        .set_f_bool(true)
        .set_f_uint32(4_000_000_000)
        .set_f_color(p3::Color::Blue)
        .set_f_sfixed32(-7)
        .set_f_sfixed64(-8)
        .set_f_sint32(i32::MIN)
        .set_f_sint64(i64::MIN)
        .set_o_int32(0)
        .set_o_bool(false)
        .set_o_color(p3::Color::Unspecified)
        .set_o_double(0.0);
    s.set_f_string("héllo, wörld")?.set_f_bytes(&[0, 1, 255])?;
    s.set_o_string("")?.set_o_bytes(b"")?;
    Ok(())
}

fn check_scalars(v: p3::ScalarsView<'_>) {
    assert_eq!(v.f_double(), -1.25);
    assert_eq!(v.f_float(), 3.5);
    assert_eq!(v.f_int64(), -5_000_000_000);
    assert_eq!(v.f_uint64(), u64::MAX);
    assert_eq!(v.f_int32(), -42);
    assert_eq!(v.f_fixed64(), 1 << 60);
    assert_eq!(v.f_fixed32(), 0xdead_beef);
    assert!(v.f_bool());
    assert_eq!(v.f_string(), "héllo, wörld");
    assert_eq!(v.f_string_bytes(), "héllo, wörld".as_bytes());
    assert_eq!(v.f_bytes(), &[0, 1, 255]);
    assert_eq!(v.f_uint32(), 4_000_000_000);
    assert_eq!(v.f_color(), -3);
    assert_eq!(p3::Color::try_from(v.f_color()), Ok(p3::Color::Blue));
    assert_eq!(v.f_sfixed32(), -7);
    assert_eq!(v.f_sfixed64(), -8);
    assert_eq!(v.f_sint32(), i32::MIN);
    assert_eq!(v.f_sint64(), i64::MIN);
    // Explicit presence: set to the zero value, still present.
    assert!(v.has_o_int32() && v.has_o_string() && v.has_o_bool());
    assert!(v.has_o_color() && v.has_o_double() && v.has_o_bytes());
    assert_eq!((v.o_int32(), v.o_string(), v.o_bool()), (0, "", false));
    assert_eq!((v.o_color(), v.o_double(), v.o_bytes()), (0, 0.0, &[][..]));
    // The dynamic view agrees, field by field.
    let d = v.as_view();
    assert!(matches!(dynamic(d, "f_double"), Value::F64(x) if x == v.f_double()));
    assert!(matches!(dynamic(d, "f_float"), Value::F32(x) if x == v.f_float()));
    assert!(matches!(dynamic(d, "f_int64"), Value::I64(x) if x == v.f_int64()));
    assert!(matches!(dynamic(d, "f_uint64"), Value::U64(x) if x == v.f_uint64()));
    assert!(matches!(dynamic(d, "f_int32"), Value::I32(x) if x == v.f_int32()));
    assert!(matches!(dynamic(d, "f_fixed64"), Value::U64(x) if x == v.f_fixed64()));
    assert!(matches!(dynamic(d, "f_fixed32"), Value::U32(x) if x == v.f_fixed32()));
    assert!(matches!(dynamic(d, "f_bool"), Value::Bool(x) if x == v.f_bool()));
    assert_eq!(dynamic(d, "f_string").as_str(), Some(v.f_string()));
    assert_eq!(dynamic(d, "f_bytes").as_bytes(), Some(v.f_bytes()));
    assert!(matches!(dynamic(d, "f_uint32"), Value::U32(x) if x == v.f_uint32()));
    assert!(matches!(dynamic(d, "f_color"), Value::Enum(x) if x == v.f_color()));
    assert!(matches!(dynamic(d, "f_sfixed32"), Value::I32(x) if x == v.f_sfixed32()));
    assert!(matches!(dynamic(d, "f_sfixed64"), Value::I64(x) if x == v.f_sfixed64()));
    assert!(matches!(dynamic(d, "f_sint32"), Value::I32(x) if x == v.f_sint32()));
    assert!(matches!(dynamic(d, "f_sint64"), Value::I64(x) if x == v.f_sint64()));
}

#[test]
fn every_scalar_type_round_trips() -> Res {
    let mut b = p3::Scalars::builder();
    build_scalars(&mut p3::ScalarsBuilder::root(&mut b))?;
    let block = b.finish();
    round_trip(p3::tables(), p3::Scalars::TYPE_INDEX, &block, &mut |block, wire, _| {
        check_scalars(p3::ScalarsView::from_block(block, wire).expect("view"));
    });
    Ok(())
}

#[test]
fn absent_fields_read_as_defaults() -> Res {
    let block = p3::Scalars::builder().finish();
    let v = p3::ScalarsView::from_block(block.as_bytes(), &[])?;
    assert_eq!((v.f_double(), v.f_int64(), v.f_uint32(), v.f_bool()), (0.0, 0, 0, false));
    assert_eq!((v.f_string(), v.f_bytes(), v.f_color()), ("", &[][..], 0));
    assert!(!v.has_o_int32() && !v.has_o_string() && !v.has_o_bytes() && !v.has_o_bool());
    assert!(encode(p3::tables(), p3::Scalars::TYPE_INDEX, &block).is_empty());

    // proto3 implicit presence: a zero is not encoded; explicit presence: it is.
    let mut b = p3::Scalars::builder();
    p3::ScalarsBuilder::root(&mut b).set_f_int32(0).set_f_string("")?.set_o_int32(0);
    let wire = encode(p3::tables(), p3::Scalars::TYPE_INDEX, &b.finish());
    assert_eq!(wire, [0xa8, 0x01, 0x00]);
    Ok(())
}

#[test]
fn proto2_defaults() -> Res {
    let block = p2::Defaults::builder().finish();
    let v = p2::DefaultsView::from_block(block.as_bytes(), &[])?;
    assert_eq!(
        (v.i32(), v.i64(), v.u32(), v.u64()),
        (-7, -9_000_000_000, 4_000_000_000, 18e18 as u64)
    );
    assert_eq!((v.s32(), v.s64(), v.fx32(), v.fx64()), (-3, -4, 77, 88));
    assert_eq!((v.sfx32(), v.sfx64(), v.flt(), v.dbl()), (-99, -100, 1.5, -2.25));
    assert!(v.yes() && !v.no());
    assert_eq!(v.zero(), 0);
    assert_eq!(v.str(), "hello \"world\"\n");
    assert_eq!(v.byt(), b"\x01\x02\xffabc");
    // An enum field without a default reads as the enum's first value.
    assert_eq!(v.level(), p2::Level::Low as i32);
    assert_eq!(v.level2(), p2::Level::High as i32);
    assert_eq!(v.inf(), f64::INFINITY);
    assert_eq!(v.neg_inf(), f64::NEG_INFINITY);
    assert!(v.nan().is_nan());
    assert!(!v.has_i32() && !v.has_str() && !v.has_yes() && !v.has_level());

    // Setting a field (even to zero / empty) overrides its default.
    let mut b = p2::Defaults::builder();
    let mut d = p2::DefaultsBuilder::root(&mut b);
    d.set_i32(0).set_yes(false).set_level(p2::Level::Medium).set_flt(0.0);
    d.set_str("")?.set_byt(b"")?;
    let block = b.finish();
    round_trip(p2::tables(), p2::Defaults::TYPE_INDEX, &block, &mut |block, wire, _| {
        let v = p2::DefaultsView::from_block(block, wire).expect("view");
        assert_eq!((v.i32(), v.yes(), v.flt(), v.str(), v.byt()), (0, false, 0.0, "", &[][..]));
        assert_eq!(p2::Level::try_from(v.level()), Ok(p2::Level::Medium));
        assert!(v.has_i32() && v.has_yes() && v.has_str() && v.has_byt() && v.has_level());
        assert_eq!(v.i64(), -9_000_000_000); // untouched: still the default
    });
    Ok(())
}

#[test]
fn repeated_fields_packed_and_unpacked() -> Res {
    let mut b = p3::Repeats::builder();
    let mut r = p3::RepeatsBuilder::root(&mut b);
    r.extend_r_double([1.5, -0.0, f64::MAX])?
        .extend_r_float([2.5f32])?
        .extend_r_int64([i64::MIN, 0, i64::MAX])?
        .extend_r_uint64([u64::MAX])?
        .extend_r_int32([-1, 1])?
        .extend_r_fixed64([7])?
        .extend_r_fixed32([8, 9])?
        .extend_r_bool([true, false, true])?
        .extend_r_uint32([u32::MAX])?
        .extend_r_sfixed32([-10])?
        .extend_r_sfixed64([-11])?
        .extend_r_sint32([i32::MIN, i32::MAX])?
        .extend_r_sint64([-12])?
        .extend_unpacked_int32([-1, 300])?
        .extend_unpacked_sint64([-2])?
        .extend_unpacked_bool([false])?
        .extend_unpacked_double([0.5])?
        .extend_r_string(["a", "", "ccc"])?
        .extend_r_bytes([&b"\x00"[..], b""])?
        .extend_r_color([p3::Color::Red, p3::Color::Blue])?;
    r.push_r_color(7)?; // an open enum keeps values it does not declare
    r.add_r_msg()?.set_f_int32(1);
    r.add_r_msg()?;
    r.add_r_msg()?.set_f_string("third")?;
    let block = b.finish();
    let wire = round_trip(p3::tables(), p3::Repeats::TYPE_INDEX, &block, &mut |block, wire, _| {
        let v = p3::RepeatsView::from_block(block, wire).expect("view");
        assert_eq!(v.r_double().to_vec(), [1.5, -0.0, f64::MAX]);
        assert_eq!(v.r_float().to_vec(), [2.5]);
        assert_eq!(v.r_int64().to_vec(), [i64::MIN, 0, i64::MAX]);
        assert_eq!(v.r_uint64().to_vec(), [u64::MAX]);
        assert_eq!(v.r_int32().to_vec(), [-1, 1]);
        assert_eq!(v.r_fixed64().to_vec(), [7]);
        assert_eq!(v.r_fixed32().to_vec(), [8, 9]);
        assert_eq!(v.r_bool().to_vec(), [true, false, true]);
        assert_eq!(v.r_uint32().to_vec(), [u32::MAX]);
        assert_eq!(v.r_sfixed32().to_vec(), [-10]);
        assert_eq!(v.r_sfixed64().to_vec(), [-11]);
        assert_eq!(v.r_sint32().to_vec(), [i32::MIN, i32::MAX]);
        assert_eq!(v.r_sint64().to_vec(), [-12]);
        assert_eq!(v.unpacked_int32().to_vec(), [-1, 300]);
        assert_eq!(v.unpacked_sint64().to_vec(), [-2]);
        assert_eq!(v.unpacked_bool().to_vec(), [false]);
        assert_eq!(v.unpacked_double().to_vec(), [0.5]);
        assert_eq!(v.r_string().to_vec(), ["a", "", "ccc"]);
        assert_eq!(v.r_string_bytes().to_vec(), [&b"a"[..], b"", b"ccc"]);
        assert_eq!(v.r_bytes().to_vec(), [&b"\x00"[..], b""]);
        assert_eq!(v.r_color().to_vec(), [1, -3, 7]);
        // The repeated view's API.
        let msgs = v.r_msg();
        assert_eq!((msgs.len(), msgs.is_empty()), (3, false));
        assert_eq!(msgs.get(0).map(|m| m.f_int32()), Some(1));
        assert_eq!(msgs.last().map(|m| m.f_string()), Some("third"));
        assert!(msgs.get(3).is_none() && msgs.get(usize::MAX).is_none());
        let names: Vec<&str> = msgs.iter().rev().map(|m| m.f_string()).collect();
        assert_eq!(names, ["third", "", ""]);
        let mut n = 0;
        for m in msgs {
            n += 1;
            assert!(!m.f_bool());
        }
        assert_eq!(n, 3);
        assert!(
            v.r_double().first() == Some(1.5) && p3::RepeatsView::from_block(block, wire).is_ok()
        );
    });
    // Packed (proto3 default) and unpacked fields have their wire form:
    // r_int32 (5) is one length-delimited record, unpacked_int32 (20) two tags.
    assert!(wire.windows(4).any(|w| w == [0x2a, 0x0b, 0xff, 0xff]));
    assert_eq!(wire.windows(2).filter(|w| *w == [0xa0, 0x01]).count(), 2);
    Ok(())
}

#[test]
fn maps_of_every_shape() -> Res {
    let mut b = p3::Maps::builder();
    let mut m = p3::MapsBuilder::root(&mut b);
    m.insert_str_str("k1", "v1")?
        .insert_str_str("", "empty key")?
        .insert_str_str("k1", "v1 again")?;
    m.insert_int_int(-1, i64::MIN)?.insert_int_int(0, 0)?;
    m.insert_str_msg("full")?.set_f_int32(5).set_f_string("five")?;
    m.insert_str_msg("empty")?;
    m.insert_u64_bytes(u64::MAX, b"\x00\x01")?;
    m.insert_bool_enum(true, p3::Color::Green)?.insert_bool_enum(false, -9)?;
    m.insert_sint_node(-3)?.set_name("minus three")?.left()?.set_name("leaf")?;
    m.insert_fixed_double(12, 0.25)?;
    let block = b.finish();
    round_trip(p3::tables(), p3::Maps::TYPE_INDEX, &block, &mut |block, wire, built| {
        let v = p3::MapsView::from_block(block, wire).expect("view");
        let s = v.str_str();
        assert_eq!(s.len(), if built { 3 } else { 2 }, "deterministic encoding dedups");
        assert_eq!(s.get("k1"), Some("v1 again"), "the last value of a key wins");
        assert_eq!(s.get(""), Some("empty key"));
        assert_eq!(s.get("nope"), None);
        assert!(s.contains_key("k1") && !s.contains_key("k2"));
        assert_eq!(v.int_int().get(&-1), Some(i64::MIN));
        assert_eq!(v.int_int().get(&0), Some(0));
        let full = v.str_msg().get("full").expect("entry");
        assert_eq!((full.f_int32(), full.f_string()), (5, "five"));
        let empty = v.str_msg().get("empty").expect("entry");
        assert_eq!((empty.f_int32(), empty.f_string(), empty.has_o_int32()), (0, "", false));
        assert_eq!(v.u64_bytes().get(&u64::MAX), Some(&b"\x00\x01"[..]));
        assert_eq!(v.bool_enum().get(&true), Some(p3::Color::Green as i32));
        assert_eq!(v.bool_enum().get(&false), Some(-9));
        let node = v.sint_node().get(&-3).expect("entry");
        assert_eq!(node.name(), "minus three");
        assert_eq!(node.left().map(|l| l.name()), Some("leaf"));
        assert_eq!(v.fixed_double().iter().collect::<Vec<_>>(), [(12, 0.25)]);
        let keys: Vec<&str> = v.str_msg().iter().map(|(k, _)| k).collect();
        if built {
            assert_eq!(keys, ["full", "empty"], "block order = insertion order");
        } else {
            assert_eq!(keys, ["empty", "full"], "deterministic encoding sorts keys");
        }
    });
    Ok(())
}

#[test]
fn oneofs() -> Res {
    use p3::choice::{KindOneof, OnlyScalarsOneof, OtherOneof};
    type Set = Box<dyn Fn(&mut p3::ChoiceBuilder<'_, '_>) -> Res>;
    let cases: Vec<(&str, Set)> = vec![
        (
            "number",
            Box::new(|c| {
                c.set_number(-5);
                Ok(())
            }),
        ),
        (
            "text",
            Box::new(|c| {
                c.set_text("txt")?;
                Ok(())
            }),
        ),
        (
            "blob",
            Box::new(|c| {
                c.set_blob(b"\x01")?;
                Ok(())
            }),
        ),
        (
            "scalars",
            Box::new(|c| {
                c.scalars()?.set_f_int64(64);
                Ok(())
            }),
        ),
        (
            "color",
            Box::new(|c| {
                c.set_color(p3::Color::Red);
                Ok(())
            }),
        ),
        (
            "flag",
            Box::new(|c| {
                c.set_flag(true);
                Ok(())
            }),
        ),
        (
            "real",
            Box::new(|c| {
                c.set_real(2.5);
                Ok(())
            }),
        ),
    ];
    for (name, set) in &cases {
        let mut b = p3::Choice::builder();
        let mut c = p3::ChoiceBuilder::root(&mut b);
        c.set_id("x")?;
        // Another member first: the last one set wins.
        c.set_number(99);
        set(&mut c)?;
        c.node()?.set_name("n")?;
        c.set_a(-1).set_b(2);
        let block = b.finish();
        round_trip(p3::tables(), p3::Choice::TYPE_INDEX, &block, &mut |block, wire, _| {
            let v = p3::ChoiceView::from_block(block, wire).expect("view");
            assert_eq!(v.id(), "x");
            let kind = v.kind().expect("a member is set");
            let ok = match (*name, kind) {
                ("number", KindOneof::Number(n)) => n == -5 && v.has_number(),
                ("text", KindOneof::Text(t)) => t == "txt" && v.text() == "txt",
                ("blob", KindOneof::Blob(b)) => b == b"\x01" && v.has_blob(),
                ("scalars", KindOneof::Scalars(s)) => s.f_int64() == 64 && v.has_scalars(),
                ("color", KindOneof::Color(c)) => c == 1 && v.color() == 1,
                ("flag", KindOneof::Flag(f)) => f && v.flag(),
                ("real", KindOneof::Real(r)) => r == 2.5 && v.real() == 2.5,
                _ => false,
            };
            assert!(ok, "{name}: {kind:?}");
            if *name != "number" {
                assert!(!v.has_number());
                assert_eq!(v.number(), 0);
            }
            assert!(matches!(v.other(), Some(OtherOneof::Node(n)) if n.name() == "n"));
            assert!(!v.has_big() && v.big() == 0);
            // The last member of `only_scalars` set wins.
            assert!(matches!(v.only_scalars(), Some(OnlyScalarsOneof::B(2))));
            assert!(!v.has_a());
        });
    }
    // No member set.
    let block = p3::Choice::builder().finish();
    let v = p3::ChoiceView::from_block(block.as_bytes(), &[])?;
    assert!(v.kind().is_none() && v.other().is_none() && v.only_scalars().is_none());
    assert!(v.scalars().is_none() && !v.has_scalars());
    // Opening a message member twice merges into one object.
    let mut b = p3::Choice::builder();
    let mut c = p3::ChoiceBuilder::root(&mut b);
    c.scalars()?.set_f_int32(1);
    c.scalars()?.set_f_int64(2);
    let block = b.finish();
    let s = p3::ChoiceView::from_block(block.as_bytes(), &[])?.scalars().expect("set");
    assert_eq!((s.f_int32(), s.f_int64()), (1, 2));
    Ok(())
}

#[test]
fn recursive_types() -> Res {
    fn grow(n: &mut p3::NodeBuilder<'_, '_>, depth: u32) -> Res {
        n.set_name(&format!("d{depth}"))?;
        if depth == 0 {
            return Ok(());
        }
        grow(&mut n.left()?, depth - 1)?;
        grow(&mut n.right()?, depth - 1)?;
        grow(&mut n.add_children()?, depth - 1)?;
        grow(&mut n.insert_named("x")?, depth - 1)?;
        Ok(())
    }
    fn count(v: p3::NodeView<'_>, depth: u32) -> usize {
        assert_eq!(v.name(), format!("d{depth}"));
        if depth == 0 {
            assert!(v.left().is_none() && v.children().is_empty() && v.named().is_empty());
            return 1;
        }
        1 + v.left().map_or(0, |l| count(l, depth - 1))
            + v.right().map_or(0, |r| count(r, depth - 1))
            + v.children().iter().map(|c| count(c, depth - 1)).sum::<usize>()
            + v.named().get("x").map_or(0, |n| count(n, depth - 1))
    }
    let mut b = p3::Node::builder();
    grow(&mut p3::NodeBuilder::root(&mut b), 4)?;
    let block = b.finish();
    round_trip(p3::tables(), p3::Node::TYPE_INDEX, &block, &mut |block, wire, _| {
        let v = p3::NodeView::from_block(block, wire).expect("view");
        assert_eq!(count(v, 4), (4u32.pow(5) as usize - 1) / 3);
    });
    Ok(())
}

#[test]
fn nested_types_and_rust_names() -> Res {
    use p3::outer::middle::inner::Kind;
    let mut b = p3::Outer::builder();
    let mut o = p3::OuterBuilder::root(&mut b);
    o.middle()?.inner()?.set_value(1).set_kind(Kind::A);
    o.middle()?.add_inners()?.set_value(2);
    o.direct()?.set_value(3);
    o.extend_kinds([Kind::A, Kind::Unknown])?;
    o.set_type("t")?.set_match("m")?.set_clone("c")?.set_type_bytes("tb")?;
    o.set_self(5).set_has_type(6).set_to_thing(7).set_foo_bar(8);
    let block = b.finish();
    round_trip(p3::tables(), p3::Outer::TYPE_INDEX, &block, &mut |block, wire, _| {
        let v = p3::OuterView::from_block(block, wire).expect("view");
        let middle = v.middle().expect("middle");
        assert_eq!(middle.inner().map(|i| (i.value(), i.kind())), Some((1, Kind::A as i32)));
        assert_eq!(middle.inners().iter().map(|i| i.value()).collect::<Vec<_>>(), [2]);
        assert_eq!(v.direct().map(|d| d.value()), Some(3));
        assert_eq!(v.kinds().to_vec(), [1, 0]);
        // Keywords are raw identifiers or get a `_`; a name another field's
        // accessor already took gets a `_` too.
        assert!(v.has_type() && v.r#type() == "t" && v.type_bytes() == b"t");
        assert_eq!((v.r#match(), v.clone_(), v.type_bytes_()), ("m", "c", "tb"));
        assert_eq!((v.self_(), v.has_type_(), v.to_thing(), v.foo_bar()), (5, 6, 7, 8));
    });
    Ok(())
}

#[test]
fn proto2_required_groups_and_cross_package_types() -> Res {
    let mut b = p2::Legacy::builder();
    let mut l = p2::LegacyBuilder::root(&mut b);
    l.set_id(1).set_name("legacy")?;
    l.scalars()?.set_f_int32(3);
    l.add_many()?.set_f_string("m1")?;
    l.insert_nodes("root")?.set_name("r")?;
    l.extend_unpacked([1, 2])?.extend_packed([3, 4])?.extend_levels([p2::Level::High])?;
    l.grp()?.set_g(10).set_h("group")?;
    l.add_items()?.set_n(1);
    l.add_items()?.set_n(2);
    l.set_color(p3::Color::Green);
    {
        let mut child = l.child()?;
        child.set_id(2).set_name("child")?.set_lvl(p2::Level::Medium);
    }
    l.defaults()?.set_i32(1);
    let block = b.finish();
    let wire = round_trip(p2::tables(), p2::Legacy::TYPE_INDEX, &block, &mut |block, wire, _| {
        let v = p2::LegacyView::from_block(block, wire).expect("view");
        assert_eq!((v.id(), v.name(), v.has_id(), v.has_name()), (1, "legacy", true, true));
        assert_eq!(v.scalars().map(|s| s.f_int32()), Some(3));
        assert_eq!(v.many().get(0).map(|m| m.f_string()), Some("m1"));
        assert_eq!(v.nodes().get("root").map(|n| n.name()), Some("r"));
        assert_eq!((v.unpacked().to_vec(), v.packed().to_vec()), (vec![1, 2], vec![3, 4]));
        assert_eq!(v.levels().to_vec(), [10]);
        assert_eq!(v.grp().map(|g| (g.g(), g.h())), Some((10, "group")));
        assert_eq!(v.items().iter().map(|i| i.n()).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(v.color(), 2);
        let child = v.child().expect("child");
        assert_eq!((child.id(), child.name(), child.lvl()), (2, "child", 5));
        assert!(matches!(child.choice(), Some(p2::legacy::ChoiceOneof::Lvl(5))));
        assert!(matches!(v.choice(), Some(p2::legacy::ChoiceOneof::Child(_))));
        assert_eq!(v.defaults().map(|d| (d.i32(), d.i64())), Some((1, -9_000_000_000)));
    });
    // proto2 unpacked by default: field 6 appears once per element.
    assert_eq!(wire.windows(2).filter(|w| *w == [0x30, 0x01] || *w == [0x30, 0x02]).count(), 2);

    // A missing required field is a decode error (and a view reports it).
    let mut b = p2::Legacy::builder();
    p2::LegacyBuilder::root(&mut b).set_id(1);
    let block = b.finish();
    let wire = encode(p2::tables(), p2::Legacy::TYPE_INDEX, &block);
    assert!(p2::Legacy::decode(&wire, &DecodeOptions::default()).is_err());
    let lenient = DecodeOptions { check_required: false, ..DecodeOptions::default() };
    let decoded = p2::Legacy::decode(&wire, &lenient)?;
    let v = p2::LegacyView::from_block(decoded.as_bytes(), &[])?;
    assert!(!v.has_name() && v.name().is_empty());
    assert_eq!(v.as_view().missing_required(10)?, Some((p2::Legacy::TYPE_INDEX, 2)));
    Ok(())
}

#[test]
fn enums() {
    assert_eq!(p3::Color::try_from(-3), Ok(p3::Color::Blue));
    assert_eq!(p3::Color::try_from(5), Err(5));
    assert_eq!(i32::from(p3::Color::Green), 2);
    assert_eq!(p3::Color::default(), p3::Color::Unspecified);
    assert_eq!(p3::Color::Red.as_str_name(), "COLOR_RED");
    assert_eq!(p3::Color::from_str_name("COLOR_BLUE"), Some(p3::Color::Blue));
    assert_eq!(p3::Color::FULL_NAME, "codegen.p3.Color");
    // Aliases: the first name is the variant, the others constants.
    assert_eq!(p3::Aliased::ALIASED_UNO, p3::Aliased::One);
    assert_eq!(p3::Aliased::from_str_name("ALIASED_UNO"), Some(p3::Aliased::One));
    // No common prefix to strip: names are kept.
    assert_eq!(p2::Level::default(), p2::Level::Low);
    assert_eq!(p2::Level::try_from(2), Err(2));
    assert_eq!(p2::Level::High as i32, 10);
}

#[test]
fn layouts_are_checked() -> Res {
    // The constants agree with the embedded tables, and with tables built at
    // run time from the same schema.
    assert!(p3::layout_matches(p3::tables()) && p2::layout_matches(p2::tables()));
    let runtime = TableSet::from_descriptor_set(protoplane_codegen_tests::TEST_DESCRIPTORS)?;
    assert!(p3::layout_matches(&runtime) && p2::layout_matches(&runtime));
    let social = TableSet::from_proto_files(
        &[concat!(env!("CARGO_MANIFEST_DIR"), "/../../protos/socialnetwork/social_network.proto")],
        &[concat!(env!("CARGO_MANIFEST_DIR"), "/../../protos")],
    )?;
    assert!(socialnetwork::layout_matches(&social));
    assert!(!p3::layout_matches(&social) && !socialnetwork::layout_matches(p3::tables()));

    // A view or builder of the wrong type is refused.
    let block = p3::Repeats::builder().finish();
    assert_eq!(
        p3::ScalarsView::from_block(block.as_bytes(), &[]).err(),
        Some(BlockError::WrongType)
    );
    let repeats = p3::RepeatsView::from_block(block.as_bytes(), &[])?;
    assert!(p3::ScalarsView::from_view(repeats.as_view()).is_err());
    assert!(p3::RepeatsView::from_view(repeats.as_view()).is_ok());
    let mut b = p3::Repeats::builder();
    let root = b.root();
    assert!(p3::ScalarsBuilder::at(&mut b, root).is_none());
    assert!(p3::RepeatsBuilder::at(&mut b, root).is_some());
    // Runtime tables of the same schema work with the typed API too.
    let mut b = protoplane_wire::Builder::new(&runtime, p3::Scalars::TYPE_INDEX)?;
    build_scalars(&mut p3::ScalarsBuilder::root(&mut b))?;
    let block = b.finish();
    let view =
        MessageView::new(&runtime, Source::owned(block.as_bytes()), p3::Scalars::TYPE_INDEX)?;
    check_scalars(p3::ScalarsView::from_view(view)?);
    Ok(())
}

#[test]
#[should_panic(expected = "root is not a codegen.p3.Scalars")]
fn a_builder_of_another_type_is_a_programming_error() {
    let mut b = p3::Repeats::builder();
    let _ = p3::ScalarsBuilder::root(&mut b);
}

#[test]
fn field_ops_are_the_tables_ops() {
    let ts = p3::tables();
    let m = ts.message(p3::Choice::TYPE_INDEX);
    assert_eq!(ts.ops(m), p3::Choice::FIELD_OPS);
    assert_eq!(m.size, p3::Choice::SIZE);
    assert_eq!(ts.message_name(p3::Choice::TYPE_INDEX), p3::Choice::FULL_NAME);
    assert_eq!(p3::maps::StrMsgEntry::FULL_NAME, "codegen.p3.Maps.StrMsgEntry");
}

#[test]
fn types_named_like_the_prelude() -> Res {
    let mut b = p3::Option_::builder();
    let mut o = p3::OptionBuilder::root(&mut b);
    o.result()?.set_ok(1).set_some("yes")?;
    o.add_results()?.set_none(2);
    let block = b.finish();
    round_trip(p3::tables(), p3::Option_::TYPE_INDEX, &block, &mut |block, wire, _| {
        let v = p3::OptionView::from_block(block, wire).expect("view");
        let r = v.result().expect("result");
        assert_eq!((r.ok(), r.some()), (1, "yes"));
        assert!(matches!(r.value(), Some(p3::result::ValueOneof::Some("yes"))));
        let rs = v.results();
        assert!(matches!(
            rs.first().and_then(|r| r.value()),
            Some(p3::result::ValueOneof::None(2))
        ));
    });
    Ok(())
}
