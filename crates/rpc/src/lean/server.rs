//! The lean transport's server: the same [`Router`] and services as the
//! gRPC server, over [`frame`](super::frame)s on TCP or Unix sockets.
//!
//! Per connection, one task reads frames and polls every call it runs (a
//! `FuturesUnordered`, no task per call), and one task writes: it takes
//! every frame ready at that moment and writes them with one system call,
//! so under load many responses share a `write`. Pipelining is free: a
//! client may have any number of calls open (up to
//! `ServerOptions::max_concurrent_streams`, beyond which the server stops
//! reading the connection until calls finish).
//!
//! Memory per connection is bounded by the read buffer (one frame, at most
//! the message limit), the per-call request queues, the write queue (at
//! most 4 MiB of frames; a client that stops reading stalls its own
//! connection's calls, nobody else's) and the deadline heap (at most twice
//! the open calls, see [`Deadlines`]).
//!
//! Deadlines are the connection's, not each call's: one timer, set to the
//! earliest deadline of the calls open, ends those that pass it
//! (DEADLINE_EXCEEDED) by aborting their handlers. A timer per call cost
//! every call that does not answer at its first poll (every call a split
//! engine forwards) a registration in the runtime's timer wheel, and tokio
//! wakes its driver with a system call for each: `bench split` measured
//! 0.7–0.8 µs of the engine's CPU per call for it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures_util::future::{AbortHandle, Abortable};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use protoplane_wire::Decoder;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::server::Router;
use protoplane_grpc::call::{BoxFuture, Message, Out, Request, Responder, Streaming};
use protoplane_grpc::landing::{Filling, Landing};
use protoplane_grpc::lean::{self as frame, LeanError, Outgoing, CANCEL, END, OPEN, PREFACE};
use protoplane_grpc::metadata::Metadata;
use protoplane_grpc::status::{Code, Status};

/// Section overhead allowed beyond the message limit (metadata, status).
const FRAME_SLACK: usize = 64 << 10;

/// Serves lean connections from a TCP listener until the router drains.
pub async fn serve_tcp(
    router: Arc<Router>,
    listener: tokio::net::TcpListener,
) -> std::io::Result<()> {
    let listener = router.drain().listening(listener);
    while let Some((sock, _)) =
        router.accept_until_drained("lean server", || listener.accept()).await
    {
        let _ = sock.set_nodelay(true);
        let r = router.clone();
        router.spawn_connection(sock, move |sock| serve_connection(r, sock));
    }
    Ok(())
}

/// Serves lean connections from a Unix listener until the router drains.
pub async fn serve_unix(
    router: Arc<Router>,
    listener: tokio::net::UnixListener,
) -> std::io::Result<()> {
    let listener = router.drain().listening(listener);
    while let Some((sock, _)) =
        router.accept_until_drained("lean server", || listener.accept()).await
    {
        let r = router.clone();
        router.spawn_connection(sock, move |sock| serve_connection(r, sock));
    }
    Ok(())
}

struct Open {
    abort: AbortHandle,
    requests: Option<mpsc::Sender<Message>>,
    input: u32,
    service: usize,
    /// The call's number on this connection (ids are the client's, and
    /// reused): what its deadline entry and its finished future name.
    seq: u64,
}

