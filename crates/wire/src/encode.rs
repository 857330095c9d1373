//! Encode: linearized block -> wire bytes.
//!
//! This is the second of the two phases ARCHITECTURE.md keeps apart: the block
//! was laid out by the decoder or a builder (in the split engine: by the
//! application), and this walks it and emits tags, varints and lengths.
//!
//! Output is what protobuf C++ / Python produce with deterministic
//! serialization: known fields in field-number order, repeated scalars
//! packed when the schema says so, unknown fields after the known ones in
//! arrival order; with `deterministic`, map entries sorted by key (and a
//! key that arrived twice written once, the last value winning).
//!
//! Two encoders produce these bytes:
//! * the contiguous one ([`Encoder::encode`], [`Encoder::encode_into`]) writes
//!   back to front in a single pass (`back.rs`), ProtoAcc's order;
//! * the forward one, two passes: `size` computes every sub-message's length
//!   once, in pre-order, into a scratch list; `write` walks the same order
//!   forward. It serves [`Encoder::encoded_len`] and the scatter-gather
//!   encode ([`Encoder::encode_sg`]), whose pieces must come out in order.
//!
//! Both are driven by the schema's precomputed field ops (`FieldOp`: the
//! canonical tag already varint-encoded, value and presence handling
//! resolved), one `match` per field instead of several on `Kind`.
//!
//! The block is not trusted: every object and reference is bounds-checked,
//! depth is limited (a reference cycle fails as too deep), and the work and
//! the output are bounded by what a tree-shaped block of the same size can
//! need ([`work_budget`], [`output_budget`]): shared sub-objects fail fast
//! instead of exploding.

use std::cmp::Ordering;

use protoplane_schema::{
    Card, Field, FieldFlags, FieldOp, Kind, Message, MessageFlags, TableSet, ValueOp, WireType,
};

use crate::back::Back;
use crate::block::{read_u32, Ref, HEADER_LEN};
use crate::error::BlockError;
use crate::sink::{SgList, Sink};
use crate::varint;

/// Knobs of an encode.
#[derive(Clone, Copy, Debug)]
pub struct EncodeOptions {
    /// Sort map entries by key (protobuf's deterministic serialization).
    pub deterministic: bool,
    /// Maximum nesting below the root.
    pub max_depth: u32,
    /// Maximum encoded size in bytes (protobuf's limit: 2 GiB - 1).
    pub max_size: usize,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions { deterministic: false, max_depth: 100, max_size: i32::MAX as usize }
    }
}

/// The memory a block's references can point into.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    /// The block.
    pub block: &'a [u8],
    /// The wire bytes a view-mode block references (empty otherwise).
    pub wire: &'a [u8],
    /// The device region that device references (RPCAcc placement) point
    /// into; empty when the reader has none (the application's view of a
    /// block: a device-placed field is then a handle, not bytes).
    pub device: &'a [u8],
}

impl<'a> Source<'a> {
    /// A block that references nothing outside itself.
    pub fn owned(block: &'a [u8]) -> Self {
        Source { block, wire: &[], device: &[] }
    }

    /// A block whose strings and bytes may reference `wire` (view mode).
    pub fn viewing(block: &'a [u8], wire: &'a [u8]) -> Self {
        Source { block, wire, device: &[] }
    }

    /// The same, with device references resolved in `device` (what the
    /// engine's encoder uses to pull device-placed fields).
    pub fn with_device(self, device: &'a [u8]) -> Self {
        Source { device, ..self }
    }

