//! Protobuf's text format (<https://protobuf.dev/reference/protobuf/textformat-spec/>),
//! both ways, over views and builders: what logs, golden files, grpcurl
//! and `protoc --decode` speak.
//!
//! Printing follows protobuf C++'s `TextFormat::Printer` in its default
//! form: one `name: value` per line, messages as `name {` … `}` indented
//! by two spaces, fields in number order, then extensions (`[pkg.ext]`),
//! then (when asked) unknown fields by number. Groups and editions'
//! group-like delimited fields print under their type's name (`Data {`),
//! an `Any` whose type is loaded in its expanded form
//! (`[type.googleapis.com/pkg.T] { … }`), strings with C escapes
//! (valid UTF-8 in a `string` field as it is, other bytes octal), floats
//! in the shortest form that reads back the same, `inf`, `-inf`, `nan`.
//!
//! Parsing accepts what protobuf's parsers accept: `:` optional before a
//! message, `{}` or `<>` around one, `,` or `;` after any field, `[a, b]`
//! lists for repeated fields, adjacent string literals concatenated, C,
//! octal, hex and Unicode escapes, integers in decimal, hex and octal,
//! enums by name or number, `t`/`f`/`True`/`False` for bools, `#`
//! comments, a group by its type name or its field name, extensions and
//! expanded `Any`s in brackets. It refuses what they refuse: an unknown
//! name, a value out of its type's range, a singular field or a second
//! oneof member given twice, a surrogate or a code point past U+10FFFF
//! in an escape, a string field that is not UTF-8, a missing required
//! field.

use std::fmt::Write as _;

use protoplane_schema::{Field, FieldFlags, Kind, MessageFlags, TableSet};

use crate::builder::{Builder, MessageBuilder};
use crate::error::BlockError;
use crate::extensions::{self, Raw};
use crate::view::{MessageView, Value};
use crate::{Block, DecodeOptions, EncodeOptions, Source};

/// Nesting deeper than this is refused, printing and parsing.
const MAX_DEPTH: u32 = 100;

/// How to print.
#[derive(Clone, Copy, Debug, Default)]
pub struct TextOptions {
    /// Print unknown fields too, by number (`1001: 5`, `1003 { 1: 2 }`).
    pub print_unknown_fields: bool,
}

/// Why a message could not be printed as text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrintError {
    /// The block is malformed.
    Block(BlockError),
    /// An extension's or unknown field's bytes do not parse.
    Malformed,
}

impl From<BlockError> for PrintError {
    fn from(e: BlockError) -> Self {
        PrintError::Block(e)
    }
}

impl std::fmt::Display for PrintError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PrintError::Block(e) => e.fmt(f),
            PrintError::Malformed => f.write_str("unknown-field bytes that do not parse"),
        }
    }
}

impl std::error::Error for PrintError {}

/// A text that does not parse, or does not fit the schema: what and where
/// (1-based line and column).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextError {
    pub line: u32,
    pub column: u32,
    pub message: String,
}

impl std::fmt::Display for TextError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.column, self.message)
    }
}

impl std::error::Error for TextError {}

// ---------------------------------------------------------------------------
// Printing.

/// Appends the text form of a message to `out`.
pub fn to_text(view: &MessageView<'_>, out: &mut String) -> Result<(), PrintError> {
    to_text_with(view, out, &TextOptions::default())
}

/// [`to_text`] with options.
pub fn to_text_with(
    view: &MessageView<'_>,
    out: &mut String,
    opts: &TextOptions,
) -> Result<(), PrintError> {
    Printer { out, opts: *opts }.message(view, 0)
}

struct Printer<'o> {
    out: &'o mut String,
    opts: TextOptions,
}

/// The name a field prints under: a group's (and a group-like delimited
/// field's) type name, any other field's own name.
fn text_name<'t>(ts: &'t TableSet, f: &Field) -> &'t str {
    let name = ts.str(f.name);
    if f.kind == Kind::Group {
        let ty = ts.message_name(f.sub);
        let short = ty.rsplit('.').next().unwrap_or(ty);
        if short.eq_ignore_ascii_case(name) {
            return short;
        }
    }
    name
}

