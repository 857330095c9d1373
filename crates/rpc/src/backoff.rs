//! Connection backoff, as gRPC's connection-backoff specification
//! (`doc/connection-backoff.md` in grpc/grpc) gives it: after a failed
//! attempt the next waits `initial`, then each wait is `multiplier` times
//! the last, up to `max`, spread by ±`jitter` so that clients a restart
//! disconnected together do not come back together. An attempt may take
//! the longer of its wait and `min_connect_timeout`. A connection that
//! was established resets the sequence: the first attempt after it is
//! lost is made at once.

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

/// How a channel spaces its connection attempts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// The wait after the first failure (gRPC: 1 s).
    pub initial: Duration,
    /// Each wait is this many times the last (gRPC: 1.6).
    pub multiplier: f64,
    /// Each wait is spread uniformly by this share either way (gRPC: 0.2).
    pub jitter: f64,
    /// The longest wait (gRPC: 120 s).
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            multiplier: 1.6,
            jitter: 0.2,
            max: Duration::from_secs(120),
        }
    }
}

/// Where a channel is in its sequence of attempts.
#[derive(Debug)]
pub(crate) struct Attempts {
    config: Backoff,
    /// The wait the next failure starts (before jitter).
    current: Duration,
    /// No attempt before this (after a failure).
    not_before: Option<Instant>,
    /// Why the last attempt failed, while backing off.
    last_error: Option<String>,
    /// Failures since the last connection.
    failures: u32,
    seed: u64,
}

/// 64 random bits for jitter, query ids and rolls (std's randomly keyed
/// hasher, new keys each call; no cryptographic claim).
pub(crate) fn random_u64() -> u64 {
    std::collections::hash_map::RandomState::new().build_hasher().finish()
}

impl Attempts {
    pub(crate) fn new(config: Backoff) -> Attempts {
        let seed = random_u64() | 1;
        Attempts {
            config,
            current: config.initial,
            not_before: None,
            last_error: None,
            failures: 0,
            seed,
        }
    }

    /// A connection was established: the next loss is retried at once.
    pub(crate) fn connected(&mut self) {
        self.current = self.config.initial;
        self.not_before = None;
        self.last_error = None;
        self.failures = 0;
    }

    /// An attempt failed at `now` with `why`: the next waits one backoff
    /// step (jittered); returns when it may be made.
    pub(crate) fn failed(&mut self, now: Instant, why: String) -> Instant {
        let wait = self.jittered(self.current);
        let next = self.current.as_secs_f64() * self.config.multiplier.max(1.0);
        self.current = Duration::from_secs_f64(next.min(self.config.max.as_secs_f64()));
        self.failures = self.failures.saturating_add(1);
        self.last_error = Some(why);
        let at = now + wait;
        self.not_before = Some(at);
        at
    }

    /// While backing off at `now`: when the next attempt may be made, and
    /// why the last one failed.
    pub(crate) fn backing_off(&self, now: Instant) -> Option<(Instant, &str)> {
        let at = self.not_before.filter(|&at| at > now)?;
        Some((at, self.last_error.as_deref().unwrap_or("connection failed")))
    }

    /// Failures since the last connection.
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }

    /// `d` spread by ±jitter (xorshift: no cryptographic need).
    fn jittered(&mut self, d: Duration) -> Duration {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let unit = (self.seed >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
        let jitter = self.config.jitter.clamp(0.0, 1.0);
        let factor = 1.0 + jitter * (2.0 * unit - 1.0);
        Duration::from_secs_f64((d.as_secs_f64() * factor).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_by_the_multiplier_within_the_jitter_up_to_the_max() {
        let config = Backoff::default();
        let mut a = Attempts::new(config);
        let t0 = Instant::now();
        let mut expected = 1.0f64;
        for i in 0..20 {
            let at = a.failed(t0, format!("refused {i}"));
            let wait = at.duration_since(t0).as_secs_f64();
            assert!(
                wait >= expected * 0.8 - 1e-9 && wait <= expected * 1.2 + 1e-9,
                "failure {i}: waited {wait} s, expected {expected} ± 20%"
            );
            expected = (expected * 1.6).min(120.0);
        }
        assert_eq!(a.failures(), 20);
        let (_, why) = a.backing_off(t0).expect("backing off");
        assert_eq!(why, "refused 19");
        // Past the wait: no longer backing off.
        assert!(a.backing_off(t0 + Duration::from_secs(200)).is_none());
    }

    #[test]
    fn a_connection_resets_the_sequence() {
        let mut a = Attempts::new(Backoff::default());
        let t0 = Instant::now();
        for _ in 0..5 {
            a.failed(t0, "down".into());
        }
        a.connected();
        assert!(a.backing_off(t0).is_none(), "the next attempt is at once");
        let at = a.failed(t0, "down".into());
        assert!(at.duration_since(t0) <= Duration::from_millis(1200), "back to the first step");
    }

    #[test]
    fn jitter_spreads_clients_apart() {
        let t0 = Instant::now();
        let waits: Vec<Instant> =
            (0..8).map(|_| Attempts::new(Backoff::default()).failed(t0, "down".into())).collect();
        let distinct = waits.iter().collect::<std::collections::BTreeSet<_>>().len();
        assert!(distinct > 1, "eight clients, one wait: {waits:?}");
    }
}
