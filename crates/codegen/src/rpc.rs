//! The RPC service emitter: for each `service`, a server trait with an
//! adapter to the runtime's `protoplane_grpc::Service` (the
//! engine/application seam), and a client stub. The generated code needs
//! `protoplane-grpc` (the call types) and `protoplane-rpc` (the channel
//! and router) as dependencies.
//!
//! For `service Greeter { rpc Hello(HelloRequest) returns (HelloReply); }`
//! in package `demo`:
//!
//! ```ignore
//! use demo::greeter_server::{Greeter, GreeterServer};
//! use demo::{HelloReply, HelloReplyBuilder, HelloRequestView};
//! use protoplane_grpc::{Request, Message, Status};
//! use protoplane_wire::Block;
//!
//! struct MyGreeter;
//! impl Greeter for MyGreeter {
//!     async fn hello(&self, request: Request<Message>) -> Result<Block, Status> {
//!         let req: HelloRequestView = request.message.typed()?;
//!         let mut b = HelloReply::builder();
//!         HelloReplyBuilder::root(&mut b).set_message(&format!("hello {}", req.name()))?;
//!         Ok(b.finish())
//!     }
//! }
//! // serve: Router::new(opts).add_service(GreeterServer::new(MyGreeter))
//! // call:  GreeterClient::connect("127.0.0.1:50051").await?.hello(Request::new(&block)).await?
//! ```
//!
//! The shapes follow tonic's, so a tonic service ports method by method:
//!
//! | kind | tonic | protoplane |
//! |---|---|---|
//! | unary | `Request<Req>` → `Response<Resp>` | `Request<Message>` → `Block` |
//! | server streaming | `Request<Req>` → `Response<Self::Stream>` | `Request<Message>`, `Responder` → `()` |
//! | client streaming | `Request<Streaming<Req>>` → `Response<Resp>` | `Request<Streaming>` → `Block` |
//! | bidirectional | `Request<Streaming<Req>>` → `Response<Self::Stream>` | `Request<Streaming>`, `Responder` → `()` |
//!
//! Requests arrive decoded and are read through the generated views
//! (`message.typed::<FooView>()`); responses are laid out with the
//! generated builders and returned (or sent) as blocks, which the engine
//! encodes: the handler never touches protobuf bytes.

use std::collections::HashSet;

use crate::names::snake;
use crate::service::{Method, Service, ServiceGenerator};
use crate::writer::CodeWriter;

/// Emits server traits, server adapters and client stubs for
/// `protoplane-grpc` and `protoplane-rpc`.
#[derive(Debug, Default)]
pub struct RpcServices {
    /// View types that already got their `protoplane_grpc::View` impl (a type
    /// used by several methods or services gets one).
    views: HashSet<String>,
    /// Also emit the in-network computation client ([`inc_services`]).
    inc: bool,
}

/// The generator to pass to [`Config::service_generator`](crate::Config::service_generator).
pub fn rpc_services() -> Box<dyn ServiceGenerator> {
    Box::<RpcServices>::default()
}

fn kind(m: &Method) -> &'static str {
    match (m.client_streaming, m.server_streaming) {
        (false, false) => "unary",
        (false, true) => "server streaming",
        (true, false) => "client streaming",
        (true, true) => "bidirectional streaming",
    }
}

impl RpcServices {
    fn view_impls(&mut self, s: &Service, w: &mut CodeWriter) {
        for m in &s.methods {
            for t in [&m.input, &m.output] {
                if !self.views.insert(t.full_name.clone()) {
                    continue;
                }
                let view = &t.view;
                w.blank();
                w.open(format!("impl<'a> ::protoplane_grpc::View<'a> for {view}<'a>"));
                w.line(format!("const TYPE_INDEX: u32 = {}::TYPE_INDEX;", t.marker));
                w.open_fn(
                    "fn from_parts",
                    &["block: &'a [u8]".to_owned(), "wire: &'a [u8]".to_owned()],
                    "Result<Self, ::protoplane_wire::BlockError>",
                );
                w.line("Self::from_block(block, wire)");
                w.close();
                w.close();
            }
        }
    }

