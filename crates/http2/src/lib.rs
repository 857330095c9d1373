//! HTTP/2 for gRPC, protoplane's own, without I/O: frames ([`frame`]),
//! header compression ([`hpack`], with its Huffman code), and the
//! connection state machine ([`conn`]): bytes in, events and bytes out.
//! No runtime, no sockets, no clocks: protoplane-rpc's gRPC server and
//! client drive it from their socket loops, the tests in `tests/conn/`
//! drive a client and a server connection against each other in memory,
//! and the fuzzer drives it from a peer's bytes.
//!
//! Why not the general-purpose `h2` crate: gRPC uses a small corner of
//! HTTP/2 (POST, a fixed header set, trailers, no push, no priorities),
//! and a transport built for that corner does less per call: one task per
//! connection instead of one per stream, a request's header block parsed
//! once into the fields gRPC reads, response headers that are the same on
//! every call coming from HPACK's dynamic table, and every frame of a read
//! buffer handled before the next system call.

pub mod conn;
pub mod frame;
pub mod hpack;
mod huffman;

pub use conn::{Config, Conn, ConnError, Event, FieldSink, HeaderList, Output, Role};
pub use frame::Reason;
