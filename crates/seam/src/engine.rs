//! The engine's side of one attachment as a state machine, sans I/O: the
//! rules the engine holds an application to, and the bookkeeping they
//! need, with no ring, mapping, doorbell, task or clock.
//!
//! [`EngineSession`] is told what the engine does (a call opened or ended
//! on its side, a descriptor about to be posted with the chunks it hands
//! over, a budget tick) and what the application sent (a descriptor), and
//! answers with decisions: what a descriptor is for ([`Received`]), which
//! descriptors the engine owes ([`EngineSession::poll_transmit`]), and
//! every broken rule as a [`Violation`], after which the driver detaches
//! the application. It owns:
//!
//! - the chunks of the engine's half handed to the application (how many
//!   times, by which open calls, since which tick idle), each kept out of
//!   the engine's free list by a token `H` until its last release: the
//!   session hands the tokens back to the driver (`back`) rather than
//!   dropping them, since dropping one may free a chunk under the
//!   driver's lock;
//! - custody of the application's chunks it reads (a chunk may not be
//!   handed over again before the engine posted its release) and the
//!   releases still to post;
//! - the call table, keyed by call id, each call carrying the driver's
//!   value `T` (its event queue) and the chunks its requests were handed
//!   in; the cancels to post;
//! - the idle-descriptor rules (a call the engine never opened, an empty
//!   release, more late descriptors than calls the engine ended) and the
//!   budgets of memory held and calls answered, on a clock of budget ticks
//!   the driver advances ([`EngineSession::tick`]).
//!
//! Reading the bytes a descriptor names, queueing a call's events and
//! their bound, the free list, compute units and the watchdog on the
//! request ring stay with the driver (`protoplane-engine`'s attachment).
//! Read `protoplane_shm::desc` first: the descriptor's fields and flags.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use protoplane_shm::desc::{self, Descriptor, Span};
use protoplane_shm::layout::{Chunk, Custody, Half, LayoutError};

/// Flags an application may set on a reply to a call the engine opened.
pub const APP_FLAGS: u16 =
    desc::HEADERS | desc::MESSAGE | desc::STATUS | desc::END | desc::COMPRESS | desc::ENCODED;

/// Flags of an application's outbound call's opening descriptor: the
/// request (one message, so the last: unary and server-streaming calls).
pub const OUTBOUND_OPEN: u16 = desc::OUTBOUND | desc::OPEN | desc::MESSAGE | desc::END;

/// Flags an application may add to [`OUTBOUND_OPEN`].
pub const OUTBOUND_OPTIONAL: u16 = desc::ENCODED | desc::COMPRESS;

/// Late descriptors each call the engine ends under the application
/// allows (a streaming call's last messages may be on their way).
pub const STALE_PER_CALL: u64 = 16;
/// The most late descriptors allowed at once.
pub const STALE_MAX: u64 = 1 << 20;

/// The time left at `now` until a call's `deadline`, as its OPEN carries
/// it (`timeout_ns`): 0 is no deadline, so one already passed is 1 ns.
pub fn timeout_ns(deadline: Option<Instant>, now: Instant) -> u64 {
    deadline.map_or(0, |d| (d.saturating_duration_since(now).as_nanos() as u64).max(1))
}

/// The budgets the session checks, in budget ticks (the driver's clock);
/// the timeouts themselves name the budget in a [`Violation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// How long after its calls ended request memory may stay held.
    pub release_timeout: Duration,
    /// `release_timeout` in ticks.
    pub release_ticks: u32,
    /// Calls in a row ending unanswered before the application may count
    /// as a black hole.
    pub max_unanswered: u32,
    /// How long such an application may go without answering any call.
    pub answer_timeout: Duration,
    /// `answer_timeout` in ticks.
    pub answer_ticks: u32,
    /// Outbound calls open at once; more are refused (RESOURCE_EXHAUSTED),
    /// not counted as a violation.
    pub max_outbound: usize,
}

