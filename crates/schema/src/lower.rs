//! Descriptors -> tables. Walks a `FileDescriptorSet`, gives every message and
//! enum an index, resolves type names to indices, then asks `layout` for the
//! object layout of each message.

use std::collections::HashMap;

use prost_types::field_descriptor_proto::Label as PLabel;
use prost_types::{DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorSet};

use crate::editions::{Features, Presence};
use crate::layout;
use crate::options::{uninterpreted_placement, PLACEMENT_OPTION};
use crate::table::{
    Enum, EnumValue, Extension, Field, FieldFlags, Kind, Label, MessageFlags, Placement, Span,
    TableSet, NONE,
};
use crate::SchemaError;

struct MsgSrc<'a> {
    name: String,
    desc: &'a DescriptorProto,
    proto3: bool,
    /// The message's resolved features in an editions file (`None`: proto2
    /// or proto3, whose rules the field loop applies directly).
    features: Option<Features>,
}

/// An `extend` block's field, with where it was declared.
struct ExtSrc<'a> {
    /// The declaring scope (package or message full name).
    scope: String,
    desc: &'a FieldDescriptorProto,
    proto3: bool,
    features: Option<Features>,
}

/// What [`collect`] gathers, in declaration order.
#[derive(Default)]
struct Collected<'a> {
    msgs: Vec<MsgSrc<'a>>,
    enums: Vec<EnumSrc<'a>>,
    exts: Vec<ExtSrc<'a>>,
}

struct EnumSrc<'a> {
    name: String,
    desc: &'a EnumDescriptorProto,
    closed: bool,
}

/// Interns strings into the table set's pool.
#[derive(Default)]
pub(crate) struct Pool {
    pub(crate) bytes: Vec<u8>,
    seen: HashMap<Vec<u8>, Span>,
}

impl Pool {
    pub(crate) fn add(&mut self, s: &[u8]) -> Span {
        if let Some(span) = self.seen.get(s) {
            return *span;
        }
        let span = Span { start: self.bytes.len() as u32, len: s.len() as u32 };
        self.bytes.extend_from_slice(s);
        self.seen.insert(s.to_vec(), span);
        span
    }
}

/// Collects the messages and enums of one scope, nested ones after their
/// parent. `features`: the scope's resolved features in an editions file.
fn collect<'a>(
    prefix: &str,
    parent: Option<&'a DescriptorProto>,
    msgs: &'a [DescriptorProto],
    enums: &'a [EnumDescriptorProto],
    proto3: bool,
    features: Option<Features>,
    out: &mut Collected<'a>,
) -> Result<(), SchemaError> {
    for e in enums {
        let name = join(prefix, e.name());
        let closed = match features {
            None => !proto3,
            Some(f) => {
                let opts = e.options.as_ref().map(|o| &o.uninterpreted_option[..]).unwrap_or(&[]);
                f.with(opts, &|| name.clone())?.closed_enum
            }
        };
        out.enums.push(EnumSrc { name, desc: e, closed });
    }
    for m in msgs {
        let name = join(prefix, m.name());
        let mut own = None;
        if let Some(f) = features {
            let opts = m.options.as_ref().map(|o| &o.uninterpreted_option[..]).unwrap_or(&[]);
            let mut f = f.with(opts, &|| name.clone())?;
            // A map's entry message is the map field's: it takes the
            // field's features (UTF-8 checks of its key and value).
            if m.options.as_ref().and_then(|o| o.map_entry) == Some(true) {
                let suffix = format!(".{}", m.name());
                let field = parent.and_then(|p| {
                    p.field
                        .iter()
                        .find(|x| x.label() == PLabel::Repeated && x.type_name().ends_with(&suffix))
                });
                if let Some(opts) = field.and_then(|x| x.options.as_ref()) {
                    f = f.with(&opts.uninterpreted_option, &|| name.clone())?;
                }
            }
            own = Some(f);
        }
        out.msgs.push(MsgSrc { name: name.clone(), desc: m, proto3, features: own });
        for x in &m.extension {
            out.exts.push(ExtSrc { scope: name.clone(), desc: x, proto3, features: own });
        }
        collect(&name, Some(m), &m.nested_type, &m.enum_type, proto3, own, out)?;
    }
    Ok(())
}

/// `prefix.name`, or `name` at the root: a full name in a scope.
pub(crate) fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}.{name}")
    }
}

