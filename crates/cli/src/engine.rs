//! `protoplane engine`: the RPC infrastructure as a process of its own.
//! Applications attach to it (`protoplane serve --attach PATH`,
//! `protoplane interop-server --attach PATH`, or any program calling
//! `protoplane_app::attach(path).serve(svc)`); see `protoplane-engine`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use protoplane_engine::Config;

#[derive(clap::Args, Debug)]
pub(crate) struct EngineArgs {
    #[command(flatten)]
    pub(crate) telemetry: crate::telemetry_args::TelemetryArgs,
    /// gRPC/HTTP2 port (0: pick one; the address is printed).
    #[arg(long, value_name = "N")]
    grpc_port: Option<u16>,
    /// Lean transport TCP port (0: pick one).
    #[arg(long, value_name = "N")]
    lean_port: Option<u16>,
    /// Lean transport Unix socket.
    #[arg(long, value_name = "PATH")]
    lean_unix: Option<PathBuf>,
    /// The socket applications attach to.
    #[arg(long, value_name = "PATH")]
    attach: Option<PathBuf>,
    /// A TOML configuration (flags given here override it).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to bind the TCP listeners to.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// More .proto files whose services applications may serve (the
    /// social-network and interop services are built in).
    #[arg(long = "proto", value_name = "FILE")]
    protos: Vec<PathBuf>,
    /// Include roots for --proto.
    #[arg(short = 'I', long = "include", value_name = "DIR")]
    includes: Vec<PathBuf>,
    /// Serve gRPC over TLS with this PEM certificate chain.
    #[arg(long = "tls_cert", value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's PEM private key.
    #[arg(long = "tls_key", value_name = "PEM")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by these PEM CA certificates
    /// (mutual TLS).
    #[arg(long = "tls_client_ca", value_name = "PEM", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Cores to pin the engine to (comma-separated).
    #[arg(long, value_delimiter = ',')]
    cores: Vec<usize>,
    /// Runtime threads.
    #[arg(long)]
    threads: Option<usize>,
    /// Shard client connections over this many worker threads, each with
    /// its own rings to each application (pinned one per core of
    /// `--cores`, in order); applications attach once per worker.
    #[arg(long, value_parser = clap::value_parser!(u16).range(0..=64))]
    workers: Option<u16>,
    /// Spin this many µs after work before parking.
    #[arg(long)]
    spin_us: Option<u64>,
    /// Largest message, each way, in bytes.
    #[arg(long)]
    max_message: Option<usize>,
    /// Largest message received, in bytes, where it is to differ from the
    /// largest sent (`--max-message` sets both): a server that echoes what
    /// it receives answers with more than it accepts.
    #[arg(long)]
    max_recv_message: Option<usize>,
    /// MiB per region half (per attachment and direction).
    #[arg(long)]
    region_mb: Option<u64>,
    /// Slots per ring.
    #[arg(long)]
    ring_slots: Option<u32>,
    /// Cut off an application that takes no request for this long (ms).
    #[arg(long)]
    stall_timeout_ms: Option<u64>,
    /// On SIGTERM or SIGINT, let calls in flight finish for up to this
    /// many seconds (new connections refused, HTTP/2 clients sent GOAWAY),
    /// then tell the applications and exit.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    shutdown_grace: f64,
    /// The admin socket: `protoplane admin PATH status|reload` and live
    /// upgrades go through it (owner-only).
    #[arg(long, value_name = "PATH")]
    admin: Option<PathBuf>,
    /// Live upgrade: take the listening sockets and the applications over
    /// from the engine whose admin socket this is. Its calls in flight
    /// finish there (up to its --shutdown-grace), new calls come here, no
    /// application restarts; then it exits.
    #[arg(long, value_name = "ADMIN_SOCK")]
    take_over: Option<PathBuf>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics: gRFC A66's
    /// call metrics and the engine's own (applications, rings, regions,
    /// copies, policy decisions).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<SocketAddr>,
}

