//! The well-known types' JSON forms (the proto3 JSON mapping's special
//! cases), both ways: a `Timestamp` is an RFC 3339 string, a `Duration` a
//! decimal number of seconds with an `s`, a `FieldMask` its paths in
//! lowerCamelCase joined by commas, a wrapper its bare value, a `Struct`
//! an object, a `Value` any JSON value, a `ListValue` an array, an `Any`
//! its message's object with an `@type` member (or, for a well-known type
//! inside, `{"@type": …, "value": <its JSON form>}`), and the `NullValue`
//! enum `null`.
//!
//! Values with no JSON form (a Timestamp outside years 1 to 9999, a
//! Duration past ±10,000 years, nanoseconds out of range or of the wrong
//! sign, a non-finite number in a `Value`, a field mask path that would not
//! come back the same) are refused when printing, as protobuf's printers
//! refuse them; input that is not in the canonical form is refused when
//! parsing.

use std::fmt::Write as _;

use protoplane_schema::TableSet;
use serde_json::Value as Json;

use super::{
    fill, scalar, write_map, write_message, write_str, write_value, JsonError, JsonOptions,
    NoJsonForm, Owned, PrintError,
};
use crate::builder::{Builder, MessageBuilder};
use crate::error::BlockError;
use crate::view::{MessageView, Value};

/// A well-known type with a JSON form of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wkt {
    Timestamp,
    Duration,
    FieldMask,
    Struct,
    Value,
    ListValue,
    Any,
    /// `DoubleValue`, `Int64Value`, … : the bare value of field 1.
    Wrapper,
}

/// The enum whose one value prints as `null`.
pub(super) const NULL_VALUE: &str = "google.protobuf.NullValue";

/// The well-known type `type_index` is, if it is one with a form of its own.
pub(super) fn of(ts: &TableSet, type_index: u32) -> Option<Wkt> {
    let name = ts.message_name(type_index).strip_prefix("google.protobuf.")?;
    Some(match name {
        "Timestamp" => Wkt::Timestamp,
        "Duration" => Wkt::Duration,
        "FieldMask" => Wkt::FieldMask,
        "Struct" => Wkt::Struct,
        "Value" => Wkt::Value,
        "ListValue" => Wkt::ListValue,
        "Any" => Wkt::Any,
        "DoubleValue" | "FloatValue" | "Int64Value" | "UInt64Value" | "Int32Value"
        | "UInt32Value" | "BoolValue" | "StringValue" | "BytesValue" => Wkt::Wrapper,
        _ => return None,
    })
}

/// Whether a field of this type takes JSON `null` as a value (a `Value`,
/// whose null is a value, and the `NullValue` enum) rather than as
/// "absent".
pub(super) fn takes_null(ts: &TableSet, f: &protoplane_schema::Field) -> bool {
    match f.kind {
        protoplane_schema::Kind::Enum => ts.str(ts.enum_type(f.sub).name) == NULL_VALUE,
        k if k.is_message() => ts.message_name(f.sub) == "google.protobuf.Value",
        _ => false,
    }
}

fn unrepresentable(why: NoJsonForm) -> PrintError {
    PrintError::NoJsonForm(why)
}

fn int_field(view: &MessageView<'_>, number: u32) -> Result<i128, BlockError> {
    let Some(f) = view.field(number) else { return Err(BlockError::WrongType) };
    Ok(view.get_or_default(f)?.and_then(|v| v.as_i128()).unwrap_or(0))
}

// --- Printing ---------------------------------------------------------------

/// Seconds of 0001-01-01T00:00:00Z and of 9999-12-31T23:59:59Z.
const MIN_SECONDS: i128 = -62_135_596_800;
const MAX_SECONDS: i128 = 253_402_300_799;
/// ±10,000 years of seconds, the Duration's range.
const MAX_DURATION: i128 = 315_576_000_000;