/// The deadlines of a connection's open calls, earliest first, and the
/// connection's one timer.
///
/// An entry stays when its call ends (finding it in a heap would cost
/// more than leaving it): it is skipped when it comes up, and the heap is
/// rebuilt from the open calls' entries whenever it holds more than twice
/// as many as there are open calls, so it never outgrows the calls (a
/// client sending hour-long deadlines at a high rate would otherwise grow
/// it for an hour).
#[derive(Default)]
struct Deadlines {
    heap: BinaryHeap<Reverse<(Instant, u32, u64)>>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Deadlines {
    /// Adds call `id` (number `seq`) ending at `at`.
    fn add(&mut self, at: Instant, id: u32, seq: u64, open: &HashMap<u32, Open>) {
        self.heap.push(Reverse((at, id, seq)));
        if self.heap.len() > 2 * open.len() + 64 {
            self.heap.retain(|Reverse((_, id, seq))| live(open, *id, *seq));
        }
    }

    /// Whether there is a deadline to wait for.
    fn armed(&self) -> bool {
        !self.heap.is_empty()
    }

    /// Waits until the earliest deadline (the timer moves only when the
    /// earliest entry changes).
    async fn wait(&mut self) {
        poll_fn(|cx| {
            let Some(Reverse((at, _, _))) = self.heap.peek() else {
                return std::task::Poll::Pending;
            };
            let at = tokio::time::Instant::from_std(*at);
            let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
            if sleep.deadline() != at {
                sleep.as_mut().reset(at);
            }
            sleep.as_mut().poll(cx)
        })
        .await
    }

    /// Takes the entries due by `now`; the open calls among them.
    fn due(&mut self, now: Instant, open: &HashMap<u32, Open>) -> Vec<u32> {
        let mut due = Vec::new();
        while let Some(&Reverse((at, id, seq))) = self.heap.peek() {
            if at > now {
                break;
            }
            self.heap.pop();
            if live(open, id, seq) {
                due.push(id);
            }
        }
        due
    }
}

/// Whether call `id` numbered `seq` is still open.
fn live(open: &HashMap<u32, Open>, id: u32, seq: u64) -> bool {
    open.get(&id).is_some_and(|o| o.seq == seq)
}

/// Serves one connection until it closes or breaks the protocol.
pub async fn serve_connection<IO>(router: Arc<Router>, io: IO)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let _counted = router.drain().connection();
    let (mut rd, mut wr) = tokio::io::split(io);
    // Preface both ways, then the method table: the client learns the ids.
    let mut preface = [0u8; 8];
    let got =
        tokio::time::timeout(std::time::Duration::from_secs(10), rd.read_exact(&mut preface)).await;
    if !matches!(got, Ok(Ok(_))) || &preface != PREFACE {
        return;
    }
    let table = router.method_table();
    let mut hello = PREFACE.to_vec();
    hello.extend_from_slice(&(table.len() as u32).to_le_bytes());
    for (path, _, _) in table {
        hello.extend_from_slice(&(path.len() as u16).to_le_bytes());
        hello.extend_from_slice(path.as_bytes());
    }
    if wr.write_all(&hello).await.is_err() {
        return;
    }

    let (wtx, wrx) = super::frame_queue();
    let writer = tokio::spawn(super::write_loop(wr, wrx));
    let limit = router.options().max_recv_message;
    let max_calls = router.options().max_concurrent_streams.max(1) as usize;
    let queue = router.options().request_queue.max(1);
    let mut reader = Reader::new(limit + FRAME_SLACK, router.lends());
    let mut calls: FuturesUnordered<BoxFuture<'static, (u32, u64)>> = FuturesUnordered::new();
    let mut open: HashMap<u32, Open> = HashMap::new();
    let mut deadlines = Deadlines::default();
    let mut seq = 0u64;
    let mut decoder = Decoder::new();
    let mut eof = false;
    let mut draining = router.drain().started_boxed();

    'conn: loop {
        // Every whole frame already buffered.
        loop {
            let next = match reader.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(_) => break 'conn,
            };
            if next.0.has(OPEN) {
                if let Some((service, _)) = router.route_by_index(next.0.method) {
                    reader.affinity = Some(service);
                }
            }
            let mut state = Calls {
                calls: &mut calls,
                open: &mut open,
                deadlines: &mut deadlines,
                seq: &mut seq,
            };
            if dispatch(&router, &wtx, &mut state, &mut decoder, next, queue).await.is_err() {
                break 'conn;
            }
        }
        // Draining, a connection closes between calls (the lean frame has
        // no GOAWAY): the client reconnects for its next one.
        if (eof || router.drain().is_draining()) && calls.is_empty() {
            break;
        }
        if !eof {
            reader.prepare(&|prefer, need| router.landing(prefer, need));
        }
        tokio::select! {
            // Finished calls first: a call whose answer is out is never
            // also ended by its deadline.
            biased;
            () = draining.as_mut(), if calls.is_empty() && !router.drain().is_draining() => {}
            done = calls.next(), if !calls.is_empty() => {
                if let Some((id, seq)) = done {
                    if live(&open, id, seq) {
                        open.remove(&id);
                    }
                }
            }
            () = deadlines.wait(), if deadlines.armed() => {
                for id in deadlines.due(Instant::now(), &open) {
                    if let Some(o) = open.remove(&id) {
                        o.abort.abort();
                        send_status(&wtx, id, &crate::server::deadline_exceeded()).await;
                    }
                }
            }
            n = reader.read(&mut rd), if !eof && open.len() < max_calls => {
                match n {
                    Ok(0) | Err(_) => {
                        // The client is gone or half-closed: calls still
                        // running finish (their answers may still be read).
                        eof = true;
                        for o in open.values_mut() {
                            o.requests = None;
                        }
                    }
                    Ok(_) => crate::busy::note_read(),
                }
            }
        }
    }
    for o in open.values() {
        o.abort.abort();
    }
    drop(calls);
    drop(wtx);
    let _ = writer.await;
}

