//! The lean transport: protoplane to protoplane over TCP or Unix sockets,
//! with the same services (the [`Router`](crate::Router)) and the same
//! seam as gRPC, but a minimal binary frame instead of HTTP/2 — no HPACK,
//! no per-stream flow control, no text headers. See [`frame`] for the
//! format.
//!
//! What it gives up, deliberately: interoperability (only protoplane speaks
//! it), per-call flow control (a call whose handler stops taking requests
//! holds up its connection's reading, so slow consumers should use their
//! own connection), and compression. What it keeps: deadlines, metadata,
//! status codes and messages, cancellation, all four call kinds,
//! pipelining, bounded memory.

pub mod client;
pub mod frame;
pub mod server;

pub use client::{LeanCall, LeanChannel};
pub use frame::LeanError;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Writes queued frames until the queue closes: every frame ready at that
/// moment goes out in one write, so under load many calls share a system
/// call. Then shuts the write side down.
async fn write_loop<W: AsyncWrite + Unpin>(mut wr: W, mut rx: mpsc::Receiver<Bytes>) {
    let mut batch = Vec::with_capacity(64);
    let mut out = Vec::with_capacity(64 << 10);
    while rx.recv_many(&mut batch, 256).await > 0 {
        out.clear();
        for b in batch.drain(..) {
            out.extend_from_slice(&b);
        }
        if wr.write_all(&out).await.is_err() {
            return;
        }
    }
    let _ = wr.shutdown().await;
}
