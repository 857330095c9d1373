//! The gRPC client's side of our HTTP/2 transport: one task per
//! connection drives a [`Conn`] (role client) over the socket; calls share
//! it through a mutex held only for short, non-blocking steps (queue a
//! header block or a message, take what arrived).
//!
//! The path of a unary call: the calling task encodes the request's
//! HEADERS and its DATA (with END_STREAM) straight into the connection's
//! output and wakes the driver, which writes everything queued with one
//! vectored write; the driver reads the response, files each frame in the
//! call's inbox and wakes the call. No task per call, no channel per call:
//! an inbox in a map and two wakers.
//!
//! Backpressure: a call that sends waits while more than
//! [`SEND_PENDING_LIMIT`] bytes of its stream wait for the server's
//! credit; received data returns its credit as the call takes it, so a
//! call that stops reading stops the server (flow control), not the
//! connection's memory. Streams beyond the server's
//! MAX_CONCURRENT_STREAMS wait for a slot, as h2 and grpc-go do.

use std::collections::{HashMap, VecDeque};
use std::future::{poll_fn, Future};
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite};

use protoplane_grpc::codec::{self, ContentType, Encoding};
use protoplane_grpc::metadata::Metadata;
use protoplane_grpc::status::{Code, Status};
use protoplane_http2::conn::{Config, Conn, Event, FieldSink, Role};
use protoplane_http2::frame::Reason;
use protoplane_http2::hpack::Index;

use crate::keepalive::{ClientKeepalive, KEEPALIVE_PING};

/// Bytes of one stream allowed to wait for the server's credit before a
/// sender waits.
const SEND_PENDING_LIMIT: usize = 64 << 10;

/// Read buffer growth step.
const READ_CHUNK: usize = 64 << 10;

/// The gRPC fields of a response header block, parsed once.
#[derive(Debug)]
pub(crate) struct Fields {
    /// `:status` (0 in trailers).
    pub http: u16,
    pub content_type: ContentType,
    /// `grpc-encoding`: absent, supported, or not (`Some(None)`).
    pub encoding: Option<Option<Encoding>>,
    /// The custom metadata.
    pub metadata: Metadata,
    /// For a block that ends the call (trailers, or trailers-only): its
    /// status, with the metadata and details attached.
    pub status: Option<Status>,
}

impl Fields {
    /// Parses a block given as a function that iterates its regular fields
    /// (called twice).
    pub(crate) fn parse<'a, I>(http: u16, ends: bool, fields: impl Fn() -> I) -> Fields
    where
        I: Iterator<Item = (&'a [u8], &'a [u8])>,
    {
        let (mut ct, mut enc, mut code, mut msg, mut details) = (None, None, None, None, None);
        for (n, v) in fields() {
            match n {
                b"content-type" => ct = ct.or(Some(v)),
                b"grpc-encoding" => enc = enc.or(Some(v)),
                b"grpc-status" => code = code.or(Some(v)),
                b"grpc-message" => msg = msg.or(Some(v)),
                b"grpc-status-details-bin" => details = details.or(Some(v)),
                _ => {}
            }
        }
        // Metadata that does not parse is dropped, not fatal: the status
        // still tells the call's outcome.
        let metadata = Metadata::from_fields(fields()).unwrap_or_default();
        let status = ends.then(|| {
            let st = Status::from_trailers(code, msg);
            // Details that are not base64 are dropped, as other clients do.
            let details = details
                .and_then(protoplane_grpc::metadata::decode_binary)
                .map(Bytes::from)
                .unwrap_or_default();
            Status { metadata: metadata.clone(), details, ..st }
        });
        Fields {
            http,
            content_type: codec::content_type(ct),
            encoding: enc.map(Encoding::from_header),
            metadata,
            status,
        }
    }
}

/// What arrived on one stream, waiting for its call.
#[derive(Debug, Default)]
struct Inbox {
    head: Option<(Fields, bool)>,
    data: VecDeque<Bytes>,
    /// The server's END_STREAM arrived (after the data queued).
    end: bool,
    trailers: Option<Fields>,
    /// The stream (or the connection) failed.
    error: Option<Status>,
    recv: Option<Waker>,
    send: Option<Waker>,
}

impl Inbox {
    fn wake(&mut self) {
        if let Some(w) = self.recv.take() {
            w.wake();
        }
        if let Some(w) = self.send.take() {
            w.wake();
        }
    }
}

