//! Dynamic, read-only views over a block: read any field by number or name
//! without generated code. Typed views generated from `.proto` files sit on
//! the same primitives.
//!
//! A view checks the bounds of its object once when it is created (so slot
//! reads cannot fail afterwards) and checks every reference it follows: a
//! block from another process can make a read return [`BlockError`], never
//! panic or read outside the block.

use protoplane_schema::{Field, FieldFlags, Kind, Message, TableSet};

use crate::block::Ref;
use crate::encode::{hasbit, le_bits, slot_u32, slot_u64, Source};
use crate::error::BlockError;

/// One field value.
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    /// `bool`
    Bool(bool),
    /// `int32`, `sint32`, `sfixed32`
    I32(i32),
    /// `int64`, `sint64`, `sfixed64`
    I64(i64),
    /// `uint32`, `fixed32`
    U32(u32),
    /// `uint64`, `fixed64`
    U64(u64),
    /// `float`
    F32(f32),
    /// `double`
    F64(f64),
    /// An enum value (possibly one the enum does not declare, proto3).
    Enum(i32),
    /// `string` (UTF-8 is guaranteed for proto3 fields only).
    String(&'a [u8]),
    /// `bytes`
    Bytes(&'a [u8]),
    /// A sub-message.
    Message(MessageView<'a>),
}

impl<'a> Value<'a> {
    fn scalar(kind: Kind, bits: u64) -> Value<'a> {
        match kind {
            Kind::Bool => Value::Bool(bits != 0),
            Kind::Int32 | Kind::SInt32 | Kind::SFixed32 => Value::I32(bits as u32 as i32),
            Kind::Int64 | Kind::SInt64 | Kind::SFixed64 => Value::I64(bits as i64),
            Kind::UInt32 | Kind::Fixed32 => Value::U32(bits as u32),
            Kind::UInt64 | Kind::Fixed64 => Value::U64(bits),
            Kind::Float => Value::F32(f32::from_bits(bits as u32)),
            Kind::Double => Value::F64(f64::from_bits(bits)),
            Kind::Enum => Value::Enum(bits as u32 as i32),
            // Not scalars; callers never ask.
            _ => Value::Bytes(&[]),
        }
    }

    /// Integer value widened to i128 (bool as 0/1, enums as their number).
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::Bool(b) => b as i128,
            Value::I32(v) | Value::Enum(v) => v as i128,
            Value::I64(v) => v as i128,
            Value::U32(v) => v as i128,
            Value::U64(v) => v as i128,
            _ => return None,
        })
    }

    /// Text of a `string` value, if valid UTF-8.
    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            Value::String(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// Raw bytes of a `string` or `bytes` value.
    pub fn as_bytes(&self) -> Option<&'a [u8]> {
        match *self {
            Value::String(b) | Value::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// The sub-message view.
    pub fn as_message(&self) -> Option<MessageView<'a>> {
        match *self {
            Value::Message(m) => Some(m),
            _ => None,
        }
    }
}

/// A view of one message object in a block.
#[derive(Clone, Copy)]
pub struct MessageView<'a> {
    ts: &'a TableSet,
    src: Source<'a>,
    index: u32,
    msg: &'a Message,
    at: usize,
    obj: &'a [u8],
}

impl std::fmt::Debug for MessageView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageView")
            .field("type", &self.type_name())
            .field("at", &self.at)
            .finish()
    }
}

impl<'a> MessageView<'a> {
    /// The root message of a block of type `type_index`.
    pub fn new(ts: &'a TableSet, src: Source<'a>, type_index: u32) -> Result<Self, BlockError> {
        let root = src.root(ts, type_index)?;
        Self::at(ts, src, type_index, root)
    }

    pub(crate) fn at(
        ts: &'a TableSet,
        src: Source<'a>,
        index: u32,
        at: usize,
    ) -> Result<Self, BlockError> {
        let msg = ts.messages().get(index as usize).ok_or(BlockError::WrongType)?;
        let obj = src.object(at, msg)?;
        Ok(MessageView { ts, src, index, msg, at, obj })
    }

