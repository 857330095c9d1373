//! The generator: closed and open loops over gRPC or the lean transport,
//! one task per in-flight slot, each with its own histogram.

use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use protoplane_grpc::{Code, Metadata, Schema, Status};
use protoplane_rpc::config::ServiceConfig;
use protoplane_rpc::intercept::ClientChain;
use protoplane_rpc::lean::LeanChannel;
use protoplane_rpc::{
    CallOptions, Channel, ChannelOptions, ClientKeepalive, GrpcTransport, LbPolicy,
};
use protoplane_wire::{Block, DecodeOptions, Decoder};
use tokio::sync::watch;

use crate::framing::Framing;
use crate::Error;

/// Latencies are recorded in microseconds within 1 µs .. 60 s (longer ones
/// saturate at 60 s), to 3 significant digits.
const MAX_LATENCY_US: u64 = 60_000_000;
const SIGFIG: u8 = 3;

/// Reconnection after a connection is lost: at most this many attempts in a
/// row, waiting `RECONNECT_FIRST` after the first failure and doubling up to
/// `RECONNECT_MAX` (about 10 s in all before giving up).
const RECONNECT_ATTEMPTS: u32 = 10;
const RECONNECT_FIRST: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Time between releasing the slots and the first scheduled call: every
/// slot task must be running by then, or the first calls would look
/// delayed.
const START_SLACK: Duration = Duration::from_millis(5);

/// How long a duration-bounded run waits, after its end, for calls still in
/// flight when no per-call timeout bounds them.
const DRAIN_WITHOUT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    /// The server: HOST:PORT, or a gRPC target name (dns:///HOST:PORT,
    /// ipv4:A:PORT,B:PORT, ipv6:[A]:PORT,..., unix:PATH, or xds:///NAME
    /// with GRPC_XDS_BOOTSTRAP set) whose addresses --lb spreads the calls
    /// over (plaintext HTTP/2, prior knowledge;
    /// with --transport lean: HOST:PORT or unix:PATH).
    #[arg(long, value_name = "TARGET")]
    target: String,
    /// How each connection spreads its calls over the target's addresses
    /// (gRPC): pick_first (the first address that connects) or round_robin
    /// (every address connected, calls in turn).
    #[arg(long, value_name = "POLICY", default_value = "pick_first")]
    lb: LbPolicy,
    /// A gRPC service config (JSON): per-method timeouts and retry
    /// policies, retry throttling; a load-balancing policy in it replaces
    /// --lb.
    #[arg(long, value_name = "FILE")]
    service_config: Option<PathBuf>,
    /// Without --service-config: look the service config up in the DNS TXT
    /// records of a `dns:` target (`_grpc_config.HOST`, gRFC A2).
    #[arg(long)]
    dns_service_config: bool,
    /// The protocol: gRPC over HTTP/2, or protoplane's lean transport
    /// (protoplane servers only; unary methods).
    #[arg(long, value_enum, default_value_t = Transport::Grpc)]
    transport: Transport,
    /// The HTTP/2 implementation of the gRPC client: protoplane's own
    /// (native) or the h2 crate's (h2, kept for comparison).
    #[arg(long, value_name = "native|h2", default_value = "native")]
    grpc_client: GrpcTransport,
    /// Keepalive (gRFC A8): ping the server after this many seconds
    /// without hearing from it (native gRPC client; none by default).
    #[arg(long, value_name = "SECONDS")]
    keepalive_time: Option<f64>,
    /// Give a connection up when a keepalive ping gets no answer within
    /// this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 20.0, requires = "keepalive_time")]
    keepalive_timeout: f64,
    /// Keepalive pings also while no call is open.
    #[arg(long, requires = "keepalive_time")]
    keepalive_permit_without_stream: bool,
    /// A .proto file declaring the service (repeatable).
    #[arg(long = "proto", value_name = "FILE")]
    protos: Vec<PathBuf>,
    /// An import root for .proto files (repeatable).
    #[arg(short = 'I', long = "include", value_name = "DIR")]
    includes: Vec<PathBuf>,
    /// A serialized FileDescriptorSet instead of .proto files
    /// (protoc --include_imports --descriptor_set_out).
    #[arg(long, value_name = "FILE", conflicts_with = "protos")]
    descriptor_set: Option<PathBuf>,
    /// Method to call: pkg.Service/Method, /pkg.Service/Method or
    /// pkg.Service.Method (repeatable; each pairs with the --data in the
    /// same position).
    #[arg(long = "method", value_name = "NAME", required = true)]
    methods: Vec<String>,
    /// Requests for the method in the same position: encoded messages, each
    /// prefixed by its length as a varint (`protoplane encode --delimited`).
    #[arg(long = "data", value_name = "FILE", required = true)]
    data: Vec<PathBuf>,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Connections to the server; calls are spread over them in turn.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Measure for this many seconds [default: 10] (ignored with --requests).
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,
    /// Measure this many calls instead of a duration.
    #[arg(long, value_name = "N")]
    requests: Option<u64>,
    /// Open loop: start calls at this fixed rate whatever the server does,
    /// and measure latency from each call's scheduled start.
    #[arg(long, value_name = "QPS")]
    rate: Option<f64>,
    /// Run this long before measuring (those calls are not recorded).
    #[arg(long, value_name = "SECS", default_value_t = 0.0)]
    warmup: f64,
    /// Per-call deadline in milliseconds, sent as grpc-timeout (0: none).
    #[arg(long, value_name = "MS", default_value_t = 20_000)]
    timeout: u64,
    /// Custom metadata sent with every call (repeatable); the value of a
    /// key ending in -bin is base64.
    #[arg(long = "metadata", value_name = "KEY=VALUE")]
    metadata: Vec<String>,
    /// Tokio worker threads for the generator (1: a single-threaded runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Busy-poll: the generator's threads never sleep waiting for
    /// responses (each holds its core at 100%), so a response is seen as
    /// soon as it arrives; for latency at low concurrency.
    #[arg(long)]
    spin: bool,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Append the report as a CSV row to this file (with a header if new).
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// No progress lines on stderr.
    #[arg(long)]
    quiet: bool,
}

/// What [`run`] does.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// The server, `host:port` (plaintext; lean also takes `unix:PATH`).
    pub target: String,
    /// The protocol.
    pub transport: Transport,
    /// The gRPC client's HTTP/2 implementation.
    pub grpc_client: GrpcTransport,
    /// How a gRPC connection spreads calls over the target's addresses.
    pub lb: LbPolicy,
    /// The gRPC channel's service config.
    pub service_config: Option<Arc<ServiceConfig>>,
    /// Without `service_config`: look one up in DNS (gRFC A2; see
    /// `ChannelOptions::dns_service_config`), once, before connecting.
    pub dns_service_config: bool,
    /// Keepalive pings (native gRPC client).
    pub keepalive: Option<ClientKeepalive>,
    /// Method paths (`/pkg.Service/Method`) with their encoded requests.
    /// Calls go round-robin over every (method, message) pair.
    pub calls: Vec<(String, Vec<Bytes>)>,
    /// Calls in flight at once (slots).
    pub concurrency: usize,
    /// Connections to the server.
    pub connections: usize,
    /// How long to measure (when `requests` is `None`).
    pub duration: Duration,
    /// How many calls to measure; takes precedence over `duration`.
    pub requests: Option<u64>,
    /// Open loop at this many calls per second; `None`: closed loop.
    pub rate: Option<f64>,
    /// Unrecorded time before the measurement.
    pub warmup: Duration,
    /// Per-call deadline (grpc-timeout).
    pub timeout: Option<Duration>,
    /// Custom metadata of every call.
    pub metadata: Metadata,
    /// Print a progress line on stderr every second.
    pub progress: bool,
    /// Client interceptors on every gRPC channel (tracing, for one).
    pub interceptors: ClientChain,
}

impl LoadConfig {
    /// A closed-loop, 10-second, single-slot run of `calls` on `target`.
    #[allow(dead_code)] // for in-process users (demo, benchmarks)
    pub fn new(target: impl Into<String>, calls: Vec<(String, Vec<Bytes>)>) -> LoadConfig {
        LoadConfig {
            target: target.into(),
            transport: Transport::Grpc,
            grpc_client: GrpcTransport::Native,
            lb: LbPolicy::PickFirst,
            service_config: None,
            dns_service_config: false,
            keepalive: None,
            calls,
            concurrency: 1,
            connections: 1,
            duration: Duration::from_secs(10),
            requests: None,
            rate: None,
            warmup: Duration::ZERO,
            timeout: None,
            metadata: Metadata::new(),
            progress: false,
            interceptors: ClientChain::new(),
        }
    }
}

