//! The lean transport end to end: every call kind, metadata, statuses,
//! deadlines, cancellation, pipelining, over TCP and Unix sockets, against
//! the same service the gRPC server runs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::lean::{server, LeanChannel};
use protoplane_rpc::{CallOptions, Router, ServerOptions};
use protoplane_schema::ProtoSource;
use protoplane_test_support::net::eventually;
use protoplane_wire::{Builder, Value};

const SEQ: Ordering = Ordering::SeqCst;
/// The bound on every wait of these tests.
const BOUND: Duration = Duration::from_secs(10);

const PROTO: &str = r#"
syntax = "proto3";
package lean.test;
message Req { bytes body = 1; int32 count = 2; int32 size = 3; }
message Resp { bytes body = 1; }
service Echo {
  rpc Unary(Req) returns (Resp);
  rpc Stream(Req) returns (stream Resp);
  rpc Collect(stream Req) returns (Resp);
  rpc Chat(stream Req) returns (stream Resp);
}
"#;

struct Echo {
    schema: Arc<Schema>,
    handlers: Arc<Handlers>,
}

/// Handlers started, and handlers dropped (ended or cancelled).
#[derive(Default)]
struct Handlers {
    started: AtomicUsize,
    dropped: AtomicUsize,
}

struct Guard(Arc<Handlers>);
impl Drop for Guard {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::new(Code::Internal, e.to_string())
}

impl Echo {
    fn resp(&self, out: &Responder, body: &[u8]) -> Result<protoplane_wire::Block, Status> {
        let mut b = Builder::new(self.schema.tables(), out.output_type()).map_err(internal)?;
        let root = b.root();
        b.set(root, 1, Value::Bytes(body)).map_err(internal)?;
        Ok(b.finish())
    }

    async fn run(
        self: Arc<Self>,
        method: u32,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> Result<Metadata, Status> {
        self.handlers.started.fetch_add(1, Ordering::SeqCst);
        let _guard = Guard(self.handlers.clone());
        let ts = self.schema.tables();
        let name = self.schema.method(method).map(|m| m.name.clone()).unwrap_or_default();
        let mut trailers = Metadata::new();
        if let Some(v) = req.metadata.get("x-echo") {
            let _ = out.metadata_mut().insert("x-echo", v);
            let _ = trailers.insert("x-echo-trailer", v);
        }
        match name.as_str() {
            "Unary" | "Stream" => {
                let m = req.message.single().await?;
                let v = m.view(ts)?;
                let body =
                    v.by_number(1).map_err(internal)?.and_then(|x| x.as_bytes()).unwrap_or(&[]);
                let count =
                    v.by_number(2).map_err(internal)?.and_then(|x| x.as_i128()).unwrap_or(0);
                let size = v.by_number(3).map_err(internal)?.and_then(|x| x.as_i128()).unwrap_or(0);
                if count < 0 {
                    return Err(Status::new(Code::from_u32((-count) as u32), "asked to fail ✓"));
                }
                if name == "Unary" {
                    if size > 0 {
                        tokio::time::sleep(Duration::from_millis(size as u64)).await;
                    }
                    let r = self.resp(&out, body)?;
                    out.send(r).await?;
                } else {
                    for _ in 0..count {
                        let r = self.resp(&out, &vec![7; size as usize])?;
                        out.send(r).await?;
                    }
                }
            }
            "Collect" => {
                let mut total = Vec::new();
                while let Some(m) = req.message.message().await {
                    let v = m.view(ts)?;
                    total.extend_from_slice(
                        v.by_number(1).map_err(internal)?.and_then(|x| x.as_bytes()).unwrap_or(&[]),
                    );
                }
                let r = self.resp(&out, &total)?;
                out.send(r).await?;
            }
            _ => {
                while let Some(m) = req.message.message().await {
                    let v = m.view(ts)?;
                    let body = v
                        .by_number(1)
                        .map_err(internal)?
                        .and_then(|x| x.as_bytes())
                        .unwrap_or(&[])
                        .to_vec();
                    let r = self.resp(&out, &body)?;
                    out.send(r).await?;
                }
            }
        }
        Ok(trailers)
    }
}

impl Service for Echo {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }
    fn name(&self) -> &str {
        "lean.test.Echo"
    }
    fn call(
        self: Arc<Self>,
        method: u32,
        request: Request<Streaming>,
        responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(self.run(method, request, responder))
    }
}

