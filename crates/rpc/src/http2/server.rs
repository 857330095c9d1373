//! The gRPC server on protoplane's own HTTP/2 (`protoplane_http2::conn`).
//!
//! One task per connection, and nothing per call: the task reads into one
//! large buffer, runs every frame in it through the connection state
//! machine, and drives each call as a state machine of its own — the
//! handler's future ([`Service::call`]) is polled right here, with a
//! waker that names the call, so a unary call whose handler answers at
//! once is decoded, handled, encoded and framed without a task, a channel
//! hop or a context switch. Everything the calls produce goes into the
//! connection's output, written with one vectored write per round.
//!
//! A call's state: its gRPC message framing, the request (one message for
//! unary and server-streaming methods, decoded before the handler runs; a
//! bounded queue for client-streaming ones, which holds back HTTP/2 credit
//! when full), the handler's future, the response queue or unary slot, and
//! its deadline (one timer per connection, set to the earliest deadline).

use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::future::{poll_fn, Future};
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::task::AtomicWaker;
use protoplane_wire::Decoder;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

use crate::metrics::{CallSizes, MethodCalls};
use crate::server::{deadline_exceeded, same_service, Router, ServerOptions};
use protoplane_grpc::call::{
    BoxFuture, Message, Out, Peer, Request, Responder, Streaming, UnarySlot,
};
use protoplane_grpc::codec::{self, Encoding, ACCEPT_ENCODING};
use protoplane_grpc::frame::{Frame, FrameDecoder, FRAME_HEADER_LEN};
use protoplane_grpc::metadata::Metadata;
use protoplane_grpc::schema::Schema;
use protoplane_grpc::status::{self, Code, Status};
use protoplane_grpc::timeout;
use protoplane_http2::conn::{Config, Conn, Event, FieldSink, HeaderList, Role};
use protoplane_http2::frame::Reason;
use protoplane_http2::hpack::Index;

/// Output beyond which the connection stops reading: a peer that sends
/// requests (or PINGs) but does not read the answers holds this much of
/// our memory, no more.
const OUTPUT_LIMIT: usize = 1 << 20;

/// A streaming call's response data queued in the connection beyond which
/// the handler's next response is not taken (it waits in its queue, and
/// the handler in turn waits on it).
const STREAM_PENDING_LIMIT: usize = 64 << 10;

/// Size of the read buffer; one read takes whatever the socket has, up to
/// this.
const READ_CHUNK: usize = 64 << 10;

/// The HTTP/2 settings of a server connection.
pub(crate) fn config(o: &ServerOptions) -> Config {
    let mut c = Config::new(Role::Server);
    c.max_concurrent_streams = o.max_concurrent_streams;
    c.stream_window = o.stream_window;
    c.connection_window = o.connection_window;
    c.max_header_list = o.max_header_list;
    c
}

/// Serves one connection until it closes.
pub(crate) async fn serve<IO>(router: Arc<Router>, io: IO, peer: Arc<Peer>)
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let shared = Arc::new(Shared { ready: Mutex::new(Vec::new()), waker: AtomicWaker::new() });
    let mut d = Driver {
        conn: Conn::new(config(router.options())),
        router,
        io,
        input: BytesMut::with_capacity(READ_CHUNK),
        calls: Vec::new(),
        free: Vec::new(),
        by_stream: HashMap::default(),
        shared,
        ready: Vec::new(),
        credit_waiters: Vec::new(),
        timers: BinaryHeap::new(),
        sleep: None,
        peer,
        decoder: Decoder::new(),
        eof: false,
        dead: false,
        shutdown: None,
        shutdown_armed: false,
        turn: Instant::now(),
        epoch: Instant::now(),
        ended_calls: Vec::new(),
        read_since_timer: false,
        pinged: false,
        last_client_ping: None,
        ping_strikes: 0,
        idle_since: None,
        idle_gen: 0,
        leaving: false,
    };
    d.shutdown = Some(d.router.drain().started_boxed());
    d.run().await;
}

/// Wakeups from calls' futures to the connection task.
struct Shared {
    ready: Mutex<Vec<u32>>,
    waker: AtomicWaker,
}

/// The waker of one call slot: reused by every call the slot holds (a
/// stale wakeup of an earlier call only polls the slot once more).
struct SlotWaker {
    shared: Arc<Shared>,
    slot: u32,
    queued: AtomicBool,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            if let Ok(mut r) = self.shared.ready.lock() {
                r.push(self.slot);
            }
            self.shared.waker.wake();
        }
    }
}

/// One slot of the call table.
struct Slot {
    waker: Arc<SlotWaker>,
    waker_handle: Waker,
    /// Bumped each time the slot is reused (timers of earlier calls are
    /// then ignored).
    gen: u32,
    call: Option<Call>,
}

