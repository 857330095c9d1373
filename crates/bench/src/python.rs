//! `protoplane bench python`: a Python service's RPC tax, paid in Python
//! (grpcio's servers) or in the protoplane engine (the package in
//! `python/`, the same servicer attached from Python).
//!
//! The social-network handlers are written once as grpcio servicers
//! (`bench/python/social_servicer.py`, sync and async) and served four
//! ways, each Python process pinned to the application's core:
//! - `grpcio-aio`: `grpc.aio.server` with the async servicer;
//! - `protoplane-async`: `protoplane engine` (its own core) with the async
//!   servicer attached by `python -m protoplane.serve --asyncio`;
//! - `grpcio-sync`: the thread-pool `grpc.server` with the sync servicer;
//! - `protoplane-sync`: the engine with the sync servicer attached.
//!
//! `protoplane load` drives each with the social-network requests (the
//! same mix as `bench rpc` and `bench split`) at each number of calls in
//! flight, closed loop; the CPU of the Python process and of the engine
//! is read from `/proc` around the load. Rounds run in fresh processes
//! with the servers' order rotated, and the report takes the median of
//! the rounds.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use protoplane_load::servers::{monolithic, split, Servers};
use protoplane_plot as svg;

use crate::rpc::median;

#[derive(clap::Args, Debug)]
pub(crate) struct PythonArgs {
    /// A short run (one round, short loads): checks that everything runs;
    /// its figures are not measurements.
    #[arg(long)]
    quick: bool,
    /// Write every measurement as a CSV row here
    /// [default: target/bench/python/python.csv].
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Write the report (Markdown) here too.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// Write the plot here [default: target/bench/python/python.svg].
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Rounds [default: 3; --quick: 1].
    #[arg(long)]
    rounds: Option<usize>,
    /// Seconds of load per measurement [default: 2; --quick: 0.5].
    #[arg(long)]
    seconds: Option<f64>,
    /// Calls in flight.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    in_flight: Vec<usize>,
    /// Servers to measure: grpcio-aio, protoplane-async, grpcio-sync,
    /// protoplane-sync.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "grpcio-aio,protoplane-async,grpcio-sync,protoplane-sync"
    )]
    servers: Vec<String>,
    /// The Python with grpcio, grpcio-tools and the protoplane package
    /// (`scripts/setup-python.sh` makes it) [default: .venv/bin/python].
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// Core of the engine.
    #[arg(long, default_value_t = 0)]
    engine_cpu: usize,
    /// Core of the Python process (every server's).
    #[arg(long, default_value_t = 1)]
    app_cpu: usize,
    /// Core of the load generator.
    #[arg(long, default_value_t = 0)]
    load_cpu: usize,
    /// How long the engine spins before it parks, µs. Longer than `bench
    /// split`'s 20: a Python handler answers in some 30 µs (a Rust one in
    /// a few), and an engine that parks before the answer comes pays two
    /// wake-ups per call at low load (p50 at one call in flight: 121 µs
    /// with 20, 53 µs with 100, on this 2-core VM). At 64 in flight the
    /// engine never parks, so it makes no difference there.
    #[arg(long, default_value_t = 100)]
    engine_spin_us: u64,
}

const CSV_HEADER: &str =
    "server,in_flight,qps,p50_us,p99_us,app_cpu_us_per_call,engine_cpu_us_per_call,errors,round\n";

const SERVERS: [&str; 4] = ["grpcio-aio", "protoplane-async", "grpcio-sync", "protoplane-sync"];

/// One measurement.
#[derive(Clone, Debug)]
struct Row {
    server: String,
    in_flight: usize,
    round: usize,
    qps: f64,
    p50: f64,
    p99: f64,
    /// The Python process's CPU per call (the whole server's for grpcio).
    app_cpu: f64,
    /// The engine's (0 for grpcio).
    engine_cpu: f64,
    errors: u64,
}

impl Row {
    fn csv(&self) -> String {
        format!(
            "{},{},{:.1},{:.1},{:.1},{:.2},{:.2},{},{}\n",
            self.server,
            self.in_flight,
            self.qps,
            self.p50,
            self.p99,
            self.app_cpu,
            self.engine_cpu,
            self.errors,
            self.round
        )
    }
}

struct Plan<'a> {
    args: &'a PythonArgs,
    repo: PathBuf,
    exe: PathBuf,
    python: PathBuf,
    work: PathBuf,
    gen: PathBuf,
    seconds: f64,
}

