//! The HTTP/2 connection state machine, sans I/O (after quinn-proto's
//! design): bytes in, events and bytes out. No sockets, clocks or tasks
//! here, so a socket loop (the gRPC server and client in this module's
//! siblings), a test, a fuzzer or a spinning engine core can all drive it.
//!
//! Input: [`Conn::next_event`] takes bytes received (any split) and returns
//! the next [`Event`] once a frame completes one; frames that need no
//! attention from the caller (SETTINGS, PING, WINDOW_UPDATE, PRIORITY) are
//! handled inside and answered through the output. Output: frames are
//! appended to an [`Output`] that the socket loop writes with one
//! vectored write per flush; small frames are copied into one buffer, large
//! DATA payloads are referenced, not copied.
//!
//! What it enforces, so a hostile peer costs bounded memory and CPU:
//! - RFC 9113 framing and stream states (errors as the RFC assigns them:
//!   connection errors end with GOAWAY, stream errors with RST_STREAM);
//! - flow control both ways: the peer may never send beyond the windows we
//!   granted, and we return credit only as the caller consumes data
//!   ([`Conn::release`]);
//! - header blocks: at most `max_header_list` decoded bytes (RFC 9113
//!   §6.5.2 accounting, so an HPACK bomb of repeated table references is
//!   cut off without being materialised) and a bounded number of bytes and
//!   frames of CONTINUATION;
//! - stream resets by the peer (CVE-2023-44487, "rapid reset") and frames
//!   that make no progress (empty DATA, PRIORITY, SETTINGS, PING, unknown
//!   types: CVE-2019-9512/9518) draw on budgets that useful work refills;
//!   an exhausted budget ends the connection with ENHANCE_YOUR_CALM.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::IoSlice;

use bytes::{Buf, Bytes, BytesMut};

use super::frame::{self, flag, kind, setting, Head, Reason, HEADER_LEN, PREFACE};
use super::hpack::{self, Index};

/// Which side of the connection this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Accepts streams (odd ids opened by the peer).
    Server,
    /// Opens streams (odd ids, ours).
    Client,
}

/// Settings of our side of a connection.
#[derive(Clone, Debug)]
pub struct Config {
    /// Which side this is.
    pub role: Role,
    /// Streams the peer may have open at once (server: beyond this a new
    /// stream is refused with REFUSED_STREAM).
    pub max_concurrent_streams: u32,
    /// The receive window of each stream.
    pub stream_window: u32,
    /// The receive window of the connection.
    pub connection_window: u32,
    /// The largest decoded header list accepted (name + value + 32 per
    /// field, RFC 9113 §6.5.2).
    pub max_header_list: u32,
    /// The largest frame payload accepted.
    pub max_frame_size: u32,
    /// Peer stream resets (and stream errors the peer provokes) allowed
    /// beyond the streams it completed; see the module documentation.
    pub reset_budget: u32,
    /// Frames that make no progress allowed in a row.
    pub idle_frame_budget: u32,
}

impl Config {
    /// Defaults for `role`.
    pub fn new(role: Role) -> Config {
        Config {
            role,
            max_concurrent_streams: 1024,
            stream_window: 1 << 20,
            connection_window: 4 << 20,
            max_header_list: 16 << 10,
            max_frame_size: frame::DEFAULT_MAX_FRAME,
            reset_budget: 200,
            idle_frame_budget: 10_000,
        }
    }
}

/// A connection error: GOAWAY has been queued; the caller flushes the
/// output and closes the connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnError {
    /// The code sent in GOAWAY.
    pub reason: Reason,
    /// What went wrong (also the GOAWAY debug data).
    pub detail: &'static str,
}

impl std::fmt::Display for ConnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP/2 connection error {}: {}", self.reason, self.detail)
    }
}

impl std::error::Error for ConnError {}

/// What the peer did that needs the caller's attention.
#[derive(Debug)]
pub enum Event {
    /// Server: a request's header block opened stream `stream`; the fields
    /// are in [`Conn::headers`] until the next call of
    /// [`Conn::next_event`].
    Open {
        /// The stream.
        stream: u32,
        /// The request has no body.
        end_stream: bool,
    },
    /// Client: the response's header block ([`Conn::headers`]);
    /// `end_stream`: a trailers-only response.
    Headers {
        /// The stream.
        stream: u32,
        /// Nothing follows: the block is also the trailers.
        end_stream: bool,
    },
    /// A header block that ends the stream after its data: trailers
    /// ([`Conn::headers`]).
    Trailers {
        /// The stream.
        stream: u32,
    },
    /// Data on a stream. Its length counts against the receive windows
    /// until the caller [`Conn::release`]s it.
    Data {
        /// The stream.
        stream: u32,
        /// The payload (padding removed).
        data: Bytes,
        /// The peer's last frame on the stream.
        end_stream: bool,
    },
    /// The stream is gone: reset by the peer (`by_peer`), or by us after
    /// the peer broke the protocol on it.
    Reset {
        /// The stream.
        stream: u32,
        /// The error code.
        reason: Reason,
        /// Whether the peer sent the reset.
        by_peer: bool,
    },
    /// The peer is closing the connection: streams above `last_stream`
    /// were not processed.
    GoAway {
        /// The last stream the peer processed.
        last_stream: u32,
        /// Its code.
        reason: Reason,
    },
}

/// Receives header fields to send: an HPACK encoder writing into the
/// output, or a recorder when the block must wait (trailers behind data
/// that flow control holds back: HPACK blocks must be encoded in the order
/// they are sent).
pub trait FieldSink {
    /// One field (name in lowercase).
    fn field(&mut self, name: &[u8], value: &[u8], index: Index);
}

struct EncodeSink<'a> {
    enc: &'a mut hpack::Encoder,
    out: &'a mut Vec<u8>,
}

