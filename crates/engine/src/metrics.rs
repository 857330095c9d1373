//! The engine's own metrics, beside gRFC A66's call metrics (which its
//! gRPC front end records like any protoplane server): who is attached,
//! what each attachment holds and copies, what the policy decided, how
//! calls were answered. Scraped at `--metrics-addr` (`[listen] metrics`).
//!
//! | family | type | labels |
//! |---|---|---|
//! | `protoplane_engine_applications` | gauge | |
//! | `protoplane_engine_client_connections` | gauge | |
//! | `protoplane_engine_calls_total` | counter | `application`, `pid` |
//! | `protoplane_engine_calls_in_flight` | gauge | `application`, `pid` |
//! | `protoplane_engine_region_chunks_lent` / `_held` | gauge | `application`, `pid` |
//! | `protoplane_engine_request_bytes_copied_total` | counter | `application`, `pid` |
//! | `protoplane_engine_requests_in_place_total` | counter | `application`, `pid` |
//! | `protoplane_engine_response_bytes_copied_out_total` | counter | `application`, `pid` |
//! | `protoplane_engine_method_calls_total` | counter | `grpc_method`, `answered_by` (`application`, `engine`, `engine_error`, `engine_undecodable`, `engine_panic`) |
//! | `protoplane_engine_policy_decisions_total` | counter | `decision` |
//! | `protoplane_engine_policy_calls_open` | gauge | |
//! | `protoplane_engine_attach_total` | counter | `outcome` (`connected`, `refused`, `evicted`, `timed_out`) |
//!
//! Attachments are labelled by the engine's number for them (`application`)
//! and their process id: both bounded by the number attached at once, and
//! a detached application's series disappear with it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use protoplane_rpc::metrics::{Kind, Metrics};
use protoplane_rpc::server::Router;

use crate::admission::AdmissionStats;
use crate::functional::Counters;
use crate::policy::Policies;
use crate::registry::Registry;

/// Adds the engine's families to every scrape of `metrics`.
pub(crate) fn register(
    metrics: &Metrics,
    registry: Arc<Registry>,
    router: std::sync::Weak<Router>,
    counters: Arc<Counters>,
    policies: Arc<Policies>,
    admission: Arc<AdmissionStats>,
) {
    metrics.add_source(move |out| {
        let n = |a: &AtomicU64| a.load(Relaxed) as f64;
        out.family(
            "protoplane_engine_applications",
            Kind::Gauge,
            "Applications attached now.",
        );
        out.sample("protoplane_engine_applications", &[], registry.applications() as f64);
        if let Some(router) = router.upgrade() {
            out.family(
                "protoplane_engine_client_connections",
                Kind::Gauge,
                "Client connections open now (every transport).",
            );
            let c = router.drain().connections() as f64;
            out.sample("protoplane_engine_client_connections", &[], c);
        }
        let per_app: [(&str, Kind, &str); 7] = [
            ("protoplane_engine_calls_total", Kind::Counter, "Calls opened with the application."),
            ("protoplane_engine_calls_in_flight", Kind::Gauge, "Calls open with the application now (posted on its ring, not yet answered)."),
            ("protoplane_engine_region_chunks_lent", Kind::Gauge, "Chunks of the engine's half of the region lent to the application now."),
            ("protoplane_engine_region_chunks_held", Kind::Gauge, "Chunks of the application's half the engine holds now (read in place)."),
            ("protoplane_engine_request_bytes_copied_total", Kind::Counter, "Request bytes the engine copied into the region (not received or decoded in place)."),
            ("protoplane_engine_requests_in_place_total", Kind::Counter, "Requests decoded straight into the region."),
            ("protoplane_engine_response_bytes_copied_out_total", Kind::Counter, "Response bytes the engine copied out of the application's half."),
        ];
        let apps = registry.all();
        for (name, kind, help) in per_app {
            out.family(name, kind, help);
            for a in &apps {
                let (id, pid) = (a.id.to_string(), a.pid.to_string());
                let labels = [("application", id.as_str()), ("pid", pid.as_str())];
                let s = &a.stats;
                let v = match name {
                    "protoplane_engine_calls_total" => n(&s.calls),
                    "protoplane_engine_calls_in_flight" => a.in_flight() as f64,
                    "protoplane_engine_region_chunks_lent" => f64::from(a.chunk_use().0),
                    "protoplane_engine_region_chunks_held" => f64::from(a.chunk_use().1),
                    "protoplane_engine_request_bytes_copied_total" => n(&s.request_bytes_copied),
                    "protoplane_engine_requests_in_place_total" => n(&s.requests_in_place),
                    _ => n(&s.response_bytes_copied_out),
                };
                out.sample(name, &labels, v);
            }
        }
        let calls = "protoplane_engine_method_calls_total";
        out.family(calls, Kind::Counter, "Calls per method by who answered them: an application, or the engine (functional offload) with a response, an error status, an undecodable request or a handler panic.");
        for (path, s) in counters.iter() {
            let method = path.strip_prefix('/').unwrap_or(path);
            for (by, v) in [
                ("application", &s.to_app),
                ("engine", &s.offloaded),
                ("engine_error", &s.offload_errors),
                ("engine_undecodable", &s.offload_invalid),
                ("engine_panic", &s.offload_panics),
            ] {
                out.sample(calls, &[("grpc_method", method), ("answered_by", by)], n(v));
            }
        }
        let decisions = "protoplane_engine_policy_decisions_total";
        out.family(decisions, Kind::Counter, "The per-call policy's decisions.");
        let p = &policies.stats;
        for (d, v) in [
            ("admitted", &p.admitted),
            ("denied", &p.denied),
            ("rate_limited", &p.rate_limited),
            ("concurrency_limited", &p.concurrency_limited),
            ("shed", &p.shed),
        ] {
            out.sample(decisions, &[("decision", d)], n(v));
        }
        out.family("protoplane_engine_policy_calls_open", Kind::Gauge, "Calls the policy admitted that are still open.");
        out.sample("protoplane_engine_policy_calls_open", &[], policies.open_calls() as f64);
        let attach = "protoplane_engine_attach_total";
        out.family(attach, Kind::Counter, "Connections to the attach socket, by outcome.");
        for (o, v) in [
            ("connected", &admission.connections),
            ("refused", &admission.refused),
            ("evicted", &admission.evicted),
            ("timed_out", &admission.timed_out),
        ] {
            out.sample(attach, &[("outcome", o)], n(v));
        }
    });
}
