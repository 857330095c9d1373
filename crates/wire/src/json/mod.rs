//! The proto3 JSON mapping, both directions, over views and builders.
//!
//! Output follows protobuf's canonical mapping as protobuf's own printers
//! emit it by default: lowerCamelCase JSON names, fields in number order,
//! only present fields (implicit-presence fields when non-zero), 64-bit
//! integers as strings, enums by name (numbers for undeclared values),
//! bytes as padded standard base64, non-finite floats as "NaN" /
//! "Infinity" / "-Infinity", maps as objects (a key received twice shows
//! its last value). Unknown fields are not represented.
//!
//! Input accepts what protobuf's parsers accept: JSON or declared names,
//! integers as numbers or strings (no spaces around them), enums by name or
//! number, standard or URL-safe base64 with or without padding, `null` for
//! "absent" (but for a `Value`, whose null is a value), and refuses what
//! they refuse: two members of one oneof, `null` as a map value, a bool as
//! a string.
//!
//! Well-known types (Timestamp, Duration, FieldMask, the wrappers, Struct,
//! Value, ListValue, Any, NullValue) have JSON forms of their own: see
//! `json/wkt.rs`.

use std::fmt::Write as _;

use base64::Engine as _;
use protoplane_schema::{Field, FieldFlags, Kind, TableSet};
use serde_json::Value as Json;

use crate::builder::{BuildError, Builder, MessageBuilder};
use crate::error::BlockError;
use crate::extensions::{self, Raw};
use crate::view::{MessageView, Value};

mod wkt;

/// A JSON input that does not fit the schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonError(pub String);

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for JsonError {}

impl From<BuildError> for JsonError {
    fn from(e: BuildError) -> Self {
        JsonError(e.to_string())
    }
}

/// Why a message could not be printed as JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrintError {
    /// The block is malformed.
    Block(BlockError),
    /// A value with no JSON form (a well-known type out of its range).
    NoJsonForm(NoJsonForm),
}

impl From<BlockError> for PrintError {
    fn from(e: BlockError) -> Self {
        PrintError::Block(e)
    }
}

impl std::fmt::Display for PrintError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PrintError::Block(e) => e.fmt(f),
            PrintError::NoJsonForm(why) => write!(f, "no JSON form: {why}"),
        }
    }
}

impl std::error::Error for PrintError {}

/// Why a value has no JSON form ([`PrintError::NoJsonForm`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NoJsonForm {
    /// A Timestamp outside 0001-01-01 … 9999-12-31, or nanoseconds outside
    /// 0 … 999,999,999.
    Timestamp,
    /// A Duration past ±315,576,000,000 s, nanoseconds past ±999,999,999 or
    /// of the other sign than the seconds.
    Duration,
    /// A FieldMask path that would not come back the same from its
    /// lowerCamelCase form.
    FieldMaskPath,
    /// A Value with no kind set.
    ValueKind,
    /// A Value holding NaN or an infinity.
    NonFiniteValue,
    /// An Any whose type URL names no loaded message.
    AnyType,
    /// An Any whose bytes do not decode as the message its URL names.
    AnyValue,
    /// An extension whose bytes (kept with the unknown fields) do not parse.
    Extension,
}

impl std::fmt::Display for NoJsonForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NoJsonForm::Timestamp => "a Timestamp outside 0001-01-01 … 9999-12-31",
            NoJsonForm::Duration => "a Duration out of range or of mixed sign",
            NoJsonForm::FieldMaskPath => "a FieldMask path with no lowerCamelCase form",
            NoJsonForm::ValueKind => "a Value with no kind set",
            NoJsonForm::NonFiniteValue => "a Value holding NaN or an infinity",
            NoJsonForm::AnyType => "an Any of a type that is not loaded",
            NoJsonForm::AnyValue => "an Any whose value does not decode as its type",
            NoJsonForm::Extension => "an extension whose bytes do not parse",
        })
    }
}

/// Appends the JSON form of a message to `out`.
pub fn to_json(view: &MessageView<'_>, out: &mut String) -> Result<(), PrintError> {
    write_message(view, out, 0)
}

