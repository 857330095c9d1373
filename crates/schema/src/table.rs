//! The table format. Everything here is plain data: no pointers, no boxes,
//! references between types are `u32` indices (`NONE` when absent).
//!
//! # Object layout
//!
//! Decoding a message of type `M` produces one *object*: a fixed-size record
//! of `M.size` bytes inside a linearized block (see the `wire` crate). Its
//! layout is computed once here and recorded as byte offsets in the tables:
//!
//! ```text
//!  0                4*H        4*(H+O)                                        size
//!  +----------------+-----------+--------+--------+--------+-----+----------+--------+
//!  | hasbits        | oneof     | 8-byte | 4-byte | 1-byte | pad | 8-byte   | unknown|
//!  | H x u32 words  | cases     | scalars| scalars| scalars|     | ref slots| ref    |
//!  |                | O x u32   |        |        |        |     | + oneof  |        |
//!  |                |           |        |        |        |     | unions   |        |
//!  +----------------+-----------+--------+--------+--------+-----+----------+--------+
//!   [hasbits]                    [scalar slots]                   [reference slots]
//! ```
//!
//! * every singular field outside a oneof owns one hasbit (also proto3
//!   implicit-presence fields: the bit says "seen on the wire / set by the
//!   builder"; the encoder still skips zero values of implicit fields);
//! * a oneof owns a case word (the field number of the member that is set,
//!   0 for none) and one shared 8-byte union slot that all members use;
//! * a reference slot is `(offset: u32, len: u32)`, little endian; the top
//!   two bits of `len` are flags (device placement, wire view). The `wire`
//!   crate documents the exact encoding;
//! * repeated fields use one reference slot (`offset` of the element array,
//!   `len` = element count); presence = count > 0.
//!
//! All little-endian, all offsets relative to the start of the block, so the
//! layout means the same thing in any process and after any `memcpy`.

use std::collections::HashMap;

/// "No index": used for absent sub-table, absent presence, etc.
pub const NONE: u32 = u32::MAX;

/// A range into one of the flat arrays of a [`TableSet`] (or the string pool).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    /// First element.
    pub start: u32,
    /// Number of elements.
    pub len: u32,
}

impl Span {
    /// `start..start+len` as a `usize` range.
    #[inline]
    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.start as usize + self.len as usize
    }
}

/// Protobuf wire types (the low three bits of a tag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum WireType {
    /// Base-128 varint.
    Varint = 0,
    /// Eight little-endian bytes.
    Fixed64 = 1,
    /// Varint length followed by that many bytes.
    Len = 2,
    /// Start of a group (deprecated encoding of sub-messages).
    StartGroup = 3,
    /// End of a group.
    EndGroup = 4,
    /// Four little-endian bytes.
    Fixed32 = 5,
}

impl WireType {
    /// Maps the low three bits of a tag; 6 and 7 are invalid.
    #[inline]
    pub fn from_bits(bits: u32) -> Option<WireType> {
        Some(match bits {
            0 => WireType::Varint,
            1 => WireType::Fixed64,
            2 => WireType::Len,
            3 => WireType::StartGroup,
            4 => WireType::EndGroup,
            5 => WireType::Fixed32,
            _ => return None,
        })
    }
}

/// Value type of a field. Discriminants are `FieldDescriptorProto.Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// `double`
    Double = 1,
    /// `float`
    Float = 2,
    /// `int64`
    Int64 = 3,
    /// `uint64`
    UInt64 = 4,
    /// `int32`
    Int32 = 5,
    /// `fixed64`
    Fixed64 = 6,
    /// `fixed32`
    Fixed32 = 7,
    /// `bool`
    Bool = 8,
    /// `string`
    String = 9,
    /// `group` (a sub-message delimited by start/end-group tags)
    Group = 10,
    /// a sub-message
    Message = 11,
    /// `bytes`
    Bytes = 12,
    /// `uint32`
    UInt32 = 13,
    /// an enum (stored as `int32`)
    Enum = 14,
    /// `sfixed32`
    SFixed32 = 15,
    /// `sfixed64`
    SFixed64 = 16,
    /// `sint32` (zigzag)
    SInt32 = 17,
    /// `sint64` (zigzag)
    SInt64 = 18,
}

