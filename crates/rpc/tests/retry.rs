//! Retries from the service config (gRFC A6), over real sockets: a
//! backend failing one call in five is hidden from the application, the
//! server's pushback is obeyed (and a negative one stops retries), the
//! throttle stops a retry storm, committed calls and codes the policy does
//! not name are not retried, a client-streaming call's requests are sent
//! again, and round robin with retries routes around a failing backend.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::config::ServiceConfig;
use protoplane_rpc::{CallOptions, Channel, ChannelOptions, Router, ServerOptions};
use protoplane_schema::ProtoSource;
use protoplane_test_support::net::{bounded, serve_grpc};
use protoplane_wire::Builder;

const BOUND: Duration = Duration::from_secs(20);
const ECHO: &str = "/retry.test.Flaky/Echo";
const SUM: &str = "/retry.test.Flaky/Sum";

const PROTO: &str = r#"
syntax = "proto3";
package retry.test;
message Empty {}
service Flaky {
  rpc Echo(Empty) returns (Empty);
  rpc Sum(stream Empty) returns (Empty);
}
"#;

/// How the backend fails.
#[derive(Clone, Copy, Default)]
struct Faults {
    /// Fail attempt n (counted from 0) when n % every == 0 (0: never).
    every: usize,
    code: Option<Code>,
    /// A `grpc-retry-pushback-ms` trailer with the failure.
    pushback: Option<&'static str>,
    /// Send response headers before failing (the call is committed).
    headers_first: bool,
}

struct Flaky {
    schema: Arc<Schema>,
    faults: Faults,
    attempts: AtomicUsize,
    /// (requests read, grpc-previous-rpc-attempts, arrival) per attempt.
    seen: Mutex<Vec<(usize, Option<String>, Instant)>>,
}

impl Service for Flaky {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "retry.test.Flaky"
    }

    fn call(
        self: Arc<Self>,
        _method: u32,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            let mut n = 0;
            while req.message.message().await.is_some() {
                n += 1;
            }
            let previous = req.metadata.get("grpc-previous-rpc-attempts").map(str::to_string);
            self.seen.lock().expect("lock").push((n, previous, Instant::now()));
            let i = self.attempts.fetch_add(1, Ordering::SeqCst);
            let f = self.faults;
            if f.every > 0 && i % f.every == 0 {
                if f.headers_first {
                    out.send_headers().await?;
                }
                let mut st = Status::new(f.code.unwrap_or(Code::Unavailable), "injected");
                if let Some(p) = f.pushback {
                    st.metadata.insert("grpc-retry-pushback-ms", p).expect("metadata");
                }
                return Err(st);
            }
            let b = Builder::new(self.schema.tables(), out.output_type())?;
            out.send(b.finish()).await?;
            Ok(Metadata::new())
        })
    }
}

async fn flaky(faults: Faults) -> (String, Arc<Flaky>) {
    let src = [ProtoSource { name: "retry.proto", text: PROTO }];
    let schema = Arc::new(Schema::from_proto_sources(&src, &["retry.proto"]).expect("schema"));
    let svc = Arc::new(Flaky {
        schema,
        faults,
        attempts: AtomicUsize::new(0),
        seen: Mutex::new(Vec::new()),
    });
    let router = Arc::new(Router::new(ServerOptions::default()).add_service(svc.clone()));
    (serve_grpc(router).await.to_string(), svc)
}

