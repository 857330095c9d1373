//! `protoplane switch`, `protoplane controller` and `protoplane inc`: the
//! in-network computation processes (see `protoplane-inc-net`) and the
//! runner of the four example applications.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protoplane_inc::controller::ControllerTuning;
use protoplane_inc::faults::Faults;
use protoplane_inc::switch::SwitchConfig;
use protoplane_inc_examples::harness::{self, App};
use protoplane_inc_examples::Params;
use protoplane_inc_net::agent::Options;
use protoplane_inc_net::{controller, switch, LOOPBACK};

/// Fault flags shared by the switch and `inc run`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct FaultArgs {
    /// Probability that a datagram is lost (per egress port).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) loss: f64,
    /// Probability that a datagram is duplicated.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) dup: f64,
    /// Probability that a datagram is held back so later ones overtake it.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) reorder: f64,
    /// Delay added to every datagram, microseconds.
    #[arg(long, default_value_t = 0)]
    pub(crate) delay_us: u64,
    /// Extra delay of a reordered datagram or a duplicate, up to this many
    /// microseconds.
    #[arg(long, default_value_t = 500)]
    pub(crate) jitter_us: u64,
    /// Seed of the fault injectors.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
}

impl FaultArgs {
    fn faults(&self) -> Faults {
        Faults {
            loss: self.loss,
            dup: self.dup,
            reorder: self.reorder,
            delay_us: self.delay_us,
            jitter_us: self.jitter_us,
        }
    }

    fn check(&self) -> Result<(), String> {
        for (name, p) in [("--loss", self.loss), ("--dup", self.dup), ("--reorder", self.reorder)] {
            if !(0.0..1.0).contains(&p) {
                return Err(format!("{name} {p}: a probability in [0, 1)"));
            }
        }
        Ok(())
    }

    fn to_flags(&self) -> Vec<String> {
        vec![
            format!("--loss={}", self.loss),
            format!("--dup={}", self.dup),
            format!("--reorder={}", self.reorder),
            format!("--delay-us={}", self.delay_us),
            format!("--jitter-us={}", self.jitter_us),
            format!("--seed={}", self.seed),
        ]
    }
}

/// `protoplane switch`.
#[derive(clap::Args, Debug)]
pub(crate) struct SwitchArgs {
    /// Address to bind (every node is on it).
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// UDP port of the data plane (its node id); 0 picks one.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// TCP port of the control plane; 0 picks one.
    #[arg(long, default_value_t = 0)]
    control_port: u16,
    /// Pipeline stages.
    #[arg(long, default_value_t = 12)]
    stages: u8,
    /// Register groups (= key/value pairs per packet on this switch).
    #[arg(long, default_value_t = 32)]
    groups: u8,
    /// Register groups per stage.
    #[arg(long, default_value_t = 4)]
    groups_per_stage: u8,
    /// Cells per register array.
    #[arg(long, default_value_t = 16384)]
    registers: u32,
    /// Flows the per-flow bit arrays hold.
    #[arg(long, default_value_t = 1024)]
    flows: u16,
    /// Sequence numbers per flow bit array (a power of two).
    #[arg(long, default_value_t = 256)]
    window: u32,
    /// Queue depth above which packets are ECN-marked.
    #[arg(long, default_value_t = 64)]
    ecn_threshold: u32,
    /// Position in a chain of switches.
    #[arg(long, default_value_t = 0)]
    chain_index: u8,
    /// Node (UDP port) of the next switch of the chain.
    #[arg(long)]
    next_hop: Option<u16>,
    #[command(flatten)]
    faults: FaultArgs,
    /// Faults for one destination node: NODE:loss=P,dup=P,reorder=P,delay-us=N,jitter-us=N.
    #[arg(long = "port-fault", value_name = "NODE:SPEC")]
    port_faults: Vec<String>,
    /// Exit (printing counters) when standard input closes.
    #[arg(long, hide = true)]
    stop_on_eof: bool,
}

fn port_fault(spec: &str, base: Faults) -> Result<(u16, Faults), String> {
    let (node, rest) =
        spec.split_once(':').ok_or_else(|| format!("--port-fault {spec}: NODE:SPEC"))?;
    let node: u16 = node.parse().map_err(|_| format!("--port-fault {spec}: bad node"))?;
    let mut f = base;
    for kv in rest.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--port-fault {spec}: {kv} is not KEY=VALUE"))?;
        let bad = || format!("--port-fault {spec}: bad value for {k}");
        match k {
            "loss" => f.loss = v.parse().map_err(|_| bad())?,
            "dup" => f.dup = v.parse().map_err(|_| bad())?,
            "reorder" => f.reorder = v.parse().map_err(|_| bad())?,
            "delay-us" => f.delay_us = v.parse().map_err(|_| bad())?,
            "jitter-us" => f.jitter_us = v.parse().map_err(|_| bad())?,
            _ => return Err(format!("--port-fault {spec}: unknown {k}")),
        }
    }
    Ok((node, f))
}

