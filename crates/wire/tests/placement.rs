//! Target-aware decode (RPCAcc's placement bit): device-placed `string` /
//! `bytes` fields land in the device region, the block carries device
//! references, a reader without the region sees handles and no bytes, and
//! the encoder with the region gives back the same wire bytes.

use protoplane_schema::{Placement, ProtoSource, TableSet};
use protoplane_wire::{
    decode, Block, BlockError, DecodeErrorKind, DecodeOptions, Decoder, EncodeOptions, Encoder,
    MessageView, Source, Value,
};

const PROTO: &str = r#"
syntax = "proto3";
package placed;
message Inner { bytes blob = 1; int32 n = 2; }
message Req {
  string name = 1;
  bytes payload = 2;
  repeated bytes chunks = 3;
  Inner inner = 4;
  uint64 id = 5;
  map<string, string> labels = 6;
}
"#;

fn tables(device: bool) -> (TableSet, u32, u32) {
    let mut ts =
        TableSet::from_proto_sources(&[ProtoSource { name: "p.proto", text: PROTO }], &["p.proto"])
            .unwrap_or_else(|e| panic!("schema: {e}"));
    let req = ts.message_by_name("placed.Req").expect("Req");
    let inner = ts.message_by_name("placed.Inner").expect("Inner");
    if device {
        assert!(ts.set_placement(req, 2, Placement::Device));
        assert!(ts.set_placement(req, 3, Placement::Device));
        assert!(ts.set_placement(inner, 1, Placement::Device));
        // Scalars and messages cannot be placed on the device.
        assert!(!ts.set_placement(req, 5, Placement::Device));
        assert!(!ts.set_placement(req, 4, Placement::Device));
        // Nor map keys and values: an entry may be re-encoded into the
        // unknown fields on decode, which needs its bytes (found by the
        // `decode` fuzz target).
        let entry = ts.message_by_name("placed.Req.LabelsEntry").expect("entry");
        assert!(!ts.set_placement(entry, 2, Placement::Device));
    }
    (ts, req, inner)
}

/// `Req { name, payload, chunks x3, inner { blob, n }, id }`, canonically encoded.
fn wire() -> Vec<u8> {
    let mut w = Vec::new();
    let field = |n: u8, data: &[u8], w: &mut Vec<u8>| {
        w.push((n << 3) | 2);
        assert!(data.len() < 0x4000);
        if data.len() < 0x80 {
            w.push(data.len() as u8);
        } else {
            w.push(data.len() as u8 | 0x80);
            w.push((data.len() >> 7) as u8);
        }
        w.extend_from_slice(data);
    };
    field(1, b"alice", &mut w);
    field(2, &[7u8; 3000], &mut w);
    for c in [&b"one"[..], b"two", b"three"] {
        field(3, c, &mut w);
    }
    let mut inner = Vec::new();
    field(1, &[9u8; 200], &mut inner);
    inner.extend_from_slice(&[0x10, 0x2a]);
    field(4, &inner, &mut w);
    w.extend_from_slice(&[0x28, 0x96, 0x01]);
    w
}

fn encode(ts: &TableSet, ty: u32, src: Source<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    Encoder::new().encode_into(ts, ty, src, &EncodeOptions::default(), &mut out).expect("encodes");
    out
}

fn bytes_of<'a>(v: &MessageView<'a>, n: u32) -> Result<Option<Value<'a>>, BlockError> {
    v.by_number(n)
}

