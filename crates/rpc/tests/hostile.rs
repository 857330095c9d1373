//! Hostile peers: malformed HTTP/2, invalid gRPC framing and protobuf,
//! oversized and compressed-bomb messages, stream floods, clients that stop
//! reading, bad metadata — and, the other way round, servers that lie to
//! the client.
//!
//! Every server-side test checks the precise outcome of the hostile act and
//! then that the server still serves a fresh, well-behaved client. Every
//! wait is bounded by a timeout, so no test can hang.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use h2::RecvStream;
use http::{HeaderMap, HeaderValue, StatusCode};
use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::{CallOptions, Channel, ChannelOptions, Client, Router, ServerOptions};
use protoplane_schema::ProtoSource;
use protoplane_test_support::net::holds_for;
use protoplane_wire::{Block, Builder, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::timeout;

const PROTO: &str = r#"
syntax = "proto3";
package hostile;

message Req {
  bytes body = 1;
  // Stream: number of responses; Unary: ignored.
  int32 count = 2;
  // Stream: bytes per response.
  int32 size = 3;
  // Unary: sleep this long before answering.
  int32 sleep_ms = 4;
}

message Resp { bytes body = 1; }

service Echo {
  rpc Unary(Req) returns (Resp);
  rpc Stream(Req) returns (stream Resp);
  rpc Collect(stream Req) returns (Resp);
}
"#;

const SERVICE: &str = "hostile.Echo";
const UNARY: &str = "/hostile.Echo/Unary";
const STREAM: &str = "/hostile.Echo/Stream";
const COLLECT: &str = "/hostile.Echo/Collect";

/// The server's (and the test client's) message size limit.
const MAX_RECV: usize = 64 << 10;
/// Concurrent streams per connection the server admits.
const MAX_STREAMS: u32 = 8;
/// Responses queued between handler and engine.
const RESPONSE_QUEUE: usize = 8;
/// The bound on any single wait in these tests.
const BOUND: Duration = Duration::from_secs(5);
/// What "promptly" means for an answer the server must give at once.
const PROMPT: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------
// The service.

struct Ids {
    unary: u32,
    stream: u32,
    collect: u32,
    req: u32,
    resp: u32,
}

fn schema() -> &'static Arc<Schema> {
    static SCHEMA: OnceLock<Arc<Schema>> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let src = [ProtoSource { name: "hostile.proto", text: PROTO }];
        Arc::new(Schema::from_proto_sources(&src, &["hostile.proto"]).expect("the proto compiles"))
    })
}

fn ids() -> &'static Ids {
    static IDS: OnceLock<Ids> = OnceLock::new();
    IDS.get_or_init(|| {
        let s = schema();
        let m = |name: &str| s.find(SERVICE, name).expect("method declared");
        let t = |name: &str| s.tables().message_by_name(name).expect("message declared");
        Ids {
            unary: m("Unary"),
            stream: m("Stream"),
            collect: m("Collect"),
            req: t("hostile.Req"),
            resp: t("hostile.Resp"),
        }
    })
}

/// What the handlers did, for the tests to check.
#[derive(Default)]
struct Counters {
    /// Handler futures created.
    started: AtomicUsize,
    /// Handler futures dropped (completed or cancelled).
    dropped: AtomicUsize,
    /// Stream responses the handler managed to hand to the engine.
    sent: AtomicUsize,
}

/// Counts a handler future's life: created, then dropped.
struct Guard(Arc<Counters>);

impl Guard {
    fn new(c: Arc<Counters>) -> Guard {
        c.started.fetch_add(1, Ordering::SeqCst);
        Guard(c)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

struct Echo {
    counters: Arc<Counters>,
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::new(Code::Internal, e.to_string())
}

fn resp_block(body: &[u8]) -> Result<Block, Status> {
    let mut b = Builder::new(schema().tables(), ids().resp).map_err(internal)?;
    let root = b.root();
    if !body.is_empty() {
        b.set(root, 1, Value::Bytes(body)).map_err(internal)?;
    }
    Ok(b.finish())
}

/// (body, count, size, sleep_ms) of a request.
fn read_req(m: &protoplane_grpc::Message) -> Result<(Vec<u8>, i64, i64, i64), Status> {
    let v = m.view(schema().tables())?;
    let get = |n: u32| v.by_number(n).map_err(internal);
    let int = |n: u32| -> Result<i64, Status> {
        Ok(get(n)?.and_then(|x| x.as_i128()).unwrap_or(0) as i64)
    };
    let body = get(1)?.and_then(|x| x.as_bytes()).unwrap_or_default().to_vec();
    Ok((body, int(2)?, int(3)?, int(4)?))
}

impl Echo {
    async fn unary(&self, mut req: Request<Streaming>, mut out: Responder) -> Result<(), Status> {
        let m = req.message.single().await?;
        let (body, _, _, sleep_ms) = read_req(&m)?;
        if sleep_ms > 0 {
            tokio::time::sleep(Duration::from_millis(sleep_ms as u64)).await;
        }
        out.send(resp_block(&body)?).await
    }

    async fn stream(&self, mut req: Request<Streaming>, mut out: Responder) -> Result<(), Status> {
        let m = req.message.single().await?;
        let (_, count, size, _) = read_req(&m)?;
        let payload = vec![7u8; size.max(0) as usize];
        for _ in 0..count {
            out.send(resp_block(&payload)?).await?;
            self.counters.sent.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }

    async fn collect(&self, mut req: Request<Streaming>, mut out: Responder) -> Result<(), Status> {
        let mut all = Vec::new();
        while let Some(m) = req.message.message().await {
            all.extend_from_slice(&read_req(&m)?.0);
        }
        out.send(resp_block(&all)?).await
    }
}

impl Service for Echo {
    fn schema(&self) -> &Arc<Schema> {
        schema()
    }

    fn name(&self) -> &str {
        SERVICE
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        request: Request<Streaming>,
        responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            let _guard = Guard::new(self.counters.clone());
            let ids = ids();
            if method == ids.unary {
                self.unary(request, responder).await?;
            } else if method == ids.stream {
                self.stream(request, responder).await?;
            } else if method == ids.collect {
                self.collect(request, responder).await?;
            } else {
                return Err(Status::new(Code::Unimplemented, "no such method"));
            }
            Ok(Metadata::new())
        })
    }
}

struct Server {
    addr: SocketAddr,
    counters: Arc<Counters>,
    _task: JoinHandle<std::io::Result<()>>,
}

/// A server of its own per test (so counters are the test's own).
async fn start_server() -> Server {
    let counters = Arc::new(Counters::default());
    let opts = ServerOptions {
        max_recv_message: MAX_RECV,
        max_concurrent_streams: MAX_STREAMS,
        response_queue: RESPONSE_QUEUE,
        ..ServerOptions::default()
    };
    let router =
        Router::new(opts).add_service(Arc::new(Echo { counters: counters.clone() }) as Arc<_>);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a local port");
    let addr = listener.local_addr().expect("bound address");
    let task = tokio::spawn(Arc::new(router).serve(listener));
    Server { addr, counters, _task: task }
}

// ---------------------------------------------------------------------------
// Messages by hand.

fn varint(n: u64, out: &mut Vec<u8>) {
    protoplane_test_support::wire::varint(out, n)
}

/// An encoded `Req`.
fn req_bytes(body: &[u8], count: i32, size: i32, sleep_ms: i32) -> Vec<u8> {
    let mut out = Vec::new();
    if !body.is_empty() {
        out.push(0x0a);
        varint(body.len() as u64, &mut out);
        out.extend_from_slice(body);
    }
    for (tag, v) in [(0x10, count), (0x18, size), (0x20, sleep_ms)] {
        if v != 0 {
            out.push(tag);
            varint(v as u64, &mut out);
        }
    }
    out
}

/// An encoded `Resp`.
fn resp_bytes(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    if !body.is_empty() {
        out.push(0x0a);
        varint(body.len() as u64, &mut out);
        out.extend_from_slice(body);
    }
    out
}

/// One gRPC length-prefixed message.
fn framed(compressed: bool, msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    protoplane_grpc::encode_frame(compressed, msg, &mut out).expect("message under 4 GiB");
    out
}

/// A frame header alone, declaring `len` bytes.
fn frame_header(flag: u8, len: u32) -> Vec<u8> {
    let mut out = vec![flag];
    out.extend_from_slice(&len.to_be_bytes());
    out
}

fn req_block(body: &[u8]) -> Block {
    let mut b = Builder::new(schema().tables(), ids().req).expect("Req builder");
    let root = b.root();
    b.set(root, 1, Value::Bytes(body)).expect("Req.body");
    b.finish()
}

fn body_of(m: &protoplane_grpc::Message) -> Vec<u8> {
    let v = m.view(schema().tables()).expect("readable response");
    v.by_number(1).expect("readable field").and_then(|x| x.as_bytes()).unwrap_or_default().to_vec()
}

// ---------------------------------------------------------------------------
// Well-behaved client.

/// A fresh connection and a unary call that must succeed: the server still
/// serves everyone else.
async fn assert_serving(addr: SocketAddr) {
    let got = timeout(BOUND, async {
        let ch = Channel::connect(&addr.to_string()).await?;
        let client = Client::new(ch, schema().clone());
        let block = req_block(b"still alive");
        let (m, _) = client.unary(ids().unary, Request::new(&block)).await?;
        Ok::<_, Status>(body_of(&m))
    })
    .await
    .expect("the well-behaved call finished in time")
    .expect("the well-behaved call succeeded");
    assert_eq!(got, b"still alive");
}

/// Responses add up to several connection windows on one channel: every
/// response's credit goes back, also when the call's stream closed before
/// the client took the data (a leak would stall the connection after 4 MiB).
#[tokio::test]
async fn client_returns_the_credit_of_every_response() {
    let server = start_server().await;
    let ch = Channel::connect(&server.addr.to_string()).await.expect("connect");
    let client = Client::new(ch, schema().clone());
    let body = vec![b'c'; 8 << 10];
    let block = req_block(&body);
    timeout(Duration::from_secs(20), async {
        for i in 0..1500 {
            let (m, _) =
                client.unary(ids().unary, Request::new(&block)).await.unwrap_or_else(|e| {
                    panic!("call {i}: {e:?}");
                });
            assert_eq!(body_of(&m).len(), body.len());
        }
    })
    .await
    .expect("12 MiB of responses in time");
}

/// Waits until `f` holds (polling), failing after `BOUND`.
async fn eventually(what: &str, f: impl Fn() -> bool) {
    protoplane_test_support::net::eventually(BOUND, what, f).await
}

// ---------------------------------------------------------------------------
// Raw h2 client.

/// What came back for one request.
#[derive(Debug)]
struct Reply {
    http: StatusCode,
    headers: HeaderMap,
    data: Vec<u8>,
    trailers: Option<HeaderMap>,
}

impl Reply {
    fn grpc_header(&self, name: &str) -> Option<&HeaderValue> {
        self.trailers.as_ref().and_then(|t| t.get(name)).or_else(|| self.headers.get(name))
    }

