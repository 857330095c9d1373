//! Header blocks: HEADERS and CONTINUATION in (HPACK decoding into one
//! reused [`HeaderList`], bounded in decoded bytes, in encoded bytes and
//! in frames, each field checked as RFC 9113 §8.2 and §8.3 say), and out
//! (HPACK encoding straight into the output, split into CONTINUATION
//! frames when larger than the peer's frame size; trailers held behind
//! pending data are recorded and encoded when sent, since HPACK blocks
//! must be encoded in the order they go out).

use crate::frame::{self, flag, kind, Head, Reason, HEADER_LEN};
use crate::hpack::{self, Index};

use super::streams::Stream;
use super::{Conn, ConnError, Event, Role};

/// Receives header fields to send: an HPACK encoder writing into the
/// output, or a recorder when the block must wait (trailers behind data
/// that flow control holds back: HPACK blocks must be encoded in the order
/// they are sent).
pub trait FieldSink {
    /// One field (name in lowercase).
    fn field(&mut self, name: &[u8], value: &[u8], index: Index);
}

pub(super) struct EncodeSink<'a> {
    pub(super) enc: &'a mut hpack::Encoder,
    pub(super) out: &'a mut Vec<u8>,
}

impl FieldSink for EncodeSink<'_> {
    #[inline]
    fn field(&mut self, name: &[u8], value: &[u8], index: Index) {
        self.enc.encode(name, value, index, self.out);
    }
}

/// Fields recorded to be encoded later.
#[derive(Debug, Default)]
pub(super) struct Recorded {
    pub(super) bytes: Vec<u8>,
    pub(super) fields: Vec<(usize, usize, usize, Index)>,
}

impl FieldSink for Recorded {
    fn field(&mut self, name: &[u8], value: &[u8], index: Index) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(name);
        self.bytes.extend_from_slice(value);
        self.fields.push((start, start + name.len(), self.bytes.len(), index));
    }
}

impl Recorded {
    pub(super) fn replay(&self, sink: &mut dyn FieldSink) {
        for &(a, b, c, index) in &self.fields {
            sink.field(&self.bytes[a..b], &self.bytes[b..c], index);
        }
    }
}

/// A decoded header block: the pseudo-header fields picked out, the
/// regular fields in order, all in one reused buffer (no allocation per
/// block once warm).
#[derive(Debug, Default)]
pub struct HeaderList {
    pub(super) buf: Vec<u8>,
    /// Regular fields: (name start, value start, value end) in `buf`.
    pub(super) fields: Vec<(u32, u32, u32)>,
    pub(super) method: Option<(u32, u32)>,
    pub(super) scheme: Option<(u32, u32)>,
    pub(super) path: Option<(u32, u32)>,
    pub(super) authority: Option<(u32, u32)>,
    pub(super) status: Option<(u32, u32)>,
    pub(super) content_length: Option<u64>,
    /// The first rule of RFC 9113 §8 the block broke.
    pub(super) malformed: Option<&'static str>,
    /// The block decoded to more than the header list limit: only the
    /// fields before the limit are here.
    pub(super) too_large: bool,
}

/// Which block a [`HeaderList`] is checked as.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum BlockKind {
    Request,
    Response,
    Trailers,
}

impl HeaderList {
    pub(super) fn clear(&mut self) {
        self.buf.clear();
        self.fields.clear();
        self.method = None;
        self.scheme = None;
        self.path = None;
        self.authority = None;
        self.status = None;
        self.content_length = None;
        self.malformed = None;
        self.too_large = false;
    }

    pub(super) fn get(&self, r: Option<(u32, u32)>) -> Option<&[u8]> {
        r.map(|(a, b)| &self.buf[a as usize..b as usize])
    }

    /// `:method`.
    pub fn method(&self) -> Option<&[u8]> {
        self.get(self.method)
    }
    /// `:scheme`.
    pub fn scheme(&self) -> Option<&[u8]> {
        self.get(self.scheme)
    }
    /// `:path`.
    pub fn path(&self) -> Option<&[u8]> {
        self.get(self.path)
    }
    /// `:authority`.
    pub fn authority(&self) -> Option<&[u8]> {
        self.get(self.authority)
    }
    /// `:status`.
    pub fn status(&self) -> Option<&[u8]> {
        self.get(self.status)
    }
    /// Whether the block decoded to more than the header list limit (the
    /// fields past it are missing).
    pub fn too_large(&self) -> bool {
        self.too_large
    }

