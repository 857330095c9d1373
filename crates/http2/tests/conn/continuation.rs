//! Header blocks across HEADERS and CONTINUATION frames (RFC 9113 §4.3,
//! §6.10), their bounds, and the field checks of §8.2 and §8.3.

use protoplane_http2::conn::{Config, Role};
use protoplane_http2::frame::{flag, kind, Reason};

use crate::util::{assert_conn_error, raw, request_block, Pair, Seen, Side};

#[test]
fn a_large_header_block_goes_out_in_continuation_frames() {
    let mut server = Config::new(Role::Server);
    server.max_header_list = 128 << 10;
    let mut p = Pair::with(Config::new(Role::Client), server);
    p.drive();
    let big = "v".repeat(40_000);
    let id = p.request("/s/m", &[("x-big", &big)], true);
    p.drive();
    let blocks: Vec<_> = p
        .client
        .wrote
        .iter()
        .filter(|f| f.0 == kind::HEADERS || f.0 == kind::CONTINUATION)
        .collect();
    assert_eq!(blocks[0].0, kind::HEADERS);
    assert!(blocks.len() >= 2, "{} frames", blocks.len());
    assert!(blocks[1..].iter().all(|f| f.0 == kind::CONTINUATION));
    let ends: Vec<bool> = blocks.iter().map(|f| f.1 & flag::END_HEADERS != 0).collect();
    assert_eq!(ends.iter().filter(|e| **e).count(), 1);
    assert!(ends[ends.len() - 1]);
    match p.server.take().as_slice() {
        [Seen::Open { stream, end_stream: true, fields, too_large: false, .. }] => {
            assert_eq!(*stream, id);
            assert!(fields.contains(&(b"x-big".to_vec(), big.into_bytes())));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_block_split_at_every_byte_decodes_the_same() {
    let block = request_block("/s/m", &[("x-a", "one"), ("x-b", "two")]);
    let mut p = Pair::connected();
    p.inject(Side::Client, &raw(kind::HEADERS, 0, 101, &block[..1]));
    for (i, b) in block[1..].iter().enumerate() {
        let last = i == block.len() - 2;
        p.inject(
            Side::Client,
            &raw(kind::CONTINUATION, if last { flag::END_HEADERS } else { 0 }, 101, &[*b]),
        );
    }
    match p.server.take().as_slice() {
        [Seen::Open { stream: 101, path, fields, .. }] => {
            assert_eq!(path, b"/s/m");
            assert!(fields.contains(&(b"x-b".to_vec(), b"two".to_vec())));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_frame_inside_a_header_block_is_a_connection_error() {
    let block = request_block("/s/m", &[]);
    for interloper in [
        raw(kind::PING, 0, 0, &[0; 8]),
        raw(kind::CONTINUATION, flag::END_HEADERS, 103, &block[4..]),
    ] {
        let mut p = Pair::connected();
        p.inject(Side::Client, &raw(kind::HEADERS, 0, 101, &block[..4]));
        p.inject(Side::Client, &interloper);
        assert_conn_error(&p.server, Reason::PROTOCOL_ERROR);
    }
}

#[test]
fn continuation_without_headers_is_a_connection_error() {
    let mut p = Pair::connected();
    p.inject(
        Side::Client,
        &raw(kind::CONTINUATION, flag::END_HEADERS, 101, &request_block("/s/m", &[])),
    );
    assert_conn_error(&p.server, Reason::PROTOCOL_ERROR);
}

#[test]
fn endless_continuation_is_cut_off_by_count_and_by_size() {
    let mut p = Pair::connected();
    p.inject(Side::Client, &raw(kind::HEADERS, 0, 101, &request_block("/s/m", &[])));
    for _ in 0..100 {
        p.inject(Side::Client, &raw(kind::CONTINUATION, 0, 101, &[]));
        if p.server.error.is_some() {
            break;
        }
    }
    assert_conn_error(&p.server, Reason::ENHANCE_YOUR_CALM);

    let mut p = Pair::connected();
    p.inject(Side::Client, &raw(kind::HEADERS, 0, 101, &request_block("/s/m", &[])));
    for _ in 0..10 {
        p.inject(Side::Client, &raw(kind::CONTINUATION, 0, 101, &[0x40; 16_000]));
        if p.server.error.is_some() {
            break;
        }
    }
    assert_conn_error(&p.server, Reason::ENHANCE_YOUR_CALM);
}

#[test]
fn an_oversized_header_list_is_reported_on_its_stream_only() {
    let mut p = Pair::connected();
    let big = "v".repeat(20_000);
    let id = p.request("/s/m", &[("x-big", &big)], true);
    p.drive();
    assert!(
        matches!(p.server.take().as_slice(), [Seen::Open { stream, too_large: true, .. }] if *stream == id)
    );
    assert!(p.server.error.is_none());
    // The HPACK state survived: the next block decodes.
    let id = p.request("/s/m", &[("x-small", "v")], true);
    p.drive();
    assert!(
        matches!(p.server.take().as_slice(), [Seen::Open { stream, too_large: false, .. }] if *stream == id)
    );
}

#[test]
fn malformed_blocks_reset_their_stream_only() {
    let bad: &[&[(&str, &str)]] = &[
        &[("X-Upper", "v")],
        &[("connection", "close")],
        &[("te", "gzip")],
        &[("x-nul", "a\0b")],
        &[("content-length", "x")],
    ];
    let mut p = Pair::connected();
    let mut id = 101;
    for fields in bad {
        p.inject(
            Side::Client,
            &raw(
                kind::HEADERS,
                flag::END_HEADERS | flag::END_STREAM,
                id,
                &request_block("/s/m", fields),
            ),
        );
        assert_eq!(
            p.server.resets_sent().last(),
            Some(&(id, Reason::PROTOCOL_ERROR)),
            "{fields:?}"
        );
        id += 2;
    }
    assert!(p.server.error.is_none());
    assert!(!p.server.seen.iter().any(|s| matches!(s, Seen::Open { .. })));
}

#[test]
fn trailers_follow_the_data_and_end_the_stream() {
    let mut p = Pair::connected();
    let id = p.request("/s/m", &[], true);
    p.drive();
    p.respond(id, false);
    p.server.conn.send_data(id, bytes::Bytes::from_static(b"answer"), false);
    p.finish(id);
    p.drive();
    match p.client.take().as_slice() {
        [Seen::Headers { status, end_stream: false, .. }, Seen::Data { data, end_stream: false, .. }, Seen::Trailers { fields, .. }] =>
        {
            assert_eq!(status, b"200");
            assert_eq!(&data[..], b"answer");
            assert_eq!(fields, &[(b"grpc-status".to_vec(), b"0".to_vec())]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!((p.client.conn.open_streams(), p.server.conn.open_streams()), (0, 0));
}
