//! Posting what a handler sends: headers, messages and the status, each a
//! descriptor on the response ring. A message built in a chunk of this
//! side's half goes in place (no byte copied); anything else (already
//! encoded bytes, a block too large for a chunk, side sections that do not
//! fit beside it) is copied into a fresh chunk, waiting for one if none is
//! free. Either way the chunk is handed over through the session and
//! stays out of the free list until the engine releases it, and every
//! descriptor carries one release the session owes.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use protoplane_grpc::call::Out;
use protoplane_grpc::{Code, Metadata, Status};
use protoplane_seam::ReplyRepr;
use protoplane_shm::desc::{self, Descriptor, Span};
use protoplane_shm::layout::Chunk;
use protoplane_shm::lease;

use super::Session;

impl Session {
    pub(super) async fn post_item(
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

    pub(super) async fn post_status(
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
    pub(super) async fn post_final(
        self: &Arc<Self>,
        call: u64,
        headers: Option<Metadata>,
        item: Option<Out>,
        st: &Status,
    ) -> Result<(), ()> {
        let last = self.last(call, headers, item, st);
        self.post_last(last, st).await
    }

    /// What [`Session::post_final`] posts, worked out without posting it.
    fn last(&self, call: u64, headers: Option<Metadata>, item: Option<Out>, st: &Status) -> Last {
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
            return Last::Several { d, block, wire, headers };
        }
        if headers.is_some() {
            d.flags |= desc::HEADERS;
        }
        Last::One { d, block, wire, side }
    }

    /// Posts what [`Session::last`] worked out: headers (in a descriptor of
    /// their own), the message in place, then the status.
    async fn post_last(self: &Arc<Self>, last: Last, st: &Status) -> Result<(), ()> {
        let (d, block, wire, headers) = match last {
            Last::One { d, block, wire, side } => return self.post(d, block, wire, side).await,
            Last::Several { d, block, wire, headers } => (d, block, wire, headers),
        };
        let call = d.call;
        let message = d.flags & (desc::MESSAGE | desc::ENCODED | desc::COMPRESS);
        if let Some(md) = &headers {
            let h = Descriptor { call, flags: desc::HEADERS, ..Descriptor::default() };
            self.post(h, Bytes::new(), Bytes::new(), side_frame(Some(md), None)).await?;
        }
        let m = Descriptor { call, flags: message, ..Descriptor::default() };
        self.post(m, block, wire, Vec::new()).await?;
        let end = Descriptor { flags: desc::STATUS | desc::END, ..d };
        self.post(end, Bytes::new(), Bytes::new(), side_frame(None, Some(st))).await
    }

    /// A unary call's answer from the drain loop that ran its handler to
    /// completion: posted at once when it is one descriptor and room is
    /// there (the common case: no explicit headers, a message built in
    /// place, an OK status without trailers), else by a task that may wait.
    pub(super) fn finish_unary(
        self: &Arc<Self>,
        call: u64,
        early: Option<Metadata>,
        headers: Option<Metadata>,
        item: Option<Out>,
        st: Status,
    ) {
        let (early, last) = match (early, self.last(call, headers, item, &st)) {
            (None, Last::One { d, block, wire, side }) => {
                let now = self.post_now(d, block, wire, side);
                if !matches!(now, Now::Posted | Now::Ended) {
                    let s = self.clone();
                    self.spawn_counted(async move {
                        let _ = s.post_stuck(now).await;
                    });
                }
                return;
            }
            other => other,
        };
        // Several descriptors: in order, by a task.
        let s = self.clone();
        self.spawn_counted(async move {
            if let Some(md) = early {
                if s.post_item(call, Some(md), None).await.is_err() {
                    return;
                }
            }
            let _ = s.post_last(last, &st).await;
        });
    }

    /// Finishes what [`Session::post_now`] could not: waits for room on
    /// the ring, or for a chunk to copy into.
    async fn post_stuck(self: &Arc<Self>, stuck: Now) -> Result<(), ()> {
        match stuck {
            Now::Posted => Ok(()),
            Now::Ended => Err(()),
            Now::Full(d) => self.push_wait(d).await,
            Now::TooLarge(call, need) => self.post_too_large(call, need).await,
            Now::NoChunk(mut d, block, wire, side) => {
                let held = match self.copy(&mut d, &block, &wire, &side).await? {
                    Posted::Copied(chunk, held) => {
                        let n = (block.len() + wire.len()) as u64;
                        self.stats.response_bytes_copied.fetch_add(n, Ordering::Relaxed);
                        Some((chunk, held))
                    }
                    Posted::Nothing => None,
                    Posted::TooLarge(need) => return self.post_too_large(d.call, need).await,
                };
                if d.has(desc::MESSAGE) {
                    self.stats.responses.fetch_add(1, Ordering::Relaxed);
                }
                self.push(d, held).await
            }
        }
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
    pub(crate) async fn post(
        self: &Arc<Self>,
        d: Descriptor,
        block: Bytes,
        wire: Bytes,
        side: Vec<u8>,
    ) -> Result<(), ()> {
        let now = self.post_now(d, block, wire, side);
        self.post_stuck(now).await
    }

    /// A response too large for any chunk: its call fails instead.
    async fn post_too_large(self: &Arc<Self>, call: u64, need: usize) -> Result<(), ()> {
        let too = Status::new(
            Code::ResourceExhausted,
            format!("response of {need} bytes exceeds the region's largest chunk"),
        );
        let d = Descriptor {
            call,
            flags: desc::STATUS | desc::END,
            code: too.code as u8,
            ..Descriptor::default()
        };
        let side = side_frame(None, Some(&too));
        Box::pin(self.post(d, Bytes::new(), Bytes::new(), side)).await
    }

    /// [`Session::post`] as far as it goes without waiting: the response
    /// placed (in place, or copied into a chunk that is free now), handed
    /// over and pushed. What it could not do is handed back ([`Now`]): a
    /// drain loop running a call to completion posts its answer here and
    /// makes a task only for the rare answer that has to wait for room.
    pub(super) fn post_now(
        self: &Arc<Self>,
        mut d: Descriptor,
        block: Bytes,
        wire: Bytes,
        side: Vec<u8>,
    ) -> Now {
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
            None => {
                let need = lease::message_len(&block, &wire, &side);
                if need == 0 {
                    None
                } else {
                    let got = {
                        let mut st = self.state();
                        if st.session.is_ended() {
                            return Now::Ended;
                        }
                        if !st.chunks.fits(need) {
                            return Now::TooLarge(d.call, need);
                        }
                        st.chunks.alloc(need)
                    };
                    let Some(c) = got else { return Now::NoChunk(d, block, wire, side) };
                    lease::place(&self.map, c, &mut d, &block, &wire, &side);
                    let n = (block.len() + wire.len()) as u64;
                    self.stats.response_bytes_copied.fetch_add(n, Ordering::Relaxed);
                    Some((c, lease::own(self, c)))
                }
            }
        };
        if d.has(desc::MESSAGE) {
            self.stats.responses.fetch_add(1, Ordering::Relaxed);
        }
        match self.hand_over(&mut d, held) {
            Err(()) => Now::Ended,
            Ok(()) => match self.responses.push(&d) {
                Ok(()) => {
                    self.ring_engine();
                    Now::Posted
                }
                Err(_) => Now::Full(d),
            },
        }
    }

    /// Hands `held`'s chunk over with `d` (before the descriptor leaves:
    /// the release may come at once). `held` itself goes after the lock:
    /// the last reference frees the chunk, which takes the lock.
    fn hand_over(&self, d: &mut Descriptor, held: Option<(Chunk, Bytes)>) -> Result<(), ()> {
        let token = held.as_ref().map(|(chunk, bytes)| (*chunk, bytes.clone()));
        let replaced = self.state().session.hand_over(d, token).map_err(|_| ())?;
        drop(replaced);
        Ok(())
    }

    /// Hands `held`'s chunk over with `d` and posts it, waiting for room
    /// on the ring.
    pub(super) async fn push(
        self: &Arc<Self>,
        mut d: Descriptor,
        held: Option<(Chunk, Bytes)>,
    ) -> Result<(), ()> {
        self.hand_over(&mut d, held)?;
        self.push_wait(d).await
    }

    /// Pushes a descriptor already handed over, waiting for room on the
    /// ring.
    pub(super) async fn push_wait(self: &Arc<Self>, d: Descriptor) -> Result<(), ()> {
        loop {
            match self.responses.push(&d) {
                Ok(()) => {
                    self.ring_engine();
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
    pub(super) async fn copy(
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

/// A call's last descriptors ([`Session::last`]).
enum Last {
    /// One descriptor: the status, with the message and headers if any.
    One { d: Descriptor, block: Bytes, wire: Bytes, side: Vec<u8> },
    /// A message in place and side sections to send too: headers (if
    /// any), the message, then the status (`d`).
    Several { d: Descriptor, block: Bytes, wire: Bytes, headers: Option<Metadata> },
}

/// How far [`Session::post_now`] got.
pub(super) enum Now {
    /// Pushed.
    Posted,
    /// The session ended: nothing was posted.
    Ended,
    /// Handed over, but the ring is full: push it when there is room.
    Full(Descriptor),
    /// No chunk is free for the copy: nothing was done.
    NoChunk(Descriptor, Bytes, Bytes, Vec<u8>),
    /// No chunk is large enough for the response of this call: it fails.
    TooLarge(u64, usize),
}

/// What [`Session::copy`] did.
pub(super) enum Posted {
    /// Copied into a chunk, held by the bytes.
    Copied(Chunk, Bytes),
    /// Nothing to copy (a descriptor without bytes).
    Nothing,
    /// No chunk is large enough.
    TooLarge(usize),
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