fn write_message(view: &MessageView<'_>, out: &mut String, depth: u32) -> Result<(), PrintError> {
    if depth > 200 {
        return Err(BlockError::TooDeep.into());
    }
    let ts = view.tables();
    if let Some(w) = wkt::of(ts, view.type_index()) {
        return wkt::write(w, view, out, depth);
    }
    out.push('{');
    let mut first = true;
    for f in view.fields() {
        if !view.has(f) {
            continue;
        }
        if !first {
            out.push(',');
        }
        first = false;
        write_str(out, ts.str(f.json_name).as_bytes());
        out.push(':');
        if f.flags.has(FieldFlags::MAP) {
            write_map(view, f, out, depth)?;
        } else if f.is_repeated() {
            out.push('[');
            let rep = view.repeated(f)?;
            for i in 0..rep.len() {
                if i > 0 {
                    out.push(',');
                }
                write_value(ts, f, rep.get(i)?, out, depth)?;
            }
            out.push(']');
        } else if let Some(v) = view.get(f)? {
            write_value(ts, f, v, out, depth)?;
        }
    }
    let exts = ts.extensions(view.type_index());
    if !exts.is_empty() {
        write_extensions(view, exts, &mut first, out, depth)?;
    }
    out.push('}');
    Ok(())
}

/// The extensions set in `view` (kept with its unknown fields), as
/// `"[full.name]": value` members after the fields.
fn write_extensions(
    view: &MessageView<'_>,
    exts: &[protoplane_schema::Extension],
    first: &mut bool,
    out: &mut String,
    depth: u32,
) -> Result<(), PrintError> {
    let unknown = view.unknown_fields()?;
    if unknown.is_empty() {
        return Ok(());
    }
    let ts = view.tables();
    let bad = |_| PrintError::NoJsonForm(NoJsonForm::Extension);
    for x in exts {
        let f = &x.field;
        let values = extensions::values(f, unknown).map_err(bad)?;
        if values.is_empty() {
            continue;
        }
        if !std::mem::take(first) {
            out.push(',');
        }
        write_str(out, format!("[{}]", ts.str(f.name)).as_bytes());
        out.push(':');
        if f.is_repeated() {
            out.push('[');
        }
        for (i, raw) in values.into_iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            match raw {
                Raw::Bits(bits) => {
                    write_value(ts, f, extensions::scalar(f.kind, bits), out, depth)?
                }
                Raw::Bytes(b) if f.kind == Kind::String => {
                    write_value(ts, f, Value::String(b), out, depth)?
                }
                Raw::Bytes(b) => write_value(ts, f, Value::Bytes(b), out, depth)?,
                Raw::Message(body) => {
                    let block = crate::decode(ts, f.sub, &body, &crate::DecodeOptions::default())
                        .map_err(|_| PrintError::NoJsonForm(NoJsonForm::Extension))?;
                    let sub = MessageView::new(ts, crate::Source::owned(block.as_bytes()), f.sub)?;
                    write_message(&sub, out, depth + 1)?;
                }
            }
        }
        if f.is_repeated() {
            out.push(']');
        }
    }
    Ok(())
}

fn write_map(
    view: &MessageView<'_>,
    f: &Field,
    out: &mut String,
    depth: u32,
) -> Result<(), PrintError> {
    let ts = view.tables();
    let rep = view.repeated(f)?;
    let entry = ts.message(f.sub);
    let (Some(kf), Some(vf)) = (ts.field_by_number(entry, 1), ts.field_by_number(entry, 2)) else {
        return Err(BlockError::WrongType.into());
    };
    // Last occurrence of a key wins: collect keys, keep the last index of each.
    let mut entries: Vec<(String, MessageView<'_>)> = Vec::with_capacity(rep.len());
    for i in 0..rep.len() {
        let Some(e) = rep.get(i)?.as_message() else { continue };
        let key = match e.get_or_default(kf)? {
            Some(Value::String(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::Bool(b)) => b.to_string(),
            Some(v) => v.as_i128().map(|x| x.to_string()).unwrap_or_default(),
            None => String::new(),
        };
        match entries.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = e,
            None => entries.push((key, e)),
        }
    }
    out.push('{');
    for (i, (key, e)) in entries.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_str(out, key.as_bytes());
        out.push(':');
        match e.get_or_default(vf)? {
            Some(v) => write_value(ts, vf, v, out, depth)?,
            None => out.push_str("{}"), // absent message value
        }
    }
    out.push('}');
    Ok(())
}

