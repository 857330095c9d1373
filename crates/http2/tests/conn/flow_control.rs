//! Flow control (RFC 9113 §5.2, §6.9): both directions, both levels
//! (stream and connection), credit returned only as the reader consumes.

use bytes::Bytes;
use protoplane_http2::conn::{Config, Role};
use protoplane_http2::frame::{flag, kind, Reason, DEFAULT_WINDOW};

use crate::util::{assert_conn_error, be32, pattern, raw, request_block, Pair, Seen, Side};

#[test]
fn a_body_larger_than_every_window_arrives_whole() {
    let mut p = Pair::connected();
    let id = p.request("/s/m", &[], false);
    let body = pattern(5 << 20);
    p.client.conn.send_data(id, Bytes::from(body.clone()), true);
    p.drive();
    assert_eq!(p.server.body(id), (body, true));
    // Never a frame larger than the peer allows.
    assert!(p.client.wrote_kind(kind::DATA).iter().all(|f| f.3.len() <= 16_384));
    assert!(p.client.error.is_none() && p.server.error.is_none());
}

#[test]
fn an_unread_stream_stops_at_its_window_and_resumes_on_release() {
    let mut server = Config::new(Role::Server);
    server.stream_window = DEFAULT_WINDOW;
    let mut p = Pair::with(Config::new(Role::Client), server);
    p.server.auto_release = false;
    p.drive();
    let id = p.request("/s/m", &[], false);
    let total = 200_000;
    p.client.conn.send_data(id, Bytes::from(pattern(total)), true);
    p.drive();
    let got = p.server.body(id).0.len();
    assert_eq!(got, DEFAULT_WINDOW as usize, "exactly the stream window arrives");
    assert_eq!(p.client.conn.pending(id), total - got);
    // The reader consumes what it has: credit goes back, the rest flows.
    let mut released = 0;
    while released < total {
        let have = p.server.body(id).0.len();
        assert!(have > released, "no progress after releasing {released} bytes");
        p.server.conn.release(id, have - released);
        released = have;
        p.drive();
    }
    assert_eq!(p.server.body(id), (pattern(total), true));
    assert_eq!(p.client.conn.pending(id), 0);
}

#[test]
fn streams_take_turns_at_the_connection_window() {
    let mut server = Config::new(Role::Server);
    server.connection_window = DEFAULT_WINDOW;
    let mut p = Pair::with(Config::new(Role::Client), server);
    p.server.auto_release = false;
    p.drive();
    let a = p.request("/s/a", &[], false);
    let b = p.request("/s/b", &[], false);
    p.client.conn.send_data(a, Bytes::from(pattern(60_000)), true);
    p.client.conn.send_data(b, Bytes::from(pattern(60_000)), true);
    p.drive();
    let got = p.server.body(a).0.len() + p.server.body(b).0.len();
    assert_eq!(got, DEFAULT_WINDOW as usize, "the connection window bounds both streams");
    let (mut ra, mut rb) = (0, 0);
    for _ in 0..10 {
        let (la, lb) = (p.server.body(a).0.len(), p.server.body(b).0.len());
        p.server.conn.release(a, la - ra);
        p.server.conn.release(b, lb - rb);
        (ra, rb) = (la, lb);
        p.drive();
    }
    assert_eq!(p.server.body(a), (pattern(60_000), true));
    assert_eq!(p.server.body(b), (pattern(60_000), true));
    assert_eq!(p.client.conn.pending(a) + p.client.conn.pending(b), 0);
}

#[test]
fn a_server_sends_only_what_the_client_grants() {
    let mut client = Config::new(Role::Client);
    client.stream_window = DEFAULT_WINDOW;
    let mut p = Pair::with(client, Config::new(Role::Server));
    p.client.auto_release = false;
    p.drive();
    let id = p.request("/s/m", &[], true);
    p.drive();
    p.respond(id, false);
    p.server.conn.send_data(id, Bytes::from(pattern(100_000)), false);
    p.finish(id);
    p.drive();
    assert_eq!(p.client.body(id).0.len(), DEFAULT_WINDOW as usize);
    assert_eq!(p.server.conn.pending(id), 100_000 - DEFAULT_WINDOW as usize);
    assert!(
        !p.client.seen.iter().any(|s| matches!(s, Seen::Trailers { .. })),
        "trailers wait behind the data"
    );
    p.client.conn.release(id, DEFAULT_WINDOW as usize);
    p.drive();
    p.client.conn.release(id, 100_000 - DEFAULT_WINDOW as usize);
    p.drive();
    assert_eq!(p.client.body(id).0, pattern(100_000));
    assert!(p
        .client
        .seen
        .iter()
        .any(|s| matches!(s, Seen::Trailers { stream, .. } if *stream == id)));
}

/// A server whose peer is raw frames from a test: prefaces exchanged.
fn raw_server(cfg: Config) -> Pair {
    let mut p = Pair::with(Config::new(Role::Client), cfg);
    p.drive();
    p
}

fn open_raw(p: &mut Pair, id: u32) {
    p.inject(Side::Client, &raw(kind::HEADERS, flag::END_HEADERS, id, &request_block("/s/m", &[])));
    assert!(matches!(p.server.take().last(), Some(Seen::Open { stream, .. }) if *stream == id));
}

