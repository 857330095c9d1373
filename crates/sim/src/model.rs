//! The interconnect between host memory and the device (RPCAcc §II, §VI).
//!
//! A transfer of `n` separate transactions moving `b` bytes costs
//! `n × latency + b / bandwidth`: every transaction waits for the one
//! before it (a decoder that writes field by field does not go on before
//! its store is accepted), and the bytes stream at the link's bandwidth.
//! DMA batching is what one-shot commit does: many bytes, one transaction.
//!
//! | interconnect | latency per transaction | bandwidth | source |
//! |---|---:|---:|---|
//! | `pcie` | 1,250 ns | 16 GB/s | RPCAcc's PCIe round trip; PCIe 3.0 ×16 (15.75 GB/s) |
//! | `cxl` | 250 ns | 32 GB/s | CXL.mem / UPI load-to-use latencies are reported at 70–400 ns; the middle of that range; a CXL 2.0 ×16 link |
//! | `onchip` | measured | measured | a cache line handed between two cores of this machine ([`measure_onchip`]), and `memcpy` bandwidth |
//!
//! The PCIe and CXL figures are parameters taken from the literature, not
//! measurements of this machine; the on-chip ones are measured when the
//! simulator starts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use protoplane_wire::WriteStats;

/// One interconnect's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Interconnect {
    /// `pcie`, `cxl`, `onchip`.
    pub name: String,
    /// Nanoseconds per transaction.
    pub latency_ns: f64,
    /// Bytes per nanosecond (= GB/s).
    pub bandwidth_gbs: f64,
    /// Whether the figures were measured here (else: from the literature).
    pub measured: bool,
}

impl Interconnect {
    /// PCIe: 1,250 ns per transaction, 16 GB/s.
    pub fn pcie() -> Interconnect {
        Interconnect {
            name: "pcie".into(),
            latency_ns: 1250.0,
            bandwidth_gbs: 16.0,
            measured: false,
        }
    }

    /// CXL / UPI: 250 ns per transaction, 32 GB/s.
    pub fn cxl() -> Interconnect {
        Interconnect { name: "cxl".into(), latency_ns: 250.0, bandwidth_gbs: 32.0, measured: false }
    }

    /// On-chip, with figures measured on this machine.
    pub fn onchip() -> Interconnect {
        let (latency_ns, bandwidth_gbs) = measure_onchip();
        Interconnect { name: "onchip".into(), latency_ns, bandwidth_gbs, measured: true }
    }

    /// By name (`pcie`, `cxl`, `onchip`).
    pub fn by_name(name: &str) -> Option<Interconnect> {
        match name {
            "pcie" => Some(Interconnect::pcie()),
            "cxl" => Some(Interconnect::cxl()),
            "onchip" => Some(Interconnect::onchip()),
            _ => None,
        }
    }

    /// Nanoseconds the transfers of `s` take.
    pub fn cost_ns(&self, s: WriteStats) -> f64 {
        s.writes as f64 * self.latency_ns + s.bytes as f64 / self.bandwidth_gbs
    }
}

/// Measures this machine's on-chip path: the one-way latency of handing a
/// cache line between two threads (half of a ping-pong round trip, median
/// of several runs) and `memcpy` bandwidth over 4 MiB. Returns (ns, GB/s).
pub fn measure_onchip() -> (f64, f64) {
    const ROUNDS: u64 = 20_000;
    let mut one_way = Vec::new();
    for _ in 0..5 {
        let flag = Arc::new(AtomicU64::new(0));
        let peer = flag.clone();
        let t = std::thread::spawn(move || {
            for i in 0..ROUNDS {
                while peer.load(Ordering::Acquire) != 2 * i + 1 {
                    std::hint::spin_loop();
                }
                peer.store(2 * i + 2, Ordering::Release);
            }
        });
        let start = Instant::now();
        for i in 0..ROUNDS {
            flag.store(2 * i + 1, Ordering::Release);
            while flag.load(Ordering::Acquire) != 2 * i + 2 {
                std::hint::spin_loop();
            }
        }
        let ns = start.elapsed().as_nanos() as f64;
        let _ = t.join();
        one_way.push(ns / (2 * ROUNDS) as f64);
    }
    one_way.sort_by(f64::total_cmp);
    let latency = one_way[one_way.len() / 2];
    let src = vec![1u8; 4 << 20];
    let mut dst = vec![0u8; 4 << 20];
    let mut best = f64::MAX;
    for _ in 0..10 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_nanos() as f64);
    }
    (latency, src.len() as f64 / best.max(1.0))
}
