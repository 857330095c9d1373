//! The image service in split mode: the handlers in an application process
//! attached to `protoplane engine`, the way RPCAcc deploys it — the engine
//! process owns the network, decodes each request with the image placed
//! in its device region (the `.proto` option), runs the compute units and
//! encodes the reply, pulling the sealed result from the device region.
//! This process never sees an image byte on the device path: it checks
//! the credentials on host fields and drives the chain by handle over the
//! shared-memory rings ([`protoplane_app::Units`]).
//!
//! ```sh
//! protoplane engine --grpc-port 50051 --attach /tmp/img.sock --config offload.toml \
//!     --proto examples/imageservice/proto/image.proto --max-message 16777216
//! image-server --attach /tmp/img.sock
//! ```
//!
//! with `offload.toml` giving the engine its units (open, `compress_units`
//! × compress, seal) and device memory:
//!
//! ```toml
//! [offload]
//! units = 4
//! device_mb = 256
//! ```
//!
//! # Automatic field updating
//!
//! A stage that fails with UNAVAILABLE (its unit vanished) moves the image
//! to the host for the engine's next decode (`Units::move_to_host`) and the
//! call fails with UNAVAILABLE (its image is on the device, which cannot
//! run it). Requests that then arrive with the image on the host run on
//! this process's CPU; every [`PROBE_EVERY`]th of them asks whether all
//! stages have a unit again and, if so, moves the image back.
//!
//! # Application CPU
//!
//! Everything this process does is the application's: its handlers, its
//! ring drain loop, its waits on notifications. The `Stats` RPC reports
//! the whole process's CPU as `app_cpu_ns`; the engine's CPU is the engine
//! process's and is not known here (0).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use protoplane_app::{DeviceRef, TaskDescriptor, Units};
use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_wire::{Block, Builder, Value};

use super::{App, Image, Scheme, Types};
use crate::crypto::{self, USERS};
use crate::units::{reply_key_id, request_key_id};
use crate::SERVICE;

/// The request field the engine places on the device.
pub const IMAGE_FIELD: &str = "protoplane.examples.image.CompressRequest.image";

/// Host-path requests between two checks for the units' return.
pub const PROBE_EVERY: u64 = 32;

/// Which engine slot runs which stage: open in 0, compress in
/// `1..=compress`, seal in `compress + 1`.
#[derive(Debug, Clone, Copy)]
struct Slots {
    compress: u32,
}

impl Slots {
    const OPEN: u32 = 0;

    fn seal(self) -> u32 {
        self.compress + 1
    }

    fn total(self) -> u32 {
        self.compress + 2
    }

    fn kernel(self, slot: u32) -> &'static str {
        match slot {
            0 => "aes256gcm.open",
            s if s <= self.compress => "deflate.compress",
            _ => "aes256gcm.seal",
        }
    }
}

/// The attached service.
struct Attached {
    app: App,
    units: Units,
    slots: Slots,
    /// Whether the engine's units hold our kernels and keys (cleared when a
    /// task finds them missing: a restarted engine).
    ready: AtomicBool,
    next_compress: AtomicUsize,
    ok: AtomicU64,
    failed: AtomicU64,
    device_path: AtomicU64,
    host_path: AtomicU64,
    field_updates: AtomicU64,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attached").field("slots", &self.slots).finish_non_exhaustive()
    }
}

impl Attached {
    /// Programs every slot and installs every user's keys in the engine.
    async fn program(&self) -> Result<(), Status> {
        for slot in 0..self.slots.total() {
            self.units.program(slot, self.slots.kernel(slot)).await?;
        }
        for (i, u) in USERS.iter().enumerate() {
            self.units.set_key(request_key_id(i), &crypto::request_key(u.name)).await?;
            self.units.set_key(reply_key_id(i), &crypto::reply_key(u.name)).await?;
        }
        self.ready.store(true, Relaxed);
        Ok(())
    }

    async fn run(&self, slot: u32, task: TaskDescriptor) -> Result<DeviceRef, Status> {
        let done = self.units.run(slot, task).await?;
        Ok(done.output)
    }

    /// open → compress → seal, by handle: the sealed range, the plaintext
    /// and compressed sizes.
    async fn chain(
        &self,
        user: usize,
        nonce: &[u8],
        level: u32,
        image: DeviceRef,
        reply_nonce: &[u8; 12],
    ) -> Result<(DeviceRef, u64, u64), Status> {
        let open = TaskDescriptor::new(image)
            .param_u64("key_id", request_key_id(user))
            .param_bytes("nonce", nonce);
        let plain = self.run(Slots::OPEN, open).await.map_err(|st| match st.code {
            Code::Aborted => Status::new(
                Code::InvalidArgument,
                format!("the image does not authenticate ({})", st.message),
            ),
            _ => st,
        })?;
        let k = self.next_compress.fetch_add(1, Relaxed) as u32 % self.slots.compress;
        let packed = self
            .run(1 + k, TaskDescriptor::new(plain).param_u64("level", u64::from(level)))
            .await?;
        let seal = TaskDescriptor::new(packed)
            .param_u64("key_id", reply_key_id(user))
            .param_bytes("nonce", reply_nonce);
        let sealed = self.run(self.slots.seal(), seal).await?;
        Ok((sealed, u64::from(plain.len), u64::from(packed.len)))
    }

