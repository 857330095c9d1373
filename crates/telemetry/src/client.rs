//! A span for every call a channel makes, and the trace context sent
//! with it.
//!
//! [`ClientTracing`] is a client interceptor: install it on a channel
//! (`channel.intercept(ClientChain::new().with(ClientTracing))`) and each
//! call gets an INFO span named `package.Service/Method`, kind CLIENT,
//! child of the span current where the call is made (a handler's
//! [`crate::server::traced`] span, so a call made while serving continues
//! the trace), and `traceparent`/`tracestate` in its request metadata
//! for the next hop. The span ends with the call's status; any non-OK
//! code marks it as an error, as OpenTelemetry's gRPC conventions say for
//! clients.

use protoplane_grpc::Status;
use protoplane_rpc::intercept::{ClientEnd, ClientHead, ClientInterceptor};
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::server::{Outcome, TARGET};

/// The client interceptor that traces calls (see the module).
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientTracing;

/// The span of one call, kept in the call's state until it ends.
struct CallSpan(std::sync::Mutex<Outcome>);

impl ClientInterceptor for ClientTracing {
    fn before(&self, call: &mut ClientHead<'_>) -> Result<(), Status> {
        let path = call.path.trim_start_matches('/');
        let (service, method) = path.split_once('/').unwrap_or((path, ""));
        let span = tracing::info_span!(
            target: TARGET,
            "grpc.client",
            otel.name = path,
            otel.kind = "client",
            otel.status_code = Empty,
            otel.status_description = Empty,
            rpc.system = "grpc",
            rpc.service = service,
            rpc.method = method,
            rpc.grpc.status_code = Empty,
        );
        if span.is_disabled() {
            return Ok(());
        }
        crate::propagate::inject(&span.context(), &mut call.options.metadata);
        call.state.insert(CallSpan(std::sync::Mutex::new(Outcome {
            span,
            server: false,
            done: false,
        })));
        Ok(())
    }

    fn after(&self, call: &ClientEnd<'_>) {
        if let Some(CallSpan(o)) = call.state.get::<CallSpan>() {
            let mut o = o.lock().unwrap_or_else(|p| p.into_inner());
            o.record((call.status.code != protoplane_grpc::Code::Ok).then_some(call.status));
        }
    }
}
