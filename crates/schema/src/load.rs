//! Entry points: `.proto` files (compiled in-process by `protox`, no `protoc`
//! binary needed), in-memory sources, or a serialized `FileDescriptorSet`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use prost::Message as _;
use prost_types::FileDescriptorSet;

use crate::editions;
use crate::lower::lower;
use crate::options::{annotate, scan_descriptor_set, OPTIONS_PROTO, OPTIONS_PROTO_NAME};
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
///
/// Besides `includes`, imports resolve to the built-in files:
/// `protoplane/options.proto` ([`OPTIONS_PROTO`](crate::OPTIONS_PROTO)),
/// `google/protobuf/*.proto`, and the C++ and Java editions features
/// (`google/protobuf/cpp_features.proto`, `java_features.proto`). `prost_types` drops extension options, so
/// every `(protoplane.placement)` comes back as an *uninterpreted* option
/// (`FieldOptions.uninterpreted_option` named `(protoplane.placement)`,
/// identifier `DEVICE` / `HOST`): the set keeps it through `prost_types` and
/// `encode_to_vec`, and [`TableSet::from_file_descriptor_set`] honours it.
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
    // What `protox::Compiler::new` builds, plus the built-in options file
    // (after the user's roots: a copy of it there wins, like for google's).
    let editions = Editions::default();
    let mut resolver = protox::file::ChainFileResolver::new();
    for include in includes {
        resolver.add(Include {
            inner: protox::file::IncludeFileResolver::new(include.clone()),
            dir: include,
            editions: editions.clone(),
        });
    }
    resolver.add(builtin(&editions));
    resolver.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.include_imports(true);
    for f in files {
        compiler.open_file(f.as_ref()).map_err(|e| compile_error(e, &editions))?;
    }
    finish(&compiler, &editions)
}

/// Compiles `.proto` files held in memory into a `FileDescriptorSet` (with
/// imports; `google/protobuf/*.proto` and `protoplane/options.proto` come
/// built in). Placements are kept as in [`compile_protos`].
pub fn compile_proto_sources(
    sources: &[ProtoSource<'_>],
    root: &[&str],
) -> Result<FileDescriptorSet, SchemaError> {
    let editions = Editions::default();
    let mut resolver = protox::file::ChainFileResolver::new();
    resolver.add(Sources {
        files: sources.iter().map(|s| (s.name.to_owned(), s.text.to_owned())).collect(),
        editions: editions.clone(),
    });
    resolver.add(builtin(&editions));
    resolver.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.include_imports(true);
    for name in root {
        compiler.open_file(name).map_err(|e| compile_error(e, &editions))?;
    }
    finish(&compiler, &editions)
}

/// The built-in files: `protoplane/options.proto`, and the C++ and Java
/// feature declarations editions files import (see `editions.rs`). Files
/// of the same name under the user's include roots come first.
fn builtin(editions: &Editions) -> Sources {
    let files =
        [(OPTIONS_PROTO_NAME, OPTIONS_PROTO), editions::CPP_FEATURES, editions::JAVA_FEATURES];
    Sources {
        files: files.iter().map(|(n, t)| ((*n).to_owned(), (*t).to_owned())).collect(),
        editions: editions.clone(),
    }
}

/// The compiled set, with every `(protoplane.placement)` and every
/// `features` option (which `prost_types` would drop with the other
/// options it does not declare) rewritten as an uninterpreted option, and
/// the editions files marked as such again (protox compiled them as the
/// proto2 text [`editions::to_proto2`] made of them).
fn finish(
    compiler: &protox::Compiler,
    editions: &Editions,
) -> Result<FileDescriptorSet, SchemaError> {
    let mut set = compiler.file_descriptor_set();
    let bytes = compiler.encode_file_descriptor_set();
    let found = scan_descriptor_set(&bytes)?;
    annotate(&mut set, &found);
    let rewritten = editions.lock().map(|seen| seen.files.clone()).unwrap_or_default();
    editions::annotate(&mut set, &editions::scan(&bytes, &rewritten)?);
    Ok(set)
}

/// What a compilation's resolvers learn of editions files: each one read,
/// with its edition, and the first that could not be read as one.
#[derive(Default)]
struct EditionsSeen {
    files: HashMap<String, u64>,
    error: Option<String>,
}

type Editions = Arc<Mutex<EditionsSeen>>;

/// A compile error: the editions front end's own if it had one (protox
/// then only says the file could not be opened).
fn compile_error(e: protox::Error, editions: &Editions) -> SchemaError {
    let own = editions.lock().ok().and_then(|mut s| s.error.take());
    SchemaError::Compile(own.unwrap_or_else(|| format!("{e:?}")))
}

/// A file's text as protox should parse it: an editions file rewritten into
/// proto2 (and noted in `editions`), any other as it is.
fn parse(name: &str, text: &str, editions: &Editions) -> Result<protox::file::File, protox::Error> {
    parse_rewritten(name, text, editions::to_proto2(text), editions)
}

/// [`parse`] with the rewrite already tried.
fn parse_rewritten(
    name: &str,
    text: &str,
    rewritten: Result<Option<(String, u64)>, String>,
    editions: &Editions,
) -> Result<protox::file::File, protox::Error> {
    match rewritten {
        Ok(None) => protox::file::File::from_source(name, text),
        Ok(Some((proto2, edition))) => {
            if let Ok(mut seen) = editions.lock() {
                seen.files.insert(name.to_owned(), edition);
            }
            protox::file::File::from_source(name, &proto2)
        }
        Err(e) => {
            let message = format!("{name}: {e}");
            if let Ok(mut seen) = editions.lock() {
                seen.error.get_or_insert_with(|| message.clone());
            }
            Err(protox::Error::new(std::io::Error::other(message)))
        }
    }
}

/// protox's include-directory resolver, reading editions files too.
struct Include {
    inner: protox::file::IncludeFileResolver,
    dir: PathBuf,
    editions: Editions,
}

impl protox::file::FileResolver for Include {
    fn resolve_path(&self, path: &Path) -> Option<String> {
        self.inner.resolve_path(path)
    }

    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        let path = self.dir.join(name);
        match std::fs::read_to_string(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(protox::Error::file_not_found(name))
            }
            Ok(text) => match editions::to_proto2(&text) {
                // proto2 and proto3 files: protox's own reading (and
                // errors, with the file's path).
                Ok(None) => self.inner.open_file(name),
                rewritten => parse_rewritten(name, &text, rewritten, &self.editions),
            },
            Err(_) => self.inner.open_file(name),
        }
    }
}

