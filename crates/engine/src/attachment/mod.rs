//! One attached application process: its region, its two rings, and the
//! calls the engine has open with it.
//!
//! The engine owns the region (it creates the memfd) and trusts nothing in
//! it. What the application writes reaches the engine only through
//! [`Attachment::receive`], which asks the attachment's sans-IO session
//! (`protoplane_seam::engine::EngineSession`) to check every descriptor
//! against the layout and the engine's private bookkeeping before anything
//! is used: flags an application may send, a chunk of the application's
//! half not already held nor waiting for its release to be posted (a
//! replayed descriptor is caught there), every range inside that chunk,
//! and releases of chunks the engine really lent; side sections are
//! parsed here, on the copy. A violation detaches the application: its
//! calls fail with UNAVAILABLE and every other application keeps being
//! served.
//!
//! This file is the session's driver: it owns the mapping, the rings, the
//! doorbell, the free list of the engine's half and the calls' event
//! queues, reads the bytes a descriptor names (one copy out of the
//! application's half), and calls the session for every decision about
//! calls, chunks and budgets. A call's events reach its proxy through
//! `events`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use bytes::Bytes;
use protoplane_grpc::landing::{Keeper, Landing};
use protoplane_grpc::{Code, Status};
use protoplane_schema::TableSet;
use protoplane_seam::engine::{CallRef, Detached, EngineSession, Limits, Received};
use protoplane_seam::{OpenRepr, ReplyRepr};
use protoplane_shm::desc::{self, Descriptor, Span};
use protoplane_shm::layout::{Chunk, Chunks, Half, Layout};
use protoplane_shm::lease::{self, Holder, Pool};
use protoplane_shm::{Consumer, Doorbell, Mapping, Producer, PushError, Ring};
use protoplane_wire::{Block, DecodeOptions, Decoder};
use tokio::sync::Notify;

use crate::budget::Budgets;
use crate::device::{Answer, Device, Taken};
use events::{events, EventRx, EventTx, Inbound};

pub(crate) mod events;
pub(crate) mod peers;

/// Counters kept per attachment (and summed for the engine's report).
#[derive(Debug, Default)]
pub struct Stats {
    /// Calls opened.
    pub calls: AtomicU64,
    /// Descriptors received from the application.
    pub received: AtomicU64,
    /// Descriptors for calls that had already ended (late, harmless).
    pub stale: AtomicU64,
    /// Bytes copied into the region for requests: the wire bytes of each
    /// request received over HTTP/2 (whose receive buffers are h2's own),
    /// and whole messages that could not be decoded in place.
    pub request_bytes_copied: AtomicU64,
    /// Requests decoded straight into the region (block beside the wire
    /// bytes it references, in one chunk).
    pub requests_in_place: AtomicU64,
    /// Of those, requests whose wire bytes the transport received straight
    /// into the region (a lean reader's landing): no byte of them copied.
    pub requests_received_in_place: AtomicU64,
    /// Descriptors whose bytes (response block or encoded message, side
    /// sections, compute-unit messages) were copied out of the
    /// application's half, and those bytes: the engine reads an
    /// application's memory only through such copies.
    pub responses_copied_out: AtomicU64,
    /// Bytes of those copies.
    pub response_bytes_copied_out: AtomicU64,
    /// Outbound calls the application made through the engine.
    pub outbound_calls: AtomicU64,
    /// Of those, how many failed (any status but OK).
    pub outbound_failed: AtomicU64,
}

/// What the attachment's lock guards: the session's rules and
/// bookkeeping, and the free list of the engine's half.
struct State {
    chunks: Chunks,
    /// The calls open with the application and the chunks either side
    /// holds of the other's half (tokens: the bytes that keep a chunk of
    /// the engine's half out of the free list until its release).
    session: EngineSession<EventTx, Bytes, tokio::task::AbortHandle>,
    /// Compute-unit answers that found no room (posted by the drain loop;
    /// at most [`MAX_NOTIFIES`], beyond that the application's wait times
    /// out).
    notifies: VecDeque<(Descriptor, Vec<u8>)>,
}

/// Compute-unit answers an attachment queues while its ring is full.
const MAX_NOTIFIES: usize = 4096;

