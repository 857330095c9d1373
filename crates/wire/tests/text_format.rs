//! Protobuf's text format through the public API: the printed form of a
//! message with every kind of field, the syntax variants the parser takes,
//! and the inputs it refuses (with the line and column).

use protoplane_schema::{ProtoSource, TableSet};
use protoplane_wire::text::{from_text, to_text, to_text_with, TextOptions};
use protoplane_wire::{decode, encode, DecodeOptions, EncodeOptions, MessageView, Source};

const PROTO: &str = r#"
syntax = "proto2";
package tf;
import "google/protobuf/any.proto";
enum Level { LOW = 1; HIGH = 2; }
message Inner { optional int32 n = 1; repeated string tags = 2; }
message M {
  optional int32 i32 = 1;
  optional sint64 s64 = 2;
  optional uint64 u64 = 3;
  optional float f = 4;
  optional double d = 5;
  optional bool b = 6;
  optional string s = 7;
  optional bytes raw = 8;
  optional Level level = 9;
  optional Inner inner = 10;
  repeated int32 nums = 11;
  repeated Inner inners = 12;
  map<string, int32> counts = 13;
  optional group Data = 14 { optional int32 x = 15; }
  oneof pick { int32 a = 16; string z = 17; }
  optional google.protobuf.Any any = 18;
  optional fixed32 fx = 19;
  extensions 100 to 199;
}
message Req { required int32 id = 1; optional Req next = 2; }
extend M { optional int32 ext = 100; repeated Inner ext_inners = 101; }
"#;

fn tables() -> TableSet {
    let src = [ProtoSource { name: "tf.proto", text: PROTO }];
    TableSet::from_proto_sources(&src, &["tf.proto"]).expect("schema")
}

fn print(ts: &TableSet, ty: u32, block: &protoplane_wire::Block) -> String {
    let view = MessageView::new(ts, Source::owned(block.as_bytes()), ty).expect("view");
    let mut out = String::new();
    to_text(&view, &mut out).expect("prints");
    out
}

const CANONICAL: &str = r#"i32: -7
s64: -9000000000
u64: 18446744073709551615
f: 1.5
d: 1e300
b: true
s: "h\"i\n é"
raw: "\000\377a"
level: HIGH
inner {
  n: 3
  tags: "x"
  tags: "y"
}
nums: 1
nums: 2
inners {
  n: 1
}
inners {
}
counts {
  key: "k"
  value: 5
}
Data {
  x: 9
}
z: "chosen"
any {
  [type.googleapis.com/tf.Inner] {
    n: 42
  }
}
fx: 7
[tf.ext]: 11
[tf.ext_inners] {
  n: 12
}
"#;

#[test]
fn the_canonical_form_prints_and_reads_back() {
    let ts = tables();
    let ty = ts.message_by_name("tf.M").expect("tf.M");
    let block = from_text(&ts, ty, CANONICAL).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(print(&ts, ty, &block), CANONICAL);
    // Through the wire and back (view mode too): the same text.
    let wire = encode(&ts, ty, block.as_bytes(), &EncodeOptions::default()).expect("encodes");
    let owned = decode(&ts, ty, &wire, &DecodeOptions::default()).expect("decodes");
    assert_eq!(print(&ts, ty, &owned), CANONICAL);
    let view = decode(&ts, ty, &wire, &DecodeOptions::view()).expect("decodes");
    let v = MessageView::new(&ts, Source::viewing(view.as_bytes(), &wire), ty).expect("view");
    let mut out = String::new();
    to_text(&v, &mut out).expect("prints");
    assert_eq!(out, CANONICAL);
}

#[test]
fn every_spelling_protobuf_accepts_reads_the_same() {
    let ts = tables();
    let ty = ts.message_by_name("tf.M").expect("tf.M");
    let loose = r#"
        # comments, separators, <> and lists, hex and octal, concatenation
        i32: -0x7; s64: -9000000000, u64: 0xffffffffffffffff
        f: 1.5f d: 1E300 b: t
        s: 'h"i' "\n" ' \u00e9'
        raw: "\0\xffa"
        level: 2
        inner: < n: 03 tags: ["x", "y"] >
        nums: [1, 2]
        inners [{n: 1}, {}]
        counts { key: "k" value: 5 }
        data { x: 9 }
        z: "chosen"
        any { [type.googleapis.com/tf.Inner] < n: 42 > }
        fx: 7
        [tf.ext]: 11
        [tf.ext_inners]: [{ n: 12 }]
    "#;
    let block = from_text(&ts, ty, loose).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(print(&ts, ty, &block), CANONICAL);
    // Floats: integers, inf, nan; bools: True/False/1/0.
    let block = from_text(&ts, ty, "f: 3 d: -inf b: False").expect("parses");
    assert_eq!(print(&ts, ty, &block), "f: 3\nd: -inf\nb: false\n");
    let block = from_text(&ts, ty, "f: nan d: 1e-300").expect("parses");
    assert_eq!(print(&ts, ty, &block), "f: nan\nd: 1e-300\n");
}

