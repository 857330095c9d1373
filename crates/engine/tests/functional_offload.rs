//! Functional offload: methods answered inside the engine, never crossing
//! to the attached application. An engine and an application in this
//! process, the social-network schema, gRPC clients.
//!
//! * `Login` offloaded to the built-in `login-token` handler: every call
//!   is answered correctly (byte for byte what the application answers,
//!   checked against a second engine that forwards `Login`), the
//!   application's handler never runs and no call of it is opened with the
//!   application, while `RegisterUser` still goes to the application.
//! * Handlers registered in code: an error is the call's status, a
//!   request that does not decode is INVALID_ARGUMENT, a panic is INTERNAL
//!   and the engine keeps serving.
//! * Configurations the engine cannot honour are refused at start.
//! * Oversized requests reach the application undecoded.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protoplane_engine::{Config, OffloadRequest, Offloaded, Running};
use protoplane_grpc::{
    BoxFuture, Code, Message, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::Channel;
use protoplane_wire::{Block, Builder, Decoder, Value};
use tokio::time::timeout;

mod common;

use common::{len_field, runtime, unary, varint, BOUND};

const SERVICE: &str = "socialnetwork.SocialNetwork";
const LOGIN: &str = "/socialnetwork.SocialNetwork/Login";
const REGISTER: &str = "/socialnetwork.SocialNetwork/RegisterUser";
const COMPOSE_MEDIA: &str = "/socialnetwork.SocialNetwork/ComposeMedia";

fn schema() -> Arc<Schema> {
    common::social_schema()
}

/// The application's side: the social network's handlers (as in
/// `examples/socialnetwork`), counting each method's calls.
struct App {
    schema: Arc<Schema>,
    /// Calls each method's handler ran, by method id.
    calls: Vec<AtomicU64>,
    /// Requests that arrived undecoded (the handler decoded them).
    raw: AtomicU64,
}

impl App {
    fn new(schema: &Arc<Schema>) -> Arc<App> {
        let calls = (0..schema.methods().len()).map(|_| AtomicU64::new(0)).collect();
        Arc::new(App { schema: schema.clone(), calls, raw: AtomicU64::new(0) })
    }

    fn calls(&self, path: &str) -> u64 {
        let id = self.schema.method_id(path).expect("method");
        self.calls[id as usize].load(Ordering::Relaxed)
    }

    fn handle(&self, method: u32, m: &Message) -> Result<Block, Status> {
        let ts = self.schema.tables();
        let desc = self.schema.method(method).expect("method");
        let view = m.view(ts)?;
        let mut b = Builder::new(ts, desc.output)?;
        if desc.name == "Login" {
            // The example application's answer.
            let req_id = view.by_name("req_id")?.and_then(|v| v.as_i128()).unwrap_or(0);
            let username = view.by_name("username")?.and_then(|v| v.as_str()).unwrap_or("");
            let token = format!("t{req_id}-{username}");
            b.set(b.root(), 1, Value::String(token.as_bytes()))?;
        }
        Ok(b.finish())
    }
}

impl Service for App {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        SERVICE
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        request: Request<Streaming>,
        mut responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            let mut requests = request.message;
            let mut m = requests.single().await?;
            self.calls[method as usize].fetch_add(1, Ordering::Relaxed);
            if m.is_raw() {
                // Handed over as received: decode it here.
                self.raw.fetch_add(1, Ordering::Relaxed);
                let (wire, ty) = (m.wire().clone(), m.type_index());
                m = Message::decode(self.schema.tables(), ty, wire, &mut Decoder::new())
                    .map_err(protoplane_grpc::call::invalid_request)?;
            }
            let block = self.handle(method, &m)?;
            responder.send(block).await?;
            Ok(Metadata::new())
        })
    }
}

/// A `LoginRequest` (also the first fields of a `RegisterUserRequest`:
/// `req_id` = 1, and field 2 a string).
fn login(req_id: i64, username: &str, password: &str) -> Vec<u8> {
    let mut out = vec![0x08];
    varint(&mut out, req_id as u64);
    len_field(&mut out, 2, username);
    len_field(&mut out, 3, password);
    let mut carrier = Vec::new();
    len_field(&mut carrier, 1, "trace");
    len_field(&mut carrier, 2, "abc");
    varint(&mut out, 4 << 3 | 2);
    varint(&mut out, carrier.len() as u64);
    out.extend_from_slice(&carrier);
    out
}

/// A `RegisterUserRequest`.
fn register(req_id: i64, first_name: &str) -> Vec<u8> {
    let mut out = vec![0x08];
    varint(&mut out, req_id as u64);
    len_field(&mut out, 2, first_name);
    len_field(&mut out, 4, "user");
    out
}

