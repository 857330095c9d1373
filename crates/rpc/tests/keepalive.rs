//! Keepalive (gRFC A8) and connection lifecycle (A9) over real sockets:
//! a client that pings more often than the server allows is sent away
//! with GOAWAY ENHANCE_YOUR_CALM; one within the policy is not; a client's
//! pings notice a server that went silent (no FIN, no RST) and end its
//! calls UNAVAILABLE long before their deadline; a server's maximum
//! connection age moves a busy client to new connections without failing
//! a call; its maximum idle time closes an unused connection, and the
//! channel dials again when needed; the age's grace cuts off a call that
//! outlives it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protoplane_grpc::{
    BoxFuture, Code, Metadata, Request, Responder, Schema, Service, Status, Streaming,
};
use protoplane_rpc::{
    CallOptions, Channel, ChannelOptions, ClientKeepalive, Router, ServerKeepalive, ServerOptions,
};
use protoplane_schema::ProtoSource;
use protoplane_test_support::net::bounded;

const BOUND: Duration = Duration::from_secs(10);

const PROTO: &str = r#"
syntax = "proto3";
package ka.test;
message Msg { bytes data = 1; }
service Svc {
  rpc Echo(Msg) returns (Msg);
  rpc Hang(Msg) returns (Msg);
}
"#;

struct Svc(Arc<Schema>);

impl Service for Svc {
    fn schema(&self) -> &Arc<Schema> {
        &self.0
    }

    fn name(&self) -> &str {
        "ka.test.Svc"
    }

    fn call(
        self: Arc<Self>,
        method: u32,
        mut req: Request<Streaming>,
        mut out: Responder,
    ) -> BoxFuture<'static, Result<Metadata, Status>> {
        Box::pin(async move {
            let m = req.message.single().await?;
            if self.0.method(method).is_some_and(|m| m.name == "Hang") {
                std::future::pending::<()>().await;
            }
            out.send_encoded(m.wire().clone()).await?;
            Ok(Metadata::new())
        })
    }
}

/// A server with `keepalive` on a loopback port, counting the
/// connections it accepts.
async fn server(keepalive: ServerKeepalive) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let src = [ProtoSource { name: "ka.proto", text: PROTO }];
    let schema = Arc::new(Schema::from_proto_sources(&src, &["ka.proto"]).expect("schema"));
    let opts = ServerOptions { keepalive, ..ServerOptions::default() };
    let router = Arc::new(Router::new(opts).add_service(Arc::new(Svc(schema))));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let n = accepted.clone();
    tokio::spawn(async move {
        while let Ok((sock, peer)) = listener.accept().await {
            n.fetch_add(1, Ordering::SeqCst);
            let _ = sock.set_nodelay(true);
            tokio::spawn(router.clone().serve_connection(sock, peer));
        }
    });
    (addr, accepted)
}

async fn channel(addr: impl std::fmt::Display, keepalive: Option<ClientKeepalive>) -> Channel {
    let opts = ChannelOptions { keepalive, ..ChannelOptions::default() };
    bounded(BOUND, "connect", Channel::connect_with(&addr.to_string(), opts))
        .await
        .expect("connect")
}

/// One call; its status.
async fn call(ch: &Channel, method: &str, opts: CallOptions) -> Status {
    let mut c = match ch.start(&format!("/ka.test.Svc/{method}"), opts).await {
        Ok(c) => c,
        Err(st) => return st,
    };
    if let Err(st) = c.send_last(&[0x0a, 1, 7]).await {
        return st;
    }
    c.finish_status().await
}

fn client_keepalive(time_ms: u64, timeout_ms: u64) -> Option<ClientKeepalive> {
    Some(ClientKeepalive {
        time: Duration::from_millis(time_ms),
        timeout: Duration::from_millis(timeout_ms),
        permit_without_stream: false,
    })
}

