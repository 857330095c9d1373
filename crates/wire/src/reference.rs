//! The reference decoder: the plain, recursive reading of the protobuf
//! encoding rules, written on top of the public [`Builder`] API and sharing
//! nothing with the fast path in `decode.rs` but the varint reader.
//!
//! It exists to be obviously right, not fast: the dataset tests
//! (`tests/datasets.rs`) decode every recorded message with both and
//! require the same outcome (both fail, or both succeed and encode to the
//! same bytes). `protoplane roundtrip --reference` uses it.

use protoplane_schema::{Field, FieldFlags, Kind, TableSet};

use crate::block::Block;
use crate::builder::{Builder, MessageBuilder};
use crate::decode::{varint_bits, DecodeOptions};
use crate::error::{DecodeError, DecodeErrorKind};
use crate::varint;
use crate::view::Value;

/// Decodes `input` as message `type_index` (always owned mode).
pub fn decode(
    ts: &TableSet,
    type_index: u32,
    input: &[u8],
    opts: &DecodeOptions,
) -> Result<Block, DecodeError> {
    let err = |kind| DecodeError { kind, message: format!("#{type_index}"), field: 0, offset: 0 };
    let mut b = Builder::new(ts, type_index).map_err(|_| err(DecodeErrorKind::UnknownType))?;
    let root = b.root();
    let mut r = Reader { ts, input, opts, b: &mut b };
    r.message(root, 0, input.len(), None, 0)?;
    if opts.check_required {
        let src = crate::encode::Source::owned(b.block().as_bytes());
        let view = crate::view::MessageView::new(ts, src, type_index)
            .map_err(|_| err(DecodeErrorKind::BlockTooLarge))?;
        let missing = view
            .missing_required(opts.max_depth + 1)
            .map_err(|_| err(DecodeErrorKind::DepthExceeded))?;
        if let Some((ty, field)) = missing {
            return Err(DecodeError {
                kind: DecodeErrorKind::MissingRequired,
                message: ts.message_name(ty).to_owned(),
                field,
                offset: input.len(),
            });
        }
    }
    Ok(b.finish())
}

struct Reader<'a, 'b> {
    ts: &'a TableSet,
    input: &'a [u8],
    opts: &'a DecodeOptions,
    b: &'b mut Builder<'a>,
}

impl Reader<'_, '_> {
    fn fail(
        &self,
        at: MessageBuilder,
        kind: DecodeErrorKind,
        field: u32,
        offset: usize,
    ) -> DecodeError {
        DecodeError {
            kind,
            message: self.ts.message_name(at.type_index()).to_owned(),
            field,
            offset,
        }
    }

    fn varint(
        &self,
        at: MessageBuilder,
        pos: &mut usize,
        end: usize,
        field: u32,
    ) -> Result<u64, DecodeError> {
        self.read_with(varint::read, at, pos, end, field)
    }

    /// A tag or a length prefix: at most five bytes.
    fn short(
        &self,
        at: MessageBuilder,
        pos: &mut usize,
        end: usize,
        field: u32,
    ) -> Result<u64, DecodeError> {
        self.read_with(varint::read_short, at, pos, end, field)
    }

    fn read_with(
        &self,
        read: fn(&[u8], &mut usize) -> Result<u64, varint::VarintError>,
        at: MessageBuilder,
        pos: &mut usize,
        end: usize,
        field: u32,
    ) -> Result<u64, DecodeError> {
        let start = *pos;
        read(&self.input[..end], pos).map_err(|e| self.fail(at, e.into(), field, start))
    }

    fn take(
        &self,
        at: MessageBuilder,
        pos: &mut usize,
        end: usize,
        n: usize,
        field: u32,
    ) -> Result<usize, DecodeError> {
        if end - *pos < n {
            return Err(self.fail(at, DecodeErrorKind::Truncated, field, *pos));
        }
        let start = *pos;
        *pos += n;
        Ok(start)
    }

    /// Reads fields of one message from `pos` to `end` (or to the end-group
    /// tag of `group`); returns the position after it.
    fn message(
        &mut self,
        at: MessageBuilder,
        mut pos: usize,
        end: usize,
        group: Option<u32>,
        depth: u32,
    ) -> Result<usize, DecodeError> {
        loop {
            if pos >= end {
                if let Some(g) = group {
                    return Err(self.fail(at, DecodeErrorKind::UnterminatedGroup, g, pos));
                }
                break;
            }
            let start = pos;
            let tag = self.short(at, &mut pos, end, 0)?;
            if tag > u32::MAX as u64 {
                return Err(self.fail(at, DecodeErrorKind::TagTooLarge, 0, start));
            }
            let (number, wt) = ((tag >> 3) as u32, (tag & 7) as u32);
            if number == 0 {
                return Err(self.fail(at, DecodeErrorKind::FieldNumberZero, 0, start));
            }
            if wt == 4 {
                if group == Some(number) {
                    return Ok(pos);
                }
                return Err(self.fail(at, DecodeErrorKind::UnmatchedEndGroup, number, start));
            }
            let msg = self.ts.message(at.type_index());
            let field = self.ts.field_by_number(msg, number);
            pos = match field {
                Some(f) => self.field(at, f, wt, start, pos, end, depth)?,
                None => self.skip_unknown(at, number, wt, start, pos, end, depth)?,
            };
        }
        Ok(pos)
    }

