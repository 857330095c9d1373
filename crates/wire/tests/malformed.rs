//! Hostile input. Every way a protobuf message can be malformed must fail
//! with a typed [`DecodeError`] that names the problem, the message type,
//! the field number and the byte offset: never a panic, never an allocation
//! sized by a declared length, never recursion on the thread's stack.
//!
//! Every case runs in both decode modes (owned and zero-copy view) and
//! through both entry points ([`decode`] and a [`Decoder`] writing into a
//! recycled [`Block`]); the two must agree and the block must stay within a
//! small multiple of the input.
//!
//! Inputs are written with the logical wire builder below (`varint`, `tag`,
//! `fixed32`, `fixed64`, `delimited`, `group`); short literal vectors are in
//! hex at the bottom of the file. The schema is `protos/hostile2.proto`
//! (proto2: groups, a required field, a closed enum, packed fields,
//! recursion) and `protos/hostile3.proto` (proto3: implicit presence, UTF-8
//! checked strings, a map).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use protoplane_schema::{ProtoSource, TableSet};
use protoplane_wire::{
    decode, Block, DecodeError, DecodeErrorKind, DecodeOptions, Decoder, EncodeOptions, Encoder,
    MessageView, Source, Value,
};

use DecodeErrorKind::*;

// ---------------------------------------------------------------------------
// The logical wire builder.
// ---------------------------------------------------------------------------

const VARINT: u32 = 0;
const I64: u32 = 1;
const LEN: u32 = 2;
const SGROUP: u32 = 3;
const EGROUP: u32 = 4;
const I32: u32 = 5;

/// Concatenates byte strings of any kind (`Vec<u8>`, `&[u8]`, arrays, `b".."`).
macro_rules! wire {
    ($($part:expr),* $(,)?) => {{
        let mut out: Vec<u8> = Vec::new();
        $(out.extend_from_slice(AsRef::<[u8]>::as_ref(&$part));)*
        out
    }};
}

/// Base-128 varint, shortest form.
fn varint(v: u64) -> Vec<u8> {
    protoplane_test_support::wire::varint_bytes(v)
}

/// A varint of exactly `n` bytes holding `v` (zero-padded; `n` may exceed
/// the ten bytes a varint is allowed).
fn padded(v: u64, n: usize) -> Vec<u8> {
    let mut out = varint(v);
    assert!(out.len() <= n, "{v} needs more than {n} bytes");
    if out.len() < n {
        *out.last_mut().expect("a varint has a byte") |= 0x80;
        out.resize(n - 1, 0x80);
        out.push(0);
    }
    out
}

/// A field tag.
fn tag(field: u32, wire_type: u32) -> Vec<u8> {
    varint(u64::from(field) << 3 | u64::from(wire_type))
}

fn fixed32(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

fn fixed64(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// A length-delimited field (sub-message, string, bytes, packed run).
fn delimited(field: u32, body: &[u8]) -> Vec<u8> {
    wire![tag(field, LEN), varint(body.len() as u64), body]
}

/// A group: start tag, body, end tag.
fn group(field: u32, body: &[u8]) -> Vec<u8> {
    wire![tag(field, SGROUP), body, tag(field, EGROUP)]
}

/// A varint field.
fn int(field: u32, v: u64) -> Vec<u8> {
    wire![tag(field, VARINT), varint(v)]
}

/// `levels` sub-messages nested through LEN field `field` around `core`.
/// Returns the bytes and each level's tag offset, outermost first. Linear
/// time: lengths are computed inside out, headers written outside in.
fn nest_len(field: u32, levels: usize, core: &[u8]) -> (Vec<u8>, Vec<usize>) {
    let mut payload = Vec::with_capacity(levels);
    let mut len = core.len();
    for _ in 0..levels {
        payload.push(len);
        len += tag(field, LEN).len() + varint(len as u64).len();
    }
    let (mut out, mut offsets) = (Vec::with_capacity(len), Vec::with_capacity(levels));
    for &l in payload.iter().rev() {
        offsets.push(out.len());
        out.extend(tag(field, LEN));
        out.extend(varint(l as u64));
    }
    out.extend_from_slice(core);
    (out, offsets)
}

/// `levels` groups numbered `field` nested around `core`; `closed: false`
/// leaves out the end tags.
fn nest_groups(field: u32, levels: usize, core: &[u8], closed: bool) -> Vec<u8> {
    let mut out = tag(field, SGROUP).repeat(levels);
    out.extend_from_slice(core);
    if closed {
        out.extend(tag(field, EGROUP).repeat(levels));
    }
    out
}

/// `pairs` levels of `hostile.Chain`: group `Link` (1) holding sub-message
/// `next` (2), i.e. `2 * pairs` frames. Returns the bytes and the offset of
/// every `Link` start tag, outermost first.
fn nest_chain(pairs: usize) -> (Vec<u8>, Vec<usize>) {
    let mut inner = Vec::with_capacity(pairs);
    let mut len = 0usize; // the innermost Chain is empty
    for _ in 0..pairs {
        inner.push(len);
        len += 3 + varint(len as u64).len(); // 0b 12 <len> .. 0c
    }
    let (mut out, mut offsets) = (Vec::with_capacity(len), Vec::with_capacity(pairs));
    for &l in inner.iter().rev() {
        offsets.push(out.len());
        out.extend(wire![tag(1, SGROUP), tag(2, LEN), varint(l as u64)]);
    }
    out.extend(tag(1, EGROUP).repeat(pairs));
    (out, offsets)
}

/// Reads a varint of a well-formed builder output: (value, length).
fn read_varint(b: &[u8]) -> (u64, usize) {
    let mut v = 0u64;
    for (i, &byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            return (v, i + 1);
        }
    }
    panic!("not a varint: {}", to_hex(b));
}

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap_or("?"), 16).expect("hex digits"))
        .collect()
}

fn to_hex(b: &[u8]) -> String {
    let shown: Vec<String> = b.iter().take(48).map(|x| format!("{x:02x}")).collect();
    let more = if b.len() > 48 { format!(" … ({} bytes)", b.len()) } else { String::new() };
    shown.join(" ") + &more
}

// ---------------------------------------------------------------------------
// Schema and harness.
// ---------------------------------------------------------------------------

fn tables() -> &'static TableSet {
    static TABLES: OnceLock<TableSet> = OnceLock::new();
    TABLES.get_or_init(|| {
        let sources = [
            ProtoSource { name: "hostile2.proto", text: include_str!("protos/hostile2.proto") },
            ProtoSource { name: "hostile3.proto", text: include_str!("protos/hostile3.proto") },
        ];
        TableSet::from_proto_sources(&sources, &["hostile2.proto", "hostile3.proto"])
            .unwrap_or_else(|e| panic!("test schema: {e}"))
    })
}

fn ty(name: &str) -> u32 {
    tables().message_by_name(name).unwrap_or_else(|| panic!("no type {name}"))
}

/// An expected decode failure.
#[derive(Clone, Copy, Debug)]
struct Fail {
    kind: DecodeErrorKind,
    message: &'static str,
    field: u32,
    offset: usize,
}

const fn fail(kind: DecodeErrorKind, message: &'static str, field: u32, offset: usize) -> Fail {
    Fail { kind, message, field, offset }
}

/// Most bytes a decode of `input_len` bytes may leave in a block (its
/// allocation, not just its length): header and root object, then per two
/// input bytes (an empty sub-message) one object of the largest test type
/// (160 B) and its array slot, and the doubling slack of growable arrays
/// and of the vector itself. Declared lengths count for nothing.
fn block_bound(input_len: usize) -> usize {
    4096 + 512 * input_len
}

/// Decodes in owned then view mode, each through `decode` and through a
/// `Decoder` into a fresh `Block`; asserts both entry points agree and that
/// the block's allocation stays bounded. Returns one result per mode.
fn decode_modes(
    case: &str,
    type_name: &str,
    input: &[u8],
    base: DecodeOptions,
) -> Vec<(bool, Result<Block, DecodeError>)> {
    let (ts, t) = (tables(), ty(type_name));
    let mut results = Vec::with_capacity(2);
    for view in [false, true] {
        let opts = DecodeOptions { view, ..base };
        let fresh = decode(ts, t, input, &opts);
        let mut block = Block::new();
        let again = Decoder::new().decode_into(ts, t, input, &opts, &mut block);
        match (&fresh, &again) {
            (Ok(a), Ok(())) => {
                assert_eq!(a.as_bytes(), block.as_bytes(), "{case} (view={view}): blocks differ")
            }
            (Err(a), Err(b)) => assert_eq!(a, b, "{case} (view={view}): errors differ"),
            _ => panic!("{case} (view={view}): decode {fresh:?} but decode_into {again:?}"),
        }
        let held = block.into_bytes().capacity();
        assert!(
            held <= block_bound(input.len()),
            "{case} (view={view}): {held} bytes held for {} input bytes",
            input.len()
        );
        results.push((view, fresh));
    }
    results
}

/// Asserts that decoding fails exactly as `want` says, in both modes.
fn expect_fail(case: &str, type_name: &str, input: &[u8], opts: DecodeOptions, want: Fail) {
    for (view, result) in decode_modes(case, type_name, input, opts) {
        match result {
            Ok(_) => panic!(
                "{case} (view={view}): decoded, expected {want:?}\n  input {}",
                to_hex(input)
            ),
            Err(e) => assert_eq!(
                (e.kind, e.message.as_str(), e.field, e.offset),
                (want.kind, want.message, want.field, want.offset),
                "{case} (view={view}): got \"{e}\"\n  input {}",
                to_hex(input)
            ),
        }
    }
}

