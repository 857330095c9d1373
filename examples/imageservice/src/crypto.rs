//! The example's keys, credentials and host-side kernels (what the
//! `cpu-only` scheme and the client run with `ring` and `flate2`), and its
//! deterministic test images.
//!
//! Keys are derived from the user name (SHA-256 of a label and the name):
//! a stand-in for keys provisioned out of band, so that the client and the
//! server of this example agree without a key-exchange step. Each user has
//! one key per direction, so the client's nonces and the server's can
//! never collide under one key.

use std::io::{Read, Write};

use ring::aead;

/// AES-256-GCM nonce length.
pub const NONCE_LEN: usize = 12;
/// AES-256-GCM tag length.
pub const TAG_LEN: usize = 16;

/// A user the server knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct User {
    /// The name sent in `CompressRequest.user`.
    pub name: &'static str,
    /// The token sent in `CompressRequest.token`.
    pub token: &'static str,
    /// Whether the user may call `Compress` (authenticated users without
    /// the right are refused with PERMISSION_DENIED).
    pub may_compress: bool,
}

/// The example's users: two that may compress, one that may not.
pub const USERS: &[User] = &[
    User { name: "alice", token: "alice-token-7f3a", may_compress: true },
    User { name: "bob", token: "bob-token-19c2", may_compress: true },
    User { name: "guest", token: "guest-token-0000", may_compress: false },
];

/// The user named `name`.
pub fn user(name: &str) -> Option<&'static User> {
    USERS.iter().find(|u| u.name == name)
}

/// Compares two byte strings in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn derive(label: &str, user: &str) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(b"protoplane-imageservice/");
    ctx.update(label.as_bytes());
    ctx.update(b"/");
    ctx.update(user.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(ctx.finish().as_ref());
    key
}

/// The key `user` encrypts images for the server with.
pub fn request_key(user: &str) -> [u8; 32] {
    derive("request", user)
}

/// The key the server encrypts `user`'s results with.
pub fn reply_key(user: &str) -> [u8; 32] {
    derive("reply", user)
}

/// Why a host-side kernel failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CryptoError {
    /// The nonce is not 12 bytes.
    BadNonce(usize),
    /// The ciphertext does not authenticate (tampered, or wrong key or nonce).
    AuthFailed,
    /// The deflate stream does not decode.
    Corrupt(String),
}

impl std::fmt::Display for CryptoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CryptoError::BadNonce(n) => write!(f, "nonce of {n} bytes, need {NONCE_LEN}"),
            CryptoError::AuthFailed => f.write_str("ciphertext does not authenticate"),
            CryptoError::Corrupt(e) => write!(f, "corrupt deflate stream: {e}"),
        }
    }
}

impl std::error::Error for CryptoError {}

fn key_of(key: &[u8; 32]) -> aead::LessSafeKey {
    // A 32-byte key is always a valid AES-256 key.
    match aead::UnboundKey::new(&aead::AES_256_GCM, key) {
        Ok(k) => aead::LessSafeKey::new(k),
        Err(_) => unreachable!("AES-256-GCM takes 32-byte keys"),
    }
}

fn nonce_of(nonce: &[u8]) -> Result<aead::Nonce, CryptoError> {
    aead::Nonce::try_assume_unique_for_key(nonce).map_err(|_| CryptoError::BadNonce(nonce.len()))
}

/// AES-256-GCM seal: `plaintext` → ciphertext ‖ tag (no associated data).
pub fn seal(key: &[u8; 32], nonce: &[u8], plaintext: &[u8]) -> Result<Vec<u8>, CryptoError> {
    let mut buf = Vec::with_capacity(plaintext.len() + TAG_LEN);
    buf.extend_from_slice(plaintext);
    key_of(key)
        .seal_in_place_append_tag(nonce_of(nonce)?, aead::Aad::empty(), &mut buf)
        .map_err(|_| CryptoError::AuthFailed)?;
    Ok(buf)
}

/// AES-256-GCM open: ciphertext ‖ tag → plaintext.
pub fn open(key: &[u8; 32], nonce: &[u8], sealed: &[u8]) -> Result<Vec<u8>, CryptoError> {
    let nonce = nonce_of(nonce)?;
    let mut buf = sealed.to_vec();
    let n = key_of(key)
        .open_in_place(nonce, aead::Aad::empty(), &mut buf)
        .map_err(|_| CryptoError::AuthFailed)?
        .len();
    buf.truncate(n);
    Ok(buf)
}

