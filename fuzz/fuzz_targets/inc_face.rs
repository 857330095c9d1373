//! The RPC face of in-network computation cuts fields out of a server's
//! response bytes before it merges the network's results in
//! (`protoplane_inc_net::rpc::strip_fields`). On any bytes it must not
//! panic or loop, and what it returns must be a well-formed remainder:
//! no longer than the input, free of the dropped fields (stripping again
//! changes nothing) and itself well formed.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protoplane_inc_net::rpc::strip_fields;

fuzz_target!(|data: &[u8]| {
    let Some((&mask, wire)) = data.split_first() else { return };
    // The first byte picks which of fields 1..=8 are dropped (at least one:
    // an empty set copies the bytes without reading them).
    let drop: Vec<u32> = (0..8).filter(|b| mask & (1 << b) != 0).map(|b| b + 1).collect();
    let drop = if drop.is_empty() { vec![1] } else { drop };
    let parsed = strip_fields(wire, &drop);
    // Whether the bytes are well formed does not depend on what is dropped.
    assert_eq!(parsed.is_ok(), strip_fields(wire, &[u32::MAX >> 3]).is_ok());
    let Ok(out) = parsed else { return };
    assert!(out.len() <= wire.len());
    assert_eq!(strip_fields(&out, &drop).as_deref(), Ok(out.as_slice()), "a dropped field is left");
    assert!(strip_fields(&out, &[1]).is_ok(), "the remainder is malformed");
});
