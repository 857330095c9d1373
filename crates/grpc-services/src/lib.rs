//! The standard gRPC services every production server offers, as tonic
//! offers them in tonic-health and tonic-reflection: [`health`]
//! (`grpc.health.v1.Health`: `Check` and `Watch`) and [`reflection`]
//! (`grpc.reflection.v1` and `v1alpha`, which grpcurl and grpc_cli use to
//! discover a server's schemas), and [`orca`] (ORCA load reports, per
//! call and out of band, for clients' weighted round robin). All are ordinary [`protoplane_grpc::Service`]s
//! written against the call types alone, so they run on any transport,
//! monolithic or split; `protoplane_rpc::Router::with_standard_services`
//! adds both.

pub mod health;
pub mod orca;
pub mod reflection;

pub use health::{Health, ServingStatus};
pub use reflection::Reflection;
