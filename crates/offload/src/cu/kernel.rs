//! What a kernel is: the trait, its parameters, its bounded output and its
//! errors.

use std::fmt;
use std::io;

use super::region::DeviceRef;

/// A function a compute unit can be programmed with (RPCAcc's bitstream
/// for a unit, here Rust code).
///
/// The engine calls [`Kernel::run`] on the slot's worker thread with the
/// task's input copied out of the device region, the task's parameters
/// (device-resident ones already fetched), and an [`Output`] that refuses
/// to grow beyond the task's output limit. A kernel that panics fails its
/// task with [`KernelError::Panicked`]; the unit keeps working.
pub trait Kernel: Send + Sync + fmt::Debug {
    /// The name the kernel is registered and programmed under.
    fn name(&self) -> &str;

    /// The parameters the kernel accepts. A descriptor naming any other
    /// parameter, giving one of the wrong kind, or missing a required one
    /// is refused at submit. The default accepts none.
    fn params(&self) -> &[ParamSpec] {
        &[]
    }

    /// Runs on `input`, appending the result to `out`.
    fn run(&self, input: &[u8], params: &Params, out: &mut Output) -> Result<(), KernelError>;
}

/// The kind of value a parameter holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// An unsigned integer ([`ParamValue::U64`]).
    U64,
    /// Bytes, inline ([`ParamValue::Bytes`]) or in the device region
    /// ([`ParamValue::Device`]).
    Bytes,
}

/// One parameter a kernel accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamSpec {
    /// Its name in descriptors.
    pub name: &'static str,
    /// Its kind.
    pub kind: ParamKind,
    /// Whether a descriptor must give it.
    pub required: bool,
}

impl ParamSpec {
    /// A parameter every descriptor must give.
    pub const fn required(name: &'static str, kind: ParamKind) -> Self {
        ParamSpec { name, kind, required: true }
    }

    /// A parameter a descriptor may give.
    pub const fn optional(name: &'static str, kind: ParamKind) -> Self {
        ParamSpec { name, kind, required: false }
    }
}

/// A parameter value as a task descriptor carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamValue {
    /// An integer (compression level, key id, ...).
    U64(u64),
    /// Bytes carried in the descriptor itself (a nonce); bounded by the
    /// engine's `max_inline_param` limit.
    Bytes(Vec<u8>),
    /// Bytes in the device region (associated data), fetched by the unit.
    Device(DeviceRef),
}

impl ParamValue {
    /// The kind this value satisfies.
    pub fn kind(&self) -> ParamKind {
        match self {
            ParamValue::U64(_) => ParamKind::U64,
            ParamValue::Bytes(_) | ParamValue::Device(_) => ParamKind::Bytes,
        }
    }
}

/// A kernel's parameters as it sees them: names to integers or bytes, with
/// device-resident bytes already fetched from the region.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params {
    entries: Vec<(String, Resolved)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Resolved {
    U64(u64),
    Bytes(Vec<u8>),
}

impl Params {
    /// No parameters.
    pub fn new() -> Self {
        Params::default()
    }

    /// Sets an integer parameter (replacing one of the same name).
    pub fn set_u64(&mut self, name: &str, value: u64) -> &mut Self {
        self.set(name, Resolved::U64(value))
    }

    /// Sets a bytes parameter (replacing one of the same name).
    pub fn set_bytes(&mut self, name: &str, value: Vec<u8>) -> &mut Self {
        self.set(name, Resolved::Bytes(value))
    }

    fn set(&mut self, name: &str, value: Resolved) -> &mut Self {
        match self.entries.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 = value,
            None => self.entries.push((name.to_owned(), value)),
        }
        self
    }

    fn get(&self, name: &str) -> Option<&Resolved> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// The integer parameter `name`, if given as an integer.
    pub fn u64(&self, name: &str) -> Option<u64> {
        match self.get(name) {
            Some(Resolved::U64(v)) => Some(*v),
            _ => None,
        }
    }

    /// The bytes parameter `name`, if given as bytes.
    pub fn bytes(&self, name: &str) -> Option<&[u8]> {
        match self.get(name) {
            Some(Resolved::Bytes(v)) => Some(v),
            _ => None,
        }
    }

    /// The integer parameter `name`, or [`KernelError::BadParam`].
    pub fn require_u64(&self, name: &str) -> Result<u64, KernelError> {
        self.u64(name).ok_or_else(|| KernelError::bad_param(name, "missing integer parameter"))
    }

    /// The bytes parameter `name`, or [`KernelError::BadParam`].
    pub fn require_bytes(&self, name: &str) -> Result<&[u8], KernelError> {
        self.bytes(name).ok_or_else(|| KernelError::bad_param(name, "missing bytes parameter"))
    }

    /// Parameter names, in the order given.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(n, _)| n.as_str())
    }

    /// Bytes held by bytes parameters (what the unit fetched and carried).
    pub fn byte_len(&self) -> usize {
        self.entries
            .iter()
            .map(|(_, v)| match v {
                Resolved::Bytes(b) => b.len(),
                Resolved::U64(_) => 0,
            })
            .sum()
    }
}

