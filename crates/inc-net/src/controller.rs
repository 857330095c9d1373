//! `protoplane controller`: registration, name lookup and memory for the
//! applications, on a TCP port (JSON lines, `protoplane_inc::messages`).
//!
//! At start it connects to each switch's control plane and asks for its
//! shape (`describe`); with no switch it runs without a data plane and
//! every plan it hands out has no memory. One thread runs the
//! [`Controller`]; each agent connection has a reader thread. A
//! registration is answered only after every switch installed the
//! application, so no agent sends before the data plane holds it.

use std::collections::HashMap;
use std::io::{self, ErrorKind};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use protoplane_inc::controller::{Controller, ControllerEvent, ControllerTuning, DataPlane};
use protoplane_inc::messages::{Reply, Request};
use protoplane_inc::switch::{Control, ControlReply};

use crate::lines::{accept_lines, call, Incoming, LineReader, Writers};
use crate::now_us;

/// How to run a controller.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Address to bind.
    pub host: IpAddr,
    /// TCP port for agents; 0 picks one.
    pub port: u16,
    /// Control-plane addresses of the switches, in chain order (empty: no
    /// data plane).
    pub switches: Vec<SocketAddr>,
    /// Timeouts.
    pub tuning: ControllerTuning,
}

struct SwitchLink {
    stream: TcpStream,
    reader: LineReader<TcpStream>,
}

impl SwitchLink {
    fn call(&mut self, c: &Control) -> io::Result<ControlReply> {
        let v = call(&mut self.stream, &mut self.reader, &c.to_json())?;
        ControlReply::from_json(&v).map_err(|e| io::Error::new(ErrorKind::InvalidData, e))
    }
}

/// A bound controller.
#[derive(Debug)]
pub struct Runner {
    listener: TcpListener,
    opts: ControllerOptions,
}

/// Binds the port; returns it and the loop to run.
pub fn bind(opts: ControllerOptions) -> io::Result<(SocketAddr, Runner)> {
    let listener = TcpListener::bind(SocketAddr::new(opts.host, opts.port))?;
    Ok((listener.local_addr()?, Runner { listener, opts }))
}

