//! An engine session and an application session wired to each other in
//! memory (after quinn-proto's test `Pair` and protoplane-http2's): what
//! one side posts goes into a bounded queue standing for its ring, and the
//! other side takes it when the test says so. Each side's driver is played
//! here in a few lines: it allocates chunks from its half's free list,
//! hands them over with the descriptors it posts, frees them when their
//! tokens come back, and gives the other side's chunks back as soon as it
//! has read them (the engine) or when the test says the handler is done
//! with its request (the application).
//!
//! No region is mapped: the sessions decide on chunk and range numbers
//! only, so a descriptor's ranges are numbers in the layout and no byte is
//! written. No clock: a test's time is the order of its steps, and the
//! budget clock advances by [`Pair::tick`].

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use protoplane_seam::app::{AppSession, Incoming, SpanError, Taken};
use protoplane_seam::desc::{self, Descriptor, Span};
use protoplane_seam::engine::{CallRef, EngineSession, Limits, Received, Violation};
use protoplane_shm::layout::{Chunk, Chunks, Class, Layout};

/// What keeps a chunk out of its side's free list: its offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Token(pub(crate) u32);

/// The budgets of every pair: four ticks to release, three calls ending
/// unanswered, four ticks without an answer.
pub(crate) const LIMITS: Limits = Limits {
    release_timeout: Duration::from_millis(40),
    release_ticks: 4,
    max_unanswered: 3,
    answer_timeout: Duration::from_millis(40),
    answer_ticks: 4,
    max_outbound: 2,
};

/// What the application side saw, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum AppSeen {
    /// A call opened; where its request lies.
    Opened { call: u64, taken: Option<Taken> },
    /// A call's descriptor whose ranges cannot be read (the call fails).
    Refused { call: u64, why: SpanError },
    /// The engine cancelled a call; whether it was running here.
    Cancelled { call: u64, running: bool },
    /// A further request for a call; whether it is running here.
    More { call: u64, running: bool, end: bool },
    /// Releases only.
    Released,
    /// The answer to an outbound call; whether the call still waited.
    Answered { call: u64, waiting: bool, taken: Option<Taken> },
}

/// Whose call a reply was for, as the engine saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Whose {
    Open,
    Ended,
    Stale,
}

/// What the engine side saw, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EngineSeen {
    Reply {
        call: u64,
        whose: Whose,
        bytes: bool,
        ends: bool,
    },
    Released,
    Task,
    /// The application's outbound call opened (or was refused: too many).
    CallOut {
        call: u64,
        refused: bool,
    },
    /// The application cancelled an outbound call; whether it was open.
    CancelOut {
        call: u64,
        open: bool,
    },
}

/// The two sessions, their free lists and their rings.
pub(crate) struct Pair {
    pub(crate) layout: Layout,
    pub(crate) engine: EngineSession<(), Token>,
    pub(crate) app: AppSession<(), Token>,
    pub(crate) engine_free: Chunks,
    pub(crate) app_free: Chunks,
    /// The request ring (engine → application) and the response ring.
    pub(crate) requests: VecDeque<Descriptor>,
    pub(crate) responses: VecDeque<Descriptor>,
    pub(crate) ring_slots: usize,
    pub(crate) app_seen: Vec<AppSeen>,
    pub(crate) engine_seen: Vec<EngineSeen>,
    /// The engine's chunks each call's handler is reading.
    pub(crate) reading: HashMap<u64, Vec<Chunk>>,
    /// The rule the application broke (the engine detached it).
    pub(crate) violation: Option<Violation>,
}

impl Pair {
    /// Halves of four 4 KiB chunks, rings of eight slots.
    pub(crate) fn new() -> Pair {
        let layout = Layout { ring_slots: 8, classes: vec![Class { size: 4096, count: 4 }] };
        Pair {
            engine: EngineSession::new(layout.engine_chunks(), layout.app_chunks(), LIMITS),
            app: AppSession::new(layout.app_chunks(), layout.engine_chunks()),
            engine_free: Chunks::new(layout.engine_chunks()),
            app_free: Chunks::new(layout.app_chunks()),
            requests: VecDeque::new(),
            responses: VecDeque::new(),
            ring_slots: layout.ring_slots as usize,
            app_seen: Vec::new(),
            engine_seen: Vec::new(),
            reading: HashMap::new(),
            violation: None,
            layout,
        }
    }

    /// The engine opens a call whose request (a block of `len` bytes,
    /// none if 0) it posts with OPEN|MESSAGE|END.
    pub(crate) fn open(&mut self, len: u32) -> u64 {
        let call = self.engine.open_call(()).expect("attached");
        let flags = desc::OPEN | if len > 0 { desc::MESSAGE } else { 0 } | desc::END;
        let d = Descriptor { call, flags, ..Descriptor::default() };
        assert!(self.post_request(d, len, &[]), "room for the request");
        call
    }

