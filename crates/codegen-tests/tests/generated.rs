//! The generated decoders write exactly the blocks the table-driven decoder
//! writes, and fail exactly where it fails, with the same error; the
//! generated encoders write exactly the bytes the table-driven encoder
//! writes, and on forged blocks (decoded blocks with bytes flipped) fail
//! exactly where it fails. On every
//! message type of every schema generated here, on random messages built
//! from the schema tables (canonical encodings, and everything the
//! generated arms hand back to the tables: unknown fields, the other
//! packing, mismatched wire types, closed-enum values the enum lacks,
//! repeated occurrences of singular fields, invalid UTF-8), on truncations
//! and byte flips of those, and on the social-network requests (recorded
//! ones when `../shared` is present, else the demo's generated ones).
//! `fuzz/fuzz_targets/decode_gen.rs` runs the same comparison on
//! libFuzzer's inputs; HyperProtoBench, whose schemas are third-party, is
//! compared by the benchmark worker that generates code for it
//! (`bench/peers-rs`, `--verify`).

mod common;

use std::path::{Path, PathBuf};

use common::Rng;
use protoplane_codegen_tests::{codegen, grpc, socialnetwork};
use protoplane_schema::{Card, Kind, Label, TableSet, WireType};
use protoplane_wire::gen::{EncodeFields, Fields};
use protoplane_wire::{Block, DecodeOptions, Decoder, EncodeOptions, Encoder, Source};

#[path = "../../load/src/social/generate.rs"]
mod generate;

/// A generated package: its name, its tables, its decoders and encoders.
type Package =
    (&'static str, &'static TableSet, &'static [(u32, Fields)], &'static [(u32, EncodeFields)]);

/// Every generated package.
fn packages() -> Vec<Package> {
    vec![
        (
            "socialnetwork",
            socialnetwork::tables(),
            socialnetwork::GENERATED_DECODERS,
            socialnetwork::GENERATED_ENCODERS,
        ),
        (
            "codegen.p2",
            codegen::p2::tables(),
            codegen::p2::GENERATED_DECODERS,
            codegen::p2::GENERATED_ENCODERS,
        ),
        (
            "codegen.p3",
            codegen::p3::tables(),
            codegen::p3::GENERATED_DECODERS,
            codegen::p3::GENERATED_ENCODERS,
        ),
        (
            "grpc.testing",
            grpc::testing::tables(),
            grpc::testing::GENERATED_DECODERS,
            grpc::testing::GENERATED_ENCODERS,
        ),
    ]
}

fn encode(ts: &TableSet, ty: u32, block: &Block, wire: &[u8]) -> Vec<u8> {
    let opts = EncodeOptions { deterministic: true, ..EncodeOptions::default() };
    let mut out = Vec::new();
    Encoder::new()
        .encode_into(ts, ty, Source::viewing(block.as_bytes(), wire), &opts, &mut out)
        .expect("a decoded block encodes");
    out
}

/// Encodes `block` with the tables and with the generated encoder, plain
/// and deterministic, and asserts the same outcome.
fn same_encoding(ts: &TableSet, ty: u32, encoder: EncodeFields, block: &[u8], wire: &[u8]) {
    let src = Source::viewing(block, wire);
    for deterministic in [false, true] {
        let opts = EncodeOptions { deterministic, max_depth: 20, ..EncodeOptions::default() };
        let (mut a, mut b) = (Encoder::new(), Encoder::new());
        let table = a.encode(ts, ty, src, &opts);
        let generated = protoplane_wire::gen::encode(ts, ty, encoder, &mut b, src, &opts);
        assert_eq!(table, generated, "{}: encodings differ", ts.message_name(ty));
    }
}

