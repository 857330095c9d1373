//! The gRPC server over HTTP/2 (the `h2` crate; TLS by rustls).
//!
//! One task per connection drives HTTP/2; one task per call runs the
//! engine's side of the call — headers, framing, decompression, decode,
//! encode, flow control, deadline, cancellation — and polls the
//! application's future ([`Service::call`]) inside the same task, so a
//! unary call costs one task and no thread hop. The two sides talk only
//! through the queues of [`protoplane_grpc::call`].
//!
//! Limits that keep a hostile client from growing memory: the message size
//! limit (checked on the frame header before any byte of the body is
//! buffered, and on decompressed size), HTTP/2 stream and connection
//! windows (a client that stops reading stalls its own call at one window
//! of buffered output), the number of concurrent streams per connection,
//! the header list size, and a bounded queue of decoded requests per call.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;

use protoplane_grpc::call::{Peer, Service};
use protoplane_grpc::schema::Schema;
use protoplane_grpc::status::{Code, Status};

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Largest request message accepted, in bytes, after decompression
    /// (gRPC's default: 4 MiB).
    pub max_recv_message: usize,
    /// Largest response message sent.
    pub max_send_message: usize,
    /// Concurrent calls per connection; more are refused (`REFUSED_STREAM`).
    pub max_concurrent_streams: u32,
    /// HTTP/2 stream receive window.
    pub stream_window: u32,
    /// HTTP/2 connection receive window.
    pub connection_window: u32,
    /// Largest header list accepted.
    pub max_header_list: u32,
    /// Decoded requests queued per streaming call before the engine stops
    /// reading (and HTTP/2 flow control pushes back on the client).
    pub request_queue: usize,
    /// Responses queued per call between handler and engine.
    pub response_queue: usize,
    /// Which HTTP/2 implementation serves gRPC.
    pub transport: GrpcTransport,
    /// Keepalive, the enforcement of clients' pings, and the connections'
    /// idle time and age (gRFC A8 and A9; see [`crate::keepalive`]). The
    /// native transport only.
    pub keepalive: crate::keepalive::ServerKeepalive,
}

/// The HTTP/2 implementation under the gRPC server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GrpcTransport {
    /// protoplane's own, built for gRPC ([`crate::http2`]): one task per
    /// connection, calls driven as state machines inside it.
    #[default]
    Native,
    /// The general-purpose `h2` crate, one task per call: kept for
    /// comparison (the `h2` cargo feature).
    #[cfg(feature = "h2")]
    H2,
}

impl std::str::FromStr for GrpcTransport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "native" => Ok(GrpcTransport::Native),
            #[cfg(feature = "h2")]
            "h2" => Ok(GrpcTransport::H2),
            #[cfg(not(feature = "h2"))]
            "h2" => Err("the h2 transport is not built in (the h2 cargo feature)".into()),
            other => Err(format!("unknown gRPC transport {other:?} (native or h2)")),
        }
    }
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            max_recv_message: 4 << 20,
            max_send_message: i32::MAX as usize,
            max_concurrent_streams: 1024,
            stream_window: 1 << 20,
            connection_window: 4 << 20,
            max_header_list: 16 << 10,
            request_queue: 8,
            response_queue: 8,
            transport: GrpcTransport::Native,
            keepalive: crate::keepalive::ServerKeepalive::default(),
        }
    }
}

/// Where a path leads: a service and one of its method ids.
pub(crate) struct Route {
    pub(crate) service: usize,
    pub(crate) method: u32,
    /// The method's A66 instruments, when the router has metrics.
    pub(crate) calls: Option<Arc<crate::metrics::MethodCalls>>,
}

/// The services of a server, by method path.
pub struct Router {
    pub(crate) services: Vec<Arc<dyn Service>>,
    pub(crate) routes: HashMap<String, Route>,
    /// Every path, sorted, with its route: the lean transport's method ids
    /// are indices into this table.
    table: Vec<(String, usize, u32)>,
    opts: ServerOptions,
    drain: crate::drain::Drain,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// A66's `other` method: calls to paths not served.
    pub(crate) other_calls: Option<Arc<crate::metrics::MethodCalls>>,
    /// Worker threads the connections are spread over ([`crate::shards`]);
    /// without them, each connection is a task of the accepting runtime.
    shards: Option<Arc<crate::shards::Shards>>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router").field("paths", &self.routes.len()).finish_non_exhaustive()
    }
}

