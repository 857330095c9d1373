//! The per-field-type message corpus shared by the criterion micro
//! benchmarks (`benches/fields.rs`) and the instruction-count program
//! (`examples/icount.rs`, which includes this file by path).
//!
//! Every message is made of ONE field type, so that the per-field cost of
//! the engine dominates the per-message cost, in the manner of the
//! per-field-type studies of ProtoAcc and PsPIN:
//!
//! * scalars (varints of 1..=10 bytes, sint64, fixed32, fixed64, float,
//!   double): one `repeated` field declared `[packed = false]`, carrying
//!   [`OCCURRENCES`] occurrences, i.e. one tag + one value per field;
//! * strings of 8, 16, 1024 and 65536 bytes: one `repeated string` field,
//!   [`OCCURRENCES`] occurrences;
//! * packed `int32` / `fixed64`: one packed record of [`PACKED_LEN`] elements;
//! * nesting depth 1, 5, 10, 25: [`OCCURRENCES`] chains of sub-messages,
//!   each `depth` levels deep, the innermost carrying one 1-byte varint.
//!
//! The wire bytes are written here by hand (a dozen lines of varint code,
//! independent of the engine), so [`verify`] checks the engine against
//! an encoding it did not produce.

use protoplane_schema::{ProtoSource, TableSet};
use protoplane_wire::{
    Block, DecodeOptions, Decoder, EncodeOptions, Encoder, MessageView, Source, Value,
};

/// Occurrences of the field in the scalar, string and nesting messages.
pub(crate) const OCCURRENCES: usize = 100;
/// Elements in the packed messages.
pub(crate) const PACKED_LEN: usize = 1000;
/// String lengths benchmarked.
pub(crate) const STRING_LENS: [usize; 4] = [8, 16, 1024, 65536];
/// Nesting depths benchmarked.
pub(crate) const DEPTHS: [usize; 4] = [1, 5, 10, 25];

/// Import path of the embedded schema.
pub(crate) const SCHEMA_NAME: &str = "fieldbench.proto";

/// The embedded proto3 schema: one message type per field type.
pub(crate) const SCHEMA: &str = r#"
syntax = "proto3";
package fieldbench;

// Unpacked scalars: one tag per value (proto3 would pack them by default).
message UInt64s  { repeated uint64  v = 1 [packed = false]; }
message SInt64s  { repeated sint64  v = 1 [packed = false]; }
message Fixed32s { repeated fixed32 v = 1 [packed = false]; }
message Fixed64s { repeated fixed64 v = 1 [packed = false]; }
message Floats   { repeated float   v = 1 [packed = false]; }
message Doubles  { repeated double  v = 1 [packed = false]; }

message Strings { repeated string v = 1; }

// Packed (the proto3 default for repeated scalars).
message PackedInt32s   { repeated int32   v = 1; }
message PackedFixed64s { repeated fixed64 v = 1; }

// A chain of nodes; only the innermost one sets `leaf`.
message Node  { Node child = 1; uint64 leaf = 2; }
message Nests { repeated Node v = 1; }
"#;

/// Compiles the embedded schema.
pub(crate) fn tables() -> TableSet {
    TableSet::from_proto_sources(&[ProtoSource { name: SCHEMA_NAME, text: SCHEMA }], &[SCHEMA_NAME])
        .unwrap_or_else(|e| panic!("{SCHEMA_NAME}: {e}"))
}

/// One benchmark message.
#[derive(Debug)]
pub(crate) struct Case {
    /// Field type family: `varint`, `sint64`, `string`, `packed`, `nest`, …
    pub(crate) group: &'static str,
    /// Variant within the family (`3B`, `1024B`, `int32`, `d10`); may be empty.
    pub(crate) param: String,
    /// Type index of the root message.
    pub(crate) ty: u32,
    /// The wire bytes.
    pub(crate) wire: Vec<u8>,
    /// Field values the decoded message must hold (see [`count_values`]).
    pub(crate) values: usize,
}

impl Case {
    /// `group/param`, or `group` alone when there is no variant.
    pub(crate) fn name(&self) -> String {
        if self.param.is_empty() {
            self.group.to_owned()
        } else {
            format!("{}/{}", self.group, self.param)
        }
    }
}

/// SplitMix64: a tiny deterministic generator, so every run (and every
/// machine) benchmarks the same bytes.
#[derive(Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator from a fixed seed.
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (modulo bias is irrelevant here).
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// `len` printable ASCII letters (valid UTF-8, as proto3 strings must be).
    pub(crate) fn ascii(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| b'a' + (self.next_u64() % 26) as u8).collect()
    }
}

