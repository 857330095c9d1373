//! Floods against the gRPC server's own HTTP/2 transport: frames that cost
//! the server work or memory while the peer makes no progress (SETTINGS,
//! PING, empty DATA, PRIORITY, unknown types, acknowledgements and credit
//! nobody asked for), a peer that sends PINGs but never reads the answers,
//! flow-control windows pushed past their limits, and HPACK bombs.
//! CONTINUATION floods and rapid reset are in `hostile.rs`.
//!
//! Each test runs a server of its own on 127.0.0.1:0, talks raw HTTP/2 to
//! it, checks precisely what the server does, and ends by checking that the
//! server still serves a fresh, well-behaved client. Every wait is bounded.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_http2::conn::{Config, Role};
use protoplane_http2::frame::{
    self, flag, kind, Head, Reason, DEFAULT_WINDOW, HEADER_LEN, MAX_WINDOW, PREFACE,
};
use protoplane_http2::hpack::Decoder;
use protoplane_rpc::{Channel, Client, Router, ServerKeepalive, ServerOptions};
use protoplane_schema::ProtoSource;
use protoplane_wire::{Block, Builder, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::timeout;

const PROTO: &str = r#"
syntax = "proto3";
package floods;

message Req { bytes body = 1; }
message Resp { bytes body = 1; }

service Flood {
  rpc Unary(Req) returns (Resp);
  // Takes no request and never answers: a call that holds its stream
  // (and the flow-control credit of what is sent on it) until cancelled.
  rpc Hold(stream Req) returns (Resp);
}
"#;

const SERVICE: &str = "floods.Flood";
const UNARY: &str = "/floods.Flood/Unary";
const HOLD: &str = "/floods.Flood/Hold";

/// The bound on any single wait.
const BOUND: Duration = Duration::from_secs(5);
/// The bound on a whole test.
const TEST_BOUND: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// The service.

struct Ids {
    unary: u32,
    req: u32,
    resp: u32,
}

fn schema() -> &'static Arc<Schema> {
    static SCHEMA: OnceLock<Arc<Schema>> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let src = [ProtoSource { name: "floods.proto", text: PROTO }];
        Arc::new(Schema::from_proto_sources(&src, &["floods.proto"]).expect("the proto compiles"))
    })
}

fn ids() -> &'static Ids {
    static IDS: OnceLock<Ids> = OnceLock::new();
    IDS.get_or_init(|| {
        let s = schema();
        let t = |name: &str| s.tables().message_by_name(name).expect("message declared");
        Ids {
            unary: s.find(SERVICE, "Unary").expect("method declared"),
            req: t("floods.Req"),
            resp: t("floods.Resp"),
        }
    })
}

/// Handler futures created and dropped (completed or cancelled).
#[derive(Default)]
struct Counters {
    started: AtomicUsize,
    dropped: AtomicUsize,
}

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

struct Flood {
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

impl Service for Flood {
    fn schema(&self) -> &Arc<Schema> {
        schema()
    }

    fn name(&self) -> &str {
        SERVICE
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        mut request: Request<Streaming>,
        mut responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            let _guard = Guard::new(self.counters.clone());
            if method != ids().unary {
                std::future::pending::<()>().await;
            }
            let m = request.message.single().await?;
            let v = m.view(schema().tables())?;
            let body = v.by_number(1).map_err(internal)?.and_then(|x| x.as_bytes());
            responder.send(resp_block(body.unwrap_or_default())?).await?;
            Ok(Metadata::new())
        })
    }
}

struct Server {
    addr: SocketAddr,
    counters: Arc<Counters>,
    _task: JoinHandle<std::io::Result<()>>,
}

/// Socket buffers of a listener whose connections must not absorb much.
const SMALL_BUFFER: u32 = 64 << 10;

/// A server of its own per test (so its counters are the test's own);
/// `small_buffers`: its connections' kernel buffers are fixed small, so
/// what the server holds shows in what the client can send. Clients may
/// ping as often as they like here (no keepalive enforcement): what these
/// tests look at is the HTTP/2 layer's own budget, which holds whatever
/// the gRPC policy above it is.
async fn start_server(small_buffers: bool) -> Server {
    start_server_with(small_buffers, permissive()).await
}

fn permissive() -> ServerKeepalive {
    ServerKeepalive {
        min_time: Duration::ZERO,
        permit_without_stream: true,
        ..ServerKeepalive::default()
    }
}

async fn start_server_with(small_buffers: bool, keepalive: ServerKeepalive) -> Server {
    let counters = Arc::new(Counters::default());
    let router = Router::new(ServerOptions { keepalive, ..ServerOptions::default() })
        .add_service(Arc::new(Flood { counters: counters.clone() }) as Arc<_>);
    let listener = if small_buffers {
        let s = TcpSocket::new_v4().expect("socket");
        // Accepted sockets inherit these (and lose buffer autotuning).
        s.set_recv_buffer_size(SMALL_BUFFER).expect("SO_RCVBUF");
        s.set_send_buffer_size(SMALL_BUFFER).expect("SO_SNDBUF");
        s.bind("127.0.0.1:0".parse().expect("address")).expect("bind a local port");
        s.listen(64).expect("listen")
    } else {
        TcpListener::bind("127.0.0.1:0").await.expect("bind a local port")
    };
    let addr = listener.local_addr().expect("bound address");
    let task = tokio::spawn(Arc::new(router).serve(listener));
    Server { addr, counters, _task: task }
}

/// The frames without progress a server connection allows in a row.
fn idle_budget() -> u32 {
    Config::new(Role::Server).idle_frame_budget
}

/// Runs a test body under [`TEST_BOUND`].
async fn bounded(what: &str, body: impl Future<Output = ()>) {
    protoplane_test_support::net::bounded(TEST_BOUND, what, body).await
}