/// Smallest landing the reader asks for: room for many small frames per
/// read.
const LANDING_MIN: usize = 64 << 10;

/// Where the reader receives: its own memory, or a landing a service lent
/// (see [`protoplane_grpc::landing`]: a split engine's region, so each request's
/// wire bytes arrive where the application reads them, with no copy).
enum Inbuf {
    Private(BytesMut),
    Lent { f: Filling, service: usize },
}

/// The connection's receive side: frames cut off the buffer as they
/// complete, and the choice of buffer for the next read.
struct Reader {
    buf: Inbuf,
    /// The service the last call went to: the next landing comes from it.
    affinity: Option<usize>,
    /// The largest frame received (a landing should hold a few).
    biggest: usize,
    /// Largest frame allowed.
    limit: usize,
    /// Whether any service may lend landings.
    lends: bool,
}

impl Reader {
    fn new(limit: usize, lends: bool) -> Reader {
        let buf = Inbuf::Private(BytesMut::with_capacity(if lends { 0 } else { LANDING_MIN }));
        Reader { buf, affinity: None, biggest: 0, limit, lends }
    }

    /// The next whole frame, if one is buffered.
    fn next_frame(&mut self) -> Result<Option<(frame::FrameHeader, Bytes)>, LeanError> {
        let got = match &mut self.buf {
            Inbuf::Private(b) => frame::next_frame(b, self.limit)?,
            Inbuf::Lent { f, .. } => match frame::header(f.filled(), self.limit)? {
                Some(h) if f.filled().len() >= frame::HEADER_LEN + h.len as usize => {
                    Some((h, f.cut(frame::HEADER_LEN + h.len as usize, frame::HEADER_LEN)))
                }
                _ => None,
            },
        };
        if let Some((h, _)) = &got {
            self.biggest = self.biggest.max(frame::HEADER_LEN + h.len as usize);
        }
        Ok(got)
    }

    /// Picks the buffer for the next read. Between frames, a landing from
    /// the service of the last call when the current one is private, from
    /// another service, or too short for a frame as large as the largest
    /// seen. Mid-frame, a frame that cannot fit in what is left of its
    /// landing moves, with the bytes received so far, to a landing that
    /// holds it (or to private memory): the only bytes the lean path
    /// copies, counted by the landing's service.
    fn prepare(&mut self, lend: &Lend<'_>) {
        if !self.lends {
            return;
        }
        let next = self.biggest.max(4096);
        let want = (4 * self.biggest).max(LANDING_MIN);
        let pending = match &self.buf {
            Inbuf::Private(b) => b.len(),
            Inbuf::Lent { f, .. } => f.filled().len(),
        };
        if pending == 0 {
            let stale = match &self.buf {
                Inbuf::Private(_) => true,
                Inbuf::Lent { f, service } => {
                    f.capacity() < next
                        || !f.alive()
                        || self.affinity.is_some_and(|a| a != *service)
                }
            };
            if stale {
                if let Some((service, l)) = lend(self.affinity, want) {
                    self.buf = Inbuf::Lent { f: Filling::new(l), service };
                } else if matches!(&self.buf, Inbuf::Lent { f, .. } if !f.alive()) {
                    self.buf = Inbuf::Private(BytesMut::with_capacity(want));
                }
            }
        } else if let Inbuf::Lent { f, service } = &self.buf {
            let need = match frame::header(f.filled(), self.limit) {
                Ok(Some(h)) => frame::HEADER_LEN + h.len as usize,
                _ => frame::HEADER_LEN,
            };
            if need > f.capacity() {
                let service = *service;
                let Inbuf::Lent { f, .. } =
                    std::mem::replace(&mut self.buf, Inbuf::Private(BytesMut::new()))
                else {
                    return;
                };
                // Frames are cut from the front, so what is pending starts
                // with a header: the rest is payload, the bytes counted.
                let counted = f.filled().len().saturating_sub(frame::HEADER_LEN);
                let f = match lend(Some(service), need.max(want)) {
                    Some((service, l)) => match f.move_to(l, counted) {
                        Ok(f) => {
                            self.buf = Inbuf::Lent { f, service };
                            return;
                        }
                        Err(f) => f,
                    },
                    None => f,
                };
                let mut b = BytesMut::with_capacity(need);
                b.extend_from_slice(f.filled());
                f.moved_out(counted);
                self.buf = Inbuf::Private(b);
            }
        }
        if let Inbuf::Lent { f, .. } = &self.buf {
            if f.room() == 0 {
                self.buf = Inbuf::Private(BytesMut::with_capacity(want));
            }
        }
    }

