//! JSON lines over TCP, with a bound on the line length: a peer cannot
//! make a reader buffer without limit.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread;

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

/// What a connection's reader thread reports.
#[derive(Debug)]
pub(crate) enum Incoming {
    /// A JSON line from connection `.0`.
    Line(u64, Value),
    /// Connection `.0` ended (or sent something that is not a JSON line).
    Closed(u64),
}

/// The write halves of accepted connections, by connection id.
#[derive(Clone, Debug, Default)]
pub(crate) struct Writers(Arc<Mutex<HashMap<u64, TcpStream>>>);

impl Writers {
    /// Writes `v` as a line to connection `id`; a connection whose write
    /// fails is forgotten.
    pub(crate) fn send(&self, id: u64, v: &Value) {
        if let Ok(mut map) = self.0.lock() {
            if let Some(w) = map.get_mut(&id) {
                if write_value(w, v).is_err() {
                    map.remove(&id);
                }
            }
        }
    }

    /// Forgets connection `id`.
    pub(crate) fn forget(&self, id: u64) {
        if let Ok(mut map) = self.0.lock() {
            map.remove(&id);
        }
    }
}

/// Accepts connections on `listener` until it fails: each gets an id, its
/// write half goes into `writers`, and a reader thread of its own sends
/// every line to `tx` (calling `after_line` after each) and then `Closed`.
pub(crate) fn accept_lines(
    listener: TcpListener,
    tx: Sender<Incoming>,
    writers: Writers,
    after_line: impl Fn() + Clone + Send + 'static,
) {
    for (id, stream) in listener.incoming().enumerate() {
        let Ok(stream) = stream else { continue };
        let id = id as u64;
        let _ = stream.set_nodelay(true);
        let Ok(w) = stream.try_clone() else { continue };
        if let Ok(mut map) = writers.0.lock() {
            map.insert(id, w);
        }
        let tx = tx.clone();
        let after_line = after_line.clone();
        thread::spawn(move || {
            let mut r = LineReader::new(stream);
            while let Ok(Some(v)) = r.next_value() {
                if tx.send(Incoming::Line(id, v)).is_err() {
                    return;
                }
                after_line();
            }
            let _ = tx.send(Incoming::Closed(id));
        });
    }
}
