//! Interceptors on both sides of real gRPC calls over sockets: a server
//! chain (a synchronous authenticator that rejects with details, adds
//! request metadata and a response header; an asynchronous one that
//! waits; a recorder that sees every outcome and its timing, adds a
//! trailer, and re-routes a method) and a client chain (adds
//! credentials, rejects before sending, sees every status), unary,
//! server-streaming and cancelled calls.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protoplane_grpc::intercept::{
    AsyncHead, AsyncInterceptor, CallEnd, CallHead, Chain, Interceptor,
};
use protoplane_grpc::rich::ErrorDetails;
use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::intercept::{ClientChain, ClientEnd, ClientHead, ClientInterceptor};
use protoplane_rpc::{CallOptions, Channel, Router, ServerOptions};
use protoplane_schema::ProtoSource;
use protoplane_test_support::net::{bounded, eventually, serve_grpc};
use protoplane_wire::Builder;

const BOUND: Duration = Duration::from_secs(10);

fn bad(e: impl std::fmt::Display) -> Status {
    Status::new(Code::Internal, e.to_string())
}

const PROTO: &str = r#"
syntax = "proto3";
package icpt.test;
message Empty {}
service Svc {
  rpc Echo(Empty) returns (Empty);
  rpc Old(Empty) returns (Empty);
  rpc Three(Empty) returns (stream Empty);
  rpc Hang(Empty) returns (Empty);
  rpc Forbidden(Empty) returns (Empty);
}
"#;

/// The handlers: `Echo` answers with trailers naming the request metadata
/// the interceptors added; `Three` streams three responses; `Hang` never
/// answers; `Old` is never reached (re-routed).
struct Svc {
    schema: Arc<Schema>,
    calls: AtomicUsize,
}

impl Service for Svc {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "icpt.test.Svc"
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            req.message.single().await?;
            self.calls.fetch_add(1, Ordering::SeqCst);
            let name = self.schema.method(method).map(|m| m.name.clone()).unwrap_or_default();
            let n = match name.as_str() {
                "Three" => 3,
                "Hang" => {
                    std::future::pending::<()>().await;
                    0
                }
                "Old" => return Err(Status::new(Code::Internal, "Old was not re-routed")),
                _ => 1,
            };
            for _ in 0..n {
                let b = Builder::new(self.schema.tables(), out.output_type())?;
                out.send(b.finish()).await?;
            }
            let mut trailers = Metadata::new();
            let user = req.metadata.get("x-user").unwrap_or("none").to_string();
            let waited = req.metadata.get("x-async").unwrap_or("no").to_string();
            trailers.insert("x-user-seen", &user).map_err(bad)?;
            trailers.insert("x-async-seen", &waited).map_err(bad)?;
            Ok(trailers)
        })
    }
}

/// Rejects calls without the right credentials (UNAUTHENTICATED with an
/// ErrorInfo); otherwise names the user to the handler and the client.
struct Auth;

impl Interceptor for Auth {
    fn before(&self, call: &mut CallHead<'_>) -> Result<(), Status> {
        if call.metadata.get("authorization") != Some("Bearer ok") {
            return Err(Status::with_error_details(
                Code::Unauthenticated,
                "bad credentials",
                ErrorDetails::with_error_info("BAD_TOKEN", "icpt.test", []),
            ));
        }
        call.metadata.insert("x-user", "alice").map_err(bad)?;
        call.response_headers.insert("x-served-by", "interceptor").map_err(bad)?;
        Ok(())
    }
}

/// Waits (as one asking a remote service would), then tags the call.
struct Remote;

impl AsyncInterceptor for Remote {
    fn before(&self, mut head: AsyncHead) -> BoxFuture<'static, Result<AsyncHead, Status>> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            head.metadata.insert("x-async", "yes").map_err(bad)?;
            Ok(head)
        })
    }
}

/// Records each hook (`before NAME` / `after NAME CODE`), re-routes `Old`
/// to `Echo`, and adds the call's time as a trailer to OK outcomes.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>);

impl Recorder {
    fn log(&self) -> Vec<String> {
        self.0.lock().expect("lock").clone()
    }
}

impl Interceptor for Recorder {
    fn timed(&self) -> bool {
        true
    }

    fn before(&self, call: &mut CallHead<'_>) -> Result<(), Status> {
        self.0.lock().expect("lock").push(format!("before {}", call.method().name));
        if call.method().name == "Old" {
            call.route_to("Echo")?;
        }
        Ok(())
    }

    fn after(&self, call: &mut CallEnd<'_>) {
        let code = match &call.outcome {
            Ok(_) => Code::Ok,
            Err(st) => st.code,
        };
        self.0.lock().expect("lock").push(format!("after {} {code:?}", call.method.name));
        let elapsed = call.elapsed().expect("a timed interceptor's calls are timed");
        if let Ok(trailers) = &mut *call.outcome {
            let _ = trailers.insert("x-elapsed-us", &elapsed.as_micros().to_string());
        }
    }
}

/// Adds credentials (unless the call says `no-auth`), refuses `Forbidden`
/// before anything is sent, records every status.
#[derive(Clone, Default)]
struct Creds(Arc<Mutex<Vec<String>>>);

impl ClientInterceptor for Creds {
    fn before(&self, call: &mut ClientHead<'_>) -> Result<(), Status> {
        if call.path.ends_with("/Forbidden") {
            return Err(Status::new(Code::PermissionDenied, "not from this client"));
        }
        if call.options.metadata.get("no-auth").is_none() {
            let md = &mut call.options.metadata;
            md.insert("authorization", "Bearer ok").map_err(bad)?;
        }
        Ok(())
    }

