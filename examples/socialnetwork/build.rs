//! Generates views, builders, the server trait and the client stub of the
//! social-network service from the unchanged `.proto` (no `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    protoplane_codegen::configure()
        .service_generator(protoplane_codegen::rpc_services())
        .compile(&["../../protos/socialnetwork/social_network.proto"], &["../../protos"])?;
    Ok(())
}
