//! The admin socket: a Unix socket (`[admin] socket`, `--admin PATH`)
//! through which the engine is changed while it runs.
//!
//! One command per connection, a line of text; the answer is lines of text
//! and the connection closes. The socket file is made owner-only and every
//! connection's `SO_PEERCRED` must be the engine's own user (or root).
//!
//! | command | answer |
//! |---|---|
//! | `status` | applications attached, client connections, the policy's counts |
//! | `reload` | `ok ...` once the configuration file's `[policy]` is installed, or `error: ...` (nothing changed) |
//! | `take-over` | hands this engine's work to the engine asking (below) |
//!
//! **Live upgrade (`take-over`).** A new engine binary started with
//! `protoplane engine --take-over ADMIN_SOCK` takes over from the running
//! one with no call failed and no application restarted (Snap's engine
//! upgrade, done over a socket):
//!
//! 1. the new engine asks; the old one answers with a line naming its
//!    listening sockets and the services applications serve, and the
//!    sockets themselves (`SCM_RIGHTS`: the gRPC and lean listeners, the
//!    attach socket, this admin socket), so no address is ever unbound;
//! 2. the new engine serves on them, holding calls for those services
//!    until an instance attaches (at most [`HANDOVER_WAIT`]), and says
//!    `ready`;
//! 3. the old engine stops accepting (its accept loops end; the kernel
//!    hands every new connection to the new engine), tells each attached
//!    application to attach again (one byte, `M`, on its attach
//!    connection: the application attaches to the new engine and keeps
//!    serving the old attachment until it closes), and drains: HTTP/2
//!    clients get GOAWAY, lean connections close between calls, calls in
//!    flight finish with their applications;
//! 4. once its last client connection closed (or its grace period ended)
//!    the old engine detaches its applications, answers `done ...` and
//!    exits.
//!
//! If the new engine goes away before `ready`, the old one never stopped
//! and goes on as before.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::error::Error;

/// How long a new engine holds calls for a service the old engine served,
/// waiting for one of its applications to attach.
pub const HANDOVER_WAIT: Duration = Duration::from_secs(5);

/// How long the old engine waits for the new one's `ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The kinds of listening socket an engine hands over, in the order they
/// travel.
pub const LISTENERS: [&str; 5] = ["grpc", "lean", "lean_unix", "attach", "admin"];

/// Listening sockets an engine starts with instead of binding its own:
/// those a previous engine handed over.
#[derive(Debug, Default)]
pub struct Inherited {
    /// By kind (one of [`LISTENERS`]).
    pub fds: Vec<(String, OwnedFd)>,
    /// The services the previous engine's applications served: calls for
    /// them wait for an instance to attach.
    pub services: Vec<String>,
}

impl Inherited {
    /// Takes the socket of kind `kind`, if one was handed over.
    pub fn take(&mut self, kind: &str) -> Option<OwnedFd> {
        let i = self.fds.iter().position(|(k, _)| k == kind)?;
        Some(self.fds.remove(i).1)
    }
}

/// A take-over under way, from the new engine's side.
#[derive(Debug)]
pub struct TakeOver {
    sock: BufReader<StdUnixStream>,
    /// The old engine's admin socket path.
    pub path: PathBuf,
}

/// Asks the engine whose admin socket is `path` for its work: returns the
/// sockets it hands over and the conversation to finish with
/// [`TakeOver::ready`] once this engine serves on them.
pub fn take_over(path: &Path) -> Result<(Inherited, TakeOver), Error> {
    let fail = |what: &str, e: std::io::Error| {
        Error::Config(format!("take-over through {}: {what}: {e}", path.display()))
    };
    let mut sock = StdUnixStream::connect(path).map_err(|e| fail("connecting", e))?;
    sock.set_read_timeout(Some(READY_TIMEOUT)).map_err(|e| fail("socket", e))?;
    sock.write_all(b"take-over\n").map_err(|e| fail("asking", e))?;
    let mut buf = vec![0u8; 64 << 10];
    let (n, fds) = protoplane_shm::sys::recv_with_fds(&sock, &mut buf)
        .map_err(|e| fail("receiving the sockets", e))?;
    let line = String::from_utf8_lossy(&buf[..n]).into_owned();
    let line = line.trim_end();
    // "listeners grpc,attach services a.S,b.T" or "error: ..."
    let mut words = line.split(' ');
    if words.next() != Some("listeners") {
        return Err(Error::Config(format!(
            "take-over through {}: the engine said {line:?}",
            path.display()
        )));
    }
    let kinds: Vec<&str> =
        words.next().unwrap_or("").split(',').filter(|k| !k.is_empty()).collect();
    let services = match (words.next(), words.next()) {
        (Some("services"), Some(s)) => {
            s.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect()
        }
        _ => Vec::new(),
    };
    if kinds.len() != fds.len() || kinds.iter().any(|k| !LISTENERS.contains(k)) {
        return Err(Error::Config(format!(
            "take-over through {}: {} socket(s) for {line:?}",
            path.display(),
            fds.len()
        )));
    }
    let fds = kinds.iter().map(|k| k.to_string()).zip(fds).collect();
    let sock = BufReader::new(sock);
    Ok((Inherited { fds, services }, TakeOver { sock, path: path.to_path_buf() }))
}

