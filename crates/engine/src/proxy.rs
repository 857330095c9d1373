//! The engine's stand-in for a service whose handlers run in attached
//! application processes.
//!
//! To the transports (gRPC over HTTP/2, lean) a [`SplitService`] is an
//! ordinary [`Service`]: they terminate the connection, parse headers,
//! deframe, decompress and decode exactly as in monolithic mode, then call
//! it. Instead of running a handler it picks an attached instance of the
//! service, posts the request's descriptor on that application's ring and
//! relays what comes back — initial metadata, response blocks (encoded by
//! the transport straight from the region), the status. Deadlines and
//! cancellation stay the transports' job: when they drop the call, its
//! guard tells the application to stop.
//!
//! Methods marked for functional offload ([`crate::functional`]) never
//! reach an application: the proxy answers them itself, with no
//! descriptor on any ring.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_shm::desc::{self, Descriptor};

use crate::attachment::events::Inbound;
use crate::attachment::{Attachment, PostError};
use crate::device::Placed;
use crate::functional::{self, MethodStats, Offloaded};
use crate::policy::{CallInfo, Permit, Policies};
use crate::registry::Registry;
use protoplane_seam::engine::timeout_ns;
use protoplane_seam::OpenRepr;

/// Bounds on what waits for an application.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Calls open with one application instance; beyond, RESOURCE_EXHAUSTED.
    pub max_in_flight: u64,
    /// Posts waiting for room in a full ring or region, across the engine;
    /// beyond, RESOURCE_EXHAUSTED at once.
    pub max_waiting: usize,
    /// How long a post waits for room before RESOURCE_EXHAUSTED.
    pub queue_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_in_flight: 4096, max_waiting: 1024, queue_timeout: Duration::from_millis(500) }
    }
}

/// A service served by attached applications.
pub struct SplitService {
    schema: Arc<Schema>,
    name: String,
    registry: Arc<Registry>,
    limits: Arc<Limits>,
    waiting: Arc<AtomicUsize>,
    /// Counters, by method id (every method of the schema; those of other
    /// services stay 0).
    stats: Vec<Arc<MethodStats>>,
    /// Handlers of the methods answered in the engine, by method id.
    offloaded: Vec<Option<Arc<dyn Offloaded>>>,
    /// Requests larger than this cross to the application undecoded.
    raw_above: Option<usize>,
    /// Field placement (RPCAcc), when attachments have a device.
    placed: Option<Arc<Placed>>,
    /// The engine's policy, checked before anything else.
    policies: Option<Arc<Policies>>,
}

impl std::fmt::Debug for SplitService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SplitService").field("name", &self.name).finish_non_exhaustive()
    }
}

impl SplitService {
    /// The stand-in for service `name` of `schema`.
    pub fn new(
        schema: Arc<Schema>,
        name: String,
        registry: Arc<Registry>,
        limits: Arc<Limits>,
        waiting: Arc<AtomicUsize>,
    ) -> SplitService {
        let n = schema.methods().len();
        let stats = (0..n).map(|_| Arc::default()).collect();
        SplitService {
            schema,
            name,
            registry,
            limits,
            waiting,
            stats,
            offloaded: vec![None; n],
            raw_above: None,
            placed: None,
            policies: None,
        }
    }

    /// Answers method `method` (an id of the schema, of this service, unary)
    /// with `handler` inside the engine from now on: its calls never reach
    /// an application. `false` if the method is not one this service can
    /// answer so.
    pub fn offload(&mut self, method: u32, handler: Arc<dyn Offloaded>) -> bool {
        let Some(m) = self.schema.method(method) else { return false };
        if m.service != self.name || m.client_streaming || m.server_streaming {
            return false;
        }
        match self.offloaded.get_mut(method as usize) {
            Some(slot) => {
                *slot = Some(handler);
                true
            }
            None => false,
        }
    }

    /// Hands requests larger than `bytes` to the application as received,
    /// undecoded (`None`: decode every request in the engine). The
    /// application's handler then sees a raw [`protoplane_grpc::Message`]
    /// (`is_raw`) and decodes it itself.
    pub fn set_raw_above(&mut self, bytes: Option<usize>) {
        self.raw_above = bytes;
    }

