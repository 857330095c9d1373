//! The measurements: every sample decoded field by field and one-shot,
//! laid out and encoded, with the host-memory transactions counted and
//! the CPU times measured on this machine. The interconnect model
//! ([`crate::model`]) turns them into time.

use std::time::Instant;

use protoplane_offload::commit::{CommitDecoder, CommitMode};
use protoplane_schema::{FieldFlags, FieldOp, ProtoSource, TableSet};
use protoplane_wire::{
    Block, Builder, DecodeOptions, Decoder, EncodeOptions, Encoder, MessageBuilder, MessageView,
    Source, Value, WriteStats,
};

use crate::dataset::{push_varint, put_len_field, Sample, Workload};
use crate::error::{Error, Result};

/// Median nanoseconds per call of `f`: `rounds` rounds of enough calls to
/// last about `round_ns` each.
pub fn time_ns(rounds: usize, round_ns: f64, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    f();
    let once = t.elapsed().as_nanos().max(1) as f64;
    let iters = ((round_ns / once).ceil() as usize).clamp(1, 1_000_000);
    let mut per = Vec::with_capacity(rounds);
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        per.push(t.elapsed().as_nanos() as f64 / iters as f64);
    }
    per.sort_by(f64::total_cmp);
    per[per.len() / 2]
}

/// How hard to measure.
#[derive(Clone, Copy, Debug)]
pub struct Effort {
    /// Rounds per timing (median taken).
    pub rounds: usize,
    /// Target length of a round, ns.
    pub round_ns: f64,
    /// Temp buffer of the one-shot commit.
    pub temp: usize,
}

impl Effort {
    /// Enough for stable medians.
    pub fn full() -> Effort {
        Effort { rounds: 7, round_ns: 2e6, temp: protoplane_offload::commit::DEFAULT_TEMP }
    }

    /// Quick (tests, `--quick`).
    pub fn quick() -> Effort {
        Effort { rounds: 3, round_ns: 2e5, temp: protoplane_offload::commit::DEFAULT_TEMP }
    }
}

/// One message's decode, both ways.
#[derive(Clone, Debug)]
pub struct DecodeRow {
    /// Group and name.
    pub group: String,
    /// Message name.
    pub name: String,
    /// Wire bytes.
    pub wire_bytes: usize,
    /// Block bytes in host memory, as the one-shot commit laid them out (a
    /// plain decode's block of the same message may differ by a few bytes
    /// of padding: large copies are aligned by address).
    pub block_bytes: usize,
    /// Field-by-field: the decoder's stores into host memory.
    pub field_by_field: WriteStats,
    /// One-shot: the commit's copies.
    pub one_shot: WriteStats,
    /// Measured: the decode alone (into private memory), ns.
    pub decode_ns: f64,
    /// Measured: decode into the temp buffer plus the commit's copies, ns.
    pub one_shot_ns: f64,
}

/// Decodes every sample both ways; checks that both give the plain
/// decode's block.
///
/// # Errors
///
/// [`Error::Sample`] around what went wrong with a sample: it does not
/// decode ([`Error::Decode`]), does not encode back ([`Error::Block`]), or
/// a commit mode gives another message ([`Error::FieldByFieldMismatch`],
/// [`Error::OneShotMismatch`]).
pub fn decode_rows(w: &Workload, e: Effort) -> Result<Vec<DecodeRow>> {
    let mut rows = Vec::new();
    let opts = DecodeOptions::default();
    for (ts, s) in w.samples() {
        rows.push(decode_row(ts, s, &opts, e)?);
    }
    Ok(rows)
}

fn decode_row(ts: &TableSet, s: &Sample, opts: &DecodeOptions, e: Effort) -> Result<DecodeRow> {
    decode_row_checked(ts, s, opts, e).map_err(|x| x.in_sample(&s.group, &s.name))
}

