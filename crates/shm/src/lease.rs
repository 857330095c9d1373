//! Chunks as bytes, both ways.
//!
//! * Held: a chunk of the *other* side, read in place as `Bytes` and
//!   handed back when the last piece is dropped. Both the engine (response
//!   chunks) and the application (request chunks) hold the other side's
//!   chunks this way; what "handed back" means is the holder's
//!   ([`Holder`]).
//! * Lent: a chunk of *this* side's half as the memory a block is laid out
//!   in ([`lend`]): the application's builders write responses there, the
//!   engine decodes requests there. The finished block becomes `Bytes` over
//!   the same chunk ([`protoplane_wire::Block::into_shared`]), which go to
//!   the other side with a descriptor; the chunk returns to this side's
//!   free list when the last of those bytes is dropped, which the sender
//!   arranges to be after the other side released it.

use std::sync::Arc;

use bytes::Bytes;
use protoplane_wire::{Lent, LentOwner};

use crate::desc::{Descriptor, Span};
use crate::layout::Chunk;
use crate::sys::Mapping;

/// Who holds leased chunks: maps them and takes them back.
pub trait Holder: Send + Sync + 'static {
    /// The region the chunks are in.
    fn mapping(&self) -> &Mapping;
    /// The lease of `chunk` ended.
    fn give_back(&self, chunk: Chunk);
}

struct Lease<H: Holder> {
    holder: Arc<H>,
    chunk: Chunk,
}

impl<H: Holder> AsRef<[u8]> for Lease<H> {
    fn as_ref(&self) -> &[u8] {
        // The chunk came from the layout, so it lies in the mapping; read in
        // place under `Mapping::bytes`'s contract.
        self.holder
            .mapping()
            .bytes(self.chunk.offset as usize, self.chunk.len as usize)
            .unwrap_or(&[])
    }
}

impl<H: Holder> Drop for Lease<H> {
    fn drop(&mut self) {
        self.holder.give_back(self.chunk);
    }
}

/// A held chunk's bytes; slices of them keep the lease.
#[derive(Clone, Debug)]
pub struct Held {
    bytes: Bytes,
    chunk: Chunk,
}

impl Held {
    /// Leases `chunk` from `holder` until every piece is dropped.
    pub fn new<H: Holder>(holder: Arc<H>, chunk: Chunk) -> Held {
        Held { bytes: Bytes::from_owner(Lease { holder, chunk }), chunk }
    }

    /// The bytes of `span` (empty for an empty span). The caller checked
    /// `span.within(chunk)`; a span outside gives empty bytes.
    pub fn piece(&self, span: Span) -> Bytes {
        if span.len == 0 || !span.within(self.chunk.offset, self.chunk.len) {
            return Bytes::new();
        }
        let from = (span.offset - self.chunk.offset) as usize;
        self.bytes.slice(from..from + span.len as usize)
    }
}

/// This side's own chunks: where [`lend`] gets them and returns them.
pub trait Pool: Send + Sync + 'static {
    /// The region.
    fn map(&self) -> &Arc<Mapping>;
    /// A free chunk of this side's half holding at least `need` bytes.
    fn alloc(&self, need: usize) -> Option<Chunk>;
    /// Puts a chunk back on the free list.
    fn free(&self, chunk: Chunk);
}

/// One of this side's chunks, out of the free list until dropped.
struct Own<P: Pool> {
    pool: Arc<P>,
    chunk: Chunk,
}

impl<P: Pool> Drop for Own<P> {
    fn drop(&mut self) {
        self.pool.free(self.chunk);
    }
}

/// The owner of (the part from `start` of) a chunk lent to a block.
struct Lender<P: Pool> {
    own: Own<P>,
    start: usize,
    grows: bool,
}

/// A finished block's bytes in this side's chunk: `len` from `start`.
struct Shared<P: Pool> {
    own: Own<P>,
    start: usize,
    len: usize,
}

impl<P: Pool> AsRef<[u8]> for Shared<P> {
    fn as_ref(&self) -> &[u8] {
        // Read in place under `Mapping::bytes`'s contract; the range lies in
        // this side's chunk (checked when made), inside the mapping.
        let at = self.own.chunk.offset as usize + self.start;
        self.own.pool.map().bytes(at, self.len).unwrap_or(&[])
    }
}

impl<P: Pool> LentOwner for Lender<P> {
    fn grow(&self, need: usize) -> Option<Lent> {
        if !self.grows {
            return None;
        }
        lend(&self.own.pool, need, true)
    }

    fn share(self: Box<Self>, bytes: &'static mut [u8], len: usize) -> Bytes {
        // The block's last use of its slice: from now on the chunk is read
        // through the mapping only.
        let _ = bytes;
        let len = len.min(self.own.chunk.len as usize - self.start);
        Bytes::from_owner(Shared { own: self.own, start: self.start, len })
    }
}

/// Lends a chunk of this side's half holding at least `need` bytes to a
/// block; `grows`: when the block outgrows it, a bigger chunk (else the
/// block moves to private memory, and its sender copies it).
pub fn lend<P: Pool>(pool: &Arc<P>, need: usize, grows: bool) -> Option<Lent> {
    lend_from(pool, pool.alloc(need)?, 0, grows)
}

