//! The simulator's measurements on the built-in workload and, when it is
//! beside the checkout (`../shared/datasets/hyperprotobench`), on
//! HyperProtoBench: both commit modes give the plain decode's block (the
//! replay checks it), one-shot takes fewer host transactions on every
//! message, laid-out responses encode back to the messages, and nesting
//! costs a field-by-field decoder transactions.

use std::path::Path;

use protoplane_sim::dataset::{builtin, load};
use protoplane_sim::model::Interconnect;
use protoplane_sim::replay::{decode_rows, encode_rows, nested, Effort};

#[test]
fn one_shot_takes_fewer_transactions_on_the_builtin_workload() {
    let w = builtin().expect("workload");
    let rows = decode_rows(&w, Effort::quick()).expect("replays");
    assert_eq!(rows.len(), 7);
    for r in &rows {
        assert!(r.one_shot.writes < r.field_by_field.writes, "{}: {r:?}", r.name);
        assert_eq!(r.one_shot.bytes, r.block_bytes as u64);
        assert!(r.decode_ns > 0.0 && r.one_shot_ns > 0.0);
    }
    let enc = encode_rows(&w, Effort::quick()).expect("lays out");
    assert_eq!(enc.len(), rows.len());
    let pcie = Interconnect::pcie();
    for (d, e) in rows.iter().zip(&enc) {
        assert!(pcie.cost_ns(d.one_shot) < pcie.cost_ns(d.field_by_field));
        assert!(e.block_pull.writes <= e.device_reads.writes);
    }
}

#[test]
fn nesting_costs_field_by_field_decoding_transactions() {
    let rows = nested(&[0, 1, 3, 7, 15], Effort::quick()).expect("nested");
    assert_eq!(rows.len(), 5);
    for w in rows.windows(2) {
        assert!(w[1].field_by_field.writes > w[0].field_by_field.writes, "{w:?}");
    }
}

#[test]
fn hyperprotobench_one_shot_everywhere() {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/datasets/hyperprotobench");
    if !dir.join("manifest.tsv").is_file() {
        eprintln!("skipped: HyperProtoBench is not at {}", dir.display());
        return;
    }
    let w = load(&dir).expect("loads");
    assert!(w.samples().count() >= 50);
    let rows =
        decode_rows(&w, Effort { rounds: 1, round_ns: 1e4, ..Effort::quick() }).expect("replays");
    for r in &rows {
        assert!(r.one_shot.writes < r.field_by_field.writes, "{}/{}: {r:?}", r.group, r.name);
    }
}
