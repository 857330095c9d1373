//! Code generation for protoplane from unchanged `.proto` files, run from a
//! build script; no `protoc` binary (the files are compiled in-process by
//! `protox`).
//!
//! # Use
//!
//! `build.rs` (the crate needs `protoplane-codegen` as a build-dependency and
//! `protoplane-schema` + `protoplane-wire` as dependencies):
//!
//! ```no_run
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     protoplane_codegen::configure()
//!         .compile(&["protos/socialnetwork/social_network.proto"], &["protos"])?;
//!     Ok(())
//! }
//! ```
//!
//! This writes one `<package>.rs` per proto package into `OUT_DIR` (`_.rs`
//! for files without a package) and the schema tables next to them, and
//! prints `cargo:rerun-if-changed` for every input file. Include each
//! package in a `pub` module, nesting modules as the package nests (as with
//! prost: `a.b` goes into `pub mod a { pub mod b { .. } }`, so that
//! references between packages resolve):
//!
//! ```ignore
//! pub mod socialnetwork {
//!     include!(concat!(env!("OUT_DIR"), "/socialnetwork.rs"));
//! }
//! ```
//!
//! Then, for a message `Post`:
//!
//! ```ignore
//! use socialnetwork::{Post, PostBuilder, PostView};
//!
//! let mut b = Post::builder(); // a protoplane_wire::Builder rooted at a Post
//! let mut post = PostBuilder::root(&mut b);
//! post.set_post_id(7).set_timestamp(1_700_000_000);
//! post.set_text("hello")?;
//! post.creator()?.set_user_id(42).set_username("ada")?;
//! post.add_urls()?.set_shortened_url("https://sn.example/x")?;
//! let block = b.finish(); // a linearized block: hand it to the engine to encode
//!
//! let view = PostView::from_block(block.as_bytes(), &[])?;
//! assert_eq!(view.text(), "hello");
//! assert_eq!(view.creator().map(|c| c.user_id()), Some(42));
//! for url in view.urls() {
//!     println!("{}", url.shortened_url());
//! }
//! ```
//!
//! # What is generated
//!
//! Per package: `TABLE_BYTES` (the embedded table set, `TableSet::to_bytes`
//! of every type in the `compile` call), `tables()` (loaded once, lazily,
//! from those bytes), `layout_matches(ts)`, and a support module
//! `_protoplane` (typed repeated and map views shared by the package).
//!
//! Per message `Foo` (nested types go into a module `foo`, as prost does;
//! a oneof `bar` becomes the enum `foo::BarOneof`):
//!
//! * `Foo`: a marker type with `TYPE_INDEX`, `FULL_NAME`, `SIZE` (object
//!   size), `FIELD_OPS` (the field ops, in number order), `builder()`,
//!   `decode(wire, opts)` / `decode_into(decoder, wire, opts, block)` and
//!   `encode(encoder, src, opts)` (generated code, below) and
//!   `layout_matches(ts)`;
//! * `FooView<'a>`: a `Copy` zero-copy view over a linearized block, made
//!   with `from_block(block, wire)` or `from_view(MessageView)`. Getters:
//!   scalars return the value (the field's default when absent), `has_x()`
//!   for fields with presence, `&'a str` / `&'a [u8]` for strings and bytes
//!   (`x_bytes()` for a string's raw bytes; `x_device()` gives the
//!   `protoplane_wire::Ref` of a string or bytes field a target-aware decode
//!   placed in the device region, which the plain getters read as empty, see
//!   `(protoplane.placement)` in `protos/protoplane/options.proto`),
//!   `Option<BarView<'a>>` for
//!   messages, `_protoplane::Repeated<'a, T>` for repeated fields,
//!   `_protoplane::Map<'a, K, V>` for maps, `i32` for enums (plus a Rust
//!   enum with `TryFrom<i32>`), and for each oneof `Option<foo::BarOneof<'a>>`;
//! * `FooBuilder<'b, 't>`: a typed builder over a `protoplane_wire::Builder`:
//!   `set_x`, `push_x` / `extend_x`, `x()` / `add_x()` opening a sub-message
//!   builder, `insert_x` for maps. Only setters that grow the block return
//!   `Result` (the block's size limits); scalar setters chain infallibly.
//!
//! Names follow prost: types `UpperCamelCase`, fields and modules
//! `snake_case`, enum variants without the enum's `SCREAMING_CASE` prefix.
//! Keywords become raw identifiers (`r#type`) or get a `_` (`self_`); a type
//! named like a prelude item generated code uses (`Option`, `Result`, ...)
//! keeps its view and builder names (`OptionView`) but its marker becomes
//! `Option_`; an accessor whose name another accessor of the same type
//! already took (a field `has_x` next to a field `x` with presence) gets a
//! `_`; an `x_device()` accessor steps aside (`x_device_()`) for any name a
//! field's own accessors want, so adding it renames nothing.
//!
//! Services are left to a [`ServiceGenerator`] ([`Config::service_generator`]).
//!
//! # Generated decoders and encoders
//!
//! `Foo::decode` and `Foo::encode` run code generated for `Foo` (see
//! `decoder.rs`, `encoder.rs` and `protoplane_wire::gen`): one `match` arm
//! per field in its canonical encoding, slot offsets, hasbit words and
//! masks, tags and conversions as constants, sub-messages (and map
//! entries) as direct calls. They write the very blocks and bytes the
//! table-driven engine (`protoplane_wire::decode`, `Encoder::encode`)
//! writes, and fail with the same errors: the table-driven engine handles
//! every rare case for them (unknown fields, non-canonical encodings,
//! closed-enum values the enum lacks, groups, map entries with unknown
//! fields, maps sorted for deterministic output), one field at a time. The
//! equivalence is tested on random and damaged messages of every schema
//! generated in this repository and fuzzed (`fuzz/fuzz_targets/decode_gen.rs`).
//!
//! # Why constant offsets are safe
//!
//! Generated getters and setters do not look fields up: they read and write
//! slots at offsets written into the code. That is sound because
//!
//! 1. the layout is a deterministic function of the schema: the schema
//!    crate's `layout.rs` assigns hasbits and slots from the fields alone, in
//!    a fixed order, so the same `.proto` files always give the same offsets;
//! 2. the generated code embeds the very table bytes it was generated from
//!    (`TABLE_BYTES`), so the tables it reads blocks with at run time are the
//!    ones its constants came from; `layout_matches(ts)` checks any other
//!    table set (e.g. one received from an engine) field by field;
//! 3. a view or builder checks, when it is made, that its object has the
//!    expected type index and size, and every read after that is still
//!    bounds-checked against the object (a slot outside reads as zero) and
//!    every reference is checked against the block: a block from another
//!    process cannot make a generated getter panic or read out of bounds.
//!    A reference that does not resolve reads as absent or empty.
//!
//! Compile all packages that refer to each other in one `compile` call: type
//! indices are per table set.
//!
//! Read `generator.rs` first: the walk over packages, messages, enums and
//! services; `view.rs` and `builder.rs` emit the two faces of a message.

