//! The device region: engine-owned memory that compute units read and write.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A byte range in the [`DeviceRegion`]: what descriptors and notifications
/// carry instead of bytes.
///
/// A `DeviceRef` is only a name; it comes from the application, so the
/// engine checks it against the live allocations every time it is used.
/// A non-empty range is usable only if it lies inside one live allocation
/// (a sub-range of an allocation is fine; a range straddling two
/// allocations, or touching free space, is refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceRef {
    /// Offset of the first byte in the region.
    pub offset: u32,
    /// Length in bytes.
    pub len: u32,
}

impl DeviceRef {
    /// The empty range: what an allocation of zero bytes returns and what a
    /// kernel producing no bytes reports. Reading it yields no bytes;
    /// freeing it does nothing.
    pub const EMPTY: DeviceRef = DeviceRef { offset: 0, len: 0 };

    /// A range of `len` bytes at `offset`.
    pub const fn new(offset: u32, len: u32) -> Self {
        DeviceRef { offset, len }
    }

    /// Whether the range holds no bytes.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// One past the last byte, computed without overflow.
    pub const fn end(&self) -> u64 {
        self.offset as u64 + self.len as u64
    }
}

impl fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}, +{})", self.offset, self.len)
    }
}

/// Why a [`DeviceRegion`] operation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionError {
    /// No free range of `needed` bytes (the region is full or fragmented).
    OutOfSpace {
        /// Bytes asked for.
        needed: u32,
        /// Bytes free in total (possibly not contiguous).
        free: u32,
    },
    /// The range is not inside one live allocation (beyond the region,
    /// overflowing, straddling allocations, or in free space).
    OutOfRange(DeviceRef),
    /// `free` was given a range that is not exactly a live allocation.
    NotAllocated(DeviceRef),
    /// `write` was given a number of bytes different from the range length.
    LengthMismatch {
        /// The range length.
        range: u32,
        /// The number of bytes given.
        data: usize,
    },
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::OutOfSpace { needed, free } => {
                write!(f, "device region full: {needed} bytes needed, {free} bytes free")
            }
            RegionError::OutOfRange(r) => {
                write!(f, "device range {r} is not inside one live allocation")
            }
            RegionError::NotAllocated(r) => write!(f, "device range {r} is not an allocation"),
            RegionError::LengthMismatch { range, data } => {
                write!(f, "write of {data} bytes into a device range of {range} bytes")
            }
        }
    }
}

impl std::error::Error for RegionError {}

/// Engine-owned memory the application never maps (RPCAcc's on-board
/// memory). Device-placed fields land here, and compute units take their
/// input from it and write their output to it, so a chain of kernels never
/// crosses PCIe.
///
/// Allocation is first-fit over a free list kept sorted by offset, with
/// neighbours coalesced on free; the capacity is fixed at construction and
/// a failed allocation is an error. All methods take `&self` (the region
/// is shared by the host's DMA path and the units' workers) and copy bytes
/// in or out: nobody holds a borrow of device memory.
///
/// The host uses [`DeviceRegion::alloc_write`] / [`DeviceRegion::read`] to
/// model DMA to and from the device; they are not a mapping.
pub struct DeviceRegion {
    inner: Mutex<Inner>,
    capacity: u32,
}

struct Inner {
    mem: Vec<u8>,
    /// Free ranges: offset -> length, never adjacent (always coalesced).
    free: BTreeMap<u32, u32>,
    /// Live allocations: offset -> length.
    live: BTreeMap<u32, u32>,
    used: u32,
}

impl fmt::Debug for DeviceRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("DeviceRegion")
            .field("capacity", &self.capacity)
            .field("used", &inner.used)
            .field("allocations", &inner.live.len())
            .field("free_ranges", &inner.free.len())
            .finish()
    }
}

