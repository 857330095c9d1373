//! The attach handshake, over a Unix stream socket.
//!
//! ```text
//! app -> engine   HELLO   "PPATTACH" | version u16 | flags u16 | pid u32
//!                         | n u16 | n x (name len u16 | name | table-set digest u64)
//!                         + with flag CHANNELS (2): m u16 | m x (target len u16 | target
//!                           | service len u16 | service | table-set digest u64): the
//!                           outbound channels, each a target and the service called on it
//!                         + with flag LANES (4), nothing more: the application
//!                           attaches once per engine worker if the engine has several
//!                         + with flag SCHEMAS (1): one descriptor per distinct
//!                           digest, in the order the digests first appear: a
//!                           file (a sealed memfd) holding that schema's
//!                           serialized FileDescriptorSet
//! engine -> app   ACCEPT  "PPATT-OK" | version u16 | lanes u16 | attachment id u32 | layout
//!                         + descriptors: the region's shared memfd (sealed against
//!                           resizing), its engine-half memfd (sealed against writes
//!                           and resizing), the application's end of the doorbell
//!                           socket pair
//!              or REFUSE  "PPATT-NO" | reason (UTF-8)
//! ```
//!
//! `lanes` is 0 unless the HELLO had flag LANES: then it is the number of
//! worker threads the engine shards its connections over, and an
//! application that attaches that many times gets one attachment (region,
//! rings, doorbell) bound to each worker, so a call never crosses between
//! threads on either side of the region (see `protoplane_rpc::shards`).
//! An application that attaches once is served from every worker.
//!
//! Versions must be equal. The digest is that of the service's whole table
//! set (`TableSet::digest`). Type and method indices in descriptors only
//! mean the same thing when both sides built the same tables: a service
//! whose digest differs from the engine's is served with the tables of the
//! schema the application sent (the engine checks it is wire-compatible
//! with its own), or refused if it sent none. After ACCEPT the socket carries nothing more; it stays open for
//! the attachment's life, and its end is how each side learns the other is
//! gone (a crash closes it too).

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use crate::layout::Layout;
use crate::sys;

/// Protocol version of the handshake, the rings and the descriptors
/// (3: one doorbell socket pair instead of two eventfds).
pub const VERSION: u16 = 3;

const HELLO: &[u8; 8] = b"PPATTACH";
const ACCEPT: &[u8; 8] = b"PPATT-OK";
const REFUSE: &[u8; 8] = b"PPATT-NO";

/// Largest handshake message.
pub const MAX_MESSAGE: usize = 64 << 10;

/// Most services one application attaches.
pub const MAX_SERVICES: usize = 255;

/// What the application says when it attaches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version.
    pub version: u16,
    /// The application's process id (for logs).
    pub pid: u32,
    /// Services served: full name and table-set digest.
    pub services: Vec<(String, u64)>,
    /// Descriptor sets travel with it ([`SCHEMAS`]).
    pub schemas: bool,
    /// Outbound channels ([`CHANNELS`]): the calls this application makes
    /// through the engine, by index (the descriptor's service field).
    pub channels: Vec<ChannelDecl>,
    /// It attaches once per engine worker ([`LANES`]).
    pub lanes: bool,
}

/// One outbound channel an application declares: where its calls go and
/// the service they call there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelDecl {
    /// A target URI (`dns:///host:port`, `ipv4:…`, `unix:…`, `xds:///…`).
    pub target: String,
    /// The service's full name.
    pub service: String,
    /// Its table-set digest (the schema's descriptor set travels with the
    /// HELLO like a served service's).
    pub digest: u64,
}

/// HELLO flag: outbound channels follow the services.
pub const CHANNELS: u16 = 2;

/// HELLO flag: the application attaches once per engine worker (ACCEPT's
/// `lanes`).
pub const LANES: u16 = 4;

/// Most engine workers an ACCEPT may announce.
pub const MAX_LANES: u16 = 64;

/// Most outbound channels one application declares.
pub const MAX_CHANNELS: usize = 255;

