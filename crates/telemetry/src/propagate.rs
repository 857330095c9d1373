//! W3C trace context (`traceparent`, `tracestate`) read from and written
//! to gRPC metadata through OpenTelemetry's propagator, the one grpc-go's
//! `otelgrpc`, tonic's tracing stacks and the OpenTelemetry SDKs use: a
//! trace crosses protoplane, grpc-go and tonic hops as one trace.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use protoplane_grpc::Metadata;

/// The propagator (W3C Trace Context).
pub(crate) fn propagator() -> &'static TraceContextPropagator {
    static P: std::sync::OnceLock<TraceContextPropagator> = std::sync::OnceLock::new();
    P.get_or_init(TraceContextPropagator::new)
}

struct Reader<'a>(&'a Metadata);

impl Extractor for Reader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k).collect()
    }
}

struct Writer<'a>(&'a mut Metadata);

impl Injector for Writer<'_> {
    fn set(&mut self, key: &str, value: String) {
        // The propagator writes only `traceparent` and `tracestate`,
        // whose values are printable ASCII: an insert cannot fail.
        let _ = self.0.insert(key, &value);
    }
}

/// The remote parent `metadata` carries (an empty context when it
/// carries none, or a malformed one: the call starts a new trace).
pub fn extract(metadata: &Metadata) -> Context {
    propagator().extract(&Reader(metadata))
}

/// Writes `cx`'s span into `metadata` as `traceparent` (and
/// `tracestate`), in place of any the caller set.
pub fn inject(cx: &Context, metadata: &mut Metadata) {
    propagator().inject_context(cx, &mut Writer(metadata));
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;

    #[test]
    fn a_traceparent_in_metadata_round_trips() {
        let mut md = Metadata::new();
        md.insert("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            .expect("metadata");
        let cx = extract(&md);
        let sc = cx.span().span_context().clone();
        assert!(sc.is_remote() && sc.is_sampled());
        assert_eq!(format!("{:032x}", sc.trace_id()), "0af7651916cd43dd8448eb211c80319c");
        let mut out = Metadata::new();
        inject(&cx, &mut out);
        assert_eq!(
            out.get("traceparent"),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        );
    }

    #[test]
    fn malformed_trace_context_starts_a_new_trace() {
        for bad in ["", "garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01"] {
            let mut md = Metadata::new();
            md.insert("traceparent", bad).expect("metadata");
            assert!(!extract(&md).span().span_context().is_valid(), "{bad:?}");
        }
    }
}
