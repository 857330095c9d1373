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
//! [`attach`]`(path).serve(svc)` runs until the process is stopped: when the
//! engine goes away (restart, crash), the calls in progress are cancelled
//! and the application attaches again as soon as an engine listens.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::{AbortHandle, Abortable};
use protoplane_grpc::call::{Out, UnarySlot};
use protoplane_grpc::{
    BoxFuture, Code, Message, Metadata, Peer, Request, Responder, Service, Status, Streaming,
};
use protoplane_rpc::deadline::until_deadline;
use protoplane_seam::app::{AppSession, Incoming, SpanError, Taken};
use protoplane_seam::{OpenRepr, ReplyRepr};
use protoplane_shm::attach::{self, Answer, Hello, VERSION};
use protoplane_shm::desc::{self, Descriptor, Span};
use protoplane_shm::layout::{Chunk, Chunks, Half, Layout, APP_PARKED, ENGINE_PARKED};
use protoplane_shm::lease::{self, Held, Holder, Pool};
use protoplane_shm::{sys, AsyncDoorbell, Bell, Consumer, Doorbell, Mapping, Producer, Ring};
use protoplane_wire::{with_source, BlockSource, Lent};
use tokio::sync::{mpsc, Notify};

mod units;

pub use protoplane_offload::cu::{DeviceRef, ParamValue, TaskDescriptor};
pub use units::{device_ref, Done, Ticket, Units};

/// Requests queued per client-streaming call before the call fails.
const REQUEST_QUEUE: usize = 1024;
/// Responses queued per server-streaming call between handler and poster.
const RESPONSE_QUEUE: usize = 8;

/// An application to attach to the engine listening at a socket path.
pub struct App {
    path: PathBuf,
    services: Vec<Arc<dyn Service>>,
    spin: Duration,
    retry: Duration,
    stats: Arc<Stats>,
    units: Units,
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

    /// How long to spin after work before parking.
    pub fn spin(mut self, spin: Duration) -> App {
        self.spin = spin;
        self
    }

    /// Serves `svc` (and any added before) on a runtime of its own, until
    /// the process is stopped. Returns only on errors that retrying cannot
    /// fix (the engine refused the attachment).
    pub fn serve(self, svc: Arc<dyn Service>) -> Result<(), Error> {
        let app = self.service(svc);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        rt.block_on(app.run())
    }

