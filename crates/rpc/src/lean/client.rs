//! The lean transport's client: one connection, any number of pipelined
//! calls. A reader task routes each incoming frame to its call by call id;
//! a writer task batches outgoing frames into single writes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::client::CallOptions;
use protoplane_grpc::lean::{self as frame, Outgoing, PREFACE};
use protoplane_grpc::metadata::Metadata;
use protoplane_grpc::status::{Code, Status};

/// What a call receives.
#[derive(Debug)]
pub enum Incoming {
    /// Initial metadata.
    Headers(Metadata),
    /// One response message.
    Message(Bytes),
    /// The end, with the call's status.
    End(Status),
}

/// The answer to a unary call: initial metadata, the response (if the call
/// succeeded) and the status.
type Unary = (Option<Metadata>, Option<Bytes>, Status);

enum Waiter {
    Unary(oneshot::Sender<Unary>),
    Stream(mpsc::Sender<Incoming>),
}

#[derive(Default)]
struct Calls {
    map: HashMap<u32, Waiter>,
    /// Set when the connection is gone: new calls fail at once.
    closed: Option<Status>,
}

/// A lean connection to a protoplane server. Cheap to clone.
#[derive(Clone)]
pub struct LeanChannel {
    inner: Arc<Inner>,
}

struct Inner {
    wtx: super::FrameTx,
    calls: Mutex<Calls>,
    next: AtomicU32,
    methods: HashMap<String, u32>,
    limit: usize,
}

impl std::fmt::Debug for LeanChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeanChannel")
            .field("methods", &self.inner.methods.len())
            .finish_non_exhaustive()
    }
}

fn unavailable(what: impl std::fmt::Display) -> Status {
    Status::new(Code::Unavailable, what.to_string())
}

