//! gRPC message framing: `Length-Prefixed-Message → Compressed-Flag
//! Message-Length Message`, a flag byte (0 or 1), a 4-byte big-endian
//! length, then the message.
//!
//! HTTP/2 DATA frames split and join these at arbitrary points, so the
//! decoder is incremental: feed it whatever bytes arrive, it returns the
//! messages they complete. It is the first thing that touches a peer's
//! bytes, so it is strict and bounded:
//! * a declared length over the limit fails before any of the message is
//!   buffered (`RESOURCE_EXHAUSTED`, as gRPC servers and clients answer an
//!   oversized message); memory grows only with bytes actually received;
//! * a flag other than 0 or 1 fails (`INTERNAL`: a protocol violation);
//! * a stream that ends inside a message fails (`INTERNAL`);
//! * after an error the decoder stays failed: the stream is unusable.

use crate::status::{Code, Status};

/// Bytes before each message: flag and length.
pub const FRAME_HEADER_LEN: usize = 5;

/// One received message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The flag bit: the message is compressed with the stream's
    /// `grpc-encoding`.
    pub compressed: bool,
    /// The message bytes (still compressed if `compressed`).
    pub data: Vec<u8>,
}

/// Why a stream's framing is unusable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// A message declares more bytes than the limit allows.
    TooLarge {
        /// The declared length.
        len: u64,
        /// The limit.
        limit: usize,
    },
    /// The flag byte is neither 0 nor 1.
    BadFlag(u8),
    /// The stream ended inside a message.
    Truncated {
        /// Bytes still expected: the rest of the header if it was cut
        /// (the length is then unknown), else the rest of the message.
        missing: usize,
    },
}

impl FrameError {
    /// The status a call fails with.
    pub fn status(&self) -> Status {
        match self {
            FrameError::TooLarge { len, limit } => Status::new(
                Code::ResourceExhausted,
                format!("message of {len} bytes exceeds the limit of {limit} bytes"),
            ),
            FrameError::BadFlag(b) => {
                Status::new(Code::Internal, format!("invalid compressed-flag byte {b:#04x}"))
            }
            FrameError::Truncated { missing } => Status::new(
                Code::Internal,
                format!("stream ended inside a message ({missing} bytes missing)"),
            ),
        }
    }
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.status())
    }
}

impl std::error::Error for FrameError {}

/// Appends one framed message to `out`. `None` if the message is longer
/// than a frame can declare (4 GiB - 1).
pub fn encode_frame(compressed: bool, message: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let len = u32::try_from(message.len()).ok()?;
    out.reserve(FRAME_HEADER_LEN + message.len());
    out.push(u8::from(compressed));
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    Some(())
}

/// The incremental decoder of one stream's messages.
#[derive(Debug)]
pub struct FrameDecoder {
    limit: usize,
    header: [u8; FRAME_HEADER_LEN],
    /// Header bytes received of the current message.
    have: usize,
    /// Body of the current message once its header is complete.
    body: Option<(bool, usize, Vec<u8>)>,
    failed: Option<FrameError>,
}

impl FrameDecoder {
    /// A decoder refusing messages longer than `limit` bytes.
    pub fn new(limit: usize) -> FrameDecoder {
        FrameDecoder { limit, header: [0; FRAME_HEADER_LEN], have: 0, body: None, failed: None }
    }

