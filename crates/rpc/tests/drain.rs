//! Graceful shutdown over real sockets: once a router drains, its
//! listeners refuse new connections, a call in flight is answered, a new
//! call on an HTTP/2 connection that got GOAWAY goes to a new connection
//! (refused UNAVAILABLE while nothing listens; served by a server started
//! on the same address), and the drain finishes when the last connection
//! closes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::lean::LeanChannel;
use protoplane_rpc::{CallOptions, Channel, GrpcTransport, Router, ServerOptions};
use protoplane_schema::ProtoSource;
use protoplane_test_support::net::{bounded, eventually, serve_grpc, serve_lean};
use protoplane_wire::Builder;

const BOUND: Duration = Duration::from_secs(10);
const HOLD: &str = "/drain.test.Held/Hold";

const PROTO: &str = r#"
syntax = "proto3";
package drain.test;
message Empty {}
service Held { rpc Hold(Empty) returns (Empty); }
"#;

/// Answers each call once the test releases one permit.
struct Held {
    schema: Arc<Schema>,
    started: AtomicUsize,
    release: tokio::sync::Semaphore,
}

impl Service for Held {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "drain.test.Held"
    }

    fn call(
        self: Arc<Self>,
        _method: u32,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            req.message.single().await?;
            self.started.fetch_add(1, Ordering::SeqCst);
            let permit = self.release.acquire().await;
            permit.map_err(|_| Status::new(Code::Internal, "closed"))?.forget();
            let b = Builder::new(self.schema.tables(), out.output_type())?;
            out.send(b.finish()).await?;
            Ok(Metadata::new())
        })
    }
}

fn held(transport: GrpcTransport) -> (Arc<Router>, Arc<Held>) {
    let src = [ProtoSource { name: "drain.proto", text: PROTO }];
    let schema = Arc::new(Schema::from_proto_sources(&src, &["drain.proto"]).expect("schema"));
    let svc = Arc::new(Held {
        schema,
        started: AtomicUsize::new(0),
        release: tokio::sync::Semaphore::new(0),
    });
    let opts = ServerOptions { transport, ..ServerOptions::default() };
    (Arc::new(Router::new(opts).add_service(svc.clone())), svc)
}

/// One call of `Hold` on `ch`: its status.
async fn hold(ch: &Channel) -> Result<(), Status> {
    let mut call = ch.start(HOLD, CallOptions::default()).await?;
    call.send(&[]).await?;
    call.close_send();
    while call.recv().await?.is_some() {}
    let st = call.finish_status().await;
    if st.code == Code::Ok {
        Ok(())
    } else {
        Err(st)
    }
}

async fn refuses_connections(addr: std::net::SocketAddr) -> bool {
    tokio::net::TcpStream::connect(addr).await.is_err()
}

