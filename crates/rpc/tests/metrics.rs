//! gRFC A66's metrics on both sides of real calls over a socket: the
//! server's per method and status (an unknown method under `other`), the
//! client's per method, target and status; the message sizes each side
//! saw agree (what one sent the other received); a deadline and a
//! cancellation end up under their codes on both sides; the scrape
//! endpoint answers a plain HTTP/1.1 GET and refuses what is not one.

use std::sync::Arc;
use std::time::Duration;

use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::metrics::Metrics;
use protoplane_rpc::{CallOptions, Channel, Router, ServerOptions};
use protoplane_schema::ProtoSource;
use protoplane_test_support::net::{bounded, eventually, serve_grpc};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BOUND: Duration = Duration::from_secs(10);

const PROTO: &str = r#"
syntax = "proto3";
package metrics.test;
message Msg { bytes data = 1; }
service Svc {
  rpc Echo(Msg) returns (Msg);
  rpc Fail(Msg) returns (Msg);
  rpc Three(Msg) returns (stream Msg);
  rpc Hang(Msg) returns (Msg);
}
"#;

/// `Echo` answers with the request's own bytes, `Fail` with NOT_FOUND,
/// `Three` with three copies, `Hang` never.
struct Svc(Arc<Schema>);

impl Service for Svc {
    fn schema(&self) -> &Arc<Schema> {
        &self.0
    }

    fn name(&self) -> &str {
        "metrics.test.Svc"
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            let m = req.message.single().await?;
            let wire = m.wire().clone();
            let name = self.0.method(method).map(|m| m.name.clone()).unwrap_or_default();
            match name.as_str() {
                "Fail" => return Err(Status::new(Code::NotFound, "no such thing")),
                "Hang" => std::future::pending::<()>().await,
                "Three" => {
                    for _ in 0..3 {
                        out.send_encoded(wire.clone()).await?;
                    }
                }
                _ => out.send_encoded(wire).await?,
            }
            Ok(Metadata::new())
        })
    }
}

/// A `Msg` whose `data` is `n` bytes (n < 128): `n + 2` bytes on the wire.
fn msg(n: usize) -> Vec<u8> {
    let mut v = vec![0x0a, n as u8];
    v.extend(std::iter::repeat_n(7u8, n));
    v
}

async fn call(ch: &Channel, method: &str, opts: CallOptions) -> (Code, usize) {
    let path = format!("/metrics.test.Svc/{method}");
    let mut c = match ch.start(&path, opts).await {
        Ok(c) => c,
        Err(st) => return (st.code, 0),
    };
    if let Err(st) = c.send_last(&msg(100)).await {
        return (st.code, 0);
    }
    let mut n = 0;
    loop {
        match c.recv().await {
            Ok(Some(_)) => n += 1,
            Ok(None) => return (Code::Ok, n),
            Err(st) => return (st.code, n),
        }
    }
}

/// The value of the sample whose line starts with `prefix` (the whole
/// name and label set), from Prometheus text.
fn value(text: &str, prefix: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(prefix) && l[prefix.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("no sample {prefix} in\n{text}"));
    line[prefix.len() + 1..].parse().expect("a number")
}