// Out of line: kept out of the frame of `write_message`, which recurses
// once per level of nesting.
#[inline(never)]
pub(super) fn write(
    w: Wkt,
    view: &MessageView<'_>,
    out: &mut String,
    depth: u32,
) -> Result<(), PrintError> {
    let ts = view.tables();
    match w {
        Wkt::Timestamp => {
            let (secs, nanos) = (int_field(view, 1)?, int_field(view, 2)?);
            if !(MIN_SECONDS..=MAX_SECONDS).contains(&secs) || !(0..1_000_000_000).contains(&nanos)
            {
                return Err(unrepresentable(NoJsonForm::Timestamp));
            }
            let days = secs.div_euclid(86_400);
            let rem = secs.rem_euclid(86_400);
            let (y, m, d) = civil_from_days(days as i64);
            let _ = write!(
                out,
                "\"{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
                rem / 3600,
                rem / 60 % 60,
                rem % 60
            );
            write_fraction(out, nanos as u32);
            out.push_str("Z\"");
        }
        Wkt::Duration => {
            let (secs, nanos) = (int_field(view, 1)?, int_field(view, 2)?);
            if !(-MAX_DURATION..=MAX_DURATION).contains(&secs)
                || !(-999_999_999..=999_999_999).contains(&nanos)
                || (secs > 0 && nanos < 0)
                || (secs < 0 && nanos > 0)
            {
                return Err(unrepresentable(NoJsonForm::Duration));
            }
            out.push('"');
            if secs < 0 || nanos < 0 {
                out.push('-');
            }
            let _ = write!(out, "{}", secs.abs());
            write_fraction(out, nanos.unsigned_abs() as u32);
            out.push_str("s\"");
        }
        Wkt::FieldMask => {
            let Some(f) = view.field(1) else { return Err(BlockError::WrongType.into()) };
            let paths = view.repeated(f)?;
            let mut joined = String::new();
            for i in 0..paths.len() {
                if i > 0 {
                    joined.push(',');
                }
                let p = paths.get(i)?;
                let p = std::str::from_utf8(p.as_bytes().unwrap_or_default())
                    .map_err(|_| unrepresentable(NoJsonForm::FieldMaskPath))?;
                joined.push_str(&camel(p).ok_or(unrepresentable(NoJsonForm::FieldMaskPath))?);
            }
            write_str(out, joined.as_bytes());
        }
        Wkt::Wrapper => {
            let Some(f) = view.field(1) else { return Err(BlockError::WrongType.into()) };
            match view.get_or_default(f)? {
                Some(v) => write_value(ts, f, v, out, depth)?,
                None => return Err(BlockError::WrongType.into()),
            }
        }
        Wkt::Struct => {
            let Some(f) = view.field(1) else { return Err(BlockError::WrongType.into()) };
            write_map(view, f, out, depth)?;
        }
        Wkt::ListValue => {
            let Some(f) = view.field(1) else { return Err(BlockError::WrongType.into()) };
            let items = view.repeated(f)?;
            out.push('[');
            for i in 0..items.len() {
                if i > 0 {
                    out.push(',');
                }
                match items.get(i)? {
                    Value::Message(m) => write_message(&m, out, depth + 1)?,
                    _ => return Err(BlockError::WrongType.into()),
                }
            }
            out.push(']');
        }
        Wkt::Value => {
            let set = view.fields().iter().find(|f| view.has(f));
            let Some(f) = set else {
                return Err(unrepresentable(NoJsonForm::ValueKind));
            };
            match (f.number, view.get(f)?) {
                (1, _) => out.push_str("null"),
                (2, Some(Value::F64(x))) if !x.is_finite() => {
                    return Err(unrepresentable(NoJsonForm::NonFiniteValue))
                }
                (_, Some(v)) => write_value(ts, f, v, out, depth)?,
                (_, None) => return Err(BlockError::WrongType.into()),
            }
        }
        Wkt::Any => write_any(view, out, depth)?,
    }
    Ok(())
}

/// `.fffffffff` with 3, 6 or 9 digits, whichever shows `nanos` exactly;
/// nothing for 0.
fn write_fraction(out: &mut String, nanos: u32) {
    let (v, digits) = match nanos {
        0 => return,
        n if n % 1_000_000 == 0 => (n / 1_000_000, 3),
        n if n % 1000 == 0 => (n / 1000, 6),
        n => (n, 9),
    };
    let _ = write!(out, ".{v:0digits$}");
}

/// Whether an Any holding a message of `ty` carries it as `"value"` (the
/// well-known types, `Empty` among them) rather than as its fields.
fn in_value_member(ts: &TableSet, ty: u32) -> bool {
    of(ts, ty).is_some() || ts.message_name(ty) == "google.protobuf.Empty"
}

