//! The lean transport's frames on a peer's bytes: header splitting and
//! section parsing, as the server and the client read them.
//!
//! Input: the first byte picks the frame size limit (0..=255 * 8), the rest
//! is the connection's bytes after the preface.
//!
//! Properties, beyond "never panics":
//! * no frame longer than the limit is ever returned;
//! * the server's reader, receiving into chunks of a real engine region
//!   (landings, several frames each, frames across a landing's end moved
//!   to the next) in reads of sizes taken from the input, cuts the same
//!   frames with the same payloads and fails where splitting the whole
//!   buffer fails; once the frames are dropped, every landing's chunk is
//!   back in the engine's free list;
//! * a frame that parses re-encodes to a frame that parses to the same
//!   sections (messages, statuses, metadata, timeouts survive the trip).

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use protoplane_engine::fuzzing::Engine;
use protoplane_grpc::lean::{self as frame, Outgoing, CANCEL, END, HEADER_LEN};
use protoplane_rpc::lean::server::reassemble;
use protoplane_shm::layout::Class;
use protoplane_shm::Layout;

thread_local! {
    /// One engine region for every run: small chunk classes, so frames
    /// often straddle a landing's end or outgrow every chunk.
    static ENGINE: Engine = Engine::new(Layout {
        ring_slots: 8,
        classes: vec![Class { size: 4096, count: 4 }, Class { size: 16384, count: 2 }],
    })
    .expect("region")
    .0;
}

fuzz_target!(|data: &[u8]| {
    let [limit, rest @ ..] = data else { return };
    let limit = *limit as usize * 8;
    let mut whole = BytesMut::from(rest);
    let mut expected = Vec::new();
    let error = loop {
        match frame::next_frame(&mut whole, limit) {
            Ok(Some(f)) => expected.push(f),
            Ok(None) => break None,
            Err(e) => break Some(e),
        }
    };
    ENGINE.with(|engine| {
        let att = engine.attachment();
        let lend = |_: Option<usize>, need: usize| Some((0, att.landing(need)?));
        let reads = &rest[..rest.len().min(4)];
        let (frames, err) = reassemble(rest, reads, limit, &lend);
        assert_eq!(err, error);
        assert_eq!(frames, expected);
        drop(frames);
        assert_eq!(att.chunk_use().0, 0, "a landing's chunk was not freed");
    });
    let mut buf = BytesMut::from(rest);
    while let Ok(Some((h, payload))) = frame::next_frame(&mut buf, limit) {
        assert!(payload.len() <= limit);
        assert_eq!(payload.len(), h.len as usize);
        let Ok(s) = frame::parse(&h, payload) else { continue };
        let open = s.open.as_ref().map(|(t, md)| (*t, md));
        let out = Outgoing {
            open,
            headers: s.headers.as_ref(),
            message: s.message.as_deref(),
            status: s.status.as_ref(),
            peer_certificates: &s.peer_certificates,
            peer_address: s.peer_address.as_deref(),
            end: h.has(END),
            cancel: h.has(CANCEL),
        };
        let mut bytes = Vec::new();
        if frame::write(&mut bytes, h.call, h.method, &out).is_none() {
            continue;
        }
        let mut again = BytesMut::from(&bytes[..]);
        let (h2, p2) = match frame::next_frame(&mut again, usize::MAX) {
            Ok(Some(f)) => f,
            other => panic!("re-encoded frame does not split: {other:?}"),
        };
        assert!(again.is_empty() && bytes.len() == HEADER_LEN + h2.len as usize);
        assert_eq!((h2.call, h2.method, h2.flags), (h.call, h.method, h.flags));
        let s2 = frame::parse(&h2, p2).expect("re-encoded frame parses");
        // Timeouts are carried in whole microseconds, at least 1.
        assert_eq!(s2.open.as_ref().map(|o| &o.1), s.open.as_ref().map(|o| &o.1));
        assert_eq!(s2.headers, s.headers);
        assert_eq!(s2.message, s.message);
        assert_eq!(s2.status, s.status);
        assert_eq!(s2.peer_certificates, s.peer_certificates);
        assert_eq!(s2.peer_address, s.peer_address);
    }
});
