//! Call metrics with gRFC A66's instruments, exposed as a Prometheus
//! scrape endpoint.
//!
//! gRFC A66 ("OpenTelemetry Metrics") fixes what a gRPC implementation
//! measures so one dashboard reads grpc-go, gRPC C++, Java and protoplane
//! alike. The server side records, per method (`grpc.method`, the full
//! name without the leading slash) and final status (`grpc.status`, the
//! code's name):
//!
//! | A66 instrument | Prometheus name |
//! |---|---|
//! | `grpc.server.call.started` | `grpc_server_call_started_total` |
//! | `grpc.server.call.duration` | `grpc_server_call_duration_seconds` |
//! | `grpc.server.call.sent_total_compressed_message_size` | `grpc_server_call_sent_total_compressed_message_size_bytes` |
//! | `grpc.server.call.rcvd_total_compressed_message_size` | `grpc_server_call_rcvd_total_compressed_message_size_bytes` |
//!
//! and the client side (a [`Channel`](crate::client::Channel) given
//! [`Channel::metrics`](crate::client::Channel::metrics)), per method and
//! `grpc.target`: `grpc.client.attempt.started`, `.attempt.duration`,
//! `.attempt.sent_total_compressed_message_size`,
//! `.attempt.rcvd_total_compressed_message_size` and `grpc.client.call.duration`
//! (one attempt per call: the channel does not retry). Histograms use
//! A66's bucket boundaries. The Prometheus names are the ones
//! OpenTelemetry's Prometheus exporter derives (dots to underscores, the
//! unit as a suffix, `_total` on counters), so queries written against
//! grpc-go's exporter work here unchanged.
//!
//! Why not the `opentelemetry` SDK on the call path: its instruments look
//! attributes up in a hash map per measurement (an allocation-free lookup,
//! but a lock and a hash of every attribute set per call). Here each
//! method's instruments are found once, when the router is built, and a
//! call records with a handful of relaxed atomic adds on counters that
//! belong to its method; a scrape sums them. The clock is read per turn
//! of a connection's task, not per call: a call starts when the turn that
//! reads its headers begins and ends when the turn that sends its status
//! does, so a burst of calls answered together costs two clock reads in
//! all (on this machine's clock a read costs ~50 ns, as much as the rest
//! of the recording). The numbers and their names are A66's either way;
//! what is not here is OTLP push, and the `h2`-crate server and the lean
//! transport record nothing (see the README).
//!
//! Other parts of a process add their own families through
//! [`Metrics::add_source`] (the split engine adds attachments, rings,
//! regions, copies and policy decisions). [`http::serve`] answers
//! `GET /metrics` with all of it in Prometheus's text format.

pub mod exposition;
pub mod http;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use protoplane_grpc::status::Code;

pub use exposition::{Exposition, Kind};

/// A66's latency bucket boundaries, in seconds.
pub const LATENCY_BOUNDS: [f64; 41] = [
    0.0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
    0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13, 0.16,
    0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0,
];

/// A66's size bucket boundaries, in bytes.
pub const SIZE_BOUNDS: [u64; 14] = [
    0, 1024, 2048, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864, 268435456,
    1073741824, 4294967296,
];

/// The latency boundaries in nanoseconds (what a call records: no float
/// arithmetic on the call path).
fn latency_bounds_ns() -> &'static [u64; 41] {
    static NS: OnceLock<[u64; 41]> = OnceLock::new();
    NS.get_or_init(|| LATENCY_BOUNDS.map(|s| (s * 1e9).round() as u64))
}

/// A histogram of `N` boundaries: `N + 1` counts (the last one above
/// every boundary) and the sum of what was recorded. Prometheus's buckets
/// are cumulative; these are not (a recording touches one count), the
/// scrape adds them up.
struct Histogram<const N: usize> {
    counts: [AtomicU64; N],
    over: AtomicU64,
    sum: AtomicU64,
}

