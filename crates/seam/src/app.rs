//! The application's side of one attachment as a state machine, sans I/O:
//! what each descriptor from the engine means, which chunks of either
//! half this side holds, and the calls it runs, with no ring, mapping,
//! doorbell, task or clock.
//!
//! [`AppSession`] is told what the engine sent (a descriptor) and what the
//! application does (a call started or finished, a response about to be
//! posted in a chunk, a request's chunk read to the end), and answers with
//! decisions: what a descriptor is for ([`Incoming`]), where its bytes may
//! be read ([`AppSession::take_message`], every range checked against the
//! chunk it names), and which descriptors the application owes
//! ([`AppSession::poll_transmit`]). It owns:
//!
//! - custody of the engine's chunks it reads: a chunk taken once for one
//!   request, or taken once per request whose wire bytes lie in it (a
//!   receive buffer shared by several), and the releases still to post;
//! - the chunks of its own half handed to the engine, each kept out of
//!   the free list by a token `H` until the engine releases it; released
//!   tokens go back to the driver (`back`) rather than being dropped here,
//!   since dropping one may free a chunk under the driver's lock;
//! - the call table, keyed by call id, each call carrying the driver's
//!   value `C` (how to cancel its handler, where its further requests go);
//! - whether the session ended (the engine went away): from then on it
//!   hands nothing over and owes nothing.
//!
//! The application trusts the engine no more than the engine trusts it,
//! but the engine's mistakes fail one call, not the attachment: a bad
//! range is a [`SpanError`] the driver turns into that call's INTERNAL
//! status, and a descriptor for a call not in the table (it ended here,
//! or ran to completion without entering it) is dropped.
//!
//! Services and methods, the handlers, side sections and the bytes
//! themselves stay with the driver (`protoplane-app`'s session). Read
//! `protoplane_shm::desc` first: the descriptor's fields and flags.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use protoplane_shm::desc::{self, Descriptor};
use protoplane_shm::layout::{Chunk, Custody, Half, LayoutError};

/// The deadline of the call an OPEN starts, taken at `now`: its
/// `timeout_ns` from then on (none for 0).
pub fn deadline(d: &Descriptor, now: Instant) -> Option<Instant> {
    (d.timeout_ns > 0).then(|| now + Duration::from_nanos(d.timeout_ns))
}

/// What a descriptor from the engine is for, once its releases are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Incoming {
    /// It only handed chunks back.
    Released,
    /// A compute unit's answer (its text in the side range, see
    /// [`AppSession::take_side`]).
    Notify,
    /// The engine cancels a call (the client went away, its deadline
    /// passed): its handler stops, no answer is expected.
    Cancel,
    /// A new call (with its request, for a unary one).
    Open,
    /// A further request of a call (client streaming), `end`: the last.
    More {
        /// No request follows.
        end: bool,
    },
    /// The answer to one of the application's outbound calls (response
    /// and status); dropped when the call is no longer waiting
    /// ([`AppSession::remove_outbound`]: the application gave up on it).
    Outbound,
}

/// A descriptor's range the application cannot read; the call it is for
/// fails.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpanError {
    /// The chunk it names is not one, or is held already.
    Chunk(LayoutError),
    /// A range outside the chunk it names (or a NOTIFY carrying more than
    /// its side range).
    OutsideChunk,
    /// Wire bytes neither in the chunk nor inside one chunk of the
    /// engine's half.
    WireOutsideAnyChunk,
}

impl std::fmt::Display for SpanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpanError::Chunk(e) => write!(f, "{e}"),
            SpanError::OutsideChunk => f.write_str("a range outside its chunk"),
            SpanError::WireOutsideAnyChunk => f.write_str("the wire range outside any chunk"),
        }
    }
}

impl std::error::Error for SpanError {}

/// The session ended: the engine is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended;

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the session ended")
    }
}

impl std::error::Error for Ended {}

/// Where a request's bytes lie, both chunks taken into custody (each goes
/// back with [`AppSession::give_back`] when the application is done with
/// it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    /// The chunk the descriptor names: its block and side ranges, and its
    /// wire range unless `landing` holds it.
    pub chunk: Chunk,
    /// The receive buffer the wire bytes lie in, when not in `chunk`.
    pub landing: Option<Chunk>,
}