/// `protoplane admin`: one command to a running engine's admin socket.
#[derive(clap::Args, Debug)]
pub(crate) struct AdminArgs {
    /// The engine's admin socket (`protoplane engine --admin PATH`).
    socket: PathBuf,
    /// `status` or `reload` (the configuration file's [policy], as SIGHUP
    /// does). A take-over is `protoplane engine --take-over ADMIN_SOCK`.
    command: String,
}

/// `protoplane admin`.
pub(crate) fn admin(args: &AdminArgs) -> Result<(), String> {
    if args.command == "take-over" {
        return Err(
            "a take-over is `protoplane engine --take-over ADMIN_SOCK` (the new engine asks)"
                .into(),
        );
    }
    let answer = protoplane_engine::admin::request(&args.socket, &args.command)
        .map_err(|e| e.to_string())?;
    print!("{answer}");
    if answer.starts_with("error:") {
        return Err(format!("the engine refused {:?}", args.command));
    }
    Ok(())
}

/// The configuration the flags describe (file first, flags over it).
pub(crate) fn config(args: &EngineArgs) -> Result<Config, String> {
    let mut c = Config::default();
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let base = path.parent().map(PathBuf::from).unwrap_or_default();
        c.apply_toml(&text, &base).map_err(|e| e.to_string())?;
        c.file = Some(path.clone());
    }
    if let Some(p) = &args.admin {
        c.admin = Some(p.clone());
    }
    let addr = |port: u16| -> Result<SocketAddr, String> {
        format!("{}:{port}", args.host).parse().map_err(|e| format!("--host: {e}"))
    };
    if let Some(p) = args.grpc_port {
        c.grpc = Some(addr(p)?);
    }
    if let Some(p) = args.lean_port {
        c.lean_tcp = Some(addr(p)?);
    }
    if let Some(p) = &args.lean_unix {
        c.lean_unix = Some(p.clone());
    }
    if let Some(p) = &args.attach {
        c.attach = p.clone();
    }
    if let Some(a) = args.metrics_addr {
        c.metrics = Some(a);
    }
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        c.tls = Some((cert.clone(), key.clone()));
    }
    if let Some(ca) = &args.tls_client_ca {
        c.tls_client_ca = Some(ca.clone());
    }
    c.protos.extend(args.protos.iter().cloned());
    c.includes.extend(args.includes.iter().cloned());
    if !args.cores.is_empty() {
        c.cores = args.cores.clone();
    }
    if let Some(t) = args.threads {
        c.threads = t.max(1);
    }
    if let Some(w) = args.workers {
        c.workers = w as usize;
    }
    if let Some(s) = args.spin_us {
        c.spin = Duration::from_micros(s);
    }
    if let Some(m) = args.max_message {
        c.server.max_recv_message = m;
        c.server.max_send_message = m;
    }
    if let Some(m) = args.region_mb {
        c.half_mb = m.clamp(1, 1900);
    }
    if let Some(n) = args.ring_slots {
        c.ring_slots = n;
    }
    if let Some(ms) = args.stall_timeout_ms {
        c.stall_timeout = Duration::from_millis(ms.max(10));
    }
    if let Some(m) = args.max_recv_message {
        c.server.max_recv_message = m;
    } else {
        // One limit both ways in split mode unless the receive limit is
        // given on its own: a response chunk is sized by it.
        c.server.max_send_message = c.server.max_send_message.min(c.server.max_recv_message);
    }
    if c.grpc.is_none() && c.lean_tcp.is_none() && c.lean_unix.is_none() {
        c.grpc = Some(addr(50051)?);
    }
    c.schemas.push(protoplane_load::social::schema()?);
    c.schemas.push(crate::interop::schema()?);
    c.load_protos().map_err(|e| e.to_string())?;
    Ok(c)
}

