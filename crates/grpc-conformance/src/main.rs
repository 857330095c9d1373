//! `protoplane-grpc-conformance`: the programs ConnectRPC's conformance
//! runner (`connectconformance`, pinned in `tests/grpc-conformance/run.sh`)
//! tests protoplane's gRPC stack through.
//!
//! * `server`: `connectrpc.conformance.v1.ConformanceService` on
//!   protoplane's gRPC server (`--mode server`: the runner's reference
//!   clients call it);
//! * `client`: protoplane's gRPC client making the RPCs the runner
//!   describes (`--mode client`: against the runner's reference servers).
//!
//! Both speak the runner's protocol on stdin / stdout (size-delimited
//! protobuf, [`delimited`]); stderr is for people. Both are built on the
//! dynamic path: the schema is our own declaration of the protocol
//! (`proto/conformance.proto`), compiled at start-up, messages are read
//! through `MessageView` and written with `Builder`, and the runtime does
//! the rest. Only gRPC over HTTP/2 with the protobuf codec is supported;
//! `tests/grpc-conformance/config.yaml` tells the runner so.
//!
//! Read `server.rs` or `client.rs` first, then `schema.rs`.

mod client;
mod delimited;
mod schema;
mod server;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokio::io::AsyncWriteExt;

#[derive(Parser, Debug)]
#[command(name = "protoplane-grpc-conformance", version, about)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Serve ConformanceService: one ServerCompatRequest on stdin, its
    /// ServerCompatResponse on stdout, then serve until terminated.
    Server {
        /// Split mode: the service runs as an application attached to a
        /// protoplane engine (started in this process) that speaks gRPC.
        #[arg(long)]
        split: bool,
    },
    /// Make the RPCs of the ClientCompatRequests on stdin, writing a
    /// ClientCompatResponse for each on stdout; exits at end of input.
    Client,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.mode {
        Mode::Server { split } => server::run(split),
        Mode::Client => client::run(),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("protoplane-grpc-conformance: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The runtime of both modes: two workers, the size of the machines this
/// runs on (the runner's own processes share them).
fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))
}

/// Writes one framed message to stdout and flushes it (the runner reads as
/// it goes).
async fn write_stdout(frame: &[u8]) -> Result<(), String> {
    let mut out = tokio::io::stdout();
    out.write_all(frame).await.map_err(|e| format!("writing stdout: {e}"))?;
    out.flush().await.map_err(|e| format!("writing stdout: {e}"))
}
