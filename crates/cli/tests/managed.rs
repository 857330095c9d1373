//! The engine as a managed service, across real processes: `protoplane
//! engine` with the interop service in an attached `protoplane
//! interop-server --attach` process and protoplane's gRPC client over
//! HTTP/2.
//!
//! * policy from `--config`: a rule denies by method and metadata, a rate
//!   limit and a concurrency limit refuse with RESOURCE_EXHAUSTED and
//!   RetryInfo; SIGHUP installs a changed policy while a stream stays open
//!   and is answered; an invalid file sent through the admin socket
//!   changes nothing;
//! * live upgrade: a take-over abandoned before it is ready changes
//!   nothing; a second engine started with `--take-over` under load takes
//!   the listener and the application over; no call fails, the old engine
//!   exits 0 and the application keeps running.
//! * graceful stop of a monolithic server: SIGTERM to `protoplane serve`
//!   under 64 calls in flight turns health NOT_SERVING, refuses new
//!   connections, fails none of the calls already started, and the
//!   process exits 0 once they are answered.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{app, rt, sock_path, Proc, BIN};
use protoplane_grpc::rich::ErrorDetail;
use protoplane_grpc::{Code, Metadata, Status};
use protoplane_rpc::{CallOptions, Channel, ClientCall};

const SERVICE: &str = "/grpc.testing.TestService/";

/// One unary call of `method` with an empty request and `metadata`: its
/// status.
async fn unary(ch: &Channel, method: &str, metadata: Metadata) -> Status {
    let opts =
        CallOptions { metadata, timeout: Some(Duration::from_secs(10)), ..Default::default() };
    let mut call = match ch.start(&format!("{SERVICE}{method}"), opts).await {
        Ok(c) => c,
        Err(st) => return st,
    };
    if let Err(st) = call.send(&[]).await {
        return st;
    }
    call.close_send();
    loop {
        match call.recv().await {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(st) => return st,
        }
    }
    call.finish_status().await
}

fn tenant(who: &str) -> Metadata {
    let mut md = Metadata::new();
    md.insert("x-tenant", who).expect("metadata");
    md
}

/// StreamingOutputCallRequest { response_parameters: [{ size: 1 }] }.
const ONE: [u8; 4] = [0x12, 0x02, 0x08, 0x01];

/// A FullDuplexCall sends one message and reads its answer.
async fn ping(call: &mut ClientCall) -> Result<(), Status> {
    call.send(&ONE).await?;
    match tokio::time::timeout(Duration::from_secs(10), call.recv()).await {
        Ok(Ok(Some(_))) => Ok(()),
        Ok(Ok(None)) => Err(call.finish_status().await),
        Ok(Err(st)) => Err(st),
        Err(_) => Err(Status::new(Code::DeadlineExceeded, "no answer")),
    }
}

fn retry_delay(st: &Status) -> Option<Duration> {
    st.error_details_vec().into_iter().find_map(|d| match d {
        ErrorDetail::RetryInfo(r) => r.retry_delay,
        _ => None,
    })
}

fn engine_with(args: &[&str]) -> (Proc, String) {
    let mut all = vec!["engine", "--grpc-port", "0"];
    all.extend_from_slice(args);
    let e = Proc::start(&all);
    let line = e.wait_for("grpc listening on");
    (e, line.rsplit(' ').next().unwrap_or_default().to_string())
}