impl<const N: usize> Histogram<N> {
    fn new() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            over: AtomicU64::new(0),
            sum: AtomicU64::new(0),
        }
    }

    /// Records `v` against `bounds` (a bucket holds values up to and
    /// including its boundary, Prometheus's `le`).
    fn record(&self, bounds: &[u64; N], v: u64) {
        let i = bounds.partition_point(|&b| b < v);
        match self.counts.get(i) {
            Some(c) => c.fetch_add(1, Relaxed),
            None => self.over.fetch_add(1, Relaxed),
        };
        self.sum.fetch_add(v, Relaxed);
    }

    /// Writes the `_bucket`, `_sum` and `_count` samples; `scale` turns
    /// recorded units into the exposed ones (nanoseconds to seconds).
    fn write(
        &self,
        out: &mut Exposition,
        name: &str,
        labels: &[(&str, &str)],
        bounds: &[f64],
        scale: f64,
    ) {
        let mut total = 0u64;
        let bucket = format!("{name}_bucket");
        let le_sample = |out: &mut Exposition, le: &str, n: u64| {
            let mut with_le: Vec<(&str, &str)> = labels.to_vec();
            with_le.push(("le", le));
            out.sample(&bucket, &with_le, n as f64);
        };
        for (c, b) in self.counts.iter().zip(bounds) {
            total += c.load(Relaxed);
            le_sample(out, &exposition::float(*b), total);
        }
        total += self.over.load(Relaxed);
        le_sample(out, "+Inf", total);
        out.sample(&format!("{name}_sum"), labels, self.sum.load(Relaxed) as f64 * scale);
        out.sample(&format!("{name}_count"), labels, total as f64);
    }

    fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum::<u64>() + self.over.load(Relaxed)
    }
}

/// What calls that ended with one status recorded.
struct Ended {
    duration: Histogram<41>,
    sent: Histogram<14>,
    rcvd: Histogram<14>,
}

impl Ended {
    fn new() -> Self {
        Ended { duration: Histogram::new(), sent: Histogram::new(), rcvd: Histogram::new() }
    }
}

/// Every status code, in wire order (`grpc.status` values).
const CODES: usize = 17;

/// One method's instruments (one per method per server, or per method
/// and target on a client). Allocated per status on first use: a method
/// that only ever answers OK carries one set of histograms.
pub struct MethodCalls {
    method: String,
    target: Option<String>,
    started: AtomicU64,
    ended: [OnceLock<Box<Ended>>; CODES],
    /// Client side: `grpc.client.call.duration`, by status (attempts and
    /// calls are one to one, but A66 has both).
    calls: [OnceLock<Box<Histogram<41>>>; CODES],
}

impl std::fmt::Debug for MethodCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MethodCalls").field("method", &self.method).finish_non_exhaustive()
    }
}

/// What one call measured, handed to [`MethodCalls::end`].
#[derive(Clone, Copy, Debug, Default)]
pub struct CallSizes {
    /// Message bytes sent, as on the wire (compressed ones compressed),
    /// without gRPC's 5-byte message prefix.
    pub sent: u64,
    /// Message bytes received, likewise.
    pub rcvd: u64,
}

