//! Per-field decode throughput (PsPIN): the generated messages decode to
//! exactly what was generated, `run` yields a row per case × scheme ×
//! worker count with sane numbers, and the small/oversized routing policy.
//! No timing assertions: the machine is shared and noisy.

use std::time::Duration;

use protoplane_offload::perfield::{
    self, route, scaling, Case, MessageSet, PerFieldOptions, PerFieldRow, Route, APP_CORE,
    ENGINE_WORKERS, FIELDS_PER_MESSAGE,
};
use protoplane_offload::{Error, Mismatch};
use protoplane_wire::{Block, DecodeOptions, Decoder, MessageView, Source, Value};

fn varint_len(v: u64) -> usize {
    let mut n = 1;
    let mut v = v >> 7;
    while v != 0 {
        n += 1;
        v >>= 7;
    }
    n
}

#[test]
fn case_names_round_trip_and_all_is_pspins_set() {
    let all = Case::all();
    let names: Vec<String> = all.iter().map(Case::name).collect();
    assert_eq!(
        names,
        [
            "varint-2",
            "varint-3",
            "varint-4",
            "varint-5",
            "varint-6",
            "varint-7",
            "varint-8",
            "varint-9",
            "varint-10",
            "float",
            "double",
            "string-8",
            "string-16",
            "string-1024"
        ]
    );
    for c in &all {
        assert_eq!(c.name().parse::<Case>().ok().as_ref(), Some(c));
    }
    assert!("varint-11".parse::<Case>().is_err());
    assert!("varint-0".parse::<Case>().is_err());
    assert!("string-0".parse::<Case>().is_err());
    assert!("int32".parse::<Case>().is_err());
}

/// Every case, decoded independently of `run`: each message gives all 15
/// fields, of the case's type, with values of the case's size, equal to
/// what was generated; and `verify` agrees.
#[test]
fn every_case_decodes_to_the_right_fields_and_values() {
    let tables = perfield::schema().expect("schema");
    let mut cases = Case::all();
    cases.push(Case::Varint(1));
    let mut decoder = Decoder::new();
    let mut block = Block::new();
    for case in cases {
        let set = MessageSet::generate(&tables, case, 20).expect("generate");
        assert_eq!(set.len(), 20);
        assert_eq!(set.case(), case);
        for i in 0..set.len() {
            let wire = set.message(i);
            assert_eq!(wire.len(), case.message_wire_len(), "{case} message {i}");
            decoder
                .decode_into(&tables, set.type_index(), wire, &DecodeOptions::default(), &mut block)
                .expect("decode");
            let view = MessageView::new(&tables, Source::owned(block.as_bytes()), set.type_index())
                .expect("view");
            assert_eq!(view.fields().len(), FIELDS_PER_MESSAGE);
            let mut values = 0;
            for f in view.fields() {
                let v = view
                    .get(f)
                    .expect("get")
                    .unwrap_or_else(|| panic!("{case} message {i}: field {} missing", f.number));
                match (case, v) {
                    (Case::Varint(n), Value::U64(x)) => assert_eq!(varint_len(x), n as usize),
                    (Case::Float, Value::F32(x)) => assert!(x.is_finite()),
                    (Case::Double, Value::F64(x)) => assert!(x.is_finite()),
                    (Case::String(n), Value::String(s)) => {
                        assert_eq!(s.len(), n);
                        // The bytes are in the message, right after the tag and length.
                        assert!(wire.windows(n).any(|w| w == s));
                    }
                    (c, v) => panic!("{c}: unexpected value {v:?}"),
                }
                values += 1;
            }
            assert_eq!(values, FIELDS_PER_MESSAGE);
            assert!(view.unknown_fields().expect("unknown").is_empty());
            set.verify(&tables, i, &block).expect("verify");
        }
        // Messages differ (the generator is not stuck).
        assert_ne!(set.message(0), set.message(1), "{case}");
    }
}