// ---------------------------------------------------------------------------
// Well-behaved client.

fn req_block(body: &[u8]) -> Block {
    let mut b = Builder::new(schema().tables(), ids().req).expect("Req builder");
    let root = b.root();
    b.set(root, 1, Value::Bytes(body)).expect("Req.body");
    b.finish()
}

/// A fresh connection and a unary call that must succeed: the server still
/// serves everyone else.
async fn assert_serving(addr: SocketAddr) {
    let got = timeout(BOUND, async {
        let ch = Channel::connect(&addr.to_string()).await?;
        let client = Client::new(ch, schema().clone());
        let block = req_block(b"still alive");
        let (m, _) = client.unary(ids().unary, Request::new(&block)).await?;
        let v = m.view(schema().tables())?;
        let body = v.by_number(1).map_err(internal)?.and_then(|x| x.as_bytes());
        Ok::<_, Status>(body.unwrap_or_default().to_vec())
    })
    .await
    .expect("the well-behaved call finished in time")
    .expect("the well-behaved call succeeded");
    assert_eq!(got, b"still alive");
}

/// Waits until `f` holds (polling), failing after `BOUND`.
async fn eventually(what: &str, f: impl Fn() -> bool) {
    protoplane_test_support::net::eventually(BOUND, what, f).await
}

// ---------------------------------------------------------------------------
// Raw HTTP/2 by hand.

fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    frame::write_head(&mut out, payload.len(), ty, flags, stream);
    out.extend_from_slice(payload);
    out
}

/// HPACK integer with an `n`-bit prefix, the prefix byte's other bits
/// `flags`.
fn hpack_int(v: usize, n: u32, flags: u8, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | max as u8);
    let mut v = v - max;
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A literal field without indexing, new name, no Huffman: valid HPACK
/// that needs no encoder state.
fn literal(name: &str, value: &str, out: &mut Vec<u8>) {
    out.push(0x00);
    hpack_int(name.len(), 7, 0, out);
    out.extend_from_slice(name.as_bytes());
    hpack_int(value.len(), 7, 0, out);
    out.extend_from_slice(value.as_bytes());
}

/// A literal field with incremental indexing (it enters the server's
/// dynamic table at index 62), new name, no Huffman.
fn indexed_literal(name: &str, value: &str, out: &mut Vec<u8>) {
    out.push(0x40);
    hpack_int(name.len(), 7, 0, out);
    out.extend_from_slice(name.as_bytes());
    hpack_int(value.len(), 7, 0, out);
    out.extend_from_slice(value.as_bytes());
}

/// A gRPC request's header block, as literals without indexing.
fn request_block(method: &str, path: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in [
        (":method", method),
        (":scheme", "http"),
        (":authority", "localhost"),
        (":path", path),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        literal(k, v, &mut out);
    }
    out
}

/// One gRPC length-prefixed message holding a `Req` whose body is `body`.
fn grpc_message(body: &[u8]) -> Vec<u8> {
    let req = protoplane_test_support::wire::Msg::new().bytes(1, body).finish();
    let mut out = Vec::new();
    protoplane_grpc::encode_frame(false, &req, &mut out).expect("message under 4 GiB");
    out
}

/// A whole unary call on `stream`: HEADERS, then DATA ending the stream.
fn unary_call(stream: u32, body: &[u8]) -> Vec<u8> {
    let mut out = frame(kind::HEADERS, flag::END_HEADERS, stream, &request_block("POST", UNARY));
    out.extend(frame(kind::DATA, flag::END_STREAM, stream, &grpc_message(body)));
    out
}

/// HEADERS opening a `Hold` call on `stream` (request stream left open).
fn open_hold(stream: u32) -> Vec<u8> {
    frame(kind::HEADERS, flag::END_HEADERS, stream, &request_block("POST", HOLD))
}

