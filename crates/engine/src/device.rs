//! The offload engine in split mode: each attached application's device
//! region and compute units (RPCAcc), behind the same rings as its calls.
//!
//! # Memory: whose, and for how long
//!
//! An attachment gets its own [`ComputeUnits`] and with them its own
//! device region, which the application never maps. Its handles (offsets
//! into that region) are therefore only ever resolved against its own
//! memory: a forged handle reads or feeds a kernel bytes of the same
//! application, never another's.
//!
//! Device memory belongs to a call:
//! - a request's device-placed fields land in one allocation the call
//!   owns (sized for the worst case before the decode, its tail given
//!   back after);
//! - a task's output belongs to the call that owns its input;
//! - everything a call owns is freed when the call ends, after its
//!   response has been encoded.
//!
//! So a chain (open → compress → seal) needs no frees from the
//! application, an application that crashes leaks nothing, and a handle
//! that outlives its call is refused at submit rather than trusted.
//!
//! # Requests: placement-aware decode and one-shot commit
//!
//! A method whose request type has device-placed fields (by `.proto`
//! option, the `[offload] placements` list, or at run time through
//! [`Device::placements`]) is decoded with placement. The decode writes
//! host-placed fields into a private temp buffer — the block, owned mode:
//! its strings copied, so it references nothing else — and device-placed
//! ones into the call's allocation; the block then goes to the
//! application's ring in one copy. The wire bytes never enter the shared
//! region: the image a client sent reaches device memory, not the host's.
//!
//! # Responses
//!
//! A response of an attachment with a device is encoded by the engine,
//! with device handles resolved in the region ([`Device::encode`]) —
//! RPCAcc's co-serialization: the application laid the block out, the
//! engine writes varints, tags and lengths and pulls the device-placed
//! bytes.
//!
//! # Compute units over the rings
//!
//! The application's `program` / `get_type` / `submit_task` travel as
//! TASK descriptors on its response ring (the control message in a chunk
//! of its half, [`protoplane_offload::cu::control`]); the engine answers
//! each with one NOTIFY descriptor on the request ring: at once for
//! control operations and refused submits, when the unit is done for
//! accepted ones. Each slot's descriptor ring is the engine's
//! ([`ComputeUnits`]); the notification that reaches the application
//! crosses in the shared region, like a request.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use protoplane_grpc::{Code, Status};
use protoplane_offload::cu::control::{self, Control};
use protoplane_offload::cu::{
    ComputeUnits, CuConfig, CuError, DeviceRef, Kernel, KernelError, ParamValue, Ticket,
};
use protoplane_schema::{Kind, Placement, PlacementTable, TableSet};
use protoplane_wire::{Block, DecodeOptions, Decoder, EncodeOptions, Encoder, Source};

/// What the engine is told about device placement and compute units.
#[derive(Clone, Default)]
pub struct DeviceOptions {
    /// Compute-unit slots per attachment; 0 with no placements: no device.
    pub units: usize,
    /// Device region per attachment, in MiB (0: 64).
    pub region_mb: u32,
    /// Fields placed on the device beside the `.proto` options, in the
    /// placement syntax (`pkg.Msg.field=device`).
    pub placements: Vec<String>,
    /// Kernels of the embedding program, registered in every attachment's
    /// units beside the built-in ones.
    pub kernels: Vec<Arc<dyn Kernel>>,
}

impl std::fmt::Debug for DeviceOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceOptions")
            .field("units", &self.units)
            .field("region_mb", &self.region_mb)
            .field("placements", &self.placements)
            .field("kernels", &self.kernels.iter().map(|k| k.name()).collect::<Vec<_>>())
            .finish()
    }
}

impl DeviceOptions {
    /// Whether attachments get a device at all.
    pub fn enabled(&self, any_placed: bool) -> bool {
        self.units > 0 || !self.placements.is_empty() || any_placed
    }

    fn cu_config(&self) -> CuConfig {
        let mb = if self.region_mb == 0 { 64 } else { self.region_mb.min(4095) };
        let region_capacity = mb << 20;
        CuConfig {
            slots: self.units.clamp(1, 256),
            region_capacity,
            max_output: CuConfig::default().max_output.min(region_capacity),
            ..CuConfig::default()
        }
    }
}

