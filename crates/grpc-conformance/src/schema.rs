//! The conformance protocol's schema, loaded at run time from our own
//! declaration of it (`proto/conformance.proto`), and the few readers and
//! writers both adapters need on top of the wire engine's dynamic
//! [`MessageView`] and [`Builder`].
//!
//! Everything the runner sends is untrusted input: readers return errors
//! (a [`BlockError`] the caller turns into its own kind of failure), never
//! panic, and a field of the wrong type reads as absent.

use std::sync::Arc;

use protoplane_grpc::metadata::{decode_value, encode_value, is_binary};
use protoplane_grpc::{Metadata, Schema};
use protoplane_schema::ProtoSource;
use protoplane_wire::{BlockError, BuildError, Builder, MessageBuilder, MessageView, Value};

/// The service both adapters speak.
pub(crate) const SERVICE: &str = "connectrpc.conformance.v1.ConformanceService";

/// Prefix of every type URL the runner writes and reads (`Any.type_url`).
pub(crate) const TYPE_URL_PREFIX: &str = "type.googleapis.com/";

const PROTO_NAME: &str = "connectrpc/conformance/v1/protoplane_conformance.proto";
const PROTO: &str = include_str!("../proto/conformance.proto");

/// The six methods of `ConformanceService`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rpc {
    Unary,
    ServerStream,
    ClientStream,
    BidiStream,
    Unimplemented,
    IdempotentUnary,
}

impl Rpc {
    pub(crate) const ALL: [Rpc; 6] = [
        Rpc::Unary,
        Rpc::ServerStream,
        Rpc::ClientStream,
        Rpc::BidiStream,
        Rpc::Unimplemented,
        Rpc::IdempotentUnary,
    ];

    /// The method's name in the service.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Rpc::Unary => "Unary",
            Rpc::ServerStream => "ServerStream",
            Rpc::ClientStream => "ClientStream",
            Rpc::BidiStream => "BidiStream",
            Rpc::Unimplemented => "Unimplemented",
            Rpc::IdempotentUnary => "IdempotentUnary",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Rpc> {
        Rpc::ALL.into_iter().find(|r| r.name() == name)
    }
}

/// Table indices of the messages the adapters build or decode at the top
/// level (the others are reached as sub-messages).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Types {
    pub(crate) server_compat_request: u32,
    pub(crate) server_compat_response: u32,
    pub(crate) client_compat_request: u32,
    pub(crate) client_compat_response: u32,
    pub(crate) request_info: u32,
}

/// The loaded schema: tables, the method ids of [`Rpc`], message types.
#[derive(Debug)]
pub(crate) struct Conformance {
    pub(crate) schema: Arc<Schema>,
    pub(crate) types: Types,
    ids: [u32; 6],
}

impl Conformance {
    /// Compiles the embedded declaration (once per process).
    pub(crate) fn load() -> Result<Conformance, String> {
        let src = [ProtoSource { name: PROTO_NAME, text: PROTO }];
        let schema = Schema::from_proto_sources(&src, &[PROTO_NAME])
            .map_err(|e| format!("conformance schema: {e}"))?;
        let t = |name: &str| {
            let full = format!("connectrpc.conformance.v1.{name}");
            schema.tables().message_by_name(&full).ok_or(format!("conformance schema lacks {full}"))
        };
        let types = Types {
            server_compat_request: t("ServerCompatRequest")?,
            server_compat_response: t("ServerCompatResponse")?,
            client_compat_request: t("ClientCompatRequest")?,
            client_compat_response: t("ClientCompatResponse")?,
            request_info: t("ConformancePayload.RequestInfo")?,
        };
        let mut ids = [0; 6];
        for (slot, rpc) in ids.iter_mut().zip(Rpc::ALL) {
            *slot = schema
                .find(SERVICE, rpc.name())
                .ok_or(format!("conformance schema lacks {SERVICE}.{}", rpc.name()))?;
        }
        Ok(Conformance { schema: Arc::new(schema), types, ids })
    }