/// What the connection task keeps of one call.
struct Call {
    stream: u32,
    service: usize,
    method: u32,
    schema: Arc<Schema>,
    input: u32,
    output: u32,
    client_streaming: bool,
    server_streaming: bool,
    raw: bool,
    encoding: Encoding,
    gzip_ok: bool,
    deadline: Option<Instant>,
    metadata: Option<Metadata>,
    /// The request's messages, cut out of its DATA (large ones referenced
    /// where they landed in the read buffer, small ones copied so the
    /// buffer is reused, not pinned by live requests).
    frames: FrameDecoder,
    /// The largest response message.
    send_limit: usize,
    /// Unary and server-streaming: the request, until the handler starts.
    first: Option<Message>,
    /// Client streaming: decoded requests the handler has not taken, with
    /// the wire bytes each holds back from the flow-control credit.
    pending: VecDeque<(Message, usize)>,
    req_tx: Option<mpsc::Sender<Message>>,
    /// Waits for room in a full request queue.
    reserve: Option<BoxFuture<'static, Result<mpsc::OwnedPermit<Message>, ()>>>,
    /// The request stream ended.
    req_done: bool,
    handler: Option<BoxFuture<'static, Result<Metadata, Status>>>,
    outcome: Option<Result<Metadata, Status>>,
    rx: Option<mpsc::Receiver<Out>>,
    single: Option<UnarySlot>,
    headers_sent: bool,
    initial: Metadata,
    /// The response is all in the connection's hands; the slot stays only
    /// to enforce the deadline on data flow control still holds.
    draining: bool,
    /// Listed in `Driver::credit_waiters`: the call waits for the client's
    /// flow-control credit (its response backlog is over the limit, or it
    /// is draining).
    waits_credit: bool,
    /// With metrics: the method's instruments and when the call started
    /// (the start of the connection task's turn that read its headers).
    measured: Option<(Arc<MethodCalls>, Instant)>,
    /// The status code sent (the first one), for the metrics.
    ended: Option<Code>,
    /// Message bytes each way so far (recorded with metrics only).
    sizes: CallSizes,
}

struct Driver<IO> {
    router: Arc<Router>,
    io: IO,
    conn: Conn,
    input: BytesMut,
    calls: Vec<Slot>,
    free: Vec<u32>,
    by_stream: HashMap<u32, u32>,
    shared: Arc<Shared>,
    ready: Vec<u32>,
    /// Calls to drive again once flow-control credit moved their backlog.
    credit_waiters: Vec<u32>,
    timers: BinaryHeap<std::cmp::Reverse<(Instant, u32, u32)>>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    peer: Arc<Peer>,
    decoder: Decoder,
    eof: bool,
    dead: bool,
    /// Wakes this connection's task when the router starts draining. It is
    /// polled once, which leaves the task's waker with the drain (every
    /// poll of the task has the same one); after that the drain's flag is
    /// read instead, so a wakeup costs an atomic load, not the notifier's
    /// lock. Taken once the connection has sent its graceful GOAWAY.
    shutdown: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    shutdown_armed: bool,
    /// When the current turn of the loop began: the start of the calls
    /// whose headers it reads (their deadlines, and with metrics their
    /// latency). With metrics, the calls that ended in the turn are
    /// recorded at its end with one clock read for all of them.
    turn: Instant,
    /// The start of the connection's clock (see `Conn::set_clock`).
    epoch: Instant,
    ended_calls: Vec<(Arc<MethodCalls>, Instant, Code, CallSizes)>,
    /// Keepalive (see [`crate::keepalive`]): anything read since the
    /// keepalive timer was set; a ping of ours waits for an answer.
    read_since_timer: bool,
    pinged: bool,
    /// The client's last ping, and its strikes.
    last_client_ping: Option<Instant>,
    ping_strikes: u32,
    /// Since when no call has been open (with `max_connection_idle`), and
    /// the generation of the idle timer (bumped when a call opens).
    idle_since: Option<Instant>,
    idle_gen: u32,
    /// The connection sent GOAWAY of its own (idle, age): it ends once
    /// its calls do.
    leaving: bool,
}

/// Slot numbers of the connection's own timers in the timer heap.
const HANDSHAKE: u32 = u32::MAX;
/// Keepalive: ping if nothing was read; or, a ping out, give up if still
/// nothing was.
const KEEPALIVE: u32 = u32::MAX - 1;
/// `max_connection_idle` (generation: `Driver::idle_gen`).
const IDLE: u32 = u32::MAX - 2;
/// `max_connection_age`, then its grace.
const AGE: u32 = u32::MAX - 3;
const AGE_GRACE: u32 = u32::MAX - 4;

impl<IO: AsyncRead + AsyncWrite + Unpin> Driver<IO> {
    async fn run(&mut self) {
        // The client has 10 s for its preface and first SETTINGS.
        let start = Instant::now();
        self.timers.push(std::cmp::Reverse((start + Duration::from_secs(10), HANDSHAKE, 0)));
        let ka = self.router.options().keepalive.clone();
        let least = crate::keepalive::LEAST_INTERVAL;
        self.timers.push(std::cmp::Reverse((start + ka.time.max(least), KEEPALIVE, 0)));
        if let Some(age) = ka.max_connection_age {
            // Seeded by the client's port and this connection's address in
            // memory: connections made together leave at different times.
            let seed = self.peer.addr.map_or(0, |a| u64::from(a.port()))
                ^ (std::ptr::from_ref(self) as u64);
            let at = start + crate::keepalive::jitter(age, seed);
            self.timers.push(std::cmp::Reverse((at, AGE, 0)));
        }
        let measuring = self.router.other_calls.is_some();
        loop {
            // One clock read per turn: the calls whose headers it reads
            // count their deadlines from it, and a call's driving checks
            // its deadline against it (the timer heap ends calls at their
            // deadline to the millisecond); two reads per call before.
            self.turn = Instant::now();
            self.process_input();
            self.wake_credit_waiters();
            self.run_ready();
            let now = Instant::now();
            self.expire(now);
            self.record_ended(now);
            if self.live_calls() == 0 && self.idle_since.is_none() {
                if let Some(idle) = self.router.options().keepalive.max_connection_idle {
                    self.idle_since = Some(now);
                    self.idle_gen = self.idle_gen.wrapping_add(1);
                    self.timers.push(std::cmp::Reverse((now + idle, IDLE, self.idle_gen)));
                }
            }
            if self.eof {
                self.drop_stalled();
            }
            if self.shutdown.is_some() && self.router.drain().is_draining() {
                // Graceful: the streams taken go on, no new one is.
                self.shutdown = None;
                self.conn.go_away_gracefully();
            }
            // Drained once the final GOAWAY is out (the client read the
            // first one and opens nothing more here) and the calls ended.
            let drained = (self.shutdown.is_none() || self.leaving)
                && self.conn.is_closing()
                && self.live_calls() == 0;
            if self.dead || (self.eof && self.live_calls() == 0) || drained {
                break;
            }
            if poll_fn(|cx| self.poll_io(cx)).await {
                break;
            }
        }
        if measuring {
            // Calls still open end with the connection: cancelled.
            for slot in 0..self.calls.len() as u32 {
                self.free_slot(slot);
            }
            self.record_ended(Instant::now());
        }
        // Whatever is left (a GOAWAY after a protocol error) goes out.
        let _ =
            tokio::time::timeout(Duration::from_secs(1), poll_fn(|cx| self.poll_flush(cx))).await;
    }

