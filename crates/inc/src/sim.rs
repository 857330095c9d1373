//! Deterministic simulation: the real switch, agents and controller driven
//! by a simulated clock over a seeded, lossy network.
//!
//! Every datagram goes through the [`Injector`] of the node it is sent to
//! (loss, duplication, reordering, delay), plus a base link delay. A switch
//! serves one datagram per `switch_service_us`; the backlog it sees when a
//! datagram arrives is the queue depth that drives ECN. Control-plane
//! traffic (server agents and the controller to the switches) is reliable
//! and in order, with its own delay, like a TCP connection to the switch
//! CPU. The same seed replays the same run exactly.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};

use crate::client::{ClientAgent, ClientTuning, Event};
use crate::controller::{Controller, ControllerEvent, ControllerTuning, DataPlane, Registration};
use crate::faults::{Faults, Injector};
use crate::plan::AppPlan;
use crate::server::{ServerAgent, ServerEvent, ServerTuning};
use crate::switch::{Control, ControlReply, Emit, Switch, SwitchConfig};
use crate::Error;

/// The shape of a simulated deployment.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Switches in the chain (0: no data plane).
    pub switches: u8,
    /// Configuration of each switch (node and chain fields are filled in).
    pub switch: SwitchConfig,
    /// Faults on every link.
    pub faults: Faults,
    /// One-way link delay, microseconds.
    pub link_us: u64,
    /// One-way control-plane delay, microseconds.
    pub control_us: u64,
    /// Time a switch spends per datagram, microseconds.
    pub switch_service_us: u64,
    /// Controller timeouts.
    pub controller: ControllerTuning,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            switches: 1,
            switch: SwitchConfig { registers: 4096, flows: 512, ..SwitchConfig::default() },
            faults: Faults::none(),
            link_us: 5,
            control_us: 50,
            switch_service_us: 0,
            controller: ControllerTuning::default(),
        }
    }
}

/// A datagram on the wire: (arrival time, tie-breaking sequence,
/// destination, bytes).
type InFlight = (u64, u64, u16, Vec<u8>);

/// Node ids of switches start here (agents use smaller ids).
pub const SWITCH_NODE_BASE: u16 = 60_000;

#[derive(Debug)]
enum Ctl {
    FromServer { server: u16, token: u64, chain: u8, control: Control },
    FromController { token: u64, chain: u8, control: Control },
    ToServer { server: u16, token: u64, reply: ControlReply },
    ToController { token: u64, reply: ControlReply },
    Heartbeat { app: u16 },
}

/// Packets and bytes a node received.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Datagrams.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// A simulated deployment.
#[derive(Debug)]
pub struct Sim {
    now: u64,
    cfg: SimConfig,
    switches: Vec<(u16, Switch)>,
    controller: Controller,
    servers: BTreeMap<u16, ServerAgent>,
    clients: BTreeMap<u16, ClientAgent>,
    dead: HashSet<u16>,
    /// Client agents frozen by [`Sim::pause_client`].
    paused: HashMap<u16, ClientAgent>,
    wire: BinaryHeap<Reverse<InFlight>>,
    ctl: BinaryHeap<Reverse<(u64, u64, usize)>>,
    ctl_msgs: HashMap<usize, Ctl>,
    injectors: HashMap<u16, Injector>,
    busy_until: HashMap<u16, u64>,
    traffic: HashMap<u16, Traffic>,
    client_events: HashMap<u16, Vec<Event>>,
    server_events: HashMap<u16, Vec<ServerEvent>>,
    reclaimed: Vec<u16>,
    seq: u64,
}

