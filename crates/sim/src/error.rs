//! What can go wrong in a simulation: loading a dataset (its manifest, its
//! files, its schema), or replaying a message through the decoders, the
//! builders and the encoder.

use std::fmt;
use std::io;
use std::path::PathBuf;

use protoplane_schema::SchemaError;
use protoplane_wire::{BlockError, BuildError, DecodeError};

/// The simulator's result.
pub type Result<T> = std::result::Result<T, Error>;

/// Why a dataset did not load or a replay failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A dataset directory's `manifest.tsv` could not be read (missing or
    /// unreadable).
    ManifestRead {
        /// The manifest's path.
        path: PathBuf,
        /// Why reading it failed.
        source: io::Error,
    },
    /// A dataset directory's `manifest.tsv` is not UTF-8.
    ManifestNotUtf8 {
        /// The manifest's path.
        path: PathBuf,
    },
    /// A dataset directory's `manifest.tsv` lacks the `type` or the `path`
    /// column.
    ManifestColumns {
        /// The dataset directory.
        dir: PathBuf,
    },
    /// A file or directory of a dataset could not be read.
    Read {
        /// What was read.
        path: PathBuf,
        /// Why reading it failed.
        source: io::Error,
    },
    /// A directory of length-delimited recordings has no
    /// `*.descriptor_set.pb`.
    NoDescriptorSet {
        /// The dataset directory.
        dir: PathBuf,
    },
    /// A schema (a dataset's descriptor set, a built-in `.proto`) did not
    /// load.
    Schema(SchemaError),
    /// A message type the schema does not have.
    UnknownType {
        /// The schema's origin: the dataset directory, or which built-in.
        schema: String,
        /// The fully qualified name looked up.
        name: String,
    },
    /// A length-delimited recording is malformed.
    Recording {
        /// The recording's path.
        path: PathBuf,
        /// What is wrong with it.
        source: FramingError,
    },
    /// A message did not decode (plain decode or commit decode).
    Decode(DecodeError),
    /// A decoded block could not be read or encoded.
    Block(BlockError),
    /// A builder refused a call while laying a message out.
    Build(BuildError),
    /// The field-by-field commit gave another message than the plain
    /// decode.
    FieldByFieldMismatch,
    /// The one-shot commit gave another message than the plain decode.
    OneShotMismatch,
    /// A message laid out by its builder script encodes to another message
    /// than the one it was recorded from.
    LayOutMismatch,
    /// The tables have a field without an op (inconsistent tables).
    FieldWithoutOp,
    /// A builder script closes more messages than it opens.
    UnbalancedScript,
    /// A replay of one sample failed.
    Sample {
        /// The sample's group.
        group: String,
        /// The sample's name.
        name: String,
        /// What went wrong.
        source: Box<Error>,
    },
}

impl Error {
    /// `self` as it happened replaying the sample `group`/`name`.
    pub fn in_sample(self, group: &str, name: &str) -> Error {
        Error::Sample { group: group.to_owned(), name: name.to_owned(), source: Box::new(self) }
    }

    /// The error underneath any [`Error::Sample`] wrappers.
    pub fn innermost(&self) -> &Error {
        match self {
            Error::Sample { source, .. } => source.innermost(),
            e => e,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::ManifestRead { path, source } | Error::Read { path, source } => {
                write!(f, "{}: {source}", path.display())
            }
            Error::ManifestNotUtf8 { .. } => f.write_str("manifest.tsv is not UTF-8"),
            Error::ManifestColumns { dir } => {
                write!(f, "{}: manifest.tsv needs type and path columns", dir.display())
            }
            Error::NoDescriptorSet { dir } => {
                write!(f, "{}: no *.descriptor_set.pb", dir.display())
            }
            Error::Schema(e) => e.fmt(f),
            Error::UnknownType { schema, name } => write!(f, "{schema}: no message type {name}"),
            Error::Recording { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Decode(e) => e.fmt(f),
            Error::Block(e) => e.fmt(f),
            Error::Build(e) => e.fmt(f),
            Error::FieldByFieldMismatch => f.write_str("field-by-field gave another message"),
            Error::OneShotMismatch => f.write_str("one-shot gave another message"),
            Error::LayOutMismatch => f.write_str("the laid-out block is another message"),
            Error::FieldWithoutOp => f.write_str("a field without an op"),
            Error::UnbalancedScript => f.write_str("unbalanced script"),
            Error::Sample { group, name, source } => write!(f, "{group}/{name}: {source}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::ManifestRead { source, .. } | Error::Read { source, .. } => Some(source),
            Error::Schema(e) => Some(e),
            Error::Recording { source, .. } => Some(source),
            Error::Decode(e) => Some(e),
            Error::Block(e) => Some(e),
            Error::Build(e) => Some(e),
            Error::Sample { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

impl From<SchemaError> for Error {
    fn from(e: SchemaError) -> Self {
        Error::Schema(e)
    }
}

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Self {
        Error::Decode(e)
    }
}

impl From<BlockError> for Error {
    fn from(e: BlockError) -> Self {
        Error::Block(e)
    }
}

impl From<BuildError> for Error {
    fn from(e: BuildError) -> Self {
        Error::Build(e)
    }
}

/// What is wrong with the framing of a length-delimited recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FramingError {
    /// The recording ends inside a length prefix.
    TruncatedPrefix,
    /// A length prefix is longer than any length needs.
    PrefixTooLong,
    /// The recording ends inside a message.
    TruncatedMessage,
}

impl fmt::Display for FramingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FramingError::TruncatedPrefix => "truncated length prefix",
            FramingError::PrefixTooLong => "length prefix too long",
            FramingError::TruncatedMessage => "truncated message",
        })
    }
}

impl std::error::Error for FramingError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_without_a_manifest_is_a_manifest_error() {
        let dir = std::env::temp_dir().join(format!("protoplane-sim-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let got = crate::dataset::load(&dir);
        let _ = std::fs::remove_dir(&dir);
        match got {
            Err(Error::ManifestRead { path, source }) => {
                assert_eq!(path, dir.join("manifest.tsv"));
                assert_eq!(source.kind(), io::ErrorKind::NotFound);
            }
            other => panic!("expected Error::ManifestRead, got {other:?}"),
        }
    }

    #[test]
    fn a_manifest_without_columns_and_a_bad_recording_are_told_apart() {
        let dir =
            std::env::temp_dir().join(format!("protoplane-sim-columns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("manifest.tsv"), "bench\tmessage\n").expect("manifest");
        let got = crate::dataset::load(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(matches!(got, Err(Error::ManifestColumns { .. })), "{got:?}");
        let e =
            Error::Recording { path: "x.ldelim".into(), source: FramingError::TruncatedMessage };
        assert_eq!(e.to_string(), "x.ldelim: truncated message");
        let wrapped = Error::OneShotMismatch.in_sample("bench0", "M1");
        assert_eq!(wrapped.to_string(), "bench0/M1: one-shot gave another message");
        assert!(matches!(wrapped.innermost(), Error::OneShotMismatch));
    }
}
