//! The `ring` target: the engine's side of the shared-memory ring protocol
//! against an application that may write anything into the region.
//!
//! Each input runs on a fresh small region (8-slot rings, six chunks per
//! half in three size classes) set up as the engine does after a handshake
//! ([`protoplane_engine::fuzzing`]). A fixed prologue opens three calls the
//! way the proxy does and lets the application take them, so chunks are
//! lent and call ids known; then the input is read as a sequence of
//! [`Op`]s. The engine's ops are the proxy's (open, send, end, close
//! calls), the drain loop's (take responses, flush), the watchdog's and the
//! attach socket closing. The application's ops are those of a real
//! application (take requests, answer a call with headers, a message and a
//! status placed in a chunk of its half, hand chunks back), each optionally
//! with one descriptor field altered, plus what only a hostile one does:
//! raw descriptor words, sequence words, any bytes anywhere in the region.
//!
//! Checked after every op, whatever the input:
//! * a drain step takes at most one ring's worth of descriptors (it ends);
//! * a call's events end with one status and then its queue closes; a
//!   queue closes without a status only once the application is detached;
//! * once detached, no call is left waiting, no call can be opened, and
//!   posts are refused with UNAVAILABLE;
//! * calls open equal the engine's in-flight count; chunks lent never
//!   exceed the engine's half; chunks held are exactly those whose release
//!   is owed, each release owed once (the engine copies a response out of
//!   the application's half and hands the chunk back at once), and every
//!   response's bytes are such a private copy, never the application's
//!   memory; cancels owed never exceed the calls opened;
//! * at the end, after the application detaches and every message is
//!   dropped, no chunk is held and nothing else holds the attachment.
//!
//! `examples/seed.rs` writes well-formed sequences with [`Op::write`] and
//! runs them through [`run`] to check they are served without a detach.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use protoplane_engine::fuzzing::{Call, Engine, Event, Refused};
use protoplane_grpc::lean as frame;
use protoplane_grpc::{Code, Metadata, Status};
use protoplane_shm::desc::{self, Descriptor, WORDS};
use protoplane_shm::layout::{Class, CONTROL_LEN, SLOT_LEN};
use protoplane_shm::{lease, Chunks, Consumer, Holder, Layout, Mapping, Ring};

/// The region every input runs on: small, so the fuzzer fills rings and
/// runs out of chunks within a few ops.
pub fn layout() -> Layout {
    Layout {
        ring_slots: 8,
        classes: vec![
            Class { size: 4096, count: 3 },
            Class { size: 8192, count: 2 },
            Class { size: 16384, count: 1 },
        ],
    }
}

/// The drain loop's batch.
const BATCH: usize = 256;

/// `Respond` parts: initial metadata in the side sections.
pub const HEADERS: u8 = 0x01;
/// `Respond` parts: a message of `len` bytes.
pub const MESSAGE: u8 = 0x02;
/// `Respond` parts: the status (with `code`), ending the call.
pub const STATUS: u8 = 0x04;
/// `Respond` parts: the message is already encoded (wire range, no block).
pub const ENCODED: u8 = 0x08;
/// `Respond` parts: compress the message.
pub const COMPRESS: u8 = 0x10;
/// `Respond` parts: hand back a request chunk with it.
pub const RELEASE: u8 = 0x20;
/// `Respond` parts: publish the descriptor twice (a replay).
pub const TWICE: u8 = 0x40;
/// `Respond` parts: flags are `value`'s low 16 bits, not the parts'.
pub const RAW_FLAGS: u8 = 0x80;

