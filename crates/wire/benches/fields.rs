//! Per-field-type micro benchmarks (the ProtoAcc / PsPIN methodology):
//! each message is ONE field type repeated, so the time per byte is the
//! engine's per-field cost for that type. The messages are generated at
//! startup from an embedded proto3 schema; see `corpus/mod.rs` for the
//! exact shapes (100 unpacked occurrences of one repeated field for the
//! scalars and strings, 1000-element packed arrays, 100 sub-message chains
//! for nesting).
//!
//! For every message: `decode_owned` (strings copied into the block),
//! `decode_view` (strings referenced in the input) and `encode` (from the
//! owned block), with the decoder, block and output buffer reused across
//! iterations, as a server would. Throughput is wire bytes per second.
//!
//! Run: `cargo bench -p protoplane-wire --bench fields` (about 2.5 minutes;
//! a criterion filter such as `-- varint/` runs a subset).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use protoplane_wire::{Block, DecodeOptions, Decoder, EncodeOptions, Encoder, Source};

mod corpus;

/// Benchmark id within a group: `op/param`, or `op` for a case without variant.
fn id(op: &str, param: &str) -> String {
    if param.is_empty() {
        op.to_owned()
    } else {
        format!("{op}/{param}")
    }
}

fn fields(c: &mut Criterion) {
    let ts = corpus::tables();
    let cases = corpus::cases(&ts);
    // Never time a message the engine gets wrong.
    for case in &cases {
        corpus::verify(&ts, case.ty, &case.wire, case.values)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name()));
    }

    let owned = DecodeOptions::default();
    let view = DecodeOptions::view();
    let eopts = EncodeOptions::default();
    let mut dec = Decoder::new();
    let mut enc = Encoder::new();
    let mut block = Block::new();
    let mut out = Vec::new();

    for case in &cases {
        let (ts, ty, wire) = (&ts, case.ty, case.wire.as_slice());
        let mut group = c.benchmark_group(case.group);
        group.throughput(Throughput::Bytes(wire.len() as u64));

        group.bench_function(id("decode_owned", &case.param), |b| {
            b.iter(|| {
                dec.decode_into(ts, ty, black_box(wire), &owned, &mut block)
                    .unwrap_or_else(|e| panic!("{e}"));
                black_box(block.as_bytes());
            })
        });
        group.bench_function(id("decode_view", &case.param), |b| {
            b.iter(|| {
                dec.decode_into(ts, ty, black_box(wire), &view, &mut block)
                    .unwrap_or_else(|e| panic!("{e}"));
                black_box(block.as_bytes());
            })
        });

        // Encode from an owned block (no reference into the wire bytes).
        dec.decode_into(ts, ty, wire, &owned, &mut block).unwrap_or_else(|e| panic!("{e}"));
        group.bench_function(id("encode", &case.param), |b| {
            b.iter(|| {
                out.clear();
                enc.encode_into(
                    ts,
                    ty,
                    Source::owned(black_box(block.as_bytes())),
                    &eopts,
                    &mut out,
                )
                .unwrap_or_else(|e| panic!("{e}"));
                black_box(out.as_slice());
            })
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    // 75 benchmarks: short warm-up and measurement keep the whole run near
    // 2.5 minutes; 20 samples are plenty for these steady loops.
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(400))
        .measurement_time(Duration::from_millis(1200))
        .sample_size(20);
    targets = fields
}
criterion_main!(benches);
