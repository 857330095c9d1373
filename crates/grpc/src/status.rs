//! gRPC status: the code, the message, and how both travel in trailers.
//!
//! * `grpc-status` is the code as a decimal ASCII integer;
//! * `grpc-message` is the message, percent-encoded: bytes outside
//!   `%x20-%x7E` and `%` itself become `%XX` (upper-case hex). A receiver
//!   must not fail on a malformed encoding: invalid `%` sequences are kept
//!   as they are, and bytes that do not form UTF-8 are replaced;
//! * `grpc-status-details-bin` carries the rich error model: a serialized
//!   `google.rpc.Status` (code, message and typed details, see
//!   [`crate::rich`]), base64-encoded like every `-bin` value. The status
//!   keeps those bytes as they are ([`Status::details`]); they are parsed
//!   only when asked for;
//! * a response that is not gRPC at all (a proxy's HTTP error) maps its HTTP
//!   status to a code ([`Code::from_http`]).

use std::fmt;

use bytes::Bytes;

use crate::metadata::Metadata;

/// The status codes, with gRPC's numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Code {
    /// Not an error.
    Ok = 0,
    /// The operation was cancelled, typically by the caller.
    Cancelled = 1,
    /// Unknown error.
    Unknown = 2,
    /// The client specified an invalid argument.
    InvalidArgument = 3,
    /// The deadline expired before the operation could complete.
    DeadlineExceeded = 4,
    /// Some requested entity was not found.
    NotFound = 5,
    /// The entity a client attempted to create already exists.
    AlreadyExists = 6,
    /// The caller may not execute the operation.
    PermissionDenied = 7,
    /// Some resource has been exhausted (a size limit, a quota).
    ResourceExhausted = 8,
    /// The system is not in a state required for the operation.
    FailedPrecondition = 9,
    /// The operation was aborted (a concurrency conflict).
    Aborted = 10,
    /// The operation was attempted past the valid range.
    OutOfRange = 11,
    /// The operation is not implemented or supported.
    Unimplemented = 12,
    /// An invariant expected by the system was broken.
    Internal = 13,
    /// The service is currently unavailable.
    Unavailable = 14,
    /// Unrecoverable data loss or corruption.
    DataLoss = 15,
    /// The request lacks valid authentication credentials.
    Unauthenticated = 16,
}

const ALL: [Code; 17] = [
    Code::Ok,
    Code::Cancelled,
    Code::Unknown,
    Code::InvalidArgument,
    Code::DeadlineExceeded,
    Code::NotFound,
    Code::AlreadyExists,
    Code::PermissionDenied,
    Code::ResourceExhausted,
    Code::FailedPrecondition,
    Code::Aborted,
    Code::OutOfRange,
    Code::Unimplemented,
    Code::Internal,
    Code::Unavailable,
    Code::DataLoss,
    Code::Unauthenticated,
];

impl Code {
    /// The code with number `n`; numbers gRPC does not define are `Unknown`
    /// (the protocol's rule for codes a peer does not recognise).
    pub fn from_u32(n: u32) -> Code {
        ALL.get(n as usize).copied().unwrap_or(Code::Unknown)
    }

    /// Parses a `grpc-status` header value: decimal digits only, else `None`.
    pub fn from_header(value: &[u8]) -> Option<Code> {
        if value.is_empty() || value.len() > 10 || !value.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n = value.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
        Some(u32::try_from(n).map_or(Code::Unknown, Code::from_u32))
    }