/// The outcome of a run. Latencies (µs) are those of the calls that
/// succeeded, measured in the window after warm-up.
#[derive(Clone, Debug)]
pub struct LoadReport {
    pub target: String,
    pub transport: Transport,
    /// `path (n messages)` per method.
    pub methods: Vec<String>,
    pub concurrency: usize,
    pub connections: usize,
    pub rate: Option<f64>,
    pub warmup: f64,
    /// Calls that ended with OK.
    pub ok: u64,
    /// Failed calls by status code name, most frequent first.
    pub errors: Vec<(String, u64)>,
    /// Open loop: calls that started late because every slot was busy.
    pub delayed: u64,
    /// Open loop over a duration: scheduled calls still waiting for a slot
    /// when the window closed, never started.
    pub missed: u64,
    /// Length of the measurement window: from its start to the end of the
    /// last recorded call.
    pub seconds: f64,
    /// OK calls per second of the window.
    pub qps: f64,
    pub min: u64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
    pub mean: f64,
    /// CPU time (user + system) of the whole process per call made,
    /// warm-up included; `None` without `/proc`. In-process users: this
    /// counts whatever else the process runs (a server, say) too.
    pub cpu_us_per_call: Option<f64>,
    /// Connections re-established after they were lost.
    pub reconnects: u64,
    /// Every call made, warm-up and calls past the measured ones
    /// included (what a server counted, when none was lost on the way).
    pub calls_made: u64,
    /// Slots given up on because their call was still running well after
    /// the end (their calls are missing from the report).
    pub abandoned: usize,
    /// Why the run stopped early (a lost connection that would not come
    /// back), if it did.
    pub aborted: Option<String>,
    /// The longest time between two OK calls ending, ms (to 0.1 ms; a
    /// server's blackout shows here); `None` with fewer than two calls.
    pub max_gap_ms: Option<f64>,
    /// Latencies of the OK calls, µs (for in-process users that merge runs
    /// or want other percentiles).
    #[allow(dead_code)]
    pub histogram: Histogram<u64>,
}

/// Latency percentiles of a histogram (µs); zeros when it is empty.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Latency {
    min: u64,
    p50: u64,
    p90: u64,
    p99: u64,
    p999: u64,
    max: u64,
    mean: f64,
}

fn latency_of(h: &Histogram<u64>) -> Latency {
    if h.is_empty() {
        return Latency { min: 0, p50: 0, p90: 0, p99: 0, p999: 0, max: 0, mean: 0.0 };
    }
    Latency {
        min: h.min(),
        p50: h.value_at_quantile(0.50),
        p90: h.value_at_quantile(0.90),
        p99: h.value_at_quantile(0.99),
        p999: h.value_at_quantile(0.999),
        max: h.max(),
        mean: h.mean(),
    }
}

fn new_histogram() -> Result<Histogram<u64>, String> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, SIGFIG).map_err(|e| format!("histogram: {e}"))
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).clamp(1, MAX_LATENCY_US)
}

/// A slot's histogram: it starts small and grows to the latencies seen (a
/// full 1 µs .. 60 s histogram costs ~140 KB, per slot at high concurrency).
fn slot_histogram() -> Result<Histogram<u64>, String> {
    Histogram::new(SIGFIG).map_err(|e| format!("histogram: {e}"))
}

fn record_latency(h: &mut Histogram<u64>, d: Duration) {
    // `record` grows the histogram (`saturating_record` would clamp to its
    // current, small range); `micros` caps the value at 60 s, so it cannot
    // fail.
    let _ = h.record(micros(d));
}

impl LoadReport {
    fn error_total(&self) -> u64 {
        self.errors.iter().map(|(_, n)| n).sum()
    }

    fn mode(&self) -> String {
        let conns = if self.connections == 1 { "connection" } else { "connections" };
        let conns = format!("{} {} {conns}", self.connections, self.transport.label());
        match self.rate {
            Some(r) => format!(
                "open loop at {} calls/s, concurrency {}, {conns}",
                fmt_f(r),
                self.concurrency
            ),
            None => format!("closed loop, concurrency {}, {conns}", self.concurrency),
        }
    }

    /// A human-readable report, one item per line.
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "target       {}", self.target);
        for (i, m) in self.methods.iter().enumerate() {
            let _ = writeln!(s, "{:<12} {m}", if i == 0 { "methods" } else { "" });
        }
        let _ = writeln!(s, "load         {}", self.mode());
        let warm = if self.warmup > 0.0 {
            format!(" (after {} s warm-up)", fmt_f(self.warmup))
        } else {
            String::new()
        };
        let _ = writeln!(s, "measured     {:.3} s{warm}", self.seconds);
        let _ = write!(s, "calls        {} ok, {} failed", self.ok, self.error_total());
        if !self.errors.is_empty() {
            let list: Vec<String> = self.errors.iter().map(|(c, n)| format!("{c} {n}")).collect();
            let _ = write!(s, " ({})", list.join(", "));
        }
        s.push('\n');
        if self.rate.is_some() {
            let _ = writeln!(
                s,
                "delayed      {} calls started late: every slot was busy at their scheduled time",
                self.delayed
            );
            if self.missed > 0 {
                let _ = writeln!(
                    s,
                    "missed       {} scheduled calls never started: still waiting for a slot at the end",
                    self.missed
                );
            }
        }
        let _ = writeln!(s, "throughput   {:.1} ok calls/s", self.qps);
        let _ = writeln!(
            s,
            "latency µs   min {}  p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  mean {:.1}",
            self.min, self.p50, self.p90, self.p99, self.p999, self.max, self.mean
        );
        match self.cpu_us_per_call {
            Some(c) => {
                let _ = writeln!(s, "generator    {c:.2} µs CPU per call (user + system)");
            }
            None => {
                let _ = writeln!(s, "generator    CPU time unavailable (no /proc/self/stat)");
            }
        }
        if let Some(g) = self.max_gap_ms {
            let _ = writeln!(s, "longest gap  {g:.1} ms between two OK calls ending");
        }
        if self.reconnects > 0 {
            let _ = writeln!(s, "reconnected  {} times (connections lost)", self.reconnects);
        }
        if self.abandoned > 0 {
            let _ = writeln!(
                s,
                "abandoned    {} slots whose call outlived the run (not counted)",
                self.abandoned
            );
        }
        if let Some(why) = &self.aborted {
            let _ = writeln!(s, "ABORTED      {why}");
        }
        s
    }

    /// The report as a JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        let errors: serde_json::Map<String, serde_json::Value> =
            self.errors.iter().map(|(c, n)| (c.clone(), (*n).into())).collect();
        serde_json::json!({
            "target": self.target,
            "transport": self.transport.name(),
            "methods": self.methods,
            "concurrency": self.concurrency,
            "connections": self.connections,
            "rate": self.rate,
            "warmup_s": self.warmup,
            "seconds": self.seconds,
            "ok": self.ok,
            "errors": errors,
            "delayed": self.delayed,
            "missed": self.missed,
            "qps": self.qps,
            "latency_us": {
                "min": self.min,
                "p50": self.p50,
                "p90": self.p90,
                "p99": self.p99,
                "p999": self.p999,
                "max": self.max,
                "mean": self.mean,
            },
            "cpu_us_per_call": self.cpu_us_per_call,
            "reconnects": self.reconnects,
            "calls_made": self.calls_made,
            "abandoned": self.abandoned,
            "aborted": self.aborted,
            "max_gap_ms": self.max_gap_ms,
        })
    }

    /// The CSV header matching [`LoadReport::csv_row`].
    pub fn csv_header() -> &'static str {
        "target,transport,methods,concurrency,connections,rate,seconds,ok,errors,delayed,missed,qps,\
         min_us,p50_us,p90_us,p99_us,p999_us,max_us,mean_us,cpu_us_per_call"
    }

    /// One CSV row (no newline).
    pub fn csv_row(&self) -> String {
        let fields = [
            csv_field(&self.target),
            self.transport.name().to_string(),
            csv_field(&self.methods.join(";")),
            self.concurrency.to_string(),
            self.connections.to_string(),
            self.rate.map(fmt_f).unwrap_or_default(),
            format!("{:.6}", self.seconds),
            self.ok.to_string(),
            self.error_total().to_string(),
            self.delayed.to_string(),
            self.missed.to_string(),
            format!("{:.1}", self.qps),
            self.min.to_string(),
            self.p50.to_string(),
            self.p90.to_string(),
            self.p99.to_string(),
            self.p999.to_string(),
            self.max.to_string(),
            format!("{:.1}", self.mean),
            self.cpu_us_per_call.map(|c| format!("{c:.3}")).unwrap_or_default(),
        ];
        fields.join(",")
    }
}

