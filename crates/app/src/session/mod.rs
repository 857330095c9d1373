//! One attachment's session driver: the rings, the doorbells and the
//! mapping around the sans-IO `protoplane_seam::app::AppSession`, which it
//! asks about every descriptor, call and chunk.
//!
//! The drain loop ([`Session::drain`]) takes the engine's descriptors from
//! the request ring in passes (one clock reading and one ring of the
//! engine's doorbell per pass, unary handlers run to completion inside
//! it), spins a little after work and then parks on its doorbell; each
//! descriptor's releases, kind and ranges are the
//! session's decision, and this driver turns them into actions: a request
//! read in place in its chunk ([`Held`] pieces, the chunk handed back when
//! the last piece goes), a call started ([`dispatch`]), a handler aborted,
//! a compute unit's answer completed. What the handlers send leaves
//! through [`post`]; the memory they build it in is lent by [`pool`].
//!
//! Locking: one mutex guards the session and the free list; dropping the
//! bytes that hold a chunk frees it, which takes that mutex, so chunk
//! tokens the session hands back are always dropped after the lock.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::AbortHandle;
use protoplane_grpc::{Code, Message, Service, Status};
use protoplane_seam::app::{AppSession, Incoming, SpanError, Taken};
use protoplane_shm::desc::{self, Descriptor, Span};
use protoplane_shm::layout::{Chunk, Chunks, Half, Layout, APP_PARKED, ENGINE_PARKED};
use protoplane_shm::lease::{Held, Holder};
use protoplane_shm::{AsyncDoorbell, Bell, Consumer, Doorbell, Mapping, Producer, Ring};
use protoplane_wire::BlockSource;
use tokio::sync::{mpsc, Notify};

use crate::{units, Stats};

mod dispatch;
mod outbound;
mod pool;
mod post;

use pool::Responses;

/// A call in the session's table: how to stop its handler, and where its
/// further requests go (client streaming, until the last).
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
    session: AppSession<CallCtl, Bytes, outbound::Waiter>,
}

/// One attachment's shared state.
pub(crate) struct Session {
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
    /// The client connections the engine named, by slot (the engine's
    /// `attachment::peers`): an OPEN's code field is its client's slot.
    peers: Mutex<Vec<Option<Arc<protoplane_grpc::Peer>>>>,
    /// The drain loop is in a pass: descriptors pushed meanwhile leave the
    /// engine's doorbell to the end of the pass ([`Pass`]).
    in_pass: AtomicBool,
    /// A descriptor was pushed and the engine's doorbell not yet rung for
    /// it.
    bell_owed: AtomicBool,
    /// Calls running as tasks (their handlers waited): while any is, the
    /// drain loop gives the runtime a turn after every pass.
    tasks: AtomicUsize,
    /// The pass woke a task (an outbound call's or a compute unit's
    /// waiter): the runtime gets its turn after the pass.
    woke: AtomicBool,
    /// Other lanes' drain loops share the runtime ([`Session::share_thread`]).
    shares: AtomicBool,
}

/// Busy passes run back to back for up to this long without a trip through
/// the runtime, while no call of this session runs as a task and no pass
/// woke one: a turn of a current-thread runtime looks at its I/O driver
/// (an `epoll_wait` system call and two clock reads), which once per pass
/// was the largest single cost per call. Other tasks of the application
/// wait at most this long.
const BUSY_TURN: Duration = Duration::from_micros(50);
/// Ring checks between two clock reads while spinning idle.
const SPIN_CHECKS: u32 = 64;
/// Descriptors taken in a pass before the engine's doorbell is rung for
/// what the pass posted so far (a parked engine is not kept waiting for a
/// long pass to end).
const BELL_EVERY: usize = 32;
/// Descriptors one pass takes at most.
const PASS_MAX: usize = 256;

/// One pass of the drain loop: pushes ring the engine's doorbell once, when
/// it ends (or every [`BELL_EVERY`] descriptors), not once each. Dropped,
/// it rings for what is owed, so a drain loop dropped mid-pass (its
/// attachment aborted) never leaves a response unrung.
struct Pass<'a>(&'a Session);

impl Pass<'_> {
    fn begin(s: &Session) -> Pass<'_> {
        s.in_pass.store(true, Ordering::SeqCst);
        Pass(s)
    }

    /// Rings now for what was pushed so far; the pass goes on.
    fn ring(&self) {
        if self.0.bell_owed.swap(false, Ordering::SeqCst) {
            self.0.engine_bell.notify();
        }
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        // Either side stores its flag before it reads the other's (both
        // sequentially consistent), so a push racing the end of the pass
        // is rung by one of them.
        self.0.in_pass.store(false, Ordering::SeqCst);
        self.ring();
    }
}

