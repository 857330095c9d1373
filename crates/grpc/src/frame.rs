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

use bytes::{Buf, Bytes, BytesMut};

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
    pub data: Bytes,
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

/// Messages shorter than this are copied out of the bytes they arrived
/// in even when whole: a small message must not keep a large receive
/// buffer alive for as long as the handler holds it. Longer ones are
/// slices of those bytes, no copy.
pub const COPY_BELOW: usize = 4 << 10;

/// The incremental decoder of one stream's messages.
///
/// A message that lies whole inside one [`FrameDecoder::push`] is handed
/// out as a slice of the pushed [`Bytes`] when at least [`COPY_BELOW`]
/// long (zero copy: what the HTTP/2 server receives into is what the
/// handler reads); one split across pushes is gathered into a buffer of
/// its own.
#[derive(Debug)]
pub struct FrameDecoder {
    limit: usize,
    header: [u8; FRAME_HEADER_LEN],
    /// Header bytes received of the current message.
    have: usize,
    /// The message in progress once its header is complete: (compressed,
    /// length, bytes so far).
    body: Option<(bool, usize, BytesMut)>,
    failed: Option<FrameError>,
}

impl FrameDecoder {
    /// A decoder refusing messages longer than `limit` bytes.
    pub fn new(limit: usize) -> FrameDecoder {
        FrameDecoder { limit, header: [0; FRAME_HEADER_LEN], have: 0, body: None, failed: None }
    }

    /// The message size limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Feeds received bytes; appends every message they complete to `out`.
    pub fn push(&mut self, mut data: Bytes, out: &mut Vec<Frame>) -> Result<(), FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        while !data.is_empty() {
            if let Some((compressed, want, body)) = self.body.as_mut() {
                let take = (*want - body.len()).min(data.len());
                body.extend_from_slice(&data[..take]);
                data.advance(take);
                if body.len() == *want {
                    let compressed = *compressed;
                    if let Some((_, _, b)) = self.body.take() {
                        out.push(Frame { compressed, data: b.freeze() });
                    }
                }
                continue;
            }
            if self.have == 0 && data.len() >= FRAME_HEADER_LEN {
                let (compressed, len) = self.header_of(&data[..FRAME_HEADER_LEN])?;
                if data.len() >= FRAME_HEADER_LEN + len {
                    // The whole message is here.
                    let whole = FRAME_HEADER_LEN..FRAME_HEADER_LEN + len;
                    let m = if len < COPY_BELOW {
                        Bytes::copy_from_slice(&data[whole])
                    } else {
                        data.slice(whole)
                    };
                    data.advance(FRAME_HEADER_LEN + len);
                    out.push(Frame { compressed, data: m });
                    continue;
                }
                data.advance(FRAME_HEADER_LEN);
                self.begin(compressed, len, out);
                continue;
            }
            let take = (FRAME_HEADER_LEN - self.have).min(data.len());
            self.header[self.have..self.have + take].copy_from_slice(&data[..take]);
            self.have += take;
            data.advance(take);
            if self.have == FRAME_HEADER_LEN {
                self.have = 0;
                let h = self.header;
                let (compressed, len) = self.header_of(&h)?;
                self.begin(compressed, len, out);
            }
        }
        Ok(())
    }

    /// [`FrameDecoder::push`] of bytes that are not [`Bytes`] (copied).
    pub fn push_slice(&mut self, data: &[u8], out: &mut Vec<Frame>) -> Result<(), FrameError> {
        self.push(Bytes::copy_from_slice(data), out)
    }

    fn begin(&mut self, compressed: bool, len: usize, out: &mut Vec<Frame>) {
        if len == 0 {
            out.push(Frame { compressed, data: Bytes::new() });
        } else {
            // The declared length was checked against the limit, and the
            // buffer grows only with bytes received beyond its first MiB.
            self.body = Some((compressed, len, BytesMut::with_capacity(len.min(1 << 20))));
        }
    }

    /// The flag and length of a message header, checked; an error fails
    /// the decoder for good.
    fn header_of(&mut self, h: &[u8]) -> Result<(bool, usize), FrameError> {
        let flag = h[0];
        let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]);
        let err = if flag > 1 {
            FrameError::BadFlag(flag)
        } else if len as u64 > self.limit as u64 {
            FrameError::TooLarge { len: len.into(), limit: self.limit }
        } else {
            return Ok((flag == 1, len as usize));
        };
        self.failed = Some(err.clone());
        Err(err)
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
        let want: Vec<Frame> = msgs
            .iter()
            .map(|(c, m)| Frame { compressed: *c, data: Bytes::copy_from_slice(m) })
            .collect();
        for chunk in [1, 2, 3, 5, 6, 7, 64, wire.len()] {
            let mut dec = FrameDecoder::new(1024);
            let mut got = Vec::new();
            for piece in wire.chunks(chunk) {
                dec.push_slice(piece, &mut got).unwrap_or_else(|e| panic!("{e}"));
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
        let e = dec.push_slice(&[0, 0xff, 0xff, 0xff, 0xff], &mut got);
        assert_eq!(e, Err(FrameError::TooLarge { len: u32::MAX.into(), limit: 100 }));
        assert_eq!(e.map_err(|e| e.status().code), Err(Code::ResourceExhausted));
        assert_eq!(dec.buffered(), 0);
        // Stays failed.
        assert!(dec.push_slice(&[0, 0, 0, 0, 0], &mut got).is_err());
        // Exactly the limit is fine.
        let mut dec = FrameDecoder::new(100);
        assert!(dec.push_slice(&framed(&[(false, &[1; 100])]), &mut got).is_ok());
        assert_eq!(got.len(), 1);
    }

    #[test]
    fn bad_flags_and_truncation_fail_as_internal() {
        let mut dec = FrameDecoder::new(100);
        let e = dec.push_slice(&[2, 0, 0, 0, 0], &mut Vec::new());
        assert_eq!(e.map_err(|e| e.status().code), Err(Code::Internal));
        for cut in [1, 4, 5, 7] {
            let wire = framed(&[(false, b"abcdef")]);
            let mut dec = FrameDecoder::new(100);
            dec.push_slice(&wire[..cut], &mut Vec::new()).unwrap_or_else(|e| panic!("{e}"));
            let e = dec.finish();
            let missing =
                if cut < FRAME_HEADER_LEN { FRAME_HEADER_LEN - cut } else { wire.len() - cut };
            assert_eq!(e, Err(FrameError::Truncated { missing }), "cut {cut}");
        }
    }

    #[test]
    fn large_whole_messages_are_slices_of_what_was_pushed() {
        let big = vec![9u8; COPY_BELOW];
        let small = vec![8u8; COPY_BELOW - 1];
        let wire = Bytes::from(framed(&[(false, &big), (false, &small)]));
        let mut dec = FrameDecoder::new(1 << 20);
        let mut got = Vec::new();
        dec.push(wire.clone(), &mut got).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((got[0].data.len(), got[1].data.len()), (big.len(), small.len()));
        let inside = |b: &Bytes| wire.as_ptr_range().contains(&b.as_ptr());
        assert!(inside(&got[0].data), "the large message is not copied");
        assert!(!inside(&got[1].data), "the small one is, so it pins nothing");
        // Split across pushes: gathered, the same bytes.
        let mut dec = FrameDecoder::new(1 << 20);
        let mut again = Vec::new();
        dec.push(wire.slice(..100), &mut again).unwrap_or_else(|e| panic!("{e}"));
        dec.push(wire.slice(100..), &mut again).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again, got);
    }
}
