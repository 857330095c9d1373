//! Agreement — user code. The leader (the server) proposes a value per
//! instance; acceptors (the clients) accept it; the data plane counts
//! distinct acceptors per instance and forwards the instance to the
//! leader and the acceptors when a majority accepted (`CntFwd`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use protoplane_inc::client::Event;
use protoplane_inc::server::ServerEvent;
use protoplane_inc_net::agent::{ClientRuntime, ServerRuntime};

/// Proposes every (instance, value) and returns what was committed.
pub fn leader(
    rt: &mut ServerRuntime,
    proposals: &[(u32, i64)],
    limit: Duration,
) -> Result<BTreeMap<u32, i32>, String> {
    for (instance, value) in proposals {
        rt.propose(*instance, *value)?;
    }
    let mut committed = BTreeMap::new();
    let end = Instant::now() + limit;
    while committed.len() < proposals.len() && Instant::now() < end {
        rt.step(Duration::from_millis(5)).map_err(|e| e.to_string())?;
        while let Some(ServerEvent::Committed { instance, value, .. }) = rt.poll_event() {
            if committed.insert(instance, value).is_some() {
                return Err(format!("instance {instance} committed twice"));
            }
        }
    }
    Ok(committed)
}

/// Accepts every proposal until `instances` commits were seen, or nothing
/// happened for `quiet` (a commit notice can be lost; the leader's count
/// is the one that matters); returns the commits seen.
pub fn acceptor(
    rt: &mut ClientRuntime,
    instances: usize,
    quiet: Duration,
) -> Result<BTreeMap<u32, i32>, String> {
    let mut commits = BTreeMap::new();
    let mut last = Instant::now();
    while commits.len() < instances && last.elapsed() < quiet {
        match rt.next_event(Duration::from_millis(20)) {
            Some(Event::Proposal { instance, value, addr }) => {
                rt.vote_async(instance, value as i32, addr)
            }
            Some(Event::Committed { instance, value }) => {
                commits.insert(instance, value);
            }
            _ => continue,
        }
        last = Instant::now();
    }
    rt.drain(Duration::from_secs(5));
    Ok(commits)
}
