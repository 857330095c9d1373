//! The lean transport's frames on a peer's bytes: header splitting and
//! section parsing, as the server and the client read them.
//!
//! Input: the first byte picks the frame size limit (0..=255 * 8), the rest
//! is the connection's bytes after the preface.
//!
//! Properties, beyond "never panics":
//! * no frame longer than the limit is ever returned;
//! * a frame that parses re-encodes to a frame that parses to the same
//!   sections (messages, statuses, metadata, timeouts survive the trip).

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use protoplane_rpc::lean::frame::{self, Outgoing, CANCEL, END, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    let [limit, rest @ ..] = data else { return };
    let limit = *limit as usize * 8;
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
    }
});
