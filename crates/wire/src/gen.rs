//! The runtime of generated decoders and encoders: what `protoplane-codegen`
//! emits per message calls into this module, and nothing else should.
//! Encoders: see [`Enc`].
//!
//! A generated decoder is one function per message type, a loop over tags
//! with one `match` arm per field in its canonical encoding (the tag the
//! encoders write): slot offsets, hasbit words and masks, tags and value
//! conversions are constants in the code, and a sub-message is a direct
//! call of its type's function. That is the code prost, buffa and protobuf
//! C++ generate, minus their per-type structs: it writes the same
//! linearized block the table-driven decoder writes, byte for byte (the
//! tests and a fuzz target compare the two on every input).
//!
//! Everything the arms do not cover goes to [`Dec::field`], which runs the
//! table-driven decoder over that one field of the current object: unknown
//! fields, wire types that differ from the declaration, packed input for an
//! unpacked field (and the reverse), a closed enum's values it does not
//! declare (they become unknown fields; the arms check the declared ones
//! against constants) and its packed runs, and groups. One engine owns
//! protobuf's rare rules; generated code only runs the common ones faster.
//! A map is a repeated sub-message of its entry type, decoded by the
//! entry's generated decoder; an entry that carried unknown fields then
//! leaves the map for the parent's unknown fields ([`Dec::entry_done`]),
//! through the function the table-driven decoder uses for the same rule.
//!
//! Generated decoders write private (heap) blocks. A block that lives in
//! lent memory (a region shared with an engine) is decoded by the
//! table-driven path: same result, no second copy of that machinery.
//!
//! Every primitive below is `#[inline(always)]` and takes the message type
//! and field number only to name them in an error: constants at each call
//! site, free after inlining. Errors are built out of line.

use protoplane_schema::{Kind, TableSet};

use crate::back::Back;
use crate::block::{
    ascii_word, short_word, Block, BlockMem, Ref, Store, BLOCK_VIEW, HEADER_LEN, MAX_LEN,
};
use crate::decode::{
    append_packed, missing_required, move_entry_to_unknown, DecodeOptions, Decoder,
};
use crate::encode::{output_budget, work_budget, EncodeOptions, Encoder, Source};
use crate::error::{BlockError, DecodeError, DecodeErrorKind};
use crate::varint;

/// A generated message decoder: decodes the fields of the object at `obj`
/// from `pos` to `end` and returns where it stopped (`end`).
pub type Fields = fn(&mut Dec<'_>, usize, usize, usize) -> Result<usize, DecodeError>;

/// One generated decode in progress.
#[allow(missing_debug_implementations)] // a cursor over borrowed buffers
pub struct Dec<'a> {
    input: &'a [u8],
    out: &'a mut Vec<u8>,
    ts: &'a TableSet,
    opts: &'a DecodeOptions,
    max_block: usize,
    depth: u32,
    required_seen: bool,
    fallback: &'a mut Decoder,
}

/// Decodes `input` as message `type_index` of `ts` with the generated
/// decoder `fields`, replacing the content of `out` (see the module docs).
///
/// `fields` must be the decoder generated for `type_index` from `ts` (the
/// generated `decode` functions pair them from one generator run): its
/// offsets are constants, and with another type's decoder they point
/// elsewhere, which is a programming error that panics. Nothing in the
/// input can cause that.
pub fn decode_into(
    ts: &TableSet,
    type_index: u32,
    fields: Fields,
    dec: &mut Decoder,
    input: &[u8],
    opts: &DecodeOptions,
    out: &mut Block,
) -> Result<(), DecodeError> {
    let Store::Heap(mem) = out.mem() else {
        return dec.decode_into(ts, type_index, input, opts, out);
    };
    let msg = ts.message(type_index);
    let root = mem.start(type_index, msg.size, if opts.view { BLOCK_VIEW } else { 0 });
    let max_block = opts.max_block.min(u32::MAX as usize);
    let mut d =
        Dec { input, out: mem, ts, opts, max_block, depth: 0, required_seen: false, fallback: dec };
    if input.len() > max_block {
        return Err(d.err(DecodeErrorKind::BlockTooLarge, type_index, 0, 0));
    }
    fields(&mut d, root, 0, input.len())?;
    if d.required_seen && opts.check_required {
        match missing_required(ts, d.out, input, opts) {
            Ok(None) => {}
            Ok(Some((ty, field))) => {
                return Err(d.err(DecodeErrorKind::MissingRequired, ty, field, input.len()))
            }
            Err(()) => {
                return Err(d.err(DecodeErrorKind::DepthExceeded, type_index, 0, input.len()))
            }
        }
    }
    Ok(())
}

