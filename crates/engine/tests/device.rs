//! The offload engine in split mode: an engine with compute units and a
//! device-placed field, an application attached over shared memory, gRPC
//! clients. What crosses the rings is checked from both sides.
//!
//! * A device-placed request field reaches the handler as a handle, never
//!   as bytes; a compute unit works on it through the rings; the reply
//!   carries the unit's output by handle and the engine encodes its bytes
//!   (co-serialization). Every reply is checked byte for byte, and every
//!   byte of device memory the calls held is freed when they end.
//! * Hostile control messages: forged handles, unknown slots and kernels,
//!   and raw garbage each get a precise status, and the engine goes on.
//! * A unit that vanishes mid-task: the waiting handler is told at once,
//!   and the unit works again once it is back.
//! * Automatic field updating from the application: `move_to_host` makes
//!   the next request's field arrive as bytes, `move_to_device` as a
//!   handle again.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use protoplane_app::{device_ref, DeviceRef, TaskDescriptor, Units};
use protoplane_engine::{Config, DeviceOptions, Running};
use protoplane_grpc::{
    BoxFuture, Code, Message, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_offload::cu::{Kernel, KernelError, Output, Params};
use protoplane_rpc::Channel;
use protoplane_wire::{Builder, Decoder, Value};
use tokio::time::timeout;

mod common;

use common::{len_field, runtime, BOUND};

const SERVICE: &str = "dev.D";
const CALL: &str = "/dev.D/Call";
const DATA: &str = "dev.Blob.data";

const PROTO: &str = r#"
syntax = "proto3";
package dev;
import "protoplane/options.proto";

message Blob {
  // What the handler does: compress, echo, forge, vanish.
  string op = 1;
  bytes data = 2 [(protoplane.placement) = DEVICE];
}

message Out {
  // The unit's output, by handle (compress) or the request's bytes (echo).
  bytes result = 1;
  // Where the request's data arrived: true for a device handle.
  bool on_device = 2;
  // The kernel that ran, or the status a refused task got.
  string note = 3;
}

service D {
  rpc Call(Blob) returns (Out);
}
"#;

fn schema() -> Arc<Schema> {
    let src = protoplane_schema::ProtoSource { name: "dev.proto", text: PROTO };
    Arc::new(Schema::from_proto_sources(&[src], &["dev.proto"]).expect("the test schema"))
}

/// A user kernel that holds its unit until the gate opens: a task that is
/// still running when its unit vanishes.
#[derive(Debug, Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
    entered: AtomicBool,
}

impl Gate {
    fn release(&self) {
        *self.open.lock().expect("gate") = true;
        self.cv.notify_all();
    }
}

impl Kernel for Gate {
    fn name(&self) -> &str {
        "gate"
    }

    fn run(&self, input: &[u8], _: &Params, out: &mut Output) -> Result<(), KernelError> {
        self.entered.store(true, Ordering::SeqCst);
        let mut open = self.open.lock().expect("gate");
        while !*open {
            open = self.cv.wait(open).expect("gate");
        }
        out.extend_from_slice(input)
    }
}

/// The application: a dynamic handler over the test schema, with the
/// engine's compute units.
struct App {
    schema: Arc<Schema>,
    units: Units,
    gate: Arc<Gate>,
}

