//! The end of a session: the engine going away cancels the application's
//! calls in progress and frees what it handed over; the engine detaching
//! an application fails its calls and takes its memory back.

use protoplane_seam::app::Ended;
use protoplane_seam::desc::{self, Descriptor};

use crate::util::{Pair, Token};

#[test]
fn the_end_of_the_session_cancels_calls_in_progress() {
    let mut p = Pair::new();
    let first = p.open(64);
    let second = p.open(64);
    p.app_takes();
    assert_eq!(p.app.open_calls(), 2);
    let reply = p.reply(first, desc::MESSAGE, 16, 0);

    let (calls, tokens) = p.app.end();
    assert_eq!(calls.len(), 2, "both calls are cancelled");
    assert_eq!(tokens, [Token(reply.chunk)], "the response's chunk is freed");
    assert!(p.app.is_ended());
    assert_eq!(p.app.open_calls(), 0);

    // Nothing is handed over or owed any more.
    let mut d =
        Descriptor { call: second, flags: desc::STATUS | desc::END, ..Descriptor::default() };
    assert_eq!(p.app.hand_over(&mut d, None), Err(Ended));
    p.done_reading(first);
    p.done_reading(second);
    assert!(!p.app.owes(), "no release for an engine that is gone");
    assert_eq!(p.app.held(), 0);
}

#[test]
fn a_detach_fails_every_call_and_takes_the_memory_back() {
    let mut p = Pair::new();
    let a = p.open(64);
    let _b = p.open(64);
    p.app_takes();
    p.inject(Descriptor { call: a, flags: desc::MESSAGE, ..Descriptor::default() });
    p.reply(a, desc::MESSAGE, 16, 0);
    p.engine_takes();
    assert_eq!(p.engine.held(), 1, "the response chunk's release is owed");
    assert_eq!(p.engine_free.in_use(), 2);

    let gone = p.engine.detach("test").expect("attached");
    assert_eq!(gone.calls.len(), 2, "both calls fail");
    let mut tokens = gone.tokens;
    tokens.sort_by_key(|t| t.0);
    assert_eq!(tokens, [Token(p.engine_chunk(0).offset), Token(p.engine_chunk(1).offset)]);
    assert_eq!(p.engine.held(), 0, "no release is posted: nothing held for it");
    assert!(!p.engine.owes());
    assert_eq!(p.engine.poll_transmit(), None);
    assert_eq!(p.engine.open_call(()), Err("test"));
    assert!(p.engine.detach("again").is_none(), "detached once");
    assert_eq!(p.engine.closed(), Some("test"));
}

#[test]
fn the_engine_ends_a_call_it_cancels_only_once() {
    let mut p = Pair::new();
    let call = p.open(0);
    assert!(p.engine.end_call(call, Some((0, 0))).is_some());
    assert!(p.engine.end_call(call, Some((0, 0))).is_none());
    assert_eq!(p.engine.owed().0, 1, "one cancel");
}
