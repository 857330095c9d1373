//! Target names and the resolvers that turn them into addresses.
//!
//! A channel's target follows gRPC's naming rules
//! (`doc/naming.md` in grpc/grpc):
//!
//! | target | resolved by |
//! |---|---|
//! | `host:port`, `http://host:port`, `https://host:port` | DNS (as `dns:///host:port`) |
//! | `dns:///host:port`, `dns:host:port` | DNS (the system's resolver), asked again on a timer and when a connection is lost |
//! | `dns://SERVER/host:port` (`SERVER` an IP address, port 53 unless given) | DNS, A and AAAA records asked of that server ([`crate::dns`]), the same way |
//! | `ipv4:10.0.0.1:50051,10.0.0.2:50051` | the list itself |
//! | `ipv6:[::1]:50051,[::2]:50052` (`ipv6:::1` without a port) | the list itself |
//! | `unix:/path/sock`, `unix:///path/sock`, `unix:relative/sock` | the path itself |
//!
//! A port left out is 443, as in gRPC. Other schemes are refused with an
//! error naming the schemes there are; a resolver of one's own (a
//! service registry, a test pushing addresses) is given to the channel as
//! [`ChannelOptions::resolver`](crate::ChannelOptions::resolver)
//! (see [`Resolver`] and [`ManualResolver`]).
//!
//! What a resolver returns is a [`Resolution`]: the addresses in the order
//! the resolver ranks them. The channel's load-balancing policy
//! ([`crate::balance`]) decides which of them get connections and calls.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use protoplane_grpc::status::{Code, Status};
use protoplane_grpc::BoxFuture;
use tokio::sync::watch;

use crate::config::ServiceConfig;

/// gRPC's default port, for targets that leave it out.
pub const DEFAULT_PORT: u16 = 443;

/// Where a connection can be made.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Address {
    /// A TCP endpoint.
    Tcp(SocketAddr),
    /// A Unix-domain stream socket.
    Unix(PathBuf),
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Tcp(a) => write!(f, "{a}"),
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl From<SocketAddr> for Address {
    fn from(a: SocketAddr) -> Address {
        Address::Tcp(a)
    }
}

/// What a resolver found: the addresses, best first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolution {
    /// Every address the target stands for now. An empty list is a
    /// resolution too (the service has no endpoint): calls then wait for
    /// one or fail, as their `wait_for_ready` says.
    pub addresses: Vec<Address>,
    /// A weight per address, for round robin (an xDS endpoint's locality
    /// weight times its own); empty: every address weighs the same.
    pub weights: Vec<u32>,
}

impl Resolution {
    /// A resolution of `addresses`.
    pub fn new(addresses: impl IntoIterator<Item = Address>) -> Resolution {
        Resolution { addresses: addresses.into_iter().collect(), weights: Vec::new() }
    }
}

/// Turns a target into addresses.
///
/// A resolver is asked with [`Resolver::resolve`] when a channel starts.
/// One whose answers go stale by themselves (DNS) says so with
/// [`Resolver::asks_again`]: the channel then asks again on a timer and
/// after it loses a connection (no more often than
/// `ChannelOptions::resolve_min_interval`). One that learns of changes
/// itself (a registry watch, xDS, a test) hands out
/// [`Resolver::updates`], and every value sent there replaces the
/// channel's addresses at once.
pub trait Resolver: Send + Sync + 'static {
    /// The addresses now.
    fn resolve(&self) -> BoxFuture<'static, Result<Resolution, Status>>;

    /// Whether the answer goes stale and must be asked for again.
    fn asks_again(&self) -> bool {
        false
    }

    /// Changes the resolver pushes, if it does.
    fn updates(&self) -> Option<watch::Receiver<Resolution>> {
        None
    }
}

impl fmt::Debug for dyn Resolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Resolver")
    }
}

