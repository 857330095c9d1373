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
//! # Restarts and refusals
//!
//! Every application is installed on the data plane, memory or not (the
//! switches relay only between the nodes of installed applications), with
//! a MAC key the controller derives from a secret of its own
//! ([`crate::mac`]). A controller that restarts first asks each switch
//! what it holds ([`Controller::adopt`]): those ids, flows and memory stay
//! taken, and the application is *adopted* until its server agent, which
//! keeps running without a controller, reconnects and
//! [reattaches](Controller::reattach) it (an adopted application nobody
//! reattaches is reclaimed by the two timeouts, like a dead one). So a
//! restarted controller never hands out what a switch still holds. A
//! switch that refuses an install gets the application removed from every
//! switch, and the plan the agents receive has no data plane
//! ([`ControllerEvent::Refused`]): the agents then run everything on the
//! host, exactly.
//!
//! Each join of a member starts a new *incarnation* of it: the switches
//! reset the member's flows and admit only the new incarnation's packets,
//! and the member stamps every packet with it, so a member that restarts
//! never has its new packets taken for retransmissions of its old ones.
//!
//! Sans-IO: requests are method calls, control-plane requests for the
//! switches are polled, probes are polled as [`ControllerEvent`]s.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::mac::Key;
use crate::plan::{AppPlan, CachePolicy, ClearPolicy, MemberLoss};
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
    /// What synchronous aggregation does when a member is lost.
    pub member_loss: MemberLoss,
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
    /// A switch refused the application; it runs without a data plane.
    Refused {
        /// Application id.
        app: u16,
        /// The switch's reason.
        why: String,
    },
    /// An application a switch held when this controller started.
    Adopted {
        /// Application id.
        app: u16,
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
    /// `None` while the application is adopted from the data plane and
    /// waits for its server agent to reattach.
    name: Option<String>,
    plan: AppPlan,
    entry: Option<AppEntry>,
    members: Vec<Option<u16>>,
    /// Each member's current incarnation (0: never joined).
    incarnations: Vec<u8>,
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
    secret: Key,
    keys_made: u64,
    free_memory: Vec<(u32, u32)>,
    free_flows: Vec<(u16, u16)>,
    apps: BTreeMap<u16, Record>,
    names: HashMap<String, u16>,
    next_app: u16,
    next_poll: u64,
    control_out: VecDeque<(u64, u8, Control)>,
    polls: HashMap<u64, ()>,
    /// Install requests in flight: token → application.
    installs: HashMap<u64, u16>,
    next_token: u64,
    events: VecDeque<ControllerEvent>,
}

impl Controller {
    /// A controller for `plane` (`None`: there is no data plane) that
    /// derives the applications' MAC keys from `secret` (read it from the
    /// operating system's random source; the simulation seeds it).
    pub fn new(plane: Option<DataPlane>, tuning: ControllerTuning, secret: Key) -> Controller {
        let (free_memory, free_flows) = match &plane {
            Some(p) => (vec![(0, p.registers)], vec![(0, p.flows)]),
            None => (Vec::new(), Vec::new()),
        };
        // Without a data plane nothing remembers which ids a previous
        // controller handed out: start somewhere the secret picks, so a
        // restarted controller is unlikely to give a new application the
        // id of one whose server agent has not reattached yet.
        let next_app = match &plane {
            Some(_) => 1,
            None => 1 + (crate::mac::siphash24(&secret, b"first id") % 30_000) as u16,
        };
        Controller {
            plane,
            tuning,
            secret,
            keys_made: 0,
            free_memory,
            free_flows,
            apps: BTreeMap::new(),
            names: HashMap::new(),
            next_app,
            next_poll: 0,
            control_out: VecDeque::new(),
            polls: HashMap::new(),
            installs: HashMap::new(),
            next_token: 1,
            events: VecDeque::new(),
        }
    }

