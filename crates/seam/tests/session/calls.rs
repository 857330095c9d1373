//! A call's life across the seam: OPEN with its request, the replies,
//! the status that ends it, and every chunk back where it came from.

use protoplane_seam::app::Taken;
use protoplane_seam::desc::{self, Descriptor, Span};

use crate::util::{AppSeen, EngineSeen, Pair, Whose};

#[test]
fn a_unary_call_opens_is_answered_and_gives_every_chunk_back() {
    let mut p = Pair::new();
    let call = p.open(64);
    assert_eq!(p.engine_free.in_use(), 1, "the request's chunk is handed over");

    p.app_takes();
    let request = p.engine_chunk(0);
    let opened = AppSeen::Opened { call, taken: Some(Taken { chunk: request, landing: None }) };
    assert_eq!(p.app_seen, [opened]);
    assert_eq!(p.app.held(), 1);
    assert_eq!(p.app.open_calls(), 1);

    // The handler read its request and answers with one descriptor.
    p.done_reading(call);
    assert!(p.app.owes(), "the request chunk's release is owed");
    p.app.remove_call(call);
    let reply = p.reply(call, desc::MESSAGE | desc::STATUS | desc::END, 32, 0);
    assert_eq!(reply.release, request.offset, "the reply carries the release");
    assert!(!p.app.owes());
    assert!(!p.app.is_free(p.app_chunk(0)), "the response's chunk is handed over");

    p.engine_takes();
    let answered = EngineSeen::Reply { call, whose: Whose::Ended, bytes: true, ends: true };
    assert_eq!(p.engine_seen, [answered]);
    assert_eq!(p.engine.open_calls(), 0);
    assert_eq!(p.engine_free.in_use(), 0, "the request's chunk came back");
    assert!(p.engine.owes(), "the response chunk's release is owed");

    p.flush();
    let release = *p.requests.front().expect("the release");
    assert_eq!(release.flags, desc::RELEASE);
    assert_eq!(release.released().collect::<Vec<_>>(), [p.app_chunk(0).offset]);
    p.app_takes();
    assert_eq!(p.app_free.in_use(), 0, "the response's chunk came back");
    assert!(p.app.is_free(p.app_chunk(0)));
    assert_eq!((p.engine.held(), p.app.held()), (0, 0));
    assert!(p.violation.is_none());
}

#[test]
fn a_call_stays_open_until_its_status() {
    let mut p = Pair::new();
    let call = p.open(64);
    p.app_takes();
    p.reply(call, desc::HEADERS, 0, 0);
    p.reply(call, desc::MESSAGE, 100, 0);
    p.reply(call, desc::MESSAGE, 100, 0);
    p.reply(call, desc::STATUS | desc::END, 0, 0);
    p.engine_takes();
    let seen = |whose, bytes, ends| EngineSeen::Reply { call, whose, bytes, ends };
    assert_eq!(
        p.engine_seen,
        [
            seen(Whose::Open, false, false),
            seen(Whose::Open, true, false),
            seen(Whose::Open, true, false),
            seen(Whose::Ended, false, true),
        ]
    );
    assert_eq!(p.engine.open_calls(), 0);
    p.done_reading(call);
    p.drive();
    assert_eq!((p.engine_free.in_use(), p.app_free.in_use()), (0, 0));
}

#[test]
fn a_streaming_call_takes_further_requests_until_the_end() {
    let mut p = Pair::new();
    let call = p.engine.open_call(()).expect("attached");
    let open = Descriptor { call, flags: desc::OPEN | desc::MESSAGE, ..Descriptor::default() };
    assert!(p.post_request(open, 64, &[]));
    let more = Descriptor { call, flags: desc::MESSAGE, ..Descriptor::default() };
    assert!(p.post_request(more, 64, &[]));
    let end = Descriptor { call, flags: desc::END, ..Descriptor::default() };
    assert!(p.post_request(end, 0, &[]));
    p.app_takes();
    assert!(matches!(p.app_seen[0], AppSeen::Opened { call: c, taken: Some(_) } if c == call));
    assert_eq!(
        p.app_seen[1..],
        [
            AppSeen::More { call, running: true, end: false },
            AppSeen::More { call, running: true, end: true }
        ]
    );
    assert_eq!(p.app.held(), 2, "both requests are read in place");
}

