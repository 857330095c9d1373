//! Server reflection (`grpc.reflection.v1` and `v1alpha`), so tools such as
//! `grpcurl list` / `describe` / calls without a local `.proto` work against
//! a protoplane server: the services served, and for a file name or a
//! symbol, the serialized file descriptors (the file and everything it
//! imports).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use prost::Message as _;
use prost_types::{DescriptorProto, FileDescriptorProto};
use protoplane_schema::ProtoSource;
use protoplane_wire::{Block, Builder, MessageView, Value};

use protoplane_grpc::call::{BoxFuture, Request, Responder, Service, Streaming};
use protoplane_grpc::metadata::Metadata;
use protoplane_grpc::schema::Schema;
use protoplane_grpc::status::{Code, Status};

use crate::health::{Health, ServingStatus};

const PROTO: &str = include_str!("../../../protos/grpc/reflection.proto");

/// The descriptors a reflection service answers from.
#[derive(Debug, Default)]
struct Index {
    files: HashMap<String, Vec<u8>>,
    deps: HashMap<String, Vec<String>>,
    symbols: HashMap<String, String>,
    services: Vec<String>,
}

fn add_messages(
    prefix: &str,
    msgs: &[DescriptorProto],
    file: &str,
    symbols: &mut HashMap<String, String>,
) {
    for m in msgs {
        let name = format!("{prefix}{}", m.name());
        for e in &m.enum_type {
            symbols.insert(format!("{name}.{}", e.name()), file.to_string());
        }
        add_messages(&format!("{name}."), &m.nested_type, file, symbols);
        symbols.insert(name, file.to_string());
    }
}

impl Index {
    fn add(&mut self, f: &FileDescriptorProto) {
        let name = f.name().to_string();
        if self.files.contains_key(&name) {
            return;
        }
        let prefix =
            if f.package().is_empty() { String::new() } else { format!("{}.", f.package()) };
        add_messages(&prefix, &f.message_type, &name, &mut self.symbols);
        for e in &f.enum_type {
            self.symbols.insert(format!("{prefix}{}", e.name()), name.clone());
        }
        for s in &f.service {
            let svc = format!("{prefix}{}", s.name());
            for m in &s.method {
                self.symbols.insert(format!("{svc}.{}", m.name()), name.clone());
            }
            self.symbols.insert(svc, name.clone());
        }
        self.deps.insert(name.clone(), f.dependency.clone());
        self.files.insert(name, f.encode_to_vec());
    }

    /// The file and its transitive imports, the file first.
    fn closure(&self, file: &str) -> Vec<&[u8]> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut queue = VecDeque::from([file.to_string()]);
        while let Some(f) = queue.pop_front() {
            if !seen.insert(f.clone()) {
                continue;
            }
            if let Some(bytes) = self.files.get(&f) {
                out.push(bytes.as_slice());
            }
            for d in self.deps.get(&f).into_iter().flatten() {
                queue.push_back(d.clone());
            }
        }
        out
    }
}

/// The reflection service of one package (`v1` or `v1alpha`).
#[derive(Debug)]
pub struct Reflection {
    schema: Arc<Schema>,
    name: String,
    index: Arc<Index>,
    /// When set, a service is listed only while this health service does
    /// not report it NOT_SERVING (a split engine's service with no
    /// application attached).
    health: Option<Arc<Health>>,
}

impl Reflection {
    /// Reflection services (v1 and v1alpha) describing `schemas`, whose
    /// served services are `services` (the reflection services add
    /// themselves).
    pub fn new(
        schemas: &[Arc<Schema>],
        services: &[String],
    ) -> Result<Vec<Arc<Reflection>>, Status> {
        Reflection::listing_by(schemas, services, None)
    }

