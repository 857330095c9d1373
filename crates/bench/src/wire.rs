//! `protoplane bench wire`: protoplane's wire engine against prost, buffa
//! and protobuf C++, side by side, on one pinned core.
//!
//! Method (the machine is shared and noisy): every implementation runs in
//! its own worker process, all of them pinned to the same core; a round runs
//! every worker once over every message, the order of the workers rotating
//! from round to round; each worker reports the median of several samples
//! per (message, op); the report takes the median over rounds and shows the
//! spread. All workers run with the same glibc malloc thresholds so freed
//! large blocks are not returned to the OS between iterations (that makes
//! large-message timings jump). Ratios, not absolute times, are the result.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::jobs::{geomean, Job, Schema};

#[derive(clap::Args, Debug)]
pub(crate) struct WireArgs {
    /// Directory holding `hyperprotobench/` and `socialnetwork/` (default:
    /// ../shared/datasets). Without `socialnetwork/`, generated requests
    /// stand in for it; without `hyperprotobench/`, that part is left out.
    #[arg(long, value_name = "DIR")]
    datasets: Option<PathBuf>,
    /// Benchmark your own schema instead: the .proto file…
    #[arg(long, value_name = "FILE", requires = "messages")]
    proto: Option<PathBuf>,
    /// …its import roots…
    #[arg(short = 'I', long = "include", value_name = "DIR")]
    includes: Vec<PathBuf>,
    /// …the message type…
    #[arg(long = "type", value_name = "FULL.NAME", requires = "proto")]
    type_name: Option<String>,
    /// …and files of varint-delimited messages of that type.
    #[arg(long, value_name = "FILE", num_args = 1.., requires = "type_name")]
    messages: Vec<PathBuf>,
    /// Rounds (fresh processes each).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Smoke run: one round, short samples.
    #[arg(long)]
    quick: bool,
    /// Implementations to run.
    /// `protoplane-gen` is protoplane's generated decoders and encoders
    /// (built with the prost / buffa worker, `bench/peers-rs`); its rows say
    /// `protoplane` with the ops `decode_owned_gen`, `decode_view_gen`,
    /// `encode_gen`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "protoplane,protoplane-gen,prost,buffa,cpp"
    )]
    impls: Vec<String>,
    /// Core to pin every worker to (needs `taskset`).
    #[arg(long, default_value_t = 1)]
    cpu: usize,
    /// Minimum time of one sample, ms.
    #[arg(long, default_value_t = 5)]
    min_time_ms: u64,
    /// Samples per (message, op) in each round.
    #[arg(long, default_value_t = 7)]
    samples: usize,
    /// Write every measurement (one row per round) as CSV.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Write the report as markdown (default: target/bench/wire.md).
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// Only these datasets/benches (e.g. `bench0,socialnetwork`).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

/// One measurement.
#[derive(Clone, Debug)]
struct Row {
    round: usize,
    imp: String,
    op: String,
    dataset: String,
    bench: String,
    message: String,
    bytes: f64,
    ns: f64,
}

struct Worker {
    imp: &'static str,
    /// Command prefix (program + fixed args).
    cmd: Vec<String>,
}

