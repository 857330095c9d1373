//! `protoplane demo`: the wire engine on the social-network service's
//! requests, with nothing but the repository.
//!
//! It loads the embedded `.proto`, lays out requests with the builder (the
//! application's side), encodes them (the engine's side), decodes them back
//! in owned and zero-copy view mode, checks every round trip is byte-exact,
//! and prints one request as JSON and a short report. With `--dataset DIR`
//! it uses recorded requests (`*.ldelim`) instead of generated ones.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use protoplane_schema::{ProtoSource, TableSet};
use protoplane_wire::{
    json, Block, Builder, DecodeOptions, Decoder, EncodeOptions, Encoder, MessageView, Source,
    Value,
};

const SCHEMA: &str = include_str!("../../../protos/socialnetwork/social_network.proto");
const SCHEMA_NAME: &str = "socialnetwork/social_network.proto";
const REQUESTS: [&str; 5] = [
    "RegisterUserRequest",
    "LoginRequest",
    "ComposeMediaRequest",
    "ComposePostRequest",
    "StorePostRequest",
];

#[derive(clap::Args, Debug)]
pub(crate) struct DemoArgs {
    /// Generated requests per type.
    #[arg(long, default_value_t = 2000)]
    per_type: usize,
    /// Use recorded requests from this directory (`<Type>.ldelim` files).
    #[arg(long, value_name = "DIR")]
    dataset: Option<PathBuf>,
}

/// A tiny deterministic generator (xorshift), so runs are reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn word(&mut self, min: usize, max: usize) -> String {
        let len = min + self.below((max - min + 1) as u64) as usize;
        (0..len).map(|_| (b'a' + self.below(26) as u8) as char).collect()
    }
}

pub(crate) fn run(args: &DemoArgs) -> Result<String, String> {
    let ts = TableSet::from_proto_sources(
        &[ProtoSource { name: SCHEMA_NAME, text: SCHEMA }],
        &[SCHEMA_NAME],
    )
    .map_err(|e| e.to_string())?;
    let mut report = String::new();
    let _ = writeln!(report, "protoplane demo: the wire engine on the social-network requests\n");
    let _ = writeln!(
        report,
        "schema: {} message types, table set {} bytes (pointer-free, copyable to another process)",
        ts.messages().len(),
        ts.to_bytes().len()
    );
    let _ = writeln!(
        report,
        "\n{:<22} {:>6} {:>10} {:>9} {:>9} {:>10} {:>10} {:>10}",
        "request", "count", "wire B", "block B", "view B", "dec ns", "view ns", "enc ns"
    );
    let mut example = String::new();
    let mut total = 0usize;
    for name in REQUESTS {
        let ty = ts.message_by_name(&format!("socialnetwork.{name}")).ok_or("schema lacks type")?;
        let messages = match &args.dataset {
            Some(dir) => read_delimited(&dir.join(format!("{name}.ldelim")))?,
            None => generate(&ts, ty, name, args.per_type)?,
        };
        let stats = exercise(&ts, ty, &messages)?;
        total += messages.len();
        let _ = writeln!(
            report,
            "{:<22} {:>6} {:>10.1} {:>9.1} {:>9.1} {:>10.0} {:>10.0} {:>10.0}",
            name,
            messages.len(),
            stats.wire_bytes as f64 / messages.len() as f64,
            stats.block_bytes as f64 / messages.len() as f64,
            stats.view_bytes as f64 / messages.len() as f64,
            stats.decode_ns,
            stats.view_ns,
            stats.encode_ns,
        );
        if name == "ComposePostRequest" {
            if let Some(first) = messages.first() {
                let block = protoplane_wire::decode(&ts, ty, first, &DecodeOptions::view())
                    .map_err(|e| e.to_string())?;
                let view =
                    MessageView::new(&ts, Source { block: block.as_bytes(), wire: first }, ty)
                        .map_err(|e| e.to_string())?;
                json::to_json(&view, &mut example).map_err(|e| e.to_string())?;
            }
        }
    }
    let _ = writeln!(
        report,
        "\n{total} requests: every one decoded (owned and view) and re-encoded byte-exactly.\n\
         block B = linearized block (owned), view B = block when strings stay in the wire bytes.\n\
         ns columns: median of 5 passes in this process, one core, cache-hot; indicative only,\n\
         `protoplane bench wire` (issue: wire engine speed) is the measurement.\n"
    );
    let _ = writeln!(report, "one ComposePostRequest as proto3 JSON:\n{example}");
    Ok(report)
}