/// `protoplane engine`.
pub(crate) fn run(
    args: &EngineArgs,
    telemetry: &protoplane_telemetry::Telemetry,
) -> Result<(), String> {
    let mut c = config(args)?;
    // Metrics pushed over OTLP need the registry, scraped or not.
    c.metrics_registry = telemetry.endpoint().is_some();
    if !(args.shutdown_grace.is_finite() && args.shutdown_grace >= 0.0) {
        return Err(format!("--shutdown-grace {}: seconds, 0 or more", args.shutdown_grace));
    }
    let grace = std::time::Duration::from_secs_f64(args.shutdown_grace.min(86_400.0));
    c.grace = grace;
    // A take-over asks before anything binds: the sockets come from the
    // running engine.
    let (inherited, handover) = match &args.take_over {
        Some(path) => {
            let (i, t) = protoplane_engine::admin::take_over(path).map_err(|e| e.to_string())?;
            tracing::info!(
                "taking over from {}: {} socket(s), applications for {}",
                path.display(),
                i.fds.len(),
                if i.services.is_empty() { "nothing".to_string() } else { i.services.join(", ") }
            );
            (i, Some(t))
        }
        None => (Default::default(), None),
    };
    let cores = c.cores.clone();
    let mut b = if c.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(c.threads);
        b
    };
    if !cores.is_empty() {
        protoplane_shm::sys::pin_current_thread(&cores).map_err(|e| format!("--cores: {e}"))?;
        let pin = cores.clone();
        b.on_thread_start(move || {
            let _ = protoplane_shm::sys::pin_current_thread(&pin);
        });
    }
    let rt = b.enable_all().build().map_err(|e| format!("tokio runtime: {e}"))?;
    // Applications' outbound channels may name xds:/// targets.
    protoplane_xds::register();
    rt.block_on(async move {
        let running =
            protoplane_engine::start_with(c, inherited).await.map_err(|e| e.to_string())?;
        let _push = match &running.metrics_registry {
            Some(m) => telemetry.push_metrics(m)?,
            None => None,
        };
        // What listens where, one line each, "attach at" last (scripts read
        // up to it and may close the pipe then: a write error here is
        // ignored, never a panic).
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        if let Some(a) = running.grpc {
            let _ = writeln!(out, "grpc listening on {a}");
        }
        if let Some(a) = running.lean {
            let _ = writeln!(out, "lean listening on {a}");
        }
        if let Some(a) = &running.admin {
            let _ = writeln!(out, "admin at {}", a.display());
        }
        if let Some(a) = running.metrics {
            let _ = writeln!(out, "metrics on http://{a}/metrics");
        }
        let _ = writeln!(out, "attach at {}", running.attach.display());
        let _ = out.flush();
        drop(out);
        if let Some(t) = handover {
            // The old engine drains for up to its own grace period; give
            // it that and a margin before calling the hand-over lost.
            let wait = grace + std::time::Duration::from_secs(30);
            tokio::task::spawn_blocking(move || match t.ready(wait) {
                Ok(said) => tracing::info!("the old engine: {said}"),
                Err(e) => tracing::warn!("{e}"),
            });
        }
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|e| format!("SIGHUP: {e}"))?;
        let stop = stop_signal();
        tokio::pin!(stop);
        let signal = loop {
            tokio::select! {
                s = &mut stop => break s?,
                _ = hup.recv() => match running.reload() {
                    Ok(said) => tracing::info!("SIGHUP: reloaded: {said}"),
                    Err(e) => tracing::warn!("SIGHUP: reload refused, nothing changed: {e}"),
                },
                _ = running.replaced() => {
                    tracing::info!("handed over to the new engine; exiting");
                    return Ok(());
                }
            }
        };
        tracing::info!("{signal}: draining (up to {grace:?})");
        let s = running.shutdown(grace).await;
        tracing::info!(
            "stopped: {}, {} client connection(s) cut, {} application(s) told",
            if s.drained { "every call answered" } else { "grace period over" },
            s.connections_left,
            s.applications
        );
        Ok(())
    })
}

/// Waits for SIGTERM or SIGINT; names the one that came.
pub(crate) async fn stop_signal() -> Result<&'static str, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT: {e}"))?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}