impl Kind {
    /// Decodes the descriptor's numeric type.
    pub fn from_u8(v: u8) -> Option<Kind> {
        use Kind::*;
        Some(match v {
            1 => Double,
            2 => Float,
            3 => Int64,
            4 => UInt64,
            5 => Int32,
            6 => Fixed64,
            7 => Fixed32,
            8 => Bool,
            9 => String,
            10 => Group,
            11 => Message,
            12 => Bytes,
            13 => UInt32,
            14 => Enum,
            15 => SFixed32,
            16 => SFixed64,
            17 => SInt32,
            18 => SInt64,
            _ => return None,
        })
    }

    /// The wire type a non-packed occurrence of this kind uses.
    #[inline]
    pub fn wire_type(self) -> WireType {
        use Kind::*;
        match self {
            Int64 | UInt64 | Int32 | Bool | UInt32 | Enum | SInt32 | SInt64 => WireType::Varint,
            Double | Fixed64 | SFixed64 => WireType::Fixed64,
            Float | Fixed32 | SFixed32 => WireType::Fixed32,
            String | Bytes | Message => WireType::Len,
            Group => WireType::StartGroup,
        }
    }

    /// Size of the in-object slot (and of one element of a repeated array).
    /// References (strings, bytes, messages) take an 8-byte reference slot.
    #[inline]
    pub fn slot_size(self) -> u32 {
        use Kind::*;
        match self {
            Double | Int64 | UInt64 | Fixed64 | SFixed64 | SInt64 => 8,
            Float | Int32 | Fixed32 | UInt32 | Enum | SFixed32 | SInt32 => 4,
            Bool => 1,
            String | Bytes | Message | Group => 8,
        }
    }

    /// Scalars are stored inline; everything else behind a reference.
    #[inline]
    pub fn is_scalar(self) -> bool {
        !matches!(self, Kind::String | Kind::Bytes | Kind::Message | Kind::Group)
    }

    /// Messages and groups.
    #[inline]
    pub fn is_message(self) -> bool {
        matches!(self, Kind::Message | Kind::Group)
    }

    /// The `.proto` spelling.
    pub fn proto_name(self) -> &'static str {
        use Kind::*;
        match self {
            Double => "double",
            Float => "float",
            Int64 => "int64",
            UInt64 => "uint64",
            Int32 => "int32",
            Fixed64 => "fixed64",
            Fixed32 => "fixed32",
            Bool => "bool",
            String => "string",
            Group => "group",
            Message => "message",
            Bytes => "bytes",
            UInt32 => "uint32",
            Enum => "enum",
            SFixed32 => "sfixed32",
            SFixed64 => "sfixed64",
            SInt32 => "sint32",
            SInt64 => "sint64",
        }
    }
}

/// Field cardinality.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Label {
    /// Singular (proto2 `optional`, proto3 singular or `optional`).
    Optional = 1,
    /// proto2 `required`.
    Required = 2,
    /// `repeated` (and maps).
    Repeated = 3,
}

/// Where a field's bytes live after decoding (RPCAcc's placement bit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// In the host region, readable by the application.
    Host,
    /// In the engine-private device region; the host sees a device reference.
    Device,
}

/// Per-field flag bits (`Field::flags`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FieldFlags(pub u16);

impl FieldFlags {
    /// Repeated scalar encoded packed.
    pub const PACKED: u16 = 1 << 0;
    /// proto3 implicit presence: encode only when the value is non-zero.
    pub const IMPLICIT: u16 = 1 << 1;
    /// `string` that must be valid UTF-8 (proto3).
    pub const UTF8: u16 = 1 << 2;
    /// Enum with closed semantics (proto2): unknown values go to unknown fields.
    pub const CLOSED_ENUM: u16 = 1 << 3;
    /// RPCAcc placement bit: the field lives in the device region.
    pub const DEVICE: u16 = 1 << 4;
    /// Member of a (real, non-synthetic) oneof; `presence` is the oneof index.
    pub const ONEOF: u16 = 1 << 5;
    /// A `map<K, V>` field; `sub` is the map-entry message.
    pub const MAP: u16 = 1 << 6;
    /// Carries a proto2 `[default = …]`.
    pub const HAS_DEFAULT: u16 = 1 << 7;
    /// Always encoded, even when absent (map-entry key and value).
    pub const ALWAYS: u16 = 1 << 8;

    /// Tests one bit.
    #[inline]
    pub fn has(self, bit: u16) -> bool {
        self.0 & bit != 0
    }
}

