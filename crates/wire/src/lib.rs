//! The wire engine: protobuf wire bytes <-> linearized blocks, driven by the
//! schema tables of `protoplane-schema`.
//!
//! * [`decode`] / [`Decoder`]: wire -> block (owned or zero-copy view mode);
//! * [`encode`] / [`Encoder`]: block -> wire (deterministic on request);
//! * [`MessageView`]: read any field of a block by number or name;
//! * [`Builder`]: write a block directly (the response path: the app lays
//!   the data out, the engine encodes it).
//!
//! Start with `block.rs` (the format), then `decode.rs`.

mod back;
mod block;
mod builder;
mod count;
mod decode;
mod encode;
mod error;
mod extensions;
#[doc(hidden)]
pub mod gen;
pub mod json;
pub mod reference;
mod sink;
pub mod text;
mod varint;
mod view;

pub use block::{
    with_source, Block, BlockSource, Lent, LentOwner, Ref, Region, BLOCK_VIEW, HEADER_LEN, MAX_LEN,
    REF_DEVICE, REF_LEN_MASK, REF_WIRE,
};
pub use builder::{BuildError, Builder, MessageBuilder};
pub use count::WriteStats;
pub use decode::{decode, DecodeOptions, Decoder};
pub use encode::{encode, EncodeOptions, Encoder, Source};
pub use error::{BlockError, DecodeError, DecodeErrorKind};
pub use sink::SgList;
pub use view::{MessageView, RepeatedView, Value};
