//! Fault injection on one port: loss, duplication, reordering and delay,
//! all seeded. The `protoplane switch` process applies one injector per
//! egress port; the simulation applies one per link.

use crate::rng::Rng;

/// What to do to the datagrams of a port.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// Probability that a datagram is dropped.
    pub loss: f64,
    /// Probability that a datagram is sent twice (the copy a little later).
    pub dup: f64,
    /// Probability that a datagram is held back so later ones overtake it.
    pub reorder: f64,
    /// Delay added to every datagram, in microseconds.
    pub delay_us: u64,
    /// Extra delay, uniform in `0..=jitter_us`, of a reordered datagram or
    /// a duplicate's second copy.
    pub jitter_us: u64,
}

impl Faults {
    /// No faults.
    pub fn none() -> Faults {
        Faults::default()
    }

    /// Whether any fault is configured.
    pub fn any(&self) -> bool {
        self.loss > 0.0 || self.dup > 0.0 || self.reorder > 0.0 || self.delay_us > 0
    }
}

/// A port's injector.
#[derive(Clone, Debug)]
pub struct Injector {
    faults: Faults,
    rng: Rng,
}

impl Injector {
    /// An injector with its own seed.
    pub fn new(faults: Faults, seed: u64) -> Injector {
        Injector { faults, rng: Rng::new(seed) }
    }

    /// The faults.
    pub fn faults(&self) -> Faults {
        self.faults
    }

    /// When each copy of a datagram sent at `now` leaves the port: none
    /// (lost), one or two times.
    pub fn schedule(&mut self, now: u64) -> Vec<u64> {
        let f = self.faults;
        if self.rng.chance(f.loss) {
            return Vec::new();
        }
        let jitter = f.jitter_us.max(1);
        let mut at = now + f.delay_us;
        if self.rng.chance(f.reorder) {
            at += 1 + self.rng.below(jitter + 1);
        }
        let mut times = vec![at];
        if self.rng.chance(f.dup) {
            times.push(at + self.rng.below(jitter + 1));
        }
        times
    }
}
