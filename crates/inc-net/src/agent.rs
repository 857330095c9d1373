//! The agents with a socket and a clock: what application code links.
//!
//! [`ServerRuntime`] registers an application instance with the
//! controller, connects to the switches' control planes and runs the
//! server agent; the application calls [`ServerRuntime::step`] in its loop
//! (or [`ServerRuntime::serve_until`]). [`ClientRuntime`] joins by name and
//! offers blocking calls — `add`, `get`, `aggregate`, `vote` — that drive
//! the client agent until the call finishes.

use std::collections::VecDeque;
use std::io::{self, ErrorKind};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use protoplane_inc::client::{CallId, ClientAgent, ClientStats, ClientTuning, Event, Outcome};
use protoplane_inc::controller::Registration;
use protoplane_inc::faults::{Faults, Injector};
use protoplane_inc::messages::{Reply, Request};
use protoplane_inc::packet::Addr;
use protoplane_inc::plan::AppPlan;
use protoplane_inc::server::{ServerAgent, ServerEvent, ServerStats, ServerTuning};
use protoplane_inc::switch::ControlReply;
use serde_json::Value;

use crate::lines::{call, write_value, LineReader};
use crate::{node_addr, now_us, DelayQueue, Error};

/// Where the controller and the switches' control planes are.
#[derive(Clone, Debug)]
pub struct Options {
    /// Address the agent binds (and where every node is).
    pub host: IpAddr,
    /// The controller.
    pub controller: SocketAddr,
    /// Control planes of the switches, in chain order (server agents only).
    pub switch_control: Vec<SocketAddr>,
    /// Faults on what this agent sends (for runs without a data plane,
    /// where no switch port can inject them).
    pub faults: Faults,
    /// Seed of the injector.
    pub seed: u64,
}

enum Input {
    Udp(Vec<u8>),
    Control(usize, Result<ControlReply, protoplane_inc::Error>),
    Controller(Result<Reply, protoplane_inc::Error>),
    Closed(&'static str),
    /// Something other than the network wants the state machine's thread
    /// (a call for a spawned client, see [`ClientRuntime::spawn`]).
    Wake,
}

fn invalid(e: impl ToString) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, e.to_string())
}

/// A UDP socket with a reader thread.
#[derive(Debug)]
struct Io {
    sock: UdpSocket,
    host: IpAddr,
    node: u16,
    tx: Sender<Input>,
    rx: Receiver<Input>,
    injector: Option<Injector>,
    delayed: DelayQueue,
}

impl Io {
    fn bind(opts: &Options) -> io::Result<Io> {
        let host = opts.host;
        let sock = UdpSocket::bind(SocketAddr::new(host, 0))?;
        let node = sock.local_addr()?.port();
        let (tx, rx) = mpsc::channel();
        let reader = sock.try_clone()?;
        let utx = tx.clone();
        thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            loop {
                match reader.recv_from(&mut buf) {
                    Ok((n, _)) => {
                        if utx.send(Input::Udp(buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                    Err(e)
                        if e.kind() == ErrorKind::ConnectionRefused
                            || e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => return,
                }
            }
        });
        let injector =
            opts.faults.any().then(|| Injector::new(opts.faults, opts.seed ^ u64::from(node)));
        Ok(Io { sock, host, node, tx, rx, injector, delayed: DelayQueue::default() })
    }

    fn send(&mut self, dst: u16, bytes: &[u8]) {
        let now = now_us();
        let times = match &mut self.injector {
            Some(inj) => inj.schedule(now),
            None => vec![now],
        };
        for at in times {
            if at <= now {
                // A refused or dropped datagram is a lost packet; the agents retransmit.
                let _ = self.sock.send_to(bytes, node_addr(self.host, dst));
            } else {
                self.delayed.push(at, dst, bytes.to_vec());
            }
        }
    }

    /// Sends the delayed datagrams that are due; returns when the next is.
    fn send_due(&mut self) -> Option<u64> {
        let now = now_us();
        while let Some((dst, bytes)) = self.delayed.pop_due(now) {
            let _ = self.sock.send_to(&bytes, node_addr(self.host, dst));
        }
        self.delayed.next()
    }

    fn lines(
        &self,
        stream: TcpStream,
        map: impl Fn(Option<Value>) -> Option<Input> + Send + 'static,
    ) {
        let tx = self.tx.clone();
        thread::spawn(move || {
            let mut r = LineReader::new(stream);
            loop {
                let v = r.next_value().ok().flatten();
                let end = v.is_none();
                if let Some(i) = map(v) {
                    if tx.send(i).is_err() {
                        return;
                    }
                }
                if end {
                    return;
                }
            }
        });
    }

    /// Waits up to `wait` for one input, then takes whatever else is queued.
    fn inputs(&self, wait: Duration) -> Vec<Input> {
        let mut v = Vec::new();
        match self.rx.recv_timeout(wait) {
            Ok(i) => v.push(i),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return v,
        }
        while v.len() < 4096 {
            match self.rx.try_recv() {
                Ok(i) => v.push(i),
                Err(_) => break,
            }
        }
        v
    }
}

fn controller_call(addr: SocketAddr, req: &Request) -> io::Result<(TcpStream, Reply)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    let mut reader = LineReader::new(stream.try_clone()?);
    let v = call(&mut stream, &mut reader, &req.to_json())?;
    Ok((stream, Reply::from_json(&v).map_err(invalid)?))
}

fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn until(deadline: Option<u64>, cap: Duration) -> Duration {
    match deadline {
        Some(t) => Duration::from_micros(t.saturating_sub(now_us())).min(cap),
        None => cap,
    }
}

/// A server agent with its sockets.
///
/// The agent does not need its controller once registered: when the
/// controller goes away it keeps serving (the data plane keeps the
/// application), reconnects every [`RECONNECT`] and reattaches the
/// application to the controller that answers — the same one restarted,
/// which adopted the application from the switches.
#[derive(Debug)]
pub struct ServerRuntime {
    agent: ServerAgent,
    io: Io,
    /// `None` while the controller is away; reconnect at the time given.
    controller: Option<TcpStream>,
    reconnect_at: Option<Instant>,
    /// The application's failure after losing the data plane was logged.
    failure_logged: bool,
    /// Regroups logged, and whether the end of them was.
    regroups_logged: usize,
    regroup_failure_logged: bool,
    /// The rebuild of what the data plane held was logged.
    rebuild_logged: bool,
    links: Vec<(TcpStream, VecDeque<u64>)>,
    events: VecDeque<ServerEvent>,
    answer_probes: bool,
    controller_addr: SocketAddr,
    name: String,
}

impl ServerRuntime {
    /// Registers `reg` (its `server` is set to this agent's node) and
    /// connects to the data plane; the agent applies `reg.modify` like the
    /// data plane does.
    pub fn register(
        opts: &Options,
        reg: Registration,
        tuning: ServerTuning,
    ) -> io::Result<ServerRuntime> {
        let io = Io::bind(opts)?;
        let name = reg.name.clone();
        let modify = reg.modify;
        let (controller, reply) = controller_call(
            opts.controller,
            &Request::Register(Registration { server: io.node, ..reg }),
        )?;
        let plan = match reply {
            Reply::Plan(p, _) => p,
            Reply::Error(e) => return Err(io::Error::other(format!("registration refused: {e}"))),
            other => return Err(invalid(format!("unexpected reply {other:?}"))),
        };
        io.lines(controller.try_clone()?, |v| match v {
            Some(v) => Some(Input::Controller(Reply::from_json(&v))),
            None => Some(Input::Closed("controller")),
        });
        let mut links = Vec::new();
        if plan.switch.is_some() {
            if opts.switch_control.len() < usize::from(plan.switches) {
                return Err(io::Error::other(format!(
                    "the plan uses {} switches; {} control addresses given",
                    plan.switches,
                    opts.switch_control.len()
                )));
            }
            for (i, addr) in opts.switch_control.iter().take(usize::from(plan.switches)).enumerate()
            {
                let s = TcpStream::connect(addr)?;
                s.set_nodelay(true)?;
                io.lines(s.try_clone()?, move |v| match v {
                    Some(v) => Some(Input::Control(i, ControlReply::from_json(&v))),
                    None => Some(Input::Closed("switch control")),
                });
                links.push((s, VecDeque::new()));
            }
        }
        let agent = ServerAgent::new(plan, io.node, modify, tuning);
        Ok(ServerRuntime {
            agent,
            io,
            controller: Some(controller),
            reconnect_at: None,
            failure_logged: false,
            regroups_logged: 0,
            regroup_failure_logged: false,
            rebuild_logged: false,
            links,
            events: VecDeque::new(),
            answer_probes: true,
            controller_addr: opts.controller,
            name,
        })
    }