    /// Serves on the current runtime; attaches again after the engine goes
    /// away, forever. Returns the engine's refusal, if it refuses.
    pub async fn run(self) -> Result<(), Error> {
        let mut announced = false;
        loop {
            match self.once().await {
                Ok(Ended::EngineGone) => {
                    eprintln!("app: the engine went away; attaching again");
                    announced = false;
                }
                Err(Error::Unreachable(why)) => {
                    if !announced {
                        eprintln!("app: waiting for an engine at {}: {why}", self.path.display());
                        announced = true;
                    }
                    tokio::time::sleep(self.retry).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One attachment, until the engine goes away.
    pub async fn once(&self) -> Result<Ended, Error> {
        if self.services.is_empty() {
            return Err(Error::Refused("no service to serve".into()));
        }
        let hello = Hello {
            version: VERSION,
            pid: std::process::id(),
            services: self
                .services
                .iter()
                .map(|s| (s.name().to_string(), s.schema().tables().digest()))
                .collect(),
        };
        let path = self.path.clone();
        let joined = tokio::task::spawn_blocking(move || connect(&path, &hello)).await;
        let (sock, layout, map, bell) = joined.map_err(|e| Error::Unreachable(e.to_string()))??;
        let session = Session::new(
            self.services.clone(),
            layout,
            map,
            bell,
            self.stats.clone(),
            self.units.inner.clone(),
        )
        .map_err(Error::Unreachable)?;
        self.units.inner.attach(&session);
        eprintln!(
            "app: attached to {} ({})",
            self.path.display(),
            self.services.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")
        );
        sock.set_nonblocking(true).map_err(|e| Error::Unreachable(e.to_string()))?;
        let sock = tokio::net::UnixStream::from_std(sock)
            .map_err(|e| Error::Unreachable(e.to_string()))?;
        let gone = async move {
            let mut b = [0u8; 1];
            loop {
                let _ = sock.readable().await;
                match sock.try_read(&mut b) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    _ => return,
                }
            }
        };
        tokio::select! {
            _ = gone => {}
            _ = session.clone().drain(self.spin) => {}
        }
        session.end();
        self.units.inner.fail_all();
        Ok(Ended::EngineGone)
    }
}

/// Why an application could not attach, or stopped serving.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The engine answered no (wrong schema, unknown service, version):
    /// retrying cannot help.
    Refused(String),
    /// No engine there, or the connection broke (worth retrying: `run`
    /// does, forever).
    Unreachable(String),
    /// The runtime [`App::serve`] runs on could not be built.
    Runtime(std::io::Error),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Refused(why) => write!(f, "the engine refused: {why}"),
            Error::Unreachable(why) => write!(f, "no engine to attach to: {why}"),
            Error::Runtime(e) => write!(f, "tokio runtime: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Runtime(e) => Some(e),
            _ => None,
        }
    }
}

type Connected = (UnixStream, Layout, Arc<Mapping>, Bell);

fn connect(path: &Path, hello: &Hello) -> Result<Connected, Error> {
    let un = |e: std::io::Error| Error::Unreachable(e.to_string());
    let sock = UnixStream::connect(path).map_err(un)?;
    sock.set_read_timeout(Some(Duration::from_secs(10))).map_err(un)?;
    attach::send(&sock, &hello.encode(), &[]).map_err(un)?;
    let (msg, fds) = attach::recv(&sock).map_err(un)?;
    let answer = Answer::decode(&msg).map_err(|e| Error::Refused(e.to_string()))?;
    let layout = match answer {
        Answer::Refuse(why) => return Err(Error::Refused(why)),
        Answer::Accept { version, layout, .. } if version == VERSION => layout,
        Answer::Accept { version, .. } => {
            return Err(Error::Refused(format!("engine speaks version {version}")))
        }
    };
    let mut fds = fds.into_iter();
    let (Some(shared), Some(requests), Some(bell)) = (fds.next(), fds.next(), fds.next()) else {
        return Err(Error::Unreachable("the engine's answer lacks its descriptors".into()));
    };
    let lens = (sys::file_len(&shared).map_err(un)?, sys::file_len(&requests).map_err(un)?);
    layout.validate(Some(lens)).map_err(|e| Error::Refused(e.to_string()))?;
    // The engine's half read-only: the engine sealed it, and this process
    // has no business writing it.
    let map = Mapping::map_parts(&layout.app_parts(&shared, &requests)).map_err(un)?;
    let bell = Bell::from_fd(bell).map_err(un)?;
    Ok((sock, layout, Arc::new(map), bell))
}

struct CallCtl {
    abort: AbortHandle,
    requests: Option<mpsc::Sender<Message>>,
}

/// What the session's lock guards: the session's rules and bookkeeping,
/// and the free list of this side's half.
struct State {
    chunks: Chunks,
    /// The calls running beyond their first poll, and the chunks either
    /// side holds of the other's half (tokens: the bytes that keep a chunk
    /// of this side's half out of the free list until its release).
    session: AppSession<CallCtl, Bytes>,
}

/// One attachment's shared state.
struct Session {
    services: Vec<Arc<dyn Service>>,
    map: Arc<Mapping>,
    responses: Producer,
    engine_bell: Doorbell,
    requests: Mutex<Option<(Consumer, AsyncDoorbell)>>,
    state: Mutex<State>,
    /// Room came back (a chunk or a ring slot): posters waiting retry.
    room: Notify,
    /// The drain loop has something to post.
    wake: Notify,
    /// This side's half of the layout (kept: working it out allocates).
    own_half: Half,
    stats: Arc<Stats>,
    /// Lends this side's chunks to the handlers' builders.
    source: Arc<dyn BlockSource>,
    /// The compute units' answers this process waits for.
    units: Arc<units::Inner>,
    /// Whether calls may start in the drain loop (the runtime is
    /// single-threaded, so a task would run on the same thread anyway).
    inline: bool,
}

impl Session {
    fn new(
        services: Vec<Arc<dyn Service>>,
        layout: Layout,
        map: Arc<Mapping>,
        bell: Bell,
        stats: Arc<Stats>,
        units: Arc<units::Inner>,
    ) -> Result<Arc<Session>, String> {
        let req = Ring::new(map.clone(), layout.request_ring(), layout.ring_slots)
            .ok_or("request ring outside the region")?;
        let resp = Ring::new(map.clone(), layout.response_ring(), layout.ring_slots)
            .ok_or("response ring outside the region")?;
        let bell = Arc::new(bell);
        let engine_bell =
            Doorbell::new(map.clone(), ENGINE_PARKED, bell.clone()).ok_or("engine doorbell")?;
        let app_bell = Doorbell::new(map.clone(), APP_PARKED, bell)
            .ok_or("application doorbell")?
            .into_async()
            .map_err(|e| e.to_string())?;
        Ok(Arc::new_cyclic(|me| Session {
            services,
            map,
            responses: Producer::new(resp),
            engine_bell,
            requests: Mutex::new(Some((Consumer::new(req), app_bell))),
            state: Mutex::new(State {
                chunks: Chunks::new(layout.app_chunks()),
                session: AppSession::new(layout.app_chunks(), layout.engine_chunks()),
            }),
            room: Notify::new(),
            wake: Notify::new(),
            own_half: layout.app_chunks(),
            stats,
            source: Arc::new(Responses(me.clone())),
            units,
            inline: tokio::runtime::Handle::try_current()
                .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread),
        }))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Cancels every call (the engine is gone).
    fn end(&self) {
        let (calls, handed) = self.state().session.end();
        for c in calls {
            c.abort.abort();
        }
        // Dropped outside the lock: the last reference frees its chunk,
        // which takes the lock.
        drop(handed);
        self.room.notify_waiters();
    }

