//! Per-application policy: what the engine decides about a call before it
//! reaches an application (mRPC's ACL, rate-limit and QoS policies, run in
//! the RPC service rather than linked into each application).
//!
//! ```toml
//! [policy]
//! default = "allow"          # what a call no rule matches gets ("allow" or "deny")
//! max_calls = 2048           # calls open in the engine at once; priorities share it
//! retry_after_ms = 20        # RetryInfo's delay for concurrency refusals
//!
//! [[policy.rules]]           # in order; the first rule that matches decides
//! action = "deny"
//! methods = ["/socialnetwork.SocialNetwork/Login"]
//! clients = ["metadata:x-tenant=guest"]
//!
//! [[policy.rules]]
//! action = "allow"
//! methods = ["/grpc.testing.TestService/*"]   # a method, a service's methods, or "*"
//! clients = ["cn:admin", "san:ops.example.com", "subject:O=Example"]
//!
//! [policy.limits."socialnetwork.SocialNetwork"]          # an application (its service)
//! rate = 5000                # calls per second, token bucket ...
//! burst = 200                # ... holding this many
//! concurrency = 256          # calls open at once
//! priority = "high"          # "high", "normal" (default) or "low"
//!
//! [policy.limits."/socialnetwork.SocialNetwork/ReadTimeline"]  # one method
//! rate = 100
//! ```
//!
//! **Who a client is.** A rule's `clients` match when any entry does:
//! `any`; `anonymous` (no client certificate); `cn:NAME` (the verified
//! mutual-TLS certificate's subject common name); `subject:ATTR=VALUE` (an
//! attribute of the subject, e.g. `subject:O=Example`, `subject:OU=ops`);
//! `san:NAME` (a DNS name, URI, e-mail or IP address among the certificate's
//! subject alternative names); `metadata:KEY=VALUE` or `metadata:KEY` (the
//! call's metadata, as the client sent it). No `clients`: every client.
//! The certificate is the one the TLS listener verified against
//! `listen.tls_client_ca`; it is parsed only when a rule asks about it.
//!
//! **Refusals.** A denied call ends PERMISSION_DENIED naming the rule. A
//! call over a limit ends RESOURCE_EXHAUSTED with a `RetryInfo` detail
//! (for a rate: when the next token is due; otherwise `retry_after_ms`) and
//! a `QuotaFailure` naming the limit. Neither reaches an application.
//!
//! **Priority.** When `max_calls` is set, a call is admitted only while the
//! engine has fewer than a share of it open: all of it for `high`
//! applications, 80% for `normal`, 50% for `low`. Under saturation the
//! low-priority applications are refused first and the high-priority ones
//! keep the last fifth to themselves (the overload shedding of Envoy's
//! priority circuit breakers, in one counter).
//!
//! **Changing it at run time.** [`Policies::install`] swaps the whole
//! policy between two calls: a call admitted under the old one keeps its
//! place and finishes. Concurrency counters and token buckets belong to
//! the name they limit, not to one version of the policy, so the calls in
//! flight count against the new limits at once and a reload never refills
//! a bucket.
//!
//! **Cost.** With no `[policy]` a call pays one read lock and an `Arc`
//! clone. Rules are checked in order by string comparison; each limit is
//! one hash lookup and an atomic or two; the clock is read only when a rate
//! is set. `protoplane bench split` reports it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use protoplane_grpc::rich::{ErrorDetail, QuotaFailure, QuotaViolation, RetryInfo};
use protoplane_grpc::{Code, Metadata, Peer, Status};

/// What a matching rule, or the default, does with a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// The call goes on to the limits and then to an application.
    Allow,
    /// PERMISSION_DENIED.
    Deny,
}

/// Which methods a rule is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Methods {
    /// Every method of every service.
    Any,
    /// Every method of one service (`/pkg.Service/*`).
    Service(String),
    /// One method (`/pkg.Service/Method`).
    Method(String),
}

impl Methods {
    fn parse(s: &str) -> Result<Methods, String> {
        if s == "*" {
            return Ok(Methods::Any);
        }
        let Some((service, method)) = s.strip_prefix('/').and_then(|r| r.split_once('/')) else {
            return Err(format!("{s:?}: a method (/pkg.Service/Method), /pkg.Service/* or *"));
        };
        if service.is_empty() || method.is_empty() || method.contains('/') {
            return Err(format!("{s:?}: a method (/pkg.Service/Method), /pkg.Service/* or *"));
        }
        Ok(match method {
            "*" => Methods::Service(service.to_string()),
            _ => Methods::Method(s.to_string()),
        })
    }

