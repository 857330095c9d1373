//! A client [`Conn`] and a server [`Conn`] wired to each other in memory
//! (after quinn-proto's test `Pair`): what one side writes is what the
//! other reads, in whatever pieces a test chooses, and every event either
//! side raises is recorded with the header fields it carried. A test can
//! also speak for one side in raw frames ([`Pair::inject`]) to play a peer
//! that breaks the rules.
//!
//! No clock: the connection state machine has no timers (deadlines and
//! keepalive belong to the socket loops that drive it), so a test's time
//! is the order of its steps, and "eventually" is [`Pair::drive`] running
//! until neither side has anything left to say.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use protoplane_http2::conn::{Config, Conn, ConnError, Event, FieldSink, Role};
use protoplane_http2::frame::{self, kind, Head, Reason, HEADER_LEN};
use protoplane_http2::hpack::{Encoder, Index};

/// Which side of the pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Client,
    Server,
}

/// An event as a side saw it, header fields included (a [`Conn`] keeps
/// only the last block).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    Open {
        stream: u32,
        end_stream: bool,
        path: Vec<u8>,
        fields: Vec<(Vec<u8>, Vec<u8>)>,
        too_large: bool,
    },
    Headers {
        stream: u32,
        end_stream: bool,
        status: Vec<u8>,
        fields: Vec<(Vec<u8>, Vec<u8>)>,
    },
    Trailers {
        stream: u32,
        fields: Vec<(Vec<u8>, Vec<u8>)>,
    },
    Data {
        stream: u32,
        data: Bytes,
        end_stream: bool,
    },
    Reset {
        stream: u32,
        reason: Reason,
        by_peer: bool,
    },
    GoAway {
        last_stream: u32,
        reason: Reason,
    },
    Ping {
        ack: bool,
        payload: [u8; 8],
    },
}

/// One side: its connection, the bytes waiting for it, what it saw.
#[derive(Debug)]
pub(crate) struct End {
    pub(crate) conn: Conn,
    pub(crate) input: BytesMut,
    pub(crate) seen: VecDeque<Seen>,
    /// Release every DATA byte as it arrives (a reader keeping up), or
    /// hold it until the test calls [`Conn::release`].
    pub(crate) auto_release: bool,
    /// The connection error this side ended with, if any.
    pub(crate) error: Option<ConnError>,
    /// Frames this side wrote, as (type, flags, stream, payload): what a
    /// test asserts about the wire.
    pub(crate) wrote: Vec<(u8, u8, u32, Vec<u8>)>,
    /// Bytes of a frame header or payload written but not yet recorded.
    partial: Vec<u8>,
    /// Bytes taken out of the output that the pair has not moved yet.
    held: Vec<u8>,
}

impl End {
    fn new(conn: Conn) -> End {
        End {
            conn,
            input: BytesMut::new(),
            seen: VecDeque::new(),
            auto_release: true,
            error: None,
            wrote: Vec::new(),
            partial: Vec::new(),
            held: Vec::new(),
        }
    }

    /// Takes the events seen so far.
    pub(crate) fn take(&mut self) -> Vec<Seen> {
        self.seen.drain(..).collect()
    }

    /// Frames of type `ty` this side wrote.
    pub(crate) fn wrote_kind(&self, ty: u8) -> Vec<&(u8, u8, u32, Vec<u8>)> {
        self.wrote.iter().filter(|f| f.0 == ty).collect()
    }

    /// The RST_STREAM frames this side wrote, as (stream, reason).
    pub(crate) fn resets_sent(&self) -> Vec<(u32, Reason)> {
        self.wrote_kind(kind::RST_STREAM)
            .into_iter()
            .map(|f| (f.2, Reason(u32::from_be_bytes([f.3[0], f.3[1], f.3[2], f.3[3]]))))
            .collect()
    }

    /// The GOAWAY this side wrote, as (last stream, reason, debug text).
    pub(crate) fn goaway_sent(&self) -> Option<(u32, Reason, String)> {
        self.wrote_kind(kind::GOAWAY).last().map(|f| {
            let p = &f.3;
            let last = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
            let reason = Reason(u32::from_be_bytes([p[4], p[5], p[6], p[7]]));
            (last, reason, String::from_utf8_lossy(&p[8..]).into_owned())
        })
    }