fn schema() -> Arc<Schema> {
    Arc::new(
        Schema::from_proto_sources(&[ProtoSource { name: "t.proto", text: PROTO }], &["t.proto"])
            .expect("test schema compiles"),
    )
}

/// Encodes a `Req` by hand (field 1 bytes, 2 and 3 varints).
fn req(body: &[u8], count: i64, size: i64) -> Vec<u8> {
    let mut out = vec![0x0a];
    push_varint(&mut out, body.len() as u64);
    out.extend_from_slice(body);
    out.push(0x10);
    push_varint(&mut out, count as u64);
    out.push(0x18);
    push_varint(&mut out, size as u64);
    out
}

use protoplane_test_support::wire::varint as push_varint;

/// The body of an encoded `Resp`.
fn body(resp: &[u8]) -> Vec<u8> {
    if resp.is_empty() {
        return Vec::new();
    }
    assert_eq!(resp[0], 0x0a);
    let (mut len, mut shift, mut i) = (0usize, 0, 1);
    loop {
        let b = resp[i];
        len |= ((b & 0x7f) as usize) << shift;
        i += 1;
        if b < 0x80 {
            break;
        }
        shift += 7;
    }
    resp[i..i + len].to_vec()
}

async fn start() -> (String, String, Arc<Handlers>) {
    let handlers = Arc::new(Handlers::default());
    let svc = Arc::new(Echo { schema: schema(), handlers: handlers.clone() });
    let router = Arc::new(Router::new(ServerOptions::default()).add_service(svc));
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = tcp.local_addr().expect("addr").to_string();
    let path = std::env::temp_dir().join(format!(
        "pp-lean-{}-{}.sock",
        std::process::id(),
        addr.replace(':', "_")
    ));
    let _ = std::fs::remove_file(&path);
    let unix = tokio::net::UnixListener::bind(&path).expect("bind unix");
    tokio::spawn(server::serve_tcp(router.clone(), tcp));
    tokio::spawn(server::serve_unix(router, unix));
    (addr, format!("unix:{}", path.display()), handlers)
}