    /// Takes requests until the engine goes away.
    async fn drain(self: Arc<Self>, spin: Duration) {
        let taken = self.requests.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some((mut ring, bell)) = taken else { return };
        let mut spin_until = Instant::now() + spin;
        loop {
            let mut n = 0;
            while n < 256 {
                let Some(d) = ring.pop() else { break };
                n += 1;
                self.take(d);
            }
            self.flush();
            if self.state().session.is_ended() {
                return;
            }
            let now = Instant::now();
            if n > 0 || now < spin_until {
                if n > 0 {
                    spin_until = now + spin;
                }
                tokio::task::yield_now().await;
                continue;
            }
            bell.prepare_park();
            if !ring.is_empty() || self.owes() {
                if !bell.unpark() {
                    return;
                }
                continue;
            }
            tokio::select! {
                _ = bell.wait() => {}
                _ = self.wake.notified() => {}
            }
            if !bell.unpark() {
                // The engine closed its end: it is gone.
                return;
            }
            spin_until = Instant::now() + spin;
        }
    }

    fn owes(&self) -> bool {
        self.state().session.owes()
    }

    /// Hands back released request chunks the calls did not carry.
    fn flush(&self) {
        loop {
            let Some(d) = self.state().session.poll_transmit() else { return };
            if self.responses.push(&d).is_err() {
                self.state().session.unsent(&d);
                return;
            }
            self.engine_bell.notify();
        }
    }

