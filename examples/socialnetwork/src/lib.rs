//! The social-network service with generated code.
//!
//! `socialnetwork` holds what `build.rs` generated from
//! `protos/socialnetwork/social_network.proto`: per message a marker
//! (`LoginRequest`), a zero-copy view (`LoginRequestView`) and a builder
//! (`LoginReplyBuilder`); for the service a server trait
//! (`social_network_server::SocialNetwork`) with its adapter
//! (`SocialNetworkServer`) and a client stub
//! (`social_network_client::SocialNetworkClient`).
//!
//! [`Handlers`] implements the service: the same work as the dynamic server
//! of `protoplane serve` and the tonic peer of the RPC benchmark.

#[allow(missing_docs, missing_debug_implementations, unreachable_pub)]
pub mod socialnetwork {
    include!(concat!(env!("OUT_DIR"), "/socialnetwork.rs"));
}

use protoplane_grpc::{Message, Request, Status};
use protoplane_wire::Block;
use socialnetwork::social_network_server::SocialNetwork;
use socialnetwork::{
    ComposeMediaRequestView, ComposePostRequestView, Empty, LoginReply, LoginReplyBuilder,
    LoginRequestView, RegisterUserRequestView, StorePostRequestView,
};

/// The service's handlers.
#[derive(Debug, Default)]
pub struct Handlers;

fn empty() -> Block {
    Empty::builder().finish()
}

impl SocialNetwork for Handlers {
    async fn register_user(&self, request: Request<Message>) -> Result<Block, Status> {
        let req: RegisterUserRequestView<'_> = request.message.typed()?;
        std::hint::black_box(req.req_id());
        Ok(empty())
    }

    async fn login(&self, request: Request<Message>) -> Result<Block, Status> {
        let req: LoginRequestView<'_> = request.message.typed()?;
        let mut b = LoginReply::builder();
        LoginReplyBuilder::root(&mut b).set_token(&format!(
            "t{}-{}",
            req.req_id(),
            req.username()
        ))?;
        Ok(b.finish())
    }

    async fn compose_media(&self, request: Request<Message>) -> Result<Block, Status> {
        let req: ComposeMediaRequestView<'_> = request.message.typed()?;
        std::hint::black_box(req.req_id());
        Ok(empty())
    }

    async fn compose_post(&self, request: Request<Message>) -> Result<Block, Status> {
        let req: ComposePostRequestView<'_> = request.message.typed()?;
        std::hint::black_box(req.req_id());
        Ok(empty())
    }

    async fn store_post(&self, request: Request<Message>) -> Result<Block, Status> {
        let req: StorePostRequestView<'_> = request.message.typed()?;
        std::hint::black_box(req.req_id());
        Ok(empty())
    }
}
