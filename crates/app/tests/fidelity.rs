//! gRPC fidelity across the split: an engine and an attached application
//! in this process, the engine serving gRPC over mutual TLS.
//!
//! What the monolithic server's fidelity tests pin down must hold when the
//! handler runs in the application and the HTTP/2 side in the engine:
//! * a status's details cross the ring and reach the client;
//! * headers the handler sends explicitly reach the client while it still
//!   waits (a HEADERS descriptor of their own);
//! * headers sent and then no message: headers and trailers, as sent;
//!   staged and never sent: headers and trailers too (not trailers-only);
//! * the certificate the engine verified reaches the application's handler;
//! * so does the client's address: each connection's own, on every call,
//!   concurrent first calls included (the engine notes it once per
//!   connection and names it by slot after that).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use protoplane_grpc::rich::ErrorDetails;
use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::{CallOptions, Channel, ChannelOptions, ClientTls, Identity};
use protoplane_schema::ProtoSource;
use protoplane_wire::{Builder, Value};
use tokio::sync::Notify;
use tokio::time::timeout;

const PROTO: &str = r#"
syntax = "proto3";
package fid;
message Req { int32 mode = 1; }
message Resp { bytes body = 1; }
service Svc {
  rpc Unary(Req) returns (Resp);
  rpc Stream(Req) returns (stream Resp);
}
"#;

const DETAILS: i32 = 1;
const HEADERS_THEN_WAIT: i32 = 2;
const HEADERS_THEN_FAIL: i32 = 3;
const STAGED_THEN_FAIL: i32 = 4;
const PEER_CERT: i32 = 5;
const PEER_ADDR: i32 = 6;

const BOUND: Duration = Duration::from_secs(10);

fn details() -> ErrorDetails {
    let mut d = ErrorDetails::with_error_info("SPLIT", "protoplane.test", []);
    d.add_bad_request_violation("mode", "must be valid");
    d
}

struct Svc {
    schema: Arc<Schema>,
    release: Arc<Notify>,
}

impl Service for Svc {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "fid.Svc"
    }

    fn call(
        self: Arc<Self>,
        _method: u32,
        request: Request<Streaming>,
        mut out: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            let peer = request.peer.clone();
            let mut requests = request.message;
            let m = requests.single().await?;
            let mode = m.view(self.schema.tables())?.by_number(1)?.and_then(|x| x.as_i128());
            let mut body = Vec::new();
            match mode.unwrap_or(0) as i32 {
                DETAILS => {
                    let mut st = Status::with_error_details(Code::Aborted, "split", details());
                    let _ = st.metadata.insert("x-trailer", "t");
                    return Err(st);
                }
                HEADERS_THEN_WAIT => {
                    let _ = out.metadata_mut().insert("x-early", "yes");
                    out.send_headers().await?;
                    self.release.notified().await;
                }
                mode @ (HEADERS_THEN_FAIL | STAGED_THEN_FAIL) => {
                    let _ = out.metadata_mut().insert("x-early", "yes");
                    if mode == HEADERS_THEN_FAIL {
                        out.send_headers().await?;
                    }
                    let mut st = Status::new(Code::FailedPrecondition, "no message");
                    let _ = st.metadata.insert("x-trailer", "t");
                    return Err(st);
                }
                PEER_CERT => {
                    body = peer.as_ref().and_then(|p| p.certificate()).unwrap_or(&[]).to_vec();
                }
                PEER_ADDR => {
                    let addr = peer.as_ref().and_then(|p| p.addr);
                    body = addr.map(|a| a.to_string()).unwrap_or_default().into_bytes();
                }
                _ => {}
            }
            let mut b = Builder::new(self.schema.tables(), out.output_type())?;
            if !body.is_empty() {
                b.set(b.root(), 1, Value::Bytes(&body))?;
            }
            out.send(b.finish()).await?;
            Ok(Metadata::new())
        })
    }
}

