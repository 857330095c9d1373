//! Custom metadata: the headers an application adds to a call.
//!
//! * keys are lower-case ASCII `0-9 a-z _ - .`, and may not start with
//!   `grpc-` (reserved for the protocol);
//! * keys ending in `-bin` carry binary values, base64-encoded on the wire:
//!   sent without padding, accepted with or without;
//! * other values are printable ASCII (`%x20-%x7E`).

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine as _;

/// Why a metadata entry was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetadataError {
    /// The key has a character outside `0-9 a-z _ - .`, or is empty.
    BadKey(String),
    /// The key is reserved for the protocol (`grpc-…`).
    Reserved(String),
    /// An ASCII value has a byte outside `%x20-%x7E`.
    BadValue(String),
    /// A `-bin` value is not base64.
    BadBase64(String),
}

impl std::fmt::Display for MetadataError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetadataError::BadKey(k) => write!(f, "invalid metadata key {k:?}"),
            MetadataError::Reserved(k) => write!(f, "metadata key {k:?} is reserved"),
            MetadataError::BadValue(k) => {
                write!(f, "metadata value of {k:?} is not printable ASCII")
            }
            MetadataError::BadBase64(k) => write!(f, "metadata value of {k:?} is not base64"),
        }
    }
}

impl std::error::Error for MetadataError {}

/// Whether `key` is a valid metadata key (reserved ones included).
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-.".contains(&b))
}

/// Whether `key` names a binary (`-bin`) entry.
pub fn is_binary(key: &str) -> bool {
    key.ends_with("-bin")
}

/// Checks an application key: valid and not reserved.
pub fn check_key(key: &str) -> Result<(), MetadataError> {
    if !valid_key(key) {
        return Err(MetadataError::BadKey(key.to_string()));
    }
    if key.starts_with("grpc-") {
        return Err(MetadataError::Reserved(key.to_string()));
    }
    Ok(())
}

/// The header value for `value` under `key`: base64 without padding for a
/// `-bin` key, else the value itself if it is printable ASCII.
pub fn encode_value(key: &str, value: &[u8]) -> Result<String, MetadataError> {
    check_key(key)?;
    if is_binary(key) {
        return Ok(STANDARD_NO_PAD.encode(value));
    }
    if value.iter().all(|b| (0x20..=0x7e).contains(b)) {
        return Ok(String::from_utf8_lossy(value).into_owned());
    }
    Err(MetadataError::BadValue(key.to_string()))
}

/// The value carried by header `key` (base64-decoded for a `-bin` key,
/// padded or not).
pub fn decode_value(key: &str, header: &[u8]) -> Result<Vec<u8>, MetadataError> {
    if !is_binary(key) {
        return Ok(header.to_vec());
    }
    let trimmed =
        header.strip_suffix(b"==").or_else(|| header.strip_suffix(b"=")).unwrap_or(header);
    STANDARD_NO_PAD
        .decode(trimmed)
        .or_else(|_| STANDARD.decode(header))
        .map_err(|_| MetadataError::BadBase64(key.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        for k in ["x-custom", "a.b_c-1", "trailer-bin", "0"] {
            assert!(check_key(k).is_ok(), "{k}");
        }
        assert_eq!(check_key("X-Upper"), Err(MetadataError::BadKey("X-Upper".into())));
        assert_eq!(check_key(""), Err(MetadataError::BadKey(String::new())));
        assert_eq!(check_key("a b"), Err(MetadataError::BadKey("a b".into())));
        assert_eq!(check_key("grpc-status"), Err(MetadataError::Reserved("grpc-status".into())));
    }

    #[test]
    fn binary_values_travel_as_unpadded_base64() {
        // The interop suite's custom_metadata trailer value.
        let value = [0xab, 0xab, 0xab];
        let header = encode_value("x-grpc-test-echo-trailing-bin", &value).unwrap_or_default();
        assert_eq!(header, "q6ur");
        assert_eq!(
            decode_value("x-grpc-test-echo-trailing-bin", header.as_bytes()),
            Ok(value.to_vec())
        );
        let one = encode_value("k-bin", &[0xff]).unwrap_or_default();
        assert_eq!(one, "/w");
        assert_eq!(decode_value("k-bin", b"/w"), Ok(vec![0xff]));
        assert_eq!(decode_value("k-bin", b"/w=="), Ok(vec![0xff]));
        assert_eq!(decode_value("k-bin", b"%%%"), Err(MetadataError::BadBase64("k-bin".into())));
    }

    #[test]
    fn ascii_values_must_be_printable() {
        assert_eq!(encode_value("k", b"hello world"), Ok("hello world".into()));
        assert_eq!(encode_value("k", b"tab\there"), Err(MetadataError::BadValue("k".into())));
        assert_eq!(encode_value("k", "é".as_bytes()), Err(MetadataError::BadValue("k".into())));
        assert_eq!(decode_value("k", b"as is"), Ok(b"as is".to_vec()));
    }
}
