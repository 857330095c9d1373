//! Table-driven decode: wire bytes + schema table -> one linearized block.
//!
//! Heads up! Read the protobuf encoding guide before changing this; every
//! rule it states about parsing is implemented here and named below.
//!
//! The decoder is one loop over tags with an explicit, bounded stack of
//! parent frames (ProtoAcc's metadata stack): sub-messages and groups push
//! a frame, reaching the end of a length-delimited message or its end-group
//! tag pops it. No recursion, so the depth limit is the only bound on
//! nesting and it cannot overflow the thread's stack.
//!
//! Semantics (protobuf's, as protobuf C++ and upb implement them):
//! * singular scalars: the last occurrence wins;
//! * singular messages: occurrences merge into one object;
//! * repeated scalars: packed and unpacked input are both accepted, in any mix;
//! * oneofs: the last member seen wins (a message member seen twice merges);
//! * a field whose wire type does not match its declaration, an unknown
//!   field number and (proto2) an enum value the closed enum does not declare
//!   are kept as unknown fields, byte for byte, in arrival order;
//! * proto3 `string` must be valid UTF-8; proto2 `required` must be present
//!   (unless [`DecodeOptions::check_required`] is off).
//!
//! Allocation: the block grows by appending (objects zeroed, strings
//! copied, arrays doubled, see `block.rs`); no allocation per field, and
//! none at all once a reused block and decoder have warmed up. Memory is
//! bounded by the input: nothing is reserved from a declared length before
//! the bytes it declares are known to be present.

use protoplane_schema::{
    Card, Field, FieldFlags, FieldOp, Kind, Message, MessageFlags, TableSet, ValueOp, WireType,
};

use crate::block::{short_word, Block, BlockMem, Ref, Store, BLOCK_VIEW, MAX_LEN};
use crate::count::{Counting, WriteStats};
use crate::encode::{EncodeOptions, Encoder, Source};
use crate::error::{DecodeError, DecodeErrorKind};
use crate::varint::{self, VarintError};
use crate::view::MessageView;

/// Knobs of a decode.
#[derive(Clone, Copy, Debug)]
pub struct DecodeOptions {
    /// Maximum nesting of sub-messages and groups below the root (protobuf's
    /// default recursion limit: 100).
    pub max_depth: u32,
    /// Maximum block size in bytes (at most `u32::MAX`: offsets are 32-bit).
    pub max_block: usize,
    /// Zero-copy: strings and bytes reference the input instead of being
    /// copied. The input must then outlive every read of the block.
    pub view: bool,
    /// Fail when a proto2 `required` field is missing.
    pub check_required: bool,
    /// Where the `device` buffer of a placed decode
    /// ([`Decoder::decode_placed`]) starts in the device region: device
    /// references are written as `device_base` + their position in the
    /// buffer, so the buffer can be copied into an allocation at that
    /// offset and the block's handles name region offsets directly.
    pub device_base: u32,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            max_depth: 100,
            max_block: u32::MAX as usize,
            view: false,
            check_required: true,
            device_base: 0,
        }
    }
}

impl DecodeOptions {
    /// Default options in view (zero-copy) mode.
    pub fn view() -> Self {
        DecodeOptions { view: true, ..Self::default() }
    }
}

#[derive(Clone, Copy, Debug)]
struct Frame {
    end: usize,
    obj: usize,
    msg: u32,
    group: u32,
    /// The parent's predicted next field (see `Run::next`).
    next: u32,
}

/// Reusable decoder state (the parent-frame stack). Keep one per thread.
#[derive(Debug, Default)]
pub struct Decoder {
    stack: Vec<Frame>,
    groups: Vec<u32>,
}

/// Decodes `input` as message `type_index` into a fresh block.
pub fn decode(
    tables: &TableSet,
    type_index: u32,
    input: &[u8],
    opts: &DecodeOptions,
) -> Result<Block, DecodeError> {
    let mut block = Block::with_capacity(input.len() + input.len() / 2 + 64);
    Decoder::default().decode_into(tables, type_index, input, opts, &mut block)?;
    Ok(block)
}

/// The table of message `type_index`, or the decode error naming it.
fn message_of(tables: &TableSet, type_index: u32) -> Result<&Message, DecodeError> {
    tables.messages().get(type_index as usize).ok_or_else(|| DecodeError {
        kind: DecodeErrorKind::UnknownType,
        message: format!("#{type_index}"),
        field: 0,
        offset: 0,
    })
}

impl Decoder {
    /// A decoder with empty scratch space.
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Decodes `input` as message `type_index`, replacing the content of
    /// `out`. On error the content of `out` is unspecified (but bounded).
    pub fn decode_into(
        &mut self,
        tables: &TableSet,
        type_index: u32,
        input: &[u8],
        opts: &DecodeOptions,
        out: &mut Block,
    ) -> Result<(), DecodeError> {
        let msg = message_of(tables, type_index)?;
        // One decoder per kind of memory: private memory (the common case)
        // runs exactly the code it always did.
        match out.mem() {
            Store::Heap(v) => self.run(tables, type_index, msg, input, opts, v, None),
            Store::Any(m) => self.run(tables, type_index, msg, input, opts, m, None),
        }
    }

