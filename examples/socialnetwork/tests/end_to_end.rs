//! The generated server and client of the example talk to each other, and
//! the generated server answers exactly as `protoplane serve` does.

use std::sync::Arc;

use protoplane_example_socialnetwork::socialnetwork::social_network_client::SocialNetworkClient;
use protoplane_example_socialnetwork::socialnetwork::social_network_server::SocialNetworkServer;
use protoplane_example_socialnetwork::socialnetwork::{
    ComposePostRequest, ComposePostRequestBuilder, EmptyView, LoginReplyView, LoginRequest,
    LoginRequestBuilder,
};
use protoplane_example_socialnetwork::Handlers;
use protoplane_grpc::Request;
use protoplane_rpc::{Router, ServerOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_and_compose_post() {
    let router =
        Router::new(ServerOptions::default()).add_service(SocialNetworkServer::new(Handlers));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(Arc::new(router).serve(listener));

    let client = SocialNetworkClient::connect(&addr).await.expect("connect");
    let mut b = LoginRequest::builder();
    LoginRequestBuilder::root(&mut b).set_req_id(42).set_username("grace").expect("room");
    let reply = client.login(Request::new(&b.finish())).await.expect("login");
    let view: LoginReplyView<'_> = reply.typed().expect("typed");
    assert_eq!(view.token(), "t42-grace");

    let mut b = ComposePostRequest::builder();
    let mut post = ComposePostRequestBuilder::root(&mut b);
    post.set_req_id(1).set_text("hello world").expect("room");
    post.push_media_ids(5).expect("room");
    let reply = client.compose_post(Request::new(&b.finish())).await.expect("compose");
    let _: EmptyView<'_> = reply.typed().expect("an Empty");
}