/// One field entry: everything the decoder and encoder need, 48 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// Field number, 1 ..= 2^29 - 1.
    pub number: u32,
    /// Byte offset of the slot in the object (oneof members: the union slot).
    pub offset: u32,
    /// Message table index (`Message`/`Group`), enum index (`Enum`), else `NONE`.
    pub sub: u32,
    /// Hasbit index (singular), oneof index (`ONEOF`), `NONE` (repeated).
    pub presence: u32,
    /// Declared name, in the string pool.
    pub name: Span,
    /// proto3 JSON name, in the string pool.
    pub json_name: Span,
    /// Default value: scalar bits (as the slot would hold them, zero-extended)
    /// or, for `string`/`bytes`, `(start << 32) | len` into the string pool.
    pub default: u64,
    /// Value type.
    pub kind: Kind,
    /// Cardinality.
    pub label: Label,
    /// [`FieldFlags`] bits.
    pub flags: FieldFlags,
}

impl Field {
    /// `repeated` (including maps).
    #[inline]
    pub fn is_repeated(&self) -> bool {
        self.label == Label::Repeated
    }

    /// Where this field's data is placed.
    #[inline]
    pub fn placement(&self) -> Placement {
        if self.flags.has(FieldFlags::DEVICE) {
            Placement::Device
        } else {
            Placement::Host
        }
    }

    /// The tag of a non-packed occurrence: `number << 3 | wire_type`.
    #[inline]
    pub fn tag(&self) -> u32 {
        (self.number << 3) | self.kind.wire_type() as u32
    }
}

/// How a field's value is converted between wire and slot: the part of
/// [`Kind`] the hot loops need, one `match` instead of several.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum ValueOp {
    /// `int32`, open `enum`: varint; 32-bit slot; negative values are
    /// sign-extended to ten bytes on the wire.
    #[default]
    Int32,
    /// `uint32`: varint, 32-bit slot, no sign extension.
    UInt32,
    /// `int64`, `uint64`: varint, 64-bit slot.
    Int64,
    /// `sint32`: zigzag varint, 32-bit slot.
    SInt32,
    /// `sint64`: zigzag varint, 64-bit slot.
    SInt64,
    /// `bool`: varint, 1-byte slot holding 0 or 1.
    Bool,
    /// closed (proto2) `enum`: like `Int32`, values the enum does not
    /// declare go to the unknown fields.
    ClosedEnum,
    /// `fixed32`, `sfixed32`, `float`: four little-endian bytes.
    Fixed32,
    /// `fixed64`, `sfixed64`, `double`: eight little-endian bytes.
    Fixed64,
    /// `bytes` (and `string` without UTF-8 checking): a reference.
    Bytes,
    /// proto3 `string`: a reference, UTF-8 checked on decode.
    Utf8,
    /// A length-delimited sub-message.
    Message,
    /// A group.
    Group,
}

/// Where a field's presence is recorded: the part of `label` + `flags` the
/// hot loops need.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum Card {
    /// Singular with a hasbit (`FieldOp::presence` is the bit index).
    #[default]
    Hasbit,
    /// Singular proto3 implicit presence: has a hasbit, encoded only when
    /// the value is non-zero / non-empty.
    Implicit,
    /// Oneof member (`FieldOp::presence` is the case word's byte offset).
    Oneof,
    /// Map-entry key or value: always encoded.
    Always,
    /// Repeated, unpacked on the wire (strings, messages, unpacked scalars).
    Repeated,
    /// Repeated scalar, packed on the wire.
    Packed,
}

/// The hot-path form of a [`Field`], derived from it whenever a table set
/// is built or loaded (never serialized, so it adds nothing to the format):
/// the canonical tag already varint-encoded, and the value and presence
/// handling resolved into two small enums. `TableSet::ops` is parallel to
/// `TableSet::fields` (same index). 24 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FieldOp {
    /// The canonical tag's varint bytes, little endian (low `tag_len` bytes).
    /// Packed fields: the length-delimited tag.
    pub tag_bytes: u64,
    /// The canonical tag (`number << 3 | wire type`).
    pub tag: u32,
    /// Slot offset in the object.
    pub offset: u32,
    /// Hasbit index (`Hasbit`, `Implicit`, `Always`), case word offset
    /// (`Oneof`), unused for repeated fields.
    pub presence: u32,
    /// Bytes of `tag_bytes` in use, 1..=5.
    pub tag_len: u8,
    /// Value conversion.
    pub value: ValueOp,
    /// Presence handling.
    pub card: Card,
    /// Slot (element) size in bytes: 1, 4 or 8.
    pub size: u8,
}

