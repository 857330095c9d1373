//! Requests as Python reads them: views over the block the engine decoded,
//! answering the read side of a generated `*_pb2` message (attribute per
//! field, `HasField`, `WhichOneof`, repeated fields as sequences, maps as
//! mappings, `SerializeToString`) without parsing anything in Python.
//!
//! A view is a position (type, object offset) in one message, and the
//! message is reached through a [`Held`] cell its call empties when it
//! ends: the engine's chunk is released then, and every read after it
//! raises `CallEnded`. Each read re-opens the position through the wire
//! engine's checked [`MessageView`], so a view can never read outside its
//! block, whatever the block holds.

use std::sync::{Arc, Mutex, MutexGuard};

use protoplane_grpc::{Message, Schema};
use protoplane_schema::{Field, FieldFlags};
use protoplane_wire::{BlockError, EncodeOptions, Encoder, MessageView, Value};
use pyo3::exceptions::{PyAttributeError, PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PySlice, PyString};
use pyo3::IntoPyObjectExt;

/// One request message of a call, until the call ends.
pub(crate) struct Held {
    schema: Arc<Schema>,
    message: Mutex<Option<Message>>,
}

impl Held {
    pub(crate) fn new(schema: Arc<Schema>, message: Message) -> Arc<Held> {
        Arc::new(Held { schema, message: Mutex::new(Some(message)) })
    }

    /// Gives the message (and the chunk it reads) back.
    pub(crate) fn release(&self) {
        let m = self.lock().take();
        drop(m);
    }

    fn lock(&self) -> MutexGuard<'_, Option<Message>> {
        self.message.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the view at `(index, at)`, if the call has not ended.
    fn with<R>(
        &self,
        index: u32,
        at: usize,
        f: impl FnOnce(MessageView<'_>) -> PyResult<R>,
    ) -> PyResult<R> {
        let g = self.lock();
        let m = g.as_ref().ok_or_else(|| {
            crate::CallEnded::new_err("the request was read after its call ended")
        })?;
        let v = MessageView::reopen(self.schema.tables(), m.source(), index, at).map_err(bad)?;
        f(v)
    }
}

fn bad(e: BlockError) -> PyErr {
    PyValueError::new_err(format!("unreadable request block: {e}"))
}

/// A message of a request (the request itself, or a message inside it).
#[pyclass(frozen, module = "protoplane._native", name = "Message")]
pub(crate) struct MessageRef {
    held: Arc<Held>,
    index: u32,
    /// The object's offset in the block; 0: the empty message (an unset
    /// message field reads as its type's default instance, as in `*_pb2`).
    at: usize,
}

impl MessageRef {
    pub(crate) fn root(held: Arc<Held>, index: u32) -> MessageRef {
        // The root's offset, read once (the block is checked as any is).
        let at = {
            let g = held.lock();
            g.as_ref()
                .and_then(|m| MessageView::new(held.schema.tables(), m.source(), index).ok())
                .map_or(0, |v| v.offset())
        };
        MessageRef { held, index, at }
    }

    /// The Python value of field `f` of `v` (this view's message).
    fn read(&self, py: Python<'_>, v: &MessageView<'_>, f: &Field) -> PyResult<Py<PyAny>> {
        if f.is_repeated() {
            if f.flags.has(FieldFlags::MAP) {
                return map(py, &self.held, v, f);
            }
            return RepeatedRef {
                held: self.held.clone(),
                index: self.index,
                at: self.at,
                number: f.number,
            }
            .into_py_any(py);
        }
        singular(py, &self.held, v, f)
    }

    fn field<'v>(v: &MessageView<'v>, name: &str) -> PyResult<&'v Field> {
        v.field_named(name).ok_or_else(|| {
            PyAttributeError::new_err(format!("{} has no field {name:?}", v.type_name()))
        })
    }
}

/// A Python value of one field's value.
fn value(py: Python<'_>, held: &Arc<Held>, v: Value<'_>) -> PyResult<Py<PyAny>> {
    match v {
        Value::Bool(b) => b.into_py_any(py),
        Value::I32(n) | Value::Enum(n) => n.into_py_any(py),
        Value::I64(n) => n.into_py_any(py),
        Value::U32(n) => n.into_py_any(py),
        Value::U64(n) => n.into_py_any(py),
        Value::F32(x) => (x as f64).into_py_any(py),
        Value::F64(x) => x.into_py_any(py),
        Value::String(s) => match std::str::from_utf8(s) {
            Ok(s) => PyString::new(py, s).into_py_any(py),
            // proto2 strings are not checked on the wire: read as protobuf
            // Python would fail to, lossily instead of not at all.
            Err(_) => PyString::new(py, &String::from_utf8_lossy(s)).into_py_any(py),
        },
        Value::Bytes(b) => PyBytes::new(py, b).into_py_any(py),
        Value::Message(m) => {
            MessageRef { held: held.clone(), index: m.type_index(), at: m.offset() }.into_py_any(py)
        }
    }
}

