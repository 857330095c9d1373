//! The channel side of `xds:///name`: the listener named `name`, its
//! routes, and a round-robin channel per cluster.
//!
//! A task follows the client's cache: whenever it changes, the router
//! works out the whole chain again (listener → route configuration → the
//! virtual host whose domains best match `name` → the clusters its routes
//! name → their endpoints) and swaps it in at once; calls already started
//! keep the cluster channel they picked. Each call is then matched against
//! the routes in order (path prefix or exact path, case sensitive or not;
//! every header matcher; the runtime fraction) and sent to the route's
//! cluster, or to one of its weighted clusters drawn by weight, with the
//! route's timeout (`max_stream_duration`, else the connection manager's)
//! and retry policy (the route's, else the virtual host's).
//!
//! Until the first configuration arrives calls wait (until their
//! deadline); when the listener or its route configuration does not exist
//! (the server deleted it, or did not send it within the client's resource
//! timeout: [`crate::client`]), or no virtual host matches, calls fail with
//! UNAVAILABLE naming why, unless they wait for readiness. A call whose
//! route names a cluster that does not exist, or whose endpoints do not,
//! fails the same way; one whose cluster is merely not known yet waits.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use protoplane_grpc::metadata::Metadata;
use protoplane_grpc::status::{Code, Status};
use protoplane_grpc::BoxFuture;
use protoplane_rpc::config::MethodConfig;
use protoplane_rpc::resolve::{Address, ManualResolver};
use protoplane_rpc::route::{CallRouter, Routed};
use protoplane_rpc::{Channel, ChannelOptions, Connectivity, LbPolicy};
use tokio::sync::watch;

use crate::client::{Resource, XdsClient};
use crate::resources::{self, Action, HeaderKind, PathMatch, Route, RouteSource, VirtualHost};

/// `xds:///name`, `xds://authority/name`, `xds:name`: the name.
fn name_of(target: &str) -> Result<String, Status> {
    let rest = target.split_once(':').map(|(_, r)| r).unwrap_or(target);
    let name = match rest.strip_prefix("//") {
        Some(r) => r.split_once('/').map(|(_, n)| n).unwrap_or(""),
        None => rest,
    };
    if name.is_empty() {
        return Err(Status::new(Code::InvalidArgument, format!("target {target:?}: no name")));
    }
    Ok(name.to_string())
}

/// The [`protoplane_rpc::route::RouterFactory`] of `xds:` targets.
pub(crate) fn factory(target: &str, opts: &ChannelOptions) -> Result<Arc<dyn CallRouter>, Status> {
    let name = name_of(target)?;
    let client = XdsClient::global()?;
    Ok(XdsRouter::new(client, name, opts.clone()))
}

/// What calls are routed by.
#[derive(Debug)]
struct Config {
    vhost: VirtualHost,
    /// The connection manager's stream duration (routes without one).
    default_timeout: Option<Duration>,
    clusters: HashMap<String, Channel>,
    /// Clusters named by routes that do not exist, and why.
    missing: HashMap<String, String>,
}

#[derive(Debug, Default)]
struct State {
    config: Option<Arc<Config>>,
    /// Why there is no configuration, when the server said so.
    error: Option<String>,
    /// Every cluster's channel and what feeds it endpoints.
    clusters: HashMap<String, (Channel, Feeder)>,
}

/// What feeds a cluster channel its endpoints.
#[derive(Debug)]
enum Feeder {
    /// EDS: the router, from the cluster's ClusterLoadAssignment.
    Eds(ManualResolver),
    /// LOGICAL_DNS: the channel's own DNS resolver, for `host:port`.
    Dns(String),
}

/// A cluster's endpoints as the chain found them.
#[derive(Debug, PartialEq)]
enum Found {
    /// EDS endpoints with their weights (`None`: not known yet).
    Eds(Option<Vec<(std::net::SocketAddr, u32)>>),
    /// A LOGICAL_DNS cluster's `host:port`.
    Dns(String),
}

