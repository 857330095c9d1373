//! The image service: the engine's side (decode, encode, automatic field
//! updating), the application's handlers on their own threads, and the
//! three schemes.
//!
//! # Who runs what
//!
//! * **Engine** (`image-engine` threads, a tokio runtime): HTTP/2, framing,
//!   request decode and response encode — and, under `rpcacc`, the
//!   target-aware decode into the device region and the reply's encode
//!   from it.
//! * **Application** (`image-app-N` threads, each a current-thread
//!   runtime): the handlers — authorization, and the image work (itself
//!   under `cpu-only`, through the compute units otherwise). A request
//!   crosses to an application thread on a channel and its reply comes
//!   back on another, so the CPU time of these threads is the
//!   application's CPU and nothing else. The `cu-notify-N` threads that
//!   deliver compute-unit completions to handlers are counted as
//!   application CPU too.
//! * **Compute units** (`cu-slot-N` threads, [`protoplane_offload::cu`]):
//!   the kernels under `offload-host` and `rpcacc`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use protoplane_grpc::{
    BoxFuture, Code, Message, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_offload::cu::{DeviceRef, TaskDescriptor};
use protoplane_rpc::{Router, ServerOptions};
use protoplane_schema::{Field, FieldOp, Placement, TableSet};
use protoplane_wire::{
    Block, Builder, DecodeOptions, Decoder, EncodeOptions, Encoder, MessageView, Source, Value,
    REF_DEVICE, REF_LEN_MASK,
};
use tokio::sync::{mpsc, oneshot};

pub mod split;

use crate::crypto::{self, User, USERS};
use crate::units::{reply_key_id, request_key_id, DeviceGuard, Stage, Units};
use crate::{pb, PROTO, PROTO_NAME, SERVICE};

/// How the server processes an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Everything in the handler, on the application's thread (`ring`,
    /// `flate2`).
    CpuOnly,
    /// The kernels run on compute units, but the image is host-placed: the
    /// handler copies it into the device region, runs the chain, and
    /// copies the result back into the reply.
    OffloadHost,
    /// RPCAcc: the image is device-placed — decoded by the engine straight
    /// into the device region, processed there by the chain, and encoded
    /// into the reply from there; the handler touches host fields only.
    Rpcacc,
}

impl Scheme {
    /// The flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::CpuOnly => "cpu-only",
            Scheme::OffloadHost => "offload-host",
            Scheme::Rpcacc => "rpcacc",
        }
    }

    /// Every scheme.
    pub const ALL: [Scheme; 3] = [Scheme::CpuOnly, Scheme::OffloadHost, Scheme::Rpcacc];
}

impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Scheme {
    type Err = String;
    fn from_str(s: &str) -> Result<Scheme, String> {
        Scheme::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| format!("unknown scheme {s:?} (cpu-only, offload-host or rpcacc)"))
    }
}

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The scheme.
    pub scheme: Scheme,
    /// Application threads running the handlers.
    pub app_threads: usize,
    /// Engine (network) threads.
    pub engine_threads: usize,
    /// Compute-unit slots running `deflate.compress` (the chain's slowest
    /// stage); one more each for `aes256gcm.open` and `aes256gcm.seal`.
    pub compress_units: usize,
    /// rpcacc: automatic field updating — move the image to the host while
    /// the compute units are away, back when they return.
    pub auto_update: bool,
    /// Bytes of the device region.
    pub region_capacity: u32,
    /// Largest request or reply message, in bytes.
    pub max_message: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            scheme: Scheme::Rpcacc,
            app_threads: 1,
            engine_threads: 1,
            compress_units: 2,
            auto_update: true,
            region_capacity: 256 << 20,
            max_message: 16 << 20,
        }
    }
}

/// Field numbers of `image.proto`.
mod num {
    pub(crate) const USER: u32 = 1;
    pub(crate) const TOKEN: u32 = 2;
    pub(crate) const NONCE: u32 = 3;
    pub(crate) const IMAGE: u32 = 4;
    pub(crate) const LEVEL: u32 = 5;
    pub(crate) const R_NONCE: u32 = 1;
    pub(crate) const R_RESULT: u32 = 2;
    pub(crate) const R_ORIGINAL: u32 = 3;
    pub(crate) const R_COMPRESSED: u32 = 4;
    pub(crate) const R_PATH: u32 = 6;
}