impl Printer<'_> {
    fn indent(&mut self, depth: u32) {
        for _ in 0..depth {
            self.out.push_str("  ");
        }
    }

    fn message(&mut self, view: &MessageView<'_>, depth: u32) -> Result<(), PrintError> {
        if depth > MAX_DEPTH {
            return Err(BlockError::TooDeep.into());
        }
        let ts = view.tables();
        if ts.message_name(view.type_index()) == "google.protobuf.Any" && self.any(view, depth)? {
            return Ok(());
        }
        for f in view.fields() {
            if !view.has(f) {
                continue;
            }
            let name = text_name(ts, f);
            if f.is_repeated() {
                let rep = view.repeated(f)?;
                for i in 0..rep.len() {
                    self.field(ts, f, name, rep.get(i)?, depth)?;
                }
            } else if let Some(v) = view.get(f)? {
                self.field(ts, f, name, v, depth)?;
            }
        }
        let exts = ts.extensions(view.type_index());
        if !exts.is_empty() || self.opts.print_unknown_fields {
            let unknown = view.unknown_fields()?;
            for x in exts {
                let f = &x.field;
                let name = format!("[{}]", ts.str(f.name));
                for raw in extensions::values(f, unknown).map_err(|_| PrintError::Malformed)? {
                    match raw {
                        Raw::Bits(bits) => {
                            self.field(ts, f, &name, extensions::scalar(f.kind, bits), depth)?
                        }
                        Raw::Bytes(b) if f.kind == Kind::String => {
                            self.field(ts, f, &name, Value::String(b), depth)?
                        }
                        Raw::Bytes(b) => self.field(ts, f, &name, Value::Bytes(b), depth)?,
                        Raw::Message(body) => {
                            let block = crate::decode(ts, f.sub, &body, &DecodeOptions::default())
                                .map_err(|_| PrintError::Malformed)?;
                            let sub = MessageView::new(ts, Source::owned(block.as_bytes()), f.sub)?;
                            self.field(ts, f, &name, Value::Message(sub), depth)?;
                        }
                    }
                }
            }
            if self.opts.print_unknown_fields {
                let known: Vec<u32> = exts.iter().map(|x| x.field.number).collect();
                self.unknown(unknown, &known, depth)?;
            }
        }
        Ok(())
    }

    /// An `Any` whose type is loaded and whose value decodes: printed
    /// expanded. `false`: print it as the ordinary message it also is.
    fn any(&mut self, view: &MessageView<'_>, depth: u32) -> Result<bool, PrintError> {
        let ts = view.tables();
        let url = view.by_number(1)?.and_then(|v| v.as_str()).unwrap_or("");
        let value = view.by_number(2)?.and_then(|v| v.as_bytes()).unwrap_or(&[]);
        let Some(ty) = url.rsplit_once('/').and_then(|(_, name)| ts.message_by_name(name)) else {
            return Ok(false);
        };
        let Ok(block) = crate::decode(ts, ty, value, &DecodeOptions::default()) else {
            return Ok(false);
        };
        let inner = MessageView::new(ts, Source::owned(block.as_bytes()), ty)?;
        self.indent(depth);
        let _ = writeln!(self.out, "[{url}] {{");
        self.message(&inner, depth + 1)?;
        self.indent(depth);
        self.out.push_str("}\n");
        Ok(true)
    }

    fn field(
        &mut self,
        ts: &TableSet,
        f: &Field,
        name: &str,
        v: Value<'_>,
        depth: u32,
    ) -> Result<(), PrintError> {
        self.indent(depth);
        self.out.push_str(name);
        if let Value::Message(m) = v {
            self.out.push_str(" {\n");
            self.message(&m, depth + 1)?;
            self.indent(depth);
            self.out.push_str("}\n");
            return Ok(());
        }
        self.out.push_str(": ");
        scalar_text(self.out, ts, f, v);
        self.out.push('\n');
        Ok(())
    }

    /// Unknown fields by number, skipping the extensions printed by name.
    /// A length-delimited one that parses as fields prints as a message
    /// (protobuf's printers guess the same way).
    fn unknown(&mut self, bytes: &[u8], skip: &[u32], depth: u32) -> Result<(), PrintError> {
        if depth > MAX_DEPTH {
            return Err(BlockError::TooDeep.into());
        }
        let mut pos = 0;
        while pos < bytes.len() {
            let (number, item) = unknown_item(bytes, &mut pos).ok_or(PrintError::Malformed)?;
            if skip.contains(&number) {
                continue;
            }
            self.indent(depth);
            match item {
                Unknown::Varint(v) => {
                    let _ = writeln!(self.out, "{number}: {v}");
                }
                Unknown::Fixed32(v) => {
                    let _ = writeln!(self.out, "{number}: 0x{v:08x}");
                }
                Unknown::Fixed64(v) => {
                    let _ = writeln!(self.out, "{number}: 0x{v:016x}");
                }
                Unknown::Len(b) if !b.is_empty() && parses_as_fields(b, 0) => {
                    let _ = writeln!(self.out, "{number} {{");
                    self.unknown(b, &[], depth + 1)?;
                    self.indent(depth);
                    self.out.push_str("}\n");
                }
                Unknown::Len(b) => {
                    let _ = write!(self.out, "{number}: ");
                    write_quoted(self.out, b, false);
                    self.out.push('\n');
                }
                Unknown::Group(b) => {
                    let _ = writeln!(self.out, "{number} {{");
                    self.unknown(b, &[], depth + 1)?;
                    self.indent(depth);
                    self.out.push_str("}\n");
                }
            }
        }
        Ok(())
    }
}

