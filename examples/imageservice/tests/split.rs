//! The image service split across two runtimes the way `protoplane engine`
//! and `image-server --attach` split it across processes: the engine
//! library with four compute units, the attached application on a thread
//! of its own. Replies verify byte for byte, bad credentials and a
//! tampered image get their statuses, no device memory outlives its call,
//! and automatic field updating moves the image to the host when a unit
//! vanishes and back to the device when it returns. No timing asserts.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message as _;
use protoplane_engine::{Config, DeviceOptions, Running};
use protoplane_example_imageservice::client::{self, Nonces};
use protoplane_example_imageservice::crypto::{self, USERS};
use protoplane_example_imageservice::server::split::{serve_attached, PROBE_EVERY};
use protoplane_example_imageservice::{server, SERVICE};
use protoplane_grpc::Code;
use protoplane_rpc::Channel;

const BOUND: Duration = Duration::from_secs(30);

fn sock() -> PathBuf {
    let d = std::env::temp_dir().join(format!("pp-image-split-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d.join("engine.sock")
}

/// The engine (on `rt`) and the application (its own thread).
fn start(rt: &tokio::runtime::Runtime) -> (Running, Channel) {
    let config = Config {
        grpc: Some("127.0.0.1:0".parse().expect("addr")),
        attach: sock(),
        schemas: vec![server::schema().expect("schema")],
        half_mb: 8,
        ring_slots: 256,
        server: protoplane_rpc::ServerOptions {
            max_recv_message: 16 << 20,
            max_send_message: 16 << 20,
            ..Default::default()
        },
        device: DeviceOptions { units: 4, region_mb: 64, ..Default::default() },
        ..Config::default()
    };
    let path = config.attach.clone();
    let engine = rt.block_on(protoplane_engine::start(config)).expect("engine");
    std::thread::spawn(move || {
        let app = tokio::runtime::Builder::new_current_thread().enable_all().build();
        let _ = app.expect("app runtime").block_on(serve_attached(&path, 2));
    });
    let until = Instant::now() + BOUND;
    while engine.registry.pick(SERVICE).is_none() {
        assert!(Instant::now() < until, "the application did not attach");
        std::thread::sleep(Duration::from_millis(10));
    }
    let addr = engine.grpc.expect("grpc").to_string();
    let ch = rt.block_on(client::connect(&addr)).expect("connect");
    (engine, ch)
}

/// Waits (bounded) until the engine holds no device memory for calls.
fn drained(engine: &Running) -> u64 {
    let dev = engine.registry.pick(SERVICE).expect("attached").device().expect("dev").clone();
    let until = Instant::now() + BOUND;
    while dev.held() != 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    dev.held()
}

#[test]
fn split_replies_verify_and_fields_move_when_units_vanish() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (engine, ch) = start(&rt);
    let nonces = Nonces::new().expect("nonces");
    let alice = USERS[0];
    rt.block_on(async {
        for (size, level) in [(64 << 10, 0), (1 << 20, 1), (1000, 9)] {
            for p in client::prepare(alice.name, alice.token, size, 2, level, &nonces) {
                let reply = client::compress(&ch, &p.request).await.expect("compress");
                client::verify(alice.name, &p.image, &reply).expect("reply verifies");
                assert_eq!(reply.path, "device");
            }
        }
        // Credentials and a tampered image: the application's statuses.
        let image = crypto::test_image(4096, 3);
        let wrong = client::request(alice.name, "nope", &image, nonces.next(), 0);
        let st = client::compress(&ch, &wrong.encode_to_vec()).await.expect_err("refused");
        assert_eq!(st.code, Code::Unauthenticated);
        let guest = USERS.iter().find(|u| !u.may_compress).expect("a guest");
        let req = client::request(guest.name, guest.token, &image, nonces.next(), 0);
        let st = client::compress(&ch, &req.encode_to_vec()).await.expect_err("refused");
        assert_eq!(st.code, Code::PermissionDenied);
        let mut tampered = client::request(alice.name, alice.token, &image, nonces.next(), 0);
        tampered.image[10] ^= 1;
        let st = client::compress(&ch, &tampered.encode_to_vec()).await.expect_err("refused");
        assert_eq!(st.code, Code::InvalidArgument, "{st:?}");
    });
    assert_eq!(drained(&engine), 0, "device memory outlived its calls");

    // The compress units vanish: the call that finds out fails UNAVAILABLE
    // and moves the image to the host; the next ones run on the host.
    let dev = engine.registry.pick(SERVICE).expect("attached").device().expect("dev").clone();
    for slot in [1, 2] {
        dev.units().set_available(slot, false).expect("down");
    }
    let prepared = client::prepare(alice.name, alice.token, 20_000, 4, 0, &nonces);
    rt.block_on(async {
        let st = client::compress(&ch, &prepared[0].request).await.expect_err("unit gone");
        assert_eq!(st.code, Code::Unavailable, "{st:?}");
        for p in &prepared[1..] {
            let reply = client::compress(&ch, &p.request).await.expect("host path");
            client::verify(alice.name, &p.image, &reply).expect("verifies");
            assert_eq!(reply.path, "host-fallback");
        }
    });
    // Back: within PROBE_EVERY host-path requests the image returns.
    for slot in [1, 2] {
        dev.units().set_available(slot, true).expect("up");
    }
    rt.block_on(async {
        let mut paths = Vec::new();
        for i in 0..PROBE_EVERY + 2 {
            let p = &prepared[i as usize % prepared.len()];
            let reply = client::compress(&ch, &p.request).await.expect("compress");
            client::verify(alice.name, &p.image, &reply).expect("verifies");
            paths.push(reply.path);
        }
        assert_eq!(paths.last().map(String::as_str), Some("device"), "{paths:?}");
        let s = client::stats(&ch).await.expect("stats");
        assert_eq!(s.scheme, "rpcacc-split");
        assert!(s.field_updates >= 2, "{s:?}");
        assert!(s.app_cpu_ns > 0, "{s:?}");
    });
    assert_eq!(drained(&engine), 0, "device memory outlived its calls");
    let _ = Arc::strong_count(&dev);
}
