//! ORCA load reports (gRFC A51): what a backend tells its clients about
//! its load, for weighted round robin (gRFC A58) to weigh it by.
//!
//! - [`LoadReport`]: the `xds.data.orca.v3.OrcaLoadReport` message, with its
//!   own encoder and decoder (a client decodes one per call from the
//!   `endpoint-load-metrics-bin` trailer, so it takes no schema tables and
//!   allocates only for named metrics);
//! - [`Recorder`]: the server's current figures (set by the application,
//!   or measured: `protoplane serve --orca` sets its process's CPU
//!   utilization and rates each second), with [`Recorder::interceptor`]
//!   adding the report to every call's trailers and counting the calls
//!   and errors the rates come from;
//! - [`OpenRca`], `xds.service.orca.v3.OpenRcaService/StreamCoreMetrics`:
//!   the out-of-band stream: a report now and then every interval the
//!   client asks for (no shorter than the server's minimum, 30 s by
//!   default as in grpc-go, settable for tests).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use protoplane_schema::ProtoSource;
use tokio::sync::watch;

use protoplane_grpc::call::{BoxFuture, Request, Responder, Service, Streaming};
use protoplane_grpc::intercept::{CallEnd, Interceptor};
use protoplane_grpc::metadata::Metadata;
use protoplane_grpc::schema::Schema;
use protoplane_grpc::status::{Code, Status};

/// The trailer a per-call report travels in.
pub const TRAILER: &str = "endpoint-load-metrics-bin";

/// `xds.data.orca.v3.OrcaLoadReport`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadReport {
    pub cpu_utilization: f64,
    pub mem_utilization: f64,
    /// Requests per second.
    pub rps_fractional: f64,
    /// Errors per second.
    pub eps: f64,
    /// The application's own load measure (preferred by weighted round
    /// robin when above 0).
    pub application_utilization: f64,
    pub request_cost: Vec<(String, f64)>,
    pub utilization: Vec<(String, f64)>,
    pub named_metrics: Vec<(String, f64)>,
}

/// Why bytes are not a load report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportError(pub &'static str);