/// Asserts that `input` decodes in both modes and encodes to `canonical`.
fn expect_encodes(
    case: &str,
    type_name: &str,
    input: &[u8],
    opts: DecodeOptions,
    canonical: &[u8],
) {
    let (ts, t) = (tables(), ty(type_name));
    for (view, result) in decode_modes(case, type_name, input, opts) {
        let block = result
            .unwrap_or_else(|e| panic!("{case} (view={view}): {e}\n  input {}", to_hex(input)));
        let src = Source::viewing(block.as_bytes(), input);
        let mut out = Vec::new();
        // The encoder's depth limit is its own knob: raise it with the decoder's.
        let eopts =
            EncodeOptions { max_depth: opts.max_depth.max(100), ..EncodeOptions::default() };
        Encoder::new()
            .encode_into(ts, t, src, &eopts, &mut out)
            .unwrap_or_else(|e| panic!("{case} (view={view}): encode: {e}"));
        assert!(
            out == canonical,
            "{case} (view={view}): encoded\n  {}\nexpected\n  {}",
            to_hex(&out),
            to_hex(canonical)
        );
    }
}

/// Asserts that a canonical `input` decodes and encodes back byte-exactly.
fn expect_roundtrip(case: &str, type_name: &str, input: &[u8]) {
    expect_encodes(case, type_name, input, DecodeOptions::default(), input);
}

/// Decodes `input` in both modes and hands each root view to `check`.
fn with_views(case: &str, type_name: &str, input: &[u8], check: impl Fn(bool, MessageView<'_>)) {
    let (ts, t) = (tables(), ty(type_name));
    for (view, result) in decode_modes(case, type_name, input, DecodeOptions::default()) {
        let block = result.unwrap_or_else(|e| panic!("{case} (view={view}): {e}"));
        let src = Source::viewing(block.as_bytes(), input);
        let root = MessageView::new(ts, src, t).unwrap_or_else(|e| panic!("{case}: view: {e}"));
        check(view, root);
    }
}

const DEFAULTS: DecodeOptions = DecodeOptions {
    max_depth: 100,
    max_block: u32::MAX as usize,
    view: false,
    check_required: true,
    device_base: 0,
};
const LENIENT: DecodeOptions = DecodeOptions { check_required: false, ..DEFAULTS };

// ---------------------------------------------------------------------------
// Truncation.
// ---------------------------------------------------------------------------

/// Valid canonical messages, as their top-level fields.
fn samples() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let r_inner = wire![
        delimited(1, &int(2, 7)),
        int(2, -1i64 as u64), // ten-byte varint
        delimited(3, &int(2, 1)),
        delimited(3, &[]),
        group(4, &int(5, 3)),
    ];
    let p2 = vec![
        delimited(1, b"name"),
        delimited(2, &[0, 0xff, 0x80]),
        int(3, 150),
        int(4, 2),
        delimited(5, &wire![fixed32(1), fixed32(u32::MAX)]),
        delimited(6, &fixed64(1 << 40)),
        delimited(7, &wire![varint(1), varint(300), varint(-2i64 as u64)]),
        delimited(8, &r_inner),
        delimited(9, &wire![delimited(1, b"in"), int(3, 5)]),
        delimited(10, &wire![varint(0), varint(1)]),
        delimited(12, "oneof ✓".as_bytes()),
    ];
    let s3 = vec![
        wire![tag(1, I64), fixed64(2.5f64.to_bits())],
        wire![tag(2, I32), fixed32((-1.25f32).to_bits())],
        int(3, -3i64 as u64),
        int(4, u64::MAX),
        int(5, -4i64 as u64),
        wire![tag(6, I64), fixed64(6)],
        wire![tag(7, I32), fixed32(7)],
        int(8, 1),
        delimited(9, "héllo".as_bytes()),
        delimited(11, &wire![int(5, 5), delimited(9, b"kid")]),
        delimited(12, &[0xde, 0xad]),
        int(13, 13),
        int(14, 1),
        wire![tag(15, I32), fixed32(-15i32 as u32)],
        wire![tag(16, I64), fixed64(-16i64 as u64)], // two-byte tag
        int(17, 33),
        int(18, 35),
        delimited(20, &wire![fixed32(20), fixed32(21)]),
        delimited(21, &fixed64(21)),
        delimited(22, &wire![varint(22), varint(-1i64 as u64)]),
        delimited(23, &wire![delimited(1, b"k"), delimited(2, &int(5, 1))]),
        int(24, 0), // explicit presence: zero is encoded
    ];
    let r = vec![
        delimited(1, &delimited(1, &int(2, 1))),
        int(2, 2),
        delimited(3, &group(4, &int(5, 4))),
        group(4, &int(5, 9)),
        int(9, 9),                                    // unknown varint
        group(10, &wire![int(1, 1), group(11, &[])]), // unknown nested groups
        wire![tag(15, I32), fixed32(15)],             // unknown fixed32
        delimited(16, b"unknown"),                    // unknown, two-byte tag
        wire![tag(2, I64), fixed64(2)],               // known number, wrong wire type
    ];
    vec![("hostile.P2", p2), ("hostile3.S3", s3), ("hostile.R", r)]
}

/// What a cut `k` bytes into the top-level field `chunk` at offset `start`
/// must report; `None` for cuts inside a group, whose report depends on
/// where in the group's body the cut falls (checked more loosely).
fn cut_error(message: &'static str, chunk: &[u8], start: usize, k: usize) -> Option<Fail> {
    let (t, tag_len) = read_varint(chunk);
    let (field, wire_type) = ((t >> 3) as u32, (t & 7) as u32);
    if k < tag_len {
        return Some(fail(Truncated, message, 0, start));
    }
    match wire_type {
        VARINT | I64 | I32 => Some(fail(Truncated, message, field, start)),
        LEN => {
            let (_, len_len) = read_varint(&chunk[tag_len..]);
            let kind = if k < tag_len + len_len { Truncated } else { LengthOutOfBounds };
            Some(fail(kind, message, field, start))
        }
        _ => None,
    }
}

#[test]
fn every_prefix_decodes_or_fails_typed() {
    for (type_name, chunks) in samples() {
        let full = chunks.concat();
        expect_roundtrip(&format!("{type_name} sample"), type_name, &full);
        let required_at = (type_name == "hostile.P2").then(|| chunks[..3].concat().len());
        let mut start = 0;
        for chunk in &chunks {
            for k in 0..chunk.len() {
                let cut = start + k;
                let prefix = &full[..cut];
                let case = format!("{type_name} cut at {cut}/{}", full.len());
                if k == 0 {
                    // A field boundary: a valid (shorter) message.
                    expect_encodes(&case, type_name, prefix, LENIENT, prefix);
                    match required_at {
                        Some(at) if cut < at => expect_fail(
                            &case,
                            type_name,
                            prefix,
                            DEFAULTS,
                            fail(MissingRequired, "hostile.P2", 3, cut),
                        ),
                        _ => expect_encodes(&case, type_name, prefix, DEFAULTS, prefix),
                    }
                } else if let Some(want) = cut_error(type_name, chunk, start, k) {
                    expect_fail(&case, type_name, prefix, LENIENT, want);
                } else {
                    // Inside a group: the cut is found where the body stops.
                    for (view, result) in decode_modes(&case, type_name, prefix, LENIENT) {
                        let e =
                            result.err().unwrap_or_else(|| panic!("{case} (view={view}): decoded"));
                        assert!(
                            matches!(e.kind, Truncated | UnterminatedGroup | LengthOutOfBounds)
                                && (start..=cut).contains(&e.offset),
                            "{case} (view={view}): {e}"
                        );
                    }
                }
            }
            start += chunk.len();
        }
        expect_encodes(&format!("{type_name} whole"), type_name, &full, LENIENT, &full);
    }
}

#[test]
fn truncated_scalars_report_the_field() {
    let cases: Vec<(&str, &str, Vec<u8>, Fail)> = vec![
        (
            "tag cut",
            "hostile.R",
            padded(2 << 3, 2)[..1].to_vec(),
            fail(Truncated, "hostile.R", 0, 0),
        ),
        (
            "varint cut",
            "hostile.R",
            wire![tag(2, VARINT), [0x80]],
            fail(Truncated, "hostile.R", 2, 0),
        ),
        ("varint missing", "hostile.R", tag(2, VARINT), fail(Truncated, "hostile.R", 2, 0)),
        (
            "fixed64 cut",
            "hostile3.S3",
            wire![tag(1, I64), [1; 7]],
            fail(Truncated, "hostile3.S3", 1, 0),
        ),
        (
            "fixed32 cut",
            "hostile3.S3",
            wire![tag(2, I32), [1; 3]],
            fail(Truncated, "hostile3.S3", 2, 0),
        ),
        (
            "unknown fixed64 cut",
            "hostile.R",
            wire![int(2, 1), tag(9, I64), [1; 4]],
            fail(Truncated, "hostile.R", 9, 2),
        ),
        (
            "wrong wire type, cut",
            "hostile.R",
            wire![tag(2, I32), [1; 2]],
            fail(Truncated, "hostile.R", 2, 0),
        ),
        (
            "in a sub-message",
            "hostile.R",
            delimited(1, &wire![tag(2, VARINT), [0xff]]),
            fail(Truncated, "hostile.R", 2, 2),
        ),
        (
            "in a group",
            "hostile.R",
            wire![tag(4, SGROUP), tag(5, VARINT), [0xff, 0xff]],
            fail(Truncated, "hostile.R.G", 5, 1),
        ),
        (
            "in an unknown group",
            "hostile.R",
            wire![tag(10, SGROUP), tag(1, I32), [1]],
            fail(Truncated, "hostile.R", 10, 1),
        ),
        (
            "length cut",
            "hostile.P2",
            wire![tag(1, LEN), [0x80]],
            fail(Truncated, "hostile.P2", 1, 0),
        ),
    ];
    for (case, type_name, input, want) in cases {
        expect_fail(case, type_name, &input, LENIENT, want);
    }
}

