//! Where the encoder's write pass puts bytes: a contiguous buffer, or a
//! scatter-gather list that references payloads in place.
//!
//! A scatter-gather encode copies only the framing (tags, lengths, small
//! values) into a scratch buffer and hands the transport an iovec list in
//! which every string / bytes payload of at least `min_payload` bytes is a
//! slice of the block (or of the received wire bytes): no payload byte is
//! copied. This is the encode the engine uses when the transport can write
//! vectors (`writev`, `sendmsg`).

use std::io::IoSlice;
use std::ops::Range;

use crate::varint;

/// The write pass's output. `'a` is the lifetime of the payloads.
pub(crate) trait Sink<'a> {
    /// Bytes that must be copied (framing, small values).
    fn bytes(&mut self, b: &[u8]);
    /// A payload that lives as long as the source block: may be referenced.
    fn payload(&mut self, b: &'a [u8]);
    /// A varint.
    fn varint(&mut self, v: u64);
    /// A pre-encoded tag: the low `len` bytes of `bytes`.
    #[inline(always)]
    fn tag(&mut self, bytes: u64, len: u8) {
        self.bytes(&bytes.to_le_bytes()[..len as usize]);
    }
}

impl<'a> Sink<'a> for Vec<u8> {
    #[inline(always)]
    fn bytes(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
    #[inline(always)]
    fn payload(&mut self, b: &'a [u8]) {
        self.extend_from_slice(b);
    }
    #[inline(always)]
    fn varint(&mut self, v: u64) {
        varint::push(self, v);
    }
}

/// One piece of a scatter-gather encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seg<'a> {
    Scratch(Range<usize>),
    Payload(&'a [u8]),
}

/// A scatter-gather encoding: framing in a scratch buffer, large payloads
/// referenced where they are. Reuse one across encodes (`clear`).
#[derive(Clone, Debug)]
pub struct SgList<'a> {
    scratch: Vec<u8>,
    segs: Vec<Seg<'a>>,
    open: usize,
    min_payload: usize,
}

impl Default for SgList<'_> {
    fn default() -> Self {
        SgList::new(64)
    }
}

impl<'a> SgList<'a> {
    /// An empty list; payloads shorter than `min_payload` bytes are copied
    /// into the scratch buffer (an iovec entry costs more than a short copy).
    pub fn new(min_payload: usize) -> Self {
        SgList { scratch: Vec::new(), segs: Vec::new(), open: 0, min_payload: min_payload.max(1) }
    }

    /// Forgets the content, keeps the allocations.
    pub fn clear(&mut self) {
        self.scratch.clear();
        self.segs.clear();
        self.open = 0;
    }

    pub(crate) fn finish(&mut self) {
        if self.open < self.scratch.len() {
            self.segs.push(Seg::Scratch(self.open..self.scratch.len()));
            self.open = self.scratch.len();
        }
    }

    /// Number of pieces.
    pub fn len(&self) -> usize {
        self.segs.len()
    }

    /// No pieces.
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// Total encoded length.
    pub fn total_len(&self) -> usize {
        self.pieces().map(<[u8]>::len).sum()
    }

    /// Bytes copied into the scratch buffer (the rest is referenced).
    pub fn copied_len(&self) -> usize {
        self.scratch.len()
    }

    /// The pieces in order.
    pub fn pieces(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.segs.iter().map(move |s| match s {
            Seg::Scratch(r) => &self.scratch[r.clone()],
            Seg::Payload(p) => *p,
        })
    }

    /// The pieces as `IoSlice`s for `write_vectored`.
    pub fn io_slices(&self) -> Vec<IoSlice<'_>> {
        self.pieces().map(IoSlice::new).collect()
    }

    /// Concatenates the pieces (for tests and for transports without vectors).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.total_len());
        for p in self.pieces() {
            v.extend_from_slice(p);
        }
        v
    }
}

impl<'a> Sink<'a> for SgList<'a> {
    #[inline(always)]
    fn bytes(&mut self, b: &[u8]) {
        self.scratch.extend_from_slice(b);
    }
    #[inline(always)]
    fn payload(&mut self, b: &'a [u8]) {
        if b.len() < self.min_payload {
            self.scratch.extend_from_slice(b);
            return;
        }
        self.finish();
        self.segs.push(Seg::Payload(b));
    }
    #[inline(always)]
    fn varint(&mut self, v: u64) {
        varint::push(&mut self.scratch, v);
    }
}
