//! Generates the decoders the `decode_gen` target compares with the
//! table-driven decoder (`src/generated.rs` includes them), as a user's
//! build script would: one `compile` call per table set, no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The repository's own schema: package `socialnetwork`.
    protoplane_codegen::configure()
        .compile(&["../protos/socialnetwork/social_network.proto"], &["../protos"])?;
    // The hostile-input test schema: packages `hostile` (proto2) and
    // `hostile3` (proto3).
    protoplane_codegen::configure().compile(
        &[
            "../crates/wire/tests/protos/hostile2.proto",
            "../crates/wire/tests/protos/hostile3.proto",
        ],
        &["../crates/wire/tests/protos"],
    )?;
    Ok(())
}
