//! The attachment to an engine, run on a Rust thread of its own, and the
//! queue Python takes its calls from.

use std::os::fd::IntoRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use protoplane_grpc::{Schema, Service};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::call::{Call, PyService};
use crate::queue::Queue;

/// An application for the engine at one attach socket.
#[pyclass(frozen, module = "protoplane._native")]
pub(crate) struct Attachment {
    path: PathBuf,
    spin: Duration,
    nice: i32,
    queue: Arc<Queue>,
    services: Mutex<Vec<Arc<PyService>>>,
    runner: Mutex<Option<std::thread::JoinHandle<()>>>,
    stop: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    /// Why the attachment ended for good (the engine refused it).
    error: Arc<Mutex<Option<String>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[pymethods]
impl Attachment {
    /// `spin_us`: how long the attachment's thread polls its rings after
    /// work before it sleeps (latency against CPU on the Python process's
    /// core; 0 by default: that core is Python's).
    ///
    /// `nice`: the attachment thread's scheduling priority (19, the
    /// lowest, by default). That thread and the handlers share the Python
    /// process's core; at an equal priority, every wake-up of the thread
    /// (the engine rang, a result to post) would take the core from the
    /// handler running at once, a context switch per call each way. At the
    /// lowest it runs when the handlers leave the core, and then moves
    /// everything waiting in one go, as a run-to-completion loop would; it
    /// still gets a share of a busy core (the kernel starves no thread),
    /// so the engine hears from a saturated process.
    #[new]
    #[pyo3(signature = (path, spin_us=0, nice=19))]
    fn new(path: PathBuf, spin_us: u64, nice: i32) -> Attachment {
        Attachment {
            path,
            spin: Duration::from_micros(spin_us),
            nice,
            queue: Arc::default(),
            services: Mutex::default(),
            runner: Mutex::default(),
            stop: Mutex::default(),
            error: Arc::default(),
        }
    }

    /// Serves service `name` of the serialized `FileDescriptorSet`
    /// `descriptor_set` (its file and every file it imports), with a
    /// Python handler per method: `handlers` maps a method's name to the
    /// handler index calls carry. Returns, per handled method, its name
    /// and whether the client and the server stream, as the schema says.
    fn add_service(
        &self,
        name: &str,
        descriptor_set: &[u8],
        handlers: Vec<(String, u32)>,
    ) -> PyResult<Vec<(String, bool, bool)>> {
        if lock(&self.runner).is_some() {
            return Err(PyRuntimeError::new_err("services are added before serving"));
        }
        let schema = Schema::from_descriptor_set(descriptor_set)
            .map_err(|e| PyValueError::new_err(format!("the descriptor set of {name}: {e}")))?;
        if !schema.services().iter().any(|s| s == name) {
            return Err(PyValueError::new_err(format!(
                "the descriptor set does not declare service {name}"
            )));
        }
        let mut by_method = vec![None; schema.methods().len()];
        let mut shapes = Vec::new();
        for (method, index) in handlers {
            let id = schema.find(name, &method).ok_or_else(|| {
                PyValueError::new_err(format!("service {name} has no method {method}"))
            })?;
            let m = &schema.methods()[id as usize];
            by_method[id as usize] = Some(index);
            shapes.push((method, m.client_streaming, m.server_streaming));
        }
        let paths = schema.methods().iter().map(|m| Arc::<str>::from(m.path.as_str())).collect();
        let svc = PyService {
            name: name.to_string(),
            schema: Arc::new(schema),
            handlers: by_method,
            paths,
            queue: self.queue.clone(),
        };
        let mut services = lock(&self.services);
        if services.iter().any(|s| s.name == name) {
            return Err(PyValueError::new_err(format!("service {name} was added twice")));
        }
        services.push(Arc::new(svc));
        Ok(shapes)
    }

    /// Attaches (and attaches again whenever the engine restarts) on a
    /// thread of its own, until `stop`.
    fn start(&self) -> PyResult<()> {
        let mut runner = lock(&self.runner);
        if runner.is_some() {
            return Err(PyRuntimeError::new_err("already serving"));
        }
        let services = lock(&self.services).clone();
        if services.is_empty() {
            return Err(PyRuntimeError::new_err("no service to serve: add a servicer first"));
        }
        let app = services
            .into_iter()
            .fold(protoplane_app::attach(&self.path).spin(self.spin), |app, s| {
                app.service(s as Arc<dyn Service>)
            });
        let (tx, rx) = tokio::sync::oneshot::channel();
        *lock(&self.stop) = Some(tx);
        let queue = self.queue.clone();
        let error = self.error.clone();
        let nice = self.nice;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("the attachment's runtime: {e}")))?;
        let t = std::thread::Builder::new()
            .name("protoplane-attach".into())
            .spawn(move || {
                // setpriority(PRIO_PROCESS) with a thread id sets that
                // thread's priority (Linux). Failing to is not an error:
                // the thread then competes with the handlers as equals.
                let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), nice);
                rt.block_on(async {
                    tokio::select! {
                        r = app.run() => {
                            if let Err(e) = r {
                                *lock(&error) = Some(e.to_string());
                            }
                        }
                        _ = rx => {}
                    }
                });
                // Calls not yet taken fail UNAVAILABLE; waiters return.
                queue.close();
            })
            .map_err(|e| PyRuntimeError::new_err(format!("the attachment's thread: {e}")))?;
        *runner = Some(t);
        Ok(())
    }

    /// The next call, waiting up to `timeout` seconds (`None`: until one
    /// comes) with the GIL released; `None` if none came or serving ended.
    #[pyo3(signature = (timeout=None))]
    fn next_call(&self, py: Python<'_>, timeout: Option<f64>) -> Option<Call> {
        // A call already waiting is taken with the GIL held: a worker that
        // finds work keeps running, with no hand-over of the GIL per call.
        if let Some(c) = self.queue.pop(Some(Duration::ZERO)) {
            return Some(Call::new(c));
        }
        let q = self.queue.clone();
        let t = timeout.map(|t| Duration::from_secs_f64(t.max(0.0)));
        py.detach(move || q.pop(t)).map(Call::new)
    }

    /// Hands the results of the calls finished since the last hand-over
    /// to the attachment (an event loop calls it once per pass, when
    /// `Call.finish` returned 2).
    fn flush(&self) {
        self.queue.flush();
    }

    /// Every call waiting now, without waiting.
    fn take_calls(&self) -> Vec<Call> {
        self.queue.take_all().into_iter().map(Call::new).collect()
    }

    /// A socket (its file descriptor, now the caller's) that becomes
    /// readable when calls are waiting: an event loop watches it and then
    /// calls `take_calls`.
    fn bell(&self) -> PyResult<i32> {
        let s = self
            .queue
            .bell()
            .map_err(|e| PyRuntimeError::new_err(format!("the wake-up socket: {e}")))?;
        Ok(s.into_raw_fd())
    }

    /// Detaches: calls in progress are cancelled, waiting ones fail
    /// UNAVAILABLE, and `next_call` returns `None`.
    fn stop(&self, py: Python<'_>) {
        if let Some(tx) = lock(&self.stop).take() {
            let _ = tx.send(());
        }
        let t = lock(&self.runner).take();
        if let Some(t) = t {
            py.detach(move || {
                let _ = t.join();
            });
        }
    }

    /// Why serving ended for good (the engine refused the application),
    /// if it did.
    fn error(&self) -> Option<String> {
        lock(&self.error).clone()
    }

    /// Serving has ended (stopped, or refused).
    fn ended(&self) -> bool {
        self.queue.is_closed()
    }
}
