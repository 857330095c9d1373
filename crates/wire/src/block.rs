//! The linearized message: one contiguous, position-independent block.
//!
//! Heads up: read DESIGN.md "Key formats" and the object layout in the
//! `schema` crate's `table.rs` before changing anything here; the engine,
//! the app process and a device all read these bytes.
//!
//! ```text
//! block := header | object | (object | array | bytes)*          all offsets 8-aligned
//! header (16 B) := root_offset u32 | type_index u32 | flags u32 | reserved u32
//!
//! reference slot (8 B), little endian:
//!   0        4                                         8
//!   +--------+-----------------------------------------+
//!   | offset |  len (bits 0..=29) | WIRE b30 | DEVICE b31 |
//!   +--------+-----------------------------------------+
//!   offset : from the start of the block (WIRE clear) or of the received
//!            wire bytes (WIRE set: a zero-copy view of a string / bytes);
//!            0 means "no data" (offset 0 is the header, never a payload)
//!   len    : bytes for string / bytes / unknown fields, element count for
//!            repeated fields, object size for a sub-message
//!   DEVICE : the data lives in the device region (RPCAcc placement)
//! ```
//!
//! Arrays that grow while decoding (repeated fields arriving interleaved with
//! others, unknown fields) have a capacity that is never stored: it is
//! always [`capacity`]`(len)`, a power of two, at least 4. An array that
//! needs more room is extended in place when it is the last thing in the
//! block, otherwise it moves to the end with twice the room. Space left
//! behind is never reused: past 4 elements at most half of an array's
//! footprint is slack, so a block stays within a small constant factor of
//! the wire bytes it was decoded from.

/// Size of the block header.
pub const HEADER_LEN: usize = 16;

/// Flag bit in a reference's `len`: the data is in the device region.
pub const REF_DEVICE: u32 = 1 << 31;
/// Flag bit in a reference's `len`: the offset points into the wire bytes.
pub const REF_WIRE: u32 = 1 << 30;
/// Mask of the length bits of a reference.
pub const REF_LEN_MASK: u32 = REF_WIRE - 1;

/// Largest string, bytes field or array a block can describe (2^30 - 1).
pub const MAX_LEN: usize = REF_LEN_MASK as usize;

/// Header flag: strings / bytes may reference the wire bytes.
pub const BLOCK_VIEW: u32 = 1;

/// Smallest capacity of a non-empty growable array: most repeated fields
/// hold a handful of elements, and growing 1 -> 2 -> 4 would move such an
/// array twice (a move copies it to the end of the block).
pub(crate) const MIN_CAPACITY: u32 = 4;

/// Capacity of a growable array holding `len` elements.
#[inline]
pub(crate) fn capacity(len: u32) -> u32 {
    if len == 0 {
        0
    } else {
        len.next_power_of_two().max(MIN_CAPACITY)
    }
}

/// Source of zero bytes for small allocations.
static ZEROS: [u8; 256] = [0; 256];

/// Copies at least this long get a 4K-aliasing-free placement (see
/// `Block::alloc_copy`).
const ALIGNED_COPY_MIN: usize = 2048;

/// A decoded reference slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ref {
    /// Offset (block or wire, see `wire`).
    pub offset: u32,
    /// Length in bytes / elements.
    pub len: u32,
    /// Points into the wire bytes.
    pub wire: bool,
    /// Points into the device region.
    pub device: bool,
}

impl Ref {
    #[inline(always)]
    pub(crate) fn unpack(raw: u64) -> Ref {
        let len = (raw >> 32) as u32;
        Ref {
            offset: raw as u32,
            len: len & REF_LEN_MASK,
            wire: len & REF_WIRE != 0,
            device: len & REF_DEVICE != 0,
        }
    }

    #[inline(always)]
    pub(crate) fn pack(self) -> u64 {
        let mut len = self.len;
        if self.wire {
            len |= REF_WIRE;
        }
        if self.device {
            len |= REF_DEVICE;
        }
        self.offset as u64 | (len as u64) << 32
    }
}

/// An owned linearized message (or one under construction).
///
/// `Block` is a growable byte buffer: because every reference is an offset,
/// growing (and moving) the buffer never invalidates anything. Reuse one
/// block across decodes (`clear` keeps the capacity) and steady-state
/// decoding allocates nothing.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Block {
    pub(crate) buf: Vec<u8>,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("len", &self.buf.len())
            .field("type", &self.type_index())
            .finish()
    }
}

impl Block {
    /// An empty block.
    pub fn new() -> Block {
        Block { buf: Vec::new() }
    }

    /// An empty block with room for `cap` bytes.
    pub fn with_capacity(cap: usize) -> Block {
        Block { buf: Vec::with_capacity(cap) }
    }

    /// Wraps bytes received from elsewhere (another process, a file). They
    /// are not trusted: every read through a view is bounds-checked.
    pub fn from_bytes(bytes: Vec<u8>) -> Block {
        Block { buf: bytes }
    }