    fn matches(&self, call: &CallInfo<'_>) -> bool {
        match self {
            Methods::Any => true,
            Methods::Service(s) => s == call.service,
            Methods::Method(p) => p == call.path,
        }
    }
}

/// Who a rule is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Client {
    /// Everyone.
    Any,
    /// A client with no certificate.
    Anonymous,
    /// The certificate's subject common name.
    CommonName(String),
    /// An attribute of the certificate's subject (`O`, `OU`, `CN`, ...).
    Subject {
        /// Its short name, as in `O=Example`.
        attr: String,
        /// Its value.
        value: String,
    },
    /// A subject alternative name (DNS, URI, e-mail, IP).
    San(String),
    /// A metadata entry, with this value or (`None`) any.
    Metadata {
        /// Its key (lower case, as on the wire).
        key: String,
        /// The value it must have.
        value: Option<String>,
    },
}

impl Client {
    fn parse(s: &str) -> Result<Client, String> {
        let bad = || {
            format!(
                "{s:?}: any, anonymous, cn:NAME, subject:ATTR=VALUE, san:NAME, \
                 metadata:KEY or metadata:KEY=VALUE"
            )
        };
        match s {
            "any" => return Ok(Client::Any),
            "anonymous" => return Ok(Client::Anonymous),
            _ => {}
        }
        let (kind, rest) = s.split_once(':').ok_or_else(bad)?;
        if rest.is_empty() {
            return Err(bad());
        }
        Ok(match kind {
            "cn" => Client::CommonName(rest.to_string()),
            "san" => Client::San(rest.to_string()),
            "subject" => {
                let (attr, value) = rest.split_once('=').ok_or_else(bad)?;
                if attr.is_empty() {
                    return Err(bad());
                }
                Client::Subject { attr: attr.to_string(), value: value.to_string() }
            }
            "metadata" => {
                let (key, value) = match rest.split_once('=') {
                    Some((k, v)) => (k, Some(v.to_string())),
                    None => (rest, None),
                };
                if key.is_empty() {
                    return Err(bad());
                }
                Client::Metadata { key: key.to_ascii_lowercase(), value }
            }
            _ => return Err(bad()),
        })
    }

    fn needs_certificate(&self) -> bool {
        matches!(self, Client::CommonName(_) | Client::Subject { .. } | Client::San(_))
    }

    fn matches(&self, call: &CallInfo<'_>, id: &Identity) -> bool {
        match self {
            Client::Any => true,
            Client::Anonymous => call.peer.is_none_or(|p| p.certificates.is_empty()),
            Client::CommonName(n) => id.subject.iter().any(|(a, v)| a == "CN" && v == n),
            Client::Subject { attr, value } => {
                id.subject.iter().any(|(a, v)| a.eq_ignore_ascii_case(attr) && v == value)
            }
            Client::San(n) => id.sans.iter().any(|s| s == n),
            Client::Metadata { key, value } => match value {
                None => call.metadata.iter().any(|(k, _)| k == key),
                Some(v) => call.metadata.get_all(key).any(|got| got == v.as_bytes()),
            },
        }
    }
}

/// One access rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// What it does when it matches.
    pub action: Action,
    /// The methods it is about (any of them).
    pub methods: Vec<Methods>,
    /// The clients it is about (any of them; empty: every client).
    pub clients: Vec<Client>,
}

impl Rule {
    fn needs_certificate(&self) -> bool {
        self.clients.iter().any(Client::needs_certificate)
    }
}

/// An application's share of the engine when it is saturated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Priority {
    /// All of `max_calls`.
    High,
    /// 80% of it.
    #[default]
    Normal,
    /// 50% of it.
    Low,
}

impl Priority {
    /// How many of `max_calls` calls may be open when one of this priority
    /// is admitted.
    fn share(self, max_calls: u64) -> u64 {
        match self {
            Priority::High => max_calls,
            Priority::Normal => max_calls.saturating_mul(4) / 5,
            Priority::Low => max_calls / 2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }
}

/// The limits of one application (a service) or one method.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Limit {
    /// Calls per second, refilling a bucket of `burst` tokens.
    pub rate: Option<f64>,
    /// The bucket's size (default: a tenth of a second's rate, at least 1).
    pub burst: Option<u64>,
    /// Calls open at once.
    pub concurrency: Option<u64>,
    /// Under saturation (only for an application).
    pub priority: Option<Priority>,
}

