//! The layout of an attachment's region and the chunks carved from it.
//!
//! ```text
//! offset 0          4096                       +slots*64                +slots*64 (page-aligned)
//! +-----------------+--------------------------+------------------------+-----------------+------------------+
//! | control page    | request ring             | response ring          | app half        | engine half      |
//! | parked flags,   | engine -> app            | app -> engine          | response chunks | request chunks   |
//! | published heads | (slots of 64 B)          | (slots of 64 B)        | (app allocs)    | (engine allocs)  |
//! +-----------------+--------------------------+------------------------+-----------------+------------------+
//! |<------------------------------ shared file: both map it read/write ------------------>|<- engine file -->|
//! ```
//!
//! The engine's half is a file of its own, which the engine seals against
//! writes before passing it: the application maps it read-only, so it can
//! never write into the chunks the engine decodes requests into.
//!
//! Each half is carved into size classes (a fixed number of chunks of each
//! size, smallest first). A chunk is named by its offset from the start of
//! the region, which means the same thing in both processes.
//!
//! Ownership, not shared bookkeeping, keeps the two sides apart: each side
//! allocates only from its own half, with a free list in its *private*
//! memory ([`Chunks`]); a chunk crosses to the other side with a descriptor
//! and comes back with a release. What the other side sends is checked
//! against the layout ([`Custody`]): a chunk that is not a chunk, that is
//! already held, or that was never lent is refused. Nothing the other
//! process writes into the region can make this side hand out one chunk
//! twice.
//!
//! The engine decides the layout and sends it in the attach handshake; the
//! application checks it against the mapping's size before using it.

use std::os::fd::OwnedFd;

use crate::sys::{Access, Part};

/// Bytes of the control page.
pub const CONTROL_LEN: usize = 4096;
/// Bytes of one ring slot.
pub const SLOT_LEN: usize = 64;
/// Smallest chunk size and the alignment of every chunk.
pub const CHUNK_ALIGN: u32 = 4096;
/// Most size classes per half.
pub const MAX_CLASSES: usize = 8;
/// Largest region: offsets in descriptors are 32-bit.
pub const MAX_REGION: u64 = u32::MAX as u64 + 1 - CHUNK_ALIGN as u64;

/// Control page: the engine's parked flag (the app rings the engine's
/// doorbell only when it is set). Each word has its own cache line.
pub const ENGINE_PARKED: usize = 64;
/// Control page: the application's parked flag.
pub const APP_PARKED: usize = 128;
/// Control page: consumer position of the request ring, published by the
/// application (statistics only; never trusted).
pub const REQUEST_HEAD: usize = 192;
/// Control page: consumer position of the response ring, published by the
/// engine.
pub const RESPONSE_HEAD: usize = 256;

/// Why a layout or a chunk reference was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutError {
    /// The layout description is inconsistent (names the rule).
    Invalid(&'static str),
    /// An offset that is not the start of a chunk of that half.
    NotAChunk(u32),
    /// A chunk handed over twice without being released in between.
    AlreadyHeld(u32),
    /// A release of a chunk that was not lent out.
    NotLent(u32),
}

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayoutError::Invalid(why) => write!(f, "invalid region layout: {why}"),
            LayoutError::NotAChunk(o) => write!(f, "offset {o:#x} is not a chunk"),
            LayoutError::AlreadyHeld(o) => write!(f, "chunk {o:#x} handed over twice"),
            LayoutError::NotLent(o) => write!(f, "chunk {o:#x} released but not lent"),
        }
    }
}

impl std::error::Error for LayoutError {}

/// One size class: `count` chunks of `size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Class {
    /// Bytes per chunk (a multiple of [`CHUNK_ALIGN`]).
    pub size: u32,
    /// Chunks of this size.
    pub count: u32,
}

/// The shape of a region: ring sizes and the size classes of each half
/// (both halves are carved alike).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Slots per ring (a power of two).
    pub ring_slots: u32,
    /// Size classes, smallest first.
    pub classes: Vec<Class>,
}

