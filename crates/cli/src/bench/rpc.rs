//! `protoplane bench rpc`: protoplane's server (gRPC over HTTP/2, and the
//! lean transport) against tonic + prost serving the same social-network
//! service, side by side on this machine.
//!
//! Method:
//! * every server runs with a single-threaded runtime, pinned to one core
//!   (`--server-cpu`); the load generator (`protoplane load`, the same for
//!   every server) is pinned to the other (`--load-cpu`);
//! * each measurement starts a fresh server process and a fresh load
//!   process; the implementations are interleaved and their order rotates
//!   every round, so a slow phase of the machine does not land on one of
//!   them; the report gives the median over rounds;
//! * server CPU time per call is read from `/proc/PID/stat` (user + system)
//!   before and after the load run, divided by the calls made. "QPS per
//!   server core" is its inverse: what one core of the server sustains,
//!   independent of whether the load generator saturated it;
//! * requests: the recorded social-network requests
//!   (`../shared/datasets/socialnetwork`) when present, else generated ones;
//!   the load goes round-robin over all five methods.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::servers::monolithic;

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
    /// Implementations: protoplane-grpc, protoplane-lean, tonic.
    #[arg(long, value_delimiter = ',', default_value = "protoplane-grpc,protoplane-lean,tonic")]
    impls: Vec<String>,
    /// Core the server is pinned to.
    #[arg(long, default_value_t = 0)]
    server_cpu: usize,
    /// Core the load generator is pinned to.
    #[arg(long, default_value_t = 1)]
    load_cpu: usize,
    /// Generated requests per method when no dataset is found.
    #[arg(long, default_value_t = 200)]
    per_type: usize,
    /// Write the table as Markdown here too.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// Write every measurement as CSV here.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
}

