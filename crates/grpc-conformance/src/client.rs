//! `protoplane-grpc-conformance client`: protoplane's gRPC client driven by
//! the runner's `--mode client`.
//!
//! The runner writes a stream of `ClientCompatRequest`s on stdin, each one
//! RPC to make against its reference servers (connect-go and grpc-go): the
//! method, the request messages (as `Any`s), metadata, timeout, delays,
//! when to cancel. Every RPC runs in a task of its own, so timeouts and
//! delays overlap; each result goes to stdout as a `ClientCompatResponse`,
//! in the order the RPCs finish (the runner matches them by test name).
//! At the end of stdin the program waits for the RPCs still running and
//! exits.
//!
//! Each RPC follows the pseudocode of the runner's `docs/testing_clients.md`
//! for its stream type, over [`protoplane_rpc::Client`] (a dynamic,
//! schema-driven client): the requests are sent as the runner encoded them,
//! the responses are decoded by the runtime and their payloads copied into
//! the result through views and a builder. An RPC error is a result like
//! any other; only a request this program cannot even attempt (another
//! protocol, an unknown method, a malformed message) becomes a
//! `ClientErrorResult`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protoplane_grpc::{Code, Message, Metadata, Status};
use protoplane_rpc::{
    CallOptions, Channel, ChannelOptions, Client, ClientTls, Identity, TypedCall,
};
use protoplane_wire::{Builder, MessageBuilder, MessageView, Value};
use tokio::sync::mpsc;

use crate::delimited;
use crate::schema::{self, Conformance, Packed, Rpc, SERVICE};

/// Sub-message nesting copied from a response into a result: the payload
/// and its request info are four levels deep; anything far deeper is not
/// a conformance payload.
const COPY_DEPTH: u32 = 64;

pub(crate) fn run() -> Result<(), String> {
    let rt = crate::runtime()?;
    rt.block_on(async {
        let c = Arc::new(Conformance::load()?);
        // One writer, so results of concurrent RPCs never interleave.
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let writer = tokio::spawn(async move {
            while let Some(frame) = rx.recv().await {
                crate::write_stdout(&frame).await?;
            }
            Ok::<(), String>(())
        });
        let mut stdin = tokio::io::stdin();
        let mut rpcs = tokio::task::JoinSet::new();
        let read_error = loop {
            match delimited::read(&mut stdin).await {
                Ok(Some(bytes)) => {
                    let (c, tx) = (c.clone(), tx.clone());
                    rpcs.spawn(async move {
                        let result = answer(&c, bytes).await?;
                        // The writer only stops when stdout fails; it says so.
                        let _ = tx.send(delimited::frame(&result)?);
                        Ok::<(), String>(())
                    });
                }
                Ok(None) => break None,
                Err(e) => break Some(e),
            }
        };
        let mut first_error = read_error;
        while let Some(done) = rpcs.join_next().await {
            let r = done.map_err(|e| format!("an RPC task failed: {e}")).and_then(|r| r);
            if let (Err(e), None) = (r, &first_error) {
                first_error = Some(e);
            }
        }
        drop(tx);
        let written = writer.await.map_err(|e| format!("the stdout writer failed: {e}"))?;
        match first_error {
            Some(e) => Err(e),
            None => written,
        }
    })
}

/// Runs the RPC `bytes` (a `ClientCompatRequest`) describes and returns
/// the encoded `ClientCompatResponse`. Fails only when the request does not
/// decode at all: without its test name no result can be reported.
async fn answer(c: &Conformance, bytes: Vec<u8>) -> Result<Vec<u8>, String> {
    let tables = c.schema.tables();
    let m = Message::decode(
        tables,
        c.types.client_compat_request,
        Bytes::from(bytes),
        &mut protoplane_wire::Decoder::new(),
    )
    .map_err(|e| format!("ClientCompatRequest: {e}"))?;
    let v = m.view(tables).map_err(|e| format!("ClientCompatRequest: {e}"))?;
    let name = schema::text(&v, 1).map_err(|e| format!("ClientCompatRequest: {e}"))?.unwrap_or("");
    let outcome = match Plan::read(c, &v) {
        Ok(plan) => Ok(invoke(c, plan).await),
        Err(e) => Err(e),
    };
    if let Err(e) = &outcome {
        eprintln!("{name}: cannot run: {e}");
    }
    report(c, name, &outcome).map_err(|e| format!("{name}: building the result: {e}"))
}