    /// Free register indices (for tests and status).
    pub fn free_memory(&self) -> u32 {
        self.free_memory.iter().map(|r| r.1).sum()
    }

    /// Registered applications: (id, name); adopted ones that no server
    /// agent reattached yet have an empty name.
    pub fn apps(&self) -> Vec<(u16, String)> {
        self.apps.iter().map(|(id, r)| (*id, r.name.clone().unwrap_or_default())).collect()
    }

    fn new_key(&mut self) -> Key {
        self.keys_made += 1;
        Key::derive(&self.secret, self.keys_made)
    }

    /// Registers an application instance; FCFS memory. The plan returned is
    /// the one the controller asks the switches to install; if a switch
    /// refuses, [`Controller::plan_of`] has the plan without a data plane
    /// once the replies are in.
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
        let app = self.free_id()?;
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
        let key = self.new_key();
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
            key,
            incarnation: 0,
            member_loss: r.member_loss,
        };
        // The copy policy backs every aggregation result up on the server
        // agent, so the server agent is always among the destinations.
        let forward = match (r.clear, r.forward) {
            (ClearPolicy::Copy, Destinations::Members) => Destinations::Both,
            (_, f) => f,
        };
        let entry = plane.map(|_| AppEntry {
            app,
            server: r.server,
            members: Vec::new(),
            forward,
            flow_base,
            flows,
            mem_base: memory.map_or(0, |m| m.0),
            mem_len: memory.map_or(0, |m| m.1),
            threshold: r.threshold,
            count: r.count,
            modify: r.modify,
            key,
        });
        if let Some(e) = &entry {
            self.install(e.clone());
        }
        self.names.insert(r.name.clone(), app);
        let members = vec![None; usize::from(r.members)];
        let incarnations = vec![0; usize::from(r.members)];
        self.apps.insert(
            app,
            Record {
                name: Some(r.name),
                plan: plan.clone(),
                entry,
                members,
                incarnations,
                alive_at: now,
                probed_at: None,
            },
        );
        Ok(plan)
    }

    /// An application id no record holds.
    fn free_id(&mut self) -> Result<u16, Error> {
        for _ in 0..=u16::MAX {
            let id = self.next_app;
            self.next_app = self.next_app.checked_add(1).unwrap_or(1);
            if id != 0 && !self.apps.contains_key(&id) {
                return Ok(id);
            }
        }
        Err(Error::AppIdsExhausted)
    }

    fn install(&mut self, e: AppEntry) {
        let chain = self.plane.as_ref().map_or(0, |p| p.switches.len());
        let app = e.app;
        for i in 0..chain {
            let t = self.control(i as u8, Control::Install(e.clone()));
            self.installs.insert(t, app);
        }
    }

    /// The application's current plan (the server agent's).
    pub fn plan_of(&self, app: u16) -> Option<AppPlan> {
        self.apps.get(&app).filter(|r| r.name.is_some()).map(|r| r.plan.clone())
    }

    /// A member's current plan: the application's, with the member's
    /// incarnation.
    pub fn member_plan(&self, app: u16, member: u16) -> Option<AppPlan> {
        let r = self.apps.get(&app).filter(|r| r.name.is_some())?;
        let incarnation = *r.incarnations.get(usize::from(member))?;
        Some(AppPlan { incarnation, ..r.plan.clone() })
    }

    /// A member joins application `name`: a new incarnation of it starts
    /// (its flows start over on the data plane).
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
        let inc = &mut r.incarnations[usize::from(member)];
        *inc = inc.wrapping_add(1).max(1);
        let incarnation = *inc;
        r.alive_at = now;
        let plan = AppPlan { incarnation, ..r.plan.clone() };
        if r.entry.is_some() {
            let members: Vec<u16> = r.members.iter().flatten().copied().collect();
            let flows = plan.member_flows(member);
            for i in 0..chain {
                self.control(i as u8, Control::Members { app, members: members.clone() });
                self.control(i as u8, Control::Flows { app, flows: flows.clone(), incarnation });
            }
        }
        Ok(plan)
    }

    /// The applications a switch holds, read when this controller starts
    /// (`Control::Apps`): their ids, flows and memory stay taken, and each
    /// waits for its server agent to reattach or is reclaimed.
    pub fn adopt(&mut self, now: u64, held: Vec<(AppEntry, Vec<u8>)>) {
        for (e, incarnations) in held {
            if self.apps.contains_key(&e.app) {
                continue;
            }
            // What overlaps something adopted already (the switches
            // disagree) is not adopted, and takes nothing.
            let flows_ok =
                self.plane.is_some() && take_exact(&mut self.free_flows, (e.flow_base, e.flows));
            if !flows_ok {
                continue;
            }
            if e.mem_len > 0 && !take_exact_u32(&mut self.free_memory, (e.mem_base, e.mem_len)) {
                give_back_flows(&mut self.free_flows, (e.flow_base, e.flows));
                continue;
            }
            self.next_app = self.next_app.max(e.app.saturating_add(1));
            let plan = AppPlan {
                app: e.app,
                server: e.server,
                switch: self.plane.as_ref().map(|p| p.switches[0]),
                members: 0,
                flows_per_member: 0,
                flow_base: e.flow_base,
                switches: self.plane.as_ref().map_or(0, |p| p.switches.len() as u8),
                groups: self.plane.as_ref().map_or(32, |p| p.groups),
                window: self.plane.as_ref().map_or(256, |p| p.window),
                memory: (e.mem_len > 0).then_some((e.mem_base, e.mem_len)),
                clear: ClearPolicy::Lazy,
                cache: CachePolicy::Fcfs,
                threshold: e.threshold,
                key_bits: 32,
                key: e.key,
                incarnation: 0,
                member_loss: MemberLoss::Fail,
            };
            self.events.push_back(ControllerEvent::Adopted { app: e.app });
            self.apps.insert(
                e.app,
                Record {
                    name: None,
                    plan,
                    members: Vec::new(),
                    incarnations,
                    entry: Some(e),
                    alive_at: now,
                    probed_at: None,
                },
            );
        }
    }

    /// A server agent takes its application back after this controller
    /// (re)started: the application adopted from the data plane if it is
    /// the same one (id, flows, memory and key), or, when no switch holds
    /// it, the same id, flows and memory if they are free.
    pub fn reattach(&mut self, now: u64, name: &str, plan: AppPlan) -> Result<AppPlan, Error> {
        let app = plan.app;
        let taken = |why| Error::CannotReattach { app, why };
        if let Some(id) = self.names.get(name) {
            return if *id == app {
                self.plan_of(app).ok_or(taken("vanished"))
            } else {
                Err(Error::NameTaken { name: name.to_string() })
            };
        }
        if plan.members == 0 || plan.members > 32 || plan.flows_per_member == 0 {
            return Err(Error::EmptyApplication);
        }
        let flows = plan.flows();
        let members = usize::from(plan.members);
        let incarnations = match self.apps.get(&app) {
            Some(r) => {
                let e = r.entry.as_ref().ok_or(taken("its id is another's"))?;
                let same = r.name.is_none()
                    && e.key == plan.key
                    && e.flow_base == plan.flow_base
                    && e.flows == flows
                    && plan.memory.unwrap_or((e.mem_base, 0)) == (e.mem_base, e.mem_len)
                    && e.server == plan.server;
                if !same {
                    return Err(taken("the data plane holds another application with its id"));
                }
                // A member's incarnation is what its primary flow admits.
                (0..plan.members)
                    .map(|m| r.incarnations.get(usize::from(m)).copied().unwrap_or(0))
                    .collect()
            }
            None => {
                if self.plane.is_some() {
                    if !take_exact(&mut self.free_flows, (plan.flow_base, flows)) {
                        return Err(taken("its flows are another's"));
                    }
                    if let Some(m) = plan.memory {
                        if !take_exact_u32(&mut self.free_memory, m) {
                            give_back_flows(&mut self.free_flows, (plan.flow_base, flows));
                            return Err(taken("its memory is another's"));
                        }
                    }
                }
                vec![0; members]
            }
        };
        let adopted = self.apps.remove(&app).and_then(|r| r.entry);
        let held = adopted.is_some();
        let entry = match adopted {
            Some(e) => Some(e),
            None => self.plane.as_ref().map(|_| AppEntry {
                app,
                server: plan.server,
                members: Vec::new(),
                forward: Destinations::Members,
                flow_base: plan.flow_base,
                flows,
                mem_base: plan.memory.map_or(0, |m| m.0),
                mem_len: plan.memory.map_or(0, |m| m.1),
                threshold: plan.threshold,
                count: CountMode::TestAndSet,
                modify: None,
                key: plan.key,
            }),
        };
        if let (false, Some(e)) = (held, &entry) {
            self.install(e.clone());
        }
        self.next_app = self.next_app.max(app.saturating_add(1));
        let plan = AppPlan { incarnation: 0, ..plan };
        self.names.insert(name.to_string(), app);
        self.apps.insert(
            app,
            Record {
                name: Some(name.to_string()),
                plan: plan.clone(),
                entry,
                members: vec![None; members],
                incarnations,
                alive_at: now,
                probed_at: None,
            },
        );
        Ok(plan)
    }

    /// The plan of application `name`, and its members' nodes so far.
    /// The plan carries no key: only the server agent (at registration)
    /// and the members (at their joins) get it.
    pub fn lookup(&self, name: &str) -> Option<(AppPlan, Vec<Option<u16>>)> {
        let r = &self.apps[self.names.get(name)?];
        Some((AppPlan { key: Key::default(), ..r.plan.clone() }, r.members.clone()))
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
        if let Some(name) = &r.name {
            self.names.remove(name);
        }
        self.release(app, r.entry.as_ref(), r.plan.flow_base, r.entry.as_ref().map(|e| e.flows));
        Ok(())
    }

    /// Removes `app` from the switches and gives its memory and flows back.
    fn release(&mut self, app: u16, entry: Option<&AppEntry>, flow_base: u16, flows: Option<u16>) {
        if let Some(e) = entry {
            let chain = self.plane.as_ref().map_or(0, |p| p.switches.len());
            for i in 0..chain {
                self.control(i as u8, Control::Remove { app });
            }
            if e.mem_len > 0 {
                give_back(&mut self.free_memory, (e.mem_base, e.mem_len));
            }
        }
        if let (Some(_), Some(flows)) = (&self.plane, flows) {
            give_back_flows(&mut self.free_flows, (flow_base, flows));
        }
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
        if let Some(app) = self.installs.remove(&token) {
            if let ControlReply::Refused(why) = reply {
                self.unplace(app, why);
            }
            return;
        }
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

    /// A switch refused `app`: off the data plane everywhere, its memory
    /// and flows back, and a plan without a data plane for its agents.
    fn unplace(&mut self, app: u16, why: String) {
        let Some(r) = self.apps.get_mut(&app) else { return };
        let Some(entry) = r.entry.take() else { return };
        r.plan.switch = None;
        r.plan.switches = 0;
        r.plan.memory = None;
        let flow_base = r.plan.flow_base;
        // Other installs of the same entry may still be in flight: their
        // replies no longer matter.
        self.installs.retain(|_, a| *a != app);
        self.release(app, Some(&entry), flow_base, Some(entry.flows));
        self.events.push_back(ControllerEvent::Refused { app, why });
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
            let name = self.apps.get(&app).and_then(|r| r.name.clone()).unwrap_or_default();
            if self.deregister(app).is_ok() {
                self.events.push_back(ControllerEvent::Reclaimed { app, name });
            }
        }
    }
}