fn write_value(
    ts: &TableSet,
    f: &Field,
    v: Value<'_>,
    out: &mut String,
    depth: u32,
) -> Result<(), PrintError> {
    match v {
        Value::Bool(b) => out.push_str(if b { "true" } else { "false" }),
        Value::I32(x) => {
            let _ = write!(out, "{x}");
        }
        Value::U32(x) => {
            let _ = write!(out, "{x}");
        }
        Value::I64(x) => {
            let _ = write!(out, "\"{x}\"");
        }
        Value::U64(x) => {
            let _ = write!(out, "\"{x}\"");
        }
        Value::F32(x) => write_float(out, x as f64, |out| {
            let _ = write!(out, "{x}");
        }),
        Value::F64(x) => write_float(out, x, |out| {
            let _ = write!(out, "{x}");
        }),
        Value::Enum(_) if ts.str(ts.enum_type(f.sub).name) == wkt::NULL_VALUE => {
            out.push_str("null")
        }
        Value::Enum(n) => match ts.enum_value_name(ts.enum_type(f.sub), n) {
            Some(name) => write_str(out, name.as_bytes()),
            None => {
                let _ = write!(out, "{n}");
            }
        },
        Value::String(b) => write_str(out, b),
        Value::Bytes(b) => {
            out.push('"');
            base64::engine::general_purpose::STANDARD.encode_string(b, out);
            out.push('"');
        }
        Value::Message(m) => write_message(&m, out, depth + 1)?,
    }
    Ok(())
}

fn write_float(out: &mut String, x: f64, finite: impl FnOnce(&mut String)) {
    if x.is_nan() {
        out.push_str("\"NaN\"");
    } else if x.is_infinite() {
        out.push_str(if x > 0.0 { "\"Infinity\"" } else { "\"-Infinity\"" });
    } else {
        finite(out);
    }
}

/// A JSON string literal. Runs of bytes that need no escape are copied
/// whole (only `"`, `\\` and control characters do; UTF-8's multi-byte
/// sequences never contain them); each invalid UTF-8 sequence prints as
/// U+FFFD, as `String::from_utf8_lossy` would have it.
fn write_str(out: &mut String, s: &[u8]) {
    out.reserve(s.len() + 2);
    out.push('"');
    // Almost always valid: one fast check, then one pass.
    if let Ok(text) = std::str::from_utf8(s) {
        escape_into(out, text);
        out.push('"');
        return;
    }
    for chunk in s.utf8_chunks() {
        escape_into(out, chunk.valid());
        if !chunk.invalid().is_empty() {
            out.push(char::REPLACEMENT_CHARACTER);
        }
    }
    out.push('"');
}

/// Whether any of the 8 bytes of `w` needs a JSON escape (a control
/// character, `"` or `\\`): the classic SWAR zero-byte tests, so plain text
/// is skipped eight bytes at a time.
#[inline]
fn needs_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    let quote = (w ^ (ONES * b'"' as u64)).wrapping_sub(ONES) & !(w ^ (ONES * b'"' as u64)) & HIGH;
    let slash =
        (w ^ (ONES * b'\\' as u64)).wrapping_sub(ONES) & !(w ^ (ONES * b'\\' as u64)) & HIGH;
    below | quote | slash != 0
}

fn escape_into(out: &mut String, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = text.as_bytes();
    let (mut i, mut run) = (0, 0);
    while i < bytes.len() {
        // Plain text is skipped a word at a time.
        if let Some(w) = bytes.get(i..i + 8) {
            if !needs_escape(u64::from_le_bytes(w.try_into().unwrap_or([0; 8]))) {
                i += 8;
                continue;
            }
        }
        let c = bytes[i];
        let esc = match c {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            8 => "\\b",
            12 => "\\f",
            0..=0x1f => "",
            _ => {
                i += 1;
                continue;
            }
        };
        out.push_str(&text[run..i]);
        if esc.is_empty() {
            out.push_str("\\u00");
            out.push(HEX[(c >> 4) as usize] as char);
            out.push(HEX[(c & 15) as usize] as char);
        } else {
            out.push_str(esc);
        }
        i += 1;
        run = i;
    }
    out.push_str(&text[run..]);
}

/// Deepest message level `from_json` builds (the root is level 0): the
/// encoder's default depth limit, so whatever parses also encodes.
const MAX_DEPTH: u32 = 100;

