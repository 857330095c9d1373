//! The generated decoder of a message: `decode_fields`, one loop over tags
//! with one `match` arm per field in its canonical encoding, everything a
//! constant (see `protoplane_wire::gen` for the runtime it calls and for
//! what is left to the table-driven path: closed-enum values the enum lacks
//! and packed closed enums, groups, unknown fields, non-canonical
//! encodings). A map is a repeated sub-message of its
//! entry type, whose decoder is generated too.
//!
//! The arms come in field-number order, the order encoders write fields
//! in; rustc lowers a `match` over dense small tags to a jump table, so
//! the expected next field costs one indirect branch that the predictor
//! learns from the previous field, and no table lookups.

use protoplane_schema::{Card, Field, FieldFlags, Kind, ValueOp};

use crate::generator::{Generator, Scope};
use crate::model::{MessageInfo, TypeLoc};
use crate::writer::CodeWriter;
use crate::Error;

const GEN: &str = "::protoplane_wire::gen";
const ERR: &str = "::protoplane_wire::DecodeError";

/// Emits `impl Marker { pub fn decode_fields(..) }`.
pub(crate) fn emit(
    w: &mut CodeWriter,
    g: &Generator<'_>,
    scope: &Scope,
    info: &MessageInfo,
    loc: &TypeLoc,
) -> Result<(), Error> {
    let ts = g.ts();
    let msg = &info.table;
    let fields = ts.fields(msg);
    let ops = ts.ops(msg);
    w.open(format!("impl {}", loc.ident));
    w.doc(
        "The generated decoder of this type's fields (`protoplane_wire::gen`): decodes\n\
         the object at `obj` from `pos` to `end`. Called by `decode` and by the decoders\n\
         of the messages that contain this one.",
    );
    w.line("#[doc(hidden)]");
    w.line("#[allow(unused_mut, unused_variables, clippy::identity_op)]");
    w.open_fn(
        "pub fn decode_fields",
        &[
            format!("d: &mut {GEN}::Dec<'_>"),
            "obj: usize".into(),
            "mut pos: usize".into(),
            "end: usize".into(),
        ],
        &format!("Result<usize, {ERR}>"),
    );
    w.line(format!("const M: u32 = {};", info.type_index));
    w.open("while pos < end");
    // Groups and packed closed enums go to the table-driven path (see the
    // module docs); a message with nothing else has no arms at all.
    let arms: Vec<_> = fields
        .iter()
        .enumerate()
        .zip(ops)
        .filter(|(_, op)| {
            op.value != ValueOp::Group
                && !(op.value == ValueOp::ClosedEnum && op.card == Card::Packed)
        })
        .collect();
    if arms.is_empty() {
        w.line("pos = d.field(M, obj, pos, end)?;");
    } else {
        w.line("let start = pos;");
        w.open("match d.tag(&mut pos, end, M)?");
    }
    for ((index, f), op) in arms.iter().copied() {
        let n = f.number;
        let off = op.offset;
        let site = format!("(M, {n}, start)");
        w.open(format!("{} =>", op.tag));
        let store_card = |w: &mut CodeWriter, value: &str, size: u8| match op.card {
            Card::Hasbit | Card::Implicit | Card::Always => {
                let put = match size {
                    8 => format!("d.put_u64(obj + {off}, {value});"),
                    4 => format!("d.put_u32(obj + {off}, {value} as u32);"),
                    _ => format!("d.put_u8(obj + {off}, {value} as u8);"),
                };
                w.line(put);
                let (word, mask) = hasbit(op.presence);
                w.line(format!("d.set_bits(obj + {word}, {mask:#x});"));
            }
            Card::Oneof => {
                w.line(format!("d.put_u32(obj + {}, {n});", op.presence));
                w.line(format!("d.put_u64(obj + {off}, {value});"));
            }
            Card::Repeated | Card::Packed => {
                w.line(format!("d.push::<{size}>(obj + {off}, {value}, {site})?;"));
            }
        };
        match op.value {
            ValueOp::Bytes | ValueOp::Utf8 => {
                let utf8 = op.value == ValueOp::Utf8;
                w.line(format!("let r = d.bytes(&mut pos, end, {utf8}, {site})?;"));
                store_card(w, "r", 8);
            }
            ValueOp::Message => {
                let sub = ts.message(f.sub);
                let sub_path = sub_path(g, scope, f)?;
                w.line(format!("let len = d.length(&mut pos, end, {site})?;"));
                w.line(format!("d.enter({site})?;"));
                let size = sub.size;
                let make = match op.card {
                    Card::Repeated => format!("d.sub_push(obj + {off}, {size}, {site})?"),
                    Card::Oneof => format!(
                        "d.sub_oneof(obj + {off}, (obj + {}, {n}), {size}, {site})?",
                        op.presence
                    ),
                    _ => {
                        let (word, mask) = hasbit(op.presence);
                        format!("d.sub(obj + {off}, (obj + {word}, {mask:#x}), {size}, {site})?")
                    }
                };
                w.line(format!("let sub = {make};"));
                w.line(format!("pos = {sub_path}::decode_fields(d, sub, pos, pos + len)?;"));
                w.line("d.leave();");
                if f.flags.has(FieldFlags::MAP) {
                    // An entry with unknown fields leaves the map.
                    w.line(format!(
                        "d.entry_done((M, obj, {index}), ({}, sub), {}, pos)?;",
                        f.sub, sub.unknown_offset
                    ));
                }
            }
            _ if op.card == Card::Packed => {
                w.line(format!(
                    "d.packed(obj + {off}, ::protoplane_schema::Kind::{:?}, &mut pos, end, {site})?;",
                    f.kind
                ));
            }
            ValueOp::ClosedEnum => {
                // A value the enum declares is stored as any int32; another
                // one sends the field back to the table-driven path, which
                // keeps it with the unknown fields (protobuf's rule for
                // closed enums).
                let values = ts.enum_values(ts.enum_type(f.sub));
                let pattern = enum_pattern(values.iter().map(|v| v.number));
                w.line(format!("let raw = d.value(&mut pos, end, {site})?;"));
                w.line("let v = raw as u32 as u64;");
                w.open(format!("if matches!(v as u32 as i32, {pattern})"));
                store_card(w, "v", op.size);
                w.close_with(" else {");
                w.indent();
                w.line("pos = d.field(M, obj, start, end)?;");
                w.close();
            }
            ValueOp::Fixed32 => {
                w.line(format!("let v = d.fixed::<4>(&mut pos, end, {site})?;"));
                store_card(w, "v", op.size);
            }
            ValueOp::Fixed64 => {
                w.line(format!("let v = d.fixed::<8>(&mut pos, end, {site})?;"));
                store_card(w, "v", op.size);
            }
            _ => {
                w.line(format!("let raw = d.value(&mut pos, end, {site})?;"));
                let conv = match f.kind {
                    Kind::Int64 | Kind::UInt64 => "raw".to_owned(),
                    k => format!("{GEN}::bits(::protoplane_schema::Kind::{k:?}, raw)"),
                };
                w.line(format!("let v = {conv};"));
                store_card(w, "v", op.size);
            }
        }
        w.close();
    }
    if !arms.is_empty() {
        w.line("_ => pos = d.field(M, obj, start, end)?,");
        w.close();
    }
    w.close();
    if msg.flags.has(protoplane_schema::MessageFlags::HAS_REQUIRED) {
        w.line("d.saw_required();");
    }
    w.line("Ok(pos)");
    w.close();
    w.close();
    Ok(())
}

