//! Split mode across real processes: `protoplane engine` with the interop
//! service in an attached `protoplane interop-server --attach` process.
//!
//! * an application killed mid-call: the call fails with UNAVAILABLE within
//!   a bounded time, the engine keeps running, and a restarted application
//!   attaches again without an engine restart;
//! * an engine restarted under a running application: the application
//!   notices and attaches to the new engine;
//! * two instances of one service share its calls, and one of them dying
//!   leaves the other serving;
//! * SIGTERM: the engine lets a call in flight finish with its
//!   application, tells the application and exits 0;
//! * an engine with two workers: the application attaches once per
//!   worker, calls over many connections are served, a killed application
//!   fails its call and a restarted one serves again, SIGTERM stops it.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{app, empty_call, engine, rt, sock_path, Proc};
use protoplane_grpc::Code;
use protoplane_rpc::{CallOptions, Channel};

#[test]
fn a_killed_application_fails_its_calls_and_a_restarted_one_serves() {
    let sock = sock_path("kill");
    let (engine, addr) = engine(&sock);
    let mut a = app(&sock);
    engine.wait_for("attached for grpc.testing.TestService");
    let rt = rt();
    assert_eq!(rt.block_on(empty_call(&addr)), Code::Ok);

    let status = kill_mid_call(&rt, &addr, &mut a);
    assert_eq!(status.0.code, Code::Unavailable, "{:?}", status.0);
    assert!(status.1 < Duration::from_secs(2), "took {:?}", status.1);
    engine.wait_for("detached");

    // No application: the service is known but has no instance.
    assert_eq!(rt.block_on(empty_call(&addr)), Code::Unavailable);

    // A restarted application attaches to the same engine.
    let _a2 = app(&sock);
    engine.wait_for("attached for grpc.testing.TestService");
    assert_eq!(rt.block_on(empty_call(&addr)), Code::Ok);
}

#[test]
fn an_application_reattaches_to_a_restarted_engine() {
    let sock = sock_path("restart");
    let (mut e1, addr1) = engine(&sock);
    let a = app(&sock);
    e1.wait_for("attached for grpc.testing.TestService");
    let rt = rt();
    assert_eq!(rt.block_on(empty_call(&addr1)), Code::Ok);
    e1.kill();
    a.wait_for("the engine went away");
    let (e2, addr2) = engine(&sock);
    e2.wait_for("attached for grpc.testing.TestService");
    assert_eq!(rt.block_on(empty_call(&addr2)), Code::Ok);
}

#[test]
fn instances_share_a_service_and_survive_each_other() {
    let sock = sock_path("share");
    let (engine, addr) = engine(&sock);
    let mut a1 = app(&sock);
    engine.wait_for("attached for grpc.testing.TestService");
    let _a2 = app(&sock);
    engine.wait_for("attached for grpc.testing.TestService");
    let rt = rt();
    for _ in 0..20 {
        assert_eq!(rt.block_on(empty_call(&addr)), Code::Ok);
    }
    a1.kill();
    engine.wait_for("detached");
    for _ in 0..20 {
        assert_eq!(rt.block_on(empty_call(&addr)), Code::Ok);
    }
}

/// A hostile application: attaches properly, then breaks the ring
/// protocol in the way `act` says.
mod hostile {
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;

    use protoplane_shm::attach::{self, Answer, Hello, VERSION};
    use protoplane_shm::layout::Layout;
    use protoplane_shm::{Access, Bell, Consumer, Mapping, Part, Producer, Ring};

    pub(super) struct Hostile {
        pub(super) _sock: UnixStream,
        pub(super) map: Arc<Mapping>,
        pub(super) layout: Layout,
        pub(super) engine_bell: Arc<Bell>,
    }