    /// Records the frames in `bytes` (what this side writes), skipping the
    /// client's connection preface.
    fn record(&mut self, bytes: &[u8]) {
        self.partial.extend_from_slice(bytes);
        if self.partial.starts_with(frame::PREFACE) {
            self.partial.drain(..frame::PREFACE.len());
        }
        loop {
            let Some(head) = Head::parse(&self.partial) else { return };
            let total = HEADER_LEN + head.len as usize;
            if self.partial.len() < total {
                return;
            }
            let payload = self.partial[HEADER_LEN..total].to_vec();
            self.wrote.push((head.kind, head.flags, head.stream, payload));
            self.partial.drain(..total);
        }
    }

    /// Takes events from the bytes waiting for this side until it needs
    /// more; whether it took any.
    fn pump(&mut self) -> bool {
        let mut any = false;
        while self.error.is_none() {
            let ev = match self.conn.next_event(&mut self.input) {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => {
                    self.error = Some(e);
                    break;
                }
            };
            any = true;
            let fields = |c: &Conn| {
                c.headers().iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect::<Vec<_>>()
            };
            let seen = match ev {
                Event::Open { stream, end_stream } => Seen::Open {
                    stream,
                    end_stream,
                    path: self.conn.headers().path().unwrap_or_default().to_vec(),
                    fields: fields(&self.conn),
                    too_large: self.conn.headers().too_large(),
                },
                Event::Headers { stream, end_stream } => Seen::Headers {
                    stream,
                    end_stream,
                    status: self.conn.headers().status().unwrap_or_default().to_vec(),
                    fields: fields(&self.conn),
                },
                Event::Trailers { stream } => Seen::Trailers { stream, fields: fields(&self.conn) },
                Event::Data { stream, data, end_stream } => {
                    if self.auto_release {
                        self.conn.release(stream, data.len());
                    }
                    Seen::Data { stream, data, end_stream }
                }
                Event::Reset { stream, reason, by_peer } => Seen::Reset { stream, reason, by_peer },
                Event::GoAway { last_stream, reason } => Seen::GoAway { last_stream, reason },
                Event::Ping { ack, payload } => Seen::Ping { ack, payload },
            };
            self.seen.push_back(seen);
        }
        any
    }

    /// Everything this side saw on `stream`'s DATA, concatenated, and
    /// whether the last of it ended the stream.
    pub(crate) fn body(&self, stream: u32) -> (Vec<u8>, bool) {
        let mut body = Vec::new();
        let mut ended = false;
        for s in &self.seen {
            if let Seen::Data { stream: id, data, end_stream } = s {
                if *id == stream {
                    body.extend_from_slice(data);
                    ended |= *end_stream;
                }
            }
        }
        (body, ended)
    }
}

/// The two sides.
#[derive(Debug)]
pub(crate) struct Pair {
    pub(crate) client: End,
    pub(crate) server: End,
    /// At most this many bytes move per direction per step (`usize::MAX`:
    /// everything waiting): small values cut frames at every byte.
    pub(crate) chunk: usize,
}

impl Pair {
    /// A pair with default settings; nothing has moved yet.
    pub(crate) fn new() -> Pair {
        Pair::with(Config::new(Role::Client), Config::new(Role::Server))
    }

    /// A pair with these settings.
    pub(crate) fn with(client: Config, server: Config) -> Pair {
        Pair {
            client: End::new(Conn::new(client)),
            server: End::new(Conn::new(server)),
            chunk: usize::MAX,
        }
    }

    /// A pair whose prefaces and SETTINGS have been exchanged and
    /// acknowledged.
    pub(crate) fn connected() -> Pair {
        let mut p = Pair::new();
        p.drive();
        assert!(p.client.conn.is_established() && p.server.conn.is_established());
        p
    }

    /// Moves what `from` has written to the other side (at most
    /// `self.chunk` bytes, the rest in later steps, in order); whether
    /// anything moved.
    fn transmit(&mut self, from: Side) -> bool {
        let chunk = self.chunk;
        let (src, dst) = match from {
            Side::Client => (&mut self.client, &mut self.server),
            Side::Server => (&mut self.server, &mut self.client),
        };
        let out = src.conn.output();
        if !out.is_empty() {
            let all = out.take_all();
            src.held.extend_from_slice(&all);
        }
        if src.held.is_empty() {
            return false;
        }
        let n = src.held.len().min(chunk);
        let part: Vec<u8> = src.held.drain(..n).collect();
        src.record(&part);
        dst.input.extend_from_slice(&part);
        true
    }

