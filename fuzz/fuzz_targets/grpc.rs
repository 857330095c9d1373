//! The gRPC protocol core on a peer's bytes: the message framing of a
//! stream and the header values (`grpc-timeout`, `grpc-status`,
//! `grpc-message`, `-bin` metadata).
//!
//! Input: the first byte picks the message size limit (0..=255 * 16), the
//! second how the rest is split into DATA-frame-like chunks; the rest is
//! the stream.
//!
//! Properties, beyond "never panics":
//! * the split does not matter: chunked and whole-stream decoding give the
//!   same messages and the same error;
//! * nothing larger than the limit is ever buffered;
//! * what decodes, re-frames to exactly the bytes it was decoded from;
//! * header parsers never fail hard: a parsed `grpc-timeout` formats back
//!   to a value that parses to at least the same duration;
//! * status details (`grpc-status-details-bin`, a `google.rpc.Status`) that
//!   parse, packed or typed, build a status whose details parse to the
//!   same; the content-type classifier takes any bytes.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use protoplane_grpc::frame::{encode_frame, Frame, FrameDecoder, FRAME_HEADER_LEN};
use protoplane_grpc::{codec, metadata, status, timeout, Code, Status};

fn run(limit: usize, chunks: &mut dyn Iterator<Item = &[u8]>) -> (Vec<Frame>, Option<String>) {
    let mut dec = FrameDecoder::new(limit);
    let mut out = Vec::new();
    for chunk in chunks {
        if let Err(e) = dec.push(Bytes::copy_from_slice(chunk), &mut out) {
            return (out, Some(e.to_string()));
        }
        assert!(dec.buffered() <= limit + FRAME_HEADER_LEN, "buffered past the limit");
    }
    (out, dec.finish().err().map(|e| e.to_string()))
}

fuzz_target!(|data: &[u8]| {
    let [limit, split, stream @ ..] = data else { return };
    let limit = *limit as usize * 16;
    let chunk = (*split as usize % 17) + 1;
    let whole = run(limit, &mut std::iter::once(stream));
    let split = run(limit, &mut stream.chunks(chunk));
    assert_eq!(whole, split, "the split changed the result");

    let mut again = Vec::new();
    for m in &whole.0 {
        encode_frame(m.compressed, &m.data, &mut again).unwrap_or_else(|| panic!("re-frame"));
    }
    assert!(stream.starts_with(&again), "re-framing differs from the input");

    if let Some(d) = timeout::parse(stream) {
        let back = timeout::parse(timeout::format(d).as_bytes());
        assert!(back.is_some_and(|b| b >= d), "{d:?}");
    }
    let _ = Code::from_header(stream);
    let text = status::decode_message(stream);
    assert_eq!(status::decode_message(status::encode_message(&text).as_bytes()), text);
    let _ = metadata::decode_value("x-bin", stream);
    let _ = codec::content_type(Some(stream));

    let st = Status::with_details(Code::Unknown, "", Bytes::copy_from_slice(stream));
    if let Ok(any) = st.any_details() {
        let again = Status::with_any_details(Code::Unknown, "", any.clone());
        assert_eq!(again.any_details().ok(), Some(any), "packed details round trip");
    }
    if let Ok(list) = st.check_error_details_vec() {
        let again = Status::with_error_details_vec(Code::Unknown, "", list.clone());
        assert_eq!(again.check_error_details_vec().ok(), Some(list), "typed details round trip");
    }
});