/// A uint64 whose varint encoding takes exactly `len` bytes (1..=10).
pub(crate) fn value_of_varint_len(rng: &mut Rng, len: u32) -> u64 {
    // A varint holds 7 bits per byte: `len` bytes cover [2^(7(len-1)), 2^(7 len)).
    let lo = if len == 1 { 0 } else { 1u64 << (7 * (len - 1)) };
    let hi = if len >= 10 { u64::MAX } else { (1u64 << (7 * len)) - 1 };
    rng.range(lo, hi)
}

/// Appends a base-128 varint.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Length in bytes of the varint encoding of `v`.
pub(crate) fn varint_len(v: u64) -> u32 {
    (64 - (v | 1).leading_zeros()).div_ceil(7)
}

/// Wire types used below.
const VARINT: u64 = 0;
const I64: u64 = 1;
const LEN: u64 = 2;
const I32: u64 = 5;

/// Appends the tag of field `number`.
fn put_tag(out: &mut Vec<u8>, number: u64, wire_type: u64) {
    put_varint(out, (number << 3) | wire_type);
}

/// Appends a length-delimited record of field `number`.
fn put_len(out: &mut Vec<u8>, number: u64, payload: &[u8]) {
    put_tag(out, number, LEN);
    put_varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

/// [`OCCURRENCES`] unpacked occurrences of field 1, values from `next`.
fn repeated_scalar(wire_type: u64, mut next: impl FnMut(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..OCCURRENCES {
        put_tag(&mut out, 1, wire_type);
        next(&mut out);
    }
    out
}

/// Generates every benchmark message (deterministic: fixed seeds).
pub(crate) fn cases(ts: &TableSet) -> Vec<Case> {
    let ty = |name: &str| {
        ts.message_by_name(&format!("fieldbench.{name}"))
            .unwrap_or_else(|| panic!("fieldbench.{name} missing"))
    };
    let mut rng = Rng::new(0x5EED_F1E1_D5BE_0C11);
    let mut all = Vec::new();
    // A case of OCCURRENCES values (the packed and nesting cases override `values`).
    let case = |group: &'static str, param: String, ty: u32, wire: Vec<u8>| Case {
        group,
        param,
        ty,
        wire,
        values: OCCURRENCES,
    };

    // uint64 varints of exactly 1, 2, …, 10 bytes.
    for len in 1..=10 {
        let wire = repeated_scalar(VARINT, |o| {
            let v = value_of_varint_len(&mut rng, len);
            assert_eq!(varint_len(v), len, "{v:#x}");
            put_varint(o, v);
        });
        all.push(case("varint", format!("{len}B"), ty("UInt64s"), wire));
    }
    // sint64: |n| in (2^13, 2^20), half of them negative, so every zigzag
    // value is in [2^14, 2^21): exactly 3-byte varints.
    let wire = repeated_scalar(VARINT, |o| {
        let n = rng.range((1 << 13) + 1, (1 << 20) - 1) as i64;
        let n = if rng.next_u64() & 1 == 1 { -n } else { n };
        put_varint(o, ((n << 1) ^ (n >> 63)) as u64);
    });
    all.push(case("sint64", String::new(), ty("SInt64s"), wire));
    // Fixed-width scalars.
    let wire =
        repeated_scalar(I32, |o| o.extend_from_slice(&(rng.next_u64() as u32).to_le_bytes()));
    all.push(case("fixed32", String::new(), ty("Fixed32s"), wire));
    let wire = repeated_scalar(I64, |o| o.extend_from_slice(&rng.next_u64().to_le_bytes()));
    all.push(case("fixed64", String::new(), ty("Fixed64s"), wire));
    let wire = repeated_scalar(I32, |o| {
        let x = (rng.next_u64() >> 40) as f32 / 16.0 - 524_288.0;
        o.extend_from_slice(&x.to_le_bytes());
    });
    all.push(case("float", String::new(), ty("Floats"), wire));
    let wire = repeated_scalar(I64, |o| {
        let x = (rng.next_u64() >> 11) as f64 / 1024.0 - 4.0e12;
        o.extend_from_slice(&x.to_le_bytes());
    });
    all.push(case("double", String::new(), ty("Doubles"), wire));

    // Strings.
    for len in STRING_LENS {
        let mut wire = Vec::new();
        for _ in 0..OCCURRENCES {
            put_len(&mut wire, 1, &rng.ascii(len));
        }
        all.push(case("string", format!("{len}B"), ty("Strings"), wire));
    }

    // Packed: int32 values are non-negative, 1 to 4 bytes each (uniform
    // length); fixed64 values are 8 bytes each.
    let mut payload = Vec::new();
    for _ in 0..PACKED_LEN {
        let len = rng.range(1, 4) as u32;
        put_varint(&mut payload, value_of_varint_len(&mut rng, len));
    }
    let mut wire = Vec::new();
    put_len(&mut wire, 1, &payload);
    all.push(Case {
        values: PACKED_LEN,
        ..case("packed", "int32".into(), ty("PackedInt32s"), wire)
    });
    let payload: Vec<u8> = (0..PACKED_LEN).flat_map(|_| rng.next_u64().to_le_bytes()).collect();
    let mut wire = Vec::new();
    put_len(&mut wire, 1, &payload);
    all.push(Case {
        values: PACKED_LEN,
        ..case("packed", "fixed64".into(), ty("PackedFixed64s"), wire)
    });

    // Nesting: `Nests.v` holds chains `depth` nodes deep (the `v` element is
    // depth 1); the innermost node sets `leaf` (a 1-byte varint).
    for depth in DEPTHS {
        let mut wire = Vec::new();
        for _ in 0..OCCURRENCES {
            let mut node = Vec::new();
            put_tag(&mut node, 2, VARINT);
            put_varint(&mut node, rng.range(1, 127));
            for _ in 1..depth {
                let mut outer = Vec::new();
                put_len(&mut outer, 1, &node);
                node = outer;
            }
            put_len(&mut wire, 1, &node);
        }
        // Per chain: `depth` messages and one leaf.
        all.push(Case {
            values: OCCURRENCES * (depth + 1),
            ..case("nest", format!("d{depth}"), ty("Nests"), wire)
        });
    }
    all
}

/// Counts the field values of a decoded message, recursively: each present
/// singular field and each repeated element is one value, a sub-message
/// counts itself plus its own values. Fails on unknown fields: a field the
/// engine did not recognise would otherwise round-trip (as unknown bytes)
/// without ever reaching the code the benchmark means to measure.
pub(crate) fn count_values(view: &MessageView<'_>) -> Result<usize, String> {
    let unknown = view.unknown_fields().map_err(|e| e.to_string())?;
    if !unknown.is_empty() {
        return Err(format!("{}: {} bytes of unknown fields", view.type_name(), unknown.len()));
    }
    let one = |v: Value<'_>| match v {
        Value::Message(m) => count_values(&m).map(|n| n + 1),
        _ => Ok(1),
    };
    let mut n = 0;
    for f in view.fields() {
        if f.is_repeated() {
            for v in view.repeated(f).map_err(|e| e.to_string())?.iter() {
                n += one(v.map_err(|e| e.to_string())?)?;
            }
        } else if let Some(v) = view.get(f).map_err(|e| e.to_string())? {
            n += one(v)?;
        }
    }
    Ok(n)
}