struct State {
    conn: Conn,
    inboxes: HashMap<u32, Inbox>,
    /// Calls waiting for a stream slot.
    open_waiters: Vec<Waker>,
    /// Streams whose sender waits for credit.
    send_waiters: Vec<u32>,
    /// The connection is gone: every call fails with this.
    error: Option<Status>,
    /// The code of a GOAWAY the server sent with an error (the reason the
    /// connection then closes, for the calls it ends).
    goaway_error: Option<Reason>,
}

/// The shared half of a connection.
pub(crate) struct Link {
    state: Mutex<State>,
    driver: AtomicWaker,
    /// No channel refers to the connection any more: it closes once its
    /// last call ends.
    abandoned: AtomicBool,
    /// [`Link::sent_away_for_pings`] said so once.
    calm_seen: AtomicBool,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").finish_non_exhaustive()
    }
}

/// Maps a stream's reset code to the call's status (gRPC's HTTP/2
/// mapping, PROTOCOL.md "Errors").
fn reset_status(reason: Reason) -> Status {
    let code = match reason {
        Reason::CANCEL => Code::Cancelled,
        Reason::REFUSED_STREAM => Code::Unavailable,
        Reason::ENHANCE_YOUR_CALM => Code::ResourceExhausted,
        Reason::INADEQUATE_SECURITY => Code::PermissionDenied,
        _ => Code::Internal,
    };
    Status::new(code, format!("stream reset by the server ({reason})"))
}

impl Link {
    /// Whether the server ended this connection with GOAWAY
    /// ENHANCE_YOUR_CALM (too many pings, as grpc-go and protoplane servers
    /// send it): `true` once, for the channel to ping half as often on its
    /// next connection (gRFC A8).
    pub(crate) fn sent_away_for_pings(&self) -> bool {
        let calm = self.lock().goaway_error == Some(Reason::ENHANCE_YOUR_CALM);
        calm && !self.calm_seen.swap(true, Ordering::AcqRel)
    }

    /// Starts the connection on `io` (its preface and SETTINGS go out
    /// at once) and spawns its driver.
    pub(crate) fn start<IO>(
        io: IO,
        stream_window: u32,
        connection_window: u32,
        keepalive: Option<ClientKeepalive>,
    ) -> Arc<Link>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let mut cfg = Config::new(Role::Client);
        cfg.stream_window = stream_window;
        cfg.connection_window = connection_window;
        // No pushed streams: SETTINGS_ENABLE_PUSH is 0.
        cfg.max_concurrent_streams = 0;
        let link = Arc::new(Link {
            state: Mutex::new(State {
                conn: Conn::new(cfg),
                inboxes: HashMap::new(),
                open_waiters: Vec::new(),
                send_waiters: Vec::new(),
                error: None,
                goaway_error: None,
            }),
            driver: AtomicWaker::new(),
            abandoned: AtomicBool::new(false),
            calm_seen: AtomicBool::new(false),
        });
        let l = link.clone();
        let keeper = keepalive.map(Keeper::new);
        tokio::spawn(
            async move { Driver { link: l, io, input: BytesMut::new(), keeper }.run().await },
        );
        link
    }

    /// Whether a new stream may be opened: the connection has not failed
    /// and the server has not sent GOAWAY.
    pub(crate) fn usable(&self) -> bool {
        let st = self.lock();
        st.error.is_none() && !st.conn.peer_gone_away()
    }

    /// The last channel on the connection is gone.
    pub(crate) fn abandon(&self) {
        self.abandoned.store(true, Ordering::Release);
        self.driver.wake();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a stream and queues its request header block; waits for a
    /// stream slot when the server's concurrency limit is reached.
    /// `fields` writes the regular fields (the pseudo-header fields are
    /// written here).
    pub(crate) async fn open(
        self: &Arc<Link>,
        scheme: &[u8],
        authority: &[u8],
        path: &[u8],
        fields: &(dyn Fn(&mut dyn FieldSink) + Sync),
    ) -> Result<Stream, Status> {
        poll_fn(|cx| {
            let mut st = self.lock();
            if let Some(e) = &st.error {
                return Poll::Ready(Err(e.clone()));
            }
            if st.conn.peer_gone_away() {
                return Poll::Ready(Err(Status::new(
                    Code::Unavailable,
                    "the server is closing the connection (GOAWAY)",
                )));
            }
            let Some(id) = st.conn.open_stream() else {
                st.open_waiters.push(cx.waker().clone());
                return Poll::Pending;
            };
            st.conn.send_headers(id, false, |sink| {
                sink.field(b":method", b"POST", Index::Yes);
                sink.field(b":scheme", scheme, Index::Yes);
                sink.field(b":path", path, Index::Yes);
                sink.field(b":authority", authority, Index::Yes);
                fields(sink);
            });
            st.inboxes.insert(id, Inbox::default());
            Poll::Ready(Ok(Stream { link: self.clone(), id, send_closed: false, done: false }))
        })
        .await
    }
}

