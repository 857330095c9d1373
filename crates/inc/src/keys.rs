//! Keys, logical addresses and float quantization.
//!
//! A key is bytes (an integer key is its 8 big-endian bytes). The data
//! plane knows a key only by its 32-bit *logical address*, a hash every
//! agent computes the same way; the server agent resolves a logical
//! address back to its key and notices when two keys share one
//! (a collision: the later key is kept on the host for good).
//!
//! Logical address 0 is never used: an empty register cell has tag 0.

/// The bytes of an integer key.
pub fn int_key(k: i64) -> Vec<u8> {
    k.to_be_bytes().to_vec()
}

/// The logical address of `key`: FNV-1a (64-bit) folded to 32 bits, then
/// cut to `bits` bits (32 in production; tests use fewer to force
/// collisions). Never 0.
pub fn logical(key: &[u8], bits: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let folded = (h ^ (h >> 32)) as u32;
    let cut = if bits >= 32 { folded } else { folded & ((1u32 << bits) - 1) };
    cut.max(1)
}

/// Fixed-point quantization of floats into the data plane's integers
/// (NetFilter `Precision`: decimal digits kept after the point).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quantizer {
    scale: f64,
}

/// A float that has no fixed-point form at this precision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NotRepresentable(pub f64);

impl std::fmt::Display for NotRepresentable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} has no 64-bit fixed-point form at this precision", self.0)
    }
}

impl std::error::Error for NotRepresentable {}

impl Quantizer {
    /// Keeps `digits` decimal digits (at most 9).
    pub fn new(digits: u32) -> Quantizer {
        Quantizer { scale: 10f64.powi(digits.min(9) as i32) }
    }

    /// `round(x · 10^digits)`.
    pub fn quantize(&self, x: f64) -> Result<i64, NotRepresentable> {
        let q = (x * self.scale).round();
        // i64::MAX as f64 rounds up to 2^63: the range is half-open.
        const LIMIT: f64 = 9_223_372_036_854_775_808.0;
        if !q.is_finite() || !(-LIMIT..LIMIT).contains(&q) {
            return Err(NotRepresentable(x));
        }
        Ok(q as i64)
    }

    /// The float a fixed-point sum stands for.
    pub fn dequantize(&self, q: i64) -> f64 {
        q as f64 / self.scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logical_addresses_are_stable_and_never_zero() {
        assert_eq!(logical(b"", 32), 0x4fd0_bfc1);
        assert_eq!(logical(b"hello", 32), 0x249a_654d);
        assert_eq!(logical(b"hello", 32), logical(b"hello", 32));
        assert_ne!(logical(b"hello", 32), logical(b"hellp", 32));
        for i in 0..10_000i64 {
            let l = logical(&int_key(i), 4);
            assert!((1..16).contains(&l));
        }
    }

    #[test]
    fn quantization_rounds_and_refuses_what_does_not_fit() {
        let q = Quantizer::new(3);
        assert_eq!(q.quantize(1.2345), Ok(1235));
        assert_eq!(q.quantize(-0.0004), Ok(0));
        assert_eq!(q.dequantize(1235), 1.235);
        assert!(q.quantize(f64::NAN).is_err());
        assert!(q.quantize(1e300).is_err());
    }
}