/// How [`from_json_with`] reads its input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JsonOptions {
    /// Skip members that name no field, and enum values given by a name
    /// the enum does not declare (a singular field stays absent, a
    /// repeated field's element and a map's entry are left out), instead
    /// of refusing the input: what protobuf's `ignore_unknown_fields` does,
    /// for readers of JSON written by a newer schema.
    pub ignore_unknown_fields: bool,
}

/// Builds a block of `type_index` from a JSON text.
pub fn from_json(ts: &TableSet, type_index: u32, text: &str) -> Result<crate::Block, JsonError> {
    from_json_with(ts, type_index, text, &JsonOptions::default())
}

/// [`from_json`] with options.
pub fn from_json_with(
    ts: &TableSet,
    type_index: u32,
    text: &str,
    opts: &JsonOptions,
) -> Result<crate::Block, JsonError> {
    let json: Json =
        serde_json::from_str(text).map_err(|e| JsonError(format!("invalid JSON: {e}")))?;
    let mut b = Builder::new(ts, type_index)?;
    let root = b.root();
    fill(ts, &mut b, root, &json, 0, opts)?;
    Ok(b.finish())
}

/// Whether `v`, for field `f`, is an enum name the enum does not declare
/// and `opts` says to skip such values.
fn skipped_enum(ts: &TableSet, f: &Field, v: &Json, opts: &JsonOptions) -> bool {
    opts.ignore_unknown_fields
        && f.kind == Kind::Enum
        && matches!(v, Json::String(name) if ts.enum_value_by_name(ts.enum_type(f.sub), name).is_none())
}

fn fill(
    ts: &TableSet,
    b: &mut Builder<'_>,
    at: MessageBuilder,
    json: &Json,
    depth: u32,
    opts: &JsonOptions,
) -> Result<(), JsonError> {
    if depth > MAX_DEPTH {
        return Err(JsonError("nesting too deep".into()));
    }
    if let Some(w) = wkt::of(ts, at.type_index()) {
        return wkt::parse(w, ts, b, at, json, depth, opts);
    }
    let msg = ts.message(at.type_index());
    let Json::Object(map) = json else {
        return Err(JsonError(format!("{}: expected an object", ts.message_name(at.type_index()))));
    };
    // The oneofs a member was given for (two members of one is an error).
    let mut oneofs: Vec<u32> = Vec::new();
    for (key, value) in map {
        if let Some(name) = key.strip_prefix('[').and_then(|k| k.strip_suffix(']')) {
            let Some(x) = ts.extension_by_name(at.type_index(), name) else {
                if opts.ignore_unknown_fields {
                    continue;
                }
                let name = ts.message_name(at.type_index());
                return Err(JsonError(format!("{name}: no extension named {key:?}")));
            };
            if value.is_null() && (x.field.is_repeated() || !wkt::takes_null(ts, &x.field)) {
                continue;
            }
            let mut wire = Vec::new();
            extension_wire(ts, &x.field, value, depth, opts, &mut wire)
                .map_err(|e| JsonError(format!("extension {key:?}: {}", e.0)))?;
            b.push_unknown(at, &wire)?;
            continue;
        }
        let Some(f) = ts.field_by_name(msg, key) else {
            if opts.ignore_unknown_fields {
                continue;
            }
            let name = ts.message_name(at.type_index());
            return Err(JsonError(format!("{name}: no field named {key:?}")));
        };
        // `null` is "absent", but for a singular `Value` (or `NullValue`).
        if value.is_null() && (f.is_repeated() || !wkt::takes_null(ts, f)) {
            continue;
        }
        if f.flags.has(FieldFlags::ONEOF) {
            if oneofs.contains(&f.presence) {
                return Err(JsonError(format!(
                    "{}: two members of one oneof ({key:?} and another)",
                    ts.message_name(at.type_index())
                )));
            }
            oneofs.push(f.presence);
        }
        let ctx = |e: JsonError| JsonError(format!("field {key:?}: {}", e.0));
        if f.flags.has(FieldFlags::MAP) {
            let Json::Object(entries) = value else {
                return Err(ctx(JsonError("expected an object for a map".into())));
            };
            let entry = ts.message(f.sub);
            let kf =
                ts.field_by_number(entry, 1).ok_or_else(|| JsonError("bad map entry".into()))?;
            let vf =
                ts.field_by_number(entry, 2).ok_or_else(|| JsonError("bad map entry".into()))?;
            if depth + 1 > MAX_DEPTH {
                return Err(JsonError("nesting too deep".into()));
            }
            for (k, v) in entries {
                if skipped_enum(ts, vf, v, opts) {
                    continue;
                }
                let e = b.message(at, f.number)?;
                let key_json = match kf.kind {
                    Kind::String => Json::String(k.clone()),
                    Kind::Bool => match k.as_str() {
                        "true" => Json::Bool(true),
                        "false" => Json::Bool(false),
                        _ => return Err(ctx(JsonError(format!("bad bool map key {k:?}")))),
                    },
                    _ => Json::String(k.clone()),
                };
                set_one(ts, b, e, kf, &key_json, depth, opts).map_err(ctx)?;
                if v.is_null() && !wkt::takes_null(ts, vf) {
                    return Err(ctx(JsonError(format!("null as the value of map key {k:?}"))));
                }
                // The entry is a message level of its own on the wire.
                set_one(ts, b, e, vf, v, depth + 1, opts).map_err(ctx)?;
            }
        } else if f.is_repeated() {
            let Json::Array(items) = value else {
                return Err(ctx(JsonError("expected an array".into())));
            };
            for item in items {
                if f.kind.is_message() {
                    let sub = b.message(at, f.number)?;
                    fill(ts, b, sub, item, depth + 1, opts).map_err(ctx)?;
                } else if !skipped_enum(ts, f, item, opts) {
                    let v = scalar(ts, f, item).map_err(ctx)?;
                    b.push(at, f.number, v.as_value())?;
                }
            }
        } else {
            set_one(ts, b, at, f, value, depth, opts).map_err(ctx)?;
        }
    }
    Ok(())
}

