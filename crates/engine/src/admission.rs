//! Who may attach, and how the attach socket stays open for them.
//!
//! The attach socket is the one door every application comes through, so
//! nothing a connecting process does may keep it shut for others:
//!
//! * handshakes run as tasks, not threads: an idle connection costs a
//!   descriptor and a few hundred bytes, and waits at most
//!   [`Admission::handshake_timeout`] for its HELLO;
//! * at most [`Admission::max_pending`] handshakes wait at once; one more
//!   evicts the oldest. An honest application sends its HELLO as soon as
//!   it connects and is answered within microseconds, so a flood of idle
//!   connections delays it by nothing and cannot starve it;
//! * at most [`Admission::max_applications`] applications are attached
//!   (each holds a region, three descriptors and a drain task);
//! * each service may be served only by the peers [`Admission::allow`]
//!   names, by the kernel's word on who is connecting (`SO_PEERCRED`: uid,
//!   gid, pid), not by anything the application says;
//! * an application names each service once (a service listed twice would
//!   count twice in the balancer).
//!
//! The engine's configuration sets all of it (`[attach]`, `[attach.allow]`;
//! see [`crate::config`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use protoplane_shm::attach::{self, Answer, Hello, VERSION};
use tokio::io::Interest;
use tokio::net::UnixStream;

use crate::error::{Error, Refusal};

/// A peer the kernel vouches for: the attach socket's `SO_PEERCRED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Process id (`None` where the platform does not say).
    pub pid: Option<u32>,
}

/// Who a rule in `[attach.allow]` lets in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Principal {
    /// Processes of this user id (`"uid:1000"`).
    Uid(u32),
    /// Processes whose primary group is this group id (`"gid:1000"`).
    Gid(u32),
}

impl Principal {
    /// Parses `uid:N` or `gid:N`.
    pub fn parse(s: &str) -> Result<Principal, Error> {
        let bad = || Error::Config(format!("{s:?}: uid:N or gid:N"));
        let (kind, n) = s.split_once(':').ok_or_else(bad)?;
        let n: u32 = n.parse().map_err(|_| bad())?;
        match kind {
            "uid" => Ok(Principal::Uid(n)),
            "gid" => Ok(Principal::Gid(n)),
            _ => Err(bad()),
        }
    }

    fn admits(&self, c: &Credentials) -> bool {
        match *self {
            Principal::Uid(u) => c.uid == u,
            Principal::Gid(g) => c.gid == g,
        }
    }
}

/// The attach socket's rules.
#[derive(Clone, Debug)]
pub struct Admission {
    /// Applications attached at once; more are refused.
    pub max_applications: usize,
    /// Handshakes waiting at once; one more evicts the oldest.
    pub max_pending: usize,
    /// How long a connection may take to send its HELLO.
    pub handshake_timeout: Duration,
    /// Per service full name (or `"*"` for every service not listed): who
    /// may serve it. A service with no rule (and no `"*"`) may be served by
    /// any process that can open the attach socket (its file permissions
    /// decide).
    pub allow: BTreeMap<String, Vec<Principal>>,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            max_applications: 64,
            max_pending: 64,
            handshake_timeout: Duration::from_secs(1),
            allow: BTreeMap::new(),
        }
    }
}

impl Admission {
    /// Why `peer` may not serve `service`, if it may not.
    pub fn refuses(&self, service: &str, peer: &Credentials) -> Option<Refusal> {
        let rule = self.allow.get(service).or_else(|| self.allow.get("*"))?;
        if rule.iter().any(|p| p.admits(peer)) {
            return None;
        }
        Some(Refusal::NotAllowed { uid: peer.uid, gid: peer.gid, service: service.to_string() })
    }

    /// Checks a HELLO against the rules that need no engine state: version,
    /// each service once, permissions.
    pub fn check(&self, hello: &Hello, peer: &Credentials) -> Result<(), Refusal> {
        if hello.version != VERSION {
            return Err(Refusal::Version { theirs: hello.version, ours: VERSION });
        }
        let mut names: Vec<&str> = hello.services.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(Refusal::ListedTwice(w[0].to_string()));
        }
        for (name, _) in &hello.services {
            if let Some(why) = self.refuses(name, peer) {
                return Err(why);
            }
        }
        Ok(())
    }
}

/// Counters of the attach socket.
#[derive(Debug, Default)]
pub struct AdmissionStats {
    /// Connections accepted on the attach socket.
    pub connections: AtomicU64,
    /// Handshakes cut off by a newer one (too many pending).
    pub evicted: AtomicU64,
    /// Handshakes that sent no HELLO in time.
    pub timed_out: AtomicU64,
    /// Applications refused (any reason).
    pub refused: AtomicU64,
}