    /// Target-aware decode (RPCAcc's placement): like [`Decoder::decode_into`],
    /// but every `string` / `bytes` field whose placement bit says
    /// [`Placement::Device`](protoplane_schema::Placement) is appended to
    /// `device` (the engine-private device region) instead of the block;
    /// the block holds a reference with the device flag whose offset is
    /// `opts.device_base` plus the value's position in `device`. The other
    /// fields decode as usual. `device` is appended to,
    /// never cleared, so several messages can share one region; the decode
    /// fails if it would pass `opts.max_block` bytes (offsets are 32-bit).
    pub fn decode_placed(
        &mut self,
        tables: &TableSet,
        type_index: u32,
        input: &[u8],
        opts: &DecodeOptions,
        out: &mut Block,
        device: &mut Vec<u8>,
    ) -> Result<(), DecodeError> {
        let msg = message_of(tables, type_index)?;
        match out.mem() {
            Store::Heap(v) => self.run(tables, type_index, msg, input, opts, v, Some(device)),
            Store::Any(m) => self.run(tables, type_index, msg, input, opts, m, Some(device)),
        }
    }

    /// Decodes like [`Decoder::decode_into`] (or, with `device`, like
    /// [`Decoder::decode_placed`]) into private memory and counts every
    /// store the decoder makes into the block: what a decoder writing each
    /// field straight into host memory would issue as separate
    /// transactions (RPCAcc's field-by-field baseline). The block is the
    /// same as the plain decode's. With `bulk = Some((min, ranges))`, the
    /// (offset, length) of every copy of at least `min` bytes (a long
    /// string or bytes value) is appended to `ranges`: the parts of the
    /// block a one-shot commit moves on their own.
    #[allow(clippy::too_many_arguments)] // a decode's inputs and two outputs
    pub fn decode_counted(
        &mut self,
        tables: &TableSet,
        type_index: u32,
        input: &[u8],
        opts: &DecodeOptions,
        out: &mut Vec<u8>,
        device: Option<&mut Vec<u8>>,
        bulk: Option<(usize, &mut Vec<(usize, usize)>)>,
    ) -> Result<WriteStats, DecodeError> {
        let msg = message_of(tables, type_index)?;
        let (bulk_min, bulk) = match bulk {
            Some((min, ranges)) => (min, Some(ranges)),
            None => (usize::MAX, None),
        };
        let mut mem = Counting { inner: out, stats: WriteStats::default(), bulk_min, bulk };
        self.run(tables, type_index, msg, input, opts, &mut mem, device)?;
        Ok(mem.stats)
    }

    #[allow(clippy::too_many_arguments)] // one decode's inputs, passed flat
    fn run<M: BlockMem>(
        &mut self,
        tables: &TableSet,
        type_index: u32,
        msg: &Message,
        input: &[u8],
        opts: &DecodeOptions,
        out: &mut M,
        device: Option<&mut Vec<u8>>,
    ) -> Result<(), DecodeError> {
        let root = out.start(type_index, msg.size, if opts.view { BLOCK_VIEW } else { 0 });
        let mut run = self.frame(tables, input, opts, out, (type_index, root, 0), (0, input.len()));
        run.device = device;
        if input.len() > run.max_block {
            return Err(run.err(DecodeErrorKind::BlockTooLarge, 0));
        }
        run.run()
    }

    /// Decodes the one field whose tag starts at `pos` of object `obj` (of
    /// type `msg_index`, ending at `end`) into a private block, all of it,
    /// at nesting `depth`: how generated code hands over what it has no
    /// arm for. Returns the position after the field and whether a message
    /// type with `required` fields was finished inside it.
    #[allow(clippy::too_many_arguments)] // one frame's state, passed flat
    pub(crate) fn field_at(
        &mut self,
        tables: &TableSet,
        input: &[u8],
        opts: &DecodeOptions,
        out: &mut Vec<u8>,
        frame: (u32, usize, usize),
        pos: usize,
        end: usize,
    ) -> Result<(usize, bool), DecodeError> {
        let mut run = self.frame(tables, input, opts, out, frame, (pos, end));
        run.one_field()?;
        Ok((run.pos, run.required_seen))
    }

    /// A decode starting at `pos..end` of object `obj` of type `msg_index`,
    /// at nesting `depth`, with this decoder's (cleared) stacks.
    fn frame<'a, M: BlockMem>(
        &'a mut self,
        tables: &'a TableSet,
        input: &'a [u8],
        opts: &'a DecodeOptions,
        out: &'a mut M,
        (msg_index, obj, depth): (u32, usize, usize),
        (pos, end): (usize, usize),
    ) -> Run<'a, M> {
        self.stack.clear();
        self.groups.clear();
        let msg = tables.message(msg_index);
        Run {
            ts: tables,
            input,
            opts,
            max_block: opts.max_block.min(u32::MAX as usize),
            out,
            stack: &mut self.stack,
            groups: &mut self.groups,
            pos,
            end,
            obj,
            msg_index,
            msg,
            fields: tables.fields(msg),
            ops: tables.ops(msg),
            next: 0,
            group: 0,
            field: 0,
            required_seen: false,
            depth0: depth,
            device: None,
        }
    }
}