// ---------------------------------------------------------------------------
// Varints, tags, wire types, field numbers.
// ---------------------------------------------------------------------------

#[test]
fn overlong_varints_and_tags_fail() {
    let eleven = padded(0, 11);
    let cases: Vec<(&str, &str, Vec<u8>, Fail)> = vec![
        (
            "11-byte tag",
            "hostile.R",
            padded(2 << 3, 11),
            fail(OverlongTagOrLength, "hostile.R", 0, 0),
        ),
        ("all-ones tag", "hostile.R", vec![0xff; 11], fail(OverlongTagOrLength, "hostile.R", 0, 0)),
        // Tags and lengths are 32-bit: past five bytes they are malformed
        // however they end (protobuf C++ and upb reject them too).
        (
            "6-byte padded tag",
            "hostile.R",
            padded(2 << 3, 6),
            fail(OverlongTagOrLength, "hostile.R", 0, 0),
        ),
        (
            "6-byte padded tag after a field",
            "hostile.R",
            wire![int(2, 1), padded(2 << 3, 6), varint(1)],
            fail(OverlongTagOrLength, "hostile.R", 0, 2),
        ),
        (
            "6-byte padded length",
            "hostile.R",
            wire![tag(1, LEN), padded(2, 6), int(2, 1)],
            fail(OverlongTagOrLength, "hostile.R", 1, 0),
        ),
        (
            "6-byte padded length of a packed run",
            "hostile.P2",
            wire![tag(7, LEN), padded(1, 6), varint(1)],
            fail(OverlongTagOrLength, "hostile.P2", 7, 0),
        ),
        (
            "6-byte padded string length",
            "hostile3.S3",
            wire![tag(9, LEN), padded(1, 6), b"a"],
            fail(OverlongTagOrLength, "hostile3.S3", 9, 0),
        ),
        (
            "6-byte padded length of an unknown field",
            "hostile.R",
            wire![tag(9, LEN), padded(1, 6), b"a"],
            fail(OverlongTagOrLength, "hostile.R", 9, 0),
        ),
        (
            "6-byte padded tag in an unknown group",
            "hostile.R",
            wire![tag(10, SGROUP), padded(1 << 3, 6), varint(1), tag(10, EGROUP)],
            fail(OverlongTagOrLength, "hostile.R", 10, 1),
        ),
        (
            "11-byte value",
            "hostile.R",
            wire![tag(2, VARINT), eleven],
            fail(VarintTooLong, "hostile.R", 2, 0),
        ),
        (
            "11-byte length",
            "hostile.R",
            wire![tag(1, LEN), eleven],
            fail(OverlongTagOrLength, "hostile.R", 1, 0),
        ),
        (
            "11-byte string length",
            "hostile3.S3",
            wire![tag(9, LEN), eleven],
            fail(OverlongTagOrLength, "hostile3.S3", 9, 0),
        ),
        (
            "11-byte unknown value",
            "hostile.R",
            wire![int(2, 1), tag(9, VARINT), eleven],
            fail(VarintTooLong, "hostile.R", 9, 2),
        ),
        (
            "11-byte unknown length",
            "hostile.R",
            wire![tag(9, LEN), eleven],
            fail(OverlongTagOrLength, "hostile.R", 9, 0),
        ),
        (
            "11-byte value in an unknown group",
            "hostile.R",
            wire![tag(10, SGROUP), tag(1, VARINT), eleven],
            fail(VarintTooLong, "hostile.R", 10, 1),
        ),
        (
            "11-byte tag in an unknown group",
            "hostile.R",
            wire![tag(10, SGROUP), eleven],
            fail(OverlongTagOrLength, "hostile.R", 10, 1),
        ),
        (
            "11-byte value in a sub-message",
            "hostile.R",
            delimited(1, &wire![tag(2, VARINT), eleven]),
            fail(VarintTooLong, "hostile.R", 2, 2),
        ),
        (
            "11-byte element in a packed run",
            "hostile.P2",
            delimited(7, &wire![varint(1), eleven, varint(1)]),
            fail(VarintTooLong, "hostile.P2", 7, 0),
        ),
        (
            "11-byte closed-enum value",
            "hostile.P2",
            wire![tag(4, VARINT), eleven],
            fail(VarintTooLong, "hostile.P2", 4, 0),
        ),
        ("tag 2^32", "hostile.R", varint(1 << 32), fail(TagTooLarge, "hostile.R", 0, 0)),
        ("tag 2^64-1", "hostile.R", varint(u64::MAX), fail(OverlongTagOrLength, "hostile.R", 0, 0)),
        (
            "tag 2^32 + field 2",
            "hostile.R",
            wire![int(2, 1), varint(1 << 32 | 2 << 3)],
            fail(TagTooLarge, "hostile.R", 0, 2),
        ),
        (
            "tag 2^32 in a sub-message",
            "hostile.R",
            delimited(3, &varint(1 << 34)),
            fail(TagTooLarge, "hostile.R", 0, 2),
        ),
        (
            "tag 2^32 in an unknown group",
            "hostile.R",
            wire![tag(10, SGROUP), varint(1 << 32)],
            fail(TagTooLarge, "hostile.R", 10, 1),
        ),
        (
            "tag u32::MAX has wire type 7",
            "hostile.R",
            varint(u32::MAX.into()),
            fail(InvalidWireType, "hostile.R", (1 << 29) - 1, 0),
        ),
    ];
    for (case, type_name, input, want) in cases {
        expect_fail(case, type_name, &input, LENIENT, want);
    }
}

#[test]
fn overlong_but_terminated_varints_are_accepted() {
    // The limit is ten bytes for a value and five for a tag or a length,
    // not the shortest form: padded ones decode; the encoder writes the
    // shortest form.
    let input = wire![padded(2 << 3, 5), padded(5, 10)];
    expect_encodes("padded tag and value", "hostile.R", &input, DEFAULTS, &int(2, 5));
    let input = wire![tag(1, LEN), padded(2, 5), int(2, 1)];
    expect_encodes("padded length", "hostile.R", &input, DEFAULTS, &delimited(1, &int(2, 1)));
    let input = wire![tag(10, SGROUP), padded(1 << 3, 5), varint(1), tag(10, EGROUP)];
    expect_roundtrip("padded tag in an unknown group", "hostile.R", &input);
    // Bits past 64 are dropped, as every protobuf implementation does.
    let input = wire![tag(4, VARINT), [0xff; 9], [0x7f]];
    expect_encodes("bits past 64", "hostile.S2", &input, DEFAULTS, &int(4, u64::MAX));
    // The largest field number is an ordinary unknown field.
    expect_roundtrip("field 2^29-1", "hostile.R", &int((1 << 29) - 1, 1));
}

#[test]
fn invalid_wire_types_and_field_zero_fail() {
    let mut cases: Vec<(String, &str, Vec<u8>, Fail)> = Vec::new();
    for wt in [6, 7] {
        let c = |s: &str| format!("{s}, wire type {wt}");
        cases.extend([
            (c("known field"), "hostile.R", tag(2, wt), fail(InvalidWireType, "hostile.R", 2, 0)),
            (c("unknown field"), "hostile.R", tag(9, wt), fail(InvalidWireType, "hostile.R", 9, 0)),
            (
                c("after a field"),
                "hostile.R",
                wire![int(2, 1), tag(3, wt)],
                fail(InvalidWireType, "hostile.R", 3, 2),
            ),
            (
                c("two-byte tag"),
                "hostile3.S3",
                wire![tag(16, wt), [0; 8]],
                fail(InvalidWireType, "hostile3.S3", 16, 0),
            ),
            (
                c("in a sub-message"),
                "hostile.R",
                delimited(1, &tag(2, wt)),
                fail(InvalidWireType, "hostile.R", 2, 2),
            ),
            (
                c("in a known group"),
                "hostile.R",
                wire![tag(4, SGROUP), tag(5, wt), tag(4, EGROUP)],
                fail(InvalidWireType, "hostile.R.G", 5, 1),
            ),
            (
                c("in an unknown group"),
                "hostile.R",
                wire![tag(10, SGROUP), int(1, 1), tag(1, wt), tag(10, EGROUP)],
                fail(InvalidWireType, "hostile.R", 10, 3),
            ),
        ]);
    }
    for wt in 0..8 {
        let c = |s: &str| format!("{s}, field 0 wire type {wt}");
        cases.extend([
            (
                c("root"),
                "hostile.R",
                wire![tag(0, wt), [0; 8]],
                fail(FieldNumberZero, "hostile.R", 0, 0),
            ),
            (
                c("after a field"),
                "hostile3.S3",
                wire![int(5, 1), tag(0, wt), [0; 8]],
                fail(FieldNumberZero, "hostile3.S3", 0, 2),
            ),
            (
                c("in a sub-message"),
                "hostile.R",
                delimited(3, &wire![tag(0, wt), [0; 8]]),
                fail(FieldNumberZero, "hostile.R", 0, 2),
            ),
            (
                c("in a known group"),
                "hostile.R",
                wire![tag(4, SGROUP), tag(0, wt), [0; 8]],
                fail(FieldNumberZero, "hostile.R.G", 0, 1),
            ),
            (
                c("in an unknown group"),
                "hostile.R",
                wire![tag(10, SGROUP), tag(0, wt), [0; 8]],
                fail(FieldNumberZero, "hostile.R", 10, 1),
            ),
        ]);
    }
    // Field 0 hidden in a padded tag is still field 0.
    cases.push((
        "padded field 0".into(),
        "hostile.R",
        padded(0, 3),
        fail(FieldNumberZero, "hostile.R", 0, 0),
    ));
    for (case, type_name, input, want) in cases {
        expect_fail(&case, type_name, &input, LENIENT, want);
    }
}