    /// Decodes requests with placement ([`crate::device`]) from now on:
    /// those whose type has device-placed fields go to the attachment's
    /// device region and the rest of the message in one copy. `None`:
    /// every request in the shared region, as received.
    pub fn set_placement(&mut self, placed: Option<Arc<Placed>>) {
        self.placed = placed;
    }

    /// Checks every call against `policies` ([`crate::policy`]) before it
    /// goes anywhere, offloaded calls included.
    pub fn set_policies(&mut self, policies: Arc<Policies>) {
        self.policies = Some(policies);
    }

    /// The placement (move fields to and from the device at run time
    /// through its table).
    pub fn placement(&self) -> Option<&Arc<Placed>> {
        self.placed.as_ref()
    }

    /// The counters of method `method` (an id of the schema).
    pub fn method_stats(&self, method: u32) -> Option<&Arc<MethodStats>> {
        self.stats.get(method as usize)
    }

    /// Answers an offloaded call in the engine: nothing crosses to an
    /// application.
    async fn answer_here(
        self: Arc<Self>,
        method: u32,
        handler: Arc<dyn Offloaded>,
        request: Request<Streaming>,
        mut responder: Responder,
    ) -> Result<Metadata, Status> {
        let Request { metadata, peer, message: mut requests, .. } = request;
        let m = requests.single().await?;
        let (Some(desc), Some(stats)) =
            (self.schema.method(method), self.stats.get(method as usize))
        else {
            return Err(Status::new(Code::Unimplemented, "unknown method"));
        };
        let block = functional::answer(
            &*handler,
            &self.schema,
            desc,
            m,
            &metadata,
            peer.as_deref(),
            stats,
        )?;
        responder.send(block).await?;
        Ok(Metadata::new())
    }

