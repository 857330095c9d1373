//! Emits the typed view of a message (`FooView<'a>`) and its oneof enums.
//!
//! Every getter reads its slot at the constant offset the tables assigned,
//! through the `MessageView` slot primitives (one bounds check per read,
//! against the object the view checked once when it was made).

use std::collections::HashSet;

use protoplane_schema::{Field, FieldFlags, Kind};

use crate::generator::{Generator, Names, Scope};
use crate::model::{FieldInfo, MessageInfo, TypeLoc};
use crate::names::{byte_literal, camel, ident, joined, snake};
use crate::writer::CodeWriter;
use crate::Error;

/// Rust type of a scalar kind (enums: `i32`).
pub(crate) fn scalar_type(kind: Kind) -> &'static str {
    match kind {
        Kind::Double => "f64",
        Kind::Float => "f32",
        Kind::Int64 | Kind::SInt64 | Kind::SFixed64 => "i64",
        Kind::UInt64 | Kind::Fixed64 => "u64",
        Kind::Int32 | Kind::SInt32 | Kind::SFixed32 | Kind::Enum => "i32",
        Kind::UInt32 | Kind::Fixed32 => "u32",
        Kind::Bool => "bool",
        _ => "()",
    }
}

/// Reads a scalar of `kind` from the slot at `off` of `self.0`.
fn read_scalar(kind: Kind, off: u32) -> String {
    match kind {
        Kind::Double => format!("f64::from_bits(self.0.slot_u64({off}))"),
        Kind::Float => format!("f32::from_bits(self.0.slot_u32({off}))"),
        Kind::Int64 | Kind::SInt64 | Kind::SFixed64 => format!("self.0.slot_u64({off}) as i64"),
        Kind::UInt64 | Kind::Fixed64 => format!("self.0.slot_u64({off})"),
        Kind::Int32 | Kind::SInt32 | Kind::SFixed32 | Kind::Enum => {
            format!("self.0.slot_u32({off}) as i32")
        }
        Kind::UInt32 | Kind::Fixed32 => format!("self.0.slot_u32({off})"),
        _ => format!("self.0.slot_u8({off}) != 0"),
    }
}

/// The Rust literal of a scalar default (slot bits as the table holds them).
fn scalar_default(kind: Kind, bits: u64) -> String {
    fn float(v: f64, bits: String, ty: &str) -> String {
        if v.is_nan() {
            format!("{ty}::from_bits({bits})")
        } else if v == f64::INFINITY {
            format!("{ty}::INFINITY")
        } else if v == f64::NEG_INFINITY {
            format!("{ty}::NEG_INFINITY")
        } else {
            format!("{v:?}")
        }
    }
    match kind {
        Kind::Double => float(f64::from_bits(bits), format!("{bits:#x}"), "f64"),
        Kind::Float => {
            let v = f32::from_bits(bits as u32);
            if v.is_finite() {
                format!("{v:?}")
            } else {
                float(v as f64, format!("{:#x}", bits as u32), "f32")
            }
        }
        Kind::Int64 | Kind::SInt64 | Kind::SFixed64 => (bits as i64).to_string(),
        Kind::UInt64 | Kind::Fixed64 => bits.to_string(),
        Kind::Int32 | Kind::SInt32 | Kind::SFixed32 | Kind::Enum => {
            (bits as u32 as i32).to_string()
        }
        Kind::UInt32 | Kind::Fixed32 => (bits as u32).to_string(),
        _ => (bits != 0).to_string(),
    }
}

/// A presence condition and its negation.
struct Cond {
    pos: String,
    neg: String,
}

fn cond_of(f: &FieldInfo) -> Cond {
    match f.oneof {
        Some((_, case)) => Cond {
            pos: format!("self.0.slot_u32({case}) == {}", f.field.number),
            neg: format!("self.0.slot_u32({case}) != {}", f.field.number),
        },
        None => Cond {
            pos: format!("self.0.hasbit({})", f.field.presence),
            neg: format!("!self.0.hasbit({})", f.field.presence),
        },
    }
}

