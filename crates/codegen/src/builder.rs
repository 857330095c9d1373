//! Emits the typed builder of a message (`FooBuilder<'b, 't>`).
//!
//! Every setter writes through the `Builder` constant-offset primitives
//! (`set_bits`, `set_bytes`, `push_bits`, `push_bytes`, `open`) with the
//! field's op from the marker's `FIELD_OPS`: no lookup by number. Scalar
//! setters cannot fail (the object is already in the block); everything that
//! grows the block returns `Result<_, BuildError>` for its size limits.

use protoplane_schema::{Field, Kind};

use crate::generator::{Generator, Names, Scope};
use crate::model::{MessageInfo, TypeLoc};
use crate::names::{ident, joined, snake};
use crate::view::{declaration, scalar_type};
use crate::writer::CodeWriter;
use crate::Error;

/// How a setter takes a value of `kind` and turns it into what the builder
/// primitive wants.
enum Param {
    /// Slot bits: `(parameter type, expression of "value" giving u64 bits)`.
    Bits(String, String),
    /// Bytes: `(parameter type, expression giving &[u8])`.
    Bytes(String, String),
    /// A sub-message: opened, its builder returned.
    Message,
}

fn param(kind: Kind, var: &str) -> Param {
    let bits = |ty: &str, expr: String| Param::Bits(ty.to_owned(), expr);
    match kind {
        Kind::Double => bits("f64", format!("{var}.to_bits()")),
        Kind::Float => bits("f32", format!("u64::from({var}.to_bits())")),
        Kind::Int64 | Kind::SInt64 | Kind::SFixed64 => bits("i64", format!("{var} as u64")),
        Kind::UInt64 | Kind::Fixed64 => bits("u64", var.to_owned()),
        Kind::Int32 | Kind::SInt32 | Kind::SFixed32 => bits("i32", format!("{var} as u32 as u64")),
        Kind::Enum => bits("impl Into<i32>", format!("Into::<i32>::into({var}) as u32 as u64")),
        Kind::UInt32 | Kind::Fixed32 => bits("u32", format!("u64::from({var})")),
        Kind::Bool => bits("bool", format!("u64::from({var})")),
        Kind::String => Param::Bytes("&str".to_owned(), format!("{var}.as_bytes()")),
        Kind::Bytes => Param::Bytes("&[u8]".to_owned(), var.to_owned()),
        Kind::Message | Kind::Group => Param::Message,
    }
}

