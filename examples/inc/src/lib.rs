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
//! The user code is the four modules. Each is written against the code
//! `build.rs` generates from its `.proto` ([`generated`]) exactly as for any
//! protoplane service: a server trait implemented, a client stub called with
//! blocks laid out by the builders and answers read through the views. The
//! stub is the `<Service>IncClient`, which sends the IEDT fields through the
//! client agent as the NetFilter says and the ordinary fields to the server.
//!
//! The plain computations every run is checked against are in [`check`],
//! [`harness`] turns a NetFilter into a registration and runs a module as a
//! server or client, and [`runner`] runs a whole application as processes
//! (`protoplane inc run`, this crate's `protoplane-inc` binary).

/// What `build.rs` generated from `proto/*.proto` and
/// `protos/protoplane/inc.proto`, one module per package.
#[allow(missing_docs, missing_debug_implementations, unreachable_pub, clippy::all)]
pub mod generated {
    /// `protoplane.*`.
    pub mod protoplane {
        /// `protoplane.inc`: the IEDTs.
        pub mod inc {
            include!(concat!(env!("OUT_DIR"), "/protoplane.inc.rs"));
        }
        /// `protoplane.examples.*`.
        pub mod examples {
            /// `protoplane.examples.syncagg`.
            pub mod syncagg {
                include!(concat!(env!("OUT_DIR"), "/protoplane.examples.syncagg.rs"));
            }
            /// `protoplane.examples.wordcount`.
            pub mod wordcount {
                include!(concat!(env!("OUT_DIR"), "/protoplane.examples.wordcount.rs"));
            }
            /// `protoplane.examples.monitor`.
            pub mod monitor {
                include!(concat!(env!("OUT_DIR"), "/protoplane.examples.monitor.rs"));
            }
            /// `protoplane.examples.agreement`.
            pub mod agreement {
                include!(concat!(env!("OUT_DIR"), "/protoplane.examples.agreement.rs"));
            }
        }
    }
}

pub mod agreement;
pub mod async_agg;
pub mod check;
pub mod harness;
pub mod key_value;
pub mod runner;
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
    /// What the client's in-network stub did (ordinary calls and their
    /// bytes); zero for the server's own verdict.
    pub face: protoplane_inc_net::rpc::FaceStats,
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
    /// A client's work in two processes, one after the other (a member
    /// that restarts): `Some(1)` does the first half and exits, `Some(2)`
    /// joins as the same member and does the rest (key-value, async-agg).
    pub part: Option<u8>,
    /// Where each role writes its results as JSON lines (`inc run
    /// --results DIR`).
    pub results: Option<std::path::PathBuf>,
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
    /// Another `MemberLoss`.
    pub member_loss: Option<protoplane_inc::plan::MemberLoss>,
}
