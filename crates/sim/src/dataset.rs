//! The messages a simulation replays: a dataset directory with a
//! `manifest.tsv` (HyperProtoBench's layout or the social-network request
//! set's), or a built-in workload when none is given.

use std::fs;
use std::path::{Path, PathBuf};

use protoplane_schema::{ProtoSource, TableSet};

use crate::error::{Error, FramingError, Result};

/// One message to replay.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Group (`bench0`, or the dataset's name).
    pub group: String,
    /// Name (`M1`, or the type's short name).
    pub name: String,
    /// Message type index in `tables`.
    pub type_index: u32,
    /// Its wire bytes.
    pub wire: Vec<u8>,
}

/// A schema and the messages of it.
#[derive(Debug)]
pub struct Workload {
    /// Where it came from.
    pub source: String,
    /// Groups, each with its own tables.
    pub groups: Vec<(TableSet, Vec<Sample>)>,
}

impl Workload {
    /// Every sample with its tables.
    pub fn samples(&self) -> impl Iterator<Item = (&TableSet, &Sample)> {
        self.groups.iter().flat_map(|(ts, s)| s.iter().map(move |m| (ts, m)))
    }
}

/// The default place of HyperProtoBench beside the checkout.
pub fn default_dataset() -> Option<PathBuf> {
    let p = Path::new("../shared/datasets/hyperprotobench");
    p.join("manifest.tsv").is_file().then(|| p.to_path_buf())
}

fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|source| Error::Read { path: path.to_path_buf(), source })
}

/// Loads a dataset directory: HyperProtoBench (`manifest.tsv` with
/// `bench`, `type` and `path` columns, a `benchmark.descriptor_set.pb` per
/// bench) or a set of length-delimited recordings (`type` and `path`
/// columns, `*.ldelim` files, one `*.descriptor_set.pb` in the directory).
///
/// # Errors
///
/// [`Error::ManifestRead`], [`Error::ManifestNotUtf8`] and
/// [`Error::ManifestColumns`] when the manifest is missing or malformed;
/// [`Error::Read`], [`Error::NoDescriptorSet`], [`Error::Schema`],
/// [`Error::UnknownType`] and [`Error::Recording`] when a file it names
/// does not load.
pub fn load(dir: &Path) -> Result<Workload> {
    let manifest_path = dir.join("manifest.tsv");
    let manifest = fs::read(&manifest_path)
        .map_err(|source| Error::ManifestRead { path: manifest_path.clone(), source })?;
    let manifest = String::from_utf8(manifest)
        .map_err(|_| Error::ManifestNotUtf8 { path: manifest_path.clone() })?;
    let mut lines = manifest.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split('\t').collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (Some(ty), Some(path)) = (col("type"), col("path")) else {
        return Err(Error::ManifestColumns { dir: dir.to_path_buf() });
    };
    let bench = col("bench");
    let name_col = col("message");
    let mut groups: Vec<(String, TableSet, Vec<Sample>)> = Vec::new();
    let mut shared_tables = if bench.is_none() {
        let desc = fs::read_dir(dir)
            .map_err(|source| Error::Read { path: dir.to_path_buf(), source })?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().ends_with(".descriptor_set.pb"))
            .ok_or_else(|| Error::NoDescriptorSet { dir: dir.to_path_buf() })?;
        Some(TableSet::from_descriptor_set(&read(&desc)?)?)
    } else {
        None
    };
    let dir_name = dir.file_name().map_or("dataset".into(), |n| n.to_string_lossy().into_owned());
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let cells: Vec<&str> = line.split('\t').collect();
        let get = |i: usize| cells.get(i).copied().unwrap_or("");
        let group = bench.map_or(dir_name.clone(), |b| get(b).to_string());
        if !groups.iter().any(|g| g.0 == group) {
            // Without a bench column there is one group, with the
            // directory's one descriptor set.
            let ts = match shared_tables.take() {
                Some(t) => t,
                None => {
                    let d = read(&dir.join(&group).join("benchmark.descriptor_set.pb"))?;
                    TableSet::from_descriptor_set(&d)?
                }
            };
            groups.push((group.clone(), ts, Vec::new()));
        }
        let Some(g) = groups.iter_mut().find(|g| g.0 == group) else { continue };
        let type_index = g.1.message_by_name(get(ty)).ok_or_else(|| Error::UnknownType {
            schema: dir.display().to_string(),
            name: get(ty).to_string(),
        })?;
        let file = dir.join(get(path));
        let bytes = read(&file)?;
        let short = get(ty).rsplit('.').next().unwrap_or("").to_string();
        if get(path).ends_with(".ldelim") {
            let messages = split_ldelim(&bytes)
                .map_err(|source| Error::Recording { path: file.clone(), source })?;
            for (i, m) in messages.into_iter().enumerate() {
                g.2.push(Sample {
                    group: group.clone(),
                    name: format!("{short}#{i}"),
                    type_index,
                    wire: m,
                });
            }
        } else {
            let name = name_col.map_or(short, |c| get(c).to_string());
            g.2.push(Sample { group: group.clone(), name, type_index, wire: bytes });
        }
    }
    Ok(Workload {
        source: dir.display().to_string(),
        groups: groups.into_iter().map(|(_, t, s)| (t, s)).collect(),
    })
}

