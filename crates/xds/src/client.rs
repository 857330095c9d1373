//! The ADS stream (state of the world): one per process and bootstrap,
//! shared by every `xds:///` channel.
//!
//! The client keeps, per resource type, the names subscribed to, the
//! version and nonce last seen, and the resources accepted. A response is
//! validated resource by resource: the valid ones replace what was cached
//! (and, for listeners and clusters, a subscribed name missing from the
//! response is deleted, as the protocol's state-of-the-world rule says,
//! unless the bootstrap's server has `ignore_resource_deletion`); if any
//! is invalid, the response is NACKed with every reason (version: the
//! last accepted) and the invalid ones keep their last good value.
//! Otherwise it is ACKed. A broken stream is dialled again with backoff
//! and every subscription sent again; the cache stays in use meanwhile.
//!
//! Watchers see a generation number that changes whenever the cache does
//! ([`XdsClient::changes`]) and read what they need with
//! [`XdsClient::get`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use protoplane_grpc::status::{Code, Status};
use protoplane_rpc::{Backoff, CallOptions, Channel, ChannelOptions};
use protoplane_wire::{DecodeOptions, EncodeOptions, Encoder, Source};
use tokio::sync::{watch, Notify};

use crate::bootstrap::Bootstrap;
use crate::pb::envoy::service::discovery::v3 as ads;
use crate::resources::{self, Cluster, Endpoints, Listener, RouteConfig};

const ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

/// The resource types, in the order the client asks for them.
pub const TYPES: [&str; 4] =
    [resources::LISTENER, resources::ROUTE_CONFIG, resources::CLUSTER, resources::ENDPOINTS];

/// An accepted resource.
#[derive(Clone, Debug, PartialEq)]
pub enum Resource {
    Listener(Arc<Listener>),
    Route(Arc<RouteConfig>),
    Cluster(Arc<Cluster>),
    Endpoints(Arc<Endpoints>),
}

#[derive(Debug, Default)]
struct TypeState {
    /// Names subscribed to.
    wanted: BTreeSet<String>,
    /// What the server was last asked for (a change is sent).
    asked: Option<BTreeSet<String>>,
    /// The version last accepted, and the nonce of the last response.
    version: String,
    nonce: String,
    resources: BTreeMap<String, Resource>,
    /// Why the last response was NACKed (cleared by an ACK).
    nacked: Option<String>,
    /// A response of this type has arrived.
    seen: bool,
}

#[derive(Debug, Default)]
struct State {
    types: [TypeState; 4],
    /// The stream's last failure, while it is down.
    down: Option<String>,
}

#[derive(Debug)]
struct Shared {
    bootstrap: Bootstrap,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    /// Subscriptions changed: the stream sends requests.
    wake: Notify,
    started: std::sync::atomic::AtomicBool,
}

/// The process's xDS client (cheap to clone).
#[derive(Clone, Debug)]
pub struct XdsClient(Arc<Shared>);

fn index(type_url: &str) -> Option<usize> {
    TYPES.iter().position(|t| *t == type_url)
}