    /// grpc-status from the trailers, or from the headers of a trailers-only
    /// response.
    fn code(&self) -> Option<Code> {
        self.grpc_header("grpc-status").and_then(|v| Code::from_header(v.as_bytes()))
    }

    fn message(&self) -> String {
        self.grpc_header("grpc-message")
            .map(|v| protoplane_grpc::status::decode_message(v.as_bytes()))
            .unwrap_or_default()
    }
}

async fn h2_connect(addr: SocketAddr) -> (SendRequest<Bytes>, JoinHandle<()>) {
    let sock = TcpStream::connect(addr).await.expect("connect");
    let (send, conn) = h2::client::handshake(sock).await.expect("h2 handshake");
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (send, task)
}

fn grpc_request(addr: SocketAddr, path: &str, extra: &[(&str, &str)]) -> http::Request<()> {
    let mut b = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in extra {
        b = b.header(*k, *v);
    }
    b.body(()).expect("valid request")
}

async fn read_reply(resp: http::Response<RecvStream>) -> Result<Reply, h2::Error> {
    let (parts, mut body) = resp.into_parts();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await?;
    Ok(Reply { http: parts.status, headers: parts.headers, data, trailers })
}

/// Sends `req` with `body` on `send` (ending the request stream if `end`)
/// and reads the whole reply, keeping the request stream open meanwhile.
async fn exchange(
    send: &SendRequest<Bytes>,
    req: http::Request<()>,
    body: Vec<u8>,
    end: bool,
) -> Result<Reply, h2::Error> {
    let mut send = send.clone().ready().await?;
    let (resp, mut stream) = send.send_request(req, end && body.is_empty())?;
    // The server may answer (and close the stream) before the body is
    // sent: a failed send is not the outcome, the response is.
    let sent = match body.is_empty() {
        true => Ok(()),
        false => stream.send_data(Bytes::from(body), end),
    };
    let reply = match resp.await {
        Ok(r) => read_reply(r).await,
        Err(e) => Err(sent.err().unwrap_or(e)),
    };
    drop(stream);
    reply
}

/// One request on a fresh raw h2 connection, bounded in time.
async fn raw_call(addr: SocketAddr, req: http::Request<()>, body: Vec<u8>, end: bool) -> Reply {
    let (send, task) = h2_connect(addr).await;
    let what = format!("{} {} {:?}", req.method(), req.uri(), req.headers());
    let r = timeout(BOUND, exchange(&send, req, body, end))
        .await
        .unwrap_or_else(|_| panic!("{what}: the server did not answer in time"))
        .unwrap_or_else(|e| panic!("{what}: HTTP/2 error {e:?}"));
    task.abort();
    r
}

fn assert_grpc(r: &Reply, code: Code, what: &str) {
    assert_eq!(r.http, StatusCode::OK, "{what}: {r:?}");
    assert_eq!(r.code(), Some(code), "{what}: {r:?} ({})", r.message());
}

// ---------------------------------------------------------------------------
// Raw HTTP/2 frames over TCP.

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

// HTTP/2 error codes.
const PROTOCOL_ERROR: u32 = 0x1;
const FLOW_CONTROL_ERROR: u32 = 0x3;
const FRAME_SIZE_ERROR: u32 = 0x6;
const REFUSED_STREAM: u32 = 0x7;
const COMPRESSION_ERROR: u32 = 0x9;
const ENHANCE_YOUR_CALM: u32 = 0xb;

fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.push(ty);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// HPACK integer with an `n`-bit prefix (the prefix byte's other bits 0).
fn hpack_int(v: usize, n: u32, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(v as u8);
        return;
    }
    out.push(max as u8);
    let mut v = v - max;
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A header block of literals without indexing, no Huffman: trivially
/// valid HPACK that needs no encoder state.
fn hpack(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in headers {
        out.push(0x00);
        hpack_int(k.len(), 7, &mut out);
        out.extend_from_slice(k.as_bytes());
        hpack_int(v.len(), 7, &mut out);
        out.extend_from_slice(v.as_bytes());
    }
    out
}

fn grpc_headers_block(path: &str) -> Vec<u8> {
    hpack(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "localhost"),
        (":path", path),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ])
}

