//! Per-field decode throughput on engine workers against one application
//! core (PsPIN, "protobuf deserialization on SmartNIC packet handlers").
//!
//! PsPIN measures how many fields per second its packet handlers decode,
//! one field type at a time, and how that scales with the number of cores
//! decoding. This module does the same with the table-driven decoder of
//! `protoplane-wire` on the host's cores:
//!
//! - **`app-core`**: the caller's thread decodes every message, one
//!   [`Decoder`] and one [`Block`] reused throughout (the application doing
//!   its own decoding);
//! - **`engine-workers`** with N workers: N threads share one pre-generated
//!   message set, each decoding its contiguous share with its own decoder
//!   into its own output block (the engine writing decoded messages
//!   straight into host memory). Throughput is all fields the workers
//!   decoded over the wall time from the start barrier to the last
//!   worker's end.
//!
//! # Message shapes
//!
//! Every message is made of one field type only, like PsPIN's: it has
//! [`FIELDS_PER_MESSAGE`] (15) *singular* proto3 fields numbered 1..=15,
//! all of the case's type, all present. Singular fields rather than an
//! unpacked `repeated` field because then every field occurrence costs
//! exactly what a field costs — read a tag, find the field, read the value,
//! store it in its slot and set its presence bit — with no array growth
//! mixed in, and because a message of several fields of one type is what a
//! real schema looks like. Fifteen because field numbers 1..=15 all have
//! one-byte tags, so the wire size of a field is exactly 1 + its value's
//! encoding and every message of a case has the same length.
//!
//! | case | type | one field on the wire |
//! |------|------|-----------------------|
//! | `varint-L` (L = 2..=10) | `uint64` | tag + an L-byte varint |
//! | `float` | `float` | tag + 4 bytes |
//! | `double` | `double` | tag + 8 bytes |
//! | `string-B` (B = 8, 16, 1024) | `string` (ASCII) | tag + length varint + B bytes |
//!
//! The values come from a seeded xorshift generator, so a run is
//! reproducible. Before anything is timed, every message of a set is
//! decoded once and compared with what was generated (every field present,
//! every value equal, no unknown fields); each measured decoder's last
//! output is checked again afterwards. A mismatch makes [`run`] fail.
//!
//! # Measurement
//!
//! A *measurement* decodes rounds over the message set (each worker over
//! its share) until [`PerFieldOptions::min_time`] has passed, after one
//! untimed warm-up round. Each measurement is *fresh*: new threads, new
//! decoders, new blocks. The points of a case (app-core, then each worker
//! count) are measured in turn, [`PerFieldOptions::repetitions`] times
//! over, and each row reports the median repetition — the machine is
//! shared and noisy, so single numbers drift.
//!
//! [`route`] is PsPIN's other half: which messages the engine decodes at
//! all.

use std::fmt::Write as _;
use std::ops::Range;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use protoplane_schema::{compile_proto_sources, ProtoSource, TableSet};
use protoplane_wire::{Block, DecodeOptions, Decoder, MessageView, Source, Value};

use crate::error::{Error, Mismatch, Result};

/// Fields in every generated message (numbers 1..=15: one-byte tags).
pub const FIELDS_PER_MESSAGE: usize = 15;

/// Scheme name of the application core decoding everything itself.
pub const APP_CORE: &str = "app-core";

/// Scheme name of engine worker threads decoding shares of the messages.
pub const ENGINE_WORKERS: &str = "engine-workers";

/// Largest message set [`run`] generates for one case (bytes of wire).
const MAX_SET_BYTES: usize = 1 << 30;

/// Rounds over a share are batched so that the clock is read about once
/// per this many messages, whatever the share's size.
const MESSAGES_PER_CLOCK_CHECK: usize = 256;

/// The package of the generated schema.
const PACKAGE: &str = "perfield";

/// What to measure.
#[derive(Clone, Debug)]
pub struct PerFieldOptions {
    /// Worker counts of the `engine-workers` scheme, e.g. `[1, 2]` (each at
    /// least 1). Counts above the machine's parallelism are run as asked
    /// (oversubscribed).
    pub workers: Vec<usize>,
    /// Messages per case in one round (the shared message set); at least
    /// the largest worker count, so that every worker has a share. The set
    /// takes `messages` × the case's message size bytes (about 15 KiB per
    /// message for `string-1024`).
    pub messages: usize,
    /// Minimum duration of one measurement.
    pub min_time: Duration,
    /// Fresh measurements per point; each row is their median (at least 1).
    pub repetitions: usize,
    /// The cases, each one field type ([`Case::all`] for PsPIN's set).
    pub cases: Vec<Case>,
}

