//! Protobuf editions (`edition = "2023"` and `"2024"`).
//!
//! An editions file says what proto2 and proto3 said with their syntax
//! through *features*: six of them decide how a field is encoded and
//! checked, and each is resolved from the edition's defaults down through
//! the file, the enclosing messages, the oneof and the field itself
//! (<https://protobuf.dev/editions/features/>):
//!
//! | feature | 2023/2024 default | table bit it sets |
//! |---|---|---|
//! | `field_presence` | `EXPLICIT` | `IMPLICIT` flag, or `Label::Required` for `LEGACY_REQUIRED` |
//! | `enum_type` | `OPEN` | the enum's `closed`, the field's `CLOSED_ENUM` |
//! | `repeated_field_encoding` | `PACKED` | `PACKED` |
//! | `utf8_validation` | `VERIFY` | `UTF8` |
//! | `message_encoding` | `LENGTH_PREFIXED` | `Kind::Group` for `DELIMITED` |
//! | `json_format` | `ALLOW` | (nothing: it only relaxes name checks) |
//!
//! so an editions schema lowers into exactly the tables a proto2 or proto3
//! schema with the same encoding would, and nothing past `lower.rs` knows
//! editions exist.
//!
//! Features reach [`lower`](crate::lower) the way `(protoplane.placement)`
//! does (see `options.rs`): `prost_types` has no `features` fields and no
//! `edition`, so the loaders find every `features` option in the raw
//! descriptor bytes ([`scan`]) and write it back as an *uninterpreted*
//! option named `features.<name>` ([`annotate`]), the form protoc itself
//! uses before it resolves options. A `FileDescriptorSet` built by hand can
//! state features the same way.
//!
//! `.proto` files: protox (the in-process compiler) parses proto2 and proto3
//! only, so [`to_proto2`] rewrites an editions file's text into the proto2
//! file that declares the same descriptors: `syntax = "proto2"` in place of
//! the edition, `optional` before every singular field (editions spell
//! none), reserved names quoted, `export`/`local` visibility dropped. The
//! feature options stay as written: protox interprets `features.*` against
//! its `descriptor.proto`, which declares them. Every edit keeps line
//! numbers, so protox's errors point at the user's lines.

use std::collections::HashMap;

use prost_types::uninterpreted_option::NamePart;
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorSet, UninterpretedOption};

use crate::lower::join;
use crate::options::{Item, Reader};
use crate::SchemaError;

/// `google.protobuf.Edition` numbers of the editions protoplane reads.
pub(crate) const EDITION_2023: u64 = 1000;
pub(crate) const EDITION_2024: u64 = 1001;

/// How a field tracks presence (`FeatureSet.field_presence`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Presence {
    Explicit,
    Implicit,
    LegacyRequired,
}

/// The resolved features protoplane's tables encode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Features {
    pub(crate) presence: Presence,
    pub(crate) closed_enum: bool,
    pub(crate) packed: bool,
    pub(crate) utf8: bool,
    pub(crate) delimited: bool,
}

impl Features {
    /// The defaults of editions 2023 and 2024 (they differ only in features
    /// that do not change the wire or JSON: naming style, symbol visibility,
    /// C++ and Java options).
    pub(crate) const EDITION_DEFAULTS: Features = Features {
        presence: Presence::Explicit,
        closed_enum: false,
        packed: true,
        utf8: true,
        delimited: false,
    };