    /// The connection's own timers (keepalive, idle, age).
    fn on_timer(&mut self, which: u32, gen: u32, now: Instant) {
        let ka = &self.router.options().keepalive;
        match which {
            KEEPALIVE => {
                if self.pinged && !self.read_since_timer {
                    // Nothing came back from the client since the ping.
                    self.dead = true;
                    return;
                }
                let next = if self.read_since_timer || self.pinged {
                    self.pinged = false;
                    ka.time
                } else {
                    self.conn.ping(crate::keepalive::KEEPALIVE_PING);
                    self.pinged = true;
                    ka.timeout
                };
                // A zero setting would fire again in this same pass.
                let next = next.max(crate::keepalive::LEAST_INTERVAL);
                self.read_since_timer = false;
                self.timers.push(std::cmp::Reverse((now + next, KEEPALIVE, 0)));
            }
            IDLE if gen == self.idle_gen && self.idle_since.is_some() && self.live_calls() == 0 => {
                self.leaving = true;
                self.conn.go_away_gracefully();
            }
            AGE => {
                self.leaving = true;
                self.conn.go_away_gracefully();
                if let Some(grace) = ka.max_connection_age_grace {
                    self.timers.push(std::cmp::Reverse((now + grace, AGE_GRACE, 0)));
                }
            }
            AGE_GRACE => self.dead = true,
            _ => {}
        }
    }

    /// A client's ping: within the policy, or a strike (see
    /// [`crate::keepalive`]); the third strike closes the connection.
    fn on_client_ping(&mut self) {
        let now = Instant::now();
        let ka = &self.router.options().keepalive;
        let last = self.last_client_ping.replace(now);
        if self.conn.take_sent_stream_frames() {
            // The server sent something since: the client's pings are
            // forgiven (grpc-go's resetPingStrikes).
            self.ping_strikes = 0;
            return;
        }
        let least = if self.live_calls() == 0 && !ka.permit_without_stream {
            crate::keepalive::IDLE_PING_INTERVAL
        } else {
            ka.min_time
        };
        if last.is_some_and(|t| now.saturating_duration_since(t) < least) {
            self.ping_strikes += 1;
            tracing::debug!(
                strikes = self.ping_strikes,
                since_last = ?last.map(|t| now.saturating_duration_since(t)),
                calls = self.live_calls(),
                "a client's ping within the keepalive policy's minimum time"
            );
        }
        if self.ping_strikes > crate::keepalive::MAX_PING_STRIKES {
            self.conn.go_away(Reason::ENHANCE_YOUR_CALM, "too_many_pings");
            self.dead = true;
        }
    }

    /// Records the calls that ended this turn as ending `now`.
    fn record_ended(&mut self, now: Instant) {
        for (m, start, code, sizes) in self.ended_calls.drain(..) {
            m.end(code, now.saturating_duration_since(start), sizes);
        }
    }

    fn live_calls(&self) -> usize {
        self.by_stream.len()
    }

    /// Runs every complete frame in the input through the connection.
    fn process_input(&mut self) {
        while !self.dead {
            match self.conn.next_event(&mut self.input) {
                Ok(Some(ev)) => self.on_event(ev),
                Ok(None) => break,
                Err(_) => {
                    // GOAWAY is queued; calls end with the connection.
                    self.dead = true;
                }
            }
        }
    }