#[tokio::test]
async fn a66_metrics_on_both_sides_of_real_calls() {
    let src = [ProtoSource { name: "m.proto", text: PROTO }];
    let schema = Arc::new(Schema::from_proto_sources(&src, &["m.proto"]).expect("schema"));
    let server_metrics = Metrics::new();
    let router = Router::new(ServerOptions::default())
        .add_service(Arc::new(Svc(schema)))
        .with_metrics(server_metrics.clone());
    let addr = serve_grpc(Arc::new(router)).await;
    let client_metrics = Metrics::new();
    let target = format!("dns:{addr}");
    let ch = bounded(BOUND, "connect", Channel::connect(&addr.to_string()))
        .await
        .expect("connect")
        .metrics(client_metrics.clone(), &target);

    for _ in 0..3 {
        assert_eq!(
            bounded(BOUND, "Echo", call(&ch, "Echo", CallOptions::default())).await,
            (Code::Ok, 1)
        );
    }
    assert_eq!(
        bounded(BOUND, "Three", call(&ch, "Three", CallOptions::default())).await,
        (Code::Ok, 3)
    );
    let r = bounded(BOUND, "Fail", call(&ch, "Fail", CallOptions::default())).await;
    assert_eq!(r, (Code::NotFound, 0));
    let r = bounded(BOUND, "Nope", call(&ch, "Nope", CallOptions::default())).await;
    assert_eq!(r, (Code::Unimplemented, 0));
    let hang = CallOptions::default().with_timeout(Duration::from_millis(100));
    assert_eq!(bounded(BOUND, "Hang", call(&ch, "Hang", hang)).await, (Code::DeadlineExceeded, 0));
    // A call the client drops midway: CANCELLED on both sides.
    {
        let mut c =
            ch.start("/metrics.test.Svc/Hang", CallOptions::default()).await.expect("start");
        c.send_last(&msg(1)).await.expect("send");
    }

    // The server ends the cancelled call when the reset arrives. The call
    // with the 100 ms deadline ends there at its deadline, or as
    // cancelled: the client enforces the same deadline, counted from a
    // little earlier, and when its timer comes first (a millisecond tick
    // earlier, on a loaded machine) its reset does. Both are gRPC's
    // behaviour; the client's side of it is exact.
    let hang_ended = |code: &str| {
        let line = format!(
            "grpc_server_call_duration_seconds_count{{grpc_method=\"metrics.test.Svc/Hang\",grpc_status=\"{code}\"}} "
        );
        let t = server_metrics.render();
        t.lines().find_map(|l| l.strip_prefix(&line)).map_or(0.0, |v| v.parse().unwrap_or(0.0))
    };
    eventually(BOUND, "the server ends both Hang calls", || {
        hang_ended("CANCELLED") + hang_ended("DEADLINE_EXCEEDED") == 2.0
    })
    .await;
    let (hang_cancelled, hang_deadline) =
        (hang_ended("CANCELLED"), hang_ended("DEADLINE_EXCEEDED"));
    assert!(hang_cancelled >= 1.0, "the dropped call: {hang_cancelled} cancelled");
    let s = server_metrics.render();
    let c = client_metrics.render();
    let server = |name: &str, method: &str, status: Option<&str>| {
        let st = status.map(|s| format!(",grpc_status=\"{s}\"")).unwrap_or_default();
        value(&s, &format!("{name}{{grpc_method=\"metrics.test.Svc/{method}\"{st}}}"))
    };
    let client = |name: &str, method: &str, status: Option<&str>| {
        let st = status.map(|s| format!(",grpc_status=\"{s}\"")).unwrap_or_default();
        value(
            &c,
            &format!(
                "{name}{{grpc_method=\"metrics.test.Svc/{method}\",grpc_target=\"{target}\"{st}}}"
            ),
        )
    };

    // Calls started and ended, by status, on both sides.
    assert_eq!(server("grpc_server_call_started_total", "Echo", None), 3.0);
    assert_eq!(client("grpc_client_attempt_started_total", "Echo", None), 3.0);
    assert_eq!(server("grpc_server_call_duration_seconds_count", "Echo", Some("OK")), 3.0);
    assert_eq!(client("grpc_client_attempt_duration_seconds_count", "Echo", Some("OK")), 3.0);
    assert_eq!(client("grpc_client_call_duration_seconds_count", "Echo", Some("OK")), 3.0);
    assert_eq!(server("grpc_server_call_duration_seconds_count", "Fail", Some("NOT_FOUND")), 1.0);
    assert_eq!(client("grpc_client_call_duration_seconds_count", "Fail", Some("NOT_FOUND")), 1.0);
    assert_eq!(server("grpc_server_call_started_total", "Hang", None), 2.0);
    assert_eq!(
        client("grpc_client_attempt_duration_seconds_count", "Hang", Some("DEADLINE_EXCEEDED")),
        1.0
    );
    assert_eq!(
        client("grpc_client_attempt_duration_seconds_count", "Hang", Some("CANCELLED")),
        1.0
    );
    // A method the server does not serve: A66's `other` there, its own
    // name at the client.
    assert_eq!(value(&s, "grpc_server_call_started_total{grpc_method=\"other\"}"), 1.0);
    assert_eq!(
        value(&s, "grpc_server_call_duration_seconds_count{grpc_method=\"other\",grpc_status=\"UNIMPLEMENTED\"}"),
        1.0
    );
    assert_eq!(
        client("grpc_client_call_duration_seconds_count", "Nope", Some("UNIMPLEMENTED")),
        1.0
    );

    // Sizes: 102 bytes per message each way; what one side sent, the
    // other received.
    let sent = "grpc_client_attempt_sent_total_compressed_message_size_bytes_sum";
    let rcvd = "grpc_server_call_rcvd_total_compressed_message_size_bytes_sum";
    assert_eq!(client(sent, "Echo", Some("OK")), 306.0);
    assert_eq!(server(rcvd, "Echo", Some("OK")), 306.0);
    let sent = "grpc_server_call_sent_total_compressed_message_size_bytes_sum";
    let rcvd = "grpc_client_attempt_rcvd_total_compressed_message_size_bytes_sum";
    assert_eq!(server(sent, "Three", Some("OK")), 306.0);
    assert_eq!(client(rcvd, "Three", Some("OK")), 306.0);
    // A call's size lands in the bucket that holds it: 306 > 0, ≤ 1024.
    let b = "grpc_server_call_sent_total_compressed_message_size_bytes_bucket";
    let bucket = |le: &str| {
        value(
            &s,
            &format!(
                "{b}{{grpc_method=\"metrics.test.Svc/Three\",grpc_status=\"OK\",le=\"{le}\"}}"
            ),
        )
    };
    assert_eq!((bucket("0"), bucket("1024"), bucket("+Inf")), (0.0, 1.0, 1.0));
    // A deadline of 100 ms: the server's duration sum says at least that.
    if hang_deadline == 1.0 {
        let hang_s =
            server("grpc_server_call_duration_seconds_sum", "Hang", Some("DEADLINE_EXCEEDED"));
        assert!((0.09..5.0).contains(&hang_s), "{hang_s}");
    }
}

