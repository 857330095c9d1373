//! Starting calls and running their handlers: the service and method a
//! call's OPEN names, its side sections (metadata, timeout, the client's
//! verified certificates), its requests (one, or a queue a client-streaming
//! call's further requests go to), and the handler run to completion in
//! the drain loop where it can, as a task where it waits. What a handler
//! sends is posted as it comes ([`super::post`]).

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use bytes::Bytes;
use futures_util::future::{AbortHandle, Abortable};
use protoplane_grpc::call::{Out, UnarySlot};
use protoplane_grpc::{
    Code, Message, Metadata, Peer, Request, Responder, Service, Status, Streaming,
};
use protoplane_rpc::deadline::until_deadline;
use protoplane_seam::{app as seam, OpenRepr};
use protoplane_shm::desc::{self, Descriptor};
use tokio::sync::mpsc;

use super::pool::InRegion;
use super::{CallCtl, Session};

/// Requests queued per client-streaming call before the call fails.
const REQUEST_QUEUE: usize = 1024;
/// Responses queued per server-streaming call between handler and poster.
const RESPONSE_QUEUE: usize = 8;

impl Session {
    /// The client of a call whose OPEN names connection `slot` and carries
    /// `note` (a slot's address) and `certificates`.
    fn peer_of(
        &self,
        slot: u8,
        note: Option<(u8, std::net::SocketAddr)>,
        certificates: Vec<Bytes>,
    ) -> Option<Arc<Peer>> {
        let known = match note {
            Some((noted, addr)) => {
                let p = Arc::new(Peer { addr: Some(addr), certificates: Vec::new() });
                if noted != 0 {
                    self.peers.lock().unwrap_or_else(|e| e.into_inner())[noted as usize] =
                        Some(p.clone());
                }
                Some(p)
            }
            None if slot != 0 => {
                self.peers.lock().unwrap_or_else(|e| e.into_inner())[slot as usize].clone()
            }
            None => None,
        };
        if certificates.is_empty() {
            return known;
        }
        Some(Arc::new(Peer { addr: known.and_then(|p| p.addr), certificates }))
    }

