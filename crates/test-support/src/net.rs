//! Servers on loopback ports, and bounded waits.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use protoplane_rpc::Router;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The bound on any single wait in a test.
pub const BOUND: Duration = Duration::from_secs(20);

/// A server running on a loopback port until dropped.
#[derive(Debug)]
pub struct Served {
    /// Where it listens.
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Served {
    /// `http://addr`, for `Channel::connect`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A loopback listener on a port the kernel picks.
pub async fn loopback() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port")
}

/// Serves `router` over gRPC on a loopback port.
pub async fn serve_grpc(router: Arc<Router>) -> Served {
    let listener = loopback().await;
    let addr = listener.local_addr().expect("local address");
    let task = tokio::spawn(async move {
        let _ = router.serve(listener).await;
    });
    Served { addr, task }
}

/// Serves `router` over the lean transport on a loopback port.
pub async fn serve_lean(router: Arc<Router>) -> Served {
    let listener = loopback().await;
    let addr = listener.local_addr().expect("local address");
    let task = tokio::spawn(async move {
        let _ = protoplane_rpc::lean::server::serve_tcp(router, listener).await;
    });
    Served { addr, task }
}

/// `fut`'s output, or a panic naming `what` once [`BOUND`] passes.
pub async fn bounded<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(BOUND, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: not done within {BOUND:?}"),
    }
}

/// Waits until `f` holds (polled every millisecond), or panics naming
/// `what` once [`BOUND`] passes.
pub async fn eventually(what: &str, f: impl Fn() -> bool) {
    bounded(what, async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
}
