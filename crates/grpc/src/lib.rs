//! gRPC's protocol rules, shared by every transport protoplane has (its
//! own HTTP/2, the `h2` crate, the lean transport, the split engine): plain
//! functions and state machines over bytes and header values, each tested
//! and fuzzed once, with no runtime and no I/O.
//!
//! * [`frame`]: the length-prefixed message framing of a gRPC stream
//!   (incremental, bounded by the message size limit, zero-copy for large
//!   messages); [`lean`]: the frame of protoplane's lean transport, whose
//!   sections the split engine's descriptors carry too;
//! * [`status`]: status codes, `grpc-message` percent-encoding, and the
//!   mapping of plain HTTP statuses to codes; [`rich`]: the richer error
//!   model (`grpc-status-details-bin`, `google.rpc.Status` and its detail
//!   types);
//! * [`timeout`]: the `grpc-timeout` header;
//! * [`metadata`]: custom metadata keys and values, `-bin` values in base64;
//! * [`codec`]: message compression (`grpc-encoding`) and the content type;
//! * [`schema`]: a loaded schema's services and methods (the method id
//!   that crosses the engine/application seam);
//! * [`call`]: the call types both sides of that seam speak ([`Service`],
//!   [`Request`], [`Responder`], [`Message`]); [`landing`]: memory a
//!   service lends a transport to receive into.
//!
//! The rules are those of gRPC's "gRPC over HTTP2" protocol description
//! (`PROTOCOL-HTTP2.md` in the grpc repository); each module names the
//! production it implements. The runtime that wires transports to services
//! is `protoplane-rpc`.

pub mod call;
pub mod codec;
pub mod frame;
pub mod intercept;
pub mod landing;
pub mod lean;
pub mod metadata;
pub mod rich;
pub mod schema;
pub mod status;
pub mod timeout;

pub use call::{BoxFuture, Message, Peer, Request, Responder, Service, Streaming, View};
pub use frame::{encode_frame, Frame, FrameDecoder, FrameError, FRAME_HEADER_LEN};
pub use metadata::Metadata;
pub use schema::{Method, Schema};
pub use status::{Code, Status};
