//! OTLP/gRPC export of spans over protoplane's own channel.
//!
//! OpenTelemetry's SDK batches finished spans on a thread of its own and
//! hands each batch to [`SpanExporter::export`]. This exporter encodes the
//! batch as an `ExportTraceServiceRequest` with protoplane's generated
//! builders (`protos/opentelemetry`, declared by us: names and field
//! numbers are OTLP's interface) and sends it as one unary call to
//! `/opentelemetry.proto.collector.trace.v1.TraceService/Export` on a
//! [`Channel`], the same client every protoplane application uses: it
//! reconnects with backoff when the collector restarts, and a batch that
//! cannot be sent within [`EXPORT_TIMEOUT`] is dropped with a warning
//! (telemetry never holds the application up).
//!
//! The channel lives on a one-thread runtime of the exporter's own, so
//! export works whatever executor the SDK polls it on (its batch thread
//! blocks on the future) and costs the application's runtime nothing.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanKind, Status as SpanStatus};
use opentelemetry::{Array, KeyValue, Value};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::Resource;
use protoplane_grpc::Code;
use protoplane_rpc::{CallOptions, Channel, ChannelOptions};
use protoplane_wire::{BuildError, EncodeOptions, Encoder, Source};

use crate::pb::opentelemetry::proto::collector::trace::v1 as collector;
use crate::pb::opentelemetry::proto::common::v1 as common;
use crate::pb::opentelemetry::proto::trace::v1 as trace;

/// The method OTLP/gRPC exports spans to.
pub const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// How long one batch may take to reach the collector before it is
/// dropped (OTLP's default exporter timeout is 10 s).
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Spans to an OTLP/gRPC endpoint (`http://host:4317`, `host:port`, or any
/// target [`Channel`] takes). TLS endpoints (`https://`) are refused.
#[derive(Debug)]
pub struct OtlpSpanExporter {
    link: Link,
    resource: Mutex<Arc<Resource>>,
}

/// A channel to an OTLP endpoint on a one-thread runtime of its own.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    pub(crate) endpoint: String,
    channel: Channel,
    runtime: tokio::runtime::Handle,
    // Dropping the last sender ends the runtime's thread.
    _stop: Arc<std::sync::mpsc::SyncSender<()>>,
}

impl Link {
    pub(crate) fn new(endpoint: &str) -> Result<Link, String> {
        let target = channel_target(endpoint)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("OTLP exporter: cannot start its runtime: {e}"))?;
        let runtime = rt.handle().clone();
        let channel = {
            let _in = rt.enter();
            Channel::lazy(&target, ChannelOptions::default())
        };
        let (stop, stopped) = std::sync::mpsc::sync_channel::<()>(0);
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                // Runs the channel's connection until the link is dropped
                // (the sender's end closes the channel: recv fails).
                rt.block_on(async move {
                    let _ = tokio::task::spawn_blocking(move || stopped.recv()).await;
                });
            })
            .map_err(|e| format!("OTLP exporter: cannot start its thread: {e}"))?;
        Ok(Link { endpoint: endpoint.to_string(), channel, runtime, _stop: Arc::new(stop) })
    }

    /// One unary export call of `wire` to `path`, on the link's runtime.
    pub(crate) fn send(
        &self,
        path: &'static str,
        wire: Vec<u8>,
    ) -> tokio::task::JoinHandle<Result<(), String>> {
        let channel = self.channel.clone();
        self.runtime.spawn(async move {
            let opts = CallOptions::default().with_timeout(EXPORT_TIMEOUT).wait_for_ready();
            let mut call = channel.start(path, opts).await.map_err(|s| s.to_string())?;
            call.send_last(&wire).await.map_err(|s| s.to_string())?;
            while call.recv().await.map_err(|s| s.to_string())?.is_some() {}
            let status = call.finish_status().await;
            if status.code != Code::Ok {
                return Err(status.to_string());
            }
            Ok(())
        })
    }

    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }
}

