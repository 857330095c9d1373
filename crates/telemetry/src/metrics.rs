//! OTLP/gRPC export of protoplane's metrics: the same registry the
//! Prometheus endpoint serves (`protoplane_rpc::metrics::Metrics`: gRFC
//! A66's call metrics and whatever a process adds, the engine's own
//! families for one), pushed every interval to
//! `/opentelemetry.proto.collector.metrics.v1.MetricsService/Export`.
//!
//! Families become OTLP metrics: counters cumulative monotonic sums,
//! gauges gauges, histograms explicit-bucket histograms (Prometheus's
//! cumulative buckets turned back into per-bucket counts). A66's families
//! get A66's instrument names (`grpc.server.call.duration`, unit `s`) and
//! attribute names (`grpc.method`, `grpc.status`, `grpc.target`); other
//! families keep their names, without `_total`, with the unit their
//! suffix gives (`_seconds`: `s`, `_bytes`: `By`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use protoplane_rpc::metrics::exposition::{Family, Kind};
use protoplane_rpc::metrics::Metrics;
use protoplane_wire::{BuildError, EncodeOptions, Encoder, Source};

use crate::otlp::Link;
use crate::pb::opentelemetry::proto::collector::metrics::v1 as collector;
use crate::pb::opentelemetry::proto::common::v1 as common;

/// The method OTLP/gRPC exports metrics to.
pub const EXPORT_PATH: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";

/// How often metrics are pushed unless `OTEL_METRIC_EXPORT_INTERVAL`
/// (milliseconds) says otherwise: OpenTelemetry's default, 60 s.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

/// A66's Prometheus names and the instruments they stand for.
const A66: [(&str, &str, &str); 9] = [
    ("grpc_server_call_started_total", "grpc.server.call.started", "{call}"),
    ("grpc_server_call_duration_seconds", "grpc.server.call.duration", "s"),
    (
        "grpc_server_call_sent_total_compressed_message_size_bytes",
        "grpc.server.call.sent_total_compressed_message_size",
        "By",
    ),
    (
        "grpc_server_call_rcvd_total_compressed_message_size_bytes",
        "grpc.server.call.rcvd_total_compressed_message_size",
        "By",
    ),
    ("grpc_client_attempt_started_total", "grpc.client.attempt.started", "{attempt}"),
    ("grpc_client_attempt_duration_seconds", "grpc.client.attempt.duration", "s"),
    (
        "grpc_client_attempt_sent_total_compressed_message_size_bytes",
        "grpc.client.attempt.sent_total_compressed_message_size",
        "By",
    ),
    (
        "grpc_client_attempt_rcvd_total_compressed_message_size_bytes",
        "grpc.client.attempt.rcvd_total_compressed_message_size",
        "By",
    ),
    ("grpc_client_call_duration_seconds", "grpc.client.call.duration", "s"),
];

/// The OTLP name and unit of a family.
fn instrument(name: &str) -> (String, &'static str) {
    if let Some((_, otel, unit)) = A66.iter().find(|(p, _, _)| *p == name) {
        return (otel.to_string(), unit);
    }
    let base = name.strip_suffix("_total").unwrap_or(name);
    let unit = if base.ends_with("_seconds") {
        "s"
    } else if base.ends_with("_bytes") {
        "By"
    } else {
        ""
    };
    (base.to_string(), unit)
}

/// An attribute's OTLP name (A66's labels are dotted there).
fn attribute(label: &str) -> &str {
    match label {
        "grpc_method" => "grpc.method",
        "grpc_status" => "grpc.status",
        "grpc_target" => "grpc.target",
        other => other,
    }
}

