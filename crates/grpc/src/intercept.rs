//! Server interceptors: code that runs around every call of a service,
//! before its handler (see and change the request metadata, the peer and
//! the method; add response headers; reject the call with a [`Status`],
//! details included) and after it (observe the outcome and the time the
//! call took, streaming calls included, and change the trailers or the
//! error).
//!
//! A [`Chain`] wraps a service ([`Chain::wrap`]); the wrapped service is
//! an ordinary [`Service`], so the same chain serves a monolithic
//! `Router`, the split application side (`protoplane_app::attach(..)
//! .serve(chain.wrap(svc))`) and anything else that takes a service.
//! Interceptors run in the order they were added before the handler and
//! in the reverse order after it (an onion: the first added sees the call
//! first and its outcome last); `after` runs for every interceptor whose
//! `before` let the call through, also when a later one rejected it or the
//! call was cancelled (the handler dropped: CANCELLED).
//!
//! A service with no chain pays nothing: the wrapper exists only where a
//! chain is installed, and a chain of synchronous interceptors costs one
//! boxed future per call beyond them.
//!
//! Why not `tower::Layer`: a tower layer sees an HTTP request, before the
//! gRPC framing, decode and deadline handling that protoplane's transports
//! (and, in split mode, the engine in another process) do; its natural
//! place would be in front of the transport, which the split engine does
//! not have in the application process at all. Interceptors here sit at
//! the seam every mode shares, see decoded calls, and cost no allocation
//! per call beyond the one boxed future, the shape grpc-go's
//! `UnaryServerInterceptor`/`StreamServerInterceptor` and tonic's
//! `Interceptor` users know.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::call::{BoxFuture, Peer, Request, Responder, Service, Streaming};
use crate::metadata::Metadata;
use crate::schema::{Method, Schema};
use crate::status::{Code, Status};

/// A call as an interceptor sees it before the handler runs.
#[derive(Debug)]
pub struct CallHead<'a> {
    schema: &'a Schema,
    method: u32,
    /// The request metadata (change it to change what the handler sees).
    pub metadata: &'a mut Metadata,
    /// The client's connection, where the transport knows it.
    pub peer: &'a mut Option<Arc<Peer>>,
    /// The call's deadline, if the client set one.
    pub deadline: Option<Instant>,
    /// Response headers: sent with the first response, or alone when the
    /// handler sends none.
    pub response_headers: &'a mut Metadata,
}

impl CallHead<'_> {
    /// The method called (full service name, method name, path, types).
    pub fn method(&self) -> &Method {
        // The id was checked when it was set.
        &self.schema.methods()[self.method as usize]
    }

    /// Sends the call to another method of the same service, which must
    /// have the same request and response types and streaming shape.
    pub fn route_to(&mut self, name: &str) -> Result<(), Status> {
        let now = self.method();
        let Some(id) = self.schema.find(&now.service, name) else {
            return Err(Status::new(
                Code::Internal,
                format!("interceptor: no method {name} in {}", now.service),
            ));
        };
        let to = &self.schema.methods()[id as usize];
        let same = to.input == now.input
            && to.output == now.output
            && to.client_streaming == now.client_streaming
            && to.server_streaming == now.server_streaming;
        if !same {
            return Err(Status::new(
                Code::Internal,
                format!("interceptor: {} and {} differ in shape", now.path, to.path),
            ));
        }
        self.method = id;
        Ok(())
    }
}

/// A call as an interceptor sees it after the handler ended.
#[derive(Debug)]
pub struct CallEnd<'a> {
    /// The method called (after any re-routing).
    pub method: &'a Method,
    /// When the first interceptor's `before` ran, if one of the chain's
    /// interceptors is [`Interceptor::timed`] ([`CallEnd::elapsed`]).
    start: Option<Instant>,
    /// The outcome: the trailers (OK) or the error status; change either.
    /// A cancelled call (its handler dropped) ends with CANCELLED, and what
    /// an interceptor changes then goes nowhere.
    pub outcome: &'a mut Result<Metadata, Status>,
}

impl CallEnd<'_> {
    /// From the first interceptor's `before` to the handler's end, when an
    /// interceptor of the chain asked for timing ([`Interceptor::timed`]);
    /// `None` otherwise. A chain that times nothing reads no clock.
    pub fn elapsed(&self) -> Option<Duration> {
        self.start.map(|s| s.elapsed())
    }
}