    /// A call's way through the engine: admitted, posted to an
    /// instance's ring with its request, then relaying what the
    /// application sends back until its status.
    ///
    /// Every call's state is this future, boxed once by the transport, so
    /// its size is a cost per call: glibc serves blocks up to 1,032 bytes
    /// from its per-thread cache and larger ones from its sorted bins
    /// (`_int_malloc`, `malloc_consolidate`: 7–10% of the engine's CPU when
    /// this future was 1,456 bytes). So the common case (a request in
    /// hand, an instance attached, room in its ring) awaits nothing but
    /// the application's events, and whatever else might wait (an instance
    /// still attaching, a full ring, a full stream, explicit headers,
    /// client streaming, offloaded methods) waits in a box of its own.
    /// It is an `async` block rather than an `async fn` for the same
    /// reason: the arguments are used where the block captured them,
    /// where an `async fn` keeps a second copy of each.
    // Not an `async fn`: see above (clippy would have one).
    #[allow(clippy::manual_async_fn)]
    fn forward(
        self: Arc<Self>,
        method: u32,
        mut request: Request<Streaming>,
        mut responder: Responder,
    ) -> impl std::future::Future<Output = Result<Metadata, Status>> + Send + 'static {
        async move {
            let rare = self.schema.method(method).is_none_or(|d| d.client_streaming)
                || self.offloaded.get(method as usize).is_some_and(Option::is_some);
            if rare {
                return Box::pin(self.forward_any(method, request, responder)).await;
            }
            let desc = self
                .schema
                .method(method)
                .ok_or_else(|| Status::new(Code::Unimplemented, "unknown method"))?;
            let _permit = self.admit(&desc.path, &request)?;
            let m = match request.message.try_single() {
                Some(m) => m?,
                None => return Err(Status::new(Code::Internal, "no request in hand")),
            };
            let att = self.attachment_for(Some(m.wire().as_ref())).await?;
            let (mut call, side) = self.open(&att, method, &request)?;
            let d =
                Descriptor { flags: desc::OPEN | desc::MESSAGE | desc::END | z(&m), ..call.open };
            let version = call.version.as_deref();
            let p = Post { att: &att, version, engine_method: method, d, m: Some(&m), side: &side };
            if let Some(r) = self.post_now(p)? {
                Box::pin(self.post_retry(p, r)).await?;
            }
            drop(m);
            call.posted(&self);
            loop {
                match call.rx.recv().await {
                    None => return Err(crate::attachment::unavailable("the call's queue closed")),
                    Some(Inbound::Headers(md)) => {
                        *responder.metadata_mut() = md;
                        Box::pin(responder.send_headers()).await?;
                    }
                    Some(Inbound::Staged(md)) => *responder.metadata_mut() = md,
                    Some(Inbound::Message { bytes, encoded, compress }) => {
                        responder.set_compression(compress);
                        if encoded || call.version.is_some() || att.device().is_some() {
                            let v = call.version.as_deref();
                            let r = &mut responder;
                            let m = call.method;
                            Box::pin(self.send_other(&att, v, m, bytes, encoded, r)).await?;
                        } else if let Some(bytes) = responder.try_send_linear(bytes)? {
                            // A stream whose client is behind: wait for room.
                            Box::pin(responder.send_linear(bytes)).await?;
                        }
                    }
                    Some(Inbound::Status(st)) => {
                        call.guard.done = true;
                        return if st.code == Code::Ok { Ok(st.metadata) } else { Err(st) };
                    }
                }
            }
        }
    }

    /// Checks the call against the engine's policy; the permit counts it
    /// against the concurrency limits that admitted it until dropped.
    fn admit(&self, path: &str, request: &Request<Streaming>) -> Result<Permit, Status> {
        match &self.policies {
            Some(p) => p.admit(&CallInfo {
                path,
                service: &self.name,
                metadata: &request.metadata,
                peer: request.peer.as_deref(),
            }),
            None => Ok(Permit::default()),
        }
    }

    /// An instance to take a call whose request is `holder` (the instance
    /// whose region it was received into, a lean landing, takes it without
    /// a copy), waiting for one that is attaching (this engine is taking
    /// over).
    async fn attachment_for(&self, holder: Option<&[u8]>) -> Result<Arc<Attachment>, Status> {
        let mut att = self.registry.pick_for(&self.name, holder);
        if att.is_none() && Box::pin(self.registry.wait_attached(&self.name)).await {
            att = self.registry.pick_for(&self.name, holder);
        }
        let att = att.ok_or_else(|| match self.registry.ever_served(&self.name) {
            true => {
                Status::new(Code::Unavailable, format!("no application attached for {}", self.name))
            }
            false => Status::new(Code::Unimplemented, format!("unknown service {}", self.name)),
        })?;
        if att.in_flight() >= self.limits.max_in_flight {
            return Err(Status::new(
                Code::ResourceExhausted,
                "too many calls open with the application",
            ));
        }
        Ok(att)
    }

    /// Opens method `method`'s call (an id of the engine's schema) with
    /// `att`: its entry in the instance's table, its guard, and the OPEN
    /// descriptor's side data (deadline, metadata, certificates, the
    /// client's address the first time) in the returned buffer.
    fn open(
        &self,
        att: &Arc<Attachment>,
        method: u32,
        request: &Request<Streaming>,
    ) -> Result<(OpenCall, Vec<u8>), Status> {
        let service = att.services.iter().position(|s| *s == self.name).unwrap_or(0) as u8;
        // The instance's own version of the service, if it brought one: its
        // method ids and tables, not the engine's (`crate::versions`).
        let version = att.version(service).cloned();
        let app_method = match &version {
            Some(v) => v.method(method).ok_or_else(|| {
                Status::new(
                    Code::Unimplemented,
                    format!("this instance's version of {} does not serve the method", self.name),
                )
            })?,
            None => method,
        };
        let (call, rx) = att.open_call()?;
        // The client's connection, by its slot; its address rides along
        // until the application has it (`crate::attachment::peers`).
        let client = att.peer_take(request.peer.as_ref());
        let guard = Guard {
            att: att.clone(),
            call,
            method: app_method,
            service,
            peer_slot: client.slot,
            done: false,
        };
        let mut side = Vec::new();
        let now = Instant::now();
        OpenRepr::emit_open(
            request.deadline.map(|d| d.saturating_duration_since(now)),
            &request.metadata,
            request.peer.as_ref().map_or(&[][..], |p| &p.certificates[..]),
            client.note.map(|addr| (client.slot, addr)),
            &mut side,
        );
        let open = Descriptor {
            call,
            method: app_method,
            service,
            flags: desc::OPEN,
            // OPEN has no status: its code field names the client's
            // connection slot.
            code: client.slot,
            timeout_ns: timeout_ns(request.deadline, now),
            ..Descriptor::default()
        };
        let noted = client.note.is_some();
        let opened =
            OpenCall { version, rx, guard, open, method: app_method, engine_method: method, noted };
        Ok((opened, side))
    }

    /// Any call: what [`SplitService::forward`] hands the kinds it does
    /// not take itself (client streaming, offloaded methods).
    async fn forward_any(
        self: Arc<Self>,
        method: u32,
        request: Request<Streaming>,
        mut responder: Responder,
    ) -> Result<Metadata, Status> {
        let desc = self
            .schema
            .method(method)
            .ok_or_else(|| Status::new(Code::Unimplemented, "unknown method"))?;
        let client_streaming = desc.client_streaming;
        let _permit = self.admit(&desc.path, &request)?;
        if let Some(h) = self.offloaded.get(method as usize).and_then(Option::clone) {
            return self.answer_here(method, h, request, responder).await;
        }
        // A unary request is here already: the instance whose region it
        // was received into (a lean landing) takes it without a copy.
        let mut request = request;
        let first = if client_streaming { None } else { Some(request.message.single().await?) };
        let att = self.attachment_for(first.as_ref().map(|m| m.wire().as_ref())).await?;
        let (mut call, side) = self.open(&att, method, &request)?;
        let (c, app_method, service) = (call.guard.call, call.method, call.guard.service);
        let version = call.version.clone();
        let mut requests_done = !client_streaming;
        // What every post of this call shares.
        let base = Post {
            att: &att,
            version: version.as_deref(),
            engine_method: method,
            d: call.open,
            m: None,
            side: &[],
        };
        if let Some(m) = first {
            let d =
                Descriptor { flags: desc::OPEN | desc::MESSAGE | desc::END | z(&m), ..call.open };
            self.post(Post { d, m: Some(&m), side: &side, ..base }).await?;
        } else {
            self.post(Post { side: &side, ..base }).await?;
        }
        call.posted(&self);
        let requests = &mut request.message;
        loop {
            tokio::select! {
                biased;
                ev = call.rx.recv() => match ev {
                    None => return Err(crate::attachment::unavailable("the call's queue closed")),
                    Some(Inbound::Headers(md)) => {
                        *responder.metadata_mut() = md;
                        responder.send_headers().await?;
                    }
                    Some(Inbound::Staged(md)) => *responder.metadata_mut() = md,
                    Some(Inbound::Message { bytes, encoded, compress }) => {
                        responder.set_compression(compress);
                        let v = version.as_deref();
                        self.send_other(&att, v, app_method, bytes, encoded, &mut responder).await?;
                    }
                    Some(Inbound::Status(st)) => {
                        call.guard.done = true;
                        return if st.code == Code::Ok { Ok(st.metadata) } else { Err(st) };
                    }
                },
                m = requests.message(), if !requests_done => {
                    let d = Descriptor { call: c, method: app_method, service, ..Descriptor::default() };
                    match m {
                        Some(m) => {
                            let d = Descriptor { flags: desc::MESSAGE | z(&m), ..d };
                            self.post(Post { d, m: Some(&m), ..base }).await?;
                        }
                        None => {
                            requests_done = true;
                            let end = Descriptor { flags: desc::END, ..d };
                            self.post(Post { d: end, ..base }).await?;
                        }
                    }
                }
            }
        }
    }

    /// Sends a response that is not a block of the engine's layout: bytes
    /// the application encoded, a block of another version of the schema
    /// (encoded here with its tables), or one with device handles.
    async fn send_other(
        &self,
        att: &Attachment,
        version: Option<&crate::versions::Version>,
        method: u32,
        bytes: bytes::Bytes,
        encoded: bool,
        responder: &mut Responder,
    ) -> Result<(), Status> {
        if let (false, Some(v)) = (encoded, version) {
            // Laid out with the application's tables.
            let ty = v.schema.method(method).map_or(u32::MAX, |m| m.output);
            let mut out = Vec::with_capacity(bytes.len());
            protoplane_wire::Encoder::new().encode_into(
                v.schema.tables(),
                ty,
                protoplane_wire::Source::owned(&bytes),
                &protoplane_wire::EncodeOptions::default(),
                &mut out,
            )?;
            responder.send_encoded(bytes::Bytes::from(out)).await
        } else if let (false, Some(dev)) = (encoded, att.device()) {
            // Device handles resolve here, in the engine (co-serialization):
            // then the call's device memory can go.
            let ty = self.schema.method(method).map_or(u32::MAX, |m| m.output);
            let wire = dev.encode(self.schema.tables(), ty, &bytes)?;
            responder.send_encoded(wire).await
        } else if encoded {
            responder.send_encoded(bytes).await
        } else {
            responder.send_linear(bytes).await
        }
    }

    /// Posts a descriptor with its message (decoded straight into the
    /// region if the transport left it raw), waiting a bounded time for
    /// room.
    async fn post(&self, p: Post<'_>) -> Result<(), Status> {
        match self.post_now(p)? {
            None => Ok(()),
            Some(r) => Box::pin(self.post_retry(p, r)).await,
        }
    }

    /// [`SplitService::post`] without waiting: `Some` when the ring or
    /// the region is full, with what to try again with
    /// ([`SplitService::post_retry`]).
    fn post_now(&self, p: Post<'_>) -> Result<Option<Retry>, Status> {
        // Placement-aware decode, once: device-placed fields into the
        // call's device memory, the rest into a private block that crosses
        // in one copy (the one-shot commit). Not for another version: the
        // placement tables are the engine's.
        let placed =
            match (p.m.filter(|m| m.is_raw() && p.version.is_none()), p.att.device(), &self.placed)
            {
                (Some(m), Some(dev), Some(pl)) => match pl.for_type(m.type_index()) {
                    Some(ts) => Some(dev.decode(p.d.call, &ts, m.type_index(), m.wire())?),
                    None => None,
                },
                _ => None,
            };
        match self.try_post(p, placed.as_ref()) {
            Err(PostError::Busy(what)) => Ok(Some(Retry { what, placed })),
            other => self.posted(p.att, other).map(|()| None),
        }
    }

    /// Waits for room for a post [`SplitService::post_now`] could not make.
    async fn post_retry(&self, p: Post<'_>, r: Retry) -> Result<(), Status> {
        let placed = r.placed.as_ref();
        self.post_wait(p.att, r.what, || self.try_post(p, placed)).await
    }

    /// One attempt at posting (see [`SplitService::post`]).
    fn try_post(
        &self,
        p: Post<'_>,
        placed: Option<&protoplane_wire::Block>,
    ) -> Result<(), PostError> {
        let Post { att, version, engine_method, d, m, side } = p;
        // The tables and request type the block is laid out with.
        let (tables, input) = match version {
            Some(v) => (v.schema.tables(), v.schema.method(d.method).map(|m| m.input)),
            None => (self.schema.tables(), None),
        };
        match m {
            Some(_) if placed.is_some() => {
                att.post(d, placed.map_or(&[][..], |b| b.as_bytes()), &[], side)
            }
            Some(m) if m.is_raw() && self.raw_above.is_some_and(|n| m.wire().len() > n) => {
                // Oversized: the application decodes it itself.
                let r = att.post(d, &[], m.wire(), side);
                if let (Ok(()), Some(s)) = (&r, self.stats.get(engine_method as usize)) {
                    s.raw_to_app.fetch_add(1, Ordering::Relaxed);
                }
                r
            }
            Some(m) if m.is_raw() => {
                att.post_request(d, tables, input.unwrap_or(m.type_index()), m.wire(), side)
            }
            // Decoded by the transport with the engine's tables: another
            // version decodes it itself.
            Some(m) if version.is_some() => att.post(d, &[], m.wire(), side),
            Some(m) => att.post(d, m.block(), m.wire(), side),
            None => att.post(d, &[], &[], side),
        }
    }

    /// What a post that did not wait comes to.
    fn posted(&self, att: &Attachment, r: Result<(), PostError>) -> Result<(), Status> {
        match r {
            Ok(()) => Ok(()),
            Err(PostError::Gone(st) | PostError::Invalid(st)) => Err(st),
            Err(PostError::TooLarge(n)) => Err(Status::new(
                Code::ResourceExhausted,
                format!(
                    "a message of {n} bytes exceeds the region's largest chunk ({} bytes)",
                    att.max_chunk()
                ),
            )),
            Err(PostError::Busy(what)) => Err(busy(what)),
        }
    }

    /// Makes `attempt` again and again while the ring or the region is
    /// full, for up to the queue timeout, holding one of the engine's
    /// bounded waiting places.
    async fn post_wait(
        &self,
        att: &Attachment,
        what: &'static str,
        attempt: impl Fn() -> Result<(), PostError>,
    ) -> Result<(), Status> {
        let _slot =
            WaitSlot::take(&self.waiting, self.limits.max_waiting).ok_or_else(|| busy(what))?;
        let since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_micros(200)).await;
            match attempt() {
                Err(PostError::Busy(what)) => {
                    if since.elapsed() >= self.limits.queue_timeout {
                        return Err(busy(what));
                    }
                }
                other => return self.posted(att, other),
            }
        }
    }
}

