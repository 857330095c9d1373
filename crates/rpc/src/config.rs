//! gRPC service config: per-method timeouts, `wait_for_ready` and retry
//! policies, retry throttling and the load-balancing policy, as the JSON
//! that gRPC's resolvers and users hand a channel (`doc/service_config.md`
//! in grpc/grpc; retries as gRFC A6 defines them).
//!
//! ```
//! use protoplane_rpc::config::ServiceConfig;
//!
//! let sc = ServiceConfig::from_json(r#"{
//!   "loadBalancingConfig": [{"round_robin": {}}],
//!   "methodConfig": [{
//!     "name": [{"service": "pkg.Store"}],
//!     "timeout": "1.5s",
//!     "retryPolicy": {
//!       "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.3s",
//!       "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
//!     }
//!   }],
//!   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
//! }"#).expect("test value");
//! let m = sc.method("/pkg.Store/Get").expect("test value");
//! assert_eq!(m.retry.as_ref().expect("test value").max_attempts, 3);
//! ```
//!
//! What is read, and how strictly: unknown fields are ignored (the JSON
//! form of a protobuf message); a value of the wrong type, an attempt
//! count below 2, a backoff that is not positive, an empty code list, two
//! method configs naming the same method, or a `retryPolicy` and a
//! `hedgingPolicy` on one method are errors naming the field, as gRPC
//! rejects such configs whole. `maxAttempts` above 5 is lowered to 5, as
//! gRPC does. A hedging policy sends the call again every `hedgingDelay`
//! (and at once after a failure with one of `nonFatalStatusCodes`) until
//! one attempt answers, up to `maxAttempts` at once; the first answer wins
//! and the others are cancelled (see `client.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use protoplane_grpc::status::{Code, Status};
use serde_json::Value;

use crate::balance::LbPolicy;

/// gRPC's cap on attempts, whatever the config says.
pub const MAX_ATTEMPTS: u32 = 5;

/// A parsed service config.
#[derive(Clone, Debug, Default)]
pub struct ServiceConfig {
    /// The first policy of `loadBalancingConfig` (or the older
    /// `loadBalancingPolicy`) that protoplane implements.
    pub lb: Option<LbPolicy>,
    /// Per-method settings, by `(service, method)`; an empty method is the
    /// whole service, and `("", "")` every method.
    methods: HashMap<(String, String), MethodConfig>,
    /// Retry throttling, per channel.
    pub throttling: Option<Throttling>,
    /// gRFC A17's `healthCheckConfig.serviceName`: round robin and
    /// weighted round robin send calls only to backends whose health
    /// service says this service is SERVING ("": the server as a whole).
    pub health_check: Option<String>,
}

/// What the config says about one method.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MethodConfig {
    /// Used when the call sets no timeout of its own (the shorter wins
    /// when both are set).
    pub timeout: Option<Duration>,
    /// Used when the call does not ask itself.
    pub wait_for_ready: Option<bool>,
    /// How failed attempts are retried.
    pub retry: Option<RetryPolicy>,
    /// How the call is hedged.
    pub hedging: Option<HedgingPolicy>,
}

/// gRFC A6's `retryPolicy`.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (2..=5).
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub backoff_multiplier: f64,
    /// The statuses that make an attempt worth repeating.
    pub retryable: Vec<Code>,
}

/// gRFC A6's `hedgingPolicy`.
#[derive(Clone, Debug, PartialEq)]
pub struct HedgingPolicy {
    pub max_attempts: u32,
    pub hedging_delay: Duration,
    pub non_fatal: Vec<Code>,
}

/// gRFC A6's `retryThrottling`: a token bucket per channel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Throttling {
    pub max_tokens: u32,
    pub token_ratio: f64,
}

fn bad(field: &str, why: impl std::fmt::Display) -> Status {
    Status::new(Code::InvalidArgument, format!("service config: {field}: {why}"))
}

/// A protobuf JSON duration: `"1.5s"`.
fn duration(v: &Value, field: &str) -> Result<Duration, Status> {
    let s = v.as_str().ok_or_else(|| bad(field, "not a string like \"1.5s\""))?;
    let secs = s.strip_suffix('s').ok_or_else(|| bad(field, format!("{s:?} does not end in s")))?;
    let ok = !secs.is_empty()
        && secs.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && secs.bytes().filter(|&b| b == b'.').count() <= 1;
    let n: f64 = secs.parse().ok().filter(|_| ok).ok_or_else(|| bad(field, format!("{s:?}")))?;
    if !n.is_finite() || n > 315_576_000_000.0 {
        return Err(bad(field, format!("{s:?} is out of range")));
    }
    Ok(Duration::from_secs_f64(n))
}