/// One decode in progress: the current frame lives in registers, parents on
/// the stack.
struct Run<'a, M: BlockMem> {
    ts: &'a TableSet,
    input: &'a [u8],
    opts: &'a DecodeOptions,
    max_block: usize,
    out: &'a mut M,
    stack: &'a mut Vec<Frame>,
    groups: &'a mut Vec<u32>,
    pos: usize,
    end: usize,
    obj: usize,
    msg_index: u32,
    msg: &'a Message,
    /// `msg`'s fields and their hot-path ops.
    fields: &'a [Field],
    ops: &'a [FieldOp],
    /// Index of the field expected next: fields usually arrive in number
    /// order (the encoders write them so), and a repeated field's elements
    /// in a row. Checking this one op's tag first takes the table lookup off
    /// the critical path of most fields (upb's fast table and ProtoAcc both
    /// exploit the same order).
    next: usize,
    group: u32,
    /// Field being decoded (for error reports).
    field: u32,
    /// A message type with `required` fields was decoded somewhere.
    required_seen: bool,
    /// Nesting of the first frame (0 unless generated code called in).
    depth0: usize,
    /// Target-aware decode (RPCAcc): where device-placed `string` / `bytes`
    /// fields go instead of the block. `None` decodes every field into the
    /// block, whatever its placement bit says.
    device: Option<&'a mut Vec<u8>>,
}

const VARINT: u32 = WireType::Varint as u32;
const FIXED64: u32 = WireType::Fixed64 as u32;
const LEN: u32 = WireType::Len as u32;
const START_GROUP: u32 = WireType::StartGroup as u32;
const END_GROUP: u32 = WireType::EndGroup as u32;
const FIXED32: u32 = WireType::Fixed32 as u32;

impl<'a, M: BlockMem> Run<'a, M> {
    #[cold]
    fn err(&self, kind: DecodeErrorKind, offset: usize) -> DecodeError {
        DecodeError {
            kind,
            message: self.ts.message_name(self.msg_index).to_owned(),
            field: self.field,
            offset,
        }
    }

    fn run(&mut self) -> Result<(), DecodeError> {
        loop {
            if self.pos >= self.end {
                if self.group != 0 {
                    self.field = self.group;
                    return Err(self.err(DecodeErrorKind::UnterminatedGroup, self.pos));
                }
                if !self.pop()? {
                    if self.required_seen && self.opts.check_required {
                        self.check_required()?;
                    }
                    return Ok(());
                }
                continue;
            }
            self.step()?;
        }
    }

    /// Decodes the one field at `pos` of the current object, all of it: a
    /// sub-message or group it opens is decoded to its end (the entry of
    /// generated code into the table-driven path, see `gen.rs`).
    fn one_field(&mut self) -> Result<(), DecodeError> {
        self.step()?;
        while !self.stack.is_empty() {
            if self.pos >= self.end {
                if self.group != 0 {
                    self.field = self.group;
                    return Err(self.err(DecodeErrorKind::UnterminatedGroup, self.pos));
                }
                self.pop()?;
                continue;
            }
            self.step()?;
        }
        Ok(())
    }

    /// One tag and its value (a sub-message or group: just its opening).
    #[inline(always)]
    fn step(&mut self) -> Result<(), DecodeError> {
        let start = self.pos;
        self.field = 0;
        let tag = self.short(start)?;
        // Fast path: a known field in its canonical encoding (the tag
        // the encoder writes), one `match` on the precomputed op.
        // Everything else (field 0, end-group, unknown numbers, wire
        // types that differ from the declaration, packed/unpacked
        // mismatches, closed enums) takes the general path below.
        let number = (tag >> 3) as u32;
        let ts = self.ts;
        let predicted = self.ops.get(self.next).filter(|op| tag == op.tag as u64);
        let slot = match predicted {
            Some(_) => Some(self.next),
            None => ts.field_slot(self.msg, number),
        };
        if let Some(i) = slot {
            if let Some(op) = self.ops.get(i) {
                if tag == op.tag as u64 && op.value != ValueOp::ClosedEnum {
                    self.field = number;
                    let repeated = matches!(op.card, Card::Repeated | Card::Packed);
                    self.next = if repeated { i } else { i + 1 };
                    return self.fast(op, i, start);
                }
            }
        }
        if tag > u32::MAX as u64 {
            return Err(self.err(DecodeErrorKind::TagTooLarge, start));
        }
        let wt = (tag & 7) as u32;
        self.field = number;
        if number == 0 {
            return Err(self.err(DecodeErrorKind::FieldNumberZero, start));
        }
        if wt == END_GROUP {
            if self.group != number {
                return Err(self.err(DecodeErrorKind::UnmatchedEndGroup, start));
            }
            self.group = 0; // closed: pop() must not see it as open
            self.pop()?;
            return Ok(());
        }
        match ts.field_by_number(self.msg, number) {
            Some(f) => self.known(f, wt, start),
            None => self.unknown(wt, start),
        }
    }

