//! The engine's compute units, as an application in its own process
//! reaches them (RPCAcc's `program` / `get_type` / `submit_task` /
//! `poll`).
//!
//! ```ignore
//! let app = protoplane_app::attach(path);
//! let units = app.units();                  // before serve: handlers keep a clone
//! app.serve(Arc::new(MyService { units }))?;
//!
//! // in a handler, on a device-placed request field:
//! units.program(0, "deflate.compress").await?;
//! let image = request.image_device().ok_or(...)?;          // a handle, not bytes
//! let done = units.run(0, TaskDescriptor::new(device_ref(image))).await?;
//! reply.set_result_device(done.handle());                 // the engine pulls the bytes
//! ```
//!
//! Each request travels as a TASK descriptor on the response ring (the
//! control message in a chunk of this process's half); the engine answers
//! it with one NOTIFY on the request ring, which the drain loop turns into
//! the ticket's result. Handles name the engine's device region, which
//! this process never maps: device memory belongs to the call whose
//! request brought it in (and a task's output to its input's call) and is
//! freed when that call ends, so nothing here frees anything.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use protoplane_grpc::{Code, Status};
use protoplane_offload::cu::control::{self, Control};
use protoplane_offload::cu::{DeviceRef, TaskDescriptor};
use protoplane_shm::desc::{self, Descriptor};
use tokio::sync::oneshot;

use crate::session::Session;

/// Answers this process waits for at once, at most.
const MAX_PENDING: usize = 65_536;
/// How long [`Units::wait`] waits for the engine's answer.
const WAIT: Duration = Duration::from_secs(60);

/// A task's (or control message's) outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// The output's range in the device region (empty for control
    /// messages).
    pub output: DeviceRef,
    /// The kernel that ran, or the slot's kernel (`get_type`, `program`).
    pub kernel: String,
}

impl Done {
    /// The output as a reference to put in a response field
    /// (`set_<field>_device`): the engine encodes its bytes.
    pub fn handle(&self) -> protoplane_wire::Ref {
        protoplane_wire::Ref {
            offset: self.output.offset,
            len: self.output.len,
            wire: false,
            device: true,
        }
    }
}

/// A request field's device handle (`<field>_device()` of a generated
/// view) as a compute unit's input.
pub fn device_ref(r: protoplane_wire::Ref) -> DeviceRef {
    DeviceRef::new(r.offset, r.len)
}

/// A submitted task: poll or wait for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket {
    tag: u64,
    slot: u32,
}

impl Ticket {
    /// The slot it was submitted to.
    pub fn slot(&self) -> u32 {
        self.slot
    }
}

enum Pending {
    Waiting(oneshot::Sender<Result<Done, Status>>),
    Ready(Result<Done, Status>),
}

/// A ticket's state, and the receiver its waiter takes.
type Entry = (Pending, Option<oneshot::Receiver<Result<Done, Status>>>);

#[derive(Default)]
pub(crate) struct Inner {
    session: Mutex<Weak<Session>>,
    pending: Mutex<HashMap<u64, Entry>>,
    next: AtomicU64,
}

impl Inner {
    fn pending(&self) -> MutexGuard<'_, HashMap<u64, Entry>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn attach(&self, s: &Arc<Session>) {
        *self.session.lock().unwrap_or_else(PoisonError::into_inner) = Arc::downgrade(s);
    }

    /// The engine's answer for `tag` (the drain loop, on a NOTIFY).
    pub(crate) fn complete(&self, d: &Descriptor, text: Bytes) {
        let text = String::from_utf8_lossy(&text).into_owned();
        let r = match Code::from_u32(d.code as u32) {
            Code::Ok => Ok(Done {
                output: DeviceRef::new(d.timeout_ns as u32, (d.timeout_ns >> 32) as u32),
                kernel: text,
            }),
            code => Err(Status::new(code, text)),
        };
        // Kept for `poll` as well as sent to a waiter (who removes it); a
        // ticket nobody polls or waits on holds its entry, and
        // MAX_PENDING of those refuse further tasks.
        if let Some((slot, _)) = self.pending().get_mut(&d.call) {
            if let Pending::Waiting(tx) = std::mem::replace(slot, Pending::Ready(r.clone())) {
                let _ = tx.send(r);
            }
        }
    }

    /// Fails every answer still awaited (the engine went away).
    pub(crate) fn fail_all(&self) {
        let mut p = self.pending();
        for (slot, _) in p.values_mut() {
            let gone = Err(Status::new(Code::Unavailable, "the engine went away"));
            if let Pending::Waiting(tx) = std::mem::replace(slot, Pending::Ready(gone.clone())) {
                let _ = tx.send(gone);
            }
        }
    }
}

/// The engine's compute units, from this process: cheap to clone, usable
/// from any handler. Every call fails with UNAVAILABLE while no engine is
/// attached, and with UNIMPLEMENTED when the engine runs no units.
#[derive(Clone, Default)]
pub struct Units {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Units {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Units").field("pending", &self.inner.pending().len()).finish()
    }
}

impl Units {
    /// Loads kernel `kernel` (by name: built-in or registered in the
    /// engine) into `slot`.
    pub async fn program(&self, slot: u32, kernel: &str) -> Result<(), Status> {
        self.ask(slot, &Control::Program(kernel.to_owned())).await.map(drop)
    }

