//! `kv-server [PORT]`: the key-value store on a port of its own
//! (monolithic). `kv-server --attach PATH`: the same handlers as an
//! application of the `protoplane engine` whose attach socket is PATH
//! (split: the engine, started with `--proto proto/kv.proto`, owns the
//! port and does the transport work).

use std::sync::Arc;

use protoplane_example_kv::kv::key_value_server::KeyValueServer;
use protoplane_example_kv::Store;
use protoplane_rpc::{Router, ServerOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The runtime's log lines (attached, waiting for an engine) on stderr;
    // RUST_LOG picks the levels.
    protoplane_telemetry::init_logs(Default::default())?;
    let svc = KeyValueServer::new(Store::default());
    let port: u16 = match args.as_slice() {
        [flag, path] if flag == "--attach" => {
            protoplane_app::attach(path).service(svc).run().await?;
            return Ok(());
        }
        [] => 50051,
        [port] => port.parse()?,
        _ => return Err("usage: kv-server [PORT] | kv-server --attach PATH".into()),
    };
    let (router, _health) =
        Router::new(ServerOptions::default()).add_service(svc).with_standard_services()?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on {}", listener.local_addr()?);
    Arc::new(router).serve(listener).await?;
    Ok(())
}