#[test]
fn policy_denies_limits_and_reloads_without_dropping_a_call() {
    let sock = sock_path("policy");
    let dir = std::path::Path::new(&sock).parent().expect("dir").to_path_buf();
    let config = dir.join("engine.toml");
    let admin = dir.join("admin.sock");
    std::fs::write(
        &config,
        r#"
[[policy.rules]]
action = "deny"
methods = ["/grpc.testing.TestService/UnaryCall"]
clients = ["metadata:x-tenant=guest"]

[policy.limits."/grpc.testing.TestService/EmptyCall"]
rate = 0.5
burst = 2

[policy.limits."/grpc.testing.TestService/FullDuplexCall"]
concurrency = 1
"#,
    )
    .expect("config");
    let (engine, addr) = engine_with(&[
        "--attach",
        &sock,
        "--config",
        config.to_str().expect("path"),
        "--admin",
        admin.to_str().expect("path"),
    ]);
    let _app = app(&sock);
    engine.wait_for("attached for grpc.testing.TestService");
    let rt = rt();
    let mut held = rt.block_on(async {
        let ch = Channel::connect(&addr).await.expect("connect");
        // A rate of one call per 2 s with a burst of 2.
        for i in 0..2 {
            assert_eq!(unary(&ch, "EmptyCall", Metadata::new()).await.code, Code::Ok, "call {i}");
        }
        let st = unary(&ch, "EmptyCall", Metadata::new()).await;
        assert_eq!(st.code, Code::ResourceExhausted, "{st:?}");
        let wait = retry_delay(&st).expect("a RetryInfo detail");
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(2), "{wait:?}");
        // Denied by method and metadata, allowed otherwise.
        let st = unary(&ch, "UnaryCall", tenant("guest")).await;
        assert_eq!(st.code, Code::PermissionDenied, "{st:?}");
        assert!(st.message.contains("rule 0"), "{st:?}");
        assert_eq!(unary(&ch, "UnaryCall", tenant("staff")).await.code, Code::Ok);
        // One stream at a time.
        let mut a = ch.start(&format!("{SERVICE}FullDuplexCall"), CallOptions::default()).await;
        let a_call = a.as_mut().expect("start");
        ping(a_call).await.expect("the first stream is answered");
        let mut b = ch
            .start(&format!("{SERVICE}FullDuplexCall"), CallOptions::default())
            .await
            .expect("start");
        let st = ping(&mut b).await.expect_err("a second stream is over the limit");
        assert_eq!(st.code, Code::ResourceExhausted, "{st:?}");
        assert!(retry_delay(&st).is_some(), "{st:?}");
        a.expect("stream")
    });

    // A new policy, installed by SIGHUP while the stream is open.
    std::fs::write(
        &config,
        r#"
[[policy.rules]]
action = "deny"
methods = ["/grpc.testing.TestService/EmptyCall"]

[policy.limits."/grpc.testing.TestService/FullDuplexCall"]
concurrency = 2
"#,
    )
    .expect("config");
    let pid = engine.child.id().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().expect("kill").success());
    engine.wait_for("SIGHUP: reloaded");
    rt.block_on(async {
        ping(&mut held).await.expect("the open stream is answered after the reload");
        let ch = Channel::connect(&addr).await.expect("connect");
        let mut b = ch
            .start(&format!("{SERVICE}FullDuplexCall"), CallOptions::default())
            .await
            .expect("start");
        ping(&mut b).await.expect("the new limit counts the open stream and admits a second");
        let st = unary(&ch, "EmptyCall", Metadata::new()).await;
        assert_eq!(st.code, Code::PermissionDenied, "{st:?}");
        held.close_send();
        b.close_send();
        assert_eq!(held.finish_status().await.code, Code::Ok);
        assert_eq!(b.finish_status().await.code, Code::Ok);
    });

    // An invalid file, through the admin socket: refused by name, and the
    // policy in force stays.
    std::fs::write(&config, "[policy]\ndefualt = \"deny\"\n").expect("config");
    let out = Command::new(BIN)
        .args(["admin", admin.to_str().expect("path"), "reload"])
        .output()
        .expect("protoplane admin");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && said.contains("policy.defualt"), "{said}");
    rt.block_on(async {
        let ch = Channel::connect(&addr).await.expect("connect");
        assert_eq!(unary(&ch, "EmptyCall", Metadata::new()).await.code, Code::PermissionDenied);
        assert_eq!(unary(&ch, "UnaryCall", tenant("guest")).await.code, Code::Ok);
    });
    let out = Command::new(BIN)
        .args(["admin", admin.to_str().expect("path"), "status"])
        .output()
        .expect("protoplane admin");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("policy version 2") && said.contains("serving grpc.testing"), "{said}");
}