impl Default for PerFieldOptions {
    /// Workers 1..=available parallelism, 1000 messages, 100 ms per
    /// measurement, 5 repetitions, every case.
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        PerFieldOptions {
            workers: (1..=cores).collect(),
            messages: 1000,
            min_time: Duration::from_millis(100),
            repetitions: 5,
            cases: Case::all(),
        }
    }
}

/// One field type to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Case {
    /// `uint64` values whose varint encoding takes this many bytes
    /// (1..=10; [`Case::all`] uses PsPIN's 2..=10).
    Varint(u8),
    /// `float` (fixed 4 bytes).
    Float,
    /// `double` (fixed 8 bytes).
    Double,
    /// `string` values of this many ASCII bytes (at least 1).
    String(usize),
}

impl Case {
    /// PsPIN's cases: varints of 2..=10 bytes, `float`, `double` and
    /// strings of 8 bytes, 16 bytes and 1 KiB.
    pub fn all() -> Vec<Case> {
        let mut v: Vec<Case> = (2..=10).map(Case::Varint).collect();
        v.extend([Case::Float, Case::Double, Case::String(8), Case::String(16)]);
        v.push(Case::String(1024));
        v
    }

    /// The case's name: `varint-4`, `float`, `double`, `string-1024`
    /// (what [`Case::from_str`](std::str::FromStr) parses back).
    pub fn name(&self) -> String {
        match *self {
            Case::Varint(n) => format!("varint-{n}"),
            Case::Float => "float".to_owned(),
            Case::Double => "double".to_owned(),
            Case::String(n) => format!("string-{n}"),
        }
    }

    /// Bytes one field of this case takes on the wire (tag included).
    pub fn field_wire_len(&self) -> usize {
        1 + match *self {
            Case::Varint(n) => n as usize,
            Case::Float => 4,
            Case::Double => 8,
            Case::String(n) => varint_len(n as u64) + n,
        }
    }

    /// Bytes one message of this case takes on the wire.
    pub fn message_wire_len(&self) -> usize {
        FIELDS_PER_MESSAGE * self.field_wire_len()
    }

