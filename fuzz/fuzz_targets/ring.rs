//! The engine's side of the shared-memory ring protocol against an
//! application that writes anything into the region: the input is a
//! sequence of engine steps and application writes, interpreted (and the
//! properties checked) by `protoplane_fuzz::ring`, whose docs list them.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    protoplane_fuzz::ring::run(data);
});