/// Decodes `wire` both ways (owned and view mode, fresh and reused) and
/// asserts the same outcome. Returns whether it decoded.
fn same(
    ts: &TableSet,
    ty: u32,
    fields: Fields,
    wire: &[u8],
    reused: &mut (Decoder, Block),
) -> bool {
    let encoder = encoder_of(ts, ty);
    let mut ok = false;
    for view in [false, true] {
        let opts = DecodeOptions { view, max_depth: 20, ..DecodeOptions::default() };
        let table = protoplane_wire::decode(ts, ty, wire, &opts);
        let generated = protoplane_wire::gen::decode(ts, ty, fields, wire, &opts);
        let name = ts.message_name(ty);
        match (&table, &generated) {
            (Ok(a), Ok(b)) => {
                // Large copies are padded by where the buffer lies (see
                // `alloc_copy`); below that size the bytes must be equal.
                if wire.len() < 2048 {
                    assert!(a == b, "{name} view={view}: blocks differ for {wire:02x?}");
                }
                assert_eq!(encode(ts, ty, a, wire), encode(ts, ty, b, wire), "{name}");
                same_encoding(ts, ty, encoder, a.as_bytes(), wire);
                // Forged blocks: a few bytes of the object area flipped.
                let mut forged = a.as_bytes().to_vec();
                for i in 0..4 {
                    let at = 16 + (wire.len() * 7 + i * 13) % (forged.len() - 16).max(1);
                    if let Some(byte) = forged.get_mut(at) {
                        *byte ^= 1 << ((i + wire.len()) % 8);
                    }
                    same_encoding(ts, ty, encoder, &forged, wire);
                }
                ok = true;
            }
            (Err(a), Err(b)) => assert_eq!(a, b, "{name} view={view}: errors differ {wire:02x?}"),
            (a, b) => panic!(
                "{name} view={view}: tables {:?}, generated {:?} for {wire:02x?}",
                a.as_ref().map(|_| ()),
                b.as_ref().map(|_| ())
            ),
        }
        let (dec, block) = reused;
        let again = protoplane_wire::gen::decode_into(ts, ty, fields, dec, wire, &opts, block);
        match (&table, again) {
            (Ok(a), Ok(())) => assert_eq!(encode(ts, ty, a, wire), encode(ts, ty, block, wire)),
            (Err(a), Err(b)) => assert_eq!(*a, b, "{name}: reused decoder fails differently"),
            (a, b) => panic!("{name}: fresh {:?}, reused {b:?}", a.as_ref().map(|_| ())),
        }
    }
    ok
}

/// The generated encoder of `ty` in the package whose tables are `ts`.
fn encoder_of(ts: &TableSet, ty: u32) -> EncodeFields {
    packages()
        .into_iter()
        .filter(|p| std::ptr::eq(p.1, ts))
        .flat_map(|p| p.3.iter())
        .find(|(t, _)| *t == ty)
        .map(|&(_, e)| e)
        .expect("a generated encoder")
}

use protoplane_test_support::wire::varint;

fn tag(out: &mut Vec<u8>, number: u32, wt: WireType) {
    protoplane_test_support::wire::tag(out, number, wt as u32);
}

/// A random value of a scalar kind, in its wire form (no tag).
fn scalar(out: &mut Vec<u8>, kind: Kind, r: &mut Rng) {
    let v = match r.below(4) {
        0 => 0,
        1 => r.below(200),
        2 => r.next(),
        _ => (-(r.below(5) as i64) - 1) as u64,
    };
    match kind.wire_type() {
        WireType::Fixed32 => out.extend_from_slice(&(v as u32).to_le_bytes()),
        WireType::Fixed64 => out.extend_from_slice(&v.to_le_bytes()),
        _ => varint(out, if kind == Kind::Bool && !r.chance(8) { v & 1 } else { v }),
    }
}

/// A random message of type `ty`, in wire form: mostly canonical, with
/// every kind of deviation the decoders must agree on now and then.
fn message(ts: &TableSet, ty: u32, r: &mut Rng, depth: u32) -> Vec<u8> {
    let msg = ts.message(ty);
    let fields = ts.fields(msg);
    let ops = ts.ops(msg);
    let mut out = Vec::new();
    for (f, op) in fields.iter().zip(ops) {
        if !r.chance(2) && f.label != Label::Required {
            continue;
        }
        let repeated = f.is_repeated();
        let count = if repeated { r.below(4) } else { 1 + r.chance(10) as u64 };
        if f.kind.is_scalar() && repeated && (op.card == Card::Packed) != r.chance(5) {
            // Packed (canonical for `Packed`, the other form otherwise).
            let mut payload = Vec::new();
            for _ in 0..count {
                scalar(&mut payload, f.kind, r);
            }
            tag(&mut out, f.number, WireType::Len);
            varint(&mut out, payload.len() as u64);
            out.extend_from_slice(&payload);
            continue;
        }
        for _ in 0..count {
            match f.kind {
                Kind::Message if depth < 4 => {
                    let sub = message(ts, f.sub, r, depth + 1);
                    tag(&mut out, f.number, WireType::Len);
                    varint(&mut out, sub.len() as u64);
                    out.extend_from_slice(&sub);
                }
                Kind::Group if depth < 4 => {
                    tag(&mut out, f.number, WireType::StartGroup);
                    out.extend_from_slice(&message(ts, f.sub, r, depth + 1));
                    tag(&mut out, f.number, WireType::EndGroup);
                }
                Kind::Message | Kind::Group => {}
                Kind::String | Kind::Bytes => {
                    let mut s = r.word(12).into_bytes();
                    if r.chance(40) {
                        s.push(0xff); // invalid UTF-8
                    }
                    tag(&mut out, f.number, WireType::Len);
                    varint(&mut out, s.len() as u64);
                    out.extend_from_slice(&s);
                }
                k => {
                    tag(&mut out, f.number, k.wire_type());
                    scalar(&mut out, k, r);
                }
            }
        }
        if r.chance(12) {
            // The field's number with another wire type (kept as unknown).
            tag(&mut out, f.number, WireType::Fixed32);
            out.extend_from_slice(&[1, 2, 3, 4]);
        }
    }
    if r.chance(6) {
        // Unknown fields.
        tag(&mut out, 9000 + r.below(100) as u32, WireType::Varint);
        varint(&mut out, r.next());
        tag(&mut out, 9100, WireType::Len);
        out.extend_from_slice(&[3, b'x', b'y', b'z']);
    }
    if r.chance(5) && depth < 4 {
        // A second occurrence of the whole message: the two merge.
        let second = message(ts, ty, r, depth + 1);
        out.extend_from_slice(&second);
    }
    out
}

