//! Object layout: assigns every field its slot (see the diagram in `table.rs`).
//!
//! Slots are grouped by size so no padding is needed between them, and
//! 8-byte slots sit at 8-byte aligned offsets when the object itself does
//! (the `wire` crate allocates objects 8-aligned).

use crate::table::{Field, FieldFlags, Message, MessageFlags, Oneof, Span, TableSet, NONE};

/// Field numbers up to this many get a direct-index slot in the dense table.
const DENSE_MAX: u32 = 512;

fn align(x: u32, to: u32) -> u32 {
    (x + to - 1) & !(to - 1)
}

pub(crate) fn lay_out(
    ts: &mut TableSet,
    name: Span,
    mut fields: Vec<Field>,
    oneof_names: &[Span],
    flags: MessageFlags,
) -> Message {
    // Hasbits: every singular field outside a oneof, in field-number order.
    let mut hasbits = 0u32;
    for f in fields.iter_mut() {
        if !f.is_repeated() && !f.flags.has(FieldFlags::ONEOF) {
            f.presence = hasbits;
            hasbits += 1;
        }
    }
    let hasbit_words = hasbits.div_ceil(32);
    let n_oneofs = oneof_names.len() as u32;
    let mut off = 4 * (hasbit_words + n_oneofs);
    off = align(off, 8);

    // Scalar slots, largest first.
    for size in [8u32, 4, 1] {
        for f in fields.iter_mut() {
            let inline = !f.is_repeated() && !f.flags.has(FieldFlags::ONEOF) && f.kind.is_scalar();
            if inline && f.kind.slot_size() == size {
                f.offset = off;
                off += size;
            }
        }
    }
    off = align(off, 8);

    // Oneof unions: 8 bytes each, big enough for any scalar or a reference.
    let oneof_start = ts.oneofs.len() as u32;
    for (i, name) in oneof_names.iter().enumerate() {
        let data_offset = off;
        off += 8;
        ts.oneofs.push(Oneof {
            name: *name,
            case_offset: 4 * (hasbit_words + i as u32),
            data_offset,
        });
    }
    for f in fields.iter_mut() {
        if f.flags.has(FieldFlags::ONEOF) {
            f.offset = ts.oneofs[(oneof_start + f.presence) as usize].data_offset;
        }
    }

    // Reference slots: strings, bytes, sub-messages and every repeated field.
    for f in fields.iter_mut() {
        let by_ref = f.is_repeated() || !f.kind.is_scalar();
        if by_ref && !f.flags.has(FieldFlags::ONEOF) {
            f.offset = off;
            off += 8;
        }
    }
    let unknown_offset = off;
    off += 8;
    let size = align(off, 8);

    // Required mask.
    let required_start = ts.words.len() as u32;
    let mut mask = vec![0u32; hasbit_words as usize];
    for f in &fields {
        if f.label == crate::Label::Required {
            mask[(f.presence / 32) as usize] |= 1 << (f.presence % 32);
        }
    }
    ts.words.extend_from_slice(&mask);

    // Dense lookup table for small field numbers.
    let max_number = fields.last().map_or(0, |f| f.number);
    let dense_len = max_number.min(DENSE_MAX).min(2 * fields.len() as u32 + 32);
    let dense_start = ts.dense.len() as u32;
    let mut dense = vec![0u16; dense_len as usize];
    for (i, f) in fields.iter().enumerate() {
        if f.number <= dense_len {
            dense[f.number as usize - 1] = i as u16 + 1;
        }
    }
    ts.dense.extend_from_slice(&dense);

    let fields_start = ts.fields.len() as u32;
    let n_fields = fields.len() as u32;
    debug_assert!(fields.iter().all(|f| f.presence != NONE || f.is_repeated()));
    ts.fields.extend(fields);
    Message {
        name,
        fields: Span { start: fields_start, len: n_fields },
        oneofs: Span { start: oneof_start, len: n_oneofs },
        dense: Span { start: dense_start, len: dense_len },
        required: Span { start: required_start, len: hasbit_words },
        size,
        hasbit_words,
        unknown_offset,
        flags,
    }
}
