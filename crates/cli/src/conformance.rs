//! `protoplane conformance-testee`: the program Google's conformance runner
//! (`conformance_test_runner`) drives, speaking its pipe protocol natively:
//! one process for the whole suite.
//!
//! The runner writes each test to stdin as a little-endian `u32` length and
//! a `conformance.ConformanceRequest`; the testee answers on stdout the same
//! way with a `conformance.ConformanceResponse`. The request names the
//! message type (from the suite's `test_messages_*.proto`, which this
//! command loads from `--include`, the runner's own copies), carries the
//! input as protobuf, JSON or text, and asks for protobuf, JSON or text
//! back. Inputs are parsed and outputs produced by the same library calls
//! the `decode`, `encode` and `roundtrip` commands make.
//!
//! Google's internal JSPB format is answered `skipped`: the runner counts
//! those apart from failures, and the test script prints how many there
//! were.

use std::io::{Read, Write};
use std::path::PathBuf;

use protoplane_schema::{ProtoSource, TableSet};
use protoplane_wire::{
    json, text, DecodeOptions, Decoder, EncodeOptions, Encoder, MessageView, Source,
};

/// The runner's request and response messages, declared here with the
/// names and field numbers the protocol fixes.
const PROTOCOL: &str = r#"
syntax = "proto3";
package conformance;

enum WireFormat {
  UNSPECIFIED = 0;
  PROTOBUF = 1;
  JSON = 2;
  JSPB = 3;
  TEXT_FORMAT = 4;
}

enum TestCategory {
  UNSPECIFIED_TEST = 0;
  BINARY_TEST = 1;
  JSON_TEST = 2;
  JSON_IGNORE_UNKNOWN_PARSING_TEST = 3;
  JSPB_TEST = 4;
  TEXT_FORMAT_TEST = 5;
}

message FailureSet {
  repeated string failure = 1;
}

message JspbEncodingConfig {
  bool use_jspb_array_any_format = 1;
}

message ConformanceRequest {
  oneof payload {
    bytes protobuf_payload = 1;
    string json_payload = 2;
    string jspb_payload = 7;
    string text_payload = 8;
  }
  WireFormat requested_output_format = 3;
  string message_type = 4;
  TestCategory test_category = 5;
  JspbEncodingConfig jspb_encoding_options = 6;
  bool print_unknown_fields = 9;
}
"#;

/// The suite's message files, under `--include`: proto2, proto3, and the
/// same messages declared in edition 2023.
const SUITE: [&str; 5] = [
    "google/protobuf/test_messages_proto2.proto",
    "google/protobuf/test_messages_proto3.proto",
    "editions/golden/test_messages_proto2_editions.proto",
    "editions/golden/test_messages_proto3_editions.proto",
    "conformance/test_protos/test_messages_edition2023.proto",
];

/// Largest request the testee reads (the suite's largest is a few MiB).
const MAX_REQUEST: usize = 64 << 20;

#[derive(clap::Args, Debug)]
pub(crate) struct TesteeArgs {
    /// The directory holding the suite's messages:
    /// `google/protobuf/test_messages_proto{2,3}.proto`,
    /// `editions/golden/test_messages_proto{2,3}_editions.proto` and
    /// `conformance/test_protos/test_messages_edition2023.proto` (the
    /// runner's distribution has them) [default: $PROTOPLANE_CONFORMANCE_INCLUDE].
    #[arg(short = 'I', long = "include", value_name = "DIR")]
    include: Option<PathBuf>,
}

// The response's fields (`conformance.ConformanceResponse`), written by
// hand: each answer is one length-delimited field.
const PARSE_ERROR: u32 = 1;
const RUNTIME_ERROR: u32 = 2;
const PROTOBUF_PAYLOAD: u32 = 3;
const JSON_PAYLOAD: u32 = 4;
const SKIPPED: u32 = 5;
const SERIALIZE_ERROR: u32 = 6;
const TEXT_PAYLOAD: u32 = 8;