    /// Writes what it can, reads what there is, and waits for the socket,
    /// a call's wakeup or the next deadline. `true`: the connection is
    /// finished.
    fn poll_io(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        let mut progress = false;
        match self.poll_write_out(cx) {
            Poll::Ready(Err(())) => return Poll::Ready(true),
            Poll::Ready(Ok(())) | Poll::Pending => {}
        }
        if !self.eof && self.conn.output().len() < OUTPUT_LIMIT {
            if self.input.capacity() - self.input.len() < READ_CHUNK / 4 {
                self.input.reserve(READ_CHUNK);
            }
            match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.input) {
                Poll::Ready(Err(_)) => {
                    // Reset: nothing sent from now on would arrive.
                    self.dead = true;
                    progress = true;
                }
                Poll::Ready(Ok(0)) => {
                    // The client closed its connection. HTTP/2 has no
                    // half-closed connection (a stream half-closes with
                    // END_STREAM, and a client that stops sending can send
                    // no RST_STREAM or WINDOW_UPDATE either), so this is
                    // the end of every call on it: each is cancelled (its
                    // handler dropped, which tells a split engine's
                    // application) and the socket closes now rather than
                    // when the slowest handler gives up. grpc-go and h2 do
                    // the same.
                    self.eof = true;
                    self.dead = true;
                    progress = true;
                }
                Poll::Ready(Ok(_)) => {
                    crate::busy::note_read();
                    // The reset budget's clock: one read per batch.
                    self.conn.set_clock(self.epoch.elapsed().as_millis() as u64 + 1);
                    self.read_since_timer = true;
                    progress = true;
                }
                Poll::Pending => {}
            }
        }
        self.shared.waker.register(cx.waker());
        if self.shared.ready.lock().map(|r| !r.is_empty()).unwrap_or(false) {
            progress = true;
        }
        if let Some(d) = &mut self.shutdown {
            if !self.shutdown_armed {
                self.shutdown_armed = true;
                if d.as_mut().poll(cx).is_ready() {
                    progress = true;
                }
            } else if self.router.drain().is_draining() {
                progress = true;
            }
        }
        if let Some(std::cmp::Reverse((at, _, _))) = self.timers.peek() {
            let at = tokio::time::Instant::from_std(*at);
            let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
            if sleep.deadline() != at {
                sleep.as_mut().reset(at);
            }
            if sleep.as_mut().poll(cx).is_ready() {
                progress = true;
            }
        }
        if progress {
            Poll::Ready(false)
        } else {
            Poll::Pending
        }
    }

    /// Writes the output until it is empty or the socket is full.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
        let mut wrote = false;
        loop {
            let out = self.conn.output();
            if out.is_empty() {
                if wrote {
                    return Pin::new(&mut self.io).poll_flush(cx).map(|r| r.map_err(|_| ()));
                }
                return Poll::Ready(Ok(()));
            }
            let mut slices = [IoSlice::new(&[]); 64];
            let n = out.slices(&mut slices);
            match Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..n]) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(Err(())),
                Poll::Ready(Ok(k)) => {
                    self.conn.output().advance(k);
                    wrote = true;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match self.poll_write_out(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => Poll::Ready(()),
        }
    }

    // ---- events ------------------------------------------------------------

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Open { stream, end_stream } => self.open(stream, end_stream),
            Event::Data { stream, data, end_stream } => {
                let Some(&slot) = self.by_stream.get(&stream) else {
                    // A stream we answered already: its data is not needed.
                    self.conn.release(stream, data.len());
                    return;
                };
                self.on_data(slot, data, end_stream);
            }
            Event::Trailers { stream } => {
                if let Some(&slot) = self.by_stream.get(&stream) {
                    self.on_request_end(slot);
                }
            }
            Event::Reset { stream, .. } => {
                // The client cancelled (or broke the stream): dropping the
                // call drops its handler, which cancels it.
                if let Some(slot) = self.by_stream.remove(&stream) {
                    self.free_slot(slot);
                }
            }
            Event::Ping { ack: false, .. } => self.on_client_ping(),
            Event::Ping { ack: true, .. } | Event::Headers { .. } | Event::GoAway { .. } => {}
        }
    }

    /// A new request: checked, routed, and (unless it needs its body
    /// first) its handler started.
    fn open(&mut self, stream: u32, end_stream: bool) {
        let router = self.router.clone();
        let h = self.conn.headers();
        if h.too_large() {
            return http_error(&mut self.conn, stream, b"431");
        }
        if h.method() != Some(b"POST") {
            return http_error(&mut self.conn, stream, b"405");
        }
        match codec::content_type(h.get_field(b"content-type")) {
            codec::ContentType::Proto => {}
            codec::ContentType::NotGrpc => return http_error(&mut self.conn, stream, b"415"),
            codec::ContentType::OtherCodec(name) => {
                let st = Status::new(
                    Code::Unimplemented,
                    format!("unsupported codec {name:?}: only protobuf is served"),
                );
                return trailers_only(&mut self.conn, stream, &st, &Metadata::new());
            }
        }
        let path = std::str::from_utf8(h.path().unwrap_or_default()).unwrap_or("");
        let Some(route) = router.routes.get(path) else {
            let msg = match router.routes.keys().any(|p| same_service(p, path)) {
                true => format!("unknown method {path}"),
                false => format!("unknown service {path}"),
            };
            let st = Status::new(Code::Unimplemented, msg);
            if let Some(other) = &router.other_calls {
                other.start();
                other.end(st.code, Duration::ZERO, CallSizes::default());
            }
            return trailers_only(&mut self.conn, stream, &st, &Metadata::new());
        };
        let measured = route.calls.as_ref().map(|m| {
            m.start();
            (m.clone(), self.turn)
        });
        let parsed = parse_head(h, self.turn);
        let head = match parsed {
            Ok(head) => head,
            Err(st) => {
                if let Some((m, start)) = measured {
                    self.ended_calls.push((m, start, st.code, CallSizes::default()));
                }
                return trailers_only(&mut self.conn, stream, &st, &Metadata::new());
            }
        };
        let service = &router.services[route.service];
        let schema = service.schema().clone();
        let Some(method) = schema.method(route.method) else {
            let st = Status::new(Code::Internal, "route to a missing method");
            if let Some((m, start)) = measured {
                self.ended_calls.push((m, start, st.code, CallSizes::default()));
            }
            return trailers_only(&mut self.conn, stream, &st, &Metadata::new());
        };
        let call = Call {
            stream,
            service: route.service,
            method: route.method,
            input: method.input,
            output: method.output,
            client_streaming: method.client_streaming,
            server_streaming: method.server_streaming,
            raw: service.decodes_requests(),
            schema: schema.clone(),
            encoding: head.encoding,
            gzip_ok: head.gzip_ok,
            deadline: head.deadline,
            metadata: Some(head.metadata),
            frames: FrameDecoder::new(router.options().max_recv_message),
            send_limit: router.options().max_send_message,
            first: None,
            pending: VecDeque::new(),
            req_tx: None,
            reserve: None,
            req_done: false,
            handler: None,
            outcome: None,
            rx: None,
            single: None,
            headers_sent: false,
            initial: Metadata::new(),
            draining: false,
            waits_credit: false,
            measured,
            ended: None,
            sizes: CallSizes::default(),
        };
        let slot = self.alloc(call);
        self.by_stream.insert(stream, slot);
        if let Some(d) = head.deadline {
            let gen = self.calls[slot as usize].gen;
            self.timers.push(std::cmp::Reverse((d, slot, gen)));
            // A call's entry stays when it ends, skipped when it comes up;
            // past twice the open calls the heap keeps only live entries,
            // so it never outgrows them (hour-long deadlines at a high
            // rate would otherwise grow it for an hour).
            if self.timers.len() > 2 * self.by_stream.len() + 64 {
                let calls = &self.calls;
                self.timers.retain(|std::cmp::Reverse((_, slot, gen))| {
                    *slot >= AGE_GRACE
                        || calls
                            .get(*slot as usize)
                            .is_some_and(|s| s.gen == *gen && s.call.is_some())
                });
            }
        }
        if end_stream {
            self.on_request_end(slot);
        } else if method.client_streaming {
            // The handler runs before its first request arrives, once the
            // input at hand is processed: a stream reset in the same read
            // never costs a handler poll (rapid reset).
            self.start(slot);
            self.calls[slot as usize].waker_handle.wake_by_ref();
        }
    }

    fn alloc(&mut self, call: Call) -> u32 {
        self.idle_since = None;
        if let Some(i) = self.free.pop() {
            let s = &mut self.calls[i as usize];
            s.gen = s.gen.wrapping_add(1);
            s.call = Some(call);
            return i;
        }
        let i = self.calls.len() as u32;
        let waker = Arc::new(SlotWaker {
            shared: self.shared.clone(),
            slot: i,
            queued: AtomicBool::new(false),
        });
        let waker_handle = Waker::from(waker.clone());
        self.calls.push(Slot { waker, waker_handle, gen: 0, call: Some(call) });
        i
    }

    fn free_slot(&mut self, slot: u32) {
        if let Some(s) = self.calls.get_mut(slot as usize) {
            if let Some(mut c) = s.call.take() {
                if let Some((m, start)) = c.measured.take() {
                    // A call that ends with no status sent was reset (by
                    // the client, or by the server past a partial message).
                    let code = c.ended.unwrap_or(Code::Cancelled);
                    self.ended_calls.push((m, start, code, c.sizes));
                }
                self.by_stream.remove(&c.stream);
                // Dropped here: the handler (cancelled), its queues.
                drop(c);
                self.free.push(slot);
            }
        }
    }

    fn on_data(&mut self, slot: u32, data: Bytes, end_stream: bool) {
        let n = data.len();
        let Some(call) = self.calls[slot as usize].call.as_mut() else { return };
        let stream = call.stream;
        let mut messages = Vec::new();
        if let Err(e) = call.frames.push(data, &mut messages) {
            return self.fail(slot, e.status());
        }
        let mut held = 0;
        for (i, Frame { compressed: z, data: wire }) in messages.into_iter().enumerate() {
            let size = wire.len() + FRAME_HEADER_LEN;
            call.sizes.rcvd += wire.len() as u64;
            let m = match decode(call, &mut self.decoder, z, wire) {
                Ok(m) => m,
                Err(st) => return self.fail(slot, st),
            };
            if call.client_streaming {
                call.pending.push_back((m, size));
                held += size;
            } else if call.first.is_some() || i > 0 {
                let st = Status::new(
                    Code::Unimplemented,
                    "more than one request message for a method that takes one",
                );
                return self.fail(slot, st);
            } else {
                call.first = Some(m);
            }
        }
        // Credit goes back at once except for requests still queued for a
        // client-streaming handler (returned as it takes them).
        self.conn.release(stream, n.saturating_sub(held));
        if end_stream {
            self.on_request_end(slot);
        } else if held > 0 {
            self.drive(slot);
        }
    }

    fn on_request_end(&mut self, slot: u32) {
        let Some(call) = self.calls[slot as usize].call.as_mut() else { return };
        if let Err(e) = call.frames.finish() {
            return self.fail(slot, e.status());
        }
        call.req_done = true;
        if !call.client_streaming && call.first.is_none() {
            return self.fail(slot, Status::new(Code::Unimplemented, "no request message"));
        }
        self.start(slot);
        self.drive(slot);
    }

    /// Ends a call with `status` (its handler, if running, is dropped).
    fn fail(&mut self, slot: u32, status: Status) {
        let Some(call) = self.calls[slot as usize].call.as_mut() else { return };
        call.handler = None;
        finish(&mut self.conn, call, &status, &Metadata::new());
        self.free_slot(slot);
    }

    /// Starts the handler.
    fn start(&mut self, slot: u32) {
        let opts = self.router.options();
        let (request_queue, response_queue) =
            (opts.request_queue.max(1), opts.response_queue.max(1));
        let Some(call) = self.calls[slot as usize].call.as_mut() else { return };
        if call.handler.is_some() || call.outcome.is_some() {
            return;
        }
        let message = if call.client_streaming {
            let (tx, rx) = mpsc::channel(request_queue);
            call.req_tx = Some(tx);
            Streaming::queue(rx)
        } else {
            match call.first.take() {
                Some(m) => Streaming::one(m),
                None => return,
            }
        };
        let responder = if call.server_streaming {
            let (tx, rx) = mpsc::channel(response_queue);
            call.rx = Some(rx);
            Responder::stream(tx, call.output)
        } else {
            let (tx, rx) = tokio::sync::oneshot::channel();
            call.single = Some(UnarySlot::new(rx));
            Responder::unary(tx, call.output)
        };
        let request = Request {
            metadata: call.metadata.take().unwrap_or_default(),
            deadline: call.deadline,
            peer: Some(self.peer.clone()),
            message,
        };
        let service = self.router.services[call.service].clone();
        call.handler = Some(service.call(call.method, request, responder));
    }

    /// Polls the calls that were woken.
    fn run_ready(&mut self) {
        for _ in 0..4 {
            std::mem::swap(
                &mut self.ready,
                &mut *self.shared.ready.lock().unwrap_or_else(|e| e.into_inner()),
            );
            if self.ready.is_empty() {
                return;
            }
            let mut ready = std::mem::take(&mut self.ready);
            for &slot in &ready {
                self.drive(slot);
            }
            ready.clear();
            self.ready = ready;
        }
        // Still more: the next round of the loop takes them (after I/O).
        self.shared.waker.wake();
    }

    /// Drives the calls whose response backlog the client's credit (a
    /// WINDOW_UPDATE just processed) let out.
    fn wake_credit_waiters(&mut self) {
        if self.credit_waiters.is_empty() {
            return;
        }
        for slot in std::mem::take(&mut self.credit_waiters) {
            let Some(call) = self.calls[slot as usize].call.as_mut() else { continue };
            if !call.waits_credit {
                continue; // A stale entry: the slot holds another call now.
            }
            let pending = self.conn.pending(call.stream);
            let moved = match call.draining {
                true => pending == 0 || !self.conn.is_open(call.stream),
                false => pending <= STREAM_PENDING_LIMIT,
            };
            if moved {
                // `drive` lists the call again if it blocks again.
                call.waits_credit = false;
                self.drive(slot);
            } else {
                self.credit_waiters.push(slot);
            }
        }
    }

    /// After the client's EOF no WINDOW_UPDATE can come: calls waiting for
    /// credit would wait forever, so they end here (their handlers are
    /// dropped, which cancels them).
    fn drop_stalled(&mut self) {
        for slot in std::mem::take(&mut self.credit_waiters) {
            let Some(call) = self.calls[slot as usize].call.as_ref() else { continue };
            if !call.waits_credit {
                continue;
            }
            if self.conn.pending(call.stream) > 0 {
                self.free_slot(slot);
            } else {
                self.credit_waiters.push(slot);
            }
        }
    }

    /// Ends calls whose deadline passed.
    fn expire(&mut self, now: Instant) {
        while let Some(std::cmp::Reverse((at, slot, gen))) = self.timers.peek().copied() {
            if at > now {
                return;
            }
            self.timers.pop();
            if slot == HANDSHAKE {
                if !self.conn.is_established() {
                    self.dead = true;
                }
                continue;
            }
            if slot >= AGE_GRACE {
                self.on_timer(slot, gen, now);
                continue;
            }
            let Some(s) = self.calls.get_mut(slot as usize) else { continue };
            if s.gen != gen || s.call.is_none() {
                continue;
            }
            let Some(call) = s.call.as_mut() else { continue };
            if call.draining {
                // Flow control still holds part of the response: the call
                // cannot end cleanly any more.
                if self.conn.pending(call.stream) > 0 {
                    self.conn.reset(call.stream, Reason::CANCEL);
                }
                self.free_slot(slot);
            } else {
                self.fail(slot, deadline_exceeded());
            }
        }
    }

    /// Moves one call forward as far as it goes without waiting.
    fn drive(&mut self, slot: u32) {
        let Some(s) = self.calls.get_mut(slot as usize) else { return };
        s.waker.queued.store(false, Ordering::Release);
        let waker = s.waker_handle.clone();
        let mut cx = Context::from_waker(&waker);
        let Some(call) = s.call.as_mut() else { return };
        if call.draining {
            if !self.conn.is_open(call.stream) || self.conn.pending(call.stream) == 0 {
                self.free_slot(slot);
            } else {
                wait_credit(call, &mut self.credit_waiters, slot);
            }
            return;
        }
        if call.deadline.is_some_and(|d| self.turn >= d) {
            return self.fail(slot, deadline_exceeded());
        }
        loop {
            let mut progress = false;
            // Requests to a client-streaming handler, as its queue has room.
            progress |= self.forward_requests(slot, &mut cx);
            let Some(call) = self.calls[slot as usize].call.as_mut() else { return };
            if let Some(h) = call.handler.as_mut() {
                let polled = crate::deadline::within(call.deadline, || h.as_mut().poll(&mut cx));
                if let Poll::Ready(r) = polled {
                    call.handler = None;
                    call.outcome = Some(r);
                    progress = true;
                }
            }
            if call.outcome.is_none() {
                if let Some(single) = call.single.as_mut() {
                    if let Poll::Ready(md) = single.poll_early_headers(&mut cx) {
                        call.initial = md;
                        send_headers(&mut self.conn, call);
                        progress = true;
                    }
                }
            }
            // Streamed responses, while flow control keeps up.
            while let Some(rx) = call.rx.as_mut() {
                if self.conn.pending(call.stream) > STREAM_PENDING_LIMIT {
                    wait_credit(call, &mut self.credit_waiters, slot);
                    break;
                }
                match rx.poll_recv(&mut cx) {
                    Poll::Ready(Some(item)) => {
                        progress = true;
                        if let Err(st) = send_out(&mut self.conn, call, item) {
                            call.handler = None;
                            return self.abort(slot, st);
                        }
                    }
                    Poll::Ready(None) => {
                        call.rx = None;
                        progress = true;
                    }
                    Poll::Pending => break,
                }
            }
            if call.outcome.is_some() && call.rx.is_none() {
                return self.complete(slot);
            }
            if !progress {
                return;
            }
        }
    }

    /// Hands queued requests to a client-streaming handler as its queue
    /// takes them, returning their credit; closes its queue at the end.
    fn forward_requests(&mut self, slot: u32, cx: &mut Context<'_>) -> bool {
        let Some(call) = self.calls[slot as usize].call.as_mut() else { return false };
        let mut progress = false;
        while call.req_tx.is_some() {
            if call.pending.is_empty() {
                if call.req_done {
                    call.req_tx = None;
                    call.reserve = None;
                    progress = true;
                }
                break;
            }
            if call.reserve.is_none() {
                let Some(tx) = call.req_tx.clone() else { break };
                call.reserve =
                    Some(Box::pin(async move { tx.reserve_owned().await.map_err(|_| ()) }));
            }
            let Some(r) = call.reserve.as_mut() else { break };
            let Poll::Ready(permit) = r.as_mut().poll(cx) else { break };
            call.reserve = None;
            let Some((m, size)) = call.pending.pop_front() else { break };
            self.conn.release(call.stream, size);
            progress = true;
            // A handler that dropped its request stream loses the rest.
            if let Ok(p) = permit {
                p.send(m);
            }
        }
        progress
    }

    /// The handler is done and every streamed response is out: the unary
    /// response, then the status.
    fn complete(&mut self, slot: u32) {
        let Some(call) = self.calls[slot as usize].call.as_mut() else { return };
        let outcome = call.outcome.take();
        if let Some(mut single) = call.single.take() {
            let (early, one) = single.finish();
            if let Some(md) = early {
                call.initial = md;
                send_headers(&mut self.conn, call);
            }
            if let Some(md) = one.headers {
                if !call.headers_sent {
                    call.initial = md;
                }
            }
            if let Some(item) = one.message.filter(|_| matches!(outcome, Some(Ok(_)))) {
                if let Err(st) = send_out(&mut self.conn, call, item) {
                    return self.abort(slot, st);
                }
            }
        }
        match outcome {
            Some(Ok(trailers)) => finish(&mut self.conn, call, &Status::ok(), &trailers),
            Some(Err(st)) => {
                let md = st.metadata.clone();
                finish(&mut self.conn, call, &st, &md)
            }
            None => {}
        }
        if call.deadline.is_some() && self.conn.pending(call.stream) > 0 {
            call.draining = true;
            call.handler = None;
            call.rx = None;
            call.req_tx = None;
            wait_credit(call, &mut self.credit_waiters, slot);
            return;
        }
        self.free_slot(slot);
    }

    /// Ends a call whose response could not be sent: a reset when part of
    /// a message may be out (trailers cannot follow it), the status
    /// otherwise.
    fn abort(&mut self, slot: u32, st: Status) {
        let Some(call) = self.calls[slot as usize].call.as_mut() else { return };
        match st.code {
            Code::Cancelled => self.conn.reset(call.stream, Reason::CANCEL),
            Code::DeadlineExceeded if call.headers_sent => {
                measure_end(call, st.code);
                self.conn.reset(call.stream, Reason::CANCEL)
            }
            _ => finish(&mut self.conn, call, &st, &Metadata::new()),
        }
        self.free_slot(slot);
    }
}

