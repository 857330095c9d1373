//! The HTTP/2 connection state machine, sans I/O (after quinn-proto's
//! design): bytes in, events and bytes out. No sockets, clocks or tasks
//! here, so a socket loop (protoplane-rpc's gRPC server and client), a test, a fuzzer or a spinning engine core can all drive it.
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

//!
//! One [`Conn`] type, its rules split by topic the way h2 splits its
//! `proto/` directory:
//! - `streams`: stream ids and states, opening, closing and resetting;
//! - `flow`: flow control both ways, receiving and sending DATA;
//! - `headers`: header blocks in (HPACK decoding, CONTINUATION, the
//!   field checks of RFC 9113 §8) and out;
//! - `settings`: our SETTINGS and the peer's;
//! - `ping` and `go_away`: liveness and shutdown;
//! - `budget`: the budgets a peer spends on frames that make no progress;
//! - `output`: the frames waiting to be written.

mod budget;
mod flow;
mod go_away;
mod headers;
mod output;
mod ping;
mod settings;
mod streams;

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};

use crate::frame::{self, flag, kind, Head, Reason, HEADER_LEN, PREFACE};
use crate::hpack;

use headers::Partial;
use settings::PeerSettings;
use streams::{Recent, StreamMap};

pub use headers::{FieldSink, HeaderList};
pub use output::Output;

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
    /// A peer's reset of a stream open at least this long (by the clock
    /// the driver gives with [`Conn::set_clock`]) costs no reset budget:
    /// it is a call given up on (a deadline, a hedge that lost), not a
    /// rapid reset, and it held one of the `max_concurrent_streams` slots
    /// as long as an ordinary call would. Without a clock every reset
    /// costs.
    pub reset_free_after_ms: u64,
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
            reset_free_after_ms: 10,
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
    /// A PING from the peer (already answered), or the acknowledgement of
    /// one sent with [`Conn::ping`]: for keepalive (gRFC A8) and its
    /// enforcement, which need a clock the connection does not have.
    Ping {
        /// An acknowledgement of ours.
        ack: bool,
        /// Its 8 bytes.
        payload: [u8; 8],
    },
}

#[derive(Debug)]
enum Phase {
    /// Server: waiting for the client's 24-byte preface.
    Preface,
    /// Waiting for the peer's first SETTINGS frame.
    FirstSettings,
    Open,
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
    /// A graceful GOAWAY's first phase is out: its PING is unanswered.
    goaway_announced: bool,
    /// A HEADERS or DATA frame went out since the last look
    /// ([`Conn::take_sent_stream_frames`]).
    sent_stream_frames: bool,
    goaway_received: Option<u32>,
    reset_credit: u32,
    /// The driver's clock, ms ([`Conn::set_clock`]).
    now_ms: u64,
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
            goaway_announced: false,
            sent_stream_frames: false,
            goaway_received: None,
            reset_credit: cfg.reset_budget,
            now_ms: 0,
            idle_frames: 0,
            settings_unacked: 1,
            dead: None,
            cfg,
        };
        c.write_preface_and_settings();
        c
    }

    /// Tells the connection the time (ms from any fixed start, never
    /// going back): streams remember when they opened, and a peer's reset
    /// of an old one costs no reset budget (see
    /// [`Config::reset_free_after_ms`]).
    pub fn set_clock(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
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

    fn fail(&mut self, reason: Reason, detail: &'static str) -> ConnError {
        self.go_away(reason, detail);
        let e = ConnError { reason, detail };
        self.dead = Some(e.clone());
        e
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
            kind::PING => self.on_ping(head, payload),
            kind::RST_STREAM => self.on_rst(head, payload),
            kind::PRIORITY => self.on_priority(head, payload),
            kind::GOAWAY => self.on_goaway(head, payload),
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
}