impl App {
    async fn handle(&self, m: &Message) -> Result<protoplane_wire::Block, Status> {
        let ts = self.schema.tables();
        let view = m.view(ts)?;
        let op = view.by_name("op")?.and_then(|v| v.as_str()).unwrap_or("").to_owned();
        let data = view.field_named("data").expect("data");
        let handle = view.device_ref_at(data.offset);
        // A device field's bytes are not in this process: reading them is
        // an error, never a read of something else.
        let bytes = match (handle, view.get(data)) {
            (None, got) => got?.and_then(|v| v.as_bytes()).unwrap_or(&[]),
            (Some(_), Err(protoplane_wire::BlockError::NoDeviceRegion)) => &[],
            (Some(_), other) => {
                let why = format!("a device field read as {other:?}");
                return Err(Status::new(Code::Internal, why));
            }
        };

        let out_ty = self.schema.method(0).expect("Call").output;
        let mut b = Builder::new(ts, out_ty)?;
        let result_op = {
            let msg = ts.message(out_ty);
            let i = ts.fields(msg).iter().position(|f| f.number == 1).expect("result");
            ts.ops(msg)[i]
        };
        b.set(b.root(), 2, Value::Bool(handle.is_some()))?;
        match op.as_str() {
            "compress" => {
                let h = handle.ok_or_else(|| Status::new(Code::Internal, "no handle"))?;
                let done = self
                    .units
                    .run(0, TaskDescriptor::new(device_ref(h)).param_u64("level", 6))
                    .await?;
                let out = done.handle();
                b.set_device(b.root(), &result_op, out.offset, out.len)?;
                b.set(b.root(), 3, Value::String(done.kernel.as_bytes()))?;
            }
            "echo" => b.set(b.root(), 1, Value::Bytes(bytes))?,
            "forge" => {
                // Handles no call of this application owns: refused at
                // submit, whatever the slot or kernel.
                let h = handle.ok_or_else(|| Status::new(Code::Internal, "no handle"))?;
                let tries = [
                    DeviceRef::new(h.offset.wrapping_add(h.len), 64),
                    DeviceRef::new(h.offset, h.len.saturating_add(1)),
                    DeviceRef::new(u32::MAX - 8, 64),
                ];
                let mut codes = Vec::new();
                let empty = self.units.run(0, TaskDescriptor::new(DeviceRef::new(h.offset, 0)));
                codes.push(format!("{:?}", empty.await.expect_err("an empty input").code));
                for r in tries {
                    match self.units.run(0, TaskDescriptor::new(r)).await {
                        Ok(_) => return Err(Status::new(Code::Internal, "a forged handle ran")),
                        Err(st) => codes.push(format!("{:?}", st.code)),
                    }
                }
                b.set(b.root(), 3, Value::String(codes.join(",").as_bytes()))?;
            }
            "vanish" => {
                // A task still running when its unit goes away.
                let h = handle.ok_or_else(|| Status::new(Code::Internal, "no handle"))?;
                let t = self.units.submit_task(1, TaskDescriptor::new(device_ref(h))).await?;
                let until = Instant::now() + BOUND;
                while !self.gate.entered.load(Ordering::SeqCst) && Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                self.units.set_available(1, false).await?;
                let st = match self.units.wait(t).await {
                    Ok(_) => return Err(Status::new(Code::Internal, "a vanished unit finished")),
                    Err(st) => st,
                };
                b.set(b.root(), 3, Value::String(format!("{:?}", st.code).as_bytes()))?;
            }
            "crc" => {
                let h = handle.ok_or_else(|| Status::new(Code::Internal, "no handle"))?;
                let done = self.units.run(1, TaskDescriptor::new(device_ref(h))).await?;
                let out = done.handle();
                b.set_device(b.root(), &result_op, out.offset, out.len)?;
            }
            other => return Err(Status::new(Code::InvalidArgument, format!("op {other:?}"))),
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
        _method: u32,
        request: Request<Streaming>,
        mut responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            let mut requests = request.message;
            let m = requests.single().await?;
            let block = self.handle(&m).await?;
            responder.send(block).await?;
            Ok(Metadata::new())
        })
    }
}

fn blob(op: &str, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    len_field(&mut out, 1, op.as_bytes());
    len_field(&mut out, 2, data);
    out
}

/// An `Out`: result, on_device, note.
fn out(schema: &Schema, reply: &[u8]) -> (Vec<u8>, bool, String) {
    let ty = schema.method(0).expect("Call").output;
    let m = Message::decode(schema.tables(), ty, reply.to_vec().into(), &mut Decoder::new())
        .expect("an Out");
    let v = m.view(schema.tables()).expect("view");
    let result = v.by_name("result").expect("result").and_then(|v| v.as_bytes()).unwrap_or(&[]);
    let on = matches!(v.by_name("on_device").expect("on_device"), Some(Value::Bool(true)));
    let note = v.by_name("note").expect("note").and_then(|v| v.as_str()).unwrap_or("");
    (result.to_vec(), on, note.to_owned())
}

/// One call of `Call`: its status and response.
async fn unary(ch: &Channel, req: &[u8]) -> (Status, Option<Vec<u8>>) {
    common::unary(ch, CALL, req).await
}

async fn ok(ch: &Channel, schema: &Schema, req: &[u8]) -> (Vec<u8>, bool, String) {
    let (st, reply) = unary(ch, req).await;
    assert_eq!(st.code, Code::Ok, "{st:?}");
    out(schema, &reply.expect("a reply"))
}

/// Data that compresses, different per call.
fn image(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| ((j / 7 + i * 13) % 251) as u8 ^ (j % 3) as u8).collect()
}

fn inflate(b: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::DeflateDecoder::new(b).read_to_end(&mut out).expect("raw deflate");
    out
}

fn sock(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pp-device-{name}-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d.join("engine.sock")
}

