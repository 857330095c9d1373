//! Generates the prost messages and the tonic server stub of
//! `socialnetwork.SocialNetwork` from the repository's own schema, so this
//! peer and protoplane serve exactly the same `.proto`.
//!
//! No `protoc` is needed: `protox` compiles the schema to a
//! `FileDescriptorSet`, which `tonic_prost_build::Builder::compile_fds` turns
//! into Rust (prost-build for the messages, tonic-build for the service).

use std::error::Error;
use std::path::PathBuf;

/// The schema and its include directory, relative to this crate's directory.
const PROTO: &str = "../../protos/socialnetwork/social_network.proto";
const INCLUDE: &str = "../../protos/socialnetwork";

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto = manifest_dir.join(PROTO);
    let include = manifest_dir.join(INCLUDE);

    println!("cargo:rerun-if-changed=build.rs");
    // compile_fds has no file names to watch, so watch the schema ourselves.
    println!("cargo:rerun-if-changed={}", proto.display());

    let fds = protox::compile([&proto], [&include])?;
    tonic_prost_build::configure()
        // The benchmark's load generator is ghz (Go); this crate only serves.
        .build_client(false)
        .compile_fds(fds)?;
    Ok(())
}