struct Stats {
    wire_bytes: usize,
    block_bytes: usize,
    view_bytes: usize,
    decode_ns: f64,
    view_ns: f64,
    encode_ns: f64,
}

/// Decodes and re-encodes every message, checks byte equality, times passes.
fn exercise(ts: &TableSet, ty: u32, messages: &[Vec<u8>]) -> Result<Stats, String> {
    let mut dec = Decoder::new();
    let mut enc = Encoder::new();
    let mut block = Block::new();
    let mut out = Vec::new();
    let opts = EncodeOptions { deterministic: true, ..EncodeOptions::default() };
    let (mut wire_bytes, mut block_bytes, mut view_bytes) = (0, 0, 0);
    for msg in messages {
        wire_bytes += msg.len();
        for view in [false, true] {
            let dopts = DecodeOptions { view, ..DecodeOptions::default() };
            dec.decode_into(ts, ty, msg, &dopts, &mut block).map_err(|e| e.to_string())?;
            if view {
                view_bytes += block.len();
            } else {
                block_bytes += block.len();
            }
            out.clear();
            enc.encode_into(ts, ty, Source { block: block.as_bytes(), wire: msg }, &opts, &mut out)
                .map_err(|e| e.to_string())?;
            if out != *msg {
                return Err(format!("round trip of a {} differs", ts.message_name(ty)));
            }
        }
    }
    let n = messages.len().max(1) as f64;
    let time = |f: &mut dyn FnMut() -> Result<(), String>| -> Result<f64, String> {
        let mut runs = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            f()?;
            runs.push(t.elapsed().as_nanos() as f64 / n);
        }
        runs.sort_by(f64::total_cmp);
        Ok(runs[2])
    };
    let decode_ns = time(&mut || {
        for m in messages {
            dec.decode_into(ts, ty, m, &DecodeOptions::default(), &mut block)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    })?;
    let view_ns = time(&mut || {
        for m in messages {
            dec.decode_into(ts, ty, m, &DecodeOptions::view(), &mut block)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    })?;
    let blocks: Vec<Block> = messages
        .iter()
        .map(|m| protoplane_wire::decode(ts, ty, m, &DecodeOptions::default()))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let encode_ns = time(&mut || {
        for b in &blocks {
            out.clear();
            enc.encode_into(ts, ty, Source::owned(b.as_bytes()), &opts, &mut out)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    })?;
    Ok(Stats { wire_bytes, block_bytes, view_bytes, decode_ns, view_ns, encode_ns })
}

/// Builds `count` requests of one type with the builder and encodes them.
fn generate(ts: &TableSet, ty: u32, name: &str, count: usize) -> Result<Vec<Vec<u8>>, String> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ name.len() as u64);
    let mut enc = Encoder::new();
    let opts = EncodeOptions { deterministic: true, ..EncodeOptions::default() };
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let mut b = Builder::new(ts, ty).map_err(|e| e.to_string())?;
        let root = b.root();
        fill(&mut b, root, name, &mut rng).map_err(|e| e.to_string())?;
        let block = b.finish();
        let mut wire = Vec::new();
        enc.encode_into(ts, ty, Source::owned(block.as_bytes()), &opts, &mut wire)
            .map_err(|e| e.to_string())?;
        out.push(wire);
    }
    Ok(out)
}