impl TakeOver {
    /// Tells the old engine this one serves; waits for it to finish its
    /// calls and go (its grace period, at most). Returns what it said.
    pub fn ready(mut self, wait: Duration) -> Result<String, Error> {
        let fail = |e: std::io::Error| {
            Error::Config(format!("take-over through {}: {e}", self.path.display()))
        };
        self.sock.get_mut().write_all(b"ready\n").map_err(fail)?;
        self.sock
            .get_mut()
            .set_read_timeout(Some(wait.max(Duration::from_secs(1))))
            .map_err(fail)?;
        let mut said = String::new();
        (&mut self.sock).take(4096).read_line(&mut said).map_err(fail)?;
        Ok(said.trim_end().to_string())
    }
}

/// Reads one command line (at most 256 bytes).
async fn command(sock: &mut tokio::net::UnixStream) -> std::io::Result<String> {
    let mut line = String::new();
    let mut r = tokio::io::BufReader::new(tokio::io::AsyncReadExt::take(&mut *sock, 256));
    tokio::time::timeout(Duration::from_secs(5), r.read_line(&mut line))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no command"))??;
    Ok(line.trim().to_string())
}

/// Waits for the new engine's `ready` (the old engine's side).
pub(crate) async fn ready(sock: &mut tokio::net::UnixStream) -> Result<(), String> {
    let mut line = String::new();
    let mut r = tokio::io::BufReader::new(tokio::io::AsyncReadExt::take(&mut *sock, 256));
    match tokio::time::timeout(READY_TIMEOUT, r.read_line(&mut line)).await {
        Ok(Ok(_)) if line.trim() == "ready" => Ok(()),
        Ok(Ok(0)) => Err("the new engine went away".into()),
        Ok(Ok(_)) => Err(format!("the new engine said {:?}", line.trim())),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no ready within {READY_TIMEOUT:?}")),
    }
}

/// Serves the admin socket until the engine is drained or handed over.
pub(crate) async fn serve(listener: tokio::net::UnixListener, core: std::sync::Arc<crate::Core>) {
    let me = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(0)
    };
    let stop = core.router.drain();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.started() => return,
        };
        let Ok((mut sock, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        match crate::admission::credentials(&sock) {
            Ok(c) if c.uid == me || c.uid == 0 => {}
            _ => {
                let _ = sock.write_all(b"error: not the engine's user\n").await;
                continue;
            }
        }
        let core = core.clone();
        tokio::spawn(async move {
            let cmd = match command(&mut sock).await {
                Ok(c) => c,
                Err(e) => {
                    let _ = sock.write_all(format!("error: {e}\n").as_bytes()).await;
                    return;
                }
            };
            let answer = match cmd.as_str() {
                "status" => Ok(core.status()),
                "reload" => core.reload().map(|s| format!("ok {s}")),
                "take-over" => return core.hand_over(sock).await,
                other => Err(Error::Config(format!(
                    "unknown command {other:?} (status, reload, take-over)"
                ))),
            };
            let text = match answer {
                Ok(s) => format!("{s}\n"),
                Err(e) => format!("error: {e}\n"),
            };
            let _ = sock.write_all(text.as_bytes()).await;
        });
    }
}

/// Sends `take-over`'s first answer: the kinds, the services, the sockets.
pub(crate) fn send_listeners(
    sock: &tokio::net::UnixStream,
    fds: &[(&'static str, OwnedFd)],
    services: &[String],
) -> std::io::Result<()> {
    let kinds: Vec<&str> = fds.iter().map(|(k, _)| *k).collect();
    let line = format!("listeners {} services {}\n", kinds.join(","), services.join(","));
    let refs: Vec<&OwnedFd> = fds.iter().map(|(_, f)| f).collect();
    // The socket is a tokio one (non-blocking): a 64 KiB line and five
    // descriptors fit in an empty socket buffer, so it never blocks here.
    protoplane_shm::sys::send_with_fds(sock, line.as_bytes(), &refs)
}

/// Sends one command to the admin socket at `path` and returns the
/// answer (`protoplane admin`).
pub fn request(path: &Path, command: &str) -> Result<String, Error> {
    let fail = |e: std::io::Error| Error::Config(format!("admin socket {}: {e}", path.display()));
    let mut sock = StdUnixStream::connect(path).map_err(fail)?;
    sock.set_read_timeout(Some(Duration::from_secs(30))).map_err(fail)?;
    sock.write_all(format!("{command}\n").as_bytes()).map_err(fail)?;
    let mut answer = String::new();
    sock.take(1 << 20).read_to_string(&mut answer).map_err(fail)?;
    Ok(answer)
}
