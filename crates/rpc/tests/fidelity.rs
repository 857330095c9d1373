//! gRPC fidelity: the three defects a third-party conformance suite found,
//! each pinned by a test of its own, and mutual TLS.
//!
//! * error details: a status's `google.rpc.Status` details reach the client
//!   (`grpc-status-details-bin`), over gRPC and over the lean transport;
//! * headers when asked: explicitly sent response headers leave at once —
//!   the client reads them while the handler still waits — and a call that
//!   set headers (sent or only staged) and no message does not end
//!   trailers-only;
//! * content-type: a non-gRPC type gets HTTP 415, another codec
//!   UNIMPLEMENTED, and neither reaches the handler;
//! * mutual TLS: a server requiring client certificates admits only clients
//!   with one its CA signed, and the handler sees that certificate.
//!
//! Every wait is bounded, so no test can hang.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use protoplane_grpc::rich::ErrorDetails;
use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::{
    CallOptions, Channel, ChannelOptions, ClientTls, Identity, Router, ServerOptions,
};
use protoplane_schema::ProtoSource;
use protoplane_wire::{Builder, Value};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::time::timeout;

const PROTO: &str = r#"
syntax = "proto3";
package fidelity;

message Req {
  // What the handler does (see Mode).
  int32 mode = 1;
}
message Resp { bytes body = 1; }

service Svc {
  rpc Unary(Req) returns (Resp);
  rpc Stream(Req) returns (stream Resp);
}
"#;

/// What a handler does, by `Req.mode`.
mod mode {
    /// Answers with an empty body.
    pub(super) const OK: i32 = 0;
    /// Fails with rich details and a trailer.
    pub(super) const DETAILS: i32 = 1;
    /// Sends headers, waits to be released, answers.
    pub(super) const HEADERS_THEN_WAIT: i32 = 2;
    /// Sends headers, fails without a message.
    pub(super) const HEADERS_THEN_FAIL: i32 = 3;
    /// Sets headers without sending them, fails without a message.
    pub(super) const STAGED_THEN_FAIL: i32 = 4;
    /// Answers with the client's certificate (DER) as the body.
    pub(super) const PEER_CERT: i32 = 5;
    /// Answers with a response header and a trailer.
    pub(super) const WITH_METADATA: i32 = 6;
}

const BOUND: Duration = Duration::from_secs(5);

fn schema() -> &'static Arc<Schema> {
    static SCHEMA: OnceLock<Arc<Schema>> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let src = [ProtoSource { name: "fidelity.proto", text: PROTO }];
        Arc::new(Schema::from_proto_sources(&src, &["fidelity.proto"]).expect("the proto compiles"))
    })
}

fn details() -> ErrorDetails {
    let mut d = ErrorDetails::with_bad_request_violation("mode", "must be valid");
    d.retry_info = ErrorDetails::with_retry_info(Some(Duration::from_millis(1500))).retry_info;
    d
}

#[derive(Default)]
struct Svc {
    release: Notify,
    handled: AtomicUsize,
}