/// Takes exactly `r` out of the free list, if it is free.
fn take_exact_u32(free: &mut Vec<(u32, u32)>, r: (u32, u32)) -> bool {
    let (base, len) = r;
    let Some(i) = free.iter().position(|(b, l)| *b <= base && base + len <= b + l) else {
        return false;
    };
    let (b, l) = free.remove(i);
    if base > b {
        free.push((b, base - b));
    }
    if base + len < b + l {
        free.push((base + len, b + l - base - len));
    }
    free.sort_unstable();
    true
}

fn take_exact(free: &mut Vec<(u16, u16)>, r: (u16, u16)) -> bool {
    let mut wide: Vec<(u32, u32)> =
        free.iter().map(|(b, l)| (u32::from(*b), u32::from(*l))).collect();
    let ok = take_exact_u32(&mut wide, (u32::from(r.0), u32::from(r.1)));
    *free = wide.into_iter().map(|(b, l)| (b as u16, l as u16)).collect();
    ok
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
            member_loss: MemberLoss::Fail,
        }
    }

    fn plane() -> DataPlane {
        DataPlane { switches: vec![1], groups: 32, registers: 100, flows: 16, window: 256 }
    }

    #[test]
    fn memory_is_first_come_first_served_and_comes_back() {
        let mut c = Controller::new(Some(plane()), ControllerTuning::default(), Key([1; 16]));
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
        let mut c = Controller::new(Some(plane()), t, Key([1; 16]));
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
                    other => panic!("{other:?}"),
                }
            }
            while c.poll_control().is_some() {}
            now += 10;
        }
        assert!(probes >= 2);
        assert_eq!(c.apps(), vec![(b.app, "b".to_string())]);
        assert_eq!(c.free_memory(), 90);
    }

    use crate::switch::{Switch, SwitchConfig};

    /// A one-switch data plane: the controller's requests applied at once.
    fn apply(c: &mut Controller, sw: &mut Switch) {
        while let Some((token, _, control)) = c.poll_control() {
            let reply = sw.control(control);
            c.handle_control(token, reply);
        }
    }

    fn a_switch() -> Switch {
        let config = SwitchConfig { node: 1, registers: 100, flows: 16, ..SwitchConfig::default() };
        Switch::new(config).expect("valid")
    }

    #[test]
    fn a_restarted_controller_adopts_what_the_switch_holds_and_hands_none_of_it_out() {
        let mut sw = a_switch();
        let mut first = Controller::new(Some(plane()), ControllerTuning::default(), Key([1; 16]));
        let a = first.register(0, reg("a", 60)).expect("registers");
        apply(&mut first, &mut sw);
        first.join(0, "a", 0, 7).expect("joins");
        first.join(0, "a", 0, 7).expect("joins again");
        apply(&mut first, &mut sw);
        // The controller restarts: a new process with another secret.
        let mut c = Controller::new(Some(plane()), ControllerTuning::default(), Key([2; 16]));
        let held = match sw.control(Control::Apps) {
            ControlReply::Apps(apps) => apps,
            r => panic!("{r:?}"),
        };
        c.adopt(0, held);
        assert_eq!(c.poll_event(), Some(ControllerEvent::Adopted { app: a.app }));
        let b = c.register(0, reg("b", 60)).expect("registers");
        apply(&mut c, &mut sw);
        assert_ne!(b.app, a.app, "a new id");
        assert_eq!(b.memory, None, "a's 60 registers are still taken: 40 are left");
        assert_ne!(b.flow_base, a.flow_base);
        assert_eq!(c.plan_of(b.app).and_then(|p| p.switch), Some(1), "installed, no memory");
        // a's server agent reattaches with its plan: same id, memory, key.
        let back = c.reattach(0, "a", a.clone()).expect("reattaches");
        assert_eq!((back.app, back.memory, back.key), (a.app, a.memory, a.key));
        // The member's next join is its third incarnation, not its first.
        let joined = c.join(0, "a", 0, 8).expect("joins");
        assert_eq!(joined.incarnation, 3);
        // Someone else's plan for a's id is refused.
        let thief = AppPlan { key: Key([9; 16]), ..a.clone() };
        assert!(c.reattach(0, "z", thief).is_err());
    }

    #[test]
    fn an_adopted_application_nobody_reattaches_is_reclaimed() {
        let mut sw = a_switch();
        let mut first = Controller::new(Some(plane()), ControllerTuning::default(), Key([1; 16]));
        let a = first.register(0, reg("a", 60)).expect("registers");
        apply(&mut first, &mut sw);
        let t = ControllerTuning { poll_us: 10, idle_us: 100, dead_us: 100 };
        let mut c = Controller::new(Some(plane()), t, Key([2; 16]));
        let ControlReply::Apps(held) = sw.control(Control::Apps) else { panic!() };
        c.adopt(0, held);
        let mut reclaimed = false;
        for now in (0..1_000).step_by(10) {
            c.handle_timeout(now);
            apply(&mut c, &mut sw);
            while let Some(e) = c.poll_event() {
                reclaimed |= e == ControllerEvent::Reclaimed { app: a.app, name: String::new() };
            }
        }
        assert!(reclaimed);
        assert_eq!(c.free_memory(), 100);
        assert!(matches!(sw.control(Control::Apps), ControlReply::Apps(v) if v.is_empty()));
    }

    #[test]
    fn a_refused_install_leaves_the_application_on_the_host_with_its_memory_given_back() {
        let mut c = Controller::new(Some(plane()), ControllerTuning::default(), Key([1; 16]));
        let r = Registration { members: 8, flows_per_member: 2, ..reg("w", 50) };
        let mut sw2 = a_switch();
        let plan = c.register(0, r).expect("registers");
        assert_eq!(plan.memory, Some((0, 50)));
        // The switch refuses (say it still holds application 1 from before).
        let stale = AppEntry {
            app: plan.app,
            server: 1,
            members: vec![],
            forward: Destinations::Server,
            flow_base: 0,
            flows: 0,
            mem_base: 0,
            mem_len: 0,
            threshold: 1,
            count: CountMode::TestAndSet,
            modify: None,
            key: Key::default(),
        };
        assert_eq!(sw2.control(Control::Install(stale)), ControlReply::Done);
        apply(&mut c, &mut sw2);
        match c.poll_event() {
            Some(ControllerEvent::Refused { app, why }) => {
                assert_eq!(app, plan.app);
                assert!(why.contains("already installed"), "{why}");
            }
            e => panic!("{e:?}"),
        }
        let now = c.plan_of(plan.app).expect("still registered");
        assert_eq!((now.switch, now.memory, now.switches), (None, None, 0));
        assert_eq!(c.free_memory(), 100, "its memory is free again");
    }

    #[test]
    fn each_join_is_a_new_incarnation_and_resets_the_members_flows() {
        let mut sw = a_switch();
        let mut c = Controller::new(Some(plane()), ControllerTuning::default(), Key([1; 16]));
        let a = c.register(0, reg("a", 10)).expect("registers");
        apply(&mut c, &mut sw);
        let first = c.join(0, "a", 1, 7).expect("joins");
        let mut flows = Vec::new();
        while let Some((_, _, control)) = c.poll_control() {
            if let Control::Flows { flows: f, incarnation, .. } = &control {
                flows.push((f.clone(), *incarnation));
            }
            sw.control(control);
        }
        assert_eq!(first.incarnation, 1);
        assert_eq!(flows, vec![(a.member_flows(1), 1)]);
        assert_eq!(c.join(0, "a", 1, 9).expect("joins").incarnation, 2);
        assert_eq!(c.member_plan(a.app, 1).map(|p| p.incarnation), Some(2));
        assert_eq!(c.member_plan(a.app, 0).map(|p| p.incarnation), Some(0));
    }
}
