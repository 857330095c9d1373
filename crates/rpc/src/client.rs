//! The gRPC client over HTTP/2.
//!
//! A [`Channel`] is a target's connections (cheap to clone; calls are
//! multiplexed on them): its name is resolved ([`crate::resolve`]) and its
//! calls spread by a load-balancing policy ([`crate::balance`]); a
//! `host:port` target with the default policy is one HTTP/2 connection. [`Channel::start`] opens a call on a method path and
//! returns a [`ClientCall`], the client's engine side of one call: it frames
//! and (optionally) compresses what the application sends, and decodes what
//! the server answers. The same object serves all four call kinds; the
//! helpers [`Client::unary`] and friends cover the common shapes.
//!
//! The deadline given at start is sent as `grpc-timeout` and also enforced
//! locally: when it passes, the call is reset and fails with
//! `DEADLINE_EXCEEDED`. Dropping a call that has not finished resets its
//! stream (`RST_STREAM(CANCEL)`), which is how a client cancels.

use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protoplane_wire::{Block, Decoder, EncodeOptions, Encoder, Source};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::backoff::Backoff;
pub use crate::balance::Connectivity;
use crate::balance::{Balancer, LbPolicy};
use crate::config::{HedgingPolicy, MethodConfig, RetryPolicy, ServiceConfig, Throttle};
use crate::http2::client::{self as native, Fields};
use crate::intercept::{ClientChain, Ending};
use crate::metrics::{CallSizes, MethodCalls, Metrics};
use crate::resolve::{Address, Resolver};
use crate::server::GrpcTransport;
use protoplane_grpc::call::{Message, Request};
use protoplane_grpc::codec::{self, Encoding, ACCEPT_ENCODING};
use protoplane_grpc::frame::FrameDecoder;
use protoplane_grpc::metadata::Metadata;
use protoplane_grpc::schema::Schema;
use protoplane_grpc::status::{Code, Status};
use protoplane_grpc::timeout;
use protoplane_http2::conn::FieldSink;
use protoplane_http2::hpack::Index;

/// Client settings.
#[derive(Clone, Debug)]
pub struct ChannelOptions {
    /// Largest response message accepted (after decompression).
    pub max_recv_message: usize,
    /// Largest request message sent.
    pub max_send_message: usize,
    /// HTTP/2 stream receive window.
    pub stream_window: u32,
    /// HTTP/2 connection receive window.
    pub connection_window: u32,
    /// TLS: the server name to verify and the roots to trust (PEM). `None`
    /// for plaintext (h2c with prior knowledge).
    pub tls: Option<ClientTls>,
    /// Time allowed for one connection attempt: TCP connect, TLS and
    /// HTTP/2 handshakes (gRPC's `MIN_CONNECT_TIMEOUT`, 20 s).
    pub connect_timeout: Duration,
    /// How attempts to connect again are spaced after one fails.
    pub backoff: Backoff,
    /// The HTTP/2 implementation: protoplane's own (the default) or the
    /// `h2` crate, kept for comparison.
    pub transport: GrpcTransport,
    /// Keepalive pings (gRFC A8; none by default, as in grpc-go). The
    /// native transport only.
    pub keepalive: Option<crate::keepalive::ClientKeepalive>,
    /// How calls spread over the target's addresses ([`crate::balance`]).
    pub lb: LbPolicy,
    /// A resolver of one's own ([`crate::resolve::Resolver`]): the target
    /// string then only names the `:authority` of the calls.
    pub resolver: Option<Arc<dyn Resolver>>,
    /// How often a DNS target is resolved again while the channel lives.
    pub resolve_every: Duration,
    /// The shortest time between two resolutions that lost connections
    /// ask for (grpc-go's DNS resolver: 30 s).
    pub resolve_min_interval: Duration,
    /// gRPC service config ([`crate::config`]): per-method timeouts,
    /// `wait_for_ready` and retry policies, retry throttling; its
    /// load-balancing policy, when it names one, replaces `lb`.
    pub service_config: Option<Arc<ServiceConfig>>,
    /// gRFC A2: when no `service_config` is given, [`Channel::connect_with`]
    /// looks one up in the DNS TXT records of a `dns:` target
    /// (`_grpc_config.<host>`, from the DNS server the target names or the
    /// system's). Off by default, as in gRPC Java and C++: a slow or absent
    /// DNS server then never delays a connection. A lookup that fails, or a
    /// record that does not parse, leaves the channel without one (logged).
    pub dns_service_config: bool,
}

/// TLS settings of a client.
#[derive(Clone, Debug, Default)]
pub struct ClientTls {
    /// The name the server's certificate must carry.
    pub server_name: String,
    /// PEM certificates of the trusted roots.
    pub roots_pem: Vec<u8>,
    /// The client's own certificate chain and private key (PEM), presented
    /// to a server that requires one (mutual TLS).
    pub identity: Option<Identity>,
}

/// A certificate chain and its private key, PEM.
#[derive(Clone, Default)]
pub struct Identity {
    /// The certificate chain, leaf first.
    pub cert_pem: Vec<u8>,
    /// The private key.
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a private key.
        f.debug_struct("Identity").field("cert_pem", &self.cert_pem.len()).finish_non_exhaustive()
    }
}

impl Default for ChannelOptions {
    fn default() -> Self {
        ChannelOptions {
            max_recv_message: 4 << 20,
            max_send_message: i32::MAX as usize,
            stream_window: 1 << 20,
            connection_window: 4 << 20,
            tls: None,
            connect_timeout: Duration::from_secs(20),
            backoff: Backoff::default(),
            transport: GrpcTransport::Native,
            keepalive: None,
            lb: LbPolicy::PickFirst,
            resolver: None,
            resolve_every: Duration::from_secs(300),
            resolve_min_interval: Duration::from_secs(30),
            service_config: None,
            dns_service_config: false,
        }
    }
}

/// A gRPC server's connections, dialled again when they are gone.
///
/// The target is resolved into addresses and the channel's policy
/// ([`ChannelOptions::lb`]) picks the connection of each call; see
/// [`crate::balance`]. Reconnection follows gRPC's connection-backoff
/// rules ([`Backoff`]): a lost connection is dialled again at once, by the
/// next call (round robin: in the background); a failed attempt makes
/// that address back off (1 s, then 1.6 times longer each time, ±20%, at
/// most 120 s). While every address backs off, a call fails at once with
/// UNAVAILABLE naming the last error, unless its
/// [`CallOptions::wait_for_ready`] is set: then it waits for a connection
/// until its deadline. [`Channel::connectivity`] says where the channel
/// is.
///
/// Once a connection is closed or its server sent GOAWAY (a graceful
/// shutdown, a restart, another engine taking over), the next call goes
/// to a new one (one dial for all the calls that need it), and a call the
/// old connection refused before its request left (GOAWAY, closed) is
/// started again on the new one once (gRFC A6's transparent retry: the
/// server never saw it). Calls already running on the old connection
/// finish there. A channel made with [`Channel::over`] has no target and
/// stays on its one stream.
#[derive(Clone, Debug)]
pub struct Channel {
    /// Where calls go: a balancer's connections, or a router that picks
    /// each call's channel.
    calls: Calls,
    authority: String,
    scheme: &'static str,
    opts: Arc<ChannelOptions>,
    /// Client interceptors around every call ([`Channel::intercept`]).
    interceptors: Option<Arc<ClientChain>>,
    /// A66 client metrics ([`Channel::metrics`]) and the target they name.
    metrics: Option<(Arc<Metrics>, Arc<str>)>,
    /// The service config's retry token bucket (one per channel).
    throttle: Option<Arc<Throttle>>,
}