/// The builder of one message.
pub(crate) fn emit(
    w: &mut CodeWriter,
    gen: &Generator<'_>,
    scope: &Scope,
    info: &MessageInfo,
    loc: &TypeLoc,
) -> Result<(), Error> {
    let name = &loc.ident;
    let builder = format!("{}Builder", loc.base);
    let full = &info.full_name;
    let rt = scope.rt();
    w.doc(&format!(
        "Lays out a `{full}` object in a block under construction (the response path:\n\
         the application lays the message out, the engine encodes it).\n\
         \n\
         Setters write at the slot offsets fixed by the tables. Scalar setters cannot\n\
         fail; setters that grow the block (strings, bytes, repeated elements, new\n\
         sub-messages) return `BuildError::TooLarge` past a block's limits (1 GiB per\n\
         string or array, 4 GiB per block)."
    ));
    w.line("#[derive(Debug)]");
    w.open(format!("pub struct {builder}<'b, 't>"));
    w.line("pub(crate) b: &'b mut ::protoplane_wire::Builder<'t>,");
    w.line("pub(crate) at: ::protoplane_wire::MessageBuilder,");
    w.close();
    w.blank();

    let mut names = Names::new(&["root", "at", "handle", "as_builder"]);
    let mut body = CodeWriter::at_depth(w.depth() + 1);
    setters(&mut body, gen, scope, info, name, &mut names)?;
    if names.has_conventional_prefix() {
        w.line("#[allow(clippy::wrong_self_convention)] // setters are named after the fields");
    }
    w.open(format!("impl<'b, 't> {builder}<'b, 't>"));
    w.doc(&format!(
        "The root of `builder`, which [`{name}::builder`] started.\n\
         \n\
         # Panics\n\
         \n\
         If the root of `builder` is not a `{full}` laid out as this code expects (a\n\
         programming error; [`{builder}::at`] is the checked form)."
    ));
    w.open("pub fn root(builder: &'b mut ::protoplane_wire::Builder<'t>) -> Self");
    w.line("let handle = builder.root();");
    w.open("match Self::at(builder, handle)");
    w.line("Some(this) => this,");
    w.line(format!("None => panic!(\"the block's root is not a {{}}\", {name}::FULL_NAME),"));
    w.close();
    w.close();
    w.blank();
    w.doc(&format!(
        "The object `handle` of `builder`, if it is a `{full}` laid out as this code\n\
         expects (type index and object size)."
    ));
    w.open_fn(
        "pub fn at",
        &[
            "builder: &'b mut ::protoplane_wire::Builder<'t>".to_owned(),
            "handle: ::protoplane_wire::MessageBuilder".to_owned(),
        ],
        "Option<Self>",
    );
    w.call(
        &format!("let fits = {rt}::fits"),
        &["builder.tables()".to_owned(), format!("{name}::TYPE_INDEX"), format!("{name}::SIZE")],
        ";",
    );
    w.if_else(
        &format!("fits && handle.type_index() == {name}::TYPE_INDEX"),
        "Some(Self { b: builder, at: handle })",
        "None",
    );
    w.close();
    w.blank();
    w.doc("This object's handle, for the dynamic `Builder` API.");
    w.open("pub fn handle(&self) -> ::protoplane_wire::MessageBuilder");
    w.line("self.at");
    w.close();
    w.blank();
    w.doc("The dynamic builder this object is laid out in (e.g. to `push_unknown`).");
    w.open("pub fn as_builder(&mut self) -> &mut ::protoplane_wire::Builder<'t>");
    w.line("self.b");
    w.close();
    let body = body.into_string();
    if !body.is_empty() {
        w.blank();
        w.raw(&body);
    }
    w.close();
    Ok(())
}

const ERR: &str = "::protoplane_wire::BuildError";

/// `fn name(&mut self, params) -> Result<&mut Self, BuildError>` with `stmts`, then `Ok(self)`.
fn chaining(
    w: &mut CodeWriter,
    name: &str,
    generics: &str,
    params: &[String],
    stmts: impl FnOnce(&mut CodeWriter),
) {
    let mut all = vec!["&mut self".to_owned()];
    all.extend_from_slice(params);
    w.open_fn(&format!("pub fn {name}{generics}"), &all, &format!("Result<&mut Self, {ERR}>"));
    stmts(w);
    w.line("Ok(self)");
    w.close();
}

/// `fn name(&mut self, params) -> Result<SubBuilder<'_, 't>, BuildError>`
/// (`builder`: the path of `SubBuilder`): `stmts` must leave the
/// sub-message's handle in `at`.
fn opening(
    w: &mut CodeWriter,
    name: &str,
    params: &[String],
    builder: &str,
    stmts: impl FnOnce(&mut CodeWriter),
) {
    let mut all = vec!["&mut self".to_owned()];
    all.extend_from_slice(params);
    w.open_fn(&format!("pub fn {name}"), &all, &format!("Result<{builder}<'_, 't>, {ERR}>"));
    stmts(w);
    w.line(format!("Ok({builder} {{ b: &mut *self.b, at }})"));
    w.close();
}

