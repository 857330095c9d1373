//! The image-compression server:
//! `cargo run --release -p protoplane-example-imageservice --bin image-server -- --scheme rpcacc --port 50051`.

use clap::Parser;
use protoplane_example_imageservice::server::{RunningServer, Scheme, ServerConfig};

/// RPCAcc's image-compression service (decrypt → compress → encrypt).
#[derive(Parser, Debug)]
#[command(name = "image-server")]
struct Args {
    /// cpu-only, offload-host or rpcacc.
    #[arg(long, default_value = "rpcacc")]
    scheme: Scheme,
    /// Port to serve on (0: any free port).
    #[arg(long, default_value_t = 50051)]
    port: u16,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Application threads (the handlers).
    #[arg(long, default_value_t = 1)]
    app_threads: usize,
    /// Engine (network) threads.
    #[arg(long, default_value_t = 1)]
    engine_threads: usize,
    /// Compute-unit slots running deflate.compress (plus one open, one seal).
    #[arg(long, default_value_t = 2)]
    compress_units: usize,
    /// rpcacc: turn automatic field updating off (requests fail while the
    /// compute units are away instead of moving to the host).
    #[arg(long)]
    no_auto_update: bool,
    /// Device region size in MiB.
    #[arg(long, default_value_t = 256)]
    region_mib: u32,
}

fn main() {
    let args = Args::parse();
    let cfg = ServerConfig {
        scheme: args.scheme,
        app_threads: args.app_threads,
        engine_threads: args.engine_threads,
        compress_units: args.compress_units,
        auto_update: !args.no_auto_update,
        region_capacity: args.region_mib.saturating_mul(1 << 20),
        ..ServerConfig::default()
    };
    match RunningServer::start(&cfg, (args.host, args.port).into()) {
        Ok(server) => {
            println!(
                "image-server: scheme {} on {} ({} app thread(s), {} engine thread(s){})",
                cfg.scheme,
                server.addr(),
                cfg.app_threads,
                cfg.engine_threads,
                match cfg.scheme {
                    Scheme::CpuOnly => String::new(),
                    _ => format!(", {} compress unit(s)", cfg.compress_units),
                }
            );
            server.serve_forever()
        }
        Err(e) => {
            eprintln!("image-server: {e}");
            std::process::exit(1);
        }
    }
}