/// The wire form of extension `f`'s JSON value (kept, like the decoder
/// keeps extensions, with the message's unknown fields).
fn extension_wire(
    ts: &TableSet,
    f: &Field,
    v: &Json,
    depth: u32,
    opts: &JsonOptions,
    out: &mut Vec<u8>,
) -> Result<(), JsonError> {
    let items = match v {
        Json::Array(items) if f.is_repeated() => &items[..],
        _ if f.is_repeated() => return Err(JsonError("expected an array".into())),
        _ => std::slice::from_ref(v),
    };
    for item in items {
        if f.kind.is_message() {
            if depth + 1 > MAX_DEPTH {
                return Err(JsonError("nesting too deep".into()));
            }
            let mut sub = Builder::new(ts, f.sub)?;
            let root = sub.root();
            fill(ts, &mut sub, root, item, depth + 1, opts)?;
            let body = crate::encode(ts, f.sub, sub.finish().as_bytes(), &Default::default())
                .map_err(|e| JsonError(e.to_string()))?;
            extensions::push_message(out, f, &body);
        } else if !skipped_enum(ts, f, item, opts) {
            let owned = scalar(ts, f, item)?;
            if !extensions::push_scalar(out, f, &owned.as_value()) {
                return Err(JsonError(format!(
                    "value {item} does not fit {}",
                    f.kind.proto_name()
                )));
            }
        }
    }
    Ok(())
}

fn set_one(
    ts: &TableSet,
    b: &mut Builder<'_>,
    at: MessageBuilder,
    f: &Field,
    v: &Json,
    depth: u32,
    opts: &JsonOptions,
) -> Result<(), JsonError> {
    if f.kind.is_message() {
        let sub = b.message(at, f.number)?;
        return fill(ts, b, sub, v, depth + 1, opts);
    }
    if skipped_enum(ts, f, v, opts) {
        return Ok(());
    }
    let owned = scalar(ts, f, v)?;
    b.set(at, f.number, owned.as_value())?;
    Ok(())
}

/// A parsed non-message value that owns its bytes.
enum Owned {
    V(Value<'static>),
    S(Vec<u8>, bool),
}

impl Owned {
    fn as_value(&self) -> Value<'_> {
        match self {
            Owned::V(v) => *v,
            Owned::S(b, true) => Value::String(b),
            Owned::S(b, false) => Value::Bytes(b),
        }
    }
}