    /// The engine posts `d` with a block of `len` bytes in a fresh chunk
    /// of its half (none if 0), its wire bytes perhaps in `landing` (a
    /// receive buffer already handed over for earlier requests); `false`
    /// if the ring was full (the handing is undone).
    pub(crate) fn post_request(&mut self, mut d: Descriptor, len: u32, landing: &[Chunk]) -> bool {
        let mut chunks: Vec<Chunk> = landing.to_vec();
        if len > 0 {
            let c = self.engine_free.alloc(len as usize).expect("a free engine chunk");
            d.block = Span { offset: c.offset, len };
            d.chunk = c.offset;
            chunks.insert(0, c);
        }
        let tokens: Vec<Token> = chunks.iter().map(|c| Token(c.offset)).collect();
        let handed: Vec<(Chunk, &Token)> = chunks.iter().copied().zip(tokens.iter()).collect();
        self.engine.hand_over(&mut d, &handed).expect("attached");
        if self.requests.len() < self.ring_slots {
            self.requests.push_back(d);
            return true;
        }
        let mut back = Vec::new();
        self.engine.not_handed(&d, &chunks, &mut back);
        // A fresh chunk's token comes back: it is free again.
        self.free_engine(back);
        false
    }

    /// The application answers `call` with `flags`, a block of `len`
    /// bytes in a fresh chunk of its half (none if 0), and code `code`.
    pub(crate) fn reply(&mut self, call: u64, flags: u16, len: u32, code: u8) -> Descriptor {
        let mut d = Descriptor { call, flags, code, ..Descriptor::default() };
        let mut token = None;
        if len > 0 {
            let c = self.app_free.alloc(len as usize).expect("a free application chunk");
            d.block = Span { offset: c.offset, len };
            d.chunk = c.offset;
            token = Some((c, Token(c.offset)));
        }
        let replaced = self.app.hand_over(&mut d, token).expect("the session runs");
        assert_eq!(replaced, None, "a fresh chunk was not handed over");
        self.responses.push_back(d);
        d
    }

    /// The application opens an outbound call whose request is a block of
    /// `len` bytes in a fresh chunk of its half.
    pub(crate) fn call_out(&mut self, len: u32) -> u64 {
        let call = self.app.open_outbound(()).expect("the session runs");
        let flags = desc::OUTBOUND | desc::OPEN | desc::MESSAGE | desc::END;
        self.reply(call, flags, len, 0);
        call
    }

    /// The application gives up on outbound call `call`: it leaves the
    /// table and a CANCEL goes to the engine.
    pub(crate) fn cancel_out(&mut self, call: u64) {
        assert!(self.app.remove_outbound(call).is_some(), "outbound call {call} waits");
        self.reply(call, desc::OUTBOUND | desc::CANCEL, 0, 0);
    }

    /// The engine answers outbound call `call` with a response block of
    /// `len` bytes in a fresh chunk of its half; `false` if the call was
    /// not open any more (nothing posted).
    pub(crate) fn answer_out(&mut self, call: u64, len: u32) -> bool {
        if !self.engine.end_outbound(call) {
            return false;
        }
        let flags = desc::OUTBOUND | desc::MESSAGE | desc::STATUS | desc::END;
        let d = Descriptor { call, flags, ..Descriptor::default() };
        assert!(self.post_request(d, len, &[]), "room for the answer");
        true
    }

    /// Whether every chunk of both halves is back in its free list.
    pub(crate) fn all_free(&self) -> bool {
        self.engine_free.in_use() == 0 && self.app_free.in_use() == 0
    }

    /// A descriptor written as a hostile application would: straight into
    /// the response ring, past the application's session.
    pub(crate) fn inject(&mut self, d: Descriptor) {
        self.responses.push_back(d);
    }

    /// The application takes every descriptor in the request ring.
    pub(crate) fn app_takes(&mut self) {
        while let Some(d) = self.requests.pop_front() {
            let mut back = Vec::new();
            let incoming = self.app.on_descriptor(&d, &mut back);
            self.free_app(back);
            let message = match incoming {
                Incoming::Released => {
                    self.app_seen.push(AppSeen::Released);
                    continue;
                }
                Incoming::Notify => continue,
                Incoming::Outbound => {
                    let waiting = self.app.remove_outbound(d.call).is_some();
                    // Read (copied out) and given back at once.
                    let taken = self.app.take_message(&d).expect("the answer's ranges");
                    if let Some(t) = taken {
                        self.app.give_back(t.chunk);
                    }
                    self.app_seen.push(AppSeen::Answered { call: d.call, waiting, taken });
                    continue;
                }
                _ => self.app.take_message(&d),
            };
            let taken = match message {
                Ok(t) => t,
                Err(why) => {
                    self.app.remove_call(d.call);
                    self.app_seen.push(AppSeen::Refused { call: d.call, why });
                    continue;
                }
            };
            if let Some(t) = taken {
                let chunks = self.reading.entry(d.call).or_default();
                chunks.push(t.chunk);
                chunks.extend(t.landing);
            }
            match incoming {
                Incoming::Open => {
                    self.app.insert_call(d.call, ());
                    self.app_seen.push(AppSeen::Opened { call: d.call, taken });
                }
                Incoming::Cancel => {
                    let running = self.app.remove_call(d.call).is_some();
                    // The handler stops: its request's chunks go back.
                    self.done_reading(d.call);
                    self.app_seen.push(AppSeen::Cancelled { call: d.call, running });
                }
                Incoming::More { end } => {
                    let running = self.app.call_mut(d.call).is_some();
                    self.app_seen.push(AppSeen::More { call: d.call, running, end });
                }
                Incoming::Released | Incoming::Notify | Incoming::Outbound => {}
            }
        }
    }