/// A synchronous server interceptor. Both hooks default to doing nothing.
pub trait Interceptor: Send + Sync + 'static {
    /// Whether this interceptor reads [`CallEnd::elapsed`]: the chain then
    /// reads the clock when a call starts (no interceptor timing, no clock).
    fn timed(&self) -> bool {
        false
    }

    /// Before the handler: an error ends the call with that status (the
    /// handler never runs).
    fn before(&self, call: &mut CallHead<'_>) -> Result<(), Status> {
        let _ = call;
        Ok(())
    }

    /// After the handler (or the rejection, or the cancellation).
    fn after(&self, call: &mut CallEnd<'_>) {
        let _ = call;
    }
}

/// What an asynchronous interceptor is given, and gives back, before the
/// handler runs: the parts of the call it may change, owned so that it may
/// wait (on a token service, a database, a remote policy).
#[derive(Debug)]
pub struct AsyncHead {
    /// The method called.
    pub method: Method,
    /// The request metadata.
    pub metadata: Metadata,
    /// The client's connection.
    pub peer: Option<Arc<Peer>>,
    /// The call's deadline.
    pub deadline: Option<Instant>,
    /// Response headers to send.
    pub response_headers: Metadata,
}

/// An asynchronous server interceptor.
pub trait AsyncInterceptor: Send + Sync + 'static {
    /// As [`Interceptor::timed`].
    fn timed(&self) -> bool {
        false
    }

    /// Before the handler: the head back (changed or not), or the status
    /// that ends the call.
    fn before(&self, head: AsyncHead) -> BoxFuture<'static, Result<AsyncHead, Status>>;

    /// After the handler, as [`Interceptor::after`].
    fn after(&self, call: &mut CallEnd<'_>) {
        let _ = call;
    }
}

#[derive(Clone)]
enum Step {
    Sync(Arc<dyn Interceptor>),
    Async(Arc<dyn AsyncInterceptor>),
}

impl Step {
    fn timed(&self) -> bool {
        match self {
            Step::Sync(i) => i.timed(),
            Step::Async(i) => i.timed(),
        }
    }

    fn after(&self, call: &mut CallEnd<'_>) {
        match self {
            Step::Sync(i) => i.after(call),
            Step::Async(i) => i.after(call),
        }
    }
}

/// An ordered list of interceptors.
#[derive(Clone, Default)]
pub struct Chain {
    steps: Vec<Step>,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Chain({} interceptors)", self.steps.len())
    }
}

impl Chain {
    /// An empty chain.
    pub fn new() -> Chain {
        Chain::default()
    }

    /// Adds a synchronous interceptor at the end.
    pub fn with(mut self, i: impl Interceptor) -> Chain {
        self.steps.push(Step::Sync(Arc::new(i)));
        self
    }

    /// Adds an asynchronous interceptor at the end.
    pub fn with_async(mut self, i: impl AsyncInterceptor) -> Chain {
        self.steps.push(Step::Async(Arc::new(i)));
        self
    }

    /// Whether the chain has no interceptor.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// `svc` with the chain around every call; `svc` itself if the chain
    /// is empty (no cost).
    pub fn wrap(&self, svc: Arc<dyn Service>) -> Arc<dyn Service> {
        if self.steps.is_empty() {
            return svc;
        }
        let sync = self.steps.iter().all(|s| matches!(s, Step::Sync(_)));
        let timed = self.steps.iter().any(Step::timed);
        Arc::new(Intercepted { inner: svc, steps: self.steps.clone().into(), sync, timed })
    }
}

/// A service with a chain around its calls.
struct Intercepted {
    inner: Arc<dyn Service>,
    steps: Arc<[Step]>,
    /// Every interceptor is synchronous: the `before` hooks run in `call`
    /// itself and the handler's future is wrapped in [`Finishing`], with
    /// no async block holding the request and responder.
    sync: bool,
    /// An interceptor reads [`CallEnd::elapsed`]: calls read the clock.
    timed: bool,
}

/// The handler's future of a call whose `before` hooks all ran (a
/// synchronous chain): the `after` hooks run when it is ready, or with
/// CANCELLED when it is dropped first.
struct Finishing {
    handler: BoxFuture<'static, Result<Metadata, Status>>,
    owner: Arc<Intercepted>,
    method: u32,
    start: Option<Instant>,
    done: bool,
}

impl Finishing {
    fn finish(&mut self, outcome: &mut Result<Metadata, Status>) {
        self.done = true;
        let schema: &Schema = self.owner.inner.schema();
        let Some(method) = schema.methods().get(self.method as usize) else { return };
        let start = self.start;
        for step in self.owner.steps.iter().rev() {
            step.after(&mut CallEnd { method, start, outcome });
        }
    }
}

impl std::future::Future for Finishing {
    type Output = Result<Metadata, Status>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let mut outcome = std::task::ready!(self.handler.as_mut().poll(cx));
        self.finish(&mut outcome);
        std::task::Poll::Ready(outcome)
    }
}

