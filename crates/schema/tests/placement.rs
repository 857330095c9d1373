//! Placement: the `(protoplane.placement)` option (every way descriptors
//! reach the tables), the engine-config list, and run-time field updating.

use std::sync::Arc;

use prost::Message as _;
use protoplane_schema::{
    apply_placements, compile_proto_sources, compile_protos, decode_descriptor_set, FieldFlags,
    Placement, PlacementTable, ProtoSource, SchemaError, TableSet, OPTIONS_PROTO,
    OPTIONS_PROTO_NAME, PLACEMENT_EXTENSION,
};

const PLACED: &str = r#"
syntax = "proto3";
package t.placed;
import "protoplane/options.proto";

message Frame {
  string name = 1;
  bytes image = 2 [(protoplane.placement) = DEVICE];
  string caption = 3 [(protoplane.placement) = HOST];
  repeated float samples = 4 [(protoplane.placement) = DEVICE];
  repeated string tags = 5 [(protoplane.placement) = DEVICE];
  int64 id = 6;
  oneof body {
    string text = 7 [(protoplane.placement) = DEVICE];
    bytes blob = 8;
  }
  Inner inner = 9;
  message Inner {
    bytes payload = 1 [(protoplane.placement) = DEVICE, deprecated = true];
    string note = 2;
  }
}
"#;

/// Every `(message, field)` with the DEVICE bit.
fn device_fields(ts: &TableSet) -> Vec<String> {
    let mut out = Vec::new();
    for (i, m) in ts.messages().iter().enumerate() {
        for f in ts.fields(m) {
            if f.flags.has(FieldFlags::DEVICE) {
                assert_eq!(f.placement(), Placement::Device);
                out.push(format!("{}.{}", ts.message_name(i as u32), ts.str(f.name)));
            }
        }
    }
    out.sort();
    out
}

const EXPECTED: [&str; 5] = [
    "t.placed.Frame.Inner.payload",
    "t.placed.Frame.image",
    "t.placed.Frame.samples",
    "t.placed.Frame.tags",
    "t.placed.Frame.text",
];

fn placed_sources() -> TableSet {
    // `protoplane/options.proto` is not among the sources: it is built in.
    TableSet::from_proto_sources(
        &[ProtoSource { name: "placed.proto", text: PLACED }],
        &["placed.proto"],
    )
    .expect("placed.proto loads")
}

#[test]
fn the_option_sets_the_device_bit_on_exactly_those_fields() {
    assert_eq!(device_fields(&placed_sources()), EXPECTED);
}