    /// `call`'s handler is done with its requests: their chunks go back.
    pub(crate) fn done_reading(&mut self, call: u64) {
        for c in self.reading.remove(&call).unwrap_or_default() {
            self.app.give_back(c);
        }
    }

    /// The engine takes every descriptor in the response ring, until the
    /// first violation (it detaches the application).
    pub(crate) fn engine_takes(&mut self) {
        while let Some(d) = self.responses.pop_front() {
            let mut back = Vec::new();
            let taken = self.engine.on_descriptor(&d, &mut back);
            let (seen, chunk) = match taken {
                Err(v) => {
                    self.free_engine(back);
                    let gone = self.engine.detach(&v.to_string()).expect("attached until now");
                    self.free_engine(gone.tokens);
                    self.violation = Some(v);
                    self.responses.clear();
                    return;
                }
                Ok(Received::Released) => (EngineSeen::Released, None),
                Ok(Received::Task { chunk }) => (EngineSeen::Task, Some(chunk)),
                Ok(Received::OutboundOpen { chunk }) => {
                    assert!(self.engine.outbound_started(d.call, ()), "open until started");
                    (EngineSeen::CallOut { call: d.call, refused: false }, Some(chunk))
                }
                Ok(Received::OutboundRefused { chunk }) => {
                    (EngineSeen::CallOut { call: d.call, refused: true }, Some(chunk))
                }
                Ok(Received::OutboundCancel(open)) => {
                    (EngineSeen::CancelOut { call: d.call, open: open.is_some() }, None)
                }
                Ok(Received::Reply { call, chunk, ends }) => {
                    let whose = match call {
                        CallRef::Open(()) => Whose::Open,
                        CallRef::Ended(()) => Whose::Ended,
                        CallRef::Stale => Whose::Stale,
                    };
                    let bytes = chunk.is_some();
                    (EngineSeen::Reply { call: d.call, whose, bytes, ends }, chunk)
                }
            };
            self.free_engine(back);
            // Copied out at once, so given back at once.
            if let Some(c) = chunk {
                self.engine.give_back(c);
            }
            self.engine_seen.push(seen);
        }
    }

    /// Each side posts what it owes while its ring has room.
    pub(crate) fn flush(&mut self) {
        while let Some(d) = self.engine.poll_transmit() {
            if self.requests.len() >= self.ring_slots {
                self.engine.unsent(&d);
                break;
            }
            self.requests.push_back(d);
        }
        while let Some(d) = self.app.poll_transmit() {
            if self.responses.len() >= self.ring_slots {
                self.app.unsent(&d);
                break;
            }
            self.responses.push_back(d);
        }
    }

    /// Both sides post and take until neither has anything left.
    pub(crate) fn drive(&mut self) {
        for _ in 0..64 {
            self.flush();
            if self.requests.is_empty() && self.responses.is_empty() {
                return;
            }
            self.app_takes();
            self.engine_takes();
        }
        panic!("the pair never went quiet");
    }

    /// `n` ticks of the engine's budget clock; the first budget broken.
    pub(crate) fn tick(&mut self, n: u32) -> Result<(), Violation> {
        for _ in 0..n {
            self.engine.tick()?;
        }
        Ok(())
    }

    /// The offset of the application's `i`th chunk and the engine's.
    pub(crate) fn app_chunk(&self, i: u32) -> Chunk {
        let half = self.layout.app_chunks();
        half.chunk_at(half.nth_offset(i).expect("a chunk")).expect("a chunk")
    }

    pub(crate) fn engine_chunk(&self, i: u32) -> Chunk {
        let half = self.layout.engine_chunks();
        half.chunk_at(half.nth_offset(i).expect("a chunk")).expect("a chunk")
    }

    fn free_engine(&mut self, tokens: Vec<Token>) {
        for Token(offset) in tokens {
            self.engine_free.free(offset).expect("a token frees its chunk once");
        }
    }

    fn free_app(&mut self, tokens: Vec<Token>) {
        for Token(offset) in tokens {
            self.app_free.free(offset).expect("a token frees its chunk once");
        }
    }
}
