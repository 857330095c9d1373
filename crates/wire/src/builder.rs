//! Builder: writes a block directly, field by field, with no intermediate
//! message objects. This is the response path of ARCHITECTURE.md: the application
//! lays its data out in a block (RPCAcc's pre-serialization) and the engine
//! encodes it later with [`crate::Encoder`].
//!
//! Handles ([`MessageBuilder`]) are plain offsets, `Copy`, so a sub-message
//! handle stays valid while the block grows.

use std::fmt;

use protoplane_schema::{Card, Field, FieldFlags, FieldOp, Kind, TableSet};

use crate::block::{Block, BlockMem, Ref, MAX_LEN};
use crate::view::Value;

/// Why a builder call was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// The message type has no field with this number.
    NoSuchField(u32),
    /// The value does not fit the field's type.
    TypeMismatch(u32),
    /// `set` on a repeated field or `push` on a singular one.
    Cardinality(u32),
    /// A string, bytes or array longer than a block can hold, or a block past 4 GiB.
    TooLarge(u32),
    /// Unknown type index.
    UnknownType(u32),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoSuchField(n) => write!(f, "no field number {n}"),
            BuildError::TypeMismatch(n) => write!(f, "value does not match the type of field {n}"),
            BuildError::Cardinality(n) => {
                write!(f, "field {n}: set on repeated or push on singular")
            }
            BuildError::TooLarge(n) => write!(f, "field {n}: too large for a block"),
            BuildError::UnknownType(n) => write!(f, "unknown type index {n}"),
        }
    }
}

impl std::error::Error for BuildError {}

/// A handle to one message object under construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageBuilder {
    obj: usize,
    msg: u32,
}

impl MessageBuilder {
    /// Type index of this message.
    pub fn type_index(&self) -> u32 {
        self.msg
    }

    /// Byte offset of the object in the block.
    pub(crate) fn offset(&self) -> usize {
        self.obj
    }
}

/// Builds one block.
#[derive(Debug)]
pub struct Builder<'t> {
    ts: &'t TableSet,
    block: Block,
    root: MessageBuilder,
}

impl<'t> Builder<'t> {
    /// Starts a block for a message of `type_index`.
    pub fn new(ts: &'t TableSet, type_index: u32) -> Result<Self, BuildError> {
        Self::reuse(ts, type_index, Block::for_builder())
    }

    /// Starts a block in a recycled allocation (see [`crate::Region`]).
    pub fn reuse(ts: &'t TableSet, type_index: u32, mut block: Block) -> Result<Self, BuildError> {
        let msg =
            ts.messages().get(type_index as usize).ok_or(BuildError::UnknownType(type_index))?;
        let root = block.mem.start(type_index, msg.size, 0);
        Ok(Builder { ts, block, root: MessageBuilder { obj: root, msg: type_index } })
    }

    /// The root message.
    pub fn root(&self) -> MessageBuilder {
        self.root
    }

    /// The finished block.
    pub fn finish(self) -> Block {
        self.block
    }

    /// The block so far (e.g. to view it).
    pub fn block(&self) -> &Block {
        &self.block
    }