impl FieldOp {
    /// Derives the op of `f`, a field of a message whose oneofs are `oneofs`.
    pub fn of(f: &Field, oneofs: &[Oneof]) -> FieldOp {
        let value = match f.kind {
            Kind::Int32 => ValueOp::Int32,
            Kind::Enum if f.flags.has(FieldFlags::CLOSED_ENUM) => ValueOp::ClosedEnum,
            Kind::Enum => ValueOp::Int32,
            Kind::UInt32 => ValueOp::UInt32,
            Kind::Int64 | Kind::UInt64 => ValueOp::Int64,
            Kind::SInt32 => ValueOp::SInt32,
            Kind::SInt64 => ValueOp::SInt64,
            Kind::Bool => ValueOp::Bool,
            Kind::Fixed32 | Kind::SFixed32 | Kind::Float => ValueOp::Fixed32,
            Kind::Fixed64 | Kind::SFixed64 | Kind::Double => ValueOp::Fixed64,
            Kind::String if f.flags.has(FieldFlags::UTF8) => ValueOp::Utf8,
            Kind::String | Kind::Bytes => ValueOp::Bytes,
            Kind::Message => ValueOp::Message,
            Kind::Group => ValueOp::Group,
        };
        let packed = f.is_repeated() && f.flags.has(FieldFlags::PACKED) && f.kind.is_scalar();
        let card = if f.is_repeated() {
            if packed {
                Card::Packed
            } else {
                Card::Repeated
            }
        } else if f.flags.has(FieldFlags::ONEOF) {
            Card::Oneof
        } else if f.flags.has(FieldFlags::ALWAYS) {
            Card::Always
        } else if f.flags.has(FieldFlags::IMPLICIT) {
            Card::Implicit
        } else {
            Card::Hasbit
        };
        let presence = match card {
            Card::Oneof => oneofs.get(f.presence as usize).map_or(0, |o| o.case_offset),
            Card::Repeated | Card::Packed => 0,
            _ => f.presence,
        };
        let wt = if packed { WireType::Len } else { f.kind.wire_type() };
        let tag = (f.number << 3) | wt as u32;
        let (mut tag_bytes, mut tag_len, mut v) = (0u64, 0u8, tag);
        loop {
            let byte = (v & 0x7f) as u64 | if v >= 0x80 { 0x80 } else { 0 };
            tag_bytes |= byte << (8 * tag_len);
            tag_len += 1;
            v >>= 7;
            if v == 0 {
                break;
            }
        }
        FieldOp {
            tag_bytes,
            tag,
            offset: f.offset,
            presence,
            tag_len,
            value,
            card,
            size: f.kind.slot_size() as u8,
        }
    }
}

/// Per-message flag bits (`Message::flags`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MessageFlags(pub u16);

impl MessageFlags {
    /// Synthesized `map<K, V>` entry type (field 1 = key, field 2 = value).
    pub const MAP_ENTRY: u16 = 1 << 0;
    /// Declared in a proto3 file.
    pub const PROTO3: u16 = 1 << 1;
    /// Has at least one `required` field.
    pub const HAS_REQUIRED: u16 = 1 << 2;

    /// Tests one bit.
    #[inline]
    pub fn has(self, bit: u16) -> bool {
        self.0 & bit != 0
    }
}

/// One message type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message {
    /// Fully qualified name without the leading dot (`pkg.Outer.Inner`).
    pub name: Span,
    /// Fields, sorted by number, in [`TableSet::fields`].
    pub fields: Span,
    /// Oneofs (real ones only) in [`TableSet::oneofs`].
    pub oneofs: Span,
    /// Fast lookup by number: `dense[n - 1]` is the index (within `fields`)
    /// plus one, or 0; numbers past `dense.len` use binary search.
    pub dense: Span,
    /// Required-field mask over the hasbit words, in [`TableSet::words`].
    pub required: Span,
    /// Object size in bytes (a multiple of 8).
    pub size: u32,
    /// Number of hasbit words at offset 0.
    pub hasbit_words: u32,
    /// Offset of the unknown-fields reference slot.
    pub unknown_offset: u32,
    /// [`MessageFlags`] bits.
    pub flags: MessageFlags,
}

