//! The RPC face: a service with a NetFilter is called like any other
//! protoplane service, and the stub routes its IEDT fields through the
//! client agent.
//!
//! [`IncChannel`] is what the generated `<Service>IncClient` (codegen's
//! `inc_services()`) calls: the same `Request<&Block>` in and decoded
//! [`Message`] out as the ordinary client, per method:
//!
//! 1. The NetFilter's rules for the method become operations on the
//!    request's IEDT fields, read with the schema's tables:
//!    - `Map.addTo` (or `Stream.modify`) of a field: [`ClientHandle::add`],
//!      one (key, value) item per array element or map entry;
//!    - `Map.addTo` of a field that a `CntFwd` also counts (synchronous
//!      aggregation): [`ClientHandle::aggregate_over`]; the element-wise sum
//!      over all members goes into the response field of the same name and
//!      type, if the response has one (with its `members` set when the sum
//!      is over fewer, see [`protoplane_inc::membership`]);
//!    - `Map.get`: [`ClientHandle::get`] of the `Keys`, the values into the
//!      `Result` map of the response;
//!    - `CntFwd` alone (agreement): a vote for each instance the `Keys`
//!      field names ([`ClientHandle::vote_for`]: the vote is for the value
//!      the server agent proposed).
//!
//!    Floats are quantized with the filter's `Precision` on the way in and
//!    turned back into doubles on the way out.
//! 2. Ordinary fields travel as an ordinary gRPC call to the server: the
//!    request is encoded and its IEDT fields are cut out of the bytes, so
//!    the server's handler (the ordinary generated server trait) sees the
//!    ordinary fields only. A method whose request and response have no
//!    ordinary field at all makes no call: the network answers it alone.
//!    The call and the INC operations run concurrently.
//! 3. The response is the server's response with the INC results appended:
//!    protobuf's merge semantics (a later occurrence of a field merges into
//!    the earlier) make one message of the two. Result fields the server
//!    set itself are cut out first, so the network's answer is the one the
//!    caller reads.
//!
//! On the server side nothing changes: the generated server trait is
//! implemented and served as usual, and a [`ServerRuntime`](crate::agent::ServerRuntime)
//! runs beside it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use prost_types::FileDescriptorSet;
use protoplane_grpc::{Code, Message, Request, Schema, Status};
use protoplane_inc::keys::{int_key, Quantizer};
use protoplane_inc::netfilter::{select_service, services_of, Iedt, NetFilter};
use protoplane_rpc::{CallOptions, Channel, Client};
use protoplane_schema::TableSet;
use protoplane_wire::{Block, Decoder, EncodeOptions, Encoder, MessageView, Source, Value};

use crate::agent::ClientHandle;
use crate::Error;

/// What the stub does with one IEDT field of a method.
#[derive(Clone, Debug, PartialEq)]
enum Op {
    /// `Map.addTo` / `Stream.modify`: add the field's items.
    Add { field: u32, iedt: Iedt },
    /// `Map.addTo` + `CntFwd` on the same field: all-reduce; the sums go to
    /// the response field `result` (when the response has one).
    Aggregate { field: u32, iedt: Iedt, result: Option<u32> },
    /// `Map.get`: read `keys`, answer in the response's map `result`.
    Get { keys: u32, result: u32, iedt: Iedt },
    /// `CntFwd`: vote for every instance `keys` names.
    Vote { keys: u32, iedt: Iedt },
}

/// A method of the service, resolved.
#[derive(Clone, Debug)]
struct MethodPlan {
    id: u32,
    input: u32,
    output: u32,
    ops: Vec<Op>,
    /// Request fields that travel through the INC channel.
    strip_request: Vec<u32>,
    /// Response fields the INC results fill.
    strip_response: Vec<u32>,
    /// Whether the server is called.
    rpc: bool,
}

/// Counters of an [`IncChannel`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaceStats {
    /// Calls made through the channel.
    pub calls: u64,
    /// Calls that went to the server as ordinary RPCs.
    pub rpcs: u64,
    /// Request bytes (encoded protobuf, IEDT fields cut out) sent in them.
    pub rpc_bytes: u64,
    /// Request bytes the IEDT fields would have added.
    pub iedt_bytes: u64,
}