    /// Acts on one descriptor from the engine.
    fn take(self: &Arc<Self>, d: Descriptor) {
        // The engine is done with the chunks it releases: the bytes that
        // held them go (outside the lock: the last one frees its chunk).
        let mut back = Vec::new();
        let incoming = self.state().session.on_descriptor(&d, &mut back);
        drop(back);
        match incoming {
            Incoming::Released => return,
            Incoming::Notify => {
                // A compute unit's answer: its text in the side range.
                match self.side_of(&d) {
                    Ok(text) => self.units().complete(&d, text),
                    Err(st) => self.units().complete(
                        &Descriptor { code: st.code as u8, ..d },
                        Bytes::from(st.message.into_bytes()),
                    ),
                }
                return;
            }
            Incoming::Cancel | Incoming::Open | Incoming::More { .. } => {}
        }
        let message = match self.message_of(&d) {
            Ok(m) => m,
            Err(st) => {
                self.fail(d.call, st);
                return;
            }
        };
        let end = match incoming {
            Incoming::Cancel => {
                if let Some(c) = self.state().session.remove_call(d.call) {
                    c.abort.abort();
                }
                return;
            }
            Incoming::Open => {
                self.open(d, message);
                return;
            }
            Incoming::More { end } => end,
            Incoming::Released | Incoming::Notify => return,
        };
        let mut st = self.state();
        let Some(call) = st.session.call_mut(d.call) else { return };
        if let (Some(m), Some(tx)) = (message.map(|(m, _)| m), call.requests.as_ref()) {
            if tx.try_send(m).is_err() {
                let st2 = Status::new(Code::ResourceExhausted, "too many requests queued");
                drop(st);
                self.fail(d.call, st2);
                return;
            }
        }
        if end {
            call.requests = None;
        }
    }

    /// The side range of a descriptor that carries only that (a NOTIFY).
    fn side_of(self: &Arc<Self>, d: &Descriptor) -> Result<Bytes, Status> {
        let taken = self.state().session.take_side(d).map_err(bad)?;
        let Some(chunk) = taken else { return Ok(Bytes::new()) };
        let text = Held::new(self.clone(), chunk).piece(d.side);
        // A copy: the chunk goes back to the engine at once.
        Ok(Bytes::copy_from_slice(&text))
    }

    fn units(&self) -> &units::Inner {
        &self.units
    }

    /// The request message (and side sections) a descriptor carries, read
    /// in place in its chunk.
    #[allow(clippy::type_complexity)]
    fn message_of(self: &Arc<Self>, d: &Descriptor) -> Result<Option<(Message, Bytes)>, Status> {
        // Every range checked against the chunk it names; the wire bytes
        // in the same chunk, or where the engine received them (a chunk of
        // its half shared by several requests, held once more for this
        // one).
        let taken = self.state().session.take_message(d).map_err(bad)?;
        let Some(Taken { chunk, landing }) = taken else { return Ok(None) };
        let wire = landing.map(|l| Held::new(self.clone(), l));
        let held = Held::new(self.clone(), chunk);
        let piece = |s: Span| held.piece(s);
        let input = self
            .services
            .get(d.service as usize)
            .and_then(|s| s.schema().method(d.method).map(|m| m.input))
            .unwrap_or(u32::MAX);
        let wire = wire.map_or_else(|| piece(d.wire), |w| w.piece(d.wire));
        let mut m = Message::from_parts(piece(d.block), wire, input);
        // The engine decompressed it; a handler may still ask whether the
        // client compressed it (the interop suite's compressed requests do).
        m.set_compressed(d.has(desc::COMPRESS));
        Ok(Some((m, piece(d.side))))
    }

    fn fail(self: &Arc<Self>, call: u64, st: Status) {
        if let Some(c) = self.state().session.remove_call(call) {
            c.abort.abort();
        }
        let s = self.clone();
        tokio::spawn(async move {
            let _ = s.post_status(call, None, &st).await;
        });
    }