    /// Whether every slot of the chain has its unit (a vanished unit
    /// answers `get_type` with UNAVAILABLE).
    async fn all_available(&self) -> bool {
        for slot in 0..self.slots.total() {
            if self.units.get_type(slot).await.is_err() {
                return false;
            }
        }
        true
    }

    async fn compress(&self, msg: &protoplane_grpc::Message) -> Result<Block, Status> {
        if !self.ready.load(Relaxed) {
            self.program().await?;
        }
        let view = msg.view(self.app.tables())?;
        let f = self.app.fields(&view)?;
        let (i, user) = self.app.authorize(&f)?;
        match f.image {
            Image::Device(r) => {
                self.device_path.fetch_add(1, Relaxed);
                let nonce = self.app.reply_nonce();
                let mut chained = self.chain(i, f.nonce, f.level, r, &nonce).await;
                if matches!(&chained, Err(st) if st.code == Code::FailedPrecondition) {
                    // Kernels or keys missing: a new engine. Once more.
                    self.program().await?;
                    chained = self.chain(i, f.nonce, f.level, r, &nonce).await;
                }
                let (sealed, original, compressed) = match chained {
                    Ok(x) => x,
                    Err(st) if st.code == Code::Unavailable => {
                        // A unit went away: the next requests bring the
                        // image to the host (RPCAcc §IV-C).
                        if !self.units.move_to_host(IMAGE_FIELD).await? {
                            self.field_updates.fetch_add(1, Relaxed);
                        }
                        return Err(st);
                    }
                    Err(st) => return Err(st),
                };
                // The reply holds the sealed range's handle: the engine
                // encodes it from its device region.
                self.app.reply(&nonce, Err(sealed), original, compressed, "device")
            }
            Image::Host(image) => {
                let n = self.host_path.fetch_add(1, Relaxed);
                let block = self.app.on_cpu(user, &f, image, "host-fallback")?;
                if n % PROBE_EVERY == PROBE_EVERY - 1
                    && self.all_available().await
                    && self.units.move_to_device(IMAGE_FIELD).await?
                {
                    self.field_updates.fetch_add(1, Relaxed);
                }
                Ok(block)
            }
        }
    }

    fn stats(&self) -> Result<Block, Status> {
        let cpu = crate::cpu::cpu_by_group(|_| Some("app"));
        let process = cpu.get("*").copied().unwrap_or(0);
        let mut b = Builder::new(self.app.tables(), self.app.types.stats_reply)?;
        let r = b.root();
        b.set(r, 1, Value::String(b"rpcacc-split"))?;
        for (n, v) in [
            (2, self.ok.load(Relaxed)),
            (3, self.failed.load(Relaxed)),
            (4, self.device_path.load(Relaxed)),
            (5, self.host_path.load(Relaxed)),
            (6, self.field_updates.load(Relaxed)),
            (7, process),
            (9, process),
            (12, process),
        ] {
            b.set(r, n, Value::U64(v))?;
        }
        b.set(r, 13, Value::U32(1))?;
        Ok(b.finish())
    }
}

/// The service as the application library serves it.
struct AttachedService(Arc<Attached>);

impl Service for AttachedService {
    fn schema(&self) -> &Arc<Schema> {
        &self.0.app.schema
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
            let me = &self.0;
            let message = request.into_single().await?.into_inner();
            if method == me.app.types.stats {
                responder.send(me.stats()?).await?;
                return Ok(Metadata::new());
            }
            if method != me.app.types.compress {
                return Err(Status::new(Code::Unimplemented, "no such method"));
            }
            let r = match me.compress(&message).await {
                Ok(block) => responder.send(block).await,
                Err(st) => Err(st),
            };
            let c = if r.is_ok() { &me.ok } else { &me.failed };
            c.fetch_add(1, Relaxed);
            r.map(|()| Metadata::new())
        })
    }
}

/// Serves the image service as an application of the engine whose attach
/// socket is `path`, with `compress_units` compress slots (the engine
/// needs `compress_units + 2` units). Runs until the process ends,
/// attaching again whenever the engine restarts; call it on a
/// current-thread runtime: that thread is the application's core.
pub async fn serve_attached(path: &Path, compress_units: u32) -> Result<(), String> {
    let schema = super::schema()?;
    let types = Types::of(&schema)?;
    let mut prefix = [0u8; 4];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut prefix)
        .map_err(|_| "no system randomness for the reply nonces".to_string())?;
    let app = App {
        scheme: Scheme::Rpcacc,
        schema,
        types,
        units: None,
        nonce_prefix: prefix,
        nonce_counter: AtomicU64::new(0),
    };
    // No spinning after work: every wake-up here is a notification, and
    // spinning would count against the application core.
    let attach = protoplane_app::attach(path).spin(std::time::Duration::ZERO);
    let attached = Arc::new(Attached {
        app,
        units: attach.units(),
        slots: Slots { compress: compress_units.max(1) },
        ready: AtomicBool::new(false),
        next_compress: AtomicUsize::new(0),
        ok: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        device_path: AtomicU64::new(0),
        host_path: AtomicU64::new(0),
        field_updates: AtomicU64::new(0),
    });
    attach
        .service(Arc::new(AttachedService(attached)))
        .run()
        .await
        .map_err(|e| format!("attached to {}: {e}", path.display()))
}