enum Unknown<'a> {
    Varint(u64),
    Fixed32(u32),
    Fixed64(u64),
    Len(&'a [u8]),
    Group(&'a [u8]),
}

/// The next unknown field in `b` at `pos`: its number and value.
fn unknown_item<'a>(b: &'a [u8], pos: &mut usize) -> Option<(u32, Unknown<'a>)> {
    let tag = crate::varint::read(b, pos).ok()?;
    let number = u32::try_from(tag >> 3).ok().filter(|&n| n != 0)?;
    let take = |pos: &mut usize, n: usize| -> Option<&'a [u8]> {
        let end = pos.checked_add(n).filter(|&e| e <= b.len())?;
        let s = &b[*pos..end];
        *pos = end;
        Some(s)
    };
    let item = match tag & 7 {
        0 => Unknown::Varint(crate::varint::read(b, pos).ok()?),
        1 => Unknown::Fixed64(u64::from_le_bytes(take(pos, 8)?.try_into().ok()?)),
        5 => Unknown::Fixed32(u32::from_le_bytes(take(pos, 4)?.try_into().ok()?)),
        2 => {
            let n = usize::try_from(crate::varint::read(b, pos).ok()?).ok()?;
            Unknown::Len(take(pos, n)?)
        }
        3 => {
            // The body runs to the matching end tag.
            let start = *pos;
            let mut depth = 0u32;
            loop {
                let at = *pos;
                let n = crate::varint::read(b, pos).ok()?;
                match n & 7 {
                    0 => {
                        crate::varint::read(b, pos).ok()?;
                    }
                    1 => {
                        take(pos, 8)?;
                    }
                    5 => {
                        take(pos, 4)?;
                    }
                    2 => {
                        let len = usize::try_from(crate::varint::read(b, pos).ok()?).ok()?;
                        take(pos, len)?;
                    }
                    3 => depth = depth.checked_add(1).filter(|&d| d <= MAX_DEPTH)?,
                    4 if depth == 0 => {
                        if n >> 3 != number as u64 {
                            return None;
                        }
                        break Unknown::Group(&b[start..at]);
                    }
                    4 => depth -= 1,
                    _ => return None,
                }
            }
        }
        _ => return None,
    };
    Some((number, item))
}

/// Whether `b` is a sequence of well-formed fields.
fn parses_as_fields(b: &[u8], depth: u32) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    let mut pos = 0;
    while pos < b.len() {
        if unknown_item(b, &mut pos).is_none() {
            return false;
        }
    }
    true
}

fn scalar_text(out: &mut String, ts: &TableSet, f: &Field, v: Value<'_>) {
    match v {
        Value::Bool(b) => out.push_str(if b { "true" } else { "false" }),
        Value::I32(x) => {
            let _ = write!(out, "{x}");
        }
        Value::U32(x) => {
            let _ = write!(out, "{x}");
        }
        Value::I64(x) => {
            let _ = write!(out, "{x}");
        }
        Value::U64(x) => {
            let _ = write!(out, "{x}");
        }
        Value::F32(x) => write_float(out, x as f64, || format!("{x}"), || format!("{x:e}")),
        Value::F64(x) => write_float(out, x, || format!("{x}"), || format!("{x:e}")),
        Value::Enum(n) => match ts.enum_value_name(ts.enum_type(f.sub), n) {
            Some(name) => out.push_str(name),
            None => {
                let _ = write!(out, "{n}");
            }
        },
        Value::String(b) => write_quoted(out, b, true),
        Value::Bytes(b) => write_quoted(out, b, false),
        Value::Message(_) => {}
    }
}

/// A float in the shortest form that reads back the same (Rust's `{}` and
/// `{:e}` both are), with an exponent when plain digits would run long.
fn write_float(out: &mut String, x: f64, plain: impl Fn() -> String, exp: impl Fn() -> String) {
    if x.is_nan() {
        out.push_str("nan");
    } else if x.is_infinite() {
        out.push_str(if x > 0.0 { "inf" } else { "-inf" });
    } else if x != 0.0 && !(1e-5..1e16).contains(&x.abs()) {
        out.push_str(&exp());
    } else {
        out.push_str(&plain());
    }
}

