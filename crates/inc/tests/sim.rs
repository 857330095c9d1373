//! Deterministic simulation of whole applications: agents, data plane and
//! controller over a seeded lossy network, results checked against a
//! plain computation.

use protoplane_inc::client::{ClientTuning, Event, Outcome};
use protoplane_inc::controller::Registration;
use protoplane_inc::faults::Faults;
use protoplane_inc::keys::int_key;
use protoplane_inc::plan::{CachePolicy, ClearPolicy, MemberLoss};
use protoplane_inc::rng::Rng;
use protoplane_inc::server::ServerTuning;
use protoplane_inc::sim::{Sim, SimConfig};
use protoplane_inc::switch::{CountMode, Destinations};

fn reg(
    name: &str,
    memory: u32,
    clear: ClearPolicy,
    threshold: u32,
    forward: Destinations,
) -> Registration {
    Registration {
        name: name.into(),
        server: 0,
        members: 0,
        flows_per_member: 1,
        memory,
        clear,
        cache: CachePolicy::PeriodicCounting,
        threshold,
        forward,
        count: CountMode::TestAndSet,
        modify: None,
        key_bits: 32,
        member_loss: MemberLoss::Fail,
    }
}

/// One member's items of one round.
type Batch = (u16, Vec<(Vec<u8>, i64)>);

fn lossy() -> Faults {
    Faults { loss: 0.1, dup: 0.1, reorder: 0.1, delay_us: 0, jitter_us: 200 }
}

/// Runs synchronous aggregation among `members` clients and checks every
/// member gets the exact element-wise sums.
fn sync_agg(
    cfg: SimConfig,
    members: u16,
    len: usize,
    memory: u32,
    clear: ClearPolicy,
    scale: i32,
) -> Sim {
    let mut sim = Sim::new(cfg).expect("test setup");
    let nodes: Vec<u16> = (1..=members).collect();
    sim.add_app(
        reg("agg", memory, clear, u32::from(members), Destinations::Members),
        100,
        &nodes,
        ClientTuning::default(),
        ServerTuning::default(),
    )
    .expect("test setup");
    let mut rng = Rng::new(7);
    let vectors: Vec<Vec<i32>> = nodes
        .iter()
        .map(|_| (0..len).map(|_| (rng.below(2001) as i32 - 1000) * scale).collect())
        .collect();
    let expect: Vec<i64> =
        (0..len).map(|i| vectors.iter().map(|v| i64::from(v[i])).sum()).collect();
    for (n, v) in nodes.iter().zip(&vectors) {
        sim.client(*n).aggregate(v);
    }
    let mut results = std::collections::HashMap::new();
    let finished = sim.run_until(60_000_000, |sim| {
        for n in &nodes {
            for e in sim.take_client_events(*n) {
                if let Event::Done { outcome: Outcome::Aggregated { sums, .. }, .. } = e {
                    results.insert(*n, sums);
                }
            }
        }
        results.len() == nodes.len()
    });
    if !finished {
        eprintln!("server {:?}\nswitch {:?}", sim.server(100).stats(), sim.switch(0).stats());
        for n in &nodes {
            eprintln!("client {n} {:?}", sim.client(*n).stats());
        }
    }
    assert!(finished, "aggregation did not finish: {} of {} members", results.len(), nodes.len());
    for n in &nodes {
        if results[n] != expect {
            let bad: Vec<_> = (0..len)
                .filter(|i| results[n][*i] != expect[*i])
                .take(5)
                .map(|i| (i, results[n][i], expect[i]))
                .collect();
            panic!("member {n} got a wrong sum: {bad:?}");
        }
    }
    sim
}

#[test]
fn sync_aggregation_is_exact_without_faults() {
    let sim = sync_agg(SimConfig::default(), 4, 2000, 64, ClearPolicy::Shadow, 1);
    let st = sim.switch(0).stats();
    assert_eq!(st.double_touch, 0);
    assert!(st.results > 0, "the data plane aggregated");
    // The server agent saw only the members' heartbeats (one each per
    // 200 ms): the data plane did all the work.
    let mut sim = sim;
    let beats = 4 * (1 + sim.now() / protoplane_inc::client::ALIVE_US);
    assert!(sim.traffic(100).packets <= beats, "{:?}", sim.traffic(100));
    assert_eq!(sim.server(100).stats().host_items, 0);
}

#[test]
fn sync_aggregation_is_exact_under_loss_duplication_and_reordering() {
    for clear in [ClearPolicy::Shadow, ClearPolicy::Lazy, ClearPolicy::Copy] {
        for seed in 1..=8 {
            let cfg = SimConfig { seed, faults: lossy(), ..SimConfig::default() };
            let sim = sync_agg(cfg, 4, 3000, 16, clear, 1);
            assert_eq!(sim.switch(0).stats().double_touch, 0);
        }
    }
}

#[test]
fn sync_aggregation_is_exact_with_overflow() {
    // Values near i32::MAX / 2: sums of four overflow 32 bits.
    let cfg = SimConfig { faults: lossy(), ..SimConfig::default() };
    let sim = sync_agg(cfg, 4, 500, 16, ClearPolicy::Shadow, 1_000_000);
    assert!(sim.switch(0).stats().overflowed > 0, "the test must overflow");
}

#[test]
fn sync_aggregation_is_exact_without_a_data_plane_and_without_memory() {
    let cfg = SimConfig { switches: 0, faults: lossy(), ..SimConfig::default() };
    sync_agg(cfg, 3, 1000, 16, ClearPolicy::Shadow, 1);
    let cfg = SimConfig { faults: lossy(), ..SimConfig::default() };
    let sim = sync_agg(cfg, 3, 1000, 0, ClearPolicy::Shadow, 1);
    assert_eq!(sim.switch(0).stats().results, 0);
}

