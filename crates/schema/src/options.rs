//! The `(protoplane.placement)` field option (`protos/protoplane/options.proto`).
//!
//! A custom option reaches us in one of two shapes:
//!
//! * *interpreted*: an extension field (number [`PLACEMENT_EXTENSION`]) in
//!   the encoded `FieldOptions`. That is what `protoc --descriptor_set_out`
//!   and protox's `encode_file_descriptor_set` write. `prost_types::FieldOptions`
//!   drops unknown fields, so this shape only survives in the raw bytes:
//!   [`scan_descriptor_set`] walks them.
//! * *uninterpreted*: a `FieldOptions.uninterpreted_option` entry named
//!   `(protoplane.placement)` with an identifier value (`DEVICE` / `HOST`),
//!   the descriptor's standard form of an option not yet resolved to its
//!   extension. It survives `prost_types`, so after compiling `.proto`
//!   files the loaders rewrite every interpreted placement found in the raw
//!   bytes into this form ([`annotate`]): the `FileDescriptorSet` that
//!   [`compile_protos`](crate::compile_protos) returns then carries the
//!   placements into [`TableSet::from_file_descriptor_set`](crate::TableSet::from_file_descriptor_set)
//!   (and through `encode_to_vec` / `from_descriptor_set`).

use std::collections::HashMap;

use prost_types::uninterpreted_option::NamePart;
use prost_types::{DescriptorProto, FieldOptions, FileDescriptorSet, UninterpretedOption};

use crate::lower::join;
use crate::{Placement, SchemaError};

/// Extension number of `(protoplane.placement)` in `google.protobuf.FieldOptions`
/// (organization-internal range 50000-99999, not globally registered).
pub const PLACEMENT_EXTENSION: u32 = 50_701;

/// Full name of the placement option's extension.
pub const PLACEMENT_OPTION: &str = "protoplane.placement";

/// Import path of the file declaring the option.
pub const OPTIONS_PROTO_NAME: &str = "protoplane/options.proto";

/// Text of `protoplane/options.proto`, built into every loader (a schema can
/// import it without having it under its include paths).
pub const OPTIONS_PROTO: &str = include_str!("../../../protos/protoplane/options.proto");

/// Placements found in descriptors: `(message full name, field number)` ->
/// the option's value, with the field's name for messages.
pub(crate) type Found = HashMap<(String, u32), (String, Placement)>;