/// Types and fields of the schema the handlers and the engine use.
#[derive(Debug)]
struct Types {
    compress: u32,
    stats: u32,
    request: u32,
    reply: u32,
    stats_reply: u32,
    /// The request's `image` field (slot offset).
    image: Field,
    /// The reply's `result` field and its op (to store a device handle).
    result: Field,
    result_op: FieldOp,
}

impl Types {
    fn of(schema: &Schema) -> Result<Types, String> {
        let ts = schema.tables();
        let ty = |n: &str| ts.message_by_name(n).ok_or_else(|| format!("no message {n}"));
        let request = ty("protoplane.examples.image.CompressRequest")?;
        let reply = ty("protoplane.examples.image.CompressReply")?;
        let stats_reply = ty("protoplane.examples.image.StatsReply")?;
        let method = |m: &str| schema.find(SERVICE, m).ok_or_else(|| format!("no method {m}"));
        let field = |t: u32, n: u32| {
            ts.field_by_number(ts.message(t), n).copied().ok_or_else(|| format!("no field {n}"))
        };
        let result_index =
            ts.field_index(ts.message(reply), num::R_RESULT).ok_or("no result field")?;
        Ok(Types {
            compress: method("Compress")?,
            stats: method("Stats")?,
            request,
            reply,
            stats_reply,
            image: field(request, num::IMAGE)?,
            result: field(reply, num::R_RESULT)?,
            result_op: ts.ops(ts.message(reply))[result_index],
        })
    }
}

/// The tables the engine decodes requests with: a snapshot, replaced (never
/// mutated) when automatic field updating flips the image's placement bit.
#[derive(Debug)]
struct PlacementState {
    tables: RwLock<Arc<TableSet>>,
    on_device: AtomicBool,
    updates: AtomicU64,
}

impl PlacementState {
    fn snapshot(&self) -> Arc<TableSet> {
        Arc::clone(&self.tables.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Moves the image field to the device (`true`) or the host: a fresh
    /// copy of the tables with the bit flipped, swapped in. Requests being
    /// decoded keep the snapshot they started with.
    fn place(&self, request: u32, device: bool) {
        let mut g = self.tables.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.on_device.load(Relaxed) == device {
            return;
        }
        let mut fresh = TableSet::clone(&g);
        let p = if device { Placement::Device } else { Placement::Host };
        if fresh.set_placement(request, num::IMAGE, p) {
            *g = Arc::new(fresh);
            self.on_device.store(device, Relaxed);
            self.updates.fetch_add(1, Relaxed);
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    ok: AtomicU64,
    failed: AtomicU64,
    device_path: AtomicU64,
    host_path: AtomicU64,
}

/// What the handlers share (never the pool that runs them, so the
/// application threads end when the engine drops the pool).
#[derive(Debug)]
struct App {
    scheme: Scheme,
    schema: Arc<Schema>,
    types: Types,
    units: Option<Arc<Units>>,
    /// The reply nonces: a random 4-byte prefix per server, then a counter.
    nonce_prefix: [u8; 4],
    nonce_counter: AtomicU64,
}

/// The request's fields as the handler reads them.
struct Fields<'a> {
    user: &'a str,
    token: &'a [u8],
    nonce: &'a [u8],
    image: Image<'a>,
    level: u32,
}

/// Where the request's image is.
#[derive(Clone, Copy)]
enum Image<'a> {
    /// In host memory (the wire bytes).
    Host(&'a [u8]),
    /// A handle into the device region (rpcacc).
    Device(DeviceRef),
}

/// A handler's reply: the block, and the device range its `result` field's
/// handle names (rpcacc), which the engine encodes from and then frees.
#[derive(Debug)]
struct AppReply {
    block: Block,
    device: Option<DeviceGuard>,
}

fn invalid(what: impl Into<String>) -> Status {
    Status::new(Code::InvalidArgument, what)
}

/// The raw reference slot of a `string` / `bytes` field, if it holds a
/// device handle.
fn device_handle(view: &MessageView<'_>, f: &Field) -> Option<DeviceRef> {
    view.device_ref_at(f.offset).map(|r| DeviceRef::new(r.offset, r.len))
}

fn device_bits(r: DeviceRef) -> u64 {
    r.offset as u64 | ((r.len | REF_DEVICE) as u64) << 32
}

/// The absolute offset of the root object's slot at `offset` in a block.
fn root_slot(block: &[u8], offset: u32) -> Option<usize> {
    let root = u32::from_le_bytes(block.get(0..4)?.try_into().ok()?) as usize;
    let at = root.checked_add(offset as usize)?;
    (at + 8 <= block.len()).then_some(at)
}

fn put_u64(block: &mut [u8], at: usize, v: u64) -> Result<(), Status> {
    block
        .get_mut(at..at + 8)
        .ok_or_else(|| Status::new(Code::Internal, "slot outside the block"))?
        .copy_from_slice(&v.to_le_bytes());
    Ok(())
}

impl App {
    fn tables(&self) -> &TableSet {
        self.schema.tables()
    }

    fn units(&self) -> Result<&Arc<Units>, Status> {
        self.units.as_ref().ok_or_else(|| Status::new(Code::Internal, "no compute units"))
    }

    fn reply_nonce(&self) -> [u8; 12] {
        let mut n = [0u8; 12];
        n[..4].copy_from_slice(&self.nonce_prefix);
        n[4..].copy_from_slice(&self.nonce_counter.fetch_add(1, Relaxed).to_be_bytes());
        n
    }

    /// Reads the request's fields: host fields as bytes, the image as
    /// bytes or as a device handle, whichever the block holds.
    fn fields<'a>(&self, view: &MessageView<'a>) -> Result<Fields<'a>, Status> {
        let bytes = |n: u32| -> Result<&'a [u8], Status> {
            Ok(view.by_number(n)?.and_then(|v| v.as_bytes()).unwrap_or_default())
        };
        let user =
            std::str::from_utf8(bytes(num::USER)?).map_err(|_| invalid("user: not UTF-8"))?;
        let image = match device_handle(view, &self.types.image) {
            Some(r) => Image::Device(r),
            None => Image::Host(bytes(num::IMAGE)?),
        };
        let level = match view.by_number(num::LEVEL)? {
            Some(Value::U32(0)) | None => 6,
            Some(Value::U32(l @ 1..=9)) => l,
            Some(v) => return Err(invalid(format!("level {v:?}: need 0..=9"))),
        };
        Ok(Fields { user, token: bytes(num::TOKEN)?, nonce: bytes(num::NONCE)?, image, level })
    }

