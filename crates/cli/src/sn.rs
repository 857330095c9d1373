//! `protoplane serve`: the social-network service
//! ([`protoplane_load::social`]) over gRPC/HTTP2, the lean transport, or
//! attached to an engine.

use std::sync::Arc;

use protoplane_load::host;
use protoplane_load::social::{router_wrapped, schema, SocialNetwork};
use protoplane_rpc::ServerOptions;

#[derive(clap::Args, Debug)]
pub(crate) struct ServeArgs {
    /// Port to listen on (0: pick one; the address is printed).
    #[arg(long, default_value_t = 50051)]
    port: u16,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Also serve the lean transport on this TCP port (0: pick one).
    #[arg(long, value_name = "PORT")]
    lean_port: Option<u16>,
    /// Also serve the lean transport on this Unix socket path.
    #[arg(long, value_name = "PATH")]
    lean_unix: Option<std::path::PathBuf>,
    /// Runtime threads (1: a single-threaded runtime, the whole server on
    /// one core).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Run as an application process of the engine attached at PATH
    /// (split mode: no port of its own).
    #[arg(long, value_name = "PATH")]
    attach: Option<std::path::PathBuf>,
    /// Spin this many µs after the last data read before sleeping (with
    /// --attach: after the last request on the ring; default 20 there,
    /// no spinning otherwise).
    #[arg(long, value_name = "US")]
    spin_us: Option<u64>,
    /// HTTP/2 under gRPC: `native` (protoplane's own) or `h2` (the h2
    /// crate, for comparison).
    #[arg(long, default_value = "native")]
    grpc_transport: protoplane_rpc::GrpcTransport,
    /// Busy-poll: the runtime's threads never sleep waiting for the
    /// network (each holds its core at 100%); lowest latency at low load.
    #[arg(long, conflicts_with_all = ["attach", "spin_us"])]
    spin: bool,
    /// On SIGTERM or SIGINT, let calls in flight finish for up to this
    /// many seconds (health turns NOT_SERVING, new connections are
    /// refused, HTTP/2 clients get GOAWAY), then exit.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    shutdown_grace: f64,
    /// Serve Prometheus metrics (gRFC A66's call metrics) at
    /// http://HOST:PORT/metrics.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "attach")]
    metrics_addr: Option<String>,
    /// Keepalive and connection lifecycle (gRFC A8, A9; grpc-go's
    /// defaults).
    #[command(flatten)]
    keepalive: KeepaliveArgs,
    /// Report load to clients (ORCA, gRFC A51): every call's trailers carry
    /// this process's CPU utilization and its call and error rates,
    /// measured each second (`endpoint-load-metrics-bin`, read by
    /// weighted_round_robin), and xds.service.orca.v3.OpenRcaService
    /// streams them out of band.
    #[arg(long, conflicts_with = "attach")]
    orca: bool,
    /// The shortest interval between out-of-band reports.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0, requires = "orca")]
    orca_min_interval: f64,
    /// Spend this many µs of CPU on each call before its handler: a
    /// heavier backend, for load-balancing experiments.
    #[arg(long, value_name = "US", conflicts_with = "attach")]
    work_us: Option<u64>,
    /// Wait this many µs (without using the CPU) before each call's
    /// handler: a slow backend, for hedging experiments.
    #[arg(long, value_name = "US", conflicts_with = "attach")]
    delay_us: Option<u64>,
    #[command(flatten)]
    pub(crate) telemetry: crate::telemetry_args::TelemetryArgs,
}

/// Waits before each call ([`ServeArgs::delay_us`]).
struct Delay(std::time::Duration);

impl protoplane_grpc::intercept::AsyncInterceptor for Delay {
    fn before(
        &self,
        head: protoplane_grpc::intercept::AsyncHead,
    ) -> protoplane_grpc::BoxFuture<
        'static,
        Result<protoplane_grpc::intercept::AsyncHead, protoplane_grpc::Status>,
    > {
        let wait = self.0;
        Box::pin(async move {
            tokio::time::sleep(wait).await;
            Ok(head)
        })
    }
}

/// Burns CPU before each call ([`ServeArgs::work_us`]).
struct Work(std::time::Duration);

impl protoplane_grpc::intercept::Interceptor for Work {
    fn before(
        &self,
        _: &mut protoplane_grpc::intercept::CallHead<'_>,
    ) -> Result<(), protoplane_grpc::Status> {
        let t = std::time::Instant::now();
        while t.elapsed() < self.0 {
            std::hint::spin_loop();
        }
        Ok(())
    }
}

