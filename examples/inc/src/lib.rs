//! Four in-network computation applications, each a NetFilter, a `.proto`
//! with IEDT fields and a small amount of user code:
//!
//! | application | primitives | user code |
//! |---|---|---|
//! | [`sync_agg`]: gradient all-reduce among N workers (floats) | `Map.addTo` + `CntFwd` to the members, `shadow` clear | `sync_agg.rs` |
//! | [`async_agg`]: word count over the repository's documentation | `Map.addTo`, `Map.get` | `async_agg.rs` |
//! | [`key_value`]: per-key counters, monitoring style | `Map.addTo`, `Map.get` | `key_value.rs` |
//! | [`agreement`]: votes counted to a quorum, value committed | `CntFwd` (test-and-set) | `agreement.rs` |
//!
//! The user code is the four modules; the plain computations every run is
//! checked against are in [`check`], and [`harness`] turns a NetFilter
//! into a registration and runs a module as a server or client process
//! (`protoplane inc run`).

pub mod agreement;
pub mod async_agg;
pub mod check;
pub mod harness;
pub mod key_value;
pub mod sync_agg;

/// What a run of one client found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Every result equals the plain computation.
    pub exact: bool,
    /// One line about what was checked.
    pub detail: String,
    /// Items (values, words, counters, votes) this client sent.
    pub items: u64,
}

/// The knobs shared by the four applications.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Params {
    /// Clients (members).
    pub clients: u16,
    /// Seed of the generated data.
    pub seed: u64,
    /// Amount of work: 1 for the quick runs of the test suite, larger for
    /// benchmarks.
    pub scale: u32,
    /// Synchronous aggregation: per mille of gradient values so large that
    /// their sum leaves 32 bits (the overflow experiment).
    pub overflow_permille: u32,
    /// Agreement: propose one instance at a time and time each commit.
    pub sequential: bool,
}

/// Benchmark overrides of what a NetFilter asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tweaks {
    /// Another clear policy.
    pub clear: Option<protoplane_inc::plan::ClearPolicy>,
    /// Another cache policy.
    pub cache: Option<protoplane_inc::plan::CachePolicy>,
    /// Another amount of data-plane memory.
    pub memory: Option<u32>,
}