/// Decodes `input` into a fresh block (see [`decode_into`]).
pub fn decode(
    ts: &TableSet,
    type_index: u32,
    fields: Fields,
    input: &[u8],
    opts: &DecodeOptions,
) -> Result<Block, DecodeError> {
    let mut block = Block::with_capacity(input.len() + input.len() / 2 + 64);
    decode_into(ts, type_index, fields, &mut Decoder::new(), input, opts, &mut block)?;
    Ok(block)
}

impl Dec<'_> {
    #[cold]
    #[inline(never)]
    pub fn err(&self, kind: DecodeErrorKind, msg: u32, field: u32, at: usize) -> DecodeError {
        DecodeError { kind, message: self.ts.message_name(msg).to_owned(), field, offset: at }
    }

    /// Any field the generated arms do not cover, decoded whole by the
    /// table-driven path; returns the position after it.
    #[inline(never)]
    pub fn field(
        &mut self,
        msg: u32,
        obj: usize,
        start: usize,
        end: usize,
    ) -> Result<usize, DecodeError> {
        let frame = (msg, obj, self.depth as usize);
        let (pos, required) =
            self.fallback.field_at(self.ts, self.input, self.opts, self.out, frame, start, end)?;
        self.required_seen |= required;
        Ok(pos)
    }

    /// After a map entry (object `entry`, type `entry_msg`, element of map
    /// field `index` of the object `obj` of type `msg`): an entry that
    /// carried unknown fields leaves the map for the parent's unknown
    /// fields (as in the table-driven decoder; rare, out of line).
    #[inline(always)]
    pub fn entry_done(
        &mut self,
        (msg, obj, index): (u32, usize, usize),
        (entry_msg, entry): (u32, usize),
        unknown_offset: usize,
        end: usize,
    ) -> Result<(), DecodeError> {
        if Ref::unpack(self.out.u64_at(entry + unknown_offset)).len == 0 {
            return Ok(());
        }
        self.entry_to_unknown((msg, obj, index), (entry_msg, entry), end)
    }

    #[cold]
    #[inline(never)]
    fn entry_to_unknown(
        &mut self,
        (msg, obj, index): (u32, usize, usize),
        entry: (u32, usize),
        end: usize,
    ) -> Result<(), DecodeError> {
        let m = self.ts.message(msg);
        let map = &self.ts.fields(m)[index];
        move_entry_to_unknown(self.ts, self.out, self.input, self.max_block, (m, obj), map, entry)
            .map_err(|kind| self.err(kind, msg, map.number, end))
    }

    /// A message type with `required` fields was finished.
    #[inline(always)]
    pub fn saw_required(&mut self) {
        self.required_seen = true;
    }

    /// Reads a tag (at most five bytes).
    #[inline(always)]
    pub fn tag(&self, pos: &mut usize, end: usize, msg: u32) -> Result<u64, DecodeError> {
        let at = *pos;
        varint::read_short(&self.input[..end], pos).map_err(|e| self.err(e.into(), msg, 0, at))
    }

    /// Reads a varint value: one byte (booleans, most enums, small counts)
    /// inline, any other by the word reader. (The table-driven decoder,
    /// measured, is faster without the extra branch.)
    #[inline(always)]
    pub fn value(
        &self,
        pos: &mut usize,
        end: usize,
        (msg, field, at): (u32, u32, usize),
    ) -> Result<u64, DecodeError> {
        let input = &self.input[..end];
        if let Some(&b) = input.get(*pos) {
            if b < 0x80 {
                *pos += 1;
                return Ok(b as u64);
            }
        }
        varint::read_value(input, pos).map_err(|e| self.err(e.into(), msg, field, at))
    }

    /// Reads a little-endian fixed-width value of `N` bytes (4 or 8).
    #[inline(always)]
    pub fn fixed<const N: usize>(
        &self,
        pos: &mut usize,
        end: usize,
        (msg, field, at): (u32, u32, usize),
    ) -> Result<u64, DecodeError> {
        match self.input[..end].get(*pos..*pos + N) {
            Some(b) => {
                *pos += N;
                let mut w = [0u8; 8];
                w[..N].copy_from_slice(b);
                Ok(u64::from_le_bytes(w))
            }
            None => Err(self.err(DecodeErrorKind::Truncated, msg, field, at)),
        }
    }

    /// Reads a length prefix and checks the payload lies inside `end`.
    #[inline(always)]
    pub fn length(
        &self,
        pos: &mut usize,
        end: usize,
        (msg, field, at): (u32, u32, usize),
    ) -> Result<usize, DecodeError> {
        let len = varint::read_short(&self.input[..end], pos)
            .map_err(|e| self.err(e.into(), msg, field, at))?;
        if len > (end - *pos) as u64 {
            return Err(self.err(DecodeErrorKind::LengthOutOfBounds, msg, field, at));
        }
        Ok(len as usize)
    }

    /// A `string` (`utf8`) or `bytes` value: its packed reference, to the
    /// input (view mode) or to a copy appended to the block.
    #[inline(always)]
    pub fn bytes(
        &mut self,
        pos: &mut usize,
        end: usize,
        utf8: bool,
        site: (u32, u32, usize),
    ) -> Result<u64, DecodeError> {
        let (msg, field, at) = site;
        let len = self.length(pos, end, site)?;
        if len > MAX_LEN {
            return Err(self.err(DecodeErrorKind::TooLong, msg, field, at));
        }
        let start = *pos;
        if let Some(word) = short_word(self.input, start, len) {
            // Checked (and, owned, copied) as one word: no call.
            if utf8 && !ascii_word(word) && !crate::decode::utf8(&self.input[start..start + len]) {
                return Err(self.err(DecodeErrorKind::InvalidUtf8, msg, field, at));
            }
            *pos += len;
            if len == 0 {
                return Ok(0);
            }
            let (offset, wire) = if self.opts.view {
                (start, true)
            } else {
                let copy = self.out.alloc_short(word, len);
                self.check_block(site)?;
                (copy, false)
            };
            return Ok(Ref { offset: offset as u32, len: len as u32, wire, device: false }.pack());
        }
        let data = &self.input[start..start + len];
        if utf8 && !crate::decode::utf8(data) {
            return Err(self.err(DecodeErrorKind::InvalidUtf8, msg, field, at));
        }
        *pos += len;
        if len == 0 {
            return Ok(0);
        }
        if self.opts.view {
            return Ok(
                Ref { offset: start as u32, len: len as u32, wire: true, device: false }.pack()
            );
        }
        let copy = self.out.alloc_copy(data);
        self.check_block(site)?;
        Ok(Ref { offset: copy as u32, len: len as u32, wire: false, device: false }.pack())
    }

    #[inline(always)]
    pub fn put_u8(&mut self, at: usize, v: u8) {
        self.out[at] = v;
    }

    #[inline(always)]
    pub fn put_u32(&mut self, at: usize, v: u32) {
        self.out.put_u32(at, v);
    }

    #[inline(always)]
    pub fn put_u64(&mut self, at: usize, v: u64) {
        self.out.put_u64(at, v);
    }

    /// Sets bits `mask` of the hasbit word at `at`.
    #[inline(always)]
    pub fn set_bits(&mut self, at: usize, mask: u32) {
        let w = self.out.u32_at(at) | mask;
        self.out.put_u32(at, w);
    }

    /// Appends one element of `SIZE` bytes (1, 4 or 8) to the array whose
    /// reference slot is at `slot`.
    #[inline(always)]
    pub fn push<const SIZE: usize>(
        &mut self,
        slot: usize,
        bits: u64,
        site: (u32, u32, usize),
    ) -> Result<(), DecodeError> {
        let at = self.grow(slot, SIZE, 1, site)?;
        self.out.put_scalar(at, SIZE as u32, bits);
        self.check_block(site)
    }

    /// A packed run of a repeated scalar that is not a closed enum.
    #[inline(always)]
    pub fn packed(
        &mut self,
        slot: usize,
        kind: Kind,
        pos: &mut usize,
        end: usize,
        site: (u32, u32, usize),
    ) -> Result<(), DecodeError> {
        let (msg, field, at) = site;
        let len = self.length(pos, end, site)?;
        let payload = &self.input[*pos..*pos + len];
        *pos += len;
        append_packed(self.out, slot, kind, payload)
            .map_err(|kind| self.err(kind, msg, field, at))?;
        self.check_block(site)
    }

    /// Enters a sub-message: one level deeper, within the depth limit.
    /// Pair with [`Dec::leave`].
    #[inline(always)]
    pub fn enter(&mut self, (msg, field, at): (u32, u32, usize)) -> Result<(), DecodeError> {
        if self.depth >= self.opts.max_depth {
            return Err(self.err(DecodeErrorKind::DepthExceeded, msg, field, at));
        }
        self.depth += 1;
        Ok(())
    }

    #[inline(always)]
    pub fn leave(&mut self) {
        self.depth -= 1;
    }

    /// The object of a singular sub-message field with a hasbit: the one
    /// seen before (occurrences merge) or a new zeroed one of `size` bytes.
    #[inline(always)]
    pub fn sub(
        &mut self,
        slot: usize,
        (word, mask): (usize, u32),
        size: u32,
        site: (u32, u32, usize),
    ) -> Result<usize, DecodeError> {
        let current = Ref::unpack(self.out.u64_at(slot));
        if self.out.u32_at(word) & mask != 0 && current.offset != 0 {
            return Ok(current.offset as usize);
        }
        let obj = self.new_object(size);
        self.out.put_u64(slot, obj.1);
        self.set_bits(word, mask);
        self.check_block(site)?;
        Ok(obj.0)
    }

    /// The object of a oneof member sub-message (case word at `case`).
    #[inline(always)]
    pub fn sub_oneof(
        &mut self,
        slot: usize,
        (case, number): (usize, u32),
        size: u32,
        site: (u32, u32, usize),
    ) -> Result<usize, DecodeError> {
        let current = Ref::unpack(self.out.u64_at(slot));
        if self.out.u32_at(case) == number && current.offset != 0 {
            return Ok(current.offset as usize);
        }
        let obj = self.new_object(size);
        self.out.put_u32(case, number);
        self.out.put_u64(slot, obj.1);
        self.check_block(site)?;
        Ok(obj.0)
    }

    /// A new element object of a repeated sub-message field.
    #[inline(always)]
    pub fn sub_push(
        &mut self,
        slot: usize,
        size: u32,
        site: (u32, u32, usize),
    ) -> Result<usize, DecodeError> {
        let obj = self.new_object(size);
        let at = self.grow(slot, 8, 1, site)?;
        self.out.put_u64(at, obj.1);
        self.check_block(site)?;
        Ok(obj.0)
    }

    /// A zeroed object: its offset and its packed reference.
    #[inline(always)]
    fn new_object(&mut self, size: u32) -> (usize, u64) {
        let obj = self.out.alloc_zeroed(size as usize);
        (obj, Ref { offset: obj as u32, len: size, wire: false, device: false }.pack())
    }

    #[inline(always)]
    fn grow(
        &mut self,
        slot: usize,
        elem: usize,
        n: u32,
        (msg, field, at): (u32, u32, usize),
    ) -> Result<usize, DecodeError> {
        match self.out.grow_array(slot, elem, n) {
            Ok(at) => Ok(at),
            Err(()) => Err(self.err(DecodeErrorKind::TooLong, msg, field, at)),
        }
    }

    #[inline(always)]
    fn check_block(&self, (msg, field, at): (u32, u32, usize)) -> Result<(), DecodeError> {
        if self.out.len() > self.max_block {
            return Err(self.err(DecodeErrorKind::BlockTooLarge, msg, field, at));
        }
        Ok(())
    }
}

