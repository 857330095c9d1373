//! Views and builders for the part of Envoy's xDS API the client reads,
//! from the repository's own declarations (`protos/envoy`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    protoplane_codegen::configure().compile(
        &[
            "../../protos/envoy/service/discovery/v3/ads.proto",
            "../../protos/envoy/config/listener/v3/listener.proto",
            "../../protos/envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto",
            "../../protos/envoy/extensions/filters/http/router/v3/router.proto",
            "../../protos/envoy/config/cluster/v3/cluster.proto",
        ],
        &["../../protos"],
    )?;
    Ok(())
}
