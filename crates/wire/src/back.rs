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

use protoplane_schema::{Card, Field, FieldFlags, Kind, Message, TableSet, ValueOp, WireType};

use crate::block::Ref;
use crate::encode::{le_bits, present, slot_u32, slot_u64, EncodeOptions, Encoder, Source};
use crate::error::BlockError;
use crate::varint;

/// The write position inside the encoder's buffer; bytes go in front of it.
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

    /// Makes room for `n` more bytes in front of the write position.
    #[inline(always)]
    fn room(&mut self, n: usize) -> Result<(), BlockError> {
        if self.pos < n {
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
        let len = need.max(2 * self.buf.len()).max(256).min(self.max.max(need));
        let mut buf = vec![0u8; len];
        buf[len - used..].copy_from_slice(&self.buf[self.pos..]);
        self.buf = buf;
        self.pos = len - used;
        Ok(())
    }

    #[inline(always)]
    fn bytes(&mut self, b: &[u8]) -> Result<(), BlockError> {
        self.room(b.len())?;
        self.pos -= b.len();
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        Ok(())
    }

    #[inline(always)]
    fn varint(&mut self, mut v: u64) -> Result<(), BlockError> {
        if v < 0x80 {
            self.room(1)?;
            self.pos -= 1;
            self.buf[self.pos] = v as u8;
            return Ok(());
        }
        let n = varint::len(v);
        self.room(n)?;
        self.pos -= n;
        let out = &mut self.buf[self.pos..self.pos + n];
        let (last, head) = out.split_last_mut().ok_or(BlockError::TooLarge)?;
        for b in head {
            *b = v as u8 | 0x80;
            v >>= 7;
        }
        *last = v as u8;
        Ok(())
    }

    /// A pre-encoded tag (the low `len` bytes of `bytes`).
    #[inline(always)]
    fn tag(&mut self, bytes: u64, len: u8) -> Result<(), BlockError> {
        let len = len as usize;
        self.room(len)?;
        self.pos -= len;
        self.buf[self.pos..self.pos + len].copy_from_slice(&bytes.to_le_bytes()[..len]);
        Ok(())
    }

    #[inline(always)]
    fn tag_of(&mut self, number: u32, wt: WireType) -> Result<(), BlockError> {
        self.varint(((number as u64) << 3) | wt as u64)
    }

    /// One scalar element of `kind` from its slot bits (no tag).
    #[inline(always)]
    fn scalar(&mut self, kind: Kind, bits: u64) -> Result<(), BlockError> {
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
            match op.value {
                ValueOp::Int32 | ValueOp::ClosedEnum | ValueOp::UInt32 | ValueOp::SInt32 => {
                    let v = slot_u32(obj, op.offset);
                    if implicit && v == 0 {
                        continue;
                    }
                    w.varint(match op.value {
                        ValueOp::UInt32 => v as u64,
                        ValueOp::SInt32 => varint::zigzag32(v as i32) as u64,
                        _ => v as i32 as i64 as u64,
                    })?;
                }
                ValueOp::Int64 | ValueOp::SInt64 => {
                    let v = slot_u64(obj, op.offset);
                    if implicit && v == 0 {
                        continue;
                    }
                    w.varint(if op.value == ValueOp::SInt64 {
                        varint::zigzag64(v as i64)
                    } else {
                        v
                    })?;
                }
                ValueOp::Bool => {
                    let v = obj.get(op.offset as usize).copied().unwrap_or(0);
                    if implicit && v == 0 {
                        continue;
                    }
                    w.bytes(&[(v != 0) as u8])?;
                }
                ValueOp::Fixed32 => {
                    let v = slot_u32(obj, op.offset);
                    if implicit && v == 0 {
                        continue;
                    }
                    w.bytes(&v.to_le_bytes())?;
                }
                ValueOp::Fixed64 => {
                    let v = slot_u64(obj, op.offset);
                    if implicit && v == 0 {
                        continue;
                    }
                    w.bytes(&v.to_le_bytes())?;
                }
                ValueOp::Bytes | ValueOp::Utf8 => {
                    let r = Ref::unpack(slot_u64(obj, op.offset));
                    if implicit && r.len == 0 {
                        continue;
                    }
                    w.bytes(src.bytes(r, at + op.offset as usize)?)?;
                    w.varint(r.len as u64)?;
                }
                ValueOp::Message | ValueOp::Group => {
                    let r = Ref::unpack(slot_u64(obj, op.offset));
                    if r.offset == 0 && op.card != Card::Always {
                        continue;
                    }
                    let f = &ts.fields(m)[i];
                    self.back_sub(ts, f, r.offset as usize, src, opts, depth, w)?;
                    continue; // back_sub wrote the tag
                }
            }
            w.tag(op.tag_bytes, op.tag_len)?;
        }
        Ok(())
    }

    /// One sub-message or group occurrence, tag(s) and length included.
    #[allow(clippy::too_many_arguments)]
    fn back_sub(
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
    fn back_repeated(
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