#[derive(Debug)]
struct RawFrame {
    ty: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

impl RawFrame {
    fn code(&self) -> Option<u32> {
        let at = match self.ty {
            RST_STREAM => 0,
            GOAWAY => 4,
            _ => return None,
        };
        let b = self.payload.get(at..at + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// How a raw connection ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// GOAWAY with this error code, then EOF.
    GoAway(u32),
    /// EOF (or a reset) without a GOAWAY.
    Closed,
}

struct RawConn {
    sock: TcpStream,
    buf: Vec<u8>,
    /// The server's MAX_CONCURRENT_STREAMS, once its SETTINGS arrived.
    max_streams: Option<u32>,
}

impl RawConn {
    async fn open(addr: SocketAddr) -> RawConn {
        let sock = TcpStream::connect(addr).await.expect("connect");
        let _ = sock.set_nodelay(true);
        RawConn { sock, buf: Vec::new(), max_streams: None }
    }

    /// Opens a connection and sends the preface and an empty SETTINGS.
    async fn h2(addr: SocketAddr) -> RawConn {
        let mut c = RawConn::open(addr).await;
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        c.write(&hello).await.expect("send the preface");
        c
    }

    async fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.sock.write_all(bytes).await
    }

    /// The next frame; `None` at EOF or on a read error. SETTINGS are
    /// acknowledged (and the stream limit noted) on the way.
    async fn next(&mut self) -> Option<RawFrame> {
        loop {
            if self.buf.len() >= 9 {
                let len = u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize;
                if self.buf.len() >= 9 + len {
                    let f = RawFrame {
                        ty: self.buf[3],
                        flags: self.buf[4],
                        stream: u32::from_be_bytes([
                            self.buf[5],
                            self.buf[6],
                            self.buf[7],
                            self.buf[8],
                        ]) & 0x7fff_ffff,
                        payload: self.buf[9..9 + len].to_vec(),
                    };
                    self.buf.drain(..9 + len);
                    if f.ty == SETTINGS && f.flags & ACK == 0 {
                        for s in f.payload.chunks_exact(6) {
                            if u16::from_be_bytes([s[0], s[1]]) == 0x3 {
                                self.max_streams =
                                    Some(u32::from_be_bytes([s[2], s[3], s[4], s[5]]));
                            }
                        }
                        let _ = self.write(&frame(SETTINGS, ACK, 0, &[])).await;
                    }
                    return Some(f);
                }
            }
            let mut chunk = [0u8; 16 << 10];
            match self.sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Reads until the server closes the connection; panics if it does not
    /// within `BOUND`.
    async fn ended(&mut self, what: &str) -> Ended {
        let r = timeout(BOUND, async {
            let mut goaway = None;
            while let Some(f) = self.next().await {
                if f.ty == GOAWAY && goaway.is_none() {
                    goaway = f.code();
                }
            }
            match goaway {
                Some(code) => Ended::GoAway(code),
                None => Ended::Closed,
            }
        })
        .await;
        r.unwrap_or_else(|_| panic!("{what}: the server kept the connection open"))
    }

    /// Reads frames until `done` says so (given every frame so far).
    async fn until(&mut self, what: &str, done: impl Fn(&[RawFrame]) -> bool) -> Vec<RawFrame> {
        let mut seen = Vec::new();
        let r = timeout(BOUND, async {
            while !done(&seen) {
                match self.next().await {
                    Some(f) => seen.push(f),
                    None => return false,
                }
            }
            true
        })
        .await;
        match r {
            Ok(true) => seen,
            Ok(false) => panic!("{what}: connection closed; frames: {seen:?}"),
            Err(_) => panic!("{what}: timed out; frames: {seen:?}"),
        }
    }
}

// ---------------------------------------------------------------------------
// 1. Malformed HTTP/2.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_http2_closes_only_that_connection() {
    let server = start_server().await;
    let addr = server.addr;

    // Not HTTP/2 at all: an HTTP/1.1 request instead of the preface.
    let mut c = RawConn::open(addr).await;
    c.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("send");
    let ended = c.ended("garbage preface").await;
    assert!(matches!(ended, Ended::Closed | Ended::GoAway(_)), "{ended:?}");
    assert_serving(addr).await;

    // Correct preface, then frames that are connection errors (RFC 9113):
    // GOAWAY with the code the RFC names, or PROTOCOL_ERROR (the generic
    // code, which the h2 crate's server, still selectable, uses for bad
    // SETTINGS/PING lengths, bad HPACK indices and an out-of-range
    // SETTINGS_INITIAL_WINDOW_SIZE), then EOF.
    let long_payload = [0u8; 9];
    let cases: Vec<(&str, Vec<u8>, u32)> = vec![
        // SETTINGS whose length is not a multiple of 6.
        ("settings of 5 bytes", frame(SETTINGS, 0, 0, &[0; 5]), FRAME_SIZE_ERROR),
        // A frame header declaring 16 MiB - 1 (over SETTINGS_MAX_FRAME_SIZE);
        // the body is never sent: the server must decide on the header.
        (
            "frame over max size",
            {
                let mut f = frame(DATA, 0, 1, &[]);
                f[..3].copy_from_slice(&[0xff, 0xff, 0xff]);
                f
            },
            FRAME_SIZE_ERROR,
        ),
        // HEADERS whose block indexes a table entry that does not exist.
        (
            "broken HPACK",
            frame(HEADERS, END_HEADERS | END_STREAM, 1, &[0xff, 0xff, 0xff, 0xff, 0x0f]),
            COMPRESSION_ERROR,
        ),
        // DATA on stream 0.
        ("DATA on stream 0", frame(DATA, 0, 0, b"hello"), PROTOCOL_ERROR),
        // A client-initiated stream with an even id.
        (
            "HEADERS on stream 2",
            frame(HEADERS, END_HEADERS, 2, &grpc_headers_block(UNARY)),
            PROTOCOL_ERROR,
        ),
        // PING that is not 8 bytes.
        ("PING of 9 bytes", frame(PING, 0, 0, &long_payload), FRAME_SIZE_ERROR),
        // WINDOW_UPDATE of 0 on the connection.
        ("WINDOW_UPDATE of 0", frame(WINDOW_UPDATE, 0, 0, &[0; 4]), PROTOCOL_ERROR),
        // A connection window pushed past 2^31 - 1.
        (
            "window overflow",
            frame(WINDOW_UPDATE, 0, 0, &0x7fff_ffffu32.to_be_bytes()),
            FLOW_CONTROL_ERROR,
        ),
        // SETTINGS_INITIAL_WINDOW_SIZE above 2^31 - 1.
        (
            "initial window too large",
            frame(SETTINGS, 0, 0, &[0, 4, 0x80, 0, 0, 0]),
            FLOW_CONTROL_ERROR,
        ),
    ];
    for (what, bad, code) in cases {
        let mut c = RawConn::h2(addr).await;
        c.write(&bad).await.expect("send the bad frame");
        let ended = c.ended(what).await;
        assert!(
            ended == Ended::GoAway(code) || ended == Ended::GoAway(PROTOCOL_ERROR),
            "{what}: {ended:?}"
        );
        assert_serving(addr).await;
    }

    // An unknown frame type must be ignored (RFC 9113 §4.1), not fatal: the
    // connection still answers a PING.
    let mut c = RawConn::h2(addr).await;
    let mut bytes = frame(0xfa, 0xff, 0, b"whatever");
    bytes.extend(frame(PING, 0, 0, b"12345678"));
    c.write(&bytes).await.expect("send");
    let seen = c.until("PING after an unknown frame", |fs| fs.iter().any(|f| f.ty == PING)).await;
    let pong = seen.iter().find(|f| f.ty == PING).expect("found above");
    assert_eq!((pong.flags & ACK, pong.payload.as_slice()), (ACK, &b"12345678"[..]));

    // CONTINUATION flood: a header block that never ends. The server must
    // give up on the connection rather than buffer without bound (a few
    // more CONTINUATION bytes than the header list limit needs, then
    // GOAWAY(ENHANCE_YOUR_CALM)).
    let mut c = RawConn::h2(addr).await;
    let first = hpack(&[(":method", "POST"), (":path", UNARY)]);
    c.write(&frame(HEADERS, 0, 1, &first)).await.expect("send HEADERS");
    let mut sent = 0usize;
    let mut flood = Vec::new();
    let piece = hpack(&[("x-flood", &"a".repeat(1000))]);
    for _ in 0..64 {
        flood.extend(frame(CONTINUATION, 0, 1, &piece));
    }
    let start = Instant::now();
    while sent < 16 << 20 && start.elapsed() < BOUND {
        if c.write(&flood).await.is_err() {
            break;
        }
        sent += flood.len();
    }
    assert!(sent < 16 << 20, "the server took 16 MiB of one header block");
    assert_eq!(c.ended("CONTINUATION flood").await, Ended::GoAway(ENHANCE_YOUR_CALM));
    assert_serving(addr).await;
}

// ---------------------------------------------------------------------------
// 2. Invalid gRPC framing.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_grpc_framing_is_refused() {
    let server = start_server().await;
    let addr = server.addr;
    let msg = req_bytes(b"hi", 0, 0, 0);

    // Compressed-flag byte 2.
    let mut bad_flag = framed(false, &msg);
    bad_flag[0] = 2;
    let r = raw_call(addr, grpc_request(addr, UNARY, &[]), bad_flag, true).await;
    assert_grpc(&r, Code::Internal, "flag 2");

    // A message cut short at END_STREAM: header and body.
    let whole = framed(false, &msg);
    for cut in [3, whole.len() - 1] {
        let r = raw_call(addr, grpc_request(addr, UNARY, &[]), whole[..cut].to_vec(), true).await;
        assert_grpc(&r, Code::Internal, &format!("cut at {cut}"));
    }

    // gzip announced, flag 1, bytes that are not gzip.
    let r = raw_call(
        addr,
        grpc_request(addr, UNARY, &[("grpc-encoding", "gzip")]),
        framed(true, b"certainly not gzip"),
        true,
    )
    .await;
    assert_grpc(&r, Code::Internal, "gzip garbage");

    // Flag 1 on a stream without grpc-encoding.
    let r = raw_call(addr, grpc_request(addr, UNARY, &[]), framed(true, &msg), true).await;
    assert_grpc(&r, Code::Internal, "flag 1 without grpc-encoding");

    // An encoding the server does not implement: UNIMPLEMENTED, and the
    // server says what it accepts.
    let r = raw_call(
        addr,
        grpc_request(addr, UNARY, &[("grpc-encoding", "br")]),
        framed(true, &msg),
        true,
    )
    .await;
    assert_grpc(&r, Code::Unimplemented, "grpc-encoding br");
    let accept = r.headers.get("grpc-accept-encoding").expect("grpc-accept-encoding header");
    let accept = accept.to_str().expect("ASCII");
    assert!(accept.split(',').any(|e| e.trim() == "gzip"), "{accept}");

    // Two messages for a method that takes one.
    let mut two = framed(false, &msg);
    two.extend(framed(false, &msg));
    let r = raw_call(addr, grpc_request(addr, UNARY, &[]), two, true).await;
    assert_grpc(&r, Code::Unimplemented, "two requests on unary");

    // The same framing errors on a client-streaming call (the engine reads
    // while the handler runs).
    let mut stream = framed(false, &msg);
    stream.extend([2, 0, 0, 0, 0]);
    let r = raw_call(addr, grpc_request(addr, COLLECT, &[]), stream, true).await;
    assert_grpc(&r, Code::Internal, "flag 2 mid-stream");
    let r = raw_call(addr, grpc_request(addr, COLLECT, &[]), whole[..7].to_vec(), true).await;
    assert_grpc(&r, Code::Internal, "truncated mid-stream");

    // Control: valid gzip is accepted.
    let r = raw_call(
        addr,
        grpc_request(addr, UNARY, &[("grpc-encoding", "gzip")]),
        framed(true, &protoplane_grpc::codec::gzip(&msg)),
        true,
    )
    .await;
    assert_grpc(&r, Code::Ok, "valid gzip");
    assert_eq!(r.data, framed(false, &resp_bytes(b"hi")));

    assert_serving(addr).await;
}

// ---------------------------------------------------------------------------
// 3. Invalid protobuf.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_protobuf_is_invalid_argument() {
    let server = start_server().await;
    let addr = server.addr;
    let cases: [(&str, &[u8]); 4] = [
        // Field 1, length 2^32 - 1: far beyond the message.
        ("length beyond the message", &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]),
        // Field 2 (varint) whose varint never ends.
        ("truncated varint", &[0x10, 0xff, 0xff]),
        // A varint of 11 bytes.
        (
            "overlong varint",
            &[0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        ),
        // Field number 0.
        ("field number 0", &[0x00, 0x01]),
    ];
    for (what, bytes) in cases {
        for path in [UNARY, STREAM, COLLECT] {
            let r = raw_call(addr, grpc_request(addr, path, &[]), framed(false, bytes), true).await;
            assert_grpc(&r, Code::InvalidArgument, &format!("{what} on {path}"));
        }
    }
    // Only the unary/streaming handlers that got a valid message may have
    // run: Collect handlers start before the first message and must have
    // been dropped.
    let c = &server.counters;
    eventually("every handler dropped", || {
        c.started.load(Ordering::SeqCst) == c.dropped.load(Ordering::SeqCst)
    })
    .await;
    assert_serving(addr).await;
}

// ---------------------------------------------------------------------------
// 4. Oversized messages.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_are_refused_on_the_frame_header() {
    let server = start_server().await;
    let addr = server.addr;