/// Raw deflate (RFC 1951) at `level` (0..=9), as the `deflate.compress`
/// kernel produces it.
pub fn deflate(data: &[u8], level: u32) -> Vec<u8> {
    let mut enc = flate2::write::DeflateEncoder::new(
        Vec::with_capacity(data.len() / 2 + 64),
        flate2::Compression::new(level.min(9)),
    );
    // Writing to a Vec cannot fail.
    let _ = enc.write_all(data);
    enc.finish().unwrap_or_default()
}

/// Inflates a raw deflate stream, refusing output past `limit` bytes.
pub fn inflate(data: &[u8], limit: usize) -> Result<Vec<u8>, CryptoError> {
    let mut out = Vec::new();
    flate2::read::DeflateDecoder::new(data)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| CryptoError::Corrupt(e.to_string()))?;
    if out.len() > limit {
        return Err(CryptoError::Corrupt(format!("inflates past {limit} bytes")));
    }
    Ok(out)
}

/// A deterministic, compressible test image of exactly `size` bytes: an
/// RGB raster (gradients with a little pseudo-random noise) behind a
/// binary PPM header, like a photograph's smooth regions. `seed` varies
/// the noise.
pub fn test_image(size: usize, seed: u64) -> Vec<u8> {
    let pixels = size / 3;
    let width = ((pixels as f64).sqrt() as usize).max(1);
    let height = pixels / width;
    let mut img = format!("P6\n{width} {height}\n255\n").into_bytes();
    img.truncate(size);
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut i = 0usize;
    while img.len() < size {
        // xorshift64: the noise.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let (x, y) = (i % width, i / width);
        // Sparse noise (one pixel in 16) over quantized gradients and
        // tiles: compresses a few times over, like a graphic.
        let noise = u8::from(state & 0xF == 0) * ((state >> 8) as u8 & 0x7);
        let px = [
            ((x * 255 / width) as u8 & 0xF8) ^ noise,
            (y * 255 / height.max(1)) as u8 & 0xF8,
            (((x / 32 + y / 32) % 7) as u8).wrapping_mul(37),
        ];
        let take = (size - img.len()).min(3);
        img.extend_from_slice(&px[..take]);
        i += 1;
    }
    img
}

/// Parses a size: `65536`, `64k`, `64KiB`, `1m`, `1MiB`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix("ib").or_else(|| t.strip_suffix('b')).unwrap_or(&t);
    let (num, mul) = match t.char_indices().last() {
        Some((i, 'k')) => (&t[..i], 1usize << 10),
        Some((i, 'm')) => (&t[..i], 1usize << 20),
        _ => (t, 1),
    };
    num.trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("bad size {s:?} (e.g. 65536, 64k, 1m)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_deflate_round_trip() {
        let img = test_image(64 << 10, 1);
        assert_eq!(img.len(), 64 << 10);
        assert_eq!(img, test_image(64 << 10, 1), "deterministic");
        let packed = deflate(&img, 6);
        assert!(packed.len() < img.len() / 2, "compressible: {} bytes", packed.len());
        assert!(packed.len() > img.len() / 50, "not trivial: {} bytes", packed.len());
        let k = request_key("alice");
        let sealed = seal(&k, &[3; 12], &packed).expect("seal");
        let opened = open(&k, &[3; 12], &sealed).expect("open");
        assert_eq!(inflate(&opened, img.len()).expect("inflate"), img);
        let mut bad = sealed.clone();
        bad[5] ^= 1;
        assert_eq!(open(&k, &[3; 12], &bad), Err(CryptoError::AuthFailed));
        assert_eq!(open(&reply_key("alice"), &[3; 12], &sealed), Err(CryptoError::AuthFailed));
        assert_eq!(open(&k, &[3; 5], &sealed), Err(CryptoError::BadNonce(5)));
        assert!(inflate(&packed, 100).is_err(), "limit enforced");
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert!(parse_size("x").is_err());
        assert!(parse_size("0").is_err());
        assert_eq!(test_image(5, 0).len(), 5);
    }
}