/// One step of an input. The first byte of each is the opcode (modulo the
/// number of ops), then the fields in order, little-endian.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Drain loop: take up to a batch of responses, then flush.
    Drain,
    /// Proxy: open a call; unary (OPEN, MESSAGE and END with a request of
    /// `len` bytes) or client streaming (OPEN alone).
    Open {
        /// Client streaming.
        streaming: bool,
        /// With a deadline.
        timeout: bool,
        /// Bytes of the request's block (half as many wire bytes).
        len: u16,
    },
    /// Proxy: one more request message of a streaming call.
    Send {
        /// The call (index among those open, modulo).
        call: u8,
        /// Bytes of the block.
        len: u16,
    },
    /// Proxy: the client finished sending.
    End {
        /// The call.
        call: u8,
    },
    /// Proxy: the call is dropped (client gone, deadline), telling the
    /// application to cancel or not.
    Close {
        /// The call.
        call: u8,
        /// Post a CANCEL.
        cancel: bool,
    },
    /// Drain loop: post what is owed (cancels, releases).
    Flush,
    /// A transport finished sending a response: its bytes are dropped.
    Drop {
        /// The message (index among those held, modulo).
        held: u8,
    },
    /// The attach socket closed: the engine detaches the application.
    Detach,
    /// The watchdog's look at the request ring.
    Watch,
    /// Application: take every request published.
    Poll,
    /// Application: answer a call the way the application library does.
    Respond {
        /// The call (index among those it was opened, modulo; past them an
        /// id nobody opened).
        call: u8,
        /// What the descriptor carries (`HEADERS`, `MESSAGE`, ...).
        parts: u8,
        /// Status code.
        code: u8,
        /// Bytes of the message.
        len: u16,
        /// Which field to alter after placing (0: none, see `tweak`).
        tweak: u8,
        /// The alteration.
        value: u32,
    },
    /// Application: hand back up to `n % 10 + 1` request chunks.
    Release {
        /// How many.
        n: u8,
    },
    /// Application: raw descriptor words. `mode % 4`: 0 published at its
    /// producer position, 1 at the position the engine takes next (and the
    /// producer follows), 2 and 3 at slot `mode / 4` with sequence `seq`.
    Raw {
        /// Where and how.
        mode: u8,
        /// Sequence word (modes 2 and 3).
        seq: u64,
        /// The descriptor's words.
        words: [u64; WORDS],
    },
    /// Application: bytes written at `offset` (modulo) of an area: 0 the
    /// control page, 1 the request ring, 2 the response ring, 3 the
    /// engine's half, 4 the application's half, else the whole region.
    Scribble {
        /// Area.
        area: u8,
        /// Offset in it.
        offset: u32,
        /// Bytes (at most 255).
        bytes: Vec<u8>,
    },
    /// Application: a slot's sequence word set (`ring & 1`: response ring;
    /// `ring & 2`: `value` is added to the word instead).
    Seq {
        /// Which ring, and how.
        ring: u8,
        /// Slot (modulo).
        slot: u8,
        /// The value.
        value: u64,
    },
}

const OPS: u8 = 15;

/// Reads fields off the input; `None` once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|[b]| b)
    }
    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
}

impl Op {
    fn read(input: &mut Input<'_>) -> Option<Op> {
        Some(match input.u8()? % OPS {
            0 => Op::Drain,
            1 => {
                let f = input.u8()?;
                Op::Open { streaming: f & 1 != 0, timeout: f & 2 != 0, len: input.u16()? }
            }
            2 => Op::Send { call: input.u8()?, len: input.u16()? },
            3 => Op::End { call: input.u8()? },
            4 => Op::Close { call: input.u8()?, cancel: input.u8()? & 1 != 0 },
            5 => Op::Flush,
            6 => Op::Drop { held: input.u8()? },
            7 => Op::Detach,
            8 => Op::Watch,
            9 => Op::Poll,
            10 => Op::Respond {
                call: input.u8()?,
                parts: input.u8()?,
                code: input.u8()?,
                len: input.u16()?,
                tweak: input.u8()?,
                value: input.u32()?,
            },
            11 => Op::Release { n: input.u8()? },
            12 => {
                let (mode, seq) = (input.u8()?, input.u64()?);
                let mut words = [0; WORDS];
                for w in &mut words {
                    *w = input.u64()?;
                }
                Op::Raw { mode, seq, words }
            }
            13 => {
                let (area, offset, n) = (input.u8()?, input.u32()?, input.u8()?);
                let bytes = (0..n).map(|_| input.u8()).collect::<Option<_>>()?;
                Op::Scribble { area, offset, bytes }
            }
            _ => Op::Seq { ring: input.u8()?, slot: input.u8()?, value: input.u64()? },
        })
    }