    /// The raw bytes: what gets copied into shared memory or onto a device.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Consumes the block, returning its bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    /// Bytes in use.
    #[inline]
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// No header yet.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Forgets the content, keeps the allocation.
    #[inline]
    pub fn clear(&mut self) {
        self.buf.clear();
    }

    /// Type index recorded in the header (`None` before anything was decoded).
    pub fn type_index(&self) -> Option<u32> {
        read_u32(&self.buf, 4)
    }

    /// Offset of the root object.
    pub fn root(&self) -> Option<u32> {
        read_u32(&self.buf, 0)
    }

    /// Header flags ([`BLOCK_VIEW`]).
    pub fn flags(&self) -> u32 {
        read_u32(&self.buf, 8).unwrap_or(0)
    }

    /// Starts a block holding one zeroed root object of `size` bytes.
    pub(crate) fn start(&mut self, type_index: u32, size: u32, flags: u32) -> usize {
        self.buf.clear();
        let mut header = [0u8; HEADER_LEN];
        header[0..4].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        header[4..8].copy_from_slice(&type_index.to_le_bytes());
        header[8..12].copy_from_slice(&flags.to_le_bytes());
        self.buf.extend_from_slice(&header);
        // HEADER_LEN is 8-aligned: the root object follows the header.
        let root = self.alloc_zeroed(size as usize);
        debug_assert_eq!(root, HEADER_LEN);
        root
    }

    /// Appends `size` zero bytes at the next 8-aligned offset.
    #[inline(always)]
    pub(crate) fn alloc_zeroed(&mut self, size: usize) -> usize {
        let at = (self.buf.len() + 7) & !7;
        let grow = at + size - self.buf.len();
        if grow <= ZEROS.len() {
            // Objects and new arrays are small: an inlined append of static
            // zeros is cheaper than the out-of-line `Vec::resize`.
            self.buf.extend_from_slice(&ZEROS[..grow]);
        } else {
            self.buf.resize(at + size, 0);
        }
        at
    }

    /// Appends a copy of `bytes` at the next 8-aligned offset.
    ///
    /// Large copies are placed so that the destination is not 1..63 bytes
    /// ahead of the source modulo 4 KiB: there, on x86 cores, each load of
    /// the copy loop falsely depends on the store just before it ("4K
    /// aliasing") and a large copy runs up to twice as slow (measured here:
    /// 300 KB in 2.7 us vs 6.6 us). At most 64 bytes of padding per copy of
    /// at least [`ALIGNED_COPY_MIN`] bytes. The padding depends on where the
    /// buffers lie, so two decodes of the same input may differ in layout
    /// (never in content): compare blocks by what they encode, not by bytes.
    #[inline(always)]
    pub(crate) fn alloc_copy(&mut self, bytes: &[u8]) -> usize {
        let mut at = (self.buf.len() + 7) & !7;
        if bytes.len() >= ALIGNED_COPY_MIN {
            // Reserve first: the address must be the one the copy goes to.
            self.buf.reserve((at + 64 + bytes.len()).saturating_sub(self.buf.len()));
            let dst = self.buf.as_ptr() as usize + at;
            let ahead = dst.wrapping_sub(bytes.as_ptr() as usize) % 4096;
            if ahead < 64 {
                at += (64 - ahead + 7) & !7;
            }
        }
        self.buf.resize(at, 0);
        self.buf.extend_from_slice(bytes);
        at
    }