impl Router {
    /// A server with no services.
    pub fn new(opts: ServerOptions) -> Router {
        Router {
            services: Vec::new(),
            routes: HashMap::new(),
            table: Vec::new(),
            opts,
            drain: crate::drain::Drain::default(),
            metrics: None,
            other_calls: None,
            shards: None,
        }
    }

    /// Records A66's server metrics of every call (native gRPC transport)
    /// into `metrics`, for the methods served now and those added later.
    /// Without it, calls measure nothing (no clock read, no counter).
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Router {
        for (path, route) in self.routes.iter_mut() {
            route.calls = Some(metrics.server_method(path));
        }
        self.other_calls = Some(metrics.server_method(crate::metrics::OTHER_METHOD));
        self.metrics = Some(metrics);
        self
    }

    /// The metrics calls are recorded in ([`Router::with_metrics`]).
    pub fn metrics(&self) -> Option<&Arc<crate::metrics::Metrics>> {
        self.metrics.as_ref()
    }

    /// Adds a service: every method of its schema whose service name is
    /// [`Service::name`]. A path already served keeps its first service.
    pub fn add_service(mut self, service: Arc<dyn Service>) -> Router {
        let index = self.services.len();
        for (id, m) in service.schema().methods().iter().enumerate() {
            if m.service == service.name() {
                let calls = self.metrics.as_ref().map(|x| x.server_method(&m.path));
                self.routes.entry(m.path.clone()).or_insert(Route {
                    service: index,
                    method: id as u32,
                    calls,
                });
            }
        }
        self.services.push(service);
        self.table = self.routes.iter().map(|(p, r)| (p.clone(), r.service, r.method)).collect();
        self.table.sort();
        self
    }

    /// The settings.
    pub fn options(&self) -> &ServerOptions {
        &self.opts
    }

    /// Every served path with its (service index, method id), sorted by
    /// path; the lean transport numbers methods by position here.
    pub fn method_table(&self) -> &[(String, usize, u32)] {
        &self.table
    }

    /// The route at position `index` of [`Router::method_table`].
    pub fn route_by_index(&self, index: u32) -> Option<(usize, u32)> {
        self.table.get(index as usize).map(|(_, s, m)| (*s, *m))
    }

    /// Service number `index` (in the order they were added).
    pub fn service(&self, index: usize) -> &Arc<dyn Service> {
        &self.services[index]
    }

    /// Whether any service may lend landings (one that decodes its own
    /// requests: a split engine's).
    pub fn lends(&self) -> bool {
        self.services.iter().any(|s| s.decodes_requests())
    }

    /// A landing to receive requests into (see [`protoplane_grpc::landing`]): from
    /// service `prefer` (the one a connection's last call went to), or
    /// with none, from the first service that lends any; with the index of
    /// the service that lent it.
    pub fn landing(
        &self,
        prefer: Option<usize>,
        need: usize,
    ) -> Option<(usize, protoplane_grpc::landing::Landing)> {
        match prefer {
            Some(i) => Some((i, self.services.get(i)?.landing(need)?)),
            None => self.services.iter().enumerate().find_map(|(i, s)| Some((i, s.landing(need)?))),
        }
    }

    /// Adds the standard services every production server offers: health
    /// (`grpc.health.v1.Health`, SERVING for each service added so far,
    /// NOT_SERVING for all once the router drains)
    /// and server reflection (`grpc.reflection.v1` and `v1alpha`) over the
    /// schemas added so far. Returns the health handle too, to report
    /// status changes.
    pub fn with_standard_services(
        self,
    ) -> Result<(Router, Arc<protoplane_grpc_services::health::Health>), Status> {
        let names = self.service_names();
        let health = protoplane_grpc_services::health::Health::new(&names)?;
        let mut router = self.add_service(health.clone());
        let schemas = router.schemas();
        let mut all = router.service_names();
        all.sort();
        all.dedup();
        // Reflection lists what health does not report NOT_SERVING: in a
        // split engine, the services some application serves right now.
        let reflection = protoplane_grpc_services::reflection::Reflection::listing_by(
            &schemas,
            &all,
            Some(health.clone()),
        )?;
        for r in reflection {
            router = router.add_service(r);
        }
        // A draining server reports NOT_SERVING for everything, as
        // grpc-go's health server does after `Shutdown`.
        router.drain().on_start({
            let health = health.clone();
            move || health.shutdown()
        });
        Ok((router, health))
    }

