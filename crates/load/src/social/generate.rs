//! Generated social-network requests: `count` messages of each request type
//! of `protos/socialnetwork/social_network.proto`, filled by a seeded
//! generator and encoded deterministically, so every run (and every
//! caller) sees the same bytes. Used wherever the recorded requests of
//! `../shared/datasets/socialnetwork` are absent: the demo, `bench rpc`,
//! `bench split`, `bench wire`.
//!
//! The wire crate's dataset test compiles this file too (by path), so it
//! uses nothing of the `protoplane` command: only the schema tables and the
//! wire engine's builder and encoder.

use protoplane_schema::TableSet;
use protoplane_wire::{Builder, EncodeOptions, Encoder, Source, Value};

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

/// Builds `count` requests of one type with the builder and encodes them.
pub(crate) fn generate(
    ts: &TableSet,
    ty: u32,
    name: &str,
    count: usize,
) -> Result<Vec<Vec<u8>>, String> {
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
