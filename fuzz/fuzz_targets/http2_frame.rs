//! The HTTP/2 connection state machine (`http2::conn::Conn`, server role)
//! on a peer's bytes.
//!
//! Input: a control byte, then the bytes the peer sends. Control bit 0
//! puts a valid client preface and an empty SETTINGS before them (so that
//! most inputs reach the frame handlers; without it the input is the raw
//! connection, preface included). Bit 1 runs the connection with small
//! limits (streams, windows, header list, budgets) so that refusals and
//! ENHANCE_YOUR_CALM are reachable by short inputs. Bit 2 has the harness
//! answer requests as the gRPC server does (headers, data that may wait for
//! credit, trailers; received data released). Bits 3..=7 cut the input
//! into reads of 1..=31 bytes (0: one read).
//!
//! Properties, beyond "never panics":
//! * after an error nothing more is accepted: `next_event` keeps failing
//!   with the same reason, on the rest of the input and on a valid PING
//!   after it, and no frame follows the GOAWAY that ends the output;
//! * the output stays bounded: under 4 MiB for at most 64 KiB of input;
//! * the output is whole frames: every header parses with `Head::parse`,
//!   its length matches the payload that follows it (and the fixed sizes
//!   of SETTINGS, PING, WINDOW_UPDATE, RST_STREAM, GOAWAY), header blocks
//!   come whole (HEADERS then CONTINUATION on one stream) and decode with
//!   a fresh `hpack::Decoder`, the first frame is SETTINGS and an error
//!   ends with GOAWAY carrying its reason;
//! * DATA never exceeds the connection window the peer granted (its
//!   initial 65,535 plus the WINDOW_UPDATEs on stream 0 in the input);
//! * the cut does not matter: one read or many give the same events, the
//!   same error and the same bytes out, whether the output is taken at the
//!   end or written piecemeal through `slices` and `advance`.

#![no_main]

use std::io::IoSlice;

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use protoplane_http2::conn::{Config, Conn, ConnError, Event, Role};
use protoplane_http2::frame::{
    self, flag, kind, setting, Head, Reason, DEFAULT_WINDOW, HEADER_LEN, MAX_MAX_FRAME, PREFACE,
};
use protoplane_http2::hpack::{self, Index};

/// Inputs longer than this are skipped: the output bound is stated for it.
const MAX_INPUT: usize = 64 << 10;

/// The output bound for [`MAX_INPUT`] bytes in.
const MAX_OUTPUT: usize = 4 << 20;

/// Response data the harness sends in one run, at most: its own bytes must
/// not drown the bound on what the peer can make the connection write.
const DATA_BUDGET: usize = 256 << 10;

fn config(small: bool) -> Config {
    let mut c = Config::new(Role::Server);
    if small {
        c.max_concurrent_streams = 3;
        c.stream_window = 100;
        c.connection_window = 1000;
        c.max_header_list = 200;
        c.reset_budget = 4;
        c.idle_frame_budget = 8;
    }
    c
}

/// What one run saw.
#[derive(Debug, PartialEq)]
struct Outcome {
    events: Vec<String>,
    error: Option<ConnError>,
    out: Vec<u8>,
}

/// Takes what waits in the output: at once, or through `slices` and
/// `advance` in uneven steps as a socket would.
fn drain(conn: &mut Conn, piecemeal: bool, sink: &mut Vec<u8>) {
    let out = conn.output();
    if !piecemeal {
        sink.extend_from_slice(&out.take_all());
        return;
    }
    let mut step = 1usize;
    while !out.is_empty() {
        let before = out.len();
        let mut slices = [IoSlice::new(&[]); 3];
        let n = out.slices(&mut slices);
        assert!(n > 0, "a non-empty output gave no slice");
        let mut taken = 0;
        for s in &slices[..n] {
            let k = s.len().min(step - taken);
            sink.extend_from_slice(&s[..k]);
            taken += k;
            if taken == step {
                break;
            }
        }
        out.advance(taken);
        assert_eq!(out.len(), before - taken, "advance lost count");
        step = step * 3 + 1;
    }
}

