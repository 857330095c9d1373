//! One call between the attachment and a Python handler: the service the
//! attachment runs ([`PyService`]), the call's shared state ([`CallCore`])
//! and the handle Python holds ([`Call`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;
use protoplane_grpc::{
    BoxFuture, Code, Message, Metadata, Peer, Request, Responder, Schema, Service, Status,
    Streaming,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use tokio::sync::oneshot;

use crate::queue::Queue;
use crate::view::{Held, MessageRef};
use crate::wait::{block_on, now};

/// A service whose methods Python handlers answer.
pub(crate) struct PyService {
    pub(crate) name: String,
    pub(crate) schema: Arc<Schema>,
    /// By method id: the Python handler's index, for the methods it has.
    pub(crate) handlers: Vec<Option<u32>>,
    pub(crate) paths: Vec<Arc<str>>,
    pub(crate) queue: Arc<Queue>,
}

impl Service for PyService {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        request: Request<Streaming>,
        responder: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            let Some(m) = self.schema.method(method) else {
                return Err(Status::new(Code::Unimplemented, "no such method"));
            };
            let Some(handler) = self.handlers.get(method as usize).copied().flatten() else {
                return Err(Status::new(
                    Code::Unimplemented,
                    format!("method {} is not implemented", m.name),
                ));
            };
            let Request { metadata, deadline, peer, message: mut stream } = request;
            let (first, stream) = if m.client_streaming {
                (None, Some(stream))
            } else {
                (Some(stream.single().await?), None)
            };
            let (tx, rx) = oneshot::channel();
            let core = Arc::new(CallCore {
                handler,
                path: self.paths[method as usize].clone(),
                schema: self.schema.clone(),
                input: m.input,
                client_streaming: m.client_streaming,
                server_streaming: m.server_streaming,
                metadata,
                deadline,
                peer,
                first: Mutex::new(first),
                stream: Mutex::new(stream),
                responder: Mutex::new(Some(responder)),
                done: Mutex::new(Some(tx)),
                cancelled: AtomicBool::new(false),
                held: Mutex::new(Vec::new()),
                queue: self.queue.clone(),
            });
            let guard = EndOnDrop(core.clone());
            self.queue.push(core);
            let out = rx.await.unwrap_or_else(|_| {
                Err(Status::new(Code::Unknown, "the Python side dropped the call"))
            });
            drop(guard);
            out
        })
    }
}

/// Ends a call whose future went away (the client cancelled, the deadline
/// passed, the engine left): the handler sees `is_active()` false, and
/// its request views stop reading.
struct EndOnDrop(Arc<CallCore>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.cancelled.store(true, Ordering::Release);
        self.0.release_views();
    }
}

/// What a call shares between the attachment and Python.
pub(crate) struct CallCore {
    handler: u32,
    path: Arc<str>,
    schema: Arc<Schema>,
    input: u32,
    client_streaming: bool,
    server_streaming: bool,
    metadata: Metadata,
    deadline: Option<Instant>,
    peer: Option<Arc<Peer>>,
    /// The request of a unary or server-streaming call, until Python takes it.
    first: Mutex<Option<Message>>,
    /// The requests of a client-streaming call.
    stream: Mutex<Option<Streaming>>,
    responder: Mutex<Option<Responder>>,
    done: Mutex<Option<oneshot::Sender<Result<Metadata, Status>>>>,
    /// The call ended on the attachment's side.
    cancelled: AtomicBool,
    /// Every view cell handed to Python, emptied when the call ends.
    held: Mutex<Vec<Arc<Held>>>,
    queue: Arc<Queue>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl CallCore {
    fn release_views(&self) {
        for h in lock(&self.held).drain(..) {
            h.release();
        }
    }

    fn view(&self, m: Message) -> MessageRef {
        let h = Held::new(self.schema.clone(), m);
        lock(&self.held).push(h.clone());
        MessageRef::root(h, self.input)
    }

    /// A call the queue dropped before Python took it (the attachment
    /// stopped).
    pub(crate) fn fail_unstarted(&self) {
        if let Some(tx) = lock(&self.done).take() {
            let _ = tx.send(Err(Status::new(Code::Unavailable, "the Python service stopped")));
        }
    }

    fn finished(&self) -> bool {
        lock(&self.done).is_none()
    }
}

/// A call as the Python side handles it (`protoplane._server` wraps it in
/// a grpcio-style `ServicerContext`).
#[pyclass(frozen, module = "protoplane._native")]
pub(crate) struct Call {
    core: Arc<CallCore>,
}

impl Call {
    pub(crate) fn new(core: Arc<CallCore>) -> Call {
        Call { core }
    }
}

impl Drop for Call {
    /// A call Python let go of without finishing it (which the package's
    /// own code never does) ends INTERNAL rather than hanging the client.
    fn drop(&mut self) {
        if let Some(tx) = lock(&self.core.done).take() {
            let _ = tx.send(Err(Status::new(Code::Internal, "the handler never answered")));
        }
        self.core.release_views();
    }
}

fn ended() -> PyErr {
    crate::CallEnded::new_err("the call has ended")
}

#[pymethods]
impl Call {
    /// Index of the handler (as the Python side registered it).
    #[getter]
    fn handler(&self) -> u32 {
        self.core.handler
    }