/// Counters of one attachment's device.
#[derive(Debug, Default)]
pub struct DeviceStats {
    /// Requests decoded with placement (one-shot commit).
    pub placed_requests: AtomicU64,
    /// Bytes of device-placed fields that went to device memory.
    pub device_bytes_in: AtomicU64,
    /// Bytes of host-placed blocks committed to the shared region.
    pub committed_bytes: AtomicU64,
    /// Responses encoded in the engine with device handles resolved.
    pub encoded_responses: AtomicU64,
    /// Control messages taken, and those refused.
    pub controls: AtomicU64,
    /// Control messages refused (bad bytes, a foreign handle, a busy unit).
    pub refused: AtomicU64,
}

/// Device memory by owner.
#[derive(Default)]
struct Owners {
    /// The allocations each open call owns.
    by_call: HashMap<u64, Vec<DeviceRef>>,
    /// Every owned allocation: offset → (length, call).
    by_offset: BTreeMap<u32, (u32, u64)>,
}

impl Owners {
    /// The call owning the allocation `r` lies in (`None`: nobody's).
    fn owner(&self, r: DeviceRef) -> Option<u64> {
        let (&off, &(len, call)) = self.by_offset.range(..=r.offset).next_back()?;
        (r.end() <= u64::from(off) + u64::from(len)).then_some(call)
    }

    fn adopt(&mut self, call: u64, r: DeviceRef) {
        if r.is_empty() {
            return;
        }
        self.by_call.entry(call).or_default().push(r);
        self.by_offset.insert(r.offset, (r.len, call));
    }
}

/// One attachment's device: its region, its units, who owns what.
pub struct Device {
    units: Arc<ComputeUnits>,
    /// The engine's placement tables, one per schema (shared by every
    /// attachment: placement is the method's, not the caller's).
    placements: Vec<Arc<PlacementTable>>,
    owners: Mutex<Owners>,
    /// Tasks on a unit, and the call their output will belong to.
    pending: Mutex<HashMap<Ticket, Running>>,
    /// Counters.
    pub stats: DeviceStats,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("units", &self.units.slots()).finish_non_exhaustive()
    }
}

/// The answer to one control message: what a NOTIFY descriptor carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// A gRPC status code (`Ok`: done).
    pub code: Code,
    /// The output range (submit), else empty.
    pub output: DeviceRef,
    /// The kernel's name (get_type, a finished task) or why it failed.
    pub text: String,
}

impl Answer {
    fn ok(text: String) -> Answer {
        Answer { code: Code::Ok, output: DeviceRef::EMPTY, text }
    }

    fn fail(code: Code, text: String) -> Answer {
        Answer { code, output: DeviceRef::EMPTY, text }
    }
}

/// A task on a unit: the call its output will belong to, and where its
/// answer goes (the application's tag and the slot).
#[derive(Debug, Clone, Copy)]
struct Running {
    call: u64,
    tag: u64,
    slot: u32,
}

/// What a control message turned into.
#[derive(Debug)]
pub enum Taken {
    /// Answered now.
    Now(Answer),
    /// A task on a unit: its answer comes from [`Device::done`] when the
    /// unit notifies (see [`ComputeUnits::on_notify`]).
    Running(Ticket),
}

impl Device {
    /// A device with `opts`' units and region, moving fields in
    /// `placements` when the application asks (PLACE control messages).
    pub fn new(
        opts: &DeviceOptions,
        placements: Vec<Arc<PlacementTable>>,
    ) -> Result<Device, crate::Error> {
        let refused = |e: protoplane_offload::cu::CuError| crate::Error::Offload(e.to_string());
        let units = ComputeUnits::new(opts.cu_config()).map_err(refused)?;
        for k in &opts.kernels {
            units.register(k.clone()).map_err(refused)?;
        }
        Ok(Device {
            units: Arc::new(units),
            placements,
            owners: Mutex::default(),
            pending: Mutex::default(),
            stats: DeviceStats::default(),
        })
    }