/// The harness's answer to a request, the way the gRPC server frames one.
fn answer(conn: &mut Conn, stream: u32, data_left: &mut usize) {
    if stream.is_multiple_of(3) {
        conn.read_to_end(stream);
    }
    conn.send_headers(stream, false, |sink| {
        sink.field(b":status", b"200", Index::Yes);
        sink.field(b"content-type", b"application/grpc", Index::Yes);
        sink.field(b"x-stream", stream.to_string().as_bytes(), Index::No);
    });
    let n = ((stream as usize % 7) * 9000).min(*data_left);
    *data_left -= n;
    // Peer streams are odd: every other one takes each path.
    if stream & 2 == 0 {
        conn.send_data(stream, Bytes::from(vec![b'd'; n]), false);
    } else {
        conn.send_data_with(stream, n, false, |buf| buf.resize(buf.len() + n, b'e'));
    }
    conn.send_trailers(stream, |sink| {
        sink.field(b"grpc-status", b"0", Index::Yes);
        sink.field(b"grpc-message", b"fine", Index::Never);
    });
}

fn describe(conn: &Conn, ev: &Event) -> String {
    match ev {
        Event::Open { .. } | Event::Headers { .. } | Event::Trailers { .. } => {
            format!("{ev:?} {:?}", conn.headers())
        }
        _ => format!("{ev:?}"),
    }
}

fn run(
    chunks: &[&[u8]],
    small: bool,
    serve: bool,
    piecemeal: bool,
    strict_after_error: bool,
) -> Outcome {
    let mut conn = Conn::new(config(small));
    let mut input = BytesMut::new();
    let mut events = Vec::new();
    let mut out = Vec::new();
    let mut data_left = DATA_BUDGET;
    let mut error = None;
    let mut fed = 0;
    'feed: for chunk in chunks {
        input.extend_from_slice(chunk);
        fed += 1;
        loop {
            match conn.next_event(&mut input) {
                Ok(None) => break,
                Ok(Some(ev)) => {
                    events.push(describe(&conn, &ev));
                    match ev {
                        Event::Open { stream, .. } if serve => {
                            answer(&mut conn, stream, &mut data_left)
                        }
                        Event::Data { stream, data, .. } if serve => {
                            conn.release(stream, data.len())
                        }
                        _ => {}
                    }
                }
                Err(e) => {
                    error = Some(e);
                    break 'feed;
                }
            }
            if piecemeal {
                drain(&mut conn, true, &mut out);
            }
        }
        if piecemeal {
            drain(&mut conn, true, &mut out);
        }
    }
    drain(&mut conn, piecemeal, &mut out);
    if let (Some(e), true) = (&error, strict_after_error) {
        // The connection is dead: the rest of the input, then a valid PING,
        // must not revive it.
        for chunk in &chunks[fed..] {
            input.extend_from_slice(chunk);
        }
        let mut ping = Vec::new();
        frame::write_ping(&mut ping, *b"revived?", false);
        input.extend_from_slice(&ping);
        for _ in 0..3 {
            match conn.next_event(&mut input) {
                Err(again) => assert_eq!(again.reason, e.reason, "a different error after {e}"),
                Ok(r) => panic!("accepted input after {e}: {r:?}"),
            }
        }
        let mut more = Vec::new();
        drain(&mut conn, false, &mut more);
        assert!(more.is_empty(), "wrote {} bytes after {e}", more.len());
    }
    Outcome { events, error, out }
}

/// What the peer's frames allow us: connection credit (the initial window
/// plus every WINDOW_UPDATE on stream 0 the input holds) and the largest
/// frame (the largest valid SETTINGS_MAX_FRAME_SIZE it holds, at least the
/// default). Upper bounds: the connection may stop before the end.
fn allowed(mut input: &[u8]) -> (u64, u32) {
    if input.starts_with(PREFACE) {
        input = &input[PREFACE.len()..];
    }
    let mut credit = u64::from(DEFAULT_WINDOW);
    let mut max_frame = frame::DEFAULT_MAX_FRAME;
    while let Some(h) = Head::parse(input) {
        let Some(payload) = input.get(HEADER_LEN..HEADER_LEN + h.len as usize) else { break };
        let word = |p: &[u8]| u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
        match h.kind {
            kind::WINDOW_UPDATE if h.stream == 0 && payload.len() == 4 => {
                credit += u64::from(word(payload) & 0x7fff_ffff);
            }
            kind::SETTINGS => {
                for kv in payload.chunks_exact(6) {
                    let v = word(&kv[2..]);
                    if u16::from_be_bytes([kv[0], kv[1]]) == setting::MAX_FRAME_SIZE
                        && v <= MAX_MAX_FRAME
                    {
                        max_frame = max_frame.max(v);
                    }
                }
            }
            _ => {}
        }
        input = &input[HEADER_LEN + h.len as usize..];
    }
    (credit, max_frame)
}

