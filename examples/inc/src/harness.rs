//! Runs an application module as a server or client process: the
//! NetFilter becomes a registration, the module's functions get their
//! data, and the results are checked against [`crate::check`].

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use protoplane_grpc::{Service, Status};
use protoplane_inc::client::ClientTuning;
use protoplane_inc::controller::Registration;
use protoplane_inc::netfilter::{load_sources, select_service, NetFilter};
use protoplane_inc::server::{ServerStats, ServerTuning};
use protoplane_inc_net::agent::{ClientRuntime, Options, ServerRuntime};
use protoplane_inc_net::rpc::FaceStats;
use protoplane_rpc::{Channel, Router, ServerOptions};

use crate::agreement::AcceptorService;
use crate::async_agg::WordCountService;
use crate::generated::protoplane::examples::agreement::acceptor_inc_client::AcceptorIncClient;
use crate::generated::protoplane::examples::agreement::acceptor_server::AcceptorServer;
use crate::generated::protoplane::examples::monitor::monitor_inc_client::MonitorIncClient;
use crate::generated::protoplane::examples::monitor::monitor_server::MonitorServer;
use crate::generated::protoplane::examples::syncagg::trainer_inc_client::TrainerIncClient;
use crate::generated::protoplane::examples::syncagg::trainer_server::TrainerServer;
use crate::generated::protoplane::examples::wordcount::word_count_inc_client::WordCountIncClient;
use crate::generated::protoplane::examples::wordcount::word_count_server::WordCountServer;
use crate::key_value::MonitorService;
use crate::sync_agg::TrainerService;
use crate::{agreement, async_agg, check, key_value, sync_agg, Params, Tweaks, Verdict};

/// The four applications.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum App {
    /// Gradient all-reduce.
    SyncAgg,
    /// Word count.
    AsyncAgg,
    /// Per-key counters.
    KeyValue,
    /// Votes to a quorum.
    Agreement,
}

impl App {
    /// All four.
    pub const ALL: [App; 4] = [App::SyncAgg, App::AsyncAgg, App::KeyValue, App::Agreement];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            App::SyncAgg => "sync-agg",
            App::AsyncAgg => "async-agg",
            App::KeyValue => "key-value",
            App::Agreement => "agreement",
        }
    }

    /// Parses [`App::name`].
    pub fn parse(s: &str) -> Option<App> {
        App::ALL.into_iter().find(|a| a.name() == s)
    }

    /// The NetFilter.
    pub fn filter(self) -> &'static str {
        match self {
            App::SyncAgg => include_str!("../netfilter/sync_agg.json"),
            App::AsyncAgg => include_str!("../netfilter/async_agg.json"),
            App::KeyValue => include_str!("../netfilter/key_value.json"),
            App::Agreement => include_str!("../netfilter/agreement.json"),
        }
    }

    /// The service definition.
    pub fn proto(self) -> &'static str {
        match self {
            App::SyncAgg => include_str!("../proto/sync_agg.proto"),
            App::AsyncAgg => include_str!("../proto/async_agg.proto"),
            App::KeyValue => include_str!("../proto/key_value.proto"),
            App::Agreement => include_str!("../proto/agreement.proto"),
        }
    }

    /// The user code (for counting its lines).
    pub fn user_code(self) -> &'static str {
        match self {
            App::SyncAgg => include_str!("sync_agg.rs"),
            App::AsyncAgg => include_str!("async_agg.rs"),
            App::KeyValue => include_str!("key_value.rs"),
            App::Agreement => include_str!("agreement.rs"),
        }
    }
}

/// Lines of code: not blank, not only a comment.
pub fn code_lines(src: &str) -> usize {
    src.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("//")).count()
}

