//! Server processes a benchmark starts and measures: a monolithic server
//! (protoplane or tonic), or `protoplane engine` with one application
//! attached. Used by `bench rpc`, `bench split` and `demo --split`: each
//! prints the addresses it listens on, which are read from its stdout.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::Error;

/// A child process, killed when dropped.
#[derive(Debug)]
pub struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Servers started for one measurement.
#[derive(Debug)]
pub struct Servers {
    /// The processes, killed in this order when dropped (split: the
    /// engine, then the application).
    _procs: Vec<Proc>,
    /// The gRPC address, HOST:PORT.
    pub grpc: String,
    /// The lean transport's address, when served.
    pub lean: Option<String>,
    /// The engine's pid, when split.
    pub engine: Option<u32>,
    /// The application's pid (the whole server's when monolithic).
    pub app: u32,
}

/// Reads `child`'s stdout up to the first line starting with `last`,
/// collecting `(prefix, rest)` for every line starting with one of
/// `prefixes` (60 s at most).
fn read_until(
    child: &mut Child,
    prefixes: &[&str],
    last: &str,
) -> Result<Vec<(String, String)>, String> {
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(out).lines();
    let mut found = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let Some(Ok(line)) = lines.next() else { break };
        for p in prefixes {
            if let Some(rest) = line.strip_prefix(p) {
                found.push((p.to_string(), rest.trim().to_string()));
            }
        }
        if line.starts_with(last) {
            return Ok(found);
        }
    }
    Err(format!("the server did not print {last:?}"))
}

fn spawn(mut cmd: Command, stderr: Stdio) -> Result<Proc, String> {
    cmd.stdout(Stdio::piped()).stderr(stderr).stdin(Stdio::null());
    cmd.spawn().map(Proc).map_err(|e| format!("start {cmd:?}: {e}"))
}

/// A monolithic server (protoplane or tonic): prints `lean listening on`
/// (protoplane) and then `listening on`.
pub fn monolithic(cmd: Command) -> Result<Servers, Error> {
    start_monolithic(cmd).map_err(Error::Host)
}

fn start_monolithic(cmd: Command) -> Result<Servers, String> {
    let mut p = spawn(cmd, Stdio::null())?;
    let found = read_until(&mut p.0, &["lean listening on ", "listening on "], "listening on ")?;
    let get = |k: &str| found.iter().find(|(p, _)| p == k).map(|(_, v)| v.clone());
    let grpc = get("listening on ").ok_or("no gRPC address")?;
    let lean = get("lean listening on ");
    let app = p.0.id();
    Ok(Servers { _procs: vec![p], grpc, lean, engine: None, app })
}

/// An engine and one application attached to it: returns once the engine
/// says the application attached.
pub fn split(engine: Command, app: Command) -> Result<Servers, Error> {
    start_split(engine, app).map_err(Error::Host)
}

fn start_split(engine: Command, app: Command) -> Result<Servers, String> {
    let mut e = spawn(engine, Stdio::piped())?;
    let err = e.0.stderr.take().ok_or("no engine stderr")?;
    // The engine's log, drained for as long as it runs (a full pipe would
    // stall it); "attached for" lines are passed on.
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains("attached for") {
                let _ = tx.send(line);
            }
        }
    });
    let found = read_until(
        &mut e.0,
        &["grpc listening on ", "lean listening on ", "attach at "],
        "attach at ",
    )?;
    let get = |k: &str| found.iter().find(|(p, _)| p == k).map(|(_, v)| v.clone());
    let grpc = get("grpc listening on ").ok_or("engine: no gRPC address")?;
    let lean = get("lean listening on ");
    let a = spawn(app, Stdio::null())?;
    rx.recv_timeout(Duration::from_secs(60))
        .map_err(|_| "the application did not attach within 60 s".to_string())?;
    let (engine, app) = (Some(e.0.id()), a.0.id());
    Ok(Servers { _procs: vec![e, a], grpc, lean, engine, app })
}