#[test]
fn bad_input_is_refused_with_its_position() {
    let ts = tables();
    let ty = ts.message_by_name("tf.M").expect("tf.M");
    let err = |text: &str| from_text(&ts, ty, text).expect_err(text).to_string();
    assert_eq!(err("i32: 1\nnope: 2"), "2:1: tf.M has no field named \"nope\"");
    assert!(err("i32: 1 i32: 2").contains("specified multiple times"));
    assert!(err("inner {} inner {}").contains("specified multiple times"));
    assert!(err("a: 1 z: \"x\"").contains("second member of its oneof"));
    let e = err("i32: 2147483648");
    assert!(e.starts_with("1:6: expected a value of type int32"), "{e}");
    assert!(err("u64: -1").contains("uint64"));
    assert!(err("i32: 1.5").contains("int32"));
    assert!(err("level: 3").contains("enum"), "a closed enum takes only its values");
    assert!(err("level: MEDIUM").contains("enum"));
    assert!(err("s: \"\\ud800\"").contains("not a character"));
    assert!(err("s: \"open").contains("never ends"));
    assert!(err("i32 1").contains("expected ':'"));
    assert!(err("inner { n: 1").contains("expected '}'"));
    assert!(err("[tf.nope]: 1").contains("no extension [tf.nope]"));
    assert!(err("any { [type.googleapis.com/tf.Nope] {} }").contains("no message type tf.Nope"));
    assert!(err("[type.googleapis.com/tf.Inner] {}").contains("only an Any"));
    assert!(err("Inner { n: 1 }").contains("no field named \"Inner\""));
    // proto2 required fields: missing one anywhere is an error.
    let req = ts.message_by_name("tf.Req").expect("tf.Req");
    assert!(from_text(&ts, req, "id: 1 next { id: 2 }").is_ok());
    let e = from_text(&ts, req, "id: 1 next { }").expect_err("missing id").to_string();
    assert!(e.contains("tf.Req: required field id is missing"), "{e}");
    // Nesting is bounded.
    let deep = "inner { ".repeat(0) + &"any { [type.googleapis.com/tf.M] { ".repeat(120);
    assert!(from_text(&ts, ty, &deep).is_err());
}

#[test]
fn unknown_fields_print_by_number_when_asked() {
    let ts = tables();
    let ty = ts.message_by_name("tf.M").expect("tf.M");
    // 1: 5, then unknown 50: 7 (varint), 51: fixed32, 52: "hello", 53: { 1: 2 },
    // 54: group { 1: 3 }. A length-delimited field that parses as fields
    // prints as a message ("hello" does not: 'l' would end a group).
    #[rustfmt::skip]
    let wire = [
        0x08, 5,
        0x90, 0x03, 7,
        0x9d, 0x03, 1, 0, 0, 0,
        0xa2, 0x03, 5, b'h', b'e', b'l', b'l', b'o',
        0xaa, 0x03, 2, 0x08, 2,
        0xb3, 0x03, 0x08, 3, 0xb4, 0x03,
    ];
    let block = decode(&ts, ty, &wire, &DecodeOptions::default()).expect("decodes");
    assert_eq!(print(&ts, ty, &block), "i32: 5\n");
    let view = MessageView::new(&ts, Source::owned(block.as_bytes()), ty).expect("view");
    let mut out = String::new();
    to_text_with(&view, &mut out, &TextOptions { print_unknown_fields: true }).expect("prints");
    assert_eq!(
        out,
        "i32: 5\n50: 7\n51: 0x00000001\n52: \"hello\"\n53 {\n  1: 2\n}\n54 {\n  1: 3\n}\n"
    );
}
