//! `protoplane bench rpc`: protoplane's server (gRPC over its own HTTP/2 and
//! over the `h2` crate's, and the lean transport) against tonic + prost,
//! grpc-go and gRPC C++ serving the same social-network service, side by
//! side on this machine, under two load generators.
//!
//! Method:
//! * every server runs on one thread (`--threads 1`: a single-threaded tokio
//!   runtime for protoplane and tonic, `GOMAXPROCS=1` for grpc-go, one
//!   completion-queue thread for gRPC C++), pinned to one core
//!   (`--server-cpu`); the load generator is pinned to the other
//!   (`--load-cpu`);
//! * two load generators: `protoplane load` drives every server, round-robin
//!   over the five methods, the requests sent as they are; ghz (pinned
//!   version, `bench/ghz/install.sh`; `--no-ghz` leaves it out) drives every
//!   gRPC server (not lean) over one connection, one method
//!   (`--ghz-method`, default ComposePost) with that method's requests,
//!   which ghz decodes and re-encodes;
//! * each measurement starts a fresh server process and a fresh load
//!   process; the measurements (every implementation under `protoplane
//!   load`, then every gRPC one under ghz) are interleaved and their order
//!   rotates every round, so a slow phase of the machine does not land on
//!   one of them; the report gives the median over rounds, one table per
//!   load generator, ratios against tonic under the same generator;
//! * server CPU time per call is read from `/proc/PID/stat` (user + system)
//!   before and after the load run, divided by the calls made. "QPS per
//!   server core" is its inverse: what one core of the server sustains,
//!   independent of whether the load generator saturated it;
//! * requests: the recorded social-network requests
//!   (`../shared/datasets/socialnetwork`) when present, else generated ones;
//! * the peers are built on first use by their `build.sh` (tonic:
//!   `bench/peers-rpc`, grpc-go: `bench/peers-go`, gRPC C++:
//!   `bench/peers-grpc-cpp`); one that does not build is left out with a
//!   note, and so is a server that does not start.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use protoplane_load::servers::{monolithic, Servers};

/// What `--impls` can name, in the default order.
const IMPLS: [&str; 8] = [
    "protoplane-grpc",
    "protoplane-grpc-spin",
    "protoplane-h2",
    "protoplane-lean",
    "tonic",
    "tonic-spin",
    "grpc-go",
    "grpc-cpp",
];

/// What `--impls` can name beyond the default set: protoplane's gRPC
/// server recording gRFC A66's metrics (`serve --metrics-addr`), to
/// measure what they cost beside `protoplane-grpc`.
const EXTRA_IMPLS: [&str; 1] = ["protoplane-grpc-metrics"];

/// The suffix of an implementation run in busy-poll mode (`--spin`): the
/// server's thread never sleeps waiting for the network.
const SPIN: &str = "-spin";

/// The peer servers and their build scripts (relative to the repository
/// root), each of which prints the binary's path on stdout.
const PEERS: [(&str, &str); 3] = [
    ("tonic", "bench/peers-rpc/build.sh"),
    ("grpc-go", "bench/peers-go/build.sh"),
    ("grpc-cpp", "bench/peers-grpc-cpp/build.sh"),
];

/// The service's methods (what `--ghz-method` can name).
const METHODS: [&str; 5] = ["RegisterUser", "Login", "ComposeMedia", "ComposePost", "StorePost"];