    /// These features with the `features.*` options among `opts` applied
    /// (later ones win, like any option). `what` names the element for
    /// errors.
    pub(crate) fn with(
        mut self,
        opts: &[UninterpretedOption],
        what: &dyn Fn() -> String,
    ) -> Result<Features, SchemaError> {
        for o in opts {
            let [first, second] = o.name.as_slice() else { continue };
            if first.is_extension || first.name_part != "features" || second.is_extension {
                continue; // not ours, or a language's own features (`features.(pb.cpp)`)
            }
            let value = o.identifier_value.as_deref().unwrap_or("");
            let bad = || {
                SchemaError::Unsupported(format!(
                    "{}: features.{} = {value:?} is not a value of that feature",
                    what(),
                    second.name_part
                ))
            };
            match second.name_part.as_str() {
                "field_presence" => {
                    self.presence = match value {
                        "EXPLICIT" => Presence::Explicit,
                        "IMPLICIT" => Presence::Implicit,
                        "LEGACY_REQUIRED" => Presence::LegacyRequired,
                        _ => return Err(bad()),
                    }
                }
                "enum_type" => self.closed_enum = pick(value, "CLOSED", "OPEN").ok_or_else(bad)?,
                "repeated_field_encoding" => {
                    self.packed = pick(value, "PACKED", "EXPANDED").ok_or_else(bad)?
                }
                "utf8_validation" => self.utf8 = pick(value, "VERIFY", "NONE").ok_or_else(bad)?,
                "message_encoding" => {
                    self.delimited = pick(value, "DELIMITED", "LENGTH_PREFIXED").ok_or_else(bad)?
                }
                // json_format, enforce_naming_style, default_symbol_visibility:
                // checks protoc makes on names, nothing the tables hold.
                _ => {}
            }
        }
        Ok(self)
    }
}

/// `Some(true)` for `yes`, `Some(false)` for `no`, `None` otherwise.
fn pick(value: &str, yes: &str, no: &str) -> Option<bool> {
    if value == yes {
        Some(true)
    } else if value == no {
        Some(false)
    } else {
        None
    }
}

// ---------------------------------------------------------------------------
// Language features.

/// `google/protobuf/cpp_features.proto` as editions files import it, for
/// `features.(pb.cpp).…`: protoplane's declaration of the names and numbers
/// (the interface; protobuf's option annotations on them left out). The
/// tables do not use these C++ settings: a file that sets them compiles.
pub(crate) const CPP_FEATURES: (&str, &str) = (
    "google/protobuf/cpp_features.proto",
    r#"syntax = "proto2";
package pb;
import "google/protobuf/descriptor.proto";
extend google.protobuf.FeatureSet {
  optional CppFeatures cpp = 1000;
}
message CppFeatures {
  optional bool legacy_closed_enum = 1;
  enum StringType {
    STRING_TYPE_UNKNOWN = 0;
    VIEW = 1;
    CORD = 2;
    STRING = 3;
  }
  optional StringType string_type = 2;
  optional bool enum_name_uses_string_view = 3;
}
"#,
);

/// `google/protobuf/java_features.proto`, for `features.(pb.java).…`, the
/// same way.
pub(crate) const JAVA_FEATURES: (&str, &str) = (
    "google/protobuf/java_features.proto",
    r#"syntax = "proto2";
package pb;
import "google/protobuf/descriptor.proto";
extend google.protobuf.FeatureSet {
  optional JavaFeatures java = 1001;
}
message JavaFeatures {
  optional bool legacy_closed_enum = 1;
  enum Utf8Validation {
    UTF8_VALIDATION_UNKNOWN = 0;
    DEFAULT = 1;
    VERIFY = 2;
  }
  optional Utf8Validation utf8_validation = 2;
  optional bool large_enum = 3;
}
"#,
);

// ---------------------------------------------------------------------------
// Features in raw descriptor bytes.

/// `FeatureSet`'s fields protoplane reads, with their values' names by
/// number. `utf8_validation`'s `NONE` was 1 before protobuf 26 (the
/// `descriptor.proto` protox carries) and is 3 since (protoc 26 and later);
/// both read as `NONE`.
const FEATURES: [(&str, &[(u64, &str)]); 6] = [
    ("field_presence", &[(1, "EXPLICIT"), (2, "IMPLICIT"), (3, "LEGACY_REQUIRED")]),
    ("enum_type", &[(1, "OPEN"), (2, "CLOSED")]),
    ("repeated_field_encoding", &[(1, "PACKED"), (2, "EXPANDED")]),
    ("utf8_validation", &[(1, "NONE"), (2, "VERIFY"), (3, "NONE")]),
    ("message_encoding", &[(1, "LENGTH_PREFIXED"), (2, "DELIMITED")]),
    ("json_format", &[(1, "ALLOW"), (2, "LEGACY_BEST_EFFORT")]),
];