/// The handshakes in progress, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    list: Mutex<VecDeque<(u64, tokio::task::AbortHandle)>>,
    next: AtomicU64,
}

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, tokio::task::AbortHandle)>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A number for a new handshake, evicting the oldest while `max` wait.
    pub(crate) fn admit(&self, max: usize, stats: &AdmissionStats) -> u64 {
        let mut l = self.lock();
        while l.len() >= max.max(1) {
            if let Some((_, h)) = l.pop_front() {
                h.abort();
                stats.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn started(&self, id: u64, h: tokio::task::AbortHandle) {
        self.lock().push_back((id, h));
    }

    pub(crate) fn done(&self, id: u64) {
        let mut l = self.lock();
        if let Some(i) = l.iter().position(|(x, _)| *x == id) {
            l.remove(i);
        }
    }
}

/// The kernel's word on who is at the other end of `sock`.
pub(crate) fn credentials(sock: &UnixStream) -> std::io::Result<Credentials> {
    let c = sock.peer_cred()?;
    Ok(Credentials { uid: c.uid(), gid: c.gid(), pid: c.pid().and_then(|p| u32::try_from(p).ok()) })
}

/// Receives one handshake message without blocking a thread.
pub(crate) async fn recv(
    sock: &UnixStream,
) -> std::io::Result<(Vec<u8>, Vec<std::os::fd::OwnedFd>)> {
    loop {
        sock.readable().await?;
        match sock.try_io(Interest::READABLE, || attach::recv(sock)) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

/// Sends one handshake message (with descriptors) without blocking a
/// thread.
pub(crate) async fn send(
    sock: &UnixStream,
    msg: &[u8],
    fds: &[&std::os::fd::OwnedFd],
) -> std::io::Result<()> {
    loop {
        sock.writable().await?;
        match sock.try_io(Interest::WRITABLE, || attach::send(sock, msg, fds)) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

/// Sends a refusal (best effort: the peer may be gone).
pub(crate) async fn refuse(sock: &UnixStream, why: String) {
    let _ = tokio::time::timeout(
        Duration::from_millis(100),
        send(sock, &Answer::Refuse(why).encode(), &[]),
    )
    .await;
}

/// Counts attached applications against [`Admission::max_applications`].
#[derive(Debug, Default)]
pub(crate) struct Seats(AtomicUsize);

impl Seats {
    /// Takes a seat, if one of `max` is free: it comes back when the
    /// returned guard drops, unless [`Seat::keep`] was called (the
    /// handshake may be cut off at any await, which drops it).
    pub(crate) fn take(&self, max: usize) -> Option<Seat<'_>> {
        let taken = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1));
        // Made only when taken (a seat made and dropped gives one back).
        taken.is_ok().then(|| Seat { seats: self, kept: false })
    }

    /// Gives one back.
    pub(crate) fn give_back(&self) {
        let _ = self.0.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

/// A seat taken during a handshake.
#[derive(Debug)]
pub(crate) struct Seat<'a> {
    seats: &'a Seats,
    kept: bool,
}

impl Seat<'_> {
    /// The application attached: the seat is its own until it detaches
    /// (then [`Seats::give_back`]).
    pub(crate) fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.seats.give_back();
        }
    }
}

/// Binds a Unix listener at `path`, refusing to take it from a live
/// listener: if something answers there, another engine serves that path
/// and stealing it would leave that engine unreachable. A socket file
/// nobody answers on (left by an engine that died) is removed first; any
/// other kind of file is left alone and refused.
pub fn bind_unix(path: &std::path::Path) -> Result<tokio::net::UnixListener, Error> {
    use std::os::unix::fs::FileTypeExt;
    let listen = |source| Error::Listen { at: path.display().to_string(), source };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            let reason = "exists and is not a socket; not replacing it";
            return Err(Error::SocketPath { path: path.to_path_buf(), reason });
        }
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                let reason = "another process is listening there";
                return Err(Error::SocketPath { path: path.to_path_buf(), reason });
            }
            // Stale: its listener is gone.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(path).map_err(listen)?
            }
            Err(e) => return Err(listen(e)),
        }
    }
    tokio::net::UnixListener::bind(path).map_err(listen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(names: &[&str]) -> Hello {
        Hello {
            version: VERSION,
            pid: 1,
            services: names.iter().map(|n| (n.to_string(), 7)).collect(),
            schemas: false,
            channels: vec![],
            lanes: false,
        }
    }

    const ME: Credentials = Credentials { uid: 1000, gid: 100, pid: Some(4) };

    #[test]
    fn duplicates_versions_and_permissions() {
        let mut a = Admission::default();
        assert_eq!(a.check(&hello(&["a.S", "b.T"]), &ME), Ok(()));
        let e = a.check(&hello(&["a.S", "b.T", "a.S"]), &ME).expect_err("twice");
        assert_eq!(e, Refusal::ListedTwice("a.S".into()));
        let old = Hello { version: VERSION - 1, ..hello(&["a.S"]) };
        assert_eq!(
            a.check(&old, &ME),
            Err(Refusal::Version { theirs: VERSION - 1, ours: VERSION })
        );

        a.allow.insert("a.S".into(), vec![Principal::Uid(0), Principal::Gid(100)]);
        a.allow.insert("*".into(), vec![Principal::Uid(0)]);
        assert_eq!(a.check(&hello(&["a.S"]), &ME), Ok(()), "by group");
        let e = a.check(&hello(&["a.S", "b.T"]), &ME).expect_err("b.T: root only");
        assert_eq!(e.to_string(), "uid 1000 gid 100 may not serve b.T (attach.allow)");
        assert!(matches!(e, Refusal::NotAllowed { uid: 1000, .. }));
        let root = Credentials { uid: 0, gid: 0, pid: None };
        assert_eq!(a.check(&hello(&["a.S", "b.T"]), &root), Ok(()));
    }

    #[test]
    fn principals_parse() {
        assert!(matches!(Principal::parse("uid:0"), Ok(Principal::Uid(0))));
        assert!(matches!(Principal::parse("gid:65534"), Ok(Principal::Gid(65534))));
        for bad in ["uid", "uid:", "uid:-1", "user:1", "gid:x"] {
            assert!(matches!(Principal::parse(bad), Err(Error::Config(_))), "{bad}");
        }
    }

    #[test]
    fn seats_are_counted() {
        let s = Seats::default();
        s.take(2).expect("one").keep();
        let second = s.take(2).expect("two");
        assert!(s.take(2).is_none());
        // A handshake cut off: its seat comes back.
        drop(second);
        s.take(2).expect("two again").keep();
        assert!(s.take(2).is_none());
        s.give_back();
        assert!(s.take(2).is_some());
    }
}