    /// Reads what the socket has into the buffer (cancel-safe: nothing
    /// is read if the future is dropped before it completes).
    async fn read<R: AsyncRead + Unpin>(&mut self, rd: &mut R) -> std::io::Result<usize> {
        match &mut self.buf {
            Inbuf::Private(b) => {
                if b.capacity() == b.len() {
                    b.reserve(LANDING_MIN);
                }
                rd.read_buf(b).await
            }
            Inbuf::Lent { f, .. } => {
                let to = Self::read_len(self.biggest, f);
                let n = rd.read(&mut f.spare()[..to]).await?;
                f.advance(n);
                Ok(n)
            }
        }
    }

    /// How much of a landing's room one read may fill. A connection's
    /// first frame is read header first: its size picks a landing that
    /// holds it before any of its payload arrives (later ones are sized
    /// by the largest frame seen).
    fn read_len(biggest: usize, f: &Filling) -> usize {
        let probe = frame::HEADER_LEN.saturating_sub(f.filled().len());
        if biggest == 0 && probe > 0 {
            probe.min(f.room())
        } else {
            f.room()
        }
    }

    /// [`Reader::read`] from bytes in memory: takes what one read would
    /// (at most `max`) from `src`; how many.
    fn receive(&mut self, src: &[u8], max: usize) -> usize {
        match &mut self.buf {
            Inbuf::Private(b) => {
                let n = src.len().min(max);
                b.extend_from_slice(&src[..n]);
                n
            }
            Inbuf::Lent { f, .. } => {
                let n = src.len().min(max).min(Self::read_len(self.biggest, f));
                f.spare()[..n].copy_from_slice(&src[..n]);
                f.advance(n);
                n
            }
        }
    }
}

/// Where a reader gets landings: `(preferred service, bytes)` to the
/// lending service and the landing.
type Lend<'a> = dyn Fn(Option<usize>, usize) -> Option<(usize, Landing)> + 'a;

/// For the `lean` fuzz target and tests: splits `bytes` into frames as a
/// connection's reader does, each read taking at most the next of `reads`
/// bytes (cycled; 0 counts as 1), with landings from `lend` (the first
/// frame opens a call to service 0). Returns the frames cut before the
/// bytes ran out or the first protocol error, and that error.
#[doc(hidden)]
pub fn reassemble(
    bytes: &[u8],
    reads: &[u8],
    limit: usize,
    lend: &Lend<'_>,
) -> (Vec<(frame::FrameHeader, Bytes)>, Option<LeanError>) {
    let mut reader = Reader::new(limit, true);
    let (mut at, mut turn, mut frames) = (0, 0, Vec::new());
    loop {
        loop {
            match reader.next_frame() {
                Ok(Some(f)) => {
                    reader.affinity = Some(0);
                    frames.push(f);
                }
                Ok(None) => break,
                Err(e) => return (frames, Some(e)),
            }
        }
        if at == bytes.len() {
            return (frames, None);
        }
        reader.prepare(lend);
        let max = reads.get(turn % reads.len().max(1)).map_or(usize::MAX, |&r| r.max(1) as usize);
        turn += 1;
        at += reader.receive(&bytes[at..], max);
    }
}

/// Acts on one frame. `Err` when the connection must end.
/// A connection's calls, as [`dispatch`] changes them.
struct Calls<'a> {
    calls: &'a mut FuturesUnordered<BoxFuture<'static, (u32, u64)>>,
    open: &'a mut HashMap<u32, Open>,
    deadlines: &'a mut Deadlines,
    /// The last call's number.
    seq: &'a mut u64,
}

