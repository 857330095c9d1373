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
//! [`Drain::finished`] resolves when no listener is open and no connection
//! is left: from then on the address can be bound again (a new server
//! taking over) and nothing of the old one answers. How long to
//! wait for it is the caller's choice: a server that must stop by a
//! deadline stops waiting then, and whatever it drops is cancelled the way
//! a closed connection cancels it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

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
    /// Accept loops whose listener is still open.
    listeners: AtomicUsize,
    /// Woken when the last connection or listener closes.
    idle: Notify,
    /// Run once when draining starts (health turning NOT_SERVING).
    hooks: Hooks,
}

/// What runs when draining starts.
#[derive(Default)]
struct Hooks(Mutex<Vec<Box<dyn FnOnce() + Send>>>);

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().map(|v| v.len()).unwrap_or(0);
        write!(f, "Hooks({n})")
    }
}

impl Drain {
    /// Starts draining (once; later calls do nothing).
    pub fn start(&self) {
        if !self.0.started.swap(true, Ordering::SeqCst) {
            let hooks =
                std::mem::take(&mut *self.0.hooks.0.lock().unwrap_or_else(|e| e.into_inner()));
            for h in hooks {
                h();
            }
            self.0.start.notify_waiters();
            self.0.idle.notify_waiters();
        }
    }

    /// Runs `f` when draining starts (at once if it has): how a server's
    /// health service turns NOT_SERVING, so that load balancers and
    /// health-checking clients move away before the listener closes.
    pub fn on_start(&self, f: impl FnOnce() + Send + 'static) {
        let mut hooks = self.0.hooks.0.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_draining() {
            drop(hooks);
            f();
        } else {
            hooks.push(Box::new(f));
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

    /// Resolves once draining has started, every listener of the router
    /// is closed and no connection is left.
    pub async fn finished(&self) {
        loop {
            let woken = self.0.idle.notified();
            if self.is_draining()
                && self.connections() == 0
                && self.0.listeners.load(Ordering::SeqCst) == 0
            {
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

impl Drain {
    /// Holds `listener` for an accept loop: the drain is not finished
    /// until the returned value (and so the listener) is dropped.
    pub(crate) fn listening<L>(&self, listener: L) -> Listening<L> {
        self.0.listeners.fetch_add(1, Ordering::SeqCst);
        Listening { listener, _counted: Counted(self.clone()) }
    }
}

/// A listener an accept loop owns (see [`Drain::listening`]). Its fields
/// drop in order: the socket closes before the count goes down, so a
/// finished drain never sees a listener still open.
pub(crate) struct Listening<L> {
    listener: L,
    _counted: Counted,
}

impl<L> std::ops::Deref for Listening<L> {
    type Target = L;
    fn deref(&self) -> &L {
        &self.listener
    }
}

struct Counted(Drain);

impl Drop for Counted {
    fn drop(&mut self) {
        if self.0 .0.listeners.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0 .0.idle.notify_waiters();
        }
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
    async fn finished_waits_for_the_listeners_to_close() {
        let d = Drain::default();
        let sock = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = sock.local_addr().expect("addr");
        let held = d.listening(sock);
        let finished = tokio::spawn({
            let d = d.clone();
            async move { d.finished().await }
        });
        d.start();
        tokio::task::yield_now().await;
        assert!(!finished.is_finished(), "a listener is still open");
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), finished).await.expect("finished").expect("");
        assert!(std::net::TcpStream::connect(addr).is_err(), "closed before the count went down");
    }

    #[tokio::test]
    async fn a_drain_without_connections_is_finished_at_once() {
        let d = Drain::default();
        d.start();
        d.start();
        tokio::time::timeout(Duration::from_secs(5), d.finished()).await.expect("finished");
    }
}