/// A rule the application broke; the driver detaches it (its text is the
/// reason the engine reports).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// A release of a chunk of the engine's half it does not hold.
    NotLent(u32),
    /// A RELEASE descriptor that releases nothing.
    EmptyRelease,
    /// Flags an application may not send.
    Flags(u16),
    /// A descriptor for a call id the engine never gave out.
    NeverOpened(u64),
    /// More descriptors for ended calls than calls the engine ended.
    TooManyStale,
    /// The chunk a descriptor names is not one, or is held already (handed
    /// over twice without its release in between).
    Chunk(LayoutError),
    /// A range outside the chunk the descriptor names.
    OutsideChunk(Span),
    /// A compute-unit task whose payload is not its chunk's block.
    TaskOutsideChunk,
    /// Request memory kept past the release timeout after its calls ended.
    KeptMemory {
        /// The chunk's offset.
        chunk: u32,
        /// The budget.
        timeout: Duration,
    },
    /// An outbound call opened under an id that is open already.
    OutboundTwice(u64),
    /// Calls in a row ended unanswered and none answered for the timeout.
    BlackHole {
        /// Calls in a row that ended unanswered.
        unanswered: u32,
        /// The budget.
        timeout: Duration,
    },
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Violation::NotLent(c) => write!(f, "release: chunk {c:#x} was not lent"),
            Violation::EmptyRelease => f.write_str("a release of no chunk"),
            Violation::Flags(flags) => {
                write!(f, "descriptor flags {flags:#06x} an application may not send")
            }
            Violation::NeverOpened(call) => {
                write!(f, "a descriptor for call {call} the engine never opened")
            }
            Violation::TooManyStale => {
                f.write_str("more descriptors for ended calls than calls the engine ended")
            }
            Violation::Chunk(e) => write!(f, "{e}"),
            Violation::OutsideChunk(s) => {
                write!(f, "range {:#x}+{} outside its chunk", s.offset, s.len)
            }
            Violation::OutboundTwice(call) => {
                write!(f, "outbound call {call} opened while it is open")
            }
            Violation::TaskOutsideChunk => {
                f.write_str("a task descriptor's range outside its chunk")
            }
            Violation::KeptMemory { chunk, timeout } => write!(
                f,
                "it kept request memory (chunk {chunk:#x}) more than {} ms after its calls ended (budgets.release_timeout_ms)",
                timeout.as_millis()
            ),
            Violation::BlackHole { unanswered, timeout } => write!(
                f,
                "its last {unanswered} calls ended unanswered and it answered none for {} ms (budgets.max_unanswered, budgets.answer_timeout_ms)",
                timeout.as_millis()
            ),
        }
    }
}

impl std::error::Error for Violation {}

/// What a descriptor from the application is for, once its releases are
/// taken and every rule checked.
#[derive(Debug)]
pub enum Received<'a, T, O = ()> {
    /// It only handed chunks back.
    Released,
    /// A compute-unit control message: its payload is `chunk`'s block
    /// span, in the engine's custody until the driver gives it back.
    Task {
        /// The application's chunk holding the payload.
        chunk: Chunk,
    },
    /// An outbound call opens: its request's ranges are checked inside
    /// `chunk` (in the engine's custody until the driver gives it back).
    /// The driver starts it and enters its value with
    /// [`EngineSession::outbound_started`].
    OutboundOpen {
        /// The application's chunk holding the request.
        chunk: Chunk,
    },
    /// An outbound call the engine cannot open now (as many are open as
    /// the limit allows): the driver answers RESOURCE_EXHAUSTED.
    OutboundRefused {
        /// The application's chunk holding the request.
        chunk: Chunk,
    },
    /// The application cancels an outbound call: its value, when it was
    /// still open (the driver stops it; nothing is answered).
    OutboundCancel(Option<O>),
    /// A reply (headers, message, status) for a call.
    Reply {
        /// Whose call it is.
        call: CallRef<'a, T>,
        /// The application's chunk its ranges lie in (all checked
        /// inside it), in the engine's custody until the driver gives it
        /// back; `None` when the descriptor carries no bytes.
        chunk: Option<Chunk>,
        /// It carries the call's status: the call is over.
        ends: bool,
    },
}