/// Checks that `wire` decodes (owned and view mode) into a message holding
/// `values` values and no unknown fields, and re-encodes byte for byte.
pub(crate) fn verify(ts: &TableSet, ty: u32, wire: &[u8], values: usize) -> Result<(), String> {
    let mut dec = Decoder::new();
    let mut enc = Encoder::new();
    let mut block = Block::new();
    for opts in [DecodeOptions::default(), DecodeOptions::view()] {
        let mode = if opts.view { "view" } else { "owned" };
        dec.decode_into(ts, ty, wire, &opts, &mut block)
            .map_err(|e| format!("decode ({mode}): {e}"))?;
        let src = Source::viewing(block.as_bytes(), wire);
        let view = MessageView::new(ts, src, ty).map_err(|e| format!("view ({mode}): {e}"))?;
        let found = count_values(&view)?;
        if found != values {
            return Err(format!("{mode}: {found} values decoded, {values} expected"));
        }
        let mut out = Vec::new();
        enc.encode_into(ts, ty, src, &EncodeOptions::default(), &mut out)
            .map_err(|e| format!("encode ({mode}): {e}"))?;
        if out != wire {
            return Err(format!(
                "{mode}: re-encoding differs ({} vs {} bytes)",
                out.len(),
                wire.len()
            ));
        }
    }
    Ok(())
}
