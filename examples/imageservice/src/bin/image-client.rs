//! The image service's client and load driver:
//! `cargo run --release -p protoplane-example-imageservice --bin image-client -- run --target 127.0.0.1:50051`.

use clap::{Parser, Subcommand};
use protoplane_example_imageservice::client::{self, LoadConfig, Nonces};
use protoplane_example_imageservice::crypto;

#[derive(Parser, Debug)]
#[command(name = "image-client")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Send N verified requests with concurrency C; print throughput,
    /// latency and the server's application CPU per request.
    Run {
        /// The server, HOST:PORT.
        #[arg(long, default_value = "127.0.0.1:50051")]
        target: String,
        /// Image size (65536, 64k, 1m).
        #[arg(long, default_value = "64k")]
        size: String,
        /// Measured requests.
        #[arg(long, default_value_t = 1000)]
        requests: u64,
        /// Requests in flight.
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Warm-up requests (not measured).
        #[arg(long, default_value_t = 50)]
        warmup: u64,
        /// Distinct images the requests cycle through.
        #[arg(long, default_value_t = 16)]
        distinct: usize,
        /// Deflate level 1..=9 (0: the server's default, 6).
        #[arg(long, default_value_t = 0)]
        level: u32,
        /// User name.
        #[arg(long, default_value = "alice")]
        user: String,
        /// Token (default: the user's own).
        #[arg(long)]
        token: Option<String>,
    },
    /// Print the server's counters.
    Stats {
        /// The server, HOST:PORT.
        #[arg(long, default_value = "127.0.0.1:50051")]
        target: String,
    },
    /// Write requests for `protoplane load --data FILE` (varint-delimited).
    WriteData {
        /// Output file.
        #[arg(long)]
        out: std::path::PathBuf,
        /// Image size.
        #[arg(long, default_value = "64k")]
        size: String,
        /// Requests (distinct images).
        #[arg(long, default_value_t = 16)]
        count: usize,
        /// User name.
        #[arg(long, default_value = "alice")]
        user: String,
    },
    /// RPCAcc's automatic field-update experiment (in process): the compute
    /// units vanish after request 3 and return after request 6.
    FieldUpdate {
        /// Image size.
        #[arg(long, default_value = "64k")]
        size: String,
        /// on, off or both.
        #[arg(long, default_value = "both")]
        auto_update: String,
    },
}

fn token_of(user: &str, token: Option<String>) -> String {
    token.unwrap_or_else(|| crypto::user(user).map(|u| u.token.to_string()).unwrap_or_default())
}

fn run(cmd: Cmd) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    match cmd {
        Cmd::Run { target, size, requests, concurrency, warmup, distinct, level, user, token } => {
            let cfg = LoadConfig {
                target,
                token: token_of(&user, token),
                user,
                size: crypto::parse_size(&size)?,
                distinct,
                requests,
                concurrency,
                level,
                warmup,
            };
            let report = rt.block_on(client::run_load(&cfg))?;
            println!("image {} bytes, concurrency {}", cfg.size, cfg.concurrency);
            println!("{}", report.summary());
            for e in &report.errors {
                println!("error: {e}");
            }
            if report.failed > 0 {
                return Err(format!("{} requests failed", report.failed));
            }
        }
        Cmd::Stats { target } => {
            let s = rt.block_on(async {
                let ch = client::connect(&target).await?;
                client::stats(&ch).await
            });
            let s = s.map_err(|s| format!("{:?}: {}", s.code, s.message))?;
            println!("{s:#?}");
        }
        Cmd::WriteData { out, size, count, user } => {
            let u = crypto::user(&user).ok_or_else(|| format!("unknown user {user:?}"))?;
            let size = crypto::parse_size(&size)?;
            let prepared = client::prepare(u.name, u.token, size, count, 0, &Nonces::new()?);
            std::fs::write(&out, client::delimited(&prepared))
                .map_err(|e| format!("{}: {e}", out.display()))?;
            println!("wrote {count} requests of {size}-byte images to {}", out.display());
        }
        Cmd::FieldUpdate { size, auto_update } => {
            let size = crypto::parse_size(&size)?;
            let modes: &[bool] = match auto_update.as_str() {
                "on" => &[true],
                "off" => &[false],
                "both" => &[true, false],
                other => return Err(format!("--auto-update {other:?}: on, off or both")),
            };
            drop(rt);
            for &on in modes {
                let steps = client::field_update_experiment(on, size)?;
                println!("{}", client::format_steps(on, &steps));
            }
        }
    }
    Ok(())
}

fn main() {
    if let Err(e) = run(Args::parse().cmd) {
        eprintln!("image-client: {e}");
        std::process::exit(1);
    }
}
