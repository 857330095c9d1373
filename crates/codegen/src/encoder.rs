//! The generated encoder of a message: `encode_fields`, the table-driven
//! back-to-front encoder unrolled for one type (see `protoplane_wire::gen`,
//! [`Enc`](../../protoplane_wire/gen/struct.Enc.html)): fields in reverse
//! number order, each with its presence test (a hasbit word and mask, a
//! oneof case word, or non-zero for implicit presence), its value
//! conversion and its pre-encoded tag as constants, sub-messages as direct
//! calls, repeated fields as loops over their elements with the same
//! constants. Maps to be sorted by key (deterministic output) and groups are
//! handed to the table-driven encoder, one call per non-empty field.

use protoplane_schema::{Card, FieldFlags, ValueOp};

use crate::decoder::{hasbit, sub_path};
use crate::generator::{Generator, Scope};
use crate::model::{MessageInfo, TypeLoc};
use crate::writer::CodeWriter;
use crate::Error;

const GEN: &str = "::protoplane_wire::gen";

/// Emits `impl Marker { pub fn encode_fields(..) }`.
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
        "The generated encoder of this type's fields (`protoplane_wire::gen`): writes the\n\
         object at `at`, back to front. Called by `encode` and by the encoders of the\n\
         messages that contain this one.",
    );
    w.line("#[doc(hidden)]");
    w.line("#[allow(unused_variables, clippy::identity_op)]");
    w.open_fn(
        "pub fn encode_fields",
        &[format!("e: &mut {GEN}::Enc<'_, '_>"), "at: usize".into(), "depth: u32".into()],
        "Result<(), ::protoplane_wire::BlockError>",
    );
    w.line(format!("let obj = e.object(at, {})?;", msg.size));
    w.line(format!("e.unknown(obj, at, {})?;", msg.unknown_offset));
    for (index, (f, op)) in fields.iter().zip(ops).enumerate().rev() {
        let off = op.offset;
        let tag = format!("{:#x}, {}", op.tag_bytes, op.tag_len);
        let m = info.type_index;
        if matches!(op.card, Card::Repeated | Card::Packed) {
            w.line(format!("let r = {GEN}::u64_at(obj, {off});"));
            if op.value != ValueOp::Message {
                w.open(format!("if {GEN}::ref_len(r) != 0"));
                repeated_elements(w, op, &tag, m, index);
                w.close();
                continue;
            }
            let path = sub_path(g, scope, f)?;
            w.open(format!("if {GEN}::ref_len(r) != 0"));
            if f.flags.has(FieldFlags::MAP) {
                // Sorted by key when deterministic: the tables do that.
                w.open("if e.deterministic()");
                w.line(format!("e.repeated({m}, {index}, r, at, depth)?;"));
                w.close_with(" else {");
                w.indent();
            }
            w.open(format!("for c in e.elements(r, at + {off})?.chunks_exact(8).rev()"));
            w.line(format!("let sub = {GEN}::ref_offset({GEN}::u64_at(c, 0));"));
            sub_message(w, &path, &tag, true);
            w.close();
            if f.flags.has(FieldFlags::MAP) {
                w.close();
            }
            w.close();
            continue;
        }
        let present = match op.card {
            Card::Hasbit | Card::Implicit => {
                let (word, mask) = hasbit(op.presence);
                format!("{GEN}::u32_at(obj, {word}) & {mask:#x} != 0")
            }
            Card::Oneof => format!("{GEN}::u32_at(obj, {}) == {}", op.presence, f.number),
            _ => "true".to_owned(),
        };
        let implicit = op.card == Card::Implicit;
        w.open(format!("if {present}"));
        match op.value {
            ValueOp::Message | ValueOp::Group => {
                w.line(format!("let sub = {GEN}::ref_offset({GEN}::u64_at(obj, {off}));"));
                if op.card == Card::Always && op.value == ValueOp::Message {
                    // A map entry's message value: written even when absent
                    // (as an empty message).
                    sub_message(w, &sub_path(g, scope, f)?, &tag, true);
                    w.close();
                    continue;
                }
                w.open("if sub != 0");
                if op.value == ValueOp::Group {
                    w.line(format!("e.group({m}, {index}, sub, depth)?;"));
                } else {
                    sub_message(w, &sub_path(g, scope, f)?, &tag, false);
                }
                w.close();
            }
            ValueOp::Bytes | ValueOp::Utf8 => {
                w.line(format!("let r = {GEN}::u64_at(obj, {off});"));
                if implicit {
                    w.open(format!("if {GEN}::ref_len(r) != 0"));
                }
                w.line(format!("e.string_field({tag}, r, at + {off})?;"));
                if implicit {
                    w.close();
                }
            }
            value => {
                let (read, call, value) = scalar_write(value);
                let write = format!("e.{call}({tag}, {value})?;");
                w.line(format!("let v = {GEN}::{read}(obj, {off});"));
                if implicit {
                    w.open("if v != 0");
                }
                w.line(write);
                if implicit {
                    w.close();
                }
            }
        }
        w.close();
    }
    w.line("Ok(())");
    w.close();
    w.close();
    Ok(())
}