#[test]
fn the_option_file_is_built_into_the_disk_loader() {
    let dir = std::env::temp_dir().join(format!("protoplane-placement-{}", std::process::id()));
    let pkg = dir.join("t");
    std::fs::create_dir_all(&pkg).expect("temp dir");
    std::fs::write(pkg.join("placed.proto"), PLACED).expect("write");
    // The include root holds only the user's file.
    let ts = TableSet::from_proto_files(&[pkg.join("placed.proto")], &[&dir]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(device_fields(&ts.expect("loads from disk")), EXPECTED);
}

#[test]
fn placements_survive_every_descriptor_path() {
    let sources = [ProtoSource { name: "placed.proto", text: PLACED }];
    // The prost_types set the loaders return (uninterpreted form) ...
    let set = compile_proto_sources(&sources, &["placed.proto"]).expect("compiles");
    let ts = TableSet::from_file_descriptor_set(&set).expect("lowers");
    assert_eq!(device_fields(&ts), EXPECTED);
    // ... its bytes ...
    let ts = TableSet::from_descriptor_set(&set.encode_to_vec()).expect("decodes");
    assert_eq!(device_fields(&ts), EXPECTED);
    // ... and the interpreted form (an extension field in the encoded
    // FieldOptions, what `protoc --descriptor_set_out` writes).
    let mut compiler = protox::Compiler::with_file_resolver(Fixed(vec![
        ("placed.proto", PLACED),
        (OPTIONS_PROTO_NAME, OPTIONS_PROTO),
    ]));
    compiler.include_imports(true);
    compiler.open_file("placed.proto").expect("protox compiles");
    let raw = compiler.encode_file_descriptor_set();
    let plain = compiler.file_descriptor_set();
    let no_uninterpreted = plain.file.iter().flat_map(|f| &f.message_type).all(|m| {
        m.field.iter().all(|f| f.options.as_ref().is_none_or(|o| o.uninterpreted_option.is_empty()))
    });
    assert!(no_uninterpreted, "protox resolves options: the raw bytes are the only carrier");
    assert_eq!(device_fields(&TableSet::from_descriptor_set(&raw).expect("raw")), EXPECTED);
    let decoded = decode_descriptor_set(&raw).expect("decodes");
    assert_eq!(
        device_fields(&TableSet::from_file_descriptor_set(&decoded).expect("set")),
        EXPECTED
    );
    // prost_types drops the extension: that set has no placement.
    assert!(device_fields(&TableSet::from_file_descriptor_set(&plain).expect("plain")).is_empty());
}

#[test]
fn serialized_tables_keep_the_bit() {
    let ts = placed_sources();
    let back = TableSet::from_bytes(&ts.to_bytes()).expect("round trip");
    assert_eq!(device_fields(&back), EXPECTED);
}

#[test]
fn the_option_on_a_field_that_cannot_be_placed_is_an_error() {
    for (decl, field, kind) in [
        ("int64 id = 1 [(protoplane.placement) = DEVICE];", "id", "int64"),
        ("Other sub = 1 [(protoplane.placement) = DEVICE];", "sub", "message"),
        ("repeated Other subs = 1 [(protoplane.placement) = DEVICE];", "subs", "repeated message"),
        ("map<string, bytes> m = 1 [(protoplane.placement) = DEVICE];", "m", "map"),
    ] {
        let text = format!(
            "syntax = \"proto3\"; package t.bad; import \"protoplane/options.proto\";\n\
             message Other {{ bytes b = 1; }}\nmessage Msg {{ {decl} }}"
        );
        let err = TableSet::from_proto_sources(
            &[ProtoSource { name: "bad.proto", text: &text }],
            &["bad.proto"],
        )
        .expect_err(decl);
        assert!(matches!(err, SchemaError::Placement(_)), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&format!("t.bad.Msg.{field}:")), "{msg}");
        assert!(msg.contains(&format!("on a field of type {kind};")), "{msg}");
        assert!(msg.contains("only string, bytes and repeated scalar"), "{msg}");
    }
    // HOST is fine anywhere.
    let text = "syntax = \"proto3\"; package t.ok; import \"protoplane/options.proto\";\n\
                message Msg { int64 id = 1 [(protoplane.placement) = HOST]; }";
    let ts = TableSet::from_proto_sources(&[ProtoSource { name: "ok.proto", text }], &["ok.proto"])
        .expect("HOST on an int64");
    assert!(device_fields(&ts).is_empty());
}

#[test]
fn an_unknown_placement_value_is_an_error() {
    let text = "syntax = \"proto3\"; package t.bad; import \"protoplane/options.proto\";\n\
                message Msg { bytes b = 1 [(protoplane.placement) = GPU]; }";
    // protox itself rejects a name the enum lacks.
    assert!(
        compile_proto_sources(&[ProtoSource { name: "bad.proto", text }], &["bad.proto"]).is_err()
    );
}

#[test]
fn another_option_with_the_same_number_is_not_ours() {
    let text = format!(
        "syntax = \"proto3\"; package acme; import \"google/protobuf/descriptor.proto\";\n\
         extend google.protobuf.FieldOptions {{ int32 tier = {PLACEMENT_EXTENSION}; }}\n\
         message Msg {{ bytes b = 1 [(acme.tier) = 1]; }}"
    );
    let sources = [ProtoSource { name: "acme.proto", text: &text }];
    let set = compile_proto_sources(&sources, &["acme.proto"]).expect("compiles");
    assert!(device_fields(&TableSet::from_file_descriptor_set(&set).expect("lowers")).is_empty());
}

#[test]
fn compile_protos_without_the_option_is_unchanged() {
    // The repository's schemas compile as before (the built-in file is only
    // added to the resolver chain).
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../protos");
    let set = compile_protos(&[format!("{root}/socialnetwork/social_network.proto")], &[root])
        .expect("compiles");
    assert!(!set.file.iter().any(|f| f.name() == OPTIONS_PROTO_NAME));
    let ts = TableSet::from_file_descriptor_set(&set).expect("lowers");
    assert!(device_fields(&ts).is_empty());
}

