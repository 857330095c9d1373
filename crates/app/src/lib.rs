//! The application side of split mode: business logic in its own process,
//! attached to a protoplane engine over shared memory.
//!
//! ```ignore
//! // monolithic: the process binds a port and runs the whole stack
//! Arc::new(Router::new(opts).add_service(svc)).serve(listener).await?;
//! // split: the same service, and the engine does the rest
//! protoplane_app::attach("/tmp/protoplane.sock").serve(svc)?;
//! ```
//!
//! The same [`Service`] implementation (generated or dynamic) runs either
//! way: requests arrive as the same [`Message`] — a linearized block whose
//! strings reference the wire bytes, both read in place in the region —
//! and responses leave through the same [`Responder`]. While a handler
//! runs, every builder it starts lays its block out in a chunk of this
//! process's half of the region (`protoplane_wire::with_source`), so a
//! response is posted where it was built: this process copies no byte of
//! it (the engine copies it out once, as it reads nothing an application
//! can write in place). This process never
//! sees a socket other than the attach socket, a varint or an HTTP/2
//! frame.
//!
//! [`Message`]: protoplane_grpc::Message
//! [`Responder`]: protoplane_grpc::Responder
//!
//! [`attach`](fn@attach)`(path).serve(svc)` runs until the process is stopped: when the
//! engine goes away (restart, crash), the calls in progress are cancelled
//! and the application attaches again as soon as an engine listens.
//!
//! The crate, module by module (all but the builder private):
//! - this file: the [`App`] builder, its attach-and-retry loop, [`Stats`];
//! - `connect`: the attach handshake and the region it hands over;
//! - `session`: one attachment's driver around the sans-IO
//!   `protoplane_seam::app::AppSession` (the drain loop, each descriptor
//!   acted on), with `session::dispatch` (calls started, handlers run),
//!   `session::post` (responses posted, in place or copied) and
//!   `session::pool` (this side's half lent to the handlers' builders);
//! - `units`: the engine's compute units as this application reaches them;
//! - `error`: [`Error`].

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use protoplane_grpc::Service;
use protoplane_shm::attach::{Hello, VERSION};

mod connect;
mod error;
mod outbound;
mod session;
mod units;

pub use error::Error;
pub use protoplane_offload::cu::{DeviceRef, ParamValue, TaskDescriptor};
pub use units::{device_ref, Done, Ticket, Units};

use session::Session;

/// An application to attach to the engine listening at a socket path.
pub struct App {
    path: PathBuf,
    services: Vec<Arc<dyn Service>>,
    spin: Duration,
    retry: Duration,
    stats: Arc<Stats>,
    units: Units,
    /// Outbound channels declared (index = channel index in descriptors),
    /// and the schemas they call.
    channels: Vec<protoplane_shm::attach::ChannelDecl>,
    channel_schemas: Vec<Arc<protoplane_grpc::Schema>>,
    outbound: Arc<outbound::Shared>,
    lanes: bool,
}

/// What an application counts, across its attachments.
#[derive(Debug, Default)]
pub struct Stats {
    /// Responses posted to the engine.
    pub responses: AtomicU64,
    /// Of those, how many the engine reads where the handler's builder laid
    /// them out (no byte copied).
    pub responses_in_place: AtomicU64,
    /// Bytes copied into the region for responses that were not built
    /// there (already encoded, too large for a chunk, side sections that
    /// did not fit beside the block).
    pub response_bytes_copied: AtomicU64,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.services.iter().map(|s| s.name()).collect();
        f.debug_struct("App").field("path", &self.path).field("services", &names).finish()
    }
}

/// An application for the engine whose attach socket is `path`.
pub fn attach(path: impl AsRef<Path>) -> App {
    App {
        path: path.as_ref().to_path_buf(),
        services: Vec::new(),
        spin: Duration::from_micros(20),
        retry: Duration::from_millis(100),
        stats: Arc::default(),
        units: Units::default(),
        channels: Vec::new(),
        channel_schemas: Vec::new(),
        outbound: Arc::default(),
        lanes: true,
    }
}

