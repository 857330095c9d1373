//! Every message of the datasets round-trips byte-exactly, in owned and
//! view mode, with tables built from `.proto` text, from the dataset's
//! `FileDescriptorSet`, and from the serialized table set.
//!
//! The datasets live in `../shared/datasets` beside the checkout (set
//! `PROTOPLANE_SHARED` to another directory holding `datasets/`).
//! HyperProtoBench is third-party data the repository does not carry: its
//! test skips with a note when it is absent. The social-network requests are
//! the recorded ones when present, else the ones `protoplane demo`
//! generates (its generator, compiled in by path) on the repository's own
//! schema.

use std::path::{Path, PathBuf};

use protoplane_schema::TableSet;
use protoplane_wire::{
    decode, json, Block, DecodeOptions, Decoder, EncodeOptions, Encoder, MessageView, Source,
};

#[path = "../../load/src/social/generate.rs"]
mod generate;

/// `datasets/NAME` of the shared directory (present or not).
fn dataset(name: &str) -> PathBuf {
    let dir = std::env::var_os("PROTOPLANE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    dir.join("datasets").join(name)
}

/// Decodes in both modes, re-encodes (plain and deterministic), compares.
fn roundtrip(ts: &TableSet, ty: u32, msg: &[u8], what: &str) {
    let mut enc = Encoder::new();
    for view in [false, true] {
        let opts = DecodeOptions { view, ..DecodeOptions::default() };
        let block = decode(ts, ty, msg, &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
        for deterministic in [false, true] {
            let eopts = EncodeOptions { deterministic, ..EncodeOptions::default() };
            let mut out = Vec::new();
            let src = Source::viewing(block.as_bytes(), msg);
            enc.encode_into(ts, ty, src, &eopts, &mut out)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(out == msg, "{what}: view={view} deterministic={deterministic}: bytes differ");
            assert_eq!(enc.encoded_len(ts, ty, src, &eopts).ok(), Some(msg.len()), "{what}");
        }
    }
    // Scatter-gather: the same bytes, payloads of 64+ bytes referenced, not copied.
    let block =
        decode(ts, ty, msg, &DecodeOptions::view()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut sg = protoplane_wire::SgList::new(64);
    let src = Source::viewing(block.as_bytes(), msg);
    enc.encode_sg(ts, ty, src, &EncodeOptions::default(), &mut sg)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(sg.to_vec() == msg, "{what}: scatter-gather bytes differ");
    // Every string / bytes payload of 64+ bytes is referenced, not copied.
    let view = MessageView::new(ts, src, ty).unwrap_or_else(|e| panic!("{what}: {e}"));
    let big = big_payload_bytes(&view, 64);
    assert_eq!(sg.total_len() - sg.copied_len(), big, "{what}: referenced bytes");
    // The reference decoder agrees.
    let block = protoplane_wire::reference::decode(ts, ty, msg, &DecodeOptions::default())
        .unwrap_or_else(|e| panic!("{what} (reference): {e}"));
    let out = protoplane_wire::encode(ts, ty, block.as_bytes(), &EncodeOptions::default())
        .unwrap_or_else(|e| panic!("{what} (reference): {e}"));
    assert!(out == msg, "{what}: reference decoder re-encodes differently");
}

/// Sum of the lengths of all string / bytes values of at least `min` bytes.
fn big_payload_bytes(view: &MessageView<'_>, min: usize) -> usize {
    let mut n = 0;
    let add = |v: protoplane_wire::Value<'_>| match v {
        protoplane_wire::Value::String(b) | protoplane_wire::Value::Bytes(b) if b.len() >= min => {
            b.len()
        }
        protoplane_wire::Value::Message(m) => big_payload_bytes(&m, min),
        _ => 0,
    };
    for f in view.fields() {
        if f.is_repeated() {
            let rep = view.repeated(f).unwrap_or_else(|e| panic!("{e}"));
            for i in 0..rep.len() {
                n += add(rep.get(i).unwrap_or_else(|e| panic!("{e}")));
            }
        } else if let Some(v) = view.get(f).unwrap_or_else(|e| panic!("{e}")) {
            n += add(v);
        }
    }
    n
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn delimited(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let (mut len, mut shift) = (0usize, 0);
        loop {
            let b = bytes[pos];
            pos += 1;
            len |= ((b & 0x7f) as usize) << shift;
            shift += 7;
            if b < 0x80 {
                break;
            }
        }
        out.push(&bytes[pos..pos + len]);
        pos += len;
    }
    out
}

#[test]
fn hyperprotobench_round_trips_byte_exactly() {
    let root = dataset("hyperprotobench");
    if !root.is_dir() {
        eprintln!("skipped: no HyperProtoBench at {} (set PROTOPLANE_SHARED)", root.display());
        return;
    }
    let manifest = String::from_utf8(read(&root.join("manifest.tsv"))).unwrap_or_default();
    let mut checked = 0;
    for line in manifest.lines().skip(1) {
        let cols: Vec<&str> = line.split('\t').collect();
        let (bench, ty_name, path) = (cols[0], cols[2], cols[cols.len() - 1]);
        let from_proto = TableSet::from_proto_files(
            &[root.join(bench).join("benchmark.proto")],
            &[root.join(bench)],
        )
        .unwrap_or_else(|e| panic!("{bench}: {e}"));
        let from_set = TableSet::from_descriptor_set(&read(
            &root.join(bench).join("benchmark.descriptor_set.pb"),
        ))
        .unwrap_or_else(|e| panic!("{bench}: {e}"));
        let from_bytes =
            TableSet::from_bytes(&from_proto.to_bytes()).unwrap_or_else(|e| panic!("{bench}: {e}"));
        assert_eq!(from_bytes.to_bytes(), from_proto.to_bytes(), "{bench}: table set bytes");
        let msg = read(&root.join(path));
        for (ts, how) in
            [(&from_proto, "proto"), (&from_set, "descriptor set"), (&from_bytes, "table bytes")]
        {
            let ty = ts.message_by_name(ty_name).unwrap_or_else(|| panic!("{ty_name}"));
            roundtrip(ts, ty, &msg, &format!("{path} ({how})"));
        }
        checked += 1;
    }
    assert_eq!(checked, 60, "manifest lists 60 messages");
}

#[test]
fn socialnetwork_round_trips_byte_exactly_and_through_json() {
    // As many generated requests per type as the recorded set holds.
    const PER_TYPE: usize = 200;
    let recorded = Some(dataset("socialnetwork")).filter(|d| d.is_dir());
    let root = recorded.clone().unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../protos/socialnetwork")
    });
    let ts = TableSet::from_proto_files(&[root.join("social_network.proto")], &[&root])
        .unwrap_or_else(|e| panic!("{e}"));
    let mut dec = Decoder::new();
    let mut block = Block::new();
    let mut checked = 0;
    for ty_name in [
        "RegisterUserRequest",
        "LoginRequest",
        "ComposeMediaRequest",
        "ComposePostRequest",
        "StorePostRequest",
    ] {
        let ty = ts.message_by_name(&format!("socialnetwork.{ty_name}")).unwrap_or(u32::MAX);
        let messages = if recorded.is_some() {
            let bytes = read(&root.join(format!("messages/{ty_name}.ldelim")));
            delimited(&bytes).into_iter().map(<[u8]>::to_vec).collect()
        } else {
            generate::generate(&ts, ty, ty_name, PER_TYPE).unwrap_or_else(|e| panic!("{e}"))
        };
        for (i, msg) in messages.iter().enumerate() {
            let msg = msg.as_slice();
            let what = format!("{ty_name}[{i}]");
            roundtrip(&ts, ty, msg, &what);
            // JSON: wire -> JSON -> wire gives the same (deterministic) bytes.
            dec.decode_into(&ts, ty, msg, &DecodeOptions::view(), &mut block)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let view = MessageView::new(&ts, Source::viewing(block.as_bytes(), msg), ty)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let mut text = String::new();
            json::to_json(&view, &mut text).unwrap_or_else(|e| panic!("{what}: {e}"));
            let back =
                json::from_json(&ts, ty, &text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
            let opts = EncodeOptions { deterministic: true, ..EncodeOptions::default() };
            let wire = protoplane_wire::encode(&ts, ty, back.as_bytes(), &opts)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(wire == msg, "{what}: JSON round trip differs: {text}");
            checked += 1;
        }
    }
    assert_eq!(checked, 5 * PER_TYPE);
}