/// Where a channel's calls go.
#[derive(Clone, Debug)]
enum Calls {
    /// The connections and the policy that picks among them.
    Balanced(Arc<Balancer>),
    /// A routed channel (`xds:///`): each call's channel is picked here.
    Routed(Arc<dyn crate::route::CallRouter>),
    /// Calls made by another process (a split application's engine).
    Delegated(Arc<dyn crate::delegate::Delegate>),
}

/// One connection of a channel.
#[derive(Clone, Debug)]
pub(crate) enum Link {
    /// Not connected yet (a lazy channel before its first call).
    Idle,
    Native(Arc<NativeHandle>),
    #[cfg(feature = "h2")]
    H2(Arc<h2::client::SendRequest<Bytes>>),
}

/// The last clone of a channel going away lets its connection close once
/// the calls still running end.
#[derive(Debug)]
pub(crate) struct NativeHandle(Arc<native::Link>);

impl Link {
    /// Whether new calls may start on it.
    pub(crate) fn usable(&self) -> bool {
        match self {
            Link::Idle => false,
            Link::Native(h) => h.0.usable(),
            #[cfg(feature = "h2")]
            // h2 reports a GOAWAY received (or any connection error) as
            // an error from `poll_ready`; a fresh clone has no stream
            // pending, so the answer is immediate.
            Link::H2(send) => {
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                !matches!((**send).clone().poll_ready(&mut cx), std::task::Poll::Ready(Err(_)))
            }
        }
    }

    /// Whether its server closed it for pinging too often (once).
    pub(crate) fn sent_away_for_pings(&self) -> bool {
        match self {
            Link::Native(h) => h.0.sent_away_for_pings(),
            _ => false,
        }
    }
}

impl Drop for NativeHandle {
    fn drop(&mut self) {
        self.0.abandon();
    }
}

/// Per-call settings.
///
/// ```
/// use std::time::Duration;
/// use protoplane_rpc::CallOptions;
///
/// let opts = CallOptions::default().with_timeout(Duration::from_millis(250)).wait_for_ready();
/// assert_eq!(opts.timeout, Some(Duration::from_millis(250)));
/// ```
#[derive(Clone, Debug, Default)]
pub struct CallOptions {
    /// Custom metadata sent with the request headers.
    pub metadata: Metadata,
    /// How long the client waits for the whole call (sent as
    /// `grpc-timeout`). A call made while a handler runs also ends by that
    /// handler's own deadline, whichever comes first
    /// ([`crate::deadline::current`]).
    pub timeout: Option<Duration>,
    /// gzip-compress the request messages.
    pub compress: bool,
    /// While the channel has no connection and backs off after a failed
    /// attempt, wait for one (until the deadline) instead of failing at
    /// once with UNAVAILABLE (gRPC's `wait_for_ready`).
    pub wait_for_ready: bool,
}

impl CallOptions {
    /// The same options with a timeout for the whole call.
    pub fn with_timeout(mut self, timeout: Duration) -> CallOptions {
        self.timeout = Some(timeout);
        self
    }

    /// The same options, waiting for the channel to be ready.
    pub fn wait_for_ready(mut self) -> CallOptions {
        self.wait_for_ready = true;
        self
    }

    /// When the call must end: its own timeout from `now`, or the deadline
    /// of the handler it is made from, whichever is first.
    fn deadline(&self, now: Instant) -> Option<Instant> {
        // A timeout too long to add is no timeout.
        let own = self.timeout.and_then(|t| now.checked_add(t));
        match (own, crate::deadline::current()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

pub(crate) fn unavailable(what: impl std::fmt::Display) -> Status {
    Status::new(Code::Unavailable, what.to_string())
}

fn deadline_exceeded() -> Status {
    Status::new(Code::DeadlineExceeded, "deadline exceeded")
}

/// Runs `f` until `deadline`, then fails with DEADLINE_EXCEEDED.
pub(crate) async fn timed<T>(
    deadline: Option<Instant>,
    f: impl Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    match deadline {
        None => f.await,
        Some(d) => {
            tokio::time::timeout_at(d.into(), f).await.unwrap_or_else(|_| Err(deadline_exceeded()))
        }
    }
}

pub(crate) const USER_AGENT: &str = "protoplane-rpc/0.1";

/// Dials `addr`: TCP or Unix socket, TLS when `opts` says, then the
/// HTTP/2 handshake.
pub(crate) async fn dial(addr: &Address, opts: &ChannelOptions) -> Result<Link, Status> {
    let refused = |e: std::io::Error| unavailable(format!("connect to {addr}: {e}"));
    match addr {
        Address::Tcp(a) => {
            let sock = TcpStream::connect(a).await.map_err(refused)?;
            let _ = sock.set_nodelay(true);
            secure(sock, addr, opts).await
        }
        #[cfg(unix)]
        Address::Unix(path) => {
            let sock = tokio::net::UnixStream::connect(path).await.map_err(refused)?;
            secure(sock, addr, opts).await
        }
        #[cfg(not(unix))]
        Address::Unix(_) => Err(unavailable(format!("connect to {addr}: no Unix sockets here"))),
    }
}

/// TLS on `sock` when the options ask for it, then HTTP/2.
async fn secure<IO>(sock: IO, addr: &Address, opts: &ChannelOptions) -> Result<Link, Status>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Some(tls) = &opts.tls else { return handshake(sock, opts).await };
    let identity = tls.identity.as_ref().map(|i| (&i.cert_pem[..], &i.key_pem[..]));
    let config = crate::tls::client_config_with_identity(&tls.roots_pem, identity)?;
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from(tls.server_name.clone())
        .map_err(|e| Status::new(Code::InvalidArgument, format!("server name: {e}")))?;
    let stream = tokio_rustls::TlsConnector::from(config)
        .connect(name, sock)
        .await
        .map_err(|e| unavailable(format!("TLS handshake with {addr}: {e}")))?;
    handshake(stream, opts).await
}

/// Starts HTTP/2 on `io`.
async fn handshake<IO>(io: IO, opts: &ChannelOptions) -> Result<Link, Status>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match opts.transport {
        GrpcTransport::Native => {
            let link = native::Link::start(
                io,
                opts.stream_window,
                opts.connection_window,
                opts.keepalive.clone(),
            );
            Ok(Link::Native(Arc::new(NativeHandle(link))))
        }
        #[cfg(feature = "h2")]
        GrpcTransport::H2 => Ok(Link::H2(Arc::new(crate::h2::client::handshake(io, opts).await?))),
    }
}

impl Channel {
    /// Connects to `target` with default options: `host:port` (optionally
    /// with an `http://` or `https://` prefix) or any target of
    /// [`crate::resolve`] (`dns:///`, `ipv4:`, `ipv6:`, `unix:`).
    pub async fn connect(target: &str) -> Result<Channel, Status> {
        Channel::connect_with(target, ChannelOptions::default()).await
    }

    /// Connects with explicit options: resolves the target and waits until
    /// a connection is ready (pick first: the first address that connects;
    /// round robin: any). Fails with the last attempt's error once every
    /// address has failed, or after `connect_timeout`.
    pub async fn connect_with(target: &str, mut opts: ChannelOptions) -> Result<Channel, Status> {
        if opts.dns_service_config && opts.service_config.is_none() && opts.resolver.is_none() {
            match crate::resolve::dns_service_config(target).await {
                Ok(Some(sc)) => opts.service_config = Some(Arc::new(sc)),
                Ok(None) => {}
                Err(st) => {
                    tracing::warn!(target, "service config from DNS not used: {}", st.message)
                }
            }
        }
        let limit = opts.connect_timeout;
        let ch = Channel::lazy_checked(target, opts)?;
        let Calls::Balanced(lb) = &ch.calls else {
            // Each call picks its own channel (and waits for the
            // configuration): nothing to connect to yet.
            return Ok(ch);
        };
        match lb.pick(false, Some(Instant::now() + limit)).await {
            Ok(_) => Ok(ch),
            Err(st) if st.code == Code::DeadlineExceeded => {
                Err(unavailable(format!("connect to {target}: timed out")))
            }
            Err(st) => Err(st),
        }
    }

