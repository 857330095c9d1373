//! What can go wrong starting and configuring an engine, and why an
//! application's attach is refused: typed, so a caller can tell a bad
//! setting from a taken address from a region that does not fit.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Why an engine could not start, or a setting was refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid: an unknown key, a bad value, or keys
    /// that go together. The text names the key.
    Config(String),
    /// The schemas do not load, or two of them declare one service.
    Schema(String),
    /// A functional offload or a device placement that the schemas or the
    /// engine cannot honour.
    Offload(String),
    /// A file the configuration names cannot be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A listener cannot be bound.
    Listen {
        /// The address or socket path.
        at: String,
        /// Why.
        source: io::Error,
    },
    /// A Unix socket path is not ours to take: another process listens
    /// there, or the file is not a socket.
    SocketPath {
        /// The path.
        path: PathBuf,
        /// Why it is not taken.
        reason: &'static str,
    },
    /// The TLS settings are refused (certificate, key or client CA).
    Tls(String),
    /// The shared-memory region cannot be laid out or created.
    Region(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(s) | Error::Schema(s) | Error::Offload(s) | Error::Tls(s) => {
                f.write_str(s)
            }
            Error::Read { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Listen { at, source } => write!(f, "listen on {at}: {source}"),
            Error::SocketPath { path, reason } => write!(f, "{}: {reason}", path.display()),
            Error::Region(s) => write!(f, "region: {s}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Read { source, .. } | Error::Listen { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Why an application's HELLO is refused before any engine state is
/// looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The application speaks another version of the attach protocol.
    Version {
        /// The application's.
        theirs: u16,
        /// The engine's.
        ours: u16,
    },
    /// A service is listed twice.
    ListedTwice(String),
    /// `[attach.allow]` does not let this process serve the service.
    NotAllowed {
        /// The process's user id (`SO_PEERCRED`).
        uid: u32,
        /// Its group id.
        gid: u32,
        /// The service.
        service: String,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Version { theirs, ours } => {
                write!(f, "protocol version {theirs} (the engine speaks {ours})")
            }
            Refusal::ListedTwice(s) => write!(f, "service {s} listed twice"),
            Refusal::NotAllowed { uid, gid, service } => {
                write!(f, "uid {uid} gid {gid} may not serve {service} (attach.allow)")
            }
        }
    }
}

impl std::error::Error for Refusal {}
