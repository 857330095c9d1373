//! The system calls under the shepherding layer, each wrapped once: an
//! anonymous shared file (`memfd_create`), its mapping, a socket-pair
//! doorbell, passing descriptors over a Unix socket (`SCM_RIGHTS`), and
//! pinning a thread to cores.
//!
//! A [`Mapping`] is memory another process writes concurrently. It is
//! made of parts laid end to end, each with an [`Access`] saying who
//! writes it. It hands out atomics (the ring protocol) and volatile copies
//! in and out of byte ranges anywhere; slices only over parts no untrusted
//! process writes ([`Mapping::bytes`], [`Mapping::lend`]), whose
//! contracts are spelled out there.
//!
//! The engine maps a region as control page and rings (shared), the
//! application's half (read-only: the engine only ever copies it out) and
//! its own half (a file it sealed against writes before passing it, so the
//! application maps it read-only and cannot write what the engine decodes
//! into even if it tries). It also seals the shared file's size
//! ([`seal_size`]): a truncated file would raise SIGBUS in the engine.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A new anonymous shared file of `len` bytes (zero-filled; pages are
/// allocated when first touched). It accepts seals ([`seal_writes`]).
pub fn memfd(name: &str, len: usize) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: `cname` is a valid NUL-terminated string for the duration of
    // the call; the flags are plain constants.
    let fd = check(unsafe { libc::memfd_create(cname.as_ptr(), flags) })?;
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody
    // else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = libc::off_t::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: ftruncate on a descriptor we own; no memory is involved.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), len) })?;
    Ok(fd)
}