    /// Authorization on host fields: UNAUTHENTICATED for an unknown user or
    /// a wrong token, PERMISSION_DENIED for a user without the right.
    fn authorize(&self, f: &Fields<'_>) -> Result<(usize, &'static User), Status> {
        let found = USERS.iter().enumerate().find(|(_, u)| u.name == f.user);
        let (i, u) = match found {
            Some((i, u)) if crypto::constant_time_eq(u.token.as_bytes(), f.token) => (i, u),
            _ => return Err(Status::new(Code::Unauthenticated, "unknown user or wrong token")),
        };
        if !u.may_compress {
            return Err(Status::new(
                Code::PermissionDenied,
                format!("user {:?} may not compress images", u.name),
            ));
        }
        if f.nonce.len() != crypto::NONCE_LEN {
            return Err(invalid(format!("nonce of {} bytes, need 12", f.nonce.len())));
        }
        let len = match f.image {
            Image::Host(b) => b.len(),
            Image::Device(r) => r.len as usize,
        };
        if len < crypto::TAG_LEN {
            return Err(invalid(format!(
                "image of {len} bytes: an encrypted image is at least its {}-byte tag",
                crypto::TAG_LEN
            )));
        }
        Ok((i, u))
    }

    fn reply(
        &self,
        nonce: &[u8],
        result: Result<&[u8], DeviceRef>,
        original: u64,
        compressed: u64,
        path: &str,
    ) -> Result<Block, Status> {
        let mut b = Builder::new(self.tables(), self.types.reply)?;
        let root = b.root();
        b.set(root, num::R_NONCE, Value::Bytes(nonce))?;
        match result {
            Ok(bytes) => b.set(root, num::R_RESULT, Value::Bytes(bytes))?,
            // A device handle: the engine pulls the bytes at encode time.
            Err(r) => b.set_device(root, &self.types.result_op, r.offset, r.len)?,
        }
        b.set(root, num::R_ORIGINAL, Value::U64(original))?;
        b.set(root, num::R_COMPRESSED, Value::U64(compressed))?;
        b.set(root, num::R_PATH, Value::String(path.as_bytes()))?;
        Ok(b.finish())
    }