/// A `ComposeMediaRequest`.
fn compose_media(req_id: i64) -> Vec<u8> {
    let mut out = vec![0x08];
    varint(&mut out, req_id as u64);
    len_field(&mut out, 2, "png");
    out
}

/// The `token` of an encoded `LoginReply`.
fn token(schema: &Schema, reply: &[u8]) -> String {
    let ty = schema.method(schema.method_id(LOGIN).expect("login")).expect("login").output;
    let m = Message::decode(schema.tables(), ty, reply.to_vec().into(), &mut Decoder::new())
        .expect("a LoginReply");
    let view = m.view(schema.tables()).expect("view");
    let t = view.by_name("token").expect("token").and_then(|v| v.as_str()).unwrap_or("");
    t.to_string()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pp-offload-{name}-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d
}

fn config(schema: &Arc<Schema>, attach: PathBuf) -> Config {
    Config {
        grpc: Some("127.0.0.1:0".parse().expect("addr")),
        attach,
        schemas: vec![schema.clone()],
        half_mb: 4,
        ring_slots: 64,
        ..Config::default()
    }
}

/// Starts `config`'s engine and attaches `app` to it: the engine, a gRPC
/// channel to it, and the application library's counters.
async fn engine_with(
    config: Config,
    app: &Arc<App>,
) -> (Running, Channel, Arc<protoplane_app::Stats>) {
    let path = config.attach.clone();
    let engine = protoplane_engine::start(config).await.expect("engine");
    let a = protoplane_app::attach(&path).service(app.clone());
    let stats = a.stats();
    tokio::spawn(a.run());
    let until = Instant::now() + BOUND;
    while engine.registry.pick(SERVICE).is_none() {
        assert!(Instant::now() < until, "the application did not attach");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let addr = engine.grpc.expect("grpc").to_string();
    let ch = timeout(BOUND, Channel::connect(&addr)).await.expect("in time").expect("connect");
    (engine, ch, stats)
}

#[test]
fn login_is_answered_in_the_engine_and_never_reaches_the_application() {
    const N: i64 = 50;
    const M: u64 = 7;
    let schema = schema();
    let d = dir("login");
    runtime().block_on(async {
        // Offloaded, as the configuration file says it.
        let mut c = config(&schema, d.join("offload.sock"));
        c.apply_toml("[offload]\nmethods = [\"/socialnetwork.SocialNetwork/Login\"]\n", &d)
            .expect("config");
        let app = App::new(&schema);
        let (engine, ch, app_stats) = engine_with(c, &app).await;
        // The same service, Login forwarded: what the application answers.
        let forwarding = App::new(&schema);
        let (_plain, plain_ch, _) =
            engine_with(config(&schema, d.join("plain.sock")), &forwarding).await;
        let att = engine.registry.pick(SERVICE).expect("attached");

        for i in 0..N {
            let user = format!("user{i}");
            let req = login(i * 1000 + 7, &user, "pw");
            let (st, reply) = unary(&ch, LOGIN, &req).await;
            assert_eq!(st.code, Code::Ok, "{st:?}");
            let reply = reply.expect("a reply");
            assert_eq!(token(&schema, &reply), format!("t{}-{user}", i * 1000 + 7));
            let (st, from_app) = unary(&plain_ch, LOGIN, &req).await;
            assert_eq!(st.code, Code::Ok, "{st:?}");
            assert_eq!(from_app.as_deref(), Some(&reply[..]), "the engine answers as the app");
        }
        assert_eq!(forwarding.calls(LOGIN), N as u64, "the comparison reached its application");

        // Nothing of it crossed: the handler never ran, the application
        // posted no response, no call was opened with it.
        assert_eq!(app.calls(LOGIN), 0);
        assert_eq!(app_stats.responses.load(Ordering::Relaxed), 0);
        assert_eq!(att.stats.calls.load(Ordering::Relaxed), 0);
        assert_eq!(att.stats.received.load(Ordering::Relaxed), 0);
        let counters = &engine.counters;
        assert_eq!(counters.to_app(LOGIN), 0);
        assert_eq!(counters.answered_in_engine(LOGIN), N as u64);
        let login_stats = counters.get(LOGIN).expect("Login's counters");
        assert_eq!(login_stats.offloaded.load(Ordering::Relaxed), N as u64);

        // Other methods still go to the application.
        for i in 0..M {
            let (st, reply) = unary(&ch, REGISTER, &register(i as i64, "Ada")).await;
            assert_eq!(st.code, Code::Ok, "{st:?}");
            assert_eq!(reply.as_deref(), Some(&[][..]), "an Empty");
        }
        assert_eq!(app.calls(REGISTER), M);
        assert_eq!(counters.to_app(REGISTER), M);
        assert_eq!(counters.answered_in_engine(REGISTER), 0);
        assert_eq!(att.stats.calls.load(Ordering::Relaxed), M);
        assert_eq!(app_stats.responses.load(Ordering::Relaxed), M);
        assert_eq!(app.calls(LOGIN), 0);
        assert_eq!(counters.to_app(LOGIN), 0);
    });
    let _ = std::fs::remove_dir_all(d);
}

/// Login, checking the password: `secret` only.
struct Checked;

impl Offloaded for Checked {
    fn call(&self, r: &OffloadRequest<'_>) -> Result<Block, Status> {
        let pw = r.view.by_name("password")?.and_then(|v| v.as_str()).unwrap_or("");
        if pw != "secret" {
            return Err(Status::new(Code::Unauthenticated, "wrong password"));
        }
        let user = r.view.by_name("username")?.and_then(|v| v.as_str()).unwrap_or("");
        let mut b = r.builder()?;
        b.set(b.root(), 1, Value::String(format!("ok-{user}").as_bytes()))?;
        Ok(b.finish())
    }
}

/// Panics on every call.
struct Panics;

impl Offloaded for Panics {
    fn call(&self, _: &OffloadRequest<'_>) -> Result<Block, Status> {
        panic!("an offloaded handler's bug");
    }
}

#[test]
fn errors_bad_requests_and_panics_become_statuses() {
    let schema = schema();
    let d = dir("errors");
    runtime().block_on(async {
        let mut c = config(&schema, d.join("engine.sock"));
        c.offload.register(LOGIN, Arc::new(Checked)).register(COMPOSE_MEDIA, Arc::new(Panics));
        let app = App::new(&schema);
        let (engine, ch, _) = engine_with(c, &app).await;
        let counters = engine.counters.clone();

        // A handler's error is the call's status.
        let (st, reply) = unary(&ch, LOGIN, &login(1, "eve", "guess")).await;
        assert_eq!((st.code, st.message.as_str()), (Code::Unauthenticated, "wrong password"));
        assert!(reply.is_none());
        let (st, reply) = unary(&ch, LOGIN, &login(2, "ann", "secret")).await;
        assert_eq!(st.code, Code::Ok, "{st:?}");
        assert_eq!(token(&schema, &reply.expect("a reply")), "ok-ann");

        // Bytes that do not decode: a length running past the end, a
        // string that is not UTF-8, a tag cut short.
        for bad in [&[0x12, 0x05, b'a'][..], &[0x12, 0x01, 0xff][..], &[0xff][..]] {
            let (st, _) = unary(&ch, LOGIN, bad).await;
            assert_eq!(st.code, Code::InvalidArgument, "{bad:?}: {st:?}");
        }

        // A panic is INTERNAL, and the engine keeps serving.
        for i in 0..3 {
            let (st, _) = unary(&ch, COMPOSE_MEDIA, &compose_media(i)).await;
            assert_eq!(st.code, Code::Internal, "{st:?}");
            assert!(st.message.contains("panicked"), "{st:?}");
            let (st, _) = unary(&ch, LOGIN, &login(i, "bob", "secret")).await;
            assert_eq!(st.code, Code::Ok, "{st:?}");
            let (st, _) = unary(&ch, REGISTER, &register(i, "bob")).await;
            assert_eq!(st.code, Code::Ok, "{st:?}");
        }

        let login_stats = counters.get(LOGIN).expect("counters");
        assert_eq!(login_stats.offloaded.load(Ordering::Relaxed), 4);
        assert_eq!(login_stats.offload_errors.load(Ordering::Relaxed), 1);
        assert_eq!(login_stats.offload_invalid.load(Ordering::Relaxed), 3);
        let media = counters.get(COMPOSE_MEDIA).expect("counters");
        assert_eq!(media.offload_panics.load(Ordering::Relaxed), 3);
        // None of it reached the application; RegisterUser did.
        assert_eq!(app.calls(LOGIN) + app.calls(COMPOSE_MEDIA), 0);
        assert_eq!(counters.to_app(LOGIN) + counters.to_app(COMPOSE_MEDIA), 0);
        assert_eq!(app.calls(REGISTER), 3);
        assert_eq!(counters.to_app(REGISTER), 3);
    });
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn offloaded_methods_are_answered_with_no_application_attached() {
    let schema = schema();
    let d = dir("alone");
    runtime().block_on(async {
        let mut c = config(&schema, d.join("engine.sock"));
        c.offload.offload(LOGIN);
        let engine = protoplane_engine::start(c).await.expect("engine");
        let addr = engine.grpc.expect("grpc").to_string();
        let ch = timeout(BOUND, Channel::connect(&addr)).await.expect("in time").expect("connect");
        let (st, reply) = unary(&ch, LOGIN, &login(9, "solo", "")).await;
        assert_eq!(st.code, Code::Ok, "{st:?}");
        assert_eq!(token(&schema, &reply.expect("a reply")), "t9-solo");
        let (st, _) = unary(&ch, REGISTER, &register(1, "x")).await;
        assert_eq!(st.code, Code::Unimplemented, "no application ever served it: {st:?}");
    });
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn configurations_the_engine_cannot_honour_are_refused() {
    let schema = schema();
    let d = dir("refused");
    runtime().block_on(async {
        let refused = |toml: &'static str| {
            let (schema, d) = (schema.clone(), d.clone());
            async move {
                let mut c = config(&schema, d.join("engine.sock"));
                if let Err(e) = c.apply_toml(toml, &d) {
                    return e;
                }
                protoplane_engine::start(c).await.expect_err("refused")
            }
        };
        let e = refused("[offload]\nmethods = [\"/socialnetwork.SocialNetwork/Logout\"]").await;
        assert!(matches!(&e, protoplane_engine::Error::Offload(s) if s.contains("no schema of the engine has method")), "{e}");
        let e = refused("[offload]\nmethods = [\"/socialnetwork.SocialNetwork/StorePost\"]").await;
        assert!(matches!(&e, protoplane_engine::Error::Offload(s) if s.contains("no handler registered")), "{e}");
        let e =
            refused("[offload.handlers]\n\"/socialnetwork.SocialNetwork/StorePost\" = \"x\"").await;
        assert!(matches!(&e, protoplane_engine::Error::Config(s) if s.contains("no built-in handler")), "{e}");
        let e = refused(
            "[offload.handlers]\n\"/socialnetwork.SocialNetwork/StorePost\" = \"login-token\"",
        )
        .await;
        assert!(matches!(&e, protoplane_engine::Error::Offload(s) if s.contains("has no field")), "{e}");
        let e = refused("[offload]\nmethods = [\"Login\"]").await;
        assert!(matches!(&e, protoplane_engine::Error::Config(s) if s.contains("not a method path")), "{e}");
        let e = refused("[offload]\nmethod = []").await;
        assert!(matches!(&e, protoplane_engine::Error::Config(s) if s.contains("unknown key offload.method")), "{e}");

        // A built-in by name for a method of the right shape is accepted.
        let mut c = config(&schema, d.join("ok.sock"));
        c.apply_toml(
            "[offload.handlers]\n\"/socialnetwork.SocialNetwork/StorePost\" = \"empty\"",
            &d,
        )
        .expect("config");
        protoplane_engine::start(c).await.expect("an empty reply fits any method");
    });
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn oversized_requests_reach_the_application_undecoded() {
    let schema = schema();
    let d = dir("raw");
    runtime().block_on(async {
        let mut c = config(&schema, d.join("engine.sock"));
        c.apply_toml("[offload]\nraw_above = 1024", &d).expect("config");
        let app = App::new(&schema);
        let (engine, ch, _) = engine_with(c, &app).await;

        let (st, _) = unary(&ch, REGISTER, &register(1, "small")).await;
        assert_eq!(st.code, Code::Ok, "{st:?}");
        assert_eq!(app.raw.load(Ordering::Relaxed), 0, "decoded by the engine");

        let big = "x".repeat(4096);
        let (st, _) = unary(&ch, REGISTER, &register(2, &big)).await;
        assert_eq!(st.code, Code::Ok, "{st:?}");
        assert_eq!(app.raw.load(Ordering::Relaxed), 1, "handed over as received");
        // Login too (the application's answer, from a request it decoded).
        let (st, reply) = unary(&ch, LOGIN, &login(3, &big, "")).await;
        assert_eq!(st.code, Code::Ok, "{st:?}");
        assert_eq!(token(&schema, &reply.expect("a reply")), format!("t3-{big}"));
        assert_eq!(app.raw.load(Ordering::Relaxed), 2);

        // Undecoded, so the engine does not check it: the application
        // does, with the same status.
        let mut bad = register(4, &big);
        bad.extend_from_slice(&[0x12, 0x7f]);
        let (st, _) = unary(&ch, REGISTER, &bad).await;
        assert_eq!(st.code, Code::InvalidArgument, "{st:?}");

        assert_eq!(
            engine.counters.get(REGISTER).expect("counters").raw_to_app.load(Ordering::Relaxed),
            2
        );
        assert_eq!(
            engine.counters.get(LOGIN).expect("counters").raw_to_app.load(Ordering::Relaxed),
            1
        );
    });
    let _ = std::fs::remove_dir_all(d);
}