/// A policy as configured: `[policy]`.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicySpec {
    /// What a call no rule matches gets.
    pub default: Action,
    /// Access rules, in order.
    pub rules: Vec<Rule>,
    /// Limits by application (`pkg.Service`) or method (`/pkg.Service/M`).
    pub limits: Vec<(String, Limit)>,
    /// Calls open in the engine at once, shared by priority.
    pub max_calls: Option<u64>,
    /// RetryInfo's delay when a concurrency or priority limit refuses.
    pub retry_after: Duration,
}

impl Default for PolicySpec {
    fn default() -> Self {
        PolicySpec {
            default: Action::Allow,
            rules: Vec::new(),
            limits: Vec::new(),
            max_calls: None,
            retry_after: Duration::from_millis(20),
        }
    }
}

fn uint(v: &toml::Value, key: &str) -> Result<u64, String> {
    v.as_integer()
        .and_then(|i| u64::try_from(i).ok())
        .ok_or_else(|| format!("{key} must be a non-negative integer"))
}

fn strings(v: &toml::Value, key: &str) -> Result<Vec<String>, String> {
    let list = v.as_array().ok_or_else(|| format!("{key} must be an array of strings"))?;
    list.iter()
        .map(|s| s.as_str().map(str::to_string).ok_or_else(|| format!("{key}: strings only")))
        .collect()
}

fn action(v: &toml::Value, key: &str) -> Result<Action, String> {
    match v.as_str() {
        Some("allow") => Ok(Action::Allow),
        Some("deny") => Ok(Action::Deny),
        _ => Err(format!("{key}: \"allow\" or \"deny\"")),
    }
}

impl PolicySpec {
    /// Reads the `[policy]` table of a configuration; unknown keys are
    /// refused by name.
    pub fn from_toml(t: &toml::Table) -> Result<PolicySpec, String> {
        let mut p = PolicySpec::default();
        for (key, v) in t {
            let k = format!("policy.{key}");
            match key.as_str() {
                "default" => p.default = action(v, &k)?,
                "max_calls" => p.max_calls = Some(uint(v, &k)?.max(1)),
                "retry_after_ms" => p.retry_after = Duration::from_millis(uint(v, &k)?.max(1)),
                "rules" => {
                    let rules = v.as_array().ok_or_else(|| format!("{k}: [[policy.rules]]"))?;
                    for (i, r) in rules.iter().enumerate() {
                        p.rules.push(Self::rule(r, &format!("{k}[{i}]"))?);
                    }
                }
                "limits" => {
                    let t = v.as_table().ok_or_else(|| format!("{k} must be a table"))?;
                    for (scope, l) in t {
                        let at = format!("{k}.{scope:?}");
                        p.limits.push((scope.clone(), Self::limit(scope, l, &at)?));
                    }
                }
                _ => return Err(format!("config: unknown key {k}")),
            }
        }
        Ok(p)
    }

    fn rule(v: &toml::Value, at: &str) -> Result<Rule, String> {
        let t = v.as_table().ok_or_else(|| format!("{at} must be a table"))?;
        let mut r =
            Rule { action: Action::Allow, methods: vec![Methods::Any], clients: Vec::new() };
        let mut has_action = false;
        for (key, v) in t {
            let k = format!("{at}.{key}");
            match key.as_str() {
                "action" => {
                    r.action = action(v, &k)?;
                    has_action = true;
                }
                "methods" => {
                    r.methods = strings(v, &k)?
                        .iter()
                        .map(|m| Methods::parse(m).map_err(|e| format!("{k}: {e}")))
                        .collect::<Result<_, _>>()?
                }
                "clients" => {
                    r.clients = strings(v, &k)?
                        .iter()
                        .map(|c| Client::parse(c).map_err(|e| format!("{k}: {e}")))
                        .collect::<Result<_, _>>()?
                }
                _ => return Err(format!("config: unknown key {k}")),
            }
        }
        if !has_action {
            return Err(format!("{at}: needs action = \"allow\" or \"deny\""));
        }
        Ok(r)
    }