/// The router of one `xds:///` channel.
#[derive(Debug)]
pub struct XdsRouter {
    client: XdsClient,
    /// This router's id with the client (what it holds is released when
    /// it is dropped).
    watcher: u64,
    target: String,
    opts: ChannelOptions,
    state: Mutex<State>,
    updated: watch::Sender<u64>,
    started: AtomicBool,
    me: Weak<XdsRouter>,
}

impl XdsRouter {
    /// A router for `target` over `client`; cluster channels get `opts`
    /// (with round robin and their own resolver).
    pub fn new(client: XdsClient, target: String, opts: ChannelOptions) -> Arc<XdsRouter> {
        let watcher = client.watcher();
        Arc::new_cyclic(|me| XdsRouter {
            client,
            watcher,
            target,
            opts,
            state: Mutex::default(),
            updated: watch::Sender::new(0),
            started: AtomicBool::new(false),
            me: me.clone(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn start(&self) {
        if !self.started.swap(true, Ordering::SeqCst) {
            let target = BTreeSet::from([self.target.clone()]);
            self.client.hold(self.watcher, resources::LISTENER, target, true);
            let mut changes = self.client.changes();
            let me = self.me.clone();
            tokio::spawn(async move {
                loop {
                    match me.upgrade() {
                        Some(r) => r.rebuild(),
                        None => return,
                    }
                    if changes.changed().await.is_err() {
                        return;
                    }
                }
            });
        }
    }

    /// A new channel for a cluster: round robin over its endpoints, fed
    /// by this router (EDS) or by DNS (LOGICAL_DNS, gRFC A37: every address
    /// the name has, re-resolved as any `dns:///` target is).
    fn cluster_channel(&self, found: &Found) -> (Channel, Feeder) {
        match found {
            Found::Dns(target) => {
                let opts = ChannelOptions {
                    lb: LbPolicy::RoundRobin,
                    resolver: None,
                    service_config: None,
                    ..self.opts.clone()
                };
                (Channel::lazy(&format!("dns:///{target}"), opts), Feeder::Dns(target.clone()))
            }
            Found::Eds(_) => {
                let resolver = ManualResolver::new([]);
                let opts = ChannelOptions {
                    lb: LbPolicy::RoundRobin,
                    resolver: Some(Arc::new(resolver.clone())),
                    service_config: None,
                    ..self.opts.clone()
                };
                (Channel::lazy(&self.target, opts), Feeder::Eds(resolver))
            }
        }
    }

    /// Works the chain out again from the client's cache.
    fn rebuild(&self) {
        let outcome = self.chain();
        let mut st = self.lock();
        match outcome {
            Ok((vhost, default_timeout, endpoints, missing)) => {
                // Cluster channels: kept, made, fed, dropped.
                let wanted: BTreeSet<String> = endpoints.keys().cloned().collect();
                st.clusters.retain(|name, _| wanted.contains(name));
                let mut clusters = HashMap::new();
                for (name, found) in endpoints {
                    // A cluster that does not exist has no channel (its
                    // calls fail); one whose endpoints are not known yet
                    // gets none either (its calls wait), unless it had one.
                    if missing.contains_key(&name) {
                        st.clusters.remove(&name);
                        continue;
                    }
                    if found == Found::Eds(None) && !st.clusters.contains_key(&name) {
                        continue;
                    }
                    // A cluster whose kind (or DNS name) changed gets a new
                    // channel.
                    let same = match (st.clusters.get(&name).map(|(_, f)| f), &found) {
                        (Some(Feeder::Eds(_)), Found::Eds(_)) => true,
                        (Some(Feeder::Dns(a)), Found::Dns(b)) => a == b,
                        _ => false,
                    };
                    if !same {
                        st.clusters.insert(name.clone(), self.cluster_channel(&found));
                    }
                    let Some((ch, feeder)) = st.clusters.get(&name) else { continue };
                    if let (Feeder::Eds(resolver), Found::Eds(Some(eps))) = (feeder, found) {
                        let list: Vec<(Address, u32)> =
                            eps.into_iter().map(|(a, w)| (Address::Tcp(a), w)).collect();
                        if list != weighted_now(resolver) {
                            resolver.set_weighted(list);
                        }
                    }
                    clusters.insert(name, ch.clone());
                }
                st.config = Some(Arc::new(Config { vhost, default_timeout, clusters, missing }));
                st.error = None;
            }
            Err(Some(why)) => {
                st.error = Some(why);
                // The last good configuration stays in use when the
                // server NACK'd or is down; a listener that does not exist
                // removes it.
                if self.client.get(resources::LISTENER, &self.target).is_none() {
                    st.config = None;
                }
            }
            Err(None) => {}
        }
        drop(st);
        self.updated.send_modify(|g| *g += 1);
    }

    /// The virtual host, the default timeout, each cluster's endpoints
    /// (`None`: not known yet) and the clusters that do not exist (with
    /// why). `Err(None)`: still waiting; `Err(Some)`: what is wrong.
    #[allow(clippy::type_complexity)]
    fn chain(
        &self,
    ) -> Result<
        (VirtualHost, Option<Duration>, HashMap<String, Found>, HashMap<String, String>),
        Option<String>,
    > {
        let c = &self.client;
        let listener = match c.get(resources::LISTENER, &self.target) {
            Some(Resource::Listener(l)) => l,
            _ => {
                return Err(c
                    .nacked(resources::LISTENER)
                    .map(|why| format!("listener {:?} refused: {why}", self.target))
                    .or_else(|| {
                        c.does_not_exist(resources::LISTENER, &self.target)
                            .then(|| format!("listener {:?} does not exist", self.target))
                    }))
            }
        };
        let routes = match &listener.routes {
            RouteSource::Inline(rc) => Arc::new(rc.clone()),
            RouteSource::Rds(name) => {
                c.hold(
                    self.watcher,
                    resources::ROUTE_CONFIG,
                    BTreeSet::from([name.clone()]),
                    false,
                );
                match c.get(resources::ROUTE_CONFIG, name) {
                    Some(Resource::Route(rc)) => rc,
                    _ => {
                        return Err(c.does_not_exist(resources::ROUTE_CONFIG, name).then(|| {
                            format!(
                                "route configuration {name:?} of listener {:?} does not exist",
                                self.target
                            )
                        }))
                    }
                }
            }
        };
        let vhost = best_vhost(&routes.virtual_hosts, &self.target)
            .ok_or_else(|| {
                Some(format!("no virtual host of {:?} matches {:?}", routes.name, self.target))
            })?
            .clone();
        let mut names = BTreeSet::new();
        for r in &vhost.routes {
            match &r.action {
                Action::Cluster(n) => {
                    names.insert(n.clone());
                }
                Action::Weighted(list) => names.extend(list.iter().map(|(n, _)| n.clone())),
                Action::NonForwarding => {}
            }
        }
        c.hold(self.watcher, resources::CLUSTER, names.clone(), false);
        let mut endpoints = HashMap::new();
        let mut missing = HashMap::new();
        let mut eds_names = BTreeSet::new();
        for name in names.iter().cloned() {
            let eps = match c.get(resources::CLUSTER, &name) {
                Some(Resource::Cluster(cl)) => {
                    if let Some(dns) = &cl.logical_dns {
                        endpoints.insert(name, Found::Dns(dns.clone()));
                        continue;
                    }
                    let eds = &cl.eds_service_name;
                    c.hold(
                        self.watcher,
                        resources::ENDPOINTS,
                        BTreeSet::from([eds.clone()]),
                        false,
                    );
                    eds_names.insert(eds.clone());
                    match c.get(resources::ENDPOINTS, eds) {
                        Some(Resource::Endpoints(e)) => Some(e.weighted()),
                        _ => {
                            if c.does_not_exist(resources::ENDPOINTS, eds) {
                                let why = format!("endpoints {eds:?} of cluster {name:?}");
                                missing.insert(name.clone(), why);
                            }
                            None
                        }
                    }
                }
                _ => {
                    if c.does_not_exist(resources::CLUSTER, &name) {
                        missing.insert(name.clone(), format!("cluster {name:?}"));
                    }
                    None
                }
            };
            endpoints.insert(name, Found::Eds(eps));
        }
        // The whole chain is known: what it no longer uses is unsubscribed.
        // (While part of it is missing, the names only grow: the last good
        // configuration, still in use, keeps what it needs.)
        let rds = match &listener.routes {
            RouteSource::Rds(name) => BTreeSet::from([name.clone()]),
            RouteSource::Inline(_) => BTreeSet::new(),
        };
        c.hold(self.watcher, resources::ROUTE_CONFIG, rds, true);
        c.hold(self.watcher, resources::CLUSTER, names, true);
        c.hold(self.watcher, resources::ENDPOINTS, eds_names, true);
        Ok((vhost, listener.max_stream_duration, endpoints, missing))
    }

    /// The route a call takes; `None` while its cluster has no endpoints
    /// yet, or does not exist and the call waits for readiness (as a call
    /// waits out a cluster's TRANSIENT_FAILURE in gRPC).
    fn pick(
        &self,
        config: &Config,
        path: &str,
        md: &Metadata,
        wait_for_ready: bool,
    ) -> Result<Option<Routed>, Status> {
        let Some(route) = config.vhost.routes.iter().find(|r| matches(r, path, md)) else {
            return Err(Status::new(
                Code::Unavailable,
                format!("no route of {:?} matches {path}", self.target),
            ));
        };
        let cluster = match &route.action {
            Action::Cluster(c) => c.as_str(),
            Action::Weighted(list) => {
                let total: u64 = list.iter().map(|(_, w)| u64::from(*w)).sum();
                let mut x = random() % total.max(1);
                let mut chosen = list[0].0.as_str();
                for (n, w) in list {
                    if x < u64::from(*w) {
                        chosen = n;
                        break;
                    }
                    x -= u64::from(*w);
                }
                chosen
            }
            Action::NonForwarding => {
                return Err(Status::new(Code::Unavailable, "matched a non-forwarding route"))
            }
        };
        let Some(channel) = config.clusters.get(cluster).cloned() else {
            return match config.missing.get(cluster) {
                Some(what) if !wait_for_ready => {
                    Err(Status::new(Code::Unavailable, format!("xDS: {what} does not exist")))
                }
                _ => Ok(None),
            };
        };
        let method = MethodConfig {
            timeout: route.timeout.or(config.default_timeout),
            retry: route.retry.clone().or_else(|| config.vhost.retry.clone()),
            ..MethodConfig::default()
        };
        Ok(Some(Routed { channel, method }))
    }
}

/// What a cluster's resolver holds now.
fn weighted_now(r: &ManualResolver) -> Vec<(Address, u32)> {
    let cur = r.current();
    let n = cur.addresses.len();
    let w = if cur.weights.len() == n { cur.weights.clone() } else { vec![1; n] };
    cur.addresses.into_iter().zip(w).collect()
}

fn random() -> u64 {
    use std::cell::Cell;
    use std::hash::{BuildHasher, Hasher};
    thread_local! {
        static SEED: Cell<u64> = Cell::new(
            std::collections::hash_map::RandomState::new().build_hasher().finish() | 1,
        );
    }
    SEED.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    })
}

/// gRPC's virtual host choice: an exact domain, then the longest suffix
/// wildcard (`*.example.com`), then the longest prefix wildcard
/// (`example.*`), then `*`.
fn best_vhost<'a>(hosts: &'a [VirtualHost], name: &str) -> Option<&'a VirtualHost> {
    let name = name.to_ascii_lowercase();
    let score = |d: &str| -> Option<(u8, usize)> {
        let d = d.to_ascii_lowercase();
        if d == name {
            Some((4, d.len()))
        } else if d == "*" {
            Some((1, 0))
        } else if let Some(s) = d.strip_prefix('*') {
            name.ends_with(s).then_some((3, d.len()))
        } else if let Some(p) = d.strip_suffix('*') {
            name.starts_with(p).then_some((2, d.len()))
        } else {
            None
        }
    };
    hosts
        .iter()
        .filter_map(|h| h.domains.iter().filter_map(|d| score(d)).max().map(|s| (s, h)))
        .max_by_key(|(s, _)| *s)
        .map(|(_, h)| h)
}