/// HELLO flag: a descriptor set per distinct digest is attached.
pub const SCHEMAS: u16 = 1;

/// Largest descriptor set an application may send.
pub const MAX_SCHEMA: usize = 16 << 20;

impl Hello {
    /// The distinct digests of its services, in the order they first
    /// appear: the order of the descriptor sets attached.
    pub fn digests(&self) -> Vec<u64> {
        let mut out: Vec<u64> = Vec::new();
        let channels = self.channels.iter().map(|c| &c.digest);
        for d in self.services.iter().map(|(_, d)| d).chain(channels) {
            if !out.contains(d) {
                out.push(*d);
            }
        }
        out
    }
}

/// The engine's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Attached: the attachment's id and the region's layout.
    Accept {
        /// Protocol version.
        version: u16,
        /// The engine's number for this attachment.
        id: u32,
        /// The engine's workers, when the HELLO asked ([`LANES`]); 0
        /// otherwise.
        lanes: u16,
        /// The region's layout.
        layout: Layout,
    },
    /// Refused, and why.
    Refuse(String),
}

/// A malformed handshake message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandshakeError(pub String);

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "attach handshake: {}", self.0)
    }
}

impl std::error::Error for HandshakeError {}

fn err<T>(why: &str) -> Result<T, HandshakeError> {
    Err(HandshakeError(why.to_string()))
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, HandshakeError> {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or_else(|| HandshakeError("truncated message".into()))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, HandshakeError> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| HandshakeError("truncated message".into()))
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, HandshakeError> {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| HandshakeError("truncated message".into()))
}

impl Hello {
    /// Serialized form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = HELLO.to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        let flags = if self.schemas { SCHEMAS } else { 0 }
            | if self.channels.is_empty() { 0 } else { CHANNELS }
            | if self.lanes { LANES } else { 0 };
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&(self.services.len() as u16).to_le_bytes());
        for (name, digest) in &self.services {
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&digest.to_le_bytes());
        }
        if !self.channels.is_empty() {
            out.extend_from_slice(&(self.channels.len() as u16).to_le_bytes());
            for c in &self.channels {
                for s in [&c.target, &c.service] {
                    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
                    out.extend_from_slice(s.as_bytes());
                }
                out.extend_from_slice(&c.digest.to_le_bytes());
            }
        }
        out
    }

    /// Parses a HELLO (any bytes).
    pub fn decode(b: &[u8]) -> Result<Hello, HandshakeError> {
        if b.len() > MAX_MESSAGE {
            return err("message too long");
        }
        if b.get(..8) != Some(&HELLO[..]) {
            return err("not an attach request");
        }
        let version = u16_at(b, 8)?;
        let flags = u16_at(b, 10)?;
        if flags & !(SCHEMAS | CHANNELS | LANES) != 0 {
            return err("reserved bits set");
        }
        let pid = u32_at(b, 12)?;
        let n = u16_at(b, 16)? as usize;
        // An application that only calls out serves nothing.
        if (n == 0 && flags & CHANNELS == 0) || n > MAX_SERVICES {
            return err("an application serves 1 to 255 services (0 with outbound channels)");
        }
        let mut at = 18;
        let mut services = Vec::with_capacity(n);
        for _ in 0..n {
            let len = u16_at(b, at)? as usize;
            let name =
                b.get(at + 2..at + 2 + len).ok_or(HandshakeError("truncated name".into()))?;
            let name = std::str::from_utf8(name)
                .map_err(|_| HandshakeError("service name is not UTF-8".into()))?;
            if name.is_empty() || name.len() > 1024 {
                return err("service name of 1 to 1024 bytes");
            }
            let digest = u64_at(b, at + 2 + len)?;
            services.push((name.to_string(), digest));
            at += 2 + len + 8;
        }
        let mut channels = Vec::new();
        if flags & CHANNELS != 0 {
            let m = u16_at(b, at)? as usize;
            if m == 0 || m > MAX_CHANNELS {
                return err("1 to 255 outbound channels");
            }
            at += 2;
            for _ in 0..m {
                let mut text = [String::new(), String::new()];
                for t in &mut text {
                    let len = u16_at(b, at)? as usize;
                    let s = b
                        .get(at + 2..at + 2 + len)
                        .ok_or(HandshakeError("truncated name".into()))?;
                    let s = std::str::from_utf8(s).map_err(|_| {
                        HandshakeError("channel target or service is not UTF-8".into())
                    })?;
                    if s.is_empty() || s.len() > 1024 {
                        return err("channel target and service of 1 to 1024 bytes");
                    }
                    *t = s.to_string();
                    at += 2 + len;
                }
                let digest = u64_at(b, at)?;
                at += 8;
                let [target, service] = text;
                channels.push(ChannelDecl { target, service, digest });
            }
        }
        if at != b.len() {
            return err("bytes after the last service");
        }
        let (schemas, lanes) = (flags & SCHEMAS != 0, flags & LANES != 0);
        Ok(Hello { version, pid, services, schemas, channels, lanes })
    }
}

