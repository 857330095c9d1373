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
//!
//! Each side's session is a state machine here too, sans I/O (as
//! quinn-proto's `Connection` is to quinn): [`engine::EngineSession`] and
//! [`app::AppSession`] take descriptors and the driver's actions, and
//! answer with decisions (what a descriptor is for, which chunks may be
//! read, what is owed to the other side, which rule was broken). They map
//! no memory, touch no ring, spawn nothing and read no clock: a region is
//! its chunk and range numbers, and the engine's budget clock advances
//! when its driver ticks it. `protoplane-engine`'s attachment and
//! `protoplane-app`'s session drive them; `tests/session/` runs an engine
//! session and an application session against each other in memory, one
//! file per topic.

pub mod app;
pub mod engine;
pub mod side;

pub use protoplane_shm::desc;
pub use side::{OpenRepr, ReplyRepr, SeamError};
