//! The `grpc-timeout` header: `TimeoutValue TimeoutUnit`, the value a
//! positive integer of at most 8 ASCII digits, the unit one of `H` (hours),
//! `M` (minutes), `S` (seconds), `m` (milliseconds), `u` (microseconds),
//! `n` (nanoseconds).

use std::time::Duration;

/// Largest value the header can carry (8 digits).
const MAX_VALUE: u64 = 99_999_999;

/// Units from finest to coarsest: (suffix, nanoseconds).
const UNITS: [(u8, u64); 6] = [
    (b'n', 1),
    (b'u', 1_000),
    (b'm', 1_000_000),
    (b'S', 1_000_000_000),
    (b'M', 60 * 1_000_000_000),
    (b'H', 3600 * 1_000_000_000),
];

/// Parses a `grpc-timeout` value; `None` if it is malformed (empty, more
/// than 8 digits, a non-digit, a unit not in the list).
pub fn parse(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
    let per = UNITS.iter().find(|(u, _)| *u == unit)?.1;
    // 99_999_999 hours in ns overflows u64: saturate to Duration's range.
    Some(match n.checked_mul(per) {
        Some(ns) => Duration::from_nanos(ns),
        None => Duration::from_secs(n.saturating_mul(per / 1_000_000_000)),
    })
}

/// Formats `d` for the header: the finest unit whose value fits 8 digits,
/// rounded up so that the peer never sees a shorter deadline than ours.
pub fn format(d: Duration) -> String {
    let ns = d.as_nanos();
    for (unit, per) in UNITS {
        let v = ns.div_ceil(u128::from(per));
        if v <= u128::from(MAX_VALUE) {
            return format!("{}{}", v.max(1), unit as char);
        }
    }
    format!("{MAX_VALUE}H")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse(b"30S"), Some(Duration::from_secs(30)));
        assert_eq!(parse(b"100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse(b"5u"), Some(Duration::from_micros(5)));
        assert_eq!(parse(b"7n"), Some(Duration::from_nanos(7)));
        assert_eq!(parse(b"00000001S"), Some(Duration::from_secs(1)));
        assert_eq!(parse(b"99999999H"), Some(Duration::from_secs(99_999_999 * 3600)));
    }

    #[test]
    fn rejects_malformed_values() {
        for bad in
            [&b""[..], b"S", b"1", b"123456789S", b"1s", b"1x", b"-1S", b" 1S", b"1 S", b"1.5S"]
        {
            assert_eq!(parse(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn formats_the_finest_unit_that_fits_and_never_shortens() {
        assert_eq!(format(Duration::from_nanos(1)), "1n");
        assert_eq!(format(Duration::ZERO), "1n");
        assert_eq!(format(Duration::from_nanos(99_999_999)), "99999999n");
        assert_eq!(format(Duration::from_millis(100)), "100000u");
        assert_eq!(format(Duration::from_secs(1)), "1000000u");
        assert_eq!(format(Duration::from_secs(3600)), "3600000m");
        assert_eq!(format(Duration::from_nanos(100_000_001)), "100001u");
        for d in [
            Duration::from_nanos(123_456_789_123),
            Duration::from_secs(86_400 * 365),
            Duration::from_millis(1),
            Duration::MAX,
        ] {
            let text = format(d);
            let back = parse(text.as_bytes()).unwrap_or_default();
            assert!(text.len() <= 9, "{text}");
            assert!(back >= d.min(Duration::from_secs(99_999_999 * 3600)), "{d:?} -> {text}");
        }
    }
}