    fn limit(scope: &str, v: &toml::Value, at: &str) -> Result<Limit, String> {
        let method = scope.starts_with('/');
        if method {
            if !matches!(Methods::parse(scope), Ok(Methods::Method(_))) {
                return Err(format!("{at}: a service (pkg.Service) or a method (/pkg.Service/M)"));
            }
        } else if scope.is_empty() || scope.contains('/') || scope == "*" {
            return Err(format!("{at}: a service (pkg.Service) or a method (/pkg.Service/M)"));
        }
        let t = v.as_table().ok_or_else(|| format!("{at} must be a table"))?;
        let mut l = Limit::default();
        for (key, v) in t {
            let k = format!("{at}.{key}");
            match key.as_str() {
                "rate" => {
                    let r = v
                        .as_float()
                        .or_else(|| v.as_integer().map(|i| i as f64))
                        .filter(|r| r.is_finite() && *r > 0.0)
                        .ok_or_else(|| format!("{k}: calls per second, above 0"))?;
                    l.rate = Some(r.min(1e9));
                }
                "burst" => l.burst = Some(uint(v, &k)?.max(1)),
                "concurrency" => l.concurrency = Some(uint(v, &k)?),
                "priority" if !method => {
                    l.priority = Some(match v.as_str() {
                        Some("high") => Priority::High,
                        Some("normal") => Priority::Normal,
                        Some("low") => Priority::Low,
                        _ => return Err(format!("{k}: \"high\", \"normal\" or \"low\"")),
                    })
                }
                "priority" => return Err(format!("{k}: priority is set per application")),
                _ => return Err(format!("config: unknown key {k}")),
            }
        }
        if l.burst.is_some() && l.rate.is_none() {
            return Err(format!("{at}: burst needs a rate"));
        }
        Ok(l)
    }

    /// Checks every service and method the policy names against those the
    /// engine serves (`paths`: `/pkg.Service/Method`), so a typo is an
    /// error rather than a rule that never matches.
    pub fn check_names(&self, paths: &[String]) -> Result<(), String> {
        let service_known =
            |s: &str| paths.iter().any(|p| p[1..].split_once('/').is_some_and(|(sv, _)| sv == s));
        let method_known = |m: &str| paths.iter().any(|p| p == m);
        for (i, r) in self.rules.iter().enumerate() {
            for m in &r.methods {
                let ok = match m {
                    Methods::Any => true,
                    Methods::Service(s) => service_known(s),
                    Methods::Method(p) => method_known(p),
                };
                if !ok {
                    return Err(format!("policy.rules[{i}]: the engine serves no {m:?}"));
                }
            }
        }
        for (scope, _) in &self.limits {
            let ok = match scope.starts_with('/') {
                true => method_known(scope),
                false => service_known(scope),
            };
            if !ok {
                return Err(format!("policy.limits.{scope:?}: the engine serves no such thing"));
            }
        }
        Ok(())
    }

    fn is_empty(&self) -> bool {
        self.rules.is_empty()
            && self.default == Action::Allow
            && self.limits.is_empty()
            && self.max_calls.is_none()
    }
}

/// What a call is, for the policy.
#[derive(Clone, Copy, Debug)]
pub struct CallInfo<'a> {
    /// `/pkg.Service/Method`.
    pub path: &'a str,
    /// `pkg.Service`.
    pub service: &'a str,
    /// The metadata the client sent.
    pub metadata: &'a Metadata,
    /// Its connection.
    pub peer: Option<&'a Peer>,
}

/// The parts of a client certificate rules look at.
#[derive(Debug, Default)]
struct Identity {
    /// Subject attributes, short name and value (`("CN", "admin")`).
    subject: Vec<(String, String)>,
    /// Subject alternative names, as text (IP addresses in their usual
    /// notation).
    sans: Vec<String>,
}

impl Identity {
    /// Reads the leaf certificate, if any. One that does not parse (the TLS
    /// listener verified it, so this does not happen in practice) is no
    /// identity at all: it matches no certificate rule.
    fn of(peer: Option<&Peer>) -> Identity {
        use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
        let mut id = Identity::default();
        let Some(der) = peer.and_then(Peer::certificate) else { return id };
        let Ok((_, cert)) = X509Certificate::from_der(der) else { return id };
        let registry = x509_parser::objects::oid_registry();
        for attr in cert.subject().iter_attributes() {
            let (Ok(name), Ok(value)) =
                (x509_parser::objects::oid2abbrev(attr.attr_type(), registry), attr.as_str())
            else {
                continue;
            };
            id.subject.push((name.to_string(), value.to_string()));
        }
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for n in &san.value.general_names {
                match n {
                    GeneralName::DNSName(s) | GeneralName::URI(s) | GeneralName::RFC822Name(s) => {
                        id.sans.push(s.to_string())
                    }
                    GeneralName::IPAddress(b) => {
                        if let Ok(a) = <[u8; 4]>::try_from(*b) {
                            id.sans.push(std::net::Ipv4Addr::from(a).to_string());
                        } else if let Ok(a) = <[u8; 16]>::try_from(*b) {
                            id.sans.push(std::net::Ipv6Addr::from(a).to_string());
                        }
                    }
                    _ => {}
                }
            }
        }
        id
    }
}