    fn owners(&self) -> MutexGuard<'_, Owners> {
        self.owners.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The compute units (the engine's side: statistics, availability).
    pub fn units(&self) -> &Arc<ComputeUnits> {
        &self.units
    }

    /// Bytes of device memory open calls hold.
    pub fn held(&self) -> u64 {
        self.owners().by_offset.values().map(|&(len, _)| u64::from(len)).sum()
    }

    /// Decodes request `wire` of type `input` with placement for `call`:
    /// the host-placed block (owned, self-contained) for the ring, the
    /// device-placed values in an allocation the call owns. A request the
    /// region has no room for is RESOURCE_EXHAUSTED; bytes that do not
    /// decode are the client's fault (INVALID_ARGUMENT).
    pub fn decode(
        &self,
        call: u64,
        tables: &TableSet,
        input: u32,
        wire: &[u8],
    ) -> Result<Block, Status> {
        let region = self.units.region();
        // Device values are never longer than the message: reserve that,
        // give the tail back after.
        let worst = u32::try_from(wire.len())
            .map_err(|_| Status::new(Code::ResourceExhausted, "request too large"))?;
        let room = region
            .alloc(worst)
            .map_err(|e| Status::new(Code::ResourceExhausted, format!("device region: {e}")))?;
        let opts = DecodeOptions { device_base: room.offset, ..DecodeOptions::default() };
        let (mut block, mut dev) = (Block::new(), Vec::new());
        let decoded =
            Decoder::new().decode_placed(tables, input, wire, &opts, &mut block, &mut dev);
        let placed = decoded.map_err(protoplane_grpc::call::invalid_request).and_then(|()| {
            let kept = region
                .shrink(room, dev.len() as u32)
                .map_err(|e| Status::new(Code::Internal, format!("device region: {e}")))?;
            region
                .write(kept, &dev)
                .map_err(|e| Status::new(Code::Internal, format!("device region: {e}")))?;
            Ok(kept)
        });
        let kept = match placed {
            Ok(k) => k,
            Err(st) => {
                let _ = region.free(room);
                return Err(st);
            }
        };
        self.owners().adopt(call, kept);
        self.stats.placed_requests.fetch_add(1, Relaxed);
        self.stats.device_bytes_in.fetch_add(dev.len() as u64, Relaxed);
        self.stats.committed_bytes.fetch_add(block.len() as u64, Relaxed);
        Ok(block)
    }

    /// Encodes a response block of type `ty` whose bytes fields may hold
    /// device handles: they are resolved in the region (checked like every
    /// reference: a handle outside it is an error, never a read past it).
    pub fn encode(&self, tables: &TableSet, ty: u32, block: &[u8]) -> Result<Bytes, Status> {
        let mut out = Vec::with_capacity(block.len());
        self.units.region().with_bytes(|dev| {
            Encoder::new().encode_into(
                tables,
                ty,
                Source::owned(block).with_device(dev),
                &EncodeOptions::default(),
                &mut out,
            )
        })?;
        self.stats.encoded_responses.fetch_add(1, Relaxed);
        Ok(Bytes::from(out))
    }

    /// Frees what `call` owns (it ended).
    pub fn end_call(&self, call: u64) {
        let freed = {
            let mut o = self.owners();
            let freed = o.by_call.remove(&call).unwrap_or_default();
            for r in &freed {
                o.by_offset.remove(&r.offset);
            }
            freed
        };
        for r in freed {
            let _ = self.units.region().free(r);
        }
    }

    /// Takes one control message for `slot` from the application; `tag`
    /// is what its answer will carry.
    pub fn control(&self, slot: u32, bytes: &[u8], tag: u64) -> Taken {
        self.stats.controls.fetch_add(1, Relaxed);
        let taken = self.control_inner(slot, bytes, tag);
        if let Taken::Now(a) = &taken {
            if a.code != Code::Ok {
                self.stats.refused.fetch_add(1, Relaxed);
            }
        }
        taken
    }

    fn control_inner(&self, slot32: u32, bytes: &[u8], tag: u64) -> Taken {
        let slot = slot32 as usize;
        let c = match control::decode(bytes) {
            Ok(c) => c,
            Err(e) => return Taken::Now(Answer::fail(Code::InvalidArgument, e.to_string())),
        };
        let cu = &self.units;
        let done = |r: Result<(), CuError>| match r {
            Ok(()) => Answer::ok(cu.get_type(slot).unwrap_or_default()),
            Err(e) => Answer::fail(cu_code(&e), e.to_string()),
        };
        Taken::Now(match c {
            Control::Program(name) => done(cu.program(slot, &name)),
            // A vanished unit answers UNAVAILABLE (with its kernel): how an
            // application learns that it is back.
            Control::GetType => match (cu.slots() > slot, cu.is_available(slot)) {
                (true, true) => Answer::ok(cu.get_type(slot).unwrap_or_default()),
                (true, false) => Answer::fail(
                    Code::Unavailable,
                    format!(
                        "slot {slot} ({}) is unavailable",
                        cu.get_type(slot).unwrap_or_default()
                    ),
                ),
                (false, _) => Answer::fail(Code::InvalidArgument, format!("no slot {slot}")),
            },
            Control::SetAvailable(up) => done(cu.set_available(slot, up)),
            Control::SetKey { id, key } => done(cu.set_key(id, &key)),
            Control::Place(spec) => self.place(&spec),
            Control::Submit(task) if task.input.is_empty() => {
                Answer::fail(Code::InvalidArgument, "a task needs a non-empty input".into())
            }
            Control::Submit(task) => {
                // Every range must be memory of an open call: the output
                // then belongs to that call.
                let refs = std::iter::once(task.input).chain(task.params.iter().filter_map(
                    |(_, v)| match v {
                        ParamValue::Device(r) => Some(*r),
                        _ => None,
                    },
                ));
                let owner = {
                    let o = self.owners();
                    let owners: Vec<_> = refs.map(|r| o.owner(r)).collect();
                    match owners.first() {
                        Some(Some(c)) if owners.iter().all(|x| *x == Some(*c)) => Some(*c),
                        _ => None,
                    }
                };
                let Some(call) = owner else {
                    return Taken::Now(Answer::fail(
                        Code::FailedPrecondition,
                        "a task's ranges must be device memory of one open call".into(),
                    ));
                };
                // Held across the submit: a unit that finishes at once
                // announces the ticket only after it is remembered.
                let mut pending = self.pending();
                match cu.submit_task(slot, task) {
                    Ok(t) => {
                        pending.insert(t, Running { call, tag, slot: slot32 });
                        return Taken::Running(t);
                    }
                    Err(e) => Answer::fail(cu_code(&e), e.to_string()),
                }
            }
        })
    }

    /// Moves a field (`pkg.Msg.field=device|host`) in every schema that
    /// has it, for the next request on (a decode already running keeps
    /// its snapshot), or tells where it is (`pkg.Msg.field`): the answer's
    /// text is `device` or `host`.
    fn place(&self, spec: &str) -> Answer {
        let where_ = |d: bool| if d { "device" } else { "host" }.to_owned();
        let has = |t: &PlacementTable, m: &str, f: &str| {
            let ts = t.snapshot();
            ts.message_by_name(m).and_then(|mi| ts.field_by_name(ts.message(mi), f)).is_some()
        };
        if !spec.contains('=') {
            let Some((m, f)) = spec.trim().trim_start_matches('.').rsplit_once('.') else {
                return Answer::fail(Code::InvalidArgument, format!("`{spec}`: not pkg.Msg.field"));
            };
            return match self.placements.iter().find(|t| has(t, m, f)) {
                Some(t) => Answer::ok(where_(t.is_on_device(m, f))),
                None => Answer::fail(Code::NotFound, format!("no field {m}.{f}")),
            };
        }
        let p = match protoplane_schema::parse_placement(spec) {
            Ok(p) => p,
            Err(e) => return Answer::fail(Code::InvalidArgument, e.to_string()),
        };
        let mut moved = 0;
        for t in self.placements.iter().filter(|t| has(t, &p.message, &p.field)) {
            if let Err(e) = t.place(&p.message, &p.field, p.placement) {
                return Answer::fail(Code::InvalidArgument, e.to_string());
            }
            moved += 1;
        }
        match moved {
            0 => Answer::fail(Code::NotFound, format!("no field {}.{}", p.message, p.field)),
            _ => Answer::ok(where_(p.placement == Placement::Device)),
        }
    }

    fn pending(&self) -> MutexGuard<'_, HashMap<Ticket, Running>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A task's answer, once its unit has notified (`None`: not a task of
    /// this device's, or answered already): the application's tag, the
    /// slot, and the answer. The output goes to the call that owns the
    /// task's input; if that call ended meanwhile, the output is freed and
    /// the task reported failed.
    pub fn done(&self, t: Ticket) -> Option<(u64, u32, Answer)> {
        let Running { call, tag, slot } = self.pending().remove(&t)?;
        let Some(n) = self.units.poll(t) else {
            let a =
                Answer::fail(Code::Internal, "the unit announced a task it had not done".into());
            return Some((tag, slot, a));
        };
        Some((tag, slot, self.answer(call, n)))
    }

    fn answer(&self, call: u64, n: protoplane_offload::cu::Notification) -> Answer {
        match n.status {
            Ok(out) => {
                let mut o = self.owners();
                match Some(call).filter(|c| o.by_call.contains_key(c)) {
                    Some(c) => {
                        o.adopt(c, out);
                        Answer { code: Code::Ok, output: out, text: n.kernel }
                    }
                    None => {
                        drop(o);
                        let _ = self.units.region().free(out);
                        Answer::fail(Code::Cancelled, "the call owning the task ended".into())
                    }
                }
            }
            // The unit went away under the task: the application may retry
            // elsewhere (or on the host), as with any UNAVAILABLE.
            Err(e @ KernelError::Unavailable { .. }) => {
                Answer::fail(Code::Unavailable, format!("{}: {e}", n.kernel))
            }
            Err(e) => Answer::fail(Code::Aborted, format!("{}: {e}", n.kernel)),
        }
    }
}

/// The status code an application sees for a refused control message.
fn cu_code(e: &CuError) -> Code {
    match e {
        CuError::Unavailable(_) => Code::Unavailable,
        CuError::RingFull { .. } | CuError::NotificationRingFull { .. } => Code::ResourceExhausted,
        CuError::NotProgrammed(_) => Code::FailedPrecondition,
        _ => Code::InvalidArgument,
    }
}

/// Placement per schema (in the engine's schema order), shared by the
/// services of the schema.
pub struct Placements {
    tables: Vec<Arc<PlacementTable>>,
}

impl std::fmt::Debug for Placements {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placements").field("schemas", &self.tables.len()).finish()
    }
}

impl std::fmt::Debug for Placed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placed").field("any", &self.any()).finish_non_exhaustive()
    }
}