/// The size of the file behind `fd`.
pub fn file_len(fd: &OwnedFd) -> io::Result<usize> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` points to writable memory of the right type; fstat
    // fills it in on success.
    check(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so the struct is initialized (it was zeroed
    // before, too).
    let st = unsafe { st.assume_init() };
    usize::try_from(st.st_size).map_err(|_| io::ErrorKind::InvalidData.into())
}

/// Seals a memfd against writes by anyone who maps it from now on (and
/// against resizing, and against more seals): mappings made before stay
/// writable, every later `mmap` with `PROT_WRITE` or `write(2)` fails. The
/// engine maps its half first, then seals it, then passes it on.
pub fn seal_writes(fd: &OwnedFd) -> io::Result<()> {
    let seals =
        libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a descriptor we own; no memory is involved.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(())
}

/// Seals a memfd's size: nobody, this process included, can shrink or
/// grow it from now on, nor add or remove seals. The engine seals the file
/// it shares read/write with an application this way before passing it:
/// pages of a shrunk file vanish under every mapping of it, and the next
/// access to them raises SIGBUS in whichever process touches them, so an
/// application able to truncate the file could kill its engine.
pub fn seal_size(fd: &OwnedFd) -> io::Result<()> {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a descriptor we own; no memory is involved.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(())
}

/// Who writes a part of a [`Mapping`], which decides how this process may
/// touch it.
///
/// The rule (vm-memory's `VolatileSlice`, the kernel's `READ_ONCE`): Rust
/// may assume that the bytes behind a `&[u8]` do not change while the
/// reference lives, fold two reads into one, or read twice what the code
/// reads once; a process writing them meanwhile turns that into a check
/// that passes on one read and a use of another. So memory a process that
/// is not trusted may write is never lent out as a slice: it is read with
/// volatile copies into private memory, and every check runs on the copy,
/// and its shared words are atomics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read and written by both sides: the control page and the rings.
    /// Atomics and volatile copies only.
    Shared,
    /// Written by this side only: the other side maps it read-only (the
    /// engine's half, sealed against writes; the application's half, which
    /// the engine maps read-only). Slices are sound.
    Own,
    /// Read-only here, written by the other side, which this side trusts to
    /// keep the ownership protocol (never writing a chunk it handed over):
    /// the engine's half as an application maps it. Slices are sound under
    /// that trust.
    Trusted,
    /// Read-only here, written by a side this one does not trust: the
    /// application's half as the engine maps it. Volatile copies only.
    Untrusted,
}

impl Access {
    fn writable(self) -> bool {
        matches!(self, Access::Shared | Access::Own)
    }

    /// Whether this process may hold a slice over it.
    fn sliceable(self) -> bool {
        matches!(self, Access::Own | Access::Trusted)
    }
}

/// One part of a [`Mapping`]: `len` bytes of a file from `offset` (a page
/// multiple), or the rest of the file.
#[derive(Clone, Copy, Debug)]
pub struct Part<'a> {
    /// The file.
    pub fd: &'a OwnedFd,
    /// Where in the file the part starts (a page multiple).
    pub offset: usize,
    /// Bytes (`None`: to the end of the file).
    pub len: Option<usize>,
    /// Who writes it.
    pub access: Access,
}

impl<'a> Part<'a> {
    /// All of `fd`.
    pub fn whole(fd: &'a OwnedFd, access: Access) -> Part<'a> {
        Part { fd, offset: 0, len: None, access }
    }
}

/// Most parts of one mapping.
const MAX_PARTS: usize = 4;

/// A shared mapping of files laid end to end, read and written by this
/// process and by the other side of an attachment, each part with its own
/// [`Access`].
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// (end, access) of each part, in order; the first starts at 0.
    parts: [(usize, Access); MAX_PARTS],
    nparts: usize,
}

// SAFETY: the mapping is plain memory shared with other processes anyway;
// this type only gives out atomics, bounds-checked copies, and slices over
// parts no untrusted process writes, which are fine from any thread.
unsafe impl Send for Mapping {}
// SAFETY: as above: every access through `&Mapping` is an atomic
// operation, a copy, or a read of memory nothing writes concurrently.
unsafe impl Sync for Mapping {}

/// Copies `dst.len()` bytes from `src` with volatile reads: each byte is
/// read exactly once, never folded with or split from another read, so the
/// copy is what was there at one moment per word, and the caller checks
/// the copy. Aligned words are read whole.
///
/// # Safety
///
/// `src..src + dst.len()` is mapped and readable for the whole call.
unsafe fn volatile_copy(src: *const u8, dst: &mut [u8]) {
    let n = dst.len();
    let mut i = 0;
    while i < n && (src as usize + i) % 8 != 0 {
        // SAFETY: in bounds by the caller's contract.
        dst[i] = unsafe { std::ptr::read_volatile(src.add(i)) };
        i += 1;
    }
    while i + 8 <= n {
        // SAFETY: 8-aligned (the loop above aligned it) and in bounds.
        let w = unsafe { std::ptr::read_volatile(src.add(i).cast::<u64>()) };
        dst[i..i + 8].copy_from_slice(&w.to_ne_bytes());
        i += 8;
    }
    while i < n {
        // SAFETY: in bounds by the caller's contract.
        dst[i] = unsafe { std::ptr::read_volatile(src.add(i)) };
        i += 1;
    }
}

/// Copies `src` to `dst` with volatile writes (memory another process
/// reads and writes too).
///
/// # Safety
///
/// `dst..dst + src.len()` is mapped and writable for the whole call.
unsafe fn volatile_store(dst: *mut u8, src: &[u8]) {
    for (i, &b) in src.iter().enumerate() {
        // SAFETY: in bounds by the caller's contract.
        unsafe { std::ptr::write_volatile(dst.add(i), b) };
    }
}

impl Mapping {
    /// Maps all of `fd`, read/write, both sides writing it.
    pub fn map(fd: &OwnedFd) -> io::Result<Mapping> {
        Mapping::map_parts(&[Part::whole(fd, Access::Shared)])
    }

    /// Maps parts of files end to end in one address range, each with its
    /// access.
    pub fn map_parts(parts: &[Part<'_>]) -> io::Result<Mapping> {
        let page = 4096;
        let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
        if parts.is_empty() || parts.len() > MAX_PARTS {
            return Err(bad("1 to 4 parts"));
        }
        let mut lens = Vec::with_capacity(parts.len());
        for (i, p) in parts.iter().enumerate() {
            let file = file_len(p.fd)?;
            if p.offset % page != 0 || p.offset >= file {
                return Err(bad("a part starts on a page inside its file"));
            }
            let len = p.len.unwrap_or(file - p.offset);
            // Every part but the last ends on a page: the next one is mapped
            // right after it.
            let last = i + 1 == parts.len();
            if len == 0 || p.offset + len > file || (len % page != 0 && !last) {
                return Err(bad("unusable shared file"));
            }
            lens.push(len);
        }
        let len: usize = lens.iter().sum();
        // Reserve the whole range first, so the parts land next to each
        // other.
        // SAFETY: a fresh anonymous reservation chosen by the kernel (no
        // fixed address: nothing existing is replaced).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(io::ErrorKind::InvalidData)?;
        // From here on, dropping `map` releases the reservation.
        let mut map =
            Mapping { ptr, len, parts: [(len, Access::Untrusted); MAX_PARTS], nparts: parts.len() };
        let mut at = 0;
        for (i, (p, part)) in parts.iter().zip(lens).enumerate() {
            let prot = libc::PROT_READ | if p.access.writable() { libc::PROT_WRITE } else { 0 };
            let offset = libc::off_t::try_from(p.offset).map_err(|_| bad("offset"))?;
            // SAFETY: replaces `part` bytes of our own reservation (in
            // bounds: the parts sum to its length), which nothing else uses
            // yet, with a shared mapping of a file we hold open.
            let q = unsafe {
                libc::mmap(
                    map.ptr.as_ptr().add(at).cast(),
                    part,
                    prot,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    p.fd.as_raw_fd(),
                    offset,
                )
            };
            if q == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            at += part;
            map.parts[i] = (at, p.access);
        }
        Ok(map)
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (an empty file is refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the mapping starts in this process (differs between the two
    /// processes: everything in the region is an offset).
    pub fn base(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Whether every part that `off..off + len` touches satisfies `ok`
    /// (and the range is in bounds).
    fn all(&self, off: usize, len: usize, ok: impl Fn(Access) -> bool) -> bool {
        let Some(end) = off.checked_add(len).filter(|&e| e <= self.len) else { return false };
        // The rings' words, on every push and pop: all in the first part.
        let (first_end, first) = self.parts[0];
        if end <= first_end && off < first_end {
            return ok(first);
        }
        let mut start = 0;
        for &(part_end, access) in &self.parts[..self.nparts] {
            if off < part_end && end > start && !ok(access) {
                return false;
            }
            if len == 0 && off >= start && off < part_end && !ok(access) {
                return false;
            }
            start = part_end;
        }
        true
    }

    /// Whether `off..off + len` is mapped writable here.
    pub fn writable(&self, off: usize, len: usize) -> bool {
        self.all(off, len, Access::writable)
    }

    /// The 64-bit atomic at `off` (8-aligned, in a writable part), or
    /// `None`.
    pub fn atomic_u64(&self, off: usize) -> Option<&AtomicU64> {
        if off % 8 != 0 || !self.writable(off, 8) {
            return None;
        }
        // SAFETY: in bounds and 8-aligned (the mapping is page-aligned);
        // AtomicU64 has the size and alignment of u64, and atomics are the
        // sound way to share a word with another process. The reference
        // lives no longer than `&self`, i.e. than the mapping.
        Some(unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU64>() })
    }

    /// The 32-bit atomic at `off` (4-aligned, in a writable part), or
    /// `None`.
    pub fn atomic_u32(&self, off: usize) -> Option<&AtomicU32> {
        if off % 4 != 0 || !self.writable(off, 4) {
            return None;
        }
        // SAFETY: as for `atomic_u64`, with 4-byte alignment.
        Some(unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() })
    }

    /// Copies `src` into the mapping at `off`. `false` (and nothing
    /// written) when the range is not writable here.
    pub fn write(&self, off: usize, src: &[u8]) -> bool {
        if !self.writable(off, src.len()) {
            return false;
        }
        let dst = self.ptr.as_ptr().wrapping_add(off);
        if self.all(off, src.len(), |a| a == Access::Own) {
            // SAFETY: the destination is inside a part only this process
            // writes (checked above) and cannot overlap `src`, which is
            // private memory or a range the caller owns.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        } else {
            // SAFETY: in bounds and writable (checked above); the other
            // side may write the same bytes, hence volatile stores.
            unsafe { volatile_store(dst, src) };
        }
        true
    }

    /// Copies `dst.len()` bytes at `off` out of the mapping (volatile
    /// reads: any part, whoever writes it). `false` when out of bounds.
    pub fn read(&self, off: usize, dst: &mut [u8]) -> bool {
        if !self.all(off, dst.len(), |_| true) {
            return false;
        }
        // SAFETY: the source range is inside the mapping (checked above);
        // `dst` is private memory of the caller.
        unsafe { volatile_copy(self.ptr.as_ptr().add(off), dst) };
        true
    }

    /// Appends the `len` bytes at `off` to `out` (a volatile copy into
    /// private memory: how the engine reads what an application wrote).
    /// `false` (and nothing appended) when out of bounds.
    pub fn append_to(&self, off: usize, len: usize, out: &mut Vec<u8>) -> bool {
        if !self.all(off, len, |_| true) {
            return false;
        }
        let at = out.len();
        out.resize(at + len, 0);
        // SAFETY: the source range is inside the mapping (checked above);
        // the destination is the private bytes just added to `out`.
        unsafe { volatile_copy(self.ptr.as_ptr().add(off), &mut out[at..]) };
        true
    }

    /// This side's own range `off..off + len` (a chunk of its half) as
    /// memory a block is laid out in, written in place; `None` unless the
    /// range is in a part of [`Access::Own`].
    ///
    /// # Safety
    ///
    /// Until the caller drops the slice: nothing else in this process
    /// reads or writes the range except through it (the chunk came from
    /// this side's own free list and is not handed over), and the mapping
    /// stays mapped (the caller keeps an `Arc` of it beside the slice).
    /// The other process does not write it: it maps this side's half
    /// read-only (the engine's half is sealed against writes; the engine
    /// maps the application's half read-only, which an application trusts
    /// it to keep doing).
    pub(crate) unsafe fn lend(&self, off: usize, len: usize) -> Option<&'static mut [u8]> {
        if !self.all(off, len, |a| a == Access::Own) {
            return None;
        }
        // SAFETY: in bounds and this side's own; exclusive and alive for
        // as long as the caller uses it, by the caller's contract above.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) })
    }

    /// The bytes at `off..off + len`, read in place (the zero-copy path);
    /// `None` unless every part of the range may be held as a slice
    /// ([`Access::Own`], [`Access::Trusted`]): memory an untrusted process
    /// writes is only copied out ([`Mapping::append_to`]).
    ///
    /// Contract: the range is one the caller owns by the ring protocol (a
    /// chunk handed over with a descriptor and not handed back, or this
    /// side's own). Nobody writes it while it is owned here: this side
    /// does not, and the other side either cannot (its mapping is
    /// read-only) or is trusted not to.
    pub fn bytes(&self, off: usize, len: usize) -> Option<&[u8]> {
        if !self.all(off, len, Access::sliceable) {
            return None;
        }
        // SAFETY: in bounds; the slice lives no longer than `&self`; nothing
        // writes the range meanwhile (contract above).
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped. Every reference handed
        // out borrows `self`, so none outlives this.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One end of a doorbell pair: a Unix stream socket pair shared by an
/// engine and one application, the engine holding one end and the
/// application the other. Each side rings the other by sending a byte on
/// its own end and waits for the other side's ring by waiting for its own
/// end to become readable; one pair carries both directions.
///
/// Why a socket pair and not an `eventfd` per direction: the two ends of a
/// socket pair are two open file descriptions, so file status flags set on
/// one (`O_NONBLOCK` cleared with `fcntl`) do not reach the other. An
/// `eventfd` passed to another process is the *same* open file description
/// on both sides: an application that cleared `O_NONBLOCK` on it left the
/// engine blocked in `read(2)` / `write(2)` for good. Here every operation
/// also passes `MSG_DONTWAIT`, so not even this side's own flags can make
/// it block, and `MSG_NOSIGNAL`, so a peer that went away is an error, not
/// a SIGPIPE.
///
/// A full socket buffer means the doorbell is already ringing, which is
/// all a ring wants. A peer that closed or shut down its end makes this
/// end readable for good: [`Bell::clear`] reports it as
/// [`Cleared::Closed`], and the waiting side treats the peer as gone.
#[derive(Debug)]
pub struct Bell {
    fd: OwnedFd,
}

/// What [`Bell::clear`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cleared {
    /// Nothing had rung.
    Quiet,
    /// It had rung (and is quiet now, unless the peer keeps ringing).
    Rung,
    /// The peer closed or shut down its end: it will never ring again.
    Closed,
}

/// Bytes [`Bell::clear`] reads at most per call: a peer that rings
/// without pause costs the clearing side a bounded amount of work; what
/// is left keeps the bell readable, which only wakes the waiter once more.
const CLEAR_MAX: usize = 4096;

impl Bell {
    /// A new pair of connected ends (non-blocking, close-on-exec).
    pub fn pair() -> io::Result<(Bell, Bell)> {
        let mut fds = [0 as RawFd; 2];
        let ty = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
        // SAFETY: `fds` is a live array of two descriptors for the kernel
        // to fill.
        check(unsafe { libc::socketpair(libc::AF_UNIX, ty, 0, fds.as_mut_ptr()) })?;
        // SAFETY: both descriptors were just created and are owned by
        // nobody else.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok((Bell { fd: a }, Bell { fd: b }))
    }

    /// Wraps a received end, after checking it is a Unix stream socket
    /// (set non-blocking here too, for the reactor that waits on it).
    pub fn from_fd(fd: OwnedFd) -> io::Result<Bell> {
        let mut ty: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `ty` and `len` are live and sized for SO_TYPE's value.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_TYPE,
                (&mut ty as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if r < 0 || ty != libc::SOCK_STREAM {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a doorbell is a stream socket",
            ));
        }
        set_nonblocking(&fd, true)?;
        Ok(Bell { fd })
    }

    /// Rings the other end. `false`: the other end is gone.
    pub fn ring(&self) -> bool {
        let one = [1u8];
        // SAFETY: sends one byte from a live buffer.
        let n = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                one.as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            return true;
        }
        let e = io::Error::last_os_error();
        // A full buffer: already ringing.
        !matches!(e.raw_os_error(), Some(libc::EPIPE) | Some(libc::ECONNRESET))
    }

    /// Takes the rings waiting on this end.
    pub fn clear(&self) -> Cleared {
        let mut buf = [0u8; 256];
        let mut rung = false;
        for _ in 0..CLEAR_MAX / buf.len() {
            // SAFETY: receives into a live buffer of the stated size.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            match n {
                0 => return Cleared::Closed,
                n if n > 0 => {
                    rung = true;
                    if (n as usize) < buf.len() {
                        break;
                    }
                }
                _ => match io::Error::last_os_error().raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EINTR) => break,
                    _ => return Cleared::Closed,
                },
            }
        }
        if rung {
            Cleared::Rung
        } else {
            Cleared::Quiet
        }
    }

    /// The descriptor (to pass to the other process, or to poll).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }
}

impl AsRawFd for Bell {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Sets or clears `O_NONBLOCK` on `fd`'s open file description.
pub fn set_nonblocking(fd: &OwnedFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; no memory is involved.
    let flags = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    let flags = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags) })?;
    Ok(())
}

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 8;

/// Sends `data` with `fds` attached (`SCM_RIGHTS`).
pub fn send_with_fds(sock: &impl AsFd, data: &[u8], fds: &[&OwnedFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS || data.is_empty() {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let payload = std::mem::size_of_val(raw.as_slice());
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(payload as u32) } as usize;
    let mut control = vec![0u8; space.max(1)];
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() };
    // SAFETY: msghdr is plain data; zeroed is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !raw.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer is CMSG_SPACE(payload) bytes, room for
        // exactly one header and `payload` bytes of descriptors, so
        // CMSG_FIRSTHDR is non-null and CMSG_DATA has `payload` bytes.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(payload as u32) as _;
            std::ptr::copy_nonoverlapping(raw.as_ptr().cast::<u8>(), libc::CMSG_DATA(c), payload);
        }
    }
    // SAFETY: `msg` points at live iovec/control buffers for the call.
    let n = unsafe { libc::sendmsg(sock.as_fd().as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != data.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short send on the attach socket"));
    }
    Ok(())
}

/// Receives one message of at most `buf.len()` bytes and the descriptors
/// attached to it (at most [`MAX_FDS`]; extra ones are closed). Returns the
/// byte count (0 at end of stream).
pub fn recv_with_fds(sock: &impl AsFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    // SAFETY: pure size computation.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) };
    let mut control = vec![0u8; space as usize];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: plain data, zeroed is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at live buffers of the stated sizes.
    let n = unsafe { libc::recvmsg(sock.as_fd().as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg_control` with well-formed headers
    // within `msg_controllen`; the CMSG_* macros walk exactly those.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let bytes = (*c).cmsg_len as usize - (data as usize - c as usize);
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    // Each received descriptor is ours now; owning it
                    // closes the extra ones on drop.
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "too many descriptors"));
    }
    Ok((n as usize, fds))
}

