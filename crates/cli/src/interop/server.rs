//! `protoplane interop-server`: `grpc.testing.TestService` as the interop
//! test descriptions require it (payload sizes, echoed metadata, requested
//! statuses, response intervals, response compression).

use std::sync::Arc;
use std::time::Duration;

use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::{Router, ServerOptions};
use protoplane_wire::{Block, Builder, MessageView, Value};

use super::Types;

#[derive(clap::Args, Debug)]
pub(crate) struct ServerArgs {
    /// Port to listen on (0: pick a free one; the chosen port is printed).
    #[arg(long, default_value_t = 10000)]
    port: u16,
    /// Serve TLS with this PEM certificate chain (needs --tls_key).
    #[arg(long = "tls_cert", value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The certificate's PEM private key.
    #[arg(long = "tls_key", value_name = "PEM")]
    tls_key: Option<std::path::PathBuf>,
    /// Largest request message accepted, in bytes.
    #[arg(long, default_value_t = 32 << 20)]
    max_recv_message: usize,
    /// Run as an application process of the engine attached at PATH
    /// (split mode: no port of its own; the engine's flags set TLS and
    /// limits).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["tls_cert", "tls_key"])]
    attach: Option<std::path::PathBuf>,
}

const ECHO_INITIAL: &str = "x-grpc-test-echo-initial";
const ECHO_TRAILING: &str = "x-grpc-test-echo-trailing-bin";

/// The service: method ids resolved once, message types by table index.
pub(crate) struct TestService {
    schema: Arc<Schema>,
    t: Types,
    ids: [u32; 8],
}

const METHODS: [&str; 8] = [
    "EmptyCall",
    "UnaryCall",
    "CacheableUnaryCall",
    "StreamingOutputCall",
    "StreamingInputCall",
    "FullDuplexCall",
    "HalfDuplexCall",
    "UnimplementedCall",
];

impl TestService {
    pub(crate) fn new(schema: Arc<Schema>) -> Result<TestService, String> {
        let t = Types::of(&schema)?;
        let mut ids = [0; 8];
        for (slot, name) in ids.iter_mut().zip(METHODS) {
            *slot = schema
                .find("grpc.testing.TestService", name)
                .ok_or_else(|| format!("interop schema lacks TestService.{name}"))?;
        }
        Ok(TestService { schema, t, ids })
    }
}

fn field<'a>(v: &MessageView<'a>, number: u32) -> Result<Option<Value<'a>>, Status> {
    Ok(v.by_number(number)?)
}

fn int(v: &MessageView<'_>, number: u32) -> Result<i64, Status> {
    Ok(field(v, number)?.and_then(|x| x.as_i128()).unwrap_or(0) as i64)
}

fn sub<'a>(v: &MessageView<'a>, number: u32) -> Result<Option<MessageView<'a>>, Status> {
    Ok(field(v, number)?.and_then(|x| x.as_message()))
}

/// `BoolValue` field `number` is present and true.
fn flag(v: &MessageView<'_>, number: u32) -> Result<bool, Status> {
    Ok(match sub(v, number)? {
        Some(b) => int(&b, 1)? != 0,
        None => false,
    })
}

/// The status a request's `EchoStatus` (field `number`) asks for, if any.
fn echo_status(v: &MessageView<'_>, number: u32) -> Result<Option<Status>, Status> {
    let Some(s) = sub(v, number)? else { return Ok(None) };
    let code = int(&s, 1)?;
    if code == 0 {
        return Ok(None);
    }
    let message = field(&s, 2)?.and_then(|x| x.as_str()).unwrap_or("").to_string();
    Ok(Some(Status::new(Code::from_u32(code as u32), message)))
}

/// A response whose field 1 is a `Payload` of `size` zero bytes.
fn payload_response(schema: &Schema, ty: u32, size: usize) -> Result<Block, Status> {
    let mut b = Builder::new(schema.tables(), ty)?;
    let root = b.root();
    let p = b.message(root, 1)?;
    if size > 0 {
        b.set(p, 2, Value::Bytes(&vec![0; size]))?;
    }
    Ok(b.finish())
}

fn size_of(n: i64) -> Result<usize, Status> {
    usize::try_from(n).map_err(|_| Status::new(Code::InvalidArgument, "negative size"))
}

/// Echoes the metadata the interop suite asks to see back: the initial
/// entry now, the trailing one in the returned trailers.
fn echo_metadata(md: &Metadata, out: &mut Responder) -> Metadata {
    if let Some(v) = md.get(ECHO_INITIAL) {
        let _ = out.metadata_mut().insert(ECHO_INITIAL, v);
    }
    let mut trailers = Metadata::new();
    if let Some(v) = md.get_bin(ECHO_TRAILING) {
        let _ = trailers.insert_bin(ECHO_TRAILING, v);
    }
    trailers
}