impl LeanChannel {
    /// Connects to `target`: `host:port` (TCP) or `unix:PATH`.
    pub async fn connect(target: &str) -> Result<LeanChannel, Status> {
        let limit = 64 << 20;
        let fut = async {
            if let Some(path) = target.strip_prefix("unix:") {
                let s = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|e| unavailable(format!("connect to {target}: {e}")))?;
                LeanChannel::handshake(s, limit).await
            } else {
                let s = tokio::net::TcpStream::connect(target)
                    .await
                    .map_err(|e| unavailable(format!("connect to {target}: {e}")))?;
                let _ = s.set_nodelay(true);
                LeanChannel::handshake(s, limit).await
            }
        };
        tokio::time::timeout(Duration::from_secs(20), fut)
            .await
            .map_err(|_| unavailable(format!("connect to {target}: timed out")))?
    }

    async fn handshake<IO>(io: IO, limit: usize) -> Result<LeanChannel, Status>
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (mut rd, mut wr) = tokio::io::split(io);
        let io_err = |e: std::io::Error| unavailable(format!("lean handshake: {e}"));
        wr.write_all(PREFACE).await.map_err(io_err)?;
        let mut pre = [0u8; 8];
        rd.read_exact(&mut pre).await.map_err(io_err)?;
        if &pre != PREFACE {
            return Err(unavailable("the server does not speak the lean protocol"));
        }
        let n = rd.read_u32_le().await.map_err(io_err)?;
        if n > 1 << 16 {
            return Err(unavailable("method table too large"));
        }
        let mut methods = HashMap::new();
        for i in 0..n {
            let len = rd.read_u16_le().await.map_err(io_err)? as usize;
            let mut p = vec![0u8; len];
            rd.read_exact(&mut p).await.map_err(io_err)?;
            let p = String::from_utf8(p).map_err(|_| unavailable("method path is not UTF-8"))?;
            methods.insert(p, i);
        }
        let (wtx, wrx) = super::frame_queue();
        let inner = Arc::new(Inner {
            wtx,
            calls: Mutex::new(Calls::default()),
            next: AtomicU32::new(1),
            methods,
            limit,
        });
        tokio::spawn(super::write_loop(wr, wrx));
        tokio::spawn(read_loop(rd, inner.clone()));
        Ok(LeanChannel { inner })
    }

    /// The method id of `path` on this server.
    pub fn method(&self, path: &str) -> Option<u32> {
        self.inner.methods.get(path).copied()
    }

    fn register(&self, w: Waiter) -> Result<u32, Status> {
        let mut calls = self.inner.calls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(st) = &calls.closed {
            return Err(st.clone());
        }
        // Call ids wrap after 2^32 calls; an id still open is skipped.
        loop {
            let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
            if id != 0 && !calls.map.contains_key(&id) {
                calls.map.insert(id, w);
                return Ok(id);
            }
        }
    }

    fn unregister(&self, id: u32) {
        let mut calls = self.inner.calls.lock().unwrap_or_else(|p| p.into_inner());
        calls.map.remove(&id);
    }

    fn resolve(&self, path: &str) -> Result<u32, Status> {
        self.method(path)
            .ok_or_else(|| Status::new(Code::Unimplemented, format!("unknown method {path}")))
    }

    /// A unary call: the encoded request in, the encoded response out.
    pub async fn unary(
        &self,
        path: &str,
        request: &[u8],
        opts: &CallOptions,
    ) -> Result<Bytes, Status> {
        let method = self.resolve(path)?;
        let (tx, rx) = oneshot::channel();
        let id = self.register(Waiter::Unary(tx))?;
        let mut out = Vec::with_capacity(64 + request.len());
        let f = Outgoing {
            open: Some((opts.timeout, &opts.metadata)),
            message: Some(request),
            end: true,
            ..Outgoing::default()
        };
        if frame::write(&mut out, id, method, &f).is_none() {
            self.unregister(id);
            return Err(Status::new(Code::ResourceExhausted, "request too large"));
        }
        if self.inner.wtx.send(Bytes::from(out)).await.is_err() {
            self.unregister(id);
            return Err(unavailable("connection closed"));
        }
        let answer = async { rx.await.map_err(|_| unavailable("connection closed")) };
        let (_, msg, st) = match opts.timeout {
            None => answer.await?,
            Some(t) => match tokio::time::timeout(t, answer).await {
                Ok(r) => r?,
                Err(_) => {
                    self.cancel(id).await;
                    return Err(Status::new(Code::DeadlineExceeded, "deadline exceeded"));
                }
            },
        };
        match (st.code, msg) {
            (Code::Ok, Some(m)) => Ok(m),
            (Code::Ok, None) => {
                Err(Status::new(Code::Unimplemented, "unary call ended without a response"))
            }
            _ => Err(st),
        }
    }

    async fn cancel(&self, id: u32) {
        self.unregister(id);
        let mut out = Vec::new();
        if frame::write(&mut out, id, 0, &Outgoing { cancel: true, ..Outgoing::default() })
            .is_some()
        {
            let _ = self.inner.wtx.send(Bytes::from(out)).await;
        }
    }

    /// Starts a call of any kind.
    pub async fn start(&self, path: &str, opts: &CallOptions) -> Result<LeanCall, Status> {
        let method = self.resolve(path)?;
        let (tx, rx) = mpsc::channel(16);
        let id = self.register(Waiter::Stream(tx))?;
        Ok(LeanCall {
            channel: self.clone(),
            id,
            method,
            opened: false,
            open: Some((opts.timeout, opts.metadata.clone())),
            rx,
            done: None,
            headers: None,
            trailers: None,
        })
    }
}

/// A call of any kind on a lean channel.
#[derive(Debug)]
pub struct LeanCall {
    channel: LeanChannel,
    id: u32,
    method: u32,
    opened: bool,
    open: Option<(Option<Duration>, Metadata)>,
    rx: mpsc::Receiver<Incoming>,
    done: Option<Status>,
    headers: Option<Metadata>,
    trailers: Option<Metadata>,
}

impl LeanCall {
    async fn frame(&mut self, message: Option<&[u8]>, end: bool) -> Result<(), Status> {
        let open = if self.opened { None } else { self.open.take() };
        let mut out = Vec::with_capacity(64 + message.map_or(0, <[u8]>::len));
        let f = Outgoing {
            open: open.as_ref().map(|(t, md)| (*t, md)),
            message,
            end,
            ..Outgoing::default()
        };
        frame::write(&mut out, self.id, self.method, &f)
            .ok_or_else(|| Status::new(Code::ResourceExhausted, "request too large"))?;
        self.opened = true;
        self.channel
            .inner
            .wtx
            .send(Bytes::from(out))
            .await
            .map_err(|_| unavailable("connection closed"))
    }

    /// Sends one encoded request.
    pub async fn send(&mut self, message: &[u8]) -> Result<(), Status> {
        if message.len() > self.channel.inner.limit {
            return Err(Status::new(Code::ResourceExhausted, "request too large"));
        }
        self.frame(Some(message), false).await
    }

