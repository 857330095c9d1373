//! Helpers shared by the tests: a tiny deterministic RNG and the
//! encode / decode round trip every test runs.

#![allow(dead_code)] // each test file uses a different subset

use protoplane_schema::TableSet;
use protoplane_wire::{Block, DecodeOptions, EncodeOptions, Encoder, Source};

/// xorshift64: reproducible inputs without a dependency.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub(crate) fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }

    pub(crate) fn word(&mut self, max: usize) -> String {
        let len = self.below(max as u64 + 1) as usize;
        (0..len).map(|_| (b'a' + self.below(26) as u8) as char).collect()
    }

    pub(crate) fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = self.below(max as u64 + 1) as usize;
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// Deterministic encoding (map entries sorted by key), as prost's `BTreeMap`s give.
pub(crate) fn encode(ts: &TableSet, type_index: u32, block: &Block) -> Vec<u8> {
    let opts = EncodeOptions { deterministic: true, ..EncodeOptions::default() };
    let mut out = Vec::new();
    Encoder::new()
        .encode_into(ts, type_index, Source::owned(block.as_bytes()), &opts, &mut out)
        .expect("a builder's block encodes");
    out
}

/// Decodes `wire` in owned mode and in view mode.
pub(crate) fn decode_both(ts: &TableSet, type_index: u32, wire: &[u8]) -> (Block, Block) {
    let owned = protoplane_wire::decode(ts, type_index, wire, &DecodeOptions::default())
        .expect("owned decode");
    let view =
        protoplane_wire::decode(ts, type_index, wire, &DecodeOptions::view()).expect("view decode");
    (owned, view)
}