    /// Starts a call.
    fn open(self: &Arc<Self>, d: Descriptor, message: Option<(Message, Bytes)>) {
        let Some(svc) = self.services.get(d.service as usize).cloned() else {
            self.fail(d.call, Status::new(Code::Unimplemented, "no such service here"));
            return;
        };
        // Only the shape is needed (not the names: no allocation per call).
        let Some((client_streaming, server_streaming, output)) = svc
            .schema()
            .method(d.method)
            .map(|m| (m.client_streaming, m.server_streaming, m.output))
        else {
            self.fail(d.call, Status::new(Code::Unimplemented, "no such method here"));
            return;
        };
        let (message, side) = match message {
            Some((m, side)) => (Some(m).filter(|_| d.has(desc::MESSAGE)), side),
            None => (None, Bytes::new()),
        };
        // The client's address stays with the engine: the application is
        // told only what identifies the client (its verified certificates).
        let (metadata, peer) = match OpenRepr::parse(&side) {
            Ok(open) => {
                let certificates = open.peer_certificates;
                let peer =
                    (!certificates.is_empty()).then(|| Arc::new(Peer { addr: None, certificates }));
                (open.metadata, peer)
            }
            Err(e) => {
                self.fail(d.call, e.into());
                return;
            }
        };
        let deadline =
            (d.timeout_ns > 0).then(|| Instant::now() + Duration::from_nanos(d.timeout_ns));
        let (requests, streaming) = if client_streaming {
            let (tx, rx) = mpsc::channel(REQUEST_QUEUE);
            if let Some(m) = message {
                let _ = tx.try_send(m);
            }
            ((!d.has(desc::END)).then_some(tx), Streaming::queue(rx))
        } else {
            match message {
                Some(m) => (None, Streaming::one(m)),
                None => {
                    self.fail(
                        d.call,
                        Status::new(Code::Internal, "a unary call without its request"),
                    );
                    return;
                }
            }
        };
        let request = Request { metadata, deadline, peer, message: streaming };
        let call = d.call;
        let mut driver = Box::pin(self.clone().drive(
            call,
            svc,
            d.method,
            output,
            server_streaming,
            request,
            deadline,
        ));
        // Run to completion where it can: on a single-threaded runtime a
        // handler that does not wait (most unary ones) runs here, in the
        // drain loop, and posts its answer before the next descriptor is
        // taken — no task, no abort handle, no entry in the call table (a
        // cancel cannot arrive before it ends). One that waits becomes a
        // task: the runtime polls it again at once, with a real waker, so
        // the no-op waker of this first poll is never relied on.
        if self.inline && !client_streaming {
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            // A task would contain a handler's panic; here it must not
            // unwind through the drain loop: the call fails instead.
            let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                std::future::Future::poll(driver.as_mut(), &mut cx).is_ready()
            }));
            match polled {
                Ok(true) => return,
                Ok(false) => {}
                Err(_) => {
                    drop(driver);
                    self.fail(call, Status::new(Code::Internal, "the handler panicked"));
                    return;
                }
            }
        }
        let (abort, reg) = AbortHandle::new_pair();
        self.state().session.insert_call(call, CallCtl { abort, requests });
        let s = self.clone();
        tokio::spawn(async move {
            // Aborted: the engine cancelled the call, or went away; it
            // expects no answer.
            let _ = Abortable::new(driver, reg).await;
            s.state().session.remove_call(call);
        });
    }

    /// Runs one call's handler and posts what it sends.
    #[allow(clippy::too_many_arguments)]
    async fn drive(
        self: Arc<Self>,
        call: u64,
        svc: Arc<dyn Service>,
        method: u32,
        output: u32,
        server_streaming: bool,
        request: Request<Streaming>,
        deadline: Option<Instant>,
    ) {
        if !server_streaming {
            let (responder, slot) = Responder::for_unary(output);
            let mut slot = UnarySlot::new(slot);
            let handler = self.in_region(svc.call(method, request, responder));
            let timed = until_deadline(deadline, handler);
            tokio::pin!(timed);
            // Headers the handler sends explicitly go to the engine at once,
            // in a descriptor of their own.
            let outcome = loop {
                tokio::select! {
                    biased;
                    r = &mut timed => break r,
                    md = slot.early_headers() => {
                        if self.post_item(call, Some(md), None).await.is_err() {
                            return;
                        }
                    }
                }
            };
            let (early, one) = slot.finish();
            if let Some(md) = early {
                if self.post_item(call, Some(md), None).await.is_err() {
                    return;
                }
            }
            let item = one.message.filter(|_| outcome.is_ok());
            let st = match outcome {
                Ok(trailers) => Status { metadata: trailers, ..Status::ok() },
                Err(st) => st,
            };
            let _ = self.post_final(call, one.headers, item, &st).await;
            return;
        }
        let (responder, mut outs) = Responder::for_stream(output, RESPONSE_QUEUE);
        let timed = until_deadline(deadline, self.in_region(svc.call(method, request, responder)));
        tokio::pin!(timed);
        let mut headers: Option<Metadata> = None;
        let mut outcome = None;
        let mut open = true;
        while outcome.is_none() || open {
            tokio::select! {
                biased;
                o = outs.recv(), if open => match o {
                    None => open = false,
                    Some(Out::Headers(md)) => {
                        headers = None;
                        if self.post_item(call, Some(md), None).await.is_err() {
                            return;
                        }
                    }
                    Some(Out::Staged(md)) => headers = Some(md),
                    Some(item) => {
                        if self.post_item(call, headers.take(), Some(item)).await.is_err() {
                            return;
                        }
                    }
                },
                r = &mut timed, if outcome.is_none() => outcome = Some(r),
            }
        }
        let st = match outcome {
            Some(Ok(trailers)) => Status { metadata: trailers, ..Status::ok() },
            Some(Err(st)) => st,
            None => Status::new(Code::Internal, "the handler ended without an outcome"),
        };
        let _ = self.post_status(call, headers, &st).await;
    }

    async fn post_item(
        self: &Arc<Self>,
        call: u64,
        headers: Option<Metadata>,
        item: Option<Out>,
    ) -> Result<(), ()> {
        let mut d = Descriptor { call, ..Descriptor::default() };
        let (block, wire) = split_out(&mut d, item);
        if let Some(md) = headers {
            if self.placed(&block, &wire).is_some() {
                // The message goes in place, alone: headers first.
                let h = Descriptor { call, flags: desc::HEADERS, ..Descriptor::default() };
                self.post(h, Bytes::new(), Bytes::new(), side_frame(Some(&md), None)).await?;
            } else {
                d.flags |= desc::HEADERS;
                return self.post(d, block, wire, side_frame(Some(&md), None)).await;
            }
        }
        if d.flags == 0 {
            return Ok(());
        }
        self.post(d, block, wire, Vec::new()).await
    }

    async fn post_status(
        self: &Arc<Self>,
        call: u64,
        headers: Option<Metadata>,
        st: &Status,
    ) -> Result<(), ()> {
        self.post_final(call, headers, None, st).await
    }

    /// The call's last descriptor: optional headers and message, and the
    /// status. A message laid out in the region goes in place, in a
    /// descriptor of its own if there are side sections to send too.
    async fn post_final(
        self: &Arc<Self>,
        call: u64,
        headers: Option<Metadata>,
        item: Option<Out>,
        st: &Status,
    ) -> Result<(), ()> {
        let headers = headers.filter(|h| !h.is_empty());
        let mut d = Descriptor {
            call,
            flags: desc::STATUS | desc::END,
            code: st.code as u8,
            ..Descriptor::default()
        };
        let (block, wire) = split_out(&mut d, item);
        let side = side_frame(headers.as_ref(), Some(st));
        if !side.is_empty() && d.has(desc::MESSAGE) && self.placed(&block, &wire).is_some() {
            let message = d.flags & (desc::MESSAGE | desc::ENCODED | desc::COMPRESS);
            if let Some(md) = &headers {
                let h = Descriptor { call, flags: desc::HEADERS, ..Descriptor::default() };
                self.post(h, Bytes::new(), Bytes::new(), side_frame(Some(md), None)).await?;
            }
            let m = Descriptor { call, flags: message, ..Descriptor::default() };
            self.post(m, block, wire, Vec::new()).await?;
            let end = Descriptor { flags: desc::STATUS | desc::END, ..d };
            return self.post(end, Bytes::new(), Bytes::new(), side_frame(None, Some(st))).await;
        }
        if headers.is_some() {
            d.flags |= desc::HEADERS;
        }
        self.post(d, block, wire, side).await
    }

    /// A handler's future, polled with this side's chunks lending the
    /// memory of the blocks it builds: responses are laid out in place.
    fn in_region(&self, fut: BoxFuture<'static, Result<Metadata, Status>>) -> InRegion {
        InRegion { fut, source: self.source.clone() }
    }

    /// Where a response message lies in a chunk of this side's half that
    /// is not handed over yet: the chunk, and whether it is the block.
    fn placed(&self, block: &Bytes, wire: &Bytes) -> Option<(Chunk, Span, bool)> {
        let (msg, is_block) = if block.is_empty() { (wire, false) } else { (block, true) };
        let (chunk, span) = lease::locate(&self.map, &self.own_half, msg)?;
        let free = self.state().session.is_free(chunk);
        // Already handed over (the same bytes sent twice): the second time
        // is a copy.
        free.then_some((chunk, span, is_block))
    }

    /// Posts a response: in place if its message lies in one of this
    /// side's chunks and there are no side sections, else copied into a
    /// fresh chunk, waiting for room (chunks come back as the engine
    /// sends). Either way the chunk stays out of the free list until the
    /// engine releases it.
    async fn post(
        self: &Arc<Self>,
        mut d: Descriptor,
        block: Bytes,
        wire: Bytes,
        side: Vec<u8>,
    ) -> Result<(), ()> {
        let message = d.has(desc::MESSAGE);
        if message {
            self.stats.responses.fetch_add(1, Ordering::Relaxed);
        }
        let in_place = if side.is_empty() { self.placed(&block, &wire) } else { None };
        let held = match in_place {
            Some((chunk, span, is_block)) => {
                if is_block {
                    d.block = span;
                } else {
                    d.wire = span;
                }
                d.chunk = chunk.offset;
                self.stats.responses_in_place.fetch_add(1, Ordering::Relaxed);
                Some((chunk, if is_block { block } else { wire }))
            }
            None => match self.copy(&mut d, &block, &wire, &side).await? {
                Posted::Copied(chunk, held) => {
                    let n = (block.len() + wire.len()) as u64;
                    self.stats.response_bytes_copied.fetch_add(n, Ordering::Relaxed);
                    Some((chunk, held))
                }
                Posted::Nothing => None,
                Posted::TooLarge(need) => {
                    // Too large for any chunk: the call fails instead.
                    let too = Status::new(
                        Code::ResourceExhausted,
                        format!("response of {need} bytes exceeds the region's largest chunk"),
                    );
                    let d = Descriptor {
                        call: d.call,
                        flags: desc::STATUS | desc::END,
                        code: too.code as u8,
                        ..Descriptor::default()
                    };
                    let side = side_frame(None, Some(&too));
                    return Box::pin(self.post(d, Bytes::new(), Bytes::new(), side)).await;
                }
            },
        };
        // Held until the engine releases it (before the descriptor leaves:
        // the release may come at once). `held` itself goes after the lock:
        // the last reference frees the chunk, which takes the lock.
        let token = held.as_ref().map(|(chunk, bytes)| (*chunk, bytes.clone()));
        let replaced = self.state().session.hand_over(&mut d, token).map_err(|_| ())?;
        drop(replaced);
        loop {
            match self.responses.push(&d) {
                Ok(()) => {
                    self.engine_bell.notify();
                    return Ok(());
                }
                Err(_) => {
                    if self.state().session.is_ended() {
                        return Err(());
                    }
                    tokio::time::sleep(Duration::from_micros(100)).await;
                }
            }
        }
    }

    /// Copies a response's parts into a fresh chunk of this side's half,
    /// waiting for one to come back if none is free.
    async fn copy(
        self: &Arc<Self>,
        d: &mut Descriptor,
        block: &[u8],
        wire: &[u8],
        side: &[u8],
    ) -> Result<Posted, ()> {
        let need = lease::message_len(block, wire, side);
        if need == 0 {
            return Ok(Posted::Nothing);
        }
        loop {
            let notified = self.room.notified();
            let got = {
                let mut st = self.state();
                if st.session.is_ended() {
                    return Err(());
                }
                if !st.chunks.fits(need) {
                    return Ok(Posted::TooLarge(need));
                }
                st.chunks.alloc(need)
            };
            match got {
                Some(c) => {
                    lease::place(&self.map, c, d, block, wire, side);
                    return Ok(Posted::Copied(c, lease::own(self, c)));
                }
                None => {
                    // No chunk free now: wait for the engine to release one.
                    let _ = tokio::time::timeout(Duration::from_millis(10), notified).await;
                }
            }
        }
    }
}