impl MethodCalls {
    fn new(method: String, target: Option<String>) -> Self {
        MethodCalls {
            method,
            target,
            started: AtomicU64::new(0),
            ended: std::array::from_fn(|_| OnceLock::new()),
            calls: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// The method's name as exposed (`pkg.Service/Method`).
    pub fn method(&self) -> &str {
        &self.method
    }

    /// A call (or, on a client, an attempt) started.
    #[inline]
    pub fn start(&self) {
        self.started.fetch_add(1, Relaxed);
    }

    /// A call started with [`start`](Self::start) ended with `code` after
    /// `elapsed`, having sent and received `sizes`.
    pub fn end(&self, code: Code, elapsed: Duration, sizes: CallSizes) {
        let e = self.ended[code as usize % CODES].get_or_init(|| Box::new(Ended::new()));
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        e.duration.record(latency_bounds_ns(), ns);
        e.sent.record(&SIZE_BOUNDS, sizes.sent);
        e.rcvd.record(&SIZE_BOUNDS, sizes.rcvd);
        if self.target.is_some() {
            let c = self.calls[code as usize % CODES].get_or_init(|| Box::new(Histogram::new()));
            c.record(latency_bounds_ns(), ns);
        }
    }

    /// Calls started so far.
    pub fn started(&self) -> u64 {
        self.started.load(Relaxed)
    }

    /// Calls ended so far with `code`.
    pub fn ended(&self, code: Code) -> u64 {
        self.ended[code as usize % CODES].get().map_or(0, |e| e.duration.count())
    }
}

/// Where a scrape's samples come from: a process's call metrics and the
/// sources added to them.
pub struct Metrics {
    server: Mutex<Vec<Arc<MethodCalls>>>,
    client: Mutex<Vec<Arc<MethodCalls>>>,
    #[allow(clippy::type_complexity)]
    sources: Mutex<Vec<Box<dyn Fn(&mut Exposition) + Send + Sync>>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// The `grpc.method` value for a path: without its leading slash.
fn method_name(path: &str) -> String {
    path.strip_prefix('/').unwrap_or(path).to_string()
}

/// The name A66 gives a method a server does not serve.
pub const OTHER_METHOD: &str = "other";

impl Metrics {
    /// No instruments yet.
    pub fn new() -> Arc<Metrics> {
        Arc::new(Metrics {
            server: Mutex::new(Vec::new()),
            client: Mutex::new(Vec::new()),
            sources: Mutex::new(Vec::new()),
        })
    }

    /// The server instruments of the method at `path` (created on first
    /// request; a router asks once per method when it is built).
    pub fn server_method(&self, path: &str) -> Arc<MethodCalls> {
        let name = method_name(path);
        let mut all = self.server.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = all.iter().find(|m| m.method == name) {
            return m.clone();
        }
        let m = Arc::new(MethodCalls::new(name, None));
        all.push(m.clone());
        m
    }

    /// The client instruments of the method at `path` called on `target`
    /// (looked up per call: no allocation once they exist).
    pub fn client_method(&self, target: &str, path: &str) -> Arc<MethodCalls> {
        let name = path.strip_prefix('/').unwrap_or(path);
        let mut all = self.client.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) =
            all.iter().find(|m| m.method == name && m.target.as_deref() == Some(target))
        {
            return m.clone();
        }
        let m = Arc::new(MethodCalls::new(method_name(path), Some(target.to_string())));
        all.push(m.clone());
        m
    }

    /// Adds families of samples of its own to every scrape (called with
    /// the exposition being written; it should be quick).
    pub fn add_source(&self, source: impl Fn(&mut Exposition) + Send + Sync + 'static) {
        self.sources.lock().unwrap_or_else(|e| e.into_inner()).push(Box::new(source));
    }

    /// Everything, in Prometheus's text format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = Exposition::default();
        self.write(&mut out);
        out.finish()
    }

    /// Everything, as families of samples (for OTLP export).
    pub fn families(&self) -> Vec<exposition::Family> {
        let mut out = Exposition::capturing();
        self.write(&mut out);
        out.captured()
    }

    fn write(&self, out: &mut Exposition) {
        let mut server = self.server.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut client = self.client.lock().unwrap_or_else(|e| e.into_inner()).clone();
        server.sort_by(|a, b| a.method.cmp(&b.method));
        client.sort_by(|a, b| (&a.target, &a.method).cmp(&(&b.target, &b.method)));
        if !server.is_empty() {
            write_side(out, &server, "grpc_server_call", "call", "server")
        }
        if !client.is_empty() {
            write_side(out, &client, "grpc_client_attempt", "attempt", "client");
            out.family(
                "grpc_client_call_duration_seconds",
                Kind::Histogram,
                "Time a call took from the application's start of it to its status (A66 grpc.client.call.duration).",
            );
            for m in &client {
                for (i, h) in m.calls.iter().enumerate() {
                    let Some(h) = h.get() else { continue };
                    let status = Code::from_u32(i as u32).name();
                    let labels = [
                        ("grpc_method", m.method.as_str()),
                        ("grpc_target", m.target.as_deref().unwrap_or("")),
                        ("grpc_status", status),
                    ];
                    h.write(
                        out,
                        "grpc_client_call_duration_seconds",
                        &labels,
                        &LATENCY_BOUNDS,
                        1e-9,
                    );
                }
            }
        }
        for s in self.sources.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            s(out);
        }
    }
}

/// One side's A66 families (`prefix` is `grpc_server_call` or
/// `grpc_client_attempt`).
fn write_side(
    out: &mut Exposition,
    all: &[Arc<MethodCalls>],
    prefix: &str,
    unit: &str,
    side: &str,
) {
    let started = format!("{prefix}_started_total");
    out.family(
        &started,
        Kind::Counter,
        &format!("{side} {unit}s started (A66 grpc.{side}.{unit}.started)."),
    );
    for m in all {
        let mut labels = vec![("grpc_method", m.method.as_str())];
        if let Some(t) = &m.target {
            labels.push(("grpc_target", t.as_str()));
        }
        out.sample(&started, &labels, m.started() as f64);
    }
    let sizes = |what: &str| format!("{prefix}_{what}_total_compressed_message_size_bytes");
    type Pick = fn(&Ended) -> &dyn HistogramWrite;
    let families: [(String, String, Pick, bool); 3] = [
        (
            format!("{prefix}_duration_seconds"),
            format!("Time from the {side}'s first sight of a {unit} to its status (A66 grpc.{side}.{unit}.duration)."),
            |e| &e.duration,
            true,
        ),
        (
            sizes("sent"),
            format!("Message bytes sent per {unit}, as on the wire (A66 grpc.{side}.{unit}.sent_total_compressed_message_size)."),
            |e| &e.sent,
            false,
        ),
        (
            sizes("rcvd"),
            format!("Message bytes received per {unit}, as on the wire (A66 grpc.{side}.{unit}.rcvd_total_compressed_message_size)."),
            |e| &e.rcvd,
            false,
        ),
    ];
    for (name, help, pick, latency) in families {
        out.family(&name, Kind::Histogram, &help);
        for m in all {
            for (i, e) in m.ended.iter().enumerate() {
                let Some(e) = e.get() else { continue };
                let status = Code::from_u32(i as u32).name();
                let mut labels = vec![("grpc_method", m.method.as_str())];
                if let Some(t) = &m.target {
                    labels.push(("grpc_target", t.as_str()));
                }
                labels.push(("grpc_status", status));
                pick(e).write_to(out, &name, &labels, latency);
            }
        }
    }
}

