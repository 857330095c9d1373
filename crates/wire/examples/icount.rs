//! Instruction-count workload for `scripts/icount.sh` (callgrind).
//!
//! Wall-clock benchmarks are noisy on a shared machine; the number of
//! instructions a fixed workload executes is not. This program builds a
//! fixed, deterministic input set in memory, from embedded schemas only:
//!
//! * the social-network requests (`protos/socialnetwork/social_network.proto`):
//!   [`SOCIAL_PER_TYPE`] messages of each request type, filled by a seeded
//!   schema-driven generator;
//! * a selection of the per-field micro-benchmark messages of
//!   `benches/fields.rs` ([`MICRO`]).
//!
//! It checks that every message round-trips, warms the reused decoder,
//! encoder and buffers up, then runs each operation [`ROUNDS`] times over
//! the whole set, each in its own `#[inline(never)]` function
//! ([`op_decode_owned`], [`op_decode_view`], [`op_encode`]) so that
//! callgrind's inclusive count of that function is the cost of exactly
//! that operation. The last line printed, `messages_per_op N`, is what
//! the script divides by.
//!
//! Run under callgrind: `scripts/icount.sh`. Run bare (a quick smoke):
//! `cargo run --release -p protoplane-wire --example icount`.

use std::hint::black_box;

use protoplane_schema::{Kind, ProtoSource, TableSet};
use protoplane_wire::{
    Block, Builder, DecodeOptions, Decoder, EncodeOptions, Encoder, MessageBuilder, MessageView,
    Source, Value,
};

#[path = "../benches/corpus/mod.rs"]
mod corpus;

/// Passes over the whole input set per operation.
const ROUNDS: usize = 50;
/// Generated messages per social-network request type.
const SOCIAL_PER_TYPE: usize = 8;
/// The social-network request types.
const SOCIAL_TYPES: [&str; 5] = [
    "socialnetwork.RegisterUserRequest",
    "socialnetwork.LoginRequest",
    "socialnetwork.ComposeMediaRequest",
    "socialnetwork.ComposePostRequest",
    "socialnetwork.StorePostRequest",
];
/// Micro-benchmark messages included (by `Case::name`): one of each
/// family, none of the large strings (they would only count `memcpy`).
const MICRO: [&str; 9] = [
    "varint/2B",
    "varint/10B",
    "sint64",
    "fixed32",
    "double",
    "string/16B",
    "packed/int32",
    "packed/fixed64",
    "nest/d10",
];

const SOCIAL_NAME: &str = "socialnetwork/social_network.proto";
const SOCIAL_TEXT: &str = include_str!("../../../protos/socialnetwork/social_network.proto");

/// One input: a schema, a root type, the wire bytes and (for encode) their
/// decoded owned block.
struct Input<'t> {
    ts: &'t TableSet,
    ty: u32,
    wire: Vec<u8>,
    block: Block,
}

