//! protoplane's RPC runtime: what wires transports to services.
//!
//! The protocol rules live elsewhere, each in a crate with no I/O: gRPC's
//! in `protoplane-grpc` (framing, status, metadata, timeouts, the call
//! types), HTTP/2's in `protoplane-http2` (frames, HPACK, the connection
//! state machine). This crate runs them over sockets:
//!
//! * [`server`]: the [`Router`] (services by method path) and its accept
//!   loops, plaintext and TLS; [`client`]: [`Channel`] (a target's HTTP/2
//!   connections), [`Client`] and the call handles; [`resolve`]: target
//!   names and resolvers; [`balance`]: load-balancing policies;
//! * [`http2`]: the server's and the client's socket loops around
//!   `protoplane-http2`'s connection (one task per connection); with the
//!   `h2` cargo feature, a second HTTP/2 transport on the `h2` crate
//!   (`GrpcTransport::H2`) for comparison;
//! * [`lean`]: the lean transport, protoplane to protoplane over TCP or
//!   Unix sockets with a minimal binary frame instead of HTTP/2;
//! * [`tls`]: rustls configurations (ALPN `h2`, mutual TLS);
//! * [`accept`]: accept loops that outlive accept errors; [`busy`]:
//!   busy-polling a worker while calls keep coming; [`deadline`]: a
//!   handler bounded by its call's deadline; [`drain`]: graceful shutdown
//!   (listeners closed, GOAWAY, calls in flight finish).
//!
//! The split engine (`protoplane-engine`) serves its applications' calls
//! through the same [`Router`] and transports; the standard health and
//! reflection services are `protoplane-grpc-services`, added by
//! [`Router::with_standard_services`].

pub mod accept;
pub mod backoff;
pub mod balance;
pub mod busy;
pub mod client;
pub mod config;
pub mod deadline;
pub mod delegate;
pub mod dns;
pub mod drain;
#[cfg(feature = "h2")]
mod h2;
pub mod http2;
pub mod intercept;
pub mod keepalive;
pub mod lean;
pub mod metrics;
pub mod resolve;
pub mod route;
pub mod server;
pub mod shards;
pub mod tls;

pub use backoff::Backoff;
pub use balance::LbPolicy;
pub use client::{
    CallOptions, Channel, ChannelOptions, Client, ClientCall, ClientTls, Connectivity, Identity,
    TypedCall, UnaryResponse,
};
pub use keepalive::{ClientKeepalive, ServerKeepalive};
pub use server::{GrpcTransport, Router, ServerOptions};
