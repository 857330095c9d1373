//! `protoplane-bench bench-worker`: protoplane's side of the side-by-side wire
//! benchmark (protocol in `bench/README.md`).
//!
//! Ops, each over every message of a job:
//! * `decode_owned`: wire -> block with strings copied, into a reused block
//!   (the engine's steady state: blocks come from a region's free list);
//! * `decode_view`: the same with strings referencing the wire bytes;
//! * `encode`: block -> wire, contiguous, into the encoder's reused buffer
//!   (`Encoder::encode`: one back-to-front pass);
//! * `encode_sg`: block -> scatter-gather list (framing copied, payloads of
//!   64+ bytes referenced);
//! * `memcpy`: copy of the wire bytes into a preallocated buffer, the
//!   physical floor for anything that produces a contiguous copy;
//! * `json_decode`: each message's JSON form (printed once, before timing,
//!   by `json::to_json`) -> a new block (`json::from_json`);
//! * `json_encode`: block -> JSON text (`json::to_json`) into a reused
//!   `String`.

use std::collections::HashMap;
use std::hint::black_box;
use std::path::PathBuf;

use protoplane_schema::TableSet;
use protoplane_wire::{
    json, Block, DecodeOptions, Decoder, EncodeOptions, Encoder, MessageView, SgList, Source,
};

use crate::jobs::{self, measure, Timing};

const OPS: [&str; 7] =
    ["decode_owned", "decode_view", "encode", "encode_sg", "memcpy", "json_decode", "json_encode"];

#[derive(clap::Args, Debug)]
pub(crate) struct WorkerArgs {
    /// Job file (TSV, see bench/README.md).
    #[arg(long)]
    jobs: PathBuf,
    /// Schema list (TSV: key, .proto file, include dirs).
    #[arg(long)]
    schemas: PathBuf,
    /// Comma-separated ops (default: all).
    #[arg(long)]
    ops: Option<String>,
    /// Minimum time of one sample, ms.
    #[arg(long, default_value_t = 5)]
    min_time_ms: u64,
    /// Samples per (job, op).
    #[arg(long, default_value_t = 7)]
    samples: usize,
}

/// Each block's JSON form, checked to parse back into a message that
/// encodes to the same bytes.
fn json_forms(ts: &TableSet, ty: u32, owned: &[Block]) -> Result<Vec<String>, String> {
    let opts = EncodeOptions::default();
    owned
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut text = String::new();
            MessageView::new(ts, Source::owned(b.as_bytes()), ty)
                .map_err(json::PrintError::from)
                .and_then(|v| json::to_json(&v, &mut text))
                .map_err(|e| format!("message #{i} does not print: {e}"))?;
            let back = json::from_json(ts, ty, &text)
                .map_err(|e| format!("message #{i}'s JSON does not parse: {e}"))?;
            let encode = |b: &Block| {
                protoplane_wire::encode(ts, ty, b.as_bytes(), &opts).map_err(|e| e.to_string())
            };
            if encode(&back)? != encode(b)? {
                return Err(format!("message #{i} reads back from its JSON as another message"));
            }
            Ok(text)
        })
        .collect()
}