#[test]
fn generated_decoders_write_the_blocks_the_tables_write() {
    let mut reused = (Decoder::new(), Block::new());
    let mut r = Rng(0x5eed_0001);
    let mut decoded = 0;
    let mut failed = 0;
    for (package, ts, decoders, _) in packages() {
        assert!(!decoders.is_empty(), "{package}: no generated decoders");
        for &(ty, fields) in decoders {
            for _ in 0..60 {
                let wire = message(ts, ty, &mut r, 0);
                if same(ts, ty, fields, &wire, &mut reused) {
                    decoded += 1;
                } else {
                    failed += 1;
                }
                // Truncations and byte flips.
                for _ in 0..3 {
                    let mut bad = wire.clone();
                    if bad.is_empty() {
                        break;
                    }
                    if r.chance(2) {
                        bad.truncate(r.below(bad.len() as u64) as usize);
                    } else {
                        let at = r.below(bad.len() as u64) as usize;
                        bad[at] ^= 1 << r.below(8);
                    }
                    if same(ts, ty, fields, &bad, &mut reused) {
                        decoded += 1;
                    } else {
                        failed += 1;
                    }
                }
            }
        }
    }
    // Both outcomes were exercised, many times.
    assert!(decoded > 1000 && failed > 200, "decoded {decoded}, failed {failed}");
}

#[test]
fn generated_decoders_agree_on_nesting_limits() {
    // A chain of sub-messages 30 deep against a limit of 20 (see `same`),
    // through the generated arms (Node.next) and through the tables.
    let ts = codegen::p3::tables();
    let Some(&(ty, fields)) = codegen::p3::GENERATED_DECODERS
        .iter()
        .find(|(t, _)| ts.message_name(*t) == "codegen.p3.Node")
    else {
        panic!("no codegen.p3.Node");
    };
    let child = ts
        .fields(ts.message(ty))
        .iter()
        .find(|f| f.kind == Kind::Message && f.sub == ty)
        .expect("Node has a Node field")
        .number;
    let mut wire = Vec::new();
    for _ in 0..30 {
        let mut outer = Vec::new();
        tag(&mut outer, child, WireType::Len);
        varint(&mut outer, wire.len() as u64);
        outer.extend_from_slice(&wire);
        wire = outer;
    }
    assert!(!same(ts, ty, fields, &wire, &mut (Decoder::new(), Block::new())));
}

/// The social-network requests: recorded (`../shared`) or generated.
#[test]
fn generated_decoders_agree_on_the_social_network_requests() {
    let ts = socialnetwork::tables();
    let recorded = std::env::var_os("PROTOPLANE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
        .join("datasets/socialnetwork/messages");
    let mut reused = (Decoder::new(), Block::new());
    let mut checked = 0;
    for name in [
        "RegisterUserRequest",
        "LoginRequest",
        "ComposeMediaRequest",
        "ComposePostRequest",
        "StorePostRequest",
    ] {
        let ty = ts.message_by_name(&format!("socialnetwork.{name}")).expect("request type");
        let fields = socialnetwork::GENERATED_DECODERS
            .iter()
            .find(|(t, _)| *t == ty)
            .map(|&(_, f)| f)
            .expect("a generated decoder");
        let messages = match std::fs::read(recorded.join(format!("{name}.ldelim"))) {
            Ok(bytes) => delimited(&bytes),
            Err(_) => generate::generate(ts, ty, name, 200).expect("generated requests"),
        };
        for m in &messages {
            assert!(same(ts, ty, fields, m, &mut reused), "{name}: does not decode");
            checked += 1;
        }
    }
    assert!(checked >= 1000, "{checked} requests");
}

fn delimited(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (mut len, mut shift, mut i) = (0usize, 0, 0);
        loop {
            let b = bytes[i];
            len |= ((b & 0x7f) as usize) << shift;
            shift += 7;
            i += 1;
            if b < 0x80 {
                break;
            }
        }
        out.push(bytes[i..i + len].to_vec());
        bytes = &bytes[i + len..];
    }
    out
}
