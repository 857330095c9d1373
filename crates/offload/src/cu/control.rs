//! The compute units' control messages as bytes: what an application in
//! another process sends the engine to program a slot, set a key or submit
//! a task (split mode carries them over the shared-memory rings).
//!
//! ```text
//! op      byte 0   then (all integers little-endian)
//! submit  1        input offset u32, input len u32, max_output u32
//!                  (u32::MAX: the engine's limit), params u8, then per
//!                  param: name len u8, name (UTF-8), kind u8 and value:
//!                  0 = u64 (8 bytes), 1 = inline bytes (len u32, bytes),
//!                  2 = device range (offset u32, len u32)
//! program 2        kernel name (UTF-8, the rest of the message)
//! type    3        —
//! down    4        —   (the slot's unit becomes unavailable)
//! up      5        —   (and available again)
//! key     6        key id u64, key bytes (the rest)
//! place   7        a placement entry (UTF-8, the rest): `pkg.Msg.field=device`
//!                  or `=host` moves the field for the next request (RPCAcc's
//!                  automatic field updating); `pkg.Msg.field` alone asks
//!                  where it is
//! ```
//!
//! The bytes come from another process: [`decode`] checks every length
//! against what is left, refuses trailing bytes, non-UTF-8 names and more
//! than [`MAX_PARAMS`] parameters, and never allocates more than the
//! message's own size. What it accepts is still only a request: the
//! engine checks the ranges and parameters again at submit
//! ([`super::ComputeUnits::submit_task`]).

use std::fmt;

use super::{DeviceRef, ParamValue, TaskDescriptor};

/// The most parameters a submit may carry on the wire (the engine's own
/// limit, [`super::CuConfig::max_params`], is usually lower).
pub const MAX_PARAMS: usize = 64;
/// The longest kernel or parameter name.
pub const MAX_NAME: usize = 255;

/// One control message for a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Queue a task.
    Submit(TaskDescriptor),
    /// Load a registered kernel by name.
    Program(String),
    /// Ask which kernel the slot holds.
    GetType,
    /// Make the slot's unit unavailable (`false`) or available again.
    SetAvailable(bool),
    /// Install an AEAD key under an id (the slot is ignored: keys are the
    /// engine's).
    SetKey {
        /// The id descriptors name it by.
        id: u64,
        /// The key bytes.
        key: Vec<u8>,
    },
    /// Move a request field between host and device for the next request
    /// (`pkg.Msg.field=device` / `=host`), or ask where it is
    /// (`pkg.Msg.field`). The slot is ignored: placement is per schema.
    Place(String),
}

/// Why bytes are not a control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlError(pub String);

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad compute-unit control message: {}", self.0)
    }
}

impl std::error::Error for ControlError {}

const SUBMIT: u8 = 1;
const PROGRAM: u8 = 2;
const GET_TYPE: u8 = 3;
const DOWN: u8 = 4;
const UP: u8 = 5;
const SET_KEY: u8 = 6;
const PLACE: u8 = 7;
/// The longest placement entry.
pub const MAX_PLACE: usize = 1024;

const K_U64: u8 = 0;
const K_BYTES: u8 = 1;
const K_DEVICE: u8 = 2;

/// The message as bytes. Names longer than [`MAX_NAME`] and more than
/// [`MAX_PARAMS`] parameters are cut there (the engine would refuse them
/// anyway); an inline value of 4 GiB or more is cut to fit its length.
pub fn encode(c: &Control) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    match c {
        Control::Submit(d) => {
            out.push(SUBMIT);
            out.extend_from_slice(&d.input.offset.to_le_bytes());
            out.extend_from_slice(&d.input.len.to_le_bytes());
            out.extend_from_slice(&d.max_output.unwrap_or(u32::MAX).to_le_bytes());
            let params = &d.params[..d.params.len().min(MAX_PARAMS)];
            out.push(params.len() as u8);
            for (name, value) in params {
                let name = &name.as_bytes()[..name.len().min(MAX_NAME)];
                out.push(name.len() as u8);
                out.extend_from_slice(name);
                match value {
                    ParamValue::U64(v) => {
                        out.push(K_U64);
                        out.extend_from_slice(&v.to_le_bytes());
                    }
                    ParamValue::Bytes(b) => {
                        let b = &b[..b.len().min(u32::MAX as usize)];
                        out.push(K_BYTES);
                        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                        out.extend_from_slice(b);
                    }
                    ParamValue::Device(r) => {
                        out.push(K_DEVICE);
                        out.extend_from_slice(&r.offset.to_le_bytes());
                        out.extend_from_slice(&r.len.to_le_bytes());
                    }
                }
            }
        }
        Control::Program(name) => {
            out.push(PROGRAM);
            out.extend_from_slice(&name.as_bytes()[..name.len().min(MAX_NAME)]);
        }
        Control::GetType => out.push(GET_TYPE),
        Control::SetAvailable(false) => out.push(DOWN),
        Control::SetAvailable(true) => out.push(UP),
        Control::SetKey { id, key } => {
            out.push(SET_KEY);
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(key);
        }
        Control::Place(spec) => {
            out.push(PLACE);
            out.extend_from_slice(&spec.as_bytes()[..spec.len().min(MAX_PLACE)]);
        }
    }
    out
}

