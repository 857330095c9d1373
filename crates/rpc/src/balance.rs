//! Load balancing: which connection a call goes on.
//!
//! A channel resolves its target ([`crate::resolve`]) into addresses and
//! keeps one *subchannel* per address: a connection that is dialled, lost
//! and dialled again, backing off after failed attempts (gRPC's
//! connection-backoff rules, [`crate::Backoff`]) on its own. The policy
//! decides which subchannels connect and which takes each call:
//!
//! - [`LbPolicy::PickFirst`] (gRPC's default; gRFC A62): the addresses are
//!   tried in order, one at a time, and every call goes to the first that
//!   connects. When that connection is lost, the next call starts over
//!   from the first address. An address list that still holds the
//!   connected address keeps it.
//! - [`LbPolicy::WeightedRoundRobin`] (gRFC A58): round robin whose
//!   shares follow the ORCA load reports the backends put in each call's
//!   trailers (`endpoint-load-metrics-bin`, see
//!   `protoplane_grpc_services::orca`): a backend that serves more queries
//!   per unit of utilization gets more calls ([`WrrConfig`]).
//! - [`LbPolicy::RoundRobin`]: every address is kept connected (a lost or
//!   failed one is dialled again in the background, after its backoff)
//!   and calls rotate over the ready ones. A backend that goes away costs
//!   no call: a call that found its connection closed before its request
//!   left is started again on another (gRFC A6's transparent retry).
//!
//! Calls never wait on a dial when some subchannel is ready. With none
//! ready, a call waits while one is connecting (or the first resolution is
//! under way) and, once every address has failed and backs off, fails at
//! once with UNAVAILABLE naming the last error, unless its
//! `wait_for_ready` is set: then it waits until its deadline.
//!
//! The channel's tasks hold the balancer weakly: they end when the last
//! clone of the channel is dropped. Dropping a subchannel (its address
//! left the list) lets its connection close once its calls end.
//!
//! Picking is a mutex held for a few loads (the ready list's length, one
//! entry) and, for round robin, one relaxed atomic increment: the common
//! case costs what the one-connection channel did.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use protoplane_grpc::status::{Code, Status};
use tokio::sync::Notify;

use crate::backoff::Attempts;
use crate::client::{dial, unavailable, ChannelOptions, Link};
use crate::resolve::{Address, Resolution, Resolver};

/// How a channel spreads its calls over its target's addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum LbPolicy {
    /// The first address that connects takes every call (gRFC A62).
    #[default]
    PickFirst,
    /// Every address connected; calls rotate over the ready ones.
    RoundRobin,
    /// Round robin weighted by the backends' ORCA load reports (gRFC A58).
    WeightedRoundRobin(WrrConfig),
}

/// Weighted round robin's settings (gRFC A58's names and defaults).
///
/// A backend's weight is
/// `qps / (utilization + error_utilization_penalty × eps / qps)` from its
/// latest report (utilization: the application's
/// own when it reports one, else CPU). A weight counts once the backend
/// has reported for `blackout_period` without a gap longer than
/// `weight_expiration_period`; backends without one get the mean of the
/// others, and with fewer than two weighted backends the policy is plain
/// round robin.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WrrConfig {
    pub blackout_period: Duration,
    pub weight_expiration_period: Duration,
    /// How often the weights in use are recomputed (at least 100 ms).
    pub weight_update_period: Duration,
    pub error_utilization_penalty: f64,
    /// Weights from each backend's out-of-band stream
    /// (`OpenRcaService/StreamCoreMetrics`) instead of per-call trailers.
    pub enable_oob_load_report: bool,
    /// The report interval asked of that stream (the server may send less
    /// often: its own minimum applies).
    pub oob_reporting_period: Duration,
}

impl Default for WrrConfig {
    fn default() -> Self {
        WrrConfig {
            blackout_period: Duration::from_secs(10),
            weight_expiration_period: Duration::from_secs(180),
            weight_update_period: Duration::from_secs(1),
            error_utilization_penalty: 1.0,
            enable_oob_load_report: false,
            oob_reporting_period: Duration::from_secs(10),
        }
    }
}

impl LbPolicy {
    /// The name gRPC's service config gives the policy.
    pub fn name(self) -> &'static str {
        match self {
            LbPolicy::PickFirst => "pick_first",
            LbPolicy::RoundRobin => "round_robin",
            LbPolicy::WeightedRoundRobin(_) => "weighted_round_robin",
        }
    }

    /// Whether every address is kept connected.
    fn keeps_all(self) -> bool {
        !matches!(self, LbPolicy::PickFirst)
    }
}

impl FromStr for LbPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<LbPolicy, String> {
        match s {
            "pick_first" => Ok(LbPolicy::PickFirst),
            "round_robin" => Ok(LbPolicy::RoundRobin),
            "weighted_round_robin" => Ok(LbPolicy::WeightedRoundRobin(WrrConfig::default())),
            other => Err(format!(
                "unknown policy {other:?} (pick_first, round_robin or weighted_round_robin)"
            )),
        }
    }
}

