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
use crate::encode::{hasbit, le_bits, scalar_bits, slot_u32, slot_u64, Source};
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
                scalar_bits(self.obj, f.offset, f.kind) != 0
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
            return Ok(Value::scalar(f.kind, scalar_bits(self.obj, f.offset, f.kind)));
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