/// One call's stream.
#[derive(Debug)]
pub(crate) struct Stream {
    link: Arc<Link>,
    id: u32,
    send_closed: bool,
    /// The call ended (trailers taken, or reset): the inbox is gone.
    done: bool,
}

impl Stream {
    /// Queues one gRPC message (5-byte prefix + `message`), `end`: the last.
    /// Waits first while the stream's unsent backlog is over the limit.
    pub(crate) async fn send_message(
        &mut self,
        message: &[u8],
        compressed: bool,
        end: bool,
    ) -> Result<(), Status> {
        if self.send_closed {
            return Err(Status::new(Code::Internal, "request stream closed"));
        }
        poll_fn(|cx| self.poll_send_ready(cx)).await?;
        let len = u32::try_from(message.len())
            .map_err(|_| Status::new(Code::ResourceExhausted, "message longer than 4 GiB"))?;
        let mut st = self.link.lock();
        if let Some(e) = self.failure(&mut st) {
            return Err(e);
        }
        if message.len() >= 64 << 10 {
            // Large: one copy into its own buffer, referenced by the
            // output (not copied again into it).
            let mut v = Vec::with_capacity(5 + message.len());
            v.push(u8::from(compressed));
            v.extend_from_slice(&len.to_be_bytes());
            v.extend_from_slice(message);
            st.conn.send_data(self.id, Bytes::from(v), end);
        } else {
            st.conn.send_data_with(self.id, 5 + message.len(), end, |buf| {
                buf.push(u8::from(compressed));
                buf.extend_from_slice(&len.to_be_bytes());
                buf.extend_from_slice(message);
            });
        }
        drop(st);
        self.send_closed |= end;
        self.link.driver.wake();
        Ok(())
    }

