//! The generator: walks a `FileDescriptorSet` package by package and emits,
//! for each package, one Rust file (see the crate docs for its contents).
//!
//! The walk is the single place where the pieces are put together:
//! [`Generator::package`] -> [`Generator::message`] (marker, view, builder,
//! nested module) / [`Generator::enumeration`] / [`Generator::service`].
//! Views and builders are emitted by `view.rs` and `builder.rs`; services by
//! a [`ServiceGenerator`](crate::ServiceGenerator) the build script plugs in.

use std::collections::{BTreeSet, HashSet};

use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorProto, FileDescriptorSet};
use protoplane_schema::{FieldOp, Kind, TableSet};

use crate::model::{FieldInfo, MessageInfo, TypeLoc, Types};
use crate::names::{camel, ident, package_path, relative, screaming, snake, type_ident};
use crate::service::{MessageType, Method, Service, ServiceGenerator};
use crate::support::SUPPORT;
use crate::writer::CodeWriter;
use crate::Error;

/// Where code is being emitted: the module, and the root module of the
/// package (where `tables()` and the support module live).
#[derive(Clone, Debug)]
pub(crate) struct Scope {
    pub(crate) module: Vec<String>,
    pub(crate) root: Vec<String>,
    pub(crate) package: String,
}

impl Scope {
    /// Path of the package's support module.
    pub(crate) fn rt(&self) -> String {
        relative(&self.module, &self.root, "_protoplane")
    }

    /// Path of the package's `tables()`.
    pub(crate) fn tables(&self) -> String {
        relative(&self.module, &self.root, "tables")
    }

    /// Path of a generated type (`suffix`: "", "View", "Builder").
    pub(crate) fn path(&self, loc: &TypeLoc, suffix: &str) -> String {
        let name =
            if suffix.is_empty() { loc.ident.clone() } else { format!("{}{suffix}", loc.base) };
        relative(&self.module, &loc.module, &name)
    }

    fn nested(&self, module: Vec<String>) -> Scope {
        Scope { module, root: self.root.clone(), package: self.package.clone() }
    }
}

/// Method names of one `impl` block: a name that would collide with another
/// (or with a reserved one) gets a trailing `_`.
#[derive(Debug, Default)]
pub(crate) struct Names {
    taken: HashSet<String>,
    claimed: Vec<String>,
}

/// Names every generated impl avoids: methods of std traits the generated
/// types implement or that a caller expects to keep their meaning.
const TRAIT_METHODS: &[&str] = &[
    "as_mut",
    "as_ref",
    "borrow",
    "borrow_mut",
    "clone",
    "cmp",
    "default",
    "deref",
    "deref_mut",
    "drop",
    "eq",
    "fmt",
    "from",
    "hash",
    "into",
    "ne",
    "partial_cmp",
    "to_owned",
    "to_string",
    "try_from",
    "try_into",
    "type_id",
];

impl Names {
    pub(crate) fn new(reserved: &[&str]) -> Names {
        let taken = reserved.iter().chain(TRAIT_METHODS).map(|s| s.to_string()).collect();
        Names { taken, claimed: Vec::new() }
    }

    pub(crate) fn claim(&mut self, want: String) -> String {
        let mut name = want;
        while !self.taken.insert(name.clone()) {
            name.push('_');
        }
        self.claimed.push(name.clone());
        name
    }

    /// Like [`Names::claim`], also stepping over the names in `avoid`
    /// (ones claimed later by accessors that must keep their names).
    pub(crate) fn claim_avoiding(&mut self, want: String, avoid: &HashSet<String>) -> String {
        let mut name = want;
        while avoid.contains(&name) || self.taken.contains(&name) {
            name.push('_');
        }
        self.claim(name)
    }

    /// Whether a claimed name makes clippy's `wrong_self_convention` fire
    /// (`as_`, `to_`, `into_`, `from_`, `is_` prefixes on a `&self` getter).
    pub(crate) fn has_conventional_prefix(&self) -> bool {
        let prefixes = ["as_", "to_", "into_", "from_", "is_"];
        self.claimed.iter().any(|n| prefixes.iter().any(|p| n.starts_with(p)))
    }
}

