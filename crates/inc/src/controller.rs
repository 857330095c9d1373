//! The controller: names, application ids, data-plane memory and flows,
//! and reclaiming what dead applications hold.
//!
//! A server agent *registers* an application instance (its NetFilter's
//! needs: members, memory, policies) and gets an [`AppPlan`]; client
//! agents *join* by name and get the same plan. Memory is handed out first
//! come, first served, as one index range valid on every switch of the
//! chain; when nothing fits, or there is no data plane, the plan has no
//! memory and the agents do everything on the host — correctly, only
//! slower.
//!
//! Dead applications are found with two timeouts. The controller polls the
//! data plane's last-seen time of each application; an application idle
//! for `idle_us` is *probed* (its server agent must answer with a
//! heartbeat); one that stays silent for `dead_us` after that is removed
//! from the data plane and its memory and flows go back to the free lists.
//! Other applications are not touched: removal zeroes only the removed
//! application's registers.
//!
//! Sans-IO: requests are method calls, control-plane requests for the
//! switches are polled, probes are polled as [`ControllerEvent`]s.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::plan::{AppPlan, CachePolicy, ClearPolicy};
use crate::switch::{AppEntry, Control, ControlReply, CountMode, Destinations, ModifyOp};
use crate::Error;

/// The data plane a controller manages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataPlane {
    /// Nodes of the switches, in chain order.
    pub switches: Vec<u16>,
    /// Register groups per switch.
    pub groups: u8,
    /// Cells per register array.
    pub registers: u32,
    /// Flows the bit arrays hold.
    pub flows: u16,
    /// Flow window.
    pub window: u32,
}

/// What a server agent asks for when it registers.
#[derive(Clone, Debug, PartialEq)]
pub struct Registration {
    /// Application name (from the NetFilter's `AppName`, plus an instance
    /// suffix when several instances run).
    pub name: String,
    /// The server agent's node.
    pub server: u16,
    /// Members.
    pub members: u16,
    /// Flows per member.
    pub flows_per_member: u16,
    /// Register indices wanted.
    pub memory: u32,
    /// Clear policy.
    pub clear: ClearPolicy,
    /// Cache policy.
    pub cache: CachePolicy,
    /// `CntFwd` threshold.
    pub threshold: u32,
    /// `CntFwd` destinations.
    pub forward: Destinations,
    /// `CntFwd` counting.
    pub count: CountMode,
    /// `Stream.modify`.
    pub modify: Option<(ModifyOp, i32)>,
    /// Logical address bits.
    pub key_bits: u32,
}

/// What the controller needs the I/O layer to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControllerEvent {
    /// Ask this application's server agent for a heartbeat.
    Probe {
        /// Application id.
        app: u16,
        /// Its server agent.
        server: u16,
    },
    /// The application was declared dead and its resources reclaimed.
    Reclaimed {
        /// Application id.
        app: u16,
        /// Its name.
        name: String,
    },
}

/// Timeouts and polling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControllerTuning {
    /// Poll the data plane's last-seen times this often.
    pub poll_us: u64,
    /// Idle this long: probe.
    pub idle_us: u64,
    /// Silent this long after the probe: reclaim.
    pub dead_us: u64,
}

impl Default for ControllerTuning {
    fn default() -> Self {
        ControllerTuning { poll_us: 100_000, idle_us: 1_000_000, dead_us: 1_000_000 }
    }
}

#[derive(Debug)]
struct Record {
    name: String,
    plan: AppPlan,
    entry: Option<AppEntry>,
    members: Vec<Option<u16>>,
    /// Latest sign of life: registration, a join, a packet on the data
    /// plane, a heartbeat.
    alive_at: u64,
    probed_at: Option<u64>,
}

/// The controller.
#[derive(Debug)]
pub struct Controller {
    plane: Option<DataPlane>,
    tuning: ControllerTuning,
    free_memory: Vec<(u32, u32)>,
    free_flows: Vec<(u16, u16)>,
    apps: BTreeMap<u16, Record>,
    names: HashMap<String, u16>,
    next_app: u16,
    next_poll: u64,
    control_out: VecDeque<(u64, u8, Control)>,
    polls: HashMap<u64, ()>,
    next_token: u64,
    events: VecDeque<ControllerEvent>,
}