    /// A channel to `target` that connects at its first call (tonic's
    /// `connect_lazy`; gRPC's default): made at once, whether or not the
    /// server is up. Its calls then connect, back off and wait as
    /// [`Channel`] says. A target that cannot be parsed makes a channel
    /// whose calls fail with the parse error; [`Channel::connect_with`]
    /// returns it at once.
    pub fn lazy(target: &str, opts: ChannelOptions) -> Channel {
        match Channel::lazy_checked(target, opts.clone()) {
            Ok(ch) => ch,
            Err(st) => {
                let why = Arc::new(Failing(st));
                let opts = ChannelOptions { resolver: Some(why), ..opts };
                Channel::lazy_checked(target, opts).expect("a given resolver always parses")
            }
        }
    }

    fn lazy_checked(target: &str, mut opts: ChannelOptions) -> Result<Channel, Status> {
        if opts.resolver.is_none() {
            if let Some(factory) = crate::route::factory_for(target) {
                let router = factory(target, &opts)?;
                let scheme = if opts.tls.is_some() { "https" } else { "http" };
                let opts = Arc::new(opts);
                return Ok(Channel {
                    calls: Calls::Routed(router),
                    authority: authority_of(target),
                    scheme,
                    opts,
                    interceptors: None,
                    metrics: None,
                    throttle: None,
                });
            }
        }
        if let Some(lb) = opts.service_config.as_ref().and_then(|sc| sc.lb) {
            opts.lb = lb;
        }
        let throttle = opts
            .service_config
            .as_ref()
            .and_then(|sc| sc.throttling)
            .map(|t| Arc::new(Throttle::new(t)));
        let scheme = if opts.tls.is_some() { "https" } else { "http" };
        let (authority, resolver) = match &opts.resolver {
            Some(r) => (authority_of(target), r.clone()),
            None => {
                let t = crate::resolve::parse(target)?;
                (t.authority, t.resolver)
            }
        };
        let opts = Arc::new(opts);
        Ok(Channel {
            calls: Calls::Balanced(Balancer::new(resolver, opts.clone())),
            authority,
            scheme,
            opts,
            interceptors: None,
            metrics: None,
            throttle,
        })
    }

    /// Where the channel is: ready, connecting, backing off after failed
    /// attempts, or idle (the next call dials). A channel made with
    /// [`Channel::over`] whose stream ended is in transient failure for
    /// good: it has nowhere to dial.
    pub fn connectivity(&self) -> Connectivity {
        match &self.calls {
            Calls::Routed(r) => r.connectivity(),
            Calls::Balanced(lb) => lb.connectivity(),
            Calls::Delegated(d) => d.connectivity(),
        }
    }

    /// How many backends the channel has a ready connection to, for a
    /// channel that balances its own connections (`None` for a routed or
    /// delegated one). [`Channel::connect_with`] returns once one is ready;
    /// the others may still be connecting.
    pub fn ready_backends(&self) -> Option<usize> {
        match &self.calls {
            Calls::Balanced(lb) => Some(lb.ready_connections()),
            Calls::Routed(_) | Calls::Delegated(_) => None,
        }
    }

    /// A channel over a byte stream already established (a Unix socket,
    /// an in-memory pipe, a tunnel): the HTTP/2 handshake runs on `io`, and
    /// requests name `authority`. Plaintext; `opts.tls` is not used.
    pub async fn over<IO>(io: IO, authority: &str, opts: ChannelOptions) -> Result<Channel, Status>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let link = handshake(io, &opts).await?;
        let opts = Arc::new(opts);
        Ok(Channel {
            calls: Calls::Balanced(Balancer::fixed(link, opts.clone())),
            authority: authority.to_string(),
            scheme: "http",
            throttle: opts
                .service_config
                .as_ref()
                .and_then(|sc| sc.throttling)
                .map(|t| Arc::new(Throttle::new(t))),
            opts,
            interceptors: None,
            metrics: None,
        })
    }

    /// A channel over one connection a balancer holds (its health
    /// checks), dialling nothing.
    pub(crate) fn on_link(link: Link, authority: &str, opts: ChannelOptions) -> Channel {
        let opts = Arc::new(opts);
        Channel {
            calls: Calls::Balanced(Balancer::fixed(link, opts.clone())),
            authority: authority.to_string(),
            scheme: if opts.tls.is_some() { "https" } else { "http" },
            opts,
            interceptors: None,
            metrics: None,
            throttle: None,
        }
    }

    /// A channel whose calls `delegate` makes (see [`crate::delegate`]):
    /// requests name `authority`.
    pub fn delegated(authority: &str, delegate: Arc<dyn crate::delegate::Delegate>) -> Channel {
        Channel {
            calls: Calls::Delegated(delegate),
            authority: authority.to_string(),
            scheme: "http",
            opts: Arc::default(),
            interceptors: None,
            metrics: None,
            throttle: None,
        }
    }

    /// The delegate making this channel's calls, if another process makes
    /// them.
    fn delegate(&self) -> Option<&Arc<dyn crate::delegate::Delegate>> {
        match &self.calls {
            Calls::Delegated(d) => Some(d),
            _ => None,
        }
    }

    /// Whether a connection takes new calls now: false once every
    /// connection's server sent GOAWAY or it closed (the next call then
    /// dials again). A call started before the channel has seen the
    /// GOAWAY may still go to the old server, which serves it (HTTP/2's
    /// graceful shutdown counts streams it received before its final
    /// GOAWAY as accepted).
    pub fn takes_calls(&self) -> bool {
        match &self.calls {
            Calls::Routed(r) => r.connectivity() == Connectivity::Ready,
            Calls::Balanced(lb) => lb.takes_calls(),
            Calls::Delegated(d) => d.connectivity() == Connectivity::Ready,
        }
    }

    /// The same channel (the same connection) with `chain` around every
    /// call made through it (after any chain it had).
    pub fn intercept(mut self, chain: ClientChain) -> Channel {
        if chain.is_empty() {
            return self;
        }
        let chain = match &self.interceptors {
            Some(had) => had.then(chain),
            None => chain,
        };
        self.interceptors = Some(Arc::new(chain));
        self
    }

    /// The same channel with A66's client metrics recorded into
    /// `metrics` (`grpc.target` is `target`, as the channel was asked to
    /// connect: `dns:host:port`, say). One attempt per call: calls a
    /// channel starts again transparently (refused before leaving) count
    /// once.
    pub fn metrics(mut self, metrics: Arc<Metrics>, target: &str) -> Channel {
        self.metrics = Some((metrics, Arc::from(target)));
        self
    }

    /// Starts a call on `path` (`/package.Service/Method`).
    pub async fn start(&self, path: &str, call: CallOptions) -> Result<ClientCall, Status> {
        let Some((metrics, target)) = &self.metrics else {
            return self.start_chained(path, call).await;
        };
        let calls = metrics.client_method(target, path);
        calls.start();
        let started = Instant::now();
        match self.start_chained(path, call).await {
            Ok(mut c) => {
                c.measured = Some((calls, started, CallSizes::default()));
                Ok(c)
            }
            Err(st) => {
                calls.end(st.code, started.elapsed(), CallSizes::default());
                Err(st)
            }
        }
    }

    async fn start_chained(&self, path: &str, call: CallOptions) -> Result<ClientCall, Status> {
        let Some(chain) = &self.interceptors else { return self.start_plain(path, call).await };
        let (call, ending) = chain.before(path, call).await?;
        match self.start_plain(path, call).await {
            Ok(mut c) => {
                c.ending = Some(Box::new(ending));
                Ok(c)
            }
            Err(st) => {
                ending.end(&st);
                Err(st)
            }
        }
    }