#[test]
fn sync_aggregation_is_exact_over_two_chained_switches() {
    let cfg = SimConfig { switches: 2, faults: lossy(), ..SimConfig::default() };
    let sim = sync_agg(cfg, 4, 2000, 16, ClearPolicy::Shadow, 1);
    assert!(sim.switch(1).stats().results > 0);
    assert!(sim.switch(0).stats().applied > 0 && sim.switch(1).stats().applied > 0);
}

/// Every member adds `per_member` (key, value) items drawn from a skewed
/// key set, in several calls; then one member reads every key back.
fn key_value(
    cfg: SimConfig,
    members: u16,
    memory: u32,
    cache: CachePolicy,
    key_bits: u32,
    big: bool,
) -> Sim {
    let mut sim = Sim::new(cfg).expect("test setup");
    let nodes: Vec<u16> = (1..=members).collect();
    let mut r = reg("kv", memory, ClearPolicy::Copy, 1, Destinations::Server);
    r.cache = cache;
    r.key_bits = key_bits;
    r.flows_per_member = 2;
    let tuning = ServerTuning { period_us: 2_000, ..ServerTuning::default() };
    sim.add_app(r, 100, &nodes, ClientTuning::default(), tuning).expect("test setup");
    let mut rng = Rng::new(11);
    let mut expect: std::collections::BTreeMap<Vec<u8>, i64> = Default::default();
    let mut batches: Vec<Batch> = Vec::new();
    for round in 0..6 {
        for n in &nodes {
            let items: Vec<(Vec<u8>, i64)> = (0..400)
                .map(|_| {
                    // Skewed: key k with probability ~ 1/(k+1).
                    let k = (rng.below(1000) * rng.below(1000) / 1000) as i64;
                    let v = if big && round == 3 {
                        i64::from(i32::MAX) - 5
                    } else {
                        rng.below(100) as i64 + 1
                    };
                    (int_key(k), v)
                })
                .collect();
            for (k, v) in &items {
                *expect.entry(k.clone()).or_insert(0) += v;
            }
            batches.push((*n, items));
        }
    }
    // Rounds go one after another so later rounds find keys mapped.
    for round in batches.chunks(nodes.len()) {
        for (n, items) in round {
            sim.client(*n).add(items).expect("test setup");
        }
        let done = sim.run_until(30_000_000, |sim| nodes.iter().all(|n| sim.client(*n).is_idle()));
        assert!(done, "adds did not finish");
        for n in &nodes {
            sim.take_client_events(*n);
        }
        // Let a cache period pass.
        let t = sim.now() + 3_000;
        sim.run_until(3_000, |sim| sim.now() >= t);
    }
    let keys: Vec<Vec<u8>> = expect.keys().cloned().collect();
    let (outcome, _) = read(&mut sim, nodes[0], &keys);
    let Outcome::Values(values) = outcome else { panic!("get: {outcome:?}") };
    let got: std::collections::BTreeMap<Vec<u8>, i64> = values.into_iter().collect();
    assert_eq!(got.len(), expect.len());
    let wrong: Vec<_> = expect.iter().filter(|(k, v)| got.get(*k) != Some(v)).take(5).collect();
    assert!(wrong.is_empty(), "wrong values: {wrong:?}");
    sim
}

/// `reader` reads `keys`; the call's outcome and when it came.
fn read(sim: &mut Sim, reader: u16, keys: &[Vec<u8>]) -> (Outcome, u64) {
    sim.client(reader).get(keys).expect("test setup");
    let mut outcome = None;
    let done = sim.run_until(30_000_000, |sim| {
        for e in sim.take_client_events(reader) {
            if let Event::Done { outcome: o, .. } = e {
                outcome = Some((o, sim.now()));
            }
        }
        outcome.is_some()
    });
    assert!(done, "get did not finish");
    outcome.expect("checked")
}

#[test]
fn key_value_is_exact_under_faults_with_every_cache_policy() {
    for cache in [CachePolicy::PeriodicCounting, CachePolicy::Fcfs, CachePolicy::Hashing] {
        let cfg = SimConfig { faults: lossy(), ..SimConfig::default() };
        let mut sim = key_value(cfg, 3, 8, cache, 32, false);
        let st = sim.switch(0).stats();
        assert!(st.applied > 0, "{cache:?}: the data plane took part");
        assert_eq!(st.double_touch, 0);
        assert!(sim.server(100).resident_keys() > 0);
    }
}

#[test]
fn key_value_is_exact_with_collisions_overflow_and_full_memory() {
    // 7-bit logical addresses: the ~700 keys collide a lot; two register
    // indices hold only 64 keys; one round adds values near i32::MAX.
    let cfg = SimConfig { faults: lossy(), ..SimConfig::default() };
    let mut sim = key_value(cfg, 2, 2, CachePolicy::PeriodicCounting, 7, true);
    assert!(sim.server(100).stats().collisions > 0, "the test must collide");
    assert!(sim.switch(0).stats().overflowed > 0, "the test must overflow");
    assert!(sim.server(100).stats().evictions > 0, "periodic counting must move keys");
}

#[test]
fn key_value_is_exact_without_a_data_plane() {
    let cfg = SimConfig { switches: 0, faults: lossy(), ..SimConfig::default() };
    key_value(cfg, 2, 8, CachePolicy::Fcfs, 32, false);
}

