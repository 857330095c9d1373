//! The linearized message: one contiguous, position-independent block.
//!
//! Heads up: read ARCHITECTURE.md ("schema / wire contracts") and the object layout in the
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

/// A string of at most 16 bytes with 16 bytes of input from its start
/// (`input[start..start + len]`): its bytes as one little-endian word, the
/// bytes past it zero; `None` for a longer one or one too near the input's
/// end. The decoders check (ASCII: [`ascii_word`]) and copy
/// ([`BlockMem::alloc_short`]) the many short strings as this one word, no
/// call.
#[inline(always)]
pub(crate) fn short_word(input: &[u8], start: usize, len: usize) -> Option<u128> {
    if len > 16 {
        return None;
    }
    let chunk: [u8; 16] = input.get(start..start + 16)?.try_into().ok()?;
    let mask = if len == 16 { u128::MAX } else { (1u128 << (8 * len)) - 1 };
    Some(u128::from_le_bytes(chunk) & mask)
}

/// Whether every byte of a [`short_word`] is ASCII (then it is UTF-8).
#[inline(always)]
pub(crate) fn ascii_word(word: u128) -> bool {
    word & 0x8080_8080_8080_8080_8080_8080_8080_8080 == 0
}

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
/// A block lives in private memory (a growable `Vec`) or in memory lent to
/// it ([`Lent`]: a chunk of a shared region, where a split application
/// builds its responses and the engine decodes its requests). Either way,
/// because every reference is an offset, growing (and moving) the bytes
/// never invalidates anything. Reuse one block across decodes (`clear`
/// keeps the memory) and steady-state decoding allocates nothing.
#[derive(Default)]
pub struct Block {
    pub(crate) mem: Mem,
}

pub(crate) enum Mem {
    /// Private memory: the `Vec`'s length is the block's.
    Heap(Vec<u8>),
    /// Lent memory: `len` bytes of it in use.
    Lent(Lent),
}

impl Default for Mem {
    fn default() -> Self {
        Mem::Heap(Vec::new())
    }
}

/// Memory lent to a block by its owner (a chunk of a shared region).
///
/// The block writes the bytes in place; when they run out it asks the
/// owner for more ([`LentOwner::grow`], the used bytes move there) or,
/// failing that, moves to private memory. A finished block becomes shared
/// bytes through [`LentOwner::share`] — still in place, so the reader (the
/// engine, the other process) gets the very bytes the builder wrote.
pub struct Lent {
    bytes: &'static mut [u8],
    len: usize,
    owner: Box<dyn LentOwner>,
}

/// Whoever lends memory to blocks (see [`Lent`]).
pub trait LentOwner: Send + Sync + 'static {
    /// Memory for at least `need` bytes from the same place, or `None`.
    fn grow(&self, need: usize) -> Option<Lent>;
    /// The memory (handed back) as shared bytes of its first `len`, which
    /// keep it lent until the last of them is dropped.
    fn share(self: Box<Self>, bytes: &'static mut [u8], len: usize) -> bytes::Bytes;
}

impl Lent {
    /// Memory `bytes`, taken back by `owner` when dropped (or shared).
    ///
    /// `bytes` is `'static` because it lives as long as `owner` does, which
    /// the block keeps beside it and drops after its last use of `bytes`;
    /// whoever lends region memory this way vouches for that, and for no
    /// one else writing the bytes while they are lent.
    pub fn new(bytes: &'static mut [u8], owner: Box<dyn LentOwner>) -> Lent {
        Lent { bytes, len: 0, owner }
    }

    /// Where the memory starts (to recognise it in the region).
    pub fn addr(&self) -> usize {
        self.bytes.as_ptr() as usize
    }

    /// Bytes of memory.
    pub fn capacity(&self) -> usize {
        self.bytes.len()
    }
}

impl std::fmt::Debug for Lent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lent").field("len", &self.len).field("capacity", &self.capacity()).finish()
    }
}

impl Clone for Block {
    /// A copy in private memory.
    fn clone(&self) -> Self {
        Block::from_bytes(self.as_bytes().to_vec())
    }
}

impl PartialEq for Block {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Block {}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("len", &self.len())
            .field("type", &self.type_index())
            .field("lent", &self.is_lent())
            .finish()
    }
}

impl Block {
    /// An empty block.
    pub fn new() -> Block {
        Block { mem: Mem::Heap(Vec::new()) }
    }