fn ping(payload: [u8; 8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame::write_ping(&mut out, payload, false);
    out
}

fn window_update(stream: u32, increment: u32) -> Vec<u8> {
    let mut out = Vec::new();
    frame::write_window_update(&mut out, stream, increment);
    out
}

#[derive(Debug)]
struct RawFrame {
    head: Head,
    payload: Vec<u8>,
    /// A header block's fields (HEADERS, and CONTINUATION ending one).
    fields: Vec<(String, String)>,
}

impl RawFrame {
    /// The error code of RST_STREAM or GOAWAY.
    fn code(&self) -> Option<Reason> {
        let at = match self.head.kind {
            kind::RST_STREAM => 0,
            kind::GOAWAY => 4,
            _ => return None,
        };
        let b = self.payload.get(at..at + 4)?;
        Some(Reason(u32::from_be_bytes([b[0], b[1], b[2], b[3]])))
    }

    fn is(&self, ty: u8, stream: u32) -> bool {
        self.head.kind == ty && self.head.stream == stream
    }

    fn is_ping_ack(&self, payload: &[u8]) -> bool {
        self.head.kind == kind::PING && self.head.has(flag::ACK) && self.payload == payload
    }

    fn field(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// How a raw connection ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// GOAWAY with this error code, then EOF.
    GoAway(Reason),
    /// EOF (or a reset) without a GOAWAY.
    Closed,
}

/// A raw HTTP/2 client connection. Its write half can be handed to a task
/// that floods while this side reads.
struct RawConn {
    rd: OwnedReadHalf,
    wr: Option<OwnedWriteHalf>,
    buf: Vec<u8>,
    /// The server's header blocks are decoded as they arrive (HPACK state
    /// is per connection).
    decoder: Decoder,
    block: Vec<u8>,
}

impl RawConn {
    fn from_stream(sock: TcpStream) -> RawConn {
        let _ = sock.set_nodelay(true);
        let (rd, wr) = sock.into_split();
        RawConn {
            rd,
            wr: Some(wr),
            buf: Vec::new(),
            decoder: Decoder::new(4096),
            block: Vec::new(),
        }
    }

    async fn open(addr: SocketAddr, small_buffers: bool) -> RawConn {
        let s = TcpSocket::new_v4().expect("socket");
        if small_buffers {
            s.set_recv_buffer_size(SMALL_BUFFER).expect("SO_RCVBUF");
            s.set_send_buffer_size(SMALL_BUFFER).expect("SO_SNDBUF");
        }
        RawConn::from_stream(s.connect(addr).await.expect("connect"))
    }

    /// Connects, sends the preface and an empty SETTINGS, acknowledges the
    /// server's SETTINGS, and reads up to the server's acknowledgement of
    /// ours (its connection WINDOW_UPDATE comes before that); the frames
    /// read meanwhile are returned.
    async fn h2(addr: SocketAddr, small_buffers: bool) -> (RawConn, Vec<RawFrame>) {
        let mut c = RawConn::open(addr, small_buffers).await;
        let mut hello = PREFACE.to_vec();
        frame::write_settings(&mut hello, &[]);
        c.write(&hello).await;
        let settings = |ack: bool| {
            move |f: &RawFrame| f.head.kind == kind::SETTINGS && f.head.has(flag::ACK) == ack
        };
        let mut seen = c.until("the server's SETTINGS", |fs| fs.iter().any(settings(false))).await;
        let mut ack = Vec::new();
        frame::write_settings_ack(&mut ack);
        c.write(&ack).await;
        if !seen.iter().any(settings(true)) {
            seen.extend(c.until("SETTINGS ACK", |fs| fs.iter().any(settings(true))).await);
        }
        (c, seen)
    }

    async fn write(&mut self, bytes: &[u8]) {
        let wr = self.wr.as_mut().expect("the write half is here");
        wr.write_all(bytes).await.expect("write to the server");
    }

    /// Hands the write half to a task that writes `bytes`; a write error
    /// (the server closed first) is its result, not a failure.
    fn spawn_write(&mut self, bytes: Vec<u8>) -> JoinHandle<std::io::Result<()>> {
        let mut wr = self.wr.take().expect("the write half is here");
        tokio::spawn(async move { wr.write_all(&bytes).await })
    }

    /// The next frame; `None` at EOF or on a read error.
    async fn next(&mut self) -> Option<RawFrame> {
        loop {
            if let Some(head) = Head::parse(&self.buf) {
                let end = HEADER_LEN + head.len as usize;
                if self.buf.len() >= end {
                    let payload = self.buf[HEADER_LEN..end].to_vec();
                    self.buf.drain(..end);
                    let mut f = RawFrame { head, payload, fields: Vec::new() };
                    self.on_block(&mut f);
                    return Some(f);
                }
            }
            let mut chunk = [0u8; 16 << 10];
            match self.rd.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    fn on_block(&mut self, f: &mut RawFrame) {
        match f.head.kind {
            kind::HEADERS => {
                let extras = f.head.has(flag::PADDED) || f.head.has(flag::PRIORITY);
                assert!(!extras, "the server padded or prioritised HEADERS: {f:?}");
                self.block.clear();
            }
            kind::CONTINUATION => {}
            _ => return,
        }
        self.block.extend_from_slice(&f.payload);
        if !f.head.has(flag::END_HEADERS) {
            return;
        }
        let fields = &mut f.fields;
        let r = self.decoder.decode(&self.block, usize::MAX, |n, v| {
            let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            fields.push((s(n), s(v)));
        });
        r.unwrap_or_else(|e| panic!("the server's header block does not decode: {e}"));
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
            Ok(false) => panic!("{what}: connection closed; last frames: {:?}", last(&seen)),
            Err(_) => panic!("{what}: timed out; last frames: {:?}", last(&seen)),
        }
    }

    /// Reads until the server closes the connection (failing if it does
    /// not within `BOUND`): how it ended, and every frame read.
    async fn ended(&mut self, what: &str) -> (Ended, Vec<RawFrame>) {
        let mut seen = Vec::new();
        let r = timeout(BOUND, async {
            while let Some(f) = self.next().await {
                seen.push(f);
            }
        })
        .await;
        if r.is_err() {
            panic!("{what}: the server kept the connection open; last frames: {:?}", last(&seen));
        }
        let goaway = seen.iter().find(|f| f.head.kind == kind::GOAWAY).and_then(RawFrame::code);
        (goaway.map_or(Ended::Closed, Ended::GoAway), seen)
    }
}

fn last(frames: &[RawFrame]) -> &[RawFrame] {
    &frames[frames.len().saturating_sub(5)..]
}

fn count(frames: &[RawFrame], pred: impl Fn(&RawFrame) -> bool) -> usize {
    frames.iter().filter(|f| pred(f)).count()
}

// ---------------------------------------------------------------------------
// SETTINGS and PING floods.

/// Every SETTINGS frame costs the server an acknowledgement and makes no
/// progress: after its idle-frame budget (our first SETTINGS included),
/// GOAWAY(ENHANCE_YOUR_CALM), having acknowledged exactly the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_flood_is_cut_off() {
    bounded("SETTINGS flood", async {
        let server = start_server(false).await;
        let budget = idle_budget() as usize;
        let (mut c, before) = RawConn::h2(server.addr, false).await;
        // Exactly enough to exhaust the budget: our first SETTINGS spent
        // one unit, this is the rest and one more. (Nothing is left unread
        // when the server closes, so no reset can swallow its GOAWAY.)
        let mut flood = Vec::new();
        for i in 0..budget {
            // A setting to apply, not only a frame to acknowledge.
            let window = u32::from(i % 2 == 0) + DEFAULT_WINDOW;
            frame::write_settings(&mut flood, &[(frame::setting::INITIAL_WINDOW_SIZE, window)]);
        }
        let writer = c.spawn_write(flood);
        let (ended, after) = c.ended("SETTINGS flood").await;
        assert_eq!(ended, Ended::GoAway(Reason::ENHANCE_YOUR_CALM));
        let acks = count(&before, |f| f.head.kind == kind::SETTINGS && f.head.has(flag::ACK))
            + count(&after, |f| f.head.kind == kind::SETTINGS && f.head.has(flag::ACK));
        assert_eq!(acks, budget, "SETTINGS acknowledged");
        let _ = writer.await;
        assert_serving(server.addr).await;
    })
    .await;
}

fn seq_ping(i: u64) -> Vec<u8> {
    ping(i.to_be_bytes())
}

/// Checks that `frames` hold PING ACKs 0, 1, 2... in order: how many.
fn acks_in_order(frames: &[RawFrame]) -> u64 {
    let mut next = 0u64;
    for f in frames.iter().filter(|f| f.head.kind == kind::PING) {
        assert!(f.head.has(flag::ACK), "the server sent a PING of its own: {f:?}");
        if f.payload == *b"the-end!" {
            continue;
        }
        let got = u64::from_be_bytes(f.payload[..8].try_into().expect("8 bytes"));
        assert_eq!(got, next, "PING ACKs out of order or missing");
        next += 1;
    }
    next
}

/// A PING flood from a client that reads the answers: each PING is
/// answered, in order, until the idle-frame budget is spent; then
/// GOAWAY(ENHANCE_YOUR_CALM).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_flood_is_cut_off_after_the_budget() {
    bounded("PING flood", async {
        let server = start_server(false).await;
        let budget = u64::from(idle_budget());
        let (mut c, _) = RawConn::h2(server.addr, false).await;
        // Our SETTINGS spent one unit of the budget; PING number `budget`
        // (counting from 1) exceeds it.
        let flood: Vec<u8> = (0..budget).flat_map(seq_ping).collect();
        let writer = c.spawn_write(flood);
        let (ended, frames) = c.ended("PING flood").await;
        assert_eq!(ended, Ended::GoAway(Reason::ENHANCE_YOUR_CALM));
        assert_eq!(acks_in_order(&frames), budget - 1, "PINGs answered");
        let _ = writer.await;
        assert_serving(server.addr).await;
    })
    .await;
}

/// The same flood against the default keepalive policy (gRFC A8, grpc-go's
/// rules): with no call open a client should not ping at all, so the
/// second PING is a strike, and the fourth (the third strike) ends the
/// connection with GOAWAY(ENHANCE_YOUR_CALM), long before the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_flood_is_cut_off_by_the_keepalive_policy_first() {
    bounded("PING flood, default policy", async {
        let server = start_server_with(false, ServerKeepalive::default()).await;
        let (mut c, _) = RawConn::h2(server.addr, false).await;
        let flood: Vec<u8> = (0..100).flat_map(seq_ping).collect();
        let writer = c.spawn_write(flood);
        let (ended, frames) = c.ended("PING flood").await;
        assert_eq!(ended, Ended::GoAway(Reason::ENHANCE_YOUR_CALM));
        assert_eq!(acks_in_order(&frames), 4, "PINGs answered");
        let _ = writer.await;
        assert_serving(server.addr).await;
    })
    .await;
}