/// Decodes a serialized `FileDescriptorSet` (e.g. `protoc --include_imports
/// --descriptor_set_out`) into `prost_types`, keeping its
/// `(protoplane.placement)` options: `prost_types` drops extension options,
/// so each one found in the bytes is added as an uninterpreted option (the
/// form [`compile_protos`] returns). Use it instead of `prost::Message::decode`
/// to hand protoc output to [`TableSet::from_file_descriptor_set`] or to code
/// generation.
pub fn decode_descriptor_set(bytes: &[u8]) -> Result<FileDescriptorSet, SchemaError> {
    let mut set =
        FileDescriptorSet::decode(bytes).map_err(|e| SchemaError::Descriptor(e.to_string()))?;
    annotate(&mut set, &scan_descriptor_set(bytes)?);
    editions::annotate(&mut set, &editions::scan(bytes, &HashMap::new())?);
    Ok(set)
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
    /// --descriptor_set_out`). `(protoplane.placement)` options are honoured
    /// in both their interpreted (extension field) and uninterpreted form.
    pub fn from_descriptor_set(bytes: &[u8]) -> Result<TableSet, SchemaError> {
        lower(&decode_descriptor_set(bytes)?)
    }

    /// Builds tables from an already decoded `FileDescriptorSet`.
    ///
    /// `prost_types` drops extension options, so `(protoplane.placement)`
    /// is seen here only in its uninterpreted form: what [`compile_protos`],
    /// [`compile_proto_sources`] and [`decode_descriptor_set`] produce (a set
    /// decoded from `protoc` output with plain `prost` has lost it).
    pub fn from_file_descriptor_set(set: &FileDescriptorSet) -> Result<TableSet, SchemaError> {
        lower(set)
    }
}

struct Sources {
    files: Vec<(String, String)>,
    editions: Editions,
}

impl protox::file::FileResolver for Sources {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        match self.files.iter().find(|(n, _)| n == name) {
            Some((n, text)) => parse(n, text, &self.editions),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}