/// A subchannel's weight from its load reports.
#[derive(Debug, Default)]
struct Weight {
    weight: f64,
    /// Since when it has had a weight without a gap (the blackout).
    non_empty_since: Option<Instant>,
    last_updated: Option<Instant>,
}

/// One address and its connection.
#[derive(Debug)]
pub(crate) struct Subchannel {
    /// Where to dial; `None` for a channel over a stream it was given.
    pub(crate) addr: Option<Address>,
    link: Mutex<Link>,
    attempts: Mutex<Attempts>,
    /// An attempt is under way.
    dialling: AtomicBool,
    /// A round-robin task keeps this subchannel connected (it may be
    /// sleeping through a backoff).
    kept: AtomicBool,
    /// Its address left the resolver's list: never dialled again.
    removed: AtomicBool,
    /// Weighted round robin's view of its load.
    weight: Mutex<Weight>,
    /// Round robin's weight from the resolver (1 unless it gave some).
    static_weight: std::sync::atomic::AtomicU32,
    /// What its health service said (gRFC A17), when the service config
    /// asks for health checks.
    health: Mutex<Health>,
}

/// A connected subchannel's health, by its server's health service.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Health {
    /// Not checked (no health check configured, or the server has no
    /// health service): ready once connected.
    Unchecked,
    /// Connected, no answer yet.
    Pending,
    /// SERVING: it takes calls.
    Serving,
    /// Anything else: no calls until it says SERVING again.
    NotServing(String),
}

impl Subchannel {
    fn new(addr: Option<Address>, link: Link, opts: &ChannelOptions) -> Arc<Subchannel> {
        Arc::new(Subchannel {
            addr,
            link: Mutex::new(link),
            attempts: Mutex::new(Attempts::new(opts.backoff)),
            dialling: AtomicBool::new(false),
            kept: AtomicBool::new(false),
            removed: AtomicBool::new(false),
            weight: Mutex::new(Weight::default()),
            static_weight: std::sync::atomic::AtomicU32::new(1),
            health: Mutex::new(Health::Unchecked),
        })
    }

    fn health(&self) -> MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn weight(&self) -> MutexGuard<'_, Weight> {
        self.weight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A load report arrived from this backend (gRFC A58's weight).
    pub(crate) fn report(&self, r: &protoplane_grpc_services::orca::LoadReport, penalty: f64) {
        let util = if r.application_utilization > 0.0 {
            r.application_utilization
        } else {
            r.cpu_utilization
        };
        let qps = r.rps_fractional;
        if !(util > 0.0 && qps > 0.0 && util.is_finite() && qps.is_finite()) {
            return;
        }
        let eps = if r.eps.is_finite() { r.eps.max(0.0) } else { 0.0 };
        let w = qps / (util + penalty * eps / qps);
        let now = Instant::now();
        let mut s = self.weight();
        s.weight = w;
        s.last_updated = Some(now);
        s.non_empty_since.get_or_insert(now);
    }

    /// The weight to use now: 0 while blacked out, expired or unknown.
    fn current_weight(&self, now: Instant, cfg: &WrrConfig) -> f64 {
        let mut s = self.weight();
        let Some(last) = s.last_updated else { return 0.0 };
        if now.saturating_duration_since(last) > cfg.weight_expiration_period {
            s.non_empty_since = None;
            return 0.0;
        }
        match s.non_empty_since {
            Some(since) if now.saturating_duration_since(since) >= cfg.blackout_period => s.weight,
            _ => 0.0,
        }
    }

    fn attempts(&self) -> MutexGuard<'_, Attempts> {
        self.attempts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn link(&self) -> Link {
        self.link.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_link(&self, link: Link) {
        *self.link.lock().unwrap_or_else(|e| e.into_inner()) = link;
    }

    fn backing_off(&self, now: Instant) -> Option<Instant> {
        self.attempts().backing_off(now).map(|(at, _)| at)
    }

    /// Why calls fail while this subchannel backs off.
    fn failure(&self, now: Instant, name_it: bool) -> Option<Status> {
        let a = self.attempts();
        let (at, why) = a.backing_off(now)?;
        let left = at.saturating_duration_since(now).as_millis();
        let failures = a.failures();
        let addr = match (&self.addr, name_it) {
            (Some(addr), true) => format!("{addr}: "),
            _ => String::new(),
        };
        Some(unavailable(format!(
            "{addr}{why} ({failures} failed attempts; the next in {left} ms)"
        )))
    }
}

/// Where a call's ORCA load report goes (weighted round robin): its
/// subchannel and the error penalty.
pub(crate) type ReportTo = Option<(Arc<Subchannel>, f64)>;

/// Where a channel is, in gRPC's connectivity states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connectivity {
    /// No connection, and none being made: the next call dials.
    Idle,
    /// A connection attempt (or the first resolution) is under way.
    Connecting,
    /// Calls start on a live connection.
    Ready,
    /// Every attempt failed; the channel waits before the next.
    TransientFailure,
}

/// Wake-ups the channel's tasks wait on without holding the balancer.
#[derive(Debug, Default)]
struct Signals {
    /// A subchannel or the address list changed: picks look again.
    changed: Notify,
    /// A connection was lost: resolve again (rate-limited).
    resolve_now: Notify,
    /// The channel is gone.
    closed: AtomicBool,
    close: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// One per address, in the resolver's order.
    subs: Vec<Arc<Subchannel>>,
    /// The subchannels calls go to (pick first: at most one).
    ready: Vec<(Arc<Subchannel>, Link)>,
    /// A resolution has arrived.
    resolved: bool,
    /// Why the last resolution failed (the previous addresses stay).
    resolve_error: Option<Status>,
    /// A pick-first pass over the addresses is under way.
    passing: bool,
    /// Weighted round robin's scheduler over `ready`.
    wrr: Scheduler,
    /// Bumped whenever `ready` or the resolver's weights change.
    generation: u64,
    /// The resolver gave weights that are not all equal.
    weighted: bool,
}

/// Smooth weighted round robin (nginx's): each pick adds every weight to
/// its running total and takes the largest, which then gives back the sum;
/// over any run of picks each backend gets its share, interleaved. The
/// weights are those of the ready list when last rebuilt.
#[derive(Debug, Default)]
struct Scheduler {
    weights: Vec<f64>,
    running: Vec<f64>,
    total: f64,
    built: Option<Instant>,
    /// The state's generation when built.
    generation: u64,
}

impl Scheduler {
    /// Weights from the resolver.
    fn rebuild_static(&mut self, ready: &[(Arc<Subchannel>, Link)], generation: u64) {
        let w: Vec<f64> =
            ready.iter().map(|(s, _)| f64::from(s.static_weight.load(Ordering::Relaxed))).collect();
        self.total = w.iter().sum();
        self.running = vec![0.0; w.len()];
        self.weights = w;
        self.generation = generation;
    }

