//! The runner of the four applications (`protoplane inc run`, served by
//! this crate's `protoplane-inc` binary): a controller, switches, a server
//! and clients, each a process, checking every result.
//!
//! The switches and the controller are the product's processes
//! (`protoplane switch`, `protoplane controller`); the server and clients
//! are this binary's hidden `server` and `client` roles. [`Bins`] says
//! where both binaries are, so the benchmark of `bench inc` runs the same
//! processes.
//!
//! Every process announces itself with one line on stdout and prints its
//! verdict and counters as `key=value` words; the runner reads them. A
//! process stops when its stdin closes, so none outlives its runner.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use protoplane_inc::faults::Faults;
use protoplane_inc::plan::{CachePolicy, ClearPolicy, MemberLoss};
use protoplane_inc_net::agent::Options;
use protoplane_inc_net::flags::{stop_on_eof, FaultArgs};
use protoplane_inc_net::LOOPBACK;

use crate::harness::{self, App};
use crate::{Params, Tweaks};

/// Where the processes of a run come from: `protoplane` (switch,
/// controller) and `protoplane-inc` (the application roles).
#[derive(Clone, Debug)]
pub struct Bins {
    /// The `protoplane` command.
    pub protoplane: PathBuf,
    /// This crate's `protoplane-inc`.
    pub inc: PathBuf,
}

impl Bins {
    /// `$PROTOPLANE_BIN` (which `protoplane` sets when it hands a command
    /// to another binary) or `protoplane` beside the running binary, and
    /// `protoplane-inc` beside it.
    pub fn find() -> Result<Bins, String> {
        let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
        let protoplane = match std::env::var_os("PROTOPLANE_BIN") {
            Some(p) => PathBuf::from(p),
            None => exe.with_file_name("protoplane"),
        };
        let inc = protoplane.with_file_name("protoplane-inc");
        for p in [&protoplane, &inc] {
            if !p.exists() {
                return Err(format!(
                    "{} is missing (cargo build --release --workspace)",
                    p.display()
                ));
            }
        }
        Ok(Bins { protoplane, inc })
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[derive(clap::Subcommand, Debug)]
pub enum IncCommand {
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
    /// Print the inputs each role of an example sends, as JSON lines (the
    /// data `inc run --seed S` uses), so results can be recomputed
    /// without this code.
    Gen(GenArgs),
}

/// `protoplane inc run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
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
    /// Kill the controller this many milliseconds into the run (SIGKILL)
    /// and start a new one on its port; a second instance of the
    /// application then starts beside the first, and both must be exact
    /// (the new controller must not hand out what the switches hold).
    #[arg(long)]
    restart_controller_ms: Option<u64>,
    /// Kill the (first) switch this many milliseconds into the run
    /// (SIGKILL): the application must finish on the server path, exactly
    /// (what the switch held is rebuilt from the members' accounts).
    #[arg(long)]
    kill_switch_ms: Option<u64>,
    /// Kill this member's client (SIGKILL) `--kill-client-ms` into the run:
    /// the other members' synchronous aggregations must fail at once with
    /// the reason (the member's lease runs out) instead of waiting, or, with
    /// `--member-loss continue`, go on without it, every step exact over
    /// the members its result names (the same for every member).
    #[arg(long)]
    kill_client: Option<u16>,
    /// What synchronous aggregation does when a member is lost, instead of
    /// the NetFilter's `MemberLoss`: fail or continue.
    #[arg(long)]
    member_loss: Option<String>,
    /// When `--kill-client` kills, in milliseconds.
    #[arg(long, default_value_t = 200)]
    kill_client_ms: u64,
    /// This member's client does half of its work and exits; a new process
    /// joins as the same member and does the rest (key-value, async-agg;
    /// not member 0, which reads the results).
    #[arg(long)]
    restart_client: Option<u16>,
    /// Forge datagrams during the run: to the switch itself (a loop), to a
    /// port that is not the application's (a relay), an aggregation chunk
    /// far ahead, packets of an application nobody installed. None may
    /// reach the port or change a result; the switch must count them.
    #[arg(long)]
    attack: bool,
    /// Write each role's results as JSON lines into this directory
    /// (`client-M.jsonl`, `server.jsonl`).
    #[arg(long)]
    results: Option<PathBuf>,
    #[command(flatten)]
    faults: FaultArgs,
}

/// `protoplane inc gen`.
#[derive(clap::Args, Debug)]
pub struct GenArgs {
    /// sync-agg, async-agg, key-value or agreement.
    #[arg(long)]
    app: String,
    /// The seed `inc run --seed S` uses.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Clients (members).
    #[arg(long, default_value_t = 4)]
    clients: u16,
    /// Work per client.
    #[arg(long, default_value_t = 1)]
    scale: u32,
}

/// A role process of `inc run`.
#[derive(clap::Args, Debug)]
pub struct RoleArgs {
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
    /// Another `MemberLoss` than the NetFilter's: fail or continue.
    #[arg(long)]
    member_loss: Option<String>,
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
    /// Clients: do half of the work (1: the first half, exit; 2: the rest).
    #[arg(long)]
    part: Option<u8>,
    /// Write results as JSON lines into this directory.
    #[arg(long)]
    results: Option<PathBuf>,
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
        part: a.part,
        results: a.results.clone(),
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
        member_loss: match &a.member_loss {
            Some(p) => Some(
                MemberLoss::parse(p)
                    .ok_or_else(|| format!("--member-loss {p}: fail or continue"))?,
            ),
            None => None,
        },
    };
    Ok((app, opts, params, tweaks))
}

