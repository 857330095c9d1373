//! `protoplane._native`: the Rust half of the Python package.
//!
//! A Python service attaches to a protoplane engine like a Rust one does
//! (`protoplane_app`): the engine terminates HTTP/2 and gRPC and decodes
//! every request into a block in the region this process shares with it.
//! What runs in Python is only the handler.
//!
//! How a call reaches Python, and why this way:
//! - The attachment (`protoplane_app::App`) runs on a Rust thread of its
//!   own, with its own single-threaded runtime; it never takes the GIL.
//!   Each call becomes a [`call::CallCore`] pushed on one queue
//!   ([`queue::Queue`]): no Python object is made on that thread, so the
//!   engine's side of this process never waits for the interpreter.
//! - Python takes calls off the queue in one of two ways. Sync servicers:
//!   a pool of Python threads, each blocked in `next_call()` with the GIL
//!   released, runs one handler at a time, so a handler that blocks holds
//!   one thread and the others go on (grpcio's own model, a thread pool).
//!   Async servicers: the event loop watches a socket the queue writes one
//!   byte to when it goes from empty to not empty, and takes every waiting
//!   call at once (`take_calls()`): one wake-up per batch, not per call.
//! - A request reaches the handler as a [`view::MessageRef`]: attribute
//!   reads go straight to the block through the schema's tables (no
//!   protobuf parse in Python). The view holds the call's message through a
//!   [`view::Held`] cell that the call empties when it ends (or is
//!   cancelled), which releases the chunk to the engine: a view read after
//!   that raises `CallEnded`, it never reads memory given back.
//! - Responses are what grpcio handlers return (`*_pb2` messages), turned
//!   into bytes by the method's own `response_serializer` (protobuf's C
//!   implementation) in Python and handed to the engine as encoded
//!   messages; `bytes` may be returned directly.

use pyo3::prelude::*;

mod attachment;
mod call;
mod queue;
mod view;
mod wait;

pyo3::create_exception!(
    _native,
    CallEnded,
    pyo3::exceptions::PyRuntimeError,
    "A request (or a part of one) was read after its call ended: its memory went back to the engine."
);

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<attachment::Attachment>()?;
    m.add_class::<call::Call>()?;
    m.add_class::<view::MessageRef>()?;
    m.add_class::<view::RepeatedRef>()?;
    m.add("CallEnded", m.py().get_type::<CallEnded>())?;
    // The attachment's log lines (waiting for an engine, attached again)
    // on stderr, levels from RUST_LOG; a host process that installed its
    // own subscriber keeps it.
    let _ = protoplane_telemetry::init_logs(Default::default());
    Ok(())
}