    /// One round: each side's output moves to the other, each side takes
    /// its events; whether anything happened.
    pub(crate) fn step(&mut self) -> bool {
        let mut any = false;
        for side in [Side::Client, Side::Server] {
            any |= self.transmit(side);
        }
        any |= self.client.pump();
        any |= self.server.pump();
        any
    }

    /// Steps until neither side has anything to say (bounded: a test that
    /// never settles fails instead of hanging).
    pub(crate) fn drive(&mut self) {
        for _ in 0..100_000 {
            if !self.step() {
                return;
            }
        }
        panic!("the pair never settled");
    }

    /// Writes raw bytes as if `from` sent them (frames a well-behaved
    /// `Conn` would never write), delivers them, and drives the pair until
    /// it settles.
    pub(crate) fn inject(&mut self, from: Side, bytes: &[u8]) {
        let dst = match from {
            Side::Client => &mut self.server,
            Side::Server => &mut self.client,
        };
        dst.input.extend_from_slice(bytes);
        dst.pump();
        self.drive();
    }

    /// Client: opens a stream and sends a POST to `path` with `extra`
    /// fields; `end_stream`: no body follows.
    pub(crate) fn request(&mut self, path: &str, extra: &[(&str, &str)], end_stream: bool) -> u32 {
        let id = self.client.conn.open_stream().expect("a stream may be opened");
        self.client.conn.send_headers(id, end_stream, |s| request_fields(s, path, extra));
        id
    }

    /// Server: answers stream `id` with `:status: 200` and
    /// `content-type: application/grpc`.
    pub(crate) fn respond(&mut self, id: u32, end_stream: bool) {
        self.server.conn.send_headers(id, end_stream, |s| {
            s.field(b":status", b"200", Index::Yes);
            s.field(b"content-type", b"application/grpc", Index::Yes);
        });
    }

    /// Server: trailers `grpc-status: 0` on stream `id`.
    pub(crate) fn finish(&mut self, id: u32) {
        self.server.conn.send_trailers(id, |s| s.field(b"grpc-status", b"0", Index::Yes));
    }
}

/// The fields of a gRPC request to `path`, then `extra`.
pub(crate) fn request_fields(s: &mut dyn FieldSink, path: &str, extra: &[(&str, &str)]) {
    s.field(b":method", b"POST", Index::Yes);
    s.field(b":scheme", b"http", Index::Yes);
    s.field(b":path", path.as_bytes(), Index::Yes);
    s.field(b":authority", b"localhost", Index::Yes);
    s.field(b"content-type", b"application/grpc", Index::Yes);
    s.field(b"te", b"trailers", Index::Yes);
    for (n, v) in extra {
        s.field(n.as_bytes(), v.as_bytes(), Index::No);
    }
}

/// One raw frame.
pub(crate) fn raw(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    frame::write_head(&mut v, payload.len(), ty, flags, stream);
    v.extend_from_slice(payload);
    v
}

/// A header block of a request to `path`, encoded with a fresh encoder
/// (literal fields only: valid on any connection, whatever its table).
pub(crate) fn request_block(path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    struct Sink<'a>(&'a mut Encoder, &'a mut Vec<u8>);
    impl FieldSink for Sink<'_> {
        fn field(&mut self, name: &[u8], value: &[u8], _: Index) {
            self.0.encode(name, value, Index::No, self.1);
        }
    }
    let mut enc = Encoder::new();
    let mut out = Vec::new();
    enc.begin(&mut out);
    request_fields(&mut Sink(&mut enc, &mut out), path, extra);
    out
}

/// A 4-byte big-endian payload (WINDOW_UPDATE, RST_STREAM).
pub(crate) fn be32(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

/// The stream `id`'s DATA carrying `n` bytes of a repeating pattern.
pub(crate) fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// Asserts `end` ended the connection with `reason`.
pub(crate) fn assert_conn_error(end: &End, reason: Reason) {
    let e = end.error.as_ref().expect("a connection error");
    assert_eq!(e.reason, reason, "{e}");
    let (_, sent, _) = end.goaway_sent().expect("GOAWAY sent");
    assert_eq!(sent, reason);
}
