//! Shepherding rings: fixed slots of call descriptors in shared memory.
//!
//! Each ring has one producer process (any number of its threads) and one
//! consumer thread in the other process. A slot is a sequence word plus
//! the descriptor's seven words:
//!
//! ```text
//! slot i (64 B) := seq u64 | descriptor words 0..7
//!
//! seq == pos          the slot is free for the producer at position pos
//! seq == pos + 1      it holds the element of position pos (the valid flag)
//! seq == pos + slots  consumed; free for position pos + slots
//! ```
//!
//! Positions are 64-bit counters that only grow, so a position names one
//! lap of one slot and never wraps to ambiguity. The producer claims
//! positions from a counter in its *own* memory (a compare-and-swap among
//! its threads, so several fill slots concurrently; each publishes its slot
//! with the sequence word when done, in any order), and the consumer keeps
//! its position privately too. Only the sequence words and the payload
//! words are shared, all accessed as atomics.
//!
//! Trust: the consumer never believes a slot beyond its sequence word and
//! copies the words out before anything else looks at them; a garbage
//! descriptor is the receiver's validation problem, not the ring's. A
//! producer facing garbage sequence words (a consumer that scribbled on its
//! ring) gets [`PushError::Corrupt`] instead of spinning forever.
//!
//! Waiting: the consumer spins for a while and then parks on its end of a
//! socket pair ([`Doorbell`], [`Bell`]). Before parking it raises its parked flag and looks at
//! the ring once more; a producer publishes, then reads the flag, and rings
//! only when it is raised. With a full fence on each side, either the
//! consumer sees the element or the producer sees the flag (Dekker), so no
//! wake-up is lost and a busy consumer costs the producer no system call.

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;

use sync::AtomicU64;

use crate::desc::{Descriptor, WORDS};
use crate::layout::SLOT_LEN;
use crate::sys::{Bell, Cleared, Mapping};

/// Why a push failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushError {
    /// Every slot holds an element the consumer has not taken yet.
    Full,
    /// A sequence word holds a value no correct consumer writes.
    Corrupt,
}

impl std::fmt::Display for PushError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PushError::Full => f.write_str("ring full"),
            PushError::Corrupt => f.write_str("ring corrupted by its consumer"),
        }
    }
}

impl std::error::Error for PushError {}

/// The atomics of the ring protocol: the standard library's, or loom's
/// when the crate is built for the loom model (`--cfg protoplane_loom`,
/// `crates/shm/tests/loom.rs`), which then checks every interleaving of
/// this very code.
#[doc(hidden)]
pub mod sync {
    #[cfg(protoplane_loom)]
    pub use loom::sync::atomic::{fence, AtomicU64};
    #[cfg(not(protoplane_loom))]
    pub use std::sync::atomic::{fence, AtomicU64};
}

/// The memory a ring's slots live in: a shared region's mapping, or, in
/// the loom model, plain atomics.
pub trait Slots: Send + Sync + std::fmt::Debug + 'static {
    /// The 8-aligned word at byte `at`, if in bounds.
    fn slot_word(&self, at: usize) -> Option<&AtomicU64>;
    /// Bytes of memory.
    fn slots_len(&self) -> usize;
}

#[cfg(not(protoplane_loom))]
impl Slots for Mapping {
    fn slot_word(&self, at: usize) -> Option<&AtomicU64> {
        self.atomic_u64(at)
    }

    fn slots_len(&self) -> usize {
        self.len()
    }
}

/// In the loom build, rings live in loom's atomics only: no ring fits a
/// mapping (`Ring::new` refuses every one).
#[cfg(protoplane_loom)]
impl Slots for Mapping {
    fn slot_word(&self, _: usize) -> Option<&AtomicU64> {
        None
    }

    fn slots_len(&self) -> usize {
        0
    }
}

/// The slots of one ring in a mapping.
#[derive(Debug)]
pub struct Ring<M: Slots = Mapping> {
    map: Arc<M>,
    offset: usize,
    slots: u64,
}

impl<M: Slots> Clone for Ring<M> {
    fn clone(&self) -> Self {
        Ring { map: self.map.clone(), offset: self.offset, slots: self.slots }
    }
}

impl<M: Slots> Ring<M> {
    /// The ring of `slots` slots (a power of two, at least 2) at `offset`.
    /// `None` when it does not fit the mapping. (With one slot the
    /// sequence word could not tell "holds position p" from "free for
    /// position p + 1": both are p + 1.)
    pub fn new(map: Arc<M>, offset: usize, slots: u32) -> Option<Ring<M>> {
        if !slots.is_power_of_two() || slots < 2 || offset % SLOT_LEN != 0 {
            return None;
        }
        let end = offset.checked_add(slots as usize * SLOT_LEN)?;
        (end <= map.slots_len()).then_some(Ring { map, offset, slots: slots as u64 })
    }