/// A float without a pointless fraction (`5000`, `0.5`).
fn fmt_f(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

/// RFC 4180 quoting when needed.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

// ---------------------------------------------------------------------------
// Inputs: method names, request files, metadata.

/// The HTTP/2 path of a method named `pkg.Service/Method`,
/// `/pkg.Service/Method` or `pkg.Service.Method`.
fn method_path(name: &str) -> Result<String, String> {
    let bad = || {
        format!(
            "method {name:?}: expected pkg.Service/Method, /pkg.Service/Method or pkg.Service.Method"
        )
    };
    let s = name.trim();
    let s = s.strip_prefix('/').unwrap_or(s);
    let (service, method) = match s.split_once('/') {
        Some(parts) => parts,
        None => s.rsplit_once('.').ok_or_else(bad)?,
    };
    let ident = |x: &str| {
        !x.is_empty() && x.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    };
    if !ident(service) || !ident(method) || method.contains('.') || service.starts_with('.') {
        return Err(bad());
    }
    Ok(format!("/{service}/{method}"))
}

/// Splits a varint-length-delimited stream into its messages (slices of
/// `data`, no copies).
fn read_delimited(data: &Bytes) -> Result<Vec<Bytes>, String> {
    let mut out = Vec::new();
    for (index, item) in Framing::new(true).messages(data).enumerate() {
        let (_, msg) = item.map_err(|e| format!("message {index}: {e}"))?;
        out.push(data.slice_ref(msg));
    }
    Ok(out)
}

/// Checks that every message decodes as `type_index` (once, at startup:
/// the calls then send the bytes as they are).
fn check_messages(schema: &Schema, type_index: u32, msgs: &[Bytes]) -> Result<(), String> {
    let mut dec = Decoder::new();
    let mut block = Block::new();
    let opts = DecodeOptions::view();
    for (index, m) in msgs.iter().enumerate() {
        dec.decode_into(schema.tables(), type_index, m, &opts, &mut block).map_err(|e| {
            format!(
                "message {index} is not a valid {}: {e}",
                schema.tables().message_name(type_index)
            )
        })?;
    }
    Ok(())
}

/// `KEY=VALUE` options as call metadata (`-bin` values are base64).
fn parse_metadata(items: &[String]) -> Result<Metadata, String> {
    let mut md = Metadata::new();
    for item in items {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("--metadata {item:?}: expected KEY=VALUE"))?;
        let key = k.trim().to_ascii_lowercase();
        let r = if protoplane_grpc::metadata::is_binary(&key) {
            let bytes = protoplane_grpc::metadata::decode_value(&key, v.as_bytes())
                .map_err(|e| format!("--metadata {item:?}: {e}"))?;
            md.insert_bin(&key, &bytes)
        } else {
            md.insert(&key, v)
        };
        r.map_err(|e| format!("--metadata {item:?}: {e}"))?;
    }
    Ok(md)
}

fn seconds_arg(flag: &str, secs: f64) -> Result<Duration, String> {
    // Bounded so that adding it to an Instant cannot overflow.
    if !(0.0..=1e8).contains(&secs) {
        return Err(format!("--{flag} {secs:?}: expected seconds between 0 and 1e8"));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("--{flag} {secs:?}: {e}"))
}

// ---------------------------------------------------------------------------
// The open-loop schedule.

/// When call `i` is due, relative to the start of the schedule.
fn schedule_offset(i: u64, rate: f64) -> Duration {
    Duration::try_from_secs_f64(i as f64 / rate).unwrap_or(Duration::MAX)
}

/// How many calls are scheduled strictly before `d` (the first index due at
/// or after it).
fn calls_before(d: Duration, rate: f64) -> u64 {
    // A float that lands a hair above an integer (0.3 s * 10/s) must not
    // add a call: round off the noise before taking the ceiling.
    let x = d.as_secs_f64() * rate;
    let r = x.round();
    let n = if (x - r).abs() < 1e-9 * r.max(1.0) { r } else { x.ceil() };
    n as u64 // saturating
}

/// The ticket range of an open-loop run: tickets `< warm` are warm-up,
/// tickets `warm .. limit` are measured.
fn open_tickets(
    rate: f64,
    warmup: Duration,
    duration: Duration,
    requests: Option<u64>,
) -> (u64, u64) {
    let warm = calls_before(warmup, rate);
    let limit = match requests {
        Some(n) => warm.saturating_add(n),
        None => calls_before(warmup.saturating_add(duration), rate),
    };
    (warm, limit)
}

// ---------------------------------------------------------------------------
// Connections.

/// Which protocol the calls use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// gRPC over HTTP/2: any gRPC server.
    #[default]
    Grpc,
    /// protoplane's lean transport: protoplane servers only, unary methods
    /// (a call's outcome is read from its last frame).
    Lean,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Grpc => "grpc",
            Transport::Lean => "lean",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Transport::Grpc => "HTTP/2",
            Transport::Lean => "lean",
        }
    }
}

/// A connection of either transport (cheap to clone: a handle).
#[derive(Clone, Debug)]
enum Conn {
    Grpc(Channel),
    Lean(LeanChannel),
}

/// How a call went: its status code, or the connection was found dead
/// (the call could not be made).
enum Outcome {
    Done(Code),
    Lost,
}

async fn connect(
    target: &str,
    transport: Transport,
    grpc_client: GrpcTransport,
    keepalive: Option<&ClientKeepalive>,
    (lb, service_config): (LbPolicy, Option<&Arc<ServiceConfig>>),
    interceptors: &ClientChain,
) -> Result<Conn, Status> {
    match transport {
        Transport::Grpc => {
            let opts = ChannelOptions {
                connect_timeout: CONNECT_TIMEOUT,
                transport: grpc_client,
                lb,
                service_config: service_config.cloned(),
                keepalive: keepalive.cloned(),
                ..Default::default()
            };
            Channel::connect_with(target, opts)
                .await
                .map(|ch| Conn::Grpc(ch.intercept(interceptors.clone())))
        }
        Transport::Lean => {
            match tokio::time::timeout(CONNECT_TIMEOUT, LeanChannel::connect(target)).await {
                Ok(r) => r.map(Conn::Lean),
                Err(_) => {
                    Err(Status::new(Code::Unavailable, format!("connect to {target}: timed out")))
                }
            }
        }
    }
}

/// Whether a lean call failed because its connection is gone. The lean
/// client reports that as UNAVAILABLE (or INTERNAL for a protocol error)
/// with its own messages; a server's UNAVAILABLE must not set off a
/// reconnection.
fn lean_connection_lost(st: &Status) -> bool {
    match st.code {
        Code::Unavailable => {
            st.message == "connection closed"
                || st.message.starts_with("the server closed the connection")
                || st.message.starts_with("connection error")
        }
        Code::Internal => st.message.starts_with("lean protocol error"),
        _ => false,
    }
}

impl Conn {
    /// One call: a request, every response, the status.
    async fn call(&self, path: &str, msg: &[u8], opts: &CallOptions) -> Outcome {
        match self {
            Conn::Grpc(ch) => match ch.start(path, opts.clone()).await {
                Ok(mut call) => match call.send_last(msg).await {
                    Ok(()) => Outcome::Done(call.finish_status().await.code),
                    Err(s) => Outcome::Done(s.code),
                },
                // Waiting for stream capacity used up the deadline: the
                // connection itself is fine.
                Err(s) if s.code == Code::DeadlineExceeded => Outcome::Done(s.code),
                // Otherwise the connection is gone (reset, GOAWAY, closed).
                Err(_) => Outcome::Lost,
            },
            Conn::Lean(ch) => match ch.unary(path, msg, opts).await {
                Ok(_) => Outcome::Done(Code::Ok),
                Err(s) if lean_connection_lost(&s) => Outcome::Lost,
                Err(s) => Outcome::Done(s.code),
            },
        }
    }
}

/// One of the run's connections, replaced when it dies. Touched only when
/// a call finds its connection dead, never on the hot path.
struct Link {
    target: String,
    transport: Transport,
    grpc_client: GrpcTransport,
    keepalive: Option<ClientKeepalive>,
    lb: LbPolicy,
    service_config: Option<Arc<ServiceConfig>>,
    interceptors: ClientChain,
    state: tokio::sync::Mutex<LinkState>,
}

struct LinkState {
    /// Bumped at every reconnection, so slots holding the old channel know
    /// to take the new one instead of reconnecting again.
    generation: u64,
    channel: Conn,
    failures: u32,
    retry_at: Option<Instant>,
}

enum Recovery {
    /// Use this channel (a fresh one).
    Use(u64, Conn),
    /// Reconnecting failed; pause until then.
    Wait(Instant),
    /// Too many failures in a row.
    GiveUp(String),
}

