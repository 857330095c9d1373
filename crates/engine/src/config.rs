//! The engine's configuration: defaults, a TOML file, then flags (the
//! command line applies flags after the file, so flags win).
//!
//! ```toml
//! [listen]
//! grpc = "127.0.0.1:50051"        # gRPC over HTTP/2
//! tls_cert = "server.pem"         # optional: serve gRPC over TLS
//! tls_key = "server.key"
//! tls_client_ca = "ca.pem"        # optional: require client certificates (mutual TLS)
//! lean = "127.0.0.1:50052"        # lean transport over TCP
//! lean_unix = "/tmp/lean.sock"    # lean transport over a Unix socket
//! attach = "/tmp/protoplane.sock" # where applications attach
//! metrics = "127.0.0.1:9464"      # Prometheus scrape endpoint (/metrics)
//!
//! [keepalive]                     # gRFC A8, A9 on the gRPC listener (grpc-go's defaults)
//! time_ms = 7200000               # ping a client silent this long
//! timeout_ms = 20000              # close if the ping goes unanswered
//! min_time_ms = 300000            # clients' pings closer than this are strikes (3: GOAWAY)
//! permit_without_stream = false   # clients may ping with no call open
//! max_connection_idle_ms = 600000 # GOAWAY after this long without calls (default: never)
//! max_connection_age_ms = 3600000 # GOAWAY after this long, ±10% (default: never)
//! max_connection_age_grace_ms = 30000 # then close, calls or not
//!
//! [schemas]
//! protos = ["my/service.proto"]   # beside the built-in ones
//! includes = ["protos"]
//!
//! [engine]
//! cores = [0]                     # pin the engine's threads
//! threads = 1                     # the runtime that accepts (and serves, without workers)
//! workers = 2                     # shard connections over 2 worker threads, each
//!                                 # with its own rings to each application (default 0: none)
//! spin_us = 20                    # spin this long after work before parking
//!
//! [region]
//! half_mb = 64                    # per attachment, each direction
//! ring_slots = 1024
//!
//! [limits]
//! max_message = 4194304
//! max_in_flight = 4096            # calls open per application instance
//! max_waiting = 1024              # posts waiting for room, engine-wide
//! queue_timeout_ms = 500          # then RESOURCE_EXHAUSTED
//! stall_timeout_ms = 5000         # an application that takes no request this long is cut off
//!
//! [attach]                        # the attach socket: see `crate::admission`
//! max_applications = 64           # attached at once (an application attached once per
//!                                 # engine worker takes one seat per worker)
//! max_pending = 64                # handshakes waiting at once (the oldest is cut off)
//! handshake_timeout_ms = 1000
//!
//! [attach.allow]                  # who may serve which service (SO_PEERCRED)
//! "socialnetwork.SocialNetwork" = ["uid:1000", "gid:1000"]
//! "*" = ["uid:0"]                 # services not listed; without "*", anyone who can open the socket
//!
//! [budgets]                       # per application: see `crate::budget`
//! descriptors_per_pass = 256
//! release_timeout_ms = 10000      # request memory of an ended call must come back by then
//! max_unanswered = 64             # calls in a row ending unanswered ...
//! answer_timeout_ms = 10000       # ... with no answer this long: a black hole
//! max_queued = 1024               # responses waiting for one call's client
//!
//! [offload]                       # functional offload: see `crate::functional`
//! methods = ["/socialnetwork.SocialNetwork/Login"]  # answered in the engine
//! raw_above = 1048576             # larger requests reach the application undecoded
//! units = 4                       # compute-unit slots per application (see `crate::device`)
//! device_mb = 64                  # its device region
//! placements = ["pkg.Image.data=device"]  # beside `[(protoplane.placement) = DEVICE]` options
//!
//! [offload.handlers]              # a built-in handler by name, per method
//! "/shop.Accounts/SignIn" = "login-token"
//!
//! [policy]                        # per call, changed at run time: see `crate::policy`
//! default = "allow"
//! [[policy.rules]]
//! action = "deny"
//! methods = ["/socialnetwork.SocialNetwork/Login"]
//! clients = ["metadata:x-tenant=guest"]
//! [policy.limits."socialnetwork.SocialNetwork"]
//! rate = 5000
//! concurrency = 256
//!
//! [outbound]                      # applications' calls to other services: see `crate::outbound`
//! allow = ["dns:///*", "127.0.0.1:*"]  # targets they may call (default: any)
//! lb = "round_robin"              # pick_first (default), round_robin, weighted_round_robin
//! service_config = "sc.json"      # retries, timeouts per method (gRFC A6)
//! max_calls = 4096                # open per application; more fail RESOURCE_EXHAUSTED
//!
//! [admin]
//! socket = "/tmp/protoplane-admin.sock"  # reload, status, take-over: see `crate::admin`
//! ```
//!
//! Unknown sections and keys are refused by name, so a typo never passes
//! silently.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use protoplane_grpc::Schema;
use protoplane_rpc::ServerOptions;