/// A cursor over untrusted bytes: every read checks what is left.
struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ControlError> {
        if self.b.len() < n {
            return Err(ControlError(format!("{what} cut short")));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &str) -> Result<u8, ControlError> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32, ControlError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64, ControlError> {
        let lo = self.u32(what)? as u64;
        let hi = self.u32(what)? as u64;
        Ok(lo | hi << 32)
    }

    fn name(&mut self, b: &'a [u8], what: &str) -> Result<String, ControlError> {
        if b.len() > MAX_NAME {
            return Err(ControlError(format!("{what} longer than {MAX_NAME} bytes")));
        }
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| ControlError(format!("{what} is not UTF-8")))
    }
}

/// Reads a control message (any bytes: a precise error, never a panic).
pub fn decode(b: &[u8]) -> Result<Control, ControlError> {
    let mut r = Reader { b };
    let op = r.u8("op")?;
    let c = match op {
        SUBMIT => {
            let input = DeviceRef::new(r.u32("input")?, r.u32("input")?);
            let max_output = match r.u32("max_output")? {
                u32::MAX => None,
                n => Some(n),
            };
            let n = r.u8("parameter count")? as usize;
            if n > MAX_PARAMS {
                return Err(ControlError(format!("{n} parameters (at most {MAX_PARAMS})")));
            }
            let mut params = Vec::with_capacity(n);
            for _ in 0..n {
                let len = r.u8("parameter name")? as usize;
                let raw = r.take(len, "parameter name")?;
                let name = r.name(raw, "parameter name")?;
                let value = match r.u8("parameter kind")? {
                    K_U64 => ParamValue::U64(r.u64("integer parameter")?),
                    K_BYTES => {
                        let len = r.u32("bytes parameter")? as usize;
                        ParamValue::Bytes(r.take(len, "bytes parameter")?.to_vec())
                    }
                    K_DEVICE => {
                        ParamValue::Device(DeviceRef::new(r.u32("range")?, r.u32("range")?))
                    }
                    k => return Err(ControlError(format!("parameter kind {k}"))),
                };
                params.push((name, value));
            }
            Control::Submit(TaskDescriptor { input, params, max_output })
        }
        PROGRAM => {
            let rest = r.take(r.b.len(), "kernel name")?;
            if rest.is_empty() {
                return Err(ControlError("empty kernel name".into()));
            }
            Control::Program(r.name(rest, "kernel name")?)
        }
        GET_TYPE => Control::GetType,
        DOWN => Control::SetAvailable(false),
        UP => Control::SetAvailable(true),
        SET_KEY => {
            let id = r.u64("key id")?;
            Control::SetKey { id, key: r.take(r.b.len(), "key")?.to_vec() }
        }
        PLACE => {
            let rest = r.take(r.b.len(), "placement")?;
            if rest.is_empty() || rest.len() > MAX_PLACE {
                return Err(ControlError(format!("a placement of {} bytes", rest.len())));
            }
            let spec = std::str::from_utf8(rest)
                .map_err(|_| ControlError("placement is not UTF-8".into()))?;
            Control::Place(spec.to_owned())
        }
        op => return Err(ControlError(format!("unknown op {op}"))),
    };
    if !r.b.is_empty() {
        return Err(ControlError(format!("{} trailing bytes", r.b.len())));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let task = TaskDescriptor::new(DeviceRef::new(64, 1000))
            .param_u64("key_id", 7)
            .param_bytes("nonce", &[1; 12])
            .param_ref("aad", DeviceRef::new(4096, 16))
            .max_output(1 << 20);
        for c in [
            Control::Submit(task),
            Control::Submit(TaskDescriptor::new(DeviceRef::new(0, 1))),
            Control::Program("deflate.compress".into()),
            Control::GetType,
            Control::SetAvailable(false),
            Control::SetAvailable(true),
            Control::SetKey { id: u64::MAX, key: vec![9; 32] },
            Control::Place("pkg.Image.data=host".into()),
            Control::Place("pkg.Image.data".into()),
        ] {
            assert_eq!(decode(&encode(&c)), Ok(c));
        }
    }

    #[test]
    fn bad_bytes_are_refused_precisely() {
        let good = encode(&Control::Submit(
            TaskDescriptor::new(DeviceRef::new(8, 8)).param_bytes("nonce", &[0; 12]),
        ));
        // Every prefix is cut short somewhere; none panics or is accepted.
        for n in 0..good.len() {
            assert!(decode(&good[..n]).is_err(), "prefix {n} accepted");
        }
        let mut long = good.clone();
        long.push(0);
        assert_eq!(decode(&long), Err(ControlError("1 trailing bytes".into())));
        // A bytes parameter claiming 4 GiB allocates nothing.
        let mut huge = good[..good.len() - 16].to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge).expect_err("cut short").0.contains("cut short"));
        assert_eq!(decode(&[9]), Err(ControlError("unknown op 9".into())));
        assert!(decode(&[PROGRAM, 0xff, 0xfe]).expect_err("utf-8").0.contains("UTF-8"));
        assert!(decode(&[PROGRAM]).is_err());
        assert!(decode(&[PLACE]).is_err());
        assert!(decode(&[PLACE, 0xff]).expect_err("utf-8").0.contains("UTF-8"));
        let mut many = encode(&Control::Submit(TaskDescriptor::new(DeviceRef::new(0, 1))));
        let at = many.len() - 1;
        many[at] = 200;
        assert!(decode(&many).expect_err("too many").0.contains("200 parameters"));
    }
}
