//! The call descriptor: what one ring slot carries.
//!
//! ```text
//! word  bits   field
//!  0    0..64  call id (engine-assigned, never reused within an attachment)
//!  1    0..32  method id (index into the service's schema methods)
//!      32..48  flags (below)
//!      48..56  service index (into the services named at attach)
//!      56..64  status code (with STATUS)
//!  2    0..32  block offset    32..64 block length     (linearized message)
//!  3    0..32  wire offset     32..64 wire length      (bytes a view-mode block references, or an encoded message)
//!  4    0..32  side offset     32..64 side length      (metadata / status text, lean-frame sections)
//!  5    0..64  timeout in ns from when the call was posted (OPEN; 0: none)
//!  6    0..32  chunk: offset of the chunk holding this descriptor's bytes (0: none)
//!      32..64  release: a chunk of the receiver's half handed back (0: none)
//! ```
//!
//! Every range lies in the chunk named in word 6, except that the wire
//! range of a request (engine → app) may lie in another chunk of the
//! engine's half: a receive buffer the engine read several requests into
//! from a socket. The application takes that chunk once more per request
//! ([`crate::layout::Custody::take_shared`]) and releases it as often.
//!
//! TASK and NOTIFY descriptors belong to no call: they carry the compute
//! units' control messages and their answers (see the flags).
//!
//! A RELEASE-only descriptor (flags == RELEASE) instead carries up to ten
//! chunk offsets in words 2..=6, zero meaning none. Offsets are from the
//! start of the region; 0 is the control page and never a chunk, so it can
//! mean "none". Nothing here is trusted by its reader: [`Descriptor::from_words`]
//! takes any bit pattern, and the receiver checks every range against the
//! chunk it names before use.

/// The call starts (engine → app); carries the request's metadata and timeout.
pub const OPEN: u16 = 0x01;
/// Initial metadata (app → engine), in the side bytes.
pub const HEADERS: u16 = 0x02;
/// One message: block (and wire bytes) in the chunk.
pub const MESSAGE: u16 = 0x04;
/// The call's status (app → engine); side bytes hold message and trailers.
pub const STATUS: u16 = 0x08;
/// The sender's last descriptor of the call.
pub const END: u16 = 0x10;
/// The engine cancels the call (client gone, deadline passed).
pub const CANCEL: u16 = 0x20;
/// Only hands chunks back (no call).
pub const RELEASE: u16 = 0x40;
/// App → engine: compress this response when the client accepts it.
/// Engine → app: the client sent this request compressed (it arrives
/// decompressed).
pub const COMPRESS: u16 = 0x80;
/// The message is already encoded: the wire range holds it, no block.
pub const ENCODED: u16 = 0x100;
/// App → engine: a compute-unit control message (no call). The block range
/// holds it (`protoplane_offload::cu::control`), `method` is the slot and
/// `call` the application's tag for the answer.
pub const TASK: u16 = 0x200;
/// Engine → app: the answer to a TASK (no call). `call` is the tag,
/// `method` the slot, `code` a gRPC status code (0: done), `timeout_ns`
/// the output's device range (offset in bits 0..32, length in 32..64) and
/// the side range a text: the kernel's name, or why it failed.
pub const NOTIFY: u16 = 0x400;
/// The descriptor belongs to an outbound call: one the application makes
/// through the engine (to another service) rather than one the engine
/// brings it. Its call ids are the application's, a space of their own.
/// App → engine: OUTBOUND|OPEN with the request (`service` is the channel,
/// an index into the channels named at attach, `method` a method id of the
/// channel's schema, the side range the request's metadata, `timeout_ns`
/// its deadline), or OUTBOUND|CANCEL. Engine → app: OUTBOUND with the
/// response (MESSAGE, a block decoded by the engine) and the status
/// (STATUS|END, HEADERS: the side range holds headers and trailers).
pub const OUTBOUND: u16 = 0x800;

/// Words of a descriptor.
pub const WORDS: usize = 7;

/// Most chunks a RELEASE-only descriptor hands back.
pub const RELEASES_PER_DESCRIPTOR: usize = 10;

/// A byte range in the region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    /// Offset from the start of the region (0: none).
    pub offset: u32,
    /// Bytes.
    pub len: u32,
}

impl Span {
    fn pack(self) -> u64 {
        self.offset as u64 | (self.len as u64) << 32
    }

    fn unpack(w: u64) -> Span {
        Span { offset: w as u32, len: (w >> 32) as u32 }
    }