    fn rebuild(&mut self, ready: &[(Arc<Subchannel>, Link)], now: Instant, cfg: &WrrConfig) {
        let mut w: Vec<f64> = ready.iter().map(|(s, _)| s.current_weight(now, cfg)).collect();
        let known: Vec<f64> = w.iter().copied().filter(|&x| x > 0.0).collect();
        if known.len() < 2 {
            w.iter_mut().for_each(|x| *x = 1.0);
        } else {
            let mean = known.iter().sum::<f64>() / known.len() as f64;
            w.iter_mut().filter(|x| **x <= 0.0).for_each(|x| *x = mean);
        }
        self.total = w.iter().sum();
        if self.running.len() != w.len() {
            self.running = vec![0.0; w.len()];
        }
        self.weights = w;
        self.built = Some(now);
    }

    fn pick(&mut self) -> usize {
        let mut best = 0;
        for i in 0..self.weights.len() {
            self.running[i] += self.weights[i];
            if self.running[i] > self.running[best] {
                best = i;
            }
        }
        self.running[best] -= self.total;
        best
    }
}

/// The subchannels of a channel and its policy.
pub(crate) struct Balancer {
    policy: LbPolicy,
    /// `None`: a channel over one given stream, never dialled again.
    resolver: Option<Arc<dyn Resolver>>,
    opts: Arc<ChannelOptions>,
    state: Mutex<State>,
    signals: Arc<Signals>,
    /// Round robin's position.
    next: AtomicUsize,
    /// The keepalive time of the next connection: doubled each time a
    /// server sends the channel away for pinging too often (gRFC A8).
    keepalive_time: Mutex<Option<Duration>>,
    resolving: AtomicBool,
    me: Weak<Balancer>,
}

impl std::fmt::Debug for Balancer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balancer")
            .field("policy", &self.policy)
            .field("state", &*self.lock())
            .finish_non_exhaustive()
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.signals.closed.store(true, Ordering::SeqCst);
        self.signals.close.notify_waiters();
        self.signals.close.notify_one();
    }
}

/// What one look at the state decided.
enum Step {
    Picked(Link, ReportTo),
    /// Wait for a change (or until then, when every address backs off).
    Wait(Option<Instant>),
}

impl Balancer {
    /// A balancer over what `resolver` finds.
    pub(crate) fn new(resolver: Arc<dyn Resolver>, opts: Arc<ChannelOptions>) -> Arc<Balancer> {
        Balancer::build(Some(resolver), opts, State::default())
    }

    /// A balancer with one connection and nowhere to dial.
    pub(crate) fn fixed(link: Link, opts: Arc<ChannelOptions>) -> Arc<Balancer> {
        let sub = Subchannel::new(None, link.clone(), &opts);
        let state = State {
            subs: vec![sub.clone()],
            ready: vec![(sub, link)],
            resolved: true,
            ..State::default()
        };
        Balancer::build(None, opts, state)
    }

