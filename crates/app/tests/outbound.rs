//! Outbound calls through the engine: an application (serving nothing)
//! calls a monolithic protoplane server through an engine in this
//! process, with the same `Client` it would use on a channel of its own.
//!
//! * the response, its headers and trailers cross back; the request's
//!   metadata reaches the backend;
//! * a failure's code, message, details and trailers cross back;
//! * a deadline crosses the seam: the backend's handler is cancelled, and
//!   the caller fails DEADLINE_EXCEEDED in time;
//! * a caller that drops its call cancels the backend's;
//! * calls of a schema not declared, and streaming calls, fail
//!   UNIMPLEMENTED, saying why;
//! * an engine whose `[outbound] allow` does not name the target refuses
//!   the attachment with that reason;
//! * more calls than `max_calls` at once: the extra ones fail
//!   RESOURCE_EXHAUSTED and the rest succeed.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protoplane_grpc::rich::ErrorDetails;
use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::{CallOptions, Client, Connectivity, Router, ServerOptions};
use protoplane_schema::ProtoSource;
use protoplane_wire::{Builder, Value};
use tokio::time::timeout;

const PROTO: &str = r#"
syntax = "proto3";
package kv;
message Key { string key = 1; int32 mode = 2; }
message Value { string value = 1; string tenant = 2; }
service Kv {
  rpc Get(Key) returns (Value);
  rpc Scan(Key) returns (stream Value);
}
"#;

const OTHER: &str = r#"
syntax = "proto3";
package other;
message M { int32 x = 1; }
service Other { rpc Do(M) returns (M); }
"#;

const FAIL: i32 = 1;
const SLOW: i32 = 2;

const BOUND: Duration = Duration::from_secs(10);

fn schema(name: &'static str, text: &'static str) -> Arc<Schema> {
    let src = [ProtoSource { name, text }];
    Arc::new(Schema::from_proto_sources(&src, &[name]).expect("schema"))
}

fn details() -> ErrorDetails {
    ErrorDetails::with_error_info("NOKEY", "kv.test", [])
}

/// The backend: `Get` answers the key reversed and the `x-tenant` it
/// received, with a header and a trailer; mode FAIL fails with details,
/// mode SLOW waits (and counts the handlers that were dropped unfinished).
struct Kv {
    schema: Arc<Schema>,
    dropped: Arc<AtomicU32>,
}

struct CountDrop(Arc<AtomicU32>, bool);

impl Drop for CountDrop {
    fn drop(&mut self) {
        if self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Service for Kv {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "kv.Kv"
    }

    fn call(
        self: Arc<Self>,
        _method: u32,
        request: Request<Streaming>,
        mut out: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            let tenant = request.metadata.get("x-tenant").unwrap_or("").to_string();
            let mut requests = request.message;
            let m = requests.single().await?;
            let v = m.view(self.schema.tables())?;
            let key =
                v.by_number(1)?.and_then(|x| x.as_str().map(str::to_string)).unwrap_or_default();
            let mode = v.by_number(2)?.and_then(|x| x.as_i128()).unwrap_or(0) as i32;
            match mode {
                FAIL => {
                    let mut st =
                        Status::with_error_details(Code::NotFound, "no such key", details());
                    let _ = st.metadata.insert("x-why", "gone");
                    return Err(st);
                }
                SLOW => {
                    let mut guard = CountDrop(self.dropped.clone(), true);
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    guard.1 = false;
                }
                _ => {}
            }
            let _ = out.metadata_mut().insert("x-backend", "kv");
            let reversed: String = key.chars().rev().collect();
            let mut b = Builder::new(self.schema.tables(), out.output_type())?;
            b.set(b.root(), 1, Value::String(reversed.as_bytes()))?;
            b.set(b.root(), 2, Value::String(tenant.as_bytes()))?;
            out.send(b.finish()).await?;
            let mut trailers = Metadata::new();
            let _ = trailers.insert("x-trailer", "t");
            Ok(trailers)
        })
    }
}

fn key(schema: &Schema, key: &str, mode: i32) -> protoplane_wire::Block {
    let ty = schema.tables().message_by_name("kv.Key").expect("kv.Key");
    let mut b = Builder::new(schema.tables(), ty).expect("builder");
    b.set(b.root(), 1, Value::String(key.as_bytes())).expect("key");
    if mode != 0 {
        b.set(b.root(), 2, Value::I32(mode)).expect("mode");
    }
    b.finish()
}

