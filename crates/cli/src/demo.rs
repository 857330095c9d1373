//! `protoplane demo`: the social-network service served by protoplane and
//! driven by its own load generator, with nothing but the repository.
//!
//! 1. The requests: the recorded ones of `../shared/datasets/socialnetwork`
//!    when that directory is beside the checkout (or `--dataset DIR`), else
//!    generated ones (the builder lays them out, the engine encodes them).
//!    Every request is decoded (owned and view) and re-encoded byte-exactly
//!    first: the wire engine's check.
//! 2. A protoplane server (`protos/socialnetwork/social_network.proto`,
//!    embedded; the handlers of `protoplane_load::social`) on its own thread, one
//!    single-threaded runtime: gRPC over HTTP/2 and the lean transport.
//! 3. `protoplane load` in-process on another thread: round-robin over the
//!    five methods' requests, first one call in flight (latency), then many
//!    (throughput), over gRPC and over the lean transport.
//! 4. The report: QPS, latency percentiles, and the server thread's CPU time
//!    per call (from `/proc/self/task/TID/stat`), which is the cost the
//!    engine puts on a core.
//! 5. With `--split`, the same phases against the split deployment: a
//!    `protoplane engine` process terminating both transports, and the same
//!    handlers in a `protoplane serve --attach` application process beside
//!    it (shared memory between them). The report gives each process's CPU
//!    per call (`/proc/PID/stat`) and the latency, beside the monolithic
//!    figures.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protoplane_grpc::Request;
use protoplane_rpc::{Channel, Client};
use protoplane_schema::TableSet;
use protoplane_wire::{
    json, Block, Builder, DecodeOptions, Decoder, EncodeOptions, Encoder, MessageView, Source,
    Value,
};

use protoplane_load::{host, social, LoadConfig, LoadReport, Transport};

#[derive(clap::Args, Debug)]
pub(crate) struct DemoArgs {
    /// Seconds of load per phase.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Calls in flight in the throughput phases.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Generated requests per type (when no recorded requests are used).
    #[arg(long, default_value_t = 500)]
    per_type: usize,
    /// Recorded requests (`<Type>.ldelim` files). Default:
    /// `../shared/datasets/socialnetwork/messages` when it exists.
    #[arg(long, value_name = "DIR")]
    dataset: Option<PathBuf>,
    /// Use generated requests even when recorded ones are found.
    #[arg(long, conflicts_with = "dataset")]
    generated: bool,
    /// Also run the split deployment (engine and application as two
    /// processes) and show it beside the monolithic server.
    #[arg(long)]
    split: bool,
}

/// The recorded-requests directory to use, if any.
fn dataset_dir(args: &DemoArgs) -> Option<PathBuf> {
    if args.generated {
        return None;
    }
    if let Some(d) = &args.dataset {
        return Some(d.clone());
    }
    let exe_repo = std::env::current_dir().ok()?;
    let d = exe_repo.parent()?.join("shared/datasets/socialnetwork/messages");
    d.is_dir().then_some(d)
}

struct Served {
    grpc: String,
    lean: String,
    tid: Option<String>,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

/// Starts the server on its own thread (a single-threaded runtime).
fn start_server() -> Result<Served, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("pp-server".into())
        .spawn(move || {
            let started = (|| {
                let rt = host::runtime(1)?;
                let router = Arc::new(social::router()?);
                let (grpc, lean) = rt.block_on(async {
                    let g = tokio::net::TcpListener::bind("127.0.0.1:0").await;
                    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await;
                    (g, l)
                });
                let grpc = grpc.map_err(|e| format!("bind: {e}"))?;
                let lean = lean.map_err(|e| format!("bind: {e}"))?;
                let addrs = (
                    grpc.local_addr().map_err(|e| e.to_string())?.to_string(),
                    lean.local_addr().map_err(|e| e.to_string())?.to_string(),
                );
                Ok::<_, String>((rt, router, grpc, lean, addrs))
            })();
            match started {
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
                Ok((rt, router, grpc, lean, (g, l))) => {
                    let _ = tx.send(Ok((g, l, host::thread_id())));
                    rt.block_on(async move {
                        tokio::spawn(protoplane_rpc::lean::server::serve_tcp(router.clone(), lean));
                        tokio::spawn(router.serve(grpc));
                        let _ = stopped.await;
                    });
                }
            }
        })
        .map_err(|e| format!("server thread: {e}"))?;
    let (grpc, lean, tid) = rx.recv().map_err(|_| "server thread died".to_string())??;
    Ok(Served { grpc, lean, tid, stop, thread })
}