pub(crate) fn run(args: &WireArgs) -> Result<String, String> {
    let repo = std::env::current_dir().map_err(|e| e.to_string())?;
    let work = repo.join("target/bench");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let mut notes = Vec::new();
    let (schemas, jobs, dominated) = plan(args, &repo, &work, &mut notes)?;
    if jobs.is_empty() {
        return Err("no messages to benchmark (see --datasets / --proto)".into());
    }
    let jobs_file = work.join("jobs.tsv");
    let schemas_file = work.join("schemas.tsv");
    write(&jobs_file, jobs.iter().map(Job::to_line).collect::<String>())?;
    write(&schemas_file, schemas.iter().map(Schema::to_line).collect::<String>())?;

    let (rounds, min_time, samples) =
        if args.quick { (1, 1, 3) } else { (args.rounds.max(1), args.min_time_ms, args.samples) };
    let timing_args = vec![
        "--jobs".to_string(),
        jobs_file.display().to_string(),
        "--min-time-ms".into(),
        min_time.to_string(),
        "--samples".into(),
        samples.to_string(),
    ];
    let workers =
        build_workers(args, &repo, &work, &schemas, &schemas_file, &timing_args, &mut notes);
    let pin =
        which("taskset").then(|| vec!["taskset".to_string(), "-c".into(), args.cpu.to_string()]);
    if pin.is_none() {
        notes.push("taskset not found: workers were not pinned to one core".into());
    }

    let mut rows = Vec::new();
    let total = rounds * workers.len();
    let mut done = 0;
    for round in 0..rounds {
        for k in 0..workers.len() {
            let w = &workers[(k + round) % workers.len()];
            done += 1;
            eprint!(
                "\r[{:<30}] round {}/{} {:<24}",
                "#".repeat(30 * done / total.max(1)),
                round + 1,
                rounds,
                w.imp
            );
            let _ = std::io::stderr().flush();
            let mut cmd = pin.clone().unwrap_or_default();
            cmd.extend(w.cmd.iter().cloned());
            let out = crate::same_malloc(Command::new(&cmd[0]).args(&cmd[1..]))
                .stderr(Stdio::inherit())
                .output()
                .map_err(|e| format!("{}: {e}", cmd.join(" ")))?;
            if !out.status.success() {
                return Err(format!("worker failed: {}", cmd.join(" ")));
            }
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let c: Vec<&str> = line.split(',').collect();
                if c.len() != 7 {
                    continue;
                }
                rows.push(Row {
                    round,
                    imp: c[0].into(),
                    op: c[1].into(),
                    dataset: c[2].into(),
                    bench: c[3].into(),
                    message: c[4].into(),
                    bytes: c[5].parse().unwrap_or(0.0),
                    ns: c[6].parse().unwrap_or(0.0),
                });
            }
        }
    }
    eprintln!();
    if let Some(path) = &args.csv {
        let mut csv = String::from("impl,op,dataset,bench,message,bytes,ns_per_msg,round\n");
        for r in &rows {
            let _ = writeln!(
                csv,
                "{},{},{},{},{},{:.1},{:.1},{}",
                r.imp, r.op, r.dataset, r.bench, r.message, r.bytes, r.ns, r.round
            );
        }
        write(path, &csv)?;
    }
    let report = report(&rows, rounds, &notes, &dominated);
    let md = args.markdown.clone().unwrap_or_else(|| work.join("wire.md"));
    write(&md, &report)?;
    Ok(format!("{report}\nreport written to {}\n", md.display()))
}

