//! Side sections: a descriptor's side span holds one lean-transport frame
//! (`protoplane_grpc::lean`: the same sections, the same checks)
//! whose header is unused (call and method are zero: the descriptor
//! carries them). An empty span means no sections, which is the common
//! case: a request without metadata, a response that ends with a bare
//! status code (the descriptor's code field carries it).
//!
//! Two representations, one per direction:
//! - [`OpenRepr`], engine → application on OPEN: the request's timeout,
//!   custom metadata, the client certificate chain the engine verified,
//!   and, once per client connection, its address ([`OpenRepr::peer`]);
//! - [`ReplyRepr`], application → engine on HEADERS and STATUS: initial
//!   metadata and the status with its trailers and details.
//!
//! Whoever reads a side span reads bytes the other process wrote, so
//! `parse` takes any bytes and fails with a [`SeamError`], never a panic.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use protoplane_grpc::lean::{self as frame, LeanError, Outgoing};
use protoplane_grpc::metadata::Metadata;
use protoplane_grpc::status::{Code, Status};

/// Side sections that cannot be taken.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SeamError {
    /// The bytes are not one well-formed frame of sections.
    Malformed(LeanError),
    /// A peer note that is not `SLOT ADDRESS`.
    BadPeer,
    /// A status where the descriptor has no STATUS flag.
    UnexpectedStatus,
    /// Sections of the other direction (an OPEN from the application, a
    /// HEADERS or STATUS from the engine), or a message: a message never
    /// travels in side sections.
    WrongSections,
}

impl std::fmt::Display for SeamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SeamError::Malformed(e) => write!(f, "side sections: {e}"),
            SeamError::BadPeer => f.write_str("side sections: a malformed peer address"),
            SeamError::UnexpectedStatus => {
                f.write_str("side sections: a status without the STATUS flag")
            }
            SeamError::WrongSections => {
                f.write_str("side sections: sections this direction does not carry")
            }
        }
    }
}

impl std::error::Error for SeamError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SeamError::Malformed(e) => Some(e),
            _ => None,
        }
    }
}

impl From<SeamError> for Status {
    /// A call whose side sections cannot be taken fails with INTERNAL: the
    /// other side broke the protocol.
    fn from(e: SeamError) -> Status {
        Status::new(Code::Internal, e.to_string())
    }
}

/// Parses `bytes` as one frame of sections (none when empty).
fn sections(bytes: &[u8]) -> Result<Option<frame::Sections>, SeamError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let (_, s) = frame::parse_whole(bytes).map_err(SeamError::Malformed)?;
    if s.message.is_some() {
        return Err(SeamError::WrongSections);
    }
    Ok(Some(s))
}

/// Engine → application, with OPEN.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpenRepr {
    /// The time left when the engine posted the call, as the client sent
    /// it (the descriptor's own timeout field is what the application
    /// enforces).
    pub timeout: Option<Duration>,
    /// The request's custom metadata.
    pub metadata: Metadata,
    /// The client's verified certificate chain (DER, leaf first), when the
    /// engine terminated mutual TLS.
    pub peer_certificates: Vec<Bytes>,
    /// The client's address, noted for a connection slot: the engine numbers
    /// the client connections whose calls reach an application (1 to 255,
    /// in each OPEN descriptor's `code` field, which OPEN does not
    /// otherwise use) and says which address a number stands for with the
    /// first call that uses it. Later calls of the connection carry only
    /// the number, so the address costs no side sections per call. Slot 0
    /// with an address: that call only (every slot was taken).
    pub peer: Option<(u8, SocketAddr)>,
}

impl OpenRepr {
    /// Takes the side sections of an OPEN descriptor.
    pub fn parse(bytes: &[u8]) -> Result<OpenRepr, SeamError> {
        let Some(s) = sections(bytes)? else { return Ok(OpenRepr::default()) };
        if s.headers.is_some() || s.status.is_some() {
            return Err(SeamError::WrongSections);
        }
        let (timeout, metadata) = s.open.unwrap_or_default();
        let peer = match s.peer_address {
            None => None,
            Some(b) => Some(parse_peer(&b).ok_or(SeamError::BadPeer)?),
        };
        Ok(OpenRepr { timeout, metadata, peer_certificates: s.peer_certificates, peer })
    }

