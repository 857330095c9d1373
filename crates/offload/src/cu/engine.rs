//! The compute-unit engine: slots, their rings, their workers.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::builtin::{builtins, KeyError, KeyTable};
use super::kernel::{Kernel, KernelError, Output, ParamValue, Params};
use super::region::{DeviceRef, DeviceRegion, RegionError};

/// Sizes and limits of a [`ComputeUnits`] engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CuConfig {
    /// Number of compute-unit slots (1..=256).
    pub slots: usize,
    /// Entries in each slot's descriptor ring (tasks submitted and not yet
    /// fetched by the unit).
    pub ring_entries: usize,
    /// Entries in each slot's notification ring: the most tasks a slot
    /// holds between submit and `poll` (queued + running + completed and
    /// not yet polled).
    pub notification_entries: usize,
    /// Bytes in the device region.
    pub region_capacity: u32,
    /// The largest output any task may produce; a descriptor may ask for
    /// less, never more.
    pub max_output: u32,
    /// The most parameters one descriptor may carry.
    pub max_params: usize,
    /// The most bytes one inline ([`ParamValue::Bytes`]) parameter may hold.
    pub max_inline_param: usize,
    /// The most keys in the key table.
    pub max_keys: usize,
}

impl Default for CuConfig {
    fn default() -> Self {
        CuConfig {
            slots: 4,
            ring_entries: 64,
            notification_entries: 128,
            region_capacity: 64 << 20,
            max_output: 16 << 20,
            max_params: 8,
            max_inline_param: 256,
            max_keys: 256,
        }
    }
}

/// A submitted task's handle: which slot, which submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket {
    slot: u32,
    seq: u64,
}

impl Ticket {
    /// The slot the task was submitted to.
    pub fn slot(&self) -> usize {
        self.slot as usize
    }

    /// The task's submission number on its slot (from 0).
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// A task for a compute unit: its input in the device region, the kernel's
/// parameters, and optionally a tighter output limit. It comes from the
/// application and is checked, never trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskDescriptor {
    /// The input bytes (non-empty, inside one live allocation).
    pub input: DeviceRef,
    /// Parameters by name, as the kernel's [`Kernel::params`] declares them.
    pub params: Vec<(String, ParamValue)>,
    /// Output limit for this task; `None` is the engine's
    /// [`CuConfig::max_output`], and more than that is refused.
    pub max_output: Option<u32>,
}

impl TaskDescriptor {
    /// A descriptor for `input` with no parameters.
    pub fn new(input: DeviceRef) -> Self {
        TaskDescriptor { input, params: Vec::new(), max_output: None }
    }

    /// Adds a parameter.
    pub fn param(mut self, name: &str, value: ParamValue) -> Self {
        self.params.push((name.to_owned(), value));
        self
    }

    /// Adds an integer parameter.
    pub fn param_u64(self, name: &str, value: u64) -> Self {
        self.param(name, ParamValue::U64(value))
    }

    /// Adds an inline bytes parameter.
    pub fn param_bytes(self, name: &str, value: &[u8]) -> Self {
        self.param(name, ParamValue::Bytes(value.to_vec()))
    }

    /// Adds a device-resident bytes parameter.
    pub fn param_ref(self, name: &str, value: DeviceRef) -> Self {
        self.param(name, ParamValue::Device(value))
    }

    /// Sets the output limit.
    pub fn max_output(mut self, limit: u32) -> Self {
        self.max_output = Some(limit);
        self
    }
}

/// A completion, as the unit writes it to the slot's notification ring in
/// host memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The task.
    pub ticket: Ticket,
    /// The kernel the task was submitted to.
    pub kernel: String,
    /// The output (a new allocation in the device region, owned by the
    /// application, which frees it), or why the task failed.
    pub status: Result<DeviceRef, KernelError>,
    /// Bytes the unit fetched from the device region (input and
    /// device-resident parameters); 0 if it never ran.
    pub bytes_in: u64,
    /// Time the unit spent on the task; zero if it never ran.
    pub busy: Duration,
}

/// Counters of one slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotStats {
    /// Tasks accepted by `submit_task`.
    pub submitted: u64,
    /// Submits refused (ring full, invalid descriptor, unavailable, ...).
    pub refused: u64,
    /// Tasks notified with an output.
    pub done: u64,
    /// Tasks notified with an error.
    pub failed: u64,
    /// Bytes fetched from the device region by tasks that ran.
    pub bytes_in: u64,
    /// Output bytes of tasks notified done.
    pub bytes_out: u64,
    /// Time the unit spent running kernels.
    pub busy: Duration,
}