async fn dispatch(
    router: &Arc<Router>,
    wtx: &super::FrameTx,
    state: &mut Calls<'_>,
    decoder: &mut Decoder,
    (h, payload): (frame::FrameHeader, Bytes),
    queue: usize,
) -> Result<(), LeanError> {
    let id = h.call;
    let open = &mut *state.open;
    if h.has(CANCEL) {
        if let Some(o) = open.remove(&id) {
            o.abort.abort();
            // The client expects no answer, but a status frame keeps the
            // call table of a confused client consistent.
            send_status(wtx, id, &Status::new(Code::Cancelled, "cancelled")).await;
        }
        return Ok(());
    }
    let sections = frame::parse(&h, payload)?;
    if !h.has(OPEN) {
        // A later frame of a client-streaming call.
        let Some(o) = open.get_mut(&id) else { return Ok(()) };
        if let (Some(msg), Some(tx)) = (sections.message, o.requests.as_ref()) {
            let service = router.service(o.service);
            let (schema, raw) = (service.schema().clone(), service.decodes_requests());
            match Message::decode_request(schema.tables(), o.input, msg, decoder, raw) {
                // Waiting for room here holds up the connection: a full
                // queue means the handler is behind, and the client's
                // frames wait in TCP (bounded) rather than in memory.
                Ok(m) => {
                    let _ = tx.send(m).await;
                }
                Err(st) => {
                    o.abort.abort();
                    open.remove(&id);
                    send_status(wtx, id, &st).await;
                    return Ok(());
                }
            }
        }
        if h.has(END) {
            if let Some(o) = open.get_mut(&id) {
                o.requests = None;
            }
        }
        return Ok(());
    }
    if open.contains_key(&id) {
        return Err(LeanError::Malformed("call id already open"));
    }
    let (timeout, metadata) = sections.open.unwrap_or_default();
    let Some((svc_index, method_id)) = router.route_by_index(h.method) else {
        send_status(
            wtx,
            id,
            &Status::new(Code::Unimplemented, format!("unknown method #{}", h.method)),
        )
        .await;
        return Ok(());
    };
    let service = router.service(svc_index).clone();
    let schema = service.schema().clone();
    let raw = service.decodes_requests();
    let Some(method) = schema.method(method_id) else { return Ok(()) };
    let (requests, streaming) = if method.client_streaming {
        let (tx, rx) = mpsc::channel(queue);
        if let Some(msg) = sections.message {
            match Message::decode_request(schema.tables(), method.input, msg, decoder, raw) {
                Ok(m) => {
                    let _ = tx.try_send(m);
                }
                Err(st) => {
                    send_status(wtx, id, &st).await;
                    return Ok(());
                }
            }
        }
        (if h.has(END) { None } else { Some(tx) }, Streaming::queue(rx))
    } else {
        // A method taking one request: the opening frame carries it.
        let (Some(msg), true) = (sections.message, h.has(END)) else {
            let st = Status::new(Code::Internal, "a unary call must open with its request and END");
            send_status(wtx, id, &st).await;
            return Ok(());
        };
        match Message::decode_request(schema.tables(), method.input, msg, decoder, raw) {
            Ok(m) => (None, Streaming::one(m)),
            Err(st) => {
                send_status(wtx, id, &st).await;
                return Ok(());
            }
        }
    };
    let deadline = timeout.map(|t| Instant::now() + t);
    let request = Request { metadata, deadline, peer: None, message: streaming };
    let (responder, orx, single) = if method.server_streaming {
        let (tx, rx) = mpsc::channel(router.options().response_queue.max(1));
        (Responder::stream(tx, method.output), Some(rx), None)
    } else {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (Responder::unary(tx, method.output), None, Some(rx))
    };
    let handler = service.call(method_id, request, responder);
    let (abort, reg) = AbortHandle::new_pair();
    let output = method.output;
    let limit = router.options().max_send_message;
    *state.seq += 1;
    let seq = *state.seq;
    // An aborted call (cancelled, or past its deadline) was answered by
    // the connection's loop. A combinator, not an `async` block: the block
    // would hold the driver twice (captured, and moved into its await),
    // doubling every call's boxed state.
    let wtx = wtx.clone();
    let schema = schema.clone();
    match (orx, single) {
        (Some(orx), _) => {
            let driver = drive_stream(handler, orx, wtx, id, schema, output, deadline, limit);
            state.calls.push(Box::pin(Abortable::new(driver, reg).map(move |_| (id, seq))));
        }
        (None, single) => {
            let driver = drive_unary(handler, single, wtx, id, schema, output, deadline, limit);
            state.calls.push(Box::pin(Abortable::new(driver, reg).map(move |_| (id, seq))));
        }
    }
    open.insert(id, Open { abort, requests, input: method.input, service: svc_index, seq });
    if let Some(d) = deadline {
        state.deadlines.add(d, id, seq, open);
    }
    Ok(())
}