/// Features set explicitly on one element: `FEATURES` index -> value name.
type Explicit = Vec<(usize, &'static str)>;

/// What [`scan`] finds in an encoded `FileDescriptorSet`.
#[derive(Default)]
pub(crate) struct Scanned {
    /// Files that declare an edition (by file name) and their features.
    files: HashMap<String, Explicit>,
    /// Features on messages, fields, extensions, oneofs and enums, by the
    /// element's full name (one namespace, as in a descriptor pool).
    elements: HashMap<String, Explicit>,
}

/// Reads the `FeatureSet` bytes of one options message.
fn feature_set(bytes: &[u8], out: &mut Explicit) -> Result<(), SchemaError> {
    let mut r = Reader::new(bytes);
    while let Some((n, item)) = r.next()? {
        let Some(i) = n.checked_sub(1).map(|i| i as usize).filter(|&i| i < FEATURES.len()) else {
            continue; // a feature the tables do not hold, or a language's extension
        };
        let (name, values) = FEATURES[i];
        let Item::Varint(v) = item else {
            return Err(SchemaError::Descriptor(format!("features.{name}: not a varint")));
        };
        let Some(&(_, value)) = values.iter().find(|(n, _)| *n == v) else {
            return Err(SchemaError::Unsupported(format!(
                "features.{name} = {v}: a value this version of protoplane does not know"
            )));
        };
        out.retain(|(j, _)| *j != i);
        out.push((i, value));
    }
    Ok(())
}

/// The features of an options message (`features` is field `number` of it).
fn options_features(options: &[&[u8]], number: u64) -> Result<Explicit, SchemaError> {
    let mut out = Explicit::new();
    for o in options {
        let mut r = Reader::new(o);
        while let Some((n, item)) = r.next()? {
            if let (true, Item::Len(b)) = (n == number, item) {
                feature_set(b, &mut out)?;
            }
        }
    }
    Ok(out)
}

/// Finds the edition and every `features` option in an encoded
/// `FileDescriptorSet`. `rewritten` lists the files [`to_proto2`] turned
/// into proto2 text (with their edition): protox encodes them as proto2.
pub(crate) fn scan(bytes: &[u8], rewritten: &HashMap<String, u64>) -> Result<Scanned, SchemaError> {
    let mut out = Scanned::default();
    let mut r = Reader::new(bytes);
    while let Some((n, item)) = r.next()? {
        if let (1, Item::Len(file)) = (n, item) {
            scan_file(file, rewritten, &mut out)?;
        }
    }
    Ok(out)
}

fn scan_file(
    file: &[u8],
    rewritten: &HashMap<String, u64>,
    out: &mut Scanned,
) -> Result<(), SchemaError> {
    let (mut name, mut package, mut syntax, mut edition) = (String::new(), String::new(), "", None);
    let (mut options, mut messages, mut enums, mut extensions) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut r = Reader::new(file);
    while let Some((n, item)) = r.next()? {
        match (n, item) {
            (1, Item::Len(b)) => name = String::from_utf8_lossy(b).into_owned(),
            (2, Item::Len(b)) => package = String::from_utf8_lossy(b).into_owned(),
            (4, Item::Len(b)) => messages.push(b),
            (5, Item::Len(b)) => enums.push(b),
            (7, Item::Len(b)) => extensions.push(b),
            (8, Item::Len(b)) => options.push(b),
            (12, Item::Len(b)) => syntax = std::str::from_utf8(b).unwrap_or("?"),
            (14, Item::Varint(v)) => edition = Some(v),
            _ => {}
        }
    }
    let edition = match (syntax, edition, rewritten.get(&name)) {
        (_, _, Some(&e)) => e,
        ("editions", Some(e), None) => e,
        // A set that went through `prost_types` (which has no `edition`
        // field) and back: its features are uninterpreted options already,
        // and 2023's and 2024's defaults agree on every feature we read.
        ("editions", None, None) => EDITION_2023,
        _ => return Ok(()), // proto2 or proto3: no features to find
    };
    if edition != EDITION_2023 && edition != EDITION_2024 {
        return Err(SchemaError::Unsupported(format!(
            "{name}: edition {edition} (protoplane reads editions 2023 and 2024)"
        )));
    }
    if out.files.contains_key(&name) {
        return Ok(()); // listed twice: the tables keep the first copy
    }
    out.files.insert(name, options_features(&options, 50)?);
    for e in enums {
        scan_enum(&package, e, out)?;
    }
    for x in extensions {
        scan_field(&package, x, out)?;
    }
    for m in messages {
        scan_message(&package, m, out)?;
    }
    Ok(())
}

fn note(out: &mut Scanned, name: String, found: Explicit) {
    if !found.is_empty() {
        out.elements.insert(name, found);
    }
}

fn scan_message(scope: &str, msg: &[u8], out: &mut Scanned) -> Result<(), SchemaError> {
    let mut name = "";
    let (mut fields, mut nested, mut enums, mut extensions, mut oneofs, mut options) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut r = Reader::new(msg);
    while let Some((n, item)) = r.next()? {
        match (n, item) {
            (1, Item::Len(b)) => name = std::str::from_utf8(b).unwrap_or(""),
            (2, Item::Len(b)) => fields.push(b),
            (3, Item::Len(b)) => nested.push(b),
            (4, Item::Len(b)) => enums.push(b),
            (6, Item::Len(b)) => extensions.push(b),
            (7, Item::Len(b)) => options.push(b),
            (8, Item::Len(b)) => oneofs.push(b),
            _ => {}
        }
    }
    let full = join(scope, name);
    note(out, full.clone(), options_features(&options, 12)?);
    for f in fields.into_iter().chain(extensions) {
        scan_field(&full, f, out)?;
    }
    for o in oneofs {
        let (mut oname, mut oopts) = ("", Vec::new());
        let mut r = Reader::new(o);
        while let Some((n, item)) = r.next()? {
            match (n, item) {
                (1, Item::Len(b)) => oname = std::str::from_utf8(b).unwrap_or(""),
                (2, Item::Len(b)) => oopts.push(b),
                _ => {}
            }
        }
        note(out, join(&full, oname), options_features(&oopts, 1)?);
    }
    for e in enums {
        scan_enum(&full, e, out)?;
    }
    for m in nested {
        scan_message(&full, m, out)?;
    }
    Ok(())
}

fn scan_field(scope: &str, field: &[u8], out: &mut Scanned) -> Result<(), SchemaError> {
    let (mut name, mut options) = ("", Vec::new());
    let mut r = Reader::new(field);
    while let Some((n, item)) = r.next()? {
        match (n, item) {
            (1, Item::Len(b)) => name = std::str::from_utf8(b).unwrap_or(""),
            (8, Item::Len(b)) => options.push(b),
            _ => {}
        }
    }
    note(out, join(scope, name), options_features(&options, 21)?);
    Ok(())
}

fn scan_enum(scope: &str, e: &[u8], out: &mut Scanned) -> Result<(), SchemaError> {
    let (mut name, mut options) = ("", Vec::new());
    let mut r = Reader::new(e);
    while let Some((n, item)) = r.next()? {
        match (n, item) {
            (1, Item::Len(b)) => name = std::str::from_utf8(b).unwrap_or(""),
            (3, Item::Len(b)) => options.push(b),
            _ => {}
        }
    }
    note(out, join(scope, name), options_features(&options, 7)?);
    Ok(())
}

/// `features.<name> = VALUE` as an uninterpreted option.
fn uninterpreted(feature: usize, value: &str) -> UninterpretedOption {
    UninterpretedOption {
        name: vec![
            NamePart { name_part: "features".to_owned(), is_extension: false },
            NamePart { name_part: FEATURES[feature].0.to_owned(), is_extension: false },
        ],
        identifier_value: Some(value.to_owned()),
        ..Default::default()
    }
}

/// Whether `o` states a feature protoplane reads (replaced by [`annotate`]).
fn is_feature(o: &UninterpretedOption) -> bool {
    matches!(o.name.as_slice(), [a, b] if !a.is_extension && a.name_part == "features"
        && !b.is_extension && FEATURES.iter().any(|(n, _)| *n == b.name_part))
}

fn put(opts: &mut Vec<UninterpretedOption>, found: Option<&Explicit>) {
    let Some(found) = found else { return };
    opts.retain(|o| !is_feature(o));
    opts.extend(found.iter().map(|&(i, v)| uninterpreted(i, v)));
}

/// Marks every editions file of `set` (`syntax = "editions"`) and writes the
/// features [`scan`] found as uninterpreted options, where
/// [`lower`](crate::lower) reads them.
pub(crate) fn annotate(set: &mut FileDescriptorSet, found: &Scanned) {
    fn enums(scope: &str, list: &mut [EnumDescriptorProto], found: &Scanned) {
        for e in list {
            let full = join(scope, e.name());
            if let Some(f) = found.elements.get(&full) {
                put(
                    &mut e.options.get_or_insert_with(Default::default).uninterpreted_option,
                    Some(f),
                );
            }
        }
    }
    fn fields(scope: &str, list: &mut [prost_types::FieldDescriptorProto], found: &Scanned) {
        for f in list {
            if let Some(x) = found.elements.get(&join(scope, f.name())) {
                put(
                    &mut f.options.get_or_insert_with(Default::default).uninterpreted_option,
                    Some(x),
                );
            }
        }
    }
    fn messages(scope: &str, list: &mut [DescriptorProto], found: &Scanned) {
        for m in list {
            let full = join(scope, m.name());
            if let Some(x) = found.elements.get(&full) {
                put(
                    &mut m.options.get_or_insert_with(Default::default).uninterpreted_option,
                    Some(x),
                );
            }
            fields(&full, &mut m.field, found);
            fields(&full, &mut m.extension, found);
            for o in &mut m.oneof_decl {
                if let Some(x) = found.elements.get(&join(&full, o.name())) {
                    put(
                        &mut o.options.get_or_insert_with(Default::default).uninterpreted_option,
                        Some(x),
                    );
                }
            }
            enums(&full, &mut m.enum_type, found);
            messages(&full, &mut m.nested_type, found);
        }
    }
    for file in &mut set.file {
        let Some(x) = found.files.get(file.name()) else { continue };
        file.syntax = Some("editions".to_owned());
        if !x.is_empty() {
            put(
                &mut file.options.get_or_insert_with(Default::default).uninterpreted_option,
                Some(x),
            );
        }
        let package = file.package().to_owned();
        enums(&package, &mut file.enum_type, found);
        fields(&package, &mut file.extension, found);
        messages(&package, &mut file.message_type, found);
    }
}

// ---------------------------------------------------------------------------
// Editions source text -> proto2 source text.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok {
    Ident,
    Number,
    Str,
    Sym(u8),
}