/// The placement named by an option value (the enum's number).
fn placement_of(value: u64) -> Option<Placement> {
    match value {
        0 => Some(Placement::Host),
        1 => Some(Placement::Device),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// Raw descriptor bytes.

/// A minimal protobuf reader over descriptor bytes (no groups: descriptors
/// do not use them).
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// One field of an encoded message.
pub(crate) enum Item<'a> {
    Varint(u64),
    Len(&'a [u8]),
    Other,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = *self.buf.get(self.pos)?;
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << shift.min(63);
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    /// The next `(field number, value)`, `Ok(None)` at the end.
    pub(crate) fn next(&mut self) -> Result<Option<(u64, Item<'a>)>, SchemaError> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let bad = || SchemaError::Descriptor("malformed descriptor bytes".into());
        let key = self.varint().ok_or_else(bad)?;
        let item = match key & 7 {
            0 => Item::Varint(self.varint().ok_or_else(bad)?),
            1 => {
                self.take(8).ok_or_else(bad)?;
                Item::Other
            }
            2 => {
                let n = usize::try_from(self.varint().ok_or_else(bad)?).map_err(|_| bad())?;
                Item::Len(self.take(n).ok_or_else(bad)?)
            }
            5 => {
                self.take(4).ok_or_else(bad)?;
                Item::Other
            }
            _ => return Err(bad()),
        };
        Ok(Some((key >> 3, item)))
    }
}

fn utf8(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What a raw walk collects before knowing whether the option is declared.
#[derive(Default)]
struct Scan {
    found: Found,
    /// Field numbered like the option but with a value that is not a placement.
    bad_values: Vec<(String, u64)>,
    /// The set declares `protoplane.placement` as extension [`PLACEMENT_EXTENSION`].
    declared: bool,
}

/// Finds every `(protoplane.placement)` in an encoded `FileDescriptorSet`.
/// Options numbered [`PLACEMENT_EXTENSION`] count only when the set declares
/// `protoplane.placement` with that number (another organization's option
/// with the same number is not ours).
pub(crate) fn scan_descriptor_set(bytes: &[u8]) -> Result<Found, SchemaError> {
    let mut scan = Scan::default();
    let mut files_seen = std::collections::HashSet::new();
    let mut r = Reader::new(bytes);
    while let Some((n, item)) = r.next()? {
        if let (1, Item::Len(file)) = (n, item) {
            scan_file(file, &mut scan, &mut files_seen)?;
        }
    }
    if !scan.declared {
        return Ok(Found::new());
    }
    if let Some((field, v)) = scan.bad_values.first() {
        return Err(SchemaError::Unsupported(format!(
            "{field}: ({PLACEMENT_OPTION}) = {v} is not a placement (HOST = 0, DEVICE = 1)"
        )));
    }
    Ok(scan.found)
}

fn scan_file<'a>(
    file: &'a [u8],
    scan: &mut Scan,
    files_seen: &mut std::collections::HashSet<&'a [u8]>,
) -> Result<(), SchemaError> {
    let (mut name, mut package) = (&[][..], &[][..]);
    let (mut messages, mut extensions) = (Vec::new(), Vec::new());
    let mut r = Reader::new(file);
    while let Some((n, item)) = r.next()? {
        match (n, item) {
            (1, Item::Len(b)) => name = b,
            (2, Item::Len(b)) => package = b,
            (4, Item::Len(b)) => messages.push(b),
            (7, Item::Len(b)) => extensions.push(b),
            _ => {}
        }
    }
    if !files_seen.insert(name) {
        return Ok(()); // listed twice: the tables keep the first copy
    }
    let package = utf8(package);
    for ext in extensions {
        check_declaration(&package, ext, scan)?;
    }
    for m in messages {
        scan_message(&package, m, scan)?;
    }
    Ok(())
}

/// Notes whether extension `ext` (declared in scope `scope`) is ours.
fn check_declaration(scope: &str, ext: &[u8], scan: &mut Scan) -> Result<(), SchemaError> {
    let (mut name, mut extendee, mut number) = (String::new(), String::new(), 0u64);
    let mut r = Reader::new(ext);
    while let Some((n, item)) = r.next()? {
        match (n, item) {
            (1, Item::Len(b)) => name = utf8(b),
            (2, Item::Len(b)) => extendee = utf8(b),
            (3, Item::Varint(v)) => number = v,
            _ => {}
        }
    }
    if join(scope, &name) == PLACEMENT_OPTION
        && extendee.trim_start_matches('.') == "google.protobuf.FieldOptions"
        && number == PLACEMENT_EXTENSION as u64
    {
        scan.declared = true;
    }
    Ok(())
}

fn scan_message(scope: &str, msg: &[u8], scan: &mut Scan) -> Result<(), SchemaError> {
    let mut name = String::new();
    let (mut fields, mut nested, mut extensions) = (Vec::new(), Vec::new(), Vec::new());
    let mut r = Reader::new(msg);
    while let Some((n, item)) = r.next()? {
        match (n, item) {
            (1, Item::Len(b)) => name = utf8(b),
            (2, Item::Len(b)) => fields.push(b),
            (3, Item::Len(b)) => nested.push(b),
            (6, Item::Len(b)) => extensions.push(b),
            _ => {}
        }
    }
    let full = join(scope, &name);
    for ext in extensions {
        check_declaration(&full, ext, scan)?;
    }
    for f in fields {
        scan_field(&full, f, scan)?;
    }
    for m in nested {
        scan_message(&full, m, scan)?;
    }
    Ok(())
}

fn scan_field(message: &str, field: &[u8], scan: &mut Scan) -> Result<(), SchemaError> {
    let (mut name, mut number, mut options) = (String::new(), 0u64, Vec::new());
    let mut r = Reader::new(field);
    while let Some((n, item)) = r.next()? {
        match (n, item) {
            (1, Item::Len(b)) => name = utf8(b),
            (3, Item::Varint(v)) => number = v,
            (8, Item::Len(b)) => options.push(b),
            _ => {}
        }
    }
    // Like any singular field, the last occurrence of the option wins
    // (and `options` itself, a message, merges across occurrences).
    let mut value = None;
    for o in options {
        let mut r = Reader::new(o);
        while let Some((n, item)) = r.next()? {
            if n == PLACEMENT_EXTENSION as u64 {
                value = Some(match item {
                    Item::Varint(v) => v,
                    _ => u64::MAX, // wrong wire type: reported as a bad value
                });
            }
        }
    }
    let Some(v) = value else { return Ok(()) };
    let full = format!("{message}.{name}");
    match (placement_of(v), u32::try_from(number)) {
        (Some(p), Ok(number)) => {
            scan.found.insert((message.to_owned(), number), (name, p));
        }
        _ => scan.bad_values.push((full, v)),
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The uninterpreted form in `prost_types`.

/// Whether `o` is a `(protoplane.placement)` option.
fn is_placement(o: &UninterpretedOption) -> bool {
    let name: Vec<&str> = o.name.iter().map(|p| p.name_part.as_str()).collect();
    let joined = name.join(".");
    let joined = joined.trim_start_matches('.');
    match o.name.as_slice() {
        // `(protoplane.placement)`: one extension part with the full name.
        [one] => one.is_extension && joined == PLACEMENT_OPTION,
        _ => false,
    }
}

/// The placement an uninterpreted `(protoplane.placement)` option in `opts`
/// sets (the last one wins), `Ok(None)` when there is none; `Err` carries
/// the offending value.
pub(crate) fn uninterpreted_placement(
    opts: Option<&FieldOptions>,
) -> Result<Option<Placement>, String> {
    let Some(opts) = opts else { return Ok(None) };
    let mut out = None;
    for o in opts.uninterpreted_option.iter().filter(|o| is_placement(o)) {
        let p = match (o.identifier_value.as_deref(), o.positive_int_value) {
            (Some("HOST"), _) => Placement::Host,
            (Some("DEVICE"), _) => Placement::Device,
            (None, Some(v)) => placement_of(v).ok_or_else(|| v.to_string())?,
            (Some(other), _) => return Err(other.to_owned()),
            (None, None) => return Err("(no value)".to_owned()),
        };
        out = Some(p);
    }
    Ok(out)
}

/// The uninterpreted form of `(protoplane.placement) = p`.
fn uninterpreted(p: Placement) -> UninterpretedOption {
    UninterpretedOption {
        name: vec![NamePart { name_part: PLACEMENT_OPTION.to_owned(), is_extension: true }],
        identifier_value: Some(match p {
            Placement::Host => "HOST".to_owned(),
            Placement::Device => "DEVICE".to_owned(),
        }),
        ..Default::default()
    }
}

/// Writes every placement of `found` into `set` as an uninterpreted option
/// (replacing any earlier placement option of that field), so that the
/// placements survive `prost_types`.
pub(crate) fn annotate(set: &mut FileDescriptorSet, found: &Found) {
    if found.is_empty() {
        return;
    }
    fn walk(scope: &str, msgs: &mut [DescriptorProto], found: &Found) {
        for m in msgs {
            let full = join(scope, m.name());
            for f in &mut m.field {
                let Ok(number) = u32::try_from(f.number()) else { continue };
                if let Some((_, p)) = found.get(&(full.clone(), number)) {
                    let opts = f.options.get_or_insert_with(Default::default);
                    opts.uninterpreted_option.retain(|o| !is_placement(o));
                    opts.uninterpreted_option.push(uninterpreted(*p));
                }
            }
            walk(&full, &mut m.nested_type, found);
        }
    }
    let mut seen = std::collections::HashSet::new();
    for file in &mut set.file {
        if !seen.insert(file.name().to_owned()) {
            continue;
        }
        let package = file.package().to_owned();
        walk(&package, &mut file.message_type, found);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_file_declares_the_documented_number() {
        assert!(OPTIONS_PROTO.contains(&format!("placement = {PLACEMENT_EXTENSION};")));
        assert!(OPTIONS_PROTO.contains("package protoplane;"));
    }

    #[test]
    fn uninterpreted_values() {
        let opts = |o: UninterpretedOption| FieldOptions {
            uninterpreted_option: vec![o],
            ..Default::default()
        };
        let dev = opts(uninterpreted(Placement::Device));
        assert_eq!(uninterpreted_placement(Some(&dev)), Ok(Some(Placement::Device)));
        let host = opts(uninterpreted(Placement::Host));
        assert_eq!(uninterpreted_placement(Some(&host)), Ok(Some(Placement::Host)));
        let mut odd = uninterpreted(Placement::Device);
        odd.identifier_value = Some("GPU".into());
        assert_eq!(uninterpreted_placement(Some(&opts(odd))), Err("GPU".to_owned()));
        let mut other = uninterpreted(Placement::Device);
        other.name[0].name_part = "acme.placement".into();
        assert_eq!(uninterpreted_placement(Some(&opts(other))), Ok(None));
        assert_eq!(uninterpreted_placement(None), Ok(None));
    }

    #[test]
    fn truncated_bytes_are_an_error_not_a_panic() {
        assert!(scan_descriptor_set(b"\x0a\x05ab").is_err());
        assert!(scan_descriptor_set(b"\x0b").is_err());
        assert!(scan_descriptor_set(b"").is_ok_and(|f| f.is_empty()));
    }
}
