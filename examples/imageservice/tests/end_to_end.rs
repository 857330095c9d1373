//! The image service end to end over gRPC, for each scheme: replies
//! verify, bad credentials and tampered images are refused with clear
//! statuses, and the automatic field-update experiment completes with
//! updating on and shows failures without it. No timing asserts.

use std::time::Duration;

use prost::Message as _;
use protoplane_example_imageservice::client::{self, Nonces};
use protoplane_example_imageservice::crypto::{self, USERS};
use protoplane_example_imageservice::pb;
use protoplane_example_imageservice::server::{RunningServer, Scheme, ServerConfig};
use protoplane_grpc::{Code, Status};
use protoplane_rpc::Channel;

fn start(scheme: Scheme) -> RunningServer {
    let cfg = ServerConfig { scheme, region_capacity: 64 << 20, ..ServerConfig::default() };
    RunningServer::start(&cfg, ([127, 0, 0, 1], 0).into()).expect("server starts")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

async fn channel(server: &RunningServer) -> Channel {
    client::connect(&server.addr().to_string()).await.expect("connect")
}

fn encoded(req: &pb::CompressRequest) -> Vec<u8> {
    req.encode_to_vec()
}

/// Waits (bounded) until the device region is empty again: the engine
/// frees the reply's range after encoding, which may finish just after the
/// client has the reply.
fn assert_no_leak(server: &RunningServer) {
    for _ in 0..200 {
        match server.device_bytes_in_use() {
            None | Some(0) => return,
            Some(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    panic!("device region still holds {:?} bytes", server.device_bytes_in_use());
}

#[test]
fn every_scheme_replies_verify() {
    let rt = runtime();
    for scheme in Scheme::ALL {
        let server = start(scheme);
        rt.block_on(async {
            let ch = channel(&server).await;
            let nonces = Nonces::new().expect("nonces");
            let u = USERS[0];
            for (size, level) in [(64 << 10, 0), (200_000, 9), (1000, 1)] {
                for p in client::prepare(u.name, u.token, size, 2, level, &nonces) {
                    let reply = client::compress(&ch, &p.request).await.expect("compress");
                    client::verify(u.name, &p.image, &reply).expect("reply verifies");
                    let want = match scheme {
                        Scheme::CpuOnly => "cpu",
                        Scheme::OffloadHost => "offload-host",
                        Scheme::Rpcacc => "device",
                    };
                    assert_eq!(reply.path, want, "{scheme}");
                    assert!(reply.compressed_size < reply.original_size, "compressible");
                }
            }
            // Concurrent calls, and a second user with keys of its own.
            let b = USERS[1];
            let prepared = client::prepare(b.name, b.token, 64 << 10, 8, 0, &nonces);
            let calls = prepared.iter().map(|p| {
                let ch = ch.clone();
                async move { (client::compress(&ch, &p.request).await, p) }
            });
            for (r, p) in futures_join(calls).await {
                client::verify(b.name, &p.image, &r.expect("concurrent call")).expect("verifies");
            }
            let s = client::stats(&ch).await.expect("stats");
            assert_eq!(s.scheme, scheme.as_str());
            assert_eq!(s.requests_ok, 14);
            assert_eq!(s.requests_failed, 0);
            assert!(s.app_handler_cpu_ns > 0, "{s:?}");
            if scheme == Scheme::Rpcacc {
                assert_eq!(s.device_path, 14);
                assert_eq!(s.host_path, 0);
            }
        });
        assert_no_leak(&server);
    }
}

/// Runs futures concurrently on the current task (no extra dependency).
async fn futures_join<F: std::future::Future>(fs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<_> = fs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (i, f) in pending.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.into_iter().map(|o| o.expect("every future finished")).collect()
}

fn code_of(r: Result<pb::CompressReply, Status>) -> Code {
    match r {
        Ok(reply) => panic!("expected an error, got a reply on path {:?}", reply.path),
        Err(s) => {
            assert!(!s.message.is_empty(), "a status with a message");
            s.code
        }
    }
}

#[test]
fn bad_credentials_are_refused_by_every_scheme() {
    let rt = runtime();
    let image = crypto::test_image(4096, 7);
    for scheme in Scheme::ALL {
        let server = start(scheme);
        rt.block_on(async {
            let ch = channel(&server).await;
            let alice = USERS[0];
            let wrong_token = client::request(alice.name, "not-the-token", &image, [1; 12], 0);
            assert_eq!(
                code_of(client::compress(&ch, &encoded(&wrong_token)).await),
                Code::Unauthenticated
            );
            let nobody = client::request("mallory", "whatever", &image, [2; 12], 0);
            assert_eq!(
                code_of(client::compress(&ch, &encoded(&nobody)).await),
                Code::Unauthenticated
            );
            let empty = pb::CompressRequest::default();
            assert_eq!(
                code_of(client::compress(&ch, &encoded(&empty)).await),
                Code::Unauthenticated
            );
            // Authenticated, but without the right to compress.
            let guest = USERS.iter().find(|u| !u.may_compress).expect("a guest user");
            let g = client::request(guest.name, guest.token, &image, [3; 12], 0);
            assert_eq!(code_of(client::compress(&ch, &encoded(&g)).await), Code::PermissionDenied);
            // Bob's token for Alice's name.
            let swapped = client::request(alice.name, USERS[1].token, &image, [4; 12], 0);
            assert_eq!(
                code_of(client::compress(&ch, &encoded(&swapped)).await),
                Code::Unauthenticated
            );
            // The server still serves good requests.
            let ok = client::request(alice.name, alice.token, &image, [5; 12], 0);
            let reply = client::compress(&ch, &encoded(&ok)).await.expect("good request");
            client::verify(alice.name, &image, &reply).expect("verifies");
            let s = client::stats(&ch).await.expect("stats");
            assert_eq!((s.requests_ok, s.requests_failed), (1, 5), "{scheme}");
        });
        assert_no_leak(&server);
    }
}

#[test]
fn tampered_or_malformed_images_get_a_clear_status() {
    let rt = runtime();
    let image = crypto::test_image(64 << 10, 3);
    for scheme in Scheme::ALL {
        let server = start(scheme);
        rt.block_on(async {
            let ch = channel(&server).await;
            let u = USERS[0];
            let good = client::request(u.name, u.token, &image, [9; 12], 0);
            for flip in [0, good.image.len() / 2, good.image.len() - 1] {
                let mut bad = good.clone();
                bad.image[flip] ^= 0x40;
                let st = client::compress(&ch, &encoded(&bad)).await.expect_err("tampered");
                assert_eq!(st.code, Code::InvalidArgument, "{scheme}: {}", st.message);
                assert!(st.message.contains("authenticate"), "{}", st.message);
            }
            // Encrypted for another user (wrong key), wrong nonce, a nonce of
            // the wrong length, a truncated image, no image at all, a bad level.
            let mut other_key = client::request(USERS[1].name, u.token, &image, [9; 12], 0);
            other_key.user = u.name.into();
            let mut wrong_nonce = good.clone();
            wrong_nonce.nonce = vec![8; 12];
            let mut short_nonce = good.clone();
            short_nonce.nonce = vec![9; 5];
            let mut truncated = good.clone();
            truncated.image.truncate(10);
            let mut no_image = good.clone();
            no_image.image.clear();
            let mut level = good.clone();
            level.level = 42;
            for bad in [other_key, wrong_nonce, short_nonce, truncated, no_image, level] {
                let st = client::compress(&ch, &encoded(&bad)).await.expect_err("refused");
                assert_eq!(st.code, Code::InvalidArgument, "{scheme}: {}", st.message);
            }
            // Bytes that are not a request at all.
            let st = client::compress(&ch, &[0xff, 0xff, 0xff]).await.expect_err("garbage");
            assert_eq!(st.code, Code::InvalidArgument, "{scheme}: {}", st.message);
            // Still serving.
            let reply = client::compress(&ch, &encoded(&good)).await.expect("good request");
            client::verify(u.name, &image, &reply).expect("verifies");
        });
        assert_no_leak(&server);
    }
}

#[test]
fn field_update_experiment_with_and_without_updating() {
    let on = client::field_update_experiment(true, 64 << 10).expect("experiment runs");
    assert_eq!(on.len(), 10);
    for st in &on {
        let path = st.outcome.as_ref().unwrap_or_else(|e| panic!("request {} failed: {e}", st.n));
        let want = if (4..=6).contains(&st.n) { "host-fallback" } else { "device" };
        assert_eq!(path, want, "request {}", st.n);
    }
    let off = client::field_update_experiment(false, 64 << 10).expect("experiment runs");
    assert_eq!(off.len(), 10);
    for st in &off {
        if (4..=6).contains(&st.n) {
            let e = st.outcome.as_ref().expect_err("no host fallback without updating");
            assert!(e.starts_with("Unavailable"), "request {}: {e}", st.n);
        } else {
            assert_eq!(st.outcome.as_deref(), Ok("device"), "request {}", st.n);
        }
    }
    let table = client::format_steps(true, &on);
    assert!(table.contains("host-fallback") && table.contains("down"));
}

#[test]
fn placement_follows_the_units_and_counts_updates() {
    let server = start(Scheme::Rpcacc);
    let rt = runtime();
    rt.block_on(async {
        let ch = channel(&server).await;
        let u = USERS[0];
        let nonces = Nonces::new().expect("nonces");
        let p = client::prepare(u.name, u.token, 10_000, 1, 0, &nonces).remove(0);
        assert!(server.image_on_device());
        server.set_units_available(false).expect("units vanish");
        let r = client::compress(&ch, &p.request).await.expect("host fallback");
        assert_eq!(r.path, "host-fallback");
        assert!(!server.image_on_device());
        server.set_units_available(true).expect("units return");
        let r = client::compress(&ch, &p.request).await.expect("device again");
        assert_eq!(r.path, "device");
        assert!(server.image_on_device());
        let s = client::stats(&ch).await.expect("stats");
        assert_eq!((s.field_updates, s.device_path, s.host_path), (2, 1, 1));
    });
    assert_no_leak(&server);
}

#[test]
fn delimited_data_file_reads_back() {
    let nonces = Nonces::new().expect("nonces");
    let u = USERS[0];
    let prepared = client::prepare(u.name, u.token, 5000, 3, 0, &nonces);
    let data = client::delimited(&prepared);
    let mut buf = &data[..];
    for p in &prepared {
        let len = prost::encoding::decode_varint(&mut buf).expect("length") as usize;
        let req = pb::CompressRequest::decode(&buf[..len]).expect("request");
        assert_eq!(&buf[..len], &p.request[..]);
        assert_eq!(req.user, u.name);
        buf = &buf[len..];
    }
    assert!(buf.is_empty());
}

#[test]
fn the_proto_places_the_image_on_the_device() {
    let schema = protoplane_example_imageservice::server::schema().expect("schema");
    let ts = schema.tables();
    let req = ts.message_by_name("protoplane.examples.image.CompressRequest").expect("request");
    let device: Vec<u32> = ts
        .fields(ts.message(req))
        .iter()
        .filter(|f| f.placement() == protoplane_schema::Placement::Device)
        .map(|f| f.number)
        .collect();
    assert_eq!(device, [4], "only `image` is device-placed");
}
