//! protoplane's load generator: a library any tool or test can call
//! ([`run`] with a [`LoadConfig`]), the engine behind `protoplane load` (a
//! load generator for any gRPC server, in the manner of ghz; [`command`]),
//! the demo and every RPC benchmark.
//!
//! What it measures is the server, so the generator's own work per call is
//! kept small: request messages are read once, checked once against the
//! method's input type, and then sent as the bytes they are (no
//! re-encoding); every in-flight slot is one task looping call → record into
//! its own histogram (merged at the end, so nothing is locked per call);
//! the only shared writes per call are relaxed atomic counters.
//!
//! Two ways to drive the server:
//!
//! * closed loop (default): `concurrency` slots, each starting its next call
//!   as soon as the previous one ends; latency is measured from the call's
//!   start;
//! * open loop (`--rate`): call *i* is scheduled at `t0 + i / rate` whatever
//!   the server does. A slot that is free sleeps until its call's time; a
//!   call whose time comes while every slot is busy starts late, is counted
//!   as *delayed*, and its latency is measured from its **scheduled** start,
//!   so a server that stalls is charged for the calls it held up (the
//!   "coordinated omission" correction).
//!
//! Calls go over gRPC (HTTP/2, any gRPC server) or, for protoplane servers,
//! over the lean transport ([`Transport`]).
//!
//! Beside the generator, the pieces every driver of a measurement needs:
//!
//! | module | what |
//! |---|---|
//! | [`social`] | the social-network workload: schema, service, requests |
//! | [`servers`] | server processes started for a measurement, killed on drop |
//! | [`host`] | tokio runtimes, busy-polling, CPU time from `/proc` |
//! | [`framing`] | varint-length-delimited message streams |

pub mod framing;
mod generator;
pub mod host;
pub mod servers;
pub mod social;

pub use generator::{command, command_with, run, LoadArgs, LoadConfig, LoadReport, Transport};

/// Why a load run (or one of its helpers) failed. `Display` is the one-line
/// message the command prints.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// Flags, files, a schema or settings the run cannot use.
    Config(String),
    /// A connection to the target could not be made.
    Connect(String),
    /// The target does not serve a method of the run (the lean transport's
    /// handshake lists what it serves).
    NotServed(String),
    /// The run stopped before its end: a slot failed, or the target failed
    /// every call.
    Aborted(String),
    /// This host: a runtime, a process, a report file.
    Host(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Config(s)
            | Error::Connect(s)
            | Error::NotServed(s)
            | Error::Aborted(s)
            | Error::Host(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for Error {}

/// The one-line message, for callers that report errors as text (the
/// command line).
impl From<Error> for String {
    fn from(e: Error) -> String {
        e.to_string()
    }
}
