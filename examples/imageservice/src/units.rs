//! The application's side of the compute units: which slot runs which
//! kernel, submitting a task and awaiting its notification without
//! blocking the handler's thread, and device ranges freed when dropped.
//!
//! A handler submits a task and awaits a oneshot channel. One
//! *notification thread* per slot (`cu-notify-N`) waits, parked, on the
//! slot's tickets in submission order (a slot runs its ring in order, so
//! the oldest ticket is always the next to complete) and hands each
//! notification to its handler. Its CPU time is counted as the
//! application's: it stands for the host polling the notification ring.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use protoplane_grpc::{Code, Status};
use protoplane_offload::cu::{
    ComputeUnits, CuConfig, CuError, DeviceRef, KernelError, Notification, TaskDescriptor, Ticket,
};
use tokio::sync::oneshot;

use crate::crypto::{reply_key, request_key, USERS};

/// A stage of the chain, and the kernel its slots hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// `aes256gcm.open`: the request's image → plaintext.
    Open,
    /// `deflate.compress`: plaintext → raw deflate.
    Compress,
    /// `aes256gcm.seal`: raw deflate → the reply's ciphertext.
    Seal,
}

impl Stage {
    fn kernel(self) -> &'static str {
        match self {
            Stage::Open => "aes256gcm.open",
            Stage::Compress => "deflate.compress",
            Stage::Seal => "aes256gcm.seal",
        }
    }

    fn index(self) -> usize {
        match self {
            Stage::Open => 0,
            Stage::Compress => 1,
            Stage::Seal => 2,
        }
    }
}

/// The key id of user number `i`'s request key in the engine's key table.
pub fn request_key_id(i: usize) -> u64 {
    2 * i as u64 + 1
}

/// The key id of user number `i`'s reply key.
pub fn reply_key_id(i: usize) -> u64 {
    2 * i as u64 + 2
}

type Waiter = (Ticket, oneshot::Sender<Notification>);

#[derive(Default)]
struct Queue {
    waiters: Mutex<VecDeque<Waiter>>,
    ready: Condvar,
    stop: AtomicBool,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Waiter>> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Compute units programmed for the image chain, with their notification
/// threads.
pub struct Units {
    cu: Arc<ComputeUnits>,
    /// Slots of each stage (by [`Stage::index`]).
    slots: [Vec<usize>; 3],
    next: [AtomicUsize; 3],
    queues: Vec<Arc<Queue>>,
}

impl std::fmt::Debug for Units {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Units").field("slots", &self.slots).finish_non_exhaustive()
    }
}

/// A device range the holder owns: freed when dropped.
#[derive(Debug)]
pub struct DeviceGuard {
    cu: Arc<ComputeUnits>,
    range: DeviceRef,
}

impl DeviceGuard {
    /// Takes ownership of `range` (an allocation of `cu`'s region).
    pub fn new(cu: Arc<ComputeUnits>, range: DeviceRef) -> DeviceGuard {
        DeviceGuard { cu, range }
    }

    /// The range.
    pub fn range(&self) -> DeviceRef {
        self.range
    }
}

impl Drop for DeviceGuard {
    fn drop(&mut self) {
        let _ = self.cu.region().free(self.range);
    }
}

/// The status a failed submission maps to.
fn cu_status(e: &CuError) -> Status {
    match e {
        CuError::Unavailable(slot) => {
            Status::new(Code::Unavailable, format!("compute unit {slot} is unavailable"))
        }
        CuError::RingFull { .. } | CuError::NotificationRingFull { .. } => {
            Status::new(Code::ResourceExhausted, format!("compute units busy: {e}"))
        }
        _ => Status::new(Code::Internal, format!("compute unit: {e}")),
    }
}

/// The status a failed task maps to.
pub fn kernel_status(stage: Stage, e: &KernelError) -> Status {
    match e {
        KernelError::AuthFailed => Status::new(
            Code::InvalidArgument,
            "the image does not authenticate (tampered ciphertext, or wrong key or nonce)",
        ),
        KernelError::Unavailable { slot } => Status::new(
            Code::Unavailable,
            format!("compute unit {slot} vanished while running {}", stage.kernel()),
        ),
        KernelError::OutputTooLarge { .. } | KernelError::RegionFull { .. } => {
            Status::new(Code::ResourceExhausted, format!("{}: {e}", stage.kernel()))
        }
        KernelError::BadParam { .. } => {
            Status::new(Code::InvalidArgument, format!("{}: {e}", stage.kernel()))
        }
        _ => Status::new(Code::Internal, format!("{}: {e}", stage.kernel())),
    }
}

/// Retries of a submission refused for back-pressure (ring full), 250 µs
/// apart: about a second.
const BUSY_RETRIES: u32 = 4000;
const BUSY_WAIT: Duration = Duration::from_micros(250);

