//! Code generated from an edition 2023 schema (`protos/editions/ed.proto`):
//! every feature shows on the wire exactly as the proto2 or proto3 construct
//! it replaces would (bytes checked one by one), and decoding enforces what
//! the features ask (required fields, closed enums, UTF-8).

mod common;

use protoplane_codegen_tests::ed;
use protoplane_wire::{decode, json, DecodeOptions, MessageView, Source};

use common::{decode_both, encode};

type Res = Result<(), Box<dyn std::error::Error>>;

fn built() -> Result<protoplane_wire::Block, protoplane_wire::BuildError> {
    let mut b = ed::Ed::builder();
    let mut m = ed::EdBuilder::root(&mut b);
    m.set_id(7).set_count(0).set_quiet(0).set_mood(ed::Mood::Angry);
    m.extend_packed([1, 2])?.extend_expanded([3, 4])?;
    m.part()?.set_n(5);
    m.add_parts()?.set_n(6);
    m.set_label("x")?;
    Ok(b.finish())
}

#[test]
fn features_choose_the_encoding_field_by_field() -> Res {
    let ts = ed::tables();
    let wire = encode(ts, ed::Ed::TYPE_INDEX, &built()?);
    #[rustfmt::skip]
    let want = [
        0x08, 7,                // id: LEGACY_REQUIRED
        0x10, 0,                // count: explicit presence writes a set zero
                                // quiet: IMPLICIT leaves a zero out
        0x22, 2, 1, 2,          // packed: PACKED (the edition's default)
        0x28, 3, 0x28, 4,       // expanded: EXPANDED
        0x30, 2,                // mood
        0x43, 0x08, 5, 0x44,    // part: DELIMITED, a group's start and end tags
        0x4b, 0x08, 6, 0x4c,    // parts: DELIMITED too
        0x5a, 1, b'x',          // label
    ];
    assert_eq!(wire, want);
    let (owned, view) = decode_both(ts, ed::Ed::TYPE_INDEX, &wire);
    for (block, w) in [(&owned, &[][..]), (&view, &wire[..])] {
        let v = ed::EdView::from_block(block.as_bytes(), w)?;
        assert_eq!((v.id(), v.count(), v.has_count(), v.quiet()), (7, 0, true, 0));
        assert_eq!((v.packed().to_vec(), v.expanded().to_vec()), (vec![1, 2], vec![3, 4]));
        assert_eq!((v.mood(), v.has_open()), (2, false));
        assert_eq!(v.part().map(|p| p.n()), Some(5));
        assert_eq!(v.parts().iter().map(|p| p.n()).collect::<Vec<_>>(), [6]);
        assert_eq!(v.label(), "x");
    }
    assert_eq!(encode(ts, ed::Ed::TYPE_INDEX, &owned), wire);
    let mut s = String::new();
    let view = MessageView::new(ts, Source::owned(owned.as_bytes()), ed::Ed::TYPE_INDEX)?;
    json::to_json(&view, &mut s)?;
    assert_eq!(
        s,
        r#"{"id":7,"count":0,"packed":[1,2],"expanded":[3,4],"mood":"ANGRY","part":{"n":5},"parts":[{"n":6}],"label":"x"}"#
    );
    Ok(())
}

#[test]
fn decoding_enforces_what_the_features_ask() -> Res {
    let ts = ed::tables();
    let opts = DecodeOptions::default();
    let ty = ed::Ed::TYPE_INDEX;
    // A closed enum keeps an undeclared number as an unknown field...
    let block = decode(ts, ty, &[0x08, 7, 0x30, 9], &opts)?;
    let v = MessageView::new(ts, Source::owned(block.as_bytes()), ty)?;
    assert_eq!(v.unknown_fields()?, [0x30, 9]);
    assert!(!ed::EdView::from_block(block.as_bytes(), &[])?.has_mood());
    // ...an open one as its value.
    let block = decode(ts, ty, &[0x08, 7, 0x38, 9], &opts)?;
    assert_eq!(ed::EdView::from_block(block.as_bytes(), &[])?.open(), 9);
    // LEGACY_REQUIRED is required.
    assert!(decode(ts, ty, &[0x10, 1], &opts).is_err());
    // VERIFY (the edition's default) refuses a string that is not UTF-8.
    assert!(decode(ts, ty, &[0x08, 7, 0x5a, 1, 0xff], &opts).is_err());
    // A DELIMITED field sent length-prefixed has the wrong wire type: an
    // unknown field, as for any field (protobuf's rule), not the part.
    let block = decode(ts, ty, &[0x08, 7, 0x42, 2, 0x08, 5], &opts)?;
    let v = MessageView::new(ts, Source::owned(block.as_bytes()), ty)?;
    assert_eq!(v.unknown_fields()?, [0x42, 2, 0x08, 5]);
    assert!(ed::EdView::from_block(block.as_bytes(), &[])?.part().is_none());
    Ok(())
}
