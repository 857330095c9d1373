//! Calls `Login` on a social-network server:
//! `cargo run --release -p protoplane-example-socialnetwork --bin sn-client -- HOST:PORT USER`.

use protoplane_example_socialnetwork::socialnetwork::social_network_client::SocialNetworkClient;
use protoplane_example_socialnetwork::socialnetwork::{
    LoginReplyView, LoginRequest, LoginRequestBuilder,
};
use protoplane_grpc::Request;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let target = args.next().unwrap_or_else(|| "127.0.0.1:50051".into());
    let user = args.next().unwrap_or_else(|| "ada".into());
    let client = SocialNetworkClient::connect(&target).await?;

    let mut b = LoginRequest::builder();
    LoginRequestBuilder::root(&mut b).set_req_id(7).set_username(&user)?;
    let reply = client.login(Request::new(&b.finish())).await?;
    let view: LoginReplyView<'_> = reply.typed()?;
    println!("token: {}", view.token());
    Ok(())
}
