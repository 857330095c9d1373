//! HTTP/2 for gRPC, protoplane's own: frames ([`frame`]), header
//! compression ([`hpack`]), the connection state machine without I/O
//! ([`conn`]), and the gRPC server and client on top (`server`, `client`).
//!
//! Why not the general-purpose `h2` crate: gRPC uses a small corner of
//! HTTP/2 (POST, a fixed header set, trailers, no push, no priorities),
//! and a transport built for that corner does less per call — one task per
//! connection instead of one per stream, a request's header block parsed
//! once into the fields gRPC reads, response headers that are the same on
//! every call coming from HPACK's dynamic table, and every frame of a
//! read buffer handled before the next system call.

pub(crate) mod client;
pub mod conn;
pub mod frame;
pub mod hpack;
mod huffman;
pub(crate) mod server;
