//! protoplane's logs and traces.
//!
//! - **Logs.** The engine, the application runtime and the RPC runtime
//!   log through [`tracing`] (levels, targets, structured fields). [`init`]
//!   installs the subscriber a protoplane process writes them with: to
//!   stderr, as text or one JSON object per line, filtered by `RUST_LOG`
//!   (`info` when unset; e.g. `RUST_LOG=protoplane_engine=debug,warn`).
//! - **Traces.** [`server::traced`] gives every call a service serves a
//!   span whose parent is the W3C `traceparent` in its metadata;
//!   [`client::ClientTracing`] gives every call a channel makes a span and
//!   sends its `traceparent` on. Spans are `tracing` spans, bridged to
//!   OpenTelemetry by `tracing-opentelemetry`, so an application's own
//!   spans nest inside a call's.
//! - **Export.** With an OTLP endpoint ([`Options::otlp_endpoint`], or
//!   `OTEL_EXPORTER_OTLP_ENDPOINT`), finished spans go in batches to an
//!   OpenTelemetry Collector (or any OTLP/gRPC backend: Jaeger, Tempo)
//!   through [`otlp::OtlpSpanExporter`], which speaks OTLP/gRPC over
//!   protoplane's own channel.
//!
//! Nothing here runs per call unless a service is wrapped or a channel
//! intercepted: a process that exports no traces creates no spans.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use protoplane_rpc::{intercept::ClientChain, Channel};
//! # fn setup(svc: Arc<dyn protoplane_grpc::Service>, ch: Channel) -> Result<(), String> {
//! let _telemetry = protoplane_telemetry::init(protoplane_telemetry::Options {
//!     service_name: "kv".into(),
//!     otlp_endpoint: Some("http://127.0.0.1:4317".into()),
//!     ..Default::default()
//! })?;
//! let svc = protoplane_telemetry::traced(svc);  // a span per call served, the handler inside it
//! let ch = ch.intercept(ClientChain::new().with(protoplane_telemetry::ClientTracing));
//! # let _ = (svc, ch);
//! # Ok(())
//! # }
//! ```

pub mod client;
pub mod metrics;
pub mod otlp;
pub mod propagate;
pub mod server;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use client::ClientTracing;
pub use server::traced;

/// The generated views and builders of OTLP's trace service
/// (`protos/opentelemetry`, declared by us: OTLP's names and numbers).
#[allow(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    clippy::all,
    clippy::unwrap_used,
    rust_2018_idioms
)]
pub mod pb {
    pub mod opentelemetry {
        pub mod proto {
            pub mod common {
                pub mod v1 {
                    include!(concat!(env!("OUT_DIR"), "/opentelemetry.proto.common.v1.rs"));
                }
            }
            pub mod resource {
                pub mod v1 {
                    include!(concat!(env!("OUT_DIR"), "/opentelemetry.proto.resource.v1.rs"));
                }
            }
            pub mod trace {
                pub mod v1 {
                    include!(concat!(env!("OUT_DIR"), "/opentelemetry.proto.trace.v1.rs"));
                }
            }
            pub mod metrics {
                pub mod v1 {
                    include!(concat!(env!("OUT_DIR"), "/opentelemetry.proto.metrics.v1.rs"));
                }
            }
            pub mod collector {
                pub mod trace {
                    pub mod v1 {
                        include!(concat!(
                            env!("OUT_DIR"),
                            "/opentelemetry.proto.collector.trace.v1.rs"
                        ));
                    }
                }
                pub mod metrics {
                    pub mod v1 {
                        include!(concat!(
                            env!("OUT_DIR"),
                            "/opentelemetry.proto.collector.metrics.v1.rs"
                        ));
                    }
                }
            }
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// `2026-01-01T00:00:00.000000Z  INFO target: message key=value`.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`,
    /// `fields`), for log shippers.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<LogFormat, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("log format {s:?}: expected text or json")),
        }
    }
}

/// What [`init`] sets up.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The `service.name` spans are exported under (`OTEL_SERVICE_NAME`
    /// and `OTEL_RESOURCE_ATTRIBUTES` are read too, and win).
    pub service_name: String,
    /// Where to export spans (OTLP/gRPC, `http://host:4317`). `None`:
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) if set,
    /// otherwise no spans at all.
    pub otlp_endpoint: Option<String>,
    /// How log lines are written.
    pub log_format: LogFormat,
}

