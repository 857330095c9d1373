//! proto2 extensions in JSON (`"[pkg.name]"`): they travel in the
//! extendee's unknown-field bytes, which the decoder keeps and the encoder
//! writes back; the tables name them, so JSON can print and parse them.

use protoplane_schema::{ProtoSource, TableSet};
use protoplane_wire::json::{from_json, from_json_with, to_json, JsonOptions};
use protoplane_wire::{decode, encode, DecodeOptions, EncodeOptions, MessageView, Source};

const PROTO: &str = r#"
syntax = "proto2";
package ex;
message Base {
  optional int32 id = 1;
  extensions 100 to 199;
}
message Note { optional string text = 1; }
enum Level { LOW = 1; HIGH = 2; }
extend Base {
  optional sint32 delta = 100;
  repeated int32 packed_list = 101 [packed = true];
  repeated fixed64 list = 102;
  optional string label = 103;
  optional bytes blob = 104;
  optional Note note = 105;
  optional group Tag = 106 { optional int32 weight = 107; }
  optional Level level = 108;
  repeated Note notes = 109;
}
message Scope {
  extend Base { optional double ratio = 110; }
}
"#;

fn tables() -> TableSet {
    let src = [ProtoSource { name: "ex.proto", text: PROTO }];
    TableSet::from_proto_sources(&src, &["ex.proto"]).expect("schema")
}

fn print(ts: &TableSet, src: Source<'_>) -> String {
    let view =
        MessageView::new(ts, src, ts.message_by_name("ex.Base").expect("the test's own input"))
            .expect("the test's own input");
    let mut out = String::new();
    to_json(&view, &mut out).expect("the test's own input");
    out
}

const ALL: &str = r#"{"id":1,"[ex.delta]":-3,"[ex.packed_list]":[1,2],"[ex.list]":["7"],"[ex.label]":"x","[ex.blob]":"AQI=","[ex.note]":{"text":"n"},"[ex.tag]":{"weight":5},"[ex.level]":"HIGH","[ex.notes]":[{"text":"a"},{}],"[ex.Scope.ratio]":0.5}"#;

#[test]
fn the_tables_list_each_extension_of_its_extendee() {
    let ts = tables();
    let base = ts.message_by_name("ex.Base").expect("the test's own input");
    let names: Vec<&str> = ts.extensions(base).iter().map(|x| ts.str(x.field.name)).collect();
    assert_eq!(names.len(), 10);
    assert_eq!(names[0], "ex.delta");
    assert_eq!(names[9], "ex.Scope.ratio", "declared in a message, named in its scope");
    assert!(ts.extension_by_name(base, ".ex.label").is_some());
    assert!(ts.extensions(ts.message_by_name("ex.Note").expect("the test's own input")).is_empty());
    let back = TableSet::from_bytes(&ts.to_bytes()).expect("the test's own input");
    assert_eq!(back.extensions(base), ts.extensions(base));
}

#[test]
fn json_in_binary_through_json_out() {
    let ts = tables();
    let ty = ts.message_by_name("ex.Base").expect("the test's own input");
    let block = from_json(&ts, ty, ALL).expect("the test's own input");
    assert_eq!(print(&ts, Source::owned(block.as_bytes())), ALL);
    // Through the wire: the decoder keeps them as unknown fields, in order.
    let wire =
        encode(&ts, ty, block.as_bytes(), &EncodeOptions::default()).expect("the test's own input");
    let owned = decode(&ts, ty, &wire, &DecodeOptions::default()).expect("the test's own input");
    assert_eq!(print(&ts, Source::owned(owned.as_bytes())), ALL);
    let view = decode(&ts, ty, &wire, &DecodeOptions::view()).expect("the test's own input");
    assert_eq!(print(&ts, Source::viewing(view.as_bytes(), &wire)), ALL);
}

#[test]
fn wire_forms_json_prints() {
    let ts = tables();
    let ty = ts.message_by_name("ex.Base").expect("the test's own input");
    // delta (sint32) twice: the last wins; list unpacked 1 then packed [2, 3];
    // note twice: merged; an unknown field 150 is not printed.
    #[rustfmt::skip]
    let wire = [
        0xa0, 0x06, 0x01,                   // 100: zigzag 1 = -1
        0xa0, 0x06, 0x04,                   // 100: zigzag 4 = 2
        0xa8, 0x06, 0x01,                   // 101: 1
        0xaa, 0x06, 0x02, 0x02, 0x03,       // 101: packed [2, 3]
        0xca, 0x06, 0x03, 0x0a, 0x01, b'a', // 105: {text: "a"}
        0xb0, 0x09, 0x05,                   // 150: unknown
        0xca, 0x06, 0x03, 0x0a, 0x01, b'b', // 105: {text: "b"}: merged, the last text
    ];
    let block = decode(&ts, ty, &wire, &DecodeOptions::default()).expect("the test's own input");
    assert_eq!(
        print(&ts, Source::owned(block.as_bytes())),
        r#"{"[ex.delta]":2,"[ex.packed_list]":[1,2,3],"[ex.note]":{"text":"b"}}"#
    );
}

#[test]
fn unknown_extensions_are_refused_or_ignored() {
    let ts = tables();
    let ty = ts.message_by_name("ex.Base").expect("the test's own input");
    let e = from_json(&ts, ty, r#"{"[ex.nope]":1}"#).expect_err("refused");
    assert!(e.0.contains("no extension named \"[ex.nope]\""), "{e}");
    // An extension of another message is not one of this one.
    let note = ts.message_by_name("ex.Note").expect("the test's own input");
    assert!(from_json(&ts, note, r#"{"[ex.delta]":1}"#).is_err());
    let lenient = JsonOptions { ignore_unknown_fields: true };
    let block = from_json_with(&ts, ty, r#"{"[ex.nope]":1,"id":2}"#, &lenient)
        .expect("the test's own input");
    assert_eq!(print(&ts, Source::owned(block.as_bytes())), r#"{"id":2}"#);
    let e = from_json(&ts, ty, r#"{"[ex.delta]":"x"}"#).expect_err("refused");
    assert!(e.0.starts_with("extension \"[ex.delta]\""), "{e}");
    assert!(from_json(&ts, ty, r#"{"[ex.list]":7}"#).is_err(), "a repeated one wants an array");
}