impl FieldSink for EncodeSink<'_> {
    #[inline]
    fn field(&mut self, name: &[u8], value: &[u8], index: Index) {
        self.enc.encode(name, value, index, self.out);
    }
}

/// Fields recorded to be encoded later.
#[derive(Debug, Default)]
struct Recorded {
    bytes: Vec<u8>,
    fields: Vec<(usize, usize, usize, Index)>,
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
    fn replay(&self, sink: &mut dyn FieldSink) {
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
    buf: Vec<u8>,
    /// Regular fields: (name start, value start, value end) in `buf`.
    fields: Vec<(u32, u32, u32)>,
    method: Option<(u32, u32)>,
    scheme: Option<(u32, u32)>,
    path: Option<(u32, u32)>,
    authority: Option<(u32, u32)>,
    status: Option<(u32, u32)>,
    content_length: Option<u64>,
    /// The first rule of RFC 9113 §8 the block broke.
    malformed: Option<&'static str>,
    /// The block decoded to more than the header list limit: only the
    /// fields before the limit are here.
    too_large: bool,
}

/// Which block a [`HeaderList`] is checked as.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    Request,
    Response,
    Trailers,
}

impl HeaderList {
    fn clear(&mut self) {
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

    fn get(&self, r: Option<(u32, u32)>) -> Option<&[u8]> {
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

    fn bad(&mut self, why: &'static str) {
        if self.malformed.is_none() {
            self.malformed = Some(why);
        }
    }

    /// Takes one decoded field, checking it as RFC 9113 §8.2 and §8.3 say.
    fn push(&mut self, kind: BlockKind, name: &[u8], value: &[u8]) {
        if value.iter().any(|&b| b == 0 || b == b'\r' || b == b'\n') {
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
            || name.iter().any(|&b| b.is_ascii_uppercase() || b <= b' ' || b == b':' || b >= 0x7f)
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
    fn finish(&mut self, kind: BlockKind) {
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

/// Frames waiting to be written: small ones copied into one buffer, large
/// DATA payloads referenced, in order.
#[derive(Debug, Default)]
pub struct Output {
    buf: Vec<u8>,
    /// (position in `buf` the payload goes before, payload).
    segments: VecDeque<(usize, Bytes)>,
    /// Bytes of `buf` already written.
    head: usize,
    /// Bytes of the front segment already written.
    seg_head: usize,
}

/// DATA payloads at least this long are referenced, not copied.
const SEGMENT_MIN: usize = 8 << 10;

impl Output {
    /// Whether nothing waits to be written.
    pub fn is_empty(&self) -> bool {
        self.head == self.buf.len() && self.segments.is_empty()
    }

    /// Bytes waiting to be written.
    pub fn len(&self) -> usize {
        self.buf.len() - self.head + self.segments.iter().map(|(_, b)| b.len()).sum::<usize>()
            - self.seg_head
    }

    fn push_segment(&mut self, data: Bytes) {
        self.segments.push_back((self.buf.len(), data));
    }

    /// Fills `slices` with what to write next, in order (at most its
    /// capacity's worth of slices); how many.
    pub fn slices<'a>(&'a self, slices: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        let mut pos = self.head;
        let mut first = true;
        for (at, seg) in &self.segments {
            if n + 2 > slices.len() {
                return n;
            }
            if *at > pos {
                slices[n] = IoSlice::new(&self.buf[pos..*at]);
                n += 1;
                pos = *at;
            }
            let skip = if first { self.seg_head } else { 0 };
            first = false;
            slices[n] = IoSlice::new(&seg[skip..]);
            n += 1;
        }
        if pos < self.buf.len() && n < slices.len() {
            slices[n] = IoSlice::new(&self.buf[pos..]);
            n += 1;
        }
        n
    }

    /// Marks `n` bytes written.
    pub fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let next_seg = self.segments.front().map(|(at, _)| *at);
            match next_seg {
                Some(at) if at == self.head => {
                    let Some((_, seg)) = self.segments.front() else { break };
                    let left = seg.len() - self.seg_head;
                    if n >= left {
                        n -= left;
                        self.segments.pop_front();
                        self.seg_head = 0;
                    } else {
                        self.seg_head += n;
                        n = 0;
                    }
                }
                Some(at) => {
                    let take = n.min(at - self.head);
                    self.head += take;
                    n -= take;
                }
                None => {
                    let take = n.min(self.buf.len() - self.head);
                    self.head += take;
                    n -= take;
                    if take == 0 {
                        break;
                    }
                }
            }
        }
        // Empty segments at the head (never pushed, but cheap to handle).
        while self.segments.front().is_some_and(|(at, s)| *at == self.head && s.is_empty()) {
            self.segments.pop_front();
        }
        if self.is_empty() {
            self.buf.clear();
            self.head = 0;
        }
    }

    /// Everything waiting, as one contiguous buffer (tests, fuzzing).
    pub fn take_all(&mut self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        let mut pos = self.head;
        for (i, (at, seg)) in self.segments.iter().enumerate() {
            if *at > pos {
                v.extend_from_slice(&self.buf[pos..*at]);
                pos = *at;
            }
            v.extend_from_slice(&seg[if i == 0 { self.seg_head } else { 0 }..]);
        }
        v.extend_from_slice(&self.buf[pos..]);
        self.buf.clear();
        self.segments.clear();
        self.head = 0;
        self.seg_head = 0;
        v
    }
}

/// Identity hashing for stream ids (unique, peer-chosen but harmless: the
/// table is bounded by the concurrent-stream limit).
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u32(&mut self, n: u32) {
        // Spread the odd ids over the buckets.
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type StreamMap = HashMap<u32, Stream, BuildHasherDefault<IdHasher>>;

#[derive(Debug)]
struct Stream {
    /// The peer sent END_STREAM (or we stopped reading).
    recv_closed: bool,
    /// We sent END_STREAM (or queued it behind pending data).
    send_closed: bool,
    /// A header block arrived (the next one is trailers).
    got_headers: bool,
    send_window: i64,
    /// The largest `send_window` so far: credit below it returns what our
    /// DATA used (progress), credit on top of it is a grant nothing asked
    /// for.
    send_peak: i64,
    recv_window: i64,
    /// Received bytes consumed but not yet returned as credit.
    recv_unacked: u32,
    /// Received bytes the caller has not released yet.
    held: u32,
    /// Data waiting for flow-control credit.
    pending: VecDeque<Bytes>,
    pending_len: usize,
    /// END_STREAM goes with the last pending DATA.
    end_after: bool,
    /// Trailers to send once the pending data is out.
    trailers: Option<Recorded>,
    content_length: Option<u64>,
    data_received: u64,
    /// Server: when our response ends first, the rest of the request is
    /// still read (and handed to the caller to discard) instead of being
    /// refused with RST_STREAM(NO_ERROR). See [`Conn::read_to_end`].
    read_to_end: bool,
}

impl Stream {
    fn new(send_window: u32, recv_window: u32) -> Stream {
        Stream {
            recv_closed: false,
            send_closed: false,
            got_headers: false,
            send_window: send_window.into(),
            send_peak: send_window.into(),
            recv_window: recv_window.into(),
            recv_unacked: 0,
            held: 0,
            pending: VecDeque::new(),
            pending_len: 0,
            end_after: false,
            trailers: None,
            content_length: None,
            data_received: 0,
            read_to_end: false,
        }
    }
}

/// The peer's settings.
#[derive(Clone, Copy, Debug)]
struct PeerSettings {
    initial_window: u32,
    max_frame: u32,
    max_concurrent: u32,
}

/// Ids of streams recently closed, to tell a frame on a closed stream from
/// one on a stream never opened (different errors), and frames that may
/// still arrive on a stream we reset (ignored).
#[derive(Debug)]
struct Recent {
    ids: [u32; 64],
    next: usize,
}

impl Recent {
    fn new() -> Recent {
        Recent { ids: [0; 64], next: 0 }
    }
    fn add(&mut self, id: u32) {
        self.ids[self.next] = id;
        self.next = (self.next + 1) % self.ids.len();
    }
    fn has(&self, id: u32) -> bool {
        id != 0 && self.ids.contains(&id)
    }
    fn remove(&mut self, id: u32) {
        for x in self.ids.iter_mut().filter(|x| **x == id) {
            *x = 0;
        }
    }
}

#[derive(Debug)]
enum Phase {
    /// Server: waiting for the client's 24-byte preface.
    Preface,
    /// Waiting for the peer's first SETTINGS frame.
    FirstSettings,
    Open,
}

/// A header block whose CONTINUATION frames are still coming.
#[derive(Debug)]
struct Partial {
    stream: u32,
    end_stream: bool,
    /// The block's stream is to be refused or reset once decoded (the
    /// block must still be decoded: HPACK state is per connection).
    reject: Option<Reason>,
    frames: u32,
}

/// One HTTP/2 connection, either side.
pub struct Conn {
    cfg: Config,
    phase: Phase,
    peer: PeerSettings,
    decoder: hpack::Decoder,
    encoder: hpack::Encoder,
    headers: HeaderList,
    streams: StreamMap,
    /// Highest stream id the peer opened.
    last_peer_stream: u32,
    /// Next stream id we open (client).
    next_local: u32,
    /// Streams we opened that are still open (client).
    local_open: u32,
    send_window: i64,
    /// The largest `send_window` so far (see `Stream::send_peak`).
    send_peak: i64,
    recv_window: i64,
    recv_unacked: u32,
    /// Streams with pending data waiting for connection credit.
    blocked: VecDeque<u32>,
    continuation: Option<Partial>,
    block: Vec<u8>,
    reset_by_us: Recent,
    closed: Recent,
    out: Output,
    goaway_sent: bool,
    goaway_received: Option<u32>,
    reset_credit: u32,
    idle_frames: u32,
    /// Our SETTINGS not yet acknowledged.
    settings_unacked: u32,
    /// The connection error that ended the connection: every later call
    /// of `next_event` returns it, so nothing after it is taken.
    dead: Option<ConnError>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("role", &self.cfg.role)
            .field("streams", &self.streams.len())
            .field("out", &self.out.len())
            .finish_non_exhaustive()
    }
}

/// Bytes of CONTINUATION accepted for one header block, per byte of the
/// header list limit: HPACK's Huffman code can make an encoded string
/// longer than its text, but not by more than this.
const BLOCK_SLACK: usize = 4;

/// CONTINUATION frames accepted for one header block.
const MAX_CONTINUATIONS: u32 = 64;

impl Conn {
    /// A connection that has sent nothing yet; its preface and SETTINGS are
    /// already in the output.
    pub fn new(cfg: Config) -> Conn {
        let mut c = Conn {
            phase: match cfg.role {
                Role::Server => Phase::Preface,
                Role::Client => Phase::FirstSettings,
            },
            peer: PeerSettings {
                initial_window: frame::DEFAULT_WINDOW,
                max_frame: frame::DEFAULT_MAX_FRAME,
                max_concurrent: u32::MAX,
            },
            decoder: hpack::Decoder::new(hpack::DEFAULT_TABLE_SIZE),
            encoder: hpack::Encoder::new(),
            headers: HeaderList::default(),
            streams: StreamMap::default(),
            last_peer_stream: 0,
            next_local: 1,
            local_open: 0,
            send_window: frame::DEFAULT_WINDOW.into(),
            send_peak: frame::DEFAULT_WINDOW.into(),
            recv_window: frame::DEFAULT_WINDOW.into(),
            recv_unacked: 0,
            blocked: VecDeque::new(),
            continuation: None,
            block: Vec::new(),
            reset_by_us: Recent::new(),
            closed: Recent::new(),
            out: Output::default(),
            goaway_sent: false,
            goaway_received: None,
            reset_credit: cfg.reset_budget,
            idle_frames: 0,
            settings_unacked: 1,
            dead: None,
            cfg,
        };
        let buf = &mut c.out.buf;
        if c.cfg.role == Role::Client {
            buf.extend_from_slice(PREFACE);
        }
        let mut values = vec![
            (setting::MAX_CONCURRENT_STREAMS, c.cfg.max_concurrent_streams),
            (setting::INITIAL_WINDOW_SIZE, c.cfg.stream_window),
            (setting::MAX_HEADER_LIST_SIZE, c.cfg.max_header_list),
        ];
        if c.cfg.max_frame_size != frame::DEFAULT_MAX_FRAME {
            values.push((setting::MAX_FRAME_SIZE, c.cfg.max_frame_size));
        }
        if c.cfg.role == Role::Client {
            values.push((setting::ENABLE_PUSH, 0));
        }
        frame::write_settings(buf, &values);
        let extra = i64::from(c.cfg.connection_window) - i64::from(frame::DEFAULT_WINDOW);
        if extra > 0 {
            frame::write_window_update(buf, 0, extra as u32);
            c.recv_window += extra;
        }
        c
    }

    /// Whether the peer's preface and first SETTINGS arrived.
    pub fn is_established(&self) -> bool {
        matches!(self.phase, Phase::Open)
    }

    /// Our settings.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The header block of the last [`Event::Open`], [`Event::Headers`] or
    /// [`Event::Trailers`].
    pub fn headers(&self) -> &HeaderList {
        &self.headers
    }

    /// What waits to be written.
    pub fn output(&mut self) -> &mut Output {
        &mut self.out
    }

    /// Whether a GOAWAY has been sent (no new streams are accepted).
    pub fn is_closing(&self) -> bool {
        self.goaway_sent
    }

    /// Streams open.
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Whether stream `id` is open (either direction).
    pub fn is_open(&self, id: u32) -> bool {
        self.streams.contains_key(&id)
    }

    /// Sends GOAWAY with `reason` (NO_ERROR: a graceful shutdown; streams
    /// already open go on).
    pub fn go_away(&mut self, reason: Reason, debug: &'static str) {
        if !self.goaway_sent {
            self.goaway_sent = true;
            frame::write_goaway(&mut self.out.buf, self.last_peer_stream, reason, debug.as_bytes());
        }
    }

    fn fail(&mut self, reason: Reason, detail: &'static str) -> ConnError {
        self.go_away(reason, detail);
        let e = ConnError { reason, detail };
        self.dead = Some(e.clone());
        e
    }

    /// Resets stream `id` with `reason` (we no longer want it); frames
    /// the peer already sent on it are then ignored.
    pub fn reset(&mut self, id: u32, reason: Reason) {
        if self.forget(id).is_some() {
            frame::write_rst(&mut self.out.buf, id, reason);
            self.reset_by_us.add(id);
        }
    }

    /// Removes stream `id`: the connection credit of data the caller has
    /// not released goes back, the id is remembered as closed, and it no
    /// longer waits for connection credit.
    fn forget(&mut self, id: u32) -> Option<Stream> {
        let s = self.streams.remove(&id)?;
        self.return_connection_credit_of(&s);
        self.stream_gone(id);
        self.blocked.retain(|b| *b != id);
        Some(s)
    }

    fn stream_gone(&mut self, id: u32) {
        self.closed.add(id);
        if self.is_local(id) {
            self.local_open = self.local_open.saturating_sub(1);
        }
    }

    fn is_local(&self, id: u32) -> bool {
        (id % 2 == 1) == (self.cfg.role == Role::Client)
    }

    /// A stream error provoked by the peer: RST_STREAM, and one unit of
    /// the reset budget.
    fn stream_error(&mut self, id: u32, reason: Reason) -> Result<(), ConnError> {
        self.forget(id);
        frame::write_rst(&mut self.out.buf, id, reason);
        self.reset_by_us.add(id);
        self.spend_reset()
    }

    fn spend_reset(&mut self) -> Result<(), ConnError> {
        self.reset_credit = self.reset_credit.saturating_sub(1);
        if self.reset_credit == 0 {
            return Err(self.fail(Reason::ENHANCE_YOUR_CALM, "too many stream resets"));
        }
        Ok(())
    }

    fn idle_frame(&mut self) -> Result<(), ConnError> {
        self.idle_frames += 1;
        if self.idle_frames > self.cfg.idle_frame_budget {
            return Err(self.fail(Reason::ENHANCE_YOUR_CALM, "too many frames without progress"));
        }
        Ok(())
    }

    /// Credit held by a dropped stream's unconsumed data goes back to the
    /// connection (the stream's own window dies with it).
    fn return_connection_credit_of(&mut self, s: &Stream) {
        self.release_connection(s.held);
    }

    /// The caller consumed `n` bytes of stream `id`'s data: that much
    /// credit goes back to the peer (in batches: a WINDOW_UPDATE once half
    /// a window is owed).
    pub fn release(&mut self, id: u32, n: usize) {
        if n == 0 {
            return;
        }
        let Some(s) = self.streams.get_mut(&id) else {
            // Gone: its credit went back when it was dropped.
            return;
        };
        let n = (n as u32).min(s.held);
        s.held -= n;
        {
            if !s.recv_closed {
                s.recv_unacked += n;
                if s.recv_unacked >= self.cfg.stream_window / 2 {
                    let inc = s.recv_unacked;
                    s.recv_unacked = 0;
                    s.recv_window += i64::from(inc);
                    frame::write_window_update(&mut self.out.buf, id, inc);
                }
            }
        }
        self.release_connection(n);
    }

    fn release_connection(&mut self, n: u32) {
        self.recv_unacked += n;
        if self.recv_unacked >= self.cfg.connection_window / 2 {
            let inc = self.recv_unacked;
            self.recv_unacked = 0;
            self.recv_window += i64::from(inc);
            frame::write_window_update(&mut self.out.buf, 0, inc);
        }
    }

    /// The next event from the bytes in `input` (consumed as frames
    /// complete). `Ok(None)`: more bytes are needed. After `Err` the
    /// connection is dead: flush the output (it ends with GOAWAY) and
    /// close.
    pub fn next_event(&mut self, input: &mut BytesMut) -> Result<Option<Event>, ConnError> {
        if let Some(e) = &self.dead {
            return Err(e.clone());
        }
        loop {
            match self.phase {
                Phase::Preface => {
                    let n = input.len().min(PREFACE.len());
                    if input[..n] != PREFACE[..n] {
                        return Err(self.fail(Reason::PROTOCOL_ERROR, "invalid connection preface"));
                    }
                    if n < PREFACE.len() {
                        return Ok(None);
                    }
                    input.advance(PREFACE.len());
                    self.phase = Phase::FirstSettings;
                }
                Phase::FirstSettings | Phase::Open => {}
            }
            let Some(head) = Head::parse(input) else { return Ok(None) };
            if head.len > self.cfg.max_frame_size {
                return Err(self.fail(Reason::FRAME_SIZE_ERROR, "frame larger than allowed"));
            }
            let total = HEADER_LEN + head.len as usize;
            if input.len() < total {
                input.reserve(total - input.len());
                return Ok(None);
            }
            if matches!(self.phase, Phase::FirstSettings) {
                if head.kind != kind::SETTINGS || head.has(flag::ACK) {
                    return Err(self.fail(Reason::PROTOCOL_ERROR, "first frame is not SETTINGS"));
                }
                self.phase = Phase::Open;
            }
            if let Some(p) = &self.continuation {
                if head.kind != kind::CONTINUATION || head.stream != p.stream {
                    return Err(self.fail(Reason::PROTOCOL_ERROR, "header block interrupted"));
                }
            }
            let ev = if head.kind == kind::DATA {
                let frame = input.split_to(total).freeze();
                self.on_data(head, frame)?
            } else {
                let r = self.on_frame(head, &input[HEADER_LEN..total]);
                input.advance(total);
                r?
            };
            if ev.is_some() {
                return Ok(ev);
            }
        }
    }

    fn on_frame(&mut self, head: Head, payload: &[u8]) -> Result<Option<Event>, ConnError> {
        match head.kind {
            kind::HEADERS => self.on_headers(head, payload),
            kind::CONTINUATION => self.on_continuation(head, payload),
            kind::SETTINGS => self.on_settings(head, payload).map(|_| None),
            kind::WINDOW_UPDATE => self.on_window_update(head, payload),
            kind::PING => {
                if head.stream != 0 {
                    return Err(self.fail(Reason::PROTOCOL_ERROR, "PING on a stream"));
                }
                let Ok(p) = <[u8; 8]>::try_from(payload) else {
                    return Err(self.fail(Reason::FRAME_SIZE_ERROR, "PING not 8 bytes"));
                };
                // An acknowledgement is no progress either: we send no PING.
                self.idle_frame()?;
                if !head.has(flag::ACK) {
                    frame::write_ping(&mut self.out.buf, p, true);
                }
                Ok(None)
            }
            kind::RST_STREAM => self.on_rst(head, payload),
            kind::PRIORITY => {
                if head.stream == 0 {
                    return Err(self.fail(Reason::PROTOCOL_ERROR, "PRIORITY on stream 0"));
                }
                if payload.len() != 5 {
                    self.stream_error(head.stream, Reason::FRAME_SIZE_ERROR)?;
                    return Ok(self.reset_event(head.stream, Reason::FRAME_SIZE_ERROR));
                }
                self.idle_frame()?;
                let dep = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                    & 0x7fff_ffff;
                if dep == head.stream {
                    self.stream_error(head.stream, Reason::PROTOCOL_ERROR)?;
                    return Ok(self.reset_event(head.stream, Reason::PROTOCOL_ERROR));
                }
                Ok(None)
            }
            kind::GOAWAY => {
                if head.stream != 0 {
                    return Err(self.fail(Reason::PROTOCOL_ERROR, "GOAWAY on a stream"));
                }
                if payload.len() < 8 {
                    return Err(self.fail(Reason::FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes"));
                }
                let last = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                    & 0x7fff_ffff;
                let reason =
                    Reason(u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]));
                self.goaway_received = Some(last);
                Ok(Some(Event::GoAway { last_stream: last, reason }))
            }
            kind::PUSH_PROMISE => {
                Err(self.fail(Reason::PROTOCOL_ERROR, "PUSH_PROMISE (push is disabled)"))
            }
            _ => {
                // Unknown frame types are ignored (RFC 9113 §4.1).
                self.idle_frame()?;
                Ok(None)
            }
        }
    }

    fn reset_event(&self, id: u32, reason: Reason) -> Option<Event> {
        // Only streams the caller knew of; the caller ignores unknown ids.
        Some(Event::Reset { stream: id, reason, by_peer: false })
    }

    /// Strips padding: the payload without its pad length byte and pad.
    fn unpad<'a>(&mut self, head: &Head, payload: &'a [u8]) -> Result<&'a [u8], ConnError> {
        if !head.has(flag::PADDED) {
            return Ok(payload);
        }
        let Some((&pad, rest)) = payload.split_first() else {
            return Err(self.fail(Reason::FRAME_SIZE_ERROR, "padded frame without pad length"));
        };
        if pad as usize > rest.len() {
            return Err(self.fail(Reason::PROTOCOL_ERROR, "padding longer than the frame"));
        }
        Ok(&rest[..rest.len() - pad as usize])
    }

    fn on_data(&mut self, head: Head, frame: Bytes) -> Result<Option<Event>, ConnError> {
        let id = head.stream;
        if id == 0 {
            return Err(self.fail(Reason::PROTOCOL_ERROR, "DATA on stream 0"));
        }
        let len = head.len as usize;
        let payload_all = &frame[HEADER_LEN..];
        let data_len = self.unpad(&head, payload_all)?.len();
        let data_start = HEADER_LEN + usize::from(head.has(flag::PADDED));
        // Connection window first: every byte counts, padding included.
        if len as i64 > self.recv_window {
            return Err(self.fail(Reason::FLOW_CONTROL_ERROR, "DATA beyond the connection window"));
        }
        self.recv_window -= len as i64;
        let Some(s) = self.streams.get_mut(&id) else {
            self.release_connection(len as u32);
            if self.idle_stream(id) {
                return Err(self.fail(Reason::PROTOCOL_ERROR, "DATA on an idle stream"));
            }
            if self.reset_by_us.has(id) {
                return Ok(None);
            }
            self.stream_error(id, Reason::STREAM_CLOSED)?;
            return Ok(None);
        };
        if s.recv_closed {
            self.release_connection(len as u32);
            self.stream_error(id, Reason::STREAM_CLOSED)?;
            return Ok(self.reset_event(id, Reason::STREAM_CLOSED));
        }
        if len as i64 > s.recv_window {
            self.release_connection(len as u32);
            self.stream_error(id, Reason::FLOW_CONTROL_ERROR)?;
            return Ok(self.reset_event(id, Reason::FLOW_CONTROL_ERROR));
        }
        s.recv_window -= len as i64;
        s.data_received += data_len as u64;
        let end = head.has(flag::END_STREAM);
        let length_wrong = s
            .content_length
            .is_some_and(|cl| s.data_received > cl || (end && s.data_received != cl));
        if length_wrong {
            self.release_connection(len as u32);
            self.stream_error(id, Reason::PROTOCOL_ERROR)?;
            return Ok(self.reset_event(id, Reason::PROTOCOL_ERROR));
        }
        if end {
            s.recv_closed = true;
        }
        s.held += data_len as u32;
        // Padding is consumed at once.
        let pad = len - data_len;
        if pad > 0 {
            s.recv_window += pad as i64;
            self.release_connection(pad as u32);
            if !end {
                frame::write_window_update(&mut self.out.buf, id, pad as u32);
            }
        }
        if data_len == 0 && !end {
            self.idle_frame()?;
        } else {
            self.idle_frames = 0;
        }
        let data = frame.slice(data_start..data_start + data_len);
        let ev = Event::Data { stream: id, data, end_stream: end };
        if end {
            self.maybe_remove(id);
        }
        Ok(Some(ev))
    }

    /// Whether `id` names a stream the peer could open but has not (a frame
    /// on it other than HEADERS or PRIORITY is a connection error).
    fn idle_stream(&self, id: u32) -> bool {
        if self.is_local(id) {
            id >= self.next_local
        } else {
            id > self.last_peer_stream
        }
    }

    /// Removes a stream closed both ways.
    fn maybe_remove(&mut self, id: u32) {
        if self.streams.get(&id).is_some_and(|s| s.recv_closed && s.send_closed) {
            // Data the caller has not released yet is released here: its
            // connection credit must not leak with the stream.
            self.forget(id);
            self.reset_credit = (self.reset_credit + 1).min(self.cfg.reset_budget);
        }
    }

    fn on_headers(&mut self, head: Head, payload: &[u8]) -> Result<Option<Event>, ConnError> {
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

    fn check_block_size(&mut self) -> Result<(), ConnError> {
        let limit = (self.cfg.max_header_list as usize).max(4096) * BLOCK_SLACK;
        if self.block.len() > limit {
            return Err(self.fail(Reason::ENHANCE_YOUR_CALM, "header block too large"));
        }
        Ok(())
    }

    fn on_continuation(&mut self, head: Head, payload: &[u8]) -> Result<Option<Event>, ConnError> {
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
    fn finish_block(
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

    fn on_settings(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if head.stream != 0 {
            return Err(self.fail(Reason::PROTOCOL_ERROR, "SETTINGS on a stream"));
        }
        if head.has(flag::ACK) {
            if !payload.is_empty() {
                return Err(self.fail(Reason::FRAME_SIZE_ERROR, "SETTINGS ACK with a payload"));
            }
            if self.settings_unacked == 0 {
                // An acknowledgement of nothing.
                self.idle_frame()?;
            }
            self.settings_unacked = self.settings_unacked.saturating_sub(1);
            return Ok(());
        }
        if payload.len() % 6 != 0 {
            return Err(self.fail(Reason::FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6"));
        }
        self.idle_frame()?;
        // INITIAL_WINDOW_SIZE: (largest, last) value in this frame.
        let mut initial: Option<(u32, u32)> = None;
        for kv in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([kv[0], kv[1]]);
            let v = u32::from_be_bytes([kv[2], kv[3], kv[4], kv[5]]);
            match id {
                setting::HEADER_TABLE_SIZE => self.encoder.set_max_table_size(v as usize),
                setting::ENABLE_PUSH if v > 1 || (v == 1 && self.cfg.role == Role::Client) => {
                    return Err(self.fail(Reason::PROTOCOL_ERROR, "invalid ENABLE_PUSH"));
                }
                setting::MAX_CONCURRENT_STREAMS => self.peer.max_concurrent = v,
                setting::INITIAL_WINDOW_SIZE => {
                    if i64::from(v) > frame::MAX_WINDOW {
                        return Err(
                            self.fail(Reason::FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                        );
                    }
                    initial = Some(initial.map_or((v, v), |(largest, _)| (largest.max(v), v)));
                }
                setting::MAX_FRAME_SIZE => {
                    if !(frame::DEFAULT_MAX_FRAME..=frame::MAX_MAX_FRAME).contains(&v) {
                        return Err(self.fail(Reason::PROTOCOL_ERROR, "invalid MAX_FRAME_SIZE"));
                    }
                    self.peer.max_frame = v;
                }
                _ => {} // MAX_HEADER_LIST_SIZE is advisory; unknown ids are ignored.
            }
        }
        if let Some((largest, last)) = initial {
            // Every value applies to every stream, in order; one pass for
            // the frame, not one per value, keeps a SETTINGS frame's cost
            // linear. A stream's window is largest under the largest value,
            // so that is where an overflow would show.
            let old = i64::from(self.peer.initial_window);
            let (to_largest, to_last) = (i64::from(largest) - old, i64::from(last) - old);
            self.peer.initial_window = last;
            let mut overflow = false;
            for s in self.streams.values_mut() {
                overflow |= s.send_window + to_largest > frame::MAX_WINDOW;
                s.send_window += to_last;
                s.send_peak += to_last;
            }
            if overflow {
                return Err(self.fail(Reason::FLOW_CONTROL_ERROR, "stream window overflow"));
            }
        }
        frame::write_settings_ack(&mut self.out.buf);
        // A larger initial window may unblock pending data.
        self.flush_all();
        Ok(())
    }

    fn on_window_update(&mut self, head: Head, payload: &[u8]) -> Result<Option<Event>, ConnError> {
        if payload.len() != 4 {
            return Err(self.fail(Reason::FRAME_SIZE_ERROR, "WINDOW_UPDATE not 4 bytes"));
        }
        let inc =
            u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
        let id = head.stream;
        if id == 0 {
            if inc == 0 {
                return Err(self.fail(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE of 0"));
            }
            let granted = self.send_window >= self.send_peak;
            self.send_window += i64::from(inc);
            if self.send_window > frame::MAX_WINDOW {
                return Err(self.fail(Reason::FLOW_CONTROL_ERROR, "connection window overflow"));
            }
            self.send_peak = self.send_peak.max(self.send_window);
            if granted {
                self.idle_frame()?;
            }
            self.flush_blocked();
            return Ok(None);
        }
        let Some(s) = self.streams.get_mut(&id) else {
            if self.idle_stream(id) {
                return Err(self.fail(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream"));
            }
            // A closed stream: credit in flight is ignored; a zero
            // increment is an error whatever the state (RFC 9113 §6.9),
            // unless we reset the stream ourselves (no reset ping-pong).
            if inc == 0 && !self.reset_by_us.has(id) {
                self.stream_error(id, Reason::PROTOCOL_ERROR)?;
            } else {
                // Credit for a stream that is gone moves nothing.
                self.idle_frame()?;
            }
            return Ok(None);
        };
        if inc == 0 {
            self.stream_error(id, Reason::PROTOCOL_ERROR)?;
            return Ok(self.reset_event(id, Reason::PROTOCOL_ERROR));
        }
        let granted = s.send_window >= s.send_peak;
        s.send_window += i64::from(inc);
        if s.send_window > frame::MAX_WINDOW {
            self.stream_error(id, Reason::FLOW_CONTROL_ERROR)?;
            return Ok(self.reset_event(id, Reason::FLOW_CONTROL_ERROR));
        }
        s.send_peak = s.send_peak.max(s.send_window);
        if granted {
            self.idle_frame()?;
        }
        self.flush_stream(id);
        Ok(None)
    }

    fn on_rst(&mut self, head: Head, payload: &[u8]) -> Result<Option<Event>, ConnError> {
        let id = head.stream;
        if id == 0 {
            return Err(self.fail(Reason::PROTOCOL_ERROR, "RST_STREAM on stream 0"));
        }
        if payload.len() != 4 {
            return Err(self.fail(Reason::FRAME_SIZE_ERROR, "RST_STREAM not 4 bytes"));
        }
        if self.idle_stream(id) {
            return Err(self.fail(Reason::PROTOCOL_ERROR, "RST_STREAM on an idle stream"));
        }
        let reason = Reason(u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]));
        let Some(s) = self.forget(id) else {
            // Our reset and theirs crossed: nothing more may come on the
            // stream now, so a later frame on it is an error, not a frame
            // in flight. A reset of a stream that ended otherwise moves
            // nothing.
            if !self.reset_by_us.has(id) {
                self.idle_frame()?;
            }
            self.reset_by_us.remove(id);
            return Ok(None);
        };
        // A stream the peer abandons before it finished costs budget.
        if !(s.recv_closed && s.send_closed) {
            self.spend_reset()?;
        }
        Ok(Some(Event::Reset { stream: id, reason, by_peer: true }))
    }

    // ---- sending ----------------------------------------------------------

    /// Client: opens a new stream; `None` when the peer's concurrency
    /// limit is reached, the peer is going away, or ids ran out.
    pub fn open_stream(&mut self) -> Option<u32> {
        if self.goaway_received.is_some()
            || self.local_open >= self.peer.max_concurrent
            || self.next_local > 0x7fff_fffd
        {
            return None;
        }
        let id = self.next_local;
        self.next_local += 2;
        self.local_open += 1;
        self.streams.insert(id, Stream::new(self.peer.initial_window, self.cfg.stream_window));
        Some(id)
    }

    /// Whether the peer sent GOAWAY: no new stream may be opened, ever.
    pub fn peer_gone_away(&self) -> bool {
        self.goaway_received.is_some()
    }

    /// Whether another stream may be opened now.
    pub fn can_open(&self) -> bool {
        self.goaway_received.is_none()
            && self.local_open < self.peer.max_concurrent
            && self.next_local <= 0x7fff_fffd
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
        self.write_block(id, end_stream, fields);
        if end_stream {
            self.after_send_end(id);
        }
    }

    fn write_block(&mut self, id: u32, end_stream: bool, fields: impl FnOnce(&mut dyn FieldSink)) {
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
        if s.pending.is_empty() {
            self.write_block(id, true, fields);
            self.after_send_end(id);
        } else {
            let mut rec = Recorded::default();
            fields(&mut rec);
            s.trailers = Some(rec);
        }
    }

    /// Our side of stream `id` has ended: a server that answered before
    /// the request ended tells the client to stop sending (RFC 9113 §8.1);
    /// a stream closed both ways is forgotten.
    fn after_send_end(&mut self, id: u32) {
        let Some(s) = self.streams.get(&id) else { return };
        if !s.recv_closed && self.cfg.role == Role::Server && !s.read_to_end {
            self.reset(id, Reason::NO_ERROR);
            self.reset_credit = (self.reset_credit + 1).min(self.cfg.reset_budget);
            return;
        }
        self.maybe_remove(id);
    }

    /// Server: if our side of stream `id` ends before the request does,
    /// keep reading the request to its end instead of refusing the rest
    /// with RST_STREAM(NO_ERROR). For plain HTTP answers (405, 415, 431),
    /// whose clients may not expect a reset; a gRPC call that ends early
    /// is reset, as grpc-go and gRPC C++ do, so the client stops sending.
    /// The request's frames are still checked (flow control,
    /// content-length) and delivered as events for the caller to release.
    pub fn read_to_end(&mut self, id: u32) {
        if let Some(s) = self.streams.get_mut(&id) {
            s.read_to_end = true;
        }
    }

    /// Bytes of stream `id` waiting for flow-control credit.
    pub fn pending(&self, id: u32) -> usize {
        self.streams.get(&id).map_or(0, |s| s.pending_len)
    }

    /// Sends `len` bytes of data that `write` appends to the buffer it is
    /// given: straight into the output when flow control allows it all
    /// (the common case: no copy), else into a buffer of its own queued for
    /// credit. `end_stream`: the last data (client requests).
    pub fn send_data_with(
        &mut self,
        id: u32,
        len: usize,
        end_stream: bool,
        write: impl FnOnce(&mut Vec<u8>),
    ) {
        let Some(s) = self.streams.get_mut(&id) else { return };
        if s.send_closed {
            return;
        }
        let fits = s.pending.is_empty()
            && (len as i64) <= s.send_window
            && (len as i64) <= self.send_window
            && len <= self.peer.max_frame as usize
            && len < SEGMENT_MIN;
        if fits {
            s.send_window -= len as i64;
            self.send_window -= len as i64;
            let buf = &mut self.out.buf;
            let at = buf.len();
            frame::write_head(
                buf,
                len,
                kind::DATA,
                if end_stream { flag::END_STREAM } else { 0 },
                id,
            );
            write(buf);
            debug_assert_eq!(buf.len() - at - HEADER_LEN, len);
            let written = buf.len() - at - HEADER_LEN;
            frame::patch_len(buf, at, written);
            if end_stream {
                s.send_closed = true;
                self.after_send_end(id);
            }
            return;
        }
        let mut v = Vec::with_capacity(len);
        write(&mut v);
        self.send_data(id, Bytes::from(v), end_stream);
    }

    /// Sends `data` on stream `id`, as far as flow control allows now; the
    /// rest goes out as credit arrives (see [`Conn::pending`]).
    pub fn send_data(&mut self, id: u32, data: Bytes, end_stream: bool) {
        let Some(s) = self.streams.get_mut(&id) else { return };
        if s.send_closed {
            return;
        }
        s.pending_len += data.len();
        if !data.is_empty() {
            s.pending.push_back(data);
        }
        if end_stream {
            s.end_after = true;
            s.send_closed = true;
        }
        self.flush_stream(id);
    }

    fn flush_all(&mut self) {
        let ids: Vec<u32> =
            self.streams.iter().filter(|(_, s)| !s.pending.is_empty()).map(|(id, _)| *id).collect();
        for id in ids {
            self.flush_stream(id);
        }
    }

    fn flush_blocked(&mut self) {
        let n = self.blocked.len();
        for _ in 0..n {
            let Some(id) = self.blocked.pop_front() else { break };
            self.flush_stream(id);
            if self.send_window <= 0 {
                break;
            }
        }
    }

    /// Writes as much of stream `id`'s pending data as the windows allow,
    /// then its END_STREAM or trailers once nothing is left.
    fn flush_stream(&mut self, id: u32) {
        let max = self.peer.max_frame as usize;
        let Some(s) = self.streams.get_mut(&id) else { return };
        while let Some(front) = s.pending.front_mut() {
            let allowed = s.send_window.min(self.send_window).min(max as i64);
            if allowed <= 0 {
                if self.send_window <= 0 && s.send_window > 0 && !self.blocked.contains(&id) {
                    self.blocked.push_back(id);
                }
                return;
            }
            let n = (allowed as usize).min(front.len());
            let chunk = front.split_to(n);
            if front.is_empty() {
                s.pending.pop_front();
            }
            s.pending_len -= n;
            s.send_window -= n as i64;
            self.send_window -= n as i64;
            let last = s.pending.is_empty() && s.end_after;
            frame::write_head(
                &mut self.out.buf,
                n,
                kind::DATA,
                if last { flag::END_STREAM } else { 0 },
                id,
            );
            if n >= SEGMENT_MIN {
                self.out.push_segment(chunk);
            } else {
                self.out.buf.extend_from_slice(&chunk);
            }
            if last {
                s.end_after = false;
                self.after_send_end(id);
                return;
            }
        }
        if s.end_after {
            // END_STREAM with no data left to carry it.
            s.end_after = false;
            frame::write_head(&mut self.out.buf, 0, kind::DATA, flag::END_STREAM, id);
            self.after_send_end(id);
            return;
        }
        if let Some(rec) = s.trailers.take() {
            self.write_block(id, true, |sink| rec.replay(sink));
            self.after_send_end(id);
        }
    }
}
