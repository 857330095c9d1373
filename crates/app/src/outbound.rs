//! Outbound calls through the engine: the client half of the RPC tax
//! moved off this process too.
//!
//! ```ignore
//! let mut app = protoplane_app::attach("/tmp/protoplane.sock");
//! // a channel like any other: the generated client stub works on it unchanged
//! let kv = KvClient::new(app.channel("dns:///kv.internal:50051", kv_server::schema()));
//! app.serve(Arc::new(Frontend { kv }))?;
//! ```
//!
//! [`App::channel`](crate::App::channel) declares the target and the
//! schema's services at attach; the engine checks the target against its
//! `[outbound] allow`, makes (or shares) a channel to it with its own
//! resolver, balancer, retries and xDS, and answers each call. A call
//! here is: the request block copied into a chunk of this process's half,
//! one descriptor on the response ring, and the answer's block and wire
//! bytes copied out of the engine's chunk into this process's memory (so
//! a response may be kept as long as the caller likes: the engine's chunk
//! goes back at once). No encode, no decode, no HTTP/2, no socket here.
//!
//! The channel's calls wait for an attachment when `wait_for_ready` says
//! so, else fail UNAVAILABLE while the process is not attached; when the
//! engine goes away, calls waiting for their answer fail UNAVAILABLE (the
//! engine may or may not have sent them). Deadlines cross the seam (the
//! engine sends `grpc-timeout`), and a caller that gives up (its deadline,
//! or dropping the call) cancels the engine's call, which resets the
//! stream.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Instant;

use protoplane_grpc::{BoxFuture, Code, Schema, Status};
use protoplane_rpc::delegate::{Delegate, DelegatedCall};
use protoplane_rpc::{Connectivity, UnaryResponse};
use protoplane_shm::attach::ChannelDecl;
use tokio::sync::Notify;

use crate::session::Session;

/// The channels an application declared, and the attachment their calls
/// go through.
#[derive(Default)]
pub(crate) struct Shared {
    session: Mutex<Weak<Session>>,
    /// Told at every attachment.
    attached: Notify,
}

impl Shared {
    pub(crate) fn attach(&self, s: &Arc<Session>) {
        *self.session.lock().unwrap_or_else(PoisonError::into_inner) = Arc::downgrade(s);
        self.attached.notify_waiters();
    }

    fn current(&self) -> Option<Arc<Session>> {
        self.session.lock().unwrap_or_else(PoisonError::into_inner).upgrade()
    }

    /// The current attachment, waiting for one until `deadline` when
    /// `wait` says so.
    async fn session(&self, wait: bool, deadline: Option<Instant>) -> Result<Arc<Session>, Status> {
        loop {
            let attached = self.attached.notified();
            if let Some(s) = self.current().filter(|s| !s.is_ended()) {
                return Ok(s);
            }
            if !wait {
                return Err(Status::new(Code::Unavailable, "not attached to an engine"));
            }
            match deadline {
                Some(d) => {
                    if tokio::time::timeout_at(d.into(), attached).await.is_err() {
                        return Err(Status::new(Code::DeadlineExceeded, "deadline exceeded"));
                    }
                }
                None => attached.await,
            }
        }
    }
}

/// One declared channel: a target, and the services (with their
/// schemas' digests) called there, each at its index among the
/// application's channels.
pub(crate) struct EngineChannel {
    pub(crate) shared: Arc<Shared>,
    pub(crate) target: String,
    /// The schema declared, its digest, and (service, channel index) for
    /// each of its services.
    pub(crate) schema: Arc<Schema>,
    pub(crate) digest: u64,
    pub(crate) services: Vec<(String, u8)>,
}

impl EngineChannel {
    /// The channel index and the method's response type of a call.
    fn route(&self, call: &DelegatedCall<'_>) -> Result<(u8, u32), Status> {
        let m = call.schema.method(call.method).ok_or_else(|| {
            Status::new(Code::InvalidArgument, format!("no method #{}", call.method))
        })?;
        // The schema declared (the same value, as a generated client holds
        // it), else one with the same tables (a digest is worked out from
        // the whole table set: not per call).
        let same =
            Arc::ptr_eq(call.schema, &self.schema) || call.schema.tables().digest() == self.digest;
        let index = self
            .services
            .iter()
            .find_map(|(service, i)| (same && *service == m.service).then_some(*i));
        let index = index.ok_or_else(|| {
            Status::new(
                Code::Unimplemented,
                format!(
                    "{} was not declared on the channel to {}: declare its schema with App::channel",
                    m.path, self.target
                ),
            )
        })?;
        Ok((index, m.output))
    }
}

impl Delegate for EngineChannel {
    fn unary<'a>(
        &'a self,
        call: DelegatedCall<'a>,
    ) -> BoxFuture<'a, Result<UnaryResponse, Status>> {
        Box::pin(async move {
            let (index, output) = self.route(&call)?;
            let session = self.shared.session(call.wait_for_ready, call.deadline).await?;
            session.call_out(index, output, &call).await
        })
    }

    fn connectivity(&self) -> Connectivity {
        match self.shared.current().filter(|s| !s.is_ended()) {
            Some(_) => Connectivity::Ready,
            None => Connectivity::TransientFailure,
        }
    }
}

/// The declarations of the channels of `target` for `schema`'s services.
pub(crate) fn declare(target: &str, schema: &Arc<Schema>) -> Vec<ChannelDecl> {
    let digest = schema.tables().digest();
    let decl = |s: &String| ChannelDecl { target: target.to_string(), service: s.clone(), digest };
    schema.services().iter().map(decl).collect()
}