#[derive(Debug, Default)]
struct Counters {
    calls: AtomicU64,
    rpcs: AtomicU64,
    rpc_bytes: AtomicU64,
    iedt_bytes: AtomicU64,
}

/// The client side of a service with a NetFilter: ordinary fields over
/// RPC, IEDT fields through the client agent. Cheap to clone.
#[derive(Clone, Debug)]
pub struct IncChannel {
    client: Client,
    agent: ClientHandle,
    methods: Arc<HashMap<String, MethodPlan>>,
    quantizer: Option<Quantizer>,
    counters: Arc<Counters>,
}

fn status(code: Code, msg: impl Into<String>) -> Status {
    Status::new(code, msg.into())
}

/// The `ServiceSig`s of a schema (the NetFilter validates against them).
fn service_sigs(schema: &Schema) -> Vec<protoplane_inc::netfilter::ServiceSig> {
    services_of(&FileDescriptorSet { file: schema.files().to_vec() })
}

impl IncChannel {
    /// A channel for `service` (its full name) of `schema` with the
    /// NetFilter `netfilter` (the JSON document; its `Service`, if given,
    /// must be this one), calling the server over `channel` and the network
    /// through `agent`. Fails when the filter does not fit the service, or
    /// has a rule for a streaming method.
    pub fn new(
        channel: Channel,
        schema: Arc<Schema>,
        service: &str,
        netfilter: &str,
        agent: ClientHandle,
    ) -> Result<IncChannel, Status> {
        let sigs: Vec<_> =
            service_sigs(&schema).into_iter().filter(|s| s.name == service).collect();
        if sigs.is_empty() {
            return Err(status(Code::InvalidArgument, format!("no service {service:?}")));
        }
        let sig = select_service(&sigs, netfilter)
            .map_err(|e| status(Code::InvalidArgument, format!("NetFilter: {e}")))?;
        let filter = NetFilter::parse(netfilter, sig, schema.tables())
            .map_err(|e| status(Code::InvalidArgument, format!("NetFilter: {e}")))?;
        let methods = plan_methods(&schema, &filter)?;
        Ok(IncChannel {
            client: Client::new(channel, schema),
            agent,
            methods: Arc::new(methods),
            quantizer: filter.quantizer(),
            counters: Arc::default(),
        })
    }

    /// The ordinary client (streaming methods, which carry no IEDT field,
    /// go through it unchanged).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The agent.
    pub fn agent(&self) -> &ClientHandle {
        &self.agent
    }

    /// Counters.
    pub fn stats(&self) -> FaceStats {
        let c = &self.counters;
        FaceStats {
            calls: c.calls.load(Ordering::Relaxed),
            rpcs: c.rpcs.load(Ordering::Relaxed),
            rpc_bytes: c.rpc_bytes.load(Ordering::Relaxed),
            iedt_bytes: c.iedt_bytes.load(Ordering::Relaxed),
        }
    }

