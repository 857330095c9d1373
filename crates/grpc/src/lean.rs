//! The lean transport's frame (`protoplane_rpc::lean` runs the transport;
//! `protoplane-seam` reuses its sections): a fixed 16-byte header and a
//! payload made of optional sections, each announced by a flag.
//!
//! ```text
//! header (little-endian)          payload sections, in this order, each present iff its flag is set
//!   0  u32  payload length          OPEN     u32 n, then n bytes: u64 timeout µs (0: none), metadata entries
//!   4  u32  call id                 HEADERS  u32 n, then n bytes: metadata entries
//!   8  u32  method id               MESSAGE  u32 n, then the n bytes of one encoded message
//!  12  u16  flags                   STATUS   u32 code, u32 n, n bytes of UTF-8 text, then metadata
//!  14  u16  zero                             entries to the end of the payload
//! metadata entry: u16 key length, key, u32 value length, value
//! ```
//!
//! A status's details (the serialized `google.rpc.Status` of the rich
//! error model) travel as one more entry of the STATUS section under the
//! reserved key `grpc-status-details-bin`, as gRPC carries them; that key
//! is accepted there only. Likewise the OPEN section the split engine
//! writes for an application may carry the certificate chain of a client
//! the engine verified (mutual TLS) under `grpc-peer-certificate-bin`, one
//! entry per certificate; the lean server ignores it from its clients.
//!
//! A unary call is one frame each way (`OPEN|MESSAGE|END` then
//! `MESSAGE|STATUS|END`), 16 bytes of header plus 8 + 12 bytes of section
//! lengths: against HTTP/2's HEADERS + DATA + HEADERS with HPACK on each
//! side, that is the whole difference in protocol work. Every length is
//! checked against the payload before use; a frame that fails to parse ends
//! the connection (the peer is not speaking the protocol).

use bytes::{Buf, Bytes, BytesMut};

use crate::metadata::{self, Metadata};
use crate::status::{Code, Status, DETAILS_KEY};

/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 16;

/// The connection preface (both directions), with the protocol version.
pub const PREFACE: &[u8; 8] = b"PPLEAN\0\x01";

/// The call starts (client → server); carries the OPEN section.
pub const OPEN: u16 = 0x01;
/// Initial metadata (server → client).
pub const HEADERS: u16 = 0x02;
/// One message.
pub const MESSAGE: u16 = 0x04;
/// The call's status (server → client); always with END.
pub const STATUS: u16 = 0x08;
/// The sender's last frame of the call.
pub const END: u16 = 0x10;
/// The client cancels the call.
pub const CANCEL: u16 = 0x20;

const KNOWN: u16 = OPEN | HEADERS | MESSAGE | STATUS | END | CANCEL;

/// A frame that breaks the protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeanError {
    /// The payload is longer than the limit.
    TooLarge {
        /// Declared length.
        len: u32,
        /// The limit.
        limit: usize,
    },
    /// A flag outside the protocol, or a non-zero reserved field.
    BadFlags(u16),
    /// A section runs past the payload, or bytes are left over.
    Malformed(&'static str),
    /// The connection did not start with the preface.
    BadPreface,
}

impl std::fmt::Display for LeanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeanError::TooLarge { len, limit } => {
                write!(f, "frame of {len} bytes exceeds the limit of {limit}")
            }
            LeanError::BadFlags(x) => write!(f, "invalid frame flags {x:#06x}"),
            LeanError::Malformed(what) => write!(f, "malformed frame: {what}"),
            LeanError::BadPreface => write!(f, "not a protoplane lean connection"),
        }
    }
}

impl std::error::Error for LeanError {}

/// The fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Payload bytes.
    pub len: u32,
    /// The call.
    pub call: u32,
    /// The method (meaningful on OPEN frames).
    pub method: u32,
    /// Flags.
    pub flags: u16,
}

impl FrameHeader {
    /// Whether `flag` is set.
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
}

