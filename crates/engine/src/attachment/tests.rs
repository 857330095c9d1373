//! The attachment's rules as the drain loop meets them, through its real
//! rings on a small region: each test also checks that the driver keeps
//! its locks and chunk tokens straight around the session's decisions
//! (two of them were found by the fuzz target `ring`). The rules alone,
//! with no region, are `protoplane-seam`'s `tests/session`.

use super::*;
use protoplane_seam::engine::STALE_PER_CALL;
use protoplane_shm::layout::Class;

/// An attachment on a small region, and the application's ends of it:
/// its mapping, its consumer of the request ring, its producer of the
/// response ring.
fn attached() -> (Arc<Attachment>, Receiver, Arc<Mapping>, Consumer, Producer) {
    let layout = Layout { ring_slots: 8, classes: vec![Class { size: 4096, count: 2 }] };
    let (region, att, rx) =
        crate::region(1, 0, vec!["a.S".into()], layout.clone(), None, crate::Budgets::default())
            .expect("region");
    let parts = layout.app_parts(&region.shared, &region.engine_half);
    let map = Arc::new(Mapping::map_parts(&parts).expect("map"));
    let ring = |at| Ring::new(map.clone(), at, layout.ring_slots).expect("ring");
    let (requests, responses) = (ring(layout.request_ring()), ring(layout.response_ring()));
    (att, rx, map, Consumer::new(requests), Producer::new(responses))
}

/// A response for a call that already ended (the engine cancelled
/// it), in the application's first chunk.
fn stale(att: &Attachment) -> Descriptor {
    let (call, _rx) = att.open_call().expect("open");
    att.close_call(call, Some((0, 0)));
    let chunk = att.layout.app_half() as u32;
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
    // Found by the `ring` fuzz target: the engine gave a chunk back to
    // its custody when the lease ended, before the release was posted,
    // so an application could hand it over again and again, each time
    // owing one more release (duplicates, and without bound while the
    // request ring stays full).
    let (att, mut rx, _map, _requests, responses) = attached();
    for call in 0..8 {
        att.post(Descriptor { call, flags: desc::END, ..Descriptor::default() }, &[], &[], &[])
            .expect("room");
    }
    let d = stale(&att);
    responses.push(&d).expect("room");
    responses.push(&d).expect("room");
    assert_eq!(take(&att, &mut rx.responses, 256), 2);
    let why = att.closed_reason().expect("detached");
    assert!(why.contains("handed over twice"), "{why}");
    assert_eq!(att.chunk_use().1, 0, "nothing held after the detach");
}

#[test]
fn a_bad_release_after_a_good_one_detaches_without_deadlock() {
    // Found by the `ring` fuzz target: a descriptor releasing a lent
    // chunk and then one that was not lent returned its error while
    // holding both the state lock and the first chunk, whose drop
    // takes the lock: the drain loop hung.
    let (att, mut rx, _map, mut requests, responses) = attached();
    att.post(
        Descriptor { call: 1, flags: desc::OPEN, ..Descriptor::default() },
        &[1; 64],
        &[],
        &[],
    )
    .expect("room");
    att.flush();
    let lent = requests.pop().expect("the request").chunk;
    assert_ne!(lent, 0, "the request's block is in a lent chunk");
    responses.push(&Descriptor::releases(&[lent, lent])).expect("room");
    assert_eq!(take(&att, &mut rx.responses, 256), 1);
    let why = att.closed_reason().expect("detached");
    assert!(why.contains("was not lent"), "{why}");
}

#[test]
fn a_released_chunk_can_be_handed_over_again() {
    let (att, mut rx, _map, mut requests, responses) = attached();
    let d = stale(&att);
    for _ in 0..3 {
        responses.push(&d).expect("room");
        assert_eq!(take(&att, &mut rx.responses, 256), 1);
        assert_eq!(att.chunk_use().1, 1, "held until its release is posted");
        att.flush();
        let release = requests.pop().expect("the release");
        assert_eq!(release.released().collect::<Vec<_>>(), [d.chunk]);
        assert_eq!(att.chunk_use().1, 0);
    }
    assert!(att.closed_reason().is_none());
}

#[test]
fn idle_descriptors_are_violations() {
    // An empty release.
    let (att, mut rx, _map, _requests, responses) = attached();
    responses.push(&Descriptor { flags: desc::RELEASE, ..Descriptor::default() }).expect("room");
    take(&att, &mut rx.responses, 256);
    assert!(att.closed_reason().expect("detached").contains("release of no chunk"));

    // Late answers: a few per call the engine ended, then no more.
    let (att, mut rx, _map, _requests, responses) = attached();
    let late = Descriptor { flags: desc::STATUS | desc::END, ..stale(&att) };
    let late = Descriptor { block: Span::default(), chunk: 0, ..late };
    for _ in 0..STALE_PER_CALL {
        responses.push(&late).expect("room");
        assert_eq!(take(&att, &mut rx.responses, 256), 1);
    }
    assert!(att.closed_reason().is_none(), "late answers of an ended call");
    responses.push(&late).expect("room");
    take(&att, &mut rx.responses, 256);
    let why = att.closed_reason().expect("detached");
    assert!(why.contains("more descriptors for ended calls"), "{why}");

    // A call the engine never opened.
    let (att, mut rx, _map, _requests, responses) = attached();
    responses.push(&Descriptor { call: 7, ..late }).expect("room");
    take(&att, &mut rx.responses, 256);
    assert!(att.closed_reason().expect("detached").contains("never opened"));
}

#[test]
fn request_memory_held_past_its_call_breaks_the_budget() {
    let (att, _rx, _map, mut requests, _responses) = attached();
    let ticks = att.budgets.ticks(att.budgets.release_timeout);
    let (call, _events) = att.open_call().expect("open");
    let open = Descriptor { call, flags: desc::OPEN, ..Descriptor::default() };
    att.post(open, &[1; 64], &[], &[]).expect("room");
    let chunk = requests.pop().expect("the request").chunk;
    assert_ne!(chunk, 0);
    // Held while its call is open: any number of ticks.
    for _ in 0..3 * ticks {
        att.check_budgets().expect("the call is open");
    }
    // The call ends; the chunk stays held: the budget runs out.
    att.close_call(call, Some((0, 0)));
    for _ in 0..ticks {
        att.check_budgets().expect("within the release timeout");
    }
    let why = att.check_budgets().expect_err("past it");
    assert!(why.contains(&format!("chunk {chunk:#x}")), "{why}");
}

#[test]
fn calls_ending_unanswered_make_a_black_hole() {
    let (att, mut rx, _map, _requests, responses) = attached();
    let b = att.budgets.clone();
    let ticks = b.ticks(b.answer_timeout);
    for _ in 0..b.max_unanswered - 1 {
        let (call, _) = att.open_call().expect("open");
        att.close_call(call, Some((0, 0)));
    }
    // One answer in between resets the count.
    let (answered, _) = att.open_call().expect("open");
    let status =
        Descriptor { call: answered, flags: desc::STATUS | desc::END, ..Descriptor::default() };
    responses.push(&status).expect("room");
    take(&att, &mut rx.responses, 256);
    for _ in 0..b.max_unanswered {
        let (call, _) = att.open_call().expect("open");
        att.close_call(call, Some((0, 0)));
    }
    for _ in 0..ticks {
        att.check_budgets().expect("answered recently");
    }
    let why = att.check_budgets().expect_err("a black hole");
    assert!(why.contains("ended unanswered"), "{why}");
    assert!(att.closed_reason().is_none(), "the drain loop detaches, not the check");
}