impl std::fmt::Display for ReportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ORCA load report: {}", self.0)
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_double(out: &mut Vec<u8>, field: u32, v: f64) {
    if v != 0.0 {
        put_varint(out, u64::from(field << 3 | 1));
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn put_map(out: &mut Vec<u8>, field: u32, entries: &[(String, f64)]) {
    for (k, v) in entries {
        let mut entry = Vec::with_capacity(k.len() + 12);
        put_varint(&mut entry, 0x0a);
        put_varint(&mut entry, k.len() as u64);
        entry.extend_from_slice(k.as_bytes());
        put_double(&mut entry, 2, *v);
        put_varint(out, u64::from(field << 3 | 2));
        put_varint(out, entry.len() as u64);
        out.extend_from_slice(&entry);
    }
}

/// A cursor over protobuf wire bytes.
struct Wire<'a>(&'a [u8]);

impl<'a> Wire<'a> {
    fn varint(&mut self) -> Result<u64, ReportError> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&b, rest) = self.0.split_first().ok_or(ReportError("truncated varint"))?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(ReportError("varint longer than 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ReportError> {
        if n > self.0.len() {
            return Err(ReportError("truncated field"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    fn double(&mut self) -> Result<f64, ReportError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(f64::from_le_bytes(a))
    }

    /// The next field's number and wire type, or `None` at the end.
    fn tag(&mut self) -> Result<Option<(u64, u8)>, ReportError> {
        if self.0.is_empty() {
            return Ok(None);
        }
        let t = self.varint()?;
        let field = t >> 3;
        if field == 0 || field > u64::from(u32::MAX >> 3) {
            return Err(ReportError("bad field number"));
        }
        Ok(Some((field, (t & 7) as u8)))
    }

    fn skip(&mut self, wire_type: u8) -> Result<(), ReportError> {
        match wire_type {
            0 => self.varint().map(drop),
            1 => self.take(8).map(drop),
            2 => {
                let n = self.varint()?;
                self.take(usize::try_from(n).map_err(|_| ReportError("length too large"))?)
                    .map(drop)
            }
            5 => self.take(4).map(drop),
            _ => Err(ReportError("unsupported wire type")),
        }
    }

    fn bytes(&mut self) -> Result<&'a [u8], ReportError> {
        let n = self.varint()?;
        self.take(usize::try_from(n).map_err(|_| ReportError("length too large"))?)
    }
}

/// One `map<string, double>` entry.
fn map_entry(b: &[u8]) -> Result<(String, f64), ReportError> {
    let mut w = Wire(b);
    let (mut key, mut value) = (String::new(), 0.0);
    while let Some((field, wt)) = w.tag()? {
        match (field, wt) {
            (1, 2) => {
                key = std::str::from_utf8(w.bytes()?)
                    .map_err(|_| ReportError("a metric name is not UTF-8"))?
                    .to_string();
            }
            (2, 1) => value = w.double()?,
            (1 | 2, _) => return Err(ReportError("a map entry field of the wrong wire type")),
            (_, t) => w.skip(t)?,
        }
    }
    Ok((key, value))
}

/// Sets `key` in a map, the last entry winning (proto3 map semantics).
fn set(map: &mut Vec<(String, f64)>, (key, value): (String, f64)) {
    match map.iter_mut().find(|(k, _)| *k == key) {
        Some(e) => e.1 = value,
        None => map.push((key, value)),
    }
}

impl LoadReport {
    /// The report's wire form (fields at their defaults left out).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(48);
        put_double(&mut out, 1, self.cpu_utilization);
        put_double(&mut out, 2, self.mem_utilization);
        put_map(&mut out, 4, &self.request_cost);
        put_map(&mut out, 5, &self.utilization);
        put_double(&mut out, 6, self.rps_fractional);
        put_double(&mut out, 7, self.eps);
        put_map(&mut out, 8, &self.named_metrics);
        put_double(&mut out, 9, self.application_utilization);
        out
    }

    /// Reads a report; unknown fields are skipped, a field of the wrong
    /// wire type or a truncated one is an error.
    pub fn decode(bytes: &[u8]) -> Result<LoadReport, ReportError> {
        let mut r = LoadReport::default();
        let mut w = Wire(bytes);
        let mut rps = None;
        while let Some((field, wt)) = w.tag()? {
            match (field, wt) {
                (1, 1) => r.cpu_utilization = w.double()?,
                (2, 1) => r.mem_utilization = w.double()?,
                (3, 0) => rps = Some(w.varint()?),
                (4, 2) => set(&mut r.request_cost, map_entry(w.bytes()?)?),
                (5, 2) => set(&mut r.utilization, map_entry(w.bytes()?)?),
                (6, 1) => r.rps_fractional = w.double()?,
                (7, 1) => r.eps = w.double()?,
                (8, 2) => set(&mut r.named_metrics, map_entry(w.bytes()?)?),
                (9, 1) => r.application_utilization = w.double()?,
                (1..=9, _) => return Err(ReportError("a field of the wrong wire type")),
                (_, t) => w.skip(t)?,
            }
        }
        if r.rps_fractional == 0.0 {
            // The older whole-number field, from older servers.
            r.rps_fractional = rps.unwrap_or(0) as f64;
        }
        Ok(r)
    }
}

/// A server's current load figures, and the counts its rates come from.
#[derive(Debug)]
pub struct Recorder {
    report: Mutex<LoadReport>,
    /// The current report encoded, handed to every call (and the stream).
    encoded: watch::Sender<Bytes>,
    calls: AtomicU64,
    errors: AtomicU64,
}

impl Recorder {
    /// A recorder with every figure at 0.
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            report: Mutex::new(LoadReport::default()),
            encoded: watch::Sender::new(Bytes::new()),
            calls: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        })
    }

    /// Changes the report (`f` sets figures on it).
    pub fn update(&self, f: impl FnOnce(&mut LoadReport)) {
        let mut r = self.report.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut r);
        self.encoded.send_replace(Bytes::from(r.encode()));
    }

    /// The report now.
    pub fn report(&self) -> LoadReport {
        self.report.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Calls ended and calls ended with an error, since the start (what
    /// [`Recorder::interceptor`] counted).
    pub fn counts(&self) -> (u64, u64) {
        (self.calls.load(Ordering::Relaxed), self.errors.load(Ordering::Relaxed))
    }

    /// An interceptor that counts every call and adds the current report
    /// to its trailers (OK or not).
    pub fn interceptor(self: &Arc<Self>) -> PerCall {
        PerCall(self.clone())
    }
}

/// Per-call reporting ([`Recorder::interceptor`]).
#[derive(Debug)]
pub struct PerCall(Arc<Recorder>);

impl Interceptor for PerCall {
    fn after(&self, call: &mut CallEnd<'_>) {
        self.0.calls.fetch_add(1, Ordering::Relaxed);
        let report = self.0.encoded.borrow().clone();
        let trailers = match call.outcome {
            Ok(md) => md,
            Err(st) => {
                self.0.errors.fetch_add(1, Ordering::Relaxed);
                &mut st.metadata
            }
        };
        if !report.is_empty() {
            let _ = trailers.insert_bin(TRAILER, &report);
        }
    }
}

const SERVICE_PROTO: &str = include_str!("../../../protos/xds/service/orca/v3/orca.proto");
const REPORT_PROTO: &str = include_str!("../../../protos/xds/data/orca/v3/orca_load_report.proto");

/// The schema of the out-of-band service and its messages.
pub fn schema() -> Result<Schema, Status> {
    Schema::from_proto_sources(
        &[
            ProtoSource { name: "xds/service/orca/v3/orca.proto", text: SERVICE_PROTO },
            ProtoSource { name: "xds/data/orca/v3/orca_load_report.proto", text: REPORT_PROTO },
        ],
        &["xds/service/orca/v3/orca.proto"],
    )
    .map_err(|e| Status::new(Code::Internal, e.to_string()))
}

/// `xds.service.orca.v3.OpenRcaService`: reports out of band.
#[derive(Debug)]
pub struct OpenRca {
    schema: Arc<Schema>,
    recorder: Arc<Recorder>,
    min_interval: Duration,
}

impl OpenRca {
    /// The service over `recorder`, sending no more often than
    /// `min_interval` (gRPC's default is 30 s).
    pub fn new(recorder: Arc<Recorder>, min_interval: Duration) -> Result<Arc<OpenRca>, Status> {
        Ok(Arc::new(OpenRca { schema: Arc::new(schema()?), recorder, min_interval }))
    }

    async fn run(
        self: Arc<Self>,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> Result<Metadata, Status> {
        let m = req.message.single().await?;
        let v = m.view(self.schema.tables())?;
        let asked = match v.by_number(1)?.and_then(|d| d.as_message()) {
            Some(d) => {
                let secs = d.by_number(1)?.and_then(|x| x.as_i128()).unwrap_or(0);
                let nanos = d.by_number(2)?.and_then(|x| x.as_i128()).unwrap_or(0);
                Duration::from_secs(secs.clamp(0, 1 << 40) as u64)
                    + Duration::from_nanos(nanos.clamp(0, 999_999_999) as u64)
            }
            None => Duration::ZERO,
        };
        let every = asked.max(self.min_interval).max(Duration::from_millis(1));
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let report = Bytes::from(self.recorder.report().encode());
            out.send_encoded(report).await?;
        }
    }
}

impl Service for OpenRca {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "xds.service.orca.v3.OpenRcaService"
    }

    fn call(
        self: Arc<Self>,
        _method: u32,
        request: Request<Streaming>,
        responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(self.run(request, responder))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip_and_the_last_map_entry_wins() {
        let r = LoadReport {
            cpu_utilization: 0.5,
            application_utilization: 0.25,
            rps_fractional: 1000.0,
            eps: 2.5,
            named_metrics: vec![("queue".into(), 3.0)],
            ..LoadReport::default()
        };
        let bytes = r.encode();
        assert_eq!(LoadReport::decode(&bytes), Ok(r.clone()));
        // The same key twice: the second entry counts.
        let mut twice = bytes.clone();
        let again =
            LoadReport { named_metrics: vec![("queue".into(), 7.0)], ..LoadReport::default() };
        twice.extend_from_slice(&again.encode());
        let d = LoadReport::decode(&twice).expect("decodes");
        assert_eq!(d.named_metrics, vec![("queue".to_string(), 7.0)]);
        // The whole-number rps of older servers.
        assert_eq!(LoadReport::decode(&[0x18, 0x2a]).expect("rps").rps_fractional, 42.0);
    }

    #[test]
    fn bad_bytes_are_errors() {
        for (b, why) in [
            (&[0x09, 1, 2][..], "truncated"),
            (&[0x08, 1][..], "wrong wire type"),
            (&[0x42, 5, 0x0a, 9][..], "truncated"),
            (&[0x53][..], "unsupported wire type"),
            (&[0x80][..], "truncated varint"),
            (&[0x00][..], "bad field number"),
        ] {
            let e = LoadReport::decode(b).expect_err("bad");
            assert!(e.0.contains(why), "{b:?}: {e}");
        }
        assert!(
            LoadReport::decode(&[0xf8, 0x01, 0x05]).is_ok(),
            "an unknown varint field is skipped"
        );
    }
}