#[derive(clap::Args, Debug)]
pub(crate) struct RpcArgs {
    /// Rounds (each runs every implementation at every concurrency).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds of load per measurement.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Calls in flight, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    concurrency: Vec<usize>,
    /// Implementations: protoplane-grpc, protoplane-grpc-spin (`protoplane
    /// serve --spin`: busy-polling), protoplane-h2 (`protoplane serve
    /// --grpc-transport h2`: HTTP/2 from the h2 crate), protoplane-lean,
    /// tonic, tonic-spin (the tonic server busy-polling the same way),
    /// grpc-go, grpc-cpp; and, not by default, protoplane-grpc-metrics
    /// (`protoplane serve --metrics-addr`: A66 metrics recorded).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "protoplane-grpc,protoplane-grpc-spin,protoplane-h2,protoplane-lean,tonic,tonic-spin,grpc-go,grpc-cpp",
        value_parser = clap::builder::PossibleValuesParser::new(IMPLS.iter().chain(&EXTRA_IMPLS)),
    )]
    impls: Vec<String>,
    /// Also load every gRPC server with ghz (the default; installed by
    /// bench/ghz/install.sh, left out with a note if that fails).
    #[arg(long, overrides_with = "no_ghz")]
    ghz: bool,
    /// No ghz runs: `protoplane load` only.
    #[arg(long, overrides_with = "ghz")]
    no_ghz: bool,
    /// The method ghz calls, with that method's requests.
    #[arg(
        long,
        default_value = "ComposePost",
        value_parser = clap::builder::PossibleValuesParser::new(METHODS),
    )]
    ghz_method: String,
    /// The load generator busy-polls too (`protoplane load --spin`; ghz
    /// has no such mode).
    #[arg(long)]
    load_spin: bool,
    /// Core the server is pinned to.
    #[arg(long, default_value_t = 0)]
    server_cpu: usize,
    /// Core the load generator is pinned to.
    #[arg(long, default_value_t = 1)]
    load_cpu: usize,
    /// Generated requests per method when no dataset is found.
    #[arg(long, default_value_t = 200)]
    per_type: usize,
    /// Write the tables as Markdown here too.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// Write every measurement as CSV here.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
}

/// The load generator of a measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Load {
    /// `protoplane load`: every method, round-robin.
    Protoplane,
    /// ghz: one method (gRPC servers only).
    Ghz,
}

impl Load {
    /// Its name in the CSV's `load` column.
    fn name(self) -> &'static str {
        match self {
            Load::Protoplane => "protoplane",
            Load::Ghz => "ghz",
        }
    }
}

struct Sample {
    imp: String,
    load: Load,
    conc: usize,
    qps: f64,
    p50: f64,
    p99: f64,
    cpu_us: f64,
    errors: u64,
}

/// What one load run reports.
#[derive(Debug, PartialEq)]
struct Measured {
    qps: f64,
    /// Latency percentiles, µs.
    p50: f64,
    p99: f64,
    /// Calls made, errors included.
    calls: u64,
    errors: u64,
}