impl Controller {
    /// A controller for `plane` (`None`: there is no data plane).
    pub fn new(plane: Option<DataPlane>, tuning: ControllerTuning) -> Controller {
        let (free_memory, free_flows) = match &plane {
            Some(p) => (vec![(0, p.registers)], vec![(0, p.flows)]),
            None => (Vec::new(), Vec::new()),
        };
        Controller {
            plane,
            tuning,
            free_memory,
            free_flows,
            apps: BTreeMap::new(),
            names: HashMap::new(),
            next_app: 1,
            next_poll: 0,
            control_out: VecDeque::new(),
            polls: HashMap::new(),
            next_token: 1,
            events: VecDeque::new(),
        }
    }

    /// Free register indices (for tests and status).
    pub fn free_memory(&self) -> u32 {
        self.free_memory.iter().map(|r| r.1).sum()
    }

    /// Registered applications: (id, name).
    pub fn apps(&self) -> Vec<(u16, String)> {
        self.apps.iter().map(|(id, r)| (*id, r.name.clone())).collect()
    }

    /// Registers an application instance; FCFS memory.
    pub fn register(&mut self, now: u64, r: Registration) -> Result<AppPlan, Error> {
        if self.names.contains_key(&r.name) {
            return Err(Error::NameTaken { name: r.name });
        }
        if r.members == 0 || r.flows_per_member == 0 {
            return Err(Error::EmptyApplication);
        }
        if r.members > 32 {
            return Err(Error::TooManyMembers { members: r.members });
        }
        let flows = r.members.checked_mul(r.flows_per_member).ok_or(Error::TooManyFlows {
            members: r.members,
            flows_per_member: r.flows_per_member,
        })?;
        let app = self.next_app;
        let (flow_base, memory) = match &self.plane {
            Some(_) => {
                let flow_base =
                    take_range(&mut self.free_flows, flows).ok_or(Error::NoFreeFlows { flows })?;
                let memory =
                    if r.memory == 0 { None } else { take_range(&mut self.free_memory, r.memory) };
                (flow_base, memory.map(|b| (b, r.memory)))
            }
            None => (0, None),
        };
        self.next_app = self.next_app.checked_add(1).ok_or(Error::AppIdsExhausted)?;
        let plane = self.plane.as_ref();
        let plan = AppPlan {
            app,
            server: r.server,
            switch: plane.map(|p| p.switches[0]),
            members: r.members,
            flows_per_member: r.flows_per_member,
            flow_base,
            switches: plane.map_or(0, |p| p.switches.len() as u8),
            groups: plane.map_or(32, |p| p.groups),
            window: plane.map_or(256, |p| p.window),
            memory,
            clear: r.clear,
            cache: r.cache,
            threshold: r.threshold,
            key_bits: r.key_bits,
        };
        // The copy policy backs every aggregation result up on the server
        // agent, so the server agent is always among the destinations.
        let forward = match (r.clear, r.forward) {
            (ClearPolicy::Copy, Destinations::Members) => Destinations::Both,
            (_, f) => f,
        };
        let entry = memory.map(|(base, len)| AppEntry {
            app,
            server: r.server,
            members: Vec::new(),
            forward,
            flow_base,
            flows,
            mem_base: base,
            mem_len: len,
            threshold: r.threshold,
            count: r.count,
            modify: r.modify,
        });
        if let (Some(e), Some(p)) = (&entry, plane) {
            for i in 0..p.switches.len() {
                self.control(i as u8, Control::Install(e.clone()));
            }
        }
        self.names.insert(r.name.clone(), app);
        let members = vec![None; usize::from(r.members)];
        self.apps.insert(
            app,
            Record {
                name: r.name,
                plan: plan.clone(),
                entry,
                members,
                alive_at: now,
                probed_at: None,
            },
        );
        Ok(plan)
    }

