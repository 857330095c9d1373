//! The budgets an application is held to on the engine's budget clock:
//! request memory released within the release timeout of its calls' end,
//! and no black hole (calls in a row ending unanswered, and no answer for
//! the answer timeout).

use protoplane_seam::desc::{self, Descriptor};
use protoplane_seam::engine::Violation;

use crate::util::{Pair, LIMITS};

#[test]
fn request_memory_held_past_its_call_breaks_the_budget() {
    let mut p = Pair::new();
    let call = p.open(64);
    p.app_takes();
    // Held while its call is open: any number of ticks.
    p.tick(3 * LIMITS.release_ticks).expect("the call is open");
    // The call ends; the chunk stays held: the budget runs out.
    p.engine.end_call(call, Some((0, 0))).expect("open");
    p.tick(LIMITS.release_ticks).expect("within the release timeout");
    let chunk = p.engine_chunk(0).offset;
    let why = p.tick(1).expect_err("past it");
    assert_eq!(why, Violation::KeptMemory { chunk, timeout: LIMITS.release_timeout });
    assert!(why.to_string().contains(&format!("chunk {chunk:#x}")), "{why}");
}

#[test]
fn request_memory_released_in_time_breaks_nothing() {
    let mut p = Pair::new();
    let call = p.open(64);
    p.app_takes();
    p.engine.end_call(call, Some((0, 0))).expect("open");
    p.tick(LIMITS.release_ticks).expect("within the release timeout");
    p.drive();
    assert_eq!(p.engine_free.in_use(), 0, "released with the cancel");
    p.tick(10 * LIMITS.release_ticks).expect("nothing held");
}

#[test]
fn calls_ending_unanswered_make_a_black_hole() {
    let mut p = Pair::new();
    for _ in 0..LIMITS.max_unanswered - 1 {
        let call = p.open(0);
        p.engine.end_call(call, Some((0, 0))).expect("open");
    }
    // One answer in between resets the count.
    let answered = p.open(0);
    p.inject(Descriptor {
        call: answered,
        flags: desc::STATUS | desc::END,
        ..Descriptor::default()
    });
    p.engine_takes();
    for _ in 0..LIMITS.max_unanswered {
        let call = p.open(0);
        p.engine.end_call(call, Some((0, 0))).expect("open");
    }
    p.tick(LIMITS.answer_ticks).expect("answered recently");
    let why = p.tick(1).expect_err("a black hole");
    let hole =
        Violation::BlackHole { unanswered: LIMITS.max_unanswered, timeout: LIMITS.answer_timeout };
    assert_eq!(why, hole);
    assert!(why.to_string().contains("ended unanswered"), "{why}");
    assert!(p.engine.closed().is_none(), "the driver detaches, not the check");
}

#[test]
fn fewer_unanswered_calls_are_no_black_hole() {
    let mut p = Pair::new();
    for _ in 0..LIMITS.max_unanswered - 1 {
        let call = p.open(0);
        p.engine.end_call(call, Some((0, 0))).expect("open");
    }
    p.tick(10 * LIMITS.answer_ticks).expect("not enough calls unanswered");
}