/// What a request's header block says, for gRPC.
struct Head {
    encoding: Encoding,
    gzip_ok: bool,
    deadline: Option<Instant>,
    metadata: Metadata,
}

/// Parses the gRPC fields of a request's header block once, into the
/// call's compact form.
/// The call's head; its deadline counts from `now`.
fn parse_head(h: &HeaderList, now: Instant) -> Result<Head, Status> {
    let mut encoding = Encoding::Identity;
    let mut gzip_ok = false;
    let mut deadline = None;
    for (name, value) in h.iter() {
        match name {
            b"grpc-encoding" => {
                encoding = Encoding::from_header(value).ok_or_else(|| {
                    Status::new(
                        Code::Unimplemented,
                        format!("unsupported grpc-encoding {}", String::from_utf8_lossy(value)),
                    )
                })?
            }
            b"grpc-accept-encoding" => gzip_ok = codec::accepts_gzip(Some(value)),
            b"grpc-timeout" => match timeout::parse(value) {
                Some(d) => deadline = Some(now + d),
                None => return Err(Status::new(Code::Internal, "malformed grpc-timeout")),
            },
            _ => {}
        }
    }
    let metadata =
        Metadata::from_fields(h.iter()).map_err(|e| Status::new(Code::Internal, e.to_string()))?;
    Ok(Head { encoding, gzip_ok, deadline, metadata })
}

