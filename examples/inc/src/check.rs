//! The data every run uses and the plain computations its results are
//! checked against (not user code: the test harness).

use std::collections::HashMap;

use protoplane_inc::keys::Quantizer;
use protoplane_inc::rng::Rng;

use crate::async_agg;

/// Steps and gradient length of synchronous aggregation at `scale`.
pub fn sync_shape(scale: u32) -> (usize, usize) {
    (4 * scale as usize, 4096)
}

/// Worker `member`'s gradients, one per step, in [-1, 1); with
/// `overflow_permille`, that many per mille of the positions hold 1000.0
/// in every worker's gradient (their sums leave 32 bits once quantized).
pub fn gradients(seed: u64, member: u16, scale: u32, overflow_permille: u32) -> Vec<Vec<f64>> {
    let (steps, len) = sync_shape(scale);
    let mut rng = Rng::new(seed ^ (u64::from(member) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    // The same positions in every worker: drawn from the seed alone.
    let mut big = Rng::new(seed ^ 0xb16);
    (0..steps)
        .map(|_| {
            (0..len)
                .map(|_| {
                    let g = rng.unit() * 2.0 - 1.0;
                    if big.below(1000) < u64::from(overflow_permille) {
                        1000.0
                    } else {
                        g
                    }
                })
                .collect()
        })
        .collect()
}

/// The sync-agg NetFilter's `Precision` (a test checks they agree).
pub const PRECISION: u32 = 6;

/// The sums every worker must get: quantized gradients added exactly.
pub fn sync_expected(seed: u64, clients: u16, scale: u32, overflow_permille: u32) -> Vec<Vec<f64>> {
    let (steps, _) = sync_shape(scale);
    sync_expected_over(seed, clients, scale, overflow_permille, &vec![0; steps])
}

/// The same, step `s` over the workers `over[s]` names (a bit each; 0:
/// every worker).
pub fn sync_expected_over(
    seed: u64,
    clients: u16,
    scale: u32,
    overflow_permille: u32,
    over: &[u64],
) -> Vec<Vec<f64>> {
    let q = Quantizer::new(PRECISION);
    let all: Vec<Vec<Vec<f64>>> =
        (0..clients).map(|m| gradients(seed, m, scale, overflow_permille)).collect();
    let (steps, len) = sync_shape(scale);
    (0..steps)
        .map(|s| {
            let over = over.get(s).copied().unwrap_or(0);
            let counted: Vec<&Vec<Vec<f64>>> = all
                .iter()
                .enumerate()
                .filter(|(m, _)| over == 0 || over & (1u64 << m) != 0)
                .map(|(_, g)| g)
                .collect();
            (0..len)
                .map(|i| {
                    q.dequantize(counted.iter().map(|g| q.quantize(g[s][i]).unwrap_or(0)).sum())
                })
                .collect()
        })
        .collect()
}

/// The corpus: the repository's Markdown files and doc comments.
pub fn corpus() -> &'static str {
    include_str!(concat!(env!("OUT_DIR"), "/corpus.txt"))
}

/// Worker `member`'s lines of the corpus repeated `scale` times.
pub fn corpus_share(member: u16, clients: u16, scale: u32) -> Vec<&'static str> {
    let lines: Vec<&str> = corpus().lines().collect();
    (0..scale as usize)
        .flat_map(|_| lines.iter().copied())
        .enumerate()
        .filter(|(i, _)| i % usize::from(clients.max(1)) == usize::from(member))
        .map(|(_, l)| l)
        .collect()
}

/// Word counts of the whole corpus repeated `scale` times.
pub fn word_counts(scale: u32) -> HashMap<String, i64> {
    let mut counts = HashMap::new();
    for w in async_agg::words(corpus()) {
        *counts.entry(w).or_insert(0) += i64::from(scale);
    }
    counts
}

/// Keys of the monitoring workload: 4,096 counters, skewed (a few hot).
pub const KV_KEYS: i64 = 4096;

/// Reporter `member`'s reports: 50 × scale reports of 64 counter deltas.
pub fn reports(seed: u64, member: u16, scale: u32) -> Vec<Vec<(i64, i64)>> {
    let mut rng = Rng::new(seed ^ 0x6b76 ^ (u64::from(member) << 32));
    (0..50 * scale)
        .map(|_| {
            (0..64)
                .map(|_| {
                    let u = rng.unit();
                    ((u * u * u * KV_KEYS as f64) as i64, rng.below(1000) as i64 + 1)
                })
                .collect()
        })
        .collect()
}

/// Counter totals over every reporter. A report is a protobuf map: a key
/// that appears twice in one report counts with its last value (proto3
/// keeps the last entry of a repeated map key), so each report is reduced
/// to its map first.
pub fn kv_expected(seed: u64, clients: u16, scale: u32) -> Vec<i64> {
    let mut totals = vec![0i64; KV_KEYS as usize];
    for m in 0..clients {
        for r in reports(seed, m, scale) {
            let map: HashMap<i64, i64> = r.into_iter().collect();
            for (k, v) in map {
                totals[k as usize] += v;
            }
        }
    }
    totals
}

/// The leader's proposals: instance i (from 1) gets a value derived from it.
pub fn proposals(seed: u64, scale: u32) -> Vec<(u32, i64)> {
    let mut rng = Rng::new(seed ^ 0xa9);
    (1..=200 * scale).map(|i| (i, rng.below(1 << 30) as i64)).collect()
}