/// The server agent proposes `instances` values; every member votes for
/// each proposal; each instance must commit exactly once with its value.
fn agreement(cfg: SimConfig, members: u16, quorum: u32, memory: u32, instances: u32) -> Sim {
    let mut sim = Sim::new(cfg).expect("test setup");
    let nodes: Vec<u16> = (1..=members).collect();
    let r = reg("vote", memory, ClearPolicy::Copy, quorum, Destinations::Both);
    sim.add_app(r, 100, &nodes, ClientTuning::default(), ServerTuning::default())
        .expect("test setup");
    for i in 1..=instances {
        let now = sim.now();
        sim.server(100).propose(now, i, i64::from(i) * 10).expect("test setup");
    }
    let mut committed: std::collections::BTreeMap<u32, i32> = Default::default();
    // What each member heard committed.
    let mut heard: Vec<std::collections::BTreeMap<u32, i32>> =
        vec![Default::default(); nodes.len()];
    let all = instances as usize;
    let done = sim.run_until(600_000_000, |sim| {
        for (k, n) in nodes.iter().enumerate() {
            for e in sim.take_client_events(*n) {
                match e {
                    Event::Proposal { instance, value, addr } => {
                        sim.client(*n).vote(instance, value as i32, addr);
                    }
                    Event::Committed { instance, value } => {
                        heard[k].insert(instance, value);
                    }
                    Event::Done { .. } => {}
                }
            }
        }
        for e in sim.take_server_events(100) {
            let protoplane_inc::server::ServerEvent::Committed { instance, value, .. } = e;
            assert!(
                committed.insert(instance, value).is_none(),
                "instance {instance} committed twice"
            );
        }
        committed.len() == all && heard.iter().all(|h| h.len() == all)
    });
    let seen: Vec<usize> = heard.iter().map(|h| h.len()).collect();
    assert!(done, "{} of {all} committed; members heard of {seen:?}", committed.len());
    // Each instance i was proposed with 10 i: the leader and every member
    // must have exactly that.
    let expect: std::collections::BTreeMap<u32, i32> =
        (1..=instances).map(|i| (i, i as i32 * 10)).collect();
    assert_eq!(committed, expect);
    for h in &heard {
        assert_eq!(h, &expect);
    }
    sim
}

#[test]
fn agreement_commits_every_instance_once_under_faults() {
    let cfg = SimConfig { faults: lossy(), ..SimConfig::default() };
    let sim = agreement(cfg, 5, 3, 64, 200);
    assert!(sim.switch(0).stats().results > 0, "the data plane counted quorums");
    // Few slots: most instances wait for one or go to the host.
    let cfg = SimConfig { faults: lossy(), ..SimConfig::default() };
    agreement(cfg, 5, 3, 4, 200);
    let cfg = SimConfig { switches: 0, faults: lossy(), ..SimConfig::default() };
    agreement(cfg, 5, 3, 64, 100);
}

/// 10,000 instances proposed at once under 10% loss, duplication and
/// reordering: the vote window paces them, and every acceptor hears of
/// every commit.
#[test]
fn ten_thousand_agreement_instances_commit_and_every_member_hears_of_each() {
    let cfg = SimConfig { faults: lossy(), ..SimConfig::default() };
    let sim = agreement(cfg, 5, 3, 256, 10_000);
    assert!(sim.switch(0).stats().results > 0);
}

/// One application instance of the shared-data-plane scenarios.
enum Instance {
    Agg {
        members: Vec<u16>,
        expect: Vec<i64>,
        done: usize,
    },
    Kv {
        members: Vec<u16>,
        expect: std::collections::BTreeMap<Vec<u8>, i64>,
        phase: u8,
    },
    Vote {
        server: u16,
        members: Vec<u16>,
        instances: u32,
        committed: std::collections::BTreeMap<u32, i32>,
    },
}

/// Starts instance `i` of kind `i % 3` with its own nodes.
fn start(sim: &mut Sim, i: u16, memory: u32) -> Instance {
    let server = 1000 + i * 10;
    let members: Vec<u16> = (1..=3).map(|m| server + m).collect();
    let mut rng = Rng::new(u64::from(i));
    match i % 3 {
        0 => {
            let r = reg(&format!("agg-{i}"), memory, ClearPolicy::Lazy, 3, Destinations::Members);
            sim.add_app(r, server, &members, ClientTuning::default(), ServerTuning::default())
                .expect("setup");
            let vs: Vec<Vec<i32>> = members
                .iter()
                .map(|_| (0..700).map(|_| rng.below(1000) as i32 - 500).collect())
                .collect();
            let expect = (0..700).map(|k| vs.iter().map(|v| i64::from(v[k])).sum()).collect();
            for (m, v) in members.iter().zip(&vs) {
                sim.client(*m).aggregate(v);
            }
            Instance::Agg { members, expect, done: 0 }
        }
        1 => {
            let mut r = reg(&format!("kv-{i}"), memory, ClearPolicy::Copy, 1, Destinations::Server);
            r.cache = CachePolicy::Fcfs;
            sim.add_app(r, server, &members, ClientTuning::default(), ServerTuning::default())
                .expect("setup");
            let mut expect = std::collections::BTreeMap::new();
            for m in &members {
                let items: Vec<(Vec<u8>, i64)> = (0..300)
                    .map(|_| (int_key(rng.below(200) as i64), rng.below(50) as i64))
                    .collect();
                for (k, v) in &items {
                    *expect.entry(k.clone()).or_insert(0) += v;
                }
                sim.client(*m).add(&items).expect("setup");
            }
            Instance::Kv { members, expect, phase: 0 }
        }
        _ => {
            let r = reg(&format!("vote-{i}"), memory, ClearPolicy::Copy, 2, Destinations::Both);
            sim.add_app(r, server, &members, ClientTuning::default(), ServerTuning::default())
                .expect("setup");
            let now = sim.now();
            for k in 1..=50 {
                sim.server(server).propose(now, k, i64::from(k) + i64::from(i)).expect("setup");
            }
            Instance::Vote { server, members, instances: 50, committed: Default::default() }
        }
    }
}