fn matches(r: &Route, path: &str, md: &Metadata) -> bool {
    let ok = match &r.path {
        PathMatch::Prefix(p) if r.case_sensitive => path.starts_with(p.as_str()),
        PathMatch::Prefix(p) => path.to_ascii_lowercase().starts_with(&p.to_ascii_lowercase()),
        PathMatch::Exact(p) if r.case_sensitive => path == p,
        PathMatch::Exact(p) => path.eq_ignore_ascii_case(p),
        PathMatch::Regex(r) => r.is_match(path),
    };
    if !ok {
        return false;
    }
    for h in &r.headers {
        // Binary headers never match (gRPC's rule); content-type is gRPC's.
        let value = if h.name.ends_with("-bin") {
            None
        } else if h.name == "content-type" {
            Some("application/grpc".to_string())
        } else {
            let all: Vec<&str> =
                md.get_all(&h.name).filter_map(|v| std::str::from_utf8(v).ok()).collect();
            (!all.is_empty()).then(|| all.join(","))
        };
        let hit = match (&h.kind, value.as_deref()) {
            (HeaderKind::Present(p), v) => v.is_some() == *p,
            (_, None) => false,
            (HeaderKind::Exact(x, ic), Some(v)) => same(v, x, *ic),
            (HeaderKind::Prefix(x, ic), Some(v)) => fold(v, *ic).starts_with(&fold(x, *ic)),
            (HeaderKind::Suffix(x, ic), Some(v)) => fold(v, *ic).ends_with(&fold(x, *ic)),
            (HeaderKind::Contains(x, ic), Some(v)) => fold(v, *ic).contains(&fold(x, *ic)),
            (HeaderKind::Range(a, b), Some(v)) => v.parse::<i64>().is_ok_and(|n| *a <= n && n < *b),
            (HeaderKind::Regex(r), Some(v)) => r.is_match(v),
        };
        if hit == h.invert {
            return false;
        }
    }
    match r.fraction_per_million {
        Some(f) => (random() % 1_000_000) < u64::from(f),
        None => true,
    }
}