impl Plan<'_> {
    /// `python ARGS` pinned to the application's core, importing the
    /// generated modules and the bench servicers.
    fn python(&self, args: &[&str]) -> Command {
        let mut c = crate::rpc::pinned(self.args.app_cpu, &self.python);
        crate::same_malloc(&mut c);
        let path = std::env::join_paths([self.gen.clone(), self.repo.join("bench/python")])
            .unwrap_or_default();
        c.env("PYTHONPATH", path).env("PYTHONUNBUFFERED", "1").args(args);
        c
    }

    fn start(&self, server: &str) -> Result<Servers, String> {
        let servicer = |sync: bool| {
            if sync {
                "social_servicer:SocialNetwork"
            } else {
                "social_servicer:AsyncSocialNetwork"
            }
        };
        let script = self.repo.join("bench/python/grpcio_server.py");
        let script = script.to_string_lossy();
        match server {
            "grpcio-aio" | "grpcio-sync" => {
                let mode = if server == "grpcio-aio" { "aio" } else { "sync" };
                Ok(monolithic(self.python(&[&script, "--mode", mode, "--port", "0"]))?)
            }
            "protoplane-async" | "protoplane-sync" => {
                let sock = self.work.join("engine.sock");
                let _ = std::fs::remove_file(&sock);
                let mut engine = crate::rpc::pinned(self.args.engine_cpu, &self.exe);
                crate::same_malloc(&mut engine);
                engine
                    .args(["engine", "--grpc-port", "0", "--threads", "1"])
                    .arg("--attach")
                    .arg(&sock)
                    .args(["--cores", &self.args.engine_cpu.to_string()])
                    .args(["--spin-us", &self.args.engine_spin_us.to_string()]);
                let sock = sock.to_string_lossy();
                let sync = server == "protoplane-sync";
                let mut app = vec!["-m", "protoplane.serve", "--attach", &sock, servicer(sync)];
                if !sync {
                    app.push("--asyncio");
                }
                Ok(split(engine, self.python(&app))?)
            }
            other => Err(format!("unknown server {other:?} (one of {})", SERVERS.join(", "))),
        }
    }
}

/// `protoplane bench python`.
pub(crate) fn run(args: &PythonArgs) -> Result<String, String> {
    let repo = std::env::current_dir().map_err(|e| e.to_string())?;
    let work = repo.join("target/bench/python");
    let gen = work.join("gen");
    std::fs::create_dir_all(&gen).map_err(|e| format!("{}: {e}", gen.display()))?;
    let python = args.python.clone().unwrap_or_else(|| repo.join(".venv/bin/python"));
    for s in &args.servers {
        if !SERVERS.contains(&s.as_str()) {
            return Err(format!("unknown server {s:?} (one of {})", SERVERS.join(", ")));
        }
    }
    prepare(&python, &repo, &gen)?;
    let plan = Plan {
        args,
        repo: repo.clone(),
        exe: crate::protoplane()?,
        python,
        work: work.clone(),
        gen,
        seconds: args.seconds.unwrap_or(if args.quick { 0.5 } else { 2.0 }),
    };
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 3 }).max(1);
    let (load_args, note) = crate::rpc::social_requests(&repo, &work, 200)?;
    let mut notes = vec![format!("requests: social-network {note}")];
    let mut rows = Vec::new();
    for round in 0..rounds {
        for &in_flight in &args.in_flight {
            let n = args.servers.len();
            for k in 0..n {
                let server = &args.servers[(k + round) % n];
                eprint!("\rbench python: round {} {server} {in_flight} in flight      ", round + 1);
                let m = plan.start(server).and_then(|s| load(&plan, &s, &load_args, in_flight));
                match m {
                    Ok(mut r) => {
                        r.server = server.clone();
                        r.in_flight = in_flight;
                        r.round = round + 1;
                        rows.push(r);
                    }
                    Err(e) => {
                        let n = format!("{server} {in_flight} in flight: {e}");
                        if !notes.contains(&n) {
                            notes.push(n);
                        }
                    }
                }
            }
        }
    }
    eprintln!();
    let csv: String =
        std::iter::once(CSV_HEADER.to_string()).chain(rows.iter().map(Row::csv)).collect();
    let csv_path = args.csv.clone().unwrap_or_else(|| work.join("python.csv"));
    std::fs::write(&csv_path, csv).map_err(|e| format!("{}: {e}", csv_path.display()))?;
    notes.push(format!("every measurement: {}", csv_path.display()));
    let svg_path = args.svg.clone().unwrap_or_else(|| work.join("python.svg"));
    std::fs::write(&svg_path, plot(args, &rows))
        .map_err(|e| format!("{}: {e}", svg_path.display()))?;
    notes.push(format!("plot: {}", svg_path.display()));
    let md = report(&plan, rounds, &rows, &notes);
    if let Some(p) = &args.markdown {
        std::fs::write(p, &md).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(md)
}