/// Advances an instance; `true` once it finished and was checked.
fn advance(sim: &mut Sim, inst: &mut Instance) -> bool {
    match inst {
        Instance::Agg { members, expect, done } => {
            for m in members.iter() {
                for e in sim.take_client_events(*m) {
                    if let Event::Done { outcome: Outcome::Aggregated { sums: s, .. }, .. } = e {
                        assert!(s == *expect, "aggregation of {m} is wrong");
                        *done += 1;
                    }
                }
            }
            *done == members.len()
        }
        Instance::Kv { members, expect, phase } => {
            if *phase == 0 && members.iter().all(|m| sim.client(*m).is_idle()) {
                for m in members.iter() {
                    sim.take_client_events(*m);
                }
                let keys: Vec<Vec<u8>> = expect.keys().cloned().collect();
                sim.client(members[0]).get(&keys).expect("get");
                *phase = 1;
            }
            if *phase == 1 {
                for e in sim.take_client_events(members[0]) {
                    if let Event::Done { outcome: Outcome::Values(v), .. } = e {
                        let got: std::collections::BTreeMap<Vec<u8>, i64> = v.into_iter().collect();
                        assert!(got == *expect, "key-value results are wrong");
                        *phase = 2;
                    }
                }
            }
            *phase == 2
        }
        Instance::Vote { server, members, instances, committed } => {
            for m in members.iter() {
                for e in sim.take_client_events(*m) {
                    if let Event::Proposal { instance, value, addr } = e {
                        sim.client(*m).vote(instance, value as i32, addr);
                    }
                }
            }
            for e in sim.take_server_events(*server) {
                let protoplane_inc::server::ServerEvent::Committed { instance, value, .. } = e;
                assert!(committed.insert(instance, value).is_none(), "committed twice");
            }
            committed.len() == *instances as usize
                && committed
                    .iter()
                    .all(|(k, v)| i64::from(*v) == i64::from(*k) + (i64::from(*server) - 1000) / 10)
        }
    }
}

#[test]
fn twenty_instances_of_three_kinds_share_a_small_data_plane_exactly() {
    // 20 instances ask for 16 indices each from 128: the first 8 get
    // memory, the rest run on their server agents.
    let mut cfg = SimConfig { faults: lossy(), ..SimConfig::default() };
    cfg.switch.registers = 128;
    let mut sim = Sim::new(cfg).expect("setup");
    let mut all: Vec<Instance> = (0..20).map(|i| start(&mut sim, i, 16)).collect();
    assert_eq!(sim.controller().free_memory(), 0, "memory is exhausted");
    let mut finished = vec![false; all.len()];
    let done = sim.run_until(120_000_000, |sim| {
        for (i, inst) in all.iter_mut().enumerate() {
            if !finished[i] {
                finished[i] = advance(sim, inst);
            }
        }
        finished.iter().all(|f| *f)
    });
    assert!(
        done,
        "unfinished instances: {:?}",
        finished.iter().enumerate().filter(|f| !f.1).map(|f| f.0).collect::<Vec<_>>()
    );
    let st = sim.switch(0).stats();
    // Every instance is installed (the switch relays for it), those
    // without memory have everything finished by their server agent.
    assert!(
        st.applied > 0 && st.forwarded > 0 && st.not_admitted == 0 && st.refused == 0,
        "some instances computing on the data plane, some not: {st:?}"
    );
    assert_eq!(st.double_touch, 0);
}

#[test]
fn a_dead_application_is_reclaimed_without_disturbing_the_others() {
    let mut cfg = SimConfig { faults: lossy(), ..SimConfig::default() };
    cfg.switch.registers = 64;
    cfg.controller = protoplane_inc::controller::ControllerTuning {
        poll_us: 1_000,
        idle_us: 20_000,
        dead_us: 20_000,
    };
    let mut sim = Sim::new(cfg).expect("setup");
    // A takes half the memory and dies; B keeps working all along.
    let mut a = start(&mut sim, 0, 32);
    let mut b = start(&mut sim, 1, 32);
    assert_eq!(sim.controller().free_memory(), 0);
    assert!(sim.run_until(10_000_000, |sim| advance(sim, &mut a)), "A runs first");
    sim.kill_app(1000, &[1001, 1002, 1003]);
    let app_a = 1;
    let reclaimed = sim.run_until(10_000_000, |sim| sim.reclaimed().contains(&app_a));
    assert!(reclaimed, "A's memory came back");
    assert_eq!(sim.controller().free_memory(), 32);
    let dropped = sim.run_until(1_000_000, |sim| sim.switch(0).apps().count() == 1);
    assert!(dropped, "the data plane dropped A");
    // A newcomer gets A's memory; B finishes exactly.
    let mut c = start(&mut sim, 3, 32);
    assert_eq!(sim.controller().free_memory(), 0, "the newcomer got A's memory");
    assert_eq!(sim.switch(0).apps().count(), 2);
    let mut finished = (false, false);
    let done = sim.run_until(60_000_000, |sim| {
        finished.0 = finished.0 || advance(sim, &mut b);
        finished.1 = finished.1 || advance(sim, &mut c);
        finished.0 && finished.1
    });
    assert!(done, "B and the newcomer finish: {finished:?}");
    assert!(sim.switch(0).stats().results > 0, "the newcomer aggregated on the data plane");
}

#[test]
fn host_only_packets_keep_the_flip_bits_of_their_flow_in_step() {
    // A window of 16 sequence numbers: flip bits wrap every 16 packets,
    // and wide (host-only) packets interleave with pairs on the same flows.
    // A wide packet that skipped its flip-bit slot made a later packet of
    // the same slot look like a retransmission (found by bench inc).
    for seed in 1..=3 {
        let mut cfg = SimConfig { seed, ..SimConfig::default() };
        cfg.switch.window = 16;
        let sim = key_value(cfg, 2, 8, CachePolicy::Fcfs, 32, false);
        assert!(sim.switch(0).stats().applied > 0);
        let mut cfg = SimConfig { seed, faults: lossy(), ..SimConfig::default() };
        cfg.switch.window = 16;
        key_value(cfg, 2, 8, CachePolicy::PeriodicCounting, 32, false);
    }
}