    /// The method's path, `/package.Service/Method`.
    #[getter]
    fn method(&self) -> &str {
        &self.core.path
    }

    #[getter]
    fn client_streaming(&self) -> bool {
        self.core.client_streaming
    }

    #[getter]
    fn server_streaming(&self) -> bool {
        self.core.server_streaming
    }

    /// The request of a unary or server-streaming call (once).
    fn request(&self) -> PyResult<MessageRef> {
        let m = lock(&self.core.first).take().ok_or_else(|| {
            PyRuntimeError::new_err("the request was taken already, or the call streams requests")
        })?;
        Ok(self.core.view(m))
    }

    /// The next request of a client-streaming call, waiting for it with
    /// the GIL released; `None` after the last one (or once the call
    /// ended).
    fn next_request(&self, py: Python<'_>) -> Option<MessageRef> {
        let core = self.core.clone();
        let m = py.detach(move || {
            let mut s = lock(&core.stream);
            let s = s.as_mut()?;
            if core.cancelled.load(Ordering::Acquire) {
                return None;
            }
            block_on(s.message())
        })?;
        Some(self.core.view(m))
    }

    /// The next request if one is waiting now: `(True, request)`,
    /// `(True, None)` after the last one, `(False, None)` when none is
    /// there yet (an event loop waits its own way, then asks again).
    fn try_next_request(&self) -> (bool, Option<MessageRef>) {
        let mut s = lock(&self.core.stream);
        let Some(stream) = s.as_mut() else { return (true, None) };
        if self.core.cancelled.load(Ordering::Acquire) {
            return (true, None);
        }
        match now(stream.message()) {
            Some(Some(m)) => {
                drop(s);
                (true, Some(self.core.view(m)))
            }
            Some(None) => (true, None),
            None => (false, None),
        }
    }

    /// The client's metadata: `(key, value)` pairs, values `str`, or
    /// `bytes` for `-bin` keys (grpcio's `invocation_metadata()`).
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let items: Vec<Bound<'py, PyTuple>> = self
            .core
            .metadata
            .iter()
            .map(|(k, v)| {
                let key = PyString::new(py, k).into_any();
                let value = if k.ends_with("-bin") {
                    PyBytes::new(py, v).into_any()
                } else {
                    PyString::new(py, &String::from_utf8_lossy(v)).into_any()
                };
                PyTuple::new(py, [key, value])
            })
            .collect::<PyResult<_>>()?;
        PyTuple::new(py, items)
    }

    /// The client's address as grpcio spells it, where the engine told.
    fn peer(&self) -> String {
        match self.core.peer.as_ref().and_then(|p| p.addr) {
            Some(std::net::SocketAddr::V4(a)) => format!("ipv4:{a}"),
            Some(std::net::SocketAddr::V6(a)) => format!("ipv6:{a}"),
            // A call the engine had no address for.
            None => "unknown".to_string(),
        }
    }

