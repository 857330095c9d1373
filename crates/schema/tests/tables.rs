//! Schema tables built from `.proto` text: every feature the issue lists
//! lands in the table with the right flags, layout and defaults, and a table
//! set survives its byte form (and rejects corrupted bytes without panicking).

use protoplane_schema::{FieldFlags, Kind, Label, MessageFlags, Placement, ProtoSource, TableSet};

const COMMON: &str = r#"
syntax = "proto3";
package t.common;
message Shared { string name = 1; }
enum Color { COLOR_UNSPECIFIED = 0; RED = 1; NEG = -5; }
"#;

const P2: &str = r#"
syntax = "proto2";
package t.p2;
import "common.proto";
message All {
  optional int32 i32 = 1 [default = -7];
  optional string s = 3 [default = "hi"];
  optional bytes b = 4 [default = "a\001\\"];
  optional double d = 5 [default = inf];
  optional float f = 6 [default = nan];
  optional bool flag = 7 [default = true];
  optional Kind kind = 8;
  optional Kind kind2 = 9 [default = K_TWO];
  required uint64 req = 2;
  repeated int32 unpacked = 10;
  repeated int32 packed = 11 [packed = true];
  optional group Grp = 12 { optional int32 x = 13; }
  oneof choice { int32 c_int = 20; string c_str = 21; All c_msg = 22; }
  map<sint64, t.common.Shared> m = 23;
  optional All self = 24;
  optional int64 big = 536870911;
  optional fixed32 mid = 100000;
  enum Kind { K_NEG = -3; K_ONE = 1; K_TWO = 2; }
  message Nested { optional int32 y = 1; }
  optional Nested nested = 30;
  optional t.common.Color color = 31;
}
"#;

const P3: &str = r#"
syntax = "proto3";
package t.p3;
import "common.proto";
message Three {
  int32 plain = 5;
  optional int32 opt = 1;
  repeated sint32 packed = 3;
  repeated sint32 unpacked = 2 [packed = false];
  string text = 4;
  t.common.Color color = 6;
  map<string, int64> counts = 7;
  oneof o { bytes ob = 8; Three om = 9; }
}
"#;

