//! The built-in kernels and the engine's key table.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write as _;
use std::sync::{Arc, PoisonError, RwLock};

use flate2::{Compression, Decompress, FlushDecompress, Status};
use ring::aead;

use super::kernel::{Kernel, KernelError, Output, ParamKind, ParamSpec, Params};

/// Bytes in an AEAD key (both AES-256-GCM and ChaCha20-Poly1305).
pub const KEY_LEN: usize = 32;
/// Bytes in an AEAD nonce.
pub const NONCE_LEN: usize = aead::NONCE_LEN;
/// Bytes in an AEAD tag, appended to the ciphertext.
pub const TAG_LEN: usize = 16;

/// Why a key could not be installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// Keys are [`KEY_LEN`] bytes.
    BadLength(usize),
    /// The table already holds its maximum number of keys.
    TableFull(usize),
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::BadLength(n) => write!(f, "a key is {KEY_LEN} bytes, not {n}"),
            KeyError::TableFull(max) => write!(f, "the key table holds at most {max} keys"),
        }
    }
}

impl std::error::Error for KeyError {}

/// The engine's key table: AEAD keys live in the engine, and descriptors
/// name them by id, so key bytes never travel in a descriptor. Bounded in
/// size; its `Debug` shows ids only.
pub struct KeyTable {
    keys: RwLock<BTreeMap<u64, [u8; KEY_LEN]>>,
    max_keys: usize,
}

impl fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("KeyTable")
            .field("ids", &keys.keys().collect::<Vec<_>>())
            .field("max_keys", &self.max_keys)
            .finish()
    }
}

impl KeyTable {
    /// An empty table holding at most `max_keys` keys.
    pub fn new(max_keys: usize) -> Self {
        KeyTable { keys: RwLock::new(BTreeMap::new()), max_keys }
    }

    /// Installs (or replaces) the key `id`.
    pub fn set(&self, id: u64, key: &[u8]) -> Result<(), KeyError> {
        let key: [u8; KEY_LEN] = key.try_into().map_err(|_| KeyError::BadLength(key.len()))?;
        let mut keys = self.keys.write().unwrap_or_else(PoisonError::into_inner);
        if !keys.contains_key(&id) && keys.len() >= self.max_keys {
            return Err(KeyError::TableFull(self.max_keys));
        }
        keys.insert(id, key);
        Ok(())
    }

    /// Removes the key `id`; whether it was there.
    pub fn remove(&self, id: u64) -> bool {
        self.keys.write().unwrap_or_else(PoisonError::into_inner).remove(&id).is_some()
    }

    fn aead_key(
        &self,
        id: u64,
        alg: &'static aead::Algorithm,
    ) -> Result<aead::LessSafeKey, KernelError> {
        let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner);
        let bytes = keys.get(&id).ok_or(KernelError::UnknownKey(id))?;
        let unbound = aead::UnboundKey::new(alg, bytes)
            .map_err(|_| KernelError::Failed("key rejected by the cipher".to_owned()))?;
        Ok(aead::LessSafeKey::new(unbound))
    }
}

/// The built-in kernels, sharing `keys`.
pub(crate) fn builtins(keys: &Arc<KeyTable>) -> Vec<Arc<dyn Kernel>> {
    vec![
        Arc::new(DeflateCompress),
        Arc::new(DeflateDecompress),
        Arc::new(Aead::new(AeadAlg::Aes256Gcm, Direction::Seal, keys)),
        Arc::new(Aead::new(AeadAlg::Aes256Gcm, Direction::Open, keys)),
        Arc::new(Aead::new(AeadAlg::ChaCha20Poly1305, Direction::Seal, keys)),
        Arc::new(Aead::new(AeadAlg::ChaCha20Poly1305, Direction::Open, keys)),
        Arc::new(Crc32),
    ]
}

/// `deflate.compress`: raw deflate (RFC 1951, no zlib or gzip framing).
/// Optional `level` (0..=9, default 6).
#[derive(Debug)]
struct DeflateCompress;

const COMPRESS_PARAMS: &[ParamSpec] = &[ParamSpec::optional("level", ParamKind::U64)];

impl Kernel for DeflateCompress {
    fn name(&self) -> &str {
        "deflate.compress"
    }

    fn params(&self) -> &[ParamSpec] {
        COMPRESS_PARAMS
    }

    fn run(&self, input: &[u8], params: &Params, out: &mut Output) -> Result<(), KernelError> {
        let level = params.u64("level").unwrap_or(6);
        let level = u32::try_from(level)
            .ok()
            .filter(|l| *l <= 9)
            .ok_or_else(|| KernelError::bad_param("level", format!("{level} is not in 0..=9")))?;
        let mut enc = flate2::write::DeflateEncoder::new(&mut *out, Compression::new(level));
        let written = enc.write_all(input).and_then(|()| enc.try_finish());
        drop(enc);
        match written {
            Ok(()) => Ok(()),
            Err(_) if out.overflowed() => Err(KernelError::OutputTooLarge {
                limit: u32::try_from(out.limit()).unwrap_or(u32::MAX),
            }),
            Err(e) => Err(KernelError::Failed(format!("deflate: {e}"))),
        }
    }
}

/// `deflate.decompress`: raw deflate (RFC 1951). The stream must end
/// exactly at the end of the input; output is bounded by the task's limit
/// (a bomb fails with [`KernelError::OutputTooLarge`] after at most one
/// scratch buffer of work past the limit).
#[derive(Debug)]
struct DeflateDecompress;

