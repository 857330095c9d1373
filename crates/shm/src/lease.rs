//! A chunk held by this side: its bytes read in place as `Bytes`, handed
//! back when the last piece is dropped. Both the engine (response chunks)
//! and the application (request chunks) hold the other side's chunks this
//! way; what "handed back" means is the holder's ([`Holder`]).

use std::sync::Arc;

use bytes::Bytes;

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