/// Converts a varint to the bits of a `kind` slot (as the table-driven
/// decoder does).
#[inline(always)]
pub fn bits(kind: Kind, raw: u64) -> u64 {
    crate::decode::varint_bits(kind, raw)
}

/// A generated message encoder: writes the object at `at` (nesting
/// `depth`), back to front, in front of what is already written.
pub type EncodeFields = fn(&mut Enc<'_, '_>, usize, u32) -> Result<(), BlockError>;

/// One generated encode in progress: the table-driven encoder's
/// back-to-front writer (`back.rs`) and work budget, driven by generated
/// code. The encoding is the table-driven encoder's, byte for byte, and so
/// is every error on a forged block (same checks, same order): the tests
/// and the `decode_gen` fuzz target compare the two.
///
/// Generated encoders write singular and repeated fields and maps
/// themselves; maps in deterministic output (sorted by key) and groups go
/// to the table-driven encoder.
#[allow(missing_debug_implementations)] // a cursor over borrowed buffers
pub struct Enc<'s, 'e> {
    enc: &'e mut Encoder,
    w: Back,
    ts: &'s TableSet,
    src: Source<'s>,
    opts: &'s EncodeOptions,
}

/// Encodes the message in `src` (type `type_index` of `ts`) with the
/// generated encoder `fields`, into `enc`'s reused buffer, and returns the
/// bytes (as [`Encoder::encode`] does). As for decoding, `fields` must be
/// the encoder generated for `type_index` from `ts`.
pub fn encode<'e>(
    ts: &TableSet,
    type_index: u32,
    fields: EncodeFields,
    enc: &'e mut Encoder,
    src: Source<'_>,
    opts: &EncodeOptions,
) -> Result<&'e [u8], BlockError> {
    let root = src.root(ts, type_index)?;
    enc.work = 0;
    enc.budget = work_budget(src, opts);
    let w = Back::new(std::mem::take(&mut enc.back), output_budget(src, opts));
    let mut e = Enc { enc, w, ts, src, opts };
    let done = fields(&mut e, root, 0);
    let Enc { enc, w, .. } = e;
    let pos = w.pos;
    enc.back = w.buf;
    done?;
    Ok(&enc.back[pos..])
}