    /// Whether there is nothing to send: no metadata and no certificates
    /// (the descriptor carries the timeout itself).
    pub fn is_empty(&self) -> bool {
        self.metadata.is_empty() && self.peer_certificates.is_empty() && self.peer.is_none()
    }

    /// Bytes [`OpenRepr::emit`] writes (0 when [`OpenRepr::is_empty`]).
    pub fn buffer_len(&self) -> usize {
        let note = self.peer.map(note_text);
        open_len(self.timeout, &self.metadata, &self.peer_certificates, note.as_deref())
    }

    /// Appends the sections to `out` (nothing when empty).
    pub fn emit(&self, out: &mut Vec<u8>) {
        OpenRepr::emit_open(self.timeout, &self.metadata, &self.peer_certificates, self.peer, out)
    }

    /// [`OpenRepr::emit_parts`] with a peer note.
    pub fn emit_open(
        timeout: Option<Duration>,
        metadata: &Metadata,
        certs: &[Bytes],
        peer: Option<(u8, SocketAddr)>,
        out: &mut Vec<u8>,
    ) {
        let note = peer.map(note_text);
        write_open(timeout, metadata, certs, note.as_deref(), out)
    }

    /// [`OpenRepr::buffer_len`] of borrowed parts.
    pub fn parts_len(timeout: Option<Duration>, metadata: &Metadata, certs: &[Bytes]) -> usize {
        open_len(timeout, metadata, certs, None)
    }

    /// [`OpenRepr::emit`] of borrowed parts: what the engine writes for
    /// each call, with nothing copied or allocated for an empty one.
    pub fn emit_parts(
        timeout: Option<Duration>,
        metadata: &Metadata,
        certs: &[Bytes],
        out: &mut Vec<u8>,
    ) {
        write_open(timeout, metadata, certs, None, out)
    }
}

/// The peer note's text, `SLOT ADDRESS`.
fn note_text((slot, addr): (u8, SocketAddr)) -> String {
    format!("{slot} {addr}")
}

/// Bytes an OPEN's sections take (0 when there are none).
fn open_len(
    timeout: Option<Duration>,
    metadata: &Metadata,
    certs: &[Bytes],
    note: Option<&str>,
) -> usize {
    if metadata.is_empty() && certs.is_empty() && note.is_none() {
        return 0;
    }
    let mut f = open_outgoing(timeout, metadata, certs);
    f.peer_address = note.map(str::as_bytes);
    frame::encoded_len(&f)
}

/// Appends an OPEN's sections (nothing when there are none).
fn write_open(
    timeout: Option<Duration>,
    metadata: &Metadata,
    certs: &[Bytes],
    note: Option<&str>,
    out: &mut Vec<u8>,
) {
    if metadata.is_empty() && certs.is_empty() && note.is_none() {
        return;
    }
    let mut f = open_outgoing(timeout, metadata, certs);
    f.peer_address = note.map(str::as_bytes);
    // A side span is bounded by a chunk, far below the 4 GiB a frame can
    // declare.
    let _ = frame::write(out, 0, 0, &f);
}

/// `SLOT ADDRESS`.
fn parse_peer(b: &[u8]) -> Option<(u8, SocketAddr)> {
    let text = std::str::from_utf8(b).ok()?;
    let (slot, addr) = text.split_once(' ')?;
    Some((slot.parse().ok()?, addr.parse().ok()?))
}

fn open_outgoing<'a>(
    timeout: Option<Duration>,
    metadata: &'a Metadata,
    certs: &'a [Bytes],
) -> Outgoing<'a> {
    Outgoing { open: Some((timeout, metadata)), peer_certificates: certs, ..Outgoing::default() }
}

/// Application → engine, with HEADERS and STATUS.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplyRepr {
    /// Initial metadata (HEADERS).
    pub headers: Option<Metadata>,
    /// The call's status (STATUS), when more than a bare code: a message,
    /// trailers or details.
    pub status: Option<Status>,
}

/// Whether a status needs side sections: anything beyond its code.
fn is_bare(st: &Status) -> bool {
    st.message.is_empty() && st.metadata.is_empty() && st.details.is_empty()
}

