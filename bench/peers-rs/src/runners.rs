//! The measured operations of prost and buffa, generic over the generated
//! message type, and of protoplane's generated decoders. `build.rs`
//! instantiates `run_prost` / `run_buffa` once per (schema, top-level type),
//! so every loop below is compiled, and inlined, for one concrete type, as
//! in an application that uses that type; protoplane's generated decoder of
//! the type is called through a function pointer once per message (its
//! sub-messages are direct calls), as `Marker::decode_into` does.
//!
//! Each op is written the way the library's documentation tells a user to
//! do that job; where a library has a knob for hot loops (a reusable
//! buffer, a reusable size cache) it is used, since a serving loop would.

use std::hint::black_box;

use protoplane_schema::TableSet;
use protoplane_wire::gen::{EncodeFields, Fields};
use protoplane_wire::{Block, DecodeOptions, Decoder, EncodeOptions, Encoder, Source};

use crate::measure::{self, Timing};

/// Operation names of the worker protocol (bench/README.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    DecodeOwned,
    DecodeView,
    DecodeReuse,
    DecodeArena,
    Encode,
    EncodeSg,
    Memcpy,
    DecodeOwnedGen,
    DecodeViewGen,
    EncodeGen,
}

impl Op {
    /// Every op the protocol names, including those this worker lacks.
    pub const ALL: [Op; 10] = [
        Op::DecodeOwned,
        Op::DecodeView,
        Op::DecodeReuse,
        Op::DecodeArena,
        Op::Encode,
        Op::EncodeSg,
        Op::Memcpy,
        Op::DecodeOwnedGen,
        Op::DecodeViewGen,
        Op::EncodeGen,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::DecodeOwned => "decode_owned",
            Op::DecodeView => "decode_view",
            Op::DecodeReuse => "decode_reuse",
            Op::DecodeArena => "decode_arena",
            Op::Encode => "encode",
            Op::EncodeSg => "encode_sg",
            Op::Memcpy => "memcpy",
            Op::DecodeOwnedGen => "decode_owned_gen",
            Op::DecodeViewGen => "decode_view_gen",
            Op::EncodeGen => "encode_gen",
        }
    }

    pub fn parse(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.name() == name)
    }
}

/// Ops of the `prost` impl. prost has no zero-copy view.
pub const PROST_OPS: &[Op] = &[Op::DecodeOwned, Op::DecodeReuse, Op::Encode];
/// Ops of the `buffa` impl.
pub const BUFFA_OPS: &[Op] = &[Op::DecodeOwned, Op::DecodeReuse, Op::DecodeView, Op::Encode];
/// Ops of the `protoplane-gen` impl (rows say `protoplane`: the same
/// library, its generated path beside the table-driven one).
pub const PROTOPLANE_GEN_OPS: &[Op] = &[Op::DecodeOwnedGen, Op::DecodeViewGen, Op::EncodeGen];

/// What a runner gets from a job.
#[derive(Debug)]
pub struct JobInput<'a> {
    /// Names the job in diagnostics.
    pub label: &'a str,
    /// Fully qualified message type the job asks for.
    pub ty: &'a str,
    /// The job's messages (one, or all of a delimited file).
    pub messages: &'a [&'a [u8]],
}

/// `(op, median ns per message)` for each op that was run.
pub type Results = Vec<(Op, f64)>;

/// Verifies, then times, the requested ops of one impl on one job. An `Err`
/// is a failed verification: the worker reports it and exits 1.
pub type RunFn = fn(&JobInput<'_>, &[Op], &Timing) -> Result<Results, String>;

/// Every impl's runner for one (schema, type).
#[derive(Debug, Clone, Copy)]
pub struct Runners {
    pub prost: RunFn,
    pub buffa: RunFn,
    pub protoplane: PpGen,
}

/// A schema's generated protoplane code: its tables and, per package, the
/// generated decoders and encoders by type index.
#[derive(Debug, Clone, Copy)]
pub struct PpGen {
    pub tables: fn() -> &'static TableSet,
    pub decoders: &'static [&'static [(u32, Fields)]],
    pub encoders: &'static [&'static [(u32, EncodeFields)]],
}

