//! Reproducers of what the `inc` fuzz target (fuzz/src/inc.rs) found in
//! the host agents.

use protoplane_inc::packet::{Header, Kind, Packet, Wide, WideOp};
use protoplane_inc::plan::{AppPlan, CachePolicy, ClearPolicy};
use protoplane_inc::server::{ServerAgent, ServerTuning};

fn plan() -> AppPlan {
    AppPlan {
        app: 1,
        server: 100,
        switch: Some(900),
        members: 2,
        flows_per_member: 1,
        flow_base: 0,
        switches: 1,
        groups: 8,
        window: 64,
        memory: Some((0, 64)),
        clear: ClearPolicy::Lazy,
        cache: CachePolicy::PeriodicCounting,
        threshold: 2,
        key_bits: 32,
    }
}

/// `Map.addTo` of wide values whose sum leaves the i64 range (found by the
/// `inc` fuzz target): the host map once added with `+=`, which panicked
/// with overflow checks on. It saturates at the int64 range now.
#[test]
fn wide_adds_whose_sum_leaves_i64_do_not_panic_the_server_agent() {
    let mut server = ServerAgent::new(plan(), 100, None, ServerTuning::default());
    for (seq, value) in [(0, i64::MAX), (1, 1)] {
        let mut h = Header::new(Kind::Wide, 1, 1, 100);
        h.flow = 0;
        h.seq = seq;
        h.ext = Header::SEQUENCED;
        let add = Wide { op: WideOp::Add, key: b"k".to_vec(), value };
        server.handle(0, &Packet::wide(h, vec![add]).to_bytes());
    }
    assert_eq!(server.stats().host_items, 2);
}