    // A header declaring 1 GiB, and nothing else: the request stream stays
    // open, so the answer can only come from the header.
    for path in [UNARY, COLLECT] {
        let start = Instant::now();
        let r =
            raw_call(addr, grpc_request(addr, path, &[]), frame_header(0, 1 << 30), false).await;
        assert_grpc(&r, Code::ResourceExhausted, &format!("1 GiB header on {path}"));
        assert!(start.elapsed() < PROMPT, "answered after {:?}", start.elapsed());
    }

    // Exactly the limit passes; one byte more does not.
    let at_limit = req_bytes(&vec![1; MAX_RECV - 4], 0, 0, 0);
    assert_eq!(at_limit.len(), MAX_RECV);
    let r = raw_call(addr, grpc_request(addr, UNARY, &[]), framed(false, &at_limit), true).await;
    assert_grpc(&r, Code::Ok, "message at the limit");
    let over = req_bytes(&vec![1; MAX_RECV - 3], 0, 0, 0);
    let r = raw_call(addr, grpc_request(addr, UNARY, &[]), framed(false, &over), true).await;
    assert_grpc(&r, Code::ResourceExhausted, "message one byte over the limit");

    // A gzip bomb: ~10 KiB expanding to 10 MiB of zeros.
    let zeros = vec![0u8; 10 << 20];
    let bomb = protoplane_grpc::codec::gzip(&zeros);
    assert!(bomb.len() < MAX_RECV, "the bomb itself passes the frame check");
    for path in [UNARY, COLLECT] {
        let start = Instant::now();
        let r = raw_call(
            addr,
            grpc_request(addr, path, &[("grpc-encoding", "gzip")]),
            framed(true, &bomb),
            true,
        )
        .await;
        assert_grpc(&r, Code::ResourceExhausted, &format!("gzip bomb on {path}"));
        assert!(start.elapsed() < PROMPT, "answered after {:?}", start.elapsed());
    }
    assert_serving(addr).await;
}