/// The value of a singular field as `*_pb2` reads it: the default when
/// unset, the empty message for an unset message field.
fn singular(
    py: Python<'_>,
    held: &Arc<Held>,
    v: &MessageView<'_>,
    f: &Field,
) -> PyResult<Py<PyAny>> {
    match v.get_or_default(f).map_err(bad)? {
        Some(x) => value(py, held, x),
        None => MessageRef { held: held.clone(), index: f.sub, at: 0 }.into_py_any(py),
    }
}

/// A map field as a `dict` (keys hashed once, values read as fields are).
fn map(py: Python<'_>, held: &Arc<Held>, v: &MessageView<'_>, f: &Field) -> PyResult<Py<PyAny>> {
    let d = PyDict::new(py);
    let entries = v.repeated(f).map_err(bad)?;
    for e in entries.iter() {
        let Value::Message(e) = e.map_err(bad)? else { continue };
        let (Some(kf), Some(vf)) = (e.field(1), e.field(2)) else { continue };
        let k = singular(py, held, &e, kf)?;
        let x = singular(py, held, &e, vf)?;
        // Proto3 maps keep the last entry of a repeated key.
        d.set_item(k, x)?;
    }
    d.into_py_any(py)
}

/// `object.__getattribute__`: the ordinary attribute lookup, for the
/// names that are not fields (methods).
static GENERIC_GETATTR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

#[pymethods]
impl MessageRef {
    /// Fields first: a field read is the common case, and trying the type's
    /// attributes first would raise (and discard) an `AttributeError` per
    /// field read. Other names (the methods) take the ordinary lookup.
    fn __getattribute__(slf: &Bound<'_, Self>, name: &Bound<'_, PyString>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let me = slf.get();
        let key = name.to_cow()?;
        let field = me.held.with(me.index, me.at, |v| match v.field_named(&key) {
            Some(f) => me.read(py, &v, f).map(Some),
            None => Ok(None),
        });
        match field {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            // Ended: methods still answer (`readable`, `type_name`); a
            // field name falls through to `__getattr__`, which raises.
            Err(e) if e.is_instance_of::<crate::CallEnded>(py) => {}
            Err(e) => return Err(e),
        }
        let generic = GENERIC_GETATTR.get_or_try_init(py, || {
            py.import("builtins")?.getattr("object")?.getattr("__getattribute__").map(Bound::unbind)
        })?;
        Ok(generic.bind(py).call1((slf, name))?.unbind())
    }

    fn __getattr__(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyAny>> {
        self.held.with(self.index, self.at, |v| {
            let f = Self::field(&v, name)?;
            self.read(py, &v, f)
        })
    }

    /// Whether a field with presence is set (a message field, an
    /// `optional` or proto2 field, a oneof member), or any member of the
    /// oneof of this name.
    #[allow(non_snake_case)]
    fn HasField(&self, name: &str) -> PyResult<bool> {
        self.held.with(self.index, self.at, |v| {
            if let Some(i) = oneof_index(&v, name) {
                return Ok(v.oneof_case(i) != 0);
            }
            let f = Self::field(&v, name)?;
            if f.is_repeated() {
                return Err(PyValueError::new_err(format!("HasField on repeated field {name:?}")));
            }
            Ok(v.has(f))
        })
    }

    /// The name of the member of oneof `name` that is set, or `None`.
    #[allow(non_snake_case)]
    fn WhichOneof(&self, name: &str) -> PyResult<Option<String>> {
        self.held.with(self.index, self.at, |v| {
            let i = oneof_index(&v, name).ok_or_else(|| {
                PyValueError::new_err(format!("{} has no oneof {name:?}", v.type_name()))
            })?;
            let n = v.oneof_case(i);
            Ok(v.field(n).map(|f| v.tables().str(f.name).to_string()))
        })
    }

    /// The message's wire encoding (for the request itself: the bytes the
    /// client sent).
    #[allow(non_snake_case)]
    fn SerializeToString<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let g = self.held.lock();
        let m = g.as_ref().ok_or_else(|| {
            crate::CallEnded::new_err("the request was read after its call ended")
        })?;
        let root = MessageView::new(self.held.schema.tables(), m.source(), self.index)
            .map(|v| v.offset())
            .ok();
        if root == Some(self.at) && !m.wire().is_empty() {
            return Ok(PyBytes::new(py, m.wire()));
        }
        let mut enc = Encoder::new();
        let out = enc
            .encode_at(
                self.held.schema.tables(),
                self.index,
                m.source(),
                self.at,
                &EncodeOptions::default(),
            )
            .map_err(bad)?;
        Ok(PyBytes::new(py, out))
    }