/// Panic message of the timed loops: every message there was decoded (and
/// re-encoded) successfully during verification, with the same code.
const VERIFIED: &str = "input was verified before timing";

/// prost: `decode_owned`, `decode_reuse`, `encode`.
pub fn run_prost<M>(job: &JobInput<'_>, wanted: &[Op], timing: &Timing) -> Result<Results, String>
where
    M: prost::Message + prost::Name + Default,
{
    let ops = select(PROST_OPS, wanted);
    if ops.is_empty() {
        return Ok(Vec::new());
    }
    let mut check = RoundTrip::new("prost", job);
    check.type_name(&M::full_name())?;

    // Verification walks both decode paths the way the timed loops do, and
    // keeps the fresh decodes as the encode op's input.
    let mut decoded = Vec::with_capacity(job.messages.len());
    let mut reused = M::default();
    for (index, &bytes) in job.messages.iter().enumerate() {
        let msg = M::decode(bytes).map_err(|e| check.decode_error("decode", index, e))?;
        check.bytes("decode + encode", index, bytes, &msg.encode_to_vec())?;
        reused.clear();
        reused.merge(bytes).map_err(|e| check.decode_error("clear + merge", index, e))?;
        check.bytes("clear + merge + encode", index, bytes, &reused.encode_to_vec())?;
        decoded.push(msg);
    }
    check.finish();

    let msgs = job.messages;
    let n = msgs.len();
    let results = ops
        .into_iter()
        .map(|op| {
            let ns = match op {
                // A fresh message per input: `Message::decode` builds a
                // default message and merges into it; dropping it (freeing
                // its strings and sub-messages) is part of the cost.
                Op::DecodeOwned => measure::ns_per_msg(timing, n, || {
                    for &bytes in msgs {
                        let msg = M::decode(black_box(bytes)).expect(VERIFIED);
                        black_box(&msg);
                    }
                }),
                // One long-lived message: `clear` resets it to its default
                // state and `merge` decodes into it, prost's way to reuse a
                // message. What survives `clear` is the library's choice
                // (proto3 strings and vectors keep their capacity; proto2
                // `Option` fields and sub-messages are dropped).
                Op::DecodeReuse => {
                    let mut msg = M::default();
                    measure::ns_per_msg(timing, n, || {
                        for &bytes in msgs {
                            msg.clear();
                            msg.merge(black_box(bytes)).expect(VERIFIED);
                            black_box(&msg);
                        }
                    })
                }
                // `encode` into a cleared, reused `Vec`: prost computes
                // `encoded_len` (its capacity check) and then writes,
                // recomputing nested lengths as it goes; both passes are
                // part of every prost encode, so both are timed. The buffer
                // keeps its capacity, so no allocation after the first call.
                Op::Encode => {
                    let mut buf = Vec::with_capacity(max_len(msgs));
                    measure::ns_per_msg(timing, n, || {
                        for msg in &decoded {
                            buf.clear();
                            black_box(msg).encode(&mut buf).expect(VERIFIED);
                            black_box(&buf);
                        }
                    })
                }
                _ => unreachable!("{} is not a prost op", op.name()),
            };
            (op, ns)
        })
        .collect();
    Ok(results)
}

/// buffa: `decode_owned`, `decode_reuse`, `decode_view`, `encode`.
pub fn run_buffa<M>(job: &JobInput<'_>, wanted: &[Op], timing: &Timing) -> Result<Results, String>
where
    M: buffa::Message + buffa::MessageName + buffa::HasMessageView,
    for<'a> M::View<'a>: buffa::ViewEncode<'a>,
{
    use buffa::ViewEncode as _;

    let ops = select(BUFFA_OPS, wanted);
    if ops.is_empty() {
        return Ok(Vec::new());
    }
    let mut check = RoundTrip::new("buffa", job);
    check.type_name(M::FULL_NAME)?;

    // Verification covers all three decode paths: owned, merge into a
    // cleared message, and the view (re-encoded through the view itself, so
    // a view that lost a field cannot pass).
    let mut decoded = Vec::with_capacity(job.messages.len());
    let mut reused = M::default();
    for (index, &bytes) in job.messages.iter().enumerate() {
        let msg =
            M::decode_from_slice(bytes).map_err(|e| check.decode_error("decode", index, e))?;
        check.bytes("decode + encode", index, bytes, &msg.encode_to_vec())?;
        reused.clear();
        reused
            .merge_from_slice(bytes)
            .map_err(|e| check.decode_error("clear + merge", index, e))?;
        check.bytes("clear + merge + encode", index, bytes, &reused.encode_to_vec())?;
        let view =
            M::decode_view(bytes).map_err(|e| check.decode_error("view decode", index, e))?;
        check.bytes("view decode + view encode", index, bytes, &view.encode_to_vec())?;
        decoded.push(msg);
    }
    check.finish();

    let msgs = job.messages;
    let n = msgs.len();
    let results = ops
        .into_iter()
        .map(|op| {
            let ns = match op {
                // `decode_from_slice`: a fresh owned message per input, with
                // buffa's default decode limits, then dropped.
                Op::DecodeOwned => measure::ns_per_msg(timing, n, || {
                    for &bytes in msgs {
                        let msg = M::decode_from_slice(black_box(bytes)).expect(VERIFIED);
                        black_box(&msg);
                    }
                }),
                // One long-lived message: `clear` + `merge_from_slice`, the
                // reuse pattern buffa's `Message` trait offers; as with
                // prost, `clear` keeps proto3 strings' and vectors' capacity
                // and drops proto2 optionals and sub-messages.
                Op::DecodeReuse => {
                    let mut msg = M::default();
                    measure::ns_per_msg(timing, n, || {
                        for &bytes in msgs {
                            msg.clear();
                            msg.merge_from_slice(black_box(bytes)).expect(VERIFIED);
                            black_box(&msg);
                        }
                    })
                }
                // The zero-copy view (`FooView<'a>`): strings and bytes
                // borrow from the input; decoding is eager (whole tree), as
                // buffa's default views are. The view is kept alive as far
                // as `black_box` and then dropped, like the owned decodes.
                Op::DecodeView => measure::ns_per_msg(timing, n, || {
                    for &bytes in msgs {
                        let view = M::decode_view(black_box(bytes)).expect(VERIFIED);
                        black_box(&view);
                    }
                }),
                // `encode_with_cache` into a cleared, reused `Vec`: buffa's
                // encode is two passes (sizes into a `SizeCache`, then
                // write), and its docs point hot loops at a reused cache, as
                // they would reuse the output buffer. Both passes are timed.
                Op::Encode => {
                    let mut buf = Vec::with_capacity(max_len(msgs));
                    let mut cache = buffa::SizeCache::new();
                    measure::ns_per_msg(timing, n, || {
                        for msg in &decoded {
                            buf.clear();
                            black_box(msg).encode_with_cache(&mut cache, &mut buf);
                            black_box(&buf);
                        }
                    })
                }
                _ => unreachable!("{} is not a buffa op", op.name()),
            };
            (op, ns)
        })
        .collect();
    Ok(results)
}

/// protoplane, generated code: `decode_owned_gen`, `decode_view_gen`,
/// `encode_gen`, the same work as the table-driven worker's `decode_owned`
/// / `decode_view` (into a reused block, as the engine decodes into blocks
/// of a region's free list) and `encode` (`Encoder::encode`, back to front
/// into the encoder's reused buffer), through the generated code.
///
/// Verification is the equivalence proof on this dataset: on every message,
/// and on truncations and single-bit flips of it, the generated decoder must
/// give what the table-driven decoder gives (byte-identical blocks below
/// 2 KiB, where no copy can be padded by address, the same encoding above;
/// the same error when both fail), and the block must re-encode to the
/// input; the generated encoder must write the table-driven encoder's bytes.
pub fn run_protoplane_gen(
    pp: &PpGen,
    job: &JobInput<'_>,
    wanted: &[Op],
    timing: &Timing,
) -> Result<Results, String> {
    let ops = select(PROTOPLANE_GEN_OPS, wanted);
    if ops.is_empty() {
        return Ok(Vec::new());
    }
    let ts = (pp.tables)();
    let fail = |what: String| format!("protoplane-gen: {}: {what}", job.label);
    let ty = ts.message_by_name(job.ty).ok_or_else(|| fail(format!("no type {}", job.ty)))?;
    let fields = of_type(pp.decoders, ty)
        .ok_or_else(|| fail(format!("no generated decoder for {}", job.ty)))?;
    let encoder = of_type(pp.encoders, ty)
        .ok_or_else(|| fail(format!("no generated encoder for {}", job.ty)))?;
    let mut variants = 0usize;
    for (index, &bytes) in job.messages.iter().enumerate() {
        let enc = |b: &Block, wire: &[u8]| -> Result<Vec<u8>, String> {
            let opts = EncodeOptions { deterministic: true, ..EncodeOptions::default() };
            let mut out = Vec::new();
            Encoder::new()
                .encode_into(ts, ty, Source::viewing(b.as_bytes(), wire), &opts, &mut out)
                .map_err(|e| fail(format!("message {index}: encode: {e}")))?;
            Ok(out)
        };
        // The message itself, then up to 16 truncations and 16 bit flips.
        let step = (bytes.len() / 16).max(1);
        let mut inputs: Vec<Vec<u8>> = vec![bytes.to_vec()];
        inputs.extend((0..bytes.len()).step_by(step).map(|cut| bytes[..cut].to_vec()));
        inputs.extend((0..bytes.len()).step_by(step).map(|at| {
            let mut v = bytes.to_vec();
            v[at] ^= 1 << (at % 8);
            v
        }));
        for (k, input) in inputs.iter().enumerate() {
            for view in [false, true] {
                let opts = DecodeOptions { view, ..DecodeOptions::default() };
                let table = protoplane_wire::decode(ts, ty, input, &opts);
                let generated = protoplane_wire::gen::decode(ts, ty, fields, input, &opts);
                match (&table, &generated) {
                    (Ok(a), Ok(b)) => {
                        if input.len() < 2048 && a != b {
                            return Err(fail(format!(
                                "message {index} variant {k}: blocks differ"
                            )));
                        }
                        if enc(a, input)? != enc(b, input)? {
                            return Err(fail(format!(
                                "message {index} variant {k}: encodings differ"
                            )));
                        }
                        if k == 0 && enc(b, input)? != *input {
                            return Err(fail(format!("message {index}: re-encoding differs")));
                        }
                        let src = Source::viewing(b.as_bytes(), input);
                        let eopts = EncodeOptions::default();
                        let mut e = Encoder::new();
                        let generated =
                            protoplane_wire::gen::encode(ts, ty, encoder, &mut e, src, &eopts)
                                .map(<[u8]>::to_vec);
                        let table = Encoder::new().encode(ts, ty, src, &eopts).map(<[u8]>::to_vec);
                        if generated != table {
                            return Err(fail(format!(
                                "message {index} variant {k}: generated encoding differs"
                            )));
                        }
                    }
                    (Err(a), Err(b)) if a == b => {}
                    (a, b) => {
                        return Err(fail(format!(
                            "message {index} variant {k} view={view}: tables {:?}, generated {:?}",
                            a.as_ref().err(),
                            b.as_ref().err()
                        )))
                    }
                }
                if k == 0 && generated.is_err() {
                    return Err(fail(format!("message {index}: does not decode")));
                }
            }
            variants += 1;
        }
    }
    eprintln!(
        "protoplane-gen: {}: generated and table-driven decoders agree on {} messages and {} \
         damaged variants",
        job.label,
        job.messages.len(),
        variants - job.messages.len()
    );

    let msgs = job.messages;
    let n = msgs.len();
    let mut dec = Decoder::new();
    let mut block = Block::new();
    let owned: Vec<Block> = msgs
        .iter()
        .map(|m| protoplane_wire::gen::decode(ts, ty, fields, m, &DecodeOptions::default()))
        .collect::<Result<_, _>>()
        .map_err(|e| fail(e.to_string()))?;
    let mut enc = Encoder::new();
    let eopts = EncodeOptions::default();
    let results = ops
        .into_iter()
        .map(|op| {
            let opts = match op {
                Op::DecodeViewGen => DecodeOptions::view(),
                _ => DecodeOptions::default(),
            };
            if op == Op::EncodeGen {
                let ns = measure::ns_per_msg(timing, n, || {
                    for b in &owned {
                        let src = Source::owned(black_box(b.as_bytes()));
                        let r =
                            protoplane_wire::gen::encode(ts, ty, encoder, &mut enc, src, &eopts);
                        black_box(r.map(<[u8]>::len).ok());
                    }
                });
                return (op, ns);
            }
            let ns = measure::ns_per_msg(timing, n, || {
                for &bytes in msgs {
                    let r = protoplane_wire::gen::decode_into(
                        ts,
                        ty,
                        fields,
                        &mut dec,
                        black_box(bytes),
                        &opts,
                        &mut block,
                    );
                    black_box((r.is_ok(), block.as_bytes().len()));
                }
            });
            (op, ns)
        })
        .collect();
    Ok(results)
}

/// The entry for type `ty` in per-package `(type index, function)` lists.
fn of_type<T: Copy>(lists: &[&[(u32, T)]], ty: u32) -> Option<T> {
    lists.iter().flat_map(|l| l.iter()).find(|(t, _)| *t == ty).map(|&(_, f)| f)
}

/// `available` ops that are in `wanted`, in `available`'s order.
fn select(available: &[Op], wanted: &[Op]) -> Vec<Op> {
    available.iter().copied().filter(|op| wanted.contains(op)).collect()
}

/// Longest message, to size the reused encode buffer once.
fn max_len(msgs: &[&[u8]]) -> usize {
    msgs.iter().map(|m| m.len()).max().unwrap_or(0)
}

/// The once-per-job check that decode + encode reproduces the input.
struct RoundTrip<'a> {
    imp: &'static str,
    job: &'a JobInput<'a>,
    /// Re-encodings that differ from their input in byte order only.
    reordered: usize,
}

impl<'a> RoundTrip<'a> {
    fn new(imp: &'static str, job: &'a JobInput<'a>) -> Self {
        Self { imp, job, reordered: 0 }
    }

    /// The generated type's own full name must be the job's type: guards the
    /// dispatch table's name-to-path mapping.
    fn type_name(&self, generated: &str) -> Result<(), String> {
        if generated == self.job.ty {
            Ok(())
        } else {
            Err(format!(
                "{}: {}: dispatch picked type {generated}, job asks for {}",
                self.imp, self.job.label, self.job.ty
            ))
        }
    }

    fn decode_error(&self, path: &str, index: usize, err: impl std::fmt::Display) -> String {
        format!("{}: {}: message {index}: {path} failed: {err}", self.imp, self.job.label)
    }

    /// Byte-exact passes. Same length and the same bytes in another order
    /// (map entries in another order than the input's) passes with a note
    /// from `finish`. Anything else fails.
    fn bytes(
        &mut self,
        path: &str,
        index: usize,
        input: &[u8],
        output: &[u8],
    ) -> Result<(), String> {
        if input == output {
            return Ok(());
        }
        if input.len() == output.len() && same_multiset(input, output) {
            self.reordered += 1;
            return Ok(());
        }
        Err(format!(
            "{}: {}: message {index}: {path} does not reproduce the input ({} bytes in, {} out)",
            self.imp,
            self.job.label,
            input.len(),
            output.len()
        ))
    }

    fn finish(self) {
        if self.reordered > 0 {
            eprintln!(
                "note: {}: {}: {} re-encoding(s) have the input's length and bytes but not its \
                 byte order (map entry order); accepted",
                self.imp, self.job.label, self.reordered
            );
        }
    }
}

/// Whether `a` and `b` hold the same bytes, counted, in any order.
fn same_multiset(a: &[u8], b: &[u8]) -> bool {
    let mut counts = [0i64; 256];
    for &byte in a {
        counts[usize::from(byte)] += 1;
    }
    for &byte in b {
        counts[usize::from(byte)] -= 1;
    }
    counts.iter().all(|&c| c == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_names_round_trip() {
        for op in Op::ALL {
            assert_eq!(Op::parse(op.name()), Some(op));
        }
        assert_eq!(Op::parse("decode"), None);
    }

    #[test]
    fn reordered_bytes_are_a_multiset_match() {
        assert!(same_multiset(&[1, 2, 3], &[3, 1, 2]));
        assert!(!same_multiset(&[1, 2, 2], &[1, 1, 2]));
    }
}