    /// The `grpc-status` header value.
    pub fn header_value(self) -> &'static str {
        const DIGITS: [&str; 17] = [
            "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
            "16",
        ];
        DIGITS[self as usize]
    }

    /// The canonical upper-case name (`DEADLINE_EXCEEDED`).
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Cancelled => "CANCELLED",
            Code::Unknown => "UNKNOWN",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::NotFound => "NOT_FOUND",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Aborted => "ABORTED",
            Code::OutOfRange => "OUT_OF_RANGE",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::DataLoss => "DATA_LOSS",
            Code::Unauthenticated => "UNAUTHENTICATED",
        }
    }

    /// The code for a response whose HTTP status is not 200 (so not a gRPC
    /// response): gRPC's "HTTP to gRPC status code mapping".
    pub fn from_http(status: u16) -> Code {
        match status {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The trailer that carries a status's details.
pub const DETAILS_KEY: &str = "grpc-status-details-bin";

/// A call's outcome: a code, a human-readable message, and optionally
/// machine-readable details.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The code.
    pub code: Code,
    /// The message (may be empty).
    pub message: String,
    /// Trailing metadata sent with the status.
    pub metadata: Metadata,
    /// The serialized `google.rpc.Status` sent as `grpc-status-details-bin`
    /// (empty: none). Build and read it with the typed helpers of
    /// [`crate::rich`] ([`Status::with_error_details`],
    /// [`Status::error_details`], ...), or set raw bytes with
    /// [`Status::with_details`].
    pub details: Bytes,
}

impl Status {
    /// A status with a message.
    pub fn new(code: Code, message: impl Into<String>) -> Status {
        Status { code, message: message.into(), metadata: Metadata::new(), details: Bytes::new() }
    }

    /// A status with details given as bytes: a serialized
    /// `google.rpc.Status`, sent as they are (tonic's `Status::with_details`).
    pub fn with_details(code: Code, message: impl Into<String>, details: Bytes) -> Status {
        Status { details, ..Status::new(code, message) }
    }

    /// The raw details (a serialized `google.rpc.Status`; empty: none).
    pub fn details(&self) -> &[u8] {
        &self.details
    }

    /// Success.
    pub fn ok() -> Status {
        Status::new(Code::Ok, "")
    }

    /// Reads the status from trailer values (`grpc-status`, `grpc-message`).
    /// A missing or malformed `grpc-status` is `Unknown`, as the protocol
    /// requires: the call did not end the way gRPC says it must.
    pub fn from_trailers(status: Option<&[u8]>, message: Option<&[u8]>) -> Status {
        match status.and_then(Code::from_header) {
            Some(code) => Status::new(code, message.map(decode_message).unwrap_or_default()),
            None => Status::new(
                Code::Unknown,
                match status {
                    None => "missing grpc-status".to_string(),
                    Some(v) => format!("malformed grpc-status {:?}", String::from_utf8_lossy(v)),
                },
            ),
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.code)
        } else {
            write!(f, "{}: {}", self.code, self.message)
        }
    }
}

impl std::error::Error for Status {}

/// Percent-encodes a status message for the `grpc-message` header.
pub fn encode_message(message: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 15) as usize] as char);
        }
    }
    out
}

/// Decodes a `grpc-message` value. Never fails: a `%` not followed by two
/// hex digits stays as it is, and the result is made valid UTF-8.
pub fn decode_message(value: &[u8]) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        if value[i] == b'%' {
            if let (Some(h), Some(l)) =
                (value.get(i + 1).and_then(|&b| hex(b)), value.get(i + 2).and_then(|&b| hex(b)))
            {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(value[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_through_headers() {
        for (n, code) in ALL.iter().enumerate() {
            assert_eq!(*code as usize, n);
            assert_eq!(Code::from_header(code.header_value().as_bytes()), Some(*code));
        }
        assert_eq!(Code::from_header(b"17"), Some(Code::Unknown));
        assert_eq!(Code::from_header(b"99999999999"), None);
        assert_eq!(Code::from_header(b"4294967296"), Some(Code::Unknown));
        for bad in [&b""[..], b" 1", b"1 ", b"-1", b"0x1", b"1.0"] {
            assert_eq!(Code::from_header(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn http_statuses_map_like_grpc() {
        let cases = [
            (400, Code::Internal),
            (401, Code::Unauthenticated),
            (403, Code::PermissionDenied),
            (404, Code::Unimplemented),
            (429, Code::Unavailable),
            (502, Code::Unavailable),
            (503, Code::Unavailable),
            (504, Code::Unavailable),
            (500, Code::Unknown),
            (302, Code::Unknown),
        ];
        for (http, code) in cases {
            assert_eq!(Code::from_http(http), code, "{http}");
        }
    }

    #[test]
    fn messages_are_percent_encoded() {
        // The interop suite's special_status_message case.
        let special = "\t\ntest with whitespace\r\nand Unicode BMP ☺ and non-BMP 😈\t\n";
        let enc = encode_message(special);
        assert!(enc.bytes().all(|b| (0x20..=0x7e).contains(&b)), "{enc}");
        assert!(enc.starts_with("%09%0Atest with whitespace%0D%0A"), "{enc}");
        assert_eq!(decode_message(enc.as_bytes()), special);
        assert_eq!(encode_message("100% done"), "100%25 done");
        assert_eq!(decode_message(b"100%25 done"), "100% done");
    }

    #[test]
    fn malformed_messages_decode_leniently() {
        assert_eq!(decode_message(b"50%"), "50%");
        assert_eq!(decode_message(b"%zz%4"), "%zz%4");
        assert_eq!(decode_message(b"%e2%98"), "\u{fffd}");
        assert_eq!(decode_message(b"%e2%98%ba"), "☺");
    }

    #[test]
    fn trailers_without_a_valid_status_are_unknown() {
        assert_eq!(
            Status::from_trailers(Some(b"5"), Some(b"gone")),
            Status::new(Code::NotFound, "gone")
        );
        assert_eq!(Status::from_trailers(None, None).code, Code::Unknown);
        assert_eq!(Status::from_trailers(Some(b"abc"), None).code, Code::Unknown);
        assert_eq!(Status::from_trailers(Some(b"0"), None), Status::ok());
    }
}
