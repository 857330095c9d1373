//! Agreement — user code. The leader (the server) proposes a value per
//! instance; acceptors (the clients) accept it with `Acceptor.Accept`; the
//! data plane counts distinct acceptors per instance and forwards the
//! instance to the leader and the acceptors when a majority accepted
//! (`CntFwd`). An acceptance has no ordinary field, so it never reaches
//! the server as a call.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use protoplane_grpc::{Message, Request, Status};
use protoplane_inc::client::Event;
use protoplane_inc::server::ServerEvent;
use protoplane_inc_net::agent::ServerRuntime;
use protoplane_wire::Block;

use crate::generated::protoplane::examples::agreement::acceptor_inc_client::AcceptorIncClient;
use crate::generated::protoplane::examples::agreement::acceptor_server::Acceptor;
use crate::generated::protoplane::examples::agreement::{
    AcceptReply, AcceptRequest, AcceptRequestBuilder,
};

/// The server's side of `Accept` (the network answers every acceptance).
#[derive(Debug, Default)]
pub struct AcceptorService;

impl Acceptor for AcceptorService {
    async fn accept(&self, _request: Request<Message>) -> Result<Block, Status> {
        Ok(AcceptReply::builder().finish())
    }
}

/// Proposes every (instance, value) and returns what was committed.
pub fn leader(
    rt: &mut ServerRuntime,
    proposals: &[(u32, i64)],
    limit: Duration,
) -> Result<BTreeMap<u32, i32>, String> {
    for (instance, value) in proposals {
        rt.propose(*instance, *value).map_err(|e| e.to_string())?;
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

/// What an acceptor saw.
#[derive(Debug, Default)]
pub struct Accepted {
    /// The commits it was told about.
    pub commits: BTreeMap<u32, i32>,
    /// Acceptances that failed (the leader's count is the one that matters).
    pub failed: usize,
}

/// Accepts every proposal until `instances` commits were seen, or nothing
/// happened for `quiet` (a commit notice can be lost).
pub async fn acceptor(
    client: &AcceptorIncClient,
    instances: usize,
    quiet: Duration,
) -> Result<Accepted, Status> {
    let mut seen = Accepted::default();
    let mut accepts = tokio::task::JoinSet::new();
    let mut last = Instant::now();
    while seen.commits.len() < instances && last.elapsed() < quiet {
        match client.inc().agent().next_event(Duration::from_millis(20)).await {
            Some(Event::Proposal { instance, .. }) => {
                let mut b = AcceptRequest::builder();
                AcceptRequestBuilder::root(&mut b).instance()?.set_value(i64::from(instance));
                let (client, request) = (client.clone(), b.finish());
                accepts.spawn(async move { client.accept(Request::new(&request)).await.is_ok() });
            }
            Some(Event::Committed { instance, value }) => {
                seen.commits.insert(instance, value);
            }
            _ => continue,
        }
        last = Instant::now();
    }
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    while let Ok(Some(done)) = tokio::time::timeout_at(end, accepts.join_next()).await {
        seen.failed += usize::from(!done.unwrap_or(false));
    }
    seen.failed += accepts.len();
    Ok(seen)
}