    /// Appends the op's encoding (what [`run`] reads back).
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            Op::Drain => out.push(0),
            Op::Open { streaming, timeout, len } => {
                out.extend([1, u8::from(*streaming) | u8::from(*timeout) << 1]);
                out.extend(len.to_le_bytes());
            }
            Op::Send { call, len } => {
                out.extend([2, *call]);
                out.extend(len.to_le_bytes());
            }
            Op::End { call } => out.extend([3, *call]),
            Op::Close { call, cancel } => out.extend([4, *call, u8::from(*cancel)]),
            Op::Flush => out.push(5),
            Op::Drop { held } => out.extend([6, *held]),
            Op::Detach => out.push(7),
            Op::Watch => out.push(8),
            Op::Poll => out.push(9),
            Op::Respond { call, parts, code, len, tweak, value } => {
                out.extend([10, *call, *parts, *code]);
                out.extend(len.to_le_bytes());
                out.push(*tweak);
                out.extend(value.to_le_bytes());
            }
            Op::Release { n } => out.extend([11, *n]),
            Op::Raw { mode, seq, words } => {
                out.extend([12, *mode]);
                out.extend(seq.to_le_bytes());
                for w in words {
                    out.extend(w.to_le_bytes());
                }
            }
            Op::Scribble { area, offset, bytes } => {
                let bytes = &bytes[..bytes.len().min(255)];
                out.extend([13, *area]);
                out.extend(offset.to_le_bytes());
                out.push(bytes.len() as u8);
                out.extend_from_slice(bytes);
            }
            Op::Seq { ring, slot, value } => {
                out.extend([14, *ring, *slot]);
                out.extend(value.to_le_bytes());
            }
        }
    }
}

/// The ops an input holds (to read a reproducer: `{:#?}` of this).
pub fn decode(data: &[u8]) -> Vec<Op> {
    let mut input = Input(data);
    std::iter::from_fn(|| Op::read(&mut input)).collect()
}

/// Encodes a sequence of ops as one input.
pub fn encode(ops: &[Op]) -> Vec<u8> {
    let mut out = Vec::new();
    for op in ops {
        op.write(&mut out);
    }
    out
}

/// The prologue every input starts after: a unary call with a deadline, a
/// client-streaming call with one message, a unary call whose request
/// takes a larger chunk; then the application takes them (calls 0, 1, 2).
pub fn prologue() -> Vec<Op> {
    vec![
        Op::Open { streaming: false, timeout: true, len: 64 },
        Op::Open { streaming: true, timeout: false, len: 0 },
        Op::Send { call: 1, len: 32 },
        Op::Open { streaming: false, timeout: false, len: 5000 },
        Op::Poll,
    ]
}

/// What an input did (for checking seeds).
#[derive(Debug, Default)]
pub struct Outcome {
    /// Why the application was detached before the end, if it was.
    pub detached: Option<String>,
    /// Calls that ended with a status from the application.
    pub statuses: usize,
    /// Response messages delivered.
    pub messages: usize,
}

/// A call the proxy has open.
struct Open {
    call: Call,
    method: u32,
    streaming: bool,
    requests_done: bool,
}

/// The application: its own mapping of the region, its consumer of the
/// request ring, a producer position on the response ring, its allocator.
struct App {
    map: Arc<Mapping>,
    layout: Layout,
    requests: Consumer,
    chunks: Chunks,
    /// Next response-ring position it publishes at.
    tail: u64,
    /// Call ids it saw opened.
    calls: Vec<u64>,
    /// Request chunks it holds (to hand back).
    lent: Vec<u32>,
}

impl App {
    fn word(&self, ring: usize, pos: u64, w: usize) -> &AtomicU64 {
        let slots = self.layout.ring_slots as u64;
        let at = ring + (pos % slots) as usize * SLOT_LEN + 8 * w;
        self.map.atomic_u64(at).unwrap_or_else(|| panic!("slot word {at:#x} outside the region"))
    }

    /// Publishes at `pos` whatever its sequence word says.
    fn put(&self, pos: u64, seq: u64, words: [u64; WORDS]) {
        let ring = self.layout.response_ring();
        for (i, w) in words.into_iter().enumerate() {
            self.word(ring, pos, 1 + i).store(w, Ordering::Relaxed);
        }
        self.word(ring, pos, 0).store(seq, Ordering::Release);
    }

