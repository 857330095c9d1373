//! An engine that shards its connections over worker threads
//! (`Config::workers`), and applications that attach once per worker:
//! * the application opens one lane (region, rings, doorbell) per worker,
//!   each bound to a worker of its own;
//! * every call stays on the worker its connection was given to: the
//!   calls of each connection are counted on that worker's lane, exactly;
//! * an application that attaches once is served from every worker, and so
//!   is one whose second lane the engine refuses (no seat left).

use std::sync::Arc;
use std::time::{Duration, Instant};

use protoplane_grpc::{
    BoxFuture, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::{CallOptions, Channel};
use protoplane_schema::ProtoSource;
use protoplane_wire::{Builder, Value};
use tokio::time::timeout;

const PROTO: &str = r#"
syntax = "proto3";
package lanes;
message Req { int32 n = 1; }
message Resp { int32 n = 1; }
service Svc {
  rpc Unary(Req) returns (Resp);
}
"#;

const BOUND: Duration = Duration::from_secs(10);

struct Svc {
    schema: Arc<Schema>,
}

impl Service for Svc {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "lanes.Svc"
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
            let n = v.by_number(1)?.and_then(|x| x.as_i128()).unwrap_or(0) as i32;
            let mut b = Builder::new(self.schema.tables(), out.output_type())?;
            b.set(b.root(), 1, Value::I32(n + 1))?;
            out.send(b.finish()).await?;
            Ok(Metadata::new())
        })
    }
}

/// One call with `n`; the answer's `n`.
async fn unary(ch: &Channel, n: u8) -> Result<u8, Status> {
    let opts = CallOptions { timeout: Some(BOUND), ..CallOptions::default() };
    let mut c = ch.start("/lanes.Svc/Unary", opts).await?;
    c.send(&[0x08, n]).await?;
    c.close_send();
    let mut got = None;
    while let Some(m) = c.recv().await? {
        got = m.get(1).copied();
    }
    let st = c.finish_status().await;
    match got {
        Some(n) if st.code == protoplane_grpc::Code::Ok => Ok(n),
        _ => Err(st),
    }
}

/// Runs an engine with two workers and an application (`lanes` or not),
/// opens four client connections one after another (the workers take them
/// in turn: 0, 1, 0, 1) and makes 3, 5, 7 and 11 calls on them; returns
/// the calls each attachment was given, by worker.
fn run(name: &str, lanes: bool, seats: usize) -> Vec<(Option<usize>, u64)> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let src = [ProtoSource { name: "lanes.proto", text: PROTO }];
    let schema = Arc::new(Schema::from_proto_sources(&src, &["lanes.proto"]).expect("schema"));
    let dir = std::env::temp_dir().join(format!("pp-app-lanes-{name}-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let sock = dir.join("engine.sock");
    rt.block_on(async {
        let config = protoplane_engine::Config {
            grpc: Some("127.0.0.1:0".parse().expect("addr")),
            attach: sock.clone(),
            schemas: vec![schema.clone()],
            half_mb: 4,
            workers: 2,
            ..protoplane_engine::Config::default()
        };
        let mut config = config;
        config.admission.max_applications = seats;
        let engine = protoplane_engine::start(config).await.expect("engine");
        let svc = Arc::new(Svc { schema: schema.clone() });
        let app = protoplane_app::attach(&sock).lanes(lanes);
        std::thread::spawn(move || app.serve(svc));
        let want = if lanes { seats.min(2) } else { 1 };
        let until = Instant::now() + BOUND;
        while engine.registry.attached("lanes.Svc") < want {
            assert!(Instant::now() < until, "the application did not attach");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let addr = engine.grpc.expect("grpc").to_string();
        let mut chans = Vec::new();
        for i in 0..4u8 {
            let ch =
                timeout(BOUND, Channel::connect(&addr)).await.expect("in time").expect("connect");
            // Served before the next connection opens: the workers take
            // the connections in a known order.
            assert_eq!(unary(&ch, i).await.expect("first call"), i + 1);
            chans.push(ch);
        }
        for (ch, total) in chans.iter().zip([3u8, 5, 7, 11]) {
            for n in 1..total {
                assert_eq!(unary(ch, 20 + n).await.expect("call"), 21 + n);
            }
        }
        let mut by_lane: Vec<(Option<usize>, u64)> = engine
            .registry
            .all()
            .iter()
            .map(|a| (a.lane(), a.stats.calls.load(std::sync::atomic::Ordering::Relaxed)))
            .collect();
        by_lane.sort();
        let _ = engine.shutdown(Duration::from_secs(1)).await;
        by_lane
    })
}

#[test]
fn each_worker_posts_its_connections_calls_on_its_own_lane() {
    // Connections 0 and 2 on worker 0 (3 + 7 calls), 1 and 3 on worker 1
    // (5 + 11).
    assert_eq!(run("two", true, 64), vec![(Some(0), 10), (Some(1), 16)]);
}

#[test]
fn an_application_that_attaches_once_is_served_from_every_worker() {
    assert_eq!(run("one", false, 64), vec![(Some(0), 26)]);
}

#[test]
fn an_application_whose_second_lane_is_refused_serves_on_its_first() {
    assert_eq!(run("seat", true, 1), vec![(Some(0), 26)]);
}
