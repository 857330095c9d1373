//! The generator as a build script drives it: files written, the service
//! hook called with resolved paths, deterministic output. (Generated code is
//! compiled and exercised in `protoplane-codegen-tests`.)

use std::path::PathBuf;

use protoplane_codegen::{CodeWriter, Error, Service, ServiceGenerator};

const PROTO: &str = r#"
syntax = "proto3";
package demo.v1;
message Ping { string text = 1; message Detail { int32 n = 1; } Detail detail = 2; }
message Pong { repeated string echoes = 1; }
service Echo {
  rpc Say(Ping) returns (Pong);
  rpc Stream(stream Ping) returns (stream Ping.Detail);
}
"#;

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("protoplane-codegen-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("protos/demo")).expect("scratch dir");
    std::fs::write(dir.join("protos/demo/echo.proto"), PROTO).expect("proto");
    std::fs::create_dir_all(dir.join("out")).expect("out dir");
    dir
}

/// Records what the hook is given and writes one marker line.
struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl ServiceGenerator for Recorder {
    fn generate(&mut self, s: &Service, out: &mut CodeWriter) {
        let mut log = self.0.lock().expect("lock");
        log.push(format!("{} {} {}", s.name, s.full_name, s.rust_name));
        for m in &s.methods {
            log.push(format!(
                "{} {} {} {} {} {} {}",
                m.rust_name,
                m.path,
                m.input.view,
                m.output.builder,
                m.output.marker,
                m.client_streaming,
                m.server_streaming
            ));
        }
        out.line(format!("// service {}", s.name));
    }
}

#[test]
fn writes_one_file_per_package_and_calls_the_service_hook() -> Result<(), Error> {
    let dir = scratch("hook");
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    protoplane_codegen::configure()
        .out_dir(dir.join("out"))
        .emit_rerun_if_changed(false)
        .file_descriptor_set_path(dir.join("out/fds.bin"))
        .service_generator(Box::new(Recorder(log.clone())))
        .compile(&[dir.join("protos/demo/echo.proto")], &[dir.join("protos")])?;
    let text = std::fs::read_to_string(dir.join("out/demo.v1.rs")).expect("generated file");
    assert!(text.contains("pub struct PingView<'a>"));
    assert!(text.contains("pub mod ping {"));
    assert!(text.contains("pub struct DetailBuilder<'b, 't>"));
    assert!(text.contains("// service Echo"));
    let tables = std::fs::read_dir(dir.join("out"))
        .expect("out")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("protoplane-tables-"))
        .count();
    assert_eq!(tables, 1);
    assert!(dir.join("out/fds.bin").is_file());
    let log = log.lock().expect("lock").clone();
    assert_eq!(
        log,
        [
            "Echo demo.v1.Echo Echo",
            "say /demo.v1.Echo/Say PingView PongBuilder Pong false false",
            "stream /demo.v1.Echo/Stream PingView ping::DetailBuilder ping::Detail true true",
        ]
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn no_service_code_without_a_service_generator_and_output_is_deterministic() -> Result<(), Error> {
    let dir = scratch("plain");
    let set = protoplane_schema::compile_protos(
        &[dir.join("protos/demo/echo.proto")],
        &[dir.join("protos")],
    )?;
    let a = protoplane_codegen::configure().generate(&set)?;
    let b = protoplane_codegen::configure().generate(&set)?;
    assert_eq!(a.files, b.files);
    assert_eq!(a.tables, b.tables);
    let (name, text) = &a.files[0];
    assert_eq!(name, "demo.v1.rs");
    assert!(!text.contains("Echo"), "no service code unless a generator is configured");
    assert!(text.contains(&format!("include_bytes!(\"{}\")", a.tables_file)));
    // Not in a build script and no out_dir: a typed error.
    if std::env::var_os("OUT_DIR").is_none() {
        assert!(matches!(protoplane_codegen::configure().compile_fds(&set), Err(Error::NoOutDir)));
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn bad_input_is_a_typed_error() {
    let dir = scratch("bad");
    std::fs::write(dir.join("protos/demo/bad.proto"), "syntax = \"proto3\"; message {").expect("w");
    let err = protoplane_codegen::configure()
        .out_dir(dir.join("out"))
        .emit_rerun_if_changed(false)
        .compile(&[dir.join("protos/demo/bad.proto")], &[dir.join("protos")]);
    assert!(matches!(err, Err(Error::Schema(_))));
    let _ = std::fs::remove_dir_all(&dir);
}
