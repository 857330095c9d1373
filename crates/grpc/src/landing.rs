//! Memory a service lends a transport to receive its requests into.
//!
//! A split engine wants each request's wire bytes in the region it shares
//! with the application, where the handler reads them in place. A
//! transport that reads a socket into its own buffer makes that one copy
//! unavoidable; one that reads straight into memory the service lends
//! ([`Service::landing`](crate::Service::landing)) does not. The lean
//! transport does this: its reader asks the service its last call went to
//! for a landing, reads frames into it, and cuts each frame's payload off
//! as [`Bytes`] that keep the landing's memory alive ([`Keeper`]) for as
//! long as any piece of it is used — by this process or, through the
//! service, by another.
//!
//! A frame that arrives across the end of a landing is moved (copied) to
//! the start of the next one, and the service is told how many bytes that
//! was ([`Keeper::moved`]), so copies stay counted.

use std::sync::Arc;

use bytes::Bytes;

/// What keeps a landing's memory alive, and hears about bytes moved out
/// of it.
pub trait Keeper: Send + Sync + 'static {
    /// `bytes` of a partly received frame were copied from this landing
    /// into the next one (or into private memory).
    fn moved(&self, bytes: usize);

    /// Whether the memory is still worth receiving into (a split engine's
    /// application may have gone: requests landing in its region would be
    /// copied elsewhere). The reader moves on at the next frame boundary.
    fn alive(&self) -> bool {
        true
    }
}

/// Lent memory to receive into.
pub struct Landing {
    mem: &'static mut [u8],
    keep: Arc<dyn Keeper>,
}

impl std::fmt::Debug for Landing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Landing").field("len", &self.mem.len()).finish_non_exhaustive()
    }
}

impl Landing {
    /// `mem`, valid and written by nobody else for as long as `keep` lives.
    pub fn new(mem: &'static mut [u8], keep: Arc<dyn Keeper>) -> Landing {
        Landing { mem, keep }
    }

    /// Bytes of memory.
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// Whether it has no memory at all.
    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }
}

/// A landing being filled: `filled` bytes received at its front, not yet
/// cut off; what was cut off before is gone from `mem` (it lives on in the
/// bytes handed out).
pub struct Filling {
    mem: &'static mut [u8],
    filled: usize,
    keep: Arc<dyn Keeper>,
}

/// A piece cut off a landing: read-only, and keeps the landing alive.
struct Piece {
    bytes: &'static [u8],
    _keep: Arc<dyn Keeper>,
}

impl AsRef<[u8]> for Piece {
    fn as_ref(&self) -> &[u8] {
        self.bytes
    }
}

impl std::fmt::Debug for Filling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filling")
            .field("len", &self.mem.len())
            .field("filled", &self.filled)
            .finish_non_exhaustive()
    }
}

impl Filling {
    pub fn new(l: Landing) -> Filling {
        Filling { mem: l.mem, filled: 0, keep: l.keep }
    }

    /// Received bytes not cut off yet.
    pub fn filled(&self) -> &[u8] {
        &self.mem[..self.filled]
    }

    /// Room left to receive into.
    pub fn room(&self) -> usize {
        self.mem.len() - self.filled
    }

    /// Whether the landing's owner still wants requests received into it.
    pub fn alive(&self) -> bool {
        self.keep.alive()
    }

    /// Bytes from the front of the uncut part to the landing's end.
    pub fn capacity(&self) -> usize {
        self.mem.len()
    }

    /// Where the next bytes go.
    pub fn spare(&mut self) -> &mut [u8] {
        &mut self.mem[self.filled..]
    }

    /// `n` bytes were received into [`Filling::spare`].
    pub fn advance(&mut self, n: usize) {
        self.filled = (self.filled + n).min(self.mem.len());
    }

    /// Cuts the first `n` received bytes off as bytes of their own, and
    /// returns those from `skip` on.
    pub fn cut(&mut self, n: usize, skip: usize) -> Bytes {
        let n = n.min(self.filled);
        let (front, rest) = std::mem::take(&mut self.mem).split_at_mut(n);
        self.mem = rest;
        self.filled -= n;
        let front: &'static [u8] = front;
        Bytes::from_owner(Piece { bytes: &front[skip.min(n)..], _keep: self.keep.clone() })
    }

    /// Moves the received bytes to the front of `next` and continues
    /// there; `counted` of them (the payload, not a frame header) are
    /// reported moved out of this landing.
    pub fn move_to(self, next: Landing, counted: usize) -> Result<Filling, Filling> {
        if next.len() < self.filled {
            return Err(self);
        }
        let mut f = Filling::new(next);
        f.mem[..self.filled].copy_from_slice(&self.mem[..self.filled]);
        f.filled = self.filled;
        self.moved_out(counted);
        Ok(f)
    }

    /// Tells the landing `counted` of its received bytes were copied
    /// elsewhere.
    pub fn moved_out(&self, counted: usize) {
        if counted > 0 {
            self.keep.moved(counted.min(self.filled));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Count {
        moved: AtomicUsize,
        alive: Arc<AtomicUsize>,
    }

    impl Keeper for Count {
        fn moved(&self, bytes: usize) {
            self.moved.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    impl Drop for Count {
        fn drop(&mut self) {
            self.alive.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn landing(len: usize, alive: &Arc<AtomicUsize>) -> (Landing, Arc<Count>) {
        alive.fetch_add(1, Ordering::Relaxed);
        let mem: &'static mut [u8] = Box::leak(vec![0u8; len].into_boxed_slice());
        let keep = Arc::new(Count { moved: AtomicUsize::new(0), alive: alive.clone() });
        (Landing::new(mem, keep.clone()), keep)
    }

    #[test]
    fn pieces_cut_off_keep_the_landing_and_moves_are_counted() {
        let alive = Arc::new(AtomicUsize::new(0));
        let (l, keep) = landing(32, &alive);
        let mut f = Filling::new(l);
        f.spare()[..10].copy_from_slice(b"0123456789");
        f.advance(10);
        let piece = f.cut(6, 2);
        assert_eq!(&piece[..], b"2345");
        assert_eq!(f.filled(), b"6789");
        assert_eq!(f.capacity(), 26);
        assert_eq!(f.room(), 22);
        let (next, keep2) = landing(8, &alive);
        let f = f.move_to(next, 3).expect("fits");
        assert_eq!(f.filled(), b"6789");
        assert_eq!(keep.moved.load(Ordering::Relaxed), 3);
        assert_eq!(keep2.moved.load(Ordering::Relaxed), 0);
        drop((keep, keep2));
        assert_eq!(alive.load(Ordering::Relaxed), 2, "the piece holds the first landing");
        drop(piece);
        assert_eq!(alive.load(Ordering::Relaxed), 1);
        drop(f);
        assert_eq!(alive.load(Ordering::Relaxed), 0);
    }
}