    /// The plan the controller gave.
    pub fn plan(&self) -> &AppPlan {
        self.agent.plan()
    }

    /// This agent's node.
    pub fn node(&self) -> u16 {
        self.io.node
    }

    /// Counters.
    pub fn stats(&self) -> ServerStats {
        self.agent.stats()
    }

    /// Keys with a data-plane cell.
    pub fn resident_keys(&self) -> usize {
        self.agent.resident_keys()
    }

    /// Asks the controller where the members that joined are.
    pub fn refresh_members(&mut self) -> io::Result<()> {
        let (_, reply) =
            controller_call(self.controller_addr, &Request::Lookup { name: self.name.clone() })?;
        if let Reply::Plan(_, nodes) = reply {
            for (m, n) in nodes.iter().enumerate() {
                if let Some(n) = n {
                    self.agent.set_member_node(m as u16, *n);
                }
            }
        }
        Ok(())
    }

    /// Members the agent has heard from or been told about.
    pub fn joined(&self) -> usize {
        self.agent.known_members()
    }

    /// Stops answering the controller's probes (a hung process, for tests).
    pub fn ignore_probes(&mut self) {
        self.answer_probes = false;
    }

    /// Tells the agent where members are.
    pub fn set_member_nodes(&mut self, nodes: &[u16]) {
        self.agent.set_member_nodes(nodes);
    }

    /// Opens a vote instance (see `ServerAgent::propose`).
    pub fn propose(&mut self, instance: u32, value: i64) -> Result<(), Error> {
        // Not flushed here: proposals made one after another open their
        // slots with one control request (the next `step` sends it).
        Ok(self.agent.propose(now_us(), instance, value)?)
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.events.pop_front()
    }

    fn flush(&mut self) {
        while let Some(t) = self.agent.poll_transmit() {
            self.io.send(t.dst, &t.bytes);
        }
        while let Some(r) = self.agent.poll_control() {
            match self.links.get_mut(usize::from(r.chain_index)) {
                Some((s, tokens)) => {
                    if write_value(s, &r.control.to_json()).is_ok() {
                        tokens.push_back(r.token);
                    }
                }
                None => {
                    let reply = ControlReply::Refused(format!("no switch {}", r.chain_index));
                    self.agent.handle_control(now_us(), r.token, reply);
                }
            }
        }
        while let Some(e) = self.agent.poll_event() {
            self.events.push_back(e);
        }
    }