/// The target a [`Channel`] dials for an OTLP endpoint as OpenTelemetry's
/// settings spell it (`OTEL_EXPORTER_OTLP_ENDPOINT`): `http://host:port`
/// or a bare `host:port`, a trailing `/` ignored.
pub fn channel_target(endpoint: &str) -> Result<String, String> {
    let e = endpoint.trim().trim_end_matches('/');
    if e.starts_with("https://") {
        return Err(format!(
            "OTLP endpoint {endpoint}: TLS to the collector is not supported yet; \
             use an http:// endpoint (a collector on the same host or a local agent)"
        ));
    }
    let bare = e.strip_prefix("http://").unwrap_or(e);
    if bare.is_empty() || bare.contains('/') && !bare.contains(":///") && !bare.starts_with("unix:")
    {
        return Err(format!(
            "OTLP endpoint {endpoint}: expected http://HOST:PORT (OTLP over gRPC, port 4317 by \
             default), with no path"
        ));
    }
    Ok(bare.to_string())
}

impl OtlpSpanExporter {
    /// An exporter to `endpoint`. The channel connects at the first batch,
    /// so a collector that starts later is found then.
    pub fn new(endpoint: &str) -> Result<OtlpSpanExporter, String> {
        OtlpSpanExporter::over(Link::new(endpoint)?)
    }

    pub(crate) fn over(link: Link) -> Result<OtlpSpanExporter, String> {
        Ok(OtlpSpanExporter {
            link,
            resource: Mutex::new(Arc::new(Resource::builder_empty().build())),
        })
    }