/// A PING flood from a client that never reads: the server answers at
/// most its idle-frame budget, holding those answers (170 KB at the
/// default budget) and no more, and closes the connection without waiting
/// for the client to read. Read afterwards, the answers are a prefix of
/// the PINGs, in order, ending in GOAWAY(ENHANCE_YOUR_CALM) if all of
/// them fit in the socket buffers before the server gave up flushing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_ping_flood_is_bounded() {
    bounded("unread PING flood", async {
        let server = start_server(false).await;
        let budget = u64::from(idle_budget());
        let (mut c, _) = RawConn::h2(server.addr, false).await;
        let flood: Vec<u8> = (0..budget).flat_map(seq_ping).collect();
        let writer = c.spawn_write(flood);
        timeout(BOUND, writer)
            .await
            .expect("the server took the whole flood")
            .expect("writer task")
            .expect("write the flood");
        // Long enough for the server to hit the budget and give up on a
        // client that does not read (it flushes for at most a second).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let (ended, frames) = c.ended("unread PING flood").await;
        let answered = acks_in_order(&frames);
        assert!(answered < budget, "{answered} PINGs answered with a budget of {budget}");
        assert!(
            matches!(ended, Ended::GoAway(Reason::ENHANCE_YOUR_CALM) | Ended::Closed),
            "{ended:?}"
        );
        if ended != Ended::Closed {
            assert_eq!(answered, budget - 1, "PINGs answered before the GOAWAY");
        }
        assert_serving(server.addr).await;
    })
    .await;
}

