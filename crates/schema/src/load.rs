//! Entry points: `.proto` files (compiled in-process by `protox`, no `protoc`
//! binary needed), in-memory sources, or a serialized `FileDescriptorSet`.

use std::path::{Path, PathBuf};

use prost::Message as _;
use prost_types::FileDescriptorSet;

use crate::lower::lower;
use crate::{SchemaError, TableSet};

/// An in-memory `.proto` file: its import path and its text.
#[derive(Clone, Copy, Debug)]
pub struct ProtoSource<'a> {
    /// The name other files import it by (e.g. `socialnetwork/social_network.proto`).
    pub name: &'a str,
    /// The file's text.
    pub text: &'a str,
}

/// Compiles `.proto` files on disk into a `FileDescriptorSet` (with imports).
pub fn compile_protos(
    files: &[impl AsRef<Path>],
    includes: &[impl AsRef<Path>],
) -> Result<FileDescriptorSet, SchemaError> {
    let mut includes: Vec<PathBuf> = includes.iter().map(|p| p.as_ref().to_owned()).collect();
    // Like protoc: a file given without a matching -I is found relative to its directory.
    for f in files {
        let parent = f.as_ref().parent().map(Path::to_owned).unwrap_or_default();
        let covered = includes.iter().any(|i| f.as_ref().starts_with(i));
        if !covered {
            includes.push(if parent.as_os_str().is_empty() { PathBuf::from(".") } else { parent });
        }
    }
    let mut compiler =
        protox::Compiler::new(&includes).map_err(|e| SchemaError::Compile(e.to_string()))?;
    compiler.include_imports(true);
    for f in files {
        compiler.open_file(f.as_ref()).map_err(|e| SchemaError::Compile(format!("{e:?}")))?;
    }
    Ok(compiler.file_descriptor_set())
}

/// Compiles `.proto` files held in memory into a `FileDescriptorSet` (with
/// imports; `google/protobuf/*.proto` come built in).
pub fn compile_proto_sources(
    sources: &[ProtoSource<'_>],
    root: &[&str],
) -> Result<FileDescriptorSet, SchemaError> {
    let mut resolver = protox::file::ChainFileResolver::new();
    resolver.add(Sources(sources.iter().map(|s| (s.name.to_owned(), s.text.to_owned())).collect()));
    resolver.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.include_imports(true);
    for name in root {
        compiler.open_file(name).map_err(|e| SchemaError::Compile(format!("{e:?}")))?;
    }
    Ok(compiler.file_descriptor_set())
}

impl TableSet {
    /// Loads `.proto` files from disk; `includes` are the import roots (`-I`).
    pub fn from_proto_files(
        files: &[impl AsRef<Path>],
        includes: &[impl AsRef<Path>],
    ) -> Result<TableSet, SchemaError> {
        lower(&compile_protos(files, includes)?)
    }

    /// Loads `.proto` files held in memory (e.g. embedded with `include_str!`).
    /// `root` names the files to compile; the others serve as imports.
    pub fn from_proto_sources(
        sources: &[ProtoSource<'_>],
        root: &[&str],
    ) -> Result<TableSet, SchemaError> {
        lower(&compile_proto_sources(sources, root)?)
    }

    /// Loads a serialized `FileDescriptorSet` (`protoc --include_imports
    /// --descriptor_set_out`).
    pub fn from_descriptor_set(bytes: &[u8]) -> Result<TableSet, SchemaError> {
        let set =
            FileDescriptorSet::decode(bytes).map_err(|e| SchemaError::Descriptor(e.to_string()))?;
        lower(&set)
    }

    /// Builds tables from an already decoded `FileDescriptorSet`.
    pub fn from_file_descriptor_set(set: &FileDescriptorSet) -> Result<TableSet, SchemaError> {
        lower(set)
    }
}

struct Sources(Vec<(String, String)>);

impl protox::file::FileResolver for Sources {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        match self.0.iter().find(|(n, _)| n == name) {
            Some((n, text)) => protox::file::File::from_source(n, text),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}