    #[allow(clippy::too_many_arguments)]
    fn field(
        &mut self,
        at: MessageBuilder,
        f: &Field,
        wt: u32,
        start: usize,
        mut pos: usize,
        end: usize,
        depth: u32,
    ) -> Result<usize, DecodeError> {
        let n = f.number;
        let declared = f.kind.wire_type() as u32;
        if wt == 2 && f.is_repeated() && f.kind.is_scalar() {
            let len = self.length(at, &mut pos, end, n, start)?;
            let stop = pos + len;
            while pos < stop {
                let elem_start = pos;
                let bits = match f.kind.wire_type() as u32 {
                    0 => varint_bits(
                        f.kind,
                        self.varint(at, &mut pos, stop, n)
                            .map_err(|e| DecodeError { offset: start, ..e })?,
                    ),
                    1 => {
                        let s = self
                            .take(at, &mut pos, stop, 8, n)
                            .map_err(|_| self.fail(at, DecodeErrorKind::PackedLength, n, start))?;
                        le(&self.input[s..s + 8])
                    }
                    _ => {
                        let s = self
                            .take(at, &mut pos, stop, 4, n)
                            .map_err(|_| self.fail(at, DecodeErrorKind::PackedLength, n, start))?;
                        le(&self.input[s..s + 4])
                    }
                };
                if self.closed_reject(f, bits) {
                    // Kept as an unpacked unknown varint record.
                    let mut rec = Vec::new();
                    varint::push(&mut rec, (n as u64) << 3);
                    let mut p = elem_start;
                    let raw = varint::read(self.input, &mut p).unwrap_or(0);
                    varint::push(&mut rec, raw); // all 64 bits, as sent
                    self.b
                        .push_unknown(at, &rec)
                        .map_err(|_| self.fail(at, DecodeErrorKind::TooLong, n, start))?;
                    continue;
                }
                self.store(at, f, bits, start)?;
            }
            return Ok(pos);
        }
        if wt != declared {
            return self.skip_unknown(at, n, wt, start, pos, end, depth);
        }
        match f.kind {
            Kind::String | Kind::Bytes => {
                let len = self.length(at, &mut pos, end, n, start)?;
                let data = &self.input[pos..pos + len];
                if f.flags.has(FieldFlags::UTF8) && std::str::from_utf8(data).is_err() {
                    return Err(self.fail(at, DecodeErrorKind::InvalidUtf8, n, start));
                }
                let v =
                    if f.kind == Kind::String { Value::String(data) } else { Value::Bytes(data) };
                let r = if f.is_repeated() { self.b.push(at, n, v) } else { self.b.set(at, n, v) };
                r.map_err(|_| self.fail(at, DecodeErrorKind::TooLong, n, start))?;
                Ok(pos + len)
            }
            Kind::Message | Kind::Group => {
                if depth >= self.opts.max_depth {
                    return Err(self.fail(at, DecodeErrorKind::DepthExceeded, n, start));
                }
                let sub = self
                    .b
                    .message(at, n)
                    .map_err(|_| self.fail(at, DecodeErrorKind::TooLong, n, start))?;
                if f.kind == Kind::Group {
                    self.message(sub, pos, end, Some(n), depth + 1)
                } else {
                    let len = self.length(at, &mut pos, end, n, start)?;
                    self.message(sub, pos, pos + len, None, depth + 1)?;
                    if f.flags.has(FieldFlags::MAP) && self.has_unknown(sub) {
                        self.b
                            .entry_to_unknown(at, f, sub)
                            .map_err(|_| self.fail(at, DecodeErrorKind::TooLong, n, start))?;
                    }
                    Ok(pos + len)
                }
            }
            _ => {
                let bits = match wt {
                    0 => varint_bits(f.kind, self.varint(at, &mut pos, end, n)?),
                    1 => {
                        let s = self.take(at, &mut pos, end, 8, n)?;
                        le(&self.input[s..s + 8])
                    }
                    _ => {
                        let s = self.take(at, &mut pos, end, 4, n)?;
                        le(&self.input[s..s + 4])
                    }
                };
                if self.closed_reject(f, bits) {
                    self.b
                        .push_unknown(at, &self.input[start..pos])
                        .map_err(|_| self.fail(at, DecodeErrorKind::TooLong, n, start))?;
                    return Ok(pos);
                }
                self.store(at, f, bits, start)?;
                Ok(pos)
            }
        }
    }