    /// A unary call of `method` (its declared name).
    pub async fn unary(&self, method: &str, request: Request<&Block>) -> Result<Message, Status> {
        let plan = self
            .methods
            .get(method)
            .ok_or_else(|| status(Code::Unimplemented, format!("no unary method {method:?}")))?;
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        let tables = self.client.schema().tables();
        let block = request.message;
        if block.type_index() != Some(plan.input) {
            return Err(status(Code::InvalidArgument, "request block of the wrong type"));
        }
        let wire = Encoder::new()
            .encode(tables, plan.input, Source::owned(block.as_bytes()), &EncodeOptions::default())
            .map_err(|e| status(Code::InvalidArgument, format!("unencodable request: {e}")))?
            .to_vec();
        let view = MessageView::new(tables, Source::owned(block.as_bytes()), plan.input)
            .map_err(|e| status(Code::InvalidArgument, format!("request block: {e}")))?;
        // Everything is read out of the request before anything is awaited.
        let work = plan
            .ops
            .iter()
            .map(|op| self.prepare(op, view))
            .collect::<Result<Vec<Work>, Status>>()?;
        let ordinary = strip_fields(&wire, &plan.strip_request)
            .map_err(|e| status(Code::Internal, format!("request bytes: {e}")))?;
        self.counters.iedt_bytes.fetch_add((wire.len() - ordinary.len()) as u64, Ordering::Relaxed);
        let opts = CallOptions {
            metadata: request.metadata,
            timeout: request
                .deadline
                .map(|d| d.saturating_duration_since(tokio::time::Instant::now().into_std())),
            ..CallOptions::default()
        };
        let server = async {
            if !plan.rpc {
                return Ok(Vec::new());
            }
            self.counters.rpcs.fetch_add(1, Ordering::Relaxed);
            self.counters.rpc_bytes.fetch_add(ordinary.len() as u64, Ordering::Relaxed);
            self.call_server(plan.id, &ordinary, opts).await
        };
        let network = async {
            let mut out = Vec::new();
            for w in work {
                self.run(w, &mut out).await?;
            }
            Ok::<_, Status>(out)
        };
        let (response, results) = tokio::join!(server, network);
        let (response, results) = (response?, results?);
        let mut wire = strip_fields(&response, &plan.strip_response)
            .map_err(|e| status(Code::Internal, format!("invalid response message: {e}")))?;
        wire.extend_from_slice(&results);
        Message::decode(tables, plan.output, Bytes::from(wire), &mut Decoder::new())
            .map_err(|e| status(Code::Internal, format!("invalid response message: {e}")))
    }

    /// One ordinary unary call with already encoded request bytes; returns
    /// the response's bytes.
    async fn call_server(
        &self,
        method: u32,
        request: &[u8],
        opts: CallOptions,
    ) -> Result<Vec<u8>, Status> {
        let mut call = self.client.start(method, opts).await?;
        call.call.send_last(request).await?;
        let first = call.call.recv().await?.ok_or_else(|| {
            status(Code::Unimplemented, "the server ended a unary call without a response")
        })?;
        match call.call.recv().await? {
            None => Ok(first.to_vec()),
            Some(_) => {
                call.call.cancel();
                Err(status(Code::Unimplemented, "more than one response message for a unary call"))
            }
        }
    }

