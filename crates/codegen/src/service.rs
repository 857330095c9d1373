//! The service hook: what a service emitter (service trait, client stub,
//! split-server glue) is given. The generator resolves every method's
//! request and response type to the generated marker, view and builder
//! paths, so an emitter only writes the service-specific code.
//!
//! No service code is generated unless a [`ServiceGenerator`] is configured
//! with [`Config::service_generator`](crate::Config::service_generator).

use crate::writer::CodeWriter;

/// Emits the code of one service into its package's file (at the package
/// module's top level, after the message types).
pub trait ServiceGenerator {
    /// Writes the code of `service`.
    fn generate(&mut self, service: &Service, out: &mut CodeWriter);
}

/// One `service` of a `.proto` file.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Service {
    /// Declared name (`SocialNetwork`).
    pub name: String,
    /// Rust type name (`SocialNetwork`).
    pub rust_name: String,
    /// Proto package.
    pub package: String,
    /// Fully qualified name (`socialnetwork.SocialNetwork`).
    pub full_name: String,
    /// Methods in declaration order.
    pub methods: Vec<Method>,
    /// File name (in the output directory, next to the generated sources)
    /// of the serialized `FileDescriptorSet` of the `compile` call, for
    /// `include_bytes!`.
    pub descriptor_set_file: String,
}

/// One `rpc` of a service.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Method {
    /// Declared name (`ComposePost`).
    pub name: String,
    /// Rust method name (`compose_post`).
    pub rust_name: String,
    /// gRPC path (`/socialnetwork.SocialNetwork/ComposePost`).
    pub path: String,
    /// Request type.
    pub input: MessageType,
    /// Response type.
    pub output: MessageType,
    /// `stream` request.
    pub client_streaming: bool,
    /// `stream` response.
    pub server_streaming: bool,
}

/// A message type as generated, with paths relative to the package module
/// the service code is written into.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MessageType {
    /// Fully qualified name (`socialnetwork.ComposePostRequest`).
    pub full_name: String,
    /// Index in the generated `tables()`.
    pub type_index: u32,
    /// The marker type (`ComposePostRequest`: `TYPE_INDEX`, `builder()`, `decode`).
    pub marker: String,
    /// The view type (`ComposePostRequestView`, takes a lifetime).
    pub view: String,
    /// The builder type (`ComposePostRequestBuilder`, takes two lifetimes).
    pub builder: String,
}
