use std::fmt;

/// Why a schema could not be loaded or a table set could not be read back.
#[derive(Debug)]
#[non_exhaustive]
pub enum SchemaError {
    /// The `.proto` compiler rejected the input (syntax, unresolved import, …).
    Compile(String),
    /// A serialized `FileDescriptorSet` did not decode.
    Descriptor(String),
    /// The descriptors are well-formed but use something the tables cannot express.
    Unsupported(String),
    /// A serialized table set is malformed (bad magic, truncated, index out of range).
    Corrupt(String),
    /// A lookup by name failed.
    UnknownName(String),
    /// A placement (the `(protoplane.placement)` option, an engine-config
    /// entry, a run-time update) names a field that cannot be placed there,
    /// or is malformed.
    Placement(String),
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaError::Compile(m) => write!(f, "cannot compile .proto: {m}"),
            SchemaError::Descriptor(m) => write!(f, "cannot read FileDescriptorSet: {m}"),
            SchemaError::Unsupported(m) => write!(f, "unsupported schema feature: {m}"),
            SchemaError::Corrupt(m) => write!(f, "corrupt table set: {m}"),
            SchemaError::UnknownName(m) => write!(f, "no such type or field: {m}"),
            SchemaError::Placement(m) => write!(f, "invalid placement: {m}"),
        }
    }
}

impl std::error::Error for SchemaError {}
