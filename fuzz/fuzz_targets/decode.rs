//! Wire decode of arbitrary bytes. The first byte selects the message type
//! (see `protoplane_fuzz::targets`), the rest is the message.
//!
//! Properties, beyond "never panics":
//! * owned and view mode agree: both fail with the same error, or both
//!   succeed and encode to the same bytes;
//! * a reused `Decoder` + `Block` hold the same message as a fresh decode
//!   (the same encoding; block bytes may differ by address-dependent padding);
//! * whatever decodes, encodes; its encoding decodes (in both modes) and
//!   encodes to the same bytes again (round-trip stability), with plain and
//!   with deterministic serialization; `encoded_len` is exact;
//! * a decoded block reads back: its JSON form prints (or is refused for a
//!   well-known type out of range, which has none);
//! * target-aware decode (every `string` / `bytes` field device-placed)
//!   succeeds whenever the plain decode does, and with its device region
//!   encodes to the same bytes; the counted decode (field-by-field
//!   baseline) holds the same message too.

#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use protoplane_fuzz::{pick, Target};
use protoplane_wire::{
    decode, json, Block, DecodeOptions, Decoder, EncodeOptions, Encoder, MessageView, Source,
};

thread_local! {
    /// Per target, a copy of its tables with every placeable `string` /
    /// `bytes` field on the device.
    static PLACED: RefCell<std::collections::HashMap<String, protoplane_schema::TableSet>> =
        RefCell::new(std::collections::HashMap::new());
    /// A decoder and block reused across inputs, as a server would.
    static REUSED: RefCell<(Decoder, Block, Encoder)> =
        RefCell::new((Decoder::new(), Block::new(), Encoder::new()));
}

fn options(view: bool) -> DecodeOptions {
    DecodeOptions { max_depth: 100, view, ..DecodeOptions::default() }
}

/// Encodes `src`, which must succeed, and checks `encoded_len` agrees.
fn encode(enc: &mut Encoder, t: &Target, src: Source<'_>, deterministic: bool) -> Vec<u8> {
    let opts = EncodeOptions { deterministic, ..EncodeOptions::default() };
    let mut out = Vec::new();
    enc.encode_into(t.tables, t.type_index, src, &opts, &mut out)
        .unwrap_or_else(|e| panic!("{}: a decoded block does not encode: {e}", t.name));
    let len = enc.encoded_len(t.tables, t.type_index, src, &opts);
    assert_eq!(len, Ok(out.len()), "{}: encoded_len", t.name);
    out
}

/// Decodes bytes this engine encoded: must succeed.
fn redecode(t: &Target, wire: &[u8], view: bool) -> Block {
    decode(t.tables, t.type_index, wire, &options(view)).unwrap_or_else(|e| {
        panic!("{}: its own encoding does not decode (view={view}): {e}", t.name)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((t, wire)) = pick(data) else { return };
    let (ts, ty) = (t.tables, t.type_index);
    let owned = decode(ts, ty, wire, &options(false));
    let view = decode(ts, ty, wire, &options(true));
    REUSED.with(|cell| {
        let (decoder, block, enc) = &mut *cell.borrow_mut();
        let reused = decoder.decode_into(ts, ty, wire, &options(false), block);
        match (&owned, reused) {
            // Same message, not necessarily the same bytes: large string
            // copies are padded by where the block's buffer happens to lie
            // (see `Block::alloc_copy`), so compare what the blocks encode.
            (Ok(fresh), Ok(())) => {
                let a = encode(enc, t, Source::owned(fresh.as_bytes()), true);
                let b = encode(enc, t, Source::owned(block.as_bytes()), true);
                assert!(a == b, "{}: reused block holds another message", t.name)
            }
            (Err(a), Err(b)) => assert_eq!(*a, b, "{}: reused decoder fails differently", t.name),
            (a, b) => panic!("{}: fresh decode {:?}, reused {b:?}", t.name, a.as_ref().map(|_| ())),
        }
        let (owned, view) = match (owned, view) {
            (Ok(o), Ok(v)) => (o, v),
            (Err(a), Err(b)) => {
                assert_eq!(a, b, "{}: owned and view mode fail differently", t.name);
                return;
            }
            (a, b) => panic!("{}: owned {:?}, view {:?}", t.name, a.map(|_| ()), b.map(|_| ())),
        };

        let first = encode(enc, t, Source::owned(owned.as_bytes()), false);
        PLACED.with(|cell| {
            let mut map = cell.borrow_mut();
            let placed = map.entry(t.name.to_string()).or_insert_with(|| {
                let mut p = protoplane_schema::TableSet::from_bytes(&ts.to_bytes())
                    .unwrap_or_else(|e| panic!("{}: tables round trip: {e}", t.name));
                for m in 0..ts.messages().len() as u32 {
                    let numbers: Vec<u32> = ts
                        .fields(ts.message(m))
                        .iter()
                        .filter(|f| {
                            matches!(
                                f.kind,
                                protoplane_schema::Kind::String | protoplane_schema::Kind::Bytes
                            )
                        })
                        .map(|f| f.number)
                        .collect();
                    for n in numbers {
                        p.set_placement(m, n, protoplane_schema::Placement::Device);
                    }
                }
                p
            });
            let mut block = Block::new();
            let mut device = Vec::new();
            decoder
                .decode_placed(placed, ty, wire, &options(false), &mut block, &mut device)
                .unwrap_or_else(|e| panic!("{}: target-aware decode fails: {e}", t.name));
            let mut out = Vec::new();
            enc.encode_into(
                placed,
                ty,
                Source::owned(block.as_bytes()).with_device(&device),
                &EncodeOptions::default(),
                &mut out,
            )
            .unwrap_or_else(|e| panic!("{}: a placed block does not encode: {e}", t.name));
            assert!(out == first, "{}: target-aware decode holds another message", t.name);
            let mut counted = Vec::new();
            decoder
                .decode_counted(ts, ty, wire, &options(false), &mut counted, None, None)
                .unwrap_or_else(|e| panic!("{}: counted decode fails: {e}", t.name));
            let again = encode(enc, t, Source::owned(&counted), false);
            assert!(again == first, "{}: counted decode holds another message", t.name);
        });
        let from_view = encode(enc, t, Source::viewing(view.as_bytes(), wire), false);
        assert!(first == from_view, "{}: owned and view decodes encode differently", t.name);
        for view in [false, true] {
            let again = redecode(t, &first, view);
            let second = encode(enc, t, Source::viewing(again.as_bytes(), &first), false);
            assert!(first == second, "{}: encoding not stable (view={view})", t.name);
        }

        let det = encode(enc, t, Source::owned(owned.as_bytes()), true);
        let again = redecode(t, &det, false);
        let det2 = encode(enc, t, Source::owned(again.as_bytes()), true);
        assert!(det == det2, "{}: deterministic encoding not stable", t.name);

        let root = MessageView::new(ts, Source::owned(owned.as_bytes()), ty)
            .unwrap_or_else(|e| panic!("{}: view of a decoded block: {e}", t.name));
        let mut text = String::new();
        // A decoded block always prints, but for a value JSON has no form
        // for (a well-known type out of its range), which is refused.
        match json::to_json(&root, &mut text) {
            Ok(()) | Err(json::PrintError::NoJsonForm(_)) => {}
            Err(e) => panic!("{}: JSON of a decoded block: {e}", t.name),
        }
    });
});
