//! What can go wrong in the per-field study ([`crate::perfield`]): a case
//! or an option out of range, the measured schema not loading, a
//! generated message that does not decode or decodes to something else.
//!
//! The compute units ([`crate::cu`]) have their own errors
//! ([`crate::cu::CuError`] and the others beside it).

use std::fmt;

use protoplane_schema::SchemaError;
use protoplane_wire::{BlockError, DecodeError};

use crate::perfield::Case;

/// The offload crate's result.
pub type Result<T> = std::result::Result<T, Error>;

/// Why a per-field measurement could not be set up or failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A case name that is none of `varint-N`, `float`, `double`,
    /// `string-N` (what [`Case::from_str`](std::str::FromStr) parses).
    UnknownCase(String),
    /// A case that cannot be measured: a varint of other than 1..=10
    /// bytes, or an empty string (absent once decoded).
    InvalidCase(Case),
    /// A worker count of 0.
    ZeroWorkers,
    /// No repetitions asked for.
    NoRepetitions,
    /// Fewer messages than workers: some worker would have no share.
    TooFewMessages {
        /// Messages asked for.
        messages: usize,
        /// The largest worker count.
        workers: usize,
    },
    /// A case's message set would be larger than the study allows.
    SetTooLarge {
        /// The case.
        case: Case,
        /// Messages asked for.
        messages: usize,
        /// Bytes they would take.
        bytes: usize,
        /// Bytes allowed.
        limit: usize,
    },
    /// The measured schema did not compile or load.
    Schema(SchemaError),
    /// The measured schema lacks a case's message type.
    MissingMessageType(String),
    /// The generator produced a field or a message of the wrong length
    /// (a bug).
    Generation {
        /// The case.
        case: Case,
        /// What came out wrong: `"a varint"` or `"a message"`.
        what: &'static str,
    },
    /// A generated message did not decode.
    Decode {
        /// The case.
        case: Case,
        /// The message's index in its set.
        message: usize,
        /// The decoder's error.
        source: DecodeError,
    },
    /// A decoded message differs from what was generated.
    Verify {
        /// The case.
        case: Case,
        /// The message's index in its set.
        message: usize,
        /// What differs.
        mismatch: Mismatch,
    },
    /// A decoding worker thread panicked.
    WorkerPanicked,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::UnknownCase(s) => {
                write!(f, "unknown case {s:?} (varint-2..10, float, double, string-N)")
            }
            Error::InvalidCase(case @ Case::String(0)) => {
                write!(f, "{case}: an empty proto3 string is not present once decoded")
            }
            Error::InvalidCase(case @ Case::Varint(_)) => {
                write!(f, "{case}: a varint takes 1..=10 bytes")
            }
            Error::InvalidCase(case) => write!(f, "{case}: not a measurable case"),
            Error::ZeroWorkers => f.write_str("a worker count must be at least 1"),
            Error::NoRepetitions => f.write_str("at least one repetition is needed"),
            Error::TooFewMessages { messages, workers } => {
                write!(f, "{messages} message(s) cannot give each of {workers} workers a share")
            }
            Error::SetTooLarge { case, messages, bytes, limit } => {
                write!(f, "{case}: {messages} messages take {bytes} bytes, over {limit}")
            }
            Error::Schema(e) => write!(f, "perfield schema: {e}"),
            Error::MissingMessageType(name) => write!(f, "no message {name}"),
            Error::Generation { case, what } => {
                write!(f, "{case}: generated {what} of the wrong length")
            }
            Error::Decode { case, message, source } => {
                write!(f, "{case}: message {message} does not decode: {source}")
            }
            Error::Verify { case, message, mismatch } => {
                write!(f, "{case}: message {message}: {mismatch}")
            }
            Error::WorkerPanicked => f.write_str("a decode worker panicked"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Schema(e) => Some(e),
            Error::Decode { source, .. } => Some(source),
            Error::Verify { mismatch, .. } => Some(mismatch),
            _ => None,
        }
    }
}

impl From<SchemaError> for Error {
    fn from(e: SchemaError) -> Self {
        Error::Schema(e)
    }
}