/// Why an application call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CuError {
    /// No such slot.
    NoSuchSlot(usize),
    /// No kernel registered under this name.
    UnknownKernel(String),
    /// A kernel is already registered under this name.
    DuplicateKernel(String),
    /// A kernel's name is empty or longer than 64 bytes.
    BadKernelName(String),
    /// The slot holds no kernel yet.
    NotProgrammed(usize),
    /// The slot is unavailable (its unit vanished).
    Unavailable(usize),
    /// The slot's descriptor ring is full: back-pressure, retry after
    /// the unit drains it.
    RingFull {
        /// The slot.
        slot: usize,
        /// Ring entries.
        capacity: usize,
    },
    /// The slot's notification ring could not take one more completion:
    /// poll some tickets first.
    NotificationRingFull {
        /// The slot.
        slot: usize,
        /// Ring entries.
        capacity: usize,
    },
    /// The descriptor is malformed or names ranges it may not use.
    Invalid(DescriptorError),
    /// A key could not be installed.
    Key(KeyError),
    /// The configuration is unusable.
    Config(String),
    /// A worker thread could not be started.
    Spawn(String),
}

impl fmt::Display for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CuError::NoSuchSlot(s) => write!(f, "no compute-unit slot {s}"),
            CuError::UnknownKernel(n) => write!(f, "no kernel named {n:?}"),
            CuError::DuplicateKernel(n) => write!(f, "a kernel named {n:?} is already registered"),
            CuError::BadKernelName(n) => write!(f, "bad kernel name {n:?}"),
            CuError::NotProgrammed(s) => write!(f, "compute-unit slot {s} is not programmed"),
            CuError::Unavailable(s) => write!(f, "compute-unit slot {s} is unavailable"),
            CuError::RingFull { slot, capacity } => {
                write!(f, "descriptor ring of slot {slot} is full ({capacity} entries)")
            }
            CuError::NotificationRingFull { slot, capacity } => write!(
                f,
                "notification ring of slot {slot} is full ({capacity} entries): poll first"
            ),
            CuError::Invalid(e) => write!(f, "invalid task descriptor: {e}"),
            CuError::Key(e) => write!(f, "{e}"),
            CuError::Config(why) => write!(f, "bad compute-unit configuration: {why}"),
            CuError::Spawn(why) => write!(f, "cannot start a compute-unit worker: {why}"),
        }
    }
}

impl std::error::Error for CuError {}

impl From<DescriptorError> for CuError {
    fn from(e: DescriptorError) -> Self {
        CuError::Invalid(e)
    }
}

impl From<KeyError> for CuError {
    fn from(e: KeyError) -> Self {
        CuError::Key(e)
    }
}

/// What is wrong with a task descriptor (checked at submit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DescriptorError {
    /// The input range is empty.
    EmptyInput,
    /// A range is not inside one live allocation of the device region.
    OutOfRange {
        /// `"input"` or the parameter's name.
        what: String,
        /// Why the region refused it.
        error: RegionError,
    },
    /// More parameters than [`CuConfig::max_params`].
    TooManyParams {
        /// Parameters given.
        given: usize,
        /// The limit.
        max: usize,
    },
    /// A parameter is given twice.
    DuplicateParam(String),
    /// The kernel takes no parameter of this name.
    UnknownParam(String),
    /// A parameter of the wrong kind (integer for bytes or the reverse).
    WrongKind(String),
    /// A required parameter is missing.
    MissingParam(String),
    /// An inline parameter holds more than [`CuConfig::max_inline_param`]
    /// bytes.
    ParamTooLarge {
        /// The parameter.
        name: String,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The descriptor asks for an output limit above the engine's.
    OutputLimitTooLarge {
        /// What it asked for.
        asked: u32,
        /// The engine's limit.
        max: u32,
    },
}

