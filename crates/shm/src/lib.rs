//! protoplane's shepherding layer: what the engine and an application
//! process share, and nothing else.
//!
//! Split gRPC's architecture (APSys'24): the RPC infrastructure runs in an
//! engine process, business logic in application processes, and calls
//! cross between them through shared-memory rings. Messages cross as
//! linearized blocks (offsets, never pointers), so the two processes map
//! the region at different addresses and no pointer is fixed up.
//!
//! * [`sys`]: the system calls (memfd, mmap, socket-pair doorbells, descriptor passing,
//!   pinning), each wrapped once;
//! * [`layout`]: the region — control page, two rings, and two halves of
//!   chunks, each half allocated by one side from a private free list;
//! * [`ring`]: the rings — fixed slots, counting positions, a per-slot
//!   valid flag, spin-then-park waiting;
//! * [`desc`]: the call descriptor a slot carries;
//! * [`lease`]: the other side's chunks held and read in place;
//! * [`attach`]: the versioned handshake that passes the region and checks
//!   both sides built the same schema tables.
//!
//! This is the only crate of the workspace allowed `unsafe`: mapping shared
//! memory needs it. Everything above it sees safe types. Trust runs one
//! way: the engine trusts nothing an application writes (every index,
//! offset and length it reads is checked before use, see `ring` and
//! `layout`), while an application trusts its engine.

pub mod attach;
pub mod desc;
pub mod layout;
pub mod lease;
pub mod ring;
pub mod sys;

pub use desc::{Descriptor, Span};
pub use layout::{Chunk, Chunks, Custody, Layout, LayoutError};
pub use lease::{Held, Holder};
pub use ring::{AsyncDoorbell, Consumer, Doorbell, Producer, PushError, Ring};
pub use sys::{Access, Bell, Cleared, Mapping, Part};
