//! Spans of real gRPC calls over sockets: a client span in the caller, a
//! server span whose parent is the `traceparent` the client sent, a call
//! the handler makes continuing the trace, statuses and cancellation on
//! the spans, a foreign `traceparent` adopted, and the OTLP request the
//! exporter would send for all of them read back field by field.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::trace::{SpanId, SpanKind, Status as SpanStatus, TraceId, TracerProvider as _};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::intercept::ClientChain;
use protoplane_rpc::{CallOptions, Channel, Router, ServerOptions};
use protoplane_schema::ProtoSource;
use protoplane_telemetry::{traced, ClientTracing};
use protoplane_test_support::net::{bounded, serve_grpc};
use protoplane_wire::Builder;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

const BOUND: Duration = Duration::from_secs(10);

const PROTO: &str = r#"
syntax = "proto3";
package trace.test;
message Empty {}
service Front { rpc Get(Empty) returns (Empty); rpc Fail(Empty) returns (Empty); rpc Hang(Empty) returns (Empty); }
service Back { rpc Get(Empty) returns (Empty); }
"#;

/// `Front/Get` calls `Back/Get` through a traced channel, then answers;
/// `Front/Fail` answers INTERNAL; `Front/Hang` never answers.
struct Svc {
    schema: Arc<Schema>,
    name: &'static str,
    back: Arc<OnceLock<Channel>>,
}

impl Service for Svc {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        self.name
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            req.message.single().await?;
            let m = self.schema.method(method).map(|m| m.name.clone()).unwrap_or_default();
            match (self.name, m.as_str()) {
                ("trace.test.Front", "Get") => {
                    let ch = self.back.get().expect("back channel").clone();
                    call(&ch, "/trace.test.Back/Get", CallOptions::default()).await?;
                }
                (_, "Fail") => return Err(Status::new(Code::Internal, "it broke")),
                (_, "Hang") => std::future::pending::<()>().await,
                _ => {}
            }
            let b = Builder::new(self.schema.tables(), out.output_type())
                .map_err(|e| Status::new(Code::Internal, e.to_string()))?;
            out.send(b.finish()).await?;
            Ok(Metadata::new())
        })
    }
}

async fn call(ch: &Channel, path: &str, opts: CallOptions) -> Result<(), Status> {
    let mut c = ch.start(path, opts).await?;
    c.send_last(&[]).await?;
    while c.recv().await?.is_some() {}
    let st = c.finish_status().await;
    if st.code != Code::Ok {
        return Err(st);
    }
    Ok(())
}

/// Spans recorded in memory by this thread's subscriber.
struct Recorded {
    exporter: InMemorySpanExporter,
    provider: SdkTracerProvider,
    _guard: tracing::subscriber::DefaultGuard,
}

impl Recorded {
    fn new() -> Recorded {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
        let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
        Recorded { exporter, provider, _guard: guard }
    }

    fn spans(&self) -> Vec<SpanData> {
        let _ = self.provider.force_flush();
        self.exporter.get_finished_spans().expect("spans")
    }
}

fn named<'a>(spans: &'a [SpanData], name: &str, kind: SpanKind) -> &'a SpanData {
    spans
        .iter()
        .find(|s| s.name == name && s.span_kind == kind)
        .unwrap_or_else(|| panic!("no {kind:?} span {name}: {:?}", names(spans)))
}

fn names(spans: &[SpanData]) -> Vec<String> {
    spans.iter().map(|s| format!("{} {:?}", s.name, s.span_kind)).collect()
}

fn attr<'a>(s: &'a SpanData, key: &str) -> Option<&'a Value> {
    s.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| &kv.value)
}

/// A Front and a Back service on one router, and a traced channel to it.
async fn setup() -> Channel {
    let src = [ProtoSource { name: "trace.proto", text: PROTO }];
    let schema = Arc::new(Schema::from_proto_sources(&src, &["trace.proto"]).expect("schema"));
    let back = Arc::new(OnceLock::new());
    let front =
        Arc::new(Svc { schema: schema.clone(), name: "trace.test.Front", back: back.clone() });
    let backs = Arc::new(Svc { schema, name: "trace.test.Back", back: back.clone() });
    let router = Arc::new(
        Router::new(ServerOptions::default()).add_service(traced(front)).add_service(traced(backs)),
    );
    let addr = serve_grpc(router).await;
    let ch = Channel::connect(&addr.to_string())
        .await
        .expect("connect")
        .intercept(ClientChain::new().with(ClientTracing));
    let _ = back.set(ch.clone());
    ch
}