async fn grpc_call_in_flight_is_answered(transport: GrpcTransport) {
    let (router, svc) = held(transport);
    let addr = serve_grpc(router.clone()).await;
    let ch = Channel::connect(&addr.to_string()).await.expect("connect");
    let in_flight = tokio::spawn({
        let ch = ch.clone();
        async move { hold(&ch).await }
    });
    eventually(BOUND, "the handler runs", || svc.started.load(Ordering::SeqCst) == 1).await;

    router.drain().start();
    // The listener closes: the kernel refuses new connections.
    let mut refused = false;
    for _ in 0..500 {
        if refuses_connections(addr).await {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(refused, "the listener still accepts after the drain started");
    // The server's GOAWAY reaches the channel: calls started from now on
    // are not the old connection's (one started earlier would have been
    // accepted and served, as HTTP/2's graceful shutdown says).
    eventually(BOUND, "the channel sees GOAWAY", || !ch.takes_calls()).await;
    // A new call is not served here: the connection got GOAWAY, so the
    // channel dials again, and the listener is closed.
    let next = bounded(BOUND, "a call after GOAWAY", hold(&ch)).await;
    assert_eq!(next.expect_err("refused").code, Code::Unavailable);
    assert_eq!(svc.started.load(Ordering::SeqCst), 1, "no handler ran for it");
    assert_eq!(router.drain().connections(), 1, "the connection waits for its call");

    // The call in flight is answered, then the connection closes.
    svc.release.add_permits(1);
    let answered = bounded(BOUND, "the call in flight", in_flight).await.expect("task");
    assert!(answered.is_ok(), "{answered:?}");
    bounded(BOUND, "the drain finishes", router.drain().finished()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_http2_answers_the_call_in_flight_and_refuses_new_ones() {
    grpc_call_in_flight_is_answered(GrpcTransport::Native).await;
}

#[cfg(feature = "h2")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_crate_answers_the_call_in_flight_and_refuses_new_ones() {
    grpc_call_in_flight_is_answered(GrpcTransport::H2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lean_answers_the_call_in_flight_then_closes() {
    let (router, svc) = held(GrpcTransport::Native);
    let addr = serve_lean(router.clone()).await;
    let ch = LeanChannel::connect(&addr.to_string()).await.expect("connect");
    let in_flight = tokio::spawn({
        let ch = ch.clone();
        async move { ch.unary(HOLD, &[], &CallOptions::default()).await }
    });
    eventually(BOUND, "the handler runs", || svc.started.load(Ordering::SeqCst) == 1).await;
    router.drain().start();
    assert_eq!(router.drain().connections(), 1, "the connection waits for its call");
    svc.release.add_permits(1);
    let answered = bounded(BOUND, "the call in flight", in_flight).await.expect("task");
    assert!(answered.is_ok(), "{answered:?}");
    bounded(BOUND, "the drain finishes", router.drain().finished()).await;
    assert!(refuses_connections(addr).await, "the listener is closed");
}

/// A server restarted on the same address (or another engine taking its
/// listener over): the channel's calls in flight finish on the old
/// connection and its next call dials the new server, with no call failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_dials_again_after_goaway() {
    let (old, old_svc) = held(GrpcTransport::Native);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn({
        let r = old.clone();
        async move { r.serve(listener).await }
    });
    let ch = Channel::connect(&addr.to_string()).await.expect("connect");
    let in_flight = tokio::spawn({
        let ch = ch.clone();
        async move { hold(&ch).await }
    });
    eventually(BOUND, "the handler runs", || old_svc.started.load(Ordering::SeqCst) == 1).await;
    old.drain().start();
    eventually(BOUND, "the old listener closes", || std::net::TcpStream::connect(addr).is_err())
        .await;
    eventually(BOUND, "the channel sees GOAWAY", || !ch.takes_calls()).await;
    let (new, new_svc) = held(GrpcTransport::Native);
    let listener = tokio::net::TcpListener::bind(addr).await.expect("the same address");
    tokio::spawn({
        let r = new.clone();
        async move { r.serve(listener).await }
    });
    new_svc.release.add_permits(2);
    for i in 0..2 {
        let next = bounded(BOUND, "a call after the restart", hold(&ch)).await;
        assert!(next.is_ok(), "call {i}: {next:?}");
    }
    assert_eq!(new_svc.started.load(Ordering::SeqCst), 2, "both on the new server");
    assert_eq!(old_svc.started.load(Ordering::SeqCst), 1, "none on the old one");
    old_svc.release.add_permits(1);
    let answered = bounded(BOUND, "the call in flight", in_flight).await.expect("task");
    assert!(answered.is_ok(), "the old connection's call finished there: {answered:?}");
    bounded(BOUND, "the old server drains", old.drain().finished()).await;
}

#[tokio::test]
async fn an_idle_router_drains_at_once() {
    let (router, _) = held(GrpcTransport::Native);
    let addr = serve_grpc(router.clone()).await;
    let ch = Channel::connect(&addr.to_string()).await.expect("connect");
    drop(ch);
    router.drain().start();
    bounded(BOUND, "the drain finishes", router.drain().finished()).await;
}
