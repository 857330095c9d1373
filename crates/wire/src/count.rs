//! Counting the stores a decode makes (RPCAcc's field-by-field baseline).
//!
//! A decoder that writes each field straight into host memory across an
//! interconnect issues one transaction per store: a scalar slot, a hasbit
//! word, a reference slot, a string's bytes, a zeroed sub-object, an
//! array's growth. [`Decoder::decode_counted`](crate::Decoder::decode_counted)
//! runs the ordinary decoder over [`Counting`] memory, which forwards every
//! store to a private block and counts it; the block it produces is the
//! same, byte for byte, as the plain decode's. The counts are those of
//! this decoder's real stores, not an estimate; what they cost on a given
//! interconnect is the simulator's business (`protoplane sim`).

use crate::block::BlockMem;

/// Stores into the block, as separate host-memory transactions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Separate stores.
    pub writes: u64,
    /// Bytes they wrote (zeroing included).
    pub bytes: u64,
}

impl WriteStats {
    #[inline(always)]
    fn add(&mut self, bytes: usize) {
        self.writes += 1;
        self.bytes += bytes as u64;
    }
}

/// Block memory that counts its stores.
pub(crate) struct Counting<'m, M: BlockMem> {
    pub(crate) inner: &'m mut M,
    pub(crate) stats: WriteStats,
    /// Copies of at least this many bytes are recorded in `bulk`.
    pub(crate) bulk_min: usize,
    /// (offset, length) of every such copy, in order.
    pub(crate) bulk: Option<&'m mut Vec<(usize, usize)>>,
}

impl<M: BlockMem> BlockMem for Counting<'_, M> {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn bytes(&self) -> &[u8] {
        self.inner.bytes()
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.inner.bytes_mut()
    }
    fn clear(&mut self) {
        self.inner.clear()
    }
    fn resize_zeroed(&mut self, new_len: usize) {
        let grow = new_len.saturating_sub(self.inner.len());
        if grow > 0 {
            self.stats.add(grow);
        }
        self.inner.resize_zeroed(new_len)
    }
    fn put_at_end(&mut self, at: usize, bytes: &[u8]) {
        self.stats.add(bytes.len());
        self.inner.put_at_end(at, bytes)
    }
    fn reserve_total(&mut self, len: usize) {
        self.inner.reserve_total(len)
    }
    fn base_addr(&self) -> usize {
        self.inner.base_addr()
    }
    fn start(&mut self, type_index: u32, size: u32, flags: u32) -> usize {
        // The header and the zeroed root object.
        self.stats.add(crate::block::HEADER_LEN);
        self.stats.add(size as usize);
        self.inner.start(type_index, size, flags)
    }
    fn alloc_zeroed(&mut self, size: usize) -> usize {
        self.stats.add(size);
        self.inner.alloc_zeroed(size)
    }
    fn alloc_copy(&mut self, bytes: &[u8]) -> usize {
        self.stats.add(bytes.len());
        let at = self.inner.alloc_copy(bytes);
        if bytes.len() >= self.bulk_min {
            if let Some(b) = self.bulk.as_deref_mut() {
                b.push((at, bytes.len()));
            }
        }
        at
    }
    fn put_u32(&mut self, at: usize, v: u32) {
        self.stats.add(4);
        self.inner.put_u32(at, v)
    }
    fn put_u64(&mut self, at: usize, v: u64) {
        self.stats.add(8);
        self.inner.put_u64(at, v)
    }
    fn put_scalar(&mut self, at: usize, size: u32, v: u64) {
        self.stats.add(size as usize);
        self.inner.put_scalar(at, size, v)
    }
    fn set_hasbit(&mut self, obj: usize, bit: u32) {
        self.stats.add(4);
        self.inner.set_hasbit(obj, bit)
    }
    fn grow_array(&mut self, slot: usize, elem: usize, extra: u32) -> Result<usize, ()> {
        // The slot's new length, plus the array's move when it reallocates.
        let before = self.inner.len();
        let r = self.inner.grow_array(slot, elem, extra);
        self.stats.add(8);
        let grown = self.inner.len().saturating_sub(before);
        if grown > 0 {
            self.stats.add(grown);
        }
        r
    }
    fn shrink_array(&mut self, slot: usize, n: u32) {
        self.stats.add(8);
        self.inner.shrink_array(slot, n)
    }
}