    async fn start_plain(&self, path: &str, call: CallOptions) -> Result<ClientCall, Status> {
        if let Calls::Delegated(_) = &self.calls {
            return Err(Status::new(
                Code::Unimplemented,
                format!(
                    "{path}: a channel through the engine carries unary calls of typed clients \
                     (a request block); streaming and raw-bytes calls need a channel of the \
                     process's own"
                ),
            ));
        }
        if let Calls::Routed(r) = &self.calls {
            let deadline = call.deadline(Instant::now());
            let routed = r.route(path, &call.metadata, call.wait_for_ready, deadline).await?;
            return Box::pin(routed.channel.start_with(path, call, Some(&routed.method))).await;
        }
        let method = self.opts.service_config.as_ref().and_then(|sc| sc.method(path));
        self.start_with(path, call, method).await
    }

    /// Starts a call with `method`'s settings (from the service config or
    /// a route).
    async fn start_with(
        &self,
        path: &str,
        mut call: CallOptions,
        method: Option<&MethodConfig>,
    ) -> Result<ClientCall, Status> {
        let Some(m) = method else {
            let deadline = call.deadline(Instant::now());
            return self.start_attempt(path, &call, deadline).await;
        };
        if let Some(t) = m.timeout {
            call.timeout = Some(call.timeout.map_or(t, |own| own.min(t)));
        }
        if m.wait_for_ready == Some(true) {
            call.wait_for_ready = true;
        }
        let deadline = call.deadline(Instant::now());
        let mut c = self.start_attempt(path, &call, deadline).await?;
        if let Some(policy) = &m.hedging {
            c.throttle = self.throttle.clone();
            c.hedge = Some(Box::new(Hedge {
                channel: self.clone(),
                path: path.into(),
                opts: call.clone(),
                policy: policy.clone(),
                sent: Vec::new(),
                bytes: 0,
                closed: false,
                attempts: 1,
                others: Vec::new(),
                next: Instant::now() + policy.hedging_delay,
                stopped: false,
            }));
        }
        if let Some(policy) = &m.retry {
            c.throttle = self.throttle.clone();
            c.retry = Some(Box::new(Retry {
                channel: self.clone(),
                path: path.into(),
                opts: call,
                backoff: policy.initial_backoff,
                policy: policy.clone(),
                sent: Vec::new(),
                bytes: 0,
                closed: false,
                attempts: 1,
            }));
        }
        Ok(c)
    }

    /// One attempt of a call: a connection picked, the stream opened.
    async fn start_attempt(
        &self,
        path: &str,
        call: &CallOptions,
        deadline: Option<Instant>,
    ) -> Result<ClientCall, Status> {
        if deadline.is_some_and(|d| d <= Instant::now()) {
            return Err(deadline_exceeded());
        }
        let Calls::Balanced(lb) = &self.calls else {
            // Routed channels start calls on the channel their route picks;
            // delegated ones never start a call here.
            return Err(Status::new(Code::Internal, "the channel has no connection of its own"));
        };
        let (link, report_to) = lb.pick(call.wait_for_ready, deadline).await?;
        let started = match self.start_on(&link, path, call, deadline).await {
            // Refused before the request left: once more, on another
            // connection (a new one, or another backend's).
            Err(st) if st.code == Code::Unavailable && !link.usable() => {
                let (link, report_to) = lb.pick(call.wait_for_ready, deadline).await?;
                self.start_on(&link, path, call, deadline).await.map(|c| (c, report_to))
            }
            other => other.map(|c| (c, report_to)),
        };
        let (mut c, report_to) = started?;
        c.report_to = report_to;
        Ok(c)
    }

    async fn start_on(
        &self,
        link: &Link,
        path: &str,
        call: &CallOptions,
        deadline: Option<Instant>,
    ) -> Result<ClientCall, Status> {
        let grpc_timeout =
            deadline.map(|d| timeout::format(d.saturating_duration_since(Instant::now())));
        let io = match link {
            Link::Idle => return Err(unavailable("not connected")),
            Link::Native(link) => {
                if !path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(Status::new(Code::InvalidArgument, format!("bad path {path:?}")));
                }
                let (md, compress, t) = (&call.metadata, call.compress, grpc_timeout.as_deref());
                let fields = move |sink: &mut dyn FieldSink| {
                    sink.field(b"content-type", b"application/grpc", Index::Yes);
                    sink.field(b"te", b"trailers", Index::Yes);
                    sink.field(b"user-agent", USER_AGENT.as_bytes(), Index::Yes);
                    sink.field(b"grpc-accept-encoding", ACCEPT_ENCODING.as_bytes(), Index::Yes);
                    if compress {
                        sink.field(b"grpc-encoding", b"gzip", Index::Yes);
                    }
                    if let Some(t) = t {
                        sink.field(b"grpc-timeout", t.as_bytes(), Index::No);
                    }
                    md.each_field(|k, v| sink.field(k, v, Index::No));
                };
                let open = link.0.open(
                    self.scheme.as_bytes(),
                    self.authority.as_bytes(),
                    path.as_bytes(),
                    &fields,
                );
                Io::Native(timed(deadline, open).await?)
            }
            #[cfg(feature = "h2")]
            Link::H2(send) => {
                let target = (self.scheme, &self.authority[..], path);
                let open = crate::h2::client::open(send, target, call, grpc_timeout);
                Io::H2(timed(deadline, open).await?)
            }
        };
        Ok(ClientCall {
            io,
            phase: Phase::Head,
            frames: FrameDecoder::new(self.opts.max_recv_message),
            encoding: Encoding::Identity,
            limit: self.opts.max_recv_message,
            send_limit: self.opts.max_send_message,
            compress: call.compress,
            deadline,
            headers: None,
            trailers: None,
            status: None,
            queued: std::collections::VecDeque::new(),
            last_compressed: false,
            ending: None,
            measured: None,
            retry: None,
            hedge: None,
            won_head: None,
            throttle: None,
            report_to: None,
        })
    }
}

/// The `:authority` of a target given with a resolver of one's own:
/// the target without an `http://`-style prefix or trailing slash.
fn authority_of(target: &str) -> String {
    let t = target.split_once("://").map(|(_, rest)| rest).unwrap_or(target);
    t.trim_start_matches('/').trim_end_matches('/').to_string()
}

/// The resolver of a channel whose target could not be parsed: every call
/// fails with why.
struct Failing(Status);

impl Resolver for Failing {
    fn resolve(
        &self,
    ) -> protoplane_grpc::BoxFuture<'static, Result<crate::resolve::Resolution, Status>> {
        let st = self.0.clone();
        Box::pin(async move { Err(st) })
    }
}

/// A call's stream, on either transport.
enum Io {
    Native(native::Stream),
    #[cfg(feature = "h2")]
    H2(crate::h2::client::Stream),
}

impl std::fmt::Debug for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Io::Native(_) => "Native",
            #[cfg(feature = "h2")]
            Io::H2(_) => "H2",
        })
    }
}

impl Io {
    /// The response header block and whether it also ended the call.
    async fn head(&mut self) -> Result<(Fields, bool), Status> {
        match self {
            Io::Native(s) => poll_fn(|cx| s.poll_head(cx)).await,
            #[cfg(feature = "h2")]
            Io::H2(s) => s.head().await,
        }
    }

    /// The next chunk of the response body; `None` at its end.
    async fn data(&mut self) -> Option<Result<Bytes, Status>> {
        match self {
            Io::Native(s) => poll_fn(|cx| s.poll_data(cx)).await,
            #[cfg(feature = "h2")]
            Io::H2(s) => s.data().await,
        }
    }