/// A string literal: C escapes; in a `string` field valid UTF-8 stays as
/// it is, anything else past ASCII is escaped in octal.
fn write_quoted(out: &mut String, b: &[u8], utf8: bool) {
    out.push('"');
    let text = if utf8 { std::str::from_utf8(b).ok() } else { None };
    let escape = |c: u8, out: &mut String| match c {
        b'\n' => out.push_str("\\n"),
        b'\r' => out.push_str("\\r"),
        b'\t' => out.push_str("\\t"),
        b'"' => out.push_str("\\\""),
        b'\'' => out.push_str("\\'"),
        b'\\' => out.push_str("\\\\"),
        0x20..=0x7e => out.push(c as char),
        _ => {
            let _ = write!(out, "\\{c:03o}");
        }
    };
    match text {
        Some(s) => {
            for ch in s.chars() {
                if ch.is_ascii() {
                    escape(ch as u8, out);
                } else {
                    out.push(ch);
                }
            }
        }
        None => b.iter().for_each(|&c| escape(c, out)),
    }
    out.push('"');
}

// ---------------------------------------------------------------------------
// Parsing.

/// Builds a block of `type_index` from its text form.
pub fn from_text(ts: &TableSet, type_index: u32, text: &str) -> Result<Block, TextError> {
    let mut p = Parser { ts, src: text.as_bytes(), pos: 0 };
    let mut b = Builder::new(ts, type_index).map_err(|e| p.error(e.to_string()))?;
    let root = b.root();
    p.message(&mut b, root, None, 0)?;
    let block = b.finish();
    // Like protobuf's parser: a message missing a required field is no message.
    if ts.messages().iter().any(|m| m.flags.has(MessageFlags::HAS_REQUIRED)) {
        let view = MessageView::new(ts, Source::owned(block.as_bytes()), type_index)
            .map_err(|e| p.error(e.to_string()))?;
        if let Ok(Some((ty, number))) = view.missing_required(MAX_DEPTH) {
            let m = ts.message(ty);
            let name = ts.fields(m).iter().find(|f| f.number == number).map(|f| ts.str(f.name));
            return Err(TextError {
                line: 1,
                column: 1,
                message: format!(
                    "{}: required field {} is missing",
                    ts.message_name(ty),
                    name.unwrap_or("?")
                ),
            });
        }
    }
    Ok(block)
}

