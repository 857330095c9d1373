//! Base-128 varints and zigzag, the two integer encodings of the wire format.
//! Reading is bounds-checked and returns `None` on truncation; the caller
//! turns that into a typed error with the offset.

/// Outcome of reading a varint that did not produce a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VarintError {
    /// Input ended inside the varint.
    Truncated,
    /// Ten bytes and the continuation bit still set.
    TooLong,
    /// A tag or a length prefix in more than five bytes (see [`read_short`]).
    Overlong,
}

/// Reads a varint at `*pos`, advancing it. Up to ten bytes; bits past 64 are
/// dropped, as every protobuf implementation does.
#[inline(always)]
pub(crate) fn read(buf: &[u8], pos: &mut usize) -> Result<u64, VarintError> {
    read_then(buf, pos, read_slow)
}

/// Reads a tag or a length prefix at `*pos`, advancing it: a varint of at
/// most five bytes. Both are 32-bit quantities, and protobuf C++ and upb
/// reject a longer encoding (a small value padded with 0x80 bytes) as
/// malformed, so a decoder that accepted it would read inputs they refuse.
#[inline(always)]
pub(crate) fn read_short(buf: &[u8], pos: &mut usize) -> Result<u64, VarintError> {
    read_then(buf, pos, read_short_slow)
}

/// The one- and two-byte varints that most tags, lengths and small values
/// are, inline; `slow` reads any longer one from `*pos`.
#[inline(always)]
fn read_then(
    buf: &[u8],
    pos: &mut usize,
    slow: fn(&[u8], &mut usize) -> Result<u64, VarintError>,
) -> Result<u64, VarintError> {
    let p = *pos;
    match buf.get(p) {
        Some(&b) if b < 0x80 => {
            *pos = p + 1;
            return Ok(b as u64);
        }
        None => return Err(VarintError::Truncated),
        _ => {}
    }
    if let Some(&b1) = buf.get(p + 1) {
        if b1 < 0x80 {
            *pos = p + 2;
            return Ok((buf[p] as u64 & 0x7f) | (b1 as u64) << 7);
        }
    }
    slow(buf, pos)
}

#[cold]
fn read_short_slow(buf: &[u8], pos: &mut usize) -> Result<u64, VarintError> {
    let p = *pos;
    let mut value = 0u64;
    for i in 0..5 {
        let Some(&b) = buf.get(p + i) else { return Err(VarintError::Truncated) };
        value |= ((b & 0x7f) as u64) << (7 * i);
        if b < 0x80 {
            *pos = p + i + 1;
            return Ok(value);
        }
    }
    Err(VarintError::Overlong)
}

/// Reads a varint whose length is unpredictable (a value rather than a tag):
/// with ten bytes available there is no branch on its length at all.
#[inline(always)]
pub(crate) fn read_value(buf: &[u8], pos: &mut usize) -> Result<u64, VarintError> {
    read_slow(buf, pos)
}

#[inline]
fn read_slow(buf: &[u8], pos: &mut usize) -> Result<u64, VarintError> {
    let p = *pos;
    let Some(chunk) = buf.get(p..p + 10) else { return read_tail(buf, pos) };
    // Ten bytes available: decode without a branch per byte. The first
    // eight bytes are one little-endian word; the lowest clear
    // continuation bit marks the end, and the 7-bit groups below it are
    // packed together by three mask-and-shift steps.
    let word = u64::from_le_bytes([
        chunk[0], chunk[1], chunk[2], chunk[3], chunk[4], chunk[5], chunk[6], chunk[7],
    ]);
    let stops = !word & 0x8080_8080_8080_8080;
    if stops != 0 {
        let bits = stops.trailing_zeros() + 1; // through the last byte's top bit
        let word = if bits == 64 { word } else { word & ((1u64 << bits) - 1) };
        *pos = p + bits as usize / 8;
        return Ok(compact(word));
    }
    // Nine or ten bytes: 56 bits from the word, then up to two more bytes.
    let mut value = compact(word);
    let b8 = chunk[8];
    value |= ((b8 & 0x7f) as u64) << 56;
    if b8 < 0x80 {
        *pos = p + 9;
        return Ok(value);
    }
    let b9 = chunk[9];
    if b9 >= 0x80 {
        return Err(VarintError::TooLong);
    }
    value |= (b9 as u64) << 63; // bits past 64 are dropped
    *pos = p + 10;
    Ok(value)
}

/// Packs the low 7 bits of each of the eight bytes of `word` into 56 bits.
#[inline(always)]
fn compact(word: u64) -> u64 {
    let x = word & 0x7f7f_7f7f_7f7f_7f7f;
    let x = (x & 0x007f_007f_007f_007f) | ((x & 0x7f00_7f00_7f00_7f00) >> 1);
    let x = (x & 0x0000_3fff_0000_3fff) | ((x & 0x3fff_0000_3fff_0000) >> 2);
    (x & 0x0000_0000_0fff_ffff) | ((x & 0x0fff_ffff_0000_0000) >> 4)
}