#[tokio::test]
async fn a_client_that_pings_too_often_is_sent_away() {
    let (addr, _) =
        server(ServerKeepalive { min_time: Duration::from_secs(1), ..ServerKeepalive::default() })
            .await;
    let ch = channel(addr, client_keepalive(20, 1000)).await;
    let t = Instant::now();
    let st = bounded(BOUND, "the hanging call", call(&ch, "Hang", CallOptions::default())).await;
    assert_eq!(st.code, Code::Unavailable, "{st:?}");
    assert!(st.message.contains("ENHANCE_YOUR_CALM"), "{st:?}");
    // Three strikes after the first ping, 20 ms apart (each answered at
    // once), with slack for a loaded machine.
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[tokio::test]
async fn pings_within_the_policy_keep_a_quiet_call_alive() {
    let (addr, accepted) = server(ServerKeepalive {
        min_time: Duration::from_millis(50),
        ..ServerKeepalive::default()
    })
    .await;
    let ch = channel(addr, client_keepalive(100, 1000)).await;
    // About ten pings while the call waits for its deadline.
    let opts = CallOptions::default().with_timeout(Duration::from_millis(1200));
    let st = bounded(BOUND, "the hanging call", call(&ch, "Hang", opts)).await;
    assert_eq!(st.code, Code::DeadlineExceeded, "{st:?}");
    assert_eq!(call(&ch, "Echo", CallOptions::default()).await.code, Code::Ok);
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "the connection was kept");
}

/// A TCP relay to `to` that, once `silent` is set, forwards nothing more
/// either way and closes nothing: a peer (or path) that died without a
/// FIN or RST.
async fn relay(to: std::net::SocketAddr, silent: Arc<AtomicBool>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(to).await.expect("connect");
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            for (mut r, mut w) in [(cr, sw), (sr, cw)].map(|(r, w)| (r, w)) {
                let silent = silent.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = vec![0u8; 16 << 10];
                    let mut held = Vec::new();
                    loop {
                        let n = match r.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if silent.load(Ordering::SeqCst) {
                            // Swallowed (and kept, so nothing closes).
                            held.push(buf[..n].to_vec());
                            continue;
                        }
                        if w.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    std::future::pending::<()>().await;
                    drop(held);
                });
            }
        }
    });
    addr
}

#[tokio::test]
async fn client_pings_notice_a_server_gone_silent() {
    let (addr, _) = server(ServerKeepalive {
        min_time: Duration::from_millis(10),
        ..ServerKeepalive::default()
    })
    .await;
    let silent = Arc::new(AtomicBool::new(false));
    let via = relay(addr, silent.clone()).await;
    let ch = channel(via, client_keepalive(100, 300)).await;
    assert_eq!(call(&ch, "Echo", CallOptions::default()).await.code, Code::Ok);
    silent.store(true, Ordering::SeqCst);
    let t = Instant::now();
    let opts = CallOptions::default().with_timeout(Duration::from_secs(8));
    let st = bounded(BOUND, "the call on a silent path", call(&ch, "Hang", opts)).await;
    assert_eq!(st.code, Code::Unavailable, "{st:?}");
    assert!(st.message.contains("keepalive"), "{st:?}");
    // time + timeout is 0.4 s; the deadline was 8 s.
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());

    // Without keepalive the same call waits for its deadline.
    silent.store(false, Ordering::SeqCst);
    let via = relay(addr, silent.clone()).await;
    let ch = channel(via, None).await;
    assert_eq!(call(&ch, "Echo", CallOptions::default()).await.code, Code::Ok);
    silent.store(true, Ordering::SeqCst);
    let opts = CallOptions::default().with_timeout(Duration::from_millis(1500));
    let st = bounded(BOUND, "the call without keepalive", call(&ch, "Hang", opts)).await;
    assert_eq!(st.code, Code::DeadlineExceeded, "{st:?}");
}

#[tokio::test]
async fn max_connection_age_moves_a_busy_client_without_failing_a_call() {
    let (addr, accepted) = server(ServerKeepalive {
        max_connection_age: Some(Duration::from_millis(150)),
        ..ServerKeepalive::default()
    })
    .await;
    let ch = channel(addr, None).await;
    let t = Instant::now();
    let (mut ok, mut failed) = (0, Vec::new());
    while t.elapsed() < Duration::from_millis(1200) {
        let st = bounded(BOUND, "echo", call(&ch, "Echo", CallOptions::default())).await;
        match st.code {
            Code::Ok => ok += 1,
            _ => failed.push(st),
        }
    }
    assert!(failed.is_empty(), "{} ok, failed: {failed:?}", ok);
    let n = accepted.load(Ordering::SeqCst);
    assert!(n >= 4, "{n} connections in 1.2 s with an age of 150 ms ± 10%");
}