/// A parsed target: how to resolve it and what `:authority` calls carry.
#[derive(Clone)]
pub struct Target {
    /// The `:authority` of the calls (the host and port as written, for
    /// DNS; `localhost` for Unix sockets).
    pub authority: String,
    /// What finds the addresses.
    pub resolver: Arc<dyn Resolver>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target").field("authority", &self.authority).finish_non_exhaustive()
    }
}

fn bad_target(target: &str, why: impl fmt::Display) -> Status {
    Status::new(Code::InvalidArgument, format!("target {target:?}: {why}"))
}

/// Splits `host[:port]` (`[v6]:port` for IPv6) into host and port.
fn host_port(s: &str) -> Result<(String, u16), String> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("an unclosed '['")?;
        let port = match after {
            "" => DEFAULT_PORT,
            p => p
                .strip_prefix(':')
                .ok_or("text after ']'")?
                .parse()
                .map_err(|_| format!("bad port in {s:?}"))?,
        };
        return Ok((host.to_string(), port));
    }
    match s.rsplit_once(':') {
        // More than one ':' without brackets: a bare IPv6 address.
        Some((h, _)) if h.contains(':') => Ok((s.to_string(), DEFAULT_PORT)),
        Some((h, p)) => Ok((h.to_string(), p.parse().map_err(|_| format!("bad port in {s:?}"))?)),
        None => Ok((s.to_string(), DEFAULT_PORT)),
    }
}

/// Whether a channel can be made to `target`: a scheme registered with
/// [`crate::route::register_scheme`] (`xds:`), or one [`parse`] takes.
pub fn check(target: &str) -> Result<(), Status> {
    if crate::route::factory_for(target).is_some() {
        return Ok(());
    }
    parse(target).map(|_| ())
}

/// Parses a target (see the module's table).
pub fn parse(target: &str) -> Result<Target, Status> {
    parse_with_dns(target).map(|(t, _)| t)
}

/// A parsed target and, for a `dns:` one, its host and the DNS server it
/// names.
type DnsParts = Option<(String, Option<SocketAddr>)>;

fn parse_with_dns(target: &str) -> Result<(Target, DnsParts), Status> {
    const KNOWN: [&str; 6] = ["dns", "ipv4", "ipv6", "unix", "http", "https"];
    let (scheme, rest) = match target.split_once(':') {
        Some((s, rest)) if KNOWN.contains(&s.to_ascii_lowercase().as_str()) => {
            (s.to_ascii_lowercase(), rest)
        }
        // Another scheme: a name of letters before the colon, and not a
        // port after it (`localhost:50051` is a host and a port).
        Some((s, rest))
            if !s.is_empty()
                && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'+')
                && !rest.bytes().next().is_some_and(|b| b.is_ascii_digit()) =>
        {
            (s.to_ascii_lowercase(), rest)
        }
        _ => ("dns".to_string(), target),
    };
    match scheme.as_str() {
        "dns" | "http" | "https" => {
            // `dns:///host`, `dns://authority/host`, `dns:host`;
            // `http://host:port/`.
            let name = match rest.strip_prefix("//") {
                Some(r) if scheme == "dns" => r.split_once('/').map(|(_, n)| n).unwrap_or(r),
                Some(r) => r.trim_end_matches('/'),
                None => rest,
            };
            if name.is_empty() {
                return Err(bad_target(target, "no host"));
            }
            let (host, port) = host_port(name).map_err(|e| bad_target(target, e))?;
            let authority = if name.contains(':') && !name.ends_with(']') {
                name.to_string()
            } else {
                name.to_string() + &format!(":{port}")
            };
            let server = dns_server(scheme.as_str(), rest).map_err(|e| bad_target(target, e))?;
            let parts = Some((host.clone(), server));
            Ok((Target { authority, resolver: Arc::new(Dns { host, port, server }) }, parts))
        }
        "ipv4" | "ipv6" => {
            let mut addrs = Vec::new();
            for part in rest.split(',') {
                let (host, port) = host_port(part).map_err(|e| bad_target(target, e))?;
                let ip: IpAddr = host
                    .parse()
                    .map_err(|_| bad_target(target, format!("{host:?} is not an IP address")))?;
                if ip.is_ipv4() != (scheme == "ipv4") {
                    return Err(bad_target(target, format!("{ip} is not an {scheme} address")));
                }
                addrs.push(Address::Tcp(SocketAddr::new(ip, port)));
            }
            let authority = rest.split(',').next().unwrap_or_default().to_string();
            Ok((Target { authority, resolver: Arc::new(Fixed(Resolution::new(addrs))) }, None))
        }
        "unix" => {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(bad_target(target, "no path"));
            }
            let res = Resolution::new([Address::Unix(PathBuf::from(path))]);
            Ok((Target { authority: "localhost".into(), resolver: Arc::new(Fixed(res)) }, None))
        }
        other => Err(bad_target(
            target,
            format!(
                "no resolver for the scheme {other:?} (there are dns, ipv4, ipv6 and unix; \
                 give your own as ChannelOptions::resolver)"
            ),
        )),
    }
}