    /// One field in its canonical encoding (`op.tag` matched).
    #[inline(always)]
    fn fast(&mut self, op: &FieldOp, index: usize, start: usize) -> Result<(), DecodeError> {
        if op.card == Card::Packed {
            // The canonical tag of a packed field is the length-delimited one.
            let f = &self.fields[index];
            return self.packed(f, start);
        }
        let bits = match op.value {
            ValueOp::Int32 | ValueOp::UInt32 => self.value(start)? as u32 as u64,
            ValueOp::Int64 => self.value(start)?,
            ValueOp::SInt32 => varint::unzigzag32(self.value(start)? as u32) as u32 as u64,
            ValueOp::SInt64 => varint::unzigzag64(self.value(start)?) as u64,
            ValueOp::Bool => (self.value(start)? != 0) as u64,
            ValueOp::Fixed32 => u32::from_le_bytes(self.fixed::<4>(start)?) as u64,
            ValueOp::Fixed64 => u64::from_le_bytes(self.fixed::<8>(start)?),
            ValueOp::Bytes | ValueOp::Utf8 => return self.bytes_op(op, index, start),
            ValueOp::Message => {
                let len = self.length(start)?;
                let f = &self.fields[index];
                return self.enter(f, self.pos + len, 0, start);
            }
            ValueOp::Group => {
                let f = &self.fields[index];
                return self.enter(f, self.end, f.number, start);
            }
            ValueOp::ClosedEnum => {
                let f = &self.fields[index];
                return self.known(f, VARINT, start);
            }
        };
        let obj = self.obj;
        match op.card {
            Card::Hasbit | Card::Implicit | Card::Always => {
                self.out.put_scalar(obj + op.offset as usize, op.size as u32, bits);
                self.out.set_hasbit(obj, op.presence);
                Ok(())
            }
            Card::Oneof => {
                self.out.put_u32(obj + op.presence as usize, self.field);
                self.out.put_u64(obj + op.offset as usize, bits);
                Ok(())
            }
            Card::Repeated | Card::Packed => {
                let size = op.size as usize;
                let at = self
                    .out
                    .grow_array(obj + op.offset as usize, size, 1)
                    .map_err(|()| self.err(DecodeErrorKind::TooLong, start))?;
                self.out.put_scalar(at, size as u32, bits);
                self.check_block(start)
            }
        }
    }

    /// A `string` or `bytes` occurrence, fast path.
    #[inline(always)]
    fn bytes_op(&mut self, op: &FieldOp, index: usize, start: usize) -> Result<(), DecodeError> {
        let len = self.length(start)?;
        if len > MAX_LEN {
            return Err(self.err(DecodeErrorKind::TooLong, start));
        }
        let data = &self.input[self.pos..self.pos + len];
        if op.value == ValueOp::Utf8 && !utf8(data) {
            return Err(self.err(DecodeErrorKind::InvalidUtf8, start));
        }
        let r = if len == 0 {
            0
        } else if self.device.is_some() && self.fields[index].flags.has(FieldFlags::DEVICE) {
            self.place_on_device(len, start)?.pack()
        } else if self.opts.view {
            Ref { offset: self.pos as u32, len: len as u32, wire: true, device: false }.pack()
        } else {
            // A short string is copied as one word (see `short_word`).
            let at = match short_word(self.input, self.pos, len) {
                Some(word) => self.out.alloc_short(word, len),
                None => self.out.alloc_copy(data),
            };
            self.check_block(start)?;
            Ref { offset: at as u32, len: len as u32, wire: false, device: false }.pack()
        };
        self.pos += len;
        let (obj, slot) = (self.obj, self.obj + op.offset as usize);
        match op.card {
            Card::Hasbit | Card::Implicit | Card::Always => {
                self.out.set_hasbit(obj, op.presence);
                self.out.put_u64(slot, r);
                Ok(())
            }
            Card::Oneof => {
                self.out.put_u32(obj + op.presence as usize, self.field);
                self.out.put_u64(slot, r);
                Ok(())
            }
            Card::Repeated | Card::Packed => {
                let at = self
                    .out
                    .grow_array(slot, 8, 1)
                    .map_err(|()| self.err(DecodeErrorKind::TooLong, start))?;
                self.out.put_u64(at, r);
                self.check_block(start)
            }
        }
    }

    /// Finishes the current message and restores its parent; `false` at the root.
    #[inline]
    fn pop(&mut self) -> Result<bool, DecodeError> {
        if self.msg.flags.has(MessageFlags::HAS_REQUIRED) {
            self.required_seen = true;
        }
        if self.msg.flags.has(MessageFlags::MAP_ENTRY)
            && Ref::unpack(self.out.u64_at(self.obj + self.msg.unknown_offset as usize)).len != 0
            && !self.stack.is_empty()
        {
            return self.entry_to_unknown();
        }
        let Some(f) = self.stack.pop() else { return Ok(false) };
        self.restore(f);
        Ok(true)
    }

    /// Makes a parent frame current again.
    #[inline(always)]
    fn restore(&mut self, f: Frame) {
        self.end = f.end;
        self.obj = f.obj;
        self.msg_index = f.msg;
        self.msg = self.ts.message(f.msg);
        self.fields = self.ts.fields(self.msg);
        self.ops = self.ts.ops(self.msg);
        self.group = f.group;
        self.next = f.next as usize;
    }

    /// A map entry with unknown fields (an unknown closed-enum value among
    /// them) is not a map element: like upb, move it, re-encoded, into the
    /// parent's unknown fields.
    #[cold]
    fn entry_to_unknown(&mut self) -> Result<bool, DecodeError> {
        let entry = (self.msg_index, self.obj);
        let Some(f) = self.stack.pop() else { return Ok(false) };
        self.restore(f);
        let ts = self.ts;
        let Some(map) = ts
            .fields(self.msg)
            .iter()
            .find(|pf| pf.flags.has(FieldFlags::MAP) && pf.sub == entry.0)
        else {
            return Ok(true);
        };
        let parent = (self.msg, self.obj);
        move_entry_to_unknown(ts, self.out, self.input, self.max_block, parent, map, entry)
            .map_err(|kind| {
                self.field = map.number;
                self.err(kind, self.pos)
            })?;
        Ok(true)
    }