    /// Sends the last request (a unary or server-streaming call opens and
    /// ends with it).
    pub async fn send_last(&mut self, message: &[u8]) -> Result<(), Status> {
        self.frame(Some(message), true).await
    }

    /// No more requests.
    pub async fn close_send(&mut self) -> Result<(), Status> {
        self.frame(None, true).await
    }

    /// The next response; `Ok(None)` at a successful end.
    pub async fn recv(&mut self) -> Result<Option<Bytes>, Status> {
        loop {
            if let Some(st) = &self.done {
                return if st.code == Code::Ok { Ok(None) } else { Err(st.clone()) };
            }
            match self.rx.recv().await {
                Some(Incoming::Headers(md)) => self.headers = Some(md),
                Some(Incoming::Message(m)) => return Ok(Some(m)),
                Some(Incoming::End(st)) => {
                    self.trailers = Some(st.metadata.clone());
                    self.done = Some(st);
                }
                None => self.done = Some(unavailable("connection closed")),
            }
        }
    }

    /// Cancels the call.
    pub async fn cancel(&mut self) {
        self.channel.cancel(self.id).await;
        self.done = Some(Status::new(Code::Cancelled, "cancelled by the client"));
    }

    /// Initial metadata, once received.
    pub fn headers(&self) -> Option<&Metadata> {
        self.headers.as_ref()
    }

    /// Trailing metadata, once the call ended.
    pub fn trailers(&self) -> Option<&Metadata> {
        self.trailers.as_ref()
    }
}

impl Drop for LeanCall {
    fn drop(&mut self) {
        if self.done.is_none() {
            self.channel.unregister(self.id);
            let mut out = Vec::new();
            if frame::write(&mut out, self.id, 0, &Outgoing { cancel: true, ..Outgoing::default() })
                .is_some()
            {
                self.channel.inner.wtx.try_send(Bytes::from(out));
            }
        }
    }
}

async fn read_loop<R: AsyncRead + Unpin>(mut rd: R, inner: Arc<Inner>) {
    let mut buf = BytesMut::with_capacity(64 << 10);
    let why = 'read: loop {
        loop {
            let (h, payload) = match frame::next_frame(&mut buf, inner.limit + (64 << 10)) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    break 'read Status::new(Code::Internal, format!("lean protocol error: {e}"))
                }
            };
            let s = match frame::parse(&h, payload) {
                Ok(s) => s,
                Err(e) => {
                    break 'read Status::new(Code::Internal, format!("lean protocol error: {e}"))
                }
            };
            let ended = s.status.is_some();
            let waiter = {
                let mut calls = inner.calls.lock().unwrap_or_else(|p| p.into_inner());
                if ended {
                    calls.map.remove(&h.call)
                } else {
                    match calls.map.get(&h.call) {
                        Some(Waiter::Stream(tx)) => Some(Waiter::Stream(tx.clone())),
                        _ => None,
                    }
                }
            };
            match waiter {
                Some(Waiter::Unary(tx)) => {
                    let st = s.status.unwrap_or_else(Status::ok);
                    let _ = tx.send((s.headers, s.message, st));
                }
                Some(Waiter::Stream(tx)) => {
                    if let Some(md) = s.headers {
                        let _ = tx.send(Incoming::Headers(md)).await;
                    }
                    if let Some(m) = s.message {
                        let _ = tx.send(Incoming::Message(m)).await;
                    }
                    if let Some(st) = s.status {
                        let _ = tx.send(Incoming::End(st)).await;
                    }
                }
                None => {}
            }
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) => break unavailable("the server closed the connection"),
            Err(e) => break unavailable(format!("connection error: {e}")),
            Ok(_) => crate::busy::note_read(),
        }
    };
    // Fail every open call; new ones fail at once.
    let waiters = {
        let mut calls = inner.calls.lock().unwrap_or_else(|p| p.into_inner());
        calls.closed = Some(why.clone());
        std::mem::take(&mut calls.map)
    };
    for (_, w) in waiters {
        match w {
            Waiter::Unary(tx) => {
                let _ = tx.send((None, None, why.clone()));
            }
            Waiter::Stream(tx) => {
                let _ = tx.send(Incoming::End(why.clone())).await;
            }
        }
    }
}