    /// Runs the agent for at most `max_wait`: one wait for input, what
    /// else is queued, due timers. Errors when the controller or a switch
    /// connection is gone.
    pub fn step(&mut self, max_wait: Duration) -> io::Result<()> {
        self.flush();
        let next = earliest(self.agent.poll_timeout(), self.io.send_due());
        let wait = until(next, max_wait);
        for input in self.io.inputs(wait) {
            let now = now_us();
            match input {
                Input::Udp(d) => self.agent.handle(now, &d),
                Input::Control(i, reply) => {
                    let token = self.links.get_mut(i).and_then(|l| l.1.pop_front());
                    if let Some(t) = token {
                        let reply = reply.unwrap_or_else(|e| ControlReply::Refused(e.to_string()));
                        self.agent.handle_control(now, t, reply);
                    }
                }
                Input::Controller(Ok(Reply::Probe(app))) => {
                    if let (true, Some(c)) = (self.answer_probes, &mut self.controller) {
                        let _ = write_value(c, &Request::Heartbeat { app }.to_json());
                    }
                }
                Input::Controller(_) | Input::Wake => {}
                Input::Closed("controller") => {
                    // Serve on; the data plane still holds the application.
                    self.controller = None;
                    self.reconnect_at = Some(Instant::now() + RECONNECT);
                }
                Input::Closed("switch control") => {
                    // The switch died: everything on this agent from now on.
                    self.links.clear();
                    let _ = self.refresh_members();
                    if self.agent.data_plane_lost(now) {
                        tracing::warn!(
                            "inc server agent: the data plane is gone; the application \
                             continues on the server path (what the switch held is rebuilt \
                             from the members' accounts)"
                        );
                    }
                }
                Input::Closed(what) => {
                    return Err(io::Error::other(format!("{what} connection closed")))
                }
            }
        }
        let now = now_us();
        if self.agent.poll_timeout().is_some_and(|t| t <= now) {
            self.agent.handle_timeout(now);
        }
        if let (false, Some((us, n))) = (self.rebuild_logged, self.agent.map_rebuilt()) {
            self.rebuild_logged = true;
            tracing::info!(
                "inc server agent: the values the data plane held were rebuilt from {n} \
                 members' accounts, {:.1} ms after it was lost",
                us as f64 / 1000.0
            );
        }
        while self.regroups_logged < self.agent.regroups() {
            self.regroups_logged += 1;
            tracing::warn!(
                "inc server agent: members {:#b} lost their lease; synchronous aggregation \
                 goes on without them (regroup {})",
                self.agent.members_out(),
                self.regroups_logged
            );
        }
        if let (false, Some(why)) = (self.regroup_failure_logged, self.agent.regroup_failure()) {
            self.regroup_failure_logged = true;
            tracing::warn!("inc server agent: synchronous aggregation cannot go on: {why}");
        }
        if let (false, Some(why)) = (self.failure_logged, self.agent.fallback_failure()) {
            self.failure_logged = true;
            tracing::warn!(
                "inc server agent: the data plane is gone and held values of the application \
                 that cannot be rebuilt ({why}): every call fails"
            );
        }
        self.flush();
        if self.reconnect_at.is_some_and(|t| Instant::now() >= t) {
            self.reattach();
        }
        Ok(())
    }

    /// Whether the controller connection is up.
    pub fn connected(&self) -> bool {
        self.controller.is_some()
    }

    /// One attempt to reattach to the controller; on failure the next is
    /// [`RECONNECT`] later.
    fn reattach(&mut self) {
        let req = Request::Reattach { name: self.name.clone(), plan: self.agent.plan().clone() };
        match controller_call(self.controller_addr, &req) {
            Ok((stream, Reply::Plan(..))) => {
                let reader = stream.try_clone();
                if let Ok(r) = reader {
                    self.io.lines(r, |v| match v {
                        Some(v) => Some(Input::Controller(Reply::from_json(&v))),
                        None => Some(Input::Closed("controller")),
                    });
                    self.controller = Some(stream);
                    self.reconnect_at = None;
                    return;
                }
            }
            Ok((_, Reply::Error(why))) => {
                tracing::warn!("inc server agent: the controller refused to reattach: {why}");
            }
            Ok(_) | Err(_) => {}
        }
        self.reconnect_at = Some(Instant::now() + RECONNECT);
    }

    /// Steps until `done` holds or `limit` passes; `true` if `done` held.
    pub fn serve_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut ServerRuntime) -> bool,
    ) -> io::Result<bool> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if done(self) {
                return Ok(true);
            }
            self.step(Duration::from_millis(5))?;
        }
        Ok(done(self))
    }

    /// Releases the application's resources at the controller.
    pub fn deregister(mut self) -> io::Result<()> {
        let app = self.agent.plan().app;
        match &mut self.controller {
            Some(c) => write_value(c, &Request::Deregister { app }.to_json()),
            None => Err(io::Error::other("the controller is away")),
        }
    }
}