pub fn run_role(a: &RoleArgs, server: bool) -> Result<(), String> {
    let (app, opts, params, tweaks) = role_setup(a)?;
    if server {
        let stop = stop_on_eof(true);
        let r = harness::serve(app, &opts, &params, tweaks, &a.name, &stop, |rt, rpc| {
            let p = rt.plan();
            say(&format!(
                "ready app={} node={} rpc={rpc} switch={:?} memory={:?}",
                p.app,
                rt.node(),
                p.switch,
                p.memory
            ));
        })?;
        if let Some(v) = r.verdict {
            say(&format!("verdict exact={} items={} {}", yes(v.exact), v.items, v.detail));
        }
        let cpu = protoplane_load::host::process_cpu_precise().unwrap_or(f64::NAN);
        let latency = r.commit_latency.map_or(f64::NAN, |d| d.as_secs_f64() * 1e6);
        let leader = r.leader_time.map_or(f64::NAN, |d| d.as_secs_f64());
        say(&format!(
            "server packets={} bytes={} host_items={} cpu={cpu:.6} commit_latency_us={latency:.1} leader_s={leader:.4} rpc_wire_in={} rpc_wire_out={}",
            r.stats.packets,
            r.stats.bytes,
            r.stats.host_items,
            r.wire.to_server.load(Ordering::Relaxed),
            r.wire.to_clients.load(Ordering::Relaxed)
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
#[derive(Debug)]
struct Proc {
    name: String,
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Proc {
    /// Starts `exe ARGS…`.
    fn start(exe: &PathBuf, name: &str, args: &[String]) -> Result<Proc, String> {
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
    fn announced(exe: &PathBuf, name: &str, args: &[String]) -> Result<(Proc, String), String> {
        let mut p = Proc::start(exe, name, args)?;
        let first =
            p.line(Duration::from_secs(30)).ok_or_else(|| format!("{name} did not start"))?;
        Ok((p, first))
    }

    fn line(&mut self, wait: Duration) -> Option<String> {
        self.lines.recv_timeout(wait).ok()
    }

    /// The first line starting with `prefix`, waiting until `deadline`.
    fn line_matching(&mut self, prefix: &str, deadline: Instant) -> Option<String> {
        while let Some(l) = self.line(deadline.saturating_duration_since(Instant::now())) {
            if l.starts_with(prefix) {
                return Some(l);
            }
        }
        None
    }

    /// Closes stdin (the process stops) and collects what it prints; the
    /// last line says how it ended (`exit: 0`, `exit: <status>`, or `exit:
    /// killed` when it did not stop within `wait`).
    fn finish(mut self, wait: Duration) -> Vec<String> {
        drop(self.child.stdin.take());
        let end = Instant::now() + wait;
        let mut out = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(end.saturating_duration_since(Instant::now())) {
            out.push(l);
        }
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break st.code().map_or(format!("{st}"), |c| c.to_string()),
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break "killed".to_string();
                }
            }
        };
        out.push(format!("exit: {status}"));
        out
    }

    /// Kills the process at once (a crash), without collecting anything.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a `finish` line reports a clean exit.
fn exited_cleanly(lines: &[String]) -> bool {
    lines.last().is_some_and(|l| l == "exit: 0")
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

fn num(line: &str, key: &str) -> f64 {
    field(line, key).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

/// The shared processes: switches (none without a data plane) and the
/// controller.
#[derive(Debug)]
pub struct Infra {
    bins: Bins,
    procs: Vec<Proc>,
    control: Vec<String>,
    controller: String,
    /// What each process said when it started (nodes and ports).
    announced: Vec<String>,
}

impl Infra {
    pub fn start(bins: Bins, switches: u8, faults: Option<&FaultArgs>) -> Result<Infra, String> {
        let mut procs = Vec::new();
        let mut control = Vec::new();
        let mut announced = Vec::new();
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
            let (p, first) = Proc::announced(&bins.protoplane, &format!("switch {i}"), &args)?;
            announced.insert(0, format!("switch {i}: {first}"));
            next = field(&first, "node").map(str::to_string);
            control.insert(
                0,
                field(&first, "control").ok_or("switch: no control address")?.to_string(),
            );
            procs.push(p);
        }
        let mut args = vec!["controller".to_string(), "--stop-on-eof".into()];
        args.extend(control.iter().map(|c| format!("--switch={c}")));
        let (p, first) = Proc::announced(&bins.protoplane, "controller", &args)?;
        let controller = first.rsplit(' ').next().unwrap_or_default().to_string();
        announced.push(format!("controller: {first}"));
        procs.push(p);
        Ok(Infra { bins, procs, control, controller, announced })
    }

    /// Kills the first switch (SIGKILL).
    pub fn kill_switch(&mut self) -> Result<(), String> {
        let i = self.procs.iter().position(|p| p.name == "switch 0").ok_or("no switch")?;
        self.procs.remove(i).kill();
        Ok(())
    }

    /// Kills the controller (SIGKILL) and starts a new one on its port.
    pub fn restart_controller(&mut self) -> Result<(), String> {
        let i = self.procs.iter().position(|p| p.name == "controller").ok_or("no controller")?;
        let old = self.procs.remove(i);
        old.kill();
        let port = self.controller.rsplit(':').next().unwrap_or_default().to_string();
        let mut args =
            vec!["controller".to_string(), "--stop-on-eof".into(), format!("--port={port}")];
        args.extend(self.control.iter().map(|c| format!("--switch={c}")));
        let (p, first) = Proc::announced(&self.bins.protoplane, "controller", &args)?;
        self.announced.push(format!("controller (restarted): {first}"));
        self.procs.push(p);
        Ok(())
    }

    /// Stops everything; returns what each printed and whether every
    /// process exited cleanly.
    pub fn finish(self) -> (Vec<String>, bool) {
        let mut lines = self.announced;
        let mut clean = true;
        for p in self.procs.into_iter().rev() {
            let name = p.name.clone();
            let out = p.finish(Duration::from_secs(5));
            clean &= exited_cleanly(&out);
            lines.extend(out.into_iter().map(|l| format!("{name}: {l}")));
        }
        (lines, clean)
    }
}

/// How to run one application instance.
#[derive(Clone, Debug, Default)]
pub struct AppSpec {
    pub app: String,
    pub clients: u16,
    pub scale: u32,
    pub agent_faults: Option<FaultArgs>,
    pub seed: u64,
    pub extra: Vec<String>,
    pub progress: bool,
    /// A member whose client restarts halfway.
    pub restart_member: Option<u16>,
    /// Where the roles write their results.
    pub results: Option<PathBuf>,
}

/// A running application instance.
#[derive(Debug)]
pub struct AppRun {
    server: Proc,
    clients: Vec<Proc>,
    /// The restarting member's second process: its arguments.
    restart: Option<(u16, Vec<String>)>,
    inc: PathBuf,
    pub ready: String,
    /// The server checks results too (the agreement leader).
    needs_server_verdict: bool,
    /// The member whose client was killed on purpose.
    killed: Option<u16>,
}

/// What one application instance measured.
#[derive(Debug, Default, Clone)]
pub struct RunReport {
    pub exact: bool,
    /// Longest client time (work only, no process start).
    pub seconds: f64,
    pub items: u64,
    pub server_packets: u64,
    /// What reached the server agent through the network (INC datagrams).
    pub server_bytes: u64,
    /// Ordinary calls the clients' stubs made to the server, and their
    /// request bytes (encoded protobuf, IEDT fields cut out; HTTP/2 framing
    /// not counted).
    pub rpcs: u64,
    pub rpc_bytes: u64,
    /// The same calls' bytes on the wire to the server: TCP payload
    /// (HTTP/2 and gRPC framing included), counted by a relay.
    pub rpc_wire_bytes: u64,
    pub server_cpu: f64,
    pub commit_latency_us: f64,
    /// Agreement: first proposal to last commit.
    pub leader_seconds: f64,
    /// Client detail lines.
    pub details: Vec<String>,
    /// (microseconds since the epoch, items) of every progress line.
    pub progress: Vec<(u64, u64)>,
    pub lines: Vec<String>,
}

impl RunReport {
    /// Bytes that reached the server: INC datagrams and ordinary calls.
    pub fn bytes_to_server(&self) -> u64 {
        self.server_bytes + self.rpc_wire_bytes
    }
}

impl AppRun {
    /// Kills member `m`'s client (SIGKILL).
    pub fn kill_client(&mut self, m: u16) -> Result<(), String> {
        let i = usize::from(m);
        if i >= self.clients.len() {
            return Err(format!("no client {m}"));
        }
        let killed = Proc::start(&PathBuf::from("true"), &format!("client {m} (killed)"), &[])?;
        std::mem::replace(&mut self.clients[i], killed).kill();
        self.killed = Some(m);
        Ok(())
    }

    pub fn start(infra: &Infra, spec: &AppSpec) -> Result<AppRun, String> {
        let name =
            format!("{}-{}-{}", spec.app, std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let role = |role: &str, member: u16| {
            let mut v = vec![
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
            if let Some(dir) = &spec.results {
                v.push(format!("--results={}", dir.display()));
            }
            v.extend(spec.extra.iter().cloned());
            v
        };
        let inc = &infra.bins.inc;
        let (server, ready) = Proc::announced(inc, "server", &role("server", 0))?;
        let rpc = field(&ready, "rpc").ok_or_else(|| format!("server announced {ready:?}"))?;
        let mut restart = None;
        let clients = (0..spec.clients)
            .map(|m| {
                let mut args = role("client", m);
                args.push(format!("--rpc={rpc}"));
                if spec.restart_member == Some(m) {
                    restart = Some((m, [args.clone(), vec!["--part=2".into()]].concat()));
                    args.push("--part=1".into());
                }
                Proc::start(inc, &format!("client {m}"), &args)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let needs_server_verdict = spec.app == App::Agreement.name();
        Ok(AppRun {
            server,
            clients,
            restart,
            inc: inc.clone(),
            ready,
            needs_server_verdict,
            killed: None,
        })
    }

    /// Waits for every client's verdict (until `deadline`), then stops the
    /// server. The run is exact only if every client printed a verdict of
    /// `exact=yes`, the server's verdict (agreement) did too, and every
    /// process exited with status 0.
    pub fn finish(self, deadline: Instant) -> RunReport {
        let mut r = RunReport { exact: true, ..RunReport::default() };
        r.lines.push(format!("server {}", self.ready));
        let members = self.clients.len();
        let mut clients: Vec<(usize, Proc)> = self.clients.into_iter().enumerate().collect();
        if let Some((m, args)) = &self.restart {
            // The first process of the member does its half and exits;
            // then a new one joins as the same member.
            let m = usize::from(*m);
            let first = clients.remove(m).1;
            let mut first = first;
            let verdict = first.line_matching("verdict", deadline);
            let out = first.finish(Duration::from_secs(5));
            r.lines.push(format!(
                "client {m} (first process): {}, {}",
                verdict.as_deref().unwrap_or("no verdict"),
                out.last().map_or("", String::as_str)
            ));
            r.exact &= verdict.is_some_and(|v| v.contains("exact=yes")) && exited_cleanly(&out);
            match Proc::start(&self.inc, &format!("client {m} (restarted)"), args) {
                Ok(p) => clients.insert(m, (m, p)),
                Err(e) => {
                    r.exact = false;
                    r.lines.push(format!("client {m}: the restart failed: {e}"));
                }
            }
        }
        // Synchronous aggregation: the members each step's result is over,
        // as each client saw it.
        let mut overs: Vec<(usize, String)> = Vec::new();
        for (m, mut c) in clients {
            if self.killed == Some(m as u16) {
                // Killed on purpose: no verdict, no clean exit.
                let _ = c.finish(Duration::from_secs(1));
                r.lines.push(format!("client {m}: killed"));
                continue;
            }
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
                    if let Some(over) = l.split("over=").nth(1) {
                        overs.push((m, over.split_whitespace().next().unwrap_or("").to_string()));
                    }
                    r.lines.push(format!("client {m}: {l}"));
                }
                None => {
                    r.exact = false;
                    r.lines.push(format!("client {m}: no verdict (timed out or failed)"));
                }
            }
            let out = c.finish(Duration::from_secs(5));
            if !exited_cleanly(&out) {
                r.exact = false;
            }
            r.lines.push(format!("client {m}: {}", out.last().map_or("", String::as_str)));
        }
        if let Some((_, first)) = overs.first() {
            let (same, allowed) = check_overs(members, self.killed, &overs);
            r.exact &= same && allowed;
            if !same {
                r.lines.push(format!("the members' steps are over different members: {overs:?}"));
            } else if !allowed {
                r.lines.push(format!("a step is over members other than expected: {first}"));
            } else if first.split(',').any(|m| m != "0") {
                let without = first.split(',').filter(|m| *m != "0").count();
                r.lines.push(format!(
                    "{without} steps summed without the killed member, the same for every member"
                ));
            }
        }
        let out = self.server.finish(Duration::from_secs(10));
        let mut server_verdict = None;
        for l in &out {
            if l.starts_with("verdict") {
                server_verdict = Some(l.contains("exact=yes"));
            }
            if l.starts_with("server ") {
                r.server_packets = num(l, "packets") as u64;
                r.server_bytes = num(l, "bytes") as u64;
                r.server_cpu = num(l, "cpu");
                r.commit_latency_us = num(l, "commit_latency_us");
                r.leader_seconds = num(l, "leader_s");
                r.rpc_wire_bytes = num(l, "rpc_wire_in") as u64;
            }
            r.lines.push(format!("server: {l}"));
        }
        match (self.needs_server_verdict, server_verdict) {
            (_, Some(v)) => r.exact &= v,
            (true, None) => {
                r.exact = false;
                r.lines.push("server: no verdict".into());
            }
            (false, None) => {}
        }
        r.exact &= exited_cleanly(&out);
        r
    }
}

/// Whether every client of `members` saw each step over the same members,
/// and whether those are every member (`0`) or every member but the one
/// `killed` (and no step over every member after one without it).
fn check_overs(members: usize, killed: Option<u16>, overs: &[(usize, String)]) -> (bool, bool) {
    let first = &overs[0].1;
    let same = overs.iter().all(|(_, o)| o == first);
    let everyone = protoplane_inc::plan::member_mask(members as u16);
    let without = killed.map(|k| format!("{:x}", everyone & !(1u64 << k)));
    let mut lost = false;
    let allowed = first.split(',').all(|m| {
        if m == "0" {
            return !lost;
        }
        lost = true;
        Some(m) == without.as_deref()
    });
    (same, allowed)
}

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub fn inc_run(a: &RunArgs) -> Result<RunReport, String> {
    let app = App::parse(&a.app)
        .ok_or_else(|| format!("--app {:?}: sync-agg, async-agg, key-value or agreement", a.app))?;
    a.faults.check().map_err(|e| e.to_string())?;
    if a.clients == 0 || a.clients > 32 {
        return Err(format!("--clients {}: 1 to 32", a.clients));
    }
    if !(1..=2).contains(&a.switches) {
        return Err(format!("--switches {}: 1 or 2", a.switches));
    }
    if let Some(m) = a.restart_client {
        if !matches!(app, App::KeyValue | App::AsyncAgg) || m == 0 || m >= a.clients {
            return Err(format!(
                "--restart-client {m}: a member from 1 to {} of key-value or async-agg \
                 (member 0 reads the results)",
                a.clients - 1
            ));
        }
    }
    if let Some(p) = &a.member_loss {
        if MemberLoss::parse(p).is_none() {
            return Err(format!("--member-loss {p}: fail or continue"));
        }
    }
    let switches = if a.no_switch { 0 } else { a.switches };
    let mut infra = Infra::start(Bins::find()?, switches, Some(&a.faults))?;
    let spec = AppSpec {
        app: a.app.clone(),
        clients: a.clients,
        scale: a.scale,
        agent_faults: a.no_switch.then(|| a.faults.clone()),
        seed: a.faults.seed,
        restart_member: a.restart_client,
        extra: match &a.member_loss {
            Some(p) => vec![format!("--member-loss={p}")],
            None => Vec::new(),
        },
        results: a.results.clone(),
        ..AppSpec::default()
    };
    let started = Instant::now();
    let deadline = started + Duration::from_secs(a.timeout_s);
    let run = match AppRun::start(&infra, &spec) {
        Ok(run) => run,
        Err(e) => {
            let (lines, _) = infra.finish();
            return Err(format!("{e}\n{}", lines.join("\n")));
        }
    };
    let mut notes = Vec::new();
    let attack = if a.attack { Some(Attack::start(&infra, &run)?) } else { None };
    if let Some(ms) = a.kill_switch_ms {
        if switches != 1 {
            return Err("--kill-switch-ms needs one switch".into());
        }
        std::thread::sleep(Duration::from_millis(ms));
        infra.kill_switch()?;
        notes.push(format!("switch killed {ms} ms into the run"));
    }
    let mut second = None;
    if let Some(ms) = a.restart_controller_ms {
        std::thread::sleep(Duration::from_millis(ms));
        infra.restart_controller()?;
        notes.push(format!("controller killed and restarted {ms} ms into the run"));
        // A second instance while the first runs: the new controller must
        // give it an id, flows and memory the switches do not hold.
        let spec2 = AppSpec {
            restart_member: None,
            results: a.results.as_ref().map(|d| d.join("second")),
            ..spec.clone()
        };
        second = Some(AppRun::start(&infra, &spec2)?);
    }
    let mut run = run;
    if let Some(m) = a.kill_client {
        std::thread::sleep(Duration::from_millis(a.kill_client_ms));
        run.kill_client(m)?;
        notes.push(format!("client {m} killed {} ms into the run", a.kill_client_ms));
    }
    let mut report = run.finish(deadline);
    if let Some(run) = second {
        let r2 = run.finish(deadline);
        report.exact &= r2.exact;
        report.lines.push("second instance:".into());
        report.lines.extend(r2.lines.into_iter().map(|l| format!("  {l}")));
    }
    // The forgeries stop before the switch does, so it saw every one.
    let attack = attack.map(Attack::stop);
    let (lines, clean) = infra.finish();
    report.lines.extend(lines);
    report.exact &= clean;
    if let Some(attack) = attack {
        let (ok, line) = attack.check(&report.lines);
        report.exact &= ok;
        notes.push(line);
    }
    report.lines.extend(notes);
    Ok(report)
}

/// Forged datagrams sent during a run (`inc run --attack`).
#[derive(Debug)]
struct Attack {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sender: std::thread::JoinHandle<u64>,
    bystander: std::net::UdpSocket,
}

impl Attack {
    /// Starts sending, from a socket of its own, to the first switch (or,
    /// without one, to the server agent).
    fn start(infra: &Infra, run: &AppRun) -> Result<Attack, String> {
        use protoplane_inc::packet::{Addr, Header, Kind, Packet, Pair};
        let app: u16 = field(&run.ready, "app").and_then(|v| v.parse().ok()).ok_or("no app id")?;
        let server: u16 =
            field(&run.ready, "node").and_then(|v| v.parse().ok()).ok_or("no server node")?;
        let switch: Option<u16> = infra
            .announced
            .iter()
            .find(|l| l.starts_with("switch 0:"))
            .and_then(|l| field(l, "node"))
            .and_then(|v| v.parse().ok());
        let target = switch.unwrap_or(server);
        let bystander = std::net::UdpSocket::bind((LOOPBACK, 0)).map_err(|e| e.to_string())?;
        bystander.set_nonblocking(true).map_err(|e| e.to_string())?;
        let port = bystander.local_addr().map_err(|e| e.to_string())?.port();
        let sock = std::net::UdpSocket::bind((LOOPBACK, 0)).map_err(|e| e.to_string())?;
        let src = sock.local_addr().map_err(|e| e.to_string())?.port();
        let packets: Vec<Vec<u8>> = [app, app ^ 0x7fff]
            .into_iter()
            .flat_map(|id| {
                let wide = |dst: u16| {
                    let mut h = Header::new(Kind::Wide, id, server, dst);
                    h.ext = Header::SEQUENCED;
                    Packet::wide(h, Vec::new()).to_bytes()
                };
                let mut far = Header::new(Kind::Agg, id, src, server);
                far.aux = (1 << 30) + 5;
                let pairs = (0..8)
                    .map(|i| Pair { key: i, addr: Addr::new(0, i as u8, 5), value: 1 << 20 })
                    .collect();
                // A relay to a port outside the application, a loop through
                // the switch, a chunk far ahead.
                [wide(port), wide(target), Packet::pairs(far, pairs).to_bytes()]
            })
            .collect();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let sender = std::thread::spawn(move || {
            let mut sent = 0u64;
            while !s.load(Ordering::Relaxed) && sent < 30_000 {
                for p in &packets {
                    if sock.send_to(p, (LOOPBACK, target)).is_ok() {
                        sent += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            sent
        });
        Ok(Attack { stop, sender, bystander })
    }

    /// Stops sending; how many datagrams went out.
    fn stop(self) -> Stopped {
        self.stop.store(true, Ordering::Relaxed);
        let sent = self.sender.join().unwrap_or(0);
        Stopped { sent, bystander: self.bystander }
    }
}

/// An attack that stopped.
#[derive(Debug)]
struct Stopped {
    sent: u64,
    bystander: std::net::UdpSocket,
}

impl Stopped {
    /// Whether nothing leaked (the bystander port received nothing) and a
    /// switch counted the forgeries as dropped (all but what loopback
    /// itself may drop when a socket buffer is full: 5%), and a line
    /// saying so.
    fn check(self, lines: &[String]) -> (bool, String) {
        let sent = self.sent;
        let mut buf = [0u8; 2048];
        let mut leaked = 0;
        while self.bystander.recv_from(&mut buf).is_ok() {
            leaked += 1;
        }
        let stats = lines.iter().find(|l| l.contains("switch stats"));
        let count = |key: &str| -> u64 {
            stats
                .and_then(|l| l.split(&format!("{key}: ")).nth(1))
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        let dropped = count("forged") + count("not_admitted");
        let counted = stats.is_none() || (dropped * 100 >= sent * 95 && dropped <= sent);
        (
            leaked == 0 && counted,
            format!(
                "attack: {sent} forged datagrams sent, {leaked} reached the bystander port, \
                 the switch dropped {dropped} (forged or not admitted)"
            ),
        )
    }
}

/// `protoplane inc gen`: every input of a run as JSON lines.
pub fn inc_gen(a: &GenArgs, out: &mut impl Write) -> Result<(), String> {
    let app = App::parse(&a.app)
        .ok_or_else(|| format!("--app {:?}: sync-agg, async-agg, key-value or agreement", a.app))?;
    if a.clients == 0 || a.clients > 32 {
        return Err(format!("--clients {}: 1 to 32", a.clients));
    }
    let mut w = |v: serde_json::Value| writeln!(out, "{v}").map_err(|e| format!("stdout: {e}"));
    match app {
        App::SyncAgg => {
            for m in 0..a.clients {
                for (step, g) in crate::check::gradients(a.seed, m, a.scale, 0).iter().enumerate() {
                    w(serde_json::json!({"member": m, "step": step, "gradient": g}))?;
                }
            }
        }
        App::AsyncAgg => {
            for m in 0..a.clients {
                for line in crate::check::corpus_share(m, a.clients, a.scale) {
                    w(serde_json::json!({"member": m, "line": line}))?;
                }
            }
        }
        App::KeyValue => {
            for m in 0..a.clients {
                for (i, r) in crate::check::reports(a.seed, m, a.scale).iter().enumerate() {
                    w(serde_json::json!({"member": m, "report": i, "deltas": r}))?;
                }
            }
        }
        App::Agreement => {
            for (instance, value) in crate::check::proposals(a.seed, a.scale) {
                w(serde_json::json!({"role": "leader", "instance": instance, "value": value}))?;
            }
        }
    }
    Ok(())
}

pub fn print_run(a: &RunArgs, r: &RunReport) -> String {
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
         and {} ordinary calls / {} bytes on the wire ({} bytes of messages), server CPU {:.3} s\n",
        r.seconds,
        r.items,
        r.server_packets,
        r.server_bytes,
        r.rpcs,
        r.rpc_wire_bytes,
        r.rpc_bytes,
        r.server_cpu
    ));
    s.push_str(&format!("exact: {}\n", yes(r.exact)));
    s
}
