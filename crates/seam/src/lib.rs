//! The split seam's protocol, written once and used by both sides: the
//! engine (`protoplane-engine`) and the application (`protoplane-app`).
//!
//! A call crosses the seam as call descriptors in the shared-memory rings
//! ([`desc`]: seven words, flags, spans into the
//! region) plus, where a descriptor says so, side sections: the bytes of a
//! call that are neither a message nor its wire form (the request's
//! metadata, timeout and verified client certificates on OPEN; initial
//! metadata on HEADERS; the status text, trailers and details on STATUS).
//! [`side`] is their codec, in the shape smoltcp gives its packet
//! representations: a `Repr` is parsed from untrusted bytes with
//! `parse`, knows its `buffer_len`, and `emit`s itself.

pub mod app;
pub mod engine;
pub mod side;

pub use protoplane_shm::desc;
pub use side::{OpenRepr, ReplyRepr, SeamError};