#[test]
fn a_new_engine_takes_over_under_load_with_no_failed_call() {
    let sock = sock_path("takeover");
    let dir = std::path::Path::new(&sock).parent().expect("dir").to_path_buf();
    let admin = dir.join("admin.sock");
    let admin = admin.to_str().expect("path");
    let (mut old, addr) = engine_with(&["--attach", &sock, "--admin", admin]);
    let mut application = app(&sock);
    old.wait_for("attached for grpc.testing.TestService");
    let app_pid = application.child.id();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (stop, done, addr) = (stop.clone(), done.clone(), addr.clone());
            rt.spawn(async move {
                let ch = Channel::connect(&addr).await.expect("connect");
                let mut failed = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let st = unary(&ch, "UnaryCall", Metadata::new()).await;
                    match st.code {
                        Code::Ok => done.fetch_add(1, Ordering::Relaxed),
                        _ => {
                            failed.push(st);
                            0
                        }
                    };
                }
                failed
            })
        })
        .collect();
    let wait_calls = |n: u64| {
        let until = Instant::now() + Duration::from_secs(20);
        let start = done.load(Ordering::Relaxed);
        while done.load(Ordering::Relaxed) < start + n {
            assert!(Instant::now() < until, "calls stopped completing");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    wait_calls(200);

    // A take-over that goes away before it is ready changes nothing: the
    // engine serves on, and a real one later works.
    {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(admin).expect("admin socket");
        s.write_all(b"take-over\n").expect("ask");
        let mut first = [0u8; 256];
        let n = s.read(&mut first).expect("the listeners line");
        let said = String::from_utf8_lossy(&first[..n]);
        assert!(said.starts_with("listeners ") && said.contains("grpc.testing"), "{said}");
    }
    old.wait_for("take-over abandoned");
    wait_calls(200);

    let new = Proc::start(&["engine", "--take-over", admin, "--attach", &sock]);
    new.wait_for("grpc listening on");
    old.wait_for("handed over to the new engine");
    let until = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = old.child.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < until, "the old engine did not exit");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status}");
    new.wait_for("attached for grpc.testing.TestService");
    // Only the new engine is left: these calls are its.
    wait_calls(200);
    stop.store(true, Ordering::Relaxed);
    let failed: Vec<Status> = rt
        .block_on(async {
            let mut all = Vec::new();
            for c in clients {
                all.extend(c.await.expect("client"));
            }
            all
        })
        .into_iter()
        .collect();
    assert!(failed.is_empty(), "{} failed: {:?}", failed.len(), &failed[..failed.len().min(5)]);
    assert!(application.child.try_wait().expect("wait").is_none(), "the application kept running");
    assert_eq!(application.child.id(), app_pid);
    application.wait_for("the engine is being replaced");
    rt.block_on(async {
        let ch = Channel::connect(&addr).await.expect("connect");
        assert_eq!(unary(&ch, "EmptyCall", Metadata::new()).await.code, Code::Ok);
    });
    application.kill();
}

#[test]
fn sigterm_drains_a_monolithic_server_under_load() {
    const CHECK: &str = "/grpc.health.v1.Health/Check";
    let server = Proc::start(&["serve", "--port", "0", "--shutdown-grace", "10"]);
    let line = server.wait_for("listening on 127.0.0.1:");
    let addr = line.rsplit(' ').next().unwrap_or_default().to_string();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let ch = Channel::connect(&addr).await.expect("connect");
        // A health watch (empty service name: the whole server) open
        // across the signal.
        let mut watch =
            ch.start("/grpc.health.v1.Health/Watch", CallOptions::default()).await.expect("watch");
        watch.send_last(&[]).await.expect("send");
        let first = watch.recv().await.expect("first status").expect("a message");
        assert_eq!(&first[..], &[0x08, 0x01], "SERVING");

        let ok = Arc::new(AtomicU64::new(0));
        let mut load = Vec::new();
        for _ in 0..64 {
            let (ch, ok) = (ch.clone(), ok.clone());
            load.push(tokio::spawn(async move {
                // Until a call cannot start (the server is gone): a call
                // that started must end OK.
                loop {
                    let mut call = match ch.start(CHECK, CallOptions::default()).await {
                        Ok(c) => c,
                        Err(st) => return (st, None),
                    };
                    let r = async {
                        call.send_last(&[]).await?;
                        while call.recv().await?.is_some() {}
                        Ok::<(), Status>(())
                    }
                    .await;
                    let st = call.finish_status().await;
                    if let Err(e) = r {
                        return (e.clone(), Some(e));
                    }
                    if st.code != Code::Ok {
                        return (st.clone(), Some(st));
                    }
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        let until = Instant::now() + Duration::from_secs(20);
        while ok.load(Ordering::Relaxed) < 2000 {
            assert!(Instant::now() < until, "the load did not get going");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let pid = server.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
        assert!(sent.success());
        let changed = tokio::time::timeout(Duration::from_secs(10), watch.recv()).await;
        let changed = changed.expect("in time").expect("a status").expect("a message");
        assert_eq!(&changed[..], &[0x08, 0x02], "NOT_SERVING once draining");
        drop(watch);
        let mut failed_after_start = Vec::new();
        for l in load {
            let (last, failed) = tokio::time::timeout(Duration::from_secs(20), l)
                .await
                .expect("the load ends")
                .expect("task");
            assert_eq!(last.code, Code::Unavailable, "new calls are refused: {last:?}");
            failed_after_start.extend(failed);
        }
        println!(
            "SIGTERM under 64 calls in flight: {} calls ok, {} started and failed",
            ok.load(Ordering::Relaxed),
            failed_after_start.len()
        );
        assert!(failed_after_start.is_empty(), "calls started and failed: {failed_after_start:?}");
    });
    let stopped = server.wait_for("stopped: ");
    assert!(stopped.contains("every call answered"), "{stopped}");
    let mut server = server;
    let until = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = server.child.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < until, "the server did not exit");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status}");
}
