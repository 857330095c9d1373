//! The system calls under the shepherding layer, each wrapped once: an
//! anonymous shared file (`memfd_create`), its mapping, an `eventfd`
//! doorbell, passing descriptors over a Unix socket (`SCM_RIGHTS`), and
//! pinning a thread to cores.
//!
//! A [`Mapping`] is memory another process writes concurrently. It hands
//! out atomics (the ring protocol) and copies in and out of byte ranges;
//! the two exceptions are [`Mapping::bytes`] (read in place) and
//! [`Mapping::lend`] (this side's own chunk, written in place by a block),
//! whose contracts are spelled out there.
//!
//! A mapping may be made of several files laid end to end in one address
//! range, the last one possibly read-only: an application maps the
//! engine's half of the region that way, from a file the engine sealed
//! against writes ([`seal_writes`]), so it cannot write what the engine
//! decodes into even if it tries.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
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

/// A shared mapping of whole files laid end to end, read and written by
/// this process and by the other side of an attachment. Bytes from
/// `read_only` on are mapped read-only here.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    read_only: usize,
}

// SAFETY: the mapping is plain memory shared with other processes anyway;
// this type only gives out atomics and bounds-checked copies, which are
// fine from any thread.
unsafe impl Send for Mapping {}
// SAFETY: as above: every access through `&Mapping` is an atomic operation
// or a copy whose racing with other writers is the documented contract.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps all of `fd` (read/write, shared).
    pub fn map(fd: &OwnedFd) -> io::Result<Mapping> {
        Mapping::map_parts(&[(fd, true)])
    }

    /// Maps whole files end to end in one address range, each read/write
    /// or read-only; only the last may be read-only.
    pub fn map_parts(parts: &[(&OwnedFd, bool)]) -> io::Result<Mapping> {
        let page = 4096;
        let mut lens = Vec::with_capacity(parts.len());
        for (i, (fd, writable)) in parts.iter().enumerate() {
            let len = file_len(fd)?;
            // Every part but the last ends on a page: the next one is mapped
            // right after it.
            let last = i + 1 == parts.len();
            if len == 0 || (len % page != 0 && !last) || (!writable && !last) {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "unusable shared file"));
            }
            lens.push(len);
        }
        let len: usize = lens.iter().sum();
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "empty shared file"));
        }
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
        let mut map = Mapping { ptr, len, read_only: len };
        let mut at = 0;
        for ((fd, writable), part) in parts.iter().zip(lens) {
            let prot = libc::PROT_READ | if *writable { libc::PROT_WRITE } else { 0 };
            // SAFETY: replaces `part` bytes of our own reservation (in
            // bounds: the parts sum to its length), which nothing else uses
            // yet, with a shared mapping of a file we hold open.
            let q = unsafe {
                libc::mmap(
                    map.ptr.as_ptr().add(at).cast(),
                    part,
                    prot,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd.as_raw_fd(),
                    0,
                )
            };
            if q == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            if !writable {
                map.read_only = at;
            }
            at += part;
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

    fn in_bounds(&self, off: usize, len: usize) -> bool {
        off.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// Whether `off..off + len` is mapped writable here.
    pub fn writable(&self, off: usize, len: usize) -> bool {
        off.checked_add(len).is_some_and(|end| end <= self.read_only)
    }

    /// The 64-bit atomic at `off` (8-aligned, in the writable part), or
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

    /// The 32-bit atomic at `off` (4-aligned, in bounds), or `None`.
    pub fn atomic_u32(&self, off: usize) -> Option<&AtomicU32> {
        if off % 4 != 0 || !self.writable(off, 4) {
            return None;
        }
        // SAFETY: as for `atomic_u64`, with 4-byte alignment.
        Some(unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() })
    }

    /// Copies `src` into the mapping at `off`. `false` (and nothing
    /// written) when the range is out of bounds.
    pub fn write(&self, off: usize, src: &[u8]) -> bool {
        if !self.writable(off, src.len()) {
            return false;
        }
        // SAFETY: the destination range is inside the mapping (checked
        // above) and cannot overlap `src`, which is private memory or a
        // range the caller owns. A concurrent write by the other process
        // into the same range can only garble bytes that process itself
        // will read: ranges are handed over by ownership through the rings.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), src.len())
        };
        true
    }

    /// Copies `dst.len()` bytes at `off` out of the mapping. `false` when
    /// out of bounds.
    pub fn read(&self, off: usize, dst: &mut [u8]) -> bool {
        if !self.in_bounds(off, dst.len()) {
            return false;
        }
        // SAFETY: the source range is inside the mapping; `dst` is private
        // memory of the caller and cannot overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        };
        true
    }

    /// This side's own range `off..off + len` (a chunk of its half) as
    /// memory a block is laid out in, written in place; `None` outside the
    /// writable part.
    ///
    /// # Safety
    ///
    /// Until the caller drops the slice: nothing else in this process
    /// reads or writes the range except through it (the chunk came from
    /// this side's own free list and is not handed over), and the mapping
    /// stays mapped (the caller keeps an `Arc` of it beside the slice).
    /// The other process does not write it either: the engine's half is
    /// sealed read-only for the application (see [`seal_writes`]), and the
    /// application's half is written by the engine only if the engine is
    /// broken, which an application trusts it not to be.
    pub(crate) unsafe fn lend(&self, off: usize, len: usize) -> Option<&'static mut [u8]> {
        if !self.writable(off, len) {
            return None;
        }
        // SAFETY: in bounds and writable; exclusive and alive for as long
        // as the caller uses it, by the caller's contract above.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) })
    }

    /// The bytes at `off..off + len`, read in place (the zero-copy path).
    ///
    /// Contract: the range is one the caller owns by the ring protocol (a
    /// chunk handed over with a descriptor and not handed back). A
    /// well-behaved peer does not write it while it is owned here; a
    /// hostile one may, and then the bytes read are garbage. Every reader
    /// of region bytes (views, the decoder, the encoder) bounds-checks each
    /// offset and length it reads from them at the point of use, so garbage
    /// yields an error, never an access outside the slice.
    pub fn bytes(&self, off: usize, len: usize) -> Option<&[u8]> {
        if !self.in_bounds(off, len) {
            return None;
        }
        // SAFETY: in bounds; the slice lives no longer than `&self`. See
        // the contract above for concurrent writers.
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

/// An `eventfd` doorbell: the parked side waits on it, the other rings it.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A new non-blocking doorbell.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain system call, no pointers.
        let fd = check(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: a descriptor we just created and own.
        Ok(EventFd { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Wraps a received doorbell descriptor (set non-blocking here: the
    /// sender's flags are not trusted).
    pub fn from_fd(fd: OwnedFd) -> io::Result<EventFd> {
        // SAFETY: fcntl on a descriptor we own.
        let flags = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
        // SAFETY: as above.
        check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
        Ok(EventFd { fd })
    }

    /// Rings the doorbell.
    pub fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64. A full counter (EAGAIN)
        // means the doorbell is already ringing, which is all we want.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Clears the doorbell; `true` if it had rung.
    pub fn clear(&self) -> bool {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        n == 8
    }

    /// The descriptor (to pass to the other process, or to poll).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 4;

/// Sends `data` with `fds` attached (`SCM_RIGHTS`).
pub fn send_with_fds(sock: &UnixStream, data: &[u8], fds: &[&OwnedFd]) -> io::Result<()> {
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
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
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
pub fn recv_with_fds(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
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
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
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

    #[test]
    fn two_mappings_of_one_file_share_bytes() {
        let fd = memfd("t", 8192).expect("memfd");
        let a = Mapping::map(&fd).expect("map a");
        let b = Mapping::map(&fd).expect("map b");
        assert_ne!(a.base(), b.base());
        assert!(a.write(100, b"hello"));
        assert_eq!(b.bytes(100, 5), Some(&b"hello"[..]));
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
    fn a_sealed_part_is_read_only_for_whoever_maps_it_later() {
        let shared = memfd("shared", 8192).expect("memfd");
        let sealed = memfd("sealed", 4096).expect("memfd");
        // The owner maps both writable, then seals the second.
        let owner = Mapping::map_parts(&[(&shared, true), (&sealed, true)]).expect("owner");
        seal_writes(&sealed).expect("seal");
        assert!(owner.write(8192 + 10, b"mine"), "mapped before the seal: still writable");
        // The other side cannot map it writable any more, only read it.
        assert!(Mapping::map_parts(&[(&shared, true), (&sealed, true)]).is_err());
        let other = Mapping::map_parts(&[(&shared, true), (&sealed, false)]).expect("other");
        assert_eq!(other.len(), 12288);
        assert_eq!(other.bytes(8192 + 10, 4), Some(&b"mine"[..]));
        assert!(!other.write(8192 + 10, b"evil"), "the sealed part refuses writes");
        assert!(other.atomic_u64(8192).is_none());
        assert!(other.write(4096, b"ok") && owner.bytes(4096, 2) == Some(&b"ok"[..]));
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
    fn descriptors_cross_a_socket() {
        let (x, y) = UnixStream::pair().expect("pair");
        let fd = memfd("t", 4096).expect("memfd");
        let ev = EventFd::new().expect("eventfd");
        send_with_fds(&x, b"hi", &[&fd, ev.fd()]).expect("send");
        let mut buf = [0u8; 16];
        let (n, fds) = recv_with_fds(&y, &mut buf).expect("recv");
        assert_eq!(&buf[..n], b"hi");
        assert_eq!(fds.len(), 2);
        let m = Mapping::map(&fds[0]).expect("map");
        assert_eq!(m.len(), 4096);
        let mut it = fds.into_iter();
        let _ = it.next();
        let ev2 = EventFd::from_fd(it.next().expect("second")).expect("wrap");
        assert!(!ev.clear());
        ev2.ring();
        assert!(ev.clear());
        assert!(!ev.clear());
    }
}
