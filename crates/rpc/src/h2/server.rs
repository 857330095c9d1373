//! gRPC on the general-purpose `h2` crate: the server's and the client's
//! other transport, kept for comparison with protoplane's own HTTP/2
//! (`protoplane bench rpc` runs both) and selected with
//! `GrpcTransport::H2` (`protoplane serve --grpc-transport h2`). Built
//! with the `h2` cargo feature.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use protoplane_wire::Decoder;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

use protoplane_grpc::call::{Message, Out, Peer, Request, Responder, Streaming};
use protoplane_grpc::codec::{self, Encoding, ACCEPT_ENCODING};
use protoplane_grpc::frame::FrameDecoder;
use protoplane_grpc::metadata::{self, Metadata};
use protoplane_grpc::schema::Schema;
use protoplane_grpc::status::{self, Code, Status};
use protoplane_grpc::timeout;

use crate::server::{deadline_exceeded, same_service, Router};

impl Router {
    /// Serves one connection on the `h2` crate.
    pub(crate) async fn serve_h2<IO>(self: Arc<Self>, io: IO, peer: Arc<Peer>)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let o = self.options();
        let handshake = h2::server::Builder::new()
            .max_concurrent_streams(o.max_concurrent_streams)
            .initial_window_size(o.stream_window)
            .initial_connection_window_size(o.connection_window)
            .max_header_list_size(o.max_header_list)
            .max_send_buffer_size(1 << 20)
            // Streams a client resets before the server accepts them (HTTP/2
            // "rapid reset", CVE-2023-44487): beyond this many pending, the
            // connection is closed. h2's default (20) also closes on
            // ordinary clients whose short deadlines expire in bulk.
            .max_pending_accept_reset_streams(200)
            .handshake::<IO, Bytes>(io);
        let Ok(Ok(mut conn)) = tokio::time::timeout(Duration::from_secs(10), handshake).await
        else {
            return;
        };
        // `accept` also drives the connection (reads frames, flushes
        // writes); a protocol error from the client ends it with GOAWAY.
        // When the router drains, h2's graceful shutdown sends GOAWAY and
        // `accept` ends once the streams taken have ended.
        let mut draining = Some(self.drain().started_boxed());
        loop {
            let next = match &mut draining {
                Some(d) => tokio::select! {
                    next = conn.accept() => next,
                    () = d => {
                        draining = None;
                        conn.graceful_shutdown();
                        continue;
                    }
                },
                None => conn.accept().await,
            };
            let Some(Ok((req, respond))) = next else { break };
            let r = self.clone();
            let peer = peer.clone();
            tokio::spawn(async move { r.serve_call(req, respond, peer).await });
        }
    }

    async fn serve_call(
        self: Arc<Self>,
        req: http::Request<RecvStream>,
        respond: SendResponse<Bytes>,
        peer: Arc<Peer>,
    ) {
        let mut out = Outbound::new(respond, self.options().max_send_message);
        let (parts, body) = req.into_parts();
        if parts.method != http::Method::POST {
            out.http_error(StatusCode::METHOD_NOT_ALLOWED);
            return;
        }
        // gRPC over HTTP/2: a request that is not gRPC gets HTTP 415 (so
        // no HTTP client mistakes an answer for success); one in a codec
        // this server does not speak is refused, never decoded as protobuf.
        match codec::content_type(
            parts.headers.get(http::header::CONTENT_TYPE).map(|v| v.as_bytes()),
        ) {
            codec::ContentType::Proto => {}
            codec::ContentType::NotGrpc => {
                out.http_error(StatusCode::UNSUPPORTED_MEDIA_TYPE);
                return;
            }
            codec::ContentType::OtherCodec(name) => {
                out.finish(
                    Status::new(
                        Code::Unimplemented,
                        format!("unsupported codec {name:?}: only protobuf is served"),
                    ),
                    &Metadata::new(),
                );
                return;
            }
        }
        let Some(route) = self.routes.get(parts.uri.path()) else {
            let path = parts.uri.path();
            let msg = match self.routes.keys().any(|p| same_service(p, path)) {
                true => format!("unknown method {path}"),
                false => format!("unknown service {path}"),
            };
            out.finish(Status::new(Code::Unimplemented, msg), &Metadata::new());
            return;
        };
        let encoding = match parts.headers.get("grpc-encoding") {
            None => Encoding::Identity,
            Some(v) => match Encoding::from_header(v.as_bytes()) {
                Some(e) => e,
                None => {
                    let name = String::from_utf8_lossy(v.as_bytes()).into_owned();
                    out.finish(
                        Status::new(
                            Code::Unimplemented,
                            format!("unsupported grpc-encoding {name}"),
                        ),
                        &Metadata::new(),
                    );
                    return;
                }
            },
        };
        out.gzip_ok =
            codec::accepts_gzip(parts.headers.get("grpc-accept-encoding").map(|v| v.as_bytes()));
        let deadline = match parts.headers.get("grpc-timeout") {
            None => None,
            Some(v) => match timeout::parse(v.as_bytes()) {
                Some(d) => Some(Instant::now() + d),
                None => {
                    out.finish(
                        Status::new(Code::Internal, "malformed grpc-timeout"),
                        &Metadata::new(),
                    );
                    return;
                }
            },
        };
        let metadata = match metadata_from_headers(&parts.headers) {
            Ok(m) => m,
            Err(e) => {
                out.finish(Status::new(Code::Internal, e.to_string()), &Metadata::new());
                return;
            }
        };
        let service = self.services[route.service].clone();
        let schema = service.schema().clone();
        let Some(method) = schema.method(route.method) else { return };
        let mut inbound = Inbound {
            body,
            frames: FrameDecoder::new(self.options().max_recv_message),
            encoding,
            limit: self.options().max_recv_message,
            decoder: Decoder::new(),
            schema: schema.clone(),
            input: method.input,
            raw: service.decodes_requests(),
            done: false,
        };
        out.schema = Some((schema.clone(), method.output));

        let mut deadline_timer = Timer { deadline, sleep: None };
        let (req_tx, streaming) = if method.client_streaming {
            let (tx, rx) = mpsc::channel(self.options().request_queue.max(1));
            (Some(tx), Streaming::queue(rx))
        } else {
            // Unary and server streaming: the request is read and decoded
            // before the handler runs, so a bad request never reaches it.
            // Biased, request first: when it is already here (the usual
            // case) the reset check and the timer are never polled, so the
            // timer is never even registered.
            let first = tokio::select! {
                biased;
                r = inbound.single() => r,
                _ = poll_fn(|cx| out.poll_reset(cx)) => return,
                _ = until(&mut deadline_timer) => Err(deadline_exceeded()),
            };
            match first {
                Ok(m) => (None, Streaming::one(m)),
                Err(st) => {
                    out.finish(st, &Metadata::new());
                    return;
                }
            }
        };
        // A streaming response goes through a queue; a single one through a
        // one-shot slot read when the handler is done.
        let (responder, mut rx, mut single) = if method.server_streaming {
            let (tx, rx) = mpsc::channel(self.options().response_queue.max(1));
            (Responder::stream(tx, method.output), Some(rx), None)
        } else {
            let (tx, rx) = tokio::sync::oneshot::channel();
            (
                Responder::unary(tx, method.output),
                None,
                Some(protoplane_grpc::call::UnarySlot::new(rx)),
            )
        };
        let request = Request { metadata, deadline, peer: Some(peer), message: streaming };
        let mut handler = Some(Box::pin(crate::deadline::scoped(
            deadline,
            service.call(route.method, request, responder),
        )));
        let mut req_tx = req_tx;
        let mut pending: VecDeque<Message> = VecDeque::new();
        let mut outcome: Option<Result<Metadata, Status>> = None;
        let mut responses_open = rx.is_some();
        let reading_limit = self.options().request_queue.max(1);

        loop {
            if outcome.is_some() && !responses_open {
                break;
            }
            enum Ev {
                Reset,
                Deadline,
                Out(Option<Out>),
                Done(Result<Metadata, Status>),
                Read(Result<bool, Status>),
                Forwarded,
                Early(Metadata),
            }
            let reading = req_tx.is_some() && !inbound.done && pending.len() < reading_limit;
            // A busy call (always something to read or send) must still
            // meet its deadline: check the clock, not only the timer.
            if deadline.is_some_and(|d| Instant::now() >= d) {
                drop(handler.take());
                out.finish(deadline_exceeded(), &Metadata::new());
                return;
            }
            // Biased, work first: a call that completes without waiting
            // never polls the reset check or the timer (the timer is then
            // never registered, which is most of its cost).
            let ev = tokio::select! {
                biased;
                r = async { handler.as_mut().expect("polled only while present").await }, if handler.is_some() => Ev::Done(r),
                o = async { match rx.as_mut() { Some(rx) => rx.recv().await, None => None } }, if responses_open => Ev::Out(o),
                md = async { single.as_mut().expect("polled only while present").early_headers().await }, if single.is_some() && outcome.is_none() => Ev::Early(md),
                r = inbound.read_into(&mut pending), if reading => Ev::Read(r),
                p = async { req_tx.as_ref().expect("present").reserve().await }, if req_tx.is_some() && !pending.is_empty() => {
                    if let (Ok(permit), Some(m)) = (p, pending.pop_front()) {
                        permit.send(m);
                    }
                    Ev::Forwarded
                }
                _ = poll_fn(|cx| out.poll_reset(cx)) => Ev::Reset,
                _ = until(&mut deadline_timer) => Ev::Deadline,
            };
            match ev {
                // The client cancelled: dropping the handler cancels it.
                Ev::Reset => return,
                Ev::Deadline => {
                    drop(handler.take());
                    out.finish(deadline_exceeded(), &Metadata::new());
                    return;
                }
                Ev::Out(None) => responses_open = false,
                Ev::Out(Some(item)) => {
                    // A client that stops reading blocks this send on flow
                    // control: the deadline still ends the call.
                    let sent = tokio::select! {
                        r = out.send(item) => r,
                        _ = until(&mut deadline_timer) => Err(deadline_exceeded()),
                    };
                    if let Err(st) = sent {
                        drop(handler.take());
                        out.abort(st);
                        return;
                    }
                }
                Ev::Done(r) => {
                    handler = None;
                    outcome = Some(r);
                }
                Ev::Early(md) => {
                    if let Err(st) = out.send(Out::Headers(md)).await {
                        drop(handler.take());
                        out.abort(st);
                        return;
                    }
                }
                Ev::Read(Ok(_)) | Ev::Forwarded => {}
                Ev::Read(Err(st)) => {
                    if st.code == Code::Cancelled {
                        return;
                    }
                    drop(handler.take());
                    out.finish(st, &Metadata::new());
                    return;
                }
            }
            // The request stream ended and everything was handed over: the
            // handler sees the end of its requests.
            if inbound.done && pending.is_empty() {
                req_tx = None;
            }
        }
        if let Some(slot) = single.as_mut() {
            let (early, one) = slot.finish();
            if let Some(md) = early {
                let _ = out.send(Out::Headers(md)).await;
            }
            if let Some(md) = one.headers {
                let _ = out.send(Out::Staged(md)).await;
            }
            if let Some(item) = one.message.filter(|_| matches!(outcome, Some(Ok(_)))) {
                let sent = tokio::select! {
                    r = out.send(item) => r,
                    _ = until(&mut deadline_timer) => Err(deadline_exceeded()),
                };
                if let Err(st) = sent {
                    out.abort(st);
                    return;
                }
            }
        }
        match outcome {
            Some(Ok(trailers)) => out.finish(Status::ok(), &trailers),
            Some(Err(st)) => {
                let md = st.metadata.clone();
                out.finish(st, &md)
            }
            None => {}
        }
    }
}

