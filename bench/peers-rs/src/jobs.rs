//! Job files and message files (bench/README.md, "Worker protocol").

use std::fs;
use std::path::{Path, PathBuf};

/// One line of a job file.
#[derive(Debug, Clone)]
pub struct Job {
    pub dataset: String,
    pub bench: String,
    pub schema: String,
    /// Fully qualified message type, e.g. `hyperprotobench.M1`.
    pub ty: String,
    pub message: String,
    pub framing: Framing,
    pub path: PathBuf,
}

/// How a message file holds its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// The whole file is one message.
    Single,
    /// Varint length-prefixed messages, back to back.
    Delimited,
}

/// Reads a job file: UTF-8 TSV, 7 columns, no header. Blank lines are
/// ignored.
pub fn read_job_file(path: &Path) -> Result<Vec<Job>, String> {
    let text = fs::read_to_string(path)
        .map_err(|e| format!("cannot read job file {}: {e}", path.display()))?;
    let mut jobs = Vec::new();
    for (lineno, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{}:{}", path.display(), lineno + 1);
        let cols: Vec<&str> = line.split('\t').collect();
        let [dataset, bench, schema, ty, message, framing, file] = cols[..] else {
            return Err(format!(
                "{}: expected 7 tab-separated columns, found {}",
                at(),
                cols.len()
            ));
        };
        let framing = match framing {
            "single" => Framing::Single,
            "delimited" => Framing::Delimited,
            other => return Err(format!("{}: unknown framing {other:?}", at())),
        };
        jobs.push(Job {
            dataset: dataset.to_owned(),
            bench: bench.to_owned(),
            schema: schema.to_owned(),
            ty: ty.to_owned(),
            message: message.to_owned(),
            framing,
            path: PathBuf::from(file),
        });
    }
    Ok(jobs)
}

/// The bytes of a message file, split into its messages.
#[derive(Debug)]
pub struct Payload {
    data: Vec<u8>,
    /// `(start, end)` of every message in `data`.
    spans: Vec<(usize, usize)>,
}

impl Payload {
    /// Reads `path` and splits it according to `framing`.
    pub fn load(path: &Path, framing: Framing) -> Result<Self, String> {
        let data = fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let spans = match framing {
            Framing::Single => vec![(0, data.len())],
            Framing::Delimited => {
                split_delimited(&data).map_err(|e| format!("{}: {e}", path.display()))?
            }
        };
        Ok(Self { data, spans })
    }

    /// The messages, in file order.
    pub fn messages(&self) -> Vec<&[u8]> {
        self.spans.iter().map(|&(start, end)| &self.data[start..end]).collect()
    }

    /// Mean wire size of one message (length prefixes not counted).
    pub fn mean_bytes(&self) -> f64 {
        let total: usize = self.spans.iter().map(|(start, end)| end - start).sum();
        total as f64 / self.spans.len() as f64
    }
}

/// Spans of the varint length-prefixed messages in `data`.
fn split_delimited(data: &[u8]) -> Result<Vec<(usize, usize)>, String> {
    let mut spans = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let mut len: u64 = 0;
        let mut shift = 0;
        loop {
            let Some(&byte) = data.get(pos) else {
                return Err(format!("truncated length prefix at offset {pos}"));
            };
            pos += 1;
            if shift > 63 {
                return Err(format!("overlong length prefix before offset {pos}"));
            }
            len |= u64::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                break;
            }
        }
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| pos.checked_add(len))
            .filter(|&end| end <= data.len())
            .ok_or_else(|| format!("message of {len} bytes at offset {pos} runs past the end"))?;
        spans.push((pos, end));
        pos = end;
    }
    if spans.is_empty() {
        return Err("no messages".to_owned());
    }
    Ok(spans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_delimited_messages() {
        let data = [2, 0xaa, 0xbb, 0, 1, 0xcc];
        assert_eq!(split_delimited(&data), Ok(vec![(1, 3), (4, 4), (5, 6)]));
    }

    #[test]
    fn rejects_bad_framing() {
        assert!(split_delimited(&[]).is_err());
        assert!(split_delimited(&[3, 1, 2]).is_err());
        assert!(split_delimited(&[0x80]).is_err());
    }
}