/// The application's side of one attachment (see the module
/// documentation).
#[derive(Debug)]
pub struct AppSession<C, H, O = ()> {
    /// The application's half (the chunks it hands over).
    own: Half,
    /// The engine's half (the chunks it reads).
    engine: Half,
    custody: Custody,
    /// Chunks of `own` handed to the engine (by index), with the token
    /// that keeps each out of the free list until its release.
    handed: Vec<Option<H>>,
    calls: HashMap<u64, C>,
    /// Outbound calls waiting for their answer, by this side's ids.
    outbound: HashMap<u64, O>,
    next_outbound: u64,
    /// Chunks of the engine's half to hand back.
    releases: Vec<u32>,
    ended: bool,
}

impl<C, H, O> AppSession<C, H, O> {
    /// A session handing over chunks of `own` and reading chunks of
    /// `engine`.
    pub fn new(own: Half, engine: Half) -> Self {
        let mut handed = Vec::new();
        handed.resize_with(own.chunks() as usize, || None);
        AppSession {
            custody: Custody::new(engine.clone()),
            own,
            engine,
            handed,
            calls: HashMap::new(),
            outbound: HashMap::new(),
            next_outbound: 1,
            releases: Vec::new(),
            ended: false,
        }
    }

    /// Whether the session ended.
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// Takes one descriptor from the engine: the tokens of the chunks it
    /// releases go to `back`; what it is for comes back.
    pub fn on_descriptor(&mut self, d: &Descriptor, back: &mut Vec<H>) -> Incoming {
        for c in d.released() {
            let slot = self.own.chunk_at(c).and_then(|c| self.handed.get_mut(c.index as usize));
            if let Some(token) = slot.and_then(Option::take) {
                back.push(token);
            }
        }
        match d.flags {
            desc::RELEASE => Incoming::Released,
            desc::NOTIFY => Incoming::Notify,
            _ if d.has(desc::OUTBOUND) => Incoming::Outbound,
            _ if d.has(desc::CANCEL) => Incoming::Cancel,
            _ if d.has(desc::OPEN) => Incoming::Open,
            _ => Incoming::More { end: d.has(desc::END) },
        }
    }

    /// Takes the chunks a call's descriptor names into custody, each range
    /// checked against them: `None` when it carries no bytes. On `Err`
    /// nothing stays taken (a chunk taken is given back, its release
    /// owed).
    pub fn take_message(&mut self, d: &Descriptor) -> Result<Option<Taken>, SpanError> {
        if [d.block, d.wire, d.side].iter().all(|s| s.len == 0) {
            return Ok(None);
        }
        let chunk = self.custody.take(d.chunk).map_err(SpanError::Chunk)?;
        if [d.block, d.side].iter().any(|s| !s.within(chunk.offset, chunk.len)) {
            self.give_back(chunk);
            return Err(SpanError::OutsideChunk);
        }
        if d.wire.within(chunk.offset, chunk.len) {
            return Ok(Some(Taken { chunk, landing: None }));
        }
        // Where the engine received them: a chunk of its half shared by
        // several requests, held once more for this one.
        let landing = self.engine.chunk_containing(d.wire.offset);
        let taken = match landing.filter(|l| d.wire.within(l.offset, l.len)) {
            Some(l) => self.custody.take_shared(l.offset).map_err(SpanError::Chunk),
            None => Err(SpanError::WireOutsideAnyChunk),
        };
        match taken {
            Ok(l) => Ok(Some(Taken { chunk, landing: Some(l) })),
            Err(e) => {
                self.give_back(chunk);
                Err(e)
            }
        }
    }

    /// Takes the chunk of a NOTIFY, whose only range is its side range:
    /// `None` when it carries none.
    pub fn take_side(&mut self, d: &Descriptor) -> Result<Option<Chunk>, SpanError> {
        if d.side.len == 0 {
            return Ok(None);
        }
        let chunk = self.custody.take(d.chunk).map_err(SpanError::Chunk)?;
        if !d.side.within(chunk.offset, chunk.len) || d.block.len > 0 || d.wire.len > 0 {
            self.give_back(chunk);
            return Err(SpanError::OutsideChunk);
        }
        Ok(Some(chunk))
    }

