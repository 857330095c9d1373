//! A channel that behaves (gRPC's connection backoff, wait_for_ready,
//! deadlines propagated from a handler to the calls it makes), over real
//! sockets: a server that is down makes calls fail fast while the channel
//! backs off, a call that waits for readiness gets through once a server
//! comes up, and a server restarted ten times under load fails none of the
//! calls made with wait_for_ready.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::{
    Backoff, CallOptions, Channel, ChannelOptions, Connectivity, Router, ServerOptions,
};
use protoplane_schema::ProtoSource;
use protoplane_test_support::net::{bounded, eventually};
use protoplane_wire::Builder;

const BOUND: Duration = Duration::from_secs(20);
const ECHO: &str = "/channel.test.Echo/Echo";
const RELAY: &str = "/channel.test.Echo/Relay";

const PROTO: &str = r#"
syntax = "proto3";
package channel.test;
message Empty {}
service Echo {
  rpc Echo(Empty) returns (Empty);
  rpc Relay(Empty) returns (Empty);
}
"#;

fn schema() -> Arc<Schema> {
    let src = [ProtoSource { name: "channel.proto", text: PROTO }];
    Arc::new(Schema::from_proto_sources(&src, &["channel.proto"]).expect("schema"))
}

/// `Echo` answers at once (after `delay`); `Relay` calls `Echo` on
/// `next` with no timeout of its own and answers with that call's status.
struct Svc {
    schema: Arc<Schema>,
    served: AtomicUsize,
    delay: Duration,
    next: Option<Channel>,
    /// The deadline each `Echo` call arrived with.
    deadlines: Mutex<Vec<Option<Instant>>>,
}

impl Svc {
    fn new(delay: Duration, next: Option<Channel>) -> Arc<Svc> {
        Arc::new(Svc {
            schema: schema(),
            served: AtomicUsize::new(0),
            delay,
            next,
            deadlines: Mutex::new(Vec::new()),
        })
    }
}

impl Service for Svc {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "channel.test.Echo"
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            req.message.single().await?;
            let relay = self.schema.method(method).is_some_and(|m| m.name == "Relay");
            if relay {
                let ch = self.next.clone().ok_or(Status::new(Code::Internal, "no next hop"))?;
                call(&ch, ECHO, CallOptions::default()).await?;
            } else {
                self.deadlines.lock().expect("lock").push(req.deadline);
                if !self.delay.is_zero() {
                    tokio::time::sleep(self.delay).await;
                }
            }
            self.served.fetch_add(1, Ordering::SeqCst);
            let b = Builder::new(self.schema.tables(), out.output_type())?;
            out.send(b.finish()).await?;
            Ok(Metadata::new())
        })
    }
}

/// One unary call of `path` with an empty request: its status.
async fn call(ch: &Channel, path: &str, opts: CallOptions) -> Result<(), Status> {
    let mut c = ch.start(path, opts).await?;
    c.send_last(&[]).await?;
    while c.recv().await?.is_some() {}
    let st = c.finish_status().await;
    if st.code == Code::Ok {
        Ok(())
    } else {
        Err(st)
    }
}

/// A loopback address nothing listens on (bound, then released).
fn free_addr() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

/// Serves `svc` on `addr` until the router drains.
async fn serve_on(addr: std::net::SocketAddr, svc: Arc<Svc>) -> Arc<Router> {
    let router = Arc::new(Router::new(ServerOptions::default()).add_service(svc));
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind the address again");
    tokio::spawn({
        let r = router.clone();
        async move { r.serve(listener).await }
    });
    router
}