    fn field(&self, at: MessageBuilder, number: u32) -> Result<&'t Field, BuildError> {
        self.ts
            .field_by_number(self.ts.message(at.msg), number)
            .ok_or(BuildError::NoSuchField(number))
    }

    fn check(&self, number: u32) -> Result<(), BuildError> {
        if self.block.len() > u32::MAX as usize {
            return Err(BuildError::TooLarge(number));
        }
        Ok(())
    }

    /// Marks a singular field present (hasbit or oneof case).
    fn mark(&mut self, at: MessageBuilder, f: &Field) {
        if f.flags.has(FieldFlags::ONEOF) {
            let m = self.ts.message(at.msg);
            let case = self.ts.oneofs(m)[f.presence as usize].case_offset;
            self.block.mem.put_u32(at.obj + case as usize, f.number);
        } else {
            self.block.mem.set_hasbit(at.obj, f.presence);
        }
    }

    /// Stores string / bytes data and returns its reference.
    fn store_bytes(&mut self, number: u32, data: &[u8]) -> Result<Ref, BuildError> {
        if data.len() > MAX_LEN {
            return Err(BuildError::TooLarge(number));
        }
        if data.is_empty() {
            return Ok(Ref::default());
        }
        let off = self.block.mem.alloc_copy(data);
        self.check(number)?;
        Ok(Ref { offset: off as u32, len: data.len() as u32, wire: false, device: false })
    }

    /// Sets a singular scalar, string or bytes field.
    pub fn set(
        &mut self,
        at: MessageBuilder,
        number: u32,
        value: Value<'_>,
    ) -> Result<(), BuildError> {
        let f = self.field(at, number)?;
        if f.is_repeated() {
            return Err(BuildError::Cardinality(number));
        }
        if f.kind.is_scalar() {
            let bits = scalar_bits(f, &value).ok_or(BuildError::TypeMismatch(number))?;
            if f.flags.has(FieldFlags::ONEOF) {
                self.block.mem.put_u64(at.obj + f.offset as usize, bits);
            } else {
                self.block.mem.put_scalar(at.obj + f.offset as usize, f.kind.slot_size(), bits);
            }
        } else {
            let data = bytes_of(f, &value).ok_or(BuildError::TypeMismatch(number))?;
            let r = self.store_bytes(number, data)?;
            self.block.mem.put_u64(at.obj + f.offset as usize, r.pack());
        }
        self.mark(at, f);
        Ok(())
    }

    /// Appends one element to a repeated scalar, string or bytes field.
    pub fn push(
        &mut self,
        at: MessageBuilder,
        number: u32,
        value: Value<'_>,
    ) -> Result<(), BuildError> {
        let f = self.field(at, number)?;
        if !f.is_repeated() || f.kind.is_message() {
            return Err(BuildError::Cardinality(number));
        }
        let slot = at.obj + f.offset as usize;
        if f.kind.is_scalar() {
            let bits = scalar_bits(f, &value).ok_or(BuildError::TypeMismatch(number))?;
            let size = f.kind.slot_size();
            let w = self
                .block
                .mem
                .grow_array(slot, size as usize, 1)
                .map_err(|()| BuildError::TooLarge(number))?;
            self.block.mem.put_scalar(w, size, bits);
        } else {
            let data = bytes_of(f, &value).ok_or(BuildError::TypeMismatch(number))?;
            let r = self.store_bytes(number, data)?;
            let w =
                self.block.mem.grow_array(slot, 8, 1).map_err(|()| BuildError::TooLarge(number))?;
            self.block.mem.put_u64(w, r.pack());
        }
        self.check(number)
    }

    /// Opens a sub-message field: for a singular field the existing message
    /// (it merges) or a new empty one; for a repeated field a new element.
    pub fn message(
        &mut self,
        at: MessageBuilder,
        number: u32,
    ) -> Result<MessageBuilder, BuildError> {
        let f = self.field(at, number)?;
        if !f.kind.is_message() {
            return Err(BuildError::TypeMismatch(number));
        }
        let sub = self.ts.message(f.sub);
        let slot = at.obj + f.offset as usize;
        if !f.is_repeated() {
            let existing = if f.flags.has(FieldFlags::ONEOF) {
                let m = self.ts.message(at.msg);
                let case = self.ts.oneofs(m)[f.presence as usize].case_offset;
                self.block.mem.u32_at(at.obj + case as usize) == f.number
            } else {
                self.block.mem.hasbit(at.obj, f.presence)
            };
            let r = Ref::unpack(self.block.mem.u64_at(slot));
            if existing && r.offset != 0 {
                return Ok(MessageBuilder { obj: r.offset as usize, msg: f.sub });
            }
        }
        let obj = self.block.mem.alloc_zeroed(sub.size as usize);
        self.check(number)?;
        let r = Ref { offset: obj as u32, len: sub.size, wire: false, device: false };
        if f.is_repeated() {
            let w =
                self.block.mem.grow_array(slot, 8, 1).map_err(|()| BuildError::TooLarge(number))?;
            self.block.mem.put_u64(w, r.pack());
        } else {
            self.block.mem.put_u64(slot, r.pack());
            self.mark(at, f);
        }
        Ok(MessageBuilder { obj, msg: f.sub })
    }

    /// Moves the last element of map field `map` (the entry `entry`, which
    /// carried unknown fields) into the message's unknown fields, re-encoded
    /// as upb does (see `Encoder::encode_entry_as_unknown`).
    pub(crate) fn entry_to_unknown(
        &mut self,
        at: MessageBuilder,
        map: &Field,
        entry: MessageBuilder,
    ) -> Result<(), BuildError> {
        let mut bytes = Vec::new();
        crate::Encoder::new()
            .encode_entry_as_unknown(
                self.ts,
                entry.msg,
                entry.obj,
                crate::Source::owned(self.block.as_bytes()),
                &crate::EncodeOptions::default(),
                &mut bytes,
            )
            .map_err(|_| BuildError::TooLarge(map.number))?;
        self.block.mem.shrink_array(at.obj + map.offset as usize, 1);
        let mut rec = Vec::with_capacity(bytes.len() + 10);
        crate::varint::push(&mut rec, ((map.number as u64) << 3) | 2);
        crate::varint::push(&mut rec, bytes.len() as u64);
        rec.extend_from_slice(&bytes);
        self.push_unknown(at, &rec)
    }

    /// Appends raw wire bytes to the message's unknown fields (they are
    /// re-emitted verbatim after the known fields).
    pub fn push_unknown(&mut self, at: MessageBuilder, wire: &[u8]) -> Result<(), BuildError> {
        let m = self.ts.message(at.msg);
        let slot = at.obj + m.unknown_offset as usize;
        let w = self
            .block
            .mem
            .grow_array(slot, 1, u32::try_from(wire.len()).map_err(|_| BuildError::TooLarge(0))?)
            .map_err(|()| BuildError::TooLarge(0))?;
        self.block.mem.bytes_mut()[w..w + wire.len()].copy_from_slice(wire);
        self.check(0)
    }
}