fn positive(v: &Value, field: &str) -> Result<Duration, Status> {
    let d = duration(v, field)?;
    if d.is_zero() {
        return Err(bad(field, "must be above 0"));
    }
    Ok(d)
}

fn codes(v: &Value, field: &str) -> Result<Vec<Code>, Status> {
    let list = v.as_array().ok_or_else(|| bad(field, "not a list"))?;
    let mut out = Vec::new();
    for c in list {
        let code = match c {
            Value::String(name) => (0..17)
                .map(Code::from_u32)
                .find(|k| k.name().eq_ignore_ascii_case(name))
                .ok_or_else(|| bad(field, format!("no status code {name:?}")))?,
            Value::Number(n) => match n.as_u64() {
                Some(n @ 0..=16) => Code::from_u32(n as u32),
                _ => return Err(bad(field, format!("no status code {n}"))),
            },
            _ => return Err(bad(field, "codes are names or numbers")),
        };
        if code == Code::Ok {
            return Err(bad(field, "OK is not a failure"));
        }
        if !out.contains(&code) {
            out.push(code);
        }
    }
    Ok(out)
}

fn attempts(v: &Value, field: &str) -> Result<u32, Status> {
    let n = v.as_u64().ok_or_else(|| bad(field, "not a whole number"))?;
    if n < 2 {
        return Err(bad(field, "must be at least 2"));
    }
    Ok(n.min(u64::from(MAX_ATTEMPTS)) as u32)
}

fn object<'a>(v: &'a Value, field: &str) -> Result<&'a serde_json::Map<String, Value>, Status> {
    v.as_object().ok_or_else(|| bad(field, "not an object"))
}

fn required<'a>(
    o: &'a serde_json::Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<&'a Value, Status> {
    o.get(key).ok_or_else(|| bad(&format!("{at}.{key}"), "missing"))
}

fn retry_policy(v: &Value, at: &str) -> Result<RetryPolicy, Status> {
    let o = object(v, at)?;
    let f = |k: &str| format!("{at}.{k}");
    let multiplier = required(o, "backoffMultiplier", at)?
        .as_f64()
        .filter(|m| m.is_finite() && *m > 0.0)
        .ok_or_else(|| bad(&f("backoffMultiplier"), "must be a number above 0"))?;
    let retryable = codes(required(o, "retryableStatusCodes", at)?, &f("retryableStatusCodes"))?;
    if retryable.is_empty() {
        return Err(bad(&f("retryableStatusCodes"), "must name at least one code"));
    }
    Ok(RetryPolicy {
        max_attempts: attempts(required(o, "maxAttempts", at)?, &f("maxAttempts"))?,
        initial_backoff: positive(required(o, "initialBackoff", at)?, &f("initialBackoff"))?,
        max_backoff: positive(required(o, "maxBackoff", at)?, &f("maxBackoff"))?,
        backoff_multiplier: multiplier,
        retryable,
    })
}

fn hedging_policy(v: &Value, at: &str) -> Result<HedgingPolicy, Status> {
    let o = object(v, at)?;
    let f = |k: &str| format!("{at}.{k}");
    Ok(HedgingPolicy {
        max_attempts: attempts(required(o, "maxAttempts", at)?, &f("maxAttempts"))?,
        hedging_delay: match o.get("hedgingDelay") {
            Some(d) => duration(d, &f("hedgingDelay"))?,
            None => Duration::ZERO,
        },
        non_fatal: match o.get("nonFatalStatusCodes") {
            Some(c) => codes(c, &f("nonFatalStatusCodes"))?,
            None => Vec::new(),
        },
    })
}

