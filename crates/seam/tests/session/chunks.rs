//! Chunk custody across the seam: a chunk is read by one side only while
//! the other handed it over, is not handed over again before its release,
//! and every range a descriptor names lies in the chunk it names.

use protoplane_seam::app::SpanError;
use protoplane_seam::desc::{self, Descriptor, Span};
use protoplane_seam::engine::Violation;
use protoplane_shm::layout::LayoutError;

use crate::util::{AppSeen, Pair};

/// A reply to `call` naming the application's first chunk, 16 bytes.
fn in_first_chunk(p: &Pair, call: u64) -> Descriptor {
    let chunk = p.app_chunk(0).offset;
    Descriptor {
        call,
        flags: desc::MESSAGE,
        block: Span { offset: chunk, len: 16 },
        chunk,
        ..Descriptor::default()
    }
}

#[test]
fn a_chunk_is_not_handed_over_again_before_its_release() {
    let mut p = Pair::new();
    let call = p.open(0);
    let d = in_first_chunk(&p, call);
    p.inject(d);
    p.inject(d);
    p.engine_takes();
    let off = p.app_chunk(0).offset;
    assert_eq!(p.violation, Some(Violation::Chunk(LayoutError::AlreadyHeld(off))));
    assert!(p.violation.as_ref().is_some_and(|v| v.to_string().contains("handed over twice")));
    assert_eq!(p.engine.held(), 0, "nothing held after the detach");
    assert!(p.engine.closed().is_some());
}

#[test]
fn a_released_chunk_can_be_handed_over_again() {
    let mut p = Pair::new();
    let call = p.open(0);
    let d = in_first_chunk(&p, call);
    for _ in 0..3 {
        p.inject(d);
        p.engine_takes();
        assert_eq!(p.engine.held(), 1, "held until its release is posted");
        p.flush();
        let release = p.requests.pop_back().expect("the release");
        assert_eq!(release.released().collect::<Vec<_>>(), [d.chunk]);
        assert_eq!(p.engine.held(), 0);
    }
    assert!(p.violation.is_none(), "{:?}", p.violation);
}

#[test]
fn a_release_owed_when_the_ring_is_full_stays_held_and_owed() {
    let mut p = Pair::new();
    let call = p.open(0);
    while p.requests.len() < p.ring_slots {
        p.requests.push_back(Descriptor::releases(&[]));
    }
    p.inject(in_first_chunk(&p, call));
    p.engine_takes();
    p.flush();
    assert_eq!(p.engine.owed().1, [p.app_chunk(0).offset], "owed again");
    assert_eq!(p.engine.held(), 1, "in custody until it is posted");
    // Handing it over again meanwhile is still a violation.
    p.inject(in_first_chunk(&p, call));
    p.engine_takes();
    assert!(matches!(p.violation, Some(Violation::Chunk(LayoutError::AlreadyHeld(_)))));
}

#[test]
fn releases_must_name_chunks_the_engine_lent() {
    let mut p = Pair::new();
    let call = p.open(64);
    let lent = p.engine_chunk(0).offset;
    // The first release is good, the second releases it again.
    p.inject(Descriptor::releases(&[lent, lent]));
    p.engine_takes();
    assert_eq!(p.violation, Some(Violation::NotLent(lent)));
    assert!(p.violation.as_ref().is_some_and(|v| v.to_string().contains("was not lent")));
    assert_eq!(p.engine_free.in_use(), 0, "the good release freed its chunk");
    let _ = call;
}

#[test]
fn a_range_outside_its_chunk_is_a_violation() {
    let mut p = Pair::new();
    let call = p.open(0);
    let mut d = in_first_chunk(&p, call);
    d.side = Span { offset: d.chunk + 4000, len: 200 };
    p.inject(d);
    p.engine_takes();
    assert_eq!(p.violation, Some(Violation::OutsideChunk(d.side)));
    assert_eq!(p.engine.held(), 0);
}

#[test]
fn the_application_refuses_ranges_outside_the_chunk_they_name() {
    let mut p = Pair::new();
    let call = p.engine.open_call(()).expect("attached");
    let c = p.engine_free.alloc(64).expect("a chunk");
    let token = crate::util::Token(c.offset);
    let mut d = Descriptor {
        call,
        flags: desc::OPEN | desc::MESSAGE | desc::END,
        block: Span { offset: c.offset + 4090, len: 64 },
        chunk: c.offset,
        ..Descriptor::default()
    };
    p.engine.hand_over(&mut d, &[(c, &token)]).expect("attached");
    p.requests.push_back(d);
    p.app_takes();
    assert_eq!(p.app_seen, [AppSeen::Refused { call, why: SpanError::OutsideChunk }]);
    assert_eq!(p.app.held(), 0, "the chunk went back");
    assert!(p.app.owes(), "its release is owed: the engine gets it back");
    p.drive();
    assert_eq!(p.engine_free.in_use(), 0);
}

#[test]
fn the_application_refuses_a_chunk_it_already_holds() {
    let mut p = Pair::new();
    let call = p.open(64);
    p.app_takes();
    let held = p.engine_chunk(0);
    // The engine names the same chunk for another request.
    let again = Descriptor {
        call,
        flags: desc::MESSAGE,
        block: Span { offset: held.offset, len: 8 },
        chunk: held.offset,
        ..Descriptor::default()
    };
    p.requests.push_back(again);
    p.app_takes();
    let why = SpanError::Chunk(LayoutError::AlreadyHeld(held.offset));
    assert_eq!(p.app_seen.last(), Some(&AppSeen::Refused { call, why }));
    assert_eq!(p.app.held(), 1, "the first take still holds it");
}

#[test]
fn a_chunk_handed_to_the_engine_is_not_free_until_released() {
    let mut p = Pair::new();
    let call = p.open(0);
    p.app_takes();
    let d = p.reply(call, desc::MESSAGE, 16, 0);
    let c = p.app_chunk(0);
    assert_eq!(d.chunk, c.offset);
    assert!(!p.app.is_free(c), "sent twice, the same bytes are copied");
    p.drive();
    assert!(p.app.is_free(c));
    assert_eq!(p.app_free.in_use(), 0);
}
