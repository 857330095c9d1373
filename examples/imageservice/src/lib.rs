//! RPCAcc's end-to-end example: an image-compression service whose image
//! field is decrypted, compressed and re-encrypted either on the
//! application's CPU, on compute units fed by the application
//! (host-placed), or on compute units fed by the engine's target-aware
//! decode (device-placed, RPCAcc) — plus the automatic field-update
//! experiment (RPCAcc's Fig. 11). See `README.md` beside this crate.
//!
//! * [`server`]: the service, its three schemes, and [`server::RunningServer`];
//! * [`client`]: requests, verification, the load driver and the
//!   field-update experiment;
//! * [`crypto`]: keys, credentials, host-side kernels, test images;
//! * [`units`]: the application's side of the compute units;
//! * [`cpu`]: per-thread CPU time from `/proc`;
//! * [`pb`]: the messages as `prost` structs (the client's encoder).

pub mod client;
pub mod cpu;
pub mod crypto;
pub mod pb;
pub mod server;
pub mod units;

/// `proto/image.proto`.
pub const PROTO: &str = include_str!("../proto/image.proto");
/// The name `image.proto` is compiled under.
pub const PROTO_NAME: &str = "image.proto";
/// The service's full name.
pub const SERVICE: &str = "protoplane.examples.image.ImageService";
/// The HTTP/2 path of `Compress`.
pub const COMPRESS_PATH: &str = "/protoplane.examples.image.ImageService/Compress";
/// The HTTP/2 path of `Stats`.
pub const STATS_PATH: &str = "/protoplane.examples.image.ImageService/Stats";