impl Sim {
    /// A deployment with its switches and controller, no applications yet.
    pub fn new(cfg: SimConfig) -> Result<Sim, Error> {
        let mut switches = Vec::new();
        for i in 0..cfg.switches {
            let node = SWITCH_NODE_BASE + u16::from(i);
            let next_hop = (i + 1 < cfg.switches).then_some(node + 1);
            let c = SwitchConfig { node, chain_index: i, next_hop, ..cfg.switch.clone() };
            switches.push((node, Switch::new(c)?));
        }
        let plane = (!switches.is_empty()).then(|| DataPlane {
            switches: switches.iter().map(|s| s.0).collect(),
            groups: cfg.switch.groups,
            registers: cfg.switch.registers,
            flows: cfg.switch.flows,
            window: cfg.switch.window,
        });
        let secret = crate::mac::Key::derive(&crate::mac::Key::default(), cfg.seed);
        let controller = Controller::new(plane, cfg.controller, secret);
        Ok(Sim {
            now: 0,
            switches,
            controller,
            servers: BTreeMap::new(),
            clients: BTreeMap::new(),
            dead: HashSet::new(),
            paused: HashMap::new(),
            wire: BinaryHeap::new(),
            ctl: BinaryHeap::new(),
            ctl_msgs: HashMap::new(),
            injectors: HashMap::new(),
            busy_until: HashMap::new(),
            traffic: HashMap::new(),
            client_events: HashMap::new(),
            server_events: HashMap::new(),
            reclaimed: Vec::new(),
            seq: 0,
            cfg,
        })
    }

    /// Simulated time, microseconds.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// The controller.
    pub fn controller(&mut self) -> &mut Controller {
        &mut self.controller
    }

    /// A switch of the chain.
    pub fn switch(&self, i: usize) -> &Switch {
        &self.switches[i].1
    }

    /// A client agent.
    pub fn client(&mut self, node: u16) -> &mut ClientAgent {
        self.clients.get_mut(&node).expect("no such client")
    }

    /// A server agent.
    pub fn server(&mut self, node: u16) -> &mut ServerAgent {
        self.servers.get_mut(&node).expect("no such server")
    }

    /// What `node` received.
    pub fn traffic(&self, node: u16) -> Traffic {
        self.traffic.get(&node).copied().unwrap_or_default()
    }

    /// Applications the controller reclaimed.
    pub fn reclaimed(&self) -> &[u16] {
        &self.reclaimed
    }

    /// Events of a client agent so far (drained).
    pub fn take_client_events(&mut self, node: u16) -> Vec<Event> {
        self.client_events.remove(&node).unwrap_or_default()
    }

    /// Events of a server agent so far (drained).
    pub fn take_server_events(&mut self, node: u16) -> Vec<ServerEvent> {
        self.server_events.remove(&node).unwrap_or_default()
    }

    /// Registers an application with a server agent at `server` and one
    /// client agent per node of `members`; the data plane holds it before
    /// any agent sends (the controller's requests are applied at once).
    pub fn add_app(
        &mut self,
        reg: Registration,
        server: u16,
        members: &[u16],
        client: ClientTuning,
        tuning: ServerTuning,
    ) -> Result<AppPlan, Error> {
        let name = reg.name.clone();
        let modify = reg.modify;
        let plan = self
            .controller
            .register(self.now, Registration { server, members: members.len() as u16, ..reg })?;
        self.apply_controller_now();
        // A switch may have refused the install: the plan then has no data plane.
        let plan = self.controller.plan_of(plan.app).unwrap_or(plan);
        let mut agent = ServerAgent::new(plan.clone(), server, modify, tuning);
        agent.set_member_nodes(members);
        self.servers.insert(server, agent);
        for (m, node) in members.iter().enumerate() {
            let plan = self.controller.join(self.now, &name, m as u16, *node)?;
            self.apply_controller_now();
            self.clients.insert(*node, ClientAgent::new(plan, m as u16, *node, client));
        }
        Ok(plan)
    }

    /// Kills every switch (a crash: its registers are gone, nothing
    /// reaches it any more); each server agent hears of it as the I/O
    /// layer would, by its control connection closing.
    pub fn kill_switches(&mut self) {
        for (node, _) in &self.switches {
            self.dead.insert(*node);
        }
        let now = self.now;
        for s in self.servers.values_mut() {
            s.data_plane_lost(now);
        }
    }

    /// Stops one client agent without telling anyone (a crash).
    pub fn kill_client(&mut self, node: u16) {
        self.clients.remove(&node);
        self.dead.insert(node);
    }