/// Decodes one request message of `call`.
fn decode(
    call: &Call,
    decoder: &mut Decoder,
    compressed: bool,
    wire: Bytes,
) -> Result<Message, Status> {
    let limit = call.frames.limit();
    let payload = if compressed {
        match call.encoding {
            Encoding::Gzip => Bytes::from(codec::gunzip(&wire, limit)?),
            Encoding::Identity => {
                return Err(Status::new(
                    Code::Internal,
                    "compressed message on a stream without grpc-encoding",
                ))
            }
        }
    } else {
        wire
    };
    let mut m =
        Message::decode_request(call.schema.tables(), call.input, payload, decoder, call.raw)?;
    m.set_compressed(compressed);
    Ok(m)
}

/// The fixed part of every response's headers.
fn base_fields(sink: &mut dyn FieldSink) {
    sink.field(b":status", b"200", Index::Yes);
    sink.field(b"content-type", b"application/grpc", Index::Yes);
    sink.field(b"grpc-accept-encoding", ACCEPT_ENCODING.as_bytes(), Index::Yes);
}

fn metadata_fields(sink: &mut dyn FieldSink, md: &Metadata) {
    md.each_field(|k, v| sink.field(k, v, Index::No));
}

/// Lists `call` (in `slot`) among those to drive again when the client's
/// credit lets its backlog out.
fn wait_credit(call: &mut Call, waiters: &mut Vec<u32>, slot: u32) {
    if !call.waits_credit {
        call.waits_credit = true;
        waiters.push(slot);
    }
}