pub(crate) fn pinned(cpu: usize, prog: &Path) -> Command {
    let mut c = Command::new("taskset");
    c.arg("-c").arg(cpu.to_string()).arg(prog);
    c
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Adds `note` unless it is there already (a failure repeats every round).
fn note(notes: &mut Vec<String>, note: String) {
    if !notes.contains(&note) {
        notes.push(note);
    }
}

pub(crate) fn run(args: &RpcArgs) -> Result<String, String> {
    let repo = std::env::current_dir().map_err(|e| e.to_string())?;
    let work = repo.join("target/bench/rpc");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let exe = crate::protoplane()?;
    let (load_args, requests) = social_requests(&repo, &work, args.per_type)?;
    let mut notes = vec![requests];

    // The implementations, each once, in the order given; the peers built.
    let mut impls: Vec<String> = Vec::new();
    let mut peers: HashMap<String, PathBuf> = HashMap::new();
    for imp in &args.impls {
        if impls.contains(imp) {
            continue;
        }
        let base = imp.strip_suffix(SPIN).unwrap_or(imp);
        match PEERS.iter().find(|(name, _)| *name == base) {
            Some((_, script)) => match peers.get(base).cloned().or_else(|| built(&repo, script)) {
                Some(bin) => {
                    peers.insert(base.to_string(), bin);
                    impls.push(imp.clone());
                }
                None => notes.push(format!("{imp} server did not build ({script}): left out")),
            },
            None => impls.push(imp.clone()),
        }
    }
    // With overrides_with, the later of --ghz and --no-ghz is the one set.
    let want_ghz = args.ghz || !args.no_ghz;
    let ghz = if !want_ghz {
        None
    } else {
        let ghz = built(&repo, "bench/ghz/install.sh");
        if ghz.is_none() {
            notes.push("ghz did not install (bench/ghz/install.sh): ghz runs left out".into());
        }
        ghz
    };
    // social_requests names each method's file after the method.
    let ghz_data = work.join(format!("{}.ldelim", args.ghz_method));

    // One round's measurements: every implementation under `protoplane
    // load`, then every gRPC one under ghz; the order rotates every round.
    let mut runs: Vec<(&str, Load)> =
        impls.iter().map(|i| (i.as_str(), Load::Protoplane)).collect();
    if ghz.is_some() {
        let grpc = impls.iter().filter(|i| i.as_str() != "protoplane-lean");
        runs.extend(grpc.map(|i| (i.as_str(), Load::Ghz)));
    }
    let mut samples: Vec<Sample> = Vec::new();
    let total = args.rounds.max(1) * args.concurrency.len() * runs.len();
    let mut done = 0;
    for round in 0..args.rounds.max(1) {
        for &conc in &args.concurrency {
            for k in 0..runs.len() {
                let (imp, load) = runs[(k + round) % runs.len()];
                done += 1;
                eprint!(
                    "\r[{done}/{total}] round {} {imp:<16} {:<10} {conc:>4} in flight   ",
                    round + 1,
                    load.name()
                );
                let server = match start(imp, &exe, &peers, args.server_cpu) {
                    Ok(server) => server,
                    Err(e) => {
                        // protoplane-h2 needs `protoplane serve --grpc-transport`.
                        let hint =
                            if imp == "protoplane-h2" { "; needs --grpc-transport" } else { "" };
                        let why = format!("the server did not start ({e}{hint}): no data");
                        note(&mut notes, format!("{imp}: {why}"));
                        continue;
                    }
                };
                let pid = server.app;
                let before = protoplane_load::host::pid_cpu_seconds(pid);
                let outcome = match (load, &ghz) {
                    (Load::Ghz, Some(ghz)) => {
                        let call = Ghz { bin: ghz, repo: &repo, data: &ghz_data };
                        call.run(args, &server.grpc, conc, &work.join("ghz.json"))
                    }
                    _ => protoplane_load(args, &exe, imp, &server, conc, &load_args, &work),
                };
                let after = protoplane_load::host::pid_cpu_seconds(pid);
                drop(server);
                let m = match outcome {
                    Ok(m) => m,
                    Err(e) => {
                        let what = format!("{imp} at {conc} in flight, {} load", load.name());
                        note(&mut notes, format!("{what}: {e}"));
                        continue;
                    }
                };
                let calls = m.calls.max(1) as f64;
                samples.push(Sample {
                    imp: imp.to_string(),
                    load,
                    conc,
                    qps: m.qps,
                    p50: m.p50,
                    p99: m.p99,
                    cpu_us: before.zip(after).map_or(f64::NAN, |(b, a)| (a - b) * 1e6 / calls),
                    errors: m.errors,
                });
            }
        }
    }
    eprintln!();
    if let Some(p) = &args.csv {
        let mut csv =
            String::from("impl,concurrency,qps,p50_us,p99_us,server_cpu_us_per_call,errors,load\n");
        for s in &samples {
            csv += &format!(
                "{},{},{:.1},{},{},{:.3},{},{}\n",
                s.imp,
                s.conc,
                s.qps,
                s.p50,
                s.p99,
                s.cpu_us,
                s.errors,
                match s.load {
                    Load::Protoplane if args.load_spin => "protoplane-spin",
                    load => load.name(),
                }
            );
        }
        std::fs::write(p, csv).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let ghz_title = ghz.as_ref().map(|bin| {
        // install.sh records the version it installed beside the binary.
        let version = std::fs::read_to_string(bin.with_extension("version"))
            .map(|v| format!(" {}", v.trim()))
            .unwrap_or_default();
        format!(
            "ghz{version}: `{}` only (its requests, decoded and re-encoded by ghz), \
             one connection, `--cpus 1`",
            args.ghz_method
        )
    });
    Ok(report(args, &impls, &samples, ghz_title.as_deref(), &notes))
}

/// Starts `imp` for one measurement, pinned to `cpu`, on one thread.
fn start(
    imp: &str,
    exe: &Path,
    peers: &HashMap<String, PathBuf>,
    cpu: usize,
) -> Result<Servers, String> {
    let base = imp.strip_suffix(SPIN).unwrap_or(imp);
    let mut c = match peers.get(base) {
        Some(bin) => pinned(cpu, bin),
        None => {
            let mut c = pinned(cpu, exe);
            c.args(["serve", "--lean-port", "0"]);
            if imp == "protoplane-h2" {
                c.args(["--grpc-transport", "h2"]);
            }
            if imp == "protoplane-grpc-metrics" {
                c.args(["--metrics-addr", "127.0.0.1:0"]);
            }
            c
        }
    };
    c.args(["--port", "0", "--threads", "1"]);
    if base != imp {
        c.arg("--spin");
    }
    Ok(monolithic(c)?)
}

/// One `protoplane load` run against `server` (its lean port for
/// protoplane-lean, its gRPC port otherwise).
fn protoplane_load(
    args: &RpcArgs,
    exe: &Path,
    imp: &str,
    server: &Servers,
    conc: usize,
    load_args: &[String],
    work: &Path,
) -> Result<Measured, String> {
    let (target, transport) = match imp {
        "protoplane-lean" => (server.lean.clone().ok_or("no lean port")?, "lean"),
        _ => (server.grpc.clone(), "grpc"),
    };
    let json = work.join("load.json");
    let _ = std::fs::remove_file(&json);
    let mut load = pinned(args.load_cpu, exe);
    load.arg("load")
        .args(["--target", &target, "--transport", transport])
        .args(load_args)
        .args(["--concurrency", &conc.to_string()])
        .args(["--duration", &args.seconds.to_string(), "--quiet"])
        .args(args.load_spin.then_some("--spin"))
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let status = load.status().map_err(|e| format!("load: {e}"))?;
    if !status.success() {
        return Err(format!("load failed ({status})"));
    }
    let text = std::fs::read_to_string(&json).map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let ok = v["ok"].as_u64().unwrap_or(0);
    let errors: u64 =
        v["errors"].as_object().map(|m| m.values().filter_map(|x| x.as_u64()).sum()).unwrap_or(0);
    Ok(Measured {
        qps: v["qps"].as_f64().unwrap_or(0.0),
        p50: v["latency_us"]["p50"].as_f64().unwrap_or(f64::NAN),
        p99: v["latency_us"]["p99"].as_f64().unwrap_or(f64::NAN),
        calls: ok + errors,
        errors,
    })
}

/// ghz, set up to call one method with its recorded requests.
struct Ghz<'a> {
    bin: &'a Path,
    repo: &'a Path,
    /// The method's requests, varint-delimited (what `--binary-file` reads
    /// as "count-prefixed messages"; ghz sends them in turn).
    data: &'a Path,
}

impl Ghz<'_> {
    /// One run against `target` with `conc` calls in flight on one
    /// connection, for `--seconds`, its JSON report written to `json`.
    fn run(
        &self,
        args: &RpcArgs,
        target: &str,
        conc: usize,
        json: &Path,
    ) -> Result<Measured, String> {
        let _ = std::fs::remove_file(json);
        let mut c = pinned(args.load_cpu, self.bin);
        c.args(["--cpus", "1", "--insecure"])
            .arg("--proto")
            .arg(self.repo.join("protos/socialnetwork/social_network.proto"))
            .arg("--import-paths")
            .arg(self.repo.join("protos/socialnetwork"))
            .arg("--call")
            .arg(format!("{}/{}", protoplane_load::social::SERVICE, args.ghz_method))
            .arg("--binary-file")
            .arg(self.data)
            .args(["--connections", "1", "--concurrency", &conc.to_string()])
            .arg("--duration")
            .arg(format!("{}s", args.seconds))
            // Calls still in flight when the time is up are left out; the
            // default (`close`) would count them as errors.
            .args(["--duration-stop", "ignore", "--format", "json", "--output"])
            .arg(json)
            .arg(target)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let out = c.output().map_err(|e| format!("ghz: {e}"))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
            return Err(format!("ghz failed ({}): {}", out.status, last.trim()));
        }
        let text = std::fs::read_to_string(json).map_err(|e| format!("ghz report: {e}"))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("ghz report: {e}"))?;
        Ok(ghz_measured(&v))
    }
}

