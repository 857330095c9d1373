//! `protoplane-bench`: protoplane's benchmarks against the libraries a user
//! would otherwise pick. `protoplane bench …` hands its arguments to this
//! binary, so the command line itself depends on no harness, peer or
//! example; the harnesses start `protoplane`'s own commands (serve, engine,
//! load) as the processes they measure ([`protoplane`]) and this binary's
//! hidden workers (`bench-worker`, `bench-echo`, `bench-ring`,
//! `bench-cotenant`).
//!
//! | command | what | harness |
//! |---|---|---|
//! | `bench wire` | the wire engine against prost, buffa and protobuf C++ | [`wire`], [`worker`], [`jobs`] |
//! | `bench rpc` | the RPC server against tonic, grpc-go and gRPC C++ | [`rpc`] |
//! | `bench split` | split mode against monolithic: handoff, zero logic, knee, a noisy neighbour | [`split`], [`echo`], [`ring`], [`cotenant`] |
//! | `bench offload` | one-shot commit, co-serialization, per-field decode, functional offload | [`offload`] |
//! | `bench inc` | in-network computation against server agents only | [`inc`] |
//! | `bench intercept` | what a server interceptor chain adds to a call | [`intercept`] |
//!
//! See `bench/README.md` at the repository root for the method and the
//! worker protocol.
//!
//! Exit status: 0 success, 1 malformed input (a worker's), 2 usage errors.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cotenant;
mod echo;
mod front;
mod inc;
mod intercept;
mod jobs;
mod offload;
mod python;
mod ring;
mod rpc;
mod split;
mod wire;
mod worker;

#[derive(Parser, Debug)]
#[command(
    name = "protoplane bench",
    bin_name = "protoplane bench",
    about = "protoplane's benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: BenchCommand,
}

/// `protoplane bench …`
#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// protoplane's wire engine against prost, buffa and protobuf C++.
    Wire(wire::WireArgs),
    /// protoplane's RPC server (gRPC/HTTP2 and lean) against tonic + prost,
    /// grpc-go and gRPC C++, under `protoplane load` and ghz.
    Rpc(rpc::RpcArgs),
    /// Split mode (engine + application) against monolithic: the ring
    /// handoff, zero business logic, and the knee experiment.
    Split(split::SplitArgs),
    /// In-network computation: each application with the data plane vs.
    /// server agents only, clear and cache policies, two applications
    /// sharing the data plane, overflow.
    Inc(inc::IncArgs),
    /// The offload engine: one-shot commit, co-serialization, per-field
    /// decode on engine workers, functional offload (RPCAcc, PsPIN).
    Offload(offload::OffloadArgs),
    /// What a server interceptor chain adds to a call (none, one, four).
    Intercept(intercept::InterceptArgs),
    /// grpcio servicers served by grpcio and by the protoplane engine
    /// (the Python package): calls/s, latency, CPU per call of each
    /// process.
    Python(python::PythonArgs),
    /// One measurement of `bench intercept`.
    #[command(name = "bench-intercept", hide = true)]
    BenchIntercept(intercept::WorkerArgs),
    /// One benchmark worker process (driven by `bench wire`).
    #[command(name = "bench-worker", hide = true)]
    BenchWorker(worker::WorkerArgs),
    /// The application of `bench split` (echo after a busy loop).
    #[command(name = "bench-echo", hide = true)]
    BenchEcho(echo::EchoArgs),
    /// The caller and front end of `bench split`'s outbound experiments.
    #[command(name = "bench-front", hide = true)]
    BenchFront(front::FrontArgs),
    /// The ring handoff measurement of `bench split`.
    #[command(name = "bench-ring", hide = true)]
    BenchRing(ring::RingArgs),
    /// The CPU-bound neighbour of `bench split`'s neighbour experiment.
    #[command(name = "bench-cotenant", hide = true)]
    BenchCotenant(cotenant::CotenantArgs),
}

/// A failure and the exit status it maps to.
enum Failure {
    Usage(String),
    Input(String),
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(m)) => {
            eprintln!("protoplane: {m}");
            ExitCode::from(2)
        }
        Err(Failure::Input(m)) => {
            eprintln!("protoplane: {m}");
            ExitCode::from(1)
        }
    }
}

fn print(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        // A closed pipe (`| head`) is the reader's choice, not our failure.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::Usage(format!("stdout: {e}"))),
    }
}

fn run(command: BenchCommand) -> Result<(), Failure> {
    match command {
        BenchCommand::Wire(args) => print(&wire::run(&args).map_err(Failure::Usage)?),
        BenchCommand::Rpc(args) => print(&rpc::run(&args).map_err(Failure::Usage)?),
        BenchCommand::Split(args) => print(&split::run(&args).map_err(Failure::Usage)?),
        BenchCommand::Offload(args) => print(&offload::run(&args).map_err(Failure::Usage)?),
        BenchCommand::Inc(args) => print(&inc::run(&args).map_err(Failure::Usage)?),
        BenchCommand::Intercept(args) => print(&intercept::run(&args).map_err(Failure::Usage)?),
        BenchCommand::Python(args) => print(&python::run(&args).map_err(Failure::Usage)?),
        BenchCommand::BenchIntercept(args) => intercept::worker(&args).map_err(Failure::Usage),
        BenchCommand::BenchEcho(args) => echo::run(&args).map_err(Failure::Usage),
        BenchCommand::BenchFront(args) => front::run(&args).map_err(Failure::Usage),
        BenchCommand::BenchCotenant(args) => cotenant::run(&args).map_err(Failure::Usage),
        BenchCommand::BenchRing(args) => {
            let line = ring::run(&args).map_err(Failure::Usage)?;
            print(&line)
        }
        BenchCommand::BenchWorker(args) => {
            let rows = worker::run(&args).map_err(Failure::Input)?;
            print(&rows)
        }
    }
}

/// The `protoplane` command whose processes a benchmark measures:
/// `$PROTOPLANE_BIN` (set by `protoplane bench`, which runs this binary),
/// else `protoplane` beside this binary.
fn protoplane() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("PROTOPLANE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let me = this_binary()?;
    let p = me.with_file_name("protoplane");
    if p.exists() {
        Ok(p)
    } else {
        Err(format!("{} is missing (cargo build --release)", p.display()))
    }
}

/// This binary, for the hidden worker commands a benchmark starts.
fn this_binary() -> Result<PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))
}

/// The same allocator behaviour for every process a benchmark starts:
/// glibc keeps freed big blocks instead of returning them to the OS
/// (unmapping them, or trimming the heap), which otherwise makes every
/// large message fault fresh pages in and its timings jump.
fn same_malloc(cmd: &mut std::process::Command) -> &mut std::process::Command {
    cmd.env("MALLOC_MMAP_THRESHOLD_", "1073741824")
        .env("MALLOC_TRIM_THRESHOLD_", "1073741824")
        .env("MALLOC_TOP_PAD_", "67108864")
}