/// Sends the response headers (once).
fn send_headers(conn: &mut Conn, call: &mut Call) {
    if call.headers_sent {
        return;
    }
    call.headers_sent = true;
    let (gzip, md) = (call.gzip_ok, &call.initial);
    conn.send_headers(call.stream, false, |sink| {
        base_fields(sink);
        if gzip {
            sink.field(b"grpc-encoding", b"gzip", Index::Yes);
        }
        metadata_fields(sink, md);
    });
}

/// Sends one item from the handler.
fn send_out(conn: &mut Conn, call: &mut Call, item: Out) -> Result<(), Status> {
    match item {
        // Sent explicitly: a HEADERS frame leaves now.
        Out::Headers(md) => {
            if !call.headers_sent {
                call.initial = md;
                send_headers(conn, call);
            }
            Ok(())
        }
        // Staged: goes with the first message, or with the end.
        Out::Staged(md) => {
            if !call.headers_sent {
                call.initial = md;
            }
            Ok(())
        }
        Out::Encoded(bytes, z) => send_message(conn, call, &bytes, z),
        Out::Block(block, z) => {
            let schema = call.schema.clone();
            codec::with_encoded(schema.tables(), call.output, &block, |bytes| {
                send_message(conn, call, bytes, z)
            })?
        }
    }
}

