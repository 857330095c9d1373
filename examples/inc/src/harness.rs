//! Runs an application module as a server or client process: the
//! NetFilter becomes a registration, the module's functions get their
//! data, and the results are checked against [`crate::check`].

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use protoplane_inc::client::ClientTuning;
use protoplane_inc::controller::Registration;
use protoplane_inc::netfilter::{load_sources, select_service, NetFilter};
use protoplane_inc::server::{ServerStats, ServerTuning};
use protoplane_inc_net::agent::{ClientRuntime, Options, ServerRuntime};

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
#[derive(Clone, Debug, Default)]
pub struct ServerReport {
    /// The leader's check (agreement only).
    pub verdict: Option<Verdict>,
    /// The agent's counters.
    pub stats: ServerStats,
    /// Mean time from proposal to commit (agreement, sequential).
    pub commit_latency: Option<Duration>,
    /// Time from the first proposal to the last commit (agreement).
    pub leader_time: Option<Duration>,
}

/// Registers and runs the server agent until `stop`; for agreement, the
/// leader proposes and checks the commits. `ready` is called once the
/// application is registered.
pub fn serve(
    app: App,
    opts: &Options,
    params: &Params,
    tweaks: Tweaks,
    name: &str,
    stop: &AtomicBool,
    ready: impl FnOnce(&ServerRuntime),
) -> Result<ServerReport, String> {
    let mut reg = registration(app, name, params.clients)?;
    reg.clear = tweaks.clear.unwrap_or(reg.clear);
    reg.cache = tweaks.cache.unwrap_or(reg.cache);
    reg.memory = tweaks.memory.unwrap_or(reg.memory);
    let mut commit_latency = None;
    let mut leader_time = None;
    let mut rt =
        ServerRuntime::register(opts, reg, ServerTuning::default()).map_err(|e| e.to_string())?;
    ready(&rt);
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
        let expect: BTreeMap<u32, i32> = proposals.iter().map(|(i, v)| (*i, *v as i32)).collect();
        verdict = Some(Verdict {
            exact: committed == expect,
            detail: format!(
                "leader: {} of {} instances committed with their values",
                committed.iter().filter(|(i, v)| expect.get(i) == Some(v)).count(),
                expect.len()
            ),
            items: proposals.len() as u64,
        });
    }
    while !stop.load(Ordering::Relaxed) {
        rt.step(Duration::from_millis(20)).map_err(|e| e.to_string())?;
    }
    Ok(ServerReport { verdict, stats: rt.stats(), commit_latency, leader_time })
}

/// Joins as `member` and runs the application's client side, checking
/// the results.
pub fn client(
    app: App,
    opts: &Options,
    params: &Params,
    name: &str,
    member: u16,
    progress: &mut dyn FnMut(u64),
) -> Result<Verdict, String> {
    let mut rt = ClientRuntime::join(opts, name, member, ClientTuning::default())
        .map_err(|e| e.to_string())?;
    let (seed, n, scale) = (params.seed, params.clients, params.scale);
    match app {
        App::SyncAgg => {
            // Step by step, to report progress between steps.
            let mut got = Vec::new();
            for step in check::gradients(seed, member, scale, params.overflow_permille) {
                let len = step.len() as u64;
                got.extend(sync_agg::worker(&mut rt, std::slice::from_ref(&step))?);
                progress(len);
            }
            let expect = check::sync_expected(seed, n, scale, params.overflow_permille);
            let values: usize = expect.iter().map(Vec::len).sum();
            Ok(Verdict {
                exact: got == expect,
                detail: format!("{values} summed values over {} steps", expect.len()),
                items: values as u64,
            })
        }
        App::AsyncAgg => {
            let sent = async_agg::worker(&mut rt, &check::corpus_share(member, n, scale), 50)?;
            if member != 0 {
                return Ok(Verdict {
                    exact: true,
                    detail: format!("sent {sent} word counts"),
                    items: sent,
                });
            }
            let expect = check::word_counts(scale);
            let mut words: Vec<String> = expect.keys().cloned().collect();
            words.sort();
            let got = async_agg::reader(&mut rt, i64::from(n), &words)?;
            let wrong = expect.iter().filter(|(w, c)| got.get(*w) != Some(c)).count();
            let total: i64 = expect.values().sum();
            Ok(Verdict {
                exact: wrong == 0 && got.len() == expect.len(),
                detail: format!(
                    "{} distinct words, {total} words counted, {wrong} wrong",
                    expect.len()
                ),
                items: sent,
            })
        }
        App::KeyValue => {
            let sent = key_value::reporter(&mut rt, &check::reports(seed, member, scale))?;
            if member != 0 {
                return Ok(Verdict {
                    exact: true,
                    detail: format!("sent {sent} counter updates"),
                    items: sent,
                });
            }
            let keys: Vec<i64> = (0..check::KV_KEYS).collect();
            let (got, latency) = key_value::dashboard(&mut rt, i64::from(n), &keys)?;
            let expect = check::kv_expected(seed, n, scale);
            let wrong = got.iter().zip(&expect).filter(|(g, e)| g != e).count();
            Ok(Verdict {
                exact: wrong == 0,
                detail: format!(
                    "{} counters read in {:.2} ms, {wrong} wrong",
                    keys.len(),
                    latency.as_secs_f64() * 1e3
                ),
                items: sent,
            })
        }
        App::Agreement => {
            let proposals: HashMap<u32, i64> = check::proposals(seed, scale).into_iter().collect();
            let seen = agreement::acceptor(&mut rt, proposals.len(), Duration::from_secs(3))?;
            let wrong = seen
                .iter()
                .filter(|(i, v)| proposals.get(i).map(|p| *p as i32) != Some(**v))
                .count();
            Ok(Verdict {
                exact: wrong == 0,
                detail: format!("saw {} of {} commits, {wrong} wrong", seen.len(), proposals.len()),
                items: seen.len() as u64,
            })
        }
    }
}
