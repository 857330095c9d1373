//! A loaded schema with its services: the wire engine's table set plus the
//! methods that say which table decodes a call's request and which encodes
//! its response.
//!
//! Methods are numbered in the order the descriptor set declares them; that
//! number (the *method id*) is what crosses the engine/application seam and
//! what the lean transport puts on the wire, instead of the method's path.

use std::collections::HashMap;
use std::path::Path;

use prost::Message as _;
use prost_types::{FileDescriptorProto, FileDescriptorSet};
use protoplane_schema::{
    compile_proto_sources, compile_protos, ProtoSource, SchemaError, TableSet,
};

/// One RPC method.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Method {
    /// The HTTP/2 path: `/package.Service/Method`.
    pub path: String,
    /// The full service name: `package.Service`.
    pub service: String,
    /// The method's own name.
    pub name: String,
    /// Table index of the request type.
    pub input: u32,
    /// Table index of the response type.
    pub output: u32,
    /// The client sends a stream of requests.
    pub client_streaming: bool,
    /// The server sends a stream of responses.
    pub server_streaming: bool,
}

impl Method {
    /// The call kind's name, as gRPC documentation spells it.
    pub fn kind(&self) -> &'static str {
        match (self.client_streaming, self.server_streaming) {
            (false, false) => "unary",
            (false, true) => "server streaming",
            (true, false) => "client streaming",
            (true, true) => "bidirectional streaming",
        }
    }
}

/// Tables and services of a set of `.proto` files.
#[derive(Debug)]
pub struct Schema {
    tables: TableSet,
    methods: Vec<Method>,
    by_path: HashMap<String, u32>,
    services: Vec<String>,
    files: Vec<FileDescriptorProto>,
}

impl Schema {
    /// Builds the schema of a compiled descriptor set (with its imports).
    pub fn from_file_descriptor_set(set: FileDescriptorSet) -> Result<Schema, SchemaError> {
        let tables = TableSet::from_file_descriptor_set(&set)?;
        let mut methods = Vec::new();
        let mut services = Vec::new();
        for file in &set.file {
            let package = file.package();
            for svc in &file.service {
                let service = if package.is_empty() {
                    svc.name().to_string()
                } else {
                    format!("{package}.{}", svc.name())
                };
                for m in &svc.method {
                    // protoc refuses both; a hand-made descriptor set may
                    // have them, and two methods on one path would make a
                    // call's method depend on which one a lookup finds.
                    if m.name().is_empty() {
                        return Err(SchemaError::Descriptor(format!(
                            "service {service}: a method without a name"
                        )));
                    }
                    let lookup = |name: &str| {
                        let name = name.strip_prefix('.').unwrap_or(name);
                        tables.message_by_name(name).ok_or_else(|| {
                            SchemaError::Descriptor(format!(
                                "method {service}.{}: unknown message type {name}",
                                m.name()
                            ))
                        })
                    };
                    methods.push(Method {
                        path: format!("/{service}/{}", m.name()),
                        service: service.clone(),
                        name: m.name().to_string(),
                        input: lookup(m.input_type())?,
                        output: lookup(m.output_type())?,
                        client_streaming: m.client_streaming(),
                        server_streaming: m.server_streaming(),
                    });
                }
                services.push(service);
            }
        }
        let mut by_path = HashMap::with_capacity(methods.len());
        for (i, m) in methods.iter().enumerate() {
            if by_path.insert(m.path.clone(), i as u32).is_some() {
                return Err(SchemaError::Descriptor(format!(
                    "method {} is declared twice",
                    m.path
                )));
            }
        }
        Ok(Schema { tables, methods, by_path, services, files: set.file })
    }

    /// Compiles `.proto` files from disk (`includes` are the `-I` roots).
    pub fn from_proto_files(
        files: &[impl AsRef<Path>],
        includes: &[impl AsRef<Path>],
    ) -> Result<Schema, SchemaError> {
        Schema::from_file_descriptor_set(compile_protos(files, includes)?)
    }

    /// Compiles `.proto` files held in memory (`root` names the ones to
    /// compile; the others are imports).
    pub fn from_proto_sources(
        sources: &[ProtoSource<'_>],
        root: &[&str],
    ) -> Result<Schema, SchemaError> {
        Schema::from_file_descriptor_set(compile_proto_sources(sources, root)?)
    }

    /// Reads a serialized `FileDescriptorSet` (`protoc --include_imports
    /// --descriptor_set_out`).
    pub fn from_descriptor_set(bytes: &[u8]) -> Result<Schema, SchemaError> {
        let set =
            FileDescriptorSet::decode(bytes).map_err(|e| SchemaError::Descriptor(e.to_string()))?;
        Schema::from_file_descriptor_set(set)
    }

    /// The wire engine's tables.
    pub fn tables(&self) -> &TableSet {
        &self.tables
    }

    /// Every method, indexed by method id.
    pub fn methods(&self) -> &[Method] {
        &self.methods
    }

    /// The method with id `id`.
    pub fn method(&self, id: u32) -> Option<&Method> {
        self.methods.get(id as usize)
    }

    /// The id of the method at HTTP/2 path `path` (`/pkg.Svc/Method`).
    pub fn method_id(&self, path: &str) -> Option<u32> {
        self.by_path.get(path).copied()
    }

    /// The id of `service`'s method `name`.
    pub fn find(&self, service: &str, name: &str) -> Option<u32> {
        self.methods.iter().position(|m| m.service == service && m.name == name).map(|i| i as u32)
    }

    /// Full names of the services.
    pub fn services(&self) -> &[String] {
        &self.services
    }

    /// The file descriptors (for server reflection).
    pub fn files(&self) -> &[FileDescriptorProto] {
        &self.files
    }
}
