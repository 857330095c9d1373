//! Hedging from the service config (gRFC A6), over real sockets: a call
//! whose first attempt hangs on a slow backend is answered by a hedge on
//! another (and the slow attempt is cancelled), a non-fatal failure starts
//! the next attempt at once, a fatal status or response headers commit
//! the call, each hedge says how many attempts came before it, and a
//! server's pushback stops hedging.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::config::ServiceConfig;
use protoplane_rpc::{CallOptions, Channel, ChannelOptions, LbPolicy, Router, ServerOptions};
use protoplane_schema::ProtoSource;
use protoplane_test_support::net::{bounded, serve_grpc};
use protoplane_wire::Builder;

const BOUND: Duration = Duration::from_secs(20);
const ECHO: &str = "/hedge.test.Backend/Echo";

const PROTO: &str = r#"
syntax = "proto3";
package hedge.test;
message Empty {}
service Backend { rpc Echo(Empty) returns (Empty); }
"#;

/// How a backend answers.
#[derive(Clone, Copy, Default)]
struct Behaviour {
    /// Waits this long before answering.
    delay: Duration,
    /// Fails with this code instead (after the delay).
    code: Option<Code>,
    /// With the failure, a `grpc-retry-pushback-ms` trailer.
    pushback: Option<&'static str>,
}

struct Backend {
    schema: Arc<Schema>,
    behaviour: Behaviour,
    /// grpc-previous-rpc-attempts of each attempt, in arrival order.
    seen: Mutex<Vec<Option<String>>>,
    /// Attempts whose handler was dropped before it answered (cancelled).
    cancelled: AtomicUsize,
}

struct Unfinished<'a>(&'a AtomicUsize, bool);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Service for Backend {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "hedge.test.Backend"
    }

    fn call(
        self: Arc<Self>,
        _method: u32,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            while req.message.message().await.is_some() {}
            let previous = req.metadata.get("grpc-previous-rpc-attempts").map(str::to_string);
            self.seen.lock().expect("lock").push(previous);
            let b = self.behaviour;
            let mut guard = Unfinished(&self.cancelled, true);
            tokio::time::sleep(b.delay).await;
            guard.1 = false;
            if let Some(code) = b.code {
                let mut st = Status::new(code, "injected");
                if let Some(p) = b.pushback {
                    st.metadata.insert("grpc-retry-pushback-ms", p).expect("metadata");
                }
                return Err(st);
            }
            let reply = Builder::new(self.schema.tables(), out.output_type())?;
            out.send(reply.finish()).await?;
            Ok(Metadata::new())
        })
    }
}

async fn backend(behaviour: Behaviour) -> (String, Arc<Backend>) {
    let src = [ProtoSource { name: "hedge.proto", text: PROTO }];
    let schema = Arc::new(Schema::from_proto_sources(&src, &["hedge.proto"]).expect("schema"));
    let svc = Arc::new(Backend {
        schema,
        behaviour,
        seen: Mutex::new(Vec::new()),
        cancelled: AtomicUsize::new(0),
    });
    let router = Arc::new(Router::new(ServerOptions::default()).add_service(svc.clone()));
    (serve_grpc(router).await.to_string(), svc)
}

fn hedging(attempts: u32, delay: &str, lb: LbPolicy) -> ChannelOptions {
    let json = format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "hedge.test.Backend"}}],
            "hedgingPolicy": {{"maxAttempts": {attempts}, "hedgingDelay": "{delay}",
              "nonFatalStatusCodes": ["UNAVAILABLE"]}}}}]}}"#
    );
    let sc = ServiceConfig::from_json(&json).expect("service config");
    ChannelOptions { service_config: Some(Arc::new(sc)), lb, ..ChannelOptions::default() }
}

