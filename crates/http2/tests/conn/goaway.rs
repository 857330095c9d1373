//! GOAWAY (RFC 9113 §6.8): a graceful shutdown lets open streams finish
//! and refuses new ones; a connection error ends with GOAWAY and the
//! connection stays dead.

use bytes::Bytes;
use protoplane_http2::frame::{flag, kind, Reason};

use crate::util::{assert_conn_error, raw, request_block, Pair, Seen, Side};

#[test]
fn a_graceful_goaway_lets_open_streams_finish() {
    let mut p = Pair::connected();
    let id = p.request("/s/m", &[], false);
    p.drive();
    p.server.conn.go_away(Reason::NO_ERROR, "draining");
    p.drive();
    assert!(p.server.conn.is_closing());
    assert_eq!(p.client.take(), vec![Seen::GoAway { last_stream: id, reason: Reason::NO_ERROR }]);
    assert!(p.client.conn.peer_gone_away() && !p.client.conn.can_open());
    assert_eq!(p.client.conn.open_stream(), None);
    // The open call goes on to its end.
    p.client.conn.send_data(id, Bytes::from_static(b"last words"), true);
    p.drive();
    p.respond(id, false);
    p.finish(id);
    p.drive();
    assert_eq!(p.server.body(id), (b"last words".to_vec(), true));
    assert!(matches!(p.client.take().last(), Some(Seen::Trailers { stream, .. }) if *stream == id));
    assert_eq!(p.server.goaway_sent(), Some((id, Reason::NO_ERROR, "draining".into())));
}

#[test]
fn streams_opened_after_goaway_are_refused() {
    let mut p = Pair::connected();
    p.server.conn.go_away(Reason::NO_ERROR, "");
    p.drive();
    p.inject(
        Side::Client,
        &raw(kind::HEADERS, flag::END_HEADERS, 101, &request_block("/s/m", &[])),
    );
    assert_eq!(p.server.resets_sent(), vec![(101, Reason::REFUSED_STREAM)]);
    assert!(!p.server.seen.iter().any(|s| matches!(s, Seen::Open { .. })));
    assert!(p.server.error.is_none());
}

#[test]
fn a_connection_error_ends_with_goaway_and_stays_dead() {
    let mut p = Pair::connected();
    let id = p.request("/s/m", &[], false);
    p.drive();
    p.inject(Side::Client, &raw(kind::PUSH_PROMISE, flag::END_HEADERS, id, &[0, 0, 0, 2]));
    assert_conn_error(&p.server, Reason::PROTOCOL_ERROR);
    assert_eq!(
        p.server.goaway_sent().map(|g| g.0),
        Some(id),
        "the last stream the server processed"
    );
    assert!(matches!(
        p.client.take().last(),
        Some(Seen::GoAway { reason: Reason::PROTOCOL_ERROR, .. })
    ));
    // Anything after the error gets the same error, and nothing is taken.
    let before = p.server.error.clone();
    let mut more = bytes::BytesMut::from(&raw(kind::PING, 0, 0, &[0; 8])[..]);
    assert_eq!(p.server.conn.next_event(&mut more).err(), before);
    assert_eq!(more.len(), 17);
}

#[test]
fn goaway_frames_are_checked() {
    for (frame, reason) in [
        (raw(kind::GOAWAY, 0, 1, &[0; 8]), Reason::PROTOCOL_ERROR),
        (raw(kind::GOAWAY, 0, 0, &[0; 7]), Reason::FRAME_SIZE_ERROR),
    ] {
        let mut p = Pair::connected();
        p.inject(Side::Client, &frame);
        assert_conn_error(&p.server, reason);
    }
}

#[test]
fn a_two_phase_goaway_serves_the_stream_that_raced_it() {
    let mut p = Pair::connected();
    p.server.conn.go_away_gracefully();
    // The server's first GOAWAY and PING are on the wire; the client,
    // not having read them, opens a stream (raw: its own `Conn` would
    // refuse once it has read the GOAWAY).
    let first = p.server.conn.output().take_all();
    assert!(!p.server.conn.is_closing(), "new streams are still taken");
    p.inject(
        Side::Client,
        &raw(kind::HEADERS, flag::END_HEADERS | flag::END_STREAM, 1, &request_block("/s/m", &[])),
    );
    assert!(p.server.resets_sent().is_empty(), "the racing stream is not refused");
    assert!(p.server.seen.iter().any(|s| matches!(s, Seen::Open { stream: 1, .. })));
    // Now the client reads the first phase and acknowledges the PING ...
    p.client.input.extend_from_slice(&first);
    p.drive();
    assert!(p.client.conn.peer_gone_away(), "the client opens nothing more");
    // ... and the server's final GOAWAY names the racing stream as taken.
    assert!(p.server.conn.is_closing());
    assert_eq!(p.server.goaway_sent().map(|g| (g.0, g.1)), Some((1, Reason::NO_ERROR)));
    p.inject(
        Side::Client,
        &raw(kind::HEADERS, flag::END_HEADERS | flag::END_STREAM, 3, &request_block("/s/m", &[])),
    );
    assert_eq!(p.server.resets_sent(), vec![(3, Reason::REFUSED_STREAM)]);
}

#[test]
fn pings_are_answered_and_reported_and_stream_frames_are_noted() {
    let mut p = Pair::connected();
    p.client.take();
    p.server.take();
    assert!(!p.server.conn.take_sent_stream_frames());
    p.client.conn.ping(*b"keepaliv");
    p.drive();
    // The server answered on its own and says a ping came.
    assert_eq!(p.server.take(), vec![Seen::Ping { ack: false, payload: *b"keepaliv" }]);
    assert_eq!(p.client.take(), vec![Seen::Ping { ack: true, payload: *b"keepaliv" }]);
    // Control frames are not stream frames; a response is.
    assert!(!p.server.conn.take_sent_stream_frames());
    let id = p.request("/s/m", &[], true);
    p.drive();
    p.respond(id, true);
    assert!(p.server.conn.take_sent_stream_frames());
    assert!(!p.server.conn.take_sent_stream_frames(), "taken once");
    // A graceful shutdown's own PING is not reported.
    p.drive();
    p.client.take();
    p.server.conn.go_away_gracefully();
    p.drive();
    assert!(!p.server.take().iter().any(|s| matches!(s, Seen::Ping { .. })));
}
