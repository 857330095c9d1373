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
use protoplane_inc::plan::{CachePolicy, ClearPolicy};
use protoplane_inc::switch::SwitchConfig;
use protoplane_inc_examples::harness::{self, App};
use protoplane_inc_examples::{Params, Tweaks};
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
    /// Another clear policy than the NetFilter's.
    #[arg(long)]
    clear: Option<String>,
    /// Another cache policy than the NetFilter's.
    #[arg(long)]
    cache: Option<String>,
    /// Another amount of data-plane memory than the NetFilter's.
    #[arg(long)]
    memory: Option<u32>,
    /// Per mille of overflowing gradient values (sync-agg).
    #[arg(long, default_value_t = 0)]
    overflow_permille: u32,
    /// Agreement: one instance at a time (commit latency).
    #[arg(long)]
    sequential: bool,
    /// Print a progress line after each unit of work.
    #[arg(long)]
    progress: bool,
    /// Clients: the gRPC address of the application's server.
    #[arg(long)]
    rpc: Option<SocketAddr>,
    #[command(flatten)]
    faults: FaultArgs,
}

fn role_setup(a: &RoleArgs) -> Result<(App, Options, Params, Tweaks), String> {
    let app = App::parse(&a.app).ok_or_else(|| format!("unknown application {:?}", a.app))?;
    let opts = Options {
        host: LOOPBACK,
        controller: a.controller,
        switch_control: a.switch_control.clone(),
        faults: if a.agent_faults { a.faults.faults() } else { Faults::none() },
        seed: a.faults.seed ^ u64::from(a.member) << 16,
    };
    let params = Params {
        clients: a.clients,
        seed: a.faults.seed,
        scale: a.scale,
        overflow_permille: a.overflow_permille,
        sequential: a.sequential,
    };
    let tweaks = Tweaks {
        clear: match &a.clear {
            Some(c) => Some(
                ClearPolicy::parse(c)
                    .ok_or_else(|| format!("--clear {c}: copy, shadow or lazy"))?,
            ),
            None => None,
        },
        cache: match &a.cache {
            Some(c) => Some(
                CachePolicy::parse(c)
                    .ok_or_else(|| format!("--cache {c}: periodic-counting, fcfs or hashing"))?,
            ),
            None => None,
        },
        memory: a.memory,
    };
    Ok((app, opts, params, tweaks))
}