    /// A member joins application `name`.
    pub fn join(&mut self, now: u64, name: &str, member: u16, node: u16) -> Result<AppPlan, Error> {
        let app =
            *self.names.get(name).ok_or_else(|| Error::NoSuchName { name: name.to_string() })?;
        let chain = self.plane.as_ref().map_or(0, |p| p.switches.len());
        let r = self.apps.get_mut(&app).ok_or(Error::AppVanished { app })?;
        let members = r.plan.members;
        let slot = r
            .members
            .get_mut(usize::from(member))
            .ok_or(Error::NoSuchMember { member, members })?;
        *slot = Some(node);
        r.alive_at = now;
        let plan = r.plan.clone();
        if r.entry.is_some() {
            let members: Vec<u16> = r.members.iter().flatten().copied().collect();
            for i in 0..chain {
                self.control(i as u8, Control::Members { app, members: members.clone() });
            }
        }
        Ok(plan)
    }

    /// The plan of application `name`, and its members' nodes so far.
    pub fn lookup(&self, name: &str) -> Option<(AppPlan, Vec<Option<u16>>)> {
        let r = &self.apps[self.names.get(name)?];
        Some((r.plan.clone(), r.members.clone()))
    }

    /// The application's server agent is alive.
    pub fn heartbeat(&mut self, now: u64, app: u16) {
        if let Some(r) = self.apps.get_mut(&app) {
            r.alive_at = r.alive_at.max(now);
            r.probed_at = None;
        }
    }

    /// Releases an application's resources (a clean exit).
    pub fn deregister(&mut self, app: u16) -> Result<(), Error> {
        let r = self.apps.remove(&app).ok_or(Error::NoSuchApp { app })?;
        self.names.remove(&r.name);
        if let Some(e) = &r.entry {
            let chain = self.plane.as_ref().map_or(0, |p| p.switches.len());
            for i in 0..chain {
                self.control(i as u8, Control::Remove { app });
            }
            give_back(&mut self.free_memory, (e.mem_base, e.mem_len));
        }
        if self.plane.is_some() {
            give_back_flows(&mut self.free_flows, (r.plan.flow_base, r.plan.flows()));
        }
        Ok(())
    }

    fn control(&mut self, chain_index: u8, c: Control) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        self.control_out.push_back((token, chain_index, c));
        token
    }

    /// The next control request: (token, switch of the chain, request).
    pub fn poll_control(&mut self) -> Option<(u64, u8, Control)> {
        self.control_out.pop_front()
    }

    /// The reply to a control request.
    pub fn handle_control(&mut self, token: u64, reply: ControlReply) {
        if self.polls.remove(&token).is_none() {
            return;
        }
        if let ControlReply::LastSeen(seen) = reply {
            for (app, at) in seen {
                if let Some(r) = self.apps.get_mut(&app) {
                    if at > r.alive_at {
                        r.alive_at = at;
                        r.probed_at = None;
                    }
                }
            }
        }
    }

    /// The next probe or reclaim notice.
    pub fn poll_event(&mut self) -> Option<ControllerEvent> {
        self.events.pop_front()
    }

    /// When [`Controller::handle_timeout`] should run next.
    pub fn poll_timeout(&self) -> Option<u64> {
        (!self.apps.is_empty()).then_some(self.next_poll)
    }

    /// Polls the data plane and applies the two timeouts.
    pub fn handle_timeout(&mut self, now: u64) {
        if now < self.next_poll {
            return;
        }
        self.next_poll = now + self.tuning.poll_us;
        if self.plane.is_some() {
            let t = self.control(0, Control::LastSeen);
            self.polls.insert(t, ());
        }
        let mut dead = Vec::new();
        for (id, r) in &mut self.apps {
            match r.probed_at {
                None if now.saturating_sub(r.alive_at) >= self.tuning.idle_us => {
                    r.probed_at = Some(now);
                    self.events
                        .push_back(ControllerEvent::Probe { app: *id, server: r.plan.server });
                }
                Some(p) if now.saturating_sub(p) >= self.tuning.dead_us => dead.push(*id),
                _ => {}
            }
        }
        for app in dead {
            let name = self.apps.get(&app).map(|r| r.name.clone()).unwrap_or_default();
            if self.deregister(app).is_ok() {
                self.events.push_back(ControllerEvent::Reclaimed { app, name });
            }
        }
    }
}

