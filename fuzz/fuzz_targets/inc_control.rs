//! The JSON parsers of the in-network computation's control paths on a
//! peer's bytes: the switch's control requests and replies, the
//! controller's requests and replies, the bounded line reader they arrive
//! through, and the NetFilter parser on the whole input. Round trips and
//! the properties are checked by `protoplane_fuzz::inc_control`, whose docs
//! list them.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    protoplane_fuzz::inc_control::run(data);
});