/// A flag that becomes true when standard input reaches its end.
fn stop_on_eof(enabled: bool) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    if enabled {
        let s = stop.clone();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::stdin().lock().read_until(0, &mut sink);
            s.store(true, Ordering::Relaxed);
        });
    }
    stop
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

pub(crate) fn run_switch(a: &SwitchArgs) -> Result<(), String> {
    a.faults.check()?;
    let base = a.faults.faults();
    let port_faults =
        a.port_faults.iter().map(|s| port_fault(s, base)).collect::<Result<Vec<_>, _>>()?;
    let config = SwitchConfig {
        node: 0,
        chain_index: a.chain_index,
        next_hop: a.next_hop,
        stages: a.stages,
        groups: a.groups,
        groups_per_stage: a.groups_per_stage,
        registers: a.registers,
        flows: a.flows,
        window: a.window,
        ecn_threshold: a.ecn_threshold,
    };
    config.validate().map_err(|e| e.to_string())?;
    let opts = switch::SwitchOptions {
        host: a.host,
        port: a.port,
        control_port: a.control_port,
        config,
        faults: base,
        port_faults,
        seed: a.faults.seed,
    };
    let (bound, runner) = switch::bind(opts).map_err(|e| format!("switch: {e}"))?;
    say(&format!("switch node={} control={}", bound.node, bound.control));
    let stats = runner.run(stop_on_eof(a.stop_on_eof)).map_err(|e| format!("switch: {e}"))?;
    say(&format!("switch stats {stats:?}"));
    Ok(())
}

/// `protoplane controller`.
#[derive(clap::Args, Debug)]
pub(crate) struct ControllerArgs {
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// TCP port for agents; 0 picks one.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Control-plane address of a switch (repeat for a chain, in order);
    /// none: no data plane, the agents do everything.
    #[arg(long = "switch", value_name = "ADDR")]
    switches: Vec<SocketAddr>,
    /// Poll the data plane's last-seen times every so many milliseconds.
    #[arg(long, default_value_t = 100)]
    poll_ms: u64,
    /// Probe an application idle this long (first timeout), milliseconds.
    #[arg(long, default_value_t = 2000)]
    idle_ms: u64,
    /// Reclaim an application silent this long after the probe (second
    /// timeout), milliseconds.
    #[arg(long, default_value_t = 2000)]
    dead_ms: u64,
    /// Exit when standard input closes.
    #[arg(long, hide = true)]
    stop_on_eof: bool,
}

pub(crate) fn run_controller(a: &ControllerArgs) -> Result<(), String> {
    let tuning = ControllerTuning {
        poll_us: a.poll_ms * 1000,
        idle_us: a.idle_ms * 1000,
        dead_us: a.dead_ms * 1000,
    };
    let opts = controller::ControllerOptions {
        host: a.host,
        port: a.port,
        switches: a.switches.clone(),
        tuning,
    };
    let (addr, runner) = controller::bind(opts).map_err(|e| format!("controller: {e}"))?;
    say(&format!("controller listening {addr}"));
    runner
        .run(stop_on_eof(a.stop_on_eof), |l| say(&format!("controller: {l}")))
        .map_err(|e| format!("controller: {e}"))
}

/// `protoplane inc …`.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum IncCommand {
    /// Run an example application end to end: controller, switch, server
    /// and clients as processes; checks every result and prints
    /// `exact: yes` or `exact: no` last.
    Run(RunArgs),
    /// One server process of an example (driven by `inc run`).
    #[command(hide = true)]
    Server(RoleArgs),
    /// One client process of an example (driven by `inc run`).
    #[command(hide = true)]
    Client(RoleArgs),
}

/// `protoplane inc run`.
#[derive(clap::Args, Debug)]
pub(crate) struct RunArgs {
    /// sync-agg, async-agg, key-value or agreement.
    #[arg(long)]
    app: String,
    /// Client processes.
    #[arg(long, default_value_t = 4)]
    clients: u16,
    /// No data plane: the server agent does everything.
    #[arg(long)]
    no_switch: bool,
    /// Switches in the chain (1 or 2).
    #[arg(long, default_value_t = 1)]
    switches: u8,
    /// Work per client (1: a few seconds).
    #[arg(long, default_value_t = 1)]
    scale: u32,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 180)]
    timeout_s: u64,
    #[command(flatten)]
    faults: FaultArgs,
}