    /// `cpu-only`, and rpcacc's host fallback: every step on this thread.
    fn on_cpu(
        &self,
        user: &User,
        f: &Fields<'_>,
        image: &[u8],
        path: &str,
    ) -> Result<Block, Status> {
        let plain = crypto::open(&crypto::request_key(user.name), f.nonce, image).map_err(|e| {
            invalid(format!(
                "the image does not authenticate ({e}): tampered ciphertext, or wrong key or nonce"
            ))
        })?;
        let packed = crypto::deflate(&plain, f.level);
        let nonce = self.reply_nonce();
        let sealed = crypto::seal(&crypto::reply_key(user.name), &nonce, &packed)
            .map_err(|e| Status::new(Code::Internal, e.to_string()))?;
        self.reply(&nonce, Ok(&sealed), plain.len() as u64, packed.len() as u64, path)
    }

    /// The chain on compute units over device ranges: open → compress →
    /// seal. Returns the sealed range and the plaintext and compressed
    /// sizes; only handles cross to the host.
    async fn chain(
        &self,
        user: usize,
        f: &Fields<'_>,
        image: DeviceRef,
        nonce: &[u8; 12],
    ) -> Result<(DeviceGuard, u64, u64), Status> {
        let units = self.units()?;
        let plain = units
            .run(
                Stage::Open,
                TaskDescriptor::new(image)
                    .param_u64("key_id", request_key_id(user))
                    .param_bytes("nonce", f.nonce),
            )
            .await?;
        let packed = units
            .run(
                Stage::Compress,
                TaskDescriptor::new(plain.range()).param_u64("level", f.level as u64),
            )
            .await?;
        let original = plain.range().len as u64;
        drop(plain);
        let sealed = units
            .run(
                Stage::Seal,
                TaskDescriptor::new(packed.range())
                    .param_u64("key_id", reply_key_id(user))
                    .param_bytes("nonce", nonce),
            )
            .await?;
        Ok((sealed, original, packed.range().len as u64))
    }

    /// The handler of `cpu-only` and `offload-host` (a request the engine
    /// decoded as usual: every field on the host).
    async fn handle_host(&self, msg: Message) -> Result<AppReply, Status> {
        let view = msg.view(self.tables())?;
        let f = self.fields(&view)?;
        let (i, user) = self.authorize(&f)?;
        let Image::Host(image) = f.image else {
            return Err(Status::new(Code::Internal, "a device handle in a host-placed request"));
        };
        let block = match self.scheme {
            Scheme::OffloadHost => {
                let units = self.units()?;
                // Host → device: the handler copies the image in ...
                let staged = units.stage(image)?;
                let nonce = self.reply_nonce();
                let (sealed, original, compressed) =
                    self.chain(i, &f, staged.range(), &nonce).await?;
                drop(staged);
                // ... and the result back out, into the reply.
                let bytes = units.fetch(sealed.range())?;
                self.reply(&nonce, Ok(&bytes), original, compressed, "offload-host")?
            }
            _ => self.on_cpu(user, &f, image, "cpu")?,
        };
        Ok(AppReply { block, device: None })
    }

    /// The rpcacc handler: authorization on host fields; the image, a
    /// device handle, goes through the chain and the reply carries the
    /// result's handle. While automatic field updating has moved the image
    /// to the host, the request arrives host-placed and runs on the CPU.
    async fn handle_placed(
        &self,
        msg: Message,
        staged: Option<DeviceGuard>,
    ) -> Result<AppReply, Status> {
        let view = msg.view(self.tables())?;
        let f = self.fields(&view)?;
        let (i, user) = self.authorize(&f)?;
        match f.image {
            Image::Device(r) => {
                let nonce = self.reply_nonce();
                let (sealed, original, compressed) = self.chain(i, &f, r, &nonce).await?;
                drop(staged);
                let block =
                    self.reply(&nonce, Err(sealed.range()), original, compressed, "device")?;
                Ok(AppReply { block, device: Some(sealed) })
            }
            Image::Host(image) => {
                let block = self.on_cpu(user, &f, image, "host-fallback")?;
                Ok(AppReply { block, device: None })
            }
        }
    }
}

/// A job for an application thread.
type Job = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// The application threads: each runs a current-thread runtime that takes
/// jobs from its channel and runs each as a task.
#[derive(Debug)]
struct AppPool {
    senders: Vec<mpsc::UnboundedSender<Job>>,
    next: AtomicUsize,
}

