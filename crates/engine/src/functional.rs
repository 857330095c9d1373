//! Functional offload (PsPIN-style): methods answered inside the engine.
//!
//! A method marked for offload never reaches an application: the engine
//! decodes its request, runs a handler on the engine thread that took the
//! call, encodes the handler's response and ends the call. The attached
//! application is neither woken nor told (no descriptor crosses its
//! rings), and the method is answered even while no application is
//! attached. Every other method of the service still goes to the
//! application.
//!
//! Handlers are [`Offloaded`] implementations: registered in code with
//! [`FunctionalOffload::register`], or built in and named in the engine's
//! configuration file:
//!
//! ```toml
//! [offload]
//! # Answered in the engine: by the handler registered in code for the
//! # path if there is one, else by the built-in handler for the path.
//! methods = ["/socialnetwork.SocialNetwork/Login"]
//! # Requests larger than this many bytes cross to the application as
//! # received, undecoded (see `FunctionalOffload::raw_above`: only for
//! # applications whose handlers decode raw messages themselves).
//! raw_above = 1048576
//!
//! [offload.handlers]
//! # A built-in handler by name, for any method of the right shape.
//! "/shop.Accounts/SignIn" = "login-token"
//! "/shop.Accounts/Ping" = "empty"
//! ```
//!
//! Built-in handlers ([`FunctionalOffload::builtin`]):
//!
//! * `login-token`: the social network's `Login`. The request has an
//!   integer `req_id` and a string `username`, the response a string
//!   `token`; the token is `t{req_id}-{username}`, byte for byte what the
//!   example application's handler answers
//!   (`examples/socialnetwork/src/lib.rs`), so a client cannot tell who
//!   answered. The default for `/socialnetwork.SocialNetwork/Login`.
//! * `empty`: a response with no field set (an acknowledgement).
//!
//! Only unary methods can be offloaded. The engine checks at start that
//! every offloaded method exists in its schemas, is unary and fits its
//! handler ([`Offloaded::check`]); a configuration that does not is
//! refused. At run time: a request that does not decode ends with
//! INVALID_ARGUMENT (as it would on its way to the application), a
//! handler's error is the call's status, and a handler that panics ends
//! its call with INTERNAL while the engine goes on serving.
//!
//! Handlers run inline on the engine's runtime threads: they must be short
//! and must not block (the PsPIN model: a few microseconds of work on the
//! message, no I/O).
//!
//! Counting: [`crate::Running::counters`] has, per method path, the calls
//! opened with an application ([`MethodStats::to_app`]) and the calls
//! answered in the engine by outcome ([`MethodStats::offloaded`],
//! `offload_errors`, `offload_invalid`, `offload_panics`). The health
//! service still reports a service by its attached applications: with
//! none attached it is NOT_SERVING although its offloaded methods answer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use protoplane_grpc::{Code, Message, Metadata, Method, Peer, Schema, Status};
use protoplane_schema::{Kind, TableSet};
use protoplane_wire::{Block, Builder, Decoder, MessageView, Value};

/// The well-known path the `login-token` built-in answers by default.
pub const SOCIAL_NETWORK_LOGIN: &str = "/socialnetwork.SocialNetwork/Login";

/// One request as an offloaded handler sees it.
#[derive(Debug)]
pub struct OffloadRequest<'a> {
    /// The method called.
    pub method: &'a Method,
    /// The request, decoded (view mode: strings reference its wire bytes).
    pub message: &'a Message,
    /// A dynamic view of the request.
    pub view: MessageView<'a>,
    /// The tables of the method's schema.
    pub tables: &'a TableSet,
    /// Custom metadata the client sent.
    pub metadata: &'a Metadata,
    /// The client's connection, where the transport knows it.
    pub peer: Option<&'a Peer>,
}

impl<'a> OffloadRequest<'a> {
    /// A builder for the method's response type (what [`Offloaded::call`]
    /// returns a block of).
    pub fn builder(&self) -> Result<Builder<'a>, Status> {
        Builder::new(self.tables, self.method.output).map_err(Status::from)
    }
}