/// `weighted_round_robin`'s settings (gRFC A58's JSON names).
fn wrr(v: &Value) -> Result<LbPolicy, Status> {
    let at = "loadBalancingConfig.weighted_round_robin";
    let o = object(v, at)?;
    let mut c = crate::balance::WrrConfig::default();
    let f = |k: &str| format!("{at}.{k}");
    if let Some(d) = o.get("blackoutPeriod") {
        c.blackout_period = duration(d, &f("blackoutPeriod"))?;
    }
    if let Some(d) = o.get("weightExpirationPeriod") {
        c.weight_expiration_period = duration(d, &f("weightExpirationPeriod"))?;
    }
    if let Some(d) = o.get("weightUpdatePeriod") {
        c.weight_update_period = duration(d, &f("weightUpdatePeriod"))?;
    }
    if let Some(p) = o.get("errorUtilizationPenalty") {
        c.error_utilization_penalty = p
            .as_f64()
            .filter(|p| p.is_finite() && *p >= 0.0)
            .ok_or_else(|| bad(&f("errorUtilizationPenalty"), "must be a number, 0 or more"))?;
    }
    if let Some(b) = o.get("enableOobLoadReport") {
        c.enable_oob_load_report =
            b.as_bool().ok_or_else(|| bad(&f("enableOobLoadReport"), "must be true or false"))?;
    }
    if let Some(d) = o.get("oobReportingPeriod") {
        c.oob_reporting_period = duration(d, &f("oobReportingPeriod"))?;
    }
    Ok(LbPolicy::WeightedRoundRobin(c))
}

fn lb_policy(root: &serde_json::Map<String, Value>) -> Result<Option<LbPolicy>, Status> {
    if let Some(list) = root.get("loadBalancingConfig") {
        let list = list.as_array().ok_or_else(|| bad("loadBalancingConfig", "not a list"))?;
        for entry in list {
            let o = object(entry, "loadBalancingConfig[]")?;
            // The first policy this client has wins (gRPC's rule).
            if let Some((name, settings)) = o.iter().next() {
                if let Ok(p) = name.parse::<LbPolicy>() {
                    return match p {
                        LbPolicy::WeightedRoundRobin(_) => wrr(settings).map(Some),
                        p => Ok(Some(p)),
                    };
                }
            }
        }
        if !list.is_empty() {
            return Err(bad("loadBalancingConfig", "no policy this client implements"));
        }
    }
    match root.get("loadBalancingPolicy") {
        None => Ok(None),
        Some(Value::String(name)) => name
            .to_ascii_lowercase()
            .parse::<LbPolicy>()
            .map(Some)
            .map_err(|e| bad("loadBalancingPolicy", e)),
        Some(_) => Err(bad("loadBalancingPolicy", "not a string")),
    }
}

/// The language a gRFC A2 choice's `clientLanguage` must list for this
/// client to take it (compared ignoring case).
pub const CLIENT_LANGUAGE: &str = "rust";

impl ServiceConfig {
    /// gRFC A2: the service config a DNS TXT record carries. `text` is the
    /// concatenated text of the `_grpc_config.<host>` records: `grpc_config=`
    /// and a JSON list of choices, each a `serviceConfig` and optional
    /// conditions. The first choice whose conditions all hold wins:
    /// `clientLanguage` lists [`CLIENT_LANGUAGE`], `percentage` (0 to 100)
    /// is at least `roll` (a number from 1 to 100 the caller draws once per
    /// lookup), `clientHostname` lists `hostname`. `Ok(None)`: no choice
    /// applies. Text without the prefix, a choice with a field A2 does not
    /// define or a value of the wrong type, and a chosen config that does
    /// not parse are errors, and the record is not used.
    pub fn from_dns_txt(
        text: &str,
        hostname: &str,
        roll: u32,
    ) -> Result<Option<ServiceConfig>, Status> {
        const PREFIX: &str = "grpc_config=";
        let list = text
            .strip_prefix(PREFIX)
            .ok_or_else(|| bad("TXT record", format!("does not start with {PREFIX:?}")))?;
        let v: Value = serde_json::from_str(list).map_err(|e| bad("grpc_config", e))?;
        let choices = v.as_array().ok_or_else(|| bad("grpc_config", "not a list"))?;
        for (i, c) in choices.iter().enumerate() {
            let at = format!("grpc_config[{i}]");
            let o = object(c, &at)?;
            if let Some(k) = o.keys().find(|k| {
                !["clientLanguage", "percentage", "clientHostname", "serviceConfig"]
                    .contains(&k.as_str())
            }) {
                return Err(bad(&format!("{at}.{k}"), "not a field of a choice (gRFC A2)"));
            }
            let names = |k: &str| -> Result<Option<Vec<String>>, Status> {
                let Some(v) = o.get(k) else { return Ok(None) };
                let list = v.as_array().ok_or_else(|| bad(&format!("{at}.{k}"), "not a list"))?;
                list.iter()
                    .map(|x| {
                        x.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| bad(&format!("{at}.{k}"), "not a list of strings"))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Some)
            };
            let languages = names("clientLanguage")?;
            let hosts = names("clientHostname")?;
            let percentage = match o.get("percentage") {
                None => None,
                Some(p) => Some(
                    p.as_u64()
                        .filter(|p| *p <= 100)
                        .ok_or_else(|| bad(&format!("{at}.percentage"), "not 0 to 100"))?,
                ),
            };
            let config = o.get("serviceConfig").ok_or_else(|| bad(&at, "no serviceConfig"))?;
            object(config, &format!("{at}.serviceConfig"))?;
            if languages.is_some_and(|l| !l.iter().any(|x| x.eq_ignore_ascii_case(CLIENT_LANGUAGE)))
                || percentage.is_some_and(|p| u64::from(roll) > p)
                || hosts.is_some_and(|h| !h.iter().any(|x| x == hostname))
            {
                continue;
            }
            return ServiceConfig::from_json(&config.to_string()).map(Some);
        }
        Ok(None)
    }