    /// Required fields are checked on the finished message, not per
    /// occurrence: a sub-message split across several occurrences merges
    /// first (protobuf semantics), so only the merged result can miss one.
    #[cold]
    fn check_required(&mut self) -> Result<(), DecodeError> {
        let missing = missing_required(self.ts, self.out.bytes(), self.input, self.opts)
            .map_err(|()| self.err(DecodeErrorKind::DepthExceeded, self.pos))?;
        if let Some((ty, field)) = missing {
            self.msg_index = ty;
            self.field = field;
            return Err(self.err(DecodeErrorKind::MissingRequired, self.input.len()));
        }
        Ok(())
    }

    /// Reads a varint value inside the current message.
    #[inline(always)]
    fn varint(&mut self, at: usize) -> Result<u64, DecodeError> {
        varint::read(&self.input[..self.end], &mut self.pos).map_err(|e| self.err(e.into(), at))
    }

    /// Reads a tag or a length prefix: at most five bytes.
    #[inline(always)]
    fn short(&mut self, at: usize) -> Result<u64, DecodeError> {
        varint::read_short(&self.input[..self.end], &mut self.pos)
            .map_err(|e| self.err(e.into(), at))
    }

    /// Reads a varint value (not a tag): see [`varint::read_value`].
    #[inline(always)]
    fn value(&mut self, at: usize) -> Result<u64, DecodeError> {
        varint::read_value(&self.input[..self.end], &mut self.pos)
            .map_err(|e| self.err(e.into(), at))
    }

    #[inline(always)]
    fn fixed<const N: usize>(&mut self, at: usize) -> Result<[u8; N], DecodeError> {
        match self.input[..self.end].get(self.pos..self.pos + N) {
            Some(b) => {
                self.pos += N;
                let mut a = [0u8; N];
                a.copy_from_slice(b);
                Ok(a)
            }
            None => Err(self.err(DecodeErrorKind::Truncated, at)),
        }
    }

    /// Reads a length prefix and checks the payload is inside the message.
    #[inline(always)]
    fn length(&mut self, at: usize) -> Result<usize, DecodeError> {
        let len = self.short(at)?;
        if len > (self.end - self.pos) as u64 {
            return Err(self.err(DecodeErrorKind::LengthOutOfBounds, at));
        }
        Ok(len as usize)
    }

    #[inline(always)]
    fn check_block(&self, at: usize) -> Result<(), DecodeError> {
        if self.out.len() > self.max_block {
            return Err(self.err(DecodeErrorKind::BlockTooLarge, at));
        }
        Ok(())
    }

    #[inline(always)]
    fn known(&mut self, f: &'a Field, wt: u32, start: usize) -> Result<(), DecodeError> {
        let expected = f.kind.wire_type() as u32;
        if wt == expected {
            match wt {
                VARINT => {
                    let raw = self.varint(start)?;
                    let bits = varint_bits(f.kind, raw);
                    if f.flags.has(FieldFlags::CLOSED_ENUM)
                        && !self.ts.enum_contains(self.ts.enum_type(f.sub), bits as u32 as i32)
                    {
                        return self.keep_unknown(start);
                    }
                    self.scalar(f, bits, start)
                }
                FIXED64 => {
                    let v = u64::from_le_bytes(self.fixed::<8>(start)?);
                    self.scalar(f, v, start)
                }
                FIXED32 => {
                    let v = u32::from_le_bytes(self.fixed::<4>(start)?);
                    self.scalar(f, v as u64, start)
                }
                LEN => {
                    if f.kind.is_message() {
                        let len = self.length(start)?;
                        self.enter(f, self.pos + len, 0, start)
                    } else {
                        self.bytes(f, start)
                    }
                }
                _ => self.enter(f, self.end, f.number, start), // START_GROUP
            }
        } else if wt == LEN && f.is_repeated() && f.kind.is_scalar() {
            // Packed input is accepted whether or not the field is declared packed.
            self.packed(f, start)
        } else {
            // Wire type does not match the declaration: protobuf keeps it as unknown.
            self.unknown(wt, start)
        }
    }

    /// Stores one scalar (already converted to slot bits).
    #[inline(always)]
    fn scalar(&mut self, f: &Field, bits: u64, start: usize) -> Result<(), DecodeError> {
        let size = f.kind.slot_size();
        if f.is_repeated() {
            let at = self
                .out
                .grow_array(self.obj + f.offset as usize, size as usize, 1)
                .map_err(|()| self.err(DecodeErrorKind::TooLong, start))?;
            self.out.put_scalar(at, size, bits);
            return self.check_block(start);
        }
        if f.flags.has(FieldFlags::ONEOF) {
            let case = self.ts.oneofs(self.msg)[f.presence as usize].case_offset;
            self.out.put_u32(self.obj + case as usize, f.number);
            self.out.put_u64(self.obj + f.offset as usize, bits);
        } else {
            self.out.put_scalar(self.obj + f.offset as usize, size, bits);
            self.out.set_hasbit(self.obj, f.presence);
        }
        Ok(())
    }