impl Layout {
    /// A layout whose halves hold about `half_bytes` each, with chunks of
    /// 4 KiB, 64 KiB, 1 MiB and 8 MiB, and chunks of `max_chunk` (rounded
    /// up to a page) for the largest messages.
    pub fn sized(ring_slots: u32, half_bytes: u64, max_chunk: u32) -> Layout {
        let big = max_chunk.div_ceil(CHUNK_ALIGN).saturating_mul(CHUNK_ALIGN).max(8 << 20);
        // Shares of the half per class: most calls are small, but a few
        // large ones must always fit.
        let plan: [(u32, u64); 4] = [(4 << 10, 8), (64 << 10, 16), (1 << 20, 24), (8 << 20, 24)];
        let mut classes = Vec::new();
        for (size, pct) in plan {
            if size >= big {
                break;
            }
            let count = (half_bytes * pct / 100 / size as u64).clamp(2, 1 << 16) as u32;
            classes.push(Class { size, count });
        }
        let used: u64 = classes.iter().map(|c| c.size as u64 * c.count as u64).sum();
        let count = (half_bytes.saturating_sub(used) / big as u64).clamp(2, 64) as u32;
        classes.push(Class { size: big, count });
        Layout { ring_slots, classes }
    }

    /// Checks the rules every layout obeys (the application runs this on
    /// what the engine sent, with the sizes of the two files it received:
    /// shared, engine's half).
    pub fn validate(&self, file_lens: Option<(usize, usize)>) -> Result<(), LayoutError> {
        let bad = |why| Err(LayoutError::Invalid(why));
        if !self.ring_slots.is_power_of_two() || !(8..=1 << 20).contains(&self.ring_slots) {
            return bad("ring slots must be a power of two in 8..=2^20");
        }
        if self.classes.is_empty() || self.classes.len() > MAX_CLASSES {
            return bad("1 to 8 size classes");
        }
        let mut last = 0;
        for c in &self.classes {
            if c.size % CHUNK_ALIGN != 0 || c.size <= last || c.count == 0 || c.count > 1 << 20 {
                return bad("classes must grow, be page multiples and hold 1..=2^20 chunks");
            }
            last = c.size;
        }
        if self.total() > MAX_REGION {
            return bad("region larger than 4 GiB");
        }
        if let Some((shared, engine)) = file_lens {
            if shared as u64 != self.shared_len() || engine as u64 != self.half_len() {
                return bad("shared file sizes differ from the layout");
            }
        }
        Ok(())
    }

    /// Offset of the request ring's slots.
    pub fn request_ring(&self) -> usize {
        CONTROL_LEN
    }

    /// Offset of the response ring's slots.
    pub fn response_ring(&self) -> usize {
        CONTROL_LEN + self.ring_slots as usize * SLOT_LEN
    }

    /// Bytes of one half.
    pub fn half_len(&self) -> u64 {
        self.classes.iter().map(|c| c.size as u64 * c.count as u64).sum()
    }

    /// Offset of the application's half (response chunks).
    pub fn app_half(&self) -> u64 {
        let end = (CONTROL_LEN + 2 * self.ring_slots as usize * SLOT_LEN) as u64;
        end.div_ceil(CHUNK_ALIGN as u64) * CHUNK_ALIGN as u64
    }

    /// Offset of the engine's half (request chunks): where the shared file
    /// ends and the engine's file starts.
    pub fn engine_half(&self) -> u64 {
        self.app_half() + self.half_len()
    }

    /// Bytes of the shared file (control page, rings, application's half).
    pub fn shared_len(&self) -> u64 {
        self.engine_half()
    }

    /// Bytes of the whole region (the shared file and the engine's).
    pub fn total(&self) -> u64 {
        self.engine_half() + self.half_len()
    }

    /// The largest chunk.
    pub fn max_chunk(&self) -> u32 {
        self.classes.last().map_or(0, |c| c.size)
    }