fn quick_backoff() -> ChannelOptions {
    ChannelOptions {
        backoff: Backoff { initial: Duration::from_millis(300), ..Backoff::default() },
        ..ChannelOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_fail_fast_while_backing_off_and_wait_for_ready_gets_through() {
    let addr = free_addr();
    let ch = Channel::lazy(&addr.to_string(), quick_backoff());
    assert_eq!(ch.connectivity(), Connectivity::Idle, "a lazy channel dials at its first call");

    // Nothing listens: the first call's attempt is refused.
    let first = bounded(BOUND, "the first call", call(&ch, ECHO, CallOptions::default())).await;
    assert_eq!(first.expect_err("refused").code, Code::Unavailable);
    assert_eq!(ch.connectivity(), Connectivity::TransientFailure);

    // Backing off: the next call fails at once, naming the last error.
    let t = Instant::now();
    let fast = call(&ch, ECHO, CallOptions::default()).await.expect_err("backing off");
    assert!(t.elapsed() < Duration::from_millis(250), "failed fast: {:?}", t.elapsed());
    assert_eq!(fast.code, Code::Unavailable);
    assert!(fast.message.contains("failed attempts"), "{}", fast.message);

    // A call that waits for readiness gets through once a server is up.
    let waiting = tokio::spawn({
        let ch = ch.clone();
        async move {
            let opts = CallOptions::default().with_timeout(BOUND).wait_for_ready();
            call(&ch, ECHO, opts).await
        }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!waiting.is_finished(), "it waits while nothing listens");
    let svc = Svc::new(Duration::ZERO, None);
    let _router = serve_on(addr, svc.clone()).await;
    let got = bounded(BOUND, "the waiting call", waiting).await.expect("task");
    assert!(got.is_ok(), "{got:?}");
    assert_eq!(ch.connectivity(), Connectivity::Ready);
    assert_eq!(svc.served.load(Ordering::SeqCst), 1);
    // Connected again: calls go straight through.
    call(&ch, ECHO, CallOptions::default()).await.expect("a call on the ready channel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_ready_ends_at_the_deadline() {
    let addr = free_addr();
    let ch = Channel::lazy(&addr.to_string(), quick_backoff());
    let t = Instant::now();
    let opts = CallOptions::default().with_timeout(Duration::from_millis(400)).wait_for_ready();
    let st = bounded(BOUND, "the call", call(&ch, ECHO, opts)).await.expect_err("no server");
    assert_eq!(st.code, Code::DeadlineExceeded, "{st:?}");
    assert!(t.elapsed() >= Duration::from_millis(400), "{:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_s_deadline_bounds_the_calls_it_makes() {
    // The far server answers Echo after 5 s; the near one relays to it.
    let far = Svc::new(Duration::from_secs(5), None);
    let far_addr = free_addr();
    let _far = serve_on(far_addr, far.clone()).await;
    let next = Channel::connect(&far_addr.to_string()).await.expect("connect far");
    let near = Svc::new(Duration::ZERO, Some(next));
    let near_addr = free_addr();
    let _near = serve_on(near_addr, near.clone()).await;

    let ch = Channel::connect(&near_addr.to_string()).await.expect("connect near");
    let t = Instant::now();
    let opts = CallOptions::default().with_timeout(Duration::from_millis(500));
    let st = bounded(BOUND, "the relayed call", call(&ch, RELAY, opts)).await.expect_err("slow");
    assert_eq!(st.code, Code::DeadlineExceeded, "{st:?}");
    assert!(t.elapsed() < Duration::from_secs(3), "the inner call did not wait 5 s");
    // The far server was told the deadline (grpc-timeout) although the
    // relay set no timeout of its own.
    eventually(BOUND, "the far server saw the call", || {
        !far.deadlines.lock().expect("lock").is_empty()
    })
    .await;
    let seen = far.deadlines.lock().expect("lock")[0].expect("a deadline was propagated");
    assert!(seen <= t + Duration::from_millis(600), "at most the caller's 500 ms");
}

/// The target of the channel work: a server restarted ten times under load
/// (each restart a graceful drain and a new server on the same address)
/// fails no call made with wait_for_ready. Prints the counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_restarts_under_load_fail_no_call() {
    let addr = free_addr();
    let mut router = serve_on(addr, Svc::new(Duration::ZERO, None)).await;
    let ch = Channel::connect_with(&addr.to_string(), quick_backoff()).await.expect("connect");
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..16 {
        let (ch, ok, failed, stopping) = (ch.clone(), ok.clone(), failed.clone(), stopping.clone());
        load.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            while !stopping.load(Ordering::SeqCst) {
                let opts = CallOptions::default().with_timeout(BOUND).wait_for_ready();
                match call(&ch, ECHO, opts).await {
                    Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(st) => {
                        errors.push(st);
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
            errors
        }));
    }
    for _ in 0..10 {
        let before = ok.load(Ordering::Relaxed);
        eventually(BOUND, "calls complete", || ok.load(Ordering::Relaxed) > before + 100).await;
        router.drain().start();
        bounded(BOUND, "the old server drains", router.drain().finished()).await;
        // Down for a moment: calls wait for readiness meanwhile.
        tokio::time::sleep(Duration::from_millis(20)).await;
        router = serve_on(addr, Svc::new(Duration::ZERO, None)).await;
    }
    let before = ok.load(Ordering::Relaxed);
    eventually(BOUND, "calls complete after the last restart", || {
        ok.load(Ordering::Relaxed) > before + 100
    })
    .await;
    stopping.store(true, Ordering::SeqCst);
    let mut errors = Vec::new();
    for l in load {
        errors.extend(bounded(BOUND, "a load task", l).await.expect("task"));
    }
    let (ok, failed) = (ok.load(Ordering::SeqCst), failed.load(Ordering::SeqCst));
    println!("10 restarts under 16 calls in flight: {ok} calls ok, {failed} failed");
    assert_eq!(failed, 0, "failed calls: {:?}", &errors[..errors.len().min(5)]);
}