/// A list that never changes (`ipv4:`, `ipv6:`, `unix:` targets).
struct Fixed(Resolution);

impl Resolver for Fixed {
    fn resolve(&self) -> BoxFuture<'static, Result<Resolution, Status>> {
        let r = self.0.clone();
        Box::pin(async move { Ok(r) })
    }
}

/// The DNS server a `dns://SERVER/host` target names (`ip` or
/// `ip:port`, port 53 by default); `None` for any other form.
fn dns_server(scheme: &str, rest: &str) -> Result<Option<SocketAddr>, String> {
    let Some(r) = rest.strip_prefix("//").filter(|_| scheme == "dns") else { return Ok(None) };
    let auth = r.split_once('/').map_or("", |(a, _)| a);
    if auth.is_empty() {
        return Ok(None);
    }
    if let Ok(a) = auth.parse::<SocketAddr>() {
        return Ok(Some(a));
    }
    let ip = auth.trim_start_matches('[').trim_end_matches(']');
    ip.parse::<IpAddr>()
        .map(|ip| Some(SocketAddr::new(ip, 53)))
        .map_err(|_| format!("the DNS server {auth:?} is not an IP address (and port)"))
}

/// DNS: the system's resolver (`getaddrinfo` on a blocking thread), or the
/// DNS server the target names, asked for A and AAAA records directly
/// ([`crate::dns`]).
struct Dns {
    host: String,
    port: u16,
    server: Option<SocketAddr>,
}

/// The service config of a `dns:` target from its TXT records (gRFC A2,
/// see [`ServiceConfig::from_dns_txt`]): asked of the DNS server the
/// target names, or the first of `/etc/resolv.conf`. `Ok(None)`: no record,
/// or no choice for this client. Another kind of target has none.
pub async fn dns_service_config(target: &str) -> Result<Option<ServiceConfig>, Status> {
    let (host, server) = match parse_dns(target)? {
        Some(d) => d,
        None => return Ok(None),
    };
    if host.parse::<IpAddr>().is_ok() {
        return Ok(None);
    }
    let server = server
        .or_else(crate::dns::system_server)
        .ok_or_else(|| Status::new(Code::Unavailable, "no DNS server (/etc/resolv.conf)"))?;
    let name = format!("_grpc_config.{host}");
    let records = crate::dns::lookup(server, &name, crate::dns::TXT, DNS_TXT_TIMEOUT)
        .await
        .map_err(|e| Status::new(Code::Unavailable, format!("TXT {name}: {e}")))?;
    let mut text = Vec::new();
    for r in records {
        if let crate::dns::Record::Txt(t) = r {
            text.extend_from_slice(&t);
        }
    }
    if text.is_empty() {
        return Ok(None);
    }
    let text = String::from_utf8(text)
        .map_err(|_| Status::new(Code::InvalidArgument, format!("TXT {name}: not UTF-8")))?;
    let roll = (crate::backoff::random_u64() % 100) as u32 + 1;
    ServiceConfig::from_dns_txt(&text, &this_host(), roll)
}