/// The element type of a repeated field or a map key / value.
pub(crate) fn elem_type(
    gen: &Generator<'_>,
    scope: &Scope,
    f: &Field,
    type_name: Option<&str>,
) -> Result<String, Error> {
    Ok(match f.kind {
        Kind::String => "&'a str".to_owned(),
        Kind::Bytes => "&'a [u8]".to_owned(),
        Kind::Message | Kind::Group => {
            let name = type_name.unwrap_or_else(|| gen.ts().message_name(f.sub));
            format!("{}<'a>", scope.path(gen.types().get(name)?, "View"))
        }
        k => scalar_type(k).to_owned(),
    })
}

/// The `.proto` declaration of a field, for docs.
pub(crate) fn declaration(gen: &Generator<'_>, f: &FieldInfo) -> String {
    let ty = if f.is_map() {
        let entry = gen.ts().message(f.field.sub);
        let kv: Vec<String> = gen
            .ts()
            .fields(entry)
            .iter()
            .map(|x| match x.kind {
                Kind::Enum => gen.ts().str(gen.ts().enum_type(x.sub).name).to_owned(),
                Kind::Message | Kind::Group => gen.ts().message_name(x.sub).to_owned(),
                k => k.proto_name().to_owned(),
            })
            .collect();
        format!("map<{}>", kv.join(", "))
    } else {
        let label = if f.is_repeated() {
            "repeated "
        } else if f.field.label == protoplane_schema::Label::Required {
            "required "
        } else if f.oneof.is_none()
            && !f.field.flags.has(FieldFlags::IMPLICIT)
            && !f.kind().is_message()
        {
            "optional "
        } else {
            ""
        };
        format!("{label}{}", f.proto_type())
    };
    let placed = if f.field.flags.has(FieldFlags::DEVICE) {
        " [(protoplane.placement) = DEVICE]"
    } else {
        ""
    };
    format!("`{ty} {} = {}{placed};`", f.name, f.field.number)
}

