//! The protoplane engine: the RPC tax in its own process.
//!
//! The engine terminates the transports (gRPC over HTTP/2 with optional
//! TLS, the lean transport over TCP and Unix sockets), deframes,
//! decompresses and decodes each request, and hands it to an application
//! process attached over shared memory (`protoplane-shm`); it encodes the
//! responses the application laid out in the region and sends them. Health
//! and reflection are answered by the engine itself, and so are methods
//! marked for functional offload ([`functional`]: handlers that run in the
//! engine, PsPIN-style; the application never sees those calls).
//! Applications never touch a socket, a varint or an HTTP/2 frame (see
//! `protoplane-app`).
//!
//! Read [`attachment`] first (what the engine trusts and checks), then
//! [`proxy`] (how a call crosses), then this file (setup and the drain
//! loop that takes the applications' descriptors).
//!
//! Where bytes are copied on the request path: the transports hand
//! [`SplitService`] the message undecoded. The lean reader receives into
//! chunks of the engine's half of a region ([`Attachment::landing`]), so
//! [`Attachment::post_request`] leaves the wire bytes where they arrived
//! and decodes the block into a fresh chunk (view mode: strings and bytes
//! stay in the wire bytes, where the application reads them); no byte is
//! copied. h2 receives into its own buffers, so over gRPC the wire bytes
//! are copied once, to the start of the chunk the block is decoded into. On
//! the response path the engine copies the block the application built in
//! its half out once (volatile reads into private memory) and hands the
//! chunk back: it never reads memory an application may write in place,
//! so nothing the application does can change a response between the
//! engine's checks and its use. The engine's half is a file of its own,
//! sealed against writes before the application gets it: nothing the
//! application does can change a block while the engine builds it.

pub mod admission;
pub mod attachment;
pub mod budget;
pub mod config;
pub mod device;
pub mod error;
pub mod functional;
#[doc(hidden)]
pub mod fuzzing;
pub mod proxy;
pub mod registry;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protoplane_grpc::Schema;
use protoplane_rpc::Router;
use protoplane_shm::attach::{Answer, Hello, VERSION};
use protoplane_shm::{sys, Bell, Doorbell, Layout, Mapping};
use tokio::io::AsyncReadExt;

pub use admission::{Admission, AdmissionStats, Credentials, Principal};
pub use attachment::Attachment;
pub use budget::Budgets;
pub use config::Config;
pub use device::{Device, DeviceOptions};
pub use error::{Error, Refusal};
pub use functional::{Counters, FunctionalOffload, MethodStats, OffloadRequest, Offloaded};
pub use proxy::{Limits, SplitService};
pub use registry::{Detached, Registry};

use attachment::Receiver;
use protoplane_shm::layout::{APP_PARKED, ENGINE_PARKED};

/// A running engine: where it listens and who is attached.
#[derive(Debug)]
pub struct Running {
    /// The gRPC listener's address.
    pub grpc: Option<std::net::SocketAddr>,
    /// The lean TCP listener's address.
    pub lean: Option<std::net::SocketAddr>,
    /// The attach socket.
    pub attach: PathBuf,
    /// Attached applications.
    pub registry: Arc<Registry>,
    /// Per-method counters: calls opened with applications, calls
    /// answered in the engine (functional offload).
    pub counters: Arc<Counters>,
    /// The attach socket's counters.
    pub admission: Arc<AdmissionStats>,
    /// The router of both transports: its drain is the engine's graceful
    /// shutdown.
    router: Arc<protoplane_rpc::Router>,
}

/// What [`Running::shutdown`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shutdown {
    /// Every client connection closed with its calls answered, within the
    /// grace period.
    pub drained: bool,
    /// Client connections still open when the grace period ended (their
    /// calls are cancelled as the process ends).
    pub connections_left: usize,
    /// Applications told the engine is going (detached).
    pub applications: usize,
}

