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

/// The protocol's own keys that travel as metadata: gRFC A6's retry
/// fields, which the client library sets on a retry
/// (`grpc-previous-rpc-attempts`) and a server handler sets in its
/// trailers to tell the client when (or, when negative, not) to retry
/// (`grpc-retry-pushback-ms`). Every other `grpc-` key is reserved.
pub const RETRY_KEYS: [&str; 2] = ["grpc-previous-rpc-attempts", "grpc-retry-pushback-ms"];

/// Checks an application key: valid and not reserved.
pub fn check_key(key: &str) -> Result<(), MetadataError> {
    if !valid_key(key) {
        return Err(MetadataError::BadKey(key.to_string()));
    }
    if key.starts_with("grpc-") && !RETRY_KEYS.contains(&key) {
        return Err(MetadataError::Reserved(key.to_string()));
    }
    Ok(())
}

/// A binary value as a `-bin` header carries it: base64 without padding.
/// (Also how the protocol's own binary trailer, `grpc-status-details-bin`,
/// is written.)
pub fn encode_binary(value: &[u8]) -> String {
    STANDARD_NO_PAD.encode(value)
}

/// The bytes of a `-bin` header value, padded or not.
pub fn decode_binary(header: &[u8]) -> Option<Vec<u8>> {
    let trimmed =
        header.strip_suffix(b"==").or_else(|| header.strip_suffix(b"=")).unwrap_or(header);
    STANDARD_NO_PAD.decode(trimmed).or_else(|_| STANDARD.decode(header)).ok()
}

/// The header value for `value` under `key`: base64 without padding for a
/// `-bin` key, else the value itself if it is printable ASCII.
pub fn encode_value(key: &str, value: &[u8]) -> Result<String, MetadataError> {
    check_key(key)?;
    if is_binary(key) {
        return Ok(encode_binary(value));
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
    decode_binary(header).ok_or_else(|| MetadataError::BadBase64(key.to_string()))
}

/// A call's custom metadata: an ordered list of entries (a key may repeat,
/// as HTTP/2 headers may). Values are kept decoded: the bytes of a `-bin`
/// entry, the text of an ASCII one. Entries are checked when inserted, so
/// everything in a `Metadata` can be sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metadata {
    entries: Vec<(String, Vec<u8>)>,
}

impl Metadata {
    /// No entries.
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// Appends an ASCII entry (`key` must not end in `-bin`).
    pub fn insert(&mut self, key: &str, value: &str) -> Result<(), MetadataError> {
        if is_binary(key) {
            return Err(MetadataError::BadValue(key.to_string()));
        }
        encode_value(key, value.as_bytes())?;
        self.entries.push((key.to_string(), value.as_bytes().to_vec()));
        Ok(())
    }

    /// Appends a binary entry (`key` must end in `-bin`).
    pub fn insert_bin(&mut self, key: &str, value: &[u8]) -> Result<(), MetadataError> {
        check_key(key)?;
        if !is_binary(key) {
            return Err(MetadataError::BadKey(key.to_string()));
        }
        self.entries.push((key.to_string(), value.to_vec()));
        Ok(())
    }

    /// The first ASCII value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        if is_binary(key) {
            return None;
        }
        self.get_bin_or_ascii(key).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The first value of a `-bin` key.
    pub fn get_bin(&self, key: &str) -> Option<&[u8]> {
        if !is_binary(key) {
            return None;
        }
        self.get_bin_or_ascii(key)
    }

    fn get_bin_or_ascii(&self, key: &str) -> Option<&[u8]> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_slice())
    }

    /// Every value of `key`, in order.
    pub fn get_all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.entries.iter().filter(move |(k, _)| k == key).map(|(_, v)| v.as_slice())
    }

    /// Every entry, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_slice()))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry as it goes on the wire: the key and its header value
    /// (`-bin` values in base64).
    pub fn encoded(&self) -> impl Iterator<Item = (&str, String)> + '_ {
        self.entries.iter().filter_map(|(k, v)| Some((k.as_str(), encode_value(k, v).ok()?)))
    }

    /// The custom metadata among received header fields (names lowercase,
    /// as HTTP/2 requires; pseudo-header fields left out): every field
    /// except the protocol's own (`grpc-*`, `content-type`, `te`, and
    /// connection headers). A `-bin` value that is not base64 fails the
    /// call, as it does in grpc-go.
    pub fn from_fields<'a>(
        fields: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    ) -> Result<Metadata, MetadataError> {
        let mut md = Metadata::new();
        for (name, value) in fields {
            if name.starts_with(b"grpc-") && !RETRY_KEYS.iter().any(|k| k.as_bytes() == name)
                || matches!(name, b"content-type" | b"te" | b"connection" | b"keep-alive" | b"host")
            {
                continue;
            }
            let k = std::str::from_utf8(name)
                .map_err(|_| MetadataError::BadKey(String::from_utf8_lossy(name).into_owned()))?;
            let v = decode_value(k, value)?;
            md.entries.push((k.to_string(), v));
        }
        Ok(md)
    }

    /// Every entry as it travels in a header field: `-bin` values in
    /// base64, ASCII ones as they are (checked when inserted).
    pub fn each_field(&self, mut f: impl FnMut(&[u8], &[u8])) {
        for (k, v) in &self.entries {
            if is_binary(k) {
                f(k.as_bytes(), encode_binary(v).as_bytes());
            } else {
                f(k.as_bytes(), v);
            }
        }
    }
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