    /// Where this message's object starts in its block; 0 for the empty
    /// message a null reference reads as ([`MessageView::ref_message`]).
    /// With [`MessageView::reopen`], a reader that cannot hold the borrow
    /// (a view handed to another language) keeps a position instead.
    pub fn offset(&self) -> usize {
        self.at
    }

    /// The view of type `index` at `at` (an [`MessageView::offset`] of the
    /// same block), checked as any object is: a wrong position is an
    /// error, never a read outside the block.
    pub fn reopen(
        ts: &'a TableSet,
        src: Source<'a>,
        index: u32,
        at: usize,
    ) -> Result<Self, BlockError> {
        if at == 0 {
            let msg = ts.messages().get(index as usize).ok_or(BlockError::WrongType)?;
            return Ok(MessageView { ts, src, index, msg, at: 0, obj: &[] });
        }
        if at > src.block.len() {
            return Err(BlockError::OutOfBounds { at });
        }
        Self::at(ts, src, index, at)
    }

    /// The table set this view reads with.
    pub fn tables(&self) -> &'a TableSet {
        self.ts
    }

    /// Type index of this message.
    pub fn type_index(&self) -> u32 {
        self.index
    }

    /// Fully qualified type name.
    pub fn type_name(&self) -> &'a str {
        self.ts.message_name(self.index)
    }

    /// The fields of this message's type, in number order.
    pub fn fields(&self) -> &'a [Field] {
        self.ts.fields(self.msg)
    }

    /// The field entry for `number`.
    pub fn field(&self, number: u32) -> Option<&'a Field> {
        self.ts.field_by_number(self.msg, number)
    }

    /// The field entry for a declared or JSON name.
    pub fn field_named(&self, name: &str) -> Option<&'a Field> {
        self.ts.field_by_name(self.msg, name)
    }

    /// Whether a singular field is present (repeated: non-empty). proto3
    /// implicit-presence fields count as present when non-zero.
    pub fn has(&self, f: &Field) -> bool {
        if f.is_repeated() {
            return Ref::unpack(slot_u64(self.obj, f.offset)).len != 0;
        }
        let set = if f.flags.has(FieldFlags::ONEOF) {
            slot_u32(self.obj, self.ts.oneofs(self.msg)[f.presence as usize].case_offset)
                == f.number
        } else {
            hasbit(self.obj, f.presence)
        };
        if !set {
            return false;
        }
        if f.flags.has(FieldFlags::IMPLICIT) {
            return if f.kind.is_scalar() {
                slot_bits(self.obj, f.offset, f.kind) != 0
            } else {
                Ref::unpack(slot_u64(self.obj, f.offset)).len != 0
            };
        }
        !f.kind.is_message() || Ref::unpack(slot_u64(self.obj, f.offset)).offset != 0
    }

    /// The field number of the member of oneof `index` that is set (0: none).
    pub fn oneof_case(&self, index: usize) -> u32 {
        self.ts.oneofs(self.msg).get(index).map_or(0, |o| slot_u32(self.obj, o.case_offset))
    }

    /// Value of a singular field: `None` when absent (repeated fields: use
    /// [`MessageView::repeated`]).
    pub fn get(&self, f: &Field) -> Result<Option<Value<'a>>, BlockError> {
        if f.is_repeated() || !self.has(f) {
            return Ok(None);
        }
        self.value_in_slot(f).map(Some)
    }

    /// Value of a singular field, or its default when absent (proto2
    /// `[default = …]`, else zero / empty; messages: `None`).
    pub fn get_or_default(&self, f: &Field) -> Result<Option<Value<'a>>, BlockError> {
        if let Some(v) = self.get(f)? {
            return Ok(Some(v));
        }
        Ok(match f.kind {
            Kind::Message | Kind::Group => None,
            Kind::String => Some(Value::String(self.ts.default_bytes(f))),
            Kind::Bytes => Some(Value::Bytes(self.ts.default_bytes(f))),
            k => Some(Value::scalar(k, f.default)),
        })
    }

    /// Value of the singular field numbered `number` (`None`: absent or no such field).
    pub fn by_number(&self, number: u32) -> Result<Option<Value<'a>>, BlockError> {
        match self.field(number) {
            Some(f) => self.get(f),
            None => Ok(None),
        }
    }

    /// Value of the singular field with this declared or JSON name.
    pub fn by_name(&self, name: &str) -> Result<Option<Value<'a>>, BlockError> {
        match self.field_named(name) {
            Some(f) => self.get(f),
            None => Ok(None),
        }
    }

    fn value_in_slot(&self, f: &Field) -> Result<Value<'a>, BlockError> {
        if f.kind.is_scalar() {
            return Ok(Value::scalar(f.kind, slot_bits(self.obj, f.offset, f.kind)));
        }
        let r = Ref::unpack(slot_u64(self.obj, f.offset));
        self.value_of_ref(f, r, self.at + f.offset as usize)
    }

    fn value_of_ref(&self, f: &Field, r: Ref, at: usize) -> Result<Value<'a>, BlockError> {
        Ok(match f.kind {
            Kind::String => Value::String(self.src.bytes(r, at)?),
            Kind::Bytes => Value::Bytes(self.src.bytes(r, at)?),
            _ => Value::Message(MessageView::at(self.ts, self.src, f.sub, r.offset as usize)?),
        })
    }

    /// The elements of a repeated field (empty for absent or singular fields).
    pub fn repeated(&self, f: &'a Field) -> Result<RepeatedView<'a>, BlockError> {
        if !f.is_repeated() {
            return Ok(RepeatedView { view: *self, field: f, arr: &[], elem: 8 });
        }
        let r = Ref::unpack(slot_u64(self.obj, f.offset));
        let elem = if f.kind.is_scalar() { f.kind.slot_size() as usize } else { 8 };
        let arr = self.src.array(r, elem, self.at + f.offset as usize)?;
        Ok(RepeatedView { view: *self, field: f, arr, elem })
    }

    /// The first proto2 `required` field missing anywhere in this message
    /// tree, as `(type index, field number)`. Sub-messages are visited only
    /// when present; `depth` bounds the walk.
    pub fn missing_required(&self, depth: u32) -> Result<Option<(u32, u32)>, BlockError> {
        if depth == 0 {
            return Err(BlockError::TooDeep);
        }
        for f in self.fields() {
            if f.label == protoplane_schema::Label::Required && !self.has(f) {
                return Ok(Some((self.index, f.number)));
            }
            if !f.kind.is_message() || !self.has(f) {
                continue;
            }
            if f.is_repeated() {
                let rep = self.repeated(f)?;
                for i in 0..rep.len() {
                    if let Some(m) = rep.get(i)?.as_message() {
                        if let Some(found) = m.missing_required(depth - 1)? {
                            return Ok(Some(found));
                        }
                    }
                }
            } else if let Some(m) = self.get(f)?.and_then(|v| v.as_message()) {
                if let Some(found) = m.missing_required(depth - 1)? {
                    return Ok(Some(found));
                }
            }
        }
        Ok(None)
    }

    /// Unknown fields, byte for byte as received.
    pub fn unknown_fields(&self) -> Result<&'a [u8], BlockError> {
        let r = Ref::unpack(slot_u64(self.obj, self.msg.unknown_offset));
        self.src.array(r, 1, self.at + self.msg.unknown_offset as usize)
    }
}