    /// A `string` or `bytes` occurrence.
    fn bytes(&mut self, f: &Field, start: usize) -> Result<(), DecodeError> {
        let len = self.length(start)?;
        if len > MAX_LEN {
            return Err(self.err(DecodeErrorKind::TooLong, start));
        }
        let data = &self.input[self.pos..self.pos + len];
        if f.flags.has(FieldFlags::UTF8) && !utf8(data) {
            return Err(self.err(DecodeErrorKind::InvalidUtf8, start));
        }
        let r = if len == 0 {
            Ref::default()
        } else if self.device.is_some() && f.flags.has(FieldFlags::DEVICE) {
            self.place_on_device(len, start)?
        } else if self.opts.view {
            Ref { offset: self.pos as u32, len: len as u32, wire: true, device: false }
        } else {
            let at = self.out.alloc_copy(data);
            self.check_block(start)?;
            Ref { offset: at as u32, len: len as u32, wire: false, device: false }
        };
        self.pos += len;
        self.store_ref(f, r, start)
    }

    /// Appends the `len` bytes at `pos` to the device region: the
    /// reference the block gets instead of the bytes.
    #[cold]
    fn place_on_device(&mut self, len: usize, start: usize) -> Result<Ref, DecodeError> {
        let (pos, max) = (self.pos, self.max_block);
        let Some(dev) = self.device.as_deref_mut() else {
            return Err(self.err(DecodeErrorKind::BlockTooLarge, start));
        };
        let at = dev.len();
        if at + len > max {
            return Err(self.err(DecodeErrorKind::BlockTooLarge, start));
        }
        // Region offsets are 32-bit: a buffer that would end past them
        // cannot be placed at this base.
        let Some(offset) = u32::try_from(at)
            .ok()
            .and_then(|a| a.checked_add(self.opts.device_base))
            .filter(|o| u32::try_from(len).is_ok_and(|l| o.checked_add(l).is_some()))
        else {
            return Err(self.err(DecodeErrorKind::BlockTooLarge, start));
        };
        dev.extend_from_slice(&self.input[pos..pos + len]);
        Ok(Ref { offset, len: len as u32, wire: false, device: true })
    }

    /// Stores a reference into a singular, oneof or repeated slot.
    #[inline(always)]
    fn store_ref(&mut self, f: &Field, r: Ref, start: usize) -> Result<(), DecodeError> {
        let slot = self.obj + f.offset as usize;
        if f.is_repeated() {
            let at = self
                .out
                .grow_array(slot, 8, 1)
                .map_err(|()| self.err(DecodeErrorKind::TooLong, start))?;
            self.out.put_u64(at, r.pack());
            return self.check_block(start);
        }
        if f.flags.has(FieldFlags::ONEOF) {
            let case = self.ts.oneofs(self.msg)[f.presence as usize].case_offset;
            self.out.put_u32(self.obj + case as usize, f.number);
        } else {
            self.out.set_hasbit(self.obj, f.presence);
        }
        self.out.put_u64(slot, r.pack());
        Ok(())
    }

    /// Enters a sub-message (`group` = 0) or a group (`group` = its number)
    /// that ends at `end`: finds or allocates its object and pushes a frame.
    fn enter(
        &mut self,
        f: &Field,
        end: usize,
        group: u32,
        start: usize,
    ) -> Result<(), DecodeError> {
        if self.depth0 + self.stack.len() >= self.opts.max_depth as usize {
            return Err(self.err(DecodeErrorKind::DepthExceeded, start));
        }
        let sub = self.ts.message(f.sub);
        let slot = self.obj + f.offset as usize;
        let obj = if f.is_repeated() {
            let obj = self.out.alloc_zeroed(sub.size as usize);
            let r = Ref { offset: obj as u32, len: sub.size, wire: false, device: false };
            let at = self
                .out
                .grow_array(slot, 8, 1)
                .map_err(|()| self.err(DecodeErrorKind::TooLong, start))?;
            self.out.put_u64(at, r.pack());
            obj
        } else {
            let existing = if f.flags.has(FieldFlags::ONEOF) {
                let case = self.ts.oneofs(self.msg)[f.presence as usize].case_offset as usize;
                self.out.u32_at(self.obj + case) == f.number
            } else {
                self.out.hasbit(self.obj, f.presence)
            };
            let current = Ref::unpack(self.out.u64_at(slot));
            if existing && current.offset != 0 {
                current.offset as usize // merge into the message seen before
            } else {
                let obj = self.out.alloc_zeroed(sub.size as usize);
                let r = Ref { offset: obj as u32, len: sub.size, wire: false, device: false };
                self.store_ref(f, r, start)?;
                obj
            }
        };
        self.check_block(start)?;
        self.stack.push(Frame {
            end: self.end,
            obj: self.obj,
            msg: self.msg_index,
            group: self.group,
            next: self.next as u32,
        });
        self.next = 0;
        self.end = end;
        self.obj = obj;
        self.msg_index = f.sub;
        self.msg = sub;
        self.fields = self.ts.fields(sub);
        self.ops = self.ts.ops(sub);
        self.group = group;
        Ok(())
    }