/// Splits `.proto` text into tokens (`(kind, start, end)`), skipping
/// whitespace and comments. An unterminated string or comment ends the
/// tokens there, with the error beside them.
fn tokens(text: &str) -> (Vec<(Tok, usize, usize)>, Option<String>) {
    let mut out = Vec::new();
    let e = tokens_into(text, &mut out).err();
    (out, e)
}

fn tokens_into(text: &str, out: &mut Vec<(Tok, usize, usize)>) -> Result<(), String> {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i = match text[i + 2..].find("*/") {
                Some(at) => i + 2 + at + 2,
                None => return Err("a comment that never ends".to_owned()),
            };
        } else if c == b'"' || c == b'\'' {
            i += 1;
            loop {
                match b.get(i) {
                    None | Some(b'\n') => return Err("a string that never ends".to_owned()),
                    Some(b'\\') => i += 2,
                    Some(&q) if q == c => {
                        i += 1;
                        break;
                    }
                    Some(_) => i += 1,
                }
            }
            out.push((Tok::Str, start, i));
        } else if c.is_ascii_alphabetic() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push((Tok::Ident, start, i));
        } else if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            // Numbers, with exponents and hex digits: what follows up to a
            // symbol or space belongs to them.
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_') {
                let sign_after_exp = matches!(b[i], b'e' | b'E')
                    && matches!(b.get(i + 1), Some(b'+' | b'-'))
                    && !text[start..i].starts_with("0x");
                i += if sign_after_exp { 2 } else { 1 };
            }
            out.push((Tok::Number, start, i));
        } else {
            i += 1;
            out.push((Tok::Sym(c), start, i));
        }
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    File,
    Message,
    Extend,
    Oneof,
    Enum,
    Service,
    Method,
}