    /// The bytes a string / bytes / unknown-fields reference designates.
    #[inline(always)]
    pub(crate) fn bytes(&self, r: Ref, at: usize) -> Result<&'a [u8], BlockError> {
        if r.len == 0 {
            return Ok(&[]);
        }
        let base = if r.device {
            if self.device.is_empty() {
                return Err(BlockError::NoDeviceRegion);
            }
            self.device
        } else if r.wire {
            self.wire
        } else {
            self.block
        };
        base.get(r.offset as usize..r.offset as usize + r.len as usize)
            .ok_or(BlockError::OutOfBounds { at })
    }

    /// The byte range of an array of `len` elements of `elem` bytes.
    #[inline(always)]
    pub(crate) fn array(&self, r: Ref, elem: usize, at: usize) -> Result<&'a [u8], BlockError> {
        if r.device || r.wire {
            return Err(if r.device {
                BlockError::NoDeviceRegion
            } else {
                BlockError::OutOfBounds { at }
            });
        }
        if r.len == 0 {
            return Ok(&[]);
        }
        let start = r.offset as usize;
        self.block.get(start..start + r.len as usize * elem).ok_or(BlockError::OutOfBounds { at })
    }

    /// The object of type `m` at `at`, bounds-checked once so that slot reads
    /// inside it cannot fail.
    #[inline(always)]
    pub(crate) fn object(&self, at: usize, m: &Message) -> Result<&'a [u8], BlockError> {
        if at < HEADER_LEN {
            return Err(BlockError::OutOfBounds { at });
        }
        self.block.get(at..at + m.size as usize).ok_or(BlockError::OutOfBounds { at })
    }

    /// The root object's offset, checked against the expected type.
    pub(crate) fn root(&self, ts: &TableSet, type_index: u32) -> Result<usize, BlockError> {
        let root = read_u32(self.block, 0).ok_or(BlockError::OutOfBounds { at: 0 })?;
        let ty = read_u32(self.block, 4).ok_or(BlockError::OutOfBounds { at: 4 })?;
        if ty != type_index || ty as usize >= ts.messages().len() {
            return Err(BlockError::WrongType);
        }
        Ok(root as usize)
    }
}

// Slot reads: one bounds check each (the object slice was checked against
// the message size, the offsets come from validated tables, so they never
// fail on a well-formed block; a forged block reads zeros, never panics).
#[inline(always)]
pub(crate) fn slot_u32(obj: &[u8], off: u32) -> u32 {
    let o = off as usize;
    match obj.get(o..o + 4) {
        Some(b) => u32::from_le_bytes(b.try_into().unwrap_or([0; 4])),
        None => 0,
    }
}

#[inline(always)]
pub(crate) fn slot_u64(obj: &[u8], off: u32) -> u64 {
    let o = off as usize;
    match obj.get(o..o + 8) {
        Some(b) => u64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
        None => 0,
    }
}

/// Slot bits of a scalar of `kind` (zero-extended).
#[inline(always)]
pub(crate) fn scalar_bits(obj: &[u8], off: u32, kind: Kind) -> u64 {
    match kind.slot_size() {
        8 => slot_u64(obj, off),
        4 => slot_u32(obj, off) as u64,
        _ => obj[off as usize] as u64,
    }
}

#[inline(always)]
pub(crate) fn hasbit(obj: &[u8], bit: u32) -> bool {
    slot_u32(obj, 4 * (bit / 32)) & (1 << (bit % 32)) != 0
}

/// The wire varint for slot bits of a varint kind.
#[inline(always)]
fn varint_value(kind: Kind, bits: u64) -> u64 {
    match kind {
        // Negative int32 / enum values are sign-extended to ten bytes.
        Kind::Int32 | Kind::Enum => bits as u32 as i32 as i64 as u64,
        Kind::SInt32 => varint::zigzag32(bits as u32 as i32) as u64,
        Kind::SInt64 => varint::zigzag64(bits as i64),
        Kind::Bool => (bits != 0) as u64,
        _ => bits,
    }
}

/// Wire size of one scalar value (without tag).
#[inline(always)]
fn scalar_len(kind: Kind, bits: u64) -> usize {
    match kind.wire_type() {
        WireType::Fixed32 => 4,
        WireType::Fixed64 => 8,
        _ => varint::len(varint_value(kind, bits)),
    }
}

/// Whether a singular field is set (hasbit, oneof case or always-encoded
/// map-entry field); `false` for repeated fields, whose presence is their
/// length. Implicit-presence fields are then also checked for zero.
#[inline(always)]
pub(crate) fn present(obj: &[u8], op: &FieldOp) -> bool {
    match op.card {
        Card::Hasbit | Card::Implicit => hasbit(obj, op.presence),
        Card::Oneof => slot_u32(obj, op.presence) == op.tag >> 3,
        Card::Always => true,
        Card::Repeated | Card::Packed => false,
    }
}

