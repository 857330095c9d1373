//! The standard health service (`grpc.health.v1.Health`): `Check` answers
//! the current status of the server (empty name) or of one service;
//! `Watch` streams it, first the current value, then every change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use protoplane_schema::ProtoSource;
use protoplane_wire::{Builder, Value};
use tokio::sync::watch;

use protoplane_grpc::call::{BoxFuture, Request, Responder, Service, Streaming};
use protoplane_grpc::metadata::Metadata;
use protoplane_grpc::schema::Schema;
use protoplane_grpc::status::{Code, Status};

const PROTO: &str = include_str!("../../../protos/grpc/health.proto");

/// A serving status (`HealthCheckResponse.ServingStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServingStatus {
    /// Status not known.
    Unknown = 0,
    /// Serving.
    Serving = 1,
    /// Not serving.
    NotServing = 2,
    /// (Watch only) no such service.
    ServiceUnknown = 3,
}

/// The health service and the handle to update it.
#[derive(Debug)]
pub struct Health {
    schema: Arc<Schema>,
    statuses: Mutex<HashMap<String, watch::Sender<ServingStatus>>>,
    check: u32,
    /// Shut down: statuses stay NOT_SERVING.
    shut: std::sync::atomic::AtomicBool,
}

impl Health {
    /// A health service reporting SERVING for the server and for each of
    /// `services`.
    pub fn new(services: &[String]) -> Result<Arc<Health>, Status> {
        let schema = Schema::from_proto_sources(
            &[ProtoSource { name: "grpc/health.proto", text: PROTO }],
            &["grpc/health.proto"],
        )
        .map_err(|e| Status::new(Code::Internal, e.to_string()))?;
        let check = schema.find("grpc.health.v1.Health", "Check").unwrap_or(0);
        let h = Health {
            schema: Arc::new(schema),
            statuses: Mutex::new(HashMap::new()),
            check,
            shut: std::sync::atomic::AtomicBool::new(false),
        };
        h.set("", ServingStatus::Serving);
        for s in services {
            h.set(s, ServingStatus::Serving);
        }
        h.set("grpc.health.v1.Health", ServingStatus::Serving);
        Ok(Arc::new(h))
    }

    /// Sets the status of `service` ("" for the whole server); watchers are
    /// told. Ignored after [`Health::shutdown`].
    pub fn set(&self, service: &str, status: ServingStatus) {
        let mut map = self.statuses.lock().unwrap_or_else(|p| p.into_inner());
        if self.shut.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        match map.get(service) {
            Some(tx) => {
                tx.send_replace(status);
            }
            None => {
                map.insert(service.to_string(), watch::channel(status).0);
            }
        }
    }

    /// The server is going away: every status turns NOT_SERVING (watchers
    /// are told) and stays so; later [`Health::set`] calls are ignored.
    pub fn shutdown(&self) {
        let map = self.statuses.lock().unwrap_or_else(|p| p.into_inner());
        self.shut.store(true, std::sync::atomic::Ordering::SeqCst);
        for tx in map.values() {
            tx.send_replace(ServingStatus::NotServing);
        }
    }

    /// The status of `service`, if it has one.
    pub fn status(&self, service: &str) -> Option<ServingStatus> {
        let map = self.statuses.lock().unwrap_or_else(|p| p.into_inner());
        map.get(service).map(|tx| *tx.borrow())
    }

    fn subscribe(&self, service: &str) -> Option<watch::Receiver<ServingStatus>> {
        let map = self.statuses.lock().unwrap_or_else(|p| p.into_inner());
        map.get(service).map(|tx| tx.subscribe())
    }

    fn response(
        &self,
        out: &Responder,
        status: ServingStatus,
    ) -> Result<protoplane_wire::Block, Status> {
        let mut b = Builder::new(self.schema.tables(), out.output_type())?;
        let root = b.root();
        b.set(root, 1, Value::Enum(status as i32))?;
        Ok(b.finish())
    }

    async fn run(
        self: Arc<Self>,
        method: u32,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> Result<Metadata, Status> {
        let m = req.message.single().await?;
        let v = m.view(self.schema.tables())?;
        let name = v.by_number(1)?.and_then(|x| x.as_str()).unwrap_or("").to_string();
        let rx = self.subscribe(&name);
        if method == self.check {
            let Some(rx) = rx else {
                return Err(Status::new(Code::NotFound, format!("unknown service {name}")));
            };
            let s = *rx.borrow();
            out.send(self.response(&out, s)?).await?;
            return Ok(Metadata::new());
        }
        let Some(mut rx) = rx else {
            out.send(self.response(&out, ServingStatus::ServiceUnknown)?).await?;
            // An unknown service may never appear; the watch ends when the
            // client gives up.
            std::future::pending::<()>().await;
            return Ok(Metadata::new());
        };
        loop {
            let s = *rx.borrow_and_update();
            out.send(self.response(&out, s)?).await?;
            if rx.changed().await.is_err() {
                return Ok(Metadata::new());
            }
        }
    }
}

impl Service for Health {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "grpc.health.v1.Health"
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        request: Request<Streaming>,
        responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(self.run(method, request, responder))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shutdown_turns_everything_not_serving_for_good() {
        let h = Health::new(&["pkg.A".to_string()]).expect("health");
        let watch = h.subscribe("pkg.A").expect("a status");
        assert_eq!(h.status(""), Some(ServingStatus::Serving));
        h.shutdown();
        for s in ["", "pkg.A", "grpc.health.v1.Health"] {
            assert_eq!(h.status(s), Some(ServingStatus::NotServing), "{s:?}");
        }
        assert!(watch.has_changed().expect("open"), "watchers are told");
        h.set("pkg.A", ServingStatus::Serving);
        h.set("pkg.B", ServingStatus::Serving);
        assert_eq!(h.status("pkg.A"), Some(ServingStatus::NotServing), "ignored after shutdown");
        assert_eq!(h.status("pkg.B"), None);
    }
}