/// Pins the calling thread to `cores` (no-op for an empty set).
pub fn pin_current_thread(cores: &[usize]) -> io::Result<()> {
    if cores.is_empty() {
        return Ok(());
    }
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cores {
        if c >= libc::CPU_SETSIZE as usize {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: `c` is below CPU_SETSIZE, checked above.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the stated size; 0 = this thread.
    check(unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn two_mappings_of_one_file_share_bytes() {
        let fd = memfd("t", 8192).expect("memfd");
        let a = Mapping::map(&fd).expect("map a");
        let b = Mapping::map(&fd).expect("map b");
        assert_ne!(a.base(), b.base());
        assert!(a.write(100, b"hello"));
        let mut got = [0u8; 5];
        assert!(b.read(100, &mut got));
        assert_eq!(&got, b"hello");
        // Both sides write it: no slice over it, only copies.
        assert_eq!(b.bytes(100, 5), None);
        let mut v = b"x".to_vec();
        assert!(b.append_to(100, 5, &mut v));
        assert_eq!(v, b"xhello");
        assert!(!b.append_to(8190, 5, &mut v));
        a.atomic_u64(64).expect("aligned").store(7, std::sync::atomic::Ordering::Release);
        assert_eq!(
            b.atomic_u64(64).expect("aligned").load(std::sync::atomic::Ordering::Acquire),
            7
        );
        assert!(a.atomic_u64(3).is_none());
        assert!(a.atomic_u64(8192).is_none());
        assert!(!a.write(8190, b"abc"));
        assert!(a.bytes(usize::MAX, 2).is_none());
    }

    #[test]
    fn each_part_is_touched_as_its_access_allows() {
        // The engine's view of a region: control and rings shared, the
        // application's half read-only and untrusted, its own half.
        let shared = memfd("shared", 3 * 4096).expect("memfd");
        let own = memfd("own", 4096).expect("memfd");
        let engine = Mapping::map_parts(&[
            Part { fd: &shared, offset: 0, len: Some(4096), access: Access::Shared },
            Part { fd: &shared, offset: 4096, len: None, access: Access::Untrusted },
            Part::whole(&own, Access::Own),
        ])
        .expect("engine");
        // The application's view of the same files.
        let app = Mapping::map_parts(&[
            Part { fd: &shared, offset: 0, len: Some(4096), access: Access::Shared },
            Part { fd: &shared, offset: 4096, len: None, access: Access::Own },
            Part::whole(&own, Access::Trusted),
        ])
        .expect("app");
        assert_eq!(engine.len(), 4 * 4096);
        // The application writes its half; the engine only copies it out.
        assert!(app.write(4096 + 8, b"reply"));
        assert_eq!(app.bytes(4096 + 8, 5), Some(&b"reply"[..]));
        assert_eq!(engine.bytes(4096 + 8, 5), None, "no slice over untrusted memory");
        let mut v = Vec::new();
        assert!(engine.append_to(4096 + 8, 5, &mut v));
        assert_eq!(v, b"reply");
        assert!(!engine.write(4096 + 8, b"x"), "mapped read-only in the engine");
        assert!(engine.atomic_u64(4096).is_none());
        // SAFETY: asks for a lend the access refuses; nothing is lent.
        assert!(unsafe { engine.lend(4096, 8) }.is_none());
        // The engine writes its half; the application reads it in place.
        assert!(engine.write(3 * 4096 + 1, b"request"));
        assert_eq!(app.bytes(3 * 4096 + 1, 7), Some(&b"request"[..]));
        assert!(!app.write(3 * 4096, b"x"));
        // A range across parts takes the strictest of them.
        assert_eq!(engine.bytes(3 * 4096 - 2, 4), None);
        assert!(engine.atomic_u64(64).is_some() && app.atomic_u64(64).is_some());
        assert_eq!(engine.bytes(0, 8), None);
    }

    #[test]
    fn a_sealed_part_is_read_only_for_whoever_maps_it_later() {
        let shared = memfd("shared", 8192).expect("memfd");
        let sealed = memfd("sealed", 4096).expect("memfd");
        // The owner maps both writable, then seals the second.
        let parts = |access| [Part::whole(&shared, Access::Shared), Part::whole(&sealed, access)];
        let owner = Mapping::map_parts(&parts(Access::Own)).expect("owner");
        seal_writes(&sealed).expect("seal");
        assert!(owner.write(8192 + 10, b"mine"), "mapped before the seal: still writable");
        // The other side cannot map it writable any more, only read it.
        assert!(Mapping::map_parts(&parts(Access::Own)).is_err());
        assert!(Mapping::map_parts(&parts(Access::Shared)).is_err());
        let other = Mapping::map_parts(&parts(Access::Trusted)).expect("other");
        assert_eq!(other.len(), 12288);
        assert_eq!(other.bytes(8192 + 10, 4), Some(&b"mine"[..]));
        assert!(!other.write(8192 + 10, b"evil"), "the sealed part refuses writes");
        assert!(other.atomic_u64(8192).is_none());
        let mut ok = [0u8; 2];
        assert!(other.write(4096, b"ok") && owner.read(4096, &mut ok) && &ok == b"ok");
        // Nor make its read-only mapping writable, write through the file,
        // or unseal it.
        // SAFETY: asks for more rights on a page of our own mapping; it
        // must be refused (and would only change protection if not).
        let r = unsafe {
            libc::mprotect(
                other.base().add(8192).cast_mut().cast(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        assert_eq!(r, -1, "mprotect to writable is refused");
        // SAFETY: a plain write(2) from a live buffer.
        let n = unsafe { libc::pwrite(sealed.as_raw_fd(), b"x".as_ptr().cast(), 1, 0) };
        assert_eq!(n, -1);
        assert!(seal_writes(&sealed).is_err(), "sealed for good");
    }

    #[test]
    fn a_size_sealed_file_cannot_be_truncated_through_any_descriptor() {
        let fd = memfd("shared", 8192).expect("memfd");
        let map = Mapping::map(&fd).expect("map");
        seal_size(&fd).expect("seal");
        // Another descriptor of the same file, as a peer holds it.
        let peer = std::fs::File::from(fd.try_clone().expect("dup"));
        assert!(peer.set_len(0).is_err(), "shrinking is refused");
        assert!(peer.set_len(1 << 20).is_err(), "growing is refused");
        assert!(seal_writes(&fd).is_err(), "no more seals");
        assert_eq!(file_len(&fd).expect("len"), 8192);
        // Still an ordinary read/write file otherwise.
        assert!(map.write(8000, b"alive"));
    }

    #[test]
    fn descriptors_cross_a_socket() {
        let (x, y) = UnixStream::pair().expect("pair");
        let fd = memfd("t", 4096).expect("memfd");
        let (ev, far) = Bell::pair().expect("bell");
        send_with_fds(&x, b"hi", &[&fd, far.fd()]).expect("send");
        drop(far);
        let mut buf = [0u8; 16];
        let (n, fds) = recv_with_fds(&y, &mut buf).expect("recv");
        assert_eq!(&buf[..n], b"hi");
        assert_eq!(fds.len(), 2);
        let m = Mapping::map(&fds[0]).expect("map");
        assert_eq!(m.len(), 4096);
        let mut it = fds.into_iter();
        let _ = it.next();
        let ev2 = Bell::from_fd(it.next().expect("second")).expect("wrap");
        assert_eq!(ev.clear(), Cleared::Quiet);
        assert!(ev2.ring());
        assert!(ev2.ring());
        assert_eq!(ev.clear(), Cleared::Rung);
        assert_eq!(ev.clear(), Cleared::Quiet);
        assert!(ev.ring());
        assert_eq!(ev2.clear(), Cleared::Rung);
        // A memfd is no doorbell.
        assert!(Bell::from_fd(memfd("x", 4096).expect("memfd")).is_err());
    }

    #[test]
    fn a_peer_cannot_make_a_bell_block_or_signal() {
        let (mine, theirs) = Bell::pair().expect("pair");
        // Blocking mode on both ends (the peer's doing, or even our own):
        // every operation still returns at once.
        set_nonblocking(theirs.fd(), false).expect("fcntl");
        set_nonblocking(mine.fd(), false).expect("fcntl");
        let t = std::time::Instant::now();
        for _ in 0..100_000 {
            assert!(mine.ring(), "a full buffer is a ringing bell, not an error");
        }
        for _ in 0..100 {
            let _ = mine.clear();
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "never blocked");
        // The peer goes away: rings fail quietly (no SIGPIPE) and the
        // bell reports it.
        drop(theirs);
        assert!(!mine.ring());
        let mut last = Cleared::Rung;
        for _ in 0..100 {
            last = mine.clear();
            if last == Cleared::Closed {
                break;
            }
        }
        assert_eq!(last, Cleared::Closed);
    }
}
