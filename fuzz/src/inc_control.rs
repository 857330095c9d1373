//! The `inc_control` target: the JSON parsers of the in-network
//! computation's control paths, on bytes another process sent — the
//! switch's control plane (`protoplane_inc::switch::Control` and
//! `ControlReply`), the controller's protocol
//! (`protoplane_inc::messages::Request` and `Reply`), the bounded line
//! reader they arrive through (`protoplane_inc_net::lines::LineReader`) —
//! and the NetFilter parser (`protoplane_inc::netfilter::NetFilter::parse`,
//! user config) against a fixed service ([`SERVICE_PROTO`]).
//!
//! # Input
//!
//! JSON lines (control messages; a seed may hold several), and the whole
//! input (lossy UTF-8) as a NetFilter document.
//!
//! # Properties
//!
//! Beyond "never panics":
//! * the line reader reading the whole input yields, line by line, what
//!   `serde_json` makes of each line (a value, or an error for a line that
//!   is not JSON or a last line without its newline), and so does a reader
//!   over each line alone;
//! * every message one of the four `from_json` accepts reads back equal
//!   from its `to_json`, both as a value and as the line `write_value`
//!   writes read by a `LineReader`;
//! * `select_service` and `NetFilter::parse` return, `Ok` or `Err`.

use std::fmt::Debug;
use std::io::Cursor;
use std::sync::OnceLock;

use protoplane_inc::messages::{Reply, Request};
use protoplane_inc::netfilter::{load_sources, select_service, NetFilter, ServiceSig};
use protoplane_inc::switch::{Control, ControlReply};
use protoplane_inc_net::lines::{write_value, LineReader};
use protoplane_schema::TableSet;
use serde_json::Value;

/// The service the NetFilter documents are checked against: one method
/// for every example NetFilter (`examples/inc/netfilter/*.json`), IEDT
/// fields of every kind beside ordinary ones.
pub const SERVICE_PROTO: &str = r#"
syntax = "proto3";

package fuzz.inc;

import "protoplane/inc.proto";

message CountRequest {
  string document = 1;
  protoplane.inc.StrIntMap counts = 2;
  protoplane.inc.IntArray histogram = 3;
  protoplane.inc.StrFloatMap weights = 4;
}

message ReadRequest {
  protoplane.inc.Keys words = 1;
  string client = 2;
}

message ReadReply {
  protoplane.inc.StrIntMap counts = 1;
  protoplane.inc.StrFloatMap weights = 2;
}

message ReportRequest {
  string host = 1;
  protoplane.inc.IntMap counters = 2;
  protoplane.inc.IntFloatMap loads = 3;
}

message QueryRequest {
  protoplane.inc.Keys keys = 1;
}

message QueryReply {
  protoplane.inc.IntMap counters = 1;
  protoplane.inc.IntFloatMap loads = 2;
}

message GradientRequest {
  uint32 step = 1;
  protoplane.inc.FloatArray gradient = 2;
  protoplane.inc.Int level = 3;
}

message GradientReply {
  uint32 step = 1;
  protoplane.inc.FloatArray gradient = 2;
}

message AcceptRequest {
  protoplane.inc.Int instance = 1;
  int64 value = 2;
  protoplane.inc.Keys candidates = 3;
}

message Empty {}

service Fuzz {
  rpc Count(CountRequest) returns (Empty);
  rpc Read(ReadRequest) returns (ReadReply);
  rpc Report(ReportRequest) returns (Empty);
  rpc Query(QueryRequest) returns (QueryReply);
  rpc Aggregate(GradientRequest) returns (GradientReply);
  rpc Accept(AcceptRequest) returns (Empty);
  rpc Reset(Empty) returns (Empty);
}
"#;

/// The tables and the service of [`SERVICE_PROTO`].
pub fn service() -> &'static (TableSet, ServiceSig) {
    static SERVICE: OnceLock<(TableSet, ServiceSig)> = OnceLock::new();
    SERVICE.get_or_init(|| {
        let (tables, services) = load_sources(&[("t.proto", SERVICE_PROTO)])
            .unwrap_or_else(|e| panic!("the fuzz service: {e}"));
        let service = select_service(&services, "{}")
            .unwrap_or_else(|e| panic!("the fuzz service: {e}"))
            .clone();
        (tables, service)
    })
}

/// Checks that `x` (accepted by `from_json`) reads back from its JSON
/// form, as a value and as a line.
fn round_trip<T: PartialEq + Debug>(
    what: &str,
    x: T,
    to_json: impl Fn(&T) -> Value,
    from_json: impl Fn(&Value) -> Result<T, protoplane_inc::Error>,
) {
    let v = to_json(&x);
    let back = from_json(&v);
    assert!(back.as_ref() == Ok(&x), "{what} {x:?} → {v} → {back:?}");
    let mut line = Vec::new();
    write_value(&mut line, &v).expect("writing to a Vec");
    let read = LineReader::new(Cursor::new(&line[..]))
        .next_value()
        .unwrap_or_else(|e| panic!("{what}: the line {v} does not read back: {e}"));
    let back = read.as_ref().map(&from_json);
    assert!(back.as_ref() == Some(&Ok(x)), "{what} line {v} → {back:?}");
}

/// Every parser on one value.
fn check_value(v: &Value) {
    if let Ok(x) = Control::from_json(v) {
        round_trip("Control", x, Control::to_json, Control::from_json);
    }
    if let Ok(x) = ControlReply::from_json(v) {
        round_trip("ControlReply", x, ControlReply::to_json, ControlReply::from_json);
    }
    if let Ok(x) = Request::from_json(v) {
        round_trip("Request", x, Request::to_json, Request::from_json);
    }
    if let Ok(x) = Reply::from_json(v) {
        round_trip("Reply", x, Reply::to_json, Reply::from_json);
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    // The whole input through one reader, line by line.
    let mut stream = LineReader::new(Cursor::new(data));
    let mut lines = data.split(|b| *b == b'\n').peekable();
    while let Some(line) = lines.next() {
        let last = lines.peek().is_none();
        if last && line.is_empty() {
            // After the last newline: the end of the stream.
            let end = stream.next_value();
            assert!(matches!(end, Ok(None)), "end of stream: {end:?}");
            break;
        }
        let direct: Option<Value> = serde_json::from_slice(line).ok();
        let read = stream.next_value();
        if last {
            // A line without its newline is refused whatever it holds.
            assert!(read.is_err(), "a last line without newline read as {read:?}");
        } else {
            match (&read, &direct) {
                (Ok(Some(a)), Some(b)) => assert_eq!(a, b, "the reader and serde_json differ"),
                (Err(_), None) => {}
                _ => panic!("the reader gave {read:?}, serde_json {direct:?}"),
            }
        }
        // The line alone, with its newline.
        let mut alone = line.to_vec();
        alone.push(b'\n');
        let mut reader = LineReader::new(Cursor::new(&alone[..]));
        let one = reader.next_value();
        match (&one, &direct) {
            (Ok(Some(a)), Some(b)) => assert_eq!(a, b, "a one-line reader and serde_json differ"),
            (Err(_), None) => {}
            _ => panic!("a one-line reader gave {one:?}, serde_json {direct:?}"),
        }
        if one.is_ok() {
            let end = reader.next_value();
            assert!(matches!(end, Ok(None)), "after the one line: {end:?}");
        }
        if let Some(v) = &direct {
            check_value(v);
        }
    }

    // The whole input as a NetFilter document.
    let text = String::from_utf8_lossy(data);
    let (tables, service) = service();
    let _ = select_service(std::slice::from_ref(service), &text);
    let _ = NetFilter::parse(&text, service, tables);
}