/// A call's deadline timer, made only when first waited on: a call that
/// never has to wait pays neither the allocation nor the timer wheel.
struct Timer {
    deadline: Option<Instant>,
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

/// Waits for the deadline (forever when there is none).
async fn until(timer: &mut Timer) {
    let Some(d) = timer.deadline else { return std::future::pending().await };
    timer.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(d.into()))).as_mut().await
}

/// The engine's receive side of a call.
struct Inbound {
    body: RecvStream,
    frames: FrameDecoder,
    encoding: Encoding,
    limit: usize,
    decoder: Decoder,
    schema: Arc<Schema>,
    input: u32,
    /// The service decodes requests itself.
    raw: bool,
    done: bool,
}

impl Inbound {
    /// Reads one DATA frame (or the end) and decodes every message it
    /// completes into `pending`. `Ok(false)` at the end of the stream.
    async fn read_into(&mut self, pending: &mut VecDeque<Message>) -> Result<bool, Status> {
        match self.body.data().await {
            None => {
                self.done = true;
                self.frames.finish().map_err(|e| e.status())?;
                Ok(false)
            }
            Some(Err(e)) => {
                self.done = true;
                Err(h2_status(&e))
            }
            Some(Ok(chunk)) => {
                let _ = self.body.flow_control().release_capacity(chunk.len());
                let mut frames = Vec::new();
                self.frames.push(chunk, &mut frames).map_err(|e| e.status())?;
                for f in frames {
                    let z = f.compressed;
                    let payload = codec::frame_payload(f, self.encoding, self.limit)?;
                    let mut m = Message::decode_request(
                        self.schema.tables(),
                        self.input,
                        payload,
                        &mut self.decoder,
                        self.raw,
                    )?;
                    m.set_compressed(z);
                    pending.push_back(m);
                }
                Ok(true)
            }
        }
    }

