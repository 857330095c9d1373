//! Protobuf bytes by hand.

/// Wire type of varint fields.
pub const VARINT: u32 = 0;
/// Wire type of 8-byte fields.
pub const FIXED64: u32 = 1;
/// Wire type of length-delimited fields (strings, bytes, messages, packed).
pub const LEN: u32 = 2;
/// Wire type of a group's start.
pub const START_GROUP: u32 = 3;
/// Wire type of a group's end.
pub const END_GROUP: u32 = 4;
/// Wire type of 4-byte fields.
pub const FIXED32: u32 = 5;

/// Appends `v` as a base-128 varint, shortest form.
pub fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// `v` as a varint, on its own.
pub fn varint_bytes(v: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(10);
    varint(&mut out, v);
    out
}

/// Appends the tag of field `number` with `wire_type`.
pub fn tag(out: &mut Vec<u8>, number: u32, wire_type: u32) {
    varint(out, u64::from(number) << 3 | u64::from(wire_type));
}

/// Appends a varint field.
pub fn varint_field(out: &mut Vec<u8>, number: u32, v: u64) {
    tag(out, number, VARINT);
    varint(out, v);
}

/// Appends a length-delimited field: a string, bytes, a message.
pub fn len_field(out: &mut Vec<u8>, number: u32, data: impl AsRef<[u8]>) {
    let data = data.as_ref();
    tag(out, number, LEN);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

/// Appends a 4-byte field.
pub fn fixed32_field(out: &mut Vec<u8>, number: u32, v: u32) {
    tag(out, number, FIXED32);
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends an 8-byte field.
pub fn fixed64_field(out: &mut Vec<u8>, number: u32, v: u64) {
    tag(out, number, FIXED64);
    out.extend_from_slice(&v.to_le_bytes());
}

/// A message written field by field, in the order given (duplicates,
/// unknown numbers and wrong wire types included, when a test wants them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Msg(Vec<u8>);

impl Msg {
    /// An empty message.
    pub fn new() -> Msg {
        Msg::default()
    }

    /// A varint field.
    pub fn varint(mut self, number: u32, v: u64) -> Msg {
        varint_field(&mut self.0, number, v);
        self
    }

    /// A length-delimited field.
    pub fn bytes(mut self, number: u32, data: impl AsRef<[u8]>) -> Msg {
        len_field(&mut self.0, number, data);
        self
    }

    /// A sub-message field.
    pub fn message(self, number: u32, m: Msg) -> Msg {
        self.bytes(number, m.0)
    }

    /// A 4-byte field.
    pub fn fixed32(mut self, number: u32, v: u32) -> Msg {
        fixed32_field(&mut self.0, number, v);
        self
    }

    /// An 8-byte field.
    pub fn fixed64(mut self, number: u32, v: u64) -> Msg {
        fixed64_field(&mut self.0, number, v);
        self
    }

    /// Raw bytes, as they are.
    pub fn raw(mut self, bytes: impl AsRef<[u8]>) -> Msg {
        self.0.extend_from_slice(bytes.as_ref());
        self
    }

    /// The encoded message.
    pub fn finish(self) -> Vec<u8> {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_encodings() {
        // The examples of the protobuf encoding guide.
        assert_eq!(varint_bytes(1), [0x01]);
        assert_eq!(varint_bytes(150), [0x96, 0x01]);
        assert_eq!(varint_bytes(u64::MAX).len(), 10);
        assert_eq!(Msg::new().varint(1, 150).finish(), [0x08, 0x96, 0x01]);
        assert_eq!(Msg::new().bytes(2, "testing").finish(), b"\x12\x07testing");
        let inner = Msg::new().varint(1, 150);
        assert_eq!(Msg::new().message(3, inner).finish(), [0x1a, 0x03, 0x08, 0x96, 0x01]);
        assert_eq!(Msg::new().fixed32(1, 1).finish(), [0x0d, 1, 0, 0, 0]);
        assert_eq!(Msg::new().fixed64(1, 1).finish(), [0x09, 1, 0, 0, 0, 0, 0, 0, 0]);
    }
}