/// The call a reply is for.
#[derive(Debug)]
pub enum CallRef<'a, T> {
    /// Open, and stays open.
    Open(&'a T),
    /// Open until this reply, which ends it: it left the table.
    Ended(T),
    /// It already ended on the engine's side (cancelled, its deadline
    /// passed): a late reply, dropped.
    Stale,
}

/// A chunk of the engine's half as the application holds it.
#[derive(Debug)]
struct Handed<H> {
    /// What keeps it out of the free list until its last release.
    token: Option<H>,
    /// Handed over `count` times (a receive buffer holds several requests'
    /// wire bytes; any other chunk is handed over once).
    count: u32,
    /// Bumped each time the chunk is handed over from free: a call's hold
    /// of an earlier handing does not count for a later one.
    gen: u32,
    /// Open calls among the handings (a chunk whose calls all ended must
    /// come back within the release timeout).
    open: u32,
    /// The tick at which `open` last dropped to 0.
    idle_since: u32,
}

impl<H> Default for Handed<H> {
    fn default() -> Self {
        Handed { token: None, count: 0, gen: 0, open: 0, idle_since: 0 }
    }
}

/// A call the engine has open with the application.
#[derive(Debug)]
struct OpenCall<T> {
    value: T,
    /// Engine chunks its requests were handed in: (index, generation).
    holds: Holds,
    /// The application sent something for it.
    answered: bool,
}

/// A call's chunk holds: two inline (a unary call has one or two), more
/// on the heap.
#[derive(Debug, Default)]
struct Holds {
    inline: [(u32, u32); 2],
    n: u8,
    more: Vec<(u32, u32)>,
}

impl Holds {
    fn push(&mut self, h: (u32, u32)) {
        match self.n {
            0 | 1 => {
                self.inline[self.n as usize] = h;
                self.n += 1;
            }
            _ => self.more.push(h),
        }
    }

    fn pop(&mut self) {
        if self.more.pop().is_none() && self.n > 0 {
            self.n -= 1;
        }
    }

    fn iter(&self) -> impl Iterator<Item = &(u32, u32)> {
        self.inline[..self.n as usize].iter().chain(self.more.iter())
    }
}

/// What a detach leaves to the driver.
#[derive(Debug)]
pub struct Detached<T, H, O = ()> {
    /// The calls that were open (each fails).
    pub calls: Vec<T>,
    /// The outbound calls that were open (each stops).
    pub outbound: Vec<O>,
    /// The tokens of every chunk the application held (dropping them
    /// frees the chunks).
    pub tokens: Vec<H>,
}

/// The engine's side of one attachment (see the module documentation).
#[derive(Debug)]
pub struct EngineSession<T, H, O = ()> {
    /// The engine's half (the chunks it hands over).
    half: Half,
    /// The application's half (the chunks it reads).
    app_half: Half,
    handed: Vec<Handed<H>>,
    custody: Custody,
    calls: HashMap<u64, OpenCall<T>>,
    next_call: u64,
    /// The application's outbound calls open, by its ids; `None` between
    /// the descriptor that opens one and the driver starting it.
    outbound: HashMap<u64, Option<O>>,
    /// Chunks of the application's half to hand back. They stay in
    /// custody until their release is posted: the application may not hand
    /// a chunk over again before it has it back, or it could make the
    /// engine owe the same release any number of times.
    releases: Vec<Chunk>,
    /// Calls to cancel: (call, method, service).
    cancels: Vec<(u64, u32, u8)>,
    closed: Option<String>,
    limits: Limits,
    /// The budget clock, in ticks.
    epoch: u32,
    /// Calls in a row that ended (engine side) with nothing from the
    /// application, and the tick of its last descriptor for an open call.
    unanswered: u32,
    last_answer: u32,
    /// Descriptors for calls that already ended that the application may
    /// still send: each call the engine ended under it allows a few (its
    /// answer was on the way). Beyond, they are idle work.
    stale_allowance: u64,
}

