//! Weighted round robin (gRFC A58) driven by ORCA load reports (gRFC A51)
//! over real sockets: backends that report the same rate at different
//! utilizations get calls in inverse proportion to it; one that does not
//! report gets the mean weight; a bad report is ignored; the out-of-band
//! service streams the recorder's figures at the interval asked for; with
//! `enableOobLoadReport` the weights come from those streams and the
//! trailers are not read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use protoplane_grpc::intercept::Chain;
use protoplane_grpc::Code;
use protoplane_grpc_services::orca::{LoadReport, OpenRca, Recorder};
use protoplane_rpc::config::ServiceConfig;
use protoplane_rpc::{CallOptions, Channel, ChannelOptions, Router, ServerOptions};
use protoplane_test_support::echo::{self, Counting};
use protoplane_test_support::net::{bounded, serve_grpc};

const BOUND: Duration = Duration::from_secs(20);

/// A recorder whose figures say `utilization` at 1000 qps.
fn recorder(utilization: f64) -> Arc<Recorder> {
    let r = Recorder::new();
    r.update(|r| {
        r.application_utilization = utilization;
        r.rps_fractional = 1000.0;
    });
    r
}

/// A router serving `b`, with `trailers`' figures in every call's trailers
/// (none when `None`).
fn serving(b: &Arc<Counting>, trailers: Option<&Arc<Recorder>>) -> Router {
    let router = Router::new(ServerOptions::default());
    match trailers {
        Some(r) => router.add_service(Chain::new().with(r.interceptor()).wrap(b.clone())),
        None => router.add_service(b.clone()),
    }
}

/// A backend whose per-call reports say `utilization` at 1000 qps (no
/// reports when `None`), and whose out-of-band stream says the same.
async fn backend(utilization: Option<f64>) -> (String, Arc<Counting>, Arc<Recorder>) {
    let b = Counting::new();
    let recorder = match utilization {
        Some(u) => recorder(u),
        None => Recorder::new(),
    };
    let router = serving(&b, utilization.map(|_| &recorder));
    let orca = OpenRca::new(recorder.clone(), Duration::from_millis(50)).expect("orca");
    (serve_grpc(Arc::new(router.add_service(orca))).await.to_string(), b, recorder)
}

/// A backend whose out-of-band stream says `oob` at 1000 qps and whose
/// per-call trailers, from a recorder of their own, say `per_call` (none
/// when `None`): the two sources disagree on purpose.
async fn backend_oob(oob: f64, per_call: Option<f64>) -> (String, Arc<Counting>) {
    let b = Counting::new();
    let trailers = per_call.map(recorder);
    let router = serving(&b, trailers.as_ref());
    let orca = OpenRca::new(recorder(oob), Duration::from_millis(20)).expect("orca");
    (serve_grpc(Arc::new(router.add_service(orca))).await.to_string(), b)
}

fn oob_options() -> ChannelOptions {
    let sc = ServiceConfig::from_json(
        r#"{"loadBalancingConfig": [{"weighted_round_robin": {
              "blackoutPeriod": "0s", "weightUpdatePeriod": "0.1s",
              "enableOobLoadReport": true, "oobReportingPeriod": "0.05s"}}]}"#,
    )
    .expect("config");
    ChannelOptions { service_config: Some(Arc::new(sc)), ..ChannelOptions::default() }
}

fn wrr_options() -> ChannelOptions {
    let sc = ServiceConfig::from_json(
        r#"{"loadBalancingConfig": [{"weighted_round_robin": {
              "blackoutPeriod": "0s", "weightUpdatePeriod": "0.1s"}}]}"#,
    )
    .expect("config");
    ChannelOptions { service_config: Some(Arc::new(sc)), ..ChannelOptions::default() }
}

async fn echo(ch: &Channel) {
    let mut c = ch.start(echo::PATH, CallOptions::default()).await.expect("start");
    c.send_last(&[]).await.expect("send");
    assert_eq!(c.finish_status().await.code, Code::Ok);
}

/// Calls for a while (weights arrive and are taken up), then `n` more:
/// how many each backend served of those.
async fn shares(ch: &Channel, backends: &[&Arc<Counting>], n: usize) -> Vec<usize> {
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(400) {
        echo(ch).await;
    }
    let before: Vec<usize> = backends.iter().map(|b| b.served()).collect();
    bounded(BOUND, "the measured calls", async {
        for _ in 0..n {
            echo(ch).await;
        }
    })
    .await;
    backends.iter().zip(before).map(|(b, x)| b.served() - x).collect()
}