/// PINGs that the budget lets through, because a byte of DATA now and
/// then is progress, from a client that never reads the answers: the
/// server stops reading once its unsent output reaches its limit (1 MiB),
/// so the client's writes stall after a few MiB (kernel buffers are fixed
/// at 64 KiB per socket here); once the client reads again, every PING is
/// answered, in order, and the connection carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_ping_flood_with_progress_stops_the_server_reading() {
    /// Written before the stall, at most: the server's output limit, its
    /// read buffer and the kernel buffers of both sides, with room to
    /// spare. A server that buffered answers without bound would take
    /// everything the client sends.
    const STALL_CEILING: usize = 4 << 20;
    const PINGS_PER_ROUND: u64 = 1000;

    bounded("unread PING flood with progress", async {
        let server = start_server(true).await;
        let k = server.counters.clone();
        let (mut c, _) = RawConn::h2(server.addr, true).await;
        // A Hold call with one large request message that never completes:
        // each byte of it is progress and the server releases its credit.
        let mut start = open_hold(1);
        start.extend(frame(kind::DATA, 0, 1, &[0, 0, 0x0f, 0x42, 0x40]));
        c.write(&start).await;
        eventually("the Hold handler started", || k.started.load(Ordering::SeqCst) == 1).await;

        let written = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut wr = c.wr.take().expect("write half");
        let (w, s) = (written.clone(), stop.clone());
        let writer = tokio::spawn(async move {
            let mut sent = 0u64;
            while !s.load(Ordering::SeqCst) {
                let mut round: Vec<u8> =
                    (sent..sent + PINGS_PER_ROUND).flat_map(seq_ping).collect();
                round.extend(frame(kind::DATA, 0, 1, &[0x0a]));
                wr.write_all(&round).await?;
                sent += PINGS_PER_ROUND;
                w.fetch_add(round.len(), Ordering::SeqCst);
            }
            let mut end = Vec::new();
            frame::write_rst(&mut end, 1, Reason::CANCEL);
            end.extend(ping(*b"the-end!"));
            wr.write_all(&end).await?;
            Ok::<_, std::io::Error>(sent)
        });

        // Wait for the writes to stall: nothing more taken for a second.
        let began = Instant::now();
        let (mut taken, mut since) = (0, Instant::now());
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = written.load(Ordering::SeqCst);
            assert!(now <= STALL_CEILING, "the server read {now} bytes of PINGs nobody reads");
            assert!(began.elapsed() < BOUND * 2, "no stall after {now} bytes");
            if now != taken {
                (taken, since) = (now, Instant::now());
            } else if since.elapsed() > Duration::from_secs(1) {
                break;
            }
        }
        assert!(taken > 1 << 20, "stalled after only {taken} bytes");

        stop.store(true, Ordering::SeqCst);
        let frames = c
            .until("every PING answered", |fs| {
                fs.last().is_some_and(|f| f.is_ping_ack(b"the-end!"))
            })
            .await;
        let sent = timeout(BOUND, writer)
            .await
            .expect("the writer finished")
            .expect("writer task")
            .expect("the writes went through");
        assert!(!frames.iter().any(|f| f.head.kind == kind::GOAWAY), "{:?}", last(&frames));
        assert_eq!(acks_in_order(&frames), sent, "PINGs answered");
        eventually("the Hold handler dropped", || k.dropped.load(Ordering::SeqCst) == 1).await;
        assert_serving(server.addr).await;
    })
    .await;
}

// ---------------------------------------------------------------------------
// Frames without progress.

/// Empty DATA without END_STREAM, PRIORITY (on idle streams and on an open
/// one) and frames of an unknown type: each costs the server only a frame
/// header, but makes no progress. After the idle-frame budget the
/// connection ends with GOAWAY(ENHANCE_YOUR_CALM); nothing else was sent
/// for them (no amplification), and the held call is dropped with the
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_frame_floods_are_cut_off() {
    type Make = fn(u32) -> Vec<u8>;
    let cases: [(&str, Make); 4] = [
        ("empty DATA without END_STREAM", |_| frame(kind::DATA, 0, 1, &[])),
        ("PRIORITY on idle streams", |i| frame(kind::PRIORITY, 0, 2 * i + 3, &[0, 0, 0, 0, 16])),
        ("PRIORITY on the open stream", |_| frame(kind::PRIORITY, 0, 1, &[0, 0, 0, 0, 16])),
        ("an unknown frame type", |_| frame(0xfa, 0, 0, &[])),
    ];
    bounded("empty frame floods", async {
        let server = start_server(false).await;
        let k = server.counters.clone();
        let budget = idle_budget();
        for (n, (what, one)) in cases.into_iter().enumerate() {
            let (mut c, _) = RawConn::h2(server.addr, false).await;
            // The request is progress: the budget is whole again after it.
            c.write(&open_hold(1)).await;
            eventually("the Hold handler started", || k.started.load(Ordering::SeqCst) == n + 1)
                .await;
            let flood: Vec<u8> = (0..=budget).flat_map(one).collect();
            let writer = c.spawn_write(flood);
            let (ended, frames) = c.ended(what).await;
            assert_eq!(ended, Ended::GoAway(Reason::ENHANCE_YOUR_CALM), "{what}");
            let other: Vec<_> = frames.iter().filter(|f| f.head.kind != kind::GOAWAY).collect();
            assert!(other.is_empty(), "{what}: the server answered with {other:?}");
            let _ = writer.await;
            eventually("the Hold handler dropped", || k.dropped.load(Ordering::SeqCst) == n + 1)
                .await;
        }
        assert_serving(server.addr).await;
    })
    .await;
}