mod builder;
mod decoder;
mod encoder;
mod generator;
mod model;
mod names;
mod rpc;
mod service;
mod support;
mod view;
mod writer;

use std::fmt;
use std::path::{Path, PathBuf};

use prost::Message as _;
use prost_types::FileDescriptorSet;
use protoplane_schema::{SchemaError, TableSet};

pub use rpc::{inc_services, rpc_services, RpcServices};
pub use service::{MessageType, Method, Service, ServiceGenerator};
pub use writer::CodeWriter;

/// Why code generation failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The `.proto` files did not compile or lower into tables.
    Schema(SchemaError),
    /// Writing an output file failed.
    Io(PathBuf, std::io::Error),
    /// No output directory: `OUT_DIR` is unset (not in a build script) and
    /// none was configured.
    NoOutDir,
    /// The schema uses something the generator cannot express.
    Unsupported(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Schema(e) => write!(f, "{e}"),
            Error::Io(p, e) => write!(f, "{}: {e}", p.display()),
            Error::NoOutDir => write!(f, "OUT_DIR is not set and no out_dir was configured"),
            Error::Unsupported(m) => write!(f, "cannot generate code: {m}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Schema(e) => Some(e),
            Error::Io(_, e) => Some(e),
            _ => None,
        }
    }
}

impl From<SchemaError> for Error {
    fn from(e: SchemaError) -> Self {
        Error::Schema(e)
    }
}

/// Starts a configuration with the defaults (output to `OUT_DIR`,
/// `cargo:rerun-if-changed` lines on).
pub fn configure() -> Config {
    Config::new()
}

/// Code generation settings; [`Config::compile`] runs it.
pub struct Config {
    out_dir: Option<PathBuf>,
    rerun_if_changed: bool,
    descriptor_set_path: Option<PathBuf>,
    services: Option<Box<dyn ServiceGenerator>>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("out_dir", &self.out_dir)
            .field("rerun_if_changed", &self.rerun_if_changed)
            .field("descriptor_set_path", &self.descriptor_set_path)
            .field("services", &self.services.is_some())
            .finish()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::new()
    }
}

/// The result of a generation run, in memory.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Generated {
    /// `(file name, Rust source)`, one per package.
    pub files: Vec<(String, String)>,
    /// File name of the table set the sources `include_bytes!`.
    pub tables_file: String,
    /// The table set bytes.
    pub tables: Vec<u8>,
    /// File name of the serialized `FileDescriptorSet` service code
    /// `include_bytes!` (the RPC runtime's schema and server reflection).
    pub descriptor_set_file: String,
    /// The `FileDescriptorSet` bytes.
    pub descriptor_set: Vec<u8>,
}