/// Sets `recorder`'s CPU utilization and rates from this process, every
/// second.
async fn measure_load(recorder: Arc<protoplane_grpc_services::orca::Recorder>) {
    let mut last = (std::time::Instant::now(), host::process_cpu_seconds(), recorder.counts());
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.tick().await;
    loop {
        tick.tick().await;
        let now = (std::time::Instant::now(), host::process_cpu_seconds(), recorder.counts());
        let wall = now.0.duration_since(last.0).as_secs_f64();
        if wall > 0.0 {
            let cpu = match (last.1, now.1) {
                (Some(a), Some(b)) => (b - a) / wall,
                _ => 0.0,
            };
            let calls = now.2 .0.saturating_sub(last.2 .0) as f64 / wall;
            let errors = now.2 .1.saturating_sub(last.2 .1) as f64 / wall;
            recorder.update(|r| {
                r.cpu_utilization = cpu;
                r.rps_fractional = calls;
                r.eps = errors;
            });
        }
        last = now;
    }
}

/// The server's keepalive settings, in seconds (fractions allowed).
#[derive(clap::Args, Debug)]
pub(crate) struct KeepaliveArgs {
    /// Ping a client after this long without hearing from it.
    #[arg(long, value_name = "SECONDS", default_value_t = 7200.0)]
    keepalive_time: f64,
    /// Close a connection whose client answers no ping within this.
    #[arg(long, value_name = "SECONDS", default_value_t = 20.0)]
    keepalive_timeout: f64,
    /// The shortest time between a client's pings that is not a strike
    /// (the third strike: GOAWAY ENHANCE_YOUR_CALM "too_many_pings").
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0)]
    keepalive_min_time: f64,
    /// Let clients ping with no call open.
    #[arg(long)]
    keepalive_permit_without_stream: bool,
    /// GOAWAY a connection after this long with no call open.
    #[arg(long, value_name = "SECONDS")]
    max_connection_idle: Option<f64>,
    /// GOAWAY a connection after this long (±10%).
    #[arg(long, value_name = "SECONDS")]
    max_connection_age: Option<f64>,
    /// Close a connection this long after its age's GOAWAY, calls or not.
    #[arg(long, value_name = "SECONDS", requires = "max_connection_age")]
    max_connection_age_grace: Option<f64>,
}

impl KeepaliveArgs {
    /// The settings, or what is wrong with them.
    pub(crate) fn settings(&self) -> Result<protoplane_rpc::ServerKeepalive, String> {
        let secs = |flag: &str, v: f64| -> Result<std::time::Duration, String> {
            if v.is_finite() && (0.0..=1e9).contains(&v) {
                Ok(std::time::Duration::from_secs_f64(v))
            } else {
                Err(format!("--{flag} {v}: seconds, 0 or more"))
            }
        };
        let positive = |flag: &str, v: f64| -> Result<std::time::Duration, String> {
            let d = secs(flag, v)?;
            if d.is_zero() {
                return Err(format!("--{flag}: more than 0 seconds"));
            }
            Ok(d)
        };
        Ok(protoplane_rpc::ServerKeepalive {
            time: positive("keepalive-time", self.keepalive_time)?,
            timeout: positive("keepalive-timeout", self.keepalive_timeout)?,
            min_time: secs("keepalive-min-time", self.keepalive_min_time)?,
            permit_without_stream: self.keepalive_permit_without_stream,
            max_connection_idle: self
                .max_connection_idle
                .map(|v| positive("max-connection-idle", v))
                .transpose()?,
            max_connection_age: self
                .max_connection_age
                .map(|v| positive("max-connection-age", v))
                .transpose()?,
            max_connection_age_grace: self
                .max_connection_age_grace
                .map(|v| secs("max-connection-age-grace", v))
                .transpose()?,
        })
    }
}

