//! Resets both ways and the budgets a peer spends: streams it abandons
//! (rapid reset, CVE-2023-44487), frames that make no progress
//! (CVE-2019-9512/9518), streams beyond the concurrency limit.

use bytes::Bytes;
use protoplane_http2::conn::{Config, Role};
use protoplane_http2::frame::{flag, kind, Reason};

use crate::util::{assert_conn_error, be32, raw, request_block, Pair, Seen, Side};

#[test]
fn a_client_reset_reaches_the_server() {
    let mut p = Pair::connected();
    let id = p.request("/s/m", &[], false);
    p.drive();
    assert!(p.server.conn.is_open(id));
    p.client.conn.reset(id, Reason::CANCEL);
    p.drive();
    assert_eq!(
        p.server.take().last(),
        Some(&Seen::Reset { stream: id, reason: Reason::CANCEL, by_peer: true })
    );
    assert_eq!(p.server.conn.open_streams(), 0);
    assert_eq!(p.client.conn.open_streams(), 0);
    // Frames the server sent before it saw the reset are dropped quietly.
    p.respond(id, false);
    p.drive();
    assert!(p.client.error.is_none() && p.client.take().is_empty());
}

#[test]
fn rapid_reset_ends_the_connection_once_the_budget_is_spent() {
    let mut server = Config::new(Role::Server);
    server.reset_budget = 10;
    let mut p = Pair::with(Config::new(Role::Client), server);
    p.drive();
    let mut opened = 0;
    for _ in 0..20 {
        let Some(id) = p.client.conn.open_stream() else { break };
        p.client.conn.send_headers(id, false, |s| crate::util::request_fields(s, "/s/m", &[]));
        p.client.conn.reset(id, Reason::CANCEL);
        p.drive();
        opened += 1;
        if p.server.error.is_some() {
            break;
        }
    }
    assert_conn_error(&p.server, Reason::ENHANCE_YOUR_CALM);
    assert_eq!(opened, 10, "the tenth abandoned stream spends the budget");
    assert!(p.client.conn.peer_gone_away() && !p.client.conn.can_open());
}

#[test]
fn resets_of_streams_open_long_enough_cost_nothing_but_rapid_ones_do() {
    let mut server = Config::new(Role::Server);
    server.reset_budget = 10;
    let mut p = Pair::with(Config::new(Role::Client), server);
    p.drive();
    let mut now = 1;
    // Calls given up on after 10 ms each (a hedge that lost, a deadline):
    // far more than the budget, and the connection stays.
    for _ in 0..100 {
        p.server.conn.set_clock(now);
        let id = p.request("/s/m", &[], true);
        p.drive();
        now += 10;
        p.server.conn.set_clock(now);
        p.client.conn.reset(id, Reason::CANCEL);
        p.drive();
        assert!(p.server.error.is_none(), "{:?}", p.server.error);
    }
    // The same with a clock that does not move: rapid resets.
    for i in 0..20 {
        let id = p.request("/s/m", &[], true);
        p.client.conn.reset(id, Reason::CANCEL);
        p.drive();
        if p.server.error.is_some() {
            assert_eq!(i, 9, "the tenth rapid reset spends the budget");
            break;
        }
    }
    assert_conn_error(&p.server, Reason::ENHANCE_YOUR_CALM);
}

#[test]
fn completed_calls_refill_the_reset_budget() {
    let mut server = Config::new(Role::Server);
    server.reset_budget = 10;
    let mut p = Pair::with(Config::new(Role::Client), server);
    p.drive();
    for _ in 0..100 {
        let done = p.request("/s/m", &[], true);
        p.drive();
        p.respond(done, false);
        p.server.conn.send_data(done, Bytes::from_static(b"ok"), false);
        p.finish(done);
        let cancelled = p.request("/s/m", &[], false);
        p.client.conn.reset(cancelled, Reason::CANCEL);
        p.drive();
    }
    assert!(p.server.error.is_none(), "{:?}", p.server.error);
    assert_eq!(p.server.conn.open_streams(), 0);
}

#[test]
fn streams_beyond_the_limit_are_refused() {
    let mut server = Config::new(Role::Server);
    server.max_concurrent_streams = 2;
    let mut p = Pair::with(Config::new(Role::Client), server);
    p.drive();
    // A well-behaved client keeps to the limit it was told...
    let a = p.request("/s/m", &[], false);
    let _b = p.request("/s/m", &[], false);
    assert!(!p.client.conn.can_open() && p.client.conn.open_stream().is_none());
    p.drive();
    // ...a raw one does not: its third stream is refused, not opened.
    p.inject(
        Side::Client,
        &raw(kind::HEADERS, flag::END_HEADERS, 101, &request_block("/s/m", &[])),
    );
    assert_eq!(p.server.resets_sent(), vec![(101, Reason::REFUSED_STREAM)]);
    let opens = p.server.take().iter().filter(|s| matches!(s, Seen::Open { .. })).count();
    assert_eq!(opens, 2);
    // A closed stream frees a place.
    p.client.conn.reset(a, Reason::CANCEL);
    p.drive();
    assert!(p.client.conn.can_open());
}