    /// The regular fields, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.fields.iter().map(|&(n, v, e)| {
            (&self.buf[n as usize..v as usize], &self.buf[v as usize..e as usize])
        })
    }

    /// The first value of the regular field `name`.
    pub fn get_field(&self, name: &[u8]) -> Option<&[u8]> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    pub(super) fn bad(&mut self, why: &'static str) {
        if self.malformed.is_none() {
            self.malformed = Some(why);
        }
    }

    /// Takes one decoded field, checking it as RFC 9113 §8.2 and §8.3 say.
    pub(super) fn push(&mut self, kind: BlockKind, name: &[u8], value: &[u8]) {
        // Folds rather than `any`: with no early exit, both checks
        // vectorize (they were 4–5% of a gRPC server's CPU per call as
        // byte-at-a-time loops).
        if value.iter().fold(false, |bad, &b| bad | (b == 0) | (b == b'\r') | (b == b'\n')) {
            self.bad("a field value holds NUL, CR or LF");
        }
        let start = self.buf.len() as u32;
        if let Some(pseudo) = name.strip_prefix(b":") {
            if !self.fields.is_empty() {
                return self.bad("a pseudo-header field after a regular one");
            }
            self.buf.extend_from_slice(value);
            let r = Some((start, self.buf.len() as u32));
            let slot = match (kind, pseudo) {
                (BlockKind::Request, b"method") => &mut self.method,
                (BlockKind::Request, b"scheme") => &mut self.scheme,
                (BlockKind::Request, b"path") => &mut self.path,
                (BlockKind::Request, b"authority") => &mut self.authority,
                (BlockKind::Response, b"status") => &mut self.status,
                _ => return self.bad("an unknown or misplaced pseudo-header field"),
            };
            if slot.is_some() {
                return self.bad("a repeated pseudo-header field");
            }
            *slot = r;
            return;
        }
        if name.is_empty()
            || name.iter().fold(false, |bad, &b| {
                bad | b.is_ascii_uppercase() | (b <= b' ') | (b == b':') | (b >= 0x7f)
            })
        {
            return self.bad("an invalid field name (uppercase, space or control)");
        }
        match name {
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding"
            | b"upgrade" => return self.bad("a connection-specific field"),
            b"te" if value != b"trailers" => return self.bad("te other than \"trailers\""),
            b"content-length" => {
                let n = std::str::from_utf8(value).ok().and_then(|s| s.parse::<u64>().ok());
                match (n, self.content_length) {
                    (None, _) => return self.bad("an unparsable content-length"),
                    (Some(n), Some(m)) if n != m => {
                        return self.bad("conflicting content-length values")
                    }
                    (Some(n), _) => self.content_length = Some(n),
                }
            }
            _ => {}
        }
        self.buf.extend_from_slice(name);
        let v = self.buf.len() as u32;
        self.buf.extend_from_slice(value);
        self.fields.push((start, v, self.buf.len() as u32));
    }

    /// Checks the block as a whole once decoded.
    pub(super) fn finish(&mut self, kind: BlockKind) {
        match kind {
            BlockKind::Request => {
                let connect = self.method() == Some(b"CONNECT");
                if self.method.is_none() {
                    self.bad("no :method");
                } else if !connect && (self.scheme.is_none() || self.path.is_none()) {
                    self.bad("no :scheme or :path");
                } else if self.path().is_some_and(|p| p.is_empty()) {
                    self.bad("an empty :path");
                }
            }
            BlockKind::Response => {
                if self.status.is_none() {
                    self.bad("no :status");
                }
            }
            BlockKind::Trailers => {}
        }
    }
}

/// A header block whose CONTINUATION frames are still coming.
#[derive(Debug)]
pub(super) struct Partial {
    pub(super) stream: u32,
    pub(super) end_stream: bool,
    /// The block's stream is to be refused or reset once decoded (the
    /// block must still be decoded: HPACK state is per connection).
    pub(super) reject: Option<Reason>,
    pub(super) frames: u32,
}

/// Bytes of CONTINUATION accepted for one header block, per byte of the
/// header list limit: HPACK's Huffman code can make an encoded string
/// longer than its text, but not by more than this.
pub(super) const BLOCK_SLACK: usize = 4;

/// CONTINUATION frames accepted for one header block.
pub(super) const MAX_CONTINUATIONS: u32 = 64;