    fn poll_send_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        let mut st = self.link.lock();
        if let Some(e) = self.failure(&mut st) {
            return Poll::Ready(Err(e));
        }
        if st.conn.pending(self.id) <= SEND_PENDING_LIMIT {
            return Poll::Ready(Ok(()));
        }
        let id = self.id;
        if let Some(inbox) = st.inboxes.get_mut(&id) {
            inbox.send = Some(cx.waker().clone());
        }
        if !st.send_waiters.contains(&id) {
            st.send_waiters.push(id);
        }
        Poll::Pending
    }

    /// The error that ended the stream or the connection, if any.
    fn failure(&self, st: &mut State) -> Option<Status> {
        if let Some(inbox) = st.inboxes.get(&self.id) {
            if let Some(e) = &inbox.error {
                return Some(e.clone());
            }
        }
        if self.done {
            return Some(Status::new(Code::Internal, "the call has ended"));
        }
        st.error.clone()
    }

    /// Whether requests may still be sent.
    pub(crate) fn can_send(&self) -> bool {
        !self.send_closed && !self.done
    }

    /// Half-closes the request stream (an empty DATA with END_STREAM).
    pub(crate) fn close_send(&mut self) {
        if self.send_closed || self.done {
            return;
        }
        self.send_closed = true;
        self.link.lock().conn.send_data(self.id, Bytes::new(), true);
        self.link.driver.wake();
    }

    /// The response header block and whether it ended the stream
    /// (trailers-only); taken once.
    pub(crate) fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(Fields, bool), Status>> {
        let mut guard = self.link.lock();
        let st = &mut *guard;
        let Some(inbox) = st.inboxes.get_mut(&self.id) else {
            return Poll::Ready(Err(Status::new(Code::Internal, "the call has ended")));
        };
        if let Some(h) = inbox.head.take() {
            if h.1 {
                drop(guard);
                self.finish();
            }
            return Poll::Ready(Ok(h));
        }
        if let Some(e) = inbox.error.clone().or_else(|| st.error.clone()) {
            drop(guard);
            self.finish();
            return Poll::Ready(Err(e));
        }
        inbox.recv = Some(cx.waker().clone());
        Poll::Pending
    }

    /// The next DATA payload; `None` once the server's END_STREAM came
    /// (then [`Stream::poll_trailers`]). Its credit goes back as it is
    /// taken.
    pub(crate) fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Status>>> {
        let mut guard = self.link.lock();
        let st = &mut *guard;
        let Some(inbox) = st.inboxes.get_mut(&self.id) else { return Poll::Ready(None) };
        if let Some(d) = inbox.data.pop_front() {
            let n = d.len();
            st.conn.release(self.id, n);
            let wake = !st.conn.output().is_empty();
            drop(guard);
            if wake {
                self.link.driver.wake();
            }
            return Poll::Ready(Some(Ok(d)));
        }
        if inbox.end {
            return Poll::Ready(None);
        }
        if let Some(e) = inbox.error.clone().or_else(|| st.error.clone()) {
            drop(guard);
            self.finish();
            return Poll::Ready(Some(Err(e)));
        }
        inbox.recv = Some(cx.waker().clone());
        Poll::Pending
    }

    /// The trailers, once the data is taken; `None` when the stream ended
    /// without them.
    pub(crate) fn poll_trailers(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Fields>, Status>> {
        let mut guard = self.link.lock();
        let st = &mut *guard;
        let Some(inbox) = st.inboxes.get_mut(&self.id) else { return Poll::Ready(Ok(None)) };
        if let Some(t) = inbox.trailers.take() {
            drop(guard);
            self.finish();
            return Poll::Ready(Ok(Some(t)));
        }
        if inbox.end && inbox.data.is_empty() {
            drop(guard);
            self.finish();
            return Poll::Ready(Ok(None));
        }
        if let Some(e) = inbox.error.clone().or_else(|| st.error.clone()) {
            drop(guard);
            self.finish();
            return Poll::Ready(Err(e));
        }
        inbox.recv = Some(cx.waker().clone());
        Poll::Pending
    }

    /// The call is over on our side: the inbox goes; a stream the server
    /// has not finished is reset (CANCEL), which is how a client cancels.
    fn finish(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        self.send_closed = true;
        let mut st = self.link.lock();
        let ended = st.inboxes.remove(&self.id).is_some_and(|i| i.trailers.is_some() || i.end);
        let wake = st.conn.is_open(self.id) || self.link.abandoned.load(Ordering::Acquire);
        if st.conn.is_open(self.id) {
            // After the server's END_STREAM, the reset only says "no more
            // requests" (NO_ERROR); before it, the call is cancelled.
            let reason = if ended { Reason::NO_ERROR } else { Reason::CANCEL };
            st.conn.reset(self.id, reason);
        }
        drop(st);
        if wake {
            self.link.driver.wake();
        }
    }

    /// Cancels the call: RST_STREAM(CANCEL) unless it already ended.
    pub(crate) fn reset(&mut self) {
        self.finish();
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The connection's task: reads, files what arrived, writes what is
/// queued.
struct Driver<IO> {
    link: Arc<Link>,
    io: IO,
    input: BytesMut,
    keeper: Option<Keeper>,
}

/// Client keepalive (see [`crate::keepalive`]), as grpc-go runs it: a
/// timer; whether anything was read since it was last set; whether a ping
/// waits for an answer, and how much of its timeout is left.
struct Keeper {
    opts: ClientKeepalive,
    timer: Pin<Box<tokio::time::Sleep>>,
    /// What the timer was last set for.
    waited: std::time::Duration,
    read: bool,
    pinged: bool,
    timeout_left: std::time::Duration,
}

impl Keeper {
    fn new(mut opts: ClientKeepalive) -> Keeper {
        // A zero time or timeout would spin the timer.
        opts.time = opts.time.max(crate::keepalive::LEAST_INTERVAL);
        opts.timeout = opts.timeout.max(crate::keepalive::LEAST_INTERVAL);
        let timer = Box::pin(tokio::time::sleep(opts.time));
        let waited = opts.time;
        Keeper { opts, timer, waited, read: false, pinged: false, timeout_left: Default::default() }
    }

    /// Runs the timer: `Err` when a ping went unanswered (nothing read
    /// within the timeout); `Ok(true)` when a ping is to go out.
    /// `calls_open` is asked only when the timer fires.
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        calls_open: impl Fn() -> bool,
    ) -> Result<bool, Status> {
        let mut ping = false;
        while self.timer.as_mut().poll(cx).is_ready() {
            let wait = if self.read {
                // Alive. The next ping is due `time` after the last read,
                // which came at the latest now; after a ping, counted
                // from the ping (its answer came soon after it).
                let wait = if self.pinged {
                    self.opts.time.saturating_sub(self.waited)
                } else {
                    self.opts.time
                };
                self.pinged = false;
                wait
            } else if self.pinged {
                if self.timeout_left.is_zero() {
                    return Err(Status::new(
                        Code::Unavailable,
                        format!(
                            "keepalive: the server answered no ping within {:?}",
                            self.opts.timeout
                        ),
                    ));
                }
                let wait = self.opts.time.min(self.timeout_left);
                self.timeout_left -= wait;
                wait
            } else if self.opts.permit_without_stream || calls_open() {
                ping = true;
                self.pinged = true;
                let wait = self.opts.time.min(self.opts.timeout);
                self.timeout_left = self.opts.timeout - wait;
                wait
            } else {
                self.opts.time
            };
            self.read = false;
            self.waited = wait;
            self.timer.as_mut().reset(tokio::time::Instant::now() + wait);
        }
        Ok(ping)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Driver<IO> {
    async fn run(mut self) {
        let why = poll_fn(|cx| self.poll(cx)).await;
        // Whatever is left (a GOAWAY after a protocol error) goes out,
        // briefly.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
            let _ = poll_fn(|cx| self.poll_write(cx)).await;
            let _ = poll_fn(|cx| Pin::new(&mut self.io).poll_shutdown(cx)).await;
        })
        .await;
        let mut st = self.link.lock();
        let why = match st.goaway_error {
            // ENHANCE_YOUR_CALM after too many keepalive pings, say.
            Some(r) => {
                Status::new(why.code, format!("{} (the server sent GOAWAY {r})", why.message))
            }
            None => why,
        };
        st.error = Some(why);
        for inbox in st.inboxes.values_mut() {
            inbox.wake();
        }
        for w in st.open_waiters.drain(..) {
            w.wake();
        }
    }

    /// Runs until the connection ends; its status for the calls left.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Status> {
        self.link.driver.register(cx.waker());
        loop {
            if self.link.abandoned.load(Ordering::Acquire) {
                let mut st = self.link.lock();
                if st.inboxes.is_empty() {
                    st.conn.go_away(Reason::NO_ERROR, "channel closed");
                    return Poll::Ready(Status::new(Code::Unavailable, "channel closed"));
                }
            }
            let mut progress = false;
            if self.input.capacity() - self.input.len() < READ_CHUNK / 4 {
                self.input.reserve(READ_CHUNK);
            }
            match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.input) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Status::new(Code::Unavailable, "connection closed"))
                }
                Poll::Ready(Err(e)) => {
                    return Poll::Ready(Status::new(Code::Unavailable, format!("connection: {e}")))
                }
                Poll::Ready(Ok(_)) => {
                    crate::busy::note_read();
                    progress = true;
                    if let Some(k) = &mut self.keeper {
                        k.read = true;
                    }
                    if let Err(st) = self.process() {
                        return Poll::Ready(st);
                    }
                }
                Poll::Pending => {}
            }
            if let Some(k) = &mut self.keeper {
                // The connection's state is locked only when the timer
                // fires, not on every pass.
                match k.poll(cx, || !self.link.lock().inboxes.is_empty()) {
                    Err(why) => return Poll::Ready(why),
                    Ok(true) => self.link.lock().conn.ping(KEEPALIVE_PING),
                    Ok(false) => {}
                }
            }
            match self.poll_write(cx) {
                Poll::Ready(Err(st)) => return Poll::Ready(st),
                Poll::Ready(Ok(wrote)) => progress |= wrote,
                Poll::Pending => {}
            }
            if !progress {
                return Poll::Pending;
            }
        }
    }

    /// Files every complete frame of the input.
    fn process(&mut self) -> Result<(), Status> {
        let mut st = self.link.lock();
        let st = &mut *st;
        loop {
            let ev = match st.conn.next_event(&mut self.input) {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => {
                    return Err(Status::new(Code::Internal, format!("HTTP/2: {e}")));
                }
            };
            match ev {
                Event::Headers { stream, end_stream } => {
                    let h = st.conn.headers();
                    let http = h
                        .status()
                        .and_then(|s| std::str::from_utf8(s).ok())
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    let f = Fields::parse(http, end_stream, || h.iter());
                    let too_large = h.too_large();
                    if let Some(inbox) = st.inboxes.get_mut(&stream) {
                        if too_large {
                            inbox.error = Some(Status::new(
                                Code::Internal,
                                "response header list over the client's limit",
                            ));
                        } else {
                            inbox.head = Some((f, end_stream));
                            inbox.end |= end_stream;
                        }
                        inbox.wake();
                    }
                }
                Event::Trailers { stream } => {
                    let h = st.conn.headers();
                    let f = Fields::parse(0, true, || h.iter());
                    if let Some(inbox) = st.inboxes.get_mut(&stream) {
                        inbox.trailers = Some(f);
                        inbox.end = true;
                        inbox.wake();
                    }
                }
                Event::Data { stream, data, end_stream } => match st.inboxes.get_mut(&stream) {
                    Some(inbox) => {
                        if !data.is_empty() {
                            inbox.data.push_back(data);
                        }
                        inbox.end |= end_stream;
                        inbox.wake();
                    }
                    // The call is gone: its data is not needed.
                    None => st.conn.release(stream, data.len()),
                },
                Event::Reset { stream, reason, .. } => {
                    if let Some(inbox) = st.inboxes.get_mut(&stream) {
                        // After the trailers, a reset (NO_ERROR: "stop
                        // sending") changes nothing.
                        if inbox.trailers.is_none() && !(inbox.end && reason == Reason::NO_ERROR) {
                            inbox.error = Some(reset_status(reason));
                        }
                        inbox.wake();
                    }
                }
                Event::GoAway { last_stream, reason } => {
                    if reason != Reason::NO_ERROR {
                        st.goaway_error = Some(reason);
                    }
                    // Streams the server never processed may be retried
                    // elsewhere: UNAVAILABLE.
                    for (&id, inbox) in st.inboxes.iter_mut() {
                        if id > last_stream && inbox.error.is_none() {
                            inbox.error = Some(Status::new(
                                Code::Unavailable,
                                format!("the server went away ({reason}) before the call"),
                            ));
                            inbox.wake();
                        }
                    }
                    for w in st.open_waiters.drain(..) {
                        w.wake();
                    }
                }
                Event::Open { stream, .. } => st.conn.reset(stream, Reason::PROTOCOL_ERROR),
                // Answered by the connection; for keepalive, anything read
                // is an answer.
                Event::Ping { .. } => {}
            }
        }
        // Credit that arrived may let waiting senders go on; streams that
        // ended free slots.
        for id in std::mem::take(&mut st.send_waiters) {
            let Some(inbox) = st.inboxes.get_mut(&id) else { continue };
            if st.conn.pending(id) <= SEND_PENDING_LIMIT || inbox.error.is_some() {
                inbox.wake();
            } else {
                st.send_waiters.push(id);
            }
        }
        if !st.open_waiters.is_empty() && st.conn.can_open() {
            for w in st.open_waiters.drain(..) {
                w.wake();
            }
        }
        Ok(())
    }

    /// Writes the output until it is empty or the socket is full;
    /// `Ok(true)` if anything was written.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, Status>> {
        let mut wrote = false;
        loop {
            let mut st = self.link.lock();
            let out = st.conn.output();
            if out.is_empty() {
                drop(st);
                if wrote {
                    return match Pin::new(&mut self.io).poll_flush(cx) {
                        Poll::Ready(Err(e)) => Poll::Ready(Err(Status::new(
                            Code::Unavailable,
                            format!("connection: {e}"),
                        ))),
                        _ => Poll::Ready(Ok(true)),
                    };
                }
                return Poll::Ready(Ok(false));
            }
            let mut slices = [IoSlice::new(&[]); 64];
            let n = out.slices(&mut slices);
            match Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..n]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(Status::new(Code::Unavailable, "connection closed")))
                }
                Poll::Ready(Err(e)) => {
                    return Poll::Ready(Err(Status::new(
                        Code::Unavailable,
                        format!("connection: {e}"),
                    )))
                }
                Poll::Ready(Ok(k)) => {
                    st.conn.output().advance(k);
                    wrote = true;
                }
                Poll::Pending => {
                    return match wrote {
                        true => Poll::Ready(Ok(true)),
                        false => Poll::Pending,
                    }
                }
            }
        }
    }
}