#[test]
fn an_early_answer_resets_the_rest_of_the_request_unless_read_to_end() {
    let mut p = Pair::connected();
    let id = p.request("/s/m", &[], false);
    p.drive();
    p.server.conn.send_headers(id, true, |s| {
        s.field(b":status", b"200", protoplane_http2::hpack::Index::Yes);
        s.field(b"grpc-status", b"12", protoplane_http2::hpack::Index::No);
    });
    p.drive();
    assert_eq!(p.server.resets_sent(), vec![(id, Reason::NO_ERROR)]);
    assert!(matches!(
        p.client.take()[..],
        [
            Seen::Headers { end_stream: true, .. },
            Seen::Reset { reason: Reason::NO_ERROR, by_peer: true, .. }
        ]
    ));

    // read_to_end: the server keeps reading the request to its end.
    let id = p.request("/s/m", &[], false);
    p.drive();
    p.server.conn.read_to_end(id);
    p.server.conn.send_headers(id, true, |s| {
        s.field(b":status", b"405", protoplane_http2::hpack::Index::Yes)
    });
    p.client.conn.send_data(id, Bytes::from_static(b"rest"), true);
    p.drive();
    assert_eq!(p.server.resets_sent().len(), 1, "no second reset");
    assert_eq!(p.server.body(id), (b"rest".to_vec(), true));
    assert_eq!(p.server.conn.open_streams(), 0);
}

#[test]
fn frames_without_progress_end_the_connection_after_the_budget() {
    let mut server = Config::new(Role::Server);
    server.idle_frame_budget = 50;
    let mut p = Pair::with(Config::new(Role::Client), server);
    p.drive();
    for i in 0..60u64 {
        p.inject(Side::Client, &raw(kind::PING, 0, 0, &i.to_be_bytes()));
        if p.server.error.is_some() {
            // The client's SETTINGS and its connection-window grant moved
            // nothing either: 2 + 48 = 50 frames without progress in a row.
            assert_eq!(i, 48, "the 51st idle frame is one too many");
            break;
        }
    }
    assert_conn_error(&p.server, Reason::ENHANCE_YOUR_CALM);
    // Each PING before that was answered.
    assert_eq!(p.server.wrote_kind(kind::PING).iter().filter(|f| f.1 & flag::ACK != 0).count(), 48);
}

#[test]
fn progress_refills_the_idle_budget() {
    let mut server = Config::new(Role::Server);
    server.idle_frame_budget = 50;
    let mut p = Pair::with(Config::new(Role::Client), server);
    p.drive();
    for round in 0..5u32 {
        for i in 0..40u64 {
            p.inject(Side::Client, &raw(kind::PING, 0, 0, &i.to_be_bytes()));
        }
        // An empty DATA frame moves nothing either; one with bytes does.
        let id = 101 + 2 * round;
        p.inject(
            Side::Client,
            &raw(kind::HEADERS, flag::END_HEADERS, id, &request_block("/s/m", &[])),
        );
        p.inject(Side::Client, &raw(kind::DATA, 0, id, b""));
        p.inject(Side::Client, &raw(kind::DATA, flag::END_STREAM, id, b"x"));
    }
    assert!(p.server.error.is_none(), "{:?}", p.server.error);
}

#[test]
fn a_reset_of_an_idle_stream_is_a_connection_error() {
    let mut p = Pair::connected();
    p.inject(Side::Client, &raw(kind::RST_STREAM, 0, 99, &be32(8)));
    assert_conn_error(&p.server, Reason::PROTOCOL_ERROR);
}

#[test]
fn priority_is_checked_and_otherwise_ignored() {
    let mut p = Pair::connected();
    // A stream that depends on itself is a stream error (RFC 9113 §5.3.1).
    p.inject(Side::Client, &raw(kind::PRIORITY, 0, 101, &[0, 0, 0, 101, 16]));
    assert_eq!(p.server.resets_sent(), vec![(101, Reason::PROTOCOL_ERROR)]);
    // A well-formed one changes nothing; a short one is a stream error.
    p.inject(Side::Client, &raw(kind::PRIORITY, 0, 103, &[0, 0, 0, 1, 16]));
    p.inject(Side::Client, &raw(kind::PRIORITY, 0, 105, &[0, 0, 0]));
    p.drive();
    assert_eq!(
        p.server.resets_sent(),
        vec![(101, Reason::PROTOCOL_ERROR), (105, Reason::FRAME_SIZE_ERROR)]
    );
    assert!(p.server.error.is_none());
}