impl<T, H: Clone, O> EngineSession<T, H, O> {
    /// A session handing over chunks of `engine_half` and reading chunks
    /// of `app_half`, holding the application to `limits`.
    pub fn new(engine_half: Half, app_half: Half, limits: Limits) -> Self {
        let mut handed = Vec::new();
        handed.resize_with(engine_half.chunks() as usize, Handed::default);
        EngineSession {
            custody: Custody::new(app_half.clone()),
            half: engine_half,
            app_half,
            handed,
            calls: HashMap::new(),
            next_call: 1,
            outbound: HashMap::new(),
            releases: Vec::new(),
            cancels: Vec::new(),
            closed: None,
            limits,
            epoch: 0,
            unanswered: 0,
            last_answer: 0,
            stale_allowance: 0,
        }
    }

    /// Why the application was cut off, if it was.
    pub fn closed(&self) -> Option<&str> {
        self.closed.as_deref()
    }

    /// Opens a call carrying `value`: its fresh id (`Err`: the reason the
    /// application was cut off).
    pub fn open_call(&mut self, value: T) -> Result<u64, &str> {
        if self.closed.is_some() {
            return Err(self.closed.as_deref().unwrap_or_default());
        }
        let id = self.next_call;
        self.next_call += 1;
        self.calls.insert(id, OpenCall { value, holds: Holds::default(), answered: false });
        Ok(id)
    }

    /// Calls open.
    pub fn open_calls(&self) -> usize {
        self.calls.len()
    }

    /// Ends a call on the engine's side (the client went away, the
    /// deadline passed, its status went out); `cancel` (method, service)
    /// also tells the application. The call's value, and whether a cancel
    /// is now owed; `None` if the call was not open.
    pub fn end_call(&mut self, call: u64, cancel: Option<(u32, u8)>) -> Option<(T, bool)> {
        let open = self.calls.remove(&call)?;
        // Ended here, not by the application's status: it may still be
        // answering.
        self.ended(&open, true);
        let owed = match (cancel, &self.closed) {
            (Some((method, service)), None) => {
                self.cancels.push((call, method, service));
                true
            }
            _ => false,
        };
        Some((open.value, owed))
    }

    /// Hands `chunks` of the engine's half over with `d` (its block's
    /// chunk, a receive buffer its wire bytes lie in), before it is
    /// posted: the release may come at once. Sets the release `d` carries
    /// (one owed release rides on every request). `Err`: the reason the
    /// application was cut off.
    pub fn hand_over(&mut self, d: &mut Descriptor, chunks: &[(Chunk, &H)]) -> Result<(), &str> {
        if self.closed.is_some() {
            return Err(self.closed.as_deref().unwrap_or_default());
        }
        // An outbound call's response is no call of the engine's: its chunk
        // is held by none (the application copies it out and releases it).
        let mut call = match d.has(desc::OUTBOUND) {
            true => None,
            false => self.calls.get_mut(&d.call),
        };
        for (c, token) in chunks {
            if let Some(slot) = self.handed.get_mut(c.index as usize) {
                if slot.count == 0 {
                    slot.gen = slot.gen.wrapping_add(1);
                    slot.open = 0;
                    slot.idle_since = self.epoch;
                }
                slot.count += 1;
                if slot.token.is_none() {
                    slot.token = Some((*token).clone());
                }
                if let Some(call) = call.as_mut() {
                    slot.open += 1;
                    call.holds.push((c.index, slot.gen));
                }
            }
        }
        d.release = self.releases_to_post(1).first().map_or(0, |c| c.offset);
        Ok(())
    }

    /// `d`, whose handing was recorded by [`EngineSession::hand_over`]
    /// with `chunks`, could not be posted: the handing is undone (tokens
    /// of chunks no longer handed go to `back`) and its release is owed
    /// again.
    pub fn not_handed(&mut self, d: &Descriptor, chunks: &[Chunk], back: &mut Vec<H>) {
        let call = match d.has(desc::OUTBOUND) {
            true => None,
            false => self.calls.get_mut(&d.call),
        };
        if let Some(call) = call {
            for c in chunks {
                if let Some(slot) = self.handed.get_mut(c.index as usize) {
                    slot.open = slot.open.saturating_sub(1);
                    call.holds.pop();
                }
            }
        }
        for c in chunks {
            back.extend(self.unhand(c.index));
        }
        self.owe_again(d);
    }