/// A handler that answers a method inside the engine.
///
/// `call` runs on an engine thread, inline: keep it short and never block.
/// A panic is caught (the call ends with INTERNAL).
pub trait Offloaded: Send + Sync {
    /// Answers one request with a response block of the method's output
    /// type (see [`OffloadRequest::builder`]), or ends the call with a
    /// status.
    fn call(&self, request: &OffloadRequest<'_>) -> Result<Block, Status>;

    /// Whether the handler can answer `method` (its request and response
    /// types have the fields it uses); checked once, when the engine
    /// starts. The default accepts any method.
    fn check(&self, method: &Method, tables: &TableSet) -> Result<(), String> {
        let _ = (method, tables);
        Ok(())
    }
}

/// Which methods the engine answers itself, and with what.
#[derive(Clone, Default)]
pub struct FunctionalOffload {
    /// Handlers registered in code, by method path (each one offloads it).
    registered: HashMap<String, Arc<dyn Offloaded>>,
    /// Method paths the configuration marks (registered or built-in).
    methods: Vec<String>,
    /// Built-in handlers chosen by name, by method path.
    named: HashMap<String, String>,
    /// Requests larger than this many bytes (wire size, after
    /// decompression) cross to the application as received, undecoded:
    /// the engine neither decodes nor checks them, and the application's
    /// handler gets a raw [`Message`] (`Message::is_raw`) to decode itself
    /// (`Message::decode`, INVALID_ARGUMENT on failure). Only for
    /// applications whose handlers do that: `protoplane-app` passes such
    /// a message through as is, and a generated typed view of it fails
    /// (INTERNAL). Engine-wide, every proxied method; `None` (the
    /// default): the engine decodes every request. Offloaded methods are
    /// always decoded in the engine.
    pub raw_above: Option<usize>,
}

impl std::fmt::Debug for FunctionalOffload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut registered: Vec<&String> = self.registered.keys().collect();
        registered.sort();
        f.debug_struct("FunctionalOffload")
            .field("registered", &registered)
            .field("methods", &self.methods)
            .field("named", &self.named)
            .field("raw_above", &self.raw_above)
            .finish()
    }
}

impl FunctionalOffload {
    /// Nothing offloaded.
    pub fn new() -> FunctionalOffload {
        FunctionalOffload::default()
    }

    /// Answers `method_path` (`/package.Service/Method`) with `handler`
    /// inside the engine, from the engine's start on. Replaces a handler
    /// registered or named for the same path before.
    pub fn register(
        &mut self,
        method_path: impl Into<String>,
        handler: Arc<dyn Offloaded>,
    ) -> &mut Self {
        let path = method_path.into();
        self.named.remove(&path);
        self.registered.insert(path, handler);
        self
    }

    /// Marks `method_path` for offload: the handler registered for it, or
    /// else its default built-in handler (as `[offload] methods`).
    pub fn offload(&mut self, method_path: impl Into<String>) -> &mut Self {
        let path = method_path.into();
        if !self.methods.contains(&path) {
            self.methods.push(path);
        }
        self
    }

    /// Answers `method_path` with the built-in handler called `builtin`
    /// (as `[offload.handlers]`); the name is checked when the engine
    /// starts.
    pub fn offload_with(
        &mut self,
        method_path: impl Into<String>,
        builtin: impl Into<String>,
    ) -> &mut Self {
        let path = method_path.into();
        self.registered.remove(&path);
        self.named.insert(path, builtin.into());
        self
    }

    /// Whether any method is offloaded.
    pub fn is_empty(&self) -> bool {
        self.registered.is_empty() && self.methods.is_empty() && self.named.is_empty()
    }

    /// The built-in handler called `name`: `login-token` or `empty`.
    pub fn builtin(name: &str) -> Option<Arc<dyn Offloaded>> {
        match name {
            "login-token" => Some(Arc::new(LoginToken)),
            "empty" => Some(Arc::new(EmptyReply)),
            _ => None,
        }
    }