/// The switch dies in the middle of a synchronous aggregation under 10%
/// loss: the members finish on the server agent, exactly.
#[test]
fn a_switch_that_dies_mid_aggregation_leaves_the_server_path_exact() {
    for kill_at in [3_000u64, 20_000, 60_000] {
        let mut sim =
            Sim::new(SimConfig { faults: lossy(), ..SimConfig::default() }).expect("setup");
        let nodes: Vec<u16> = (1..=4).collect();
        let r = reg("agg", 64, ClearPolicy::Shadow, 4, Destinations::Members);
        sim.add_app(r, 100, &nodes, ClientTuning::default(), ServerTuning::default())
            .expect("setup");
        let len = 32 * 300;
        let mut rng = Rng::new(11);
        let vectors: Vec<Vec<i32>> = nodes
            .iter()
            .map(|_| (0..len).map(|_| rng.below(2001) as i32 - 1000).collect())
            .collect();
        let expect: Vec<i64> =
            (0..len).map(|i| vectors.iter().map(|v| i64::from(v[i])).sum()).collect();
        for (n, v) in nodes.iter().zip(&vectors) {
            sim.client(*n).aggregate(v);
        }
        let mut results = std::collections::HashMap::new();
        let mut collect = |sim: &mut Sim| {
            for n in &nodes {
                for e in sim.take_client_events(*n) {
                    if let Event::Done { outcome: Outcome::Aggregated { sums, .. }, .. } = e {
                        results.insert(*n, sums);
                    }
                }
            }
            results.len() == nodes.len()
        };
        assert!(!sim.run_until(kill_at, &mut collect), "the switch dies before the end");
        sim.kill_switches();
        let done = sim.run_until(10_000_000, &mut collect);
        if !done {
            eprintln!("server {:?}", sim.server(100).stats());
            for n in &nodes {
                eprintln!(
                    "client {n} {:?} fallen back {}",
                    sim.client(*n).stats(),
                    sim.client(*n).fallen_back()
                );
            }
        }
        assert!(done, "killed at {kill_at} µs: {} of 4 members finished", results.len());
        for n in &nodes {
            assert!(results[n] == expect, "killed at {kill_at} µs: member {n} got a wrong sum");
        }
    }
}

/// A member that stops in the middle of a synchronous aggregation: its
/// lease runs out and the others' calls fail at once with the reason
/// (they would otherwise wait for its contribution until their timeout).
#[test]
fn a_member_that_stops_fails_the_others_aggregation_at_once() {
    let mut sim = Sim::new(SimConfig { faults: lossy(), ..SimConfig::default() }).expect("setup");
    let nodes: Vec<u16> = (1..=4).collect();
    let r = reg("agg", 64, ClearPolicy::Shadow, 4, Destinations::Members);
    sim.add_app(r, 100, &nodes, ClientTuning::default(), ServerTuning::default()).expect("setup");
    let len = 32 * 400;
    for n in &nodes {
        sim.client(*n).aggregate(&vec![1; len]);
    }
    // Member 4 dies 5 ms in (its process is gone: nothing more from it).
    assert!(!sim.run_until(5_000, |_| false));
    sim.kill_client(4);
    let mut failed = std::collections::HashMap::new();
    let done = sim.run_until(5_000_000, |sim| {
        for n in &nodes[..3] {
            for e in sim.take_client_events(*n) {
                if let Event::Done { outcome: Outcome::Failed(why), .. } = e {
                    failed.insert(*n, (why, sim.now()));
                }
            }
        }
        failed.len() == 3
    });
    assert!(done, "the others' calls failed: {failed:?}");
    for (n, (why, at)) in &failed {
        assert!(why.contains("member 3"), "member {n}: {why}");
        // Within the 1.5 s lease of its last heartbeat (two leases from the
        // first heartbeat of any member if none of its own arrived) and a
        // few heartbeat intervals of the others (10% of them are lost).
        assert!(*at < 3_000_000 + 1_000_000, "member {n} learned it at {at} µs");
    }
    assert_eq!(sim.server(100).lost_members(), 1 << 3);
}

/// A step's sums and the members they are over.
type Step = (Vec<i64>, u64);

/// How [`continue_without_a_member`] went: per step, what every survivor
/// got (they must agree).
struct ContinueRun {
    /// Per step: the members the sums are over.
    members: Vec<u64>,
    /// Steps the survivors had in progress at the regroup and finished
    /// with the lost member's part in.
    kept: u64,
}