/// How much work (objects visited plus repeated elements) an encode of
/// `src` may do. A block built by the decoder or a builder is a tree: every
/// object (at least 8 bytes) and every array element (at least 1 byte) is
/// reached once, so the work is at most the block's length. A forged block
/// whose references share objects (a DAG) could otherwise make a small
/// block encode for minutes; it fails with `TooLarge` once it has done more
/// work than any tree of its size could need.
pub(crate) fn work_budget(src: Source<'_>, opts: &EncodeOptions) -> usize {
    opts.max_size.min(src.block.len() + 64)
}

/// The most bytes an encode of `src` may produce: per block byte at most 8
/// (an unpacked `bool` element, one byte in its array, is a tag of up to
/// five bytes and a value byte; every other slot or object yields less per
/// byte it occupies) plus the wire bytes a view references and the device
/// region device references point into. Past this the
/// block shares references and fails with `TooLarge` before the output
/// buffer grows further.
pub(crate) fn output_budget(src: Source<'_>, opts: &EncodeOptions) -> usize {
    opts.max_size.min(8 * src.block.len() + src.wire.len() + src.device.len() + 64)
}

/// Reusable encoder scratch (sub-message sizes, map orderings).
#[derive(Debug, Default)]
pub struct Encoder {
    sizes: Vec<u32>,
    next: usize,
    pub(crate) work: usize,
    /// Limit of `work` for this encode (see [`work_budget`]).
    pub(crate) budget: usize,
    /// Pool of map-order vectors (nested maps need one each).
    pub(crate) orders: Vec<Vec<u32>>,
    /// The back-to-front output buffer (see `back.rs`), reused.
    pub(crate) back: Vec<u8>,
}

/// Encodes a block whose strings are all inside it (owned mode).
pub fn encode(
    tables: &TableSet,
    type_index: u32,
    block: &[u8],
    opts: &EncodeOptions,
) -> Result<Vec<u8>, BlockError> {
    let mut out = Vec::new();
    Encoder::default().encode_into(tables, type_index, Source::owned(block), opts, &mut out)?;
    Ok(out)
}

impl Encoder {
    /// An encoder with empty scratch space.
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// Exact encoded length of the message in `src`.
    pub fn encoded_len(
        &mut self,
        ts: &TableSet,
        type_index: u32,
        src: Source<'_>,
        opts: &EncodeOptions,
    ) -> Result<usize, BlockError> {
        let root = src.root(ts, type_index)?;
        self.sizes.clear();
        self.work = 0;
        self.budget = work_budget(src, opts);
        let n = self.size(ts, type_index, root, src, opts, 0)?;
        if n > opts.max_size {
            return Err(BlockError::TooLarge);
        }
        Ok(n)
    }

    /// Encodes the message in `src` into the encoder's own reused buffer and
    /// returns the bytes: one back-to-front pass (see `back.rs`), no size
    /// pass, no copy beyond the payloads'. The slice is valid until the
    /// encoder is used again; the buffer keeps the size of the largest
    /// message encoded so far.
    pub fn encode(
        &mut self,
        ts: &TableSet,
        type_index: u32,
        src: Source<'_>,
        opts: &EncodeOptions,
    ) -> Result<&[u8], BlockError> {
        let root = src.root(ts, type_index)?;
        self.work = 0;
        self.budget = work_budget(src, opts);
        let mut w = Back::new(std::mem::take(&mut self.back), output_budget(src, opts));
        let done = self.back_object(ts, type_index, root, src, opts, 0, &mut w);
        let pos = w.pos;
        self.back = w.buf;
        done?;
        Ok(&self.back[pos..])
    }

    /// Encodes the message object of type `type_index` at byte `at` of the
    /// block (a sub-message, as [`crate::MessageView::offset`] gives it;
    /// 0: the empty message) the way [`Encoder::encode`] encodes the root:
    /// a reader holding a view of a nested message serializes it alone.
    pub fn encode_at(
        &mut self,
        ts: &TableSet,
        type_index: u32,
        src: Source<'_>,
        at: usize,
        opts: &EncodeOptions,
    ) -> Result<&[u8], BlockError> {
        if type_index as usize >= ts.messages().len() {
            return Err(BlockError::WrongType);
        }
        if at == 0 {
            return Ok(&[]);
        }
        if at > src.block.len() {
            return Err(BlockError::OutOfBounds { at });
        }
        self.work = 0;
        self.budget = work_budget(src, opts);
        let mut w = Back::new(std::mem::take(&mut self.back), output_budget(src, opts));
        let done = self.back_object(ts, type_index, at, src, opts, 0, &mut w);
        let pos = w.pos;
        self.back = w.buf;
        done?;
        Ok(&self.back[pos..])
    }