    /// How the engine maps a region of this layout: control page and rings
    /// shared, the application's half read-only (copied out, never read in
    /// place: the application writes it), its own half from its own file.
    pub fn engine_parts<'a>(&self, shared: &'a OwnedFd, engine_half: &'a OwnedFd) -> [Part<'a>; 3] {
        let app = self.app_half() as usize;
        [
            Part { fd: shared, offset: 0, len: Some(app), access: Access::Shared },
            Part { fd: shared, offset: app, len: None, access: Access::Untrusted },
            Part::whole(engine_half, Access::Own),
        ]
    }

    /// How an application maps a region of this layout: control page and
    /// rings shared, its own half (the engine maps it read-only), the
    /// engine's half read-only (sealed; written by the engine, which the
    /// application trusts).
    pub fn app_parts<'a>(&self, shared: &'a OwnedFd, engine_half: &'a OwnedFd) -> [Part<'a>; 3] {
        let app = self.app_half() as usize;
        [
            Part { fd: shared, offset: 0, len: Some(app), access: Access::Shared },
            Part { fd: shared, offset: app, len: None, access: Access::Own },
            Part::whole(engine_half, Access::Trusted),
        ]
    }

    /// The chunks of the engine's half.
    pub fn engine_chunks(&self) -> Half {
        Half::new(self.engine_half(), &self.classes)
    }

    /// The chunks of the application's half.
    pub fn app_chunks(&self) -> Half {
        Half::new(self.app_half(), &self.classes)
    }

    /// Serialized form (sent in the attach handshake).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.ring_slots.to_le_bytes());
        out.extend_from_slice(&(self.classes.len() as u32).to_le_bytes());
        for c in &self.classes {
            out.extend_from_slice(&c.size.to_le_bytes());
            out.extend_from_slice(&c.count.to_le_bytes());
        }
    }

    /// Parses [`Layout::encode`]'s output from the front of `b`; returns the
    /// layout and the bytes after it. Validates the rules (not the size).
    pub fn decode(b: &[u8]) -> Result<(Layout, &[u8]), LayoutError> {
        let word = |b: &[u8], at: usize| -> Result<u32, LayoutError> {
            b.get(at..at + 4)
                .and_then(|s| s.try_into().ok())
                .map(u32::from_le_bytes)
                .ok_or(LayoutError::Invalid("truncated layout"))
        };
        let ring_slots = word(b, 0)?;
        let n = word(b, 4)? as usize;
        if n > MAX_CLASSES {
            return Err(LayoutError::Invalid("1 to 8 size classes"));
        }
        let mut classes = Vec::with_capacity(n);
        for i in 0..n {
            classes.push(Class { size: word(b, 8 + 8 * i)?, count: word(b, 12 + 8 * i)? });
        }
        let layout = Layout { ring_slots, classes };
        layout.validate(None)?;
        Ok((layout, &b[8 + 8 * n..]))
    }
}

/// A chunk: where it starts and how long it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Offset from the start of the region.
    pub offset: u32,
    /// Bytes.
    pub len: u32,
    /// Position among all chunks of its half (the bookkeeping index).
    pub index: u32,
}

/// The chunks of one half: a pure function from offsets to chunks.
#[derive(Clone, Debug)]
pub struct Half {
    /// (first offset, size, count, first index) per class.
    classes: Vec<(u64, u32, u32, u32)>,
    chunks: u32,
}

impl Half {
    fn new(start: u64, classes: &[Class]) -> Half {
        let mut at = start;
        let mut index = 0;
        let mut out = Vec::with_capacity(classes.len());
        for c in classes {
            out.push((at, c.size, c.count, index));
            at += c.size as u64 * c.count as u64;
            index += c.count;
        }
        Half { classes: out, chunks: index }
    }

    /// Chunks in the half.
    pub fn chunks(&self) -> u32 {
        self.chunks
    }

    /// The chunk starting exactly at `offset`, if there is one.
    pub fn chunk_at(&self, offset: u32) -> Option<Chunk> {
        let off = offset as u64;
        for &(start, size, count, first) in &self.classes {
            let end = start + size as u64 * count as u64;
            if off >= start && off < end {
                let rel = off - start;
                if rel % size as u64 != 0 {
                    return None;
                }
                let i = (rel / size as u64) as u32;
                return Some(Chunk { offset, len: size, index: first + i });
            }
        }
        None
    }

    /// The chunk `offset` lies in, if any.
    pub fn chunk_containing(&self, offset: u32) -> Option<Chunk> {
        let off = offset as u64;
        for &(start, size, count, first) in &self.classes {
            let end = start + size as u64 * count as u64;
            if off >= start && off < end {
                let i = ((off - start) / size as u64) as u32;
                return Some(self.nth_of(start, size, first, i));
            }
        }
        None
    }

    /// The offset of the chunk with bookkeeping index `index`, if any.
    pub fn nth_offset(&self, index: u32) -> Option<u32> {
        let &(start, size, _, first) = self
            .classes
            .iter()
            .rev()
            .find(|&&(_, _, count, first)| first <= index && index - first < count)?;
        Some((start + size as u64 * (index - first) as u64) as u32)
    }

    fn nth_of(&self, start: u64, size: u32, first: u32, i: u32) -> Chunk {
        Chunk { offset: (start + size as u64 * i as u64) as u32, len: size, index: first + i }
    }

    fn nth(&self, class: usize, i: u32) -> Chunk {
        let (start, size, _, first) = self.classes[class];
        Chunk { offset: (start + size as u64 * i as u64) as u32, len: size, index: first + i }
    }
}

/// This side's allocator over its own half: free lists in private memory.
#[derive(Debug)]
pub struct Chunks {
    half: Half,
    /// Free chunk numbers per class (stacks: the most recently freed chunk
    /// is the warmest in cache).
    free: Vec<Vec<u32>>,
    lent: Vec<bool>,
    in_use: u32,
}