/// What [`Session::copy`] did.
enum Posted {
    /// Copied into a chunk, held by the bytes.
    Copied(Chunk, Bytes),
    /// Nothing to copy (a descriptor without bytes).
    Nothing,
    /// No chunk is large enough.
    TooLarge(usize),
}

impl Pool for Session {
    fn map(&self) -> &Arc<Mapping> {
        &self.map
    }

    fn alloc(&self, need: usize) -> Option<Chunk> {
        let mut st = self.state();
        if st.session.is_ended() {
            return None;
        }
        st.chunks.alloc(need)
    }

    fn free(&self, chunk: Chunk) {
        let _ = self.state().chunks.free(chunk.offset);
        self.room.notify_waiters();
    }
}

/// Where a split application's handlers build their responses: chunks of
/// its half of the region, lent to the builders (see `wire::with_source`).
/// (Weak: the session holds it.)
struct Responses(std::sync::Weak<Session>);

impl BlockSource for Responses {
    fn lend(&self) -> Option<Lent> {
        // The smallest chunk first; a block that outgrows it moves to a
        // bigger one (as a `Vec` would reallocate).
        lease::lend(&self.0.upgrade()?, 1, true)
    }
}

/// A handler's future, polled with its application's region lending the
/// memory of every block it builds.
struct InRegion {
    fut: BoxFuture<'static, Result<Metadata, Status>>,
    source: Arc<dyn BlockSource>,
}