    /// Publishes like a producer: only into a free slot.
    fn publish(&mut self, d: &Descriptor) -> bool {
        let pos = self.tail;
        if self.word(self.layout.response_ring(), pos, 0).load(Ordering::Acquire) != pos {
            return false;
        }
        self.put(pos, pos + 1, d.to_words());
        self.tail += 1;
        true
    }

    /// Takes every request published (a ring's worth at most: nothing
    /// writes the ring meanwhile).
    fn poll(&mut self) {
        for _ in 0..self.layout.ring_slots {
            let Some(d) = self.requests.pop() else { return };
            for c in d.released() {
                let _ = self.chunks.free(c);
            }
            if d.chunk != 0 {
                self.lent.push(d.chunk);
            }
            if d.has(desc::OPEN) {
                self.calls.push(d.call);
            }
        }
        assert!(self.requests.pop().is_none(), "a request ring yields more than its slots");
    }
}

/// Everything one input runs on.
struct World {
    engine: Engine,
    app: App,
    layout: Layout,
    calls: Vec<Open>,
    /// Response messages a transport is still sending (non-empty ones;
    /// each holds its chunk).
    held: Vec<Bytes>,
    /// The watchdog's position.
    watched: u64,
    /// Calls opened.
    opened: u64,
    outcome: Outcome,
}

fn metadata() -> Metadata {
    let mut md = Metadata::new();
    let _ = md.insert("k", "v");
    let _ = md.insert_bin("b-bin", &[0, 1, 2]);
    md
}

impl World {
    fn new() -> World {
        let layout = layout();
        let (engine, map) = Engine::new(layout.clone()).expect("region");
        let map = Arc::new(map);
        let ring = Ring::new(map.clone(), layout.request_ring(), layout.ring_slots).expect("ring");
        let app = App {
            map,
            layout: layout.clone(),
            requests: Consumer::new(ring),
            chunks: Chunks::new(layout.app_chunks()),
            tail: 0,
            calls: Vec::new(),
            lent: Vec::new(),
        };
        World {
            engine,
            app,
            layout,
            calls: Vec::new(),
            held: Vec::new(),
            watched: 0,
            opened: 0,
            outcome: Outcome::default(),
        }
    }

    fn closed(&self) -> bool {
        self.engine.attachment().is_closed()
    }

    /// The proxy's post; on refusal the proxy returns and its guard closes
    /// the call with a cancel.
    fn post(&mut self, i: usize, d: Descriptor, block: &[u8], wire: &[u8], side: &[u8]) {
        let was_closed = self.closed();
        let need = lease::message_len(block, wire, side);
        let refused = match self.engine.post(d, block, wire, side) {
            Ok(()) => {
                assert!(!was_closed, "posted to a detached application");
                return;
            }
            Err(Refused::Gone(st)) => {
                assert_eq!(st.code, Code::Unavailable);
                assert!(self.closed(), "refused as gone, but attached");
                true
            }
            Err(Refused::TooLarge) => need > self.layout.max_chunk() as usize,
            Err(Refused::Busy) => !was_closed,
        };
        assert!(refused, "post refused wrongly (need {need}, detached {was_closed})");
        let o = self.calls.remove(i);
        self.engine.close_call(o.call, Some((o.method, 0)));
    }

    fn open(&mut self, streaming: bool, timeout: bool, len: u16) {
        let call = match self.engine.open_call() {
            Ok(c) => c,
            Err(st) => {
                assert!(self.closed() && st.code == Code::Unavailable, "open refused: {st:?}");
                return;
            }
        };
        self.opened += 1;
        let method = (call.id % 3) as u32;
        let timeout = timeout.then_some(Duration::from_secs(1));
        let side = Engine::open_side(timeout, &metadata());
        let d = Descriptor {
            call: call.id,
            method,
            flags: desc::OPEN,
            timeout_ns: timeout.map_or(0, |t| t.as_nanos() as u64),
            ..Descriptor::default()
        };
        self.calls.push(Open { call, method, streaming, requests_done: !streaming });
        let i = self.calls.len() - 1;
        if streaming {
            self.post(i, d, &[], &[], &side);
        } else {
            let d = Descriptor { flags: desc::OPEN | desc::MESSAGE | desc::END, ..d };
            let (block, wire) = (vec![0xb1; len as usize], vec![0x0a; len as usize / 2]);
            self.post(i, d, &block, &wire, &side);
        }
    }