    /// Freezes one client agent (a stopped process: nothing it sends, no
    /// timer, and what is sent to it is lost) until [`Sim::resume_client`].
    pub fn pause_client(&mut self, node: u16) {
        if let Some(c) = self.clients.remove(&node) {
            self.paused.insert(node, c);
            self.dead.insert(node);
        }
    }

    /// Lets a paused client agent run again.
    pub fn resume_client(&mut self, node: u16) {
        if let Some(c) = self.paused.remove(&node) {
            self.clients.insert(node, c);
            self.dead.remove(&node);
        }
    }

    /// Stops a server agent and its clients without telling anyone (a
    /// crash): their memory stays until the controller reclaims it.
    pub fn kill_app(&mut self, server: u16, members: &[u16]) {
        self.servers.remove(&server);
        self.dead.insert(server);
        for m in members {
            self.clients.remove(m);
            self.dead.insert(*m);
        }
    }

    fn apply_controller_now(&mut self) {
        while let Some((token, chain, control)) = self.controller.poll_control() {
            let reply = self.switches[usize::from(chain)].1.control(control);
            self.controller.handle_control(token, reply);
        }
    }

    /// Sets the faults on datagrams sent to `node` (overrides the default).
    pub fn set_faults(&mut self, node: u16, faults: Faults) {
        let seed = self.cfg.seed ^ (u64::from(node) << 32) ^ 0x5eed;
        self.injectors.insert(node, Injector::new(faults, seed));
    }

    fn schedule(&mut self, dst: u16, bytes: Vec<u8>) {
        if self.dead.contains(&dst) {
            return;
        }
        let seed = self.cfg.seed ^ (u64::from(dst) << 32);
        let faults = self.cfg.faults;
        let inj = self.injectors.entry(dst).or_insert_with(|| Injector::new(faults, seed));
        let times = inj.schedule(self.now + self.cfg.link_us);
        for at in times {
            self.seq += 1;
            self.wire.push(Reverse((at, self.seq, dst, bytes.clone())));
        }
    }

    fn send_ctl(&mut self, msg: Ctl) {
        self.seq += 1;
        let id = self.seq as usize;
        self.ctl_msgs.insert(id, msg);
        self.ctl.push(Reverse((self.now + self.cfg.control_us, self.seq, id)));
    }

    /// Moves everything the agents and the controller want to send onto
    /// the wire and the control channel.
    fn drain(&mut self) {
        let now = self.now;
        let mut sends = Vec::new();
        for (node, c) in &mut self.clients {
            while let Some(t) = c.poll_transmit(now) {
                sends.push((t.dst, t.bytes));
            }
            while let Some(e) = c.poll_event() {
                self.client_events.entry(*node).or_default().push(e);
            }
        }
        let mut ctls = Vec::new();
        for (node, s) in &mut self.servers {
            while let Some(t) = s.poll_transmit() {
                sends.push((t.dst, t.bytes));
            }
            while let Some(r) = s.poll_control() {
                ctls.push(Ctl::FromServer {
                    server: *node,
                    token: r.token,
                    chain: r.chain_index,
                    control: r.control,
                });
            }
            while let Some(e) = s.poll_event() {
                self.server_events.entry(*node).or_default().push(e);
            }
        }
        while let Some((token, chain, control)) = self.controller.poll_control() {
            ctls.push(Ctl::FromController { token, chain, control });
        }
        while let Some(e) = self.controller.poll_event() {
            match e {
                ControllerEvent::Probe { app, server } => {
                    if self.servers.contains_key(&server) {
                        ctls.push(Ctl::Heartbeat { app });
                    }
                }
                ControllerEvent::Reclaimed { app, .. } => self.reclaimed.push(app),
                ControllerEvent::Refused { .. } | ControllerEvent::Adopted { .. } => {}
            }
        }
        for (dst, bytes) in sends {
            self.schedule(dst, bytes);
        }
        for c in ctls {
            self.send_ctl(c);
        }
    }

