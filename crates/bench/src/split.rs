//! `protoplane bench split`: what splitting the RPC tax off the
//! application costs and what it buys.
//!
//! Three experiments, each measurement in fresh processes, the modes
//! interleaved with their order rotating every round, medians over rounds:
//!
//! * **handoff**: the shepherding ring one way (`protoplane-bench bench-ring`):
//!   median and p99 latency from ping-pong, descriptors per second.
//! * **zero**: zero business logic, the social-network service
//!   (`protoplane serve`) monolithic, split (`protoplane engine` + `serve
//!   --attach`) and, over gRPC, tonic + prost (`bench/peers-rpc`): QPS,
//!   p50/p99, CPU per call of each process, over gRPC/HTTP2 and the lean
//!   transport, at 1 and 64 calls in flight.
//! * **knee** (Split gRPC, Fig. 2): `protoplane-bench bench-echo` answers each
//!   call with a copy of its request after a busy loop of `busy_us`;
//!   HyperProtoBench bench3 M3 (845 B), bench4 M43 (36 KB) and bench5 M34
//!   (476 KB) as request and response, monolithic vs split, over gRPC at
//!   `--in-flight` calls. Writes the plot (SVG) beside the CSV.
//! * **neighbour** (isolation): the social-network service, monolithic vs
//!   split, under open-loop load at a fixed `--rate` (64 slots), while a
//!   CPU-bound co-tenant (`protoplane-bench bench-cotenant`) spins a share
//!   of every 10 ms on the application's core: p50/p99 and the rate
//!   achieved against the co-tenant's load. The monolithic server does all
//!   of its RPC work on the shared core; split leaves it only the handler.
//!   Writes `neighbour.svg` (p99 and achieved rate against the load).
//! * **workers** (the engine on several cores): the social-network service
//!   at 64 in flight over 4 client connections, monolithic against split
//!   with the engine's connections sharded over 1 and 2 worker threads
//!   (`--workers`, pinned to `--worker-cpus`), each worker with its own
//!   rings to the application (which attaches once per worker).
//!
//! Placement: the application (or the monolithic server, or tonic) runs on
//! `--app-cpu`; the engine on `--engine-cpu`; the load generator on
//! `--load-cpu`. On a two-core machine the engine and the load generator
//! share a core (the defaults), which handicaps split: the core that the
//! engine takes the RPC tax to is also generating the load. CPU per call
//! (user + system from `/proc/PID/stat`, over the load run, divided by the
//! calls) does not depend on placement, so the cost comparison rests on it;
//! `*_util` is that CPU per call times QPS, the share of a core the process
//! kept busy. Every process runs with the same glibc malloc settings
//! (`same_malloc`: freed big blocks are kept), so 476 KB messages do not
//! fault fresh pages in on one side and not the other.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod outbound;

use crate::rpc::median;
use protoplane_load::servers::{monolithic, split, Servers};
use protoplane_plot as svg;

#[derive(clap::Args, Debug)]
pub(crate) struct SplitArgs {
    /// A short run (one round, few points, short loads): checks that
    /// everything runs; its figures are not measurements.
    #[arg(long)]
    quick: bool,
    /// Write every measurement as a CSV row here.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Write the knee plot here [default: target/bench/split/knee.svg].
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Write the report (Markdown) here too.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// Rounds [default: 3; --quick: 1].
    #[arg(long)]
    rounds: Option<usize>,
    /// Seconds of load per measurement [default: 2; --quick: 0.4].
    #[arg(long)]
    seconds: Option<f64>,
    /// Business-logic times to sweep, µs, comma-separated
    /// [default: 0,10,25,50,100,250,500,1000; --quick: 0,100,500].
    #[arg(long, value_delimiter = ',')]
    busy_us: Vec<u64>,
    /// Calls in flight in the knee experiment.
    #[arg(long, default_value_t = 16)]
    in_flight: usize,
    /// Experiments to run: handoff, zero, knee, neighbour, upgrade (a live
    /// engine take-over under load), policy (the engine's CPU per call
    /// with and without a policy), outbound (an application's calls to
    /// another service, in-process or through the engine), fanout (a
    /// front end making four calls per call), workers (the engine's
    /// connections sharded over 1 and 2 worker threads).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "handoff,zero,knee,neighbour,upgrade,policy,outbound,fanout,workers"
    )]
    experiments: Vec<String>,
    /// Offered load of the neighbour experiment, calls/s (open loop)
    /// [default: 10000].
    #[arg(long, value_name = "QPS")]
    rate: Option<f64>,
    /// Co-tenant loads of the neighbour experiment (shares of the
    /// application's core) [default: 0,0.25,0.5,0.75,1; --quick: 0,0.75].
    #[arg(long, value_delimiter = ',')]
    cotenant_loads: Vec<f64>,
    /// Core of the engine.
    #[arg(long, default_value_t = 0)]
    engine_cpu: usize,
    /// Core of the application (and of the monolithic server).
    #[arg(long, default_value_t = 1)]
    app_cpu: usize,
    /// Core of the load generator.
    #[arg(long, default_value_t = 0)]
    load_cpu: usize,
    /// Engine worker counts of the workers experiment.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    engine_workers: Vec<usize>,
    /// Cores of the engine's workers, in order [default: the engine's
    /// core, then the application's].
    #[arg(long, value_delimiter = ',')]
    worker_cpus: Vec<usize>,
    /// How long the engine and the application spin before they park, µs.
    #[arg(long, default_value_t = 20)]
    spin_us: u64,
    /// Leave tonic out of the zero-logic experiment (it is built with
    /// cargo on first use).
    #[arg(long)]
    no_tonic: bool,
}

const CSV_HEADER: &str = "experiment,mode,transport,message,bytes,busy_us,in_flight,round,qps,p50_us,p99_us,engine_cpu_us_per_call,app_cpu_us_per_call,engine_util,app_util,errors,cotenant_load,offered_qps,failed_calls,max_gap_ms,engine_workers\n";

/// A command for `prog` pinned to `cpu`, with the allocator settings every
/// process of the benchmark shares (`crate::same_malloc`).
fn pinned(cpu: usize, prog: &Path) -> Command {
    let mut c = crate::rpc::pinned(cpu, prog);
    crate::same_malloc(&mut c);
    c
}

/// One measurement (one CSV row).
#[derive(Clone, Debug, Default)]
struct Row {
    experiment: &'static str,
    /// monolithic, split or tonic.
    mode: &'static str,
    /// grpc, lean or ring.
    transport: &'static str,
    message: String,
    bytes: usize,
    busy_us: u64,
    in_flight: usize,
    round: usize,
    qps: f64,
    p50_us: f64,
    p99_us: f64,
    /// 0 when there is no engine (monolithic, tonic).
    engine_cpu: f64,
    /// The application's CPU per call, or the whole server's when
    /// monolithic.
    app_cpu: f64,
    errors: u64,
    /// The co-tenant's share of the application's core (neighbour).
    cotenant_load: f64,
    /// The open-loop rate offered, calls/s (0: closed loop).
    offered_qps: f64,
    /// The longest time between two OK calls ending, ms (NaN: not
    /// measured, as in the handoff rows).
    max_gap_ms: f64,
    /// The engine's worker threads (0: connections served on its main
    /// runtime, as every experiment but `workers` runs it).
    engine_workers: usize,
}