    /// Reads what `op` needs from the request.
    fn prepare(&self, op: &Op, view: MessageView<'_>) -> Result<Work, Status> {
        let sub = |field: u32| -> Result<Option<MessageView<'_>>, Status> {
            Ok(view
                .by_number(field)
                .map_err(|e| status(Code::InvalidArgument, format!("field {field}: {e}")))?
                .and_then(|v| v.as_message()))
        };
        Ok(match *op {
            Op::Add { field, iedt } => {
                let items = match sub(field)? {
                    Some(m) => self.items(m, iedt)?,
                    None => Vec::new(),
                };
                Work::Add(items)
            }
            Op::Aggregate { field, iedt, result } => {
                let items = match sub(field)? {
                    Some(m) => self.items(m, iedt)?,
                    None => Vec::new(),
                };
                let values = items
                    .into_iter()
                    .map(|(_, v)| {
                        i32::try_from(v).map_err(|_| {
                            status(
                                Code::InvalidArgument,
                                format!(
                                    "{v} does not fit an aggregation's 32-bit element \
                                     (quantized with the filter's Precision)"
                                ),
                            )
                        })
                    })
                    .collect::<Result<Vec<i32>, Status>>()?;
                Work::Aggregate { values, result, iedt }
            }
            Op::Get { keys, result, iedt } => {
                let (ints, strs) = match sub(keys)? {
                    Some(m) => read_keys(m)?,
                    None => (Vec::new(), Vec::new()),
                };
                let int_keyed = matches!(iedt, Iedt::IntMap | Iedt::IntFloatMap);
                if (int_keyed && !strs.is_empty()) || (!int_keyed && !ints.is_empty()) {
                    return Err(status(
                        Code::InvalidArgument,
                        format!(
                            "the result is a {}: its keys are {}",
                            iedt.message_name(),
                            if int_keyed { "integers" } else { "strings" }
                        ),
                    ));
                }
                let keys = ints.iter().map(|k| int_key(*k)).chain(strs).collect();
                Work::Get { keys, result, iedt }
            }
            Op::Vote { keys, iedt } => {
                let mut instances = Vec::new();
                if let Some(m) = sub(keys)? {
                    let raw = match iedt {
                        Iedt::Keys => read_keys(m)?.0,
                        _ => self.items(m, iedt)?.into_iter().map(|(_, v)| v).collect(),
                    };
                    for i in raw {
                        instances.push(u32::try_from(i).map_err(|_| {
                            status(Code::InvalidArgument, format!("instance {i} is not a u32"))
                        })?);
                    }
                }
                Work::Vote(instances)
            }
        })
    }

    /// The (key, value) items of an array, map or `Int` IEDT, quantized.
    fn items(&self, m: MessageView<'_>, iedt: Iedt) -> Result<Vec<(Vec<u8>, i64)>, Status> {
        let bad = |e: protoplane_wire::BlockError| {
            status(Code::InvalidArgument, format!("{}: {e}", iedt.message_name()))
        };
        let q = |x: f64| -> Result<i64, Status> {
            let q = self.quantizer.ok_or_else(|| status(Code::Internal, "no Precision"))?;
            q.quantize(x)
                .map_err(|_| status(Code::InvalidArgument, format!("{x} has no fixed-point form")))
        };
        let mut out = Vec::new();
        let Some(f1) = m.field(1) else { return Ok(out) };
        match iedt {
            Iedt::Int => {
                if let Some(v) = m.by_number(1).map_err(bad)?.and_then(|v| v.as_i128()) {
                    out.push((int_key(0), v as i64));
                }
            }
            Iedt::IntArray | Iedt::FloatArray => {
                for (i, v) in m.repeated(f1).map_err(bad)?.iter().enumerate() {
                    let v = match v.map_err(bad)? {
                        Value::F64(x) => q(x)?,
                        other => other.as_i128().unwrap_or(0) as i64,
                    };
                    out.push((int_key(i as i64), v));
                }
            }
            Iedt::IntMap | Iedt::StrIntMap | Iedt::IntFloatMap | Iedt::StrFloatMap => {
                // A map field is a map: a key repeated within one message
                // keeps its last entry (proto3's parsing rule), it is not
                // added twice.
                let mut at: HashMap<Vec<u8>, usize> = HashMap::new();
                for e in m.repeated(f1).map_err(bad)?.iter() {
                    let Some(e) = e.map_err(bad)?.as_message() else { continue };
                    let key = match e.by_number(1).map_err(bad)? {
                        Some(Value::String(s)) => s.to_vec(),
                        Some(k) => int_key(k.as_i128().unwrap_or(0) as i64),
                        None if iedt == Iedt::IntMap || iedt == Iedt::IntFloatMap => int_key(0),
                        None => Vec::new(),
                    };
                    let value = match e.by_number(2).map_err(bad)? {
                        Some(Value::F64(x)) => q(x)?,
                        Some(v) => v.as_i128().unwrap_or(0) as i64,
                        None => 0,
                    };
                    match at.get(&key) {
                        Some(i) => out[*i].1 = value,
                        None => {
                            at.insert(key.clone(), out.len());
                            out.push((key, value));
                        }
                    }
                }
            }
            Iedt::Keys => {}
        }
        Ok(out)
    }

    /// Runs one operation on the agent; appends the response fields it fills.
    async fn run(&self, w: Work, out: &mut Vec<u8>) -> Result<(), Status> {
        let agent_err = |e: Error| status(Code::Unavailable, format!("in-network call: {e}"));
        match w {
            Work::Add(items) => {
                if !items.is_empty() {
                    self.agent.add(items).await.map_err(agent_err)?;
                }
            }
            Work::Aggregate { values, result, iedt } => {
                let (sums, members) = self.agent.aggregate_over(values).await.map_err(agent_err)?;
                let everyone = protoplane_inc::plan::member_mask(self.agent.members());
                if let Some(field) = result {
                    let mut body = Vec::new();
                    let mut packed = Vec::new();
                    for s in &sums {
                        match (iedt, self.quantizer) {
                            (Iedt::FloatArray, Some(q)) => {
                                packed.extend_from_slice(&q.dequantize(*s).to_le_bytes())
                            }
                            _ => push_varint(&mut packed, zigzag(*s)),
                        }
                    }
                    if !packed.is_empty() {
                        push_len_field(&mut body, 1, &packed);
                    }
                    if members != everyone {
                        // `members = 2` (varint): fewer than every member.
                        body.push(2 << 3);
                        push_varint(&mut body, members);
                    }
                    push_len_field(out, field, &body);
                }
            }
            Work::Get { keys, result, iedt } => {
                let values = if keys.is_empty() {
                    Vec::new()
                } else {
                    self.agent.get(keys).await.map_err(agent_err)?
                };
                let mut body = Vec::new();
                for (k, v) in values {
                    let mut entry = Vec::new();
                    match iedt {
                        Iedt::IntMap | Iedt::IntFloatMap => {
                            let k =
                                <[u8; 8]>::try_from(k.as_slice()).map(i64::from_be_bytes).map_err(
                                    |_| status(Code::Internal, "an integer key is not 8 bytes"),
                                )?;
                            push_varint(&mut entry, 1 << 3);
                            push_varint(&mut entry, k as u64);
                        }
                        _ => push_len_field(&mut entry, 1, &k),
                    }
                    match (iedt, self.quantizer) {
                        (Iedt::IntFloatMap | Iedt::StrFloatMap, Some(q)) => {
                            push_varint(&mut entry, (2 << 3) | 1);
                            entry.extend_from_slice(&q.dequantize(v).to_le_bytes());
                        }
                        _ => {
                            push_varint(&mut entry, 2 << 3);
                            push_varint(&mut entry, v as u64);
                        }
                    }
                    push_len_field(&mut body, 1, &entry);
                }
                push_len_field(out, result, &body);
            }
            Work::Vote(instances) => {
                // Every vote is in flight at once; the call ends when all
                // are counted.
                let votes: Vec<_> = instances.iter().map(|i| self.agent.vote_for(*i)).collect();
                for r in join_started(votes).await {
                    r.map_err(agent_err)?;
                }
            }
        }
        Ok(())
    }
}

