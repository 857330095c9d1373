//! Reading the JSON messages of the control plane and the controller:
//! every field checked, every error naming the field.

use serde_json::{json, Map, Value};

use crate::switch::ModifyOp;
use crate::Error;

pub(crate) fn field<'a>(o: &'a Map<String, Value>, k: &'static str) -> Result<&'a Value, Error> {
    o.get(k).ok_or(Error::MissingField { field: k })
}

pub(crate) fn uint<T: TryFrom<u64>>(o: &Map<String, Value>, k: &'static str) -> Result<T, Error> {
    let v = field(o, k)?
        .as_u64()
        .ok_or(Error::WrongType { field: k, expected: "an unsigned integer" })?;
    T::try_from(v).map_err(|_| Error::OutOfRange {
        field: k,
        value: i128::from(v),
        rule: "is out of range",
    })
}

pub(crate) fn int32(o: &Map<String, Value>, k: &'static str) -> Result<i32, Error> {
    let v = field(o, k)?.as_i64().ok_or(Error::WrongType { field: k, expected: "an integer" })?;
    i32::try_from(v).map_err(|_| Error::OutOfRange {
        field: k,
        value: i128::from(v),
        rule: "does not fit 32 bits",
    })
}

pub(crate) fn text<'a>(o: &'a Map<String, Value>, k: &'static str) -> Result<&'a str, Error> {
    field(o, k)?.as_str().ok_or(Error::WrongType { field: k, expected: "a string" })
}

pub(crate) fn array<'a>(
    o: &'a Map<String, Value>,
    k: &'static str,
) -> Result<&'a Vec<Value>, Error> {
    field(o, k)?.as_array().ok_or(Error::WrongType { field: k, expected: "an array" })
}

/// At most this many items in one message's list (control messages are
/// small; a bigger one is refused, not allocated).
const MAX_LIST: usize = 1 << 16;

pub(crate) fn list<T>(
    o: &Map<String, Value>,
    k: &'static str,
    each: impl Fn(&Value) -> Option<T>,
) -> Result<Vec<T>, Error> {
    let a = array(o, k)?;
    if a.len() > MAX_LIST {
        return Err(Error::TooManyItems { field: k, items: a.len(), max: MAX_LIST });
    }
    a.iter()
        .map(|v| each(v).ok_or_else(|| Error::BadItem { field: k, item: v.to_string() }))
        .collect()
}

pub(crate) fn u16_of(v: &Value) -> Option<u16> {
    u16::try_from(v.as_u64()?).ok()
}

pub(crate) fn u32_of(v: &Value) -> Option<u32> {
    u32::try_from(v.as_u64()?).ok()
}

pub(crate) fn object(v: &Value) -> Result<&Map<String, Value>, Error> {
    v.as_object().ok_or(Error::NotAnObject)
}

/// A string field parsed by `parse`.
pub(crate) fn enumerated<T>(
    o: &Map<String, Value>,
    k: &'static str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<T, Error> {
    let s = text(o, k)?;
    parse(s).ok_or_else(|| Error::UnknownValue { field: k, value: s.to_string() })
}

/// `bad "field"`, or `bad "field" part`.
pub(crate) fn bad(field: &'static str, part: Option<&'static str>) -> Error {
    Error::BadField { field, part, value: None }
}

/// The JSON form of a `Stream.modify`: `[op, parameter]` or null.
pub(crate) fn modify_to_json(m: Option<(ModifyOp, i32)>) -> Value {
    m.map_or(Value::Null, |(op, p)| json!([op.name(), p]))
}

/// Parses `"modify"`: absent or null, or `[op, parameter]`.
pub(crate) fn modify(o: &Map<String, Value>) -> Result<Option<(ModifyOp, i32)>, Error> {
    match o.get("modify") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) if a.len() == 2 => {
            let op =
                a[0].as_str().and_then(ModifyOp::parse).ok_or(bad("modify", Some("operation")))?;
            let p = a[1]
                .as_i64()
                .and_then(|p| i32::try_from(p).ok())
                .ok_or(bad("modify", Some("parameter")))?;
            Ok(Some((op, p)))
        }
        Some(v) => Err(Error::BadField { field: "modify", part: None, value: Some(v.to_string()) }),
    }
}
