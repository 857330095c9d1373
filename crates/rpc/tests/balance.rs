//! Many backends behind one channel, over real sockets: target names
//! resolved (`ipv4:` lists, `dns:///localhost`, `unix:`, a resolver set
//! from code), round robin spreading calls evenly and losing none when a
//! backend drains or its address is withdrawn, pick first staying on the
//! first address that connects and moving on when it goes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::resolve::{Address, ManualResolver};
use protoplane_rpc::{
    Backoff, CallOptions, Channel, ChannelOptions, Connectivity, LbPolicy, Router, ServerOptions,
};
use protoplane_schema::ProtoSource;
use protoplane_test_support::net::{bounded, eventually};
use protoplane_wire::Builder;

const BOUND: Duration = Duration::from_secs(20);
const ECHO: &str = "/balance.test.Echo/Echo";

const PROTO: &str = r#"
syntax = "proto3";
package balance.test;
message Empty {}
service Echo { rpc Echo(Empty) returns (Empty); }
"#;

/// Counts the calls it answers.
struct Backend {
    schema: Arc<Schema>,
    served: AtomicUsize,
}

impl Service for Backend {
    fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    fn name(&self) -> &str {
        "balance.test.Echo"
    }

    fn call(
        self: Arc<Self>,
        _method: u32,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            req.message.single().await?;
            self.served.fetch_add(1, Ordering::SeqCst);
            let b = Builder::new(self.schema.tables(), out.output_type())?;
            out.send(b.finish()).await?;
            Ok(Metadata::new())
        })
    }
}

struct Server {
    addr: SocketAddr,
    router: Arc<Router>,
    backend: Arc<Backend>,
}

impl Server {
    fn served(&self) -> usize {
        self.backend.served.load(Ordering::SeqCst)
    }
}

fn backend() -> Arc<Backend> {
    let src = [ProtoSource { name: "balance.proto", text: PROTO }];
    let schema = Arc::new(Schema::from_proto_sources(&src, &["balance.proto"]).expect("schema"));
    Arc::new(Backend { schema, served: AtomicUsize::new(0) })
}

async fn serve_at(addr: SocketAddr) -> Server {
    let backend = backend();
    let router = Arc::new(Router::new(ServerOptions::default()).add_service(backend.clone()));
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn({
        let r = router.clone();
        async move { r.serve(listener).await }
    });
    Server { addr, router, backend }
}

async fn servers(n: usize) -> Vec<Server> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(serve_at("127.0.0.1:0".parse().expect("addr")).await);
    }
    v
}

fn ipv4(servers: &[Server]) -> String {
    let list: Vec<String> = servers.iter().map(|s| s.addr.to_string()).collect();
    format!("ipv4:{}", list.join(","))
}

fn opts(lb: LbPolicy) -> ChannelOptions {
    ChannelOptions {
        lb,
        backoff: Backoff { initial: Duration::from_millis(100), ..Backoff::default() },
        ..ChannelOptions::default()
    }
}

async fn echo(ch: &Channel, opts: CallOptions) -> Result<(), Status> {
    let mut c = ch.start(ECHO, opts).await?;
    c.send_last(&[]).await?;
    while c.recv().await?.is_some() {}
    let st = c.finish_status().await;
    if st.code == Code::Ok {
        Ok(())
    } else {
        Err(st)
    }
}

/// Calls until every server in `servers` has answered one: each address
/// has a ready connection.
async fn until_all_served(ch: &Channel, servers: &[Server]) {
    bounded(BOUND, "every backend answers", async {
        while servers.iter().any(|s| s.served() == 0) {
            echo(ch, CallOptions::default()).await.expect("call");
        }
    })
    .await;
}

fn counts(servers: &[Server]) -> Vec<usize> {
    servers.iter().map(Server::served).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_gives_each_backend_its_share() {
    let s = servers(4).await;
    let ch = Channel::connect_with(&ipv4(&s), opts(LbPolicy::RoundRobin)).await.expect("connect");
    until_all_served(&ch, &s).await;
    let before = counts(&s);
    // Sequential and concurrent calls alike: a rotation per pick.
    for _ in 0..400 {
        echo(&ch, CallOptions::default()).await.expect("call");
    }
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let ch = ch.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..100 {
                echo(&ch, CallOptions::default()).await.expect("call");
            }
        }));
    }
    for t in tasks {
        bounded(BOUND, "the concurrent calls", t).await.expect("task");
    }
    let got: Vec<usize> = counts(&s).iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(got.iter().sum::<usize>(), 1200);
    assert!(got.iter().all(|&n| n == 300), "each backend a quarter: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pick_first_stays_on_the_first_address_that_connects() {
    let s = servers(2).await;
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    // The first address refuses; the second takes every call.
    let target = format!("ipv4:{down},{},{}", s[0].addr, s[1].addr);
    let ch = Channel::connect_with(&target, opts(LbPolicy::PickFirst)).await.expect("connect");
    for _ in 0..50 {
        echo(&ch, CallOptions::default()).await.expect("call");
    }
    assert_eq!(counts(&s), vec![50, 0], "the first address that connected takes all");

    // It goes away: the next calls move to the next address, none fails.
    s[0].router.drain().start();
    // (A call that leaves before the GOAWAY arrives is still served
    // there, as HTTP/2's graceful shutdown says.)
    eventually(BOUND, "the channel sees GOAWAY", || !ch.takes_calls()).await;
    for _ in 0..50 {
        echo(&ch, CallOptions::default()).await.expect("a call after the drain");
    }
    assert_eq!(counts(&s), vec![50, 50]);
    assert_eq!(ch.connectivity(), Connectivity::Ready);
}

