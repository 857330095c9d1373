//! In-network computation for protoplane (NetRPC, NSDI'23, in software).
//!
//! An application describes what the network should compute with an
//! ordinary `.proto` service whose messages carry INC-enabled data types
//! (IEDTs, `protos/protoplane/inc.proto`) and a small JSON **NetFilter**
//! ([`netfilter`]). The client and server code is the code of any RPC;
//! the IEDT fields travel through the INC channel: client agents packetize
//! them, a shared data plane ([`switch`]) aggregates, counts and forwards,
//! and the server agent completes in software whatever the data plane
//! could not do — a full data plane, an overflow, a key collision, a lost
//! packet, no data plane at all — so every result is exact.
//!
//! Everything in this crate is sans-IO: no sockets, no clocks, no threads.
//! Time is an argument (`now`, in microseconds), datagrams go in as bytes
//! and come out as [`switch::Emit`]s or agent transmits. `protoplane
//! switch` / `controller` / `inc run` put UDP and a clock around it; the
//! deterministic simulation ([`sim`]) drives the very same state machines
//! with a simulated clock and a seeded lossy network.
//!
//! Read [`packet`] first (the wire format), then [`switch`] (what the data
//! plane does with a packet), then the agents; [`membership`] is what
//! synchronous aggregation does when a member is lost.

pub mod client;
pub mod controller;
mod error;
pub mod faults;
mod json;
pub mod keys;
pub mod mac;
pub mod membership;
pub mod messages;
pub mod netfilter;
pub mod packet;
pub mod plan;
pub mod rng;
pub mod server;
pub mod sim;
pub mod switch;

pub use error::Error;