/// One histogram's samples gathered: bounds and cumulative counts from
/// `_bucket`, then `_sum` and `_count`.
#[derive(Default)]
struct Gathered {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

/// The OTLP request for `families`, measured at `now` since `start`.
pub fn encode_request(
    service_name: &str,
    families: &[Family],
    start: SystemTime,
    now: SystemTime,
) -> Result<Vec<u8>, String> {
    let mut builder = collector::ExportMetricsServiceRequest::builder();
    build(&mut builder, service_name, families, nanos(start), nanos(now))
        .map_err(|e| e.to_string())?;
    let block = builder.finish();
    let mut enc = Encoder::new();
    let wire = collector::ExportMetricsServiceRequest::encode(
        &mut enc,
        Source::owned(block.as_bytes()),
        &EncodeOptions::default(),
    )
    .map_err(|e| e.to_string())?;
    Ok(wire.to_vec())
}

fn build(
    builder: &mut protoplane_wire::Builder<'static>,
    service_name: &str,
    families: &[Family],
    start: u64,
    now: u64,
) -> Result<(), BuildError> {
    let mut req = collector::ExportMetricsServiceRequestBuilder::root(builder);
    let mut rm = req.add_resource_metrics()?;
    {
        let mut r = rm.resource()?;
        let mut kv = r.add_attributes()?;
        kv.set_key("service.name")?;
        kv.value()?.set_string_value(service_name)?;
    }
    let mut sm = rm.add_scope_metrics()?;
    {
        let mut scope = sm.scope()?;
        scope.set_name("protoplane")?;
        scope.set_version(env!("CARGO_PKG_VERSION"))?;
    }
    for f in families {
        if f.samples.is_empty() {
            continue;
        }
        let (name, unit) = instrument(&f.name);
        let mut m = sm.add_metrics()?;
        m.set_name(&name)?;
        m.set_description(&f.help)?;
        m.set_unit(unit)?;
        match f.kind {
            Kind::Counter => {
                let mut sum = m.sum()?;
                sum.set_aggregation_temporality(2);
                sum.set_is_monotonic(true);
                for (_, labels, value) in &f.samples {
                    let mut p = sum.add_data_points()?;
                    for (k, v) in labels {
                        attribute_kv(&mut p.add_attributes()?, k, v)?;
                    }
                    p.set_start_time_unix_nano(start);
                    p.set_time_unix_nano(now);
                    p.set_as_double(*value);
                }
            }
            Kind::Gauge => {
                let mut gauge = m.gauge()?;
                for (_, labels, value) in &f.samples {
                    let mut p = gauge.add_data_points()?;
                    for (k, v) in labels {
                        attribute_kv(&mut p.add_attributes()?, k, v)?;
                    }
                    p.set_time_unix_nano(now);
                    p.set_as_double(*value);
                }
            }
            Kind::Histogram => {
                // Per label set (without `le`), in the order first seen.
                let mut order: Vec<Vec<(String, String)>> = Vec::new();
                let mut by: BTreeMap<Vec<(String, String)>, Gathered> = BTreeMap::new();
                for (sample, labels, value) in &f.samples {
                    let key: Vec<(String, String)> =
                        labels.iter().filter(|(k, _)| k != "le").cloned().collect();
                    if !by.contains_key(&key) {
                        order.push(key.clone());
                    }
                    let g = by.entry(key).or_default();
                    if sample.ends_with("_bucket") {
                        let le = labels.iter().find(|(k, _)| k == "le").map(|(_, v)| v.as_str());
                        let bound = match le {
                            Some("+Inf") => f64::INFINITY,
                            Some(v) => v.parse().unwrap_or(f64::INFINITY),
                            None => continue,
                        };
                        g.buckets.push((bound, *value));
                    } else if sample.ends_with("_sum") {
                        g.sum = *value;
                    } else if sample.ends_with("_count") {
                        g.count = *value;
                    }
                }
                let mut h = m.histogram()?;
                h.set_aggregation_temporality(2);
                for key in order {
                    let Some(g) = by.get_mut(&key) else { continue };
                    g.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
                    let mut p = h.add_data_points()?;
                    for (k, v) in &key {
                        attribute_kv(&mut p.add_attributes()?, k, v)?;
                    }
                    p.set_start_time_unix_nano(start);
                    p.set_time_unix_nano(now);
                    p.set_count(g.count as u64);
                    p.set_sum(g.sum);
                    let mut below = 0.0;
                    for (bound, cumulative) in &g.buckets {
                        if bound.is_finite() {
                            p.push_explicit_bounds(*bound)?;
                        }
                        p.push_bucket_counts((cumulative - below).max(0.0) as u64)?;
                        below = *cumulative;
                    }
                    if g.buckets.last().is_none_or(|(b, _)| b.is_finite()) {
                        // No +Inf bucket written: the rest goes above the last bound.
                        p.push_bucket_counts((g.count - below).max(0.0) as u64)?;
                    }
                }
            }
        }
    }
    Ok(())
}

fn attribute_kv(
    kv: &mut common::KeyValueBuilder<'_, '_>,
    label: &str,
    value: &str,
) -> Result<(), BuildError> {
    kv.set_key(attribute(label))?;
    kv.value()?.set_string_value(value)?;
    Ok(())
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// Pushes a registry's metrics to an OTLP endpoint every interval until
/// dropped; dropping it pushes once more.
#[derive(Debug)]
pub struct MetricsExporter {
    link: Link,
    metrics: Arc<Metrics>,
    service_name: String,
    start: SystemTime,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsExporter {
    /// Starts pushing `metrics` to `endpoint` every `interval`.
    pub fn start(
        endpoint: &str,
        metrics: Arc<Metrics>,
        service_name: &str,
        interval: Duration,
    ) -> Result<MetricsExporter, String> {
        let link = Link::new(endpoint)?;
        let start = SystemTime::now();
        let (l, m, name) = (link.clone(), metrics.clone(), service_name.to_string());
        let task = link.runtime().spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Err(why) = push(&l, &m, &name, start).await {
                    tracing::warn!(target: "protoplane_telemetry::otlp", "{why}");
                }
            }
        });
        Ok(MetricsExporter { link, metrics, service_name: service_name.to_string(), start, task })
    }