    /// Whether the span lies inside `chunk_offset .. chunk_offset + chunk_len`
    /// (an empty span always does).
    pub fn within(self, chunk_offset: u32, chunk_len: u32) -> bool {
        if self.len == 0 {
            return true;
        }
        let (start, end) = (self.offset as u64, self.offset as u64 + self.len as u64);
        start >= chunk_offset as u64 && end <= chunk_offset as u64 + chunk_len as u64
    }
}

/// One call descriptor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// The call.
    pub call: u64,
    /// Method id.
    pub method: u32,
    /// Flags.
    pub flags: u16,
    /// Service index.
    pub service: u8,
    /// Status code (with STATUS).
    pub code: u8,
    /// The linearized message.
    pub block: Span,
    /// Wire bytes (referenced by a view-mode block, or an encoded message).
    pub wire: Span,
    /// Side bytes: metadata, status text (lean-frame sections).
    pub side: Span,
    /// Timeout in ns from posting (OPEN; 0: none).
    pub timeout_ns: u64,
    /// The chunk holding this descriptor's bytes (0: none).
    pub chunk: u32,
    /// A chunk of the receiver's half handed back (0: none).
    pub release: u32,
}

impl Descriptor {
    /// Whether `flag` is set.
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    /// The slot words.
    pub fn to_words(&self) -> [u64; WORDS] {
        [
            self.call,
            self.method as u64
                | (self.flags as u64) << 32
                | (self.service as u64) << 48
                | (self.code as u64) << 56,
            self.block.pack(),
            self.wire.pack(),
            self.side.pack(),
            self.timeout_ns,
            self.chunk as u64 | (self.release as u64) << 32,
        ]
    }

    /// Reads slot words (any bit pattern).
    pub fn from_words(w: [u64; WORDS]) -> Descriptor {
        Descriptor {
            call: w[0],
            method: w[1] as u32,
            flags: (w[1] >> 32) as u16,
            service: (w[1] >> 48) as u8,
            code: (w[1] >> 56) as u8,
            block: Span::unpack(w[2]),
            wire: Span::unpack(w[3]),
            side: Span::unpack(w[4]),
            timeout_ns: w[5],
            chunk: w[6] as u32,
            release: (w[6] >> 32) as u32,
        }
    }

    /// A RELEASE-only descriptor handing back `chunks` (at most ten; the
    /// rest are ignored, so callers pass ten at a time).
    pub fn releases(chunks: &[u32]) -> Descriptor {
        let mut w = [0u64; WORDS];
        w[1] = (RELEASE as u64) << 32;
        for (i, &c) in chunks.iter().take(RELEASES_PER_DESCRIPTOR).enumerate() {
            w[2 + i / 2] |= (c as u64) << (32 * (i % 2));
        }
        Descriptor::from_words(w)
    }

    /// The chunks a descriptor hands back: the ten slots of a RELEASE-only
    /// one, or its `release` field.
    pub fn released(&self) -> impl Iterator<Item = u32> {
        let w = self.to_words();
        let only = self.flags == RELEASE;
        (0..RELEASES_PER_DESCRIPTOR)
            .map(move |i| if only { (w[2 + i / 2] >> (32 * (i % 2))) as u32 } else { 0 })
            .chain(std::iter::once(if only { 0 } else { self.release }))
            .filter(|&c| c != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        let d = Descriptor {
            call: u64::MAX - 3,
            method: 0xdead_beef,
            flags: OPEN | MESSAGE | END,
            service: 7,
            code: 16,
            block: Span { offset: 0x1000, len: 64 },
            wire: Span { offset: 0x1040, len: 5 },
            side: Span { offset: 0x1080, len: 9 },
            timeout_ns: 1_000_000,
            chunk: 0x1000,
            release: 0x9000,
        };
        assert_eq!(Descriptor::from_words(d.to_words()), d);
        assert_eq!(d.released().collect::<Vec<_>>(), [0x9000]);
    }

    #[test]
    fn release_only_descriptors_carry_ten() {
        let chunks: Vec<u32> = (1..=12).map(|i| i * 0x1000).collect();
        let d = Descriptor::releases(&chunks);
        assert_eq!(d.flags, RELEASE);
        assert_eq!(d.released().collect::<Vec<_>>(), chunks[..10]);
        assert_eq!(Descriptor::releases(&[]).released().count(), 0);
    }

    #[test]
    fn spans_check_containment() {
        let s = Span { offset: 100, len: 10 };
        assert!(s.within(100, 10));
        assert!(s.within(0, 110));
        assert!(!s.within(101, 100));
        assert!(!s.within(0, 109));
        assert!(!Span { offset: u32::MAX, len: u32::MAX }.within(0, 0));
        assert!(Span { offset: 5, len: 0 }.within(1000, 1));
    }
}
