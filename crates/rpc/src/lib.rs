//! protoplane's RPC runtime.
//!
//! This crate starts with the parts of gRPC that do not depend on a
//! transport: everything here is plain functions and state machines over
//! bytes and header values, so the HTTP/2 server and client, the lean
//! transport and (later) the split engine share one implementation of the
//! protocol rules, each tested and fuzzed once.
//!
//! * [`frame`]: the length-prefixed message framing of a gRPC stream
//!   (incremental, bounded by the message size limit);
//! * [`status`]: status codes, `grpc-message` percent-encoding, and the
//!   mapping of plain HTTP statuses to codes;
//! * [`timeout`]: the `grpc-timeout` header;
//! * [`metadata`]: custom metadata keys and values, `-bin` values in base64.
//!
//! The rules are those of gRPC's "gRPC over HTTP2" protocol description
//! (`PROTOCOL-HTTP2.md` in the grpc repository); each module names the
//! production it implements.

pub mod accept;
pub mod busy;
pub mod client;
pub mod deadline;
pub mod health;
pub mod http2;
pub mod lean;
pub mod reflection;
pub mod server;
pub mod tls;

pub use client::{
    CallOptions, Channel, ChannelOptions, Client, ClientCall, ClientTls, Identity, TypedCall,
};
pub use server::{GrpcTransport, Router, ServerOptions};