/// Constant-offset writes: the primitives typed builders generated by
/// `protoplane-codegen` are made of. A field is addressed by its
/// [`FieldOp`] (slot offset, presence, element size), which the generator
/// computed at build time from the same schema tables, so nothing is looked
/// up by number.
///
/// None of them panics. An op that does not fit the object `at` (a handle
/// or an op of another type: a programming error) makes the infallible
/// [`Builder::set_bits`] do nothing and the others fail with
/// [`BuildError::NoSuchField`]; the other errors are the size limits of
/// a block ([`BuildError::TooLarge`]).
impl<'t> Builder<'t> {
    /// The table set this builder lays blocks out with.
    #[inline]
    pub fn tables(&self) -> &'t TableSet {
        self.ts
    }

    /// Absolute offset of `op`'s slot in the object `at`, if the slot
    /// (`width` bytes) and the presence word lie inside the object and the
    /// object inside the block.
    #[inline(always)]
    fn slot_of(&self, at: MessageBuilder, op: &FieldOp, width: usize) -> Option<usize> {
        let size = self.ts.messages().get(at.msg as usize)?.size as usize;
        let end = at.obj.checked_add(size)?;
        let off = op.offset as usize;
        let presence_end = match op.card {
            Card::Hasbit | Card::Implicit | Card::Always => 4 * (op.presence as usize / 32) + 4,
            Card::Oneof => op.presence as usize + 4,
            Card::Repeated | Card::Packed => 0,
        };
        let inside = off + width <= size && presence_end <= size && end <= self.block.len();
        inside.then_some(at.obj + off)
    }

    /// Marks a singular field present: hasbit, or oneof case word.
    #[inline(always)]
    fn mark_op(&mut self, at: MessageBuilder, op: &FieldOp) {
        match op.card {
            Card::Hasbit | Card::Implicit | Card::Always => {
                let w = at.obj + 4 * (op.presence as usize / 32);
                if let Some(b) = self.block.mem.bytes_mut().get_mut(w..w + 4) {
                    let v = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) | 1 << (op.presence % 32);
                    b.copy_from_slice(&v.to_le_bytes());
                }
            }
            Card::Oneof => {
                let w = at.obj + op.presence as usize;
                if let Some(b) = self.block.mem.bytes_mut().get_mut(w..w + 4) {
                    b.copy_from_slice(&(op.tag >> 3).to_le_bytes());
                }
            }
            Card::Repeated | Card::Packed => {}
        }
    }

    /// Sets a singular scalar field to the slot bits `bits` (as the slot
    /// holds them: two's complement, IEEE bits, 0/1 for `bool`) and marks
    /// it present. A oneof member's slot is the 8-byte union.
    #[inline]
    pub fn set_bits(&mut self, at: MessageBuilder, op: &FieldOp, bits: u64) {
        let size = if op.card == Card::Oneof { 8 } else { op.size as usize };
        let Some(slot) = self.slot_of(at, op, size) else { return };
        if let Some(dst) = self.block.mem.bytes_mut().get_mut(slot..slot + size) {
            dst.copy_from_slice(&bits.to_le_bytes()[..size]);
        }
        self.mark_op(at, op);
    }

    /// Sets a singular `string` / `bytes` field to a handle into the device
    /// region (`offset`, `len`: a compute unit's output, a request's
    /// device-placed value) and marks it present. The bytes stay there: the
    /// block holds a reference with the device flag, and only an encoder
    /// given the region ([`crate::Source::with_device`], the engine's)
    /// writes them (RPCAcc's co-serialization).
    #[inline]
    pub fn set_device(
        &mut self,
        at: MessageBuilder,
        op: &FieldOp,
        offset: u32,
        len: u32,
    ) -> Result<(), BuildError> {
        let number = op.tag >> 3;
        if matches!(op.card, Card::Repeated | Card::Packed) {
            return Err(BuildError::Cardinality(number));
        }
        if len as usize > MAX_LEN {
            return Err(BuildError::TooLarge(number));
        }
        self.set_bits(at, op, Ref { offset, len, wire: false, device: true }.pack());
        Ok(())
    }

    /// Sets a singular `string` / `bytes` field (a copy of `data`) and marks
    /// it present.
    #[inline]
    pub fn set_bytes(
        &mut self,
        at: MessageBuilder,
        op: &FieldOp,
        data: &[u8],
    ) -> Result<(), BuildError> {
        let number = op.tag >> 3;
        let slot = self.slot_of(at, op, 8).ok_or(BuildError::NoSuchField(number))?;
        let r = self.store_bytes(number, data)?;
        self.block.mem.put_u64(slot, r.pack());
        self.mark_op(at, op);
        Ok(())
    }

    /// Appends one element (slot bits, `op.size` bytes) to a repeated scalar field.
    #[inline]
    pub fn push_bits(
        &mut self,
        at: MessageBuilder,
        op: &FieldOp,
        bits: u64,
    ) -> Result<(), BuildError> {
        let number = op.tag >> 3;
        let slot = self.slot_of(at, op, 8).ok_or(BuildError::NoSuchField(number))?;
        let size = op.size as usize;
        let w =
            self.block.mem.grow_array(slot, size, 1).map_err(|()| BuildError::TooLarge(number))?;
        self.block.mem.bytes_mut()[w..w + size].copy_from_slice(&bits.to_le_bytes()[..size]);
        self.check(number)
    }

    /// Appends one element (a copy of `data`) to a repeated `string` / `bytes` field.
    #[inline]
    pub fn push_bytes(
        &mut self,
        at: MessageBuilder,
        op: &FieldOp,
        data: &[u8],
    ) -> Result<(), BuildError> {
        let number = op.tag >> 3;
        let slot = self.slot_of(at, op, 8).ok_or(BuildError::NoSuchField(number))?;
        let r = self.store_bytes(number, data)?;
        let w = self.block.mem.grow_array(slot, 8, 1).map_err(|()| BuildError::TooLarge(number))?;
        self.block.mem.put_u64(w, r.pack());
        self.check(number)
    }

    /// Opens a sub-message field of type `sub` (like [`Builder::message`]):
    /// a singular field's existing message (it merges) or a new one, which
    /// marks it present; for a repeated field (and a map) a new element.
    #[inline]
    pub fn open(
        &mut self,
        at: MessageBuilder,
        op: &FieldOp,
        sub: u32,
    ) -> Result<MessageBuilder, BuildError> {
        let number = op.tag >> 3;
        let slot = self.slot_of(at, op, 8).ok_or(BuildError::NoSuchField(number))?;
        let size = self.ts.messages().get(sub as usize).ok_or(BuildError::UnknownType(sub))?.size;
        let repeated = matches!(op.card, Card::Repeated | Card::Packed);
        if !repeated {
            let existing = match op.card {
                Card::Oneof => self.block.mem.u32_at(at.obj + op.presence as usize) == op.tag >> 3,
                _ => self.block.mem.hasbit(at.obj, op.presence),
            };
            let r = Ref::unpack(self.block.mem.u64_at(slot));
            if existing && r.offset != 0 {
                return Ok(MessageBuilder { obj: r.offset as usize, msg: sub });
            }
        }
        let obj = self.block.mem.alloc_zeroed(size as usize);
        self.check(number)?;
        let r = Ref { offset: obj as u32, len: size, wire: false, device: false };
        if repeated {
            let w =
                self.block.mem.grow_array(slot, 8, 1).map_err(|()| BuildError::TooLarge(number))?;
            self.block.mem.put_u64(w, r.pack());
        } else {
            self.block.mem.put_u64(slot, r.pack());
            self.mark_op(at, op);
        }
        Ok(MessageBuilder { obj, msg: sub })
    }
}