/// The application's NetFilter, checked against its service.
pub fn netfilter(app: App) -> Result<NetFilter, String> {
    let file = format!("examples/{}.proto", app.name());
    let (tables, services) = load_sources(&[(&file, app.proto())]).map_err(|e| e.to_string())?;
    let service = select_service(&services, app.filter()).map_err(|e| e.to_string())?;
    NetFilter::parse(app.filter(), service, &tables)
        .map_err(|e| format!("{} NetFilter: {e}", app.name()))
}

/// What the filter asks of the data plane, for `members` members.
pub fn registration(app: App, name: &str, members: u16) -> Result<Registration, String> {
    let f = netfilter(app)?;
    // Map workloads spread a large call over two flows per member.
    let flows_per_member = if f.add_to.is_empty() || !f.cnt_fwd.is_empty() { 1 } else { 2 };
    Ok(f.registration(name, members, flows_per_member))
}

/// What the server process measured.
#[derive(Debug, Default)]
pub struct ServerReport {
    /// The leader's check (agreement only).
    pub verdict: Option<Verdict>,
    /// The agent's counters.
    pub stats: ServerStats,
    /// Mean time from proposal to commit (agreement, sequential).
    pub commit_latency: Option<Duration>,
    /// Time from the first proposal to the last commit (agreement).
    pub leader_time: Option<Duration>,
    /// The ordinary calls' bytes on the wire.
    pub wire: Arc<WireBytes>,
}

/// The application's service (the user's server trait implementation).
pub fn service(app: App) -> Arc<dyn Service> {
    match app {
        App::SyncAgg => TrainerServer::new(TrainerService),
        App::AsyncAgg => WordCountServer::new(WordCountService::default()),
        App::KeyValue => MonitorServer::new(MonitorService::default()),
        App::Agreement => AcceptorServer::new(AcceptorService),
    }
}

/// Bytes the ordinary calls moved on the wire, both ways: TCP payload
/// (HTTP/2 frames with the gRPC messages in them), counted by a relay in
/// front of the server.
#[derive(Debug, Default)]
pub struct WireBytes {
    /// From the clients to the server.
    pub to_server: std::sync::atomic::AtomicU64,
    /// From the server to the clients.
    pub to_clients: std::sync::atomic::AtomicU64,
}

/// Serves the application's service over gRPC on `host` (a free port), on
/// a thread of its own for the rest of the process; returns the address
/// the clients call and the bytes they move. The clients reach the server
/// through a TCP relay that counts the payload each way (the transport's
/// bytes, framing included), so the byte figures are what the wire
/// carried, not the messages' sizes.
pub fn serve_rpc(app: App, host: std::net::IpAddr) -> Result<(SocketAddr, Arc<WireBytes>), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio: {e}"))?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind((host, 0)))
        .map_err(|e| format!("rpc listener: {e}"))?;
    let server = listener.local_addr().map_err(|e| e.to_string())?;
    let router = Arc::new(Router::new(ServerOptions::default()).add_service(service(app)));
    std::thread::spawn(move || {
        if let Err(e) = rt.block_on(router.serve(listener)) {
            eprintln!("rpc server: {e}");
        }
    });
    let relay = std::net::TcpListener::bind((host, 0)).map_err(|e| format!("relay: {e}"))?;
    let addr = relay.local_addr().map_err(|e| e.to_string())?;
    let bytes = Arc::new(WireBytes::default());
    let counters = bytes.clone();
    std::thread::spawn(move || {
        for client in relay.incoming().flatten() {
            let Ok(upstream) = std::net::TcpStream::connect(server) else { continue };
            let _ = (client.set_nodelay(true), upstream.set_nodelay(true));
            let (Ok(c2), Ok(u2)) = (client.try_clone(), upstream.try_clone()) else { continue };
            let up = counters.clone();
            std::thread::spawn(move || pump(client, upstream, &up.to_server));
            let down = counters.clone();
            std::thread::spawn(move || pump(u2, c2, &down.to_clients));
        }
    });
    Ok((addr, bytes))
}

