//! Generates views, builders, the server trait and the client stub from
//! `proto/kv.proto` (no `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    protoplane_codegen::configure()
        .service_generator(protoplane_codegen::rpc_services())
        .compile(&["proto/kv.proto"], &["proto"])?;
    Ok(())
}