/// `MemberLoss: continue`: four members run `steps` steps of synchronous
/// aggregation, each step after the previous one returned; member 4 dies
/// `delay` µs after member 1 has finished `after` steps. With `ahead`,
/// member 3 hears nothing for 4 s from when it starts step `after`, and
/// member 4 dies `delay` µs into that: member 4 has finished that step (and
/// perhaps contributed to the next) while member 3 is still in it. Each
/// member keeps `in_flight` steps in progress at once (a step starts when
/// one returns). Every survivor must finish every step, all survivors
/// must get the same sums over the same members for each step, and those
/// sums must be the exact sums of those members' inputs, computed here from
/// the inputs alone.
fn continue_without_a_member(
    cfg: SimConfig,
    memory: u32,
    clear: ClearPolicy,
    (after, delay): (usize, u64),
    scale: i32,
    ahead: bool,
    in_flight: usize,
) -> ContinueRun {
    let kill_at = format!("{delay} µs after step {after}");
    let steps = 8;
    let len = if ahead { 32 * 4 - 3 } else { 32 * 24 + 5 };
    let mut rng = Rng::new(cfg.seed ^ 0x5eed);
    let mut sim = Sim::new(cfg).expect("setup");
    let nodes: Vec<u16> = (1..=4).collect();
    let mut r = reg("agg", memory, clear, 4, Destinations::Members);
    r.member_loss = MemberLoss::Continue;
    sim.add_app(r, 100, &nodes, ClientTuning::default(), ServerTuning::default()).expect("setup");
    // inputs[member][step]
    let inputs: Vec<Vec<Vec<i32>>> = nodes
        .iter()
        .map(|_| {
            (0..steps)
                .map(|_| (0..len).map(|_| (rng.below(2001) as i32 - 1000) * scale).collect())
                .collect()
        })
        .collect();
    let mut next = vec![0usize; nodes.len()];
    // got[member][step]: the sums and the members they are over.
    let mut got: Vec<Vec<Option<Step>>> = vec![vec![None; steps]; nodes.len()];
    // Per member, the step of each call in progress.
    let mut step_of: Vec<std::collections::HashMap<u64, usize>> = vec![Default::default(); 4];
    for (i, n) in nodes.iter().enumerate() {
        for (s, input) in inputs[i].iter().enumerate().take(in_flight) {
            let call = sim.client(*n).aggregate(input);
            step_of[i].insert(call, s);
        }
        next[i] = in_flight;
    }
    let mut killed = false;
    let mut kill_time = None;
    let mut partition_until = None;
    let mut failures = Vec::new();
    let done = sim.run_until(30_000_000, |sim| {
        let started =
            if ahead { next[2] > after } else { got[0][..after].iter().all(Option::is_some) };
        if kill_time.is_none() && started {
            kill_time = Some(sim.now() + delay);
            if ahead {
                sim.set_faults(3, Faults { loss: 1.0, ..lossy() });
                partition_until = Some(sim.now() + 4_000_000);
            }
        }
        if partition_until.is_some_and(|t| sim.now() >= t) {
            sim.set_faults(3, lossy());
            partition_until = None;
        }
        if !killed && kill_time.is_some_and(|t| sim.now() >= t) {
            sim.kill_client(4);
            killed = true;
        }
        for (i, n) in nodes.iter().enumerate().take(if killed { 3 } else { 4 }) {
            for e in sim.take_client_events(*n) {
                match e {
                    Event::Done { call, outcome: Outcome::Aggregated { sums, members } } => {
                        let step = step_of[i].remove(&call).expect("a step in progress");
                        got[i][step] = Some((sums, members));
                        if next[i] < steps {
                            let call = sim.client(*n).aggregate(&inputs[i][next[i]]);
                            step_of[i].insert(call, next[i]);
                            next[i] += 1;
                        }
                    }
                    Event::Done { outcome: Outcome::Failed(why), .. } => failures.push((*n, why)),
                    _ => {}
                }
            }
        }
        !failures.is_empty() || got[..3].iter().all(|g| g.iter().all(Option::is_some))
    });
    assert!(failures.is_empty(), "killed at {kill_at} µs: {failures:?}");
    assert!(done, "killed at {kill_at} µs: not every survivor finished: {:?}", next);
    let mut members = Vec::new();
    for step in 0..steps {
        let (sums, m) = got[0][step].clone().expect("finished");
        for (i, g) in got.iter().enumerate().take(3).skip(1) {
            assert_eq!(
                g[step].as_ref().map(|x| x.1),
                Some(m),
                "killed at {kill_at} µs: step {step}: members differ at node {}",
                i + 1
            );
            assert!(
                g[step].as_ref().is_some_and(|x| x.0 == sums),
                "killed at {kill_at} µs: step {step}: sums differ at node {}",
                i + 1
            );
        }
        assert!(m == 0b1111 || m == 0b0111, "step {step}: members {m:#b}");
        let expect: Vec<i64> = (0..len)
            .map(|x| {
                (0..4).filter(|j| m & (1 << j) != 0).map(|j| i64::from(inputs[j][step][x])).sum()
            })
            .collect();
        assert!(sums == expect, "killed at {kill_at} µs: step {step} over {m:#b} is not exact");
        members.push(m);
    }
    // One step at a time: once a step is over the survivors only, every
    // later one is too. (With steps in flight together, a later step the
    // lost member had finished may include it while an earlier one does
    // not: each step in progress at the regroup is decided by itself.)
    let first_without = members.iter().position(|m| *m == 0b0111);
    if let (Some(f), 1) = (first_without, in_flight) {
        assert!(members[f..].iter().all(|m| *m == 0b0111), "{members:?}");
    }
    assert_eq!(sim.server(100).lost_members(), 1 << 3);
    assert_eq!(sim.server(100).regroups(), 1);
    let kept = (1..=3).map(|n| sim.client(n).stats().steps_kept).sum();
    ContinueRun { members, kept }
}

/// `MemberLoss: continue` on the data plane: a member dies at a different
/// moment of each run, under loss, duplication and reordering, for each
/// clear policy. No step mixes members, every step is exact over the
/// members it names, and the survivors finish.
#[test]
fn with_member_loss_continue_the_others_finish_every_step_exactly() {
    let mut without = 0;
    for clear in [ClearPolicy::Shadow, ClearPolicy::Lazy, ClearPolicy::Copy] {
        for seed in 1..=4u64 {
            let cfg = SimConfig { seed, faults: lossy(), ..SimConfig::default() };
            let kill = (seed as usize * 2 - 1, seed * 700);
            let run = continue_without_a_member(cfg, 16, clear, kill, 1, false, 1);
            without += run.members.iter().filter(|m| **m == 0b0111).count();
        }
    }
    assert!(without > 0, "the member must die before the last step");
}

