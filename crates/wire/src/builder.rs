//! Builder: writes a block directly, field by field, with no intermediate
//! message objects. This is the response path of DESIGN.md: the application
//! lays its data out in a block (RPCAcc's pre-serialization) and the engine
//! encodes it later with [`crate::Encoder`].
//!
//! Handles ([`MessageBuilder`]) are plain offsets, `Copy`, so a sub-message
//! handle stays valid while the block grows.

use std::fmt;

use protoplane_schema::{Field, FieldFlags, Kind, TableSet};

use crate::block::{Block, Ref, MAX_LEN};
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
        Self::reuse(ts, type_index, Block::new())
    }

    /// Starts a block in a recycled allocation (see [`crate::Region`]).
    pub fn reuse(ts: &'t TableSet, type_index: u32, mut block: Block) -> Result<Self, BuildError> {
        let msg =
            ts.messages().get(type_index as usize).ok_or(BuildError::UnknownType(type_index))?;
        let root = block.start(type_index, msg.size, 0);
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
            self.block.put_u32(at.obj + case as usize, f.number);
        } else {
            self.block.set_hasbit(at.obj, f.presence);
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
        let off = self.block.alloc_copy(data);
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
                self.block.put_u64(at.obj + f.offset as usize, bits);
            } else {
                self.block.put_scalar(at.obj + f.offset as usize, f.kind.slot_size(), bits);
            }
        } else {
            let data = bytes_of(f, &value).ok_or(BuildError::TypeMismatch(number))?;
            let r = self.store_bytes(number, data)?;
            self.block.put_u64(at.obj + f.offset as usize, r.pack());
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
                .grow_array(slot, size as usize, 1)
                .map_err(|()| BuildError::TooLarge(number))?;
            self.block.put_scalar(w, size, bits);
        } else {
            let data = bytes_of(f, &value).ok_or(BuildError::TypeMismatch(number))?;
            let r = self.store_bytes(number, data)?;
            let w = self.block.grow_array(slot, 8, 1).map_err(|()| BuildError::TooLarge(number))?;
            self.block.put_u64(w, r.pack());
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
                self.block.u32_at(at.obj + case as usize) == f.number
            } else {
                self.block.hasbit(at.obj, f.presence)
            };
            let r = Ref::unpack(self.block.u64_at(slot));
            if existing && r.offset != 0 {
                return Ok(MessageBuilder { obj: r.offset as usize, msg: f.sub });
            }
        }
        let obj = self.block.alloc_zeroed(sub.size as usize);
        self.check(number)?;
        let r = Ref { offset: obj as u32, len: sub.size, wire: false, device: false };
        if f.is_repeated() {
            let w = self.block.grow_array(slot, 8, 1).map_err(|()| BuildError::TooLarge(number))?;
            self.block.put_u64(w, r.pack());
        } else {
            self.block.put_u64(slot, r.pack());
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
        self.block.shrink_array(at.obj + map.offset as usize, 1);
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
            .grow_array(slot, 1, u32::try_from(wire.len()).map_err(|_| BuildError::TooLarge(0))?)
            .map_err(|()| BuildError::TooLarge(0))?;
        self.block.buf[w..w + wire.len()].copy_from_slice(wire);
        self.check(0)
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
