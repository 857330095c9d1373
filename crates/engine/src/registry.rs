//! Which attached applications serve which service.
//!
//! Several instances of one service share its load: each call goes to the
//! instance with the fewest calls open (ties rotate). The health service
//! reports a service SERVING while at least one instance is attached.
//! With engine workers, an instance bound to the caller's worker comes
//! first ([`Registry::pick`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use protoplane_grpc_services::health::{Health, ServingStatus};

use crate::attachment::Attachment;

/// The attached instances, by service name.
#[derive(Debug, Default)]
pub struct Registry {
    by_service: Mutex<HashMap<String, Vec<Arc<Attachment>>>>,
    health: Mutex<Option<Arc<Health>>>,
    turn: AtomicUsize,
    /// Services some application has served since the engine started.
    seen: Mutex<std::collections::HashSet<String>>,
    /// The last [`DETACHED_KEPT`] detachments, oldest first.
    detached: Mutex<std::collections::VecDeque<Detached>>,
    /// Services whose applications are on their way (a take-over), and
    /// until when calls for them wait for one.
    expected: Mutex<Option<(Vec<String>, std::time::Instant)>>,
    /// Woken when an instance attaches.
    arrived: tokio::sync::Notify,
    /// Applications that serve nothing (they only call out through the
    /// engine).
    callers: Mutex<Vec<Arc<Attachment>>>,
    /// Attachments bound to engine workers ([`Registry::bind`]), from
    /// their handshake on.
    bound: Mutex<Vec<std::sync::Weak<Attachment>>>,
}

/// Detachments the registry remembers (for operators and tests).
pub const DETACHED_KEPT: usize = 64;