impl DeviceRegion {
    /// A region of `capacity` bytes, all free.
    pub fn new(capacity: u32) -> Self {
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        DeviceRegion {
            inner: Mutex::new(Inner {
                mem: vec![0; capacity as usize],
                free,
                live: BTreeMap::new(),
                used: 0,
            }),
            capacity,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics while holding this lock; recover rather than
        // propagate a poison that cannot have corrupted the maps.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Total bytes.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Bytes in live allocations.
    pub fn used(&self) -> u32 {
        self.lock().used
    }

    /// Number of live allocations.
    pub fn allocations(&self) -> usize {
        self.lock().live.len()
    }

    /// Allocates `len` bytes (zeroed). `alloc(0)` returns
    /// [`DeviceRef::EMPTY`] without allocating.
    pub fn alloc(&self, len: u32) -> Result<DeviceRef, RegionError> {
        let mut inner = self.lock();
        let r = inner.alloc(len, self.capacity)?;
        inner.fill_zero(r);
        Ok(r)
    }

    /// Allocates a range holding `data` (the host's DMA into the device).
    pub fn alloc_write(&self, data: &[u8]) -> Result<DeviceRef, RegionError> {
        let len = u32::try_from(data.len()).map_err(|_| RegionError::OutOfSpace {
            needed: u32::MAX,
            free: self.capacity - self.used(),
        })?;
        let mut inner = self.lock();
        let r = inner.alloc(len, self.capacity)?;
        inner.copy_in(r, data);
        Ok(r)
    }

    /// Frees an allocation. `r` must be exactly a live allocation as
    /// returned by an allocation (or [`DeviceRef::EMPTY`], a no-op).
    pub fn free(&self, r: DeviceRef) -> Result<(), RegionError> {
        if r.is_empty() {
            return Ok(());
        }
        let mut inner = self.lock();
        match inner.live.get(&r.offset) {
            Some(&len) if len == r.len => {}
            _ => return Err(RegionError::NotAllocated(r)),
        }
        inner.live.remove(&r.offset);
        inner.used -= r.len;
        inner.release(r.offset, r.len);
        Ok(())
    }

    /// Overwrites a range inside one live allocation with `data`
    /// (`data.len()` must equal `r.len`).
    pub fn write(&self, r: DeviceRef, data: &[u8]) -> Result<(), RegionError> {
        if data.len() != r.len as usize {
            return Err(RegionError::LengthMismatch { range: r.len, data: data.len() });
        }
        let mut inner = self.lock();
        inner.check(r, self.capacity)?;
        inner.copy_in(r, data);
        Ok(())
    }

    /// Copies a range inside one live allocation out of the region (the
    /// device's DMA to the host, or a unit fetching its input).
    pub fn read(&self, r: DeviceRef) -> Result<Vec<u8>, RegionError> {
        let inner = self.lock();
        inner.check(r, self.capacity)?;
        Ok(inner.slice(r).to_vec())
    }

    /// Gives back the tail of a live allocation: `r` keeps its first
    /// `len` bytes (at most its length) and the rest returns to the free
    /// list. What a decoder uses after placing a message into an
    /// allocation sized for the worst case. Shrinking to 0 frees it.
    pub fn shrink(&self, r: DeviceRef, len: u32) -> Result<DeviceRef, RegionError> {
        if len == 0 {
            self.free(r)?;
            return Ok(DeviceRef::EMPTY);
        }
        let mut inner = self.lock();
        match inner.live.get(&r.offset) {
            Some(&l) if l == r.len && len <= l => {}
            _ => return Err(RegionError::NotAllocated(r)),
        }
        if len < r.len {
            inner.live.insert(r.offset, len);
            inner.used -= r.len - len;
            inner.release(r.offset + len, r.len - len);
        }
        Ok(DeviceRef::new(r.offset, len))
    }

    /// Runs `f` over the whole region's bytes, under the region's lock:
    /// what the engine's encoder reads device-placed fields from (a
    /// [`protoplane_wire::Source::with_device`]), without a copy. Keep `f`
    /// short: the units wait for it to store their outputs.
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(&self.lock().mem)
    }

    /// Whether `r` is usable: empty and within the region, or inside one
    /// live allocation.
    pub fn contains(&self, r: DeviceRef) -> bool {
        self.check(r).is_ok()
    }

    /// [`DeviceRegion::contains`], with the refusal as an error.
    pub fn check(&self, r: DeviceRef) -> Result<(), RegionError> {
        self.lock().check(r, self.capacity)
    }
}

impl Inner {
    fn check(&self, r: DeviceRef, capacity: u32) -> Result<(), RegionError> {
        if r.is_empty() {
            return if r.offset <= capacity { Ok(()) } else { Err(RegionError::OutOfRange(r)) };
        }
        match self.live.range(..=r.offset).next_back() {
            Some((&off, &len)) if r.end() <= u64::from(off) + u64::from(len) => Ok(()),
            _ => Err(RegionError::OutOfRange(r)),
        }
    }

    fn alloc(&mut self, len: u32, capacity: u32) -> Result<DeviceRef, RegionError> {
        if len == 0 {
            return Ok(DeviceRef::EMPTY);
        }
        let found =
            self.free.iter().find(|(_, &flen)| flen >= len).map(|(&off, &flen)| (off, flen));
        let Some((off, flen)) = found else {
            return Err(RegionError::OutOfSpace { needed: len, free: capacity - self.used });
        };
        self.free.remove(&off);
        if flen > len {
            self.free.insert(off + len, flen - len);
        }
        self.live.insert(off, len);
        self.used += len;
        Ok(DeviceRef::new(off, len))
    }

    /// Returns `[off, off + len)` to the free list, merging neighbours.
    fn release(&mut self, mut off: u32, mut len: u32) {
        if let Some((&poff, &plen)) = self.free.range(..off).next_back() {
            if u64::from(poff) + u64::from(plen) == u64::from(off) {
                self.free.remove(&poff);
                off = poff;
                len += plen;
            }
        }
        let end = off + len;
        if let Some(nlen) = self.free.remove(&end) {
            len += nlen;
        }
        self.free.insert(off, len);
    }

    fn range(r: DeviceRef) -> std::ops::Range<usize> {
        r.offset as usize..r.offset as usize + r.len as usize
    }

    fn slice(&self, r: DeviceRef) -> &[u8] {
        self.mem.get(Self::range(r)).unwrap_or(&[])
    }

    fn copy_in(&mut self, r: DeviceRef, data: &[u8]) {
        if let Some(dst) = self.mem.get_mut(Self::range(r)) {
            dst.copy_from_slice(data);
        }
    }

    fn fill_zero(&mut self, r: DeviceRef) {
        if let Some(dst) = self.mem.get_mut(Self::range(r)) {
            dst.fill(0);
        }
    }
}