fn decode_row_checked(
    ts: &TableSet,
    s: &Sample,
    opts: &DecodeOptions,
    e: Effort,
) -> Result<DecodeRow> {
    let mut plain = Block::new();
    let mut d = Decoder::new();
    d.decode_into(ts, s.type_index, &s.wire, opts, &mut plain)?;
    let mut cd = CommitDecoder::new();
    let mut host = Vec::new();
    let fbf =
        cd.decode(ts, s.type_index, &s.wire, opts, CommitMode::FieldByField, &mut host, None)?;
    // The same message (large copies are placed by address, so padding
    // may differ between two blocks of one message: compare encodings).
    let encoded = |b: &[u8]| {
        let mut out = Vec::new();
        Encoder::new()
            .encode_into(ts, s.type_index, Source::owned(b), &EncodeOptions::default(), &mut out)
            .map(|()| out)
            .map_err(Error::Block)
    };
    let reference = encoded(plain.as_bytes())?;
    if encoded(&host)? != reference {
        return Err(Error::FieldByFieldMismatch);
    }
    let mode = CommitMode::OneShot { temp: e.temp };
    let one = cd.decode(ts, s.type_index, &s.wire, opts, mode, &mut host, None)?;
    let block_bytes = host.len();
    if encoded(&host)? != reference {
        return Err(Error::OneShotMismatch);
    }
    let decode_ns = time_ns(e.rounds, e.round_ns, || {
        let _ = d.decode_into(ts, s.type_index, &s.wire, opts, &mut plain);
        std::hint::black_box(plain.as_bytes());
    });
    let one_shot_ns = time_ns(e.rounds, e.round_ns, || {
        let _ = cd.decode(ts, s.type_index, &s.wire, opts, mode, &mut host, None);
        std::hint::black_box(&host);
    });
    Ok(DecodeRow {
        group: s.group.clone(),
        name: s.name.clone(),
        wire_bytes: s.wire.len(),
        block_bytes,
        field_by_field: fbf,
        one_shot: one,
        decode_ns,
        one_shot_ns,
    })
}