    fn resource(&self) -> Arc<Resource> {
        self.resource.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl opentelemetry_sdk::trace::SpanExporter for OtlpSpanExporter {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let n = batch.len();
        let endpoint = self.link.endpoint.clone();
        let sent = match encode_request(&self.resource(), &batch) {
            Ok(wire) => Ok(self.link.send(EXPORT_PATH, wire)),
            Err(e) => Err(format!("cannot encode {n} spans: {e}")),
        };
        async move {
            let sent = match sent {
                Ok(handle) => handle.await,
                Err(why) => Ok(Err(why)),
            };
            match sent {
                Ok(Ok(())) => Ok(()),
                Ok(Err(why)) => {
                    let why = format!("OTLP export of {n} spans to {endpoint} failed: {why}");
                    tracing::warn!(target: "protoplane_telemetry::otlp", "{why}");
                    Err(OTelSdkError::InternalFailure(why))
                }
                Err(e) => Err(OTelSdkError::InternalFailure(format!("OTLP export: {e}"))),
            }
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        *self.resource.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(resource.clone());
    }
}

/// The OTLP request for `spans`: one `ResourceSpans` for the process, one
/// `ScopeSpans` per instrumentation scope, in the order first seen.
pub fn encode_request(resource: &Resource, spans: &[SpanData]) -> Result<Vec<u8>, String> {
    let mut builder = collector::ExportTraceServiceRequest::builder();
    build(&mut builder, resource, spans).map_err(|e| e.to_string())?;
    let block = builder.finish();
    let mut enc = Encoder::new();
    let wire = collector::ExportTraceServiceRequest::encode(
        &mut enc,
        Source::owned(block.as_bytes()),
        &EncodeOptions::default(),
    )
    .map_err(|e| e.to_string())?;
    Ok(wire.to_vec())
}

fn build(
    builder: &mut protoplane_wire::Builder<'static>,
    resource: &Resource,
    spans: &[SpanData],
) -> Result<(), BuildError> {
    let mut req = collector::ExportTraceServiceRequestBuilder::root(builder);
    {
        let mut rs = req.add_resource_spans()?;
        {
            let mut r = rs.resource()?;
            for (k, v) in resource.iter() {
                let mut kv = r.add_attributes()?;
                kv.set_key(k.as_str())?;
                any_value(&mut kv.value()?, v)?;
            }
        }
        let mut scopes: Vec<&opentelemetry::InstrumentationScope> = Vec::new();
        for s in spans {
            if !scopes.contains(&&s.instrumentation_scope) {
                scopes.push(&s.instrumentation_scope);
            }
        }
        for scope in scopes {
            let mut ss = rs.add_scope_spans()?;
            {
                let mut sc = ss.scope()?;
                sc.set_name(scope.name())?;
                if let Some(v) = scope.version() {
                    sc.set_version(v)?;
                }
            }
            for s in spans.iter().filter(|s| &s.instrumentation_scope == scope) {
                span(&mut ss.add_spans()?, s)?;
            }
        }
    }
    Ok(())
}

fn span(b: &mut trace::SpanBuilder<'_, '_>, s: &SpanData) -> Result<(), BuildError> {
    let cx = &s.span_context;
    b.set_trace_id(&cx.trace_id().to_bytes())?;
    b.set_span_id(&cx.span_id().to_bytes())?;
    let state = cx.trace_state().header();
    if !state.is_empty() {
        b.set_trace_state(&state)?;
    }
    if s.parent_span_id != opentelemetry::trace::SpanId::INVALID {
        b.set_parent_span_id(&s.parent_span_id.to_bytes())?;
    }
    // SpanFlags: the W3C flags, and whether the parent is remote.
    let mut flags = u32::from(cx.trace_flags().to_u8()) | 0x100;
    if s.parent_span_is_remote {
        flags |= 0x200;
    }
    b.set_flags(flags);
    b.set_name(&s.name)?;
    b.set_kind(match s.span_kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    });
    b.set_start_time_unix_nano(unix_nanos(s.start_time));
    b.set_end_time_unix_nano(unix_nanos(s.end_time));
    for kv in &s.attributes {
        attribute(&mut b.add_attributes()?, kv)?;
    }
    if s.dropped_attributes_count > 0 {
        b.set_dropped_attributes_count(s.dropped_attributes_count);
    }
    for e in s.events.iter() {
        let mut eb = b.add_events()?;
        eb.set_time_unix_nano(unix_nanos(e.timestamp));
        eb.set_name(&e.name)?;
        for kv in &e.attributes {
            attribute(&mut eb.add_attributes()?, kv)?;
        }
    }
    if s.events.dropped_count > 0 {
        b.set_dropped_events_count(s.events.dropped_count);
    }
    for l in s.links.iter() {
        let mut lb = b.add_links()?;
        lb.set_trace_id(&l.span_context.trace_id().to_bytes())?;
        lb.set_span_id(&l.span_context.span_id().to_bytes())?;
        for kv in &l.attributes {
            attribute(&mut lb.add_attributes()?, kv)?;
        }
    }
    match &s.status {
        SpanStatus::Unset => {}
        SpanStatus::Ok => {
            b.status()?.set_code(1);
        }
        SpanStatus::Error { description } => {
            let mut st = b.status()?;
            st.set_code(2);
            st.set_message(description)?;
        }
    }
    Ok(())
}

fn attribute(b: &mut common::KeyValueBuilder<'_, '_>, kv: &KeyValue) -> Result<(), BuildError> {
    b.set_key(kv.key.as_str())?;
    any_value(&mut b.value()?, &kv.value)
}

fn any_value(b: &mut common::AnyValueBuilder<'_, '_>, v: &Value) -> Result<(), BuildError> {
    match v {
        Value::Bool(x) => {
            b.set_bool_value(*x);
        }
        Value::I64(x) => {
            b.set_int_value(*x);
        }
        Value::F64(x) => {
            b.set_double_value(*x);
        }
        Value::String(s) => {
            b.set_string_value(s.as_str())?;
        }
        Value::Array(a) => {
            let mut arr = b.array_value()?;
            match a {
                Array::Bool(xs) => {
                    for x in xs {
                        arr.add_values()?.set_bool_value(*x);
                    }
                }
                Array::I64(xs) => {
                    for x in xs {
                        arr.add_values()?.set_int_value(*x);
                    }
                }
                Array::F64(xs) => {
                    for x in xs {
                        arr.add_values()?.set_double_value(*x);
                    }
                }
                Array::String(xs) => {
                    for x in xs {
                        arr.add_values()?.set_string_value(x.as_str())?;
                    }
                }
                _ => {}
            }
        }
        other => {
            // Kinds added to the API after this exporter: their text form.
            let text: Cow<'_, str> = Cow::Owned(other.to_string());
            b.set_string_value(&text)?;
        }
    }
    Ok(())
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}