/// Copies `from` to `to` until either ends, counting the bytes.
fn pump(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    count: &std::sync::atomic::AtomicU64,
) {
    use std::io::{Read, Write};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                count.fetch_add(n as u64, Ordering::Relaxed);
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// Registers and runs the server agent until `stop`, with the application's
/// service served over gRPC beside it; for agreement, the leader proposes
/// and checks the commits. `ready` is called once the application is
/// registered and the service listens (at the address it is given).
pub fn serve(
    app: App,
    opts: &Options,
    params: &Params,
    tweaks: Tweaks,
    name: &str,
    stop: &AtomicBool,
    ready: impl FnOnce(&ServerRuntime, SocketAddr),
) -> Result<ServerReport, String> {
    let mut reg = registration(app, name, params.clients)?;
    reg.member_loss = tweaks.member_loss.unwrap_or(reg.member_loss);
    reg.clear = tweaks.clear.unwrap_or(reg.clear);
    reg.cache = tweaks.cache.unwrap_or(reg.cache);
    reg.memory = tweaks.memory.unwrap_or(reg.memory);
    let mut commit_latency = None;
    let mut leader_time = None;
    let (rpc, wire) = serve_rpc(app, opts.host)?;
    let mut rt =
        ServerRuntime::register(opts, reg, ServerTuning::default()).map_err(|e| e.to_string())?;
    ready(&rt, rpc);
    let mut verdict = None;
    if app == App::Agreement {
        // Acceptors must have joined before the first proposal.
        let end = std::time::Instant::now() + Duration::from_secs(30);
        while rt.joined() < usize::from(params.clients) && std::time::Instant::now() < end {
            rt.refresh_members().map_err(|e| e.to_string())?;
            rt.step(Duration::from_millis(20)).map_err(|e| e.to_string())?;
        }
        let proposals = check::proposals(params.seed, params.scale);
        let started = std::time::Instant::now();
        let committed = if params.sequential {
            // One instance at a time: each call's duration is a commit latency.
            let mut all = BTreeMap::new();
            let t = std::time::Instant::now();
            for p in &proposals {
                all.extend(agreement::leader(
                    &mut rt,
                    std::slice::from_ref(p),
                    Duration::from_secs(10),
                )?);
            }
            commit_latency = Some(t.elapsed() / proposals.len().max(1) as u32);
            all
        } else {
            agreement::leader(&mut rt, &proposals, Duration::from_secs(120))?
        };
        leader_time = Some(started.elapsed());
        write_results(
            params,
            "server",
            committed.iter().map(|(i, v)| serde_json::json!({"instance": i, "value": v})),
        );
        let expect: BTreeMap<u32, i32> = proposals.iter().map(|(i, v)| (*i, *v as i32)).collect();
        verdict = Some(self::verdict(
            committed == expect,
            format!(
                "leader: {} of {} instances committed with their values",
                committed.iter().filter(|(i, v)| expect.get(i) == Some(v)).count(),
                expect.len()
            ),
            proposals.len() as u64,
        ));
    }
    while !stop.load(Ordering::Relaxed) {
        rt.step(Duration::from_millis(20)).map_err(|e| e.to_string())?;
    }
    Ok(ServerReport { verdict, stats: rt.stats(), commit_latency, leader_time, wire })
}

fn status(e: Status) -> String {
    e.to_string()
}

/// Joins as `member` and runs the application's client side through the
/// service's generated in-network client (the server's gRPC address is
/// `rpc`), checking the results.
pub fn client(
    app: App,
    opts: &Options,
    params: &Params,
    name: &str,
    member: u16,
    rpc: SocketAddr,
    progress: &mut dyn FnMut(u64),
) -> Result<Verdict, String> {
    let agent = ClientRuntime::join(opts, name, member, ClientTuning::default())
        .map_err(|e| e.to_string())?
        .spawn();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio: {e}"))?;
    rt.block_on(async move {
        let channel = Channel::connect(&rpc.to_string()).await.map_err(status)?;
        let filter = app.filter();
        let (mut verdict, face) = match app {
            App::SyncAgg => {
                let c = TrainerIncClient::new(channel, filter, agent).map_err(status)?;
                let verdict = sync_client(&c, params, member, progress).await?;
                leave(c.inc()).await?;
                (verdict, c.inc().stats())
            }
            App::AsyncAgg => {
                let c = WordCountIncClient::new(channel, filter, agent).map_err(status)?;
                let verdict = async_client(&c, params, member).await?;
                leave(c.inc()).await?;
                (verdict, c.inc().stats())
            }
            App::KeyValue => {
                let c = MonitorIncClient::new(channel, filter, agent).map_err(status)?;
                let verdict = kv_client(&c, params, member).await?;
                leave(c.inc()).await?;
                (verdict, c.inc().stats())
            }
            App::Agreement => {
                let c = AcceptorIncClient::new(channel, filter, agent).map_err(status)?;
                let verdict = agreement_client(&c, params, member).await?;
                leave(c.inc()).await?;
                (verdict, c.inc().stats())
            }
        };
        verdict.face = face;
        Ok(verdict)
    })
}

/// The member is done: its account goes to the server agent, so what
/// the data plane applied for it survives the switch dying later.
async fn leave(ch: &protoplane_inc_net::rpc::IncChannel) -> Result<(), String> {
    ch.agent().leave().await.map_err(|e| format!("leaving: {e}"))
}

/// Writes `rows` as JSON lines to `DIR/<file>.jsonl` when results are asked
/// for (`inc run --results DIR`).
fn write_results(params: &Params, file: &str, rows: impl Iterator<Item = serde_json::Value>) {
    let Some(dir) = &params.results else { return };
    let mut text = String::new();
    for r in rows {
        text.push_str(&r.to_string());
        text.push('\n');
    }
    if let Err(e) = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(dir.join(format!("{file}.jsonl")), text))
    {
        eprintln!("results: {}: {e}", dir.display());
    }
}

