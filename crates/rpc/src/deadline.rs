//! A call's deadline, enforced where its handler runs.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Instant;

use protoplane_grpc::{Code, Metadata, Status};

/// Runs a handler to its end, or until `deadline` passes
/// (DEADLINE_EXCEEDED): how every driver of a call bounds its handler.
///
/// The handler is polled once before any timer exists: most handlers
/// answer at their first poll, and a timer made for them (a runtime
/// handle cloned, an entry in the timer wheel once polled) would be work
/// for nothing. One that waits gets its timer then; a deadline already
/// past by that first poll still ends the call, at the timer's first
/// poll.
pub async fn until_deadline(
    deadline: Option<Instant>,
    handler: impl Future<Output = Result<Metadata, Status>>,
) -> Result<Metadata, Status> {
    let mut handler = pin!(handler);
    let Some(d) = deadline else { return handler.await };
    let first = std::future::poll_fn(|cx| Poll::Ready(handler.as_mut().poll(cx))).await;
    if let Poll::Ready(r) = first {
        return r;
    }
    tokio::time::timeout_at(d.into(), handler)
        .await
        .unwrap_or_else(|_| Err(Status::new(Code::DeadlineExceeded, "deadline exceeded")))
}