impl Running {
    /// Stops the engine gracefully: the client listeners close, every
    /// HTTP/2 connection gets GOAWAY (NO_ERROR) and every lean connection
    /// closes between calls ([`protoplane_rpc::drain`]), calls in flight
    /// go on with their applications for up to `grace`, and then every
    /// application is detached with the reason "the engine is shutting
    /// down" (it attaches again to the next engine that listens).
    pub async fn shutdown(&self, grace: Duration) -> Shutdown {
        let drain = self.router.drain();
        drain.start();
        let drained = tokio::time::timeout(grace, drain.finished()).await.is_ok();
        let connections_left = drain.connections();
        let applications = self.registry.detach_all("the engine is shutting down");
        Shutdown { drained, connections_left, applications }
    }
}

struct Ctx {
    schemas: Vec<Arc<Schema>>,
    registry: Arc<Registry>,
    layout: Layout,
    spin: Duration,
    stall: Duration,
    next_id: std::sync::atomic::AtomicU32,
    /// Each attachment's device (placement, compute units), if any.
    device: Option<DeviceOptions>,
    /// The schemas' placement tables, which applications may move fields in.
    placement_tables: Vec<Arc<protoplane_schema::PlacementTable>>,
    /// The attach socket's rules, its handshakes and seats.
    admission: Admission,
    admission_stats: Arc<AdmissionStats>,
    pending: admission::Pending,
    seats: admission::Seats,
    /// What each application may cost.
    budgets: Budgets,
}

/// Starts the engine on the current tokio runtime: binds every listener,
/// then serves in spawned tasks until the runtime stops.
pub async fn start(config: Config) -> Result<Running, Error> {
    let registry = Arc::new(Registry::new());
    let limits = Arc::new(config.limits.clone());
    let waiting = Arc::new(AtomicUsize::new(0));
    let mut router = Router::new(config.server.clone());
    let mut proxied = Vec::new();
    let offloaded = config.offload.resolve(&config.schemas)?;
    let mut counters = Counters::default();
    let all: Vec<_> = config.schemas.iter().map(|s| s.tables()).collect();
    let placements = device::Placements::new(&all, &config.device.placements)?;
    let placed = placements.placed();
    let with_device = config.device.enabled(placed.iter().any(|p| p.any()));
    for (si, schema) in config.schemas.iter().enumerate() {
        for name in schema.services() {
            if proxied.contains(name) {
                return Err(Error::Schema(format!(
                    "service {name} is in two of the engine's schemas"
                )));
            }
            proxied.push(name.clone());
            let mut svc = SplitService::new(
                schema.clone(),
                name.clone(),
                registry.clone(),
                limits.clone(),
                waiting.clone(),
            );
            svc.set_raw_above(config.offload.raw_above);
            if with_device {
                svc.set_placement(placed.get(si).cloned());
            }
            for (id, m) in schema.methods().iter().enumerate() {
                if m.service != *name {
                    continue;
                }
                if let Some(h) = offloaded.get(&m.path) {
                    if !svc.offload(id as u32, h.clone()) {
                        return Err(Error::Offload(format!(
                            "offload: {} cannot be answered in the engine",
                            m.path
                        )));
                    }
                    eprintln!("engine: {} is answered in the engine (functional offload)", m.path);
                }
                if let Some(s) = svc.method_stats(id as u32) {
                    counters.insert(m.path.clone(), s.clone());
                }
            }
            router = router.add_service(Arc::new(svc));
        }
    }
    let (router, health) =
        router.with_standard_services().map_err(|e| Error::Schema(e.to_string()))?;
    for name in &proxied {
        health.set(name, protoplane_grpc_services::health::ServingStatus::NotServing);
    }
    registry.set_health(health);
    let router = Arc::new(router);

    let mut running = Running {
        grpc: None,
        lean: None,
        attach: config.attach.clone(),
        registry: registry.clone(),
        counters: Arc::new(counters),
        admission: Arc::new(AdmissionStats::default()),
        router: router.clone(),
    };
    if let Some(addr) = config.grpc {
        let listen = |source| Error::Listen { at: addr.to_string(), source };
        let l = tokio::net::TcpListener::bind(addr).await.map_err(listen)?;
        running.grpc = Some(l.local_addr().map_err(listen)?);
        let r = router.clone();
        match &config.tls {
            Some((cert, key)) => {
                let read = |p: &PathBuf| {
                    std::fs::read(p).map_err(|source| Error::Read { path: p.clone(), source })
                };
                let ca = config.tls_client_ca.as_ref().map(read).transpose()?;
                let tls = protoplane_rpc::tls::server_config_with(
                    &read(cert)?,
                    &read(key)?,
                    ca.as_deref(),
                )
                .map_err(|e| Error::Tls(e.to_string()))?;
                tokio::spawn(async move { r.serve_tls(l, tls).await });
            }
            None => {
                tokio::spawn(async move { r.serve(l).await });
            }
        }
    }
    if let Some(addr) = config.lean_tcp {
        let listen = |source| Error::Listen { at: addr.to_string(), source };
        let l = tokio::net::TcpListener::bind(addr).await.map_err(listen)?;
        running.lean = Some(l.local_addr().map_err(listen)?);
        tokio::spawn(protoplane_rpc::lean::server::serve_tcp(router.clone(), l));
    }
    if let Some(path) = &config.lean_unix {
        let l = admission::bind_unix(path)?;
        tokio::spawn(protoplane_rpc::lean::server::serve_unix(router.clone(), l));
    }

    // Never taken from a live engine; a stale socket file is replaced.
    let listener = admission::bind_unix(&config.attach)?;
    // The largest chunk holds a largest message's wire bytes plus its
    // block (a view-mode block is far smaller than its wire bytes; an
    // owned-mode response block is about as large as its encoding).
    let max_message = config.server.max_recv_message.min(config.server.max_send_message) as u64;
    let layout = Layout::sized(
        config.ring_slots,
        config.half_mb << 20,
        (2 * max_message + (64 << 10)).min(1 << 30) as u32,
    );
    layout.validate(None).map_err(|e| Error::Region(e.to_string()))?;
    let ctx = Arc::new(Ctx {
        schemas: config.schemas.clone(),
        registry,
        layout,
        spin: config.spin,
        stall: config.stall_timeout,
        next_id: std::sync::atomic::AtomicU32::new(1),
        device: with_device.then(|| config.device.clone()),
        placement_tables: placements.tables().to_vec(),
        admission: config.admission.clone(),
        admission_stats: running.admission.clone(),
        pending: admission::Pending::default(),
        seats: admission::Seats::default(),
        budgets: config.budgets.clone(),
    });
    tokio::spawn(admit_all(listener, ctx));
    Ok(running)
}

