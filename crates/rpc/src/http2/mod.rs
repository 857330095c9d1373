//! gRPC over protoplane's own HTTP/2 (the `protoplane-http2` crate: frames,
//! HPACK and the connection state machine, without I/O): the socket loops
//! of the server (`server`) and the client (`client`) that drive it.

pub(crate) mod client;
pub(crate) mod server;
