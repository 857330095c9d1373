//! The HTTP/2 connection state machine's rules, one file per topic, each
//! test a client and a server connection in memory ([`util::Pair`]): no
//! socket, no runtime, no clock.

mod continuation;
mod flow_control;
mod goaway;
mod resets;
mod settings;
mod util;
