//! The README's first service: a key-value store. `kv` holds what
//! `build.rs` generated from `proto/kv.proto`; [`Store`] implements it.

#[allow(missing_docs, missing_debug_implementations, unreachable_pub)]
pub mod kv {
    include!(concat!(env!("OUT_DIR"), "/kv.rs"));
}

use std::collections::HashMap;
use std::sync::Mutex;

use kv::key_value_server::KeyValue;
use kv::{GetReply, GetReplyBuilder, GetRequestView, PutReply, PutRequestView};
use protoplane_grpc::{Code, Message, Request, Status};
use protoplane_wire::Block;

/// The handlers: a map in memory.
#[derive(Debug, Default)]
pub struct Store {
    map: Mutex<HashMap<String, String>>,
}

impl KeyValue for Store {
    async fn put(&self, request: Request<Message>) -> Result<Block, Status> {
        let req: PutRequestView<'_> = request.message.typed()?;
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(req.key().to_string(), req.value().to_string());
        Ok(PutReply::builder().finish())
    }

    async fn get(&self, request: Request<Message>) -> Result<Block, Status> {
        let req: GetRequestView<'_> = request.message.typed()?;
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let Some(value) = map.get(req.key()) else {
            return Err(Status::new(Code::NotFound, format!("no key {:?}", req.key())));
        };
        let mut b = GetReply::builder();
        GetReplyBuilder::root(&mut b).set_value(value)?;
        Ok(b.finish())
    }
}