impl Kernel for DeflateDecompress {
    fn name(&self) -> &str {
        "deflate.decompress"
    }

    fn run(&self, input: &[u8], _params: &Params, out: &mut Output) -> Result<(), KernelError> {
        let mut dec = Decompress::new(false);
        let mut scratch = vec![0u8; 32 * 1024];
        let mut pos = 0usize;
        loop {
            let (in0, out0) = (dec.total_in(), dec.total_out());
            let rest = input.get(pos..).unwrap_or(&[]);
            let status = dec
                .decompress(rest, &mut scratch, FlushDecompress::None)
                .map_err(|e| KernelError::Corrupt(format!("deflate: {e}")))?;
            let consumed = usize::try_from(dec.total_in() - in0).unwrap_or(usize::MAX);
            let produced = usize::try_from(dec.total_out() - out0).unwrap_or(usize::MAX);
            pos = pos.saturating_add(consumed);
            out.extend_from_slice(scratch.get(..produced).unwrap_or(&[]))?;
            match status {
                Status::StreamEnd => break,
                Status::Ok | Status::BufError if consumed == 0 && produced == 0 => {
                    return Err(KernelError::Corrupt(
                        "deflate stream truncated (no end block)".to_owned(),
                    ));
                }
                Status::Ok | Status::BufError => {}
            }
        }
        if pos != input.len() {
            return Err(KernelError::Corrupt(format!(
                "{} bytes after the end of the deflate stream",
                input.len().saturating_sub(pos)
            )));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum AeadAlg {
    Aes256Gcm,
    ChaCha20Poly1305,
}

#[derive(Debug, Clone, Copy)]
enum Direction {
    Seal,
    Open,
}

/// `aes256gcm.seal/open`, `chacha20poly1305.seal/open`: parameters
/// `key_id` (engine key table), `nonce` (12 bytes), optional `aad`.
/// Seal outputs ciphertext followed by the 16-byte tag; open takes that and
/// outputs the plaintext, or fails with [`KernelError::AuthFailed`].
#[derive(Debug)]
struct Aead {
    name: &'static str,
    alg: AeadAlg,
    dir: Direction,
    keys: Arc<KeyTable>,
}

const AEAD_PARAMS: &[ParamSpec] = &[
    ParamSpec::required("key_id", ParamKind::U64),
    ParamSpec::required("nonce", ParamKind::Bytes),
    ParamSpec::optional("aad", ParamKind::Bytes),
];

impl Aead {
    fn new(alg: AeadAlg, dir: Direction, keys: &Arc<KeyTable>) -> Self {
        let name = match (alg, dir) {
            (AeadAlg::Aes256Gcm, Direction::Seal) => "aes256gcm.seal",
            (AeadAlg::Aes256Gcm, Direction::Open) => "aes256gcm.open",
            (AeadAlg::ChaCha20Poly1305, Direction::Seal) => "chacha20poly1305.seal",
            (AeadAlg::ChaCha20Poly1305, Direction::Open) => "chacha20poly1305.open",
        };
        Aead { name, alg, dir, keys: Arc::clone(keys) }
    }
}

impl Kernel for Aead {
    fn name(&self) -> &str {
        self.name
    }

    fn params(&self) -> &[ParamSpec] {
        AEAD_PARAMS
    }

    fn run(&self, input: &[u8], params: &Params, out: &mut Output) -> Result<(), KernelError> {
        let key_id = params.require_u64("key_id")?;
        let nonce = params.require_bytes("nonce")?;
        let nonce = aead::Nonce::try_assume_unique_for_key(nonce).map_err(|_| {
            KernelError::bad_param(
                "nonce",
                format!("a nonce is {NONCE_LEN} bytes, not {}", nonce.len()),
            )
        })?;
        let aad = aead::Aad::from(params.bytes("aad").unwrap_or(&[]));
        let alg = match self.alg {
            AeadAlg::Aes256Gcm => &aead::AES_256_GCM,
            AeadAlg::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
        };
        let key = self.keys.aead_key(key_id, alg)?;
        match self.dir {
            Direction::Seal => {
                out.reserve(input.len().saturating_add(TAG_LEN))?;
                let start = out.len();
                out.extend_from_slice(input)?;
                let body = out.as_mut_slice().get_mut(start..).unwrap_or_default();
                let tag = key
                    .seal_in_place_separate_tag(nonce, aad, body)
                    .map_err(|_| KernelError::Failed("input too long to seal".to_owned()))?;
                out.extend_from_slice(tag.as_ref())
            }
            Direction::Open => {
                if input.len() < TAG_LEN {
                    return Err(KernelError::AuthFailed);
                }
                out.reserve(input.len() - TAG_LEN)?;
                let mut buf = input.to_vec();
                let plain =
                    key.open_in_place(nonce, aad, &mut buf).map_err(|_| KernelError::AuthFailed)?;
                out.extend_from_slice(plain)
            }
        }
    }
}

/// `crc32`: CRC-32/ISO-HDLC (the zlib/Ethernet CRC) of the input, written
/// as 4 bytes little-endian.
#[derive(Debug)]
struct Crc32;

impl Kernel for Crc32 {
    fn name(&self) -> &str {
        "crc32"
    }

    fn run(&self, input: &[u8], _params: &Params, out: &mut Output) -> Result<(), KernelError> {
        out.extend_from_slice(&crc32fast::hash(input).to_le_bytes())
    }
}