    /// Parses a service config (see the module's documentation).
    pub fn from_json(text: &str) -> Result<ServiceConfig, Status> {
        let v: Value = serde_json::from_str(text).map_err(|e| bad("JSON", e))?;
        let root = object(&v, "the config")?;
        let mut sc = ServiceConfig { lb: lb_policy(root)?, ..ServiceConfig::default() };
        if let Some(h) = root.get("healthCheckConfig") {
            let o = object(h, "healthCheckConfig")?;
            let name = match o.get("serviceName") {
                None => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(_) => return Err(bad("healthCheckConfig.serviceName", "not a string")),
            };
            sc.health_check = Some(name);
        }
        if let Some(list) = root.get("methodConfig") {
            let list = list.as_array().ok_or_else(|| bad("methodConfig", "not a list"))?;
            for (i, mc) in list.iter().enumerate() {
                let at = format!("methodConfig[{i}]");
                let o = object(mc, &at)?;
                let f = |k: &str| format!("{at}.{k}");
                let mut m = MethodConfig::default();
                if let Some(t) = o.get("timeout") {
                    m.timeout = Some(duration(t, &f("timeout"))?);
                }
                if let Some(w) = o.get("waitForReady") {
                    m.wait_for_ready = Some(
                        w.as_bool().ok_or_else(|| bad(&f("waitForReady"), "not true or false"))?,
                    );
                }
                if let Some(r) = o.get("retryPolicy") {
                    m.retry = Some(retry_policy(r, &f("retryPolicy"))?);
                }
                if let Some(h) = o.get("hedgingPolicy") {
                    m.hedging = Some(hedging_policy(h, &f("hedgingPolicy"))?);
                }
                if m.retry.is_some() && m.hedging.is_some() {
                    return Err(bad(
                        &at,
                        "a method has a retry policy or a hedging policy, not both",
                    ));
                }
                let names = match o.get("name") {
                    Some(n) => n.as_array().ok_or_else(|| bad(&f("name"), "not a list"))?.clone(),
                    None => Vec::new(),
                };
                for (j, n) in names.iter().enumerate() {
                    let at = format!("{at}.name[{j}]");
                    let n = object(n, &at)?;
                    let text = |k: &str| -> Result<String, Status> {
                        match n.get(k) {
                            None => Ok(String::new()),
                            Some(Value::String(s)) => Ok(s.clone()),
                            Some(_) => Err(bad(&format!("{at}.{k}"), "not a string")),
                        }
                    };
                    let (service, method) = (text("service")?, text("method")?);
                    if service.is_empty() && !method.is_empty() {
                        return Err(bad(&at, "a method without its service"));
                    }
                    if sc.methods.insert((service.clone(), method.clone()), m.clone()).is_some() {
                        return Err(bad(&at, format!("{service}/{method} is named twice")));
                    }
                }
            }
        }
        if let Some(t) = root.get("retryThrottling") {
            let o = object(t, "retryThrottling")?;
            let max = required(o, "maxTokens", "retryThrottling")?
                .as_u64()
                .filter(|n| (1..=1000).contains(n))
                .ok_or_else(|| bad("retryThrottling.maxTokens", "must be 1..=1000"))?;
            let ratio = required(o, "tokenRatio", "retryThrottling")?
                .as_f64()
                .filter(|r| r.is_finite() && *r > 0.0)
                .ok_or_else(|| bad("retryThrottling.tokenRatio", "must be above 0"))?;
            sc.throttling = Some(Throttling { max_tokens: max as u32, token_ratio: ratio });
        }
        Ok(sc)
    }