impl ReplyRepr {
    /// The sections of a reply carrying `headers` and `status`; a bare
    /// status (code only) is left to the descriptor's code field.
    pub fn new(headers: Option<&Metadata>, status: Option<&Status>) -> ReplyRepr {
        ReplyRepr { headers: headers.cloned(), status: status.filter(|s| !is_bare(s)).cloned() }
    }

    /// Takes the side sections of an application's descriptor;
    /// `with_status`: the descriptor has the STATUS flag.
    pub fn parse(bytes: &[u8], with_status: bool) -> Result<ReplyRepr, SeamError> {
        let Some(s) = sections(bytes)? else { return Ok(ReplyRepr::default()) };
        if s.open.is_some() || !s.peer_certificates.is_empty() {
            return Err(SeamError::WrongSections);
        }
        if s.status.is_some() && !with_status {
            return Err(SeamError::UnexpectedStatus);
        }
        Ok(ReplyRepr { headers: s.headers, status: s.status })
    }

    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.headers.is_none() && self.status.as_ref().is_none_or(is_bare)
    }

    /// Bytes [`ReplyRepr::emit`] writes (0 when [`ReplyRepr::is_empty`]).
    pub fn buffer_len(&self) -> usize {
        ReplyRepr::parts_len(self.headers.as_ref(), self.status.as_ref())
    }

    /// Appends the sections to `out` (nothing when empty).
    pub fn emit(&self, out: &mut Vec<u8>) {
        ReplyRepr::emit_parts(self.headers.as_ref(), self.status.as_ref(), out)
    }

    /// [`ReplyRepr::buffer_len`] of borrowed parts.
    pub fn parts_len(headers: Option<&Metadata>, status: Option<&Status>) -> usize {
        match reply_outgoing(headers, status) {
            Some(f) => frame::encoded_len(&f),
            None => 0,
        }
    }

    /// [`ReplyRepr::emit`] of borrowed parts: what the application writes
    /// as it answers, with nothing copied.
    pub fn emit_parts(headers: Option<&Metadata>, status: Option<&Status>, out: &mut Vec<u8>) {
        if let Some(f) = reply_outgoing(headers, status) {
            let _ = frame::write(out, 0, 0, &f);
        }
    }
}

