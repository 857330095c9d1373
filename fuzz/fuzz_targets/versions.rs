//! An application's descriptor set, as the engine reads it when the
//! application brings its own version of a service
//! (`protoplane_engine::versions`): built into a schema and judged against
//! the engine's. See `protoplane_engine::fuzzing::versions` for the
//! properties.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    protoplane_engine::fuzzing::versions(data);
});
