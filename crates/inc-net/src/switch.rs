//! `protoplane switch`: the software data plane as a process.
//!
//! One thread runs the pipeline: it drains the UDP socket in batches (the
//! datagrams still waiting behind one are its queue depth, which drives
//! ECN), hands each to [`Switch::process`], and sends what comes out
//! through the egress port's fault injector — now, or later from a timer
//! heap when the injector delays it. Control connections (TCP, JSON lines)
//! have a reader thread each; their requests reach the pipeline thread
//! through a channel and are applied between batches, so a control
//! request is atomic with respect to packets, as on a switch CPU port.

use std::collections::HashMap;
use std::io::{self, ErrorKind};
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, TryRecvError};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use protoplane_inc::faults::{Faults, Injector};
use protoplane_inc::switch::{Control, ControlReply, Emit, Stats, Switch, SwitchConfig};

use crate::lines::{accept_lines, Incoming, Writers};
use crate::{node_addr, now_us, DelayQueue};

/// How to run a switch.
#[derive(Clone, Debug)]
pub struct SwitchOptions {
    /// Address to bind.
    pub host: IpAddr,
    /// UDP port of the data plane (its node id); 0 picks one.
    pub port: u16,
    /// TCP port of the control plane; 0 picks one.
    pub control_port: u16,
    /// Pipeline shape (`node` is set from the bound port).
    pub config: SwitchConfig,
    /// Faults on every egress port.
    pub faults: Faults,
    /// Faults for particular destination nodes.
    pub port_faults: Vec<(u16, Faults)>,
    /// Seed of the injectors.
    pub seed: u64,
}

/// Where a started switch listens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    /// Node id (UDP port).
    pub node: u16,
    /// Control-plane address.
    pub control: SocketAddr,
}

/// Binds the sockets; returns where they are and the loop to run.
pub fn bind(opts: SwitchOptions) -> io::Result<(Bound, Runner)> {
    let udp = UdpSocket::bind(SocketAddr::new(opts.host, opts.port))?;
    let node = udp.local_addr()?.port();
    let listener = TcpListener::bind(SocketAddr::new(opts.host, opts.control_port))?;
    let control = listener.local_addr()?;
    let config = SwitchConfig { node, ..opts.config.clone() };
    let switch =
        Switch::new(config).map_err(|e| io::Error::new(ErrorKind::InvalidInput, e.to_string()))?;
    Ok((Bound { node, control }, Runner { opts, udp, listener, switch }))
}

/// A bound switch, ready to run.
#[derive(Debug)]
pub struct Runner {
    opts: SwitchOptions,
    udp: UdpSocket,
    listener: TcpListener,
    switch: Switch,
}

impl Runner {
    /// Runs until `stop` is set; returns the final counters.
    pub fn run(mut self, stop: Arc<AtomicBool>) -> io::Result<Stats> {
        let (tx, rx) = mpsc::channel();
        let writers = Writers::default();
        let listener = self.listener.try_clone()?;
        let w2 = writers.clone();
        // After each control request the reader sends an empty datagram to
        // the data plane's own port, so the pipeline thread blocked in
        // `recv` wakes up and applies the request at once.
        let wake = self.udp.local_addr()?;
        let waker = Arc::new(UdpSocket::bind(SocketAddr::new(wake.ip(), 0))?);
        thread::spawn(move || {
            accept_lines(listener, tx, w2, move || {
                let _ = waker.send_to(&[], wake);
            })
        });
        let mut injectors: HashMap<u16, Injector> = HashMap::new();
        let mut delayed = DelayQueue::default();
        let mut buf = vec![0u8; 65_536];
        let mut batch: Vec<Vec<u8>> = Vec::new();
        let mut out: Vec<Emit> = Vec::new();
        let host = self.opts.host;
        while !stop.load(Ordering::Relaxed) {
            // Control first: a request waits at most one batch.
            loop {
                match rx.try_recv() {
                    Ok(Incoming::Line(id, v)) => {
                        let reply = match Control::from_json(&v) {
                            Ok(c) => self.switch.control(c),
                            Err(why) => ControlReply::Refused(why.to_string()),
                        };
                        writers.send(id, &reply.to_json());
                    }
                    Ok(Incoming::Closed(id)) => writers.forget(id),
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                }
            }
            // Wait for the first datagram (or the next delayed send), then
            // drain what else is there without blocking.
            let now = now_us();
            let wait = delayed.next().map_or(1_000, |at| at.saturating_sub(now).clamp(1, 1_000));
            self.udp.set_read_timeout(Some(Duration::from_micros(wait)))?;
            batch.clear();
            match self.udp.recv_from(&mut buf) {
                Ok((n, _)) => batch.push(buf[..n].to_vec()),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(e),
            }
            if !batch.is_empty() {
                self.udp.set_nonblocking(true)?;
                while batch.len() < 1024 {
                    match self.udp.recv_from(&mut buf) {
                        Ok((n, _)) => batch.push(buf[..n].to_vec()),
                        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
                        Err(_) => break,
                    }
                }
                self.udp.set_nonblocking(false)?;
            }
            // Empty datagrams only wake the loop (a control request waits).
            batch.retain(|d| !d.is_empty());
            let now = now_us();
            let n = batch.len();
            for (i, d) in batch.iter().enumerate() {
                self.switch.process(now, (n - i - 1) as u32, d, &mut out);
                for e in out.drain(..) {
                    let inj = injectors.entry(e.dst).or_insert_with(|| {
                        let f = self
                            .opts
                            .port_faults
                            .iter()
                            .find(|(node, _)| *node == e.dst)
                            .map_or(self.opts.faults, |(_, f)| *f);
                        Injector::new(f, self.opts.seed ^ (u64::from(e.dst) << 20))
                    });
                    for at in inj.schedule(now) {
                        if at <= now {
                            let _ = self.udp.send_to(&e.bytes, node_addr(host, e.dst));
                        } else {
                            delayed.push(at, e.dst, e.bytes.clone());
                        }
                    }
                }
            }
            let now = now_us();
            while let Some((dst, bytes)) = delayed.pop_due(now) {
                let _ = self.udp.send_to(&bytes, node_addr(host, dst));
            }
        }
        Ok(self.switch.stats())
    }
}