/// A token bucket as a generic cell rate algorithm: one atomic holding the
/// time (ns since the engine's epoch) at which the bucket would be full
/// again. A call is admitted if taking its token leaves that time no more
/// than `burst` intervals ahead of now.
#[derive(Debug, Default)]
struct Bucket {
    /// The theoretical arrival time of the next call, ns since `epoch`.
    tat: AtomicU64,
}

impl Bucket {
    /// `Ok` and the token taken, or how long until one is there.
    fn take(&self, now: u64, interval: u64, tolerance: u64) -> Result<(), Duration> {
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let next = tat.max(now).saturating_add(interval);
            if next - now > tolerance.saturating_add(interval) {
                return Err(Duration::from_nanos(next - now - tolerance - interval));
            }
            match self.tat.compare_exchange_weak(tat, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(t) => tat = t,
            }
        }
    }
}

/// The state of one limited name, kept across reloads.
#[derive(Debug, Default)]
struct Counters {
    open: AtomicU64,
    bucket: Bucket,
}

/// One limit of the installed policy with its state.
#[derive(Debug)]
struct Limiter {
    scope: String,
    /// ns between tokens, and how many ns of tokens the bucket holds.
    rate: Option<(u64, u64)>,
    concurrency: Option<u64>,
    state: Arc<Counters>,
}

/// An installed policy.
#[derive(Debug)]
struct Active {
    spec: PolicySpec,
    empty: bool,
    certificates: bool,
    limits: HashMap<String, Limiter>,
    priorities: HashMap<String, Priority>,
    version: u64,
}

/// What the policy did, since the engine started.
#[derive(Debug, Default)]
pub struct PolicyStats {
    /// Calls the policy let through.
    pub admitted: AtomicU64,
    /// Calls an access rule (or the default) denied.
    pub denied: AtomicU64,
    /// Calls refused by a rate limit.
    pub rate_limited: AtomicU64,
    /// Calls refused by a concurrency limit.
    pub concurrency_limited: AtomicU64,
    /// Calls refused because the engine was saturated for their priority.
    pub shed: AtomicU64,
}

/// The engine's policy, replaceable at run time.
#[derive(Debug)]
pub struct Policies {
    active: RwLock<Arc<Active>>,
    /// Per limited name, across versions.
    counters: Mutex<HashMap<String, Arc<Counters>>>,
    /// Calls open in the engine (those the policy admitted while
    /// `max_calls` was set count; see [`Permit`]).
    open: Arc<AtomicU64>,
    epoch: Instant,
    /// The methods the engine serves, for [`PolicySpec::check_names`].
    paths: Vec<String>,
    /// Counts.
    pub stats: PolicyStats,
}

