//! The I/O around `protoplane-inc`: UDP sockets, TCP control connections
//! and a clock, so the sans-IO data plane, controller and agents run as
//! processes on one machine (loopback) or in network namespaces.
//!
//! - [`switch::bind`] and `Runner::run`: `protoplane switch`, the data plane on a UDP port,
//!   its control plane on a TCP port, fault injection per egress port.
//! - [`controller::bind`] and `Runner::run`: `protoplane controller`, registration and name
//!   lookup on a TCP port; it drives the switches' control planes.
//! - [`agent::ServerRuntime`] and [`agent::ClientRuntime`]: the agents with
//!   a socket and a clock, for application code (blocking calls), and
//!   [`agent::ClientHandle`], a client agent on its own thread for async code.
//! - [`rpc::IncChannel`]: the RPC face. A service with a NetFilter is called
//!   through its generated `<Service>IncClient` like any other service; IEDT
//!   fields go through the client agent, ordinary fields over gRPC.
//!
//! Addressing: a node id is the UDP port its process bound on the loopback
//! address (or on `--host`), so every process can reach every other with
//! no address book. Control and registration messages are JSON lines
//! (`protoplane_inc::switch::Control`, `protoplane_inc::messages`).
//!
//! Threads, not an async runtime: each socket has a reader thread feeding
//! one channel, and one thread runs the state machine — the state
//! machines are single-threaded by design, and the data plane must not
//! depend on a scheduler's fairness.

pub mod agent;
pub mod controller;
mod error;
pub mod flags;
pub mod lines;
pub mod rpc;
pub mod switch;

pub use error::Error;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch: the one clock every process shares
/// (the switch's last-seen times are compared by the controller).
pub fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// The UDP address of `node` on `host`.
pub fn node_addr(host: IpAddr, node: u16) -> SocketAddr {
    SocketAddr::new(host, node)
}

/// The loopback address.
pub const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A held datagram: (release time, arrival order, destination, bytes).
type Held = (u64, u64, u16, Vec<u8>);

/// Datagrams held back by a fault injector, by release time.
#[derive(Debug, Default)]
pub(crate) struct DelayQueue {
    heap: std::collections::BinaryHeap<std::cmp::Reverse<Held>>,
    seq: u64,
}

impl DelayQueue {
    /// Holds `bytes` for `dst` until `at`.
    pub(crate) fn push(&mut self, at: u64, dst: u16, bytes: Vec<u8>) {
        self.seq += 1;
        self.heap.push(std::cmp::Reverse((at, self.seq, dst, bytes)));
    }

    /// The next datagram due by `now`.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<(u16, Vec<u8>)> {
        if self.heap.peek().is_some_and(|std::cmp::Reverse((at, ..))| *at <= now) {
            return self.heap.pop().map(|std::cmp::Reverse((_, _, dst, b))| (dst, b));
        }
        None
    }

    /// When the next datagram is due.
    pub(crate) fn next(&self) -> Option<u64> {
        self.heap.peek().map(|std::cmp::Reverse((at, ..))| *at)
    }
}