/// One (non-synthetic) oneof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Oneof {
    /// Declared name.
    pub name: Span,
    /// Offset of the case word (u32: field number of the set member, or 0).
    pub case_offset: u32,
    /// Offset of the 8-byte union slot shared by all members.
    pub data_offset: u32,
}

/// One enum type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enum {
    /// Fully qualified name.
    pub name: Span,
    /// Values sorted by number, in [`TableSet::enum_values`]. Aliases
    /// (`allow_alias`) share a number: the first declared comes first.
    pub values: Span,
    /// proto2 closed enum.
    pub closed: bool,
}

/// One enum value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnumValue {
    /// Numeric value.
    pub number: i32,
    /// Declared name.
    pub name: Span,
}

/// A proto2 or editions extension: a field of the `extendee` message
/// declared outside it (`extend Foo { ... }`).
///
/// Extendees get no slots for their extensions: the decoder keeps an
/// extension's values where it keeps any field it has no slot for, in the
/// message's unknown-field bytes, and the encoder writes them back from
/// there unchanged. The table names them for the formats that spell them
/// by name (JSON's and text format's `[full.name]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extension {
    /// Index of the extended message.
    pub extendee: u32,
    /// The field: `name` and `json_name` are the extension's full name
    /// (`pkg.Scope.name`); `offset` is 0 and `presence` [`NONE`] (no slot).
    pub field: Field,
}

/// A complete, pointer-free schema: all message and enum types of a set of
/// `.proto` files with their imports.
#[derive(Clone, Debug, Default)]
pub struct TableSet {
    pub(crate) messages: Vec<Message>,
    pub(crate) fields: Vec<Field>,
    /// Derived, never serialized: `ops[i]` is the hot-path form of `fields[i]`.
    pub(crate) ops: Vec<FieldOp>,
    pub(crate) oneofs: Vec<Oneof>,
    pub(crate) enums: Vec<Enum>,
    pub(crate) enum_values: Vec<EnumValue>,
    pub(crate) dense: Vec<u16>,
    pub(crate) words: Vec<u32>,
    /// Sorted by extendee, then number.
    pub(crate) extensions: Vec<Extension>,
    pub(crate) strings: Vec<u8>,
    /// Derived, never serialized: full name -> message / enum index.
    pub(crate) message_index: HashMap<String, u32>,
    pub(crate) enum_index: HashMap<String, u32>,
}

impl TableSet {
    /// All message tables; a message's index is its position here.
    #[inline]
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Message table by index.
    #[inline]
    pub fn message(&self, index: u32) -> &Message {
        &self.messages[index as usize]
    }

    /// All enum tables.
    #[inline]
    pub fn enums(&self) -> &[Enum] {
        &self.enums
    }

    /// Enum table by index.
    #[inline]
    pub fn enum_type(&self, index: u32) -> &Enum {
        &self.enums[index as usize]
    }

    /// The fields of a message, sorted by number.
    #[inline]
    pub fn fields(&self, message: &Message) -> &[Field] {
        &self.fields[message.fields.range()]
    }

    /// The hot-path ops of a message's fields (parallel to [`TableSet::fields`]).
    #[inline]
    pub fn ops(&self, message: &Message) -> &[FieldOp] {
        &self.ops[message.fields.range()]
    }

    /// Index (within the message's fields) of field `number`: the
    /// decoder's hot lookup. Small numbers are a direct index (ProtoAcc/upb
    /// style dense table); the rest binary search.
    #[inline(always)]
    pub fn field_slot(&self, message: &Message, number: u32) -> Option<usize> {
        if number.wrapping_sub(1) < message.dense.len {
            let slot = self.dense[message.dense.start as usize + number as usize - 1];
            return (slot as usize).checked_sub(1);
        }
        self.fields[message.fields.range()].binary_search_by_key(&number, |f| f.number).ok()
    }

    /// The oneofs of a message.
    #[inline]
    pub fn oneofs(&self, message: &Message) -> &[Oneof] {
        &self.oneofs[message.oneofs.range()]
    }

    /// The values of an enum, sorted by number (aliases side by side, the
    /// first declared first).
    #[inline]
    pub fn enum_values(&self, e: &Enum) -> &[EnumValue] {
        &self.enum_values[e.values.range()]
    }