    /// The push interval OpenTelemetry's environment asks for
    /// (`OTEL_METRIC_EXPORT_INTERVAL`, milliseconds), or [`DEFAULT_INTERVAL`].
    pub fn interval_from_env() -> Duration {
        std::env::var("OTEL_METRIC_EXPORT_INTERVAL")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|ms| *ms > 0)
            .map_or(DEFAULT_INTERVAL, Duration::from_millis)
    }

    /// Pushes once now, waiting up to `within` for the collector.
    pub fn flush(&self, within: Duration) -> Result<(), String> {
        let (l, m, name, start) =
            (self.link.clone(), self.metrics.clone(), self.service_name.clone(), self.start);
        let (tx, rx) = std::sync::mpsc::channel();
        self.link.runtime().spawn(async move {
            let _ = tx.send(push(&l, &m, &name, start).await);
        });
        rx.recv_timeout(within).map_err(|_| "metrics export: timed out".to_string())?
    }
}

impl Drop for MetricsExporter {
    fn drop(&mut self) {
        self.task.abort();
        if let Err(why) = self.flush(Duration::from_secs(3)) {
            tracing::warn!(target: "protoplane_telemetry::otlp", "at exit: {why}");
        }
    }
}

async fn push(link: &Link, metrics: &Metrics, name: &str, start: SystemTime) -> Result<(), String> {
    let wire = encode_request(name, &metrics.families(), start, SystemTime::now())?;
    link.send(EXPORT_PATH, wire)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|why| format!("OTLP metrics export to {} failed: {why}", link.endpoint))
}

#[cfg(test)]
mod tests {
    use super::*;
    use protoplane_wire::DecodeOptions;

    #[test]
    fn families_become_otlp_metrics_with_a66_names() {
        let m = Metrics::new();
        let other = m.server_method("/pkg.Svc/Put");
        other.start();
        let calls = m.server_method("/pkg.Svc/Get");
        for _ in 0..3 {
            calls.start();
            calls.end(protoplane_grpc::Code::Ok, Duration::from_micros(150), Default::default());
        }
        let t0 = UNIX_EPOCH + Duration::from_secs(1_000);
        let t1 = t0 + Duration::from_secs(5);
        let wire = encode_request("svc", &m.families(), t0, t1).expect("encode");
        let block =
            collector::ExportMetricsServiceRequest::decode(&wire, &DecodeOptions::default())
                .expect("decodes");
        let req = collector::ExportMetricsServiceRequestView::from_block(block.as_bytes(), &wire)
            .expect("view");
        let rm = req.resource_metrics().get(0).expect("resource metrics");
        let metrics: Vec<_> = rm.scope_metrics().get(0).expect("scope").metrics().iter().collect();
        let named = |n: &str| metrics.iter().find(|m| m.name() == n).copied();
        let started = named("grpc.server.call.started").expect("started");
        let sum = started.sum().expect("a sum");
        assert!(sum.is_monotonic());
        assert_eq!(sum.data_points().len(), 2, "a point per method");
        let p = sum
            .data_points()
            .iter()
            .find(|p| {
                p.attributes()
                    .iter()
                    .any(|a| a.value().map(|v| v.string_value()) == Some("pkg.Svc/Get"))
            })
            .expect("Get's point");
        assert_eq!(p.as_double(), 3.0);
        assert_eq!((p.start_time_unix_nano(), p.time_unix_nano()), (nanos(t0), nanos(t1)));
        let attr = p.attributes().get(0).expect("an attribute");
        assert_eq!(
            (attr.key(), attr.value().map(|v| v.string_value())),
            ("grpc.method", Some("pkg.Svc/Get"))
        );
        let duration = named("grpc.server.call.duration").expect("duration");
        assert_eq!(duration.unit(), "s");
        let h = duration.histogram().expect("a histogram");
        let p = h.data_points().get(0).expect("a point");
        assert_eq!(p.count(), 3);
        assert!((p.sum() - 3.0 * 150e-6).abs() < 1e-9, "{}", p.sum());
        let counts: Vec<u64> = p.bucket_counts().iter().collect();
        let bounds: Vec<f64> = p.explicit_bounds().iter().collect();
        assert_eq!(counts.len(), bounds.len() + 1);
        assert_eq!(counts.iter().sum::<u64>(), 3);
        // The three calls sit in the bucket whose upper bound is the first
        // at or above 150 µs.
        let i = bounds.iter().position(|b| *b >= 150e-6).expect("a bound above");
        assert_eq!(counts[i], 3, "{bounds:?} {counts:?}");
    }
}