/// How one attachment ended.
#[derive(Debug)]
pub enum Ended {
    /// The engine went away (the application will attach again).
    EngineGone,
}

impl App {
    /// Adds a service (an application may serve several).
    pub fn service(mut self, svc: Arc<dyn Service>) -> App {
        self.services.push(svc);
        self
    }

    /// The application's counters (shared: read them while it runs).
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// The engine's compute units, as this application reaches them (see
    /// [`Units`]): take it before `serve` and give it to the handlers.
    pub fn units(&self) -> Units {
        self.units.clone()
    }

    /// A channel to `target` whose calls the engine makes (see
    /// [`outbound`](crate::outbound)): every service of `schema` may be
    /// called on it, with the client stub one would use in monolithic
    /// mode (`KvClient::new(app.channel(target, kv_server::schema()))`).
    /// Declared at attach: call it before `serve`. The engine refuses the
    /// attachment if it may not call `target` (`[outbound] allow`).
    ///
    /// Unary calls only: streaming calls on it fail UNIMPLEMENTED.
    pub fn channel(
        &mut self,
        target: &str,
        schema: &Arc<protoplane_grpc::Schema>,
    ) -> protoplane_rpc::Channel {
        let first = self.channels.len();
        let decls = outbound::declare(target, schema);
        let services = decls
            .iter()
            .enumerate()
            .map(|(i, d)| (d.service.clone(), (first + i).min(255) as u8))
            .collect();
        self.channels.extend(decls);
        if !self.channel_schemas.iter().any(|s| s.tables().digest() == schema.tables().digest()) {
            self.channel_schemas.push(schema.clone());
        }
        let ch = outbound::EngineChannel {
            shared: self.outbound.clone(),
            target: target.to_string(),
            digest: schema.tables().digest(),
            schema: schema.clone(),
            services,
        };
        protoplane_rpc::Channel::delegated(target, Arc::new(ch))
    }

    /// Whether to attach once per engine worker (the default), so each
    /// worker posts this application's calls on rings of its own, or once
    /// (every worker posts on the same rings, taking turns on their lock).
    pub fn lanes(mut self, yes: bool) -> App {
        self.lanes = yes;
        self
    }

    /// How long to spin after work before parking.
    pub fn spin(mut self, spin: Duration) -> App {
        self.spin = spin;
        self
    }

