//! The in-network-computation data plane (`protoplane_inc::switch`) and
//! the server and client agents of one application against hostile
//! datagrams, next to a second application whose state must not change.
//! The input is a config byte and a sequence of records (datagrams for the
//! switch or an agent, API calls, time passing, replays), interpreted and
//! the properties checked by `protoplane_fuzz::inc`, whose docs list them.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    protoplane_fuzz::inc::run(data);
});