/// One token.
#[derive(Clone, Debug, PartialEq)]
enum Tok<'a> {
    Ident(&'a str),
    /// A number's text (sign not included).
    Number(&'a str),
    /// A string literal's text between its quotes (escapes not yet read).
    Str(&'a [u8]),
    Sym(u8),
    End,
}

struct Parser<'t, 's> {
    ts: &'t TableSet,
    src: &'s [u8],
    pos: usize,
}

impl<'t, 's> Parser<'t, 's> {
    fn error_at(&self, at: usize, message: String) -> TextError {
        let before = &self.src[..at.min(self.src.len())];
        let line = before.iter().filter(|&&c| c == b'\n').count() as u32 + 1;
        let column = (before.len() - before.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1))
            as u32
            + 1;
        TextError { line, column, message }
    }

    fn error(&self, message: String) -> TextError {
        self.error_at(self.pos, message)
    }

    fn skip_space(&mut self) {
        while let Some(&c) = self.src.get(self.pos) {
            if c.is_ascii_whitespace() {
                self.pos += 1;
            } else if c == b'#' {
                while self.src.get(self.pos).is_some_and(|&c| c != b'\n') {
                    self.pos += 1;
                }
            } else {
                break;
            }
        }
    }

    /// The next token, without consuming it (its end is returned beside it).
    fn peek(&mut self) -> Result<(Tok<'s>, usize), TextError> {
        self.skip_space();
        let src = self.src;
        let start = self.pos;
        let Some(&c) = src.get(start) else { return Ok((Tok::End, start)) };
        let mut i = start;
        let tok = if c.is_ascii_alphabetic() || c == b'_' {
            while src.get(i).is_some_and(|&c| c.is_ascii_alphanumeric() || c == b'_') {
                i += 1;
            }
            Tok::Ident(std::str::from_utf8(&src[start..i]).unwrap_or(""))
        } else if c.is_ascii_digit()
            || (c == b'.' && src.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            let hex = src[i..].starts_with(b"0x") || src[i..].starts_with(b"0X");
            while let Some(&d) = src.get(i) {
                let exponent_sign =
                    (d == b'+' || d == b'-') && !hex && matches!(src[i - 1], b'e' | b'E');
                if !(d.is_ascii_alphanumeric() || d == b'.' || d == b'_' || exponent_sign) {
                    break;
                }
                i += 1;
            }
            Tok::Number(std::str::from_utf8(&src[start..i]).unwrap_or(""))
        } else if c == b'"' || c == b'\'' {
            i += 1;
            loop {
                match src.get(i) {
                    None | Some(b'\n') => {
                        return Err(self.error_at(start, "a string that never ends".into()))
                    }
                    Some(b'\\') => i += 2,
                    Some(&q) if q == c => break,
                    Some(_) => i += 1,
                }
            }
            i += 1;
            Tok::Str(&src[start + 1..i - 1])
        } else {
            i += 1;
            Tok::Sym(c)
        };
        Ok((tok, i))
    }

    fn next(&mut self) -> Result<Tok<'s>, TextError> {
        let (tok, end) = self.peek()?;
        self.pos = end;
        Ok(tok)
    }

    /// Consumes symbol `c` if it comes next.
    fn eat(&mut self, c: u8) -> Result<bool, TextError> {
        let (tok, end) = self.peek()?;
        if tok == Tok::Sym(c) {
            self.pos = end;
            return Ok(true);
        }
        Ok(false)
    }

    fn expect(&mut self, c: u8) -> Result<(), TextError> {
        if !self.eat(c)? {
            return Err(self.error(format!("expected '{}'", c as char)));
        }
        Ok(())
    }

    /// A message's fields, up to `close` (`}` or `>`), or to the end of the
    /// text for the outermost one.
    fn message(
        &mut self,
        b: &mut Builder<'t>,
        at: MessageBuilder,
        close: Option<u8>,
        depth: u32,
    ) -> Result<(), TextError> {
        if depth > MAX_DEPTH {
            return Err(self.error("nesting too deep".into()));
        }
        let ts = self.ts;
        let ty = at.type_index();
        let msg = ts.message(ty);
        // Singular fields and oneofs given so far (each only once).
        let mut seen: Vec<u32> = Vec::new();
        let mut oneofs: Vec<u32> = Vec::new();
        loop {
            self.skip_space();
            let start = self.pos;
            let tok = self.next()?;
            match (tok, close) {
                (Tok::End, None) => return Ok(()),
                (Tok::End, Some(c)) => {
                    return Err(self.error(format!("expected '{}' before the end", c as char)))
                }
                (Tok::Sym(c), Some(want)) if c == want => return Ok(()),
                (Tok::Sym(b'['), _) => {
                    self.bracketed(b, at, start, depth)?;
                }
                (Tok::Ident(name), _) => {
                    let f = ts
                        .fields(msg)
                        .iter()
                        .find(|f| {
                            ts.str(f.name) == name
                                || (f.kind == Kind::Group && text_name(ts, f) == name)
                        })
                        .ok_or_else(|| {
                            self.error_at(
                                start,
                                format!("{} has no field named \"{name}\"", ts.message_name(ty)),
                            )
                        })?;
                    if !f.is_repeated() {
                        if seen.contains(&f.number) {
                            return Err(self.error_at(
                                start,
                                format!(
                                    "non-repeated field \"{name}\" is specified multiple times"
                                ),
                            ));
                        }
                        seen.push(f.number);
                    }
                    if f.flags.has(FieldFlags::ONEOF) {
                        if oneofs.contains(&f.presence) {
                            return Err(self.error_at(
                                start,
                                format!("field \"{name}\" is a second member of its oneof"),
                            ));
                        }
                        oneofs.push(f.presence);
                    }
                    self.field_value(b, at, f, depth)?;
                }
                (other, _) => {
                    return Err(self.error_at(
                        start,
                        format!("expected a field name, found {}", describe(&other)),
                    ))
                }
            }
            // An optional separator after each field.
            if !self.eat(b',')? {
                self.eat(b';')?;
            }
        }
    }

    /// `[pkg.ext]: value` or, in an `Any`, `[type.googleapis.com/pkg.T] { … }`.
    fn bracketed(
        &mut self,
        b: &mut Builder<'t>,
        at: MessageBuilder,
        start: usize,
        depth: u32,
    ) -> Result<(), TextError> {
        let ts = self.ts;
        let mut name = String::new();
        loop {
            match self.next()? {
                Tok::Ident(s) | Tok::Number(s) => name.push_str(s),
                Tok::Sym(c @ (b'.' | b'/' | b'-')) => name.push(c as char),
                Tok::Sym(b']') => break,
                other => {
                    return Err(self
                        .error(format!("expected a name in brackets, found {}", describe(&other))))
                }
            }
        }
        if name.contains('/') {
            if ts.message_name(at.type_index()) != "google.protobuf.Any" {
                return Err(self.error_at(start, format!("[{name}]: only an Any holds a type URL")));
            }
            let full = name.rsplit_once('/').map(|(_, n)| n).unwrap_or("");
            let ty = ts
                .message_by_name(full)
                .ok_or_else(|| self.error_at(start, format!("[{name}]: no message type {full}")))?;
            self.eat(b':')?;
            let value = self.encoded_message(ty, depth)?;
            b.set(at, 1, Value::String(name.as_bytes())).map_err(|e| self.error(e.to_string()))?;
            b.set(at, 2, Value::Bytes(&value)).map_err(|e| self.error(e.to_string()))?;
            return Ok(());
        }
        let x = ts.extension_by_name(at.type_index(), &name).ok_or_else(|| {
            self.error_at(
                start,
                format!("{} has no extension [{name}]", ts.message_name(at.type_index())),
            )
        })?;
        let f = x.field;
        let mut wire = Vec::new();
        let one = |p: &mut Self, wire: &mut Vec<u8>| -> Result<(), TextError> {
            if f.kind.is_message() {
                let body = p.encoded_message(f.sub, depth)?;
                extensions::push_message(wire, &f, &body);
            } else {
                let v = p.scalar(&f)?;
                if !extensions::push_scalar(wire, &f, &v.as_value()) {
                    return Err(p.error(format!("[{name}]: a value that does not fit")));
                }
            }
            Ok(())
        };
        let colon = self.eat(b':')?;
        if !colon && !f.kind.is_message() {
            return Err(self.error(format!("expected ':' after [{name}]")));
        }
        if f.is_repeated() && self.eat(b'[')? {
            if !self.eat(b']')? {
                loop {
                    one(self, &mut wire)?;
                    if self.eat(b']')? {
                        break;
                    }
                    self.expect(b',')?;
                }
            }
        } else {
            one(self, &mut wire)?;
        }
        b.push_unknown(at, &wire).map_err(|e| self.error(e.to_string()))
    }

    /// A message of type `ty` in `{}` or `<>`, parsed into a block of its
    /// own and encoded (an `Any`'s value, an extension's).
    fn encoded_message(&mut self, ty: u32, depth: u32) -> Result<Vec<u8>, TextError> {
        let close = self.open()?;
        let mut inner = Builder::new(self.ts, ty).map_err(|e| self.error(e.to_string()))?;
        let root = inner.root();
        self.message(&mut inner, root, Some(close), depth + 1)?;
        crate::encode(self.ts, ty, inner.finish().as_bytes(), &EncodeOptions::default())
            .map_err(|e| self.error(e.to_string()))
    }

    /// `{` or `<`: returns the matching close.
    fn open(&mut self) -> Result<u8, TextError> {
        match self.next()? {
            Tok::Sym(b'{') => Ok(b'}'),
            Tok::Sym(b'<') => Ok(b'>'),
            other => Err(self.error(format!("expected '{{' or '<', found {}", describe(&other)))),
        }
    }

    /// After a field's name: `: value`, `[values]`, or a message.
    fn field_value(
        &mut self,
        b: &mut Builder<'t>,
        at: MessageBuilder,
        f: &Field,
        depth: u32,
    ) -> Result<(), TextError> {
        let colon = self.eat(b':')?;
        if !colon && !f.kind.is_message() {
            return Err(self.error(format!("expected ':' after \"{}\"", self.ts.str(f.name))));
        }
        if f.is_repeated() && self.eat(b'[')? {
            if self.eat(b']')? {
                return Ok(());
            }
            loop {
                self.one_value(b, at, f, depth)?;
                if self.eat(b']')? {
                    return Ok(());
                }
                self.expect(b',')?;
            }
        }
        self.one_value(b, at, f, depth)
    }

    fn one_value(
        &mut self,
        b: &mut Builder<'t>,
        at: MessageBuilder,
        f: &Field,
        depth: u32,
    ) -> Result<(), TextError> {
        self.skip_space();
        let start = self.pos;
        let built = |e: crate::BuildError, p: &Self| p.error_at(start, e.to_string());
        if f.kind.is_message() {
            let close = self.open()?;
            let sub = b.message(at, f.number).map_err(|e| built(e, self))?;
            return self.message(b, sub, Some(close), depth + 1);
        }
        let v = self.scalar(f)?;
        if f.is_repeated() {
            b.push(at, f.number, v.as_value()).map_err(|e| built(e, self))
        } else {
            b.set(at, f.number, v.as_value()).map_err(|e| built(e, self))
        }
    }

    /// One scalar, string, bytes or enum value of field `f`.
    fn scalar(&mut self, f: &Field) -> Result<Owned, TextError> {
        self.skip_space();
        let start = self.pos;
        let ts = self.ts;
        let bad = |p: &Self, what: &str| {
            p.error_at(
                start,
                format!("expected a value of type {}, found {what}", f.kind.proto_name()),
            )
        };
        match f.kind {
            Kind::String | Kind::Bytes => {
                let mut out = Vec::new();
                let mut any = false;
                while let (Tok::Str(raw), end) = self.peek()? {
                    let at = self.pos;
                    self.pos = end;
                    unescape(raw, &mut out).map_err(|e| self.error_at(at, e))?;
                    any = true;
                }
                if !any {
                    return Err(self.error("expected a string".into()));
                }
                if f.kind == Kind::String {
                    if f.flags.has(FieldFlags::UTF8) && std::str::from_utf8(&out).is_err() {
                        return Err(
                            self.error_at(start, "a string field holds invalid UTF-8".into())
                        );
                    }
                    return Ok(Owned::String(out));
                }
                Ok(Owned::Bytes(out))
            }
            _ => {
                let negative = self.eat(b'-')?;
                let tok = self.next()?;
                let text = match tok {
                    Tok::Number(s) | Tok::Ident(s) => s,
                    other => return Err(bad(self, &describe(&other))),
                };
                let shown = if negative { format!("-{text}") } else { text.to_owned() };
                let v = match f.kind {
                    Kind::Float | Kind::Double => {
                        let x = parse_float(text).ok_or_else(|| bad(self, &shown))?;
                        let x = if negative { -x } else { x };
                        if f.kind == Kind::Float {
                            Value::F32(x as f32)
                        } else {
                            Value::F64(x)
                        }
                    }
                    Kind::Bool => match (negative, text) {
                        (false, "true" | "True" | "t" | "1") => Value::Bool(true),
                        (false, "false" | "False" | "f" | "0") => Value::Bool(false),
                        _ => return Err(bad(self, &shown)),
                    },
                    Kind::Enum => {
                        let e = ts.enum_type(f.sub);
                        let n = match tok {
                            Tok::Ident(name) if !negative => {
                                ts.enum_value_by_name(e, name).ok_or_else(|| bad(self, &shown))?
                            }
                            _ => {
                                let n = parse_int(text, negative)
                                    .and_then(|n| i32::try_from(n).ok())
                                    .ok_or_else(|| bad(self, &shown))?;
                                if e.closed && !ts.enum_contains(e, n) {
                                    return Err(bad(self, &shown));
                                }
                                n
                            }
                        };
                        Value::Enum(n)
                    }
                    _ => {
                        let n = parse_int(text, negative).ok_or_else(|| bad(self, &shown))?;
                        let fit = |lo: i128, hi: i128| (lo..=hi).contains(&n);
                        match f.kind {
                            Kind::Int32 | Kind::SInt32 | Kind::SFixed32
                                if fit(i32::MIN as i128, i32::MAX as i128) =>
                            {
                                Value::I32(n as i32)
                            }
                            Kind::Int64 | Kind::SInt64 | Kind::SFixed64
                                if fit(i64::MIN as i128, i64::MAX as i128) =>
                            {
                                Value::I64(n as i64)
                            }
                            Kind::UInt32 | Kind::Fixed32 if fit(0, u32::MAX as i128) => {
                                Value::U32(n as u32)
                            }
                            Kind::UInt64 | Kind::Fixed64 if fit(0, u64::MAX as i128) => {
                                Value::U64(n as u64)
                            }
                            _ => return Err(bad(self, &shown)),
                        }
                    }
                };
                Ok(Owned::Scalar(v))
            }
        }
    }
}