/// How a decoded message differs from the generated one
/// ([`crate::perfield::MessageSet::verify`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mismatch {
    /// The block cannot be viewed as the case's message type.
    View(BlockError),
    /// The set has no message of that index.
    NoSuchMessage,
    /// A field of the block cannot be read.
    Field {
        /// The field's number.
        number: u32,
        /// Why it cannot be read.
        error: BlockError,
    },
    /// A field holds another value than was generated (or is a field that
    /// was not generated).
    Value {
        /// The field's number.
        number: u32,
        /// The decoded value (its `Debug` form).
        decoded: String,
    },
    /// Not every generated field was decoded.
    FieldCount {
        /// Fields decoded.
        decoded: usize,
        /// Fields sent.
        sent: usize,
    },
    /// The block's unknown fields cannot be read.
    UnknownFieldsUnreadable(BlockError),
    /// The block has unknown fields (none were generated).
    UnknownFields {
        /// Their bytes.
        bytes: usize,
    },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::View(e) => write!(f, "no view: {e:?}"),
            Mismatch::NoSuchMessage => f.write_str("no such message"),
            Mismatch::Field { number, error } => write!(f, "field {number}: {error:?}"),
            Mismatch::Value { number, decoded } => {
                write!(f, "field {number} decoded as {decoded}")
            }
            Mismatch::FieldCount { decoded, sent } => {
                write!(f, "{decoded} field(s) decoded, {sent} sent")
            }
            Mismatch::UnknownFieldsUnreadable(e) => write!(f, "{e:?}"),
            Mismatch::UnknownFields { bytes } => write!(f, "{bytes} byte(s) of unknown fields"),
        }
    }
}

impl std::error::Error for Mismatch {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Mismatch::View(e) | Mismatch::Field { error: e, .. } => Some(e),
            Mismatch::UnknownFieldsUnreadable(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::perfield::{self, PerFieldOptions};

    #[test]
    fn bad_cases_and_options_are_told_apart() {
        assert!(matches!("int32".parse::<Case>(), Err(Error::UnknownCase(s)) if s == "int32"));
        assert!(matches!("varint-11".parse::<Case>(), Err(Error::InvalidCase(Case::Varint(11)))));
        let e = "string-0".parse::<Case>().err();
        assert_eq!(
            e.map(|e| e.to_string()).as_deref(),
            Some("string-0: an empty proto3 string is not present once decoded")
        );
        let ok = PerFieldOptions {
            workers: vec![1, 4],
            messages: 2,
            min_time: Duration::from_millis(1),
            repetitions: 1,
            cases: vec![Case::Float],
        };
        match perfield::run(&ok) {
            Err(Error::TooFewMessages { messages: 2, workers: 4 }) => {}
            other => panic!("expected Error::TooFewMessages, got {other:?}"),
        }
        let zero = PerFieldOptions { workers: vec![0], ..ok };
        assert!(matches!(perfield::run(&zero), Err(Error::ZeroWorkers)));
    }

    #[test]
    fn a_wrong_block_is_a_verify_error() {
        let tables = perfield::schema().expect("schema");
        let set = perfield::MessageSet::generate(&tables, Case::Double, 2).expect("set");
        let other = perfield::MessageSet::generate(&tables, Case::Varint(3), 1).expect("set");
        let block = protoplane_wire::decode(
            &tables,
            other.type_index(),
            other.message(0),
            &protoplane_wire::DecodeOptions::default(),
        )
        .expect("decodes");
        let got = set.verify(&tables, 1, &block);
        assert!(
            matches!(got, Err(Error::Verify { case: Case::Double, message: 1, .. })),
            "{got:?}"
        );
        let own = protoplane_wire::decode(
            &tables,
            set.type_index(),
            set.message(0),
            &protoplane_wire::DecodeOptions::default(),
        )
        .expect("decodes");
        assert!(set.verify(&tables, 0, &own).is_ok());
        let got = set.verify(&tables, 7, &own);
        assert!(
            matches!(got, Err(Error::Verify { mismatch: Mismatch::NoSuchMessage, .. })),
            "{got:?}"
        );
    }
}