impl fmt::Display for DescriptorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DescriptorError::EmptyInput => write!(f, "empty input range"),
            DescriptorError::OutOfRange { what, error } => write!(f, "{what}: {error}"),
            DescriptorError::TooManyParams { given, max } => {
                write!(f, "{given} parameters, at most {max}")
            }
            DescriptorError::DuplicateParam(n) => write!(f, "parameter {n:?} given twice"),
            DescriptorError::UnknownParam(n) => write!(f, "unknown parameter {n:?}"),
            DescriptorError::WrongKind(n) => write!(f, "parameter {n:?} has the wrong kind"),
            DescriptorError::MissingParam(n) => write!(f, "missing parameter {n:?}"),
            DescriptorError::ParamTooLarge { name, len, max } => {
                write!(f, "parameter {name:?} holds {len} bytes, at most {max} inline")
            }
            DescriptorError::OutputLimitTooLarge { asked, max } => {
                write!(f, "output limit {asked} is above the engine's {max} bytes")
            }
        }
    }
}

impl std::error::Error for DescriptorError {}

/// A descriptor accepted into a ring, bound to the kernel the slot held at
/// submit.
struct Queued {
    ticket: Ticket,
    kernel: Arc<dyn Kernel>,
    desc: TaskDescriptor,
    limit: u32,
}

impl fmt::Debug for Queued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queued")
            .field("ticket", &self.ticket)
            .field("kernel", &self.kernel.name())
            .field("desc", &self.desc)
            .field("limit", &self.limit)
            .finish()
    }
}

#[derive(Debug)]
struct SlotState {
    kernel: Option<Arc<dyn Kernel>>,
    available: bool,
    /// Whether the worker is inside a kernel (also after the unit vanished
    /// under it: `running` is then already cleared).
    executing: bool,
    /// The descriptor ring (engine memory): at most `ring_entries`.
    ring: VecDeque<Queued>,
    /// The task the unit is running (and its kernel's name), unless it
    /// vanished meanwhile.
    running: Option<(Ticket, String)>,
    /// The notification ring (host memory).
    notifications: VecDeque<Notification>,
    next_seq: u64,
    stats: SlotStats,
    shutdown: bool,
}

impl SlotState {
    /// Tasks holding a notification-ring entry: queued, running (not
    /// vanished) and completed but not yet polled.
    fn outstanding(&self) -> usize {
        self.ring.len() + usize::from(self.running.is_some()) + self.notifications.len()
    }

    fn is_pending(&self, t: Ticket) -> bool {
        self.running.as_ref().is_some_and(|(r, _)| *r == t)
            || self.ring.iter().any(|q| q.ticket == t)
    }

    fn take(&mut self, t: Ticket) -> Option<Notification> {
        let pos = self.notifications.iter().position(|n| n.ticket == t)?;
        self.notifications.remove(pos)
    }

    fn notify(&mut self, n: Notification) {
        match &n.status {
            Ok(r) => {
                self.stats.done += 1;
                self.stats.bytes_out += u64::from(r.len);
            }
            Err(_) => self.stats.failed += 1,
        }
        self.notifications.push_back(n);
    }
}