impl TestService {
    async fn unary(
        self: Arc<Self>,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> Result<Metadata, Status> {
        let trailers = echo_metadata(&req.metadata, &mut out);
        let m = req.message.single().await?;
        let v = m.view(self.schema.tables())?;
        if let Some(st) = echo_status(&v, 7)? {
            return Err(Status { metadata: trailers, ..st });
        }
        if flag(&v, 8)? && !m.was_compressed() {
            return Err(Status::new(Code::InvalidArgument, "expected a compressed request"));
        }
        out.set_compression(flag(&v, 6)?);
        let size = size_of(int(&v, 2)?)?;
        out.send(payload_response(&self.schema, self.t.simple_response, size)?).await?;
        Ok(trailers)
    }

    /// Answers one `StreamingOutputCallRequest`: each response parameter
    /// gives a size, an optional delay and compression.
    async fn respond(&self, v: &MessageView<'_>, out: &mut Responder) -> Result<(), Status> {
        let Some(f) = v.field(2) else { return Ok(()) };
        let params = v.repeated(f)?;
        for p in params.iter() {
            let p = p?;
            let Some(p) = p.as_message() else { continue };
            let interval = int(&p, 2)?;
            if interval > 0 {
                tokio::time::sleep(Duration::from_micros(interval as u64)).await;
            }
            out.set_compression(flag(&p, 3)?);
            let size = size_of(int(&p, 1)?)?;
            out.send(payload_response(&self.schema, self.t.output_response, size)?).await?;
        }
        Ok(())
    }

    async fn streaming_output(
        self: Arc<Self>,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> Result<Metadata, Status> {
        let trailers = echo_metadata(&req.metadata, &mut out);
        let m = req.message.single().await?;
        let v = m.view(self.schema.tables())?;
        self.respond(&v, &mut out).await?;
        if let Some(st) = echo_status(&v, 7)? {
            return Err(Status { metadata: trailers, ..st });
        }
        Ok(trailers)
    }

    async fn streaming_input(
        self: Arc<Self>,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> Result<Metadata, Status> {
        let mut total = 0i64;
        while let Some(m) = req.message.message().await {
            let v = m.view(self.schema.tables())?;
            if let Some(p) = sub(&v, 1)? {
                total += field(&p, 2)?.and_then(|x| x.as_bytes()).map_or(0, |b| b.len()) as i64;
            }
        }
        let mut b = Builder::new(self.schema.tables(), self.t.input_response)?;
        let root = b.root();
        b.set(root, 1, Value::I32(total as i32))?;
        out.send(b.finish()).await?;
        Ok(Metadata::new())
    }

    async fn full_duplex(
        self: Arc<Self>,
        mut req: Request<Streaming>,
        mut out: Responder,
        half: bool,
    ) -> Result<Metadata, Status> {
        let trailers = echo_metadata(&req.metadata, &mut out);
        let mut held = Vec::new();
        while let Some(m) = req.message.message().await {
            if half {
                held.push(m);
                continue;
            }
            let v = m.view(self.schema.tables())?;
            if let Some(st) = echo_status(&v, 7)? {
                return Err(Status { metadata: trailers, ..st });
            }
            self.respond(&v, &mut out).await?;
        }
        for m in held {
            let v = m.view(self.schema.tables())?;
            if let Some(st) = echo_status(&v, 7)? {
                return Err(Status { metadata: trailers, ..st });
            }
            self.respond(&v, &mut out).await?;
        }
        // Headers (with echoed initial metadata) go out even when no
        // response was sent.
        out.send_headers().await?;
        Ok(trailers)
    }
}

impl Service for TestService {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "grpc.testing.TestService"
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        request: Request<Streaming>,
        mut responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        let i = self.ids.iter().position(|&id| id == method);
        match i {
            Some(0) => Box::pin(async move {
                let empty = Builder::new(self.schema.tables(), self.t.empty)?;
                responder.send(empty.finish()).await?;
                Ok(Metadata::new())
            }),
            Some(1) | Some(2) => Box::pin(self.unary(request, responder)),
            Some(3) => Box::pin(self.streaming_output(request, responder)),
            Some(4) => Box::pin(self.streaming_input(request, responder)),
            Some(5) => Box::pin(self.full_duplex(request, responder, false)),
            Some(6) => Box::pin(self.full_duplex(request, responder, true)),
            _ => Box::pin(async move {
                Err(Status::new(Code::Unimplemented, "UnimplementedCall is not implemented"))
            }),
        }
    }
}

pub(crate) fn run(args: &ServerArgs) -> Result<(), String> {
    let schema = super::schema()?;
    let svc = Arc::new(TestService::new(schema)?);
    if let Some(path) = &args.attach {
        return protoplane_app::attach(path).serve(svc).map_err(|e| e.to_string());
    }
    let opts =
        ServerOptions { max_recv_message: args.max_recv_message, ..ServerOptions::default() };
    let (router, _health) =
        Router::new(opts).add_service(svc).with_standard_services().map_err(|e| e.to_string())?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => {
            let cert = std::fs::read(c).map_err(|e| format!("{}: {e}", c.display()))?;
            let key = std::fs::read(k).map_err(|e| format!("{}: {e}", k.display()))?;
            Some(protoplane_rpc::tls::server_config(&cert, &key).map_err(|e| e.to_string())?)
        }
        _ => None,
    };
    let rt = protoplane_load::host::runtime(2)?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
            .await
            .map_err(|e| format!("listen on port {}: {e}", args.port))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        println!("listening on {addr}");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        let router = std::sync::Arc::new(router);
        let served = match tls {
            Some(cfg) => router.serve_tls(listener, cfg).await,
            None => router.serve(listener).await,
        };
        served.map_err(|e| format!("serve: {e}"))
    })
}
