//! The social-network service, generated-code edition:
//! `cargo run --release -p protoplane-example-socialnetwork --bin sn-server -- [PORT]`.

use std::sync::Arc;

use protoplane_example_socialnetwork::socialnetwork::social_network_server::SocialNetworkServer;
use protoplane_example_socialnetwork::Handlers;
use protoplane_rpc::{Router, ServerOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = std::env::args().nth(1).map(|p| p.parse()).transpose()?.unwrap_or(50051);
    let (router, _health) = Router::new(ServerOptions::default())
        .add_service(SocialNetworkServer::new(Handlers))
        .with_standard_services()?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on {}", listener.local_addr()?);
    Arc::new(router).serve(listener).await?;
    Ok(())
}