    /// Sets every slot free for the first lap (the engine does this once,
    /// before anybody attaches).
    pub fn init(&self) {
        for i in 0..self.slots {
            self.seq(i).store(i, Ordering::Relaxed);
        }
        sync::fence(Ordering::Release);
    }

    /// Slots.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    fn word(&self, pos: u64, w: usize) -> &AtomicU64 {
        let at = self.offset + (pos & (self.slots - 1)) as usize * SLOT_LEN + 8 * w;
        // In bounds by construction (checked in `new`), 8-aligned.
        match self.map.slot_word(at) {
            Some(a) => a,
            None => unreachable_word(),
        }
    }

    fn seq(&self, pos: u64) -> &AtomicU64 {
        self.word(pos, 0)
    }
}

#[cold]
fn unreachable_word() -> ! {
    // `Ring::new` checked that every slot lies in the mapping.
    panic!("ring slot outside its mapping")
}

/// The producing end (shareable among this process's threads).
#[derive(Debug)]
pub struct Producer<M: Slots = Mapping> {
    ring: Ring<M>,
    /// Next position to claim: private to this process.
    tail: AtomicU64,
}

impl<M: Slots> Producer<M> {
    /// Produces into `ring` from position 0.
    pub fn new(ring: Ring<M>) -> Producer<M> {
        Producer { ring, tail: AtomicU64::new(0) }
    }

    /// Publishes `d`, or says why it cannot now.
    pub fn push(&self, d: &Descriptor) -> Result<(), PushError> {
        let slots = self.ring.slots;
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let seq = self.ring.seq(pos).load(Ordering::Acquire);
            if seq == pos {
                match self.tail.compare_exchange_weak(
                    pos,
                    pos + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(now) => {
                        pos = now;
                        continue;
                    }
                }
            }
            let now = self.tail.load(Ordering::Relaxed);
            if now != pos {
                // Another thread of ours claimed `pos` meanwhile.
                pos = now;
                continue;
            }
            if seq.wrapping_add(slots) == pos + 1 {
                return Err(PushError::Full);
            }
            return Err(PushError::Corrupt);
        }
        for (i, w) in d.to_words().into_iter().enumerate() {
            self.ring.word(pos, 1 + i).store(w, Ordering::Relaxed);
        }
        self.ring.seq(pos).store(pos + 1, Ordering::Release);
        // Bring the next slot's line towards this core now, while the
        // consumer works, rather than when the next push needs it (its
        // last writer was the consumer, a lap ago).
        let _ = self.ring.seq(pos + 1).load(Ordering::Relaxed);
        Ok(())
    }

    /// Positions claimed so far.
    pub fn produced(&self) -> u64 {
        self.tail.load(Ordering::Relaxed)
    }

    /// How many of the elements claimed at positions `from..produced()`
    /// the consumer has taken, counted from `from` up to the first one it
    /// has not (a watchdog's view of consumer progress); `Err(Corrupt)` if
    /// a sequence word on the way holds a value no consumer could have
    /// left there.
    ///
    /// A slot's sequence word only grows: `pos` (free for position `pos`;
    /// also while a producer has claimed it and is still writing it),
    /// `pos + 1` (published), then `pos + slots` once taken, and, as later
    /// laps use the slot, `p`, `p + 1` and `p + slots` for `p = pos + k *
    /// slots`, never past the last claimed position plus `slots`. So
    /// position `pos` has been taken exactly when the word is past `pos +
    /// 1`, and a word below `pos`, past that bound, or off the slot's
    /// residues (`pos` and `pos + 1` modulo `slots`) was scribbled: a
    /// consumer that scribbles every word to look fast is caught here, not
    /// only when the next push finds its slot wrong (requests already
    /// posted would otherwise wait for their deadlines). (Counting every
    /// word that is not `pos + 1` took a claimed, not yet published element
    /// for a taken one, and a watchdog looking at that moment never saw the
    /// consumer stall on it.)
    pub fn consumed_from(&self, from: u64) -> Result<u64, PushError> {
        let slots = self.ring.slots;
        let end = self.produced();
        let mut pos = from;
        while pos < end {
            let seq = self.ring.seq(pos).load(Ordering::Acquire);
            if seq == pos || seq == pos + 1 {
                break; // claimed or published, not taken yet
            }
            // Read after the word: a producer claims before it publishes.
            let bound = self.produced() + slots;
            if seq < pos || seq >= bound || (seq - pos) % slots > 1 {
                return Err(PushError::Corrupt);
            }
            pos += 1;
        }
        Ok(pos - from)
    }
}