    #[inline(always)]
    pub(crate) fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.buf[at..at + 4].try_into().unwrap_or([0; 4]))
    }

    #[inline(always)]
    pub(crate) fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.buf[at..at + 8].try_into().unwrap_or([0; 8]))
    }

    #[inline(always)]
    pub(crate) fn put_u32(&mut self, at: usize, v: u32) {
        self.buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    #[inline(always)]
    pub(crate) fn put_u64(&mut self, at: usize, v: u64) {
        self.buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    /// Writes a scalar of `size` bytes (1, 4 or 8).
    #[inline(always)]
    pub(crate) fn put_scalar(&mut self, at: usize, size: u32, v: u64) {
        match size {
            8 => self.put_u64(at, v),
            4 => self.put_u32(at, v as u32),
            _ => self.buf[at] = v as u8,
        }
    }

    #[inline(always)]
    pub(crate) fn set_hasbit(&mut self, obj: usize, bit: u32) {
        let at = obj + 4 * (bit as usize / 32);
        let w = self.u32_at(at) | 1 << (bit % 32);
        self.put_u32(at, w);
    }

    #[inline(always)]
    pub(crate) fn hasbit(&self, obj: usize, bit: u32) -> bool {
        self.u32_at(obj + 4 * (bit as usize / 32)) & (1 << (bit % 32)) != 0
    }

    /// Makes room for `extra` more elements of `elem` bytes in the array
    /// whose reference slot is at `slot`; updates the slot's length and
    /// returns the byte offset where the new elements go. See the module
    /// docs for the capacity rule. `Err(())` if the array would exceed
    /// [`MAX_LEN`] elements.
    #[inline]
    pub(crate) fn grow_array(&mut self, slot: usize, elem: usize, extra: u32) -> Result<usize, ()> {
        let raw = self.u64_at(slot);
        let r = Ref::unpack(raw);
        if extra == 1 && r.len != 0 && r.len < capacity(r.len) {
            // Hot case: one more element and room left; bump the length.
            self.put_u64(slot, raw + (1 << 32));
            return Ok(r.offset as usize + r.len as usize * elem);
        }
        let new_len = r.len.checked_add(extra).filter(|&n| n as usize <= MAX_LEN).ok_or(())?;
        let old_cap = capacity(r.len);
        let new_cap = capacity(new_len);
        let start = r.offset as usize;
        let write_at;
        if new_cap == old_cap && r.len != 0 {
            write_at = start + r.len as usize * elem;
        } else if r.len != 0 && start + old_cap as usize * elem == self.buf.len() {
            // Last thing in the block: extend in place.
            self.buf.resize(start + new_cap as usize * elem, 0);
            write_at = start + r.len as usize * elem;
        } else {
            let at = self.alloc_zeroed(new_cap as usize * elem);
            if r.len != 0 {
                self.buf.copy_within(start..start + r.len as usize * elem, at);
            }
            write_at = at + r.len as usize * elem;
            let moved = Ref { offset: at as u32, len: r.len, wire: false, device: false };
            self.put_u64(slot, moved.pack());
        }
        let updated = Ref::unpack(self.u64_at(slot));
        self.put_u64(slot, Ref { len: new_len, ..updated }.pack());
        Ok(write_at)
    }

    /// Drops the last `n` elements of an array (used when a packed closed
    /// enum run turned out to contain unknown values).
    pub(crate) fn shrink_array(&mut self, slot: usize, n: u32) {
        let r = Ref::unpack(self.u64_at(slot));
        self.put_u64(slot, Ref { len: r.len - n.min(r.len), ..r }.pack());
    }
}

#[inline(always)]
pub(crate) fn read_u32(buf: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(buf.get(at..at + 4)?.try_into().ok()?))
}

/// A pool of blocks handed out from a free list (RPCAcc's free-list FIFO):
/// a server decodes each request into a recycled block, so steady-state
/// traffic allocates nothing. In split mode the same role is played by
/// chunks of a shared mapping.
#[derive(Debug, Default)]
pub struct Region {
    free: Vec<Block>,
    max_free: usize,
}

impl Region {
    /// A region keeping at most `max_free` idle blocks.
    pub fn new(max_free: usize) -> Region {
        Region { free: Vec::new(), max_free }
    }

    /// Takes a block (recycled if one is free).
    pub fn take(&mut self) -> Block {
        self.free.pop().unwrap_or_default()
    }

    /// Returns a block to the free list.
    pub fn give(&mut self, mut block: Block) {
        if self.free.len() < self.max_free {
            block.clear();
            self.free.push(block);
        }
    }

    /// Idle blocks.
    pub fn idle(&self) -> usize {
        self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_pack_flags_into_len() {
        let r = Ref { offset: 0x1234, len: 77, wire: true, device: false };
        let raw = r.pack();
        assert_eq!(raw, 0x1234 | ((77u64 | REF_WIRE as u64) << 32));
        assert_eq!(Ref::unpack(raw), r);
        let d = Ref { offset: 8, len: MAX_LEN as u32, wire: false, device: true };
        assert_eq!(Ref::unpack(d.pack()), d);
    }

    #[test]
    fn arrays_grow_in_place_or_move() {
        let mut b = Block::new();
        let obj = b.start(0, 16, 0);
        let slot = obj;
        let vals = |b: &Block| -> Vec<u32> {
            let r = Ref::unpack(b.u64_at(slot));
            (0..r.len as usize).map(|i| b.u32_at(r.offset as usize + 4 * i)).collect()
        };
        // First element: a fresh array with room for MIN_CAPACITY.
        let at = b.grow_array(slot, 4, 1).unwrap_or(0);
        b.put_u32(at, 10);
        // Room left: the next ones go right after, even with something
        // allocated behind the array.
        b.alloc_copy(b"xyz");
        for i in 1..MIN_CAPACITY {
            let next = b.grow_array(slot, 4, 1).unwrap_or(0);
            assert_eq!(next, at + 4 * i as usize);
            b.put_u32(next, 10 + i);
        }
        // Full and not last: the next growth moves it to the end, doubled.
        let end = b.len();
        let moved = b.grow_array(slot, 4, 1).unwrap_or(0);
        b.put_u32(moved, 14);
        let r = Ref::unpack(b.u64_at(slot));
        assert!(r.offset as usize >= end);
        assert_eq!(vals(&b), [10, 11, 12, 13, 14]);
        // Now last in the block: grows in place once past capacity 8.
        for i in 5..9 {
            let at = b.grow_array(slot, 4, 1).unwrap_or(0);
            b.put_u32(at, 10 + i);
        }
        assert_eq!(Ref::unpack(b.u64_at(slot)).offset, r.offset);
        assert_eq!(vals(&b), (10..19).collect::<Vec<u32>>());
    }
}