/// A histogram of either kind, for [`write_side`]'s table.
trait HistogramWrite {
    fn write_to(&self, out: &mut Exposition, name: &str, labels: &[(&str, &str)], latency: bool);
}

impl<const N: usize> HistogramWrite for Histogram<N> {
    fn write_to(&self, out: &mut Exposition, name: &str, labels: &[(&str, &str)], latency: bool) {
        if latency {
            self.write(out, name, labels, &LATENCY_BOUNDS, 1e-9)
        } else {
            let bounds = SIZE_BOUNDS.map(|b| b as f64);
            self.write(out, name, labels, &bounds, 1.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_puts_a_value_on_its_boundary_in_that_bucket_and_adds_up() {
        let m = Metrics::new();
        let calls = m.server_method("/pkg.S/M");
        calls.start();
        calls.start();
        // 1 ms exactly: the `le="0.001"` bucket.
        calls.end(Code::Ok, Duration::from_millis(1), CallSizes { sent: 1024, rcvd: 0 });
        calls.end(Code::Unavailable, Duration::from_secs(200), CallSizes { sent: 5000, rcvd: 7 });
        let text = m.render();
        let has =
            |line: &str| assert!(text.lines().any(|l| l == line), "{line:?} missing in\n{text}");
        has(r#"grpc_server_call_started_total{grpc_method="pkg.S/M"} 2"#);
        has(
            r#"grpc_server_call_duration_seconds_bucket{grpc_method="pkg.S/M",grpc_status="OK",le="0.0008"} 0"#,
        );
        has(
            r#"grpc_server_call_duration_seconds_bucket{grpc_method="pkg.S/M",grpc_status="OK",le="0.001"} 1"#,
        );
        has(
            r#"grpc_server_call_duration_seconds_bucket{grpc_method="pkg.S/M",grpc_status="OK",le="+Inf"} 1"#,
        );
        has(
            r#"grpc_server_call_duration_seconds_sum{grpc_method="pkg.S/M",grpc_status="OK"} 0.001"#,
        );
        // Beyond the last boundary: only in +Inf.
        has(
            r#"grpc_server_call_duration_seconds_bucket{grpc_method="pkg.S/M",grpc_status="UNAVAILABLE",le="100"} 0"#,
        );
        has(
            r#"grpc_server_call_duration_seconds_bucket{grpc_method="pkg.S/M",grpc_status="UNAVAILABLE",le="+Inf"} 1"#,
        );
        has(
            r#"grpc_server_call_sent_total_compressed_message_size_bytes_bucket{grpc_method="pkg.S/M",grpc_status="OK",le="1024"} 1"#,
        );
        has(
            r#"grpc_server_call_sent_total_compressed_message_size_bytes_bucket{grpc_method="pkg.S/M",grpc_status="UNAVAILABLE",le="4096"} 0"#,
        );
        has(
            r#"grpc_server_call_sent_total_compressed_message_size_bytes_bucket{grpc_method="pkg.S/M",grpc_status="UNAVAILABLE",le="16384"} 1"#,
        );
        has(
            r#"grpc_server_call_rcvd_total_compressed_message_size_bytes_count{grpc_method="pkg.S/M",grpc_status="UNAVAILABLE"} 1"#,
        );
        assert_eq!(calls.ended(Code::Ok), 1);
        assert_eq!(calls.ended(Code::Cancelled), 0);
        // A status never seen has no series at all.
        assert!(!text.contains("CANCELLED"));
    }

    #[test]
    fn the_same_method_gets_the_same_instruments() {
        let m = Metrics::new();
        let a = m.server_method("/pkg.S/M");
        let b = m.server_method("/pkg.S/M");
        assert!(Arc::ptr_eq(&a, &b));
        let c = m.client_method("dns:x:1", "/pkg.S/M");
        let d = m.client_method("dns:y:1", "/pkg.S/M");
        assert!(!Arc::ptr_eq(&c, &d));
    }
}