/// When the client cancels the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cancel {
    Never,
    BeforeCloseSend,
    AfterCloseSend(Duration),
    AfterResponses(usize),
}

/// One RPC to make, checked and read out of its `ClientCompatRequest`.
struct Plan {
    rpc: Rpc,
    full_duplex: bool,
    target: String,
    channel: ChannelOptions,
    call: CallOptions,
    requests: Vec<Bytes>,
    delay: Duration,
    cancel: Cancel,
}

/// `ClientCompatRequest` enum values this client handles.
const PROTOCOL_GRPC: i128 = 2;
const CODEC_PROTO: i128 = 1;
const COMPRESSION_IDENTITY: i128 = 1;
const COMPRESSION_GZIP: i128 = 2;
const HTTP_VERSION_2: i128 = 2;
const STREAM_FULL_DUPLEX: i128 = 5;

impl Plan {
    fn read(c: &Conformance, v: &MessageView<'_>) -> Result<Plan, String> {
        let e = |e: protoplane_wire::BlockError| e.to_string();
        let protocol = schema::int(v, 3).map_err(e)?;
        if protocol != PROTOCOL_GRPC {
            return Err(format!("protocol {protocol}: this client speaks gRPC only"));
        }
        let version = schema::int(v, 2).map_err(e)?;
        if version != HTTP_VERSION_2 && version != 0 {
            return Err(format!("HTTP version {version}: gRPC runs over HTTP/2 only"));
        }
        let codec = schema::int(v, 4).map_err(e)?;
        if codec != CODEC_PROTO && codec != 0 {
            return Err(format!("codec {codec}: this client encodes protobuf only"));
        }
        let compress = match schema::int(v, 5).map_err(e)? {
            0 | COMPRESSION_IDENTITY => false,
            COMPRESSION_GZIP => true,
            other => return Err(format!("compression {other}: this client has gzip only")),
        };
        if let Some(s) = schema::text(v, 11).map_err(e)? {
            if s != SERVICE {
                return Err(format!("unknown service {s}"));
            }
        }
        let method = schema::text(v, 12).map_err(e)?.unwrap_or("");
        let rpc = Rpc::from_name(method).ok_or(format!("unknown method {method:?}"))?;
        let (input, _) = c.io(rpc);
        let want = c.schema.tables().message_name(input);
        let mut requests = Vec::new();
        for (i, any) in schema::messages(v, 16).map_err(e)?.iter().enumerate() {
            let any = Packed::read(any).map_err(e)?;
            if any.type_name() != want {
                return Err(format!("request #{}: a {}, want {want}", i + 1, any.type_name()));
            }
            // Checked here so a malformed request is reported as such,
            // not as whatever the server makes of it.
            Message::decode(
                c.schema.tables(),
                input,
                any.value.clone(),
                &mut protoplane_wire::Decoder::new(),
            )
            .map_err(|err| format!("request #{}: {err}", i + 1))?;
            requests.push(any.value);
        }
        if matches!(rpc, Rpc::Unary | Rpc::ServerStream | Rpc::Unimplemented | Rpc::IdempotentUnary)
            && requests.len() != 1
        {
            return Err(format!("{method} takes one request, got {}", requests.len()));
        }

        let host = schema::text(v, 6).map_err(e)?.unwrap_or("");
        let port = schema::int(v, 7).map_err(e)?;
        let mut channel = ChannelOptions::default();
        let limit = schema::int(v, 10).map_err(e)?;
        if limit > 0 {
            channel.max_recv_message = usize::try_from(limit).unwrap_or(usize::MAX);
        }
        let server_cert = schema::bytes(v, 8).map_err(e)?;
        let identity = match schema::sub(v, 9).map_err(e)? {
            Some(creds) if !schema::bytes(&creds, 1).map_err(e)?.is_empty() => Some(Identity {
                cert_pem: schema::bytes(&creds, 1).map_err(e)?.to_vec(),
                key_pem: schema::bytes(&creds, 2).map_err(e)?.to_vec(),
            }),
            _ => None,
        };
        if !server_cert.is_empty() {
            channel.tls = Some(ClientTls {
                // The runner's certificates name "localhost" and 127.0.0.1.
                server_name: host.to_string(),
                roots_pem: server_cert.to_vec(),
                identity,
            });
        } else if identity.is_some() {
            return Err(
                "client_tls_creds without server_tls_cert: no TLS to present them in".into()
            );
        }

        let metadata = schema::metadata(v, 15)?;
        let timeout = v
            .by_number(17)
            .map_err(e)?
            .and_then(|t| t.as_i128())
            .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
        let delay =
            Duration::from_millis(u64::try_from(schema::int(v, 18).map_err(e)?).unwrap_or(0));
        let cancel = match schema::sub(v, 19).map_err(e)? {
            None => Cancel::Never,
            Some(cv) => match cv.oneof_case(0) {
                1 => Cancel::BeforeCloseSend,
                2 => Cancel::AfterCloseSend(Duration::from_millis(
                    u64::try_from(schema::int(&cv, 2).map_err(e)?).unwrap_or(0),
                )),
                3 => Cancel::AfterResponses(
                    usize::try_from(schema::int(&cv, 3).map_err(e)?).unwrap_or(0),
                ),
                _ => Cancel::Never,
            },
        };
        Ok(Plan {
            rpc,
            full_duplex: rpc == Rpc::BidiStream
                && schema::int(v, 13).map_err(e)? == STREAM_FULL_DUPLEX,
            target: format!("{host}:{port}"),
            channel,
            call: CallOptions { metadata, timeout, compress, ..CallOptions::default() },
            requests,
            delay,
            cancel,
        })
    }
}

