//! Starting calls and running their handlers: the service and method a
//! call's OPEN names, its side sections (metadata, timeout, the client's
//! verified certificates), its requests (one, or a queue a client-streaming
//! call's further requests go to), and the handler run to completion in
//! the drain loop where it can, as a task where it waits. What a handler
//! sends is posted as it comes ([`super::post`]).

use std::sync::Arc;
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

    /// Starts a call.
    pub(super) fn open(self: &Arc<Self>, d: Descriptor, message: Option<(Message, Bytes)>) {
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
        let deadline = seam::deadline(&d, Instant::now());
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
        let mut driver = Box::pin(self.clone().drive(
            call,
            svc,
            d.method,
            output,
            server_streaming,
            request,
            deadline,
        ));
        // Run to completion where it can: on a single-threaded runtime a
        // handler that does not wait (most unary ones) runs here, in the
        // drain loop, and posts its answer before the next descriptor is
        // taken — no task, no abort handle, no entry in the call table (a
        // cancel cannot arrive before it ends). One that waits becomes a
        // task: the runtime polls it again at once, with a real waker, so
        // the no-op waker of this first poll is never relied on.
        if self.inline && !client_streaming {
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            // A task would contain a handler's panic; here it must not
            // unwind through the drain loop: the call fails instead.
            let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                std::future::Future::poll(driver.as_mut(), &mut cx).is_ready()
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
        let (abort, reg) = AbortHandle::new_pair();
        self.state().session.insert_call(call, CallCtl { abort, requests });
        let s = self.clone();
        tokio::spawn(async move {
            // Aborted: the engine cancelled the call, or went away; it
            // expects no answer.
            let _ = Abortable::new(driver, reg).await;
            s.state().session.remove_call(call);
        });
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
            let mut slot = UnarySlot::new(slot);
            let handler = self.in_region(svc.call(method, request, responder));
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
            return;
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