/// A sending member's results: how many items it sent (`client-M.jsonl`,
/// or `client-M-partP.jsonl` for a part of a restarted member).
fn write_sent(params: &Params, member: u16, what: &str, sent: u64) {
    let part = params.part.map_or(String::new(), |p| format!("-part{p}"));
    let row = serde_json::json!({ what: sent });
    write_results(params, &format!("client-{member}{part}"), std::iter::once(row));
}

/// The half of `items` a part of a restarted member sends.
fn part_of<T>(items: &[T], part: Option<u8>) -> &[T] {
    let half = items.len() / 2;
    match part {
        Some(1) => &items[..half],
        Some(_) => &items[half..],
        None => items,
    }
}

fn verdict(exact: bool, detail: String, items: u64) -> Verdict {
    Verdict { exact, detail, items, face: FaceStats::default() }
}

async fn sync_client(
    c: &TrainerIncClient,
    params: &Params,
    member: u16,
    progress: &mut dyn FnMut(u64),
) -> Result<Verdict, String> {
    let (seed, n, scale) = (params.seed, params.clients, params.scale);
    // Step by step, to report progress between steps.
    let mut got = Vec::new();
    let mut over = Vec::new();
    for (i, step) in
        check::gradients(seed, member, scale, params.overflow_permille).iter().enumerate()
    {
        let len = step.len() as u64;
        for (sums, members) in
            sync_agg::worker(c, i as u32, std::slice::from_ref(step)).await.map_err(status)?
        {
            got.push(sums);
            over.push(members);
        }
        progress(len);
    }
    write_results(
        params,
        &format!("client-{member}"),
        got.iter().zip(&over).enumerate().map(
            |(s, (sums, members))| serde_json::json!({"step": s, "sums": sums, "members": members}),
        ),
    );
    // Each step over the workers its result names (all of them unless a
    // worker was lost under `MemberLoss: continue`); the runner checks that
    // every worker names the same ones.
    let expect = check::sync_expected_over(seed, n, scale, params.overflow_permille, &over);
    let values: usize = expect.iter().map(Vec::len).sum();
    let over_list: Vec<String> = over.iter().map(|m| format!("{m:x}")).collect();
    Ok(verdict(
        got == expect,
        format!("{values} summed values over {} steps over={}", expect.len(), over_list.join(",")),
        values as u64,
    ))
}

