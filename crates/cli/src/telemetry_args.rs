//! Logs and traces on the command line: `--log-format` for every process
//! that serves, `--otlp-endpoint` and `--service-name` for those that
//! make or serve calls (see `protoplane_telemetry`).

use protoplane_telemetry::{LogFormat, Options, Telemetry};

/// How a process writes its log lines (levels from `RUST_LOG`).
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct LogArgs {
    /// Log lines as `text` or `json` (one object per line), on stderr;
    /// levels and targets from RUST_LOG (default: info).
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    log_format: LogFormat,
}

impl LogArgs {
    pub(crate) fn init(&self) -> Result<Telemetry, String> {
        protoplane_telemetry::init_logs(self.log_format)?;
        Ok(Telemetry::none())
    }
}

/// Logs, and a span per call exported over OTLP.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct TelemetryArgs {
    #[command(flatten)]
    logs: LogArgs,
    /// Export to this OpenTelemetry collector, over OTLP/gRPC
    /// (http://HOST:PORT; 4317 is OTLP's port): a span per call served or
    /// made (W3C trace context taken from and passed on in metadata), and
    /// the metrics (gRFC A66's and the engine's own) every
    /// OTEL_METRIC_EXPORT_INTERVAL ms (60 s) and at exit.
    /// OTEL_EXPORTER_OTLP_ENDPOINT does the same.
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// The service.name the spans are exported under (OTEL_SERVICE_NAME
    /// wins).
    #[arg(long, value_name = "NAME")]
    service_name: Option<String>,
}

impl TelemetryArgs {
    pub(crate) fn init(&self, default_name: &str) -> Result<Telemetry, String> {
        protoplane_telemetry::init(Options {
            service_name: self.service_name.clone().unwrap_or_else(|| default_name.to_string()),
            otlp_endpoint: self.otlp_endpoint.clone(),
            log_format: self.logs.log_format,
        })
    }
}