impl Link {
    /// Called when a call could not start on generation `generation`.
    async fn recover(&self, generation: u64) -> Recovery {
        let mut st = self.state.lock().await;
        if st.generation != generation {
            return Recovery::Use(st.generation, st.channel.clone());
        }
        let now = Instant::now();
        if let Some(t) = st.retry_at.filter(|t| *t > now) {
            return Recovery::Wait(t);
        }
        let keepalive = self.keepalive.as_ref();
        let balancing = (self.lb, self.service_config.as_ref());
        let chain = &self.interceptors;
        match connect(&self.target, self.transport, self.grpc_client, keepalive, balancing, chain)
            .await
        {
            Ok(c) => {
                st.generation += 1;
                st.channel = c.clone();
                st.failures = 0;
                st.retry_at = None;
                Recovery::Use(st.generation, c)
            }
            Err(e) => {
                st.failures += 1;
                if st.failures >= RECONNECT_ATTEMPTS {
                    return Recovery::GiveUp(format!(
                        "lost the connection to {} and {} reconnection attempts failed (last: {})",
                        self.target, st.failures, e.message
                    ));
                }
                let backoff = RECONNECT_FIRST
                    .saturating_mul(1 << (st.failures - 1).min(16))
                    .min(RECONNECT_MAX);
                let t = Instant::now() + backoff;
                st.retry_at = Some(t);
                Recovery::Wait(t)
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The run.

/// When calls start and which are measured; the same for every slot.
#[derive(Clone, Copy, Debug)]
enum Plan {
    Closed {
        measure_from: Instant,
        /// Duration-bounded runs: no call starts at or after this.
        end: Option<Instant>,
        requests: Option<u64>,
    },
    Open {
        t0: Instant,
        rate: f64,
        warm: u64,
        limit: u64,
        /// Duration-bounded runs: the end of the window. A call still
        /// waiting for a slot then is not started (the run keeps to its
        /// duration when the server falls behind; see `missed`).
        end: Option<Instant>,
    },
}

/// What the slots share. Written per call: `ticket` (and `quota`, `done`,
/// `failed` when in use), all relaxed atomics.
struct Shared {
    /// Flattened (path, message) pairs, in round-robin order.
    pairs: Vec<(String, Bytes)>,
    links: Vec<Link>,
    opts: CallOptions,
    /// Next pair (closed loop) or next scheduled call (open loop).
    ticket: AtomicU64,
    /// Measured calls started (closed loop with a request count).
    quota: AtomicU64,
    /// Calls ended / failed, for the progress line.
    done: AtomicU64,
    failed: AtomicU64,
    progress: bool,
    stop: AtomicBool,
    aborted: Mutex<Option<String>>,
    /// When measured calls ended OK (set once the schedule is known).
    completions: std::sync::OnceLock<Completions>,
}

/// When OK calls completed, in [`Completions::BUCKET`] buckets from the
/// start of the measurement: the longest stretch with none (a server's
/// blackout: a restart, a live upgrade) is [`Completions::max_gap`]. One
/// bit per bucket, shared by every slot; a run longer than its span
/// ([`Completions::MAX_SPAN`] at most) records only its first part.
struct Completions {
    from: Instant,
    bits: Vec<AtomicU64>,
}

impl Completions {
    const BUCKET: Duration = Duration::from_micros(100);
    const MAX_SPAN: Duration = Duration::from_secs(600);

    fn new(from: Instant, span: Duration) -> Completions {
        let n = span.min(Self::MAX_SPAN).as_nanos() / Self::BUCKET.as_nanos() + 1;
        Completions { from, bits: (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect() }
    }

    fn mark(&self, at: Instant) {
        let Some(d) = at.checked_duration_since(self.from) else { return };
        let i = (d.as_nanos() / Self::BUCKET.as_nanos()) as usize;
        if let Some(w) = self.bits.get(i / 64) {
            w.fetch_or(1 << (i % 64), Relaxed);
        }
    }

    /// The longest time between two recorded completions, to one bucket
    /// (an upper bound), counting the stretches from the start of the
    /// measurement to the first one and, if the run had a planned end
    /// (`until`), from the last one to it: a server that stops answering
    /// for good shows here too. `None` with nothing marked.
    fn max_gap(&self, until: Option<Instant>) -> Option<Duration> {
        let mut last = Some(0);
        let mut widest = None;
        let mut any = false;
        for (w, word) in self.bits.iter().enumerate() {
            let mut v = word.load(Relaxed);
            while v != 0 {
                let i = w * 64 + v.trailing_zeros() as usize;
                v &= v - 1;
                any = true;
                if let Some(l) = last {
                    let gap = (i - l) as u32;
                    widest = Some(widest.map_or(gap, |g: u32| g.max(gap)));
                }
                last = Some(i);
            }
        }
        if !any {
            return None;
        }
        if let (Some(l), Some(u)) = (last, until) {
            let end = u.saturating_duration_since(self.from).as_nanos() / Self::BUCKET.as_nanos();
            let end = (end as usize).min(self.bits.len() * 64 - 1);
            let gap = end.saturating_sub(l) as u32;
            widest = Some(widest.map_or(gap, |g: u32| g.max(gap)));
        }
        widest.map(|g| Self::BUCKET * g)
    }
}

impl Shared {
    fn abort(&self, why: String) {
        if let Ok(mut a) = self.aborted.lock() {
            a.get_or_insert(why);
        }
        self.stop.store(true, Relaxed);
    }
}

/// One slot's tallies, merged at the end.
struct SlotStats {
    hist: Histogram<u64>,
    ok: u64,
    errors: [u64; 17],
    delayed: u64,
    /// Measured calls made.
    measured: u64,
    /// Every call made, warm-up included (for CPU per call).
    calls: u64,
    /// End of the slot's last measured call.
    last_done: Option<Instant>,
}

/// Runs the load on the caller's tokio runtime.
pub async fn run(cfg: &LoadConfig) -> Result<LoadReport, Error> {
    if cfg.concurrency == 0 || cfg.connections == 0 {
        return Err(Error::Config("concurrency and connections must be at least 1".into()));
    }
    if let Some(r) = cfg.rate {
        if !(r.is_finite() && r > 0.0) {
            return Err(Error::Config(format!(
                "rate {r}: expected a positive number of calls per second"
            )));
        }
    }
    if cfg.requests.is_none() && cfg.duration.is_zero() {
        return Err(Error::Config("give a duration above zero or a number of requests".into()));
    }
    let mut pairs = Vec::new();
    let mut methods = Vec::new();
    for (path, msgs) in &cfg.calls {
        if msgs.is_empty() {
            return Err(Error::Config(format!("{path}: no request messages")));
        }
        methods.push(format!(
            "{path} ({} message{})",
            msgs.len(),
            if msgs.len() == 1 { "" } else { "s" }
        ));
        pairs.extend(msgs.iter().map(|m| (path.clone(), m.clone())));
    }
    if pairs.is_empty() {
        return Err(Error::Config("no methods to call".into()));
    }
    if cfg.transport == Transport::Grpc && cfg.target.starts_with("https://") {
        return Err(Error::Config(format!(
            "{}: TLS targets are not supported; give HOST:PORT",
            cfg.target
        )));
    }
    if cfg.transport == Transport::Lean && cfg.lb != LbPolicy::PickFirst {
        return Err(Error::Config(format!(
            "--lb {}: the lean transport connects to one address; use --transport grpc",
            cfg.lb.name()
        )));
    }

    // One DNS lookup for every connection, so they all run one config.
    let mut service_config = cfg.service_config.clone();
    if service_config.is_none() && cfg.dns_service_config && cfg.transport == Transport::Grpc {
        match protoplane_rpc::resolve::dns_service_config(&cfg.target).await {
            Ok(sc) => service_config = sc.map(Arc::new),
            Err(st) => eprintln!("service config from DNS not used: {}", st.message),
        }
    }
    let mut links = Vec::with_capacity(cfg.connections);
    for i in 0..cfg.connections {
        let keepalive = cfg.keepalive.as_ref();
        let balancing = (cfg.lb, service_config.as_ref());
        let chain = &cfg.interceptors;
        let channel =
            connect(&cfg.target, cfg.transport, cfg.grpc_client, keepalive, balancing, chain)
                .await
                .map_err(|e| {
                    Error::Connect(format!("connection {} to {}: {}", i + 1, cfg.target, e.message))
                })?;
        if let Conn::Lean(ch) = &channel {
            // The lean handshake lists the server's methods: a path it does
            // not serve is a usage error, not a run of UNIMPLEMENTED.
            if let Some((p, _)) = cfg.calls.iter().find(|(p, _)| ch.method(p).is_none()) {
                return Err(Error::NotServed(format!(
                    "{}: the server does not serve {p}",
                    cfg.target
                )));
            }
        }
        links.push(Link {
            target: cfg.target.clone(),
            transport: cfg.transport,
            grpc_client: cfg.grpc_client,
            lb: cfg.lb,
            service_config: service_config.clone(),
            keepalive: cfg.keepalive.clone(),
            interceptors: cfg.interceptors.clone(),
            state: tokio::sync::Mutex::new(LinkState {
                generation: 0,
                channel,
                failures: 0,
                retry_at: None,
            }),
        });
    }
    let mut initial = Vec::with_capacity(links.len());
    for l in &links {
        initial.push((0u64, l.state.lock().await.channel.clone()));
    }

    let shared = Arc::new(Shared {
        pairs,
        links,
        opts: CallOptions {
            metadata: cfg.metadata.clone(),
            timeout: cfg.timeout,
            ..CallOptions::default()
        },
        ticket: AtomicU64::new(0),
        quota: AtomicU64::new(0),
        done: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        progress: cfg.progress,
        stop: AtomicBool::new(false),
        aborted: Mutex::new(None),
        completions: std::sync::OnceLock::new(),
    });

    // The slots are spawned first and released together through `gate`,
    // so that the schedule starts only when all of them are running.
    let (gate_tx, gate_rx) = watch::channel(None::<Plan>);
    let mut slots = Vec::with_capacity(cfg.concurrency);
    let mut guard = TaskGuard(Vec::with_capacity(cfg.concurrency + 1));
    for slot in 0..cfg.concurrency {
        let task = tokio::spawn(slot_task(slot, shared.clone(), initial.clone(), gate_rx.clone()));
        guard.0.push(task.abort_handle());
        slots.push(task);
    }
    drop(initial);

    let cpu_before = crate::host::process_cpu_seconds();
    let t0 = Instant::now() + START_SLACK;
    let too_long = || Error::Config("the run's duration is too long".to_string());
    let measure_from;
    let end;
    let plan = match cfg.rate {
        None => {
            measure_from = t0.checked_add(cfg.warmup).ok_or_else(too_long)?;
            end = match cfg.requests {
                Some(_) => None,
                None => Some(measure_from.checked_add(cfg.duration).ok_or_else(too_long)?),
            };
            Plan::Closed { measure_from, end, requests: cfg.requests }
        }
        Some(rate) => {
            let (warm, limit) = open_tickets(rate, cfg.warmup, cfg.duration, cfg.requests);
            measure_from = t0.checked_add(schedule_offset(warm, rate)).ok_or_else(too_long)?;
            end = match cfg.requests {
                Some(_) => None,
                None => Some(t0.checked_add(schedule_offset(limit, rate)).ok_or_else(too_long)?),
            };
            Plan::Open { t0, rate, warm, limit, end }
        }
    };
    let span = end.map_or(Completions::MAX_SPAN, |e| {
        e.saturating_duration_since(measure_from) + Duration::from_secs(2)
    });
    let _ = shared.completions.set(Completions::new(measure_from, span));
    let _ = gate_tx.send(Some(plan));

    let progress =
        cfg.progress.then(|| tokio::spawn(progress_task(shared.clone(), t0, measure_from)));
    if let Some(p) = &progress {
        guard.0.push(p.abort_handle());
    }

    // Wait for the slots. A duration-bounded run gives calls still in
    // flight after its end a bounded time to finish, then abandons them
    // (a hung server must not hang the generator).
    let drain = cfg.timeout.map_or(DRAIN_WITHOUT_TIMEOUT, |t| t + Duration::from_secs(1));
    let give_up_at = end.and_then(|e| e.checked_add(drain));
    let mut stats = Vec::with_capacity(slots.len());
    let mut abandoned = 0;
    for handle in slots {
        let joined = match give_up_at {
            None => handle.await,
            Some(at) => {
                let abort = handle.abort_handle();
                match tokio::time::timeout_at(at.into(), handle).await {
                    Ok(j) => j,
                    Err(_) => {
                        abort.abort();
                        abandoned += 1;
                        continue;
                    }
                }
            }
        };
        match joined {
            Ok(Ok(s)) => stats.push(s),
            Ok(Err(e)) => return Err(Error::Aborted(e)),
            Err(e) => return Err(Error::Aborted(format!("a load slot failed: {e}"))),
        }
    }
    let cpu_after = crate::host::process_cpu_seconds();
    if let Some(p) = progress {
        p.abort();
        if std::io::stderr().is_terminal() {
            eprint!("\r\x1b[K");
        }
    }

    let mut hist = new_histogram().map_err(Error::Host)?;
    let mut ok = 0;
    let mut errors = [0u64; 17];
    let mut delayed = 0;
    let mut measured = 0;
    let mut calls = 0;
    let mut last: Option<Instant> = None;
    for s in &stats {
        hist.add(&s.hist).map_err(|e| Error::Host(format!("merging histograms: {e:?}")))?;
        ok += s.ok;
        for (a, b) in errors.iter_mut().zip(s.errors) {
            *a += b;
        }
        delayed += s.delayed;
        measured += s.measured;
        calls += s.calls;
        last = last.max(s.last_done);
    }
    // Open loop over a duration: measured calls the schedule held that
    // never started.
    let missed = match plan {
        Plan::Open { warm, limit, end: Some(_), .. } => (limit - warm).saturating_sub(measured),
        _ => 0,
    };
    let seconds = last.map_or(0.0, |l| l.saturating_duration_since(measure_from).as_secs_f64());
    let mut errors: Vec<(String, u64)> = errors
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(c, n)| (Code::from_u32(c as u32).name().to_string(), *n))
        .collect();
    errors.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let cpu_us_per_call = match (cpu_before, cpu_after) {
        (Some(a), Some(b)) if calls > 0 => Some((b - a) * 1e6 / calls as f64),
        _ => None,
    };
    let lat = latency_of(&hist);
    let max_gap_ms =
        shared.completions.get().and_then(|c| c.max_gap(end)).map(|g| g.as_secs_f64() * 1e3);
    let aborted = shared.aborted.lock().ok().and_then(|a| a.clone());
    let mut reconnects = 0;
    for l in &shared.links {
        reconnects += l.state.lock().await.generation;
    }
    Ok(LoadReport {
        target: cfg.target.clone(),
        transport: cfg.transport,
        methods,
        concurrency: cfg.concurrency,
        connections: cfg.connections,
        rate: cfg.rate,
        warmup: cfg.warmup.as_secs_f64(),
        ok,
        errors,
        delayed,
        missed,
        seconds,
        qps: if seconds > 0.0 { ok as f64 / seconds } else { 0.0 },
        min: lat.min,
        p50: lat.p50,
        p90: lat.p90,
        p99: lat.p99,
        p999: lat.p999,
        max: lat.max,
        mean: lat.mean,
        cpu_us_per_call,
        reconnects,
        calls_made: calls,
        abandoned,
        aborted,
        max_gap_ms,
        histogram: hist,
    })
}

/// Aborts the run's tasks when [`run`] ends early or its future is
/// dropped: the slots must not go on loading the server on their own.
struct TaskGuard(Vec<tokio::task::AbortHandle>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

/// One in-flight slot: waits for the plan, then loops call → record.
async fn slot_task(
    slot: usize,
    shared: Arc<Shared>,
    mut channels: Vec<(u64, Conn)>,
    mut gate: watch::Receiver<Option<Plan>>,
) -> Result<SlotStats, String> {
    let hist = slot_histogram()?;
    let mut st = SlotStats {
        hist,
        ok: 0,
        errors: [0; 17],
        delayed: 0,
        measured: 0,
        calls: 0,
        last_done: None,
    };
    let plan = match gate.wait_for(Option::is_some).await {
        Ok(p) => *p,
        Err(_) => None, // the run was dropped before it started
    };
    let Some(plan) = plan else { return Ok(st) };
    drop(gate);

    let n_pairs = shared.pairs.len() as u64;
    let n_conn = channels.len();
    // Each slot walks the connections in turn, starting at its own.
    let mut conn = slot % n_conn;
    loop {
        if shared.stop.load(Relaxed) {
            break;
        }
        let (ticket, start, measured) = match plan {
            Plan::Closed { measure_from, end, requests } => {
                let now = Instant::now();
                if end.is_some_and(|e| now >= e) {
                    break;
                }
                let measured = now >= measure_from;
                if let (true, Some(n)) = (measured, requests) {
                    if shared.quota.fetch_add(1, Relaxed) >= n {
                        break;
                    }
                }
                (shared.ticket.fetch_add(1, Relaxed), now, measured)
            }
            Plan::Open { t0, rate, warm, limit, end } => {
                let i = shared.ticket.fetch_add(1, Relaxed);
                if i >= limit {
                    break;
                }
                let Some(due) = t0.checked_add(schedule_offset(i, rate)) else { break };
                let measured = i >= warm;
                let now = Instant::now();
                if end.is_some_and(|e| now >= e) {
                    break;
                }
                if now < due {
                    // A free slot waits for the call's time; the timer may
                    // wake it a little late (~1 ms granularity), which is
                    // the generator's doing, not the server's, so latency
                    // runs from the actual start.
                    tokio::time::sleep_until(due.into()).await;
                    (i, Instant::now(), measured)
                } else {
                    // No slot was free when the call was due: it starts
                    // late, and the wait is charged to the server.
                    if measured {
                        st.delayed += 1;
                    }
                    (i, due, measured)
                }
            }
        };
        let (path, msg) = &shared.pairs[(ticket % n_pairs) as usize];
        let c = conn;
        conn = (conn + 1) % n_conn;

        let outcome = channels[c].1.call(path, msg, &shared.opts).await;
        let finished = Instant::now();
        let mut pause = None;
        let code = match outcome {
            Outcome::Done(code) => code,
            Outcome::Lost => {
                // The call could not be made, which gRPC reports as
                // UNAVAILABLE; replace the connection (or wait to).
                match shared.links[c].recover(channels[c].0).await {
                    Recovery::Use(g, ch) => channels[c] = (g, ch),
                    Recovery::Wait(t) => pause = Some(t),
                    Recovery::GiveUp(why) => shared.abort(why),
                }
                Code::Unavailable
            }
        };
        st.calls += 1;
        if measured {
            st.measured += 1;
            if code == Code::Ok {
                st.ok += 1;
                record_latency(&mut st.hist, finished.saturating_duration_since(start));
                if let Some(c) = shared.completions.get() {
                    c.mark(finished);
                }
            } else {
                st.errors[code as usize] += 1;
            }
            st.last_done = Some(finished);
        }
        if shared.progress {
            shared.done.fetch_add(1, Relaxed);
            if code != Code::Ok {
                shared.failed.fetch_add(1, Relaxed);
            }
        }
        if let Some(t) = pause {
            tokio::time::sleep_until(t.into()).await;
        }
    }
    Ok(st)
}

/// A line on stderr every second: elapsed time, calls done, current rate,
/// errors. Rewritten in place on a terminal.
async fn progress_task(shared: Arc<Shared>, t0: Instant, measure_from: Instant) {
    let tty = std::io::stderr().is_terminal();
    let second = Duration::from_secs(1);
    let mut tick = tokio::time::interval_at((t0 + second).into(), second);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut last_t, mut last_n) = (t0, 0);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let done = shared.done.load(Relaxed);
        let failed = shared.failed.load(Relaxed);
        let dt = now.saturating_duration_since(last_t).as_secs_f64();
        let qps = if dt > 0.0 { done.saturating_sub(last_n) as f64 / dt } else { 0.0 };
        (last_t, last_n) = (now, done);
        let phase = if now < measure_from { "  (warm-up)" } else { "" };
        let line = format!(
            "{:>7.1} s  {done} calls  {qps:.0} calls/s  {failed} errors{phase}",
            now.saturating_duration_since(t0).as_secs_f64()
        );
        if tty {
            eprint!("\r{line}\x1b[K");
        } else {
            eprintln!("{line}");
        }
    }
}

// ---------------------------------------------------------------------------
// The command.

fn load_schema(args: &LoadArgs) -> Result<Schema, String> {
    match &args.descriptor_set {
        Some(p) => {
            let bytes = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
            Schema::from_descriptor_set(&bytes).map_err(|e| format!("{}: {e}", p.display()))
        }
        None if args.protos.is_empty() => {
            Err("give the service's schema: --proto FILE (with -I DIR) or --descriptor-set FILE"
                .into())
        }
        None => Schema::from_proto_files(&args.protos, &args.includes).map_err(|e| e.to_string()),
    }
}

fn resolve_method(schema: &Schema, name: &str) -> Result<(String, u32), String> {
    let path = method_path(name)?;
    let Some(id) = schema.method_id(&path) else {
        let known: Vec<&str> = schema.methods().iter().map(|m| m.path.as_str()).collect();
        let list = if known.is_empty() {
            "the schema declares no services".to_string()
        } else if known.len() <= 20 {
            format!("known: {}", known.join(", "))
        } else {
            format!("known: {}, … ({} in all)", known[..20].join(", "), known.len())
        };
        return Err(format!("method {name:?}: {path} is not in the schema ({list})"));
    };
    let m = schema.method(id).ok_or_else(|| format!("method {path}: bad method id"))?;
    Ok((path, m.input))
}

fn read_data(schema: &Schema, path: &Path, input: u32) -> Result<Vec<Bytes>, String> {
    let shown = path.display();
    let data = Bytes::from(std::fs::read(path).map_err(|e| format!("{shown}: {e}"))?);
    let msgs = read_delimited(&data).map_err(|e| format!("{shown}: {e}"))?;
    if msgs.is_empty() {
        return Err(format!("{shown}: no messages"));
    }
    check_messages(schema, input, &msgs).map_err(|e| format!("{shown}: {e}"))?;
    Ok(msgs)
}

fn config_of(args: &LoadArgs) -> Result<LoadConfig, String> {
    if args.target.starts_with("xds:") {
        // xds:///NAME: routed by the management server GRPC_XDS_BOOTSTRAP names.
        protoplane_xds::register();
    }
    if args.methods.len() != args.data.len() {
        return Err(format!(
            "give one --data FILE per --method (got {} methods, {} data files)",
            args.methods.len(),
            args.data.len()
        ));
    }
    if args.concurrency == 0 || args.connections == 0 || args.threads == 0 {
        return Err("--concurrency, --connections and --threads must be at least 1".into());
    }
    if args.requests == Some(0) {
        return Err("--requests must be at least 1".into());
    }
    let duration = seconds_arg("duration", args.duration.unwrap_or(10.0))?;
    if args.requests.is_none() && duration.is_zero() {
        return Err("--duration must be above zero".into());
    }
    let warmup = seconds_arg("warmup", args.warmup)?;
    if let Some(r) = args.rate {
        if !(r.is_finite() && r > 0.0 && r <= 1e9) {
            return Err(format!("--rate {r:?}: expected calls per second, above 0"));
        }
    }
    let metadata = parse_metadata(&args.metadata)?;
    let schema = load_schema(args)?;
    let mut calls = Vec::with_capacity(args.methods.len());
    for (name, file) in args.methods.iter().zip(&args.data) {
        let (path, input) = resolve_method(&schema, name)?;
        let msgs = read_data(&schema, file, input)?;
        calls.push((path, msgs));
    }
    let seconds = |flag: &str, v: f64| -> Result<Duration, String> {
        if v.is_finite() && v > 0.0 && v <= 1e9 {
            Ok(Duration::from_secs_f64(v))
        } else {
            Err(format!("--{flag} {v}: seconds, above 0"))
        }
    };
    let keepalive = match args.keepalive_time {
        Some(t) => Some(ClientKeepalive {
            time: seconds("keepalive-time", t)?,
            timeout: seconds("keepalive-timeout", args.keepalive_timeout)?,
            permit_without_stream: args.keepalive_permit_without_stream,
        }),
        None => None,
    };
    let service_config = match &args.service_config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--service-config {}: {e}", path.display()))?;
            let sc = ServiceConfig::from_json(&text)
                .map_err(|e| format!("--service-config {}: {}", path.display(), e.message))?;
            Some(Arc::new(sc))
        }
        None => None,
    };
    Ok(LoadConfig {
        target: args.target.clone(),
        transport: args.transport,
        grpc_client: args.grpc_client,
        lb: args.lb,
        service_config,
        dns_service_config: args.dns_service_config,
        keepalive,
        calls,
        concurrency: args.concurrency,
        connections: args.connections,
        duration,
        requests: args.requests,
        rate: args.rate,
        warmup,
        timeout: (args.timeout > 0).then(|| Duration::from_millis(args.timeout)),
        metadata,
        progress: !args.quiet,
        interceptors: ClientChain::new(),
    })
}

fn write_csv(path: &Path, report: &LoadReport) -> Result<(), String> {
    use std::io::Write as _;
    let shown = path.display();
    let fresh = std::fs::metadata(path).map_or(true, |m| m.len() == 0);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("{shown}: {e}"))?;
    let mut text = String::new();
    if fresh {
        text.push_str(LoadReport::csv_header());
        text.push('\n');
    }
    text.push_str(&report.csv_row());
    text.push('\n');
    f.write_all(text.as_bytes()).map_err(|e| format!("{shown}: {e}"))
}