    pub(super) fn attach(path: &str) -> Hostile {
        let proto = concat!(env!("CARGO_MANIFEST_DIR"), "/../../protos/interop/grpc_testing.proto");
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../protos");
        let schema = protoplane_grpc::Schema::from_proto_files(&[proto], &[root]).expect("schema");
        let sock = UnixStream::connect(path).expect("connect");
        let hello = Hello {
            version: VERSION,
            pid: std::process::id(),
            services: vec![("grpc.testing.TestService".into(), schema.tables().digest())],
            schemas: false,
            channels: vec![],
            lanes: false,
        };
        attach::send(&sock, &hello.encode(), &[]).expect("hello");
        let (msg, fds) = attach::recv(&sock).expect("answer");
        let Ok(Answer::Accept { layout, .. }) = Answer::decode(&msg) else {
            panic!("refused: {:?}", Answer::decode(&msg))
        };
        let mut fds = fds.into_iter();
        let (shared, requests) = (fds.next().expect("region"), fds.next().expect("requests"));
        // The engine's half is sealed: even a hostile application can only
        // read it.
        let writable = [Part::whole(&shared, Access::Shared), Part::whole(&requests, Access::Own)];
        assert!(Mapping::map_parts(&writable).is_err());
        let map = Mapping::map_parts(&layout.app_parts(&shared, &requests)).expect("map");
        let map = Arc::new(map);
        // The application's end of the doorbell pair: a byte on it rings
        // the engine.
        let engine_bell = Arc::new(Bell::from_fd(fds.next().expect("bell")).expect("bell"));
        Hostile { _sock: sock, map, layout, engine_bell }
    }

    impl Hostile {
        pub(super) fn requests(&self) -> Consumer {
            Consumer::new(
                Ring::new(self.map.clone(), self.layout.request_ring(), self.layout.ring_slots)
                    .expect("ring"),
            )
        }
        pub(super) fn responses(&self) -> Producer {
            Producer::new(
                Ring::new(self.map.clone(), self.layout.response_ring(), self.layout.ring_slots)
                    .expect("ring"),
            )
        }
    }
}

/// Hostile applications attached beside a well-behaved one: garbage in
/// the response ring, a replayed descriptor, a release of a chunk never
/// lent, a corrupted request ring, one that stops consuming. Each is cut
/// off; every call ends (with OK from the good instance or an error), and
/// the engine keeps serving through the good instance.
#[test]
fn hostile_applications_are_cut_off_and_the_engine_keeps_serving() {
    use protoplane_shm::desc::{self, Descriptor, Span};

    let sock = sock_path("hostile");
    let e = Proc::start(&[
        "engine",
        "--grpc-port",
        "0",
        "--attach",
        &sock,
        "--stall-timeout-ms",
        "300",
        "--ring-slots",
        "16",
    ]);
    let line = e.wait_for("grpc listening on");
    let addr = line.rsplit(' ').next().unwrap_or_default().to_string();
    let _good = app(&sock);
    e.wait_for("attached for grpc.testing.TestService");
    let rt = rt();

    let calls = |n: usize| {
        rt.block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..n {
                let a = addr.clone();
                tasks.push(tokio::spawn(async move { empty_call(&a).await }));
            }
            let mut codes = Vec::new();
            for t in tasks {
                codes.push(t.await.expect("task"));
            }
            codes
        })
    };

    type Act = fn(&hostile::Hostile);
    let acts: [(&str, Act, &str); 5] = [
        (
            "garbage",
            |h| {
                // Slot 0 marked valid, every word all ones.
                for w in 1..8 {
                    let a = h.map.atomic_u64(h.layout.response_ring() + 8 * w).expect("word");
                    a.store(u64::MAX, std::sync::atomic::Ordering::Relaxed);
                }
                let seq = h.map.atomic_u64(h.layout.response_ring()).expect("seq");
                seq.store(1, std::sync::atomic::Ordering::Release);
                h.engine_bell.ring();
            },
            "protocol violation",
        ),
        (
            "bad release",
            |h| {
                // The last chunk of the engine's half: of the largest
                // class, which the small calls of this test never use, so
                // it is certainly not lent.
                let l = &h.layout;
                let bogus = (l.engine_half() + l.half_len()) as u32 - l.max_chunk();
                let _ = h.responses().push(&Descriptor::releases(&[bogus]));
                h.engine_bell.ring();
            },
            "protocol violation",
        ),
        (
            "replay",
            |h| {
                let mut reqs = h.requests();
                let until = std::time::Instant::now() + Duration::from_secs(10);
                let call = loop {
                    if let Some(d) = reqs.pop() {
                        if d.has(desc::OPEN) {
                            break d.call;
                        }
                    }
                    assert!(std::time::Instant::now() < until, "no call reached the hostile app");
                    std::thread::sleep(Duration::from_millis(1));
                };
                let chunk = h.layout.app_half() as u32;
                let d = Descriptor {
                    call,
                    flags: desc::MESSAGE,
                    block: Span { offset: chunk, len: 16 },
                    chunk,
                    ..Descriptor::default()
                };
                let out = h.responses();
                let _ = out.push(&d);
                let _ = out.push(&d);
                h.engine_bell.ring();
            },
            "handed over twice",
        ),
        (
            "corrupt request ring",
            |h| {
                for i in 0..h.layout.ring_slots as usize {
                    let seq = h.map.atomic_u64(h.layout.request_ring() + 64 * i).expect("seq");
                    seq.store(0xdead_beef, std::sync::atomic::Ordering::Relaxed);
                }
            },
            "corrupted its request ring",
        ),
        ("stalled", |_| {}, "stopped taking requests"),
    ];
    for (name, act, reason) in acts {
        let h = hostile::attach(&sock);
        e.wait_for("attached for grpc.testing.TestService");
        // Calls in flight while the hostile instance misbehaves: each ends.
        let acting = std::thread::spawn({
            let h = hostile::Hostile {
                _sock: h._sock.try_clone().expect("clone"),
                map: h.map.clone(),
                layout: h.layout.clone(),
                engine_bell: h.engine_bell.clone(),
            };
            move || act(&h)
        });
        let codes = calls(16);
        assert!(
            codes
                .iter()
                .all(|c| matches!(c, Code::Ok | Code::Unavailable | Code::ResourceExhausted)),
            "{name}: {codes:?}"
        );
        acting.join().expect("act");
        let detached = e.wait_for("detached");
        assert!(detached.contains(reason), "{name}: {detached}");
        // Cut off: every call now reaches the good instance.
        let after = calls(16);
        assert!(after.iter().all(|c| *c == Code::Ok), "{name} after: {after:?}");
        drop(h);
    }
}

