//! The well-known types' JSON forms through the public API: printed forms,
//! their parse back, and the values that have no JSON form.

use protoplane_schema::{ProtoSource, TableSet};
use protoplane_wire::json::{
    from_json, from_json_with, to_json, JsonOptions, NoJsonForm, PrintError,
};
use protoplane_wire::{Builder, MessageView, Source, Value};

const PROTO: &str = r#"
syntax = "proto3";
package wk;
import "google/protobuf/any.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/field_mask.proto";
import "google/protobuf/struct.proto";
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
enum Color { RED = 0; BLUE = 1; }
message M {
  google.protobuf.Timestamp at = 1;
  google.protobuf.Duration took = 2;
  google.protobuf.FieldMask mask = 3;
  google.protobuf.Struct doc = 4;
  google.protobuf.Value value = 5;
  google.protobuf.Any any = 6;
  google.protobuf.Int64Value count = 7;
  Color color = 8;
  repeated Color colors = 9;
  oneof pick { int32 a = 10; string b = 11; }
}
"#;

fn tables() -> TableSet {
    let src = [ProtoSource { name: "wk.proto", text: PROTO }];
    TableSet::from_proto_sources(&src, &["wk.proto"]).expect("schema")
}

fn print(ts: &TableSet, block: &protoplane_wire::Block) -> Result<String, PrintError> {
    let ty = ts.message_by_name("wk.M").expect("wk.M");
    let mut out = String::new();
    let view = MessageView::new(ts, Source::owned(block.as_bytes()), ty)?;
    to_json(&view, &mut out).map(|()| out)
}

/// Parses `json` as `wk.M` and prints it again.
fn again(ts: &TableSet, json: &str) -> String {
    let ty = ts.message_by_name("wk.M").expect("wk.M");
    let block = from_json(ts, ty, json).unwrap_or_else(|e| panic!("{json}: {e}"));
    print(ts, &block).unwrap_or_else(|e| panic!("{json}: {e}"))
}

#[test]
fn canonical_forms_come_back_as_they_went_in() {
    let ts = tables();
    for json in [
        r#"{"at":"1970-01-01T00:00:00Z"}"#,
        r#"{"at":"2026-11-29T05:30:00.120Z"}"#,
        r#"{"at":"0001-01-01T00:00:00Z","took":"-1.000000001s"}"#,
        r#"{"took":"315576000000s"}"#,
        r#"{"mask":"fooBar,baz.quxQuux"}"#,
        r#"{"doc":{"a":[1,null,"x",{"b":true}],"c":{}}}"#,
        r#"{"value":null}"#,
        r#"{"value":[1.5,"y",[]]}"#,
        r#"{"any":{"@type":"type.googleapis.com/google.protobuf.Duration","value":"2s"}}"#,
        r#"{"any":{"@type":"type.googleapis.com/wk.M","count":"5","color":"BLUE"}}"#,
        r#"{"count":"-5"}"#,
    ] {
        assert_eq!(again(&ts, json), json);
    }
    // Offsets are applied, fractions printed in 0, 3, 6 or 9 digits.
    assert_eq!(
        again(&ts, r#"{"at":"1970-01-01T01:00:00.5+01:00"}"#),
        r#"{"at":"1970-01-01T00:00:00.500Z"}"#
    );
    assert_eq!(again(&ts, r#"{"took":"0.0000010s"}"#), r#"{"took":"0.000001s"}"#);
}

#[test]
fn input_protobuf_refuses_is_refused() {
    let ts = tables();
    let ty = ts.message_by_name("wk.M").expect("wk.M");
    for json in [
        r#"{"at":"1970-01-01T00:00:00"}"#,
        r#"{"at":"10000-01-01T00:00:00Z"}"#,
        r#"{"took":"315576000001s"}"#,
        r#"{"took":"1"}"#,
        r#"{"mask":"foo_bar"}"#,
        r#"{"a":1,"b":"x"}"#,
        r#"{"count":" 5"}"#,
        r#"{"any":{"value":"2s"}}"#,
        r#"{"color":"GREEN"}"#,
        r#"{"nope":1}"#,
    ] {
        assert!(from_json(&ts, ty, json).is_err(), "{json} was accepted");
    }
}

#[test]
fn unknown_members_and_enum_names_are_skipped_when_asked() {
    let ts = tables();
    let ty = ts.message_by_name("wk.M").expect("wk.M");
    let lenient = JsonOptions { ignore_unknown_fields: true };
    let json = r#"{"nope":{"x":[1]},"color":"GREEN","colors":["BLUE","GREEN","RED"],"count":"1"}"#;
    let block = from_json_with(&ts, ty, json, &lenient).expect("lenient");
    assert_eq!(print(&ts, &block).expect("print"), r#"{"count":"1","colors":["BLUE","RED"]}"#);
}

#[test]
fn values_with_no_json_form_are_refused() {
    let ts = tables();
    let ty = ts.message_by_name("wk.M").expect("wk.M");
    let with = |f: &dyn Fn(&mut Builder<'_>)| {
        let mut b = Builder::new(&ts, ty).expect("builder");
        f(&mut b);
        print(&ts, &b.finish())
    };
    let too_late = with(&|b| {
        let at = b.message(b.root(), 1).expect("at");
        b.set(at, 1, Value::I64(253_402_300_800)).expect("seconds");
    });
    assert_eq!(too_late, Err(PrintError::NoJsonForm(NoJsonForm::Timestamp)));
    let mixed = with(&|b| {
        let d = b.message(b.root(), 2).expect("took");
        b.set(d, 1, Value::I64(1)).expect("seconds");
        b.set(d, 2, Value::I32(-1)).expect("nanos");
    });
    assert_eq!(mixed, Err(PrintError::NoJsonForm(NoJsonForm::Duration)));
    let nan = with(&|b| {
        let v = b.message(b.root(), 5).expect("value");
        b.set(v, 2, Value::F64(f64::NAN)).expect("number");
    });
    assert_eq!(nan, Err(PrintError::NoJsonForm(NoJsonForm::NonFiniteValue)));
    // A path that would come back different, and one with a control
    // character (printed escaped: the output stays JSON).
    let upper = with(&|b| {
        let m = b.message(b.root(), 3).expect("mask");
        b.push(m, 1, Value::String(b"fooBar")).expect("path");
    });
    assert_eq!(upper, Err(PrintError::NoJsonForm(NoJsonForm::FieldMaskPath)));
    let control = with(&|b| {
        let m = b.message(b.root(), 3).expect("mask");
        b.push(m, 1, Value::String(b"a\x01b")).expect("path");
    })
    .expect("printed");
    let back: serde_json::Value = serde_json::from_str(&control).expect("valid JSON");
    assert_eq!(back["mask"], "a\u{1}b");
}