/// The header at the front of `buf`, once all of it is there. Fails on a
/// header that breaks the protocol, before its payload arrives (so an
/// oversized frame is refused without buffering it).
pub fn header(buf: &[u8], limit: usize) -> Result<Option<FrameHeader>, LeanError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let u32_at = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    let h = FrameHeader {
        len: u32_at(0),
        call: u32_at(4),
        method: u32_at(8),
        flags: u16::from_le_bytes([buf[12], buf[13]]),
    };
    let reserved = u16::from_le_bytes([buf[14], buf[15]]);
    if h.flags & !KNOWN != 0 || reserved != 0 {
        return Err(LeanError::BadFlags(h.flags));
    }
    if h.len as usize > limit {
        return Err(LeanError::TooLarge { len: h.len, limit });
    }
    Ok(Some(h))
}

/// Splits the next whole frame off the front of `buf`, if one is there
/// (see [`header`] for what fails early).
pub fn next_frame(
    buf: &mut BytesMut,
    limit: usize,
) -> Result<Option<(FrameHeader, Bytes)>, LeanError> {
    let Some(h) = header(buf, limit)? else { return Ok(None) };
    if buf.len() < HEADER_LEN + h.len as usize {
        buf.reserve(HEADER_LEN + h.len as usize - buf.len());
        return Ok(None);
    }
    buf.advance(HEADER_LEN);
    Ok(Some((h, buf.split_to(h.len as usize).freeze())))
}

/// The sections of a parsed payload.
#[derive(Debug, Default)]
pub struct Sections {
    /// OPEN: the timeout and the custom metadata.
    pub open: Option<(Option<std::time::Duration>, Metadata)>,
    /// OPEN: the verified client certificate chain, as the split engine
    /// hands it to an application (DER, leaf first).
    pub peer_certificates: Vec<Bytes>,
    /// OPEN: the split engine's note of the client's address (see
    /// [`PEER_ADDR_KEY`]).
    pub peer_address: Option<Bytes>,
    /// HEADERS: initial metadata.
    pub headers: Option<Metadata>,
    /// MESSAGE: the message bytes (a slice of the payload, no copy).
    pub message: Option<Bytes>,
    /// STATUS: the status with its trailing metadata.
    pub status: Option<Status>,
}

struct Reader {
    p: Bytes,
}

impl Reader {
    fn u32(&mut self) -> Result<u32, LeanError> {
        if self.p.len() < 4 {
            return Err(LeanError::Malformed("truncated length"));
        }
        Ok(self.p.get_u32_le())
    }

    fn take(&mut self, n: usize) -> Result<Bytes, LeanError> {
        if self.p.len() < n {
            return Err(LeanError::Malformed("section runs past the payload"));
        }
        Ok(self.p.split_to(n))
    }