// ---------------------------------------------------------------------------
// 5. Too many streams.

/// A client that ignores SETTINGS_MAX_CONCURRENT_STREAMS: the excess
/// streams are refused with RST_STREAM(REFUSED_STREAM), the admitted ones
/// still complete, and freed slots are usable again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excess_streams_are_refused() {
    let server = start_server().await;
    let addr = server.addr;
    let mut c = RawConn::h2(addr).await;
    // The server announces its limit.
    c.until("server SETTINGS", |fs| fs.iter().any(|f| f.ty == SETTINGS && f.flags & ACK == 0))
        .await;
    assert_eq!(c.max_streams, Some(MAX_STREAMS));

    // Open MAX_STREAMS + 3 streams at once, none finished.
    let total = MAX_STREAMS + 3;
    let block = grpc_headers_block(COLLECT);
    let mut bytes = Vec::new();
    for i in 0..total {
        bytes.extend(frame(HEADERS, END_HEADERS, 2 * i + 1, &block));
    }
    c.write(&bytes).await.expect("send HEADERS");
    let admitted: Vec<u32> = (0..MAX_STREAMS).map(|i| 2 * i + 1).collect();
    let excess: Vec<u32> = (MAX_STREAMS..total).map(|i| 2 * i + 1).collect();
    let seen = c
        .until("REFUSED_STREAM for the excess", |fs| {
            excess.iter().all(|id| fs.iter().any(|f| f.ty == RST_STREAM && f.stream == *id))
        })
        .await;
    for f in seen.iter().filter(|f| f.ty == RST_STREAM) {
        assert!(excess.contains(&f.stream), "an admitted stream was reset: {f:?}");
        assert_eq!(f.code(), Some(REFUSED_STREAM), "{f:?}");
    }
    assert!(!seen.iter().any(|f| f.ty == GOAWAY), "{seen:?}");

    // The admitted streams complete once the client finishes them; then a
    // new stream fits again.
    let mut bytes = Vec::new();
    for id in &admitted {
        let body = format!("s{id}");
        bytes.extend(frame(
            DATA,
            END_STREAM,
            *id,
            &framed(false, &req_bytes(body.as_bytes(), 0, 0, 0)),
        ));
    }
    let again = 2 * total + 1;
    c.write(&bytes).await.expect("finish the admitted streams");
    let ended = |fs: &[RawFrame], id: u32| {
        fs.iter().any(|f| f.ty == HEADERS && f.stream == id && f.flags & END_STREAM != 0)
    };
    let seen =
        c.until("admitted streams answered", |fs| admitted.iter().all(|id| ended(fs, *id))).await;
    for id in &admitted {
        let data: Vec<u8> = seen
            .iter()
            .filter(|f| f.ty == DATA && f.stream == *id)
            .flat_map(|f| f.payload.clone())
            .collect();
        let want = framed(false, &resp_bytes(format!("s{id}").as_bytes()));
        assert_eq!(data, want, "response of stream {id}");
    }
    let mut bytes = frame(HEADERS, END_HEADERS, again, &block);
    bytes.extend(frame(DATA, END_STREAM, again, &framed(false, &req_bytes(b"again", 0, 0, 0))));
    c.write(&bytes).await.expect("open one more");
    let seen = c.until("a stream after the others ended", |fs| ended(fs, again)).await;
    assert!(!seen.iter().any(|f| f.ty == RST_STREAM), "{seen:?}");

    assert_serving(addr).await;
}

/// A conforming client (h2's) never exceeds the advertised limit: the
/// request over it is held by the client until a slot frees, then goes
/// through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conforming_client_waits_for_a_stream_slot() {
    let server = start_server().await;
    let addr = server.addr;
    let (send, _task) = h2_connect(addr).await;
    // One round trip first, so the client has the server's SETTINGS.
    let warm = timeout(
        BOUND,
        exchange(
            &send,
            grpc_request(addr, UNARY, &[]),
            framed(false, &req_bytes(b"w", 0, 0, 0)),
            true,
        ),
    )
    .await
    .expect("in time")
    .expect("warm-up call");
    assert_grpc(&warm, Code::Ok, "warm-up");

    let mut open = Vec::new();
    for _ in 0..MAX_STREAMS {
        let mut s =
            timeout(BOUND, send.clone().ready()).await.expect("ready in time").expect("ready");
        open.push(s.send_request(grpc_request(addr, COLLECT, &[]), false).expect("send_request"));
    }
    let k = &server.counters;
    let limit = 1 + MAX_STREAMS as usize;
    eventually("every admitted call reached its handler", || {
        k.started.load(Ordering::SeqCst) == limit
    })
    .await;
    // One more: h2 queues it in the client (it does not open the stream),
    // and the sender that issued it is not ready for another (a fresh
    // clone of SendRequest does not carry that backpressure).
    let mut s = timeout(BOUND, send.clone().ready()).await.expect("ready in time").expect("ready");
    let (queued_resp, mut queued) =
        s.send_request(grpc_request(addr, COLLECT, &[]), false).expect("send_request");
    assert!(
        timeout(Duration::from_millis(300), s.ready()).await.is_err(),
        "h2 should hold the sender while its request waits for a stream slot"
    );
    assert_eq!(k.started.load(Ordering::SeqCst), limit, "the server saw an excess call");
    queued
        .send_data(Bytes::from(framed(false, &req_bytes(b"queued", 0, 0, 0))), true)
        .expect("send");
    // Finish the first call: its slot goes to the queued request.
    let mut calls = open.into_iter();
    let (resp, mut stream) = calls.next().expect("first call");
    stream
        .send_data(Bytes::from(framed(false, &req_bytes(b"first", 0, 0, 0))), true)
        .expect("send");
    let r = timeout(BOUND, async { read_reply(resp.await?).await })
        .await
        .expect("in time")
        .expect("first reply");
    assert_grpc(&r, Code::Ok, "first call");
    let r = timeout(BOUND, async { read_reply(queued_resp.await?).await })
        .await
        .expect("in time")
        .expect("queued reply");
    assert_grpc(&r, Code::Ok, "queued call");
    assert_eq!(r.data, framed(false, &resp_bytes(b"queued")));
    drop(calls);
    assert_serving(addr).await;
}

/// "Rapid reset" (CVE-2023-44487): streams opened and reset at once, over
/// and over. The server cuts the connection with GOAWAY(ENHANCE_YOUR_CALM)
/// once the peer's resets exceed its budget, and a handler is first polled
/// only after the input at hand is processed, so (almost) no handler runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_flood_is_cut_off() {
    let server = start_server().await;
    let addr = server.addr;
    let mut c = RawConn::h2(addr).await;
    let block = grpc_headers_block(COLLECT);
    let mut bytes = Vec::new();
    for i in 0..2000u32 {
        bytes.extend(frame(HEADERS, END_HEADERS, 2 * i + 1, &block));
        bytes.extend(frame(RST_STREAM, 0, 2 * i + 1, &8u32.to_be_bytes()));
    }
    let _ = c.write(&bytes).await;
    assert_eq!(c.ended("rapid reset").await, Ended::GoAway(ENHANCE_YOUR_CALM));
    let k = &server.counters;
    eventually("every handler dropped", || {
        k.started.load(Ordering::SeqCst) == k.dropped.load(Ordering::SeqCst)
    })
    .await;
    assert!(
        k.started.load(Ordering::SeqCst) < 100,
        "{} handlers",
        k.started.load(Ordering::SeqCst)
    );
    assert_serving(addr).await;
}

