//! DNS over real sockets, against a small DNS server of the test's own:
//! a `dns://SERVER/host:port` target takes its addresses from that server's
//! A records, and with `dns_service_config` its service config from the
//! TXT records of `_grpc_config.<host>` (gRFC A2). Two backends listen on
//! 127.0.0.1 and 127.0.0.2 at one port: the service config's round robin
//! spreads calls over both, where the default pick first uses one; a record
//! that does not parse leaves the channel with the default.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use protoplane_grpc::Code;
use protoplane_rpc::{CallOptions, Channel, ChannelOptions, Router, ServerOptions};
use protoplane_test_support::echo::{self, Counting};
use protoplane_test_support::net::bounded;
use tokio::net::{TcpListener, UdpSocket};

const BOUND: Duration = Duration::from_secs(20);

/// Backends on 127.0.0.1 and 127.0.0.2 at one port.
async fn backends() -> (u16, Vec<Arc<Counting>>) {
    let first = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = first.local_addr().expect("address").port();
    let second = TcpListener::bind(("127.0.0.2", port)).await.expect("bind 127.0.0.2");
    let mut all = Vec::new();
    for l in [first, second] {
        let b = Counting::new();
        let router = Arc::new(Router::new(ServerOptions::default()).add_service(b.clone()));
        tokio::spawn(router.serve(l));
        all.push(b);
    }
    (port, all)
}

/// A DNS server answering every query for `svc.test` with A records
/// 127.0.0.1 and 127.0.0.2, for `_grpc_config.svc.test` with `txt` as TXT
/// records (each split into character-strings of at most 200 bytes), and
/// anything else with NXDOMAIN.
async fn dns_server(txt: Vec<String>) -> SocketAddr {
    let sock = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let addr = sock.local_addr().expect("address");
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = sock.recv_from(&mut buf).await {
            let q = &buf[..n];
            let Some(end) = q.get(12..).and_then(|r| r.iter().position(|&b| b == 0)) else {
                continue;
            };
            let name_end = 12 + end + 1;
            let mut labels = Vec::new();
            let mut at = 12;
            while q[at] != 0 {
                let len = q[at] as usize;
                labels.push(String::from_utf8_lossy(&q[at + 1..at + 1 + len]).into_owned());
                at += 1 + len;
            }
            let name = labels.join(".");
            let qtype = u16::from_be_bytes([q[name_end], q[name_end + 1]]);
            let records: Vec<(u16, Vec<u8>)> = match (name.as_str(), qtype) {
                ("svc.test", 1) => vec![(1, vec![127, 0, 0, 1]), (1, vec![127, 0, 0, 2])],
                ("svc.test", 28) => vec![],
                ("_grpc_config.svc.test", 16) => txt
                    .iter()
                    .map(|t| {
                        let mut data = Vec::new();
                        for chunk in t.as_bytes().chunks(200) {
                            data.push(chunk.len() as u8);
                            data.extend_from_slice(chunk);
                        }
                        (16, data)
                    })
                    .collect(),
                _ => {
                    let mut a = q[..name_end + 4].to_vec();
                    a[2] = 0x81;
                    a[3] = 0x83; // NXDOMAIN
                    a[6..12].copy_from_slice(&[0, 0, 0, 0, 0, 0]);
                    let _ = sock.send_to(&a, from).await;
                    continue;
                }
            };
            let mut a = q[..2].to_vec();
            a.extend_from_slice(&[0x81, 0x80, 0, 1]);
            a.extend_from_slice(&(records.len() as u16).to_be_bytes());
            a.extend_from_slice(&[0, 0, 0, 0]);
            a.extend_from_slice(&q[12..name_end + 4]);
            for (t, data) in records {
                a.extend_from_slice(&[0xc0, 12]);
                a.extend_from_slice(&t.to_be_bytes());
                a.extend_from_slice(&[0, 1, 0, 0, 0, 30]);
                a.extend_from_slice(&(data.len() as u16).to_be_bytes());
                a.extend_from_slice(&data);
            }
            let _ = sock.send_to(&a, from).await;
        }
    });
    addr
}

/// 40 calls on a channel to `svc.test` through `dns`: how many each
/// backend served.
async fn spread(
    dns: SocketAddr,
    port: u16,
    backends: &[Arc<Counting>],
    lookup: bool,
) -> Vec<usize> {
    let before: Vec<usize> = backends.iter().map(|b| b.served()).collect();
    let opts = ChannelOptions { dns_service_config: lookup, ..ChannelOptions::default() };
    let target = format!("dns://{dns}/svc.test:{port}");
    bounded(BOUND, "40 calls", async {
        let ch = Channel::connect_with(&target, opts).await.expect("connect");
        for _ in 0..40 {
            let mut c = ch.start(echo::PATH, CallOptions::default()).await.expect("start");
            c.send_last(&[]).await.expect("send");
            assert_eq!(c.finish_status().await.code, Code::Ok);
        }
    })
    .await;
    backends.iter().zip(before).map(|(b, x)| b.served() - x).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_config_in_txt_records_chooses_the_policy() {
    let (port, backends) = backends().await;
    // Two records, the second over 200 bytes (two character-strings):
    // concatenated, as gRPC reads them. The first choice is for Go only.
    let pad = " ".repeat(220);
    let dns = dns_server(vec![
        r#"grpc_config=[{"clientLanguage": ["go"], "serviceConfig": {}},"#.to_string(),
        format!(
            r#"{pad}{{"serviceConfig": {{"loadBalancingConfig": [{{"round_robin": {{}}}}]}}}}]"#
        ),
    ])
    .await;
    let got = spread(dns, port, &backends, true).await;
    // Round robin over the ready backends: the first calls may go out
    // before the second connection is up, so not exactly 20 each.
    assert!(got.iter().all(|&n| n >= 15), "round robin from the TXT record: {got:?}");
    // Without the lookup: the default, pick first, and every call to one.
    let got = spread(dns, port, &backends, false).await;
    assert!(got.contains(&40) && got.contains(&0), "pick first: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_does_not_parse_is_not_used() {
    let (port, backends) = backends().await;
    let dns =
        dns_server(vec![r#"grpc_config=[{"serviceConfig": {"methodConfig": 1}}]"#.into()]).await;
    let got = spread(dns, port, &backends, true).await;
    assert!(got.contains(&40) && got.contains(&0), "the default, pick first: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_dns_server_that_does_not_answer_fails_the_connection() {
    // A bound socket that never answers.
    let silent = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let target = format!("dns://{}/svc.test:1", silent.local_addr().expect("address"));
    let opts =
        ChannelOptions { connect_timeout: Duration::from_secs(30), ..ChannelOptions::default() };
    let err = bounded(BOUND, "the failed lookup", Channel::connect_with(&target, opts))
        .await
        .expect_err("no addresses");
    assert_eq!(err.code, Code::Unavailable, "{}", err.message);
}
