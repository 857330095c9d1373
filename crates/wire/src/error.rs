//! Errors. Each names what went wrong and where: the message type being
//! decoded, the field number (0 when the tag itself was unreadable) and the
//! byte offset of the field's tag in the input.

use std::fmt;

/// What was wrong with the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The input ended inside a tag, varint, fixed-width value or payload.
    Truncated,
    /// A varint ran past ten bytes.
    VarintTooLong,
    /// A tag's value does not fit 32 bits.
    TagTooLarge,
    /// A tag or a length prefix encoded in more than five bytes.
    OverlongTagOrLength,
    /// Field number 0.
    FieldNumberZero,
    /// Wire type 6 or 7.
    InvalidWireType,
    /// A length prefix points past the end of the enclosing message.
    LengthOutOfBounds,
    /// A string, bytes field or array longer than a block can describe (2^30 - 1).
    TooLong,
    /// An end-group tag that closes no open group (or the wrong one).
    UnmatchedEndGroup,
    /// The input ended inside a group.
    UnterminatedGroup,
    /// Nesting deeper than the configured limit.
    DepthExceeded,
    /// A proto3 `string` that is not valid UTF-8.
    InvalidUtf8,
    /// Packed fixed-width data whose length is not a multiple of the element size.
    PackedLength,
    /// A proto2 `required` field is missing.
    MissingRequired,
    /// The decoded block would exceed the configured size limit.
    BlockTooLarge,
    /// The type index is not in the table set.
    UnknownType,
}

impl From<crate::varint::VarintError> for DecodeErrorKind {
    fn from(e: crate::varint::VarintError) -> Self {
        match e {
            crate::varint::VarintError::Truncated => DecodeErrorKind::Truncated,
            crate::varint::VarintError::TooLong => DecodeErrorKind::VarintTooLong,
            crate::varint::VarintError::Overlong => DecodeErrorKind::OverlongTagOrLength,
        }
    }
}

impl DecodeErrorKind {
    fn text(self) -> &'static str {
        use DecodeErrorKind::*;
        match self {
            Truncated => "truncated input",
            VarintTooLong => "varint longer than 10 bytes",
            TagTooLarge => "tag does not fit 32 bits",
            OverlongTagOrLength => "tag or length prefix longer than 5 bytes",
            FieldNumberZero => "field number 0",
            InvalidWireType => "invalid wire type (6 or 7)",
            LengthOutOfBounds => "length exceeds the enclosing message",
            TooLong => "string, bytes or array too long",
            UnmatchedEndGroup => "end-group tag without matching start-group",
            UnterminatedGroup => "group not terminated",
            DepthExceeded => "nesting depth limit exceeded",
            InvalidUtf8 => "invalid UTF-8 in string field",
            PackedLength => "packed fixed-width data has a partial element",
            MissingRequired => "required field missing",
            BlockTooLarge => "decoded message exceeds the size limit",
            UnknownType => "unknown message type",
        }
    }
}

/// A decode failure with its location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// What was wrong.
    pub kind: DecodeErrorKind,
    /// Fully qualified type of the message being decoded when it happened.
    pub message: String,
    /// Field number (0 if unknown).
    pub field: u32,
    /// Byte offset in the input of the field's tag (or of the problem).
    pub offset: usize,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: type {} field {} at byte {}",
            self.kind.text(),
            self.message,
            self.field,
            self.offset
        )
    }
}

impl std::error::Error for DecodeError {}

/// Why a block could not be read or encoded: it was not produced by a
/// well-behaved decoder or builder (e.g. corrupted by another process).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlockError {
    /// An offset or length points outside the block (or the wire bytes).
    OutOfBounds {
        /// Offset of the object or reference being followed.
        at: usize,
    },
    /// The header names a type that does not match or does not exist.
    WrongType,
    /// Deeper than the encoder's depth limit (also catches reference cycles).
    TooDeep,
    /// The encoding would exceed the size limit (also bounds the work a
    /// block with shared sub-objects can cause).
    TooLarge,
    /// The block references the device region but none was supplied.
    NoDeviceRegion,
}

impl fmt::Display for BlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockError::OutOfBounds { at } => write!(f, "block reference out of bounds at {at}"),
            BlockError::WrongType => write!(f, "block type does not match the table set"),
            BlockError::TooDeep => write!(f, "block nesting exceeds the depth limit"),
            BlockError::TooLarge => write!(f, "encoded message would exceed the size limit"),
            BlockError::NoDeviceRegion => write!(f, "block references a device region"),
        }
    }
}

impl std::error::Error for BlockError {}

#[cfg(test)]
mod tests {
    #[test]
    fn block_error_stays_two_words() {
        // It is in the result of every encoder frame: a variant added here
        // (even one this size) showed as +5% instructions per encode
        // (`scripts/icount.sh`), so errors of other layers stay out of it.
        assert_eq!(std::mem::size_of::<super::BlockError>(), 16);
    }
}