    /// The settings for `path` (`/pkg.Service/Method`): the method's own,
    /// else its service's, else the default (gRPC's lookup order).
    pub fn method(&self, path: &str) -> Option<&MethodConfig> {
        if self.methods.is_empty() {
            return None;
        }
        let (service, method) = path.trim_start_matches('/').split_once('/').unwrap_or((path, ""));
        // One allocation per lookup; configs are small and calls with one
        // are about to allocate a stream anyway.
        let mut key = (service.to_string(), method.to_string());
        if let Some(m) = self.methods.get(&key) {
            return Some(m);
        }
        key.1.clear();
        if let Some(m) = self.methods.get(&key) {
            return Some(m);
        }
        key.0.clear();
        self.methods.get(&key)
    }
}

/// The retry token bucket of a channel (gRFC A6): tokens are kept in
/// thousandths, as gRPC does, so `token_ratio` adds fractions.
#[derive(Debug)]
pub(crate) struct Throttle {
    max: u32,
    ratio: u32,
    tokens: AtomicU32,
}

impl Throttle {
    pub(crate) fn new(t: Throttling) -> Throttle {
        let max = t.max_tokens * 1000;
        let ratio = (t.token_ratio * 1000.0).round().clamp(1.0, f64::from(max)) as u32;
        Throttle { max, ratio, tokens: AtomicU32::new(max) }
    }

