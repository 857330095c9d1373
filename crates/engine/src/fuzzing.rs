//! The engine's side of one attachment without a socket, a runtime or an
//! application process, for the `ring` fuzz target
//! (`fuzz/fuzz_targets/ring.rs`). Not part of the engine's API.
//!
//! The target plays the application by writing the region itself (any
//! bytes anywhere, as a hostile process can), and drives the engine's side
//! through the functions the engine uses: the region is set up as in the
//! handshake, calls are opened, posted and closed as the proxy does, and
//! [`Engine::take`] is the drain loop's step. Only what the target needs to
//! watch is exposed; the checks stay those of [`Attachment`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use protoplane_grpc::{Metadata, Status};
use protoplane_shm::{Consumer, Descriptor, Layout, Mapping};

use crate::attachment::events::{EventRx, Inbound};
use crate::attachment::{self, Attachment, PostError};

/// The engine's end of one attachment.
#[derive(Debug)]
pub struct Engine {
    att: Arc<Attachment>,
    responses: Consumer,
}

/// A call opened with the application: what the proxy waits on.
#[derive(Debug)]
pub struct Call {
    /// The call id descriptors carry.
    pub id: u64,
    rx: EventRx,
}

/// What the proxy of a call sees next.
#[derive(Debug)]
pub enum Event {
    /// Initial metadata.
    Headers(Metadata),
    /// A response, copied out of the application's half.
    Message {
        /// The block (or, `encoded`, the message's encoding).
        bytes: Bytes,
        /// Already encoded.
        encoded: bool,
        /// To be compressed.
        compress: bool,
    },
    /// The call's end.
    Status(Status),
    /// Nothing yet: the call is open and waits.
    Pending,
    /// The engine dropped the call's queue.
    Closed,
}

/// Why a post was refused.
#[derive(Debug)]
pub enum Refused {
    /// No room now (ring or chunks).
    Busy,
    /// The application is gone.
    Gone(Status),
    /// Larger than any chunk.
    TooLarge,
}

impl Call {
    /// The next thing the engine delivered for the call, without waiting.
    pub fn try_next(&mut self) -> Event {
        match self.rx.try_recv() {
            Ok(Inbound::Headers(md) | Inbound::Staged(md)) => Event::Headers(md),
            Ok(Inbound::Message { bytes, encoded, compress }) => {
                Event::Message { bytes, encoded, compress }
            }
            Ok(Inbound::Status(st)) => Event::Status(st),
            Err(false) => Event::Pending,
            Err(true) => Event::Closed,
        }
    }
}

impl Engine {
    /// A fresh region of `layout` with the engine's side set up as after a
    /// handshake (attachment id 1, one service `fuzz.S`, one outbound
    /// channel to `kv.Store`), and the
    /// application's own mapping of it (the engine's half read-only, as
    /// the seal leaves it to any application).
    pub fn new(layout: Layout) -> Result<(Engine, Mapping), crate::Error> {
        layout.validate(None).map_err(|e| crate::Error::Region(e.to_string()))?;
        // A small device, so hostile compute-unit control messages reach
        // it too.
        let opts = crate::DeviceOptions { units: 1, region_mb: 1, ..Default::default() };
        let device = Some(Arc::new(crate::Device::new(&opts, Vec::new())?));
        let (region, att, rx) = crate::region(
            1,
            0,
            vec!["fuzz.S".into()],
            layout.clone(),
            device,
            crate::Budgets::default(),
        )
        .map_err(crate::Error::Region)?;
        let map = Mapping::map_parts(&layout.app_parts(&region.shared, &region.engine_half))
            .map_err(|e| crate::Error::Region(e.to_string()))?;
        // One outbound channel (`kv.Store` of [`VERSIONS_PROTO`]), so
        // hostile outbound requests reach the encoder. Without a runtime
        // no call leaves: each is answered UNAVAILABLE once encoded.
        let src = [protoplane_schema::ProtoSource { name: "kv.proto", text: VERSIONS_PROTO }];
        let schema = protoplane_grpc::Schema::from_proto_sources(&src, &["kv.proto"])
            .map_err(|e| crate::Error::Schema(e.to_string()))?;
        att.set_outbound(vec![crate::outbound::OutChannel {
            channel: protoplane_rpc::Channel::lazy("127.0.0.1:9", Default::default()),
            schema: Arc::new(schema),
            service: "kv.Store".into(),
            target: "127.0.0.1:9".into(),
        }]);
        Ok((Engine { att, responses: rx.responses }, map))
    }