/// An attached application.
pub struct Attachment {
    /// The engine's number for it.
    pub id: u32,
    /// Its process id, as it said.
    pub pid: u32,
    /// The services it serves (index = service index in descriptors).
    pub services: Vec<String>,
    map: Arc<Mapping>,
    layout: Layout,
    /// The engine's half of `layout` (kept: working it out allocates).
    half: Half,
    requests: Producer,
    app_bell: Doorbell,
    state: Mutex<State>,
    in_flight: AtomicU64,
    /// Woken when there is something for the drain loop to post.
    pub(crate) wake: Notify,
    closed: AtomicBool,
    /// Counters.
    pub stats: Stats,
    /// Its device region and compute units, when the engine offloads.
    device: OnceLock<Arc<Device>>,
    /// Per service index: the application's own version of it, when its
    /// tables differ from the engine's ([`crate::versions`]).
    versions: OnceLock<Vec<Option<Arc<crate::versions::Version>>>>,
    /// What it may cost the engine.
    budgets: Budgets,
    /// Its outbound channels (by index), as it declared them at attach.
    outbound: OnceLock<Vec<crate::outbound::OutChannel>>,
    /// The client connections its calls come from ([`peers`]).
    peers: Mutex<peers::PeerSlots>,
    /// A copy of its attach socket, on which the engine tells it once that
    /// another engine is taking over ([`Attachment::tell_moving`]).
    mover: OnceLock<std::os::unix::net::UnixStream>,
    told_moving: AtomicBool,
    /// The engine worker its drain loop runs on, and whose connections'
    /// calls it takes first (`protoplane_rpc::shards`); unset when the
    /// engine has no workers.
    lane: OnceLock<usize>,
}

impl std::fmt::Debug for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attachment")
            .field("id", &self.id)
            .field("pid", &self.pid)
            .field("services", &self.services)
            .finish_non_exhaustive()
    }
}

/// The engine's ends of an attachment that the drain loop owns.
pub(crate) struct Receiver {
    pub(crate) responses: Consumer,
    pub(crate) engine_bell: Doorbell,
}

/// Why a post could not be made now.
#[derive(Debug)]
pub(crate) enum PostError {
    /// No room (ring or chunks): try again shortly.
    Busy(&'static str),
    /// The application is gone or broke the protocol.
    Gone(Status),
    /// The message can never fit.
    TooLarge(usize),
    /// The request does not decode (INVALID_ARGUMENT).
    Invalid(Status),
}

impl Attachment {
    /// Sets up the engine's side of a new region (already initialized).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: u32,
        pid: u32,
        services: Vec<String>,
        map: Arc<Mapping>,
        layout: Layout,
        app_bell: Doorbell,
        engine_bell: Doorbell,
        budgets: Budgets,
    ) -> Option<(Arc<Attachment>, Receiver)> {
        let req = Ring::new(map.clone(), layout.request_ring(), layout.ring_slots)?;
        let resp = Ring::new(map.clone(), layout.response_ring(), layout.ring_slots)?;
        req.init();
        resp.init();
        let limits = Limits {
            release_timeout: budgets.release_timeout,
            release_ticks: budgets.ticks(budgets.release_timeout),
            max_unanswered: budgets.max_unanswered,
            answer_timeout: budgets.answer_timeout,
            answer_ticks: budgets.ticks(budgets.answer_timeout),
            max_outbound: budgets.max_outbound,
        };
        let state = State {
            chunks: Chunks::new(layout.engine_chunks()),
            session: EngineSession::new(layout.engine_chunks(), layout.app_chunks(), limits),
            notifies: VecDeque::new(),
        };
        let att = Arc::new(Attachment {
            id,
            pid,
            services,
            map,
            half: layout.engine_chunks(),
            layout,
            requests: Producer::new(req),
            app_bell,
            state: Mutex::new(state),
            in_flight: AtomicU64::new(0),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
            stats: Stats::default(),
            device: OnceLock::new(),
            versions: OnceLock::new(),
            budgets,
            outbound: OnceLock::new(),
            peers: Mutex::new(peers::PeerSlots::default()),
            mover: OnceLock::new(),
            told_moving: AtomicBool::new(false),
            lane: OnceLock::new(),
        });
        Some((att, Receiver { responses: Consumer::new(resp), engine_bell }))
    }

    /// Gives the attachment a device (once; later calls are ignored). Its
    /// units' completions are answered from their own threads as they
    /// happen (no thread waits per task).
    pub fn set_device(self: &Arc<Self>, device: Arc<Device>) {
        if self.device.set(device.clone()).is_err() {
            return;
        }
        // Weak: the units live inside this attachment.
        let att = Arc::downgrade(self);
        device.units().on_notify(move |t| {
            let Some(att) = att.upgrade() else { return };
            if let Some((tag, slot, a)) = att.device().and_then(|d| d.done(t)) {
                att.notify(tag, slot, a);
            }
        });
    }

    /// Its device, if the engine offloads.
    pub fn device(&self) -> Option<&Arc<Device>> {
        self.device.get()
    }

    /// Sets which of its services it serves with its own schema (once, at
    /// attach).
    pub fn set_versions(&self, versions: Vec<Option<Arc<crate::versions::Version>>>) {
        let _ = self.versions.set(versions);
    }

    /// Binds it to an engine worker (once, at attach).
    pub fn set_lane(&self, lane: usize) {
        let _ = self.lane.set(lane);
    }

    /// The engine worker it is bound to, if any.
    pub fn lane(&self) -> Option<usize> {
        self.lane.get().copied()
    }

    /// Sets its outbound channels (once, at attach).
    pub fn set_outbound(&self, channels: Vec<crate::outbound::OutChannel>) {
        let _ = self.outbound.set(channels);
    }