/// Takes a chunk of this side's half holding `prefix` (copied to its
/// start, 8-aligned after) and then at least `room` bytes, and lends that
/// room to a block: the engine's request chunk, wire bytes first and the
/// block decoded after them. Returns the lent room and where the prefix
/// went.
pub fn lend_after<P: Pool>(pool: &Arc<P>, prefix: &[u8], room: usize) -> Option<(Lent, Span)> {
    let start = align8(prefix.len());
    let chunk = pool.alloc(start + room)?;
    pool.map().write(chunk.offset as usize, prefix);
    let span =
        Span { offset: if prefix.is_empty() { 0 } else { chunk.offset }, len: prefix.len() as u32 };
    Some((lend_from(pool, chunk, start, false)?, span))
}

fn lend_from<P: Pool>(pool: &Arc<P>, chunk: Chunk, start: usize, grows: bool) -> Option<Lent> {
    let own = Own { pool: pool.clone(), chunk };
    let len = (chunk.len as usize).checked_sub(start)?;
    // SAFETY: the chunk just left this side's free list, so nothing else
    // in this process uses it until `own` puts it back (the prefix before
    // `start` was written above and is only read from now on), and `own`
    // (with its `Arc` of the mapping) lives in the block's owner beside
    // the slice, which the block drops before its owner (or hands back in
    // `share`). The other process does not write it: see `Mapping::lend`.
    let bytes = unsafe { pool.map().lend(chunk.offset as usize + start, len) }?;
    Some(Lent::new(bytes, Box::new(Lender { own, start, grows })))
}

/// Takes a chunk of this side's half holding at least `need` bytes as a
/// receive buffer: its memory, writable, and the guard that puts the chunk
/// back on the free list when dropped. The engine's lean reader receives
/// requests there straight from the socket, so their wire bytes are in the
/// region before anything parses them; the caller keeps the guard alive as
/// long as the memory or any bytes cut from it (in the owner of those
/// bytes).
pub fn landing<P: Pool>(
    pool: &Arc<P>,
    need: usize,
) -> Option<(&'static mut [u8], impl Send + Sync + 'static)> {
    let chunk = pool.alloc(need)?;
    let own = Own { pool: pool.clone(), chunk };
    // SAFETY: as in `lend_from`: the chunk just left this side's free list,
    // so nothing else in this process uses it until `own` puts it back, and
    // the caller keeps `own` (with its `Arc` of the mapping) alive as long
    // as the slice and everything cut from it. Parts cut off and handed
    // over are only read from then on, by both processes (the caller keeps
    // writing only the part it has not cut off). The other process does
    // not write it: see `Mapping::lend`.
    let bytes = unsafe { pool.map().lend(chunk.offset as usize, chunk.len as usize) }?;
    Some((bytes, own))
}

/// A chunk this side took from its own free list (and filled), as bytes
/// over all of it that put it back when the last of them is dropped.
pub fn own<P: Pool>(pool: &Arc<P>, chunk: Chunk) -> Bytes {
    let own = Own { pool: pool.clone(), chunk };
    Bytes::from_owner(Shared { own, start: 0, len: chunk.len as usize })
}

/// Where a message's bytes lie in this side's half, if they lie there: the
/// chunk (checked against the layout's `half`) and the span.
pub fn locate(map: &Mapping, half: &crate::layout::Half, bytes: &[u8]) -> Option<(Chunk, Span)> {
    if bytes.is_empty() {
        return None;
    }
    let off = (bytes.as_ptr() as usize).checked_sub(map.base() as usize)?;
    if off.checked_add(bytes.len())? > map.len() {
        return None;
    }
    let chunk = half.chunk_containing(off as u32)?;
    let span = Span { offset: off as u32, len: bytes.len() as u32 };
    span.within(chunk.offset, chunk.len).then_some((chunk, span))
}

fn align8(n: usize) -> usize {
    (n + 7) & !7
}

/// Bytes a chunk needs to hold a message's block, wire bytes and side
/// sections (each 8-aligned).
pub fn message_len(block: &[u8], wire: &[u8], side: &[u8]) -> usize {
    align8(block.len()) + align8(wire.len()) + side.len()
}

/// Copies a message's parts into `chunk` (block first, at the chunk's
/// 8-aligned start) and records where they went in `d`. The chunk must hold
/// [`message_len`] bytes.
pub fn place(
    map: &Mapping,
    chunk: Chunk,
    d: &mut Descriptor,
    block: &[u8],
    wire: &[u8],
    side: &[u8],
) {
    let mut at = chunk.offset;
    let mut put = |bytes: &[u8]| {
        let span = Span { offset: if bytes.is_empty() { 0 } else { at }, len: bytes.len() as u32 };
        map.write(at as usize, bytes);
        at += align8(bytes.len()) as u32;
        span
    };
    d.block = put(block);
    d.wire = put(wire);
    d.side = put(side);
    d.chunk = chunk.offset;
}
