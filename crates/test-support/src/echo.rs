//! A unary service that answers every call with an empty message and
//! counts the calls it answered: the backend of load-balancing tests,
//! which ask only where calls went.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use protoplane_grpc::{
    BoxFuture, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_schema::ProtoSource;

/// The method's path.
pub const PATH: &str = "/test.echo.Echo/Echo";

const PROTO: &str = r#"
syntax = "proto3";
package test.echo;
message Empty {}
service Echo { rpc Echo(Empty) returns (Empty); }
"#;

/// Counts the calls it answers.
#[derive(Debug)]
pub struct Counting {
    schema: Arc<Schema>,
    served: AtomicUsize,
}

impl Counting {
    pub fn new() -> Arc<Counting> {
        let src = [ProtoSource { name: "echo.proto", text: PROTO }];
        let schema = Schema::from_proto_sources(&src, &["echo.proto"]).expect("the echo schema");
        Arc::new(Counting { schema: Arc::new(schema), served: AtomicUsize::new(0) })
    }

    /// Calls answered so far.
    pub fn served(&self) -> usize {
        self.served.load(Ordering::SeqCst)
    }
}

impl Service for Counting {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "test.echo.Echo"
    }

    fn call(
        self: Arc<Self>,
        _method: u32,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            req.message.single().await?;
            self.served.fetch_add(1, Ordering::SeqCst);
            // Empty encodes as no bytes.
            out.send_encoded(Default::default()).await?;
            Ok(Metadata::new())
        })
    }
}
