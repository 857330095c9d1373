//! `protoplane-bench bench-echo`: the application of the split benchmark. Every
//! unary method of the given `.proto` files answers with a copy of its
//! request (same type), after a busy loop standing in for business logic.
//!
//! It runs either monolithic (its own gRPC and lean ports, like `protoplane
//! serve`) or split (`--attach PATH`, an application process of a running
//! engine): the same service value either way, which is the point of the
//! comparison.
//!
//! The response is *built*, not forwarded: the handler walks the request
//! through its view and sets every field on a builder, as a handler that
//! produces a response of that size would. Forwarding the request's bytes
//! would skip the encoder in monolithic mode and the application's
//! response chunk in split mode, and so measure less than a real call
//! costs. The copy is the same work in both modes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::{Router, ServerOptions};
use protoplane_wire::{BuildError, Builder, MessageBuilder, MessageView, Value};

#[derive(clap::Args, Debug)]
pub(crate) struct EchoArgs {
    /// .proto files declaring the services to answer (every unary method).
    #[arg(long = "proto", value_name = "FILE", required = true)]
    protos: Vec<PathBuf>,
    /// Import roots.
    #[arg(short = 'I', long = "include", value_name = "DIR")]
    includes: Vec<PathBuf>,
    /// Business logic: spin this many µs in every call before answering.
    #[arg(long, default_value_t = 0)]
    busy_us: u64,
    /// Attach to the engine at PATH (split) instead of listening.
    #[arg(long, value_name = "PATH")]
    attach: Option<PathBuf>,
    /// With --attach: spin this many µs after work before parking.
    #[arg(long, default_value_t = 20)]
    spin_us: u64,
    /// gRPC port when monolithic (0: pick one; printed).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Lean transport port when monolithic (0: pick one; printed).
    #[arg(long, default_value_t = 0)]
    lean_port: u16,
    /// Largest message each way when monolithic, bytes.
    #[arg(long, default_value_t = 4 << 20)]
    max_message: usize,
}

/// One service of the schema, answering every method with a copy of the
/// request.
struct Echo {
    schema: Arc<Schema>,
    name: String,
    busy: Duration,
}

impl Echo {
    async fn handle(
        self: Arc<Self>,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> Result<Metadata, Status> {
        let m = req.message.single().await?;
        let ts = self.schema.tables();
        let start = Instant::now();
        // Business logic: a CPU-bound stretch on the application's core,
        // as Split gRPC's knee experiment has it (a busy loop, not a sleep:
        // a sleeping handler would free the core it is meant to occupy).
        while start.elapsed() < self.busy {
            std::hint::spin_loop();
        }
        let view = m.view(ts)?;
        let mut b = Builder::new(ts, out.output_type())?;
        let root = b.root();
        copy(&view, &mut b, root).map_err(|e| Status::new(Code::Internal, e.to_string()))?;
        out.send(b.finish()).await?;
        Ok(Metadata::new())
    }
}

impl Service for Echo {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn call(
        self: Arc<Self>,
        _method: u32,
        request: Request<Streaming>,
        responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(self.handle(request, responder))
    }
}

/// Sets every present field of `v` on `at` (recursively), and its unknown
/// fields. Request and response share a type, so the field numbers agree.
fn copy(v: &MessageView<'_>, b: &mut Builder<'_>, at: MessageBuilder) -> Result<(), BuildError> {
    for f in v.fields() {
        if !v.has(f) {
            continue;
        }
        let bad = |_| BuildError::TypeMismatch(f.number);
        if f.is_repeated() {
            for item in v.repeated(f).map_err(bad)?.iter() {
                match item.map_err(bad)? {
                    Value::Message(sub) => {
                        let to = b.message(at, f.number)?;
                        copy(&sub, b, to)?;
                    }
                    x => b.push(at, f.number, x)?,
                }
            }
        } else {
            match v.get(f).map_err(bad)? {
                Some(Value::Message(sub)) => {
                    let to = b.message(at, f.number)?;
                    copy(&sub, b, to)?;
                }
                Some(x) => b.set(at, f.number, x)?,
                None => {}
            }
        }
    }
    let unknown = v.unknown_fields().map_err(|_| BuildError::TypeMismatch(0))?;
    if !unknown.is_empty() {
        b.push_unknown(at, unknown)?;
    }
    Ok(())
}

/// `protoplane-bench bench-echo`.
pub(crate) fn run(args: &EchoArgs) -> Result<(), String> {
    let schema = Arc::new(
        Schema::from_proto_files(&args.protos, &args.includes).map_err(|e| e.to_string())?,
    );
    let busy = Duration::from_micros(args.busy_us);
    let services: Vec<Arc<dyn Service>> = schema
        .services()
        .iter()
        .map(|name| {
            Arc::new(Echo { schema: schema.clone(), name: name.clone(), busy }) as Arc<dyn Service>
        })
        .collect();
    if services.is_empty() {
        return Err("the .proto files declare no service".into());
    }
    if let Some(path) = &args.attach {
        let mut app = protoplane_app::attach(path).spin(Duration::from_micros(args.spin_us));
        let mut services = services;
        let last = services.pop().ok_or("no service")?;
        for s in services {
            app = app.service(s);
        }
        return app.serve(last).map_err(|e| e.to_string());
    }
    let opts = ServerOptions {
        max_recv_message: args.max_message,
        max_send_message: args.max_message,
        ..ServerOptions::default()
    };
    let mut router = Router::new(opts);
    for s in services {
        router = router.add_service(s);
    }
    let rt = protoplane_load::host::runtime(1)?;
    rt.block_on(async move {
        let grpc = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
            .await
            .map_err(|e| format!("listen: {e}"))?;
        let lean = tokio::net::TcpListener::bind(("127.0.0.1", args.lean_port))
            .await
            .map_err(|e| format!("listen: {e}"))?;
        let router = Arc::new(router);
        println!("lean listening on {}", lean.local_addr().map_err(|e| e.to_string())?);
        println!("listening on {}", grpc.local_addr().map_err(|e| e.to_string())?);
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        tokio::spawn(protoplane_rpc::lean::server::serve_tcp(router.clone(), lean));
        router.serve(grpc).await.map_err(|e| format!("serve: {e}"))
    })
}