impl Session {
    pub(crate) fn new(
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
            peers: Mutex::new(vec![None; 256]),
            in_pass: AtomicBool::new(false),
            bell_owed: AtomicBool::new(false),
            tasks: AtomicUsize::new(0),
            woke: AtomicBool::new(false),
            shares: AtomicBool::new(false),
        }))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether other lanes' drain loops share this one's runtime (an
    /// engine with workers: one lane per worker). Then the loop gives the
    /// runtime a turn after every pass and every idle look at its ring, so
    /// no lane waits on another's spin.
    pub(crate) fn share_thread(&self, yes: bool) {
        self.shares.store(yes, Ordering::Relaxed);
    }

    /// Cancels every call (the engine is gone).
    pub(crate) fn end(&self) {
        let (calls, handed, waiting) = {
            let mut st = self.state();
            let (calls, handed) = st.session.end();
            (calls, handed, st.session.take_outbound())
        };
        for c in calls {
            c.abort.abort();
        }
        for w in waiting {
            w.gone();
        }
        // Dropped outside the lock: the last reference frees its chunk,
        // which takes the lock.
        drop(handed);
        self.room.notify_waiters();
    }

    /// Takes requests until the engine goes away.
    ///
    /// Each pass reads the clock once (the calls it starts count their
    /// deadlines from that reading), takes up to [`PASS_MAX`] descriptors,
    /// running each unary handler to completion where it does not wait,
    /// and rings the engine's doorbell once for what it posted. Busy passes
    /// follow each other without a trip through the runtime for up to
    /// [`BUSY_TURN`] while nothing else of this session needs the runtime
    /// (no call running as a task, no waiter woken); idle, the loop spins
    /// on the ring alone (pause instructions, a clock read every
    /// [`SPIN_CHECKS`] looks) for `spin`, then parks on its doorbell.
    pub(crate) async fn drain(self: Arc<Self>, spin: Duration) {
        let taken = self.requests.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some((mut ring, bell)) = taken else { return };
        let mut spin_until = Instant::now() + spin;
        let mut turn_ends = spin_until;
        loop {
            let now = Instant::now();
            let n = {
                let pass = Pass::begin(&self);
                let mut n = 0;
                while n < PASS_MAX {
                    let Some(d) = ring.pop() else { break };
                    n += 1;
                    self.take(d, now);
                    if n % BELL_EVERY == 0 {
                        pass.ring();
                    }
                }
                self.flush();
                n
            };
            if self.state().session.is_ended() {
                return;
            }
            let others = self.tasks.load(Ordering::Relaxed) > 0
                || self.woke.swap(false, Ordering::Relaxed)
                || self.shares.load(Ordering::Relaxed);
            if n > 0 {
                spin_until = now + spin;
                if others || now >= turn_ends {
                    tokio::task::yield_now().await;
                    turn_ends = Instant::now() + BUSY_TURN;
                }
                continue;
            }
            if now < spin_until {
                if !others {
                    // Idle, and nothing else of ours to run: the ring
                    // alone, until it fills or the spin ends.
                    let mut checks = 0u32;
                    while ring.is_empty() {
                        std::hint::spin_loop();
                        checks += 1;
                        if checks % SPIN_CHECKS == 0
                            && (Instant::now() >= spin_until || self.wants_turn())
                        {
                            break;
                        }
                    }
                }
                tokio::task::yield_now().await;
                turn_ends = Instant::now() + BUSY_TURN;
                continue;
            }
            bell.prepare_park();
            if !ring.is_empty() || self.owes() {
                if !bell.cancel_park() {
                    return;
                }
                continue;
            }
            let rang = tokio::select! {
                _ = bell.wait() => true,
                _ = self.wake.notified() => false,
            };
            // Woken by the bell: it is read. Woken from inside (a chunk
            // came back that a release is owed for): the flag comes down,
            // and the bell is read only if the engine rang it meanwhile.
            let open = if rang { bell.unpark() } else { bell.cancel_park() };
            if !open {
                // The engine closed its end: it is gone.
                return;
            }
            spin_until = Instant::now() + spin;
            turn_ends = spin_until;
        }
    }

    /// Whether something of this session waits for the runtime (checked
    /// while spinning idle).
    fn wants_turn(&self) -> bool {
        self.tasks.load(Ordering::Relaxed) > 0 || self.woke.load(Ordering::Relaxed)
    }

    /// A descriptor was pushed on the response ring: rings the engine's
    /// doorbell, or leaves it to the end of the drain loop's pass.
    pub(super) fn ring_engine(&self) {
        self.bell_owed.store(true, Ordering::SeqCst);
        if !self.in_pass.load(Ordering::SeqCst) && self.bell_owed.swap(false, Ordering::SeqCst) {
            self.engine_bell.notify();
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
            self.ring_engine();
        }
    }

    /// Acts on one descriptor from the engine; `now` is the pass's clock.
    fn take(self: &Arc<Self>, d: Descriptor, now: Instant) {
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
                self.woke.store(true, Ordering::Relaxed);
                return;
            }
            Incoming::Outbound => {
                self.complete_outbound(&d);
                self.woke.store(true, Ordering::Relaxed);
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
                self.open(d, message, now);
                return;
            }
            Incoming::More { end } => end,
            Incoming::Released | Incoming::Notify | Incoming::Outbound => return,
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
        self.spawn_counted(async move {
            let _ = s.post_status(call, None, &st).await;
        });
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