/// Constant-offset access: the primitives typed views generated by
/// `protoplane-codegen` are made of. The generator knows every slot's offset
/// and hasbit index at build time (the layout is a deterministic function of
/// the schema), so a generated getter is one or two of these calls, no
/// lookup by number or name.
///
/// None of them can fail or panic: the object was bounds-checked when the
/// view was made, a slot outside it reads as zero (only possible when the
/// offsets do not belong to this view's type), and a reference that does not
/// resolve is an error the caller maps to "absent" or "empty".
impl<'a> MessageView<'a> {
    /// The one-byte slot at `offset` (0 outside the object).
    #[inline(always)]
    pub fn slot_u8(&self, offset: u32) -> u8 {
        self.obj.get(offset as usize).copied().unwrap_or(0)
    }

    /// The four-byte little-endian slot at `offset` (0 outside the object).
    #[inline(always)]
    pub fn slot_u32(&self, offset: u32) -> u32 {
        slot_u32(self.obj, offset)
    }

    /// The eight-byte little-endian slot at `offset` (0 outside the object);
    /// for a reference slot, the raw reference the `ref_*` methods take.
    #[inline(always)]
    pub fn slot_u64(&self, offset: u32) -> u64 {
        slot_u64(self.obj, offset)
    }

    /// The reference in the slot at `offset` when its device flag is set
    /// (a `string` / `bytes` field a target-aware decode placed in the
    /// device region), `None` otherwise: the bytes are not in the block,
    /// the reference is a handle into the device region.
    #[inline(always)]
    pub fn device_ref_at(&self, offset: u32) -> Option<crate::Ref> {
        Some(crate::Ref::unpack(self.slot_u64(offset))).filter(|r| r.device)
    }