impl Units {
    /// Starts an engine with one `aes256gcm.open` slot, `compress` slots of
    /// `deflate.compress` and one `aes256gcm.seal` slot, the users' keys
    /// installed, and one notification thread per slot.
    pub fn start(compress: usize, region_capacity: u32, max_output: u32) -> Result<Units, String> {
        let compress = compress.max(1);
        let total = compress + 2;
        let cu = ComputeUnits::new(CuConfig {
            slots: total,
            ring_entries: 256,
            notification_entries: 512,
            region_capacity,
            max_output,
            ..CuConfig::default()
        })
        .map_err(|e| format!("compute units: {e}"))?;
        let slots = [vec![0], (1..=compress).collect::<Vec<_>>(), vec![compress + 1]];
        for (stage, s) in [Stage::Open, Stage::Compress, Stage::Seal].iter().zip(&slots) {
            for &slot in s {
                cu.program(slot, stage.kernel()).map_err(|e| format!("program {slot}: {e}"))?;
            }
        }
        for (i, u) in USERS.iter().enumerate() {
            cu.set_key(request_key_id(i), &request_key(u.name)).map_err(|e| e.to_string())?;
            cu.set_key(reply_key_id(i), &reply_key(u.name)).map_err(|e| e.to_string())?;
        }
        let cu = Arc::new(cu);
        let mut queues = Vec::new();
        for slot in 0..total {
            let q = Arc::new(Queue::default());
            let (q2, cu2) = (Arc::clone(&q), Arc::clone(&cu));
            std::thread::Builder::new()
                .name(format!("cu-notify-{slot}"))
                .spawn(move || deliver(&cu2, &q2))
                .map_err(|e| format!("notification thread: {e}"))?;
            queues.push(q);
        }
        Ok(Units { cu, slots, next: Default::default(), queues })
    }

    /// The engine.
    pub fn compute_units(&self) -> &Arc<ComputeUnits> {
        &self.cu
    }

    /// Whether every stage of the chain has an available slot.
    pub fn chain_available(&self) -> bool {
        self.slots.iter().all(|s| s.iter().any(|&slot| self.cu.is_available(slot)))
    }

    /// Makes every unit vanish, or come back.
    pub fn set_available(&self, available: bool) -> Result<(), String> {
        for slot in 0..self.cu.slots() {
            self.cu.set_available(slot, available).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Copies `data` into the device region (the host's DMA to the device).
    pub fn stage(&self, data: &[u8]) -> Result<DeviceGuard, Status> {
        let r = self
            .cu
            .region()
            .alloc_write(data)
            .map_err(|e| Status::new(Code::ResourceExhausted, format!("device region: {e}")))?;
        Ok(DeviceGuard::new(Arc::clone(&self.cu), r))
    }

    /// Copies a device range back to the host (DMA from the device).
    pub fn fetch(&self, r: DeviceRef) -> Result<Vec<u8>, Status> {
        self.cu
            .region()
            .read(r)
            .map_err(|e| Status::new(Code::Internal, format!("device region: {e}")))
    }

    /// Runs one task of `stage` on one of its slots and awaits its output
    /// range. Back-pressure (a full ring) is waited out for about a
    /// second; a unit that is unavailable fails at once (UNAVAILABLE).
    pub async fn run(&self, stage: Stage, desc: TaskDescriptor) -> Result<DeviceGuard, Status> {
        let slots = &self.slots[stage.index()];
        let mut busy = 0;
        loop {
            let first = self.next[stage.index()].fetch_add(1, Ordering::Relaxed);
            let mut last = None;
            let mut rx = None;
            for k in 0..slots.len() {
                let slot = slots[(first + k) % slots.len()];
                let q = &self.queues[slot];
                // Submit and enqueue under the queue's lock: the waiters
                // stay in the order the slot runs its tasks.
                let mut waiters = q.lock();
                match self.cu.submit_task(slot, desc.clone()) {
                    Ok(t) => {
                        let (tx, r) = oneshot::channel();
                        waiters.push_back((t, tx));
                        q.ready.notify_one();
                        rx = Some(r);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            if let Some(rx) = rx {
                let n = rx.await.map_err(|_| {
                    Status::new(Code::Unavailable, "compute-unit notification lost")
                })?;
                return match n.status {
                    Ok(r) => Ok(DeviceGuard::new(Arc::clone(&self.cu), r)),
                    Err(e) => Err(kernel_status(stage, &e)),
                };
            }
            match last {
                Some(CuError::RingFull { .. } | CuError::NotificationRingFull { .. })
                    if busy < BUSY_RETRIES =>
                {
                    busy += 1;
                    tokio::time::sleep(BUSY_WAIT).await;
                }
                Some(e) => return Err(cu_status(&e)),
                None => return Err(Status::new(Code::Internal, "no slot for the stage")),
            }
        }
    }
}

impl Drop for Units {
    fn drop(&mut self) {
        for q in &self.queues {
            q.stop.store(true, Ordering::Release);
            let _guard = q.lock();
            q.ready.notify_all();
        }
    }
}

/// A notification thread: waits for each ticket of its slot in order and
/// hands the notification over; frees the output of a task whose handler
/// is gone.
fn deliver(cu: &ComputeUnits, q: &Queue) {
    loop {
        let next = {
            let mut waiters = q.lock();
            loop {
                if let Some(w) = waiters.pop_front() {
                    break Some(w);
                }
                if q.stop.load(Ordering::Acquire) {
                    break None;
                }
                waiters = q.ready.wait(waiters).unwrap_or_else(PoisonError::into_inner);
            }
        };
        let Some((ticket, tx)) = next else { return };
        // A task always gets its notification (the engine guarantees it,
        // even when the unit vanishes); the bound only keeps a wedged
        // kernel from holding this thread for ever.
        let Some(n) = cu.wait(ticket, Duration::from_secs(60)) else { continue };
        if let Err(n) = tx.send(n) {
            if let Ok(r) = n.status {
                let _ = cu.region().free(r);
            }
        }
    }
}