fn fill(
    b: &mut Builder<'_>,
    at: protoplane_wire::MessageBuilder,
    name: &str,
    rng: &mut Rng,
) -> Result<(), protoplane_wire::BuildError> {
    let req_id = Value::I64(rng.next() as i64 >> 1);
    let carrier = |b: &mut Builder<'_>,
                   number: u32,
                   rng: &mut Rng|
     -> Result<(), protoplane_wire::BuildError> {
        for _ in 0..rng.below(3) {
            let e = b.message(at, number)?;
            let key = rng.word(6, 12);
            let value = format!("{:016x}", rng.next());
            b.set(e, 1, Value::String(key.as_bytes()))?;
            b.set(e, 2, Value::String(value.as_bytes()))?;
        }
        Ok(())
    };
    b.set(at, 1, req_id)?;
    match name {
        "RegisterUserRequest" => {
            for n in 2..=5 {
                let w = rng.word(4, 14);
                b.set(at, n, Value::String(w.as_bytes()))?;
            }
            carrier(b, 6, rng)?;
        }
        "LoginRequest" => {
            for n in 2..=3 {
                let w = rng.word(4, 14);
                b.set(at, n, Value::String(w.as_bytes()))?;
            }
            carrier(b, 4, rng)?;
        }
        "ComposeMediaRequest" => {
            for _ in 0..rng.below(4) {
                b.push(at, 2, Value::String(b"image/png"))?;
                b.push(at, 3, Value::I64(rng.next() as i64 >> 1))?;
            }
            carrier(b, 4, rng)?;
        }
        "ComposePostRequest" => {
            let user = rng.word(4, 14);
            b.set(at, 2, Value::String(user.as_bytes()))?;
            b.set(at, 3, Value::I64(rng.below(1 << 40) as i64))?;
            let text: Vec<String> = (0..4 + rng.below(30)).map(|_| rng.word(2, 9)).collect();
            b.set(at, 4, Value::String(text.join(" ").as_bytes()))?;
            for _ in 0..rng.below(3) {
                b.push(at, 5, Value::I64(rng.next() as i64 >> 1))?;
                b.push(at, 6, Value::String(b"video/mp4"))?;
            }
            b.set(at, 7, Value::Enum(rng.below(4) as i32))?;
            carrier(b, 8, rng)?;
        }
        _ => {
            let post = b.message(at, 2)?;
            b.set(post, 1, Value::I64(rng.next() as i64 >> 1))?;
            let creator = b.message(post, 2)?;
            b.set(creator, 1, Value::I64(rng.below(1 << 40) as i64))?;
            let user = rng.word(4, 14);
            b.set(creator, 2, Value::String(user.as_bytes()))?;
            b.set(post, 3, req_id)?;
            let text: Vec<String> = (0..8 + rng.below(40)).map(|_| rng.word(2, 9)).collect();
            b.set(post, 4, Value::String(text.join(" ").as_bytes()))?;
            for _ in 0..rng.below(3) {
                let m = b.message(post, 5)?;
                b.set(m, 1, Value::I64(rng.below(1 << 40) as i64))?;
                let u = rng.word(4, 14);
                b.set(m, 2, Value::String(u.as_bytes()))?;
            }
            for _ in 0..rng.below(2) {
                let u = b.message(post, 7)?;
                let short = format!("http://sn.example/{}", rng.word(6, 6));
                let long = format!("https://{}.example/{}", rng.word(4, 10), rng.word(10, 40));
                b.set(u, 1, Value::String(short.as_bytes()))?;
                b.set(u, 2, Value::String(long.as_bytes()))?;
            }
            b.set(post, 8, Value::I64(1_700_000_000_000 + rng.below(1 << 30) as i64))?;
            b.set(post, 9, Value::Enum(rng.below(4) as i32))?;
            carrier(b, 3, rng)?;
        }
    }
    Ok(())
}

fn read_delimited(path: &std::path::Path) -> Result<Vec<Vec<u8>>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let framing = crate::stream::Framing::new(true);
    framing
        .messages(&bytes)
        .map(|m| m.map(|(_, b)| b.to_vec()).map_err(|e| format!("{}: {e}", path.display())))
        .collect()
}