impl Svc {
    async fn run(
        self: Arc<Self>,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> Result<Metadata, Status> {
        self.handled.fetch_add(1, Ordering::SeqCst);
        let m = req.message.single().await?;
        let v = m.view(schema().tables())?;
        let mode = v.by_number(1)?.and_then(|x| x.as_i128()).unwrap_or(0) as i32;
        let mut body = Vec::new();
        match mode {
            mode::OK => {}
            mode::DETAILS => {
                let mut st =
                    Status::with_error_details(Code::InvalidArgument, "bad mode", details());
                let _ = st.metadata.insert("x-trailer", "t");
                return Err(st);
            }
            mode::HEADERS_THEN_WAIT => {
                let _ = out.metadata_mut().insert("x-early", "yes");
                out.send_headers().await?;
                self.release.notified().await;
            }
            mode::HEADERS_THEN_FAIL | mode::STAGED_THEN_FAIL => {
                let _ = out.metadata_mut().insert("x-early", "yes");
                if mode == mode::HEADERS_THEN_FAIL {
                    out.send_headers().await?;
                }
                let mut st = Status::new(Code::FailedPrecondition, "no message");
                let _ = st.metadata.insert("x-trailer", "t");
                return Err(st);
            }
            mode::PEER_CERT => {
                body = req.peer.as_ref().and_then(|p| p.certificate()).unwrap_or(&[]).to_vec();
            }
            mode::WITH_METADATA => {
                let _ = out.metadata_mut().insert("x-header", "h");
                body = b"answer".to_vec();
            }
            _ => return Err(Status::new(Code::InvalidArgument, "unknown mode")),
        }
        let ty = schema().tables().message_by_name("fidelity.Resp").unwrap_or(0);
        let mut b = Builder::new(schema().tables(), ty)?;
        let root = b.root();
        if !body.is_empty() {
            b.set(root, 1, Value::Bytes(&body))?;
        }
        out.send(b.finish()).await?;
        let mut trailers = Metadata::new();
        if mode == mode::WITH_METADATA {
            let _ = trailers.insert("x-trailer", "t");
        }
        Ok(trailers)
    }
}

impl Service for Svc {
    fn schema(&self) -> &Arc<Schema> {
        schema()
    }
    fn name(&self) -> &str {
        "fidelity.Svc"
    }
    fn call(
        self: Arc<Self>,
        _method: u32,
        request: Request<Streaming>,
        responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(self.run(request, responder))
    }
}

fn req(mode: i32) -> Vec<u8> {
    // fidelity.Req{mode}: field 1, varint.
    if mode == 0 {
        return Vec::new();
    }
    vec![0x08, mode as u8]
}

fn router(svc: &Arc<Svc>) -> Arc<Router> {
    Arc::new(Router::new(ServerOptions::default()).add_service(svc.clone()))
}

async fn start(svc: &Arc<Svc>) -> SocketAddr {
    protoplane_test_support::net::serve_grpc(router(svc)).await
}

async fn channel(addr: SocketAddr) -> Channel {
    timeout(BOUND, Channel::connect(&addr.to_string())).await.expect("in time").expect("connect")
}

#[tokio::test]
async fn error_details_reach_a_grpc_client() {
    let svc = Arc::new(Svc::default());
    let ch = channel(start(&svc).await).await;
    for path in ["/fidelity.Svc/Unary", "/fidelity.Svc/Stream"] {
        let mut call = ch.start(path, CallOptions::default()).await.expect("start");
        call.send(&req(mode::DETAILS)).await.expect("send");
        call.close_send();
        let st = timeout(BOUND, call.finish_status()).await.expect("in time");
        assert_eq!((st.code, st.message.as_str()), (Code::InvalidArgument, "bad mode"), "{path}");
        assert_eq!(st.check_error_details(), Ok(details()), "{path}");
        assert_eq!(st.metadata.get("x-trailer"), Some("t"), "{path}");
        // The details travel in their own trailer, not as metadata.
        assert!(st.metadata.iter().all(|(k, _)| !k.starts_with("grpc-")), "{path}");
    }
}

#[tokio::test]
async fn a_typed_unary_call_gives_headers_message_and_trailers() {
    let svc = Arc::new(Svc::default());
    let ch = channel(start(&svc).await).await;
    let client = protoplane_rpc::Client::new(ch, schema().clone());
    let method = schema().method_id("/fidelity.Svc/Unary").expect("method");
    let ty = schema().tables().message_by_name("fidelity.Req").expect("type");
    let mut b = Builder::new(schema().tables(), ty).expect("builder");
    let root = b.root();
    b.set(root, 1, Value::I32(mode::WITH_METADATA)).expect("mode");
    let block = b.finish();
    let r = timeout(BOUND, client.unary_response(method, Request::new(&block)))
        .await
        .expect("in time")
        .expect("the call");
    assert_eq!(r.headers.get("x-header"), Some("h"));
    assert_eq!(r.trailers.get("x-trailer"), Some("t"));
    let v = r.message.view(schema().tables()).expect("view");
    assert_eq!(v.by_number(1).expect("field").and_then(|x| x.as_bytes()), Some(&b"answer"[..]));
}

#[tokio::test]
async fn error_details_reach_a_lean_client() {
    let svc = Arc::new(Svc::default());
    let addr = protoplane_test_support::net::serve_lean(router(&svc)).await;
    let ch = timeout(BOUND, protoplane_rpc::lean::client::LeanChannel::connect(&addr.to_string()))
        .await
        .expect("in time")
        .expect("connect");
    let r = ch.unary("/fidelity.Svc/Unary", &req(mode::DETAILS), &CallOptions::default()).await;
    let st = r.expect_err("the call fails");
    assert_eq!(st.code, Code::InvalidArgument);
    assert_eq!(st.check_error_details(), Ok(details()));
    assert_eq!(st.metadata.get("x-trailer"), Some("t"));
}

#[tokio::test]
async fn explicitly_sent_headers_arrive_while_the_handler_waits() {
    let svc = Arc::new(Svc::default());
    let ch = channel(start(&svc).await).await;
    for path in ["/fidelity.Svc/Unary", "/fidelity.Svc/Stream"] {
        let mut call = ch.start(path, CallOptions::default()).await.expect("start");
        call.send(&req(mode::HEADERS_THEN_WAIT)).await.expect("send");
        call.close_send();
        // The handler is blocked until released: the headers can only be
        // here because they left when sent.
        let h = timeout(BOUND, call.headers()).await.expect("headers before the release");
        assert_eq!(h.expect("headers").get("x-early"), Some("yes"), "{path}");
        svc.release.notify_one();
        let got = timeout(BOUND, call.recv()).await.expect("in time").expect("a response");
        assert!(got.is_some(), "{path}");
        assert_eq!(timeout(BOUND, call.finish_status()).await.expect("in time").code, Code::Ok);
    }
}

#[tokio::test]
async fn headers_a_handler_set_are_headers_sent_or_staged() {
    let svc = Arc::new(Svc::default());
    let ch = channel(start(&svc).await).await;
    for path in ["/fidelity.Svc/Unary", "/fidelity.Svc/Stream"] {
        // Sent: a HEADERS frame, then trailers — the client sees both.
        let mut call = ch.start(path, CallOptions::default()).await.expect("start");
        call.send(&req(mode::HEADERS_THEN_FAIL)).await.expect("send");
        call.close_send();
        let h = timeout(BOUND, call.headers()).await.expect("in time").expect("headers").clone();
        let st = timeout(BOUND, call.finish_status()).await.expect("in time");
        assert_eq!(st.code, Code::FailedPrecondition, "{path}");
        assert_eq!(h.get("x-early"), Some("yes"), "{path}: response headers");
        assert_eq!(st.metadata.get("x-trailer"), Some("t"), "{path}: trailers");
        assert_eq!(st.metadata.get("x-early"), None, "{path}: not in the trailers");

        // Set, never sent, then no message: still headers, then the
        // trailers (grpc-go and tonic send them so), not trailers-only.
        let mut call = ch.start(path, CallOptions::default()).await.expect("start");
        call.send(&req(mode::STAGED_THEN_FAIL)).await.expect("send");
        call.close_send();
        let st = timeout(BOUND, call.finish_status()).await.expect("in time");
        assert_eq!(st.code, Code::FailedPrecondition, "{path}");
        let h = call.headers_now().expect("headers").clone();
        assert_eq!(h.get("x-early"), Some("yes"), "{path}: response headers");
        assert_eq!(st.metadata.get("x-early"), None, "{path}: not in the trailers");
        assert_eq!(st.metadata.get("x-trailer"), Some("t"), "{path}");
    }
}

/// One raw HTTP/2 request with `content_type`: the HTTP status and the
/// `grpc-status` of the answer.
async fn raw(addr: SocketAddr, content_type: &str) -> (StatusCode, Option<String>) {
    let sock = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (send, conn) = h2::client::handshake(sock).await.expect("h2 handshake");
    tokio::spawn(conn);
    let mut send = send.ready().await.expect("ready");
    let mut req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/fidelity.Svc/Unary"))
        .body(())
        .expect("request");
    req.headers_mut().insert("content-type", HeaderValue::from_str(content_type).expect("value"));
    req.headers_mut().insert("te", HeaderValue::from_static("trailers"));
    let (resp, mut body) = send.send_request(req, false).expect("send");
    // A well-formed request: one empty message.
    body.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true).expect("data");
    let resp = timeout(BOUND, resp).await.expect("in time").expect("response");
    let status = resp.status();
    let head = resp.headers().get("grpc-status").cloned();
    let mut body = resp.into_body();
    while let Some(Ok(_)) = timeout(BOUND, body.data()).await.expect("in time") {}
    let trailers = timeout(BOUND, body.trailers()).await.expect("in time").ok().flatten();
    let code = head.or_else(|| trailers.and_then(|t| t.get("grpc-status").cloned()));
    (status, code.map(|v| v.to_str().unwrap_or("?").to_string()))
}