    /// [`Reflection::new`], listing only the services `health` does not
    /// report NOT_SERVING at the time of each request: a service nobody
    /// serves at the moment is not offered to tools (its descriptors are
    /// still answered by name).
    pub fn listing_by(
        schemas: &[Arc<Schema>],
        services: &[String],
        health: Option<Arc<Health>>,
    ) -> Result<Vec<Arc<Reflection>>, Status> {
        let mut index = Index::default();
        let mut out_schemas = Vec::new();
        for pkg in ["grpc.reflection.v1", "grpc.reflection.v1alpha"] {
            let text = PROTO.replace("package grpc.reflection.v1;", &format!("package {pkg};"));
            let file = format!("{}/reflection.proto", pkg.replace('.', "/"));
            let schema = Schema::from_proto_sources(
                &[ProtoSource { name: &file, text: &text }],
                &[file.as_str()],
            )
            .map_err(|e| Status::new(Code::Internal, e.to_string()))?;
            out_schemas.push((Arc::new(schema), format!("{pkg}.ServerReflection")));
        }
        for s in schemas.iter().chain(out_schemas.iter().map(|(s, _)| s)) {
            for f in s.files() {
                index.add(f);
            }
        }
        index.services = services.to_vec();
        for (_, name) in &out_schemas {
            index.services.push(name.clone());
        }
        index.services.sort();
        index.services.dedup();
        let index = Arc::new(index);
        Ok(out_schemas
            .into_iter()
            .map(|(schema, name)| {
                Arc::new(Reflection { schema, name, index: index.clone(), health: health.clone() })
            })
            .collect())
    }

    fn respond(&self, out: &Responder, req: &MessageView<'_>) -> Result<Block, Status> {
        let text = |n: u32| -> Result<Option<String>, Status> {
            Ok(req.by_number(n)?.and_then(|v| v.as_str()).map(str::to_string))
        };
        let mut b = Builder::new(self.schema.tables(), out.output_type())?;
        let root = b.root();
        let host = text(1)?.unwrap_or_default();
        b.set(root, 1, Value::String(host.as_bytes()))?;
        let orig = b.message(root, 2)?;
        b.set(orig, 1, Value::String(host.as_bytes()))?;
        let error = |b: &mut Builder<'_>, code: Code, msg: &str| -> Result<(), Status> {
            let e = b.message(root, 7)?;
            b.set(e, 1, Value::I32(code as i32))?;
            Ok(b.set(e, 2, Value::String(msg.as_bytes()))?)
        };
        let files = |b: &mut Builder<'_>, name: &str| -> Result<(), Status> {
            let fd = b.message(root, 4)?;
            for bytes in self.index.closure(name) {
                b.push(fd, 1, Value::Bytes(bytes))?;
            }
            Ok(())
        };
        if let Some(name) = text(3)? {
            b.set(orig, 3, Value::String(name.as_bytes()))?;
            match self.index.files.contains_key(&name) {
                true => files(&mut b, &name)?,
                false => error(&mut b, Code::NotFound, &format!("file not found: {name}"))?,
            }
        } else if let Some(sym) = text(4)? {
            b.set(orig, 4, Value::String(sym.as_bytes()))?;
            let sym = sym.strip_prefix('.').unwrap_or(&sym);
            match self.index.symbols.get(sym) {
                Some(file) => files(&mut b, file)?,
                None => error(&mut b, Code::NotFound, &format!("symbol not found: {sym}"))?,
            }
        } else if let Some(all) = text(7)? {
            b.set(orig, 7, Value::String(all.as_bytes()))?;
            let list = b.message(root, 6)?;
            let listed = |s: &&String| {
                self.health.as_ref().is_none_or(|h| h.status(s) != Some(ServingStatus::NotServing))
            };
            for s in self.index.services.iter().filter(listed) {
                let e = b.message(list, 1)?;
                b.set(e, 1, Value::String(s.as_bytes()))?;
            }
        } else if let Some(ty) = text(6)? {
            b.set(orig, 6, Value::String(ty.as_bytes()))?;
            // No extensions are registered: an empty list for a known type.
            match self.index.symbols.contains_key(ty.strip_prefix('.').unwrap_or(&ty)) {
                true => {
                    let r = b.message(root, 5)?;
                    b.set(r, 1, Value::String(ty.as_bytes()))?;
                }
                false => error(&mut b, Code::NotFound, &format!("type not found: {ty}"))?,
            }
        } else {
            error(&mut b, Code::NotFound, "extensions are not registered")?;
        }
        Ok(b.finish())
    }

    async fn run(
        self: Arc<Self>,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> Result<Metadata, Status> {
        while let Some(m) = req.message.message().await {
            let v = m.view(self.schema.tables())?;
            let block = self.respond(&out, &v)?;
            out.send(block).await?;
        }
        Ok(Metadata::new())
    }
}

impl Service for Reflection {
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
        Box::pin(self.run(request, responder))
    }
}