    /// The method id of `rpc`.
    pub(crate) fn id(&self, rpc: Rpc) -> u32 {
        self.ids[rpc as usize]
    }

    /// The [`Rpc`] with method id `id`.
    pub(crate) fn rpc(&self, id: u32) -> Option<Rpc> {
        Rpc::ALL.into_iter().find(|&r| self.id(r) == id)
    }

    /// The method's (request type, response type).
    pub(crate) fn io(&self, rpc: Rpc) -> (u32, u32) {
        self.schema.method(self.id(rpc)).map_or((0, 0), |m| (m.input, m.output))
    }

    /// The type URL of a message type (`type.googleapis.com/pkg.Name`).
    pub(crate) fn type_url(&self, ty: u32) -> String {
        format!("{TYPE_URL_PREFIX}{}", self.schema.tables().message_name(ty))
    }

    /// Encodes a block built with this schema.
    pub(crate) fn encode(
        &self,
        ty: u32,
        block: &protoplane_wire::Block,
    ) -> Result<Vec<u8>, String> {
        protoplane_wire::encode(
            self.schema.tables(),
            ty,
            block.as_bytes(),
            &protoplane_wire::EncodeOptions::default(),
        )
        .map_err(|e| format!("encoding {}: {e}", self.schema.tables().message_name(ty)))
    }
}

// ---- Reading -----------------------------------------------------------------

/// An integer (or enum, or bool) field; 0 when absent.
pub(crate) fn int(v: &MessageView<'_>, number: u32) -> Result<i128, BlockError> {
    Ok(v.by_number(number)?.and_then(|x| x.as_i128()).unwrap_or(0))
}

/// A string field, if present (and valid UTF-8).
pub(crate) fn text<'a>(v: &MessageView<'a>, number: u32) -> Result<Option<&'a str>, BlockError> {
    Ok(v.by_number(number)?.and_then(|x| x.as_str()))
}

/// A bytes (or string) field; empty when absent.
pub(crate) fn bytes<'a>(v: &MessageView<'a>, number: u32) -> Result<&'a [u8], BlockError> {
    Ok(v.by_number(number)?.and_then(|x| x.as_bytes()).unwrap_or(&[]))
}

/// A sub-message field, if present.
pub(crate) fn sub<'a>(
    v: &MessageView<'a>,
    number: u32,
) -> Result<Option<MessageView<'a>>, BlockError> {
    Ok(v.by_number(number)?.and_then(|x| x.as_message()))
}

/// The elements of a repeated field (none when absent).
pub(crate) fn each<'a>(v: &MessageView<'a>, number: u32) -> Result<Vec<Value<'a>>, BlockError> {
    let Some(f) = v.field(number) else { return Ok(Vec::new()) };
    v.repeated(f)?.iter().collect()
}

/// The sub-messages of a repeated message field.
pub(crate) fn messages<'a>(
    v: &MessageView<'a>,
    number: u32,
) -> Result<Vec<MessageView<'a>>, BlockError> {
    Ok(each(v, number)?.into_iter().filter_map(|x| x.as_message()).collect())
}

/// A `google.protobuf.Any`: its type URL and the encoded message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Packed {
    pub(crate) type_url: String,
    pub(crate) value: bytes::Bytes,
}

impl Packed {
    pub(crate) fn read(v: &MessageView<'_>) -> Result<Packed, BlockError> {
        Ok(Packed {
            type_url: text(v, 1)?.unwrap_or("").to_string(),
            value: bytes::Bytes::copy_from_slice(bytes(v, 2)?),
        })
    }

    /// The full name of the packed type: what follows the last `/`.
    pub(crate) fn type_name(&self) -> &str {
        self.type_url.rsplit_once('/').map_or(self.type_url.as_str(), |(_, n)| n)
    }
}