impl Answer {
    /// Serialized form.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Answer::Accept { version, id, lanes, layout } => {
                let mut out = ACCEPT.to_vec();
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&lanes.to_le_bytes());
                out.extend_from_slice(&id.to_le_bytes());
                layout.encode(&mut out);
                out
            }
            Answer::Refuse(why) => {
                let mut out = REFUSE.to_vec();
                let cut = why.len().min(MAX_MESSAGE - 8);
                let cut = (0..=cut).rev().find(|&i| why.is_char_boundary(i)).unwrap_or(0);
                out.extend_from_slice(&why.as_bytes()[..cut]);
                out
            }
        }
    }

    /// Parses an answer (any bytes).
    pub fn decode(b: &[u8]) -> Result<Answer, HandshakeError> {
        match b.get(..8) {
            Some(m) if m == ACCEPT => {
                let version = u16_at(b, 8)?;
                let lanes = u16_at(b, 10)?;
                if lanes > MAX_LANES {
                    return err("more engine workers than an application attaches to");
                }
                let id = u32_at(b, 12)?;
                let (layout, rest) = Layout::decode(b.get(16..).unwrap_or(&[]))
                    .map_err(|e| HandshakeError(e.to_string()))?;
                if !rest.is_empty() {
                    return err("bytes after the layout");
                }
                Ok(Answer::Accept { version, id, lanes, layout })
            }
            Some(m) if m == REFUSE => {
                Ok(Answer::Refuse(String::from_utf8_lossy(&b[8..]).into_owned()))
            }
            _ => err("not an attach answer"),
        }
    }
}

/// A sealed file holding `bytes` (a descriptor set), to attach to HELLO.
pub fn schema_file(bytes: &[u8]) -> io::Result<OwnedFd> {
    use std::io::Write as _;
    let fd = sys::memfd("protoplane-schema", 0)?;
    let mut f = std::fs::File::from(fd.try_clone()?);
    f.write_all(bytes)?;
    sys::seal_writes(&fd)?;
    Ok(fd)
}

/// Reads a descriptor set an application attached: a regular file (a
/// memfd) of at most [`MAX_SCHEMA`] bytes. Anything else (a pipe, a socket,
/// a device, which could block or never end) is refused without reading.
pub fn read_schema_file(fd: OwnedFd) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt as _;
    let f = std::fs::File::from(fd);
    let meta = f.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "the schema is not a regular file"));
    }
    let len = usize::try_from(meta.len()).unwrap_or(usize::MAX);
    if len > MAX_SCHEMA {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a schema of {len} bytes (at most {MAX_SCHEMA})"),
        ));
    }
    let mut buf = vec![0u8; len];
    // The file may shrink meanwhile (an application that did not seal
    // it): a short read is an error, never a hang.
    f.read_exact_at(&mut buf, 0)?;
    Ok(buf)
}

/// Sends one handshake message with descriptors.
pub fn send(sock: &impl AsFd, msg: &[u8], fds: &[&OwnedFd]) -> io::Result<()> {
    sys::send_with_fds(sock, msg, fds)
}

