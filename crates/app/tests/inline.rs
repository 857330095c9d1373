//! The drain loop's run-to-completion paths, with the application on a
//! single-threaded runtime (as `App::serve` and `protoplane serve
//! --attach` run it), where a unary handler that does not wait runs in
//! the drain loop itself and its answer is posted before the next
//! descriptor is taken:
//! * an answer at once, and an error with trailers at once;
//! * a handler that waits (a timer, explicit headers and then a release
//!   from the test) goes on as a task with the same future;
//! * a handler that panics fails its call INTERNAL and the application
//!   goes on serving;
//! * a handler that waits past the client's deadline: DEADLINE_EXCEEDED;
//! * hundreds of calls of every kind at once all get their own answers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::{CallOptions, Channel};
use protoplane_schema::ProtoSource;
use protoplane_wire::{Builder, Value};
use tokio::sync::Notify;
use tokio::time::timeout;

const PROTO: &str = r#"
syntax = "proto3";
package inl;
message Req { int32 mode = 1; int32 n = 2; }
message Resp { bytes body = 1; }
service Svc {
  rpc Unary(Req) returns (Resp);
}
"#;

const NOW: i32 = 1;
const LATER: i32 = 2;
const PANIC: i32 = 3;
const HEADERS_THEN_WAIT: i32 = 4;
const SLOW: i32 = 5;
const FAIL_NOW: i32 = 6;

const BOUND: Duration = Duration::from_secs(10);

struct Svc {
    schema: Arc<Schema>,
    release: Arc<Notify>,
}

impl Service for Svc {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "inl.Svc"
    }

    fn call(
        self: Arc<Self>,
        _method: u32,
        request: Request<Streaming>,
        mut out: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            let mut requests = request.message;
            let m = requests.single().await?;
            let v = m.view(self.schema.tables())?;
            let mode = v.by_number(1)?.and_then(|x| x.as_i128()).unwrap_or(0) as i32;
            let n = v.by_number(2)?.and_then(|x| x.as_i128()).unwrap_or(0);
            match mode {
                LATER => tokio::time::sleep(Duration::from_millis(2)).await,
                PANIC => panic!("a handler that panics (expected by the test)"),
                HEADERS_THEN_WAIT => {
                    let _ = out.metadata_mut().insert("x-early", "yes");
                    out.send_headers().await?;
                    self.release.notified().await;
                }
                SLOW => tokio::time::sleep(Duration::from_secs(30)).await,
                FAIL_NOW => {
                    let mut st = Status::new(Code::Aborted, "at once");
                    let _ = st.metadata.insert("x-trailer", "t");
                    return Err(st);
                }
                _ => {}
            }
            let body = format!("{mode}:{n}");
            let mut b = Builder::new(self.schema.tables(), out.output_type())?;
            b.set(b.root(), 1, Value::Bytes(body.as_bytes()))?;
            out.send(b.finish()).await?;
            Ok(Metadata::new())
        })
    }
}

/// The request `mode`, `n` as wire bytes.
fn req(mode: i32, n: i32) -> Vec<u8> {
    let mut v = vec![0x08, mode as u8, 0x10];
    let mut n = n as u32;
    while n >= 0x80 {
        v.push((n as u8) | 0x80);
        n >>= 7;
    }
    v.push(n as u8);
    v
}

/// The call's body (`mode:n`), or its status.
async fn unary(ch: &Channel, mode: i32, n: i32, deadline: Duration) -> Result<String, Status> {
    let opts = CallOptions { timeout: Some(deadline), ..CallOptions::default() };
    let mut c = ch.start("/inl.Svc/Unary", opts).await?;
    c.send(&req(mode, n)).await?;
    c.close_send();
    let mut body = None;
    while let Some(m) = c.recv().await? {
        // field 1, bytes: tag, length, text.
        body = Some(String::from_utf8_lossy(&m[2..]).into_owned());
    }
    let st = c.finish_status().await;
    match (st.code, body) {
        (Code::Ok, Some(b)) => Ok(b),
        (Code::Ok, None) => Err(Status::new(Code::Internal, "OK without a response")),
        _ => Err(st),
    }
}

