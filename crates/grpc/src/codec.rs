//! Message compression (`grpc-encoding`) and the step from a received frame
//! to a message's bytes, shared by the server and the client.

use std::io::{Read as _, Write as _};

use bytes::Bytes;

use crate::frame::Frame;
use crate::status::{Code, Status};

thread_local! {
    /// One encoder per thread: its output buffer is reused across calls
    /// instead of grown from nothing for each.
    static ENCODER: std::cell::RefCell<protoplane_wire::Encoder> =
        std::cell::RefCell::new(protoplane_wire::Encoder::new());
}

/// Encodes an owned block of type `ty` with this thread's encoder and hands
/// the bytes to `f` (valid only inside it).
pub fn with_encoded<R>(
    tables: &protoplane_schema::TableSet,
    ty: u32,
    block: &[u8],
    f: impl FnOnce(&[u8]) -> R,
) -> Result<R, Status> {
    let recorded = block.get(4..8).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    if recorded != Some(ty) {
        return Err(Status::new(Code::Internal, "response block of the wrong type"));
    }
    ENCODER.with(|e| {
        let mut e = e.borrow_mut();
        let src = protoplane_wire::Source::owned(block);
        match e.encode(tables, ty, src, &protoplane_wire::EncodeOptions::default()) {
            Ok(bytes) => Ok(f(bytes)),
            Err(err) => Err(Status::new(Code::Internal, format!("unencodable message: {err}"))),
        }
    })
}

/// What a `content-type` says about a request or response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContentType {
    /// gRPC with protobuf messages: `application/grpc` or
    /// `application/grpc+proto` (parameters after `;` allowed).
    Proto,
    /// gRPC with another codec (`application/grpc+json`): the name given.
    OtherCodec(String),
    /// Not gRPC at all (`application/grpc-web`, `text/html`, none).
    NotGrpc,
}

/// Classifies a `content-type` value as gRPC over HTTP/2 defines it:
/// `application/grpc` followed by nothing, by `+` and a codec name, or by
/// `;` and parameters; compared without regard to case, as media types
/// are. Only the prefix was checked once, which let
/// `application/grpc-web` and `application/grpc+json` through to be
/// decoded as protobuf.
pub fn content_type(value: Option<&[u8]>) -> ContentType {
    const GRPC: &[u8] = b"application/grpc";
    let Some(v) = value else { return ContentType::NotGrpc };
    let v = v.trim_ascii();
    if v.len() < GRPC.len() || !v[..GRPC.len()].eq_ignore_ascii_case(GRPC) {
        return ContentType::NotGrpc;
    }
    let rest = &v[GRPC.len()..];
    let params = rest.iter().position(|&b| b == b';').unwrap_or(rest.len());
    match &rest[..params] {
        [] => ContentType::Proto,
        [b'+', codec @ ..] => {
            let codec = codec.trim_ascii();
            if codec.eq_ignore_ascii_case(b"proto") {
                ContentType::Proto
            } else {
                ContentType::OtherCodec(String::from_utf8_lossy(codec).into_owned())
            }
        }
        _ => ContentType::NotGrpc,
    }
}

/// A message encoding the runtime implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// No compression.
    Identity,
    /// gzip (RFC 1952).
    Gzip,
}

impl Encoding {
    /// The encoding a `grpc-encoding` value names, if supported.
    pub fn from_header(value: &[u8]) -> Option<Encoding> {
        match value {
            b"identity" => Some(Encoding::Identity),
            b"gzip" => Some(Encoding::Gzip),
            _ => None,
        }
    }

    /// The `grpc-encoding` value.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Identity => "identity",
            Encoding::Gzip => "gzip",
        }
    }
}

/// What this runtime announces in `grpc-accept-encoding`.
pub const ACCEPT_ENCODING: &str = "gzip,identity";

/// Whether a `grpc-accept-encoding` value lists gzip.
pub fn accepts_gzip(value: Option<&[u8]>) -> bool {
    value.is_some_and(|v| v.split(|&b| b == b',').any(|e| e.trim_ascii() == b"gzip"))
}

/// gzip-compresses `data`.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 2 + 64),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(data);
    enc.finish().unwrap_or_default()
}