/// One schema's current placement: the tables to decode with and, per
/// message type, whether a device-placed field is reachable from it
/// (worked out once per placement change, not per request).
pub struct Placed {
    table: Arc<PlacementTable>,
    cache: Mutex<(Arc<TableSet>, Arc<Vec<bool>>)>,
}

impl Placed {
    fn new(table: Arc<PlacementTable>) -> Placed {
        let ts = table.snapshot();
        let reach = Arc::new(reaches_device(&ts));
        Placed { table, cache: Mutex::new((ts, reach)) }
    }

    /// The placement table (move fields at run time through it).
    pub fn table(&self) -> &Arc<PlacementTable> {
        &self.table
    }

    /// The tables to decode a request of type `ty` with, if it has
    /// device-placed fields now.
    pub fn for_type(&self, ty: u32) -> Option<Arc<TableSet>> {
        let ts = self.table.snapshot();
        let mut c = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if !Arc::ptr_eq(&c.0, &ts) {
            *c = (ts.clone(), Arc::new(reaches_device(&ts)));
        }
        c.1.get(ty as usize).copied().unwrap_or(false).then_some(ts)
    }

    /// Whether any field of the tables is placed on the device now.
    pub fn any(&self) -> bool {
        let c = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        c.1.iter().any(|&b| b)
    }
}