/// An application that was attached and is not any more.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detached {
    /// The engine's number for it.
    pub id: u32,
    /// Its process id (from the attach socket's peer credentials).
    pub pid: u32,
    /// The services it served.
    pub services: Vec<String>,
    /// Why it was cut off (or that it left).
    pub reason: String,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Reports status changes to `health` from now on.
    pub fn set_health(&self, health: Arc<Health>) {
        *self.health.lock().unwrap_or_else(|e| e.into_inner()) = Some(health);
    }

    fn report(&self, service: &str, serving: bool) {
        if let Some(h) = self.health.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            let st = if serving { ServingStatus::Serving } else { ServingStatus::NotServing };
            h.set(service, st);
        }
    }

    /// Adds an attached application under each of its services.
    pub fn add(&self, att: Arc<Attachment>) {
        if att.services.is_empty() {
            self.callers.lock().unwrap_or_else(|e| e.into_inner()).push(att);
            return;
        }
        let mut map = self.by_service.lock().unwrap_or_else(|e| e.into_inner());
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        for s in &att.services {
            map.entry(s.clone()).or_default().push(att.clone());
            seen.insert(s.clone());
        }
        drop(seen);
        drop(map);
        for s in &att.services {
            self.report(s, true);
        }
        self.arrived.notify_waiters();
    }

    /// Calls for `services` that find no instance wait for one to attach,
    /// for up to `within` from now (a take-over: the applications are
    /// attaching to this engine).
    pub fn expect(&self, services: Vec<String>, within: std::time::Duration) {
        let until = std::time::Instant::now() + within;
        *self.expected.lock().unwrap_or_else(|e| e.into_inner()) = Some((services, until));
    }

    /// Waits for an instance of `service` while one is expected; whether
    /// one is attached.
    pub async fn wait_attached(&self, service: &str) -> bool {
        loop {
            let arrived = self.arrived.notified();
            if self.attached(service) > 0 {
                return true;
            }
            let until = match &*self.expected.lock().unwrap_or_else(|e| e.into_inner()) {
                Some((list, until)) if list.iter().any(|s| s == service) => *until,
                _ => return false,
            };
            if tokio::time::timeout_at(until.into(), arrived).await.is_err() {
                return self.attached(service) > 0;
            }
        }
    }

    /// The services some instance serves now, sorted.
    pub fn services(&self) -> Vec<String> {
        let map = self.by_service.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<String> = map.keys().cloned().collect();
        v.sort();
        v
    }

    /// Tells every attached application that another engine is taking
    /// over ([`Attachment::tell_moving`]).
    pub fn tell_moving(&self) {
        for a in self.all() {
            a.tell_moving();
        }
    }

    /// Detaches every attached application with `why` (each one's drain
    /// loop then ends and removes it); returns how many.
    pub fn detach_all(&self, why: &str) -> usize {
        let all = self.all();
        for a in &all {
            a.detach(why);
        }
        all.len()
    }

    /// Removes it (it detached) and remembers why.
    pub fn remove(&self, att: &Arc<Attachment>) {
        {
            let mut d = self.detached.lock().unwrap_or_else(|e| e.into_inner());
            if d.len() == DETACHED_KEPT {
                d.pop_front();
            }
            d.push_back(Detached {
                id: att.id,
                pid: att.pid,
                services: att.services.clone(),
                reason: att.closed_reason().unwrap_or_else(|| "removed".into()),
            });
        }
        self.callers.lock().unwrap_or_else(|e| e.into_inner()).retain(|a| !Arc::ptr_eq(a, att));
        let mut map = self.by_service.lock().unwrap_or_else(|e| e.into_inner());
        let mut emptied = Vec::new();
        for s in &att.services {
            if let Some(list) = map.get_mut(s) {
                list.retain(|a| !Arc::ptr_eq(a, att));
                if list.is_empty() {
                    map.remove(s);
                    emptied.push(s.clone());
                }
            }
        }
        drop(map);
        for s in emptied {
            self.report(&s, false);
        }
    }

    /// Instances of `service` attached now.
    pub fn attached(&self, service: &str) -> usize {
        let map = self.by_service.lock().unwrap_or_else(|e| e.into_inner());
        map.get(service).map_or(0, |l| l.iter().filter(|a| !a.is_closed()).count())
    }

    /// Every application attached now, once each, by number.
    pub fn all(&self) -> Vec<Arc<Attachment>> {
        let map = self.by_service.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<Arc<Attachment>> = map.values().flatten().cloned().collect();
        drop(map);
        all.extend(self.callers.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned());
        all.sort_by_key(|a| a.id);
        all.dedup_by_key(|a| a.id);
        all
    }

    /// Applications attached now (each counted once).
    pub fn applications(&self) -> usize {
        self.all().len()
    }

    /// The last detachments, oldest first.
    pub fn detached(&self) -> Vec<Detached> {
        self.detached.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }

    /// The instance of `service` to send the next call to: the least busy
    /// of those bound to the calling engine worker (see
    /// `protoplane_rpc::shards`), so that a call stays on one thread
    /// from its connection to its application's rings; the least busy of
    /// all when none is (an application that attached once, or an engine
    /// without workers).
    pub fn pick(&self, service: &str) -> Option<Arc<Attachment>> {
        let map = self.by_service.lock().unwrap_or_else(|e| e.into_inner());
        let list = map.get(service)?;
        let n = list.len();
        let start = self.turn.fetch_add(1, Ordering::Relaxed) % n.max(1);
        let open = (0..n).map(|i| &list[(start + i) % n]).filter(|a| !a.is_closed());
        if let Some(w) = protoplane_rpc::shards::current() {
            let here = open.clone().filter(|a| a.lane() == Some(w)).min_by_key(|a| a.in_flight());
            if let Some(a) = here {
                return Some(a.clone());
            }
        }
        open.min_by_key(|a| a.in_flight()).cloned()
    }

    /// Binds a new attachment to one of `workers` engine workers and
    /// says which: the one with the fewest live attachments serving any of
    /// its services, then the fewest in all, then the lowest (so the lanes
    /// of one application land on every worker in turn). Bound before the
    /// application hears its answer, so its next lane sees this one.
    pub fn bind(&self, att: &Arc<Attachment>, workers: usize) -> usize {
        let mut bound = self.bound.lock().unwrap_or_else(|e| e.into_inner());
        bound.retain(|w| w.upgrade().is_some_and(|a| !a.is_closed()));
        let all: Vec<Arc<Attachment>> = bound.iter().filter_map(std::sync::Weak::upgrade).collect();
        let count = |w: usize, any: bool| {
            all.iter()
                .filter(|a| a.lane() == Some(w))
                .filter(|a| any || a.services.iter().any(|s| att.services.contains(s)))
                .count()
        };
        let lane =
            (0..workers.max(1)).min_by_key(|&w| (count(w, false), count(w, true), w)).unwrap_or(0);
        att.set_lane(lane);
        bound.push(Arc::downgrade(att));
        lane
    }

    /// The instance of `service` to send a call to whose request lies in
    /// `bytes`: the instance whose region holds them, unless it has many
    /// more calls open than the least busy one (then the request is copied
    /// into that one's region instead).
    pub fn pick_for(&self, service: &str, bytes: Option<&[u8]>) -> Option<Arc<Attachment>> {
        let least = self.pick(service)?;
        let Some(bytes) = bytes.filter(|b| !b.is_empty() && !least.holds(b)) else {
            return Some(least);
        };
        let map = self.by_service.lock().unwrap_or_else(|e| e.into_inner());
        let holder = map.get(service)?.iter().find(|a| !a.is_closed() && a.holds(bytes)).cloned();
        drop(map);
        Some(match holder {
            Some(h) if h.in_flight() <= 2 * least.in_flight() + 16 => h,
            _ => least,
        })
    }

    /// Whether an application has served `service` since the engine
    /// started (its absence now is then a passing outage, UNAVAILABLE;
    /// otherwise the service is not offered at all, UNIMPLEMENTED).
    pub fn ever_served(&self, service: &str) -> bool {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).contains(service)
    }
}
