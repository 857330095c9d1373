//! The program an `hpack` input runs in its encoded mode, shared with
//! `examples/seed.rs` so that seeds are written in the format the target
//! reads.
//!
//! A program is a sequence of [`Op`]s, one byte of opcode each, then its
//! operands. Any bytes are a program: a missing operand reads as zero, a
//! string's length is cut to the bytes left.

/// Field names a one-byte selector picks (most of them in the static
/// table, so that name indices are exercised).
pub const NAMES: &[&[u8]] = &[
    b":method",
    b":path",
    b":status",
    b":authority",
    b":scheme",
    b"content-type",
    b"grpc-status",
    b"grpc-message",
    b"grpc-timeout",
    b"user-agent",
    b"te",
    b"x-trace-bin",
    b"cookie",
    b"authorization",
    b"accept-encoding",
    b"",
];

/// Field values a one-byte selector picks (some make a static entry whole).
pub const VALUES: &[&[u8]] = &[
    b"",
    b"POST",
    b"GET",
    b"/",
    b"/index.html",
    b"200",
    b"404",
    b"application/grpc",
    b"trailers",
    b"0",
    b"gzip, deflate",
    b"http",
    b"https",
];

/// A string selector at or above this (and below [`REPEATED`]) is followed
/// by a length byte and that many bytes.
pub const LITERAL: u8 = 64;

/// A string selector at or above this is a run of its own byte value, as
/// long as the next byte times 64 (up to 16,320 bytes): large entries,
/// evictions, a table emptied by an entry larger than it.
pub const REPEATED: u8 = 192;

/// How a field is to be represented (the encoder's `Index`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Indexing {
    /// Incremental indexing.
    Yes,
    /// Without indexing.
    No,
    /// Never indexed.
    Never,
}

/// One step of a program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Encode a field into the open block (opening one if none is).
    Field {
        /// The name.
        name: Vec<u8>,
        /// The value.
        value: Vec<u8>,
        /// Its representation.
        index: Indexing,
    },
    /// End the block (an empty one if none is open): decode and compare.
    End,
    /// The peer's SETTINGS_HEADER_TABLE_SIZE, reduced modulo one more than
    /// what the decoder advertises; signalled at the next block.
    TableSize(u16),
}

/// Reads the ops of a program.
pub struct Program<'a>(pub &'a [u8]);

impl Program<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn string(&mut self, usual: &[&[u8]]) -> Vec<u8> {
        let sel = self.byte();
        if sel >= REPEATED {
            return vec![sel; usize::from(self.byte()) << 6];
        }
        if sel >= LITERAL {
            let n = usize::from(self.byte()).min(self.0.len());
            let (s, rest) = self.0.split_at(n);
            self.0 = rest;
            return s.to_vec();
        }
        usual.get(usize::from(sel)).map_or_else(Vec::new, |s| s.to_vec())
    }
}

impl Iterator for Program<'_> {
    type Item = Op;

    fn next(&mut self) -> Option<Op> {
        let op = *self.0.first()?;
        self.0 = &self.0[1..];
        Some(match op % 8 {
            0..=4 => {
                let name = self.string(NAMES);
                let value = self.string(VALUES);
                let index = match (op >> 3) & 3 {
                    0 | 1 => Indexing::Yes,
                    2 => Indexing::No,
                    _ => Indexing::Never,
                };
                Op::Field { name, value, index }
            }
            5 | 6 => Op::End,
            _ => Op::TableSize(u16::from_be_bytes([self.byte(), self.byte()])),
        })
    }
}

fn write_string(s: &[u8], usual: &[&[u8]], out: &mut Vec<u8>) {
    if let Some(i) = usual.iter().position(|u| *u == s) {
        out.push(i as u8);
    } else if let Ok(n) = u8::try_from(s.len()) {
        out.push(LITERAL);
        out.push(n);
        out.extend_from_slice(s);
    } else {
        panic!("a seed string longer than 255 bytes");
    }
}

/// Writes `ops` as a program (seeds: strings up to 255 bytes).
pub fn encode(ops: &[Op]) -> Vec<u8> {
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::Field { name, value, index } => {
                let kind = match index {
                    Indexing::Yes => 0,
                    Indexing::No => 2,
                    Indexing::Never => 3,
                };
                out.push(kind << 3);
                write_string(name, NAMES, &mut out);
                write_string(value, VALUES, &mut out);
            }
            Op::End => out.push(5),
            Op::TableSize(n) => {
                out.push(7);
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
    }
    out
}