    /// Required-field mask words (one per hasbit word) of a message.
    #[inline]
    pub fn required_mask(&self, message: &Message) -> &[u32] {
        &self.words[message.required.range()]
    }

    /// A string from the pool. Names are UTF-8 by construction; default
    /// values of `bytes` fields may not be, use [`TableSet::bytes`] for those.
    #[inline]
    pub fn str(&self, s: Span) -> &str {
        std::str::from_utf8(self.bytes(s)).unwrap_or("")
    }

    /// Raw bytes from the pool.
    #[inline]
    pub fn bytes(&self, s: Span) -> &[u8] {
        self.strings.get(s.range()).unwrap_or(&[])
    }

    /// The default value of a `string` / `bytes` field.
    #[inline]
    pub fn default_bytes(&self, field: &Field) -> &[u8] {
        let span = Span { start: (field.default >> 32) as u32, len: field.default as u32 };
        self.bytes(span)
    }

    /// Fully qualified message name.
    #[inline]
    pub fn message_name(&self, index: u32) -> &str {
        self.str(self.messages[index as usize].name)
    }

    /// Looks up a message by fully qualified name (a leading dot is accepted).
    pub fn message_by_name(&self, name: &str) -> Option<u32> {
        self.message_index.get(name.strip_prefix('.').unwrap_or(name)).copied()
    }

    /// The message names closest to `name` (edit distance, at most a third
    /// of its length; a name's last component matching counts as close),
    /// best first, at most `n`: for "did you mean" in errors.
    pub fn nearest_message_names(&self, name: &str, n: usize) -> Vec<&str> {
        let name = name.strip_prefix('.').unwrap_or(name);
        let short = |s: &str| s.rsplit('.').next().unwrap_or(s).to_ascii_lowercase();
        let mut scored: Vec<(usize, &str)> = (0..self.messages.len() as u32)
            .map(|i| self.message_name(i))
            .filter_map(|cand| {
                let d = edit_distance(name, cand);
                let same_short = short(cand) == short(name);
                (d <= (name.len() / 3).max(2) || same_short).then_some((d, cand))
            })
            .collect();
        scored.sort();
        scored.into_iter().take(n).map(|(_, c)| c).collect()
    }

    /// The extensions of a message, by number.
    pub fn extensions(&self, message_index: u32) -> &[Extension] {
        let start = self.extensions.partition_point(|x| x.extendee < message_index);
        let len = self.extensions[start..].partition_point(|x| x.extendee == message_index);
        &self.extensions[start..start + len]
    }

    /// An extension of a message by its full name (a leading dot is accepted).
    pub fn extension_by_name(&self, message_index: u32, name: &str) -> Option<&Extension> {
        let name = name.strip_prefix('.').unwrap_or(name);
        self.extensions(message_index).iter().find(|x| self.str(x.field.name) == name)
    }

    /// Looks up an enum by fully qualified name (a leading dot is accepted).
    pub fn enum_by_name(&self, name: &str) -> Option<u32> {
        self.enum_index.get(name.strip_prefix('.').unwrap_or(name)).copied()
    }

    /// Finds a field by number: the decoder's hot lookup. Small numbers are a
    /// direct index (ProtoAcc/upb style dense table); the rest binary search.
    #[inline]
    pub fn field_by_number(&self, message: &Message, number: u32) -> Option<&Field> {
        let fields = &self.fields[message.fields.range()];
        if number.wrapping_sub(1) < message.dense.len {
            let slot = self.dense[message.dense.start as usize + number as usize - 1];
            return if slot == 0 { None } else { fields.get(slot as usize - 1) };
        }
        fields.binary_search_by_key(&number, |f| f.number).ok().map(|i| &fields[i])
    }

    /// Index within the message's field list of a field number.
    pub fn field_index(&self, message: &Message, number: u32) -> Option<usize> {
        self.fields(message).binary_search_by_key(&number, |f| f.number).ok()
    }

    /// Finds a field by declared name or JSON name.
    pub fn field_by_name(&self, message: &Message, name: &str) -> Option<&Field> {
        self.fields(message)
            .iter()
            .find(|f| self.str(f.name) == name)
            .or_else(|| self.fields(message).iter().find(|f| self.str(f.json_name) == name))
    }

