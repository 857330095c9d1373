//! Back-to-front encode: ProtoAcc's serializer order, in one pass.
//!
//! A length-delimited sub-message needs its length before its content. The
//! forward encoder (`encode.rs`) therefore walks every message twice: a size
//! pass, then the write. Writing from the end of a buffer towards its start
//! needs neither: fields go out in reverse order, a sub-message's content is
//! written first, and its length is simply how far the write position moved,
//! known exactly when the length prefix and tag are written in front of it.
//! That is how ProtoAcc's serializer (MICRO'21, "high to low addresses") and
//! upb encode.
//!
//! The buffer is the encoder's own and is reused: it is zero-filled once
//! when it grows (safe Rust cannot write into uninitialised memory), never
//! per message, and the result is the slice from the write position to the
//! end. When a message does not fit, the buffer doubles and the part already
//! written moves to the end of the new one. Growth is bounded by
//! [`EncodeOptions::max_size`], checked before any allocation, so a forged
//! block whose references share one large string many times fails with
//! `TooLarge` instead of exhausting memory.
//!
//! Everything in front of the write position is scratch, which the hot path
//! uses: the buffer always keeps [`HEADROOM`] bytes there beyond what was
//! reserved, so a field reserves its exact size once (tag, value, length
//! prefix and payload together) and then writes with fixed-width stores
//! that may spill garbage in front of what they mean to write: a tag is one
//! 8-byte store of its precomputed bytes, a varint of up to 8 bytes is
//! spread into one word and stored the same way, a short payload is copied
//! in 16-byte chunks ending at its last byte. The garbage is overwritten by
//! the next field or stays outside the result.

use protoplane_schema::{Card, Field, FieldFlags, Kind, Message, TableSet, ValueOp, WireType};

use crate::block::Ref;
use crate::encode::{le_bits, present, slot_u32, slot_u64, EncodeOptions, Encoder, Source};
use crate::error::BlockError;
use crate::varint;

/// Bytes the buffer keeps in front of the write position beyond every
/// reservation: the most a fixed-width store spills (a 16-byte payload
/// chunk of which at least one byte is the payload's).
const HEADROOM: usize = 16;

/// The write position inside the encoder's buffer; bytes go in front of it.
///
/// Invariant: after `room(n)`, `pos >= n + HEADROOM` until `n` more bytes
/// have been written, so the `put_*` writers (which do not check) never
/// index before the buffer's start.
pub(crate) struct Back {
    pub(crate) buf: Vec<u8>,
    pub(crate) pos: usize,
    max: usize,
}

impl Back {
    pub(crate) fn new(buf: Vec<u8>, max: usize) -> Back {
        let pos = buf.len();
        Back { buf, pos, max }
    }