/// The social-network `*_pb2` modules (grpcio-tools' protoc), and a check
/// that the protoplane package is installed in that Python.
fn prepare(python: &Path, repo: &Path, gen: &Path) -> Result<(), String> {
    if !python.exists() {
        return Err(format!(
            "{} is missing: scripts/setup-python.sh makes the venv (grpcio, grpcio-tools, \
             and the protoplane package from python/)",
            python.display()
        ));
    }
    let status = Command::new(python)
        .args(["-c", "import protoplane, grpc, grpc_tools"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !status.success() {
        return Err(format!(
            "{} cannot import protoplane, grpc and grpc_tools: scripts/setup-python.sh installs \
             them (the package with `pip install ./python`)",
            python.display()
        ));
    }
    let protos = repo.join("protos/socialnetwork");
    let out = Command::new(python)
        .args(["-m", "grpc_tools.protoc"])
        .arg(format!("-I{}", protos.display()))
        .arg(format!("--python_out={}", gen.display()))
        .arg(format!("--grpc_python_out={}", gen.display()))
        .arg(protos.join("social_network.proto"))
        .output()
        .map_err(|e| format!("protoc: {e}"))?;
    if !out.status.success() {
        return Err(format!("protoc: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

/// `protoplane load` against `servers`, with the CPU each process used.
fn load(
    plan: &Plan<'_>,
    servers: &Servers,
    load_args: &[String],
    in_flight: usize,
) -> Result<Row, String> {
    let json = plan.work.join("load.json");
    let _ = std::fs::remove_file(&json);
    let mut cmd = crate::rpc::pinned(plan.args.load_cpu, &plan.exe);
    crate::same_malloc(&mut cmd);
    cmd.arg("load")
        .args(["--target", &servers.grpc, "--transport", "grpc"])
        .args(load_args)
        .args(["--concurrency", &in_flight.to_string()])
        .args(["--duration", &plan.seconds.to_string(), "--quiet", "--json"])
        .arg(&json);
    let m = crate::split::measure(cmd, &json, servers)?;
    if m.ok == 0 {
        return Err(format!("no call succeeded ({} failed)", m.errors));
    }
    Ok(Row {
        server: String::new(),
        in_flight,
        round: 0,
        qps: m.qps,
        p50: m.p50,
        p99: m.p99,
        app_cpu: m.app_cpu,
        engine_cpu: m.engine_cpu,
        errors: m.errors,
    })
}

/// The median over rounds of one figure of one server at one load.
fn med(rows: &[Row], server: &str, in_flight: usize, f: impl Fn(&Row) -> f64) -> f64 {
    median(rows.iter().filter(|r| r.server == server && r.in_flight == in_flight).map(f).collect())
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**not met**"
    }
}

fn report(plan: &Plan<'_>, rounds: usize, rows: &[Row], notes: &[String]) -> String {
    use std::fmt::Write as _;
    let args = plan.args;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# bench python: grpcio servicers on grpcio and on the protoplane engine\n\n\
         Social-network service, closed loop; Python processes on core {}, the engine on core \
         {}, the load on core {}; medians of {rounds} round(s) of {} s in fresh processes, \
         servers' order rotated each round.{}\n",
        args.app_cpu,
        args.engine_cpu,
        args.load_cpu,
        plan.seconds,
        if args.quick { " **--quick: a smoke run, not a measurement.**" } else { "" }
    );
    let _ = writeln!(
        s,
        "| server | in flight | QPS | p50 µs | p99 µs | Python CPU µs/call | engine CPU µs/call | \
         total µs/call | errors |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &n in &args.in_flight {
        for server in &args.servers {
            if !rows.iter().any(|r| &r.server == server && r.in_flight == n) {
                continue;
            }
            let app = med(rows, server, n, |r| r.app_cpu);
            let eng = med(rows, server, n, |r| r.engine_cpu);
            let _ = writeln!(
                s,
                "| {server} | {n} | {:.0} | {:.0} | {:.0} | {app:.1} | {eng:.1} | {:.1} | {} |",
                med(rows, server, n, |r| r.qps),
                med(rows, server, n, |r| r.p50),
                med(rows, server, n, |r| r.p99),
                app + eng,
                rows.iter()
                    .filter(|r| &r.server == server && r.in_flight == n)
                    .map(|r| r.errors)
                    .sum::<u64>()
            );
        }
    }
    // The targets, for each pair measured (async against grpc.aio, sync
    // against grpc.server).
    let mut t = String::new();
    for (ours, theirs) in [("protoplane-async", "grpcio-aio"), ("protoplane-sync", "grpcio-sync")] {
        let have = |srv: &str, n: usize| rows.iter().any(|r| r.server == srv && r.in_flight == n);
        if have(ours, 64) && have(theirs, 64) {
            let py = med(rows, ours, 64, |r| r.app_cpu);
            let total = py + med(rows, ours, 64, |r| r.engine_cpu);
            let base = med(rows, theirs, 64, |r| r.app_cpu);
            let _ = writeln!(
                t,
                "| Python CPU per call at 64 in flight ≤ 1/20 of {theirs}'s | {ours} {py:.1} µs, \
                 {theirs} {base:.1} µs: 1/{:.1} | {} |",
                base / py,
                verdict(py * 20.0 <= base)
            );
            let _ = writeln!(
                t,
                "| engine + Python CPU per call ≤ 1/8 of {theirs}'s | {total:.1} µs: 1/{:.1} | {} |",
                base / total,
                verdict(total * 8.0 <= base)
            );
            let (p99, p99b) = (med(rows, ours, 64, |r| r.p99), med(rows, theirs, 64, |r| r.p99));
            let _ = writeln!(
                t,
                "| p99 at 64 in flight ≤ {theirs}'s | {p99:.0} µs against {p99b:.0} µs | {} |",
                verdict(p99 <= p99b)
            );
        }
        if have(ours, 1) && have(theirs, 1) {
            let (p50, p50b) = (med(rows, ours, 1, |r| r.p50), med(rows, theirs, 1, |r| r.p50));
            let _ = writeln!(
                t,
                "| p50 at 1 in flight ≤ 0.5× {theirs}'s | {p50:.0} µs against {p50b:.0} µs: \
                 {:.2}× | {} |",
                p50 / p50b,
                verdict(p50 <= 0.5 * p50b)
            );
        }
    }
    if !t.is_empty() {
        let _ = writeln!(s, "\n| target | measured | |\n|---|---|---|\n{t}");
    }
    for n in notes {
        let _ = writeln!(s, "- {n}");
    }
    s
}

fn plot(args: &PythonArgs, rows: &[Row]) -> String {
    let xs: Vec<String> = args.in_flight.iter().map(|n| n.to_string()).collect();
    let colors = ["#d62728", "#1f77b4", "#ff7f0e", "#2ca02c"];
    let series = |f: &dyn Fn(&Row) -> f64| -> Vec<svg::Series> {
        args.servers
            .iter()
            .enumerate()
            .map(|(i, srv)| svg::Series {
                name: srv.clone(),
                color: colors[i % colors.len()],
                ys: args.in_flight.iter().map(|&n| med(rows, srv, n, f)).collect(),
            })
            .collect()
    };
    let panels = vec![
        svg::Panel { title: "calls/s".into(), y_label: "QPS".into(), series: series(&|r| r.qps) },
        svg::Panel {
            title: "Python CPU per call".into(),
            y_label: "µs".into(),
            series: series(&|r| r.app_cpu),
        },
        svg::Panel {
            title: "engine + Python CPU per call".into(),
            y_label: "µs".into(),
            series: series(&|r| r.app_cpu + r.engine_cpu),
        },
        svg::Panel {
            title: "p99 latency".into(),
            y_label: "µs".into(),
            series: series(&|r| r.p99),
        },
    ];
    svg::grid(
        "grpcio servicers: grpcio vs the protoplane engine",
        "calls in flight",
        &xs,
        &panels,
        2,
    )
}