    /// The next descriptor the engine owes the application: a cancel
    /// (carrying one release), else up to ten releases. Their chunks leave
    /// custody now (the application may reuse one as soon as it sees its
    /// release); [`EngineSession::unsent`] undoes that if the ring is full.
    pub fn poll_transmit(&mut self) -> Option<Descriptor> {
        if self.closed.is_some() {
            return None;
        }
        let cancel = self.cancels.pop();
        let n = if cancel.is_some() { 1 } else { desc::RELEASES_PER_DESCRIPTOR };
        let releases = self.releases_to_post(n);
        match cancel {
            Some((call, method, service)) => Some(Descriptor {
                call,
                method,
                service,
                flags: desc::CANCEL | desc::END,
                release: releases.first().map_or(0, |c| c.offset),
                ..Descriptor::default()
            }),
            None if releases.is_empty() => None,
            None => {
                let offsets: Vec<u32> = releases.iter().map(|c| c.offset).collect();
                Some(Descriptor::releases(&offsets))
            }
        }
    }

    /// `d`, from [`EngineSession::poll_transmit`], found no room: owed
    /// again.
    pub fn unsent(&mut self, d: &Descriptor) {
        self.owe_again(d);
        if d.has(desc::CANCEL) {
            self.cancels.push((d.call, d.method, d.service));
        }
    }

    /// Whether the engine owes the application a descriptor.
    pub fn owes(&self) -> bool {
        self.closed.is_none() && (!self.cancels.is_empty() || !self.releases.is_empty())
    }

    /// What the engine owes: cancels, and the chunks whose release is
    /// still to be posted.
    pub fn owed(&self) -> (usize, Vec<u32>) {
        (self.cancels.len(), self.releases.iter().map(|c| c.offset).collect())
    }

    /// Chunks of the application's half held (read in place, or waiting
    /// for their release to be posted).
    pub fn held(&self) -> u32 {
        self.custody.held()
    }

    /// Hands a chunk of the application's half back (the engine is done
    /// reading it): its release is owed. `true` if the driver should post
    /// it (the application is still there).
    pub fn give_back(&mut self, c: Chunk) -> bool {
        if self.closed.is_some() {
            self.custody.give_back(c);
            return false;
        }
        // Still in custody until the release is posted (see `releases`).
        self.releases.push(c);
        true
    }

