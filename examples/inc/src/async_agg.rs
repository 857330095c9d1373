//! Asynchronous aggregation — user code. Word count: each worker counts
//! the words of its share of the corpus and adds the counts into the
//! in-network map (`Map.addTo`) whenever a batch is ready; a reader gets
//! the totals (`Map.get`).

use std::collections::HashMap;
use std::time::Duration;

use protoplane_inc_net::agent::ClientRuntime;

/// A key every worker adds 1 to when it is done.
pub const DONE: &[u8] = b"\0done";

/// Lower-case words of letters (at most 64 bytes, the longest key).
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphabetic())
        .filter(|w| !w.is_empty() && w.len() <= 64)
        .map(str::to_lowercase)
}

/// Counts `lines` in batches of `batch` lines; returns the words sent.
pub fn worker(rt: &mut ClientRuntime, lines: &[&str], batch: usize) -> Result<u64, String> {
    let mut sent = 0;
    for part in lines.chunks(batch.max(1)) {
        let mut counts: HashMap<String, i64> = HashMap::new();
        for w in part.iter().flat_map(|l| words(l)) {
            *counts.entry(w).or_insert(0) += 1;
        }
        sent += counts.len() as u64;
        rt.add(&counts.into_iter().map(|(w, n)| (w.into_bytes(), n)).collect::<Vec<_>>())?;
    }
    rt.add(&[(DONE.to_vec(), 1)])?;
    Ok(sent)
}

/// Waits until `workers` are done, then reads the count of every word.
pub fn reader(
    rt: &mut ClientRuntime,
    workers: i64,
    words: &[String],
) -> Result<HashMap<String, i64>, String> {
    while rt.get(&[DONE.to_vec()])?[0].1 < workers {
        std::thread::sleep(Duration::from_millis(10));
    }
    let keys: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
    let values = rt.get(&keys)?;
    Ok(values.into_iter().map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v)).collect())
}