    /// Bytes written so far.
    #[inline(always)]
    pub(crate) fn written(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Makes room for `n` more bytes (and the headroom) in front of the
    /// write position. `n` is exact: the `max` limit is on real bytes.
    #[inline(always)]
    pub(crate) fn room(&mut self, n: usize) -> Result<(), BlockError> {
        if self.pos < n + HEADROOM {
            self.grow(n)?;
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, n: usize) -> Result<(), BlockError> {
        let used = self.written();
        let need = used.checked_add(n).ok_or(BlockError::TooLarge)?;
        if need > self.max {
            return Err(BlockError::TooLarge);
        }
        let len =
            (need + HEADROOM).max(2 * self.buf.len()).max(256).min(self.max.max(need) + HEADROOM);
        let mut buf = vec![0u8; len];
        buf[len - used..].copy_from_slice(&self.buf[self.pos..]);
        self.buf = buf;
        self.pos = len - used;
        Ok(())
    }

    /// Writes `b` (reserving it).
    #[inline(always)]
    pub(crate) fn bytes(&mut self, b: &[u8]) -> Result<(), BlockError> {
        self.room(b.len())?;
        self.pos -= b.len();
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        Ok(())
    }

    /// A payload of `len` bytes ending at `end` in `base` (reserved). Short
    /// ones go in 16-byte chunks copied from `base` ending at `end`: the
    /// bytes before the payload (still inside `base`) land in the scratch
    /// in front of it. No `memcpy` call for the many short strings.
    #[inline(always)]
    pub(crate) fn put_payload(&mut self, base: &[u8], end: usize, len: usize) {
        let out = self.pos;
        self.pos -= len;
        if len <= 16 && end >= 16 {
            self.buf[out - 16..out].copy_from_slice(&base[end - 16..end]);
        } else if len <= 32 && end >= 32 {
            self.buf[out - 16..out].copy_from_slice(&base[end - 16..end]);
            self.buf[out - 32..out - 16].copy_from_slice(&base[end - 32..end - 16]);
        } else {
            self.buf[out - len..out].copy_from_slice(&base[end - len..end]);
        }
    }

    /// A pre-encoded tag (the low `len` bytes of `bytes`, reserved): one
    /// 8-byte store ending at the write position.
    #[inline(always)]
    pub(crate) fn put_tag(&mut self, bytes: u64, len: u8) {
        let end = self.pos;
        let word = bytes.wrapping_shl(64u32.wrapping_sub(8 * len as u32));
        self.buf[end - 8..end].copy_from_slice(&word.to_le_bytes());
        self.pos = end - len as usize;
    }

    /// `v` as a varint of `n = varint::len(v)` bytes (reserved).
    #[inline(always)]
    pub(crate) fn put_varint(&mut self, v: u64, n: usize) {
        let end = self.pos;
        if n == 1 {
            self.buf[end - 1] = v as u8;
        } else if n <= 8 {
            let more = 0x8080_8080_8080_8080u64 & ((1u64 << (8 * (n - 1))) - 1);
            let word = (spread(v) | more) << (8 * (8 - n));
            self.buf[end - 8..end].copy_from_slice(&word.to_le_bytes());
        } else {
            // Nine or ten bytes (a large or a negative value): the last one
            // or two carry bits 56..64, the first eight are all continued.
            let hi = v >> 56;
            let tail = if n == 9 { hi << 8 } else { (hi & 0x7f) | 0x80 | (hi >> 7) << 8 };
            self.buf[end - 2..end].copy_from_slice(&(tail as u16).to_le_bytes());
            let word = spread(v) | 0x8080_8080_8080_8080;
            self.buf[end - n..end - n + 8].copy_from_slice(&word.to_le_bytes());
        }
        self.pos = end - n;
    }

    /// A varint (reserving it).
    #[inline(always)]
    pub(crate) fn varint(&mut self, v: u64) -> Result<(), BlockError> {
        let n = varint::len(v);
        self.room(n)?;
        self.put_varint(v, n);
        Ok(())
    }

    #[inline(always)]
    pub(crate) fn tag_of(&mut self, number: u32, wt: WireType) -> Result<(), BlockError> {
        self.varint(((number as u64) << 3) | wt as u64)
    }

    /// A tag and a varint value: one reservation.
    #[inline(always)]
    pub(crate) fn varint_field(&mut self, tag: u64, tag_len: u8, v: u64) -> Result<(), BlockError> {
        let n = varint::len(v);
        self.room(n + tag_len as usize)?;
        self.put_varint(v, n);
        self.put_tag(tag, tag_len);
        Ok(())
    }

    /// A tag and a fixed-width little-endian value: one reservation.
    #[inline(always)]
    pub(crate) fn fixed_field<const N: usize>(
        &mut self,
        tag: u64,
        tag_len: u8,
        v: [u8; N],
    ) -> Result<(), BlockError> {
        self.room(N + tag_len as usize)?;
        let end = self.pos;
        self.buf[end - N..end].copy_from_slice(&v);
        self.pos = end - N;
        self.put_tag(tag, tag_len);
        Ok(())
    }

    /// A tag, a length prefix and a payload of `len` bytes ending at `end`
    /// in `base`: one reservation.
    #[inline(always)]
    pub(crate) fn len_field(
        &mut self,
        tag: u64,
        tag_len: u8,
        base: &[u8],
        end: usize,
        len: usize,
    ) -> Result<(), BlockError> {
        let n = varint::len(len as u64);
        self.room(len + n + tag_len as usize)?;
        if len != 0 {
            self.put_payload(base, end, len);
        }
        self.put_varint(len as u64, n);
        self.put_tag(tag, tag_len);
        Ok(())
    }

    /// The length prefix and tag in front of `len` bytes already written.
    #[inline(always)]
    pub(crate) fn len_prefix(
        &mut self,
        tag: u64,
        tag_len: u8,
        len: usize,
    ) -> Result<(), BlockError> {
        self.varint_field(tag, tag_len, len as u64)
    }
    /// A string or bytes field: the payload `r` designates in `src` (its
    /// slot at `at`), its length prefix and the tag, with one reservation.
    #[inline(always)]
    pub(crate) fn string_field(
        &mut self,
        tag: u64,
        tag_len: u8,
        src: Source<'_>,
        r: Ref,
        at: usize,
    ) -> Result<(), BlockError> {
        let data = src.bytes(r, at)?;
        if data.is_empty() {
            return self.len_field(tag, tag_len, data, 0, 0);
        }
        // The payload ends at `end` of the memory it lies in, so that short
        // ones can be copied in whole chunks from there (`put_payload`).
        let base = if r.device {
            src.device
        } else if r.wire {
            src.wire
        } else {
            src.block
        };
        self.len_field(tag, tag_len, base, r.offset as usize + data.len(), data.len())
    }

    /// One scalar element of `kind` from its slot bits (no tag).
    #[inline(always)]
    pub(crate) fn scalar(&mut self, kind: Kind, bits: u64) -> Result<(), BlockError> {
        match kind.wire_type() {
            WireType::Fixed32 => self.bytes(&(bits as u32).to_le_bytes()),
            WireType::Fixed64 => self.bytes(&bits.to_le_bytes()),
            _ => self.varint(match kind {
                Kind::Int32 | Kind::Enum => bits as u32 as i32 as i64 as u64,
                Kind::SInt32 => varint::zigzag32(bits as u32 as i32) as u64,
                Kind::SInt64 => varint::zigzag64(bits as i64),
                Kind::Bool => (bits != 0) as u64,
                _ => bits,
            }),
        }
    }
}

/// The low 56 bits of `v` as eight 7-bit groups, one per byte (byte i of
/// a varint is bits 7i..7i+7 of its value), continuation bits clear.
#[inline(always)]
fn spread(v: u64) -> u64 {
    let mut word = 0u64;
    let mut i = 0;
    while i < 8 {
        word |= (v << i) & (0x7f << (8 * i));
        i += 1;
    }
    word
}

impl Encoder {
    /// Writes the object of type `mi` at `at`, back to front, in front of
    /// `w`'s position (no tag, no length).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn back_object(
        &mut self,
        ts: &TableSet,
        mi: u32,
        at: usize,
        src: Source<'_>,
        opts: &EncodeOptions,
        depth: u32,
        w: &mut Back,
    ) -> Result<(), BlockError> {
        let m = ts.message(mi);
        let obj = src.object(at, m)?;
        self.charge(1, opts)?;
        // Unknown fields follow the known ones on the wire: written first.
        let unknown = Ref::unpack(slot_u64(obj, m.unknown_offset));
        w.bytes(src.array(unknown, 1, at + m.unknown_offset as usize)?)?;
        let ops = ts.ops(m);
        for (i, op) in ops.iter().enumerate().rev() {
            if !present(obj, op) {
                if matches!(op.card, Card::Repeated | Card::Packed) {
                    let r = Ref::unpack(slot_u64(obj, op.offset));
                    if r.len != 0 {
                        self.charge(r.len as usize, opts)?;
                        let f = &ts.fields(m)[i];
                        self.back_repeated(ts, m, f, r, at, src, opts, depth, w)?;
                    }
                }
                continue;
            }
            let implicit = op.card == Card::Implicit;
            let (tag, tl) = (op.tag_bytes, op.tag_len);
            match op.value {
                ValueOp::Int32 | ValueOp::ClosedEnum | ValueOp::UInt32 | ValueOp::SInt32 => {
                    let v = slot_u32(obj, op.offset);
                    if implicit && v == 0 {
                        continue;
                    }
                    let v = match op.value {
                        ValueOp::UInt32 => v as u64,
                        ValueOp::SInt32 => varint::zigzag32(v as i32) as u64,
                        _ => v as i32 as i64 as u64,
                    };
                    w.varint_field(tag, tl, v)?;
                }
                ValueOp::Int64 | ValueOp::SInt64 => {
                    let v = slot_u64(obj, op.offset);
                    if implicit && v == 0 {
                        continue;
                    }
                    let sint = op.value == ValueOp::SInt64;
                    w.varint_field(tag, tl, if sint { varint::zigzag64(v as i64) } else { v })?;
                }
                ValueOp::Bool => {
                    let v = obj.get(op.offset as usize).copied().unwrap_or(0);
                    if implicit && v == 0 {
                        continue;
                    }
                    w.fixed_field(tag, tl, [(v != 0) as u8])?;
                }
                ValueOp::Fixed32 => {
                    let v = slot_u32(obj, op.offset);
                    if implicit && v == 0 {
                        continue;
                    }
                    w.fixed_field(tag, tl, v.to_le_bytes())?;
                }
                ValueOp::Fixed64 => {
                    let v = slot_u64(obj, op.offset);
                    if implicit && v == 0 {
                        continue;
                    }
                    w.fixed_field(tag, tl, v.to_le_bytes())?;
                }
                ValueOp::Bytes | ValueOp::Utf8 => {
                    let r = Ref::unpack(slot_u64(obj, op.offset));
                    if implicit && r.len == 0 {
                        continue;
                    }
                    w.string_field(tag, tl, src, r, at + op.offset as usize)?;
                }
                ValueOp::Message | ValueOp::Group => {
                    let r = Ref::unpack(slot_u64(obj, op.offset));
                    if r.offset == 0 && op.card != Card::Always {
                        continue;
                    }
                    let f = &ts.fields(m)[i];
                    self.back_sub(ts, f, r.offset as usize, src, opts, depth, w)?;
                }
            }
        }
        Ok(())
    }

    /// One sub-message or group occurrence, tag(s) and length included.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn back_sub(
        &mut self,
        ts: &TableSet,
        f: &Field,
        obj: usize,
        src: Source<'_>,
        opts: &EncodeOptions,
        depth: u32,
        w: &mut Back,
    ) -> Result<(), BlockError> {
        if depth >= opts.max_depth {
            return Err(BlockError::TooDeep);
        }
        if f.kind == Kind::Group {
            w.tag_of(f.number, WireType::EndGroup)?;
            if obj != 0 {
                self.back_object(ts, f.sub, obj, src, opts, depth + 1, w)?;
            }
            return w.tag_of(f.number, WireType::StartGroup);
        }
        let before = w.written();
        // A map entry's absent message value (offset 0) encodes as empty.
        if obj != 0 {
            self.back_object(ts, f.sub, obj, src, opts, depth + 1, w)?;
        }
        w.varint((w.written() - before) as u64)?;
        w.tag_of(f.number, WireType::Len)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn back_repeated(
        &mut self,
        ts: &TableSet,
        m: &Message,
        f: &Field,
        r: Ref,
        at: usize,
        src: Source<'_>,
        opts: &EncodeOptions,
        depth: u32,
        w: &mut Back,
    ) -> Result<(), BlockError> {
        let slot_at = at + f.offset as usize;
        if f.kind.is_scalar() {
            let size = f.kind.slot_size() as usize;
            let arr = src.array(r, size, slot_at)?;
            if f.flags.has(FieldFlags::PACKED) {
                let before = w.written();
                match f.kind.wire_type() {
                    // Wire and slot are both little endian: one copy.
                    WireType::Fixed32 | WireType::Fixed64 => w.bytes(arr)?,
                    _ => {
                        for c in arr.chunks_exact(size).rev() {
                            w.scalar(f.kind, le_bits(c))?;
                        }
                    }
                }
                w.varint((w.written() - before) as u64)?;
                return w.tag_of(f.number, WireType::Len);
            }
            let wt = f.kind.wire_type();
            for c in arr.chunks_exact(size).rev() {
                w.scalar(f.kind, le_bits(c))?;
                w.tag_of(f.number, wt)?;
            }
            return Ok(());
        }
        let arr = src.array(r, 8, slot_at)?;
        if f.kind.is_message() {
            if opts.deterministic && f.flags.has(FieldFlags::MAP) {
                let order = self.map_order(ts, m, f, arr, src)?;
                let done = order.iter().rev().try_for_each(|&i| {
                    let e = Ref::unpack(le_bits(&arr[8 * i as usize..8 * i as usize + 8]));
                    self.back_sub(ts, f, e.offset as usize, src, opts, depth, w)
                });
                self.orders.push(order);
                return done;
            }
            for c in arr.chunks_exact(8).rev() {
                let e = Ref::unpack(le_bits(c));
                self.back_sub(ts, f, e.offset as usize, src, opts, depth, w)?;
            }
            return Ok(());
        }
        for c in arr.chunks_exact(8).rev() {
            let e = Ref::unpack(le_bits(c));
            w.bytes(src.bytes(e, slot_at)?)?;
            w.varint(e.len as u64)?;
            w.tag_of(f.number, WireType::Len)?;
        }
        Ok(())
    }
}
