//! Table sets read from arbitrary bytes (`TableSet::from_bytes`: what a peer
//! process or a device is handed).
//!
//! Properties, beyond "never panics": a table set that loads serializes to
//! bytes that load again and serialize identically; and, as `codec.rs`
//! promises, a table set that passed validation cannot make the engine
//! index out of bounds: a few probe messages are decoded with each of its
//! first types, and whatever decodes is encoded and printed as JSON. Those
//! may fail with typed errors (the tables may be nonsense), never panic.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use protoplane_schema::TableSet;
use protoplane_wire::{decode, json, DecodeOptions, EncodeOptions, Encoder, MessageView, Source};

/// Types probed per table set.
const TYPES: u32 = 8;

/// Objects bigger than this are not probed: a forged `size` makes every
/// decode allocate that much up front, which is a memory bound the codec
/// does not enforce, not a memory-safety question.
const MAX_OBJECT: u32 = 1 << 16;

/// Probe messages: fields 1..=16 all with one wire type and payload shape
/// (a group's payload is its body). Large varints make slot bits that look
/// like wild references, should two slots of a forged table overlap.
fn probes() -> &'static [Vec<u8>] {
    static PROBES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    PROBES.get_or_init(|| {
        let shapes: [(u64, &[u8]); 8] = [
            (0, &[0x01]),
            (0, &[0x90, 0x80, 0x80, 0x80, 0x80, 0x80, 0x04]), // 0x100_0000_0010
            (1, &[0xff; 8]),
            (2, &[0x00]),
            (2, &[0x02, 0x08, 0x01]),
            (2, &[0x04, 0x61, 0x62, 0x63, 0x64]),
            (3, &[0x08, 0x01]),
            (5, &[0x01, 0x00, 0x00, 0x80]),
        ];
        shapes
            .iter()
            .map(|&(wire_type, payload)| {
                let mut out = Vec::new();
                for n in 1u64..=16 {
                    push_varint(&mut out, n << 3 | wire_type);
                    out.extend_from_slice(payload);
                    if wire_type == 3 {
                        push_varint(&mut out, n << 3 | 4);
                    }
                }
                out
            })
            .collect()
    })
}

fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fuzz_target!(|data: &[u8]| {
    let Ok(ts) = TableSet::from_bytes(data) else { return };
    let bytes = ts.to_bytes();
    let again = TableSet::from_bytes(&bytes)
        .unwrap_or_else(|e| panic!("to_bytes output does not load: {e}"));
    assert!(again.to_bytes() == bytes, "table set bytes not stable");

    if ts.messages().iter().any(|m| m.size > MAX_OBJECT) {
        return;
    }
    let mut enc = Encoder::new();
    let tail = &data[data.len().saturating_sub(64)..];
    for ty in 0..TYPES.min(ts.messages().len() as u32) {
        for probe in probes().iter().map(Vec::as_slice).chain([tail]) {
            for view in [false, true] {
                let opts = DecodeOptions { max_depth: 20, view, ..DecodeOptions::default() };
                let Ok(block) = decode(&ts, ty, probe, &opts) else { continue };
                let src = Source::viewing(block.as_bytes(), probe);
                let mut out = Vec::new();
                let _ = enc.encode_into(&ts, ty, src, &EncodeOptions::default(), &mut out);
                if let Ok(root) = MessageView::new(&ts, src, ty) {
                    let _ = json::to_json(&root, &mut String::new());
                }
            }
        }
    }
});
