//! The connection preface and SETTINGS (RFC 9113 §3.4, §6.5): ours sent
//! first and acknowledged, the peer's applied in order and checked.

use bytes::Bytes;
use protoplane_http2::conn::{Config, Role};
use protoplane_http2::frame::{flag, kind, setting, Reason, PREFACE};

use crate::util::{assert_conn_error, pattern, raw, Pair, Side};

fn settings(values: &[(u16, u32)]) -> Vec<u8> {
    let mut payload = Vec::new();
    for (id, v) in values {
        payload.extend_from_slice(&id.to_be_bytes());
        payload.extend_from_slice(&v.to_be_bytes());
    }
    raw(kind::SETTINGS, 0, 0, &payload)
}

fn values(payload: &[u8]) -> Vec<(u16, u32)> {
    payload
        .chunks_exact(6)
        .map(|c| (u16::from_be_bytes([c[0], c[1]]), u32::from_be_bytes([c[2], c[3], c[4], c[5]])))
        .collect()
}

#[test]
fn prefaces_and_settings_are_exchanged_and_acknowledged() {
    let mut p = Pair::new();
    assert!(!p.client.conn.is_established() && !p.server.conn.is_established());
    p.drive();
    assert!(p.client.conn.is_established() && p.server.conn.is_established());
    for end in [&p.client, &p.server] {
        let frames = end.wrote_kind(kind::SETTINGS);
        let (acks, ours): (Vec<_>, Vec<_>) = frames.into_iter().partition(|f| f.1 & flag::ACK != 0);
        assert_eq!((acks.len(), ours.len()), (1, 1), "one SETTINGS and one acknowledgement each");
        assert!(values(&ours[0].3).contains(&(setting::MAX_CONCURRENT_STREAMS, 1024)));
    }
    assert!(values(&p.client.wrote_kind(kind::SETTINGS)[0].3).contains(&(setting::ENABLE_PUSH, 0)));
    // The larger connection window is announced at once.
    let grants = p.server.wrote_kind(kind::WINDOW_UPDATE);
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0].2, 0);
}

#[test]
fn every_split_of_the_bytes_gives_the_same_call() {
    for chunk in [1, 7, 9, 100] {
        let mut p = Pair::new();
        p.chunk = chunk;
        let id = p.request("/s/m", &[("x-a", "b")], false);
        p.client.conn.send_data(id, Bytes::from(pattern(40_000)), true);
        p.drive();
        p.respond(id, false);
        p.server.conn.send_data(id, Bytes::from(pattern(30_000)), false);
        p.finish(id);
        p.drive();
        assert_eq!(p.server.body(id), (pattern(40_000), true), "chunk {chunk}");
        assert_eq!(p.client.body(id).0, pattern(30_000), "chunk {chunk}");
        assert!(p.client.error.is_none() && p.server.error.is_none());
    }
}

#[test]
fn a_new_initial_window_moves_open_streams() {
    let mut p = Pair::connected();
    let id = p.request("/s/m", &[], true);
    p.drive();
    // The client (here, raw) shrinks every stream's window to 1000 bytes.
    p.inject(Side::Client, &settings(&[(setting::INITIAL_WINDOW_SIZE, 1000)]));
    p.respond(id, false);
    p.server.conn.send_data(id, Bytes::from(pattern(10_000)), false);
    p.drive();
    assert_eq!(p.client.body(id).0.len(), 1000);
    assert_eq!(p.server.conn.pending(id), 9000);
    // ...and grows it again: what waited goes out.
    p.inject(Side::Client, &settings(&[(setting::INITIAL_WINDOW_SIZE, 1 << 20)]));
    assert_eq!(p.server.conn.pending(id), 0);
    assert_eq!(p.client.body(id).0, pattern(10_000));
}

#[test]
fn invalid_settings_are_connection_errors() {
    let cases: &[(Vec<u8>, Reason)] = &[
        (settings(&[(setting::MAX_FRAME_SIZE, 100)]), Reason::PROTOCOL_ERROR),
        (settings(&[(setting::MAX_FRAME_SIZE, 1 << 24)]), Reason::PROTOCOL_ERROR),
        (settings(&[(setting::INITIAL_WINDOW_SIZE, 1 << 31)]), Reason::FLOW_CONTROL_ERROR),
        (settings(&[(setting::ENABLE_PUSH, 2)]), Reason::PROTOCOL_ERROR),
        (raw(kind::SETTINGS, 0, 1, &[]), Reason::PROTOCOL_ERROR),
        (raw(kind::SETTINGS, 0, 0, &[0; 5]), Reason::FRAME_SIZE_ERROR),
        (raw(kind::SETTINGS, flag::ACK, 0, &[0; 6]), Reason::FRAME_SIZE_ERROR),
    ];
    for (frame, reason) in cases {
        let mut p = Pair::connected();
        p.inject(Side::Client, frame);
        assert_conn_error(&p.server, *reason);
    }
    // A server may not enable push.
    let mut p = Pair::connected();
    p.inject(Side::Server, &settings(&[(setting::ENABLE_PUSH, 1)]));
    assert_conn_error(&p.client, Reason::PROTOCOL_ERROR);
}

#[test]
fn a_window_pushed_past_the_limit_by_settings_is_an_error() {
    let mut p = Pair::connected();
    let id = p.request("/s/m", &[], true);
    p.drive();
    p.inject(
        Side::Client,
        &raw(kind::WINDOW_UPDATE, 0, id, &(0x7fff_ffffu32 - (1 << 20)).to_be_bytes()),
    );
    assert!(p.server.error.is_none());
    p.inject(Side::Client, &settings(&[(setting::INITIAL_WINDOW_SIZE, (1 << 20) + 1)]));
    assert_conn_error(&p.server, Reason::FLOW_CONTROL_ERROR);
}

#[test]
fn the_preface_and_then_settings_come_first() {
    let mut p = Pair::with(Config::new(Role::Client), Config::new(Role::Server));
    p.inject(Side::Client, b"GET / HTTP/1.1\r\n\r\n");
    assert_conn_error(&p.server, Reason::PROTOCOL_ERROR);

    let mut p = Pair::with(Config::new(Role::Client), Config::new(Role::Server));
    let mut bytes = PREFACE.to_vec();
    bytes.extend_from_slice(&raw(kind::PING, 0, 0, &[0; 8]));
    p.inject(Side::Client, &bytes);
    assert_conn_error(&p.server, Reason::PROTOCOL_ERROR);
}

#[test]
fn an_acknowledgement_of_nothing_makes_no_progress() {
    let mut server = Config::new(Role::Server);
    server.idle_frame_budget = 5;
    let mut p = Pair::with(Config::new(Role::Client), server);
    p.drive();
    for _ in 0..6 {
        p.inject(Side::Client, &raw(kind::SETTINGS, flag::ACK, 0, &[]));
    }
    assert_conn_error(&p.server, Reason::ENHANCE_YOUR_CALM);
}