/// Frames that make no progress either, and that the idle-frame budget
/// should count as it counts SETTINGS, PING and empty DATA: SETTINGS and
/// PING acknowledgements nobody asked for, WINDOW_UPDATE on the connection
/// while nothing waits for credit and on a stream that is closed, and
/// RST_STREAM on a closed stream. Twice the budget of any of them should
/// end the connection with GOAWAY(ENHANCE_YOUR_CALM) as the others do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsolicited_acks_and_credit_draw_on_the_idle_budget() {
    type Make = fn(u32) -> Vec<u8>;
    let cases: [(&str, Make); 5] = [
        ("SETTINGS ACK", |_| frame(kind::SETTINGS, flag::ACK, 0, &[])),
        ("PING ACK", |i| frame(kind::PING, flag::ACK, 0, &u64::from(i).to_be_bytes())),
        ("WINDOW_UPDATE of 1 on the connection", |_| window_update(0, 1)),
        ("WINDOW_UPDATE of 1 on a closed stream", |_| window_update(1, 1)),
        ("RST_STREAM on a closed stream", |_| {
            let mut out = Vec::new();
            frame::write_rst(&mut out, 1, Reason::CANCEL);
            out
        }),
    ];
    bounded("unsolicited frames", async {
        let server = start_server(false).await;
        let budget = idle_budget();
        let mut kept_open = Vec::new();
        for (what, one) in cases {
            let (mut c, _) = RawConn::h2(server.addr, false).await;
            // A call that ends: stream 1 is closed, the budget whole.
            c.write(&unary_call(1, b"x")).await;
            c.until("the call's trailers", |fs| {
                fs.iter().any(|f| f.is(kind::HEADERS, 1) && f.head.has(flag::END_STREAM))
            })
            .await;
            // Twice the budget: the first few may be progress (credit that
            // returns what the call's DATA used).
            let mut flood: Vec<u8> = (0..2 * budget).flat_map(one).collect();
            flood.extend(ping(*b"probe..."));
            // The write fails if the server cuts the connection first.
            let writer = c.spawn_write(flood);
            let frames = c
                .until(what, |fs| {
                    fs.iter().any(|f| f.head.kind == kind::GOAWAY || f.is_ping_ack(b"probe..."))
                })
                .await;
            let goaway = frames.iter().find(|f| f.head.kind == kind::GOAWAY);
            match goaway {
                Some(g) => assert_eq!(g.code(), Some(Reason::ENHANCE_YOUR_CALM), "{what}"),
                None => kept_open.push(what),
            }
            let _ = writer.await;
        }
        assert_serving(server.addr).await;
        assert!(
            kept_open.is_empty(),
            "{} frames in a row (twice the idle budget) of each of these were taken without \
             a GOAWAY, the connection still answering PING: {kept_open:?}",
            2 * budget
        );
    })
    .await;
}

// ---------------------------------------------------------------------------
// Flow-control windows.

/// WINDOW_UPDATE on the connection: up to exactly 2^31 - 1 is fine, one
/// more is GOAWAY(FLOW_CONTROL_ERROR) (RFC 9113 §6.9.1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_window_overflow_is_a_connection_error() {
    bounded("connection window overflow", async {
        let server = start_server(false).await;
        let (mut c, _) = RawConn::h2(server.addr, false).await;
        let to_max = (MAX_WINDOW - i64::from(DEFAULT_WINDOW)) as u32;
        let mut bytes = window_update(0, to_max);
        bytes.extend(ping(*b"at max.."));
        c.write(&bytes).await;
        let frames = c
            .until("PING at the largest window", |fs| {
                fs.iter().any(|f| f.is_ping_ack(b"at max..") || f.head.kind == kind::GOAWAY)
            })
            .await;
        assert!(!frames.iter().any(|f| f.head.kind == kind::GOAWAY), "{:?}", last(&frames));
        c.write(&window_update(0, 1)).await;
        let (ended, _) = c.ended("connection window past 2^31 - 1").await;
        assert_eq!(ended, Ended::GoAway(Reason::FLOW_CONTROL_ERROR));
        assert_serving(server.addr).await;
    })
    .await;
}

/// WINDOW_UPDATE on a stream pushing its window past 2^31 - 1 is a stream
/// error, RST_STREAM(FLOW_CONTROL_ERROR) (RFC 9113 §6.9.1), and so is an
/// increment of 0 (PROTOCOL_ERROR, §6.9). The connection carries on, and
/// the calls on the reset streams end: their handlers are dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_window_overflow_resets_only_the_stream() {
    bounded("stream window overflow", async {
        let server = start_server(false).await;
        let k = server.counters.clone();
        let (mut c, _) = RawConn::h2(server.addr, false).await;
        let mut bytes = open_hold(1);
        bytes.extend(open_hold(3));
        c.write(&bytes).await;
        eventually("both Hold handlers started", || k.started.load(Ordering::SeqCst) == 2).await;

        c.write(&window_update(1, MAX_WINDOW as u32)).await;
        let frames =
            c.until("RST_STREAM 1", |fs| fs.iter().any(|f| f.is(kind::RST_STREAM, 1))).await;
        let rst = frames.iter().find(|f| f.is(kind::RST_STREAM, 1)).expect("found above");
        assert_eq!(rst.code(), Some(Reason::FLOW_CONTROL_ERROR));
        assert!(!frames.iter().any(|f| f.head.kind == kind::GOAWAY), "{:?}", last(&frames));

        c.write(&window_update(3, 0)).await;
        let frames =
            c.until("RST_STREAM 3", |fs| fs.iter().any(|f| f.is(kind::RST_STREAM, 3))).await;
        let rst = frames.iter().find(|f| f.is(kind::RST_STREAM, 3)).expect("found above");
        assert_eq!(rst.code(), Some(Reason::PROTOCOL_ERROR));
        assert!(!frames.iter().any(|f| f.head.kind == kind::GOAWAY), "{:?}", last(&frames));

        // The same connection serves a call.
        c.write(&unary_call(5, b"after")).await;
        let frames = c
            .until("the call after the resets", |fs| {
                fs.iter().any(|f| f.is(kind::HEADERS, 5) && f.head.has(flag::END_STREAM))
            })
            .await;
        let trailers = frames.iter().rfind(|f| f.is(kind::HEADERS, 5)).expect("found above");
        assert_eq!(trailers.field("grpc-status"), Some("0"), "{trailers:?}");

        let dropped = || k.dropped.load(Ordering::SeqCst);
        let waited = timeout(BOUND, async {
            while dropped() < 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "the handlers of streams reset for their WINDOW_UPDATE still run on a live \
             connection: {} of 3 handlers dropped",
            dropped()
        );
        assert_serving(server.addr).await;
    })
    .await;
}

