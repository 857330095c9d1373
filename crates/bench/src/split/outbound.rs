//! `bench split`'s outbound experiments: an application's calls to other
//! services, made in-process (monolithic: its own channel, encode, HTTP/2
//! and decode on its core) or through the engine (split: the request laid
//! out on its core, the rest in the engine). Both run
//! `protoplane-bench bench-front` (`crate::front`), whose calls are the
//! same code in both modes.
//!
//! * **outbound**: a caller making unary `Login` calls to the
//!   social-network service (`protoplane serve`, on the load core) at
//!   `OUT_IN_FLIGHT` in flight; CPU per call of the caller (measured by
//!   itself over its window) and of the engine (read around that window).
//!   Target: the caller's CPU per call through the engine ≤ 0.25× in-process.
//! * **fanout**: a front end whose every call makes `FANOUT` `Login` calls
//!   to that backend, under `protoplane load` at 64 in flight. The
//!   front end's CPU per front-end call gives the calls/s its core can
//!   carry at saturation (1 s / CPU per call); target: ≥ 3× monolithic.
//!
//! The split application parks as soon as it has nothing to do (it does
//! not spin): on this machine the engine shares its core with the backend
//! and the load, so the application waits on it most of the time, and
//! spinning through those waits would be charged to its calls although an
//! application core at saturation never spins.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{load, med, pinned, progress, verdict, Plan, Row};
use protoplane_load::servers::{monolithic, split, Servers};

/// Calls in flight of the outbound caller (and of the fan-out load).
const OUT_IN_FLIGHT: usize = 64;
/// Backend calls per front-end call.
const FANOUT: usize = 4;

/// A child killed when dropped.
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The social-network backend, on the load core.
fn backend(plan: &Plan<'_>) -> Result<Servers, String> {
    let mut c = pinned(plan.args.load_cpu, &plan.exe);
    c.args(["serve", "--port", "0", "--lean-port", "0", "--threads", "1"]);
    Ok(monolithic(c)?)
}

/// Starts `cmd` with its stdout piped and reads lines until one starts
/// with `prefix` (60 s at most): the process and that line.
fn start_until(
    mut cmd: Command,
    prefix: &str,
) -> Result<(Kid, String, BufReader<std::process::ChildStdout>), String> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::null()).stdin(Stdio::null());
    let mut kid = Kid(cmd.spawn().map_err(|e| format!("start {cmd:?}: {e}"))?);
    let out = kid.0.stdout.take().ok_or("no stdout")?;
    let mut r = BufReader::new(out);
    let line = read_line_until(&mut r, prefix)?;
    Ok((kid, line, r))
}

fn read_line_until(r: &mut impl BufRead, prefix: &str) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut line = String::new();
    while Instant::now() < deadline {
        line.clear();
        if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            break;
        }
        if line.starts_with(prefix) {
            return Ok(line.trim().to_string());
        }
    }
    Err(format!("the process did not print {prefix:?}"))
}

/// The experiment's modes for `round`, the order rotating.
fn modes(round: usize) -> [&'static str; 2] {
    if round % 2 == 0 {
        ["monolithic", "split"]
    } else {
        ["split", "monolithic"]
    }
}