struct Sample {
    imp: String,
    conc: usize,
    qps: f64,
    p50: f64,
    p99: f64,
    cpu_us: f64,
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

pub(crate) fn run(args: &RpcArgs) -> Result<String, String> {
    let repo = std::env::current_dir().map_err(|e| e.to_string())?;
    let work = repo.join("target/bench/rpc");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let (load_args, note) = social_requests(&repo, &work, args.per_type)?;
    let mut notes = vec![note];
    let tonic = if args.impls.iter().any(|i| i == "tonic") {
        let t = tonic_server(&repo);
        if t.is_none() {
            notes.push("tonic server did not build: left out".into());
        }
        t
    } else {
        None
    };

    let mut samples: Vec<Sample> = Vec::new();
    let impls: Vec<String> =
        args.impls.iter().filter(|i| i.as_str() != "tonic" || tonic.is_some()).cloned().collect();
    let total = args.rounds.max(1) * args.concurrency.len() * impls.len();
    let mut done = 0;
    for round in 0..args.rounds.max(1) {
        for &conc in &args.concurrency {
            for k in 0..impls.len() {
                let imp = &impls[(k + round) % impls.len()];
                done += 1;
                eprint!("\r[{done}/{total}] round {} {imp:<16} {conc:>4} in flight   ", round + 1);
                let server = match imp.as_str() {
                    "tonic" => {
                        let Some(t) = &tonic else { continue };
                        let mut c = pinned(args.server_cpu, t);
                        c.args(["--port", "0", "--threads", "1"]);
                        monolithic(c)?
                    }
                    _ => {
                        let mut c = pinned(args.server_cpu, &exe);
                        c.args(["serve", "--port", "0", "--lean-port", "0", "--threads", "1"]);
                        monolithic(c)?
                    }
                };
                let (target, transport) = match imp.as_str() {
                    "protoplane-lean" => (server.lean.clone().ok_or("no lean port")?, "lean"),
                    _ => (server.grpc.clone(), "grpc"),
                };
                let json = work.join("load.json");
                let _ = std::fs::remove_file(&json);
                let mut load = pinned(args.load_cpu, &exe);
                load.arg("load")
                    .args(["--target", &target, "--transport", transport])
                    .args(&load_args)
                    .args(["--concurrency", &conc.to_string()])
                    .args(["--duration", &args.seconds.to_string(), "--quiet"])
                    .arg("--json")
                    .arg(&json)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                let pid = server.app;
                let before = crate::host::pid_cpu_seconds(pid);
                let status = load.status().map_err(|e| format!("load: {e}"))?;
                let after = crate::host::pid_cpu_seconds(pid);
                drop(server);
                if !status.success() {
                    notes.push(format!("{imp} at {conc} in flight: load failed ({status})"));
                    continue;
                }
                let text = std::fs::read_to_string(&json).map_err(|e| e.to_string())?;
                let v: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| e.to_string())?;
                let ok = v["ok"].as_u64().unwrap_or(0);
                let errors: u64 = v["errors"]
                    .as_object()
                    .map(|m| m.values().filter_map(|x| x.as_u64()).sum())
                    .unwrap_or(0);
                let calls = (ok + errors).max(1) as f64;
                samples.push(Sample {
                    imp: imp.clone(),
                    conc,
                    qps: v["qps"].as_f64().unwrap_or(0.0),
                    p50: v["latency_us"]["p50"].as_f64().unwrap_or(f64::NAN),
                    p99: v["latency_us"]["p99"].as_f64().unwrap_or(f64::NAN),
                    cpu_us: before.zip(after).map_or(f64::NAN, |(b, a)| (a - b) * 1e6 / calls),
                    errors,
                });
            }
        }
    }
    eprintln!();
    if let Some(p) = &args.csv {
        let mut csv =
            String::from("impl,concurrency,qps,p50_us,p99_us,server_cpu_us_per_call,errors\n");
        for s in &samples {
            csv += &format!(
                "{},{},{:.1},{},{},{:.3},{}\n",
                s.imp, s.conc, s.qps, s.p50, s.p99, s.cpu_us, s.errors
            );
        }
        std::fs::write(p, csv).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(report(args, &impls, &samples, &notes))
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
    let schema = crate::sn::schema()?;
    let shared = repo.parent().map(|p| p.join("shared/datasets/socialnetwork/messages"));
    let dataset = shared.filter(|d| d.is_dir());
    let reqs = crate::demo::requests(schema.tables(), dataset.as_deref(), per_type)?;
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
        let framing = crate::stream::Framing::new(true);
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

/// The tonic + prost peer server (`bench/peers-rpc`), built if needed.
pub(crate) fn tonic_server(repo: &Path) -> Option<PathBuf> {
    let script = repo.join("bench/peers-rpc/build.sh");
    let out = Command::new(&script).stderr(Stdio::inherit()).output().ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && Path::new(&path).is_file()).then(|| PathBuf::from(path))
}

fn report(args: &RpcArgs, impls: &[String], samples: &[Sample], notes: &[String]) -> String {
    let med = |imp: &str, conc: usize, f: &dyn Fn(&Sample) -> f64| {
        median(samples.iter().filter(|s| s.imp == imp && s.conc == conc).map(f).collect())
    };
    let mut md = String::new();
    md += &format!(
        "Server pinned to core {}, single-threaded runtime; load (`protoplane load`) pinned to core {}; \
         {} s per run, fresh processes, median of {} rounds.\n\n",
        args.server_cpu,
        args.load_cpu,
        args.seconds,
        args.rounds.max(1)
    );
    md += "| server | in flight | QPS | p50 µs | p99 µs | server CPU µs/call | QPS per server core | vs tonic (QPS/core) | vs tonic (p50) | errors |\n";
    md += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for &conc in &args.concurrency {
        let tonic_core = 1e6 / med("tonic", conc, &|s| s.cpu_us);
        let tonic_p50 = med("tonic", conc, &|s| s.p50);
        for imp in impls {
            let cpu = med(imp, conc, &|s| s.cpu_us);
            let core = 1e6 / cpu;
            let p50 = med(imp, conc, &|s| s.p50);
            let errors: u64 =
                samples.iter().filter(|s| &s.imp == imp && s.conc == conc).map(|s| s.errors).sum();
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
