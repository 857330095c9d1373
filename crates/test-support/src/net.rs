//! Servers on loopback ports, and bounded waits.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use protoplane_rpc::Router;
use tokio::net::TcpListener;

/// A loopback listener on a port the kernel picks.
pub async fn loopback() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port")
}

/// Serves `router` over gRPC on a loopback port, for as long as the
/// runtime runs; where it listens.
pub async fn serve_grpc(router: Arc<Router>) -> SocketAddr {
    let listener = loopback().await;
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(router.serve(listener));
    addr
}

/// Serves `router` over the lean transport on a loopback port, for as long
/// as the runtime runs; where it listens.
pub async fn serve_lean(router: Arc<Router>) -> SocketAddr {
    let listener = loopback().await;
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(protoplane_rpc::lean::server::serve_tcp(router, listener));
    addr
}

/// `fut`'s output, or a panic naming `what` once `within` passes.
pub async fn bounded<T>(within: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(within, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: over {within:?}"),
    }
}

/// Waits until `f` holds (polled every 2 ms), failing once `within`
/// passes.
pub async fn eventually(within: Duration, what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < within, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Asserts that `f` holds for the whole of `window` (polled every 2 ms),
/// failing as soon as it does not: how a test shows that something does
/// *not* happen (a stalled handler produces no more, a flood stays
/// bounded). The window is an observation period, never a wait for an
/// event; waiting is [`eventually`]'s.
pub async fn holds_for(window: Duration, what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    loop {
        assert!(f(), "no longer true after {:?}: {what}", start.elapsed());
        if start.elapsed() >= window {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
