//! The social-network service, generated-code edition:
//! `cargo run --release -p protoplane-example-socialnetwork --bin sn-server -- [PORT]`
//! serves it on a port of its own (monolithic);
//! `... --bin sn-server -- --attach PATH` serves the same handlers as an
//! application of the `protoplane engine` whose attach socket is PATH (split
//! mode: the engine owns the port, TLS, limits, health and reflection).

use std::sync::Arc;

use protoplane_example_socialnetwork::socialnetwork::social_network_server::SocialNetworkServer;
use protoplane_example_socialnetwork::Handlers;
use protoplane_rpc::{Router, ServerOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The runtime's log lines (attached, waiting for an engine) on stderr;
    // RUST_LOG picks the levels.
    protoplane_telemetry::init_logs(Default::default())?;
    let svc = SocialNetworkServer::new(Handlers);
    let port: u16 = match args.as_slice() {
        [flag, path] if flag == "--attach" => {
            // Runs until stopped, attaching again whenever the engine restarts.
            protoplane_app::attach(path).service(svc).run().await?;
            return Ok(());
        }
        [] => 50051,
        [port] => port.parse().map_err(|e| format!("port {port:?}: {e}"))?,
        _ => return Err("usage: sn-server [PORT] | sn-server --attach PATH".into()),
    };
    let (router, _health) =
        Router::new(ServerOptions::default()).add_service(svc).with_standard_services()?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on {}", listener.local_addr()?);
    Arc::new(router).serve(listener).await?;
    Ok(())
}