    /// A streaming call's next request (`len` bytes), or its end.
    fn send(&mut self, call: u8, len: Option<u16>) {
        if self.calls.is_empty() {
            return;
        }
        let i = call as usize % self.calls.len();
        let o = &mut self.calls[i];
        if !o.streaming || o.requests_done {
            return;
        }
        let d = Descriptor { call: o.call.id, method: o.method, ..Descriptor::default() };
        match len {
            Some(len) => {
                let (block, wire) = (vec![0xb2; len as usize], vec![0x12; len as usize / 2]);
                self.post(i, Descriptor { flags: desc::MESSAGE, ..d }, &block, &wire, &[]);
            }
            None => {
                o.requests_done = true;
                self.post(i, Descriptor { flags: desc::END, ..d }, &[], &[], &[]);
            }
        }
    }

    /// The application answers: a descriptor laid out as the application
    /// library lays it out, then possibly altered.
    fn respond(&mut self, call: u8, parts: u8, code: u8, len: u16, tweak: u8, value: u32) {
        let app = &mut self.app;
        let call = match app.calls.get(call as usize) {
            Some(&id) => id,
            None => u64::from(call) << 8 | u64::from(value & 0xff),
        };
        let mut d = Descriptor { call, code, ..Descriptor::default() };
        let headers = (parts & HEADERS != 0).then(metadata);
        let mut status = None;
        if parts & HEADERS != 0 {
            d.flags |= desc::HEADERS;
        }
        if parts & STATUS != 0 {
            d.flags |= desc::STATUS | desc::END;
            let mut st = Status::new(Code::from_u32(u32::from(code)), "done");
            let _ = st.metadata.insert("t", "x");
            status = Some(st);
        }
        let mut side = Vec::new();
        if headers.is_some() || status.is_some() {
            let f = frame::Outgoing {
                headers: headers.as_ref(),
                status: status.as_ref(),
                ..frame::Outgoing::default()
            };
            let _ = frame::write(&mut side, 0, 0, &f);
        }
        let message = vec![0x5a; len as usize];
        let (block, wire): (&[u8], &[u8]) = match parts & (MESSAGE | ENCODED) {
            0 | ENCODED => (&[], &[]),
            MESSAGE => (&message, &[]),
            _ => (&[], &message),
        };
        if parts & MESSAGE != 0 {
            d.flags |= desc::MESSAGE;
            if parts & ENCODED != 0 {
                d.flags |= desc::ENCODED;
            }
            if parts & COMPRESS != 0 {
                d.flags |= desc::COMPRESS;
            }
        }
        let need = lease::message_len(block, wire, &side);
        let mut chunk = None;
        if need > 0 {
            // Out of chunks (or too large for any), a hostile application
            // writes into its first chunk anyway.
            let c = app
                .chunks
                .alloc(need)
                .or_else(|| app.layout.app_chunks().chunk_at(app.layout.app_half() as u32));
            if let Some(c) = c {
                // Past the chunk only when it is too small: bounds are the
                // region's, and the engine must refuse the ranges.
                lease::place(&app.map, c, &mut d, block, wire, &side);
                chunk = Some(c);
            }
        }
        if parts & RELEASE != 0 {
            d.release = app.lent.pop().unwrap_or(0);
        }
        if parts & RAW_FLAGS != 0 {
            d.flags = value as u16;
        }
        match tweak % 12 {
            1 => d.call ^= u64::from(value),
            2 => d.flags ^= value as u16,
            3 => d.block.offset = d.block.offset.wrapping_add(value),
            4 => d.block.len = d.block.len.wrapping_add(value),
            5 => d.wire.offset = d.wire.offset.wrapping_add(value),
            6 => d.wire.len = d.wire.len.wrapping_add(value),
            7 => d.side.offset = d.side.offset.wrapping_add(value),
            8 => d.side.len = d.side.len.wrapping_add(value),
            9 => d.chunk = d.chunk.wrapping_add(value),
            10 => d.release = value,
            11 if d.side.len > 0 => {
                // One byte of the side sections flipped in place.
                let at = d.side.offset as usize + (value as usize % d.side.len as usize);
                let mut b = [0u8];
                app.map.read(at, &mut b);
                app.map.write(at, &[b[0] ^ ((value >> 24) as u8 | 1)]);
            }
            _ => {}
        }
        let published = app.publish(&d);
        if published && parts & TWICE != 0 {
            app.publish(&d);
        }
        if !published {
            if let Some(c) = chunk {
                let _ = app.chunks.free(c.offset);
            }
            if d.release != 0 && parts & RELEASE != 0 {
                app.lent.push(d.release);
            }
        }
    }

