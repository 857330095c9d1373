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
//!
//! A resource the server never sends does not exist (the state-of-the-world
//! protocol has no other way to say so): as gRFC A27 and A57 specify, each
//! subscribed name gets a timer ([`RESOURCE_TIMEOUT`], 15 s) when it is
//! first asked for on a stream whose channel is connected, and is taken
//! not to exist when the timer fires before the resource arrives
//! ([`XdsClient::does_not_exist`]). A stream that breaks stops the timers
//! (a server out of reach says nothing about what exists); they start again
//! when the names are asked for on the next one. A listener or cluster
//! that a response of its type deletes does not exist from then on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use protoplane_grpc::status::{Code, Status};
use protoplane_rpc::{Backoff, CallOptions, Channel, ChannelOptions};
use protoplane_wire::{DecodeOptions, EncodeOptions, Encoder, Source};
use tokio::sync::{watch, Notify};

use crate::bootstrap::Bootstrap;
use crate::pb::envoy::service::discovery::v3 as ads;
use crate::resources::{self, Cluster, Endpoints, Listener, RouteConfig};

const ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

/// How long a subscribed resource may take to arrive before it is taken
/// not to exist (the xDS protocol's 15 s, as gRFC A57 cites it).
pub const RESOURCE_TIMEOUT: Duration = Duration::from_secs(15);

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
    /// Names subscribed to: every name some watcher holds.
    wanted: BTreeSet<String>,
    /// The names each watcher holds ([`XdsClient::hold`]; watcher 0 holds
    /// what [`XdsClient::subscribe`] added, for good).
    held: BTreeMap<u64, BTreeSet<String>>,
    /// What the server was last asked for (a change is sent).
    asked: Option<BTreeSet<String>>,
    /// The version last accepted, and the nonce of the last response.
    version: String,
    nonce: String,
    resources: BTreeMap<String, Resource>,
    /// Why the last response was NACKed (cleared by an ACK).
    nacked: Option<String>,
    /// Names asked for on the current stream and not received yet: when
    /// each is taken not to exist.
    timers: BTreeMap<String, Instant>,
    /// Names taken not to exist (timed out, or left out of a listener or
    /// cluster response), until they arrive.
    missing: BTreeSet<String>,
}