struct Phase {
    name: String,
    report: LoadReport,
    /// CPU µs per call of the server (monolithic) or, split, the
    /// application process.
    server_cpu_us: Option<f64>,
    /// Split: the engine process's CPU µs per call.
    engine_cpu_us: Option<f64>,
}

/// The demo's four phases (1 and many calls in flight, gRPC and lean)
/// against `grpc` and `lean`; `cpu` reads the CPU seconds of the engine (if
/// any) and the server or application.
async fn phases(
    grpc: &str,
    lean: &str,
    calls: &[(String, Vec<Bytes>)],
    concurrency: usize,
    seconds: Duration,
    cpu: &dyn Fn() -> (Option<f64>, Option<f64>),
) -> Result<Vec<Phase>, String> {
    let plan = [
        ("gRPC / HTTP2", Transport::Grpc, 1, grpc),
        ("gRPC / HTTP2", Transport::Grpc, concurrency.max(1), grpc),
        ("lean / TCP", Transport::Lean, 1, lean),
        ("lean / TCP", Transport::Lean, concurrency.max(1), lean),
    ];
    let mut out = Vec::new();
    for (name, transport, conc, target) in plan {
        let mut cfg = LoadConfig::new(target.to_string(), calls.to_vec());
        cfg.transport = transport;
        cfg.concurrency = conc;
        cfg.duration = seconds;
        cfg.progress = false;
        let (e0, s0) = cpu();
        let r = protoplane_load::run(&cfg).await?;
        let (e1, s1) = cpu();
        let made = (r.ok + r.errors.iter().map(|e| e.1).sum::<u64>()).max(1) as f64;
        let per_call = |b: Option<f64>, a: Option<f64>| b.zip(a).map(|(b, a)| (a - b) * 1e6 / made);
        out.push(Phase {
            name: name.to_string(),
            report: r,
            server_cpu_us: per_call(s0, s1),
            engine_cpu_us: per_call(e0, e1),
        });
    }
    Ok(out)
}

/// Login(req_id 42, "ada") through `target`; the token it answers.
async fn login(target: &str, schema: &Arc<protoplane_grpc::Schema>) -> Result<String, String> {
    let ts = schema.tables();
    let channel = Channel::connect(target).await.map_err(|e| e.to_string())?;
    let client = Client::new(channel, schema.clone());
    let login = schema.find(social::SERVICE, "Login").ok_or("no Login")?;
    let mut b = Builder::new(ts, schema.method(login).map(|m| m.input).unwrap_or(0))
        .map_err(|e| e.to_string())?;
    let root = b.root();
    b.set(root, 1, Value::I64(42)).map_err(|e| e.to_string())?;
    b.set(root, 2, Value::String(b"ada")).map_err(|e| e.to_string())?;
    let block: Block = b.finish();
    let (reply, _) = client.unary(login, Request::new(&block)).await.map_err(|e| e.to_string())?;
    let v = reply.view(ts).map_err(|e| e.to_string())?;
    let token = v.by_number(1).map_err(|e| e.to_string())?.and_then(|x| x.as_str()).unwrap_or("");
    Ok(token.to_string())
}