#[test]
fn generation_is_deterministic() {
    let tables = perfield::schema().expect("schema");
    for case in [Case::Varint(5), Case::Double, Case::String(16)] {
        let a = MessageSet::generate(&tables, case, 5).expect("generate");
        let b = MessageSet::generate(&tables, case, 5).expect("generate");
        for i in 0..5 {
            assert_eq!(a.message(i), b.message(i));
        }
    }
}

/// The check `run` relies on catches a changed value, a missing field and
/// a block of another message.
#[test]
fn verify_rejects_wrong_blocks() {
    let tables = perfield::schema().expect("schema");
    let opts = DecodeOptions::default();
    for case in Case::all() {
        let set = MessageSet::generate(&tables, case, 3).expect("generate");
        let decode = |wire: &[u8]| {
            protoplane_wire::decode(&tables, set.type_index(), wire, &opts).expect("decode")
        };
        let good = set.message(1).to_vec();
        set.verify(&tables, 1, &decode(&good)).expect("the message itself");

        // The last byte belongs to the last field's value.
        let mut changed = good.clone();
        *changed.last_mut().expect("bytes") ^= 1;
        assert!(set.verify(&tables, 1, &decode(&changed)).is_err(), "{case}: changed value");

        let short = &good[..good.len() - case.field_wire_len()];
        let err = set.verify(&tables, 1, &decode(short)).expect_err("missing field");
        assert!(
            matches!(
                err,
                Error::Verify {
                    message: 1,
                    mismatch: Mismatch::FieldCount { decoded: 14, sent: 15 },
                    ..
                }
            ),
            "{case}: {err:?}"
        );
        assert!(err.to_string().contains("14 field(s) decoded"), "{case}: {err}");

        assert!(set.verify(&tables, 0, &decode(&good)).is_err(), "{case}: another message");
    }
}

fn check_rows(rows: &[PerFieldRow], opts: &PerFieldOptions) {
    assert_eq!(rows.len(), opts.cases.len() * (1 + opts.workers.len()));
    for case in &opts.cases {
        let name = case.name();
        let of_case: Vec<&PerFieldRow> = rows.iter().filter(|r| r.case == name).collect();
        let app: Vec<_> = of_case.iter().filter(|r| r.scheme == APP_CORE).collect();
        assert_eq!(app.len(), 1, "{name}");
        assert_eq!(app[0].workers, 1);
        for &n in &opts.workers {
            let rows_n =
                of_case.iter().filter(|r| r.scheme == ENGINE_WORKERS && r.workers == n).count();
            assert_eq!(rows_n, 1, "{name} with {n} workers");
        }
        for r in of_case {
            for x in [r.fields_per_s, r.bytes_per_s, r.messages_per_s] {
                assert!(x.is_finite() && x > 0.0, "{r:?}");
            }
            // Fields and bytes are counted by construction: 15 fields and
            // a fixed size per message.
            let per_msg = r.fields_per_s / r.messages_per_s;
            assert!((per_msg - FIELDS_PER_MESSAGE as f64).abs() < 1e-6, "{r:?}");
            let bytes = r.bytes_per_s / r.messages_per_s;
            assert!((bytes - case.message_wire_len() as f64).abs() < 1e-6, "{r:?}");
        }
        let one = scaling(rows, &name, 1).expect("one worker");
        assert!((one - 1.0).abs() < 1e-12);
        for &n in &opts.workers {
            let s = scaling(rows, &name, n).expect("scaling");
            assert!(s.is_finite() && s > 0.0);
        }
    }
}

#[test]
fn run_measures_every_case_scheme_and_worker_count() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut workers: Vec<usize> = (1..=cores.max(2)).collect();
    workers.truncate(4);
    let opts = PerFieldOptions {
        workers,
        messages: 12,
        min_time: Duration::from_millis(2),
        repetitions: 3,
        cases: Case::all(),
    };
    let rows = perfield::run(&opts).expect("run");
    check_rows(&rows, &opts);
    assert!(scaling(&rows, "float", 99).is_none());
    assert!(scaling(&rows, "int32", 1).is_none());
    let table = perfield::table(&rows);
    assert_eq!(table.lines().count(), rows.len() + 1);
    println!("{table}");
}