    /// The certificate chain (DER, leaf first) the client presented and
    /// the engine verified (mutual TLS); empty without one.
    fn peer_certificates<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let certs = self.core.peer.as_ref().map(|p| p.certificates.clone()).unwrap_or_default();
        PyList::new(py, certs.iter().map(|c| PyBytes::new(py, c)))
    }

    /// Seconds left before the client's deadline (`None`: it set none).
    fn time_remaining(&self) -> Option<f64> {
        self.core.deadline.map(|d| d.saturating_duration_since(Instant::now()).as_secs_f64())
    }

    /// The call is still going on (not finished, not cancelled, its
    /// deadline not passed).
    fn is_active(&self) -> bool {
        !self.core.cancelled.load(Ordering::Acquire)
            && !self.core.finished()
            && self.core.deadline.is_none_or(|d| Instant::now() < d)
    }

    /// Adds initial metadata (sent with the first response, or by
    /// `send_headers`).
    fn add_initial_metadata(&self, key: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut r = lock(&self.core.responder);
        let r = r.as_mut().ok_or_else(ended)?;
        put(r.metadata_mut(), key, value)
    }

    /// Sends the response headers now.
    fn send_headers(&self, py: Python<'_>) -> PyResult<()> {
        let core = self.core.clone();
        py.detach(move || {
            let mut r = lock(&core.responder);
            let r = r.as_mut().ok_or_else(|| Status::new(Code::Cancelled, "ended"))?;
            block_on(r.send_headers())
        })
        .map_err(|_| ended())
    }

    /// Sends one response (already serialized), waiting with the GIL
    /// released while the client is not reading; `False` if the call
    /// ended.
    fn send(&self, py: Python<'_>, message: &[u8]) -> bool {
        let message = Bytes::copy_from_slice(message);
        let core = self.core.clone();
        py.detach(move || {
            let mut r = lock(&core.responder);
            match r.as_mut() {
                Some(r) => block_on(r.send_encoded(message)).is_ok(),
                None => false,
            }
        })
    }

    /// Sends one response if there is room now: 0 sent, 1 no room (wait
    /// and call `send`), 2 the call ended.
    fn try_send(&self, message: &[u8]) -> u8 {
        let mut r = lock(&self.core.responder);
        let Some(r) = r.as_mut() else { return 2 };
        match r.try_send_encoded(Bytes::copy_from_slice(message)) {
            Ok(None) => 0,
            Ok(Some(_)) => 1,
            Err(_) => 2,
        }
    }

    /// Ends the call: the response of a method that answers once (if any),
    /// then the status with its trailing metadata. Every view of its
    /// requests stops reading. Returns 0 if the call had ended already, 1
    /// if the result is handed over (or kept for the next hand-over), 2 if
    /// it is the first kept since the last: an event loop then schedules
    /// `Attachment.flush`.
    #[pyo3(signature = (code, details, trailing, response=None))]
    fn finish(
        &self,
        py: Python<'_>,
        code: u32,
        details: &str,
        trailing: &Bound<'_, PyAny>,
        response: Option<&[u8]>,
    ) -> PyResult<u8> {
        let mut md = Metadata::new();
        let mut rich = Bytes::new();
        for item in trailing.try_iter()? {
            let item = item?;
            let (k, v): (String, Bound<'_, PyAny>) = item.extract()?;
            if k == "grpc-status-details-bin" {
                rich = Bytes::copy_from_slice(v.extract::<&[u8]>()?);
                continue;
            }
            put(&mut md, &k, &v)?;
        }
        let response = response.map(Bytes::copy_from_slice);
        let code = Code::from_u32(code);
        let details = details.to_string();
        let core = self.core.clone();
        let end = move || {
            let Some(done) = lock(&core.done).take() else { return 0 };
            let mut r = lock(&core.responder).take();
            let mut result = Ok(md);
            if let (Some(resp), Some(r), Code::Ok) = (response, r.as_mut(), code) {
                if let Err(st) = block_on(r.send_encoded(resp)) {
                    result = Err(st);
                }
            }
            // The responder goes first: headers set but not sent leave with it.
            drop(r);
            let result = match (result, code) {
                (Ok(md), Code::Ok) => Ok(md),
                (Ok(md), code) => {
                    Err(Status { code, message: details, metadata: md, details: rich })
                }
                (Err(st), _) => Err(st),
            };
            core.release_views();
            if core.cancelled.load(Ordering::Acquire) {
                return 0;
            }
            if core.queue.finish(done, result) {
                2
            } else {
                1
            }
        };
        // A single response goes into a one-shot slot, which never waits:
        // no reason to give the GIL up (and take it back) for it. A
        // streaming call's queue may be full.
        Ok(if self.core.server_streaming { py.detach(end) } else { end() })
    }
}

/// Puts one grpcio metadata pair: `str` values on text keys, `bytes` on
/// `-bin` keys.
fn put(md: &mut Metadata, key: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
    let key = key.to_ascii_lowercase();
    let r = if key.ends_with("-bin") {
        let b: Vec<u8> = match value.extract::<&[u8]>() {
            Ok(b) => b.to_vec(),
            Err(_) => value.extract::<String>()?.into_bytes(),
        };
        md.insert_bin(&key, &b)
    } else {
        let s: String = match value.extract::<String>() {
            Ok(s) => s,
            Err(_) => String::from_utf8_lossy(value.extract::<&[u8]>()?).into_owned(),
        };
        md.insert(&key, &s)
    };
    r.map_err(|e| PyValueError::new_err(format!("metadata {key:?}: {e}")))
}