/// The proto3 JSON name rule (used when a descriptor carries no `json_name`).
pub(crate) fn json_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Builds the table set of every file in `set` (imports must be included).
pub(crate) fn lower(set: &FileDescriptorSet) -> Result<TableSet, SchemaError> {
    let mut all = Collected::default();
    let mut seen_files = std::collections::HashSet::new();
    for file in &set.file {
        if !seen_files.insert(file.name()) {
            continue; // the same file listed twice (merged sets): keep the first
        }
        let (proto3, features) = match file.syntax() {
            "" | "proto2" => (false, None),
            "proto3" => (true, None),
            // See `editions.rs`: the loaders mark editions files so, with
            // their features as uninterpreted options.
            "editions" => {
                let opts =
                    file.options.as_ref().map(|o| &o.uninterpreted_option[..]).unwrap_or(&[]);
                let f = Features::EDITION_DEFAULTS.with(opts, &|| file.name().to_owned())?;
                (false, Some(f))
            }
            other => {
                return Err(SchemaError::Unsupported(format!(
                    "{}: syntax \"{other}\" (protoplane reads proto2, proto3 and editions)",
                    file.name()
                )))
            }
        };
        for x in &file.extension {
            all.exts.push(ExtSrc { scope: file.package().to_owned(), desc: x, proto3, features });
        }
        collect(
            file.package(),
            None,
            &file.message_type,
            &file.enum_type,
            proto3,
            features,
            &mut all,
        )?;
    }
    let Collected { msgs, enums, exts } = all;
    let msg_idx: HashMap<&str, u32> =
        msgs.iter().enumerate().map(|(i, m)| (m.name.as_str(), i as u32)).collect();
    let enum_idx: HashMap<&str, u32> =
        enums.iter().enumerate().map(|(i, e)| (e.name.as_str(), i as u32)).collect();
    if msg_idx.len() != msgs.len() || enum_idx.len() != enums.len() {
        return Err(SchemaError::Unsupported("duplicate type name in descriptor set".into()));
    }

    let mut ts = TableSet::default();
    let mut pool = Pool::default();

    for e in &enums {
        let mut values: Vec<EnumValue> = Vec::new();
        for v in &e.desc.value {
            values.push(EnumValue { number: v.number(), name: pool.add(v.name().as_bytes()) });
        }
        // Stable sort keeps the first declared name of aliased numbers
        // (`allow_alias`) first: a lookup by number finds that one, a lookup
        // by name any of them (JSON input may spell any alias).
        values.sort_by_key(|v| v.number);
        let start = ts.enum_values.len() as u32;
        ts.enum_values.extend_from_slice(&values);
        ts.enums.push(Enum {
            name: pool.add(e.name.as_bytes()),
            values: Span { start, len: values.len() as u32 },
            closed: e.closed,
        });
    }

    for m in &msgs {
        let mut fields = Vec::with_capacity(m.desc.field.len());
        // Real oneofs get dense indices; synthetic ones (proto3 `optional`) vanish.
        let mut oneof_map: HashMap<i32, u32> = HashMap::new();
        let mut oneof_names = Vec::new();
        let mut has_required = false;
        for f in &m.desc.field {
            let err =
                |what: &str| SchemaError::Unsupported(format!("{}.{}: {what}", m.name, f.name()));
            let mut kind = Kind::from_u8(f.r#type() as u8).ok_or_else(|| err("unknown type"))?;
            let number = f.number();
            if !(1..=536_870_911).contains(&number) {
                return Err(err("field number out of range"));
            }
            // An editions field's features: its message's, its oneof's, its own.
            let features = match m.features {
                None => None,
                Some(mut ff) => {
                    let what = || format!("{}.{}", m.name, f.name());
                    if let Some(o) = f.oneof_index.and_then(|i| m.desc.oneof_decl.get(i as usize)) {
                        if let Some(opts) = &o.options {
                            ff = ff.with(&opts.uninterpreted_option, &what)?;
                        }
                    }
                    if let Some(opts) = &f.options {
                        ff = ff.with(&opts.uninterpreted_option, &what)?;
                    }
                    Some(ff)
                }
            };
            let label = match f.label() {
                PLabel::Optional
                    if features.is_some_and(|ff| ff.presence == Presence::LegacyRequired) =>
                {
                    has_required = true;
                    Label::Required
                }
                PLabel::Optional => Label::Optional,
                PLabel::Required => {
                    has_required = true;
                    Label::Required
                }
                PLabel::Repeated => Label::Repeated,
            };
            let type_name = f.type_name().strip_prefix('.').unwrap_or(f.type_name());
            // Editions spell a group as a message field encoded DELIMITED
            // (never a map, nor a map's value: entries are always
            // length-prefixed, whatever the file says).
            let in_entry = m.desc.options.as_ref().and_then(|o| o.map_entry) == Some(true);
            if kind == Kind::Message && !in_entry && features.is_some_and(|ff| ff.delimited) {
                let entry = msg_idx.get(type_name).is_some_and(|&i| {
                    msgs[i as usize].desc.options.as_ref().and_then(|o| o.map_entry) == Some(true)
                });
                if !entry {
                    kind = Kind::Group;
                }
            }
            let (sub, mut flags) =
                resolve(kind, type_name, &msg_idx, &enum_idx, &enums).map_err(|e| err(&e))?;
            if label == Label::Repeated {
                let packable = kind.is_scalar();
                let explicit = f.options.as_ref().and_then(|o| o.packed);
                let packed = match features {
                    Some(ff) => ff.packed,
                    None => explicit.unwrap_or(m.proto3),
                };
                if packable && packed {
                    flags |= FieldFlags::PACKED;
                }
                if kind == Kind::Message
                    && msgs[sub as usize].desc.options.as_ref().and_then(|o| o.map_entry)
                        == Some(true)
                {
                    flags |= FieldFlags::MAP;
                }
            }
            let synthetic = f.proto3_optional();
            let is_entry = m.desc.options.as_ref().and_then(|o| o.map_entry) == Some(true);
            let mut presence = NONE;
            if let (Some(oi), false) = (f.oneof_index, synthetic) {
                let next = oneof_map.len() as u32;
                presence = *oneof_map.entry(oi).or_insert_with(|| {
                    let name = m.desc.oneof_decl.get(oi as usize).map(|o| o.name()).unwrap_or("");
                    oneof_names.push(name.to_owned());
                    next
                });
                flags |= FieldFlags::ONEOF;
            } else if (m.proto3 || features.is_some_and(|ff| ff.presence == Presence::Implicit))
                && label == Label::Optional
                && !synthetic
                && !kind.is_message()
                && !is_entry
            {
                // proto3 singular scalar / string / bytes without `optional`
                // (map-entry key and value are always written instead).
                flags |= FieldFlags::IMPLICIT;
            }
            if kind == Kind::String && features.map_or(m.proto3, |ff| ff.utf8) {
                flags |= FieldFlags::UTF8;
            }
            if is_entry {
                flags |= FieldFlags::ALWAYS;
            }
            // `[(protoplane.placement) = DEVICE]` (see `options.rs` for how
            // the option reaches the descriptor).
            let placement = uninterpreted_placement(f.options.as_ref()).map_err(|v| {
                SchemaError::Placement(format!(
                    "{}.{}: ({PLACEMENT_OPTION}) = {v} is not a placement (HOST or DEVICE)",
                    m.name,
                    f.name()
                ))
            })?;
            if placement == Some(Placement::Device) {
                if !placeable(kind, label) {
                    return Err(SchemaError::Placement(format!(
                        "{}.{}: ({PLACEMENT_OPTION}) = DEVICE on a field of type {}; only \
                         string, bytes and repeated scalar fields can be placed on the device",
                        m.name,
                        f.name(),
                        describe(kind, label, FieldFlags(flags)),
                    )));
                }
                flags |= FieldFlags::DEVICE;
            }
            let name = pool.add(f.name().as_bytes());
            let json = match f.json_name.as_deref() {
                Some(j) if !j.is_empty() => j.to_owned(),
                _ => json_name(f.name()),
            };
            let json_name = pool.add(json.as_bytes());
            let mut default = 0u64;
            if kind == Kind::Enum {
                // proto2: an absent enum reads as its first declared value.
                if let Some(first) = enums[sub as usize].desc.value.first() {
                    default = first.number() as u32 as u64;
                }
            }
            if let Some(text) = f.default_value.as_deref() {
                flags |= FieldFlags::HAS_DEFAULT;
                default = parse_default(kind, text, sub, &enums, &mut pool)
                    .ok_or_else(|| err(&format!("bad default value {text:?}")))?;
            }
            fields.push(Field {
                number: number as u32,
                offset: 0,
                sub,
                presence,
                name,
                json_name,
                default,
                kind,
                label,
                flags: FieldFlags(flags),
            });
        }
        fields.sort_by_key(|f| f.number);
        if fields.windows(2).any(|w| w[0].number == w[1].number) {
            return Err(SchemaError::Unsupported(format!("{}: duplicate field number", m.name)));
        }
        let mut mflags = 0u16;
        if m.desc.options.as_ref().and_then(|o| o.map_entry) == Some(true) {
            mflags |= MessageFlags::MAP_ENTRY;
        }
        // Editions: a message whose fields default to implicit presence
        // writes a map entry it keeps as unknown the proto3 way.
        if m.proto3 || m.features.is_some_and(|f| f.presence == Presence::Implicit) {
            mflags |= MessageFlags::PROTO3;
        }
        if has_required {
            mflags |= MessageFlags::HAS_REQUIRED;
        }
        let name = pool.add(m.name.as_bytes());
        let names: Vec<Span> = oneof_names.iter().map(|n| pool.add(n.as_bytes())).collect();
        let message = layout::lay_out(&mut ts, name, fields, &names, MessageFlags(mflags));
        ts.messages.push(message);
    }
    for x in &exts {
        let f = x.desc;
        let full = join(&x.scope, f.name());
        let err = |what: &str| SchemaError::Unsupported(format!("extension {full}: {what}"));
        let extendee = f.extendee().strip_prefix('.').unwrap_or(f.extendee());
        // A set without the extended message (custom options extend
        // `descriptor.proto`'s, often left out of a set): nothing of that
        // type is ever read through these tables, so nothing to list.
        let Some(&extendee) = msg_idx.get(extendee) else { continue };
        let mut kind = Kind::from_u8(f.r#type() as u8).ok_or_else(|| err("unknown type"))?;
        let number = u32::try_from(f.number())
            .ok()
            .filter(|n| (1..=536_870_911).contains(n))
            .ok_or_else(|| err("field number out of range"))?;
        let features = match x.features {
            Some(ff) => Some(match &f.options {
                Some(o) => ff.with(&o.uninterpreted_option, &|| full.clone())?,
                None => ff,
            }),
            None => None,
        };
        let label = match f.label() {
            PLabel::Repeated => Label::Repeated,
            PLabel::Required => return Err(err("an extension cannot be required")),
            PLabel::Optional => Label::Optional,
        };
        let type_name = f.type_name().strip_prefix('.').unwrap_or(f.type_name());
        let (sub, mut flags) =
            resolve(kind, type_name, &msg_idx, &enum_idx, &enums).map_err(|e| err(&e))?;
        if kind == Kind::Message && features.is_some_and(|ff| ff.delimited) {
            kind = Kind::Group;
        }
        let packed = match features {
            Some(ff) => ff.packed,
            None => f.options.as_ref().and_then(|o| o.packed).unwrap_or(x.proto3),
        };
        if label == Label::Repeated && kind.is_scalar() && packed {
            flags |= FieldFlags::PACKED;
        }
        if kind == Kind::String && features.map_or(x.proto3, |ff| ff.utf8) {
            flags |= FieldFlags::UTF8;
        }
        let name = pool.add(full.as_bytes());
        ts.extensions.push(Extension {
            extendee,
            field: Field {
                number,
                offset: 0,
                sub,
                presence: NONE,
                name,
                json_name: name,
                default: 0,
                kind,
                label,
                flags: FieldFlags(flags),
            },
        });
    }
    ts.extensions.sort_by_key(|x| (x.extendee, x.field.number));
    let key = |x: &Extension| (x.extendee, x.field.number);
    if let Some(w) = ts.extensions.windows(2).find(|w| key(&w[0]) == key(&w[1])) {
        return Err(SchemaError::Unsupported(format!(
            "{}: extension number {} declared twice",
            msgs[w[0].extendee as usize].name, w[0].field.number
        )));
    }
    ts.strings = pool.bytes;
    ts.rebuild_index();
    Ok(ts)
}

/// A field's (or extension's) type reference: the message or enum index
/// it names, and `CLOSED_ENUM` for a closed enum's.
fn resolve(
    kind: Kind,
    type_name: &str,
    msg_idx: &HashMap<&str, u32>,
    enum_idx: &HashMap<&str, u32>,
    enums: &[EnumSrc<'_>],
) -> Result<(u32, u16), String> {
    Ok(match kind {
        Kind::Message | Kind::Group => (
            *msg_idx
                .get(type_name)
                .ok_or_else(|| format!("unresolved message type {type_name}"))?,
            0,
        ),
        Kind::Enum => {
            let i = *enum_idx
                .get(type_name)
                .ok_or_else(|| format!("unresolved enum type {type_name}"))?;
            (i, if enums[i as usize].closed { FieldFlags::CLOSED_ENUM } else { 0 })
        }
        _ => (NONE, 0),
    })
}

/// Whether a field of this kind and label can be placed on the device
/// (the rule of [`TableSet::set_placement`]).
pub(crate) fn placeable(kind: Kind, label: Label) -> bool {
    matches!(kind, Kind::String | Kind::Bytes) || (label == Label::Repeated && kind.is_scalar())
}

/// A field's type as `.proto` spells it, for messages (`repeated int32`, `map`).
pub(crate) fn describe(kind: Kind, label: Label, flags: FieldFlags) -> String {
    if flags.has(FieldFlags::MAP) {
        "map".to_owned()
    } else if label == Label::Repeated {
        format!("repeated {}", kind.proto_name())
    } else {
        kind.proto_name().to_owned()
    }
}

fn parse_default(
    kind: Kind,
    text: &str,
    sub: u32,
    enums: &[EnumSrc<'_>],
    pool: &mut Pool,
) -> Option<u64> {
    fn float(text: &str) -> Option<f64> {
        match text {
            "inf" => Some(f64::INFINITY),
            "-inf" => Some(f64::NEG_INFINITY),
            "nan" => Some(f64::NAN),
            t => t.parse().ok(),
        }
    }
    Some(match kind {
        Kind::Double => float(text)?.to_bits(),
        Kind::Float => (float(text)? as f32).to_bits() as u64,
        Kind::Int32 | Kind::SInt32 | Kind::SFixed32 => text.parse::<i32>().ok()? as u32 as u64,
        Kind::UInt32 | Kind::Fixed32 => text.parse::<u32>().ok()? as u64,
        Kind::Int64 | Kind::SInt64 | Kind::SFixed64 => text.parse::<i64>().ok()? as u64,
        Kind::UInt64 | Kind::Fixed64 => text.parse::<u64>().ok()?,
        Kind::Bool => match text {
            "true" => 1,
            "false" => 0,
            _ => return None,
        },
        Kind::Enum => {
            let e = enums.get(sub as usize)?;
            e.desc.value.iter().find(|v| v.name() == text)?.number() as u32 as u64
        }
        Kind::String => {
            let s = pool.add(text.as_bytes());
            ((s.start as u64) << 32) | s.len as u64
        }
        Kind::Bytes => {
            let s = pool.add(&unescape_c(text)?);
            ((s.start as u64) << 32) | s.len as u64
        }
        Kind::Message | Kind::Group => return None,
    })
}

/// Reverses protoc's C escaping of `bytes` defaults (`\n`, `\\`, `\ooo`, `\xHH`).
fn unescape_c(text: &str) -> Option<Vec<u8>> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = *b.get(i + 1)?;
        i += 2;
        match c {
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut v = (c - b'0') as u32;
                let mut n = 1;
                while n < 3 && i < b.len() && (b'0'..=b'7').contains(&b[i]) {
                    v = v * 8 + (b[i] - b'0') as u32;
                    i += 1;
                    n += 1;
                }
                out.push(v as u8);
            }
            b'x' | b'X' => {
                let mut v = 0u32;
                let mut n = 0;
                while n < 2 && i < b.len() && b[i].is_ascii_hexdigit() {
                    v = v * 16 + (b[i] as char).to_digit(16)?;
                    i += 1;
                    n += 1;
                }
                if n == 0 {
                    return None;
                }
                out.push(v as u8);
            }
            other => out.push(other),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_names_follow_the_proto3_rule() {
        assert_eq!(json_name("foo_bar_baz"), "fooBarBaz");
        assert_eq!(json_name("f1"), "f1");
        assert_eq!(json_name("_leading"), "Leading");
    }

    #[test]
    fn c_escapes_round_trip() {
        assert_eq!(unescape_c(r"a\nb\\c\001\x7f\'").as_deref(), Some(&b"a\nb\\c\x01\x7f'"[..]));
        assert_eq!(unescape_c(r"\"), None);
    }
}