impl AppPool {
    fn start(threads: usize) -> Result<AppPool, String> {
        let mut senders = Vec::new();
        for i in 0..threads.max(1) {
            let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("application runtime: {e}"))?;
            std::thread::Builder::new()
                .name(format!("image-app-{i}"))
                .spawn(move || {
                    rt.block_on(async move {
                        while let Some(job) = rx.recv().await {
                            tokio::spawn(job());
                        }
                    })
                })
                .map_err(|e| format!("application thread: {e}"))?;
            senders.push(tx);
        }
        Ok(AppPool { senders, next: AtomicUsize::new(0) })
    }

    /// Runs `f` on an application thread and awaits its result.
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> BoxFuture<'static, T> + Send + 'static,
    ) -> Result<T, Status> {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move || {
            Box::pin(async move {
                let _ = tx.send(f().await);
            })
        });
        let i = self.next.fetch_add(1, Relaxed) % self.senders.len();
        self.senders[i]
            .send(job)
            .map_err(|_| Status::new(Code::Unavailable, "the application has stopped"))?;
        rx.await.map_err(|_| Status::new(Code::Internal, "the handler ended without an answer"))
    }
}

/// The service as the rpc crate sees it: the engine's side of each call
/// (rpcacc's placed decode and device encode) around a job on the
/// application's threads.
struct ImageService {
    app: Arc<App>,
    pool: AppPool,
    placement: PlacementState,
    counters: Counters,
    auto_update: bool,
    app_threads: usize,
}

impl std::fmt::Debug for ImageService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageService").field("scheme", &self.app.scheme).finish_non_exhaustive()
    }
}

/// A request the engine decoded with placement, and the device range its
/// image was written to (owned until the handler is done).
struct Placed {
    message: Message,
    staged: Option<DeviceGuard>,
}

impl ImageService {
    fn request_tables(&self) -> Arc<TableSet> {
        if let (true, Some(units)) = (self.auto_update, &self.app.units) {
            // Automatic field updating: the image belongs on the device
            // only while the whole chain is there to process it.
            let want = units.chain_available();
            if want != self.placement.on_device.load(Relaxed) {
                self.placement.place(self.app.types.request, want);
            }
        }
        self.placement.snapshot()
    }

    /// rpcacc's decode, on the engine's thread: device-placed fields go to
    /// a device buffer, which is written into the compute units' region,
    /// and the block's handle is pointed at it.
    fn decode_placed(&self, raw: Message) -> Result<Placed, Status> {
        let tables = self.request_tables();
        let ty = self.app.types.request;
        let wire = raw.wire().clone();
        let mut block = Block::with_capacity(256);
        let mut device = Vec::new();
        Decoder::new()
            .decode_placed(&tables, ty, &wire, &DecodeOptions::view(), &mut block, &mut device)
            .map_err(protoplane_grpc::call::invalid_request)?;
        let mut bytes = block.into_bytes();
        let mut staged = None;
        let at = root_slot(&bytes, self.app.types.image.offset)
            .ok_or_else(|| Status::new(Code::Internal, "request block without its image slot"))?;
        let raw_ref = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
        let hi = (raw_ref >> 32) as u32;
        if hi & REF_DEVICE != 0 {
            let (off, len) = (raw_ref as u32 as usize, (hi & REF_LEN_MASK) as usize);
            let data = device.get(off..off + len).ok_or_else(|| {
                Status::new(Code::Internal, "device reference outside the buffer")
            })?;
            let units = self.app.units()?;
            let guard = units.stage(data)?;
            put_u64(&mut bytes, at, device_bits(guard.range()))?;
            staged = Some(guard);
            self.counters.device_path.fetch_add(1, Relaxed);
        } else {
            self.counters.host_path.fetch_add(1, Relaxed);
        }
        Ok(Placed { message: Message::from_parts(Bytes::from(bytes), wire, ty), staged })
    }