#[tokio::test]
async fn content_types_are_checked_before_anything_is_decoded() {
    let svc = Arc::new(Svc::default());
    let addr = start(&svc).await;
    for ok in ["application/grpc", "application/grpc+proto", "application/grpc;charset=utf-8"] {
        assert_eq!(raw(addr, ok).await, (StatusCode::OK, Some("0".into())), "{ok}");
    }
    let served = svc.handled.load(Ordering::SeqCst);
    for other in ["application/grpc+json", "application/grpc+foo"] {
        assert_eq!(raw(addr, other).await, (StatusCode::OK, Some("12".into())), "{other}");
    }
    for not_grpc in ["application/grpc-web", "application/json", "text/plain"] {
        let (status, _) = raw(addr, not_grpc).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{not_grpc}");
    }
    assert_eq!(svc.handled.load(Ordering::SeqCst), served, "a refused request reached the handler");
}

/// A CA, a server certificate for `localhost` it signed, and a client
/// certificate it signed; PEM.
struct Pki {
    ca: String,
    server: (String, String),
    client: (String, String, Vec<u8>),
}

fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("CA");
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |name: &str| {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec![name.to_string()])
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("signed");
        (cert.pem(), key.serialize_pem(), cert.der().to_vec())
    };
    let (server_cert, server_key, _) = leaf("localhost");
    let client = leaf("client.test");
    Pki { ca: ca.pem(), server: (server_cert, server_key), client }
}