/// Fills the message at `at` with deterministic values: every singular
/// field set, 1..=4 elements per repeated field (maps included: an entry is
/// a message whose key and value are singular), sub-messages down to
/// `depth` levels.
fn fill(ts: &TableSet, b: &mut Builder<'_>, at: MessageBuilder, rng: &mut corpus::Rng, depth: u32) {
    let msg = ts.message(at.type_index());
    for f in ts.fields(msg) {
        let n = if f.is_repeated() { rng.range(1, 4) } else { 1 };
        for _ in 0..n {
            if f.kind.is_message() {
                if depth > 0 {
                    let sub = b.message(at, f.number).unwrap_or_else(|e| panic!("{e}"));
                    fill(ts, b, sub, rng, depth - 1);
                }
                continue;
            }
            // Strings: 4..=48 letters (identifiers, names, short texts).
            let text = if matches!(f.kind, Kind::String | Kind::Bytes) {
                let len = rng.range(4, 48) as usize;
                rng.ascii(len)
            } else {
                Vec::new()
            };
            let value = match f.kind {
                Kind::Bool => Value::Bool(rng.next_u64() & 1 == 1),
                Kind::Int32 | Kind::SInt32 | Kind::SFixed32 => {
                    Value::I32(rng.range(1, 1 << 20) as i32)
                }
                // Ids and timestamps: up to 48 bits (1- to 7-byte varints).
                Kind::Int64 | Kind::SInt64 | Kind::SFixed64 => {
                    Value::I64(rng.range(1, 1 << 48) as i64)
                }
                Kind::UInt32 | Kind::Fixed32 => Value::U32(rng.next_u64() as u32),
                Kind::UInt64 | Kind::Fixed64 => Value::U64(rng.range(1, 1 << 48)),
                Kind::Float => Value::F32(rng.range(1, 1 << 20) as f32 / 8.0),
                Kind::Double => Value::F64(rng.range(1, 1 << 40) as f64 / 8.0),
                Kind::Enum => {
                    let values = ts.enum_values(ts.enum_type(f.sub));
                    Value::Enum(values[rng.range(0, values.len() as u64 - 1) as usize].number)
                }
                Kind::String => Value::String(&text),
                _ => Value::Bytes(&text),
            };
            let done = if f.is_repeated() {
                b.push(at, f.number, value)
            } else {
                b.set(at, f.number, value)
            };
            done.unwrap_or_else(|e| {
                panic!("{}.{}: {e}", ts.message_name(at.type_index()), f.number)
            });
        }
    }
}