fn config(attempts: u32, codes: &str, throttling: &str) -> ChannelOptions {
    let json = format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "retry.test.Flaky"}}],
            "retryPolicy": {{"maxAttempts": {attempts}, "initialBackoff": "0.001s",
              "maxBackoff": "0.01s", "backoffMultiplier": 2,
              "retryableStatusCodes": [{codes}]}}}}]{throttling}}}"#
    );
    let sc = ServiceConfig::from_json(&json).expect("service config");
    ChannelOptions { service_config: Some(Arc::new(sc)), ..ChannelOptions::default() }
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
async fn one_failure_in_five_is_hidden_by_three_attempts() {
    let (addr, svc) = flaky(Faults { every: 5, ..Faults::default() }).await;
    // Without a policy, a fifth of the calls fail.
    let plain = Channel::connect(&addr).await.expect("connect");
    let mut failed = 0;
    for _ in 0..100 {
        if echo(&plain).await.is_err() {
            failed += 1;
        }
    }
    assert_eq!(failed, 20, "every fifth attempt fails");

    let ch =
        Channel::connect_with(&addr, config(3, r#""UNAVAILABLE""#, "")).await.expect("connect");
    let before = svc.attempts.load(Ordering::SeqCst);
    for i in 0..1000 {
        bounded(BOUND, "a call", echo(&ch)).await.unwrap_or_else(|st| panic!("call {i}: {st:?}"));
    }
    let made = svc.attempts.load(Ordering::SeqCst) - before;
    assert_eq!(made, 1250, "1000 calls, every fifth attempt again");
    let seen = svc.seen.lock().expect("lock");
    let retried = seen[before..].iter().filter(|s| s.1.as_deref() == Some("1")).count();
    assert_eq!(retried, 250, "each retry says it follows one attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_s_pushback_sets_the_wait_and_a_negative_one_stops_retries() {
    let faults = Faults { every: 2, pushback: Some("200"), ..Faults::default() };
    let (addr, svc) = flaky(faults).await;
    let ch =
        Channel::connect_with(&addr, config(2, r#""UNAVAILABLE""#, "")).await.expect("connect");
    echo(&ch).await.expect("retried after the pushback");
    let seen = svc.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 2);
    let waited = seen[1].2 - seen[0].2;
    assert!(waited >= Duration::from_millis(200), "waited {waited:?}");

    let faults = Faults { every: 1, pushback: Some("-1"), ..Faults::default() };
    let (addr, svc) = flaky(faults).await;
    let ch =
        Channel::connect_with(&addr, config(5, r#""UNAVAILABLE""#, "")).await.expect("connect");
    assert_eq!(echo(&ch).await.expect_err("fails").code, Code::Unavailable);
    assert_eq!(svc.attempts.load(Ordering::SeqCst), 1, "no retry after a negative pushback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_throttle_stops_a_retry_storm() {
    let (addr, svc) = flaky(Faults { every: 1, ..Faults::default() }).await;
    let throttling = r#", "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}"#;
    let ch = Channel::connect_with(&addr, config(5, r#""UNAVAILABLE""#, throttling))
        .await
        .expect("connect");
    for _ in 0..20 {
        assert_eq!(echo(&ch).await.expect_err("always fails").code, Code::Unavailable);
    }
    // 10 tokens, one per failed attempt, retries only above 5: the first
    // call gets its 5 attempts (tokens 10 -> 5), every later call one.
    assert_eq!(svc.attempts.load(Ordering::SeqCst), 5 + 19);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_calls_and_other_codes_are_not_retried() {
    let faults = Faults { every: 1, headers_first: true, ..Faults::default() };
    let (addr, svc) = flaky(faults).await;
    let ch =
        Channel::connect_with(&addr, config(5, r#""UNAVAILABLE""#, "")).await.expect("connect");
    assert_eq!(echo(&ch).await.expect_err("fails").code, Code::Unavailable);
    assert_eq!(svc.attempts.load(Ordering::SeqCst), 1, "headers arrived: committed");

    let faults = Faults { every: 1, code: Some(Code::Internal), ..Faults::default() };
    let (addr, svc) = flaky(faults).await;
    let ch =
        Channel::connect_with(&addr, config(5, r#""UNAVAILABLE""#, "")).await.expect("connect");
    assert_eq!(echo(&ch).await.expect_err("fails").code, Code::Internal);
    assert_eq!(svc.attempts.load(Ordering::SeqCst), 1, "INTERNAL is not in the policy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stream_is_sent_again_on_the_next_attempt() {
    let (addr, svc) = flaky(Faults { every: 2, ..Faults::default() }).await;
    let ch = Channel::connect_with(&addr, config(3, "14", "")).await.expect("connect");
    let mut c = ch.start(SUM, CallOptions::default()).await.expect("start");
    for _ in 0..3 {
        c.send(&[]).await.expect("send");
    }
    c.close_send();
    assert_eq!(c.finish_status().await.code, Code::Ok);
    let seen = svc.seen.lock().expect("lock").clone();
    let reads: Vec<usize> = seen.iter().map(|s| s.0).collect();
    assert_eq!(reads, vec![3, 3], "both attempts got all three requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_with_retries_routes_around_a_failing_backend() {
    let (bad, bad_svc) = flaky(Faults { every: 1, ..Faults::default() }).await;
    let mut good = Vec::new();
    for _ in 0..3 {
        good.push(flaky(Faults::default()).await);
    }
    let target = format!("ipv4:{bad},{},{},{}", good[0].0, good[1].0, good[2].0);
    let mut opts = config(3, r#""UNAVAILABLE""#, "");
    opts.lb = protoplane_rpc::LbPolicy::RoundRobin;
    let ch = Channel::connect_with(&target, opts).await.expect("connect");
    for i in 0..400 {
        bounded(BOUND, "a call", echo(&ch)).await.unwrap_or_else(|st| panic!("call {i}: {st:?}"));
    }
    assert!(bad_svc.attempts.load(Ordering::SeqCst) > 50, "the failing backend got its share");
    let served: usize = good.iter().map(|g| g.1.attempts.load(Ordering::SeqCst)).sum();
    assert_eq!(served, 400, "every call answered by a good backend");
}