/// The consuming end (one thread).
#[derive(Debug)]
pub struct Consumer<M: Slots = Mapping> {
    ring: Ring<M>,
    /// Next position to take: private to this process.
    head: u64,
}

impl<M: Slots> Consumer<M> {
    /// Consumes `ring` from position 0.
    pub fn new(ring: Ring<M>) -> Consumer<M> {
        Consumer { ring, head: 0 }
    }

    /// Takes the next element, if it has been published.
    pub fn pop(&mut self) -> Option<Descriptor> {
        let pos = self.head;
        if self.ring.seq(pos).load(Ordering::Acquire) != pos + 1 {
            return None;
        }
        let mut w = [0u64; WORDS];
        for (i, slot) in w.iter_mut().enumerate() {
            *slot = self.ring.word(pos, 1 + i).load(Ordering::Relaxed);
        }
        self.ring.seq(pos).store(pos + self.ring.slots, Ordering::Release);
        self.head = pos + 1;
        Some(Descriptor::from_words(w))
    }

    /// Whether the next element is not published yet.
    pub fn is_empty(&self) -> bool {
        self.ring.seq(self.head).load(Ordering::Acquire) != self.head + 1
    }

    /// Elements taken so far.
    pub fn consumed(&self) -> u64 {
        self.head
    }
}

/// A consumer's doorbell: its parked flag in the control page and the
/// bell ([`Bell`]) it waits on. The engine's two doorbells (the one it
/// rings, the one it waits on) share its end of one bell pair, and so do
/// the application's.
#[derive(Debug)]
pub struct Doorbell {
    map: Arc<Mapping>,
    flag: usize,
    bell: Arc<Bell>,
}

impl Doorbell {
    /// The doorbell whose parked flag is the word at `flag`.
    pub fn new(map: Arc<Mapping>, flag: usize, bell: Arc<Bell>) -> Option<Doorbell> {
        map.atomic_u32(flag)?;
        Some(Doorbell { map, flag, bell })
    }

    fn word(&self) -> &AtomicU32 {
        match self.map.atomic_u32(self.flag) {
            Some(w) => w,
            None => unreachable_word(),
        }
    }

    /// Producer side, after publishing: rings when the consumer is parked
    /// (and lowers the flag, so one ring serves a burst).
    pub fn notify(&self) -> bool {
        fence(Ordering::SeqCst);
        if self.word().load(Ordering::Relaxed) != 0 && self.word().swap(0, Ordering::AcqRel) != 0 {
            self.bell.ring();
            return true;
        }
        false
    }

    /// Consumer side: raises the parked flag. Look at the ring once more
    /// after this, and wait only if it is still empty.
    pub fn prepare_park(&self) {
        self.word().store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Consumer side: lowers the flag and clears the bell. `false`: the
    /// other side closed its end (it is gone).
    pub fn unpark(&self) -> bool {
        self.word().store(0, Ordering::Relaxed);
        self.bell.clear() != Cleared::Closed
    }

    /// The bell (to wait on).
    pub fn bell(&self) -> &Arc<Bell> {
        &self.bell
    }

    /// The consumer's doorbell, waitable from a tokio runtime (call from
    /// inside one). Only one doorbell of a bell may be made waitable.
    pub fn into_async(self) -> std::io::Result<AsyncDoorbell> {
        // SAFETY: `register_with_interest` requires that the descriptor stay
        // open and not be replaced while registered. The `Arc<Bell>` owning
        // it moves into the `AsyncFd`, which deregisters before dropping it.
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                BellFd(self.bell),
                tokio::io::Interest::READABLE,
            )
        }?;
        Ok(AsyncDoorbell { map: self.map, flag: self.flag, fd })
    }
}

/// A shared bell as the reactor's descriptor source (the `Arc` keeps the
/// descriptor open while it is registered).
#[derive(Debug)]
struct BellFd(Arc<Bell>);

impl std::os::fd::AsRawFd for BellFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

/// A consumer's doorbell that a task can wait on.
#[derive(Debug)]
pub struct AsyncDoorbell {
    map: Arc<Mapping>,
    flag: usize,
    fd: tokio::io::unix::AsyncFd<BellFd>,
}