#[test]
fn device_fields_go_to_the_device_region_and_encode_back() {
    let (ts, req, _) = tables(true);
    let input = wire();
    for opts in [DecodeOptions::default(), DecodeOptions::view()] {
        let mut block = Block::new();
        let mut device = Vec::new();
        Decoder::new()
            .decode_placed(&ts, req, &input, &opts, &mut block, &mut device)
            .expect("decodes");
        // 3000 + 3 + 3 + 5 + 200 bytes are in the device region.
        assert_eq!(device.len(), 3211);
        let (host_ts, _, _) = tables(false);
        let host = decode(&host_ts, req, &input, &DecodeOptions::default()).expect("decodes");
        if !opts.view {
            assert!(block.len() + 3000 < host.len(), "{} vs {}", block.len(), host.len());
        }
        let wire_src = if opts.view { &input[..] } else { &[][..] };
        // The application's view: host fields readable, device fields are
        // handles without bytes.
        let app =
            MessageView::new(&ts, Source::viewing(block.as_bytes(), wire_src), req).expect("view");
        assert_eq!(bytes_of(&app, 1).expect("name").and_then(|v| v.as_str()), Some("alice"));
        assert!(matches!(bytes_of(&app, 2), Err(BlockError::NoDeviceRegion)));
        assert_eq!(bytes_of(&app, 5).expect("id").and_then(|v| v.as_i128()), Some(150));
        // The engine's view: everything.
        let eng = MessageView::new(
            &ts,
            Source::viewing(block.as_bytes(), wire_src).with_device(&device),
            req,
        )
        .expect("view");
        assert_eq!(
            bytes_of(&eng, 2).expect("payload").and_then(|v| v.as_bytes()),
            Some(&[7u8; 3000][..])
        );
        let inner =
            bytes_of(&eng, 4).expect("inner").and_then(|v| v.as_message()).expect("message");
        assert_eq!(
            inner.by_number(1).expect("blob").and_then(|v| v.as_bytes()),
            Some(&[9u8; 200][..])
        );
        // Encoding pulls the device fields back: the same bytes.
        let src = Source::viewing(block.as_bytes(), wire_src).with_device(&device);
        let out = encode(&ts, req, src);
        assert_eq!(out, input);
        // Without the region the encoder refuses rather than guessing.
        let bare = Source::viewing(block.as_bytes(), wire_src);
        assert!(matches!(
            Encoder::new().encode(&ts, req, bare, &EncodeOptions::default()),
            Err(BlockError::NoDeviceRegion)
        ));
        // A region cut short (a hostile or stale one) is out of bounds, not a panic.
        let short = Source::viewing(block.as_bytes(), wire_src).with_device(&device[..100]);
        assert!(matches!(
            Encoder::new().encode(&ts, req, short, &EncodeOptions::default()),
            Err(BlockError::OutOfBounds { .. })
        ));
    }
}

#[test]
fn placement_bits_are_ignored_by_the_plain_decode() {
    let (ts, req, _) = tables(true);
    let input = wire();
    let block = decode(&ts, req, &input, &DecodeOptions::default()).expect("decodes");
    let v = MessageView::new(&ts, Source::owned(block.as_bytes()), req).expect("view");
    assert_eq!(
        v.by_number(2).expect("payload").and_then(|v| v.as_bytes()).map(<[u8]>::len),
        Some(3000)
    );
}

#[test]
fn the_device_region_is_bounded() {
    let (ts, req, _) = tables(true);
    let input = wire();
    let mut device = vec![0u8; 1000];
    let opts = DecodeOptions { max_block: 3000, ..DecodeOptions::default() };
    let e = Decoder::new()
        .decode_placed(&ts, req, &input, &opts, &mut Block::new(), &mut device)
        .expect_err("3000 more bytes do not fit");
    assert_eq!(e.kind, DecodeErrorKind::BlockTooLarge);
    // Appends: two messages share one region, each block's references in
    // its own part.
    let mut device = Vec::new();
    let (mut a, mut b) = (Block::new(), Block::new());
    let mut d = Decoder::new();
    d.decode_placed(&ts, req, &input, &DecodeOptions::default(), &mut a, &mut device).expect("a");
    d.decode_placed(&ts, req, &input, &DecodeOptions::default(), &mut b, &mut device).expect("b");
    assert_eq!(device.len(), 2 * 3211);
    for blk in [&a, &b] {
        let src = Source::owned(blk.as_bytes()).with_device(&device);
        let out = encode(&ts, req, src);
        assert_eq!(out, input);
    }
}

#[test]
fn a_device_base_offsets_every_handle() {
    let (ts, req, _) = tables(true);
    let input = wire();
    // The buffer goes to offset 4096 of a region: the encoder, given the
    // whole region, finds every device value there.
    let base = 4096u32;
    let opts = DecodeOptions { device_base: base, ..DecodeOptions::default() };
    let (mut block, mut device) = (Block::new(), Vec::new());
    Decoder::new()
        .decode_placed(&ts, req, &input, &opts, &mut block, &mut device)
        .expect("decodes");
    let mut region = vec![0u8; base as usize];
    region.extend_from_slice(&device);
    let src = Source::owned(block.as_bytes()).with_device(&region);
    assert_eq!(encode(&ts, req, src), input);
    // Read against the buffer alone, the handles point past it.
    let alone = Source::owned(block.as_bytes()).with_device(&device);
    assert!(Encoder::new().encode(&ts, req, alone, &EncodeOptions::default()).is_err());
    // A base that would put a value past 32-bit offsets is refused.
    let opts = DecodeOptions { device_base: u32::MAX - 100, ..DecodeOptions::default() };
    let e = Decoder::new()
        .decode_placed(&ts, req, &input, &opts, &mut Block::new(), &mut Vec::new())
        .expect_err("past 4 GiB");
    assert_eq!(e.kind, DecodeErrorKind::BlockTooLarge);
}