    fn build(
        resolver: Option<Arc<dyn Resolver>>,
        opts: Arc<ChannelOptions>,
        state: State,
    ) -> Arc<Balancer> {
        let keepalive_time = opts.keepalive.as_ref().map(|k| k.time);
        Arc::new_cyclic(|me| Balancer {
            policy: opts.lb,
            resolver,
            opts,
            state: Mutex::new(state),
            signals: Arc::default(),
            next: AtomicUsize::new(0),
            keepalive_time: Mutex::new(keepalive_time),
            resolving: AtomicBool::new(false),
            me: me.clone(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connections that take new calls (one per ready backend).
    pub(crate) fn ready_connections(&self) -> usize {
        self.lock().ready.iter().filter(|(_, l)| l.usable()).count()
    }

    /// Whether some connection takes new calls.
    pub(crate) fn takes_calls(&self) -> bool {
        self.lock().ready.iter().any(|(_, l)| l.usable())
    }

    /// The channel's connectivity state (see [`Connectivity`]).
    pub(crate) fn connectivity(&self) -> Connectivity {
        let st = self.lock();
        if st.ready.iter().any(|(_, l)| l.usable()) {
            return Connectivity::Ready;
        }
        if self.resolver.is_none() {
            return Connectivity::TransientFailure;
        }
        let now = Instant::now();
        let checking = |h: &Health| *h == Health::Pending;
        if st.passing
            || st.subs.iter().any(|s| s.dialling.load(Ordering::SeqCst))
            || st.subs.iter().any(|s| s.link().usable() && checking(&s.health()))
        {
            Connectivity::Connecting
        } else if st.subs.iter().any(|s| s.link().usable()) {
            // Connected, and every connection's health says not serving.
            Connectivity::TransientFailure
        } else if st.subs.iter().any(|s| s.backing_off(now).is_some()) || st.resolve_error.is_some()
        {
            Connectivity::TransientFailure
        } else if self.resolving.load(Ordering::SeqCst) && !st.resolved {
            Connectivity::Connecting
        } else {
            Connectivity::Idle
        }
    }

    /// The connection a call goes on: at once when one is ready; otherwise
    /// as the module's documentation says.
    pub(crate) async fn pick(
        &self,
        wait: bool,
        deadline: Option<Instant>,
    ) -> Result<(Link, ReportTo), Status> {
        if let Some(p) = self.pick_ready() {
            return Ok(p);
        }
        if self.resolver.is_none() {
            // Nowhere to dial: the one connection answers for itself.
            return Ok((self.lock().subs[0].link(), None));
        }
        self.start_resolving();
        loop {
            let changed = self.signals.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let until = match self.step(wait)? {
                Step::Picked(link, report) => return Ok((link, report)),
                Step::Wait(until) => until,
            };
            let limit = match (until, deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match limit {
                None => changed.await,
                Some(t) => {
                    let _ = tokio::time::timeout_at(t.into(), changed).await;
                }
            }
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return Err(Status::new(Code::DeadlineExceeded, "deadline exceeded"));
            }
        }
    }

    /// The fast path: a ready connection, or `None` to look closer.
    fn pick_ready(&self) -> Option<(Link, ReportTo)> {
        let (link, report) = {
            let mut st = self.lock();
            if st.ready.is_empty() {
                return None;
            }
            let i = self.index(&mut st);
            let (sub, link) = &st.ready[i];
            (link.clone(), self.reports_to(sub))
        };
        link.usable().then_some((link, report))
    }

    /// Which ready subchannel the next call takes (`ready` not empty).
    fn index(&self, st: &mut State) -> usize {
        let n = st.ready.len();
        match self.policy {
            _ if n == 1 => 0,
            LbPolicy::PickFirst => 0,
            LbPolicy::RoundRobin if !st.weighted => self.next.fetch_add(1, Ordering::Relaxed) % n,
            LbPolicy::RoundRobin => {
                if st.wrr.generation != st.generation || st.wrr.weights.len() != n {
                    let State { ready, wrr, generation, .. } = st;
                    wrr.rebuild_static(ready, *generation);
                }
                st.wrr.pick()
            }
            LbPolicy::WeightedRoundRobin(cfg) => {
                let now = Instant::now();
                let period = cfg.weight_update_period.max(Duration::from_millis(100));
                let stale = st.wrr.weights.len() != n
                    || st.wrr.built.is_none_or(|b| now.saturating_duration_since(b) >= period);
                if stale {
                    let State { ready, wrr, .. } = st;
                    wrr.rebuild(ready, now, &cfg);
                }
                st.wrr.pick()
            }
        }
    }

    /// Where a call's load report goes: its subchannel, under weighted
    /// round robin with per-call reports (only then is the subchannel held
    /// by the call). With out-of-band reports the trailers are not read,
    /// as in gRPC: one source of weights.
    fn reports_to(&self, sub: &Arc<Subchannel>) -> ReportTo {
        match self.policy {
            LbPolicy::WeightedRoundRobin(cfg) if !cfg.enable_oob_load_report => {
                Some((sub.clone(), cfg.error_utilization_penalty))
            }
            _ => None,
        }
    }

    /// One look at the state: a pick, an error, or what to wait for.
    fn step(&self, wait: bool) -> Result<Step, Status> {
        let now = Instant::now();
        let mut st = self.lock();
        self.prune(&mut st);
        if !st.ready.is_empty() {
            let i = self.index(&mut st);
            let (sub, link) = &st.ready[i];
            return Ok(Step::Picked(link.clone(), self.reports_to(sub)));
        }
        if st.subs.is_empty() {
            // Resolving, or resolved to nothing.
            let why = match (&st.resolve_error, st.resolved) {
                (Some(e), _) => Some(e.clone()),
                (None, true) => Some(unavailable("the target resolved to no address")),
                (None, false) => None,
            };
            return match why {
                Some(e) if !wait => Err(e),
                _ => Ok(Step::Wait(None)),
            };
        }
        match self.policy {
            LbPolicy::PickFirst => {
                if st.passing {
                    return Ok(Step::Wait(None));
                }
                if st.subs.iter().any(|s| s.backing_off(now).is_none()) {
                    st.passing = true;
                    tokio::spawn(pass(self.me.clone()));
                    return Ok(Step::Wait(None));
                }
            }
            LbPolicy::RoundRobin | LbPolicy::WeightedRoundRobin(_) => {
                for s in &st.subs {
                    self.keep_connected(s);
                }
                if st.subs.iter().any(|s| s.dialling.load(Ordering::SeqCst)) {
                    return Ok(Step::Wait(None));
                }
            }
        }
        // Connected but not healthy (gRFC A17): wait for a health answer,
        // or fail at once when every connected one says it is not serving.
        let mut unhealthy = None;
        for s in st.subs.iter().filter(|s| s.link().usable()) {
            match &*s.health() {
                Health::Pending => return Ok(Step::Wait(None)),
                Health::NotServing(why) => unhealthy = Some(why.clone()),
                Health::Unchecked | Health::Serving => {}
            }
        }
        if let Some(why) = unhealthy {
            return match wait {
                true => Ok(Step::Wait(None)),
                false => Err(unavailable(format!("no backend is healthy: {why}"))),
            };
        }
        // Every address failed and backs off.
        let soonest = st
            .subs
            .iter()
            .filter_map(|s| s.backing_off(now).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at);
        let Some((at, sub)) = soonest else {
            // Between a task's attempts: look again shortly.
            return Ok(Step::Wait(Some(now + Duration::from_millis(1))));
        };
        if wait {
            return Ok(Step::Wait(Some(at)));
        }
        let name_it = st.subs.len() > 1;
        Err(sub.failure(now, name_it).unwrap_or_else(|| unavailable("connection failed")))
    }

    /// Drops ready connections that take no new calls: the subchannel is
    /// idle again (round robin dials it at once; pick first at the next
    /// call), and DNS is asked again.
    fn prune(&self, st: &mut State) {
        let before = st.ready.len();
        st.ready.retain(|(sub, link)| {
            if link.usable() {
                return true;
            }
            if link.sent_away_for_pings() {
                // Sent away for pinging too often: half as often from now
                // on (grpc-go does the same).
                let mut t = self.keepalive_time.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(t) = t.as_mut() {
                    *t = t.saturating_mul(2).min(Duration::from_secs(2 * 60 * 60));
                }
            }
            sub.set_link(Link::Idle);
            false
        });
        if st.ready.len() != before {
            st.generation += 1;
            self.signals.resolve_now.notify_one();
        }
    }

    /// The options of the next connection.
    fn dial_options(&self) -> ChannelOptions {
        let mut opts = (*self.opts).clone();
        let time = *self.keepalive_time.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(k), Some(t)) = (opts.keepalive.as_mut(), time) {
            k.time = t;
        }
        opts
    }

    fn start_resolving(&self) {
        let Some(resolver) = &self.resolver else { return };
        if self.resolving.swap(true, Ordering::SeqCst) {
            return;
        }
        let task = resolve(
            self.me.clone(),
            resolver.clone(),
            self.signals.clone(),
            self.opts.resolve_every,
            self.opts.resolve_min_interval,
        );
        tokio::spawn(task);
    }

    /// Installs what the resolver found.
    fn apply(&self, found: Result<Resolution, Status>) {
        let mut st = self.lock();
        match found {
            Err(e) => st.resolve_error = Some(e),
            Ok(r) => {
                st.resolve_error = None;
                st.resolved = true;
                let mut subs: Vec<Arc<Subchannel>> = Vec::with_capacity(r.addresses.len());
                for (i, a) in r.addresses.into_iter().enumerate() {
                    if subs.iter().any(|s| s.addr.as_ref() == Some(&a)) {
                        continue;
                    }
                    let kept = st.subs.iter().find(|s| s.addr.as_ref() == Some(&a)).cloned();
                    let sub =
                        kept.unwrap_or_else(|| Subchannel::new(Some(a), Link::Idle, &self.opts));
                    let w = r.weights.get(i).copied().unwrap_or(1).max(1);
                    sub.static_weight.store(w, Ordering::Relaxed);
                    subs.push(sub);
                }
                st.weighted = subs.iter().any(|s| s.static_weight.load(Ordering::Relaxed) != 1);
                st.generation += 1;
                for old in &st.subs {
                    if !subs.iter().any(|s| Arc::ptr_eq(s, old)) {
                        old.removed.store(true, Ordering::SeqCst);
                        // Its connection closes once its calls end.
                        old.set_link(Link::Idle);
                    }
                }
                st.ready.retain(|(s, _)| !s.removed.load(Ordering::SeqCst));
                st.subs = subs;
                if self.policy.keeps_all() {
                    for s in &st.subs {
                        self.keep_connected(s);
                    }
                }
            }
        }
        drop(st);
        self.signals.changed.notify_waiters();
    }

    /// Round robin: starts the task that dials `sub` until it connects,
    /// unless it is connected or has one.
    fn keep_connected(&self, sub: &Arc<Subchannel>) {
        if !sub.link().usable() && !sub.kept.swap(true, Ordering::SeqCst) {
            tokio::spawn(keep(self.me.clone(), sub.clone()));
        }
    }

    /// A subchannel connected: calls may use it.
    fn connected(&self, sub: &Arc<Subchannel>, link: Link) -> bool {
        let mut st = self.lock();
        if sub.removed.load(Ordering::SeqCst) {
            return false;
        }
        sub.set_link(link.clone());
        sub.attempts().connected();
        // A new connection's weight starts over (its blackout again).
        *sub.weight() = Weight::default();
        st.generation += 1;
        match self.policy {
            LbPolicy::PickFirst => st.ready = vec![(sub.clone(), link)],
            LbPolicy::RoundRobin | LbPolicy::WeightedRoundRobin(_) => {
                st.ready.retain(|(s, _)| !Arc::ptr_eq(s, sub));
                if let LbPolicy::WeightedRoundRobin(cfg) = self.policy {
                    if cfg.enable_oob_load_report {
                        tokio::spawn(watch_load(self.me.clone(), sub.clone(), link.clone(), cfg));
                    }
                }
                match self.health_check() {
                    // Ready once its health service says so (gRFC A17).
                    Some(name) => {
                        *sub.health() = Health::Pending;
                        tokio::spawn(watch_health(self.me.clone(), sub.clone(), link, name));
                    }
                    None => st.ready.push((sub.clone(), link)),
                }
            }
        }
        true
    }

    /// The service whose health gates round robin's subchannels, if the
    /// service config names one (pick first checks no health, as in gRPC).
    fn health_check(&self) -> Option<String> {
        self.opts.service_config.as_ref()?.health_check.clone()
    }

    /// A subchannel's health service answered: it takes calls, or not.
    fn set_health(&self, sub: &Arc<Subchannel>, link: &Link, health: Health) {
        let mut st = self.lock();
        if sub.removed.load(Ordering::SeqCst) {
            return;
        }
        let serving = matches!(health, Health::Serving | Health::Unchecked) && link.usable();
        *sub.health() = health;
        let had = st.ready.iter().any(|(s, _)| Arc::ptr_eq(s, sub));
        if serving && !had {
            st.ready.push((sub.clone(), link.clone()));
            st.generation += 1;
        } else if !serving && had {
            st.ready.retain(|(s, _)| !Arc::ptr_eq(s, sub));
            st.generation += 1;
        }
        drop(st);
        self.signals.changed.notify_waiters();
    }
}

/// gRFC A17: watches `sub`'s health over its connection `link`
/// (`grpc.health.v1.Health/Watch` for `service`), moving it in and out of
/// the ready list, until the connection is lost or the subchannel goes. A
/// server without the health service (UNIMPLEMENTED) counts as healthy;
/// a watch that fails otherwise is started again after a backoff, the
/// subchannel taking no calls meanwhile.
async fn watch_health(b: Weak<Balancer>, sub: Arc<Subchannel>, link: Link, service: String) {
    let mut backoff = Attempts::new(crate::backoff::Backoff::default());
    loop {
        let Some(bal) = b.upgrade() else { return };
        if sub.removed.load(Ordering::SeqCst) || !link.usable() {
            bal.set_health(&sub, &link, Health::NotServing("connection lost".into()));
            return;
        }
        let opts = ChannelOptions { service_config: None, ..(*bal.opts).clone() };
        let authority = sub.addr.as_ref().map_or_else(String::new, |a| a.to_string());
        let ch = crate::client::Channel::on_link(link.clone(), &authority, opts);
        let signals = bal.signals.clone();
        drop(bal);
        let watch = watch_once(&ch, &service, |h| {
            if let Some(bal) = b.upgrade() {
                bal.set_health(&sub, &link, h);
            }
        });
        let r = tokio::select! {
            r = watch => r,
            () = signals.close.notified() => return,
        };
        let Some(bal) = b.upgrade() else { return };
        if r.code == Code::Unimplemented {
            // No health service there: it is used as if healthy.
            bal.set_health(&sub, &link, Health::Unchecked);
            return;
        }
        bal.set_health(&sub, &link, Health::NotServing(format!("health check: {}", r.message)));
        drop(bal);
        let at = backoff.failed(Instant::now(), r.message);
        tokio::select! {
            () = tokio::time::sleep_until(at.into()) => {}
            () = signals.close.notified() => return,
        }
    }
}

/// gRFC A58's out-of-band reports: streams `sub`'s load reports over its
/// connection `link` (`xds.service.orca.v3.OpenRcaService/StreamCoreMetrics`,
/// asking for one every `oob_reporting_period`) into its weight, until the
/// connection is lost or the subchannel goes (a new connection starts its
/// own stream). A server without the service (UNIMPLEMENTED) sends no
/// reports, and the backend gets the mean weight of the others; a stream
/// that fails otherwise is opened again after a backoff. A report that does
/// not decode is ignored, as a per-call one is.
async fn watch_load(b: Weak<Balancer>, sub: Arc<Subchannel>, link: Link, cfg: WrrConfig) {
    let mut backoff = Attempts::new(crate::backoff::Backoff::default());
    loop {
        let Some(bal) = b.upgrade() else { return };
        if sub.removed.load(Ordering::SeqCst) || !link.usable() {
            return;
        }
        let opts = ChannelOptions { service_config: None, ..(*bal.opts).clone() };
        let authority = sub.addr.as_ref().map_or_else(String::new, |a| a.to_string());
        let ch = crate::client::Channel::on_link(link.clone(), &authority, opts);
        let signals = bal.signals.clone();
        drop(bal);
        let stream = stream_reports(&ch, cfg.oob_reporting_period, |r| {
            sub.report(&r, cfg.error_utilization_penalty);
        });
        let r = tokio::select! {
            r = stream => r,
            () = signals.close.notified() => return,
        };
        if r.code == Code::Unimplemented {
            return;
        }
        let at = backoff.failed(Instant::now(), r.message);
        tokio::select! {
            () = tokio::time::sleep_until(at.into()) => {}
            () = signals.close.notified() => return,
        }
    }
}

/// One `StreamCoreMetrics` call: each report that decodes goes to `seen`;
/// the status it ended with.
async fn stream_reports(
    ch: &crate::client::Channel,
    every: Duration,
    seen: impl Fn(protoplane_grpc_services::orca::LoadReport),
) -> Status {
    const STREAM: &str = "/xds.service.orca.v3.OpenRcaService/StreamCoreMetrics";
    let mut call = match ch.start(STREAM, crate::client::CallOptions::default()).await {
        Ok(c) => c,
        Err(st) => return st,
    };
    // OrcaLoadReportRequest { google.protobuf.Duration report_interval = 1; }
    // Duration { int64 seconds = 1; int32 nanos = 2; }
    let mut interval = Vec::new();
    if every.as_secs() != 0 {
        interval.push(0x08);
        put_varint(&mut interval, every.as_secs());
    }
    if every.subsec_nanos() != 0 {
        interval.push(0x10);
        put_varint(&mut interval, u64::from(every.subsec_nanos()));
    }
    let mut req = vec![0x0a];
    put_varint(&mut req, interval.len() as u64);
    req.extend_from_slice(&interval);
    if let Err(st) = call.send_last(&req).await {
        return st;
    }
    loop {
        match call.recv().await {
            Ok(Some(m)) => {
                if let Ok(r) = protoplane_grpc_services::orca::LoadReport::decode(&m) {
                    seen(r);
                }
            }
            Ok(None) => return Status::new(Code::Unavailable, "the load report stream ended"),
            Err(st) => return st,
        }
    }
}

/// Appends `v` as a varint.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// One `Watch` call: each answer goes to `seen`; the status it ended with.
async fn watch_once(ch: &crate::client::Channel, service: &str, seen: impl Fn(Health)) -> Status {
    const WATCH: &str = "/grpc.health.v1.Health/Watch";
    let mut call = match ch.start(WATCH, crate::client::CallOptions::default()).await {
        Ok(c) => c,
        Err(st) => return st,
    };
    // HealthCheckRequest { string service = 1; }
    let mut req = vec![0x0a];
    put_varint(&mut req, service.len() as u64);
    req.extend_from_slice(service.as_bytes());
    if let Err(st) = call.send_last(&req).await {
        return st;
    }
    loop {
        match call.recv().await {
            Ok(Some(m)) => seen(match serving_status(&m) {
                Some(1) => Health::Serving,
                Some(s) => Health::NotServing(format!("{service:?} is {}", status_name(s))),
                None => Health::NotServing("an answer that does not decode".into()),
            }),
            Ok(None) => return Status::new(Code::Unavailable, "the health watch ended"),
            Err(st) => return st,
        }
    }
}

/// HealthCheckResponse's `status` (field 1, an enum): `None` when the
/// bytes do not decode.
fn serving_status(b: &[u8]) -> Option<u64> {
    let mut status = 0;
    let mut at = 0;
    let varint = |at: &mut usize| -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *b.get(*at)?;
            *at += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Some(v);
            }
        }
        None
    };
    while at < b.len() {
        let key = varint(&mut at)?;
        match (key >> 3, key & 7) {
            (1, 0) => status = varint(&mut at)?,
            (_, 0) => {
                varint(&mut at)?;
            }
            (_, 1) => at += 8,
            (_, 5) => at += 4,
            (_, 2) => {
                let n = varint(&mut at)? as usize;
                at = at.checked_add(n)?;
            }
            _ => return None,
        }
        if at > b.len() {
            return None;
        }
    }
    Some(status)
}