impl Conn {
    pub(super) fn on_headers(
        &mut self,
        head: Head,
        payload: &[u8],
    ) -> Result<Option<Event>, ConnError> {
        let id = head.stream;
        if id == 0 {
            return Err(self.fail(Reason::PROTOCOL_ERROR, "HEADERS on stream 0"));
        }
        let mut frag = self.unpad(&head, payload)?;
        let mut reject = None;
        if head.has(flag::PRIORITY) {
            if frag.len() < 5 {
                return Err(self.fail(Reason::FRAME_SIZE_ERROR, "HEADERS priority block cut"));
            }
            let dep = u32::from_be_bytes([frag[0], frag[1], frag[2], frag[3]]) & 0x7fff_ffff;
            if dep == id {
                reject = Some(Reason::PROTOCOL_ERROR);
            }
            frag = &frag[5..];
        }
        let end_stream = head.has(flag::END_STREAM);
        let existing = self.streams.get(&id).map(|s| (s.recv_closed, s.got_headers));
        match existing {
            Some((true, _)) => reject = reject.or(Some(Reason::STREAM_CLOSED)),
            Some((false, got)) => {
                // Trailers (or, client side, the response's headers).
                if got && !end_stream {
                    reject = reject.or(Some(Reason::PROTOCOL_ERROR));
                }
            }
            None if self.is_local(id) => {
                // A stream of ours that is gone (or never was).
                if id >= self.next_local {
                    return Err(self.fail(Reason::PROTOCOL_ERROR, "HEADERS on an idle stream"));
                }
                reject = reject.or(Some(Reason::STREAM_CLOSED));
            }
            None => {
                if self.cfg.role == Role::Client {
                    return Err(self.fail(Reason::PROTOCOL_ERROR, "server opened a stream"));
                }
                if id <= self.last_peer_stream {
                    if self.closed.has(id) || self.reset_by_us.has(id) {
                        return Err(self.fail(Reason::STREAM_CLOSED, "HEADERS on a closed stream"));
                    }
                    return Err(self.fail(Reason::PROTOCOL_ERROR, "stream id went backwards"));
                }
                self.last_peer_stream = id;
                if self.goaway_sent {
                    // Ignored: after GOAWAY, new streams are not processed.
                    reject = reject.or(Some(Reason::REFUSED_STREAM));
                } else if self.streams.len() >= self.cfg.max_concurrent_streams as usize {
                    reject = reject.or(Some(Reason::REFUSED_STREAM));
                }
            }
        }
        if head.has(flag::END_HEADERS) {
            self.finish_block(id, end_stream, reject, Some(frag))
        } else {
            self.block.clear();
            self.block.extend_from_slice(frag);
            self.continuation = Some(Partial { stream: id, end_stream, reject, frames: 0 });
            self.check_block_size()?;
            Ok(None)
        }
    }

    pub(super) fn check_block_size(&mut self) -> Result<(), ConnError> {
        let limit = (self.cfg.max_header_list as usize).max(4096) * BLOCK_SLACK;
        if self.block.len() > limit {
            return Err(self.fail(Reason::ENHANCE_YOUR_CALM, "header block too large"));
        }
        Ok(())
    }

    pub(super) fn on_continuation(
        &mut self,
        head: Head,
        payload: &[u8],
    ) -> Result<Option<Event>, ConnError> {
        let Some(p) = self.continuation.as_mut() else {
            return Err(self.fail(Reason::PROTOCOL_ERROR, "CONTINUATION without HEADERS"));
        };
        p.frames += 1;
        if p.frames > MAX_CONTINUATIONS {
            return Err(self.fail(Reason::ENHANCE_YOUR_CALM, "too many CONTINUATION frames"));
        }
        self.block.extend_from_slice(payload);
        self.check_block_size()?;
        if !head.has(flag::END_HEADERS) {
            return Ok(None);
        }
        let Some(p) = self.continuation.take() else { return Ok(None) };
        self.finish_block(p.stream, p.end_stream, p.reject, None)
    }