impl std::future::Future for InRegion {
    type Output = Result<Metadata, Status>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let source = self.source.clone();
        with_source(source, || self.fut.as_mut().poll(cx))
    }
}

impl Holder for Session {
    fn mapping(&self) -> &Mapping {
        &self.map
    }

    /// A request chunk's lease ended: hand it back.
    fn give_back(&self, c: Chunk) {
        let owed = self.state().session.give_back(c);
        if owed {
            self.wake.notify_one();
        }
    }
}

/// A descriptor from the engine whose ranges cannot be read: its call
/// fails with INTERNAL.
fn bad(e: SpanError) -> Status {
    Status::new(Code::Internal, format!("engine descriptor: {e}"))
}

/// Where a response item's bytes go: a block, or already encoded bytes.
fn split_out(d: &mut Descriptor, item: Option<Out>) -> (Bytes, Bytes) {
    match item {
        Some(Out::Block(b, z)) => {
            d.flags |= desc::MESSAGE | if z { desc::COMPRESS } else { 0 };
            (b, Bytes::new())
        }
        Some(Out::Encoded(b, z)) => {
            d.flags |= desc::MESSAGE | desc::ENCODED | if z { desc::COMPRESS } else { 0 };
            (Bytes::new(), b)
        }
        Some(Out::Headers(_) | Out::Staged(_)) | None => (Bytes::new(), Bytes::new()),
    }
}

/// The side sections of a reply carrying `headers` and `status`.
fn side_frame(headers: Option<&Metadata>, status: Option<&Status>) -> Vec<u8> {
    let mut out = Vec::new();
    ReplyRepr::emit_parts(headers, status, &mut out);
    out
}