    /// A packed run of a repeated scalar.
    fn packed(&mut self, f: &Field, start: usize) -> Result<(), DecodeError> {
        let len = self.length(start)?;
        let payload = &self.input[self.pos..self.pos + len];
        self.pos += len;
        let slot = self.obj + f.offset as usize;
        if !f.flags.has(FieldFlags::CLOSED_ENUM) {
            append_packed(self.out, slot, f.kind, payload).map_err(|kind| self.err(kind, start))?;
            return self.check_block(start);
        }
        if len == 0 {
            return Ok(());
        }
        if payload[len - 1] >= 0x80 {
            return Err(self.err(DecodeErrorKind::Truncated, start));
        }
        let n = payload.iter().filter(|&&b| b < 0x80).count() as u32;
        let size = f.kind.slot_size();
        let mut at = self
            .out
            .grow_array(slot, size as usize, n)
            .map_err(|()| self.err(DecodeErrorKind::TooLong, start))?;
        let mut rejected = 0u32;
        let mut p = 0;
        while p < len {
            let raw = varint::read(payload, &mut p)
                .map_err(|_| self.err(DecodeErrorKind::VarintTooLong, start))?;
            let bits = varint_bits(f.kind, raw);
            if !self.ts.enum_contains(self.ts.enum_type(f.sub), bits as u32 as i32) {
                // Unknown closed-enum value: kept as an unpacked unknown
                // field with all 64 bits the sender wrote (as protobuf C++
                // and upb keep it): a reader that declares the field int64
                // must still read -2 as -2.
                rejected += 1;
                let mut rec = Vec::with_capacity(15);
                varint::push(&mut rec, (f.number as u64) << 3);
                varint::push(&mut rec, raw);
                self.append_unknown(&rec, start)?;
                continue;
            }
            self.out.put_scalar(at, size, bits);
            at += size as usize;
        }
        if rejected > 0 {
            self.out.shrink_array(slot, rejected);
        }
        self.check_block(start)
    }

    /// Skips an unknown field (or a known one with an unexpected wire type)
    /// and keeps its bytes.
    fn unknown(&mut self, wt: u32, start: usize) -> Result<(), DecodeError> {
        match wt {
            VARINT => {
                self.varint(start)?;
            }
            FIXED64 => {
                self.fixed::<8>(start)?;
            }
            FIXED32 => {
                self.fixed::<4>(start)?;
            }
            LEN => {
                let len = self.length(start)?;
                self.pos += len;
            }
            START_GROUP => self.skip_group(self.field, start)?,
            _ => return Err(self.err(DecodeErrorKind::InvalidWireType, start)),
        }
        self.keep_unknown(start)
    }

    /// Skips an unknown group up to its matching end tag, checking nesting.
    fn skip_group(&mut self, number: u32, start: usize) -> Result<(), DecodeError> {
        self.groups.clear();
        self.groups.push(number);
        while let Some(&open) = self.groups.last() {
            if self.depth0 + self.stack.len() + self.groups.len() > self.opts.max_depth as usize {
                return Err(self.err(DecodeErrorKind::DepthExceeded, start));
            }
            if self.pos >= self.end {
                self.field = open;
                return Err(self.err(DecodeErrorKind::UnterminatedGroup, start));
            }
            let at = self.pos;
            let tag = self.short(at)?;
            if tag > u32::MAX as u64 {
                return Err(self.err(DecodeErrorKind::TagTooLarge, at));
            }
            let (n, wt) = ((tag >> 3) as u32, (tag & 7) as u32);
            if n == 0 {
                return Err(self.err(DecodeErrorKind::FieldNumberZero, at));
            }
            match wt {
                VARINT => {
                    self.varint(at)?;
                }
                FIXED64 => {
                    self.fixed::<8>(at)?;
                }
                FIXED32 => {
                    self.fixed::<4>(at)?;
                }
                LEN => {
                    let len = self.length(at)?;
                    self.pos += len;
                }
                START_GROUP => self.groups.push(n),
                END_GROUP => {
                    if n != open {
                        return Err(self.err(DecodeErrorKind::UnmatchedEndGroup, at));
                    }
                    self.groups.pop();
                }
                _ => return Err(self.err(DecodeErrorKind::InvalidWireType, at)),
            }
        }
        Ok(())
    }

    /// Appends `input[start..pos]` to the current object's unknown fields.
    fn keep_unknown(&mut self, start: usize) -> Result<(), DecodeError> {
        let input = self.input;
        self.append_unknown(&input[start..self.pos], start)
    }

    fn append_unknown(&mut self, bytes: &[u8], start: usize) -> Result<(), DecodeError> {
        let slot = self.obj + self.msg.unknown_offset as usize;
        let at = self
            .out
            .grow_array(slot, 1, bytes.len() as u32)
            .map_err(|()| self.err(DecodeErrorKind::TooLong, start))?;
        self.out.bytes_mut()[at..at + bytes.len()].copy_from_slice(bytes);
        self.check_block(start)
    }
}