impl XdsClient {
    /// A client for `bootstrap` (its stream starts with the first
    /// subscription made inside a runtime).
    pub fn new(bootstrap: Bootstrap) -> XdsClient {
        XdsClient(Arc::new(Shared {
            bootstrap,
            state: Mutex::default(),
            changed: watch::Sender::new(0),
            wake: Notify::new(),
            started: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// The client of this process's bootstrap (made once).
    pub fn global() -> Result<XdsClient, Status> {
        static CLIENT: OnceLock<Result<XdsClient, Status>> = OnceLock::new();
        CLIENT.get_or_init(|| Bootstrap::from_env().map(XdsClient::new)).clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The bootstrap in use.
    pub fn bootstrap(&self) -> &Bootstrap {
        &self.0.bootstrap
    }

    /// Adds `names` of `type_url` to the subscriptions (the stream is
    /// started if it was not).
    pub fn subscribe(&self, type_url: &str, names: impl IntoIterator<Item = String>) {
        let Some(i) = index(type_url) else { return };
        let grew = {
            let mut st = self.lock();
            let before = st.types[i].wanted.len();
            st.types[i].wanted.extend(names);
            st.types[i].wanted.len() != before
        };
        if grew {
            self.0.wake.notify_one();
        }
        self.start();
    }

    /// The accepted resource `name` of `type_url`.
    pub fn get(&self, type_url: &str, name: &str) -> Option<Resource> {
        let i = index(type_url)?;
        self.lock().types[i].resources.get(name).cloned()
    }

    /// A generation number that changes whenever an accepted resource does.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.0.changed.subscribe()
    }

    /// Why the stream is down, if it is.
    pub fn down(&self) -> Option<String> {
        self.lock().down.clone()
    }

    /// Why the last response of `type_url` was refused, if it was.
    pub fn nacked(&self, type_url: &str) -> Option<String> {
        let i = index(type_url)?;
        self.lock().types[i].nacked.clone()
    }

    /// Whether a response of `type_url` has arrived (so a subscribed
    /// name missing from the cache does not exist).
    pub fn responded(&self, type_url: &str) -> bool {
        index(type_url).is_some_and(|i| self.lock().types[i].seen)
    }

    fn start(&self) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        if !self.0.started.swap(true, std::sync::atomic::Ordering::SeqCst) {
            tokio::spawn(run(self.clone()));
        }
    }

    /// The request for type `i`: the subscriptions, the version accepted,
    /// the nonce answered and, for a NACK, why.
    fn request(
        &self,
        i: usize,
        first_on_stream: bool,
        nack: Option<&str>,
    ) -> Result<Vec<u8>, Status> {
        let (names, version, nonce) = {
            let mut st = self.lock();
            let t = &mut st.types[i];
            t.asked = Some(t.wanted.clone());
            (t.wanted.clone(), t.version.clone(), t.nonce.clone())
        };
        let b = &self.0.bootstrap;
        let mut builder = ads::DiscoveryRequest::builder();
        let mut r = ads::DiscoveryRequestBuilder::root(&mut builder);
        let e = |e: protoplane_wire::BuildError| Status::new(Code::Internal, e.to_string());
        r.set_version_info(&version).map_err(e)?;
        r.set_type_url(TYPES[i]).map_err(e)?;
        r.set_response_nonce(&nonce).map_err(e)?;
        for n in &names {
            r.push_resource_names(n).map_err(e)?;
        }
        if first_on_stream {
            let mut node = r.node().map_err(e)?;
            node.set_id(&b.node_id).map_err(e)?;
            node.set_cluster(&b.node_cluster).map_err(e)?;
            node.set_user_agent_name("protoplane").map_err(e)?;
            node.set_user_agent_version(env!("CARGO_PKG_VERSION")).map_err(e)?;
            if b.locality != Default::default() {
                let mut l = node.locality().map_err(e)?;
                l.set_region(&b.locality.0).map_err(e)?;
                l.set_zone(&b.locality.1).map_err(e)?;
                l.set_sub_zone(&b.locality.2).map_err(e)?;
            }
        }
        if let Some(why) = nack {
            let mut d = r.error_detail().map_err(e)?;
            d.set_code(Code::InvalidArgument as i32);
            d.set_message(why).map_err(e)?;
        }
        let block = builder.finish();
        let mut enc = Encoder::new();
        let wire = ads::DiscoveryRequest::encode(
            &mut enc,
            Source::owned(block.as_bytes()),
            &EncodeOptions::default(),
        )
        .map_err(|e| Status::new(Code::Internal, e.to_string()))?;
        Ok(wire.to_vec())
    }

    /// Applies a response: what to send back (type, NACK reason).
    fn apply(&self, wire: &[u8]) -> Result<(usize, Option<String>), Status> {
        let bad = |e: String| Status::new(Code::Internal, format!("xDS response: {e}"));
        let block = ads::DiscoveryResponse::decode(wire, &DecodeOptions::default())
            .map_err(|e| bad(e.to_string()))?;
        let r = ads::DiscoveryResponseView::from_block(block.as_bytes(), wire)
            .map_err(|e| bad(e.to_string()))?;
        let Some(i) = index(r.type_url()) else {
            return Err(bad(format!("a response of unknown type {:?}", r.type_url())));
        };
        let mut errors = Vec::new();
        let mut found: BTreeMap<String, Resource> = BTreeMap::new();
        let mut invalid: BTreeSet<String> = BTreeSet::new();
        for any in r.resources().iter() {
            if any.type_url() != TYPES[i] {
                errors.push(format!("a {} in a response of {}", any.type_url(), TYPES[i]));
                continue;
            }
            let v = any.value();
            let parsed = match i {
                0 => resources::listener(v)
                    .map(|l| (l.name.clone(), Resource::Listener(Arc::new(l)))),
                1 => resources::route_config(v)
                    .map(|r| (r.name.clone(), Resource::Route(Arc::new(r)))),
                2 => {
                    resources::cluster(v).map(|c| (c.name.clone(), Resource::Cluster(Arc::new(c))))
                }
                _ => resources::endpoints(v)
                    .map(|e| (e.name.clone(), Resource::Endpoints(Arc::new(e)))),
            };
            match parsed {
                Ok((name, res)) => {
                    found.insert(name, res);
                }
                Err(why) => {
                    if let Some(name) = name_of(v) {
                        invalid.insert(name);
                    }
                    errors.push(why);
                }
            }
        }
        let mut st = self.lock();
        let t = &mut st.types[i];
        t.nonce = r.nonce().to_string();
        t.seen = true;
        let mut changed = false;
        // State of the world: listeners and clusters not in the response
        // are gone (routes and endpoints are only ever replaced).
        if (i == 0 || i == 2) && !self.0.bootstrap.ignore_resource_deletion {
            let gone: Vec<String> = t
                .resources
                .keys()
                .filter(|k| !found.contains_key(*k) && !invalid.contains(*k))
                .cloned()
                .collect();
            for k in gone {
                t.resources.remove(&k);
                changed = true;
            }
        }
        for (name, res) in found {
            if t.resources.get(&name) != Some(&res) {
                t.resources.insert(name, res);
                changed = true;
            }
        }
        let nack = if errors.is_empty() {
            t.version = r.version_info().to_string();
            t.nacked = None;
            None
        } else {
            let why = errors.join("; ");
            t.nacked = Some(why.clone());
            Some(why)
        };
        drop(st);
        if changed {
            self.0.changed.send_modify(|g| *g += 1);
        }
        Ok((i, nack))
    }
}

/// The name of a resource that did not validate, if its bytes say (field
/// 1 of every type read here).
fn name_of(wire: &[u8]) -> Option<String> {
    let (&tag, rest) = wire.split_first()?;
    if tag != 0x0a {
        return None;
    }
    let (&len, rest) = rest.split_first()?;
    let name = rest.get(..usize::from(len).min(127))?;
    (len < 128).then(|| String::from_utf8_lossy(name).into_owned())
}

/// The stream, for as long as the process runs: connect, subscribe, read
/// and answer; on failure back off and start again.
async fn run(client: XdsClient) {
    let opts = ChannelOptions {
        backoff: Backoff {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(10),
            ..Backoff::default()
        },
        connect_timeout: Duration::from_secs(5),
        ..ChannelOptions::default()
    };
    let ch = Channel::lazy(&client.0.bootstrap.server_uri, opts);
    let mut pause = Duration::from_millis(100);
    loop {
        let why = match stream(&client, &ch).await {
            Ok(()) => "the management server ended the stream".to_string(),
            Err(st) => format!("{}: {}", st.code.name(), st.message),
        };
        {
            let mut st = client.lock();
            st.down = Some(why);
            for t in &mut st.types {
                t.asked = None;
                t.nonce.clear();
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

async fn stream(client: &XdsClient, ch: &Channel) -> Result<(), Status> {
    let mut call = ch.start(ADS_PATH, CallOptions::default().wait_for_ready()).await?;
    let mut first = true;
    loop {
        // Ask for whatever changed (everything, on a new stream).
        let due: Vec<usize> = {
            let st = client.lock();
            (0..TYPES.len())
                .filter(|&i| {
                    !st.types[i].wanted.is_empty()
                        && st.types[i].asked.as_ref() != Some(&st.types[i].wanted)
                })
                .collect()
        };
        for i in due {
            let req = client.request(i, first, None)?;
            first = false;
            call.send(&req).await?;
        }
        tokio::select! {
            msg = call.recv() => {
                let Some(bytes) = msg? else { return Ok(()) };
                client.lock().down = None;
                let (i, nack) = client.apply(&bytes)?;
                let req = client.request(i, first, nack.as_deref())?;
                first = false;
                call.send(&req).await?;
            }
            () = client.0.wake.notified() => {}
        }
    }
}