pub(crate) fn run_role(a: &RoleArgs, server: bool) -> Result<(), String> {
    let (app, opts, params, tweaks) = role_setup(a)?;
    if server {
        let stop = stop_on_eof(true);
        let r = harness::serve(app, &opts, &params, tweaks, &a.name, &stop, |rt, rpc| {
            say(&format!("ready node={} rpc={rpc} memory={:?}", rt.node(), rt.plan().memory));
        })?;
        if let Some(v) = r.verdict {
            say(&format!("verdict exact={} items={} {}", yes(v.exact), v.items, v.detail));
        }
        let cpu = crate::host::process_cpu_precise().unwrap_or(f64::NAN);
        let latency = r.commit_latency.map_or(f64::NAN, |d| d.as_secs_f64() * 1e6);
        let leader = r.leader_time.map_or(f64::NAN, |d| d.as_secs_f64());
        say(&format!(
            "server packets={} bytes={} host_items={} cpu={cpu:.6} commit_latency_us={latency:.1} leader_s={leader:.4}",
            r.stats.packets, r.stats.bytes, r.stats.host_items
        ));
        return Ok(());
    }
    let t = Instant::now();
    let mut report = |items: u64| {
        if a.progress {
            say(&format!("progress t={} items={items}", protoplane_inc_net::now_us()));
        }
    };
    let rpc = a.rpc.ok_or("a client needs --rpc (the server's gRPC address)")?;
    let v = harness::client(app, &opts, &params, &a.name, a.member, rpc, &mut report)?;
    say(&format!(
        "verdict exact={} items={} seconds={:.4} rpcs={} rpc_bytes={} {}",
        yes(v.exact),
        v.items,
        t.elapsed().as_secs_f64(),
        v.face.rpcs,
        v.face.rpc_bytes,
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

/// A child process of `inc run` and its stdout lines.
struct Proc {
    name: String,
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Proc {
    /// Starts `protoplane ARGS…`.
    fn start(name: &str, args: &[String]) -> Result<Proc, String> {
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

    /// Starts a process and waits for its first line.
    fn announced(name: &str, args: &[String]) -> Result<(Proc, String), String> {
        let mut p = Proc::start(name, args)?;
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
        while let Ok(l) = self.lines.recv_timeout(end.saturating_duration_since(Instant::now())) {
            out.push(l);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        out
    }
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

fn num(line: &str, key: &str) -> f64 {
    field(line, key).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

/// The shared processes: switches (none without a data plane) and the
/// controller.
pub(crate) struct Infra {
    procs: Vec<Proc>,
    control: Vec<String>,
    controller: String,
}

impl Infra {
    pub(crate) fn start(switches: u8, faults: Option<&FaultArgs>) -> Result<Infra, String> {
        let mut procs = Vec::new();
        let mut control = Vec::new();
        // The last switch of the chain first: the earlier one needs its node.
        let mut next: Option<String> = None;
        for i in (0..switches).rev() {
            let mut args =
                vec!["switch".to_string(), "--stop-on-eof".into(), format!("--chain-index={i}")];
            if let Some(f) = faults {
                args.extend(f.to_flags());
            }
            if let Some(n) = &next {
                args.push(format!("--next-hop={n}"));
            }
            let (p, first) = Proc::announced(&format!("switch {i}"), &args)?;
            next = field(&first, "node").map(str::to_string);
            control.insert(
                0,
                field(&first, "control").ok_or("switch: no control address")?.to_string(),
            );
            procs.push(p);
        }
        let mut args = vec!["controller".to_string(), "--stop-on-eof".into()];
        args.extend(control.iter().map(|c| format!("--switch={c}")));
        let (p, first) = Proc::announced("controller", &args)?;
        let controller = first.rsplit(' ').next().unwrap_or_default().to_string();
        procs.push(p);
        Ok(Infra { procs, control, controller })
    }

    /// Stops everything; returns what each printed.
    pub(crate) fn finish(self) -> Vec<String> {
        let mut lines = Vec::new();
        for p in self.procs.into_iter().rev() {
            let name = p.name.clone();
            lines.extend(
                p.finish(Duration::from_secs(5)).into_iter().map(|l| format!("{name}: {l}")),
            );
        }
        lines
    }
}

/// How to run one application instance.
#[derive(Clone, Debug, Default)]
pub(crate) struct AppSpec {
    pub(crate) app: String,
    pub(crate) clients: u16,
    pub(crate) scale: u32,
    pub(crate) agent_faults: Option<FaultArgs>,
    pub(crate) seed: u64,
    pub(crate) extra: Vec<String>,
    pub(crate) progress: bool,
}

/// A running application instance.
pub(crate) struct AppRun {
    server: Proc,
    clients: Vec<Proc>,
    pub(crate) ready: String,
}

/// What one application instance measured.
#[derive(Debug, Default, Clone)]
pub(crate) struct RunReport {
    pub(crate) exact: bool,
    /// Longest client time (work only, no process start).
    pub(crate) seconds: f64,
    pub(crate) items: u64,
    pub(crate) server_packets: u64,
    /// What reached the server agent through the network (INC datagrams).
    pub(crate) server_bytes: u64,
    /// Ordinary calls the clients' stubs made to the server, and their
    /// request bytes (encoded protobuf, IEDT fields cut out; HTTP/2 framing
    /// not counted).
    pub(crate) rpcs: u64,
    pub(crate) rpc_bytes: u64,
    pub(crate) server_cpu: f64,
    pub(crate) commit_latency_us: f64,
    /// Agreement: first proposal to last commit.
    pub(crate) leader_seconds: f64,
    /// Client detail lines.
    pub(crate) details: Vec<String>,
    /// (microseconds since the epoch, items) of every progress line.
    pub(crate) progress: Vec<(u64, u64)>,
    pub(crate) lines: Vec<String>,
}

impl RunReport {
    /// Bytes that reached the server: INC datagrams and ordinary calls.
    pub(crate) fn bytes_to_server(&self) -> u64 {
        self.server_bytes + self.rpc_bytes
    }
}

impl AppRun {
    pub(crate) fn start(infra: &Infra, spec: &AppSpec) -> Result<AppRun, String> {
        let name =
            format!("{}-{}-{}", spec.app, std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let role = |role: &str, member: u16| {
            let mut v = vec![
                "inc".to_string(),
                role.to_string(),
                format!("--app={}", spec.app),
                format!("--name={name}"),
                format!("--controller={}", infra.controller),
                format!("--member={member}"),
                format!("--clients={}", spec.clients),
                format!("--scale={}", spec.scale),
            ];
            v.extend(infra.control.iter().map(|c| format!("--switch-control={c}")));
            match &spec.agent_faults {
                Some(f) => {
                    v.extend(f.to_flags());
                    v.push("--agent-faults".into());
                }
                None => v.push(format!("--seed={}", spec.seed)),
            }
            if spec.progress && role == "client" {
                v.push("--progress".into());
            }
            v.extend(spec.extra.iter().cloned());
            v
        };
        let (server, ready) = Proc::announced("server", &role("server", 0))?;
        let rpc = field(&ready, "rpc").ok_or_else(|| format!("server announced {ready:?}"))?;
        let clients = (0..spec.clients)
            .map(|m| {
                let mut args = role("client", m);
                args.push(format!("--rpc={rpc}"));
                Proc::start(&format!("client {m}"), &args)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(AppRun { server, clients, ready })
    }

    /// Waits for every client's verdict (until `deadline`), then stops the
    /// server.
    pub(crate) fn finish(self, deadline: Instant) -> RunReport {
        let mut r = RunReport { exact: true, ..RunReport::default() };
        r.lines.push(format!("server {}", self.ready));
        for (m, mut c) in self.clients.into_iter().enumerate() {
            let mut verdict = None;
            while let Some(l) = c.line(deadline.saturating_duration_since(Instant::now())) {
                if l.starts_with("progress") {
                    r.progress.push((num(&l, "t") as u64, num(&l, "items") as u64));
                } else if l.starts_with("verdict") {
                    verdict = Some(l);
                    break;
                }
            }
            match verdict {
                Some(l) => {
                    r.exact &= l.contains("exact=yes");
                    r.items += num(&l, "items") as u64;
                    r.rpcs += num(&l, "rpcs") as u64;
                    r.rpc_bytes += num(&l, "rpc_bytes") as u64;
                    r.seconds = r.seconds.max(num(&l, "seconds"));
                    r.details.push(l.clone());
                    r.lines.push(format!("client {m}: {l}"));
                }
                None => {
                    r.exact = false;
                    r.lines.push(format!("client {m}: no verdict (timed out or failed)"));
                }
            }
            c.finish(Duration::from_secs(2));
        }
        for l in self.server.finish(Duration::from_secs(10)) {
            if l.starts_with("verdict") {
                r.exact &= l.contains("exact=yes");
            }
            if l.starts_with("server ") {
                r.server_packets = num(&l, "packets") as u64;
                r.server_bytes = num(&l, "bytes") as u64;
                r.server_cpu = num(&l, "cpu");
                r.commit_latency_us = num(&l, "commit_latency_us");
                r.leader_seconds = num(&l, "leader_s");
            }
            r.lines.push(format!("server: {l}"));
        }
        r
    }
}

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(crate) fn inc_run(a: &RunArgs) -> Result<RunReport, String> {
    App::parse(&a.app)
        .ok_or_else(|| format!("--app {:?}: sync-agg, async-agg, key-value or agreement", a.app))?;
    a.faults.check()?;
    if a.clients == 0 || a.clients > 32 {
        return Err(format!("--clients {}: 1 to 32", a.clients));
    }
    if !(1..=2).contains(&a.switches) {
        return Err(format!("--switches {}: 1 or 2", a.switches));
    }
    let switches = if a.no_switch { 0 } else { a.switches };
    let infra = Infra::start(switches, Some(&a.faults))?;
    let spec = AppSpec {
        app: a.app.clone(),
        clients: a.clients,
        scale: a.scale,
        agent_faults: a.no_switch.then(|| a.faults.clone()),
        seed: a.faults.seed,
        ..AppSpec::default()
    };
    let started = Instant::now();
    let run = AppRun::start(&infra, &spec);
    let mut report = match run {
        Ok(run) => run.finish(started + Duration::from_secs(a.timeout_s)),
        Err(e) => {
            let lines = infra.finish();
            return Err(format!("{e}\n{}", lines.join("\n")));
        }
    };
    report.lines.extend(infra.finish());
    Ok(report)
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
        "{:.3} s of client work, {} items from clients, server received {} packets / {} bytes \
         and {} ordinary calls / {} bytes, server CPU {:.3} s\n",
        r.seconds, r.items, r.server_packets, r.server_bytes, r.rpcs, r.rpc_bytes, r.server_cpu
    ));
    s.push_str(&format!("exact: {}\n", yes(r.exact)));
    s
}