/// Moves a map entry that carried unknown fields (object `entry.1` of type
/// `entry.0`, the last element of field `map` of the object `parent.1`)
/// out of the map: re-encoded, it becomes one of the parent's unknown
/// fields, as upb does (see `Encoder::encode_entry_as_unknown`). Errors
/// name the parent and the map field.
#[cold]
pub(crate) fn move_entry_to_unknown<M: BlockMem>(
    ts: &TableSet,
    out: &mut M,
    input: &[u8],
    max_block: usize,
    parent: (&Message, usize),
    map: &Field,
    entry: (u32, usize),
) -> Result<(), DecodeErrorKind> {
    let mut bytes = Vec::new();
    let src = Source::viewing(out.bytes(), input);
    Encoder::new()
        .encode_entry_as_unknown(ts, entry.0, entry.1, src, &EncodeOptions::default(), &mut bytes)
        .map_err(|_| DecodeErrorKind::BlockTooLarge)?;
    let (msg, obj) = parent;
    out.shrink_array(obj + map.offset as usize, 1);
    let mut rec = Vec::with_capacity(bytes.len() + 10);
    varint::push(&mut rec, ((map.number as u64) << 3) | WireType::Len as u64);
    varint::push(&mut rec, bytes.len() as u64);
    rec.extend_from_slice(&bytes);
    let slot = obj + msg.unknown_offset as usize;
    let at = out.grow_array(slot, 1, rec.len() as u32).map_err(|()| DecodeErrorKind::TooLong)?;
    out.bytes_mut()[at..at + rec.len()].copy_from_slice(&rec);
    if out.len() > max_block {
        return Err(DecodeErrorKind::BlockTooLarge);
    }
    Ok(())
}

/// The first `required` field missing in a decoded block, as `(message
/// type, field number)`; `Err` if the block nests too deep to check.
#[cold]
pub(crate) fn missing_required(
    ts: &TableSet,
    block: &[u8],
    input: &[u8],
    opts: &DecodeOptions,
) -> Result<Option<(u32, u32)>, ()> {
    let src = Source::viewing(block, input);
    let root_type = crate::block::read_u32(block, 4).unwrap_or(0);
    MessageView::new(ts, src, root_type)
        .and_then(|v| v.missing_required(opts.max_depth + 1))
        .map_err(|_| ())
}

/// Whether `data` is valid UTF-8. Most strings on the wire are ASCII, which
/// `is_ascii` confirms a word at a time, far cheaper than the full
/// validation for the short strings of typical requests.
#[inline(always)]
pub(crate) fn utf8(data: &[u8]) -> bool {
    data.is_ascii() || std::str::from_utf8(data).is_ok()
}

/// Appends a packed run of a repeated scalar that is not a closed enum
/// (every value is kept) to the array whose reference slot is at `slot`.
#[inline]
pub(crate) fn append_packed<M: BlockMem>(
    out: &mut M,
    slot: usize,
    kind: Kind,
    payload: &[u8],
) -> Result<(), DecodeErrorKind> {
    let len = payload.len();
    if len == 0 {
        return Ok(());
    }
    let size = kind.slot_size() as usize;
    if matches!(kind.wire_type(), WireType::Fixed32 | WireType::Fixed64) {
        if len % size != 0 {
            return Err(DecodeErrorKind::PackedLength);
        }
        let n = u32::try_from(len / size).map_err(|_| DecodeErrorKind::TooLong)?;
        let at = out.grow_array(slot, size, n).map_err(|()| DecodeErrorKind::TooLong)?;
        // Wire and slot are both little endian: one copy.
        out.bytes_mut()[at..at + len].copy_from_slice(payload);
        return Ok(());
    }
    if payload[len - 1] >= 0x80 {
        return Err(DecodeErrorKind::Truncated);
    }
    let n = payload.iter().filter(|&&b| b < 0x80).count() as u32;
    let at = out.grow_array(slot, size, n).map_err(|()| DecodeErrorKind::TooLong)?;
    let dst = &mut out.bytes_mut()[at..at + n as usize * size];
    unpack_varints(payload, dst, kind).map_err(|_| DecodeErrorKind::VarintTooLong)
}

/// Decodes a packed run of varints into `dst`, an array of exactly as many
/// slots as the run has varints (the caller counted their last bytes), with
/// the conversion chosen once per run rather than once per element.
fn unpack_varints(payload: &[u8], dst: &mut [u8], kind: Kind) -> Result<(), VarintError> {
    let mut p = 0;
    match kind.slot_size() {
        8 => {
            let zigzag = kind == Kind::SInt64;
            for c in dst.chunks_exact_mut(8) {
                let raw = varint::read(payload, &mut p)?;
                let v = if zigzag { varint::unzigzag64(raw) as u64 } else { raw };
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        4 => {
            let zigzag = kind == Kind::SInt32;
            for c in dst.chunks_exact_mut(4) {
                let raw = varint::read(payload, &mut p)? as u32;
                let v = if zigzag { varint::unzigzag32(raw) as u32 } else { raw };
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        _ => {
            for c in dst.iter_mut() {
                *c = (varint::read(payload, &mut p)? != 0) as u8;
            }
        }
    }
    Ok(())
}

/// Converts a wire varint to the bits its slot holds.
#[inline(always)]
pub(crate) fn varint_bits(kind: Kind, raw: u64) -> u64 {
    match kind {
        Kind::Int32 | Kind::UInt32 | Kind::Enum => raw as u32 as u64,
        Kind::SInt32 => varint::unzigzag32(raw as u32) as u32 as u64,
        Kind::SInt64 => varint::unzigzag64(raw) as u64,
        Kind::Bool => (raw != 0) as u64,
        _ => raw,
    }
}
