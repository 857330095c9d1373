//! Client interceptors: code that runs around every call a [`Channel`]
//! makes, before it starts (see and change the call's options: metadata,
//! timeout, `wait_for_ready`; reject it with a [`Status`] before anything
//! is sent) and when it ends (observe its status and how long it took,
//! streaming calls included). Server interceptors are
//! [`protoplane_grpc::intercept`]; the two together are grpc-go's unary
//! and stream interceptors on both sides.
//!
//! A channel with no chain pays nothing. Interceptors run in the order
//! they were added before the call and in the reverse order after it;
//! `after` runs for every interceptor whose `before` let the call through,
//! also when a later one rejected it, the call could not start, or the
//! call was dropped before its end (CANCELLED).
//!
//! [`Channel`]: crate::Channel

use std::sync::Arc;
use std::time::{Duration, Instant};

use protoplane_grpc::{BoxFuture, Status};

use crate::client::CallOptions;

/// A call as a client interceptor sees it before it starts.
#[derive(Debug)]
pub struct ClientHead<'a> {
    /// The method's path, `/package.Service/Method`.
    pub path: &'a str,
    /// The call's options: metadata, timeout, `wait_for_ready`.
    pub options: &'a mut CallOptions,
    /// What interceptors keep for this call until it ends (a span, a
    /// permit): put here, read back in [`ClientEnd::state`].
    pub state: &'a mut CallState,
}

/// Values an interceptor keeps for one call, one per type: set in
/// `before`, read in `after`, dropped when the call's last hook ran. A call
/// whose interceptors keep nothing allocates nothing here.
#[derive(Default)]
pub struct CallState {
    values: Vec<Box<dyn std::any::Any + Send + Sync>>,
}

impl CallState {
    /// Keeps `value` for this call, in place of any earlier one of its type.
    pub fn insert<T: Send + Sync + 'static>(&mut self, value: T) {
        match self.values.iter_mut().find(|v| v.is::<T>()) {
            Some(slot) => *slot = Box::new(value),
            None => self.values.push(Box::new(value)),
        }
    }

    /// The value of type `T` kept for this call.
    pub fn get<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.values.iter().find_map(|v| v.downcast_ref::<T>())
    }
}

impl std::fmt::Debug for CallState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CallState({} values)", self.values.len())
    }
}

/// A call as a client interceptor sees it when it ended.
#[derive(Debug)]
pub struct ClientEnd<'a> {
    /// The method's path.
    pub path: &'a str,
    /// From the first interceptor's `before` to the call's status.
    pub elapsed: Duration,
    /// How the call ended.
    pub status: &'a Status,
    /// What the interceptors kept for this call ([`ClientHead::state`]).
    pub state: &'a CallState,
}

/// A synchronous client interceptor. Both hooks default to doing nothing.
pub trait ClientInterceptor: Send + Sync + 'static {
    /// Before the call starts: an error fails it with that status, and
    /// nothing is sent.
    fn before(&self, call: &mut ClientHead<'_>) -> Result<(), Status> {
        let _ = call;
        Ok(())
    }

    /// When the call ended.
    fn after(&self, call: &ClientEnd<'_>) {
        let _ = call;
    }
}

/// An asynchronous client interceptor: may wait before the call starts
/// (fetch a token, ask a rate limiter).
pub trait AsyncClientInterceptor: Send + Sync + 'static {
    /// Before the call starts: the options back (changed or not), or the
    /// status that fails the call.
    fn before(
        &self,
        path: &str,
        options: CallOptions,
    ) -> BoxFuture<'static, Result<CallOptions, Status>>;

    /// When the call ended.
    fn after(&self, call: &ClientEnd<'_>) {
        let _ = call;
    }
}

#[derive(Clone)]
enum Step {
    Sync(Arc<dyn ClientInterceptor>),
    Async(Arc<dyn AsyncClientInterceptor>),
}

/// An ordered list of client interceptors ([`crate::Channel::intercept`]).
#[derive(Clone, Default)]
pub struct ClientChain {
    steps: Vec<Step>,
}

impl std::fmt::Debug for ClientChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientChain({} interceptors)", self.steps.len())
    }
}

impl ClientChain {
    /// An empty chain.
    pub fn new() -> ClientChain {
        ClientChain::default()
    }

    /// Adds a synchronous interceptor at the end.
    pub fn with(mut self, i: impl ClientInterceptor) -> ClientChain {
        self.steps.push(Step::Sync(Arc::new(i)));
        self
    }

    /// Adds an asynchronous interceptor at the end.
    pub fn with_async(mut self, i: impl AsyncClientInterceptor) -> ClientChain {
        self.steps.push(Step::Async(Arc::new(i)));
        self
    }

    /// Whether the chain has no interceptor.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// This chain's interceptors, then `next`'s.
    pub(crate) fn then(&self, next: ClientChain) -> ClientChain {
        let mut steps = self.steps.clone();
        steps.extend(next.steps);
        ClientChain { steps }
    }

    /// Runs the `before` hooks in order: the options to start the call
    /// with, and what to run when it ends; or the rejection (whose `after`
    /// hooks already ran).
    pub(crate) async fn before(
        self: &Arc<Self>,
        path: &str,
        mut options: CallOptions,
    ) -> Result<(CallOptions, Ending), Status> {
        let mut ending = Ending {
            chain: self.clone(),
            path: path.to_string(),
            entered: 0,
            start: Instant::now(),
            state: CallState::default(),
        };
        for step in &self.steps {
            let verdict = match step {
                Step::Sync(i) => i.before(&mut ClientHead {
                    path,
                    options: &mut options,
                    state: &mut ending.state,
                }),
                Step::Async(i) => match i.before(path, std::mem::take(&mut options)).await {
                    Ok(o) => {
                        options = o;
                        Ok(())
                    }
                    Err(st) => Err(st),
                },
            };
            if let Err(st) = verdict {
                ending.end(&st);
                return Err(st);
            }
            ending.entered += 1;
        }
        Ok((options, ending))
    }
}

/// The `after` hooks still owed for one call.
#[derive(Debug)]
pub(crate) struct Ending {
    chain: Arc<ClientChain>,
    path: String,
    entered: usize,
    start: Instant,
    state: CallState,
}

impl Ending {
    /// Runs the `after` hooks of the interceptors that let the call
    /// through, last first.
    pub(crate) fn end(&self, status: &Status) {
        let end = ClientEnd {
            path: &self.path,
            elapsed: self.start.elapsed(),
            status,
            state: &self.state,
        };
        for step in self.chain.steps[..self.entered].iter().rev() {
            match step {
                Step::Sync(i) => i.after(&end),
                Step::Async(i) => i.after(&end),
            }
        }
    }
}
