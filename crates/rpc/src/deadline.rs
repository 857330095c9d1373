//! A call's deadline, enforced where its handler runs.

use std::future::Future;
use std::time::Instant;

use protoplane_grpc::{Code, Metadata, Status};

/// Runs a handler to its end, or until `deadline` passes
/// (DEADLINE_EXCEEDED): how every driver of a call bounds its handler.
pub async fn until_deadline(
    deadline: Option<Instant>,
    handler: impl Future<Output = Result<Metadata, Status>>,
) -> Result<Metadata, Status> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d.into(), handler)
            .await
            .unwrap_or_else(|_| Err(Status::new(Code::DeadlineExceeded, "deadline exceeded"))),
        None => handler.await,
    }
}