impl Row {
    fn csv(&self) -> String {
        format!(
            "{},{},{},{},{},{},{},{},{:.1},{:.2},{:.2},{:.3},{:.3},{:.3},{:.3},{},{:.2},{:.0},{},{},{}\n",
            self.experiment,
            self.mode,
            self.transport,
            self.message,
            self.bytes,
            self.busy_us,
            self.in_flight,
            self.round,
            self.qps,
            self.p50_us,
            self.p99_us,
            self.engine_cpu,
            self.app_cpu,
            self.engine_cpu * self.qps / 1e6,
            self.app_cpu * self.qps / 1e6,
            self.errors,
            self.cotenant_load,
            self.offered_qps,
            // Every failed call: the same count as `errors`, named as the
            // upgrade experiment's target names it.
            self.errors,
            if self.max_gap_ms.is_finite() { format!("{:.1}", self.max_gap_ms) } else { String::new() },
            self.engine_workers,
        )
    }
}

/// Outcome of one load run (also `bench python`'s).
pub(crate) struct Measured {
    pub(crate) qps: f64,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) ok: u64,
    pub(crate) errors: u64,
    /// CPU per call, µs, of the engine (0 without one) and the application.
    pub(crate) engine_cpu: f64,
    pub(crate) app_cpu: f64,
    pub(crate) max_gap_ms: f64,
}

impl Measured {
    /// A row of this measurement; the caller names what was measured.
    fn row(&self) -> Row {
        Row {
            qps: self.qps,
            p50_us: self.p50,
            p99_us: self.p99,
            engine_cpu: self.engine_cpu,
            app_cpu: self.app_cpu,
            errors: self.errors,
            max_gap_ms: self.max_gap_ms,
            ..Row::default()
        }
    }
}

/// Runs `protoplane load` against `servers` and reads the CPU each server
/// process used meanwhile.
fn load(
    plan: &Plan<'_>,
    servers: &Servers,
    transport: &str,
    load_args: &[String],
    in_flight: usize,
    rate: Option<f64>,
) -> Result<Measured, String> {
    let target = match transport {
        "lean" => servers.lean.clone().ok_or("no lean address")?,
        _ => servers.grpc.clone(),
    };
    let json = plan.work.join("load.json");
    let _ = std::fs::remove_file(&json);
    let mut cmd = pinned(plan.args.load_cpu, &plan.exe);
    cmd.arg("load")
        .args(["--target", &target, "--transport", transport])
        .args(load_args)
        .args(["--concurrency", &in_flight.to_string()])
        // Open loop: the first calls (connections opening, caches cold)
        // are a warm-up, not a measurement.
        .args(rate.into_iter().flat_map(|r| [format!("--rate={r}"), "--warmup=0.3".into()]))
        .args(["--duration", &plan.seconds.to_string(), "--quiet", "--json"])
        .arg(&json);
    measure(cmd, &json, servers)
}

/// Runs the `protoplane load` command `cmd` (writing its report to `json`)
/// and reads the CPU each of `servers`' processes used meanwhile.
pub(crate) fn measure(
    mut cmd: Command,
    json: &std::path::Path,
    servers: &Servers,
) -> Result<Measured, String> {
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let cpu_of = |pid: Option<u32>| pid.and_then(protoplane_load::host::pid_cpu_seconds);
    let (e0, a0) = (cpu_of(servers.engine), cpu_of(Some(servers.app)));
    let status = cmd.status().map_err(|e| format!("load: {e}"))?;
    let (e1, a1) = (cpu_of(servers.engine), cpu_of(Some(servers.app)));
    if !status.success() {
        return Err(format!("load failed ({status})"));
    }
    let text = std::fs::read_to_string(json).map_err(|e| format!("{}: {e}", json.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let ok = v["ok"].as_u64().unwrap_or(0);
    let errors: u64 =
        v["errors"].as_object().map(|m| m.values().filter_map(|x| x.as_u64()).sum()).unwrap_or(0);
    let calls = (ok + errors).max(1) as f64;
    let per_call =
        |a: Option<f64>, b: Option<f64>| a.zip(b).map_or(0.0, |(a, b)| (b - a) * 1e6 / calls);
    Ok(Measured {
        qps: v["qps"].as_f64().unwrap_or(0.0),
        p50: v["latency_us"]["p50"].as_f64().unwrap_or(f64::NAN),
        p99: v["latency_us"]["p99"].as_f64().unwrap_or(f64::NAN),
        ok,
        errors,
        engine_cpu: per_call(e0, e1),
        app_cpu: per_call(a0, a1),
        max_gap_ms: v["max_gap_ms"].as_f64().unwrap_or(f64::NAN),
    })
}

/// A knee message: HyperProtoBench `bench`/`message`, with the files the
/// run needs.
struct KneeMessage {
    bench: &'static str,
    message: &'static str,
    bytes: usize,
    /// `--proto … -I …` for the engine, the application and the load.
    schema_args: Vec<String>,
    /// `--method … --data …` for the load.
    call_args: Vec<String>,
}

const KNEE: [(&str, &str); 3] = [("bench3", "M3"), ("bench4", "M43"), ("bench5", "M34")];

/// Writes, for each knee message, a service answering it with itself
/// (`protoplane.splitbench.Echo/<message>`, importing the benchmark's own
/// `.proto`) and the request as a delimited file.
fn knee_messages(hpb: &Path, work: &Path) -> Result<Vec<KneeMessage>, String> {
    let manifest = std::fs::read_to_string(hpb.join("manifest.tsv"))
        .map_err(|e| format!("{}: {e}", hpb.join("manifest.tsv").display()))?;
    let mut out = Vec::new();
    for (bench, message) in KNEE {
        let row = manifest
            .lines()
            .map(|l| l.split('\t').collect::<Vec<_>>())
            .find(|c| c.len() >= 12 && c[0] == bench && c[1] == message)
            .ok_or_else(|| format!("manifest.tsv lists no {bench} {message}"))?;
        let bin = std::fs::read(hpb.join(row[11])).map_err(|e| format!("{}: {e}", row[11]))?;
        let dir = work.join(bench);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let proto = dir.join("echo.proto");
        let text = format!(
            "// Generated by `protoplane bench split`.\nsyntax = \"proto2\";\npackage protoplane.splitbench;\nimport \"benchmark.proto\";\nservice Echo {{\n  rpc {message}(hyperprotobench.{message}) returns (hyperprotobench.{message});\n}}\n"
        );
        std::fs::write(&proto, text).map_err(|e| e.to_string())?;
        let data = dir.join(format!("{message}.ldelim"));
        let mut framed = Vec::new();
        protoplane_load::framing::Framing::new(true).put(&mut framed, &bin);
        std::fs::write(&data, framed).map_err(|e| e.to_string())?;
        out.push(KneeMessage {
            bench,
            message,
            bytes: bin.len(),
            schema_args: vec![
                "--proto".into(),
                proto.display().to_string(),
                "-I".into(),
                dir.display().to_string(),
                "-I".into(),
                hpb.join(bench).display().to_string(),
            ],
            call_args: vec![
                "--method".into(),
                format!("protoplane.splitbench.Echo/{message}"),
                "--data".into(),
                data.display().to_string(),
            ],
        });
    }
    Ok(out)
}

struct Plan<'a> {
    args: &'a SplitArgs,
    /// `protoplane`: the engine, the server, the load generator.
    exe: PathBuf,
    /// This binary: the echo application and the ring measurement.
    me: PathBuf,
    work: PathBuf,
    rounds: usize,
    seconds: f64,
}

impl Plan<'_> {
    fn engine(&self, extra: &[String]) -> Command {
        self.engine_on(&self.args.engine_cpu.to_string(), extra)
    }

    /// The engine pinned to `cores` (a list for `taskset -c` and
    /// `--cores`).
    fn engine_on(&self, cores: &str, extra: &[String]) -> Command {
        let mut c = Command::new("taskset");
        c.args(["-c", cores]).arg(&self.exe);
        crate::same_malloc(&mut c);
        let sock = self.work.join("engine.sock");
        let _ = std::fs::remove_file(&sock);
        c.args(["engine", "--grpc-port", "0", "--lean-port", "0", "--threads", "1"])
            .arg("--attach")
            .arg(&sock)
            .args(["--cores", cores])
            .args(["--spin-us", &self.args.spin_us.to_string()])
            .args(extra);
        c
    }

    /// A `protoplane` application process (`serve …`).
    fn app(&self, args: &[String]) -> Command {
        let mut c = pinned(self.args.app_cpu, &self.exe);
        c.args(args);
        c
    }

    /// This binary's echo application (`bench-echo …`).
    fn echo(&self, args: &[String]) -> Command {
        let mut c = pinned(self.args.app_cpu, &self.me);
        c.args(args);
        c
    }

    fn sock(&self) -> String {
        self.work.join("engine.sock").display().to_string()
    }
}