/// Per message type: whether it or a message below it has a field placed
/// on the device (a fixed point over sub-message edges; recursion-safe).
fn reaches_device(ts: &TableSet) -> Vec<bool> {
    let n = ts.messages().len();
    let mut reach: Vec<bool> = (0..n)
        .map(|i| ts.fields(ts.message(i as u32)).iter().any(|f| f.placement() == Placement::Device))
        .collect();
    loop {
        let mut changed = false;
        for i in 0..n {
            if reach[i] {
                continue;
            }
            let below = ts.fields(ts.message(i as u32)).iter().any(|f| {
                matches!(f.kind, Kind::Message | Kind::Group)
                    && reach.get(f.sub as usize).copied().unwrap_or(false)
            });
            if below {
                reach[i] = true;
                changed = true;
            }
        }
        if !changed {
            return reach;
        }
    }
}

impl Placements {
    /// The schemas' tables with `specs` applied: every spec must name a
    /// field of one of them.
    pub fn new(schemas: &[&TableSet], specs: &[String]) -> Result<Placements, crate::Error> {
        let tables: Vec<_> =
            schemas.iter().map(|ts| Arc::new(PlacementTable::new((*ts).clone()))).collect();
        for spec in specs {
            let mut why = Vec::new();
            let fits = tables.iter().filter(|t| match t.apply(&[spec]) {
                Ok(()) => true,
                Err(e) => {
                    why.push(e.to_string());
                    false
                }
            });
            if fits.count() == 0 {
                let why = why.join("; ");
                return Err(crate::Error::Offload(format!("offload.placements: {spec}: {why}")));
            }
        }
        Ok(Placements { tables })
    }

    /// Every schema's placement table.
    pub fn tables(&self) -> &[Arc<PlacementTable>] {
        &self.tables
    }

    /// Each schema's placement, as its services decode with it.
    pub fn placed(&self) -> Vec<Arc<Placed>> {
        self.tables.iter().map(|t| Arc::new(Placed::new(t.clone()))).collect()
    }
}
