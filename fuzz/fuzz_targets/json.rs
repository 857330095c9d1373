//! JSON parsing of arbitrary UTF-8. The first byte selects the message type
//! (see `protoplane_fuzz::targets`), the rest is the JSON text.
//!
//! Properties, beyond "never panics": a message `from_json` accepts
//! encodes, and its encoding decodes (required fields aside: JSON does not
//! check them); printing it back to JSON either works or says why (a
//! well-known type out of range), and what it prints parses again.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protoplane_fuzz::pick;
use protoplane_wire::{decode, json, DecodeOptions, EncodeOptions, Encoder, MessageView, Source};

fuzz_target!(|data: &[u8]| {
    let Some((t, rest)) = pick(data) else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let Ok(block) = json::from_json(t.tables, t.type_index, text) else { return };
    let mut wire = Vec::new();
    Encoder::new()
        .encode_into(
            t.tables,
            t.type_index,
            Source::owned(block.as_bytes()),
            &EncodeOptions::default(),
            &mut wire,
        )
        .unwrap_or_else(|e| {
            panic!("{}: from_json accepted a message that does not encode: {e}", t.name)
        });
    let opts = DecodeOptions { check_required: false, ..DecodeOptions::default() };
    if let Err(e) = decode(t.tables, t.type_index, &wire, &opts) {
        panic!("{}: the encoding of a JSON message does not decode: {e}", t.name);
    }
    let mut text = String::new();
    let printed = MessageView::new(t.tables, Source::owned(block.as_bytes()), t.type_index)
        .map_err(json::PrintError::from)
        .and_then(|v| json::to_json(&v, &mut text));
    if printed.is_ok() {
        if let Err(e) = json::from_json(t.tables, t.type_index, &text) {
            panic!("{}: printed JSON does not parse again: {e}\n{text}", t.name);
        }
    }
});
