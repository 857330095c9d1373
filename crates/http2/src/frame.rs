//! HTTP/2 frames (RFC 9113 §4 and §6): the 9-byte frame header, the frame
//! types and flags, error codes and settings, and writers for the frames
//! this transport sends. Parsing of payloads lives with the state machine
//! in [`crate::conn`], which validates each frame against the connection's
//! state as it reads it.

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 9;

/// The smallest SETTINGS_MAX_FRAME_SIZE, and the default.
pub const DEFAULT_MAX_FRAME: u32 = 1 << 14;

/// The largest SETTINGS_MAX_FRAME_SIZE allowed.
pub const MAX_MAX_FRAME: u32 = (1 << 24) - 1;

/// The initial flow-control window of a stream and of the connection.
pub const DEFAULT_WINDOW: u32 = 65_535;

/// The largest flow-control window (2^31 - 1).
pub const MAX_WINDOW: i64 = (1 << 31) - 1;

/// Frame types.
pub mod kind {
    /// Stream data.
    pub const DATA: u8 = 0x0;
    /// A header block's first fragment.
    pub const HEADERS: u8 = 0x1;
    /// Stream priority (deprecated by RFC 9113; parsed and ignored).
    pub const PRIORITY: u8 = 0x2;
    /// Stream reset.
    pub const RST_STREAM: u8 = 0x3;
    /// Connection settings.
    pub const SETTINGS: u8 = 0x4;
    /// Server push (never allowed here: push is disabled).
    pub const PUSH_PROMISE: u8 = 0x5;
    /// Liveness check.
    pub const PING: u8 = 0x6;
    /// Connection shutdown.
    pub const GOAWAY: u8 = 0x7;
    /// Flow-control credit.
    pub const WINDOW_UPDATE: u8 = 0x8;
    /// A header block's later fragments.
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags.
pub mod flag {
    /// DATA, HEADERS: the sender's last frame on the stream.
    pub const END_STREAM: u8 = 0x1;
    /// SETTINGS, PING: an acknowledgement.
    pub const ACK: u8 = 0x1;
    /// HEADERS, CONTINUATION: the header block is complete.
    pub const END_HEADERS: u8 = 0x4;
    /// DATA, HEADERS: a pad length byte leads the payload.
    pub const PADDED: u8 = 0x8;
    /// HEADERS: a priority block leads the fragment.
    pub const PRIORITY: u8 = 0x20;
}

/// SETTINGS identifiers (RFC 9113 §6.5.2).
pub mod setting {
    /// The decoder's dynamic table size the sender allows.
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    /// Whether server push is allowed (0 or 1).
    pub const ENABLE_PUSH: u16 = 0x2;
    /// Streams the sender allows the receiver to open.
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    /// The sender's initial stream receive window.
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    /// The largest frame payload the sender accepts.
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    /// The largest header list the sender accepts (advisory).
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
}

/// HTTP/2 error codes (RFC 9113 §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reason(pub u32);

impl Reason {
    /// Graceful shutdown, or a stream no longer needed.
    pub const NO_ERROR: Reason = Reason(0x0);
    /// The peer broke the protocol.
    pub const PROTOCOL_ERROR: Reason = Reason(0x1);
    /// An implementation fault.
    pub const INTERNAL_ERROR: Reason = Reason(0x2);
    /// The peer broke flow control.
    pub const FLOW_CONTROL_ERROR: Reason = Reason(0x3);
    /// SETTINGS not acknowledged in time.
    pub const SETTINGS_TIMEOUT: Reason = Reason(0x4);
    /// A frame on a closed stream.
    pub const STREAM_CLOSED: Reason = Reason(0x5);
    /// A frame of the wrong size.
    pub const FRAME_SIZE_ERROR: Reason = Reason(0x6);
    /// The stream was refused before any processing.
    pub const REFUSED_STREAM: Reason = Reason(0x7);
    /// The stream is no longer needed.
    pub const CANCEL: Reason = Reason(0x8);
    /// The header compression state is broken.
    pub const COMPRESSION_ERROR: Reason = Reason(0x9);
    /// CONNECT failed.
    pub const CONNECT_ERROR: Reason = Reason(0xa);
    /// The peer is generating excessive load.
    pub const ENHANCE_YOUR_CALM: Reason = Reason(0xb);
    /// The transport's security is inadequate.
    pub const INADEQUATE_SECURITY: Reason = Reason(0xc);
    /// HTTP/1.1 is required.
    pub const HTTP_1_1_REQUIRED: Reason = Reason(0xd);