    /// The trailers after the body; `None` if the stream ended without.
    async fn trailers(&mut self) -> Result<Option<Fields>, Status> {
        match self {
            Io::Native(s) => poll_fn(|cx| s.poll_trailers(cx)).await,
            #[cfg(feature = "h2")]
            Io::H2(s) => s.trailers().await,
        }
    }

    fn can_send(&self) -> bool {
        match self {
            Io::Native(s) => s.can_send(),
            #[cfg(feature = "h2")]
            Io::H2(s) => s.can_send(),
        }
    }

    /// Sends one message (`end`: the last), compressed if asked.
    /// Sends one message; returns its size on the wire (the `h2`
    /// transport compresses inside and reports the uncompressed size).
    async fn send(&mut self, message: &[u8], gzip: bool, end: bool) -> Result<u64, Status> {
        match self {
            Io::Native(s) => {
                if gzip {
                    let z = codec::gzip(message);
                    s.send_message(&z, true, end).await.map(|()| z.len() as u64)
                } else {
                    s.send_message(message, false, end).await.map(|()| message.len() as u64)
                }
            }
            #[cfg(feature = "h2")]
            Io::H2(s) => s.send(message, gzip, end).await.map(|()| message.len() as u64),
        }
    }

    /// No more requests (END_STREAM).
    fn close_send(&mut self) {
        match self {
            Io::Native(s) => s.close_send(),
            #[cfg(feature = "h2")]
            Io::H2(s) => s.close_send(),
        }
    }

    /// The request side is over without END_STREAM (the call ended).
    fn drop_send(&mut self) {
        match self {
            Io::Native(_) => {}
            #[cfg(feature = "h2")]
            Io::H2(s) => s.drop_send(),
        }
    }

    /// Cancels the stream (RST_STREAM(CANCEL)) unless it ended.
    fn reset(&mut self) {
        match self {
            Io::Native(s) => s.reset(),
            #[cfg(feature = "h2")]
            Io::H2(s) => s.reset(),
        }
    }
}

/// Where a call's response is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for the response headers.
    Head,
    /// Reading messages.
    Body,
    /// Ended (status known).
    Done,
}

/// One call in progress, from the client's side.
#[derive(Debug)]
pub struct ClientCall {
    io: Io,
    phase: Phase,
    frames: FrameDecoder,
    encoding: Encoding,
    limit: usize,
    send_limit: usize,
    compress: bool,
    deadline: Option<Instant>,
    headers: Option<Metadata>,
    trailers: Option<Metadata>,
    status: Option<Status>,
    queued: std::collections::VecDeque<(Bytes, bool)>,
    last_compressed: bool,
    /// Client interceptors' `after` hooks, run when the status is known.
    ending: Option<Box<Ending>>,
    /// With metrics: the instruments, the start, the bytes so far.
    measured: Option<(Arc<MethodCalls>, Instant, CallSizes)>,
    /// Until the call commits: what a new attempt needs (a retry policy).
    retry: Option<Box<Retry>>,
    /// Until the call commits: the hedged attempts beside this one and
    /// what a new one needs (a hedging policy).
    hedge: Option<Box<Hedge>>,
    /// The head the hedged attempt that won the race answered with.
    won_head: Option<Result<(Fields, bool), Status>>,
    /// The channel's retry token bucket, told how the call ended.
    throttle: Option<Arc<Throttle>>,
    /// Weighted round robin: the subchannel the call went to, told the
    /// ORCA load report of the trailers (with the error penalty).
    report_to: crate::balance::ReportTo,
}

/// What a call with a retry policy keeps until it commits (gRFC A6): the
/// requests sent so far, to send again on a new attempt. A call commits
/// when response headers or a message arrive, when its requests outgrow
/// [`RETRY_BUFFER`], or when it ends.
#[derive(Debug)]
struct Retry {
    channel: Channel,
    path: Box<str>,
    opts: CallOptions,
    policy: RetryPolicy,
    /// The wait before the next attempt is random below this.
    backoff: Duration,
    sent: Vec<Bytes>,
    bytes: usize,
    /// The requests ended (half-close).
    closed: bool,
    /// Attempts made, this one included.
    attempts: u32,
}

/// What a call with a hedging policy keeps until it commits (gRFC A6):
/// the requests sent so far, for attempts started later, and the attempts
/// running beside the call's own. Every attempt gets every request; the
/// first to answer with response headers or a fatal status wins, and the
/// others are cancelled. An attempt ending with a non-fatal status just
/// leaves (the next one starts at once); a server's pushback delays the
/// next one, or stops hedging.
#[derive(Debug)]
struct Hedge {
    channel: Channel,
    path: Box<str>,
    opts: CallOptions,
    policy: HedgingPolicy,
    sent: Vec<Bytes>,
    bytes: usize,
    closed: bool,
    /// Attempts started, the first included.
    attempts: u32,
    /// The attempts running beside the call's own (`ClientCall::io`).
    others: Vec<ClientCall>,
    /// When the next attempt starts, if none has answered by then.
    next: Instant,
    /// A server's pushback said to start no more.
    stopped: bool,
}

/// Requests a call keeps for its retries (gRPC's per-call default,
/// 256 KiB); past it, the call commits to its current attempt.
pub const RETRY_BUFFER: usize = 256 << 10;

/// A wait uniformly below `d` (gRFC A6's jittered backoff).
fn below(d: Duration) -> Duration {
    let r = crate::backoff::random_u64();
    let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
    d.mul_f64(unit)
}

impl ClientCall {
    /// Records the call's status (the first one counts) and tells the
    /// interceptors and the metrics.
    fn set_status(&mut self, st: Status) {
        if self.status.is_none() {
            self.retry = None;
            self.commit_hedge();
            if let (Some(t), Code::Ok) = (&self.throttle, st.code) {
                t.succeeded();
            }
            if let Some(e) = self.ending.take() {
                e.end(&st);
            }
            if let Some((m, started, sizes)) = self.measured.take() {
                m.end(st.code, started.elapsed(), sizes);
            }
            self.status = Some(st);
        }
    }

    fn fail(&mut self, mut st: Status) -> Status {
        // A server whose deadline passed first resets the stream; what the
        // application must see is still its deadline, as in other gRPC
        // clients.
        if st.code == Code::Cancelled && self.deadline.is_some_and(|d| Instant::now() >= d) {
            st = deadline_exceeded();
        }
        self.set_status(st.clone());
        if st.code == Code::DeadlineExceeded || st.code == Code::Cancelled {
            self.reset();
        }
        st
    }

    fn reset(&mut self) {
        self.io.reset();
        self.phase = Phase::Done;
    }

    /// Sends one encoded request message. Fails with the call's status if
    /// the server has already ended it.
    pub async fn send(&mut self, message: &[u8]) -> Result<(), Status> {
        self.send_inner(message, false).await
    }

    /// Sends the last request message and half-closes, in one step (for
    /// a unary call: the request's HEADERS and DATA leave together).
    pub async fn send_last(&mut self, message: &[u8]) -> Result<(), Status> {
        self.send_inner(message, true).await
    }