use crate::admission::{Admission, Principal};
use crate::budget::Budgets;
use crate::device::DeviceOptions;
use crate::functional::FunctionalOffload;
use crate::policy::PolicySpec;
use crate::proxy::Limits;

/// Everything the engine is told.
#[derive(Debug, Clone)]
pub struct Config {
    /// gRPC listener.
    pub grpc: Option<SocketAddr>,
    /// TLS certificate chain and key (PEM) for the gRPC listener.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// With TLS: CA certificates (PEM) that must have signed every client's
    /// certificate (mutual TLS); the verified certificate reaches the
    /// application's handlers.
    pub tls_client_ca: Option<PathBuf>,
    /// Lean TCP listener.
    pub lean_tcp: Option<SocketAddr>,
    /// Lean Unix listener.
    pub lean_unix: Option<PathBuf>,
    /// The attach socket.
    pub attach: PathBuf,
    /// The Prometheus scrape endpoint (`GET /metrics`): gRFC A66's call
    /// metrics and the engine's own.
    pub metrics: Option<SocketAddr>,
    /// Keep the metrics registry without a Prometheus endpoint (for a
    /// pusher: `Running::metrics_registry`).
    pub metrics_registry: bool,
    /// Schemas whose services the engine offers to applications.
    pub schemas: Vec<Arc<Schema>>,
    /// `.proto` files to load (beside `schemas`), and their include roots.
    pub protos: Vec<PathBuf>,
    /// Include roots for `protos`.
    pub includes: Vec<PathBuf>,
    /// Transport settings (message size limits among them).
    pub server: ServerOptions,
    /// What may wait for an application.
    pub limits: Limits,
    /// Ring slots per direction per attachment.
    pub ring_slots: u32,
    /// MiB per region half (per attachment, per direction).
    pub half_mb: u64,
    /// Spin after work before parking.
    pub spin: Duration,
    /// An application that takes no request from its ring this long, with
    /// requests waiting, is cut off.
    pub stall_timeout: Duration,
    /// Cores to pin the engine's threads to.
    pub cores: Vec<usize>,
    /// Runtime threads.
    pub threads: usize,
    /// Worker threads the client connections are sharded over, each with
    /// its own attachment (rings, doorbell) to each application that opens
    /// lanes (0: connections are tasks of the main runtime).
    pub workers: usize,
    /// Methods answered inside the engine, and their handlers (register
    /// your own with [`FunctionalOffload::register`]).
    pub offload: FunctionalOffload,
    /// Device placement and compute units (RPCAcc in split mode).
    pub device: DeviceOptions,
    /// Who may attach as which service, and how many at once.
    pub admission: Admission,
    /// What each attached application may cost the engine.
    pub budgets: Budgets,
    /// What applications may call through the engine, and how.
    pub outbound: crate::outbound::OutboundOptions,
    /// What the engine decides about each call before it reaches an
    /// application (`[policy]`, see [`crate::policy`]); replaced at run
    /// time by [`crate::Running::reload`].
    pub policy: PolicySpec,
    /// The TOML file this came from, which [`crate::Running::reload`]
    /// reads again.
    pub file: Option<PathBuf>,
    /// The admin socket (`[admin] socket`): reload, status, take-over.
    pub admin: Option<PathBuf>,
    /// How long calls in flight may take to finish when another engine
    /// takes over from this one.
    pub grace: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            grpc: None,
            tls: None,
            tls_client_ca: None,
            lean_tcp: None,
            lean_unix: None,
            attach: PathBuf::from("/tmp/protoplane.sock"),
            metrics: None,
            metrics_registry: false,
            schemas: Vec::new(),
            protos: Vec::new(),
            includes: Vec::new(),
            server: ServerOptions::default(),
            limits: Limits::default(),
            ring_slots: 1024,
            half_mb: 64,
            spin: Duration::from_micros(20),
            stall_timeout: Duration::from_secs(5),
            cores: Vec::new(),
            threads: 1,
            workers: 0,
            offload: FunctionalOffload::default(),
            device: DeviceOptions::default(),
            admission: Admission::default(),
            budgets: Budgets::default(),
            outbound: crate::outbound::OutboundOptions::default(),
            policy: PolicySpec::default(),
            file: None,
            admin: None,
            grace: Duration::from_secs(10),
        }
    }
}

