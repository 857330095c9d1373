//! ORCA load reports (`protoplane_grpc_services::orca::LoadReport::decode`)
//! as a client reads them from any backend's trailers.
//!
//! Properties, beyond "never panics": a report that decodes encodes to
//! bytes that decode to the same report (compared through its encoding,
//! so NaN figures compare too), and decoding never yields more named
//! entries than the input has bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protoplane_grpc_services::orca::LoadReport;

fuzz_target!(|data: &[u8]| {
    let Ok(r) = LoadReport::decode(data) else { return };
    let entries = r.request_cost.len() + r.utilization.len() + r.named_metrics.len();
    assert!(entries <= data.len() / 2);
    let once = r.encode();
    let again = LoadReport::decode(&once).expect("an encoded report decodes");
    assert_eq!(again.encode(), once, "a report changed through encode and decode");
});
