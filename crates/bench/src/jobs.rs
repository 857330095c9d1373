//! The worker protocol of `bench/README.md`: job files, schema lists and the
//! timing loop every protoplane measurement goes through.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// One job: a message file to measure, with its labels.
#[derive(Clone, Debug)]
pub(crate) struct Job {
    pub(crate) dataset: String,
    pub(crate) bench: String,
    pub(crate) schema: String,
    pub(crate) type_name: String,
    pub(crate) message: String,
    pub(crate) delimited: bool,
    pub(crate) path: PathBuf,
}

impl Job {
    pub(crate) fn to_line(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
            self.dataset,
            self.bench,
            self.schema,
            self.type_name,
            self.message,
            if self.delimited { "delimited" } else { "single" },
            self.path.display()
        )
    }

    /// The messages of this job (one, or every message of a delimited file).
    pub(crate) fn messages(&self) -> Result<Vec<Vec<u8>>, String> {
        let bytes =
            std::fs::read(&self.path).map_err(|e| format!("{}: {e}", self.path.display()))?;
        if !self.delimited {
            return Ok(vec![bytes]);
        }
        protoplane_load::framing::Framing::new(true)
            .messages(&bytes)
            .map(|m| {
                m.map(|(_, b)| b.to_vec()).map_err(|e| format!("{}: {e}", self.path.display()))
            })
            .collect()
    }
}

pub(crate) fn read_jobs(path: &Path) -> Result<Vec<Job>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut jobs = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let c: Vec<&str> = line.split('\t').collect();
        if c.len() != 7 {
            return Err(format!("{}:{}: expected 7 tab-separated columns", path.display(), i + 1));
        }
        jobs.push(Job {
            dataset: c[0].into(),
            bench: c[1].into(),
            schema: c[2].into(),
            type_name: c[3].into(),
            message: c[4].into(),
            delimited: c[5] == "delimited",
            path: c[6].into(),
        });
    }
    Ok(jobs)
}

/// A schema: key, `.proto` file, import roots.
#[derive(Clone, Debug)]
pub(crate) struct Schema {
    pub(crate) key: String,
    pub(crate) proto: PathBuf,
    pub(crate) includes: Vec<PathBuf>,
}

impl Schema {
    pub(crate) fn to_line(&self) -> String {
        let inc: Vec<String> = self.includes.iter().map(|p| p.display().to_string()).collect();
        format!("{}\t{}\t{}\n", self.key, self.proto.display(), inc.join(","))
    }
}

pub(crate) fn read_schemas(path: &Path) -> Result<Vec<Schema>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let c: Vec<&str> = l.split('\t').collect();
            if c.len() < 2 {
                return Err(format!("{}: bad schema line {l:?}", path.display()));
            }
            let includes = c
                .get(2)
                .map(|s| s.split(',').filter(|x| !x.is_empty()).map(PathBuf::from).collect());
            Ok(Schema {
                key: c[0].into(),
                proto: c[1].into(),
                includes: includes.unwrap_or_default(),
            })
        })
        .collect()
}

/// How long and how often to measure.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    pub(crate) min_time_ms: u64,
    pub(crate) samples: usize,
}

/// Measures `op` (one call processes every message of a job once) and
/// returns the median over samples of ns per call. Calibrates the loop
/// count so a sample takes at least `min_time_ms`, after a warm-up of
/// about four samples' worth.
pub(crate) fn measure(timing: Timing, mut op: impl FnMut()) -> f64 {
    let target = timing.min_time_ms.max(1) as f64 * 1e6;
    // Calibrate: double the loop until one run takes >= 1/8 of a sample.
    let mut iters = 1u64;
    loop {
        let t = Instant::now();
        for _ in 0..iters {
            op();
        }
        let ns = t.elapsed().as_nanos() as f64;
        if ns >= target / 8.0 || iters >= 1 << 30 {
            iters = ((iters as f64 * target / ns.max(1.0)).ceil() as u64).max(1);
            break;
        }
        iters *= 2;
    }
    // Warm-up.
    let warm = Instant::now();
    while (warm.elapsed().as_nanos() as f64) < 4.0 * target {
        op();
    }
    let mut samples: Vec<f64> = (0..timing.samples.max(1))
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                op();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    black_box(&samples);
    samples[samples.len() / 2]
}

/// Geometric mean (of positive values).
pub(crate) fn geomean(xs: impl IntoIterator<Item = f64>) -> Option<f64> {
    let (mut sum, mut n) = (0.0, 0usize);
    for x in xs {
        if x > 0.0 {
            sum += x.ln();
            n += 1;
        }
    }
    (n > 0).then(|| (sum / n as f64).exp())
}
