//! The image-compression server:
//! `cargo run --release -p protoplane-example-imageservice --bin image-server -- --scheme rpcacc --port 50051`
//! serves it on a port of its own, the engine's side in this process;
//! `... --bin image-server -- --attach PATH` serves the handlers as an
//! application of the `protoplane engine` whose attach socket is PATH
//! (split mode: the engine decodes, runs the compute units and encodes).

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
    /// Split mode: attach to the `protoplane engine` at this socket (its
    /// `[offload] units` must be at least compress-units + 2).
    #[arg(long)]
    attach: Option<std::path::PathBuf>,
}

fn main() {
    let args = Args::parse();
    if let Some(path) = &args.attach {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
        let r = rt.map_err(|e| e.to_string()).and_then(|rt| {
            let units = args.compress_units.clamp(1, 254) as u32;
            rt.block_on(protoplane_example_imageservice::server::split::serve_attached(path, units))
        });
        if let Err(e) = r {
            eprintln!("image-server: {e}");
            std::process::exit(1);
        }
        return;
    }
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
