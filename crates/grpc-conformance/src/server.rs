//! `protoplane-grpc-conformance server`: `ConformanceService` on
//! protoplane's gRPC server, for the runner's `--mode server`.
//!
//! The runner writes one `ServerCompatRequest` on stdin (TLS or not, the
//! client certificate to require, the message size limit); we start a
//! [`Router`] on an ephemeral port of 127.0.0.1, answer with a
//! `ServerCompatResponse` on stdout, and serve until the runner ends the
//! process (SIGTERM). Its reference clients (connect-go and grpc-go) then
//! call the service, whose requests say how to answer: which headers,
//! trailers, data or error, after which delay.
//!
//! The behaviour follows the runner's `docs/testing_servers.md` and its
//! grpc-go reference server: each answer echoes what the server saw of the
//! call (`RequestInfo`: the custom request metadata, the time left before
//! the deadline, the requests as `Any`s) in the first response or, when
//! the call fails before any response, as an error detail. Headers go out
//! explicitly as soon as a response definition is known (for a half-duplex
//! stream, once the upload is complete) so a client can read them before
//! the first response, or before an error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protoplane_grpc::rich::Any;
use protoplane_grpc::{
    BoxFuture, Code, Message, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::{Router, ServerOptions};
use protoplane_wire::{Block, Builder, MessageBuilder, MessageView, Value};

use crate::delimited;
use crate::schema::{self, Conformance, Packed, Rpc, SERVICE};

/// `Protocol.PROTOCOL_GRPC` and `HTTPVersion.HTTP_VERSION_2`.
const PROTOCOL_GRPC: i128 = 2;
const HTTP_VERSION_2: i128 = 2;

/// Where the server listens (the runner's clients run on this host).
const HOST: &str = "127.0.0.1";

pub(crate) fn run(split: bool) -> Result<(), String> {
    let rt = crate::runtime()?;
    rt.block_on(async {
        let c = Conformance::load()?;
        let mut stdin = tokio::io::stdin();
        let bytes = delimited::read(&mut stdin)
            .await?
            .ok_or("stdin ended before a ServerCompatRequest arrived")?;
        let start = Start::read(&c, bytes)?;
        // Checked before the runner hears the server is up.
        // Mutual TLS when asked: refuse clients without a certificate
        // issued by the one the runner's client presents.
        let client_ca = Some(&start.client_ca[..]).filter(|ca| !ca.is_empty());
        let tls = start
            .tls
            .as_ref()
            .map(|(cert, key)| protoplane_rpc::tls::server_config_with(cert, key, client_ca));
        let tls = tls.transpose().map_err(|e| format!("TLS: {e}"))?;
        let mut opts = ServerOptions::default();
        if start.receive_limit > 0 {
            opts.max_recv_message = start.receive_limit;
        }
        let service = Arc::new(ConformanceServer { c });
        let types = service.c.types;
        let (port, serving) = if split {
            split_engine(&start, opts, service.clone()).await?
        } else {
            let router = Arc::new(Router::new(opts).add_service(service.clone()));
            let listener = tokio::net::TcpListener::bind((HOST, 0))
                .await
                .map_err(|e| format!("listen on {HOST}: {e}"))?;
            let port = listener.local_addr().map_err(|e| e.to_string())?.port();
            let serving: BoxFuture<'static, Result<(), String>> = Box::pin(async move {
                let served = match tls {
                    None => router.serve(listener).await,
                    Some(config) => router.serve_tls(listener, config).await,
                };
                served.map_err(|e| format!("serve: {e}"))
            });
            (port, serving)
        };

        // Answer the runner before serving: it connects only after reading it.
        let mut b = Builder::new(service.c.schema.tables(), types.server_compat_response)
            .map_err(|e| e.to_string())?;
        let root = b.root();
        let w = |e: protoplane_wire::BuildError| e.to_string();
        b.set(root, 1, Value::String(HOST.as_bytes())).map_err(w)?;
        b.set(root, 2, Value::U32(u32::from(port))).map_err(w)?;
        if let Some((cert, _)) = &start.tls {
            b.set(root, 3, Value::Bytes(cert)).map_err(w)?;
        }
        let out = service.c.encode(types.server_compat_response, &b.finish())?;
        crate::write_stdout(&delimited::frame(&out)?).await?;
        eprintln!(
            "protoplane conformance server on {HOST}:{port} (split: {split}, tls: {}, client certs: {}, receive limit: {})",
            start.tls.is_some(),
            !start.client_ca.is_empty(),
            start.receive_limit
        );
        serving.await
    })
}