fn scalar(ts: &TableSet, f: &Field, v: &Json) -> Result<Owned, JsonError> {
    let bad = || JsonError(format!("value {v} does not fit {}", f.kind.proto_name()));
    let int = |lo: i128, hi: i128| -> Result<i128, JsonError> {
        let x = match v {
            Json::Number(n) => {
                if let Some(i) = n.as_i64() {
                    i as i128
                } else if let Some(u) = n.as_u64() {
                    u as i128
                } else {
                    let f = n.as_f64().ok_or_else(bad)?;
                    if f.fract() != 0.0 || !f.is_finite() {
                        return Err(bad());
                    }
                    f as i128
                }
            }
            Json::String(s) => s.parse::<i128>().map_err(|_| bad())?,
            _ => return Err(bad()),
        };
        if x < lo || x > hi {
            return Err(bad());
        }
        Ok(x)
    };
    let float = || -> Result<f64, JsonError> {
        match v {
            Json::Number(n) => n.as_f64().ok_or_else(bad),
            Json::String(s) => match s.as_str() {
                "NaN" => Ok(f64::NAN),
                "Infinity" => Ok(f64::INFINITY),
                "-Infinity" => Ok(f64::NEG_INFINITY),
                t => t.parse::<f64>().map_err(|_| bad()),
            },
            _ => Err(bad()),
        }
    };
    Ok(Owned::V(match f.kind {
        Kind::Bool => match v {
            Json::Bool(b) => Value::Bool(*b),
            _ => return Err(bad()),
        },
        Kind::Int32 | Kind::SInt32 | Kind::SFixed32 => {
            Value::I32(int(i32::MIN as i128, i32::MAX as i128)? as i32)
        }
        Kind::Int64 | Kind::SInt64 | Kind::SFixed64 => {
            Value::I64(int(i64::MIN as i128, i64::MAX as i128)? as i64)
        }
        Kind::UInt32 | Kind::Fixed32 => Value::U32(int(0, u32::MAX as i128)? as u32),
        Kind::UInt64 | Kind::Fixed64 => Value::U64(int(0, u64::MAX as i128)? as u64),
        Kind::Float => {
            let x = float()?;
            if x.is_finite() && !(x as f32).is_finite() {
                return Err(bad());
            }
            Value::F32(x as f32)
        }
        Kind::Double => Value::F64(float()?),
        Kind::Enum => {
            let e = ts.enum_type(f.sub);
            match v {
                Json::Null if ts.str(e.name) == wkt::NULL_VALUE => Value::Enum(0),
                Json::String(name) => Value::Enum(ts.enum_value_by_name(e, name).ok_or_else(bad)?),
                _ => Value::Enum(int(i32::MIN as i128, i32::MAX as i128)? as i32),
            }
        }
        Kind::String => match v {
            Json::String(s) => return Ok(Owned::S(s.as_bytes().to_vec(), true)),
            _ => return Err(bad()),
        },
        Kind::Bytes => match v {
            Json::String(s) => return Ok(Owned::S(decode_base64(s).ok_or_else(bad)?, false)),
            _ => return Err(bad()),
        },
        Kind::Message | Kind::Group => return Err(bad()),
    }))
}

fn decode_base64(s: &str) -> Option<Vec<u8>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    // Padding or not, and the unused low bits of the last character
    // ignored, as protobuf's parsers do.
    let lenient = GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true);
    let std = GeneralPurpose::new(&base64::alphabet::STANDARD, lenient);
    let url = GeneralPurpose::new(&base64::alphabet::URL_SAFE, lenient);
    std.decode(s).ok().or_else(|| url.decode(s).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `write_str` must produce, one char at a time.
    fn reference(s: &[u8]) -> String {
        let mut out = String::from("\"");
        for c in String::from_utf8_lossy(s).chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    #[test]
    fn strings_escape_like_the_char_by_char_rule_at_every_position() {
        let specials: [&[u8]; 9] =
            [b"\"", b"\\", b"\n", b"\x01", b"\x1f", b"\x7f", "é".as_bytes(), b"\xff", b" "];
        for len in 0..20 {
            for (k, sp) in specials.iter().enumerate() {
                for at in 0..=len {
                    let mut s: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                    s.splice(at..at, sp.iter().copied());
                    let mut out = String::new();
                    write_str(&mut out, &s);
                    assert_eq!(out, reference(&s), "len {len} special {k} at {at}");
                }
            }
        }
    }
}