impl Chunks {
    /// Every chunk of `half` free.
    pub fn new(half: Half) -> Chunks {
        let free =
            half.classes.iter().map(|&(_, _, count, _)| (0..count).rev().collect()).collect();
        let lent = vec![false; half.chunks as usize];
        Chunks { half, free, lent, in_use: 0 }
    }

    /// A chunk of at least `need` bytes: the smallest class that fits and
    /// has one free. `None` when none is free (or `need` exceeds the
    /// largest class).
    pub fn alloc(&mut self, need: usize) -> Option<Chunk> {
        for (class, &(_, size, _, _)) in self.half.classes.iter().enumerate() {
            if (size as usize) < need {
                continue;
            }
            if let Some(i) = self.free[class].pop() {
                let c = self.half.nth(class, i);
                self.lent[c.index as usize] = true;
                self.in_use += 1;
                return Some(c);
            }
        }
        None
    }

    /// Whether a chunk of `need` bytes could ever be allocated.
    pub fn fits(&self, need: usize) -> bool {
        self.half.classes.last().is_some_and(|&(_, size, _, _)| need <= size as usize)
    }

    /// Takes back a chunk the other side released.
    pub fn free(&mut self, offset: u32) -> Result<Chunk, LayoutError> {
        let c = self.half.chunk_at(offset).ok_or(LayoutError::NotAChunk(offset))?;
        if !std::mem::replace(&mut self.lent[c.index as usize], false) {
            return Err(LayoutError::NotLent(offset));
        }
        let class = self.half.classes.iter().rposition(|&(_, _, _, first)| first <= c.index);
        if let Some(class) = class {
            let first = self.half.classes[class].3;
            self.free[class].push(c.index - first);
        }
        self.in_use -= 1;
        Ok(c)
    }

    /// Chunks currently lent out.
    pub fn in_use(&self) -> u32 {
        self.in_use
    }
}

/// Chunks of the *other* side's half that this side holds. A chunk is
/// taken either once ([`Custody::take`]: a chunk of the other side's own,
/// for one message) or any number of times ([`Custody::take_shared`]: a
/// receive buffer several requests' wire bytes arrived in), and each take
/// is given back on its own; a chunk taken one way cannot be taken the
/// other way until every take is back.
#[derive(Debug)]
pub struct Custody {
    half: Half,
    /// Takes per chunk: 0 free, [`ONCE`] taken once, else shared takes.
    held: Vec<u32>,
    count: u32,
}

/// `Custody::held` of a chunk taken once.
const ONCE: u32 = u32::MAX;

impl Custody {
    /// Holding nothing of `half`.
    pub fn new(half: Half) -> Custody {
        let held = vec![0; half.chunks as usize];
        Custody { half, held, count: 0 }
    }

    /// Takes the chunk at `offset` (handed over by a descriptor) for one
    /// message: refused while it is held at all.
    pub fn take(&mut self, offset: u32) -> Result<Chunk, LayoutError> {
        let c = self.half.chunk_at(offset).ok_or(LayoutError::NotAChunk(offset))?;
        let h = &mut self.held[c.index as usize];
        if *h != 0 {
            return Err(LayoutError::AlreadyHeld(offset));
        }
        *h = ONCE;
        self.count += 1;
        Ok(c)
    }

    /// Takes the chunk at `offset` once more as a shared receive buffer:
    /// refused while it is taken once.
    pub fn take_shared(&mut self, offset: u32) -> Result<Chunk, LayoutError> {
        let c = self.half.chunk_at(offset).ok_or(LayoutError::NotAChunk(offset))?;
        let h = &mut self.held[c.index as usize];
        if *h >= ONCE - 1 {
            return Err(LayoutError::AlreadyHeld(offset));
        }
        *h += 1;
        self.count += 1;
        Ok(c)
    }

    /// Gives one take of the chunk back (it was released to the other
    /// side).
    pub fn give_back(&mut self, c: Chunk) {
        if let Some(h) = self.held.get_mut(c.index as usize) {
            match *h {
                0 => return,
                ONCE => *h = 0,
                _ => *h -= 1,
            }
            self.count -= 1;
        }
    }