/// First fit: the base of a `len`-long range taken from `free`.
fn take_range<T>(free: &mut Vec<(T, T)>, len: T) -> Option<T>
where
    T: Copy + PartialOrd + std::ops::Add<Output = T> + std::ops::Sub<Output = T> + Default,
{
    let i = free.iter().position(|r| r.1 >= len)?;
    let (base, have) = free[i];
    if have == len {
        free.remove(i);
    } else {
        free[i] = (base + len, have - len);
    }
    Some(base)
}

/// Returns a range to the free list, merging neighbours.
fn give_back(free: &mut Vec<(u32, u32)>, r: (u32, u32)) {
    free.push(r);
    free.sort_unstable();
    let mut merged: Vec<(u32, u32)> = Vec::with_capacity(free.len());
    for (b, l) in free.drain(..) {
        match merged.last_mut() {
            Some(last) if last.0 + last.1 == b => last.1 += l,
            _ => merged.push((b, l)),
        }
    }
    *free = merged;
}

fn give_back_flows(free: &mut Vec<(u16, u16)>, r: (u16, u16)) {
    let mut wide: Vec<(u32, u32)> =
        free.iter().map(|(b, l)| (u32::from(*b), u32::from(*l))).collect();
    give_back(&mut wide, (u32::from(r.0), u32::from(r.1)));
    *free = wide.into_iter().map(|(b, l)| (b as u16, l as u16)).collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(name: &str, memory: u32) -> Registration {
        Registration {
            name: name.into(),
            server: 100,
            members: 2,
            flows_per_member: 1,
            memory,
            clear: ClearPolicy::Shadow,
            cache: CachePolicy::Fcfs,
            threshold: 2,
            forward: Destinations::Members,
            count: CountMode::TestAndSet,
            modify: None,
            key_bits: 32,
        }
    }

    fn plane() -> DataPlane {
        DataPlane { switches: vec![1], groups: 32, registers: 100, flows: 16, window: 256 }
    }

    #[test]
    fn memory_is_first_come_first_served_and_comes_back() {
        let mut c = Controller::new(Some(plane()), ControllerTuning::default());
        let a = c.register(0, reg("a", 60)).expect("test setup");
        let b = c.register(0, reg("b", 60)).expect("test setup");
        assert_eq!(a.memory, Some((0, 60)));
        assert_eq!(b.memory, None, "the second does not fit and runs on its server agent");
        assert_ne!(a.flow_base, b.flow_base);
        c.deregister(a.app).expect("test setup");
        assert_eq!(c.free_memory(), 100);
        let d = c.register(0, reg("d", 100)).expect("test setup");
        assert_eq!(d.memory, Some((0, 100)));
        assert!(c.register(0, reg("d", 1)).is_err(), "names are unique");
    }

    #[test]
    fn a_silent_application_is_probed_then_reclaimed() {
        let t = ControllerTuning { poll_us: 10, idle_us: 100, dead_us: 100 };
        let mut c = Controller::new(Some(plane()), t);
        let a = c.register(0, reg("a", 10)).expect("test setup");
        let b = c.register(0, reg("b", 10)).expect("test setup");
        let mut now = 0;
        let mut probes = 0;
        while now < 1_000 {
            c.handle_timeout(now);
            while let Some(e) = c.poll_event() {
                match e {
                    ControllerEvent::Probe { app, .. } => {
                        probes += 1;
                        if app == b.app {
                            c.heartbeat(now, app);
                        }
                    }
                    ControllerEvent::Reclaimed { app, .. } => assert_eq!(app, a.app),
                }
            }
            while c.poll_control().is_some() {}
            now += 10;
        }
        assert!(probes >= 2);
        assert_eq!(c.apps(), vec![(b.app, "b".to_string())]);
        assert_eq!(c.free_memory(), 90);
    }
}