    /// Takes one descriptor from the application. Tokens of the engine's
    /// chunks it releases go to `back` (also when it is a violation);
    /// `Err` is a rule it broke.
    pub fn on_descriptor(
        &mut self,
        d: &Descriptor,
        back: &mut Vec<H>,
    ) -> Result<Received<'_, T, O>, Violation> {
        for c in d.released() {
            let chunk = self.half.chunk_at(c).filter(|c| self.is_handed(c.index));
            let Some(chunk) = chunk else { return Err(Violation::NotLent(c)) };
            back.extend(self.unhand(chunk.index));
        }
        if d.flags == desc::RELEASE {
            if d.released().next().is_none() {
                return Err(Violation::EmptyRelease);
            }
            return Ok(Received::Released);
        }
        if d.flags == desc::TASK {
            let c = self.custody.take(d.chunk).map_err(Violation::Chunk)?;
            if !d.block.within(c.offset, c.len) || d.wire.len > 0 || d.side.len > 0 {
                self.custody.give_back(c);
                return Err(Violation::TaskOutsideChunk);
            }
            return Ok(Received::Task { chunk: c });
        }
        if d.has(desc::OUTBOUND) {
            return self.on_outbound(d);
        }
        if d.flags & !APP_FLAGS != 0
            || d.flags & (desc::MESSAGE | desc::STATUS | desc::HEADERS) == 0
        {
            return Err(Violation::Flags(d.flags));
        }
        // Whose call it is first: a descriptor for no call of ours is a
        // violation before anything of it is taken.
        let open = match self.calls.get_mut(&d.call) {
            Some(open) => {
                open.answered = true;
                self.unanswered = 0;
                self.last_answer = self.epoch;
                true
            }
            None if d.call >= self.next_call => return Err(Violation::NeverOpened(d.call)),
            None if self.stale_allowance == 0 => return Err(Violation::TooManyStale),
            None => {
                self.stale_allowance -= 1;
                false
            }
        };
        let spans = [d.block, d.wire, d.side];
        let chunk = if spans.iter().any(|s| s.len > 0) {
            let c = self.custody.take(d.chunk).map_err(Violation::Chunk)?;
            if let Some(s) = spans.iter().find(|s| !s.within(c.offset, c.len)) {
                self.custody.give_back(c);
                return Err(Violation::OutsideChunk(*s));
            }
            Some(c)
        } else {
            None
        };
        let ends = d.has(desc::STATUS);
        let call = match (open, ends) {
            (false, _) => CallRef::Stale,
            (true, true) => match self.calls.remove(&d.call) {
                Some(o) => {
                    self.ended(&o, false);
                    CallRef::Ended(o.value)
                }
                None => CallRef::Stale,
            },
            (true, false) => match self.calls.get(&d.call) {
                Some(o) => CallRef::Open(&o.value),
                None => CallRef::Stale,
            },
        };
        Ok(Received::Reply { call, chunk, ends })
    }

    /// An outbound call's descriptor (OPEN or CANCEL).
    fn on_outbound(&mut self, d: &Descriptor) -> Result<Received<'_, T, O>, Violation> {
        if d.flags == desc::OUTBOUND | desc::CANCEL {
            if [d.block, d.wire, d.side].iter().any(|s| s.len > 0) || d.chunk != 0 {
                return Err(Violation::Flags(d.flags));
            }
            return match self.outbound.remove(&d.call) {
                Some(v) => Ok(Received::OutboundCancel(v)),
                // The engine ended it meanwhile (its answer is on the way):
                // allowed once per call the engine ended.
                None if self.stale_allowance > 0 => {
                    self.stale_allowance -= 1;
                    Ok(Received::OutboundCancel(None))
                }
                None => Err(Violation::TooManyStale),
            };
        }
        if d.flags & !OUTBOUND_OPTIONAL != OUTBOUND_OPEN {
            return Err(Violation::Flags(d.flags));
        }
        if self.outbound.contains_key(&d.call) {
            return Err(Violation::OutboundTwice(d.call));
        }
        let c = self.custody.take(d.chunk).map_err(Violation::Chunk)?;
        if let Some(s) = [d.block, d.wire, d.side].iter().find(|s| !s.within(c.offset, c.len)) {
            self.custody.give_back(c);
            return Err(Violation::OutsideChunk(*s));
        }
        if self.outbound.len() >= self.limits.max_outbound {
            return Ok(Received::OutboundRefused { chunk: c });
        }
        self.outbound.insert(d.call, None);
        Ok(Received::OutboundOpen { chunk: c })
    }

    /// The driver started outbound call `call` (opened by the last
    /// descriptor): its value, kept until the call ends. `false` if it is
    /// not open (the application was cut off meanwhile).
    pub fn outbound_started(&mut self, call: u64, value: O) -> bool {
        match self.outbound.get_mut(&call) {
            Some(slot) => {
                *slot = Some(value);
                true
            }
            None => false,
        }
    }

    /// Outbound call `call` is over on the engine's side (its answer is
    /// about to be posted): `false` if it was not open (the application
    /// cancelled it, or was cut off), and nothing is to be posted. The application may still cancel it
    /// once, crossing the answer.
    pub fn end_outbound(&mut self, call: u64) -> bool {
        if self.outbound.remove(&call).is_none() {
            return false;
        }
        self.stale_allowance = (self.stale_allowance + 1).min(STALE_MAX);
        true
    }

    /// Outbound calls open.
    pub fn open_outbound(&self) -> usize {
        self.outbound.len()
    }

    /// One tick of the budget clock: `Err` names the budget the
    /// application broke.
    pub fn tick(&mut self) -> Result<(), Violation> {
        self.epoch = self.epoch.wrapping_add(1);
        let now = self.epoch;
        let l = &self.limits;
        for (i, h) in self.handed.iter().enumerate() {
            if h.count > 0 && h.open == 0 && now.wrapping_sub(h.idle_since) > l.release_ticks {
                let chunk = self.half.nth_offset(i as u32).unwrap_or(0);
                return Err(Violation::KeptMemory { chunk, timeout: l.release_timeout });
            }
        }
        if self.unanswered >= l.max_unanswered
            && now.wrapping_sub(self.last_answer) > l.answer_ticks
        {
            return Err(Violation::BlackHole {
                unanswered: self.unanswered,
                timeout: l.answer_timeout,
            });
        }
        Ok(())
    }

    /// Cuts the application off (`why`): nothing is posted or held for it
    /// any more. What was open and held goes to the driver; `None` if it
    /// was cut off already.
    pub fn detach(&mut self, why: &str) -> Option<Detached<T, H, O>> {
        if self.closed.is_some() {
            return None;
        }
        self.closed = Some(why.to_string());
        // Releases are never posted now: nothing is held for them.
        for c in std::mem::take(&mut self.releases) {
            self.custody.give_back(c);
        }
        let calls = std::mem::take(&mut self.calls).into_values().map(|o| o.value).collect();
        let outbound = std::mem::take(&mut self.outbound).into_values().flatten().collect();
        let tokens = std::mem::take(&mut self.handed).into_iter().filter_map(|h| h.token).collect();
        Some(Detached { calls, outbound, tokens })
    }

    /// Takes up to `n` owed releases to post, out of custody first.
    fn releases_to_post(&mut self, n: usize) -> Vec<Chunk> {
        let at = self.releases.len() - n.min(self.releases.len());
        let out: Vec<Chunk> = self.releases.drain(at..).collect();
        for &c in &out {
            self.custody.give_back(c);
        }
        out
    }

    /// Owes again the releases `d` carried, unless the application is gone
    /// or has handed the chunk over again meanwhile (its new lease will
    /// release it).
    fn owe_again(&mut self, d: &Descriptor) {
        for offset in d.released() {
            let Some(c) = self.app_half.chunk_at(offset) else { continue };
            if self.closed.is_none() && self.custody.take(c.offset).is_ok() {
                self.releases.push(c);
            }
        }
    }

    /// Ends one handing of engine chunk `index`: its token, once the last
    /// handing ends (`None` also for a chunk not handed).
    fn unhand(&mut self, index: u32) -> Option<H> {
        let slot = self.handed.get_mut(index as usize)?;
        slot.count = slot.count.checked_sub(1)?;
        if slot.count == 0 {
            slot.open = 0;
            slot.token.take()
        } else {
            None
        }
    }

    /// Whether engine chunk `index` is handed to the application.
    fn is_handed(&self, index: u32) -> bool {
        self.handed.get(index as usize).is_some_and(|h| h.count > 0)
    }

    /// A call left the table: its chunks no longer count it. `by_engine`:
    /// the engine ended it, so the application may still be answering it
    /// (a few late descriptors allowed), and one it never answered counts
    /// against its answers.
    fn ended(&mut self, call: &OpenCall<T>, by_engine: bool) {
        for &(index, gen) in call.holds.iter() {
            if let Some(h) = self.handed.get_mut(index as usize) {
                if h.gen == gen && h.count > 0 && h.open > 0 {
                    h.open -= 1;
                    if h.open == 0 {
                        h.idle_since = self.epoch;
                    }
                }
            }
        }
        if by_engine {
            self.stale_allowance = (self.stale_allowance + STALE_PER_CALL).min(STALE_MAX);
            if !call.answered {
                self.unanswered = self.unanswered.saturating_add(1);
            }
        }
    }
}
