//! The metrics endpoint's request head parser
//! (`protoplane_rpc::metrics::http::parse_head`), on whatever a client
//! sends.
//!
//! Properties, beyond "never panics":
//! * a complete head (or a refusal) stays the same whatever arrives after
//!   it: the bytes up to the first empty line decide, and a refusal for
//!   length is final;
//! * a head is accepted only within `MAX_HEAD` bytes, and what it yields
//!   is a printable path without a query string;
//! * an input still incomplete is never longer than `MAX_HEAD` plus a
//!   terminator: the endpoint buffers no more than that.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protoplane_rpc::metrics::http::{parse_head, MAX_HEAD};

fuzz_target!(|data: &[u8]| {
    let Some((&cut, data)) = data.split_first() else { return };
    let r = parse_head(data);
    match &r {
        Ok(Some(h)) => {
            assert!(!h.path.is_empty() && !h.path.contains('?'));
            assert!(h.path.bytes().all(|b| b.is_ascii_graphic()));
            let end = data.windows(2).position(|w| w == b"\n\n" || w == b"\n\r");
            assert!(end.is_some_and(|e| e <= MAX_HEAD));
        }
        Ok(None) => assert!(data.len() <= MAX_HEAD + 2),
        Err(_) => {}
    }
    // What a shorter read said, if it was final, the whole input says too.
    let prefix = &data[..data.len() * usize::from(cut) / 255];
    let early = parse_head(prefix);
    if !matches!(early, Ok(None)) {
        assert_eq!(early, r, "a final answer changed with more bytes");
    }
});
