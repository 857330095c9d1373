//! gRPC's cross-language interop test service (`grpc.testing.TestService`):
//! a server (`protoplane interop-server`) and a client
//! (`protoplane interop-client`) whose flags mirror grpc-go's interop
//! binaries, so either side can be checked against a real gRPC peer.
//!
//! Both use the dynamic path — the schema is loaded at run time from the
//! embedded `.proto`, requests are read through `MessageView` and responses
//! laid out with the wire engine's `Builder` — so they exercise exactly what
//! a user without generated code gets.

pub(crate) mod client;
pub(crate) mod server;

use std::sync::Arc;

use protoplane_grpc::Schema;
use protoplane_schema::ProtoSource;

const PROTO: &str = include_str!("../../../../protos/interop/grpc_testing.proto");

/// The interop schema (compiled once per process).
pub(crate) fn schema() -> Result<Arc<Schema>, String> {
    let src = [ProtoSource { name: "interop/grpc_testing.proto", text: PROTO }];
    Schema::from_proto_sources(&src, &["interop/grpc_testing.proto"])
        .map(Arc::new)
        .map_err(|e| format!("interop schema: {e}"))
}

/// Table indices of the messages the interop service uses.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Types {
    pub(crate) empty: u32,
    pub(crate) simple_request: u32,
    pub(crate) simple_response: u32,
    pub(crate) input_request: u32,
    pub(crate) input_response: u32,
    pub(crate) output_request: u32,
    pub(crate) output_response: u32,
}

impl Types {
    pub(crate) fn of(schema: &Schema) -> Result<Types, String> {
        let t = |n: &str| {
            schema
                .tables()
                .message_by_name(&format!("grpc.testing.{n}"))
                .ok_or_else(|| format!("interop schema lacks {n}"))
        };
        Ok(Types {
            empty: t("Empty")?,
            simple_request: t("SimpleRequest")?,
            simple_response: t("SimpleResponse")?,
            input_request: t("StreamingInputCallRequest")?,
            input_response: t("StreamingInputCallResponse")?,
            output_request: t("StreamingOutputCallRequest")?,
            output_response: t("StreamingOutputCallResponse")?,
        })
    }
}