pub(crate) fn run(args: &DemoArgs) -> Result<String, String> {
    let schema = social::schema()?;
    let ts = schema.tables();
    let dataset = dataset_dir(args);
    let reqs = social::requests(ts, dataset.as_deref(), args.per_type)?;
    let mut report = String::new();
    let _ = writeln!(report, "protoplane demo: the social-network service, served and loaded\n");
    let source = match &dataset {
        Some(d) => format!("recorded requests from {}", d.display()),
        None => format!("{} generated requests per method (no dataset found)", args.per_type),
    };
    let total: usize = reqs.iter().map(|r| r.2.len()).sum();
    let _ = writeln!(report, "requests: {total}, {source}");

    // 1. The wire engine's check, and what the requests look like.
    let _ = writeln!(
        report,
        "\n{:<22} {:>6} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8}",
        "request", "count", "wire B", "block B", "view B", "dec ns", "view ns", "enc ns"
    );
    let mut example = String::new();
    for (path, ty, messages) in &reqs {
        let stats = exercise(ts, *ty, messages)?;
        let n = messages.len().max(1) as f64;
        let name = ts.message_name(*ty).trim_start_matches("socialnetwork.").to_string();
        let _ = writeln!(
            report,
            "{:<22} {:>6} {:>8.1} {:>9.1} {:>8.1} {:>8.0} {:>8.0} {:>8.0}",
            name,
            messages.len(),
            stats.wire_bytes as f64 / n,
            stats.block_bytes as f64 / n,
            stats.view_bytes as f64 / n,
            stats.decode_ns,
            stats.view_ns,
            stats.encode_ns,
        );
        if path.ends_with("/ComposePost") {
            if let Some(first) = messages.first() {
                let block = protoplane_wire::decode(ts, *ty, first, &DecodeOptions::view())
                    .map_err(|e| e.to_string())?;
                let view = MessageView::new(ts, Source::viewing(block.as_bytes(), first), *ty)
                    .map_err(|e| e.to_string())?;
                json::to_json(&view, &mut example).map_err(|e| e.to_string())?;
            }
        }
    }
    let _ = writeln!(
        report,
        "every request decoded (owned and zero-copy view) and re-encoded byte-exactly."
    );

    // 2. The server, 3. the load.
    let served = start_server()?;
    let calls: Vec<(String, Vec<Bytes>)> = reqs
        .iter()
        .map(|(p, _, m)| (p.clone(), m.iter().map(|b| Bytes::from(b.clone())).collect()))
        .collect();
    let rt = host::runtime(1)?;
    let seconds = Duration::from_secs_f64(args.seconds.max(0.2));
    let tid = served.tid.clone();
    let (token, phases) = rt.block_on(async {
        // One call first, to show it works: Login's answer.
        let token = login(&served.grpc, &schema).await?;
        let cpu = || (None, tid.as_deref().and_then(host::thread_cpu_seconds));
        let p = phases(&served.grpc, &served.lean, &calls, args.concurrency, seconds, &cpu).await?;
        Ok::<_, String>((token, p))
    })?;
    let _ = served.stop.send(());
    let _ = served.thread.join();

    let _ = writeln!(
        report,
        "\nserver: protoplane, 5 methods of socialnetwork.SocialNetwork, one thread (gRPC/HTTP2 \
         and lean on TCP)\nload:   protoplane load, round-robin over the {total} requests, \
         {:.1} s per phase, closed loop\nLogin(req_id 42, \"ada\") answered token {token:?}\n",
        seconds.as_secs_f64()
    );
    let _ = writeln!(
        report,
        "{:<14} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>16} {:>7}",
        "transport",
        "in flight",
        "QPS",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "p99.9 µs",
        "server CPU µs/call",
        "errors"
    );
    for p in &phases {
        let r = &p.report;
        let errors: u64 = r.errors.iter().map(|e| e.1).sum();
        let cpu = p.server_cpu_us.map_or("n/a".to_string(), |c| format!("{c:.1}"));
        let _ = writeln!(
            report,
            "{:<14} {:>9} {:>9.0} {:>8} {:>8} {:>8} {:>8} {:>16} {:>7}",
            p.name, r.concurrency, r.qps, r.p50, r.p90, r.p99, r.p999, cpu, errors
        );
    }
    let _ = writeln!(
        report,
        "\nserver CPU/call: the server thread's user+system time over the phase divided by the \
         calls made\n(10 ms clock ticks: a rough figure for short phases). Both sides share this \
         machine's two cores,\nunpinned: `protoplane bench rpc` is the measurement, pinned and \
         side by side with tonic."
    );
    if args.split {
        let split = split_phases(args, &schema, &calls, seconds, &rt)?;
        report.push_str(&split_report(&split, &phases));
    }
    let _ = writeln!(report, "\none ComposePostRequest as proto3 JSON:\n{example}");
    Ok(report)
}

/// The split deployment's run: who served, what Login answered, the phases.
struct SplitRun {
    engine: u32,
    app: u32,
    token: String,
    phases: Vec<Phase>,
}