#[test]
fn handlers_run_to_completion_in_the_drain_loop_or_go_on_as_tasks() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let src = [ProtoSource { name: "inl.proto", text: PROTO }];
    let schema = Arc::new(Schema::from_proto_sources(&src, &["inl.proto"]).expect("schema"));
    let dir = std::env::temp_dir().join(format!("pp-app-inline-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let sock = dir.join("engine.sock");
    let release = Arc::new(Notify::new());

    rt.block_on(async {
        let config = protoplane_engine::Config {
            grpc: Some("127.0.0.1:0".parse().expect("addr")),
            attach: sock.clone(),
            schemas: vec![schema.clone()],
            half_mb: 4,
            ..protoplane_engine::Config::default()
        };
        let engine = protoplane_engine::start(config).await.expect("engine");
        // `serve` from a thread outside any runtime: its own
        // single-threaded one, where handlers run in the drain loop.
        let svc = Arc::new(Svc { schema: schema.clone(), release: release.clone() });
        let app = protoplane_app::attach(&sock);
        let stats = app.stats();
        std::thread::spawn(move || app.serve(svc));
        let until = Instant::now() + BOUND;
        while engine.registry.pick("inl.Svc").is_none() {
            assert!(Instant::now() < until, "the application did not attach");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let addr = engine.grpc.expect("grpc").to_string();
        let ch = timeout(BOUND, Channel::connect(&addr)).await.expect("in time").expect("connect");

        // At once, and an error at once (with its trailers).
        assert_eq!(unary(&ch, NOW, 7, BOUND).await.expect("ok"), "1:7");
        let st = unary(&ch, FAIL_NOW, 0, BOUND).await.expect_err("fails");
        assert_eq!((st.code, st.message.as_str()), (Code::Aborted, "at once"));
        assert_eq!(st.metadata.get("x-trailer"), Some("t"));

        // Waits on a timer: a task goes on with the handler.
        assert_eq!(unary(&ch, LATER, 8, BOUND).await.expect("ok"), "2:8");

        // Explicit headers, then a wait for the test's release.
        let opts = CallOptions { timeout: Some(BOUND), ..CallOptions::default() };
        let mut c = ch.start("/inl.Svc/Unary", opts).await.expect("start");
        c.send(&req(HEADERS_THEN_WAIT, 9)).await.expect("send");
        c.close_send();
        let h = timeout(BOUND, c.headers()).await.expect("headers before the release");
        assert_eq!(h.expect("headers").get("x-early"), Some("yes"));
        release.notify_one();
        let m = timeout(BOUND, c.recv()).await.expect("in time").expect("ok").expect("a response");
        assert_eq!(&m[2..], b"4:9");
        assert_eq!(timeout(BOUND, c.finish_status()).await.expect("in time").code, Code::Ok);

        // A panic fails its call, and the application goes on.
        let st = unary(&ch, PANIC, 0, BOUND).await.expect_err("fails");
        assert_eq!((st.code, st.message.as_str()), (Code::Internal, "the handler panicked"));
        assert_eq!(unary(&ch, NOW, 10, BOUND).await.expect("ok"), "1:10");

        // Past its deadline.
        let st = unary(&ch, SLOW, 0, Duration::from_millis(200)).await.expect_err("fails");
        assert_eq!(st.code, Code::DeadlineExceeded, "{st:?}");

        // Many at once, of every kind that answers: each its own answer.
        let calls: Vec<_> = (0..600)
            .map(|i| {
                let ch = ch.clone();
                let mode = [NOW, LATER, FAIL_NOW][i as usize % 3];
                tokio::spawn(async move { (mode, i, unary(&ch, mode, i, BOUND).await) })
            })
            .collect();
        for c in calls {
            let (mode, i, r) = c.await.expect("the call's task");
            match mode {
                FAIL_NOW => assert_eq!(r.expect_err("fails").code, Code::Aborted),
                _ => assert_eq!(r.expect("ok"), format!("{mode}:{i}")),
            }
        }
        // The answers were built in the region and posted in place.
        let placed = stats.responses_in_place.load(std::sync::atomic::Ordering::Relaxed);
        assert!(placed >= 400, "{placed} responses posted in place");
    });
    let _ = std::fs::remove_dir_all(&dir);
}