/// What happened on one RPC.
#[derive(Debug, Default)]
struct Outcome {
    headers: Option<Metadata>,
    trailers: Option<Metadata>,
    responses: Vec<Message>,
    error: Option<Status>,
    unsent: usize,
}

/// Makes the call the plan describes.
async fn invoke(c: &Conformance, plan: Plan) -> Outcome {
    let mut o = Outcome { unsent: plan.requests.len(), ..Outcome::default() };
    let channel = match Channel::connect_with(&plan.target, plan.channel).await {
        Ok(ch) => ch,
        Err(st) => {
            o.error = Some(st);
            return o;
        }
    };
    let client = Client::new(channel, c.schema.clone());
    let mut call = match client.start(c.id(plan.rpc), plan.call).await {
        Ok(call) => call,
        Err(st) => {
            o.error = Some(st);
            return o;
        }
    };
    o.unsent = 0;
    let streams_requests = matches!(plan.rpc, Rpc::ClientStream | Rpc::BidiStream);
    let total = plan.requests.len();
    let mut ended = false;
    for (i, request) in plan.requests.iter().enumerate() {
        if streams_requests {
            tokio::time::sleep(plan.delay).await;
        }
        if let Err(st) = call.call.send(request).await {
            o.unsent = total - i;
            o.error = Some(st);
            ended = true;
            break;
        }
        if plan.full_duplex {
            match call.message().await {
                Ok(Some(m)) => o.took(m, plan.cancel, &mut call),
                // The server ended the call: nothing more to read.
                Ok(None) => break,
                Err(st) => {
                    o.unsent = total - i - 1;
                    o.error = Some(st);
                    ended = true;
                    break;
                }
            }
        }
    }
    if !ended {
        if plan.cancel == Cancel::BeforeCloseSend {
            call.call.cancel();
        }
        call.call.close_send();
        let mut cancel_at = match plan.cancel {
            Cancel::AfterCloseSend(after) => Some(Instant::now() + after),
            _ => None,
        };
        loop {
            let next = match cancel_at {
                None => Some(call.message().await),
                Some(at) => tokio::select! {
                    r = call.message() => Some(r),
                    _ = tokio::time::sleep_until(at.into()) => None,
                },
            };
            match next {
                None => {
                    cancel_at = None;
                    call.call.cancel();
                }
                Some(Ok(Some(m))) => o.took(m, plan.cancel, &mut call),
                Some(Ok(None)) => break,
                Some(Err(st)) => {
                    o.error = Some(st);
                    break;
                }
            }
        }
    }
    o.headers = call.call.headers_now().cloned();
    o.trailers = call.call.trailers().cloned();
    if matches!(
        plan.rpc,
        Rpc::Unary | Rpc::ClientStream | Rpc::Unimplemented | Rpc::IdempotentUnary
    ) {
        one_response(&mut o);
    }
    o
}