/// The view of one message.
pub(crate) fn emit(
    w: &mut CodeWriter,
    gen: &Generator<'_>,
    scope: &Scope,
    inner: &Scope,
    info: &MessageInfo,
    loc: &TypeLoc,
) -> Result<(), Error> {
    let name = &loc.ident;
    let view = format!("{}View", loc.base);
    let full = &info.full_name;
    let rt = scope.rt();
    w.doc(&format!(
        "A zero-copy view of a `{full}` in a linearized block.\n\
         \n\
         Getters read slots at the offsets fixed by the tables, so they cost a load and\n\
         a bounds check. They never fail: an absent field reads as its default, and a\n\
         reference that does not resolve (a corrupt or hostile block) reads as absent or\n\
         empty. Strings that are not UTF-8 read as `\"\"` (the `_bytes` getters give the\n\
         raw bytes); `string` / `bytes` fields placed in the device region read as empty\n\
         (the `_device` getters give their handles)."
    ));
    w.line("#[derive(Clone, Copy)]");
    w.line(format!("pub struct {view}<'a>(pub(crate) ::protoplane_wire::MessageView<'a>);"));
    w.blank();
    w.open(format!("impl ::std::fmt::Debug for {view}<'_>"));
    w.open("fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result");
    w.line(format!("f.debug_tuple(\"{view}\").field(&self.0).finish()"));
    w.close();
    w.close();
    w.blank();

    let mut names = Names::new(&["from_view", "from_block", "as_view"]);
    let mut body = CodeWriter::at_depth(w.depth() + 1);
    getters(&mut body, gen, scope, inner, info, &mut names)?;
    if names.has_conventional_prefix() {
        w.line("#[allow(clippy::wrong_self_convention)] // getters are named after the fields");
    }
    w.open(format!("impl<'a> {view}<'a>"));
    w.doc(&format!(
        "Wraps a dynamic view; fails with `BlockError::WrongType` unless it is a\n\
         `{full}` laid out as this code expects (type index and object size)."
    ));
    w.line("#[inline]");
    w.open_fn(
        "pub fn from_view",
        &["view: ::protoplane_wire::MessageView<'a>".to_owned()],
        "Result<Self, ::protoplane_wire::BlockError>",
    );
    w.call(
        &format!("let fits = {rt}::fits_view"),
        &["&view".to_owned(), format!("{name}::TYPE_INDEX"), format!("{name}::SIZE")],
        ";",
    );
    w.if_else("fits", "Ok(Self(view))", "Err(::protoplane_wire::BlockError::WrongType)");
    w.close();
    w.blank();
    w.doc(
        "The root of a block: `wire` is empty for an owned block, and the wire bytes\n\
         a view-mode block (`DecodeOptions::view()`) was decoded from otherwise.",
    );
    w.line("#[inline]");
    w.open_fn(
        "pub fn from_block",
        &["block: &'a [u8]".to_owned(), "wire: &'a [u8]".to_owned()],
        "Result<Self, ::protoplane_wire::BlockError>",
    );
    w.line("let src = ::protoplane_wire::Source::viewing(block, wire);");
    w.chain(
        &format!(
            "::protoplane_wire::MessageView::new({}(), src, {name}::TYPE_INDEX)",
            scope.tables()
        ),
        &[".map(Self)".to_owned()],
        "",
    );
    w.close();
    w.blank();
    w.doc("The dynamic view (fields by number or name, JSON, unknown fields, ...).");
    w.line("#[inline]");
    w.open("pub fn as_view(&self) -> ::protoplane_wire::MessageView<'a>");
    w.line("self.0");
    w.close();
    let body = body.into_string();
    if !body.is_empty() {
        w.blank();
        w.raw(&body);
    }
    w.close();
    w.blank();
    w.open(format!("impl<'a> {rt}::Elem<'a> for {view}<'a>"));
    w.line("const STRIDE: usize = 8;");
    w.line("#[inline(always)]");
    w.open("fn read(view: &::protoplane_wire::MessageView<'a>, bytes: &'a [u8]) -> Option<Self>");
    w.chain(
        &format!("{rt}::element(view, bytes, {name}::TYPE_INDEX)"),
        &[format!(".map({view})")],
        "",
    );
    w.close();
    w.close();
    Ok(())
}