// ---------------------------------------------------------------------------
// Lengths and memory.
// ---------------------------------------------------------------------------

/// Inputs whose one length prefix is `len`, followed by two payload bytes:
/// (case, type, input, expected failure when `len` > 2 would be out of bounds).
/// A length that needs more than five bytes is malformed before it is out
/// of bounds.
fn length_cases(len: u64) -> Vec<(&'static str, &'static str, Vec<u8>, Fail)> {
    let l = varint(len);
    let oob = if l.len() > 5 { OverlongTagOrLength } else { LengthOutOfBounds };
    vec![
        ("sub-message", "hostile.R", wire![tag(1, LEN), l, b"ab"], fail(oob, "hostile.R", 1, 0)),
        (
            "repeated sub-message",
            "hostile.R",
            wire![int(2, 1), tag(3, LEN), l, b"ab"],
            fail(oob, "hostile.R", 3, 2),
        ),
        (
            "proto2 string",
            "hostile.P2",
            wire![tag(1, LEN), l, b"ab"],
            fail(oob, "hostile.P2", 1, 0),
        ),
        ("bytes", "hostile.P2", wire![tag(2, LEN), l, b"ab"], fail(oob, "hostile.P2", 2, 0)),
        (
            "proto3 string",
            "hostile3.S3",
            wire![tag(9, LEN), l, b"ab"],
            fail(oob, "hostile3.S3", 9, 0),
        ),
        (
            "packed fixed32",
            "hostile.P2",
            wire![tag(5, LEN), l, b"ab"],
            fail(oob, "hostile.P2", 5, 0),
        ),
        (
            "packed fixed64",
            "hostile.P2",
            wire![tag(6, LEN), l, b"ab"],
            fail(oob, "hostile.P2", 6, 0),
        ),
        ("packed int32", "hostile.P2", wire![tag(7, LEN), l, b"ab"], fail(oob, "hostile.P2", 7, 0)),
        (
            "packed closed enum",
            "hostile.P2",
            wire![tag(10, LEN), l, b"ab"],
            fail(oob, "hostile.P2", 10, 0),
        ),
        (
            "oneof sub-message",
            "hostile.P2",
            wire![tag(13, LEN), l, b"ab"],
            fail(oob, "hostile.P2", 13, 0),
        ),
        (
            "map entry",
            "hostile3.S3",
            wire![tag(23, LEN), l, b"ab"],
            fail(oob, "hostile3.S3", 23, 0),
        ),
        ("unknown field", "hostile.R", wire![tag(9, LEN), l, b"ab"], fail(oob, "hostile.R", 9, 0)),
        (
            "known number, LEN instead of varint",
            "hostile.R",
            wire![tag(2, LEN), l, b"ab"],
            fail(oob, "hostile.R", 2, 0),
        ),
        (
            "unknown field in an unknown group",
            "hostile.R",
            wire![tag(10, SGROUP), tag(9, LEN), l, b"ab"],
            fail(oob, "hostile.R", 10, 1),
        ),
        (
            "unknown field in a known group",
            "hostile.R",
            wire![tag(4, SGROUP), tag(6, LEN), l, b"ab"],
            fail(oob, "hostile.R.G", 6, 1),
        ),
        (
            // The length fits the input but not the enclosing sub-message.
            "past the end of the enclosing sub-message",
            "hostile.R",
            wire![delimited(1, &wire![int(2, 1), tag(3, LEN), l]), b"ab"],
            fail(oob, "hostile.R", 3, 4),
        ),
    ]
}

#[test]
fn lengths_past_the_end_fail_without_allocating() {
    let (ts, mut decoder, mut block) = (tables(), Decoder::new(), Block::new());
    for len in [3, 100, 1 << 31, (1 << 32) - 1, 1 << 32, (1 << 32) + 1, 1 << 63, u64::MAX] {
        for (case, type_name, input, want) in length_cases(len) {
            let case = format!("{case}, length {len:#x}");
            expect_fail(&case, type_name, &input, LENIENT, want);
            // The same block and decoder across every case: the capacity it
            // ends with is the most any hostile length made it take.
            for opts in [DecodeOptions::default(), DecodeOptions::view()] {
                let r = decoder.decode_into(ts, ty(type_name), &input, &opts, &mut block);
                assert_eq!(r.map_err(|e| e.kind), Err(want.kind), "{case}");
                // What was decoded before the bad length: a few objects.
                let used = block.as_bytes().len();
                assert!(used <= 1024, "{case}: block of {used} bytes");
                let bytes = std::mem::take(&mut block).into_bytes();
                assert!(
                    bytes.capacity() <= block_bound(input.len()),
                    "{case}: {} bytes",
                    bytes.capacity()
                );
                block = Block::from_bytes(bytes);
            }
        }
    }
    // A length that fits exactly is fine.
    expect_roundtrip("exact length", "hostile.R", &delimited(1, &int(2, 1)));
}

#[test]
fn decoded_blocks_stay_proportional_to_the_input() {
    // Many small fields of every shape: the block's allocation grows with
    // the input, not with what the input declares.
    let (mut input, mut known, mut unknown) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..200u64 {
        let kid = delimited(3, &wire![int(2, i), group(4, &int(5, i))]);
        let extra = wire![int(9, i), group(10, &int(1, i))];
        input.extend(wire![kid, extra]);
        known.extend(kid);
        unknown.extend(extra);
    }
    // Unknown fields are written after the known ones, in arrival order.
    let canonical = wire![known, unknown];
    expect_encodes("many small fields", "hostile.R", &input, DEFAULTS, &canonical);
    // checks block_bound
}

#[test]
fn size_limits_and_unknown_types_fail_typed() {
    let input = wire![delimited(1, &[b'x'; 64]), int(3, 1)];
    let small = DecodeOptions { max_block: 32, ..DEFAULTS };
    expect_fail(
        "input over max_block",
        "hostile.P2",
        &input,
        small,
        fail(BlockTooLarge, "hostile.P2", 0, 0),
    );
    // Growth past the limit while decoding: 48-byte R objects, 2 input bytes each.
    let kids = delimited(3, &[]).repeat(10);
    let limited = DecodeOptions { max_block: 200, ..DEFAULTS };
    for (view, result) in decode_modes("growth over max_block", "hostile.R", &kids, limited) {
        let e = result.err().unwrap_or_else(|| panic!("view={view}: decoded"));
        assert_eq!((e.kind, e.message.as_str(), e.field), (BlockTooLarge, "hostile.R", 3), "{e}");
        assert!(e.offset % 2 == 0 && e.offset < kids.len(), "{e}");
    }
    let e = decode(tables(), 9999, b"", &DEFAULTS).expect_err("no such type");
    assert_eq!((e.kind, e.field, e.offset), (UnknownType, 0, 0), "{e}");
}

// ---------------------------------------------------------------------------
// Groups.
// ---------------------------------------------------------------------------

#[test]
fn bad_group_nesting_fails() {
    let cases: Vec<(&str, Vec<u8>, Fail)> = vec![
        ("end without start", tag(5, EGROUP), fail(UnmatchedEndGroup, "hostile.R", 5, 0)),
        (
            "end of the known group's number, never started",
            wire![int(2, 1), tag(4, EGROUP)],
            fail(UnmatchedEndGroup, "hostile.R", 4, 2),
        ),
        (
            "end in a sub-message closing nothing",
            delimited(1, &tag(4, EGROUP)),
            fail(UnmatchedEndGroup, "hostile.R", 4, 2),
        ),
        (
            "known group closed with the wrong number",
            wire![tag(4, SGROUP), int(5, 1), tag(5, EGROUP)],
            fail(UnmatchedEndGroup, "hostile.R.G", 5, 3),
        ),
        (
            "known group closed twice",
            wire![group(4, &int(5, 1)), tag(4, EGROUP)],
            fail(UnmatchedEndGroup, "hostile.R", 4, 4),
        ),
        (
            "known group never closed",
            wire![tag(4, SGROUP), int(5, 1)],
            fail(UnterminatedGroup, "hostile.R.G", 4, 3),
        ),
        ("known group start only", tag(4, SGROUP), fail(UnterminatedGroup, "hostile.R.G", 4, 1)),
        (
            "known group not closed before its sub-message ends",
            wire![delimited(1, &wire![tag(4, SGROUP), int(5, 1)]), tag(4, EGROUP)],
            fail(UnterminatedGroup, "hostile.R.G", 4, 5),
        ),
        (
            "unknown group closed with the wrong number",
            wire![tag(10, SGROUP), int(1, 1), tag(11, EGROUP)],
            fail(UnmatchedEndGroup, "hostile.R", 10, 3),
        ),
        (
            "unknown group closing the known group around it",
            wire![tag(4, SGROUP), tag(6, SGROUP), tag(4, EGROUP)],
            fail(UnmatchedEndGroup, "hostile.R.G", 6, 2),
        ),
        (
            "nested unknown groups closed in the wrong order",
            wire![tag(10, SGROUP), tag(11, SGROUP), tag(10, EGROUP), tag(11, EGROUP)],
            fail(UnmatchedEndGroup, "hostile.R", 10, 2),
        ),
        (
            "unknown group never closed",
            wire![tag(10, SGROUP), int(1, 1)],
            fail(UnterminatedGroup, "hostile.R", 10, 0),
        ),
        (
            "inner unknown group never closed",
            wire![int(2, 1), tag(10, SGROUP), tag(11, SGROUP), tag(11, EGROUP), tag(12, SGROUP)],
            fail(UnterminatedGroup, "hostile.R", 12, 2),
        ),
        (
            "unknown group cut by its sub-message's end",
            wire![delimited(1, &tag(10, SGROUP)), tag(10, EGROUP)],
            fail(UnterminatedGroup, "hostile.R", 10, 2),
        ),
        (
            "message field sent as a group, never closed",
            wire![tag(1, SGROUP), int(2, 1)],
            fail(UnterminatedGroup, "hostile.R", 1, 0),
        ),
    ];
    for (case, input, want) in cases {
        expect_fail(case, "hostile.R", &input, LENIENT, want);
    }
}

