//! The engine/application seam.
//!
//! Everything that crosses it is linearized: the engine hands the
//! application decoded requests ([`Message`]: a block in view mode plus the
//! wire bytes it references) and takes back response blocks ([`Block`],
//! laid out with the wire engine's builder) that it encodes itself. The
//! application never sees HTTP/2, framing, compression or protobuf bytes,
//! and the engine never runs application code except through
//! [`Service::call`]. In monolithic mode the two sides are one task and the
//! queues below are in-process channels; the split engine replaces exactly
//! these queues with shared-memory rings.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use protoplane_schema::TableSet;
use protoplane_wire::{Block, DecodeOptions, Decoder, MessageView, Source};
use tokio::sync::{mpsc, oneshot};

use crate::metadata::Metadata;
use crate::schema::Schema;
use crate::status::{Code, Status};

/// A boxed, sendable future (what object-safe async methods return).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A decoded message: a linearized block whose strings and bytes reference
/// the received wire bytes (view mode), which it keeps alive.
#[derive(Debug)]
pub struct Message {
    block: Block,
    wire: Bytes,
    type_index: u32,
    compressed: bool,
}

impl Message {
    /// Decodes `wire` as message type `type_index` in view mode.
    pub fn decode(
        tables: &TableSet,
        type_index: u32,
        wire: Bytes,
        decoder: &mut Decoder,
    ) -> Result<Message, protoplane_wire::DecodeError> {
        let mut block = Block::with_capacity(wire.len() + wire.len() / 2 + 64);
        decoder.decode_into(tables, type_index, &wire, &DecodeOptions::view(), &mut block)?;
        Ok(Message { block, wire, type_index, compressed: false })
    }

    /// The block and the bytes it references.
    pub fn source(&self) -> Source<'_> {
        Source { block: self.block.as_bytes(), wire: &self.wire }
    }

    /// A dynamic view of the message.
    pub fn view<'a>(&'a self, tables: &'a TableSet) -> Result<MessageView<'a>, Status> {
        MessageView::new(tables, self.source(), self.type_index)
            .map_err(|e| Status::new(Code::Internal, format!("unreadable message block: {e}")))
    }

    /// The linearized block.
    pub fn block(&self) -> &Block {
        &self.block
    }

    /// The wire bytes (the encoded message as received).
    pub fn wire(&self) -> &Bytes {
        &self.wire
    }

    /// Whether the message arrived compressed.
    pub fn was_compressed(&self) -> bool {
        self.compressed
    }

    pub(crate) fn set_compressed(&mut self, on: bool) {
        self.compressed = on;
    }

    /// The message's type (table index).
    pub fn type_index(&self) -> u32 {
        self.type_index
    }
}

/// A call as the application sees it: custom metadata, the deadline, and
/// the request (one message or a stream of them).
#[derive(Debug)]
pub struct Request<T> {
    /// Custom metadata sent by the client.
    pub metadata: Metadata,
    /// When the client stops waiting, if it said (`grpc-timeout`).
    pub deadline: Option<Instant>,
    /// The request.
    pub message: T,
}

impl<T> Request<T> {
    /// A request with no metadata and no deadline.
    pub fn new(message: T) -> Request<T> {
        Request { metadata: Metadata::new(), deadline: None, message }
    }

    /// The request itself.
    pub fn into_inner(self) -> T {
        self.message
    }

    /// The same call around another message.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Request<U> {
        Request { metadata: self.metadata, deadline: self.deadline, message: f(self.message) }
    }
}

/// The requests of a call, in order. For a unary or server-streaming method
/// it holds the one request, already decoded.
#[derive(Debug)]
pub struct Streaming {
    inner: Inbound,
}

#[derive(Debug)]
enum Inbound {
    One(Option<Message>),
    Queue(mpsc::Receiver<Message>),
}

impl Streaming {
    pub(crate) fn one(message: Message) -> Streaming {
        Streaming { inner: Inbound::One(Some(message)) }
    }

    pub(crate) fn queue(rx: mpsc::Receiver<Message>) -> Streaming {
        Streaming { inner: Inbound::Queue(rx) }
    }

    /// The next request; `None` once the client has half-closed. (When the
    /// stream fails — bad framing, an invalid message, a reset — the engine
    /// ends the call itself, so the handler only sees an end.)
    pub async fn message(&mut self) -> Option<Message> {
        match &mut self.inner {
            Inbound::One(m) => m.take(),
            Inbound::Queue(rx) => rx.recv().await,
        }
    }

    /// The single request of a unary or server-streaming call.
    pub async fn single(&mut self) -> Result<Message, Status> {
        self.message()
            .await
            .ok_or_else(|| Status::new(Code::Internal, "the call carries no request message"))
    }
}

/// What the application sends back through a [`Responder`].
#[derive(Debug)]
pub(crate) enum Out {
    /// Initial metadata (sent with the response headers).
    Headers(Metadata),
    /// A response block for the engine to encode, and whether to compress.
    Block(Block, bool),
    /// An already encoded response.
    Encoded(Bytes, bool),
}