impl Runner {
    /// Runs until `stop` is set. `log` gets one line per registration,
    /// probe and reclaim.
    pub fn run(self, stop: Arc<AtomicBool>, mut log: impl FnMut(&str)) -> io::Result<()> {
        let mut links = Vec::new();
        let mut plane: Option<DataPlane> = None;
        for addr in &self.opts.switches {
            let stream = TcpStream::connect(addr)?;
            stream.set_nodelay(true)?;
            let reader = LineReader::new(stream.try_clone()?);
            let mut link = SwitchLink { stream, reader };
            match link.call(&Control::Describe)? {
                ControlReply::Described { node, groups, registers, flows, window, .. } => {
                    let p = plane.get_or_insert(DataPlane {
                        switches: Vec::new(),
                        groups,
                        registers,
                        flows,
                        window,
                    });
                    p.switches.push(node);
                    p.groups = p.groups.min(groups);
                    p.registers = p.registers.min(registers);
                    p.flows = p.flows.min(flows);
                    if p.window != window {
                        return Err(io::Error::new(
                            ErrorKind::InvalidInput,
                            "switches of a chain need the same window",
                        ));
                    }
                }
                other => {
                    return Err(io::Error::new(
                        ErrorKind::InvalidData,
                        format!("describe: {other:?}"),
                    ))
                }
            }
            links.push(link);
        }
        let mut controller = Controller::new(plane, self.opts.tuning, secret()?);
        // What the switches hold stays taken (this controller may be a
        // restart): adopted until the server agents reattach.
        for link in &mut links {
            match link.call(&Control::Apps)? {
                ControlReply::Apps(held) => {
                    controller.adopt(now_us(), held);
                }
                other => {
                    return Err(io::Error::new(ErrorKind::InvalidData, format!("apps: {other:?}")))
                }
            }
        }
        let mut links: Vec<Option<SwitchLink>> = links.into_iter().map(Some).collect();
        let (tx, rx) = mpsc::channel();
        let writers = Writers::default();
        let listener = self.listener.try_clone()?;
        let w2 = writers.clone();
        thread::spawn(move || accept_lines(listener, tx, w2, || {}));
        // Which connection registered which application (for probes).
        let mut owners: HashMap<u16, u64> = HashMap::new();
        while !stop.load(Ordering::Relaxed) {
            match rx.recv_timeout(Duration::from_millis(5)) {
                Ok(Incoming::Line(conn, v)) => {
                    let now = now_us();
                    let answer = match Request::from_json(&v) {
                        Err(why) => Answer::Now(Reply::Error(why.to_string())),
                        Ok(r) => handle(&mut controller, now, r, conn, &mut owners, &mut log),
                    };
                    // Install before answering: drain the switch requests
                    // now, and answer with the plan as the switches left it
                    // (a refused install leaves no data plane in it).
                    flush(&mut controller, &mut links, &mut log);
                    let reply = match answer {
                        Answer::Now(r) => r,
                        Answer::Plan { app, member } => {
                            let plan = match member {
                                Some(m) => controller.member_plan(app, m),
                                None => controller.plan_of(app),
                            };
                            match plan {
                                Some(p) => Reply::Plan(p, Vec::new()),
                                None => Reply::Error(format!("application {app} vanished")),
                            }
                        }
                    };
                    writers.send(conn, &reply.to_json());
                }
                Ok(Incoming::Closed(conn)) => writers.forget(conn),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            let now = now_us();
            if controller.poll_timeout().is_some_and(|t| t <= now) {
                controller.handle_timeout(now);
                flush(&mut controller, &mut links, &mut log);
            }
            while let Some(e) = controller.poll_event() {
                match e {
                    ControllerEvent::Probe { app, .. } => {
                        log(&format!("probe application {app}"));
                        if let Some(conn) = owners.get(&app) {
                            writers.send(*conn, &Reply::Probe(app).to_json());
                        }
                    }
                    ControllerEvent::Reclaimed { app, name } => {
                        owners.remove(&app);
                        log(&format!("reclaimed application {app} ({name}): no heartbeat"));
                    }
                    ControllerEvent::Refused { app, why } => {
                        log(&format!(
                            "a switch refused application {app} ({why}): it runs on its server agent"
                        ));
                    }
                    ControllerEvent::Adopted { app } => {
                        log(&format!(
                            "adopted application {app} from the data plane: waiting for its server agent"
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// What to answer a request with, once the switches have answered.
enum Answer {
    Now(Reply),
    /// The application's plan (a member's, with its incarnation).
    Plan {
        app: u16,
        member: Option<u16>,
    },
}

fn handle(
    c: &mut Controller,
    now: u64,
    r: Request,
    conn: u64,
    owners: &mut HashMap<u16, u64>,
    log: &mut impl FnMut(&str),
) -> Answer {
    match r {
        Request::Register(reg) => {
            let name = reg.name.clone();
            match c.register(now, reg) {
                Ok(plan) => {
                    owners.insert(plan.app, conn);
                    log(&format!(
                        "registered {name} as application {} ({} members, memory {:?})",
                        plan.app, plan.members, plan.memory
                    ));
                    Answer::Plan { app: plan.app, member: None }
                }
                Err(e) => Answer::Now(Reply::Error(e.to_string())),
            }
        }
        Request::Reattach { name, plan } => match c.reattach(now, &name, plan) {
            Ok(plan) => {
                owners.insert(plan.app, conn);
                log(&format!("application {} ({name}) reattached", plan.app));
                Answer::Plan { app: plan.app, member: None }
            }
            Err(e) => Answer::Now(Reply::Error(e.to_string())),
        },
        Request::Join { name, member, node } => match c.join(now, &name, member, node) {
            Ok(plan) => {
                log(&format!(
                    "member {member} of application {} joined at node {node} (incarnation {})",
                    plan.app, plan.incarnation
                ));
                Answer::Plan { app: plan.app, member: Some(member) }
            }
            Err(e) => Answer::Now(Reply::Error(e.to_string())),
        },
        Request::Lookup { name } => Answer::Now(match c.lookup(&name) {
            Some((plan, members)) => Reply::Plan(plan, members),
            None => Reply::Error(format!("no application named {name:?}")),
        }),
        Request::Heartbeat { app } => {
            c.heartbeat(now, app);
            Answer::Now(Reply::Ok)
        }
        Request::Deregister { app } => Answer::Now(match c.deregister(app) {
            Ok(()) => {
                owners.remove(&app);
                log(&format!("deregistered application {app}"));
                Reply::Ok
            }
            Err(e) => Reply::Error(e.to_string()),
        }),
    }
}

/// The secret the applications' MAC keys are derived from: 16 bytes of
/// the operating system's random source.
fn secret() -> io::Result<protoplane_inc::mac::Key> {
    use std::io::Read;
    let mut k = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut k)?;
    Ok(protoplane_inc::mac::Key(k))
}

/// Delivers the controller's requests to the switches. A switch whose
/// connection fails is gone for good (its state with it): its requests
/// are refused from then on and the controller goes on with the others
/// (the applications' server agents fall back on their own).
fn flush(c: &mut Controller, links: &mut [Option<SwitchLink>], log: &mut impl FnMut(&str)) {
    while let Some((token, chain, control)) = c.poll_control() {
        let reply = match links.get_mut(usize::from(chain)) {
            Some(Some(l)) => match l.call(&control) {
                Ok(r) => r,
                Err(e) => {
                    log(&format!("switch {chain} is gone ({e})"));
                    links[usize::from(chain)] = None;
                    ControlReply::Refused(format!("switch {chain} is gone"))
                }
            },
            _ => ControlReply::Refused(format!("no switch {chain}")),
        };
        c.handle_control(token, reply);
    }
}