    /// Appends the encoding of the message in `src` to `out` ([`Encoder::encode`]
    /// followed by one copy).
    pub fn encode_into(
        &mut self,
        ts: &TableSet,
        type_index: u32,
        src: Source<'_>,
        opts: &EncodeOptions,
        out: &mut Vec<u8>,
    ) -> Result<(), BlockError> {
        let bytes = self.encode(ts, type_index, src, opts)?;
        out.extend_from_slice(bytes);
        Ok(())
    }

    /// Scatter-gather encode: fills `out` with the framing and references
    /// to the payloads of `src` (see [`SgList`]); no payload byte is copied.
    pub fn encode_sg<'a>(
        &mut self,
        ts: &TableSet,
        type_index: u32,
        src: Source<'a>,
        opts: &EncodeOptions,
        out: &mut SgList<'a>,
    ) -> Result<(), BlockError> {
        self.encoded_len(ts, type_index, src, opts)?;
        let root = src.root(ts, type_index)?;
        self.next = 0;
        self.write(ts, type_index, root, src, opts, out)?;
        out.finish();
        Ok(())
    }

    /// Encodes the object of type `mi` at `at` (no tag, no length).
    pub(crate) fn encode_object(
        &mut self,
        ts: &TableSet,
        mi: u32,
        at: usize,
        src: Source<'_>,
        opts: &EncodeOptions,
        out: &mut Vec<u8>,
    ) -> Result<(), BlockError> {
        self.sizes.clear();
        self.work = 0;
        self.budget = work_budget(src, opts);
        let n = self.size(ts, mi, at, src, opts, 0)?;
        out.reserve(n);
        self.next = 0;
        self.write(ts, mi, at, src, opts, out)
    }

    /// A map entry that carried unknown fields, encoded the way upb (the
    /// engine behind Python `protobuf`) re-encodes it into the parent's
    /// unknown fields instead of inserting it into the map. upb gives proto2
    /// entry fields explicit presence (written when they were on the wire)
    /// and proto3 scalar / string ones implicit presence (written when
    /// non-zero); a message value is written when it was on the wire. The
    /// entry's own unknown fields follow.
    pub(crate) fn encode_entry_as_unknown(
        &mut self,
        ts: &TableSet,
        mi: u32,
        at: usize,
        src: Source<'_>,
        opts: &EncodeOptions,
        out: &mut Vec<u8>,
    ) -> Result<(), BlockError> {
        let m = ts.message(mi);
        let proto3 = m.flags.has(MessageFlags::PROTO3);
        let obj = src.object(at, m)?;
        for f in ts.fields(m) {
            if f.is_repeated() || f.flags.has(FieldFlags::ONEOF) {
                continue; // not a map entry's shape (table validation rejects it too)
            }
            let tag = ((f.number as u64) << 3) | f.kind.wire_type() as u64;
            let seen = hasbit(obj, f.presence);
            if f.kind.is_message() {
                if !seen {
                    continue;
                }
                let r = Ref::unpack(slot_u64(obj, f.offset));
                let mut inner = Vec::new();
                if r.offset != 0 {
                    Encoder::new().encode_object(
                        ts,
                        f.sub,
                        r.offset as usize,
                        src,
                        opts,
                        &mut inner,
                    )?;
                }
                varint::push(out, ((f.number as u64) << 3) | WireType::Len as u64);
                varint::push(out, inner.len() as u64);
                out.extend_from_slice(&inner);
            } else if f.kind.is_scalar() {
                let bits = scalar_bits(obj, f.offset, f.kind);
                if (proto3 && bits != 0) || (!proto3 && seen) {
                    varint::push(out, tag);
                    push_scalar(out, f.kind, bits);
                }
            } else {
                let r = Ref::unpack(slot_u64(obj, f.offset));
                if (proto3 && r.len != 0) || (!proto3 && seen) {
                    varint::push(out, tag);
                    varint::push(out, r.len as u64);
                    out.extend_from_slice(src.bytes(r, at + f.offset as usize)?);
                }
            }
        }
        let unknown = Ref::unpack(slot_u64(obj, m.unknown_offset));
        out.extend_from_slice(src.array(unknown, 1, at + m.unknown_offset as usize)?);
        Ok(())
    }

    /// Counts work (objects, elements, bytes) against the size limit.
    #[inline(always)]
    pub(crate) fn charge(&mut self, units: usize, _opts: &EncodeOptions) -> Result<(), BlockError> {
        self.work += units;
        if self.work > self.budget {
            return Err(BlockError::TooLarge);
        }
        Ok(())
    }

    /// Size pass: returns the encoded length of the object at `at` and
    /// records every sub-message's length in pre-order.
    fn size(
        &mut self,
        ts: &TableSet,
        mi: u32,
        at: usize,
        src: Source<'_>,
        opts: &EncodeOptions,
        depth: u32,
    ) -> Result<usize, BlockError> {
        let m = ts.message(mi);
        let obj = src.object(at, m)?;
        self.charge(1, opts)?;
        let mut n = 0usize;
        for (i, op) in ts.ops(m).iter().enumerate() {
            if !present(obj, op) {
                if matches!(op.card, Card::Repeated | Card::Packed) {
                    let r = Ref::unpack(slot_u64(obj, op.offset));
                    if r.len != 0 {
                        self.charge(r.len as usize, opts)?;
                        let f = &ts.fields(m)[i];
                        n += self.size_repeated(ts, m, f, r, at, src, opts, depth, op.tag_len)?;
                    }
                }
                continue;
            }
            let tl = op.tag_len as usize;
            let implicit = op.card == Card::Implicit;
            n += match op.value {
                ValueOp::Int32 | ValueOp::ClosedEnum => {
                    let v = slot_u32(obj, op.offset);
                    if implicit && v == 0 {
                        continue;
                    }
                    tl + varint::len(v as i32 as i64 as u64)
                }
                ValueOp::UInt32 => {
                    let v = slot_u32(obj, op.offset);
                    if implicit && v == 0 {
                        continue;
                    }
                    tl + varint::len(v as u64)
                }
                ValueOp::SInt32 => {
                    let v = slot_u32(obj, op.offset);
                    if implicit && v == 0 {
                        continue;
                    }
                    tl + varint::len(varint::zigzag32(v as i32) as u64)
                }
                ValueOp::Int64 | ValueOp::SInt64 => {
                    let v = slot_u64(obj, op.offset);
                    if implicit && v == 0 {
                        continue;
                    }
                    let v =
                        if op.value == ValueOp::SInt64 { varint::zigzag64(v as i64) } else { v };
                    tl + varint::len(v)
                }
                ValueOp::Bool => {
                    if implicit && obj.get(op.offset as usize).copied().unwrap_or(0) == 0 {
                        continue;
                    }
                    tl + 1
                }
                ValueOp::Fixed32 => {
                    if implicit && slot_u32(obj, op.offset) == 0 {
                        continue;
                    }
                    tl + 4
                }
                ValueOp::Fixed64 => {
                    if implicit && slot_u64(obj, op.offset) == 0 {
                        continue;
                    }
                    tl + 8
                }
                ValueOp::Bytes | ValueOp::Utf8 => {
                    let r = Ref::unpack(slot_u64(obj, op.offset));
                    if implicit && r.len == 0 {
                        continue;
                    }
                    src.bytes(r, at + op.offset as usize)?;
                    tl + varint::len(r.len as u64) + r.len as usize
                }
                ValueOp::Message | ValueOp::Group => {
                    let r = Ref::unpack(slot_u64(obj, op.offset));
                    if r.offset == 0 && op.card != Card::Always {
                        continue;
                    }
                    let f = &ts.fields(m)[i];
                    self.size_sub(ts, f, r.offset as usize, src, opts, depth, op.tag_len)?
                }
            };
        }
        let unknown = Ref::unpack(slot_u64(obj, m.unknown_offset));
        n += src.array(unknown, 1, at + m.unknown_offset as usize)?.len();
        Ok(n)
    }

    /// Size of one sub-message field occurrence (tag(s) + length + content).
    #[allow(clippy::too_many_arguments)]
    fn size_sub(
        &mut self,
        ts: &TableSet,
        f: &Field,
        obj: usize,
        src: Source<'_>,
        opts: &EncodeOptions,
        depth: u32,
        tag_len: u8,
    ) -> Result<usize, BlockError> {
        let tag_len = tag_len as usize;
        if depth >= opts.max_depth {
            return Err(BlockError::TooDeep);
        }
        let slot = self.sizes.len();
        self.sizes.push(0);
        // A map entry's absent message value (offset 0) encodes as empty.
        let inner = if obj == 0 { 0 } else { self.size(ts, f.sub, obj, src, opts, depth + 1)? };
        self.sizes[slot] = u32::try_from(inner).map_err(|_| BlockError::TooLarge)?;
        Ok(if f.kind == Kind::Group {
            2 * tag_len + inner
        } else {
            tag_len + varint::len(inner as u64) + inner
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn size_repeated(
        &mut self,
        ts: &TableSet,
        m: &Message,
        f: &Field,
        r: Ref,
        at: usize,
        src: Source<'_>,
        opts: &EncodeOptions,
        depth: u32,
        tag_len: u8,
    ) -> Result<usize, BlockError> {
        let tag_len = tag_len as usize;
        let slot_at = at + f.offset as usize;
        if f.kind.is_scalar() {
            let size = f.kind.slot_size() as usize;
            let arr = src.array(r, size, slot_at)?;
            let payload = match f.kind.wire_type() {
                WireType::Fixed32 => 4 * r.len as usize,
                WireType::Fixed64 => 8 * r.len as usize,
                _ => arr.chunks_exact(size).map(|c| scalar_len(f.kind, le_bits(c))).sum(),
            };
            return Ok(if f.flags.has(FieldFlags::PACKED) {
                tag_len + varint::len(payload as u64) + payload
            } else {
                r.len as usize * tag_len + payload
            });
        }
        let arr = src.array(r, 8, slot_at)?;
        let mut n = 0;
        if f.kind.is_message() {
            if opts.deterministic && f.flags.has(FieldFlags::MAP) {
                let order = self.map_order(ts, m, f, arr, src)?;
                for i in order.iter().copied() {
                    let e = Ref::unpack(le_bits(&arr[8 * i as usize..8 * i as usize + 8]));
                    n +=
                        self.size_sub(ts, f, e.offset as usize, src, opts, depth, tag_len as u8)?;
                }
                self.orders.push(order);
            } else {
                for c in arr.chunks_exact(8) {
                    let e = Ref::unpack(le_bits(c));
                    n +=
                        self.size_sub(ts, f, e.offset as usize, src, opts, depth, tag_len as u8)?;
                }
            }
        } else {
            for c in arr.chunks_exact(8) {
                let e = Ref::unpack(le_bits(c));
                src.bytes(e, slot_at)?;
                n += tag_len + varint::len(e.len as u64) + e.len as usize;
            }
        }
        Ok(n)
    }

    /// Deterministic order of a map's entries: sorted by key, a key that
    /// occurs twice collapsed to its last occurrence. The vector comes from
    /// (and goes back to) a small pool, so steady-state encoding allocates nothing.
    #[cold]
    pub(crate) fn map_order(
        &mut self,
        ts: &TableSet,
        _m: &Message,
        f: &Field,
        arr: &[u8],
        src: Source<'_>,
    ) -> Result<Vec<u32>, BlockError> {
        let n = arr.len() / 8;
        let mut order = self.orders.pop().unwrap_or_default();
        order.clear();
        order.extend(0..n as u32);
        let entry = ts.message(f.sub);
        let Some(key_field) = ts.fields(entry).first().filter(|k| k.number == 1) else {
            return Ok(order);
        };
        let key = |i: u32| -> Result<MapKey<'_>, BlockError> {
            let e = Ref::unpack(le_bits(&arr[8 * i as usize..8 * i as usize + 8]));
            let obj = src.object(e.offset as usize, entry)?;
            Ok(if key_field.kind.is_scalar() {
                let bits = scalar_bits(obj, key_field.offset, key_field.kind);
                MapKey::Int(match key_field.kind {
                    Kind::Int32 | Kind::SInt32 | Kind::SFixed32 => bits as u32 as i32 as i128,
                    Kind::Int64 | Kind::SInt64 | Kind::SFixed64 => bits as i64 as i128,
                    _ => bits as i128,
                })
            } else {
                let r = Ref::unpack(slot_u64(obj, key_field.offset));
                MapKey::Bytes(src.bytes(r, e.offset as usize)?)
            })
        };
        // Validate every key first so the comparator cannot fail.
        let mut keys = Vec::with_capacity(n);
        for i in 0..n as u32 {
            keys.push(key(i)?);
        }
        order.sort_by(|&a, &b| keys[a as usize].cmp(&keys[b as usize]).then(a.cmp(&b)));
        // Keep the last of each run of equal keys.
        let mut w = 0;
        for i in 0..order.len() {
            let last = i + 1 == order.len()
                || keys[order[i] as usize].cmp(&keys[order[i + 1] as usize]) != Ordering::Equal;
            if last {
                order[w] = order[i];
                w += 1;
            }
        }
        order.truncate(w);
        Ok(order)
    }

    /// Write pass: same walk as `size`, consuming the recorded lengths.
    fn write<'a, S: Sink<'a>>(
        &mut self,
        ts: &TableSet,
        mi: u32,
        at: usize,
        src: Source<'a>,
        opts: &EncodeOptions,
        out: &mut S,
    ) -> Result<(), BlockError> {
        let m = ts.message(mi);
        let obj = src.object(at, m)?;
        for (i, op) in ts.ops(m).iter().enumerate() {
            if !present(obj, op) {
                if matches!(op.card, Card::Repeated | Card::Packed) {
                    let r = Ref::unpack(slot_u64(obj, op.offset));
                    if r.len != 0 {
                        let f = &ts.fields(m)[i];
                        self.write_repeated(ts, m, f, r, at, src, opts, out)?;
                    }
                }
                continue;
            }
            let implicit = op.card == Card::Implicit;
            match op.value {
                ValueOp::Int32 | ValueOp::ClosedEnum | ValueOp::UInt32 | ValueOp::SInt32 => {
                    let v = slot_u32(obj, op.offset);
                    if implicit && v == 0 {
                        continue;
                    }
                    out.tag(op.tag_bytes, op.tag_len);
                    out.varint(match op.value {
                        ValueOp::UInt32 => v as u64,
                        ValueOp::SInt32 => varint::zigzag32(v as i32) as u64,
                        _ => v as i32 as i64 as u64,
                    });
                }
                ValueOp::Int64 | ValueOp::SInt64 => {
                    let v = slot_u64(obj, op.offset);
                    if implicit && v == 0 {
                        continue;
                    }
                    out.tag(op.tag_bytes, op.tag_len);
                    out.varint(if op.value == ValueOp::SInt64 {
                        varint::zigzag64(v as i64)
                    } else {
                        v
                    });
                }
                ValueOp::Bool => {
                    let v = obj.get(op.offset as usize).copied().unwrap_or(0);
                    if implicit && v == 0 {
                        continue;
                    }
                    out.tag(op.tag_bytes, op.tag_len);
                    out.bytes(&[(v != 0) as u8]);
                }
                ValueOp::Fixed32 => {
                    let v = slot_u32(obj, op.offset);
                    if implicit && v == 0 {
                        continue;
                    }
                    out.tag(op.tag_bytes, op.tag_len);
                    out.bytes(&v.to_le_bytes());
                }
                ValueOp::Fixed64 => {
                    let v = slot_u64(obj, op.offset);
                    if implicit && v == 0 {
                        continue;
                    }
                    out.tag(op.tag_bytes, op.tag_len);
                    out.bytes(&v.to_le_bytes());
                }
                ValueOp::Bytes | ValueOp::Utf8 => {
                    let r = Ref::unpack(slot_u64(obj, op.offset));
                    if implicit && r.len == 0 {
                        continue;
                    }
                    out.tag(op.tag_bytes, op.tag_len);
                    out.varint(r.len as u64);
                    out.payload(src.bytes(r, at + op.offset as usize)?);
                }
                ValueOp::Message | ValueOp::Group => {
                    let r = Ref::unpack(slot_u64(obj, op.offset));
                    if r.offset == 0 && op.card != Card::Always {
                        continue;
                    }
                    let f = &ts.fields(m)[i];
                    self.write_sub(ts, f, r.offset as usize, src, opts, out)?;
                }
            }
        }
        let unknown = Ref::unpack(slot_u64(obj, m.unknown_offset));
        out.payload(src.array(unknown, 1, at + m.unknown_offset as usize)?);
        Ok(())
    }

    fn write_sub<'a, S: Sink<'a>>(
        &mut self,
        ts: &TableSet,
        f: &Field,
        obj: usize,
        src: Source<'a>,
        opts: &EncodeOptions,
        out: &mut S,
    ) -> Result<(), BlockError> {
        let len = self.sizes.get(self.next).copied().ok_or(BlockError::OutOfBounds { at: obj })?;
        self.next += 1;
        if f.kind == Kind::Group {
            out.varint(((f.number as u64) << 3) | WireType::StartGroup as u64);
            if obj != 0 {
                self.write(ts, f.sub, obj, src, opts, out)?;
            }
            out.varint(((f.number as u64) << 3) | WireType::EndGroup as u64);
        } else {
            out.varint(((f.number as u64) << 3) | WireType::Len as u64);
            out.varint(len as u64);
            if obj != 0 {
                self.write(ts, f.sub, obj, src, opts, out)?;
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn write_repeated<'a, S: Sink<'a>>(
        &mut self,
        ts: &TableSet,
        m: &Message,
        f: &Field,
        r: Ref,
        at: usize,
        src: Source<'a>,
        opts: &EncodeOptions,
        out: &mut S,
    ) -> Result<(), BlockError> {
        let slot_at = at + f.offset as usize;
        if f.kind.is_scalar() {
            let size = f.kind.slot_size() as usize;
            let arr = src.array(r, size, slot_at)?;
            if f.flags.has(FieldFlags::PACKED) {
                out.varint(((f.number as u64) << 3) | WireType::Len as u64);
                match f.kind.wire_type() {
                    WireType::Fixed32 | WireType::Fixed64 => {
                        out.varint(arr.len() as u64);
                        out.payload(arr);
                    }
                    _ => {
                        let payload: usize =
                            arr.chunks_exact(size).map(|c| scalar_len(f.kind, le_bits(c))).sum();
                        out.varint(payload as u64);
                        for c in arr.chunks_exact(size) {
                            push_scalar(out, f.kind, le_bits(c));
                        }
                    }
                }
            } else {
                let tag = ((f.number as u64) << 3) | f.kind.wire_type() as u64;
                for c in arr.chunks_exact(size) {
                    out.varint(tag);
                    push_scalar(out, f.kind, le_bits(c));
                }
            }
            return Ok(());
        }
        let arr = src.array(r, 8, slot_at)?;
        if f.kind.is_message() {
            if opts.deterministic && f.flags.has(FieldFlags::MAP) {
                let order = self.map_order(ts, m, f, arr, src)?;
                for i in order.iter().copied() {
                    let e = Ref::unpack(le_bits(&arr[8 * i as usize..8 * i as usize + 8]));
                    self.write_sub(ts, f, e.offset as usize, src, opts, out)?;
                }
                self.orders.push(order);
            } else {
                for c in arr.chunks_exact(8) {
                    let e = Ref::unpack(le_bits(c));
                    self.write_sub(ts, f, e.offset as usize, src, opts, out)?;
                }
            }
        } else {
            let tag = ((f.number as u64) << 3) | WireType::Len as u64;
            for c in arr.chunks_exact(8) {
                let e = Ref::unpack(le_bits(c));
                out.varint(tag);
                out.varint(e.len as u64);
                out.payload(src.bytes(e, slot_at)?);
            }
        }
        Ok(())
    }
}

/// A map key, ordered the way protobuf's deterministic serialization orders
/// them (signed integers numerically, unsigned numerically, bool false
/// first, strings bytewise).
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum MapKey<'a> {
    Int(i128),
    Bytes(&'a [u8]),
}

/// Little-endian bits of a 1-, 4- or 8-byte element.
#[inline(always)]
pub(crate) fn le_bits(c: &[u8]) -> u64 {
    match c.len() {
        8 => u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
        4 => u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u64,
        _ => c.first().copied().unwrap_or(0) as u64,
    }
}

#[inline(always)]
fn push_scalar<'a, S: Sink<'a>>(out: &mut S, kind: Kind, bits: u64) {
    match kind.wire_type() {
        WireType::Fixed32 => out.bytes(&(bits as u32).to_le_bytes()),
        WireType::Fixed64 => out.bytes(&bits.to_le_bytes()),
        _ => out.varint(varint_value(kind, bits)),
    }
}