    /// Takes held (a shared chunk counts once per take).
    pub fn held(&self) -> u32 {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Layout {
        Layout {
            ring_slots: 16,
            classes: vec![Class { size: 4096, count: 3 }, Class { size: 16384, count: 2 }],
        }
    }

    #[test]
    fn layout_places_rings_and_halves() {
        let l = small();
        l.validate(None).expect("valid");
        assert_eq!(l.request_ring(), 4096);
        assert_eq!(l.response_ring(), 4096 + 16 * 64);
        assert_eq!(l.app_half(), 8192);
        assert_eq!(l.half_len(), 3 * 4096 + 2 * 16384);
        assert_eq!(l.engine_half(), 8192 + l.half_len());
        assert_eq!(l.shared_len(), l.engine_half());
        assert_eq!(l.total(), l.engine_half() + l.half_len());
        let mut bytes = Vec::new();
        l.encode(&mut bytes);
        bytes.push(0xAA);
        let (back, rest) = Layout::decode(&bytes).expect("decode");
        assert_eq!(back, l);
        assert_eq!(rest, [0xAA]);
        let (shared, half) = (l.shared_len() as usize, l.half_len() as usize);
        assert!(back.validate(Some((shared, half))).is_ok());
        assert!(back.validate(Some((shared - 1, half))).is_err());
        assert!(back.validate(Some((shared, half + 4096))).is_err());
    }

    #[test]
    fn bad_layouts_are_refused() {
        let mut l = small();
        l.ring_slots = 12;
        assert!(l.validate(None).is_err());
        let mut l = small();
        l.classes[1].size = 4096;
        assert!(l.validate(None).is_err());
        let mut l = small();
        l.classes[0].size = 100;
        assert!(l.validate(None).is_err());
        let l = Layout { ring_slots: 16, classes: vec![Class { size: 1 << 30, count: 8 }] };
        assert!(l.validate(None).is_err());
        for cut in 0..8 + 16 {
            let mut b = Vec::new();
            small().encode(&mut b);
            assert!(Layout::decode(&b[..cut.min(b.len() - 1)]).is_err());
        }
        let sized = Layout::sized(1024, 64 << 20, 20 << 20);
        sized.validate(None).expect("sized layout is valid");
        assert!(sized.max_chunk() >= 20 << 20);
    }

    #[test]
    fn chunks_are_lent_once_and_come_back() {
        let l = small();
        let mut a = Chunks::new(l.engine_chunks());
        let c1 = a.alloc(100).expect("small");
        let c2 = a.alloc(5000).expect("middle");
        assert_eq!(c1.len, 4096);
        assert_eq!(c2.len, 16384);
        assert!(a.alloc(20000).is_none());
        assert!(!a.fits(20000));
        // Small ones spill into the larger class when their own is empty.
        let mut got = vec![c1];
        while let Some(c) = a.alloc(10) {
            got.push(c);
        }
        assert_eq!(got.len(), 4);
        assert_eq!(a.in_use(), 5);
        assert_eq!(a.free(c2.offset), Ok(c2));
        assert_eq!(a.free(c2.offset), Err(LayoutError::NotLent(c2.offset)));
        assert_eq!(a.free(c2.offset + 8), Err(LayoutError::NotAChunk(c2.offset + 8)));
        assert_eq!(a.free(0), Err(LayoutError::NotAChunk(0)));
        assert_eq!(a.alloc(5000), Some(c2));
    }

    #[test]
    fn custody_refuses_replays_and_strangers() {
        let l = small();
        let mut c = Custody::new(l.app_chunks());
        let first = l.app_half() as u32;
        let got = c.take(first).expect("a chunk");
        assert_eq!(c.take(first), Err(LayoutError::AlreadyHeld(first)));
        assert!(c.take(l.engine_half() as u32).is_err());
        assert!(c.take(first + 1).is_err());
        assert!(c.take(u32::MAX).is_err());
        c.give_back(got);
        assert_eq!(c.held(), 0);
        assert!(c.take(first).is_ok());
    }

    #[test]
    fn custody_counts_shared_takes() {
        let l = small();
        let mut c = Custody::new(l.engine_chunks());
        let first = l.engine_half() as u32;
        let got = c.take_shared(first).expect("shared");
        assert!(c.take_shared(first).is_ok());
        assert_eq!(c.held(), 2);
        // Not for one message while shared, nor shared while taken once.
        assert_eq!(c.take(first), Err(LayoutError::AlreadyHeld(first)));
        c.give_back(got);
        c.give_back(got);
        assert_eq!(c.held(), 0);
        c.give_back(got);
        assert_eq!(c.held(), 0, "a take given back twice counts once");
        let once = c.take(first).expect("once");
        assert_eq!(c.take_shared(first), Err(LayoutError::AlreadyHeld(first)));
        c.give_back(once);
        assert!(c.take_shared(first).is_ok());
    }
}