    /// Its outbound channels.
    pub fn outbound(&self) -> &[crate::outbound::OutChannel] {
        self.outbound.get().map_or(&[], Vec::as_slice)
    }

    /// Its own version of service `service` (an index into `services`),
    /// when that differs from the engine's.
    pub fn version(&self, service: u8) -> Option<&Arc<crate::versions::Version>> {
        self.versions.get()?.get(service as usize)?.as_ref()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug in the engine; the state
        // itself stays consistent (every update is a single step), so go on.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls open with this application now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Whether the application is gone.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The largest message a request chunk holds.
    pub fn max_chunk(&self) -> u32 {
        self.layout.max_chunk()
    }

    /// The slot of the client connection a call comes from, held until
    /// [`Attachment::peer_done`] ([`peers`]).
    pub(crate) fn peer_take(&self, peer: Option<&Arc<protoplane_grpc::Peer>>) -> peers::PeerUse {
        if peer.is_none_or(|p| p.addr.is_none()) {
            return peers::PeerUse::NONE;
        }
        self.peers.lock().unwrap_or_else(|p| p.into_inner()).take(peer)
    }

    /// The note of `slot` was posted.
    pub(crate) fn peer_noted(&self, slot: u8) {
        self.peers.lock().unwrap_or_else(|p| p.into_inner()).noted(slot);
    }

    /// A call that took `slot` ended.
    pub(crate) fn peer_done(&self, slot: u8) {
        if slot != 0 {
            self.peers.lock().unwrap_or_else(|p| p.into_inner()).done(slot);
        }
    }

    /// Opens a call: a fresh id and the queue its responses arrive on.
    pub(crate) fn open_call(&self) -> Result<(u64, EventRx), Status> {
        let mut st = self.state();
        if let Some(why) = st.session.closed() {
            return Err(unavailable(why));
        }
        let (tx, rx) = events();
        let id = st.session.open_call(tx).map_err(unavailable)?;
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        Ok((id, rx))
    }

    /// Ends a call on the engine's side; `cancel` also tells the
    /// application (the client went away or the deadline passed).
    pub(crate) fn close_call(&self, call: u64, cancel: Option<(u32, u8)>) {
        if let Some(d) = self.device.get() {
            // Its response is encoded (or never will be): its device
            // memory goes.
            d.end_call(call);
        }
        let mut st = self.state();
        if let Some((_open, owed)) = st.session.end_call(call, cancel) {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            drop(st);
            if owed {
                self.wake.notify_one();
            }
        }
    }

    /// Copies one message (block, the wire bytes it references, side
    /// sections) into a fresh chunk of the engine's half and posts its
    /// descriptor: the path of what cannot be decoded in place (see
    /// [`Attachment::post_request`]) and of descriptors without a message.
    pub(crate) fn post(
        self: &Arc<Self>,
        mut d: Descriptor,
        block: &[u8],
        wire: &[u8],
        side: &[u8],
    ) -> Result<(), PostError> {
        let need = lease::message_len(block, wire, side);
        let mut held = None;
        if need > 0 {
            let chunk = {
                let mut st = self.state();
                if let Some(why) = st.session.closed() {
                    return Err(PostError::Gone(unavailable(why)));
                }
                if !st.chunks.fits(need) {
                    return Err(PostError::TooLarge(need));
                }
                st.chunks.alloc(need).ok_or(PostError::Busy("region"))?
            };
            lease::place(&self.map, chunk, &mut d, block, wire, side);
            self.stats.request_bytes_copied.fetch_add(need as u64, Ordering::Relaxed);
            held = Some((chunk, lease::own(self, chunk)));
        }
        self.push_request(d, held, None)
    }

    /// Decodes a request straight into the engine's half and posts its
    /// descriptor. Wire bytes a transport received into this region (a
    /// lean reader's landing) stay where they are: the block goes into a
    /// fresh chunk, the descriptor names that chunk and points at the wire
    /// bytes in the landing's, and nothing is copied. Other wire bytes are
    /// copied to the start of a fresh chunk and the block decoded after
    /// them (view mode: its strings and bytes reference those wire bytes);
    /// side sections go after the block. A message too large for that is
    /// decoded into private memory and copied with [`Attachment::post`], as
    /// is a block that outgrows its room.
    pub(crate) fn post_request(
        self: &Arc<Self>,
        d: Descriptor,
        tables: &TableSet,
        input: u32,
        wire: &Bytes,
        side: &[u8],
    ) -> Result<(), PostError> {
        let half = &self.half;
        let landed = lease::locate(&self.map, half, wire);
        // Room for the block: view-mode blocks of real messages stay well
        // under their wire size; the slack covers small ones' fixed parts.
        let room = wire.len() + side.len() + 1024;
        let need = room + if landed.is_some() { 0 } else { lease::message_len(&[], wire, &[]) };
        let fits = {
            let st = self.state();
            if let Some(why) = st.session.closed() {
                return Err(PostError::Gone(unavailable(why)));
            }
            st.chunks.fits(need)
        };
        if !fits {
            // Too large to decode in place: decoded privately, then copied.
            let mut block = Block::new();
            decode_view(tables, input, wire, &mut block)?;
            return self.post(d, block.as_bytes(), wire, side);
        }
        let (lent, wire_span) = match landed {
            Some((_, span)) => (lease::lend(self, room, false), span),
            None => match lease::lend_after(self, wire, room) {
                Some((lent, span)) => (Some(lent), span),
                None => (None, Span::default()),
            },
        };
        let lent = lent.ok_or(PostError::Busy("region"))?;
        let mut block = Block::in_lent(lent);
        decode_view(tables, input, wire, &mut block)?;
        if !block.is_lent() {
            // Outgrew its room: into private memory, then copied.
            return self.post(d, block.as_bytes(), wire, side);
        }
        let bytes = block.into_shared();
        let Some((chunk, block_span)) = lease::locate(&self.map, half, &bytes) else {
            return self.post(d, &bytes, wire, side);
        };
        let side_at = (block_span.offset + block_span.len).next_multiple_of(8);
        if side.len() as u64 + side_at as u64 > chunk.offset as u64 + chunk.len as u64 {
            return self.post(d, &bytes, wire, side);
        }
        let mut d = Descriptor { block: block_span, wire: wire_span, chunk: chunk.offset, ..d };
        if !side.is_empty() {
            // After the block, in the engine's own chunk (nothing reads it
            // there yet).
            self.map.write(side_at as usize, side);
            d.side = Span { offset: side_at, len: side.len() as u32 };
        }
        let landing = match landed {
            Some((landing, _)) => {
                self.stats.requests_received_in_place.fetch_add(1, Ordering::Relaxed);
                Some((landing, wire.clone()))
            }
            None => {
                self.stats.request_bytes_copied.fetch_add(wire.len() as u64, Ordering::Relaxed);
                None
            }
        };
        self.stats.requests_in_place.fetch_add(1, Ordering::Relaxed);
        self.push_request(d, Some((chunk, bytes)), landing)
    }

    /// Posts a request descriptor whose bytes (if any) are in `held`'s
    /// chunk, and its wire bytes perhaps in `landing`'s (a receive buffer
    /// shared by several requests); each stays out of the free list until
    /// the application releases it (a landing, once per request in it).
    fn push_request(
        self: &Arc<Self>,
        mut d: Descriptor,
        held: Option<(Chunk, Bytes)>,
        landing: Option<(Chunk, Bytes)>,
    ) -> Result<(), PostError> {
        let handed: Vec<(Chunk, &Bytes)> =
            held.iter().chain(landing.iter()).map(|(c, b)| (*c, b)).collect();
        // Before the descriptor leaves: the release may come at once.
        self.state()
            .session
            .hand_over(&mut d, &handed)
            .map_err(|why| PostError::Gone(unavailable(why)))?;
        match self.requests.push(&d) {
            Ok(()) => {
                self.app_bell.notify();
                Ok(())
            }
            Err(e) => {
                let chunks: Vec<Chunk> = handed.iter().map(|(c, _)| *c).collect();
                let mut back = Vec::new();
                self.state().session.not_handed(&d, &chunks, &mut back);
                // Outside the lock: dropping the bytes frees the chunk.
                drop(back);
                match e {
                    PushError::Full => Err(PostError::Busy("request ring")),
                    PushError::Corrupt => {
                        let why = "the application corrupted its request ring";
                        self.detach(why);
                        Err(PostError::Gone(unavailable(why)))
                    }
                }
            }
        }
    }

    /// Posts what the drain loop owes the application: cancels and chunk
    /// releases. Stops at a full ring (the rest goes next time).
    pub(crate) fn flush(self: &Arc<Self>) {
        loop {
            let Some((d, text)) = self.state().notifies.pop_front() else { break };
            if let Err(PostError::Busy(_)) = self.post(d, &[], &[], &text) {
                self.state().notifies.push_front((d, text));
                break;
            }
        }
        loop {
            let Some(d) = self.state().session.poll_transmit() else { return };
            match self.requests.push(&d) {
                Ok(()) => {
                    self.app_bell.notify();
                }
                Err(e) => {
                    self.state().session.unsent(&d);
                    if e == PushError::Corrupt {
                        self.detach("the application corrupted its request ring");
                    }
                    return;
                }
            }
        }
    }

    /// Whether the drain loop has something to post.
    pub(crate) fn owes(&self) -> bool {
        let st = self.state();
        st.session.closed().is_none() && (st.session.owes() || !st.notifies.is_empty())
    }

    /// Copies ranges of the application's half into private memory (one
    /// allocation for all of them): the engine never reads that half in
    /// place, since the application may write it while the engine looks
    /// (see `protoplane_shm::sys::Access`). Each range was checked against
    /// its chunk by the caller.
    fn copy_out(&self, spans: [Span; 3]) -> [Bytes; 3] {
        let total: usize = spans.iter().map(|s| s.len as usize).sum();
        let mut v = Vec::with_capacity(total);
        let mut at = [0usize; 4];
        for (i, s) in spans.iter().enumerate() {
            // Inside the mapping by the caller's check (an empty part if
            // it were not).
            if s.len > 0 {
                let _ = self.map.append_to(s.offset as usize, s.len as usize, &mut v);
            }
            at[i + 1] = v.len();
        }
        self.stats.responses_copied_out.fetch_add(1, Ordering::Relaxed);
        self.stats.response_bytes_copied_out.fetch_add(v.len() as u64, Ordering::Relaxed);
        let b = Bytes::from(v);
        [b.slice(at[0]..at[1]), b.slice(at[1]..at[2]), b.slice(at[2]..at[3])]
    }

    /// One tick of the budget clock (the drain loop calls it every
    /// [`Budgets::tick`]): `Err` names the budget the application broke.
    pub(crate) fn check_budgets(&self) -> Result<(), String> {
        self.state().session.tick().map_err(|v| v.to_string())
    }

    /// Takes one descriptor from the application. `Err` is a protocol
    /// violation (the caller detaches).
    pub(crate) fn receive(self: &Arc<Self>, d: Descriptor) -> Result<(), String> {
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        let mut back = Vec::new();
        let mut guard = self.state();
        let taken = guard.session.on_descriptor(&d, &mut back).map_err(|v| v.to_string());
        // A call that ends leaves the table now (the in-flight count with
        // it), but its queue closes only after its last events are in
        // (`_ended` drops at the end of this function).
        let (tx, _ended, chunk, ends) = match taken {
            Err(why) => {
                // Dropping the tokens frees their chunks, which takes the
                // lock: never while holding it, also when a later release
                // in the same descriptor is bad (returning with both held
                // deadlocked).
                drop(guard);
                drop(back);
                return Err(why);
            }
            Ok(Received::Released) => {
                drop(guard);
                return Ok(());
            }
            Ok(Received::Task { chunk }) => {
                drop(guard);
                drop(back);
                return self.take_task(chunk, d);
            }
            Ok(Received::OutboundOpen { chunk }) => {
                drop(guard);
                drop(back);
                return self.open_outbound(chunk, d);
            }
            Ok(Received::OutboundRefused { chunk }) => {
                drop(guard);
                drop(back);
                Holder::give_back(&**self, chunk);
                let max = self.budgets.max_outbound;
                let full = Status::new(
                    Code::ResourceExhausted,
                    format!("{max} outbound calls open already (outbound.max_calls)"),
                );
                self.answer_outbound_status(d.call, full);
                return Ok(());
            }
            Ok(Received::OutboundCancel(task)) => {
                drop(guard);
                drop(back);
                // Dropping the call's future resets its stream.
                if let Some(t) = task {
                    t.abort();
                }
                return Ok(());
            }
            Ok(Received::Reply { call, chunk, ends }) => match call {
                CallRef::Open(tx) => (Some(tx.0.clone()), None, chunk, ends),
                CallRef::Ended(tx) => {
                    self.in_flight.fetch_sub(1, Ordering::Relaxed);
                    (Some(tx.0.clone()), Some(tx), chunk, ends)
                }
                CallRef::Stale => (None, None, chunk, ends),
            },
        };
        drop(guard);
        drop(back);
        // What the application wrote, copied out of its half before
        // anything reads it (it may still be writing there: every check
        // below runs on the copy), and the chunk handed back at once.
        let [block, wire, side] = match chunk {
            Some(c) => {
                let parts = self.copy_out([d.block, d.wire, d.side]);
                Holder::give_back(&**self, c);
                parts
            }
            None => Default::default(),
        };
        let Some(tx) = tx else {
            // A call that already ended (cancelled, or its deadline passed
            // before the application answered): dropped.
            self.stats.stale.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        let max = self.budgets.max_queued;
        let flood =
            || format!("more than {max} responses queued for call {} (budgets.max_queued)", d.call);
        let ReplyRepr { headers, status } =
            ReplyRepr::parse(&side, d.has(desc::STATUS)).map_err(|e| e.to_string())?;
        if let Some(md) = headers.filter(|_| d.has(desc::HEADERS)) {
            // Headers that come only with the status were staged by the
            // handler, never sent: they leave with the status (as
            // headers, then the trailers). Explicitly sent ones come in a
            // descriptor of their own.
            let ev = match ends && !d.has(desc::MESSAGE) {
                true => Inbound::Staged(md),
                false => Inbound::Headers(md),
            };
            if !tx.push(ev, max) {
                return Err(flood());
            }
        }
        if d.has(desc::MESSAGE) {
            let encoded = d.has(desc::ENCODED);
            let bytes = if encoded { wire } else { block };
            let ev = Inbound::Message { bytes, encoded, compress: d.has(desc::COMPRESS) };
            if !tx.push(ev, max) {
                return Err(flood());
            }
        }
        if ends {
            let st = match status {
                Some(s) => s,
                None => Status::new(Code::from_u32(d.code as u32), ""),
            };
            // The status always fits: it ends the call.
            if !tx.push(Inbound::Status(st), usize::MAX) {
                return Err(flood());
            }
        }
        Ok(())
    }
}

impl Attachment {
    /// A compute-unit control message: read from the application's chunk
    /// (handed back at once), taken by the device, answered with a NOTIFY
    /// now or when the unit is done.
    fn take_task(self: &Arc<Self>, c: Chunk, d: Descriptor) -> Result<(), String> {
        // Copied out of the application's half, which goes back at once.
        let [payload, _, _] = self.copy_out([d.block, Span::default(), Span::default()]);
        Holder::give_back(&**self, c);
        let (tag, slot) = (d.call, d.method);
        let Some(dev) = self.device.get().cloned() else {
            let no = Answer {
                code: Code::Unimplemented,
                output: protoplane_offload::cu::DeviceRef::EMPTY,
                text: "this engine runs no compute units ([offload] units)".into(),
            };
            self.notify(tag, slot, no);
            return Ok(());
        };
        match dev.control(slot, &payload, tag) {
            Taken::Now(a) => self.notify(tag, slot, a),
            // Answered when the unit notifies (see `set_device`).
            Taken::Running(_) => {}
        }
        Ok(())
    }

    /// Posts the answer to a control message; one that finds the ring or
    /// the region full waits for the drain loop's next flush.
    fn notify(self: &Arc<Self>, tag: u64, slot: u32, a: Answer) {
        let d = Descriptor {
            call: tag,
            method: slot,
            flags: desc::NOTIFY,
            code: a.code as u8,
            timeout_ns: u64::from(a.output.offset) | u64::from(a.output.len) << 32,
            ..Descriptor::default()
        };
        let mut text = a.text.into_bytes();
        text.truncate(1024);
        self.post_or_queue(d, text);
    }
}

impl Attachment {
    /// An outbound call opens: its request copied out of the application's
    /// chunk (handed back at once), checked, encoded, and its call started
    /// on the channel's task. A request that cannot be sent fails the call
    /// (answered at once); side sections that do not parse are a protocol
    /// violation, as on a reply.
    fn open_outbound(self: &Arc<Self>, c: Chunk, d: Descriptor) -> Result<(), String> {
        let [block, wire, side] = self.copy_out([d.block, d.wire, d.side]);
        Holder::give_back(&**self, c);
        let open = OpenRepr::parse(&side).map_err(|e| e.to_string())?;
        self.stats.outbound_calls.fetch_add(1, Ordering::Relaxed);
        let started = self.outbound_request(&d, &block, wire).map(|(ch, output, path, bytes)| {
            let metadata = open.metadata;
            let deadline = protoplane_seam::app::deadline(&d, std::time::Instant::now());
            let opts = protoplane_rpc::CallOptions {
                metadata,
                timeout: deadline.map(|t| t.saturating_duration_since(std::time::Instant::now())),
                ..protoplane_rpc::CallOptions::default()
            };
            (ch, output, path, bytes, opts)
        });
        let (ch, output, path, bytes, opts) = match started {
            Ok(s) => s,
            Err(st) => {
                self.answer_outbound_status(d.call, st);
                return Ok(());
            }
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            let st = Status::new(Code::Unavailable, "the engine runs no outbound calls here");
            self.answer_outbound_status(d.call, st);
            return Ok(());
        };
        let att = self.clone();
        let call = d.call;
        let task = rt.spawn(async move {
            let r = crate::outbound::unary(ch.channel.clone(), path, opts, bytes).await;
            att.answer_outbound(call, &ch.schema, output, r).await;
        });
        // A call that already ended has nothing to stop.
        self.state().session.outbound_started(call, task.abort_handle());
        Ok(())
    }

    /// The channel, the response type, the path and the encoded request of
    /// an outbound call's opening descriptor.
    #[allow(clippy::type_complexity)]
    fn outbound_request(
        &self,
        d: &Descriptor,
        block: &[u8],
        wire: Bytes,
    ) -> Result<(crate::outbound::OutChannel, u32, String, Bytes), Status> {
        let invalid = |why: String| Status::new(Code::InvalidArgument, why);
        let ch = self.outbound().get(d.service as usize).cloned().ok_or_else(|| {
            invalid(format!("no outbound channel #{} (declare it at attach)", d.service))
        })?;
        let m = ch.schema.method(d.method).ok_or_else(|| {
            invalid(format!("no method #{} in the schema of {}", d.method, ch.service))
        })?;
        if m.service != ch.service {
            return Err(invalid(format!(
                "{} is not a method of {}, the service of channel #{}",
                m.path, ch.service, d.service
            )));
        }
        let (input, output, path) = (m.input, m.output, m.path.clone());
        let bytes = match d.has(desc::ENCODED) {
            true => wire,
            false => ENCODER.with(|e| {
                e.borrow_mut()
                    .encode(
                        ch.schema.tables(),
                        input,
                        protoplane_wire::Source::owned(block),
                        &protoplane_wire::EncodeOptions::default(),
                    )
                    .map(Bytes::copy_from_slice)
                    .map_err(|e| invalid(format!("the request block does not encode: {e}")))
            })?,
        };
        Ok((ch, output, path, bytes))
    }

    /// Posts an outbound call's answer: the response decoded into the
    /// engine's half beside the headers and trailers, or the status it
    /// failed with. Waits for room; gives up only when the application is
    /// gone or has cancelled the call.
    async fn answer_outbound(
        self: &Arc<Self>,
        call: u64,
        schema: &Arc<protoplane_grpc::Schema>,
        output: u32,
        r: Result<crate::outbound::Answer, Status>,
    ) {
        if !self.state().session.end_outbound(call) {
            return;
        }
        let a = match r {
            Ok(a) => a,
            Err(st) => return self.answer_outbound_status(call, st),
        };
        let ok = Status { metadata: a.trailers, ..Status::new(Code::Ok, "") };
        let headers = (!a.headers.is_empty()).then_some(a.headers);
        let mut side = Vec::new();
        ReplyRepr::emit_parts(headers.as_ref(), Some(&ok), &mut side);
        let mut flags = desc::OUTBOUND | desc::MESSAGE | desc::STATUS | desc::END;
        if headers.is_some() {
            flags |= desc::HEADERS;
        }
        let d = Descriptor { call, flags, ..Descriptor::default() };
        loop {
            match self.post_request(d, schema.tables(), output, &a.message, &side) {
                Ok(()) => return,
                Err(PostError::Busy(_)) => {
                    tokio::time::sleep(std::time::Duration::from_micros(100)).await
                }
                Err(PostError::Gone(_)) => return,
                Err(PostError::TooLarge(n)) => {
                    let st = Status::new(
                        Code::ResourceExhausted,
                        format!("a response of {n} bytes exceeds the region's largest chunk"),
                    );
                    return self.answer_outbound_status(call, st);
                }
                Err(PostError::Invalid(st)) => {
                    let st = Status::new(
                        Code::Internal,
                        format!("the response does not decode: {}", st.message),
                    );
                    return self.answer_outbound_status(call, st);
                }
            }
        }
    }

    /// Answers an outbound call with a failure (the call already left the
    /// session's table, or never entered it). One that finds no room waits
    /// for the drain loop's next flush, like a compute unit's answer.
    fn answer_outbound_status(self: &Arc<Self>, call: u64, st: Status) {
        self.stats.outbound_failed.fetch_add(1, Ordering::Relaxed);
        let d = Descriptor {
            call,
            flags: desc::OUTBOUND | desc::STATUS | desc::END,
            code: st.code as u8,
            ..Descriptor::default()
        };
        let mut side = Vec::new();
        ReplyRepr::emit_parts(None, Some(&st), &mut side);
        self.post_or_queue(d, side);
    }

    /// Posts a descriptor with only side bytes; one that finds no room
    /// waits for the drain loop's next flush (at most [`MAX_NOTIFIES`]).
    fn post_or_queue(self: &Arc<Self>, d: Descriptor, side: Vec<u8>) {
        if let Err(PostError::Busy(_)) = self.post(d, &[], &[], &side) {
            let mut st = self.state();
            if st.notifies.len() < MAX_NOTIFIES {
                st.notifies.push_back((d, side));
            }
            drop(st);
            self.wake.notify_one();
        }
    }
}

/// Takes up to `max` of the application's descriptors from its response
/// ring, detaching it at the first protocol violation; returns how many it
/// took. One step of the drain loop (the `ring` fuzz target runs it too).
pub(crate) fn take(att: &Arc<Attachment>, responses: &mut Consumer, max: usize) -> usize {
    let mut n = 0;
    while n < max {
        let Some(d) = responses.pop() else { break };
        n += 1;
        if let Err(why) = att.receive(d) {
            att.detach(&format!("protocol violation: {why}"));
            break;
        }
    }
    n
}

impl Pool for Attachment {
    fn map(&self) -> &Arc<Mapping> {
        &self.map
    }

    fn alloc(&self, need: usize) -> Option<Chunk> {
        let mut st = self.state();
        if st.session.closed().is_some() {
            return None;
        }
        st.chunks.alloc(need)
    }

    fn free(&self, chunk: Chunk) {
        let _ = self.state().chunks.free(chunk.offset);
    }
}

/// What keeps a landing (a chunk lent to a lean reader) out of the free
/// list, and counts the bytes the reader moves out of it.
struct Keep<G: Send + Sync + 'static> {
    att: Arc<Attachment>,
    _chunk: G,
}

impl<G: Send + Sync + 'static> Keeper for Keep<G> {
    fn moved(&self, bytes: usize) {
        self.att.stats.request_bytes_copied.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn alive(&self) -> bool {
        !self.att.is_closed()
    }
}

impl Attachment {
    /// A chunk of the engine's half of at least `need` bytes for a
    /// transport to receive requests into (see
    /// [`protoplane_grpc::landing`]): requests that arrive there cross to
    /// the application without a copy ([`Attachment::post_request`]).
    pub fn landing(self: &Arc<Self>, need: usize) -> Option<Landing> {
        let (mem, chunk) = lease::landing(self, need)?;
        Some(Landing::new(mem, Arc::new(Keep { att: self.clone(), _chunk: chunk })))
    }