#[derive(Debug)]
struct Slot {
    state: Mutex<SlotState>,
    /// The worker parks here while the ring is empty.
    work: Condvar,
    /// Waiters for notifications park here.
    done: Condvar,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, SlotState> {
        // Kernels run outside this lock, and under it nothing panics;
        // recover from a poison rather than spread it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct Shared {
    config: CuConfig,
    slots: Vec<Slot>,
    region: DeviceRegion,
    keys: Arc<KeyTable>,
    kernels: RwLock<BTreeMap<String, Arc<dyn Kernel>>>,
    /// Told of every notification as it is written ([`ComputeUnits::on_notify`]).
    listener: RwLock<Option<Listener>>,
}

/// What [`ComputeUnits::on_notify`] installs.
type Listener = Arc<dyn Fn(Ticket) + Send + Sync>;

impl Shared {
    /// Tells the listener, if any, that `tickets` have their notifications
    /// (never called under a slot's lock: the listener may poll).
    fn announce(&self, tickets: impl IntoIterator<Item = Ticket>) {
        let l = self.listener.read().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(l) = l {
            for t in tickets {
                l(t);
            }
        }
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kernels = self.kernels.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Shared")
            .field("config", &self.config)
            .field("slots", &self.slots)
            .field("region", &self.region)
            .field("keys", &self.keys)
            .field("kernels", &kernels.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The compute-unit engine: a fixed set of slots, each programmed with a
/// kernel and fed through its descriptor ring, each answering on its
/// notification ring, plus the device region and key table they share.
///
/// Dropping it stops the workers (a worker inside a kernel is left to end
/// when the kernel returns); tasks still queued then are dropped
/// unanswered, since nobody can poll any more.
#[derive(Debug)]
pub struct ComputeUnits {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

const MAX_SLOTS: usize = 256;
const MAX_KERNEL_NAME: usize = 64;

impl ComputeUnits {
    /// Starts an engine: one parked worker thread per slot, the built-in
    /// kernels registered, all slots unprogrammed and available.
    pub fn new(config: CuConfig) -> Result<Self, CuError> {
        if config.slots == 0 || config.slots > MAX_SLOTS {
            return Err(CuError::Config(format!("{} slots, need 1..={MAX_SLOTS}", config.slots)));
        }
        if config.ring_entries == 0 || config.notification_entries == 0 {
            return Err(CuError::Config("rings need at least one entry".to_owned()));
        }
        let keys = Arc::new(KeyTable::new(config.max_keys));
        let mut kernels = BTreeMap::new();
        for k in builtins(&keys) {
            kernels.insert(k.name().to_owned(), k);
        }
        let slots = (0..config.slots)
            .map(|_| Slot {
                state: Mutex::new(SlotState {
                    kernel: None,
                    available: true,
                    executing: false,
                    ring: VecDeque::with_capacity(config.ring_entries),
                    running: None,
                    notifications: VecDeque::with_capacity(config.notification_entries),
                    next_seq: 0,
                    stats: SlotStats::default(),
                    shutdown: false,
                }),
                work: Condvar::new(),
                done: Condvar::new(),
            })
            .collect();
        let shared = Arc::new(Shared {
            region: DeviceRegion::new(config.region_capacity),
            config,
            slots,
            keys,
            kernels: RwLock::new(kernels),
            listener: RwLock::new(None),
        });
        let mut cu = ComputeUnits { shared, workers: Vec::new() };
        for index in 0..cu.shared.slots.len() {
            let shared = Arc::clone(&cu.shared);
            let handle = thread::Builder::new()
                .name(format!("cu-slot-{index}"))
                .spawn(move || worker(&shared, index))
                .map_err(|e| CuError::Spawn(e.to_string()))?;
            // On error, `cu` is dropped here and stops the workers so far.
            cu.workers.push(handle);
        }
        Ok(cu)
    }

    /// The configuration.
    pub fn config(&self) -> &CuConfig {
        &self.shared.config
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.shared.slots.len()
    }

    /// The device region, as the host's DMA engine sees it: stage inputs
    /// with [`DeviceRegion::alloc_write`], fetch outputs with
    /// [`DeviceRegion::read`], free what you own.
    pub fn region(&self) -> &DeviceRegion {
        &self.shared.region
    }

    /// Registers a kernel under its [`Kernel::name`], for any slot to be
    /// programmed with. Names are unique (built-ins included).
    pub fn register(&self, kernel: Arc<dyn Kernel>) -> Result<(), CuError> {
        let name = kernel.name().to_owned();
        if name.is_empty() || name.len() > MAX_KERNEL_NAME {
            return Err(CuError::BadKernelName(name));
        }
        let mut kernels = self.shared.kernels.write().unwrap_or_else(PoisonError::into_inner);
        if kernels.contains_key(&name) {
            return Err(CuError::DuplicateKernel(name));
        }
        kernels.insert(name, kernel);
        Ok(())
    }

    /// Names of the registered kernels, sorted.
    pub fn kernels(&self) -> Vec<String> {
        self.shared.kernels.read().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect()
    }

    /// Installs (or replaces) the AEAD key `key_id` (32 bytes).
    pub fn set_key(&self, key_id: u64, key: &[u8]) -> Result<(), CuError> {
        Ok(self.shared.keys.set(key_id, key)?)
    }

    /// Removes the key `key_id`; whether it was installed. Tasks naming it
    /// afterwards fail with [`KernelError::UnknownKey`].
    pub fn remove_key(&self, key_id: u64) -> bool {
        self.shared.keys.remove(key_id)
    }

    /// The key table (shared with the AEAD kernels; a user kernel may hold
    /// it too).
    pub fn keys(&self) -> &Arc<KeyTable> {
        &self.shared.keys
    }

    fn slot(&self, slot: usize) -> Result<&Slot, CuError> {
        self.shared.slots.get(slot).ok_or(CuError::NoSuchSlot(slot))
    }

    /// Loads the kernel `kernel_name` into `slot`. Reprogramming is allowed
    /// at any time: tasks already in the ring keep the kernel they were
    /// submitted to; later submits run the new one.
    pub fn program(&self, slot: usize, kernel_name: &str) -> Result<(), CuError> {
        let s = self.slot(slot)?;
        let kernel = self
            .shared
            .kernels
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(kernel_name)
            .cloned()
            .ok_or_else(|| CuError::UnknownKernel(kernel_name.to_owned()))?;
        s.lock().kernel = Some(kernel);
        Ok(())
    }

    /// The name of the kernel `slot` holds; `None` if unprogrammed or no
    /// such slot.
    pub fn get_type(&self, slot: usize) -> Option<String> {
        let s = self.slot(slot).ok()?;
        let st = s.lock();
        st.kernel.as_ref().map(|k| k.name().to_owned())
    }

    /// Whether `slot` exists and is available.
    pub fn is_available(&self, slot: usize) -> bool {
        self.slot(slot).is_ok_and(|s| s.lock().available)
    }

    /// Marks `slot` available or not. Making it unavailable models a unit
    /// that vanishes: every task in its descriptor ring and the one it is
    /// running get a [`KernelError::Unavailable`] notification at once (the
    /// running kernel's result, when it returns, is discarded), and submits
    /// fail with [`CuError::Unavailable`] until it is made available again.
    /// The slot keeps its kernel.
    pub fn set_available(&self, slot: usize, available: bool) -> Result<(), CuError> {
        let s = self.slot(slot)?;
        let mut st = s.lock();
        st.available = available;
        let mut told = Vec::new();
        if !available {
            let err = Err(KernelError::Unavailable { slot });
            if let Some((ticket, kernel)) = st.running.take() {
                told.push(ticket);
                st.notify(Notification {
                    ticket,
                    kernel,
                    status: err.clone(),
                    bytes_in: 0,
                    busy: Duration::ZERO,
                });
            }
            while let Some(q) = st.ring.pop_front() {
                told.push(q.ticket);
                st.notify(Notification {
                    ticket: q.ticket,
                    kernel: q.kernel.name().to_owned(),
                    status: err.clone(),
                    bytes_in: 0,
                    busy: Duration::ZERO,
                });
            }
            s.done.notify_all();
        }
        drop(st);
        self.shared.announce(told);
        Ok(())
    }

    /// Calls `f` with each ticket as soon as its notification is written
    /// (a finished task, or one failed by its unit vanishing), on the
    /// unit's thread or [`Self::set_available`]'s caller and never under a
    /// slot's lock, so `f` may [`Self::poll`] it: how a host learns of
    /// completions without a thread parked per ticket. Replaces an earlier
    /// listener. Keep `f` short: the unit waits for it.
    pub fn on_notify(&self, f: impl Fn(Ticket) + Send + Sync + 'static) {
        *self.shared.listener.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(f));
    }

    /// Puts a task in `slot`'s descriptor ring. Refused (nothing queued)
    /// if the slot is missing, unprogrammed or unavailable, the descriptor
    /// is invalid, the descriptor ring is full, or the notification ring
    /// could not take its completion.
    pub fn submit_task(&self, slot: usize, desc: TaskDescriptor) -> Result<Ticket, CuError> {
        let s = self.slot(slot)?;
        let mut st = s.lock();
        let r = self.admit(slot, &st, &desc);
        let kernel = match r {
            Ok(k) => k,
            Err(e) => {
                st.stats.refused += 1;
                return Err(e);
            }
        };
        let limit = desc.max_output.unwrap_or(self.shared.config.max_output);
        let ticket = Ticket { slot: u32::try_from(slot).unwrap_or(u32::MAX), seq: st.next_seq };
        st.next_seq += 1;
        st.stats.submitted += 1;
        st.ring.push_back(Queued { ticket, kernel, desc, limit });
        s.work.notify_one();
        Ok(ticket)
    }

    fn admit(
        &self,
        slot: usize,
        st: &SlotState,
        desc: &TaskDescriptor,
    ) -> Result<Arc<dyn Kernel>, CuError> {
        let cfg = &self.shared.config;
        if !st.available {
            return Err(CuError::Unavailable(slot));
        }
        let kernel = st.kernel.clone().ok_or(CuError::NotProgrammed(slot))?;
        self.check_descriptor(kernel.as_ref(), desc)?;
        if st.ring.len() >= cfg.ring_entries {
            return Err(CuError::RingFull { slot, capacity: cfg.ring_entries });
        }
        if st.outstanding() >= cfg.notification_entries {
            return Err(CuError::NotificationRingFull { slot, capacity: cfg.notification_entries });
        }
        Ok(kernel)
    }

    fn check_descriptor(
        &self,
        kernel: &dyn Kernel,
        desc: &TaskDescriptor,
    ) -> Result<(), DescriptorError> {
        let cfg = &self.shared.config;
        let region = &self.shared.region;
        if desc.input.is_empty() {
            return Err(DescriptorError::EmptyInput);
        }
        if let Err(error) = region.check(desc.input) {
            return Err(DescriptorError::OutOfRange { what: "input".to_owned(), error });
        }
        if let Some(asked) = desc.max_output {
            if asked > cfg.max_output {
                return Err(DescriptorError::OutputLimitTooLarge { asked, max: cfg.max_output });
            }
        }
        if desc.params.len() > cfg.max_params {
            return Err(DescriptorError::TooManyParams {
                given: desc.params.len(),
                max: cfg.max_params,
            });
        }
        let specs = kernel.params();
        for (i, (name, value)) in desc.params.iter().enumerate() {
            if desc.params.iter().take(i).any(|(n, _)| n == name) {
                return Err(DescriptorError::DuplicateParam(name.clone()));
            }
            let spec = specs
                .iter()
                .find(|s| s.name == name)
                .ok_or_else(|| DescriptorError::UnknownParam(name.clone()))?;
            if spec.kind != value.kind() {
                return Err(DescriptorError::WrongKind(name.clone()));
            }
            match value {
                ParamValue::U64(_) => {}
                ParamValue::Bytes(b) => {
                    if b.len() > cfg.max_inline_param {
                        return Err(DescriptorError::ParamTooLarge {
                            name: name.clone(),
                            len: b.len(),
                            max: cfg.max_inline_param,
                        });
                    }
                }
                ParamValue::Device(r) => {
                    if let Err(error) = region.check(*r) {
                        return Err(DescriptorError::OutOfRange { what: name.clone(), error });
                    }
                }
            }
        }
        if let Some(missing) =
            specs.iter().find(|s| s.required && !desc.params.iter().any(|(n, _)| n == s.name))
        {
            return Err(DescriptorError::MissingParam(missing.name.to_owned()));
        }
        Ok(())
    }

    /// Takes `ticket`'s notification if the unit has written it (never
    /// blocks). A notification is delivered once: polling again yields
    /// `None`.
    pub fn poll(&self, ticket: Ticket) -> Option<Notification> {
        let s = self.slot(ticket.slot()).ok()?;
        let n = s.lock().take(ticket);
        n
    }

    /// Takes the oldest notification of `slot`, whatever its ticket (never
    /// blocks).
    pub fn poll_slot(&self, slot: usize) -> Option<Notification> {
        let s = self.slot(slot).ok()?;
        let n = s.lock().notifications.pop_front();
        n
    }

    /// Waits (parked, not spinning) up to `timeout` for `ticket`'s
    /// notification and takes it. Returns `None` at the timeout, or at once
    /// if the ticket is unknown or its notification was already taken.
    pub fn wait(&self, ticket: Ticket, timeout: Duration) -> Option<Notification> {
        let s = self.slot(ticket.slot()).ok()?;
        let deadline = Instant::now().checked_add(timeout);
        let mut st = s.lock();
        loop {
            if let Some(n) = st.take(ticket) {
                return Some(n);
            }
            if !st.is_pending(ticket) {
                return None;
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::MAX,
            };
            if left.is_zero() {
                return None;
            }
            st = s.done.wait_timeout(st, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Tasks of `slot` between submit and poll (queued, running, or
    /// notified and not yet polled).
    pub fn outstanding(&self, slot: usize) -> usize {
        self.slot(slot).map_or(0, |s| s.lock().outstanding())
    }

    /// The counters of `slot`; `None` if no such slot.
    pub fn stats(&self, slot: usize) -> Option<SlotStats> {
        Some(self.slot(slot).ok()?.lock().stats)
    }
}

impl Drop for ComputeUnits {
    fn drop(&mut self) {
        let mut busy = Vec::with_capacity(self.shared.slots.len());
        for s in &self.shared.slots {
            let mut st = s.lock();
            st.shutdown = true;
            busy.push(st.executing);
            drop(st);
            s.work.notify_all();
        }
        for (h, busy) in self.workers.drain(..).zip(busy) {
            // A worker inside a kernel is left to finish on its own (it
            // sees the shutdown when the kernel returns and ends): a user
            // kernel that never returns must not hang whoever drops the
            // units — an application detaching, the engine stopping.
            if busy {
                continue;
            }
            // A worker only ends by returning; a join error would mean a
            // panic outside the kernel guard, with nothing left to clean.
            let _ = h.join();
        }
    }
}

/// One slot's worker: the unit fetching descriptors from its ring, running
/// the kernel, allocating the output and writing the notification.
fn worker(shared: &Shared, index: usize) {
    let Some(slot) = shared.slots.get(index) else {
        return;
    };
    loop {
        let task = {
            let mut st = slot.lock();
            loop {
                if st.shutdown {
                    return;
                }
                if let Some(q) = st.ring.pop_front() {
                    st.running = Some((q.ticket, q.kernel.name().to_owned()));
                    st.executing = true;
                    break q;
                }
                st = slot.work.wait(st).unwrap_or_else(PoisonError::into_inner);
            }
        };
        let started = Instant::now();
        let (result, bytes_in) = execute(shared, &task);
        let busy = started.elapsed();

        let mut st = slot.lock();
        st.executing = false;
        st.stats.busy += busy;
        if st.running.as_ref().is_none_or(|(t, _)| *t != task.ticket) {
            // The unit vanished while running: the task was already
            // notified; its result is dropped (nothing was allocated).
            continue;
        }
        st.running = None;
        st.stats.bytes_in += bytes_in;
        let status = result.and_then(|bytes| {
            shared.region.alloc_write(&bytes).map_err(|_| KernelError::RegionFull {
                needed: u32::try_from(bytes.len()).unwrap_or(u32::MAX),
            })
        });
        st.notify(Notification {
            ticket: task.ticket,
            kernel: task.kernel.name().to_owned(),
            status,
            bytes_in,
            busy,
        });
        drop(st);
        slot.done.notify_all();
        shared.announce([task.ticket]);
    }
}

/// Fetches the task's input and parameters from the region and runs the
/// kernel; the output bytes (bounded by the task's limit) and the bytes
/// fetched.
fn execute(shared: &Shared, task: &Queued) -> (Result<Vec<u8>, KernelError>, u64) {
    let region = &shared.region;
    let mut fetched = 0u64;
    // Re-check every range: the application may have freed it since submit.
    let input = match region.read(task.desc.input) {
        Ok(b) => b,
        Err(_) => {
            return (
                Err(KernelError::InputOutOfRange {
                    what: "input".to_owned(),
                    range: task.desc.input,
                }),
                0,
            )
        }
    };
    fetched += input.len() as u64;
    let mut params = Params::new();
    for (name, value) in &task.desc.params {
        match value {
            ParamValue::U64(v) => {
                params.set_u64(name, *v);
            }
            ParamValue::Bytes(b) => {
                params.set_bytes(name, b.clone());
            }
            ParamValue::Device(r) => match region.read(*r) {
                Ok(b) => {
                    fetched += b.len() as u64;
                    params.set_bytes(name, b);
                }
                Err(_) => {
                    return (
                        Err(KernelError::InputOutOfRange { what: name.clone(), range: *r }),
                        fetched,
                    )
                }
            },
        }
    }
    let mut out = Output::with_limit(task.limit as usize);
    let ran = panic::catch_unwind(AssertUnwindSafe(|| task.kernel.run(&input, &params, &mut out)));
    let result = match ran {
        Ok(Ok(())) if out.len() > task.limit as usize => {
            Err(KernelError::OutputTooLarge { limit: task.limit })
        }
        Ok(Ok(())) => Ok(out.into_vec()),
        Ok(Err(e)) => Err(e),
        Err(payload) => Err(KernelError::Panicked(panic_message(payload.as_ref()))),
    };
    (result, fetched)
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