#[tokio::test]
async fn mutual_tls_admits_only_certified_clients_and_the_handler_sees_who() {
    let pki = pki();
    let other = pki_other_client();
    let svc = Arc::new(Svc::default());
    let config = protoplane_rpc::tls::server_config_mtls(
        pki.server.0.as_bytes(),
        pki.server.1.as_bytes(),
        pki.ca.as_bytes(),
    )
    .expect("server config");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(router(&svc).serve_tls(listener, config));

    let connect = |identity: Option<Identity>| {
        let tls = ClientTls {
            server_name: "localhost".into(),
            roots_pem: pki.ca.clone().into_bytes(),
            identity,
        };
        let opts = ChannelOptions { tls: Some(tls), ..ChannelOptions::default() };
        async move {
            let ch = timeout(BOUND, Channel::connect_with(&addr.to_string(), opts))
                .await
                .expect("in time")?;
            let mut call = ch.start("/fidelity.Svc/Unary", CallOptions::default()).await?;
            call.send(&req(mode::PEER_CERT)).await?;
            call.close_send();
            let body = timeout(BOUND, call.recv()).await.expect("in time")?;
            Ok::<_, Status>(body.unwrap_or_default())
        }
    };
    // With the CA's client certificate: admitted, and the handler saw it.
    let identity = Identity {
        cert_pem: pki.client.0.clone().into_bytes(),
        key_pem: pki.client.1.clone().into_bytes(),
    };
    let body = connect(Some(identity)).await.expect("a certified client is served");
    // Resp.body (field 1, bytes) holds the DER the handler saw.
    let der = &pki.client.2;
    assert!(body.len() > der.len() && body.ends_with(der), "the handler saw the client's cert");
    // Without a certificate, or with one another CA signed: refused.
    assert!(connect(None).await.is_err(), "a client without a certificate got through");
    let stranger = Identity { cert_pem: other.0.into_bytes(), key_pem: other.1.into_bytes() };
    assert!(connect(Some(stranger)).await.is_err(), "a stranger's certificate got through");
}

/// A client certificate signed by a CA the server does not trust.
fn pki_other_client() -> (String, String) {
    let other = pki();
    (other.client.0, other.client.1)
}
