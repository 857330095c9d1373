//! Changing placements after loading: the engine configuration's list of
//! placements ([`apply_placements`]) and RPCAcc's automatic field updating
//! (§IV-C, [`PlacementTable`]).
//!
//! The syntax of a placement entry is documented on [`apply_placements`].

use std::sync::{Arc, PoisonError, RwLock};

use crate::lower::{describe, placeable};
use crate::{Placement, SchemaError, TableSet};

/// One parsed placement entry (`pkg.Msg.field=device`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementSpec {
    /// Fully qualified message name (without a leading dot).
    pub message: String,
    /// Field name as written (declared or JSON name).
    pub field: String,
    /// Where the field goes.
    pub placement: Placement,
}

/// Parses one entry of the [placement syntax](apply_placements) (no table lookups).
pub fn parse_placement(spec: &str) -> Result<PlacementSpec, SchemaError> {
    let bad = |why: String| SchemaError::Placement(format!("`{spec}`: {why}"));
    let Some((path, value)) = spec.split_once('=') else {
        return Err(bad("expected `package.Message.field=device` (or `=host`)".into()));
    };
    let value = value.trim();
    let placement = if value.eq_ignore_ascii_case("device") {
        Placement::Device
    } else if value.eq_ignore_ascii_case("host") {
        Placement::Host
    } else {
        return Err(bad(format!("unknown placement `{value}` (expected `device` or `host`)")));
    };
    let path = path.trim();
    let path = path.strip_prefix('.').unwrap_or(path);
    match path.rsplit_once('.') {
        Some((message, field)) if !message.is_empty() && !field.is_empty() => {
            Ok(PlacementSpec { message: message.to_owned(), field: field.to_owned(), placement })
        }
        _ => Err(bad(format!("`{path}` is not `package.Message.field`"))),
    }
}

/// Resolves a field of `tables` for a placement change: its message index
/// and number. `what` names the request in errors.
fn resolve(
    tables: &TableSet,
    message: &str,
    field: &str,
    placement: Placement,
    what: &str,
) -> Result<(u32, u32), SchemaError> {
    let Some(mi) = tables.message_by_name(message) else {
        return Err(SchemaError::UnknownName(format!("{what}: no message `{message}`")));
    };
    let m = tables.message(mi);
    let Some(f) = tables.field_by_name(m, field) else {
        let full = tables.message_name(mi);
        return Err(SchemaError::UnknownName(format!(
            "{what}: message `{full}` has no field `{field}`"
        )));
    };
    if placement == Placement::Device && !placeable(f.kind, f.label) {
        return Err(SchemaError::Placement(format!(
            "{what}: {}.{} is of type {}; only string, bytes and repeated scalar fields can be \
             placed on the device",
            tables.message_name(mi),
            tables.str(f.name),
            describe(f.kind, f.label, f.flags),
        )));
    }
    Ok((mi, f.number))
}

/// Resolves every entry of `specs` against `tables` (nothing changed).
fn resolve_all(
    tables: &TableSet,
    specs: &[impl AsRef<str>],
) -> Result<Vec<(u32, u32, Placement)>, SchemaError> {
    specs
        .iter()
        .map(|s| {
            let s = s.as_ref();
            let p = parse_placement(s)?;
            let what = format!("`{s}`");
            let (mi, n) = resolve(tables, &p.message, &p.field, p.placement, &what)?;
            Ok((mi, n, p.placement))
        })
        .collect()
}

/// Applies a list of placements (`["pkg.Msg.field=device", ...]`, the
/// engine configuration's form) to `tables`: atomically, in order.
///
/// # Syntax
///
/// One entry per field, `<message>.<field>=<placement>`:
///
/// ```text
/// pkg.Frame.image=device
/// pkg.Outer.Inner.name = host
/// ```
///
/// * `<message>` is the fully qualified message name (nested messages with
///   dots; a leading dot is accepted), `<field>` the field's declared name
///   (its JSON name is accepted too); the split is at the last dot;
/// * `<placement>` is `device` or `host` (ASCII case-insensitive);
/// * blanks around the parts are ignored;
/// * only `string`, `bytes` and repeated scalar fields can be placed on the
///   device; `host` is accepted on any field (it is where every other
///   field already is).
///
/// A list applies entries in order (a later entry for the same field wins)
/// and atomically: on the first bad entry nothing is changed.
///
/// # Errors
///
/// Errors name the offending entry: a malformed entry or unknown placement
/// ([`SchemaError::Placement`]), an unknown message or field
/// ([`SchemaError::UnknownName`]), `device` on a field that cannot be placed
/// there ([`SchemaError::Placement`]).
pub fn apply_placements(
    tables: &mut TableSet,
    specs: &[impl AsRef<str>],
) -> Result<(), SchemaError> {
    for (mi, n, p) in resolve_all(tables, specs)? {
        // Cannot fail: resolved above (a host request on a field that
        // cannot be placed is a no-op `set_placement` refuses).
        tables.set_placement(mi, n, p);
    }
    Ok(())
}

/// RPCAcc's automatic field updating (§IV-C): the live placement bits of a
/// table set, shared by the decoders of an engine and the policy that
/// moves fields between host and device.
///
/// Decoders take a [`PlacementTable::snapshot`] per decode (an
/// `Arc<TableSet>`, one lock acquisition and a reference-count increment)
/// and use it for the whole message. An update builds a new table set
/// (copy-on-write: in place when no snapshot is outstanding, else a copy)
/// and swaps it in, so it affects the *next* decode of that message type;
/// a decode in progress keeps the tables it started with.
#[derive(Debug)]
pub struct PlacementTable {
    current: RwLock<Arc<TableSet>>,
}