fn same(a: &str, b: &str, ignore_case: bool) -> bool {
    if ignore_case {
        a.eq_ignore_ascii_case(b)
    } else {
        a == b
    }
}

fn fold(s: &str, ignore_case: bool) -> String {
    if ignore_case {
        s.to_ascii_lowercase()
    } else {
        s.to_string()
    }
}

impl CallRouter for XdsRouter {
    fn route<'a>(
        &'a self,
        path: &'a str,
        metadata: &'a Metadata,
        wait_for_ready: bool,
        deadline: Option<Instant>,
    ) -> BoxFuture<'a, Result<Routed, Status>> {
        Box::pin(async move {
            self.start();
            let mut updates = self.updated.subscribe();
            loop {
                let (config, error) = {
                    let st = self.lock();
                    (st.config.clone(), st.error.clone())
                };
                match (config, error) {
                    (Some(c), _) => {
                        if let Some(routed) = self.pick(&c, path, metadata, wait_for_ready)? {
                            return Ok(routed);
                        }
                        // Its cluster's endpoints are on their way.
                    }
                    (None, Some(why)) if !wait_for_ready => {
                        return Err(Status::new(Code::Unavailable, format!("xDS: {why}")));
                    }
                    (None, _) => {}
                }
                let wait = updates.changed();
                match deadline {
                    Some(d) => {
                        if tokio::time::timeout_at(d.into(), wait).await.is_err() {
                            let why = self.lock().error.clone().or_else(|| self.client.down());
                            let why = why.unwrap_or_else(|| {
                                "no configuration from the management server yet".into()
                            });
                            return Err(Status::new(Code::DeadlineExceeded, format!("xDS: {why}")));
                        }
                    }
                    None => {
                        let _ = wait.await;
                    }
                }
            }
        })
    }

    fn connectivity(&self) -> Connectivity {
        let st = self.lock();
        let states: Vec<Connectivity> =
            st.clusters.values().map(|(c, _)| c.connectivity()).collect();
        if states.contains(&Connectivity::Ready) {
            Connectivity::Ready
        } else if st.error.is_some() {
            Connectivity::TransientFailure
        } else if states.contains(&Connectivity::Connecting) || st.config.is_none() {
            Connectivity::Connecting
        } else if states.contains(&Connectivity::TransientFailure) {
            Connectivity::TransientFailure
        } else {
            Connectivity::Idle
        }
    }
}

