//! The lean transport: protoplane to protoplane over TCP or Unix sockets,
//! with the same services (the [`Router`](crate::Router)) and the same
//! seam as gRPC, but a minimal binary frame instead of HTTP/2 — no HPACK,
//! no per-stream flow control, no text headers. See
//! [`protoplane_grpc::lean`] for the format.
//!
//! What it gives up, deliberately: interoperability (only protoplane speaks
//! it), per-call flow control (a call whose handler stops taking requests
//! holds up its connection's reading, so slow consumers should use their
//! own connection), and compression. What it keeps: deadlines, metadata,
//! status codes and messages, cancellation, all four call kinds,
//! pipelining, bounded memory.

pub mod client;
pub mod server;

pub use client::{LeanCall, LeanChannel};

use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// Bytes of frames queued for a connection's writer: beyond this, senders
/// wait (a peer that stops reading holds this much of our memory, no more).
const WRITE_BUDGET: usize = 4 << 20;

/// Frames queued for a connection's writer.
const WRITE_QUEUE: usize = 1024;

/// The sending end of a connection's write queue, bounded in frames and
/// in bytes.
#[derive(Clone, Debug)]
pub(crate) struct FrameTx {
    tx: mpsc::Sender<(Bytes, Option<OwnedSemaphorePermit>)>,
    budget: Arc<Semaphore>,
}

/// The writer's end.
pub(crate) type FrameRx = mpsc::Receiver<(Bytes, Option<OwnedSemaphorePermit>)>;

/// A new write queue.
pub(crate) fn frame_queue() -> (FrameTx, FrameRx) {
    let (tx, rx) = mpsc::channel(WRITE_QUEUE);
    (FrameTx { tx, budget: Arc::new(Semaphore::new(WRITE_BUDGET)) }, rx)
}

impl FrameTx {
    /// Queues a frame, waiting for room; `Err` once the writer is gone. A
    /// frame larger than the whole budget waits for all of it.
    ///
    /// Queuing is tried at once, without waiting; only a full queue boxes
    /// the wait. Every call's driver awaits this for its answer, so the
    /// wait's state (two semaphore acquisitions) would otherwise sit in
    /// every call's boxed future.
    pub(crate) async fn send(&self, frame: Bytes) -> Result<(), ()> {
        match self.try_queue(frame)? {
            None => Ok(()),
            Some(frame) => Box::pin(self.send_wait(frame)).await,
        }
    }

    /// Queues a frame if there is room now; hands it back if not.
    fn try_queue(&self, frame: Bytes) -> Result<Option<Bytes>, ()> {
        use tokio::sync::mpsc::error::TrySendError;
        use tokio::sync::TryAcquireError;
        let n = frame.len().clamp(1, WRITE_BUDGET) as u32;
        let permit = match self.budget.clone().try_acquire_many_owned(n) {
            Ok(p) => p,
            Err(TryAcquireError::NoPermits) => return Ok(Some(frame)),
            Err(TryAcquireError::Closed) => return Err(()),
        };
        match self.tx.try_send((frame, Some(permit))) {
            Ok(()) => Ok(None),
            Err(TrySendError::Full((frame, _))) => Ok(Some(frame)),
            Err(TrySendError::Closed(_)) => Err(()),
        }
    }

    /// Queues a frame, waiting for room.
    async fn send_wait(&self, frame: Bytes) -> Result<(), ()> {
        let n = frame.len().clamp(1, WRITE_BUDGET) as u32;
        let permit = self.budget.clone().acquire_many_owned(n).await.map_err(|_| ())?;
        self.tx.send((frame, Some(permit))).await.map_err(|_| ())
    }

    /// Queues a (small, control) frame if there is room now.
    pub(crate) fn try_send(&self, frame: Bytes) {
        let _ = self.tx.try_send((frame, None));
    }
}

/// Writes queued frames until the queue closes: every frame ready at that
/// moment goes out in one write, so under load many calls share a system
/// call. Then shuts the write side down.
async fn write_loop<W: AsyncWrite + Unpin>(mut wr: W, mut rx: FrameRx) {
    let mut batch = Vec::with_capacity(64);
    let mut out = Vec::with_capacity(64 << 10);
    while rx.recv_many(&mut batch, 256).await > 0 {
        out.clear();
        for (b, _permit) in batch.drain(..) {
            out.extend_from_slice(&b);
        }
        if wr.write_all(&out).await.is_err() {
            return;
        }
    }
    let _ = wr.shutdown().await;
}