    fn scribble(&self, area: u8, offset: u32, bytes: &[u8]) {
        let l = &self.layout;
        let slots = l.ring_slots as usize * SLOT_LEN;
        let half = l.half_len() as usize;
        let (start, len) = match area {
            0 => (0, CONTROL_LEN),
            1 => (l.request_ring(), slots),
            2 => (l.response_ring(), slots),
            3 => (l.engine_half() as usize, half),
            4 => (l.app_half() as usize, half),
            _ => (0, l.total() as usize),
        };
        let at = start + offset as usize % len;
        let n = bytes.len().min(start + len - at);
        if n == 0 {
            // Nothing to write (a write of no bytes into the sealed half is
            // refused like any other, which says nothing about the seal).
            return;
        }
        // The engine's half is sealed: no application can write it.
        let sealed = at + n > l.engine_half() as usize;
        assert_eq!(self.app.map.write(at, &bytes[..n]), !sealed, "scribble at {at:#x}+{n}");
    }

    fn apply(&mut self, op: Op) {
        let slots = self.layout.ring_slots as usize;
        match op {
            Op::Drain => {
                let n = self.engine.take(BATCH);
                assert!(n <= slots, "one drain step took {n} descriptors from {slots} slots");
                self.engine.flush();
            }
            Op::Open { streaming, timeout, len } => self.open(streaming, timeout, len),
            Op::Send { call, len } => self.send(call, Some(len)),
            Op::End { call } => self.send(call, None),
            Op::Close { call, cancel } => {
                if !self.calls.is_empty() {
                    let o = self.calls.remove(call as usize % self.calls.len());
                    self.engine.close_call(o.call, cancel.then_some((o.method, 0)));
                }
            }
            Op::Flush => self.engine.flush(),
            Op::Drop { held } => {
                if !self.held.is_empty() {
                    self.held.swap_remove(held as usize % self.held.len());
                }
            }
            Op::Detach => self.engine.attachment().detach("the application's connection closed"),
            Op::Watch => {
                let (produced, taken) = self.engine.progress(self.watched);
                // A scribbling application is the drain loop's to detach.
                if let Ok(taken) = taken {
                    assert!(self.watched + taken <= produced, "the watchdog counted past the ring");
                    self.watched += taken;
                }
            }
            Op::Poll => self.app.poll(),
            Op::Respond { call, parts, code, len, tweak, value } => {
                self.respond(call, parts, code, len, tweak, value)
            }
            Op::Release { n } => {
                let app = &mut self.app;
                let k = app.lent.len().min(n as usize % desc::RELEASES_PER_DESCRIPTOR + 1);
                let chunks = app.lent.split_off(app.lent.len() - k);
                if !app.publish(&Descriptor::releases(&chunks)) {
                    app.lent.extend(chunks);
                }
            }
            Op::Raw { mode, seq, words } => match mode % 4 {
                0 => {
                    self.app.publish(&Descriptor::from_words(words));
                }
                1 => {
                    let pos = self.engine.taken();
                    self.app.put(pos, pos + 1, words);
                    self.app.tail = pos + 1;
                }
                _ => self.app.put(u64::from(mode / 4), seq, words),
            },
            Op::Scribble { area, offset, bytes } => self.scribble(area, offset, &bytes),
            Op::Seq { ring, slot, value } => {
                let r = match ring & 1 {
                    0 => self.layout.request_ring(),
                    _ => self.layout.response_ring(),
                };
                let w = self.app.word(r, u64::from(slot), 0);
                match ring & 2 {
                    0 => w.store(value, Ordering::Release),
                    _ => {
                        w.fetch_add(value, Ordering::AcqRel);
                    }
                }
            }
        }
        self.deliver();
        self.check();
    }