/// Receives one handshake message (a single datagram-sized read: both
/// sides send each message with one `sendmsg`, and the peer waits for the
/// answer before sending anything else).
pub fn recv(sock: &impl AsFd) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let (n, fds) = sys::recv_with_fds(sock, &mut buf)?;
    if n == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "attach socket closed"));
    }
    buf.truncate(n);
    Ok((buf, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Class;

    #[test]
    fn hello_round_trips_and_refuses_garbage() {
        let h = Hello {
            version: VERSION,
            pid: 42,
            services: vec![("a.B".into(), 7), ("grpc.testing.TestService".into(), u64::MAX)],
            schemas: false,
            channels: vec![],
            lanes: false,
        };
        let bytes = h.encode();
        assert_eq!(Hello::decode(&bytes), Ok(h.clone()));
        let with = Hello { schemas: true, ..h.clone() };
        assert_eq!(Hello::decode(&with.encode()), Ok(with.clone()));
        assert_eq!(with.digests(), vec![7, u64::MAX]);
        let lanes = Hello { lanes: true, ..h.clone() };
        assert_eq!(Hello::decode(&lanes.encode()), Ok(lanes));
        let mut other = with.encode();
        other[10] = 8;
        assert!(Hello::decode(&other).is_err(), "an unknown flag");
        for cut in 0..bytes.len() {
            assert!(Hello::decode(&bytes[..cut]).is_err(), "cut {cut}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(Hello::decode(&extra).is_err());
        let none = Hello {
            version: 1,
            pid: 1,
            services: vec![],
            schemas: false,
            channels: vec![],
            lanes: false,
        };
        assert!(Hello::decode(&none.encode()).is_err());
        // Only calling out: no service, two channels (a schema shared).
        let out = Hello {
            channels: vec![
                ChannelDecl {
                    target: "dns:///kv:50051".into(),
                    service: "kv.Kv".into(),
                    digest: 9,
                },
                ChannelDecl { target: "ipv4:10.0.0.1:1".into(), service: "a.B".into(), digest: 7 },
            ],
            schemas: true,
            ..none
        };
        let bytes = out.encode();
        assert_eq!(Hello::decode(&bytes), Ok(out.clone()));
        assert_eq!(out.digests(), vec![9, 7]);
        for cut in 0..bytes.len() {
            assert!(Hello::decode(&bytes[..cut]).is_err(), "cut {cut}");
        }
        let both = Hello { services: vec![("a.B".into(), 7)], ..out };
        assert_eq!(Hello::decode(&both.encode()), Ok(both.clone()));
        assert_eq!(both.digests(), vec![7, 9]);
    }

    #[test]
    fn schema_files_are_read_only_when_they_are_small_regular_files() {
        let f = schema_file(b"descriptor set").expect("memfd");
        assert_eq!(read_schema_file(f).expect("read"), b"descriptor set");
        // A pipe (which could block forever) is refused without a read.
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both were just created and are owned by nobody else.
        let (r, _w) = unsafe {
            use std::os::fd::FromRawFd;
            (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
        };
        assert!(read_schema_file(r).is_err());
        let big = sys::memfd("big", MAX_SCHEMA + 1).expect("memfd");
        let why = read_schema_file(big).expect_err("too large").to_string();
        assert!(why.contains("at most"), "{why}");
    }

    #[test]
    fn answers_round_trip() {
        let layout = Layout { ring_slots: 64, classes: vec![Class { size: 4096, count: 4 }] };
        let a = Answer::Accept { version: VERSION, id: 9, lanes: 2, layout };
        assert_eq!(Answer::decode(&a.encode()), Ok(a.clone()));
        let mut many = a.encode();
        many[10..12].copy_from_slice(&(MAX_LANES + 1).to_le_bytes());
        assert!(Answer::decode(&many).is_err(), "more lanes than an application opens");
        let r = Answer::Refuse("no schema for x.Y".into());
        assert_eq!(Answer::decode(&r.encode()), Ok(r));
        assert!(Answer::decode(b"PPATT-OK").is_err());
        assert!(Answer::decode(b"hello").is_err());
    }
}