/// One call an application's generated builder makes (see [`Script`]),
/// with the field's op resolved at record time, as generated code has it
/// in a constant.
#[derive(Clone, Copy, Debug)]
enum Step<'a> {
    /// Set a scalar field to these bits.
    Bits(&'a FieldOp, u64),
    /// Append a scalar element.
    PushBits(&'a FieldOp, u64),
    /// Set a string / bytes field.
    Bytes(&'a FieldOp, &'a [u8]),
    /// Append a string / bytes element.
    PushBytes(&'a FieldOp, &'a [u8]),
    /// Open a sub-message field (of type `sub`); later steps fill it.
    Open(&'a FieldOp, u32),
    /// Back to the parent message.
    Close,
}

/// A response as an application holds it, as the calls its generated
/// builders make: `set_bits` / `set_bytes` / `push_*` / `open` with the
/// field's precomputed op, no lookup by number or name. Recorded once from
/// a message; replaying it is what laying the response out costs.
#[derive(Debug)]
pub struct Script<'a> {
    type_index: u32,
    steps: Vec<Step<'a>>,
    depth: usize,
}

fn bits(v: &Value<'_>) -> u64 {
    match *v {
        Value::Bool(b) => u64::from(b),
        Value::I32(x) | Value::Enum(x) => x as u32 as u64,
        Value::I64(x) => x as u64,
        Value::U32(x) => u64::from(x),
        Value::U64(x) => x,
        Value::F32(x) => u64::from(x.to_bits()),
        Value::F64(x) => x.to_bits(),
        _ => 0,
    }
}

impl<'a> Script<'a> {
    /// Records the builder calls that lay out the message `view` holds.
    ///
    /// # Errors
    ///
    /// [`Error::Block`] when the block behind `view` is malformed;
    /// [`Error::FieldWithoutOp`] when its tables are inconsistent.
    pub fn record(view: MessageView<'a>) -> Result<Script<'a>> {
        let mut steps = Vec::new();
        let depth = Self::walk(view, &mut steps)?;
        Ok(Script { type_index: view.type_index(), steps, depth })
    }

    /// Records `view`'s calls; returns the deepest nesting below it.
    fn walk(view: MessageView<'a>, steps: &mut Vec<Step<'a>>) -> Result<usize> {
        let ts = view.tables();
        let ops = ts.ops(ts.message(view.type_index()));
        let mut depth = 0;
        for (i, f) in view.fields().iter().enumerate() {
            let op = ops.get(i).ok_or(Error::FieldWithoutOp)?;
            let mut open = |m: MessageView<'a>, steps: &mut Vec<Step<'a>>| {
                steps.push(Step::Open(op, f.sub));
                let d = Self::walk(m, steps)?;
                steps.push(Step::Close);
                depth = depth.max(d + 1);
                Ok::<(), Error>(())
            };
            if f.is_repeated() {
                for v in view.repeated(f)?.iter() {
                    match v? {
                        Value::Message(m) => open(m, steps)?,
                        Value::String(x) | Value::Bytes(x) => steps.push(Step::PushBytes(op, x)),
                        v => steps.push(Step::PushBits(op, bits(&v))),
                    }
                }
            } else if view.has(f) {
                match view.get(f)? {
                    Some(Value::Message(m)) => open(m, steps)?,
                    Some(Value::String(x) | Value::Bytes(x)) => steps.push(Step::Bytes(op, x)),
                    Some(v) => steps.push(Step::Bits(op, bits(&v))),
                    None => {}
                }
            }
        }
        Ok(depth)
    }

    /// Lays the response out; `string` / `bytes` values of at least
    /// `leave` bytes are left out (the engine copies them: memcpy offload).
    ///
    /// # Errors
    ///
    /// [`Error::Build`] when a builder refuses a call (`ts` is not the
    /// script's schema); [`Error::UnbalancedScript`].
    pub fn lay_out(&self, ts: &TableSet, leave: usize) -> Result<Block> {
        self.lay_out_into(ts, leave, Block::new(), &mut Vec::new())
    }

    /// [`Self::lay_out`] into `block`'s memory (what an attached
    /// application does: its builders write into chunks the engine lends
    /// it, no allocation per response), with `stack` as scratch.
    ///
    /// # Errors
    ///
    /// As [`Self::lay_out`].
    pub fn lay_out_into(
        &self,
        ts: &TableSet,
        leave: usize,
        block: Block,
        stack: &mut Vec<MessageBuilder>,
    ) -> Result<Block> {
        let mut b = Builder::reuse(ts, self.type_index, block)?;
        stack.clear();
        stack.reserve(self.depth + 1);
        let mut at = b.root();
        for step in &self.steps {
            match *step {
                Step::Bits(op, v) => b.set_bits(at, op, v),
                Step::PushBits(op, v) => b.push_bits(at, op, v)?,
                Step::Bytes(op, d) if d.len() < leave => b.set_bytes(at, op, d)?,
                Step::PushBytes(op, d) if d.len() < leave => b.push_bytes(at, op, d)?,
                Step::Bytes(..) | Step::PushBytes(..) => {}
                Step::Open(op, sub) => {
                    stack.push(at);
                    at = b.open(at, op, sub)?;
                }
                Step::Close => at = stack.pop().ok_or(Error::UnbalancedScript)?,
            }
        }
        Ok(b.finish())
    }
}

/// One message's encode side.
#[derive(Clone, Debug)]
pub struct EncodeRow {
    /// Group.
    pub group: String,
    /// Message name.
    pub name: String,
    /// Measured: laying the message out with a builder (pre-serialization), ns.
    pub lay_out_ns: f64,
    /// Measured: the same, leaving `string` / `bytes` values of at least
    /// [`LARGE`] bytes to the engine (memcpy offload), ns.
    pub lay_out_small_ns: f64,
    /// Measured: the engine's copies of those large values, ns.
    pub large_copy_ns: f64,
    /// Measured: encoding the laid-out block, ns.
    pub encode_ns: f64,
    /// A device that encodes by reading the host block one item at a time:
    /// the reads (as many as a field-by-field layout has stores).
    pub device_reads: WriteStats,
    /// Co-serialization: the engine pulls the block in temp-buffer copies.
    pub block_pull: WriteStats,
}

/// Values at least this long are copied by the engine in the memcpy
/// offload scheme.
pub const LARGE: usize = 256;

/// Lays out and encodes every sample; checks that the encoding of the
/// laid-out block is the sample's wire bytes (HyperProtoBench's are
/// canonical; other inputs are checked to decode to the same block).
///
/// # Errors
///
/// [`Error::Sample`] around what went wrong with a sample: it does not
/// decode ([`Error::Decode`]), its block does not read or encode
/// ([`Error::Block`]), a builder refuses it ([`Error::Build`]), or the
/// laid-out block is another message ([`Error::LayOutMismatch`]).
pub fn encode_rows(w: &Workload, e: Effort) -> Result<Vec<EncodeRow>> {
    let opts = DecodeOptions::default();
    w.samples()
        .map(|(ts, s)| encode_row(ts, s, &opts, e).map_err(|x| x.in_sample(&s.group, &s.name)))
        .collect()
}

fn encode_row(ts: &TableSet, s: &Sample, opts: &DecodeOptions, e: Effort) -> Result<EncodeRow> {
    let block = protoplane_wire::decode(ts, s.type_index, &s.wire, opts)?;
    let view = MessageView::new(ts, Source::owned(block.as_bytes()), s.type_index)?;
    let script = Script::record(view)?;
    let laid = script.lay_out(ts, usize::MAX)?;
    let mut enc = Encoder::new();
    let mut encoded = |b: &[u8]| -> Result<Vec<u8>> {
        let mut out = Vec::new();
        enc.encode_into(ts, s.type_index, Source::owned(b), &EncodeOptions::default(), &mut out)?;
        Ok(out)
    };
    if encoded(laid.as_bytes())? != encoded(block.as_bytes())? {
        return Err(Error::LayOutMismatch);
    }
    let mut out = Vec::new();
    // Into reused memory, as generated builders in an attached
    // application write into lent chunks: the layout, not malloc.
    let (mut reused, mut stack) = (Some(Block::new()), Vec::new());
    let mut lay = |leave: usize| {
        let block = reused.take().unwrap_or_default();
        let laid = script.lay_out_into(ts, leave, block, &mut stack);
        reused = laid.ok().map(std::hint::black_box);
    };
    let lay_out_ns = time_ns(e.rounds, e.round_ns, || lay(usize::MAX));
    let lay_out_small_ns = time_ns(e.rounds, e.round_ns, || lay(LARGE));
    let big: Vec<&[u8]> = large_values(view);
    let mut sink = Vec::with_capacity(big.iter().map(|b| b.len()).sum());
    let large_copy_ns = time_ns(e.rounds, e.round_ns, || {
        sink.clear();
        for b in &big {
            sink.extend_from_slice(b);
        }
        std::hint::black_box(&sink);
    });
    let encode_ns = time_ns(e.rounds, e.round_ns, || {
        out.clear();
        let _ = enc.encode_into(
            ts,
            s.type_index,
            Source::owned(laid.as_bytes()),
            &EncodeOptions::default(),
            &mut out,
        );
        std::hint::black_box(&out);
    });
    let mut host = Vec::new();
    let device_reads = CommitDecoder::new().decode(
        ts,
        s.type_index,
        &s.wire,
        opts,
        CommitMode::FieldByField,
        &mut host,
        None,
    )?;
    // The engine pulls the laid-out block as a one-shot commit pushes
    // one: temp-buffer copies, long values on their own.
    let block_pull = CommitDecoder::new().decode(
        ts,
        s.type_index,
        &s.wire,
        opts,
        CommitMode::OneShot { temp: e.temp },
        &mut host,
        None,
    )?;
    Ok(EncodeRow {
        group: s.group.clone(),
        name: s.name.clone(),
        lay_out_ns,
        lay_out_small_ns,
        large_copy_ns,
        encode_ns,
        device_reads,
        block_pull,
    })
}

fn large_values<'a>(view: MessageView<'a>) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    for f in view.fields() {
        let mut one = |v: Value<'a>| match v {
            Value::String(x) | Value::Bytes(x) if x.len() >= LARGE => out.push(x),
            Value::Message(m) => out.extend(large_values(m)),
            _ => {}
        };
        if f.is_repeated() {
            if let Ok(r) = view.repeated(f) {
                for v in r.iter().flatten() {
                    one(v);
                }
            }
        } else if let Ok(Some(v)) = view.get(f) {
            one(v);
        }
    }
    out
}