    /// `len` bytes of the object from `offset` (empty outside the object).
    #[inline(always)]
    pub fn slot_bytes(&self, offset: u32, len: usize) -> &'a [u8] {
        let o = offset as usize;
        o.checked_add(len).and_then(|end| self.obj.get(o..end)).unwrap_or(&[])
    }

    /// Hasbit `bit` (false outside the object).
    #[inline(always)]
    pub fn hasbit(&self, bit: u32) -> bool {
        hasbit(self.obj, bit)
    }

    /// The `string` / `bytes` data a raw reference (a slot's or an array
    /// element's eight bytes) designates.
    #[inline(always)]
    pub fn ref_bytes(&self, raw: u64) -> Result<&'a [u8], BlockError> {
        self.src.bytes(Ref::unpack(raw), self.at)
    }

    /// The element bytes (`len * elem`) of the array a raw reference designates.
    #[inline(always)]
    pub fn ref_array(&self, raw: u64, elem: usize) -> Result<&'a [u8], BlockError> {
        self.src.array(Ref::unpack(raw), elem, self.at)
    }

    /// The message of type `type_index` a raw reference designates. A null
    /// reference (offset 0) reads as the empty message: a view over no
    /// bytes, in which every field is absent (protobuf's default instance).
    #[inline(always)]
    pub fn ref_message(&self, raw: u64, type_index: u32) -> Result<MessageView<'a>, BlockError> {
        let r = Ref::unpack(raw);
        if r.offset == 0 {
            let msg = self.ts.messages().get(type_index as usize).ok_or(BlockError::WrongType)?;
            return Ok(MessageView { msg, index: type_index, at: 0, obj: &[], ..*self });
        }
        MessageView::at(self.ts, self.src, type_index, r.offset as usize)
    }
}

/// Slot bits of a scalar of `kind` (zero-extended; 0 outside the object,
/// which only an empty view from [`MessageView::ref_message`] can hit).
#[inline(always)]
fn slot_bits(obj: &[u8], off: u32, kind: Kind) -> u64 {
    match kind.slot_size() {
        8 => slot_u64(obj, off),
        4 => slot_u32(obj, off) as u64,
        _ => obj.get(off as usize).copied().unwrap_or(0) as u64,
    }
}

/// The elements of one repeated field.
#[derive(Clone, Copy, Debug)]
pub struct RepeatedView<'a> {
    view: MessageView<'a>,
    field: &'a Field,
    arr: &'a [u8],
    elem: usize,
}

impl<'a> RepeatedView<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.arr.len() / self.elem
    }

    /// No elements.
    pub fn is_empty(&self) -> bool {
        self.arr.is_empty()
    }

    /// The field these elements belong to.
    pub fn field(&self) -> &'a Field {
        self.field
    }

    /// Element `i`.
    pub fn get(&self, i: usize) -> Result<Value<'a>, BlockError> {
        let c = self
            .arr
            .get(i * self.elem..(i + 1) * self.elem)
            .ok_or(BlockError::OutOfBounds { at: self.view.at })?;
        let f = self.field;
        if f.kind.is_scalar() {
            return Ok(Value::scalar(f.kind, le_bits(c)));
        }
        self.view.value_of_ref(f, Ref::unpack(le_bits(c)), self.view.at + f.offset as usize)
    }

    /// Iterates over the elements.
    pub fn iter(&self) -> impl Iterator<Item = Result<Value<'a>, BlockError>> + '_ {
        (0..self.len()).map(move |i| self.get(i))
    }
}

