//! Channels whose calls are routed: each call picks, by its method and
//! metadata, the channel it goes on (a cluster's) and settings of its own
//! (a timeout, a retry policy). This is how `xds:///` targets work: the
//! `protoplane-xds` crate registers a [`RouterFactory`] for the scheme, and
//! [`Channel::lazy`](crate::Channel::lazy) or `connect` with such a target
//! makes a channel whose calls go through it. The call itself is the same
//! as on any channel: interceptors, metrics and retries apply.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use protoplane_grpc::metadata::Metadata;
use protoplane_grpc::status::Status;
use protoplane_grpc::BoxFuture;

use crate::balance::Connectivity;
use crate::client::{Channel, ChannelOptions};
use crate::config::MethodConfig;

/// Where one call goes.
#[derive(Debug)]
pub struct Routed {
    /// The channel the call starts on.
    pub channel: Channel,
    /// The route's settings: a timeout (the shorter of it and the call's
    /// own wins), a retry policy.
    pub method: MethodConfig,
}

/// Picks the channel of each call.
pub trait CallRouter: Send + Sync + 'static {
    /// The channel and settings for a call of `path` with `metadata`;
    /// may wait (for the first configuration) until `deadline`, and fails
    /// at once when nothing is known unless `wait_for_ready`.
    fn route<'a>(
        &'a self,
        path: &'a str,
        metadata: &'a Metadata,
        wait_for_ready: bool,
        deadline: Option<Instant>,
    ) -> BoxFuture<'a, Result<Routed, Status>>;

    /// The state of the channel as a whole.
    fn connectivity(&self) -> Connectivity;
}

impl std::fmt::Debug for dyn CallRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallRouter")
    }
}

/// Makes the router of a target (`xds:///name`) with the channel's options.
pub type RouterFactory = fn(&str, &ChannelOptions) -> Result<Arc<dyn CallRouter>, Status>;

fn schemes() -> &'static Mutex<HashMap<String, RouterFactory>> {
    static SCHEMES: OnceLock<Mutex<HashMap<String, RouterFactory>>> = OnceLock::new();
    SCHEMES.get_or_init(Mutex::default)
}

/// Registers `factory` for targets `scheme:...` (once per process, as
/// grpc-go's resolvers register; a later registration replaces it).
pub fn register_scheme(scheme: &str, factory: RouterFactory) {
    let mut m = schemes().lock().unwrap_or_else(|e| e.into_inner());
    m.insert(scheme.to_ascii_lowercase(), factory);
}

/// The registered factory for `target`'s scheme, if any.
pub(crate) fn factory_for(target: &str) -> Option<RouterFactory> {
    let (scheme, _) = target.split_once(':')?;
    let m = schemes().lock().unwrap_or_else(|e| e.into_inner());
    m.get(&scheme.to_ascii_lowercase()).copied()
}
