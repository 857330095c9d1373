//! Graceful shutdown: a router stops taking connections and calls, lets
//! the calls in flight finish, and says when the last connection closed.
//!
//! [`Drain::start`] is the signal. From then on:
//!
//! - every accept loop of the router ([`Router::serve`](crate::Router::serve),
//!   `serve_tls`, the lean transport's) returns, dropping its listener, so
//!   new connections are refused by the kernel;
//! - each HTTP/2 connection sends GOAWAY with NO_ERROR and the last stream
//!   it took (RFC 9113 §6.8: a graceful shutdown; streams already open go
//!   on, a client opens no new one there and retries a refused one
//!   elsewhere), then closes once its last call ended;
//! - each lean connection closes the first time it has no call in flight
//!   (the lean frame has no GOAWAY: a client sees the connection close
//!   between calls and reconnects, and a call it had started is answered
//!   first).
//!
//! [`Drain::finished`] resolves when no connection is left. How long to
//! wait for it is the caller's choice: a server that must stop by a
//! deadline stops waiting then, and whatever it drops is cancelled the way
//! a closed connection cancels it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// The shutdown state a router and all its connections share.
#[derive(Clone, Debug, Default)]
pub struct Drain(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    started: AtomicBool,
    /// Woken when draining starts.
    start: Notify,
    /// Connections being served.
    connections: AtomicUsize,
    /// Woken when the last connection closes.
    idle: Notify,
}

impl Drain {
    /// Starts draining (once; later calls do nothing).
    pub fn start(&self) {
        if !self.0.started.swap(true, Ordering::SeqCst) {
            self.0.start.notify_waiters();
            self.0.idle.notify_waiters();
        }
    }

    /// Whether draining has started.
    pub fn is_draining(&self) -> bool {
        self.0.started.load(Ordering::SeqCst)
    }

    /// Resolves once draining starts.
    pub async fn started(&self) {
        loop {
            let woken = self.0.start.notified();
            if self.is_draining() {
                return;
            }
            woken.await;
        }
    }

    /// [`Drain::started`] as a boxed future a poll loop can keep.
    pub(crate) fn started_boxed(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let d = self.clone();
        Box::pin(async move { d.started().await })
    }

    /// Connections being served now.
    pub fn connections(&self) -> usize {
        self.0.connections.load(Ordering::SeqCst)
    }

    /// Resolves once draining has started and no connection is left.
    pub async fn finished(&self) {
        loop {
            let woken = self.0.idle.notified();
            if self.is_draining() && self.connections() == 0 {
                return;
            }
            woken.await;
        }
    }

    /// Counts a connection until the guard drops.
    pub(crate) fn connection(&self) -> Connection {
        self.0.connections.fetch_add(1, Ordering::SeqCst);
        Connection(self.clone())
    }
}

/// One connection being served (see [`Drain::connection`]).
#[derive(Debug)]
pub(crate) struct Connection(Drain);

impl Drop for Connection {
    fn drop(&mut self) {
        if self.0 .0.connections.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0 .0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn finished_waits_for_the_start_and_the_last_connection() {
        let d = Drain::default();
        let a = d.connection();
        let b = d.connection();
        let finished = tokio::spawn({
            let d = d.clone();
            async move { d.finished().await }
        });
        let started = tokio::spawn({
            let d = d.clone();
            async move { d.started().await }
        });
        drop(a);
        tokio::task::yield_now().await;
        assert!(!finished.is_finished() && !started.is_finished());
        d.start();
        tokio::time::timeout(Duration::from_secs(5), started).await.expect("started").expect("");
        tokio::task::yield_now().await;
        assert!(!finished.is_finished(), "one connection is left");
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), finished).await.expect("finished").expect("");
        assert_eq!(d.connections(), 0);
    }

    #[tokio::test]
    async fn a_drain_without_connections_is_finished_at_once() {
        let d = Drain::default();
        d.start();
        d.start();
        tokio::time::timeout(Duration::from_secs(5), d.finished()).await.expect("finished");
    }
}