impl Drop for XdsRouter {
    fn drop(&mut self) {
        self.client.release(self.watcher);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vh(domains: &[&str]) -> VirtualHost {
        VirtualHost {
            domains: domains.iter().map(|d| d.to_string()).collect(),
            routes: vec![],
            retry: None,
        }
    }

    /// A call routed to a cluster that does not exist fails UNAVAILABLE
    /// naming it, unless it waits for readiness; one routed to a cluster
    /// not known yet waits.
    #[test]
    fn a_cluster_that_does_not_exist_fails_its_calls() {
        let b = crate::bootstrap::Bootstrap::from_json(
            r#"{"xds_servers": [{"server_uri": "127.0.0.1:1",
                 "channel_creds": [{"type": "insecure"}]}]}"#,
        )
        .expect("bootstrap");
        let router = XdsRouter::new(XdsClient::new(b), "svc".into(), ChannelOptions::default());
        let route = |prefix: &str, cluster: &str| Route {
            path: PathMatch::Prefix(prefix.into()),
            case_sensitive: true,
            headers: vec![],
            fraction_per_million: None,
            action: Action::Cluster(cluster.into()),
            timeout: None,
            retry: None,
        };
        let mut vhost = vh(&["*"]);
        vhost.routes = vec![route("/gone.", "c1"), route("/", "c2")];
        let config = Config {
            vhost,
            default_timeout: None,
            clusters: HashMap::new(),
            missing: HashMap::from([("c1".to_string(), "cluster \"c1\"".to_string())]),
        };
        let md = Metadata::new();
        let err = router.pick(&config, "/gone.S/M", &md, false).expect_err("fails");
        assert_eq!(err.code, Code::Unavailable);
        assert!(err.message.contains("cluster \"c1\" does not exist"), "{}", err.message);
        assert!(router.pick(&config, "/gone.S/M", &md, true).expect("waits").is_none());
        assert!(router.pick(&config, "/other.S/M", &md, false).expect("waits").is_none());
    }

    #[test]
    fn virtual_hosts_are_chosen_as_grpc_chooses_them() {
        let hosts = [vh(&["*"]), vh(&["svc.*"]), vh(&["*.example.com"]), vh(&["svc.example.com"])];
        let pick = |n: &str| best_vhost(&hosts, n).map(|h| h.domains[0].clone());
        assert_eq!(pick("svc.example.com").as_deref(), Some("svc.example.com"));
        assert_eq!(pick("api.example.com").as_deref(), Some("*.example.com"));
        assert_eq!(pick("svc.other").as_deref(), Some("svc.*"));
        assert_eq!(pick("other").as_deref(), Some("*"));
        assert!(best_vhost(&[vh(&["a"])], "b").is_none());
    }

    #[test]
    fn routes_match_on_path_headers_and_case() {
        let route = |path: PathMatch, headers: Vec<resources::HeaderMatch>, cs: bool| Route {
            path,
            case_sensitive: cs,
            headers,
            fraction_per_million: None,
            action: Action::Cluster("c".into()),
            timeout: None,
            retry: None,
        };
        let mut md = Metadata::new();
        md.insert("x-env", "canary").expect("md");
        let exact = route(PathMatch::Exact("/a.S/M".into()), vec![], true);
        assert!(matches(&exact, "/a.S/M", &md) && !matches(&exact, "/a.S/m", &md));
        let nocase = route(PathMatch::Exact("/a.S/M".into()), vec![], false);
        assert!(matches(&nocase, "/a.s/m", &md));
        let canary = |invert| resources::HeaderMatch {
            name: "x-env".into(),
            kind: HeaderKind::Exact("canary".into(), false),
            invert,
        };
        let r = route(PathMatch::Prefix("/a.S/".into()), vec![canary(false)], true);
        assert!(matches(&r, "/a.S/M", &md) && !matches(&r, "/a.S/M", &Metadata::new()));
        let r = route(PathMatch::Prefix("".into()), vec![canary(true)], true);
        assert!(!matches(&r, "/a.S/M", &md) && matches(&r, "/a.S/M", &Metadata::new()));
    }

    /// `safe_regex` paths and header values match whole strings; a route's
    /// case insensitivity does not reach a regex.
    #[test]
    fn regex_matchers_match_whole_strings() {
        let re = |p: &str| resources::Regex::new(p).expect("compiles");
        let route = |path: PathMatch, headers: Vec<resources::HeaderMatch>| Route {
            path,
            case_sensitive: false,
            headers,
            fraction_per_million: None,
            action: Action::Cluster("c".into()),
            timeout: None,
            retry: None,
        };
        let md = Metadata::new();
        let r = route(PathMatch::Regex(re(r"/a\.S/(Get|List)\w*")), vec![]);
        assert!(matches(&r, "/a.S/GetUser", &md) && matches(&r, "/a.S/List", &md));
        assert!(!matches(&r, "/a.S/PutUser", &md), "another method");
        assert!(!matches(&r, "/x/a.S/GetUser", &md), "not a prefix match: the whole path");
        assert!(!matches(&r, "/a.s/getuser", &md), "case_sensitive false does not apply");
        let version = resources::HeaderMatch {
            name: "x-version".into(),
            kind: HeaderKind::Regex(re(r"v[0-9]+\.[0-9]+")),
            invert: false,
        };
        let r = route(PathMatch::Prefix("".into()), vec![version]);
        let mut v = Metadata::new();
        v.insert("x-version", "v2.10").expect("md");
        assert!(matches(&r, "/a.S/M", &v));
        let mut beta = Metadata::new();
        beta.insert("x-version", "v2.10-beta").expect("md");
        assert!(!matches(&r, "/a.S/M", &beta), "a whole-value match");
        assert!(!matches(&r, "/a.S/M", &md), "absent");
        // RE2 has no backreferences; neither has this engine: refused.
        let err = resources::Regex::new(r"(a)\1").expect_err("backreference");
        assert!(err.contains(r"(a)\1"), "{err}");
    }

    #[test]
    fn target_names() {
        assert_eq!(name_of("xds:///svc").expect("name"), "svc");
        assert_eq!(name_of("xds://auth/svc.ns").expect("name"), "svc.ns");
        assert_eq!(name_of("xds:svc").expect("name"), "svc");
        assert!(name_of("xds:///").is_err());
    }
}