    fn schema_fn(s: &Service, w: &mut CodeWriter) {
        w.doc(&format!(
            "The schema of `{}` (tables and methods), built once from the embedded\n\
             descriptors; the same tables the package's views and builders use.",
            s.full_name
        ));
        w.open("pub fn schema() -> &'static ::std::sync::Arc<::protoplane_grpc::Schema>");
        w.line(
            "static SCHEMA: ::std::sync::OnceLock<::std::sync::Arc<::protoplane_grpc::Schema>> =",
        );
        w.line("    ::std::sync::OnceLock::new();");
        w.open("SCHEMA.get_or_init(||");
        w.line(format!("let bytes: &[u8] = include_bytes!(\"{}\");", s.descriptor_set_file));
        w.open("match ::protoplane_grpc::Schema::from_descriptor_set(bytes)");
        w.line("Ok(s) => ::std::sync::Arc::new(s),");
        w.line("Err(e) => panic!(\"protoplane: the embedded descriptors do not load: {e}\"),");
        w.close();
        w.close_with(")");
        w.close();
        w.blank();
        w.doc("The method ids of the service, in declaration order.");
        w.open(format!("fn method_ids() -> &'static [u32; {}]", s.methods.len()));
        w.line(format!(
            "static IDS: ::std::sync::OnceLock<[u32; {}]> = ::std::sync::OnceLock::new();",
            s.methods.len()
        ));
        w.open("IDS.get_or_init(||");
        w.line("let schema = schema();");
        w.line(format!("let mut ids = [u32::MAX; {}];", s.methods.len()));
        w.open(format!(
            "for (slot, name) in ids.iter_mut().zip([{}])",
            s.methods.iter().map(|m| format!("{:?}", m.name)).collect::<Vec<_>>().join(", ")
        ));
        w.line(format!("*slot = schema.find({:?}, name).unwrap_or(u32::MAX);", s.full_name));
        w.close();
        w.line("ids");
        w.close_with(")");
        w.close();
    }

    fn server(s: &Service, w: &mut CodeWriter) {
        let module = format!("{}_server", snake(&s.name));
        let name = &s.rust_name;
        w.blank();
        w.doc(&format!(
            "The server side of `{}`: implement [`{module}::{name}`] and serve\n\
             [`{module}::{name}Server::new`] with a `protoplane_rpc::Router`.",
            s.full_name
        ));
        w.open(format!("pub mod {module}"));
        w.line("#![allow(unused_imports, clippy::module_inception)]");
        w.line("use super::*;");
        w.blank();
        Self::schema_fn(s, w);
        w.blank();
        w.doc(&format!("The methods of `{}`.", s.full_name));
        w.open(format!("pub trait {name}: Send + Sync + 'static"));
        for m in &s.methods {
            w.doc(&format!(
                "`rpc {}` ({}): `{}` in, `{}` out.",
                m.name,
                kind(m),
                m.input.full_name,
                m.output.full_name
            ));
            let req = if m.client_streaming {
                "requests: ::protoplane_grpc::Request<::protoplane_grpc::Streaming>"
            } else {
                "request: ::protoplane_grpc::Request<::protoplane_grpc::Message>"
            };
            let (extra, out) = if m.server_streaming {
                (", responses: ::protoplane_grpc::Responder", "()")
            } else {
                ("", "::protoplane_wire::Block")
            };
            w.line(format!(
                "fn {}(&self, {req}{extra}) -> impl ::std::future::Future<Output = Result<{out}, ::protoplane_grpc::Status>> + Send;",
                m.rust_name
            ));
        }
        w.close();
        w.blank();
        w.doc(&format!(
            "Adapts a [`{name}`] to the runtime: decoded requests in, response blocks out."
        ));
        w.line("#[derive(Debug)]");
        w.open(format!("pub struct {name}Server<T>"));
        w.line("inner: T,");
        w.close();
        w.blank();
        w.open(format!("impl<T: {name}> {name}Server<T>"));
        w.doc("The service, ready for `Router::add_service`.");
        w.open("pub fn new(inner: T) -> ::std::sync::Arc<Self>");
        w.line("::std::sync::Arc::new(Self { inner })");
        w.close();
        w.close();
        w.blank();
        w.open(format!("impl<T: {name}> ::protoplane_grpc::Service for {name}Server<T>"));
        w.open("fn schema(&self) -> &::std::sync::Arc<::protoplane_grpc::Schema>");
        w.line("schema()");
        w.close();
        w.blank();
        w.open("fn name(&self) -> &str");
        w.line(format!("{:?}", s.full_name));
        w.close();
        w.blank();
        w.open_fn(
            "fn call",
            &[
                "self: ::std::sync::Arc<Self>".to_owned(),
                "method: u32".to_owned(),
                "request: ::protoplane_grpc::Request<::protoplane_grpc::Streaming>".to_owned(),
                "mut responder: ::protoplane_grpc::Responder".to_owned(),
            ],
            "::protoplane_grpc::BoxFuture<'static, Result<::protoplane_grpc::Metadata, ::protoplane_grpc::Status>>",
        );
        w.line("let ids = method_ids();");
        for (i, m) in s.methods.iter().enumerate() {
            w.open(format!("if method == ids[{i}]"));
            w.open("return Box::pin(async move");
            if !m.client_streaming {
                w.line("let request = request.into_single().await?;");
            }
            let arg = "request";
            if m.server_streaming {
                w.line(format!("self.inner.{}({arg}, responder).await?;", m.rust_name));
            } else {
                w.line(format!("let block = self.inner.{}({arg}).await?;", m.rust_name));
                w.line("responder.send(block).await?;");
            }
            w.line("Ok(::protoplane_grpc::Metadata::new())");
            w.close_with(");");
            w.close();
        }
        w.line("let _ = (request, &mut responder);");
        w.open("Box::pin(async move");
        w.line("Err(::protoplane_grpc::Status::new(::protoplane_grpc::Code::Unimplemented, \"unknown method\"))");
        w.close_with(")");
        w.close();
        w.close();
        w.close();
    }