fn getters(
    w: &mut CodeWriter,
    gen: &Generator<'_>,
    scope: &Scope,
    inner: &Scope,
    info: &MessageInfo,
    names: &mut Names,
) -> Result<(), Error> {
    let rt = scope.rt();
    // Names the fields' own accessors want: a `<field>_device` accessor
    // never takes one of them (it gets a `_` suffix instead), so adding it
    // renames no existing accessor.
    let mut wanted: HashSet<String> = HashSet::new();
    for f in &info.fields {
        let base = snake(&f.name);
        wanted.insert(ident(&base));
        wanted.insert(joined(&base, "_bytes"));
        wanted.insert(joined("has_", &base));
    }
    for o in &info.oneofs {
        wanted.insert(ident(&snake(&o.name)));
    }
    let mut oneofs_done = vec![false; info.oneofs.len()];
    for f in &info.fields {
        // A oneof's enum getter comes before its members' getters.
        if let Some((o, _)) = f.oneof {
            if !oneofs_done[o] {
                oneofs_done[o] = true;
                oneof_getter(w, gen, scope, inner, info, o, names)?;
            }
        }
        let base = ident(&snake(&f.name));
        let getter = names.claim(base.clone());
        let decl = declaration(gen, f);
        let off = f.field.offset;
        w.blank();
        if f.is_map() {
            let entry_ty = gen.ts().message(f.field.sub);
            let kv = gen.ts().fields(entry_ty);
            let (Some(k), Some(v)) = (kv.first(), kv.get(1)) else {
                return Err(Error::Unsupported(format!("{}: malformed map entry", f.name)));
            };
            let entry = scope.path(gen.field_type(f)?, "");
            let kt = elem_type(gen, scope, k, None)?;
            let vt = elem_type(gen, scope, v, None)?;
            w.doc(&format!("{decl}: the entries, in block order (`get` scans for a key)."));
            w.line("#[inline]");
            w.open_fn(
                &format!("pub fn {getter}"),
                &["&self".to_owned()],
                &format!("{rt}::Map<'a, {kt}, {vt}>"),
            );
            w.call(
                &format!("{rt}::Map::new"),
                &[
                    "self.0".to_owned(),
                    off.to_string(),
                    format!("{entry}::TYPE_INDEX"),
                    k.offset.to_string(),
                    v.offset.to_string(),
                ],
                "",
            );
            w.close();
            continue;
        }
        if f.is_repeated() {
            let et = elem_type(gen, scope, &f.field, None)?;
            w.doc(&decl);
            w.line("#[inline]");
            w.open_fn(
                &format!("pub fn {getter}"),
                &["&self".to_owned()],
                &format!("{rt}::Repeated<'a, {et}>"),
            );
            w.line(format!("{rt}::Repeated::new(self.0, {off})"));
            w.close();
            if f.kind() == Kind::String {
                let raw = names.claim(joined(&snake(&f.name), "_bytes"));
                w.blank();
                w.doc(&format!("{decl}, as raw bytes."));
                w.line("#[inline]");
                w.open_fn(
                    &format!("pub fn {raw}"),
                    &["&self".to_owned()],
                    &format!("{rt}::Repeated<'a, &'a [u8]>"),
                );
                w.line(format!("{rt}::Repeated::new(self.0, {off})"));
                w.close();
            }
            continue;
        }
        let cond = cond_of(f);
        match f.kind() {
            Kind::Message | Kind::Group => {
                let sub = gen.field_type(f)?;
                let sub_view = scope.path(sub, "View");
                let sub_marker = scope.path(sub, "");
                w.doc(&format!("{decl} (`None` when absent)."));
                w.line("#[inline]");
                w.open_fn(
                    &format!("pub fn {getter}"),
                    &["&self".to_owned()],
                    &format!("Option<{sub_view}<'a>>"),
                );
                w.open(format!("if {}", cond.pos));
                w.chain(
                    &format!("{rt}::message_at(&self.0, {off}, {sub_marker}::TYPE_INDEX)"),
                    &[format!(".map({sub_view})")],
                    "",
                );
                w.close_with(" else {");
                w.indent();
                w.line("None");
                w.close();
                w.close();
            }
            Kind::String => {
                let default = gen.ts().default_bytes(&f.field);
                let default = match std::str::from_utf8(default) {
                    Ok(s) => format!("{s:?}"),
                    Err(_) => "\"\"".to_owned(),
                };
                let device = names.claim_avoiding(joined(&snake(&f.name), "_device"), &wanted);
                w.doc(&decl);
                w.doc(&device_note(&device));
                w.line("#[inline]");
                w.open(format!("pub fn {getter}(&self) -> &'a str"));
                w.if_else(&cond.pos, &format!("{rt}::str_at(&self.0, {off})"), &default);
                w.close();
                let raw = names.claim(joined(&snake(&f.name), "_bytes"));
                let raw_default = match gen.ts().default_bytes(&f.field) {
                    [] => "&[]".to_owned(),
                    d => byte_literal(d),
                };
                w.blank();
                w.doc(&format!("{decl}, as raw bytes (a device-placed field reads as empty)."));
                w.line("#[inline]");
                w.open(format!("pub fn {raw}(&self) -> &'a [u8]"));
                w.if_else(&cond.pos, &format!("{rt}::bytes_at(&self.0, {off})"), &raw_default);
                w.close();
                device_getter(w, &rt, &decl, &device, &cond, off);
            }
            Kind::Bytes => {
                let default = match gen.ts().default_bytes(&f.field) {
                    [] => "&[]".to_owned(),
                    d => byte_literal(d),
                };
                let device = names.claim_avoiding(joined(&snake(&f.name), "_device"), &wanted);
                w.doc(&decl);
                w.doc(&device_note(&device));
                w.line("#[inline]");
                w.open(format!("pub fn {getter}(&self) -> &'a [u8]"));
                w.if_else(&cond.pos, &format!("{rt}::bytes_at(&self.0, {off})"), &default);
                w.close();
                device_getter(w, &rt, &decl, &device, &cond, off);
            }
            Kind::Bool => {
                let default = f.field.default != 0;
                w.doc(&decl);
                w.line("#[inline]");
                w.open(format!("pub fn {getter}(&self) -> bool"));
                let read = read_scalar(Kind::Bool, off);
                if default {
                    w.line(format!("{} || {read}", cond.neg));
                } else {
                    w.line(format!("{} && {read}", cond.pos));
                }
                w.close();
            }
            k => {
                let ty = scalar_type(k);
                let default = scalar_default(k, f.field.default);
                let enum_note = if k == Kind::Enum {
                    format!(" (convert with `{}::try_from`)", scope.path(gen.field_type(f)?, ""))
                } else {
                    String::new()
                };
                w.doc(&format!("{decl}{enum_note}"));
                w.line("#[inline]");
                w.open(format!("pub fn {getter}(&self) -> {ty}"));
                w.if_else(&cond.pos, &read_scalar(k, off), &default);
                w.close();
            }
        }
        if f.has_presence() {
            let has = names.claim(joined("has_", &snake(&f.name)));
            w.blank();
            w.doc(&format!("Whether {decl} is present."));
            w.line("#[inline]");
            w.open(format!("pub fn {has}(&self) -> bool"));
            if f.kind().is_message() {
                w.line(format!("self.{getter}().is_some()"));
            } else {
                w.line(cond.pos.clone());
            }
            w.close();
        }
    }
    Ok(())
}

