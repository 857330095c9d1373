//! Outbound calls: the application opens them (its own ids), the engine
//! answers each once, and either side may give up first. The request's
//! chunk comes back as soon as the engine has read it, the answer's as
//! soon as the application has; an application that breaks the rules
//! (an id reused while open, flags outside the outbound set, cancels of
//! calls that never were) is detached, and one that opens more than its
//! limit gets its call refused, not detached.

use protoplane_seam::desc::{self, Descriptor, Span};
use protoplane_seam::engine::Violation;

use crate::util::{AppSeen, EngineSeen, Pair};

#[test]
fn a_call_out_and_its_answer_leave_every_chunk_free() {
    let mut p = Pair::new();
    let call = p.call_out(100);
    p.drive();
    assert_eq!(p.engine_seen, [EngineSeen::CallOut { call, refused: false }]);
    assert_eq!(p.engine.open_outbound(), 1);
    assert!(p.answer_out(call, 200));
    p.drive();
    let answers: Vec<&AppSeen> =
        p.app_seen.iter().filter(|s| !matches!(s, AppSeen::Released)).collect();
    let [AppSeen::Answered { call: c, waiting: true, taken: Some(_) }] = answers[..] else {
        panic!("the answer reached the waiting call: {:?}", p.app_seen)
    };
    assert_eq!(*c, call);
    assert_eq!(p.engine.open_outbound(), 0);
    assert!(p.violation.is_none());
    assert!(p.all_free(), "both chunks came back");
}

#[test]
fn an_outbound_id_is_not_shared_with_the_engines_calls() {
    let mut p = Pair::new();
    // The engine's call 1 and the application's outbound call 1.
    let inbound = p.open(64);
    let out = p.call_out(64);
    assert_eq!(inbound, out);
    p.drive();
    assert!(p.answer_out(out, 64));
    p.drive();
    assert!(matches!(p.app_seen.last(), Some(AppSeen::Answered { waiting: true, .. })));
    // The inbound call is untouched: still open, answered normally.
    p.done_reading(inbound);
    p.reply(inbound, desc::STATUS | desc::END, 0, 0);
    p.drive();
    assert!(p.violation.is_none(), "{:?}", p.violation);
    assert_eq!(p.engine.open_calls(), 0);
    assert!(p.all_free());
}

#[test]
fn an_id_reused_while_open_is_a_violation() {
    let mut p = Pair::new();
    let call = p.call_out(16);
    p.engine_takes();
    let again = Descriptor {
        call,
        flags: desc::OUTBOUND | desc::OPEN | desc::MESSAGE | desc::END,
        ..Descriptor::default()
    };
    let mut d = again;
    let c = p.app_free.alloc(16).expect("chunk");
    d.block = Span { offset: c.offset, len: 16 };
    d.chunk = c.offset;
    p.inject(d);
    p.engine_takes();
    assert_eq!(p.violation, Some(Violation::OutboundTwice(call)));
}

#[test]
fn calls_beyond_the_limit_are_refused_not_detached() {
    let mut p = Pair::new();
    // The pair's limit is two.
    let calls: Vec<u64> = (0..3).map(|_| p.call_out(16)).collect();
    p.drive();
    assert_eq!(
        p.engine_seen,
        [
            EngineSeen::CallOut { call: calls[0], refused: false },
            EngineSeen::CallOut { call: calls[1], refused: false },
            EngineSeen::CallOut { call: calls[2], refused: true },
        ]
    );
    assert!(p.violation.is_none());
    assert_eq!(p.engine.open_outbound(), 2);
    for &c in &calls[..2] {
        assert!(p.answer_out(c, 16));
    }
    p.drive();
    assert!(p.all_free(), "the refused call's request came back too");
}

#[test]
fn a_cancel_stops_the_call_and_nothing_is_answered() {
    let mut p = Pair::new();
    let call = p.call_out(16);
    p.drive();
    p.cancel_out(call);
    p.drive();
    assert_eq!(p.engine_seen.last(), Some(&EngineSeen::CancelOut { call, open: true }));
    assert!(!p.answer_out(call, 16), "a cancelled call is not answered");
    assert!(p.violation.is_none());
    assert!(p.all_free());
}

#[test]
fn a_cancel_crossing_the_answer_is_allowed_once() {
    let mut p = Pair::new();
    let call = p.call_out(16);
    p.drive();
    // The engine answers while the application gives up.
    assert!(p.answer_out(call, 16));
    p.cancel_out(call);
    p.drive();
    assert!(p.violation.is_none(), "{:?}", p.violation);
    assert!(p.engine_seen.contains(&EngineSeen::CancelOut { call, open: false }));
    let unwanted = p.app_seen.iter().any(|s| {
        matches!(s, AppSeen::Answered { call: c, waiting: false, taken: Some(_) } if *c == call)
    });
    assert!(unwanted, "the answer arrived for a call no longer waiting: {:?}", p.app_seen);
    assert!(p.all_free(), "the unwanted answer's chunk came back");
    // A second cancel of it is idle work.
    p.inject(Descriptor { call, flags: desc::OUTBOUND | desc::CANCEL, ..Descriptor::default() });
    p.engine_takes();
    assert_eq!(p.violation, Some(Violation::TooManyStale));
}

#[test]
fn flags_outside_the_outbound_set_are_a_violation() {
    for flags in [
        desc::OUTBOUND | desc::OPEN | desc::END,
        desc::OUTBOUND | desc::OPEN | desc::MESSAGE,
        desc::OUTBOUND | desc::STATUS | desc::END,
        desc::OUTBOUND | desc::OPEN | desc::MESSAGE | desc::END | desc::HEADERS,
        desc::OUTBOUND | desc::CANCEL | desc::END,
        desc::OUTBOUND,
    ] {
        let mut p = Pair::new();
        p.inject(Descriptor { call: 1, flags, ..Descriptor::default() });
        p.engine_takes();
        assert_eq!(p.violation, Some(Violation::Flags(flags)), "{flags:#x}");
    }
    // A cancel carrying a range.
    let mut p = Pair::new();
    let call = p.call_out(16);
    p.engine_takes();
    let d = Descriptor {
        call,
        flags: desc::OUTBOUND | desc::CANCEL,
        side: Span { offset: p.app_chunk(1).offset, len: 4 },
        chunk: p.app_chunk(1).offset,
        ..Descriptor::default()
    };
    p.inject(d);
    p.engine_takes();
    assert_eq!(p.violation, Some(Violation::Flags(d.flags)));
}

#[test]
fn a_detach_hands_back_the_open_outbound_calls() {
    let mut p = Pair::new();
    let a = p.call_out(16);
    let b = p.call_out(16);
    p.drive();
    let gone = p.engine.detach("test").expect("attached");
    assert_eq!(gone.outbound.len(), 2, "{a} and {b} stop");
    assert!(!p.answer_out(a, 16));
}