#[tokio::test]
async fn max_connection_idle_closes_an_unused_connection() {
    let (addr, accepted) = server(ServerKeepalive {
        max_connection_idle: Some(Duration::from_millis(100)),
        ..ServerKeepalive::default()
    })
    .await;
    let ch = channel(addr, None).await;
    // Busy for longer than the idle time: kept.
    for _ in 0..20 {
        assert_eq!(call(&ch, "Echo", CallOptions::default()).await.code, Code::Ok);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    // Idle: the server says GOAWAY, the channel notices.
    protoplane_test_support::net::eventually(BOUND, "the channel sees the GOAWAY", || {
        !ch.takes_calls()
    })
    .await;
    assert_eq!(call(&ch, "Echo", CallOptions::default()).await.code, Code::Ok);
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "one new connection for the next call");
}

#[tokio::test]
async fn the_age_grace_cuts_off_a_call_that_outlives_it() {
    let (addr, _) = server(ServerKeepalive {
        max_connection_age: Some(Duration::from_millis(100)),
        max_connection_age_grace: Some(Duration::from_millis(200)),
        ..ServerKeepalive::default()
    })
    .await;
    let ch = channel(addr, None).await;
    let t = Instant::now();
    let st = bounded(BOUND, "the hanging call", call(&ch, "Hang", CallOptions::default())).await;
    assert_eq!(st.code, Code::Unavailable, "{st:?}");
    let e = t.elapsed();
    assert!(e >= Duration::from_millis(250) && e < Duration::from_secs(5), "{e:?}");
}

#[tokio::test]
async fn a_channel_sent_away_for_pinging_pings_half_as_often() {
    // Pings closer than 400 ms are strikes; the client starts at 50 ms
    // and may ping with no call open.
    let (addr, accepted) = server(ServerKeepalive {
        min_time: Duration::from_millis(400),
        permit_without_stream: true,
        ..ServerKeepalive::default()
    })
    .await;
    let ka = ClientKeepalive {
        time: Duration::from_millis(50),
        timeout: Duration::from_secs(1),
        permit_without_stream: true,
    };
    let ch = channel(addr, Some(ka)).await;
    // A call, then quiet: the pings go on alone. At 50 ms the fourth ping
    // (~200 ms) is the third strike, at 100 ms (~400 ms) too; at 200 ms
    // the third strike would come after 600 ms, past the next call, which
    // forgives them. Without the doubling every round would need a new
    // connection.
    for round in 0..6 {
        let st = bounded(BOUND, "echo", call(&ch, "Echo", CallOptions::default())).await;
        assert_eq!(st.code, Code::Ok, "round {round}: {st:?}");
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let n = accepted.load(Ordering::SeqCst);
    assert!((2..=4).contains(&n), "{n} connections in 6 rounds");
}

#[tokio::test]
async fn zero_keepalive_settings_neither_spin_nor_break_calls() {
    let (addr, _) = server(ServerKeepalive {
        time: Duration::ZERO,
        timeout: Duration::ZERO,
        min_time: Duration::ZERO,
        permit_without_stream: true,
        ..ServerKeepalive::default()
    })
    .await;
    let ka = ClientKeepalive {
        time: Duration::ZERO,
        timeout: Duration::ZERO,
        permit_without_stream: true,
    };
    let ch = channel(addr, Some(ka)).await;
    // Timers that did not move forward would hang the tasks (and this
    // test, on a single-threaded runtime) before any answer.
    let st = bounded(BOUND, "echo", call(&ch, "Echo", CallOptions::default())).await;
    assert!(matches!(st.code, Code::Ok | Code::Unavailable), "{st:?}");
}
