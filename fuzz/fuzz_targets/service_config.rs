//! gRPC service configs (`protoplane_rpc::config::ServiceConfig::from_json`)
//! as a resolver, a control plane or a file hands them to a channel.
//!
//! Properties, beyond "never panics": a config that parses has retry
//! policies within gRPC's bounds (2..=5 attempts, positive backoffs, at
//! least one code, never OK), and every method path finds its settings
//! without panicking.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protoplane_grpc::Code;
use protoplane_rpc::config::{ServiceConfig, MAX_ATTEMPTS};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(sc) = ServiceConfig::from_json(text) else { return };
    for path in ["/a.S/M", "/a.S/", "//", "", "/x"] {
        if let Some(r) = sc.method(path).and_then(|m| m.retry.as_ref()) {
            assert!((2..=MAX_ATTEMPTS).contains(&r.max_attempts));
            assert!(!r.initial_backoff.is_zero() && !r.max_backoff.is_zero());
            assert!(!r.retryable.is_empty() && !r.retryable.contains(&Code::Ok));
        }
    }
});
