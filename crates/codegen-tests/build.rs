//! Generates the typed views and builders the tests exercise, exactly as a
//! user's build script would: five `compile` calls (five independent table
//! sets), no `protoc`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // The repository's own schema, unchanged.
    protoplane_codegen::configure()
        .compile(&["../../protos/socialnetwork/social_network.proto"], &["../../protos"])?;
    // The test schema (proto2 importing proto3); its descriptor set is kept
    // for the tests' cross-checks.
    protoplane_codegen::configure()
        .file_descriptor_set_path(out.join("codegen_test.fds"))
        .compile(&["protos/codegen/p2.proto"], &["protos"])?;
    // A service of every call kind (the interop test service), with the
    // RPC runtime's server traits and client stubs.
    protoplane_codegen::configure()
        .service_generator(protoplane_codegen::rpc_services())
        .compile(&["../../protos/interop/grpc_testing.proto"], &["../../protos"])?;
    // Device placement from the `(protoplane.placement)` option; the include
    // root does not hold `protoplane/options.proto` (it is built in).
    protoplane_codegen::configure().compile(&["protos/placed/placed.proto"], &["protos"])?;
    // Edition 2023: features in place of proto2's and proto3's syntax.
    protoplane_codegen::configure().compile(&["protos/editions/ed.proto"], &["protos"])?;
    Ok(())
}