    /// Full names of the services served.
    pub fn service_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.services.iter().map(|s| s.name().to_string()).collect();
        names.sort();
        names.dedup();
        names
    }

    /// The schemas of the services (for reflection).
    pub fn schemas(&self) -> Vec<Arc<Schema>> {
        self.services.iter().map(|s| s.schema().clone()).collect()
    }

    /// The router's graceful shutdown: [`Drain::start`](crate::drain::Drain::start)
    /// closes its listeners and drains its connections (see [`crate::drain`]).
    pub fn drain(&self) -> &crate::drain::Drain {
        &self.drain
    }

    /// Serves every accepted connection on one of `shards`' workers for
    /// its whole life (see [`crate::shards`]).
    pub fn with_shards(mut self, shards: Arc<crate::shards::Shards>) -> Router {
        self.shards = Some(shards);
        self
    }

    /// The workers connections are served on, if any.
    pub fn shards(&self) -> Option<&Arc<crate::shards::Shards>> {
        self.shards.as_ref()
    }

    /// Runs `serve(sock)` as the connection's task: on a worker when the
    /// router has them, else on the current runtime.
    pub(crate) fn spawn_connection<S, F, Fut>(&self, sock: S, serve: F)
    where
        S: crate::shards::Movable,
        F: FnOnce(S) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        match &self.shards {
            Some(s) => s.connection(sock, serve),
            None => {
                tokio::spawn(serve(sock));
            }
        }
    }

    /// The next connection of `listener`, or `None` once the router drains.
    pub(crate) async fn accept_until_drained<T, F, Fut>(
        &self,
        what: &str,
        accept_once: F,
    ) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::io::Result<T>>,
    {
        tokio::select! {
            conn = crate::accept::accept(what, accept_once) => Some(conn),
            () = self.drain.started() => None,
        }
    }

    /// Serves plaintext HTTP/2 connections from `listener` until the task
    /// is dropped or the router drains (accept errors are waited out, see
    /// [`crate::accept`]).
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> std::io::Result<()> {
        let router = self;
        let listener = router.drain.listening(listener);
        loop {
            let Some((sock, peer)) =
                router.accept_until_drained("gRPC server", || listener.accept()).await
            else {
                return Ok(());
            };
            let _ = sock.set_nodelay(true);
            let r = router.clone();
            router.spawn_connection(sock, move |sock| r.serve_connection(sock, peer));
        }
    }

    /// Serves TLS connections (ALPN `h2`) from `listener`. With a
    /// configuration from [`crate::tls::server_config_mtls`], only clients
    /// with a certificate the client CAs signed get through the handshake,
    /// and handlers see that certificate in [`protoplane_grpc::call::Peer`].
    pub async fn serve_tls(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Arc<tokio_rustls::rustls::ServerConfig>,
    ) -> std::io::Result<()> {
        let router = self;
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let listener = router.drain.listening(listener);
        loop {
            let Some((sock, peer)) =
                router.accept_until_drained("gRPC server", || listener.accept()).await
            else {
                return Ok(());
            };
            let _ = sock.set_nodelay(true);
            let r = router.clone();
            let acceptor = acceptor.clone();
            router.spawn_connection(sock, move |sock| async move {
                // A failed handshake concerns that client only.
                if let Ok(Ok(stream)) =
                    tokio::time::timeout(Duration::from_secs(10), acceptor.accept(sock)).await
                {
                    let certificates = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .map(|c| c.iter().map(|c| Bytes::copy_from_slice(c)).collect())
                        .unwrap_or_default();
                    let peer = Arc::new(Peer { addr: Some(peer), certificates });
                    r.serve_peer(stream, peer).await;
                }
            });
        }
    }

    /// Serves one established connection (any byte stream) until it closes.
    pub async fn serve_connection<IO>(self: Arc<Self>, io: IO, peer: SocketAddr)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.serve_peer(io, Arc::new(Peer { addr: Some(peer), certificates: Vec::new() })).await
    }

    /// Serves one established connection whose peer is `peer`.
    pub async fn serve_peer<IO>(self: Arc<Self>, io: IO, peer: Arc<Peer>)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let _counted = self.drain.connection();
        match self.opts.transport {
            GrpcTransport::Native => crate::http2::server::serve(self, io, peer).await,
            #[cfg(feature = "h2")]
            GrpcTransport::H2 => self.serve_h2(io, peer).await,
        }
    }
}

pub(crate) fn same_service(a: &str, b: &str) -> bool {
    let svc = |p: &str| p.rsplit_once('/').map(|(s, _)| s.to_string());
    svc(a).is_some() && svc(a) == svc(b)
}

pub(crate) fn deadline_exceeded() -> Status {
    Status::new(Code::DeadlineExceeded, "deadline exceeded")
}
