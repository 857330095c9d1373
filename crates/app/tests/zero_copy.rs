//! Zero copy across the split, counted: an engine and an attached
//! application in this process, a handler that echoes a 100 KB `bytes`
//! field, gRPC and lean clients.
//!
//! * Request side: the handler reads the field where the engine put the
//!   request's wire bytes (a view of the region, checked by address), and
//!   the engine decoded each request straight into the region. Over lean,
//!   the wire bytes themselves were received into the region and never
//!   copied (but for frames that arrived across the end of a receive
//!   chunk, counted); over gRPC they were copied once, out of h2's
//!   receive buffer.
//! * Response side: the handler's builder laid every response out in the
//!   application's half of the region (`Block::is_lent`), the application
//!   posted each one where it was built (no byte copied by the
//!   application), and the engine copied each out once (it never reads an
//!   application's memory in place: the application could change it under
//!   the engine's checks) and encoded the copy.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::lean::client::LeanChannel;
use protoplane_rpc::{CallOptions, Channel};
use protoplane_schema::ProtoSource;
use protoplane_wire::{Builder, Value};

const PROTO: &str = r#"
syntax = "proto3";
package zc;
message Blob { bytes data = 1; uint32 copies = 2; }
service Copy {
  rpc Echo(Blob) returns (Blob);
  rpc Fan(Blob) returns (stream Blob);
}
"#;

/// What the handler saw.
#[derive(Default)]
struct Seen {
    requests: AtomicU64,
    /// Requests whose `data` lies inside their wire bytes (read in place).
    read_in_place: AtomicU64,
    responses: AtomicU64,
    /// Responses whose block the builder laid out in lent (region) memory.
    built_in_region: AtomicU64,
}

struct Echo {
    schema: Arc<Schema>,
    seen: Arc<Seen>,
}

impl Service for Echo {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "zc.Copy"
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        request: Request<Streaming>,
        mut responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        let _ = method;
        Box::pin(async move {
            let mut requests = request.message;
            let m = requests.single().await?;
            let ts = self.schema.tables();
            let view = m.view(ts)?;
            let data = match view.by_number(1)? {
                Some(Value::Bytes(b)) => b,
                _ => &[][..],
            };
            let copies = match view.by_number(2)? {
                Some(Value::U32(n)) => n.max(1),
                _ => 1,
            };
            self.seen.requests.fetch_add(1, Ordering::Relaxed);
            let wire = m.wire().as_ptr_range();
            let d = data.as_ptr_range();
            if !data.is_empty() && d.start >= wire.start && d.end <= wire.end {
                self.seen.read_in_place.fetch_add(1, Ordering::Relaxed);
            }
            for _ in 0..copies {
                let mut b = Builder::new(ts, responder.output_type())
                    .map_err(|e| Status::new(Code::Internal, e.to_string()))?;
                b.set(b.root(), 1, Value::Bytes(data))
                    .map_err(|e| Status::new(Code::Internal, e.to_string()))?;
                let block = b.finish();
                self.seen.responses.fetch_add(1, Ordering::Relaxed);
                if block.is_lent() {
                    self.seen.built_in_region.fetch_add(1, Ordering::Relaxed);
                }
                responder.send(block).await?;
            }
            Ok(Metadata::new())
        })
    }
}

/// A `Blob` as protobuf: `data` then `copies`.
fn blob(data: &[u8], copies: u32) -> Vec<u8> {
    protoplane_test_support::wire::Msg::new().bytes(1, data).varint(2, copies.into()).finish()
}

fn sock_path() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pp-zero-copy-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir.join("engine.sock")
}