/// How often a server agent whose controller went away tries to reach it.
pub const RECONNECT: Duration = Duration::from_millis(200);

/// A client agent with its socket.
#[derive(Debug)]
pub struct ClientRuntime {
    agent: ClientAgent,
    io: Io,
    events: VecDeque<Event>,
    /// How long a call may take before it fails.
    pub call_timeout: Duration,
}

impl ClientRuntime {
    /// Joins application `name` as member `member`.
    pub fn join(
        opts: &Options,
        name: &str,
        member: u16,
        tuning: ClientTuning,
    ) -> io::Result<ClientRuntime> {
        let io = Io::bind(opts)?;
        let req = Request::Join { name: name.into(), member, node: io.node };
        let (_stream, reply) = controller_call(opts.controller, &req)?;
        let plan = match reply {
            Reply::Plan(p, _) => p,
            Reply::Error(e) => return Err(io::Error::other(format!("join refused: {e}"))),
            other => return Err(invalid(format!("unexpected reply {other:?}"))),
        };
        let agent = ClientAgent::new(plan, member, io.node, tuning);
        Ok(ClientRuntime {
            agent,
            io,
            events: VecDeque::new(),
            call_timeout: Duration::from_secs(120),
        })
    }

    /// The plan.
    pub fn plan(&self) -> &AppPlan {
        self.agent.plan()
    }

    /// This agent's node.
    pub fn node(&self) -> u16 {
        self.io.node
    }

    /// Counters.
    pub fn stats(&self) -> ClientStats {
        self.agent.stats()
    }

    fn step(&mut self, max_wait: Duration) {
        let now = now_us();
        while let Some(t) = self.agent.poll_transmit(now) {
            self.io.send(t.dst, &t.bytes);
        }
        let next = earliest(self.agent.poll_timeout(), self.io.send_due());
        let wait = until(next, max_wait);
        for input in self.io.inputs(wait) {
            if let Input::Udp(d) = input {
                self.agent.handle(now_us(), &d);
            }
        }
        let now = now_us();
        if self.agent.poll_timeout().is_some_and(|t| t <= now) {
            self.agent.handle_timeout(now);
        }
        while let Some(t) = self.agent.poll_transmit(now) {
            self.io.send(t.dst, &t.bytes);
        }
        while let Some(e) = self.agent.poll_event() {
            self.events.push_back(e);
        }
    }

    fn wait(&mut self, call: CallId) -> Result<Outcome, Error> {
        let end = Instant::now() + self.call_timeout;
        loop {
            if let Some(i) = self
                .events
                .iter()
                .position(|e| matches!(e, Event::Done { call: c, .. } if *c == call))
            {
                if let Some(Event::Done { outcome, .. }) = self.events.remove(i) {
                    return match outcome {
                        Outcome::Failed(why) => Err(Error::DataPlaneLost(why)),
                        o => Ok(o),
                    };
                }
            }
            if Instant::now() >= end {
                return Err(Error::TimedOut { call: None, after: Some(self.call_timeout) });
            }
            self.step(Duration::from_millis(5));
        }
    }

    /// `Map.addTo`.
    pub fn add(&mut self, items: &[(Vec<u8>, i64)]) -> Result<(), Error> {
        let call = self.agent.add(items)?;
        self.wait(call).map(|_| ())
    }

    /// `Map.get`.
    pub fn get(&mut self, keys: &[Vec<u8>]) -> Result<Vec<(Vec<u8>, i64)>, Error> {
        let call = self.agent.get(keys)?;
        match self.wait(call)? {
            Outcome::Values(v) => Ok(v),
            other => Err(Error::UnexpectedOutcome(other)),
        }
    }

    /// `Map.clear`.
    pub fn clear(&mut self) -> Result<(), Error> {
        let call = self.agent.clear();
        self.wait(call).map(|_| ())
    }

