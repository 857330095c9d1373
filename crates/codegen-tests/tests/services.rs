//! Generated service code end to end: a `grpc.testing.TestService` written
//! against the generated server trait (all four call kinds), served over
//! gRPC/HTTP2 and the lean transport, and called through the generated
//! client stub; requests and responses laid out with generated builders and
//! read with generated views.

use std::sync::Arc;

use protoplane_codegen_tests::grpc::testing::{
    self as t, test_service_client::TestServiceClient, test_service_server::TestService,
    test_service_server::TestServiceServer,
};
use protoplane_grpc::rich::ErrorDetails;
use protoplane_grpc::{Code, Message, Request, Responder, Status, Streaming};
use protoplane_rpc::lean::LeanChannel;
use protoplane_rpc::{CallOptions, Router, ServerOptions};
use protoplane_wire::Block;

struct Impl;

fn payload_response(size: usize) -> Result<Block, Status> {
    let mut b = t::SimpleResponse::builder();
    t::SimpleResponseBuilder::root(&mut b).payload()?.set_body(&vec![0; size])?;
    Ok(b.finish())
}

fn output_response(size: usize) -> Result<Block, Status> {
    let mut b = t::StreamingOutputCallResponse::builder();
    t::StreamingOutputCallResponseBuilder::root(&mut b).payload()?.set_body(&vec![1; size])?;
    Ok(b.finish())
}

impl TestService for Impl {
    async fn empty_call(&self, _request: Request<Message>) -> Result<Block, Status> {
        Ok(t::Empty::builder().finish())
    }

    async fn unary_call(&self, request: Request<Message>) -> Result<Block, Status> {
        let req: t::SimpleRequestView<'_> = request.message.typed()?;
        if let Some(s) = req.response_status().filter(|s| s.code() != 0) {
            // Generated code attaches rich details through the status API.
            let details = ErrorDetails::with_error_info("ASKED", "grpc.testing", []);
            return Err(Status::with_error_details(
                Code::from_u32(s.code() as u32),
                s.message(),
                details,
            ));
        }
        payload_response(req.response_size() as usize)
    }

    async fn cacheable_unary_call(&self, request: Request<Message>) -> Result<Block, Status> {
        self.unary_call(request).await
    }

    async fn streaming_output_call(
        &self,
        request: Request<Message>,
        mut responses: Responder,
    ) -> Result<(), Status> {
        let req: t::StreamingOutputCallRequestView<'_> = request.message.typed()?;
        let sizes: Vec<usize> =
            req.response_parameters().iter().map(|p| p.size() as usize).collect();
        for size in sizes {
            responses.send(output_response(size)?).await?;
        }
        Ok(())
    }

    async fn streaming_input_call(
        &self,
        mut requests: Request<Streaming>,
    ) -> Result<Block, Status> {
        let mut total = 0;
        while let Some(m) = requests.message.message().await {
            let req: t::StreamingInputCallRequestView<'_> = m.typed()?;
            total += req.payload().map_or(0, |p| p.body().len());
        }
        let mut b = t::StreamingInputCallResponse::builder();
        t::StreamingInputCallResponseBuilder::root(&mut b)
            .set_aggregated_payload_size(total as i32);
        Ok(b.finish())
    }

    async fn full_duplex_call(
        &self,
        mut requests: Request<Streaming>,
        mut responses: Responder,
    ) -> Result<(), Status> {
        while let Some(m) = requests.message.message().await {
            let sizes: Vec<usize> = {
                let req: t::StreamingOutputCallRequestView<'_> = m.typed()?;
                req.response_parameters().iter().map(|p| p.size() as usize).collect()
            };
            for size in sizes {
                responses.send(output_response(size)?).await?;
            }
        }
        Ok(())
    }

    async fn half_duplex_call(
        &self,
        requests: Request<Streaming>,
        responses: Responder,
    ) -> Result<(), Status> {
        self.full_duplex_call(requests, responses).await
    }

    async fn unimplemented_call(&self, _request: Request<Message>) -> Result<Block, Status> {
        Err(Status::new(Code::Unimplemented, "not here"))
    }
}

fn simple_request(response_size: i32, fail: Option<(i32, &str)>) -> Block {
    let mut b = t::SimpleRequest::builder();
    let mut r = t::SimpleRequestBuilder::root(&mut b);
    r.set_response_size(response_size);
    if let Some((code, msg)) = fail {
        let mut s = r.response_status().expect("room");
        s.set_code(code);
        s.set_message(msg).expect("room");
    }
    b.finish()
}

