//! What the client reads of each xDS resource, validated as gRPC validates
//! it (gRFC A27, A28, A31, A44): a resource that does not validate is an
//! error naming the field, and the response carrying it is NACKed.
//!
//! Each parser takes the bytes of one `google.protobuf.Any` value, decodes
//! them with the generated decoder into a block and reads it through the
//! generated views.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use protoplane_grpc::status::Code;
use protoplane_rpc::config::RetryPolicy;
use protoplane_wire::DecodeOptions;

use crate::pb::envoy::config::cluster::v3 as cluster_pb;
use crate::pb::envoy::config::core::v3 as core_pb;
use crate::pb::envoy::config::endpoint::v3 as endpoint_pb;
use crate::pb::envoy::config::listener::v3 as listener_pb;
use crate::pb::envoy::config::route::v3 as route_pb;
use crate::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm_pb;
use crate::pb::google::protobuf as wkt;

/// The four resource types, by type URL.
pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ROUTE_CONFIG: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINTS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";

/// Why a resource was refused.
pub type Invalid = String;

/// A listener: where its routes are.
#[derive(Clone, Debug, PartialEq)]
pub struct Listener {
    pub name: String,
    pub routes: RouteSource,
    /// The connection manager's `max_stream_duration`: the timeout of
    /// routes that set none.
    pub max_stream_duration: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum RouteSource {
    /// A RouteConfiguration to subscribe to.
    Rds(String),
    Inline(RouteConfig),
}

#[derive(Clone, Debug, PartialEq)]
pub struct RouteConfig {
    pub name: String,
    pub virtual_hosts: Vec<VirtualHost>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct VirtualHost {
    pub domains: Vec<String>,
    pub routes: Vec<Route>,
    /// Used by routes without a retry policy of their own.
    pub retry: Option<RetryPolicy>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    pub path: PathMatch,
    pub case_sensitive: bool,
    pub headers: Vec<HeaderMatch>,
    /// Matches this share of calls, in millionths (`runtime_fraction`).
    pub fraction_per_million: Option<u32>,
    pub action: Action,
    pub timeout: Option<Duration>,
    pub retry: Option<RetryPolicy>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathMatch {
    Prefix(String),
    Exact(String),
    /// `safe_regex`: the whole path matches (the route's `case_sensitive`
    /// does not apply, as in gRFC A28).
    Regex(Regex),
}

/// A `safe_regex` (RE2 syntax), matched against a whole string. The
/// `regex` crate's engine is RE2's kind: time linear in the input, no
/// backreferences or lookaround (which RE2 refuses too), so a control
/// plane's pattern cannot make a call's matching slow. Its compiled size is
/// bounded ([`REGEX_SIZE_LIMIT`]); a pattern beyond it is refused (NACK).
#[derive(Clone, Debug)]
pub struct Regex(regex::Regex);

/// Compiled size allowed for one pattern (the `regex` crate's own default
/// is 10 MiB; route patterns are short).
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;

impl Regex {
    /// Compiles `pattern` to match whole strings.
    pub fn new(pattern: &str) -> Result<Regex, Invalid> {
        regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map(Regex)
            .map_err(|e| format!("regex {pattern:?}: {e}"))
    }

    /// Whether all of `s` matches.
    pub fn is_match(&self, s: &str) -> bool {
        self.0.is_match(s)
    }
}

impl PartialEq for Regex {
    fn eq(&self, other: &Regex) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Eq for Regex {}

#[derive(Clone, Debug, PartialEq)]
pub struct HeaderMatch {
    pub name: String,
    pub kind: HeaderKind,
    pub invert: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum HeaderKind {
    Exact(String, bool),
    Prefix(String, bool),
    Suffix(String, bool),
    Contains(String, bool),
    Present(bool),
    /// `[start, end)`.
    Range(i64, i64),
    /// The whole value matches.
    Regex(Regex),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Cluster(String),
    /// (cluster, weight), weights above 0.
    Weighted(Vec<(String, u32)>),
    /// A route for servers only: a client call matching it fails.
    NonForwarding,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cluster {
    pub name: String,
    /// The ClusterLoadAssignment to subscribe to (EDS clusters).
    pub eds_service_name: String,
    /// A LOGICAL_DNS cluster's `host:port` (gRFC A37): its endpoints are
    /// what DNS says of the name, not an EDS resource.
    pub logical_dns: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoints {
    pub name: String,
    pub localities: Vec<Locality>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Locality {
    pub name: String,
    pub weight: u32,
    pub priority: u32,
    /// (address, weight) of the endpoints that may take calls (healthy or
    /// of unknown health).
    pub endpoints: Vec<(SocketAddr, u32)>,
}

impl Endpoints {
    /// The endpoints of the best priority that has any, each weighted by
    /// its locality's weight times its own (gRPC's weighted target over
    /// localities, flattened into one weighted round robin).
    pub fn weighted(&self) -> Vec<(SocketAddr, u32)> {
        let best = self
            .localities
            .iter()
            .filter(|l| l.weight > 0 && !l.endpoints.is_empty())
            .map(|l| l.priority)
            .min();
        let Some(p) = best else { return Vec::new() };
        let mut out = Vec::new();
        for l in self.localities.iter().filter(|l| l.priority == p && l.weight > 0) {
            let total: u64 = l.endpoints.iter().map(|(_, w)| u64::from(*w)).sum();
            for &(a, w) in &l.endpoints {
                // The locality's share spread over its endpoints by weight,
                // scaled so integer weights keep the proportions.
                let share = u64::from(l.weight) * u64::from(w) * 1000 / total.max(1);
                out.push((a, share.clamp(1, u64::from(u32::MAX)) as u32));
            }
        }
        out
    }
}

fn decode_err(what: &str, e: impl std::fmt::Display) -> Invalid {
    format!("{what}: does not decode: {e}")
}

fn duration(d: Option<wkt::DurationView<'_>>) -> Option<Duration> {
    let d = d?;
    let (s, n) = (d.seconds(), d.nanos());
    if s < 0 || !(0..=999_999_999).contains(&n) {
        return None;
    }
    Some(Duration::from_secs(s as u64) + Duration::from_nanos(n as u64))
}

/// Parses a Listener (an API listener with an HTTP connection manager).
pub fn listener(wire: &[u8]) -> Result<Listener, Invalid> {
    let block = listener_pb::Listener::decode(wire, &DecodeOptions::default())
        .map_err(|e| decode_err("Listener", e))?;
    let l = listener_pb::ListenerView::from_block(block.as_bytes(), wire)
        .map_err(|e| decode_err("Listener", e))?;
    let name = l.name().to_string();
    let at = |f: &str| format!("Listener {name:?}: {f}");
    let api =
        l.api_listener().and_then(|a| a.api_listener()).ok_or_else(|| at("no api_listener"))?;
    if api.type_url() != HCM {
        return Err(at(&format!(
            "api_listener is a {}, not an HttpConnectionManager",
            api.type_url()
        )));
    }
    let hcm_wire = api.value();
    let hcm_block = hcm_pb::HttpConnectionManager::decode(hcm_wire, &DecodeOptions::default())
        .map_err(|e| at(&format!("HttpConnectionManager does not decode: {e}")))?;
    let hcm = hcm_pb::HttpConnectionManagerView::from_block(hcm_block.as_bytes(), hcm_wire)
        .map_err(|e| at(&format!("HttpConnectionManager: {e}")))?;
    // The filters must end with the router, as gRPC requires.
    let filters = hcm.http_filters();
    let Some(last) = filters.last() else {
        return Err(at("no http_filters (the router is required)"));
    };
    let last_type = match last.config_type() {
        Some(hcm_pb::http_filter::ConfigTypeOneof::TypedConfig(a)) => a.type_url(),
        None => "",
    };
    if last_type != ROUTER {
        return Err(at(&format!("the last http filter is {last_type:?}, not the router")));
    }
    let routes = match hcm.route_specifier() {
        Some(hcm_pb::http_connection_manager::RouteSpecifierOneof::Rds(rds)) => {
            let ads = matches!(
                rds.config_source().and_then(|c| c.config_source_specifier()),
                Some(core_pb::config_source::ConfigSourceSpecifierOneof::Ads(_))
                    | Some(core_pb::config_source::ConfigSourceSpecifierOneof::Self_(_))
            );
            if !ads {
                return Err(at("rds.config_source must be ads or self"));
            }
            if rds.route_config_name().is_empty() {
                return Err(at("rds.route_config_name is empty"));
            }
            RouteSource::Rds(rds.route_config_name().to_string())
        }
        Some(hcm_pb::http_connection_manager::RouteSpecifierOneof::RouteConfig(rc)) => {
            RouteSource::Inline(route_config_view(rc)?)
        }
        Some(hcm_pb::http_connection_manager::RouteSpecifierOneof::ScopedRoutes(_)) => {
            return Err(at("scoped_routes are not supported"))
        }
        None => return Err(at("no rds and no route_config")),
    };
    let max_stream_duration =
        duration(hcm.common_http_protocol_options().and_then(|o| o.max_stream_duration()))
            .filter(|d| !d.is_zero());
    Ok(Listener { name, routes, max_stream_duration })
}

/// Parses a RouteConfiguration.
pub fn route_config(wire: &[u8]) -> Result<RouteConfig, Invalid> {
    let block = route_pb::RouteConfiguration::decode(wire, &DecodeOptions::default())
        .map_err(|e| decode_err("RouteConfiguration", e))?;
    let rc = route_pb::RouteConfigurationView::from_block(block.as_bytes(), wire)
        .map_err(|e| decode_err("RouteConfiguration", e))?;
    route_config_view(rc)
}

fn route_config_view(rc: route_pb::RouteConfigurationView<'_>) -> Result<RouteConfig, Invalid> {
    let name = rc.name().to_string();
    let mut virtual_hosts = Vec::new();
    for (i, vh) in rc.virtual_hosts().iter().enumerate() {
        let at = |f: &str| format!("RouteConfiguration {name:?} virtual_hosts[{i}]: {f}");
        let retry = match vh.retry_policy() {
            Some(p) => retry_policy(p).map_err(|e| at(&e))?,
            None => None,
        };
        let mut routes = Vec::new();
        for (j, r) in vh.routes().iter().enumerate() {
            match route(r).map_err(|e| at(&format!("routes[{j}]: {e}")))? {
                Some(r) => routes.push(r),
                None => continue,
            }
        }
        let domains = vh.domains().iter().map(str::to_string).collect();
        virtual_hosts.push(VirtualHost { domains, routes, retry });
    }
    Ok(RouteConfig { name, virtual_hosts })
}

/// One route; `None` for a route gRPC skips (one it cannot match on).
fn route(r: route_pb::RouteView<'_>) -> Result<Option<Route>, Invalid> {
    let m = r.r#match().ok_or("no match")?;
    let path = match m.path_specifier() {
        Some(route_pb::route_match::PathSpecifierOneof::Prefix(p)) => PathMatch::Prefix(p.into()),
        Some(route_pb::route_match::PathSpecifierOneof::Path(p)) => PathMatch::Exact(p.into()),
        Some(route_pb::route_match::PathSpecifierOneof::SafeRegex(r)) => {
            PathMatch::Regex(Regex::new(r.regex())?)
        }
        Some(route_pb::route_match::PathSpecifierOneof::PathSeparatedPrefix(_)) => {
            return Err("path_separated_prefix is not supported".into())
        }
        None => return Err("match has no path specifier".into()),
    };
    let case_sensitive = m.case_sensitive().map(|b| b.value()).unwrap_or(true);
    let mut headers = Vec::new();
    for h in m.headers().iter() {
        headers.push(header(h)?);
    }
    let fraction_per_million = match m.runtime_fraction().and_then(|f| f.default_value()) {
        Some(p) => {
            let scale = match p.denominator() {
                0 => 10_000u64,
                1 => 100,
                2 => 1,
                d => return Err(format!("runtime_fraction denominator {d}")),
            };
            Some((u64::from(p.numerator()) * scale).min(1_000_000) as u32)
        }
        None => None,
    };
    let (action, timeout, retry) = match r.action() {
        Some(route_pb::route::ActionOneof::Route(a)) => {
            let action = match a.cluster_specifier() {
                Some(route_pb::route_action::ClusterSpecifierOneof::Cluster(c)) => {
                    if c.is_empty() {
                        return Err("route.cluster is empty".into());
                    }
                    Action::Cluster(c.into())
                }
                Some(route_pb::route_action::ClusterSpecifierOneof::WeightedClusters(w)) => {
                    let mut list = Vec::new();
                    for c in w.clusters().iter() {
                        let weight = c.weight().map(|v| v.value()).unwrap_or(0);
                        if c.name().is_empty() {
                            return Err("a weighted cluster without a name".into());
                        }
                        if weight > 0 {
                            list.push((c.name().to_string(), weight));
                        }
                    }
                    let total: u64 = list.iter().map(|(_, w)| u64::from(*w)).sum();
                    if total == 0 || total > u64::from(u32::MAX) {
                        return Err(format!("weighted_clusters total weight {total}"));
                    }
                    Action::Weighted(list)
                }
                // gRPC skips routes it cannot follow; so does this client.
                Some(route_pb::route_action::ClusterSpecifierOneof::ClusterHeader(_)) => {
                    return Ok(None)
                }
                Some(route_pb::route_action::ClusterSpecifierOneof::ClusterSpecifierPlugin(_)) => {
                    return Ok(None)
                }
                None => return Err("route action names no cluster".into()),
            };
            let msd = a.max_stream_duration();
            let timeout = duration(msd.and_then(|m| m.grpc_timeout_header_max()))
                .or_else(|| duration(msd.and_then(|m| m.max_stream_duration())))
                .filter(|d| !d.is_zero());
            let retry = match a.retry_policy() {
                Some(p) => retry_policy(p)?,
                None => None,
            };
            (action, timeout, retry)
        }
        Some(route_pb::route::ActionOneof::NonForwardingAction(_)) => {
            (Action::NonForwarding, None, None)
        }
        Some(_) => return Ok(None),
        None => return Err("no action".into()),
    };
    Ok(Some(Route { path, case_sensitive, headers, fraction_per_million, action, timeout, retry }))
}

fn header(h: route_pb::HeaderMatcherView<'_>) -> Result<HeaderMatch, Invalid> {
    use route_pb::header_matcher::HeaderMatchSpecifierOneof as S;
    let name = h.name().to_ascii_lowercase();
    let kind = match h.header_match_specifier() {
        Some(S::ExactMatch(v)) => HeaderKind::Exact(v.into(), false),
        Some(S::PrefixMatch(v)) => HeaderKind::Prefix(v.into(), false),
        Some(S::SuffixMatch(v)) => HeaderKind::Suffix(v.into(), false),
        Some(S::ContainsMatch(v)) => HeaderKind::Contains(v.into(), false),
        Some(S::PresentMatch(p)) => HeaderKind::Present(p),
        Some(S::RangeMatch(r)) => HeaderKind::Range(r.start(), r.end()),
        Some(S::StringMatch(s)) => {
            use crate::pb::envoy::r#type::matcher::v3::string_matcher::MatchPatternOneof as P;
            let ic = s.ignore_case();
            match s.match_pattern() {
                Some(P::Exact(v)) => HeaderKind::Exact(v.into(), ic),
                Some(P::Prefix(v)) => HeaderKind::Prefix(v.into(), ic),
                Some(P::Suffix(v)) => HeaderKind::Suffix(v.into(), ic),
                Some(P::Contains(v)) => HeaderKind::Contains(v.into(), ic),
                // `ignore_case` does not apply to a regex (Envoy's rule).
                Some(P::SafeRegex(r)) => HeaderKind::Regex(Regex::new(r.regex())?),
                None => return Err(format!("header {name:?}: an empty string matcher")),
            }
        }
        Some(S::SafeRegexMatch(r)) => HeaderKind::Regex(Regex::new(r.regex())?),
        None => return Err(format!("header {name:?}: no match specifier")),
    };
    Ok(HeaderMatch { name, kind, invert: h.invert_match() })
}

/// An xDS retry policy as a gRPC one (gRFC A44): the gRPC codes named in
/// `retry_on`, `num_retries` + 1 attempts (default 2, at most 5), backoff
/// from `retry_back_off` (25 ms base, ten times that at most, doubling).
/// `None` when no gRPC code is named.
fn retry_policy(p: route_pb::RetryPolicyView<'_>) -> Result<Option<RetryPolicy>, Invalid> {
    let mut codes = Vec::new();
    for c in p.retry_on().split(',').map(str::trim) {
        let code = match c {
            "cancelled" => Code::Cancelled,
            "deadline-exceeded" => Code::DeadlineExceeded,
            "internal" => Code::Internal,
            "resource-exhausted" => Code::ResourceExhausted,
            "unavailable" => Code::Unavailable,
            _ => continue,
        };
        if !codes.contains(&code) {
            codes.push(code);
        }
    }
    if codes.is_empty() {
        return Ok(None);
    }
    let retries = p.num_retries().map(|n| n.value()).unwrap_or(1);
    if retries == 0 {
        return Err("retry_policy.num_retries is 0".into());
    }
    let back = p.retry_back_off();
    let base = match back.and_then(|b| b.base_interval()) {
        Some(d) => {
            duration(Some(d)).filter(|d| !d.is_zero()).ok_or("retry_back_off.base_interval")?
        }
        None => Duration::from_millis(25),
    };
    let max = match back.and_then(|b| b.max_interval()) {
        Some(d) => duration(Some(d)).ok_or("retry_back_off.max_interval")?,
        None => base * 10,
    };
    if max < base {
        return Err("retry_back_off.max_interval below base_interval".into());
    }
    Ok(Some(RetryPolicy {
        max_attempts: (retries.saturating_add(1)).min(protoplane_rpc::config::MAX_ATTEMPTS),
        initial_backoff: base,
        max_backoff: max,
        backoff_multiplier: 2.0,
        retryable: codes,
    }))
}

/// Parses a Cluster (EDS only).
pub fn cluster(wire: &[u8]) -> Result<Cluster, Invalid> {
    let block = cluster_pb::Cluster::decode(wire, &DecodeOptions::default())
        .map_err(|e| decode_err("Cluster", e))?;
    let c = cluster_pb::ClusterView::from_block(block.as_bytes(), wire)
        .map_err(|e| decode_err("Cluster", e))?;
    let name = c.name().to_string();
    let at = |f: &str| format!("Cluster {name:?}: {f}");
    match c.cluster_discovery_type() {
        Some(cluster_pb::cluster::ClusterDiscoveryTypeOneof::Type(3)) => {}
        Some(cluster_pb::cluster::ClusterDiscoveryTypeOneof::Type(2)) => {
            match c.lb_policy() {
                0 => {}
                p => return Err(at(&format!("lb_policy {p} is not supported (ROUND_ROBIN is)"))),
            }
            let target = logical_dns(c).map_err(|why| at(&why))?;
            return Ok(Cluster {
                name,
                eds_service_name: String::new(),
                logical_dns: Some(target),
            });
        }
        Some(cluster_pb::cluster::ClusterDiscoveryTypeOneof::Type(t)) => {
            let kind = match t {
                0 => "STATIC",
                1 => "STRICT_DNS",
                4 => "ORIGINAL_DST",
                _ => "unknown",
            };
            return Err(at(&format!("type {kind} is not supported (EDS and LOGICAL_DNS are)")));
        }
        Some(cluster_pb::cluster::ClusterDiscoveryTypeOneof::ClusterType(t)) => {
            return Err(at(&format!("cluster_type {:?} is not supported", t.name())))
        }
        None => return Err(at("type STATIC is not supported (EDS and LOGICAL_DNS are)")),
    }
    let eds = c.eds_cluster_config();
    let ads = matches!(
        eds.and_then(|e| e.eds_config()).and_then(|s| s.config_source_specifier()),
        Some(core_pb::config_source::ConfigSourceSpecifierOneof::Ads(_))
            | Some(core_pb::config_source::ConfigSourceSpecifierOneof::Self_(_))
    );
    if !ads {
        return Err(at("eds_cluster_config.eds_config must be ads or self"));
    }
    match c.lb_policy() {
        0 => {}
        p => return Err(at(&format!("lb_policy {p} is not supported (ROUND_ROBIN is)"))),
    }
    let service = eds.map(|e| e.service_name()).unwrap_or("");
    let eds_service_name = if service.is_empty() { name.clone() } else { service.to_string() };
    Ok(Cluster { name, eds_service_name, logical_dns: None })
}

/// A LOGICAL_DNS cluster's name to resolve, `host:port`: its
/// `load_assignment` holds exactly one locality with exactly one endpoint,
/// a socket address with a `port_value` (gRFC A37's rule).
fn logical_dns(c: cluster_pb::ClusterView<'_>) -> Result<String, Invalid> {
    let la = c.load_assignment().ok_or("LOGICAL_DNS without a load_assignment")?;
    let locs: Vec<_> = la.endpoints().iter().collect();
    let [l] = locs.as_slice() else {
        return Err(format!("LOGICAL_DNS with {} localities (one is required)", locs.len()));
    };
    let eps: Vec<_> = l.lb_endpoints().iter().collect();
    let [e] = eps.as_slice() else {
        return Err(format!("LOGICAL_DNS with {} endpoints (one is required)", eps.len()));
    };
    let sa = match e.host_identifier() {
        Some(endpoint_pb::lb_endpoint::HostIdentifierOneof::Endpoint(ep)) => {
            match ep.address().and_then(|a| a.address()) {
                Some(core_pb::address::AddressOneof::SocketAddress(sa)) => sa,
                _ => return Err("a LOGICAL_DNS endpoint without a socket address".into()),
            }
        }
        _ => return Err("a LOGICAL_DNS endpoint without an address".into()),
    };
    let host = sa.address();
    let valid = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':');
    if host.is_empty() || host.len() > 253 || !host.bytes().all(valid) {
        return Err(format!("LOGICAL_DNS host {host:?} is not a host name"));
    }
    match sa.port_specifier() {
        Some(core_pb::socket_address::PortSpecifierOneof::PortValue(p)) if p > 0 && p <= 65535 => {
            Ok(if host.contains(':') { format!("[{host}]:{p}") } else { format!("{host}:{p}") })
        }
        _ => Err("a LOGICAL_DNS endpoint without a port_value".into()),
    }
}

/// Parses a ClusterLoadAssignment.
pub fn endpoints(wire: &[u8]) -> Result<Endpoints, Invalid> {
    let block = endpoint_pb::ClusterLoadAssignment::decode(wire, &DecodeOptions::default())
        .map_err(|e| decode_err("ClusterLoadAssignment", e))?;
    let cla = endpoint_pb::ClusterLoadAssignmentView::from_block(block.as_bytes(), wire)
        .map_err(|e| decode_err("ClusterLoadAssignment", e))?;
    let name = cla.cluster_name().to_string();
    let mut localities = Vec::new();
    for (i, l) in cla.endpoints().iter().enumerate() {
        let at = |f: &str| format!("ClusterLoadAssignment {name:?} endpoints[{i}]: {f}");
        let weight = l.load_balancing_weight().map(|w| w.value()).unwrap_or(0);
        let loc = l.locality();
        let lname = loc
            .map(|l| format!("{}/{}/{}", l.region(), l.zone(), l.sub_zone()))
            .unwrap_or_default();
        if localities.iter().any(|x: &Locality| x.name == lname && x.priority == l.priority()) {
            return Err(at(&format!("locality {lname:?} appears twice")));
        }
        let mut eps = Vec::new();
        for e in l.lb_endpoints().iter() {
            // HEALTHY and UNKNOWN take calls; the rest do not.
            if !matches!(e.health_status(), 0 | 1) {
                continue;
            }
            let ep = match e.host_identifier() {
                Some(endpoint_pb::lb_endpoint::HostIdentifierOneof::Endpoint(ep)) => ep,
                _ => return Err(at("an endpoint without an address")),
            };
            let sa = match ep.address().and_then(|a| a.address()) {
                Some(core_pb::address::AddressOneof::SocketAddress(sa)) => sa,
                _ => return Err(at("an endpoint without a socket address")),
            };
            let ip: IpAddr = sa
                .address()
                .parse()
                .map_err(|_| at(&format!("{:?} is not an IP address", sa.address())))?;
            let port = match sa.port_specifier() {
                Some(core_pb::socket_address::PortSpecifierOneof::PortValue(p))
                    if p > 0 && p <= 65535 =>
                {
                    p as u16
                }
                _ => return Err(at("an endpoint without a port_value")),
            };
            let w = e.load_balancing_weight().map(|w| w.value()).unwrap_or(1);
            if w == 0 {
                return Err(at("an endpoint weight of 0"));
            }
            eps.push((SocketAddr::new(ip, port), w));
        }
        localities.push(Locality { name: lname, weight, priority: l.priority(), endpoints: eps });
    }
    Ok(Endpoints { name, localities })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::pb::envoy::config::endpoint::v3::*;
    use protoplane_wire::{EncodeOptions, Encoder, Source};

    /// The wire bytes of the message `f` builds in `b`, encoded by `ty`
    /// (the crate's tests build resources with this).
    pub(crate) fn encode(
        f: impl FnOnce(&mut protoplane_wire::Builder<'static>),
        ty: fn(&mut Encoder, Source<'_>, &EncodeOptions) -> Vec<u8>,
        mut b: protoplane_wire::Builder<'static>,
    ) -> Vec<u8> {
        f(&mut b);
        let block = b.finish();
        let mut enc = Encoder::new();
        ty(&mut enc, Source::owned(block.as_bytes()), &EncodeOptions::default())
    }

    fn cla_bytes(e: &mut Encoder, s: Source<'_>, o: &EncodeOptions) -> Vec<u8> {
        ClusterLoadAssignment::encode(e, s, o).expect("encodes").to_vec()
    }

    #[test]
    fn endpoints_of_the_best_priority_weighted_by_locality() {
        let wire = encode(
            |b| {
                let mut cla = ClusterLoadAssignmentBuilder::root(b);
                cla.set_cluster_name("c1").expect("name");
                for (zone, weight, priority, ports) in
                    [("a", 3, 0, vec![1u32, 2]), ("b", 1, 0, vec![3]), ("c", 5, 1, vec![4])]
                {
                    let mut l = cla.add_endpoints().expect("locality");
                    l.locality().expect("loc").set_zone(zone).expect("zone");
                    l.load_balancing_weight().expect("w").set_value(weight);
                    l.set_priority(priority);
                    for port in ports {
                        let mut e = l.add_lb_endpoints().expect("endpoint");
                        let mut ep = e.endpoint().expect("ep");
                        let mut a = ep.address().expect("address");
                        let mut sa = a.socket_address().expect("sa");
                        sa.set_address("127.0.0.1").expect("ip").set_port_value(port);
                    }
                }
            },
            cla_bytes,
            ClusterLoadAssignment::builder(),
        );
        let e = endpoints(&wire).expect("valid");
        assert_eq!(e.localities.len(), 3);
        let w = e.weighted();
        let ports: Vec<(u16, u32)> = w.iter().map(|(a, w)| (a.port(), *w)).collect();
        // Zone a (weight 3) splits 3000 over two endpoints; zone b has 1000;
        // priority 1 is not used while priority 0 has endpoints.
        assert_eq!(ports, vec![(1, 1500), (2, 1500), (3, 1000)]);
    }

    /// A route configuration with one route whose path is `safe_regex`
    /// `pattern`, to cluster c1.
    fn regex_route(pattern: &str) -> Vec<u8> {
        use crate::pb::envoy::config::route::v3 as r;
        encode(
            |b| {
                let mut rc = r::RouteConfigurationBuilder::root(b);
                rc.set_name("rc").expect("name");
                let mut vh = rc.add_virtual_hosts().expect("vhost");
                vh.push_domains("*").expect("domain");
                let mut route = vh.add_routes().expect("route");
                let mut m = route.r#match().expect("match");
                m.safe_regex().expect("regex").set_regex(pattern).expect("pattern");
                route.route().expect("action").set_cluster("c1").expect("cluster");
            },
            |e, s, o| r::RouteConfiguration::encode(e, s, o).expect("encodes").to_vec(),
            r::RouteConfiguration::builder(),
        )
    }

    #[test]
    fn a_safe_regex_path_is_read_and_a_bad_one_refused() {
        let rc = route_config(&regex_route(r"/svc\.S/.*")).expect("valid");
        let PathMatch::Regex(re) = &rc.virtual_hosts[0].routes[0].path else {
            panic!("not a regex: {:?}", rc.virtual_hosts[0].routes[0].path);
        };
        assert!(re.is_match("/svc.S/M") && !re.is_match("/svcxS/M"));
        let err = route_config(&regex_route("(unclosed")).expect_err("refused");
        assert!(err.contains("(unclosed"), "{err}");
    }

    /// A LOGICAL_DNS cluster whose load assignment has `endpoints`
    /// (host, port) in one locality.
    fn dns_cluster(endpoints: &[(&str, u32)]) -> Vec<u8> {
        use crate::pb::envoy::config::cluster::v3 as c;
        encode(
            |b| {
                let mut cl = c::ClusterBuilder::root(b);
                cl.set_name("d").expect("name");
                cl.set_type(2);
                let mut la = cl.load_assignment().expect("la");
                la.set_cluster_name("d").expect("name");
                let mut l = la.add_endpoints().expect("locality");
                for (host, port) in endpoints {
                    let mut e = l.add_lb_endpoints().expect("endpoint");
                    let mut ep = e.endpoint().expect("ep");
                    let mut a = ep.address().expect("address");
                    let mut sa = a.socket_address().expect("sa");
                    sa.set_address(host).expect("host");
                    if *port > 0 {
                        sa.set_port_value(*port);
                    }
                }
            },
            |e, s, o| c::Cluster::encode(e, s, o).expect("encodes").to_vec(),
            c::Cluster::builder(),
        )
    }

    #[test]
    fn a_logical_dns_cluster_names_one_host_and_port() {
        let c = cluster(&dns_cluster(&[("backend.example", 8443)])).expect("valid");
        assert_eq!(c.logical_dns.as_deref(), Some("backend.example:8443"));
        let c = cluster(&dns_cluster(&[("::1", 50051)])).expect("valid");
        assert_eq!(c.logical_dns.as_deref(), Some("[::1]:50051"));
        for (eps, why) in [
            (&[("a", 1), ("b", 2)][..], "2 endpoints"),
            (&[("a", 0)][..], "port_value"),
            (&[("a b", 1)][..], "not a host name"),
            (&[][..], "0 endpoints"),
        ] {
            let err = cluster(&dns_cluster(eps)).expect_err(why);
            assert!(err.contains(why), "{why}: {err}");
        }
    }

    #[test]
    fn an_endpoint_without_a_port_is_refused() {
        let wire = encode(
            |b| {
                let mut cla = ClusterLoadAssignmentBuilder::root(b);
                cla.set_cluster_name("c1").expect("name");
                let mut l = cla.add_endpoints().expect("locality");
                let mut e = l.add_lb_endpoints().expect("endpoint");
                let mut ep = e.endpoint().expect("ep");
                let mut a = ep.address().expect("address");
                a.socket_address().expect("sa").set_address("127.0.0.1").expect("ip");
            },
            cla_bytes,
            ClusterLoadAssignment::builder(),
        );
        let err = endpoints(&wire).expect_err("no port");
        assert!(err.contains("port_value"), "{err}");
        assert!(endpoints(&[0x0a, 0x05, 1]).is_err(), "truncated bytes");
    }
}