fn write_any(view: &MessageView<'_>, out: &mut String, depth: u32) -> Result<(), PrintError> {
    let ts = view.tables();
    let url = match view.field(1).map(|f| view.get_or_default(f)).transpose()? {
        Some(Some(v)) => v.as_bytes().unwrap_or_default(),
        _ => &[],
    };
    let value = match view.field(2).map(|f| view.get_or_default(f)).transpose()? {
        Some(Some(v)) => v.as_bytes().unwrap_or_default(),
        _ => &[],
    };
    if url.is_empty() && value.is_empty() {
        out.push_str("{}");
        return Ok(());
    }
    let url = std::str::from_utf8(url).map_err(|_| unrepresentable(NoJsonForm::AnyType))?;
    let ty = type_of_url(ts, url).ok_or(unrepresentable(NoJsonForm::AnyType))?;
    let mut block = crate::Block::new();
    crate::Decoder::new()
        .decode_into(ts, ty, value, &crate::DecodeOptions::default(), &mut block)
        .map_err(|_| unrepresentable(NoJsonForm::AnyValue))?;
    let inner = MessageView::new(ts, crate::encode::Source::owned(block.as_bytes()), ty)?;
    out.push_str("{\"@type\":");
    write_str(out, url.as_bytes());
    if in_value_member(ts, ty) {
        out.push_str(",\"value\":");
        write_message(&inner, out, depth + 1)?;
        out.push('}');
        return Ok(());
    }
    let mut body = String::new();
    write_message(&inner, &mut body, depth + 1)?;
    if body.len() > 2 {
        out.push(',');
        out.push_str(&body[1..]);
    } else {
        out.push('}');
    }
    Ok(())
}

/// The message an Any's type URL names (the part after its last `/`).
fn type_of_url(ts: &TableSet, url: &str) -> Option<u32> {
    let (_, name) = url.rsplit_once('/')?;
    ts.message_by_name(name)
}

/// `foo_bar.baz_qux` as `fooBar.bazQux`; `None` when the result would not
/// convert back to the same path (upper-case letters, `_` not followed by a
/// lower-case letter, a `,`, which separates paths).
fn camel(path: &str) -> Option<String> {
    let mut out = String::with_capacity(path.len());
    let mut chars = path.chars();
    while let Some(c) = chars.next() {
        match c {
            'A'..='Z' | ',' => return None,
            '_' => match chars.next() {
                Some(n @ 'a'..='z') => out.push(n.to_ascii_uppercase()),
                _ => return None,
            },
            c => out.push(c),
        }
    }
    Some(out)
}

/// `fooBar.bazQux` as `foo_bar.baz_qux`; `None` for a `_` (not a
/// lowerCamelCase path).
fn snake(path: &str) -> Option<String> {
    let mut out = String::with_capacity(path.len() + 4);
    for c in path.chars() {
        match c {
            '_' => return None,
            'A'..='Z' => {
                out.push('_');
                out.push(c.to_ascii_lowercase());
            }
            c => out.push(c),
        }
    }
    Some(out)
}

/// Days since 1970-01-01 as a civil date (proleptic Gregorian; H. Hinnant's
/// algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A civil date as days since 1970-01-01.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from(if m > 2 { m - 3 } else { m + 9 });
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

// --- Parsing ----------------------------------------------------------------

// Out of line, as `write`, for `fill`.
#[inline(never)]
pub(super) fn parse(
    w: Wkt,
    ts: &TableSet,
    b: &mut Builder<'_>,
    at: MessageBuilder,
    json: &Json,
    depth: u32,
    opts: &JsonOptions,
) -> Result<(), JsonError> {
    let bad = |why: &str| JsonError(format!("{}: {why}", ts.message_name(at.type_index())));
    match w {
        Wkt::Timestamp => {
            let Json::String(s) = json else { return Err(bad("expected an RFC 3339 string")) };
            let (secs, nanos) = parse_timestamp(s).ok_or_else(|| bad("not an RFC 3339 time"))?;
            set_pair(b, at, secs, nanos)?;
        }
        Wkt::Duration => {
            let Json::String(s) = json else { return Err(bad("expected a string like \"1.5s\"")) };
            let (secs, nanos) = parse_duration(s).ok_or_else(|| bad("not a duration"))?;
            set_pair(b, at, secs, nanos)?;
        }
        Wkt::FieldMask => {
            let Json::String(s) = json else { return Err(bad("expected a string of paths")) };
            for p in s.split(',').filter(|p| !p.is_empty()) {
                let p =
                    snake(p).ok_or_else(|| bad("a path with `_` (paths are lowerCamelCase)"))?;
                b.push(at, 1, Value::String(p.as_bytes()))?;
            }
        }
        Wkt::Wrapper => {
            let msg = ts.message(at.type_index());
            let f = ts.field_by_number(msg, 1).ok_or_else(|| bad("no field 1"))?;
            let v: Owned = scalar(ts, f, json)?;
            b.set(at, 1, v.as_value())?;
        }
        Wkt::Struct => {
            let Json::Object(map) = json else { return Err(bad("expected an object")) };
            for (k, v) in map {
                let e = b.message(at, 1)?;
                b.set(e, 1, Value::String(k.as_bytes()))?;
                let value = b.message(e, 2)?;
                parse_value(ts, b, value, v, depth + 2)?;
            }
        }
        Wkt::ListValue => {
            let Json::Array(items) = json else { return Err(bad("expected an array")) };
            for v in items {
                let value = b.message(at, 1)?;
                parse_value(ts, b, value, v, depth + 1)?;
            }
        }
        Wkt::Value => parse_value(ts, b, at, json, depth)?,
        Wkt::Any => parse_any(ts, b, at, json, depth, opts)?,
    }
    Ok(())
}