impl Drop for Finishing {
    fn drop(&mut self) {
        if !self.done {
            let mut outcome = Err(Status::new(Code::Cancelled, "the call was cancelled"));
            self.finish(&mut outcome);
        }
    }
}

impl Intercepted {
    /// A call through a chain of synchronous interceptors: the `before`
    /// hooks here, then the handler's own future inside [`Finishing`].
    fn call_sync(
        self: Arc<Self>,
        method: u32,
        mut request: Request<Streaming>,
        mut responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        let schema: &Schema = self.inner.schema();
        if schema.method(method).is_none() {
            return Box::pin(std::future::ready(Err(Status::new(
                Code::Unimplemented,
                "no such method",
            ))));
        }
        let start = self.timed.then(Instant::now);
        let mut id = method;
        for (k, step) in self.steps.iter().enumerate() {
            let Step::Sync(i) = step else { unreachable!("a synchronous chain") };
            let mut head = CallHead {
                schema,
                method: id,
                metadata: &mut request.metadata,
                peer: &mut request.peer,
                deadline: request.deadline,
                response_headers: responder.metadata_mut(),
            };
            let verdict = i.before(&mut head);
            id = head.method;
            if let Err(st) = verdict {
                let mut outcome = Err(st);
                if let Some(m) = schema.methods().get(id as usize) {
                    for step in self.steps[..k].iter().rev() {
                        step.after(&mut CallEnd { method: m, start, outcome: &mut outcome });
                    }
                }
                return Box::pin(std::future::ready(outcome));
            }
        }
        let handler = self.inner.clone().call(id, request, responder);
        Box::pin(Finishing { handler, owner: self, method: id, start, done: false })
    }
}

/// Runs the `after` hooks of the interceptors whose `before` ran, once:
/// when the call ends, or (dropped first) when it is cancelled.
struct Ending<'a> {
    steps: &'a [Step],
    schema: &'a Schema,
    method: u32,
    entered: usize,
    start: Option<Instant>,
    done: bool,
}

impl Ending<'_> {
    fn finish(&mut self, outcome: &mut Result<Metadata, Status>) {
        self.done = true;
        let Some(method) = self.schema.methods().get(self.method as usize) else { return };
        let start = self.start;
        for step in self.steps[..self.entered].iter().rev() {
            step.after(&mut CallEnd { method, start, outcome });
        }
    }
}

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut outcome = Err(Status::new(Code::Cancelled, "the call was cancelled"));
            self.finish(&mut outcome);
        }
    }
}

impl Service for Intercepted {
    fn schema(&self) -> &Arc<Schema> {
        self.inner.schema()
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn decodes_requests(&self) -> bool {
        self.inner.decodes_requests()
    }

    fn landing(&self, need: usize) -> Option<crate::landing::Landing> {
        self.inner.landing(need)
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        mut request: Request<Streaming>,
        mut responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        if self.sync {
            return self.call_sync(method, request, responder);
        }
        Box::pin(async move {
            let schema: &Schema = self.inner.schema();
            if schema.method(method).is_none() {
                return Err(Status::new(Code::Unimplemented, "no such method"));
            }
            let mut ending = Ending {
                steps: &self.steps,
                schema,
                method,
                entered: 0,
                start: self.timed.then(Instant::now),
                done: false,
            };
            for (k, step) in self.steps.iter().enumerate() {
                let verdict = match step {
                    Step::Sync(i) => {
                        let mut head = CallHead {
                            schema,
                            method: ending.method,
                            metadata: &mut request.metadata,
                            peer: &mut request.peer,
                            deadline: request.deadline,
                            response_headers: responder.metadata_mut(),
                        };
                        let r = i.before(&mut head);
                        ending.method = head.method;
                        r
                    }
                    Step::Async(i) => {
                        let head = AsyncHead {
                            method: schema.methods()[ending.method as usize].clone(),
                            metadata: std::mem::take(&mut request.metadata),
                            peer: request.peer.take(),
                            deadline: request.deadline,
                            response_headers: std::mem::take(responder.metadata_mut()),
                        };
                        match i.before(head).await {
                            Ok(head) => {
                                request.metadata = head.metadata;
                                request.peer = head.peer;
                                *responder.metadata_mut() = head.response_headers;
                                Ok(())
                            }
                            Err(st) => Err(st),
                        }
                    }
                };
                ending.entered = k;
                if let Err(st) = verdict {
                    let mut outcome = Err(st);
                    ending.finish(&mut outcome);
                    return outcome;
                }
                ending.entered = k + 1;
            }
            let handler = self.inner.clone().call(ending.method, request, responder);
            let mut outcome = handler.await;
            ending.finish(&mut outcome);
            outcome
        })
    }
}