    /// The built-in handler a method path gets when it is only marked.
    fn default_for(path: &str) -> Option<&'static str> {
        (path == SOCIAL_NETWORK_LOGIN).then_some("login-token")
    }

    /// Every offloaded method's handler, by path, checked against
    /// `schemas`: each method exists, is unary and fits its handler.
    pub fn resolve(
        &self,
        schemas: &[Arc<Schema>],
    ) -> Result<HashMap<String, Arc<dyn Offloaded>>, crate::Error> {
        self.resolve_paths(schemas).map_err(crate::Error::Offload)
    }

    fn resolve_paths(
        &self,
        schemas: &[Arc<Schema>],
    ) -> Result<HashMap<String, Arc<dyn Offloaded>>, String> {
        let known = |path: &String| -> Result<(), String> {
            match schemas.iter().any(|s| s.method_id(path).is_some()) {
                true => Ok(()),
                false => Err(format!("offload: no schema of the engine has method {path}")),
            }
        };
        let paths = self.registered.keys().chain(self.named.keys()).chain(&self.methods);
        paths.map(known).collect::<Result<Vec<()>, String>>()?;
        let mut out: HashMap<String, Arc<dyn Offloaded>> = HashMap::new();
        for (path, h) in &self.registered {
            out.insert(path.clone(), h.clone());
        }
        for (path, name) in &self.named {
            let h = FunctionalOffload::builtin(name).ok_or_else(|| {
                format!("offload: {path}: no built-in handler {name:?} (login-token, empty)")
            })?;
            out.insert(path.clone(), h);
        }
        for path in &self.methods {
            if out.contains_key(path) {
                continue;
            }
            let h = FunctionalOffload::default_for(path).and_then(FunctionalOffload::builtin);
            let h = h.ok_or_else(|| {
                format!(
                    "offload: {path}: no handler registered for it and no built-in default \
                     (name one under [offload.handlers])"
                )
            })?;
            out.insert(path.clone(), h);
        }
        for (path, h) in &out {
            let (schema, id) = schemas
                .iter()
                .find_map(|s| s.method_id(path).map(|id| (s, id)))
                .ok_or_else(|| format!("offload: no schema of the engine has method {path}"))?;
            let m = schema
                .method(id)
                .ok_or_else(|| format!("offload: no schema of the engine has method {path}"))?;
            if m.client_streaming || m.server_streaming {
                return Err(format!(
                    "offload: {path} is {}; only unary methods are answered in the engine",
                    m.kind()
                ));
            }
            h.check(m, schema.tables()).map_err(|e| format!("offload: {path}: {e}"))?;
        }
        Ok(out)
    }
}

/// Per-method call counters.
#[derive(Debug, Default)]
pub struct MethodStats {
    /// Calls opened with an application (posted on its ring).
    pub to_app: AtomicU64,
    /// Calls answered in the engine with a response.
    pub offloaded: AtomicU64,
    /// Offloaded calls whose handler returned an error status.
    pub offload_errors: AtomicU64,
    /// Offloaded calls whose request did not decode (INVALID_ARGUMENT).
    pub offload_invalid: AtomicU64,
    /// Offloaded calls whose handler panicked (INTERNAL).
    pub offload_panics: AtomicU64,
    /// Requests handed to the application undecoded (larger than
    /// `raw_above`).
    pub raw_to_app: AtomicU64,
}