/// One outbound measurement.
fn outbound_once(plan: &Plan<'_>, mode: &'static str) -> Result<Row, String> {
    let be = backend(plan)?;
    let mut engine = None;
    let mut caller = pinned(plan.args.app_cpu, &plan.me);
    caller
        .args(["bench-front", "--calls", "--backend", &be.grpc])
        .args(["--in-flight", &OUT_IN_FLIGHT.to_string()])
        .args(["--seconds", &plan.seconds.to_string()])
        .args(["--spin-us", "0"]);
    if mode == "split" {
        let (e, _, _) = start_until(plan.engine(&[]), "attach at ")?;
        engine = Some(e);
        caller.arg("--attach").arg(plan.sock());
    }
    let engine_pid = engine.as_ref().map(|e| e.0.id());
    let cpu = |pid: Option<u32>| pid.and_then(protoplane_load::host::pid_cpu_seconds);
    let (caller, _, mut out) = start_until(caller, "measuring")?;
    let e0 = cpu(engine_pid);
    let json = read_line_until(&mut out, "{")?;
    let e1 = cpu(engine_pid);
    drop(caller);
    drop(engine);
    drop(be);
    let v: serde_json::Value = serde_json::from_str(&json).map_err(|e| e.to_string())?;
    let calls = v["calls"].as_u64().unwrap_or(0).max(1) as f64;
    Ok(Row {
        experiment: "outbound",
        mode,
        transport: "grpc",
        message: "Login".into(),
        in_flight: OUT_IN_FLIGHT,
        qps: v["qps"].as_f64().unwrap_or(0.0),
        p50_us: v["p50_us"].as_f64().unwrap_or(f64::NAN),
        p99_us: v["p99_us"].as_f64().unwrap_or(f64::NAN),
        engine_cpu: e0.zip(e1).map_or(0.0, |(a, b)| (b - a) * 1e6 / calls),
        app_cpu: v["cpu_us_per_call"].as_f64().unwrap_or(f64::NAN),
        errors: v["errors"].as_u64().unwrap_or(0),
        max_gap_ms: f64::NAN,
        ..Row::default()
    })
}

/// The outbound experiment (see the module documentation).
pub(super) fn outbound(
    plan: &Plan<'_>,
    rows: &mut Vec<Row>,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    for round in 0..plan.rounds {
        for mode in modes(round) {
            progress(&format!("outbound: round {} {mode}", round + 1));
            match outbound_once(plan, mode) {
                Ok(r) => rows.push(Row { round: round + 1, ..r }),
                Err(e) => notes.push(format!("outbound: {mode}: {e}")),
            }
        }
    }
    Ok(())
}

/// The front end's `.proto` and a request for `protoplane load`, written
/// under the work directory: (`--proto`/`-I` arguments, `--method`/`--data`
/// arguments).
fn fanout_files(work: &Path) -> Result<(Vec<String>, Vec<String>, PathBuf), String> {
    let dir = work.join("fanout");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let proto = dir.join("fanout.proto");
    std::fs::write(&proto, crate::front::FANOUT_PROTO).map_err(|e| e.to_string())?;
    let schema = protoplane_grpc::Schema::from_proto_files(
        std::slice::from_ref(&proto),
        std::slice::from_ref(&dir),
    )
    .map_err(|e| e.to_string())?;
    let ts = schema.tables();
    let ty = ts.message_by_name("protoplane.fanout.HomeRequest").ok_or("no HomeRequest")?;
    let mut b = protoplane_wire::Builder::new(ts, ty).map_err(|e| e.to_string())?;
    let root = b.root();
    let set =
        |b: &mut protoplane_wire::Builder<'_>, n, v| b.set(root, n, v).map_err(|e| e.to_string());
    set(&mut b, 1, protoplane_wire::Value::I64(42))?;
    set(&mut b, 2, protoplane_wire::Value::String(b"user_1234"))?;
    set(&mut b, 3, protoplane_wire::Value::String(b"password"))?;
    let block = b.finish();
    let bin = protoplane_wire::encode(ts, ty, block.as_bytes(), &Default::default())
        .map_err(|e| e.to_string())?;
    let data = dir.join("home.ldelim");
    let mut framed = Vec::new();
    protoplane_load::framing::Framing::new(true).put(&mut framed, &bin);
    std::fs::write(&data, framed).map_err(|e| e.to_string())?;
    let schema_args =
        vec!["--proto".into(), proto.display().to_string(), "-I".into(), dir.display().to_string()];
    let call_args = vec![
        "--method".into(),
        "protoplane.fanout.Frontend/Home".into(),
        "--data".into(),
        data.display().to_string(),
    ];
    Ok((schema_args, call_args, proto))
}