    /// The reply's encode, on the engine's thread: a device handle in the
    /// block is resolved against the bytes read from the device region
    /// (`Source::with_device`), then the range is freed.
    fn encode_reply(&self, out: AppReply) -> Result<Bytes, Status> {
        let AppReply { block, device } = out;
        let mut bytes = block.into_bytes();
        let mut dma = Vec::new();
        if let Some(guard) = &device {
            let at = root_slot(&bytes, self.app.types.result.offset).ok_or_else(|| {
                Status::new(Code::Internal, "reply block without its result slot")
            })?;
            let raw = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
            if raw != device_bits(guard.range()) {
                return Err(Status::new(Code::Internal, "the reply's handle is not its range"));
            }
            // Device → host, once: the final bytes only.
            dma = self.app.units()?.fetch(guard.range())?;
            put_u64(&mut bytes, at, device_bits(DeviceRef::new(0, guard.range().len)))?;
        }
        let src = Source::owned(&bytes).with_device(&dma);
        let mut wire = Vec::new();
        Encoder::new().encode_into(
            self.app.tables(),
            self.app.types.reply,
            src,
            &EncodeOptions::default(),
            &mut wire,
        )?;
        Ok(Bytes::from(wire))
    }

    async fn compress(&self, message: Message, responder: &mut Responder) -> Result<(), Status> {
        let app = Arc::clone(&self.app);
        match self.app.scheme {
            Scheme::CpuOnly | Scheme::OffloadHost => {
                let out = self
                    .pool
                    .run(move || Box::pin(async move { app.handle_host(message).await }))
                    .await??;
                responder.send(out.block).await
            }
            Scheme::Rpcacc => {
                let Placed { message, staged } = self.decode_placed(message)?;
                let out = self
                    .pool
                    .run(move || Box::pin(async move { app.handle_placed(message, staged).await }))
                    .await??;
                let wire = self.encode_reply(out)?;
                responder.send_encoded(wire).await
            }
        }
    }

    fn stats(&self) -> pb::StatsReply {
        let groups = crate::cpu::cpu_by_group(|name| {
            Some(if name.starts_with("image-app-") {
                "app"
            } else if name.starts_with("cu-notify-") {
                "notify"
            } else if name.starts_with("cu-slot-") {
                "cu"
            } else if name.starts_with("image-engine") {
                "engine"
            } else {
                return None;
            })
        });
        let g = |k: &str| groups.get(k).copied().unwrap_or(0);
        pb::StatsReply {
            scheme: self.app.scheme.to_string(),
            requests_ok: self.counters.ok.load(Relaxed),
            requests_failed: self.counters.failed.load(Relaxed),
            device_path: self.counters.device_path.load(Relaxed),
            host_path: self.counters.host_path.load(Relaxed),
            field_updates: self.placement.updates.load(Relaxed),
            app_handler_cpu_ns: g("app"),
            app_notify_cpu_ns: g("notify"),
            app_cpu_ns: g("app") + g("notify"),
            engine_cpu_ns: g("engine"),
            cu_cpu_ns: g("cu"),
            process_cpu_ns: g("*"),
            app_threads: self.app_threads as u32,
        }
    }

    fn stats_block(&self) -> Result<Block, Status> {
        let s = self.stats();
        let mut b = Builder::new(self.app.tables(), self.app.types.stats_reply)?;
        let r = b.root();
        b.set(r, 1, Value::String(s.scheme.as_bytes()))?;
        for (n, v) in [
            (2, s.requests_ok),
            (3, s.requests_failed),
            (4, s.device_path),
            (5, s.host_path),
            (6, s.field_updates),
            (7, s.app_handler_cpu_ns),
            (8, s.app_notify_cpu_ns),
            (9, s.app_cpu_ns),
            (10, s.engine_cpu_ns),
            (11, s.cu_cpu_ns),
            (12, s.process_cpu_ns),
        ] {
            b.set(r, n, Value::U64(v))?;
        }
        b.set(r, 13, Value::U32(s.app_threads))?;
        Ok(b.finish())
    }
}

impl Service for ImageService {
    fn schema(&self) -> &Arc<Schema> {
        &self.app.schema
    }

    fn name(&self) -> &str {
        SERVICE
    }

    /// rpcacc: the engine's transports hand requests over undecoded, and
    /// this service's engine side decodes them with placement.
    fn decodes_requests(&self) -> bool {
        self.app.scheme == Scheme::Rpcacc
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        request: Request<Streaming>,
        mut responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            let message = request.into_single().await?.into_inner();
            if method == self.app.types.stats {
                responder.send(self.stats_block()?).await?;
                return Ok(Metadata::new());
            }
            if method != self.app.types.compress {
                return Err(Status::new(Code::Unimplemented, "no such method"));
            }
            let r = self.compress(message, &mut responder).await;
            let c = if r.is_ok() { &self.counters.ok } else { &self.counters.failed };
            c.fetch_add(1, Relaxed);
            r.map(|()| Metadata::new())
        })
    }
}