/// Split mode: a protoplane engine in this process serves gRPC (TLS and
/// client certificates as asked) and the conformance service runs as an
/// application attached to it over shared memory, as `protoplane engine`
/// and `serve --attach` would run on one machine. Returns the engine's
/// gRPC port and a future that runs the application until it fails.
async fn split_engine(
    start: &Start,
    opts: ServerOptions,
    service: Arc<ConformanceServer>,
) -> Result<(u16, BoxFuture<'static, Result<(), String>>), String> {
    let dir = std::env::temp_dir().join(format!("pp-conformance-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).map(|()| p).map_err(|e| format!("{name}: {e}"))
    };
    let tls = match &start.tls {
        None => None,
        Some((cert, key)) => Some((write("server.pem", cert)?, write("server.key", key)?)),
    };
    let tls_client_ca = match start.client_ca.is_empty() {
        true => None,
        false => Some(write("client-ca.pem", &start.client_ca)?),
    };
    let attach = dir.join("engine.sock");
    let config = protoplane_engine::Config {
        grpc: Some((std::net::Ipv4Addr::LOCALHOST, 0).into()),
        tls,
        tls_client_ca,
        attach: attach.clone(),
        schemas: vec![service.c.schema.clone()],
        server: opts,
        half_mb: 8,
        ..protoplane_engine::Config::default()
    };
    let engine = protoplane_engine::start(config).await.map_err(|e| e.to_string())?;
    let port = engine.grpc.ok_or("the engine did not listen for gRPC")?.port();
    let registry = engine.registry.clone();
    let app = protoplane_app::attach(&attach).service(service);
    let running: BoxFuture<'static, Result<(), String>> = Box::pin(async move {
        // The engine lives as long as the application it serves.
        let _engine = engine;
        app.run().await.map_err(|e| e.to_string())
    });
    let until = Instant::now() + Duration::from_secs(10);
    let app = tokio::spawn(running);
    while registry.pick(SERVICE).is_none() {
        if Instant::now() > until || app.is_finished() {
            return Err("the application did not attach to the engine".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok((port, Box::pin(async move { app.await.map_err(|e| e.to_string())? })))
}

/// What the runner asks of the server.
struct Start {
    /// PEM certificate and key, for TLS.
    tls: Option<(Vec<u8>, Vec<u8>)>,
    /// PEM certificate client certificates must be issued by (empty: no
    /// client certificates).
    client_ca: Vec<u8>,
    /// Largest request message (0: the default).
    receive_limit: usize,
}

impl Start {
    fn read(c: &Conformance, bytes: Vec<u8>) -> Result<Start, String> {
        let bad = |e: &dyn std::fmt::Display| format!("ServerCompatRequest: {e}");
        let m = Message::decode(
            c.schema.tables(),
            c.types.server_compat_request,
            Bytes::from(bytes),
            &mut protoplane_wire::Decoder::new(),
        )
        .map_err(|e| bad(&e))?;
        let v = m.view(c.schema.tables()).map_err(|e| bad(&e))?;
        let protocol = schema::int(&v, 1).map_err(|e| bad(&e))?;
        let version = schema::int(&v, 2).map_err(|e| bad(&e))?;
        if protocol != PROTOCOL_GRPC {
            return Err(bad(&format!("protocol {protocol}: this server speaks gRPC only (2)")));
        }
        if version != HTTP_VERSION_2 && version != 0 {
            return Err(bad(&format!("HTTP version {version}: gRPC runs over HTTP/2 only")));
        }
        let use_tls = schema::int(&v, 4).map_err(|e| bad(&e))? != 0;
        let client_ca = schema::bytes(&v, 5).map_err(|e| bad(&e))?.to_vec();
        let receive_limit = schema::int(&v, 6).map_err(|e| bad(&e))?;
        let tls = match (use_tls, schema::sub(&v, 7).map_err(|e| bad(&e))?) {
            (false, _) => None,
            (true, None) => return Err(bad(&"use_tls without server_creds")),
            (true, Some(creds)) => Some((
                schema::bytes(&creds, 1).map_err(|e| bad(&e))?.to_vec(),
                schema::bytes(&creds, 2).map_err(|e| bad(&e))?.to_vec(),
            )),
        };
        if tls.is_none() && !client_ca.is_empty() {
            return Err(bad(&"client_tls_cert without use_tls"));
        }
        Ok(Start { tls, client_ca, receive_limit: usize::try_from(receive_limit).unwrap_or(0) })
    }
}

/// The service.
struct ConformanceServer {
    c: Conformance,
}

/// What the server saw of a call, echoed back in `RequestInfo`.
struct Seen {
    headers: Metadata,
    timeout_ms: Option<i64>,
}

impl Seen {
    /// Taken when the handler starts: the time left is measured then, as
    /// close to the client's sending it as the handler can be.
    fn of<T>(req: &Request<T>) -> Seen {
        let left = req.deadline.map(|d| d.saturating_duration_since(Instant::now()));
        Seen {
            headers: req.metadata.clone(),
            timeout_ms: left.map(|t| i64::try_from(t.as_millis()).unwrap_or(i64::MAX)),
        }
    }
}

/// How much of the `RequestInfo` a response carries.
enum Info<'a> {
    /// None (the later responses of a stream).
    Nothing,
    /// Everything: metadata, timeout and the requests so far.
    Full(&'a Seen, &'a [Packed]),
    /// Only the requests since the last response (full-duplex streams).
    Requests(&'a [Packed]),
}

/// A response definition's error.
struct ErrorDef {
    code: Code,
    message: String,
    details: Vec<Packed>,
}

/// A `UnaryResponseDefinition` or `StreamResponseDefinition`, read into
/// owned values (the handlers keep them across awaits).
struct Definition {
    headers: Metadata,
    trailers: Metadata,
    /// The responses' data: one for a unary definition that has data,
    /// none for one with an error.
    data: Vec<Bytes>,
    error: Option<ErrorDef>,
    delay: Duration,
}

fn internal(what: impl std::fmt::Display) -> Status {
    Status::new(Code::Internal, format!("reading the request: {what}"))
}

impl ErrorDef {
    fn read(v: &MessageView<'_>) -> Result<ErrorDef, Status> {
        let code = schema::int(v, 1)?;
        Ok(ErrorDef {
            code: Code::from_u32(u32::try_from(code).unwrap_or(u32::MAX)),
            message: schema::text(v, 2)?.unwrap_or("").to_string(),
            details: schema::messages(v, 3)?
                .iter()
                .map(Packed::read)
                .collect::<Result<Vec<_>, _>>()?,
        })
    }
}

impl Definition {
    /// Field numbers differ between the two kinds of definition.
    fn read(v: &MessageView<'_>, streaming: bool) -> Result<Definition, Status> {
        let (trailers, delay) = if streaming { (5, 3) } else { (4, 6) };
        let data = if streaming {
            schema::each(v, 2)?
                .iter()
                .map(|d| Bytes::copy_from_slice(d.as_bytes().unwrap_or(&[])))
                .collect()
        } else {
            // A oneof: data only when it is the member set.
            v.by_number(2)?
                .and_then(|d| d.as_bytes())
                .map(|d| vec![Bytes::copy_from_slice(d)])
                .unwrap_or_default()
        };
        let error = schema::sub(v, if streaming { 4 } else { 3 })?;
        Ok(Definition {
            headers: schema::metadata(v, 1).map_err(internal)?,
            trailers: schema::metadata(v, trailers).map_err(internal)?,
            data,
            error: error.map(|e| ErrorDef::read(&e)).transpose()?,
            delay: Duration::from_millis(u64::try_from(schema::int(v, delay)?).unwrap_or(u64::MAX)),
        })
    }
}

impl ConformanceServer {
    fn tables(&self) -> &protoplane_schema::TableSet {
        self.c.schema.tables()
    }

    /// The response definition of a request (field 1 of every request
    /// type); `stream`: a `StreamResponseDefinition`.
    fn definition(&self, v: &MessageView<'_>, stream: bool) -> Result<Option<Definition>, Status> {
        schema::sub(v, 1)?.map(|d| Definition::read(&d, stream)).transpose()
    }

    /// A received request as an `Any`: its bytes exactly as they arrived
    /// (unknown fields included), so the runner compares what it sent.
    fn packed(&self, m: &Message) -> Packed {
        Packed { type_url: self.c.type_url(m.type_index()), value: m.wire().clone() }
    }

    fn put_info(
        &self,
        b: &mut Builder<'_>,
        at: MessageBuilder,
        info: &Info<'_>,
    ) -> Result<(), Status> {
        let (seen, requests) = match *info {
            Info::Nothing => return Ok(()),
            Info::Full(seen, requests) => (Some(seen), requests),
            Info::Requests(requests) => (None, requests),
        };
        if let Some(seen) = seen {
            schema::put_metadata(b, at, 1, &seen.headers)?;
            if let Some(t) = seen.timeout_ms {
                b.set(at, 2, Value::I64(t))?;
            }
        }
        for r in requests {
            schema::put_any(b, at, 3, r)?;
        }
        Ok(())
    }

    /// A response (any of the service's, all `{ConformancePayload payload = 1}`).
    fn response(&self, out: &Responder, data: &[u8], info: Info<'_>) -> Result<Block, Status> {
        let mut b = Builder::new(self.tables(), out.output_type())?;
        let root = b.root();
        let payload = b.message(root, 1)?;
        b.set(payload, 1, Value::Bytes(data))?;
        if !matches!(info, Info::Nothing) {
            let at = b.message(payload, 2)?;
            self.put_info(&mut b, at, &info)?;
        }
        Ok(b.finish())
    }

    /// The `RequestInfo` as an error detail.
    fn info_detail(&self, seen: &Seen, requests: &[Packed]) -> Result<Packed, Status> {
        let ty = self.c.types.request_info;
        let mut b = Builder::new(self.tables(), ty)?;
        let root = b.root();
        self.put_info(&mut b, root, &Info::Full(seen, requests))?;
        let bytes = self.c.encode(ty, &b.finish()).map_err(|e| Status::new(Code::Internal, e))?;
        Ok(Packed { type_url: self.c.type_url(ty), value: Bytes::from(bytes) })
    }

    /// The status a definition's error describes: its code and message,
    /// its details and then `extra` (the `RequestInfo`, when no response
    /// carried it) in `grpc-status-details-bin`, `trailers` as trailers.
    fn status(error: ErrorDef, extra: Option<Packed>, trailers: Metadata) -> Status {
        let details = error
            .details
            .into_iter()
            .chain(extra)
            .map(|p| Any { type_url: p.type_url, value: p.value.to_vec() })
            .collect();
        let mut st = Status::with_any_details(error.code, error.message, details);
        st.metadata = trailers;
        st
    }

    /// Sets the definition's headers and sends them now.
    async fn headers_now(out: &mut Responder, def: &Definition) -> Result<(), Status> {
        *out.metadata_mut() = def.headers.clone();
        out.send_headers().await
    }

    /// `Unary` and `IdempotentUnary`.
    async fn unary(
        &self,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> Result<Metadata, Status> {
        let seen = Seen::of(&req);
        let m = req.message.single().await?;
        out.set_compression(m.was_compressed());
        let v = m.view(self.tables())?;
        let def = self.definition(&v, false)?;
        let requests = [self.packed(&m)];
        self.answer_once(def, &seen, &requests, out).await
    }

    async fn client_stream(
        &self,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> Result<Metadata, Status> {
        let seen = Seen::of(&req);
        let mut def = None;
        let mut requests = Vec::new();
        while let Some(m) = req.message.message().await {
            if requests.is_empty() {
                // Only the first request's definition counts.
                out.set_compression(m.was_compressed());
                let v = m.view(self.tables())?;
                def = self.definition(&v, false)?;
            }
            requests.push(self.packed(&m));
        }
        self.answer_once(def, &seen, &requests, out).await
    }

    /// The one answer of a unary or client-streaming call.
    async fn answer_once(
        &self,
        def: Option<Definition>,
        seen: &Seen,
        requests: &[Packed],
        mut out: Responder,
    ) -> Result<Metadata, Status> {
        let Some(mut def) = def else {
            // No definition: an empty payload with the request info.
            out.send(self.response(&out, &[], Info::Full(seen, requests))?).await?;
            return Ok(Metadata::new());
        };
        Self::headers_now(&mut out, &def).await?;
        let trailers = std::mem::take(&mut def.trailers);
        if let Some(error) = def.error.take() {
            let info = self.info_detail(seen, requests)?;
            tokio::time::sleep(def.delay).await;
            return Err(Self::status(error, Some(info), trailers));
        }
        let data = def.data.first().cloned().unwrap_or_default();
        let block = self.response(&out, &data, Info::Full(seen, requests))?;
        tokio::time::sleep(def.delay).await;
        out.send(block).await?;
        Ok(trailers)
    }

    async fn server_stream(
        &self,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> Result<Metadata, Status> {
        let seen = Seen::of(&req);
        let m = req.message.single().await?;
        out.set_compression(m.was_compressed());
        let v = m.view(self.tables())?;
        let Some(def) = self.definition(&v, true)? else {
            return Ok(Metadata::new());
        };
        let requests = [self.packed(&m)];
        Self::headers_now(&mut out, &def).await?;
        let mut sent = 0;
        self.stream_rest(def, &seen, &requests, &mut sent, out).await
    }

    async fn bidi_stream(
        &self,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> Result<Metadata, Status> {
        let seen = Seen::of(&req);
        let mut def: Option<Definition> = None;
        let mut full_duplex = false;
        let mut first = true;
        let mut sent = 0;
        let mut requests = Vec::new();
        while let Some(m) = req.message.message().await {
            requests.push(self.packed(&m));
            if first {
                first = false;
                out.set_compression(m.was_compressed());
                let v = m.view(self.tables())?;
                def = self.definition(&v, true)?;
                full_duplex = schema::int(&v, 2)? != 0;
                if let (Some(d), true) = (&def, full_duplex) {
                    Self::headers_now(&mut out, d).await?;
                }
            }
            if !full_duplex {
                continue;
            }
            // Full duplex: one response per request while there are
            // responses to send; then the error, if any, ends the call.
            let Some(d) = &def else { break };
            let Some(data) = d.data.get(sent) else { break };
            let info = match sent {
                0 => Info::Full(&seen, &requests),
                _ => Info::Requests(&requests),
            };
            let block = self.response(&out, data, info)?;
            tokio::time::sleep(d.delay).await;
            out.send(block).await?;
            sent += 1;
            requests.clear();
        }
        let Some(def) = def else { return Ok(Metadata::new()) };
        if !full_duplex {
            // Half duplex: nothing goes out before the upload is complete.
            Self::headers_now(&mut out, &def).await?;
        }
        self.stream_rest(def, &seen, &requests, &mut sent, out).await
    }

    /// Sends a streaming definition's responses from number `sent` on (the
    /// first one sent carries the whole `RequestInfo`), then ends the call
    /// with its error or its trailers.
    async fn stream_rest(
        &self,
        mut def: Definition,
        seen: &Seen,
        requests: &[Packed],
        sent: &mut usize,
        mut out: Responder,
    ) -> Result<Metadata, Status> {
        while let Some(data) = def.data.get(*sent) {
            let info = if *sent == 0 { Info::Full(seen, requests) } else { Info::Nothing };
            let block = self.response(&out, data, info)?;
            tokio::time::sleep(def.delay).await;
            out.send(block).await?;
            *sent += 1;
        }
        let trailers = std::mem::take(&mut def.trailers);
        match def.error.take() {
            None => Ok(trailers),
            Some(error) => {
                let info = match *sent {
                    0 => Some(self.info_detail(seen, requests)?),
                    _ => None,
                };
                Err(Self::status(error, info, trailers))
            }
        }
    }
}

impl Service for ConformanceServer {
    fn schema(&self) -> &Arc<Schema> {
        &self.c.schema
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
        Box::pin(async move {
            match self.c.rpc(method) {
                Some(Rpc::Unary | Rpc::IdempotentUnary) => self.unary(request, responder).await,
                Some(Rpc::ServerStream) => self.server_stream(request, responder).await,
                Some(Rpc::ClientStream) => self.client_stream(request, responder).await,
                Some(Rpc::BidiStream) => self.bidi_stream(request, responder).await,
                // Not implemented, by the test's definition.
                Some(Rpc::Unimplemented) | None => Err(Status::new(
                    Code::Unimplemented,
                    format!("{SERVICE}/Unimplemented is not implemented"),
                )),
            }
        })
    }
}