    /// The one request of a unary or server-streaming call: exactly one
    /// message, then the end of the stream.
    async fn single(&mut self) -> Result<Message, Status> {
        let mut got = VecDeque::new();
        while !self.done {
            self.read_into(&mut got).await?;
            if got.len() > 1 {
                return Err(Status::new(
                    Code::Unimplemented,
                    "more than one request message for a method that takes one",
                ));
            }
        }
        got.pop_front().ok_or_else(|| Status::new(Code::Unimplemented, "no request message"))
    }
}

/// Maps a stream error to the call's status.
pub(crate) fn h2_status(e: &h2::Error) -> Status {
    match e.reason() {
        Some(h2::Reason::CANCEL) => Status::new(Code::Cancelled, "the peer cancelled the call"),
        Some(h2::Reason::REFUSED_STREAM) => {
            Status::new(Code::Unavailable, "the peer refused the stream")
        }
        Some(h2::Reason::ENHANCE_YOUR_CALM) => {
            Status::new(Code::ResourceExhausted, "the peer asked to slow down")
        }
        Some(h2::Reason::INADEQUATE_SECURITY) => {
            Status::new(Code::PermissionDenied, "inadequate security")
        }
        _ if e.is_io() => Status::new(Code::Unavailable, format!("connection error: {e}")),
        _ if e.is_go_away() => Status::new(Code::Unavailable, format!("connection closing: {e}")),
        _ => Status::new(Code::Internal, format!("HTTP/2 error: {e}")),
    }
}