    /// The attachment (its counters, `detach`, `chunk_use`, ...).
    pub fn attachment(&self) -> &Arc<Attachment> {
        &self.att
    }

    /// Opens a call, as the proxy does before posting its OPEN.
    pub fn open_call(&self) -> Result<Call, Status> {
        let (id, rx) = self.att.open_call()?;
        Ok(Call { id, rx })
    }

    /// The side sections of an OPEN (timeout and metadata), as the proxy
    /// writes them.
    pub fn open_side(timeout: Option<Duration>, md: &Metadata) -> Vec<u8> {
        let mut out = Vec::new();
        protoplane_seam::OpenRepr::emit_parts(timeout, md, &[], &mut out);
        out
    }

    /// Copies a message into a chunk of the engine's half and posts it on
    /// the request ring.
    pub fn post(
        &self,
        d: Descriptor,
        block: &[u8],
        wire: &[u8],
        side: &[u8],
    ) -> Result<(), Refused> {
        self.att.post(d, block, wire, side).map_err(|e| match e {
            PostError::Busy(_) => Refused::Busy,
            PostError::Gone(st) | PostError::Invalid(st) => Refused::Gone(st),
            PostError::TooLarge(_) => Refused::TooLarge,
        })
    }

    /// Ends a call on the engine's side, as the proxy's guard does
    /// (`cancel`: method and service, when the call did not end with its
    /// status), then drops its queue.
    pub fn close_call(&self, call: Call, cancel: Option<(u32, u8)>) {
        self.att.close_call(call.id, cancel);
    }

    /// The drain loop's step: takes up to `max` descriptors from the
    /// response ring, detaching at the first violation. Returns how many.
    pub fn take(&mut self, max: usize) -> usize {
        attachment::take(&self.att, &mut self.responses, max)
    }

    /// Posts what the engine owes the application (cancels, releases).
    pub fn flush(&self) {
        self.att.flush();
    }

    /// Whether the engine owes the application something.
    pub fn owes(&self) -> bool {
        self.att.owes()
    }

    /// What the engine owes the application: cancels, and the chunks of
    /// its half whose release is still to be posted.
    pub fn owed(&self) -> (usize, Vec<u32>) {
        self.att.owed()
    }

    /// The watchdog's look: requests posted, and how many from `from` on
    /// the application has taken (`Err` for a scribbled ring).
    pub fn progress(&self, from: u64) -> (u64, Result<u64, protoplane_shm::PushError>) {
        self.att.progress(from)
    }

    /// Descriptors taken from the response ring so far (the position the
    /// next one is expected at).
    pub fn taken(&self) -> u64 {
        self.responses.consumed()
    }
}

/// The engine's schema of the `versions` fuzz target (and its seeds).
pub const VERSIONS_PROTO: &str = r#"
syntax = "proto3";
package kv;
message Key { string name = 1; }
message Meta { int64 version = 1; map<string, Meta> children = 2; }
message Value { string name = 1; int64 version = 2; Meta meta = 3; repeated Key keys = 4; }
service Store {
  rpc Get(Key) returns (Value);
  rpc Put(Value) returns (Key);
  rpc Watch(Key) returns (stream Value);
}
"#;

/// The `versions` target: an application's descriptor set (any bytes)
/// built into a schema and judged against [`VERSIONS_PROTO`]. Never
/// panics; a schema that builds is compatible with itself, every service
/// of it; a verdict against the engine's schema is the same both times it
/// is asked.
pub fn versions(data: &[u8]) {
    use std::sync::OnceLock;
    static OURS: OnceLock<Arc<protoplane_grpc::Schema>> = OnceLock::new();
    let ours = OURS.get_or_init(|| {
        let src = [protoplane_schema::ProtoSource { name: "kv.proto", text: VERSIONS_PROTO }];
        Arc::new(protoplane_grpc::Schema::from_proto_sources(&src, &["kv.proto"]).expect("schema"))
    });
    let Ok(theirs) = protoplane_grpc::Schema::from_descriptor_set(data) else { return };
    let theirs = Arc::new(theirs);
    for s in theirs.services() {
        assert!(
            crate::versions::compatible(&theirs, &theirs, s).is_ok(),
            "a schema is compatible with itself ({s})"
        );
        let once = crate::versions::compatible(ours, &theirs, s).map(|_| ());
        let twice = crate::versions::compatible(ours, &theirs, s).map(|_| ());
        assert_eq!(once, twice);
    }
}