    async fn send_inner(&mut self, message: &[u8], end: bool) -> Result<(), Status> {
        if message.len() > self.send_limit {
            return Err(Status::new(
                Code::ResourceExhausted,
                format!(
                    "message of {} bytes exceeds the send limit of {} bytes",
                    message.len(),
                    self.send_limit
                ),
            ));
        }
        if let Some(h) = &mut self.hedge {
            h.sent.push(Bytes::copy_from_slice(message));
            h.bytes += message.len();
            h.closed |= end;
            for o in &mut h.others {
                if timed(self.deadline, o.io.send(message, self.compress, end)).await.is_err() {
                    // That attempt failed: its status comes with its head.
                    o.io.drop_send();
                }
            }
            if h.bytes > RETRY_BUFFER {
                // Too much to keep: the call commits to its own attempt.
                self.commit_hedge();
            }
        }
        if let Some(r) = &mut self.retry {
            r.sent.push(Bytes::copy_from_slice(message));
            r.bytes += message.len();
            r.closed |= end;
            if r.bytes > RETRY_BUFFER {
                self.retry = None;
            } else if !self.io.can_send() && self.status.is_none() {
                // This attempt failed: the message waits for the next,
                // which starts when the response is read.
                return Ok(());
            }
        }
        if !self.io.can_send() {
            return Err(self
                .status
                .clone()
                .unwrap_or_else(|| Status::new(Code::Internal, "request stream closed")));
        }
        let r = timed(self.deadline, self.io.send(message, self.compress, end)).await;
        match r {
            Err(st) if self.retry.is_some() && st.code != Code::DeadlineExceeded => {
                // Kept for the next attempt; the status comes with the
                // response.
                self.io.drop_send();
                Ok(())
            }
            Ok(n) => {
                if let Some(m) = &mut self.measured {
                    m.2.sent += n;
                }
                Ok(())
            }
            Err(st)
                if st.code == Code::Cancelled
                    || st.code == Code::Unavailable
                    || st.code == Code::Internal =>
            {
                // The server ended the call (or the stream): the real
                // reason is in its status.
                self.io.drop_send();
                match self.finish_status().await {
                    s if s.code != Code::Ok => Err(s),
                    _ => Err(st),
                }
            }
            Err(st) => Err(self.fail(st)),
        }
    }

    /// Half-closes: no more requests.
    pub fn close_send(&mut self) {
        if let Some(r) = &mut self.retry {
            r.closed = true;
        }
        if let Some(h) = &mut self.hedge {
            h.closed = true;
            for o in &mut h.others {
                o.io.close_send();
            }
        }
        self.io.close_send();
    }

    /// After attempt failed with `st` (its trailers, if any): starts the
    /// next attempt and sends it the requests again, if the retry policy,
    /// the throttle, the server's pushback and the deadline allow.
    async fn retry_after(&mut self, st: &Status, trailers: Option<&Metadata>) -> bool {
        let Some(r) = self.retry.as_mut() else { return false };
        if !r.policy.retryable.contains(&st.code) {
            return false;
        }
        if let Some(t) = &self.throttle {
            t.failed();
            if !t.allows() {
                return false;
            }
        }
        if r.attempts >= r.policy.max_attempts {
            return false;
        }
        let wait = match trailers.and_then(|m| m.get("grpc-retry-pushback-ms")) {
            // The server says when (and resets the backoff); a value that
            // is not a count of milliseconds says not to.
            Some(v) => match v.parse::<u64>() {
                Ok(ms) => {
                    r.backoff = r.policy.initial_backoff;
                    Duration::from_millis(ms)
                }
                Err(_) => return false,
            },
            None => {
                let w = below(r.backoff);
                // In floating point, so that no multiplier overflows.
                let next = r.backoff.as_secs_f64() * r.policy.backoff_multiplier;
                let max = r.policy.max_backoff.as_secs_f64();
                r.backoff = Duration::from_secs_f64(next.min(max));
                w
            }
        };
        if self.deadline.is_some_and(|d| Instant::now() + wait >= d) {
            return false;
        }
        tokio::time::sleep(wait).await;
        let mut opts = r.opts.clone();
        let _ = opts.metadata.insert("grpc-previous-rpc-attempts", &r.attempts.to_string());
        let Ok(mut next) = r.channel.start_attempt(&r.path, &opts, self.deadline).await else {
            return false;
        };
        r.attempts += 1;
        next.replay(&r.sent, r.closed, self.compress, self.deadline).await;
        std::mem::swap(&mut self.io, &mut next.io);
        next.phase = Phase::Done;
        self.report_to = next.report_to.take();
        self.phase = Phase::Head;
        self.frames = FrameDecoder::new(self.limit);
        self.encoding = Encoding::Identity;
        self.headers = None;
        self.trailers = None;
        self.queued.clear();
        true
    }

    /// Sends a new attempt the requests sent so far (`closed`: they
    /// ended); an attempt that fails while sending stops, its response
    /// says how.
    async fn replay(
        &mut self,
        sent: &[Bytes],
        closed: bool,
        compress: bool,
        deadline: Option<Instant>,
    ) {
        let last = sent.len().checked_sub(1);
        for (i, m) in sent.iter().enumerate() {
            let end = closed && Some(i) == last;
            if timed(deadline, self.io.send(m, compress, end)).await.is_err() {
                self.io.drop_send();
                return;
            }
        }
        if closed && sent.is_empty() {
            self.io.close_send();
        }
    }

    /// Cancels every hedged attempt beside the call's own: the call
    /// commits to it.
    fn commit_hedge(&mut self) {
        if let Some(h) = self.hedge.take() {
            for mut o in h.others {
                o.reset();
            }
        }
    }

