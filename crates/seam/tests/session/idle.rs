//! Descriptors that do nothing are work an application makes the engine
//! do: a call the engine never opened, an empty release, flags it may not
//! send, more late answers than calls the engine ended under it. Each
//! detaches it. The application, for its part, drops what the engine
//! sends for a call it does not run.

use protoplane_seam::desc::{self, Descriptor};
use protoplane_seam::engine::{Violation, STALE_PER_CALL};

use crate::util::{AppSeen, EngineSeen, Pair, Whose};

#[test]
fn a_descriptor_for_a_call_never_opened_is_a_violation() {
    let mut p = Pair::new();
    let call = p.open(0);
    p.inject(Descriptor {
        call: call + 1,
        flags: desc::STATUS | desc::END,
        ..Descriptor::default()
    });
    p.engine_takes();
    assert_eq!(p.violation, Some(Violation::NeverOpened(call + 1)));
    assert!(p.violation.as_ref().is_some_and(|v| v.to_string().contains("never opened")));
}

#[test]
fn an_empty_release_is_a_violation() {
    let mut p = Pair::new();
    p.inject(Descriptor { flags: desc::RELEASE, ..Descriptor::default() });
    p.engine_takes();
    assert_eq!(p.violation, Some(Violation::EmptyRelease));
}

#[test]
fn flags_an_application_may_not_send_are_a_violation() {
    for flags in
        [desc::OPEN | desc::MESSAGE, desc::CANCEL | desc::END, desc::END, 0x8000 | desc::STATUS]
    {
        let mut p = Pair::new();
        let call = p.open(0);
        p.inject(Descriptor { call, flags, ..Descriptor::default() });
        p.engine_takes();
        assert_eq!(p.violation, Some(Violation::Flags(flags)), "{flags:#x}");
        assert_eq!(p.engine_seen, [], "nothing of it was taken");
    }
}

#[test]
fn late_answers_are_allowed_a_few_per_call_the_engine_ended() {
    let mut p = Pair::new();
    let call = p.open(0);
    p.engine.end_call(call, Some((0, 0))).expect("open");
    let late = Descriptor { call, flags: desc::STATUS | desc::END, ..Descriptor::default() };
    for _ in 0..STALE_PER_CALL {
        p.inject(late);
        p.engine_takes();
    }
    assert!(p.violation.is_none(), "late answers of an ended call");
    let stale = EngineSeen::Reply { call, whose: Whose::Stale, bytes: false, ends: true };
    assert_eq!(p.engine_seen, vec![stale; STALE_PER_CALL as usize]);
    p.inject(late);
    p.engine_takes();
    assert_eq!(p.violation, Some(Violation::TooManyStale));
}

#[test]
fn a_call_the_application_ended_gets_no_late_allowance() {
    let mut p = Pair::new();
    let call = p.open(0);
    let status = Descriptor { call, flags: desc::STATUS | desc::END, ..Descriptor::default() };
    p.inject(status);
    p.engine_takes();
    assert!(p.violation.is_none());
    p.inject(status);
    p.engine_takes();
    assert_eq!(p.violation, Some(Violation::TooManyStale));
}

#[test]
fn the_application_drops_descriptors_for_calls_it_does_not_run() {
    let mut p = Pair::new();
    // A request for a call the application never saw open, in a chunk.
    let call = p.engine.open_call(()).expect("attached");
    let more = Descriptor { call, flags: desc::MESSAGE | desc::END, ..Descriptor::default() };
    assert!(p.post_request(more, 64, &[]));
    p.app_takes();
    assert_eq!(p.app_seen, [AppSeen::More { call, running: false, end: true }]);
    assert_eq!(p.app.open_calls(), 0);
    // Its chunk still goes back.
    p.done_reading(call);
    p.drive();
    assert_eq!(p.engine_free.in_use(), 0);
}