    /// Feeds received bytes; appends every message they complete to `out`.
    pub fn push(&mut self, mut data: &[u8], out: &mut Vec<Frame>) -> Result<(), FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        while !data.is_empty() || self.body.as_ref().is_some_and(|(_, want, b)| b.len() == *want) {
            match &mut self.body {
                None => {
                    let take = (FRAME_HEADER_LEN - self.have).min(data.len());
                    self.header[self.have..self.have + take].copy_from_slice(&data[..take]);
                    self.have += take;
                    data = &data[take..];
                    if self.have < FRAME_HEADER_LEN {
                        break;
                    }
                    self.have = 0;
                    let flag = self.header[0];
                    let len = u32::from_be_bytes([
                        self.header[1],
                        self.header[2],
                        self.header[3],
                        self.header[4],
                    ]);
                    let err = if flag > 1 {
                        Some(FrameError::BadFlag(flag))
                    } else if len as u64 > self.limit as u64 {
                        Some(FrameError::TooLarge { len: len.into(), limit: self.limit })
                    } else {
                        None
                    };
                    if let Some(e) = err {
                        self.failed = Some(e.clone());
                        return Err(e);
                    }
                    self.body = Some((flag == 1, len as usize, Vec::new()));
                }
                Some((compressed, want, body)) => {
                    let take = (*want - body.len()).min(data.len());
                    body.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if body.len() < *want {
                        break;
                    }
                    out.push(Frame { compressed: *compressed, data: std::mem::take(body) });
                    self.body = None;
                }
            }
        }
        Ok(())
    }

    /// The end of the stream: fails if it ended inside a message.
    pub fn finish(&self) -> Result<(), FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let missing = match &self.body {
            Some((_, want, body)) => want - body.len(),
            None if self.have > 0 => FRAME_HEADER_LEN - self.have,
            None => return Ok(()),
        };
        Err(FrameError::Truncated { missing })
    }

    /// Bytes buffered for the message in progress.
    pub fn buffered(&self) -> usize {
        self.have + self.body.as_ref().map_or(0, |(_, _, b)| b.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(msgs: &[(bool, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (c, m) in msgs {
            encode_frame(*c, m, &mut out).unwrap_or_default();
        }
        out
    }

    #[test]
    fn any_split_of_the_stream_gives_the_same_messages() {
        let msgs: [(bool, &[u8]); 4] =
            [(false, b"hello"), (true, b""), (false, &[7; 300]), (true, b"x")];
        let wire = framed(&msgs);
        let want: Vec<Frame> =
            msgs.iter().map(|(c, m)| Frame { compressed: *c, data: m.to_vec() }).collect();
        for chunk in [1, 2, 3, 5, 6, 7, 64, wire.len()] {
            let mut dec = FrameDecoder::new(1024);
            let mut got = Vec::new();
            for piece in wire.chunks(chunk) {
                dec.push(piece, &mut got).unwrap_or_else(|e| panic!("{e}"));
            }
            assert_eq!(got, want, "chunk {chunk}");
            assert_eq!(dec.finish(), Ok(()));
            assert_eq!(dec.buffered(), 0);
        }
    }

    #[test]
    fn oversized_messages_fail_before_buffering() {
        let mut dec = FrameDecoder::new(100);
        let mut got = Vec::new();
        // Declares 4 GiB - 1 and sends nothing more.
        let e = dec.push(&[0, 0xff, 0xff, 0xff, 0xff], &mut got);
        assert_eq!(e, Err(FrameError::TooLarge { len: u32::MAX.into(), limit: 100 }));
        assert_eq!(e.map_err(|e| e.status().code), Err(Code::ResourceExhausted));
        assert_eq!(dec.buffered(), 0);
        // Stays failed.
        assert!(dec.push(&[0, 0, 0, 0, 0], &mut got).is_err());
        // Exactly the limit is fine.
        let mut dec = FrameDecoder::new(100);
        assert!(dec.push(&framed(&[(false, &[1; 100])]), &mut got).is_ok());
        assert_eq!(got.len(), 1);
    }

    #[test]
    fn bad_flags_and_truncation_fail_as_internal() {
        let mut dec = FrameDecoder::new(100);
        let e = dec.push(&[2, 0, 0, 0, 0], &mut Vec::new());
        assert_eq!(e.map_err(|e| e.status().code), Err(Code::Internal));
        for cut in [1, 4, 5, 7] {
            let wire = framed(&[(false, b"abcdef")]);
            let mut dec = FrameDecoder::new(100);
            dec.push(&wire[..cut], &mut Vec::new()).unwrap_or_else(|e| panic!("{e}"));
            let e = dec.finish();
            let missing =
                if cut < FRAME_HEADER_LEN { FRAME_HEADER_LEN - cut } else { wire.len() - cut };
            assert_eq!(e, Err(FrameError::Truncated { missing }), "cut {cut}");
        }
    }
}
