//! Worker threads that each own a share of the connections: a server
//! sharded by connection.
//!
//! A multi-threaded runtime moves tasks between its threads as it steals
//! work, so a connection's calls touch every thread's caches and every
//! shared structure a call reaches is contended. Sharding by connection is
//! the other discipline (Seastar's and eRPC's): each worker is a
//! single-threaded runtime on a thread of its own, the accept loop hands
//! every accepted connection to one worker for its whole life, and
//! whatever a worker's calls touch can be kept per worker (the split
//! engine keeps one set of rings per worker to each application: see
//! [`current`]).
//!
//! A connection goes to the worker with the fewest open connections (the
//! lowest index on a tie). Accepting stays where the listener is; only the
//! accepted socket crosses, once, as a plain file descriptor, and is
//! registered with the worker's own reactor.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

thread_local! {
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The index of the worker the calling thread is, if it is one.
pub fn current() -> Option<usize> {
    CURRENT.with(Cell::get)
}

/// A set of worker threads, each running a single-threaded runtime.
/// Dropping it stops them (the tasks they run are dropped).
pub struct Shards {
    workers: Vec<Worker>,
}

struct Worker {
    handle: tokio::runtime::Handle,
    /// Connections it serves now.
    open: Arc<AtomicUsize>,
    /// Dropped to stop it.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards").field("workers", &self.workers.len()).finish()
    }
}

/// Runs on each worker's thread before its runtime starts (the engine pins
/// the thread to its core there).
pub type OnStart = Arc<dyn Fn(usize) + Send + Sync>;

impl Shards {
    /// Starts `n` workers (at least one), named `{name}-{i}`.
    pub fn start(n: usize, name: &str, on_start: Option<OnStart>) -> std::io::Result<Arc<Shards>> {
        let mut workers = Vec::with_capacity(n.max(1));
        for i in 0..n.max(1) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let handle = rt.handle().clone();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let hook = on_start.clone();
            let thread =
                std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || {
                    CURRENT.with(|c| c.set(Some(i)));
                    if let Some(h) = hook {
                        h(i);
                    }
                    // Serves every task spawned on its handle until stopped.
                    let _ = rt.block_on(stopped);
                })?;
            workers.push(Worker {
                handle,
                open: Arc::default(),
                stop: Some(stop),
                thread: Some(thread),
            });
        }
        Ok(Arc::new(Shards { workers }))
    }

    /// How many workers.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Never: there is always at least one worker.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Runs `fut` on worker `i` (modulo the number of workers).
    pub fn spawn_on<F>(&self, i: usize, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.workers[i % self.workers.len()].handle.spawn(fut)
    }

    /// The worker with the fewest open connections.
    fn least_busy(&self) -> usize {
        (0..self.workers.len())
            .min_by_key(|&i| self.workers[i].open.load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    /// Serves one connection on the least busy worker: `serve` gets the
    /// socket registered with that worker's reactor. A socket that cannot
    /// be registered there is closed (logged).
    pub fn connection<S, F, Fut>(&self, sock: S, serve: F)
    where
        S: Movable,
        F: FnOnce(S) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let i = self.least_busy();
        let open = self.workers[i].open.clone();
        let fd = match sock.release() {
            Ok(fd) => fd,
            Err(e) => {
                tracing::warn!("cannot hand a connection to a worker: {e}");
                return;
            }
        };
        open.fetch_add(1, Ordering::Relaxed);
        self.workers[i].handle.spawn(async move {
            struct Open(Arc<AtomicUsize>);
            impl Drop for Open {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::Relaxed);
                }
            }
            let _open = Open(open);
            match S::adopt(fd) {
                Ok(sock) => serve(sock).await,
                Err(e) => tracing::warn!("a worker cannot take a connection: {e}"),
            }
        });
    }

    /// Connections each worker serves now.
    pub fn open(&self) -> Vec<usize> {
        self.workers.iter().map(|w| w.open.load(Ordering::Relaxed)).collect()
    }
}

impl Drop for Shards {
    fn drop(&mut self) {
        for w in &mut self.workers {
            drop(w.stop.take());
        }
        let me = std::thread::current().id();
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                // A worker dropping the last reference cannot join itself.
                if t.thread().id() != me {
                    let _ = t.join();
                }
            }
        }
    }
}

/// A socket that can leave one runtime's reactor and join another's.
pub trait Movable: Sized + Send + 'static {
    /// The plain socket, no longer registered (non-blocking).
    type Plain: Send + 'static;
    /// Leaves the current reactor.
    fn release(self) -> std::io::Result<Self::Plain>;
    /// Joins the current runtime's reactor.
    fn adopt(plain: Self::Plain) -> std::io::Result<Self>;
}

impl Movable for tokio::net::TcpStream {
    type Plain = std::net::TcpStream;
    fn release(self) -> std::io::Result<std::net::TcpStream> {
        self.into_std()
    }
    fn adopt(plain: std::net::TcpStream) -> std::io::Result<Self> {
        tokio::net::TcpStream::from_std(plain)
    }
}

impl Movable for tokio::net::UnixStream {
    type Plain = std::os::unix::net::UnixStream;
    fn release(self) -> std::io::Result<std::os::unix::net::UnixStream> {
        self.into_std()
    }
    fn adopt(plain: std::os::unix::net::UnixStream) -> std::io::Result<Self> {
        tokio::net::UnixStream::from_std(plain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_spread_over_the_workers_and_run_on_them() {
        let shards = Shards::start(2, "test-shard", None).expect("workers");
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = l.local_addr().expect("address");
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let mut clients = Vec::new();
            let mut seen = Vec::new();
            for _ in 0..4 {
                clients.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
                let (sock, _) = l.accept().await.expect("accept");
                let tx = tx.clone();
                shards.connection(sock, move |mut sock| async move {
                    use tokio::io::AsyncReadExt;
                    let _ = tx.send(current());
                    // Open until the client closes.
                    let mut b = [0u8; 1];
                    let _ = sock.read(&mut b).await;
                });
                seen.push(rx.recv().await.expect("a worker said"));
            }
            // Two per worker, each served on a worker's thread, each to
            // the one with fewer open.
            assert_eq!(seen, vec![Some(0), Some(1), Some(0), Some(1)]);
            assert_eq!(shards.open(), vec![2, 2]);
            drop(clients);
            for _ in 0..200 {
                if shards.open() == vec![0, 0] {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            assert_eq!(shards.open(), vec![0, 0]);
        });
        assert_eq!(current(), None);
    }

    #[test]
    fn a_task_on_a_worker_knows_which() {
        let shards = Shards::start(3, "test-shard", None).expect("workers");
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let seen: Vec<_> = (0..3)
            .map(|i| rt.block_on(shards.spawn_on(i, async { current() })).expect("ran"))
            .collect();
        assert_eq!(seen, vec![Some(0), Some(1), Some(2)]);
    }
}