fn output_request(sizes: &[i32]) -> Block {
    let mut b = t::StreamingOutputCallRequest::builder();
    let mut r = t::StreamingOutputCallRequestBuilder::root(&mut b);
    for &s in sizes {
        r.add_response_parameters().expect("room").set_size(s);
    }
    b.finish()
}

async fn serve() -> (String, String) {
    let router =
        Arc::new(Router::new(ServerOptions::default()).add_service(TestServiceServer::new(Impl)));
    let lean = protoplane_test_support::net::serve_lean(router.clone()).await;
    (protoplane_test_support::net::serve_grpc(router).await.to_string(), lean.to_string())
}

fn body_len(m: &Message) -> usize {
    let v: t::StreamingOutputCallResponseView<'_> = m.typed().expect("typed");
    v.payload().map_or(0, |p| p.body().len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_kind_through_generated_code() {
    let (addr, _) = serve().await;
    let client = TestServiceClient::connect(&addr).await.expect("connect");

    // Unary, and an error status.
    let reply = client.unary_call(Request::new(&simple_request(77, None))).await.expect("unary");
    let v: t::SimpleResponseView<'_> = reply.typed().expect("typed");
    assert_eq!(v.payload().map(|p| p.body().len()), Some(77));
    let err = client
        .unary_call(Request::new(&simple_request(1, Some((5, "no such thing ✓")))))
        .await
        .expect_err("fails");
    assert_eq!((err.code, err.message.as_str()), (Code::NotFound, "no such thing ✓"));
    let info = err.error_details().error_info.expect("the generated client reads the details");
    assert_eq!((info.reason.as_str(), info.domain.as_str()), ("ASKED", "grpc.testing"));
    let err = client
        .unimplemented_call(Request::new(&t::Empty::builder().finish()))
        .await
        .expect_err("unimplemented");
    assert_eq!(err.code, Code::Unimplemented);

    // Server streaming.
    let mut call = client.streaming_output_call(CallOptions::default()).await.expect("start");
    call.send(&output_request(&[3, 1000, 0, 70_000])).await.expect("send");
    call.call.close_send();
    let mut got = Vec::new();
    while let Some(m) = call.message().await.expect("recv") {
        got.push(body_len(&m));
    }
    assert_eq!(got, [3, 1000, 0, 70_000]);

    // Client streaming.
    let mut call = client.streaming_input_call(CallOptions::default()).await.expect("start");
    for size in [10, 20, 30] {
        let mut b = t::StreamingInputCallRequest::builder();
        t::StreamingInputCallRequestBuilder::root(&mut b)
            .payload()
            .expect("room")
            .set_body(&vec![9; size])
            .expect("room");
        call.send(&b.finish()).await.expect("send");
    }
    call.call.close_send();
    let m = call.message().await.expect("recv").expect("a response");
    let v: t::StreamingInputCallResponseView<'_> = m.typed().expect("typed");
    assert_eq!(v.aggregated_payload_size(), 60);

    // Bidirectional, in lock step.
    let mut call = client.full_duplex_call(CallOptions::default()).await.expect("start");
    for size in [5, 50, 500] {
        call.send(&output_request(&[size])).await.expect("send");
        let m = call.message().await.expect("recv").expect("a response");
        assert_eq!(body_len(&m), size as usize);
    }
    call.call.close_send();
    assert!(call.message().await.expect("end").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_service_over_the_lean_transport() {
    let (_, lean) = serve().await;
    let ch = LeanChannel::connect(&lean).await.expect("connect");
    let schema = t::test_service_server::schema();
    let tables = schema.tables();
    // Encode a request the engine's way: the block, then the wire bytes.
    let block = simple_request(123, None);
    let mut enc = protoplane_wire::Encoder::new();
    let wire = enc
        .encode(
            tables,
            t::SimpleRequest::TYPE_INDEX,
            protoplane_wire::Source::owned(block.as_bytes()),
            &protoplane_wire::EncodeOptions::default(),
        )
        .expect("encode")
        .to_vec();
    let reply = ch
        .unary("/grpc.testing.TestService/UnaryCall", &wire, &CallOptions::default())
        .await
        .expect("unary");
    let m = Message::decode(
        tables,
        t::SimpleResponse::TYPE_INDEX,
        reply,
        &mut protoplane_wire::Decoder::new(),
    )
    .expect("decode");
    let v: t::SimpleResponseView<'_> = m.typed().expect("typed");
    assert_eq!(v.payload().map(|p| p.body().len()), Some(123));
}