/// The installed logs and traces; dropping it (or [`Telemetry::shutdown`])
/// flushes the spans not yet exported.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    endpoint: Option<String>,
    service_name: String,
}

impl Telemetry {
    /// Logs only: no spans are exported.
    pub fn none() -> Telemetry {
        Telemetry { provider: None, endpoint: None, service_name: String::new() }
    }

    /// The `service.name` this process reports under.
    pub fn service_name(&self) -> &str {
        &self.service_name
    }

    /// Pushes `metrics` to the OTLP endpoint (if there is one) every
    /// `OTEL_METRIC_EXPORT_INTERVAL` (60 s), and once more when the
    /// returned exporter is dropped.
    pub fn push_metrics(
        &self,
        metrics: &std::sync::Arc<protoplane_rpc::metrics::Metrics>,
    ) -> Result<Option<metrics::MetricsExporter>, String> {
        let Some(endpoint) = &self.endpoint else { return Ok(None) };
        let every = metrics::MetricsExporter::interval_from_env();
        metrics::MetricsExporter::start(endpoint, metrics.clone(), &self.service_name, every)
            .map(Some)
    }

    /// Whether spans are exported: services should then be wrapped with
    /// [`traced`] and channels intercepted with [`ClientTracing`].
    pub fn tracing(&self) -> bool {
        self.provider.is_some()
    }

    /// The OTLP endpoint spans go to.
    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// Exports what is left and stops the exporter.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(p) = self.provider.take() {
            if let Err(e) = p.shutdown_with_timeout(std::time::Duration::from_secs(3)) {
                tracing::warn!("trace export at shutdown: {e}");
            }
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The endpoint `opts` names, or the one OpenTelemetry's environment does.
fn endpoint(opts: &Options) -> Option<String> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    opts.otlp_endpoint
        .clone()
        .or_else(|| env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

/// Installs this process's log subscriber only (no spans, whatever the
/// environment says): for processes that make no calls of their own.
pub fn init_logs(format: LogFormat) -> Result<(), String> {
    tracing_subscriber::registry()
        .with(log_layer(format)?)
        .try_init()
        .map_err(|e| format!("logging: {e}"))
}

type LogLayer = tracing_subscriber::filter::Filtered<
    Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>,
    EnvFilter,
    tracing_subscriber::Registry,
>;

/// Log lines to stderr in `format`, filtered by `RUST_LOG`.
fn log_layer(format: LogFormat) -> Result<LogLayer, String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => {
            EnvFilter::try_new(&v).map_err(|e| format!("RUST_LOG={v:?}: {e}"))?
        }
        // Call spans are for export, not for log lines, unless asked for.
        _ => EnvFilter::new(format!("info,{}=warn", server::TARGET)),
    };
    let logs = match format {
        LogFormat::Text => {
            tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(false).boxed()
        }
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_current_span(false)
            .boxed(),
    }
    .with_filter(filter);
    Ok(logs)
}

/// Installs this process's log subscriber and, with an OTLP endpoint, its
/// span export. Call once, early in `main`; a second call (or a subscriber
/// someone else installed) is an error.
pub fn init(opts: Options) -> Result<Telemetry, String> {
    let registry = tracing_subscriber::registry().with(log_layer(opts.log_format)?);
    let Some(endpoint) = endpoint(&opts) else {
        registry.try_init().map_err(|e| format!("logging: {e}"))?;
        return Ok(Telemetry::none());
    };
    let exporter = otlp::OtlpSpanExporter::new(&endpoint)?;
    let batches = BatchConfigBuilder::default()
        .with_scheduled_delay(std::time::Duration::from_millis(500))
        .build();
    let mut resource = Resource::builder();
    if !opts.service_name.is_empty() && std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(opts.service_name.clone());
    }
    let provider = SdkTracerProvider::builder()
        .with_span_processor(
            BatchSpanProcessor::builder(exporter).with_batch_config(batches).build(),
        )
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("protoplane");
    // Spans carry the call's attributes only: no source location, thread
    // or target, and no busy/idle clock reads at every poll.
    let spans = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_filter(tracing_subscriber::filter::LevelFilter::INFO);
    registry.with(spans).try_init().map_err(|e| format!("logging: {e}"))?;
    opentelemetry::global::set_tracer_provider(provider.clone());
    let service_name = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or(opts.service_name);
    Ok(Telemetry { provider: Some(provider), endpoint: Some(endpoint), service_name })
}
