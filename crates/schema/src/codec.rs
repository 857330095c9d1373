//! The byte form of a table set: what crosses into another process or onto a
//! device. A flat dump of the arrays, little endian, preceded by a magic and
//! a version, every record a fixed number of `u32` words:
//!
//! ```text
//! "PPTS" | version u32 | messages | fields | oneofs | enums | enum_values | dense | words
//!        | extensions | strings
//! each section: count u32, then count records (strings: count bytes)
//! ```
//!
//! Version 2 added `extensions` (an extendee index, then a field record);
//! version 1 bytes, which have none, still read.
//!
//! Reading validates every index, span and offset, so a table set read from
//! an untrusted peer cannot make the decoder index out of bounds.

use crate::table::{
    Enum, EnumValue, Extension, Field, FieldFlags, Kind, Label, Message, MessageFlags, Oneof, Span,
    TableSet, NONE,
};
use crate::SchemaError;

const MAGIC: &[u8; 4] = b"PPTS";
const VERSION: u32 = 2;

struct W(Vec<u8>);

impl W {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn span(&mut self, s: Span) {
        self.u32(s.start);
        self.u32(s.len);
    }
    /// A field record: 11 words.
    fn field(&mut self, f: &Field) {
        for v in [f.number, f.offset, f.sub, f.presence] {
            self.u32(v);
        }
        self.span(f.name);
        self.span(f.json_name);
        self.u32(f.default as u32);
        self.u32((f.default >> 32) as u32);
        self.u32(f.kind as u32 | (f.label as u32) << 8 | (f.flags.0 as u32) << 16);
    }
}

struct R<'a> {
    b: &'a [u8],
    pos: usize,
}

impl R<'_> {
    fn u32(&mut self) -> Result<u32, SchemaError> {
        let bytes = self
            .b
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| SchemaError::Corrupt(format!("truncated at byte {}", self.pos)))?;
        self.pos += 4;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }
    fn span(&mut self) -> Result<Span, SchemaError> {
        Ok(Span { start: self.u32()?, len: self.u32()? })
    }
    /// A field record (see [`W::field`]).
    fn field(&mut self) -> Result<Field, SchemaError> {
        let (number, offset, sub, presence) = (self.u32()?, self.u32()?, self.u32()?, self.u32()?);
        let (name, json_name) = (self.span()?, self.span()?);
        let default = self.u32()? as u64 | (self.u32()? as u64) << 32;
        let packed = self.u32()?;
        let kind = Kind::from_u8(packed as u8)
            .ok_or_else(|| SchemaError::Corrupt("bad field kind".into()))?;
        let label = match (packed >> 8) as u8 {
            1 => Label::Optional,
            2 => Label::Required,
            3 => Label::Repeated,
            _ => return Err(SchemaError::Corrupt("bad field label".into())),
        };
        let flags = FieldFlags((packed >> 16) as u16);
        Ok(Field { number, offset, sub, presence, name, json_name, default, kind, label, flags })
    }

    fn count(&mut self, record_words: usize) -> Result<usize, SchemaError> {
        let n = self.u32()? as usize;
        // Bound the count by what is left, so a forged count cannot make us allocate.
        if n.saturating_mul(record_words * 4) > self.b.len() - self.pos {
            return Err(SchemaError::Corrupt(format!("count {n} exceeds input")));
        }
        Ok(n)
    }
}

impl TableSet {
    /// A 64-bit digest (FNV-1a) of the serialized table set: equal when two
    /// processes built the same tables, so type and method indices mean the
    /// same to both (what the split engine's attach handshake compares).
    /// Not a security check: it catches mismatched builds, not forgeries.
    pub fn digest(&self) -> u64 {
        self.to_bytes().iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }

    /// Serializes the table set (see the module docs for the format).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = W(Vec::with_capacity(64 * (self.fields.len() + self.messages.len())));
        w.0.extend_from_slice(MAGIC);
        w.u32(VERSION);
        w.u32(self.messages.len() as u32);
        for m in &self.messages {
            for s in [m.name, m.fields, m.oneofs, m.dense, m.required] {
                w.span(s);
            }
            for v in [m.size, m.hasbit_words, m.unknown_offset, m.flags.0 as u32] {
                w.u32(v);
            }
        }
        w.u32(self.fields.len() as u32);
        for f in &self.fields {
            w.field(f);
        }
        w.u32(self.oneofs.len() as u32);
        for o in &self.oneofs {
            w.span(o.name);
            w.u32(o.case_offset);
            w.u32(o.data_offset);
        }
        w.u32(self.enums.len() as u32);
        for e in &self.enums {
            w.span(e.name);
            w.span(e.values);
            w.u32(e.closed as u32);
        }
        w.u32(self.enum_values.len() as u32);
        for v in &self.enum_values {
            w.u32(v.number as u32);
            w.span(v.name);
        }
        w.u32(self.dense.len() as u32);
        for d in &self.dense {
            w.u32(*d as u32);
        }
        w.u32(self.words.len() as u32);
        for d in &self.words {
            w.u32(*d);
        }
        w.u32(self.extensions.len() as u32);
        for x in &self.extensions {
            w.u32(x.extendee);
            w.field(&x.field);
        }
        w.u32(self.strings.len() as u32);
        w.0.extend_from_slice(&self.strings);
        w.0
    }

    /// Reads a table set written by [`TableSet::to_bytes`], validating it.
    pub fn from_bytes(bytes: &[u8]) -> Result<TableSet, SchemaError> {
        if bytes.get(..4) != Some(MAGIC) {
            return Err(SchemaError::Corrupt("bad magic".into()));
        }
        let mut r = R { b: bytes, pos: 4 };
        let version = r.u32()?;
        if version != VERSION && version != 1 {
            return Err(SchemaError::Corrupt("unsupported version".into()));
        }
        let mut ts = TableSet::default();
        for _ in 0..r.count(14)? {
            let (name, fields, oneofs, dense, required) =
                (r.span()?, r.span()?, r.span()?, r.span()?, r.span()?);
            ts.messages.push(Message {
                name,
                fields,
                oneofs,
                dense,
                required,
                size: r.u32()?,
                hasbit_words: r.u32()?,
                unknown_offset: r.u32()?,
                flags: MessageFlags(r.u32()? as u16),
            });
        }
        for _ in 0..r.count(11)? {
            let f = r.field()?;
            ts.fields.push(f);
        }
        for _ in 0..r.count(4)? {
            ts.oneofs.push(Oneof { name: r.span()?, case_offset: r.u32()?, data_offset: r.u32()? });
        }
        for _ in 0..r.count(5)? {
            ts.enums.push(Enum { name: r.span()?, values: r.span()?, closed: r.u32()? != 0 });
        }
        for _ in 0..r.count(3)? {
            ts.enum_values.push(EnumValue { number: r.u32()? as i32, name: r.span()? });
        }
        for _ in 0..r.count(1)? {
            let d = r.u32()?;
            ts.dense.push(u16::try_from(d).map_err(|_| SchemaError::Corrupt("dense".into()))?);
        }
        for _ in 0..r.count(1)? {
            ts.words.push(r.u32()?);
        }
        if version >= 2 {
            for _ in 0..r.count(12)? {
                let extendee = r.u32()?;
                let field = r.field()?;
                ts.extensions.push(Extension { extendee, field });
            }
        }
        let n = r.u32()? as usize;
        ts.strings = bytes
            .get(r.pos..r.pos + n)
            .ok_or_else(|| SchemaError::Corrupt("truncated string pool".into()))?
            .to_vec();
        if r.pos + n != bytes.len() {
            return Err(SchemaError::Corrupt("trailing bytes".into()));
        }
        ts.validate()?;
        ts.rebuild_index();
        Ok(ts)
    }

    /// Checks every internal reference; run on anything read from bytes.
    fn validate(&self) -> Result<(), SchemaError> {
        let bad = |what: String| Err(SchemaError::Corrupt(what));
        let within = |s: Span, n: usize| {
            (s.start as usize).checked_add(s.len as usize).is_some_and(|e| e <= n)
        };
        let strings = self.strings.len();
        for (mi, m) in self.messages.iter().enumerate() {
            let ok = within(m.name, strings)
                && within(m.fields, self.fields.len())
                && within(m.oneofs, self.oneofs.len())
                && within(m.dense, self.dense.len())
                && within(m.required, self.words.len())
                && m.required.len == m.hasbit_words
                && m.size % 8 == 0
                && m.unknown_offset.checked_add(8).is_some_and(|e| e <= m.size)
                && m.hasbit_words.checked_mul(4).is_some_and(|e| e <= m.size);
            if !ok {
                return bad(format!("message {mi}: span or size out of range"));
            }
            let fields = &self.fields[m.fields.range()];
            if m.flags.has(crate::MessageFlags::MAP_ENTRY) {
                // A map entry is exactly `key = 1` and `value = 2`, both singular.
                let shape = fields.len() == 2
                    && fields.iter().zip([1, 2]).all(|(f, n)| {
                        f.number == n && !f.is_repeated() && !f.flags.has(FieldFlags::ONEOF)
                    });
                if !shape {
                    return bad(format!("message {mi}: malformed map entry"));
                }
            }
            if fields.windows(2).any(|w| w[0].number >= w[1].number) {
                return bad(format!("message {mi}: fields not sorted"));
            }
            // The dense index must point at the field with that number.
            for (i, &d) in self.dense[m.dense.range()].iter().enumerate() {
                if d != 0 && fields.get(d as usize - 1).map(|f| f.number) != Some(i as u32 + 1) {
                    return bad(format!("message {mi}: dense entry {} is wrong", i + 1));
                }
            }
            // Object size is bounded by what its slots need, so a forged
            // table cannot make every decode allocate a huge object.
            let need = 8 * (4 + m.fields.len as u64 + m.oneofs.len as u64)
                + 4 * (m.hasbit_words as u64 + m.oneofs.len as u64);
            if m.size as u64 > need || m.hasbit_words > m.fields.len.div_ceil(32) {
                return bad(format!("message {mi}: object size out of proportion"));
            }
            // Slots may not overlap: a forged layout could otherwise make one
            // field's bytes read as another's offset or length.
            let mut used = vec![false; m.size as usize];
            let mut claim = |at: u32, len: u32| -> bool {
                let r = at as usize..at as usize + len as usize;
                if r.end > used.len() || used[r.clone()].iter().any(|&u| u) {
                    return false;
                }
                used[r].iter_mut().for_each(|u| *u = true);
                true
            };
            if !claim(0, 4 * m.hasbit_words) || !claim(m.unknown_offset, 8) {
                return bad(format!("message {mi}: overlapping slots"));
            }
            for o in &self.oneofs[m.oneofs.range()] {
                if !claim(o.case_offset, 4) || !claim(o.data_offset, 8) {
                    return bad(format!("message {mi}: overlapping oneof slots"));
                }
            }
            for f in fields {
                let in_oneof = f.flags.has(FieldFlags::ONEOF) && !f.is_repeated();
                let ok = if in_oneof {
                    self.oneofs
                        .get((m.oneofs.start + f.presence) as usize)
                        .is_some_and(|o| f.presence < m.oneofs.len && o.data_offset == f.offset)
                } else {
                    let size = if f.is_repeated() { 8 } else { f.kind.slot_size() };
                    claim(f.offset, size)
                };
                if !ok {
                    return bad(format!("message {mi} field {}: overlapping slot", f.number));
                }
                // Flags must fit the kind.
                let flags = f.flags;
                let consistent = (!flags.has(FieldFlags::CLOSED_ENUM) || f.kind == Kind::Enum)
                    && (!flags.has(FieldFlags::UTF8) || f.kind == Kind::String)
                    && (!flags.has(FieldFlags::PACKED) || (f.is_repeated() && f.kind.is_scalar()))
                    && (!flags.has(FieldFlags::MAP)
                        || (f.is_repeated()
                            && f.kind == Kind::Message
                            && self
                                .messages
                                .get(f.sub as usize)
                                .is_some_and(|e| e.flags.has(crate::MessageFlags::MAP_ENTRY))))
                    && (!flags.has(FieldFlags::ONEOF) || !f.is_repeated())
                    && (!flags.has(FieldFlags::DEVICE) || crate::lower::placeable(f.kind, f.label));
                if !consistent {
                    return bad(format!(
                        "message {mi} field {}: flags do not fit its type",
                        f.number
                    ));
                }
            }
            for o in &self.oneofs[m.oneofs.range()] {
                let ok = within(o.name, strings)
                    && o.case_offset.checked_add(4).is_some_and(|e| e <= m.size)
                    && o.data_offset.checked_add(8).is_some_and(|e| e <= m.size);
                if !ok {
                    return bad(format!("message {mi}: oneof out of range"));
                }
            }
            for f in fields {
                let size = if f.is_repeated() || f.flags.has(FieldFlags::ONEOF) {
                    8
                } else {
                    f.kind.slot_size()
                };
                let presence_ok = if f.is_repeated() {
                    f.presence == NONE
                } else if f.flags.has(FieldFlags::ONEOF) {
                    f.presence < m.oneofs.len
                } else {
                    f.presence < m.hasbit_words * 32
                };
                let sub_ok = match f.kind {
                    Kind::Message | Kind::Group => (f.sub as usize) < self.messages.len(),
                    Kind::Enum => (f.sub as usize) < self.enums.len(),
                    _ => true,
                };
                let ok = (1..=536_870_911).contains(&f.number)
                    && f.offset.checked_add(size).is_some_and(|e| e <= m.size)
                    && presence_ok
                    && sub_ok
                    && within(f.name, strings)
                    && within(f.json_name, strings);
                if !ok {
                    return bad(format!("message {mi} field {}: out of range", f.number));
                }
                if matches!(f.kind, Kind::String | Kind::Bytes) {
                    let s = Span { start: (f.default >> 32) as u32, len: f.default as u32 };
                    if !within(s, strings) {
                        return bad(format!("message {mi} field {}: default", f.number));
                    }
                }
            }
        }
        for (ei, e) in self.enums.iter().enumerate() {
            if !within(e.name, strings) || !within(e.values, self.enum_values.len()) {
                return bad(format!("enum {ei}: span out of range"));
            }
            let values = &self.enum_values[e.values.range()];
            if values.windows(2).any(|w| w[0].number > w[1].number)
                || values.iter().any(|v| !within(v.name, strings))
            {
                return bad(format!("enum {ei}: values malformed"));
            }
        }
        // Extensions: sorted, one per (extendee, number), each a slotless
        // field whose references and flags hold.
        let key = |x: &Extension| (x.extendee, x.field.number);
        if self.extensions.windows(2).any(|w| key(&w[0]) >= key(&w[1])) {
            return bad("extensions not sorted".to_owned());
        }
        for x in &self.extensions {
            let f = &x.field;
            let sub_ok = match f.kind {
                Kind::Message | Kind::Group => (f.sub as usize) < self.messages.len(),
                Kind::Enum => (f.sub as usize) < self.enums.len(),
                _ => true,
            };
            let flags = f.flags;
            let only = FieldFlags::CLOSED_ENUM | FieldFlags::UTF8 | FieldFlags::PACKED;
            let ok = (x.extendee as usize) < self.messages.len()
                && (1..=536_870_911).contains(&f.number)
                && f.offset == 0
                && f.presence == NONE
                && sub_ok
                && within(f.name, strings)
                && within(f.json_name, strings)
                && flags.0 & !only == 0
                && (!flags.has(FieldFlags::CLOSED_ENUM) || f.kind == Kind::Enum)
                && (!flags.has(FieldFlags::UTF8) || f.kind == Kind::String)
                && (!flags.has(FieldFlags::PACKED) || (f.is_repeated() && f.kind.is_scalar()));
            if !ok {
                return bad(format!("extension {} of message {}: malformed", f.number, x.extendee));
            }
        }
        Ok(())
    }
}