/// What one operation does, read out of the request.
#[derive(Debug)]
enum Work {
    Add(Vec<(Vec<u8>, i64)>),
    Aggregate { values: Vec<i32>, result: Option<u32>, iedt: Iedt },
    Get { keys: Vec<Vec<u8>>, result: u32, iedt: Iedt },
    Vote(Vec<u32>),
}

/// Awaits futures whose work is already under way (the agent's thread
/// runs every submitted call), in order: the wait is the slowest one's,
/// not the sum.
async fn join_started<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut out = Vec::with_capacity(futures.len());
    for f in futures {
        out.push(f.await);
    }
    out
}

/// Reads a `Keys` IEDT.
fn read_keys(m: MessageView<'_>) -> Result<(Vec<i64>, Vec<Vec<u8>>), Status> {
    let bad = |e: protoplane_wire::BlockError| status(Code::InvalidArgument, format!("Keys: {e}"));
    let mut ints = Vec::new();
    let mut strs = Vec::new();
    if let Some(f) = m.field(1) {
        for v in m.repeated(f).map_err(bad)?.iter() {
            ints.push(v.map_err(bad)?.as_i128().unwrap_or(0) as i64);
        }
    }
    if let Some(f) = m.field(2) {
        for v in m.repeated(f).map_err(bad)?.iter() {
            strs.push(v.map_err(bad)?.as_bytes().unwrap_or(&[]).to_vec());
        }
    }
    Ok((ints, strs))
}

