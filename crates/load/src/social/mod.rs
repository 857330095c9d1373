//! The social-network workload: its schema
//! (`protos/socialnetwork/social_network.proto`, embedded), the service
//! `protoplane serve` and the demo run, and its requests (recorded or
//! generated). The demo, `bench rpc`, `bench split` and `bench wire` all
//! drive this one workload.
//!
//! The handlers do the same, deliberately tiny, work as the tonic peer in
//! `bench/peers-rpc` — read the request's `req_id`, answer the default
//! reply, and for `Login` a token made of the id and the user name — so a
//! comparison measures the RPC stacks, not the business logic.

use std::sync::Arc;

use protoplane_grpc::{
    BoxFuture, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::{Router, ServerOptions};
use protoplane_schema::{ProtoSource, TableSet};
use protoplane_wire::{Builder, Value};

use crate::framing::Framing;
use crate::Error;

mod generate;

/// The service's `.proto`.
pub const PROTO: &str = include_str!("../../../../protos/socialnetwork/social_network.proto");
/// Its name as an import path.
pub const PROTO_NAME: &str = "socialnetwork/social_network.proto";
/// The service's full name.
pub const SERVICE: &str = "socialnetwork.SocialNetwork";

/// The compiled schema.
pub fn schema() -> Result<Arc<Schema>, Error> {
    Schema::from_proto_sources(&[ProtoSource { name: PROTO_NAME, text: PROTO }], &[PROTO_NAME])
        .map(Arc::new)
        .map_err(|e| Error::Config(format!("social-network schema: {e}")))
}

/// The service on the dynamic path.
#[derive(Debug)]
pub struct SocialNetwork {
    schema: Arc<Schema>,
    login: u32,
}

impl SocialNetwork {
    pub fn new(schema: Arc<Schema>) -> Result<SocialNetwork, Error> {
        let login = schema
            .find(SERVICE, "Login")
            .ok_or_else(|| Error::Config("schema lacks SocialNetwork.Login".into()))?;
        Ok(SocialNetwork { schema, login })
    }

    async fn handle(
        self: Arc<Self>,
        method: u32,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> Result<Metadata, Status> {
        let m = req.message.single().await?;
        let ts = self.schema.tables();
        let v = m.view(ts)?;
        let req_id = v.by_number(1)?.and_then(|x| x.as_i128()).unwrap_or(0);
        let mut b = Builder::new(ts, out.output_type())?;
        if method == self.login {
            let user = v.by_number(2)?.and_then(|x| x.as_str()).unwrap_or("");
            let token = format!("t{req_id}-{user}");
            let root = b.root();
            b.set(root, 1, Value::String(token.as_bytes()))?;
        }
        out.send(b.finish()).await?;
        Ok(Metadata::new())
    }
}

impl Service for SocialNetwork {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        SERVICE
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        request: Request<Streaming>,
        responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(self.handle(method, request, responder))
    }
}

/// A router serving the social-network service.
pub fn router() -> Result<Router, Error> {
    router_with(ServerOptions::default())
}

/// [`router`] with explicit server settings.
pub fn router_with(opts: ServerOptions) -> Result<Router, Error> {
    router_with_chain(opts, &protoplane_grpc::intercept::Chain::new())
}

/// [`router_with`], the service wrapped in `chain` (the standard services
/// are not).
pub fn router_with_chain(
    opts: ServerOptions,
    chain: &protoplane_grpc::intercept::Chain,
) -> Result<Router, Error> {
    router_wrapped(opts, chain, |svc| svc)
}

/// [`router_with_chain`] with the chained service handed to `wrap` (a
/// tracing wrapper, say) before it is served.
pub fn router_wrapped(
    opts: ServerOptions,
    chain: &protoplane_grpc::intercept::Chain,
    wrap: impl FnOnce(Arc<dyn protoplane_grpc::Service>) -> Arc<dyn protoplane_grpc::Service>,
) -> Result<Router, Error> {
    let svc = Arc::new(SocialNetwork::new(schema()?)?);
    let router = Router::new(opts).add_service(wrap(chain.wrap(svc)));
    Ok(router.with_standard_services().map_err(|e| Error::Config(e.to_string()))?.0)
}

/// The request types of the service and their methods.
pub const REQUESTS: [(&str, &str); 5] = [
    ("RegisterUserRequest", "RegisterUser"),
    ("LoginRequest", "Login"),
    ("ComposeMediaRequest", "ComposeMedia"),
    ("ComposePostRequest", "ComposePost"),
    ("StorePostRequest", "StorePost"),
];

/// Requests of one method: its path, its request type, the encoded messages.
pub type MethodRequests = (String, u32, Vec<Vec<u8>>);

/// The social-network requests per method.
pub fn requests(
    ts: &TableSet,
    dataset: Option<&std::path::Path>,
    per_type: usize,
) -> Result<Vec<MethodRequests>, Error> {
    let mut out = Vec::new();
    for (ty_name, method) in REQUESTS {
        let ty = ts
            .message_by_name(&format!("socialnetwork.{ty_name}"))
            .ok_or_else(|| Error::Config(format!("schema lacks socialnetwork.{ty_name}")))?;
        let messages = match dataset {
            Some(dir) => read_delimited(&dir.join(format!("{ty_name}.ldelim")))?,
            None => generate::generate(ts, ty, ty_name, per_type).map_err(Error::Config)?,
        };
        out.push((format!("/{}/{method}", SERVICE), ty, messages));
    }
    Ok(out)
}

fn read_delimited(path: &std::path::Path) -> Result<Vec<Vec<u8>>, Error> {
    let shown = path.display();
    let bytes = std::fs::read(path).map_err(|e| Error::Config(format!("{shown}: {e}")))?;
    let framing = Framing::new(true);
    framing
        .messages(&bytes)
        .map(|m| m.map(|(_, b)| b.to_vec()).map_err(|e| Error::Config(format!("{shown}: {e}"))))
        .collect()
}