    fn client(s: &Service, w: &mut CodeWriter) {
        let module = format!("{}_client", snake(&s.name));
        let name = &s.rust_name;
        let server_module = format!("{}_server", snake(&s.name));
        w.blank();
        w.doc(&format!("The client side of `{}`.", s.full_name));
        w.open(format!("pub mod {module}"));
        w.line("#![allow(unused_imports, clippy::module_inception)]");
        w.line("use super::*;");
        w.blank();
        w.doc(&format!(
            "A client of `{}`: requests are blocks laid out with the generated\n\
             builders, responses decoded messages read through the generated views.",
            s.full_name
        ));
        w.line("#[derive(Clone, Debug)]");
        w.open(format!("pub struct {name}Client"));
        w.line("client: ::protoplane_rpc::Client,");
        w.close();
        w.blank();
        w.open(format!("impl {name}Client"));
        w.doc("Connects over gRPC/HTTP2 (`host:port`).");
        w.open("pub async fn connect(target: &str) -> Result<Self, ::protoplane_grpc::Status>");
        w.line("Ok(Self::new(::protoplane_rpc::Channel::connect(target).await?))");
        w.close();
        w.blank();
        w.doc("A client over an established channel.");
        w.open("pub fn new(channel: ::protoplane_rpc::Channel) -> Self");
        w.line(format!(
            "Self {{ client: ::protoplane_rpc::Client::new(channel, super::{server_module}::schema().clone()) }}"
        ));
        w.close();
        for m in &s.methods {
            w.blank();
            let id = format!(
                "super::{server_module}::schema().find({:?}, {:?}).unwrap_or(u32::MAX)",
                s.full_name, m.name
            );
            if !m.client_streaming && !m.server_streaming {
                w.doc(&format!(
                    "`rpc {}` (unary): a `{}` block in, the decoded `{}` out.",
                    m.name, m.input.full_name, m.output.full_name
                ));
                w.open(format!(
                    "pub async fn {}(&self, request: ::protoplane_grpc::Request<&::protoplane_wire::Block>) -> Result<::protoplane_grpc::Message, ::protoplane_grpc::Status>",
                    m.rust_name
                ));
                w.line(format!("self.client.unary({id}, request).await.map(|(m, _)| m)"));
            } else {
                w.doc(&format!(
                    "`rpc {}` ({}): starts the call; send `{}` blocks and receive\n\
                     `{}` messages on it.",
                    m.name,
                    kind(m),
                    m.input.full_name,
                    m.output.full_name
                ));
                w.open(format!(
                    "pub async fn {}(&self, options: ::protoplane_rpc::CallOptions) -> Result<::protoplane_rpc::TypedCall, ::protoplane_grpc::Status>",
                    m.rust_name
                ));
                w.line(format!("self.client.start({id}, options).await"));
            }
            w.close();
        }
        w.close();
        w.close();
    }
}

impl ServiceGenerator for RpcServices {
    fn generate(&mut self, service: &Service, out: &mut CodeWriter) {
        self.view_impls(service, out);
        Self::server(service, out);
        Self::client(service, out);
        if self.inc {
            Self::inc_client(service, out);
        }
    }
}