fn setters(
    w: &mut CodeWriter,
    gen: &Generator<'_>,
    scope: &Scope,
    info: &MessageInfo,
    marker: &str,
    names: &mut Names,
) -> Result<(), Error> {
    for f in &info.fields {
        let decl = declaration(gen, f);
        let op = format!("&{marker}::FIELD_OPS[{}]", f.op_index);
        let snake_name = snake(&f.name);
        w.blank();
        if f.is_map() {
            let entry = scope.path(gen.field_type(f)?, "");
            let entry_ty = gen.ts().message(f.field.sub);
            let kv = gen.ts().fields(entry_ty);
            let (Some(k), Some(v)) = (kv.first(), kv.get(1)) else {
                return Err(Error::Unsupported(format!("{}: malformed map entry", f.name)));
            };
            let insert = names.claim(joined("insert_", &snake_name));
            let (kp, kwrite) = entry_write(k, "key", &entry, 0)?;
            let open_entry = |w: &mut CodeWriter| {
                w.call(
                    "let entry = self.b.open",
                    &["self.at".to_owned(), op.clone(), format!("{entry}::TYPE_INDEX")],
                    "?;",
                );
            };
            if v.kind.is_message() {
                let sub_loc = gen.types().get(gen.ts().message_name(v.sub))?;
                let (sub, sub_builder) = (scope.path(sub_loc, ""), scope.path(sub_loc, "Builder"));
                w.doc(&format!(
                    "Adds an entry to {decl} and opens its value. A key inserted twice\n\
                     is encoded twice; decoders keep the last value."
                ));
                opening(w, &insert, &[format!("key: {kp}")], &sub_builder, |w| {
                    open_entry(w);
                    kwrite.emit(w);
                    w.call(
                        "let at = self.b.open",
                        &[
                            "entry".to_owned(),
                            format!("&{entry}::FIELD_OPS[1]"),
                            format!("{sub}::TYPE_INDEX"),
                        ],
                        "?;",
                    );
                });
            } else {
                let (vp, vwrite) = entry_write(v, "value", &entry, 1)?;
                w.doc(&format!(
                    "Adds an entry to {decl}. A key inserted twice is encoded twice;\n\
                     decoders keep the last value."
                ));
                chaining(w, &insert, "", &[format!("key: {kp}"), format!("value: {vp}")], |w| {
                    open_entry(w);
                    kwrite.emit(w);
                    vwrite.emit(w);
                });
            }
            continue;
        }
        match (f.is_repeated(), param(f.kind(), "value")) {
            (false, Param::Bits(ty, bits)) => {
                let set = names.claim(joined("set_", &snake_name));
                w.doc(&format!("Sets {decl}."));
                w.line("#[inline]");
                w.open_fn(
                    &format!("pub fn {set}"),
                    &["&mut self".to_owned(), format!("value: {ty}")],
                    "&mut Self",
                );
                w.call("self.b.set_bits", &["self.at".to_owned(), op, bits], ";");
                w.line("self");
                w.close();
            }
            (false, Param::Bytes(ty, bytes)) => {
                let set = names.claim(joined("set_", &snake_name));
                w.doc(&format!("Sets {decl} (a copy of `value`)."));
                w.line("#[inline]");
                chaining(w, &set, "", &[format!("value: {ty}")], |w| {
                    w.call("self.b.set_bytes", &["self.at".to_owned(), op.clone(), bytes], "?;");
                });
                let dev = names.claim(joined(&joined("set_", &snake_name), "_device"));
                w.doc(&format!(
                    "Sets {decl} to a handle into the device region: the bytes stay\n\
                     there and the engine's encoder pulls them (RPCAcc's co-serialization)."
                ));
                w.line("#[inline]");
                chaining(w, &dev, "", &["handle: ::protoplane_wire::Ref".to_owned()], |w| {
                    w.call(
                        "self.b.set_device",
                        &["self.at".to_owned(), op, "handle.offset".into(), "handle.len".into()],
                        "?;",
                    );
                });
            }
            (false, Param::Message) => {
                let open = names.claim(ident(&snake_name));
                let sub_loc = gen.field_type(f)?;
                let (sub, sub_builder) = (scope.path(sub_loc, ""), scope.path(sub_loc, "Builder"));
                w.doc(&format!(
                    "Opens {decl}: the message already set (further writes merge into it)\n\
                     or a new, empty one."
                ));
                w.line("#[inline]");
                opening(w, &open, &[], &sub_builder, |w| {
                    w.call(
                        "let at = self.b.open",
                        &["self.at".to_owned(), op, format!("{sub}::TYPE_INDEX")],
                        "?;",
                    );
                });
            }
            (true, Param::Bits(ty, bits)) => {
                let push = names.claim(joined("push_", &snake_name));
                let extend = names.claim(joined("extend_", &snake_name));
                w.doc(&format!("Appends one element to {decl}."));
                w.line("#[inline]");
                chaining(w, &push, "", &[format!("value: {ty}")], |w| {
                    w.call("self.b.push_bits", &["self.at".to_owned(), op, bits], "?;");
                });
                w.blank();
                let (item, generics) = if f.kind() == Kind::Enum {
                    ("E", "<E: Into<i32>>")
                } else {
                    (ty.as_str(), "")
                };
                w.doc(&format!("Appends every element of `values` to {decl}."));
                chaining(
                    w,
                    &extend,
                    generics,
                    &[format!("values: impl IntoIterator<Item = {item}>")],
                    |w| {
                        w.open("for value in values");
                        w.line(format!("self.{push}(value)?;"));
                        w.close();
                    },
                );
            }
            (true, Param::Bytes(ty, bytes)) => {
                let push = names.claim(joined("push_", &snake_name));
                let extend = names.claim(joined("extend_", &snake_name));
                w.doc(&format!("Appends one element (a copy of `value`) to {decl}."));
                w.line("#[inline]");
                chaining(w, &push, "", &[format!("value: {ty}")], |w| {
                    w.call("self.b.push_bytes", &["self.at".to_owned(), op, bytes], "?;");
                });
                w.blank();
                let item = if f.kind() == Kind::String { "&'v str" } else { "&'v [u8]" };
                w.doc(&format!("Appends every element of `values` to {decl}."));
                chaining(
                    w,
                    &extend,
                    "<'v>",
                    &[format!("values: impl IntoIterator<Item = {item}>")],
                    |w| {
                        w.open("for value in values");
                        w.line(format!("self.{push}(value)?;"));
                        w.close();
                    },
                );
            }
            (true, Param::Message) => {
                let add = names.claim(joined("add_", &snake_name));
                let sub_loc = gen.field_type(f)?;
                let (sub, sub_builder) = (scope.path(sub_loc, ""), scope.path(sub_loc, "Builder"));
                w.doc(&format!("Appends a new, empty element to {decl} and opens it."));
                w.line("#[inline]");
                opening(w, &add, &[], &sub_builder, |w| {
                    w.call(
                        "let at = self.b.open",
                        &["self.at".to_owned(), op, format!("{sub}::TYPE_INDEX")],
                        "?;",
                    );
                });
            }
        }
    }
    Ok(())
}

/// A statement writing a map entry's key or value.
struct EntryWrite {
    call: &'static str,
    args: Vec<String>,
    tail: &'static str,
}

impl EntryWrite {
    fn emit(&self, w: &mut CodeWriter) {
        w.call(self.call, &self.args, self.tail);
    }
}

/// A map entry's key or value write: `(parameter type, statement)`.
fn entry_write(
    f: &Field,
    var: &str,
    entry: &str,
    index: usize,
) -> Result<(String, EntryWrite), Error> {
    let op = format!("&{entry}::FIELD_OPS[{index}]");
    Ok(match param(f.kind, var) {
        Param::Bits(ty, bits) => (
            ty,
            EntryWrite { call: "self.b.set_bits", args: vec!["entry".into(), op, bits], tail: ";" },
        ),
        Param::Bytes(ty, bytes) => (
            ty,
            EntryWrite {
                call: "self.b.set_bytes",
                args: vec!["entry".into(), op, bytes],
                tail: "?;",
            },
        ),
        Param::Message => {
            return Err(Error::Unsupported(format!("map {var} of type {}", scalar_type(f.kind))))
        }
    })
}