/// `protoplane bench split`.
pub(crate) fn run(args: &SplitArgs) -> Result<String, String> {
    let repo = std::env::current_dir().map_err(|e| e.to_string())?;
    let work = repo.join("target/bench/split");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let plan = Plan {
        args,
        exe: crate::protoplane()?,
        me: crate::this_binary()?,
        work: work.clone(),
        rounds: args.rounds.unwrap_or(if args.quick { 1 } else { 3 }).max(1),
        seconds: args.seconds.unwrap_or(if args.quick { 0.4 } else { 2.0 }),
    };
    let wants = |e: &str| args.experiments.iter().any(|x| x == e);
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    if args.engine_cpu == args.app_cpu {
        notes.push(format!(
            "engine and application share core {}: split has no core of its own here",
            args.app_cpu
        ));
    }
    let means = if wants("handoff") { handoff(&plan, &mut rows, &mut notes)? } else { Vec::new() };
    if wants("zero") {
        zero(&plan, &repo, &mut rows, &mut notes)?;
    }
    if wants("neighbour") {
        neighbour(&plan, &repo, &mut rows, &mut notes)?;
    }
    if wants("upgrade") {
        upgrade(&plan, &repo, &mut rows, &mut notes)?;
    }
    if wants("policy") {
        policy(&plan, &repo, &mut rows, &mut notes)?;
    }
    if wants("outbound") {
        outbound::outbound(&plan, &mut rows, &mut notes)?;
    }
    if wants("fanout") {
        outbound::fanout(&plan, &mut rows, &mut notes)?;
    }
    if wants("workers") {
        workers(&plan, &repo, &mut rows, &mut notes)?;
    }
    let mut knee_done = false;
    if wants("knee") {
        let hpb = repo.parent().map(|p| p.join("shared/datasets/hyperprotobench"));
        match hpb.filter(|d| d.join("manifest.tsv").is_file()) {
            Some(hpb) => {
                let msgs = knee_messages(&hpb, &work)?;
                knee(&plan, &msgs, &mut rows, &mut notes)?;
                knee_done = true;
            }
            None => notes.push(
                "knee: skipped, it needs HyperProtoBench (../shared/datasets/hyperprotobench)"
                    .into(),
            ),
        }
    }
    eprintln!();
    let csv: String =
        std::iter::once(CSV_HEADER.to_string()).chain(rows.iter().map(Row::csv)).collect();
    let csv_path = args.csv.clone().unwrap_or_else(|| work.join("split.csv"));
    std::fs::write(&csv_path, csv).map_err(|e| format!("{}: {e}", csv_path.display()))?;
    notes.push(format!("every measurement: {}", csv_path.display()));
    if knee_done {
        let svg_path = args.svg.clone().unwrap_or_else(|| work.join("knee.svg"));
        std::fs::write(&svg_path, plot(&plan, &rows))
            .map_err(|e| format!("{}: {e}", svg_path.display()))?;
        notes.push(format!("knee plot: {}", svg_path.display()));
    }
    if rows.iter().any(|r| r.experiment == "neighbour") {
        let svg_path = work.join("neighbour.svg");
        std::fs::write(&svg_path, plot_neighbour(&plan, &rows))
            .map_err(|e| format!("{}: {e}", svg_path.display()))?;
        notes.push(format!("neighbour plot: {}", svg_path.display()));
    }
    let md = report(&plan, &rows, &means, &notes);
    if let Some(p) = &args.markdown {
        std::fs::write(p, &md).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(md)
}

fn progress(what: &str) {
    eprint!("\r{what:<78}");
}

/// Runs the ring handoff; returns the mean one-way time of each round (ns).
fn handoff(
    plan: &Plan<'_>,
    rows: &mut Vec<Row>,
    notes: &mut Vec<String>,
) -> Result<Vec<f64>, String> {
    let mut means = Vec::new();
    if plan.args.engine_cpu == plan.args.app_cpu {
        notes.push("handoff: skipped, it needs two cores (both sides spin)".into());
        return Ok(means);
    }
    let (trips, descs) = if plan.args.quick { (20_000, 500_000) } else { (200_000, 5_000_000) };
    for round in 0..plan.rounds {
        progress(&format!("handoff: round {}", round + 1));
        let out = Command::new(&plan.me)
            .arg("bench-ring")
            .args(["--engine-cpu", &plan.args.engine_cpu.to_string()])
            .args(["--app-cpu", &plan.args.app_cpu.to_string()])
            .args(["--round-trips", &trips.to_string(), "--descriptors", &descs.to_string()])
            .output()
            .map_err(|e| format!("bench-ring: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Vec<f64> = text.trim().split(',').filter_map(|x| x.parse().ok()).collect();
        if !out.status.success() || v.len() != 4 {
            return Err(format!("bench-ring failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        means.push(v[3]);
        rows.push(Row {
            experiment: "handoff",
            mode: "split",
            transport: "ring",
            message: "descriptor".into(),
            bytes: 64,
            busy_us: 0,
            in_flight: 1,
            round: round + 1,
            qps: v[2],
            p50_us: v[0] / 1e3,
            p99_us: v[1] / 1e3,
            engine_cpu: 0.0,
            app_cpu: 0.0,
            errors: 0,
            ..Row::default()
        });
    }
    Ok(means)
}

fn zero(
    plan: &Plan<'_>,
    repo: &Path,
    rows: &mut Vec<Row>,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let (load_args, note) = crate::rpc::social_requests(repo, &plan.work, 200)?;
    notes.push(format!("zero: social-network {note}"));
    let tonic = if plan.args.no_tonic {
        None
    } else {
        let t = crate::rpc::tonic_server(repo);
        if t.is_none() {
            notes.push("zero: the tonic server did not build; left out".into());
        }
        t
    };
    let points: Vec<(&'static str, usize)> =
        vec![("grpc", 1), ("grpc", 64), ("lean", 1), ("lean", 64)];
    for round in 0..plan.rounds {
        for &(transport, in_flight) in &points {
            let mut modes = vec!["monolithic", "split"];
            if transport == "grpc" && tonic.is_some() {
                modes.push("tonic");
            }
            for k in 0..modes.len() {
                let mode = modes[(k + round) % modes.len()];
                progress(&format!(
                    "zero: round {} {mode} {transport} {in_flight} in flight",
                    round + 1
                ));
                let servers = match (mode, &tonic) {
                    ("tonic", Some(t)) => {
                        let mut c = pinned(plan.args.app_cpu, t);
                        c.args(["--port", "0", "--threads", "1"]);
                        monolithic(c)?
                    }
                    _ => social_server(plan, mode)?,
                };
                let m = load(plan, &servers, transport, &load_args, in_flight, None);
                drop(servers);
                let m = match m {
                    Ok(m) => m,
                    Err(e) => {
                        notes.push(format!("zero: {mode} {transport} {in_flight}: {e}"));
                        continue;
                    }
                };
                rows.push(Row {
                    experiment: "zero",
                    mode,
                    transport,
                    message: "socialnetwork".into(),
                    bytes: 0,
                    busy_us: 0,
                    in_flight,
                    round: round + 1,
                    ..m.row()
                });
            }
        }
    }
    Ok(())
}

/// The social-network service (`protoplane serve`): `split` (an engine
/// and the service attached to it) or monolithic.
fn social_server(plan: &Plan<'_>, mode: &str) -> Result<Servers, String> {
    Ok(match mode {
        "split" => split_social(plan, &[])?,
        _ => monolithic(plan.app(&[
            "serve".into(),
            "--port".into(),
            "0".into(),
            "--lean-port".into(),
            "0".into(),
            "--threads".into(),
            "1".into(),
        ]))?,
    })
}

/// The social-network service attached to an engine started with
/// `engine_extra` flags.
fn split_social(plan: &Plan<'_>, engine_extra: &[String]) -> Result<Servers, String> {
    split_social_on(plan, plan.engine(engine_extra))
}

/// The social-network service attached to the engine `engine` starts.
fn split_social_on(plan: &Plan<'_>, engine: Command) -> Result<Servers, String> {
    let app = plan.app(&[
        "serve".into(),
        "--attach".into(),
        plan.sock(),
        "--spin-us".into(),
        plan.args.spin_us.to_string(),
    ]);
    Ok(split(engine, app)?)
}

/// The co-tenant: `bench-cotenant` on the application's core, stopped
/// (its stdin closed, then killed) when dropped.
struct Cotenant(std::process::Child);

impl Cotenant {
    fn start(plan: &Plan<'_>, load: f64) -> Result<Cotenant, String> {
        let mut c = pinned(plan.args.app_cpu, &plan.me);
        c.args(["bench-cotenant", "--load", &load.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c.spawn().map(Cotenant).map_err(|e| format!("bench-cotenant: {e}"))
    }
}

impl Drop for Cotenant {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn cotenant_loads(args: &SplitArgs) -> Vec<f64> {
    if !args.cotenant_loads.is_empty() {
        return args.cotenant_loads.clone();
    }
    if args.quick {
        vec![0.0, 0.75]
    } else {
        vec![0.0, 0.25, 0.5, 0.75, 1.0]
    }
}

/// Slots of the neighbour experiment's open-loop load: enough that a
/// stalled server delays calls rather than the generator.
const NEIGHBOUR_SLOTS: usize = 64;

fn neighbour(
    plan: &Plan<'_>,
    repo: &Path,
    rows: &mut Vec<Row>,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let loads = cotenant_loads(plan.args);
    if let Some(l) = loads.iter().find(|l| !(0.0..=1.0).contains(*l)) {
        return Err(format!("--cotenant-loads: {l} is not a share of a core (0 to 1)"));
    }
    let rate = plan.args.rate.unwrap_or(10_000.0);
    if !(rate.is_finite() && rate > 0.0) {
        return Err(format!("--rate {rate}: calls per second, above 0"));
    }
    let (load_args, _) = crate::rpc::social_requests(repo, &plan.work, 200)?;
    let modes = ["monolithic", "split"];
    for round in 0..plan.rounds {
        for (i, &cotenant_load) in loads.iter().enumerate() {
            for k in 0..modes.len() {
                let mode = modes[(k + round + i) % modes.len()];
                progress(&format!(
                    "neighbour: round {} {mode} co-tenant {:.0}% at {rate:.0} calls/s",
                    round + 1,
                    cotenant_load * 100.0
                ));
                let servers = social_server(plan, mode)?;
                let cotenant = if cotenant_load > 0.0 {
                    Some(Cotenant::start(plan, cotenant_load)?)
                } else {
                    None
                };
                let m = load(plan, &servers, "grpc", &load_args, NEIGHBOUR_SLOTS, Some(rate));
                drop(cotenant);
                drop(servers);
                let m = match m {
                    Ok(m) => m,
                    Err(e) => {
                        notes.push(format!("neighbour: {mode} co-tenant {cotenant_load}: {e}"));
                        continue;
                    }
                };
                rows.push(Row {
                    experiment: "neighbour",
                    mode,
                    transport: "grpc",
                    message: "socialnetwork".into(),
                    in_flight: NEIGHBOUR_SLOTS,
                    round: round + 1,
                    cotenant_load,
                    offered_qps: rate,
                    ..m.row()
                });
            }
        }
    }
    Ok(())
}

/// Calls in flight in the upgrade and policy experiments.
const MANAGED_IN_FLIGHT: usize = 64;

/// The live upgrade: the social-network service split, 64 calls in flight
/// over gRPC (closed loop), and, in `take-over` runs, a second engine
/// started with `--take-over` at 40% of the run; `steady` runs are the
/// same without it. Failed calls and the longest gap between two OK calls
/// ending are the measurement.
fn upgrade(
    plan: &Plan<'_>,
    repo: &Path,
    rows: &mut Vec<Row>,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let (load_args, _) = crate::rpc::social_requests(repo, &plan.work, 200)?;
    let seconds = plan.seconds.max(1.0);
    let admin = plan.work.join("admin.sock");
    let modes = ["steady", "take-over"];
    for round in 0..plan.rounds {
        for k in 0..modes.len() {
            let mode = modes[(k + round) % modes.len()];
            progress(&format!("upgrade: round {} {mode}", round + 1));
            let extra = ["--admin".to_string(), admin.display().to_string()];
            let servers = split_social(plan, &extra)?;
            let log = plan.work.join("take-over.log");
            let (m, handed) = std::thread::scope(|scope| {
                let running = scope.spawn(|| load_for(plan, &servers, &load_args, seconds));
                let mut new = None;
                if mode == "take-over" {
                    std::thread::sleep(std::time::Duration::from_secs_f64(seconds * 0.4));
                    // The flags of the first engine; the attach socket and
                    // the listeners come from it (its socket file stays:
                    // not `Plan::engine`, which clears a stale one).
                    let mut c = pinned(plan.args.engine_cpu, &plan.exe);
                    c.args(["engine", "--threads", "1", "--take-over"])
                        .arg(&admin)
                        .args(["--cores", &plan.args.engine_cpu.to_string()])
                        .args(["--spin-us", &plan.args.spin_us.to_string()]);
                    let out = std::fs::File::create(&log).ok();
                    c.stdout(Stdio::null())
                        .stderr(out.map_or_else(Stdio::null, Stdio::from))
                        .stdin(Stdio::null());
                    new = c.spawn().ok();
                }
                let m = running.join().unwrap_or_else(|_| Err("the load thread panicked".into()));
                if let Some(mut n) = new {
                    let _ = n.kill();
                    let _ = n.wait();
                }
                let said = std::fs::read_to_string(&log).unwrap_or_default();
                (m, mode == "steady" || said.contains("the old engine: done"))
            });
            let _ = std::fs::remove_file(&log);
            drop(servers);
            let m = match m {
                Ok(m) => m,
                Err(e) => {
                    notes.push(format!("upgrade: {mode}: {e}"));
                    continue;
                }
            };
            if !handed {
                notes.push(format!(
                    "upgrade: round {}: the new engine did not report the hand-over done",
                    round + 1
                ));
            }
            rows.push(Row {
                experiment: "upgrade",
                mode: if handed { mode } else { "take-over-incomplete" },
                transport: "grpc",
                message: "socialnetwork".into(),
                in_flight: MANAGED_IN_FLIGHT,
                round: round + 1,
                // Two engines share a take-over run: no per-call split.
                engine_cpu: 0.0,
                ..m.row()
            });
        }
    }
    Ok(())
}

/// [`load`] for `seconds`, closed loop, over gRPC, for the upgrade runs.
fn load_for(
    plan: &Plan<'_>,
    servers: &Servers,
    load_args: &[String],
    seconds: f64,
) -> Result<Measured, String> {
    let p = Plan {
        seconds,
        exe: plan.exe.clone(),
        me: plan.me.clone(),
        work: plan.work.clone(),
        ..*plan
    };
    load(&p, servers, "grpc", load_args, MANAGED_IN_FLIGHT, None)
}

/// The policy's cost: the social-network service split, 64 calls in
/// flight over gRPC, the engine with no policy against the engine with
/// one that checks every call (two access rules, a rate limit, a
/// concurrency limit and a priority share, none of them refusing).
/// Client connections of the workers experiment (more than the largest
/// worker count, so every worker gets some).
const WORKERS_CONNECTIONS: usize = 4;

/// The engine on several cores: monolithic against split with 1, 2, …
/// engine workers, each point over [`WORKERS_CONNECTIONS`] connections.
fn workers(
    plan: &Plan<'_>,
    repo: &Path,
    rows: &mut Vec<Row>,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let (load_args, _) = crate::rpc::social_requests(repo, &plan.work, 200)?;
    let mut load_args = load_args;
    load_args.extend(["--connections".to_string(), WORKERS_CONNECTIONS.to_string()]);
    let a = plan.args;
    let cpus = if a.worker_cpus.is_empty() {
        let mut v = vec![a.engine_cpu];
        if a.app_cpu != a.engine_cpu {
            v.push(a.app_cpu);
        }
        v
    } else {
        a.worker_cpus.clone()
    };
    let mut modes: Vec<usize> = vec![0];
    modes.extend(a.engine_workers.iter().copied().filter(|&w| w > 0));
    let most = modes.iter().copied().max().unwrap_or(1);
    if most > 1 && cpus.iter().take(most).any(|&c| c == a.app_cpu) {
        notes.push(format!(
            "workers: engine workers on cores {:?}, the application on core {}: with {} workers the engine shares the application's core",
            &cpus[..most.min(cpus.len())],
            a.app_cpu,
            most
        ));
    }
    for round in 0..plan.rounds {
        for transport in ["lean", "grpc"] {
            for k in 0..modes.len() {
                let w = modes[(k + round) % modes.len()];
                let mode = if w == 0 { "monolithic" } else { "split" };
                progress(&format!("workers: round {} {mode} {w} {transport}", round + 1));
                let servers = if w == 0 {
                    social_server(plan, "monolithic")?
                } else {
                    let mine: Vec<usize> = (0..w).map(|i| cpus[i % cpus.len()]).collect();
                    let list = mine.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
                    let engine = plan.engine_on(&list, &["--workers".to_string(), w.to_string()]);
                    split_social_on(plan, engine)?
                };
                let m = load(plan, &servers, transport, &load_args, 64, None);
                drop(servers);
                match m {
                    Ok(m) => rows.push(Row {
                        experiment: "workers",
                        mode,
                        transport,
                        message: "socialnetwork".into(),
                        in_flight: 64,
                        round: round + 1,
                        engine_workers: w,
                        ..m.row()
                    }),
                    Err(e) => notes.push(format!("workers: {mode} {w} {transport}: {e}")),
                }
            }
        }
    }
    Ok(())
}

fn policy(
    plan: &Plan<'_>,
    repo: &Path,
    rows: &mut Vec<Row>,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let (load_args, _) = crate::rpc::social_requests(repo, &plan.work, 200)?;
    let config = plan.work.join("policy.toml");
    std::fs::write(&config, POLICY).map_err(|e| format!("{}: {e}", config.display()))?;
    let modes = ["split", "split+policy"];
    for round in 0..plan.rounds {
        for k in 0..modes.len() {
            let mode = modes[(k + round) % modes.len()];
            progress(&format!("policy: round {} {mode}", round + 1));
            let extra = match mode {
                "split" => Vec::new(),
                _ => vec!["--config".to_string(), config.display().to_string()],
            };
            let servers = split_social(plan, &extra)?;
            let m = load(plan, &servers, "grpc", &load_args, MANAGED_IN_FLIGHT, None);
            drop(servers);
            match m {
                Ok(m) => rows.push(Row {
                    experiment: "policy",
                    mode,
                    transport: "grpc",
                    message: "socialnetwork".into(),
                    in_flight: MANAGED_IN_FLIGHT,
                    round: round + 1,
                    ..m.row()
                }),
                Err(e) => notes.push(format!("policy: {mode}: {e}")),
            }
        }
        // The check alone, in this process: what the engine adds per call.
        progress(&format!("policy: round {} the check alone", round + 1));
        rows.push(Row {
            experiment: "policy",
            mode: "check",
            transport: "none",
            message: "socialnetwork".into(),
            round: round + 1,
            engine_cpu: policy_check_us()?,
            ..Row::default()
        });
    }
    Ok(())
}

/// [`POLICY`]'s check of one social-network call (rules, limits, priority;
/// the permit dropped as the call ends), µs per call: the median of 5
/// batches of 200,000.
fn policy_check_us() -> Result<f64, String> {
    use protoplane_engine::policy::{CallInfo, Policies};
    let (spec, _) = protoplane_engine::config::split_policy(POLICY)?;
    let schema = protoplane_load::social::schema()?;
    let paths: Vec<String> = schema.methods().iter().map(|m| m.path.clone()).collect();
    let path = paths.first().cloned().ok_or("the social-network schema has no method")?;
    let policies = Policies::new(spec, paths).map_err(|e| format!("policy: {e}"))?;
    let metadata = protoplane_grpc::Metadata::new();
    let call = CallInfo {
        path: &path,
        service: "socialnetwork.SocialNetwork",
        metadata: &metadata,
        peer: None,
    };
    const N: u32 = 200_000;
    let mut batches = Vec::new();
    for _ in 0..5 {
        let t = std::time::Instant::now();
        for _ in 0..N {
            let permit = policies.admit(std::hint::black_box(&call));
            std::hint::black_box(permit.map_err(|st| format!("the policy refused: {st:?}"))?);
        }
        batches.push(t.elapsed().as_secs_f64() * 1e6 / f64::from(N));
    }
    Ok(median(batches))
}

/// The policy of the `policy` experiment: every call is checked by both
/// rules (the first looks at its metadata), the rate and concurrency
/// limits of its application and the engine's priority share; none
/// refuses at this load.
const POLICY: &str = r#"
[policy]
max_calls = 100000

[[policy.rules]]
action = "deny"
methods = ["/socialnetwork.SocialNetwork/*"]
clients = ["metadata:x-tenant=blocked"]

[[policy.rules]]
action = "allow"
methods = ["/socialnetwork.SocialNetwork/*"]

[policy.limits."socialnetwork.SocialNetwork"]
rate = 100000000
burst = 100000000
concurrency = 100000
priority = "high"
"#;

fn upgrade_report(rows: &[Row]) -> String {
    let mut md = String::from(
        "\n### Live engine upgrade (`engine --take-over`, 64 calls in flight, gRPC, closed loop)\n\n",
    );
    md += "| run | rounds | QPS | p99 µs | failed calls (sum) | longest gap ms (median) | longest gap ms (max) |\n";
    md += "|---|---:|---:|---:|---:|---:|---:|\n";
    let mut verdicts = String::new();
    for mode in ["steady", "take-over", "take-over-incomplete"] {
        let rs: Vec<&Row> =
            rows.iter().filter(|r| r.experiment == "upgrade" && r.mode == mode).collect();
        if rs.is_empty() {
            continue;
        }
        let failed: u64 = rs.iter().map(|r| r.errors).sum();
        let gaps: Vec<f64> = rs.iter().map(|r| r.max_gap_ms).filter(|g| g.is_finite()).collect();
        let worst = gaps.iter().copied().fold(f64::NAN, f64::max);
        md += &format!(
            "| {mode} | {} | {:.0} | {:.0} | {failed} | {:.1} | {:.1} |\n",
            rs.len(),
            median(rs.iter().map(|r| r.qps).collect()),
            median(rs.iter().map(|r| r.p99_us).collect()),
            median(gaps.clone()),
            worst
        );
        if mode == "take-over" {
            verdicts += &format!(
                "- 0 failed calls across a take-over: {} ({failed})\n",
                verdict(failed == 0)
            );
            verdicts += &format!(
                "- longest gap between two completed calls ≤ 250 ms: {} (worst {worst:.1} ms)\n",
                verdict(worst <= 250.0)
            );
        }
    }
    if rows.iter().any(|r| r.experiment == "upgrade" && r.mode == "take-over-incomplete") {
        verdicts += "- a take-over did not complete in every round: **not met**\n";
    }
    md + "\nTargets:\n" + &verdicts
}

fn policy_report(rows: &[Row]) -> String {
    let mut md = String::from(
        "\n### Policy cost (ACL + rate + concurrency + priority on every call, 64 in flight, gRPC)\n\n",
    );
    md += "| engine | rounds | QPS | engine CPU µs/call | application CPU µs/call |\n|---|---:|---:|---:|---:|\n";
    let cpu = |mode: &str| {
        let rs: Vec<&Row> =
            rows.iter().filter(|r| r.experiment == "policy" && r.mode == mode).collect();
        (
            rs.len(),
            median(rs.iter().map(|r| r.qps).collect()),
            median(rs.iter().map(|r| r.engine_cpu).collect()),
            median(rs.iter().map(|r| r.app_cpu).collect()),
        )
    };
    let (without, with) = (cpu("split"), cpu("split+policy"));
    for (name, c) in [("no policy", without), ("with the policy", with)] {
        md += &format!("| {name} | {} | {:.0} | {:.3} | {:.3} |\n", c.0, c.1, c.2, c.3);
    }
    let check = cpu("check").2;
    let share = check / without.2;
    md += &format!(
        "\nThe check alone (in this process, the same policy, one call's rules, limits, priority \
         share and permit): {:.0} ns per call.\n\nTarget: the policy costs ≤ 5% of the engine's CPU \
         per call: {} ({:.2}% of the engine's {:.3} µs; the two engines' CPU per call differ by \
         {:+.1}%, which is this machine's noise between runs, not the policy)\n",
        check * 1e3,
        verdict(share <= 0.05),
        share * 100.0,
        without.2,
        (with.2 / without.2 - 1.0) * 100.0
    );
    md
}

fn busy_list(args: &SplitArgs) -> Vec<u64> {
    if !args.busy_us.is_empty() {
        return args.busy_us.clone();
    }
    if args.quick {
        vec![0, 100, 500]
    } else {
        vec![0, 10, 25, 50, 100, 250, 500, 1000]
    }
}

fn knee(
    plan: &Plan<'_>,
    msgs: &[KneeMessage],
    rows: &mut Vec<Row>,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let busy = busy_list(plan.args);
    let modes = ["monolithic", "split"];
    for round in 0..plan.rounds {
        for m in msgs {
            for &b in &busy {
                for k in 0..modes.len() {
                    let mode = modes[(k + round + b as usize) % modes.len()];
                    progress(&format!(
                        "knee: round {} {} {} busy {b} µs {mode}",
                        round + 1,
                        m.bench,
                        m.message
                    ));
                    let mut echo = vec!["bench-echo".to_string()];
                    echo.extend(m.schema_args.iter().cloned());
                    echo.extend(["--busy-us".into(), b.to_string()]);
                    let servers = if mode == "split" {
                        echo.extend(["--attach".into(), plan.sock()]);
                        echo.extend(["--spin-us".into(), plan.args.spin_us.to_string()]);
                        split(plan.engine(&m.schema_args), plan.echo(&echo))?
                    } else {
                        monolithic(plan.echo(&echo))?
                    };
                    let mut load_args = m.schema_args.clone();
                    load_args.extend(m.call_args.iter().cloned());
                    let r = load(plan, &servers, "grpc", &load_args, plan.args.in_flight, None);
                    drop(servers);
                    let r = match r {
                        Ok(r) => r,
                        Err(e) => {
                            notes.push(format!("knee: {} {mode} busy {b}: {e}", m.message));
                            continue;
                        }
                    };
                    rows.push(Row {
                        experiment: "knee",
                        mode,
                        transport: "grpc",
                        message: format!("{}/{}", m.bench, m.message),
                        bytes: m.bytes,
                        busy_us: b,
                        in_flight: plan.args.in_flight,
                        round: round + 1,
                        ..r.row()
                    });
                }
            }
        }
    }
    Ok(())
}

/// Median over rounds of `f` for the rows `pick` selects.
fn med(rows: &[Row], pick: impl Fn(&Row) -> bool, f: impl Fn(&Row) -> f64) -> f64 {
    median(rows.iter().filter(|r| pick(r)).map(f).collect())
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**not met**"
    }
}

fn report(plan: &Plan<'_>, rows: &[Row], handoff_means: &[f64], notes: &[String]) -> String {
    let a = plan.args;
    let mut md = format!(
        "Engine on core {}, application (and monolithic server, tonic) on core {}, load on core {}; \
         engine and application spin {} µs before parking; {} s per measurement, fresh processes, modes \
         interleaved, median of {} round(s).{}\n",
        a.engine_cpu,
        a.app_cpu,
        a.load_cpu,
        a.spin_us,
        plan.seconds,
        plan.rounds,
        if a.quick { " **--quick: a smoke run, not a measurement.**" } else { "" }
    );
    let handoff: Vec<&Row> = rows.iter().filter(|r| r.experiment == "handoff").collect();
    if !handoff.is_empty() {
        let p50 = median(handoff.iter().map(|r| r.p50_us * 1e3).collect());
        let p99 = median(handoff.iter().map(|r| r.p99_us * 1e3).collect());
        let rate = median(handoff.iter().map(|r| r.qps).collect());
        let mean = median(handoff_means.to_vec());
        md += "\n### Ring handoff, one way\n\n| p50 ns | p99 ns | mean ns (no clock reads) | descriptors/s |\n|---:|---:|---:|---:|\n";
        md += &format!("| {p50:.0} | {p99:.0} | {mean:.0} | {:.1} M |\n", rate / 1e6);
        md += &format!("\nTarget p50 ≤ 150 ns: {} ({p50:.0} ns).\n", verdict(p50 <= 150.0));
    }
    let zero: Vec<&Row> = rows.iter().filter(|r| r.experiment == "zero").collect();
    if !zero.is_empty() {
        md += "\n### Zero business logic (social-network service)\n\n";
        md += "| mode | transport | in flight | QPS | p50 µs | p99 µs | engine CPU µs/call | app CPU µs/call | total CPU µs/call | vs monolithic (CPU/call) | errors |\n";
        md += "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
        let mut points: Vec<(&str, usize)> =
            zero.iter().map(|r| (r.transport, r.in_flight)).collect();
        points.dedup();
        points.sort();
        points.dedup();
        for &(t, n) in &points {
            let at = |mode: &'static str| {
                move |r: &Row| {
                    r.experiment == "zero" && r.mode == mode && r.transport == t && r.in_flight == n
                }
            };
            let mono_cpu = med(rows, at("monolithic"), |r| r.engine_cpu + r.app_cpu);
            for mode in ["monolithic", "split", "tonic"] {
                if !rows.iter().any(at(mode)) {
                    continue;
                }
                let total = med(rows, at(mode), |r| r.engine_cpu + r.app_cpu);
                let errors: u64 = rows.iter().filter(|r| at(mode)(r)).map(|r| r.errors).sum();
                md += &format!(
                    "| {mode} | {t} | {n} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {total:.2} | {:.2}× | {errors} |\n",
                    med(rows, at(mode), |r| r.qps),
                    med(rows, at(mode), |r| r.p50_us),
                    med(rows, at(mode), |r| r.p99_us),
                    med(rows, at(mode), |r| r.engine_cpu),
                    med(rows, at(mode), |r| r.app_cpu),
                    total / mono_cpu,
                );
            }
        }
        let cell = |mode: &str, t: &str, n: usize, f: &dyn Fn(&Row) -> f64| {
            med(
                rows,
                |r| {
                    r.experiment == "zero" && r.mode == mode && r.transport == t && r.in_flight == n
                },
                f,
            )
        };
        let total = |r: &Row| r.engine_cpu + r.app_cpu;
        md += "\nTargets:\n";
        for t in ["grpc", "lean"] {
            let ratio = cell("split", t, 64, &total) / cell("monolithic", t, 64, &total);
            if ratio.is_finite() {
                md += &format!(
                    "- split costs ≤ 10% at zero business logic ({t}, 64 in flight, engine + application CPU per call vs the monolithic server's): {} ({:+.0}%)\n",
                    verdict(ratio <= 1.10),
                    (ratio - 1.0) * 100.0
                );
            }
        }
        let lean = cell("split", "lean", 64, &total);
        if lean.is_finite() {
            md += &format!(
                "- engine + application CPU per small call ≤ 1 µs on lean (64 in flight): {} ({lean:.2} µs)\n",
                verdict(lean <= 1.0)
            );
        }
        let p50 = |r: &Row| r.p50_us;
        let ratio = cell("split", "grpc", 1, &p50) / cell("tonic", "grpc", 1, &p50);
        if ratio.is_finite() {
            md += &format!(
                "- p50 at 1 in flight over gRPC ≤ 0.6× tonic's: {} ({ratio:.2}×: {:.0} µs vs {:.0} µs)\n",
                verdict(ratio <= 0.6),
                cell("split", "grpc", 1, &p50),
                cell("tonic", "grpc", 1, &p50)
            );
        }
    }
    if rows.iter().any(|r| r.experiment == "workers") {
        md += &format!(
            "\n### The engine on several cores (social-network service, 64 in flight, {WORKERS_CONNECTIONS} connections)\n\n"
        );
        md += "| mode | engine workers | transport | QPS | p50 µs | p99 µs | engine CPU µs/call | app CPU µs/call | total CPU µs/call | QPS vs monolithic | errors |\n";
        md += "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
        let mut ws: Vec<usize> =
            rows.iter().filter(|r| r.experiment == "workers").map(|r| r.engine_workers).collect();
        ws.sort();
        ws.dedup();
        for t in ["lean", "grpc"] {
            let at = |w: usize| {
                move |r: &Row| {
                    r.experiment == "workers" && r.transport == t && r.engine_workers == w
                }
            };
            let mono = med(rows, at(0), |r| r.qps);
            for &w in &ws {
                if !rows.iter().any(at(w)) {
                    continue;
                }
                let errors: u64 = rows.iter().filter(|r| at(w)(r)).map(|r| r.errors).sum();
                md += &format!(
                    "| {} | {w} | {t} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2}× | {errors} |\n",
                    if w == 0 { "monolithic" } else { "split" },
                    med(rows, at(w), |r| r.qps),
                    med(rows, at(w), |r| r.p50_us),
                    med(rows, at(w), |r| r.p99_us),
                    med(rows, at(w), |r| r.engine_cpu),
                    med(rows, at(w), |r| r.app_cpu),
                    med(rows, at(w), |r| r.engine_cpu + r.app_cpu),
                    med(rows, at(w), |r| r.qps) / mono,
                );
            }
        }
    }
    let knee: Vec<&Row> = rows.iter().filter(|r| r.experiment == "knee").collect();
    if !knee.is_empty() {
        md += &format!(
            "\n### The knee: business logic vs throughput ({} in flight, gRPC)\n\n",
            a.in_flight
        );
        md += "| message | busy µs | monolithic QPS | split QPS | split/mono | mono p50 µs | split p50 µs | mono p99 µs | split p99 µs | mono server CPU µs/call | split engine CPU µs/call | split app CPU µs/call | app core busy mono / split | app-core capacity split/mono | errors |\n";
        md += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
        let mut msgs: Vec<String> = Vec::new();
        for r in &knee {
            if !msgs.contains(&r.message) {
                msgs.push(r.message.clone());
            }
        }
        let mut summary = String::new();
        for msg in &msgs {
            let mut saturated = Vec::new();
            for b in busy_list(a) {
                let at = |mode: &'static str| {
                    let msg = msg.clone();
                    move |r: &Row| {
                        r.experiment == "knee"
                            && r.mode == mode
                            && r.message == msg
                            && r.busy_us == b
                    }
                };
                if !rows.iter().any(at("split")) && !rows.iter().any(at("monolithic")) {
                    continue;
                }
                let (mq, sq) =
                    (med(rows, at("monolithic"), |r| r.qps), med(rows, at("split"), |r| r.qps));
                let util = med(rows, at("split"), |r| r.app_cpu * r.qps / 1e6);
                let errors: u64 = rows
                    .iter()
                    .filter(|r| r.experiment == "knee" && &r.message == msg && r.busy_us == b)
                    .map(|r| r.errors)
                    .sum();
                let (mp99, sp99) = (
                    med(rows, at("monolithic"), |r| r.p99_us),
                    med(rows, at("split"), |r| r.p99_us),
                );
                let mono_util = med(rows, at("monolithic"), |r| r.app_cpu * r.qps / 1e6);
                // What one application core sustains when it is the
                // bottleneck: 1 / its CPU per call (the monolithic server's
                // whole cost, the split application's share).
                let capacity = med(rows, at("monolithic"), |r| r.app_cpu)
                    / med(rows, at("split"), |r| r.app_cpu);
                if util >= 0.9 {
                    saturated.push((b, sq / mq, sp99 / mp99));
                }
                md += &format!(
                    "| {msg} | {b} | {mq:.0} | {sq:.0} | {:.2}× | {:.0} | {:.0} | {mp99:.0} | {sp99:.0} | {:.1} | {:.1} | {:.1} | {:.0}% / {:.0}% | {capacity:.2}× | {errors} |\n",
                    sq / mq,
                    med(rows, at("monolithic"), |r| r.p50_us),
                    med(rows, at("split"), |r| r.p50_us),
                    med(rows, at("monolithic"), |r| r.app_cpu),
                    med(rows, at("split"), |r| r.engine_cpu),
                    med(rows, at("split"), |r| r.app_cpu),
                    mono_util * 100.0,
                    util * 100.0,
                );
            }
            summary += &match (saturated.iter().map(|s| s.1).reduce(f64::min), saturated.iter().map(|s| s.1).reduce(f64::max)) {
                (Some(lo), Some(hi)) => format!(
                    "- {msg}: with the application core ≥ 90% busy (busy {} µs), split/monolithic throughput {lo:.2}× … {hi:.2}× ({}); p99 split/monolithic {}\n",
                    saturated.iter().map(|s| s.0.to_string()).collect::<Vec<_>>().join(", "),
                    verdict(lo >= 1.5),
                    saturated.iter().map(|s| format!("{:.2}×", s.2)).collect::<Vec<_>>().join(", "),
                ),
                _ => format!("- {msg}: the application core never reached 90% busy in split mode\n"),
            };
        }
        md +=
            "\n\"App core busy\" is CPU per call × QPS of the monolithic server and of the split \
               application. \"App-core capacity\" is the monolithic server's CPU per call over the \
               split application's: the throughput ratio when one application core is the \
               bottleneck, whatever else limits a run on this machine (here the engine shares its \
               core with the load generator).\n";
        md += "\nTarget: once the application core saturates, split ≥ 1.5× monolithic throughput \
               (measured QPS, at the points where the split application's core was ≥ 90% busy):\n";
        md += &summary;
    }
    if rows.iter().any(|r| r.experiment == "neighbour") {
        md += &neighbour_report(plan, rows);
    }
    if rows.iter().any(|r| r.experiment == "upgrade") {
        md += &upgrade_report(rows);
    }
    if rows.iter().any(|r| r.experiment == "policy") {
        md += &policy_report(rows);
    }
    md += &outbound::report(rows);
    for n in notes {
        md += &format!("\n- {n}");
    }
    md.push('\n');
    md
}

/// The neighbour experiment's table and targets.
fn neighbour_report(plan: &Plan<'_>, rows: &[Row]) -> String {
    let rate = plan.args.rate.unwrap_or(10_000.0);
    let mut md = format!(
        "\n### A noisy neighbour on the application's core ({rate:.0} calls/s offered, open loop, gRPC)\n\n"
    );
    md += "| co-tenant load | mono QPS | split QPS | mono p50 µs | split p50 µs | mono p99 µs | split p99 µs | split/mono p99 | errors |\n";
    md += "|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    let mut targets = String::new();
    for l in cotenant_loads(plan.args) {
        let at = |mode: &'static str| {
            move |r: &Row| r.experiment == "neighbour" && r.mode == mode && r.cotenant_load == l
        };
        if !rows.iter().any(at("monolithic")) && !rows.iter().any(at("split")) {
            continue;
        }
        let (mq, sq) = (med(rows, at("monolithic"), |r| r.qps), med(rows, at("split"), |r| r.qps));
        let (mp99, sp99) =
            (med(rows, at("monolithic"), |r| r.p99_us), med(rows, at("split"), |r| r.p99_us));
        let errors: u64 = rows
            .iter()
            .filter(|r| r.experiment == "neighbour" && r.cotenant_load == l)
            .map(|r| r.errors)
            .sum();
        md += &format!(
            "| {:.0}% | {mq:.0} | {sq:.0} | {:.0} | {:.0} | {mp99:.0} | {sp99:.0} | {:.2}× | {errors} |\n",
            l * 100.0,
            med(rows, at("monolithic"), |r| r.p50_us),
            med(rows, at("split"), |r| r.p50_us),
            sp99 / mp99,
        );
        if l > 0.0 {
            targets += &format!(
                "- co-tenant {:.0}%: split p99 ≤ 0.5× monolithic p99: {} ({:.2}×); rate achieved split / monolithic {:.2}×\n",
                l * 100.0,
                verdict(sp99 <= 0.5 * mp99),
                sp99 / mp99,
                sq / mq
            );
        }
    }
    md += "\nThe same offered rate against both; QPS is the rate achieved (calls answered per \
           second of the run). The target of 1.5× the rate monolithic sustains needs the rate \
           swept until monolithic falls behind (`--rate`).\n\nTargets:\n";
    md += &targets;
    md
}

/// The neighbour plot: p99 and the rate achieved against the co-tenant's
/// load, monolithic and split.
fn plot_neighbour(plan: &Plan<'_>, rows: &[Row]) -> String {
    let loads = cotenant_loads(plan.args);
    let xs: Vec<String> = loads.iter().map(|l| format!("{:.0}%", l * 100.0)).collect();
    let series = |mode: &'static str, f: fn(&Row) -> f64| -> Vec<f64> {
        loads
            .iter()
            .map(|&l| {
                med(
                    rows,
                    |r| r.experiment == "neighbour" && r.mode == mode && r.cotenant_load == l,
                    f,
                )
            })
            .collect()
    };
    type Metric = (&'static str, &'static str, fn(&Row) -> f64);
    let metrics: [Metric; 3] = [
        ("p99 latency", "µs", |r| r.p99_us),
        ("p50 latency", "µs", |r| r.p50_us),
        ("rate achieved", "calls/s", |r| r.qps),
    ];
    let panels: Vec<svg::Panel> = metrics
        .into_iter()
        .map(|(name, unit, f)| svg::Panel {
            title: name.into(),
            y_label: unit.into(),
            series: vec![
                svg::Series {
                    name: "monolithic".into(),
                    color: "#d62728",
                    ys: series("monolithic", f),
                },
                svg::Series { name: "split".into(), color: "#1f77b4", ys: series("split", f) },
            ],
        })
        .collect();
    svg::grid(
        &format!(
            "a noisy neighbour on the application's core: {:.0} calls/s offered (median of {} rounds)",
            plan.args.rate.unwrap_or(10_000.0),
            plan.rounds
        ),
        "co-tenant load on the application's core",
        &xs,
        &panels,
        3,
    )
}

/// The knee plot: a column per message; rows QPS, p99, CPU per call.
fn plot(plan: &Plan<'_>, rows: &[Row]) -> String {
    let busy = busy_list(plan.args);
    let xs: Vec<String> = busy.iter().map(u64::to_string).collect();
    let mut msgs: Vec<String> = Vec::new();
    for r in rows.iter().filter(|r| r.experiment == "knee") {
        if !msgs.contains(&r.message) {
            msgs.push(r.message.clone());
        }
    }
    let series = |msg: &str, mode: &'static str, f: &dyn Fn(&Row) -> f64| -> Vec<f64> {
        busy.iter()
            .map(|&b| {
                med(
                    rows,
                    |r| {
                        r.experiment == "knee"
                            && r.mode == mode
                            && r.message == msg
                            && r.busy_us == b
                    },
                    f,
                )
            })
            .collect()
    };
    let mut panels = Vec::new();
    type Metric = (&'static str, &'static str, fn(&Row) -> f64);
    let metrics: [Metric; 2] = [("QPS", "calls/s", |r| r.qps), ("p99 latency", "µs", |r| r.p99_us)];
    for (name, unit, f) in metrics {
        for msg in &msgs {
            panels.push(svg::Panel {
                title: format!("{msg}: {name}"),
                y_label: unit.into(),
                series: vec![
                    svg::Series {
                        name: "monolithic".into(),
                        color: "#d62728",
                        ys: series(msg, "monolithic", &f),
                    },
                    svg::Series {
                        name: "split".into(),
                        color: "#1f77b4",
                        ys: series(msg, "split", &f),
                    },
                ],
            });
        }
    }
    for msg in &msgs {
        panels.push(svg::Panel {
            title: format!("{msg}: CPU per call"),
            y_label: "µs".into(),
            series: vec![
                svg::Series {
                    name: "mono server".into(),
                    color: "#d62728",
                    ys: series(msg, "monolithic", &|r| r.app_cpu),
                },
                svg::Series {
                    name: "split engine".into(),
                    color: "#2ca02c",
                    ys: series(msg, "split", &|r| r.engine_cpu),
                },
                svg::Series {
                    name: "split app".into(),
                    color: "#1f77b4",
                    ys: series(msg, "split", &|r| r.app_cpu),
                },
            ],
        });
    }
    svg::grid(
        &format!(
            "protoplane split vs monolithic: business logic per call ({} in flight, gRPC; median of {} rounds)",
            plan.args.in_flight, plan.rounds
        ),
        "business logic, µs per call",
        &xs,
        &panels,
        msgs.len().max(1),
    )
}