/// Walks a descriptor set and produces the generated files.
pub(crate) struct Generator<'g> {
    set: &'g FileDescriptorSet,
    ts: &'g TableSet,
    types: Types,
    /// File name of the embedded table set (relative to the output dir).
    tables_file: String,
    descriptor_set_file: String,
    services: Option<&'g mut dyn ServiceGenerator>,
}

impl std::fmt::Debug for Generator<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator").field("tables_file", &self.tables_file).finish()
    }
}

impl<'g> Generator<'g> {
    pub(crate) fn new(
        set: &'g FileDescriptorSet,
        ts: &'g TableSet,
        tables_file: String,
        descriptor_set_file: String,
        services: Option<&'g mut dyn ServiceGenerator>,
    ) -> Generator<'g> {
        Generator { set, ts, types: Types::new(set), tables_file, descriptor_set_file, services }
    }

    /// Every package of the set: `(package, file name, source)`.
    pub(crate) fn generate(&mut self) -> Result<Vec<(String, String)>, Error> {
        let mut packages: Vec<(String, Vec<&'g FileDescriptorProto>)> = Vec::new();
        let mut seen = HashSet::new();
        let set = self.set;
        for file in &set.file {
            if !seen.insert(file.name()) {
                continue;
            }
            match packages.iter_mut().find(|(p, _)| p == file.package()) {
                Some((_, files)) => files.push(file),
                None => packages.push((file.package().to_owned(), vec![file])),
            }
        }
        let mut out = Vec::new();
        for (package, files) in packages {
            let name = if package.is_empty() { "_".to_owned() } else { package.clone() };
            let text = self.package(&package, &files)?;
            out.push((format!("{name}.rs"), text));
        }
        Ok(out)
    }

    /// One package: tables, support module, types, services.
    fn package(
        &mut self,
        package: &str,
        files: &[&'g FileDescriptorProto],
    ) -> Result<String, Error> {
        let root = package_path(package);
        let scope = Scope { module: root.clone(), root, package: package.to_owned() };
        let mut w = CodeWriter::new();
        let names: Vec<&str> = files.iter().map(|f| f.name()).collect();
        w.line(format!(
            "// @generated by protoplane-codegen from {}. Do not edit.",
            names.join(", ")
        ));
        w.line(format!("// Package `{package}`."));
        w.blank();
        self.tables(&mut w, package);
        let mut markers = Vec::new();
        for file in files {
            for m in &file.message_type {
                self.collect_markers(&scope, package, m, &mut markers)?;
            }
        }
        self.layout_check(&mut w, &markers);
        self.decoder_list(&mut w, &scope, package, files)?;
        w.blank();
        w.lines(SUPPORT);
        self.foreign_elems(&mut w, &scope, files)?;
        for file in files {
            for e in &file.enum_type {
                w.blank();
                self.enumeration(&mut w, &join(package, e.name()), e);
            }
            for m in &file.message_type {
                w.blank();
                self.message(&mut w, &scope, &join(package, m.name()), m)?;
            }
        }
        for file in files {
            for s in &file.service {
                self.service(&mut w, &scope, s)?;
            }
        }
        Ok(w.into_string())
    }

    /// `TABLE_BYTES` and `tables()`.
    fn tables(&self, w: &mut CodeWriter, package: &str) {
        w.doc(&format!(
            "The schema tables (`TableSet::to_bytes`) this code was generated from: every\n\
             type of the build script's `.proto` files and their imports. Type indices and\n\
             slot offsets below refer to these tables; ship them to an engine as they are.\n\
             Shared by every package generated in the same `compile` call (package `{package}`)."
        ));
        w.line(format!("pub const TABLE_BYTES: &[u8] = include_bytes!(\"{}\");", self.tables_file));
        w.blank();
        w.doc(
            "The loaded schema tables (built once, on first use, from [`TABLE_BYTES`]).\n\
             \n\
             # Panics\n\
             \n\
             Never in practice: the bytes were written by the same generator run as this\n\
             file and load unless the build output was tampered with.",
        );
        w.open("pub fn tables() -> &'static ::protoplane_schema::TableSet");
        w.line("static TABLES: ::std::sync::OnceLock<::protoplane_schema::TableSet> =");
        w.line("    ::std::sync::OnceLock::new();");
        w.open(
            "TABLES.get_or_init(|| match ::protoplane_schema::TableSet::from_bytes(TABLE_BYTES)",
        );
        w.line("Ok(ts) => ts,");
        w.line("Err(e) => panic!(\"protoplane: the embedded table set does not load: {e}\"),");
        w.close_with(")");
        w.close();
    }

    /// `layout_matches`: does a run-time table set agree with the constants?
    fn layout_check(&self, w: &mut CodeWriter, markers: &[String]) {
        w.blank();
        w.doc(
            "Whether `ts` lays out every message of this package exactly as the generated\n\
             code assumes (same type index, name, object size and field ops): true for\n\
             [`tables()`], and for any table set built from the same `.proto` files. Views\n\
             and builders only check the type index and object size when they are made.",
        );
        w.open("pub fn layout_matches(ts: &::protoplane_schema::TableSet) -> bool");
        if markers.is_empty() {
            w.line("let _ = ts;");
            w.line("true");
        } else {
            for (i, m) in markers.iter().enumerate() {
                if i == 0 {
                    w.line(format!("{m}::layout_matches(ts)"));
                    w.indent();
                } else {
                    w.line(format!("&& {m}::layout_matches(ts)"));
                }
            }
            w.dedent();
        }
        w.close();
    }

    /// `GENERATED_DECODERS`: every message of the package (map entries
    /// aside) with its generated decoder, for code that picks a type at run
    /// time (the benchmark worker, the fuzz target, the equivalence tests).
    fn decoder_list(
        &self,
        w: &mut CodeWriter,
        scope: &Scope,
        package: &str,
        files: &[&FileDescriptorProto],
    ) -> Result<(), Error> {
        let mut entries = Vec::new();
        let mut stack: Vec<(String, &DescriptorProto)> = Vec::new();
        for file in files {
            for m in file.message_type.iter().rev() {
                stack.push((join(package, m.name()), m));
            }
        }
        while let Some((full, m)) = stack.pop() {
            let loc = self.types.get(&full)?;
            if !loc.map_entry {
                entries.push(scope.path(loc, ""));
            }
            for n in m.nested_type.iter().rev() {
                stack.push((join(&full, n.name()), n));
            }
        }
        w.blank();
        w.doc(
            "Every message type of this package (map entries aside) with its generated\n\
             decoder: `(type index, decoder)`, for code that picks the type at run time.",
        );
        w.line("#[doc(hidden)]");
        w.line("pub const GENERATED_DECODERS: &[(u32, ::protoplane_wire::gen::Fields)] = &[");
        w.indent();
        for m in &entries {
            w.line(format!(
                "({m}::TYPE_INDEX, {m}::decode_fields as ::protoplane_wire::gen::Fields),"
            ));
        }
        w.dedent();
        w.line("];");
        w.blank();
        w.doc("The same types with their generated encoders: `(type index, encoder)`.");
        w.line("#[doc(hidden)]");
        w.line("pub const GENERATED_ENCODERS: &[(u32, ::protoplane_wire::gen::EncodeFields)] = &[");
        w.indent();
        for m in &entries {
            w.line(format!(
                "({m}::TYPE_INDEX, {m}::encode_fields as ::protoplane_wire::gen::EncodeFields),"
            ));
        }
        w.dedent();
        w.line("];");
        Ok(())
    }

    fn collect_markers(
        &self,
        scope: &Scope,
        prefix: &str,
        m: &DescriptorProto,
        out: &mut Vec<String>,
    ) -> Result<(), Error> {
        let full = join(prefix, m.name());
        let loc = self.types.get(&full)?;
        out.push(scope.path(loc, ""));
        for n in &m.nested_type {
            self.collect_markers(scope, &full, n, out)?;
        }
        Ok(())
    }

    /// `impl Elem for` every view of another package this package stores in
    /// a repeated or map field (a package's `Elem` trait is its own).
    fn foreign_elems(
        &self,
        w: &mut CodeWriter,
        scope: &Scope,
        files: &[&FileDescriptorProto],
    ) -> Result<(), Error> {
        let mut foreign = BTreeSet::new();
        let mut stack: Vec<(String, &DescriptorProto)> = Vec::new();
        for f in files {
            for m in &f.message_type {
                stack.push((join(f.package(), m.name()), m));
            }
        }
        while let Some((full, m)) = stack.pop() {
            let info = MessageInfo::new(self.ts, &full, m)?;
            for f in &info.fields {
                if !f.is_repeated() {
                    continue;
                }
                let elem = if f.is_map() {
                    let entry = self.ts.message(f.field.sub);
                    let value = self.ts.fields(entry).get(1).copied();
                    value.filter(|v| v.kind.is_message()).map(|v| self.ts.message_name(v.sub))
                } else if f.kind().is_message() {
                    Some(self.ts.message_name(f.field.sub))
                } else {
                    None
                };
                if let Some(name) = elem {
                    let loc = self.types.get(name)?;
                    if loc.package != scope.package {
                        foreign.insert((scope.path(loc, "View"), scope.path(loc, "")));
                    }
                }
            }
            for n in &m.nested_type {
                stack.push((join(&full, n.name()), n));
            }
        }
        for (view, marker) in foreign {
            w.blank();
            w.open(format!("impl<'a> _protoplane::Elem<'a> for {view}<'a>"));
            w.line("const STRIDE: usize = 8;");
            w.line("#[inline(always)]");
            w.open(
                "fn read(view: &::protoplane_wire::MessageView<'a>, bytes: &'a [u8]) -> Option<Self>",
            );
            w.chain(
                &format!("_protoplane::element(view, bytes, {marker}::TYPE_INDEX)"),
                &[format!(".map({view})")],
                "",
            );
            w.close();
            w.close();
        }
        Ok(())
    }

    /// One enum: a Rust enum of the declared values with the usual conversions.
    pub(crate) fn enumeration(&self, w: &mut CodeWriter, full: &str, e: &EnumDescriptorProto) {
        let name = type_ident(e.name());
        let prefix = format!("{}_", screaming(e.name()));
        // Variants: the first name of each number; aliases become constants.
        let strip = e.value.iter().all(|v| {
            v.name().strip_prefix(&prefix).is_some_and(|rest| {
                !rest.is_empty() && !rest.starts_with(|c: char| c.is_ascii_digit())
            })
        });
        let variant = |n: &str| {
            let base = if strip { n.strip_prefix(&prefix).unwrap_or(n) } else { n };
            ident(&camel(base))
        };
        let mut seen = HashSet::new();
        let mut values = Vec::new();
        let mut aliases = Vec::new();
        for v in &e.value {
            if seen.insert(v.number()) {
                values.push((variant(v.name()), v.name().to_owned(), v.number()));
            } else if let Some(first) = values.iter().find(|x| x.2 == v.number()) {
                aliases.push((ident(&screaming(v.name())), first.0.clone(), v.name().to_owned()));
            }
        }
        w.doc(&format!("Enum `{full}`."));
        w.line("#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]");
        w.line("#[allow(clippy::enum_variant_names)] // the .proto's names");
        w.line("#[repr(i32)]");
        w.open(format!("pub enum {name}"));
        for (i, (v, proto, number)) in values.iter().enumerate() {
            w.doc(&format!("`{proto} = {number}`"));
            if i == 0 {
                w.line("#[default]");
            }
            w.line(format!("{v} = {number},"));
        }
        w.close();
        w.blank();
        w.open(format!("impl {name}"));
        w.doc("Fully qualified name.");
        w.line(format!("pub const FULL_NAME: &'static str = \"{full}\";"));
        for (alias, target, proto) in &aliases {
            w.doc(&format!("`{proto}`: an alias of [`{name}::{target}`]."));
            w.line(format!("pub const {alias}: {name} = {name}::{target};"));
        }
        w.blank();
        w.doc("The value's name in the `.proto` file.");
        w.open("pub fn as_str_name(self) -> &'static str");
        w.open("match self");
        for (v, proto, _) in &values {
            w.line(format!("{name}::{v} => \"{proto}\","));
        }
        w.close();
        w.close();
        w.blank();
        w.doc("The value with this `.proto` name (aliases included).");
        w.open("pub fn from_str_name(name: &str) -> Option<Self>");
        w.open("match name");
        for (v, proto, _) in &values {
            w.line(format!("\"{proto}\" => Some({name}::{v}),"));
        }
        for (_, target, proto) in &aliases {
            w.line(format!("\"{proto}\" => Some({name}::{target}),"));
        }
        w.line("_ => None,");
        w.close();
        w.close();
        w.close();
        w.blank();
        w.open(format!("impl From<{name}> for i32"));
        w.open(format!("fn from(value: {name}) -> i32"));
        w.line("value as i32");
        w.close();
        w.close();
        w.blank();
        w.doc("Fails with the number itself when the enum does not declare it.");
        w.open(format!("impl TryFrom<i32> for {name}"));
        w.line("type Error = i32;");
        w.open("fn try_from(value: i32) -> Result<Self, i32>");
        w.open("match value");
        for (v, _, number) in &values {
            w.line(format!("{number} => Ok({name}::{v}),"));
        }
        w.line("other => Err(other),");
        w.close();
        w.close();
        w.close();
    }

    /// One message: marker type, view, builder, then its nested types in a
    /// module named after it (prost's layout).
    pub(crate) fn message(
        &mut self,
        w: &mut CodeWriter,
        scope: &Scope,
        full: &str,
        desc: &DescriptorProto,
    ) -> Result<(), Error> {
        let info = MessageInfo::new(self.ts, full, desc)?;
        let loc = self.types.get(full)?.clone();
        self.marker(w, &info, &loc);
        w.blank();
        crate::decoder::emit(w, self, scope, &info, &loc)?;
        w.blank();
        crate::encoder::emit(w, self, scope, &info, &loc)?;
        if loc.map_entry {
            return Ok(());
        }
        let inner = scope.nested(loc.inner_module(desc.name()));
        w.blank();
        crate::view::emit(w, self, scope, &inner, &info, &loc)?;
        w.blank();
        crate::builder::emit(w, self, scope, &info, &loc)?;
        let has_module =
            !desc.nested_type.is_empty() || !desc.enum_type.is_empty() || !info.oneofs.is_empty();
        if !has_module {
            return Ok(());
        }
        w.blank();
        w.doc(&format!("Types nested in `{full}`."));
        let module = inner.module.last().cloned().unwrap_or_default();
        if scope.module.last() == Some(&module) {
            w.line("#[allow(clippy::module_inception)] // named after the message, as prost does");
        }
        w.open(format!("pub mod {module}"));
        let mut first = true;
        for e in &desc.enum_type {
            if !first {
                w.blank();
            }
            first = false;
            self.enumeration(w, &join(full, e.name()), e);
        }
        for (i, _) in info.oneofs.iter().enumerate() {
            if !first {
                w.blank();
            }
            first = false;
            crate::view::oneof_enum(w, self, &inner, &info, i)?;
        }
        for n in &desc.nested_type {
            if !first {
                w.blank();
            }
            first = false;
            self.message(w, &inner, &join(full, n.name()), n)?;
        }
        w.close();
        Ok(())
    }

    /// The marker type: type index, full name, object size, field ops, and
    /// the entry points (`builder`, `decode`).
    fn marker(&self, w: &mut CodeWriter, info: &MessageInfo, loc: &TypeLoc) {
        let name = &loc.ident;
        let base = &loc.base;
        let full = &info.full_name;
        if loc.map_entry {
            w.doc(&format!(
                "The entry type of a map field (`{full}`): its layout, which the map's\n\
                 view and builder use. Not a message of its own."
            ));
        } else {
            w.doc(&format!(
                "Message `{full}`: its place in the tables and its entry points.\n\
                 Read it through [`{base}View`], write it with [`{base}Builder`]."
            ));
        }
        w.line("#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]");
        w.line(format!("pub struct {name};"));
        w.blank();
        w.open(format!("impl {name}"));
        w.doc("Index of this type in the package's `tables()`.");
        w.line(format!("pub const TYPE_INDEX: u32 = {};", info.type_index));
        w.doc("Fully qualified name.");
        w.line(format!("pub const FULL_NAME: &'static str = \"{full}\";"));
        w.doc("Size of the object in a block (hasbits, scalar slots, reference slots).");
        w.line(format!("pub const SIZE: u32 = {};", info.table.size));
        w.doc(
            "The field ops, in field-number order, exactly as the tables derive them: slot\n\
             offset, presence (hasbit index or oneof case word offset), element size.",
        );
        let ops = self.ts.ops(&info.table);
        if ops.is_empty() {
            w.line("pub const FIELD_OPS: [::protoplane_schema::FieldOp; 0] = [];");
        } else {
            w.open(format!("pub const FIELD_OPS: [::protoplane_schema::FieldOp; {}] =", ops.len()));
            let rt = relative(&loc.module, &package_path(&loc.package), "_protoplane");
            w.line(format!("use {rt}::{{op, Card as C, ValueOp as V}};"));
            let one = format!("[{}]", ops.iter().map(op_literal).collect::<Vec<_>>().join(", "));
            if w.fits(&one) {
                w.line(one);
            } else {
                w.line("[");
                w.indent();
                for op in ops {
                    w.line(format!("{},", op_literal(op)));
                }
                w.dedent();
                w.line("]");
            }
            w.close_with(";");
        }
        w.blank();
        w.doc("Whether `ts` lays this type out exactly as the generated code assumes.");
        w.open("pub fn layout_matches(ts: &::protoplane_schema::TableSet) -> bool");
        let rt = relative(&loc.module, &package_path(&loc.package), "_protoplane");
        w.call(
            &format!("{rt}::same_layout"),
            &["ts", "Self::TYPE_INDEX", "Self::FULL_NAME", "Self::SIZE", "&Self::FIELD_OPS"]
                .map(String::from),
            "",
        );
        w.close();
        if !loc.map_entry {
            let tables = relative(&loc.module, &package_path(&loc.package), "tables");
            w.blank();
            w.doc(&format!(
                "A block builder with an empty `{full}` as its root; lay it out with\n\
                 [`{base}Builder::root`], then `finish()` it into a block."
            ));
            w.open("pub fn builder() -> ::protoplane_wire::Builder<'static>");
            w.open(format!("match ::protoplane_wire::Builder::new({tables}(), Self::TYPE_INDEX)"));
            w.line("Ok(b) => b,");
            w.line("// The type index comes from these very tables.");
            w.line("Err(e) => panic!(\"protoplane: {e}\"),");
            w.close();
            w.close();
            w.blank();
            w.doc(&format!(
                "Decodes wire bytes into a new block with this message as its root, with\n\
                 the generated decoder (the same block `protoplane_wire::decode` makes). In\n\
                 view mode (`DecodeOptions::view()`) the block references `wire`: read it\n\
                 with [`{base}View::from_block`]`(block.as_bytes(), wire)`."
            ));
            w.line("pub fn decode(");
            w.indent();
            w.line("wire: &[u8],");
            w.line("opts: &::protoplane_wire::DecodeOptions,");
            w.dedent();
            w.open(") -> Result<::protoplane_wire::Block, ::protoplane_wire::DecodeError>");
            w.call(
                "::protoplane_wire::gen::decode",
                &[format!("{tables}()"), "Self::TYPE_INDEX".into(), "Self::decode_fields".into()]
                    .into_iter()
                    .chain(["wire", "opts"].map(String::from))
                    .collect::<Vec<_>>(),
                "",
            );
            w.close();
            w.blank();
            w.doc(
                "Like `decode`, into a reused block with a reused decoder (no allocation\n\
                 once both have warmed up). On error the block's content is unspecified.",
            );
            w.line("pub fn decode_into(");
            w.indent();
            w.line("decoder: &mut ::protoplane_wire::Decoder,");
            w.line("wire: &[u8],");
            w.line("opts: &::protoplane_wire::DecodeOptions,");
            w.line("out: &mut ::protoplane_wire::Block,");
            w.dedent();
            w.open(") -> Result<(), ::protoplane_wire::DecodeError>");
            w.call(
                "::protoplane_wire::gen::decode_into",
                &[format!("{tables}()"), "Self::TYPE_INDEX".into(), "Self::decode_fields".into()]
                    .into_iter()
                    .chain(["decoder", "wire", "opts", "out"].map(String::from))
                    .collect::<Vec<_>>(),
                "",
            );
            w.close();
            w.blank();
            w.doc(
                "Encodes the block in `src` (this message at its root) with the generated\n\
                 encoder, into `encoder`'s reused buffer; the same bytes `Encoder::encode`\n\
                 gives. The slice is valid until the encoder is used again.",
            );
            w.line("pub fn encode<'e>(");
            w.indent();
            w.line("encoder: &'e mut ::protoplane_wire::Encoder,");
            w.line("src: ::protoplane_wire::Source<'_>,");
            w.line("opts: &::protoplane_wire::EncodeOptions,");
            w.dedent();
            w.open(") -> Result<&'e [u8], ::protoplane_wire::BlockError>");
            w.call(
                "::protoplane_wire::gen::encode",
                &[format!("{tables}()"), "Self::TYPE_INDEX".into(), "Self::encode_fields".into()]
                    .into_iter()
                    .chain(["encoder", "src", "opts"].map(String::from))
                    .collect::<Vec<_>>(),
                "",
            );
            w.close();
        }
        w.close();
    }

    /// One service: handed to the configured [`ServiceGenerator`] with every
    /// method's request and response types resolved to generated paths.
    /// Without one, services produce no code.
    pub(crate) fn service(
        &mut self,
        w: &mut CodeWriter,
        scope: &Scope,
        s: &prost_types::ServiceDescriptorProto,
    ) -> Result<(), Error> {
        if self.services.is_none() {
            return Ok(());
        }
        let full_name = join(&scope.package, s.name());
        let mut methods = Vec::new();
        for m in &s.method {
            methods.push(Method {
                name: m.name().to_owned(),
                rust_name: ident(&snake(m.name())),
                path: format!("/{full_name}/{}", m.name()),
                input: self.message_type(scope, m.input_type())?,
                output: self.message_type(scope, m.output_type())?,
                client_streaming: m.client_streaming(),
                server_streaming: m.server_streaming(),
            });
        }
        let service = Service {
            name: s.name().to_owned(),
            rust_name: ident(&camel(s.name())),
            package: scope.package.clone(),
            full_name,
            methods,
            descriptor_set_file: self.descriptor_set_file.clone(),
        };
        if let Some(g) = self.services.as_deref_mut() {
            w.blank();
            g.generate(&service, w);
        }
        Ok(())
    }

    fn message_type(&self, scope: &Scope, name: &str) -> Result<MessageType, Error> {
        let name = name.trim_start_matches('.');
        let loc = self.types.get(name)?;
        let type_index = self
            .ts
            .message_by_name(name)
            .ok_or_else(|| Error::Unsupported(format!("{name} is not in the tables")))?;
        Ok(MessageType {
            full_name: name.to_owned(),
            type_index,
            marker: scope.path(loc, ""),
            view: scope.path(loc, "View"),
            builder: scope.path(loc, "Builder"),
        })
    }

    pub(crate) fn ts(&self) -> &TableSet {
        self.ts
    }

    pub(crate) fn types(&self) -> &Types {
        &self.types
    }

    /// The generated location of a field's message or enum type.
    pub(crate) fn field_type(&self, f: &FieldInfo) -> Result<&TypeLoc, Error> {
        let name = match f.kind() {
            Kind::Message | Kind::Group => self.ts.message_name(f.field.sub),
            _ => f.type_name.as_deref().unwrap_or(""),
        };
        self.types.get(name)
    }
}

/// `op(tag_bytes, tag, offset, presence, tag_len, V::value, C::card, size)`.
fn op_literal(op: &FieldOp) -> String {
    format!(
        "op({:#04x}, {}, {}, {}, {}, V::{:?}, C::{:?}, {})",
        op.tag_bytes, op.tag, op.offset, op.presence, op.tag_len, op.value, op.card, op.size
    )
}

pub(crate) fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}.{name}")
    }
}