/// The frame of a reply; `None` when it has nothing to say.
fn reply_outgoing<'a>(
    headers: Option<&'a Metadata>,
    status: Option<&'a Status>,
) -> Option<Outgoing<'a>> {
    let status = status.filter(|s| !is_bare(s));
    if headers.is_none() && status.is_none() {
        return None;
    }
    Some(Outgoing { headers, status, ..Outgoing::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(pairs: &[(&str, &str)]) -> Metadata {
        let mut m = Metadata::new();
        for (k, v) in pairs {
            m.insert(k, v).unwrap_or_else(|e| panic!("{e}"));
        }
        m
    }

    fn emitted(len: usize, emit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = Vec::new();
        emit(&mut out);
        assert_eq!(out.len(), len, "buffer_len is what emit writes");
        out
    }

    #[test]
    fn an_open_round_trips_and_an_empty_one_is_no_bytes() {
        let open = OpenRepr {
            timeout: Some(Duration::from_millis(250)),
            metadata: md(&[("x-user", "ada"), ("x-trace", "7")]),
            peer_certificates: vec![Bytes::from_static(b"\x30\x82leaf"), Bytes::from_static(b"ca")],
            peer: None,
        };
        let bytes = emitted(open.buffer_len(), |o| open.emit(o));
        assert_eq!(OpenRepr::parse(&bytes), Ok(open));

        // A peer note alone makes sections, and round-trips (IPv4, IPv6).
        for addr in ["127.0.0.1:50312", "[::1]:4000"] {
            let noted =
                OpenRepr { peer: Some((7, addr.parse().expect("address"))), ..OpenRepr::default() };
            let bytes = emitted(noted.buffer_len(), |o| noted.emit(o));
            assert!(!bytes.is_empty());
            assert_eq!(OpenRepr::parse(&bytes), Ok(noted));
        }

        let bare = OpenRepr { timeout: Some(Duration::from_secs(1)), ..OpenRepr::default() };
        assert!(bare.is_empty());
        assert_eq!(emitted(bare.buffer_len(), |o| bare.emit(o)), b"");
        assert_eq!(OpenRepr::parse(b""), Ok(OpenRepr::default()));
    }

    #[test]
    fn a_reply_round_trips_and_a_bare_status_is_no_bytes() {
        let mut st = Status::new(Code::NotFound, "no such user");
        st.metadata = md(&[("x-retry", "no")]);
        st.details = Bytes::from_static(b"\x08\x05");
        let reply = ReplyRepr::new(Some(&md(&[("x-served-by", "a")])), Some(&st));
        let bytes = emitted(reply.buffer_len(), |o| reply.emit(o));
        assert_eq!(ReplyRepr::parse(&bytes, true), Ok(reply));

        let bare = ReplyRepr::new(None, Some(&Status::new(Code::Ok, "")));
        assert!(bare.is_empty() && bare.status.is_none());
        assert_eq!(emitted(bare.buffer_len(), |o| bare.emit(o)), b"");
        let headers_only = ReplyRepr::new(Some(&md(&[("k", "v")])), None);
        let bytes = emitted(headers_only.buffer_len(), |o| headers_only.emit(o));
        assert_eq!(ReplyRepr::parse(&bytes, false), Ok(headers_only));
    }

    #[test]
    fn a_malformed_peer_note_is_refused() {
        let md = Metadata::new();
        for note in [&b"7"[..], b"x 127.0.0.1:1", b"300 127.0.0.1:1", b"7 nowhere", b"\xff \xff"] {
            let mut f = open_outgoing(None, &md, &[]);
            f.peer_address = Some(note);
            let mut bytes = Vec::new();
            frame::write(&mut bytes, 0, 0, &f).unwrap_or_else(|| panic!("frame"));
            assert_eq!(OpenRepr::parse(&bytes), Err(SeamError::BadPeer), "{note:?}");
        }
    }

    #[test]
    fn sections_of_the_wrong_kind_are_refused() {
        let st = Status::new(Code::Internal, "boom");
        let reply = ReplyRepr::new(None, Some(&st));
        let bytes = emitted(reply.buffer_len(), |o| reply.emit(o));
        assert_eq!(ReplyRepr::parse(&bytes, false), Err(SeamError::UnexpectedStatus));
        assert_eq!(OpenRepr::parse(&bytes), Err(SeamError::WrongSections));

        let open = OpenRepr { metadata: md(&[("k", "v")]), ..OpenRepr::default() };
        let bytes = emitted(open.buffer_len(), |o| open.emit(o));
        assert_eq!(ReplyRepr::parse(&bytes, true), Err(SeamError::WrongSections));

        let mut message = Vec::new();
        let f = Outgoing { message: Some(b"m"), ..Outgoing::default() };
        frame::write(&mut message, 0, 0, &f).unwrap_or_else(|| panic!("frame"));
        assert_eq!(ReplyRepr::parse(&message, true), Err(SeamError::WrongSections));
    }

    #[test]
    fn any_bytes_parse_to_a_repr_or_an_error() {
        let st = Status::new(Code::Aborted, "try again");
        let reply = ReplyRepr::new(Some(&md(&[("a", "b")])), Some(&st));
        let good = emitted(reply.buffer_len(), |o| reply.emit(o));
        // Every truncation, and every single-byte change, of a good frame.
        for cut in 0..good.len() {
            let _ = ReplyRepr::parse(&good[..cut], true);
            let _ = OpenRepr::parse(&good[..cut]);
        }
        for i in 0..good.len() {
            for b in [0u8, 1, 0x7f, 0xff] {
                let mut bad = good.clone();
                bad[i] = b;
                let _ = ReplyRepr::parse(&bad, true);
                let _ = OpenRepr::parse(&bad);
            }
        }
        let e = ReplyRepr::parse(&good[..good.len() - 1], true);
        assert!(matches!(e, Err(SeamError::Malformed(_))), "{e:?}");
        assert_eq!(Status::from(SeamError::UnexpectedStatus).code, Code::Internal);
    }
}
