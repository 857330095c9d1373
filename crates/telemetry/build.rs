//! Views and builders for OTLP's trace and metrics services, from the repository's own
//! declarations (`protos/opentelemetry`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    protoplane_codegen::configure().compile(
        &[
            "../../protos/opentelemetry/proto/collector/trace/v1/trace_service.proto",
            "../../protos/opentelemetry/proto/collector/metrics/v1/metrics_service.proto",
        ],
        &["../../protos"],
    )?;
    Ok(())
}