/// The metadata a repeated `Header` field describes. Names are lower-cased
/// (HTTP/2 carries them so); values of `-bin` keys are base64 in a
/// `Header` and are decoded, or taken as they are when they are not base64
/// (what the runner's own gRPC peers do).
pub(crate) fn metadata(v: &MessageView<'_>, number: u32) -> Result<Metadata, String> {
    let mut md = Metadata::new();
    for h in messages(v, number).map_err(|e| e.to_string())? {
        let name = text(&h, 1).map_err(|e| e.to_string())?.unwrap_or("").to_ascii_lowercase();
        for value in each(&h, 2).map_err(|e| e.to_string())? {
            let raw = value.as_bytes().unwrap_or(&[]);
            let added = if is_binary(&name) {
                let decoded = decode_value(&name, raw).unwrap_or_else(|_| raw.to_vec());
                md.insert_bin(&name, &decoded)
            } else {
                md.insert(&name, &String::from_utf8_lossy(raw))
            };
            added.map_err(|e| format!("header {name:?}: {e}"))?;
        }
    }
    Ok(md)
}

// ---- Writing -----------------------------------------------------------------

/// Writes `md` into repeated `Header` field `number`: one `Header` per key,
/// in the order keys first appear, with every value of that key in order
/// (`-bin` values base64-encoded without padding, as on the wire).
pub(crate) fn put_metadata(
    b: &mut Builder<'_>,
    at: MessageBuilder,
    number: u32,
    md: &Metadata,
) -> Result<(), BuildError> {
    let mut keys: Vec<&str> = Vec::new();
    for (k, _) in md.iter() {
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for k in keys {
        let h = b.message(at, number)?;
        b.set(h, 1, Value::String(k.as_bytes()))?;
        for v in md.get_all(k) {
            let shown = encode_value(k, v).unwrap_or_else(|_| String::from_utf8_lossy(v).into());
            b.push(h, 2, Value::String(shown.as_bytes()))?;
        }
    }
    Ok(())
}

/// Appends an `Any` to repeated field `number`.
pub(crate) fn put_any(
    b: &mut Builder<'_>,
    at: MessageBuilder,
    number: u32,
    any: &Packed,
) -> Result<(), BuildError> {
    let a = b.message(at, number)?;
    b.set(a, 1, Value::String(any.type_url.as_bytes()))?;
    b.set(a, 2, Value::Bytes(&any.value))
}

/// Copies message `v` into the builder's message `at` (of the same type):
/// every present field, sub-messages recursively, and the unknown fields
/// byte for byte. `depth` bounds the recursion (a block from the network
/// can nest as deep as its decoder allowed).
pub(crate) fn copy(
    b: &mut Builder<'_>,
    at: MessageBuilder,
    v: &MessageView<'_>,
    depth: u32,
) -> Result<(), String> {
    if depth == 0 {
        return Err(format!("{} nests too deep to copy", v.type_name()));
    }
    let e = |e: BlockError| e.to_string();
    let w = |e: BuildError| e.to_string();
    for f in v.fields() {
        if f.is_repeated() {
            for x in v.repeated(f).map_err(e)?.iter() {
                match x.map_err(e)? {
                    Value::Message(m) => {
                        let sub = b.message(at, f.number).map_err(w)?;
                        copy(b, sub, &m, depth - 1)?;
                    }
                    x => b.push(at, f.number, x).map_err(w)?,
                }
            }
            continue;
        }
        match v.get(f).map_err(e)? {
            None => {}
            Some(Value::Message(m)) => {
                let sub = b.message(at, f.number).map_err(w)?;
                copy(b, sub, &m, depth - 1)?;
            }
            Some(x) => b.set(at, f.number, x).map_err(w)?,
        }
    }
    let unknown = v.unknown_fields().map_err(e)?;
    if !unknown.is_empty() {
        b.push_unknown(at, unknown).map_err(w)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use protoplane_grpc::Message;
    use protoplane_wire::Decoder;

    use super::*;

    fn conformance() -> Conformance {
        Conformance::load().unwrap_or_else(|e| panic!("{e}"))
    }

    fn decode(c: &Conformance, ty: u32, wire: &[u8]) -> Message {
        let tables = c.schema.tables();
        Message::decode(tables, ty, Bytes::copy_from_slice(wire), &mut Decoder::new())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn encode(c: &Conformance, ty: u32, b: Builder<'_>) -> Vec<u8> {
        c.encode(ty, &b.finish()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A length-delimited field (numbers below 16, lengths below 128).
    fn ld(number: u8, body: &[u8]) -> Vec<u8> {
        [&[number << 3 | 2, body.len() as u8][..], body].concat()
    }

    #[test]
    fn every_method_and_type_resolves() {
        let c = conformance();
        for rpc in Rpc::ALL {
            assert_eq!(c.rpc(c.id(rpc)), Some(rpc));
            assert_eq!(Rpc::from_name(rpc.name()), Some(rpc));
        }
        let (input, _) = c.io(Rpc::BidiStream);
        assert_eq!(
            c.type_url(input),
            "type.googleapis.com/connectrpc.conformance.v1.BidiStreamRequest"
        );
        assert_eq!(
            c.type_url(c.types.request_info),
            "type.googleapis.com/connectrpc.conformance.v1.ConformancePayload.RequestInfo"
        );
        let any = Packed { type_url: c.type_url(input), value: Bytes::new() };
        assert_eq!(any.type_name(), "connectrpc.conformance.v1.BidiStreamRequest");
    }

    #[test]
    fn headers_become_metadata_and_back() {
        let c = conformance();
        let ty = c.types.request_info;
        let header = |name: &[u8], values: &[&[u8]]| {
            let mut h = ld(1, name);
            for v in values {
                h.extend(ld(2, v));
            }
            ld(1, &h)
        };
        // Names are lower-cased; "AQI" is 01 02 in unpadded base64.
        let sent =
            [header(b"X-Test", &[b"Value1", b"Value2"]), header(b"t-bin", &[b"AQI="])].concat();
        let echoed =
            [header(b"x-test", &[b"Value1", b"Value2"]), header(b"t-bin", &[b"AQI"])].concat();
        let m = decode(&c, ty, &sent);
        let v = m.view(c.schema.tables()).unwrap_or_else(|e| panic!("{e}"));
        let md = metadata(&v, 1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(md.get_all("x-test").collect::<Vec<_>>(), [&b"Value1"[..], b"Value2"]);
        assert_eq!(md.get_bin("t-bin"), Some(&[1u8, 2][..]));

        let mut b = Builder::new(c.schema.tables(), ty).unwrap_or_else(|e| panic!("{e}"));
        let root = b.root();
        put_metadata(&mut b, root, 1, &md).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(encode(&c, ty, b), echoed);
    }

    #[test]
    fn copy_reproduces_a_payload_with_unknown_fields() {
        let c = conformance();
        let ty = c
            .schema
            .tables()
            .message_by_name("connectrpc.conformance.v1.ConformancePayload")
            .unwrap_or_else(|| panic!("no ConformancePayload"));
        // ConformancePayload { data: "hi", request_info: { timeout_ms: 7,
        //   requests: [Any { type_url: "t/x", value: 08 01 }] }, 99: 5 }
        let any = [ld(1, b"t/x"), ld(2, &[0x08, 0x01])].concat();
        let info = [&[0x10, 0x07][..], &ld(3, &any)].concat();
        let wire = [ld(1, b"hi"), ld(2, &info), vec![0x98, 0x06, 0x05]].concat();
        let m = decode(&c, ty, &wire);
        let v = m.view(c.schema.tables()).unwrap_or_else(|e| panic!("{e}"));

        let mut b = Builder::new(c.schema.tables(), ty).unwrap_or_else(|e| panic!("{e}"));
        let root = b.root();
        copy(&mut b, root, &v, 8).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(encode(&c, ty, b), wire);

        let mut b = Builder::new(c.schema.tables(), ty).unwrap_or_else(|e| panic!("{e}"));
        let root = b.root();
        assert!(copy(&mut b, root, &v, 2).is_err(), "depth is bounded");
    }
}