    /// The kernel `slot` holds (`None`: unprogrammed); UNAVAILABLE while
    /// its unit is away.
    pub async fn get_type(&self, slot: u32) -> Result<Option<String>, Status> {
        let d = self.ask(slot, &Control::GetType).await?;
        Ok(Some(d.kernel).filter(|k| !k.is_empty()))
    }

    /// Makes `slot`'s unit unavailable (`false`: queued and running tasks
    /// fail at once) or available again.
    pub async fn set_available(&self, slot: u32, available: bool) -> Result<(), Status> {
        self.ask(slot, &Control::SetAvailable(available)).await.map(drop)
    }

    /// Installs an AEAD key under `id` in the engine's key table.
    pub async fn set_key(&self, id: u64, key: &[u8]) -> Result<(), Status> {
        self.ask(0, &Control::SetKey { id, key: key.to_vec() }).await.map(drop)
    }

    /// Places request field `field` (`pkg.Msg.field`) on the device for the
    /// engine's next decode on (RPCAcc's automatic field updating: its
    /// bytes then reach the handler as a handle). `Ok(true)`: it is there.
    pub async fn move_to_device(&self, field: &str) -> Result<bool, Status> {
        self.place(&format!("{field}=device")).await
    }

    /// Places request field `field` in host memory for the next decode on
    /// (a unit it feeds went away): its bytes then reach the handler in
    /// the block. `Ok(false)`: it is on the host.
    pub async fn move_to_host(&self, field: &str) -> Result<bool, Status> {
        self.place(&format!("{field}=host")).await
    }

    /// Whether the engine's next decode places `field` on the device.
    pub async fn is_on_device(&self, field: &str) -> Result<bool, Status> {
        self.place(field).await
    }

    async fn place(&self, spec: &str) -> Result<bool, Status> {
        Ok(self.ask(0, &Control::Place(spec.to_owned())).await?.kernel == "device")
    }

    /// Queues a task on `slot`. Its input (and device parameters) must be
    /// handles of one open call: a request's device-placed field, or an
    /// earlier output. The ticket's result comes when the unit is done, or
    /// at once if the engine refuses the task.
    pub async fn submit_task(&self, slot: u32, task: TaskDescriptor) -> Result<Ticket, Status> {
        self.send(slot, &Control::Submit(task)).await
    }

    /// The ticket's result if it has come (taken: polling again gives
    /// `None`); never waits.
    pub fn poll(&self, t: Ticket) -> Option<Result<Done, Status>> {
        let mut p = self.inner.pending();
        match p.get(&t.tag) {
            Some((Pending::Ready(_), _)) => match p.remove(&t.tag) {
                Some((Pending::Ready(r), _)) => Some(r),
                _ => None,
            },
            _ => None,
        }
    }

    /// Waits for the ticket's result (DEADLINE_EXCEEDED after a minute).
    pub async fn wait(&self, t: Ticket) -> Result<Done, Status> {
        let rx = {
            let mut p = self.inner.pending();
            match p.get_mut(&t.tag) {
                None => return Err(Status::new(Code::NotFound, "no such ticket (taken already)")),
                Some((Pending::Ready(_), _)) => {
                    return match p.remove(&t.tag) {
                        Some((Pending::Ready(r), _)) => r,
                        _ => Err(Status::new(Code::Internal, "ticket state")),
                    }
                }
                Some((Pending::Waiting(_), rx)) => rx.take(),
            }
        };
        let Some(rx) = rx else {
            return Err(Status::new(Code::FailedPrecondition, "the ticket is waited on already"));
        };
        let r = match tokio::time::timeout(WAIT, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(Status::new(Code::Unavailable, "the engine went away")),
            Err(_) => Err(Status::new(Code::DeadlineExceeded, "no answer from the engine")),
        };
        self.inner.pending().remove(&t.tag);
        r
    }

    /// Submits and waits: a task's output, or why it failed.
    pub async fn run(&self, slot: u32, task: TaskDescriptor) -> Result<Done, Status> {
        let t = self.submit_task(slot, task).await?;
        self.wait(t).await
    }

    /// A control message whose answer the caller waits for.
    async fn ask(&self, slot: u32, c: &Control) -> Result<Done, Status> {
        let t = self.send(slot, c).await?;
        self.wait(t).await
    }

    async fn send(&self, slot: u32, c: &Control) -> Result<Ticket, Status> {
        let session = self.inner.session.lock().unwrap_or_else(PoisonError::into_inner).upgrade();
        let Some(session) = session else {
            return Err(Status::new(Code::Unavailable, "not attached to an engine"));
        };
        let tag = self.inner.next.fetch_add(1, Ordering::Relaxed) + 1;
        {
            let mut p = self.inner.pending();
            if p.len() >= MAX_PENDING {
                return Err(Status::new(Code::ResourceExhausted, "too many tasks in flight"));
            }
            let (tx, rx) = oneshot::channel();
            p.insert(tag, (Pending::Waiting(tx), Some(rx)));
        }
        let d = Descriptor { call: tag, method: slot, flags: desc::TASK, ..Descriptor::default() };
        let payload = Bytes::from(control::encode(c));
        if session.post(d, payload, Bytes::new(), Vec::new()).await.is_err() {
            self.inner.pending().remove(&tag);
            return Err(Status::new(Code::Unavailable, "the engine went away"));
        }
        Ok(Ticket { tag, slot })
    }
}
