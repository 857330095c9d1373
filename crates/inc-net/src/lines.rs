//! JSON lines over TCP, with a bound on the line length: a peer cannot
//! make a reader buffer without limit.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use serde_json::Value;

/// Longest line accepted (a control message is far smaller).
pub const MAX_LINE: usize = 4 << 20;

/// Reads JSON lines.
#[derive(Debug)]
pub struct LineReader<R> {
    inner: BufReader<R>,
}

impl<R: Read> LineReader<R> {
    /// Wraps a stream.
    pub fn new(r: R) -> Self {
        LineReader { inner: BufReader::new(r) }
    }

    /// The next line as JSON. `Ok(None)` at end of stream; an error for an
    /// over-long line or bytes that are not JSON.
    pub fn next_value(&mut self) -> io::Result<Option<Value>> {
        let mut line = Vec::new();
        loop {
            let buf = self.inner.fill_buf()?;
            if buf.is_empty() {
                return if line.is_empty() {
                    Ok(None)
                } else {
                    Err(io::Error::new(io::ErrorKind::UnexpectedEof, "line without end"))
                };
            }
            match buf.iter().position(|b| *b == b'\n') {
                Some(i) => {
                    line.extend_from_slice(&buf[..i]);
                    self.inner.consume(i + 1);
                    break;
                }
                None => {
                    let n = buf.len();
                    line.extend_from_slice(buf);
                    self.inner.consume(n);
                }
            }
            if line.len() > MAX_LINE {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
            }
        }
        serde_json::from_slice(&line)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

/// Writes one JSON value as a line.
pub fn write_value(w: &mut impl Write, v: &Value) -> io::Result<()> {
    let mut bytes = serde_json::to_vec(v).map_err(io::Error::other)?;
    bytes.push(b'\n');
    w.write_all(&bytes)?;
    w.flush()
}

/// Sends a request and reads one reply on a connection.
pub fn call(
    stream: &mut TcpStream,
    reader: &mut LineReader<TcpStream>,
    v: &Value,
) -> io::Result<Value> {
    write_value(stream, v)?;
    reader
        .next_value()?
        .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"))
}
