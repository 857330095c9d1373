//! Extension values, which live in their message's unknown-field bytes (an
//! extendee has no slots for them: see `protoplane_schema::Extension`).
//! The formats that spell extensions by name (JSON's `"[pkg.name]"`) read
//! them out of those bytes with [`values`] and write them in with
//! [`push_scalar`] and [`push_message`].

use protoplane_schema::{Field, Kind, WireType};

use crate::varint;
use crate::view::Value;

/// One value of an extension as its bytes hold it.
#[derive(Debug)]
pub(crate) enum Raw<'a> {
    /// A varint or fixed-width value's bits.
    Bits(u64),
    /// A string's or bytes' contents.
    Bytes(&'a [u8]),
    /// A message's (or group's) encoded fields. For a singular message,
    /// every occurrence's, concatenated: decoding them merges them, as
    /// protobuf merges a message field seen twice.
    Message(Vec<u8>),
}

/// Unknown-field bytes that do not parse as fields (a block whose unknown
/// bytes were not written by the decoder or a well-behaved builder).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Malformed;

fn malformed() -> Malformed {
    Malformed
}

fn read_varint(buf: &[u8], pos: &mut usize) -> Result<u64, Malformed> {
    varint::read(buf, pos).map_err(|_| malformed())
}

fn take<'a>(buf: &'a [u8], pos: &mut usize, n: usize) -> Result<&'a [u8], Malformed> {
    let end = pos.checked_add(n).filter(|&e| e <= buf.len()).ok_or_else(malformed)?;
    let s = &buf[*pos..end];
    *pos = end;
    Ok(s)
}

/// The body of the group started by field `number` at `pos` (just past its
/// start tag), leaving `pos` past its end tag.
fn group<'a>(buf: &'a [u8], pos: &mut usize, number: u64) -> Result<&'a [u8], Malformed> {
    let start = *pos;
    let mut depth = 0u32;
    loop {
        let at = *pos;
        let tag = read_varint(buf, pos)?;
        match tag & 7 {
            0 => {
                read_varint(buf, pos)?;
            }
            1 => {
                take(buf, pos, 8)?;
            }
            2 => {
                let n = usize::try_from(read_varint(buf, pos)?).map_err(|_| malformed())?;
                take(buf, pos, n)?;
            }
            3 => depth = depth.checked_add(1).filter(|&d| d < 100).ok_or(Malformed)?,
            4 if depth == 0 => {
                return if tag >> 3 == number { Ok(&buf[start..at]) } else { Err(malformed()) };
            }
            4 => depth -= 1,
            5 => {
                take(buf, pos, 4)?;
            }
            _ => return Err(malformed()),
        }
    }
}

/// The values of extension `f` in a message's unknown-field bytes, in
/// order (a singular one: its last value; a message, all occurrences
/// merged). Packed and unpacked repeated scalars both read. Occurrences
/// with a wire type that does not fit the extension's type are skipped:
/// they stay unknown fields, as any decoder leaves them.
pub(crate) fn values<'a>(f: &Field, unknown: &'a [u8]) -> Result<Vec<Raw<'a>>, Malformed> {
    let mut out = Vec::new();
    let mut merged: Option<Vec<u8>> = None;
    let mut pos = 0;
    while pos < unknown.len() {
        let tag = read_varint(unknown, &mut pos)?;
        let (number, wt) = (tag >> 3, tag & 7);
        let ours = number == f.number as u64;
        match wt {
            0 => {
                let v = read_varint(unknown, &mut pos)?;
                if ours && f.kind.wire_type() == WireType::Varint {
                    out.push(Raw::Bits(v));
                }
            }
            1 | 5 => {
                let n = if wt == 1 { 8 } else { 4 };
                let b = take(unknown, &mut pos, n)?;
                if ours && f.kind.wire_type() as u64 == wt {
                    let mut bits = [0u8; 8];
                    bits[..n].copy_from_slice(b);
                    out.push(Raw::Bits(u64::from_le_bytes(bits)));
                }
            }
            2 => {
                let n =
                    usize::try_from(read_varint(unknown, &mut pos)?).map_err(|_| malformed())?;
                let b = take(unknown, &mut pos, n)?;
                if !ours {
                    continue;
                }
                match f.kind {
                    Kind::String | Kind::Bytes => out.push(Raw::Bytes(b)),
                    Kind::Message => match &mut merged {
                        Some(m) if !f.is_repeated() => m.extend_from_slice(b),
                        _ if f.is_repeated() => out.push(Raw::Message(b.to_vec())),
                        _ => merged = Some(b.to_vec()),
                    },
                    Kind::Group => {}
                    _ if f.is_repeated() => unpack(f.kind, b, &mut out)?,
                    _ => {}
                }
            }
            3 => {
                let body = group(unknown, &mut pos, number)?;
                if ours && f.kind == Kind::Group {
                    match &mut merged {
                        Some(m) if !f.is_repeated() => m.extend_from_slice(body),
                        _ if f.is_repeated() => out.push(Raw::Message(body.to_vec())),
                        _ => merged = Some(body.to_vec()),
                    }
                }
            }
            _ => return Err(malformed()),
        }
    }
    if let Some(m) = merged {
        out.push(Raw::Message(m));
    }
    if !f.is_repeated() && out.len() > 1 {
        out.drain(..out.len() - 1); // the last value of a singular field wins
    }
    Ok(out)
}