#[test]
fn well_formed_unknown_groups_round_trip() {
    let nested = wire![
        int(1, 1),
        wire![tag(2, I64), fixed64(2)],
        delimited(3, b"three"),
        group(11, &wire![group(12, &[]), wire![tag(4, I32), fixed32(4)], group(11, &int(1, 0))]),
        group(10, &[]), // same number as the enclosing group
    ];
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        ("empty unknown group", "hostile.R", group(10, &[])),
        ("nested unknown groups", "hostile.R", wire![int(2, 7), group(10, &nested)]),
        ("after a known group", "hostile.R", wire![group(4, &int(5, 1)), group(10, &nested)]),
        (
            "in a known group",
            "hostile.R",
            group(4, &wire![int(5, 1), group(6, &nested), group(7, &[])]),
        ),
        ("in a sub-message", "hostile.R", delimited(1, &wire![int(2, 1), group(10, &nested)])),
        // A group where the schema expects a sub-message: kept as unknown.
        ("sub-message number sent as a group", "hostile.R", wire![int(2, 1), group(1, &int(2, 5))]),
        ("in a proto3 message", "hostile3.S3", wire![int(5, 1), group(30, &nested)]),
    ];
    for (case, type_name, input) in cases {
        expect_roundtrip(case, type_name, &input);
    }
    with_views("unknown bytes are kept verbatim", "hostile.R", &group(10, &nested), |view, r| {
        let unknown = r.unknown_fields().expect("in bounds");
        assert_eq!(unknown, &group(10, &nested)[..], "view={view}");
    });
}

// ---------------------------------------------------------------------------
// Depth.
// ---------------------------------------------------------------------------

/// Decodes a bomb on a thread with a small stack (recursion would overflow
/// it) and returns the error and how long the decode took.
fn detonate(
    type_name: &'static str,
    input: Vec<u8>,
    opts: DecodeOptions,
) -> Vec<(DecodeError, Duration)> {
    let t = ty(type_name);
    let ts = tables();
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || {
            [false, true]
                .into_iter()
                .map(|view| {
                    let opts = DecodeOptions { view, ..opts };
                    let start = Instant::now();
                    let r = Decoder::new().decode_into(ts, t, &input, &opts, &mut Block::new());
                    (r.expect_err("a bomb must not decode"), start.elapsed())
                })
                .collect()
        })
        .expect("spawn")
        .join()
        .expect("no stack overflow, no panic")
}

#[test]
fn nesting_limit_is_100_by_default() {
    let d = DecodeOptions::default();
    assert_eq!(
        (d.max_depth, d.max_block, d.view, d.check_required),
        (100, u32::MAX as usize, false, true)
    );
    let core = int(2, 1);
    let (ok, _) = nest_len(1, 100, &core);
    expect_roundtrip("100 sub-messages", "hostile.R", &ok);
    let (bad, at) = nest_len(1, 101, &core);
    expect_fail(
        "101 sub-messages",
        "hostile.R",
        &bad,
        DEFAULTS,
        fail(DepthExceeded, "hostile.R", 1, at[100]),
    );
    let (ok, _) = nest_len(3, 100, &[]);
    expect_roundtrip("100 repeated sub-messages", "hostile.R", &ok);
    let (bad, at) = nest_len(3, 101, &[]);
    expect_fail(
        "101 repeated",
        "hostile.R",
        &bad,
        DEFAULTS,
        fail(DepthExceeded, "hostile.R", 3, at[100]),
    );

    // A known group is a level: 99 sub-messages + G fit, 100 + G do not.
    let (ok, _) = nest_len(1, 99, &group(4, &int(5, 1)));
    expect_roundtrip("99 sub-messages + group", "hostile.R", &ok);
    let (bad, at) = nest_len(1, 100, &group(4, &int(5, 1)));
    let g = at[99] + 2; // the last level's header is 2 bytes
    expect_fail(
        "100 sub-messages + group",
        "hostile.R",
        &bad,
        DEFAULTS,
        fail(DepthExceeded, "hostile.R", 4, g),
    );

    // Groups and sub-messages alternating (hostile.Chain): 100 levels fit.
    let (ok, _) = nest_chain(50);
    expect_roundtrip("50 group/sub-message pairs", "hostile.Chain", &ok);
    let (bad, at) = nest_chain(51);
    expect_fail(
        "51 pairs",
        "hostile.Chain",
        &bad,
        DEFAULTS,
        fail(DepthExceeded, "hostile.Chain", 1, at[50]),
    );

    // Unknown groups count as levels too, also below sub-messages.
    expect_roundtrip("100 unknown groups", "hostile.R", &nest_groups(10, 100, &int(1, 1), true));
    let bad = nest_groups(10, 101, &int(1, 1), true);
    expect_fail(
        "101 unknown groups",
        "hostile.R",
        &bad,
        DEFAULTS,
        fail(DepthExceeded, "hostile.R", 10, 0),
    );
    let (ok, _) = nest_len(1, 50, &nest_groups(10, 50, &[], true));
    expect_roundtrip("50 sub-messages + 50 unknown groups", "hostile.R", &ok);
    let inner = nest_groups(10, 51, &[], true);
    let (bad, _) = nest_len(1, 50, &inner);
    let at = bad.len() - inner.len();
    expect_fail("50 + 51", "hostile.R", &bad, DEFAULTS, fail(DepthExceeded, "hostile.R", 10, at));
}

#[test]
fn nesting_limit_follows_max_depth() {
    let ten = DecodeOptions { max_depth: 10, ..DEFAULTS };
    let (ok, _) = nest_len(1, 10, &[]);
    expect_encodes("10 levels", "hostile.R", &ok, ten, &ok);
    let (bad, at) = nest_len(1, 11, &[]);
    expect_fail("11 levels", "hostile.R", &bad, ten, fail(DepthExceeded, "hostile.R", 1, at[10]));
    let ok = nest_groups(10, 10, &[], true);
    expect_encodes("10 unknown groups", "hostile.R", &ok, ten, &ok);
    let bad = nest_groups(10, 11, &[], true);
    expect_fail(
        "11 unknown groups",
        "hostile.R",
        &bad,
        ten,
        fail(DepthExceeded, "hostile.R", 10, 0),
    );
    let (bad, at) = nest_chain(6);
    expect_fail(
        "6 chain pairs",
        "hostile.Chain",
        &bad,
        ten,
        fail(DepthExceeded, "hostile.Chain", 1, at[5]),
    );

    // Above the default.
    let deep = DecodeOptions { max_depth: 150, ..DEFAULTS };
    let (ok, _) = nest_len(1, 150, &[]);
    expect_encodes("150 levels", "hostile.R", &ok, deep, &ok);
    let (bad, at) = nest_len(1, 151, &[]);
    expect_fail(
        "151 levels",
        "hostile.R",
        &bad,
        deep,
        fail(DepthExceeded, "hostile.R", 1, at[150]),
    );

    // Zero: the root only.
    let flat = DecodeOptions { max_depth: 0, ..DEFAULTS };
    expect_encodes("root only", "hostile.R", &int(2, 1), flat, &int(2, 1));
    let bad = wire![int(2, 1), delimited(1, &[])];
    expect_fail("one level", "hostile.R", &bad, flat, fail(DepthExceeded, "hostile.R", 1, 2));
    expect_fail(
        "one group",
        "hostile.R",
        &group(4, &[]),
        flat,
        fail(DepthExceeded, "hostile.R", 4, 0),
    );
    expect_fail(
        "one unknown group",
        "hostile.R",
        &group(9, &[]),
        flat,
        fail(DepthExceeded, "hostile.R", 9, 0),
    );
}

#[test]
fn depth_bombs_fail_fast_without_recursion() {
    const LEVELS: usize = 100_000;
    let limit = Duration::from_secs(2);
    let (len_bomb, at) = nest_len(1, LEVELS, &[]);
    let (kids_bomb, kids_at) = nest_len(3, LEVELS, &[]);
    let (chain_bomb, chain_at) = nest_chain(LEVELS / 2);
    let bombs: Vec<(&str, &'static str, Vec<u8>, Fail)> = vec![
        ("LEN", "hostile.R", len_bomb, fail(DepthExceeded, "hostile.R", 1, at[100])),
        ("repeated LEN", "hostile.R", kids_bomb, fail(DepthExceeded, "hostile.R", 3, kids_at[100])),
        (
            "group/LEN chain",
            "hostile.Chain",
            chain_bomb,
            fail(DepthExceeded, "hostile.Chain", 1, chain_at[50]),
        ),
        (
            "unknown groups",
            "hostile.R",
            nest_groups(10, LEVELS, &[], true),
            fail(DepthExceeded, "hostile.R", 10, 0),
        ),
        (
            "unknown groups, never closed",
            "hostile.R",
            nest_groups(10, LEVELS, &[], false),
            fail(DepthExceeded, "hostile.R", 10, 0),
        ),
        (
            "unknown groups in a known group",
            "hostile.R",
            wire![tag(4, SGROUP), nest_groups(6, LEVELS, &[], false)],
            fail(DepthExceeded, "hostile.R.G", 6, 1),
        ),
        (
            // A bomb whose every level claims the rest of the input.
            "LEN, lying lengths",
            "hostile.R",
            wire![tag(1, LEN), varint(1 << 34)].repeat(LEVELS),
            fail(LengthOutOfBounds, "hostile.R", 1, 0),
        ),
    ];
    for (case, type_name, input, want) in bombs {
        for (e, took) in detonate(type_name, input, DEFAULTS) {
            assert_eq!(
                (e.kind, e.message.as_str(), e.field, e.offset),
                (want.kind, want.message, want.field, want.offset),
                "{case} bomb: {e}"
            );
            assert!(took < limit, "{case} bomb: took {took:?}");
        }
    }
}