async fn send_status(wtx: &super::FrameTx, call: u32, st: &Status) {
    let mut out = Vec::new();
    if frame::write(&mut out, call, 0, &Outgoing { status: Some(st), ..Outgoing::default() })
        .is_some()
    {
        let _ = wtx.send(Bytes::from(out)).await;
    }
}

/// Encodes one response item to its message bytes.
fn encode_out(
    item: Out,
    schema: &protoplane_grpc::schema::Schema,
    output: u32,
    limit: usize,
) -> Result<Vec<u8>, Status> {
    let bytes = match item {
        Out::Block(block, _) => {
            protoplane_grpc::codec::with_encoded(schema.tables(), output, &block, <[u8]>::to_vec)?
        }
        Out::Encoded(b, _) => b.to_vec(),
        Out::Headers(_) | Out::Staged(_) => Vec::new(),
    };
    if bytes.len() > limit {
        return Err(Status::new(Code::ResourceExhausted, "response exceeds the send limit"));
    }
    Ok(bytes)
}

/// Runs a call with one response: polls the handler, then writes its
/// answer — headers it sent early, the response and the status — as
/// frames built at once and queued together, a single response in the
/// same frame as the status.
///
/// Every call's state is this future (boxed once), so what might wait
/// beyond the handler (headers the handler sends while it runs, a full
/// write queue) waits in a box of its own, and it is an `async` block
/// rather than an `async fn`, which would keep a second copy of each
/// argument: 1,728 bytes per call became 560, under the 1,032 bytes glibc
/// serves from its per-thread cache.
// Not an `async fn`: see above (clippy would have one).
#[allow(clippy::too_many_arguments, clippy::manual_async_fn)]
fn drive_unary(
    handler: BoxFuture<'static, Result<Metadata, Status>>,
    single: Option<tokio::sync::oneshot::Receiver<protoplane_grpc::call::UnaryOut>>,
    wtx: super::FrameTx,
    call: u32,
    schema: Arc<protoplane_grpc::schema::Schema>,
    output: u32,
    deadline: Option<Instant>,
    limit: usize,
) -> impl Future<Output = ()> + Send + 'static {
    async move {
        // The deadline is the connection's to enforce (see the module's
        // docs); the handler sees it as the running call's.
        let mut timed = std::pin::pin!(crate::deadline::scoped(deadline, handler));
        let mut slot = single.map(protoplane_grpc::call::UnarySlot::new);
        let outcome = loop {
            tokio::select! {
                biased;
                r = &mut timed => break r,
                md = async { slot.as_mut().expect("polled only while present").early_headers().await }, if slot.is_some() => {
                    if Box::pin(send_headers(&wtx, call, &md)).await.is_err() {
                        return;
                    }
                }
            }
        };
        let (early, one) =
            slot.as_mut().map_or((None, protoplane_grpc::call::UnaryOut::none()), |s| s.finish());
        let out = unary_frames(call, early, one, outcome, &schema, output, limit);
        if !out.is_empty() {
            let _ = wtx.send(Bytes::from(out)).await;
        }
    }
}

/// The frames that end a call with one response: the headers it sent
/// early (if it did), then the response with the status, or the status
/// alone.
fn unary_frames(
    call: u32,
    early: Option<Metadata>,
    one: protoplane_grpc::call::UnaryOut,
    outcome: Result<Metadata, Status>,
    schema: &protoplane_grpc::schema::Schema,
    output: u32,
    limit: usize,
) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(md) = &early {
        let _ =
            frame::write(&mut out, call, 0, &Outgoing { headers: Some(md), ..Outgoing::default() });
    }
    let (headers, item) = (one.headers, one.message);
    let headers = headers.filter(|h| !h.is_empty());
    let ok = |trailers| Status { metadata: trailers, ..Status::ok() };
    // The common case: encode straight into the response frame.
    if let (Ok(trailers), Some(Out::Block(block, _))) = (&outcome, &item) {
        let st = ok(trailers.clone());
        let mark = out.len();
        let framed =
            protoplane_grpc::codec::with_encoded(schema.tables(), output, block, |bytes| {
                if bytes.len() > limit {
                    return None;
                }
                out.reserve(64 + bytes.len());
                let f = Outgoing {
                    headers: headers.as_ref(),
                    message: Some(bytes),
                    status: Some(&st),
                    ..Outgoing::default()
                };
                frame::write(&mut out, call, 0, &f)
            });
        let st = match framed {
            Ok(Some(())) => return out,
            Ok(None) => Status::new(Code::ResourceExhausted, "response exceeds the send limit"),
            Err(st) => st,
        };
        out.truncate(mark);
        put_frame(&mut out, call, headers, None, Some(&st));
        return out;
    }
    let (st, msg) = match (outcome, item) {
        (Ok(trailers), Some(item)) => match encode_out(item, schema, output, limit) {
            Ok(b) => (ok(trailers), Some(b)),
            Err(st) => (st, None),
        },
        (Ok(trailers), None) => (ok(trailers), None),
        (Err(st), _) => (st, None),
    };
    put_frame(&mut out, call, headers, msg.as_deref(), Some(&st));
    out
}