    /// Gives one take of an engine chunk back (the application is done
    /// reading it): its release is owed, unless the session ended. `true`
    /// if the driver should post it.
    pub fn give_back(&mut self, c: Chunk) -> bool {
        self.custody.give_back(c);
        if self.ended {
            return false;
        }
        self.releases.push(c.offset);
        true
    }

    /// Chunks of the engine's half held (a shared one once per take).
    pub fn held(&self) -> u32 {
        self.custody.held()
    }

    /// Enters a call that runs beyond the descriptor that opened it.
    pub fn insert_call(&mut self, call: u64, value: C) {
        self.calls.insert(call, value);
    }

    /// Takes a call out of the table (it ended, was cancelled or failed).
    pub fn remove_call(&mut self, call: u64) -> Option<C> {
        self.calls.remove(&call)
    }

    /// A call in the table.
    pub fn call_mut(&mut self, call: u64) -> Option<&mut C> {
        self.calls.get_mut(&call)
    }

    /// Calls in the table.
    pub fn open_calls(&self) -> usize {
        self.calls.len()
    }

    /// Opens an outbound call carrying `value` (how to complete it): its
    /// fresh id, never reused within the attachment.
    pub fn open_outbound(&mut self, value: O) -> Result<u64, Ended> {
        if self.ended {
            return Err(Ended);
        }
        let id = self.next_outbound;
        self.next_outbound += 1;
        self.outbound.insert(id, value);
        Ok(id)
    }

    /// Takes an outbound call out of the table (its answer came, or the
    /// application gave up on it).
    pub fn remove_outbound(&mut self, call: u64) -> Option<O> {
        self.outbound.remove(&call)
    }

    /// Outbound calls waiting for their answer.
    pub fn open_outbound_calls(&self) -> usize {
        self.outbound.len()
    }

    /// Every outbound call still waiting (the session ended: each fails).
    pub fn take_outbound(&mut self) -> Vec<O> {
        std::mem::take(&mut self.outbound).into_values().collect()
    }

    /// Whether chunk `c` of the application's half may be handed over (it
    /// is not already: the same bytes sent twice are copied the second
    /// time).
    pub fn is_free(&self, c: Chunk) -> bool {
        self.handed.get(c.index as usize).is_some_and(|h| h.is_none())
    }

    /// Hands `chunk` (with its token) over with `d`, before `d` is posted
    /// (the release may come at once), and sets the release `d` carries.
    /// `Err` when the session ended: nothing is posted any more. A token
    /// the chunk had still comes back in `Ok`.
    pub fn hand_over(
        &mut self,
        d: &mut Descriptor,
        chunk: Option<(Chunk, H)>,
    ) -> Result<Option<H>, Ended> {
        if self.ended {
            return Err(Ended);
        }
        let mut old = None;
        if let Some((c, token)) = chunk {
            if let Some(slot) = self.handed.get_mut(c.index as usize) {
                old = slot.replace(token);
            }
        }
        d.release = self.releases.pop().unwrap_or(0);
        Ok(old)
    }

    /// The next release-only descriptor the application owes (up to ten
    /// releases).
    pub fn poll_transmit(&mut self) -> Option<Descriptor> {
        let n = self.releases.len().min(desc::RELEASES_PER_DESCRIPTOR);
        if n == 0 {
            return None;
        }
        let at = self.releases.len() - n;
        let batch: Vec<u32> = self.releases.drain(at..).collect();
        Some(Descriptor::releases(&batch))
    }

    /// `d`, from [`AppSession::poll_transmit`], found no room: owed again.
    pub fn unsent(&mut self, d: &Descriptor) {
        self.releases.extend(d.released());
    }

    /// Whether the application owes the engine releases.
    pub fn owes(&self) -> bool {
        !self.releases.is_empty()
    }

    /// Ends the session (the engine is gone): every call in the table and
    /// every token of a chunk handed over go to the driver (it cancels the
    /// calls; dropping the tokens frees the chunks).
    pub fn end(&mut self) -> (Vec<C>, Vec<H>) {
        self.ended = true;
        let calls = std::mem::take(&mut self.calls).into_values().collect();
        let tokens = std::mem::take(&mut self.handed).into_iter().flatten().collect();
        (calls, tokens)
    }
}