#[test]
fn sigterm_drains_the_engine_and_tells_the_application() {
    let sock = sock_path("sigterm");
    let (mut engine, addr) = engine(&sock);
    let a = app(&sock);
    engine.wait_for("attached for grpc.testing.TestService");
    let rt = rt();
    rt.block_on(async {
        let ch = Channel::connect(&addr).await.expect("connect");
        let mut call = ch
            .start("/grpc.testing.TestService/FullDuplexCall", CallOptions::default())
            .await
            .expect("start");
        // StreamingOutputCallRequest { response_parameters: [{ size: 1 }] }
        let one = [0x12, 0x02, 0x08, 0x01];
        call.send(&one).await.expect("send");
        let first = tokio::time::timeout(Duration::from_secs(10), call.recv()).await;
        assert!(matches!(first, Ok(Ok(Some(_)))), "answered before the signal: {first:?}");

        let pid = engine.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
        assert!(sent.success());
        engine.wait_for("SIGTERM: draining");
        // The listener closes at once: new connections are refused, not
        // left waiting in a backlog nobody accepts from.
        let until = Instant::now() + Duration::from_secs(3);
        while tokio::net::TcpStream::connect(&addr).await.is_ok() {
            assert!(Instant::now() < until, "the engine still takes connections while draining");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The call in flight goes on with its application...
        call.send(&one).await.expect("send during the drain");
        let second = tokio::time::timeout(Duration::from_secs(10), call.recv()).await;
        assert!(matches!(second, Ok(Ok(Some(_)))), "answered while draining: {second:?}");
        call.close_send();
        let st = tokio::time::timeout(Duration::from_secs(10), call.finish_status())
            .await
            .expect("the call ends");
        assert_eq!(st.code, Code::Ok, "{st:?}");
    });
    // ...then the engine stops by itself, having told the application.
    let stopped = engine.wait_for("stopped: ");
    assert!(stopped.contains("every call answered") && stopped.contains("1 application(s) told"));
    let status = exit_status(&mut engine);
    assert!(status.success(), "{status}");
    drop(a);
}

/// The engine's reflection answer to `list_services` (raw bytes; service
/// names appear in it as strings).
async fn list_services(addr: &str) -> Vec<u8> {
    let ch = Channel::connect(addr).await.expect("connect");
    let mut call = ch
        .start("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", CallOptions::default())
        .await
        .expect("start");
    // ServerReflectionRequest { list_services: "" }
    call.send(&[0x3a, 0x00]).await.expect("send");
    call.close_send();
    let reply = call.recv().await.expect("reply").expect("a response");
    while let Ok(Some(_)) = call.recv().await {}
    reply.to_vec()
}

fn lists(reply: &[u8], service: &str) -> bool {
    reply.windows(service.len()).any(|w| w == service.as_bytes())
}

#[test]
fn reflection_lists_only_the_services_an_application_serves() {
    let sock = sock_path("reflection");
    let (engine, addr) = engine(&sock);
    let rt = rt();
    let before = rt.block_on(list_services(&addr));
    assert!(lists(&before, "grpc.reflection.v1.ServerReflection"), "reflection lists itself");
    assert!(!lists(&before, "grpc.testing.TestService"), "no application serves it yet");
    // A service no application has ever served is not implemented here
    // (gRPC's interop case unimplemented_service relies on it); once one
    // has, its absence is UNAVAILABLE (see the kill test).
    assert_eq!(rt.block_on(empty_call(&addr)), Code::Unimplemented);

    let mut a = app(&sock);
    engine.wait_for("attached for grpc.testing.TestService");
    let attached = rt.block_on(list_services(&addr));
    assert!(lists(&attached, "grpc.testing.TestService"));
    assert!(!lists(&attached, "socialnetwork.SocialNetwork"), "nobody serves that one");

    a.kill();
    engine.wait_for("detached");
    let after = rt.block_on(list_services(&addr));
    assert!(!lists(&after, "grpc.testing.TestService"), "its application is gone");
}

#[test]
fn an_engine_with_workers_serves_from_each_and_outlives_its_application() {
    let sock = sock_path("workers");
    let e = Proc::start(&["engine", "--grpc-port", "0", "--attach", &sock, "--workers", "2"]);
    let addr = e.wait_for("grpc listening on").rsplit(' ').next().unwrap_or_default().to_string();
    let mut a = app(&sock);
    // One lane per worker: two attachments of one process.
    e.wait_for("attached for grpc.testing.TestService");
    e.wait_for("attached for grpc.testing.TestService");
    let said = a.wait_for("attached to");
    assert!(said.contains("2 lanes"), "{said}");
    let rt = rt();
    // Eight connections at once (four per worker), each a few calls.
    let many = || {
        rt.block_on(async {
            let tasks: Vec<_> = (0..8)
                .map(|_| {
                    let a = addr.clone();
                    tokio::spawn(async move {
                        let mut codes = Vec::new();
                        for _ in 0..4 {
                            codes.push(empty_call(&a).await);
                        }
                        codes
                    })
                })
                .collect();
            let mut codes = Vec::new();
            for t in tasks {
                codes.extend(t.await.expect("task"));
            }
            codes
        })
    };
    let codes = many();
    assert!(codes.iter().all(|c| *c == Code::Ok), "{codes:?}");

    // Killed mid-call: the call fails in a bounded time, both lanes go.
    let (st, took) = kill_mid_call(&rt, &addr, &mut a);
    assert_eq!(st.code, Code::Unavailable, "{st:?}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    e.wait_for("detached");
    e.wait_for("detached");

    // A restarted application serves from both workers again.
    let a2 = app(&sock);
    e.wait_for("attached for grpc.testing.TestService");
    e.wait_for("attached for grpc.testing.TestService");
    let codes = many();
    assert!(codes.iter().all(|c| *c == Code::Ok), "{codes:?}");

    // SIGTERM: drained, both lanes told, exit 0.
    let pid = e.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
    let stopped = e.wait_for("stopped: ");
    assert!(stopped.contains("2 application(s) told"), "{stopped}");
    let mut e = e;
    let status = exit_status(&mut e);
    assert!(status.success(), "{status}");
    drop(a2);
}

/// Opens a call the application holds open (a full-duplex call that had
/// one answer, so its handler runs, and waits for its next request), kills
/// the application, and returns how the call ended and how long after the
/// kill.
fn kill_mid_call(
    rt: &tokio::runtime::Runtime,
    addr: &str,
    app: &mut Proc,
) -> (protoplane_grpc::Status, Duration) {
    rt.block_on(async {
        let ch = Channel::connect(addr).await.expect("connect");
        let mut call = ch
            .start("/grpc.testing.TestService/FullDuplexCall", CallOptions::default())
            .await
            .expect("start");
        // StreamingOutputCallRequest { response_parameters: [{ size: 1 }] }
        call.send(&[0x12, 0x02, 0x08, 0x01]).await.expect("send");
        let first = tokio::time::timeout(Duration::from_secs(10), call.recv()).await;
        assert!(matches!(first, Ok(Ok(Some(_)))), "the handler answers: {first:?}");
        let killed = Instant::now();
        app.kill();
        let st = tokio::time::timeout(Duration::from_secs(5), call.finish_status())
            .await
            .expect("the call ends within a bounded time");
        (st, killed.elapsed())
    })
}

/// How a process exits, waiting up to 20 s for it.
fn exit_status(p: &mut Proc) -> std::process::ExitStatus {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = p.child.try_wait().expect("wait") {
            return s;
        }
        assert!(Instant::now() < until, "the process did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}