    /// The proxies take what the engine delivered to their calls.
    fn deliver(&mut self) {
        let att = self.engine.attachment().clone();
        let base = att.mapping().base() as usize;
        let region = base..base + self.layout.total() as usize;
        let mut i = 0;
        while i < self.calls.len() {
            let ended = loop {
                match self.calls[i].call.try_next() {
                    Event::Pending => break false,
                    Event::Headers(_) => {}
                    Event::Message { bytes, .. } => {
                        self.outcome.messages += 1;
                        if !bytes.is_empty() {
                            let (p, n) = (bytes.as_ptr() as usize, bytes.len());
                            assert!(
                                !region.contains(&p) && !region.contains(&(p + n - 1)),
                                "response bytes read in place in the region, not copied out"
                            );
                            assert!(n <= self.layout.max_chunk() as usize);
                            self.held.push(bytes);
                        }
                    }
                    Event::Status(st) => {
                        if st.code != Code::Unavailable || !att.is_closed() {
                            self.outcome.statuses += 1;
                        }
                        let after = self.calls[i].call.try_next();
                        assert!(matches!(after, Event::Closed), "{after:?} after the status");
                        break true;
                    }
                    Event::Closed => {
                        assert!(att.is_closed(), "a call's queue closed without a status");
                        break true;
                    }
                }
            };
            if ended {
                // The proxy returns; its guard finds the call gone.
                let o = self.calls.remove(i);
                self.engine.close_call(o.call, None);
            } else {
                i += 1;
            }
        }
    }

    fn check(&mut self) {
        let att = self.engine.attachment();
        if att.is_closed() {
            assert!(self.calls.is_empty(), "calls still wait after the detach");
            assert!(!self.engine.owes(), "owes a detached application");
            let st = self.engine.open_call().map(|c| c.id).expect_err("opened after the detach");
            assert_eq!(st.code, Code::Unavailable);
            if self.outcome.detached.is_none() {
                self.outcome.detached = Some(att.closed_reason().unwrap_or_default());
            }
        }
        assert_eq!(att.in_flight(), self.calls.len() as u64, "in-flight count");
        // What is owed is bounded by the region, not by what the
        // application sends: one cancel per call, one release per chunk.
        let (cancels, mut releases) = self.engine.owed();
        assert!(cancels as u64 <= self.opened, "{cancels} cancels owed for {} calls", self.opened);
        let owed = releases.len();
        releases.sort_unstable();
        releases.dedup();
        assert_eq!(releases.len(), owed, "a chunk's release owed twice");
        // Chunks are held until their release is posted, and no longer
        // (responses are copies).
        let (lent, held) = att.chunk_use();
        assert!(lent <= self.layout.engine_chunks().chunks(), "lent {lent} chunks");
        assert!(held <= self.layout.app_chunks().chunks(), "held {held} chunks");
        assert_eq!(held as usize, owed, "chunks held beyond the releases owed");
    }
}

/// Runs one input.
pub fn run(data: &[u8]) -> Outcome {
    let mut w = World::new();
    for op in prologue() {
        w.apply(op);
    }
    for op in decode(data) {
        w.apply(op);
    }
    let detached = w.outcome.detached.take();
    // The application goes away: every call ends, and once the transports
    // drop the responses nothing is held and nothing else keeps the
    // attachment (no lease leaked).
    w.apply(Op::Detach);
    assert!(w.calls.is_empty());
    w.held.clear();
    w.check();
    let World { engine, mut outcome, .. } = w;
    assert_eq!(engine.attachment().chunk_use().1, 0, "chunks held after every response dropped");
    assert_eq!(Arc::strong_count(engine.attachment()), 1, "a lease outlived its response");
    outcome.detached = detached;
    outcome
}