/// The host and named DNS server of a `dns:` target (`None` for others).
fn parse_dns(target: &str) -> Result<DnsParts, Status> {
    parse_with_dns(target).map(|(_, dns)| dns)
}

/// How long the TXT lookup may hold up a connection.
const DNS_TXT_TIMEOUT: Duration = Duration::from_secs(2);

/// This machine's name, for gRFC A2's `clientHostname`.
fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default()
}

/// How long one DNS query may take.
const DNS_TIMEOUT: Duration = Duration::from_secs(10);

impl Resolver for Dns {
    fn resolve(&self) -> BoxFuture<'static, Result<Resolution, Status>> {
        let (host, port) = (self.host.clone(), self.port);
        if let (Some(server), Err(_)) = (self.server, host.parse::<IpAddr>()) {
            return Box::pin(ask_server(server, host, port));
        }
        Box::pin(async move {
            let query = tokio::net::lookup_host((host.as_str(), port));
            let found = match tokio::time::timeout(DNS_TIMEOUT, query).await {
                Ok(Ok(found)) => found,
                Ok(Err(e)) => {
                    return Err(Status::new(Code::Unavailable, format!("resolve {host}: {e}")))
                }
                Err(_) => {
                    return Err(Status::new(
                        Code::Unavailable,
                        format!("resolve {host}: timed out"),
                    ))
                }
            };
            // The system's order, without repeats.
            let mut addrs: Vec<Address> = Vec::new();
            for a in found {
                let a = Address::Tcp(a);
                if !addrs.contains(&a) {
                    addrs.push(a);
                }
            }
            Ok(Resolution::new(addrs))
        })
    }

    fn asks_again(&self) -> bool {
        true
    }
}

/// `host`'s A and AAAA records from `server` (IPv4 first, each in the
/// server's order), as addresses with `port`. One query per family; a
/// family that fails is left out unless both fail.
async fn ask_server(server: SocketAddr, host: String, port: u16) -> Result<Resolution, Status> {
    let (v4, v6) = tokio::join!(
        crate::dns::lookup(server, &host, crate::dns::A, DNS_TIMEOUT),
        crate::dns::lookup(server, &host, crate::dns::AAAA, DNS_TIMEOUT),
    );
    if let (Err(e), Err(_)) = (&v4, &v6) {
        return Err(Status::new(Code::Unavailable, format!("resolve {host} at {server}: {e}")));
    }
    let mut addrs: Vec<Address> = Vec::new();
    for r in v4.into_iter().chain(v6).flatten() {
        if let crate::dns::Record::Addr(ip) = r {
            let a = Address::Tcp(SocketAddr::new(ip, port));
            if !addrs.contains(&a) {
                addrs.push(a);
            }
        }
    }
    Ok(Resolution::new(addrs))
}

/// A resolver whose addresses are set from code: for tests, and for
/// service registries that push changes. Every [`ManualResolver::set`]
/// reaches the channels using it at once.
///
/// ```
/// use protoplane_rpc::resolve::{Address, ManualResolver};
///
/// let r = ManualResolver::new(["127.0.0.1:50051".parse::<std::net::SocketAddr>().expect("test value").into()]);
/// r.set(vec![Address::Tcp("127.0.0.1:50052".parse().expect("test value"))]);
/// assert_eq!(r.current().addresses.len(), 1);
/// ```
#[derive(Clone, Debug)]
pub struct ManualResolver {
    tx: Arc<watch::Sender<Resolution>>,
}

impl ManualResolver {
    /// A resolver answering `addresses` until told otherwise.
    pub fn new(addresses: impl IntoIterator<Item = Address>) -> ManualResolver {
        ManualResolver { tx: Arc::new(watch::Sender::new(Resolution::new(addresses))) }
    }