fn set_pair(
    b: &mut Builder<'_>,
    at: MessageBuilder,
    secs: i64,
    nanos: i32,
) -> Result<(), JsonError> {
    if secs != 0 {
        b.set(at, 1, Value::I64(secs))?;
    }
    if nanos != 0 {
        b.set(at, 2, Value::I32(nanos))?;
    }
    Ok(())
}

/// A `google.protobuf.Value` from any JSON value.
fn parse_value(
    ts: &TableSet,
    b: &mut Builder<'_>,
    at: MessageBuilder,
    json: &Json,
    depth: u32,
) -> Result<(), JsonError> {
    if depth > super::MAX_DEPTH {
        return Err(JsonError("nesting too deep".into()));
    }
    match json {
        Json::Null => b.set(at, 1, Value::Enum(0))?,
        Json::Number(n) => {
            let x = n.as_f64().ok_or_else(|| JsonError(format!("number {n} out of range")))?;
            b.set(at, 2, Value::F64(x))?
        }
        Json::String(s) => b.set(at, 3, Value::String(s.as_bytes()))?,
        Json::Bool(x) => b.set(at, 4, Value::Bool(*x))?,
        Json::Object(_) => {
            let s = b.message(at, 5)?;
            parse(Wkt::Struct, ts, b, s, json, depth + 1, &JsonOptions::default())?;
        }
        Json::Array(_) => {
            let l = b.message(at, 6)?;
            parse(Wkt::ListValue, ts, b, l, json, depth + 1, &JsonOptions::default())?;
        }
    }
    Ok(())
}

fn parse_any(
    ts: &TableSet,
    b: &mut Builder<'_>,
    at: MessageBuilder,
    json: &Json,
    depth: u32,
    opts: &JsonOptions,
) -> Result<(), JsonError> {
    let Json::Object(map) = json else {
        return Err(JsonError("google.protobuf.Any: expected an object".into()));
    };
    if map.is_empty() {
        return Ok(());
    }
    let Some(Json::String(url)) = map.get("@type") else {
        return Err(JsonError("google.protobuf.Any: no \"@type\" string".into()));
    };
    let ty = type_of_url(ts, url)
        .ok_or_else(|| JsonError(format!("google.protobuf.Any: type {url:?} is not loaded")))?;
    let mut inner = Builder::new(ts, ty)?;
    let root = inner.root();
    if in_value_member(ts, ty) {
        let v = map.get("value").ok_or_else(|| {
            JsonError(format!("google.protobuf.Any of {url}: no \"value\" member"))
        })?;
        if let Some(k) = map.keys().find(|k| *k != "@type" && *k != "value") {
            return Err(JsonError(format!("google.protobuf.Any of {url}: member {k:?}")));
        }
        fill(ts, &mut inner, root, v, depth + 1, opts)?;
    } else {
        let mut rest = map.clone();
        rest.remove("@type");
        fill(ts, &mut inner, root, &Json::Object(rest), depth + 1, opts)?;
    }
    let block = inner.finish();
    let mut bytes = Vec::new();
    crate::Encoder::new()
        .encode_into(
            ts,
            ty,
            crate::encode::Source::owned(block.as_bytes()),
            &crate::EncodeOptions::default(),
            &mut bytes,
        )
        .map_err(|e| JsonError(format!("google.protobuf.Any of {url}: {e}")))?;
    b.set(at, 1, Value::String(url.as_bytes()))?;
    if !bytes.is_empty() {
        b.set(at, 2, Value::Bytes(&bytes))?;
    }
    Ok(())
}