/// `protoplane load`: runs the command line's load and renders its report
/// (also written as JSON and CSV where the flags say).
pub fn command(args: &LoadArgs) -> Result<String, Error> {
    command_with(args, ClientChain::new())
}

/// [`command`] with client interceptors on every gRPC channel it makes.
pub fn command_with(args: &LoadArgs, interceptors: ClientChain) -> Result<String, Error> {
    let mut cfg = config_of(args).map_err(Error::Config)?;
    cfg.interceptors = interceptors;
    let rt = crate::host::runtime(args.threads)?;
    if args.spin {
        crate::host::busy_poll(&rt, None);
    }
    let report = rt.block_on(run(&cfg))?;
    if let Some(p) = &args.json {
        let text = serde_json::to_string_pretty(&report.to_json())
            .map_err(|e| Error::Host(format!("{}: {e}", p.display())))?;
        std::fs::write(p, text + "\n").map_err(|e| Error::Host(format!("{}: {e}", p.display())))?;
    }
    if let Some(p) = &args.csv {
        write_csv(p, &report).map_err(Error::Host)?;
    }
    if let Some(why) = &report.aborted {
        return Err(Error::Aborted(format!(
            "{why} ({} ok calls, {} failed before that)",
            report.ok,
            report.error_total()
        )));
    }
    Ok(report.render_text())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_names() {
        for name in [
            "grpc.testing.TestService/UnaryCall",
            "/grpc.testing.TestService/UnaryCall",
            "grpc.testing.TestService.UnaryCall",
            " grpc.testing.TestService/UnaryCall ",
        ] {
            assert_eq!(
                method_path(name).as_deref(),
                Ok("/grpc.testing.TestService/UnaryCall"),
                "{name}"
            );
        }
        assert_eq!(method_path("Svc.M").as_deref(), Ok("/Svc/M"));
        assert_eq!(method_path("Svc/M").as_deref(), Ok("/Svc/M"));
        for bad in
            ["", "/", "Method", "pkg.Svc/", "/M", "a/b/c", "pkg.Svc.", ".M", "a b/c", "x/y.z"]
        {
            assert!(method_path(bad).is_err(), "{bad:?} accepted");
        }
    }

    fn delimited(msgs: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in msgs {
            Framing::new(true).put(&mut out, m);
        }
        out
    }

    #[test]
    fn delimited_reader() {
        let long = vec![7u8; 300]; // a two-byte length prefix
        let data = Bytes::from(delimited(&[b"\x10\x0a", b"", &long]));
        let msgs = read_delimited(&data).expect("well-formed");
        assert_eq!(msgs.len(), 3);
        assert_eq!(&msgs[0][..], b"\x10\x0a");
        assert!(msgs[1].is_empty());
        assert_eq!(&msgs[2][..], &long[..]);
        // The messages are views of the file's bytes, not copies.
        assert_eq!(msgs[0].as_ptr(), data[1..].as_ptr());

        assert_eq!(read_delimited(&Bytes::new()).map(|m| m.len()), Ok(0));

        // Truncated: the last message is cut short.
        let mut cut = delimited(&[b"ab", b"cdef"]);
        cut.pop();
        let err = read_delimited(&Bytes::from(cut)).expect_err("truncated");
        assert!(err.starts_with("message 1: "), "{err}");
        assert!(err.contains("declares 4 bytes, only 3 remain"), "{err}");

        // A prefix that never ends.
        let err = read_delimited(&Bytes::from(vec![0x02, b'o', b'k', 0xff, 0xff])).expect_err("");
        assert!(err.starts_with("message 1: malformed length prefix"), "{err}");
    }

    #[test]
    fn the_longest_stretch_without_a_completion_is_found() {
        let t0 = Instant::now();
        let c = Completions::new(t0, Duration::from_secs(1));
        assert_eq!(c.max_gap(None), None);
        for ms in [0u64, 1, 2, 3, 250, 251, 900] {
            c.mark(t0 + Duration::from_millis(ms) + Duration::from_micros(10));
        }
        // Past the span: not recorded.
        c.mark(t0 + Duration::from_secs(5));
        assert_eq!(c.max_gap(None), Some(Duration::from_millis(649)));
        // A planned end long after the last completion: the silence counts.
        assert_eq!(
            c.max_gap(Some(t0 + Duration::from_millis(1000))),
            Some(Duration::from_millis(649))
        );
        let quiet_end = Completions::new(t0, Duration::from_secs(2));
        quiet_end.mark(t0 + Duration::from_millis(10));
        quiet_end.mark(t0 + Duration::from_millis(11));
        assert_eq!(
            quiet_end.max_gap(Some(t0 + Duration::from_millis(1011))),
            Some(Duration::from_millis(1000)),
            "the server stopped answering"
        );
        let d = Completions::new(t0, Duration::from_secs(1));
        d.mark(t0 + Duration::from_micros(50));
        d.mark(t0 + Duration::from_micros(150));
        assert_eq!(d.max_gap(None), Some(Duration::from_micros(100)), "one bucket apart");
        let late = Completions::new(t0, Duration::from_secs(1));
        late.mark(t0 + Duration::from_millis(300));
        assert_eq!(late.max_gap(None), Some(Duration::from_millis(300)), "from the start");
    }

    fn synthetic_report() -> LoadReport {
        let mut h = new_histogram().expect("histogram");
        for v in 1..=1000 {
            h.saturating_record(v);
        }
        h.saturating_record(u64::MAX); // saturates at 60 s
        let lat = latency_of(&h);
        LoadReport {
            target: "127.0.0.1:1".into(),
            transport: Transport::Grpc,
            methods: vec!["/a.B/C (2 messages)".into(), "/a.B/D (1 message)".into()],
            concurrency: 8,
            connections: 2,
            rate: Some(1000.0),
            warmup: 0.5,
            ok: h.len(),
            errors: vec![("UNAVAILABLE".into(), 3), ("DEADLINE_EXCEEDED".into(), 1)],
            delayed: 2,
            missed: 5,
            seconds: 1.0,
            qps: h.len() as f64,
            min: lat.min,
            p50: lat.p50,
            p90: lat.p90,
            p99: lat.p99,
            p999: lat.p999,
            max: lat.max,
            mean: lat.mean,
            cpu_us_per_call: Some(4.25),
            reconnects: 0,
            calls_made: 0,
            abandoned: 0,
            aborted: None,
            max_gap_ms: Some(1.5),
            histogram: h,
        }
    }

    #[test]
    fn percentiles_and_rendering() {
        let r = synthetic_report();
        // Below 2048 a 3-digit histogram is exact.
        assert_eq!((r.min, r.p50, r.p90, r.p99), (1, 501, 901, 991));
        assert_eq!(r.p999, 1000);
        // 60 s saturation, within the histogram's 3 significant digits.
        assert!(r.max >= MAX_LATENCY_US && r.max < MAX_LATENCY_US + MAX_LATENCY_US / 500);
        let empty = latency_of(&new_histogram().expect("histogram"));
        assert_eq!((empty.min, empty.max, empty.mean), (0, 0, 0.0));

        let text = r.render_text();
        for want in [
            "target       127.0.0.1:1\n",
            "methods      /a.B/C (2 messages)\n             /a.B/D (1 message)\n",
            "open loop at 1000 calls/s, concurrency 8, 2 HTTP/2 connections",
            "(after 0.5 s warm-up)",
            "1001 ok, 4 failed (UNAVAILABLE 3, DEADLINE_EXCEEDED 1)",
            "delayed      2 calls",
            "missed       5 scheduled",
            "p50 501  p90 901  p99 991  p99.9 1000",
            "4.25 µs CPU per call",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        assert!(!text.contains("ABORTED"));

        let j = r.to_json();
        assert_eq!(j["ok"], 1001);
        assert_eq!(j["errors"]["UNAVAILABLE"], 3);
        assert_eq!(j["latency_us"]["p99"], 991);
        assert_eq!(j["rate"], 1000.0);
        assert_eq!(j["transport"], "grpc");
        assert!(j["aborted"].is_null());

        let header: Vec<&str> = LoadReport::csv_header().split(',').collect();
        let row = r.csv_row();
        let cells: Vec<&str> = row.split(',').collect();
        assert_eq!(header.len(), cells.len(), "{row}");
        assert_eq!(cells[1], "grpc");
        assert_eq!(cells[2], "/a.B/C (2 messages);/a.B/D (1 message)");
        assert_eq!(cells[8], "4");
        assert_eq!(cells[10], "5");
        assert_eq!(cells[13], "501");
        assert_eq!(csv_field("a,\"b\""), "\"a,\"\"b\"\"\"");
    }

    #[test]
    fn slot_histograms_grow_and_merge() {
        let mut slot = slot_histogram().expect("histogram");
        record_latency(&mut slot, Duration::from_nanos(300)); // below 1 µs: 1
        record_latency(&mut slot, Duration::from_micros(75));
        record_latency(&mut slot, Duration::from_secs(5));
        record_latency(&mut slot, Duration::from_secs(3600)); // capped at 60 s
        let mut all = new_histogram().expect("histogram");
        all.add(&slot).expect("same range");
        assert_eq!(all.len(), 4);
        assert_eq!(all.min(), 1);
        assert_eq!(all.value_at_quantile(0.5), 75);
        assert!(all.equivalent(all.value_at_quantile(0.75), 5_000_000));
        assert!(all.equivalent(all.max(), MAX_LATENCY_US));
    }

    #[test]
    fn open_loop_schedule() {
        assert_eq!(schedule_offset(0, 1000.0), Duration::ZERO);
        assert_eq!(schedule_offset(3, 1000.0), Duration::from_millis(3));
        assert_eq!(schedule_offset(5, 2.0), Duration::from_millis(2500));
        assert_eq!(schedule_offset(1, 3.0).as_nanos(), 333_333_333);

        assert_eq!(calls_before(Duration::ZERO, 1000.0), 0);
        assert_eq!(calls_before(Duration::from_secs(1), 1000.0), 1000);
        assert_eq!(calls_before(Duration::from_micros(500), 1000.0), 1); // call 0 at t=0
        assert_eq!(calls_before(Duration::from_millis(300), 10.0), 3); // not 4
        assert_eq!(calls_before(Duration::from_secs(2), 0.5), 1);

        // 1 s warm-up then 10 s at 100/s: tickets 0..100 warm, 100..1100 measured.
        let s = Duration::from_secs;
        assert_eq!(open_tickets(100.0, s(1), s(10), None), (100, 1100));
        // --requests wins over the duration.
        assert_eq!(open_tickets(100.0, s(1), s(10), Some(50)), (100, 150));
        assert_eq!(open_tickets(100.0, s(0), s(10), Some(7)), (0, 7));
        // Every measured call is due inside the window.
        let (warm, limit) = open_tickets(7.0, s(2), s(3), None);
        assert!(schedule_offset(warm, 7.0) >= s(2) && schedule_offset(warm - 1, 7.0) < s(2));
        assert!(schedule_offset(limit - 1, 7.0) < s(5) && schedule_offset(limit, 7.0) >= s(5));
    }

    #[test]
    fn metadata_options() {
        let md = parse_metadata(&["x-user=alice=1".into(), "trace-bin=q6ur".into()])
            .expect("valid metadata");
        assert_eq!(md.get("x-user"), Some("alice=1"));
        assert_eq!(md.get_bin("trace-bin"), Some(&[0xab, 0xab, 0xab][..]));
        assert!(parse_metadata(&["novalue".into()]).is_err());
        assert!(parse_metadata(&["grpc-status=0".into()]).is_err());
        assert!(parse_metadata(&["k-bin=%%%".into()]).is_err());
    }

    // End to end against a server in this process: three methods of gRPC's
    // interop service (their names and input types), one of them failing
    // every call with UNIMPLEMENTED.

    const PROTO: &str = r#"
        syntax = "proto3";
        package grpc.testing;
        message Empty {}
        message SimpleRequest { int32 response_size = 2; }
        service TestService {
          rpc EmptyCall(Empty) returns (Empty);
          rpc UnaryCall(SimpleRequest) returns (Empty);
          rpc UnimplementedCall(Empty) returns (Empty);
        }
    "#;

    struct TestService {
        schema: Arc<Schema>,
        unimplemented: u32,
    }

    impl protoplane_grpc::Service for TestService {
        fn schema(&self) -> &Arc<Schema> {
            &self.schema
        }

        fn name(&self) -> &str {
            "grpc.testing.TestService"
        }

        fn call(
            self: Arc<Self>,
            method: u32,
            mut req: protoplane_grpc::Request<protoplane_grpc::Streaming>,
            mut out: protoplane_grpc::Responder,
        ) -> protoplane_grpc::BoxFuture<'static, Result<Metadata, Status>> {
            Box::pin(async move {
                req.message.single().await?;
                if method == self.unimplemented {
                    return Err(Status::new(Code::Unimplemented, "not here"));
                }
                let b = protoplane_wire::Builder::new(self.schema.tables(), out.output_type())?;
                out.send(b.finish()).await?;
                Ok(Metadata::new())
            })
        }
    }

    /// The service over gRPC and over the lean transport:
    /// `(grpc address, lean address, schema)`.
    async fn interop_server() -> (String, String, Arc<Schema>) {
        let src = [protoplane_schema::ProtoSource { name: "t.proto", text: PROTO }];
        let schema = Arc::new(Schema::from_proto_sources(&src, &["t.proto"]).expect("schema"));
        let unimplemented =
            schema.find("grpc.testing.TestService", "UnimplementedCall").expect("method");
        let svc = Arc::new(TestService { schema: schema.clone(), unimplemented });
        let router = Arc::new(
            protoplane_rpc::Router::new(protoplane_rpc::ServerOptions::default()).add_service(svc),
        );
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let lean = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let grpc_addr = grpc.local_addr().expect("address").to_string();
        let lean_addr = lean.local_addr().expect("address").to_string();
        tokio::spawn(router.clone().serve(grpc));
        tokio::spawn(protoplane_rpc::lean::server::serve_tcp(router, lean));
        (grpc_addr, lean_addr, schema)
    }

    fn unary_calls(schema: &Schema) -> Vec<(String, Vec<Bytes>)> {
        let (path, input) =
            resolve_method(schema, "grpc.testing.TestService.UnaryCall").expect("UnaryCall");
        // SimpleRequest{response_size: 10}, SimpleRequest{}.
        let msgs = vec![Bytes::from_static(b"\x10\x0a"), Bytes::new()];
        check_messages(schema, input, &msgs).expect("valid requests");
        let (empty, _) = resolve_method(schema, "/grpc.testing.TestService/EmptyCall").expect("");
        vec![(path, msgs), (empty, vec![Bytes::new()])]
    }

    #[tokio::test]
    async fn closed_loop_counts_requests() {
        let (target, _, schema) = interop_server().await;
        let mut cfg = LoadConfig::new(target, unary_calls(&schema));
        cfg.requests = Some(300);
        cfg.concurrency = 4;
        cfg.connections = 2;
        cfg.timeout = Some(Duration::from_secs(5));
        let r = run(&cfg).await.expect("run");
        assert_eq!((r.ok, r.error_total()), (300, 0), "{}", r.render_text());
        assert_eq!(r.histogram.len(), 300);
        assert!(r.seconds > 0.0 && r.qps > 0.0 && r.min >= 1 && r.p50 <= r.max);
    }

    #[tokio::test]
    async fn open_loop_keeps_the_rate_and_counts_errors() {
        let (target, _, schema) = interop_server().await;
        let (bad, _) =
            resolve_method(&schema, "grpc.testing.TestService/UnimplementedCall").expect("");
        let mut calls = unary_calls(&schema);
        calls.push((bad, vec![Bytes::new()]));
        let mut cfg = LoadConfig::new(target, calls);
        cfg.rate = Some(2000.0);
        cfg.requests = Some(300);
        cfg.warmup = Duration::from_millis(50);
        cfg.concurrency = 16;
        let r = run(&cfg).await.expect("run");
        // Four pairs in turn, one of them unimplemented.
        assert_eq!(r.ok + r.error_total(), 300, "{}", r.render_text());
        assert_eq!(r.errors, vec![("UNIMPLEMENTED".to_string(), 75)]);
        // 300 calls at 2000/s take 150 ms.
        assert!(r.seconds > 0.14 && r.seconds < 1.0, "{}", r.seconds);
    }

    #[tokio::test]
    async fn lean_transport() {
        let (_, target, schema) = interop_server().await;
        let mut cfg = LoadConfig::new(target.clone(), unary_calls(&schema));
        cfg.transport = Transport::Lean;
        cfg.requests = Some(200);
        cfg.concurrency = 8;
        let r = run(&cfg).await.expect("run");
        assert_eq!((r.ok, r.error_total()), (200, 0), "{}", r.render_text());
        assert!(r.render_text().contains("1 lean connection"));

        cfg.calls = vec![("/no.Such/Method".into(), vec![Bytes::new()])];
        let err = run(&cfg).await.expect_err("unknown method");
        assert_eq!(
            err,
            Error::NotServed(format!("{target}: the server does not serve /no.Such/Method"))
        );
    }

    #[tokio::test]
    async fn refused_connection_is_a_clear_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address").to_string();
        drop(listener);
        let cfg = LoadConfig::new(addr.clone(), vec![("/a.B/C".into(), vec![Bytes::new()])]);
        let err = run(&cfg).await.expect_err("nobody listens");
        assert!(
            matches!(&err, Error::Connect(s) if s.starts_with(&format!("connection 1 to {addr}: "))),
            "{err}"
        );
    }
}