/// A CA, a `localhost` server certificate and a client certificate it
/// signed: (CA, server cert, server key, client cert, client key, client
/// DER), PEM but the last.
fn pki() -> (String, String, String, String, String, Vec<u8>) {
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
    let (sc, sk, _) = leaf("localhost");
    let (cc, ck, der) = leaf("client.test");
    (ca.pem(), sc, sk, cc, ck, der)
}

fn dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pp-split-fidelity-{test}-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d
}

async fn call(ch: &Channel, path: &str, mode: i32) -> protoplane_rpc::ClientCall {
    let opts = CallOptions { timeout: Some(BOUND), ..CallOptions::default() };
    let mut c = ch.start(path, opts).await.expect("start");
    c.send(&[0x08, mode as u8]).await.expect("send");
    c.close_send();
    c
}

#[test]
fn details_headers_and_the_peer_cross_the_split() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let src = [ProtoSource { name: "fid.proto", text: PROTO }];
    let schema = Arc::new(Schema::from_proto_sources(&src, &["fid.proto"]).expect("schema"));
    let (ca, sc, sk, cc, ck, client_der) = pki();
    let d = dir("details");
    let write = |name: &str, text: &str| {
        let p = d.join(name);
        std::fs::write(&p, text).expect("write");
        p
    };
    let (ca_file, cert_file, key_file) =
        (write("ca.pem", &ca), write("server.pem", &sc), write("server.key", &sk));
    let release = Arc::new(Notify::new());

    rt.block_on(async {
        let config = protoplane_engine::Config {
            grpc: Some("127.0.0.1:0".parse().expect("addr")),
            tls: Some((cert_file, key_file)),
            tls_client_ca: Some(ca_file),
            attach: d.join("engine.sock"),
            schemas: vec![schema.clone()],
            half_mb: 4,
            ..protoplane_engine::Config::default()
        };
        let engine = protoplane_engine::start(config).await.expect("engine");
        let app = protoplane_app::attach(d.join("engine.sock"))
            .service(Arc::new(Svc { schema: schema.clone(), release: release.clone() }));
        tokio::spawn(app.run());
        let until = Instant::now() + BOUND;
        while engine.registry.pick("fid.Svc").is_none() {
            assert!(Instant::now() < until, "the application did not attach");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let tls = ClientTls {
            server_name: "localhost".into(),
            roots_pem: ca.clone().into_bytes(),
            identity: Some(Identity { cert_pem: cc.into_bytes(), key_pem: ck.into_bytes() }),
        };
        let opts = ChannelOptions { tls: Some(tls), ..ChannelOptions::default() };
        let addr = engine.grpc.expect("grpc").to_string();
        let ch = timeout(BOUND, Channel::connect_with(&addr, opts))
            .await
            .expect("in time")
            .expect("connect");

        for path in ["/fid.Svc/Unary", "/fid.Svc/Stream"] {
            // Details.
            let mut c = call(&ch, path, DETAILS).await;
            let st = timeout(BOUND, c.finish_status()).await.expect("in time");
            assert_eq!((st.code, st.message.as_str()), (Code::Aborted, "split"), "{path}");
            assert_eq!(st.check_error_details(), Ok(details()), "{path}");
            assert_eq!(st.metadata.get("x-trailer"), Some("t"), "{path}");

            // Headers while the handler waits.
            let mut c = call(&ch, path, HEADERS_THEN_WAIT).await;
            let h = timeout(BOUND, c.headers()).await.expect("headers before the release");
            assert_eq!(h.expect("headers").get("x-early"), Some("yes"), "{path}");
            release.notify_one();
            assert_eq!(timeout(BOUND, c.finish_status()).await.expect("in time").code, Code::Ok);

            // Sent, then no message: headers and trailers as sent.
            let mut c = call(&ch, path, HEADERS_THEN_FAIL).await;
            let h = timeout(BOUND, c.headers()).await.expect("in time").expect("headers").clone();
            let st = timeout(BOUND, c.finish_status()).await.expect("in time");
            assert_eq!(st.code, Code::FailedPrecondition, "{path}");
            assert_eq!(h.get("x-early"), Some("yes"), "{path}");
            assert_eq!(st.metadata.get("x-early"), None, "{path}");

            // Staged, never sent, no message: headers then trailers, as
            // grpc-go sends them (not trailers-only).
            let mut c = call(&ch, path, STAGED_THEN_FAIL).await;
            let st = timeout(BOUND, c.finish_status()).await.expect("in time");
            assert_eq!(st.code, Code::FailedPrecondition, "{path}");
            let h = c.headers_now().expect("headers").clone();
            assert_eq!(h.get("x-early"), Some("yes"), "{path}: response headers");
            assert_eq!(st.metadata.get("x-early"), None, "{path}: not in the trailers");

            // The client's certificate reached the application.
            let mut c = call(&ch, path, PEER_CERT).await;
            let body = timeout(BOUND, c.recv()).await.expect("in time").expect("ok");
            let body = body.expect("a response");
            assert!(body.ends_with(&client_der), "{path}: the handler saw the client's cert");

            // And, with it, the client's address.
            let mut c = call(&ch, path, PEER_ADDR).await;
            let body = timeout(BOUND, c.recv()).await.expect("in time").expect("ok");
            let text = String::from_utf8(body.expect("a response").to_vec()).expect("utf-8");
            assert!(text.contains("127.0.0.1:"), "{path}: the handler saw {text:?}");
        }
    });
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn each_connections_address_reaches_the_handler_on_every_call() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let src = [ProtoSource { name: "fid.proto", text: PROTO }];
    let schema = Arc::new(Schema::from_proto_sources(&src, &["fid.proto"]).expect("schema"));
    let d = dir("addresses");
    rt.block_on(async {
        let config = protoplane_engine::Config {
            grpc: Some("127.0.0.1:0".parse().expect("addr")),
            attach: d.join("engine.sock"),
            schemas: vec![schema.clone()],
            half_mb: 4,
            ..protoplane_engine::Config::default()
        };
        let engine = protoplane_engine::start(config).await.expect("engine");
        let release = Arc::new(Notify::new());
        let app = protoplane_app::attach(d.join("engine.sock"))
            .service(Arc::new(Svc { schema: schema.clone(), release }));
        tokio::spawn(app.run());
        let until = Instant::now() + BOUND;
        while engine.registry.pick("fid.Svc").is_none() {
            assert!(Instant::now() < until, "the application did not attach");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let server = engine.grpc.expect("grpc");
        // Three connections whose own addresses this side knows.
        let mut conns = Vec::new();
        for _ in 0..3 {
            let tcp = tokio::net::TcpStream::connect(server).await.expect("connect");
            let local = tcp.local_addr().expect("local address");
            let ch = Channel::over(tcp, &server.to_string(), ChannelOptions::default())
                .await
                .expect("handshake");
            conns.push((local, ch));
        }
        async fn addr_of(ch: Channel) -> String {
            let mut c = call(&ch, "/fid.Svc/Unary", PEER_ADDR).await;
            let body = timeout(BOUND, c.recv()).await.expect("in time").expect("ok");
            // The response is `Resp { body }`: a tag, a length, the text.
            let body = body.expect("a response");
            String::from_utf8(body[2..].to_vec()).expect("utf-8")
        }
        // Rounds of concurrent calls on every connection (the first round's
        // calls race to note each address), then one at a time.
        for round in 0..4 {
            let mut calls = Vec::new();
            for (local, ch) in &conns {
                for _ in 0..if round < 3 { 16 } else { 1 } {
                    calls.push((*local, tokio::spawn(addr_of(ch.clone()))));
                }
            }
            for (local, call) in calls {
                let seen = call.await.expect("call");
                assert_eq!(seen, local.to_string(), "round {round}: the handler saw its client");
            }
        }
    });
    let _ = std::fs::remove_dir_all(&d);
}