/// Calls from 16 tasks until told to stop; the failures they saw.
fn load(
    ch: &Channel,
    stop: &Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<Status>>> {
    (0..16)
        .map(|_| {
            let (ch, stop) = (ch.clone(), stop.clone());
            tokio::spawn(async move {
                let mut failed = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    if let Err(st) = echo(&ch, CallOptions::default()).await {
                        failed.push(st);
                    }
                }
                failed
            })
        })
        .collect()
}

async fn failures(tasks: Vec<tokio::task::JoinHandle<Vec<Status>>>) -> Vec<Status> {
    let mut all = Vec::new();
    for t in tasks {
        all.extend(bounded(BOUND, "the load stops", t).await.expect("task"));
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_draining_under_load_fails_no_call() {
    let s = servers(4).await;
    let ch = Channel::connect_with(&ipv4(&s), opts(LbPolicy::RoundRobin)).await.expect("connect");
    until_all_served(&ch, &s).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks = load(&ch, &stop);
    eventually(BOUND, "load reaches every backend", || s.iter().all(|b| b.served() > 200)).await;
    s[1].router.drain().start();
    bounded(BOUND, "the drained backend's connection closes", s[1].router.drain().finished()).await;
    let after_drain = s[1].served();
    let others: Vec<usize> = counts(&s);
    eventually(BOUND, "the others keep serving", || {
        [0, 2, 3].iter().all(|&i| s[i].served() > others[i] + 200)
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let failed = failures(tasks).await;
    assert!(
        failed.is_empty(),
        "{} failed calls: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    assert_eq!(s[1].served(), after_drain, "no call reached the drained backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_withdrawn_and_added_by_the_resolver_take_effect_under_load() {
    let s = servers(3).await;
    let resolver = ManualResolver::new([Address::Tcp(s[0].addr), Address::Tcp(s[1].addr)]);
    let options =
        ChannelOptions { resolver: Some(Arc::new(resolver.clone())), ..opts(LbPolicy::RoundRobin) };
    let ch = Channel::connect_with("echo.test", options).await.expect("connect");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks = load(&ch, &stop);
    eventually(BOUND, "load on both", || s[0].served() > 100 && s[1].served() > 100).await;
    assert_eq!(s[2].served(), 0, "not in the list yet");

    // Added: it takes calls. Withdrawn: it takes none from then on.
    resolver.set(vec![Address::Tcp(s[1].addr), Address::Tcp(s[2].addr)]);
    eventually(BOUND, "the added backend serves", || s[2].served() > 100).await;
    // Calls picked before the update may still be finishing there.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let withdrawn = s[0].served();
    let (b1, b2) = (s[1].served(), s[2].served());
    eventually(BOUND, "the remaining two keep serving", || {
        s[1].served() > b1 + 200 && s[2].served() > b2 + 200
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let failed = failures(tasks).await;
    assert!(
        failed.is_empty(),
        "{} failed calls: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    assert_eq!(s[0].served(), withdrawn, "the withdrawn backend got no new call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_resolution_fails_fast_and_wait_for_ready_waits_for_an_address() {
    let s = servers(1).await;
    let resolver = ManualResolver::new([]);
    let options =
        ChannelOptions { resolver: Some(Arc::new(resolver.clone())), ..opts(LbPolicy::RoundRobin) };
    let ch = Channel::lazy("echo.test", options);
    let st = bounded(BOUND, "a call with no address", echo(&ch, CallOptions::default()))
        .await
        .expect_err("no address");
    assert_eq!(st.code, Code::Unavailable);
    assert!(st.message.contains("no address"), "{}", st.message);
    let waiting = tokio::spawn({
        let ch = ch.clone();
        async move { echo(&ch, CallOptions::default().wait_for_ready()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "it waits for an address");
    resolver.set(vec![Address::Tcp(s[0].addr)]);
    let got = bounded(BOUND, "the waiting call", waiting).await.expect("task");
    assert!(got.is_ok(), "{got:?}");
    assert_eq!(s[0].served(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_and_unix_targets_connect() {
    let s = servers(1).await;
    let ch = Channel::connect(&format!("dns:///localhost:{}", s[0].addr.port()))
        .await
        .expect("dns target");
    echo(&ch, CallOptions::default()).await.expect("over dns");

    let dir = std::env::temp_dir().join(format!("pp-balance-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("echo.sock");
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).expect("bind unix");
    let b = backend();
    let router = Arc::new(Router::new(ServerOptions::default()).add_service(b.clone()));
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let peer = Arc::new(protoplane_grpc::Peer { addr: None, certificates: Vec::new() });
            tokio::spawn(router.clone().serve_peer(sock, peer));
        }
    });
    let ch = Channel::connect(&format!("unix://{}", path.display())).await.expect("unix target");
    echo(&ch, CallOptions::default()).await.expect("over a Unix socket");
    assert_eq!(b.served.load(Ordering::SeqCst), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn bad_targets_are_refused_with_the_reason() {
    let err = Channel::connect("ipv4:10.0.0.1:x").await.expect_err("bad port");
    assert_eq!(err.code, Code::InvalidArgument);
    let ch = Channel::lazy("nosuch:///svc", ChannelOptions::default());
    let err = echo(&ch, CallOptions::default()).await.expect_err("no resolver");
    assert_eq!(err.code, Code::InvalidArgument, "{err:?}");
    assert!(err.message.contains("no resolver for the scheme"), "{}", err.message);
    assert!("ring_hash".parse::<LbPolicy>().is_err());
}
