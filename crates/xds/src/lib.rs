//! protoplane's xDS client: `xds:///name` targets, resolved by an xDS
//! management server (Istio's istiod, Traffic Director, anything built on
//! Envoy's go-control-plane) the way proxyless gRPC does it (gRFC A27 and
//! its follow-ups).
//!
//! - [`bootstrap`]: where the management server is and who this client is
//!   (`GRPC_XDS_BOOTSTRAP` names a file, `GRPC_XDS_BOOTSTRAP_CONFIG` holds
//!   the JSON itself);
//! - [`client`]: one ADS stream per process (state of the world), the
//!   resources subscribed to and their cache, every response ACKed or
//!   NACKed (a resource that does not validate is refused with the reason,
//!   and the last good one stays in use);
//! - [`resources`]: what is read of each resource (Listener → its HTTP
//!   connection manager → RouteConfiguration → Cluster → ClusterLoadAssignment),
//!   decoded with protoplane's own wire engine from the declarations in
//!   `protos/envoy`;
//! - [`router`]: the channel side: the virtual host for the target, each
//!   call matched against its routes (path prefix or exact path, headers,
//!   runtime fraction) and sent to a cluster (or one of weighted
//!   clusters, gRFC A28) with the route's timeout (A31) and retry policy
//!   (A44); each cluster a round-robin channel over its endpoints of the
//!   best priority, weighted by locality and endpoint weights.
//!
//! [`register`] makes `Channel::connect("xds:///name")` work in this
//! process.

pub mod bootstrap;
pub mod client;
pub mod resources;
pub mod router;

/// The generated views and builders of `protos/envoy` (and the Google types
/// they use).
#[allow(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    clippy::all,
    clippy::unwrap_used,
    rust_2018_idioms
)]
pub mod pb {
    pub mod google {
        pub mod protobuf {
            include!(concat!(env!("OUT_DIR"), "/google.protobuf.rs"));
        }
        pub mod rpc {
            include!(concat!(env!("OUT_DIR"), "/google.rpc.rs"));
        }
    }
    pub mod envoy {
        pub mod service {
            pub mod discovery {
                pub mod v3 {
                    include!(concat!(env!("OUT_DIR"), "/envoy.service.discovery.v3.rs"));
                }
            }
        }
        pub mod config {
            pub mod core {
                pub mod v3 {
                    include!(concat!(env!("OUT_DIR"), "/envoy.config.core.v3.rs"));
                }
            }
            pub mod listener {
                pub mod v3 {
                    include!(concat!(env!("OUT_DIR"), "/envoy.config.listener.v3.rs"));
                }
            }
            pub mod route {
                pub mod v3 {
                    include!(concat!(env!("OUT_DIR"), "/envoy.config.route.v3.rs"));
                }
            }
            pub mod cluster {
                pub mod v3 {
                    include!(concat!(env!("OUT_DIR"), "/envoy.config.cluster.v3.rs"));
                }
            }
            pub mod endpoint {
                pub mod v3 {
                    include!(concat!(env!("OUT_DIR"), "/envoy.config.endpoint.v3.rs"));
                }
            }
        }
        pub mod extensions {
            pub mod filters {
                pub mod network {
                    pub mod http_connection_manager {
                        pub mod v3 {
                            include!(concat!(
                                env!("OUT_DIR"),
                                "/envoy.extensions.filters.network.http_connection_manager.v3.rs"
                            ));
                        }
                    }
                }
                pub mod http {
                    pub mod router {
                        pub mod v3 {
                            include!(concat!(
                                env!("OUT_DIR"),
                                "/envoy.extensions.filters.http.router.v3.rs"
                            ));
                        }
                    }
                }
            }
        }
        pub mod r#type {
            pub mod matcher {
                pub mod v3 {
                    include!(concat!(env!("OUT_DIR"), "/envoy.type.matcher.v3.rs"));
                }
            }
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/envoy.type.v3.rs"));
            }
        }
    }
}

/// Registers the `xds` scheme: from now on, channels to `xds:///name` in
/// this process are routed by the management server the bootstrap names
/// (read when the first such channel is made).
pub fn register() {
    protoplane_rpc::route::register_scheme("xds", router::factory);
}