/// Starts `protoplane engine` and `protoplane serve --attach` as two
/// processes of this binary, and runs the phases against the engine.
fn split_phases(
    args: &DemoArgs,
    schema: &Arc<protoplane_grpc::Schema>,
    calls: &[(String, Vec<Bytes>)],
    seconds: Duration,
    rt: &tokio::runtime::Runtime,
) -> Result<SplitRun, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = std::env::temp_dir().join(format!("protoplane-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let sock = dir.join("engine.sock");
    let mut engine = std::process::Command::new(&exe);
    engine.args(["engine", "--grpc-port", "0", "--lean-port", "0", "--threads", "1", "--attach"]);
    engine.arg(&sock);
    let mut app = std::process::Command::new(&exe);
    app.args(["serve", "--attach"]).arg(&sock);
    let run = (|| {
        let servers = protoplane_load::servers::split(engine, app)?;
        let lean = servers.lean.clone().ok_or("the engine serves no lean port")?;
        let (engine, app) = (servers.engine.ok_or("no engine")?, servers.app);
        rt.block_on(async {
            let token = login(&servers.grpc, schema).await?;
            let cpu = || (host::pid_cpu_seconds(engine), host::pid_cpu_seconds(app));
            let phases =
                phases(&servers.grpc, &lean, calls, args.concurrency, seconds, &cpu).await?;
            Ok(SplitRun { engine, app, token, phases })
        })
    })();
    let _ = std::fs::remove_dir_all(&dir);
    run
}

fn split_report(split: &SplitRun, mono: &[Phase]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nsplit: `protoplane engine` (pid {}: gRPC/HTTP2 and lean on TCP, framing, decode, \
         encode) +\n       `protoplane serve --attach` (pid {}: the same handlers), shared \
         memory between them\nLogin(req_id 42, \"ada\") answered token {:?} through the engine\n",
        split.engine, split.app, split.token
    );
    let _ = writeln!(
        out,
        "{:<14} {:>9} {:>9} {:>8} {:>8} {:>8} {:>11} {:>11} {:>11} {:>12} {:>7}",
        "transport",
        "in flight",
        "QPS",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "engine CPU",
        "app CPU",
        "total CPU",
        "vs monolithic",
        "errors"
    );
    for (p, m) in split.phases.iter().zip(mono) {
        let r = &p.report;
        let errors: u64 = r.errors.iter().map(|e| e.1).sum();
        let f = |c: Option<f64>| c.map_or("n/a".to_string(), |c| format!("{c:.1}"));
        let total = p.engine_cpu_us.zip(p.server_cpu_us).map(|(e, a)| e + a);
        let ratio = total
            .zip(m.server_cpu_us)
            .map_or("n/a".to_string(), |(t, m)| format!("{:.2}× CPU", t / m));
        let _ = writeln!(
            out,
            "{:<14} {:>9} {:>9.0} {:>8} {:>8} {:>8} {:>11} {:>11} {:>11} {:>12} {:>7}",
            p.name,
            r.concurrency,
            r.qps,
            r.p50,
            r.p99,
            r.p999,
            f(p.engine_cpu_us),
            f(p.server_cpu_us),
            f(total),
            ratio,
            errors
        );
    }
    let _ = writeln!(
        out,
        "\nCPU columns: µs per call, each process's user+system time over the phase (/proc/PID/stat) \
         divided by the calls;\nboth processes spin 20 µs after work before they park, which counts \
         at low load. `protoplane bench split`\nis the measurement: pinned cores, fresh processes, \
         rounds, and the business-logic sweep."
    );
    out
}

struct Stats {
    wire_bytes: usize,
    block_bytes: usize,
    view_bytes: usize,
    decode_ns: f64,
    view_ns: f64,
    encode_ns: f64,
}

/// Decodes and re-encodes every message, checks byte equality, times passes.
fn exercise(ts: &TableSet, ty: u32, messages: &[Vec<u8>]) -> Result<Stats, String> {
    let mut dec = Decoder::new();
    let mut enc = Encoder::new();
    let mut block = Block::new();
    let mut out = Vec::new();
    let opts = EncodeOptions { deterministic: true, ..EncodeOptions::default() };
    let (mut wire_bytes, mut block_bytes, mut view_bytes) = (0, 0, 0);
    for msg in messages {
        wire_bytes += msg.len();
        for view in [false, true] {
            let dopts = DecodeOptions { view, ..DecodeOptions::default() };
            dec.decode_into(ts, ty, msg, &dopts, &mut block).map_err(|e| e.to_string())?;
            if view {
                view_bytes += block.len();
            } else {
                block_bytes += block.len();
            }
            out.clear();
            enc.encode_into(ts, ty, Source::viewing(block.as_bytes(), msg), &opts, &mut out)
                .map_err(|e| e.to_string())?;
            if out != *msg {
                return Err(format!("round trip of a {} differs", ts.message_name(ty)));
            }
        }
    }
    let n = messages.len().max(1) as f64;
    let time = |f: &mut dyn FnMut() -> Result<(), String>| -> Result<f64, String> {
        let mut runs = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            f()?;
            runs.push(t.elapsed().as_nanos() as f64 / n);
        }
        runs.sort_by(f64::total_cmp);
        Ok(runs[2])
    };
    let decode_ns = time(&mut || {
        for m in messages {
            dec.decode_into(ts, ty, m, &DecodeOptions::default(), &mut block)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    })?;
    let view_ns = time(&mut || {
        for m in messages {
            dec.decode_into(ts, ty, m, &DecodeOptions::view(), &mut block)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    })?;
    let blocks: Vec<Block> = messages
        .iter()
        .map(|m| protoplane_wire::decode(ts, ty, m, &DecodeOptions::default()))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let encode_ns = time(&mut || {
        for b in &blocks {
            out.clear();
            enc.encode_into(ts, ty, Source::owned(b.as_bytes()), &opts, &mut out)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    })?;
    Ok(Stats { wire_bytes, block_bytes, view_bytes, decode_ns, view_ns, encode_ns })
}