/// One nesting depth of the nested-message experiment (RPCAcc Fig. 2).
#[derive(Clone, Debug)]
pub struct NestedRow {
    /// Levels of nesting around the payload (0: flat).
    pub depth: u32,
    /// Wire bytes.
    pub wire_bytes: usize,
    /// Field-by-field stores.
    pub field_by_field: WriteStats,
    /// One-shot copies.
    pub one_shot: WriteStats,
    /// Measured decode, ns.
    pub decode_ns: f64,
    /// Measured one-shot decode and commit, ns.
    pub one_shot_ns: f64,
}

/// The same fields — [`NESTED_UNITS`] units of eight integers and a
/// 64-byte string — in one flat message, or spread evenly over a chain of
/// `depth + 1` nested messages, for each depth in `depths` (depths that
/// do not divide the units evenly are skipped).
///
/// # Errors
///
/// [`Error::Schema`] or [`Error::UnknownType`] if the experiment's schema
/// does not load (a bug); [`Error::Sample`] as [`decode_rows`].
pub fn nested(depths: &[u32], e: Effort) -> Result<Vec<NestedRow>> {
    const PROTO: &str = r#"
syntax = "proto3";
package protoplane.nested;
message L {
  repeated uint64 v = 1 [packed = false];
  repeated string s = 2;
  L child = 3;
}
"#;
    let ts = TableSet::from_proto_sources(
        &[ProtoSource { name: "nested.proto", text: PROTO }],
        &["nested.proto"],
    )?;
    let root = ts.message_by_name("protoplane.nested.L").ok_or_else(|| Error::UnknownType {
        schema: "nested-message experiment".to_owned(),
        name: "protoplane.nested.L".to_owned(),
    })?;
    let mut rows = Vec::new();
    for &depth in depths {
        let levels = depth + 1;
        if NESTED_UNITS % levels != 0 {
            continue;
        }
        let per = NESTED_UNITS / levels;
        let mut inner = Vec::new();
        for l in (0..levels).rev() {
            let mut msg = Vec::new();
            for u in 0..per {
                for i in 0..8u64 {
                    push_varint(&mut msg, 1 << 3);
                    push_varint(&mut msg, (u64::from(l) * 1000 + u64::from(u) * 10 + i) * 7919);
                }
                put_len_field(&mut msg, 2, &[b'p'; 64]);
            }
            if l + 1 < levels {
                put_len_field(&mut msg, 3, &inner);
            }
            inner = msg;
        }
        let s = Sample {
            group: "nested".into(),
            name: format!("depth-{depth}"),
            type_index: root,
            wire: inner,
        };
        let r = decode_row(&ts, &s, &DecodeOptions::default(), e)?;
        rows.push(NestedRow {
            depth,
            wire_bytes: r.wire_bytes,
            field_by_field: r.field_by_field,
            one_shot: r.one_shot,
            decode_ns: r.decode_ns,
            one_shot_ns: r.one_shot_ns,
        });
    }
    Ok(rows)
}

/// Units of payload in the nested-message experiment.
pub const NESTED_UNITS: u32 = 16;

/// Whether a field is device-placed (for callers that lay out with
/// placement).
pub fn device_placed(f: &protoplane_schema::Field) -> bool {
    f.flags.has(FieldFlags::DEVICE)
}