    /// Races the hedged attempts until one answers with response headers
    /// or a fatal status (it becomes the call's own attempt, the others
    /// are cancelled; its head is then read as any call's), starting a new
    /// attempt every hedging delay and at once after a non-fatal failure.
    /// `Err`: no attempt is left and no other may start; the last failure.
    async fn race(&mut self) -> Result<(), Status> {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        /// The call's own attempt, in the race.
        const OWN: usize = usize::MAX;
        // Whether the call's own attempt is still in the race (it left if
        // it failed and no other could take its place yet).
        let mut own_alive = true;
        loop {
            let deadline = self.deadline;
            let Some(h) = self.hedge.as_mut() else { return Ok(()) };
            let can_start = !h.stopped
                && h.attempts < h.policy.max_attempts
                && self.throttle.as_ref().is_none_or(|t| t.allows());
            if !own_alive && h.others.is_empty() && !can_start {
                return Err(Status::new(Code::Unavailable, "every hedged attempt failed"));
            }
            let at = if !own_alive && h.others.is_empty() { Instant::now() } else { h.next };
            let won = {
                let mut heads = FuturesUnordered::new();
                if own_alive {
                    let io = &mut self.io;
                    heads.push(Box::pin(async move { (OWN, io.head().await) })
                        as std::pin::Pin<Box<dyn Future<Output = _> + Send + '_>>);
                }
                for (i, o) in h.others.iter_mut().enumerate() {
                    heads.push(Box::pin(async move { (i, o.io.head().await) }));
                }
                let timer = async {
                    match can_start {
                        true => tokio::time::sleep_until(at.into()).await,
                        false => std::future::pending().await,
                    }
                };
                tokio::select! {
                    Some(w) = heads.next() => Some(w),
                    _ = timer => None,
                    _ = async {
                        match deadline {
                            Some(d) => tokio::time::sleep_until(d.into()).await,
                            None => std::future::pending().await,
                        }
                    } => return Err(deadline_exceeded()),
                }
            };
            match won {
                None => {
                    // No answer yet: one attempt more.
                    let mut opts = h.opts.clone();
                    let _ =
                        opts.metadata.insert("grpc-previous-rpc-attempts", &h.attempts.to_string());
                    h.attempts += 1;
                    h.next = Instant::now() + h.policy.hedging_delay;
                    let Ok(mut next) = h.channel.start_attempt(&h.path, &opts, deadline).await
                    else {
                        continue;
                    };
                    next.replay(&h.sent, h.closed, self.compress, deadline).await;
                    if own_alive {
                        h.others.push(next);
                    } else {
                        // It takes the place of the call's own attempt.
                        std::mem::swap(&mut self.io, &mut next.io);
                        self.report_to = next.report_to.take();
                        next.phase = Phase::Done;
                        own_alive = true;
                    }
                }
                Some((who, head)) => {
                    // A trailers-only answer with a non-fatal status, or a
                    // stream that failed: that attempt leaves the race.
                    let failed = match &head {
                        Ok((f, true)) if f.http == 200 => {
                            let st = f
                                .status
                                .clone()
                                .unwrap_or_else(|| Status::from_trailers(None, None));
                            (st.code != Code::Ok && h.policy.non_fatal.contains(&st.code)).then(
                                || {
                                    (
                                        st,
                                        f.metadata
                                            .get("grpc-retry-pushback-ms")
                                            .map(str::to_string),
                                    )
                                },
                            )
                        }
                        Ok(_) => None,
                        Err(st) if st.code != Code::DeadlineExceeded => Some((st.clone(), None)),
                        Err(_) => None,
                    };
                    let Some((st, pushback)) = failed else {
                        // The winner: it becomes the call's own attempt,
                        // and its head is the call's.
                        self.won_head = Some(head);
                        if who != OWN {
                            // `w` then holds the call's own attempt, still
                            // running: dropping it cancels it.
                            let mut w = h.others.swap_remove(who);
                            std::mem::swap(&mut self.io, &mut w.io);
                            self.report_to = w.report_to.take();
                        }
                        self.commit_hedge();
                        return Ok(());
                    };
                    if let Some(t) = &self.throttle {
                        t.failed();
                    }
                    match pushback.map(|v| v.parse::<u64>()) {
                        Some(Ok(ms)) => h.next = Instant::now() + Duration::from_millis(ms),
                        Some(Err(_)) => h.stopped = true,
                        None => h.next = Instant::now(),
                    }
                    if who == OWN {
                        match h.others.pop() {
                            Some(mut o) => {
                                std::mem::swap(&mut self.io, &mut o.io);
                                self.report_to = o.report_to.take();
                                o.phase = Phase::Done;
                            }
                            None => own_alive = false,
                        }
                    } else {
                        let mut o = h.others.swap_remove(who);
                        o.phase = Phase::Done;
                    }
                    if !own_alive
                        && h.others.is_empty()
                        && (h.stopped || h.attempts >= h.policy.max_attempts)
                    {
                        // The last attempt's failure is the call's.
                        return Err(st);
                    }
                }
            }
        }
    }

    /// Cancels the call (`RST_STREAM(CANCEL)`); it ends with CANCELLED.
    pub fn cancel(&mut self) {
        self.reset();
        self.set_status(Status::new(Code::Cancelled, "cancelled by the client"));
    }

    /// Waits for the response headers; returns the initial metadata.
    pub async fn headers(&mut self) -> Result<&Metadata, Status> {
        if self.phase == Phase::Head && self.hedge.is_some() {
            if let Err(st) = self.race().await {
                self.phase = Phase::Done;
                return Err(self.fail(st));
            }
        }
        if self.phase == Phase::Head {
            let (f, ends) = loop {
                let head = match self.won_head.take() {
                    Some(h) => h,
                    None => timed(self.deadline, self.io.head()).await,
                };
                match head {
                    Ok((f, true)) if f.http == 200 && self.retry.is_some() => {
                        // Trailers-only: a failure the policy may retry.
                        let st =
                            f.status.clone().unwrap_or_else(|| Status::from_trailers(None, None));
                        if st.code == Code::Ok || !self.retry_after(&st, Some(&f.metadata)).await {
                            break (f, true);
                        }
                    }
                    Ok(h) => break h,
                    Err(st) => {
                        if st.code != Code::DeadlineExceeded && self.retry_after(&st, None).await {
                            continue;
                        }
                        self.phase = Phase::Done;
                        return Err(self.fail(st));
                    }
                }
            };
            // Response headers (or the end): the call commits.
            self.retry = None;
            self.phase = Phase::Body;
            if f.http != 200 {
                let st = Status::new(Code::from_http(f.http), format!("HTTP status {}", f.http));
                self.phase = Phase::Done;
                return Err(self.fail(st));
            }
            self.headers = Some(f.metadata.clone());
            if let Some(enc) = f.encoding {
                match enc {
                    Some(e) => self.encoding = e,
                    None => {
                        let st =
                            Status::new(Code::Internal, "server used an unsupported grpc-encoding");
                        self.phase = Phase::Done;
                        return Err(self.fail(st));
                    }
                }
            }
            if ends {
                // Trailers-only response (a HEADERS frame with END_STREAM):
                // that frame is the trailers, and the call had no response
                // headers (as grpc-go and gRPC C++ report it). A
                // `grpc-status` in headers that do not end the stream means
                // nothing: the status comes from the real trailers.
                self.headers = Some(Metadata::new());
                self.end_with(f);
            } else {
                let problem = match &f.content_type {
                    codec::ContentType::Proto => None,
                    codec::ContentType::NotGrpc => {
                        Some(Status::new(Code::Unknown, "response is not application/grpc"))
                    }
                    codec::ContentType::OtherCodec(name) => Some(Status::new(
                        Code::Internal,
                        format!("response in codec {name:?}, not the protobuf asked for"),
                    )),
                };
                if let Some(st) = problem {
                    self.phase = Phase::Done;
                    return Err(self.fail(st));
                }
            }
        }
        match &self.headers {
            Some(h) => Ok(h),
            None => Err(self
                .status
                .clone()
                .unwrap_or_else(|| Status::new(Code::Internal, "no headers"))),
        }
    }

    fn end_with(&mut self, f: Fields) {
        if let Some((sub, penalty)) = self.report_to.take() {
            use protoplane_grpc_services::orca::{LoadReport, TRAILER};
            // A report that does not decode is ignored, as gRPC does.
            if let Some(Ok(r)) = f.metadata.get_bin(TRAILER).map(LoadReport::decode) {
                sub.report(&r, penalty);
            }
        }
        let st = f.status.unwrap_or_else(|| Status::from_trailers(None, None));
        self.set_status(st);
        self.trailers = Some(f.metadata);
        self.phase = Phase::Done;
        self.io.drop_send();
    }

    /// The next response message (its bytes, decompressed); `Ok(None)` when
    /// the call ended with OK, `Err` with the call's status otherwise.
    pub async fn recv(&mut self) -> Result<Option<Bytes>, Status> {
        self.headers().await?;
        loop {
            if let Some((m, z)) = self.queued.pop_front() {
                self.last_compressed = z;
                return Ok(Some(m));
            }
            if self.phase != Phase::Body {
                let st = self.status.clone().unwrap_or_else(Status::ok);
                return if st.code == Code::Ok { Ok(None) } else { Err(st) };
            }
            let next = match timed(self.deadline, async { Ok(self.io.data().await) }).await {
                Ok(n) => n,
                Err(st) => return Err(self.fail(st)),
            };
            match next {
                Some(Ok(chunk)) => {
                    let mut frames = Vec::new();
                    if let Err(e) = self.frames.push(chunk, &mut frames) {
                        let st = e.status();
                        self.reset();
                        return Err(self.fail(st));
                    }
                    for f in frames {
                        let z = f.compressed;
                        if let Some(m) = &mut self.measured {
                            m.2.rcvd += f.data.len() as u64;
                        }
                        match codec::frame_payload(f, self.encoding, self.limit) {
                            Ok(p) => self.queued.push_back((p, z)),
                            Err(st) => {
                                self.reset();
                                return Err(self.fail(st));
                            }
                        }
                    }
                }
                Some(Err(st)) => {
                    self.phase = Phase::Done;
                    return Err(self.fail(st));
                }
                None => {
                    if let Err(e) = self.frames.finish() {
                        self.reset();
                        return Err(self.fail(e.status()));
                    }
                    match timed(self.deadline, self.io.trailers()).await {
                        Ok(Some(f)) => self.end_with(f),
                        Ok(None) => {
                            let st = Status::new(Code::Internal, "stream ended without trailers");
                            self.phase = Phase::Done;
                            return Err(self.fail(st));
                        }
                        Err(st) => {
                            self.phase = Phase::Done;
                            return Err(self.fail(st));
                        }
                    }
                }
            }
        }
    }

    /// Reads to the end and returns the call's status (responses not yet
    /// received are discarded).
    pub async fn finish_status(&mut self) -> Status {
        loop {
            match self.recv().await {
                Ok(Some(_)) => {}
                Ok(None) => return Status::ok(),
                Err(st) => return st,
            }
        }
    }

    /// The initial metadata, if the headers have arrived.
    pub fn headers_now(&self) -> Option<&Metadata> {
        self.headers.as_ref()
    }

    /// Whether the last message [`ClientCall::recv`] returned arrived
    /// compressed.
    pub fn last_compressed(&self) -> bool {
        self.last_compressed
    }

    /// The trailing metadata, once the call has ended.
    pub fn trailers(&self) -> Option<&Metadata> {
        self.trailers.as_ref()
    }

    /// The call's status, once it has ended.
    pub fn status(&self) -> Option<&Status> {
        self.status.as_ref()
    }
}

impl Drop for ClientCall {
    fn drop(&mut self) {
        // A call dropped before its end is cancelled.
        if self.phase != Phase::Done {
            self.reset();
        }
        if self.ending.is_some() || self.measured.is_some() {
            self.set_status(Status::new(Code::Cancelled, "dropped before its end"));
        }
    }
}

/// A client bound to a schema: sends blocks laid out with the builder,
/// receives decoded [`Message`]s — the dynamic path, no generated code.
#[derive(Clone, Debug)]
pub struct Client {
    channel: Channel,
    schema: Arc<Schema>,
}

/// What [`Client::unary_response`] returns.
#[derive(Debug)]
pub struct UnaryResponse {
    /// The response headers (initial metadata).
    pub headers: Metadata,
    /// The decoded response.
    pub message: Message,
    /// The trailers (trailing metadata).
    pub trailers: Metadata,
}

/// A call of a [`Client`]: [`ClientCall`] plus the method's types.
#[derive(Debug)]
pub struct TypedCall {
    /// The raw call.
    pub call: ClientCall,
    schema: Arc<Schema>,
    input: u32,
    output: u32,
    encoder: Encoder,
    decoder: Decoder,
}

impl Client {
    /// A client of `schema`'s methods over `channel`.
    pub fn new(channel: Channel, schema: Arc<Schema>) -> Client {
        Client { channel, schema }
    }