/// The attach socket's accept loop: each connection's handshake in a task
/// of its own, evicting the oldest beyond `max_pending` (see [`admission`]).
async fn admit_all(listener: tokio::net::UnixListener, ctx: Arc<Ctx>) {
    loop {
        let (sock, _) =
            protoplane_rpc::accept::accept("engine attach socket", || listener.accept()).await;
        ctx.admission_stats.connections.fetch_add(1, Ordering::Relaxed);
        let id = ctx.pending.admit(ctx.admission.max_pending, &ctx.admission_stats);
        let c = ctx.clone();
        let task = tokio::spawn(async move {
            let accepted =
                tokio::time::timeout(c.admission.handshake_timeout, handshake(&sock, &c)).await;
            c.pending.done(id);
            match accepted {
                Ok(Ok((att, rx))) => serve_attached(sock, att, rx, c).await,
                Ok(Err(why)) => {
                    c.admission_stats.refused.fetch_add(1, Ordering::Relaxed);
                    eprintln!("engine: refused an application: {why}");
                    admission::refuse(&sock, why).await;
                }
                Err(_) => {
                    c.admission_stats.timed_out.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        ctx.pending.started(id, task.abort_handle());
        if task.is_finished() {
            ctx.pending.done(id);
        }
    }
}

/// An accepted application's life: its drain loop and liveness watch,
/// until it detaches.
async fn serve_attached(
    mut live: tokio::net::UnixStream,
    att: Arc<Attachment>,
    rx: Receiver,
    ctx: Arc<Ctx>,
) {
    eprintln!(
        "engine: application {} (pid {}) attached for {}",
        att.id,
        att.pid,
        att.services.join(", ")
    );
    ctx.registry.add(att.clone());
    let watcher = att.clone();
    let watch = tokio::spawn(async move {
        // The socket carries nothing after the handshake: its end (the
        // process exited or was killed) or any byte detaches.
        let mut b = [0u8; 1];
        let why = match live.read(&mut b).await {
            Ok(0) | Err(_) => "the application's connection closed (exited or killed)",
            Ok(_) => "the application sent bytes on its attach socket",
        };
        watcher.detach(why);
    });
    drain(att.clone(), rx, &ctx).await;
    watch.abort();
    ctx.registry.remove(&att);
    ctx.seats.give_back();
    eprintln!(
        "engine: application {} (pid {}) detached: {}",
        att.id,
        att.pid,
        att.closed_reason().unwrap_or_default()
    );
}

async fn handshake(
    sock: &tokio::net::UnixStream,
    ctx: &Ctx,
) -> Result<(Arc<Attachment>, Receiver), String> {
    let peer = admission::credentials(sock).map_err(|e| format!("peer credentials: {e}"))?;
    let (msg, _) = admission::recv(sock).await.map_err(|e| format!("reading the request: {e}"))?;
    let hello = Hello::decode(&msg).map_err(|e| e.to_string())?;
    ctx.admission.check(&hello, &peer).map_err(|r| r.to_string())?;
    for (name, digest) in &hello.services {
        let schema = ctx
            .schemas
            .iter()
            .find(|s| s.services().contains(name))
            .ok_or_else(|| format!("the engine has no schema for service {name}"))?;
        let ours = schema.tables().digest();
        if ours != *digest {
            return Err(format!(
                "service {name}: schema tables differ (application {digest:016x}, engine {ours:016x}); build both from the same .proto files"
            ));
        }
    }
    let Some(seat) = ctx.seats.take(ctx.admission.max_applications) else {
        return Err(format!(
            "the engine serves its maximum of {} applications (attach.max_applications)",
            ctx.admission.max_applications
        ));
    };
    // The seat comes back if the handshake fails or is cut off (evicted,
    // timed out) from here on; once attached it is the application's until
    // it detaches.
    let attached = attach_region(sock, ctx, &hello, &peer).await?;
    seat.keep();
    Ok(attached)
}

async fn attach_region(
    sock: &tokio::net::UnixStream,
    ctx: &Ctx,
    hello: &Hello,
    peer: &admission::Credentials,
) -> Result<(Arc<Attachment>, Receiver), String> {
    let id = ctx.next_id.fetch_add(1, Ordering::Relaxed);
    let services = hello.services.iter().map(|(n, _)| n.clone()).collect();
    let answer = Answer::Accept { version: VERSION, id, layout: ctx.layout.clone() };
    // Rings are initialized (inside `Attachment::new`) before the answer
    // leaves, so the application never sees an uninitialized slot.
    let device = match &ctx.device {
        Some(opts) => Some(Arc::new(
            Device::new(opts, ctx.placement_tables.clone()).map_err(|e| e.to_string())?,
        )),
        None => None,
    };
    // The kernel's pid, not the one the application wrote.
    let pid = peer.pid.unwrap_or(hello.pid);
    let (region, att, rx) =
        region(id, pid, services, ctx.layout.clone(), device, ctx.budgets.clone())?;
    let fds = [&region.shared, &region.engine_half, region.app_bell.fd()];
    admission::send(sock, &answer.encode(), &fds)
        .await
        .map_err(|e| format!("sending the answer: {e}"))?;
    Ok((att, rx))
}

/// What the application receives with the answer: the region's two files
/// (both sealed against resizing, the engine's half also against writes)
/// and its end of the doorbell pair (the engine keeps the other: its file
/// flags are its own).
struct Region {
    shared: std::os::fd::OwnedFd,
    engine_half: std::os::fd::OwnedFd,
    app_bell: Bell,
}

/// A new region of `layout` and the engine's side of it (rings
/// initialized).
fn region(
    id: u32,
    pid: u32,
    services: Vec<String>,
    layout: Layout,
    device: Option<Arc<Device>>,
    budgets: Budgets,
) -> Result<(Region, Arc<Attachment>, Receiver), String> {
    let err = |e: std::io::Error| e.to_string();
    let shared = sys::memfd("protoplane-region", layout.shared_len() as usize).map_err(err)?;
    // Its size sealed before anybody maps it: an application that could
    // truncate it would take the engine down with SIGBUS.
    sys::seal_size(&shared).map_err(err)?;
    let engine_half = sys::memfd("protoplane-requests", layout.half_len() as usize).map_err(err)?;
    let map = Mapping::map_parts(&layout.engine_parts(&shared, &engine_half)).map_err(err)?;
    // Mapped writable here first; from now on nobody else can.
    sys::seal_writes(&engine_half).map_err(err)?;
    let map = Arc::new(map);
    let (ours, theirs) = Bell::pair().map_err(err)?;
    let ours = Arc::new(ours);
    let app_bell = Doorbell::new(map.clone(), APP_PARKED, ours.clone()).ok_or("doorbell")?;
    let engine_bell = Doorbell::new(map.clone(), ENGINE_PARKED, ours).ok_or("doorbell")?;
    let (att, rx) = Attachment::new(id, pid, services, map, layout, app_bell, engine_bell, budgets)
        .ok_or("the layout does not fit its region")?;
    if let Some(d) = device {
        att.set_device(d);
    }
    Ok((Region { shared, engine_half, app_bell: theirs }, att, rx))
}

/// Takes the application's descriptors until it detaches: spins for
/// `spin` after the last one, then parks on its doorbell. Also posts what
/// the engine owes it (cancels, chunk releases), watches that it keeps
/// consuming its request ring, and checks its budgets ([`budget`]) every
/// budget tick. At most `descriptors_per_pass` descriptors per pass, then
/// the runtime's other tasks (other applications' loops) run.
async fn drain(att: Arc<Attachment>, rx: Receiver, ctx: &Ctx) {
    let (spin, stall) = (ctx.spin, ctx.stall);
    let per_pass = ctx.budgets.descriptors_per_pass.max(1);
    let budget_tick = ctx.budgets.tick();
    let mut next_budget_check = Instant::now() + budget_tick;
    let Receiver { mut responses, engine_bell } = rx;
    let Ok(bell) = engine_bell.into_async() else {
        att.detach("cannot wait on the doorbell");
        return;
    };
    let mut spin_until = Instant::now() + spin;
    let mut watched = 0u64;
    let mut last_progress = Instant::now();
    while !att.is_closed() {
        let n = attachment::take(&att, &mut responses, per_pass);
        att.flush();
        let now = Instant::now();
        if now >= next_budget_check {
            next_budget_check = now + budget_tick;
            if let Err(why) = att.check_budgets() {
                att.detach(&why);
                break;
            }
        }
        let (produced, taken) = att.progress(watched);
        if taken > 0 || produced == watched {
            watched += taken;
            last_progress = now;
        } else if now.duration_since(last_progress) > stall {
            att.detach(&format!(
                "it stopped taking requests from its ring for {} ms",
                stall.as_millis()
            ));
            break;
        }
        if n > 0 {
            spin_until = now + spin;
            tokio::task::yield_now().await;
            continue;
        }
        if now < spin_until {
            tokio::task::yield_now().await;
            continue;
        }
        bell.prepare_park();
        if !responses.is_empty() || att.owes() || att.is_closed() {
            if !bell.unpark() {
                att.detach("the application closed its doorbell");
                break;
            }
            continue;
        }
        // The watchdog needs a look now and then: requests posted while
        // this loop is parked do not wake it (that would cost every call a
        // wake-up), so it looks four times per stall timeout.
        let tick = (stall / 4).min(budget_tick);
        tokio::select! {
            _ = bell.wait() => {}
            _ = att.wake.notified() => {}
            _ = tokio::time::sleep(tick.max(Duration::from_millis(1))) => {}
        }
        if !bell.unpark() {
            att.detach("the application closed its doorbell");
            break;
        }
        spin_until = Instant::now() + spin;
    }
}