/// Streams reset after their handler started: each handler is dropped (no
/// task or memory is left behind), and since the server had accepted them
/// the connection itself stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_after_start_drops_every_handler() {
    const CALLS: usize = 50;
    let server = start_server().await;
    let addr = server.addr;
    let k = server.counters.clone();
    let mut c = RawConn::h2(addr).await;
    let block = grpc_headers_block(COLLECT);
    for i in 0..CALLS {
        let id = 2 * i as u32 + 1;
        c.write(&frame(HEADERS, END_HEADERS, id, &block)).await.expect("send HEADERS");
        eventually("the handler started", || k.started.load(Ordering::SeqCst) == i + 1).await;
        c.write(&frame(RST_STREAM, 0, id, &8u32.to_be_bytes())).await.expect("send RST_STREAM");
    }
    eventually("every handler dropped", || k.dropped.load(Ordering::SeqCst) == CALLS).await;
    c.write(&frame(PING, 0, 0, b"still up")).await.expect("send PING");
    let seen = c.until("PING ACK", |fs| fs.iter().any(|f| f.ty == PING)).await;
    assert!(!seen.iter().any(|f| f.ty == GOAWAY), "{seen:?}");
    assert_eq!(k.started.load(Ordering::SeqCst), CALLS);
    assert_serving(addr).await;
}

// ---------------------------------------------------------------------------
// 6. A client that stops reading.

/// A client that reads slowly, with h2's default 64 KiB stream window: a
/// streamed response many times that window arrives whole, then its
/// status. (The server must resume a call whose backlog waited for credit
/// when the client's WINDOW_UPDATE comes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reader_gets_the_whole_stream() {
    let server = start_server().await;
    let addr = server.addr;
    let (send, _task) = h2_connect(addr).await;
    let mut s = timeout(BOUND, send.clone().ready()).await.expect("in time").expect("ready");
    const COUNT: usize = 40;
    const SIZE: usize = 48 << 10;
    let (resp, mut stream) =
        s.send_request(grpc_request(addr, STREAM, &[]), false).expect("send_request");
    stream
        .send_data(Bytes::from(framed(false, &req_bytes(b"", COUNT as i32, SIZE as i32, 0))), true)
        .expect("send");
    let r = timeout(BOUND, async {
        let (parts, mut body) = resp.await?.into_parts();
        let mut data = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk?;
            tokio::time::sleep(Duration::from_micros(200)).await;
            let _ = body.flow_control().release_capacity(chunk.len());
            data.extend_from_slice(&chunk);
        }
        let trailers = body.trailers().await?;
        Ok::<_, h2::Error>(Reply { http: parts.status, headers: parts.headers, data, trailers })
    })
    .await
    .expect("the whole stream in time")
    .expect("reply");
    assert_grpc(&r, Code::Ok, "slow reader");
    // Each response: a 5-byte frame header around a message that holds at
    // least SIZE bytes of body.
    let mut at = 0;
    let mut n = 0;
    while at + 5 <= r.data.len() {
        let len =
            u32::from_be_bytes([r.data[at + 1], r.data[at + 2], r.data[at + 3], r.data[at + 4]]);
        assert!(len as usize >= SIZE, "response {n}: {len} bytes");
        at += 5 + len as usize;
        n += 1;
    }
    assert_eq!((n, at), (COUNT, r.data.len()), "whole responses");
}

/// Starts `Stream` asking for 10,000 responses of 64 KiB and never reads
/// the body (h2's default 64 KiB windows, never released).
async fn stalled_stream(
    addr: SocketAddr,
    extra: &[(&str, &str)],
) -> (SendRequest<Bytes>, JoinHandle<()>, h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let (send, task) = h2_connect(addr).await;
    let mut s = timeout(BOUND, send.clone().ready()).await.expect("in time").expect("ready");
    let (resp, mut stream) =
        s.send_request(grpc_request(addr, STREAM, extra), false).expect("send_request");
    stream
        .send_data(Bytes::from(framed(false, &req_bytes(b"", 10_000, 64 << 10, 0))), true)
        .expect("send");
    (send, task, resp, stream)
}