/// A role process of `inc run`.
#[derive(clap::Args, Debug)]
pub(crate) struct RoleArgs {
    #[arg(long)]
    app: String,
    #[arg(long)]
    name: String,
    #[arg(long)]
    controller: SocketAddr,
    #[arg(long = "switch-control")]
    switch_control: Vec<SocketAddr>,
    #[arg(long, default_value_t = 0)]
    member: u16,
    #[arg(long)]
    clients: u16,
    #[arg(long, default_value_t = 1)]
    scale: u32,
    /// Faults injected by the agent itself (runs without a switch).
    #[arg(long)]
    agent_faults: bool,
    #[command(flatten)]
    faults: FaultArgs,
}

fn role_setup(a: &RoleArgs) -> Result<(App, Options, Params), String> {
    let app = App::parse(&a.app).ok_or_else(|| format!("unknown application {:?}", a.app))?;
    let opts = Options {
        host: LOOPBACK,
        controller: a.controller,
        switch_control: a.switch_control.clone(),
        faults: if a.agent_faults { a.faults.faults() } else { Faults::none() },
        seed: a.faults.seed ^ u64::from(a.member) << 16,
    };
    Ok((app, opts, Params { clients: a.clients, seed: a.faults.seed, scale: a.scale }))
}

pub(crate) fn run_role(a: &RoleArgs, server: bool) -> Result<(), String> {
    let (app, opts, params) = role_setup(a)?;
    if server {
        let stop = stop_on_eof(true);
        let (verdict, stats) = harness::serve(app, &opts, &params, &a.name, &stop, |rt| {
            say(&format!("ready node={} memory={:?}", rt.node(), rt.plan().memory));
        })?;
        if let Some(v) = verdict {
            say(&format!("verdict exact={} items={} {}", yes(v.exact), v.items, v.detail));
        }
        say(&format!(
            "server packets={} bytes={} host_items={}",
            stats.packets, stats.bytes, stats.host_items
        ));
        return Ok(());
    }
    let t = Instant::now();
    let v = harness::client(app, &opts, &params, &a.name, a.member)?;
    say(&format!(
        "verdict exact={} items={} seconds={:.3} {}",
        yes(v.exact),
        v.items,
        t.elapsed().as_secs_f64(),
        v.detail
    ));
    Ok(())
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// A child process whose first stdout line announced it.
struct Proc {
    name: String,
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Proc {
    fn spawn(name: &str, args: &[String]) -> Result<(Proc, String), String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("{name}: {e}"))?;
        let out: ChildStdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut p = Proc { name: name.to_string(), child, lines: rx };
        let first =
            p.line(Duration::from_secs(30)).ok_or_else(|| format!("{name} did not start"))?;
        Ok((p, first))
    }

    fn line(&mut self, wait: Duration) -> Option<String> {
        self.lines.recv_timeout(wait).ok()
    }

    /// Closes stdin (the process stops) and collects what it prints.
    fn finish(mut self, wait: Duration) -> Vec<String> {
        drop(self.child.stdin.take());
        let end = Instant::now() + wait;
        let mut out = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(l) => out.push(l),
                Err(_) => break,
            }
            if Instant::now() >= end {
                break;
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        out
    }
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

/// What one `inc run` measured.
#[derive(Debug, Default, Clone)]
pub(crate) struct RunReport {
    pub(crate) exact: bool,
    pub(crate) seconds: f64,
    pub(crate) items: u64,
    pub(crate) server_packets: u64,
    pub(crate) server_bytes: u64,
    pub(crate) lines: Vec<String>,
}

pub(crate) fn inc_run(a: &RunArgs) -> Result<RunReport, String> {
    let app = App::parse(&a.app)
        .ok_or_else(|| format!("--app {:?}: sync-agg, async-agg, key-value or agreement", a.app))?;
    a.faults.check()?;
    if a.clients == 0 || a.clients > 32 {
        return Err(format!("--clients {}: 1 to 32", a.clients));
    }
    if !(1..=2).contains(&a.switches) {
        return Err(format!("--switches {}: 1 or 2", a.switches));
    }
    let mut report = RunReport::default();
    let mut infra: Vec<Proc> = Vec::new();
    let mut control: Vec<String> = Vec::new();
    if !a.no_switch {
        // The last switch of the chain first: the earlier one needs its node.
        let mut next: Option<String> = None;
        let mut ctl_rev = Vec::new();
        for i in (0..a.switches).rev() {
            let mut args =
                vec!["switch".to_string(), "--stop-on-eof".into(), format!("--chain-index={i}")];
            args.extend(a.faults.to_flags());
            if let Some(n) = &next {
                args.push(format!("--next-hop={n}"));
            }
            let (p, first) = Proc::spawn(&format!("switch {i}"), &args)?;
            next = field(&first, "node").map(str::to_string);
            ctl_rev.push(field(&first, "control").ok_or("switch: no control address")?.to_string());
            infra.push(p);
        }
        control = ctl_rev.into_iter().rev().collect();
    }
    let mut args = vec!["controller".to_string(), "--stop-on-eof".into()];
    for c in &control {
        args.push(format!("--switch={c}"));
    }
    let (ctl, first) = Proc::spawn("controller", &args)?;
    let ctl_addr = first.rsplit(' ').next().unwrap_or_default().to_string();
    infra.push(ctl);
    let name = format!("{}-{}", app.name(), std::process::id());
    let role = |role: &str, member: u16| {
        let mut v = vec![
            "inc".to_string(),
            role.to_string(),
            format!("--app={}", app.name()),
            format!("--name={name}"),
            format!("--controller={ctl_addr}"),
            format!("--member={member}"),
            format!("--clients={}", a.clients),
            format!("--scale={}", a.scale),
        ];
        for c in &control {
            v.push(format!("--switch-control={c}"));
        }
        v.extend(a.faults.to_flags());
        if a.no_switch {
            v.push("--agent-faults".into());
        }
        v
    };
    let started = Instant::now();
    let (server, ready) = Proc::spawn("server", &role("server", 0))?;
    report.lines.push(format!("server {ready}"));
    let mut clients = Vec::new();
    for m in 0..a.clients {
        clients.push(Proc::spawn_later(&format!("client {m}"), &role("client", m))?);
    }
    let deadline = started + Duration::from_secs(a.timeout_s);
    let mut exact = true;
    for (m, mut c) in clients.into_iter().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = c.line(left);
        match line {
            Some(l) => {
                exact &=
                    field(&l, "verdict exact") == Some("yes") || l.contains("verdict exact=yes");
                report.items += field(&l, "items").and_then(|v| v.parse().ok()).unwrap_or(0);
                report.lines.push(format!("client {m}: {l}"));
            }
            None => {
                exact = false;
                report.lines.push(format!("client {m}: no verdict (timed out or failed)"));
            }
        }
        c.finish(Duration::from_secs(2));
    }
    report.seconds = started.elapsed().as_secs_f64();
    for l in server.finish(Duration::from_secs(10)) {
        if l.starts_with("verdict") {
            exact &= l.contains("exact=yes");
        }
        if l.starts_with("server ") {
            report.server_packets = field(&l, "packets").and_then(|v| v.parse().ok()).unwrap_or(0);
            report.server_bytes = field(&l, "bytes").and_then(|v| v.parse().ok()).unwrap_or(0);
        }
        report.lines.push(format!("server: {l}"));
    }
    for p in infra.into_iter().rev() {
        let name = p.name.clone();
        for l in p.finish(Duration::from_secs(5)) {
            report.lines.push(format!("{name}: {l}"));
        }
    }
    report.exact = exact;
    Ok(report)
}

impl Proc {
    /// Spawns a process that prints nothing until it is done.
    fn spawn_later(name: &str, args: &[String]) -> Result<Proc, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("{name}: {e}"))?;
        let out: ChildStdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Ok(Proc { name: name.to_string(), child, lines: rx })
    }
}

pub(crate) fn print_run(a: &RunArgs, r: &RunReport) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "inc run --app {} --clients {}{} (loss {}, dup {}, reorder {})\n",
        a.app,
        a.clients,
        if a.no_switch { " --no-switch" } else { "" },
        a.faults.loss,
        a.faults.dup,
        a.faults.reorder
    ));
    for l in &r.lines {
        s.push_str("  ");
        s.push_str(l);
        s.push('\n');
    }
    s.push_str(&format!(
        "elapsed {:.2} s, {} items from clients, server received {} packets / {} bytes\n",
        r.seconds, r.items, r.server_packets, r.server_bytes
    ));
    s.push_str(&format!("exact: {}\n", yes(r.exact)));
    s
}