/// Waits until the channel has a ready connection to each of `n`
/// backends: `connect_with` returns once one is ready.
async fn all_ready(ch: &Channel, n: usize) {
    let until = Instant::now() + BOUND;
    while ch.ready_backends() != Some(n) {
        assert!(Instant::now() < until, "{n} backends connect: {:?}", ch.ready_backends());
        tokio::time::sleep(Duration::from_millis(5)).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_on_another_backend_answers_for_a_slow_one() {
    let slow = Behaviour { delay: Duration::from_secs(30), ..Behaviour::default() };
    let (a, slow) = backend(slow).await;
    let (b, fast) = backend(Behaviour::default()).await;
    let target = format!("ipv4:{a},{b}");
    let opts = hedging(2, "0.05s", LbPolicy::RoundRobin);
    let ch = Channel::connect_with(&target, opts).await.expect("connect");
    // While only the slow backend is ready, round robin has nowhere else
    // to send the hedge.
    all_ready(&ch, 2).await;
    for i in 0..20 {
        // Far below the slow backend's 30 s: the hedge answered.
        bounded(Duration::from_secs(5), "a hedged call", echo(&ch))
            .await
            .unwrap_or_else(|st| panic!("call {i}: {st:?}"));
    }
    let started = slow.seen.lock().expect("lock").len();
    assert!(started >= 5, "round robin sent calls to the slow backend too: {started}");
    let hedges =
        fast.seen.lock().expect("lock").iter().filter(|p| p.as_deref() == Some("1")).count();
    assert_eq!(hedges, started, "each slow first attempt got a hedge on the fast backend");
    // The losers were cancelled (their handlers dropped unfinished).
    let until = Instant::now() + BOUND;
    while slow.cancelled.load(Ordering::SeqCst) < started {
        assert!(Instant::now() < until, "the slow attempts were not cancelled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_fatal_failure_starts_the_next_attempt_at_once() {
    let failing = Behaviour { code: Some(Code::Unavailable), ..Behaviour::default() };
    let (a, failing) = backend(failing).await;
    let (b, ok) = backend(Behaviour::default()).await;
    let target = format!("ipv4:{a},{b}");
    // A hedging delay far longer than the test: only a failure starts a
    // second attempt.
    let ch = Channel::connect_with(&target, hedging(3, "60s", LbPolicy::RoundRobin))
        .await
        .expect("connect");
    all_ready(&ch, 2).await;
    for i in 0..10 {
        bounded(Duration::from_secs(5), "a call", echo(&ch))
            .await
            .unwrap_or_else(|st| panic!("call {i}: {st:?}"));
    }
    let failed = failing.seen.lock().expect("lock").len();
    assert!(failed >= 3, "some first attempts failed: {failed}");
    assert_eq!(ok.seen.lock().expect("lock").len(), 10, "every call was answered once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_status_commits_the_call() {
    let fatal = Behaviour { code: Some(Code::InvalidArgument), ..Behaviour::default() };
    let (a, svc) = backend(fatal).await;
    let ch =
        Channel::connect_with(&a, hedging(3, "0.05s", LbPolicy::PickFirst)).await.expect("connect");
    let st = bounded(BOUND, "a call", echo(&ch)).await.expect_err("fails");
    assert_eq!(st.code, Code::InvalidArgument);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(svc.seen.lock().expect("lock").len(), 1, "no hedge after a fatal status");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedges_start_every_delay_and_say_how_many_came_before() {
    let slowish = Behaviour { delay: Duration::from_millis(400), ..Behaviour::default() };
    let (a, svc) = backend(slowish).await;
    let ch =
        Channel::connect_with(&a, hedging(3, "0.05s", LbPolicy::PickFirst)).await.expect("connect");
    bounded(BOUND, "a call", echo(&ch)).await.expect("ok");
    let seen = svc.seen.lock().expect("lock").clone();
    assert_eq!(seen, vec![None, Some("1".into()), Some("2".into())]);
    // The first answered; the other two were cancelled.
    let until = Instant::now() + BOUND;
    while svc.cancelled.load(Ordering::SeqCst) < 2 {
        assert!(Instant::now() < until, "the losing hedges were not cancelled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_pushback_stops_hedging() {
    let b =
        Behaviour { code: Some(Code::Unavailable), pushback: Some("-1"), ..Behaviour::default() };
    let (a, svc) = backend(b).await;
    let ch =
        Channel::connect_with(&a, hedging(5, "0.05s", LbPolicy::PickFirst)).await.expect("connect");
    let st = bounded(BOUND, "a call", echo(&ch)).await.expect_err("fails");
    assert_eq!(st.code, Code::Unavailable);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(svc.seen.lock().expect("lock").len(), 1, "no hedge after a negative pushback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_hedged_calls_in_flight_none_fails() {
    let slow = Behaviour { delay: Duration::from_millis(100), ..Behaviour::default() };
    let mut addrs = Vec::new();
    for b in [Behaviour::default(), Behaviour::default(), Behaviour::default(), slow] {
        addrs.push(backend(b).await.0);
    }
    let target = format!("ipv4:{}", addrs.join(","));
    let ch = Channel::connect_with(&target, hedging(3, "0.01s", LbPolicy::RoundRobin))
        .await
        .expect("connect");
    let calls = (0..16).map(|_| {
        let ch = ch.clone();
        async move {
            let mut failed = Vec::new();
            for _ in 0..50 {
                if let Err(st) = echo(&ch).await {
                    failed.push(st);
                }
            }
            failed
        }
    });
    let failed: Vec<Status> = bounded(BOUND, "800 calls", futures_util::future::join_all(calls))
        .await
        .into_iter()
        .flatten()
        .collect();
    assert!(failed.is_empty(), "{} failed: {:?}", failed.len(), failed.first());
}