/// One request message filling a whole DATA frame (16 KiB, the largest
/// frame the server takes).
fn full_frame_message() -> Vec<u8> {
    let m = grpc_message(&[7u8; 16_376]);
    assert_eq!(m.len(), 16 << 10);
    m
}

/// `n` DATA frames on `stream`, each a whole request message.
fn full_frames(stream: u32, n: usize) -> Vec<u8> {
    let m = full_frame_message();
    (0..n).flat_map(|_| frame(kind::DATA, 0, stream, &m)).collect()
}

/// Credit the server returned on `stream` (0: the connection).
fn credit(frames: &[RawFrame], stream: u32) -> u64 {
    frames
        .iter()
        .filter(|f| f.is(kind::WINDOW_UPDATE, stream))
        .map(|f| u64::from(u32::from_be_bytes(f.payload[..4].try_into().expect("4 bytes"))))
        .sum()
}

/// DATA beyond a stream's window, on a call whose handler takes no
/// request (so the server returns no credit beyond the few requests its
/// queue takes): the stream is reset with FLOW_CONTROL_ERROR, its handler
/// dropped, and the connection carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_beyond_the_stream_window_resets_the_stream() {
    bounded("stream window exceeded", async {
        let server = start_server(false).await;
        let k = server.counters.clone();
        let window = ServerOptions::default().stream_window as usize;
        let (mut c, before) = RawConn::h2(server.addr, false).await;
        c.write(&open_hold(1)).await;
        eventually("the Hold handler started", || k.started.load(Ordering::SeqCst) == 1).await;
        let frames_in_window = window / (16 << 10);
        let mut bytes = full_frames(1, frames_in_window);
        bytes.extend(frame(kind::DATA, 0, 1, &[0]));
        bytes.extend(ping(*b"after..."));
        let writer = c.spawn_write(bytes);
        let frames = c
            .until("RST_STREAM and the PING after it", |fs| {
                fs.iter().any(|f| f.is_ping_ack(b"after..."))
            })
            .await;
        assert_eq!(credit(&before, 1) + credit(&frames, 1), 0, "credit on the stream");
        let rst = frames.iter().find(|f| f.is(kind::RST_STREAM, 1));
        assert_eq!(rst.and_then(RawFrame::code), Some(Reason::FLOW_CONTROL_ERROR), "{rst:?}");
        assert!(!frames.iter().any(|f| f.head.kind == kind::GOAWAY), "{:?}", last(&frames));
        timeout(BOUND, writer).await.expect("in time").expect("task").expect("writes");
        eventually("the Hold handler dropped", || k.dropped.load(Ordering::SeqCst) == 1).await;
        assert_serving(server.addr).await;
    })
    .await;
}

/// DATA beyond the connection's window (4 MiB, over four held calls of
/// 1 MiB each; the server returns no connection credit for the little its
/// request queues take): GOAWAY(FLOW_CONTROL_ERROR).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_beyond_the_connection_window_is_a_connection_error() {
    bounded("connection window exceeded", async {
        let server = start_server(false).await;
        let k = server.counters.clone();
        let opts = ServerOptions::default();
        let (stream_window, connection_window) =
            (opts.stream_window as usize, opts.connection_window as usize);
        let streams = connection_window / stream_window;
        let (mut c, before) = RawConn::h2(server.addr, false).await;
        let ids: Vec<u32> = (0..=streams as u32).map(|i| 2 * i + 1).collect();
        let opens: Vec<u8> = ids.iter().flat_map(|&id| open_hold(id)).collect();
        c.write(&opens).await;
        eventually("the Hold handlers started", || k.started.load(Ordering::SeqCst) == streams + 1)
            .await;
        let per_stream = stream_window / (16 << 10);
        let mut bytes: Vec<u8> =
            ids[..streams].iter().flat_map(|&id| full_frames(id, per_stream)).collect();
        bytes.extend(frame(kind::DATA, 0, ids[streams], &[0]));
        let writer = c.spawn_write(bytes);
        let (ended, frames) = c.ended("connection window exceeded").await;
        // The server's first WINDOW_UPDATE makes the window what it is;
        // anything beyond that would be credit returned.
        let granted = u64::from(DEFAULT_WINDOW) + credit(&before, 0) + credit(&frames, 0);
        assert_eq!(granted, connection_window as u64, "connection credit");
        assert_eq!(ended, Ended::GoAway(Reason::FLOW_CONTROL_ERROR));
        let _ = writer.await;
        eventually("the Hold handlers dropped", || k.dropped.load(Ordering::SeqCst) == streams + 1)
            .await;
        assert_serving(server.addr).await;
    })
    .await;
}

// ---------------------------------------------------------------------------
// HPACK.