// ---------------------------------------------------------------------------
// UTF-8.
// ---------------------------------------------------------------------------

/// Byte strings that are not UTF-8.
const NOT_UTF8: &[&[u8]] = &[
    b"\xff",
    b"ok\x80",            // stray continuation byte
    b"\xc0\x80",          // overlong NUL
    b"\xe0\x80\xaf",      // overlong '/'
    b"\xed\xa0\x80",      // UTF-16 surrogate
    b"\xe2\x82",          // cut sequence
    b"\xf4\x90\x80\x80",  // past U+10FFFF
    b"valid\xf0\x9f\x98", // cut emoji
];

#[test]
fn proto3_strings_must_be_utf8() {
    for bad in NOT_UTF8 {
        let cases: Vec<(&str, Vec<u8>, Fail)> = vec![
            ("string", delimited(9, bad), fail(InvalidUtf8, "hostile3.S3", 9, 0)),
            (
                "after a field",
                wire![int(5, 1), delimited(9, bad)],
                fail(InvalidUtf8, "hostile3.S3", 9, 2),
            ),
            (
                "in a sub-message",
                delimited(11, &delimited(9, bad)),
                fail(InvalidUtf8, "hostile3.S3", 9, 2),
            ),
            (
                "map key",
                delimited(23, &delimited(1, bad)),
                fail(InvalidUtf8, "hostile3.S3.TreeEntry", 1, 3),
            ),
        ];
        for (case, input, want) in cases {
            expect_fail(&format!("{case} {}", to_hex(bad)), "hostile3.S3", &input, DEFAULTS, want);
        }
    }
}

#[test]
fn proto2_strings_and_bytes_take_any_bytes() {
    for bad in NOT_UTF8 {
        let cases: Vec<(&str, &'static str, u32, Vec<u8>)> = vec![
            ("proto2 string", "hostile.P2", 1, wire![delimited(1, bad), int(3, 1)]),
            ("proto2 oneof string", "hostile.P2", 12, wire![int(3, 1), delimited(12, bad)]),
            ("proto2 bytes", "hostile.P2", 2, wire![delimited(2, bad), int(3, 1)]),
            ("proto2 string, every kind", "hostile.S2", 9, delimited(9, bad)),
            ("proto3 bytes", "hostile3.S3", 12, delimited(12, bad)),
        ];
        for (case, type_name, field, input) in cases {
            let case = format!("{case} {}", to_hex(bad));
            expect_roundtrip(&case, type_name, &input);
            with_views(&case, type_name, &input, |view, m| {
                let f = m.field(field).expect("field");
                let got = m.get(f).expect("in bounds").and_then(|v| v.as_bytes());
                assert_eq!(got, Some(*bad), "{case} (view={view})");
            });
        }
        // Unknown fields are not strings.
        expect_roundtrip("proto3 unknown LEN", "hostile3.S3", &delimited(30, bad));
    }
}

// ---------------------------------------------------------------------------
// Packed fields.
// ---------------------------------------------------------------------------

#[test]
fn packed_runs_must_be_whole() {
    let mut cases: Vec<(String, &str, Vec<u8>, Fail)> = Vec::new();
    for n in [1, 2, 3, 5, 6, 7, 9, 13] {
        let payload = vec![0x11; n];
        cases.push((
            format!("fixed32 run of {n}"),
            "hostile.P2",
            wire![int(3, 1), delimited(5, &payload)],
            fail(PackedLength, "hostile.P2", 5, 2),
        ));
        cases.push((
            format!("proto3 fixed32 run of {n}"),
            "hostile3.S3",
            delimited(20, &payload),
            fail(PackedLength, "hostile3.S3", 20, 0),
        ));
    }
    for n in [1, 4, 7, 9, 12, 15, 17] {
        let payload = vec![0x22; n];
        cases.push((
            format!("fixed64 run of {n}"),
            "hostile.P2",
            delimited(6, &payload),
            fail(PackedLength, "hostile.P2", 6, 0),
        ));
        cases.push((
            format!("proto3 fixed64 run of {n} in a sub-message"),
            "hostile3.S3",
            delimited(11, &delimited(21, &payload)),
            fail(PackedLength, "hostile3.S3", 21, 2),
        ));
    }
    let cut_runs: [&[u8]; 4] = [&[0x80], &[0x01, 0x80], &[0xff, 0xff], &[0x05, 0x96, 0x81]];
    for run in cut_runs {
        let c = |s: &str| format!("{s} {}", to_hex(run));
        cases.extend([
            (
                c("int32 run ending mid-varint"),
                "hostile.P2",
                delimited(7, run),
                fail(Truncated, "hostile.P2", 7, 0),
            ),
            (
                c("closed enum run ending mid-varint"),
                "hostile.P2",
                delimited(10, run),
                fail(Truncated, "hostile.P2", 10, 0),
            ),
            (
                c("proto3 int32 run ending mid-varint"),
                "hostile3.S3",
                delimited(22, run),
                fail(Truncated, "hostile3.S3", 22, 0),
            ),
        ]);
    }
    for (case, type_name, input, want) in cases {
        expect_fail(&case, type_name, &input, LENIENT, want);
    }
}

#[test]
fn packed_and_unpacked_input_are_both_accepted() {
    let run = wire![fixed32(1), fixed32(2), fixed32(u32::MAX)];
    expect_roundtrip("packed fixed32", "hostile3.S3", &delimited(20, &run));
    let unpacked =
        wire![tag(20, I32), fixed32(1), tag(20, I32), fixed32(2), tag(20, I32), fixed32(u32::MAX)];
    expect_encodes("unpacked fixed32", "hostile3.S3", &unpacked, DEFAULTS, &delimited(20, &run));
    let split = wire![
        delimited(20, &fixed32(1)),
        tag(20, I32),
        fixed32(2),
        delimited(20, &fixed32(u32::MAX))
    ];
    expect_encodes("mixed fixed32", "hostile3.S3", &split, DEFAULTS, &delimited(20, &run));
    expect_encodes("empty run", "hostile3.S3", &delimited(21, &[]), DEFAULTS, &[]);
    let ints =
        wire![varint(0), varint(-1i64 as u64), varint(i64::from(i32::MIN) as u64), varint(300)];
    expect_roundtrip("packed int32", "hostile3.S3", &delimited(22, &ints));
    with_views("packed int32 values", "hostile3.S3", &delimited(22, &ints), |view, m| {
        let f = m.field(22).expect("field");
        let rep = m.repeated(f).expect("in bounds");
        let got: Vec<i128> =
            rep.iter().map(|v| v.expect("in bounds").as_i128().unwrap_or(0)).collect();
        // int32 keeps the low 32 bits of what arrived.
        assert_eq!(got, [0, -1, i128::from(i32::MIN), 300], "view={view}");
    });
    // Closed enum: undeclared values leave the run for the unknown fields.
    let input = wire![int(3, 1), delimited(10, &wire![varint(1), varint(7), varint(2)])];
    let canonical = wire![int(3, 1), delimited(10, &wire![varint(1), varint(2)]), int(10, 7)];
    expect_encodes("closed enum run", "hostile.P2", &input, DEFAULTS, &canonical);
    // An undeclared value keeps all 64 bits the sender wrote: -2 is a
    // ten-byte varint on the wire and stays one in the unknown fields (as
    // in protobuf C++ and upb), so a reader declaring the field int64 still
    // reads -2, not 4294967294.
    let minus_two = -2i64 as u64;
    let input = wire![int(3, 1), delimited(10, &wire![varint(1), varint(minus_two)])];
    let canonical = wire![int(3, 1), delimited(10, &varint(1)), int(10, minus_two)];
    assert_eq!(int(10, minus_two).len(), 11);
    expect_encodes("closed enum run, -2", "hostile.P2", &input, DEFAULTS, &canonical);
    let input = wire![int(3, 1), int(4, minus_two)];
    expect_roundtrip("singular closed enum, -2", "hostile.P2", &input);
    // Whether a value is declared is decided on its low 32 bits, as an
    // int32 (protobuf C++ and upb): 2^32 + 1 is GREEN.
    let input = wire![int(3, 1), delimited(10, &varint(1 << 32 | 1))];
    let canonical = wire![int(3, 1), delimited(10, &varint(1))];
    expect_encodes("closed enum run, 2^32 + 1", "hostile.P2", &input, DEFAULTS, &canonical);
}

// ---------------------------------------------------------------------------
// Required fields.
// ---------------------------------------------------------------------------