/// What a ghz JSON report (`--format json`, ghz 0.121) says: `count` calls
/// (errors included), `rps`, `latencyDistribution` (`percentage`, `latency`
/// in ns, over the calls that succeeded), `statusCodeDistribution` (calls by
/// status name) and `errorDistribution` (failed calls by message).
fn ghz_measured(v: &serde_json::Value) -> Measured {
    let percentile = |p: u64| {
        v["latencyDistribution"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["percentage"].as_u64() == Some(p)))
            .and_then(|e| e["latency"].as_f64())
            .map_or(f64::NAN, |ns| ns / 1e3)
    };
    let sum = |m: &serde_json::Value, skip: &str| -> u64 {
        m.as_object().map_or(0, |m| {
            m.iter().filter(|(k, _)| k.as_str() != skip).filter_map(|(_, n)| n.as_u64()).sum()
        })
    };
    let not_ok = sum(&v["statusCodeDistribution"], "OK");
    let failed = sum(&v["errorDistribution"], "");
    Measured {
        qps: v["rps"].as_f64().unwrap_or(0.0),
        p50: percentile(50),
        p99: percentile(99),
        calls: v["count"].as_u64().unwrap_or(0),
        errors: not_ok.max(failed),
    }
}

/// The social-network requests as delimited files under `work`, and the
/// `protoplane load` arguments that send them round-robin over the five
/// methods: the recorded ones (`../shared/datasets/socialnetwork`) when
/// present, else `per_type` generated ones per method. Also says which.
pub(crate) fn social_requests(
    repo: &Path,
    work: &Path,
    per_type: usize,
) -> Result<(Vec<String>, String), String> {
    let proto = repo.join("protos/socialnetwork/social_network.proto");
    if !proto.is_file() {
        return Err("run from the repository root (protos/socialnetwork not found)".into());
    }
    let schema = protoplane_load::social::schema()?;
    let shared = repo.parent().map(|p| p.join("shared/datasets/socialnetwork/messages"));
    let dataset = shared.filter(|d| d.is_dir());
    let reqs = protoplane_load::social::requests(schema.tables(), dataset.as_deref(), per_type)?;
    let mut load_args: Vec<String> = vec![
        "--proto".into(),
        proto.display().to_string(),
        "-I".into(),
        repo.join("protos/socialnetwork").display().to_string(),
    ];
    for (path, _, messages) in &reqs {
        let name = path.rsplit('/').next().unwrap_or("m");
        let file = work.join(format!("{name}.ldelim"));
        let mut bytes = Vec::new();
        let framing = protoplane_load::framing::Framing::new(true);
        for m in messages {
            framing.put(&mut bytes, m);
        }
        std::fs::write(&file, bytes).map_err(|e| format!("{}: {e}", file.display()))?;
        load_args.extend([
            "--method".into(),
            path.clone(),
            "--data".into(),
            file.display().to_string(),
        ]);
    }
    let note = match &dataset {
        Some(d) => format!("requests: recorded, {}", d.display()),
        None => format!("requests: {per_type} generated per method (no dataset found)"),
    };
    Ok((load_args, note))
}