fn tables() -> TableSet {
    let sources = [
        ProtoSource { name: "common.proto", text: COMMON },
        ProtoSource { name: "p2.proto", text: P2 },
        ProtoSource { name: "p3.proto", text: P3 },
    ];
    TableSet::from_proto_sources(&sources, &["p2.proto", "p3.proto"])
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn proto2_features_land_in_the_table() {
    let ts = tables();
    let all = ts.message(ts.message_by_name("t.p2.All").unwrap_or(u32::MAX));
    let f = |n: u32| *ts.field_by_number(all, n).unwrap_or_else(|| panic!("field {n}"));
    // Sorted by number regardless of declaration order; large numbers found.
    let numbers: Vec<u32> = ts.fields(all).iter().map(|f| f.number).collect();
    assert!(numbers.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(f(536_870_911).kind, Kind::Int64);
    assert_eq!(f(100_000).kind, Kind::Fixed32);
    assert_eq!(f(2).label, Label::Required);
    assert!(all.flags.has(MessageFlags::HAS_REQUIRED));
    assert_eq!(ts.required_mask(all).iter().map(|w| w.count_ones()).sum::<u32>(), 1);
    // Defaults.
    assert_eq!(f(1).default as u32 as i32, -7);
    assert_eq!(ts.default_bytes(&f(3)), b"hi");
    assert_eq!(ts.default_bytes(&f(4)), b"a\x01\\");
    assert_eq!(f64::from_bits(f(5).default), f64::INFINITY);
    assert!(f32::from_bits(f(6).default as u32).is_nan());
    assert_eq!(f(7).default, 1);
    assert_eq!(f(8).default as u32 as i32, -3, "absent closed enum reads as its first value");
    assert_eq!(f(9).default, 2);
    // Closed enum, packed only where asked, groups, oneofs, maps.
    assert!(f(8).flags.has(FieldFlags::CLOSED_ENUM));
    assert!(!f(10).flags.has(FieldFlags::PACKED));
    assert!(f(11).flags.has(FieldFlags::PACKED));
    assert_eq!(f(12).kind, Kind::Group);
    assert_eq!(ts.message_name(f(12).sub), "t.p2.All.Grp");
    for n in [20, 21, 22] {
        assert!(f(n).flags.has(FieldFlags::ONEOF));
        assert_eq!(f(n).offset, f(20).offset, "oneof members share one union slot");
    }
    assert_eq!(ts.oneofs(all).len(), 1);
    assert!(f(23).flags.has(FieldFlags::MAP));
    let entry = ts.message(f(23).sub);
    assert!(entry.flags.has(MessageFlags::MAP_ENTRY));
    assert!(ts.fields(entry).iter().all(|k| k.flags.has(FieldFlags::ALWAYS)));
    assert_eq!(ts.message_name(f(24).sub), "t.p2.All", "recursion by index");
    assert_eq!(ts.message_name(f(30).sub), "t.p2.All.Nested");
    assert!(!f(31).flags.has(FieldFlags::CLOSED_ENUM), "proto3 enum stays open in proto2");
    assert_eq!(ts.nesting_depth(ts.message_by_name("t.p2.All").unwrap_or(0)), None);
    // Slots: inside the object, 8-byte slots aligned, no two fields overlap.
    let mut spans: Vec<(u32, u32)> = ts
        .fields(all)
        .iter()
        .filter(|x| !x.flags.has(FieldFlags::ONEOF))
        .map(|x| {
            let size = if x.is_repeated() || !x.kind.is_scalar() { 8 } else { x.kind.slot_size() };
            (x.offset, x.offset + size)
        })
        .collect();
    spans.sort();
    assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "{spans:?}");
    assert!(spans.iter().all(|s| s.1 <= all.size && s.0 >= 4 * all.hasbit_words));
    assert_eq!(all.size % 8, 0);
}

#[test]
fn proto3_features_land_in_the_table() {
    let ts = tables();
    let m = ts.message(ts.message_by_name(".t.p3.Three").unwrap_or(u32::MAX));
    let f = |n: u32| *ts.field_by_number(m, n).unwrap_or_else(|| panic!("field {n}"));
    assert!(f(5).flags.has(FieldFlags::IMPLICIT));
    assert!(!f(1).flags.has(FieldFlags::IMPLICIT), "proto3 optional has presence");
    assert!(!f(1).flags.has(FieldFlags::ONEOF), "synthetic oneof is not a oneof");
    assert_eq!(ts.oneofs(m).len(), 1);
    assert!(f(3).flags.has(FieldFlags::PACKED), "proto3 repeated scalars pack by default");
    assert!(!f(2).flags.has(FieldFlags::PACKED));
    assert!(f(4).flags.has(FieldFlags::UTF8));
    assert!(f(4).flags.has(FieldFlags::IMPLICIT));
    assert!(!f(6).flags.has(FieldFlags::CLOSED_ENUM));
    assert_eq!(ts.str(f(7).json_name), "counts");
    let color = ts.enum_type(ts.enum_by_name("t.common.Color").unwrap_or(u32::MAX));
    assert_eq!(ts.enum_value_name(color, -5), Some("NEG"));
    assert_eq!(ts.enum_value_by_name(color, "RED"), Some(1));
    assert!(m.flags.has(MessageFlags::PROTO3));
}

#[test]
fn table_set_survives_its_byte_form() {
    let ts = tables();
    let bytes = ts.to_bytes();
    let back = TableSet::from_bytes(&bytes).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back.to_bytes(), bytes);
    assert_eq!(back.message_by_name("t.p2.All"), ts.message_by_name("t.p2.All"));
    // Corruption never panics: every truncation and many single-byte flips.
    for cut in 0..bytes.len() {
        assert!(TableSet::from_bytes(&bytes[..cut]).is_err(), "truncated at {cut}");
    }
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..20_000 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let mut bad = bytes.clone();
        let i = (rng % bad.len() as u64) as usize;
        bad[i] ^= 1 << (rng >> 60 & 7);
        let _ = TableSet::from_bytes(&bad); // Ok or Err, never a panic
    }
}

#[test]
fn placement_is_the_only_runtime_mutation() {
    let mut ts = tables();
    let three = ts.message_by_name("t.p3.Three").unwrap_or(u32::MAX);
    let text = |ts: &TableSet| ts.field_by_number(ts.message(three), 4).map(|f| f.placement());
    assert_eq!(text(&ts), Some(Placement::Host));
    assert!(ts.set_placement(three, 4, Placement::Device));
    assert_eq!(text(&ts), Some(Placement::Device));
    assert!(!ts.set_placement(three, 9, Placement::Device), "messages stay on the host");
    assert!(!ts.set_placement(three, 99, Placement::Device));
    assert!(ts.set_placement(three, 4, Placement::Host));
    assert_eq!(text(&ts), Some(Placement::Host));
}

#[test]
fn bad_schemas_are_errors() {
    let bad = [ProtoSource {
        name: "x.proto",
        text: "syntax = \"proto3\"; message M { Missing m = 1; }",
    }];
    assert!(TableSet::from_proto_sources(&bad, &["x.proto"]).is_err());
    assert!(TableSet::from_descriptor_set(b"\x0a\x05junk").is_err());
    assert!(TableSet::from_bytes(b"nope").is_err());
}

#[test]
fn a_misspelled_type_finds_its_nearest_names() {
    let ts = tables();
    assert_eq!(ts.nearest_message_names("t.p2.Al", 3), ["t.p2.All"]);
    assert_eq!(ts.nearest_message_names(".t.p2.all", 3), ["t.p2.All"]);
    // Right name, wrong package: found by its last component.
    assert!(ts.nearest_message_names("All", 3).contains(&"t.p2.All"));
    assert!(ts.nearest_message_names("zzzzzzzzzzzzzzzzzz", 3).is_empty());
}
