//! A rolling upgrade across the split: an engine built with version 1 of a
//! service, and two instances attached at once, one built with version 1
//! and one with version 2 (a field added to the response, the methods
//! declared in another order, a method added). Calls spread over both;
//! each instance reads its requests and lays out its responses with its own
//! tables, and the client gets version 2's new field from the new instance.
//! An instance whose schema reuses a field number with another type is
//! refused, the refusal naming the field.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::{CallOptions, Channel};
use protoplane_schema::ProtoSource;
use protoplane_wire::{Builder, Value};

const V1: &str = r#"
syntax = "proto3";
package kv;
message Key { string name = 1; }
message Value { string name = 1; int64 version = 2; }
service Store {
  rpc Get(Key) returns (Value);
  rpc Put(Value) returns (Key);
}
"#;

/// Version 2: `Value.author` added, `Put` declared first (method ids
/// differ from version 1's), `List` added.
const V2: &str = r#"
syntax = "proto3";
package kv;
message Key { string name = 1; }
message Value { string name = 1; int64 version = 2; string author = 3; }
service Store {
  rpc Put(Value) returns (Key);
  rpc Get(Key) returns (Value);
  rpc List(Key) returns (Value);
}
"#;

/// Incompatible: `Value.version` reused as a string.
const BAD: &str = r#"
syntax = "proto3";
package kv;
message Key { string name = 1; }
message Value { string name = 1; string version = 2; }
service Store {
  rpc Get(Key) returns (Value);
  rpc Put(Value) returns (Key);
}
"#;

const BOUND: Duration = Duration::from_secs(10);

fn schema(text: &str) -> Arc<Schema> {
    let src = [ProtoSource { name: "kv.proto", text }];
    Arc::new(Schema::from_proto_sources(&src, &["kv.proto"]).expect("schema"))
}

/// The store at `version`: Get answers the key's name, its own version
/// and (version 2) an author; Put answers the value's name as a key.
struct Store {
    schema: Arc<Schema>,
    version: i64,
}

impl Service for Store {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "kv.Store"
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        request: Request<Streaming>,
        mut out: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            let mut requests = request.message;
            let m = requests.single().await?;
            let name = match m.view(self.schema.tables())?.by_number(1)? {
                Some(Value::String(s)) => s.to_vec(),
                _ => Vec::new(),
            };
            let which = self.schema.method(method).map(|m| m.name.clone()).unwrap_or_default();
            let mut b = Builder::new(self.schema.tables(), out.output_type())?;
            let root = b.root();
            b.set(root, 1, Value::String(&name))?;
            if which == "Get" {
                b.set(root, 2, Value::I64(self.version))?;
                if self.version == 2 {
                    b.set(root, 3, Value::String(b"v2"))?;
                }
            }
            out.send(b.finish()).await?;
            Ok(Metadata::new())
        })
    }
}

/// The fields of an encoded message: (number, varint value or bytes).
fn fields(mut b: &[u8]) -> Vec<(u32, Result<u64, Vec<u8>>)> {
    fn varint(b: &mut &[u8]) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let x = b[0];
            *b = &b[1..];
            v |= u64::from(x & 0x7f) << shift;
            if x < 0x80 {
                break;
            }
        }
        v
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b);
        let (num, wt) = ((key >> 3) as u32, key & 7);
        if wt == 0 {
            out.push((num, Ok(varint(&mut b))));
        } else {
            let n = varint(&mut b) as usize;
            out.push((num, Err(b[..n].to_vec())));
            b = &b[n..];
        }
    }
    out
}

async fn unary(ch: &Channel, path: &str, request: &[u8]) -> Vec<u8> {
    let opts = CallOptions { timeout: Some(BOUND), ..CallOptions::default() };
    let mut c = ch.start(path, opts).await.expect("start");
    c.send(request).await.expect("send");
    c.close_send();
    let body = c.recv().await.expect("a response").expect("one message");
    assert_eq!(c.finish_status().await.code, Code::Ok, "{path}");
    body.to_vec()
}

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("pp-versions-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d
}

#[test]
fn two_versions_serve_at_once_and_an_incompatible_one_is_refused() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let d = dir();
    let sock = d.join("engine.sock");
    let (v1, v2) = (schema(V1), schema(V2));
    rt.block_on(async {
        let config = protoplane_engine::Config {
            grpc: Some("127.0.0.1:0".parse().expect("addr")),
            attach: sock.clone(),
            schemas: vec![v1.clone()],
            half_mb: 4,
            ..protoplane_engine::Config::default()
        };
        let engine = protoplane_engine::start(config).await.expect("engine");
        for (s, version) in [(v1.clone(), 1), (v2.clone(), 2)] {
            let app = protoplane_app::attach(&sock).service(Arc::new(Store { schema: s, version }));
            tokio::spawn(app.run());
        }
        let until = Instant::now() + BOUND;
        while engine.registry.attached("kv.Store") < 2 {
            assert!(Instant::now() < until, "both versions attach");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        let ch = Channel::connect(&engine.grpc.expect("grpc").to_string()).await.expect("connect");
        let key = [0x0a, 0x01, b'k']; // Key { name: "k" }
        let mut seen = [0usize; 3];
        for _ in 0..40 {
            let f = fields(&unary(&ch, "/kv.Store/Get", &key).await);
            assert_eq!(f[0], (1, Err(b"k".to_vec())), "the request was read: {f:?}");
            match f.get(1) {
                Some((2, Ok(1))) => {
                    assert_eq!(f.len(), 2, "version 1 has no author: {f:?}");
                    seen[1] += 1;
                }
                Some((2, Ok(2))) => {
                    assert_eq!(f.get(2), Some(&(3, Err(b"v2".to_vec()))), "{f:?}");
                    seen[2] += 1;
                }
                other => panic!("unexpected {other:?} in {f:?}"),
            }
        }
        // Put is numbered differently in version 2: it must still reach Put
        // there, which answers a Key (one field), never a Value.
        for _ in 0..8 {
            let value = [0x0a, 0x01, b'p', 0x10, 0x07]; // Value { name: "p", version: 7 }
            let f = fields(&unary(&ch, "/kv.Store/Put", &value).await);
            assert_eq!(f, vec![(1, Err(b"p".to_vec()))], "Put answered a Key");
        }
        assert!(seen[1] > 0 && seen[2] > 0, "calls spread over both versions: {seen:?}");

        // Reusing a field number with another type: refused, naming it.
        let bad = protoplane_app::attach(&sock)
            .service(Arc::new(Store { schema: schema(BAD), version: 3 }));
        let why = match bad.once().await {
            Err(protoplane_app::Error::Refused(why)) => why,
            other => panic!("an incompatible version attached: {other:?}"),
        };
        assert!(why.contains("kv.Value.version") && why.contains("int64"), "{why}");
        assert_eq!(engine.registry.attached("kv.Store"), 2);

        // `serve` called from inside a runtime (the README's
        // `#[tokio::main]` shape) runs its own runtime on a thread of its
        // own instead of panicking; here it returns the refusal.
        let served = protoplane_app::attach(&sock)
            .serve(Arc::new(Store { schema: schema(BAD), version: 3 }));
        assert!(matches!(served, Err(protoplane_app::Error::Refused(_))), "{served:?}");
    });
    let _ = std::fs::remove_dir_all(&d);
}