    /// Whether `bytes` lie in a chunk of the engine's half of this
    /// attachment's region (where `post_request` takes them in place).
    pub fn holds(&self, bytes: &[u8]) -> bool {
        lease::locate(&self.map, &self.half, bytes).is_some()
    }
}

thread_local! {
    /// Each engine thread's decoder (its scratch stack is reused).
    static DECODER: std::cell::RefCell<Decoder> = std::cell::RefCell::new(Decoder::new());
    /// Each engine thread's encoder of outbound requests.
    static ENCODER: std::cell::RefCell<protoplane_wire::Encoder> =
        std::cell::RefCell::new(protoplane_wire::Encoder::new());
}

/// Decodes a request in view mode into `block` with this thread's decoder;
/// bytes that do not decode are the client's fault (INVALID_ARGUMENT).
fn decode_view(
    tables: &TableSet,
    input: u32,
    wire: &[u8],
    block: &mut Block,
) -> Result<(), PostError> {
    DECODER
        .with(|dec| {
            dec.borrow_mut().decode_into(tables, input, wire, &DecodeOptions::view(), block)
        })
        .map_err(|e| PostError::Invalid(protoplane_grpc::call::invalid_request(e)))
}

impl Holder for Attachment {
    fn mapping(&self) -> &Mapping {
        &self.map
    }