impl TypeState {
    /// Recomputes `wanted` from what the watchers hold, dropping what
    /// nobody wants any more; whether it changed.
    fn rewant(&mut self) -> bool {
        let wanted: BTreeSet<String> = self.held.values().flatten().cloned().collect();
        if wanted == self.wanted {
            return false;
        }
        for gone in self.wanted.difference(&wanted) {
            self.resources.remove(gone);
            self.timers.remove(gone);
            self.missing.remove(gone);
        }
        self.wanted = wanted;
        true
    }
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
    /// [`RESOURCE_TIMEOUT`], or a test's.
    resource_timeout: Duration,
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
        XdsClient::with_resource_timeout(bootstrap, RESOURCE_TIMEOUT)
    }

    /// [`XdsClient::new`] with another time a subscribed resource may take
    /// to arrive before it is taken not to exist (tests).
    pub fn with_resource_timeout(bootstrap: Bootstrap, timeout: Duration) -> XdsClient {
        XdsClient(Arc::new(Shared {
            bootstrap,
            state: Mutex::default(),
            changed: watch::Sender::new(0),
            wake: Notify::new(),
            started: std::sync::atomic::AtomicBool::new(false),
            resource_timeout: timeout,
        }))
    }

    /// Whether resource `name` of `type_url` is taken not to exist: the
    /// server did not send it within the resource timeout of being asked,
    /// or (a listener or a cluster) left it out of a response.
    pub fn does_not_exist(&self, type_url: &str, name: &str) -> bool {
        index(type_url).is_some_and(|i| self.lock().types[i].missing.contains(name))
    }

    /// When the next resource timer fires.
    fn next_timer(&self) -> Option<Instant> {
        self.lock().types.iter().filter_map(|t| t.timers.values().min().copied()).min()
    }

    /// Takes the names whose timers fired by `now` not to exist; whether
    /// any was.
    fn expire(&self, now: Instant) -> bool {
        let mut st = self.lock();
        let mut any = false;
        for t in &mut st.types {
            let due: Vec<String> =
                t.timers.iter().filter(|(_, at)| **at <= now).map(|(n, _)| n.clone()).collect();
            for name in due {
                t.timers.remove(&name);
                any |= t.missing.insert(name);
            }
        }
        any
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

    /// Adds `names` of `type_url` to the subscriptions for good (the
    /// stream is started if it was not).
    pub fn subscribe(&self, type_url: &str, names: impl IntoIterator<Item = String>) {
        self.hold(0, type_url, names.into_iter().collect(), false);
    }

    /// A new watcher id, for [`XdsClient::hold`].
    pub fn watcher(&self) -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Watcher `owner` needs `names` of `type_url`: in addition to what it
    /// held, or (`replace`) instead. A name no watcher holds any more is
    /// unsubscribed: the server is asked without it, and it leaves the
    /// cache. (The stream is started if it was not.)
    pub fn hold(&self, owner: u64, type_url: &str, names: BTreeSet<String>, replace: bool) {
        let Some(i) = index(type_url) else { return };
        let changed = {
            let mut st = self.lock();
            let t = &mut st.types[i];
            let mine = t.held.entry(owner).or_default();
            if replace {
                *mine = names;
            } else {
                mine.extend(names);
            }
            if t.held.get(&owner).is_some_and(BTreeSet::is_empty) {
                t.held.remove(&owner);
            }
            t.rewant()
        };
        if changed {
            self.0.wake.notify_one();
        }
        self.start();
    }

    /// Watcher `owner` is gone: what only it held is unsubscribed.
    pub fn release(&self, owner: u64) {
        let changed = {
            let mut st = self.lock();
            let mut any = false;
            for t in &mut st.types {
                if t.held.remove(&owner).is_some() {
                    any |= t.rewant();
                }
            }
            any
        };
        if changed {
            self.0.wake.notify_one();
        }
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
            // Called as the request goes out on a connected stream: the
            // names asked for the first time on it start their timers.
            let at = Instant::now() + self.0.resource_timeout;
            for n in &t.wanted {
                if !t.resources.contains_key(n) && !t.missing.contains(n) {
                    t.timers.entry(n.clone()).or_insert(at);
                }
            }
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

    /// The stream broke (`why`): everything is asked again on the next.
    fn stream_lost(&self, why: String) {
        let mut st = self.lock();
        st.down = Some(why);
        for t in &mut st.types {
            t.asked = None;
            t.nonce.clear();
            // A server out of reach says nothing about what exists.
            t.timers.clear();
        }
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
            // Deleted: it does not exist any more. (One never received is
            // left to its timer, as grpc-go does: the response may predate
            // the request that asked for it.)
            for k in gone {
                t.resources.remove(&k);
                t.missing.insert(k);
                changed = true;
            }
        }
        for (name, res) in found {
            t.timers.remove(&name);
            changed |= t.missing.remove(&name);
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

/// The host of a management server's URI (`host:port`, `[v6]:port`, a
/// `dns:///host:port` target): the name its certificate must carry.
fn host_of(uri: &str) -> String {
    let rest = uri.rsplit_once("///").map_or(uri, |(_, r)| r);
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    if let Some(v6) = rest.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6).to_string();
    }
    rest.rsplit_once(':').map_or(rest, |(h, _)| h).to_string()
}

/// The stream, for as long as the process runs: connect, subscribe, read
/// and answer; on failure back off and start again.
async fn run(client: XdsClient) {
    let b = &client.0.bootstrap;
    let tls = b.tls.as_ref().map(|t| protoplane_rpc::ClientTls {
        server_name: host_of(&b.server_uri),
        roots_pem: t.roots_pem.clone(),
        identity: t.identity.as_ref().map(|(cert, key)| protoplane_rpc::Identity {
            cert_pem: cert.clone(),
            key_pem: key.clone(),
        }),
    });
    let opts = ChannelOptions {
        backoff: Backoff {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(10),
            ..Backoff::default()
        },
        connect_timeout: Duration::from_secs(5),
        tls,
        ..ChannelOptions::default()
    };
    let ch = Channel::lazy(&client.0.bootstrap.server_uri, opts);
    let mut pause = Duration::from_millis(100);
    loop {
        let why = match stream(&client, &ch).await {
            Ok(()) => "the management server ended the stream".to_string(),
            Err(st) => format!("{}: {}", st.code.name(), st.message),
        };
        client.stream_lost(why);
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
                    let t = &st.types[i];
                    // An empty list is sent only to unsubscribe the last
                    // names asked on this stream: as a stream's first
                    // request of a type it would ask for every resource.
                    t.asked.as_ref() != Some(&t.wanted)
                        && (!t.wanted.is_empty() || t.asked.is_some())
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
            () = timer(client.next_timer()) => {
                if client.expire(Instant::now()) {
                    client.0.changed.send_modify(|g| *g += 1);
                }
            }
        }
    }
}

