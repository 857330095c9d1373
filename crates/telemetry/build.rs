//! Views and builders for OTLP's trace service, from the repository's own
//! declarations (`protos/opentelemetry`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    protoplane_codegen::configure().compile(
        &["../../protos/opentelemetry/proto/collector/trace/v1/trace_service.proto"],
        &["../../protos"],
    )?;
    Ok(())
}