pub(crate) fn run(args: &WorkerArgs) -> Result<String, String> {
    let jobs = jobs::read_jobs(&args.jobs)?;
    let mut tables: HashMap<String, TableSet> = HashMap::new();
    for s in jobs::read_schemas(&args.schemas)? {
        let ts = TableSet::from_proto_files(&[&s.proto], &s.includes)
            .map_err(|e| format!("{}: {e}", s.key))?;
        tables.insert(s.key, ts);
    }
    let ops: Vec<&str> = match &args.ops {
        Some(list) => OPS.iter().copied().filter(|o| list.split(',').any(|x| x == *o)).collect(),
        None => OPS.to_vec(),
    };
    let timing = Timing { min_time_ms: args.min_time_ms, samples: args.samples };
    let mut out = String::new();
    for job in &jobs {
        let Some(ts) = tables.get(&job.schema) else { continue };
        let ty = ts
            .message_by_name(&job.type_name)
            .ok_or_else(|| format!("{}: no type {}", job.schema, job.type_name))?;
        let msgs = job.messages()?;
        let n = msgs.len().max(1) as f64;
        let bytes = msgs.iter().map(Vec::len).sum::<usize>() as f64 / n;
        verify(ts, ty, &msgs).map_err(|e| format!("{} {}: {e}", job.bench, job.message))?;
        let mut dec = Decoder::new();
        let mut enc = Encoder::new();
        let mut block = Block::new();
        let owned: Vec<Block> = msgs
            .iter()
            .map(|m| protoplane_wire::decode(ts, ty, m, &DecodeOptions::default()))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let views: Vec<Block> = msgs
            .iter()
            .map(|m| protoplane_wire::decode(ts, ty, m, &DecodeOptions::view()))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let eopts = EncodeOptions::default();
        // The JSON forms, checked to read back as the same message (a job
        // whose messages do not is left out of the JSON ops, noted).
        let jsons = if ops.iter().any(|o| o.starts_with("json_")) {
            json_forms(ts, ty, &owned).map_err(|e| {
                eprintln!("bench-worker: note: {} {}: {e}: no JSON rows", job.bench, job.message);
            })
        } else {
            Err(())
        };
        for op in &ops {
            if op.starts_with("json_") && jsons.is_err() {
                continue;
            }
            let ns = match *op {
                "json_decode" => {
                    let texts = jsons.as_deref().unwrap_or_default();
                    measure(timing, || {
                        for t in texts {
                            let r = json::from_json(ts, ty, black_box(t));
                            black_box(r.map(|b| b.as_bytes().len()).ok());
                        }
                    })
                }
                "json_encode" => {
                    let mut text = String::new();
                    measure(timing, || {
                        for b in &owned {
                            text.clear();
                            let r =
                                MessageView::new(ts, Source::owned(black_box(b.as_bytes())), ty)
                                    .map_err(json::PrintError::from)
                                    .and_then(|v| json::to_json(&v, &mut text));
                            black_box((r.is_ok(), text.len()));
                        }
                    })
                }
                "decode_owned" | "decode_view" => {
                    let opts = if *op == "decode_view" {
                        DecodeOptions::view()
                    } else {
                        DecodeOptions::default()
                    };
                    measure(timing, || {
                        for m in &msgs {
                            let r = dec.decode_into(ts, ty, black_box(m), &opts, &mut block);
                            black_box((r.is_ok(), block.as_bytes().len()));
                        }
                    })
                }
                "encode" => measure(timing, || {
                    for b in &owned {
                        let r = enc.encode(ts, ty, Source::owned(black_box(b.as_bytes())), &eopts);
                        black_box(r.map(<[u8]>::len).ok());
                    }
                }),
                "encode_sg" => {
                    let mut sg = SgList::new(64);
                    measure(timing, || {
                        for (b, m) in views.iter().zip(&msgs) {
                            sg.clear();
                            let src = Source::viewing(black_box(b.as_bytes()), m);
                            let r = enc.encode_sg(ts, ty, src, &eopts, &mut sg);
                            black_box((r.is_ok(), sg.len()));
                        }
                    })
                }
                _ => {
                    let mut buf = vec![0u8; msgs.iter().map(Vec::len).max().unwrap_or(0)];
                    measure(timing, || {
                        for m in &msgs {
                            buf[..m.len()].copy_from_slice(black_box(m));
                            black_box(&buf);
                        }
                    })
                }
            };
            out.push_str(&format!(
                "protoplane,{op},{},{},{},{:.1},{:.1}\n",
                job.dataset,
                job.bench,
                job.message,
                bytes,
                ns / n
            ));
        }
    }
    Ok(out)
}

/// Decode + encode must give back every input byte for byte.
fn verify(ts: &TableSet, ty: u32, msgs: &[Vec<u8>]) -> Result<(), String> {
    let opts = EncodeOptions { deterministic: true, ..EncodeOptions::default() };
    for (i, m) in msgs.iter().enumerate() {
        for dopts in [DecodeOptions::default(), DecodeOptions::view()] {
            let b = protoplane_wire::decode(ts, ty, m, &dopts)
                .map_err(|e| format!("message {i}: {e}"))?;
            let mut out = Vec::new();
            Encoder::new()
                .encode_into(ts, ty, Source::viewing(b.as_bytes(), m), &opts, &mut out)
                .map_err(|e| format!("message {i}: {e}"))?;
            if out != *m {
                return Err(format!("message {i}: re-encoding differs"));
            }
        }
    }
    Ok(())
}