/// Slot bits for a scalar value, if the value's type fits the field's kind.
fn scalar_bits(f: &Field, v: &Value<'_>) -> Option<u64> {
    Some(match (f.kind, *v) {
        (Kind::Bool, Value::Bool(b)) => b as u64,
        (Kind::Int32 | Kind::SInt32 | Kind::SFixed32, Value::I32(x)) => x as u32 as u64,
        (Kind::Enum, Value::Enum(x) | Value::I32(x)) => x as u32 as u64,
        (Kind::Int64 | Kind::SInt64 | Kind::SFixed64, Value::I64(x)) => x as u64,
        (Kind::UInt32 | Kind::Fixed32, Value::U32(x)) => x as u64,
        (Kind::UInt64 | Kind::Fixed64, Value::U64(x)) => x,
        (Kind::Float, Value::F32(x)) => x.to_bits() as u64,
        (Kind::Double, Value::F64(x)) => x.to_bits(),
        _ => return None,
    })
}

fn bytes_of<'v>(f: &Field, v: &Value<'v>) -> Option<&'v [u8]> {
    match (f.kind, *v) {
        (Kind::String, Value::String(b)) => Some(b),
        (Kind::Bytes, Value::Bytes(b) | Value::String(b)) => Some(b),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use protoplane_schema::{ProtoSource, TableSet};

    use super::*;

    const PROTO: &str = r#"
        syntax = "proto3";
        message Inner { int32 x = 1; }
        message Outer {
            int64 id = 1;
            string text = 2;
            Inner inner = 3;
            repeated sint32 nums = 4;
            repeated string tags = 5;
            repeated Inner items = 6;
            oneof pick { bool flag = 7; Inner sub = 8; }
        }
    "#;

    fn tables() -> TableSet {
        TableSet::from_proto_sources(&[ProtoSource { name: "t.proto", text: PROTO }], &["t.proto"])
            .unwrap_or_else(|e| panic!("test schema: {e}"))
    }

    #[test]
    fn op_writes_lay_out_what_the_lookup_path_does() -> Result<(), BuildError> {
        let ts = tables();
        let outer = ts.message_by_name("Outer").ok_or(BuildError::UnknownType(0))?;
        let inner = ts.message_by_name("Inner").ok_or(BuildError::UnknownType(0))?;
        let ops = ts.ops(ts.message(outer)).to_vec();
        let inner_ops = ts.ops(ts.message(inner)).to_vec();

        let mut a = Builder::new(&ts, outer)?;
        let r = a.root();
        a.set(r, 1, Value::I64(-9))?;
        a.set(r, 2, Value::String(b"text"))?;
        let m = a.message(r, 3)?;
        a.set(m, 1, Value::I32(3))?;
        a.push(r, 4, Value::I32(-1))?;
        a.push(r, 5, Value::String(b"t"))?;
        let e = a.message(r, 6)?;
        a.set(e, 1, Value::I32(4))?;
        a.set(r, 7, Value::Bool(true))?;
        let s = a.message(r, 8)?;
        a.set(s, 1, Value::I32(5))?;

        let mut b = Builder::new(&ts, outer)?;
        let r = b.root();
        b.set_bits(r, &ops[0], -9i64 as u64);
        b.set_bytes(r, &ops[1], b"text")?;
        let m = b.open(r, &ops[2], inner)?;
        b.set_bits(m, &inner_ops[0], 3);
        b.push_bits(r, &ops[3], -1i32 as u32 as u64)?;
        b.push_bytes(r, &ops[4], b"t")?;
        let e = b.open(r, &ops[5], inner)?;
        b.set_bits(e, &inner_ops[0], 4);
        b.set_bits(r, &ops[6], 1);
        let s = b.open(r, &ops[7], inner)?;
        b.set_bits(s, &inner_ops[0], 5);
        // Opening a singular message again returns the one already set.
        assert_eq!(b.open(r, &ops[2], inner)?, m);
        assert_eq!(a.finish(), b.finish());
        Ok(())
    }

    #[test]
    fn ops_that_do_not_fit_the_object_are_refused() -> Result<(), BuildError> {
        let ts = tables();
        let outer = ts.message_by_name("Outer").ok_or(BuildError::UnknownType(0))?;
        let inner = ts.message_by_name("Inner").ok_or(BuildError::UnknownType(0))?;
        let ops = ts.ops(ts.message(outer)).to_vec();
        let mut b = Builder::new(&ts, inner)?;
        let r = b.root();
        let before = b.block().clone();
        // Slots past the object, or a hasbit / case word past it: refused.
        let far = |op: &FieldOp| FieldOp { offset: 1000, ..*op };
        let far_bit = |op: &FieldOp| FieldOp { presence: 10_000, ..*op };
        b.set_bits(r, &far(&ops[0]), 1);
        b.set_bits(r, &far_bit(&ops[0]), 1);
        assert_eq!(b.set_bytes(r, &far(&ops[1]), b"x"), Err(BuildError::NoSuchField(2)));
        assert_eq!(b.push_bits(r, &far(&ops[3]), 1), Err(BuildError::NoSuchField(4)));
        assert_eq!(b.push_bytes(r, &far(&ops[4]), b"x"), Err(BuildError::NoSuchField(5)));
        assert_eq!(b.open(r, &far(&ops[5]), inner), Err(BuildError::NoSuchField(6)));
        assert_eq!(b.open(r, &far_bit(&ops[2]), inner), Err(BuildError::NoSuchField(3)));
        // A handle past the end of the block (from another builder).
        let gone = MessageBuilder { obj: 1 << 20, msg: inner };
        b.set_bits(gone, &ops[0], 1);
        assert!(b.set_bytes(gone, &ops[1], b"x").is_err());
        assert_eq!(b.block(), &before);
        // Ops of another type that happen to fall inside the object write
        // garbage into it (a programming error), but never out of bounds.
        for op in &ops {
            b.set_bits(r, op, u64::MAX);
        }
        assert_eq!(b.block().len(), before.len());
        Ok(())
    }
}
