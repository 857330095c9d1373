//! Encoding blocks that did not come from our decoder or builder.
//!
//! In split mode the engine encodes blocks the application process wrote,
//! so a block is untrusted input like wire bytes are. A block whose
//! references share sub-objects (a DAG instead of a tree) or form a cycle
//! must fail with a typed error, quickly and within bounded memory, in every
//! encode path: contiguous (`encode`, `encode_into`), size (`encoded_len`)
//! and scatter-gather (`encode_sg`).

use protoplane_schema::{ProtoSource, TableSet};
use protoplane_wire::{
    Block, BlockError, Builder, EncodeOptions, Encoder, MessageBuilder, SgList, Source, Value,
};

fn tables() -> TableSet {
    let sources = [
        ProtoSource { name: "hostile2.proto", text: include_str!("protos/hostile2.proto") },
        ProtoSource { name: "hostile3.proto", text: include_str!("protos/hostile3.proto") },
    ];
    TableSet::from_proto_sources(&sources, &["hostile2.proto", "hostile3.proto"])
        .unwrap_or_else(|e| panic!("test schema: {e}"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Every encode path fails on `block` (of type `ty`) with one of `allowed`.
fn every_encode_fails(ts: &TableSet, ty: u32, block: &[u8], allowed: &[BlockError]) {
    let opts = EncodeOptions::default();
    let src = Source::owned(block);
    let mut enc = Encoder::new();
    let check = |what: &str, r: Result<(), BlockError>| match r {
        Err(e) if allowed.contains(&e) => {}
        other => panic!("{what}: expected one of {allowed:?}, got {other:?}"),
    };
    check("encode", enc.encode(ts, ty, src, &opts).map(|_| ()));
    check("encode_into", enc.encode_into(ts, ty, src, &opts, &mut Vec::new()));
    check("encoded_len", enc.encoded_len(ts, ty, src, &opts).map(|_| ()));
    let mut sg = SgList::new(64);
    check("encode_sg", enc.encode_sg(ts, ty, src, &opts, &mut sg));
    // The encoder is still usable afterwards.
    let mut b = Builder::new(ts, ty).unwrap_or_else(|e| panic!("{e}"));
    let root = b.root();
    b.set(root, 2, Value::I32(7)).unwrap_or_else(|e| panic!("{e}"));
    let ok = b.finish();
    let bytes = enc.encode(ts, ty, Source::owned(ok.as_bytes()), &opts);
    assert_eq!(bytes.ok(), Some(&[0x10, 0x07][..]));
}

/// `hostile.R` (`repeated R kids = 3`) nested `levels` deep, two kids per
/// level: the first continues the chain, the second is empty.
fn chain(ts: &TableSet, levels: usize) -> Block {
    let ty = ts.message_by_name("hostile.R").unwrap_or(u32::MAX);
    let mut b = Builder::new(ts, ty).unwrap_or_else(|e| panic!("{e}"));
    let mut at: MessageBuilder = b.root();
    for _ in 0..levels {
        let next = b.message(at, 3).unwrap_or_else(|e| panic!("{e}"));
        b.message(at, 3).unwrap_or_else(|e| panic!("{e}"));
        at = next;
    }
    b.finish()
}

/// Offset of `kids`' array reference slot inside an `R` object.
fn kids_slot(ts: &TableSet) -> usize {
    let ty = ts.message_by_name("hostile.R").unwrap_or(u32::MAX);
    let m = ts.message(ty);
    ts.fields(m).iter().find(|f| f.number == 3).map_or(0, |f| f.offset as usize)
}

#[test]
fn shared_sub_objects_fail_instead_of_exploding() {
    // 60 levels whose two kids are the same object: 2^60 visits, 2^60+
    // output bytes, from a block of a few kilobytes.
    let ts = tables();
    let ty = ts.message_by_name("hostile.R").unwrap_or(u32::MAX);
    let mut block = chain(&ts, 60).into_bytes();
    let slot = kids_slot(&ts);
    let mut obj = u32_at(&block, 0) as usize;
    for _ in 0..60 {
        let arr = u64_at(&block, obj + slot);
        let (elems, len) = (arr as u32 as usize, (arr >> 32) as u32 & 0x3fff_ffff);
        assert_eq!(len, 2);
        let first = u64_at(&block, elems);
        put_u64(&mut block, elems + 8, first);
        obj = first as u32 as usize;
    }
    every_encode_fails(&ts, ty, &block, &[BlockError::TooLarge]);
}

#[test]
fn reference_cycles_fail() {
    // The first kid of the innermost level points back at the root.
    let ts = tables();
    let ty = ts.message_by_name("hostile.R").unwrap_or(u32::MAX);
    let mut block = chain(&ts, 3).into_bytes();
    let slot = kids_slot(&ts);
    let root = u32_at(&block, 0) as usize;
    let mut obj = root;
    for _ in 0..3 {
        let arr = u64_at(&block, obj + slot);
        obj = u64_at(&block, arr as u32 as usize) as u32 as usize;
    }
    // The innermost object has no kids: give it the root's array.
    let root_kids = u64_at(&block, root + slot);
    put_u64(&mut block, obj + slot, root_kids);
    every_encode_fails(&ts, ty, &block, &[BlockError::TooDeep, BlockError::TooLarge]);
}

#[test]
fn max_size_bounds_the_output() {
    let ts = tables();
    let ty = ts.message_by_name("hostile.P2").unwrap_or(u32::MAX);
    let mut b = Builder::new(&ts, ty).unwrap_or_else(|e| panic!("{e}"));
    let root = b.root();
    let big = vec![b'x'; 10_000];
    b.set(root, 2, Value::Bytes(&big)).unwrap_or_else(|e| panic!("{e}"));
    b.set(root, 3, Value::I32(1)).unwrap_or_else(|e| panic!("{e}"));
    let block = b.finish();
    let src = Source::owned(block.as_bytes());
    let mut enc = Encoder::new();
    let small = EncodeOptions { max_size: 1000, ..EncodeOptions::default() };
    assert_eq!(enc.encode(&ts, ty, src, &small).err(), Some(BlockError::TooLarge));
    assert_eq!(enc.encoded_len(&ts, ty, src, &small).err(), Some(BlockError::TooLarge));
    let n = enc.encode(&ts, ty, src, &EncodeOptions::default()).map(<[u8]>::len);
    assert_eq!(n.ok(), Some(1 + 2 + 10_000 + 2)); // tag, length, bytes; then id
}