/// Appends one frame to `out` (nothing if it cannot be framed).
fn put_frame(
    out: &mut Vec<u8>,
    call: u32,
    headers: Option<Metadata>,
    msg: Option<&[u8]>,
    st: Option<&Status>,
) {
    let mark = out.len();
    let f = Outgoing {
        headers: headers.as_ref().filter(|h| !h.is_empty()),
        message: msg,
        status: st,
        ..Outgoing::default()
    };
    if frame::write(out, call, 0, &f).is_none() {
        out.truncate(mark);
    }
}

/// Runs a call with a stream of responses: polls the handler, encodes and
/// queues each response as it comes, ends with the status.
#[allow(clippy::too_many_arguments)]
async fn drive_stream(
    handler: BoxFuture<'static, Result<Metadata, Status>>,
    mut orx: mpsc::Receiver<Out>,
    wtx: super::FrameTx,
    call: u32,
    schema: Arc<protoplane_grpc::schema::Schema>,
    output: u32,
    deadline: Option<Instant>,
    limit: usize,
) {
    // The deadline is the connection's to enforce (see the module's
    // docs); the handler sees it as the running call's.
    let timed = crate::deadline::scoped(deadline, handler);
    let mut headers: Option<Metadata> = None;
    tokio::pin!(timed);
    let mut outcome = None;
    let mut open = true;
    while outcome.is_none() || open {
        tokio::select! {
            biased;
            o = orx.recv(), if open => match o {
                None => open = false,
                Some(Out::Headers(md)) => {
                    headers = None;
                    if send_headers(&wtx, call, &md).await.is_err() {
                        return;
                    }
                }
                Some(Out::Staged(md)) => headers = Some(md),
                Some(item) => match encode_out(item, &schema, output, limit) {
                    // The connection's writer is gone: stop the handler.
                    Ok(b) => {
                        if emit(&wtx, call, headers.take(), Some(&b), None).await.is_err() {
                            return;
                        }
                    }
                    Err(st) => {
                        outcome = Some(Err(st));
                        break;
                    }
                },
            },
            r = &mut timed, if outcome.is_none() => outcome = Some(r),
        }
    }
    let st = match outcome {
        Some(Ok(trailers)) => Status { metadata: trailers, ..Status::ok() },
        Some(Err(st)) => st,
        None => Status::new(Code::Internal, "the handler ended without an outcome"),
    };
    let _ = emit(&wtx, call, headers, None, Some(&st)).await;
}

/// A HEADERS frame of its own: headers the handler sent explicitly (empty
/// metadata too: the client learns the headers have come).
async fn send_headers(wtx: &super::FrameTx, call: u32, md: &Metadata) -> Result<(), ()> {
    let mut out = Vec::new();
    match frame::write(&mut out, call, 0, &Outgoing { headers: Some(md), ..Outgoing::default() }) {
        Some(()) => wtx.send(Bytes::from(out)).await,
        None => Ok(()),
    }
}