/// Writes `bytes` to `path` unless it already holds exactly that: the peer
/// workers' build scripts watch the schema list, and rewriting it unchanged
/// would make cargo regenerate and re-link them (minutes, fat LTO) each run.
fn write(path: &Path, bytes: impl AsRef<[u8]>) -> Result<(), String> {
    let bytes = bytes.as_ref();
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

fn which(prog: &str) -> bool {
    Command::new(prog).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// The schemas and jobs: the shared datasets, or the user's own messages;
/// plus the (bench, message) pairs whose payload is > 90% string / bytes.
type Plan = (Vec<Schema>, Vec<Job>, BTreeSet<(String, String)>);

/// Generated requests per social-network type when the recorded ones are
/// absent: as many as the recorded set holds.
const GENERATED_PER_TYPE: usize = 200;

fn plan(
    args: &WireArgs,
    repo: &Path,
    work: &Path,
    notes: &mut Vec<String>,
) -> Result<Plan, String> {
    if let (Some(proto), Some(ty)) = (&args.proto, &args.type_name) {
        let mut includes = args.includes.clone();
        if includes.is_empty() {
            includes.push(proto.parent().map(Path::to_path_buf).unwrap_or_default());
        }
        let schema = Schema {
            key: "user".into(),
            proto: abs(proto),
            includes: includes.iter().map(|p| abs(p)).collect(),
        };
        let jobs = args
            .messages
            .iter()
            .map(|m| Job {
                dataset: "user".into(),
                bench: ty.clone(),
                schema: "user".into(),
                type_name: ty.clone(),
                message: m
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                delimited: true,
                path: abs(m),
            })
            .collect();
        return Ok((vec![schema], jobs, BTreeSet::new()));
    }
    let root = args.datasets.clone().unwrap_or_else(|| repo.join("../shared/datasets"));
    let root = abs(&root);
    let wanted = |bench: &str, dataset: &str| {
        args.only.is_empty() || args.only.iter().any(|o| o == bench || o == dataset)
    };
    let mut schemas = Vec::new();
    let mut jobs = Vec::new();
    let mut dominated = BTreeSet::new();
    let hpb = root.join("hyperprotobench");
    let manifest = std::fs::read_to_string(hpb.join("manifest.tsv"));
    let social_only = !args.only.is_empty() && args.only.iter().all(|o| o == "socialnetwork");
    if manifest.is_err() && !social_only {
        // Third-party data the repository does not carry. One line on
        // stderr (smoke runs discard the report) and one in the report.
        let note = format!("hyperprotobench: left out, no {}", hpb.join("manifest.tsv").display());
        eprintln!("{note}");
        notes.push(note);
    }
    if let Ok(manifest) = manifest {
        let mut seen = BTreeSet::new();
        for line in manifest.lines().skip(1) {
            let c: Vec<&str> = line.split('\t').collect();
            if c.len() < 12 || !wanted(c[0], "hyperprotobench") {
                continue;
            }
            let key = format!("hyperprotobench/{}", c[0]);
            if seen.insert(key.clone()) {
                schemas.push(Schema {
                    key: key.clone(),
                    proto: hpb.join(c[0]).join("benchmark.proto"),
                    includes: vec![hpb.join(c[0])],
                });
            }
            let (size, payload) =
                (c[3].parse::<f64>().unwrap_or(1.0), c[8].parse::<f64>().unwrap_or(0.0));
            if payload > 0.9 * size {
                dominated.insert((c[0].to_string(), c[1].to_string()));
            }
            jobs.push(Job {
                dataset: "hyperprotobench".into(),
                bench: c[0].into(),
                schema: key,
                type_name: c[2].into(),
                message: c[1].into(),
                delimited: false,
                path: hpb.join(c[11]),
            });
        }
    }
    if !wanted("socialnetwork", "socialnetwork") {
        return Ok((schemas, jobs, dominated));
    }
    let sn = root.join("socialnetwork");
    if let Ok(manifest) = std::fs::read_to_string(sn.join("manifest.tsv")) {
        schemas.push(Schema {
            key: "socialnetwork".into(),
            proto: sn.join("social_network.proto"),
            includes: vec![sn.clone()],
        });
        for line in manifest.lines().skip(1) {
            let c: Vec<&str> = line.split('\t').collect();
            if c.len() < 6 {
                continue;
            }
            let short = c[0].rsplit('.').next().unwrap_or(c[0]);
            jobs.push(Job {
                dataset: "socialnetwork".into(),
                bench: "socialnetwork".into(),
                schema: "socialnetwork".into(),
                type_name: c[0].into(),
                message: short.into(),
                delimited: true,
                path: sn.join(c[5]),
            });
        }
    } else {
        // The schema is the repository's own, so the requests can be made
        // here: the demo's generated ones, written as the recorded set is.
        let dir = work.join("socialnetwork");
        let proto = repo.join("protos/socialnetwork/social_network.proto");
        schemas.push(Schema {
            key: "socialnetwork".into(),
            proto: abs(&proto),
            includes: vec![abs(&repo.join("protos/socialnetwork"))],
        });
        let schema = protoplane_load::social::schema()?;
        let ts = schema.tables();
        for (_, ty, messages) in protoplane_load::social::requests(ts, None, GENERATED_PER_TYPE)? {
            let type_name = ts.message_name(ty).to_string();
            let short = type_name.rsplit('.').next().unwrap_or(&type_name).to_string();
            let path = dir.join(format!("{short}.ldelim"));
            let mut bytes = Vec::new();
            let framing = protoplane_load::framing::Framing::new(true);
            for m in &messages {
                framing.put(&mut bytes, m);
            }
            write(&path, &bytes)?;
            jobs.push(Job {
                dataset: "socialnetwork".into(),
                bench: "socialnetwork".into(),
                schema: "socialnetwork".into(),
                type_name,
                message: short,
                delimited: true,
                path,
            });
        }
        notes.push(format!(
            "socialnetwork: {GENERATED_PER_TYPE} generated requests per type (no {})",
            sn.join("manifest.tsv").display()
        ));
    }
    Ok((schemas, jobs, dominated))
}

fn abs(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Builds (or finds) every requested worker; what cannot be built is noted and skipped.
fn build_workers(
    args: &WireArgs,
    repo: &Path,
    work: &Path,
    schemas: &[Schema],
    schemas_file: &Path,
    timing: &[String],
    notes: &mut Vec<String>,
) -> Vec<Worker> {
    let mut workers = Vec::new();
    let want = |name: &str| args.impls.iter().any(|i| i == name);
    if want("protoplane") {
        if let Ok(exe) = crate::this_binary() {
            let mut cmd = vec![
                exe.display().to_string(),
                "bench-worker".into(),
                "--schemas".into(),
                schemas_file.display().to_string(),
            ];
            cmd.extend(timing.iter().cloned());
            workers.push(Worker { imp: "protoplane", cmd });
        }
    }
    let peers: Vec<&str> = ["prost", "buffa"].into_iter().filter(|i| want(i)).collect();
    if !peers.is_empty() || want("protoplane-gen") {
        eprintln!(
            "building the prost / buffa / generated-protoplane worker (bench/peers-rs, fat LTO)…"
        );
        let manifest = repo.join("bench/peers-rs/Cargo.toml");
        let status = Command::new("cargo")
            .args(["build", "--release", "--quiet", "--manifest-path"])
            .arg(&manifest)
            .env("PP_BENCH_SCHEMAS", schemas_file)
            .status();
        let exe = repo.join("bench/peers-rs/target/release/pp-peers-worker");
        if status.is_ok_and(|s| s.success()) && exe.exists() {
            // Two workers (two processes per round, rotated like the
            // others): the peers, and protoplane's generated decoders.
            let mut add = |imp: &'static str, impls: String| {
                let mut cmd = vec![exe.display().to_string(), "--impls".into(), impls];
                cmd.extend(timing.iter().cloned());
                workers.push(Worker { imp, cmd });
            };
            if !peers.is_empty() {
                add("prost+buffa", peers.join(","));
            }
            if want("protoplane-gen") {
                add("protoplane-gen", "protoplane-gen".into());
            }
        } else {
            notes.push(
                "the prost / buffa / generated-protoplane worker did not build: those columns \
                 are missing"
                    .into(),
            );
        }
    }
    if want("cpp") {
        eprintln!("building the protobuf C++ workers (bench/cpp, Debian libprotobuf-dev)…");
        for s in schemas {
            let out = work.join("cpp").join(s.key.replace('/', "_"));
            let mut cmd = Command::new("bash");
            cmd.arg(repo.join("bench/cpp/build.sh")).arg(&s.key).arg(&out).arg(&s.proto);
            for inc in &s.includes {
                cmd.arg("-I").arg(inc);
            }
            let exe = out.join("pp-cpp-worker");
            if cmd.stdout(Stdio::null()).status().is_ok_and(|st| st.success()) && exe.exists() {
                let mut c = vec![exe.display().to_string()];
                c.extend(timing.iter().cloned());
                workers.push(Worker { imp: "cpp", cmd: c });
            } else {
                notes.push(format!("the protobuf C++ worker for {} did not build", s.key));
            }
        }
    }
    workers
}

/// Column order of the tables: (impl, op, header).
const COLUMNS: [(&str, &str, &str); 22] = [
    ("protoplane", "decode_view_gen", "pp view gen"),
    ("protoplane", "decode_view", "pp view"),
    ("protoplane", "decode_owned_gen", "pp owned gen"),
    ("protoplane", "decode_owned", "pp owned"),
    ("protoplane", "encode_gen", "pp enc gen"),
    ("protoplane", "encode", "pp enc"),
    ("protoplane", "encode_sg", "pp enc-sg"),
    ("protoplane", "memcpy", "memcpy"),
    ("cpp", "decode_arena", "C++ arena"),
    ("cpp", "decode_reuse", "C++ reuse"),
    ("cpp", "decode_owned", "C++ fresh"),
    ("cpp", "encode", "C++ enc"),
    ("prost", "decode_owned", "prost fresh"),
    ("prost", "decode_reuse", "prost reuse"),
    ("prost", "encode", "prost enc"),
    ("buffa", "decode_view", "buffa view"),
    ("buffa", "decode_owned", "buffa fresh"),
    ("buffa", "encode", "buffa enc"),
    ("protoplane", "json_decode", "pp json dec"),
    ("cpp", "json_decode", "C++ json dec"),
    ("protoplane", "json_encode", "pp json enc"),
    ("cpp", "json_encode", "C++ json enc"),
];

type Key = (String, String, String); // (dataset, bench, message)
/// (dataset, bench, message) -> (impl, op) -> per-round values.
type Cells = BTreeMap<Key, BTreeMap<(String, String), Vec<f64>>>;

fn report(
    rows: &[Row],
    rounds: usize,
    notes: &[String],
    dominated: &BTreeSet<(String, String)>,
) -> String {
    let mut cells: Cells = BTreeMap::new();
    let mut bytes: BTreeMap<Key, f64> = BTreeMap::new();
    for r in rows {
        let key = (r.dataset.clone(), r.bench.clone(), r.message.clone());
        bytes.insert(key.clone(), r.bytes);
        cells.entry(key).or_default().entry((r.imp.clone(), r.op.clone())).or_default().push(r.ns);
    }
    let present: Vec<&(&str, &str, &str)> =
        COLUMNS.iter().filter(|(i, o, _)| rows.iter().any(|r| r.imp == *i && r.op == *o)).collect();
    let mut md = String::new();
    let _ = writeln!(md, "# protoplane wire benchmark\n");
    let _ = writeln!(
        md,
        "ns per message, median over {rounds} round(s) of per-round medians, one pinned core; \
         `spread` = (max - min) / median of the protoplane view column over rounds.\n"
    );
    for n in notes {
        let _ = writeln!(md, "> note: {n}\n");
    }
    let mut benches: Vec<(String, String)> =
        cells.keys().map(|(d, b, _)| (d.clone(), b.clone())).collect();
    benches.dedup();
    for (dataset, bench) in &benches {
        let _ = writeln!(md, "## {dataset} / {bench}\n");
        let mut header = String::from("| message | bytes |");
        let mut rule = String::from("|---|---:|");
        for (_, _, h) in &present {
            let _ = write!(header, " {h} |");
            rule.push_str("---:|");
        }
        header.push_str(" spread |");
        rule.push_str("---:|");
        let _ = writeln!(md, "{header}\n{rule}");
        let mut per_col: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
        for (key, by_op) in cells.iter().filter(|((d, b, _), _)| d == dataset && b == bench) {
            let _ = write!(md, "| {} | {:.0} |", key.2, bytes.get(key).copied().unwrap_or(0.0));
            for (i, o, _) in &present {
                match by_op.get(&(i.to_string(), o.to_string())) {
                    Some(v) => {
                        let m = median(v);
                        per_col.entry((i.to_string(), o.to_string())).or_default().push(m);
                        let _ = write!(md, " {} |", fmt_ns(m));
                    }
                    None => md.push_str(" – |"),
                }
            }
            let spread = by_op.get(&("protoplane".into(), "decode_view".into())).map(|v| {
                let (lo, hi) = v.iter().fold((f64::MAX, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
                (hi - lo) / median(v).max(1e-9)
            });
            let _ =
                writeln!(md, " {} |", spread.map_or("–".into(), |s| format!("{:.0}%", 100.0 * s)));
        }
        let _ = write!(md, "| **geomean** | |");
        for (i, o, _) in &present {
            match per_col
                .get(&(i.to_string(), o.to_string()))
                .and_then(|v| geomean(v.iter().copied()))
            {
                Some(g) => {
                    let _ = write!(md, " **{}** |", fmt_ns(g));
                }
                None => md.push_str(" – |"),
            }
        }
        let _ = writeln!(md, " |\n");
    }
    md.push_str(&targets(&cells, &bytes, dominated));
    md
}

/// Median of per-round values (never empty: a cell exists only once measured).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 10_000.0 {
        format!("{:.1}µs", ns / 1000.0)
    } else {
        format!("{ns:.0}")
    }
}

/// The targets of the wire-speed issue, as ratios of geometric means.
fn targets(
    cells: &Cells,
    bytes: &BTreeMap<Key, f64>,
    dominated: &BTreeSet<(String, String)>,
) -> String {
    let mut md = String::from(
        "## Ratios against the peers (geomean over messages; > 1 = protoplane faster)\n\n",
    );
    md.push_str("| dataset | comparison | ratio | target | met |\n|---|---|---:|---:|---|\n");
    let k = |i: &str, o: &str| (i.to_string(), o.to_string());
    // Geomeans over all HyperProtoBench messages (not per bench).
    let all = |dataset: &str, col: (String, String)| -> Option<f64> {
        geomean(
            cells
                .iter()
                .filter(|((d, _, _), _)| d == dataset)
                .filter_map(|(_, by)| by.get(&col).map(|v| median(v))),
        )
    };
    let mut line = |dataset: &str,
                    what: &str,
                    ours: (String, String),
                    theirs: Vec<(String, String)>,
                    goal: f64| {
        let Some(a) = all(dataset, ours) else { return };
        let best = theirs.into_iter().filter_map(|c| all(dataset, c)).fold(f64::MAX, f64::min);
        if best == f64::MAX {
            return;
        }
        let ratio = best / a;
        let _ = writeln!(
            md,
            "| {dataset} | {what} | {ratio:.2}× | ≥ {goal}× | {} |",
            if ratio >= goal { "yes" } else { "**no**" }
        );
    };
    let h = "hyperprotobench";
    let s = "socialnetwork";
    // (dataset, comparison, our op, their (impl, op)s, target): each is
    // reported for the generated path and for the table-driven one.
    let cpp_arena = || vec![k("cpp", "decode_arena")];
    type Case<'a> = (&'a str, &'a str, &'a str, Vec<(String, String)>, f64);
    let cpp_json = |op: &str| vec![k("cpp", op)];
    let cases: [Case<'_>; 12] = [
        (h, "view decode vs C++ arena parse", "decode_view", cpp_arena(), 6.0),
        (h, "view decode vs buffa view", "decode_view", vec![k("buffa", "decode_view")], 2.0),
        (h, "owned decode vs C++ arena parse", "decode_owned", cpp_arena(), 1.5),
        (h, "owned decode vs prost fresh", "decode_owned", vec![k("prost", "decode_owned")], 2.5),
        (
            h,
            "encode vs faster of C++ / prost",
            "encode",
            vec![k("cpp", "encode"), k("prost", "encode")],
            1.2,
        ),
        (s, "decode (view) vs prost fresh", "decode_view", vec![k("prost", "decode_owned")], 2.0),
        (
            s,
            "decode (view) vs buffa's fastest",
            "decode_view",
            vec![k("buffa", "decode_view"), k("buffa", "decode_owned"), k("buffa", "decode_reuse")],
            1.3,
        ),
        (s, "encode vs buffa", "encode", vec![k("buffa", "encode")], 1.3),
        (h, "JSON decode vs C++ JsonStringToMessage", "json_decode", cpp_json("json_decode"), 3.0),
        (h, "JSON encode vs C++ MessageToJsonString", "json_encode", cpp_json("json_encode"), 3.0),
        (s, "JSON decode vs C++ JsonStringToMessage", "json_decode", cpp_json("json_decode"), 3.0),
        (s, "JSON encode vs C++ MessageToJsonString", "json_encode", cpp_json("json_encode"), 3.0),
    ];
    for (dataset, what, op, theirs, goal) in cases {
        let gen = format!("{op}_gen");
        line(dataset, &format!("{what} (generated)"), k("protoplane", &gen), theirs.clone(), goal);
        line(dataset, &format!("{what} (table-driven)"), k("protoplane", op), theirs, goal);
    }
    // The table-driven path within 1.3× of the generated one.
    for (dataset, op) in
        [(h, "decode_owned"), (h, "decode_view"), (s, "decode_owned"), (s, "decode_view")]
    {
        let gen = format!("{op}_gen");
        let (Some(t), Some(g)) =
            (all(dataset, k("protoplane", op)), all(dataset, k("protoplane", &gen)))
        else {
            continue;
        };
        let ratio = t / g;
        let _ = writeln!(
            md,
            "| {dataset} | {op}: table-driven time / generated time | {ratio:.2} | ≤ 1.3 | {} |",
            if ratio <= 1.3 { "yes" } else { "**no**" }
        );
    }
    // Large messages (≥ 100 KB): owned decode and encode against a plain
    // copy of the message, the floor for anything producing a copy; and the
    // bytes-dominated ones (> 90% string / bytes payload) of any size.
    md.push_str("\nLarge and bytes-dominated HyperProtoBench messages: time / memcpy time (target ≤ 1.25 for ≥ 100 KB).\n\n");
    md.push_str(
        "| op | messages | geomean ratio to memcpy | worst | target met |\n|---|---|---:|---:|---|\n",
    );
    for op in ["decode_owned_gen", "decode_owned", "encode_gen", "encode"] {
        for (which, large) in [("≥ 100 KB", true), ("> 90% payload", false)] {
            let ratios: Vec<f64> = cells
                .iter()
                .filter(|((d, _, _), _)| d == h)
                .filter(|(key, _)| {
                    let (_, b, m) = key;
                    if large {
                        bytes.get(*key).copied().unwrap_or(0.0) >= 100_000.0
                    } else {
                        dominated.contains(&(b.clone(), m.clone()))
                    }
                })
                .filter_map(|(_, by)| {
                    let m = by.get(&k("protoplane", "memcpy"))?;
                    let o = by.get(&k("protoplane", op))?;
                    Some(median(o) / median(m))
                })
                .collect();
            if let Some(g) = geomean(ratios.iter().copied()) {
                let worst = ratios.iter().copied().fold(0.0, f64::max);
                let met = match (large, g <= 1.25) {
                    (false, _) => "(no target)",
                    (true, true) => "yes",
                    (true, false) => "**no**",
                };
                let _ = writeln!(
                    md,
                    "| {op} | {which} ({}) | {g:.2} | {worst:.2} | {met} |",
                    ratios.len()
                );
            }
        }
    }
    md
}