#[test]
fn data_beyond_the_connection_window_is_a_connection_error() {
    let mut cfg = Config::new(Role::Server);
    cfg.connection_window = DEFAULT_WINDOW;
    let mut p = raw_server(cfg);
    p.server.auto_release = false;
    open_raw(&mut p, 101);
    for _ in 0..5 {
        p.inject(Side::Client, &raw(kind::DATA, 0, 101, &[0; 16_384]));
    }
    assert_conn_error(&p.server, Reason::FLOW_CONTROL_ERROR);
}

#[test]
fn data_beyond_a_stream_window_resets_only_that_stream() {
    let mut cfg = Config::new(Role::Server);
    cfg.stream_window = 16_384;
    let mut p = raw_server(cfg);
    p.server.auto_release = false;
    open_raw(&mut p, 101);
    p.inject(Side::Client, &raw(kind::DATA, 0, 101, &[0; 16_384]));
    p.inject(Side::Client, &raw(kind::DATA, 0, 101, &[0; 1]));
    assert!(p.server.error.is_none());
    assert_eq!(p.server.resets_sent(), vec![(101, Reason::FLOW_CONTROL_ERROR)]);
    assert!(p.server.take().contains(&Seen::Reset {
        stream: 101,
        reason: Reason::FLOW_CONTROL_ERROR,
        by_peer: false
    }));
    // The connection goes on.
    open_raw(&mut p, 103);
}

#[test]
fn padding_is_credited_at_once() {
    let mut p = raw_server(Config::new(Role::Server));
    p.server.auto_release = false;
    open_raw(&mut p, 101);
    let mut payload = vec![200u8];
    payload.extend_from_slice(b"ten bytes!");
    payload.extend_from_slice(&[0; 200]);
    p.inject(Side::Client, &raw(kind::DATA, flag::PADDED, 101, &payload));
    p.drive();
    assert_eq!(p.server.body(101).0, b"ten bytes!");
    let updates: Vec<_> =
        p.server.wrote_kind(kind::WINDOW_UPDATE).into_iter().filter(|f| f.2 == 101).collect();
    assert_eq!(updates.len(), 1);
    // The pad length octet and the padding count against the windows too.
    assert_eq!(updates[0].3, be32(201), "the padding comes back as credit, the data does not");
}

#[test]
fn padding_longer_than_the_frame_is_a_connection_error() {
    let mut p = raw_server(Config::new(Role::Server));
    open_raw(&mut p, 101);
    p.inject(Side::Client, &raw(kind::DATA, flag::PADDED, 101, &[10, 1, 2, 3]));
    assert_conn_error(&p.server, Reason::PROTOCOL_ERROR);
}

#[test]
fn window_overflow_resets_the_stream_or_ends_the_connection() {
    let mut p = raw_server(Config::new(Role::Server));
    open_raw(&mut p, 101);
    p.inject(Side::Client, &raw(kind::WINDOW_UPDATE, 0, 101, &be32(0x7fff_ffff)));
    assert!(p.server.error.is_none());
    assert_eq!(p.server.resets_sent(), vec![(101, Reason::FLOW_CONTROL_ERROR)]);
    p.inject(Side::Client, &raw(kind::WINDOW_UPDATE, 0, 0, &be32(0x7fff_ffff)));
    assert_conn_error(&p.server, Reason::FLOW_CONTROL_ERROR);
}

#[test]
fn a_zero_increment_is_an_error_at_its_level() {
    let mut p = raw_server(Config::new(Role::Server));
    open_raw(&mut p, 101);
    p.inject(Side::Client, &raw(kind::WINDOW_UPDATE, 0, 101, &be32(0)));
    assert_eq!(p.server.resets_sent(), vec![(101, Reason::PROTOCOL_ERROR)]);
    assert!(p.server.error.is_none());
    p.inject(Side::Client, &raw(kind::WINDOW_UPDATE, 0, 0, &be32(0)));
    assert_conn_error(&p.server, Reason::PROTOCOL_ERROR);
}

#[test]
fn data_that_waited_for_credit_counts_as_sent_when_it_goes_out() {
    // A client that pings as it reads (grpc-go's BDP pings, each after a
    // WINDOW_UPDATE) must find the server sending: the keepalive policy
    // forgives pings that follow stream frames.
    let mut client = Config::new(Role::Client);
    client.stream_window = DEFAULT_WINDOW;
    let mut p = Pair::with(client, Config::new(Role::Server));
    p.client.auto_release = false;
    p.drive();
    let id = p.request("/s/m", &[], true);
    p.drive();
    p.respond(id, false);
    p.server.conn.send_data(id, Bytes::from(pattern(200_000)), false);
    p.drive();
    assert!(p.server.conn.take_sent_stream_frames());
    assert!(p.server.conn.pending(id) > 0, "the rest waits for credit");
    assert!(!p.server.conn.take_sent_stream_frames(), "nothing went out since");
    let mut released = 0;
    for _ in 0..3 {
        let have = p.client.body(id).0.len();
        p.client.conn.release(id, have - released);
        released = have;
        p.drive();
        assert!(p.server.conn.take_sent_stream_frames(), "the credited data went out");
    }
}