/// The note on a `string` / `bytes` accessor about device placement.
fn device_note(device: &str) -> String {
    format!(
        "\n\
         A field a target-aware decode placed in the device region (RPCAcc's\n\
         placement bit, `Decoder::decode_placed`) is not in the block: unless the\n\
         view's `Source` has that region, this reads as empty (presence still\n\
         reports it set) and [`Self::{device}`] gives the device reference."
    )
}

/// `<field>_device()`: the device reference of a `string` / `bytes` field.
fn device_getter(w: &mut CodeWriter, rt: &str, decl: &str, device: &str, cond: &Cond, off: u32) {
    w.blank();
    w.doc(&format!(
        "{decl}: its device handle.\n\
         \n\
         The reference into the device region when the field is present and a\n\
         target-aware decode placed it there (RPCAcc's placement bit,\n\
         `Decoder::decode_placed`); `None` otherwise (absent, or in the block)."
    ));
    w.line("#[inline]");
    w.open(format!("pub fn {device}(&self) -> Option<::protoplane_wire::Ref>"));
    w.if_else(&cond.pos, &format!("{rt}::device_ref_at(&self.0, {off})"), "None");
    w.close();
}

/// Whether a oneof's enum needs the `'a` lifetime (a member borrows the block).
fn oneof_borrows(info: &MessageInfo, o: usize) -> bool {
    info.oneofs[o].members.iter().any(|&i| !info.fields[i].kind().is_scalar())
}

/// The type of a oneof member's payload in the oneof enum.
fn member_type(gen: &Generator<'_>, scope: &Scope, f: &FieldInfo) -> Result<String, Error> {
    elem_type(gen, scope, &f.field, None)
}