    /// The generated message type holding this case.
    fn message_name(&self) -> &'static str {
        match self {
            Case::Varint(_) => "Varint",
            Case::Float => "Float",
            Case::Double => "Double",
            Case::String(_) => "Str",
        }
    }

    fn check(&self) -> Result<()> {
        match *self {
            Case::Varint(n) if !(1..=10).contains(&n) => Err(Error::InvalidCase(*self)),
            Case::String(0) => Err(Error::InvalidCase(*self)),
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl std::str::FromStr for Case {
    type Err = Error;

    /// Parses a [`Case::name`]: `varint-N`, `float`, `double`, `string-N`
    /// ([`Error::UnknownCase`] otherwise, [`Error::InvalidCase`] for a
    /// varint of other than 1..=10 bytes or `string-0`).
    fn from_str(s: &str) -> Result<Case> {
        let bad = || Error::UnknownCase(s.to_owned());
        let case = match s {
            "float" => Case::Float,
            "double" => Case::Double,
            _ => {
                if let Some(n) = s.strip_prefix("varint-") {
                    Case::Varint(n.parse().map_err(|_| bad())?)
                } else if let Some(n) = s.strip_prefix("string-") {
                    Case::String(n.parse().map_err(|_| bad())?)
                } else {
                    return Err(bad());
                }
            }
        };
        case.check()?;
        Ok(case)
    }
}

/// One measured point: a case, a scheme and a worker count.
#[derive(Clone, Debug, PartialEq)]
pub struct PerFieldRow {
    /// [`Case::name`].
    pub case: String,
    /// [`APP_CORE`] or [`ENGINE_WORKERS`].
    pub scheme: String,
    /// Decoding threads (1 for [`APP_CORE`]).
    pub workers: usize,
    /// Decoded field occurrences per second (median repetition).
    pub fields_per_s: f64,
    /// Wire bytes decoded per second (same repetition).
    pub bytes_per_s: f64,
    /// Messages decoded per second (same repetition).
    pub messages_per_s: f64,
}

/// Measures every case of `opts` under `app-core` and under
/// `engine-workers` with each worker count, in that order per case.
///
/// # Errors
///
/// Fails on invalid options — a worker count of 0
/// ([`Error::ZeroWorkers`]), fewer messages than workers
/// ([`Error::TooFewMessages`]), no repetitions ([`Error::NoRepetitions`]),
/// a case out of range ([`Error::InvalidCase`], [`Error::SetTooLarge`]) —
/// and when any decode fails ([`Error::Decode`]) or any decoded message
/// differs from what was generated ([`Error::Verify`]).
pub fn run(opts: &PerFieldOptions) -> Result<Vec<PerFieldRow>> {
    check_options(opts)?;
    let tables = schema()?;
    let mut rows = Vec::new();
    for &case in &opts.cases {
        let set = MessageSet::generate(&tables, case, opts.messages)?;
        for i in 0..set.len() {
            let block = protoplane_wire::decode(
                &tables,
                set.type_index,
                set.message(i),
                &DecodeOptions::default(),
            )
            .map_err(|source| Error::Decode { case, message: i, source })?;
            set.verify(&tables, i, &block)?;
        }
        let mut points = vec![(APP_CORE, 1)];
        points.extend(opts.workers.iter().map(|&n| (ENGINE_WORKERS, n)));
        let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); points.len()];
        for _ in 0..opts.repetitions {
            for (&(scheme, n), out) in points.iter().zip(samples.iter_mut()) {
                out.push(if scheme == APP_CORE {
                    app_core(&tables, &set, opts.min_time)?
                } else {
                    engine_workers(&tables, &set, n, opts.min_time)?
                });
            }
        }
        for ((scheme, n), s) in points.into_iter().zip(samples) {
            let m = median(s).ok_or(Error::NoRepetitions)?;
            rows.push(PerFieldRow {
                case: case.name(),
                scheme: scheme.to_owned(),
                workers: n,
                fields_per_s: m.messages as f64 * FIELDS_PER_MESSAGE as f64 / m.secs,
                bytes_per_s: m.bytes as f64 / m.secs,
                messages_per_s: m.messages as f64 / m.secs,
            });
        }
    }
    Ok(rows)
}

/// Scaling of `engine-workers` on `case`: fields/s with `n` workers over
/// fields/s with one worker (`None` when either row is missing).
pub fn scaling(rows: &[PerFieldRow], case: &str, n: usize) -> Option<f64> {
    let at = |w: usize| {
        rows.iter()
            .find(|r| r.case == case && r.scheme == ENGINE_WORKERS && r.workers == w)
            .map(|r| r.fields_per_s)
    };
    Some(at(n)? / at(1)?)
}

/// The rows as a plain-text table (Mfields/s, MB/s, Mmsg/s and the
/// scaling over one worker for `engine-workers` rows).
pub fn table(rows: &[PerFieldRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<12} {:<15} {:>7} {:>11} {:>10} {:>9} {:>7}",
        "case", "scheme", "workers", "Mfields/s", "MB/s", "Mmsg/s", "scaling"
    );
    for r in rows {
        let scale = match (r.scheme == ENGINE_WORKERS).then(|| scaling(rows, &r.case, r.workers)) {
            Some(Some(x)) => format!("{x:.2}"),
            _ => "-".to_owned(),
        };
        let _ = writeln!(
            s,
            "{:<12} {:<15} {:>7} {:>11.2} {:>10.1} {:>9.3} {:>7}",
            r.case,
            r.scheme,
            r.workers,
            r.fields_per_s / 1e6,
            r.bytes_per_s / 1e6,
            r.messages_per_s / 1e6,
            scale
        );
    }
    s
}

/// Where a received message is decoded (PsPIN's policy).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// Decoded by the engine's workers; the application gets the block.
    Engine,
    /// Handed to the application as raw wire bytes, decoded there.
    RawToApp,
}

/// PsPIN's policy: a message of at most `threshold` bytes is decoded by the
/// engine's workers ([`Route::Engine`]); a larger one is handed to the
/// application raw ([`Route::RawToApp`]), since it would hold a worker (and
/// its small local memory) for long while gaining little per byte. A
/// threshold of 0 sends every non-empty message to the application;
/// `usize::MAX` sends everything to the engine.
pub fn route(len: usize, threshold: usize) -> Route {
    if len <= threshold {
        Route::Engine
    } else {
        Route::RawToApp
    }
}

