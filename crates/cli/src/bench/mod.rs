//! Benchmarks: `protoplane bench wire` (the driver) and `protoplane
//! bench-worker` (protoplane's worker); `protoplane bench rpc`. See `bench/README.md` at the
//! repository root for the method and the worker protocol.

pub(crate) mod echo;
pub(crate) mod inc;
pub(crate) mod jobs;
pub(crate) mod offload;
pub(crate) mod ring;
pub(crate) mod rpc;
pub(crate) mod servers;
pub(crate) mod split;
pub(crate) mod svg;
pub(crate) mod wire;
pub(crate) mod worker;

/// `protoplane bench …`
#[derive(clap::Subcommand, Debug)]
pub(crate) enum BenchCommand {
    /// protoplane's wire engine against prost, buffa and protobuf C++.
    Wire(wire::WireArgs),
    /// protoplane's RPC server (gRPC/HTTP2 and lean) against tonic + prost,
    /// grpc-go and gRPC C++, under `protoplane load` and ghz.
    Rpc(rpc::RpcArgs),
    /// Split mode (engine + application) against monolithic: the ring
    /// handoff, zero business logic, and the knee experiment.
    Split(split::SplitArgs),
    /// In-network computation: each application with the data plane vs.
    /// server agents only, clear and cache policies, two applications
    /// sharing the data plane, overflow.
    Inc(inc::IncArgs),
    /// The offload engine: one-shot commit, co-serialization, per-field
    /// decode on engine workers, functional offload (RPCAcc, PsPIN).
    Offload(offload::OffloadArgs),
}

/// The same allocator behaviour for every process a benchmark starts:
/// glibc keeps freed big blocks instead of returning them to the OS
/// (unmapping them, or trimming the heap), which otherwise makes every
/// large message fault fresh pages in and its timings jump.
pub(crate) fn same_malloc(cmd: &mut std::process::Command) -> &mut std::process::Command {
    cmd.env("MALLOC_MMAP_THRESHOLD_", "1073741824")
        .env("MALLOC_TRIM_THRESHOLD_", "1073741824")
        .env("MALLOC_TOP_PAD_", "67108864")
}