#[cfg(test)]
mod tests {
    use protoplane_schema::{ProtoSource, TableSet};

    use super::*;
    use crate::Builder;

    const PROTO: &str = r#"
        syntax = "proto3";
        message Inner { bool flag = 1; string name = 2; }
        message Outer {
            int64 id = 1;
            string text = 2;
            Inner inner = 3;
            repeated int32 nums = 4;
            optional bool on = 5;
        }
    "#;

    fn tables() -> TableSet {
        TableSet::from_proto_sources(&[ProtoSource { name: "t.proto", text: PROTO }], &["t.proto"])
            .unwrap_or_else(|e| panic!("test schema: {e}"))
    }

    #[test]
    fn slot_primitives_agree_with_the_lookup_path() -> Result<(), Box<dyn std::error::Error>> {
        let ts = tables();
        let outer = ts.message_by_name("Outer").ok_or("no Outer")?;
        let inner = ts.message_by_name("Inner").ok_or("no Inner")?;
        let mut b = Builder::new(&ts, outer)?;
        let root = b.root();
        b.set(root, 1, Value::I64(-5))?;
        b.set(root, 2, Value::String(b"hi"))?;
        b.push(root, 4, Value::I32(7))?;
        b.push(root, 4, Value::I32(8))?;
        let m = b.message(root, 3)?;
        b.set(m, 1, Value::Bool(true))?;
        let block = b.finish();
        let v = MessageView::new(&ts, Source::owned(block.as_bytes()), outer)?;
        let f = |n| v.field(n).copied().ok_or("no field");
        let (id, text, sub, nums) = (f(1)?, f(2)?, f(3)?, f(4)?);
        assert!(v.hasbit(id.presence) && v.slot_u64(id.offset) as i64 == -5);
        assert_eq!(v.ref_bytes(v.slot_u64(text.offset))?, b"hi");
        let arr = v.ref_array(v.slot_u64(nums.offset), 4)?;
        assert_eq!(arr, [7, 0, 0, 0, 8, 0, 0, 0]);
        let sub_view = v.ref_message(v.slot_u64(sub.offset), inner)?;
        let flag = sub_view.field(1).copied().ok_or("no flag")?;
        assert_eq!(sub_view.slot_u8(flag.offset), 1);
        assert_eq!(v.slot_bytes(id.offset, 8), (-5i64).to_le_bytes());
        // Outside the object: zeros and empty slices, no panic.
        assert_eq!((v.slot_u8(u32::MAX), v.slot_u32(10_000), v.slot_u64(u32::MAX - 3)), (0, 0, 0));
        assert!(v.slot_bytes(u32::MAX, 8).is_empty() && v.slot_bytes(8, usize::MAX).is_empty());
        assert!(!v.hasbit(100_000));
        Ok(())
    }

    #[test]
    fn a_null_reference_reads_as_the_empty_message() -> Result<(), Box<dyn std::error::Error>> {
        let ts = tables();
        let outer = ts.message_by_name("Outer").ok_or("no Outer")?;
        let inner = ts.message_by_name("Inner").ok_or("no Inner")?;
        let block = Builder::new(&ts, outer)?.finish();
        let v = MessageView::new(&ts, Source::owned(block.as_bytes()), outer)?;
        let empty = v.ref_message(0, inner)?;
        assert_eq!(empty.type_index(), inner);
        // Every field absent, every read (the bool's one-byte slot too) safe.
        for f in empty.fields() {
            assert!(!empty.has(f));
            assert!(empty.get(f)?.is_none());
            assert!(empty.get_or_default(f)?.is_some());
        }
        assert!(empty.unknown_fields()?.is_empty());
        assert_eq!(v.ref_message(0, 99).err(), Some(BlockError::WrongType));
        // A reference past the block is an error, not a panic.
        let forged = (u32::MAX as u64) | (8u64 << 32);
        assert!(v.ref_message(forged, inner).is_err() && v.ref_bytes(forged).is_err());
        assert!(v.ref_array(forged, 8).is_err());
        Ok(())
    }
}
