//! What the engine's integration tests share: hand-written wire bytes
//! (from protoplane-test-support), a unary gRPC call with bounded waits,
//! the runtime they run on.

// Each test binary uses part of it.
#![allow(dead_code, unused_imports)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use protoplane_grpc::{Schema, Status};
use protoplane_rpc::{CallOptions, Channel};
use tokio::time::timeout;

/// A bound on every wait, so a broken engine fails a test instead of
/// hanging it (never a timing assertion).
pub(crate) const BOUND: Duration = Duration::from_secs(20);

pub(crate) use protoplane_test_support::wire::{len_field, varint};

/// One unary call: its status and response.
pub(crate) async fn unary(ch: &Channel, path: &str, req: &[u8]) -> (Status, Option<Vec<u8>>) {
    let opts = CallOptions { timeout: Some(BOUND), ..CallOptions::default() };
    let mut c = timeout(BOUND, ch.start(path, opts)).await.expect("in time").expect("start");
    c.send(req).await.expect("send");
    c.close_send();
    let mut got = None;
    while let Ok(Some(b)) = timeout(BOUND, c.recv()).await.expect("in time") {
        got = Some(b.to_vec());
    }
    (timeout(BOUND, c.finish_status()).await.expect("in time"), got)
}

/// A two-worker runtime with every driver.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A schema of the repository's `protos/` (`rel`: the file under it).
pub(crate) fn repo_schema(rel: &str) -> Arc<Schema> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../protos");
    let schema = Schema::from_proto_files(&[root.join(rel)], &[root]);
    Arc::new(schema.unwrap_or_else(|e| panic!("{rel}: {e}")))
}

/// The social-network schema.
pub(crate) fn social_schema() -> Arc<Schema> {
    repo_schema("socialnetwork/social_network.proto")
}