impl Config {
    /// One key of `[keepalive]` (gRFC A8 and A9 on the gRPC listener:
    /// `protoplane_rpc::keepalive`).
    fn keepalive_key(&mut self, key: &str, v: &toml::Value, k: &str) -> Result<(), String> {
        let ka = &mut self.server.keepalive;
        let ms = |v: &toml::Value| uint(v, k).map(Duration::from_millis);
        let positive = |v: &toml::Value| match ms(v)? {
            d if d.is_zero() => Err(format!("{k} must be above 0")),
            d => Ok(d),
        };
        match key {
            "time_ms" => ka.time = positive(v)?,
            "timeout_ms" => ka.timeout = positive(v)?,
            "min_time_ms" => ka.min_time = ms(v)?,
            "permit_without_stream" => {
                ka.permit_without_stream =
                    v.as_bool().ok_or_else(|| format!("{k} must be true or false"))?
            }
            "max_connection_idle_ms" => ka.max_connection_idle = Some(positive(v)?),
            "max_connection_age_ms" => ka.max_connection_age = Some(positive(v)?),
            "max_connection_age_grace_ms" => ka.max_connection_age_grace = Some(ms(v)?),
            _ => return Err(format!("config: unknown key {k}")),
        }
        Ok(())
    }
}

fn table<'a>(v: &'a toml::Value, name: &str) -> Result<&'a toml::Table, String> {
    v.as_table().ok_or_else(|| format!("[{name}] must be a table"))
}

fn string(v: &toml::Value, key: &str) -> Result<String, String> {
    v.as_str().map(str::to_string).ok_or_else(|| format!("{key} must be a string"))
}

fn uint(v: &toml::Value, key: &str) -> Result<u64, String> {
    v.as_integer()
        .and_then(|i| u64::try_from(i).ok())
        .ok_or_else(|| format!("{key} must be a non-negative integer"))
}

fn addr(v: &toml::Value, key: &str) -> Result<SocketAddr, String> {
    string(v, key)?.parse().map_err(|e| format!("{key}: {e}"))
}

fn list(v: &toml::Value, key: &str) -> Result<Vec<toml::Value>, String> {
    v.as_array().cloned().ok_or_else(|| format!("{key} must be an array"))
}

/// A method path as gRPC spells it: `/package.Service/Method`.
fn method_path(p: String, key: &str) -> Result<String, String> {
    let ok = p
        .strip_prefix('/')
        .and_then(|r| r.split_once('/'))
        .is_some_and(|(s, m)| !s.is_empty() && !m.is_empty() && !m.contains('/'));
    match ok {
        true => Ok(p),
        false => Err(format!("{key}: {p:?} is not a method path (/package.Service/Method)")),
    }
}