/// Handler sends possible while the client reads nothing: the client's
/// 64 KiB window holds less than one 64 KiB response, so the engine is
/// stuck writing the first; the queue holds RESPONSE_QUEUE more; the
/// handler's own count lags one behind its send. Anything above that is
/// unbounded buffering.
const STALLED_MAX_SENT: usize = 1 + RESPONSE_QUEUE + 1;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_reader_is_bounded_and_cancelled_on_disconnect() {
    let server = start_server().await;
    let addr = server.addr;
    let k = server.counters.clone();
    let (send, task, resp, stream) = stalled_stream(addr, &[]).await;
    // Headers arrive (the handler started sending); the body is not read.
    let resp = timeout(BOUND, resp).await.expect("headers in time").expect("headers");
    assert_eq!(resp.status(), StatusCode::OK);
    eventually("the handler is sending", || k.sent.load(Ordering::SeqCst) >= 1).await;
    // However long the client stalls, the handler gets no further than the
    // connection's window and the response queue hold.
    let bounded = || k.sent.load(Ordering::SeqCst) <= STALLED_MAX_SENT;
    holds_for(Duration::from_secs(1), "sends to a stalled client stay bounded", bounded).await;
    assert_serving(addr).await;
    let sent = k.sent.load(Ordering::SeqCst);
    assert!((1..=STALLED_MAX_SENT).contains(&sent), "{sent} responses sent to a stalled client");
    assert_eq!(k.dropped.load(Ordering::SeqCst), k.started.load(Ordering::SeqCst) - 1);

    // The client goes away: the connection closes, the handler is dropped.
    drop((resp, stream, send));
    task.abort();
    let started = k.started.load(Ordering::SeqCst);
    eventually("the stalled handler is dropped", || k.dropped.load(Ordering::SeqCst) == started)
        .await;
    let sent = k.sent.load(Ordering::SeqCst);
    let same = || k.sent.load(Ordering::SeqCst) == sent;
    holds_for(Duration::from_millis(200), "a dropped handler sends no more", same).await;
    assert!(sent <= STALLED_MAX_SENT, "{sent}");
    assert_serving(addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_reader_reset_cancels_the_handler() {
    let server = start_server().await;
    let addr = server.addr;
    let k = server.counters.clone();
    let (send, _task, resp, mut stream) = stalled_stream(addr, &[]).await;
    let resp = timeout(BOUND, resp).await.expect("headers in time").expect("headers");
    eventually("the handler is sending", || k.sent.load(Ordering::SeqCst) >= 1).await;
    let bounded = || k.sent.load(Ordering::SeqCst) <= STALLED_MAX_SENT;
    holds_for(Duration::from_millis(200), "sends to a stalled client stay bounded", bounded).await;
    assert_eq!(k.dropped.load(Ordering::SeqCst), 0);
    // RST_STREAM(CANCEL) on a stream whose output is stuck on flow control.
    stream.send_reset(h2::Reason::CANCEL);
    eventually("the reset handler is dropped", || k.dropped.load(Ordering::SeqCst) == 1).await;
    drop(resp);
    // The same connection still works.
    let r = timeout(
        BOUND,
        exchange(
            &send,
            grpc_request(addr, UNARY, &[]),
            framed(false, &req_bytes(b"same", 0, 0, 0)),
            true,
        ),
    )
    .await
    .expect("in time")
    .expect("exchange");
    assert_grpc(&r, Code::Ok, "after the reset, same connection");
    assert_serving(addr).await;
}

/// The server enforces the deadline even while its output is stuck on a
/// client that does not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_reader_deadline_cancels_the_handler() {
    let server = start_server().await;
    let addr = server.addr;
    let k = server.counters.clone();
    let (_send, _task, resp, _stream) = stalled_stream(addr, &[("grpc-timeout", "300m")]).await;
    let _resp = timeout(BOUND, resp).await.expect("headers in time").expect("headers");
    let start = Instant::now();
    eventually("the handler is dropped at the deadline", || k.dropped.load(Ordering::SeqCst) == 1)
        .await;
    assert!(start.elapsed() < PROMPT, "dropped after {:?}", start.elapsed());
    assert_serving(addr).await;
}

// ---------------------------------------------------------------------------
// 7. Metadata and headers.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_metadata_and_headers() {
    let server = start_server().await;
    let addr = server.addr;
    let msg = framed(false, &req_bytes(b"x", 0, 0, 0));

    let internal: [(&str, &str); 5] = [
        ("x-data-bin", "!!!not base64!!!"),
        ("grpc-timeout", "abc"),
        ("grpc-timeout", "123456789S"),
        ("grpc-timeout", "10"),
        ("grpc-timeout", "5x"),
    ];
    for h in internal {
        let r = raw_call(addr, grpc_request(addr, UNARY, &[h]), msg.clone(), true).await;
        assert_grpc(&r, Code::Internal, &format!("{h:?}"));
    }
    // A well-formed -bin value and a maximal timeout are fine.
    let r = raw_call(
        addr,
        grpc_request(addr, UNARY, &[("x-data-bin", "AAEC"), ("grpc-timeout", "99999999H")]),
        msg.clone(),
        true,
    )
    .await;
    assert_grpc(&r, Code::Ok, "valid -bin and timeout");

    // Not POST.
    let get = http::Request::builder()
        .method("GET")
        .uri(format!("http://{addr}{UNARY}"))
        .header("content-type", "application/grpc")
        .body(())
        .expect("request");
    let r = raw_call(addr, get, Vec::new(), true).await;
    assert_eq!(r.http, StatusCode::METHOD_NOT_ALLOWED, "{r:?}");

    // Not gRPC.
    for ct in [Some("text/plain"), Some("application/json"), None] {
        let mut b = http::Request::builder().method("POST").uri(format!("http://{addr}{UNARY}"));
        if let Some(ct) = ct {
            b = b.header("content-type", ct);
        }
        let r = raw_call(addr, b.body(()).expect("request"), msg.clone(), true).await;
        assert_eq!(r.http, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct:?}: {r:?}");
    }

    // Unknown method of a known service, unknown service.
    for path in ["/hostile.Echo/Nope", "/nope.Nope/Unary", "/", "/hostile.Echo"] {
        let r = raw_call(addr, grpc_request(addr, path, &[]), msg.clone(), true).await;
        assert_grpc(&r, Code::Unimplemented, path);
    }

    // A header list over the server's limit (16 KiB): HTTP 431
    // without involving the application, and the connection's other
    // streams are unharmed.
    let big = "v".repeat(32 << 10);
    let (send, _task) = h2_connect(addr).await;
    let r = timeout(
        BOUND,
        exchange(&send, grpc_request(addr, UNARY, &[("x-big", &big)]), msg.clone(), true),
    )
    .await
    .expect("in time")
    .expect("exchange");
    assert_eq!(r.http, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "{r:?}");
    let r = timeout(BOUND, exchange(&send, grpc_request(addr, UNARY, &[]), msg.clone(), true))
        .await
        .expect("in time")
        .expect("exchange");
    assert_grpc(&r, Code::Ok, "same connection after the big header");

    assert_eq!(
        server.counters.started.load(Ordering::SeqCst),
        2,
        "only the two valid calls reached a handler"
    );
    assert_serving(addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_cancels_the_handler() {
    let server = start_server().await;
    let addr = server.addr;
    let k = server.counters.clone();
    let sleepy = framed(false, &req_bytes(b"zz", 0, 0, 10_000));

    // 1 ms: DEADLINE_EXCEEDED, whether or not the handler got to run.
    let start = Instant::now();
    let r =
        raw_call(addr, grpc_request(addr, UNARY, &[("grpc-timeout", "1m")]), sleepy.clone(), true)
            .await;
    assert_grpc(&r, Code::DeadlineExceeded, "1m");
    assert!(start.elapsed() < PROMPT, "{:?}", start.elapsed());

    // 200 ms: the handler is running (sleeping 10 s) when the deadline
    // passes; it is dropped and the client hears DEADLINE_EXCEEDED.
    let before = k.started.load(Ordering::SeqCst);
    let start = Instant::now();
    let r =
        raw_call(addr, grpc_request(addr, UNARY, &[("grpc-timeout", "200m")]), sleepy, true).await;
    assert_grpc(&r, Code::DeadlineExceeded, "200m");
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(190) && took < PROMPT, "{took:?}");
    assert_eq!(k.started.load(Ordering::SeqCst), before + 1, "the handler ran");
    eventually("the sleeping handler is dropped", || {
        k.dropped.load(Ordering::SeqCst) == k.started.load(Ordering::SeqCst)
    })
    .await;
    assert_serving(addr).await;
}

// ---------------------------------------------------------------------------
// 8. Servers that lie: the client must not trust them either.

#[derive(Clone, Copy, Debug)]
enum Fake {
    /// A frame header declaring 1 GiB, then nothing (stream left open).
    OversizedFrame,
    /// Trailers-only response with `grpc-status: garbage`.
    GarbageStatusOnly,
    /// A valid message, then trailers with `grpc-status: 1x`.
    GarbageStatusTrailers,
    /// A plain HTTP error.
    Http(u16),
    /// A valid message, then END_STREAM on DATA: no trailers.
    NoTrailers,
    /// Headers, then END_STREAM with no message and no trailers.
    NothingAfterHeaders,
    /// Half a message, then OK trailers.
    Truncated,
    /// Flag byte 2.
    BadFlag,
    /// `grpc-encoding: gzip`, flag 1, not gzip.
    GzipGarbage,
    /// `grpc-encoding: gzip`, a bomb expanding past the client's limit.
    GzipBomb,
    /// `grpc-encoding: br`.
    UnknownEncoding,
    /// An invalid protobuf message with OK trailers.
    InvalidProtobuf,
    /// 200 with `content-type: text/html`.
    NotGrpc,
    /// RST_STREAM with this reason instead of a response.
    Reset(u32),
    /// Never answers.
    Silent,
    /// Two messages on a unary call.
    TwoResponses,
    /// OK trailers and no message on a unary call.
    NoResponse,
}

fn grpc_response(extra: &[(&str, &str)]) -> http::Response<()> {
    let mut b = http::Response::builder().status(200).header("content-type", "application/grpc");
    for (k, v) in extra {
        b = b.header(*k, *v);
    }
    b.body(()).expect("valid response")
}

fn status_trailers(code: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("grpc-status", HeaderValue::from_str(code).expect("header value"));
    h
}

async fn fake_call(
    fake: Fake,
    req: http::Request<RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
) -> Result<(), h2::Error> {
    let path = req.uri().path().to_string();
    let mut body = req.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let ok_message = || Bytes::from(framed(false, &resp_bytes(b"fine")));
    if path == COLLECT {
        // The well-behaved method: the channel must still work after the
        // hostile call.
        let mut s = respond.send_response(grpc_response(&[]), false)?;
        s.send_data(ok_message(), false)?;
        return s.send_trailers(status_trailers("0"));
    }
    let mut data_then = |resp: http::Response<()>, data: Vec<u8>, code: Option<&str>| {
        send_then(&mut respond, resp, data, code)
    };
    match fake {
        Fake::OversizedFrame => {
            let mut s = respond.send_response(grpc_response(&[]), false)?;
            s.send_data(Bytes::from(frame_header(0, 1 << 30)), false)?;
            // Hold the stream open (the client must not wait for the body).
            tokio::time::sleep(BOUND * 2).await;
            drop(s);
            Ok(())
        }
        Fake::GarbageStatusOnly => {
            respond.send_response(grpc_response(&[("grpc-status", "garbage")]), true)?;
            Ok(())
        }
        Fake::GarbageStatusTrailers => {
            data_then(grpc_response(&[]), framed(false, &resp_bytes(b"x")), Some("1x"))
        }
        Fake::Http(code) => {
            let resp = http::Response::builder().status(code).body(()).expect("response");
            respond.send_response(resp, true)?;
            Ok(())
        }
        Fake::NoTrailers => data_then(grpc_response(&[]), framed(false, &resp_bytes(b"x")), None),
        Fake::NothingAfterHeaders => data_then(grpc_response(&[]), Vec::new(), None),
        Fake::Truncated => {
            let whole = framed(false, &resp_bytes(b"truncated"));
            data_then(grpc_response(&[]), whole[..whole.len() - 3].to_vec(), Some("0"))
        }
        Fake::BadFlag => {
            let mut f = framed(false, &resp_bytes(b"x"));
            f[0] = 2;
            data_then(grpc_response(&[]), f, Some("0"))
        }
        Fake::GzipGarbage => {
            data_then(grpc_response(&[("grpc-encoding", "gzip")]), framed(true, b"nope"), Some("0"))
        }
        Fake::GzipBomb => {
            let bomb = protoplane_grpc::codec::gzip(&vec![0u8; 10 << 20]);
            data_then(grpc_response(&[("grpc-encoding", "gzip")]), framed(true, &bomb), Some("0"))
        }
        Fake::UnknownEncoding => {
            data_then(grpc_response(&[("grpc-encoding", "br")]), framed(true, b"x"), Some("0"))
        }
        Fake::InvalidProtobuf => data_then(
            grpc_response(&[]),
            framed(false, &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]),
            Some("0"),
        ),
        Fake::NotGrpc => {
            let resp = http::Response::builder()
                .status(200)
                .header("content-type", "text/html")
                .body(())
                .expect("response");
            data_then(resp, b"<html>".to_vec(), None)
        }
        Fake::Reset(reason) => {
            respond.send_reset(h2::Reason::from(reason));
            Ok(())
        }
        Fake::Silent => {
            tokio::time::sleep(BOUND * 2).await;
            drop(respond);
            Ok(())
        }
        Fake::TwoResponses => {
            let mut two = framed(false, &resp_bytes(b"one"));
            two.extend(framed(false, &resp_bytes(b"two")));
            data_then(grpc_response(&[]), two, Some("0"))
        }
        Fake::NoResponse => {
            respond.send_response(grpc_response(&[("grpc-status", "0")]), true)?;
            Ok(())
        }
    }
}