/// `protoplane serve`: the social-network service over gRPC/HTTP2.
pub(crate) fn serve(
    args: &ServeArgs,
    telemetry: &protoplane_telemetry::Telemetry,
) -> Result<(), String> {
    let traced = telemetry.tracing();
    // With spans exported, every call gets one (the client's trace goes on).
    let wrap = |svc: Arc<dyn protoplane_grpc::Service>| match traced {
        true => protoplane_telemetry::traced(svc),
        false => svc,
    };
    if let Some(path) = &args.attach {
        let svc = wrap(Arc::new(SocialNetwork::new(schema()?)?));
        let spin = std::time::Duration::from_micros(args.spin_us.unwrap_or(20));
        let app = protoplane_app::attach(path).spin(spin).service(svc);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        // Until the engine refuses it, or SIGTERM/SIGINT: then the process
        // returns (and flushes its spans); the engine fails what was still
        // open with the application.
        return rt.block_on(async {
            tokio::select! {
                r = app.run() => r.map_err(|e| e.to_string()),
                s = crate::engine::stop_signal() => {
                    tracing::info!("{}: detaching from the engine", s?);
                    Ok(())
                }
            }
        });
    }
    if !(args.shutdown_grace.is_finite() && args.shutdown_grace >= 0.0) {
        return Err(format!("--shutdown-grace {}: seconds, 0 or more", args.shutdown_grace));
    }
    let grace = std::time::Duration::from_secs_f64(args.shutdown_grace.min(86_400.0));
    let keepalive = args.keepalive.settings()?;
    let mut chain = protoplane_grpc::intercept::Chain::new();
    if let Some(us) = args.work_us {
        chain = chain.with(Work(std::time::Duration::from_micros(us.min(1_000_000))));
    }
    if let Some(us) = args.delay_us {
        chain = chain.with_async(Delay(std::time::Duration::from_micros(us.min(60_000_000))));
    }
    let recorder = args.orca.then(protoplane_grpc_services::orca::Recorder::new);
    if let Some(r) = &recorder {
        chain = chain.with(r.interceptor());
    }
    let mut router = router_wrapped(
        ServerOptions { transport: args.grpc_transport, keepalive, ..ServerOptions::default() },
        &chain,
        wrap,
    )?;
    if let Some(r) = &recorder {
        let every = args.orca_min_interval;
        if !(every.is_finite() && (0.001..=86_400.0).contains(&every)) {
            return Err(format!("--orca-min-interval {every}: seconds, 0.001 or more"));
        }
        let every = std::time::Duration::from_secs_f64(every);
        router = router.add_service(
            protoplane_grpc_services::orca::OpenRca::new(r.clone(), every)
                .map_err(|e| e.message)?,
        );
    }
    let metrics = (args.metrics_addr.is_some() || telemetry.endpoint().is_some())
        .then(protoplane_rpc::metrics::Metrics::new);
    // Pushed over OTLP too, with an endpoint (and once more at exit).
    let _push = match &metrics {
        Some(m) => telemetry.push_metrics(m)?,
        None => None,
    };
    if let Some(m) = &metrics {
        router = router.with_metrics(m.clone());
    }
    let rt = host::runtime(args.threads)?;
    if args.spin {
        host::busy_poll(&rt, None);
    } else if let Some(us) = args.spin_us {
        host::busy_poll(&rt, Some(std::time::Duration::from_micros(us)));
    }
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .map_err(|e| format!("listen on {}:{}: {e}", args.host, args.port))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let router = Arc::new(router);
        if let Some(r) = recorder {
            tokio::spawn(measure_load(r));
        }
        if let (Some(at), Some(m)) = (&args.metrics_addr, metrics) {
            let l = tokio::net::TcpListener::bind(at.as_str())
                .await
                .map_err(|e| format!("--metrics-addr {at}: {e}"))?;
            println!("metrics on http://{}/metrics", l.local_addr().map_err(|e| e.to_string())?);
            tokio::spawn(protoplane_rpc::metrics::http::serve(l, m));
        }
        if let Some(port) = args.lean_port {
            let lean = tokio::net::TcpListener::bind((args.host.as_str(), port))
                .await
                .map_err(|e| format!("listen on {}:{port}: {e}", args.host))?;
            println!("lean listening on {}", lean.local_addr().map_err(|e| e.to_string())?);
            tokio::spawn(protoplane_rpc::lean::server::serve_tcp(router.clone(), lean));
        }
        if let Some(path) = &args.lean_unix {
            let _ = std::fs::remove_file(path);
            let lean = tokio::net::UnixListener::bind(path)
                .map_err(|e| format!("listen on {}: {e}", path.display()))?;
            println!("lean listening on unix:{}", path.display());
            tokio::spawn(protoplane_rpc::lean::server::serve_unix(router.clone(), lean));
        }
        println!("listening on {addr}");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        let signal = tokio::select! {
            r = router.clone().serve(listener) => return r.map_err(|e| format!("serve: {e}")),
            s = crate::engine::stop_signal() => s?,
        };
        // Graceful stop: calls in flight finish, new ones go elsewhere.
        router.drain().start();
        tracing::info!("{signal}: draining (up to {grace:?})");
        let drained = tokio::time::timeout(grace, router.drain().finished()).await.is_ok();
        tracing::info!(
            "stopped: {}",
            if drained {
                "every call answered".to_string()
            } else {
                format!("grace period over, {} connection(s) cut", router.drain().connections())
            }
        );
        Ok(())
    })
}
