//! What the fuzz targets share: the schemas they decode with (built once)
//! and the list of (schema, message type) pairs the first input byte picks
//! from. `examples/seed.rs` uses the same list to write seed inputs, so a
//! selector byte always means the same type for the seeds and the targets.
//!
//! The schemas are embedded: `social_network.proto` (the project's own
//! schema) and the hostile-input test schema of `crates/wire/tests`.
//!
//! [`ring`] is the `ring` target's interpreter, shared the same way: the
//! seeds are op sequences it encodes and runs. [`hpack`] is the program
//! format of the `hpack` target's encoded mode, for its seeds. [`inc`] is
//! the `inc` target's interpreter (a switch and the agents of one
//! application against hostile datagrams), used by the seeds the same way.
//! [`inc_control`] is the `inc_control` target's logic (the control-plane
//! and controller JSON parsers, the line reader, the NetFilter parser) and
//! the service its NetFilter documents are checked against.
//!
//! [`generated`] holds the code `protoplane-codegen` generates for the same
//! two schemas (`build.rs`) and the list of generated decoders the
//! `decode_gen` target's first input byte picks from.

use std::sync::OnceLock;

pub mod generated;
pub mod hpack;
pub mod inc;
pub mod inc_control;
pub mod ring;

use protoplane_schema::{ProtoSource, TableSet};

/// One message type a fuzz input can select.
#[derive(Debug)]
pub struct Target {
    /// The tables the type belongs to.
    pub tables: &'static TableSet,
    /// Its index in `tables`.
    pub type_index: u32,
    /// Its fully qualified name (for messages).
    pub name: &'static str,
}

/// Types of the test schema that are fuzzed (every social-network type is).
const HOSTILE_TYPES: &[&str] =
    &["hostile.R", "hostile.Chain", "hostile.P2", "hostile.S2", "hostile3.S3"];

fn load(sources: &[ProtoSource<'_>]) -> TableSet {
    let roots: Vec<&str> = sources.iter().map(|s| s.name).collect();
    TableSet::from_proto_sources(sources, &roots)
        .unwrap_or_else(|e| panic!("embedded schema {roots:?}: {e}"))
}

/// The social-network schema.
pub fn social() -> &'static TableSet {
    static TABLES: OnceLock<TableSet> = OnceLock::new();
    TABLES.get_or_init(|| {
        load(&[ProtoSource {
            name: "social_network.proto",
            text: include_str!("../../protos/socialnetwork/social_network.proto"),
        }])
    })
}

/// The hostile-input test schema (proto2 and proto3 halves in one set).
pub fn hostile() -> &'static TableSet {
    static TABLES: OnceLock<TableSet> = OnceLock::new();
    TABLES.get_or_init(|| {
        load(&[
            ProtoSource {
                name: "hostile2.proto",
                text: include_str!("../../crates/wire/tests/protos/hostile2.proto"),
            },
            ProtoSource {
                name: "hostile3.proto",
                text: include_str!("../../crates/wire/tests/protos/hostile3.proto"),
            },
        ])
    })
}

/// A message of every well-known type with a JSON form of its own (the
/// JSON target's special cases), appended after the others so that the
/// selectors of the older types stay as they were.
const WKT_PROTO: &str = r#"
syntax = "proto3";
package fuzzwkt;
import "google/protobuf/any.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/field_mask.proto";
import "google/protobuf/struct.proto";
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
message W {
  google.protobuf.Timestamp at = 1;
  google.protobuf.Duration took = 2;
  google.protobuf.FieldMask mask = 3;
  google.protobuf.Struct doc = 4;
  google.protobuf.Value value = 5;
  google.protobuf.ListValue list = 6;
  google.protobuf.Any any = 7;
  google.protobuf.Int64Value count = 8;
  google.protobuf.BytesValue blob = 9;
  google.protobuf.FloatValue ratio = 10;
  google.protobuf.NullValue nothing = 11;
  repeated google.protobuf.Value values = 12;
  map<string, google.protobuf.Value> by_name = 13;
  repeated google.protobuf.Any anys = 14;
  W child = 15;
}
"#;

/// The well-known types' schema ([`WKT_PROTO`]).
pub fn wkt() -> &'static TableSet {
    static TABLES: OnceLock<TableSet> = OnceLock::new();
    TABLES.get_or_init(|| load(&[ProtoSource { name: "fuzzwkt.proto", text: WKT_PROTO }]))
}

/// Every selectable type: all message types of the social-network schema
/// (map entries included) in table order, then [`HOSTILE_TYPES`], then
/// `fuzzwkt.W`.
pub fn targets() -> &'static [Target] {
    static TARGETS: OnceLock<Vec<Target>> = OnceLock::new();
    TARGETS.get_or_init(|| {
        let social = social();
        let mut all: Vec<Target> = (0..social.messages().len() as u32)
            .map(|i| Target { tables: social, type_index: i, name: social.message_name(i) })
            .collect();
        let hostile = hostile();
        for name in HOSTILE_TYPES {
            let i = hostile.message_by_name(name).unwrap_or_else(|| panic!("no type {name}"));
            all.push(Target { tables: hostile, type_index: i, name: hostile.message_name(i) });
        }
        let wkt = wkt();
        let i = wkt.message_by_name("fuzzwkt.W").unwrap_or_else(|| panic!("no type fuzzwkt.W"));
        all.push(Target { tables: wkt, type_index: i, name: wkt.message_name(i) });
        assert!(all.len() <= 256, "a selector is one byte");
        all
    })
}

/// Splits a fuzz input into the type its first byte selects (modulo the
/// number of types) and the rest.
pub fn pick(data: &[u8]) -> Option<(&'static Target, &[u8])> {
    let (&selector, rest) = data.split_first()?;
    let all = targets();
    Some((&all[selector as usize % all.len()], rest))
}

/// The selector byte of a type (for seeding).
pub fn selector(name: &str) -> Option<u8> {
    targets().iter().position(|t| t.name == name).and_then(|i| u8::try_from(i).ok())
}