    /// An empty block with room for `cap` bytes.
    pub fn with_capacity(cap: usize) -> Block {
        Block { mem: Mem::Heap(Vec::with_capacity(cap)) }
    }

    /// An empty block in lent memory.
    pub fn in_lent(lent: Lent) -> Block {
        Block { mem: Mem::Lent(Lent { len: 0, ..lent }) }
    }

    /// A block for a builder: in memory from the current thread's
    /// [`BlockSource`] if one is installed (see [`with_source`]), else
    /// private.
    pub fn for_builder() -> Block {
        SOURCE
            .with(|s| s.borrow().as_ref().and_then(|src| src.lend()))
            .map(Block::in_lent)
            .unwrap_or_default()
    }

    /// Wraps bytes received from elsewhere (another process, a file). They
    /// are not trusted: every read through a view is bounds-checked.
    pub fn from_bytes(bytes: Vec<u8>) -> Block {
        Block { mem: Mem::Heap(bytes) }
    }

    /// The raw bytes: what gets copied into shared memory or onto a device.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        self.mem.bytes()
    }

    /// Consumes the block, returning its bytes (a copy if they were lent).
    pub fn into_bytes(self) -> Vec<u8> {
        match self.mem {
            Mem::Heap(v) => v,
            Mem::Lent(l) => l.bytes[..l.len].to_vec(),
        }
    }

    /// Consumes the block, returning its bytes as shared bytes: lent ones
    /// stay where they are (no copy), private ones are handed over.
    pub fn into_shared(self) -> bytes::Bytes {
        match self.mem {
            Mem::Heap(v) => bytes::Bytes::from(v),
            Mem::Lent(Lent { bytes, len, owner }) => owner.share(bytes, len),
        }
    }

    /// Whether the block is in lent memory.
    pub fn is_lent(&self) -> bool {
        matches!(self.mem, Mem::Lent(_))
    }

    /// Bytes in use.
    #[inline]
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// No header yet.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets the content, keeps the memory.
    #[inline]
    pub fn clear(&mut self) {
        self.mem.clear()
    }

    /// Type index recorded in the header (`None` before anything was decoded).
    pub fn type_index(&self) -> Option<u32> {
        read_u32(self.as_bytes(), 4)
    }

    /// Offset of the root object.
    pub fn root(&self) -> Option<u32> {
        read_u32(self.as_bytes(), 0)
    }

    /// Header flags ([`BLOCK_VIEW`]).
    pub fn flags(&self) -> u32 {
        read_u32(self.as_bytes(), 8).unwrap_or(0)
    }

    /// The memory, for code generic over it (the decoder runs once per
    /// kind, so private memory pays nothing for lent memory existing).
    pub(crate) fn mem(&mut self) -> Store<'_> {
        match &mut self.mem {
            Mem::Heap(v) => Store::Heap(v),
            m => Store::Any(m),
        }
    }
}