/// A `match` pattern for the numbers of an enum's values: runs of
/// consecutive numbers as ranges (`-1..=3 | 7 | 10..=12`), so a dense enum
/// is one range check.
fn enum_pattern(numbers: impl Iterator<Item = i32>) -> String {
    let mut numbers: Vec<i32> = numbers.collect();
    numbers.sort_unstable();
    numbers.dedup();
    let mut runs: Vec<(i32, i32)> = Vec::new();
    for n in numbers {
        match runs.last_mut() {
            Some((_, hi)) if hi.checked_add(1) == Some(n) => *hi = n,
            _ => runs.push((n, n)),
        }
    }
    if runs.is_empty() {
        // An enum always declares a value; a pattern that matches nothing
        // keeps the generated code valid all the same.
        return "_ if false".into();
    }
    let parts: Vec<String> = runs
        .iter()
        .map(|&(lo, hi)| if lo == hi { format!("{lo}") } else { format!("{lo}..={hi}") })
        .collect();
    parts.join(" | ")
}

/// The byte offset of hasbit `bit`'s word in an object, and its mask.
pub(crate) fn hasbit(bit: u32) -> (u32, u32) {
    (4 * (bit / 32), 1 << (bit % 32))
}

/// The generated marker of a sub-message field's type, from `scope`.
pub(crate) fn sub_path(g: &Generator<'_>, scope: &Scope, f: &Field) -> Result<String, Error> {
    Ok(scope.path(g.types().get(g.ts().message_name(f.sub))?, ""))
}