/// A call's place under the policy: while it lives the call counts against
/// the concurrency limits that admitted it.
#[derive(Debug, Default)]
pub struct Permit {
    /// The application's and the method's counters (no allocation per
    /// call).
    held: [Option<Arc<Counters>>; 2],
    engine: Option<Arc<AtomicU64>>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        for c in self.held.iter().flatten() {
            c.open.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(e) = &self.engine {
            e.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

fn exhausted(what: String, subject: &str, retry: Duration) -> Status {
    Status::with_error_details_vec(
        Code::ResourceExhausted,
        what.clone(),
        vec![
            ErrorDetail::RetryInfo(RetryInfo { retry_delay: Some(retry) }),
            ErrorDetail::QuotaFailure(QuotaFailure {
                violations: vec![QuotaViolation {
                    subject: subject.to_string(),
                    description: what,
                }],
            }),
        ],
    )
}

impl Policies {
    /// The policy `spec` over an engine serving `paths`
    /// (`/pkg.Service/Method`).
    pub fn new(spec: PolicySpec, paths: Vec<String>) -> Result<Policies, String> {
        let p = Policies {
            active: RwLock::new(Arc::new(Active {
                spec: PolicySpec::default(),
                empty: true,
                certificates: false,
                limits: HashMap::new(),
                priorities: HashMap::new(),
                version: 0,
            })),
            counters: Mutex::default(),
            open: Arc::default(),
            epoch: Instant::now(),
            paths,
            stats: PolicyStats::default(),
        };
        p.install(spec)?;
        Ok(p)
    }

    /// The installed policy.
    pub fn spec(&self) -> PolicySpec {
        self.current().spec.clone()
    }

    /// How many times a policy was installed (1 for the first).
    pub fn version(&self) -> u64 {
        self.current().version
    }

    /// Calls open that count against `max_calls`.
    pub fn open_calls(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    fn current(&self) -> Arc<Active> {
        // A poisoned lock still holds a whole policy: installs replace the
        // `Arc` in one store.
        self.active.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the policy (calls already admitted are not looked at
    /// again). Refused, with the old one kept, if it names a service or
    /// method the engine does not serve.
    pub fn install(&self, spec: PolicySpec) -> Result<(), String> {
        spec.check_names(&self.paths)?;
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        let mut limits = HashMap::new();
        let mut priorities = HashMap::new();
        for (scope, l) in &spec.limits {
            if let Some(p) = l.priority {
                priorities.insert(scope.clone(), p);
            }
            if l.rate.is_none() && l.concurrency.is_none() {
                continue;
            }
            let state = counters.entry(scope.clone()).or_default().clone();
            let rate = l.rate.map(|r| {
                let interval = (1e9 / r).max(1.0) as u64;
                let burst = l.burst.unwrap_or(((r / 10.0) as u64).max(1));
                (interval, interval.saturating_mul(burst - 1))
            });
            limits.insert(
                scope.clone(),
                Limiter { scope: scope.clone(), rate, concurrency: l.concurrency, state },
            );
        }
        // Names no longer limited lose their state once no call holds it.
        counters.retain(|name, c| limits.contains_key(name) || Arc::strong_count(c) > 1);
        drop(counters);
        let mut active = self.active.write().unwrap_or_else(|e| e.into_inner());
        let version = active.version + 1;
        *active = Arc::new(Active {
            empty: spec.is_empty(),
            certificates: spec.rules.iter().any(Rule::needs_certificate),
            spec,
            limits,
            priorities,
            version,
        });
        Ok(())
    }

    /// Decides about a call before it reaches an application: `Ok` with the
    /// place it holds while it runs, or the status it ends with.
    pub fn admit(&self, call: &CallInfo<'_>) -> Result<Permit, Status> {
        let p = self.current();
        if p.empty {
            return Ok(Permit::default());
        }
        let id = match p.certificates {
            true => Identity::of(call.peer),
            false => Identity::default(),
        };
        let mut action = p.spec.default;
        let mut by = None;
        for (i, r) in p.spec.rules.iter().enumerate() {
            let method = r.methods.iter().any(|m| m.matches(call));
            if method && (r.clients.is_empty() || r.clients.iter().any(|c| c.matches(call, &id))) {
                action = r.action;
                by = Some(i);
                break;
            }
        }
        if action == Action::Deny {
            self.stats.denied.fetch_add(1, Ordering::Relaxed);
            let why = match by {
                Some(i) => format!("{} denied by policy rule {i}", call.path),
                None => format!("{} denied by policy (no rule allows it)", call.path),
            };
            return Err(Status::new(Code::PermissionDenied, why));
        }
        let mut permit = Permit::default();
        if let Some(max) = p.spec.max_calls {
            let prio = p.priorities.get(call.service).copied().unwrap_or_default();
            let share = prio.share(max);
            let before = self.open.fetch_add(1, Ordering::Relaxed);
            permit.engine = Some(self.open.clone());
            if before >= share {
                self.stats.shed.fetch_add(1, Ordering::Relaxed);
                return Err(exhausted(
                    format!(
                        "the engine is saturated: {before} calls open, {share} allowed for \
                         {} priority ({})",
                        prio.name(),
                        call.service
                    ),
                    call.service,
                    p.spec.retry_after,
                ));
            }
        }
        let mut now = None;
        for (k, scope) in [call.service, call.path].into_iter().enumerate() {
            let Some(l) = p.limits.get(scope) else { continue };
            if let Some(max) = l.concurrency {
                let before = l.state.open.fetch_add(1, Ordering::Relaxed);
                permit.held[k] = Some(l.state.clone());
                if before >= max {
                    self.stats.concurrency_limited.fetch_add(1, Ordering::Relaxed);
                    return Err(exhausted(
                        format!("{} has {before} calls open, its limit is {max}", l.scope),
                        &l.scope,
                        p.spec.retry_after,
                    ));
                }
            }
            if let Some((interval, tolerance)) = l.rate {
                let t = *now.get_or_insert_with(|| self.epoch.elapsed().as_nanos() as u64);
                if let Err(wait) = l.state.bucket.take(t, interval, tolerance) {
                    self.stats.rate_limited.fetch_add(1, Ordering::Relaxed);
                    return Err(exhausted(
                        format!("{} is over its rate limit", l.scope),
                        &l.scope,
                        wait.max(Duration::from_millis(1)),
                    ));
                }
            }
        }
        self.stats.admitted.fetch_add(1, Ordering::Relaxed);
        Ok(permit)
    }

    /// One line per count, for the admin socket.
    pub fn report(&self) -> String {
        let s = &self.stats;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "policy version {}: {} rule(s), {} limit(s); admitted {} denied {} rate-limited {} \
             concurrency-limited {} shed {}; {} call(s) open",
            self.version(),
            self.current().spec.rules.len(),
            self.current().spec.limits.len(),
            n(&s.admitted),
            n(&s.denied),
            n(&s.rate_limited),
            n(&s.concurrency_limited),
            n(&s.shed),
            self.open_calls(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATHS: [&str; 3] = ["/a.S/One", "/a.S/Two", "/b.T/Three"];

    fn policies(text: &str) -> Result<Policies, String> {
        let doc: toml::Table = text.parse().map_err(|e| format!("{e}"))?;
        let t = doc.get("policy").and_then(toml::Value::as_table).cloned().unwrap_or_default();
        Policies::new(PolicySpec::from_toml(&t)?, PATHS.iter().map(|p| p.to_string()).collect())
    }

    fn call<'a>(path: &'a str, md: &'a Metadata) -> CallInfo<'a> {
        let service = &path[1..path[1..].find('/').map_or(0, |i| i + 1)];
        CallInfo { path, service, metadata: md, peer: None }
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let p = policies(
            r#"
            [policy]
            default = "deny"
            [[policy.rules]]
            action = "deny"
            methods = ["/a.S/Two"]
            clients = ["metadata:x-tenant=guest"]
            [[policy.rules]]
            action = "allow"
            methods = ["/a.S/*"]
            "#,
        )
        .expect("policy");
        let mut guest = Metadata::new();
        guest.insert("x-tenant", "guest").expect("metadata");
        let none = Metadata::new();
        assert!(p.admit(&call("/a.S/One", &guest)).is_ok());
        let st = p.admit(&call("/a.S/Two", &guest)).expect_err("rule 0 denies");
        assert_eq!(st.code, Code::PermissionDenied);
        assert!(st.message.contains("rule 0"), "{}", st.message);
        assert!(p.admit(&call("/a.S/Two", &none)).is_ok());
        let st = p.admit(&call("/b.T/Three", &none)).expect_err("default denies");
        assert!(st.message.contains("no rule allows it"), "{}", st.message);
        assert_eq!(p.stats.denied.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn concurrency_is_held_by_the_permit_and_counted_across_reloads() {
        let p = policies("[policy.limits.\"a.S\"]\nconcurrency = 2").expect("policy");
        let md = Metadata::new();
        let a = p.admit(&call("/a.S/One", &md)).expect("first");
        let _b = p.admit(&call("/a.S/Two", &md)).expect("second");
        let st = p.admit(&call("/a.S/One", &md)).expect_err("third is over");
        assert_eq!(st.code, Code::ResourceExhausted);
        let details = st.error_details_vec();
        assert!(details.iter().any(|d| matches!(d, ErrorDetail::RetryInfo(_))), "{details:?}");
        assert!(p.admit(&call("/b.T/Three", &md)).is_ok(), "another service is not limited");
        drop(a);
        let _c = p.admit(&call("/a.S/One", &md)).expect("room again");
        // A reload to a limit of 3 sees the two calls open.
        let t: toml::Table = "[limits.\"a.S\"]\nconcurrency = 3".parse().expect("toml");
        p.install(PolicySpec::from_toml(&t).expect("spec")).expect("install");
        let _d = p.admit(&call("/a.S/One", &md)).expect("third under the new limit");
        assert!(p.admit(&call("/a.S/One", &md)).is_err(), "fourth is over the new limit");
        assert_eq!(p.version(), 2);
    }

    #[test]
    fn a_rate_refuses_past_its_burst_with_the_wait() {
        let p = policies("[policy.limits.\"/a.S/One\"]\nrate = 10\nburst = 3").expect("policy");
        let md = Metadata::new();
        for i in 0..3 {
            assert!(p.admit(&call("/a.S/One", &md)).is_ok(), "token {i}");
        }
        let st = p.admit(&call("/a.S/One", &md)).expect_err("bucket empty");
        let wait = st.error_details_vec().into_iter().find_map(|d| match d {
            ErrorDetail::RetryInfo(r) => r.retry_delay,
            _ => None,
        });
        let wait = wait.expect("a retry delay");
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(100), "{wait:?}");
        assert!(p.admit(&call("/a.S/Two", &md)).is_ok(), "another method is not limited");
    }

    #[test]
    fn the_bucket_refills_at_its_rate() {
        let b = Bucket::default();
        let (interval, tolerance) = (1_000, 2_000); // a burst of 3
        let t0 = 1_000_000;
        for _ in 0..3 {
            b.take(t0, interval, tolerance).expect("burst");
        }
        assert_eq!(b.take(t0, interval, tolerance), Err(Duration::from_nanos(1_000)));
        b.take(t0 + 1_000, interval, tolerance).expect("one token after one interval");
        assert!(b.take(t0 + 1_000, interval, tolerance).is_err());
        for i in 0..3 {
            b.take(t0 + 100_000, interval, tolerance).unwrap_or_else(|_| panic!("full: {i}"));
        }
    }

    #[test]
    fn priorities_share_the_engine_under_saturation() {
        let p = policies(
            r#"
            [policy]
            max_calls = 10
            [policy.limits."a.S"]
            priority = "low"
            [policy.limits."b.T"]
            priority = "high"
            "#,
        )
        .expect("policy");
        let md = Metadata::new();
        let mut held = Vec::new();
        for _ in 0..5 {
            held.push(p.admit(&call("/a.S/One", &md)).expect("low, under half"));
        }
        assert!(p.admit(&call("/a.S/One", &md)).is_err(), "low stops at 5");
        for _ in 0..5 {
            held.push(p.admit(&call("/b.T/Three", &md)).expect("high, up to 10"));
        }
        assert!(p.admit(&call("/b.T/Three", &md)).is_err(), "the engine is full");
        assert_eq!(p.open_calls(), 10);
        drop(held);
        assert_eq!(p.open_calls(), 0);
    }

    #[test]
    fn client_certificates_are_matched_by_name() {
        use rcgen::{CertificateParams, DnType, KeyPair};
        let mut params =
            CertificateParams::new(vec!["ops.example.com".to_string(), "10.0.0.1".to_string()])
                .expect("params");
        params.distinguished_name.push(DnType::CommonName, "admin");
        params.distinguished_name.push(DnType::OrganizationName, "Example");
        let key = KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("certificate");
        let peer =
            Peer { addr: None, certificates: vec![bytes::Bytes::copy_from_slice(cert.der())] };
        let md = Metadata::new();
        let allows = |client: &str, peer: Option<&Peer>| {
            let p = policies(&format!(
                "[policy]\ndefault = \"deny\"\n[[policy.rules]]\naction = \"allow\"\nclients = [{client:?}]"
            ))
            .expect("policy");
            p.admit(&CallInfo { path: "/a.S/One", service: "a.S", metadata: &md, peer }).is_ok()
        };
        for yes in ["cn:admin", "subject:O=Example", "subject:cn=admin", "san:ops.example.com"] {
            assert!(allows(yes, Some(&peer)), "{yes}");
        }
        assert!(allows("san:10.0.0.1", Some(&peer)));
        for no in ["cn:root", "subject:O=Other", "san:evil.example.com", "anonymous"] {
            assert!(!allows(no, Some(&peer)), "{no}");
        }
        assert!(allows("anonymous", None));
        assert!(!allows("cn:admin", None), "no certificate, no name");
        let garbage = Peer { addr: None, certificates: vec![bytes::Bytes::from_static(b"junk")] };
        assert!(!allows("cn:admin", Some(&garbage)), "an unreadable certificate names nobody");
    }

    #[test]
    fn bad_policies_are_refused_by_name() {
        let bad = |t: &str| policies(t).expect_err(t);
        assert!(bad("[policy]\ndefualt = \"allow\"").contains("unknown key policy.defualt"));
        assert!(bad("[[policy.rules]]\nmethods = [\"*\"]").contains("needs action"));
        assert!(bad("[[policy.rules]]\naction = \"maybe\"").contains("\"allow\" or \"deny\""));
        assert!(
            bad("[[policy.rules]]\naction = \"deny\"\nmethods = [\"a.S\"]").contains("a method")
        );
        assert!(bad("[[policy.rules]]\naction = \"deny\"\nclients = [\"who:me\"]")
            .contains("metadata:KEY"));
        assert!(bad("[[policy.rules]]\naction = \"deny\"\nmethods = [\"/a.S/Nine\"]")
            .contains("serves no"));
        assert!(bad("[policy.limits.\"z.Z\"]\nrate = 1").contains("serves no"));
        assert!(bad("[policy.limits.\"a.S\"]\nrate = -1").contains("above 0"));
        assert!(bad("[policy.limits.\"a.S\"]\nburst = 4").contains("burst needs a rate"));
        assert!(
            bad("[policy.limits.\"/a.S/One\"]\npriority = \"high\"").contains("per application")
        );
    }
}
