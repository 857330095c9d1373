//! Key-value, monitoring style — user code. Hosts report per-key
//! counters (`Map.addTo`: packets per flow, errors per endpoint); a
//! dashboard queries them (`Map.get`).

use std::time::{Duration, Instant};

use protoplane_inc::keys::int_key;
use protoplane_inc_net::agent::ClientRuntime;

/// A counter every reporter adds 1 to when it is done.
pub const DONE: i64 = -1;

/// Sends each report (counter deltas); returns the items sent.
pub fn reporter(rt: &mut ClientRuntime, reports: &[Vec<(i64, i64)>]) -> Result<u64, String> {
    let mut sent = 0;
    for r in reports {
        sent += r.len() as u64;
        rt.add(&r.iter().map(|(k, v)| (int_key(*k), *v)).collect::<Vec<_>>())?;
    }
    rt.add(&[(int_key(DONE), 1)])?;
    Ok(sent)
}

/// Queries `keys` once every reporter is done; also returns the latency
/// of the query.
pub fn dashboard(
    rt: &mut ClientRuntime,
    reporters: i64,
    keys: &[i64],
) -> Result<(Vec<i64>, Duration), String> {
    while rt.get(&[int_key(DONE)])?[0].1 < reporters {
        std::thread::sleep(Duration::from_millis(10));
    }
    let t = Instant::now();
    let values = rt.get(&keys.iter().map(|k| int_key(*k)).collect::<Vec<_>>())?;
    Ok((values.into_iter().map(|(_, v)| v).collect(), t.elapsed()))
}
