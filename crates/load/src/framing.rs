//! Message framing on stdin / stdout: one whole message, or a stream of
//! varint-length-prefixed messages (`--delimited`, protobuf's
//! `writeDelimitedTo` format).

use std::fmt;

/// How messages are framed.
#[derive(Clone, Copy, Debug)]
pub struct Framing {
    delimited: bool,
}

/// A framing error in a delimited stream.
#[derive(Debug)]
pub enum FrameError {
    Prefix(usize),
    Length { at: usize, len: u64, left: usize },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Prefix(at) => write!(f, "malformed length prefix at stream byte {at}"),
            FrameError::Length { at, len, left } => write!(
                f,
                "length prefix at stream byte {at} declares {len} bytes, only {left} remain"
            ),
        }
    }
}

/// `(stream offset, message bytes)` or the framing error that ended the stream.
pub type Frames<'a> = Box<dyn Iterator<Item = Result<(usize, &'a [u8]), FrameError>> + 'a>;

impl Framing {
    pub fn new(delimited: bool) -> Self {
        Framing { delimited }
    }

    /// Iterates over `(stream offset, message bytes)`.
    pub fn messages<'a>(&self, input: &'a [u8]) -> Frames<'a> {
        if !self.delimited {
            return Box::new(std::iter::once(Ok((0, input))));
        }
        let mut pos = 0usize;
        let mut failed = false;
        Box::new(std::iter::from_fn(move || {
            if failed || pos >= input.len() {
                return None;
            }
            let at = pos;
            let mut len = 0u64;
            let mut i = 0;
            loop {
                let Some(&b) = input.get(pos + i).filter(|_| i < 10) else {
                    failed = true;
                    return Some(Err(FrameError::Prefix(at)));
                };
                len |= ((b & 0x7f) as u64) << (7 * i);
                i += 1;
                if b < 0x80 {
                    break;
                }
            }
            pos += i;
            let left = input.len() - pos;
            if len > left as u64 {
                failed = true;
                return Some(Err(FrameError::Length { at, len, left }));
            }
            let msg = &input[pos..pos + len as usize];
            pos += len as usize;
            Some(Ok((at, msg)))
        }))
    }

    /// Appends one message in this framing.
    pub fn put(&self, out: &mut Vec<u8>, msg: &[u8]) {
        if self.delimited {
            let mut v = msg.len() as u64;
            while v >= 0x80 {
                out.push(v as u8 | 0x80);
                v >>= 7;
            }
            out.push(v as u8);
        }
        out.extend_from_slice(msg);
    }
}