/// The Rust name of oneof `o`'s enum.
fn oneof_enum_name(info: &MessageInfo, o: usize) -> String {
    format!("{}Oneof", camel(&info.oneofs[o].name))
}

/// The getter returning a oneof's set member.
fn oneof_getter(
    w: &mut CodeWriter,
    gen: &Generator<'_>,
    scope: &Scope,
    inner: &Scope,
    info: &MessageInfo,
    o: usize,
    names: &mut Names,
) -> Result<(), Error> {
    let rt = scope.rt();
    let oneof = &info.oneofs[o];
    let getter = names.claim(ident(&snake(&oneof.name)));
    let module = inner.module.last().cloned().unwrap_or_default();
    let enum_name = format!("{module}::{}", oneof_enum_name(info, o));
    let lt = if oneof_borrows(info, o) { "<'a>" } else { "" };
    w.blank();
    let refs =
        oneof.members.iter().any(|&i| matches!(info.fields[i].kind(), Kind::String | Kind::Bytes));
    let note = if refs {
        "\n\nA `string` / `bytes` member placed in the device region reads as empty (its\n\
         `_device` getter gives the handle)."
    } else {
        ""
    };
    w.doc(&format!("Oneof `{}`: the member that is set (`None`: none).{note}", oneof.name));
    w.line("#[inline]");
    w.open_fn(
        &format!("pub fn {getter}"),
        &["&self".to_owned()],
        &format!("Option<{enum_name}{lt}>"),
    );
    w.open(format!("match self.0.slot_u32({})", oneof.case_offset));
    for &i in &oneof.members {
        let f = &info.fields[i];
        let variant = ident(&camel(&f.name));
        let off = f.field.offset;
        let n = f.field.number;
        match f.kind() {
            Kind::Message | Kind::Group => {
                let sub = gen.field_type(f)?;
                let sub_view = scope.path(sub, "View");
                let sub_marker = scope.path(sub, "");
                let read = format!("{rt}::message_at(&self.0, {off}, {sub_marker}::TYPE_INDEX)");
                let wrap = format!(".map(|v| {enum_name}::{variant}({sub_view}(v))),");
                let one = format!("{n} => {read}{wrap}");
                if w.depth() * 4 + one.len() <= 100 {
                    w.line(one);
                } else {
                    w.line(format!("{n} => {read}"));
                    w.line(format!("    {wrap}"));
                }
            }
            Kind::String => {
                w.line(format!(
                    "{n} => Some({enum_name}::{variant}({rt}::str_at(&self.0, {off}))),"
                ));
            }
            Kind::Bytes => {
                w.line(format!(
                    "{n} => Some({enum_name}::{variant}({rt}::bytes_at(&self.0, {off}))),"
                ));
            }
            k => {
                w.line(format!("{n} => Some({enum_name}::{variant}({})),", read_scalar(k, off)));
            }
        }
    }
    w.line("_ => None,");
    w.close();
    w.close();
    Ok(())
}

/// The enum of oneof `o`'s members (emitted into the message's module).
pub(crate) fn oneof_enum(
    w: &mut CodeWriter,
    gen: &Generator<'_>,
    inner: &Scope,
    info: &MessageInfo,
    o: usize,
) -> Result<(), Error> {
    let oneof = &info.oneofs[o];
    let name = oneof_enum_name(info, o);
    let lt = if oneof_borrows(info, o) { "<'a>" } else { "" };
    w.doc(&format!("The members of oneof `{}` of `{}`.", oneof.name, info.full_name));
    w.line("#[derive(Clone, Copy, Debug)]");
    w.line("#[allow(clippy::enum_variant_names)] // the .proto's names");
    w.open(format!("pub enum {name}{lt}"));
    for &i in &oneof.members {
        let f = &info.fields[i];
        w.doc(&declaration(gen, f));
        w.line(format!("{}({}),", ident(&camel(&f.name)), member_type(gen, inner, f)?));
    }
    w.close();
    Ok(())
}