/// Runs a build or install script of the repository (`script`, relative to
/// it) and returns the path it prints on stdout, if it succeeded and that
/// file exists. The script's diagnostics go to our stderr.
fn built(repo: &Path, script: &str) -> Option<PathBuf> {
    let out = Command::new(repo.join(script)).stderr(Stdio::inherit()).output().ok()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout.lines().rev().find(|l| !l.trim().is_empty())?.trim();
    (out.status.success() && Path::new(path).is_file()).then(|| PathBuf::from(path))
}

/// The tonic + prost peer server (`bench/peers-rpc`), built if needed.
pub(crate) fn tonic_server(repo: &Path) -> Option<PathBuf> {
    built(repo, "bench/peers-rpc/build.sh")
}

fn report(
    args: &RpcArgs,
    impls: &[String],
    samples: &[Sample],
    ghz: Option<&str>,
    notes: &[String],
) -> String {
    let mut md = String::new();
    md += &format!(
        "Server pinned to core {}, one thread; load generator pinned to core {}; \
         {} s per run, fresh processes, median of {} rounds.\n\n",
        args.server_cpu,
        args.load_cpu,
        args.seconds,
        args.rounds.max(1)
    );
    md += "Servers named *-spin busy-poll (`--spin`): their core runs at 100% whatever the \
           load, so their CPU per call is wall time per call at low load.\n\n";
    let spin = if args.load_spin { ", busy-polling (`--spin`)" } else { "" };
    md += &format!("Load: `protoplane load` (all five methods, round-robin){spin}\n\n");
    md += &table(args, impls, samples, Load::Protoplane);
    if let Some(title) = ghz {
        md += &format!("\nLoad: {title}\n\n");
        md += &table(args, impls, samples, Load::Ghz);
    }
    for n in notes {
        md += &format!("\n- {n}");
    }
    md.push('\n');
    if let Some(p) = &args.markdown {
        if let Err(e) = std::fs::write(p, &md) {
            return format!("{md}\n(could not write {}: {e})\n", p.display());
        }
    }
    md
}