/// A member that dies just after contributing to a whole step the others
/// are still in: that step goes on with its part in (every survivor gets
/// the sum over all four), and the later steps are over the survivors.
#[test]
fn with_member_loss_continue_a_step_the_lost_member_finished_includes_it() {
    let mut kept = 0;
    for clear in [ClearPolicy::Shadow, ClearPolicy::Lazy, ClearPolicy::Copy] {
        for seed in 1..=4u64 {
            let cfg = SimConfig { seed, faults: lossy(), ..SimConfig::default() };
            let kill = (seed as usize + 1, 1_000);
            let run = continue_without_a_member(cfg, 16, clear, kill, 1, true, 1);
            kept += run.kept;
            assert!(run.members.contains(&0b0111), "{:?}", run.members);
        }
    }
    assert!(kept > 0, "no run had a step the lost member had finished");
}

/// Steps in flight together (three at once): a member lost mid-way may
/// have finished a later step and not an earlier one, so steps complete
/// out of order on either side of the regroup; still no step mixes
/// members and every survivor names the same ones.
#[test]
fn with_member_loss_continue_steps_in_flight_together_stay_exact() {
    for clear in [ClearPolicy::Shadow, ClearPolicy::Lazy, ClearPolicy::Copy] {
        for seed in 1..=3u64 {
            let cfg = SimConfig { seed, faults: lossy(), ..SimConfig::default() };
            let kill = (seed as usize, 400 * seed);
            continue_without_a_member(cfg, 16, clear, kill, 1, true, 3);
            let cfg = SimConfig { seed, faults: lossy(), ..SimConfig::default() };
            continue_without_a_member(cfg, 64, clear, kill, 1, false, 3);
        }
    }
}

/// A member that is only stopped (a paused process) past its lease: the
/// others go on without it; when it runs again it learns it is out, its
/// aggregation in progress fails with that reason, and so does its next
/// one, at once. It never counts again.
#[test]
fn with_member_loss_continue_a_member_that_was_only_stopped_learns_it_is_out() {
    let mut sim = Sim::new(SimConfig { faults: lossy(), ..SimConfig::default() }).expect("setup");
    let nodes: Vec<u16> = (1..=4).collect();
    let mut r = reg("agg", 16, ClearPolicy::Lazy, 4, Destinations::Members);
    r.member_loss = MemberLoss::Continue;
    sim.add_app(r, 100, &nodes, ClientTuning::default(), ServerTuning::default()).expect("setup");
    let len = 32 * 20;
    for n in &nodes {
        sim.client(*n).aggregate(&vec![i32::from(*n); len]);
    }
    assert!(!sim.run_until(3_000, |_| false));
    sim.pause_client(4);
    let mut sums = std::collections::HashMap::new();
    let done = sim.run_until(5_000_000, |sim| {
        for n in &nodes[..3] {
            for e in sim.take_client_events(*n) {
                if let Event::Done { outcome, .. } = e {
                    sums.insert(*n, outcome);
                }
            }
        }
        sums.len() == 3
    });
    assert!(done, "the others finished: {sums:?}");
    for (n, o) in &sums {
        // 1 + 2 + 3 at every position, over members 0, 1 and 2.
        let want = Outcome::Aggregated { sums: vec![6; len], members: 0b0111 };
        assert_eq!(o, &want, "member at node {n}");
    }
    sim.resume_client(4);
    let mut why = None;
    let done = sim.run_until(5_000_000, |sim| {
        for e in sim.take_client_events(4) {
            if let Event::Done { outcome: Outcome::Failed(w), .. } = e {
                why = Some(w);
            }
        }
        why.is_some()
    });
    assert!(done, "the stopped member's call ended");
    let why = why.unwrap_or_default();
    assert!(why.contains("this member (3) was lost"), "{why}");
    let call = sim.client(4).aggregate(&[1; 8]);
    assert!(!sim.run_until(1_000, |_| false));
    let later = sim.take_client_events(4);
    assert!(
        later.iter().any(
            |e| matches!(e, Event::Done { call: c, outcome: Outcome::Failed(_) } if *c == call)
        ),
        "a later aggregation fails at once: {later:?}"
    );
    assert_eq!(sim.server(100).members_out(), 1 << 3);
}

/// The same on the server path (no data-plane memory), over a chain of two
/// switches, and with sums that overflow 32 bits on the data plane (the
/// exact sums come from the members' parts).
#[test]
fn with_member_loss_continue_the_server_path_chains_and_overflow_stay_exact() {
    for seed in 1..=3u64 {
        let cfg = SimConfig { seed, faults: lossy(), ..SimConfig::default() };
        let kill = (seed as usize * 2, seed * 500);
        continue_without_a_member(cfg, 0, ClearPolicy::Shadow, kill, 1, false, 1);
        let chain = SimConfig { seed, switches: 2, faults: lossy(), ..SimConfig::default() };
        continue_without_a_member(chain, 16, ClearPolicy::Lazy, kill, 1, false, 1);
        let cfg = SimConfig { seed, faults: lossy(), ..SimConfig::default() };
        continue_without_a_member(cfg, 16, ClearPolicy::Shadow, kill, 1_000_000, false, 1);
    }
}

/// How a counter application's run ends around the switch dying.
#[derive(Clone, Copy, Debug, PartialEq)]
enum KvEnd {
    /// Every member stays.
    AllStay,
    /// The last member finishes early and leaves (gives its account)
    /// before the switch dies.
    OneLeaves,
    /// The last member crashes (no account) before the switch dies.
    OneCrashes,
}

/// How [`key_value_switch_dies`] went.
struct KvRun {
    /// The reader's outcome.
    outcome: Outcome,
    /// When it came, µs after the kill.
    at: u64,
    /// The expected values.
    expect: Vec<(Vec<u8>, i64)>,
    /// When the server agent had rebuilt the map, µs after the kill.
    rebuilt: Option<u64>,
}