/// The fixed input set, each message checked to round-trip.
fn inputs<'t>(social: &'t TableSet, micro: &'t TableSet) -> Vec<Input<'t>> {
    let mut all = Vec::new();
    let mut rng = corpus::Rng::new(0x0050_C1A1_0000_1C07);
    for name in SOCIAL_TYPES {
        let ty = social.message_by_name(name).unwrap_or_else(|| panic!("{name} missing"));
        for _ in 0..SOCIAL_PER_TYPE {
            let mut b = Builder::new(social, ty).unwrap_or_else(|e| panic!("{e}"));
            let root = b.root();
            fill(social, &mut b, root, &mut rng, 3);
            let built = b.finish();
            let src = Source::owned(built.as_bytes());
            let view = MessageView::new(social, src, ty).unwrap_or_else(|e| panic!("{e}"));
            let values = corpus::count_values(&view).unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut wire = Vec::new();
            Encoder::new()
                .encode_into(social, ty, src, &EncodeOptions::default(), &mut wire)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            corpus::verify(social, ty, &wire, values).unwrap_or_else(|e| panic!("{name}: {e}"));
            all.push(Input { ts: social, ty, wire, block: Block::new() });
        }
    }
    let cases = corpus::cases(micro);
    for name in MICRO {
        let case = cases.iter().find(|c| c.name() == name).unwrap_or_else(|| panic!("{name}?"));
        corpus::verify(micro, case.ty, &case.wire, case.values)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        all.push(Input { ts: micro, ty: case.ty, wire: case.wire.clone(), block: Block::new() });
    }
    // The encode pass encodes these owned blocks.
    let mut dec = Decoder::new();
    for input in &mut all {
        dec.decode_into(
            input.ts,
            input.ty,
            &input.wire,
            &DecodeOptions::default(),
            &mut input.block,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
    all
}

/// Reused state, as a server thread keeps it.
#[derive(Default)]
struct Scratch {
    dec: Decoder,
    enc: Encoder,
    block: Block,
    out: Vec<u8>,
}

// The passes are `inline(always)`: each is inlined into the warm-up and into
// its `op_*` function, so callgrind charges the measured calls to `op_*` only.

/// Decodes every input once; returns the block bytes produced.
#[inline(always)]
fn decode_pass(inputs: &[Input<'_>], s: &mut Scratch, opts: &DecodeOptions) -> usize {
    let mut n = 0;
    for i in inputs {
        s.dec
            .decode_into(i.ts, i.ty, black_box(&i.wire), opts, &mut s.block)
            .unwrap_or_else(|e| panic!("{e}"));
        n += black_box(s.block.as_bytes()).len();
    }
    n
}

/// Encodes every input's owned block once; returns the wire bytes produced.
#[inline(always)]
fn encode_pass(inputs: &[Input<'_>], s: &mut Scratch) -> usize {
    let opts = EncodeOptions::default();
    let mut n = 0;
    for i in inputs {
        s.out.clear();
        s.enc
            .encode_into(
                i.ts,
                i.ty,
                Source::owned(black_box(i.block.as_bytes())),
                &opts,
                &mut s.out,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        n += black_box(s.out.as_slice()).len();
    }
    n
}

/// One pass of everything: grows the reused buffers to their final size,
/// so the measured passes do not count first-time allocations.
#[inline(never)]
fn warm_up(inputs: &[Input<'_>], s: &mut Scratch) -> usize {
    decode_pass(inputs, s, &DecodeOptions::default())
        + decode_pass(inputs, s, &DecodeOptions::view())
        + encode_pass(inputs, s)
}

/// Measured: [`ROUNDS`] owned-mode decodes of every input.
#[inline(never)]
fn op_decode_owned(inputs: &[Input<'_>], s: &mut Scratch) -> usize {
    (0..ROUNDS).map(|_| decode_pass(inputs, s, &DecodeOptions::default())).sum()
}

/// Measured: [`ROUNDS`] view-mode (zero-copy) decodes of every input.
#[inline(never)]
fn op_decode_view(inputs: &[Input<'_>], s: &mut Scratch) -> usize {
    (0..ROUNDS).map(|_| decode_pass(inputs, s, &DecodeOptions::view())).sum()
}

/// Measured: [`ROUNDS`] encodes of every input's owned block.
#[inline(never)]
fn op_encode(inputs: &[Input<'_>], s: &mut Scratch) -> usize {
    (0..ROUNDS).map(|_| encode_pass(inputs, s)).sum()
}

fn main() {
    // Compile the schemas on a thread of their own. The compiler and the
    // table lowering use randomly seeded hash maps, so their pattern of
    // allocations and frees differs from run to run; on another thread they
    // allocate from another (glibc) malloc arena, which leaves the main
    // thread's heap, and so the address of every buffer below, identical in
    // every run. That matters: memcpy and memset take alignment-dependent
    // paths, so a buffer that moves changes the instruction count (by ~100
    // instructions per op before this was done).
    let (social, micro) = std::thread::spawn(|| {
        let social = TableSet::from_proto_sources(
            &[ProtoSource { name: SOCIAL_NAME, text: SOCIAL_TEXT }],
            &[SOCIAL_NAME],
        )
        .unwrap_or_else(|e| panic!("{SOCIAL_NAME}: {e}"));
        (social, corpus::tables())
    })
    .join()
    .unwrap_or_else(|_| panic!("schema thread panicked"));
    let inputs = inputs(&social, &micro);
    let wire: usize = inputs.iter().map(|i| i.wire.len()).sum();

    let mut s = Scratch::default();
    black_box(warm_up(&inputs, &mut s));
    let owned = black_box(op_decode_owned(&inputs, &mut s));
    let view = black_box(op_decode_view(&inputs, &mut s));
    let encoded = black_box(op_encode(&inputs, &mut s));
    // The encoder reproduces every input: it wrote the wire bytes back.
    assert_eq!(encoded, wire * ROUNDS, "encode output size");

    println!(
        "inputs {} ({} social, {} micro), {wire} wire bytes",
        inputs.len(),
        SOCIAL_TYPES.len() * SOCIAL_PER_TYPE,
        MICRO.len()
    );
    println!("block bytes per round: owned {}, view {}", owned / ROUNDS, view / ROUNDS);
    println!("messages_per_op {}", inputs.len() * ROUNDS);
}