/// Rewrites an editions file into the proto2 text protox parses (see the
/// module doc). `Ok(None)`: not an editions file (proto2, proto3, or
/// nothing declared). The edition comes back with the text.
pub(crate) fn to_proto2(text: &str) -> Result<Option<(String, u64)>, String> {
    let (toks, error) = tokens(text);
    let word = |k: usize| -> &str {
        match toks.get(k) {
            Some(&(Tok::Ident, s, e)) => &text[s..e],
            _ => "",
        }
    };
    let sym = |k: usize, c: u8| matches!(toks.get(k), Some(&(Tok::Sym(x), _, _)) if x == c);
    // The first statement decides.
    if word(0) != "edition" {
        return Ok(None); // protox parses it, and reports what is wrong with it
    }
    if let Some(e) = error {
        return Err(e);
    }
    let line = |k: usize| text[..toks[k.min(toks.len() - 1)].1].matches('\n').count() + 1;
    let edition = match (sym(1, b'='), toks.get(2), sym(3, b';')) {
        (true, Some(&(Tok::Str, s, e)), true) => match &text[s + 1..e - 1] {
            "2023" => EDITION_2023,
            "2024" => EDITION_2024,
            other => {
                return Err(format!(
                    "line 1: edition \"{other}\" (protoplane reads editions 2023 and 2024)"
                ))
            }
        },
        _ => return Err("line 1: expected edition = \"2023\";".to_owned()),
    };
    // Edits: (start, end, replacement), in order.
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    let (s0, e0) = (toks[0].1, toks[3].2);
    let newlines = text[s0..e0].matches('\n').count();
    edits.push((s0, e0, format!("syntax = \"proto2\";{}", "\n".repeat(newlines))));

    // Skips a statement from token k: to its `;` (returns the index after
    // it) or, when `body` is set, to a `{` opening its body (returns the
    // index after it and `true`). Brackets and braces inside (options,
    // aggregate option values) are skipped whole.
    let skip = |mut k: usize, body: bool| -> Result<(usize, bool), String> {
        let mut depth = 0usize;
        while let Some(&(t, _, _)) = toks.get(k) {
            k += 1;
            match t {
                Tok::Sym(b'{') if depth == 0 && body => return Ok((k, true)),
                Tok::Sym(b'[' | b'{' | b'(') => depth += 1,
                Tok::Sym(b']' | b'}' | b')') => depth = depth.saturating_sub(1),
                Tok::Sym(b';') if depth == 0 => return Ok((k, false)),
                _ => {}
            }
        }
        Err(format!("line {}: a statement that never ends", line(k)))
    };

    let mut stack = vec![Scope::File];
    let mut k = 4;
    while k < toks.len() {
        let scope = stack.last().copied().unwrap_or(Scope::File); // never popped
        if sym(k, b'}') {
            if stack.len() == 1 {
                return Err(format!("line {}: unexpected '}}'", line(k)));
            }
            stack.pop();
            k += 1;
            continue;
        }
        if sym(k, b';') {
            k += 1;
            continue;
        }
        // Edition 2024 symbol visibility: nothing proto2 can say, nothing the
        // tables hold.
        let w = word(k);
        if matches!(w, "export" | "local")
            && matches!(word(k + 1), "message" | "enum")
            && matches!(scope, Scope::File | Scope::Message)
        {
            edits.push((toks[k].1, toks[k + 1].1, String::new()));
            k += 1;
            continue;
        }
        let opens = |w: &str| match w {
            "message" => Some(Scope::Message),
            "enum" => Some(Scope::Enum),
            "extend" => Some(Scope::Extend),
            "service" => Some(Scope::Service),
            "oneof" => Some(Scope::Oneof),
            _ => None,
        };
        let allowed = |s: Scope| match scope {
            Scope::File => {
                matches!(s, Scope::Message | Scope::Enum | Scope::Extend | Scope::Service)
            }
            Scope::Message => {
                matches!(s, Scope::Message | Scope::Enum | Scope::Extend | Scope::Oneof)
            }
            _ => false,
        };
        if let Some(s) = opens(w).filter(|&s| allowed(s)) {
            // `message Foo {`: a declaration, not a field of type `message`.
            if toks.get(k + 1).is_some_and(|t| t.0 == Tok::Ident) {
                let (next, opened) = skip(k + 1, true)?;
                if !opened {
                    return Err(format!("line {}: {w} without a body", line(k)));
                }
                stack.push(s);
                k = next;
                continue;
            }
        }
        match (scope, w) {
            (_, "option" | "import" | "package" | "reserved" | "extensions")
                if scope != Scope::Oneof || w == "option" =>
            {
                if w == "reserved" && toks.get(k + 1).is_some_and(|t| t.0 == Tok::Ident) {
                    // Editions reserve names as identifiers; proto2 as strings.
                    let (end, _) = skip(k, false)?;
                    for &(t, s, e) in &toks[k + 1..end] {
                        if t == Tok::Ident {
                            edits.push((s, e, format!("\"{}\"", &text[s..e])));
                        }
                    }
                    k = end;
                } else if w == "import" && word(k + 1) == "option" {
                    // Edition 2024's option-only import: the options it names
                    // are not needed to build tables.
                    let (end, _) = skip(k, false)?;
                    edits.push((toks[k].1, toks[end - 1].2, String::new()));
                    k = end;
                } else {
                    k = skip(k, false)?.0;
                }
            }
            (Scope::Message | Scope::Extend | Scope::Oneof, "optional" | "required") => {
                return Err(format!(
                    "line {}: label `{w}` is not allowed in editions (use features.field_presence)",
                    line(k)
                ));
            }
            (Scope::Message | Scope::Extend | Scope::Oneof, "group") => {
                return Err(format!(
                    "line {}: groups are not allowed in editions (use features.message_encoding = DELIMITED)",
                    line(k)
                ));
            }
            (Scope::Message | Scope::Extend, "repeated") => k = skip(k, false)?.0,
            (Scope::Message, "map") if sym(k + 1, b'<') => k = skip(k, false)?.0,
            (Scope::Message | Scope::Extend, _) => {
                // A singular field: proto2 needs the label editions leave out.
                edits.push((toks[k].1, toks[k].1, "optional ".to_owned()));
                k = skip(k, false)?.0;
            }
            (Scope::Service, "rpc") => {
                let (next, opened) = skip(k, true)?;
                if opened {
                    stack.push(Scope::Method);
                }
                k = next;
            }
            _ => k = skip(k, false)?.0,
        }
    }
    if stack.len() != 1 {
        return Err("the file ends inside a declaration".to_owned());
    }
    let mut out = String::with_capacity(text.len() + 9 * edits.len());
    let mut at = 0;
    for (s, e, r) in edits {
        out.push_str(&text[at..s]);
        out.push_str(&r);
        at = e;
    }
    out.push_str(&text[at..]);
    Ok(Some((out, edition)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto2_and_proto3_files_are_left_alone() {
        assert_eq!(to_proto2("syntax = \"proto3\";\nmessage A { int32 a = 1; }"), Ok(None));
        assert_eq!(to_proto2("// nothing\n"), Ok(None));
    }

    #[test]
    fn an_editions_file_becomes_the_same_proto2_file() {
        let text = "// head\nedition = \"2023\";\npackage p;\n\
                    option features.enum_type = CLOSED;\n\
                    message A {\n  int32 a = 1 [features.field_presence = IMPLICIT];\n\
                    \x20 repeated int32 r = 2;\n  map<string, A> m = 3;\n\
                    \x20 oneof o { string s = 4; .p.A n = 5; }\n\
                    \x20 reserved x, y;\n  reserved 6 to 8;\n  extensions 100 to max;\n\
                    \x20 message B { A a = 1; }\n  enum E { option allow_alias = true; Z = 0; }\n}\n\
                    extend A { int32 ext = 100; }\n\
                    service S { rpc M(A) returns (A) { option deprecated = true; } }\n";
        let (out, edition) =
            to_proto2(text).expect("the test's own input").expect("the test's own input");
        assert_eq!(edition, EDITION_2023);
        let want = "// head\nsyntax = \"proto2\";\npackage p;\n\
                    option features.enum_type = CLOSED;\n\
                    message A {\n  optional int32 a = 1 [features.field_presence = IMPLICIT];\n\
                    \x20 repeated int32 r = 2;\n  map<string, A> m = 3;\n\
                    \x20 oneof o { string s = 4; .p.A n = 5; }\n\
                    \x20 reserved \"x\", \"y\";\n  reserved 6 to 8;\n  extensions 100 to max;\n\
                    \x20 message B { optional A a = 1; }\n  enum E { option allow_alias = true; Z = 0; }\n}\n\
                    extend A { optional int32 ext = 100; }\n\
                    service S { rpc M(A) returns (A) { option deprecated = true; } }\n";
        assert_eq!(out, want);
        assert_eq!(out.lines().count(), text.lines().count());
    }

    #[test]
    fn edition_2024_visibility_and_option_imports_go() {
        let text = "edition = \"2024\";\nimport option \"x.proto\";\nexport message A { local enum E { Z = 0; } }\n";
        let (out, edition) =
            to_proto2(text).expect("the test's own input").expect("the test's own input");
        assert_eq!(edition, EDITION_2024);
        assert_eq!(out, "syntax = \"proto2\";\n\nmessage A { enum E { Z = 0; } }\n");
    }

    #[test]
    fn what_editions_forbid_is_refused_by_line() {
        let e = to_proto2("edition = \"2023\";\nmessage A {\n  optional int32 a = 1;\n}")
            .expect_err("refused");
        assert!(e.starts_with("line 3: label `optional`"), "{e}");
        let e =
            to_proto2("edition = \"2023\";\nmessage A {\n group G = 1 {}\n}").expect_err("refused");
        assert!(e.starts_with("line 3: groups"), "{e}");
        let e = to_proto2("edition = \"2022\";").expect_err("refused");
        assert!(e.contains("edition \"2022\""), "{e}");
        assert!(to_proto2("edition = \"2023\";\nmessage A {").is_err());
        assert!(to_proto2("edition = \"2023\";\n}").is_err());
        assert!(to_proto2("edition = \"2023\";\n/* open").is_err());
        assert!(
            to_proto2("edition = \"2023\";\nmessage A { string s = 1 [default = \"x]; }").is_err()
        );
    }
}
