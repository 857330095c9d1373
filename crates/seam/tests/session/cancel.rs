//! Cancellation from either side: the engine's CANCEL stops the handler
//! and expects no answer (a late one is harmless); the application ends a
//! call with its status, and the engine has nothing to cancel.

use protoplane_seam::desc;

use crate::util::{AppSeen, EngineSeen, Pair, Whose};

#[test]
fn the_engine_cancels_a_running_call() {
    let mut p = Pair::new();
    let call = p.open(64);
    p.app_takes();
    assert_eq!(p.app.open_calls(), 1);

    // The client went away: method 3 of service 1.
    let (_, owed) = p.engine.end_call(call, Some((3, 1))).expect("open");
    assert!(owed, "a cancel is owed");
    assert_eq!(p.engine.open_calls(), 0);
    p.flush();
    let cancel = *p.requests.front().expect("the cancel");
    assert_eq!(cancel.flags, desc::CANCEL | desc::END);
    assert_eq!((cancel.call, cancel.method, cancel.service), (call, 3, 1));

    p.app_takes();
    assert_eq!(p.app_seen.last(), Some(&AppSeen::Cancelled { call, running: true }));
    assert_eq!(p.app.open_calls(), 0, "the handler is gone");

    // Its request's chunk comes back all the same.
    p.drive();
    assert_eq!(p.engine_free.in_use(), 0);
    assert!(p.violation.is_none(), "{:?}", p.violation);
}

#[test]
fn an_answer_on_its_way_when_the_engine_cancels_is_dropped() {
    let mut p = Pair::new();
    let call = p.open(64);
    p.app_takes();
    p.reply(call, desc::MESSAGE, 100, 0);
    p.engine.end_call(call, Some((0, 0))).expect("open");
    p.engine_takes();
    let late = EngineSeen::Reply { call, whose: Whose::Stale, bytes: true, ends: false };
    assert_eq!(p.engine_seen, [late]);
    assert!(p.violation.is_none(), "a late answer is no violation");
    // Its chunk goes back to the application too.
    p.drive();
    assert_eq!(p.app_free.in_use(), 0);
}

#[test]
fn a_call_the_application_ends_leaves_nothing_to_cancel() {
    let mut p = Pair::new();
    let call = p.open(64);
    p.app_takes();
    // The handler gave up: CANCELLED.
    p.app.remove_call(call);
    p.reply(call, desc::STATUS | desc::END, 0, 1);
    p.engine_takes();
    let ended = EngineSeen::Reply { call, whose: Whose::Ended, bytes: false, ends: true };
    assert_eq!(p.engine_seen, [ended]);
    // The proxy's guard ends the call after its status: nothing to tell.
    assert!(p.engine.end_call(call, Some((0, 0))).is_none());
    assert_eq!(p.engine.owed().0, 0, "no cancel owed");
}

#[test]
fn a_cancel_that_finds_the_ring_full_is_posted_later() {
    let mut p = Pair::new();
    let call = p.open(0);
    while p.requests.len() < p.ring_slots {
        p.requests.push_back(desc::Descriptor::releases(&[]));
    }
    p.engine.end_call(call, Some((0, 0))).expect("open");
    p.flush();
    assert_eq!(p.engine.owed().0, 1, "still owed");
    p.requests.clear();
    p.flush();
    assert_eq!(p.engine.owed().0, 0);
    assert_eq!(
        p.requests.front().map(|d| (d.call, d.flags)),
        Some((call, desc::CANCEL | desc::END))
    );
}