fn dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("pp-outbound-{tag}-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d
}

/// A backend on an ephemeral port: its address and its dropped-handler
/// counter.
async fn backend(schema: &Arc<Schema>) -> (String, Arc<AtomicU32>) {
    let dropped = Arc::new(AtomicU32::new(0));
    let kv = Kv { schema: schema.clone(), dropped: dropped.clone() };
    let router = Arc::new(Router::new(ServerOptions::default()).add_service(Arc::new(kv)));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    tokio::spawn(router.serve(l));
    (addr, dropped)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt")
}

async fn until_ready(ch: &protoplane_rpc::Channel) {
    let until = Instant::now() + BOUND;
    while ch.connectivity() != Connectivity::Ready {
        assert!(Instant::now() < until, "the application did not attach");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn unary_calls_go_through_the_engine_both_ways() {
    let kv = schema("kv.proto", PROTO);
    let other = schema("other.proto", OTHER);
    let d = dir("unary");
    runtime().block_on(async {
        let (addr, dropped) = backend(&kv).await;
        let config = protoplane_engine::Config {
            attach: d.join("engine.sock"),
            half_mb: 4,
            ..protoplane_engine::Config::default()
        };
        let engine = protoplane_engine::start(config).await.expect("engine");
        let mut app = protoplane_app::attach(d.join("engine.sock"));
        let ch = app.channel(&addr, &kv);
        tokio::spawn(app.run());
        until_ready(&ch).await;
        let client = Client::new(ch.clone(), kv.clone());
        let get = kv.method_id("/kv.Kv/Get").expect("Get");

        // A response, its headers and trailers; the request's metadata.
        let block = key(&kv, "abc", 0);
        let mut req = Request::new(&block);
        let _ = req.metadata.insert("x-tenant", "t1");
        let r = timeout(BOUND, client.unary_response(get, req)).await.expect("in time");
        let r = r.expect("ok");
        let v = r.message.view(kv.tables()).expect("view");
        assert_eq!(
            v.by_number(1).expect("1").and_then(|x| x.as_str().map(str::to_string)),
            Some("cba".into())
        );
        assert_eq!(
            v.by_number(2).expect("2").and_then(|x| x.as_str().map(str::to_string)),
            Some("t1".into())
        );
        assert_eq!(r.headers.get("x-backend"), Some("kv"));
        assert_eq!(r.trailers.get("x-trailer"), Some("t"));

        // A failure with details and trailers.
        let block = key(&kv, "abc", FAIL);
        let st = timeout(BOUND, client.unary(get, Request::new(&block))).await.expect("in time");
        let st = st.expect_err("fails");
        assert_eq!((st.code, st.message.as_str()), (Code::NotFound, "no such key"));
        assert_eq!(st.check_error_details(), Ok(details()));
        assert_eq!(st.metadata.get("x-why"), Some("gone"));

        // A deadline: the caller fails in time, the backend's handler is
        // cancelled.
        let block = key(&kv, "slow", SLOW);
        let mut req = Request::new(&block);
        req.deadline = Some(Instant::now() + Duration::from_millis(300));
        let started = Instant::now();
        let st = timeout(BOUND, client.unary(get, req)).await.expect("in time").expect_err("late");
        assert_eq!(st.code, Code::DeadlineExceeded, "{st:?}");
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
        let until = Instant::now() + BOUND;
        while dropped.load(Ordering::SeqCst) < 1 {
            assert!(Instant::now() < until, "the backend's handler was not cancelled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        // A caller that gives up: dropping its call cancels the backend's.
        let c2 = client.clone();
        let kv2 = kv.clone();
        let task = tokio::spawn(async move {
            let block = key(&kv2, "slow", SLOW);
            let _ = c2.unary(get, Request::new(&block)).await;
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        task.abort();
        let until = Instant::now() + BOUND;
        while dropped.load(Ordering::SeqCst) < 2 {
            assert!(Instant::now() < until, "the dropped call was not cancelled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        // Not declared: another schema; streaming.
        let oc = Client::new(ch.clone(), other.clone());
        let ty = other.tables().message_by_name("other.M").expect("M");
        let m = Builder::new(other.tables(), ty).expect("builder").finish();
        let st = oc.unary(0, Request::new(&m)).await.expect_err("undeclared");
        assert_eq!(st.code, Code::Unimplemented, "{st:?}");
        assert!(st.message.contains("App::channel"), "{}", st.message);
        let scan = kv.method_id("/kv.Kv/Scan").expect("Scan");
        let st = client.start(scan, CallOptions::default()).await.expect_err("streaming");
        assert_eq!(st.code, Code::Unimplemented, "{st:?}");

        // Many at once, all answered.
        let calls = (0..256).map(|i| {
            let c = client.clone();
            let kv = kv.clone();
            async move {
                let block = key(&kv, &format!("k{i}"), 0);
                c.unary(get, Request::new(&block)).await
            }
        });
        let all = timeout(BOUND, futures_util::future::join_all(calls)).await.expect("in time");
        assert!(all.iter().all(Result::is_ok), "{:?}", all.iter().find(|r| r.is_err()));
        let stats = engine.registry.all();
        let out: u64 = stats.iter().map(|a| a.stats.outbound_calls.load(Ordering::Relaxed)).sum();
        assert_eq!(out, 1 + 1 + 1 + 1 + 256, "every call went through the engine");
    });
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn targets_the_engine_does_not_allow_refuse_the_attachment() {
    let kv = schema("kv.proto", PROTO);
    let d = dir("allow");
    runtime().block_on(async {
        let mut config = protoplane_engine::Config {
            attach: d.join("engine.sock"),
            half_mb: 4,
            ..protoplane_engine::Config::default()
        };
        config.outbound.allow = vec!["dns:///allowed.internal:*".into()];
        let _engine = protoplane_engine::start(config).await.expect("engine");
        let mut app = protoplane_app::attach(d.join("engine.sock"));
        let _ch = app.channel("127.0.0.1:1", &kv);
        let r = timeout(BOUND, app.run()).await.expect("refused in time");
        let why = r.expect_err("refused").to_string();
        assert!(why.contains("not allowed") && why.contains("127.0.0.1:1"), "{why}");
    });
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn calls_beyond_max_calls_fail_resource_exhausted() {
    let kv = schema("kv.proto", PROTO);
    let d = dir("max");
    runtime().block_on(async {
        let (addr, _) = backend(&kv).await;
        let mut config = protoplane_engine::Config {
            attach: d.join("engine.sock"),
            half_mb: 4,
            ..protoplane_engine::Config::default()
        };
        config.budgets.max_outbound = 4;
        let _engine = protoplane_engine::start(config).await.expect("engine");
        let mut app = protoplane_app::attach(d.join("engine.sock"));
        let ch = app.channel(&addr, &kv);
        tokio::spawn(app.run());
        until_ready(&ch).await;
        let client = Client::new(ch, kv.clone());
        let get = kv.method_id("/kv.Kv/Get").expect("Get");
        // Four slow calls hold the limit; the fifth is refused at once.
        let slow: Vec<_> = (0..4)
            .map(|_| {
                let c = client.clone();
                let kv = kv.clone();
                tokio::spawn(async move {
                    let block = key(&kv, "slow", SLOW);
                    let mut req = Request::new(&block);
                    req.deadline = Some(Instant::now() + Duration::from_secs(2));
                    c.unary(get, req).await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let block = key(&kv, "x", 0);
        let st = timeout(BOUND, client.unary(get, Request::new(&block))).await.expect("in time");
        let st = st.expect_err("over the limit");
        assert_eq!(st.code, Code::ResourceExhausted, "{st:?}");
        assert!(st.message.contains("max_calls"), "{}", st.message);
        for t in slow {
            let st = t.await.expect("joined").expect_err("late");
            assert_eq!(st.code, Code::DeadlineExceeded);
        }
        // The limit is free again.
        let block = key(&kv, "abc", 0);
        timeout(BOUND, client.unary(get, Request::new(&block)))
            .await
            .expect("in time")
            .expect("ok");
    });
    let _ = std::fs::remove_dir_all(&d);
}