impl Outcome {
    /// Records a response, and cancels when the plan says so.
    fn took(&mut self, m: Message, cancel: Cancel, call: &mut TypedCall) {
        self.responses.push(m);
        if cancel == Cancel::AfterResponses(self.responses.len()) {
            call.call.cancel();
        }
    }
}

/// A call with one response ends with exactly one, or with an error and
/// none. Anything else is gRPC's "cardinality violation", which grpc-go
/// (and so the runner) reports as UNIMPLEMENTED. The runtime's
/// `Client::unary` checks this too, but it does not expose the response
/// headers the runner wants, so this program drives the call itself.
fn one_response(o: &mut Outcome) {
    if o.error.is_some() {
        o.responses.clear();
        return;
    }
    let n = o.responses.len();
    if n != 1 {
        o.responses.clear();
        o.error = Some(Status::new(
            Code::Unimplemented,
            format!("cardinality violation: {n} responses to a call that has one"),
        ));
    }
}

/// Encodes the `ClientCompatResponse` for test `name`.
fn report(
    c: &Conformance,
    name: &str,
    outcome: &Result<Outcome, String>,
) -> Result<Vec<u8>, String> {
    let tables = c.schema.tables();
    let ty = c.types.client_compat_response;
    let w = |e: protoplane_wire::BuildError| e.to_string();
    let mut b = Builder::new(tables, ty).map_err(w)?;
    let root = b.root();
    b.set(root, 1, Value::String(name.as_bytes())).map_err(w)?;
    match outcome {
        Err(message) => {
            let e = b.message(root, 3).map_err(w)?;
            b.set(e, 1, Value::String(message.as_bytes())).map_err(w)?;
        }
        Ok(o) => {
            let r = b.message(root, 2).map_err(w)?;
            put_result(c, &mut b, r, o)?;
        }
    }
    c.encode(ty, &b.finish())
}

/// Fills a `ClientResponseResult`.
fn put_result(
    c: &Conformance,
    b: &mut Builder<'_>,
    r: MessageBuilder,
    o: &Outcome,
) -> Result<(), String> {
    let w = |e: protoplane_wire::BuildError| e.to_string();
    if let Some(h) = &o.headers {
        schema::put_metadata(b, r, 1, h).map_err(w)?;
    }
    for m in &o.responses {
        // Every response type is `{ConformancePayload payload = 1}`; a
        // response without one counts as an empty payload.
        let p = b.message(r, 2).map_err(w)?;
        let v = m.view(c.schema.tables()).map_err(|e| e.to_string())?;
        if let Some(payload) = schema::sub(&v, 1).map_err(|e| e.to_string())? {
            schema::copy(b, p, &payload, COPY_DEPTH)?;
        }
    }
    if let Some(st) = &o.error {
        let e = b.message(r, 3).map_err(w)?;
        b.set(e, 1, Value::Enum(st.code as i32)).map_err(w)?;
        b.set(e, 2, Value::String(st.message.as_bytes())).map_err(w)?;
        match st.any_details() {
            Ok(details) => {
                for d in details {
                    let any = Packed { type_url: d.type_url, value: Bytes::from(d.value) };
                    schema::put_any(b, e, 3, &any).map_err(w)?;
                }
            }
            Err(bad) => eprintln!("unreadable grpc-status-details-bin: {bad}"),
        }
    }
    // Trailers as received; a status that came without any (a local
    // deadline, a reset) may still carry metadata of its own.
    let trailers = o.trailers.as_ref().or(o.error.as_ref().map(|st| &st.metadata));
    if let Some(t) = trailers {
        schema::put_metadata(b, r, 4, t).map_err(w)?;
    }
    let unsent = i32::try_from(o.unsent).unwrap_or(i32::MAX);
    b.set(r, 5, Value::I32(unsent)).map_err(w)?;
    Ok(())
}