    /// The schema.
    pub fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    /// The channel.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Starts a call of method `method` (an id of the schema).
    pub async fn start(&self, method: u32, opts: CallOptions) -> Result<TypedCall, Status> {
        let m = self
            .schema
            .method(method)
            .ok_or_else(|| Status::new(Code::InvalidArgument, format!("no method #{method}")))?;
        let call = self.channel.start(&m.path, opts).await?;
        Ok(TypedCall {
            call,
            schema: self.schema.clone(),
            input: m.input,
            output: m.output,
            encoder: Encoder::new(),
            decoder: Decoder::new(),
        })
    }

    /// A unary call: one request block, one decoded response and the
    /// trailers. [`Client::unary_response`] gives the response headers too.
    pub async fn unary(
        &self,
        method: u32,
        request: Request<&Block>,
    ) -> Result<(Message, Metadata), Status> {
        self.unary_response(method, request).await.map(|r| (r.message, r.trailers))
    }

    /// A unary call: one request block; the response with its headers
    /// (initial metadata) and trailers.
    pub async fn unary_response(
        &self,
        method: u32,
        request: Request<&Block>,
    ) -> Result<UnaryResponse, Status> {
        let opts = CallOptions {
            metadata: request.metadata,
            timeout: request.deadline.map(|d| d.saturating_duration_since(Instant::now())),
            ..CallOptions::default()
        };
        if let Some(d) = self.channel.delegate() {
            return self.delegated(d, method, request.message, opts).await;
        }
        let mut call = self.start(method, opts).await?;
        call.send_last(request.message).await?;
        // No response, or a second one, to a unary call is a cardinality
        // violation: UNIMPLEMENTED, as gRPC's status code table says, not
        // something to drop silently.
        let m = call.message().await?.ok_or_else(|| {
            Status::new(Code::Unimplemented, "the server ended a unary call without a response")
        })?;
        match call.call.recv().await {
            Ok(None) => Ok(UnaryResponse {
                headers: call.call.headers_now().cloned().unwrap_or_default(),
                message: m,
                trailers: call.call.trailers().cloned().unwrap_or_default(),
            }),
            Ok(Some(_)) => {
                call.call.cancel();
                Err(Status::new(
                    Code::Unimplemented,
                    "more than one response message for a unary call",
                ))
            }
            Err(st) => Err(st),
        }
    }
}

impl Client {
    /// A unary call another process makes (see [`crate::delegate`]), with
    /// the channel's interceptors around it.
    async fn delegated(
        &self,
        d: &Arc<dyn crate::delegate::Delegate>,
        method: u32,
        block: &Block,
        opts: CallOptions,
    ) -> Result<UnaryResponse, Status> {
        let m = self
            .schema
            .method(method)
            .ok_or_else(|| Status::new(Code::InvalidArgument, format!("no method #{method}")))?;
        let (opts, ending) = match &self.channel.interceptors {
            Some(chain) => {
                let (o, e) = chain.before(&m.path, opts).await?;
                (o, Some(e))
            }
            None => (opts, None),
        };
        if block.type_index() != Some(m.input) {
            return Err(Status::new(Code::InvalidArgument, "request block of the wrong type"));
        }
        let call = crate::delegate::DelegatedCall {
            schema: &self.schema,
            method,
            request: block,
            deadline: match opts.timeout.is_some() || crate::deadline::current().is_some() {
                true => opts.deadline(Instant::now()),
                false => None,
            },
            metadata: opts.metadata,
            wait_for_ready: opts.wait_for_ready,
        };
        let r = d.unary(call).await;
        if let Some(e) = ending {
            e.end(match &r {
                Ok(_) => &OK_STATUS,
                Err(st) => st,
            });
        }
        r
    }
}

static OK_STATUS: std::sync::LazyLock<Status> =
    std::sync::LazyLock::new(|| Status::new(Code::Ok, ""));

impl TypedCall {
    /// Encodes and sends one request block.
    pub async fn send(&mut self, block: &Block) -> Result<(), Status> {
        self.send_block(block, false).await
    }

    /// Encodes and sends the last request block, half-closing with it.
    pub async fn send_last(&mut self, block: &Block) -> Result<(), Status> {
        self.send_block(block, true).await
    }

    async fn send_block(&mut self, block: &Block, last: bool) -> Result<(), Status> {
        if block.type_index() != Some(self.input) {
            return Err(Status::new(Code::InvalidArgument, "request block of the wrong type"));
        }
        let bytes = self
            .encoder
            .encode(
                self.schema.tables(),
                self.input,
                Source::owned(block.as_bytes()),
                &EncodeOptions::default(),
            )
            .map_err(|e| Status::new(Code::InvalidArgument, format!("unencodable request: {e}")))?;
        match last {
            true => self.call.send_last(bytes).await,
            false => self.call.send(bytes).await,
        }
    }

    /// The next response, decoded (view mode); `Ok(None)` at a successful end.
    pub async fn message(&mut self) -> Result<Option<Message>, Status> {
        match self.call.recv().await? {
            None => Ok(None),
            Some(b) => Message::decode(self.schema.tables(), self.output, b, &mut self.decoder)
                .map(Some)
                .map_err(|e| Status::new(Code::Internal, format!("invalid response message: {e}"))),
        }
    }
}