    /// Leaves: gives the server agent this member's account of what the
    /// data plane applied for it, so the application's values survive the
    /// data plane dying after this member is gone
    /// ([`protoplane_inc::client::ClientAgent::leave`]). The last call.
    pub fn leave(&mut self) -> Result<(), Error> {
        let call = self.agent.leave();
        self.wait(call).map(|_| ())
    }

    /// Synchronous aggregation: the element-wise sums.
    pub fn aggregate(&mut self, values: &[i32]) -> Result<Vec<i64>, Error> {
        self.aggregate_over(values).map(|(sums, _)| sums)
    }

    /// Synchronous aggregation: the element-wise sums and the members they
    /// are over (a bit each; fewer than all only under `MemberLoss:
    /// continue`, see [`protoplane_inc::membership`]).
    pub fn aggregate_over(&mut self, values: &[i32]) -> Result<(Vec<i64>, u64), Error> {
        let call = self.agent.aggregate(values);
        match self.wait(call)? {
            Outcome::Aggregated { sums, members } => Ok((sums, members)),
            other => Err(Error::UnexpectedOutcome(other)),
        }
    }

    /// A `CntFwd` vote.
    pub fn vote(&mut self, instance: u32, value: i32, addr: Addr) -> Result<(), Error> {
        let call = self.agent.vote(instance, value, addr);
        self.wait(call).map(|_| ())
    }

    /// The next event that is not a finished call (a proposal, a commit),
    /// waiting up to `timeout`.
    pub fn next_event(&mut self, timeout: Duration) -> Option<Event> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(i) = self.events.iter().position(|e| !matches!(e, Event::Done { .. })) {
                return self.events.remove(i);
            }
            if Instant::now() >= end {
                return None;
            }
            self.step(Duration::from_millis(5));
        }
    }

    /// Starts a vote without waiting for it (votes for many instances can
    /// be in flight); finished votes are dropped from the event queue.
    pub fn vote_async(&mut self, instance: u32, value: i32, addr: Addr) {
        self.agent.vote(instance, value, addr);
    }

    /// Runs the agent until it is idle (everything acknowledged) or `limit`.
    pub fn drain(&mut self, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        while !self.agent.is_idle() {
            if Instant::now() >= end {
                return false;
            }
            self.step(Duration::from_millis(5));
            self.events.retain(|e| !matches!(e, Event::Done { outcome: Outcome::Voted, .. }));
        }
        true
    }
}

// ---------------------------------------------------------------------------
// A client agent on its own thread.

/// How many events (proposals, commits) a [`ClientHandle`] holds for the
/// application before it drops the oldest: the network decides how many
/// arrive, so the queue must not grow with them.
pub const EVENT_QUEUE: usize = 4096;

/// How many proposals a [`ClientHandle`] remembers for
/// [`ClientHandle::vote_for`] (the newest).
pub const PROPOSALS_KEPT: usize = 65_536;

/// A call for the agent's thread.
enum Cmd {
    Add(Vec<(Vec<u8>, i64)>),
    Get(Vec<Vec<u8>>),
    Aggregate(Vec<i32>),
    Vote(u32, i32, Addr),
    VoteFor(u32),
    Clear,
    Leave,
}

type Reply1 = tokio::sync::oneshot::Sender<Result<Outcome, Error>>;

/// A client agent running on its own thread, for async code: calls are
/// futures, any number can be in flight, and proposals and commits arrive
/// on [`ClientHandle::next_event`]. Made by [`ClientRuntime::spawn`]; the
/// thread ends when every handle is dropped and no call is in flight.
#[derive(Clone, Debug)]
pub struct ClientHandle {
    calls: Sender<(Cmd, Reply1)>,
    wake: Sender<Input>,
    events: std::sync::Arc<std::sync::Mutex<VecDeque<Event>>>,
    notify: std::sync::Arc<tokio::sync::Notify>,
    stats: std::sync::Arc<std::sync::Mutex<ClientStats>>,
    node: u16,
    members: u16,
}

