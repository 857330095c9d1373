//! Client-side health checking (gRFC A17) from the service config, over
//! real sockets: round robin sends calls only to backends whose health
//! service says the configured service is SERVING, takes a backend out
//! while it says NOT_SERVING and back when it serves again, uses a backend
//! without a health service as if healthy, and fails fast calls with
//! UNAVAILABLE (naming why) when no backend is healthy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_grpc_services::health::{Health, ServingStatus};
use protoplane_rpc::config::ServiceConfig;
use protoplane_rpc::{CallOptions, Channel, ChannelOptions, LbPolicy, Router, ServerOptions};
use protoplane_schema::ProtoSource;
use protoplane_test_support::net::{bounded, serve_grpc};
use protoplane_wire::Builder;

const BOUND: Duration = Duration::from_secs(20);
const ECHO: &str = "/health.test.Backend/Echo";
const SERVICE: &str = "health.test.Backend";

const PROTO: &str = r#"
syntax = "proto3";
package health.test;
message Empty {}
service Backend { rpc Echo(Empty) returns (Empty); }
"#;

struct Backend {
    schema: Arc<Schema>,
    calls: AtomicUsize,
}

impl Service for Backend {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        SERVICE
    }

    fn call(
        self: Arc<Self>,
        _method: u32,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            while req.message.message().await.is_some() {}
            self.calls.fetch_add(1, Ordering::SeqCst);
            let reply = Builder::new(self.schema.tables(), out.output_type())?;
            out.send(reply.finish()).await?;
            Ok(Metadata::new())
        })
    }
}

/// A backend, with a health service unless `health` is false.
async fn backend(health: bool) -> (String, Arc<Backend>, Option<Arc<Health>>) {
    let src = [ProtoSource { name: "health.proto", text: PROTO }];
    let schema = Arc::new(Schema::from_proto_sources(&src, &["health.proto"]).expect("schema"));
    let svc = Arc::new(Backend { schema, calls: AtomicUsize::new(0) });
    let mut router = Router::new(ServerOptions::default()).add_service(svc.clone());
    let h = health.then(|| Health::new(&[SERVICE.to_string()]).expect("health"));
    if let Some(h) = &h {
        router = router.add_service(h.clone());
    }
    (serve_grpc(Arc::new(router)).await.to_string(), svc, h)
}

fn checked(service: &str) -> ChannelOptions {
    let json = format!(r#"{{"healthCheckConfig": {{"serviceName": "{service}"}}}}"#);
    let sc = ServiceConfig::from_json(&json).expect("service config");
    ChannelOptions {
        service_config: Some(Arc::new(sc)),
        lb: LbPolicy::RoundRobin,
        ..ChannelOptions::default()
    }
}

async fn echo(ch: &Channel) -> Result<(), Status> {
    let mut c = ch.start(ECHO, CallOptions::default()).await?;
    c.send_last(&[]).await?;
    match c.finish_status().await {
        st if st.code == Code::Ok => Ok(()),
        st => Err(st),
    }
}

fn calls(b: &[Arc<Backend>]) -> Vec<usize> {
    b.iter().map(|b| b.calls.load(Ordering::SeqCst)).collect()
}

/// Calls until `ok` holds of the calls each backend got over the last
/// 30 calls (health changes reach the client asynchronously).
async fn until_spread(
    ch: &Channel,
    b: &[Arc<Backend>],
    ok: impl Fn(&[usize]) -> bool,
) -> Vec<usize> {
    let until = Instant::now() + BOUND;
    loop {
        let before = calls(b);
        for _ in 0..30 {
            bounded(BOUND, "a call", echo(ch)).await.expect("ok");
        }
        let got: Vec<usize> = calls(b).iter().zip(&before).map(|(a, b)| a - b).collect();
        if ok(&got) {
            return got;
        }
        assert!(Instant::now() < until, "spread never became right: last {got:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_follow_each_backend_s_health() {
    let (a, ba, ha) = backend(true).await;
    let (b, bb, hb) = backend(true).await;
    let (c, bc, _) = backend(false).await;
    let (ha, hb) = (ha.expect("health"), hb.expect("health"));
    let all = [ba, bb, bc];
    let ch = Channel::connect_with(&format!("ipv4:{a},{b},{c}"), checked(SERVICE))
        .await
        .expect("connect");
    // All three take calls (the third has no health service).
    until_spread(&ch, &all, |g| g.iter().all(|&n| n == 10)).await;
    // B says it is not serving: no call goes there.
    hb.set(SERVICE, ServingStatus::NotServing);
    until_spread(&ch, &all, |g| g[1] == 0 && g[0] == 15 && g[2] == 15).await;
    // Serving again: back in.
    hb.set(SERVICE, ServingStatus::Serving);
    until_spread(&ch, &all, |g| g.iter().all(|&n| n == 10)).await;
    // Another service's status does not matter.
    ha.set("other.Service", ServingStatus::NotServing);
    until_spread(&ch, &all, |g| g.iter().all(|&n| n == 10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_healthy_backend_fails_fast_calls_and_waits_for_ready_ones() {
    let (a, ba, ha) = backend(true).await;
    let ha = ha.expect("health");
    ha.set(SERVICE, ServingStatus::NotServing);
    let ch = Channel::lazy(&format!("ipv4:{a}"), checked(SERVICE));
    // The first call connects; the health answer says not serving.
    let until = Instant::now() + BOUND;
    let st = loop {
        match bounded(BOUND, "a call", echo(&ch)).await {
            Err(st) if st.message.contains("healthy") => break st,
            other => assert!(Instant::now() < until, "not refused for health: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(st.code, Code::Unavailable, "{st:?}");
    assert!(st.message.contains("NOT_SERVING"), "{}", st.message);
    assert_eq!(ba.calls.load(Ordering::SeqCst), 0);
    // A call that waits for ready goes through once it serves.
    let ch2 = ch.clone();
    let waiting = tokio::spawn(async move {
        let mut c = ch2.start(ECHO, CallOptions::default().wait_for_ready()).await?;
        c.send_last(&[]).await?;
        match c.finish_status().await {
            st if st.code == Code::Ok => Ok(()),
            st => Err(st),
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    ha.set(SERVICE, ServingStatus::Serving);
    bounded(BOUND, "the waiting call", waiting).await.expect("joined").expect("ok");
    assert_eq!(ba.calls.load(Ordering::SeqCst), 1);
}
