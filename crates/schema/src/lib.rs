//! Schema tables: the contract between every part of protoplane.
//!
//! A [`TableSet`] is built once per schema (from `.proto` files or a serialized
//! `FileDescriptorSet`) and never changes afterwards except through
//! [`TableSet::set_placement`]. It is *pointer-free*: every cross reference is an
//! index into one of a handful of flat arrays, so the whole set serializes to
//! bytes ([`TableSet::to_bytes`]) and can be handed to another process or a
//! device as-is (PsPIN's flattened descriptors, RPCAcc's schema table).
//!
//! Read `table.rs` first: it defines the field entry and the object layout that
//! the `wire` crate decodes into and encodes from. `lower.rs` turns descriptors
//! into tables; `layout.rs` assigns slot offsets; `codec.rs` is the byte form.

mod codec;
mod editions;
mod error;
mod layout;
mod load;
mod lower;
mod options;
mod placement;
mod table;

pub use error::SchemaError;
pub use load::{compile_proto_sources, compile_protos, decode_descriptor_set, ProtoSource};
pub use options::{OPTIONS_PROTO, OPTIONS_PROTO_NAME, PLACEMENT_EXTENSION, PLACEMENT_OPTION};
pub use placement::{apply_placements, parse_placement, PlacementSpec, PlacementTable};
pub use table::{
    Card, Enum, EnumValue, Extension, Field, FieldFlags, FieldOp, Kind, Label, Message,
    MessageFlags, Oneof, Placement, Span, TableSet, ValueOp, WireType, NONE,
};