/// The fan-out experiment (see the module documentation).
pub(super) fn fanout(
    plan: &Plan<'_>,
    rows: &mut Vec<Row>,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let (schema_args, call_args, proto) = fanout_files(&plan.work)?;
    let load_args: Vec<String> = schema_args.iter().chain(&call_args).cloned().collect();
    for round in 0..plan.rounds {
        for mode in modes(round) {
            progress(&format!("fanout: round {} {mode}", round + 1));
            let be = match backend(plan) {
                Ok(b) => b,
                Err(e) => {
                    notes.push(format!("fanout: backend: {e}"));
                    continue;
                }
            };
            let mut front = pinned(plan.args.app_cpu, &plan.me);
            front
                .args(["bench-front", "--backend", &be.grpc])
                .args(["--fanout", &FANOUT.to_string()])
                .arg("--proto")
                .arg(&proto)
                .args(["--spin-us", "0"]);
            let servers = match mode {
                "split" => {
                    front.arg("--attach").arg(plan.sock());
                    split(plan.engine(&schema_args), front)
                }
                _ => monolithic(front),
            };
            let servers = match servers {
                Ok(s) => s,
                Err(e) => {
                    notes.push(format!("fanout: {mode}: {e}"));
                    continue;
                }
            };
            let m = load(plan, &servers, "grpc", &load_args, OUT_IN_FLIGHT, None);
            drop(servers);
            drop(be);
            match m {
                Ok(m) => rows.push(Row {
                    experiment: "fanout",
                    mode,
                    transport: "grpc",
                    message: format!("fanout{FANOUT}"),
                    in_flight: OUT_IN_FLIGHT,
                    round: round + 1,
                    ..m.row()
                }),
                Err(e) => notes.push(format!("fanout: {mode}: {e}")),
            }
        }
    }
    Ok(())
}

/// The outbound experiments' section of the report.
pub(super) fn report(rows: &[Row]) -> String {
    let mut s = String::new();
    let pick = |exp: &'static str, mode: &'static str| {
        move |r: &Row| r.experiment == exp && r.mode == mode
    };
    if rows.iter().any(|r| r.experiment == "outbound") {
        let app = |m| med(rows, pick("outbound", m), |r| r.app_cpu);
        let eng = |m| med(rows, pick("outbound", m), |r| r.engine_cpu);
        let qps = |m| med(rows, pick("outbound", m), |r| r.qps);
        let p99 = |m| med(rows, pick("outbound", m), |r| r.p99_us);
        let ratio = app("split") / app("monolithic");
        s += &format!(
            "\n## Outbound calls ({OUT_IN_FLIGHT} in flight, unary Login to the social-network service)\n\n\
             | mode | caller CPU µs/call | engine CPU µs/call | calls/s | p99 µs |\n|---|---:|---:|---:|---:|\n\
             | in-process (monolithic) | {:.2} | – | {:.0} | {:.0} |\n\
             | through the engine (split) | {:.2} | {:.2} | {:.0} | {:.0} |\n\n\
             Caller CPU per call, through the engine ÷ in-process: **{ratio:.2}×** (target ≤ 0.25: {}).\n",
            app("monolithic"),
            qps("monolithic"),
            p99("monolithic"),
            app("split"),
            eng("split"),
            qps("split"),
            p99("split"),
            verdict(ratio <= 0.25),
        );
    }
    if rows.iter().any(|r| r.experiment == "fanout") {
        let app = |m| med(rows, pick("fanout", m), |r| r.app_cpu);
        let eng = |m| med(rows, pick("fanout", m), |r| r.engine_cpu);
        let qps = |m| med(rows, pick("fanout", m), |r| r.qps);
        let cap = |m| 1e6 / app(m);
        let ratio = cap("split") / cap("monolithic");
        s += &format!(
            "\n## Fan-out (1 call in → {FANOUT} calls out, {OUT_IN_FLIGHT} in flight)\n\n\
             | mode | front-end CPU µs/call | engine CPU µs/call | front-end core capacity, calls/s | measured calls/s |\n|---|---:|---:|---:|---:|\n\
             | monolithic | {:.2} | – | {:.0} | {:.0} |\n\
             | split | {:.2} | {:.2} | {:.0} | {:.0} |\n\n\
             Front-end core capacity (1 s ÷ its CPU per call), split ÷ monolithic: **{ratio:.2}×** (target ≥ 3: {}). \
             The measured rate is bounded by the other core, which carries the engine, the backend and the load generator here.\n",
            app("monolithic"),
            cap("monolithic"),
            qps("monolithic"),
            app("split"),
            eng("split"),
            cap("split"),
            qps("split"),
            verdict(ratio >= 3.0),
        );
    }
    s
}
