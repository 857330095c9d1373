//! A call's deadline, enforced where its handler runs.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Instant;

use protoplane_grpc::{Code, Metadata, Status};

tokio::task_local! {
    /// The deadline of the call whose handler is running.
    static CALL_DEADLINE: Instant;
}

/// The deadline of the call whose handler is running here, if it has one:
/// calls a handler makes end by it too (grpc-go's context deadline), and
/// dropping the handler (the call cancelled) drops, and so cancels, the
/// calls it was making.
pub fn current() -> Option<Instant> {
    CALL_DEADLINE.try_with(|d| *d).ok()
}

/// Runs `f` (a poll of a call's handler) with `deadline` as the running
/// call's deadline ([`current`]): for drivers that poll handlers
/// themselves.
pub fn within<R>(deadline: Option<Instant>, f: impl FnOnce() -> R) -> R {
    match deadline {
        Some(d) => CALL_DEADLINE.sync_scope(d, f),
        None => f(),
    }
}

/// `handler` with `deadline` as the running call's deadline while it runs
/// ([`current`]), for drivers that enforce the deadline themselves.
pub async fn scoped<F: Future>(deadline: Option<Instant>, handler: F) -> F::Output {
    let mut handler = pin!(handler);
    std::future::poll_fn(|cx| within(deadline, || handler.as_mut().poll(cx))).await
}

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
    let Some(d) = deadline else { return handler.await };
    let mut handler = pin!(CALL_DEADLINE.scope(d, handler));
    let first = std::future::poll_fn(|cx| Poll::Ready(handler.as_mut().poll(cx))).await;
    if let Poll::Ready(r) = first {
        return r;
    }
    tokio::time::timeout_at(d.into(), handler)
        .await
        .unwrap_or_else(|_| Err(Status::new(Code::DeadlineExceeded, "deadline exceeded")))
}