/// How a scalar slot is read and written: the slot reader of
/// `protoplane_wire::gen`, the `Enc` writer of a whole field (tag and
/// value), and the value that writer takes, from the slot bits `v`.
fn scalar_write(value: ValueOp) -> (&'static str, &'static str, &'static str) {
    match value {
        ValueOp::UInt32 => ("u32_at", "varint_field", "v as u64"),
        ValueOp::SInt32 => {
            ("u32_at", "varint_field", "((v << 1) ^ ((v as i32 >> 31) as u32)) as u64")
        }
        ValueOp::Int64 => ("u64_at", "varint_field", "v"),
        ValueOp::SInt64 => ("u64_at", "varint_field", "(v << 1) ^ ((v as i64 >> 63) as u64)"),
        ValueOp::Bool => ("u8_at", "bool_field", "v"),
        ValueOp::Fixed32 => ("u32_at", "fixed32_field", "v"),
        ValueOp::Fixed64 => ("u64_at", "fixed64_field", "v"),
        // Int32, open and closed enums: sign-extended to 64 bits.
        _ => ("u32_at", "varint_field", "v as i32 as i64 as u64"),
    }
}

/// The elements of a non-empty repeated field other than sub-messages
/// (reference in `r`), last to first: strings and bytes each with its tag
/// and length in one reservation; scalars each with its tag, or packed
/// (varints one by one, fixed-width ones as one copy) under one length
/// prefix and tag. The bytes, the work charged and every error are the
/// table-driven `back_repeated`'s; groups still go there.
fn repeated_elements(
    w: &mut CodeWriter,
    op: &protoplane_schema::FieldOp,
    tag: &str,
    m: u32,
    index: usize,
) {
    let off = op.offset;
    match op.value {
        ValueOp::Group => w.line(format!("e.repeated({m}, {index}, r, at, depth)?;")),
        ValueOp::Bytes | ValueOp::Utf8 => {
            w.open(format!("for c in e.elements(r, at + {off})?.chunks_exact(8).rev()"));
            w.line(format!("e.string_field({tag}, {GEN}::u64_at(c, 0), at + {off})?;"));
            w.close();
        }
        value => {
            let size = op.size;
            let (read, call, conv) = scalar_write(value);
            w.line(format!("let arr = e.scalars(r, {size}, at + {off})?;"));
            if op.card == Card::Packed {
                w.line("let mark = e.written();");
                if matches!(value, ValueOp::Fixed32 | ValueOp::Fixed64) {
                    // Slot and wire are both little endian: one copy.
                    w.line("e.raw(arr)?;");
                } else {
                    w.open(format!("for c in arr.chunks_exact({size}).rev()"));
                    w.line(format!("let v = {GEN}::{read}(c, 0);"));
                    let conv = if value == ValueOp::Bool { "(v != 0) as u64" } else { conv };
                    w.line(format!("e.varint({conv})?;"));
                    w.close();
                }
                w.line(format!("e.sub_end(mark, {tag})?;"));
            } else {
                w.open(format!("for c in arr.chunks_exact({size}).rev()"));
                w.line(format!("let v = {GEN}::{read}(c, 0);"));
                w.line(format!("e.{call}({tag}, {conv})?;"));
                w.close();
            }
        }
    }
}

/// One occurrence of a sub-message whose object offset is in `sub`: its
/// content by its type's encoder (`path`), then its length and tag. With
/// `absent_is_empty`, offset 0 encodes as an empty message (repeated
/// elements and map values, as the table-driven `back_sub`); without it the
/// caller has checked `sub != 0`.
fn sub_message(w: &mut CodeWriter, path: &str, tag: &str, absent_is_empty: bool) {
    w.line("let mark = e.sub_start(depth)?;");
    let call = format!("{path}::encode_fields(e, sub, depth + 1)?;");
    if absent_is_empty {
        w.open("if sub != 0");
        w.line(call);
        w.close();
    } else {
        w.line(call);
    }
    w.line(format!("e.sub_end(mark, {tag})?;"));
}