#[test]
fn missing_required_fields_fail() {
    let sub_without_id = delimited(9, &delimited(1, b"x"));
    let cases: Vec<(&str, Vec<u8>, Fail)> = vec![
        ("empty", vec![], fail(MissingRequired, "hostile.P2", 3, 0)),
        ("other fields only", delimited(1, b"abc"), fail(MissingRequired, "hostile.P2", 3, 5)),
        (
            "in a sub-message",
            wire![int(3, 1), sub_without_id],
            fail(MissingRequired, "hostile.P2", 3, 7),
        ),
        (
            "only the sub-message has it",
            delimited(9, &int(3, 1)),
            fail(MissingRequired, "hostile.P2", 3, 4),
        ),
        (
            "sub-message with only an undeclared enum value",
            wire![int(3, 1), delimited(9, &int(4, 9))],
            fail(MissingRequired, "hostile.P2", 3, 6),
        ),
    ];
    for (case, input, want) in cases {
        expect_fail(case, "hostile.P2", &input, DEFAULTS, want);
        // Without the check the same bytes are a valid message.
        expect_encodes(case, "hostile.P2", &input, LENIENT, &input);
    }
    expect_roundtrip("present", "hostile.P2", &wire![int(3, 0), delimited(9, &int(3, 1))]);
}

// ---------------------------------------------------------------------------
// Every scalar type: decode, read, encode.
// ---------------------------------------------------------------------------

static LONG: [u8; 300] = [b'x'; 300];