/// An uneven split (7 messages over 3 workers) and a worker count above
/// the machine's still measure every message.
#[test]
fn run_with_uneven_shares() {
    let opts = PerFieldOptions {
        workers: vec![3, 1],
        messages: 7,
        min_time: Duration::from_millis(1),
        repetitions: 1,
        cases: vec![Case::Varint(10), Case::String(8)],
    };
    let rows = perfield::run(&opts).expect("run");
    check_rows(&rows, &opts);
}

#[test]
fn run_rejects_bad_options() {
    let ok = PerFieldOptions {
        workers: vec![1, 2],
        messages: 4,
        min_time: Duration::from_millis(1),
        repetitions: 1,
        cases: vec![Case::Float],
    };
    assert!(perfield::run(&ok).is_ok());
    type Expected = fn(&Error) -> bool;
    let bad: [(PerFieldOptions, Expected); 7] = [
        (PerFieldOptions { workers: vec![0], ..ok.clone() }, |e| matches!(e, Error::ZeroWorkers)),
        (PerFieldOptions { messages: 1, ..ok.clone() }, |e| {
            matches!(e, Error::TooFewMessages { messages: 1, workers: 2 })
        }),
        (PerFieldOptions { repetitions: 0, ..ok.clone() }, |e| matches!(e, Error::NoRepetitions)),
        (PerFieldOptions { cases: vec![Case::Varint(11)], ..ok.clone() }, |e| {
            matches!(e, Error::InvalidCase(Case::Varint(11)))
        }),
        (PerFieldOptions { cases: vec![Case::Varint(0)], ..ok.clone() }, |e| {
            matches!(e, Error::InvalidCase(Case::Varint(0)))
        }),
        (PerFieldOptions { cases: vec![Case::String(0)], ..ok.clone() }, |e| {
            matches!(e, Error::InvalidCase(Case::String(0)))
        }),
        (PerFieldOptions { cases: vec![Case::String(1 << 30)], ..ok.clone() }, |e| {
            matches!(e, Error::SetTooLarge { messages: 4, .. })
        }),
    ];
    for (opts, expected) in bad {
        match perfield::run(&opts) {
            Err(e) => assert!(expected(&e), "{opts:?}: {e:?}"),
            Ok(rows) => panic!("{opts:?}: accepted, {rows:?}"),
        }
    }
    let none = PerFieldOptions { cases: vec![], ..ok };
    assert_eq!(perfield::run(&none).expect("no cases"), vec![]);
}

#[test]
fn default_options_cover_every_core_and_case() {
    let d = PerFieldOptions::default();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(d.workers, (1..=cores).collect::<Vec<_>>());
    assert_eq!(d.cases, Case::all());
    assert!(d.messages >= cores && d.repetitions >= 1 && d.min_time > Duration::ZERO);
}

#[test]
fn small_messages_go_to_the_engine_oversized_ones_raw_to_the_app() {
    assert_eq!(route(0, 1024), Route::Engine);
    assert_eq!(route(1023, 1024), Route::Engine);
    assert_eq!(route(1024, 1024), Route::Engine);
    assert_eq!(route(1025, 1024), Route::RawToApp);
    assert_eq!(route(1 << 20, 1024), Route::RawToApp);
    assert_eq!(route(0, 0), Route::Engine);
    assert_eq!(route(1, 0), Route::RawToApp);
    assert_eq!(route(usize::MAX, usize::MAX), Route::Engine);
    // A case's whole message against a threshold between sizes.
    let small = Case::String(16).message_wire_len();
    let big = Case::String(1024).message_wire_len();
    assert_eq!(route(small, 4096), Route::Engine);
    assert_eq!(route(big, 4096), Route::RawToApp);
}

/// A realistic run that prints the table (not part of the suite: run with
/// `cargo test --release -p protoplane-offload --test perfield -- --ignored --nocapture`).
#[test]
#[ignore = "a measurement, tens of seconds"]
fn full_run_prints_table() {
    let opts = PerFieldOptions::default();
    let rows = perfield::run(&opts).expect("run");
    check_rows(&rows, &opts);
    println!("{opts:?}\n{}", perfield::table(&rows));
}