/// The table of one load generator: a row per implementation and
/// concurrency that has measurements, ratios against tonic under the same
/// generator.
fn table(args: &RpcArgs, impls: &[String], samples: &[Sample], load: Load) -> String {
    let of = |imp: &str, conc: usize| -> Vec<&Sample> {
        samples.iter().filter(|s| s.imp == imp && s.conc == conc && s.load == load).collect()
    };
    let med = |imp: &str, conc: usize, f: &dyn Fn(&Sample) -> f64| {
        median(of(imp, conc).into_iter().map(f).collect())
    };
    let mut md = String::new();
    md += "| server | in flight | QPS | p50 µs | p99 µs | server CPU µs/call | QPS per server core | vs tonic (QPS/core) | vs tonic (p50) | errors |\n";
    md += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for &conc in &args.concurrency {
        let tonic_core = 1e6 / med("tonic", conc, &|s| s.cpu_us);
        let tonic_p50 = med("tonic", conc, &|s| s.p50);
        for imp in impls {
            if of(imp, conc).is_empty() {
                continue;
            }
            let cpu = med(imp, conc, &|s| s.cpu_us);
            let core = 1e6 / cpu;
            let p50 = med(imp, conc, &|s| s.p50);
            let errors: u64 = of(imp, conc).iter().map(|s| s.errors).sum();
            let ratio = |x: f64| if x.is_finite() { format!("{x:.2}×") } else { "—".into() };
            md += &format!(
                "| {imp} | {conc} | {:.0} | {p50:.0} | {:.0} | {cpu:.2} | {core:.0} | {} | {} | {errors} |\n",
                med(imp, conc, &|s| s.qps),
                med(imp, conc, &|s| s.p99),
                ratio(core / tonic_core),
                ratio(p50 / tonic_p50),
            );
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ghz_report_fields() {
        // The shape of ghz 0.121's `--format json` report (details trimmed).
        let v: serde_json::Value = serde_json::from_str(
            r#"{"date":"2026-11-24T14:45:07Z","endReason":"timeout","count":1000,
                "total":1000000000,"average":500000,"fastest":100000,"slowest":9000000,
                "rps":998.5,
                "errorDistribution":{"rpc error: code = Unavailable desc = gone":3},
                "statusCodeDistribution":{"OK":997,"Unavailable":3},
                "latencyDistribution":[{"percentage":10,"latency":200000},
                  {"percentage":50,"latency":450500},{"percentage":99,"latency":2000000}],
                "details":[]}"#,
        )
        .expect("JSON");
        let m = ghz_measured(&v);
        assert_eq!(m, Measured { qps: 998.5, p50: 450.5, p99: 2000.0, calls: 1000, errors: 3 });

        // No call succeeded: no latencies, every call an error.
        let v: serde_json::Value = serde_json::from_str(
            r#"{"count":4,"rps":4.0,"latencyDistribution":null,
                "statusCodeDistribution":{"Unimplemented":4},
                "errorDistribution":{"rpc error: code = Unimplemented":4}}"#,
        )
        .expect("JSON");
        let m = ghz_measured(&v);
        assert!(m.p50.is_nan() && m.p99.is_nan());
        assert_eq!((m.calls, m.errors), (4, 4));
    }

    #[test]
    fn default_impls_are_the_known_ones() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            rpc: RpcArgs,
        }
        let cli = Cli::try_parse_from(["bench"]).expect("defaults");
        assert_eq!(cli.rpc.impls, IMPLS);
        assert!(!cli.rpc.no_ghz);
        let cli = Cli::try_parse_from(["bench", "--no-ghz"]).expect("--no-ghz");
        assert!(cli.rpc.no_ghz);
        let cli = Cli::try_parse_from(["bench", "--no-ghz", "--ghz"]).expect("--ghz");
        assert!(!cli.rpc.no_ghz);
        assert!(Cli::try_parse_from(["bench", "--impls", "tonic,grpc-rust"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--ghz-method", "Logout"]).is_err());
    }
}