fn check_options(opts: &PerFieldOptions) -> Result<()> {
    if opts.workers.contains(&0) {
        return Err(Error::ZeroWorkers);
    }
    if opts.repetitions == 0 {
        return Err(Error::NoRepetitions);
    }
    let most = opts.workers.iter().copied().max().unwrap_or(1);
    if opts.messages < most {
        return Err(Error::TooFewMessages { messages: opts.messages, workers: most });
    }
    for case in &opts.cases {
        case.check()?;
        let bytes = case.message_wire_len().saturating_mul(opts.messages);
        if bytes > MAX_SET_BYTES {
            return Err(Error::SetTooLarge {
                case: *case,
                messages: opts.messages,
                bytes,
                limit: MAX_SET_BYTES,
            });
        }
    }
    Ok(())
}

/// The `.proto` text of the measured schema (package `perfield`): one
/// message type per field type — `Varint` (`uint64`), `Float`, `Double`,
/// `Str` (`string`) — each with fields `f1 = 1` … `f15 = 15`.
pub fn proto_text() -> String {
    let mut s = format!("syntax = \"proto3\";\npackage {PACKAGE};\n");
    for (name, ty) in
        [("Varint", "uint64"), ("Float", "float"), ("Double", "double"), ("Str", "string")]
    {
        let _ = writeln!(s, "message {name} {{");
        for n in 1..=FIELDS_PER_MESSAGE {
            let _ = writeln!(s, "  {ty} f{n} = {n};");
        }
        s.push_str("}\n");
    }
    s
}

/// [`proto_text`] compiled (with `compile_proto_sources`) into tables.
///
/// # Errors
///
/// [`Error::Schema`] if it does not compile or load (a bug).
pub fn schema() -> Result<TableSet> {
    let text = proto_text();
    let name = "perfield.proto";
    let set = compile_proto_sources(&[ProtoSource { name, text: &text }], &[name])?;
    Ok(TableSet::from_file_descriptor_set(&set)?)
}

/// A value as generated, to check a decoded one against.
#[derive(Clone, Copy, Debug)]
enum Expect {
    U64(u64),
    F32(u32),
    F64(u64),
    /// Offset and length of the string's bytes in the set's wire.
    Str(usize, usize),
}

/// The generated messages of one case, back to back in one buffer, with
/// the values they carry (to check decoded blocks against).
#[derive(Debug)]
pub struct MessageSet {
    case: Case,
    type_index: u32,
    wire: Vec<u8>,
    /// Message `i` is `wire[starts[i]..starts[i + 1]]`.
    starts: Vec<usize>,
    /// [`FIELDS_PER_MESSAGE`] values per message, in field order.
    expect: Vec<Expect>,
}

impl MessageSet {
    /// Generates `messages` messages of `case` (deterministic: the values
    /// depend only on the case and the count) for the tables of [`schema`].
    ///
    /// # Errors
    ///
    /// [`Error::MissingMessageType`] when `tables` are not [`schema`]'s;
    /// [`Error::Generation`] if the generator goes wrong (a bug).
    pub fn generate(tables: &TableSet, case: Case, messages: usize) -> Result<MessageSet> {
        let full = format!("{PACKAGE}.{}", case.message_name());
        let type_index = tables.message_by_name(&full).ok_or(Error::MissingMessageType(full))?;
        let mut rng = XorShift::new(seed(&case.name()));
        let mut wire = Vec::with_capacity(messages * case.message_wire_len());
        let mut starts = Vec::with_capacity(messages + 1);
        let mut expect = Vec::with_capacity(messages * FIELDS_PER_MESSAGE);
        for _ in 0..messages {
            starts.push(wire.len());
            for n in 1..=FIELDS_PER_MESSAGE as u64 {
                match case {
                    Case::Varint(len) => {
                        let bits = 7 * u32::from(len);
                        let lo = if len == 1 { 1 } else { 1u64 << (bits - 7) };
                        let hi = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
                        let v = lo + rng.next() % (hi - lo + 1);
                        put_varint(&mut wire, n << 3);
                        let at = wire.len();
                        put_varint(&mut wire, v);
                        if wire.len() - at != len as usize {
                            return Err(Error::Generation { case, what: "a varint" });
                        }
                        expect.push(Expect::U64(v));
                    }
                    Case::Float => {
                        let v = (rng.unit() * 2e6 - 1e6) as f32;
                        put_varint(&mut wire, n << 3 | 5);
                        wire.extend_from_slice(&v.to_le_bytes());
                        expect.push(Expect::F32(v.to_bits()));
                    }
                    Case::Double => {
                        let v = rng.unit() * 2e12 - 1e12;
                        put_varint(&mut wire, n << 3 | 1);
                        wire.extend_from_slice(&v.to_le_bytes());
                        expect.push(Expect::F64(v.to_bits()));
                    }
                    Case::String(len) => {
                        put_varint(&mut wire, n << 3 | 2);
                        put_varint(&mut wire, len as u64);
                        let at = wire.len();
                        wire.extend((0..len).map(|_| b'a' + (rng.next() % 26) as u8));
                        expect.push(Expect::Str(at, len));
                    }
                }
            }
            if wire.len() - starts.last().copied().unwrap_or(0) != case.message_wire_len() {
                return Err(Error::Generation { case, what: "a message" });
            }
        }
        starts.push(wire.len());
        Ok(MessageSet { case, type_index, wire, starts, expect })
    }