#[test]
fn requests_in_one_receive_buffer_share_its_chunk_until_the_last_release() {
    let mut p = Pair::new();
    // A receive buffer: the wire bytes of two requests, each block in a
    // chunk of its own.
    let buffer = p.engine_free.alloc(4096).expect("a chunk");
    let token = crate::util::Token(buffer.offset);
    let mut calls = Vec::new();
    for i in 0..2u32 {
        let call = p.engine.open_call(()).expect("attached");
        let wire = Span { offset: buffer.offset + i * 512, len: 512 };
        let d = Descriptor {
            call,
            flags: desc::OPEN | desc::MESSAGE | desc::END,
            wire,
            ..Descriptor::default()
        };
        let mut d = d;
        let block = p.engine_free.alloc(64).expect("a chunk");
        d.block = Span { offset: block.offset, len: 64 };
        d.chunk = block.offset;
        let block_token = crate::util::Token(block.offset);
        p.engine.hand_over(&mut d, &[(block, &block_token), (buffer, &token)]).expect("attached");
        p.requests.push_back(d);
        calls.push(call);
    }
    p.app_takes();
    for (i, call) in calls.iter().enumerate() {
        let AppSeen::Opened { taken: Some(t), .. } = &p.app_seen[i] else {
            panic!("{:?}", p.app_seen)
        };
        assert_eq!(t.landing, Some(buffer), "call {call}'s wire bytes are in the buffer");
    }
    assert_eq!(p.app.held(), 4, "two blocks, and the buffer twice");

    p.done_reading(calls[0]);
    p.app.remove_call(calls[0]);
    p.reply(calls[0], desc::STATUS | desc::END, 0, 0);
    p.drive();
    assert_eq!(p.engine_free.in_use(), 2, "the buffer stays handed for the second request");

    p.done_reading(calls[1]);
    p.app.remove_call(calls[1]);
    p.reply(calls[1], desc::STATUS | desc::END, 0, 0);
    p.drive();
    assert_eq!(p.engine_free.in_use(), 0, "the buffer came back with its last release");
    assert!(p.violation.is_none(), "{:?}", p.violation);
}

#[test]
fn an_owed_release_rides_on_the_next_request() {
    let mut p = Pair::new();
    let first = p.open(0);
    p.app_takes();
    p.app.remove_call(first);
    let reply = p.reply(first, desc::MESSAGE | desc::STATUS | desc::END, 16, 0);
    p.engine_takes();
    assert_eq!(p.engine.owed().1, [reply.chunk]);

    let second = p.open(0);
    let request = *p.requests.back().expect("the request");
    assert_eq!((request.call, request.release), (second, reply.chunk));
    assert!(!p.engine.owes(), "nothing left to post on its own");
    p.app_takes();
    assert_eq!(p.app_free.in_use(), 0, "the response's chunk came back with it");
}

#[test]
fn a_deadline_crosses_as_the_time_left() {
    use std::time::{Duration, Instant};

    use protoplane_seam::{app, engine};

    let t0 = Instant::now();
    let deadline = t0 + Duration::from_millis(5);
    // Posted 1 ms after the call's deadline was set: 4 ms left.
    let left = engine::timeout_ns(Some(deadline), t0 + Duration::from_millis(1));
    assert_eq!(left, 4_000_000);
    let open = Descriptor { call: 1, flags: desc::OPEN, timeout_ns: left, ..Descriptor::default() };
    let taken = t0 + Duration::from_millis(2);
    assert_eq!(app::deadline(&open, taken), Some(taken + Duration::from_millis(4)));
    // No deadline is 0; one already passed still is one (1 ns).
    assert_eq!(engine::timeout_ns(None, t0), 0);
    assert_eq!(app::deadline(&Descriptor { timeout_ns: 0, ..open }, taken), None);
    assert_eq!(engine::timeout_ns(Some(t0), deadline), 1);
}