fn busy(what: &str) -> Status {
    Status::new(Code::ResourceExhausted, format!("the application's {what} is full"))
}

/// One of the engine's bounded places to wait for room.
struct WaitSlot(Arc<AtomicUsize>);

impl WaitSlot {
    fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<WaitSlot> {
        let prev = count.fetch_add(1, Ordering::AcqRel);
        if prev >= max {
            count.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(WaitSlot(count.clone()))
    }
}

impl Drop for WaitSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One descriptor to post to an application instance, with its request.
#[derive(Clone, Copy)]
struct Post<'a> {
    att: &'a Arc<Attachment>,
    /// The instance's own version of the service, if it brought one (its
    /// method id is in `d`).
    version: Option<&'a crate::versions::Version>,
    /// The method's id in the engine's schema (the counters).
    engine_method: u32,
    d: Descriptor,
    m: Option<&'a protoplane_grpc::Message>,
    /// The OPEN descriptor's side data (empty for later descriptors).
    side: &'a [u8],
}

/// A post that found the ring or the region full: what it is waiting for,
/// and the request's placed block (decoded once) to try again with.
struct Retry {
    what: &'static str,
    placed: Option<protoplane_wire::Block>,
}

/// A call open with an application instance.
struct OpenCall {
    /// The instance's own version of the service, if it brought one.
    version: Option<Arc<crate::versions::Version>>,
    rx: crate::attachment::events::EventRx,
    guard: Guard,
    /// The OPEN descriptor, without its message flags.
    open: Descriptor,
    /// The method's id in the instance's version.
    method: u32,
    /// The method's id in the engine's schema (the counters).
    engine_method: u32,
    /// The OPEN carried the client's address.
    noted: bool,
}

