//! Benchmarks: `protoplane bench wire` (the driver) and `protoplane
//! bench-worker` (protoplane's worker); `protoplane bench rpc`. See `bench/README.md` at the
//! repository root for the method and the worker protocol.

pub(crate) mod echo;
pub(crate) mod jobs;
pub(crate) mod ring;
pub(crate) mod rpc;
pub(crate) mod split;
pub(crate) mod svg;
pub(crate) mod wire;
pub(crate) mod worker;

/// `protoplane bench …`
#[derive(clap::Subcommand, Debug)]
pub(crate) enum BenchCommand {
    /// protoplane's wire engine against prost, buffa and protobuf C++.
    Wire(wire::WireArgs),
    /// protoplane's RPC server (gRPC/HTTP2 and lean) against tonic + prost.
    Rpc(rpc::RpcArgs),
    /// Split mode (engine + application) against monolithic: the ring
    /// handoff, zero business logic, and the knee experiment.
    Split(split::SplitArgs),
}