impl Config {
    /// The defaults: see [`configure`].
    pub fn new() -> Config {
        Config { out_dir: None, rerun_if_changed: true, descriptor_set_path: None, services: None }
    }

    /// Writes the generated files into `dir` instead of `OUT_DIR`.
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.out_dir = Some(dir.into());
        self
    }

    /// Whether to print `cargo:rerun-if-changed` for the input files (default on).
    pub fn emit_rerun_if_changed(mut self, on: bool) -> Self {
        self.rerun_if_changed = on;
        self
    }

    /// Also writes the compiled `FileDescriptorSet` (with imports) to `path`.
    pub fn file_descriptor_set_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.descriptor_set_path = Some(path.into());
        self
    }

    /// Emits service code with `generator` (without one, services produce no code).
    pub fn service_generator(mut self, generator: Box<dyn ServiceGenerator>) -> Self {
        self.services = Some(generator);
        self
    }

    /// Compiles `protos` (with `includes` as the import roots, like `protoc -I`)
    /// and writes the generated code.
    pub fn compile(
        &mut self,
        protos: &[impl AsRef<Path>],
        includes: &[impl AsRef<Path>],
    ) -> Result<(), Error> {
        let set = protoplane_schema::compile_protos(protos, includes)?;
        if self.rerun_if_changed {
            for path in input_files(&set, protos, includes) {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
        self.compile_fds(&set)
    }

    /// Generates code for an already compiled `FileDescriptorSet` (it must
    /// include imports) and writes it.
    ///
    /// `(protoplane.placement)` options reach the generated tables only if
    /// the set still carries them: [`protoplane_schema::compile_protos`]'s
    /// output does; for `protoc --descriptor_set_out` bytes, decode with
    /// [`protoplane_schema::decode_descriptor_set`] (plain `prost` decoding
    /// drops extension options).
    pub fn compile_fds(&mut self, set: &FileDescriptorSet) -> Result<(), Error> {
        let out = match &self.out_dir {
            Some(d) => d.clone(),
            None => std::env::var_os("OUT_DIR").map(PathBuf::from).ok_or(Error::NoOutDir)?,
        };
        let generated = self.generate(set)?;
        write_if_changed(&out.join(&generated.tables_file), &generated.tables)?;
        write_if_changed(&out.join(&generated.descriptor_set_file), &generated.descriptor_set)?;
        for (name, text) in &generated.files {
            write_if_changed(&out.join(name), text.as_bytes())?;
        }
        if let Some(path) = &self.descriptor_set_path {
            write_if_changed(path, &set.encode_to_vec())?;
        }
        Ok(())
    }

    /// Generates code in memory (what [`Config::compile_fds`] writes).
    pub fn generate(&mut self, set: &FileDescriptorSet) -> Result<Generated, Error> {
        let ts = TableSet::from_file_descriptor_set(set)?;
        let tables = ts.to_bytes();
        let tables_file = format!("protoplane-tables-{:016x}.bin", fnv1a(&tables));
        let descriptor_set = set.encode_to_vec();
        let descriptor_set_file =
            format!("protoplane-descriptors-{:016x}.bin", fnv1a(&descriptor_set));
        let services = self.services.as_deref_mut().map(|g| g as &mut dyn ServiceGenerator);
        let files = generator::Generator::new(
            set,
            &ts,
            tables_file.clone(),
            descriptor_set_file.clone(),
            services,
        )
        .generate()?;
        Ok(Generated { files, tables_file, tables, descriptor_set_file, descriptor_set })
    }
}

/// The on-disk paths of every file of `set` (inputs and imports found under
/// the include roots; bundled well-known types have none).
fn input_files(
    set: &FileDescriptorSet,
    protos: &[impl AsRef<Path>],
    includes: &[impl AsRef<Path>],
) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = includes.iter().map(|p| p.as_ref().to_owned()).collect();
    let mut out: Vec<PathBuf> = Vec::new();
    for p in protos {
        let p = p.as_ref();
        out.push(p.to_owned());
        if let Some(parent) = p.parent() {
            roots.push(if parent.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                parent.into()
            });
        }
    }
    for file in &set.file {
        if let Some(path) = roots.iter().map(|r| r.join(file.name())).find(|p| p.is_file()) {
            out.push(path);
        }
    }
    out.sort();
    out.dedup();
    out
}

fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    std::fs::write(path, bytes).map_err(|e| Error::Io(path.to_owned(), e))
}

/// FNV-1a, 64 bits: names the table-set file after its content, so two
/// `compile` calls in one build script do not overwrite each other's tables.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}