impl PlacementTable {
    /// Starts from `tables` (with whatever placements they carry).
    pub fn new(tables: TableSet) -> PlacementTable {
        PlacementTable::from_shared(Arc::new(tables))
    }

    /// Starts from shared `tables` (not copied until the first update).
    pub fn from_shared(tables: Arc<TableSet>) -> PlacementTable {
        PlacementTable { current: RwLock::new(tables) }
    }

    /// The tables to decode the next message with: unaffected by later updates.
    pub fn snapshot(&self) -> Arc<TableSet> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Places `message`'s `field` (fully qualified message name, declared or
    /// JSON field name) on the device for subsequent decodes. `Ok(true)` if
    /// that changed its placement, `Ok(false)` if it was already there.
    /// Errors: unknown message or field, or a field that cannot be placed on
    /// the device (only `string`, `bytes` and repeated scalars can).
    pub fn move_to_device(&self, message: &str, field: &str) -> Result<bool, SchemaError> {
        self.place(message, field, Placement::Device)
    }

    /// Places `message`'s `field` back in host memory for subsequent
    /// decodes. `Ok(true)` if that changed its placement. Errors: unknown
    /// message or field.
    pub fn move_to_host(&self, message: &str, field: &str) -> Result<bool, SchemaError> {
        self.place(message, field, Placement::Host)
    }

    /// Whether the next decode places `message`'s `field` on the device
    /// (`false` for unknown names).
    pub fn is_on_device(&self, message: &str, field: &str) -> bool {
        let ts = self.snapshot();
        ts.message_by_name(message)
            .and_then(|mi| ts.field_by_name(ts.message(mi), field))
            .is_some_and(|f| f.placement() == Placement::Device)
    }

    /// Sets the placement of field `field` of `message`.
    pub fn place(
        &self,
        message: &str,
        field: &str,
        placement: Placement,
    ) -> Result<bool, SchemaError> {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let what = format!("{message}.{field}");
        let (mi, n) = resolve(&current, message, field, placement, &what)?;
        Ok(set(&mut current, mi, n, placement))
    }

    /// Sets the placement of field number `number` of message index
    /// `message` (the engine's form, no name lookups). `Ok(true)` if that
    /// changed it. Errors: no such message or field, or a field that cannot
    /// be placed on the device.
    pub fn place_by_number(
        &self,
        message: u32,
        number: u32,
        placement: Placement,
    ) -> Result<bool, SchemaError> {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let Some(m) = current.messages().get(message as usize) else {
            return Err(SchemaError::UnknownName(format!("message #{message}")));
        };
        let Some(f) = current.field_by_number(m, number) else {
            let name = current.message_name(message);
            return Err(SchemaError::UnknownName(format!("{name}: no field number {number}")));
        };
        if placement == Placement::Device && !placeable(f.kind, f.label) {
            return Err(SchemaError::Placement(format!(
                "{}.{}: a field of type {} cannot be placed on the device",
                current.message_name(message),
                current.str(f.name),
                describe(f.kind, f.label, f.flags),
            )));
        }
        Ok(set(&mut current, message, number, placement))
    }

    /// Applies a list in the [placement syntax](apply_placements), atomically (see
    /// [`apply_placements`]).
    pub fn apply(&self, specs: &[impl AsRef<str>]) -> Result<(), SchemaError> {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        for (mi, n, p) in resolve_all(&current, specs)? {
            set(&mut current, mi, n, p);
        }
        Ok(())
    }
}

/// Flips one (resolved) placement bit copy-on-write; `true` if it changed.
fn set(current: &mut Arc<TableSet>, message: u32, number: u32, placement: Placement) -> bool {
    let ts: &TableSet = current;
    let m = ts.message(message);
    let Some(f) = ts.field_by_number(m, number) else { return false };
    if f.placement() == placement {
        return false;
    }
    // Outstanding snapshots keep the old set; without any, this is in place.
    Arc::make_mut(current).set_placement(message, number, placement)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FieldFlags, ProtoSource};

    #[test]
    fn forged_device_bits_are_rejected_when_loading_tables() {
        let text = "syntax = \"proto3\"; package a; message M { int32 x = 1; bytes b = 2; }";
        let mut ts =
            TableSet::from_proto_sources(&[ProtoSource { name: "a.proto", text }], &["a.proto"])
                .expect("loads");
        let mut ok = ts.clone();
        assert!(ok.set_placement(0, 2, Placement::Device));
        assert!(TableSet::from_bytes(&ok.to_bytes()).is_ok());
        assert!(!ok.set_placement(0, 1, Placement::Device));
        ts.fields[0].flags.0 |= FieldFlags::DEVICE; // `int32 x`
        assert!(matches!(TableSet::from_bytes(&ts.to_bytes()), Err(SchemaError::Corrupt(_))));
    }

    #[test]
    fn parses_the_documented_syntax() {
        let p = parse_placement(" .pkg.Outer.Inner.blob = DEVICE ").expect("parses");
        assert_eq!(p.message, "pkg.Outer.Inner");
        assert_eq!(p.field, "blob");
        assert_eq!(p.placement, Placement::Device);
        assert_eq!(parse_placement("M.f=host").map(|p| p.placement).ok(), Some(Placement::Host));
        for bad in ["pkg.Msg.field", "pkg.Msg.field=gpu", "field=device", ".f=device", "M.=host"] {
            let e = parse_placement(bad).expect_err(bad).to_string();
            assert!(e.contains(&format!("`{bad}`")), "{e}");
        }
    }
}