/// The engine's send side of a call.
struct Outbound {
    respond: Option<SendResponse<Bytes>>,
    stream: Option<SendStream<Bytes>>,
    headers_sent: bool,
    initial: Metadata,
    gzip_ok: bool,
    limit: usize,
    schema: Option<(Arc<Schema>, u32)>,
}

impl Outbound {
    fn new(respond: SendResponse<Bytes>, limit: usize) -> Outbound {
        Outbound {
            respond: Some(respond),
            stream: None,
            headers_sent: false,
            initial: Metadata::new(),
            gzip_ok: false,
            limit,
            schema: None,
        }
    }

    fn poll_reset(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let r = match (&mut self.stream, &mut self.respond) {
            (Some(s), _) => s.poll_reset(cx),
            (None, Some(r)) => r.poll_reset(cx),
            (None, None) => return Poll::Pending,
        };
        r.map(|_| ())
    }

    fn base_headers(&self) -> Response<()> {
        let mut resp = Response::new(());
        let h = resp.headers_mut();
        h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert("grpc-accept-encoding", HeaderValue::from_static(ACCEPT_ENCODING));
        resp
    }

    fn send_headers(&mut self) -> Result<(), Status> {
        if self.headers_sent {
            return Ok(());
        }
        let mut resp = self.base_headers();
        if self.gzip_ok {
            resp.headers_mut().insert("grpc-encoding", HeaderValue::from_static("gzip"));
        }
        write_headers(&self.initial, resp.headers_mut());
        let Some(mut respond) = self.respond.take() else {
            return Err(Status::new(Code::Internal, "response already started"));
        };
        let stream = respond.send_response(resp, false).map_err(|e| h2_status(&e))?;
        self.stream = Some(stream);
        self.headers_sent = true;
        Ok(())
    }

