//! Encoding arbitrary blocks. The first byte selects the message type (see
//! `protoplane_fuzz::targets`), the rest is taken as a linearized block: in
//! split mode blocks are written by the application process, so the encoder
//! and the views treat them as untrusted input.
//!
//! Properties, beyond "never panics, never allocates past the bounds":
//! * the back-to-front encoder (`encode`, `encode_into`), the size pass
//!   (`encoded_len`) and the scatter-gather encoder agree: whenever the
//!   contiguous encode succeeds, the others do too, with the same length
//!   and the same bytes;
//! * a view of the block reads without panicking (JSON printing walks every
//!   field, failing with an error where the block is inconsistent);
//! * a position kept outside the borrow (the Python package's views keep
//!   an object's offset, `MessageView::offset`) re-opens and encodes
//!   without panicking wherever it points, and at the root encodes to the
//!   bytes the root's encoding has.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protoplane_fuzz::pick;
use protoplane_wire::{json, EncodeOptions, Encoder, MessageView, SgList, Source};

fuzz_target!(|data: &[u8]| {
    let Some((t, block)) = pick(data) else { return };
    let (ts, ty) = (t.tables, t.type_index);
    let src = Source::owned(block);
    for deterministic in [false, true] {
        let opts = EncodeOptions { deterministic, ..EncodeOptions::default() };
        let mut enc = Encoder::new();
        let Ok(bytes) = enc.encode(ts, ty, src, &opts).map(<[u8]>::to_vec) else {
            let _ = enc.encoded_len(ts, ty, src, &opts);
            let _ = enc.encode_sg(ts, ty, src, &opts, &mut SgList::new(64));
            continue;
        };
        let mut into = Vec::new();
        enc.encode_into(ts, ty, src, &opts, &mut into)
            .unwrap_or_else(|e| panic!("{}: encode ok, encode_into {e}", t.name));
        assert!(into == bytes, "{}: encode_into differs", t.name);
        let len = enc.encoded_len(ts, ty, src, &opts);
        assert_eq!(len, Ok(bytes.len()), "{}: encoded_len", t.name);
        let mut sg = SgList::new(16);
        enc.encode_sg(ts, ty, src, &opts, &mut sg)
            .unwrap_or_else(|e| panic!("{}: encode ok, encode_sg {e}", t.name));
        assert!(sg.to_vec() == bytes, "{}: scatter-gather encoding differs", t.name);
    }
    let opts = EncodeOptions::default();
    if let Ok(view) = MessageView::new(ts, src, ty) {
        let mut text = String::new();
        let _ = json::to_json(&view, &mut text);
        let whole = Encoder::new().encode(ts, ty, src, &opts).map(<[u8]>::to_vec);
        let at_root =
            Encoder::new().encode_at(ts, ty, src, view.offset(), &opts).map(<[u8]>::to_vec);
        assert_eq!(whole, at_root, "{}: encode_at the root differs from encode", t.name);
    }
    let n = block.len();
    for at in [0, 8, 16, n / 3, n / 2, n.saturating_sub(8), n, n + 1, usize::MAX] {
        if let Ok(v) = MessageView::reopen(ts, src, ty, at) {
            let mut text = String::new();
            let _ = json::to_json(&v, &mut text);
        }
        let _ = Encoder::new().encode_at(ts, ty, src, at, &opts);
    }
});