    /// A failure the policy could retry: one token less.
    pub(crate) fn failed(&self) {
        let _ = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| Some(t.saturating_sub(1000)));
    }

    /// A success: `token_ratio` more, up to the maximum.
    pub(crate) fn succeeded(&self) {
        let (max, ratio) = (self.max, self.ratio);
        let _ = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| Some((t + ratio).min(max)));
    }

    /// Retries are allowed while more than half the tokens are left.
    pub(crate) fn allows(&self) -> bool {
        self.tokens.load(Ordering::Relaxed) > self.max / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_go_method_service_default() {
        let sc = ServiceConfig::from_json(
            r#"{"methodConfig": [
                {"name": [{"service": "a.S", "method": "M"}], "timeout": "1s"},
                {"name": [{"service": "a.S"}], "timeout": "2s"},
                {"name": [{}], "timeout": "3s", "waitForReady": true}
            ]}"#,
        )
        .expect("parses");
        let t = |p: &str| sc.method(p).and_then(|m| m.timeout);
        assert_eq!(t("/a.S/M"), Some(Duration::from_secs(1)));
        assert_eq!(t("/a.S/N"), Some(Duration::from_secs(2)));
        assert_eq!(t("/b.T/M"), Some(Duration::from_secs(3)));
        assert_eq!(sc.method("/b.T/M").and_then(|m| m.wait_for_ready), Some(true));
    }

    #[test]
    fn policies_parse_and_bad_ones_name_the_field() {
        let sc = ServiceConfig::from_json(
            r#"{"loadBalancingConfig": [{"grpclb": {}}, {"round_robin": {}}],
                "unknownField": 1,
                "methodConfig": [{"name": [{"service": "s"}], "retryPolicy": {
                  "maxAttempts": 9, "initialBackoff": "0.1s", "maxBackoff": "1s",
                  "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", 10]}}]}"#,
        )
        .expect("parses");
        assert_eq!(sc.lb, Some(LbPolicy::RoundRobin));
        let r = sc.method("/s/x").and_then(|m| m.retry.clone()).expect("retry");
        assert_eq!(r.max_attempts, MAX_ATTEMPTS, "capped at 5");
        assert_eq!(r.retryable, vec![Code::Unavailable, Code::Aborted]);
        for (json, field) in [
            (r#"{"methodConfig": [{"name": [{}], "timeout": "1"}]}"#, "methodConfig[0].timeout"),
            (
                r#"{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 1, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
                "maxAttempts",
            ),
            (
                r#"{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 2, "initialBackoff": "0s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
                "initialBackoff",
            ),
            (
                r#"{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 2, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["NOPE"]}}]}"#,
                "retryableStatusCodes",
            ),
            (
                r#"{"methodConfig": [{"name": [{"service": "s"}]}, {"name": [{"service": "s"}]}]}"#,
                "named twice",
            ),
            (r#"{"methodConfig": [{"name": [{"method": "m"}]}]}"#, "without its service"),
            (r#"{"loadBalancingConfig": [{"grpclb": {}}]}"#, "loadBalancingConfig"),
            (r#"{"retryThrottling": {"maxTokens": 0, "tokenRatio": 1}}"#, "maxTokens"),
            (r#"[1]"#, "not an object"),
        ] {
            let err = ServiceConfig::from_json(json).expect_err(json);
            assert!(err.message.contains(field), "{json}: {}", err.message);
        }
    }

    #[test]
    fn weighted_round_robin_takes_the_out_of_band_settings() {
        let sc = ServiceConfig::from_json(
            r#"{"loadBalancingConfig": [{"weighted_round_robin": {
                  "enableOobLoadReport": true, "oobReportingPeriod": "2.5s"}}]}"#,
        )
        .expect("parses");
        let Some(LbPolicy::WeightedRoundRobin(c)) = sc.lb else { panic!("{:?}", sc.lb) };
        assert!(c.enable_oob_load_report);
        assert_eq!(c.oob_reporting_period, Duration::from_millis(2500));
        let plain = r#"{"loadBalancingConfig": [{"weighted_round_robin": {}}]}"#;
        let Some(LbPolicy::WeightedRoundRobin(d)) =
            ServiceConfig::from_json(plain).expect("parses").lb
        else {
            panic!("not weighted round robin")
        };
        assert!(!d.enable_oob_load_report, "per-call reports by default");
        assert_eq!(d.oob_reporting_period, Duration::from_secs(10), "gRFC A58's default");
        let bad =
            r#"{"loadBalancingConfig": [{"weighted_round_robin": {"enableOobLoadReport": 1}}]}"#;
        let err = ServiceConfig::from_json(bad).expect_err("not a bool");
        assert!(err.message.contains("enableOobLoadReport"), "{}", err.message);
    }

    #[test]
    fn dns_choices_apply_by_language_percentage_and_host() {
        let txt = r#"grpc_config=[
            {"clientLanguage": ["go", "c++"], "serviceConfig": {"loadBalancingPolicy": "pick_first"}},
            {"percentage": 30, "serviceConfig": {"loadBalancingConfig": [{"weighted_round_robin": {}}]}},
            {"clientHostname": ["other"], "serviceConfig": {}},
            {"clientLanguage": ["RUST"], "clientHostname": ["me"],
             "serviceConfig": {"loadBalancingConfig": [{"round_robin": {}}]}}
        ]"#;
        let lb = |host: &str, roll: u32| {
            ServiceConfig::from_dns_txt(txt, host, roll).expect("valid").and_then(|c| c.lb)
        };
        assert!(matches!(lb("me", 30), Some(LbPolicy::WeightedRoundRobin(_))), "30 ≤ 30");
        assert_eq!(lb("me", 31), Some(LbPolicy::RoundRobin), "31 > 30: the next that applies");
        assert!(ServiceConfig::from_dns_txt(txt, "you", 100).expect("valid").is_none());
        for (bad, field) in [
            (r#"grpc_conf=[]"#, "TXT record"),
            (r#"grpc_config={}"#, "not a list"),
            (r#"grpc_config=[{"serviceConfig": {}, "colour": 1}]"#, "colour"),
            (r#"grpc_config=[{"percentage": 101, "serviceConfig": {}}]"#, "percentage"),
            (r#"grpc_config=[{"clientLanguage": "rust", "serviceConfig": {}}]"#, "clientLanguage"),
            (r#"grpc_config=[{"percentage": 5}]"#, "no serviceConfig"),
            (r#"grpc_config=[{"serviceConfig": {"methodConfig": 1}}]"#, "methodConfig"),
        ] {
            let err = ServiceConfig::from_dns_txt(bad, "me", 1).expect_err(bad);
            assert!(err.message.contains(field), "{bad}: {}", err.message);
        }
    }

    #[test]
    fn the_throttle_stops_retries_below_half_and_recovers() {
        let t = Throttle::new(Throttling { max_tokens: 10, token_ratio: 0.5 });
        for _ in 0..5 {
            assert!(t.allows());
            t.failed();
        }
        assert!(!t.allows(), "5 of 10 tokens left: not more than half");
        t.succeeded();
        assert!(t.allows(), "5.5 tokens");
    }
}