/// Decompresses a gzip message, refusing to produce more than `limit` bytes
/// (a small compressed message may expand without bound otherwise).
pub fn gunzip(data: &[u8], limit: usize) -> Result<Vec<u8>, Status> {
    let mut out = Vec::with_capacity((data.len() * 4).min(limit).min(1 << 20));
    let mut dec = flate2::read::GzDecoder::new(data).take(limit as u64 + 1);
    dec.read_to_end(&mut out)
        .map_err(|e| Status::new(Code::Internal, format!("invalid gzip message: {e}")))?;
    if out.len() > limit {
        return Err(Status::new(
            Code::ResourceExhausted,
            format!("decompressed message exceeds the limit of {limit} bytes"),
        ));
    }
    Ok(out)
}

/// The message bytes of a received frame: decompressed with the stream's
/// encoding when the frame's flag says so.
pub fn frame_payload(frame: Frame, encoding: Encoding, limit: usize) -> Result<Bytes, Status> {
    if !frame.compressed {
        return Ok(frame.data);
    }
    match encoding {
        Encoding::Gzip => gunzip(&frame.data, limit).map(Bytes::from),
        Encoding::Identity => {
            Err(Status::new(Code::Internal, "compressed message on a stream without grpc-encoding"))
        }
    }
}

/// Frames `message` for sending (compressing it with gzip when `gzip`).
/// The frame is built in one buffer: header and message, one allocation.
pub fn frame_message(message: &[u8], gzip_it: bool, limit: usize) -> Result<Bytes, Status> {
    if message.len() > limit {
        return Err(Status::new(
            Code::ResourceExhausted,
            format!("message of {} bytes exceeds the send limit of {limit} bytes", message.len()),
        ));
    }
    let compressed;
    let body = if gzip_it {
        compressed = gzip(message);
        compressed.as_slice()
    } else {
        message
    };
    let mut out = Vec::new();
    crate::frame::encode_frame(gzip_it, body, &mut out)
        .ok_or_else(|| Status::new(Code::ResourceExhausted, "message longer than 4 GiB"))?;
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_are_parsed_not_prefix_matched() {
        use ContentType::*;
        let cases: [(&[u8], ContentType); 11] = [
            (b"application/grpc", Proto),
            (b"application/grpc+proto", Proto),
            (b"Application/GRPC+Proto", Proto),
            (b"application/grpc;charset=utf-8", Proto),
            (b"application/grpc+proto; q=1", Proto),
            (b"application/grpc+json", OtherCodec("json".into())),
            (b"application/grpc+foo", OtherCodec("foo".into())),
            (b"application/grpc-web", NotGrpc),
            (b"application/grpc-web+proto", NotGrpc),
            (b"application/json", NotGrpc),
            (b"application/grp", NotGrpc),
        ];
        for (v, want) in cases {
            assert_eq!(content_type(Some(v)), want, "{}", String::from_utf8_lossy(v));
        }
        assert_eq!(content_type(None), NotGrpc);
    }

    #[test]
    fn gzip_round_trip_and_bomb_limit() {
        let data = vec![7u8; 100_000];
        let z = gzip(&data);
        assert!(z.len() < 1000);
        assert_eq!(gunzip(&z, 100_000).ok(), Some(data));
        assert_eq!(gunzip(&z, 99_999).map_err(|s| s.code), Err(Code::ResourceExhausted));
        assert_eq!(gunzip(b"not gzip", 100).map_err(|s| s.code), Err(Code::Internal));
    }

    #[test]
    fn accept_encoding_lists() {
        assert!(accepts_gzip(Some(b"identity, gzip")));
        assert!(accepts_gzip(Some(b"gzip")));
        assert!(!accepts_gzip(Some(b"deflate,identity")));
        assert!(!accepts_gzip(None));
    }

    #[test]
    fn frames_carry_the_flag() {
        let f = frame_message(b"abc", false, 10).unwrap_or_default();
        assert_eq!(&f[..], b"\0\0\0\0\x03abc");
        let g = frame_message(b"abc", true, 10).unwrap_or_default();
        assert_eq!(g[0], 1);
        let payload = frame_payload(
            Frame { compressed: true, data: Bytes::copy_from_slice(&g[5..]) },
            Encoding::Gzip,
            10,
        );
        assert_eq!(payload.ok().as_deref(), Some(&b"abc"[..]));
        assert_eq!(
            frame_message(b"abc", false, 2).map_err(|s| s.code),
            Err(Code::ResourceExhausted)
        );
    }
}