/// Starts the engine (two compute units, the gate kernel registered) with
/// the application attached: the engine, a channel, the app's units.
async fn start(name: &str, gate: Arc<Gate>) -> (Running, Channel, Units) {
    let schema = schema();
    let config = Config {
        grpc: Some("127.0.0.1:0".parse().expect("addr")),
        attach: sock(name),
        schemas: vec![schema.clone()],
        half_mb: 4,
        ring_slots: 64,
        device: DeviceOptions {
            units: 2,
            region_mb: 8,
            kernels: vec![gate.clone()],
            ..Default::default()
        },
        ..Config::default()
    };
    let path = config.attach.clone();
    let engine = protoplane_engine::start(config).await.expect("engine");
    let a = protoplane_app::attach(&path);
    let units = a.units();
    let a = a.service(Arc::new(App { schema, units: units.clone(), gate }));
    tokio::spawn(a.run());
    let until = Instant::now() + BOUND;
    while engine.registry.pick(SERVICE).is_none() {
        assert!(Instant::now() < until, "the application did not attach");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The application's units learn of its session a moment after the
    // engine lists the attachment (a loaded machine showed the gap).
    while matches!(units.get_type(0).await, Err(ref st) if st.code == Code::Unavailable) {
        assert!(Instant::now() < until, "the application's units never saw the session");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let addr = engine.grpc.expect("grpc").to_string();
    let ch = timeout(BOUND, Channel::connect(&addr)).await.expect("in time").expect("connect");
    (engine, ch, units)
}

/// Waits until the engine holds no device memory for calls (they end a
/// little after their replies leave).
async fn drained(engine: &Running) -> u64 {
    let att = engine.registry.pick(SERVICE).expect("attached");
    let dev = att.device().expect("a device").clone();
    let until = Instant::now() + BOUND;
    while dev.held() != 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    dev.held()
}

#[test]
fn a_device_field_is_processed_by_units_and_encoded_by_the_engine() {
    let schema = schema();
    runtime().block_on(async {
        let (engine, ch, units) = start("chain", Arc::default()).await;
        units.program(0, "deflate.compress").await.expect("program");
        assert_eq!(units.get_type(0).await.expect("type").as_deref(), Some("deflate.compress"));
        assert_eq!(units.get_type(1).await.expect("type"), None, "unprogrammed");

        let mut sent = 0u64;
        for (i, len) in [1usize, 100, 4096, 65_536, 300_000].into_iter().enumerate() {
            for k in 0..4 {
                let data = image(i * 4 + k, len);
                let (result, on_device, note) = ok(&ch, &schema, &blob("compress", &data)).await;
                assert!(on_device, "the field arrived as a handle");
                assert_eq!(note, "deflate.compress");
                assert_eq!(inflate(&result), data, "len {len}: the unit's output, encoded");
                sent += data.len() as u64;
            }
        }
        let att = engine.registry.pick(SERVICE).expect("attached");
        let dev = att.device().expect("a device").clone();
        assert_eq!(dev.stats.placed_requests.load(Ordering::Relaxed), 20);
        assert_eq!(dev.stats.device_bytes_in.load(Ordering::Relaxed), sent);
        assert_eq!(dev.stats.encoded_responses.load(Ordering::Relaxed), 20);
        // Requests and outputs alike: all freed with their calls.
        assert_eq!(drained(&engine).await, 0, "device memory left behind");

        // Concurrent calls share the units and the region.
        let mut joins = Vec::new();
        for i in 0..16 {
            let (ch, schema) = (ch.clone(), schema.clone());
            joins.push(tokio::spawn(async move {
                let data = image(100 + i, 20_000 + i * 777);
                let (result, on_device, _) = ok(&ch, &schema, &blob("compress", &data)).await;
                assert!(on_device);
                assert_eq!(inflate(&result), data);
            }));
        }
        for j in joins {
            j.await.expect("a concurrent call");
        }
        assert_eq!(drained(&engine).await, 0, "device memory left behind");
    });
}

#[test]
fn hostile_control_messages_get_precise_errors() {
    let schema = schema();
    runtime().block_on(async {
        let (engine, ch, units) = start("hostile", Arc::default()).await;
        units.program(0, "crc32").await.expect("program");

        // Forged handles, over the rings, from a handler.
        let (_, on_device, codes) = ok(&ch, &schema, &blob("forge", &[7; 1000])).await;
        assert!(on_device);
        assert_eq!(
            codes, "InvalidArgument,FailedPrecondition,FailedPrecondition,FailedPrecondition",
            "every forged range refused at submit"
        );

        // Control operations the engine cannot honour.
        let code = |r: Result<(), Status>| r.expect_err("refused").code;
        assert_eq!(code(units.program(0, "no-such-kernel").await), Code::InvalidArgument);
        assert_eq!(code(units.program(99, "crc32").await), Code::InvalidArgument);
        assert_eq!(units.get_type(99).await.expect_err("no slot").code, Code::InvalidArgument);
        assert_eq!(code(units.set_available(2, false).await), Code::InvalidArgument);
        let place = units.move_to_host("dev.Blob.nothing").await.expect_err("no field");
        assert_eq!(place.code, Code::NotFound);
        let place = units.move_to_device("dev.Blob.op=").await.expect_err("bad entry");
        assert_eq!(place.code, Code::InvalidArgument);
        // Raw bytes no application library would send.
        let att = engine.registry.pick(SERVICE).expect("attached");
        let dev = att.device().expect("a device").clone();
        for garbage in [&[][..], &[0], &[1, 2, 3], &[2], &[7, 0xff], &[1; 40], &[6, 1]] {
            match dev.control(0, garbage, 0) {
                protoplane_engine::device::Taken::Now(a) => {
                    assert_eq!(a.code, Code::InvalidArgument, "{garbage:?}: {}", a.text);
                    assert!(a.text.contains("control message"), "{}", a.text);
                }
                other => panic!("{garbage:?} was taken: {other:?}"),
            }
        }
        assert!(dev.stats.refused.load(Ordering::Relaxed) >= 12);

        // The engine and the units go on.
        assert_eq!(units.get_type(0).await.expect("type").as_deref(), Some("crc32"));
        let (_, on_device, _) = ok(&ch, &schema, &blob("echo", b"still here")).await;
        assert!(on_device);
        assert_eq!(drained(&engine).await, 0);
    });
}

#[test]
fn a_unit_that_vanishes_mid_task_fails_it_at_once_and_comes_back() {
    let schema = schema();
    let gate = Arc::new(Gate::default());
    // Opened however the test ends, so the unit's thread can.
    struct Open(Arc<Gate>);
    impl Drop for Open {
        fn drop(&mut self) {
            self.0.release();
        }
    }
    let _open = Open(gate.clone());
    runtime().block_on(async {
        let (engine, ch, units) = start("vanish", gate.clone()).await;
        units.program(1, "gate").await.expect("program");
        let (_, _, note) = ok(&ch, &schema, &blob("vanish", b"held")).await;
        assert!(gate.entered.load(Ordering::SeqCst), "the task was running");
        assert_eq!(note, "Unavailable", "the handler was told its unit went away");
        // Down: a submit is refused, and the ticket says why.
        let (_, _, note) = ok(&ch, &schema, &blob("vanish", b"again")).await;
        assert_eq!(note, "Unavailable");
        // The stuck kernel returns; its result is discarded, nothing leaks.
        gate.release();
        units.set_available(1, true).await.expect("back");
        units.program(1, "crc32").await.expect("reprogram");
        let data = image(3, 5000);
        let (result, _, _) = ok(&ch, &schema, &blob("crc", &data)).await;
        let mut crc = flate2::Crc::new();
        crc.update(&data);
        assert_eq!(result, crc.sum().to_le_bytes(), "the unit works again");
        assert_eq!(drained(&engine).await, 0);
    });
}

#[test]
fn the_application_moves_a_field_between_host_and_device() {
    let schema = schema();
    runtime().block_on(async {
        let (engine, ch, units) = start("move", Arc::default()).await;
        let data = image(5, 10_000);
        assert!(units.is_on_device(DATA).await.expect("where"));
        let (result, on_device, _) = ok(&ch, &schema, &blob("echo", &data)).await;
        assert!(on_device && result.is_empty(), "a handle, no bytes");

        // A unit went away: the field lands on the host from the next
        // request on.
        assert!(!units.move_to_host(DATA).await.expect("moved"));
        assert!(!units.is_on_device(DATA).await.expect("where"));
        let (result, on_device, _) = ok(&ch, &schema, &blob("echo", &data)).await;
        assert!(!on_device, "bytes in the block");
        assert_eq!(result, data);

        // And back.
        assert!(units.move_to_device(DATA).await.expect("moved"));
        let (result, on_device, _) = ok(&ch, &schema, &blob("echo", &data)).await;
        assert!(on_device && result.is_empty());
        let dev = engine.registry.pick(SERVICE).expect("attached").device().expect("dev").clone();
        assert_eq!(dev.stats.placed_requests.load(Ordering::Relaxed), 2);
        assert_eq!(drained(&engine).await, 0);
    });
}