/// A token as an error message shows it.
fn describe(tok: &Tok<'_>) -> String {
    match tok {
        Tok::Ident(s) => format!("\"{s}\""),
        Tok::Number(s) => (*s).to_owned(),
        Tok::Str(_) => "a string".to_owned(),
        Tok::Sym(c) => format!("'{}'", *c as char),
        Tok::End => "the end of the text".to_owned(),
    }
}

/// A parsed value that owns its bytes.
enum Owned {
    Scalar(Value<'static>),
    String(Vec<u8>),
    Bytes(Vec<u8>),
}

impl Owned {
    fn as_value(&self) -> Value<'_> {
        match self {
            Owned::Scalar(v) => *v,
            Owned::String(b) => Value::String(b),
            Owned::Bytes(b) => Value::Bytes(b),
        }
    }
}

/// An integer literal: decimal, `0x` hex or `0` octal (no float syntax).
fn parse_int(text: &str, negative: bool) -> Option<i128> {
    let (digits, radix) =
        if let Some(h) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
            (h, 16)
        } else if text.len() > 1 && text.starts_with('0') {
            (&text[1..], 8)
        } else {
            (text, 10)
        };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let v = u128::from_str_radix(digits, radix).ok()?;
    let v = i128::try_from(v).ok()?;
    Some(if negative { -v } else { v })
}

