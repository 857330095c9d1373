//! Outbound calls on one attachment: the request posted, the answer
//! completed from the drain loop, a caller that gives up cancelling the
//! engine's call (see `crate::outbound`).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use protoplane_grpc::{Code, Message, Status};
use protoplane_rpc::delegate::DelegatedCall;
use protoplane_rpc::UnaryResponse;
use protoplane_seam::app::Taken;
use protoplane_seam::{OpenRepr, ReplyRepr};
use protoplane_shm::desc::{self, Descriptor};
use protoplane_shm::lease::Holder;
use tokio::sync::oneshot;

use super::post::Posted;
use super::{bad, Session};

/// An outbound call waiting for its answer: where the answer goes, and the
/// response's type.
pub(crate) struct Waiter {
    tx: oneshot::Sender<Result<UnaryResponse, Status>>,
    output: u32,
}

impl Waiter {
    /// The engine went away: the call fails.
    pub(crate) fn gone(self) {
        let _ = self.tx.send(Err(Status::new(Code::Unavailable, "the engine went away")));
    }
}

/// Cancels the engine's call when the caller gives up before its answer.
struct Pending<'a> {
    session: &'a Arc<Session>,
    call: u64,
    armed: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Still waiting (else its answer came meanwhile: nothing to stop).
        if self.session.state().session.remove_outbound(self.call).is_none() {
            return;
        }
        let mut d = Descriptor {
            call: self.call,
            flags: desc::OUTBOUND | desc::CANCEL,
            ..Descriptor::default()
        };
        let s = self.session.clone();
        match s.state().session.hand_over(&mut d, None) {
            Ok(_) => {}
            Err(_) => return,
        }
        if s.responses.push(&d).is_ok() {
            s.ring_engine();
            return;
        }
        // The ring is full: posted as soon as there is room (the engine's
        // call stops at its deadline meanwhile, if it has one).
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                loop {
                    tokio::time::sleep(std::time::Duration::from_micros(100)).await;
                    if s.state().session.is_ended() {
                        return;
                    }
                    if s.responses.push(&d).is_ok() {
                        s.ring_engine();
                        return;
                    }
                }
            });
        }
    }
}

impl Session {
    /// Whether the engine is gone.
    pub(crate) fn is_ended(&self) -> bool {
        self.state().session.is_ended()
    }

    /// One unary call through the engine on channel `index`, whose
    /// response is of type `output`.
    pub(crate) async fn call_out(
        self: &Arc<Self>,
        index: u8,
        output: u32,
        call: &DelegatedCall<'_>,
    ) -> Result<UnaryResponse, Status> {
        let gone = || Status::new(Code::Unavailable, "the engine went away");
        if call.deadline.is_some_and(|d| d <= Instant::now()) {
            return Err(Status::new(Code::DeadlineExceeded, "deadline exceeded"));
        }
        let (tx, rx) = oneshot::channel();
        let id = self.state().session.open_outbound(Waiter { tx, output }).map_err(|_| gone())?;
        let mut pending = Pending { session: self, call: id, armed: true };
        let mut side = Vec::new();
        OpenRepr::emit_parts(None, &call.metadata, &[], &mut side);
        // The clock is read only for a call with a deadline.
        let timeout_ns = match call.deadline {
            Some(_) => protoplane_seam::engine::timeout_ns(call.deadline, Instant::now()),
            None => 0,
        };
        let mut d = Descriptor {
            call: id,
            flags: desc::OUTBOUND | desc::OPEN | desc::MESSAGE | desc::END,
            service: index,
            method: call.method,
            timeout_ns,
            ..Descriptor::default()
        };
        // Copied into a fresh chunk: the caller keeps its block.
        let held = match self.copy(&mut d, call.request.as_bytes(), &[], &side).await {
            Ok(Posted::Copied(chunk, held)) => Some((chunk, held)),
            Ok(Posted::Nothing) => None,
            Ok(Posted::TooLarge(n)) => {
                pending.armed = false;
                self.state().session.remove_outbound(id);
                return Err(Status::new(
                    Code::ResourceExhausted,
                    format!("a request of {n} bytes exceeds the region's largest chunk"),
                ));
            }
            Err(()) => return Err(gone()),
        };
        self.push(d, held).await.map_err(|()| gone())?;
        let answer = match call.deadline {
            Some(at) => match tokio::time::timeout_at(at.into(), rx).await {
                Ok(a) => a,
                Err(_) => return Err(Status::new(Code::DeadlineExceeded, "deadline exceeded")),
            },
            None => rx.await,
        };
        pending.armed = false;
        answer.unwrap_or_else(|_| Err(gone()))
    }

    /// The answer to an outbound call (from the drain loop): its bytes
    /// copied out of the engine's chunk, which goes back at once.
    pub(super) fn complete_outbound(self: &Arc<Self>, d: &Descriptor) {
        let waiter = self.state().session.remove_outbound(d.call);
        // Taken (and given back) even for a call nobody waits for: the
        // chunk must go back.
        let r = self.answer_of(d, waiter.as_ref().map_or(u32::MAX, |w| w.output));
        if let Some(w) = waiter {
            let _ = w.tx.send(r);
        }
    }

    fn answer_of(self: &Arc<Self>, d: &Descriptor, output: u32) -> Result<UnaryResponse, Status> {
        let taken = self.state().session.take_message(d).map_err(bad)?;
        let (block, wire, side) = match taken {
            None => (Bytes::new(), Bytes::new(), Bytes::new()),
            Some(Taken { chunk, landing }) => {
                // One copy of the three, out of the engine's chunks, which
                // go back at once (the caller may keep the response as
                // long as it likes). Every range was checked inside its
                // chunk by the session.
                let spans = [d.block, d.wire, d.side];
                let mut v = Vec::with_capacity(spans.iter().map(|s| s.len as usize).sum());
                let read = spans.iter().all(|s| {
                    s.len == 0 || self.map.append_to(s.offset as usize, s.len as usize, &mut v)
                });
                for c in std::iter::once(chunk).chain(landing) {
                    Holder::give_back(&**self, c);
                }
                if !read {
                    return Err(Status::new(
                        Code::Internal,
                        "engine descriptor: a range outside the region",
                    ));
                }
                let all = Bytes::from(v);
                let (bl, wl) = (d.block.len as usize, d.wire.len as usize);
                (all.slice(..bl), all.slice(bl..bl + wl), all.slice(bl + wl..))
            }
        };
        let reply = ReplyRepr::parse(&side, d.has(desc::STATUS)).map_err(Status::from)?;
        let status = match reply.status {
            Some(st) => st,
            None => Status::new(Code::from_u32(d.code as u32), ""),
        };
        if status.code != Code::Ok || d.code != 0 {
            let code =
                if status.code == Code::Ok { Code::from_u32(d.code as u32) } else { status.code };
            return Err(Status { code, ..status });
        }
        if !d.has(desc::MESSAGE) {
            return Err(Status::new(Code::Internal, "the engine answered with no response"));
        }
        let mut message = Message::from_parts(block, wire, output);
        message.set_compressed(d.has(desc::COMPRESS));
        Ok(UnaryResponse {
            headers: reply.headers.unwrap_or_default(),
            message,
            trailers: status.metadata,
        })
    }
}
