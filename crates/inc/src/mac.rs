//! Packet authentication: SipHash-2-4 keyed per application.
//!
//! Every INC packet ends with an 8-byte MAC of everything before it,
//! keyed with its application's 128-bit key. The controller makes the key
//! at registration and hands it to the server agent, to each member that
//! joins and to the switches with the application's table entry; nobody
//! else has it. A switch drops (and counts) a packet whose MAC does not
//! verify before it touches a register, and re-seals what it changes
//! (flags, masks, sums, the hop count); the agents verify what they
//! receive. A forged packet therefore never reaches a register, and a
//! replayed one — a valid packet sent again — is caught by the sequence
//! checks the MAC makes trustworthy (the flow's incarnation and newest
//! sequence number on the data plane, the duplicate filter on the agents).
//!
//! SipHash is what a switch can afford: a handful of 64-bit additions,
//! rotations and XORs per 8 bytes, no tables (Aumasson and Bernstein,
//! "SipHash: a fast short-input PRF", INDOCRYPT 2012). It is a PRF, so as
//! a MAC it is as strong as its 64-bit output: a forger guesses with
//! probability 2^-64 per packet.

/// A 128-bit application key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Key(pub [u8; 16]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys are secrets: logs and debug output show that there is one.
        f.write_str("Key(..)")
    }
}

impl Key {
    /// The key as 32 hex digits (the controller protocol's form).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses [`Key::to_hex`].
    pub fn from_hex(s: &str) -> Option<Key> {
        if s.len() != 32 || !s.is_ascii() {
            return None;
        }
        let mut k = [0u8; 16];
        for (i, b) in k.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Key(k))
    }

    /// A key derived from a secret and a number: `SipHash(secret, n ‖ 0)
    /// ‖ SipHash(secret, n ‖ 1)`. The controller derives each
    /// application's key from a secret it reads from the operating system
    /// at start, so keys never repeat within its life and cannot be
    /// guessed from one another.
    pub fn derive(secret: &Key, n: u64) -> Key {
        let mut k = [0u8; 16];
        for half in 0..2u8 {
            let mut msg = n.to_le_bytes().to_vec();
            msg.push(half);
            let h = siphash24(secret, &msg);
            k[usize::from(half) * 8..usize::from(half) * 8 + 8].copy_from_slice(&h.to_le_bytes());
        }
        Key(k)
    }
}

#[inline]
fn round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

/// SipHash-2-4 of `data` under `key`.
pub fn siphash24(key: &Key, data: &[u8]) -> u64 {
    let k0 = u64::from_le_bytes(key.0[..8].try_into().unwrap_or_default());
    let k1 = u64::from_le_bytes(key.0[8..].try_into().unwrap_or_default());
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let m = u64::from_le_bytes(w.try_into().unwrap_or_default());
        v[3] ^= m;
        round(&mut v);
        round(&mut v);
        v[0] ^= m;
    }
    let mut last = [0u8; 8];
    let tail = words.remainder();
    last[..tail.len()].copy_from_slice(tail);
    last[7] = data.len() as u8;
    let m = u64::from_le_bytes(last);
    v[3] ^= m;
    round(&mut v);
    round(&mut v);
    v[0] ^= m;
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference_key() -> Key {
        let mut k = [0u8; 16];
        for (i, b) in k.iter_mut().enumerate() {
            *b = i as u8;
        }
        Key(k)
    }

    #[test]
    fn matches_the_papers_test_vectors() {
        // Appendix A of the SipHash paper: key 00..0f, message 00..0e.
        let msg: Vec<u8> = (0..15).collect();
        assert_eq!(siphash24(&reference_key(), &msg), 0xa129_ca61_49be_45e5);
        // The reference implementation's vectors.h, empty message.
        assert_eq!(siphash24(&reference_key(), &[]), 0x726f_db47_dd0e_0e31);
    }

    #[test]
    fn keys_round_trip_as_hex_and_derive_distinctly() {
        let k = reference_key();
        assert_eq!(Key::from_hex(&k.to_hex()), Some(k));
        assert_eq!(Key::from_hex("00"), None);
        assert_eq!(Key::from_hex(&"zz".repeat(16)), None);
        assert_ne!(Key::derive(&k, 1), Key::derive(&k, 2));
        assert_eq!(Key::derive(&k, 1), Key::derive(&k, 1));
        assert_eq!(format!("{k:?}"), "Key(..)");
    }
}