/// Resolves the filter's rules to operations per unary method.
fn plan_methods(
    schema: &Schema,
    filter: &NetFilter,
) -> Result<HashMap<String, MethodPlan>, Status> {
    let tables = schema.tables();
    let mut out = HashMap::new();
    for m in schema.methods().iter().filter(|m| m.service == filter.service) {
        let mut ops = Vec::new();
        let counted = |field: u32| {
            filter.cnt_fwd.iter().any(|c| c.method == m.name && c.keys.number == field)
        };
        for r in filter.add_to.iter().filter(|r| r.method == m.name) {
            let f = &r.field;
            if counted(f.number) {
                let result = same_field(tables, m.output, &f.name, f.iedt);
                ops.push(Op::Aggregate { field: f.number, iedt: f.iedt, result });
            } else {
                ops.push(Op::Add { field: f.number, iedt: f.iedt });
            }
        }
        for r in filter.modify.iter().filter(|r| r.method == m.name) {
            let f = &r.field;
            if !filter.add_to.iter().any(|a| a.method == m.name && a.field.number == f.number) {
                ops.push(Op::Add { field: f.number, iedt: f.iedt });
            }
        }
        for r in filter.get.iter().filter(|r| r.method == m.name) {
            ops.push(Op::Get { keys: r.keys.number, result: r.result.number, iedt: r.result.iedt });
        }
        for c in filter.cnt_fwd.iter().filter(|c| c.method == m.name) {
            if !filter.add_to.iter().any(|a| a.method == m.name && a.field.number == c.keys.number)
            {
                ops.push(Op::Vote { keys: c.keys.number, iedt: c.keys.iedt });
            }
        }
        if m.client_streaming || m.server_streaming {
            if !ops.is_empty() {
                return Err(status(
                    Code::InvalidArgument,
                    format!(
                        "NetFilter: {} is {}; only unary methods carry IEDT fields",
                        m.name,
                        m.kind()
                    ),
                ));
            }
            continue;
        }
        let mut strip_request = Vec::new();
        let mut strip_response = Vec::new();
        for op in &ops {
            match *op {
                Op::Add { field, .. } | Op::Vote { keys: field, .. } => strip_request.push(field),
                Op::Aggregate { field, result, .. } => {
                    strip_request.push(field);
                    strip_response.extend(result);
                }
                Op::Get { keys, result, .. } => {
                    strip_request.push(keys);
                    strip_response.push(result);
                }
            }
        }
        let ordinary = |msg: u32, strip: &[u32]| {
            tables.fields(tables.message(msg)).iter().any(|f| !strip.contains(&f.number))
        };
        let rpc = ops.is_empty()
            || ordinary(m.input, &strip_request)
            || ordinary(m.output, &strip_response);
        let id = schema.find(&m.service, &m.name).unwrap_or(u32::MAX);
        out.insert(
            m.name.clone(),
            MethodPlan {
                id,
                input: m.input,
                output: m.output,
                ops,
                strip_request,
                strip_response,
                rpc,
            },
        );
    }
    Ok(out)
}

/// The field of message `msg` named `name` with IEDT `iedt`, if any.
fn same_field(tables: &TableSet, msg: u32, name: &str, iedt: Iedt) -> Option<u32> {
    let f = tables.fields(tables.message(msg)).iter().find(|f| tables.str(f.name) == name)?;
    (protoplane_inc::netfilter::iedt_of(tables, msg, f.number) == Some(iedt)).then_some(f.number)
}

// ---------------------------------------------------------------------------
// Wire helpers.

fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn push_len_field(out: &mut Vec<u8>, number: u32, body: &[u8]) {
    push_varint(out, (u64::from(number) << 3) | 2);
    push_varint(out, body.len() as u64);
    out.extend_from_slice(body);
}

fn read_varint(b: &[u8], at: &mut usize) -> Result<u64, &'static str> {
    let mut v = 0u64;
    for i in 0..10 {
        let byte = *b.get(*at).ok_or("truncated varint")?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            return Ok(v);
        }
    }
    Err("varint longer than 10 bytes")
}