/// The elements of a packed run.
fn unpack<'a>(kind: Kind, b: &[u8], out: &mut Vec<Raw<'a>>) -> Result<(), Malformed> {
    let mut pos = 0;
    while pos < b.len() {
        let bits = match kind.wire_type() {
            WireType::Varint => read_varint(b, &mut pos)?,
            WireType::Fixed32 => {
                u32::from_le_bytes(take(b, &mut pos, 4)?.try_into().map_err(|_| malformed())?)
                    as u64
            }
            WireType::Fixed64 => {
                u64::from_le_bytes(take(b, &mut pos, 8)?.try_into().map_err(|_| malformed())?)
            }
            _ => return Err(malformed()),
        };
        out.push(Raw::Bits(bits));
    }
    Ok(())
}

/// The value a scalar's bits stand for.
pub(crate) fn scalar(kind: Kind, bits: u64) -> Value<'static> {
    match kind {
        Kind::Int32 | Kind::SFixed32 => Value::I32(bits as i32),
        Kind::SInt32 => Value::I32(varint::unzigzag32(bits as u32)),
        Kind::UInt32 | Kind::Fixed32 => Value::U32(bits as u32),
        Kind::Int64 | Kind::SFixed64 => Value::I64(bits as i64),
        Kind::SInt64 => Value::I64(varint::unzigzag64(bits)),
        Kind::UInt64 | Kind::Fixed64 => Value::U64(bits),
        Kind::Float => Value::F32(f32::from_bits(bits as u32)),
        Kind::Double => Value::F64(f64::from_bits(bits)),
        Kind::Bool => Value::Bool(bits != 0),
        Kind::Enum => Value::Enum(bits as i32),
        // Not scalars: `values` never yields bits for them.
        Kind::String | Kind::Bytes | Kind::Message | Kind::Group => Value::U64(bits),
    }
}

fn push_tag(out: &mut Vec<u8>, number: u32, wt: WireType) {
    varint::push(out, ((number as u64) << 3) | wt as u64);
}

/// Appends one value of extension `f` (a scalar, string or bytes) as a
/// field: unpacked, which every parser reads, packed extension or not.
/// `false` if the value does not fit the kind.
pub(crate) fn push_scalar(out: &mut Vec<u8>, f: &Field, v: &Value<'_>) -> bool {
    let bits = match (f.kind, v) {
        (Kind::String, Value::String(b)) | (Kind::Bytes, Value::Bytes(b)) => {
            push_tag(out, f.number, WireType::Len);
            varint::push(out, b.len() as u64);
            out.extend_from_slice(b);
            return true;
        }
        (Kind::Int32 | Kind::SFixed32, Value::I32(x)) => *x as i64 as u64,
        (Kind::SInt32, Value::I32(x)) => varint::zigzag32(*x) as u64,
        (Kind::UInt32 | Kind::Fixed32, Value::U32(x)) => *x as u64,
        (Kind::Int64 | Kind::SFixed64, Value::I64(x)) => *x as u64,
        (Kind::SInt64, Value::I64(x)) => varint::zigzag64(*x),
        (Kind::UInt64 | Kind::Fixed64, Value::U64(x)) => *x,
        (Kind::Float, Value::F32(x)) => x.to_bits() as u64,
        (Kind::Double, Value::F64(x)) => x.to_bits(),
        (Kind::Bool, Value::Bool(b)) => *b as u64,
        (Kind::Enum, Value::Enum(x)) => *x as i64 as u64,
        _ => return false,
    };
    let wt = f.kind.wire_type();
    push_tag(out, f.number, wt);
    match wt {
        WireType::Fixed32 => out.extend_from_slice(&(bits as u32).to_le_bytes()),
        WireType::Fixed64 => out.extend_from_slice(&bits.to_le_bytes()),
        _ => varint::push(out, bits),
    }
    true
}