/// A configuration's `[policy]` (the default if it has none) and the rest
/// of it.
pub fn split_policy(text: &str) -> Result<(PolicySpec, toml::Table), String> {
    let mut doc: toml::Table = text.parse().map_err(|e| format!("config: {e}"))?;
    let spec = match doc.remove("policy") {
        Some(p) => PolicySpec::from_toml(table(&p, "policy")?)?,
        None => PolicySpec::default(),
    };
    Ok((spec, doc))
}

impl Config {
    /// Applies a TOML configuration (paths relative to `base`).
    pub fn apply_toml(&mut self, text: &str, base: &Path) -> Result<(), crate::Error> {
        self.apply_toml_text(text, base).map_err(crate::Error::Config)
    }

    fn apply_toml_text(&mut self, text: &str, base: &Path) -> Result<(), String> {
        let doc: toml::Table = text.parse().map_err(|e| format!("config: {e}"))?;
        let path = |s: String| -> PathBuf {
            let p = PathBuf::from(s);
            if p.is_relative() {
                base.join(p)
            } else {
                p
            }
        };
        let mut cert = None;
        let mut key_file = None;
        for (section, body) in &doc {
            let body = table(body, section)?;
            if section == "policy" {
                self.policy = PolicySpec::from_toml(body)?;
                continue;
            }
            for (key, v) in body {
                let k = format!("{section}.{key}");
                match (section.as_str(), key.as_str()) {
                    ("offload", "methods") => {
                        for p in list(v, &k)? {
                            self.offload.offload(method_path(string(&p, &k)?, &k)?);
                        }
                    }
                    ("offload", "raw_above") => {
                        self.offload.raw_above = Some(uint(v, &k)? as usize)
                    }
                    ("offload", "units") => self.device.units = uint(v, &k)?.min(256) as usize,
                    ("offload", "device_mb") => {
                        self.device.region_mb = uint(v, &k)?.clamp(1, 4095) as u32
                    }
                    ("offload", "placements") => {
                        for p in list(v, &k)? {
                            let spec = string(&p, &k)?;
                            protoplane_schema::parse_placement(&spec)
                                .map_err(|e| format!("{k}: {e}"))?;
                            self.device.placements.push(spec);
                        }
                    }
                    ("offload", "handlers") => {
                        for (path, name) in table(v, &k)? {
                            let at = format!("{k}.{path}");
                            let name = string(name, &at)?;
                            if FunctionalOffload::builtin(&name).is_none() {
                                return Err(format!(
                                    "{at}: no built-in handler {name:?} (login-token, empty)"
                                ));
                            }
                            self.offload.offload_with(method_path(path.clone(), &at)?, name);
                        }
                    }
                    ("listen", "grpc") => self.grpc = Some(addr(v, &k)?),
                    ("listen", "tls_cert") => cert = Some(path(string(v, &k)?)),
                    ("listen", "tls_key") => key_file = Some(path(string(v, &k)?)),
                    ("listen", "tls_client_ca") => self.tls_client_ca = Some(path(string(v, &k)?)),
                    ("listen", "lean") => self.lean_tcp = Some(addr(v, &k)?),
                    ("listen", "lean_unix") => self.lean_unix = Some(path(string(v, &k)?)),
                    ("listen", "attach") => self.attach = path(string(v, &k)?),
                    ("listen", "metrics") => self.metrics = Some(addr(v, &k)?),
                    ("admin", "socket") => self.admin = Some(path(string(v, &k)?)),
                    ("schemas", "protos") => {
                        for p in list(v, &k)? {
                            self.protos.push(path(string(&p, &k)?));
                        }
                    }
                    ("schemas", "includes") => {
                        for p in list(v, &k)? {
                            self.includes.push(path(string(&p, &k)?));
                        }
                    }
                    ("engine", "cores") => {
                        self.cores = list(v, &k)?
                            .iter()
                            .map(|c| uint(c, &k).map(|c| c as usize))
                            .collect::<Result<_, _>>()?
                    }
                    ("engine", "threads") => self.threads = uint(v, &k)?.max(1) as usize,
                    ("engine", "workers") => {
                        let n = uint(v, &k)?;
                        if n > u64::from(protoplane_shm::attach::MAX_LANES) {
                            return Err(format!(
                                "{k}: at most {} workers",
                                protoplane_shm::attach::MAX_LANES
                            ));
                        }
                        self.workers = n as usize;
                    }
                    ("engine", "spin_us") => self.spin = Duration::from_micros(uint(v, &k)?),
                    ("region", "half_mb") => self.half_mb = uint(v, &k)?.clamp(1, 1900),
                    ("region", "ring_slots") => {
                        let n = uint(v, &k)?;
                        if !n.is_power_of_two() || !(8..=1 << 20).contains(&n) {
                            return Err(format!("{k}: a power of two in 8..=1048576"));
                        }
                        self.ring_slots = n as u32;
                    }
                    ("limits", "max_message") => {
                        let n = uint(v, &k)?.min(1 << 30) as usize;
                        self.server.max_recv_message = n;
                        self.server.max_send_message = n;
                    }
                    ("limits", "max_in_flight") => self.limits.max_in_flight = uint(v, &k)?.max(1),
                    ("limits", "max_waiting") => self.limits.max_waiting = uint(v, &k)? as usize,
                    ("limits", "queue_timeout_ms") => {
                        self.limits.queue_timeout = Duration::from_millis(uint(v, &k)?)
                    }
                    ("attach", "max_applications") => {
                        self.admission.max_applications = uint(v, &k)?.max(1) as usize
                    }
                    ("attach", "max_pending") => {
                        self.admission.max_pending = uint(v, &k)?.max(1) as usize
                    }
                    ("attach", "handshake_timeout_ms") => {
                        self.admission.handshake_timeout =
                            Duration::from_millis(uint(v, &k)?.max(1))
                    }
                    ("attach", "allow") => {
                        for (service, who) in table(v, &k)? {
                            let at = format!("{k}.{service}");
                            let rule = list(who, &at)?
                                .iter()
                                .map(|p| {
                                    Principal::parse(&string(p, &at)?)
                                        .map_err(|e| format!("{at}: {e}"))
                                })
                                .collect::<Result<Vec<_>, _>>()?;
                            self.admission.allow.insert(service.clone(), rule);
                        }
                    }
                    ("budgets", "descriptors_per_pass") => {
                        self.budgets.descriptors_per_pass = uint(v, &k)?.clamp(1, 1 << 20) as usize
                    }
                    ("budgets", "release_timeout_ms") => {
                        self.budgets.release_timeout = Duration::from_millis(uint(v, &k)?.max(1))
                    }
                    ("budgets", "max_unanswered") => {
                        self.budgets.max_unanswered = uint(v, &k)?.clamp(1, u32::MAX as u64) as u32
                    }
                    ("budgets", "answer_timeout_ms") => {
                        self.budgets.answer_timeout = Duration::from_millis(uint(v, &k)?.max(1))
                    }
                    ("budgets", "max_queued") => {
                        self.budgets.max_queued = uint(v, &k)?.clamp(1, 1 << 20) as usize
                    }
                    ("outbound", "allow") => {
                        self.outbound.allow =
                            list(v, &k)?.iter().map(|t| string(t, &k)).collect::<Result<_, _>>()?
                    }
                    ("outbound", "lb") => {
                        self.outbound.lb =
                            string(v, &k)?.parse().map_err(|e| format!("{k}: {e}"))?
                    }
                    ("outbound", "service_config") => {
                        self.outbound.service_config = Some(path(string(v, &k)?))
                    }
                    ("outbound", "max_calls") => {
                        self.budgets.max_outbound = uint(v, &k)?.clamp(1, 1 << 20) as usize
                    }
                    ("limits", "stall_timeout_ms") => {
                        self.stall_timeout = Duration::from_millis(uint(v, &k)?.max(10))
                    }
                    ("keepalive", _) => self.keepalive_key(key, v, &k)?,
                    _ => return Err(format!("config: unknown key {k}")),
                }
            }
        }
        match (cert, key_file) {
            (Some(c), Some(k)) => self.tls = Some((c, k)),
            (None, None) => {}
            _ => return Err("config: listen.tls_cert and listen.tls_key go together".into()),
        }
        if self.tls_client_ca.is_some() && self.tls.is_none() {
            return Err("config: listen.tls_client_ca needs listen.tls_cert and tls_key".into());
        }
        Ok(())
    }