/// A float literal: decimal or integer syntax, an optional `f` suffix,
/// `inf`, `infinity`, `nan` in any case.
fn parse_float(text: &str) -> Option<f64> {
    let lower = text.to_ascii_lowercase();
    match lower.as_str() {
        "inf" | "infinity" => return Some(f64::INFINITY),
        "nan" => return Some(f64::NAN),
        _ => {}
    }
    if !text.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return None;
    }
    if lower.starts_with("0x") {
        return parse_int(text, false).map(|v| v as f64);
    }
    let body = lower.strip_suffix('f').unwrap_or(&lower);
    if body.is_empty()
        || body.contains(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | 'e' | '+' | '-')))
    {
        return None;
    }
    body.parse::<f64>().ok()
}

/// Reads a string literal's escapes into `out`.
fn unescape(raw: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let mut i = 0;
    while i < raw.len() {
        let c = raw[i];
        i += 1;
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let Some(&e) = raw.get(i) else { return Err("a lone backslash".into()) };
        i += 1;
        match e {
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'?' | b'\\' | b'\'' | b'"' => out.push(e),
            b'0'..=b'7' => {
                let mut v = (e - b'0') as u32;
                let mut n = 1;
                while n < 3 && raw.get(i).is_some_and(|d| (b'0'..=b'7').contains(d)) {
                    v = v * 8 + (raw[i] - b'0') as u32;
                    i += 1;
                    n += 1;
                }
                out.push(
                    u8::try_from(v).map_err(|_| format!("octal escape \\{v:o} is past a byte"))?,
                );
            }
            b'x' | b'X' => {
                let mut v = 0u32;
                let mut n = 0;
                while n < 2 && raw.get(i).is_some_and(u8::is_ascii_hexdigit) {
                    v = v * 16 + (raw[i] as char).to_digit(16).unwrap_or(0);
                    i += 1;
                    n += 1;
                }
                if n == 0 {
                    return Err("\\x without hex digits".into());
                }
                out.push(v as u8);
            }
            b'u' | b'U' => {
                let len = if e == b'u' { 4 } else { 8 };
                let digits = raw.get(i..i + len).ok_or("a short unicode escape")?;
                let text = std::str::from_utf8(digits).map_err(|_| "a bad unicode escape")?;
                let v = u32::from_str_radix(text, 16).map_err(|_| "a bad unicode escape")?;
                i += len;
                // A surrogate is never a character, alone or paired.
                let ch = char::from_u32(v)
                    .ok_or_else(|| format!("\\{} {text} is not a character", e as char))?;
                let mut buf = [0u8; 4];
                out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
            }
            other => return Err(format!("unknown escape \\{}", other as char)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_like_protobuf_reads_them() {
        assert_eq!(parse_int("0x1f", false), Some(31));
        assert_eq!(parse_int("017", false), Some(15));
        assert_eq!(parse_int("0", false), Some(0));
        assert_eq!(parse_int("9", true), Some(-9));
        assert_eq!(parse_int("1.5", false), None);
        assert_eq!(parse_int("08", false), None);
        assert_eq!(parse_float("1.5f"), Some(1.5));
        assert_eq!(parse_float("1e3"), Some(1000.0));
        assert_eq!(parse_float("Infinity"), Some(f64::INFINITY));
        assert!(parse_float("NaN").is_some_and(f64::is_nan));
        assert_eq!(parse_float("abc"), None);
        assert_eq!(parse_float("1e"), None);
    }

    #[test]
    fn escapes() {
        let mut out = Vec::new();
        unescape(br"\a\b\f\n\r\t\v\?\\\'\x41\101\u00e9\U0001F600", &mut out)
            .expect("the test's own input");
        assert_eq!(out, "\x07\x08\x0c\n\r\t\x0b?\\'AAé😀".as_bytes());
        for bad in [&br"\ud800"[..], br"\U00110000", br"\x", br"\q", br"\", br"\400"] {
            assert!(unescape(bad, &mut Vec::new()).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