    /// Name of an enum value, if the value is declared (of aliases, the
    /// first declared).
    pub fn enum_value_name(&self, e: &Enum, number: i32) -> Option<&str> {
        let values = self.enum_values(e);
        let i = values.partition_point(|v| v.number < number);
        values.get(i).filter(|v| v.number == number).map(|v| self.str(v.name))
    }

    /// Number of an enum value by name.
    pub fn enum_value_by_name(&self, e: &Enum, name: &str) -> Option<i32> {
        self.enum_values(e).iter().find(|v| self.str(v.name) == name).map(|v| v.number)
    }

    /// Whether a closed enum declares `number`.
    #[inline]
    pub fn enum_contains(&self, e: &Enum, number: i32) -> bool {
        self.enum_values(e).binary_search_by_key(&number, |v| v.number).is_ok()
    }

    /// Sets the placement bit of a field (RPCAcc's automatic field updating:
    /// `move_to_device` / `move_to_host`). The only run-time mutation of a
    /// table set. Returns `false` if the field does not exist or cannot be
    /// placed on the device (only `string`, `bytes` and repeated scalars can:
    /// they are the payloads a compute unit works on; fields of map entries
    /// cannot).
    pub fn set_placement(&mut self, message: u32, number: u32, placement: Placement) -> bool {
        let Some(m) = self.messages.get(message as usize).copied() else { return false };
        let Some(idx) = self.field_index(&m, number) else { return false };
        let field = &mut self.fields[m.fields.start as usize + idx];
        // A map entry's key and value stay on the host: an entry can be
        // re-encoded into the unknown fields on decode (a closed enum value
        // it does not know), which needs its bytes at hand.
        let entry = m.flags.has(MessageFlags::MAP_ENTRY);
        if !crate::lower::placeable(field.kind, field.label)
            || (entry && placement == Placement::Device)
        {
            return false;
        }
        match placement {
            Placement::Host => field.flags.0 &= !FieldFlags::DEVICE,
            Placement::Device => field.flags.0 |= FieldFlags::DEVICE,
        }
        self.rebuild_ops();
        true
    }

    /// Maximum nesting depth of a message type counting itself as 1; `None`
    /// for types that can recurse (their depth is bounded only at decode time).
    pub fn nesting_depth(&self, message: u32) -> Option<u32> {
        // 0 = unvisited, 1 = on stack, 2 = done; memo holds the result.
        fn visit(ts: &TableSet, m: u32, state: &mut [u8], memo: &mut [Option<u32>]) -> Option<u32> {
            match state[m as usize] {
                1 => return None,
                2 => return memo[m as usize],
                _ => {}
            }
            state[m as usize] = 1;
            let mut depth = Some(1u32);
            for f in ts.fields(&ts.messages[m as usize]) {
                if f.kind.is_message() {
                    let d = visit(ts, f.sub, state, memo);
                    depth = match (depth, d) {
                        (Some(a), Some(b)) => Some(a.max(b + 1)),
                        _ => None,
                    };
                }
            }
            state[m as usize] = 2;
            memo[m as usize] = depth;
            depth
        }
        let n = self.messages.len();
        visit(self, message, &mut vec![0; n], &mut vec![None; n])
    }

    /// Derives `ops` from `fields` (after building or loading a table set).
    pub(crate) fn rebuild_ops(&mut self) {
        let mut ops = vec![FieldOp::default(); self.fields.len()];
        for m in &self.messages {
            let oneofs = self.oneofs.get(m.oneofs.range()).unwrap_or(&[]);
            let (Some(fields), Some(out)) =
                (self.fields.get(m.fields.range()), ops.get_mut(m.fields.range()))
            else {
                continue;
            };
            for (f, op) in fields.iter().zip(out) {
                *op = FieldOp::of(f, oneofs);
            }
        }
        self.ops = ops;
    }

    pub(crate) fn rebuild_index(&mut self) {
        self.rebuild_ops();
        self.message_index =
            (0..self.messages.len() as u32).map(|i| (self.message_name(i).to_owned(), i)).collect();
        self.enum_index = (0..self.enums.len() as u32)
            .map(|i| (self.str(self.enums[i as usize].name).to_owned(), i))
            .collect();
    }
}

/// Levenshtein distance over bytes (names are ASCII identifiers).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, &ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(!ca.eq_ignore_ascii_case(&cb));
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}