    /// Sends one item from the handler, waiting for flow-control credit.
    async fn send(&mut self, item: Out) -> Result<(), Status> {
        let frame = match item {
            // Sent explicitly: a HEADERS frame leaves now, so the client
            // sees the metadata before any message (and the call no longer
            // ends trailers-only).
            Out::Headers(md) => {
                if !self.headers_sent {
                    self.initial = md;
                    self.send_headers()?;
                }
                return Ok(());
            }
            // Staged: goes with the first message, or with the end.
            Out::Staged(md) => {
                if !self.headers_sent {
                    self.initial = md;
                }
                return Ok(());
            }
            Out::Encoded(bytes, z) => codec::frame_message(&bytes, z && self.gzip_ok, self.limit)?,
            Out::Block(block, z) => {
                let Some((schema, output)) = &self.schema else {
                    return Err(Status::new(Code::Internal, "no response type"));
                };
                let (gz, limit) = (z && self.gzip_ok, self.limit);
                codec::with_encoded(schema.tables(), *output, &block, |bytes| {
                    codec::frame_message(bytes, gz, limit)
                })??
            }
        };
        self.send_headers()?;
        let Some(stream) = self.stream.as_mut() else {
            return Err(Status::new(Code::Internal, "no response stream"));
        };
        write_data(stream, frame).await
    }

    /// Ends the call with `status` (trailers, or a trailers-only response
    /// when nothing was sent yet and the handler set no headers).
    fn finish(&mut self, status: Status, trailers: &Metadata) {
        if !self.headers_sent && !self.initial.is_empty() {
            // Headers the handler set go as headers (as grpc-go does).
            let _ = self.send_headers();
        }
        let mut h = HeaderMap::new();
        h.insert("grpc-status", HeaderValue::from_static(status.code.header_value()));
        if !status.message.is_empty() {
            if let Ok(v) = HeaderValue::from_str(&status::encode_message(&status.message)) {
                h.insert("grpc-message", v);
            }
        }
        if !status.details.is_empty() {
            if let Ok(v) = HeaderValue::from_str(&metadata::encode_binary(&status.details)) {
                h.insert(status::DETAILS_KEY, v);
            }
        }
        write_headers(trailers, &mut h);
        if let Some(stream) = self.stream.as_mut() {
            let _ = stream.send_trailers(h);
            return;
        }
        // Trailers-only: one HEADERS frame with END_STREAM.
        let mut resp = self.base_headers();
        write_headers(&self.initial, resp.headers_mut());
        resp.headers_mut().extend(h);
        if let Some(mut respond) = self.respond.take() {
            let _ = respond.send_response(resp, true);
        }
    }

    /// Ends a call whose response could not be sent: a reset when the
    /// stream may hold part of a message (trailers cannot follow it), the
    /// status otherwise; nothing when the client is gone.
    fn abort(&mut self, st: Status) {
        match (st.code, self.stream.as_mut()) {
            (Code::Cancelled, _) => {}
            (Code::DeadlineExceeded, Some(s)) => s.send_reset(h2::Reason::CANCEL),
            _ => self.finish(st, &Metadata::new()),
        }
    }

    /// A plain HTTP error (not a gRPC request at all).
    fn http_error(&mut self, code: StatusCode) {
        if let Some(mut respond) = self.respond.take() {
            let mut resp = Response::new(());
            *resp.status_mut() = code;
            let _ = respond.send_response(resp, true);
        }
    }
}

/// Writes `data` as DATA frames as flow-control credit arrives: h2 would
/// otherwise buffer all of it, and a client that stops reading could make
/// the server hold any amount of output.
pub(crate) async fn write_data(
    stream: &mut SendStream<Bytes>,
    mut data: Bytes,
) -> Result<(), Status> {
    while !data.is_empty() {
        stream.reserve_capacity(data.len());
        let got = poll_fn(|cx| stream.poll_capacity(cx)).await;
        let n = match got {
            None => return Err(Status::new(Code::Cancelled, "the stream closed")),
            Some(Err(e)) => return Err(h2_status(&e)),
            Some(Ok(n)) => n.min(data.len()),
        };
        if n == 0 {
            continue;
        }
        let chunk = data.split_to(n);
        stream.send_data(chunk, false).map_err(|e| h2_status(&e))?;
    }
    Ok(())
}

/// Adds every metadata entry as a header of the `h2` crate's messages.
pub(crate) fn write_headers(md: &Metadata, headers: &mut http::HeaderMap) {
    for (k, v) in md.encoded() {
        // Entries are checked on insert: these conversions do not fail.
        if let (Ok(name), Ok(value)) =
            (http::HeaderName::from_bytes(k.as_bytes()), http::HeaderValue::from_str(&v))
        {
            headers.append(name, value);
        }
    }
}

/// The custom metadata among the headers of an `h2` crate's message.
pub(crate) fn metadata_from_headers(
    headers: &http::HeaderMap,
) -> Result<Metadata, protoplane_grpc::metadata::MetadataError> {
    Metadata::from_fields(headers.iter().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())))
}