impl AsyncDoorbell {
    fn word(&self) -> &AtomicU32 {
        match self.map.atomic_u32(self.flag) {
            Some(w) => w,
            None => unreachable_word(),
        }
    }

    /// Raises the parked flag. Look at the ring once more after this, and
    /// wait only if it is still empty.
    pub fn prepare_park(&self) {
        self.word().store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Lowers the flag and clears the bell. `false`: the other side closed
    /// its end (it is gone). After [`AsyncDoorbell::wait`] returned: the
    /// bell fired (rung, or closed).
    pub fn unpark(&self) -> bool {
        self.word().store(0, Ordering::Relaxed);
        self.fd.get_ref().0.clear() != Cleared::Closed
    }

    /// Lowers the flag when the consumer did not wait after all (its ring
    /// filled meanwhile) or stopped waiting for another reason than the
    /// bell: the bell is read (a system call) only if the producer rang it,
    /// which it does only after taking the flag down itself. A producer
    /// that rings without taking the flag leaves a byte behind: the next
    /// wait returns at once and [`AsyncDoorbell::unpark`] reads it, so
    /// nothing is lost either way. `false`: the other side closed its end.
    pub fn cancel_park(&self) -> bool {
        if self.word().swap(0, Ordering::AcqRel) != 0 {
            return true;
        }
        self.fd.get_ref().0.clear() != Cleared::Closed
    }

    /// Waits until the doorbell rings (or the other side closes its end).
    pub async fn wait(&self) {
        if let Ok(mut g) = self.fd.readable().await {
            g.clear_ready();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::memfd;
    use std::time::Duration;

    fn pair(slots: u32) -> (Producer, Consumer, Arc<Mapping>) {
        let fd = memfd("ring", 64 * slots as usize + 4096).expect("memfd");
        let a = Arc::new(Mapping::map(&fd).expect("map"));
        let b = Arc::new(Mapping::map(&fd).expect("map"));
        let ra = Ring::new(a.clone(), 4096, slots).expect("fits");
        ra.init();
        let rb = Ring::new(b, 4096, slots).expect("fits");
        (Producer::new(ra), Consumer::new(rb), a)
    }

    fn d(call: u64) -> Descriptor {
        Descriptor { call, ..Descriptor::default() }
    }

    #[test]
    fn fifo_through_many_laps() {
        let (p, mut c, _) = pair(8);
        let mut next = 0;
        for round in 0..100u64 {
            for i in 0..(round % 9) {
                p.push(&d(round * 100 + i)).expect("room");
            }
            if round % 9 == 8 {
                assert_eq!(p.push(&d(0)), Err(PushError::Full));
            }
            while let Some(x) = c.pop() {
                assert_eq!(x.call / 100, round);
                next += 1;
            }
        }
        assert_eq!(p.produced(), next);
        assert!(c.is_empty());
    }

    #[test]
    fn a_scribbling_consumer_cannot_make_the_producer_spin() {
        let (p, _c, map) = pair(8);
        // The consumer writes nonsense into every sequence word.
        for i in 0..8 {
            map.atomic_u64(4096 + 64 * i).expect("slot").store(0xdead_beef, Ordering::Relaxed);
        }
        assert_eq!(p.push(&d(1)), Err(PushError::Corrupt));
    }

    #[test]
    fn a_scribbling_producer_only_yields_descriptors() {
        let (_p, mut c, map) = pair(8);
        // A "producer" marks slot 0 valid with garbage words.
        for w in 1..8 {
            map.atomic_u64(4096 + 8 * w).expect("word").store(u64::MAX, Ordering::Relaxed);
        }
        map.atomic_u64(4096).expect("seq").store(1, Ordering::Release);
        let got = c.pop().expect("published");
        assert_eq!(got.call, u64::MAX);
        assert!(c.pop().is_none());
    }

    #[test]
    fn watchdog_sees_progress() {
        let (p, mut c, _) = pair(8);
        for i in 0..5 {
            p.push(&d(i)).expect("room");
        }
        assert_eq!(p.consumed_from(0), Ok(0));
        c.pop();
        c.pop();
        assert_eq!(p.consumed_from(0), Ok(2));
        assert_eq!(p.consumed_from(2), Ok(0));
    }

    #[test]
    fn watchdog_does_not_count_a_claimed_unpublished_element_as_taken() {
        let (p, mut c, _) = pair(8);
        p.push(&d(1)).expect("room");
        c.pop();
        // A producer thread claimed position 1 and is still writing it.
        p.tail.fetch_add(1, Ordering::Relaxed);
        assert_eq!(p.produced(), 2);
        assert_eq!(p.consumed_from(1), Ok(0));
        assert_eq!(p.consumed_from(0), Ok(1));
    }

    #[test]
    fn watchdog_counts_positions_whose_slots_later_laps_reused() {
        let (p, mut c, _) = pair(8);
        for i in 0..20 {
            p.push(&d(i)).expect("room");
            c.pop();
        }
        // Positions 0..20 were all taken; slots 0..4 hold lap 2's 16..20.
        assert_eq!(p.consumed_from(0), Ok(20));
        assert_eq!(p.consumed_from(13), Ok(7));
        p.push(&d(20)).expect("room");
        assert_eq!(p.consumed_from(0), Ok(20));
    }

    #[test]
    fn watchdog_catches_a_consumer_that_scribbles_the_sequence_words() {
        for scribble in [0xdead_beef_u64, 3, 9 + 8 * 4] {
            let (p, _c, map) = pair(8);
            let ring = Ring::new(map, 4096, 8).expect("fits");
            for i in 0..4 {
                p.push(&d(i)).expect("room");
            }
            // The consumer took nothing, then wrote every word.
            for pos in 0..8 {
                ring.seq(pos).store(scribble, Ordering::Relaxed);
            }
            assert_eq!(p.consumed_from(0), Err(PushError::Corrupt), "{scribble:#x}");
        }
    }

    #[test]
    fn threads_produce_concurrently() {
        let (p, mut c, _) = pair(64);
        let p = Arc::new(p);
        let per = 20_000u64;
        let threads: Vec<_> = (0..3u64)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for i in 0..per {
                        while p.push(&d(t << 32 | i)).is_err() {
                            std::hint::spin_loop();
                        }
                    }
                })
            })
            .collect();
        let mut last = [None::<u64>; 3];
        let mut n = 0;
        while n < 3 * per {
            if let Some(x) = c.pop() {
                let t = (x.call >> 32) as usize;
                let i = x.call & 0xffff_ffff;
                // Each producer's elements arrive in its own order.
                assert!(last[t].is_none_or(|l| l < i));
                last[t] = Some(i);
                n += 1;
            }
        }
        for t in threads {
            t.join().expect("producer");
        }
    }

    #[test]
    fn doorbell_rings_only_for_a_parked_consumer() {
        let fd = memfd("bell", 4096).expect("memfd");
        let map = Arc::new(Mapping::map(&fd).expect("map"));
        let (near, far) = Bell::pair().expect("bell");
        let (far, near) = (Arc::new(far), Arc::new(near));
        let producer = Doorbell::new(map.clone(), 64, near).expect("flag");
        let consumer = Doorbell::new(map, 64, far.clone()).expect("flag");
        assert!(!producer.notify());
        consumer.prepare_park();
        assert!(producer.notify());
        assert!(!producer.notify(), "one ring per park");
        assert!(consumer.unpark(), "the producer is there");
        assert_eq!(far.clear(), Cleared::Quiet, "unpark cleared it");
        drop(producer);
        assert!(!consumer.unpark(), "the producer's end closed");
    }

    #[test]
    fn a_cancelled_park_reads_the_bell_only_when_rung() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        let _in = rt.enter();
        let fd = memfd("bell", 4096).expect("memfd");
        let map = Arc::new(Mapping::map(&fd).expect("map"));
        let (near, far) = Bell::pair().expect("bell");
        let producer = Doorbell::new(map.clone(), 64, Arc::new(near)).expect("flag");
        let consumer =
            Doorbell::new(map, 64, Arc::new(far)).expect("flag").into_async().expect("async");
        // Not rung: the flag comes down, nothing to read.
        consumer.prepare_park();
        assert!(consumer.cancel_park());
        assert!(!producer.notify(), "the consumer is not parked");
        // Rung between prepare and cancel: the byte is read, so the next
        // park waits for a new ring.
        consumer.prepare_park();
        assert!(producer.notify());
        assert!(consumer.cancel_park());
        consumer.prepare_park();
        let quiet = rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(20), consumer.wait()).await.is_err()
        });
        assert!(quiet, "the ring was read: no wake-up is left over");
        // The producer gone after a last ring: the ring is read first, and
        // the next wait ends at once and sees the end.
        assert!(producer.notify());
        drop(producer);
        assert!(consumer.cancel_park());
        consumer.prepare_park();
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(5), consumer.wait()).await })
            .expect("a closed end wakes the consumer");
        assert!(!consumer.unpark(), "the producer's end closed");
    }
}