impl Cmd {
    /// The call's name.
    fn name(&self) -> &'static str {
        match self {
            Cmd::Add(_) => "add",
            Cmd::Get(_) => "get",
            Cmd::Aggregate(_) => "aggregate",
            Cmd::Vote(..) | Cmd::VoteFor(_) => "vote",
            Cmd::Clear => "clear",
            Cmd::Leave => "leave",
        }
    }
}

impl std::fmt::Debug for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl ClientRuntime {
    /// Moves the agent to a thread of its own and returns a handle to it.
    pub fn spawn(self) -> ClientHandle {
        let (calls, rx) = mpsc::channel::<(Cmd, Reply1)>();
        let h = ClientHandle {
            calls,
            wake: self.io.tx.clone(),
            events: Default::default(),
            notify: Default::default(),
            stats: Default::default(),
            node: self.io.node,
            members: self.agent.plan().members,
        };
        let (events, notify, stats) = (h.events.clone(), h.notify.clone(), h.stats.clone());
        thread::spawn(move || self.drive(rx, events, notify, stats));
        h
    }

    fn drive(
        mut self,
        calls: Receiver<(Cmd, Reply1)>,
        events: std::sync::Arc<std::sync::Mutex<VecDeque<Event>>>,
        notify: std::sync::Arc<tokio::sync::Notify>,
        stats: std::sync::Arc<std::sync::Mutex<ClientStats>>,
    ) {
        let mut pending: std::collections::HashMap<CallId, (Reply1, Instant)> = Default::default();
        let mut proposals: std::collections::HashMap<u32, (i64, Addr)> = Default::default();
        let mut proposal_order: VecDeque<u32> = VecDeque::new();
        let mut open = true;
        while open || !pending.is_empty() {
            loop {
                let (cmd, reply) = match calls.try_recv() {
                    Ok(c) => c,
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                };
                let started = match cmd {
                    Cmd::Add(items) => self.agent.add(&items).map_err(Error::from),
                    Cmd::Get(keys) => self.agent.get(&keys).map_err(Error::from),
                    Cmd::Aggregate(values) => Ok(self.agent.aggregate(&values)),
                    Cmd::Vote(instance, value, addr) => Ok(self.agent.vote(instance, value, addr)),
                    Cmd::VoteFor(instance) => match proposals.get(&instance) {
                        Some((value, addr)) => Ok(self.agent.vote(instance, *value as i32, *addr)),
                        None => Err(Error::NoProposal { instance }),
                    },
                    Cmd::Clear => Ok(self.agent.clear()),
                    Cmd::Leave => Ok(self.agent.leave()),
                };
                match started {
                    Ok(call) => {
                        pending.insert(call, (reply, Instant::now() + self.call_timeout));
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            self.step(Duration::from_millis(5));
            let mut woke = false;
            for e in self.events.drain(..) {
                match e {
                    Event::Done { call, outcome } => {
                        if let Some((reply, _)) = pending.remove(&call) {
                            let _ = reply.send(match outcome {
                                Outcome::Failed(why) => Err(Error::DataPlaneLost(why)),
                                o => Ok(o),
                            });
                        }
                    }
                    other => {
                        if let Event::Proposal { instance, value, addr } = &other {
                            if proposals.insert(*instance, (*value, *addr)).is_none() {
                                proposal_order.push_back(*instance);
                                if proposal_order.len() > PROPOSALS_KEPT {
                                    if let Some(old) = proposal_order.pop_front() {
                                        proposals.remove(&old);
                                    }
                                }
                            }
                        }
                        let mut q = events.lock().unwrap_or_else(|p| p.into_inner());
                        if q.len() >= EVENT_QUEUE {
                            q.pop_front();
                        }
                        q.push_back(other);
                        woke = true;
                    }
                }
            }
            if woke {
                notify.notify_waiters();
                notify.notify_one();
            }
            let now = Instant::now();
            pending.retain(|_, (_, deadline)| *deadline > now);
            *stats.lock().unwrap_or_else(|p| p.into_inner()) = self.agent.stats();
        }
    }
}

impl ClientHandle {
    /// The application's members (when it joined).
    pub fn members(&self) -> u16 {
        self.members
    }

    /// Submits `cmd` now (so calls started one after another are in flight
    /// together) and returns the future of its outcome.
    fn call(&self, cmd: Cmd) -> impl std::future::Future<Output = Result<Outcome, Error>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let what = cmd.name();
        let sent = self.calls.send((cmd, tx)).is_ok();
        let _ = self.wake.send(Input::Wake);
        async move {
            if !sent {
                return Err(Error::AgentGone);
            }
            match rx.await {
                Ok(r) => r,
                // The thread dropped the call: its deadline passed.
                Err(_) => Err(Error::TimedOut { call: Some(what), after: None }),
            }
        }
    }

    /// This agent's node.
    pub fn node(&self) -> u16 {
        self.node
    }

    /// Counters (as of the agent's last step).
    pub fn stats(&self) -> ClientStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Map.addTo`.
    pub async fn add(&self, items: Vec<(Vec<u8>, i64)>) -> Result<(), Error> {
        self.call(Cmd::Add(items)).await.map(|_| ())
    }

    /// `Map.get`: the value of each key, in order.
    pub async fn get(&self, keys: Vec<Vec<u8>>) -> Result<Vec<(Vec<u8>, i64)>, Error> {
        match self.call(Cmd::Get(keys)).await? {
            Outcome::Values(v) => Ok(v),
            other => Err(Error::UnexpectedOutcome(other)),
        }
    }

    /// `Map.clear`.
    pub async fn clear(&self) -> Result<(), Error> {
        self.call(Cmd::Clear).await.map(|_| ())
    }

    /// Leaves: gives the server agent this member's account of what the
    /// data plane applied for it, so the application's values survive the
    /// data plane dying after this member is gone
    /// ([`protoplane_inc::client::ClientAgent::leave`]). The last call.
    pub async fn leave(&self) -> Result<(), Error> {
        self.call(Cmd::Leave).await.map(|_| ())
    }

    /// Synchronous aggregation: the element-wise sums.
    pub async fn aggregate(&self, values: Vec<i32>) -> Result<Vec<i64>, Error> {
        self.aggregate_over(values).await.map(|(sums, _)| sums)
    }

    /// Synchronous aggregation: the element-wise sums and the members they
    /// are over (a bit each; fewer than all only under `MemberLoss:
    /// continue`, see [`protoplane_inc::membership`]).
    pub async fn aggregate_over(&self, values: Vec<i32>) -> Result<(Vec<i64>, u64), Error> {
        match self.call(Cmd::Aggregate(values)).await? {
            Outcome::Aggregated { sums, members } => Ok((sums, members)),
            other => Err(Error::UnexpectedOutcome(other)),
        }
    }

    /// A `CntFwd` vote for `value` in the slot `addr`.
    pub async fn vote(&self, instance: u32, value: i32, addr: Addr) -> Result<(), Error> {
        self.call(Cmd::Vote(instance, value, addr)).await.map(|_| ())
    }

    /// A `CntFwd` vote for the value the server proposed for `instance`
    /// (one of the newest [`PROPOSALS_KEPT`] proposals this agent saw).
    /// The vote is submitted when this is called, not when the future is
    /// first polled, so votes started in a row are in flight together.
    pub fn vote_for(
        &self,
        instance: u32,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send + 'static {
        let reply = self.call(Cmd::VoteFor(instance));
        async move { reply.await.map(|_| ()) }
    }

    /// The next proposal or commit, waiting up to `timeout` (the newest
    /// [`EVENT_QUEUE`] are kept).
    pub async fn next_event(&self, timeout: Duration) -> Option<Event> {
        let end = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.notify.notified();
            if let Some(e) = self.events.lock().unwrap_or_else(|p| p.into_inner()).pop_front() {
                return Some(e);
            }
            if tokio::time::timeout_at(end, notified).await.is_err() {
                return self.events.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
            }
        }
    }
}