// Output formats.
const PROTOBUF: i128 = 1;
const JSON: i128 = 2;
const JSPB: i128 = 3;
const TEXT_FORMAT: i128 = 4;

/// One answer: a field number of `ConformanceResponse` and its bytes.
type Answer = (u32, Vec<u8>);

struct Testee {
    protocol: TableSet,
    request: u32,
    suite: TableSet,
    decoder: Decoder,
    encoder: Encoder,
}

/// Runs the testee until the runner closes its stdin.
pub(crate) fn run(args: &TesteeArgs) -> Result<(), String> {
    let include = args
        .include
        .clone()
        .or_else(|| std::env::var_os("PROTOPLANE_CONFORMANCE_INCLUDE").map(PathBuf::from))
        .ok_or("conformance-testee: give --include DIR (the runner's test_messages protos)")?;
    let files: Vec<PathBuf> = SUITE.iter().map(|f| include.join(f)).collect();
    let suite = TableSet::from_proto_files(&files, &[&include])
        .map_err(|e| format!("the suite's messages under {}: {e}", include.display()))?;
    let src = [ProtoSource { name: "conformance.proto", text: PROTOCOL }];
    let protocol = TableSet::from_proto_sources(&src, &["conformance.proto"])
        .map_err(|e| format!("the protocol's messages: {e}"))?;
    let request = protocol
        .message_by_name("conformance.ConformanceRequest")
        .ok_or("no conformance.ConformanceRequest")?;
    let mut t =
        Testee { protocol, request, suite, decoder: Decoder::new(), encoder: Encoder::new() };
    let mut input = std::io::stdin().lock();
    let mut output = std::io::stdout().lock();
    let mut buf = Vec::new();
    loop {
        let mut len = [0u8; 4];
        match input.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(format!("reading a request: {e}")),
        }
        let n = u32::from_le_bytes(len) as usize;
        if n > MAX_REQUEST {
            return Err(format!("a request of {n} bytes (at most {MAX_REQUEST})"));
        }
        buf.resize(n, 0);
        input.read_exact(&mut buf).map_err(|e| format!("reading a request: {e}"))?;
        let (field, bytes) = t.answer(&buf);
        let mut out = Vec::with_capacity(bytes.len() + 16);
        put_varint(&mut out, u64::from(field << 3 | 2));
        put_varint(&mut out, bytes.len() as u64);
        out.extend_from_slice(&bytes);
        output
            .write_all(&(out.len() as u32).to_le_bytes())
            .and_then(|()| output.write_all(&out))
            .and_then(|()| output.flush())
            .map_err(|e| format!("writing a response: {e}"))?;
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// What a request asks.
struct Request<'a> {
    message_type: &'a str,
    output: i128,
    /// The payload's field number and bytes.
    payload: Option<(u32, &'a [u8])>,
    /// `JSON_IGNORE_UNKNOWN_PARSING_TEST`: parse with
    /// `ignore_unknown_fields`.
    ignore_unknown: bool,
    /// Text output prints unknown fields too.
    print_unknown: bool,
}

impl Testee {
    fn answer(&mut self, bytes: &[u8]) -> Answer {
        let mut block = protoplane_wire::Block::new();
        let opts = DecodeOptions { view: true, ..DecodeOptions::default() };
        let parsed = self
            .decoder
            .decode_into(&self.protocol, self.request, bytes, &opts, &mut block)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                let v = MessageView::new(
                    &self.protocol,
                    Source::viewing(block.as_bytes(), bytes),
                    self.request,
                )
                .map_err(|e| e.to_string())?;
                request(&v).map_err(|e| e.to_string())
            });
        let req = match parsed {
            Ok(r) => r,
            Err(e) => return (RUNTIME_ERROR, format!("the request: {e}").into_bytes()),
        };
        // The runner first asks for the testee's own list of expected
        // failures: none here (the list lives beside the test script).
        if req.message_type == "conformance.FailureSet" {
            return (PROTOBUF_PAYLOAD, Vec::new());
        }
        let Some(ty) = self.suite.message_by_name(req.message_type) else {
            return (SKIPPED, format!("no message type {}", req.message_type).into_bytes());
        };
        let message = match req.payload {
            Some((1, wire)) => {
                let mut block = protoplane_wire::Block::new();
                match self.decoder.decode_into(
                    &self.suite,
                    ty,
                    wire,
                    &DecodeOptions::default(),
                    &mut block,
                ) {
                    Ok(()) => block,
                    Err(e) => return (PARSE_ERROR, e.to_string().into_bytes()),
                }
            }
            Some((2, text)) => {
                let Ok(text) = std::str::from_utf8(text) else {
                    return (PARSE_ERROR, b"the JSON payload is not UTF-8".to_vec());
                };
                let opts = json::JsonOptions { ignore_unknown_fields: req.ignore_unknown };
                match json::from_json_with(&self.suite, ty, text, &opts) {
                    Ok(block) => block,
                    Err(e) => return (PARSE_ERROR, e.to_string().into_bytes()),
                }
            }
            Some((7, _)) => return (SKIPPED, b"JSPB is Google-internal".to_vec()),
            Some((8, text)) => {
                let Ok(text) = std::str::from_utf8(text) else {
                    return (PARSE_ERROR, b"the text payload is not UTF-8".to_vec());
                };
                match protoplane_wire::text::from_text(&self.suite, ty, text) {
                    Ok(block) => block,
                    Err(e) => return (PARSE_ERROR, e.to_string().into_bytes()),
                }
            }
            _ => return (RUNTIME_ERROR, b"the request carries no payload".to_vec()),
        };
        match req.output {
            PROTOBUF => {
                let mut out = Vec::new();
                match self.encoder.encode_into(
                    &self.suite,
                    ty,
                    Source::owned(message.as_bytes()),
                    &EncodeOptions::default(),
                    &mut out,
                ) {
                    Ok(()) => (PROTOBUF_PAYLOAD, out),
                    Err(e) => (SERIALIZE_ERROR, e.to_string().into_bytes()),
                }
            }
            JSON => {
                let mut out = String::new();
                let printed = MessageView::new(&self.suite, Source::owned(message.as_bytes()), ty)
                    .map_err(json::PrintError::from)
                    .and_then(|v| json::to_json(&v, &mut out));
                match printed {
                    Ok(()) => (JSON_PAYLOAD, out.into_bytes()),
                    Err(e) => (SERIALIZE_ERROR, e.to_string().into_bytes()),
                }
            }
            JSPB => (SKIPPED, b"JSPB is Google-internal".to_vec()),
            TEXT_FORMAT => {
                let mut out = String::new();
                let opts = text::TextOptions { print_unknown_fields: req.print_unknown };
                let printed = MessageView::new(&self.suite, Source::owned(message.as_bytes()), ty)
                    .map_err(text::PrintError::from)
                    .and_then(|v| text::to_text_with(&v, &mut out, &opts));
                match printed {
                    Ok(()) => (TEXT_PAYLOAD, out.into_bytes()),
                    Err(e) => (SERIALIZE_ERROR, e.to_string().into_bytes()),
                }
            }
            other => (RUNTIME_ERROR, format!("output format {other}").into_bytes()),
        }
    }
}

/// Reads a `ConformanceRequest` view.
fn request<'a>(v: &MessageView<'a>) -> Result<Request<'a>, protoplane_wire::BlockError> {
    let message_type = v.by_number(4)?.and_then(|x| x.as_str()).unwrap_or("");
    let output = v.by_number(3)?.and_then(|x| x.as_i128()).unwrap_or(0);
    let ignore_unknown = v.by_number(5)?.and_then(|x| x.as_i128()) == Some(3);
    let mut payload = None;
    for n in [1, 2, 7, 8] {
        if let Some(x) = v.by_number(n)? {
            payload = x.as_bytes().map(|b| (n, b));
        }
    }
    let print_unknown = v.by_number(9)?.and_then(|x| x.as_i128()) == Some(1);
    Ok(Request { message_type, output, payload, ignore_unknown, print_unknown })
}
