//! This side's half as memory to lend: the free list behind the chunks a
//! response is copied into ([`Pool`]), and the chunks handlers' builders
//! lay their blocks out in ([`Responses`], lent while a handler is polled
//! by [`InRegion`]), so a response is posted where it was built.

use std::sync::Arc;

use protoplane_grpc::{BoxFuture, Metadata, Status};
use protoplane_shm::layout::Chunk;
use protoplane_shm::lease::{self, Pool};
use protoplane_shm::Mapping;
use protoplane_wire::{with_source, BlockSource, Lent};

use super::Session;

impl Session {
    /// A handler's future, polled with this side's chunks lending the
    /// memory of the blocks it builds: responses are laid out in place.
    pub(super) fn in_region(&self, fut: BoxFuture<'static, Result<Metadata, Status>>) -> InRegion {
        InRegion { fut, source: self.source.clone() }
    }
}

impl Pool for Session {
    fn map(&self) -> &Arc<Mapping> {
        &self.map
    }

    fn alloc(&self, need: usize) -> Option<Chunk> {
        let mut st = self.state();
        if st.session.is_ended() {
            return None;
        }
        st.chunks.alloc(need)
    }

    fn free(&self, chunk: Chunk) {
        let _ = self.state().chunks.free(chunk.offset);
        self.room.notify_waiters();
    }
}

/// Where a split application's handlers build their responses: chunks of
/// its half of the region, lent to the builders (see `wire::with_source`).
/// (Weak: the session holds it.)
pub(super) struct Responses(pub(super) std::sync::Weak<Session>);

impl BlockSource for Responses {
    fn lend(&self) -> Option<Lent> {
        // The smallest chunk first; a block that outgrows it moves to a
        // bigger one (as a `Vec` would reallocate).
        lease::lend(&self.0.upgrade()?, 1, true)
    }
}

/// A handler's future, polled with its application's region lending the
/// memory of every block it builds.
pub(super) struct InRegion {
    fut: BoxFuture<'static, Result<Metadata, Status>>,
    source: Arc<dyn BlockSource>,
}

impl std::future::Future for InRegion {
    type Output = Result<Metadata, Status>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let source = self.source.clone();
        with_source(source, || self.fut.as_mut().poll(cx))
    }
}