    fn next_time(&self) -> Option<u64> {
        let mut t: Option<u64> = None;
        let mut at = |x: u64| t = Some(t.map_or(x, |t| t.min(x)));
        if let Some(Reverse((w, ..))) = self.wire.peek() {
            at(*w);
        }
        if let Some(Reverse((c, ..))) = self.ctl.peek() {
            at(*c);
        }
        for c in self.clients.values() {
            if let Some(x) = c.poll_timeout() {
                at(x);
            }
        }
        for s in self.servers.values() {
            if let Some(x) = s.poll_timeout() {
                at(x);
            }
        }
        if let Some(x) = self.controller.poll_timeout() {
            at(x);
        }
        t
    }

    fn deliver(&mut self, dst: u16, bytes: Vec<u8>) {
        let tr = self.traffic.entry(dst).or_default();
        tr.packets += 1;
        tr.bytes += bytes.len() as u64;
        let now = self.now;
        if let Some(i) = self.switches.iter().position(|s| s.0 == dst) {
            let service = self.cfg.switch_service_us;
            let busy = self.busy_until.entry(dst).or_insert(0);
            let start = (*busy).max(now);
            *busy = start + service;
            let depth = (start - now).checked_div(service).unwrap_or(0) as u32;
            let mut out: Vec<Emit> = Vec::new();
            self.switches[i].1.process(now, depth, &bytes, &mut out);
            for e in out {
                self.schedule(e.dst, e.bytes);
            }
        } else if let Some(s) = self.servers.get_mut(&dst) {
            s.handle(now, &bytes);
        } else if let Some(c) = self.clients.get_mut(&dst) {
            c.handle(now, &bytes);
        }
    }

    fn deliver_ctl(&mut self, msg: Ctl) {
        match msg {
            Ctl::FromServer { server, token, chain, control } => {
                let reply = match self.switches.get_mut(usize::from(chain)) {
                    Some((_, sw)) => sw.control(control),
                    None => ControlReply::Refused(format!("no switch {chain}")),
                };
                self.send_ctl(Ctl::ToServer { server, token, reply });
            }
            Ctl::FromController { token, chain, control } => {
                let reply = match self.switches.get_mut(usize::from(chain)) {
                    Some((_, sw)) => sw.control(control),
                    None => ControlReply::Refused(format!("no switch {chain}")),
                };
                self.send_ctl(Ctl::ToController { token, reply });
            }
            Ctl::ToServer { server, token, reply } => {
                let now = self.now;
                if let Some(s) = self.servers.get_mut(&server) {
                    s.handle_control(now, token, reply);
                }
            }
            Ctl::ToController { token, reply } => self.controller.handle_control(token, reply),
            Ctl::Heartbeat { app } => {
                let now = self.now;
                self.controller.heartbeat(now, app);
            }
        }
    }

    /// Runs until `done` holds (checked after every step) or `limit_us` of
    /// simulated time passed; `true` if `done` held.
    pub fn run_until(&mut self, limit_us: u64, mut done: impl FnMut(&mut Sim) -> bool) -> bool {
        let end = self.now + limit_us;
        loop {
            self.drain();
            if done(self) {
                return true;
            }
            let Some(t) = self.next_time() else { return false };
            if t > end {
                self.now = end;
                return false;
            }
            self.now = self.now.max(t);
            let now = self.now;
            while self.wire.peek().is_some_and(|Reverse((w, ..))| *w <= now) {
                let Some(Reverse((_, _, dst, bytes))) = self.wire.pop() else { break };
                self.deliver(dst, bytes);
            }
            while self.ctl.peek().is_some_and(|Reverse((c, ..))| *c <= now) {
                let Some(Reverse((_, _, id))) = self.ctl.pop() else { break };
                if let Some(m) = self.ctl_msgs.remove(&id) {
                    self.deliver_ctl(m);
                }
            }
            for c in self.clients.values_mut() {
                if c.poll_timeout().is_some_and(|x| x <= now) {
                    c.handle_timeout(now);
                }
            }
            for s in self.servers.values_mut() {
                if s.poll_timeout().is_some_and(|x| x <= now) {
                    s.handle_timeout(now);
                }
            }
            if self.controller.poll_timeout().is_some_and(|x| x <= now) {
                self.controller.handle_timeout(now);
            }
        }
    }
}