/// Frames one response message into DATA: straight into the connection's
/// output when flow control allows (no intermediate buffer).
fn send_message(conn: &mut Conn, call: &mut Call, message: &[u8], z: bool) -> Result<(), Status> {
    let limit = call.send_limit;
    if message.len() > limit {
        return Err(Status::new(
            Code::ResourceExhausted,
            format!("message of {} bytes exceeds the send limit of {limit} bytes", message.len()),
        ));
    }
    let len = u32::try_from(message.len())
        .map_err(|_| Status::new(Code::ResourceExhausted, "message longer than 4 GiB"))?;
    send_headers(conn, call);
    if z && call.gzip_ok {
        let body = codec::gzip(message);
        let blen = body.len() as u32;
        call.sizes.sent += u64::from(blen);
        conn.send_data_with(call.stream, FRAME_HEADER_LEN + body.len(), false, |buf| {
            buf.push(1);
            buf.extend_from_slice(&blen.to_be_bytes());
            buf.extend_from_slice(&body);
        });
    } else {
        call.sizes.sent += u64::from(len);
        conn.send_data_with(call.stream, FRAME_HEADER_LEN + message.len(), false, |buf| {
            buf.push(0);
            buf.extend_from_slice(&len.to_be_bytes());
            buf.extend_from_slice(message);
        });
    }
    Ok(())
}

fn status_fields(sink: &mut dyn FieldSink, st: &Status, trailers: &Metadata) {
    sink.field(b"grpc-status", st.code.header_value().as_bytes(), Index::Yes);
    if !st.message.is_empty() {
        sink.field(b"grpc-message", status::encode_message(&st.message).as_bytes(), Index::No);
    }
    if !st.details.is_empty() {
        let v = protoplane_grpc::metadata::encode_binary(&st.details);
        sink.field(status::DETAILS_KEY.as_bytes(), v.as_bytes(), Index::No);
    }
    metadata_fields(sink, trailers);
}

/// Ends a call with `st`: trailers, or a trailers-only response when no
/// headers went out and the handler set none.
fn finish(conn: &mut Conn, call: &mut Call, st: &Status, trailers: &Metadata) {
    measure_end(call, st.code);
    if !call.headers_sent && !call.initial.is_empty() {
        // Headers the handler set but never sent go as headers, then the
        // trailers (grpc-go and tonic do the same; a client reading
        // headers finds them there, not among the trailers).
        call.headers_sent = true;
        let initial = std::mem::take(&mut call.initial);
        conn.send_headers(call.stream, false, |sink| {
            base_fields(sink);
            metadata_fields(sink, &initial);
        });
    }
    if call.headers_sent {
        conn.send_trailers(call.stream, |sink| status_fields(sink, st, trailers));
    } else {
        call.headers_sent = true;
        trailers_only(conn, call.stream, st, trailers);
    }
}

/// Notes the status a call ends with (the first one) for its metrics,
/// recorded when its slot is freed.
#[inline]
fn measure_end(call: &mut Call, code: Code) {
    call.ended.get_or_insert(code);
}

/// A trailers-only response: one HEADERS frame with END_STREAM.
fn trailers_only(conn: &mut Conn, stream: u32, st: &Status, trailers: &Metadata) {
    conn.send_headers(stream, true, |sink| {
        base_fields(sink);
        status_fields(sink, st, trailers);
    });
}

/// A plain HTTP error (not a gRPC request at all), with a short text body
/// for whoever looks at it with a generic HTTP/2 client. The rest of the
/// request is read and dropped.
fn http_error(conn: &mut Conn, stream: u32, code: &[u8]) {
    let text: &[u8] = match code {
        b"405" => b"protoplane serves gRPC: requests are POST\n",
        b"415" => b"protoplane serves gRPC: content-type application/grpc[+proto]\n",
        _ => b"request header fields too large\n",
    };
    conn.read_to_end(stream);
    conn.send_headers(stream, false, |sink| {
        sink.field(b":status", code, Index::Yes);
        sink.field(b"content-type", b"text/plain; charset=utf-8", Index::Yes);
    });
    conn.send_data_with(stream, text.len(), true, |buf| buf.extend_from_slice(text));
}