    /// Replaces the addresses.
    pub fn set(&self, addresses: Vec<Address>) {
        self.tx.send_replace(Resolution::new(addresses));
    }

    /// Replaces the addresses, each with a round-robin weight.
    pub fn set_weighted(&self, addresses: Vec<(Address, u32)>) {
        let (addresses, weights) = addresses.into_iter().unzip();
        self.tx.send_replace(Resolution { addresses, weights });
    }

    /// The addresses now.
    pub fn current(&self) -> Resolution {
        self.tx.borrow().clone()
    }
}

impl Resolver for ManualResolver {
    fn resolve(&self) -> BoxFuture<'static, Result<Resolution, Status>> {
        let r = self.current();
        Box::pin(async move { Ok(r) })
    }

    fn updates(&self) -> Option<watch::Receiver<Resolution>> {
        Some(self.tx.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(t: &str) -> Vec<Address> {
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("test value");
        rt.block_on(parse(t).expect("parses").resolver.resolve()).expect("resolves").addresses
    }

    fn tcp(s: &str) -> Address {
        Address::Tcp(s.parse().expect("test value"))
    }

    #[test]
    fn the_naming_forms_resolve() {
        assert_eq!(addrs("127.0.0.1:7"), vec![tcp("127.0.0.1:7")]);
        assert_eq!(addrs("http://127.0.0.1:7/"), vec![tcp("127.0.0.1:7")]);
        assert_eq!(addrs("dns:///127.0.0.1:7"), vec![tcp("127.0.0.1:7")]);
        assert_eq!(addrs("dns://8.8.8.8/127.0.0.1:7"), vec![tcp("127.0.0.1:7")]);
        assert_eq!(addrs("dns:127.0.0.1"), vec![tcp("127.0.0.1:443")]);
        assert_eq!(
            addrs("ipv4:127.0.0.1:1,127.0.0.2:2,127.0.0.3"),
            vec![tcp("127.0.0.1:1"), tcp("127.0.0.2:2"), tcp("127.0.0.3:443")]
        );
        assert_eq!(addrs("ipv6:[::1]:5,::1"), vec![tcp("[::1]:5"), tcp("[::1]:443")]);
        assert_eq!(addrs("unix:///tmp/a.sock"), vec![Address::Unix("/tmp/a.sock".into())]);
        assert_eq!(addrs("unix:rel.sock"), vec![Address::Unix("rel.sock".into())]);
        assert!(addrs("dns:///localhost:9").iter().all(|a| match a {
            Address::Tcp(s) => s.ip().is_loopback() && s.port() == 9,
            Address::Unix(_) => false,
        }));
    }

    #[test]
    fn authorities_are_what_calls_name() {
        assert_eq!(
            parse("dns:///example.com:50051").expect("test value").authority,
            "example.com:50051"
        );
        assert_eq!(parse("example.com:8").expect("test value").authority, "example.com:8");
        assert_eq!(parse("dns:example.com").expect("test value").authority, "example.com:443");
        assert_eq!(parse("unix:/x").expect("test value").authority, "localhost");
        assert_eq!(
            parse("ipv4:10.0.0.1:5,10.0.0.2:5").expect("test value").authority,
            "10.0.0.1:5"
        );
    }

    #[test]
    fn bad_targets_say_what_is_wrong() {
        for (t, why) in [
            ("ipv4:10.0.0.1:x", "bad port"),
            ("ipv4:::1", "not an ipv4 address"),
            ("ipv6:10.0.0.1:5", "not an ipv6 address"),
            ("ipv4:example.com:5", "not an IP address"),
            ("consul:///svc", "no resolver for the scheme \"consul\""),
            ("dns:///", "no host"),
            ("unix:", "no path"),
        ] {
            let err = parse(t).expect_err(t);
            assert_eq!(err.code, Code::InvalidArgument);
            assert!(err.message.contains(why), "{t}: {}", err.message);
        }
    }
}