/// `YYYY-MM-DDTHH:MM:SS[.f{1,9}](Z|±HH:MM)`, years 1 to 9999 in UTC.
fn parse_timestamp(s: &str) -> Option<(i64, i32)> {
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let d = b.get(from..from + len)?;
        d.iter()
            .all(u8::is_ascii_digit)
            .then(|| d.iter().fold(0i64, |a, c| a * 10 + i64::from(c - b'0')))
    };
    let y = num(0, 4)?;
    let (mo, d) = (num(5, 2)?, num(8, 2)?);
    let (h, mi, se) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if b.get(4) != Some(&b'-')
        || b.get(7) != Some(&b'-')
        || b.get(10) != Some(&b'T')
        || b.get(13) != Some(&b':')
        || b.get(16) != Some(&b':')
    {
        return None;
    }
    if !(1..=12).contains(&mo)
        || d < 1
        || d > days_in_month(y, mo as u32)
        || h > 23
        || mi > 59
        || se > 59
    {
        return None;
    }
    let mut at = 19;
    let mut nanos = 0i32;
    if b.get(at) == Some(&b'.') {
        let digits = b[at + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if !(1..=9).contains(&digits) {
            return None;
        }
        let frac = num(at + 1, digits)?;
        nanos = (frac * 10i64.pow(9 - digits as u32)) as i32;
        at += 1 + digits;
    }
    let offset = match b.get(at..)? {
        b"Z" => 0,
        [sign @ (b'+' | b'-'), rest @ ..] if rest.len() == 5 && rest[2] == b':' => {
            let (oh, om) = (num(at + 1, 2)?, num(at + 4, 2)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if *sign == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo as u32, d as u32) * 86_400 + h * 3600 + mi * 60 + se - offset;
    (i128::from(secs) >= MIN_SECONDS && i128::from(secs) <= MAX_SECONDS).then_some((secs, nanos))
}

fn days_in_month(y: i64, m: u32) -> i64 {
    match m {
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

/// `[-]S[.f{1,9}]s`, within ±10,000 years.
fn parse_duration(s: &str) -> Option<(i64, i32)> {
    let body = s.strip_suffix('s')?;
    let (neg, body) = match body.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, body),
    };
    let (whole, frac) = match body.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (body, None),
    };
    if whole.is_empty() || !whole.bytes().all(|c| c.is_ascii_digit()) || whole.len() > 12 {
        return None;
    }
    let secs: i64 = whole.parse().ok()?;
    let nanos = match frac {
        None => 0,
        Some(f) if (1..=9).contains(&f.len()) && f.bytes().all(|c| c.is_ascii_digit()) => {
            f.parse::<i64>().ok()? * 10i64.pow(9 - f.len() as u32)
        }
        Some(_) => return None,
    };
    if i128::from(secs) > MAX_DURATION {
        return None;
    }
    let sign = if neg { -1 } else { 1 };
    Some((sign * secs, (sign * nanos) as i32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_convert_both_ways_across_the_range() {
        for days in [-719_162, -1, 0, 1, 10_957, 11_016, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-719_162), (1, 1, 1));
        assert_eq!(civil_from_days(2_932_896), (9999, 12, 31));
    }

    #[test]
    fn timestamps_and_durations_parse_in_their_canonical_forms_only() {
        assert_eq!(parse_timestamp("1970-01-01T00:00:00Z"), Some((0, 0)));
        assert_eq!(parse_timestamp("1970-01-01T00:00:00.5+01:00"), Some((-3600, 500_000_000)));
        assert_eq!(parse_timestamp("0001-01-01T00:00:00Z"), Some((-62_135_596_800, 0)));
        assert_eq!(
            parse_timestamp("9999-12-31T23:59:59.999999999Z"),
            Some((MAX_SECONDS as i64, 999_999_999))
        );
        for bad in [
            "1970-01-01T00:00:00",
            "1970-01-01t00:00:00Z",
            "1970-01-01T00:00:00z",
            "1970-02-30T00:00:00Z",
            "1970-01-01T00:00:00.Z",
            "1970-01-01T00:00:00.0000000001Z",
            "0000-12-31T23:59:59Z",
            " 1970-01-01T00:00:00Z",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
        assert_eq!(parse_duration("1.5s"), Some((1, 500_000_000)));
        assert_eq!(parse_duration("-0.5s"), Some((0, -500_000_000)));
        assert_eq!(parse_duration("315576000000s"), Some((315_576_000_000, 0)));
        for bad in ["1", "1.s", "s", "+1s", "315576000001s", "1.0000000001s", " 1s"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn field_mask_paths_convert_only_when_they_come_back() {
        assert_eq!(camel("foo_bar.baz").as_deref(), Some("fooBar.baz"));
        assert_eq!(snake("fooBar.baz").as_deref(), Some("foo_bar.baz"));
        for bad in ["fooBar", "foo__bar", "foo_3", "foo_", "a,b"] {
            assert_eq!(camel(bad), None, "{bad}");
        }
        assert_eq!(snake("foo_bar"), None);
    }
}
