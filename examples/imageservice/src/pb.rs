//! The messages of `proto/image.proto` as `prost` structs: what the client
//! encodes and decodes with (an implementation independent of the server's
//! table-driven wire engine, so the two check each other).

/// `protoplane.examples.image.CompressRequest`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct CompressRequest {
    /// User name.
    #[prost(string, tag = "1")]
    pub user: String,
    /// The user's token.
    #[prost(string, tag = "2")]
    pub token: String,
    /// 12-byte nonce of `image`.
    #[prost(bytes = "vec", tag = "3")]
    pub nonce: Vec<u8>,
    /// AES-256-GCM ciphertext ‖ tag of the image.
    #[prost(bytes = "vec", tag = "4")]
    pub image: Vec<u8>,
    /// Deflate level (0: default).
    #[prost(uint32, tag = "5")]
    pub level: u32,
}

/// `protoplane.examples.image.CompressReply`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct CompressReply {
    /// 12-byte nonce of `result`.
    #[prost(bytes = "vec", tag = "1")]
    pub nonce: Vec<u8>,
    /// AES-256-GCM ciphertext ‖ tag of the deflate stream.
    #[prost(bytes = "vec", tag = "2")]
    pub result: Vec<u8>,
    /// Bytes of the decrypted image.
    #[prost(uint64, tag = "3")]
    pub original_size: u64,
    /// Bytes of the deflate stream.
    #[prost(uint64, tag = "4")]
    pub compressed_size: u64,
    /// Where the work ran.
    #[prost(string, tag = "6")]
    pub path: String,
}

/// `protoplane.examples.image.StatsRequest`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct StatsRequest {}

/// `protoplane.examples.image.StatsReply` (see the .proto for each field).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct StatsReply {
    /// Scheme.
    #[prost(string, tag = "1")]
    pub scheme: String,
    /// Compress calls answered OK.
    #[prost(uint64, tag = "2")]
    pub requests_ok: u64,
    /// Compress calls refused or failed.
    #[prost(uint64, tag = "3")]
    pub requests_failed: u64,
    /// rpcacc: image decoded into the device region.
    #[prost(uint64, tag = "4")]
    pub device_path: u64,
    /// rpcacc: image decoded on the host (field moved by automatic updating).
    #[prost(uint64, tag = "5")]
    pub host_path: u64,
    /// Placement flips.
    #[prost(uint64, tag = "6")]
    pub field_updates: u64,
    /// CPU ns of the application's handler threads.
    #[prost(uint64, tag = "7")]
    pub app_handler_cpu_ns: u64,
    /// CPU ns of the notification-delivery threads.
    #[prost(uint64, tag = "8")]
    pub app_notify_cpu_ns: u64,
    /// Application CPU ns (handler + notify).
    #[prost(uint64, tag = "9")]
    pub app_cpu_ns: u64,
    /// CPU ns of the engine's network threads.
    #[prost(uint64, tag = "10")]
    pub engine_cpu_ns: u64,
    /// CPU ns of the compute units' workers.
    #[prost(uint64, tag = "11")]
    pub cu_cpu_ns: u64,
    /// CPU ns of the whole server process.
    #[prost(uint64, tag = "12")]
    pub process_cpu_ns: u64,
    /// Application threads.
    #[prost(uint32, tag = "13")]
    pub app_threads: u32,
}
