//! The ring protocol under loom: every interleaving (up to loom's
//! preemption bound) of the real `Producer` and `Consumer` code, with the
//! slots in plain loom atomics instead of a shared mapping.
//!
//! Run with `RUSTFLAGS="--cfg protoplane_loom" cargo test -p protoplane-shm
//! --test loom --release` (scripts/test.sh does, in a target directory of
//! its own); without the cfg this file is empty.
//!
//! Properties: every descriptor pushed is popped exactly once, whole (no
//! word of another push or another lap shows through), in the order of the
//! positions the producers claimed; a push onto a full ring says `Full`,
//! never `Corrupt`; concurrent producers never claim one slot twice.

#![cfg(protoplane_loom)]

use std::sync::Arc;

use loom::sync::atomic::AtomicU64;
use protoplane_shm::desc::{Descriptor, Span};
use protoplane_shm::ring::{Consumer, Producer, Ring, Slots};
use protoplane_shm::PushError;

/// Slot memory: `slots` slots of 8 words.
#[derive(Debug)]
struct Words(Vec<AtomicU64>);

impl Slots for Words {
    fn slot_word(&self, at: usize) -> Option<&AtomicU64> {
        if at % 8 != 0 {
            return None;
        }
        self.0.get(at / 8)
    }

    fn slots_len(&self) -> usize {
        self.0.len() * 8
    }
}

fn ring(slots: u32) -> (Arc<Producer<Words>>, Consumer<Words>) {
    let words = Arc::new(Words((0..slots * 8).map(|_| AtomicU64::new(0)).collect()));
    let ring = Ring::new(words, 0, slots).expect("ring");
    ring.init();
    (Arc::new(Producer::new(ring.clone())), Consumer::new(ring))
}

/// A descriptor whose every word says `n`, so a torn one shows.
fn desc(n: u64) -> Descriptor {
    let w = n as u32;
    Descriptor {
        call: n,
        method: w,
        block: Span { offset: w, len: w },
        wire: Span { offset: w, len: w },
        side: Span { offset: w, len: w },
        timeout_ns: n,
        chunk: w,
        release: w,
        ..Descriptor::default()
    }
}

fn whole(d: &Descriptor) -> u64 {
    assert_eq!(*d, desc(d.call), "a torn descriptor");
    d.call
}

fn push(p: &Producer<Words>, n: u64) {
    loop {
        match p.push(&desc(n)) {
            Ok(()) => return,
            Err(PushError::Full) => loom::thread::yield_now(),
            Err(PushError::Corrupt) => panic!("a correct consumer reads as corrupt"),
        }
    }
}

fn pop(c: &mut Consumer<Words>) -> u64 {
    loop {
        if let Some(d) = c.pop() {
            return whole(&d);
        }
        loom::thread::yield_now();
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.max_branches = 100_000;
    b.check(f);
}

#[test]
fn two_producers_one_consumer() {
    model(|| {
        let (p, mut c) = ring(2);
        let p2 = p.clone();
        let t = loom::thread::spawn(move || push(&p2, 1));
        push(&p, 2);
        let mut got = [pop(&mut c), pop(&mut c)];
        t.join().expect("producer");
        got.sort();
        assert_eq!(got, [1, 2]);
        assert!(c.pop().is_none());
    });
}

#[test]
fn laps_around_a_full_ring_keep_order() {
    model(|| {
        // Two slots, four pushes: the producer waits for pops, and the
        // slots' sequence words go round a second lap.
        let (p, mut c) = ring(2);
        let t = loom::thread::spawn(move || {
            for n in 1..=4 {
                push(&p, n);
            }
        });
        let got = [pop(&mut c), pop(&mut c), pop(&mut c), pop(&mut c)];
        t.join().expect("producer");
        assert_eq!(got, [1, 2, 3, 4]);
    });
}

#[test]
fn a_full_ring_says_full() {
    model(|| {
        let (p, mut c) = ring(2);
        p.push(&desc(7)).expect("room");
        p.push(&desc(8)).expect("room");
        let p2 = p.clone();
        let t = loom::thread::spawn(move || match p2.push(&desc(9)) {
            Ok(()) => true,
            Err(PushError::Full) => false,
            Err(PushError::Corrupt) => panic!("a full ring reads as corrupt"),
        });
        let first = pop(&mut c);
        let third_in = t.join().expect("producer");
        assert_eq!((first, pop(&mut c)), (7, 8));
        if third_in {
            assert_eq!(pop(&mut c), 9);
        }
        assert!(c.pop().is_none());
    });
}

#[test]
fn a_one_slot_ring_is_refused() {
    loom::model(|| {
        let words = Arc::new(Words((0..8).map(|_| AtomicU64::new(0)).collect()));
        assert!(Ring::new(words, 0, 1).is_none());
    });
}