    /// Hands a chunk of the application's half back (its lease is gone).
    fn give_back(&self, c: Chunk) {
        let owed = self.state().session.give_back(c);
        if owed {
            self.wake.notify_one();
        }
    }
}

impl Attachment {
    /// Cuts the application off: every open call fails with UNAVAILABLE,
    /// and its outbound calls stop.
    /// Keeps `sock` (a copy of the attach socket) to tell the application
    /// of a take-over on.
    pub(crate) fn set_mover(&self, sock: std::os::unix::net::UnixStream) {
        let _ = self.mover.set(sock);
    }

    /// Tells the application, once, that another engine is taking over
    /// (the byte `M` on its attach socket; see [`crate::admin`]). Written
    /// at once, before the engine detaches it: an application whose calls
    /// end the moment it is detached still finds the `M` before the end of
    /// the socket, so it takes the detach for a move, not for the engine
    /// going away. Nothing else is ever written on that socket, so one byte
    /// always fits; returns false if the write failed (it is gone).
    pub(crate) fn tell_moving(&self) -> bool {
        use std::io::Write;
        if self.told_moving.swap(true, Ordering::AcqRel) {
            return true;
        }
        match self.mover.get() {
            Some(mut sock) => sock.write_all(b"M").is_ok(),
            None => true,
        }
    }