impl OpenCall {
    /// After the OPEN went out.
    fn posted(&mut self, service: &SplitService) {
        if std::mem::take(&mut self.noted) {
            self.guard.att.peer_noted(self.guard.peer_slot);
        }
        if let Some(s) = service.stats.get(self.engine_method as usize) {
            s.to_app.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Ends the call on the engine's side when the proxy stops, and tells the
/// application to cancel when the call did not end with its status.
struct Guard {
    att: Arc<Attachment>,
    call: u64,
    method: u32,
    service: u8,
    /// The client connection's slot the call holds.
    peer_slot: u8,
    done: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let cancel = (!self.done).then_some((self.method, self.service));
        self.att.close_call(self.call, cancel);
        self.att.peer_done(self.peer_slot);
    }
}

impl Service for SplitService {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        &self.name
    }

    /// Requests are decoded into the application's region, not by the
    /// transport.
    fn decodes_requests(&self) -> bool {
        true
    }

    /// A chunk of an attached instance's region: the lean transport
    /// receives requests there, and they cross without a copy.
    fn landing(&self, need: usize) -> Option<protoplane_grpc::landing::Landing> {
        self.registry.pick(&self.name)?.landing(need)
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        request: Request<Streaming>,
        responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(self.forward(method, request, responder))
    }
}

/// `COMPRESS` on a request: the client sent it compressed (the engine has
/// decompressed it; the handler may ask, see `Message::was_compressed`).
fn z(m: &protoplane_grpc::Message) -> u16 {
    if m.was_compressed() {
        desc::COMPRESS
    } else {
        0
    }
}