    /// Loads `protos` into `schemas` (one schema for all of them).
    pub fn load_protos(&mut self) -> Result<(), crate::Error> {
        if self.protos.is_empty() {
            return Ok(());
        }
        let s = Schema::from_proto_files(&self.protos, &self.includes)
            .map_err(|e| crate::Error::Schema(format!("schemas: {e}")))?;
        self.schemas.push(Arc::new(s));
        self.protos.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_sets_what_it_names_and_refuses_the_rest() {
        let mut c = Config::default();
        let text = r#"
            [listen]
            grpc = "127.0.0.1:7000"
            attach = "run/engine.sock"
            [engine]
            cores = [0, 1]
            spin_us = 5
            [region]
            ring_slots = 64
            [limits]
            max_message = 1000
            stall_timeout_ms = 250
            [keepalive]
            min_time_ms = 10000
            permit_without_stream = true
            max_connection_age_ms = 60000
            metrics = 1
        "#;
        assert!(Config::default().apply_toml(text, Path::new("/srv")).is_err());
        let text = text.replace("metrics = 1", "");
        c.apply_toml(&text, Path::new("/srv")).expect("valid config");
        assert_eq!(c.server.keepalive.min_time, Duration::from_secs(10));
        assert!(c.server.keepalive.permit_without_stream);
        assert_eq!(c.server.keepalive.max_connection_age, Some(Duration::from_secs(60)));
        assert_eq!(c.server.keepalive.max_connection_idle, None);
        assert_eq!(c.grpc, "127.0.0.1:7000".parse().ok());
        assert_eq!(c.attach, PathBuf::from("/srv/run/engine.sock"));
        assert_eq!(c.cores, [0, 1]);
        assert_eq!(c.spin, Duration::from_micros(5));
        assert_eq!(c.ring_slots, 64);
        assert_eq!(c.server.max_recv_message, 1000);
        assert_eq!(c.stall_timeout, Duration::from_millis(250));

        let bad = |t: &str| match Config::default().apply_toml(t, Path::new("/")) {
            Err(crate::Error::Config(why)) => why,
            other => panic!("{other:?}"),
        };
        assert!(bad("[listen]\ngrcp = \"x\"").contains("unknown key listen.grcp"));
        assert!(bad("[region]\nring_slots = 100").contains("power of two"));
        assert!(bad("[listen]\ngrpc = \"nope\"").contains("listen.grpc"));
        assert!(bad("[listen]\ntls_cert = \"a\"").contains("go together"));
        assert!(bad("[engine]\ncores = [-1]").contains("non-negative"));
        assert!(bad("[offload]\nmethods = [\"/a.B\"]").contains("not a method path"));
        assert!(bad("[offload.handlers]\n\"/a.B/C\" = \"nope\"").contains("no built-in"));
        assert!(bad("[offload]\nraw_above = -1").contains("non-negative"));
        assert!(bad("[keepalive]\ntime_ms = 0").contains("above 0"));
        assert!(bad("[keepalive]\npermit_without_stream = 1").contains("true or false"));
    }

    #[test]
    fn toml_marks_offloaded_methods() {
        let mut c = Config::default();
        let text = r#"
            [offload]
            methods = ["/socialnetwork.SocialNetwork/Login"]
            raw_above = 65536
            [offload.handlers]
            "/shop.Accounts/SignIn" = "login-token"
        "#;
        c.apply_toml(text, Path::new("/")).expect("valid config");
        assert_eq!(c.offload.raw_above, Some(65536));
        let dump = format!("{:?}", c.offload);
        assert!(dump.contains("/socialnetwork.SocialNetwork/Login"), "{dump}");
        assert!(dump.contains("\"/shop.Accounts/SignIn\": \"login-token\""), "{dump}");
    }
}