    pub fn detach(&self, why: &str) {
        let Some(Detached { calls, tokens, outbound }) = self.state().session.detach(why) else {
            return;
        };
        for t in outbound {
            t.abort();
        }
        // The application will not read its chunks any more: they go back
        // to the free list (outside the lock, which freeing takes).
        drop(tokens);
        self.closed.store(true, Ordering::Release);
        self.in_flight.fetch_sub(calls.len() as u64, Ordering::Relaxed);
        for tx in calls {
            tx.0.push(Inbound::Status(unavailable(why)), usize::MAX);
        }
        self.wake.notify_one();
    }

    /// Why the application was cut off, if it was.
    pub fn closed_reason(&self) -> Option<String> {
        self.state().session.closed().map(str::to_string)
    }

    /// Requests posted so far, and how many of those from `from` on the
    /// application has taken (for the watchdog).
    pub fn progress(&self, from: u64) -> (u64, Result<u64, PushError>) {
        (self.requests.produced(), self.requests.consumed_from(from))
    }

    /// What the drain loop owes the application: cancels, and the chunks
    /// whose release is still to be posted.
    pub(crate) fn owed(&self) -> (usize, Vec<u32>) {
        self.state().session.owed()
    }

    /// Region chunks lent to the application and held from it (read in
    /// place, or waiting for their release to be posted).
    pub fn chunk_use(&self) -> (u32, u32) {
        let st = self.state();
        (st.chunks.in_use(), st.session.held())
    }
}

pub(crate) fn unavailable(why: &str) -> Status {
    Status::new(Code::Unavailable, format!("application detached: {why}"))
}

#[cfg(test)]
mod tests;