/// The slot bits at `off` of an object (zero outside it: a forged block
/// reads zeros, never panics).
#[inline(always)]
pub fn u64_at(obj: &[u8], off: usize) -> u64 {
    crate::encode::slot_u64(obj, off as u32)
}

#[inline(always)]
pub fn u32_at(obj: &[u8], off: usize) -> u32 {
    crate::encode::slot_u32(obj, off as u32)
}

#[inline(always)]
pub fn u8_at(obj: &[u8], off: usize) -> u8 {
    obj.get(off).copied().unwrap_or(0)
}

/// The object offset of a packed reference.
#[inline(always)]
pub fn ref_offset(raw: u64) -> usize {
    Ref::unpack(raw).offset as usize
}

/// The length (elements, or bytes) of a packed reference.
#[inline(always)]
pub fn ref_len(raw: u64) -> u32 {
    Ref::unpack(raw).len
}

impl<'s> Enc<'s, '_> {
    /// The object of `size` bytes at `at`, bounds-checked once; counts
    /// against the work budget.
    #[inline(always)]
    pub fn object(&mut self, at: usize, size: u32) -> Result<&'s [u8], BlockError> {
        if at < HEADER_LEN {
            return Err(BlockError::OutOfBounds { at });
        }
        let obj = self.src.block.get(at..at + size as usize);
        let obj = obj.ok_or(BlockError::OutOfBounds { at })?;
        self.enc.charge(1, self.opts)?;
        Ok(obj)
    }

    /// The unknown fields of the object at `at` (reference slot at `off`).
    #[inline(always)]
    pub fn unknown(&mut self, obj: &[u8], at: usize, off: usize) -> Result<(), BlockError> {
        let r = Ref::unpack(u64_at(obj, off));
        let bytes = self.src.array(r, 1, at + off)?;
        if bytes.is_empty() {
            // The common case: no call to copy nothing.
            return Ok(());
        }
        self.w.bytes(bytes)
    }

    /// A varint field: its value `v`, then its pre-encoded tag (the low
    /// `tag_len` bytes of `tag`), with one reservation.
    #[inline(always)]
    pub fn varint_field(&mut self, tag: u64, tag_len: u8, v: u64) -> Result<(), BlockError> {
        self.w.varint_field(tag, tag_len, v)
    }

    #[inline(always)]
    pub fn fixed32_field(&mut self, tag: u64, tag_len: u8, v: u32) -> Result<(), BlockError> {
        self.w.fixed_field(tag, tag_len, v.to_le_bytes())
    }

    #[inline(always)]
    pub fn fixed64_field(&mut self, tag: u64, tag_len: u8, v: u64) -> Result<(), BlockError> {
        self.w.fixed_field(tag, tag_len, v.to_le_bytes())
    }

    #[inline(always)]
    pub fn bool_field(&mut self, tag: u64, tag_len: u8, v: u8) -> Result<(), BlockError> {
        self.w.fixed_field(tag, tag_len, [(v != 0) as u8])
    }

    /// A string or bytes field (reference `raw`, its slot at `at`).
    #[inline(always)]
    pub fn string_field(
        &mut self,
        tag: u64,
        tag_len: u8,
        raw: u64,
        at: usize,
    ) -> Result<(), BlockError> {
        self.w.string_field(tag, tag_len, self.src, Ref::unpack(raw), at)
    }

    /// Before a sub-message's content: checks the depth, returns the mark
    /// [`Enc::sub_end`] measures the length from.
    #[inline(always)]
    pub fn sub_start(&mut self, depth: u32) -> Result<usize, BlockError> {
        if depth >= self.opts.max_depth {
            return Err(BlockError::TooDeep);
        }
        Ok(self.w.written())
    }

    /// After a sub-message's content: its length prefix and tag.
    #[inline(always)]
    pub fn sub_end(&mut self, mark: usize, tag: u64, tag_len: u8) -> Result<(), BlockError> {
        self.w.len_prefix(tag, tag_len, self.w.written() - mark)
    }

    /// The references of a repeated sub-message or string field (`raw`, slot
    /// at `at`), counted against the work budget.
    #[inline(always)]
    pub fn elements(&mut self, raw: u64, at: usize) -> Result<&'s [u8], BlockError> {
        let r = Ref::unpack(raw);
        self.enc.charge(r.len as usize, self.opts)?;
        self.src.array(r, 8, at)
    }

    /// The elements of a repeated scalar field of `size`-byte slots
    /// (reference `raw`, slot at `at`), counted against the work budget.
    #[inline(always)]
    pub fn scalars(&mut self, raw: u64, size: usize, at: usize) -> Result<&'s [u8], BlockError> {
        let r = Ref::unpack(raw);
        self.enc.charge(r.len as usize, self.opts)?;
        self.src.array(r, size, at)
    }

    /// Bytes written so far: the mark a packed run's length is measured
    /// from (see [`Enc::sub_end`]).
    #[inline(always)]
    pub fn written(&self) -> usize {
        self.w.written()
    }

    /// A varint with no tag (an element of a packed run).
    #[inline(always)]
    pub fn varint(&mut self, v: u64) -> Result<(), BlockError> {
        self.w.varint(v)
    }

    /// Bytes as they are (a packed run of fixed-width elements).
    #[inline(always)]
    pub fn raw(&mut self, bytes: &[u8]) -> Result<(), BlockError> {
        self.w.bytes(bytes)
    }

    /// Whether map entries are to be sorted by key (then the tables encode
    /// maps: see [`Enc::repeated`]).
    #[inline(always)]
    pub fn deterministic(&self) -> bool {
        self.opts.deterministic
    }

    /// Repeated field `index` of message `msg` (object at `at`), or a map,
    /// by the table-driven encoder.
    #[inline(never)]
    pub fn repeated(
        &mut self,
        msg: u32,
        index: usize,
        raw: u64,
        at: usize,
        depth: u32,
    ) -> Result<(), BlockError> {
        let r = Ref::unpack(raw);
        self.enc.charge(r.len as usize, self.opts)?;
        let m = self.ts.message(msg);
        let f = &self.ts.fields(m)[index];
        self.enc.back_repeated(self.ts, m, f, r, at, self.src, self.opts, depth, &mut self.w)
    }

    /// Singular group field `index` of message `msg` (its object at `sub`),
    /// by the table-driven encoder.
    #[inline(never)]
    pub fn group(
        &mut self,
        msg: u32,
        index: usize,
        sub: usize,
        depth: u32,
    ) -> Result<(), BlockError> {
        let f = &self.ts.fields(self.ts.message(msg))[index];
        self.enc.back_sub(self.ts, f, sub, self.src, self.opts, depth, &mut self.w)
    }
}