#[test]
fn engine_config_placements() {
    let mut ts = placed_sources();
    apply_placements(
        &mut ts,
        &[
            "t.placed.Frame.name=device",
            " .t.placed.Frame.image = host ",
            "t.placed.Frame.Inner.note=DEVICE",
            "t.placed.Frame.id=host", // host is accepted anywhere
        ],
    )
    .expect("applies");
    assert_eq!(
        device_fields(&ts),
        [
            "t.placed.Frame.Inner.note",
            "t.placed.Frame.Inner.payload",
            "t.placed.Frame.name",
            "t.placed.Frame.samples",
            "t.placed.Frame.tags",
            "t.placed.Frame.text",
        ]
    );

    let before = device_fields(&ts);
    let cases: [(&str, &str); 5] = [
        ("t.placed.Frame.id=device", "t.placed.Frame.id is of type int64"),
        ("t.placed.Frame.inner=device", "t.placed.Frame.inner is of type message"),
        ("t.placed.Nope.x=device", "no message `t.placed.Nope`"),
        ("t.placed.Frame.nope=device", "message `t.placed.Frame` has no field `nope`"),
        ("t.placed.Frame.name=gpu", "unknown placement `gpu`"),
    ];
    for (spec, want) in cases {
        // The bad entry comes last: the good one before it is not applied.
        let err = apply_placements(&mut ts, &["t.placed.Frame.caption=device", spec])
            .expect_err(spec)
            .to_string();
        assert!(err.contains(want) && err.contains(&format!("`{spec}`")), "{err}");
        assert_eq!(device_fields(&ts), before, "atomic");
    }
}

#[test]
fn field_updating_affects_the_next_snapshot_only() {
    let table = PlacementTable::new(placed_sources());
    let during = table.snapshot(); // a decode in progress
    assert!(table.is_on_device("t.placed.Frame", "image"));
    assert!(!table.is_on_device("t.placed.Frame", "name"));
    assert!(!table.is_on_device("t.placed.Nope", "name"));

    assert_eq!(table.move_to_device("t.placed.Frame", "name").ok(), Some(true));
    assert_eq!(table.move_to_device("t.placed.Frame", "name").ok(), Some(false));
    assert_eq!(table.move_to_host("t.placed.Frame", "image").ok(), Some(true));
    assert!(table.is_on_device("t.placed.Frame", "name"));
    assert!(!table.is_on_device("t.placed.Frame", "image"));

    // The snapshot taken before the updates is untouched ...
    assert_eq!(device_fields(&during), EXPECTED);
    // ... the next one sees them.
    let next = table.snapshot();
    assert!(!Arc::ptr_eq(&during, &next));
    let frame = next.message(next.message_by_name("t.placed.Frame").expect("Frame"));
    let name = next.field_by_name(frame, "name").expect("name");
    assert_eq!(name.placement(), Placement::Device);
    // The derived hot-path ops were rebuilt with the fields.
    let fresh = TableSet::from_bytes(&next.to_bytes()).expect("round trip");
    assert_eq!(device_fields(&fresh), device_fields(&next));

    // Errors name the field; nothing changes.
    let e = table.move_to_device("t.placed.Frame", "id").expect_err("int64").to_string();
    assert!(e.contains("t.placed.Frame.id is of type int64"), "{e}");
    assert!(table.move_to_host("t.placed.Frame", "nope").is_err());
    let mi = next.message_by_name("t.placed.Frame").expect("Frame");
    assert!(table.place_by_number(mi, 6, Placement::Device).is_err());
    assert!(table.place_by_number(mi, 99, Placement::Host).is_err());
    assert_eq!(table.place_by_number(mi, 1, Placement::Host).ok(), Some(true));
    table.apply(&["t.placed.Frame.caption=device"]).expect("applies");
    assert!(table.is_on_device("t.placed.Frame", "caption"));

    // No snapshot outstanding: updated in place (same allocation).
    drop((during, next));
    let ptr = Arc::as_ptr(&table.snapshot());
    table.move_to_host("t.placed.Frame", "caption").expect("moves");
    assert_eq!(Arc::as_ptr(&table.snapshot()), ptr);
}

#[test]
fn field_updating_from_other_threads() {
    let table = Arc::new(PlacementTable::new(placed_sources()));
    let workers: Vec<_> = (0..4)
        .map(|i| {
            let table = Arc::clone(&table);
            std::thread::spawn(move || {
                for round in 0..200 {
                    let snap = table.snapshot();
                    // A snapshot never changes under its holder.
                    let before = device_fields(&snap);
                    if (round + i) % 2 == 0 {
                        let _ = table.move_to_device("t.placed.Frame", "name");
                    } else {
                        let _ = table.move_to_host("t.placed.Frame", "name");
                    }
                    assert_eq!(device_fields(&snap), before);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
}

/// A resolver over fixed in-memory files.
struct Fixed(Vec<(&'static str, &'static str)>);

impl protox::file::FileResolver for Fixed {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        match self.0.iter().find(|(n, _)| *n == name) {
            Some((n, text)) => protox::file::File::from_source(n, text),
            None => protox::file::GoogleFileResolver::new().open_file(name),
        }
    }
}