    fn has_unknown(&self, at: MessageBuilder) -> bool {
        let src = crate::encode::Source::owned(self.b.block().as_bytes());
        crate::view::MessageView::at(self.ts, src, at.type_index(), at.offset())
            .and_then(|v| v.unknown_fields())
            .is_ok_and(|u| !u.is_empty())
    }

    fn closed_reject(&self, f: &Field, bits: u64) -> bool {
        f.flags.has(FieldFlags::CLOSED_ENUM)
            && !self.ts.enum_contains(self.ts.enum_type(f.sub), bits as u32 as i32)
    }

    fn store(
        &mut self,
        at: MessageBuilder,
        f: &Field,
        bits: u64,
        start: usize,
    ) -> Result<(), DecodeError> {
        let v = match f.kind {
            Kind::Bool => Value::Bool(bits != 0),
            Kind::Int32 | Kind::SInt32 | Kind::SFixed32 => Value::I32(bits as u32 as i32),
            Kind::Enum => Value::Enum(bits as u32 as i32),
            Kind::Int64 | Kind::SInt64 | Kind::SFixed64 => Value::I64(bits as i64),
            Kind::UInt32 | Kind::Fixed32 => Value::U32(bits as u32),
            Kind::Float => Value::F32(f32::from_bits(bits as u32)),
            Kind::Double => Value::F64(f64::from_bits(bits)),
            _ => Value::U64(bits),
        };
        let r = if f.is_repeated() {
            self.b.push(at, f.number, v)
        } else {
            self.b.set(at, f.number, v)
        };
        r.map_err(|_| self.fail(at, DecodeErrorKind::TooLong, f.number, start))
    }

    fn length(
        &self,
        at: MessageBuilder,
        pos: &mut usize,
        end: usize,
        n: u32,
        start: usize,
    ) -> Result<usize, DecodeError> {
        let len = self.short(at, pos, end, n).map_err(|e| DecodeError { offset: start, ..e })?;
        if len > (end - *pos) as u64 {
            return Err(self.fail(at, DecodeErrorKind::LengthOutOfBounds, n, start));
        }
        Ok(len as usize)
    }

    #[allow(clippy::too_many_arguments)]
    fn skip_unknown(
        &mut self,
        at: MessageBuilder,
        n: u32,
        wt: u32,
        start: usize,
        mut pos: usize,
        end: usize,
        depth: u32,
    ) -> Result<usize, DecodeError> {
        match wt {
            0 => {
                self.varint(at, &mut pos, end, n)
                    .map_err(|e| DecodeError { offset: start, ..e })?;
            }
            1 => {
                self.take(at, &mut pos, end, 8, n)
                    .map_err(|e| DecodeError { offset: start, ..e })?;
            }
            5 => {
                self.take(at, &mut pos, end, 4, n)
                    .map_err(|e| DecodeError { offset: start, ..e })?;
            }
            2 => {
                let len = self.length(at, &mut pos, end, n, start)?;
                pos += len;
            }
            3 => pos = self.skip_group(at, n, pos, end, depth + 1)?,
            _ => return Err(self.fail(at, DecodeErrorKind::InvalidWireType, n, start)),
        }
        self.b
            .push_unknown(at, &self.input[start..pos])
            .map_err(|_| self.fail(at, DecodeErrorKind::TooLong, n, start))?;
        Ok(pos)
    }

    fn skip_group(
        &self,
        at: MessageBuilder,
        g: u32,
        mut pos: usize,
        end: usize,
        depth: u32,
    ) -> Result<usize, DecodeError> {
        if depth > self.opts.max_depth {
            return Err(self.fail(at, DecodeErrorKind::DepthExceeded, g, pos));
        }
        loop {
            if pos >= end {
                return Err(self.fail(at, DecodeErrorKind::UnterminatedGroup, g, pos));
            }
            let start = pos;
            let tag = self.short(at, &mut pos, end, g)?;
            if tag > u32::MAX as u64 {
                return Err(self.fail(at, DecodeErrorKind::TagTooLarge, g, start));
            }
            let (n, wt) = ((tag >> 3) as u32, (tag & 7) as u32);
            if n == 0 {
                return Err(self.fail(at, DecodeErrorKind::FieldNumberZero, g, start));
            }
            match wt {
                0 => {
                    self.varint(at, &mut pos, end, n)?;
                }
                1 => {
                    self.take(at, &mut pos, end, 8, n)?;
                }
                5 => {
                    self.take(at, &mut pos, end, 4, n)?;
                }
                2 => {
                    let len = self.length(at, &mut pos, end, n, start)?;
                    pos += len;
                }
                3 => pos = self.skip_group(at, n, pos, end, depth + 1)?,
                4 if n == g => return Ok(pos),
                4 => return Err(self.fail(at, DecodeErrorKind::UnmatchedEndGroup, n, start)),
                _ => return Err(self.fail(at, DecodeErrorKind::InvalidWireType, n, start)),
            }
        }
    }
}

fn le(b: &[u8]) -> u64 {
    b.iter().rev().fold(0u64, |acc, &x| acc << 8 | x as u64)
}