/// Counters with data-plane cells; the switch dies in the middle of a
/// round (pairs in flight, cells holding values).
fn key_value_switch_dies(seed: u64, end: KvEnd) -> KvRun {
    let cfg = SimConfig { seed, faults: lossy(), ..SimConfig::default() };
    let mut sim = Sim::new(cfg).expect("test setup");
    let nodes: Vec<u16> = (1..=3).collect();
    let mut r = reg("kv", 8, ClearPolicy::Copy, 1, Destinations::Server);
    r.cache = CachePolicy::PeriodicCounting;
    r.flows_per_member = 2;
    let tuning = ServerTuning { period_us: 2_000, ..ServerTuning::default() };
    sim.add_app(r, 100, &nodes, ClientTuning::default(), tuning).expect("test setup");
    let mut rng = Rng::new(seed);
    // What each member adds: the expected values are summed here, apart
    // from the agents.
    let mut expect: std::collections::BTreeMap<Vec<u8>, i64> = Default::default();
    let round = |rng: &mut Rng, expect: &mut std::collections::BTreeMap<Vec<u8>, i64>| {
        (0..300)
            .map(|_| {
                let k = (rng.below(300) * rng.below(300) / 300) as i64;
                let v = rng.below(100) as i64 + 1;
                *expect.entry(int_key(k)).or_insert(0) += v;
                (int_key(k), v)
            })
            .collect::<Vec<_>>()
    };
    let idle = |sim: &mut Sim, who: &[u16]| {
        let done = sim.run_until(30_000_000, |sim| who.iter().all(|n| sim.client(*n).is_idle()));
        assert!(done, "calls did not finish");
        for n in who {
            sim.take_client_events(*n);
        }
    };
    // Three whole rounds (keys get cells), a cache period after each.
    for _ in 0..3 {
        for n in &nodes {
            let items = round(&mut rng, &mut expect);
            sim.client(*n).add(&items).expect("test setup");
        }
        idle(&mut sim, &nodes);
        let t = sim.now() + 3_000;
        sim.run_until(3_000, |sim| sim.now() >= t);
    }
    let last = *nodes.last().expect("members");
    let mut staying = nodes.clone();
    match end {
        KvEnd::AllStay => {}
        KvEnd::OneLeaves => {
            sim.client(last).leave();
            idle(&mut sim, &[last]);
            staying.pop();
        }
        KvEnd::OneCrashes => {
            sim.kill_client(last);
            staying.pop();
        }
    }
    // A round in flight when the switch dies, and a read (the server
    // agent answers no read until it has every account; a member's
    // account must not wait for its read).
    for n in &staying {
        let items = round(&mut rng, &mut expect);
        sim.client(*n).add(&items).expect("test setup");
    }
    let early: Vec<Vec<u8>> = (0..40).map(int_key).collect();
    sim.client(nodes[0]).get(&early).expect("test setup");
    // Some pairs applied, some in flight, some not sent yet.
    let into = 40 + 10 * seed;
    let t = sim.now() + into;
    sim.run_until(into, |sim| sim.now() >= t);
    assert!(sim.server(100).resident_keys() > 0, "cells hold values when the switch dies");
    assert!(sim.switch(0).stats().applied > 0);
    let killed_at = sim.now();
    sim.kill_switches();
    idle(&mut sim, &staying);
    // One more round, on the server path.
    for n in &staying {
        let items = round(&mut rng, &mut expect);
        sim.client(*n).add(&items).expect("test setup");
    }
    idle(&mut sim, &staying);
    let keys: Vec<Vec<u8>> = expect.keys().cloned().collect();
    let (outcome, done_at) = read(&mut sim, nodes[0], &keys);
    let at = done_at - killed_at;
    let rebuilt = sim.server(100).map_rebuilt().map(|(us, _)| us);
    KvRun { outcome, at, expect: expect.into_iter().collect(), rebuilt }
}

/// The switch dies while keys have cells: every counter is rebuilt from
/// the server agent's own part and the members' accounts, exactly — with
/// every member there, and with one that left before.
#[test]
fn a_switch_that_dies_holding_counters_leaves_every_value_exact() {
    for seed in 1..=20 {
        for end in [KvEnd::AllStay, KvEnd::OneLeaves] {
            let KvRun { outcome, expect, rebuilt, .. } = key_value_switch_dies(seed, end);
            let Outcome::Values(got) = outcome else {
                panic!("seed {seed} {end:?}: {outcome:?}");
            };
            // Accounts come within a few round trips of the notice (10%
            // of the datagrams are lost: some notices go again 100 ms on).
            let rebuilt = rebuilt.expect("the map was rebuilt");
            assert!(rebuilt < 1_000_000, "seed {seed} {end:?}: rebuilt {rebuilt} µs after");
            assert_eq!(got.len(), expect.len());
            let wrong: Vec<_> = expect.iter().zip(&got).filter(|(e, g)| e != g).take(5).collect();
            assert!(wrong.is_empty(), "seed {seed} {end:?}: wrong values {wrong:?}");
        }
    }
}

/// A member that crashed took its account with it: when the switch dies
/// after, the values cannot be rebuilt, and the reader's call fails with
/// the reason once the wait for accounts is over, instead of answering
/// short.
#[test]
fn a_switch_that_dies_after_a_member_crashed_fails_at_once_instead_of_answering_short() {
    let KvRun { outcome, at, rebuilt, .. } = key_value_switch_dies(1, KvEnd::OneCrashes);
    assert_eq!(rebuilt, None);
    let Outcome::Failed(why) = outcome else { panic!("{outcome:?}") };
    assert!(why.contains("cannot be recovered"), "{why}");
    let wait = protoplane_inc::server::ACCOUNT_WAIT_US;
    assert!(at < wait + 1_000_000, "failed {at} µs after the switch died");
}