/// Responds with `resp`, one DATA frame, then trailers with `code` (or
/// END_STREAM on the DATA frame when `None`).
fn send_then(
    respond: &mut h2::server::SendResponse<Bytes>,
    resp: http::Response<()>,
    data: Vec<u8>,
    code: Option<&str>,
) -> Result<(), h2::Error> {
    let mut s = respond.send_response(resp, false)?;
    match code {
        Some(c) => {
            s.send_data(Bytes::from(data), false)?;
            s.send_trailers(status_trailers(c))
        }
        None => s.send_data(Bytes::from(data), true),
    }
}

/// A raw h2 server behaving as `fake` on every path but Collect.
async fn start_fake(fake: Fake) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let task = tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(sock).await else { return };
                while let Some(Ok((req, respond))) = conn.accept().await {
                    tokio::spawn(fake_call(fake, req, respond));
                }
            });
        }
    });
    (addr, task)
}

/// The client's Channel is still usable after the hostile call.
async fn assert_channel_usable(client: &Client, what: &str) {
    let r = timeout(BOUND, async {
        let mut call = client.start(ids().collect, CallOptions::default()).await?;
        call.send(&req_block(b"hello")).await?;
        call.call.close_send();
        let m = call.message().await?;
        let st = call.call.finish_status().await;
        Ok::<_, Status>((m.map(|m| body_of(&m)), st.code))
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: the follow-up call timed out"));
    assert_eq!(r, Ok((Some(b"fine".to_vec()), Code::Ok)), "{what}: follow-up call");
}

async fn check_client(fake: Fake, want: Code, deadline: Option<Duration>) {
    let (addr, task) = start_fake(fake).await;
    let opts = ChannelOptions { max_recv_message: MAX_RECV, ..ChannelOptions::default() };
    let ch = timeout(BOUND, Channel::connect_with(&addr.to_string(), opts))
        .await
        .expect("connect in time")
        .expect("connect");
    let client = Client::new(ch, schema().clone());
    let block = req_block(b"question");
    let req = Request {
        metadata: Metadata::new(),
        deadline: deadline.map(|d| Instant::now() + d),
        peer: None,
        message: &block,
    };
    let start = Instant::now();
    let r = timeout(BOUND, client.unary(ids().unary, req))
        .await
        .unwrap_or_else(|_| panic!("{fake:?}: the client hung"));
    let took = start.elapsed();
    match r {
        Ok((m, _)) => panic!("{fake:?}: succeeded with {:?}, want {want}", body_of(&m)),
        Err(st) => assert_eq!(st.code, want, "{fake:?}: {st}"),
    }
    assert!(took < PROMPT, "{fake:?}: failed after {took:?}");
    assert_channel_usable(&client, &format!("{fake:?}")).await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_distrusts_the_server() {
    let cases = [
        (Fake::OversizedFrame, Code::ResourceExhausted),
        (Fake::GarbageStatusOnly, Code::Unknown),
        (Fake::GarbageStatusTrailers, Code::Unknown),
        (Fake::Http(503), Code::Unavailable),
        (Fake::Http(429), Code::Unavailable),
        (Fake::Http(404), Code::Unimplemented),
        (Fake::Http(401), Code::Unauthenticated),
        (Fake::Http(403), Code::PermissionDenied),
        (Fake::Http(400), Code::Internal),
        (Fake::Http(500), Code::Unknown),
        // client.rs: "stream ended without trailers" is INTERNAL.
        (Fake::NoTrailers, Code::Internal),
        (Fake::NothingAfterHeaders, Code::Internal),
        (Fake::Truncated, Code::Internal),
        (Fake::BadFlag, Code::Internal),
        (Fake::GzipGarbage, Code::Internal),
        (Fake::GzipBomb, Code::ResourceExhausted),
        (Fake::UnknownEncoding, Code::Internal),
        (Fake::InvalidProtobuf, Code::Internal),
        (Fake::NotGrpc, Code::Unknown),
        // RST_STREAM reasons as gRPC maps them.
        (Fake::Reset(0x2), Code::Internal),
        (Fake::Reset(0x7), Code::Unavailable),
        (Fake::Reset(0x8), Code::Cancelled),
        (Fake::Reset(0xb), Code::ResourceExhausted),
        (Fake::NoResponse, Code::Unimplemented),
    ];
    for (fake, want) in cases {
        check_client(fake, want, None).await;
    }
    // A server that never answers: the client's own deadline ends the call.
    check_client(Fake::Silent, Code::DeadlineExceeded, Some(Duration::from_millis(300))).await;
}

/// gRPC clients fail a unary call that receives a second message: a
/// cardinality violation, UNIMPLEMENTED in gRPC's status code table (and in
/// ConnectRPC's conformance suite).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_refuses_two_responses_to_a_unary_call() {
    check_client(Fake::TwoResponses, Code::Unimplemented, None).await;
}