#[test]
fn no_payload_byte_is_copied_between_the_transport_and_the_handler() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let src = [ProtoSource { name: "zc.proto", text: PROTO }];
    let schema = Arc::new(Schema::from_proto_sources(&src, &["zc.proto"]).expect("schema"));
    let seen = Arc::new(Seen::default());
    let path = sock_path();

    rt.block_on(async {
        let config = protoplane_engine::Config {
            grpc: Some("127.0.0.1:0".parse().expect("addr")),
            lean_tcp: Some("127.0.0.1:0".parse().expect("addr")),
            attach: path.clone(),
            schemas: vec![schema.clone()],
            half_mb: 16,
            ..protoplane_engine::Config::default()
        };
        let engine = protoplane_engine::start(config).await.expect("engine");
        let app = protoplane_app::attach(&path)
            .service(Arc::new(Echo { schema: schema.clone(), seen: seen.clone() }));
        let app_stats = app.stats();
        tokio::spawn(app.run());
        let until = Instant::now() + Duration::from_secs(10);
        let att = loop {
            if let Some(a) = engine.registry.pick("zc.Copy") {
                break a;
            }
            assert!(Instant::now() < until, "the application did not attach");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };

        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let (mut requests, mut wire_bytes, mut responses) = (0u64, 0u64, 0u64);
        let opts = CallOptions { timeout: Some(Duration::from_secs(10)), ..CallOptions::default() };

        // gRPC: unary, then server streaming with three responses.
        let grpc =
            Channel::connect(&engine.grpc.expect("grpc").to_string()).await.expect("connect");
        for (path, copies) in [("/zc.Copy/Echo", 1), ("/zc.Copy/Fan", 3)] {
            for _ in 0..5 {
                let req = blob(&data, copies);
                let mut call = grpc.start(path, opts.clone()).await.expect("start");
                call.send(&req).await.expect("send");
                call.close_send();
                let mut got = 0;
                while let Some(resp) = call.recv().await.expect("recv") {
                    assert_eq!(resp, blob(&data, 0)[..resp.len()], "echoed data");
                    got += 1;
                }
                assert_eq!(call.finish_status().await.code, Code::Ok);
                assert_eq!(got, copies);
                requests += 1;
                wire_bytes += req.len() as u64;
                responses += copies as u64;
            }
        }

        // gRPC's receive buffers are h2's: each request's wire bytes are
        // copied into the region once (until protoplane has an HTTP/2
        // transport of its own).
        assert_eq!(att.stats.request_bytes_copied.load(Ordering::Relaxed), wire_bytes);
        let grpc_requests = requests;

        // Lean: the reader receives into the region, so nothing is copied:
        // one call at a time (each request lands whole in a landing).
        let lean = LeanChannel::connect(&engine.lean.expect("lean").to_string())
            .await
            .expect("lean connect");
        for _ in 0..5 {
            let req = blob(&data, 1);
            let resp = lean.unary("/zc.Copy/Echo", &req, &opts).await.expect("lean call");
            assert_eq!(resp, blob(&data, 0)[..resp.len()]);
            requests += 1;
            responses += 1;
        }
        assert_eq!(
            att.stats.request_bytes_copied.load(Ordering::Relaxed),
            wire_bytes,
            "lean requests received in place are not copied"
        );
        assert_eq!(att.stats.requests_received_in_place.load(Ordering::Relaxed), 5);

        // Pipelined: many requests share a landing, and a frame that
        // arrives across a landing's end moves to the next one (the only
        // bytes the lean path copies, counted).
        let small: Vec<u8> = data[..3000].to_vec();
        let calls = (0..64).map(|_| {
            let lean = lean.clone();
            let (req, opts) = (blob(&small, 1), opts.clone());
            async move { lean.unary("/zc.Copy/Echo", &req, &opts).await }
        });
        for resp in futures_util::future::join_all(calls).await {
            let resp = resp.expect("pipelined lean call");
            assert_eq!(resp, blob(&small, 0)[..resp.len()]);
            requests += 1;
            responses += 1;
        }
        let moved = att.stats.request_bytes_copied.load(Ordering::Relaxed) - wire_bytes;
        assert!(moved < 64 * 3000 / 2, "{moved} bytes moved between landings");
        assert_eq!(att.stats.requests_received_in_place.load(Ordering::Relaxed), 5 + 64);
        let lean_requests = requests - grpc_requests;
        wire_bytes += moved;

        // The handler read every request in place and built every
        // response in the region.
        assert_eq!(seen.requests.load(Ordering::Relaxed), requests);
        assert_eq!(seen.read_in_place.load(Ordering::Relaxed), requests);
        assert_eq!(seen.responses.load(Ordering::Relaxed), responses);
        assert_eq!(seen.built_in_region.load(Ordering::Relaxed), responses);
        // The application posted every response where it was built.
        assert_eq!(app_stats.responses.load(Ordering::Relaxed), responses);
        assert_eq!(app_stats.responses_in_place.load(Ordering::Relaxed), responses);
        assert_eq!(app_stats.response_bytes_copied.load(Ordering::Relaxed), 0);
        // The engine decoded every request in place; it copied the wire
        // bytes of each gRPC request (out of h2's buffer), no lean bytes
        // but those moved between landings.
        assert_eq!(att.stats.requests_in_place.load(Ordering::Relaxed), requests);
        assert_eq!(att.stats.requests_received_in_place.load(Ordering::Relaxed), lean_requests);
        assert_eq!(att.stats.request_bytes_copied.load(Ordering::Relaxed), wire_bytes);
        // One copy per descriptor with bytes, out of the application's
        // half: every response, and the few headers and statuses that
        // carry side sections.
        let copied = att.stats.responses_copied_out.load(Ordering::Relaxed);
        assert!((responses..2 * responses).contains(&copied), "{copied} of {responses}");
    });
    let _ = std::fs::remove_dir_all(path.parent().expect("dir"));
}