    /// The case the messages are made of.
    pub fn case(&self) -> Case {
        self.case
    }

    /// The message type to decode them as.
    pub fn type_index(&self) -> u32 {
        self.type_index
    }

    /// Number of messages.
    pub fn len(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// No messages.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wire bytes of message `i` (panics when `i >= len()`).
    pub fn message(&self, i: usize) -> &[u8] {
        &self.wire[self.starts[i]..self.starts[i + 1]]
    }

    fn bytes(&self, range: Range<usize>) -> u64 {
        (self.starts[range.end] - self.starts[range.start]) as u64
    }

    /// Checks that `block` holds message `i` exactly: all
    /// [`FIELDS_PER_MESSAGE`] fields present with their generated values,
    /// no unknown fields.
    ///
    /// # Errors
    ///
    /// [`Error::Verify`] with what differs.
    pub fn verify(&self, tables: &TableSet, i: usize, block: &Block) -> Result<()> {
        let err = |mismatch: Mismatch| Error::Verify { case: self.case, message: i, mismatch };
        let view = MessageView::new(tables, Source::owned(block.as_bytes()), self.type_index)
            .map_err(|e| err(Mismatch::View(e)))?;
        let expect = self
            .expect
            .get(i * FIELDS_PER_MESSAGE..(i + 1) * FIELDS_PER_MESSAGE)
            .ok_or_else(|| err(Mismatch::NoSuchMessage))?;
        let mut decoded = 0;
        for f in view.fields() {
            let Some(value) =
                view.get(f).map_err(|error| err(Mismatch::Field { number: f.number, error }))?
            else {
                continue;
            };
            let want = (f.number as usize).checked_sub(1).and_then(|k| expect.get(k));
            let ok = match (want, value) {
                (Some(&Expect::U64(w)), Value::U64(v)) => v == w,
                (Some(&Expect::F32(w)), Value::F32(v)) => v.to_bits() == w,
                (Some(&Expect::F64(w)), Value::F64(v)) => v.to_bits() == w,
                (Some(&Expect::Str(at, len)), Value::String(v)) => {
                    self.wire.get(at..at + len) == Some(v)
                }
                _ => false,
            };
            if !ok {
                return Err(err(Mismatch::Value {
                    number: f.number,
                    decoded: format!("{value:?}"),
                }));
            }
            decoded += 1;
        }
        if decoded != FIELDS_PER_MESSAGE {
            return Err(err(Mismatch::FieldCount { decoded, sent: FIELDS_PER_MESSAGE }));
        }
        let unknown =
            view.unknown_fields().map_err(|e| err(Mismatch::UnknownFieldsUnreadable(e)))?;
        if !unknown.is_empty() {
            return Err(err(Mismatch::UnknownFields { bytes: unknown.len() }));
        }
        Ok(())
    }
}

/// One measurement.
#[derive(Clone, Copy, Debug)]
struct Sample {
    messages: u64,
    bytes: u64,
    secs: f64,
}

/// The repetition with the median message rate (the upper one of two).
fn median(mut samples: Vec<Sample>) -> Option<Sample> {
    samples.sort_by(|a, b| (a.messages as f64 / a.secs).total_cmp(&(b.messages as f64 / b.secs)));
    samples.get(samples.len() / 2).copied()
}

/// One decoding thread's state: its decoder and its output block.
#[derive(Debug, Default)]
struct Lane {
    decoder: Decoder,
    block: Block,
}

impl Lane {
    /// One untimed pass over `share`: sizes the block, warms the caches.
    fn warm_up(&mut self, tables: &TableSet, set: &MessageSet, share: &Range<usize>) -> Result<()> {
        self.rounds(tables, set, share, 1)
    }