/// Waits until `at` (for ever if `None`).
async fn timer(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::envoy::config::cluster::v3 as cluster_pb;
    use crate::pb::envoy::config::endpoint::v3 as endpoint_pb;
    use crate::resources::tests::encode;

    fn client(timeout: Duration) -> XdsClient {
        let b = Bootstrap::from_json(
            r#"{"xds_servers": [{"server_uri": "127.0.0.1:1",
                 "channel_creds": [{"type": "insecure"}]}], "node": {"id": "n"}}"#,
        )
        .expect("bootstrap");
        XdsClient::with_resource_timeout(b, timeout)
    }

    /// Subscribes to `name` of type `i` and sends the request (as the
    /// stream does once connected), without a stream.
    fn ask(c: &XdsClient, i: usize, name: &str) {
        c.lock().types[i].wanted.insert(name.to_string());
        c.request(i, true, None).expect("request");
    }

    /// A DiscoveryResponse of type `i` holding `resources` (encoded).
    fn response(i: usize, resources: &[Vec<u8>]) -> Vec<u8> {
        encode(
            |b| {
                let mut r = ads::DiscoveryResponseBuilder::root(b);
                r.set_version_info("1").expect("version");
                r.set_type_url(TYPES[i]).expect("type");
                r.set_nonce("n1").expect("nonce");
                for res in resources {
                    let mut any = r.add_resources().expect("any");
                    any.set_type_url(TYPES[i]).expect("type");
                    any.set_value(res).expect("value");
                }
            },
            |e, s, o| ads::DiscoveryResponse::encode(e, s, o).expect("encodes").to_vec(),
            ads::DiscoveryResponse::builder(),
        )
    }

    fn endpoints(name: &str) -> Vec<u8> {
        encode(
            |b| {
                let mut cla = endpoint_pb::ClusterLoadAssignmentBuilder::root(b);
                cla.set_cluster_name(name).expect("name");
                let mut l = cla.add_endpoints().expect("locality");
                let mut e = l.add_lb_endpoints().expect("endpoint");
                let mut ep = e.endpoint().expect("ep");
                let mut a = ep.address().expect("address");
                let mut sa = a.socket_address().expect("sa");
                sa.set_address("127.0.0.1").expect("ip").set_port_value(7);
            },
            |e, s, o| {
                endpoint_pb::ClusterLoadAssignment::encode(e, s, o).expect("encodes").to_vec()
            },
            endpoint_pb::ClusterLoadAssignment::builder(),
        )
    }

    fn cluster(name: &str) -> Vec<u8> {
        encode(
            |b| {
                let mut c = cluster_pb::ClusterBuilder::root(b);
                c.set_name(name).expect("name");
                c.set_type(3);
                let mut eds = c.eds_cluster_config().expect("eds");
                eds.eds_config().expect("source").ads().expect("ads");
            },
            |e, s, o| cluster_pb::Cluster::encode(e, s, o).expect("encodes").to_vec(),
            cluster_pb::Cluster::builder(),
        )
    }

    #[test]
    fn the_name_a_management_servers_certificate_carries() {
        assert_eq!(host_of("127.0.0.1:18000"), "127.0.0.1");
        assert_eq!(host_of("xds.example.com:443"), "xds.example.com");
        assert_eq!(host_of("dns:///xds.example.com:443"), "xds.example.com");
        assert_eq!(host_of("[::1]:18000"), "::1");
        assert_eq!(host_of("xds.example.com"), "xds.example.com");
    }

    #[test]
    fn a_resource_not_sent_in_time_does_not_exist_until_it_comes() {
        let c = client(Duration::from_secs(15));
        let asked = Instant::now();
        ask(&c, 3, "eds1");
        assert!(!c.does_not_exist(resources::ENDPOINTS, "eds1"));
        assert!(!c.expire(asked + Duration::from_secs(14)), "not before its timeout");
        assert!(!c.does_not_exist(resources::ENDPOINTS, "eds1"));
        assert!(c.expire(Instant::now() + Duration::from_secs(15)), "at its timeout");
        assert!(c.does_not_exist(resources::ENDPOINTS, "eds1"));
        // It arrives after all: it exists.
        let (i, nack) = c.apply(&response(3, &[endpoints("eds1")])).expect("applies");
        assert_eq!((i, nack), (3, None));
        assert!(!c.does_not_exist(resources::ENDPOINTS, "eds1"));
        assert!(c.get(resources::ENDPOINTS, "eds1").is_some());
        assert!(c.next_timer().is_none(), "no timer left");
    }

    fn names(n: &[&str]) -> BTreeSet<String> {
        n.iter().map(|n| n.to_string()).collect()
    }

    /// On a current-thread runtime whose stream task (started by `hold`)
    /// never runs: the test does not await.
    #[tokio::test]
    async fn a_name_no_watcher_holds_is_unsubscribed_and_leaves_the_cache() {
        let c = client(Duration::from_secs(15));
        let (a, b) = (c.watcher(), c.watcher());
        c.hold(a, resources::CLUSTER, names(&["c1", "c2"]), false);
        c.hold(b, resources::CLUSTER, names(&["c2"]), false);
        c.request(2, true, None).expect("request");
        c.apply(&response(2, &[cluster("c1"), cluster("c2")])).expect("applies");
        assert!(c.get(resources::CLUSTER, "c1").is_some());
        // Watcher a moves to c3 only: c1 is nobody's any more.
        c.hold(a, resources::CLUSTER, names(&["c3"]), true);
        let wanted: Vec<String> = c.lock().types[2].wanted.iter().cloned().collect();
        assert_eq!(wanted, ["c2", "c3"]);
        assert!(c.get(resources::CLUSTER, "c1").is_none(), "left the cache");
        assert!(c.get(resources::CLUSTER, "c2").is_some(), "b still holds it");
        // Both gone: nothing is wanted, and the stream has something to
        // say (an empty list unsubscribes what this stream asked for).
        c.release(a);
        c.release(b);
        let st = c.lock();
        assert!(st.types[2].wanted.is_empty());
        assert!(st.types[2].asked.as_ref().is_some_and(|asked| !asked.is_empty()));
        assert!(st.types[2].resources.is_empty() && st.types[2].timers.is_empty());
    }

    #[test]
    fn a_broken_stream_stops_the_timers_and_the_next_one_starts_them() {
        let c = client(Duration::from_secs(15));
        ask(&c, 3, "eds1");
        c.stream_lost("connection refused".into());
        assert!(c.next_timer().is_none(), "stopped with the stream");
        assert!(!c.expire(Instant::now() + Duration::from_secs(60)));
        assert!(!c.does_not_exist(resources::ENDPOINTS, "eds1"));
        let again = Instant::now();
        c.request(3, true, None).expect("asked again");
        let at = c.next_timer().expect("started again");
        assert!(at >= again + Duration::from_secs(15), "a whole timeout from the new request");
    }

    #[test]
    fn a_cluster_a_response_deletes_does_not_exist() {
        let c = client(Duration::from_secs(15));
        ask(&c, 2, "c1");
        ask(&c, 2, "c2");
        c.apply(&response(2, &[cluster("c1"), cluster("c2")])).expect("applies");
        assert!(c.get(resources::CLUSTER, "c1").is_some());
        assert!(c.next_timer().is_none(), "both arrived");
        c.apply(&response(2, &[cluster("c2")])).expect("applies");
        assert!(c.does_not_exist(resources::CLUSTER, "c1"), "deleted");
        assert!(!c.does_not_exist(resources::CLUSTER, "c2"));
        // A cluster asked for and left out of a response before it ever
        // came waits for its timer (the response may predate the request).
        ask(&c, 2, "c3");
        c.apply(&response(2, &[cluster("c2")])).expect("applies");
        assert!(!c.does_not_exist(resources::CLUSTER, "c3"));
        assert!(c.next_timer().is_some());
    }
}