    /// The code's name, for messages.
    pub fn name(self) -> &'static str {
        const NAMES: [&str; 14] = [
            "NO_ERROR",
            "PROTOCOL_ERROR",
            "INTERNAL_ERROR",
            "FLOW_CONTROL_ERROR",
            "SETTINGS_TIMEOUT",
            "STREAM_CLOSED",
            "FRAME_SIZE_ERROR",
            "REFUSED_STREAM",
            "CANCEL",
            "COMPRESSION_ERROR",
            "CONNECT_ERROR",
            "ENHANCE_YOUR_CALM",
            "INADEQUATE_SECURITY",
            "HTTP_1_1_REQUIRED",
        ];
        NAMES.get(self.0 as usize).copied().unwrap_or("UNKNOWN")
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// Payload length.
    pub len: u32,
    /// Frame type ([`kind`]).
    pub kind: u8,
    /// Flags ([`flag`]).
    pub flags: u8,
    /// Stream identifier (the reserved bit cleared).
    pub stream: u32,
}

impl Head {
    /// Parses the first 9 bytes of `b` (`None` if shorter).
    #[inline]
    pub fn parse(b: &[u8]) -> Option<Head> {
        let h: &[u8; HEADER_LEN] = b.get(..HEADER_LEN)?.try_into().ok()?;
        Some(Head {
            len: u32::from_be_bytes([0, h[0], h[1], h[2]]),
            kind: h[3],
            flags: h[4],
            stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
        })
    }

    /// Whether `f` is set.
    #[inline]
    pub fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }
}

/// Appends a frame header.
#[inline]
pub fn write_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    debug_assert!(len <= MAX_MAX_FRAME as usize);
    let l = (len as u32).to_be_bytes();
    let s = stream.to_be_bytes();
    out.extend_from_slice(&[l[1], l[2], l[3], kind, flags, s[0], s[1], s[2], s[3]]);
}

/// Rewrites the length of the frame header at `at` (written with a
/// placeholder before its payload was known).
#[inline]
pub fn patch_len(out: &mut [u8], at: usize, len: usize) {
    let l = (len as u32).to_be_bytes();
    out[at..at + 3].copy_from_slice(&l[1..]);
}

/// Appends a SETTINGS frame carrying `values`.
pub fn write_settings(out: &mut Vec<u8>, values: &[(u16, u32)]) {
    write_head(out, values.len() * 6, kind::SETTINGS, 0, 0);
    for (id, v) in values {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// Appends a SETTINGS acknowledgement.
pub fn write_settings_ack(out: &mut Vec<u8>) {
    write_head(out, 0, kind::SETTINGS, flag::ACK, 0);
}

/// Appends a WINDOW_UPDATE frame.
pub fn write_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    write_head(out, 4, kind::WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&increment.to_be_bytes());
}

/// Appends an RST_STREAM frame.
pub fn write_rst(out: &mut Vec<u8>, stream: u32, reason: Reason) {
    write_head(out, 4, kind::RST_STREAM, 0, stream);
    out.extend_from_slice(&reason.0.to_be_bytes());
}

/// Appends a PING frame (`ack`: the answer to one).
pub fn write_ping(out: &mut Vec<u8>, payload: [u8; 8], ack: bool) {
    write_head(out, 8, kind::PING, if ack { flag::ACK } else { 0 }, 0);
    out.extend_from_slice(&payload);
}

/// Appends a GOAWAY frame with a debug message.
pub fn write_goaway(out: &mut Vec<u8>, last_stream: u32, reason: Reason, debug: &[u8]) {
    write_head(out, 8 + debug.len(), kind::GOAWAY, 0, 0);
    out.extend_from_slice(&last_stream.to_be_bytes());
    out.extend_from_slice(&reason.0.to_be_bytes());
    out.extend_from_slice(debug);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let mut out = Vec::new();
        write_head(&mut out, 0x12_3456, kind::HEADERS, flag::END_HEADERS, 0x7fff_ffff);
        assert_eq!(out.len(), HEADER_LEN);
        let h = Head::parse(&out).expect("nine bytes");
        assert_eq!(
            h,
            Head {
                len: 0x12_3456,
                kind: kind::HEADERS,
                flags: flag::END_HEADERS,
                stream: 0x7fff_ffff
            }
        );
        // The reserved bit is ignored on receipt (RFC 9113 §4.1).
        out[5] |= 0x80;
        assert_eq!(Head::parse(&out).map(|h| h.stream), Some(0x7fff_ffff));
        assert_eq!(Head::parse(&out[..8]), None);
        patch_len(&mut out, 0, 7);
        assert_eq!(Head::parse(&out).map(|h| h.len), Some(7));
    }

    #[test]
    fn reason_names() {
        assert_eq!(Reason::ENHANCE_YOUR_CALM.to_string(), "ENHANCE_YOUR_CALM");
        assert_eq!(Reason(0x99).name(), "UNKNOWN");
    }
}
