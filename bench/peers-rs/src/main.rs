//! `pp-peers-worker`: the Rust peers worker of protoplane's side-by-side wire
//! benchmark. It times prost and buffa, both generated at build time from the
//! benchmark's `.proto` files, following the worker protocol of
//! `bench/README.md`:
//!
//! ```text
//! pp-peers-worker --jobs FILE [--ops LIST] [--min-time-ms N] [--samples K]
//! ```
//!
//! One CSV row per (job, impl, op) on stdout:
//! `impl,op,dataset,bench,message,bytes,ns_per_msg`. Diagnostics on stderr.

// Built without schemas (see build.rs), nothing reaches the runners.
#![cfg_attr(pp_no_schemas, allow(dead_code, unused_imports))]

mod generated;
mod jobs;
mod measure;
mod runners;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use jobs::{Job, Payload};
use measure::Timing;
use runners::{JobInput, Op, BUFFA_OPS, PROST_OPS, PROTOPLANE_GEN_OPS};

const USAGE: &str = "usage: pp-peers-worker --jobs FILE [--impls LIST] [--ops LIST] \
                     [--min-time-ms N] [--samples K]";

/// The impls this worker runs.
const IMPLS: [&str; 3] = ["prost", "buffa", "protoplane-gen"];

/// Parsed command line.
#[derive(Debug)]
struct Args {
    jobs: PathBuf,
    ops: Vec<Op>,
    /// `prost`, `buffa`, `protoplane-gen`, in this order of running.
    impls: Vec<String>,
    timing: Timing,
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            print_help();
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            eprintln!("pp-peers-worker: {err}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("pp-peers-worker: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Runs every job of the job file; stops at the first failure.
fn run(args: &Args) -> Result<(), String> {
    let jobs = jobs::read_job_file(&args.jobs)?;
    let mut stdout = std::io::stdout().lock();
    for job in &jobs {
        let label = format!("{}/{}/{}", job.dataset, job.bench, job.message);
        if !generated::SCHEMAS.contains(&job.schema.as_str()) {
            eprintln!("skip {label}: schema {} is not in this build", job.schema);
            continue;
        }
        let Some(runners) = generated::lookup(&job.schema, &job.ty) else {
            eprintln!("skip {label}: schema {} has no top-level type {}", job.schema, job.ty);
            continue;
        };
        let payload = Payload::load(&job.path, job.framing).map_err(|e| format!("{label}: {e}"))?;
        let messages = payload.messages();
        let input = JobInput { label: &label, ty: &job.ty, messages: &messages };
        for imp in &args.impls {
            let results = match imp.as_str() {
                "prost" => (runners.prost)(&input, &args.ops, &args.timing)?,
                "buffa" => (runners.buffa)(&input, &args.ops, &args.timing)?,
                _ => runners::run_protoplane_gen(
                    &runners.protoplane,
                    &input,
                    &args.ops,
                    &args.timing,
                )?,
            };
            // Generated protoplane is protoplane: its rows say so, the op
            // names tell the paths apart.
            let imp = if imp == "protoplane-gen" { "protoplane" } else { imp.as_str() };
            for (op, ns) in results {
                let row = csv_row(imp, op, job, payload.mean_bytes(), ns);
                // Flushed per row, so a driver reading the pipe sees progress.
                writeln!(stdout, "{row}")
                    .and_then(|()| stdout.flush())
                    .map_err(|e| format!("cannot write to stdout: {e}"))?;
            }
        }
    }
    Ok(())
}

/// `impl,op,dataset,bench,message,bytes,ns_per_msg`.
fn csv_row(imp: &str, op: Op, job: &Job, bytes: f64, ns: f64) -> String {
    // Whole byte counts print as integers (every single-message job); a
    // delimited job's mean gets one decimal, like the time.
    let bytes = if bytes.fract() == 0.0 { format!("{bytes:.0}") } else { format!("{bytes:.1}") };
    [imp, op.name(), &job.dataset, &job.bench, &job.message, &bytes, &format!("{ns:.1}")]
        .map(csv_field)
        .join(",")
}

/// A CSV field, quoted only if it needs to be.
fn csv_field(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_owned()
    }
}

/// `Ok(None)` means `--help` was asked for.
fn parse_args(mut argv: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut jobs = None;
    let mut ops: Option<Vec<Op>> = None;
    let mut impls: Vec<String> = IMPLS.iter().map(|s| s.to_string()).collect();
    let mut min_time_ms: u64 = 5;
    let mut samples: usize = 7;
    while let Some(arg) = argv.next() {
        // Both `--flag value` and `--flag=value`.
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg, None),
        };
        if flag == "--help" || flag == "-h" {
            return Ok(None);
        }
        let mut value =
            || inline.clone().or_else(|| argv.next()).ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--jobs" => jobs = Some(PathBuf::from(value()?)),
            "--ops" => ops = Some(parse_ops(&value()?)?),
            "--impls" => {
                impls = value()?.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect();
                if let Some(bad) = impls.iter().find(|i| !IMPLS.contains(&i.as_str())) {
                    return Err(format!("--impls: unknown impl {bad:?} (known: {IMPLS:?})"));
                }
            }
            "--min-time-ms" => {
                let v = value()?;
                min_time_ms =
                    v.parse().map_err(|_| format!("--min-time-ms: not a whole number: {v:?}"))?;
            }
            "--samples" => {
                let v = value()?;
                samples = v
                    .parse()
                    .ok()
                    .filter(|&k| k > 0)
                    .ok_or(format!("--samples: not a positive whole number: {v:?}"))?;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(Args {
        jobs: jobs.ok_or("--jobs is required")?,
        // Default: every op either impl has.
        ops: ops.unwrap_or_else(|| Op::ALL.to_vec()),
        impls,
        timing: Timing { min_time: Duration::from_millis(min_time_ms), samples },
    }))
}