    fn rounds(
        &mut self,
        tables: &TableSet,
        set: &MessageSet,
        share: &Range<usize>,
        rounds: usize,
    ) -> Result<()> {
        let opts = DecodeOptions::default();
        for _ in 0..rounds {
            for i in share.clone() {
                self.decoder
                    .decode_into(tables, set.type_index, set.message(i), &opts, &mut self.block)
                    .map_err(|source| Error::Decode { case: set.case, message: i, source })?;
                std::hint::black_box(&self.block);
            }
        }
        Ok(())
    }

    /// Decodes rounds over `share` until `min_time` has passed since
    /// `start`; returns the messages decoded and when it stopped. The block
    /// then holds the share's last message, which is checked.
    fn timed(
        &mut self,
        tables: &TableSet,
        set: &MessageSet,
        share: &Range<usize>,
        min_time: Duration,
        start: Instant,
    ) -> Result<(u64, Instant)> {
        let len = share.len();
        let batch = (MESSAGES_PER_CLOCK_CHECK / len.max(1)).max(1);
        let mut rounds = 0u64;
        let end = loop {
            self.rounds(tables, set, share, batch)?;
            rounds += batch as u64;
            let now = Instant::now();
            if now.duration_since(start) >= min_time {
                break now;
            }
        };
        set.verify(tables, share.end - 1, &self.block)?;
        Ok((rounds * len as u64, end))
    }
}

/// The caller's thread decodes every message.
fn app_core(tables: &TableSet, set: &MessageSet, min_time: Duration) -> Result<Sample> {
    let share = 0..set.len();
    let mut lane = Lane::default();
    lane.warm_up(tables, set, &share)?;
    let start = Instant::now();
    let (messages, end) = lane.timed(tables, set, &share, min_time, start)?;
    let rounds = messages / share.len() as u64;
    Ok(Sample {
        messages,
        bytes: rounds * set.bytes(share),
        secs: end.duration_since(start).as_secs_f64(),
    })
}

/// `n` fresh worker threads decode contiguous shares of the set, each with
/// its own decoder into its own block, started together by a barrier.
fn engine_workers(
    tables: &TableSet,
    set: &MessageSet,
    n: usize,
    min_time: Duration,
) -> Result<Sample> {
    let total = set.len();
    let barrier = Barrier::new(n);
    let results: Vec<Result<(u64, u64, Instant, Instant)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|w| {
                let share = w * total / n..(w + 1) * total / n;
                let barrier = &barrier;
                s.spawn(move || {
                    let mut lane = Lane::default();
                    let warm = lane.warm_up(tables, set, &share);
                    // Everyone reaches the barrier, even after a failure,
                    // or the others would wait forever.
                    barrier.wait();
                    warm?;
                    let start = Instant::now();
                    let (messages, end) = lane.timed(tables, set, &share, min_time, start)?;
                    let rounds = messages / share.len() as u64;
                    Ok((messages, rounds * set.bytes(share), start, end))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(Err(Error::WorkerPanicked))).collect()
    });
    let mut sample = Sample { messages: 0, bytes: 0, secs: 0.0 };
    let mut span: Option<(Instant, Instant)> = None;
    for r in results {
        let (messages, bytes, start, end) = r?;
        sample.messages += messages;
        sample.bytes += bytes;
        span = Some(match span {
            None => (start, end),
            Some((s, e)) => (s.min(start), e.max(end)),
        });
    }
    let (start, end) = span.ok_or(Error::ZeroWorkers)?;
    sample.secs = end.duration_since(start).as_secs_f64();
    Ok(sample)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// FNV-1a of the case name: each case its own reproducible values.
fn seed(name: &str) -> u64 {
    name.bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// xorshift64* (Vigna): plenty for test data, no dependency.
#[derive(Debug)]
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> XorShift {
        XorShift(seed | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}