/// A kernel's output buffer, bounded by the task's output limit: every
/// append that would pass the limit fails with
/// [`KernelError::OutputTooLarge`] and leaves the buffer as it was, so no
/// kernel (built-in or user) can make a task use unbounded memory.
///
/// `Output` is also an [`io::Write`] (for encoders); a write past the limit
/// returns an error and [`Output::overflowed`] turns true.
#[derive(Debug, Clone)]
pub struct Output {
    buf: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl Output {
    /// An empty output refusing to grow past `limit` bytes.
    pub fn with_limit(limit: usize) -> Self {
        Output { buf: Vec::new(), limit, overflowed: false }
    }

    /// The limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Bytes that may still be appended.
    pub fn remaining(&self) -> usize {
        self.limit.saturating_sub(self.buf.len())
    }

    /// Whether an append was refused for passing the limit.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Checks that `n` more bytes fit, without writing them.
    pub fn reserve(&mut self, n: usize) -> Result<(), KernelError> {
        if n > self.remaining() {
            self.overflowed = true;
            return Err(self.too_large());
        }
        self.buf.reserve(n);
        Ok(())
    }

    /// Appends `data`, or fails (appending nothing) if it would pass the
    /// limit.
    pub fn extend_from_slice(&mut self, data: &[u8]) -> Result<(), KernelError> {
        self.reserve(data.len())?;
        self.buf.extend_from_slice(data);
        Ok(())
    }

    /// Appends one byte.
    pub fn push(&mut self, byte: u8) -> Result<(), KernelError> {
        self.extend_from_slice(&[byte])
    }

    /// The bytes written so far.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    /// The bytes written so far, mutable (for in-place transforms).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// Shortens the output to `len` bytes (no effect if already shorter).
    pub fn truncate(&mut self, len: usize) {
        self.buf.truncate(len);
    }

    /// The bytes written.
    pub fn into_vec(self) -> Vec<u8> {
        self.buf
    }

    fn too_large(&self) -> KernelError {
        KernelError::OutputTooLarge { limit: u32::try_from(self.limit).unwrap_or(u32::MAX) }
    }
}

impl io::Write for Output {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match self.extend_from_slice(data) {
            Ok(()) => Ok(data.len()),
            Err(e) => Err(io::Error::other(e)),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Why a task failed: the status of an error notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// The unit was made unavailable (it vanished) while the task was queued
    /// or running; its result, if any, was discarded.
    Unavailable {
        /// The slot.
        slot: usize,
    },
    /// An input or device-resident parameter range was no longer inside
    /// one live allocation when the unit fetched it (freed after submit).
    InputOutOfRange {
        /// `"input"` or the parameter's name.
        what: String,
        /// The range.
        range: DeviceRef,
    },
    /// The output would pass the task's limit (including decompression
    /// bombs).
    OutputTooLarge {
        /// The limit in bytes.
        limit: u32,
    },
    /// The device region had no room for the output.
    RegionFull {
        /// Output bytes that did not fit.
        needed: u32,
    },
    /// A parameter's value is unusable (wrong nonce length, level out of
    /// range, ...).
    BadParam {
        /// The parameter.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No key is installed under this id.
    UnknownKey(u64),
    /// Authenticated decryption failed: tampered ciphertext, wrong key,
    /// nonce or associated data.
    AuthFailed,
    /// The input is not what the kernel decodes (corrupt or truncated
    /// stream, trailing bytes, ...).
    Corrupt(String),
    /// The kernel panicked; the unit caught it and keeps working.
    Panicked(String),
    /// A user kernel's own failure.
    Failed(String),
}

impl KernelError {
    /// A [`KernelError::BadParam`].
    pub fn bad_param(name: &str, reason: impl Into<String>) -> Self {
        KernelError::BadParam { name: name.to_owned(), reason: reason.into() }
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelError::Unavailable { slot } => {
                write!(f, "compute unit {slot} became unavailable")
            }
            KernelError::InputOutOfRange { what, range } => {
                write!(f, "{what} range {range} is not inside one live device allocation")
            }
            KernelError::OutputTooLarge { limit } => {
                write!(f, "kernel output passes the limit of {limit} bytes")
            }
            KernelError::RegionFull { needed } => {
                write!(f, "no room in the device region for {needed} output bytes")
            }
            KernelError::BadParam { name, reason } => write!(f, "parameter {name:?}: {reason}"),
            KernelError::UnknownKey(id) => write!(f, "no key installed under id {id}"),
            KernelError::AuthFailed => write!(f, "authenticated decryption failed"),
            KernelError::Corrupt(why) => write!(f, "corrupt input: {why}"),
            KernelError::Panicked(msg) => write!(f, "kernel panicked: {msg}"),
            KernelError::Failed(msg) => write!(f, "kernel failed: {msg}"),
        }
    }
}

impl std::error::Error for KernelError {}
