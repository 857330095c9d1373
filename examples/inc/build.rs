//! Builds the word-count corpus from the repository's own documentation:
//! every Markdown file and every doc comment (`//!`, `///`) of the crates,
//! in path order, so the example runs from the repository alone; and
//! generates the four services' views, builders, server traits and client
//! stubs (the in-network ones included) from their `.proto` files.

use std::fs;
use std::path::{Path, PathBuf};

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if !matches!(
                name.as_str(),
                "target" | ".git" | ".venv" | "corpus" | "artifacts" | "node_modules"
            ) {
                walk(&p, out);
            }
        } else if name.ends_with(".md") || name.ends_with(".rs") {
            out.push(p);
        }
    }
}

fn main() {
    if let Err(e) = protoplane_codegen::configure()
        .service_generator(protoplane_codegen::inc_services())
        .compile(
            &[
                "proto/sync_agg.proto",
                "proto/async_agg.proto",
                "proto/key_value.proto",
                "proto/agreement.proto",
            ],
            &["proto", "../../protos"],
        )
    {
        panic!("protoplane codegen: {e}");
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest.join("../..");
    let mut files = Vec::new();
    for d in ["README.md", "CONTRIBUTING.md", "CHANGELOG.md", "crates", "examples"] {
        let p = root.join(d);
        if p.is_dir() {
            walk(&p, &mut files);
        } else if p.is_file() {
            files.push(p);
        }
    }
    files.sort();
    let mut corpus = String::new();
    for f in &files {
        let Ok(text) = fs::read_to_string(f) else { continue };
        if f.extension().is_some_and(|e| e == "md") {
            corpus.push_str(&text);
        } else {
            for line in text.lines() {
                let t = line.trim_start();
                if let Some(doc) = t.strip_prefix("//!").or_else(|| t.strip_prefix("///")) {
                    corpus.push_str(doc);
                    corpus.push('\n');
                }
            }
        }
        corpus.push('\n');
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("corpus.txt");
    let _ = fs::write(out, corpus);
    println!("cargo:rerun-if-changed=build.rs");
}
