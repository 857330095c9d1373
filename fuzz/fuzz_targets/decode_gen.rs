//! Generated decoders against the table-driven decoder on arbitrary bytes.
//! The first byte selects the message type and its generated decoder (see
//! `protoplane_fuzz::generated::targets`), the rest is the message.
//!
//! Properties, beyond "never panics", in owned and in view mode:
//! * `protoplane_wire::gen::decode` and `protoplane_wire::decode` agree:
//!   both fail with the same `DecodeError`, or both succeed with the same
//!   block, byte for byte when the input is under 2048 bytes (larger string
//!   copies are padded by where the block's buffer happens to lie, see
//!   `Block::alloc_copy`), and encoding to the same deterministic bytes;
//! * `protoplane_wire::gen::decode_into` with a reused `Decoder` + `Block`
//!   agrees too: the same error, or a block encoding to the same bytes;
//! * the generated encoder writes the table-driven encoder's bytes for every
//!   decoded block (plain and deterministic), and for the same block with a
//!   few bytes flipped (a forged block) it fails exactly when the
//!   table-driven encoder fails, with the same error.
//!
//! The comparison is `same` of crates/codegen-tests/tests/generated.rs.

#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use protoplane_fuzz::generated::{pick, GenTarget};
use protoplane_wire::{Block, DecodeOptions, Decoder, EncodeOptions, Encoder, Source};

thread_local! {
    /// A decoder and block reused across inputs, as a server would.
    static REUSED: RefCell<(Decoder, Block, Encoder)> =
        RefCell::new((Decoder::new(), Block::new(), Encoder::new()));
}

/// The deterministic encoding of a decoded block, which must succeed.
fn encode(enc: &mut Encoder, t: &GenTarget, block: &Block, wire: &[u8]) -> Vec<u8> {
    let opts = EncodeOptions { deterministic: true, ..EncodeOptions::default() };
    let mut out = Vec::new();
    enc.encode_into(
        t.tables,
        t.type_index,
        Source::viewing(block.as_bytes(), wire),
        &opts,
        &mut out,
    )
    .unwrap_or_else(|e| panic!("{}: a decoded block does not encode: {e}", t.name()));
    out
}

/// The table-driven and the generated encoder agree on `block`.
fn same_encoding(t: &GenTarget, block: &[u8], wire: &[u8]) {
    let src = Source::viewing(block, wire);
    for deterministic in [false, true] {
        let opts = EncodeOptions { deterministic, max_depth: 20, ..EncodeOptions::default() };
        let (mut a, mut b) = (Encoder::new(), Encoder::new());
        let table = a.encode(t.tables, t.type_index, src, &opts);
        let generated =
            protoplane_wire::gen::encode(t.tables, t.type_index, t.encoder, &mut b, src, &opts);
        assert!(
            table == generated,
            "{}: the generated encoder differs: {table:?} vs {generated:?}",
            t.name()
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((t, wire)) = pick(data) else { return };
    let (ts, ty, fields, name) = (t.tables, t.type_index, t.fields, t.name());
    REUSED.with(|cell| {
        let (decoder, reused, enc) = &mut *cell.borrow_mut();
        for view in [false, true] {
            let opts = DecodeOptions { view, max_depth: 20, ..DecodeOptions::default() };
            let table = protoplane_wire::decode(ts, ty, wire, &opts);
            let generated = protoplane_wire::gen::decode(ts, ty, fields, wire, &opts);
            match (&table, &generated) {
                (Ok(a), Ok(b)) => {
                    if wire.len() < 2048 {
                        assert!(a == b, "{name} view={view}: blocks differ for {wire:02x?}");
                    }
                    let (ea, eb) = (encode(enc, t, a, wire), encode(enc, t, b, wire));
                    assert!(ea == eb, "{name} view={view}: encodings differ for {wire:02x?}");
                    same_encoding(t, a.as_bytes(), wire);
                    let mut forged = a.as_bytes().to_vec();
                    for (i, &byte) in wire.iter().take(4).enumerate() {
                        let at = 16 + (byte as usize * 31 + i * 7) % (forged.len() - 16).max(1);
                        if let Some(b) = forged.get_mut(at) {
                            *b ^= 1 << (byte % 8);
                        }
                        same_encoding(t, &forged, wire);
                    }
                }
                (Err(a), Err(b)) => {
                    assert_eq!(a, b, "{name} view={view}: errors differ for {wire:02x?}")
                }
                (a, b) => panic!(
                    "{name} view={view}: tables {:?}, generated {:?} for {wire:02x?}",
                    a.as_ref().map(|_| ()),
                    b.as_ref().map(|_| ())
                ),
            }
            let again =
                protoplane_wire::gen::decode_into(ts, ty, fields, decoder, wire, &opts, reused);
            match (&table, again) {
                (Ok(a), Ok(())) => {
                    let (ea, eb) = (encode(enc, t, a, wire), encode(enc, t, reused, wire));
                    assert!(ea == eb, "{name} view={view}: reused block holds another message");
                }
                (Err(a), Err(b)) => {
                    assert_eq!(*a, b, "{name} view={view}: reused decoder fails differently")
                }
                (a, b) => panic!(
                    "{name} view={view}: tables {:?}, reused generated {b:?}",
                    a.as_ref().map(|_| ())
                ),
            }
        }
    });
});