#[tokio::test]
async fn a_trace_continues_through_a_call_and_the_call_its_handler_makes() {
    let rec = Recorded::new();
    let ch = setup().await;
    let root = tracing::info_span!("root");
    bounded(
        BOUND,
        "call",
        call(&ch, "/trace.test.Front/Get", CallOptions::default()).instrument(root),
    )
    .await
    .expect("ok");
    let spans = rec.spans();
    let root = named(&spans, "root", SpanKind::Internal);
    let c1 = named(&spans, "trace.test.Front/Get", SpanKind::Client);
    let s1 = named(&spans, "trace.test.Front/Get", SpanKind::Server);
    let c2 = named(&spans, "trace.test.Back/Get", SpanKind::Client);
    let s2 = named(&spans, "trace.test.Back/Get", SpanKind::Server);
    let trace = root.span_context.trace_id();
    for s in [c1, s1, c2, s2] {
        assert_eq!(s.span_context.trace_id(), trace, "{}: one trace", s.name);
    }
    // Each hop's parent is the span before it; server spans' parents came
    // over the wire.
    assert_eq!(c1.parent_span_id, root.span_context.span_id());
    assert_eq!(s1.parent_span_id, c1.span_context.span_id());
    assert!(s1.parent_span_is_remote && !c1.parent_span_is_remote);
    assert_eq!(c2.parent_span_id, s1.span_context.span_id());
    assert_eq!(s2.parent_span_id, c2.span_context.span_id());
    assert!(s2.parent_span_is_remote);
    // OpenTelemetry's RPC attributes.
    assert_eq!(attr(s1, "rpc.system"), Some(&Value::from("grpc")));
    assert_eq!(attr(s1, "rpc.service"), Some(&Value::from("trace.test.Front")));
    assert_eq!(attr(s1, "rpc.method"), Some(&Value::from("Get")));
    assert_eq!(attr(s1, "rpc.grpc.status_code"), Some(&Value::I64(0)));
    assert_eq!(attr(c2, "rpc.grpc.status_code"), Some(&Value::I64(0)));
    assert_eq!(attr(s1, "network.peer.address"), Some(&Value::from("127.0.0.1")));
    assert_eq!(s1.status, SpanStatus::Unset);
}