/// One response of a method that answers once, with the initial metadata
/// staged before it.
#[derive(Debug)]
pub(crate) struct UnaryOut {
    pub(crate) headers: Option<Metadata>,
    pub(crate) message: Option<Out>,
}

/// Where a responder's output goes: a queue for a streaming response, a
/// one-shot slot for a single one (no queue to allocate per call).
#[derive(Debug)]
enum Sink {
    Stream(mpsc::Sender<Out>),
    Unary { slot: Option<oneshot::Sender<UnaryOut>>, headers: Option<Metadata> },
}

/// The application's end of a call's responses.
#[derive(Debug)]
pub struct Responder {
    sink: Sink,
    headers: Option<Metadata>,
    compress: bool,
    output: u32,
}

impl Responder {
    /// A responder for a streaming response.
    pub(crate) fn stream(tx: mpsc::Sender<Out>, output: u32) -> Responder {
        Responder {
            sink: Sink::Stream(tx),
            headers: Some(Metadata::new()),
            compress: false,
            output,
        }
    }

    /// A responder for a method with one response.
    pub(crate) fn unary(tx: oneshot::Sender<UnaryOut>, output: u32) -> Responder {
        Responder {
            sink: Sink::Unary { slot: Some(tx), headers: None },
            headers: Some(Metadata::new()),
            compress: false,
            output,
        }
    }

    /// Initial metadata, sent with the first response (or with
    /// [`Responder::send_headers`]); changes after that are ignored.
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        self.headers.get_or_insert_with(Metadata::new)
    }

    /// Compress the following responses (gzip) when the client accepts it.
    pub fn set_compression(&mut self, on: bool) {
        self.compress = on;
    }

    /// The response type (table index) blocks must be built as.
    pub fn output_type(&self) -> u32 {
        self.output
    }

    async fn push(&mut self, out: Out) -> Result<(), Status> {
        let gone = || Status::new(Code::Cancelled, "the call has ended");
        match &mut self.sink {
            Sink::Stream(tx) => tx.send(out).await.map_err(|_| gone()),
            Sink::Unary { headers, .. } if matches!(out, Out::Headers(_)) => {
                if let Out::Headers(md) = out {
                    *headers = Some(md);
                }
                Ok(())
            }
            Sink::Unary { slot, headers } => {
                let tx = slot.take().ok_or_else(|| {
                    Status::new(Code::Internal, "a method with one response sent a second")
                })?;
                tx.send(UnaryOut { headers: headers.take(), message: Some(out) })
                    .map_err(|_| gone())
            }
        }
    }

    /// Sends the initial metadata now, before any response.
    pub async fn send_headers(&mut self) -> Result<(), Status> {
        match self.headers.take() {
            Some(md) => self.push(Out::Headers(md)).await,
            None => Ok(()),
        }
    }

    /// Sends a response laid out with the builder (the engine encodes it).
    /// Waits while the client is not reading (flow control).
    pub async fn send(&mut self, block: Block) -> Result<(), Status> {
        self.send_headers().await?;
        let c = self.compress;
        self.push(Out::Block(block, c)).await
    }

    /// Sends an already encoded response.
    pub async fn send_encoded(&mut self, message: Bytes) -> Result<(), Status> {
        self.send_headers().await?;
        let c = self.compress;
        self.push(Out::Encoded(message, c)).await
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        // Initial metadata of a call that sent no response still goes out
        // (in the trailers-only response's headers).
        let staged = self.headers.take().filter(|md| !md.is_empty());
        match &mut self.sink {
            // The queue is empty in that case, so the push cannot fail for
            // want of room.
            Sink::Stream(tx) => {
                if let Some(md) = staged {
                    let _ = tx.try_send(Out::Headers(md));
                }
            }
            Sink::Unary { slot, headers } => {
                let md = headers.take().or(staged);
                if let (Some(tx), Some(md)) = (slot.take(), md) {
                    let _ = tx.send(UnaryOut { headers: Some(md), message: None });
                }
            }
        }
    }
}

/// A service: the application side of the seam.
///
/// The engine calls [`Service::call`] once per call with the method id (an
/// index into [`Service::schema`]'s methods), the request(s) and the
/// responder. The future's output is the call's outcome: trailing metadata
/// on success, or the error status (which may carry trailing metadata too).
/// Dropping the future cancels the call; the engine does so when the client
/// cancels or the deadline passes.
///
/// Generated service traits implement this through an adapter; the
/// dynamic path implements it directly over [`Message`] views.
pub trait Service: Send + Sync + 'static {
    /// The schema whose methods this service implements.
    fn schema(&self) -> &Arc<Schema>;

    /// The full name of the service (`package.Service`).
    fn name(&self) -> &str;

    /// Runs one call.
    fn call(
        self: Arc<Self>,
        method: u32,
        request: Request<Streaming>,
        responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>>;
}