fn within(got: usize, want: f64) -> bool {
    (got as f64 - want).abs() <= 0.05 * want
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_follow_the_reported_load() {
    let (a, ba, _) = backend(Some(0.1)).await;
    let (b, bb, _) = backend(Some(0.2)).await;
    let (c, bc, _) = backend(Some(0.4)).await;
    let ch =
        Channel::connect_with(&format!("ipv4:{a},{b},{c}"), wrr_options()).await.expect("connect");
    let got = shares(&ch, &[&ba, &bb, &bc], 7000).await;
    // Weights qps/utilization: 10000, 5000, 2500, so 4:2:1.
    let want = [4000.0, 2000.0, 1000.0];
    assert!(got.iter().zip(want).all(|(&g, w)| within(g, w)), "got {got:?}, want {want:?} ±5%");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_without_reports_gets_the_mean_weight() {
    let (a, ba, _) = backend(Some(0.1)).await;
    let (b, bb, _) = backend(Some(0.3)).await;
    let (c, bc, _) = backend(None).await;
    let ch =
        Channel::connect_with(&format!("ipv4:{a},{b},{c}"), wrr_options()).await.expect("connect");
    let got = shares(&ch, &[&ba, &bb, &bc], 6000).await;
    // 10000 and 3333; the silent one the mean, 6667: 3:1:2.
    let want = [3000.0, 1000.0, 2000.0];
    assert!(got.iter().zip(want).all(|(&g, w)| within(g, w)), "got {got:?}, want {want:?} ±5%");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_out_of_band_stream_sends_the_recorder_s_figures() {
    let (addr, _, recorder) = backend(Some(0.25)).await;
    recorder.update(|r| r.cpu_utilization = 0.5);
    let ch = Channel::connect(&addr).await.expect("connect");
    let mut call = ch
        .start("/xds.service.orca.v3.OpenRcaService/StreamCoreMetrics", CallOptions::default())
        .await
        .expect("start");
    // report_interval { nanos: 10_000_000 } (10 ms; the server's minimum,
    // 50 ms here, applies).
    call.send_last(&[0x0a, 0x05, 0x10, 0x80, 0xad, 0xe2, 0x04]).await.expect("send");
    let t = Instant::now();
    for _ in 0..3 {
        let m = bounded(BOUND, "a report", call.recv()).await.expect("recv").expect("a message");
        let r = LoadReport::decode(&m).expect("a load report");
        assert_eq!((r.cpu_utilization, r.application_utilization), (0.5, 0.25));
        assert_eq!(r.rps_fractional, 1000.0);
    }
    assert!(
        t.elapsed() >= Duration::from_millis(100),
        "three reports 50 ms apart: {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_band_reports_weigh_the_backends_and_trailers_are_not_read() {
    // The streams say 0.1 and 0.4 (4:1); the trailers say the opposite.
    let (a, ba) = backend_oob(0.1, Some(0.4)).await;
    let (b, bb) = backend_oob(0.4, Some(0.1)).await;
    let ch = Channel::connect_with(&format!("ipv4:{a},{b}"), oob_options()).await.expect("connect");
    let got = shares(&ch, &[&ba, &bb], 5000).await;
    let want = [4000.0, 1000.0];
    assert!(got.iter().zip(want).all(|(&g, w)| within(g, w)), "got {got:?}, want {want:?} ±5%");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_without_the_out_of_band_service_gets_the_mean_weight() {
    let (a, ba) = backend_oob(0.1, None).await;
    let (b, bb) = backend_oob(0.3, None).await;
    // A backend with no OpenRcaService: its stream is UNIMPLEMENTED.
    let bc = Counting::new();
    let c = serve_grpc(Arc::new(serving(&bc, None))).await.to_string();
    let ch =
        Channel::connect_with(&format!("ipv4:{a},{b},{c}"), oob_options()).await.expect("connect");
    let got = shares(&ch, &[&ba, &bb, &bc], 6000).await;
    // 10000 and 3333; the silent one the mean, 6667: 3:1:2.
    let want = [3000.0, 1000.0, 2000.0];
    assert!(got.iter().zip(want).all(|(&g, w)| within(g, w)), "got {got:?}, want {want:?} ±5%");
}