/// The example's schema (from the embedded `image.proto`).
pub fn schema() -> Result<Arc<Schema>, String> {
    let src = protoplane_schema::ProtoSource { name: PROTO_NAME, text: PROTO };
    Schema::from_proto_sources(&[src], &[PROTO_NAME])
        .map(Arc::new)
        .map_err(|e| format!("image.proto: {e}"))
}

/// A running image server: its own engine runtime, application threads
/// and (except `cpu-only`) compute units. Dropping it stops serving.
pub struct RunningServer {
    addr: SocketAddr,
    service: Arc<ImageService>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for RunningServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningServer").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl RunningServer {
    /// Starts serving on `bind` (port 0: any free port).
    pub fn start(cfg: &ServerConfig, bind: SocketAddr) -> Result<RunningServer, String> {
        let schema = schema()?;
        let types = Types::of(&schema)?;
        let units = match cfg.scheme {
            Scheme::CpuOnly => None,
            _ => Some(Arc::new(Units::start(
                cfg.compress_units,
                cfg.region_capacity,
                cfg.max_message.min(u32::MAX as usize) as u32,
            )?)),
        };
        // The .proto places the image on the device
        // (`[(protoplane.placement) = DEVICE]`): rpcacc keeps it there, the
        // other schemes put it back on the host.
        let mut tables = schema.tables().clone();
        let on_device = cfg.scheme == Scheme::Rpcacc;
        let placement = if on_device { Placement::Device } else { Placement::Host };
        if !tables.set_placement(types.request, num::IMAGE, placement) {
            return Err("the image field cannot be placed".into());
        }
        let mut prefix = [0u8; 4];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut prefix)
            .map_err(|_| "no system randomness for the reply nonces".to_string())?;
        let app = Arc::new(App {
            scheme: cfg.scheme,
            schema: Arc::clone(&schema),
            types,
            units,
            nonce_prefix: prefix,
            nonce_counter: AtomicU64::new(0),
        });
        let service = Arc::new(ImageService {
            app,
            pool: AppPool::start(cfg.app_threads)?,
            placement: PlacementState {
                tables: RwLock::new(Arc::new(tables)),
                on_device: AtomicBool::new(on_device),
                updates: AtomicU64::new(0),
            },
            counters: Counters::default(),
            auto_update: cfg.auto_update,
            app_threads: cfg.app_threads.max(1),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.engine_threads.max(1))
            .thread_name("image-engine")
            .enable_all()
            .build()
            .map_err(|e| format!("engine runtime: {e}"))?;
        let opts = ServerOptions {
            max_recv_message: cfg.max_message,
            max_send_message: cfg.max_message,
            ..ServerOptions::default()
        };
        let svc: Arc<dyn Service> = service.clone();
        let router = Arc::new(Router::new(opts).add_service(svc));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(bind))
            .map_err(|e| format!("bind {bind}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        runtime.spawn(async move { router.serve(listener).await });
        Ok(RunningServer { addr, service, runtime: Some(runtime) })
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.service.app.scheme
    }

    /// The counters and CPU times ([`pb::StatsReply`], what the `Stats` RPC
    /// answers).
    pub fn stats(&self) -> pb::StatsReply {
        self.service.stats()
    }

    /// Makes the compute units vanish (`false`) or come back (RPCAcc's
    /// unit-failure experiment). An error under `cpu-only`.
    pub fn set_units_available(&self, available: bool) -> Result<(), String> {
        match &self.service.app.units {
            Some(u) => u.set_available(available),
            None => Err("cpu-only runs no compute units".into()),
        }
    }

    /// Bytes in live allocations of the device region (`None` under
    /// `cpu-only`): zero once every call has ended, or something leaked.
    pub fn device_bytes_in_use(&self) -> Option<u32> {
        self.service.app.units.as_ref().map(|u| u.compute_units().region().used())
    }

    /// Whether the image field is device-placed in the current tables.
    pub fn image_on_device(&self) -> bool {
        self.service.placement.on_device.load(Relaxed)
    }

    /// Serves until the process ends.
    pub fn serve_forever(self) -> ! {
        loop {
            std::thread::park();
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