const UNARY: &str = "/lean.test.Echo/Unary";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_kind_over_tcp_and_unix() {
    let (tcp, unix, _) = start().await;
    for target in [tcp, unix] {
        let ch = LeanChannel::connect(&target).await.expect("connect");
        let opts = CallOptions::default();
        // Unary.
        let r = ch.unary(UNARY, &req(b"hello", 0, 0), &opts).await.expect("unary");
        assert_eq!(body(&r), b"hello");
        // Server streaming.
        let mut call = ch.start("/lean.test.Echo/Stream", &opts).await.expect("start");
        call.send_last(&req(b"", 5, 1000)).await.expect("send");
        let mut n = 0;
        while let Some(m) = call.recv().await.expect("recv") {
            assert_eq!(body(&m), vec![7; 1000]);
            n += 1;
        }
        assert_eq!(n, 5);
        // Client streaming.
        let mut call = ch.start("/lean.test.Echo/Collect", &opts).await.expect("start");
        for part in [&b"ab"[..], b"cd", b"e"] {
            call.send(&req(part, 0, 0)).await.expect("send");
        }
        call.close_send().await.expect("close");
        assert_eq!(body(&call.recv().await.expect("recv").expect("a response")), b"abcde");
        assert!(call.recv().await.expect("end").is_none());
        // Bidirectional, in lock step.
        let mut call = ch.start("/lean.test.Echo/Chat", &opts).await.expect("start");
        for i in 0..10u8 {
            call.send(&req(&[i; 3], 0, 0)).await.expect("send");
            assert_eq!(body(&call.recv().await.expect("recv").expect("echo")), vec![i; 3]);
        }
        call.close_send().await.expect("close");
        assert!(call.recv().await.expect("end").is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_metadata_deadline_and_unknown_method() {
    let (tcp, _, _) = start().await;
    let ch = LeanChannel::connect(&tcp).await.expect("connect");
    let err = ch.unary(UNARY, &req(b"", -5, 0), &CallOptions::default()).await.expect_err("fails");
    assert_eq!((err.code, err.message.as_str()), (Code::NotFound, "asked to fail ✓"));

    let mut md = Metadata::new();
    md.insert("x-echo", "v1").expect("valid");
    let opts = CallOptions { metadata: md, ..CallOptions::default() };
    let mut call = ch.start("/lean.test.Echo/Stream", &opts).await.expect("start");
    call.send_last(&req(b"", 1, 1)).await.expect("send");
    while call.recv().await.expect("recv").is_some() {}
    assert_eq!(call.headers().and_then(|h| h.get("x-echo")), Some("v1"));
    assert_eq!(call.trailers().and_then(|h| h.get("x-echo-trailer")), Some("v1"));

    let opts = CallOptions { timeout: Some(Duration::from_millis(20)), ..CallOptions::default() };
    let err = ch.unary(UNARY, &req(b"", 0, 2000), &opts).await.expect_err("times out");
    assert_eq!(err.code, Code::DeadlineExceeded);

    let err =
        ch.unary("/lean.test.Echo/Nope", &[], &CallOptions::default()).await.expect_err("unknown");
    assert_eq!(err.code, Code::Unimplemented);

    // Invalid protobuf: INVALID_ARGUMENT, and the connection goes on.
    let err = ch
        .unary(UNARY, &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f], &CallOptions::default())
        .await
        .expect_err("bad");
    assert_eq!(err.code, Code::InvalidArgument);
    let r =
        ch.unary(UNARY, &req(b"ok", 0, 0), &CallOptions::default()).await.expect("still serving");
    assert_eq!(body(&r), b"ok");
}

/// The server ends a call at its deadline by itself: a `LeanCall` does not
/// enforce its timeout on the client's side, so the answer here is the
/// server's DEADLINE_EXCEEDED, and the handler is dropped long before the
/// 60 s it would run. Calls that answer in time with the same connection's
/// other deadlines pending are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_ends_a_call_at_its_deadline() {
    let (tcp, _, handlers) = start().await;
    let ch = LeanChannel::connect(&tcp).await.expect("connect");
    let before = handlers.dropped.load(SEQ);
    let opts = CallOptions { timeout: Some(Duration::from_millis(150)), ..CallOptions::default() };
    let long = CallOptions { timeout: Some(Duration::from_secs(3600)), ..CallOptions::default() };
    let mut call = ch.start(UNARY, &opts).await.expect("start");
    call.send_last(&req(b"", 0, 60_000)).await.expect("send");
    let started = Instant::now();
    for i in 0..200u32 {
        let b = i.to_le_bytes();
        let r = ch.unary(UNARY, &req(&b, 0, 0), &long).await.expect("answers in time");
        assert_eq!(body(&r), b);
    }
    let err = tokio::time::timeout(BOUND, call.recv())
        .await
        .expect("the server answers")
        .expect_err("past its deadline");
    assert_eq!(err.code, Code::DeadlineExceeded, "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(100), "not before its deadline");
    let dropped = || handlers.dropped.load(SEQ) > before;
    eventually(BOUND, "the handler is dropped", dropped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_calls_and_cancellation() {
    let (tcp, _, handlers) = start().await;
    let ch = LeanChannel::connect(&tcp).await.expect("connect");
    // 2000 calls in flight on one connection, answers matched by call id.
    let mut tasks = Vec::new();
    for i in 0..2000u32 {
        let ch = ch.clone();
        tasks.push(tokio::spawn(async move {
            let b = i.to_le_bytes();
            let r = ch.unary(UNARY, &req(&b, 0, 0), &CallOptions::default()).await.expect("unary");
            assert_eq!(body(&r), b);
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    // A cancelled call's handler is dropped on the server (long before the
    // 60 s it would run).
    let (started, before) = (handlers.started.load(SEQ), handlers.dropped.load(SEQ));
    let mut call = ch.start(UNARY, &CallOptions::default()).await.expect("start");
    call.send_last(&req(b"", 0, 60_000)).await.expect("send");
    let running = || handlers.started.load(SEQ) > started;
    eventually(BOUND, "the handler runs", running).await;
    call.cancel().await;
    let dropped = || handlers.dropped.load(SEQ) > before;
    eventually(BOUND, "the cancelled handler is dropped", dropped).await;
    let r = ch.unary(UNARY, &req(b"after", 0, 0), &CallOptions::default()).await.expect("unary");
    assert_eq!(body(&r), b"after");
    let _ = Bytes::new();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_ends_only_that_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tcp, _, _) = start().await;
    for junk in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        b"PPLEAN\0\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
    ] {
        let mut s = tokio::net::TcpStream::connect(&tcp).await.expect("connect");
        s.write_all(junk).await.expect("write");
        let mut sink = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut sink)).await;
        assert!(r.is_ok(), "server kept a broken connection open");
    }
    let ch = LeanChannel::connect(&tcp).await.expect("connect");
    let r = ch.unary(UNARY, &req(b"fine", 0, 0), &CallOptions::default()).await.expect("unary");
    assert_eq!(body(&r), b"fine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_stalls_only_itself() {
    use protoplane_grpc::lean::{write, Outgoing};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tcp, _, handlers) = start().await;
    // Ask for 10,000 responses of 64 KiB (640 MB) and never read them.
    let mut s = tokio::net::TcpStream::connect(&tcp).await.expect("connect");
    s.write_all(b"PPLEAN\0\x01").await.expect("preface");
    let mut hello = [0u8; 12];
    s.read_exact(&mut hello).await.expect("server preface");
    let table_len = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]);
    let mut paths = Vec::new();
    for _ in 0..table_len {
        let mut l = [0u8; 2];
        s.read_exact(&mut l).await.expect("path length");
        let mut p = vec![0u8; u16::from_le_bytes(l) as usize];
        s.read_exact(&mut p).await.expect("path");
        paths.push(String::from_utf8(p).expect("utf-8"));
    }
    let stream =
        paths.iter().position(|p| p == "/lean.test.Echo/Stream").expect("Stream listed") as u32;
    let md = Metadata::new();
    let mut frame = Vec::new();
    let f = Outgoing {
        open: Some((None, &md)),
        message: Some(&req(b"", 10_000, 64 << 10)),
        end: true,
        ..Outgoing::default()
    };
    write(&mut frame, 1, stream, &f).expect("frame");
    let started = handlers.started.load(SEQ);
    s.write_all(&frame).await.expect("request");
    let running = || handlers.started.load(SEQ) > started;
    eventually(BOUND, "the stalled call's handler runs", running).await;
    // Everyone else is still served, on other connections.
    let ch = LeanChannel::connect(&tcp).await.expect("connect");
    for _ in 0..10 {
        let r = ch.unary(UNARY, &req(b"x", 0, 0), &CallOptions::default()).await.expect("served");
        assert_eq!(body(&r), b"x");
    }
    // Closing the stalled connection cancels its call.
    let before = handlers.dropped.load(SEQ);
    drop(s);
    let dropped = || handlers.dropped.load(SEQ) > before;
    eventually(BOUND, "the stalled call's handler is dropped", dropped).await;
}