    /// Starts a call; `now` is the drain loop's pass clock (the call's
    /// deadline counts from it).
    pub(super) fn open(
        self: &Arc<Self>,
        d: Descriptor,
        message: Option<(Message, Bytes)>,
        now: Instant,
    ) {
        let Some(svc) = self.services.get(d.service as usize).cloned() else {
            self.fail(d.call, Status::new(Code::Unimplemented, "no such service here"));
            return;
        };
        // Only the shape is needed (not the names: no allocation per call).
        let Some((client_streaming, server_streaming, output)) = svc
            .schema()
            .method(d.method)
            .map(|m| (m.client_streaming, m.server_streaming, m.output))
        else {
            self.fail(d.call, Status::new(Code::Unimplemented, "no such method here"));
            return;
        };
        let (message, side) = match message {
            Some((m, side)) => (Some(m).filter(|_| d.has(desc::MESSAGE)), side),
            None => (None, Bytes::new()),
        };
        // The client: its connection's address, noted once per slot, and
        // the certificates it presented (with each call).
        let (metadata, peer) = match OpenRepr::parse(&side) {
            Ok(open) => (open.metadata, self.peer_of(d.code, open.peer, open.peer_certificates)),
            Err(e) => {
                self.fail(d.call, e.into());
                return;
            }
        };
        let deadline = seam::deadline(&d, now);
        let (requests, streaming) = if client_streaming {
            let (tx, rx) = mpsc::channel(REQUEST_QUEUE);
            if let Some(m) = message {
                let _ = tx.try_send(m);
            }
            ((!d.has(desc::END)).then_some(tx), Streaming::queue(rx))
        } else {
            match message {
                Some(m) => (None, Streaming::one(m)),
                None => {
                    self.fail(
                        d.call,
                        Status::new(Code::Internal, "a unary call without its request"),
                    );
                    return;
                }
            }
        };
        let request = Request { metadata, deadline, peer, message: streaming };
        let call = d.call;
        // Run to completion where it can: on a single-threaded runtime a
        // unary handler that does not wait (most do not) runs here, in the
        // drain loop, and its answer is posted before the next descriptor
        // is taken: no task, no boxed driver, no abort handle, no entry in
        // the call table (a cancel cannot arrive before it ends). One that
        // waits becomes a task that goes on with the same handler future:
        // the runtime polls it again at once, with a real waker, so the
        // no-op waker of this first poll is never relied on.
        if self.inline && !client_streaming && !server_streaming {
            let (responder, rx) = Responder::for_unary(output);
            let mut slot = UnarySlot::new(rx);
            let mut handler = self.in_region(svc.call(d.method, request, responder));
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            // A task would contain a handler's panic; here it must not
            // unwind through the drain loop: the call fails instead.
            let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                std::pin::Pin::new(&mut handler).poll(&mut cx)
            }));
            match polled {
                Ok(Poll::Ready(outcome)) => {
                    let (early, one) = slot.finish();
                    let item = one.message.filter(|_| outcome.is_ok());
                    let st = match outcome {
                        Ok(trailers) => Status { metadata: trailers, ..Status::ok() },
                        Err(st) => st,
                    };
                    self.finish_unary(call, early, one.headers, item, st);
                }
                Ok(Poll::Pending) => {
                    let rest = self.clone().unary(call, handler, slot, deadline);
                    self.spawn_call(call, None, Box::pin(rest));
                }
                Err(_) => {
                    drop(handler);
                    self.fail(call, Status::new(Code::Internal, "the handler panicked"));
                }
            }
            return;
        }
        let mut driver = Box::pin(self.clone().drive(
            call,
            svc,
            d.method,
            output,
            server_streaming,
            request,
            deadline,
        ));
        // A server-streaming handler that does not wait runs to completion
        // here too (its responses are queued to the poster in the driver).
        if self.inline && !client_streaming {
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                driver.as_mut().poll(&mut cx).is_ready()
            }));
            match polled {
                Ok(true) => return,
                Ok(false) => {}
                Err(_) => {
                    drop(driver);
                    self.fail(call, Status::new(Code::Internal, "the handler panicked"));
                    return;
                }
            }
        }
        self.spawn_call(call, requests, driver);
    }

    /// Runs a call on as a task: entered in the call table (so a cancel or
    /// the engine's going away aborts it) and counted in `tasks`.
    fn spawn_call(
        self: &Arc<Self>,
        call: u64,
        requests: Option<mpsc::Sender<Message>>,
        driver: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    ) {
        let (abort, reg) = AbortHandle::new_pair();
        self.state().session.insert_call(call, CallCtl { abort, requests });
        let s = self.clone();
        self.spawn_counted(async move {
            // Aborted: the engine cancelled the call, or went away; it
            // expects no answer.
            let _ = Abortable::new(driver, reg).await;
            s.state().session.remove_call(call);
        });
    }

    /// Spawns work of this session's calls, counted in `tasks` while it
    /// runs (the drain loop then gives the runtime a turn after every
    /// pass).
    pub(super) fn spawn_counted(self: &Arc<Self>, work: impl Future<Output = ()> + Send + 'static) {
        let task = Running::new(self);
        tokio::spawn(async move {
            let _task = task;
            work.await;
        });
    }

    /// A unary call's handler from its first poll on (`slot` its answer's
    /// slot), until its deadline; then its answer posted.
    async fn unary(
        self: Arc<Self>,
        call: u64,
        handler: InRegion,
        mut slot: UnarySlot,
        deadline: Option<Instant>,
    ) {
        let timed = until_deadline(deadline, handler);
        tokio::pin!(timed);
        // Headers the handler sends explicitly go to the engine at once,
        // in a descriptor of their own.
        let outcome = loop {
            tokio::select! {
                biased;
                r = &mut timed => break r,
                md = slot.early_headers() => {
                    if self.post_item(call, Some(md), None).await.is_err() {
                        return;
                    }
                }
            }
        };
        let (early, one) = slot.finish();
        if let Some(md) = early {
            if self.post_item(call, Some(md), None).await.is_err() {
                return;
            }
        }
        let item = one.message.filter(|_| outcome.is_ok());
        let st = match outcome {
            Ok(trailers) => Status { metadata: trailers, ..Status::ok() },
            Err(st) => st,
        };
        let _ = self.post_final(call, one.headers, item, &st).await;
    }

    /// Runs one call's handler and posts what it sends.
    #[allow(clippy::too_many_arguments)]
    async fn drive(
        self: Arc<Self>,
        call: u64,
        svc: Arc<dyn Service>,
        method: u32,
        output: u32,
        server_streaming: bool,
        request: Request<Streaming>,
        deadline: Option<Instant>,
    ) {
        if !server_streaming {
            let (responder, slot) = Responder::for_unary(output);
            let handler = self.in_region(svc.call(method, request, responder));
            return self.unary(call, handler, UnarySlot::new(slot), deadline).await;
        }
        let (responder, mut outs) = Responder::for_stream(output, RESPONSE_QUEUE);
        let timed = until_deadline(deadline, self.in_region(svc.call(method, request, responder)));
        tokio::pin!(timed);
        let mut headers: Option<Metadata> = None;
        let mut outcome = None;
        let mut open = true;
        while outcome.is_none() || open {
            tokio::select! {
                biased;
                o = outs.recv(), if open => match o {
                    None => open = false,
                    Some(Out::Headers(md)) => {
                        headers = None;
                        if self.post_item(call, Some(md), None).await.is_err() {
                            return;
                        }
                    }
                    Some(Out::Staged(md)) => headers = Some(md),
                    Some(item) => {
                        if self.post_item(call, headers.take(), Some(item)).await.is_err() {
                            return;
                        }
                    }
                },
                r = &mut timed, if outcome.is_none() => outcome = Some(r),
            }
        }
        let st = match outcome {
            Some(Ok(trailers)) => Status { metadata: trailers, ..Status::ok() },
            Some(Err(st)) => st,
            None => Status::new(Code::Internal, "the handler ended without an outcome"),
        };
        let _ = self.post_status(call, headers, &st).await;
    }
}

/// A call running as a task, counted in the session's `tasks` while it
/// lives (see [`Session::spawn_counted`]).
struct Running(Arc<Session>);

impl Running {
    fn new(s: &Arc<Session>) -> Running {
        s.tasks.fetch_add(1, Ordering::Relaxed);
        Running(s.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.tasks.fetch_sub(1, Ordering::Relaxed);
    }
}
