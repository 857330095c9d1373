//! Streams: ids and states (RFC 9113 §5.1), opening (client), the table
//! of open streams, closing both ways, resets in both directions and
//! PRIORITY (parsed, checked and otherwise ignored).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use bytes::Bytes;

use crate::frame::{self, Head, Reason};

use super::headers::Recorded;
use super::{Conn, ConnError, Event, Role};

/// Identity hashing for stream ids (unique, peer-chosen but harmless: the
/// table is bounded by the concurrent-stream limit).
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u32(&mut self, n: u32) {
        // Spread the odd ids over the buckets.
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub(super) type StreamMap = HashMap<u32, Stream, BuildHasherDefault<IdHasher>>;

#[derive(Debug)]
pub(super) struct Stream {
    /// The peer sent END_STREAM (or we stopped reading).
    pub(super) recv_closed: bool,
    /// We sent END_STREAM (or queued it behind pending data).
    pub(super) send_closed: bool,
    /// A header block arrived (the next one is trailers).
    pub(super) got_headers: bool,
    pub(super) send_window: i64,
    /// The largest `send_window` so far: credit below it returns what our
    /// DATA used (progress), credit on top of it is a grant nothing asked
    /// for.
    pub(super) send_peak: i64,
    pub(super) recv_window: i64,
    /// Received bytes consumed but not yet returned as credit.
    pub(super) recv_unacked: u32,
    /// Received bytes the caller has not released yet.
    pub(super) held: u32,
    /// Data waiting for flow-control credit.
    pub(super) pending: VecDeque<Bytes>,
    pub(super) pending_len: usize,
    /// END_STREAM goes with the last pending DATA.
    pub(super) end_after: bool,
    /// Trailers to send once the pending data is out.
    pub(super) trailers: Option<Recorded>,
    pub(super) content_length: Option<u64>,
    pub(super) data_received: u64,
    /// When it opened, by the driver's clock (ms).
    pub(super) opened_ms: u64,
    /// Server: when our response ends first, the rest of the request is
    /// still read (and handed to the caller to discard) instead of being
    /// refused with RST_STREAM(NO_ERROR). See [`Conn::read_to_end`].
    pub(super) read_to_end: bool,
}

impl Stream {
    pub(super) fn new(send_window: u32, recv_window: u32) -> Stream {
        Stream {
            recv_closed: false,
            send_closed: false,
            got_headers: false,
            send_window: send_window.into(),
            send_peak: send_window.into(),
            recv_window: recv_window.into(),
            recv_unacked: 0,
            held: 0,
            pending: VecDeque::new(),
            pending_len: 0,
            end_after: false,
            trailers: None,
            content_length: None,
            data_received: 0,
            opened_ms: 0,
            read_to_end: false,
        }
    }
}

/// Ids of streams recently closed, to tell a frame on a closed stream from
/// one on a stream never opened (different errors), and frames that may
/// still arrive on a stream we reset (ignored).
#[derive(Debug)]
pub(super) struct Recent {
    pub(super) ids: [u32; 64],
    pub(super) next: usize,
}

impl Recent {
    pub(super) fn new() -> Recent {
        Recent { ids: [0; 64], next: 0 }
    }
    pub(super) fn add(&mut self, id: u32) {
        self.ids[self.next] = id;
        self.next = (self.next + 1) % self.ids.len();
    }
    pub(super) fn has(&self, id: u32) -> bool {
        id != 0 && self.ids.contains(&id)
    }
    pub(super) fn remove(&mut self, id: u32) {
        for x in self.ids.iter_mut().filter(|x| **x == id) {
            *x = 0;
        }
    }
}

impl Conn {
    /// Streams open.
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Whether stream `id` is open (either direction).
    pub fn is_open(&self, id: u32) -> bool {
        self.streams.contains_key(&id)
    }

    /// Resets stream `id` with `reason` (we no longer want it); frames
    /// the peer already sent on it are then ignored.
    pub fn reset(&mut self, id: u32, reason: Reason) {
        if self.forget(id).is_some() {
            frame::write_rst(&mut self.out.buf, id, reason);
            self.reset_by_us.add(id);
        }
    }

    /// Removes stream `id`: the connection credit of data the caller has
    /// not released goes back, the id is remembered as closed, and it no
    /// longer waits for connection credit.
    pub(super) fn forget(&mut self, id: u32) -> Option<Stream> {
        let s = self.streams.remove(&id)?;
        self.return_connection_credit_of(&s);
        self.stream_gone(id);
        self.blocked.retain(|b| *b != id);
        Some(s)
    }

    pub(super) fn stream_gone(&mut self, id: u32) {
        self.closed.add(id);
        if self.is_local(id) {
            self.local_open = self.local_open.saturating_sub(1);
        }
    }

    pub(super) fn is_local(&self, id: u32) -> bool {
        (id % 2 == 1) == (self.cfg.role == Role::Client)
    }

    pub(super) fn reset_event(&self, id: u32, reason: Reason) -> Option<Event> {
        // Only streams the caller knew of; the caller ignores unknown ids.
        Some(Event::Reset { stream: id, reason, by_peer: false })
    }

    /// Whether `id` names a stream the peer could open but has not (a frame
    /// on it other than HEADERS or PRIORITY is a connection error).
    pub(super) fn idle_stream(&self, id: u32) -> bool {
        if self.is_local(id) {
            id >= self.next_local
        } else {
            id > self.last_peer_stream
        }
    }

    /// Removes a stream closed both ways.
    pub(super) fn maybe_remove(&mut self, id: u32) {
        if self.streams.get(&id).is_some_and(|s| s.recv_closed && s.send_closed) {
            // Data the caller has not released yet is released here: its
            // connection credit must not leak with the stream.
            self.forget(id);
            self.reset_credit = (self.reset_credit + 1).min(self.cfg.reset_budget);
        }
    }

    pub(super) fn on_rst(
        &mut self,
        head: Head,
        payload: &[u8],
    ) -> Result<Option<Event>, ConnError> {
        let id = head.stream;
        if id == 0 {
            return Err(self.fail(Reason::PROTOCOL_ERROR, "RST_STREAM on stream 0"));
        }
        if payload.len() != 4 {
            return Err(self.fail(Reason::FRAME_SIZE_ERROR, "RST_STREAM not 4 bytes"));
        }
        if self.idle_stream(id) {
            return Err(self.fail(Reason::PROTOCOL_ERROR, "RST_STREAM on an idle stream"));
        }
        let reason = Reason(u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]));
        let Some(s) = self.forget(id) else {
            // Our reset and theirs crossed: nothing more may come on the
            // stream now, so a later frame on it is an error, not a frame
            // in flight. A reset of a stream that ended otherwise moves
            // nothing.
            if !self.reset_by_us.has(id) {
                self.idle_frame()?;
            }
            self.reset_by_us.remove(id);
            return Ok(None);
        };
        // A stream the peer abandons before it finished costs budget,
        // unless it was open long enough to be a call given up on.
        let old = self.now_ms.saturating_sub(s.opened_ms) >= self.cfg.reset_free_after_ms
            && self.now_ms > 0;
        let finished = s.recv_closed && s.send_closed;
        if !(finished || old) {
            self.spend_reset()?;
        }
        Ok(Some(Event::Reset { stream: id, reason, by_peer: true }))
    }

    /// Client: opens a new stream; `None` when the peer's concurrency
    /// limit is reached, the peer is going away, or ids ran out.
    pub fn open_stream(&mut self) -> Option<u32> {
        if self.goaway_received.is_some()
            || self.local_open >= self.peer.max_concurrent
            || self.next_local > 0x7fff_fffd
        {
            return None;
        }
        let id = self.next_local;
        self.next_local += 2;
        self.local_open += 1;
        self.streams.insert(id, Stream::new(self.peer.initial_window, self.cfg.stream_window));
        Some(id)
    }

    /// Whether another stream may be opened now.
    pub fn can_open(&self) -> bool {
        self.goaway_received.is_none()
            && self.local_open < self.peer.max_concurrent
            && self.next_local <= 0x7fff_fffd
    }

    /// Our side of stream `id` has ended: a server that answered before
    /// the request ended tells the client to stop sending (RFC 9113 §8.1);
    /// a stream closed both ways is forgotten.
    pub(super) fn after_send_end(&mut self, id: u32) {
        let Some(s) = self.streams.get(&id) else { return };
        if !s.recv_closed && self.cfg.role == Role::Server && !s.read_to_end {
            self.reset(id, Reason::NO_ERROR);
            self.reset_credit = (self.reset_credit + 1).min(self.cfg.reset_budget);
            return;
        }
        self.maybe_remove(id);
    }

    /// Server: if our side of stream `id` ends before the request does,
    /// keep reading the request to its end instead of refusing the rest
    /// with RST_STREAM(NO_ERROR). For plain HTTP answers (405, 415, 431),
    /// whose clients may not expect a reset; a gRPC call that ends early
    /// is reset, as grpc-go and gRPC C++ do, so the client stops sending.
    /// The request's frames are still checked (flow control,
    /// content-length) and delivered as events for the caller to release.
    pub fn read_to_end(&mut self, id: u32) {
        if let Some(s) = self.streams.get_mut(&id) {
            s.read_to_end = true;
        }
    }

    /// PRIORITY: deprecated by RFC 9113 and ignored, but still checked
    /// (its size, and a stream that depends on itself), and it makes no
    /// progress.
    pub(super) fn on_priority(
        &mut self,
        head: Head,
        payload: &[u8],
    ) -> Result<Option<Event>, ConnError> {
        if head.stream == 0 {
            return Err(self.fail(Reason::PROTOCOL_ERROR, "PRIORITY on stream 0"));
        }
        if payload.len() != 5 {
            self.stream_error(head.stream, Reason::FRAME_SIZE_ERROR)?;
            return Ok(self.reset_event(head.stream, Reason::FRAME_SIZE_ERROR));
        }
        self.idle_frame()?;
        let dep =
            u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
        if dep == head.stream {
            self.stream_error(head.stream, Reason::PROTOCOL_ERROR)?;
            return Ok(self.reset_event(head.stream, Reason::PROTOCOL_ERROR));
        }
        Ok(None)
    }
}