async fn emit(
    wtx: &super::FrameTx,
    call: u32,
    headers: Option<Metadata>,
    msg: Option<&[u8]>,
    st: Option<&Status>,
) -> Result<(), ()> {
    let mut out = Vec::with_capacity(64 + msg.map_or(0, <[u8]>::len));
    put_frame(&mut out, call, headers, msg, st);
    if out.is_empty() {
        return Ok(());
    }
    wtx.send(Bytes::from(out)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_call(seq: u64) -> Open {
        let (abort, _) = AbortHandle::new_pair();
        Open { abort, requests: None, input: 0, service: 0, seq }
    }

    /// Entries of ended calls are dropped once they outnumber the open
    /// calls, and only open calls (by id and number) come due.
    #[test]
    fn the_deadline_heap_stays_within_twice_the_open_calls() {
        let (mut d, mut open) = (Deadlines::default(), HashMap::new());
        let t0 = Instant::now();
        let far = t0 + std::time::Duration::from_secs(3600);
        // One call stays open; 10,000 others open and end, each reusing
        // id 7 (as a client may), with an hour-long deadline.
        open.insert(1, open_call(1));
        d.add(t0, 1, 1, &open);
        for seq in 2..10_002u64 {
            open.insert(7, open_call(seq));
            d.add(far, 7, seq, &open);
            assert!(d.heap.len() <= 2 * open.len() + 65, "{} entries", d.heap.len());
            open.remove(&7);
        }
        // Id 7 open again, under a newer number: the older entries are not
        // its deadline.
        open.insert(7, open_call(20_000));
        d.add(far + std::time::Duration::from_secs(1), 7, 20_000, &open);
        assert_eq!(d.due(far, &open), vec![1], "only call 1 is due by `far`");
        assert_eq!(d.due(far + std::time::Duration::from_secs(1), &open), vec![7]);
        assert!(!d.armed());
    }
    use protoplane_grpc::landing::Keeper;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Landings of leaked memory (a test's worth), sized up to a page
    /// multiple and refused above `max`; counts moved bytes and landings
    /// alive.
    #[derive(Default)]
    struct Lender {
        moved: Arc<AtomicUsize>,
        alive: Arc<AtomicUsize>,
        lent: AtomicUsize,
    }

    struct Keep(Arc<AtomicUsize>, Arc<AtomicUsize>);

    impl Keeper for Keep {
        fn moved(&self, bytes: usize) {
            self.0.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    impl Drop for Keep {
        fn drop(&mut self) {
            self.1.fetch_sub(1, Ordering::Relaxed);
        }
    }

    impl Lender {
        fn lend(&self, need: usize, max: usize) -> Option<(usize, Landing)> {
            if need > max {
                return None;
            }
            self.alive.fetch_add(1, Ordering::Relaxed);
            self.lent.fetch_add(1, Ordering::Relaxed);
            let mem = Box::leak(vec![0u8; need.next_multiple_of(4096)].into_boxed_slice());
            Some((0, Landing::new(mem, Arc::new(Keep(self.moved.clone(), self.alive.clone())))))
        }
    }

    /// A little generator (xorshift), so failures replay.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n.max(1)
        }
    }

    #[test]
    fn frames_received_into_landings_are_the_frames_sent() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for round in 0..200 {
            let mut bytes = Vec::new();
            let mut sent = Vec::new();
            for call in 0..1 + rng.below(40) as u32 {
                // Mostly small messages, now and then one of up to 300 KB.
                let len = match rng.below(10) {
                    0 => rng.below(300_000),
                    _ => rng.below(3000),
                } as usize;
                let msg: Vec<u8> = (0..len).map(|i| (i as u32 * 31 + call) as u8).collect();
                let out = frame::Outgoing {
                    message: Some(&msg),
                    end: true,
                    ..frame::Outgoing::default()
                };
                frame::write(&mut bytes, call, 0, &out).expect("frame");
                sent.push(msg);
            }
            let reads: Vec<u8> = (0..1 + rng.below(8)).map(|_| rng.below(256) as u8).collect();
            // Landings up to 64 KiB, or up to 1 MiB: large frames go
            // private, or move to a landing that holds them.
            let max = if round % 2 == 0 { 64 << 10 } else { 1 << 20 };
            let lender = Lender::default();
            let lend = |_: Option<usize>, need: usize| lender.lend(need, max);
            let (frames, err) = reassemble(&bytes, &reads, 1 << 20, &lend);
            assert!(err.is_none(), "round {round}: {err:?}");
            assert_eq!(frames.len(), sent.len(), "round {round}");
            for ((h, payload), msg) in frames.iter().zip(&sent) {
                let s = frame::parse(h, payload.clone()).expect("sections");
                assert_eq!(s.message.as_deref(), Some(&msg[..]), "round {round}");
            }
            assert!(lender.lent.load(Ordering::Relaxed) > 0, "round {round}: nothing landed");
            let moved = lender.moved.load(Ordering::Relaxed);
            let total: usize = sent.iter().map(|m| m.len() + 16).sum();
            assert!(moved <= total, "round {round}: moved {moved} of {total}");
            drop(frames);
            assert_eq!(lender.alive.load(Ordering::Relaxed), 0, "round {round}: landings leak");
        }
    }
}