fn status_name(s: u64) -> &'static str {
    match s {
        0 => "UNKNOWN",
        2 => "NOT_SERVING",
        3 => "SERVICE_UNKNOWN",
        _ => "not serving",
    }
}

/// One dial of `sub` with the balancer's current options.
async fn attempt(b: &Weak<Balancer>, sub: &Subchannel) -> Option<Result<Link, Status>> {
    let opts = b.upgrade()?.dial_options();
    let addr = sub.addr.clone()?;
    sub.dialling.store(true, Ordering::SeqCst);
    let limit = opts.connect_timeout;
    let r = match tokio::time::timeout(limit, dial(&addr, &opts)).await {
        Ok(r) => r,
        Err(_) => Err(unavailable(format!("connect to {addr}: timed out"))),
    };
    sub.dialling.store(false, Ordering::SeqCst);
    Some(r)
}

/// Pick first: the addresses in order until one connects.
async fn pass(b: Weak<Balancer>) {
    let mut i = 0;
    loop {
        let sub = {
            let Some(bal) = b.upgrade() else { return };
            let st = bal.lock();
            match st.subs.get(i) {
                Some(s) => s.clone(),
                None => break,
            }
        };
        i += 1;
        if sub.removed.load(Ordering::SeqCst) || sub.backing_off(Instant::now()).is_some() {
            continue;
        }
        let Some(r) = attempt(&b, &sub).await else { return };
        let Some(bal) = b.upgrade() else { return };
        match r {
            Ok(link) => {
                if bal.connected(&sub, link) {
                    bal.lock().passing = false;
                    bal.signals.changed.notify_waiters();
                    return;
                }
            }
            Err(st) => {
                sub.attempts().failed(Instant::now(), st.message);
                bal.signals.changed.notify_waiters();
            }
        }
    }
    if let Some(bal) = b.upgrade() {
        bal.lock().passing = false;
        bal.signals.resolve_now.notify_one();
        bal.signals.changed.notify_waiters();
    }
}