/// A block's memory as the decoder takes it (see [`Block::mem`]).
pub(crate) enum Store<'a> {
    Heap(&'a mut Vec<u8>),
    Any(&'a mut Mem),
}

/// The primitives of a block's memory; everything else (objects, copies,
/// arrays, slots) is built on them, once for private memory (a `Vec`,
/// whose appends are what they always were) and once for [`Mem`], which
/// may be lent.
pub(crate) trait BlockMem {
    fn len(&self) -> usize;
    fn bytes(&self) -> &[u8];
    fn bytes_mut(&mut self) -> &mut [u8];
    fn clear(&mut self);
    /// Sets the length in use (longer: the new bytes are zero).
    fn resize_zeroed(&mut self, new_len: usize);
    /// Appends `bytes` at `at >= len` (the bytes between are zero).
    fn put_at_end(&mut self, at: usize, bytes: &[u8]);
    /// Room for `len` bytes in use without moving.
    fn reserve_total(&mut self, len: usize);
    /// Address of the first byte (for placement decisions only).
    fn base_addr(&self) -> usize;

    /// Starts a block holding one zeroed root object of `size` bytes.
    fn start(&mut self, type_index: u32, size: u32, flags: u32) -> usize {
        self.clear();
        let mut header = [0u8; HEADER_LEN];
        header[0..4].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        header[4..8].copy_from_slice(&type_index.to_le_bytes());
        header[8..12].copy_from_slice(&flags.to_le_bytes());
        self.put_at_end(0, &header);
        // HEADER_LEN is 8-aligned: the root object follows the header.
        let root = self.alloc_zeroed(size as usize);
        debug_assert_eq!(root, HEADER_LEN);
        root
    }

    /// Appends `size` zero bytes at the next 8-aligned offset.
    #[inline(always)]
    fn alloc_zeroed(&mut self, size: usize) -> usize {
        let at = (self.len() + 7) & !7;
        self.resize_zeroed(at + size);
        at
    }

    /// Appends a short string (`len <= 16` bytes: the low bytes of a
    /// [`short_word`]) at the next 8-aligned offset, as
    /// [`BlockMem::alloc_copy`] does.
    #[inline(always)]
    fn alloc_short(&mut self, word: u128, len: usize) -> usize {
        self.alloc_copy(&word.to_le_bytes()[..len.min(16)])
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
    fn alloc_copy(&mut self, bytes: &[u8]) -> usize {
        let mut at = (self.len() + 7) & !7;
        if bytes.len() >= ALIGNED_COPY_MIN {
            // Make room first: the address must be the one the copy goes to.
            self.reserve_total(at + 64 + bytes.len());
            let dst = self.base_addr() + at;
            let ahead = dst.wrapping_sub(bytes.as_ptr() as usize) % 4096;
            if ahead < 64 {
                at += (64 - ahead + 7) & !7;
            }
        }
        self.put_at_end(at, bytes);
        at
    }

    #[inline(always)]
    fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.bytes()[at..at + 4].try_into().unwrap_or([0; 4]))
    }

    #[inline(always)]
    fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.bytes()[at..at + 8].try_into().unwrap_or([0; 8]))
    }

    #[inline(always)]
    fn put_u32(&mut self, at: usize, v: u32) {
        self.bytes_mut()[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    #[inline(always)]
    fn put_u64(&mut self, at: usize, v: u64) {
        self.bytes_mut()[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    /// Writes a scalar of `size` bytes (1, 4 or 8).
    #[inline(always)]
    fn put_scalar(&mut self, at: usize, size: u32, v: u64) {
        match size {
            8 => self.put_u64(at, v),
            4 => self.put_u32(at, v as u32),
            _ => self.bytes_mut()[at] = v as u8,
        }
    }

    #[inline(always)]
    fn set_hasbit(&mut self, obj: usize, bit: u32) {
        let at = obj + 4 * (bit as usize / 32);
        let w = self.u32_at(at) | 1 << (bit % 32);
        self.put_u32(at, w);
    }

    #[inline(always)]
    fn hasbit(&self, obj: usize, bit: u32) -> bool {
        self.u32_at(obj + 4 * (bit as usize / 32)) & (1 << (bit % 32)) != 0
    }

    /// Makes room for `extra` more elements of `elem` bytes in the array
    /// whose reference slot is at `slot`; updates the slot's length and
    /// returns the byte offset where the new elements go. See the module
    /// docs for the capacity rule. `Err(())` if the array would exceed
    /// [`MAX_LEN`] elements.
    #[inline]
    fn grow_array(&mut self, slot: usize, elem: usize, extra: u32) -> Result<usize, ()> {
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
        } else if r.len != 0 && start + old_cap as usize * elem == self.len() {
            // Last thing in the block: extend in place.
            self.resize_zeroed(start + new_cap as usize * elem);
            write_at = start + r.len as usize * elem;
        } else {
            let at = self.alloc_zeroed(new_cap as usize * elem);
            if r.len != 0 {
                self.bytes_mut().copy_within(start..start + r.len as usize * elem, at);
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
    fn shrink_array(&mut self, slot: usize, n: u32) {
        let r = Ref::unpack(self.u64_at(slot));
        self.put_u64(slot, Ref { len: r.len - n.min(r.len), ..r }.pack());
    }
}

impl BlockMem for Vec<u8> {
    #[inline(always)]
    fn len(&self) -> usize {
        Vec::len(self)
    }

    #[inline(always)]
    fn bytes(&self) -> &[u8] {
        self
    }

    #[inline(always)]
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }

    #[inline(always)]
    fn clear(&mut self) {
        Vec::clear(self)
    }

    #[inline(always)]
    fn resize_zeroed(&mut self, new_len: usize) {
        let grow = new_len.saturating_sub(Vec::len(self));
        if grow > 0 && grow <= ZEROS.len() {
            // Objects and new arrays are small: an inlined append of static
            // zeros is cheaper than the out-of-line `Vec::resize`.
            self.extend_from_slice(&ZEROS[..grow]);
        } else {
            self.resize(new_len, 0);
        }
    }

    #[inline(always)]
    fn put_at_end(&mut self, at: usize, bytes: &[u8]) {
        self.resize(at, 0);
        self.extend_from_slice(bytes);
    }

    /// Fixed-size stores: zeros over the padding and past it, then the
    /// word's sixteen bytes over them, then a trim to the string's end;
    /// where `alloc_copy` pads and copies by length (a `memset` and a
    /// `memcpy` call). None of the stores is read back (assembling padding
    /// and word in a buffer on the stack first stalls on store forwarding).
    #[inline(always)]
    fn alloc_short(&mut self, word: u128, len: usize) -> usize {
        let end = Vec::len(self);
        let at = (end + 7) & !7;
        self.extend_from_slice(&[0u8; 24]);
        self[at..at + 16].copy_from_slice(&word.to_le_bytes());
        self.truncate(at + len.min(16));
        at
    }

    fn reserve_total(&mut self, len: usize) {
        self.reserve(len.saturating_sub(Vec::len(self)));
    }

    fn base_addr(&self) -> usize {
        self.as_ptr() as usize
    }
}

impl Mem {
    /// Lent memory with room for `len` bytes in use: grows it through its
    /// owner, or moves the block to private memory. The cold path of every
    /// append to a lent block.
    #[cold]
    #[inline(never)]
    fn make_room(&mut self, len: usize) {
        let Mem::Lent(l) = self else { return };
        if len <= l.bytes.len() {
            return;
        }
        let want = len.max(2 * l.bytes.len());
        match l.owner.grow(want) {
            Some(mut bigger) if bigger.bytes.len() >= len => {
                bigger.bytes[..l.len].copy_from_slice(&l.bytes[..l.len]);
                bigger.len = l.len;
                *l = bigger;
            }
            _ => {
                let mut v = Vec::with_capacity(want);
                v.extend_from_slice(&l.bytes[..l.len]);
                *self = Mem::Heap(v);
            }
        }
    }
}

impl BlockMem for Mem {
    #[inline(always)]
    fn len(&self) -> usize {
        match self {
            Mem::Heap(v) => v.len(),
            Mem::Lent(l) => l.len,
        }
    }

    #[inline(always)]
    fn bytes(&self) -> &[u8] {
        match self {
            Mem::Heap(v) => v,
            Mem::Lent(l) => &l.bytes[..l.len],
        }
    }

    #[inline(always)]
    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Mem::Heap(v) => v,
            Mem::Lent(l) => &mut l.bytes[..l.len],
        }
    }

    fn clear(&mut self) {
        match self {
            Mem::Heap(v) => v.clear(),
            Mem::Lent(l) => l.len = 0,
        }
    }

    #[inline(always)]
    fn resize_zeroed(&mut self, new_len: usize) {
        if let Mem::Lent(l) = self {
            if new_len > l.bytes.len() {
                self.make_room(new_len);
            }
        }
        match self {
            Mem::Heap(v) => v.resize_zeroed(new_len),
            Mem::Lent(l) => {
                if new_len > l.len {
                    // Lent memory holds what was there before.
                    l.bytes[l.len..new_len].fill(0);
                }
                l.len = new_len;
            }
        }
    }

    #[inline(always)]
    fn put_at_end(&mut self, at: usize, bytes: &[u8]) {
        if let Mem::Heap(v) = self {
            v.put_at_end(at, bytes);
        } else {
            self.resize_zeroed(at + bytes.len());
            self.bytes_mut()[at..].copy_from_slice(bytes);
        }
    }

    #[inline(always)]
    fn alloc_short(&mut self, word: u128, len: usize) -> usize {
        match self {
            Mem::Heap(v) => v.alloc_short(word, len),
            Mem::Lent(_) => self.alloc_copy(&word.to_le_bytes()[..len.min(16)]),
        }
    }

    fn reserve_total(&mut self, len: usize) {
        if let Mem::Heap(v) = self {
            v.reserve_total(len);
        } else {
            self.make_room(len);
        }
    }

    fn base_addr(&self) -> usize {
        match self {
            Mem::Heap(v) => v.as_ptr() as usize,
            Mem::Lent(l) => l.addr(),
        }
    }
}

/// Where a thread's builders get lent memory (see [`with_source`]).
pub trait BlockSource: Send + Sync {
    /// Memory for one new block, or `None` (the block is private then).
    fn lend(&self) -> Option<Lent>;
}

thread_local! {
    static SOURCE: std::cell::RefCell<Option<std::sync::Arc<dyn BlockSource>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` with `source` lending the memory of every block a builder
/// starts on this thread meanwhile ([`Block::for_builder`]): how a split
/// application's handlers lay their responses out in the shared region
/// without changing a line. Nests; the previous source is back afterwards.
pub fn with_source<R>(source: std::sync::Arc<dyn BlockSource>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<std::sync::Arc<dyn BlockSource>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            SOURCE.with(|s| *s.borrow_mut() = prev);
        }
    }
    let _restore = Restore(SOURCE.with(|s| s.borrow_mut().replace(source)));
    f()
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

    /// Lends leaked heap memory (a test stand-in for a region chunk) and
    /// counts what it lent; refuses more than `max` bytes.
    struct Leaky {
        max: usize,
        lent: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Leaky {
        fn lent(max: usize, size: usize) -> (Lent, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
            let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let owner = Leaky { max, lent: count.clone() };
            (owner.grow(size).expect("within max"), count)
        }
    }

    impl LentOwner for Leaky {
        fn grow(&self, need: usize) -> Option<Lent> {
            (need <= self.max).then(|| {
                self.lent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let bytes = Box::leak(vec![0xAAu8; need].into_boxed_slice());
                Lent::new(bytes, Box::new(Leaky { max: self.max, lent: self.lent.clone() }))
            })
        }

        fn share(self: Box<Self>, bytes: &'static mut [u8], len: usize) -> bytes::Bytes {
            let bytes: &'static [u8] = bytes;
            bytes::Bytes::from_static(&bytes[..len])
        }
    }

    /// The same writes into a block in private memory and into one in lent
    /// memory (a chunk of `first` bytes that may grow up to `max`).
    fn both(first: usize, max: usize, write: impl Fn(&mut Block)) -> (Block, Block, usize) {
        let mut heap = Block::new();
        write(&mut heap);
        let (lent, count) = Leaky::lent(max, first);
        let mut b = Block::in_lent(lent);
        write(&mut b);
        (heap, b, count.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Whether two blocks of [`some_writes`] hold the same: the same bytes
    /// up to the 3000-byte copy, whose 4K-aliasing padding depends on
    /// where the buffers lie (at most 64 bytes, see `alloc_copy`), and the
    /// copy itself at the end.
    fn same_block(a: &Block, b: &Block) {
        let before = a.len().min(b.len()) - 3000 - 64;
        assert_eq!(a.as_bytes()[..before], b.as_bytes()[..before]);
        assert!(a.len().abs_diff(b.len()) <= 64, "{} vs {}", a.len(), b.len());
        for x in [a, b] {
            assert!(x.as_bytes().ends_with(&[7u8; 3000]), "the copy is last");
        }
    }

    fn some_writes(b: &mut Block) {
        let obj = b.mem.start(3, 24, 0);
        b.mem.put_u64(obj + 8, 0x1122_3344_5566_7788);
        b.mem.set_hasbit(obj, 5);
        for i in 0..40u32 {
            let at = b.mem.grow_array(obj + 16, 4, 1).unwrap_or(0);
            b.mem.put_u32(at, i);
            if i % 8 == 0 {
                b.mem.alloc_copy(&[i as u8; 9]);
            }
            if i % 8 == 3 {
                // Short strings of every length, at every misalignment.
                let input: Vec<u8> = (0..40u8).map(|x| x.wrapping_mul(37) | 1).collect();
                let len = (i as usize * 3) % 17;
                let word = short_word(&input, i as usize % 7, len).unwrap_or(0);
                let at = b.mem.alloc_short(word, len);
                assert_eq!(at % 8, 0);
                let start = i as usize % 7;
                assert_eq!(b.mem.bytes()[at..], input[start..start + len]);
            }
        }
        b.mem.alloc_copy(&[7u8; 3000]);
    }

    #[test]
    fn short_strings_are_words_with_the_bytes_past_them_zero() {
        let input = *b"0123456789abcdef!";
        assert_eq!(short_word(&input, 0, 0), Some(0));
        assert_eq!(short_word(&input, 1, 2), Some(u128::from(b'1') | u128::from(b'2') << 8));
        assert_eq!(short_word(&input, 1, 16), Some(u128::from_le_bytes(*b"123456789abcdef!")));
        assert_eq!(short_word(&input, 2, 3), None, "fewer than 16 bytes from its start");
        assert_eq!(short_word(&input, 0, 17), None, "longer than 16");
        assert!(ascii_word(u128::from_le_bytes(*b"123456789abcdef!")));
        assert!(!ascii_word(0xc3a9 << 8));
        // Appended at the next 8-aligned offset with zeros before it, as
        // `alloc_copy` appends.
        let (mut a, mut b) = (vec![9u8; 3], vec![9u8; 3]);
        let word = short_word(&input, 1, 5).unwrap_or(0);
        assert_eq!(a.alloc_short(word, 5), b.alloc_copy(b"12345"));
        assert_eq!(a, b);
        assert_eq!(a, [9, 9, 9, 0, 0, 0, 0, 0, b'1', b'2', b'3', b'4', b'5']);
    }

    #[test]
    fn lent_memory_holds_the_same_block_in_place() {
        let (heap, lent, grows) = both(64 << 10, 64 << 10, some_writes);
        assert!(lent.is_lent());
        assert_eq!(grows, 1, "no growth needed");
        same_block(&heap, &lent);
        let addr = lent.as_bytes().as_ptr();
        let shared = lent.into_shared();
        assert_eq!(shared.as_ptr(), addr, "shared in place, not copied");
    }

    #[test]
    fn lent_memory_grows_through_its_owner_then_moves_to_the_heap() {
        // Starts in 256 bytes, the owner lends up to 1 KiB more at a time:
        // the first growths go to the owner, the 3000-byte copy to the heap.
        let (heap, b, grows) = both(256, 1024, some_writes);
        assert!(grows > 1, "grew through the owner");
        assert!(!b.is_lent(), "moved to private memory past the owner's limit");
        same_block(&heap, &b);
        // Reused after a clear: the stale bytes of lent memory are zeroed.
        let (lent, _) = Leaky::lent(4096, 4096);
        let mut b = Block::in_lent(lent);
        some_writes(&mut b);
        b.mem.start(1, 64, 0);
        assert!(b.as_bytes()[HEADER_LEN..].iter().all(|&x| x == 0));
    }

    #[test]
    fn builders_take_memory_from_the_thread_source() {
        struct Src(std::sync::Arc<std::sync::atomic::AtomicUsize>);
        impl BlockSource for Src {
            fn lend(&self) -> Option<Lent> {
                Leaky { max: 1 << 20, lent: self.0.clone() }.grow(4096)
            }
        }
        let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        assert!(!Block::for_builder().is_lent());
        let b = with_source(std::sync::Arc::new(Src(n.clone())), Block::for_builder);
        assert!(b.is_lent());
        assert!(!Block::for_builder().is_lent(), "the source is gone again");
        assert_eq!(n.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[test]
    fn arrays_grow_in_place_or_move() {
        let mut b = Block::new();
        let obj = b.mem.start(0, 16, 0);
        let slot = obj;
        let vals = |b: &Block| -> Vec<u32> {
            let r = Ref::unpack(b.mem.u64_at(slot));
            (0..r.len as usize).map(|i| b.mem.u32_at(r.offset as usize + 4 * i)).collect()
        };
        // First element: a fresh array with room for MIN_CAPACITY.
        let at = b.mem.grow_array(slot, 4, 1).unwrap_or(0);
        b.mem.put_u32(at, 10);
        // Room left: the next ones go right after, even with something
        // allocated behind the array.
        b.mem.alloc_copy(b"xyz");
        for i in 1..MIN_CAPACITY {
            let next = b.mem.grow_array(slot, 4, 1).unwrap_or(0);
            assert_eq!(next, at + 4 * i as usize);
            b.mem.put_u32(next, 10 + i);
        }
        // Full and not last: the next growth moves it to the end, doubled.
        let end = b.len();
        let moved = b.mem.grow_array(slot, 4, 1).unwrap_or(0);
        b.mem.put_u32(moved, 14);
        let r = Ref::unpack(b.mem.u64_at(slot));
        assert!(r.offset as usize >= end);
        assert_eq!(vals(&b), [10, 11, 12, 13, 14]);
        // Now last in the block: grows in place once past capacity 8.
        for i in 5..9 {
            let at = b.mem.grow_array(slot, 4, 1).unwrap_or(0);
            b.mem.put_u32(at, 10 + i);
        }
        assert_eq!(Ref::unpack(b.mem.u64_at(slot)).offset, r.offset);
        assert_eq!(vals(&b), (10..19).collect::<Vec<u32>>());
    }
}