#[tokio::test]
async fn the_scrape_endpoint_answers_get_and_refuses_the_rest() {
    let metrics = Metrics::new();
    metrics.server_method("/a.B/C").start();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(protoplane_rpc::metrics::http::serve(listener, metrics));
    let ask = |req: &'static [u8]| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(req).await.expect("write");
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.expect("read");
        String::from_utf8(out).expect("utf-8")
    };
    let ok =
        bounded(BOUND, "scrape", ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n"))
            .await;
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    assert!(ok.contains("Content-Type: text/plain; version=0.0.4"), "{ok}");
    assert!(ok.contains("\r\n\r\n# HELP grpc_server_call_started_total"), "{ok}");
    assert!(ok.contains("grpc_server_call_started_total{grpc_method=\"a.B/C\"} 1\n"), "{ok}");
    let body = ok.split_once("\r\n\r\n").expect("head").1;
    let len: usize = ok
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .expect("length")
        .parse()
        .expect("number");
    assert_eq!(len, body.len());
    let head = bounded(BOUND, "scrape", ask(b"HEAD /metrics HTTP/1.1\r\n\r\n")).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"), "{head}");
    let r = bounded(BOUND, "scrape", ask(b"GET / HTTP/1.1\r\n\r\n")).await;
    assert!(r.starts_with("HTTP/1.1 404"), "{r}");
    let r = bounded(BOUND, "scrape", ask(b"POST /metrics HTTP/1.1\r\n\r\n")).await;
    assert!(r.starts_with("HTTP/1.1 405"), "{r}");
    let r = bounded(BOUND, "scrape", ask(b"\x16\x03\x01 garbage\r\n\r\n")).await;
    assert!(r.starts_with("HTTP/1.1 400"), "{r}");
    // A head that never ends is cut off at its limit, not buffered.
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let big = vec![b'a'; protoplane_rpc::metrics::http::MAX_HEAD + 2048];
    let _ = s.write_all(&big).await;
    let mut out = Vec::new();
    let _ = bounded(BOUND, "the refusal", s.read_to_end(&mut out)).await;
    assert!(out.starts_with(b"HTTP/1.1 400"), "{}", String::from_utf8_lossy(&out));
}
