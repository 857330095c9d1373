//! A call's events from the application, in order, from the attachment's
//! drain loop to the call's proxy: a small locked queue per call, closed
//! when the call leaves the attachment's table and its last events are
//! in.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use protoplane_grpc::{Metadata, Status};
use tokio::sync::Notify;

/// What the application sent for one call, as the call's proxy takes it.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// Initial metadata the application sent explicitly, or ahead of a
    /// message: the response headers leave now.
    Headers(Metadata),
    /// Initial metadata that came with the call's end and no message: it
    /// goes in a trailers-only response.
    Staged(Metadata),
    /// A response: a linearized block (or, `encoded`, message bytes) read
    /// in place in the region, and whether to compress it.
    Message { bytes: Bytes, encoded: bool, compress: bool },
    /// The call's end.
    Status(Status),
}

/// One call's events from the application, in order, for its proxy. A
/// unary call carries two or three, so this is a small locked queue (its
/// first push makes room for four) rather than a channel, whose first block
/// has room for 32 events: 2 KiB per call, off the allocator's fast path,
/// which showed in the engine's profile.
#[derive(Debug, Default)]
pub(super) struct Events {
    queue: Mutex<(VecDeque<Inbound>, bool)>,
    ready: Notify,
}

impl Events {
    fn lock(&self) -> MutexGuard<'_, (VecDeque<Inbound>, bool)> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `ev`; `false` (and nothing queued) when `max` events wait
    /// already (the application outruns the call's client).
    pub(super) fn push(&self, ev: Inbound, max: usize) -> bool {
        let mut q = self.lock();
        if q.0.len() >= max {
            return false;
        }
        q.0.push_back(ev);
        drop(q);
        // One proxy waits; `notify_one` keeps a permit if it is not waiting
        // yet, so a push between its check and its wait is not lost.
        self.ready.notify_one();
        true
    }
}

/// The attachment's end of a call's events; dropping it (the call left the
/// attachment's table) closes the queue once the events in it are taken.
#[derive(Debug)]
pub(crate) struct EventTx(pub(super) Arc<Events>);

impl Drop for EventTx {
    fn drop(&mut self) {
        self.0.lock().1 = true;
        self.0.ready.notify_one();
    }
}

/// The proxy's end of a call's events.
#[derive(Debug)]
pub(crate) struct EventRx(Arc<Events>);

impl EventRx {
    /// The next event; `None` once the queue is closed and empty.
    pub(crate) async fn recv(&mut self) -> Option<Inbound> {
        loop {
            match self.try_recv() {
                Ok(ev) => return Some(ev),
                Err(true) => return None,
                Err(false) => self.0.ready.notified().await,
            }
        }
    }

    /// The next event if there is one; `Err(closed)` if not.
    pub(crate) fn try_recv(&mut self) -> Result<Inbound, bool> {
        let mut q = self.0.lock();
        match q.0.pop_front() {
            Some(ev) => Ok(ev),
            None => Err(q.1),
        }
    }
}

/// A call's queue: the attachment's end and the proxy's.
pub(super) fn events() -> (EventTx, EventRx) {
    let e = Arc::new(Events::default());
    (EventTx(e.clone()), EventRx(e))
}