/// Round robin: keeps `sub` connected until it is connected, removed or
/// the channel is gone; a lost connection starts it again (see `prune`).
async fn keep(b: Weak<Balancer>, sub: Arc<Subchannel>) {
    loop {
        if sub.removed.load(Ordering::SeqCst) || sub.link().usable() {
            break;
        }
        let Some(r) = attempt(&b, &sub).await else { break };
        let Some(bal) = b.upgrade() else { break };
        match r {
            Ok(link) => {
                sub.kept.store(false, Ordering::SeqCst);
                bal.connected(&sub, link);
                bal.signals.changed.notify_waiters();
                return;
            }
            Err(st) => {
                let at = sub.attempts().failed(Instant::now(), st.message);
                bal.signals.resolve_now.notify_one();
                bal.signals.changed.notify_waiters();
                let signals = bal.signals.clone();
                drop(bal);
                tokio::select! {
                    () = tokio::time::sleep_until(at.into()) => {}
                    () = signals.close.notified() => break,
                }
            }
        }
    }
    sub.kept.store(false, Ordering::SeqCst);
}

/// The channel's resolver task: resolves at once, then again on the
/// timer and when a connection is lost (resolvers that ask again), and
/// whenever a pushing resolver sends.
async fn resolve(
    b: Weak<Balancer>,
    resolver: Arc<dyn Resolver>,
    signals: Arc<Signals>,
    every: Duration,
    min_interval: Duration,
) {
    let asks_again = resolver.asks_again();
    let mut updates = resolver.updates();
    loop {
        let found = resolver.resolve().await;
        let last = Instant::now();
        match b.upgrade() {
            Some(bal) => bal.apply(found),
            None => return,
        }
        if !asks_again && updates.is_none() {
            return;
        }
        if signals.closed.load(Ordering::SeqCst) {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(every), if asks_again => {}
            () = signals.resolve_now.notified(), if asks_again => {
                tokio::select! {
                    () = tokio::time::sleep_until((last + min_interval).into()) => {}
                    () = signals.close.notified() => return,
                }
            }
            changed = async {
                match updates.as_mut() {
                    Some(u) => u.changed().await,
                    None => std::future::pending().await,
                }
            }, if updates.is_some() => {
                if changed.is_err() {
                    // The resolver is gone: the last addresses stay.
                    updates = None;
                    if !asks_again {
                        return;
                    }
                }
            }
            () = signals.close.notified() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::serving_status;

    #[test]
    fn health_answers_decode_and_garbage_does_not_panic() {
        assert_eq!(serving_status(&[]), Some(0));
        assert_eq!(serving_status(&[0x08, 0x01]), Some(1));
        assert_eq!(serving_status(&[0x08, 0x02]), Some(2));
        // Unknown fields skipped; the last status wins.
        assert_eq!(serving_status(&[0x12, 0x01, 0x61, 0x08, 0x01, 0x08, 0x03]), Some(3));
        assert_eq!(serving_status(&[0x19, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x01]), Some(1));
        // Truncated, a length past the end, a group, an endless varint.
        for bad in [
            &[0x08][..],
            &[0x12, 0x05, 0x61],
            &[0x0b],
            &[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        ] {
            assert_eq!(serving_status(bad), None, "{bad:?}");
        }
        for len in 0..64u8 {
            let v: Vec<u8> = (0..len).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
            let _ = serving_status(&v);
        }
    }
}
