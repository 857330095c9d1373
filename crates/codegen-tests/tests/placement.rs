//! Device placement through generated code: the `(protoplane.placement)`
//! option lands in the generated tables, a target-aware decode
//! (`Decoder::decode_placed`) puts those fields in the device region, and
//! the generated view reads them as empty through the plain accessor and as
//! a handle through `<field>_device()`. Run-time field updating
//! (`PlacementTable`) changes the next decode only.

use protoplane_codegen_tests::placed::{Frame, FrameView};
use protoplane_schema::{FieldFlags, Placement, PlacementTable, TableSet};
use protoplane_wire::{Block, BlockError, DecodeOptions, Decoder, MessageView, Ref, Source};

const FRAME: &str = "codegen.placed.Frame";

use protoplane_test_support::wire::{len_field, varint};

const IMAGE: &[u8] = b"\x89PNG pixels pixels pixels";

/// `Frame { name: "cat", image: IMAGE, caption: "a cat", text: "meow",
/// id: 7, image_device: "host copy", samples: [1, 2, 3] }` on the wire.
fn wire() -> Vec<u8> {
    let mut w = Vec::new();
    len_field(&mut w, 1, b"cat");
    len_field(&mut w, 2, IMAGE);
    len_field(&mut w, 3, b"a cat");
    len_field(&mut w, 4, b"meow");
    varint(&mut w, 6 << 3);
    varint(&mut w, 7);
    len_field(&mut w, 7, b"host copy");
    len_field(&mut w, 8, [1, 2, 3]);
    w
}

/// Decodes `wire()` as a `Frame` with `tables`, target-aware: the block
/// and the device region.
fn decode_placed(tables: &TableSet) -> (Block, Vec<u8>) {
    let (mut block, mut device) = (Block::new(), Vec::new());
    let opts = DecodeOptions::default();
    Decoder::new()
        .decode_placed(tables, Frame::TYPE_INDEX, &wire(), &opts, &mut block, &mut device)
        .expect("decodes");
    (block, device)
}

fn device_bytes(device: &[u8], r: Ref) -> &[u8] {
    assert!(r.device && !r.wire);
    &device[r.offset as usize..r.offset as usize + r.len as usize]
}

#[test]
fn the_option_reaches_the_generated_tables() {
    let ts = protoplane_codegen_tests::placed::tables();
    let frame = ts.message(Frame::TYPE_INDEX);
    let mut placed: Vec<&str> = ts
        .fields(frame)
        .iter()
        .filter(|f| f.flags.has(FieldFlags::DEVICE))
        .map(|f| ts.str(f.name))
        .collect();
    placed.sort_unstable();
    assert_eq!(placed, ["caption", "image", "samples", "text"]);
}

#[test]
fn device_fields_read_as_empty_and_as_a_handle() {
    let ts = protoplane_codegen_tests::placed::tables();
    let (block, device) = decode_placed(ts);
    let view = FrameView::from_block(block.as_bytes(), &[]).expect("view");

    // Host fields read as usual and have no device handle.
    assert_eq!(view.name(), "cat");
    assert_eq!(view.name_device(), None);
    assert_eq!(view.id(), 7);
    // The field named like `image`'s handle keeps its name.
    assert_eq!(view.image_device(), "host copy");
    assert_eq!(view.image_device_device(), None);

    // Device fields: the plain accessors read as empty (documented), the
    // field is still present, and `_device` gives the reference.
    assert_eq!(view.image(), b"");
    assert_eq!(view.caption(), "");
    assert_eq!(view.caption_bytes(), b"");
    assert_eq!(view.text(), "");
    let image = view.image_device_().expect("image is on the device");
    assert_eq!(image.len as usize, IMAGE.len());
    assert_eq!(device_bytes(&device, image), IMAGE);
    let caption = view.caption_device().expect("caption is on the device");
    assert_eq!(device_bytes(&device, caption), b"a cat");
    let text = view.text_device().expect("text is on the device");
    assert_eq!(device_bytes(&device, text), b"meow");
    // The oneof member that is not set has no handle.
    assert_eq!(view.code(), 0);

    // The dynamic view says why: no device region.
    let dynamic = view.as_view();
    let field = ts.field_by_name(ts.message(Frame::TYPE_INDEX), "image").expect("image");
    assert!(matches!(dynamic.get(field), Err(BlockError::NoDeviceRegion)));

    // A reader that has the device region (the engine) resolves them
    // through the same generated accessors.
    let src = Source::viewing(block.as_bytes(), &[]).with_device(&device);
    let with_device = MessageView::new(ts, src, Frame::TYPE_INDEX).expect("view");
    let view = FrameView::from_view(with_device).expect("typed");
    assert_eq!(view.image(), IMAGE);
    assert_eq!(view.caption(), "a cat");
    assert_eq!(view.text(), "meow");
    assert_eq!(view.image_device_(), Some(image));
}

#[test]
fn a_plain_decode_keeps_everything_on_the_host() {
    let block = Frame::decode(&wire(), &DecodeOptions::default()).expect("decodes");
    let view = FrameView::from_block(block.as_bytes(), &[]).expect("view");
    assert_eq!(view.image(), IMAGE);
    assert_eq!(view.image_device_(), None);
    assert_eq!(view.caption(), "a cat");
    assert_eq!(view.caption_device(), None);
    assert_eq!(view.text_device(), None);
}

#[test]
fn field_updating_changes_the_next_decode_only() {
    let table = PlacementTable::new(protoplane_codegen_tests::placed::tables().clone());
    let in_progress = table.snapshot();
    assert!(table.is_on_device(FRAME, "image"));
    assert_eq!(table.move_to_host(FRAME, "image").ok(), Some(true));
    assert_eq!(table.move_to_device(FRAME, "name").ok(), Some(true));
    assert!(!table.is_on_device(FRAME, "image"));
    assert!(table.move_to_device(FRAME, "id").is_err());

    // The decode that started before the update places as it started.
    let (block, device) = decode_placed(&in_progress);
    let view = FrameView::from_block(block.as_bytes(), &[]).expect("view");
    assert_eq!(view.image(), b"");
    assert_eq!(view.image_device_().map(|r| device_bytes(&device, r)), Some(IMAGE));
    assert_eq!(view.name(), "cat");

    // The next one follows the update.
    let next = table.snapshot();
    assert_eq!(
        next.field_by_name(next.message(Frame::TYPE_INDEX), "name").map(|f| f.placement()),
        Some(Placement::Device)
    );
    let (block, device) = decode_placed(&next);
    let view = FrameView::from_block(block.as_bytes(), &[]).expect("view");
    assert_eq!(view.image(), IMAGE);
    assert_eq!(view.image_device_(), None);
    assert_eq!(view.name(), "");
    assert_eq!(view.name_device().map(|r| device_bytes(&device, r)), Some(&b"cat"[..]));
}
