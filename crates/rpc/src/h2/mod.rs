//! gRPC on the general-purpose `h2` crate (the `h2` cargo feature): the
//! second HTTP/2 transport of the server ([`server`]) and the client
//! ([`client`]), kept to compare protoplane's own HTTP/2 with
//! (`protoplane bench rpc` runs both). Everything a call does above HTTP/2
//! is `protoplane-grpc`'s, shared with the native transport.

pub(crate) mod client;
pub(crate) mod server;