/// For every scalar field of `hostile.S2` / `hostile3.S3`: (field, canonical
/// field bytes, value). Enum values depend on the enum being closed.
fn scalar_cases(proto3: bool) -> Vec<(u32, Vec<u8>, Value<'static>)> {
    let mut v: Vec<(u32, Vec<u8>, Value<'static>)> = Vec::new();
    let nan64 = f64::from_bits(0x7ff8_0000_0000_0001);
    for x in [
        0.0,
        -0.0,
        1.5,
        f64::MIN,
        f64::MAX,
        f64::MIN_POSITIVE,
        5e-324,
        f64::INFINITY,
        f64::NEG_INFINITY,
        nan64,
    ] {
        v.push((1, wire![tag(1, I64), fixed64(x.to_bits())], Value::F64(x)));
    }
    let nan32 = f32::from_bits(0x7fc0_0001);
    for x in [
        0.0,
        -0.0,
        1.5,
        f32::MIN,
        f32::MAX,
        f32::MIN_POSITIVE,
        1e-45,
        f32::INFINITY,
        f32::NEG_INFINITY,
        nan32,
    ] {
        v.push((2, wire![tag(2, I32), fixed32(x.to_bits())], Value::F32(x)));
    }
    for x in [0, 1, -1, i64::MIN, i64::MAX] {
        v.push((3, int(3, x as u64), Value::I64(x)));
    }
    for x in [0, 1, 127, 128, u64::MAX] {
        v.push((4, int(4, x), Value::U64(x)));
    }
    // Negative int32 is sign-extended to a ten-byte varint.
    for x in [0, 1, -1, i32::MIN, i32::MAX] {
        v.push((5, int(5, i64::from(x) as u64), Value::I32(x)));
    }
    for x in [0, 1, u64::MAX] {
        v.push((6, wire![tag(6, I64), fixed64(x)], Value::U64(x)));
    }
    for x in [0, 1, u32::MAX] {
        v.push((7, wire![tag(7, I32), fixed32(x)], Value::U32(x)));
    }
    for x in [false, true] {
        v.push((8, int(8, u64::from(x)), Value::Bool(x)));
    }
    for s in ["", "a", "héllo ✓ 😀"] {
        v.push((9, delimited(9, s.as_bytes()), Value::String(s.as_bytes())));
    }
    v.push((9, delimited(9, &LONG), Value::String(&LONG))); // two-byte length
    for b in [&b""[..], &[0], &[0xff, 0x00, 0x80], &LONG] {
        v.push((12, delimited(12, b), Value::Bytes(b)));
    }
    for x in [0, 1, u32::MAX] {
        v.push((13, int(13, x.into()), Value::U32(x)));
    }
    let enums: &[i32] = if proto3 { &[0, 1, -5, i32::MIN, i32::MAX] } else { &[0, 1, 2] };
    for &x in enums {
        v.push((14, int(14, i64::from(x) as u64), Value::Enum(x)));
    }
    for x in [0, i32::MIN, -1, i32::MAX] {
        v.push((15, wire![tag(15, I32), fixed32(x as u32)], Value::I32(x)));
    }
    for x in [0, i64::MIN, -1, i64::MAX] {
        v.push((16, wire![tag(16, I64), fixed64(x as u64)], Value::I64(x)));
    }
    for (x, zz) in [(0, 0), (-1, 1), (1, 2), (i32::MIN, u32::MAX), (i32::MAX, u32::MAX - 1)] {
        v.push((17, int(17, zz.into()), Value::I32(x)));
    }
    for (x, zz) in [(0, 0), (-1, 1), (1, 2), (i64::MIN, u64::MAX), (i64::MAX, u64::MAX - 1)] {
        v.push((18, int(18, zz), Value::I64(x)));
    }
    v
}

/// Same variant and same value (floats by bits).
fn same(a: &Value<'_>, b: &Value<'_>) -> bool {
    if std::mem::discriminant(a) != std::mem::discriminant(b) {
        return false;
    }
    match (a, b) {
        (Value::F32(x), Value::F32(y)) => x.to_bits() == y.to_bits(),
        (Value::F64(x), Value::F64(y)) => x.to_bits() == y.to_bits(),
        (Value::String(x), Value::String(y)) | (Value::Bytes(x), Value::Bytes(y)) => x == y,
        _ => a.as_i128().is_some() && a.as_i128() == b.as_i128(),
    }
}

/// The value proto3 implicit presence does not encode.
fn is_zero(v: &Value<'_>) -> bool {
    match v {
        Value::F32(x) => x.to_bits() == 0,
        Value::F64(x) => x.to_bits() == 0,
        Value::String(b) | Value::Bytes(b) => b.is_empty(),
        _ => v.as_i128() == Some(0),
    }
}

#[test]
fn every_scalar_type_round_trips() {
    for (type_name, proto3) in [("hostile.S2", false), ("hostile3.S3", true)] {
        for (field, input, want) in scalar_cases(proto3) {
            let case = format!("{type_name} field {field} = {want:?}");
            // Implicit presence: a zero on the wire is read back as "absent"
            // and not encoded.
            let implicit_zero = proto3 && is_zero(&want);
            let canonical = if implicit_zero { Vec::new() } else { input.clone() };
            expect_encodes(&case, type_name, &input, DEFAULTS, &canonical);
            with_views(&case, type_name, &input, |view, m| {
                let f = m.field(field).expect("field");
                let got = m.get(f).expect("in bounds");
                if implicit_zero {
                    assert!(got.is_none(), "{case} (view={view}): {got:?}");
                } else {
                    let got = got.unwrap_or_else(|| panic!("{case} (view={view}): absent"));
                    assert!(same(&got, &want), "{case} (view={view}): got {got:?}");
                }
                let or_default = m.get_or_default(f).expect("in bounds").expect("scalar");
                assert!(same(&or_default, &want), "{case} (view={view}): default {or_default:?}");
                assert!(m.unknown_fields().expect("in bounds").is_empty(), "{case}");
            });
        }
    }
}

#[test]
fn scalars_with_unusual_encodings() {
    // proto3 explicit presence keeps a zero.
    expect_roundtrip("proto3 optional zero", "hostile3.S3", &int(24, 0));
    // A bool is any varint; the encoder writes 1.
    expect_encodes("bool 2", "hostile3.S3", &int(8, 2), DEFAULTS, &int(8, 1));
    expect_encodes("bool 2^63", "hostile3.S3", &int(8, 1 << 63), DEFAULTS, &int(8, 1));
    // int32 / uint32 keep the low 32 bits of a wider varint.
    expect_encodes(
        "int32 from 2^32 + 5",
        "hostile3.S3",
        &int(5, (1 << 32) + 5),
        DEFAULTS,
        &int(5, 5),
    );
    expect_encodes(
        "uint32 from 2^40 + 1",
        "hostile3.S3",
        &int(13, (1 << 40) + 1),
        DEFAULTS,
        &int(13, 1),
    );
    // Negative int32 in five bytes (as some encoders write it) reads as -1.
    let five = wire![tag(5, VARINT), [0xff, 0xff, 0xff, 0xff, 0x0f]];
    expect_encodes("int32 -1 in five bytes", "hostile3.S3", &five, DEFAULTS, &int(5, -1i64 as u64));
    // Last occurrence wins for singular scalars.
    let twice = wire![int(5, 1), int(5, 2)];
    expect_encodes("last wins", "hostile3.S3", &twice, DEFAULTS, &int(5, 2));
    // An undeclared value of a closed enum is an unknown field.
    let undeclared = int(14, 7);
    expect_roundtrip("closed enum 7", "hostile.S2", &undeclared);
    with_views("closed enum 7", "hostile.S2", &undeclared, |view, m| {
        let f = m.field(14).expect("field");
        assert!(m.get(f).expect("in bounds").is_none(), "view={view}");
        assert_eq!(m.unknown_fields().expect("in bounds"), &undeclared[..], "view={view}");
    });
}

// ---------------------------------------------------------------------------
// Hostile tables and JSON (found while writing the fuzz targets).
// ---------------------------------------------------------------------------

/// Byte offset of word `word` of the record of field `number` of
/// `type_name` in `ts.to_bytes()`. Layout (crates/schema/src/codec.rs):
/// "PPTS", version, message count, 14 words per message, field count, 11
/// words per field: number, offset, sub, presence, name (2), json_name (2),
/// default (2), kind | label << 8 | flags << 16.
fn field_word(ts: &TableSet, type_name: &str, number: u32, word: usize) -> usize {
    let m = ts.message(ty(type_name));
    let index = m.fields.start as usize + ts.field_index(m, number).expect("field");
    let at = 12 + 56 * ts.messages().len() + 4 + 44 * index;
    let bytes = ts.to_bytes();
    assert_eq!(bytes[at..at + 4], number.to_le_bytes(), "table layout changed");
    at + 4 * word
}

fn patch(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

/// Loads forged table bytes; if they pass validation, decoding `input` with
/// them may fail but must not panic (codec.rs: "a table set read from an
/// untrusted peer cannot make the decoder index out of bounds") nor take
/// memory out of proportion to the input (decode.rs: "memory is bounded by
/// the input").
fn decode_with_forged(forged: &[u8], type_name: &str, input: &[u8]) {
    let Ok(ts) = TableSet::from_bytes(forged) else { return };
    let t = ty(type_name);
    for opts in [DecodeOptions::default(), DecodeOptions::view()] {
        let outcome = std::panic::catch_unwind(|| {
            let mut block = Block::new();
            let _ = Decoder::new().decode_into(&ts, t, input, &opts, &mut block);
            block.into_bytes().capacity()
        });
        let held = outcome
            .unwrap_or_else(|_| panic!("decode panicked on {} with forged tables", to_hex(input)));
        assert!(held <= block_bound(input.len()), "{held} bytes held for {}", to_hex(input));
    }
}

#[test]
fn forged_closed_enum_flag_on_an_int32_field() {
    let ts = tables();
    let mut forged = ts.to_bytes();
    let at = field_word(ts, "hostile.R", 2, 10);
    let packed = u32::from_le_bytes(forged[at..at + 4].try_into().expect("4 bytes"));
    patch(&mut forged, at, packed | u32::from(protoplane_schema::FieldFlags::CLOSED_ENUM) << 16);
    // R.v = 1: `enum_type(f.sub)` with sub = NONE (table.rs) panics.
    decode_with_forged(&forged, "hostile.R", &int(2, 1));
}

#[test]
fn forged_overlapping_slots() {
    let ts = tables();
    let m = ts.message(ty("hostile.R"));
    let v = ts.field_by_number(m, 2).expect("v").offset;
    let mut forged = ts.to_bytes();
    // R.kids' reference slot now covers R.v's 4 bytes as its `len` word.
    patch(&mut forged, field_word(ts, "hostile.R", 3, 1), v - 4);
    // v = 0x3ffffff0, then one kid: grow_array writes at 8 * 0x3ffffff0.
    decode_with_forged(&forged, "hostile.R", &wire![int(2, 0x3fff_fff0), delimited(3, &[])]);
}

#[test]
fn forged_unknown_fields_slot_straddling_a_field_slot() {
    // What the `tables` fuzz target found (on RegisterUserRequest.carrier):
    // the unknown array's offset lands in the high half of R.kids' `len`.
    let ts = tables();
    let r = ty("hostile.R");
    let kids = ts.field_by_number(ts.message(r), 3).expect("kids").offset;
    let mut forged = ts.to_bytes();
    let r = r as usize;
    patch(&mut forged, 12 + 56 * r + 4 * 12, kids + 6); // message word 12: unknown_offset
    decode_with_forged(
        &forged,
        "hostile.R",
        &wire![int(9, 1), delimited(3, &[]), delimited(3, &[])],
    );
}

#[test]
fn json_map_nesting_is_bounded_like_the_wire() {
    // 51 levels of S3.tree: 102 wire levels (entry + value), 51 JSON levels.
    let levels = 51;
    let text = format!("{}{{}}{}", r#"{"tree":{"k":"#.repeat(levels), "}}".repeat(levels));
    let t = ty("hostile3.S3");
    if let Ok(block) = protoplane_wire::json::from_json(tables(), t, &text) {
        let encoded =
            protoplane_wire::encode(tables(), t, block.as_bytes(), &EncodeOptions::default());
        assert!(encoded.is_ok(), "from_json accepted {levels} map levels, encode: {encoded:?}");
    }
}

// ---------------------------------------------------------------------------
// Hex vectors.
// ---------------------------------------------------------------------------

#[test]
fn hex_vectors() {
    assert_eq!(wire![tag(1, LEN), varint(u64::MAX)], hex("0a ff ff ff ff ff ff ff ff ff 01"));
    assert_eq!(group(4, &int(5, 1)), hex("23 28 01 24"));
    assert_eq!(padded(2 << 3, 3), hex("90 80 00"));
    for &(case, type_name, input, kind, message, field, offset) in FAILING {
        expect_fail(case, type_name, &hex(input), LENIENT, fail(kind, message, field, offset));
    }
    for &(case, type_name, input) in VALID {
        expect_roundtrip(case, type_name, &hex(input));
    }
}

/// Hostile inputs: (case, type, hex, kind, message, field, offset).
#[rustfmt::skip]
const FAILING: &[(&str, &str, &str, DecodeErrorKind, &str, u32, usize)] = &[
    ("tag cut",                 "hostile.R",   "80",                            Truncated,         "hostile.R",   0, 0),
    ("varint cut",              "hostile.R",   "10 80",                         Truncated,         "hostile.R",   2, 0),
    ("fixed32 cut",             "hostile3.S3", "3d 01 02 03",                   Truncated,         "hostile3.S3", 7, 0),
    ("fixed64 cut",             "hostile3.S3", "31 01 02 03 04 05 06 07",       Truncated,         "hostile3.S3", 6, 0),
    ("length cut",              "hostile.R",   "0a 80",                         Truncated,         "hostile.R",   1, 0),
    ("11-byte tag",             "hostile.R",   "80 80 80 80 80 80 80 80 80 80 00", OverlongTagOrLength, "hostile.R", 0, 0),
    ("6-byte padded tag",       "hostile.R",   "90 80 80 80 80 00 01",          OverlongTagOrLength, "hostile.R", 0, 0),
    ("6-byte padded length",    "hostile.R",   "0a 82 80 80 80 80 00 10 01",    OverlongTagOrLength, "hostile.R", 1, 0),
    ("11-byte value",           "hostile.R",   "10 ff ff ff ff ff ff ff ff ff ff 01", VarintTooLong, "hostile.R", 2, 0),
    ("tag 2^32",                "hostile.R",   "80 80 80 80 10",                TagTooLarge,       "hostile.R",   0, 0),
    ("wire type 6",             "hostile.R",   "0e",                            InvalidWireType,   "hostile.R",   1, 0),
    ("wire type 7",             "hostile.R",   "10 01 17",                      InvalidWireType,   "hostile.R",   2, 2),
    ("field 0",                 "hostile.R",   "00 00",                         FieldNumberZero,   "hostile.R",   0, 0),
    ("field 0 end group",       "hostile.R",   "04",                            FieldNumberZero,   "hostile.R",   0, 0),
    ("length past end",         "hostile.R",   "0a 05 10 01",                   LengthOutOfBounds, "hostile.R",   1, 0),
    ("length 2^32",             "hostile.P2",  "0a 80 80 80 80 10 61",          LengthOutOfBounds, "hostile.P2",  1, 0),
    ("length 2^64-1",           "hostile.R",   "0a ff ff ff ff ff ff ff ff ff 01", OverlongTagOrLength, "hostile.R", 1, 0),
    ("end group, no start",     "hostile.R",   "2c",                            UnmatchedEndGroup, "hostile.R",   5, 0),
    ("wrong end group",         "hostile.R",   "23 2c",                         UnmatchedEndGroup, "hostile.R.G", 5, 1),
    ("group never closed",      "hostile.R",   "23 28 01",                      UnterminatedGroup, "hostile.R.G", 4, 3),
    ("unknown group open",      "hostile.R",   "53 08 01",                      UnterminatedGroup, "hostile.R",  10, 0),
    ("unknown group wrong end", "hostile.R",   "53 5c",                         UnmatchedEndGroup, "hostile.R",  10, 1),
    ("proto3 string not UTF-8", "hostile3.S3", "4a 02 c3 28",                   InvalidUtf8,       "hostile3.S3", 9, 0),
    ("map key not UTF-8",       "hostile3.S3", "ba 01 03 0a 01 ff",             InvalidUtf8,       "hostile3.S3.TreeEntry", 1, 3),
    ("packed fixed32 of 5",     "hostile.P2",  "2a 05 01 02 03 04 05",          PackedLength,      "hostile.P2",  5, 0),
    ("packed fixed64 of 12",    "hostile.P2",  "32 0c 00 00 00 00 00 00 00 00 00 00 00 00", PackedLength, "hostile.P2", 6, 0),
    ("packed varint cut",       "hostile.P2",  "3a 02 01 80",                   Truncated,         "hostile.P2",  7, 0),
];

/// Valid, canonical inputs: (case, type, hex).
#[rustfmt::skip]
const VALID: &[(&str, &str, &str)] = &[
    ("empty R",                "hostile.R",   ""),
    ("int32 -1",               "hostile3.S3", "28 ff ff ff ff ff ff ff ff ff 01"),
    ("sint64 min",             "hostile3.S3", "90 01 ff ff ff ff ff ff ff ff ff 01"),
    ("group",                  "hostile.R",   "23 28 01 24"),
    ("nested unknown groups",  "hostile.R",   "53 5b 08 01 5c 54"),
    ("required present",       "hostile.P2",  "18 00"),
    ("proto2 string ff",       "hostile.P2",  "0a 01 ff 18 01"),
    ("map entry",              "hostile3.S3", "ba 01 05 0a 01 6b 12 00"),
];
