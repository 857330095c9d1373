//! Key-value, monitoring style — user code. Hosts report per-key counters
//! (`Monitor.Report`, added in the network: `Map.addTo`); a dashboard
//! queries them (`Monitor.Query`, `Map.get`, answered by the network
//! alone). The server sees which host reported.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use protoplane_grpc::{Message, Request, Status};
use protoplane_wire::Block;

use crate::generated::protoplane::examples::monitor::monitor_inc_client::MonitorIncClient;
use crate::generated::protoplane::examples::monitor::monitor_server::Monitor;
use crate::generated::protoplane::examples::monitor::{
    QueryReply, QueryReplyView, QueryRequest, QueryRequestBuilder, ReportReply, ReportRequest,
    ReportRequestBuilder, ReportRequestView,
};

/// A counter every reporter adds 1 to when it is done.
pub const DONE: i64 = -1;

/// The server: it counts reports per host.
#[derive(Debug, Default)]
pub struct MonitorService {
    /// Reports that named their host.
    pub reports: AtomicU64,
}

impl Monitor for MonitorService {
    async fn report(&self, request: Request<Message>) -> Result<Block, Status> {
        let req: ReportRequestView<'_> = request.message.typed()?;
        if !req.host().is_empty() {
            self.reports.fetch_add(1, Ordering::Relaxed);
        }
        Ok(ReportReply::builder().finish())
    }

    async fn query(&self, _request: Request<Message>) -> Result<Block, Status> {
        Ok(QueryReply::builder().finish())
    }
}

async fn report(
    client: &MonitorIncClient,
    host: &str,
    deltas: &[(i64, i64)],
) -> Result<(), Status> {
    let mut b = ReportRequest::builder();
    let mut req = ReportRequestBuilder::root(&mut b);
    req.set_host(host)?;
    let mut counters = req.counters()?;
    for (k, v) in deltas {
        counters.insert_entries(*k, *v)?;
    }
    client.report(Request::new(&b.finish())).await.map(|_| ())
}

/// Sends each report (counter deltas) as `host`, then says it is done;
/// returns the items sent.
pub async fn reporter(
    client: &MonitorIncClient,
    host: &str,
    reports: &[Vec<(i64, i64)>],
) -> Result<u64, Status> {
    reporter_part(client, host, reports, true).await
}

/// Sends each report as `host`, and says it is done if `last` (a reporter
/// may send its reports from several processes one after another).
pub async fn reporter_part(
    client: &MonitorIncClient,
    host: &str,
    reports: &[Vec<(i64, i64)>],
    last: bool,
) -> Result<u64, Status> {
    let mut sent = 0;
    for r in reports {
        sent += r.len() as u64;
        report(client, host, r).await?;
    }
    if last {
        report(client, host, &[(DONE, 1)]).await?;
    }
    Ok(sent)
}

/// The counters `keys`, in order (0 for a key nobody reported).
pub async fn query(client: &MonitorIncClient, keys: &[i64]) -> Result<Vec<i64>, Status> {
    let mut b = QueryRequest::builder();
    QueryRequestBuilder::root(&mut b).keys()?.extend_ints(keys.iter().copied())?;
    let reply = client.query(Request::new(&b.finish())).await?;
    let reply: QueryReplyView<'_> = reply.typed()?;
    let counters = reply.counters();
    Ok(keys.iter().map(|k| counters.and_then(|c| c.entries().get(k)).unwrap_or(0)).collect())
}

/// Queries `keys` once every reporter is done; also returns the latency
/// of the query.
pub async fn dashboard(
    client: &MonitorIncClient,
    reporters: i64,
    keys: &[i64],
) -> Result<(Vec<i64>, Duration), Status> {
    while query(client, &[DONE]).await?[0] < reporters {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t = Instant::now();
    let values = query(client, keys).await?;
    Ok((values, t.elapsed()))
}
