//! The scrape endpoint: HTTP/1.1, `GET /metrics`, one request per
//! connection.
//!
//! A scraper (Prometheus, the OpenTelemetry Collector's prometheus
//! receiver, curl) sends a short GET and reads the answer; that is all this
//! serves. Whoever connects is untrusted: a request head is read up to
//! [`MAX_HEAD`] bytes within [`READ_TIMEOUT`], at most [`MAX_CONNECTIONS`]
//! connections are open at once (more wait in the kernel's backlog), and
//! nothing a client sends is kept past its connection.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::Metrics;

/// The longest request head read (request line and headers).
pub const MAX_HEAD: usize = 8 << 10;
/// How long a client has to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// A request head's method, as far as the endpoint cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `GET`.
    Get,
    /// `HEAD`: the answer without its body.
    Head,
    /// Anything else (answered 405).
    Other,
}

/// What a request head says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// Its method.
    pub method: Method,
    /// The request target's path (without a query string).
    pub path: String,
}

/// Why a request head was refused (answered 400).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadError {
    /// Longer than [`MAX_HEAD`].
    TooLong,
    /// Not `METHOD SP TARGET SP HTTP/1.x`.
    Malformed,
}

impl std::fmt::Display for HeadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HeadError::TooLong => "request head too long",
            HeadError::Malformed => "malformed request line",
        })
    }
}

/// Parses the request head at the start of `buf`: `Ok(None)` while it is
/// incomplete (no empty line yet). Headers are skipped: none changes the
/// answer.
pub fn parse_head(buf: &[u8]) -> Result<Option<Head>, HeadError> {
    // The head ends at the first line end followed by an empty line
    // (CRLF, or a bare LF as RFC 9112 lets a server accept): the earliest
    // such place, so bytes arriving later never change a complete head.
    let end = (0..buf.len()).find(|&i| {
        buf[i] == b'\n' && (buf.get(i + 1) == Some(&b'\n') || buf[i + 1..].starts_with(b"\r\n"))
    });
    let Some(end) = end else {
        // Room for the longest terminator after MAX_HEAD bytes of head.
        return if buf.len() > MAX_HEAD + 2 { Err(HeadError::TooLong) } else { Ok(None) };
    };
    if end > MAX_HEAD {
        return Err(HeadError::TooLong);
    }
    let line_end = buf[..end].iter().position(|&b| b == b'\n').unwrap_or(end);
    let line = &buf[..line_end];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HeadError::Malformed);
    };
    if !version.starts_with(b"HTTP/1.") || version.len() != 8 || !version[7].is_ascii_digit() {
        return Err(HeadError::Malformed);
    }
    if method.is_empty() || !method.iter().all(u8::is_ascii_uppercase) {
        return Err(HeadError::Malformed);
    }
    // Origin form only (`/path?query`): what scrapers send.
    if !target.starts_with(b"/") || !target.iter().all(|b| b.is_ascii_graphic()) {
        return Err(HeadError::Malformed);
    }
    let method = match method {
        b"GET" => Method::Get,
        b"HEAD" => Method::Head,
        _ => Method::Other,
    };
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    // Only printable ASCII got here: always UTF-8.
    let path = String::from_utf8_lossy(path).into_owned();
    Ok(Some(Head { method, path }))
}

/// Serves the scrape endpoint on `listener` until the task is dropped
/// (accept errors are waited out, see [`crate::accept`]).
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    let open = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = open.clone().acquire_owned().await else { return };
        let (sock, _) = crate::accept::accept("metrics endpoint", || listener.accept()).await;
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _ = tokio::time::timeout(READ_TIMEOUT * 2, answer(sock, &metrics)).await;
        });
    }
}

async fn answer(mut sock: tokio::net::TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let head = tokio::time::timeout(READ_TIMEOUT, async {
        loop {
            match parse_head(&buf) {
                Ok(Some(h)) => return Ok(h),
                Ok(None) => {}
                Err(e) => return Err(e),
            }
            let mut chunk = [0u8; 1024];
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return Err(HeadError::Malformed),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    let mut send_body = true;
    let (status, body, content_type) = match head {
        Err(_) => return Ok(()),
        Ok(Err(e)) => ("400 Bad Request", format!("{e}\n"), "text/plain; charset=utf-8"),
        Ok(Ok(h)) => {
            send_body = h.method != Method::Head;
            match (h.method, h.path.as_str()) {
                (Method::Other, _) => {
                    ("405 Method Not Allowed", "GET /metrics\n".into(), "text/plain")
                }
                (_, "/metrics") => {
                    ("200 OK", metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
                }
                _ => ("404 Not Found", "metrics are at /metrics\n".into(), "text/plain"),
            }
        }
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if send_body {
        out.extend_from_slice(body.as_bytes());
    }
    sock.write_all(&out).await?;
    sock.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads() {
        let get = |p: &str| Ok(Some(Head { method: Method::Get, path: p.into() }));
        assert_eq!(parse_head(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), get("/metrics"));
        assert_eq!(parse_head(b"GET /metrics?x=1 HTTP/1.0\n\n"), get("/metrics"));
        assert_eq!(parse_head(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"), Ok(None));
        assert_eq!(
            parse_head(b"POST / HTTP/1.1\r\n\r\n"),
            Ok(Some(Head { method: Method::Other, path: "/".into() }))
        );
        assert_eq!(parse_head(b"GET /metrics\r\n\r\n"), Err(HeadError::Malformed));
        assert_eq!(parse_head(b"GET  /metrics HTTP/1.1\r\n\r\n"), Err(HeadError::Malformed));
        assert_eq!(parse_head(b"get /metrics HTTP/1.1\r\n\r\n"), Err(HeadError::Malformed));
        assert_eq!(parse_head(b"GET /metrics HTTP/2.0\r\n\r\n"), Err(HeadError::Malformed));
        assert_eq!(parse_head(b"GET ?x HTTP/1.1\r\n\r\n"), Err(HeadError::Malformed));
        assert_eq!(parse_head(b"GET /a HTTP/1.1\n\nGET /b HTTP/1.1\r\n\r\n"), get("/a"));
        assert_eq!(parse_head(&vec![b'A'; MAX_HEAD + 3]), Err(HeadError::TooLong));
        assert_eq!(parse_head(&vec![b'A'; MAX_HEAD]), Ok(None));
    }
}