/// Ops named by the protocol but run by neither impl here (`decode_arena`,
/// `encode_sg`, `memcpy`) are accepted and produce no rows, so a driver can
/// pass one list to every worker; names outside the protocol are errors.
fn parse_ops(list: &str) -> Result<Vec<Op>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(|name| Op::parse(name).ok_or(format!("--ops: unknown op {name:?}")))
        .collect()
}

fn print_help() {
    let names = |ops: &[Op]| ops.iter().map(|op| op.name()).collect::<Vec<_>>().join(",");
    println!("{USAGE}\n");
    println!("Times prost, buffa and protoplane's generated decoders on the jobs of FILE");
    println!("(bench/README.md, \"Worker protocol\").");
    println!("  --impls LIST      prost,buffa,protoplane-gen (default: all three)");
    println!("  --ops LIST        comma-separated ops (default: all)");
    println!("  --min-time-ms N   minimum time of one sample (default 5)");
    println!("  --samples K       samples per (job, op); the median is reported (default 7)\n");
    println!(
        "ops: prost {}; buffa {}; protoplane-gen {}",
        names(PROST_OPS),
        names(BUFFA_OPS),
        names(PROTOPLANE_GEN_OPS)
    );
    println!(
        "schemas built in: {}",
        if generated::SCHEMAS.is_empty() {
            "(none)".to_owned()
        } else {
            generated::SCHEMAS.join(" ")
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Option<Args>, String> {
        parse_args(list.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn parses_the_protocol_command_line() {
        let parsed = args(&[
            "--jobs",
            "j.tsv",
            "--ops=decode_owned,encode",
            "--min-time-ms",
            "2",
            "--samples",
            "3",
        ])
        .expect("valid")
        .expect("not help");
        assert_eq!(parsed.jobs, PathBuf::from("j.tsv"));
        assert_eq!(parsed.ops, vec![Op::DecodeOwned, Op::Encode]);
        assert_eq!(parsed.timing.min_time, Duration::from_millis(2));
        assert_eq!(parsed.timing.samples, 3);
    }

    #[test]
    fn defaults_and_errors() {
        let parsed = args(&["--jobs", "j.tsv"]).expect("valid").expect("not help");
        assert_eq!(parsed.ops, Op::ALL.to_vec());
        assert_eq!(parsed.timing.min_time, Duration::from_millis(5));
        assert_eq!(parsed.timing.samples, 7);
        assert!(args(&[]).is_err());
        assert!(args(&["--jobs", "j", "--samples", "0"]).is_err());
        assert!(args(&["--jobs", "j", "--ops", "decode"]).is_err());
        assert!(args(&["--help"]).expect("valid").is_none());
    }

    #[test]
    fn csv_fields_are_quoted_when_needed() {
        assert_eq!(csv_field("bench0"), "bench0");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
    }
}
