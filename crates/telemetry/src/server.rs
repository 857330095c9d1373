//! A span for every call a service serves.
//!
//! [`traced`] wraps a [`Service`] (so it serves a monolithic `Router`, an
//! application attached to the engine, or anything else that takes a
//! service): each call gets an INFO span named `package.Service/Method`
//! with OpenTelemetry's RPC attributes (`rpc.system`, `rpc.service`,
//! `rpc.method`, `rpc.grpc.status_code`, `network.peer.address`), kind
//! SERVER, whose parent is the `traceparent` the client sent. The handler
//! runs inside the span, so its own events and spans, and the calls it
//! makes through a traced channel ([`crate::client::ClientTracing`]), are
//! the span's children: the trace continues downstream. A call cancelled
//! before its end (its handler dropped) ends its span with CANCELLED.
//!
//! A service that is not wrapped pays nothing, and a wrapped one whose
//! spans no subscriber wants pays one disabled-span check per call.

use std::sync::Arc;

use protoplane_grpc::call::{BoxFuture, Request, Responder, Service, Streaming};
use protoplane_grpc::schema::Schema;
use protoplane_grpc::{Code, Metadata, Status};
use tracing::field::Empty;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of the call spans (`RUST_LOG` can name it).
pub const TARGET: &str = "protoplane_telemetry::call";

/// `svc` with a span around every call.
pub fn traced(svc: Arc<dyn Service>) -> Arc<dyn Service> {
    Arc::new(Traced { inner: svc })
}

struct Traced {
    inner: Arc<dyn Service>,
}

/// Whether a server reports this code as an error (OpenTelemetry's gRPC
/// conventions: the codes that mean the server failed, not the caller).
fn server_error(code: Code) -> bool {
    matches!(
        code,
        Code::Unknown
            | Code::DeadlineExceeded
            | Code::Unimplemented
            | Code::Internal
            | Code::Unavailable
            | Code::DataLoss
    )
}

/// Records a call's status on its span: once, at its end, or CANCELLED
/// when the call is dropped first.
pub(crate) struct Outcome {
    pub(crate) span: tracing::Span,
    pub(crate) server: bool,
    pub(crate) done: bool,
}

impl Outcome {
    pub(crate) fn record(&mut self, status: Option<&Status>) {
        self.done = true;
        let code = status.map_or(Code::Ok, |s| s.code);
        self.span.record("rpc.grpc.status_code", code as i64);
        let error = code != Code::Ok && (!self.server || server_error(code));
        if let (true, Some(st)) = (error, status) {
            self.span.record("otel.status_code", "ERROR");
            self.span.record("otel.status_description", st.message.as_str());
        }
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        if !self.done {
            let st = Status::new(Code::Cancelled, "the call was cancelled");
            self.record(Some(&st));
        }
    }
}

impl Service for Traced {
    fn schema(&self) -> &Arc<Schema> {
        self.inner.schema()
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn decodes_requests(&self) -> bool {
        self.inner.decodes_requests()
    }

    fn landing(&self, need: usize) -> Option<protoplane_grpc::landing::Landing> {
        self.inner.landing(need)
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        request: Request<Streaming>,
        responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        let span = match self.inner.schema().method(method) {
            Some(m) => tracing::info_span!(
                target: TARGET,
                "grpc.server",
                otel.name = m.path.trim_start_matches('/'),
                otel.kind = "server",
                otel.status_code = Empty,
                otel.status_description = Empty,
                rpc.system = "grpc",
                rpc.service = m.service.as_str(),
                rpc.method = m.name.as_str(),
                rpc.grpc.status_code = Empty,
                network.peer.address = Empty,
                network.peer.port = Empty,
            ),
            None => tracing::Span::none(),
        };
        if !span.is_disabled() {
            let _ = span.set_parent(crate::propagate::extract(&request.metadata));
            if let Some(addr) = request.peer.as_ref().and_then(|p| p.addr) {
                span.record("network.peer.address", addr.ip().to_string());
                span.record("network.peer.port", i64::from(addr.port()));
            }
        }
        let handler = span.in_scope(|| self.inner.clone().call(method, request, responder));
        if span.is_disabled() {
            return handler;
        }
        Box::pin(async move {
            let mut outcome = Outcome { span: span.clone(), server: true, done: false };
            let out = handler.instrument(span).await;
            outcome.record(out.as_ref().err());
            out
        })
    }
}
