//! The lean transport: protoplane to protoplane over TCP or Unix sockets,
//! with the same services (the [`Router`](crate::Router)) and the same
//! seam as gRPC, but a minimal binary frame instead of HTTP/2 — no HPACK,
//! no per-stream flow control, no text headers. See [`frame`] for the
//! format.
//!
//! What it gives up, deliberately: interoperability (only protoplane speaks
//! it), per-call flow control (a call whose handler stops taking requests
//! holds up its connection's reading, so slow consumers should use their
//! own connection), and compression. What it keeps: deadlines, metadata,
//! status codes and messages, cancellation, all four call kinds,
//! pipelining, bounded memory.

pub mod client;
pub mod frame;
pub mod server;

pub use client::{LeanCall, LeanChannel};
pub use frame::LeanError;