/// The generator for services with a NetFilter (in-network computation):
/// everything [`rpc_services`] emits, plus a client stub
/// `<service>_inc_client::<Service>IncClient` with the same methods as the
/// ordinary one, whose unary calls route the request's IEDT fields through
/// the client agent (`protoplane_inc_net::rpc::IncChannel`). The server side
/// is the ordinary one. The generated code needs `protoplane-inc-net` as a
/// dependency too.
pub fn inc_services() -> Box<dyn ServiceGenerator> {
    Box::new(RpcServices { inc: true, ..RpcServices::default() })
}

impl RpcServices {
    fn inc_client(s: &Service, w: &mut CodeWriter) {
        let module = format!("{}_inc_client", snake(&s.name));
        let name = &s.rust_name;
        let server_module = format!("{}_server", snake(&s.name));
        w.blank();
        w.doc(&format!(
            "The client side of `{}` with in-network computation: the same methods as\n\
             [`super::{}_client`]'s, with the IEDT fields of a request going through the\n\
             client agent as the service's NetFilter says.",
            s.full_name,
            snake(&s.name)
        ));
        w.open(format!("pub mod {module}"));
        w.line("#![allow(unused_imports, clippy::module_inception)]");
        w.line("use super::*;");
        w.blank();
        w.doc(&format!("A client of `{}` whose IEDT fields travel in the network.", s.full_name));
        w.line("#[derive(Clone, Debug)]");
        w.open(format!("pub struct {name}IncClient"));
        w.line("inner: ::protoplane_inc_net::rpc::IncChannel,");
        w.close();
        w.blank();
        w.open(format!("impl {name}IncClient"));
        w.doc(
            "Connects over gRPC/HTTP2 (`host:port`); `netfilter` is the service's NetFilter\n\
             (JSON), `agent` a joined client agent.",
        );
        w.open_fn(
            "pub async fn connect",
            &[
                "target: &str".to_owned(),
                "netfilter: &str".to_owned(),
                "agent: ::protoplane_inc_net::agent::ClientHandle".to_owned(),
            ],
            "Result<Self, ::protoplane_grpc::Status>",
        );
        w.line("Self::new(::protoplane_rpc::Channel::connect(target).await?, netfilter, agent)");
        w.close();
        w.blank();
        w.doc("A client over an established channel; fails when the NetFilter does not fit.");
        w.open_fn(
            "pub fn new",
            &[
                "channel: ::protoplane_rpc::Channel".to_owned(),
                "netfilter: &str".to_owned(),
                "agent: ::protoplane_inc_net::agent::ClientHandle".to_owned(),
            ],
            "Result<Self, ::protoplane_grpc::Status>",
        );
        w.line(format!("let schema = super::{server_module}::schema().clone();"));
        w.line(format!(
            "let inner = ::protoplane_inc_net::rpc::IncChannel::new(channel, schema, {:?}, netfilter, agent)?;",
            s.full_name
        ));
        w.line("Ok(Self { inner })");
        w.close();
        w.blank();
        w.doc("The channel: counters, the agent, the ordinary client.");
        w.open("pub fn inc(&self) -> &::protoplane_inc_net::rpc::IncChannel");
        w.line("&self.inner");
        w.close();
        for m in &s.methods {
            w.blank();
            if !m.client_streaming && !m.server_streaming {
                w.doc(&format!(
                    "`rpc {}` (unary): a `{}` block in, the decoded `{}` out.",
                    m.name, m.input.full_name, m.output.full_name
                ));
                w.open(format!(
                    "pub async fn {}(&self, request: ::protoplane_grpc::Request<&::protoplane_wire::Block>) -> Result<::protoplane_grpc::Message, ::protoplane_grpc::Status>",
                    m.rust_name
                ));
                w.line(format!("self.inner.unary({:?}, request).await", m.name));
            } else {
                w.doc(&format!(
                    "`rpc {}` ({}): an ordinary call (no IEDT field travels in a stream).",
                    m.name,
                    kind(m)
                ));
                w.open(format!(
                    "pub async fn {}(&self, options: ::protoplane_rpc::CallOptions) -> Result<::protoplane_rpc::TypedCall, ::protoplane_grpc::Status>",
                    m.rust_name
                ));
                w.line(format!(
                    "let id = super::{server_module}::schema().find({:?}, {:?}).unwrap_or(u32::MAX);",
                    s.full_name, m.name
                ));
                w.line("self.inner.client().start(id, options).await");
            }
            w.close();
        }
        w.close();
        w.close();
    }
}