/// A varint within the last ten bytes of the buffer: bytes checked one by one.
#[cold]
fn read_tail(buf: &[u8], pos: &mut usize) -> Result<u64, VarintError> {
    let mut value = 0u64;
    for i in 0..10 {
        let Some(&b) = buf.get(*pos + i) else { return Err(VarintError::Truncated) };
        value |= ((b & 0x7f) as u64) << (7 * i);
        if b < 0x80 {
            *pos += i + 1;
            return Ok(value);
        }
    }
    Err(VarintError::TooLong)
}

/// Encoded length of `v`, 1..=10.
#[inline(always)]
pub(crate) fn len(v: u64) -> usize {
    // (bits + 6) / 7 with bits >= 1; the `| 1` makes 0 take one byte.
    let bits = 64 - (v | 1).leading_zeros() as usize;
    (bits * 9 + 64) / 64
}

/// Appends `v` to `out`.
#[inline(always)]
pub(crate) fn push(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Zigzag-encodes a signed 32-bit value.
#[inline(always)]
pub(crate) fn zigzag32(v: i32) -> u32 {
    ((v << 1) ^ (v >> 31)) as u32
}

/// Zigzag-encodes a signed 64-bit value.
#[inline(always)]
pub(crate) fn zigzag64(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Zigzag-decodes 32 bits.
#[inline(always)]
pub(crate) fn unzigzag32(v: u32) -> i32 {
    ((v >> 1) as i32) ^ -((v & 1) as i32)
}

/// Zigzag-decodes 64 bits.
#[inline(always)]
pub(crate) fn unzigzag64(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_match_encodings() {
        for v in [0u64, 1, 127, 128, 16383, 16384, u32::MAX as u64, u64::MAX >> 1, u64::MAX] {
            let mut out = Vec::new();
            push(&mut out, v);
            assert_eq!(out.len(), len(v), "{v}");
            let mut pos = 0;
            assert_eq!(read(&out, &mut pos), Ok(v));
            assert_eq!(pos, out.len());
        }
    }

    #[test]
    fn every_length_and_position_decodes() {
        // Each length 1..=10, at the start of a buffer with and without ten
        // bytes of room after it (the word-at-a-time and the byte-wise path).
        for bits in 0..64 {
            for v in [1u64 << bits, (1u64 << bits) - 1, (1u64 << bits) | 0x55, u64::MAX >> bits] {
                let mut enc = Vec::new();
                push(&mut enc, v);
                for pad in [0usize, 12] {
                    let mut buf = enc.clone();
                    buf.resize(enc.len() + pad, 0xff);
                    let mut pos = 0;
                    assert_eq!(read(&buf, &mut pos), Ok(v), "{v:#x} pad {pad}");
                    assert_eq!(pos, enc.len());
                }
            }
        }
        // Overlong ten-byte encodings keep the low 64 bits.
        let mut pos = 0;
        let ten = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0];
        assert_eq!(read(&ten, &mut pos), Ok(u64::MAX));
        assert_eq!(pos, 10);
    }

    #[test]
    fn malformed_varints() {
        assert_eq!(read(&[0x80, 0x80], &mut 0), Err(VarintError::Truncated));
        assert_eq!(read(&[0xff; 11], &mut 0), Err(VarintError::TooLong));
        // Overlong but terminated: accepted.
        let mut pos = 0;
        assert_eq!(read(&[0x81, 0x80, 0x80, 0x00], &mut pos), Ok(1));
        assert_eq!(pos, 4);
    }

    #[test]
    fn tags_and_lengths_take_at_most_five_bytes() {
        let mut pos = 0;
        assert_eq!(read_short(&[0x08], &mut pos), Ok(8));
        let mut pos = 0;
        // Five bytes: the largest a 32-bit tag or length needs.
        assert_eq!(
            read_short(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0xaa], &mut pos),
            Ok(u32::MAX as u64)
        );
        assert_eq!(pos, 5);
        // Padding to five bytes is accepted, to six is not (protobuf C++, upb).
        let mut pos = 0;
        assert_eq!(read_short(&[0x88, 0x80, 0x80, 0x80, 0x00], &mut pos), Ok(8));
        assert_eq!(pos, 5);
        assert_eq!(
            read_short(&[0x88, 0x80, 0x80, 0x80, 0x80, 0x00], &mut 0),
            Err(VarintError::Overlong)
        );
        assert_eq!(read_short(&[0x88, 0x80, 0x80], &mut 0), Err(VarintError::Truncated));
        assert_eq!(read_short(&[], &mut 0), Err(VarintError::Truncated));
    }

    #[test]
    fn zigzag() {
        for v in [0i32, -1, 1, i32::MIN, i32::MAX] {
            assert_eq!(unzigzag32(zigzag32(v)), v);
        }
        for v in [0i64, -1, 1, i64::MIN, i64::MAX] {
            assert_eq!(unzigzag64(zigzag64(v)), v);
        }
        assert_eq!(zigzag32(-1), 1);
        assert_eq!(zigzag64(1), 2);
    }
}
