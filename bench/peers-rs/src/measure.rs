//! Timing: warm-up, one calibration, fixed-count samples, median.

use std::time::{Duration, Instant};

/// How long and how often to time each (job, op).
#[derive(Debug, Clone)]
pub struct Timing {
    /// Minimum duration of one sample.
    pub min_time: Duration,
    /// Samples per (job, op); the result is their median.
    pub samples: usize,
}

/// Warm-up length, in samples' worth of time.
const WARM_UP_SAMPLES: u32 = 4;

/// Calibrated loops aim this much above `min_time`, so that a sample whose
/// iterations run a little faster than during warm-up still lasts at least
/// `min_time`.
const CALIBRATION_MARGIN: f64 = 1.05;

/// Times `op` (one call processes all `msgs_per_call` messages of a job) and
/// returns the median over `timing.samples` samples, in ns per message.
///
/// The warm-up runs `op` for about four samples' worth of time, in batches
/// sized from the previous batch's speed; the last (warmest) batch fixes the
/// iteration count that every sample then uses, so all samples do the same
/// work.
pub fn ns_per_msg(timing: &Timing, msgs_per_call: usize, mut op: impl FnMut()) -> f64 {
    let warm_up = timing.min_time * WARM_UP_SAMPLES;
    let mut spent = Duration::ZERO;
    let mut batch: u64 = 1;
    let secs_per_call = loop {
        let elapsed = run(batch, &mut op);
        spent += elapsed;
        let per_call = elapsed.as_secs_f64() / batch as f64;
        if spent >= warm_up {
            break per_call;
        }
        let remaining = (warm_up - spent).as_secs_f64();
        // Grow at most 8x per batch, so one slow outlier call cannot make the
        // warm-up overshoot by much.
        batch = calls_for(remaining, per_call).min(batch.saturating_mul(8));
    };

    let calls = calls_for(timing.min_time.as_secs_f64() * CALIBRATION_MARGIN, secs_per_call);
    let per_sample = calls as f64 * msgs_per_call as f64;
    let mut samples: Vec<f64> =
        (0..timing.samples).map(|_| run(calls, &mut op).as_nanos() as f64 / per_sample).collect();
    median(&mut samples)
}

/// Runs `op` `calls` times and returns the elapsed wall-clock time.
#[inline(never)]
fn run(calls: u64, op: &mut impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..calls {
        op();
    }
    start.elapsed()
}

/// Calls needed to fill `secs` at `secs_per_call` each (at least one).
fn calls_for(secs: f64, secs_per_call: f64) -> u64 {
    if secs_per_call <= 0.0 {
        // Below the clock's resolution: grow geometrically instead.
        return 1024;
    }
    // `as` saturates, so an absurd ratio cannot wrap.
    ((secs / secs_per_call).ceil() as u64).max(1)
}

/// Median of `values` (mean of the middle two for an even count).
fn median(values: &mut [f64]) -> f64 {
    assert!(!values.is_empty(), "median of no samples");
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn calibrated_samples_last_at_least_min_time() {
        let timing = Timing { min_time: Duration::from_millis(2), samples: 3 };
        let mut calls = 0u64;
        let ns = ns_per_msg(&timing, 2, || {
            calls += 1;
            std::hint::black_box((0..100u64).map(std::hint::black_box).sum::<u64>());
        });
        assert!(ns > 0.0);
        assert!(calls > 3);
    }
}