/// A header block of hundreds of references to one large dynamic table
/// entry decodes to far more than the header list limit (16 KiB) from a
/// few hundred bytes. The server answers 431 without decoding the list
/// into memory and without running a handler; the connection, and its
/// HPACK state, carry on: a later request refers to the same entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hpack_bomb_is_refused_with_431() {
    const REFS: usize = 500;
    /// Index 62, the newest dynamic table entry, as an indexed field.
    const NEWEST: u8 = 0x80 | 62;
    let big = "b".repeat(4000);
    let status = |frames: &[RawFrame], id: u32| {
        let h = frames.iter().find(|f| f.is(kind::HEADERS, id));
        h.and_then(|h| h.field(":status")).map(str::to_owned)
    };
    let ended = |id: u32| {
        move |fs: &[RawFrame]| {
            fs.iter().any(|f| f.head.stream == id && f.head.has(flag::END_STREAM))
                || fs.iter().any(|f| f.head.kind == kind::GOAWAY)
        }
    };

    bounded("HPACK bomb", async {
        let server = start_server(false).await;
        let k = server.counters.clone();
        let (mut c, _) = RawConn::h2(server.addr, false).await;

        // Stream 1: a GET (answered 405, no handler) that adds the entry.
        let mut b = request_block("GET", UNARY);
        indexed_literal("x-big", &big, &mut b);
        c.write(&frame(kind::HEADERS, flag::END_HEADERS | flag::END_STREAM, 1, &b)).await;
        let frames = c.until("the 405", ended(1)).await;
        assert_eq!(status(&frames, 1).as_deref(), Some("405"));

        // Stream 3: the bomb.
        let mut b = request_block("POST", UNARY);
        b.extend(std::iter::repeat_n(NEWEST, REFS));
        let list = REFS * ("x-big".len() + big.len() + 32);
        assert!(b.len() < 1024 && list > 100 * (16 << 10), "{} bytes for {list}", b.len());
        c.write(&frame(kind::HEADERS, flag::END_HEADERS | flag::END_STREAM, 3, &b)).await;
        let frames = c.until("the answer to the bomb", ended(3)).await;
        assert_eq!(status(&frames, 3).as_deref(), Some("431"), "{:?}", last(&frames));

        // Stream 5: the entry once, in a valid call: the table is in step.
        let mut b = request_block("POST", UNARY);
        b.push(NEWEST);
        let mut bytes = frame(kind::HEADERS, flag::END_HEADERS, 5, &b);
        bytes.extend(frame(kind::DATA, flag::END_STREAM, 5, &grpc_message(b"five")));
        c.write(&bytes).await;
        let frames = c.until("the call after the bomb", ended(5)).await;
        assert_eq!(status(&frames, 5).as_deref(), Some("200"));
        let trailers = frames.iter().rfind(|f| f.is(kind::HEADERS, 5)).expect("found above");
        assert_eq!(trailers.field("grpc-status"), Some("0"), "{trailers:?}");

        // Stream 7: the bomb in one block, its entry added by the block
        // itself (evicting the first).
        let mut b = request_block("POST", UNARY);
        indexed_literal("x-big-2", &big, &mut b);
        b.extend(std::iter::repeat_n(NEWEST, REFS));
        c.write(&frame(kind::HEADERS, flag::END_HEADERS | flag::END_STREAM, 7, &b)).await;
        let frames = c.until("the answer to the second bomb", ended(7)).await;
        assert_eq!(status(&frames, 7).as_deref(), Some("431"), "{:?}", last(&frames));

        // Stream 9: the second entry is the newest now.
        let mut b = request_block("POST", UNARY);
        b.push(NEWEST);
        let mut bytes = frame(kind::HEADERS, flag::END_HEADERS, 9, &b);
        bytes.extend(frame(kind::DATA, flag::END_STREAM, 9, &grpc_message(b"nine")));
        c.write(&bytes).await;
        let frames = c.until("the call after the second bomb", ended(9)).await;
        let trailers = frames.iter().rfind(|f| f.is(kind::HEADERS, 9)).expect("found above");
        assert_eq!(trailers.field("grpc-status"), Some("0"), "{trailers:?}");
        assert!(!frames.iter().any(|f| f.head.kind == kind::GOAWAY), "{:?}", last(&frames));

        assert_eq!(k.started.load(Ordering::SeqCst), 2, "only the valid calls ran a handler");
        assert_serving(server.addr).await;
    })
    .await;
}

/// Dynamic table size updates (RFC 7541 §4.2, §6.3): one at the start of
/// a block, within the 4,096 bytes the server allows, is taken; one above
/// it, or one after a field, is a COMPRESSION_ERROR for the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_size_updates_beyond_the_rules_are_compression_errors() {
    bounded("table size updates", async {
        let server = start_server(false).await;
        let fields = request_block("POST", UNARY);

        // Within the limit, first in the block: 0, then 4,096.
        let (mut c, _) = RawConn::h2(server.addr, false).await;
        let mut b = Vec::new();
        hpack_int(0, 5, 0x20, &mut b);
        hpack_int(4096, 5, 0x20, &mut b);
        b.extend_from_slice(&fields);
        let mut bytes = frame(kind::HEADERS, flag::END_HEADERS, 1, &b);
        bytes.extend(frame(kind::DATA, flag::END_STREAM, 1, &grpc_message(b"ok")));
        c.write(&bytes).await;
        let frames = c
            .until("the call", |fs| {
                fs.iter().any(|f| f.is(kind::HEADERS, 1) && f.head.has(flag::END_STREAM))
                    || fs.iter().any(|f| f.head.kind == kind::GOAWAY)
            })
            .await;
        let trailers = frames.iter().rfind(|f| f.is(kind::HEADERS, 1));
        assert_eq!(trailers.and_then(|t| t.field("grpc-status")), Some("0"), "{frames:?}");

        let mut above = Vec::new();
        hpack_int(4097, 5, 0x20, &mut above);
        above.extend_from_slice(&fields);
        let mut after_field = fields.clone();
        hpack_int(4096, 5, 0x20, &mut after_field);
        for (what, block) in [("above the limit", above), ("after a field", after_field)] {
            let (mut c, _) = RawConn::h2(server.addr, false).await;
            c.write(&frame(kind::HEADERS, flag::END_HEADERS | flag::END_STREAM, 1, &block)).await;
            let (ended, _) = c.ended(what).await;
            assert_eq!(ended, Ended::GoAway(Reason::COMPRESSION_ERROR), "{what}");
        }
        assert_serving(server.addr).await;
    })
    .await;
}
