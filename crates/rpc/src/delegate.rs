//! Channels whose calls another process makes: a split application's
//! channel through its engine (`protoplane_app::App::channel`).
//!
//! Such a channel carries typed calls only: the application hands over the
//! request block laid out with the builder, the other side encodes it,
//! picks a backend (resolver, balancing, retries, xDS: everything a
//! [`Channel`] of its own does), runs HTTP/2, and hands back the response
//! decoded. So a [`Client`](crate::Client) (and every generated client
//! stub, which is one) works on it unchanged; only how the channel is made
//! differs. Raw calls of encoded bytes ([`Channel::start`]) and streaming
//! calls are not carried: they fail with UNIMPLEMENTED, saying so.
//!
//! Client interceptors installed on the channel run around each call here
//! (they see and change the metadata, and observe the outcome); the
//! channel's own metrics and retries are the other side's.

use std::sync::Arc;
use std::time::Instant;

use protoplane_grpc::metadata::Metadata;
use protoplane_grpc::schema::Schema;
use protoplane_grpc::status::Status;
use protoplane_grpc::BoxFuture;
use protoplane_wire::Block;

use crate::balance::Connectivity;
use crate::client::UnaryResponse;

/// One unary call a [`Delegate`] makes.
#[derive(Debug)]
pub struct DelegatedCall<'a> {
    /// The schema the method belongs to.
    pub schema: &'a Arc<Schema>,
    /// The method (an id of `schema`).
    pub method: u32,
    /// The request, laid out with the builder.
    pub request: &'a Block,
    /// Custom metadata sent with it.
    pub metadata: Metadata,
    /// When the call fails with DEADLINE_EXCEEDED (the call's own
    /// timeout, or the deadline of the call a handler is serving).
    pub deadline: Option<Instant>,
    /// Wait for the channel to become ready rather than fail at once.
    pub wait_for_ready: bool,
}

/// Makes a channel's calls in another process.
pub trait Delegate: Send + Sync + 'static {
    /// Makes one unary call; dropping the future cancels it.
    fn unary<'a>(&'a self, call: DelegatedCall<'a>)
        -> BoxFuture<'a, Result<UnaryResponse, Status>>;

    /// The state of the channel as a whole.
    fn connectivity(&self) -> Connectivity;
}

impl std::fmt::Debug for dyn Delegate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Delegate")
    }
}