    /// Serves `svc` (and any added before) on a runtime of its own, until
    /// the process is stopped. Returns only on errors that retrying cannot
    /// fix (the engine refused the attachment).
    ///
    /// Called from inside a runtime (`#[tokio::main]`), it runs its own
    /// single-threaded runtime on a thread of its own and blocks the
    /// caller until it ends (a runtime cannot be started on a thread that
    /// runs one); `.run().await` serves on the caller's runtime instead.
    pub fn serve(self, svc: Arc<dyn Service>) -> Result<(), Error> {
        let app = self.service(svc);
        let own = move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(Error::Runtime)?;
            rt.block_on(app.run())
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return own();
        }
        std::thread::scope(|s| {
            s.spawn(own).join().unwrap_or_else(|_| {
                Err(Error::Runtime(std::io::Error::other("the application's runtime panicked")))
            })
        })
    }

    /// Serves on the current runtime; attaches again after the engine goes
    /// away, forever. Returns the engine's refusal, if it refuses.
    ///
    /// When another engine takes over (the engine sends `M` on the attach
    /// connection, see `protoplane_engine::admin`), this attaches to the
    /// same path (where the new engine now listens) at once and keeps
    /// serving the old attachment until the old engine closes it: calls in
    /// flight there finish, new ones arrive through the new one, and the
    /// handlers never notice.
    pub async fn run(self) -> Result<(), Error> {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        let mut announced = false;
        // Attachments to engines being replaced, finishing their calls.
        let mut leaving = FuturesUnordered::new();
        loop {
            let (moved_tx, mut moved) = tokio::sync::oneshot::channel();
            let mut current = Box::pin(self.attachment(Some(moved_tx)));
            let mut asked = false;
            let ended = loop {
                tokio::select! {
                    // The engine's "moving" comes before the end of the
                    // attachment it arrived on: when both are ready (the
                    // old engine drained at once), this is a replacement,
                    // not an engine that went away.
                    biased;
                    m = &mut moved, if !asked => {
                        asked = true;
                        if m.is_ok() {
                            break None;
                        }
                    }
                    r = &mut current => break Some(r),
                    _ = leaving.next(), if !leaving.is_empty() => {}
                }
            };
            match ended {
                None => {
                    tracing::info!("the engine is being replaced; attaching to the new one");
                    leaving.push(current);
                    announced = false;
                }
                // The attachment told of the move and ended in one poll
                // (its calls ended as the note arrived): still a move.
                Some(Ok(Ended::EngineGone)) if !asked && moved.try_recv().is_ok() => {
                    tracing::info!("the engine is being replaced; attaching to the new one");
                    announced = false;
                }
                Some(Ok(Ended::EngineGone)) => {
                    tracing::warn!("the engine went away; attaching again");
                    announced = false;
                }
                Some(Err(Error::Unreachable(why))) => {
                    if !announced {
                        tracing::warn!("waiting for an engine at {}: {why}", self.path.display());
                        announced = true;
                    }
                    let pause = tokio::time::sleep(self.retry);
                    tokio::pin!(pause);
                    loop {
                        tokio::select! {
                            _ = &mut pause => break,
                            _ = leaving.next(), if !leaving.is_empty() => {}
                        }
                    }
                }
                Some(Err(e)) => return Err(e),
            }
        }
    }

    /// One attachment, until the engine goes away.
    pub async fn once(&self) -> Result<Ended, Error> {
        self.attachment(None).await
    }

    /// One attachment, until the engine goes away; `moved` is told if the
    /// engine asks the application to attach to the one taking over (this
    /// attachment goes on until the old engine closes it).
    async fn attachment(
        &self,
        mut moved: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> Result<Ended, Error> {
        if self.services.is_empty() && self.channels.is_empty() {
            return Err(Error::Refused("no service to serve and no channel to call".into()));
        }
        if self.channels.len() > protoplane_shm::attach::MAX_CHANNELS {
            return Err(Error::Refused(format!(
                "{} outbound channels (at most {})",
                self.channels.len(),
                protoplane_shm::attach::MAX_CHANNELS
            )));
        }
        let hello = Hello {
            version: VERSION,
            pid: std::process::id(),
            services: self
                .services
                .iter()
                .map(|s| (s.name().to_string(), s.schema().tables().digest()))
                .collect(),
            schemas: false,
            channels: self.channels.clone(),
            lanes: self.lanes,
        };
        // One file per distinct schema, as many as a message carries.
        let hello =
            Hello { schemas: hello.digests().len() <= protoplane_shm::sys::MAX_FDS, ..hello };
        // Each distinct schema's descriptor set travels with the HELLO, so
        // an engine built from another version of it serves this one with
        // these tables (see `protoplane_shm::attach`).
        let sets: Vec<Vec<u8>> = hello
            .digests()
            .iter()
            .filter_map(|d| {
                let served = self.services.iter().map(|s| s.schema());
                served.chain(self.channel_schemas.iter()).find(|s| s.tables().digest() == *d)
            })
            .map(|s| connect::descriptor_set(s))
            .collect();
        // The first lane says how many the engine wants: one per worker
        // it shards connections over, each with its own region and rings
        // and served by that worker alone (`protoplane_shm::attach`).
        let (hello, sets) = (Arc::new(hello), Arc::new(sets));
        // Each lane's socket and session; however this attachment ends (the
        // engine gone, or this future dropped: an aborted task), the
        // sessions end with it (`EndsSession`): handlers stop, posters
        // waiting for room give up, and the last references to the regions
        // and the doorbells go, so the engine sees it leave.
        let mut lanes: Vec<(tokio::net::UnixStream, EndsSession)> = Vec::new();
        let mut want = 1;
        while lanes.len() < want {
            let (path, hello, sets) = (self.path.clone(), hello.clone(), sets.clone());
            let joined =
                tokio::task::spawn_blocking(move || connect::connect(&path, &hello, &sets)).await;
            let connected = joined.map_err(|e| Error::Unreachable(e.to_string()))?;
            let (sock, layout, map, bell, n) = match connected {
                Ok(c) => c,
                // A lane beyond the first that the engine refuses (its
                // seats are taken): the lanes attached serve, every worker
                // reaching them.
                Err(Error::Refused(why)) if !lanes.is_empty() => {
                    tracing::warn!(
                        "the engine refused lane {} of {want}: {why}; serving on {}",
                        lanes.len() + 1,
                        lanes.len()
                    );
                    break;
                }
                Err(e) => return Err(e),
            };
            if lanes.is_empty() {
                want = usize::from(n).max(1);
            }
            let session = Session::new(
                self.services.clone(),
                layout,
                map,
                bell,
                self.stats.clone(),
                self.units.inner.clone(),
            )
            .map_err(Error::Unreachable)?;
            let session = EndsSession(session);
            sock.set_nonblocking(true).map_err(|e| Error::Unreachable(e.to_string()))?;
            let sock = tokio::net::UnixStream::from_std(sock)
                .map_err(|e| Error::Unreachable(e.to_string()))?;
            lanes.push((sock, session));
        }
        for (_, s) in &lanes {
            s.0.share_thread(lanes.len() > 1);
        }
        // Compute units and outbound calls go through the first lane.
        let (_, EndsSession(first)) = &lanes[0];
        self.units.inner.attach(first);
        self.outbound.attach(first);
        tracing::info!(
            "attached to {} ({}{})",
            self.path.display(),
            self.services.iter().map(|s| s.name()).collect::<Vec<_>>().join(", "),
            if lanes.len() > 1 { format!("; {} lanes", lanes.len()) } else { String::new() }
        );
        let moved = std::sync::Mutex::new(moved.take());
        let tell_moved = || {
            if let Some(tx) = moved.lock().unwrap_or_else(|e| e.into_inner()).take() {
                let _ = tx.send(());
            }
        };
        // Each lane's socket: its end, or any byte but `M`, is the engine
        // gone; `M` asks the application to attach to another engine.
        let gone = lanes.iter().map(|(sock, _)| {
            Box::pin(async {
                let mut b = [0u8; 1];
                loop {
                    let _ = sock.readable().await;
                    match sock.try_read(&mut b) {
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        Ok(1) if b[0] == b'M' => tell_moved(),
                        _ => return,
                    }
                }
            })
        });
        let drains = lanes.iter().map(|(_, s)| Box::pin(s.0.clone().drain(self.spin)));
        tokio::select! {
            _ = futures_util::future::select_all(gone) => {}
            _ = futures_util::future::select_all(drains) => {}
        }
        // The engine writes its `M` before it detaches this attachment, so
        // when the calls ended first the byte is already here: this was a
        // move, not the engine going away.
        for (sock, _) in &lanes {
            let mut b = [0u8; 1];
            if matches!(sock.try_read(&mut b), Ok(1)) && b[0] == b'M' {
                tell_moved();
            }
        }
        drop(lanes);
        self.units.inner.fail_all();
        Ok(Ended::EngineGone)
    }
}

/// Ends a session when dropped (see `App::attachment`).
struct EndsSession(Arc<Session>);

impl Drop for EndsSession {
    fn drop(&mut self) {
        self.0.end();
    }
}
