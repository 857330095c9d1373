//! xDS resources as a management server sends them
//! (`protoplane_xds::resources`: Listener with its connection manager,
//! RouteConfiguration, Cluster, ClusterLoadAssignment), on any bytes.
//!
//! The first byte picks the parser. Properties, beyond "never panics":
//! a parsed resource holds only what a client can use — routes with a
//! cluster or weighted clusters of positive total weight, endpoints with a
//! port, weighted endpoints of the best priority only, each weight above 0.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protoplane_xds::resources::{self, Action, RouteSource};

fn check_routes(rc: &resources::RouteConfig) {
    for vh in &rc.virtual_hosts {
        for r in &vh.routes {
            match &r.action {
                Action::Cluster(c) => assert!(!c.is_empty()),
                Action::Weighted(list) => {
                    assert!(!list.is_empty() && list.iter().all(|(n, w)| !n.is_empty() && *w > 0));
                }
                Action::NonForwarding => {}
            }
            if let Some(p) = &r.retry {
                assert!((2..=5).contains(&p.max_attempts) && !p.retryable.is_empty());
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, wire)) = data.split_first() else { return };
    match which % 4 {
        0 => {
            if let Ok(l) = resources::listener(wire) {
                match &l.routes {
                    RouteSource::Rds(name) => assert!(!name.is_empty()),
                    RouteSource::Inline(rc) => check_routes(rc),
                }
            }
        }
        1 => {
            if let Ok(rc) = resources::route_config(wire) {
                check_routes(&rc);
            }
        }
        2 => {
            if let Ok(c) = resources::cluster(wire) {
                assert!(!c.eds_service_name.is_empty() || c.name.is_empty());
            }
        }
        _ => {
            if let Ok(e) = resources::endpoints(wire) {
                let best = e
                    .localities
                    .iter()
                    .filter(|l| l.weight > 0 && !l.endpoints.is_empty())
                    .map(|l| l.priority)
                    .min();
                for l in &e.localities {
                    assert!(l.endpoints.iter().all(|(a, w)| a.port() > 0 && *w > 0));
                }
                let w = e.weighted();
                assert!(w.iter().all(|(_, x)| *x > 0));
                assert_eq!(w.is_empty(), best.is_none());
            }
        }
    }
});