/// Checks that `out` is whole, well-formed frames (see the module docs).
fn check_frames(out: &[u8], error: Option<&ConnError>, (credit, max_frame): (u64, u32)) {
    let mut pos = 0;
    let mut decoder = hpack::Decoder::new(hpack::DEFAULT_TABLE_SIZE);
    let mut block: Option<(u32, Vec<u8>)> = None;
    let mut data = 0u64;
    let mut last = None;
    let mut first = true;
    while pos < out.len() {
        let h = Head::parse(&out[pos..])
            .unwrap_or_else(|| panic!("{} bytes of a frame header at {pos}", out.len() - pos));
        let len = h.len as usize;
        assert!(h.len <= MAX_MAX_FRAME);
        let payload = out.get(pos + HEADER_LEN..pos + HEADER_LEN + len).unwrap_or_else(|| {
            panic!("frame at {pos} declares {len} bytes, {} follow", out.len() - pos - HEADER_LEN)
        });
        pos += HEADER_LEN + len;
        if first {
            assert_eq!((h.kind, h.flags), (kind::SETTINGS, 0), "the first frame: {h:?}");
            first = false;
        }
        if let Some((stream, _)) = &block {
            assert!(h.kind == kind::CONTINUATION && h.stream == *stream, "block cut by {h:?}");
        }
        match h.kind {
            kind::SETTINGS => {
                assert_eq!(h.stream, 0);
                assert_eq!(len % 6, 0, "{h:?}");
                assert!(!h.has(flag::ACK) || len == 0, "{h:?}");
            }
            kind::PING => assert!(h.stream == 0 && len == 8 && h.has(flag::ACK), "{h:?}"),
            kind::WINDOW_UPDATE => {
                assert_eq!(len, 4, "{h:?}");
                let inc = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                assert!((1..=0x7fff_ffff).contains(&inc), "{h:?} of {inc}");
            }
            kind::RST_STREAM => assert!(len == 4 && h.stream != 0, "{h:?}"),
            kind::GOAWAY => assert!(len >= 8 && h.stream == 0, "{h:?}"),
            kind::DATA => {
                assert!(h.stream != 0 && h.len <= max_frame, "{h:?}");
                data += u64::from(h.len);
            }
            kind::HEADERS | kind::CONTINUATION => {
                assert!(h.stream != 0 && h.len <= max_frame, "{h:?}");
                let (_, bytes) = block.get_or_insert_with(|| (h.stream, Vec::new()));
                bytes.extend_from_slice(payload);
                if h.has(flag::END_HEADERS) {
                    if let Some((_, bytes)) = block.take() {
                        let r = decoder.decode(&bytes, usize::MAX, |_, _| {});
                        assert_eq!(r, Ok(()), "a header block we wrote does not decode");
                    }
                }
            }
            other => panic!("wrote a frame of type {other}"),
        }
        last = Some((h, payload));
    }
    assert!(block.is_none(), "the output ends inside a header block");
    assert!(data <= credit, "sent {data} bytes of DATA on {credit} of credit");
    if let Some(e) = error {
        let (h, payload) = last.expect("an error is followed by GOAWAY");
        assert_eq!(h.kind, kind::GOAWAY, "the last frame after {e}");
        let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
        assert_eq!(Reason(code), e.reason, "GOAWAY's code");
        assert_eq!(&payload[8..], e.detail.as_bytes());
    }
}

fuzz_target!(|data: &[u8]| {
    let [control, rest @ ..] = data else { return };
    if rest.len() > MAX_INPUT {
        return;
    }
    let mut input = Vec::with_capacity(rest.len() + 33);
    if control & 1 != 0 {
        input.extend_from_slice(PREFACE);
        frame::write_settings(&mut input, &[]);
    }
    input.extend_from_slice(rest);
    let (small, serve) = (control & 2 != 0, control & 4 != 0);
    let cut = usize::from(control >> 3);

    let whole = run(&[&input], small, serve, false, true);
    assert!(whole.out.len() < MAX_OUTPUT, "{} bytes out", whole.out.len());
    check_frames(&whole.out, whole.error.as_ref(), allowed(&input));

    if cut > 0 {
        let chunks: Vec<&[u8]> = input.chunks(cut).collect();
        let split = run(&chunks, small, serve, true, false);
        assert_eq!(whole.error, split.error, "the cut changed the error");
        assert_eq!(whole.events, split.events, "the cut changed the events");
        assert!(whole.out == split.out, "the cut changed the output");
    }
});