impl MethodStats {
    /// Offloaded calls of every outcome: answered in the engine, none of
    /// them seen by an application.
    pub fn answered_in_engine(&self) -> u64 {
        [&self.offloaded, &self.offload_errors, &self.offload_invalid, &self.offload_panics]
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

/// The engine's per-method counters, by method path, for every method of
/// the services it serves for applications.
#[derive(Debug, Default)]
pub struct Counters {
    by_path: HashMap<String, Arc<MethodStats>>,
}

impl Counters {
    pub(crate) fn insert(&mut self, path: String, stats: Arc<MethodStats>) {
        self.by_path.insert(path, stats);
    }

    /// Every method's counters, by path, sorted.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &MethodStats)> {
        let mut all: Vec<_> = self.by_path.iter().map(|(p, s)| (p.as_str(), &**s)).collect();
        all.sort_by_key(|(p, _)| *p);
        all.into_iter()
    }

    /// The counters of the method at `path` (`/package.Service/Method`).
    pub fn get(&self, path: &str) -> Option<&MethodStats> {
        self.by_path.get(path).map(|s| &**s)
    }

    /// Calls of `path` opened with an application (0 for an unknown path).
    pub fn to_app(&self, path: &str) -> u64 {
        self.get(path).map_or(0, |s| s.to_app.load(Ordering::Relaxed))
    }

    /// Calls of `path` answered in the engine, every outcome (0 for an
    /// unknown path).
    pub fn answered_in_engine(&self, path: &str) -> u64 {
        self.get(path).map_or(0, MethodStats::answered_in_engine)
    }

    /// Every method path with counters, sorted.
    pub fn paths(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.by_path.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }
}

thread_local! {
    /// Each engine thread's decoder for offloaded requests.
    static DECODER: std::cell::RefCell<Decoder> = std::cell::RefCell::new(Decoder::new());
}

/// Answers one offloaded call: decodes the request (unless the transport
/// did), runs the handler with panics caught, counts the outcome. The
/// response block, checked to be of the method's output type.
pub(crate) fn answer(
    handler: &dyn Offloaded,
    schema: &Schema,
    method: &Method,
    message: Message,
    metadata: &Metadata,
    peer: Option<&Peer>,
    stats: &MethodStats,
) -> Result<Block, Status> {
    let tables = schema.tables();
    let message = if message.is_raw() {
        let (wire, input) = (message.wire().clone(), message.type_index());
        let decoded = DECODER.with(|d| Message::decode(tables, input, wire, &mut d.borrow_mut()));
        match decoded {
            Ok(m) => m,
            Err(e) => {
                stats.offload_invalid.fetch_add(1, Ordering::Relaxed);
                return Err(protoplane_grpc::call::invalid_request(e));
            }
        }
    } else {
        message
    };
    let view = message.view(tables)?;
    let request = OffloadRequest { method, message: &message, view, tables, metadata, peer };
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.call(&request)));
    match ran {
        Ok(Ok(block)) if block.type_index().is_some_and(|t| t != method.output) => {
            stats.offload_errors.fetch_add(1, Ordering::Relaxed);
            Err(Status::new(
                Code::Internal,
                format!("the engine's handler for {} answered with another type", method.path),
            ))
        }
        Ok(Ok(block)) => {
            stats.offloaded.fetch_add(1, Ordering::Relaxed);
            Ok(block)
        }
        Ok(Err(st)) => {
            stats.offload_errors.fetch_add(1, Ordering::Relaxed);
            if st.code == Code::Ok {
                return Err(Status::new(
                    Code::Internal,
                    format!("the engine's handler for {} failed with status OK", method.path),
                ));
            }
            Err(st)
        }
        Err(_) => {
            stats.offload_panics.fetch_add(1, Ordering::Relaxed);
            Err(Status::new(
                Code::Internal,
                format!("the engine's handler for {} panicked", method.path),
            ))
        }
    }
}

/// The field called `name` of message type `index`, if it is singular and
/// of one of `kinds`.
fn field_of(tables: &TableSet, index: u32, name: &str, kinds: &[Kind]) -> Result<u32, String> {
    let msg = tables.messages().get(index as usize).ok_or("no such message type")?;
    let f = tables
        .field_by_name(msg, name)
        .ok_or_else(|| format!("{} has no field {name}", tables.str(msg.name)))?;
    if f.is_repeated() || !kinds.contains(&f.kind) {
        return Err(format!("{}.{name} is not a singular {kinds:?}", tables.str(msg.name)));
    }
    Ok(f.number)
}

const INTEGERS: &[Kind] = &[
    Kind::Int64,
    Kind::UInt64,
    Kind::Int32,
    Kind::UInt32,
    Kind::SInt32,
    Kind::SInt64,
    Kind::Fixed32,
    Kind::Fixed64,
    Kind::SFixed32,
    Kind::SFixed64,
];

/// `login-token`: `token = "t{req_id}-{username}"`, as the example
/// application's `Login` answers.
#[derive(Debug)]
struct LoginToken;

impl Offloaded for LoginToken {
    fn check(&self, method: &Method, tables: &TableSet) -> Result<(), String> {
        field_of(tables, method.input, "req_id", INTEGERS)?;
        field_of(tables, method.input, "username", &[Kind::String])?;
        field_of(tables, method.output, "token", &[Kind::String])?;
        Ok(())
    }

    fn call(&self, request: &OffloadRequest<'_>) -> Result<Block, Status> {
        let v = &request.view;
        let req_id = v.by_name("req_id")?.and_then(|x| x.as_i128()).unwrap_or(0);
        let username = v.by_name("username")?.and_then(|x| x.as_str()).unwrap_or("");
        let token = format!("t{req_id}-{username}");
        let number = field_of(request.tables, request.method.output, "token", &[Kind::String])
            .map_err(|e| Status::new(Code::Internal, e))?;
        let mut b = request.builder()?;
        b.set(b.root(), number, Value::String(token.as_bytes()))?;
        Ok(b.finish())
    }
}

/// `empty`: a response with no field set.
#[derive(Debug)]
struct EmptyReply;

impl Offloaded for EmptyReply {
    fn call(&self, request: &OffloadRequest<'_>) -> Result<Block, Status> {
        Ok(request.builder()?.finish())
    }
}