    #[allow(non_snake_case)]
    fn ByteSize(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.SerializeToString(py)?.as_bytes().len())
    }

    /// The full name of the message's type.
    #[getter]
    fn type_name(&self) -> PyResult<String> {
        let ts = self.held.schema.tables();
        if (self.index as usize) < ts.messages().len() {
            Ok(ts.message_name(self.index).to_string())
        } else {
            Err(PyValueError::new_err("no such message type"))
        }
    }

    /// The names of the fields that are set, in field-number order.
    fn set_fields(&self) -> PyResult<Vec<String>> {
        self.held.with(self.index, self.at, |v| {
            Ok(v.fields()
                .iter()
                .filter(|f| v.has(f))
                .map(|f| v.tables().str(f.name).to_string())
                .collect())
        })
    }

    /// A `*_pb2` object with this message's contents (a copy, which
    /// outlives the call), of the generated class protobuf's default pool
    /// has for its type.
    fn to_pb2(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let f = py.import("protoplane._types")?.getattr("to_pb2")?;
        Ok(f.call1((slf,))?.unbind())
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let me = slf.get();
        let name = me.type_name()?;
        if !me.readable() {
            return Ok(format!("<{name} view: its call has ended>"));
        }
        let text = Self::to_pb2(slf)?.bind(slf.py()).str()?.to_string();
        Ok(format!("<{name} view: {}>", text.trim().replace('\n', "; ")))
    }

    /// Whether the call this request belongs to is still going on (its
    /// memory still readable).
    #[getter]
    fn readable(&self) -> bool {
        self.held.lock().is_some()
    }
}

fn oneof_index(v: &MessageView<'_>, name: &str) -> Option<usize> {
    let ts = v.tables();
    ts.oneofs(ts.message(v.type_index())).iter().position(|o| ts.str(o.name) == name)
}

/// A repeated (non-map) field of a request: a read-only sequence.
#[pyclass(frozen, sequence, module = "protoplane._native", name = "Repeated")]
pub(crate) struct RepeatedRef {
    held: Arc<Held>,
    index: u32,
    at: usize,
    number: u32,
}

impl RepeatedRef {
    fn items(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        self.held.with(self.index, self.at, |v| {
            let f = v.field(self.number).ok_or_else(|| PyValueError::new_err("no such field"))?;
            let r = v.repeated(f).map_err(bad)?;
            r.iter().map(|x| value(py, &self.held, x.map_err(bad)?)).collect()
        })
    }
}

#[pymethods]
impl RepeatedRef {
    fn __len__(&self) -> PyResult<usize> {
        self.held.with(self.index, self.at, |v| {
            let f = v.field(self.number).ok_or_else(|| PyValueError::new_err("no such field"))?;
            Ok(v.repeated(f).map_err(bad)?.len())
        })
    }

    fn __getitem__(&self, py: Python<'_>, i: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        if let Ok(s) = i.cast::<PySlice>() {
            let all = PyList::new(py, self.items(py)?)?;
            return all.as_any().get_item(s)?.into_py_any(py);
        }
        let i: isize = i.extract()?;
        self.held.with(self.index, self.at, |v| {
            let f = v.field(self.number).ok_or_else(|| PyValueError::new_err("no such field"))?;
            let r = v.repeated(f).map_err(bad)?;
            let n = r.len() as isize;
            let j = if i < 0 { i + n } else { i };
            if j < 0 || j >= n {
                return Err(PyIndexError::new_err("list index out of range"));
            }
            value(py, &self.held, r.get(j as usize).map_err(bad)?)
        })
    }

    fn __iter__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let all = PyList::new(py, self.items(py)?)?;
        Ok(all.try_iter()?.into_any().unbind())
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        let all = PyList::new(py, self.items(py)?)?;
        let other = match other.cast::<RepeatedRef>() {
            Ok(o) => PyList::new(py, o.get().items(py)?)?.into_any(),
            Err(_) => PyList::new(py, other.try_iter()?.collect::<PyResult<Vec<_>>>()?)?.into_any(),
        };
        all.eq(other)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(PyList::new(py, self.items(py)?)?.repr()?.to_string())
    }
}