#[tokio::test]
async fn statuses_and_cancellation_end_up_on_the_spans() {
    let rec = Recorded::new();
    let ch = setup().await;
    let st = bounded(BOUND, "fail", call(&ch, "/trace.test.Front/Fail", CallOptions::default()))
        .await
        .expect_err("INTERNAL");
    assert_eq!(st.code, Code::Internal);
    let short = CallOptions::default().with_timeout(Duration::from_millis(100));
    let st = bounded(BOUND, "hang", call(&ch, "/trace.test.Front/Hang", short))
        .await
        .expect_err("deadline");
    assert_eq!(st.code, Code::DeadlineExceeded);
    // The server span of the hung call ends when its handler is dropped.
    let deadline = std::time::Instant::now() + BOUND;
    let spans = loop {
        let spans = rec.spans();
        if spans
            .iter()
            .any(|s| s.name == "trace.test.Front/Hang" && s.span_kind == SpanKind::Server)
        {
            break spans;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no server span for Hang: {:?}",
            names(&spans)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let s = named(&spans, "trace.test.Front/Fail", SpanKind::Server);
    assert_eq!(attr(s, "rpc.grpc.status_code"), Some(&Value::I64(Code::Internal as i64)));
    assert_eq!(s.status, SpanStatus::error("it broke"));
    let c = named(&spans, "trace.test.Front/Fail", SpanKind::Client);
    assert!(matches!(c.status, SpanStatus::Error { .. }), "{:?}", c.status);
    let h = named(&spans, "trace.test.Front/Hang", SpanKind::Server);
    let code = attr(h, "rpc.grpc.status_code");
    assert!(
        code == Some(&Value::I64(Code::Cancelled as i64))
            || code == Some(&Value::I64(Code::DeadlineExceeded as i64)),
        "{code:?}"
    );
    let hc = named(&spans, "trace.test.Front/Hang", SpanKind::Client);
    assert_eq!(attr(hc, "rpc.grpc.status_code"), Some(&Value::I64(Code::DeadlineExceeded as i64)));
}

#[tokio::test]
async fn a_foreign_traceparent_becomes_the_server_spans_parent() {
    let rec = Recorded::new();
    let src = [ProtoSource { name: "trace.proto", text: PROTO }];
    let schema = Arc::new(Schema::from_proto_sources(&src, &["trace.proto"]).expect("schema"));
    let back = Arc::new(OnceLock::new());
    let svc = Arc::new(Svc { schema, name: "trace.test.Back", back });
    let router = Arc::new(Router::new(ServerOptions::default()).add_service(traced(svc)));
    let addr = serve_grpc(router).await;
    // A plain channel: the metadata carries what another stack sent.
    let ch = Channel::connect(&addr.to_string()).await.expect("connect");
    let mut opts = CallOptions::default();
    opts.metadata
        .insert("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .expect("metadata");
    bounded(BOUND, "call", call(&ch, "/trace.test.Back/Get", opts)).await.expect("ok");
    let spans = rec.spans();
    let s = named(&spans, "trace.test.Back/Get", SpanKind::Server);
    assert_eq!(
        s.span_context.trace_id(),
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex")
    );
    assert_eq!(s.parent_span_id, SpanId::from_hex("00f067aa0ba902b7").expect("hex"));
    assert!(s.parent_span_is_remote);
}

#[tokio::test]
async fn the_otlp_request_carries_every_span_and_its_fields() {
    use protoplane_telemetry::pb::opentelemetry::proto::collector::trace::v1 as collector;
    use protoplane_wire::DecodeOptions;

    let rec = Recorded::new();
    let ch = setup().await;
    bounded(BOUND, "call", call(&ch, "/trace.test.Front/Get", CallOptions::default()))
        .await
        .expect("ok");
    let _ =
        bounded(BOUND, "fail", call(&ch, "/trace.test.Front/Fail", CallOptions::default())).await;
    let spans = rec.spans();
    let resource = opentelemetry_sdk::Resource::builder_empty().with_service_name("svc-a").build();
    let wire = protoplane_telemetry::otlp::encode_request(&resource, &spans).expect("encode");

    let block = collector::ExportTraceServiceRequest::decode(&wire, &DecodeOptions::default())
        .expect("decodes");
    let req = collector::ExportTraceServiceRequestView::from_block(block.as_bytes(), &wire)
        .expect("view");
    assert_eq!(req.resource_spans().len(), 1);
    let rs = req.resource_spans().get(0).expect("resource spans");
    let service =
        rs.resource().expect("resource").attributes().iter().find(|kv| kv.key() == "service.name");
    assert_eq!(
        service.and_then(|kv| kv.value()).map(|v| v.string_value().to_string()),
        Some("svc-a".into())
    );
    let mut seen = 0;
    for ss in rs.scope_spans().iter() {
        for s in ss.spans().iter() {
            let want = spans
                .iter()
                .find(|d| d.span_context.span_id().to_bytes() == s.span_id())
                .expect("a span that was recorded");
            seen += 1;
            assert_eq!(s.trace_id(), &want.span_context.trace_id().to_bytes()[..]);
            assert_eq!(s.name(), want.name);
            let parent = match want.parent_span_id {
                SpanId::INVALID => Vec::new(),
                p => p.to_bytes().to_vec(),
            };
            assert_eq!(s.parent_span_id(), &parent[..]);
            let kind = match want.span_kind {
                SpanKind::Server => 2,
                SpanKind::Client => 3,
                _ => 1,
            };
            assert_eq!(s.kind(), kind);
            assert!(
                s.end_time_unix_nano() >= s.start_time_unix_nano() && s.start_time_unix_nano() > 0
            );
            assert_eq!(s.attributes().len(), want.attributes.len());
            let code = s.attributes().iter().find(|kv| kv.key() == "rpc.grpc.status_code");
            if let Some(code) = code {
                let want_code = match attr(want, "rpc.grpc.status_code") {
                    Some(Value::I64(c)) => *c,
                    other => panic!("{other:?}"),
                };
                assert_eq!(code.value().map(|v| v.int_value()), Some(want_code));
            }
            let error = matches!(want.status, SpanStatus::Error { .. });
            assert_eq!(s.status().is_some_and(|st| st.code() == 2), error);
        }
    }
    assert_eq!(seen, spans.len());
    assert!(seen >= 6, "{:?}", names(&spans));
}