    /// Decodes a complete header block (from `frag`, or the accumulated
    /// CONTINUATION buffer) and acts on it.
    pub(super) fn finish_block(
        &mut self,
        id: u32,
        end_stream: bool,
        mut reject: Option<Reason>,
        frag: Option<&[u8]>,
    ) -> Result<Option<Event>, ConnError> {
        let existing = self.streams.get(&id).map(|s| s.got_headers);
        let block_kind = match (self.cfg.role, existing) {
            (_, Some(true)) => BlockKind::Trailers,
            (Role::Server, _) => BlockKind::Request,
            (Role::Client, _) => BlockKind::Response,
        };
        self.headers.clear();
        let max = self.cfg.max_header_list as usize;
        let list = &mut self.headers;
        let block = match frag {
            Some(f) => f,
            None => &self.block[..],
        };
        let r = self.decoder.decode(block, max, |n, v| list.push(block_kind, n, v));
        match r {
            Ok(()) => {}
            Err(hpack::HpackError::ListTooLarge) => self.headers.too_large = true,
            Err(_) => return Err(self.fail(Reason::COMPRESSION_ERROR, "HPACK decoding failed")),
        }
        if !self.headers.too_large {
            self.headers.finish(block_kind);
        }
        if block_kind == BlockKind::Trailers && self.headers.method.is_some() {
            self.headers.bad("pseudo-header fields in trailers");
        }
        if self.headers.malformed.is_some() {
            reject = reject.or(Some(Reason::PROTOCOL_ERROR));
        }
        if let Some(reason) = reject {
            let known = existing.is_some();
            if reason == Reason::REFUSED_STREAM && !known {
                frame::write_rst(&mut self.out.buf, id, reason);
                self.reset_by_us.add(id);
                return Ok(None);
            }
            self.stream_error(id, reason)?;
            return Ok(if known { self.reset_event(id, reason) } else { None });
        }
        self.idle_frames = 0;
        match existing {
            None => {
                // A new stream (server: a request).
                let mut s = Stream::new(self.peer.initial_window, self.cfg.stream_window);
                s.opened_ms = self.now_ms;
                s.got_headers = true;
                s.recv_closed = end_stream;
                s.content_length = self.headers.content_length;
                if end_stream && s.content_length.is_some_and(|n| n != 0) {
                    self.stream_error(id, Reason::PROTOCOL_ERROR)?;
                    return Ok(None);
                }
                self.streams.insert(id, s);
                Ok(Some(Event::Open { stream: id, end_stream }))
            }
            Some(false) => {
                // Client: the response's headers.
                let Some(s) = self.streams.get_mut(&id) else { return Ok(None) };
                s.got_headers = true;
                s.content_length = self.headers.content_length;
                if end_stream {
                    s.recv_closed = true;
                    self.maybe_remove(id);
                }
                Ok(Some(Event::Headers { stream: id, end_stream }))
            }
            Some(true) => {
                let Some(s) = self.streams.get_mut(&id) else { return Ok(None) };
                if s.content_length.is_some_and(|n| n != s.data_received) {
                    self.stream_error(id, Reason::PROTOCOL_ERROR)?;
                    return Ok(self.reset_event(id, Reason::PROTOCOL_ERROR));
                }
                s.recv_closed = true;
                self.maybe_remove(id);
                Ok(Some(Event::Trailers { stream: id }))
            }
        }
    }

    /// Sends a header block on stream `id` now (HEADERS, and CONTINUATION
    /// when it is larger than the peer's frame size); `end_stream`: nothing
    /// follows. `fields` writes the fields into the sink.
    pub fn send_headers(
        &mut self,
        id: u32,
        end_stream: bool,
        fields: impl FnOnce(&mut dyn FieldSink),
    ) {
        let Some(s) = self.streams.get_mut(&id) else { return };
        if s.send_closed {
            return;
        }
        if end_stream {
            s.send_closed = true;
        }
        self.sent_stream_frames = true;
        self.write_block(id, end_stream, fields);
        if end_stream {
            self.after_send_end(id);
        }
    }

    pub(super) fn write_block(
        &mut self,
        id: u32,
        end_stream: bool,
        fields: impl FnOnce(&mut dyn FieldSink),
    ) {
        let buf = &mut self.out.buf;
        let at = buf.len();
        let flags = if end_stream { flag::END_STREAM } else { 0 };
        frame::write_head(buf, 0, kind::HEADERS, flags, id);
        self.encoder.begin(buf);
        fields(&mut EncodeSink { enc: &mut self.encoder, out: buf });
        let len = buf.len() - at - HEADER_LEN;
        let max = self.peer.max_frame as usize;
        if len <= max {
            frame::patch_len(buf, at, len);
            buf[at + 4] |= flag::END_HEADERS;
            return;
        }
        let block = buf.split_off(at + HEADER_LEN);
        buf.truncate(at);
        let mut chunks = block.chunks(max).peekable();
        let mut first = true;
        while let Some(c) = chunks.next() {
            let last = chunks.peek().is_none();
            let (k, mut f) = if first { (kind::HEADERS, flags) } else { (kind::CONTINUATION, 0) };
            if last {
                f |= flag::END_HEADERS;
            }
            frame::write_head(buf, c.len(), k, f, id);
            buf.extend_from_slice(c);
            first = false;
        }
    }

    /// Sends trailers (END_STREAM) on stream `id`: now, or after the data
    /// that flow control still holds.
    pub fn send_trailers(&mut self, id: u32, fields: impl FnOnce(&mut dyn FieldSink)) {
        let Some(s) = self.streams.get_mut(&id) else { return };
        if s.send_closed {
            return;
        }
        s.send_closed = true;
        self.sent_stream_frames = true;
        if s.pending.is_empty() {
            self.write_block(id, true, fields);
            self.after_send_end(id);
        } else {
            let mut rec = Recorded::default();
            fields(&mut rec);
            s.trailers = Some(rec);
        }
    }
}