fn split_ldelim(mut b: &[u8]) -> std::result::Result<Vec<Vec<u8>>, FramingError> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let mut len = 0usize;
        let mut shift = 0;
        loop {
            let (&byte, rest) = b.split_first().ok_or(FramingError::TruncatedPrefix)?;
            b = rest;
            len |= usize::from(byte & 0x7f) << shift;
            shift += 7;
            if byte < 0x80 {
                break;
            }
            if shift > 35 {
                return Err(FramingError::PrefixTooLong);
            }
        }
        if len > b.len() {
            return Err(FramingError::TruncatedMessage);
        }
        out.push(b[..len].to_vec());
        b = &b[len..];
    }
    Ok(out)
}

/// The built-in workload: requests of a small service with flat, nested
/// and bulk messages, generated deterministically (used when no dataset
/// is given and HyperProtoBench is not beside the checkout).
///
/// # Errors
///
/// [`Error::Schema`] or [`Error::UnknownType`] if its schema does not load
/// (a bug).
pub fn builtin() -> Result<Workload> {
    const PROTO: &str = r#"
syntax = "proto3";
package protoplane.sim;
message Media { string url = 1; bytes thumbnail = 2; uint32 width = 3; uint32 height = 4; }
message User { uint64 id = 1; string name = 2; string email = 3; repeated string tags = 4; }
message Post {
  uint64 id = 1; User author = 2; string text = 3; repeated Media media = 4;
  repeated uint64 mentions = 5; double score = 6; map<string, string> labels = 7;
}
message Upload { string name = 1; bytes data = 2; uint32 crc = 3; }
"#;
    let ts = TableSet::from_proto_sources(
        &[ProtoSource { name: "sim.proto", text: PROTO }],
        &["sim.proto"],
    )?;
    let find = |name: &str| {
        ts.message_by_name(name).ok_or_else(|| Error::UnknownType {
            schema: "built-in workload".to_owned(),
            name: name.to_owned(),
        })
    };
    let post = find("protoplane.sim.Post")?;
    let upload = find("protoplane.sim.Upload")?;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut samples = Vec::new();
    for (i, media) in [0usize, 1, 4, 16].into_iter().enumerate() {
        let mut w = Vec::new();
        put_varint_field(&mut w, 1, next());
        let mut user = Vec::new();
        put_varint_field(&mut user, 1, next() % 1_000_000);
        put_len_field(&mut user, 2, &text(&mut next, 12));
        put_len_field(&mut user, 3, &text(&mut next, 24));
        for _ in 0..3 {
            put_len_field(&mut user, 4, &text(&mut next, 8));
        }
        put_len_field(&mut w, 2, &user);
        put_len_field(&mut w, 3, &text(&mut next, 280));
        for _ in 0..media {
            let mut m = Vec::new();
            put_len_field(&mut m, 1, &text(&mut next, 64));
            put_len_field(&mut m, 2, &text(&mut next, 2048));
            put_varint_field(&mut m, 3, 640);
            put_varint_field(&mut m, 4, 480);
            put_len_field(&mut w, 4, &m);
        }
        let mut packed = Vec::new();
        for _ in 0..8 {
            push_varint(&mut packed, next() % 100_000);
        }
        put_len_field(&mut w, 5, &packed);
        w.push((6 << 3) | 1);
        w.extend_from_slice(&0.75f64.to_le_bytes());
        for _ in 0..4 {
            let mut e = Vec::new();
            put_len_field(&mut e, 1, &text(&mut next, 6));
            put_len_field(&mut e, 2, &text(&mut next, 10));
            put_len_field(&mut w, 7, &e);
        }
        samples.push(Sample {
            group: "builtin".into(),
            name: format!("post-{i}-media-{media}"),
            type_index: post,
            wire: w,
        });
    }
    for size in [1024usize, 65_536, 1 << 20] {
        let mut w = Vec::new();
        put_len_field(&mut w, 1, b"upload.bin");
        put_len_field(&mut w, 2, &text(&mut next, size));
        put_varint_field(&mut w, 3, next() as u32 as u64);
        samples.push(Sample {
            group: "builtin".into(),
            name: format!("upload-{size}"),
            type_index: upload,
            wire: w,
        });
    }
    Ok(Workload { source: "built-in workload".into(), groups: vec![(ts, samples)] })
}

fn text(next: &mut impl FnMut() -> u64, len: usize) -> Vec<u8> {
    (0..len).map(|_| b'a' + (next() % 26) as u8).collect()
}

/// Appends a varint.
pub fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_varint_field(out: &mut Vec<u8>, number: u32, v: u64) {
    push_varint(out, u64::from(number) << 3);
    push_varint(out, v);
}

/// Appends a length-delimited field.
pub fn put_len_field(out: &mut Vec<u8>, number: u32, body: &[u8]) {
    push_varint(out, (u64::from(number) << 3) | 2);
    push_varint(out, body.len() as u64);
    out.extend_from_slice(body);
}