/// Skips the value of a field with wire type `wt` (groups included) at `at`.
fn skip_value(
    b: &[u8],
    at: &mut usize,
    wt: u64,
    number: u64,
    depth: u32,
) -> Result<(), &'static str> {
    match wt {
        0 => {
            read_varint(b, at)?;
        }
        1 => *at = at.checked_add(8).filter(|e| *e <= b.len()).ok_or("truncated fixed64")?,
        5 => *at = at.checked_add(4).filter(|e| *e <= b.len()).ok_or("truncated fixed32")?,
        2 => {
            let len = usize::try_from(read_varint(b, at)?).map_err(|_| "length too large")?;
            *at = at.checked_add(len).filter(|e| *e <= b.len()).ok_or("truncated length")?;
        }
        3 => {
            if depth >= 64 {
                return Err("groups nested too deep");
            }
            loop {
                let tag = read_varint(b, at)?;
                if tag & 7 == 4 {
                    if tag >> 3 != number {
                        return Err("mismatched end group");
                    }
                    return Ok(());
                }
                skip_value(b, at, tag & 7, tag >> 3, depth + 1)?;
            }
        }
        _ => return Err("invalid wire type"),
    }
    Ok(())
}

/// `wire` (an encoded message: the server's response, so untrusted bytes)
/// without its top-level fields numbered in `drop`, the others byte for
/// byte in their order. Errors on bytes that are not a well-formed
/// sequence of fields ([`Error::MalformedMessage`]; groups are matched and
/// nest at most 64 deep).
pub fn strip_fields(wire: &[u8], drop: &[u32]) -> Result<Vec<u8>, Error> {
    strip(wire, drop).map_err(|reason| Error::MalformedMessage { reason })
}

fn strip(wire: &[u8], drop: &[u32]) -> Result<Vec<u8>, &'static str> {
    if drop.is_empty() {
        return Ok(wire.to_vec());
    }
    let mut out = Vec::with_capacity(wire.len());
    let mut at = 0;
    while at < wire.len() {
        let start = at;
        let tag = read_varint(wire, &mut at)?;
        let number = tag >> 3;
        if number == 0 || number > u64::from(u32::MAX >> 3) {
            return Err("invalid field number");
        }
        skip_value(wire, &mut at, tag & 7, number, 0)?;
        if !drop.contains(&(number as u32)) {
            out.extend_from_slice(&wire[start..at]);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_keeps_other_fields_in_order() {
        // 1: varint 150, 2: "hi", 3: fixed32, 2: "yo", 4: group { 1: 1 }
        let wire = [
            0x08, 0x96, 0x01, 0x12, 2, b'h', b'i', 0x1d, 1, 2, 3, 4, 0x12, 2, b'y', b'o', 0x23,
            0x08, 0x01, 0x24,
        ];
        let out = strip_fields(&wire, &[2]).expect("strips");
        assert_eq!(out, [0x08, 0x96, 0x01, 0x1d, 1, 2, 3, 4, 0x23, 0x08, 0x01, 0x24]);
        assert_eq!(strip_fields(&wire, &[]).expect("no-op"), wire);
        assert_eq!(strip_fields(&wire, &[1, 2, 3, 4]).expect("strips all"), Vec::<u8>::new());
    }

    #[test]
    fn strip_rejects_bad_bytes() {
        for bad in
            [&[0x12, 5, 1][..], &[0x08], &[0x0f], &[0x23, 0x2c], &[0x00, 0x01], &[0x09, 1, 2]]
        {
            assert!(strip_fields(bad, &[7]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn varints_and_zigzag() {
        let mut v = Vec::new();
        push_varint(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
        let mut at = 0;
        assert_eq!(read_varint(&v, &mut at), Ok(300));
        assert_eq!((zigzag(0), zigzag(-1), zigzag(1), zigzag(-2)), (0, 1, 2, 3));
        assert_eq!(zigzag(i64::MIN), u64::MAX);
    }
}