/// Appends a message value of extension `f` (its encoded fields): length-
/// prefixed, or between group tags for a group.
pub(crate) fn push_message(out: &mut Vec<u8>, f: &Field, body: &[u8]) {
    if f.kind == Kind::Group {
        push_tag(out, f.number, WireType::StartGroup);
        out.extend_from_slice(body);
        push_tag(out, f.number, WireType::EndGroup);
    } else {
        push_tag(out, f.number, WireType::Len);
        varint::push(out, body.len() as u64);
        out.extend_from_slice(body);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protoplane_schema::{FieldFlags, Label, Span, NONE};

    fn ext(number: u32, kind: Kind, label: Label) -> Field {
        Field {
            number,
            offset: 0,
            sub: NONE,
            presence: NONE,
            name: Span { start: 0, len: 0 },
            json_name: Span { start: 0, len: 0 },
            default: 0,
            kind,
            label,
            flags: FieldFlags(0),
        }
    }

    fn bits(v: &[Raw<'_>]) -> Vec<u64> {
        v.iter().map(|r| if let Raw::Bits(b) = r { *b } else { panic!("{r:?}") }).collect()
    }

    #[test]
    fn scalars_round_trip_through_the_bytes() {
        for (kind, v) in [
            (Kind::SInt32, Value::I32(-3)),
            (Kind::Int32, Value::I32(-1)),
            (Kind::Fixed64, Value::U64(u64::MAX)),
            (Kind::Float, Value::F32(1.5)),
            (Kind::Enum, Value::Enum(-2)),
        ] {
            let f = ext(120, kind, Label::Optional);
            let mut out = Vec::new();
            assert!(push_scalar(&mut out, &f, &v));
            let got = values(&f, &out).expect("the test's own input");
            assert_eq!(bits(&got).len(), 1);
            assert_eq!(format!("{:?}", scalar(kind, bits(&got)[0])), format!("{v:?}"), "{kind:?}");
        }
        assert!(!push_scalar(
            &mut Vec::new(),
            &ext(1, Kind::Bool, Label::Optional),
            &Value::I32(1)
        ));
    }

    #[test]
    fn repeated_read_packed_and_unpacked_singular_keeps_the_last() {
        let rep = ext(5, Kind::Int32, Label::Repeated);
        // 5: 1 (varint), 5: [2, 3] (packed), another field, 5: 4.
        let bytes = [0x28, 1, 0x2a, 2, 2, 3, 0x08, 9, 0x28, 4];
        assert_eq!(bits(&values(&rep, &bytes).expect("the test's own input")), [1, 2, 3, 4]);
        let one = ext(5, Kind::Int32, Label::Optional);
        assert_eq!(bits(&values(&one, &bytes).expect("the test's own input")), [4]);
    }

    #[test]
    fn groups_and_messages_merge_and_other_wire_types_stay_unknown() {
        let g = ext(7, Kind::Group, Label::Optional);
        // 7: group { 1: 1 { 9: group {} } }, 7: group { 2: 2 }.
        let bytes = [0x3b, 0x08, 1, 0x4b, 0x4c, 0x3c, 0x3b, 0x10, 2, 0x3c];
        match values(&g, &bytes).expect("the test's own input").as_slice() {
            [Raw::Message(m)] => assert_eq!(m, &[0x08, 1, 0x4b, 0x4c, 0x10, 2]),
            other => panic!("{other:?}"),
        }
        let m = ext(7, Kind::Message, Label::Optional);
        assert!(
            values(&m, &bytes).expect("the test's own input").is_empty(),
            "a group is not a message"
        );
        let s = ext(1, Kind::String, Label::Optional);
        assert!(
            values(&s, &[0x08, 1]).expect("the test's own input").is_empty(),
            "a varint is not a string"
        );
    }

    #[test]
    fn malformed_bytes_are_an_error() {
        let f = ext(1, Kind::Int32, Label::Optional);
        for bad in [&[0x0a, 5, 1][..], &[0x3b, 0x08][..], &[0x3c][..], &[0x0f][..], &[0x80][..]] {
            assert!(values(&f, bad).is_err(), "{bad:?}");
        }
    }
}