    fn section(&mut self) -> Result<Bytes, LeanError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

/// The key of a certificate of the peer in an OPEN section.
pub const PEER_CERT_KEY: &str = "grpc-peer-certificate-bin";

/// The key of the split engine's note of the client's address in an OPEN
/// section: `SLOT ADDRESS` (`7 127.0.0.1:50312`, `[::1]:4000` for IPv6),
/// the address of the connection the engine numbered SLOT for this
/// application (`protoplane_seam::OpenRepr::peer`).
pub const PEER_ADDR_KEY: &str = "grpc-peer-address";

/// Reads metadata entries until `b` is used up.
fn parse_metadata(b: Bytes) -> Result<Metadata, LeanError> {
    parse_entries(b, "", &mut Vec::new(), None)
}

/// Reads metadata entries until `b` is used up; entries under the
/// protocol's own key `reserved` (the status details, the peer's
/// certificates) go to `values` instead.
fn parse_entries(
    mut b: Bytes,
    reserved: &str,
    values: &mut Vec<Bytes>,
    mut address: Option<&mut Option<Bytes>>,
) -> Result<Metadata, LeanError> {
    let mut md = Metadata::new();
    while !b.is_empty() {
        if b.len() < 2 {
            return Err(LeanError::Malformed("truncated metadata key"));
        }
        let kl = b.get_u16_le() as usize;
        if b.len() < kl + 4 {
            return Err(LeanError::Malformed("truncated metadata entry"));
        }
        let key = b.split_to(kl);
        let vl = b.get_u32_le() as usize;
        if b.len() < vl {
            return Err(LeanError::Malformed("truncated metadata value"));
        }
        let value = b.split_to(vl);
        let key = std::str::from_utf8(&key).map_err(|_| LeanError::Malformed("metadata key"))?;
        if !reserved.is_empty() && key == reserved {
            values.push(value);
            continue;
        }
        if let (Some(slot), PEER_ADDR_KEY) = (address.as_deref_mut(), key) {
            *slot = Some(value);
            continue;
        }
        let added = if metadata::is_binary(key) {
            md.insert_bin(key, &value)
        } else {
            std::str::from_utf8(&value)
                .map_err(|_| metadata::MetadataError::BadValue(key.to_string()))
                .and_then(|v| md.insert(key, v))
        };
        added.map_err(|_| LeanError::Malformed("invalid metadata entry"))?;
    }
    Ok(md)
}

/// Parses `bytes` as exactly one frame (header and sections), as the split
/// engine and application carry metadata and statuses beside a message.
pub fn parse_whole(bytes: &[u8]) -> Result<(FrameHeader, Sections), LeanError> {
    let mut buf = BytesMut::from(bytes);
    let (h, payload) =
        next_frame(&mut buf, bytes.len())?.ok_or(LeanError::Malformed("truncated frame"))?;
    if !buf.is_empty() {
        return Err(LeanError::Malformed("bytes after the frame"));
    }
    Ok((h, parse(&h, payload)?))
}

/// Parses the sections the header's flags announce.
pub fn parse(h: &FrameHeader, payload: Bytes) -> Result<Sections, LeanError> {
    let mut r = Reader { p: payload };
    let mut s = Sections::default();
    if h.has(OPEN) {
        let mut open = r.section()?;
        if open.len() < 8 {
            return Err(LeanError::Malformed("OPEN section without a timeout"));
        }
        let us = open.get_u64_le();
        let timeout = (us > 0).then(|| std::time::Duration::from_micros(us));
        let md = parse_entries(
            open,
            PEER_CERT_KEY,
            &mut s.peer_certificates,
            Some(&mut s.peer_address),
        )?;
        s.open = Some((timeout, md));
    }
    if h.has(HEADERS) {
        s.headers = Some(parse_metadata(r.section()?)?);
    }
    if h.has(MESSAGE) {
        s.message = Some(r.section()?);
    }
    if h.has(STATUS) {
        if !h.has(END) {
            return Err(LeanError::Malformed("STATUS without END"));
        }
        let code = r.u32()?;
        if code > 16 {
            return Err(LeanError::Malformed("status code out of range"));
        }
        let text = r.section()?;
        let text = String::from_utf8_lossy(&text).into_owned();
        let mut details = Vec::new();
        let md = parse_entries(std::mem::take(&mut r.p), DETAILS_KEY, &mut details, None)?;
        if details.len() > 1 {
            return Err(LeanError::Malformed("status details twice"));
        }
        s.status = Some(Status {
            metadata: md,
            details: details.pop().unwrap_or_default(),
            ..Status::new(Code::from_u32(code), text)
        });
    }
    if !r.p.is_empty() {
        return Err(LeanError::Malformed("bytes after the last section"));
    }
    Ok(s)
}

fn put_metadata(out: &mut Vec<u8>, md: &Metadata) {
    for (k, v) in md.iter() {
        put_entry(out, k, v);
    }
}

fn put_entry(out: &mut Vec<u8>, key: &str, value: &[u8]) {
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(value);
}

fn metadata_len(md: &Metadata) -> usize {
    md.iter().map(|(k, v)| 6 + k.len() + v.len()).sum()
}

/// The STATUS section's entries: the trailers, then the details if any.
fn status_entries_len(st: &Status) -> usize {
    let details = if st.details.is_empty() { 0 } else { 6 + DETAILS_KEY.len() + st.details.len() };
    metadata_len(&st.metadata) + details
}

/// What a frame to write carries.
#[derive(Debug, Default)]
pub struct Outgoing<'a> {
    /// OPEN: timeout and metadata.
    pub open: Option<(Option<std::time::Duration>, &'a Metadata)>,
    /// OPEN: the peer's verified certificates (engine to application).
    pub peer_certificates: &'a [Bytes],
    /// OPEN: the engine's note of the client's address ([`PEER_ADDR_KEY`]).
    pub peer_address: Option<&'a [u8]>,
    /// HEADERS.
    pub headers: Option<&'a Metadata>,
    /// MESSAGE.
    pub message: Option<&'a [u8]>,
    /// STATUS (sets END too).
    pub status: Option<&'a Status>,
    /// END.
    pub end: bool,
    /// CANCEL.
    pub cancel: bool,
}

/// The flags and payload length of the frame `f` describes.
fn shape(f: &Outgoing<'_>) -> (u16, usize, usize) {
    let mut flags = 0u16;
    let mut len = 0usize;
    let peer_len: usize =
        f.peer_certificates.iter().map(|c| 6 + PEER_CERT_KEY.len() + c.len()).sum::<usize>()
            + f.peer_address.map_or(0, |a| 6 + PEER_ADDR_KEY.len() + a.len());
    if let Some((_, md)) = f.open {
        flags |= OPEN;
        len += 4 + 8 + metadata_len(md) + peer_len;
    }
    if let Some(md) = f.headers {
        flags |= HEADERS;
        len += 4 + metadata_len(md);
    }
    if let Some(m) = f.message {
        flags |= MESSAGE;
        len += 4 + m.len();
    }
    if let Some(st) = f.status {
        flags |= STATUS | END;
        len += 8 + st.message.len() + status_entries_len(st);
    }
    if f.end {
        flags |= END;
    }
    if f.cancel {
        flags |= CANCEL;
    }
    (flags, len, peer_len)
}

/// Bytes [`write`] appends for `f`, header included.
pub fn encoded_len(f: &Outgoing<'_>) -> usize {
    HEADER_LEN + shape(f).1
}

/// Appends one frame to `out`. `None` if the payload would exceed 4 GiB.
pub fn write(out: &mut Vec<u8>, call: u32, method: u32, f: &Outgoing<'_>) -> Option<()> {
    let (flags, len, peer_len) = shape(f);
    let len32 = u32::try_from(len).ok()?;
    out.reserve(HEADER_LEN + len);
    out.extend_from_slice(&len32.to_le_bytes());
    out.extend_from_slice(&call.to_le_bytes());
    out.extend_from_slice(&method.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    if let Some((timeout, md)) = f.open {
        out.extend_from_slice(&((8 + metadata_len(md) + peer_len) as u32).to_le_bytes());
        let us = timeout.map_or(0, |t| t.as_micros().clamp(1, u64::MAX as u128) as u64);
        out.extend_from_slice(&us.to_le_bytes());
        put_metadata(out, md);
        for c in f.peer_certificates {
            put_entry(out, PEER_CERT_KEY, c);
        }
        if let Some(a) = f.peer_address {
            put_entry(out, PEER_ADDR_KEY, a);
        }
    }
    if let Some(md) = f.headers {
        out.extend_from_slice(&(metadata_len(md) as u32).to_le_bytes());
        put_metadata(out, md);
    }
    if let Some(m) = f.message {
        out.extend_from_slice(&(m.len() as u32).to_le_bytes());
        out.extend_from_slice(m);
    }
    if let Some(st) = f.status {
        out.extend_from_slice(&(st.code as u32).to_le_bytes());
        out.extend_from_slice(&(st.message.len() as u32).to_le_bytes());
        out.extend_from_slice(st.message.as_bytes());
        put_metadata(out, &st.metadata);
        if !st.details.is_empty() {
            put_entry(out, DETAILS_KEY, &st.details);
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(f: &Outgoing<'_>) -> (FrameHeader, Sections) {
        let mut out = Vec::new();
        write(&mut out, 7, 3, f).unwrap_or_default();
        let mut buf = BytesMut::from(&out[..]);
        let (h, p) = next_frame(&mut buf, 1 << 20).ok().flatten().unwrap_or_else(|| {
            (FrameHeader { len: 0, call: 0, method: 0, flags: 0 }, Bytes::new())
        });
        assert!(buf.is_empty());
        let s = parse(&h, p).unwrap_or_default();
        (h, s)
    }

    #[test]
    fn unary_frames_round_trip() {
        let mut md = Metadata::new();
        let _ = md.insert("k", "v");
        let _ = md.insert_bin("b-bin", &[0, 255]);
        let (h, s) = round_trip(&Outgoing {
            open: Some((Some(std::time::Duration::from_millis(5)), &md)),
            message: Some(b"hello"),
            end: true,
            ..Outgoing::default()
        });
        assert_eq!((h.call, h.method, h.flags), (7, 3, OPEN | MESSAGE | END));
        let (timeout, got) = s.open.unwrap_or_default();
        assert_eq!(timeout, Some(std::time::Duration::from_millis(5)));
        assert_eq!(got, md);
        assert_eq!(s.message.as_deref(), Some(&b"hello"[..]));

        let mut st = Status::with_details(
            Code::NotFound,
            "nope",
            Bytes::from_static(b"\x08\x05\x12\x04nope"),
        );
        let _ = st.metadata.insert("t", "x");
        let (h, s) =
            round_trip(&Outgoing { message: Some(b""), status: Some(&st), ..Outgoing::default() });
        assert_eq!(h.flags, MESSAGE | STATUS | END);
        assert_eq!(s.message.as_deref(), Some(&b""[..]));
        assert_eq!(s.status, Some(st));
    }

    #[test]
    fn partial_and_hostile_frames() {
        let mut out = Vec::new();
        write(&mut out, 1, 0, &Outgoing { message: Some(b"abc"), ..Outgoing::default() });
        for cut in 0..out.len() {
            let mut buf = BytesMut::from(&out[..cut]);
            assert_eq!(next_frame(&mut buf, 100), Ok(None), "cut at {cut}");
        }
        // Oversized: refused on the header alone.
        let mut buf = BytesMut::from(&out[..HEADER_LEN]);
        assert!(matches!(next_frame(&mut buf, 2), Err(LeanError::TooLarge { .. })));
        // Unknown flag.
        let mut bad = out.clone();
        bad[13] = 0x80;
        assert!(matches!(
            next_frame(&mut BytesMut::from(&bad[..]), 100),
            Err(LeanError::BadFlags(_))
        ));
        // A section longer than the payload.
        let h = FrameHeader { len: 4, call: 1, method: 0, flags: MESSAGE };
        assert!(parse(&h, Bytes::from_static(&[9, 0, 0, 0])).is_err());
        // Leftover bytes.
        assert!(parse(&h, Bytes::from_static(&[0, 0, 0, 0, 1])).is_err());
        // A status must end the call (found by fuzzing: re-encoding added
        // the END the parser had not asked for).
        let h = FrameHeader { len: 8, call: 1, method: 0, flags: STATUS };
        assert!(parse(&h, Bytes::from_static(&[0; 8])).is_err());
        // Status code out of range.
        let h = FrameHeader { len: 8, call: 1, method: 0, flags: STATUS | END };
        assert!(parse(&h, Bytes::from_static(&[99, 0, 0, 0, 0, 0, 0, 0])).is_err());
    }
}
