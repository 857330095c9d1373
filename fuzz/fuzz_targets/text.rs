//! Text-format parsing of arbitrary UTF-8. The first byte selects the
//! message type (see `protoplane_fuzz::targets`), the rest is the text.
//!
//! Properties, beyond "never panics": a message `from_text` accepts
//! encodes, and its encoding decodes; it prints as text, and what it prints
//! parses again and prints the same (the text form is a fixed point after
//! one round: printing is canonical).

#![no_main]

use libfuzzer_sys::fuzz_target;
use protoplane_fuzz::pick;
use protoplane_wire::{decode, text, DecodeOptions, EncodeOptions, Encoder, MessageView, Source};

fn print(t: &protoplane_fuzz::Target, block: &protoplane_wire::Block) -> String {
    let mut out = String::new();
    MessageView::new(t.tables, Source::owned(block.as_bytes()), t.type_index)
        .map_err(text::PrintError::from)
        .and_then(|v| text::to_text(&v, &mut out))
        .unwrap_or_else(|e| panic!("{}: a parsed message does not print: {e}", t.name));
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((t, rest)) = pick(data) else { return };
    let Ok(input) = std::str::from_utf8(rest) else { return };
    let Ok(block) = text::from_text(t.tables, t.type_index, input) else { return };
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
            panic!("{}: from_text accepted a message that does not encode: {e}", t.name)
        });
    if let Err(e) = decode(t.tables, t.type_index, &wire, &DecodeOptions::default()) {
        panic!("{}: the encoding of a text message does not decode: {e}", t.name);
    }
    let printed = print(t, &block);
    let again = text::from_text(t.tables, t.type_index, &printed).unwrap_or_else(|e| {
        panic!("{}: printed text does not parse again: {e}\n{printed}", t.name)
    });
    assert_eq!(print(t, &again), printed, "{}: printing is not canonical", t.name);
});