async fn async_client(
    c: &WordCountIncClient,
    params: &Params,
    member: u16,
) -> Result<Verdict, String> {
    let (n, scale) = (params.clients, params.scale);
    let share = check::corpus_share(member, n, scale);
    let last = params.part != Some(1);
    let sent =
        async_agg::worker_part(c, part_of(&share, params.part), 50, last).await.map_err(status)?;
    if member != 0 {
        write_sent(params, member, "sent_word_counts", sent);
        return Ok(verdict(true, format!("sent {sent} word counts"), sent));
    }
    let expect = check::word_counts(scale);
    let mut words: Vec<String> = expect.keys().cloned().collect();
    words.sort();
    let got = async_agg::reader(c, i64::from(n), &words).await.map_err(status)?;
    write_results(
        params,
        "client-0",
        words.iter().map(|w| serde_json::json!({"word": w, "count": got.get(w)})),
    );
    let wrong = expect.iter().filter(|(w, n)| got.get(*w) != Some(n)).count();
    let total: i64 = expect.values().sum();
    Ok(verdict(
        wrong == 0 && got.len() == expect.len(),
        format!("{} distinct words, {total} words counted, {wrong} wrong", expect.len()),
        sent,
    ))
}

async fn kv_client(c: &MonitorIncClient, params: &Params, member: u16) -> Result<Verdict, String> {
    let (seed, n, scale) = (params.seed, params.clients, params.scale);
    let host = format!("host-{member}");
    let reports = check::reports(seed, member, scale);
    let last = params.part != Some(1);
    let sent = key_value::reporter_part(c, &host, part_of(&reports, params.part), last)
        .await
        .map_err(status)?;
    if member != 0 {
        write_sent(params, member, "sent_counter_updates", sent);
        return Ok(verdict(true, format!("sent {sent} counter updates"), sent));
    }
    let keys: Vec<i64> = (0..check::KV_KEYS).collect();
    let (got, latency) = key_value::dashboard(c, i64::from(n), &keys).await.map_err(status)?;
    write_results(
        params,
        "client-0",
        keys.iter().zip(&got).map(|(k, v)| serde_json::json!({"key": k, "value": v})),
    );
    let expect = check::kv_expected(seed, n, scale);
    let wrong = got.iter().zip(&expect).filter(|(g, e)| g != e).count();
    Ok(verdict(
        wrong == 0,
        format!(
            "{} counters read in {:.2} ms, {wrong} wrong",
            keys.len(),
            latency.as_secs_f64() * 1e3
        ),
        sent,
    ))
}

async fn agreement_client(
    c: &AcceptorIncClient,
    params: &Params,
    member: u16,
) -> Result<Verdict, String> {
    let proposals: HashMap<u32, i64> =
        check::proposals(params.seed, params.scale).into_iter().collect();
    let seen =
        agreement::acceptor(c, proposals.len(), Duration::from_secs(3)).await.map_err(status)?;
    write_results(
        params,
        &format!("client-{member}"),
        seen.commits.iter().map(|(i, v)| serde_json::json!({"instance": i, "value": v})),
    );
    let wrong = seen
        .commits
        .iter()
        .filter(|(i, v)| proposals.get(i).map(|p| *p as i32) != Some(**v))
        .count();
    // Every acceptor must learn every commit, with its value.
    Ok(verdict(
        wrong == 0 && seen.commits.len() == proposals.len(),
        format!(
            "saw {} of {} commits, {wrong} wrong, {} acceptances failed",
            seen.commits.len(),
            proposals.len(),
            seen.failed
        ),
        seen.commits.len() as u64,
    ))
}