    fn after(&self, call: &ClientEnd<'_>) {
        let name = call.path.rsplit('/').next().unwrap_or_default();
        self.0.lock().expect("lock").push(format!("{name} {:?}", call.status.code));
    }
}

/// The server's chain: the recorder, the authenticator and, with
/// `async_step`, an asynchronous interceptor (a chain of synchronous ones
/// only takes the path without an async block per call).
async fn setup(async_step: bool) -> (Channel, Arc<Svc>, Recorder, Creds) {
    let src = [ProtoSource { name: "icpt.proto", text: PROTO }];
    let schema = Arc::new(Schema::from_proto_sources(&src, &["icpt.proto"]).expect("schema"));
    let svc = Arc::new(Svc { schema, calls: AtomicUsize::new(0) });
    let rec = Recorder::default();
    let mut chain = Chain::new().with(rec.clone()).with(Auth);
    if async_step {
        chain = chain.with_async(Remote);
    }
    let router =
        Arc::new(Router::new(ServerOptions::default()).add_service(chain.wrap(svc.clone())));
    let addr = serve_grpc(router).await;
    let creds = Creds::default();
    let ch = Channel::connect(&addr.to_string())
        .await
        .expect("connect")
        .intercept(ClientChain::new().with(creds.clone()));
    (ch, svc, rec, creds)
}

/// A call of `method` with an empty request: the response headers, the
/// number of responses, the trailers, or the status.
async fn call(
    ch: &Channel,
    method: &str,
    opts: CallOptions,
) -> Result<(Metadata, usize, Metadata), Status> {
    let mut c = ch.start(&format!("/icpt.test.Svc/{method}"), opts).await?;
    c.send_last(&[]).await?;
    let headers = c.headers().await?.clone();
    let mut n = 0;
    while c.recv().await?.is_some() {
        n += 1;
    }
    let st = c.finish_status().await;
    if st.code != Code::Ok {
        return Err(st);
    }
    Ok((headers, n, c.trailers().cloned().unwrap_or_default()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interceptors_see_change_and_reject_calls_on_both_sides() {
    exercise(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_synchronous_interceptors_does_the_same() {
    exercise(false).await;
}

async fn exercise(async_step: bool) {
    let (ch, svc, rec, creds) = setup(async_step).await;

    // Through every interceptor: the handler sees what they added, the
    // client the header and trailer they added.
    let (headers, n, trailers) =
        bounded(BOUND, "echo", call(&ch, "Echo", CallOptions::default())).await.expect("ok");
    assert_eq!(n, 1);
    assert_eq!(headers.get("x-served-by"), Some("interceptor"));
    assert_eq!(trailers.get("x-user-seen"), Some("alice"));
    assert_eq!(trailers.get("x-async-seen"), Some(if async_step { "yes" } else { "no" }));
    assert!(trailers.get("x-elapsed-us").is_some_and(|t| t.parse::<u64>().is_ok()), "{trailers:?}");

    // Rejected by the server's authenticator, details and all; the
    // handler never runs, and the recorder (before it) sees the outcome.
    let mut no_auth = CallOptions::default();
    no_auth.metadata.insert("no-auth", "1").expect("metadata");
    let before = svc.calls.load(Ordering::SeqCst);
    let st = bounded(BOUND, "rejected", call(&ch, "Echo", no_auth)).await.expect_err("rejected");
    assert_eq!(st.code, Code::Unauthenticated);
    assert_eq!(st.error_details().error_info.expect("ErrorInfo").reason, "BAD_TOKEN");
    assert_eq!(svc.calls.load(Ordering::SeqCst), before, "no handler ran");

    // Rejected by the client's interceptor: nothing is sent.
    let st = call(&ch, "Forbidden", CallOptions::default()).await.expect_err("refused");
    assert_eq!(st.code, Code::PermissionDenied);

    // Re-routed by an interceptor.
    let (_, n, trailers) = call(&ch, "Old", CallOptions::default()).await.expect("re-routed");
    assert_eq!((n, trailers.get("x-user-seen")), (1, Some("alice")));

    // Server streaming: the outcome comes after the last response.
    let (_, n, _) = call(&ch, "Three", CallOptions::default()).await.expect("stream");
    assert_eq!(n, 3);

    // A call the client drops: the server's interceptors see CANCELLED,
    // the client's see it too.
    // (Counted before the call starts: its handler may run at once.)
    let started = svc.calls.load(Ordering::SeqCst);
    let mut hang = ch.start("/icpt.test.Svc/Hang", CallOptions::default()).await.expect("start");
    hang.send_last(&[]).await.expect("send");
    eventually(BOUND, "the handler runs", || svc.calls.load(Ordering::SeqCst) == started + 1).await;
    drop(hang);
    eventually(BOUND, "the server sees the cancellation", || {
        rec.log().last().map(String::as_str) == Some("after Hang Cancelled")
    })
    .await;

    assert_eq!(
        rec.log(),
        [
            "before Echo",
            "after Echo Ok",
            "before Echo",
            "after Echo Unauthenticated",
            "before Old",
            "after Echo Ok",
            "before Three",
            "after Three Ok",
            "before Hang",
            "after Hang Cancelled",
        ]
    );
    assert_eq!(
        creds.0.lock().expect("lock").clone(),
        [
            "Echo Ok",
            "Echo Unauthenticated",
            // (Forbidden: refused by this interceptor's own `before`, so
            // its `after` does not run.)
            "Old Ok",
            "Three Ok",
            "Hang Cancelled"
        ]
    );
}
