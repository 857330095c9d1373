//! Outbound calls: the calls attached applications make to other services,
//! run by the engine (mRPC and Snap run both directions in the service).
//!
//! An application declares its channels when it attaches (a target and
//! the service it calls there, whose schema travels with the HELLO like a
//! served service's), and the engine checks each target against
//! `[outbound] allow`. Every channel to one target is one
//! [`Channel`] of the engine's, shared by all applications: one set of
//! connections, one balancer, one resolver (DNS, `ipv4:`, `unix:`,
//! `xds:///` with its control plane), one retry throttle.
//!
//! A call crosses the seam as one descriptor each way (see
//! `protoplane_shm::desc::OUTBOUND`): the application's request block (or
//! already encoded bytes), which the engine copies out of the
//! application's half, encodes with the channel's schema and sends; and
//! the answer, the response decoded by the engine into a chunk of its half
//! (view mode, as a request is) with the headers, the status and the
//! trailers beside it. A CANCEL from the application (its caller gave up,
//! its deadline passed) drops the call's task, which resets the stream.
//!
//! ```toml
//! [outbound]
//! allow = ["dns:///*", "127.0.0.1:*"]  # targets applications may call (default: any)
//! lb = "round_robin"                   # pick_first (default), round_robin, weighted_round_robin
//! service_config = "service-config.json"  # retries, timeouts per method (gRFC A6)
//! max_calls = 4096                     # outbound calls open per application (more: RESOURCE_EXHAUSTED)
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use protoplane_grpc::{Code, Metadata, Schema, Status};
use protoplane_rpc::config::ServiceConfig;
use protoplane_rpc::{CallOptions, Channel, ChannelOptions, LbPolicy};

/// What the engine lets applications call, and how.
#[derive(Clone, Debug)]
pub struct OutboundOptions {
    /// Target patterns applications may call: a pattern matches a target
    /// equal to it, or starting with what precedes its final `*`. Empty:
    /// any target.
    pub allow: Vec<String>,
    /// The load-balancing policy of every outbound channel (a service
    /// config's `loadBalancingConfig` wins).
    pub lb: LbPolicy,
    /// The service config of every outbound channel (JSON file).
    pub service_config: Option<PathBuf>,
}

impl Default for OutboundOptions {
    fn default() -> Self {
        OutboundOptions { allow: Vec::new(), lb: LbPolicy::PickFirst, service_config: None }
    }
}

impl OutboundOptions {
    /// Whether applications may call `target`.
    pub fn allows(&self, target: &str) -> bool {
        self.allow.is_empty()
            || self.allow.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => target.starts_with(prefix),
                None => target == p,
            })
    }
}

/// The engine's outbound channels, one per target, shared by every
/// application.
#[derive(Debug)]
pub(crate) struct Channels {
    opts: OutboundOptions,
    service_config: Option<Arc<ServiceConfig>>,
    by_target: Mutex<HashMap<String, Channel>>,
}

impl Channels {
    /// Channels made with `opts` (its service config read now).
    pub(crate) fn new(opts: OutboundOptions) -> Result<Channels, String> {
        let service_config = match &opts.service_config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| format!("outbound.service_config {}: {e}", p.display()))?;
                let sc = ServiceConfig::from_json(&text).map_err(|st| {
                    format!("outbound.service_config {}: {}", p.display(), st.message)
                })?;
                Some(Arc::new(sc))
            }
            None => None,
        };
        Ok(Channels { opts, service_config, by_target: Mutex::default() })
    }

    /// The channel to `target` (made at its first use; it connects at its
    /// first call), if applications may call it.
    pub(crate) fn channel(&self, target: &str) -> Result<Channel, String> {
        if !self.opts.allows(target) {
            return Err(format!(
                "outbound calls to {target} are not allowed here (outbound.allow: {:?})",
                self.opts.allow
            ));
        }
        let mut m = self.by_target.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ch) = m.get(target) {
            return Ok(ch.clone());
        }
        let opts = ChannelOptions {
            lb: self.opts.lb,
            service_config: self.service_config.clone(),
            ..ChannelOptions::default()
        };
        // Checked first, so a bad target refuses the attach with its
        // reason rather than failing every call.
        protoplane_rpc::resolve::check(target).map_err(|st| st.message)?;
        let ch = Channel::lazy(target, opts);
        m.insert(target.to_string(), ch.clone());
        Ok(ch)
    }
}

/// One channel an application declared.
#[derive(Clone, Debug)]
pub struct OutChannel {
    /// Where its calls go.
    pub channel: Channel,
    /// The schema its methods are ids of.
    pub schema: Arc<Schema>,
    /// The service it calls (its methods' paths start `/service/`).
    pub service: String,
    /// The target, as declared.
    pub target: String,
}

/// What one outbound call came back with.
pub(crate) struct Answer {
    /// The response headers (initial metadata).
    pub headers: Metadata,
    /// The response, encoded.
    pub message: Bytes,
    /// The trailers.
    pub trailers: Metadata,
}

/// Makes one unary call on `channel`.
pub(crate) async fn unary(
    channel: Channel,
    path: String,
    opts: CallOptions,
    request: Bytes,
) -> Result<Answer, Status> {
    let mut call = channel.start(&path, opts).await?;
    call.send_last(&request).await?;
    let message = call.recv().await?.ok_or_else(|| {
        Status::new(Code::Unimplemented, "the server ended a unary call without a response")
    })?;
    match call.recv().await? {
        None => Ok(Answer {
            headers: call.headers_now().cloned().unwrap_or_default(),
            message,
            trailers: call.trailers().cloned().unwrap_or_default(),
        }),
        Some(_) => {
            call.cancel();
            Err(Status::new(Code::Unimplemented, "more than one response message for a unary call"))
        }
    }
}
